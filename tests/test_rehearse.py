"""The CPU rehearsal of a recipe (reasonrl_fast.rehearse): its scaling rule and stand-ins as pure
functions, the compute-dtype setting it relies on (bf16 compute on CPU under FSDP2, layout/), the
preflight failure it shares with the train command, and every shipped config rehearsed end to
end (e2e: Ray, two gloo workers, a checkpoint resumed; a minute or two each)."""

import glob
import json
import math
import os
import random
import subprocess
import sys

import pytest
import torch

from reasonrl_fast import rehearse
from reasonrl_fast.config import ConfigError, load_config
from reasonrl_fast.data.prepare import NAMES, write_records
from reasonrl_fast.data.records import load_records
from reasonrl_fast.data.stand_in import EXAMPLES, file_sources, longest_prompt, records_for, stand_in_records
from reasonrl_fast.models import stand_in
from reasonrl_fast.trainer import stand_ins
from reasonrl_fast.layout import tensor_parallel
from reasonrl_fast.layout.shape import check_shape, model_fields
from reasonrl_fast.layout.shipped_shapes import SHAPES
from reasonrl_fast.rewards.score import SCORERS, default_compute_score, scorer_for
from tests.helpers.train import ROOT, repo_env

CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))
NAME = [os.path.basename(c) for c in CONFIGS]
VLLM_REHEARSED = "grpo_qwen2.5_32b_dapo.yaml"
"""Rehearsed end to end through vLLM, its tensor-parallel engine over both workers
(test_a_vllm_recipe_rehearses_through_its_tensor_parallel_engine), not again with the hf fallback
here: the other vLLM recipes take that path."""

# What a rehearsal may change besides the token lengths: sizes, and where and how the run is held.
RUN_SHAPE = {"data.prompts_per_step", "data.gen_prompts_per_step", "optim.mini_batch_prompts", "trainer.nnodes", "trainer.workers_per_node",
             "trainer.cpus_per_worker", "trainer.sharding", "model.compute_dtype", "trainer.steps",
             "trainer.save_every", "trainer.resume", "trainer.ray_address", "trainer.progress", "rollout.backend",
             "rollout.tensor_parallel_size", "rollout.workers", "sft.steps", "data.train_size", "data.val_size",
             "rollout.val_n", "data.val_sets", "trainer.sequence_parallel_size"}


def _stand_ins(cfg):
    records = records_for(cfg, rehearse.TRAIN_PROMPTS, rehearse.VAL_PROMPTS)
    chat = any(isinstance(r["prompt"], list) for files in records.values() for _, pairs in files for r, _ in pairs)
    return records, longest_prompt(records, stand_in.tokenizer(chat))


# ---------------------------------------------------------------- the scaling rule


def _powers(limit):
    f = 1
    while f <= limit:
        yield f
        f *= 2


