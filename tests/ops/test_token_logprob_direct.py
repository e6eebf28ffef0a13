"""Calling torch.ops.reasonrl_fast.token_logprob{,_backward,_backward_} directly: every tensor
argument is checked by the kernel itself, bad input raises the exception type the README
promises and never reads or writes out of bounds. Runs in a child interpreter, so a crash (the
symptom of a missing check) fails the test instead of killing the session."""

from tests.childproc import child_outcomes

# Each case prints "<expected exception type>|<outcome>"; the snippet defines, for one schema,
# a call with every argument overridable by keyword.
# DEV is set by the caller; OTHER is a device the checks must refuse next to DEV (a meta tensor
# next to CPU ones dispatches to the fake implementation, which checks the same).
_SETUP = """
OTHER = "meta" if DEV == "cpu" else "cpu"
N, V = 5, 16
z = torch.randn(N, V, device=DEV)
t = torch.randint(0, V, (N,), device=DEV)
lp, ent, lse = ops.token_logprob(z, t, 1.0, -100, True)
g = torch.randn(N, device=DEV)

def fwd(z=z, t=t, T=1.0):
    return ops.token_logprob(z, t, T, -100, True)

def bwd(g=g, ge=g, z=z, t=t, lse=lse, ent=ent, T=1.0):
    return ops.token_logprob_backward(g, ge, z, t, lse, ent, T, -100)

def bwd_(g=g, ge=g, z=z, t=t, lse=lse, ent=ent, T=1.0):
    return ops.token_logprob_backward_(g, ge, z.clone(), t, lse, ent, T, -100)

def ids(v):
    out = t.clone()
    out[3] = v
    return out

big_uint = torch.tensor([1, 2, 3, 2**63 + 5, 0], dtype=torch.uint64, device=DEV)
"""

_CASES = _SETUP + """
cases = []
for name, fn in (("fwd", fwd), ("bwd", bwd), ("bwd_", bwd_)):
    common = [
        ("no exception", {}),
        # sizes
        ("ValueError", dict(t=t[:4])),
        ("ValueError", dict(z=z[:4])),
        ("ValueError", dict(z=z.view(N, 2, 8))),
        ("ValueError", dict(z=torch.tensor(1.0))),
        # dtypes
        ("TypeError", dict(z=z.long())),
        ("TypeError", dict(t=t.float())),
        ("TypeError", dict(t=t.bool())),
        # ids (on CUDA a device-side assertion: tests/ops/test_cuda_ops.py)
        *([("IndexError", dict(t=ids(10**12))),
           ("IndexError", dict(t=ids(V))),
           ("IndexError", dict(t=ids(40))),
           ("IndexError", dict(t=ids(-7))),
           ("IndexError", dict(t=big_uint))] if DEV == "cpu" else []),
        # temperature
        ("ValueError", dict(T=0.0)),
        ("ValueError", dict(T=-1.0)),
        ("ValueError", dict(T=float("nan"))),
        ("ValueError", dict(T=float("inf"))),
        ("ValueError", dict(T=1e-40)),
        # devices
        ("ValueError", dict(t=t.to(OTHER))),
    ]
    if name != "fwd":
        common += [
            ("ValueError", dict(g=g[:4])),
            ("ValueError", dict(ge=g[:4])),
            ("ValueError", dict(lse=lse[:1])),
            ("ValueError", dict(lse=lse[:4])),
            ("ValueError", dict(ent=ent[:4])),
            ("ValueError", dict(g=g.view(N, 1))),
            ("TypeError", dict(g=g.long())),
            ("TypeError", dict(ge=g.int())),
            ("TypeError", dict(lse=lse.double())),
            ("TypeError", dict(lse=lse.half())),
            ("TypeError", dict(ent=ent.double())),
            ("ValueError", dict(lse=lse.to(OTHER))),
            ("ValueError", dict(g=g.to(OTHER))),
            ("ValueError", dict(ge=g.to(OTHER))),
            ("ValueError", dict(ent=ent.to(OTHER))),
            # without an entropy gradient, entropy is not read: the forward's placeholder is fine
            ("no exception", dict(ge=None, ent=torch.empty(0, device=DEV))),
        ]
    for expected, kw in common:
        cases.append((name, expected, fn, kw))

for name, expected, fn, kw in cases:
    print(name, "|", expected, "|", sorted(kw), "|", outcome(fn, **kw))

# A bad id called in a loop: the old kernels wrote out of bounds and corrupted the heap.
for _ in range(200 if DEV == "cpu" else 0):
    for fn in (fwd, bwd, bwd_):
        assert outcome(fn, t=ids(40)).startswith("IndexError")
# A one-element lse for five million rows: the old kernels read far past its end.
zz = torch.zeros(5_000_000, 1, device=DEV)
tt = torch.zeros(5_000_000, dtype=torch.long, device=DEV)
print("bwd | ValueError | big | ", outcome(ops.token_logprob_backward, torch.zeros(5_000_000, device=DEV),
                                           None, zz, tt, torch.zeros(1, device=DEV),
                                           torch.empty(0, device=DEV), 1.0, -100))
"""


def check_cases(lines):
    """Each line is "schema | expected | arguments | outcome"."""
    assert len(lines) > 50, lines
    bad = [ln for ln in lines if not ln.split("|")[3].strip().startswith(ln.split("|")[1].strip())]
    assert not bad, "\n".join(bad)


def test_direct_calls_raise_the_promised_errors():
    check_cases(child_outcomes("DEV = 'cpu'\n" + _CASES, timeout=300))


def test_fake_implementations_check_the_same():
    """Every tensor on meta: only the fake implementations run (what torch.compile traces)."""
    code = "DEV = 'meta'\n" + _SETUP + """
for name, fn in (("fwd", fwd), ("bwd", bwd), ("bwd_", bwd_)):
    print(name, "| no exception | ok |", outcome(fn))
    print(name, "| ValueError | t |", outcome(fn, t=t[:4]))
    print(name, "| TypeError | z |", outcome(fn, z=z.long()))
    print(name, "| TypeError | t |", outcome(fn, t=t.float()))
    print(name, "| ValueError | T |", outcome(fn, T=1e-40))
    if name != "fwd":
        print(name, "| ValueError | lse |", outcome(fn, lse=lse[:1]))
        print(name, "| ValueError | g |", outcome(fn, g=g[:4]))
        print(name, "| ValueError | ge |", outcome(fn, ge=g[:4]))
        print(name, "| ValueError | ent |", outcome(fn, ent=ent[:4]))
        print(name, "| TypeError | lse |", outcome(fn, lse=lse.double()))
"""
    lines = child_outcomes(code, timeout=120)
    assert len(lines) == 3 * 5 + 2 * 5, lines
    bad = [ln for ln in lines if not ln.split("|")[3].strip().startswith(ln.split("|")[1].strip())]
    assert not bad, "\n".join(bad)
