"""Every `python -m reasonrl_fast.<command>`, each given bad input of every kind it takes (config
files, settings, flags, paths): refused with one line `error: ...` on stderr and exit status 2,
or, for an argument the argument parser itself rejects, argparse's usage lines and its one
`PROG: error: ...` line with the same status. Never a traceback, another status, a hang or a
start: each command runs in-process through its own entry (cli.main), and the work it would
start (training, generation, a server, the error-path children) is replaced by a stop that
fails the case, so a case costs milliseconds once the imports are in."""

from __future__ import annotations

import gzip
import importlib
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.train import ROOT

RECIPE = os.path.join(ROOT, "configs", "grpo_qwen2.5_32b_dapo.yaml")


class Reached(BaseException):
    """The command got past every check to its work: the input was not refused."""


def _stop(*args, **kwargs):
    raise Reached


# the work each command would start once its checks pass
STOPS = {
    "train": ["reasonrl_fast.trainer.loop:run"],
    "rehearse": ["reasonrl_fast.trainer.loop:run", "reasonrl_fast.trainer.stand_ins:stage"],
    "eval": ["reasonrl_fast.eval.generate:generate_all"],
    "genrm.serve": ["reasonrl_fast.genrm.serve:serve"],
    "errpath": ["reasonrl_fast.errpath:check", "reasonrl_fast.errpath:child"],
    "toolchain": ["reasonrl_fast.toolchain:describe"],  # runs the compilers
}
ENTRY = {"eval": "reasonrl_fast.eval.__main__"}


def run_command(command: str, argv: list[str], monkeypatch) -> object:
    """The exit status `python -m reasonrl_fast.<command> ARGV` would end with, or "reached its
    work"; stderr stays in capsys."""
    for target in STOPS.get(command, []):
        module, name = target.split(":")
        monkeypatch.setattr(importlib.import_module(module), name, _stop)
    main = importlib.import_module(ENTRY.get(command, f"reasonrl_fast.{command}")).main
    try:
        result = main([str(a) for a in argv])
    except SystemExit as e:
        return e.code
    except Reached:
        return "reached its work"
    if command == "plan":
        return 0 if result.fits else 1
    return result if isinstance(result, int) else 0


def assert_refused(status, err: str, says=()) -> str:
    """Exit status 2 and either one line `error: ...` or argparse's usage + `PROG: error: ...`;
    the error line holds each of `says`."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and "Traceback" not in err, (status, err[-2000:])
    if lines and lines[0].startswith("usage: "):
        errors = [line for line in lines if ": error: " in line]
        assert len(errors) == 1 and errors[0] == lines[-1], lines
    else:
        assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for fragment in says:
        assert fragment in lines[-1], (fragment, lines[-1])
    return lines[-1]


class Files:
    """The inputs of one case, under tmp_path. A FIFO is watched: a command that opens one for
    reading (and would block there) is unblocked with an empty write side and the case fails."""

    def __init__(self, tmp, checkpoint_source=None):
        self.tmp = tmp
        self._checkpoint_source = checkpoint_source
        self.fifo_opened: list[str] = []
        self._fifos: list[str] = []
        self._done = threading.Event()
        self._watcher: threading.Thread | None = None

    def text(self, name: str, text: str):
        (self.tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (self.tmp / name).write_text(text)
        return self.tmp / name

    def bytes(self, name: str, data: bytes):
        (self.tmp / name).write_bytes(data)
        return self.tmp / name

    def dir(self, name: str):
        (self.tmp / name).mkdir(parents=True, exist_ok=True)
        return self.tmp / name

    def fifo(self, name: str):
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        self._fifos.append(str(path))
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, daemon=True)
            self._watcher.start()
        return path

    def _watch(self):
        while not self._done.is_set():
            for path in self._fifos:
                try:  # succeeds only while a reader has it open
                    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                except OSError:
                    continue
                self.fifo_opened.append(path)
                os.close(fd)
            time.sleep(0.01)

    def close(self):
        self._done.set()
        if self._watcher is not None:
            self._watcher.join()

    def model(self, name: str = "model"):
        """A model directory the eval command reads up to generation: config.json and the
        character tokenizer (no weights)."""
        from transformers import Qwen2Config

        from reasonrl_fast.models.tiny import char_tokenizer

        path = self.dir(name)
        tok = char_tokenizer()
        Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512).save_pretrained(path)
        tok.save_pretrained(path)
        return path

    def link(self, name: str, to):
        os.symlink(to, self.tmp / name)
        return self.tmp / name

    def parquet(self, name: str, cut: float | None = None):
        """A gsm8k-layout parquet file, or its first `cut` share of bytes (a file cut off)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = self.tmp / name
        pq.write_table(pa.Table.from_pylist([{"question": f"q{i}", "answer": f"#### {i}"} for i in range(20)]), path)
        if cut is not None:
            data = path.read_bytes()
            path.write_bytes(data[:int(len(data) * cut)])
        return path

    def gz(self, name: str, data: bytes | None = None, cut: float | None = None, damage: bool = False):
        """A gzip file of gsm8k-layout JSON lines (or of `data`): whole, its first `cut` share
        of bytes, or with its deflate stream overwritten (`damage`)."""
        blob = gzip.compress(data if data is not None else
                             b"".join(b'{"question": "q%d", "answer": "#### %d"}\n' % (i, i) for i in range(200)))
        if cut is not None:
            blob = blob[:int(len(blob) * cut)]
        if damage:  # the 10-byte header stays; the stream after it is garbage
            blob = blob[:10] + b"\xff" * 40 + blob[50:]
        return self.bytes(name, blob)

    def records(self, name: str = "recs.jsonl"):
        """A records file the eval command reads (addition prompts the character tokenizer has)."""
        return self.text(name, "".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n"
                                       for a in (12, 34)))

    def checkpoint(self, name: str, config_json: str):
        """A copy of a one-process checkpoint of the tiny model whose hf/config.json is
        `config_json`, its size and checksum recorded anew (as a checkpoint crafted to be merged
        would have them): only the config is wrong."""
        from reasonrl_fast.runtime import checkpoint as ckpt

        path = self.tmp / name
        shutil.copytree(self._checkpoint_source(), path)
        (path / "hf" / "config.json").write_text(config_json)
        state = json.loads((path / ckpt.STATE).read_text())
        (size, crc), = ckpt.checksums(str(path), ["hf/config.json"]).values()
        state["files"]["hf/config.json"], state["checksums"]["hf/config.json"] = size, crc
        (path / ckpt.STATE).write_text(json.dumps(state))
        return path

    def tiny_config(self, **fields) -> str:
        """The tiny checkpoint's own config.json with `fields` changed (None: left out)."""
        d = json.loads((Path(self._checkpoint_source()) / "hf" / "config.json").read_text())
        d.update(fields)
        return json.dumps({k: v for k, v in d.items() if v is not None})

    def shape(self, **fields):
        """A model directory whose config.json is a small Qwen2's with `fields` changed (None:
        left out)."""
        d = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 4096}
        d.update(fields)
        d = {k: v for k, v in d.items() if v is not None}
        return self.text("shaped/config.json", json.dumps(d)).parent


