#!/usr/bin/env python3
"""A run of --rows rows (default 1,000,000) against the mock, killed with -9 part way and resumed, then `report`; and
the same rows as two shards (run at once, or split from the run's records) then `merge`, and `report RUN MERGED`
(issue 39). Prints, for each step, its wall time and peak RSS, the store's append rate (rows/s while the run went),
the resume's scan time (from the second process's start to its line "resuming OUT: N of M samples kept"), and the
RSS per row above the fixed base (`--version`: the interpreter and the module). Each peak RSS is the command's own:
it starts from overhead.Measured's small launcher (a child started from this process would carry this process's
high-water RSS, and this process holds the split run's ids). Run by hand (a million rows take about half an hour
against the mock on 2 cores), never by CI.

Usage: python3 bench/million.py [--rows 1000000] [--reply-tokens 64] [--concurrency 8] [--kill-at 0.5] [--no-shards]
       [--split-shards] [--from-run RUN_DIR]
Targets (issue 39): `report` and `merge` peak RSS at 1M rows <= 1.2x their 100k figure and < 200 MB; the run with its
end-of-run report <= 1 KB per row above the fixed base.
The machine is shared and noisy: compare figures from one run of this script, not across runs.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from overhead import MODULE, Measured, measure, write_rows  # noqa: E402


def count_lines(path):
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1000000)
    ap.add_argument("--reply-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--kill-at", type=float, default=0.5, help="kill -9 the run once this share of rows is stored")
    ap.add_argument("--no-shards", action="store_true", help="skip the two-shard run and its merge")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--split-shards", action="store_true",
                    help="make the two shards by splitting the finished run's records by shard (the files two shard "
                         "processes write) instead of running them: merge's figures without a second run's time")
    ap.add_argument("--from-run", metavar="RUN_DIR",
                    help="a finished run of --rows rows made by this script: only split it into two shards "
                         "(--split-shards is implied), merge them and compare")
    args = ap.parse_args()
    if args.from_run:
        args.split_shards = True  # (there is no run command to run the shards with)
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        _, _, base, _ = measure([sys.executable, MODULE, "--version"], env)
        print("rows %d; fixed base (--version) peak RSS %.1f MB" % (args.rows, base))
        tmp = tempfile.mkdtemp(prefix="evalharness-million-merge-")
        try:
            merge_step(args, args.from_run, os.path.join(tmp, "sharded"), None, env, base)
        finally:
            shutil.rmtree(tmp, True)
        return
    tmp = tempfile.mkdtemp(prefix="evalharness-million-")
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["EVALHARNESS_PROGRESS_S"] = "60"
    env["EVALHARNESS_LIMITS_FILE"] = os.path.join(tmp, "limits.json")
    mock = subprocess.Popen([sys.executable, MODULE, "serve-mock", "--port", "0", "--model", "m",
                             "--reasoning-tokens", str(args.reply_tokens)], stdout=subprocess.PIPE,
                            universal_newlines=True, env=env)
    try:
        url = mock.stdout.readline().strip().rsplit(" ", 1)[-1]
        ds = os.path.join(tmp, "qa.jsonl")
        write_rows(ds, args.rows)
        _, _, base, _ = measure([sys.executable, MODULE, "--version"], env)
        print("rows %d, reply tokens %d, concurrency %d; fixed base (--version) peak RSS %.1f MB"
              % (args.rows, args.reply_tokens, args.concurrency, base))
        out = os.path.join(tmp, "run")
        run = [sys.executable, MODULE, "run", "--dataset", ds, "--model", "m", "--base-url", url, "--out", out,
               "--fixed-concurrency", str(args.concurrency), "--max-tokens", str(args.reply_tokens)]
        # 1. the run, killed with -9 once --kill-at of the rows are stored
        samples = os.path.join(out, "samples.jsonl")
        t0 = time.monotonic()
        first = subprocess.Popen(run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        seen, offset = 0, 0  # lines counted as the file grows (not the whole file every time)
        while first.poll() is None:
            time.sleep(2)
            if os.path.exists(samples):
                with open(samples, "rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
                cut = chunk.rfind(b"\n") + 1
                seen += chunk[:cut].count(b"\n")
                offset += cut
                if seen >= args.kill_at * args.rows:
                    break
        first.send_signal(signal.SIGKILL)
        first.wait()
        t_kill = time.monotonic() - t0
        n_first = count_lines(samples)
        print("first process: %d rows stored in %.1f s (%.0f rows/s appended), then kill -9"
              % (n_first, t_kill, n_first / t_kill))
        # 2. the same command resumes: the scan until its first line, then the rest
        t0 = time.monotonic()
        second = Measured(run, env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, universal_newlines=True)
        line = ""
        while line is not None and "resuming " not in line:  # "resuming OUT: N of M samples kept"
            line = second.proc.stderr.readline() or None
        scan = time.monotonic() - t0
        rest = second.proc.stderr.read()
        code, _, rss, _ = second.wait()
        wall = time.monotonic() - t0
        n_all = count_lines(samples)
        print("resume: the scan of the stored rows took %.1f s (%s)" % (scan, (line or "?").strip()[:140]))
        print("resumed run with its end-of-run report: %.1f s, %d rows appended (%.0f rows/s), peak RSS %.1f MB = "
              "%.2f KB per row above the base, exit %d" % (wall, n_all - n_first, (n_all - n_first) / wall, rss,
                                                          (rss - base) * 1024 / args.rows, code))
        if code:
            sys.stderr.write(rest[-2000:])
        # 3. report
        for label, extra in (("report", []), ("report --json", ["--json"]), ("report --html", ["--html"])):
            wall, _, rss, rc = measure([sys.executable, MODULE, "report", out] + extra, env)
            print("%-16s %7.1f s, peak RSS %7.1f MB (%.2f KB per row above the base), exit %d"
                  % (label + ":", wall, rss, (rss - base) * 1024 / args.rows, rc))
        if args.no_shards:
            return
        # 4. two shards, then merge
        merge_step(args, out, os.path.join(tmp, "sharded"), run, env, base)
    finally:
        mock.terminate()
        mock.wait(10)
        if args.keep:
            print("kept", tmp)
        else:
            shutil.rmtree(tmp, True)


def split_run(run_dir, sharded, count=2):
    """The shards a --shard I/COUNT run of the same rows writes, made from a finished run: its records by
    shard_of(id), its run.json with the shard's part (ids, shard block)."""
    sys.path.insert(0, ROOT)
    import evalharness as eh
    with open(os.path.join(run_dir, "run.json"), encoding="utf-8") as fh:
        info = json.load(fh)
    dirs = [os.path.join(sharded, "shard-%d-of-%d" % (i, count)) for i in range(count)]
    files = []
    for d in dirs:
        os.makedirs(d)
        files.append(open(os.path.join(d, "samples.jsonl"), "w", encoding="utf-8"))
    with open(os.path.join(run_dir, "samples.jsonl"), encoding="utf-8") as fh:
        for line in fh:
            files[eh.shard_of(json.loads(line)["id"], count)].write(line)
    for f in files:
        f.close()
    ids = info["dataset"]["ids"]
    for i, d in enumerate(dirs):
        mine = [x for x in ids if eh.shard_of(x, count) == i]
        part = dict(info, dataset=dict(info["dataset"], ids=mine),
                    shard={"index": i, "count": count, "samples": len(mine), "samples_total": len(ids),
                           "slurm_job": None, "host": "split"})
        with open(os.path.join(d, "run.json"), "w", encoding="utf-8") as fh:
            json.dump(part, fh, indent=2, sort_keys=True)


