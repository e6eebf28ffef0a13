"""Bad eval input gives a clear error naming what is wrong, before any model or Ray starts
(a few seconds; the CLI case starts one Python process)."""

import json
import os
import subprocess
import sys

import pytest

from reasonrl_fast.eval.run import EvalError, load_eval_set, resolved_model
from reasonrl_fast.models.tiny import char_tokenizer
from reasonrl_fast.runtime.checkpoint import CheckpointError
from reasonrl_fast.config import ConfigError, load_config
from tests.helpers.ckpt import cli_error, fake_checkpoint, memory_cap
from tests.helpers.model_dirs import model_dir


def test_k_larger_than_n():
    with pytest.raises(ConfigError, match=r"eval.k=\[1, 8\].*8.*eval.n=4"):
        load_config(None, ["eval.n=4", "eval.k=[1,8]"])
    with pytest.raises(ConfigError, match="eval.n"):
        load_config(None, ["eval.n=0"])
    assert load_config(None, ["eval.n=4"]).eval.k == []  # empty k: pass@1 and pass@n


@pytest.mark.proc
def test_cli_config_error_is_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "reasonrl_fast.eval", f"model.path={tmp_path}", "eval.n=2",
                        "eval.k=[4]"], capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "eval.k=[4]" in p.stderr and "eval.n=2" in p.stderr


def test_model_path_empty_or_incomplete_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match="model.path is empty"):
        with resolved_model(load_config(None, [])):
            pass
    ck = tmp_path / "checkpoint-3"
    ck.mkdir()
    (ck / "trainer_state.json").write_text(json.dumps(
        {"step": 3, "world_size": 1, "files": {".metadata": 10, "__0_0.distcp": 100, "rng_rank0.safetensors": 5}}))
    (ck / ".metadata").write_bytes(b"x" * 10)
    with pytest.raises(CheckpointError, match=r"checkpoint-3.*missing or damaged: __0_0.distcp, rng_rank0.safetensors"):
        with resolved_model(load_config(None, [f"model.path={ck}"])):
            pass


def test_checkpoint_without_trainer_state_names_it(tmp_path, capsys):
    from reasonrl_fast.eval.__main__ import main

    path = fake_checkpoint(tmp_path, 3, "r1")
    os.remove(os.path.join(path, "trainer_state.json"))
    err = cli_error(capsys, main, [f"model.path={path}"])
    assert "a checkpoint without trainer_state.json" in err and ".metadata" in err and "rng_rank" in err
    err = cli_error(capsys, main, [f"model.path={tmp_path}"])  # the run directory: neither kind
    assert "neither trainer_state.json nor config.json" in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero"])
def test_trainer_state_that_is_no_file_is_named_not_read(tmp_path, capsys, kind):
    from reasonrl_fast.eval.__main__ import main

    path = fake_checkpoint(tmp_path, 3, "r1")
    state = os.path.join(path, "trainer_state.json")
    os.remove(state)
    os.mkfifo(state) if kind == "fifo" else os.symlink("/dev/zero", state)
    with memory_cap():
        err = cli_error(capsys, main, [f"model.path={path}"])
    what = "a FIFO" if kind == "fifo" else "a symbolic link"
    assert f"missing or damaged: trainer_state.json ({what}, not a regular file)" in err


def _eval_set(files, *extra):
    cfg = load_config(None, [f"eval.files=[{','.join(str(f) for f in files)}]", *extra])
    return load_eval_set(cfg, char_tokenizer())


def test_bad_files(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt": "1+2=", "answer": "3", "data_source": "addition"}) + "\n")
    assert _eval_set([good])[0]["answer"] == "3"

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(EvalError, match="empty.jsonl is empty"):
        _eval_set([good, empty])
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    with pytest.raises(EvalError, match="blank.jsonl: the file is empty"):
        _eval_set([blank])
    with pytest.raises(EvalError, match="missing.jsonl: no such file"):
        _eval_set([tmp_path / "missing.jsonl"])

    cols = tmp_path / "cols.jsonl"
    cols.write_text(json.dumps({"prompt": "1+2=", "answer": "3"}) + "\n" + json.dumps({"question_text": "x"}) + "\n")
    with pytest.raises(EvalError, match=r"cols.jsonl:2: a record needs `prompt` and `answer`.*question_text"):
        _eval_set([cols])

    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "1" * 40, "answer": "3"}) + "\n")
    with pytest.raises(EvalError, match="data.max_prompt_length=16"):
        _eval_set([long])
    with pytest.warns(UserWarning, match="dropped 1 prompts"):
        assert len(_eval_set([good, long])) == 1


def test_parquet_without_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad_pq = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"problem_text": ["1+1="], "solution": ["2"]}), bad_pq)
    with pytest.raises(EvalError, match=r"bad.parquet: a records file needs a prompt column.*problem_text"):
        _eval_set([bad_pq])


def test_no_files_needs_the_embedded_model(tmp_path):
    class OtherTokenizer:
        def get_vocab(self):
            return {"a": 0}

    with pytest.raises(ConfigError, match="eval.files is empty"):
        load_eval_set(load_config(None, []), OtherTokenizer())
    val = load_eval_set(load_config(None, ["data.val_size=5"]), char_tokenizer())
    assert len(val) == 5 and all(r["data_source"] == "addition" for r in val)