# ---------------------------------------------------------------- the cases

# A config file that cannot be one: (id, make(files) -> path, what the line says)
BAD_CONFIG_FILES = [
    ("missing", lambda f: f.tmp / "nope.yaml", ["nope.yaml", "no such file"]),
    ("directory", lambda f: f.dir("cfgdir"), ["cfgdir", "is a directory"]),
    ("fifo", lambda f: f.fifo("pipe.yaml"), ["pipe.yaml", "not a regular file"]),
    ("empty", lambda f: f.text("empty.yaml", ""), ["empty.yaml", "empty"]),
    ("comments only", lambda f: f.text("comments.yaml", "# nothing set\n\n"), ["comments.yaml", "empty"]),
    ("binary garbage", lambda f: f.bytes("bin.yaml", b"\xff\xfe\x00\x01garbage\x00"), ["bin.yaml"]),
    ("invalid yaml", lambda f: f.text("bad.yaml", "trainer: [steps\n"), ["bad.yaml", "not valid YAML"]),
    ("list yaml", lambda f: f.text("list.yaml", "- trainer.steps=3\n"), ["list.yaml", "expected a mapping"]),
    ("scalar yaml", lambda f: f.text("scalar.yaml", "42\n"), ["scalar.yaml", "expected a mapping"]),
    ("unknown section", lambda f: f.text("unknown.yaml", "nosuch: 1\n"), ["nosuch"]),
    ("unknown key", lambda f: f.text("unknown2.yaml", "trainer:\n  nosuch: 1\n"), ["nosuch"]),
    ("string for int", lambda f: f.text("str.yaml", "trainer:\n  steps: many\n"), ["trainer.steps", "many"]),
    ("bool for int", lambda f: f.text("bool.yaml", "trainer:\n  steps: true\n"), ["trainer.steps", "True"]),
    ("section not a mapping", lambda f: f.text("sect.yaml", "trainer: 5\n"), ["trainer=5", "a section"]),
]