@pytest.mark.parametrize("trial", range(40))
def test_length_factor_is_the_smallest_power_of_two_that_fits_and_keeps_the_prompt(trial):
    rng = random.Random(trial)
    p, r, need = rng.randint(1, 20000), rng.randint(1, 40000), rng.randint(1, 40)
    cfg = load_config(None, [f"data.max_prompt_length={p}", f"rollout.max_new_tokens={r}"])
    f = rehearse.length_factor(cfg, need)
    fits = [g for g in _powers(2 * (p + r)) if p + r <= g * rehearse.SEQUENCE_TOKENS]
    keeps = [g for g in _powers(fits[0]) if -(-p // g) >= need]
    assert f == (max(keeps) if keeps else 1)


@pytest.mark.parametrize("name", NAME)
def test_every_length_is_divided_by_the_one_factor_and_the_records_fit(name):
    cfg = load_config(os.path.join(ROOT, "configs", name))
    _, prompt_tokens = _stand_ins(cfg)
    scaled = rehearse.scale(cfg, engine_importable=False, prompt_tokens=prompt_tokens)
    f = rehearse.length_factor(cfg, prompt_tokens)
    assert f & (f - 1) == 0
    for key in rehearse.LENGTHS:
        want = math.ceil(rehearse.get(cfg, key) / f)
        if key == "fapo.genrm.max_tokens":  # the stand-in GenRM's verdicts are cut shorter still
            want = min(want, rehearse.GENRM_TOKENS)
        assert scaled.get(key, rehearse.get(cfg, key)) == want, key
    small = rehearse.apply(cfg, scaled)
    assert small.data.max_prompt_length >= prompt_tokens
    assert set(scaled) - set(rehearse.LENGTHS) <= RUN_SHAPE, "a rehearsal keeps every other setting"
    assert (small.trainer.sharding, small.model.compute_dtype, small.trainer.workers_per_node) == (
        "fsdp", "bfloat16", rehearse.WORKERS)
    assert small.model.dtype == cfg.model.dtype and small.rollout.n == cfg.rollout.n
    assert small.rollout.val_n == min(cfg.rollout.val_n, rehearse.VAL_N)
    # each validation set as rollout.val_n: fewer samples, its k cut to them, the rest kept
    assert [(v.name, v.n, v.k, v.scorer, v.files) for v in small.data.val_sets] == [
        (v.name, min(v.n, rehearse.VAL_N), [k for k in v.k if k <= rehearse.VAL_N], v.scorer, v.files)
        for v in cfg.data.val_sets]
    assert small.rollout.tensor_parallel_size == 1  # the hf rollout holds the whole model
    if cfg.rollout.backend == "vllm":
        assert small.rollout.backend == "hf"
        with_engine = rehearse.scale(cfg, engine_importable=True, prompt_tokens=prompt_tokens)
        assert "rollout.backend" not in with_engine
        # the recipe's engine ranks, at most the rehearsal's workers
        tp = rehearse.apply(cfg, with_engine).rollout.tensor_parallel_size
        assert tp == min(cfg.rollout.tensor_parallel_size, rehearse.WORKERS)


@pytest.mark.parametrize("trial", range(60))
def test_batch_rule(trial):
    rng = random.Random(1000 + trial)
    prompts, n = rng.randint(1, 1024), rng.choice([1, 2, 4, 8, 16, 32, 64])
    mini = rng.randint(1, prompts)
    p, m = rehearse.batch(prompts, mini, n)
    w = rehearse.WORKERS
    assert p >= w and p % m == 0
    assert p * n <= rehearse.SAMPLES_PER_STEP or p == w
    assert p <= max(prompts, w)
    updates, kept = -(-prompts // mini), -(-p // m)
    assert kept == min(updates, p // w), (prompts, mini, n, p, m)
    # the trainer's own rule takes it: every worker a prompt in every mini-batch
    rehearse.apply(load_config(), {"data.prompts_per_step": p, "optim.mini_batch_prompts": m,
                                   "trainer.nnodes": 1, "trainer.workers_per_node": w})


@pytest.mark.parametrize("gen", [None, 512, 1536, 600])
def test_the_generation_batch_keeps_the_recipes_proportion_to_the_step(gen):
    """DAPO's 1536 prompts generated for 512 trained: the rehearsal generates three times its
    step too (rounded up); a recipe without dynamic sampling gets no generation batch."""
    extra = ["data.filter_groups=acc", f"data.gen_prompts_per_step={gen}"] if gen else []
    cfg = load_config(None, ["data.prompts_per_step=512", "optim.mini_batch_prompts=32", "rollout.n=16", *extra])
    small = rehearse.apply(cfg, rehearse.scale(cfg, engine_importable=False))
    p = small.data.prompts_per_step
    assert small.data.gen_prompts_per_step == (None if gen is None else -(-p * gen // 512))
    assert small.data.gen_prompts() >= p and small.data.gen_prompts() * 512 >= p * (gen or 512)


# ---------------------------------------------------------------- stand-ins


@pytest.mark.parametrize("tp, sp", [(1, 1), (2, 1), (1, 2)])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_shrink_keeps_the_architecture(name, tp, sp):
    """... and with `tp` engine ranks, heads that they split (Qwen2.5-32B's 40:8 is 5:1 at 1, 10:2
    at 2, which the trainer's own check takes); with `sp` Ulysses ranks, query heads they split."""
    real = {k: v for k, v in SHAPES[name].items() if not k.startswith("_")}
    small = stand_in.shrink(real, tp, sequence_parallel=sp)
    cfg = load_config(None, ["rollout.backend=vllm", f"rollout.tensor_parallel_size={tp}"])
    assert tensor_parallel(cfg, small) == tp
    assert small["num_attention_heads"] % sp == 0
    kv = real.get("num_key_value_heads") or real["num_attention_heads"]
    assert small["num_attention_heads"] * kv == real["num_attention_heads"] * small["num_key_value_heads"]
    assert small["hidden_size"] == small["num_attention_heads"] * stand_in.HEAD_DIM
    assert small["num_hidden_layers"] == stand_in.LAYERS
    ratio = real["intermediate_size"] / real["hidden_size"]
    assert abs(small["intermediate_size"] - ratio * small["hidden_size"]) <= 4 * tp  # rounded to 8 x tp
    for key in set(real) - {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "head_dim"}:
        assert small[key] == real[key], key  # vocabulary, tied embeddings, RoPE, context, ...
    config = stand_in.hf_config(small)
    check_shape(config, name, vocab=len(stand_in.tokenizer(True)))
    assert config.model_type == real["model_type"] and config.vocab_size == real["vocab_size"]


def test_an_unknown_model_without_config_json_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no shipped shape is named 'Mystery-9B'"):
        model_fields(str(tmp_path / "Mystery-9B"), "model.path")
    (tmp_path / "Mine").mkdir()
    (tmp_path / "Mine" / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    assert model_fields(str(tmp_path / "Mine"), "model.path")[0]["hidden_size"] == 8
    fields, _, note = model_fields("/models/Qwen2.5-7B", "model.path")  # the shipped shape, without its source
    assert fields["hidden_size"] == 3584 and "_source" not in fields and "Qwen/Qwen2.5-7B" in note


def test_ids_beyond_the_tokenizer_decode_to_nothing():
    tok = stand_in.tokenizer(chat=True)
    vocab = SHAPES["Qwen2.5-7B"]["vocab_size"]
    text = "1+1"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    mixed = [len(tok), *ids[:1], vocab - 1, *ids[1:], random.randrange(len(tok), vocab)]
    assert tok.decode(mixed, skip_special_tokens=True) == text


@pytest.mark.parametrize("name", NAME)
def test_every_recipe_says_the_data_source_of_each_file(name):
    """A recipe's files are not on a CI machine: each names the data_source its records carry, and
    the stand-ins carry that one (the names data.prepare writes)."""
    cfg = load_config(os.path.join(ROOT, "configs", name))
    d = cfg.data
    assert (len(d.train_sources), len(d.val_sources)) == (len(d.train_files), len(d.val_files))
    records = records_for(cfg, 3, 2)
    for split in ("train", "val"):
        for (path, pairs), source in zip(records[f"data.{split}_files"], getattr(d, f"{split}_sources")):
            assert not os.path.exists(path) and {r["data_source"] for r, _ in pairs} == {source}
    prepared = {source for source, _ in NAMES.values() if source} | {"math_dapo_boxed", "genrm"}
    assert set(d.train_sources + d.val_sources) <= prepared


def test_a_file_not_here_without_its_data_source_is_one_config_error_naming_the_key(tmp_path):
    """Never guessed from the file's name: /data/aime24.parquet says nothing."""
    cfg = load_config(None, ["data.train_files=[/data/aime24.parquet]", "data.val_files=[/data/x.jsonl]",
                             "data.train_sources=[aime24]"])
    assert file_sources(cfg.data, "train", 0) == ["aime24"]
    with pytest.raises(ConfigError, match=r"^data.val_sources\[0\]: /data/x.jsonl is not on this machine"):
        file_sources(cfg.data, "val", 0)
    partition = load_config(None, ["data.train_files=[/data/p.jsonl]", "data.train_sources=[partition]"])
    with pytest.raises(ConfigError, match=r"^data.train_sources\[0\]: data_source 'partition' .* no stand-in"):
        file_sources(partition.data, "train", 0)


def test_a_file_here_is_read_for_its_data_sources(tmp_path):
    path = str(tmp_path / "mixed.jsonl")
    write_records([r for r, _ in stand_in_records(["humaneval", "aime24"], 4)], path)
    cfg = load_config(None, [f"data.train_files=[{path}]"])
    assert file_sources(cfg.data, "train", 0) == ["humaneval", "aime24"]
    assert file_sources(load_config(None, [f"data.train_files=[{path}]", "data.train_sources=[aime24]"]).data,
                        "train", 0) == ["humaneval", "aime24"]
    wrong = load_config(None, [f"data.train_files=[{path}]", "data.train_sources=[math_dapo]"])
    with pytest.raises(ConfigError, match=r"^data.train_sources\[0\]='math_dapo', but the records of .* carry "
                                          r"'humaneval', 'aime24'$"):
        file_sources(wrong.data, "train", 0)


def test_a_recipe_without_its_data_sources_stops_the_rehearsal_with_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        rehearse.main([os.path.join(ROOT, "configs", "grpo_qwen2.5_32b_dapo.yaml"), "data.val_sources=[]"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: data.val_sources[0]: "), err


def test_every_scorer_kind_has_a_stand_in_example():
    assert set(EXAMPLES) == set(SCORERS)


@pytest.mark.parametrize("source", ["math_dapo", "aime24", "math", "math_dapo_boxed", "genrm", "humaneval"])
def test_stand_in_records_load_as_the_trainer_loads_them(source, tmp_path):
    pairs = stand_in_records([source], 7)
    path = str(tmp_path / "records.jsonl")
    write_records([r for r, _ in pairs], path)
    loaded = load_records(path)
    assert [r["data_source"] for r in loaded] == [source] * 7
    assert all(isinstance(r["prompt"], list) for r in loaded)
    if scorer_for(source) != "code":  # code runs in the sandbox: the e2e rehearsal scores it
        for rec, (_, response) in zip(loaded, pairs):
            assert default_compute_score(source, response, rec["answer"], rec["extra_info"])["acc"]


# ---------------------------------------------------------------- the compute dtype


def test_compute_dtype_is_checked_with_the_config():
    assert load_config(None, ["model.compute_dtype=bfloat16"]).model.compute_dtype == "bfloat16"
    with pytest.raises(ConfigError, match="model.compute_dtype"):
        load_config(None, ["model.compute_dtype=float16"])


# ---------------------------------------------------------------- the command


def test_a_context_too_short_fails_in_preflight_with_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        rehearse.main([os.path.join(ROOT, "configs", "fapo_qwen2.5_math_7b.yaml"),
                       "model.max_position_embeddings=4096"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    assert "model.max_position_embeddings" in err


def test_a_kv_budget_below_one_sequence_fails_in_preflight_with_one_line(capsys):
    """What `python -m reasonrl_fast.plan` calls a problem (vLLM would not start) stops the rehearsal
    before anything runs."""
    with pytest.raises(SystemExit) as e:
        rehearse.main([os.path.join(ROOT, "configs", "grpo_baseline_qwen2.5_math_7b.yaml"), "rollout.backend=vllm",
                       "rollout.kv_cache_memory_bytes=1000"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    assert "rollout.kv_cache_memory_bytes=1000 holds less than one 10240-token sequence's KV cache" in err


def _row(step, timeouts=0, errors=0, grad_norm=0.5):
    return {"step": step, "reward/timeouts": timeouts, "reward/errors": errors, "train/grad_norm": grad_norm}


def test_nothing_learns_names_the_step_whose_rewards_all_failed():
    val = {"step": 0, "val/accuracy": 0.0}  # a validation row has neither
    assert rehearse.nothing_learns([val, _row(1, 3, 2), _row(2, 7, 0)], samples=8) is None
    assert rehearse.nothing_learns([val, _row(1, 3, 2), _row(2, 8, 0)], samples=8) == (
        "step 2: every reward timed out or failed (reward/timeouts=8, reward/errors=0 of 8 samples): nothing "
        "could learn from the reward")
    assert rehearse.nothing_learns([_row(1, 5, 3)], samples=8).startswith("step 1: ")


def test_nothing_learns_when_no_gradient_moves_a_weight():
    assert rehearse.nothing_learns([_row(1, grad_norm=0.0), _row(2, grad_norm=0.0)], 8) == (
        "train/grad_norm is 0.0 at every step (steps 1-2): no update moved a weight")
    assert rehearse.nothing_learns([_row(1, grad_norm=None), _row(2, grad_norm=None)], 8).startswith("train/grad_norm is None")
    assert rehearse.nothing_learns([_row(1, grad_norm=0.0), _row(2, grad_norm=1e-9)], 8) is None
    assert rehearse.nothing_learns([], 8) is None


def test_the_stand_in_has_heads_its_rollout_engine_runs_on_cpu():
    """vLLM's CPU attention refuses heads of 16: a rehearsal that samples with it gets heads of 32
    (10:2 of them for Qwen2.5-32B at TP 2: hidden 320); the hf rollout keeps 16."""
    from reasonrl_fast.rollout import get_rollout

    assert stand_ins.stand_in_head_dim(get_rollout("hf")) == stand_in.HEAD_DIM == 16
    assert stand_ins.stand_in_head_dim(get_rollout("vllm")) == 32
    real = {k: v for k, v in SHAPES["Qwen2.5-32B"].items() if not k.startswith("_")}
    small = stand_in.shrink(real, 2, 32)
    assert (small["num_attention_heads"], small["num_key_value_heads"], small["hidden_size"]) == (10, 2, 320)


def test_a_vllm_recipe_rehearses_through_its_tensor_parallel_engine(vllm_python, tmp_path):
    """Where vLLM is installed the 32B GRPO recipe rehearses with it, its TP 4 as 2 over the two
    workers: one engine over both, nothing left in /dev/shm."""
    out = tmp_path / "rehearsal"
    p = subprocess.run([str(vllm_python), "-m", "reasonrl_fast.rehearse", os.path.join("configs", VLLM_REHEARSED),
                        "--output-dir", str(out)], cwd=ROOT, env=repo_env(), capture_output=True, text=True,
                       timeout=900)
    _passed(p, out, VLLM_REHEARSED)
    assert "rollout.tensor_parallel_size: 4 -> 2" in p.stdout, p.stdout[-3000:]
    assert json.loads((out / "run" / "layout.json").read_text())["engine_tp"] == 2
    assert sorted(os.listdir(out / "run" / "rollout")) == ["vllm-rank0.log", "vllm-rank1.log"]
    assert not [n for n in os.listdir("/dev/shm") if "cpushm" in n]


@pytest.mark.e2e
def test_the_stand_in_warm_start_learns_the_answers_and_keeps_the_untied_embedding(tmp_path):
    """The stand-in warm start (the embedded warm start's loop, trainer/sft.py `train`) brings
    the 80-wide stand-in's loss on the reference answers below 0.1 in WARM_STEPS steps (some
    sampled answers are then right), saved in place; an untied input embedding is not trained."""
    from safetensors.torch import load_file

    cfg = load_config(os.path.join(ROOT, "configs", "grpo_qwen2.5_32b_dapo.yaml"))
    records = records_for(cfg, rehearse.TRAIN_PROMPTS, rehearse.VAL_PROMPTS)
    tok = stand_in.tokenizer(True)
    fields, _, _ = model_fields(cfg.model.path, "model.path")
    small = stand_in.shrink(fields)
    assert small["hidden_size"] <= stand_ins.WARM_WIDTH and not small.get("tie_word_embeddings")
    path = str(tmp_path / "model")
    stand_in.build(small, path, tok, cfg.trainer.seed)
    before = load_file(os.path.join(path, "model.safetensors"))
    lines = []
    stand_ins.teach_stand_in(path, [p for files in records.values() for _, ps in files for p in ps], lines.append)
    loss = float(lines[-1].split(" loss ")[1].split()[0])
    assert loss < 0.1, lines
    after = load_file(os.path.join(path, "model.safetensors"))
    assert torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    assert not torch.equal(before["lm_head.weight"], after["lm_head.weight"])


SPLIT_REHEARSED = {"default.yaml": ["trainer.placement=split", "trainer.max_staleness=1"]}
"""Rehearsed in split placement with one step of staleness (generations in flight across the
checkpoint the second run resumes from), the one config rehearsal that also covers split
placement; every other config's rehearsal runs colocated, as its recipe does."""


@pytest.mark.e2e
@pytest.mark.parametrize("name", [n for n in NAME if n != VLLM_REHEARSED])
def test_every_config_rehearses(name, tmp_path):
    out = tmp_path / "rehearsal"
    p = subprocess.run([sys.executable, "-m", "reasonrl_fast.rehearse", os.path.join("configs", name),
                        *SPLIT_REHEARSED.get(name, []), "--output-dir", str(out)], cwd=ROOT, env=repo_env(),
                       capture_output=True, text=True, timeout=900)
    _passed(p, out, name)
    if name in SPLIT_REHEARSED:
        rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
        assert max(r.get("rollout/staleness_max", 0) for r in rows) <= 1
        assert any("rollout/staleness_mean" in r for r in rows), rows
        assert load_config(str(out / "run" / "config.yaml")).trainer.placement == "split"


def _passed(p, out, name: str) -> None:
    """The rehearsal of configs/`name` passed: its steps logged, the last checkpoint resumed, the
    stand-in GenRM (FAPO) started by the trainer and asked."""
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert "[rehearse] passed" in p.stdout and "resumed from " in p.stdout, p.stdout[-3000:]
    run = out / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(rehearse.STEPS + 2))
    assert (run / f"checkpoint-{rehearse.STEPS + 1}").is_dir()
    cfg = load_config(os.path.join(ROOT, "configs", name))
    if stand_ins.stand_in_genrm(cfg):
        assert "[fapo] GenRM server (hf:" in p.stdout
        assert sum(r.get("fapo/sent", 0) for r in rows) > 0, rows


def test_split_placement_is_rehearsed_with_one_rollout_worker_and_its_staleness():
    cfg = load_config(os.path.join(ROOT, "configs", "grpo_qwen2.5_32b_dapo.yaml"),
                      ["trainer.placement=split", "rollout.workers=8", "trainer.max_staleness=2"])
    small = rehearse.apply(cfg, rehearse.scale(cfg, engine_importable=False, prompt_tokens=_stand_ins(cfg)[1]))
    assert (small.trainer.placement, small.rollout.workers, small.trainer.max_staleness) == ("split", 1, 2)
    assert small.trainer.workers_per_node == rehearse.WORKERS


@pytest.mark.e2e
def test_a_recipe_whose_rewards_all_fail_does_not_pass(tmp_path):
    """Every reward raising (as every one timing out) scores every sample 0: the rehearsal runs,
    but fails with exit status 1 and one line naming the step and the metric."""
    reward = tmp_path / "broken_reward.py"
    reward.write_text("def score(response, answer):\n    raise RuntimeError('broken')\n")
    p = subprocess.run([sys.executable, "-m", "reasonrl_fast.rehearse", os.path.join("configs", "default.yaml"),
                        f"data.reward_fn={reward}:score", "--output-dir", str(tmp_path / "rehearsal")],
                       cwd=ROOT, env=repo_env(), capture_output=True, text=True, timeout=900)
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert p.returncode == 1 and "[rehearse] passed" not in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    assert len(errors) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert errors[0].startswith("error: step 1: every reward timed out or failed (reward/timeouts=0, reward/errors="), errors


@pytest.mark.parametrize("sp, want", [(8, 2), (2, 2), (1, None)])
def test_a_recipes_sequence_parallel_runs_over_both_workers(sp, want):
    """Ulysses over the rehearsal's two workers wherever the recipe cuts its rows; offload kept."""
    cfg = load_config(os.path.join(ROOT, "configs", "fapo_qwen2.5_32b.yaml"),
                      [f"trainer.sequence_parallel_size={sp}"] + (["trainer.nnodes=1"] if sp == 1 else []))
    scaled = rehearse.scale(cfg, engine_importable=False)
    assert scaled.get("trainer.sequence_parallel_size") == (want if want != sp else None)
    small = rehearse.apply(cfg, scaled)
    assert small.trainer.sequence_parallel_size == (want or 1) and small.trainer.offload == "params+optimizer"


def test_a_recipes_validation_sets_get_stand_in_files_of_their_declared_sources(tmp_path):
    """Each set's file not on this machine gets stand-in records of the data_source its `sources`
    names, written beside the others; the rehearsal's data.val_sets points each set at its own."""
    cfg = load_config(os.path.join(ROOT, "configs", "fapo_qwen2.5_32b.yaml"))
    records, _ = _stand_ins(cfg)
    sources = ["aime24", "aime25", "gpqa-diamond"]
    assert [[r["data_source"] for _, pairs in records[f"data.val_sets[{s}].files"] for r, _ in pairs]
            for s in range(3)] == [[source] * rehearse.VAL_PROMPTS for source in sources]
    files = [str(tmp_path / f"{x}.jsonl") for x in "abc"]
    paths = {**{f"data.val_sets[{s}].files": [f] for s, f in enumerate(files)}, "data.train_files": ["t.jsonl"]}
    scaled = rehearse.scale(cfg, engine_importable=False)
    out = rehearse._set_files(cfg, scaled, paths)
    assert out["data.train_files"] == ["t.jsonl"] and not any(k.startswith("data.val_sets[") for k in out)
    assert [(v.name, v.files, v.n) for v in out["data.val_sets"]] == [
        (name, [f], rehearse.VAL_N) for name, f in zip(["aime24", "aime25", "gpqa_diamond"], files)]
    with pytest.raises(ConfigError, match=r"^data.val_sets\[1\].sources\[0\]: /data/x.parquet is not on this "
                                          r"machine, and data.val_sets\[1\].sources does not say"):
        records_for(load_config(None, ["data.val_sets=[{name: a}, {name: b, files: [/data/x.parquet]}]"]), 2, 2)
