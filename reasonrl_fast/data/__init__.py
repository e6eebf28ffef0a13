"""Data: records in verl's RL schema or flat (records.py), the prepare command for public sets
(prepare.py), the shipped smoke math set, and the embedded tasks (addition.py, code.py)."""