# A bad `key=value` (id, the override, what the line says)
BAD_OVERRIDES = [
    ("no key", "=5", ["'=5'", "key=value"]),
    ("empty segment", "a..b=1", ["'a..b=1'", "key=value"]),
    ("trailing dot", "trainer.=1", ["'trainer.=1'", "key=value"]),
    ("leading space", " trainer.steps=1", ["' trainer.steps=1'", "key=value"]),
    ("unknown key", "nosuch.key=1", ["nosuch"]),
    ("string for int", "trainer.steps=abc", ["trainer.steps", "abc"]),
    ("float for int", "trainer.steps=1.5", ["trainer.steps", "1.5"]),
    ("bool for int", "trainer.steps=true", ["trainer.steps", "True"]),
    ("list for int", "trainer.steps=[1,2]", ["trainer.steps"]),
    ("null for int", "trainer.steps=null", ["trainer.steps", "None"]),
    ("negative count", "trainer.steps=-1", ["trainer.steps=-1"]),
    ("zero workers", "trainer.workers_per_node=0", ["trainer.workers_per_node=0"]),
    ("nan temperature", "rollout.temperature=nan", ["rollout.temperature=nan"]),
    ("bad enum", "algo=dapo", ["algo='dapo'"]),
    ("bad backend", "rollout.backend=xyz", ["rollout.backend='xyz'"]),
    ("section as value", "trainer=5", ["trainer=5", "a section"]),
    ("nan lr", "optim.lr=nan", ["optim.lr=nan"]),
    ("inf lr", "optim.lr=inf", ["optim.lr=inf"]),
    ("negative lr", "optim.lr=-1", ["optim.lr=-1"]),
    ("inf temperature", "rollout.temperature=inf", ["rollout.temperature=inf"]),
]


def _config_files(command, after=()):
    """A command that takes [CONFIG] key=value ...: each bad config file."""
    return [pytest.param(command, lambda f, m=make: [m(f), *after], says, id=f"{command}: config {name}")
            for name, make, says in BAD_CONFIG_FILES]


def _overrides(command, base=(), after=(), tag=""):
    """... and each bad override (after `base`, before `after`)."""
    return [pytest.param(command, lambda f, o=override: [*base, o, *after], says,
                         id=f"{command}: override {name}{tag}") for name, override, says in BAD_OVERRIDES]


def _out(f, name="run"):
    return f"trainer.output_dir={f.tmp / name}"


TRAIN = _config_files("train") + _overrides("train") + [
    pytest.param("train", lambda f: [RECIPE, "--output-dir", f.tmp / "x"], ["--output-dir"], id="train: a flag"),
    pytest.param("train", lambda f: ["trainer.steps", "trainer.seed=1"], ["'trainer.steps'", "key=value"],
                 id="train: override without ="),
    pytest.param("train", lambda f: [f"model.path={f.tmp / 'nowhere'}", _out(f)], ["nowhere"],
                 id="train: model.path missing"),
    pytest.param("train", lambda f: [f"model.path={f.shape(hidden_size=-64)}", _out(f)], ["hidden_size=-64"],
                 id="train: negative hidden_size"),
    pytest.param("train", lambda f: ["model.hidden_size=-8", _out(f)], ["hidden_size=-8"], id="train: tiny -8"),
    pytest.param("train", lambda f: ["model.num_heads=3", _out(f)], ["num_attention_heads=3"],
                 id="train: tiny heads"),
    pytest.param("train", lambda f: ["model.num_layers=-2", _out(f)], ["model.num_layers=-2"],
                 id="train: tiny layers -2"),
    pytest.param("train", lambda f: ["model.num_heads=0", _out(f)], ["num_heads=0"], id="train: tiny heads 0"),
    pytest.param("train", lambda f: [f"data.train_files=[{f.tmp / 'none.jsonl'}]", _out(f)], ["none.jsonl"],
                 id="train: data file missing"),
    pytest.param("train", lambda f: [f"data.train_files=[{f.fifo('pipe.jsonl')}]", _out(f)], ["pipe.jsonl"],
                 id="train: data file fifo"),
    pytest.param("train", lambda f: [f"trainer.output_dir={f.text('afile', 'x')}"], ["is not a directory"],
                 id="train: output_dir a file"),
]

