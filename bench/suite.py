#!/usr/bin/env python3
"""A suite against running its benchmarks one after another (issue 50), on the mock with a capacity knee.

The mock runs as its own process (`serve-mock` with a per-stream speed, a knee past which streams slow down, a time
to first token), answering QA rows from an oracle and BFCL rows; six benchmarks of four kinds and different sizes
(three QA sets, a multiple-choice set by log-likelihood, BFCL tool calls, HumanEval-style code in the local sandbox)
run (a) as one `suite` (one process, one gate for the endpoint) and (b) as six `run` commands one after another,
then (c) one QA `run` of as many requests as the suite makes. Each command starts from bench/overhead.py's launcher,
which reports that command's own peak RSS. Prints wall(a) / wall(b) (target <= 0.75), wall(a) / wall(c) (target
<= 1.10) and the suite's peak RSS against the largest benchmark run alone (target <= 1.5x).

Usage: python3 bench/suite.py [--scale 1.0] [--decode-tok-s 60] [--knee 24] [--keep DIR]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead import Measured  # noqa: E402

MODULE = os.path.join(ROOT, "evalharness.py")


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    return path


def qa(prefix, n):
    return [{"id": "%s%d" % (prefix, i), "prompt": "%s: what is %d plus %d?" % (prefix, i, i + 1),
             "answer": str(2 * i + 1), "scorer": "numeric", "category": prefix} for i in range(n)]


def choice(n):
    return [{"question": "Which number is %d?" % i, "subject": "numbers", "choices": [str(i), str(i + 1), str(i + 2),
                                                                                       str(i + 3)], "answer": 0}
            for i in range(n)]


def bfcl(n):
    fn = {"name": "calc.add", "description": "Add two integers.", "parameters": {"type": "dict", "properties": {
        "a": {"type": "integer", "description": "a"}, "b": {"type": "integer", "description": "b"}},
        "required": ["a", "b"]}}
    qs = [{"id": "simple_python_%d" % i, "question": [[{"role": "user", "content": "Add %d and %d." % (i, i + 2)}]],
           "function": [fn]} for i in range(n)]
    answers = [{"id": q["id"], "ground_truth": [{"calc.add": {"a": [i], "b": [i + 2]}}]} for i, q in enumerate(qs)]
    return qs, answers


def code(n):
    return [{"task_id": "B/%d" % i, "prompt": "def f%d(x: int) -> int:\n    \"\"\"Return x plus %d.\"\"\"\n" % (i, i),
             "canonical_solution": "    return x + %d\n" % i,
             "test": "\n\ndef check(candidate):\n    assert candidate(1) == %d\n" % (1 + i), "entry_point": "f%d" % i}
            for i in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="benchmark sizes times this (default 1)")
    ap.add_argument("--decode-tok-s", type=float, default=60.0)
    ap.add_argument("--knee", type=int, default=24)
    ap.add_argument("--keep", default=None, metavar="DIR", help="work here and keep it (default: a temp dir)")
    args = ap.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="evalharness-suite-bench-")
    os.makedirs(work, exist_ok=True)
    size = lambda n: max(4, int(n * args.scale))  # noqa: E731
    sets = {"qa_large": qa("large", size(600)), "qa_medium": qa("medium", size(250)), "qa_small": qa("small", size(60))}
    for name, rows in sets.items():
        write_jsonl(os.path.join(work, name + ".jsonl"), rows)
    write_jsonl(os.path.join(work, "mmlu.jsonl"), choice(size(200)))
    qs, answers = bfcl(size(150))
    os.makedirs(os.path.join(work, "possible_answer"), exist_ok=True)
    write_jsonl(os.path.join(work, "BFCL_v4_simple_python.json"), qs)
    write_jsonl(os.path.join(work, "possible_answer", "BFCL_v4_simple_python.json"), answers)
    write_jsonl(os.path.join(work, "he.jsonl"), code(size(80)))
    oracle = write_jsonl(os.path.join(work, "oracle.jsonl"), [r for rows in sets.values() for r in rows])
    mock = subprocess.Popen([sys.executable, MODULE, "serve-mock", "--oracle", oracle, "--tools",
                             os.path.join(work, "BFCL_v4_simple_python.json"), "--decode-tok-s",
                             str(args.decode_tok_s), "--knee", str(args.knee), "--thrash", "0.05", "--ttft-ms", "150",
                             "--model", "m"], stdout=subprocess.PIPE, universal_newlines=True)
    try:
        url = mock.stdout.readline().rsplit(" ", 1)[-1].strip()
        benches = [("qa_large", "qa", "qa_large.jsonl", {}), ("mmlu", "choice", "mmlu.jsonl", {}),
                   ("qa_medium", "qa", "qa_medium.jsonl", {}), ("bfcl", "tools", "BFCL_v4_simple_python.json", {}),
                   ("humaneval", "code", "he.jsonl", {"sandbox": "local"}), ("qa_small", "qa", "qa_small.jsonl", {})]
        toml = ['name = "bench"', 'model = "m"', 'base_url = "%s"' % url, 'out = "suite-out"', "[defaults]",
                "max_tokens = 64"]
        for name, task, data, extra in benches:
            toml += ["[[benchmark]]", 'name = "%s"' % name, 'task = "%s"' % task, 'dataset = "%s"' % data]
            toml += ['%s = "%s"' % kv for kv in extra.items()]
        with open(os.path.join(work, "bench.toml"), "w") as fh:
            fh.write("\n".join(toml) + "\n")
        env = dict(os.environ, EVALHARNESS_LIMITS_FILE=os.path.join(work, "limits.json"))

        def timed(cmd):
            m = Measured(cmd, env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            code_, cpu, rss, wall = m.wait()
            if code_ != 0:
                raise SystemExit("failed (exit %d): %s" % (code_, " ".join(cmd)))
            return wall, rss

        suite_wall, suite_rss = timed([sys.executable, MODULE, "suite", "bench.toml", "--no-progress"])
        seq_wall, largest_rss, n_requests = 0.0, 0.0, 0
        for name, task, data, extra in benches:
            cmd = [sys.executable, MODULE, "run", "--task", task, "--dataset", data, "--model", "m", "--base-url", url,
                   "--out", "seq/" + name, "--no-progress"]
            if task in ("qa", "code", "tools"):
                cmd += ["--max-tokens", "64"]
            for k, v in extra.items():
                cmd += ["--" + k.replace("_", "-"), v]
            wall, rss = timed(cmd)
            seq_wall += wall
            largest_rss = max(largest_rss, rss)
            with open(os.path.join(work, "seq", name, "summary.json")) as fh:
                n_requests += json.load(fh)["counts"]["total"]
        write_jsonl(os.path.join(work, "qa_all.jsonl"), [dict(r, id="all%d" % i) for i, r in enumerate(
            r for rows in sets.values() for r in rows * 3)][:n_requests])
        one_wall, _ = timed([sys.executable, MODULE, "run", "--dataset", "qa_all.jsonl", "--model", "m", "--base-url",
                             url, "--out", "one", "--no-progress", "--max-tokens", "64"])
        print("six benchmarks, %d requests (%s)" % (n_requests, ", ".join(
            "%s %s" % (b[0], b[1]) for b in benches)))
        print("suite: %.1f s, peak RSS %.1f MB" % (suite_wall, suite_rss))
        print("one after another: %.1f s (the largest benchmark alone: peak RSS %.1f MB)" % (seq_wall, largest_rss))
        print("one QA run of %d requests: %.1f s" % (n_requests, one_wall))
        print("wall(suite) / wall(one after another) = %.3f (target <= 0.75)" % (suite_wall / seq_wall))
        print("wall(suite) / wall(one QA run) = %.3f (target <= 1.10)" % (suite_wall / one_wall))
        print("peak RSS suite / largest alone = %.2f (target <= 1.5)" % (suite_rss / largest_rss))
    finally:
        mock.terminate()
        mock.wait(10)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
