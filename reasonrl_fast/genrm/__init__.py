"""The generative reward model (GenRM) of FAPO: an OpenAI-compatible server (serve.py, with the
rule judge of a task or a Hugging Face model as backend), its launcher (launch.py) and an
asynchronous client that survives faults (client.py). The wire format they share is
reasonrl_fast/protocol.py."""
