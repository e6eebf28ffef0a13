"""Rollout engines behind one small interface. `hf`: Hugging Face `generate` on an unsharded copy
of the weights, refreshed after every update (works everywhere). `vllm`: a colocated vLLM engine
with sleep/wake and in-place weight loading (GPU; guarded)."""

from __future__ import annotations

import copy
from typing import Iterable

import torch


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


class HFRollout(RolloutEngine):
    def __init__(self, lm: torch.nn.Module, pad_id: int, eos_id: int, device):
        self.model = copy.deepcopy(lm).to(device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.pad_id, self.eos_id, self.device = pad_id, eos_id, device
        self.params = dict(self.model.named_parameters())

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
        out = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=attn.to(self.device), do_sample=True,
            temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=max_new_tokens,
            pad_token_id=self.pad_id, eos_token_id=self.eos_id)
        res = []
        for row in out[:, width:].tolist():
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
    return HFRollout(lm, pad_id, eos_id, device)
