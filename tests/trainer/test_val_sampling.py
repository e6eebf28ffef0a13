"""Validation samples at rollout.val_top_p (top_p when unset), training at rollout.top_p: the
loop's `validate` through the cluster's fan-out and the worker's `generate` down to the engine,
with Ray's remote calls run in place and an engine that records what it was asked."""

import pytest
from tests.helpers.in_place import in_place_cluster

from reasonrl_fast.config import load_config
from reasonrl_fast.models.tiny import char_tokenizer
from reasonrl_fast.rewards.score import default_compute_score
from reasonrl_fast.rollout.base import Engine, Samples
from reasonrl_fast.runtime.datasets import val_set
from reasonrl_fast.trainer.loop import rollout_and_score, validate


class RecordingEngine(Engine):
    answer = r"so \boxed{2}"

    def __init__(self, tok):
        self.tok, self.calls = tok, []

    def generate(self, prompts, n, temperature, top_p, max_new_tokens, seeds):
        self.calls.append({"temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens})
        ids = self.tok(self.answer, add_special_tokens=False)["input_ids"]
        return Samples([list(ids) for _ in range(len(prompts) * n)], [[0.0] * len(ids)] * (len(prompts) * n))


class Pool:
    last_latencies: list = []

    def score(self, samples):
        return ([default_compute_score(*s) for s in samples], {"reward/timeouts": 0, "reward/errors": 0})


def _cluster(cfg, monkeypatch, world=2):
    tok = char_tokenizer()
    cluster, engines = in_place_cluster(cfg, lambda: RecordingEngine(tok), monkeypatch, world)
    return cluster, tok, engines


VAL = [{"prompt": f"{i}+{2 - i}=", "answer": "2", "data_source": "math"} for i in range(3)]


@pytest.mark.parametrize("val_top_p", [None, 0.7])
def test_validation_samples_at_val_top_p(monkeypatch, val_top_p):
    overrides = ["rollout.top_p=0.9", "rollout.val_temperature=0.6", "rollout.val_n=2",
                 "rollout.max_new_tokens=20"]
    if val_top_p is not None:
        overrides.append(f"rollout.val_top_p={val_top_p}")
    cfg = load_config(None, overrides)
    cluster, tok, engines = _cluster(cfg, monkeypatch)
    row = validate(cfg, cluster, tok, [val_set(cfg, VAL)], Pool(), step=0)
    assert row["val/accuracy"] == 1.0
    want = {"temperature": 0.6, "top_p": 0.9 if val_top_p is None else val_top_p, "max_new_tokens": 20}
    assert [e.calls for e in engines] == [[want], [want]]


def test_training_samples_keep_top_p(monkeypatch):
    cfg = load_config(None, ["rollout.top_p=0.9", "rollout.val_top_p=0.5", "rollout.temperature=1.1"])
    cluster, tok, engines = _cluster(cfg, monkeypatch)
    r = cfg.rollout
    rollout_and_score(cluster, Pool(), tok, VAL, 2, r.temperature, r.top_p, 1, keep=True)
    assert [e.calls[0]["top_p"] for e in engines] == [0.9, 0.9]
    assert [e.calls[0]["temperature"] for e in engines] == [1.1, 1.1]


def test_each_validation_set_samples_at_its_own_settings_and_the_accuracy_is_their_macro_average(monkeypatch):
    """Set a (3 prompts, all answered right, n=2) at the validation defaults; set b (1 prompt,
    answered wrong, n=3) at its own temperature and top-p. val/accuracy is the mean of the two
    sets' mean@n (0.5), not the pooled share of right samples (6/9)."""
    cfg = load_config(None, ["rollout.val_temperature=0.6", "rollout.val_top_p=0.7", "rollout.max_new_tokens=20",
                             "data.val_sets=[{name: a, n: 2}, {name: b, n: 3, temperature: 0.0, top_p: 0.5}]"])
    cluster, tok, engines = _cluster(cfg, monkeypatch)
    wrong = [{"prompt": "1+2=", "answer": "3", "data_source": "math"}]
    sets = [val_set(cfg, VAL, cfg.data.val_sets[0]), val_set(cfg, wrong, cfg.data.val_sets[1])]
    row = validate(cfg, cluster, tok, sets, Pool(), step=0)
    calls = [c for e in engines for c in e.calls]
    assert {(c["temperature"], c["top_p"]) for c in calls} == {(0.6, 0.7), (0.0, 0.5)}
    assert row["val/a/mean@2"] == 1.0 and row["val/a/pass@2"] == 1.0
    assert row["val/b/mean@3"] == 0.0 and row["val/b/pass@3"] == 0.0
    assert row["val/accuracy"] == 0.5
    assert "val/pass@2" not in row and "val/b/maj@3" not in row  # the one-set names; maj only when asked


def test_a_sets_pass_at_k_and_maj_are_evals_estimators():
    """Two prompts of 4 samples: answers 2 3 3 3 (truth 2: one right, the majority wrong) and
    5 5 1 5 (truth 5: three right, the majority right)."""
    from reasonrl_fast.runtime.datasets import ValSet
    from reasonrl_fast.trainer.loop import set_metrics

    records = [{"prompt": "1+1=", "answer": "2", "data_source": "math"},
               {"prompt": "2+3=", "answer": "5", "data_source": "math"}]
    answers = ["2", "3", "3", "3", "5", "5", "1", "5"]
    texts = [rf"so \boxed{{{a}}}" for a in answers]
    acc = [a == r["answer"] for a, r in zip(answers, [records[0]] * 4 + [records[1]] * 4)]
    vs = ValSet("s", records, 4, [1, 2, 4], True, 1.0, 1.0)
    assert set_metrics(vs, texts, acc) == {"val/s/mean@4": 0.5, "val/s/pass@1": 0.5,
                                           "val/s/pass@2": (0.5 + 1.0) / 2,  # 1 - C(3,2)/C(4,2); 1 - 0
                                           "val/s/pass@4": 1.0, "val/s/maj@4": 0.5}


def test_a_sets_scorer_scores_its_records_whatever_their_data_source(monkeypatch):
    """An AIME answer boxed 150 characters before the end: the DAPO rule that aime* routes to
    reads the last 100 characters and misses it; the box verifier (FAPO's validation scorer)
    reads 300 and finds it. The same records and samples, two sets, two scorers."""
    monkeypatch.setattr(RecordingEngine, "answer", r"so \boxed{2}" + "." * 150)
    cfg = load_config(None, ["rollout.max_new_tokens=200",
                             "data.val_sets=[{name: routed, n: 2}, {name: boxed, n: 2, scorer: boxed}]"])
    cluster, tok, _ = _cluster(cfg, monkeypatch)
    aime = [{"prompt": f"{i}+{2 - i}=", "answer": "2", "data_source": "aime24"} for i in range(3)]
    row = validate(cfg, cluster, tok, [val_set(cfg, aime, v) for v in cfg.data.val_sets], Pool(), step=0)
    assert row["val/routed/mean@2"] == 0.0 and row["val/boxed/mean@2"] == 1.0
