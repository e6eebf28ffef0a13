"""The `hf:PATH` backend of the GenRM server: a local Hugging Face causal LM whose concurrent
requests are batched into one `generate` call.

A batcher task takes the first queued request, waits `gather_ms` for more (up to `max_batch`),
groups them by sampling parameters (all greedy requests together), pads on the left and runs
`generate` in one worker thread, so only one `generate` runs at a time while the event loop keeps
accepting requests. torch and transformers are imported here only, when this backend is chosen.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from reasonrl_fast.genrm.launch import DEFAULT_MAX_BATCH
from reasonrl_fast.protocol import Completion, RequestError, Sampling, last_user_text
from reasonrl_fast.rollout.base import GREEDY_BELOW  # greedy below it, as vLLM does

DEFAULT_MAX_TOKENS = 1024  # when neither the request nor the model's context length bounds it


@dataclass
class _Job:
    ids: list[int]
    max_new: int
    sampling: Sampling
    future: asyncio.Future

    def key(self) -> tuple:
        s = self.sampling
        return ("greedy",) if s.temperature < GREEDY_BELOW else ("sample", s.temperature, s.top_p, s.seed)


class HFBackend:
    """A local causal LM behind the server; loads at construction (the server prints its
    'listening' line only once the model is ready)."""

    usage = "hf:PATH"
    loads_model = True
    templates = None  # a model reads any rendering
    label = "the hf model"

    @classmethod
    def from_spec(cls, arg: str, device: str, max_batch: int) -> "HFBackend":
        if not arg:
            raise ValueError(f"{cls.usage} needs the model directory after 'hf:'")
        return cls(arg, device=device, max_batch=max_batch)

    def __init__(self, path: str, device: str = "auto", max_batch: int = DEFAULT_MAX_BATCH, gather_ms: float = 5.0) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from reasonrl_fast.models.loading import load_tokenizer

        self.tok = load_tokenizer(path, what=f"--backend hf:{path}")  # also the embedded char tokenizer
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available to this torch")
        self.torch, self.device = torch, device
        self.default_name = os.path.basename(os.path.normpath(path))
        self.model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype="auto" if device == "cuda" else torch.float32).to(device).eval()
        eos = self.model.generation_config.eos_token_id
        eos = eos if eos is not None else self.tok.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        pad = self.tok.pad_token_id
        self.pad_id = pad if pad is not None else (min(self.eos_ids) if self.eos_ids else 0)
        self.max_pos: int | None = getattr(self.model.config, "max_position_embeddings", None)
        self.max_batch, self.gather_s = max_batch, gather_ms / 1000
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="genrm-generate")
        self.queue: asyncio.Queue[_Job] | None = None
        self.task: asyncio.Task | None = None
        self.generate_calls = self.max_batch_seen = self.requests = self.generate_errors = 0

    def stats(self) -> dict[str, Any]:
        return {"device": self.device, "generate_calls": self.generate_calls, "requests": self.requests,
                "max_batch_seen": self.max_batch_seen, "generate_errors": self.generate_errors}

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        """The prompt's token ids: the chat template with the generation prompt when the tokenizer
        has one, else the last user message as it is."""
        if getattr(self.tok, "chat_template", None):
            text = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return self.tok(text, add_special_tokens=False)["input_ids"]
        return self.tok(last_user_text(messages))["input_ids"]

    async def complete(self, messages: list[dict[str, str]], sampling: Sampling) -> Completion:
        ids = await asyncio.to_thread(self.encode, messages)  # megabytes of text: not on the event loop
        if not ids:
            raise RequestError("messages: the prompt is empty once tokenized", "messages")
        room = self.max_pos - len(ids) if self.max_pos else None
        if room is not None and room < 1:
            raise RequestError(f"messages: the prompt is {len(ids)} tokens; the model takes at most {self.max_pos} "
                               f"(prompt and answer together)", "messages")
        want = sampling.max_tokens or room or DEFAULT_MAX_TOKENS
        max_new = min(want, room) if room is not None else want
        if self.task is None or self.task.done():
            self.queue = asyncio.Queue()
            self.task = asyncio.get_running_loop().create_task(self._batcher())
        job = _Job(ids, max_new, sampling, asyncio.get_running_loop().create_future())
        self.requests += 1
        await self.queue.put(job)
        return await job.future

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _batcher(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = [await self.queue.get()]
            deadline = loop.time() + self.gather_s
            while len(jobs) < self.max_batch:
                if not self.queue.empty():
                    jobs.append(self.queue.get_nowait())
                    continue
                left = deadline - loop.time()
                if left <= 0:
                    break
                await asyncio.sleep(min(left, 0.001))
            try:
                groups: dict[tuple, list[_Job]] = {}
                for j in jobs:
                    if not j.future.done():  # else the client went away
                        groups.setdefault(j.key(), []).append(j)
                for group in groups.values():
                    for batch in self._fit(group):
                        try:
                            outs = await loop.run_in_executor(self.executor, self._generate, batch)
                        except Exception as e:  # noqa: BLE001 - these requests get 500, the batcher goes on
                            self.generate_errors += 1
                            outs = [e] * len(batch)
                        for j, out in zip(batch, outs):
                            if not j.future.done():
                                (j.future.set_exception if isinstance(out, Exception) else j.future.set_result)(out)
            except Exception as e:  # noqa: BLE001 - a bug here must not leave requests waiting forever
                for j in jobs:
                    if not j.future.done():
                        j.future.set_exception(e)

    def _fit(self, group: list[_Job]) -> list[list[_Job]]:
        """Batches in which every row's prompt plus the batch's new tokens fit the context: the
        longest request sets the batch's `max_new_tokens`, and a row left-padded next to it still
        counts its positions from its own first token."""
        rest = sorted(group, key=lambda j: j.max_new, reverse=True)
        out = []
        while rest:
            new = rest[0].max_new
            take = [j for j in rest if self.max_pos is None or len(j.ids) + new <= self.max_pos]
            take = take[: self.max_batch]
            out.append(take)
            taken = {id(j) for j in take}
            rest = [j for j in rest if id(j) not in taken]
        return out

    def _generate(self, batch: list[_Job]) -> list[Completion]:
        torch = self.torch
        width = max(len(j.ids) for j in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, j in enumerate(batch):
            ids[i, width - len(j.ids):] = torch.tensor(j.ids)
            attn[i, width - len(j.ids):] = 1
        s = batch[0].sampling
        if s.temperature < GREEDY_BELOW:
            kw: dict[str, Any] = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        else:
            kw = {"do_sample": True, "temperature": s.temperature, "top_p": s.top_p, "top_k": 0}
            if s.seed is not None:
                torch.manual_seed(s.seed)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                                      max_new_tokens=max(j.max_new for j in batch), pad_token_id=self.pad_id,
                                      eos_token_id=sorted(self.eos_ids) or None, **kw)
        self.generate_calls += 1
        self.max_batch_seen = max(self.max_batch_seen, len(batch))
        res = []
        for j, row in zip(batch, out[:, width:].tolist()):
            row = row[: j.max_new]
            end = next((k for k, t in enumerate(row) if t in self.eos_ids), None)
            if end is None:
                text_ids, n, finish = row, len(row), "length" if len(row) == j.max_new else "stop"
            else:
                text_ids, n, finish = row[:end], end + 1, "stop"
            res.append(Completion(self.tok.decode(text_ids, skip_special_tokens=True), finish, len(j.ids), n))
        return res