EVAL = _config_files("eval", after=("model.path=/nonexistent",)) + _overrides("eval") + [
    pytest.param("eval", lambda f: ["eval.n=0"], ["eval.n=0"], id="eval: n 0"),
    pytest.param("eval", lambda f: ["eval.n=true"], ["eval.n"], id="eval: n bool"),
    pytest.param("eval", lambda f: ["eval.k=[0]"], ["eval.k"], id="eval: k 0"),
    pytest.param("eval", lambda f: ["eval.top_p=nan"], ["eval.top_p"], id="eval: top_p nan"),
    pytest.param("eval", lambda f: [], ["model.path"], id="eval: no model"),
    pytest.param("eval", lambda f: [f"model.path={f.tmp / 'nowhere'}"], ["nowhere", "no such directory"],
                 id="eval: model.path missing"),
    pytest.param("eval", lambda f: [f"model.path={f.text('afile', 'x')}"], ["afile"], id="eval: model.path a file"),
    pytest.param("eval", lambda f: [f"model.path={f.dir('emptydir')}"], ["emptydir"],
                 id="eval: model.path empty dir"),
    pytest.param("eval", lambda f: [f"model.path={f.model()}", f"eval.files=[{f.tmp / 'none.jsonl'}]",
                                    f"eval.output_dir={f.tmp / 'out'}"], ["none.jsonl"], id="eval: files missing"),
    pytest.param("eval", lambda f: [f"model.path={f.model()}", f"eval.files=[{f.text('deep.jsonl', '[' * 100_000)}]",
                                    f"eval.output_dir={f.tmp / 'out'}"], ["deep.jsonl:1", "nested too deeply"],
                 id="eval: files nested too deeply"),
    # the target is what this eval writes: refused before anything else
    pytest.param("eval", lambda f: [f"eval.target={f.dir('out')}", f"eval.output_dir={f.tmp / 'out'}"],
                 ["eval.target", "own output"], id="eval: target is the output directory"),
    pytest.param("eval", lambda f: [f"eval.target={f.text('out/samples.jsonl', '')}", "eval.output_dir=out"],
                 ["eval.target", "own output"], id="eval: target is the output's samples.jsonl"),
    pytest.param("eval", lambda f: [f"eval.target={f.link('ref', f.dir('out'))}", f"eval.output_dir={f.tmp / 'out'}"],
                 ["eval.target", "own output"], id="eval: target a link to the output directory"),
    pytest.param("eval", lambda f: [f"eval.target={f.tmp / 'out' / 'samples.jsonl'}", f"eval.output_dir={f.tmp / 'out'}"],
                 ["eval.target", "own output"], id="eval: target the samples.jsonl the eval will write"),
    pytest.param("eval", lambda f: [f"model.path={f.model()}", f"eval.files=[{f.records()}]", "eval.seed=1",
                                    f"eval.target={f.text('ref/samples.jsonl', '[' * 100_000)}",
                                    f"eval.output_dir={f.tmp / 'out'}"], ["samples.jsonl:1", "nested too deeply"],
                 id="eval: target nested too deeply"),
]

PLAN = _config_files("plan") + _overrides("plan") + _overrides("plan", (RECIPE,), ("--gpu-memory-gb", "80"),
                                                              " (recipe)") + [
    pytest.param("plan", lambda f: [RECIPE, "--gpus", "8", "algo=dapo"], ["algo='dapo'"],
                 id="plan: override after a flag"),
]
# every numeric flag: finite and positive
for flag, values in {"--gpu-memory-gb": ["inf", "-inf", "nan", "-1", "0", "x", "1e999"],
                     "--gpus": ["0", "-8", "12", "x", "1.5", "inf", "nan", "true"]}.items():
    for v in values:
        # `--flag=-inf`: argparse takes a lone `-inf` for an option
        argv = [f"{flag}={v}"] if v.startswith("-") else [flag, v]
        PLAN.append(pytest.param("plan", lambda f, a=argv: a, [f"{flag} {v}"], id=f"plan: {flag} {v}"))
PLAN.append(pytest.param("plan", lambda f: ["--device", "tpu"], ["tpu"], id="plan: --device tpu"))
PLAN.append(pytest.param("plan", lambda f: ["--bogus"], ["--bogus"], id="plan: unknown flag"))
# every shape field of the embedded model's section and of a config.json
for setting, says in {"model.hidden_size=-8": "model.hidden_size=-8", "model.hidden_size=0": "model.hidden_size=0",
                      "model.num_heads=3": "num_attention_heads=3", "model.num_heads=0": "model.num_heads=0",
                      "model.num_layers=0": "model.num_layers=0", "model.num_layers=-2": "model.num_layers=-2",
                      "model.intermediate_size=0": "model.intermediate_size=0",
                      "model.max_position_embeddings=0": "max_position_embeddings=0",
                      "model.max_position_embeddings=-5": "max_position_embeddings=-5"}.items():
    PLAN.append(pytest.param("plan", lambda f, s=setting: [s], [says], id=f"plan: {setting}"))
