"""Models: loading a local Hugging Face model and tokenizer (loading.py), and the embedded tiny
model with its character tokenizer (tiny.py)."""
