"""The embedded GenRM task (`data.task=genrm`): judge a solution of the addition task, answering
with the index of its earliest wrong step, or -1 (docs/math.md §FAPO rewards).

Each record is built from one addition problem and one demonstration of the addition warm start
(`sft_example`, with its slips and flaws): some solutions are right, some forget a carry (a wrong
answer), some miswrite a column while the answer stays right (a flawed positive). The prompt is
exactly what FAPO's client sends about that solution on the embedded task (`tasks.genrm_request`
rendered with the compact template), so a GenRM trained here can serve a FAPO run.
"""

from __future__ import annotations

import random

from reasonrl_fast.data.records import problem_text
from reasonrl_fast.errors import ConfigError
from reasonrl_fast.protocol import render, step_verdict
from reasonrl_fast.tasks.addition import flawed_step, make_prompt, response_steps, sample_operands, sft_example
from reasonrl_fast.tasks.base import Task

SOURCE = "genrm_addition"
TEMPLATE = "compact"  # the embedded model's rendering (the full FAPO instruction does not fit)
MAX_TRIES = 200


def judgment(a: int, b: int, digits: int, response: str) -> dict:
    """The GenRM record about `response` to a + b: the compact prompt, the true earliest wrong
    step as a string ("-1": none) and extra_info {problem, answer, steps}."""
    item = {"prompt": make_prompt(a, b), "answer": str(a + b), "data_source": "addition"}
    problem, answer, steps = problem_text(item), str(item["answer"]), response_steps(response)
    truth = flawed_step(problem, response)
    return {"prompt": render(TEMPLATE, problem, answer, steps), "answer": str(truth),
            "data_source": SOURCE, "ability": "genrm",
            "extra_info": {"problem": problem, "answer": answer, "steps": steps}}


def sample_judgment(rng: random.Random, digits: int, carry_frac: float, slip_prob: float,
                    flaw_prob: float) -> dict:
    """One record; its class (flawless or not) is a fair coin, so about half the truths are -1
    whatever the slip and flaw rates (solutions are redrawn until one of that class comes)."""
    want_clean = rng.random() < 0.5
    for _ in range(MAX_TRIES):
        a, b = sample_operands(rng, digits, carry_frac)
        rec = judgment(a, b, digits, sft_example(a, b, digits, slip_prob, rng, flaw_prob))
        if (rec["answer"] == "-1") == want_clean:
            return rec
    kind = "flawless" if want_clean else "flawed"
    raise ValueError(f"data.task=genrm: no {kind} solution in {MAX_TRIES} draws; with data.carry_frac="
                     f"{carry_frac}, data.carry_slip_prob={slip_prob} and data.flaw_prob={flaw_prob} "
                     f"both kinds must be possible")


def genrm_split(n: int, digits: int, seed: int, carry_frac: float = 0.75, slip_prob: float = 0.5,
                flaw_prob: float = 0.4) -> list[dict]:
    """`n` GenRM records from a seeded generator."""
    rng = random.Random(seed)
    return [sample_judgment(rng, digits, carry_frac, slip_prob, flaw_prob) for _ in range(n)]


def verdict_demo(n_steps: int, truth: int) -> str:
    """The demonstration of a right verdict: a mark per step checked ('ok', then 'bad' at the
    earliest wrong one, where the check stops), then the index in \\boxed{}: 'ok,bad \\boxed{1}',
    'ok,ok \\boxed{-1}'. The marks let the model check one step per token before it counts."""
    marks = ["ok"] * (n_steps if truth == -1 else truth) + ([] if truth == -1 else ["bad"])
    return ",".join(marks) + f" \\boxed{{{truth}}}"


def demonstration(rng: random.Random, d) -> tuple[str, str]:
    """(prompt, response) of one supervised example of the warm start."""
    rec = sample_judgment(rng, d.digits, d.carry_frac, d.carry_slip_prob, d.flaw_prob)
    return rec["prompt"], verdict_demo(len(rec["extra_info"]["steps"]), int(rec["answer"]))


def prompt_budget(digits: int) -> int:
    """Characters (= tokens of the embedded tokenizer) of the longest compact prompt:
    'a+b=' (2d + 2), the answer (<= d + 1), and d steps of at most 'x+y+1=zz' (8) with their
    separators (d + 1)."""
    return 2 * digits + 2 + digits + 1 + 9 * digits + 1


def verdict_budget(digits: int) -> int:
    """Tokens of the longest demonstrated verdict with its end token: 'ok,...,ok \\boxed{-1}'
    (3d - 1 + 11) or 'ok,...,bad \\boxed{k}' (3d + 10), and EOS."""
    return 3 * digits + 10 + 1


def class_accuracy(items: list[dict], texts: list[str], acc: list[bool]) -> dict:
    """The GenRM judgments' accuracy ({} when no item is a GenRM record): step-index accuracy by
    class, val/accuracy_no_error on solutions whose truth is -1 and val/accuracy_flawed on the
    others; and val/class_accuracy, the share whose verdict says flawed or clean as the truth does
    (an unreadable verdict counts wrong), which is the `acc` FAPO's GenRM training reports (its
    val/accuracy is the exact step index)."""
    out = {}
    for name, flawed in (("val/accuracy_no_error", False), ("val/accuracy_flawed", True)):
        hits = [a for it, a in zip(items, acc)
                if it.get("ability") == "genrm" and (str(it["answer"]) != "-1") == flawed]
        if hits:
            out[name] = sum(hits) / len(hits)
    kinds = [_same_class(it, text) for it, text in zip(items, texts) if it.get("ability") == "genrm"]
    if kinds:
        out["val/class_accuracy"] = sum(kinds) / len(kinds)
    return out


def _same_class(record: dict, text: str) -> bool:
    steps = (record.get("extra_info") or {}).get("steps") or []
    verdict = step_verdict(text, len(steps))
    return verdict is not None and (verdict == -1) == (str(record["answer"]) == "-1")


def check_config(cfg) -> None:
    """The embedded GenRM task's prompts and verdicts must fit: a longer prompt would be dropped
    (biasing the judgments kept), a shorter response cut before its box."""
    d = cfg.data.digits
    need = {"data.max_prompt_length": (cfg.data.max_prompt_length, prompt_budget(d)),
            "rollout.max_new_tokens": (cfg.rollout.max_new_tokens, verdict_budget(d))}
    for key, (have, n) in need.items():
        if have < n:
            raise ConfigError(f"{key}={have}: data.task=genrm with data.digits={d} needs >= {n}")
    if cfg.embedded_model:  # the embedded model's context is known now (a real model's: preflight.py)
        from reasonrl_fast.layout.shape import check_context
        from reasonrl_fast.models.tiny import TINY_SOURCE, tiny_context

        check_context(cfg, {"max_position_embeddings": tiny_context(cfg.model)}, TINY_SOURCE)


class GenRM(Task):
    name, source, scorer = "genrm", SOURCE, "genrm"

    def sft_key(self, d) -> tuple:
        return ("genrm",)

    def split(self, d, n: int, seed: int, part: str = "train") -> list[dict]:  # train and val: draws alike
        return genrm_split(n, d.digits, seed, d.carry_frac, d.carry_slip_prob, d.flaw_prob)

    def demonstration(self, rng: random.Random, d) -> tuple[str, str]:
        return demonstration(rng, d)

    def val_metrics(self, items: list[dict], texts: list[str], acc: list[bool]) -> dict:
        return class_accuracy(items, texts, acc)

    def check_config(self, cfg) -> None:
        check_config(cfg)
