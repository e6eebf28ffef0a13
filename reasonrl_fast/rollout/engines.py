"""Rollout engines behind one small interface. `hf`: a Hugging Face causal LM sampled with its KV
cache (`sample`) on an unsharded copy of the weights, refreshed after every update (works
everywhere). `vllm`: a colocated vLLM engine with sleep/wake and in-place weight loading (GPU;
guarded)."""

from __future__ import annotations

import copy
import inspect
from typing import Callable, Iterable

import torch

from reasonrl_fast.rollout.lean import LeanDecoder, unsupported


class RolloutEngine:
    def generate(self, prompts: list[list[int]], n: int, temperature: float, top_p: float,
                 max_new_tokens: int, seed: int) -> list[list[int]]:
        """n samples per prompt, prompt-major; each response ends with EOS unless truncated."""
        raise NotImplementedError

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights (names as in the Hugging Face model)."""
        raise NotImplementedError

    def sleep(self) -> None:  # free memory during the update (vllm)
        pass

    def wake(self) -> None:
        pass


GREEDY_BELOW = 1e-5  # below this temperature sampling is greedy (logits / ~0 overflow)


def _keep_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits outside the smallest set of tokens whose probability reaches top_p set to -inf
    (the most likely token always stays)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    drop = probs.cumsum(-1) - probs >= top_p  # the mass before this token already reaches top_p
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def hf_stepper(model, ids: torch.Tensor, attn: torch.Tensor) -> Callable:
    """`LeanDecoder.stepper` through the model's own forward and a `DynamicCache`: called with
    None, the next-token logits [B, V] after the left-padded prompts; called with the tokens just
    chosen [B], the logits after them."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # older transformers
        cache = DynamicCache()
    # transformers renamed `past_key_values` to `cache` (5.x); take whichever this model has
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    state = {"attn": attn, "pos": pos[:, -1:]}

    def step(tok: torch.Tensor | None) -> torch.Tensor:
        if tok is None:
            out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1,
                        **{kw: cache})
        else:
            state["attn"] = torch.cat([state["attn"], torch.ones_like(attn[:, :1])], 1)
            state["pos"] = state["pos"] + 1
            out = model(input_ids=tok[:, None], attention_mask=state["attn"], position_ids=state["pos"],
                        use_cache=True, **{kw: cache})
        return out.logits[:, -1, :]

    return step


# No autograd bookkeeping at all: faster than no_grad (benchmarks/RESULTS.md §9).
@torch.inference_mode()
def sample(model, ids: torch.Tensor, attn: torch.Tensor, temperature: float, top_p: float, max_new_tokens: int,
           eos_id: int, pad_id: int, lean: LeanDecoder | None = None) -> torch.Tensor:
    """Ancestral sampling from a Hugging Face causal LM with its KV cache: [B, <= max_new_tokens]
    new tokens for the left-padded `ids`, pad after a row's EOS, stopping once every row has
    ended. The same distribution as `generate(do_sample=True, temperature, top_p, top_k=0)`,
    without its per-token logits processors and stopping criteria: 32 rows x 16 tokens of a
    0.8 M-parameter Qwen2 sample faster than with generate, and faster again through `lean` (the
    same model run by a LeanDecoder; benchmarks/RESULTS.md §9). The tokens are an
    inference-mode tensor (no autograd)."""
    step = lean.stepper(ids, attn, max_new_tokens) if lean is not None else hf_stepper(model, ids, attn)
    logits = step(None)
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    new = []
    for t in range(max_new_tokens):
        logits = logits.float()
        if temperature < GREEDY_BELOW:
            tok = logits.argmax(-1)
        else:
            logits = logits / temperature
            if top_p < 1.0:
                logits = _keep_top_p(logits, top_p)
            tok = torch.multinomial(logits.softmax(-1), 1).squeeze(1)
        tok = tok.masked_fill(done, pad_id)
        new.append(tok)
        done |= tok == eos_id
        if t + 1 == max_new_tokens or bool(done.all()):
            break
        logits = step(tok)
    return torch.stack(new, 1) if new else ids.new_zeros(ids.shape[0], 0)


class HFRollout(RolloutEngine):
    """`decoder`: "auto" samples a Llama-family model with the lean decoder (rollout/lean.py)
    and any other through its forward; "model" always through its forward."""

    def __init__(self, lm: torch.nn.Module, pad_id: int, eos_id: int, device, decoder: str = "auto"):
        if decoder not in ("auto", "model"):
            raise ValueError(f"HFRollout: decoder={decoder!r}, expected 'auto' or 'model'")
        self.model = copy.deepcopy(lm).to(device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.pad_id, self.eos_id, self.device = pad_id, eos_id, device
        self.lean = LeanDecoder(self.model) if decoder == "auto" and unsupported(self.model) is None else None
        self.params = dict(self.model.named_parameters())  # after the lean decoder's fusing

    @torch.no_grad()
    def generate(self, prompts, n, temperature, top_p, max_new_tokens, seed):
        if not prompts:
            return []
        rep = [p for p in prompts for _ in range(n)]
        width = max(len(p) for p in rep)
        ids = torch.full((len(rep), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(rep):
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        torch.manual_seed(seed)  # sampling is reproducible per (step, rank)
        out = sample(self.model, ids.to(self.device), attn.to(self.device), temperature, top_p, max_new_tokens,
                     self.eos_id, self.pad_id, self.lean)
        res = []
        for row in out.tolist():
            if self.eos_id in row:
                row = row[:row.index(self.eos_id) + 1]  # keep EOS: the policy learns to stop
            res.append(row)
        return res

    @torch.no_grad()
    def load_weights(self, named_tensors):
        for name, t in named_tensors:
            self.params[name].copy_(t)


class VLLMRollout(RolloutEngine):  # pragma: no cover - needs a GPU and vllm
    """Colocated vLLM: sleeps during the update, wakes and loads weights in place afterwards."""

    def __init__(self, model_path: str, gpu_memory_utilization: float, max_model_len: int, seed: int):
        try:
            from vllm import LLM
        except ImportError:
            raise ImportError("rollout.backend=vllm needs vLLM (`pip install vllm` on a CUDA machine); "
                              "use rollout.backend=hf on CPU or without vLLM") from None
        if not torch.cuda.is_available():
            raise RuntimeError("rollout.backend=vllm needs a GPU; use rollout.backend=hf")
        self.llm = LLM(model=model_path, enable_sleep_mode=True, gpu_memory_utilization=gpu_memory_utilization,
                       max_model_len=max_model_len, seed=seed, dtype="bfloat16")

    def generate(self, prompts, n, temperature, top_p, max_new_tokens, seed):
        from vllm import SamplingParams, TokensPrompt

        sp = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, seed=seed)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
        return [list(c.token_ids) for o in outs for c in o.outputs]

    def load_weights(self, named_tensors):
        model = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        model.load_weights(weights=list(named_tensors))

    def sleep(self):
        self.llm.sleep(level=1)

    def wake(self):
        self.llm.wake_up()


def make_rollout(cfg, lm, model_path: str, pad_id: int, eos_id: int, device) -> RolloutEngine:
    if cfg.rollout.backend == "vllm":
        return VLLMRollout(model_path, cfg.rollout.gpu_memory_utilization,
                           cfg.data.max_prompt_length + cfg.rollout.max_new_tokens, cfg.trainer.seed)
    return HFRollout(lm, pad_id, eos_id, device, cfg.rollout.decoder)