for field_, value in [("hidden_size", -64), ("hidden_size", 0), ("hidden_size", 64.0), ("hidden_size", 64.5),
                      ("hidden_size", True), ("hidden_size", "64"), ("hidden_size", [64]), ("hidden_size", None),
                      ("num_attention_heads", 3), ("num_attention_heads", -4), ("num_key_value_heads", 3),
                      ("num_key_value_heads", 0), ("num_key_value_heads", 8), ("head_dim", 0), ("head_dim", "16"),
                      ("vocab_size", 0), ("vocab_size", -1), ("vocab_size", False), ("intermediate_size", 0),
                      ("intermediate_size", 1.5), ("num_hidden_layers", 0), ("num_hidden_layers", True),
                      ("max_position_embeddings", 0), ("max_position_embeddings", "4096"),
                      ("max_position_embeddings", float("inf"))]:
    says = field_ if value is None else f"{field_}={value!r}"
    PLAN.append(pytest.param("plan", lambda f, k=field_, v=value: [f"model.path={f.shape(**{k: v})}"], [says],
                             id=f"plan: config.json {field_}={value!r}"))

REHEARSE = _config_files("rehearse") + _overrides("rehearse", (RECIPE,)) + [
    pytest.param("rehearse", lambda f: [RECIPE, "--output-dir", f.tmp / "r", "algo=dapo"], ["algo='dapo'"],
                 id="rehearse: override after a flag"),
    pytest.param("rehearse", lambda f: [], [], id="rehearse: no config"),
    pytest.param("rehearse", lambda f: [RECIPE, "--output-dir", f.text("afile", "x")], ["afile"],
                 id="rehearse: output-dir a file"),
]

MERGE = [
    pytest.param("merge", lambda f: [f.tmp / "run" / "checkpoint-7", f.tmp / "merged"], ["checkpoint-7"],
                 id="merge: missing checkpoint"),
    pytest.param("merge", lambda f: [f.text("ckfile", "x"), f.tmp / "merged"], ["ckfile"], id="merge: a file"),
    pytest.param("merge", lambda f: [f.dir("checkpoint-3"), f.tmp / "merged"], ["checkpoint-3"],
                 id="merge: empty directory"),
    pytest.param("merge", lambda f: [f.fifo("checkpoint-4"), f.tmp / "merged"], ["checkpoint-4"], id="merge: fifo"),
    pytest.param("merge", lambda f: [], [], id="merge: no arguments"),
    pytest.param("merge", lambda f: [f.tmp / "c", f.tmp / "m", "--bogus"], ["--bogus"], id="merge: unknown flag"),
] + [
    # a checkpoint whose hf/config.json was crafted (its size and checksum recorded to match)
    pytest.param("merge", lambda f, c=config: [f.checkpoint("checkpoint-5", c(f)), f.tmp / "merged"],
                 ["checkpoint-5/hf/config.json", *says], id=f"merge: config.json {name}")
    for name, config, says in [
        ("nested too deeply", lambda f: "[" * 100_000, ["not valid JSON", "nested too deeply"]),
        ("not JSON", lambda f: "{model_type: qwen2", ["not valid JSON"]),
        ("a list", lambda f: "[1, 2]", ["expected a JSON object", "list"]),
        ("without model_type", lambda f: f.tiny_config(model_type=None), ["model_type"]),
        ("unknown model_type", lambda f: f.tiny_config(model_type="nosuch"), ["nosuch"]),
        ("string hidden_size", lambda f: f.tiny_config(hidden_size="abc"), ["hidden_size"]),
        ("float heads", lambda f: f.tiny_config(num_attention_heads=2.5), ["num_attention_heads"]),
        ("list vocab_size", lambda f: f.tiny_config(vocab_size=[99]), ["vocab_size"]),
        ("negative layers", lambda f: f.tiny_config(num_hidden_layers=-1), ["num_hidden_layers"]),
        ("a deep value", lambda f: f.tiny_config(rope_scaling=json.loads("[" * 500 + "]" * 500)), ["RecursionError"]),
        ("other shapes than the weights", lambda f: f.tiny_config(hidden_size=256),
         ["does not describe the checkpoint's weights"]),
    ]
]


def _run_dir(f, name="run", metrics=None):
    d = f.dir(name)
    if metrics is not None:
        f.text(f"{name}/metrics.jsonl", metrics)
    return d


