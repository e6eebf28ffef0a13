"""Multi-turn steps in a real run: `python -m reasonrl_fast.train data.task=multiply
rollout.tools=[calculator]` on Ray, each algorithm a step or two on the tiny model whose warm start
calls the calculator on half its demonstrations: calls are made and answered (the tool worker
processes of each trainer worker), the policy's share of the tokens is below 1, every logged
name is documented, and nothing is left running."""

import pytest

from reasonrl_fast.util import read_metrics
from tests.helpers.metric_names import documented, problems
from tests.helpers.procs import Watch, reaped
from tests.helpers.train import popen_train

TOOLS = ["data.task=multiply", "rollout.tools=[calculator]", "rollout.max_new_tokens=72",
         "data.multiply.call_frac=0.5", "sft.steps=300", "sft.batch_size=32", "model.hidden_size=64",
         "model.intermediate_size=128", "trainer.steps=2", "trainer.val_every=2", "data.val_size=16"]


@pytest.mark.e2e
@pytest.mark.parametrize("algo", ["grpo", "flowrl", "fapo"])
def test_a_multi_turn_step_of_each_algorithm(tmp_path, algo):
    """GRPO's run calls a calculator of one's own, named by its path (tests/helpers/tool_fns.py:
    one function), which logs its calls."""
    out, log = tmp_path / "run", tmp_path / "calls.log"
    tools = ["rollout.tools=['tests.helpers.tool_fns:calculator']"] if algo == "grpo" else []
    with reaped(popen_train([*TOOLS, *tools, f"algo={algo}", f"trainer.output_dir={out}"], tmp_path,
                            RRL_TOOL_LOG=str(log))) as p:
        watch = Watch(p)
        stdout, stderr = p.communicate(timeout=600)
    assert p.returncode == 0, stdout[-2000:] + stderr[-4000:]
    assert watch.left_behind() == []  # the tool workers went with their trainer workers
    rows = read_metrics(out)
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 2 and problems(set().union(*rows), documented()) == []
    assert max(r["tool/calls_per_sample"] for r in steps) > 0, steps
    assert min(r["rollout/policy_token_frac"] for r in steps) < 1.0
    assert all(r["tool/timeout_frac"] == 0 for r in steps)
    assert "val/multiply_tool_call_rate" in rows[-1]
    if algo == "grpo":  # the run's calls went to the tool of one's own
        calls = log.read_text().splitlines()
        assert calls and all("*" in c for c in calls), calls
