#!/usr/bin/env bash
# prepare -> train -> merge -> eval -> plot, on CPU from a fresh clone (after `make install`),
# twice: the embedded model on its own addition task, then the same model on a verl-format
# parquet file (the shipped smoke math set, prepared in verl's RL schema).
#
#   bash examples/pipeline.sh                 # runs/pipeline/, about 10 minutes on 2 cores
#   OUT=/tmp/p STEPS=2 EXTRA="model.hidden_size=32 ..." bash examples/pipeline.sh   # a smoke run
#
# The tiny model only learns to add: on the math set its accuracy stays near 0. The point is
# that every stage reads what the previous one wrote.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/pipeline}
STEPS=${STEPS:-30}
EXTRA=${EXTRA:-}
PY=${PYTHON:-python}
mkdir -p "$OUT"

# 1. data: the smoke math set in verl's schema (nothing is downloaded)
$PY -m reasonrl_fast.data.prepare smoke --output "$OUT/smoke.parquet"

# 2. train the embedded model on its addition task (GRPO), keeping the last checkpoint
$PY -m reasonrl_fast.train algo=grpo trainer.steps="$STEPS" trainer.save_last=true trainer.overwrite=true \
    trainer.output_dir="$OUT/addition" trainer.progress=false $EXTRA

# 3. merge the checkpoint into a Hugging Face directory
$PY -m reasonrl_fast.merge "$OUT/addition/checkpoint-$STEPS" "$OUT/addition-hf"

# 4. eval it on the task's validation split (the run's config.yaml defines the split) and on the
#    math set, by data_source: mean@n, se@n, pass@k, maj@n
$PY -m reasonrl_fast.eval "$OUT/addition/config.yaml" model.path="$OUT/addition-hf" eval.n=4 eval.k=[1,4] \
    eval.temperature=1.0 eval.top_p=1.0 eval.output_dir="$OUT/eval-addition" $EXTRA
$PY -m reasonrl_fast.eval model.path="$OUT/addition-hf" eval.files=["$OUT/smoke.parquet"] eval.n=2 eval.k=[1,2] \
    data.max_prompt_length=200 rollout.max_new_tokens=40 eval.output_dir="$OUT/eval-smoke" $EXTRA

# 5. train on the verl-format parquet file from the merged model, then plot both runs
$PY -m reasonrl_fast.train algo=grpo model.path="$OUT/addition-hf" data.train_files=["$OUT/smoke.parquet"] \
    data.val_files=["$OUT/smoke.parquet"] data.max_prompt_length=200 rollout.max_new_tokens=40 \
    trainer.steps=2 trainer.val_every=2 trainer.overwrite=true \
    trainer.output_dir="$OUT/smoke-run" trainer.progress=false $EXTRA
$PY -m reasonrl_fast.plot "$OUT/addition" "$OUT/smoke-run" -o "$OUT/curves.png"
echo "pipeline done: $OUT/eval-addition/summary.json $OUT/eval-smoke/summary.json $OUT/curves.png"
