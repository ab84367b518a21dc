#!/usr/bin/env python3
"""evalharness against the mock acting as a hosted API that refuses (issues 38 and 54; run by hand, never by CI).

--mode rate (default): `serve-mock --rate-limit RPM,TPM --rate-schedule ...` in a process of its own: token buckets
of requests and tokens a minute, x-ratelimit-* headers on every reply, 429 with Retry-After past them, the quota
halved and restored mid-run. --mode cap: `serve-mock --max-concurrency N --retry-after S` (S 0: no Retry-After), a
hard cap on streams answered 429, no quota. For each setting (fixed concurrency ... with --rate-headers ignore, as
a plain client; the adaptive gate, which in rate mode follows the headers through its rate pacer; the adaptive gate
ignoring them; the reference rule --limit-rule aimd through the same gate, ignoring them) a fresh mock and one run
of the same QA rows: wall time (first request to last answer), the 429s the mock sent, and the ratio of each wall
to the best fixed one. Settings run in an order shuffled per round. The checks (issue 54): the adaptive gate that
ignores the headers (or, in cap mode, has none) within 1.10x the best whole fixed wall, and no slower than aimd.

Usage: python3 bench/rate_limits.py [--mode rate|cap] [--rpm 120] [--tpm 40000] [--rows 200]
       [--schedule 10:0.5,30:1] [--cap 8] [--retry-after 1] [--sweep 1,2,4,8,16,32] [--rounds 1]
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
    limits = (["--rate-limit", "%g,%g" % (args.rpm, args.tpm), "--rate-schedule", args.schedule]
              if args.mode == "rate" else ["--max-concurrency", str(args.cap), "--retry-after", "%g" % args.retry_after])
    proc = subprocess.Popen([sys.executable, MODULE, "serve-mock", "--port", "0", "--model", "m", "--oracle", dataset,
                             "--ttft-ms", "300", "--decode-tok-s", "50"] + limits, stdout=subprocess.PIPE,
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
        counters["rate_limited"] = counters.get("rate_limited", 0) + counters.get("over_cap", 0)
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
    ap.add_argument("--mode", choices=("rate", "cap"), default="rate")
    ap.add_argument("--cap", type=int, default=8, help="cap mode: the mock's --max-concurrency")
    ap.add_argument("--retry-after", type=float, default=1.0, help="cap mode: its Retry-After (0: none)")
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
        ignore = ["--rate-headers", "ignore"]
        settings = [("fixed%s" % c, ["--fixed-concurrency", c] + ignore) for c in args.sweep.split(",")]
        settings += [("adaptive", [])] if args.mode == "rate" else []
        settings += [("adaptive-ignore", ignore), ("aimd-ignore", ["--limit-rule", "aimd"] + ignore)]
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
        if args.mode == "rate":
            print("\nquota %g requests, %g tokens a minute, schedule %s; %d rows; medians over %d round(s)"
                  % (args.rpm, args.tpm, args.schedule, args.rows, args.rounds))
        else:
            print("\ncap of %d streams, 429 %s; %d rows; medians over %d round(s)" % (
                args.cap, "with Retry-After %g s" % args.retry_after if args.retry_after > 0 else "without Retry-After",
                args.rows, args.rounds))
        for n in med:
            print("%-16s wall %6.1f s  %s  429s %s" % (
                n, med[n], ("(%.3fx the best whole fixed, %s)" % (med[n] / med[best], best)) if n in whole and best
                else "(INCOMPLETE: samples failed after their retries)" if n not in whole else "",
                [x["n429"] for x in results[n]]))
        gate = "adaptive-ignore"
        if best and gate in whole:
            ratio = med[gate] / med[best]
            print("%s / best fixed = %.3f (target <= 1.10): %s" % (gate, ratio, "PASS" if ratio <= 1.10 else "FAIL"))
        if gate in whole and "aimd-ignore" in med:
            ratio = med[gate] / med["aimd-ignore"]
            print("%s / aimd-ignore = %.3f (target <= 1.00, the same gate with the reference rule): %s"
                  % (gate, ratio, "PASS" if ratio <= 1.0 else "FAIL"))
    finally:
        shutil.rmtree(tmp, True)


if __name__ == "__main__":
    main()