GOOD_METRICS = "".join(json.dumps({"step": s, "reward/mean": s / 10}) + "\n" for s in (1, 2))
PLOT = [
    pytest.param("plot", lambda f: [f.tmp / "no_run", "-o", f.tmp / "p.png"], ["no_run"], id="plot: missing run"),
    pytest.param("plot", lambda f: [_run_dir(f), "-o", f.tmp / "p.png"], ["metrics.jsonl"], id="plot: no metrics"),
    pytest.param("plot", lambda f: [_run_dir(f, metrics=""), "-o", f.tmp / "p.png"], ["run"], id="plot: empty metrics"),
    pytest.param("plot", lambda f: [_run_dir(f, metrics="{garbage\n" + GOOD_METRICS), "-o", f.tmp / "p.png"],
                 ["metrics.jsonl"], id="plot: garbage metrics"),
    pytest.param("plot", lambda f: [_run_dir(f, metrics="[1, 2]\n"), "-o", f.tmp / "p.png"], ["run"],
                 id="plot: metrics not objects"),
    pytest.param("plot", lambda f: [(f.fifo("run/metrics.jsonl"), f.tmp / "run")[1], "-o", f.tmp / "p.png"],
                 ["metrics.jsonl"], id="plot: metrics fifo"),
    pytest.param("plot", lambda f: [(f.dir("run/metrics.jsonl"), f.tmp / "run")[1], "-o", f.tmp / "p.png"],
                 ["metrics.jsonl"], id="plot: metrics a directory"),
    pytest.param("plot", lambda f: [_run_dir(f, metrics=GOOD_METRICS), "-o", f.dir("outdir")], ["outdir"],
                 id="plot: output a directory"),
    pytest.param("plot", lambda f: [_run_dir(f, metrics=GOOD_METRICS), "-o", f.text("afile", "x") / "p.png"],
                 ["afile"], id="plot: output under a file"),
    pytest.param("plot", lambda f: [_run_dir(f, metrics=GOOD_METRICS), "-o", f.tmp / "p.png", "--summary",
                                    f.dir("sumdir")], ["sumdir"], id="plot: summary a directory"),
    pytest.param("plot", lambda f: [_run_dir(f, metrics=GOOD_METRICS)], ["--output"], id="plot: no output"),
    pytest.param("plot", lambda f: [_run_dir(f, metrics=GOOD_METRICS), "-o", f.tmp / "x.txt"], ["x.txt", ".txt"],
                 id="plot: output an extension matplotlib cannot write"),
    pytest.param("plot", lambda f: [_run_dir(f, metrics=GOOD_METRICS), "-o", f.tmp / "fig"],
                 ["fig", "without an extension"], id="plot: output without an extension"),
    pytest.param("plot", lambda f: [_run_dir(f, metrics=GOOD_METRICS), "-o", f.tmp / "p.png", "--summary",
                                    f.tmp / "run" / "metrics.jsonl"], ["--summary", "an input"],
                 id="plot: summary onto the run's metrics"),
    pytest.param("plot", lambda f: [_run_dir(f, metrics=GOOD_METRICS), "-o", f.tmp / "p.png", "--summary",
                                    f.link("m.md", f.tmp / "run" / "metrics.jsonl")], ["--summary", "an input"],
                 id="plot: summary onto the run's metrics through a link"),
    pytest.param("plot", lambda f: [(_run_dir(f, metrics=GOOD_METRICS), f.text("run/config.yaml", "algo: grpo\n"))[0],
                                    "-o", f.tmp / "p.png", "--summary", "run/config.yaml"], ["--summary", "an input"],
                 id="plot: summary onto the run's config by a relative path"),
    pytest.param("plot", lambda f: [_run_dir(f, metrics=GOOD_METRICS), "-o", f.tmp / "p.png", "--summary",
                                    f.tmp / "p.png"], ["--summary", "--output"], id="plot: summary onto the figure"),
    pytest.param("plot", lambda f: [_run_dir(f, metrics="[" * 100_000 + "\n" + GOOD_METRICS), "-o", f.tmp / "p.png"],
                 ["metrics.jsonl, line 1", "nested too deeply"], id="plot: metrics nested too deeply"),
    pytest.param("plot", lambda f: [(f.dir("run"), f.bytes("run/metrics.jsonl", b'{"step": 1}\n\xff\xfe\n'))[0],
                                    "-o", f.tmp / "p.png"], ["metrics.jsonl", "UTF-8"], id="plot: metrics not UTF-8"),
]

