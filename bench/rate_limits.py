#!/usr/bin/env python3
"""evalharness against the mock acting as a hosted API with quotas (issue 38; run by hand, never by CI).

`serve-mock --rate-limit RPM,TPM --rate-schedule ...` in a process of its own: token buckets of requests and tokens
a minute, x-ratelimit-* headers on every reply, 429 with Retry-After past them, the quota halved and restored
mid-run. For each setting (fixed concurrency 1 ... 32 with --rate-headers ignore, as a plain client; the adaptive
gate, which follows the headers through its rate pacer; the adaptive gate ignoring them) a fresh mock and one run of the same QA rows: wall time (first request to last answer), the 429s
the mock sent, and the ratio of each wall to the best fixed one. Settings run in an order shuffled per round.

Usage: python3 bench/rate_limits.py [--rpm 120] [--tpm 40000] [--rows 200] [--schedule 10:0.5,30:1]
       [--sweep 1,2,4,8,16,32] [--rounds 1]
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
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.support import qa_rows, write_jsonl  # noqa: E402

MODULE = os.path.join(ROOT, "evalharness.py")


def mock(dataset, args):
    proc = subprocess.Popen([sys.executable, MODULE, "serve-mock", "--port", "0", "--model", "m", "--oracle", dataset,
                             "--rate-limit", "%g,%g" % (args.rpm, args.tpm), "--rate-schedule", args.schedule,
                             "--ttft-ms", "300", "--decode-tok-s", "50"], stdout=subprocess.PIPE,
                            universal_newlines=True)
    return proc, proc.stdout.readline().strip().rsplit(" ", 1)[-1]


def one(dataset, tmp, label, gate_args, args):
    proc, url = mock(dataset, args)
    try:
        out = os.path.join(tmp, label)
        res = subprocess.run([sys.executable, MODULE, "run", "--dataset", dataset, "--model", "m", "--base-url", url,
                              "--out", out, "--no-progress", "--max-tokens", "32"] + gate_args,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, universal_newlines=True)
        with urllib.request.urlopen(url.replace("/v1", "") + "/stats", timeout=10) as resp:
            counters = json.loads(resp.read().decode())["counters"]
    finally:
        proc.terminate()
        proc.wait()
    recs = [json.loads(line) for line in open(os.path.join(out, "samples.jsonl"))]
    t0 = min(r["finished_at"] - (r.get("latency_s") or 0) for r in recs)
    wall = max(r["finished_at"] for r in recs) - t0
    return {"rc": res.returncode, "wall": wall, "n429": counters.get("rate_limited", 0), "rows": len(recs),
            "err": res.stderr.strip().splitlines()[-1:] if res.returncode else []}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rpm", type=float, default=120)
    ap.add_argument("--tpm", type=float, default=40000)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--schedule", default="10:0.5,30:1")
    ap.add_argument("--sweep", default="1,2,4,8,16,32")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="evalharness-rates-")
    try:
        dataset = write_jsonl(os.path.join(tmp, "qa.jsonl"), qa_rows(args.rows))
        # the fixed settings as a plain client would run them: 429s and Retry-After only (--rate-headers ignore)
        settings = [("fixed%s" % c, ["--fixed-concurrency", c, "--rate-headers", "ignore"])
                    for c in args.sweep.split(",")] + [("adaptive", []), ("adaptive-ignore", ["--rate-headers", "ignore"])]
        results = {name: [] for name, _ in settings}
        for rnd in range(args.rounds):
            order = list(settings)
            random.Random(rnd).shuffle(order)
            for name, gate_args in order:
                r = one(dataset, tmp, "%s-%d" % (name, rnd), gate_args, args)
                results[name].append(r)
                print("round %d %-10s rc=%d wall %.1f s, 429s %d%s" % (rnd, name, r["rc"], r["wall"], r["n429"],
                      " " + " ".join(r["err"]) if r["err"] else ""), flush=True)
        med = {n: sorted(x["wall"] for x in rs)[len(rs) // 2] for n, rs in results.items()}
        # a run that gave up samples (their retries spent on 429s) is not a whole run: its wall is not comparable
        whole = {n for n, rs in results.items() if all(x["rc"] == 0 and x["rows"] == args.rows for x in rs)}
        fixed = [n for n in med if n.startswith("fixed") and n in whole]
        best = min(fixed, key=lambda n: med[n]) if fixed else None
        print("\nquota %g requests, %g tokens a minute, schedule %s; %d rows; medians over %d round(s)"
              % (args.rpm, args.tpm, args.schedule, args.rows, args.rounds))
        for n in med:
            print("%-16s wall %6.1f s  %s  429s %s" % (
                n, med[n], ("(%.3fx the best whole fixed, %s)" % (med[n] / med[best], best)) if n in whole and best
                else "(INCOMPLETE: samples failed after their retries)" if n not in whole else "",
                [x["n429"] for x in results[n]]))
    finally:
        shutil.rmtree(tmp, True)


if __name__ == "__main__":
    main()
