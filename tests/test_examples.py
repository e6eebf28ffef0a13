"""examples/pipeline.sh end to end with tiny settings: prepare -> train -> merge -> eval -> plot,
on the embedded task and on a verl-format parquet file, each stage reading what the last wrote
(about 1.5-2.5 minutes on the 2-core machine)."""

import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ("model.hidden_size=32 model.intermediate_size=64 model.num_heads=2 sft.steps=5 sft.batch_size=8 "
        "data.prompts_per_step=4 optim.mini_batch_prompts=4 rollout.n=2 data.val_size=8")


def test_pipeline(tmp_path):
    out = tmp_path / "pipeline"
    env = dict(os.environ, OUT=str(out), STEPS="2", EXTRA=f"{TINY} sft.cache_dir={tmp_path / 'sft'}",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(["bash", os.path.join(ROOT, "examples", "pipeline.sh")], env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    addition = json.load(open(out / "eval-addition" / "summary.json"))
    smoke = json.load(open(out / "eval-smoke" / "summary.json"))
    assert addition["per_source"]["addition"]["prompts"] == 8 and "pass@4" in addition["overall"]
    assert smoke["per_source"]["smoke_math"]["prompts"] > 0 and "maj@2" in smoke["overall"]
    samples = [json.loads(x) for x in open(out / "eval-smoke" / "samples.jsonl")]
    assert len(samples) == 2 * smoke["per_source"]["smoke_math"]["prompts"]
    assert (out / "smoke-run" / "metrics.jsonl").exists() and (out / "addition-hf" / "config.json").exists()
    with open(out / "curves.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
