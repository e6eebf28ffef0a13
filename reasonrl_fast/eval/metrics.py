"""Evaluation metrics over n samples per prompt (pure functions, no model, no I/O).

- mean@n: the fraction right among one prompt's n samples, averaged over prompts;
- se@n: the standard error of that average over prompts (sample std of the per-prompt
  fractions / sqrt(#prompts));
- pass@k: the unbiased estimator 1 - C(n - c, k) / C(n, k) of "at least one of k samples is
  right", from n >= k samples of which c are right;
- maj@n: whether the majority answer (answers grouped by mathematical equality) is right;
- distinct@n: how many different right answers one prompt's n samples hold (answers compared as
  written, spaces removed), averaged over prompts;
- entropy@n: the entropy (nats) of the right answers' empirical distribution among one prompt's
  samples, averaged over the prompts with at least one right sample: 0 when every right sample
  gives the same answer, log m for m answers given equally often;
- tv@n and kl@n (with a target: another model's samples of the same prompts, such as the
  reference's): how far one prompt's distribution over right answers is from the target's, as
  the total-variation distance of the two empirical distributions and as KL(target || policy) of
  the two smoothed by half a count per answer either side gave; averaged over the prompts where
  both have a right answer, with their standard errors tv_se@n and kl_se@n over prompts. Both
  are estimates from samples: two independent sample sets of one model are not at 0 (the
  sampling floor, docs/eval.md §Distance to a target).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from reasonrl_fast.util import extract_boxed


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k) as the product prod_{i=n-c+1}^{n} (1 - k/i): no binomial of
    hundreds of digits, and no cancellation between two numbers close to 1."""
    if n < 1 or k < 1 or c < 0:
        raise ValueError(f"pass_at_k(n={n}, c={c}, k={k}): need n >= 1, k >= 1 and c >= 0")
    if k > n:
        raise ValueError(f"pass_at_k: k={k} is larger than the number of samples n={n}")
    if c > n:
        raise ValueError(f"pass_at_k: c={c} right samples out of n={n} is impossible")
    if n - c < k:  # every k-subset holds a right sample
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def mean_at_n(scores: Sequence[bool | float]) -> float:
    """The fraction right among one prompt's samples (the mean of the scores)."""
    if len(scores) == 0:
        raise ValueError("mean_at_n: no samples")
    return sum(float(s) for s in scores) / len(scores)


def standard_error(values: Sequence[float]) -> float:
    """Sample standard deviation (n - 1) of `values` / sqrt(len(values)); 0 for one value. Over
    the per-prompt mean@n values this is se@n: how far mean@n may move with other prompts."""
    m = len(values)
    if m == 0:
        raise ValueError("standard_error: no values")
    if m == 1:
        return 0.0
    mu = sum(values) / m
    var = sum((v - mu) ** 2 for v in values) / (m - 1)
    return math.sqrt(var / m)


def maj_at_n(answers: Sequence[Optional[str]], truth: str, equal: Callable[[str, str], bool]) -> bool:
    """Majority vote: each answer joins the first group whose representative it `equal`s (else
    starts a group); None (no answer) does not vote; the largest group wins, a tie goes to the
    group seen first; right when the winner's representative equals `truth`."""
    groups: list[list] = []  # [representative, votes]
    for a in answers:
        if a is None:
            continue
        for g in groups:
            if equal(a, g[0]):
                g[1] += 1
                break
        else:
            groups.append([a, 1])
    if not groups:
        return False
    best = groups[0]
    for g in groups[1:]:
        if g[1] > best[1]:  # strictly more: a tie keeps the earlier group
            best = g
    return bool(equal(best[0], truth))


def answer_key(text: str, whole: bool = False) -> Optional[str]:
    """A sample's answer as the diversity metrics compare it: the last boxed answer (or, `whole`,
    the response itself: code) with every space removed; None when there is none."""
    a = text if whole else extract_boxed(text)
    return None if a is None else "".join(a.split()) or None


def right_answer_counts(answers: Sequence[Optional[str]], acc: Sequence[bool]) -> dict[str, int]:
    """How often each right answer appears among one prompt's samples."""
    counts: dict[str, int] = {}
    for a, ok in zip(answers, acc, strict=True):
        if ok and a is not None:
            counts[a] = counts.get(a, 0) + 1
    return counts


def distinct_right(answers: Sequence[Optional[str]], acc: Sequence[bool]) -> int:
    """distinct@n of one prompt: the number of different right answers."""
    return len(right_answer_counts(answers, acc))


def right_entropy(answers: Sequence[Optional[str]], acc: Sequence[bool]) -> Optional[float]:
    """The entropy (nats) of one prompt's right answers; None without a right answer."""
    counts = right_answer_counts(answers, acc)
    total = sum(counts.values())
    if not total:
        return None
    return max(0.0, -sum(c / total * math.log(c / total) for c in counts.values()))


def tv_distance(p: dict[str, int], q: dict[str, int]) -> float:
    """Total-variation distance 1/2 sum_a |p(a) - q(a)| of two count tables, each normalised."""
    np_, nq = sum(p.values()), sum(q.values())
    if np_ <= 0 or nq <= 0:
        raise ValueError("tv_distance: each side needs at least one count")
    return 0.5 * sum(abs(p.get(a, 0) / np_ - q.get(a, 0) / nq) for a in p.keys() | q.keys())