PREPARE = [
    pytest.param("data.prepare", lambda f: ["sudoku", "--output", f.tmp / "o.jsonl"], ["sudoku"],
                 id="prepare: unknown set"),
    pytest.param("data.prepare", lambda f: ["gsm8k", "--input", f.tmp / "none.jsonl", "--output", f.tmp / "o.jsonl"],
                 ["none.jsonl"], id="prepare: input missing"),
    pytest.param("data.prepare", lambda f: ["gsm8k", "--input", f.dir("indir"), "--output", f.tmp / "o.jsonl"],
                 ["indir"], id="prepare: input a directory"),
    pytest.param("data.prepare", lambda f: ["gsm8k", "--input", f.fifo("in.jsonl"), "--output", f.tmp / "o.jsonl"],
                 ["in.jsonl"], id="prepare: input fifo"),
    pytest.param("data.prepare", lambda f: ["gsm8k", "--input", f.text("e.jsonl", ""), "--output", f.tmp / "o.jsonl"],
                 ["e.jsonl"], id="prepare: input empty"),
    pytest.param("data.prepare", lambda f: ["gsm8k", "--input", f.bytes("g.jsonl", b"\xff\x00junk"), "--output",
                                            f.tmp / "o.jsonl"], ["g.jsonl"], id="prepare: input garbage"),
    pytest.param("data.prepare", lambda f: ["smoke", "--output", f.tmp / "o.txt"], ["o.txt"],
                 id="prepare: output extension"),
    pytest.param("data.prepare", lambda f: ["smoke", "--output", f.dir("o.jsonl")], ["o.jsonl"],
                 id="prepare: output a directory"),
    pytest.param("data.prepare", lambda f: ["smoke", "--output", f.tmp / "o.jsonl", "--limit", "-1"], ["--limit -1"],
                 id="prepare: limit -1"),
    pytest.param("data.prepare", lambda f: ["smoke", "--output", f.tmp / "o.jsonl", "--limit", "0"], ["--limit 0"],
                 id="prepare: limit 0"),
    pytest.param("data.prepare", lambda f: ["smoke", "--output", f.tmp / "o.jsonl", "--limit", "x"], ["--limit"],
                 id="prepare: limit x"),
    pytest.param("data.prepare", lambda f: ["smoke", "--output", f.tmp / "o.jsonl", "--split", "dev"], ["dev"],
                 id="prepare: split dev"),
    pytest.param("data.prepare", lambda f: ["smoke"], ["--output"], id="prepare: no output"),
] + [
    # an input file that is not what its name says, or damaged: (id, make, what the line says)
    pytest.param("data.prepare", lambda f, m=make: ["gsm8k", "--input", m(f), "--output", f.tmp / "o.jsonl"],
                 says, id=f"prepare: input {name}")
    for name, make, says in [
        ("parquet cut off", lambda f: f.parquet("cut.parquet", cut=0.5), ["cut.parquet", "not a readable parquet"]),
        ("parquet of other bytes", lambda f: f.text("fake.parquet", "question,answer\n"),
         ["fake.parquet", "not a readable parquet"]),
        ("parquet empty", lambda f: f.bytes("empty.parquet", b""), ["empty.parquet", "not a readable parquet"]),
        ("gz cut off", lambda f: f.gz("cut.jsonl.gz", cut=0.5), ["cut.jsonl.gz", "cut-off gzip"]),
        ("gz without a gzip header", lambda f: f.text("plain.jsonl.gz", '{"question": "q"}\n'),
         ["plain.jsonl.gz", "not a readable gzip file"]),
        ("gz with a damaged stream", lambda f: f.gz("bad.jsonl.gz", damage=True), ["bad.jsonl.gz", "damaged"]),
        ("gz of bytes that are not UTF-8", lambda f: f.gz("bin.jsonl.gz", b"\xff\xfe\x00junk\n"),
         ["bin.jsonl.gz", "UTF-8"]),
        ("gz of a line nested too deeply", lambda f: f.gz("deep.jsonl.gz", b"[" * 100_000 + b"\n"),
         ["deep.jsonl.gz:1", "nested too deeply"]),
        ("jsonl line not JSON", lambda f: f.text("bad.jsonl", '{"question": "q", "answer": "#### 1"}\n{oops\n'),
         ["bad.jsonl:2", "not valid JSON"]),
        ("jsonl line not an object", lambda f: f.text("list.jsonl", "[1, 2]\n"), ["list.jsonl:1", "got list"]),
        ("jsonl line nested too deeply", lambda f: f.text("deep.jsonl", "\n" + "[" * 100_000 + "\n"),
         ["deep.jsonl:2", "nested too deeply"]),
        ("json nested too deeply", lambda f: f.text("deep.json", "[" * 100_000), ["deep.json", "nested too deeply"]),
        ("json not a list", lambda f: f.text("obj.json", '{"question": "q"}'), ["obj.json", "JSON list"]),
        ("json list of non-objects", lambda f: f.text("nums.json", "[1, 2]"), ["nums.json", "record 1"]),
        ("json not valid", lambda f: f.text("bad.json", '[{"question": '), ["bad.json", "not valid JSON"]),
        ("json not UTF-8", lambda f: f.bytes("bin.json", b'[{"question": "\xff"}]'), ["bin.json", "UTF-8"]),
        ("json empty", lambda f: f.text("empty.json", ""), ["empty.json", "empty"]),
        ("gz empty", lambda f: f.bytes("empty.jsonl.gz", b""), ["empty.jsonl.gz", "empty"]),
    ]
] + [
    pytest.param("data.prepare", lambda f: ["humaneval", "--input", f.gz("he.jsonl.gz", cut=0.5), "--output",
                                            f.tmp / "o.jsonl"], ["he.jsonl.gz", "cut-off gzip"],
                 id="prepare: humaneval input cut off"),
    # the output is an input, under any name: refused before it is read (or lost)
    pytest.param("data.prepare", lambda f: ["jsonl", "--input", f.records("in.jsonl"), "--output", f.tmp / "in.jsonl"],
                 ["--output", "is the --input file"], id="prepare: output is the input"),
    pytest.param("data.prepare", lambda f: ["jsonl", "--input", f.records("in.jsonl"), "--output", "sub/../in.jsonl"],
                 ["--output", "is the --input file"], id="prepare: output is the input by a relative path"),
    pytest.param("data.prepare", lambda f: ["jsonl", "--input", f.records("in.jsonl"), "--output",
                                            f.link("out.jsonl", f.tmp / "in.jsonl")],
                 ["--output", "is the --input file"], id="prepare: output a link to the input"),
    pytest.param("data.prepare", lambda f: ["jsonl", "--input", f.link("in.jsonl", f.records("real.jsonl")),
                                            "--output", f.tmp / "real.jsonl"],
                 ["--output", "is the --input file"], id="prepare: input a link to the output"),
    pytest.param("data.prepare", lambda f: ["jsonl", "--input", f.records("in.jsonl"), "--output",
                                            (os.link(f.tmp / "in.jsonl", f.tmp / "hard.jsonl"), f.tmp / "hard.jsonl")[1]],
                 ["--output", "is the --input file"], id="prepare: output a hard link of the input"),
]

