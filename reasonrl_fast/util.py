"""Small helpers several wings share, one home each: the nearest-rank quantile of the latency
metrics, parsing JSON text and reading a run's metrics.jsonl (the trainer's resume, plot,
benchmarks, tests), whether two paths name one file (what a command must not write over), the split
rule of the trainer's shares (and a worker's rollout batch by it) and the count of a step's
mini-batches, the host's /proc/meminfo, and the last \\boxed{} of a text (how answers and GenRM
verdicts are written)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import warnings


def quantile(xs: list[float], q: float) -> float:
    """Nearest-rank quantile (0 for an empty list: a step that measured nothing)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def loads_json(text: str | bytes):
    """json.loads, with every way the text can fail to be JSON a ValueError: the decoder's own
    (JSONDecodeError, UnicodeDecodeError) and a value nested deeper than its recursion limit,
    which it raises as RecursionError (`[[[[...` a hundred thousand deep is a few bytes)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def same_file(a: str, b: str) -> bool:
    """Whether paths `a` and `b` name one file: the same path once symbolic links, `..` and a
    relative start are resolved, or (both existing) the same file under two names (a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): it is no other name of the other
        return False


METRICS_FILE = "metrics.jsonl"


def read_metrics(path: str) -> list[dict]:
    """The rows of a metrics.jsonl (`path` is the file or the run directory holding it). A cut-off
    last line (the process died mid-write) is dropped with a warning; a bad line anywhere else
    means the file is damaged: a ValueError naming the line (and one naming the file for bytes
    that are not UTF-8 text)."""
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a UTF-8 text file ({e.reason}); the file is damaged") from None
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(loads_json(line))
        except ValueError as e:
            # a write cut short leaves a syntax error, never a value nested too deeply
            cut = isinstance(e, json.JSONDecodeError) and not any(rest.strip() for rest in lines[i + 1:])
            if not cut:
                raise ValueError(f"{path}, line {i + 1}: not valid JSON ({e}); the file is damaged") from None
            warnings.warn(f"{path}, line {i + 1}: dropping a cut-off last line", stacklevel=2)
    return rows


def shares(count: int, parts: int) -> list[range]:
    """The one split rule of the trainer: `count` items (prompts) in `parts` contiguous shares whose
    sizes differ by at most one, the earlier shares taking the extra ones. Used for the workers'
    shares of a step and for each worker's mini-batches."""
    base, extra = divmod(count, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (i < extra)
        out.append(range(start, start + size))
        start += size
    return out


def mini_batch_count(prompts: int, mini_batch_prompts: int) -> int:
    """Mini-batches (optimizer updates) of a step of `prompts` prompts (data.prompts_per_step):
    ceil(prompts / mini_batch_prompts), one where a mini-batch holds the whole step. Plain
    integers, so config's check, layout's mini-batches and the rehearsal's scaling count alike."""
    return -(-prompts // min(mini_batch_prompts, prompts))


def engine_shares(count: int, world: int, tp: int) -> list[tuple[range, range]]:
    """For each of `world` workers, (its engine's items, its own items) of `count` items (a
    step's prompts): its own are its `shares` share, as without tensor parallelism; its engine's,
    the union of the shares of the `tp` consecutive workers whose ranks run one engine (rank //
    tp), which every one of them samples alike. With tp 1 both are the worker's share."""
    own = shares(count, world)
    out = []
    for rank, r in enumerate(own):
        first, last = own[rank - rank % tp], own[rank - rank % tp + tp - 1]
        out.append((range(first.start, last.stop), r))
    return out


def rollout_sequences(cfg) -> int:
    """Sequences one rollout engine samples at once: the largest engine's prompts (a worker's
    share, or with rollout.tensor_parallel_size TP the shares of TP workers) of a generation
    round (data.gen_prompts(): dynamic sampling's generation batch, else data.prompts_per_step),
    rollout.n samples each (its batch; the planner's too). In split placement the rollout workers'
    ranks share the round (rollout.workers engines of TP ranks each), colocated the trainer's."""
    t, r = cfg.trainer, cfg.rollout
    world = r.workers * r.tensor_parallel_size if t.placement == "split" else t.nnodes * t.workers_per_node
    group, _ = engine_shares(cfg.data.gen_prompts(), world, r.tensor_parallel_size)[0]
    return len(group) * cfg.rollout.n


def meminfo_bytes(key: str, path: str = "/proc/meminfo") -> int:
    """A /proc/meminfo entry in bytes (MemTotal, MemAvailable, ...), or of another file of its
    form (/proc/self/status: VmSize, VmRSS, ...); 0 when it cannot be read."""
    try:
        with open(path) as f:
            return int(next(x for x in f if x.startswith(key + ":")).split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        return 0


_BOX_OPENERS = ("\\boxed{", "\\fbox{")
# What matters when matching braces: a backslash pair (so \{ and \} are literal braces, as in
# \left\{ ... \right.), or a brace. Iterating over these matches skips the text between them.
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} or \\fbox{...} (nested braces allowed); None when there is
    none or it is unclosed. Linear time: one rfind per opener, one scan to the closing brace."""
    if not isinstance(text, str):
        return None
    start = -1
    for opener in _BOX_OPENERS:
        at = text.rfind(opener)
        if at >= 0 and at + len(opener) > start:
            start = at + len(opener)
    if start < 0:
        return None
    depth = 1
    for token in _BRACE_TOKENS.finditer(text, start):
        brace = token.group()
        if brace == "{":
            depth += 1
        elif brace == "}":
            depth -= 1
            if depth == 0:
                return text[start:token.start()]
    return None


def chunk_width(rows: int, hidden: int, vocab: int, cuda: bool, tracing: bool = False) -> int:
    """Vocabulary columns per chunk of the fused LM head (ops/linear_token_logprob.py) for `rows`
    rows of width `hidden`: the op and the memory planner (plan.py) read it here, where torch is
    not needed. REASONRL_LINEAR_LOGPROB_CHUNK sets it by hand."""
    env = os.environ.get("REASONRL_LINEAR_LOGPROB_CHUNK")
    if env:
        try:
            c = int(env)
        except ValueError:
            c = 0
        if c < 1:
            raise ValueError(f"REASONRL_LINEAR_LOGPROB_CHUNK must be a positive number of columns, got {env!r}")
        return min(c, max(vocab, 1))
    if tracing:
        # A width that depends on the rows would pin them under torch.compile(dynamic=True): one
        # recompilation per batch size. Under compile the width depends on hidden and vocab only.
        c = -(-max(hidden, 4096) // 128) * 128 if cuda else 2048
    elif cuda:
        # dz chunk of about the size of hidden (rows x hidden), at least 16M elements, whole tiles.
        c = max(hidden, (1 << 24) // max(rows, 1))
        c = -(-c // 128) * 128
    else:
        c = max(256, (1 << 22) // max(rows, 1))  # 16 MiB of float32 per chunk
    return max(1, min(c, vocab))


SEED_BITS = 63  # a non-negative int64: what torch.Generator.manual_seed and vLLM's seed take


def derive_seed(seed: int, *parts) -> int:
    """The seed of one random stream of a run seeded `seed`, named by `parts` (a purpose, then
    the step, index, rank, ... it belongs to): a hash, so nearby seeds, steps and indices give
    unrelated streams and no two purposes share one. Every seeded stream of the trainer comes
    from here (a sample's sampling seed: rollout/base.py `sample_seed`)."""
    text = "/".join(str(p) for p in (seed, *parts))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)
