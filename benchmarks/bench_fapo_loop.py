"""The whole FAPO recipe on the embedded task (examples/fapo_end_to_end.sh): a GenRM trained with
GRPO, merged and served, then the policy trained with GRPO, FAPO with the rule judge and FAPO
with the learned judge, same seed and budget. Prints, and with --write records, the GenRM's
step-index accuracy, the three runs side by side (accuracy, flawed-positive ratio, flagged
share, the learned judge's agreement with the step checker) and the eval of the last policy.

    python benchmarks/bench_fapo_loop.py [--write benchmarks/RESULTS.md] [--out DIR]

Environment variables of the script (STEPS, GENRM_STEPS, EXTRA, ...) pass through. With --write
the policies' curves go to benchmarks/fapo_loop.png beside the table."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from checkout import ROOT
from results_md import write_section

MARKER = "fapo-loop"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", metavar="RESULTS.md")
    p.add_argument("--out", help="keep the runs here (default: a temporary directory)")
    a = p.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="fapo_loop_")
    load0, t = os.getloadavg()[0], time.time()
    proc = subprocess.run(["bash", os.path.join(ROOT, "examples", "fapo_end_to_end.sh")], cwd=ROOT,
                          env=dict(os.environ, OUT=out, PYTHON=sys.executable), capture_output=True, text=True)
    wall = time.time() - t
    if proc.returncode:
        sys.exit(f"examples/fapo_end_to_end.sh failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    ev = json.load(open(os.path.join(out, "eval-fapo-learned", "summary.json")))["overall"]
    eval_line = ", ".join(f"{k} {v:.3f}" for k, v in ev.items() if isinstance(v, float) and "@" in k)
    env = {k: os.environ[k] for k in ("STEPS", "GENRM_STEPS", "EXTRA", "GENRM_EXTRA", "POLICY_EXTRA") if k in os.environ}
    body = "\n".join([
        f"### The FAPO loop on the embedded task ({datetime.date.today().isoformat()}, {os.cpu_count()}-core CPU, "
        f"load {load0:.1f} at the start and {os.getloadavg()[0]:.1f} at the end, {wall / 60:.1f} min in all; "
        f"`python benchmarks/bench_fapo_loop.py`{' with ' + json.dumps(env) if env else ''})",
        "", "GenRM (val/accuracy: the predicted index, -1 included, equals the step checker's, on held-out "
        "solutions):", "", open(os.path.join(out, "genrm.md")).read().strip(),
        "", "Policies, same seed and budget (fapo-learned asks the GenRM above, served with `--backend hf:`; "
        "the agreement columns compare its usable verdicts on right training answers with the step checker):",
        "", open(os.path.join(out, "policies.md")).read().strip(),
        "", f"Eval of the fapo-learned policy on its validation split (overall): {eval_line}."])
    print(body)
    if a.write:
        png = os.path.join(os.path.dirname(os.path.abspath(a.write)), "fapo_loop.png")
        shutil.copyfile(os.path.join(out, "policies.png"), png)
        write_section(a.write, body, MARKER)
        print(f"wrote {a.write} and {png}")
    if not a.out:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
