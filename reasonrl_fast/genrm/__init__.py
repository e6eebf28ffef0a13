"""The generative reward model (GenRM) of FAPO: the prompt and verdict format (prompt.py), an
OpenAI-compatible server (serve.py) and an asynchronous client that survives faults (client.py)."""

API_KEY_ENV = "REASONRL_FAST_GENRM_API_KEY"
"""Where the server and the client read the API key when none is given (it stays out of `ps`)."""
