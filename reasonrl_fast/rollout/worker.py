"""One process that samples: a rollout worker holds one engine (or its rank of a tensor-parallel
engine that spans rollout.tensor_parallel_size workers), built as the run's Layout says, and
answers `generate` calls with each sample drawn from its own seed. The eval command's Ray actors
are rollout workers (eval/generate.py); the trainer's workers extend them with the policy and its
update (trainer/worker.py `Worker`), and hand their engine new weights through `load_weights`.
Started as Ray actors by a WorkerGroup (rollout/group.py), whose calls reach every worker alike."""

from __future__ import annotations

import math
import threading
import time

import torch
import torch.distributed as dist

from reasonrl_fast.layout import Layout, resolve
from reasonrl_fast.models.loading import load_model, load_model_config, load_tokenizer, torch_dtype
from reasonrl_fast.rollout.base import Engine, Samples
from reasonrl_fast.rollout.handoff import Handoff, spans
from reasonrl_fast.rollout.registry import EngineSpec
from reasonrl_fast.runtime.distributed import init_process_group, rendezvous_address


class RolloutWorker:
    """Rank `rank` of `world` workers over the model at `model_path`, sampling with the engine of
    `spec` (the driver's, so that an engine registered there reaches the workers). `log_dir`: the
    run directory its engine writes its own log under (`EngineSpec.log_path`; None: no log of
    its own); `sequences`: the engine's batch at once (None: the run's, util.py `rollout_sequences`).

    The constructor only stores its arguments: what can fail on bad input (loading the model, a
    setting only the device can judge) runs in `setup`, a method call, whose exception Ray hands
    to the driver as itself (runtime/ray_cluster.py `as_completed`), while an error in an actor's
    constructor reaches it only as text."""

    engine: Engine | None = None

    def __init__(self, cfg, rank: int, world: int, model_path: str, spec: EngineSpec, *, log_dir: str | None = None,
                 sequences: int | None = None):
        self.cfg, self.rank, self.world, self.model_path, self.spec = cfg, rank, world, model_path, spec
        self.sequences = sequences
        self.handoff = Handoff()
        self._idle_lock = threading.Lock()
        self.log_path = spec.log_path(log_dir, rank) if log_dir else None
        self.own_threads()

    def own_threads(self) -> None:
        """On CPU, a torch thread per CPU slot of the worker's bundle (rollout/group.py
        `worker_bundle`). torch's count is each thread's own, and Ray runs the methods of an actor
        with concurrency groups in threads of its pools: a method that computes sets it first (a
        CPU vLLM engine refuses to run in a thread whose count differs from the one it was built
        in)."""
        if not torch.cuda.is_available() and torch.get_num_threads() != self.cpus():
            torch.set_num_threads(self.cpus())

    def cpus(self) -> int:
        """This worker's CPU slots on a CPU cluster: the rollout role's."""
        return self.cfg.rollout_cpus

    def address(self) -> tuple[str, int]:
        """Rank 0's address and a port for the process group's rendezvous."""
        return rendezvous_address(self)

    def setup(self, master_addr: str | None = None, master_port: int | None = None) -> None:
        """Join the workers' process group (where there are several: the ranks of a
        tensor-parallel engine find each other through it) and load the engine: the model's
        tokenizer, the Layout of the run's config, the model itself where the engine samples from
        a copy of it."""
        cfg = self.cfg
        if self.world > 1:
            device = init_process_group(self.rank, self.world, master_addr, master_port,
                                        cfg.trainer.collective_timeout_s, getattr(self, "_listen", None))
        else:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        self.tok = load_tokenizer(self.model_path)
        t = cfg.trainer
        config = load_model_config(self.model_path, cfg.model.max_position_embeddings)
        layout = resolve(cfg, config, device.type, t.nnodes * t.workers_per_node, self.spec, sequences=self.sequences)
        self.layout = layout
        lm = (load_model(self.model_path, torch_dtype(layout.compute_dtype), layout.attention,
                         cfg.model.max_position_embeddings).to(device)
              if self.spec.needs_trainer_copy else None)
        self.load_engine(layout, lm, device)
        del lm  # the engine holds its own copy

    def load_engine(self, layout: Layout, lm, device: torch.device) -> None:
        """Build the engine as `layout` has it, on `device`; `lm`, the policy's Hugging Face
        model, goes to an engine that samples from a copy of it."""
        self.engine = self.spec.build(self.cfg, layout, lm if self.spec.needs_trainer_copy else None, self.model_path,
                                      self.tok, self._log, device=device, log_path=self.log_path)

    def sample(self, prompts: list[list[int]], n: int, temperature: float, top_p: float, seeds: list[int],
               own: tuple[int, int] | None = None) -> Samples:
        """n samples per prompt (prompt-major), sample i drawn with seeds[i], up to
        rollout.max_new_tokens each (or what rollout.max_sequence_tokens leaves its prompt), with the
        sampler's log-probs. `prompts` are the engine's:
        with a tensor-parallel engine every one of its ranks samples them all alike, and this
        worker's own are prompts[own[0]:own[1]] (None: all); only its own come back."""
        # new weights can land between two tokens (split placement: `receive_weights` runs in a
        # thread of its own); with an engine that cannot take them there they wait for the end
        self.own_threads()
        mid = {"between_tokens": self.handoff.between_tokens} if self.spec.between_tokens(self.cfg) else {}
        # rollout.max_sequence_tokens: each prompt's response has a limit of its own
        cfg = self.cfg
        limit = ([cfg.response_limit(len(p)) for p in prompts] if cfg.rollout.max_sequence_tokens
                 else cfg.rollout.max_new_tokens)
        with self.handoff.sampling():
            if cfg.rollout.tools:
                out = self._multi_turn(prompts, n, temperature, top_p, limit, seeds)
            else:
                out = self.engine.generate(prompts, n, temperature, top_p, limit, seeds, **mid)
        if own is None:
            return out
        a, b = own
        return Samples(out.tokens[a * n:b * n], out.logprobs[a * n:b * n], out.masks[a * n:b * n])

    tools = None  # the run's ToolBox (rollout.tools), started at the first multi-turn generation
    turn_metrics: dict = {}  # the last multi-turn generation's (rollout/turns.py)

    def _multi_turn(self, prompts, n, temperature, top_p, limit, seeds) -> Samples:
        """`sample` with rollout.tools: turns of the engine's generation and the tools' calls
        (rollout/turns.py), each response's tokens masked to the policy's."""
        from reasonrl_fast.rollout.turns import multi_turn
        from reasonrl_fast.tools.box import ToolBox
        from reasonrl_fast.tools.calls import FORMATS

        r = self.cfg.rollout
        if self.tools is None:
            self.tools = ToolBox(r.tools, r.tool_workers, r.tool_timeout_s)
        limits = list(limit) if isinstance(limit, list) else [limit] * len(prompts)
        done = multi_turn(self.engine.generate, prompts, n, temperature, top_p, limits, seeds, self.tools,
                          FORMATS[r.tool_format], self.tok, r.max_turns)
        self.turn_metrics = done.metrics
        return done.samples

    def generate(self, prompts: list[list[int]], n: int, temperature: float, top_p: float, seeds: list[int],
                 own: tuple[int, int] | None = None) -> list[list[int]]:
        """The response tokens of `sample`."""
        return self.sample(prompts, n, temperature, top_p, seeds, own).tokens

    def load_weights(self, named_tensors) -> None:
        """Replace the engine's weights (Hugging Face names; it wakes first if it sleeps)."""
        self.engine.load_weights(named_tensors)

    def sample_timed(self, prompts: list[list[int]], n: int, temperature: float, top_p: float, seeds: list[int],
                     own: tuple[int, int] | None = None) -> tuple[list, list, list, float]:
        """Split placement: `sample`'s responses and log-probs, each response's versions (its
        (first token, version) pairs, rollout/handoff.py `spans`: more than one where an update
        landed mid-generation), and the seconds this worker sat idle (between its calls) since its
        last generation ended."""
        self._note_idle()
        out = self.sample(prompts, n, temperature, top_p, seeds, own)
        with self._idle_lock:
            self._busy_until = time.perf_counter()  # the first generation starts the count
            idle, self._idle_s = self._idle_s, 0.0
        switches, first = self.handoff.switches, own[0] * n if own else 0
        return (out.tokens, out.logprobs, [spans(switches, len(t), first + i) for i, t in enumerate(out.tokens)],
                idle)

    # when this worker's last generation or load ended (None: no generation yet; inf: one runs);
    # both threads (generation, weights) read and write it under `_idle_lock`
    _busy_until: float | None = None
    _idle_s = 0.0  # the gaps between its calls since its last generation

    def _note_idle(self) -> None:
        """Count the gap since the last busy moment as idle (none while a load or a generation
        runs), and mark this worker busy."""
        with self._idle_lock:
            if self._busy_until is not None and self._busy_until != math.inf:
                self._idle_s += time.perf_counter() - self._busy_until
                self._busy_until = math.inf

    def join_transport(self, host: str, port: int, rank: int, size: int) -> None:
        """Split placement: rank `rank` (1..) of the weight transport whose rank 0 is the
        trainer's (rollout/transport.py)."""
        from reasonrl_fast.rollout.transport import Transport

        self.transport = Transport(host, port, rank, size, self.cfg.trainer.collective_timeout_s)

    def receive_weights(self, meta: list, dtype: str, version: int, shards: int) -> int:
        """Load version `version` of the weights from the transport (the trainer publishes it
        at once, in the rank-major layout of `shards` shards); returns the version now loaded.
        With an engine that takes weights between tokens it runs beside a generation, which
        pauses at its next token while the weights load (rollout/handoff.py)."""
        from reasonrl_fast.layout import SYNC_BUCKET_BYTES

        self.own_threads()
        with self.handoff.loading():
            idle = not self.handoff.generating
            if idle:
                self._note_idle()
            self.load_weights(self.transport.receive(meta, version, torch_dtype(dtype), SYNC_BUCKET_BYTES, shards))
            self.handoff.version = self.version = version
            if idle:
                with self._idle_lock:  # idle from the first generation on: the run's setup is not a wait
                    if self._busy_until is not None:
                        self._busy_until = time.perf_counter()
        return version

    def weights_checksum(self, names: list[str]) -> float:
        """transport.py `checksum` of the engine's weights `names`, for engines that expose them
        (`params`: the hf engine)."""
        from reasonrl_fast.rollout.transport import checksum

        return checksum([(n, self.engine.params[n]) for n in names])

    def _log(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)

    def shutdown(self) -> None:
        if self.tools is not None:
            self.tools.close()
        if self.engine is not None:
            self.engine.close()
        if dist.is_initialized():
            dist.destroy_process_group()
