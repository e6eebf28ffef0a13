"""Data: records in verl's RL schema or flat (records.py), the prepare command for public sets
(prepare.py) and the shipped smoke math set. The embedded tasks are in reasonrl_fast/tasks/."""
