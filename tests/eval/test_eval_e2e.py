"""End to end: evaluate the session's shared run (the tiny FlowRL model, trained briefly on two CPU
Ray workers) from its checkpoint directly (two workers) and, merged, from a jsonl file of the same
prompts (one worker); the two evals agree exactly, and agree with the trainer's last
val/accuracy within two standard errors."""

import json
import math
import shutil
import subprocess
import sys

import pytest

from reasonrl_fast.models.tiny import char_tokenizer
from reasonrl_fast.config import load_config
from reasonrl_fast.runtime.datasets import load_datasets
from tests.helpers.train import ROOT, SHARED, SHARED_VAL, SHARED_VAL_N, TINY, read_metrics, repo_env, sft_cache

VAL, VAL_N = SHARED_VAL, SHARED_VAL_N
# the trainer's validation settings (rollout.top_p is 1.0 by default)
AT_VAL = [f"eval.n={VAL_N}", "eval.k=[1,2,4]", "eval.temperature=1.0", "eval.top_p=1.0"]


@pytest.fixture
def run_eval(trained_run, tmp_path):
    def run(args, check=True):
        cmd = [sys.executable, "-m", "reasonrl_fast.eval", *TINY, *SHARED, *AT_VAL,
               f"sft.cache_dir={sft_cache(tmp_path)}", *args]
        p = subprocess.run(cmd, cwd=ROOT, env=repo_env(), capture_output=True, text=True, timeout=600)
        if check and p.returncode != 0:
            raise AssertionError(f"eval failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
        return p
    return run


def _metrics(summary):
    return {k: summary[k] for k in ("per_source", "overall", "overall_micro")}


def test_eval_checkpoint_and_merged_agree_with_training(trained_run, run_eval, tmp_path):
    val_acc = read_metrics(trained_run.dir)[-1]["val/accuracy"]
    ckpt = trained_run.checkpoint

    # (a) the checkpoint itself, on the embedded validation split
    out_a = tmp_path / "eval_a"
    p = run_eval([f"model.path={ckpt}", f"eval.output_dir={out_a}"])
    a = json.loads((out_a / "summary.json").read_text())
    assert "mean@4" in p.stdout and "overall (macro)" in p.stdout  # the printed table
    assert "on 2 CPU worker(s)" in p.stdout
    src = a["per_source"]["addition"]
    assert src["prompts"] == VAL and a["n"] == VAL_N and a["k"] == [1, 2, 4]
    assert src["pass@1"] == src["mean@4"] and src["pass@1"] <= src["pass@2"] <= src["pass@4"]
    assert a["overall"] == a["overall_micro"] == src  # one source: macro = micro
    samples = [json.loads(x) for x in (out_a / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == VAL * VAL_N
    assert math.isclose(sum(s["acc"] for s in samples) / len(samples), src["mean@4"])
    assert [s["sample"] for s in samples[:VAL_N]] == list(range(VAL_N))

    # agreement with the trainer's last validation (same weights, same settings, other seeds):
    # both are estimates with about the eval's se, so their difference has sqrt(2) x that
    se = src["se@4"]
    print(f"trainer val/accuracy {val_acc:.4f}, eval mean@4 {src['mean@4']:.4f} +- {se:.4f}")
    assert 0.1 < src["mean@4"] < 0.9, "the warm start should leave room on both sides"
    assert abs(src["mean@4"] - val_acc) <= 2 * math.sqrt(2) * se, (val_acc, src)

    # (b) merged, with the same prompts from a jsonl file, on one worker instead of two: the same
    # samples (a batch's seed depends on its position, not on the worker), so the same numbers
    merged = tmp_path / "merged"
    subprocess.run([sys.executable, "-m", "reasonrl_fast.merge", str(ckpt), str(merged)], cwd=ROOT,
                   check=True, capture_output=True, timeout=300)
    cfg = load_config(None, [*TINY, *SHARED])
    val = load_datasets(cfg, char_tokenizer())[1][0].records  # the one set: the embedded split
    data = tmp_path / "val.jsonl"
    data.write_text("".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"],
                                        "data_source": r["data_source"]}) + "\n" for r in val))
    out_b = tmp_path / "eval_b"
    p = run_eval([f"model.path={merged}", f"eval.files=[{data}]", f"eval.output_dir={out_b}",
                  "trainer.workers_per_node=1"])
    assert "on 1 CPU worker(s)" in p.stdout
    b = json.loads((out_b / "summary.json").read_text())
    assert _metrics(b) == _metrics(a)
    assert (out_b / "samples.jsonl").read_text() == (out_a / "samples.jsonl").read_text()

    # an incomplete checkpoint: an error naming the missing file, before anything starts
    broken = tmp_path / "checkpoint-2"
    shutil.copytree(ckpt, broken)
    (broken / "rng_rank1.safetensors").unlink()
    p = run_eval([f"model.path={broken}", f"eval.output_dir={tmp_path / 'eval_c'}"], check=False)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "not a complete, undamaged checkpoint" in p.stderr and "rng_rank1.safetensors" in p.stderr

    # (d) the same model sampled again with another seed against (a)'s samples, where the even
    # prompts' right answers are renamed (an addition has one right answer: this gives the
    # distances something to measure): computed here from the two samples.jsonl files
    out_t = tmp_path / "target"
    shutil.copytree(out_a, out_t)
    rows = [json.loads(x) for x in (out_t / "samples.jsonl").read_text().splitlines()]
    for row in rows:
        row["key"] = row["key"] + "0" * (row["prompt_index"] % 2 == 0 and row["sample"] % 2 == 0) if row["key"] else None
    (out_t / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out_d = tmp_path / "eval_d"
    p = run_eval([f"model.path={merged}", f"eval.output_dir={out_d}", "eval.seed=1", f"eval.target={out_t}"])
    d = json.loads((out_d / "summary.json").read_text())["overall"]
    assert "tv@4" in p.stdout and "kl@4" in p.stdout and d["mean@4"] != a["overall"]["mean@4"]

    def right(out):
        counts = {}
        for row in map(json.loads, (out / "samples.jsonl").read_text().splitlines()):
            c = counts.setdefault(row["prompt_index"], {})
            if row["acc"]:
                c[row["key"]] = c.get(row["key"], 0) + 1
        return counts

    mine, theirs = right(out_d), right(out_t)
    both = [i for i in mine if mine[i] and theirs[i]]
    tv = [sum(abs(mine[i].get(k, 0) / sum(mine[i].values()) - theirs[i].get(k, 0) / sum(theirs[i].values()))
              for k in mine[i].keys() | theirs[i].keys()) / 2 for i in both]
    kl = []
    for i in both:
        keys = mine[i].keys() | theirs[i].keys()
        q = {k: (theirs[i].get(k, 0) + 0.5) / (sum(theirs[i].values()) + 0.5 * len(keys)) for k in keys}
        m = {k: (mine[i].get(k, 0) + 0.5) / (sum(mine[i].values()) + 0.5 * len(keys)) for k in keys}
        kl.append(sum(q[k] * math.log(q[k] / m[k]) for k in keys))
    print(f"tv@4 {d['tv@4']} kl@4 {d['kl@4']} over {len(both)} prompts")
    assert d["target_prompts"] == len(both) > 0 and d["tv@4"] == pytest.approx(sum(tv) / len(tv), abs=1e-12)
    assert d["kl@4"] == pytest.approx(sum(kl) / len(kl), abs=1e-12) and d["tv@4"] > 0.1 and d["tv_se@4"] > 0
    p = run_eval([f"model.path={merged}", f"eval.output_dir={tmp_path / 'eval_e'}", f"eval.target={out_a}"],
                 check=False)  # (a)'s seed: refused before sampling
    assert p.returncode != 0 and "sampled with eval.seed=0 too" in p.stderr and "Traceback" not in p.stderr
