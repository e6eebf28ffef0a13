"""DAPO's dynamic sampling in real runs of the embedded model (data.filter_groups=acc): every
step trains on exactly data.prompts_per_step mixed groups, after as many generation rounds as
it takes, with GRPO, FlowRL and FAPO, micro-batches and packing, in both placements; the round
limit ends a run with one line. The reward is a fixed coin per response
(tests/helpers/faulty_rewards.py `right_by_checksum`), so groups of 2 come out mixed or alike by
chance: a mixed group is exactly half right."""

import pytest

from tests.helpers.train import comparable, read_metrics

COIN = ["data.reward_fn=tests.helpers.faulty_rewards:right_by_checksum", "data.filter_groups=acc",
        "trainer.val_every=0", "trainer.steps=3"]


@pytest.mark.parametrize("algo, extra", [
    ("grpo", ["data.gen_prompts_per_step=6", "optim.micro_batch_tokens=40"]),  # several micro-batches
    ("flowrl", ["trainer.placement=split", "trainer.workers_per_node=1", "rollout.workers=1",
                "trainer.max_staleness=1"]),
    ("fapo", []),
], ids=["grpo-micro", "flowrl-split-stale", "fapo"])
def test_each_step_trains_on_mixed_groups_only_after_the_rounds_it_takes(train, tmp_path, algo, extra):
    out = tmp_path / "run"
    train([*COIN, f"algo={algo}", *extra, f"trainer.output_dir={out}"], tmp_path, timeout=300)
    rows = read_metrics(out)
    gen = 6 if "data.gen_prompts_per_step=6" in extra else 4
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["accuracy/mean"] == 0.5, r  # 4 mixed groups of 2
        assert r["rollout/groups_generated"] == gen * r["rollout/gen_rounds"]
        assert r["rollout/groups_kept"] >= 4
        assert r["rollout/generated_per_trained"] == r["rollout/groups_generated"] / 4
        assert 0 < r["accuracy/generated_mean"] < 1
    assert max(r["rollout/gen_rounds"] for r in rows) > 1  # a step that took extra rounds
    assert sum(r["rollout/groups_kept"] for r in rows) < sum(r["rollout/groups_generated"] for r in rows)
    if algo == "grpo":
        assert all(r["train/micro_batches"] > 1 for r in rows)
    if algo == "fapo":  # only the kept groups' right answers are judged, one a group (a round's
        # surplus ones too: they are judged as they are scored, before the round is complete)
        assert all(r["fapo/sent"] == r["rollout/groups_kept"] for r in rows), rows
    if "trainer.placement=split" in extra:  # the staleness of what trains: step 1's is 0
        assert [r["rollout/staleness_max"] for r in rows][0] == 0
        assert all(0 <= r["rollout/staleness_mean"] <= r["rollout/staleness_max"] <= 1 for r in rows)


def test_a_step_that_reaches_the_round_limit_ends_the_run_with_one_line(train, tmp_path):
    """Every answer right: every group is alike, and none is ever kept."""
    out = tmp_path / "run"
    p = train(["data.reward_fn=tests.helpers.faulty_rewards:always_right", "data.filter_groups=acc",
               "data.max_gen_rounds=2", "trainer.val_every=0", f"trainer.output_dir={out}"], tmp_path,
              check=False, timeout=300)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-3000:]
    line = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert line == ["error: step 1: 0 of data.prompts_per_step=4 groups kept after data.max_gen_rounds=2 rounds of "
                    "4 prompts (data.filter_groups=acc drops groups whose samples all score alike): raise "
                    "data.gen_prompts_per_step or data.max_gen_rounds (0: no limit), or train on prompts the "
                    "policy gets right only sometimes"], p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    assert not (out / "metrics.jsonl").exists() or read_metrics(out) == []


def test_a_run_killed_mid_step_resumes_to_the_same_metrics(train, tmp_path):
    """Dynamic sampling draws a step's prompts in as many rounds as it takes, so where the next
    step's prompts start depends on the steps before: a run SIGKILLed at step 3's first reward
    call (after checkpoint-2) and resumed logs exactly the uninterrupted run's metrics, the
    rounds and groups of each step included."""
    args = ["data.reward_fn=tests.helpers.faulty_rewards:coin_then_kills_the_driver", "data.filter_groups=acc",
            "trainer.val_every=0", "trainer.steps=4", "trainer.save_every=2", "trainer.keep_checkpoints=0",
            "reward.num_workers=1"]  # one worker counts every call of the run
    full = tmp_path / "full"
    train([*args, f"trainer.output_dir={full}"], tmp_path, timeout=300)
    ref = read_metrics(full)
    assert [r["step"] for r in ref] == [1, 2, 3, 4] and max(r["rollout/gen_rounds"] for r in ref) > 1, ref
    # every sample generated in steps 1-2 is scored once: the next call is step 3's first
    calls = sum(r["rollout/groups_generated"] for r in ref[:2]) * 2  # rollout.n = 2
    killed = tmp_path / "killed"
    p = train([*args, f"trainer.output_dir={killed}"], tmp_path, check=False, timeout=300,
              env_extra={"REASONRL_KILL_AT_CALL": str(calls + 1)})
    assert p.returncode == -9, (p.returncode, p.stderr[-2000:])
    assert [r["step"] for r in read_metrics(killed)] == [1, 2] and (killed / "checkpoint-2").is_dir()
    p = train([*args, f"trainer.output_dir={killed}", "trainer.resume=auto"], tmp_path, timeout=300)
    assert "checkpoint-2 (step 2)" in p.stdout
    got = read_metrics(killed)
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    for a, b in zip(ref, got):
        assert comparable(a) == comparable(b), (a["step"], comparable(a), comparable(b))