def merge_step(args, out, sharded, run, env, base):
    if args.split_shards:
        t0 = time.monotonic()
        split_run(out, sharded)
        print("two shards split from the run's records in %.1f s (not run again)" % (time.monotonic() - t0))
    else:
        t0 = time.monotonic()
        procs = [Measured([a if a != out else sharded for a in run] + ["--shard", "%d/2" % i], env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in (0, 1)]
        for i, p in enumerate(procs):  # (at once, as the tasks of a Slurm array)
            code, _, rss, _ = p.wait()
            print("shard %d of 2 (both at once): %.1f s, peak RSS %.1f MB, exit %d"
                  % (i, time.monotonic() - t0, rss, code))
    wall, _, rss, rc = measure([sys.executable, MODULE, "merge", sharded], env)
    print("merge:           %7.1f s, peak RSS %7.1f MB (%.2f KB per row above the base), exit %d"
          % (wall, rss, (rss - base) * 1024 / args.rows, rc))
    # 5. the run against its merged shards (the same records): `report A B`
    wall, _, rss, rc = measure([sys.executable, MODULE, "report", out, sharded, "--json"], env)
    print("report A B:      %7.1f s, peak RSS %7.1f MB (%.2f KB per row above the base), exit %d"
          % (wall, rss, (rss - base) * 1024 / args.rows, rc))


if __name__ == "__main__":
    main()
