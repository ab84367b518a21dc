#!/usr/bin/env python3
"""Report benchmark: time and size of `evalharness report RUN --html` for a 10,000-sample QA run and a
10,000-instance SWE run with long trajectories (targets: under 5 s and under 5 MB each).

    python3 bench/report.py [--samples 10000] [--traj-chars 50000]
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.path.join(ROOT, "evalharness.py")
T0 = 1_800_000_000.0


def make_qa(run: str, n: int, rng: random.Random) -> None:
    os.makedirs(run)
    with open(os.path.join(run, "samples.jsonl"), "w") as fh:
        for i in range(n):
            ok = rng.random() > 0.03
            start = T0 + i * 0.01
            lat = rng.lognormvariate(0, 0.5)
            fh.write(json.dumps({"id": "q%d" % i, "status": "ok" if ok else "failed",
                                 "score": float(rng.random() < 0.7) if ok else None,
                                 "error": None if ok else "HTTP 503 from http://h/v1 (overload; 6 attempts)",
                                 "error_class": None if ok else "overload", "category": "c%d" % (i % 12),
                                 "scorer": "exact", "answer": "a", "response": "r" * 200, "prompt_tokens": 100,
                                 "completion_tokens": 50, "latency_s": lat, "ttft_s": 0.05, "started_at": start,
                                 "finished_at": start + lat}) + "\n")
    with open(os.path.join(run, "run.json"), "w") as fh:
        json.dump({"task": "qa", "status": "finished", "dataset": {"name": "big", "rows": n},
                   "concurrency": {"initial": 16}, "discovered_limit": 24}, fh)
    with open(os.path.join(run, "events.jsonl"), "w") as fh:
        for k in range(200):
            fh.write(json.dumps({"t": T0 + k * n * 0.01 / 200, "type": "limit", "limit": 10 + k % 20}) + "\n")


def make_swe(run: str, n: int, traj_chars: int, rng: random.Random) -> None:
    os.makedirs(os.path.join(run, "trajectories"))
    with open(os.path.join(run, "samples.jsonl"), "w") as fh:
        for i in range(n):
            iid = "o__r-%d" % i
            res = rng.random() < 0.4
            start = T0 + i
            fh.write(json.dumps({"id": iid, "status": "ok", "score": float(res), "error": None, "repo": "o/r%d" % (i % 9),
                                 "category": "o/r%d" % (i % 9), "scorer": "swebench", "resolved": res,
                                 "outcome": "resolved" if res else "unresolved", "f2p": [int(res), 1], "p2p": [3, 3],
                                 "steps": 30, "exit_reason": "submitted", "model_patch": "diff --git a/x b/x\n" +
                                 "+line\n" * 40, "started_at": start, "finished_at": start + 300,
                                 "completion_tokens": 4000}) + "\n")
            with open(os.path.join(run, "trajectories", iid + ".json"), "w") as tf:
                json.dump({"instance_id": iid, "messages": [{"role": "user", "content": "x" * traj_chars}] +
                           [{"role": "assistant", "content": "y" * 3000}] * 30}, tf)
    with open(os.path.join(run, "run.json"), "w") as fh:
        json.dump({"task": "swe", "status": "finished", "dataset": {"name": "swe", "rows": n}}, fh)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=10000)
    ap.add_argument("--traj-chars", type=int, default=50000)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="evh-bench-report-")
    rng = random.Random(0)
    try:
        make_qa(os.path.join(work, "qa"), args.samples, rng)
        make_swe(os.path.join(work, "swe"), args.samples, args.traj_chars, rng)
        for kind in ("qa", "swe"):
            run = os.path.join(work, kind)
            t = time.perf_counter()
            out = subprocess.run([sys.executable, MODULE, "report", run, "--html"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, universal_newlines=True)
            wall = time.perf_counter() - t
            if out.returncode:
                raise SystemExit(out.stderr)
            size = os.path.getsize(os.path.join(run, "report.html"))
            print("%s: %d samples -> report.html %.2f MB in %.2f s (targets: < 5 MB, < 5 s), process included"
                  % (kind, args.samples, size / 1e6, wall))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
