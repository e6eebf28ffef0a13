"""Architecture shapes of the models the configs under configs/ name, for the memory planner
(`python -m reasonrl_fast.plan`) on a machine without their weights: only the config.json fields
the estimate and the context check (layout/shape.py) read, and RoPE's θ beside the context,
keyed by the model directory's name (`model.path=/models/Qwen2.5-32B` ->
"Qwen2.5-32B"). A directory that has its own config.json is always read instead.

Each entry's values are copied from that model's public config.json on the Hugging Face Hub
(https://huggingface.co/<repo>/blob/main/config.json, the repo named in `_source`), checked
field by field against it."""

SHAPES: dict[str, dict] = {
    "Qwen2.5-32B": {
        "_source": "Qwen/Qwen2.5-32B", "model_type": "qwen2", "hidden_size": 5120,
        "intermediate_size": 27648, "num_hidden_layers": 64, "num_attention_heads": 40,
        "num_key_value_heads": 8, "vocab_size": 152064, "tie_word_embeddings": False,
        "max_position_embeddings": 131072, "rope_theta": 1000000.0,
    },
    "Qwen2.5-7B": {
        "_source": "Qwen/Qwen2.5-7B", "model_type": "qwen2", "hidden_size": 3584,
        "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
        "max_position_embeddings": 131072, "rope_theta": 1000000.0,
    },
    "Qwen3-4B-Instruct-2507": {
        "_source": "Qwen/Qwen3-4B-Instruct-2507", "model_type": "qwen3", "hidden_size": 2560,
        "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
        "tie_word_embeddings": True, "attention_bias": False,
        "max_position_embeddings": 262144, "rope_theta": 5000000,
    },
}
# Qwen2.5-Math-7B has Qwen2.5-7B's architecture and a shorter context at a lower θ: a run of
# prompt + response above 4096 tokens sets model.max_position_embeddings (the recipes: 32768)
SHAPES["Qwen2.5-Math-7B"] = {**SHAPES["Qwen2.5-7B"], "_source": "Qwen/Qwen2.5-Math-7B",
                             "max_position_embeddings": 4096, "rope_theta": 10000.0}
