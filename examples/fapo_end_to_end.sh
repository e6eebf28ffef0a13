#!/usr/bin/env bash
# The whole FAPO recipe on the embedded task, on CPU from a fresh clone (after `make install`):
#   1. train a GenRM with GRPO on step judgments (configs/genrm_default.yaml)
#   2. merge its checkpoint into a Hugging Face directory
#   3. serve it: python -m reasonrl_fast.genrm.serve --backend hf:DIR, on a free loopback port
#   4. train the policy three ways, same seed and budget: GRPO, FAPO with the rule judge (the
#      exact step checker, a server the run starts), FAPO with the learned judge (the server above)
#   5. merge and eval the learned-judge policy (mean@n, pass@k, maj@n)
#   6. plot the three runs and tabulate them: validation accuracy, flawed-positive ratio, and the
#      learned judge's agreement with the step checker
#
#   bash examples/fapo_end_to_end.sh          # runs/fapo_e2e/, about 15 minutes on 2 cores
#   OUT=/tmp/f STEPS=2 GENRM_STEPS=2 EXTRA="model.hidden_size=32 ..." bash examples/fapo_end_to_end.sh
#
# EXTRA goes to every run, GENRM_EXTRA to the GenRM run only, POLICY_EXTRA to the policy runs only.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/fapo_e2e}
STEPS=${STEPS:-150}
GENRM_STEPS=${GENRM_STEPS:-100}
EXTRA=${EXTRA:-}
GENRM_EXTRA=${GENRM_EXTRA:-}
POLICY_EXTRA=${POLICY_EXTRA:-}
PY=${PYTHON:-python}
mkdir -p "$OUT"

# 1. the GenRM: warm start on right verdicts, then GRPO on the GenRM reward
$PY -m reasonrl_fast.train configs/genrm_default.yaml trainer.steps="$GENRM_STEPS" trainer.save_last=true \
    trainer.overwrite=true trainer.output_dir="$OUT/genrm" trainer.progress=false $EXTRA $GENRM_EXTRA

# 2. merge it
$PY -m reasonrl_fast.merge "$OUT/genrm/checkpoint-$GENRM_STEPS" "$OUT/genrm-hf"

# 3. serve it on loopback; the server is stopped however this script ends
$PY -m reasonrl_fast.genrm.serve --backend "hf:$OUT/genrm-hf" --port 0 --device cpu \
    >"$OUT/genrm-serve.out" 2>"$OUT/genrm-serve.log" &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT
URL=""
for _ in $(seq 1200); do  # the model loads in a few seconds; 120 s at most
    URL=$(sed -n 's/^GenRM server listening on //p' "$OUT/genrm-serve.out")
    [ -n "$URL" ] && break
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$URL" ]; then
    echo "the GenRM server did not start; its log:" >&2
    tail -n 20 "$OUT/genrm-serve.log" >&2
    exit 1
fi
echo "GenRM (learned) served at $URL"

# 4. the policy three ways; the verdict is a few characters, so the learned judge gets 32 tokens
policy() {
    local name=$1; shift
    $PY -m reasonrl_fast.train trainer.steps="$STEPS" trainer.overwrite=true trainer.output_dir="$OUT/$name" \
        trainer.progress=false "$@" $EXTRA $POLICY_EXTRA
}
policy grpo algo=grpo
policy fapo-rule algo=fapo
policy fapo-learned algo=fapo "fapo.genrm.addresses=[$URL]" fapo.genrm.max_tokens=32 trainer.save_last=true
# what the learned judge served (completions, generate calls), then stop it
$PY -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
    "${URL%/v1}/health" >"$OUT/genrm-health.json"
kill "$SERVER"; wait "$SERVER" 2>/dev/null || true

# 5. eval the learned-judge policy on its validation split
$PY -m reasonrl_fast.merge "$OUT/fapo-learned/checkpoint-$STEPS" "$OUT/fapo-learned-hf"
$PY -m reasonrl_fast.eval "$OUT/fapo-learned/config.yaml" model.path="$OUT/fapo-learned-hf" eval.n=4 \
    eval.k=[1,4] eval.temperature=1.0 eval.top_p=1.0 eval.output_dir="$OUT/eval-fapo-learned" $EXTRA $POLICY_EXTRA

# 6. curves and tables: the GenRM's own run, then the three policies
$PY -m reasonrl_fast.plot "$OUT/genrm" -o "$OUT/genrm.png" --summary "$OUT/genrm.md"
$PY -m reasonrl_fast.plot "$OUT/grpo" "$OUT/fapo-rule" "$OUT/fapo-learned" -o "$OUT/policies.png" \
    --summary "$OUT/policies.md"
echo "GenRM (step-index accuracy on held-out solutions):"
cat "$OUT/genrm.md"
echo "policies:"
cat "$OUT/policies.md"
echo "fapo end to end done: $OUT/policies.md $OUT/policies.png $OUT/eval-fapo-learned/summary.json"