SERVE = [
    pytest.param("genrm.serve", lambda f: ["--backend", "rule:sudoku", "--port", "0"], ["rule:sudoku"],
                 id="serve: unknown rule"),
    pytest.param("genrm.serve", lambda f: ["--backend", "bogus", "--port", "0"], ["bogus"], id="serve: bad backend"),
    pytest.param("genrm.serve", lambda f: ["--backend", f"hf:{f.tmp / 'nowhere'}", "--port", "0"], ["nowhere"],
                 id="serve: hf missing"),
    pytest.param("genrm.serve", lambda f: ["--port", "0"], ["--backend"], id="serve: no backend"),
] + [
    pytest.param("genrm.serve", lambda f, a=args: ["--backend", "rule:addition", *a], [args[0]],
                 id=f"serve: {' '.join(args)}")
    for args in [("--port", "-1"), ("--port", "70000"), ("--port", "x"), ("--max-batch", "0"),
                 ("--max-in-flight", "0"), ("--max-queued", "-1"), ("--queue-timeout-s", "nan"),
                 ("--queue-timeout-s", "-1"), ("--idle-timeout-s", "0"), ("--body-timeout-s", "nan"),
                 ("--completion-timeout-s", "inf"), ("--device", "tpu")]
]

ERRPATH = [
    pytest.param("errpath", lambda f, a=args: list(a), [args[0]], id=f"errpath: {' '.join(args)}",
)
    for args in [("--timeout", "nan"), ("--timeout", "inf"), ("--timeout", "0"), ("--timeout", "x"),
                 ("--threads", "0"), ("--repeat", "-1"), ("--device", "tpu"), ("--library", "/nonexistent/_C.so")]
]

TOOLCHAIN = [
    pytest.param("toolchain", lambda f: [f.tmp / "none.so"], ["none.so"], id="toolchain: missing file"),
    pytest.param("toolchain", lambda f: ["a.so", "b.so"], ["b.so"], id="toolchain: two files"),
]

CASES = TRAIN + EVAL + PLAN + REHEARSE + MERGE + PLOT + PREPARE + SERVE + ERRPATH + TOOLCHAIN


@pytest.fixture(scope="module")
def checkpoint_source(tmp_path_factory):
    """A callable returning a one-process checkpoint of the tiny model, saved on first call (the
    merge cases copy it): the cases that need none do not pay for it."""
    made = []

    def get():
        if not made:
            from tests.test_merge import tiny_checkpoint

            made.append(tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "run")[1])
        return made[0]

    return get


@pytest.fixture
def files(tmp_path, checkpoint_source):
    f = Files(tmp_path, checkpoint_source)
    yield f
    f.close()


@pytest.mark.parametrize("command,make,says", CASES)
def test_bad_input_is_refused_in_one_line(command, make, says, files, monkeypatch, capsys):
    monkeypatch.chdir(files.tmp)  # nothing a command writes by default lands in the checkout
    argv = make(files)
    status = run_command(command, argv, monkeypatch)
    files.close()
    assert not files.fifo_opened, f"opened the FIFO {files.fifo_opened} and waited for a writer"
    assert_refused(status, capsys.readouterr().err, says)
