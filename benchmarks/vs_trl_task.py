"""The work both trainers do in bench_vs_trl.py: one tiny random Qwen2 written to a directory
(both load the same weights and tokenizer from it), `AB+CD=` prompts, and the reward (1 when the
sum appears as a run of digits in the completion). Needs only torch, transformers and
tokenizers, so TRL's virtual environment can import it as well as the project's."""

from __future__ import annotations

import json
import os
import random
import re

# 26 tokens: 3 special, 10 digits, 13 characters (enough to write `\boxed{132}` and sums).
PAD, BOS, EOS = "<pad>", "<s>", "<|endoftext|>"
CHARS = "0123456789+= ,\\boxed{}\n"
MODEL = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 384, "tie_word_embeddings": True,
         "max_position_embeddings": 64}


def write_model(path: str, seed: int = 0) -> str:
    """Save the tokenizer and a randomly initialised Qwen2 (MODEL, fp32) under `path`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for c in CHARS:
        vocab.setdefault(c, len(vocab))
    assert len(vocab) == 26, len(vocab)
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    raw.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    raw.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token=PAD, bos_token=BOS, eos_token=EOS)
    tok.padding_side = "left"
    config = Qwen2Config(vocab_size=len(vocab), pad_token_id=0, bos_token_id=1, eos_token_id=2, **MODEL)
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_prompts(path: str, count: int = 1024, seed: int = 0) -> str:
    """`count` records {"prompt": "AB+CD=", "answer": "<sum>"} as jsonl (two-digit operands)."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(count):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b), "data_source": "vs_trl"}) + "\n")
    return path


def sum_reward(completion: str, answer: str) -> float:
    """1.0 when `answer` is one of the completion's maximal runs of digits, else 0.0."""
    return 1.0 if str(answer) in re.findall(r"\d+", completion) else 0.0


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """The project's reward signature (`data.reward_fn=benchmarks/vs_trl_task.py:compute_score`)."""
    return sum_reward(solution_str, ground_truth)


def trl_reward(completions, answer, **_) -> list[float]:
    """TRL's reward-function signature: the dataset's `answer` column arrives as a keyword."""
    return [sum_reward(c, a) for c, a in zip(completions, answer, strict=True)]


def model_dir_ok(path: str) -> bool:
    return os.path.exists(os.path.join(path, "config.json")) and os.path.exists(os.path.join(path, "tokenizer.json"))
