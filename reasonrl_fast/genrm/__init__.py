"""The generative reward model (GenRM) of FAPO: the prompt and verdict format (prompt.py), an
OpenAI-compatible server (serve.py) and an asynchronous client that survives faults (client.py)."""
