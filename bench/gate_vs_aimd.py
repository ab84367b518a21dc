#!/usr/bin/env python3
"""The refusal scenarios of bench/gate_sim.py (--quota, server Q) without the oracle sweeps: the adaptive gate and
the issue's AIMD (+1 a success at load, x0.9 an overload) on the same seeds, each its own workload. Prints per
scenario the median over seeds of AIMD's makespan / the gate's (above 1: the gate is faster), its lowest seed, and
the 429s (and 503s) of each. Seconds to run, where --quota's full table with sweeps takes about half an hour.

Usage: python3 bench/gate_vs_aimd.py [--seeds 10] [--scenarios SH-P4s,...] [--jobs 2]
"""
import argparse
import math
import multiprocessing
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gate_sim as g  # noqa: E402


def one(task):
    scen, prof, lim, seed = task
    r = g.run_one((scen, prof, lim, seed, None if scen == "S1" else 600.0, None, None))
    return task, r["makespan"], r["n429"] + r["n503"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--scenarios", default=",".join("%s-%s" % sp for sp in g.QUOTA_SCENARIOS))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    scens = [tuple(x.split("-")) for x in args.scenarios.split(",") if x]
    seeds = range(1, args.seeds + 1)
    tasks = [(s, p, lim, seed) for s, p in scens for lim in ("aimd", "adaptive") for seed in seeds]
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        by = {task: (m, n) for task, m, n in pool.map(one, tasks, chunksize=1)}
    ratios = []
    for s, p in scens:
        rs = [by[(s, p, "aimd", seed)][0] / by[(s, p, "adaptive", seed)][0] for seed in seeds]
        ratios += rs
        print("%-4s %-4s aimd/gate makespan %.3f (lowest seed %.3f)  429s gate %5d  aimd %5d" % (
            s, p, statistics.median(rs), min(rs), statistics.median(by[(s, p, "adaptive", x)][1] for x in seeds),
            statistics.median(by[(s, p, "aimd", x)][1] for x in seeds)))
    print("geometric mean %.4f over %d runs" % (math.exp(sum(math.log(r) for r in ratios) / len(ratios)), len(ratios)))


if __name__ == "__main__":
    main()
