"""The eval command's work: resolve the model (a Hugging Face directory, or a run's checkpoint-N
merged into a temporary one), read the prompts, sample `eval.n` responses per prompt on Ray
workers, score them in the reward pool, and write summary.json and samples.jsonl."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import tempfile
import time

from reasonrl_fast.data.records import DataError, filter_long, jsonl_rows, encode_prompts, load_records
from reasonrl_fast.errors import ConfigError, UserError
from reasonrl_fast.eval.metrics import PromptResult, answer_key, summarize
from reasonrl_fast.eval.vote import majority
from reasonrl_fast.models.loading import check_weights, load_model_config, load_tokenizer
from reasonrl_fast.layout.shape import check_context
from reasonrl_fast.models.tiny import char_tokenizer
from reasonrl_fast.rewards.math import extract_boxed
from reasonrl_fast.rewards.pool import RewardPool
from reasonrl_fast.rewards.score import check_sandbox, load_reward_fn, scorer_for, scorer_kinds
from reasonrl_fast.rollout import get_rollout
from reasonrl_fast.runtime import checkpoint as ckpt
from reasonrl_fast.runtime.datasets import load_datasets, load_val_sets  # the embedded task's splits
from reasonrl_fast.runtime.merge import check_checkpoint, merge
from reasonrl_fast.util import loads_json, same_file


class EvalError(UserError, ValueError):
    """Bad eval input (model, files); the message names it."""


def ks_of(cfg) -> list[int]:
    return list(cfg.eval.k) or sorted({1, cfg.eval.n})


# ------------------------------------------------------------------------------------ model

@contextlib.contextmanager
def resolved_model(cfg, log=print):
    """The model directory to load: `model.path` itself, or, for a run's checkpoint-N
    (recognised by its trainer_state.json), a temporary merge of it (removed afterwards)."""
    path = cfg.model.path
    if not path:
        raise ConfigError("model.path is empty: give a Hugging Face model directory or a run's "
                          "checkpoint-N (the eval command does not train one)")
    if not os.path.isdir(path):
        raise EvalError(f"model.path={path!r}: no such directory")
    # lexists: a trainer_state.json that is a dangling link, a FIFO, ... still marks a checkpoint
    # (which then names it), rather than a model directory lacking config.json
    if not os.path.lexists(os.path.join(path, ckpt.STATE)):
        if not os.path.lexists(os.path.join(path, "config.json")):
            raise EvalError(not_a_model(path))
        yield path
        return
    check_checkpoint(path, cfg.trainer.trust_checkpoint, "trainer.trust_checkpoint=true", f"model.path={path!r}")

    tmp = tempfile.mkdtemp(prefix="reasonrl_eval_")
    try:
        log(f"[eval] merging {path} into {tmp}")
        merge(path, tmp, trust=True)  # checked just above
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_CHECKPOINT_FILES = ".metadata, __R_0.distcp shards, rng_rankR.safetensors and hf/"


def not_a_model(path: str) -> str:
    """Why `path` (neither trainer_state.json nor config.json) cannot be evaluated: named as the
    checkpoint it looks like (DCP's .metadata, a checkpoint-N folder) or as either kind."""
    want = (f"a run's checkpoint-N holds trainer_state.json (the list of its files with their sizes and "
            f"checksums), {_CHECKPOINT_FILES}; a Hugging Face model directory holds config.json")
    if os.path.lexists(os.path.join(path, ".metadata")) or ckpt.is_checkpoint_name(path):
        return (f"model.path={path!r}: a checkpoint without trainer_state.json (an unfinished or damaged "
                f"save; use another checkpoint-N of the run): {want}")
    return f"model.path={path!r}: neither trainer_state.json nor config.json: {want}"


def is_embedded_model(tokenizer) -> bool:
    """Whether the model is the embedded tiny one (its character tokenizer's vocabulary)."""
    return tokenizer.get_vocab() == char_tokenizer().get_vocab()


# ------------------------------------------------------------------------------------- data

def load_eval_set(cfg, tokenizer) -> list[dict]:
    """The records to evaluate: `eval.files`, or for an embedded-task model without files the
    embedded task's validation split as `data.*` and `trainer.seed` define it (the training
    run's config.yaml gives its own). Prompts over data.max_prompt_length are dropped (warned)."""
    files = cfg.eval.files
    if not files:
        if not is_embedded_model(tokenizer):
            raise ConfigError("eval.files is empty: give jsonl/parquet files (the embedded task's "
                              "validation split is only for the embedded model)")
        small = copy.deepcopy(cfg)
        small.data.train_files, small.data.val_files, small.data.val_sets, small.data.train_size = [], [], [], 1
        try:
            return load_datasets(small, tokenizer)[1][0].records
        except ValueError as e:
            raise EvalError(str(e)) from None
    records = []
    for path in files:
        if not os.path.isfile(path):
            raise EvalError(f"eval.files: {path}: no such file")
        if os.path.getsize(path) == 0:
            raise EvalError(f"eval.files: {path} is empty")
        try:
            rows = load_records(path)
        except ValueError as e:  # already names the file and row
            raise EvalError(f"eval.files: {e}") from None
        except Exception as e:  # noqa: BLE001 - e.g. a damaged parquet file
            raise EvalError(f"eval.files: {path}: cannot be read ({type(e).__name__}: {e})") from None
        records += rows
    check_sandbox(cfg, {r["data_source"] for r in records})
    try:
        return filter_long(records, tokenizer, cfg.data.max_prompt_length, "eval.files")
    except ValueError as e:  # nothing left: every prompt was too long
        raise EvalError(str(e)) from None


def target_file(path: str) -> str:
    """The samples.jsonl an eval.target names: the file itself, or the one in its directory."""
    return os.path.join(path, "samples.jsonl") if os.path.isdir(path) else path


def check_target(target: str, output_dir: str) -> None:
    """An EvalError when eval.target is what this eval writes (its output directory, or the
    samples.jsonl there, under any name: a link, a relative path): the eval would overwrite the
    samples it compares itself with."""
    if same_file(target, output_dir) or same_file(target_file(target), os.path.join(output_dir, "samples.jsonl")):
        raise EvalError(f"eval.target={target!r} is this eval's own output (eval.output_dir={output_dir!r}), "
                        f"which it would overwrite: write to another eval.output_dir")


def load_target(path: str, records: list[dict], seed: int) -> list[dict[str, int]]:
    """Each record's right answers (answer key -> count) in another eval's samples.jsonl (`path`,
    or its output directory), which must hold the same prompts in the same order and have been
    sampled with another eval.seed than `seed`."""
    at = f"eval.target={path!r}"
    file = target_file(path)
    if not os.path.isfile(file):
        raise EvalError(f"{at}: no {file} (give an eval's output directory or its samples.jsonl)")
    try:
        with open(os.path.join(os.path.dirname(file), "summary.json"), encoding="utf-8") as f:
            theirs = loads_json(f.read()).get("seed")
    except (OSError, ValueError, AttributeError):
        theirs = None  # a samples.jsonl without its summary (or with a damaged one): the seed is not known
    if theirs == seed:
        # the same seed draws the same random numbers: a model close to the target's would repeat
        # its samples, and the distance would read smaller than it is
        raise EvalError(f"{at} was sampled with eval.seed={seed} too: set another eval.seed, so the two "
                        f"sample sets are independent")
    counts: dict[int, dict[str, int]] = {}
    prompts: dict[int, object] = {}
    try:
        for line_no, row in jsonl_rows(file):  # not JSON, not UTF-8, nested too deeply: named there
            try:
                i, prompt, right = row["prompt_index"], row["prompt"], row["acc"] is True
                # rows written before the key was: the boxed answer (or code's response), spaces removed
                key = row["key"] if "key" in row else "".join((row["answer"] or row["response"]).split()) or None
            except (TypeError, KeyError, AttributeError):
                raise EvalError(f"{at}: {file} line {line_no} is not a samples.jsonl row of the eval "
                                f"command (prompt_index, prompt, response, answer, acc)") from None
            if type(i) is not int or not 0 <= i < len(records):
                raise EvalError(f"{at}: {file} line {line_no} has prompt_index {i!r}, but this eval has "
                                f"{len(records)} prompts: evaluate the same prompts on both sides")
            prompts.setdefault(i, prompt)
            c = counts.setdefault(i, {})
            if right and key is not None:
                c[key] = c.get(key, 0) + 1
    except DataError as e:
        raise EvalError(f"{at}: {e}") from None
    for i, rec in enumerate(records):
        if i not in prompts:
            raise EvalError(f"{at}: {file} has no samples of prompt {i} ({len(prompts)} prompts there, "
                            f"{len(records)} here): evaluate the same prompts on both sides")
        if prompts[i] != rec["prompt"]:
            raise EvalError(f"{at}: prompt {i} is {str(rec['prompt'])[:60]!r} here but "
                            f"{str(prompts[i])[:60]!r} there: evaluate the same prompts in the same order "
                            f"(the same eval.files, or the same data.* and trainer.seed for the embedded split)")
    return [counts[i] for i in range(len(records))]


# ------------------------------------------------------------------------------------ score

def score_all(cfg, records: list[dict], texts: list[str], n: int | None = None,
              score_as: str | None = None) -> tuple[list[dict], dict]:
    """The reward pool's {"score", "acc"} per response (`n` per record, in order; unset: eval.n),
    each scored as its record's data_source, or as `score_as` (a validation set's scorer)."""
    n, r = n or cfg.eval.n, cfg.reward
    samples = [(score_as or rec["data_source"], text, rec["answer"], rec.get("extra_info"))
               for i, rec in enumerate(records) for text in texts[i * n:(i + 1) * n]]
    with RewardPool(cfg.data.reward_fn, r.num_workers, r.timeout_s, r.backend, r.sandbox_timeout_s,
                    kinds=scorer_kinds(s[0] for s in samples)) as pool:
        return pool.score(samples)


def _results(records: list[dict], texts: list[str], responses: list, scored: list[dict], n: int,
             targets: list) -> tuple[list[PromptResult], list[dict]]:
    """Each prompt's PromptResult (for `summarize`) and each sample's samples.jsonl row."""
    results, rows = [], []
    for i, rec in enumerate(records):
        sl = slice(i * n, (i + 1) * n)
        code = scorer_for(rec["data_source"]) == "code"
        answers = [None if code else extract_boxed(t) for t in texts[sl]]
        keys = [answer_key(t, whole=code) for t in texts[sl]]
        acc = [bool(s["acc"]) for s in scored[sl]]
        results.append(PromptResult(rec["data_source"], acc, [len(x) for x in responses[sl]],
                                    None if code else majority(rec, answers), keys, targets[i]))
        for j, (text, ans, key, s) in enumerate(zip(texts[sl], answers, keys, scored[sl])):
            rows.append({"data_source": rec["data_source"], "prompt_index": i, "sample": j,
                         "prompt": rec["prompt"], "response": text, "answer": ans, "key": key,
                         "score": s["score"], "acc": bool(s["acc"])})
    return results, rows


def _write(output_dir: str, summary: dict, rows: list[dict]) -> None:
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(output_dir, "samples.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


# -------------------------------------------------------------------------------------- run

@contextlib.contextmanager
def _prepared(cfg, log):
    """What both evaluations check before reading their prompts, then hold while they sample: the
    reward function, the model directory (a checkpoint merged), its tokenizer and its context
    against the run's lengths. Yields (model directory, tokenizer, the model's config)."""
    load_reward_fn(cfg.data.reward_fn)
    with resolved_model(cfg, log) as model_dir:
        tok = load_tokenizer(model_dir)
        # the model as the workers load it: a prompt and response past its context fail now
        config = load_model_config(model_dir, cfg.model.max_position_embeddings)
        check_context(cfg, config, f"config.json of model.path={cfg.model.path!r}")
        yield model_dir, tok, config


def _engine(cfg, config, model_dir: str, log):
    """The rollout engine's spec, once its install and this model are checked (before Ray, with the
    weights, not in a worker): what both evaluations check after their prompts, before sampling."""
    spec = get_rollout(cfg.rollout.backend)
    version = spec.preflight(config.architectures)
    if version:
        log(f"[eval] rollout: {version}")
    check_weights(model_dir, f"model.path={cfg.model.path!r}")
    return spec


def run(cfg, log=print) -> dict:
    """Evaluate `model.path` on `eval.files` (or, with eval.val_sets, on each validation set:
    `run_sets`); returns the summary (also written to `eval.output_dir`/summary.json, with every
    sample in samples.jsonl)."""
    if cfg.eval.val_sets:
        return run_sets(cfg, log)
    t0 = time.time()
    e = cfg.eval
    if e.target:
        check_target(e.target, e.output_dir)
    with _prepared(cfg, log) as (model_dir, tok, config):
        records = load_eval_set(cfg, tok)
        targets = load_target(e.target, records, e.seed) if e.target else [None] * len(records)
        prompts = encode_prompts(records, tok)  # the chat template, as in training
        spec = _engine(cfg, config, model_dir, log)
        from reasonrl_fast.eval.generate import generate_all  # imports ray

        responses = generate_all(cfg, model_dir, prompts, spec, log)
    texts = tok.batch_decode(responses, skip_special_tokens=True)
    t_score = time.time()
    scored, counts = score_all(cfg, records, texts)
    log(f"[eval] scored {len(texts)} responses in {time.time() - t_score:.1f}s "
        f"(timeouts {counts['reward/timeouts']}, errors {counts['reward/errors']})")

    n, ks = e.n, ks_of(cfg)
    results, rows = _results(records, texts, responses, scored, n, targets)
    summary = {
        "model": cfg.model.path, "files": list(e.files) or ["<embedded validation split>"],
        "n": n, "k": ks, "temperature": e.temperature, "top_p": e.top_p,
        "max_new_tokens": cfg.rollout.max_new_tokens, "seed": e.seed, "backend": cfg.rollout.backend,
        "target": e.target or None,
        "reward/timeouts": counts["reward/timeouts"], "reward/errors": counts["reward/errors"],
        **summarize(results, n, ks), "time_s": round(time.time() - t0, 2),
    }
    _write(e.output_dir, summary, rows)
    log(table(summary))
    log(f"[eval] wrote {e.output_dir}/summary.json and samples.jsonl")
    return summary


def run_sets(cfg, log=print) -> dict:
    """Evaluate `model.path` on each set of data.val_sets as the trainer validates it (its n, k,
    maj and sampling; eval.val_step: the trainer's seeds of that step): summary.json holds each
    set's summary under "sets" (its overall_micro is what the trainer logs as val/<name>/...)
    and "val/accuracy", the macro average of their mean@n; samples.jsonl each sample with its
    set's name."""
    t0 = time.time()
    e, d = cfg.eval, cfg.data
    if not d.val_sets:
        raise ConfigError("eval.val_sets=true needs data.val_sets: give the run's config.yaml first (or the sets as "
                          "data.val_sets=[...])")
    with _prepared(cfg, log) as (model_dir, tok, config):
        try:
            sets = load_val_sets(cfg, tok)
        except DataError as e_:
            raise EvalError(str(e_)) from None
        from reasonrl_fast.eval.generate import Job, generate_jobs  # imports ray

        step = e.val_step
        jobs = [Job(encode_prompts(vs.records, tok), vs.n, vs.temperature, vs.top_p,
                    e.seed if step is None else cfg.trainer.seed, 0 if step is None else f"val/{step}/{vs.name}")
                for vs in sets]
        outputs = generate_jobs(cfg, model_dir, jobs, _engine(cfg, config, model_dir, log), log)
    out: dict = {}
    rows = []
    for vs, responses in zip(sets, outputs, strict=True):
        texts = tok.batch_decode(responses, skip_special_tokens=True)
        scored, counts = score_all(cfg, vs.records, texts, vs.n, vs.score_as)
        results, set_rows = _results(vs.records, texts, responses, scored, vs.n, [None] * len(vs.records))
        rows += [{"set": vs.name, **r} for r in set_rows]
        out[vs.name] = {"files": [f for v in d.val_sets if v.name == vs.name for f in v.files]
                        or ["<embedded validation split>"], "n": vs.n, "k": vs.ks, "maj": vs.maj,
                        "scored_as": vs.score_as,
                        "temperature": vs.temperature, "top_p": vs.top_p, **counts,
                        **summarize(results, vs.n, vs.ks)}
    summary = {"model": cfg.model.path, "sets": out, "seed": e.seed if step is None else cfg.trainer.seed,
               "val_step": step, "max_new_tokens": cfg.rollout.max_new_tokens, "backend": cfg.rollout.backend,
               "val/accuracy": sum(v["overall_micro"][f"mean@{v['n']}"] for v in out.values()) / len(out),
               "time_s": round(time.time() - t0, 2)}
    _write(e.output_dir, summary, rows)
    for name, v in out.items():
        log(f"[eval] set {name}: {v['overall_micro']['prompts']} prompts x {v['n']}")
        log(table({**v, "target": None}))
    log(f"[eval] val/accuracy (the sets' macro average of mean@n): {summary['val/accuracy']:.4f}")
    log(f"[eval] wrote {e.output_dir}/summary.json and samples.jsonl")
    return summary


def table(summary: dict) -> str:
    """A small text table: one row per data source, then the macro and micro averages."""
    n, ks = summary["n"], summary["k"]
    cols = ["prompts", f"mean@{n}", f"se@{n}", *[f"pass@{k}" for k in ks], f"maj@{n}", f"distinct@{n}",
            f"entropy@{n}", *([f"tv@{n}", f"kl@{n}"] if summary.get("target") else []), "length"]
    rows = [(s, m) for s, m in summary["per_source"].items()]
    rows += [("overall (macro)", summary["overall"]), ("overall (micro)", summary["overall_micro"])]
    width = max(len(s) for s, _ in rows)

    def cell(m: dict, c: str) -> str:
        v = m["response_length/mean"] if c == "length" else m.get(c)
        if v is None:
            return "-"
        return str(v) if c == "prompts" else f"{v:.1f}" if c == "length" else f"{v:.4f}"

    w = {c: max(9, len(c)) for c in cols}
    lines = [" ".join([" " * width] + [f"{c:>{w[c]}}" for c in cols])]
    lines += [" ".join([f"{s:<{width}}"] + [f"{cell(m, c):>{w[c]}}" for c in cols]) for s, m in rows]
    return "\n".join(lines)
