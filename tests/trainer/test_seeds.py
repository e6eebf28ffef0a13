"""Sampling seeds in the trainer: each sample's seed comes from trainer.seed, the step and the
sample's index, so one seed gives the same samples at any worker count and two seeds give
different ones from the same model and prompts (the hf backend here;
tests/trainer/test_vllm_rollout.py runs the same check on the vllm one)."""

import collections
import json
import os

from reasonrl_fast.config import load_config
from reasonrl_fast.runtime.datasets import embedded_split
from reasonrl_fast.trainer.sft import sft_cache_path
from tests.helpers.train import TINY, sft_cache


def responses(train, tmp_path, name: str, *args: str, **kw) -> tuple[collections.Counter, str]:
    """The multiset of the responses of a one-step run (no validation), and its stdout."""
    path = tmp_path / f"{name}.jsonl"
    p = train(["trainer.steps=1", "trainer.val_every=0", f"trainer.output_dir={tmp_path / name}",
               "data.reward_fn=tests.helpers.faulty_rewards:records_responses", *args], tmp_path,
              env_extra={"REASONRL_RESPONSES": str(path)}, **kw)
    return collections.Counter(json.loads(line) for line in path.read_text().splitlines()), p.stdout


def check_seeds(train, tmp_path, *args: str, **kw) -> None:
    # Only the sampling seed may differ between the runs: the prompts come from a file (the
    # embedded split depends on trainer.seed) and the model from the first run's warm start.
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in embedded_split(load_config(None, ["data.digits=2"]).data,
                                                                        4, 7, "train")))
    args = (f"data.train_files=[{data}]", *args)
    two, out = responses(train, tmp_path, "two", "trainer.seed=1", "trainer.workers_per_node=2", *args, **kw)
    model = sft_cache_path(load_config(None, [*TINY, f"sft.cache_dir={sft_cache(tmp_path)}", *args,
                                              "trainer.seed=1"]))
    assert os.path.isfile(os.path.join(model, "config.json")), out[-2000:]
    args = (*args, f"model.path={model}")
    one, _ = responses(train, tmp_path, "one", "trainer.seed=1", "trainer.workers_per_node=1", *args, **kw)
    other, _ = responses(train, tmp_path, "other", "trainer.seed=2", "trainer.workers_per_node=2", *args, **kw)
    assert sum(two.values()) == 8 and len(two) > 1  # 4 prompts x 2 samples, not all alike
    assert one == two
    assert other != two


def test_one_seed_same_samples_at_one_and_two_workers_two_seeds_differ(train, tmp_path):
    check_seeds(train, tmp_path)


def test_every_stream_comes_from_derive_seed():
    """One rule for every seeded stream (util.py `derive_seed`): a sample's sampling seed is it
    (and still the hash it always was, so runs sample as before); streams of different purposes
    never meet, as `10**6 + step` for validation once met training's step 10**6."""
    import hashlib

    from reasonrl_fast.rollout import sample_seed
    from reasonrl_fast.util import SEED_BITS, derive_seed

    was = int.from_bytes(hashlib.blake2b(b"7/3/5", digest_size=8).digest(), "little") >> (64 - SEED_BITS)
    assert sample_seed(7, 3, 5) == derive_seed(7, 3, 5) == was
    assert sample_seed(7, "val/3", 0) != sample_seed(7, 10**6 + 3, 0)
    seeds = {derive_seed(7, *p) for p in [("data", "train"), ("data", "val"), ("shuffle", 0), ("shuffle", 1),
                                          ("warm start",), ("update", 1, 0), ("update", 1, 1), ("update", 2, 0)]}
    assert len(seeds) == 8 and all(0 <= s < 2**63 for s in seeds)
    assert derive_seed(7, "update", 1, 0) != derive_seed(8, "update", 1, 0)
