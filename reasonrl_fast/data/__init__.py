"""Data: the embedded tasks (addition, code) and, later, records and the prepare command."""
