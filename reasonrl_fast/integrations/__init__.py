"""Drop-in use of the reasonrl_fast ops inside other RL trainers (verl, TRL)."""
