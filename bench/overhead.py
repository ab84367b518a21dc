#!/usr/bin/env python3
"""Harness overhead: samples/s and harness-process CPU ms per sample through the whole path (client, runner,
scoring, store), against `serve-mock` in another process with zero latency; and peak RSS for a 100,000-row run.

Usage: python3 bench/overhead.py [--samples 3000] [--rss-rows 100000] [--concurrency 8] [--reply-tokens 64]
                                 [--base-url URL --model NAME]
Targets (issues 2 and 22): <= 2 ms harness CPU per sample, streamed or not (a bare urllib POST loop costs ~0.5 ms
here); peak RSS for 100,000 rows < 150 MB. Each reply carries --reply-tokens tokens (the mock streams one event per
token, as llama.cpp and vLLM do; they go out as reasoning_content, which the client reads on the same path as
content). --base-url measures against a real server instead (e.g. llama-server; --max-tokens = --reply-tokens).
The machine is shared and noisy: compare the ratios printed in one run, not across runs.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.path.join(ROOT, "evalharness.py")

BARE_LOOP = r"""
import json, sys, urllib.request
url, n, model, max_tokens = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
body = json.dumps({"model": model, "messages": [{"role": "user", "content": "What is 1 plus 2?"}],
                   "max_tokens": max_tokens}).encode()
for _ in range(n):
    req = urllib.request.Request(url + "/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with opener.open(req, timeout=30) as resp:
        json.loads(resp.read())
"""


# A child's peak RSS read by the process that started it is not the child's own: subprocess starts children with
# vfork (3.10+) or fork, and Linux keeps the starting process's high-water RSS in the child's (exec records the old
# mm's peak; measured here: `--version` read 181 MB from a 181 MB bench). So each measured command starts from this
# small launcher, which reports its own child's figures in a file: a bench that holds a million ids measures the
# command, not itself.
LAUNCHER = r"""
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as fh:
    fh.write("%d %r %r" % (usage.ru_maxrss, usage.ru_utime, usage.ru_stime))
sys.exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
"""


class Measured:
    """A command started through LAUNCHER (Popen's keywords pass through: stdout, stderr, universal_newlines);
    ``wait()`` -> (exit code, CPU s of the command, its peak RSS MB, wall s since the start)."""

    def __init__(self, cmd, env=None, **popen_kw):
        fd, self.path = tempfile.mkstemp(prefix="evalharness-rusage-")
        os.close(fd)
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, self.path] + list(cmd), env=env, **popen_kw)
        self.pid = self.proc.pid

    def wait(self):
        _, status, _ = os.wait4(self.proc.pid, 0)
        wall = time.monotonic() - self.t0
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        try:
            with open(self.path) as fh:
                maxrss, utime, stime = fh.read().split()
        except (OSError, ValueError):  # the launcher itself died
            maxrss, utime, stime = "0", "0", "0"
        finally:
            os.unlink(self.path)
        return code, float(utime) + float(stime), int(maxrss) / 1024.0, wall


def measure(cmd, env=None):
    """Run cmd; return (wall s, CPU s of the child, peak RSS MB of the child, exit code)."""
    run = Measured(cmd, env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = run.proc.stderr.read().decode("utf-8", "replace")  # (read as it comes: a full pipe would stall it)
    run.proc.stderr.close()
    code, cpu, rss, wall = run.wait()
    if code:
        sys.stderr.write(err[-2000:])
    return wall, cpu, rss, code


def write_rows(path, n):
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": "q%d" % i, "prompt": "What is %d plus %d?" % (i, i + 1),
                                 "answer": str(2 * i + 1), "scorer": "numeric",
                                 "category": ("a", "b", "c")[i % 3]}) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--rss-rows", type=int, default=100000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--reply-tokens", type=int, default=64)
    ap.add_argument("--base-url", default=None, help="a real server to measure against instead of the mock")
    ap.add_argument("--model", default="m")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="evalharness-bench-")
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["EVALHARNESS_PROGRESS_S"] = "30"
    mock = subprocess.Popen([sys.executable, MODULE, "serve-mock", "--port", "0", "--model", args.model,
                             "--reasoning-tokens", str(args.reply_tokens)], stdout=subprocess.PIPE,
                            universal_newlines=True, env=env)
    try:
        url = mock.stdout.readline().strip().rsplit(" ", 1)[-1]
        if args.base_url:
            url = args.base_url
        n = args.samples
        ds = os.path.join(tmp, "qa.jsonl")
        write_rows(ds, n)
        wall_b, cpu_b, _, _ = measure([sys.executable, "-c", BARE_LOOP, url, str(n), args.model, str(args.reply_tokens)], env)
        cpu_b_ms = 1000 * cpu_b / n
        print("bare urllib POST loop:   %7.1f req/s   %6.3f ms CPU per request" % (n / wall_b, cpu_b_ms))
        results = {}
        for label, extra in (("harness (streaming)", []), ("harness (--no-stream)", ["--no-stream"])):
            out = os.path.join(tmp, "run-" + str(len(results)))
            wall, cpu, rss, rc = measure([sys.executable, MODULE, "run", "--dataset", ds, "--model", args.model,
                                          "--base-url", url, "--out", out, "--fixed-concurrency", str(args.concurrency),
                                          "--no-progress", "--max-tokens", str(args.reply_tokens)] + extra, env)
            # startup (interpreter + module import) is paid once per run, not per sample: measure it separately
            results[label] = (wall, cpu)
            print("%-24s %7.1f samples/s %6.3f ms CPU per sample (%.1fx the bare loop), exit %d"
                  % (label + ":", n / wall, 1000 * cpu / n, (1000 * cpu / n) / cpu_b_ms, rc))
        _, cpu_start, _, _ = measure([sys.executable, MODULE, "--version"], env)
        print("interpreter start + import: %.0f ms CPU (once per run)" % (1000 * cpu_start))
        for label, (wall, cpu) in results.items():
            print("%-24s %6.3f ms CPU per sample without the start-up" % (label + ":", 1000 * (cpu - cpu_start) / n))
        if args.base_url:
            return
        rows = args.rss_rows
        big = os.path.join(tmp, "big.jsonl")
        write_rows(big, rows)
        print("dataset of %d rows: %.1f MB on disk" % (rows, os.path.getsize(big) / 1e6))
        out = os.path.join(tmp, "run-big")
        wall, cpu, rss, rc = measure([sys.executable, MODULE, "run", "--dataset", big, "--model", "m",
                                      "--base-url", url, "--out", out, "--fixed-concurrency", str(args.concurrency),
                                      "--no-progress", "--no-stream"], env)
        print("%d-row run: peak RSS %.1f MB, %.1f samples/s, %.3f ms CPU per sample, exit %d"
              % (rows, rss, rows / wall, 1000 * cpu / rows, rc))
    finally:
        mock.terminate()
        mock.wait(10)
        shutil.rmtree(tmp, True)


if __name__ == "__main__":
    main()
