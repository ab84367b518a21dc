#!/usr/bin/env python3
"""One endpoint, many shards: do N shards of one run together hold the endpoint near its best concurrency?

Starts `serve-mock` in another process with a capacity knee (per-stream decode speed falls past --knee streams and
aggregate throughput falls past it too: --thrash), then runs the same QA set three ways against it, each a cold
start (a fresh limits cache): one process with the adaptive gate; --shards processes started together, each
`run --shard I/N --out OUT` (the shards share the endpoint's limit through OUT/.gate/); and the same shards with
--no-shared-gate (each adapts on its own, the peers' way). Goodput = correct answers per second of wall time,
from the first start to the last end. Repeated --repeat times, alternating; medians. Target (issue 18):
shared-gate shards' goodput within 10% of the single process's.
The machine is shared and noisy: compare the ratios printed in one run, not across runs.

Usage: python3 bench/shard_gate.py [--rows 1600] [--shards 4] [--repeat 3]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.path.join(ROOT, "evalharness.py")


def limit_steps(run_dir, info):
    """(start, end, [(t, limit)]) of a run directory: its gate's limit over time from events.jsonl."""
    steps, start, end = [], None, None
    with open(os.path.join(run_dir, "events.jsonl")) as fh:
        for ev in map(json.loads, fh):
            if ev["type"] == "run_start":
                start = ev["t"]
                steps.append((ev["t"], (info.get("concurrency") or {}).get("initial") or 0))
            elif ev["type"] == "limit":
                steps.append((ev["t"], ev["limit"]))
            elif ev["type"] == "run_end":
                end = ev["t"]
    return start, end, steps


def total_limit(runs):
    """p25, median, p75 of the sum of the runs' limits, sampled every 0.25 s while every run was running."""
    lo, hi = max(r[0] for r in runs), min(r[1] for r in runs)
    totals, t = [], lo
    while t <= hi:
        totals.append(sum(next((lim for ts, lim in reversed(steps) if ts <= t), 0) for _, _, steps in runs))
        t += 0.25
    if not totals:
        return "-"
    q = statistics.quantiles(totals, n=4) if len(totals) > 1 else [totals[0]] * 3
    return "%.0f/%.0f/%.0f" % (q[0], statistics.median(totals), q[2])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1600)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--decode-tok-s", type=float, default=100.0)
    ap.add_argument("--knee", type=int, default=12)
    ap.add_argument("--thrash", type=float, default=0.15)
    ap.add_argument("--reasoning-tokens", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="evalharness-shard-gate-")
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["EVALHARNESS_PROGRESS_S"] = "60"
    ds = os.path.join(tmp, "qa.jsonl")
    with open(ds, "w") as fh:
        for i in range(args.rows):
            fh.write(json.dumps({"id": "q%d" % i, "prompt": "What is %d plus %d?" % (i, i + 1),
                                 "answer": str(2 * i + 1), "scorer": "numeric"}) + "\n")
    mock = subprocess.Popen([sys.executable, MODULE, "serve-mock", "--port", "0", "--model", "mock", "--oracle", ds,
                             "--skill", "1", "--decode-tok-s", str(args.decode_tok_s), "--knee", str(args.knee),
                             "--thrash", str(args.thrash), "--reasoning-tokens", str(args.reasoning_tokens)],
                            stdout=subprocess.PIPE, universal_newlines=True, env=env)
    try:
        url = mock.stdout.readline().strip().rsplit(" ", 1)[-1]
        print("mock: %s  per-stream %.0f tok/s, knee %d, thrash %.2f, %d rows, %d shards"
              % (url, args.decode_tok_s, args.knee, args.thrash, args.rows, args.shards))

        def launch(out, extra, limits):
            cmd = [sys.executable, MODULE, "run", "--dataset", ds, "--model", "mock", "--base-url", url, "--out", out,
                   "--no-progress", "--json"] + extra
            return subprocess.Popen(cmd, env=dict(env, EVALHARNESS_LIMITS_FILE=limits), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, universal_newlines=True)

        def measure(label, shard_extra):
            out = os.path.join(tmp, label)
            limits = os.path.join(tmp, label + "-limits.json")
            t0 = time.monotonic()
            if shard_extra is None:
                procs = [launch(out, [], limits)]
                dirs = [out]
            else:
                procs = [launch(out, ["--shard", "%d/%d" % (i, args.shards)] + shard_extra, limits)
                         for i in range(args.shards)]
                dirs = [os.path.join(out, "shard-%d-of-%d" % (i, args.shards)) for i in range(args.shards)]
            for p in procs:
                _, err = p.communicate(timeout=1800)
                if p.returncode not in (0, 1):
                    sys.stderr.write(err[-2000:])
            wall = time.monotonic() - t0
            correct, limits_found, steps = 0, [], []
            for d in dirs:
                with open(os.path.join(d, "samples.jsonl")) as fh:
                    correct += sum(1 for line in fh if json.loads(line).get("score") == 1)
                with open(os.path.join(d, "run.json")) as fh:
                    info = json.load(fh)
                limits_found.append(info.get("discovered_limit"))
                steps.append(limit_steps(d, info))
            return correct / wall, wall, limits_found, total_limit(steps)

        rows = {"single": [], "shared": [], "separate": []}
        for r in range(args.repeat):
            for label, extra in (("single", None), ("shared", []), ("separate", ["--no-shared-gate"])):
                goodput, wall, limits, total = measure("%s-%d" % (label, r), extra)
                rows[label].append(goodput)
                print("%-8s run %d: goodput %6.1f correct/s  wall %6.1fs  limit in force (summed over the shards "
                      "while all ran) p25/median/p75 %s; discovered limit(s) at the end %s"
                      % (label, r, goodput, wall, total, limits), flush=True)
        single = statistics.median(rows["single"])
        for label in ("shared", "separate"):
            ratio = statistics.median(rows[label]) / single
            print("%s shards / single process goodput = %.3f (medians of %d)%s" % (
                label, ratio, args.repeat, ": %s (target >= 0.90)" % ("PASS" if ratio >= 0.9 else "FAIL")
                if label == "shared" else ""))
    finally:
        mock.terminate()
        mock.wait(10)
        shutil.rmtree(tmp, True)


if __name__ == "__main__":
    main()
