#!/usr/bin/env python3
"""Log-likelihood throughput against the mock (run by hand, never by CI): `--task choice` on generated arc rows
(4 choices each) against `serve-mock` in a process of its own, with and without its tokenizer endpoint. Prints rows
per second, requests per row (completions and tokenize, from the mock's counters) and the harness's CPU per request
(this process's CPU time over the requests it made; goal <= 1 ms), per prompt scored (a completions request carries
a row's choices together where the server takes a list), and beside them the floor: the CPU of a bare urllib POST
to the same mock in one thread (urllib opens a connection a request; most of the harness's CPU is that).

Usage: python3 bench/loglik.py [--rows 2000] [--fewshot 0]
"""
import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import evalharness as eh  # noqa: E402

WORDS = "the a cat dog sat ran over under blue green quickly slowly house river tree stone light dark".split()


def rows(n):
    out = []
    for i in range(n):
        pick = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(12)]
        out.append({"id": "r%d" % i, "question": "Row %d: which of these follows %s %s?" % (i, pick[0], pick[1]),
                    "choices": {"text": [" ".join(pick[2:3 + k]) for k in range(4)], "label": ["A", "B", "C", "D"]},
                    "answerKey": "ABCD"[i % 4]})
    return out


def mock(tokenizer):
    args = [sys.executable, os.path.join(ROOT, "evalharness.py"), "serve-mock", "--port", "0", "--model", "m"]
    proc = subprocess.Popen(args + ([] if tokenizer else ["--no-tokenizer"]), stdout=subprocess.PIPE,
                            universal_newlines=True)
    line = proc.stdout.readline().strip()
    return proc, line.rsplit(" ", 1)[-1]


def counters(url):
    with urllib.request.urlopen(url.replace("/v1", "") + "/stats", timeout=10) as resp:
        return json.loads(resp.read().decode())["counters"]


def bare_urllib_cpu(url, n=1000):
    """CPU seconds of one plain urllib POST (a short text to /tokenize, the reply parsed), in one thread."""
    body = json.dumps({"model": "m", "prompt": "Question: which of these follows the cat? Answer: blue"}).encode()
    target = url.replace("/v1", "") + "/tokenize"
    c0 = time.process_time()
    for _ in range(n):
        req = urllib.request.Request(target, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            json.loads(resp.read().decode())
    return (time.process_time() - c0) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--fewshot", type=int, default=0)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="evalharness-loglik-")
    try:
        path = os.path.join(tmp, "arc.jsonl")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in rows(args.rows)))
        proc, url = mock(True)
        try:
            floor = bare_urllib_cpu(url)
        finally:
            proc.terminate()
            proc.wait()
        print("floor: a bare urllib POST to the mock's /tokenize in one thread: %.2f ms CPU" % (1000 * floor),
              flush=True)
        for tokenizer in (True, False):
            proc, url = mock(tokenizer)
            try:
                cfg = eh.RunConfig(dataset=path, model="m", base_url=url, task="choice",
                                   out=os.path.join(tmp, "run-%s" % tokenizer), progress=False, json_out=True,
                                   remember_limit=False, options=eh.ChoiceOptions(num_fewshot=args.fewshot))
                before = counters(url)
                t0, c0 = time.monotonic(), time.process_time()
                code, _ = eh.run_evaluation(cfg, stdout=io.StringIO())
                wall, cpu = time.monotonic() - t0, time.process_time() - c0
                after = counters(url)
            finally:
                proc.terminate()
                proc.wait()
            done = {k: after.get(k, 0) - before.get(k, 0) for k in ("completions", "tokenize")}
            requests = done["completions"] + done["tokenize"]
            prompts = args.rows * 4 + done["tokenize"]  # the choices scored, and each text tokenized
            print("%s: exit %d, %d rows in %.1f s: %.0f rows/s; per row %.2f completions + %.2f tokenize requests; "
                  "harness CPU %.2f ms a request (%.1fx the floor), %.2f ms a prompt (%.1f s over %d requests)"
                  % ("with /tokenize" if tokenizer else "offsets (no tokenizer)", code, args.rows, wall,
                     args.rows / wall, done["completions"] / args.rows, done["tokenize"] / args.rows,
                     1000 * cpu / max(1, requests), cpu / max(1, requests) / floor, 1000 * cpu / prompts, cpu,
                     requests), flush=True)
    finally:
        shutil.rmtree(tmp, True)


if __name__ == "__main__":
    main()