def kl_divergence(p: dict[str, int], q: dict[str, int], alpha: float = 0.5) -> float:
    """KL(p || q) in nats of two count tables, each smoothed by `alpha` per answer of the union
    of their answers (so an answer one side never gave costs a finite amount) and normalised."""
    keys = p.keys() | q.keys()
    if not keys or alpha <= 0:
        raise ValueError("kl_divergence: needs counts and alpha > 0")
    np_, nq = sum(p.values()) + alpha * len(keys), sum(q.values()) + alpha * len(keys)
    out = 0.0
    for a in keys:
        pa, qa = (p.get(a, 0) + alpha) / np_, (q.get(a, 0) + alpha) / nq
        out += pa * math.log(pa / qa)
    return max(0.0, out)


# ------------------------------------------------------------------------ aggregation


@dataclass
class PromptResult:
    """One prompt's n samples, scored."""

    data_source: str
    acc: list[bool]
    lengths: list[int]
    maj: Optional[bool] = None
    """Whether the majority answer is right; None where it is not defined (code)."""
    answers: Optional[list[Optional[str]]] = None
    """Each sample's `answer_key` (for distinct@n and entropy@n); None: not reported."""
    target: Optional[dict[str, int]] = None
    """The target's right answers (answer_key -> count) on this prompt, for tv@n and kl@n;
    None: not reported."""


def _prompt_metrics(r: PromptResult, n: int, ks: Sequence[int]) -> dict:
    c = sum(bool(a) for a in r.acc)
    out = {f"mean@{n}": mean_at_n(r.acc)}
    for k in ks:
        out[f"pass@{k}"] = pass_at_k(len(r.acc), c, k)
    if r.answers is not None:
        out[f"distinct@{n}"] = distinct_right(r.answers, r.acc)
        out[f"entropy@{n}"] = right_entropy(r.answers, r.acc)
        if r.target is not None:
            counts = right_answer_counts(r.answers, r.acc)
            both = bool(counts) and sum(r.target.values()) > 0
            out[f"tv@{n}"] = tv_distance(counts, r.target) if both else None
            out[f"kl@{n}"] = kl_divergence(r.target, counts) if both else None
    return out


def _se_keys(n: int) -> tuple[str, ...]:
    return f"se@{n}", f"tv_se@{n}", f"kl_se@{n}"


def summarize(results: Sequence[PromptResult], n: int, ks: Sequence[int]) -> dict:
    """{"per_source": {source: metrics}, "overall": macro average over sources, "overall_micro":
    average over all prompts}. Metrics: mean@n, se@n, pass@k per k, distinct@n and entropy@n
    (None when no prompt of the group has answers or a right one), maj@n (None when no prompt
    of the group defines it), response_length/mean (tokens, over samples), prompts; with targets,
    tv@n, tv_se@n, kl@n, kl_se@n and target_prompts (the prompts both sides answered right)."""
    if not results:
        raise ValueError("summarize: no prompts")
    by_source: dict[str, list[PromptResult]] = {}
    for r in results:
        by_source.setdefault(r.data_source, []).append(r)
    per_source = {s: _group(rs, n, ks) for s, rs in by_source.items()}
    micro = _group(list(results), n, ks)
    groups = list(per_source.values())
    macro: dict = {}
    for key in micro:
        if key in ("prompts", "target_prompts"):
            macro[key] = sum(g.get(key) or 0 for g in groups)
        elif key in _se_keys(n):
            # the macro average of independent source means: sqrt(sum se_s^2) / #sources
            ses = [g[key] for g in groups if g.get(key) is not None]
            macro[key] = math.sqrt(sum(x**2 for x in ses)) / len(ses) if ses else None
        else:
            vals = [g[key] for g in groups if g.get(key) is not None]
            macro[key] = sum(vals) / len(vals) if vals else None
    return {"per_source": per_source, "overall": macro, "overall_micro": micro}


def _group(rs: list[PromptResult], n: int, ks: Sequence[int]) -> dict:
    per = [_prompt_metrics(r, n, ks) for r in rs]
    means = [p[f"mean@{n}"] for p in per]
    out: dict = {f"mean@{n}": sum(means) / len(means), f"se@{n}": standard_error(means)}
    for k in ks:
        out[f"pass@{k}"] = sum(p[f"pass@{k}"] for p in per) / len(per)
    for key in (f"distinct@{n}", f"entropy@{n}"):
        vals = [p[key] for p in per if p.get(key) is not None]
        out[key] = sum(vals) / len(vals) if vals else None
    if any(r.target is not None for r in rs):
        for name in ("tv", "kl"):  # both are defined on the same prompts
            vals = [p[f"{name}@{n}"] for p in per if p.get(f"{name}@{n}") is not None]
            out[f"{name}@{n}"] = sum(vals) / len(vals) if vals else None
            out[f"{name}_se@{n}"] = standard_error(vals) if vals else None
            out["target_prompts"] = len(vals)
    votes = [r.maj for r in rs if r.maj is not None]
    out[f"maj@{n}"] = sum(votes) / len(votes) if votes else None
    lengths = [x for r in rs for x in r.lengths]
    out["response_length/mean"] = sum(lengths) / len(lengths) if lengths else 0.0
    out["prompts"] = len(rs)
    return out