def test_model_directory_without_weights_is_refused_before_ray(tmp_path, capsys, monkeypatch):
    from reasonrl_fast.eval import generate
    from reasonrl_fast.eval.__main__ import main

    def no_ray(*a, **k):
        raise AssertionError("eval reached Ray with a directory it cannot load")

    monkeypatch.setattr(generate, "generate_all", no_ray)
    path = model_dir(tmp_path / "m", "qwen2", weights=False)
    err = cli_error(capsys, main, [f"model.path={path}", f"eval.output_dir={tmp_path / 'out'}"])
    assert "the directory has no weights" in err and path in err


def _target(tmp_path, rows, seed=0):
    d = tmp_path / "target"
    d.mkdir(exist_ok=True)
    (d / "samples.jsonl").write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"seed": seed}))
    return str(d)


def _row(i, prompt, key, acc=True):
    return {"prompt_index": i, "prompt": prompt, "response": f"x \\boxed{{{key}}}", "answer": key, "key": key,
            "acc": acc}


def test_a_target_is_counted_per_prompt_and_bad_ones_are_named(tmp_path):
    from reasonrl_fast.eval.run import load_target

    recs = [{"prompt": "split 57:"}, {"prompt": "split 64:"}]
    rows = [_row(0, "split 57:", "23+34"), _row(0, "split 57:", "23+34"), _row(0, "split 57:", "9+9", acc=False),
            _row(1, "split 64:", "32+32")]
    assert load_target(_target(tmp_path, rows), recs, 1) == [{"23+34": 2}, {"32+32": 1}]
    assert load_target(_target(tmp_path, [*rows[:2], "", *rows[2:], " "]), recs, 1) == [{"23+34": 2}, {"32+32": 1}]
    # rows written before the key field: the boxed answer with its spaces removed
    old = [{k: v for k, v in r.items() if k != "key"} | {"answer": r["answer"].replace("+", " + ")} for r in rows]
    assert load_target(_target(tmp_path, old), recs, 1) == [{"23+34": 2}, {"32+32": 1}]
    with pytest.raises(EvalError, match=r"eval.target=.*sampled with eval.seed=0 too: set another eval.seed"):
        load_target(_target(tmp_path, rows), recs, 0)
    with pytest.raises(EvalError, match=r"eval.target='.*nowhere'.*no .*samples.jsonl"):
        load_target(str(tmp_path / "nowhere"), recs, 1)
    with pytest.raises(EvalError, match=r"prompt 1 is 'split 64:' here but 'split 65:' there"):
        load_target(_target(tmp_path, [*rows[:3], _row(1, "split 65:", "32+33")]), recs, 1)
    with pytest.raises(EvalError, match=r"no samples of prompt 1 \(1 prompts there, 2 here\)"):
        load_target(_target(tmp_path, rows[:3]), recs, 1)
    with pytest.raises(EvalError, match=r"line 2 has prompt_index 7, but this eval has 2 prompts"):
        load_target(_target(tmp_path, [rows[0], _row(7, "split 57:", "1+56")]), recs, 1)
    with pytest.raises(EvalError, match=r"line 1 is not a samples.jsonl row of the eval command"):
        load_target(_target(tmp_path, [json.dumps({"prompt": "split 57:"})]), recs, 1)
    for bad, says in (("{not json", "not valid JSON"), (json.dumps([1, 2]), "expected a JSON object"),
                      ("[" * 100_000, "not valid JSON \\(nested too deeply\\)")):
        with pytest.raises(EvalError, match=rf"eval.target=.*samples.jsonl:1: {says}"):
            load_target(_target(tmp_path, [bad]), recs, 1)
    (tmp_path / "target" / "samples.jsonl").write_bytes(b"\xff\xfe\n")
    with pytest.raises(EvalError, match=r"eval.target=.*samples.jsonl: not a UTF-8 text file"):
        load_target(str(tmp_path / "target"), recs, 1)
    # a summary.json that is no JSON object (nested too deeply, say) leaves the seed unknown
    target = _target(tmp_path, rows)
    (tmp_path / "target" / "summary.json").write_text("[" * 100_000)
    assert load_target(target, recs, 0) == [{"23+34": 2}, {"32+32": 1}]


def test_a_target_that_is_the_eval_s_own_output_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    """The eval writes samples.jsonl into eval.output_dir: a target there, under any name, would
    be read and then overwritten. Refused first, before the model is even looked at."""
    from reasonrl_fast.eval.__main__ import main
    from reasonrl_fast.eval.run import check_target

    target = _target(tmp_path, [_row(0, "split 57:", "23+34")])
    before = (tmp_path / "target" / "samples.jsonl").read_bytes()
    os.symlink(target, tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    for given, out in [(target, target), (f"{target}/samples.jsonl", target), ("target", f"{target}/."),
                       (str(tmp_path / "link"), target), ("link/samples.jsonl", "target")]:
        with pytest.raises(EvalError, match=r"is this eval's own output .* write to another eval.output_dir"):
            check_target(given, out)
        with pytest.raises(SystemExit) as e:
            main([f"eval.target={given}", f"eval.output_dir={out}", "model.path=/nonexistent"])
        assert e.value.code == 2 and "own output" in capsys.readouterr().err
    assert (tmp_path / "target" / "samples.jsonl").read_bytes() == before
    check_target(target, str(tmp_path / "other"))  # another output directory is fine
    check_target(str(tmp_path / "other" / "samples.jsonl"), target)  # and so is another file
