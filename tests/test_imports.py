"""The house's floors (DESIGN.md, docs/trainer.md §Layers): every import statement of the package,
at module level or inside a function, read with `ast`, points down or sideways, never up; no two
packages import each other; and config, at the foot, imports nothing above the ground floor."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = "reasonrl_fast"

# The floor of each module, by its dotted name under the package; the longest matching prefix
# wins, so a command inside a package (eval.__main__) sits on floor 5. cli.py is no command but the
# wrapper every command runs in, and imports only errors: a ground helper (data/prepare.py, the
# prepare command's converters, which trainer/ also writes records with, uses it from floor 2).
LAYERS = {
    # 1: the ground: ops, the error base, small helpers, the GenRM wire format, the plug-in tables
    "": 1, "_C": 1, "ops": 1, "errors": 1, "util": 1, "redact": 1, "protocol": 1, "registry": 1,
    "toolchain": 1, "cli": 1,
    # 2: the settings, models, the run's shape, data and rewards
    "config": 2, "models": 2, "layout": 2, "data": 2, "rewards": 2,
    # 3: Ray and checkpoints, and the plug-ins: tasks, algorithms, rollout engines, tools
    "runtime": 3, "tasks": 3, "algos": 3, "rollout": 3, "tools": 3,
    # 4: the trainer, eval, the GenRM server and client, drop-ins for other trainers
    "trainer": 4, "eval": 4, "genrm": 4, "integrations": 4,
    # 5: the commands
    "train": 5, "eval.__main__": 5, "merge": 5, "plot": 5, "plan": 5, "rehearse": 5, "preflight": 5,
    "errpath": 5,
}

# Package pairs that import each other, each with why it stays. Empty is the goal.
KNOWN_CYCLES: dict[frozenset, str] = {}


def _modules() -> dict[str, pathlib.Path]:
    """Dotted name under the package ('' the package itself) -> file."""
    out = {}
    for path in sorted((ROOT / PKG).rglob("*.py")):
        parts = path.relative_to(ROOT / PKG).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _target(name: str) -> str | None:
    """The module a dotted import name lands in (under the package), or None outside it."""
    if name != PKG and not name.startswith(PKG + "."):
        return None
    name = name[len(PKG) + 1:]
    while name and name not in MODULES and name != "_C":
        name = name.rpartition(".")[0]
    return name


def _imports(module: str) -> set[str]:
    """Every module of the package that `module` imports, anywhere in its text."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    here = f"{PKG}.{module}".rstrip(".") if module else PKG
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package up
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base]).rstrip(".")
            # `from pkg import mod` imports the module pkg.mod, `from pkg.mod import name` pkg.mod
            names = [f"{base}.{a.name}" if _target(f"{base}.{a.name}") == f"{base}.{a.name}"[len(PKG) + 1:]
                     else base for a in node.names]
        else:
            continue
        out.update(t for t in map(_target, names) if t is not None and t != module)
    return out


def _layer(module: str) -> int:
    parts = module.split(".") if module else []
    for i in range(len(parts), -1, -1):
        key = ".".join(parts[:i])
        if key in LAYERS:
            return LAYERS[key]
    raise AssertionError(f"{PKG}.{module} has no floor: give it one in LAYERS")


def _package(module: str) -> str:
    return module.split(".")[0]


GRAPH = {m: _imports(m) for m in MODULES}


def test_every_module_has_a_floor():
    for m in MODULES:
        _layer(m)


def test_imports_point_down():
    up = sorted(f"{PKG}.{a} (floor {_layer(a)}) -> {PKG}.{b} (floor {_layer(b)})"
                for a, targets in GRAPH.items() for b in targets if _layer(b) > _layer(a))
    assert not up, "imports that point up a floor:\n" + "\n".join(up)


def _package_graph() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, targets in GRAPH.items():
        for b in targets:
            if a and b and _package(a) != _package(b):
                out.setdefault(_package(a), set()).add(_package(b))
    return out


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected sets of more than one package (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_two_packages_import_each_other():
    graph = _package_graph()
    bad = [c for c in _cycles(graph) if frozenset(c) not in KNOWN_CYCLES]
    edges = sorted(f"{a} -> {b}: " + ", ".join(sorted(f"{x} -> {y}" for x in GRAPH for y in GRAPH[x]
                                                    if _package(x) == a and _package(y) == b))
                   for c in bad for a in c for b in graph.get(a, ()) if b in c)
    assert not bad, "packages that import each other:\n" + "\n".join(edges)
    for pair in KNOWN_CYCLES:  # a listed cycle that is gone is taken off the list
        assert any(pair <= c for c in _cycles(graph)), f"{set(pair)} no longer import each other: unlist them"


def test_config_stands_on_the_ground_floor():
    config = [m for m in MODULES if _package(m) == "config"]
    assert len(config) >= 2
    above = sorted(f"{PKG}.{a} -> {PKG}.{b} (floor {_layer(b)})" for a in config for b in GRAPH[a]
                   if _package(b) != "config" and _layer(b) > 1)
    assert not above, "config imports above the ground floor:\n" + "\n".join(above)


@pytest.mark.parametrize("source, expected", [
    ("from reasonrl_fast import cli\n", {"cli"}),
    ("def f():\n    from reasonrl_fast.tasks.partition import STYLES\n", {"tasks.partition"}),
    ("import reasonrl_fast.trainer.loop as loop\n", {"trainer.loop"}),
    ("from reasonrl_fast.layout import mini_batch_count\n", {"layout"}),
])
def test_the_reader_sees_every_import_form(tmp_path, monkeypatch, source, expected):
    # a module written as the package's are: every form of import the scan must see
    fake = tmp_path / "probe.py"
    fake.write_text(source)
    monkeypatch.setitem(MODULES, "probe", fake)
    assert _imports("probe") == expected
