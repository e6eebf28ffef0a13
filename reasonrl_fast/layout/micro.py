"""Micro-batches by token budget (`optim.micro_batch_tokens`): a worker's mini-batch is cut into
micro-batches whose forward sees at most `budget` tokens, and the update accumulates their
gradients. Pure functions of the sequences' lengths (prompt + response).

What a forward costs: packed rows hold exactly the real tokens (the sum of the lengths);
padded rows hold rows x the longest row. So packed micro-batches are balanced by the sum of their
lengths (longest first, each to the lightest micro-batch), and padded ones are runs of similar
lengths (sorted, so that little padding is left). Every worker must run the same number of
forwards (FSDP gathers each layer with a collective), which the caller agrees on first: each
worker asks `split` for as few as its own sequences need, the largest count wins, and each
worker splits again into exactly that many (`count`), empty micro-batches only where it has
fewer sequences than forwards."""

from __future__ import annotations

import heapq


def cost(lengths: list[int], packed: bool) -> int:
    """Tokens one forward over sequences of these lengths sees."""
    if not lengths:
        return 0
    return sum(lengths) if packed else len(lengths) * max(lengths)


def split(lengths: list[int], budget: int, packed: bool, count: int | None = None) -> list[list[int]]:
    """Indices of `lengths` in micro-batches costing at most `budget` tokens each (a sequence longer
    than the budget gets a micro-batch of its own: a sequence is never split). budget 0: one
    micro-batch. `count`: exactly this many (at least what the budget needs), the extra ones
    empty only when there are fewer sequences than micro-batches; None: as few as it takes."""
    n = len(lengths)
    if budget <= 0 or n == 0:
        groups = [list(range(n))]
    elif packed:
        groups = _packed(lengths, budget, count)
    else:
        groups = _padded(lengths, budget)
    if count is not None:
        if count < len(groups):
            raise ValueError(f"split: {count} micro-batches cannot hold {n} sequences within {budget} tokens "
                             f"(it takes {len(groups)})")
        groups = _refine(groups, lengths, packed, count)
    return groups


def _lpt(lengths: list[int], k: int) -> list[list[int]]:
    """Longest first, each to the lightest of k micro-batches."""
    heap = [(0, j) for j in range(k)]
    groups: list[list[int]] = [[] for _ in range(k)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        load, j = heapq.heappop(heap)
        groups[j].append(i)
        heapq.heappush(heap, (load + lengths[i], j))
    return [g for g in groups if g]


def _packed(lengths: list[int], budget: int, count: int | None) -> list[list[int]]:
    k = count or max(1, -(-sum(lengths) // budget))
    while True:
        groups = _lpt(lengths, min(k, len(lengths)))
        if all(cost([lengths[i] for i in g], True) <= budget or len(g) == 1 for g in groups) \
                or k >= len(lengths):
            return groups
        if count is not None:  # balancing into `count` missed the budget: take the fewest and cut those
            return _packed(lengths, budget, None)
        k += 1


def _padded(lengths: list[int], budget: int) -> list[list[int]]:
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        g = groups[-1] if groups else None
        if g and (len(g) + 1) * lengths[g[0]] <= budget:  # g[0] is its longest
            g.append(i)
        else:
            groups.append([i])
    return groups


def _refine(groups: list[list[int]], lengths: list[int], packed: bool, count: int) -> list[list[int]]:
    """Cut the costliest micro-batch in two (halves of its length order) until there are `count`
    (cutting never raises a cost); then empty ones up to `count`."""
    groups = [sorted(g, key=lambda i: -lengths[i]) for g in groups]
    while len(groups) < count:
        costly = max(range(len(groups)), key=lambda j: (len(groups[j]) > 1, cost([lengths[i] for i in groups[j]], packed)))
        g = groups[costly]
        if len(g) < 2:
            break
        groups[costly:costly + 1] = [g[0::2], g[1::2]] if packed else [g[:len(g) // 2], g[len(g) // 2:]]
    return groups + [[] for _ in range(count - len(groups))]
