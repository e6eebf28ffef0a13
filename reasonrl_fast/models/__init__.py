"""Models: loading a local Hugging Face model and tokenizer (loading.py), and the embedded tiny
model with its character tokenizer (tiny.py)."""

# The trained module's parts by name. trainer/policy.py's Actor holds the causal LM as `lm` and
# FlowRL's Z-head as `proj_z`, so its parameters, and the model tensors of a checkpoint, are named
# under these prefixes: the worker splits them by them (the Z-head's learning rate, the weight sync
# to the rollout engine), and so does the merge (runtime/merge.py). Defined here, below both, since
# runtime/ does not import trainer/.
LM_PREFIX = "lm."
ZHEAD_PREFIX = "proj_z."
