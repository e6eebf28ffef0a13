"""The plug-in registries: a name -> "module:Class" table, the class imported when it is first
asked for. The tables live here, on the ground floor, as plain data: the settings read
their names (the choices of `algo`, `data.task`, `rollout.backend`, `fapo.genrm.serve`) and the
sections their plug-ins declare without importing a plug-in package at load. The packages
re-export theirs (`algos.ALGOS`, `tasks.TASKS`, `rollout.ROLLOUTS`, `genrm.backends.BACKENDS`,
`tools.TOOLS`: a tool is a function, not a class), and a new plug-in is one module and one line,
`ALGOS["name"] = "package.module:Class"`.

A plug-in class may declare a settings section of its own: `section` (its name) and `Settings`
(a dataclass with a `check(at)`, config/checks.py's `Checks`). The section hangs where its registry's
choice is made (`Registry.at`): an algorithm's at the top (`flowrl.beta`), a task's under
`data.` (`data.partition.styles`), an engine's under `rollout.`, a GenRM backend's under
`fapo.genrm.`. config/schema.py builds the settings from them."""

from __future__ import annotations

import pkgutil
from collections.abc import Iterator, MutableMapping


class Registry(MutableMapping):
    """name -> "module:Class" (a mapping, so `REG["name"] = "pkg.mod:Class"` registers one),
    with the lookup every plug-in kind shares: `load` (the class), `lookup` (what the kind hands
    out: one instance per class path, or the class itself), a ValueError listing the known names
    for an unknown one."""

    def __init__(self, kind: str, plural: str, entries: dict[str, str], *, at: str = "",
                 instances: bool = True):
        self.kind = kind
        """How an error names one ("algorithm", "rollout engine")."""
        self.plural = plural
        """How an error names them all ("algorithms", "engines")."""
        self.at = at
        """The dotted settings section under which its plug-ins' own sections hang ("" the top)."""
        self.instances = instances
        self.version = 0
        """Counts the changes, so that a schema built from the table knows when it is stale."""
        self._paths = dict(entries)
        self.unloaded: dict[str, str] = {}
        """name -> why it could not be imported, as the last `sections` found them."""
        self._classes: dict[str, type] = {}
        self._instances: dict[str, object] = {}

    # the table
    def __getitem__(self, name: str) -> str:
        return self._paths[name]

    def __setitem__(self, name: str, path: str) -> None:
        self._paths[name] = path
        self.version += 1

    def __delitem__(self, name: str) -> None:
        del self._paths[name]
        self.version += 1

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self._paths!r})"

    # the lookup
    def known(self) -> str:
        """The known names as an error lists them."""
        return ", ".join(self)

    def path(self, name: str) -> str:
        """The "module:Class" of `name`; a ValueError listing the known names otherwise."""
        try:
            return self._paths[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.kind} {name!r}: known {self.plural} are {self.known()}") from None

    def load(self, name: str) -> type:
        """The class registered as `name`, imported on first use."""
        path = self.path(name)
        if path not in self._classes:
            self._classes[path] = pkgutil.resolve_name(path)
        return self._classes[path]

    def lookup(self, name: str):
        """What the kind hands out for `name`: one instance per class path (algorithms, tasks,
        engines), or the class (backends, built per spec)."""
        cls = self.load(name)
        if not self.instances:
            return cls
        path = self.path(name)
        if path not in self._instances:
            self._instances[path] = cls()
        return self._instances[path]

    def sections(self) -> list[tuple[str, str, type]]:
        """(name, section, Settings) of every plug-in that declares a settings section. A plug-in
        that cannot be imported here declares none: a run that names it fails at its lookup, and
        one that sets its settings gets an unknown key, which `unloaded` lets the error explain."""
        out = []
        self.unloaded = {}
        for name in list(self):
            try:
                cls = self.load(name)
            except (ImportError, AttributeError, ValueError) as e:
                self.unloaded[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                continue
            section, settings = getattr(cls, "section", ""), getattr(cls, "Settings", None)
            if section and settings is not None:
                out.append((name, section, settings))
        return out


class BackendRegistry(Registry):
    """The GenRM backends: a spec `NAME:ARG` (`rule:addition`, `hf:PATH`) names one and the
    argument it is built with. `parse` is the one reading of a spec."""

    def known(self) -> str:
        """The known backends as their specs are written ("rule:TASK, hf:PATH")."""
        out = []
        for name in self:
            try:
                out.append(getattr(self.load(name), "usage", f"{name}:ARG"))
            except (ImportError, AttributeError):  # a plug-in that cannot load still gets named
                out.append(f"{name}:ARG")
        return ", ".join(out)

    def parse(self, spec: str) -> tuple[str, str]:
        """(name, arg) of a backend spec `NAME:ARG` (split at the first ':', so a path may hold
        more); a one-line ValueError listing the known backends when NAME is not one of them."""
        name, colon, arg = spec.partition(":") if isinstance(spec, str) else ("", "", "")
        if not colon or name not in self:
            raise ValueError(f"unknown {self.kind} {name!r}: expected NAME:ARG, one of {self.known()}")
        return name, arg

    def of(self, spec: str) -> tuple[type, str]:
        """(backend class, arg) of a backend spec."""
        name, arg = self.parse(spec)
        return self.lookup(name), arg

    def local_model(self, addresses, serve: str) -> str | None:
        """The model directory the run's own GenRM server loads: None when the run asks
        `addresses` (replicas it does not start) or its `serve` backend loads no model (a rule
        judge)."""
        if addresses:
            return None
        cls, arg = self.of(serve)
        return arg if getattr(cls, "loads_model", False) else None


ALGOS = Registry("algorithm", "algorithms", {
    "flowrl": "reasonrl_fast.algos.flowrl:FlowRL",
    "grpo": "reasonrl_fast.algos.grpo:GRPO",
    "fapo": "reasonrl_fast.algos.fapo:FAPO",
})
"""The RL algorithms (`algo`; algos/base.py says what one gives)."""

TASKS = Registry("task", "tasks", {
    "addition": "reasonrl_fast.tasks.addition:Addition",
    "code": "reasonrl_fast.tasks.code:Code",
    "genrm": "reasonrl_fast.tasks.genrm:GenRM",
    "multiply": "reasonrl_fast.tasks.multiply:Multiply",
    "partition": "reasonrl_fast.tasks.partition:Partition",
}, at="data")
"""The embedded tasks (`data.task`; tasks/base.py says what one gives)."""

ROLLOUTS = Registry("rollout engine", "engines", {
    "hf": "reasonrl_fast.rollout.hf:HF",
    "vllm": "reasonrl_fast.rollout.vllm:VLLM",
}, at="rollout")
"""The rollout engines' specs (`rollout.backend`; rollout/registry.py `EngineSpec` says what one gives)."""

BACKENDS = BackendRegistry("GenRM backend", "backends", {
    "rule": "reasonrl_fast.genrm.rule_backend:RuleBackend",
    "hf": "reasonrl_fast.genrm.hf_backend:HFBackend",
}, at="fapo.genrm", instances=False)
"""The GenRM server's backends (`fapo.genrm.serve`; genrm/backends.py says what one gives)."""

TOOLS = Registry("tool", "tools", {
    "calculator": "reasonrl_fast.tools.calculator:calculator",
    "python": "reasonrl_fast.tools.python:python",
}, instances=False)
"""The tools a multi-turn rollout offers the policy (`rollout.tools`; tools/base.py says what one
is: a function, named here or by its "module:function" path). Tools declare no settings."""

REGISTRIES = (ALGOS, TASKS, ROLLOUTS, BACKENDS)
"""Every registry, in the order their sections are built (a backend's hangs in FAPO's)."""

__all__ = ["ALGOS", "BACKENDS", "REGISTRIES", "ROLLOUTS", "TASKS", "TOOLS", "BackendRegistry", "Registry"]
