#!/usr/bin/env python3
"""Reading Parquet with the module's own reader: time against JSONL (the same rows, the module's own reader) and
peak memory against one row group (issue 51's targets: Snappy at no worse than 5x JSONL's time; peak RSS bounded
by a row group, not the file). Run by hand, never by CI; pyarrow writes the files (a throwaway virtualenv):

    python3 -m venv /tmp/pq && /tmp/pq/bin/pip install pyarrow
    /tmp/pq/bin/python bench/parquet.py [--mb 100] [--groups 10] [--python python3]

The rows are benchmark-like (an id, a question of a few hundred characters, four choices, an integer answer, a
subject, a long reference solution), their text cut from this repository's README and module (English and code,
which Snappy halves): --mb of JSONL. Each read runs in a fresh interpreter (--python: the one users
run evalharness with) that iterates evalharness._iter_raw_rows over the file and reports its rows, wall time and
peak RSS above its start (VmHWM after the import's memory is returned and the peak reset; ru_maxrss would carry the
parent's); then load_dataset's time (every row read and validated) for JSONL, Snappy and ZSTD. The ratios are of
figures measured in this one run (the machine is shared and noisy).
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

READER = r"""
import ctypes, gc, sys, time
sys.path.insert(0, sys.argv[1])
import evalharness as eh

def status(key):  # kB
    with open("/proc/self/status") as fh:
        return int(next(line for line in fh if line.startswith(key + ":")).split()[1])

gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)  # what the module's import freed goes back to the system
with open("/proc/self/clear_refs", "w") as fh:  # and the peak so far is forgotten (VmHWM := VmRSS)
    fh.write("5")
base = status("VmRSS")
t0 = time.perf_counter()
n = chars = 0
if sys.argv[3] == "load":  # what a QA run does before its first request: every row read and validated
    eh.logging.getLogger("evalharness").setLevel(eh.logging.ERROR)
    n = eh.load_dataset(sys.argv[2]).count
else:
    for _where, row in eh._iter_raw_rows(sys.argv[2]):
        n += 1
        chars += len(row["question"])
took = time.perf_counter() - t0
print(n, chars, took, base, status("VmHWM"))
"""


def rows(target_bytes, seed=51):
    rnd = random.Random(seed)
    corpus = ""
    for name in ("README.md", "evalharness.py"):
        with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
            corpus += fh.read()

    def text(n):
        at = rnd.randrange(0, len(corpus) - n)
        return corpus[at:at + n]

    size, i = 0, 0
    while size < target_bytes:
        row = {"id": "q-%07d" % i, "question": text(rnd.randint(100, 700)),
               "choices": [text(rnd.randint(5, 50)) for _ in range(4)], "answer": rnd.randint(0, 3),
               "subject": rnd.choice(["algebra", "anatomy", "astronomy", "law", "virology"]),
               "solution": text(rnd.randint(300, 2000))}
        line = json.dumps(row)
        size += len(line) + 1
        i += 1
        yield row, line


def measure(python, path, mode="read"):
    """(rows, characters of the questions, seconds, RSS MB at the start, peak RSS MB) of one read in a fresh
    interpreter."""
    res = subprocess.run([python, "-c", READER, ROOT, path, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True, check=True)
    n, chars, took, base, peak = res.stdout.split()
    return int(n), int(chars), float(took), int(base) / 1024, int(peak) / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0, help="JSONL size of the rows, MB (default 100)")
    ap.add_argument("--groups", type=int, default=10, help="row groups per Parquet file (default 10)")
    ap.add_argument("--python", default="python3", help="the interpreter that reads (default python3)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="pq-bench-")
    try:
        jsonl = os.path.join(work, "rows.jsonl")
        table_rows = []
        with open(jsonl, "w") as fh:
            for row, line in rows(int(args.mb * 1e6)):
                fh.write(line + "\n")
                table_rows.append(row)
        table = pa.Table.from_pylist(table_rows)
        del table_rows
        per_group = -(-table.num_rows // args.groups)
        files = {"jsonl": jsonl}
        for codec in ("snappy", "zstd", "none"):
            files[codec] = os.path.join(work, "rows-%s.parquet" % codec)
            pq.write_table(table, files[codec], compression=codec, row_group_size=per_group)
        meta = pq.ParquetFile(files["snappy"]).metadata
        group_mb = max(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)) / 1e6
        print("%d rows; JSONL %.1f MB; Parquet row groups: %d of %d rows, the largest %.1f MB uncompressed" % (
            table.num_rows, os.path.getsize(jsonl) / 1e6, meta.num_row_groups, per_group, group_mb))
        print("reader: %s" % subprocess.run([args.python, "--version"], stdout=subprocess.PIPE,
                                            universal_newlines=True).stdout.strip())
        results = {}
        for name, path in files.items():
            results[name] = measure(args.python, path)
            n, chars, took, base, peak = results[name]
            print("  %-7s %9.1f MB on disk  %7d rows  %7.2f s  RSS %4.0f MB at the start, %4.0f MB at the peak" % (
                name, os.path.getsize(path) / 1e6, n, took, base, peak))
        ref = results["jsonl"]
        for name in ("snappy", "zstd", "none"):
            n, chars, took, base, peak = results[name]
            assert (n, chars) == ref[:2], (name, n, chars, ref[:2])
            print("%-6s time %.2fx JSONL's; peak RSS %.0f MB above the start = %.2fx the largest row group (%.2fx the "
                  "%.0f MB of rows)" % (name, took / ref[2], peak - base, (peak - base) / group_mb,
                                       (peak - base) / args.mb, args.mb))
        print("JSONL: peak RSS %.0f MB above the start (rows streamed)" % (ref[4] - ref[3]))
        loads = {name: measure(args.python, files[name], "load")[2] for name in ("jsonl", "snappy", "zstd")}
        print("load_dataset (every row read and validated, as a QA run does first): JSONL %.2f s, Snappy %.2f s "
              "(%.2fx), ZSTD %.2f s (%.2fx)" % (loads["jsonl"], loads["snappy"], loads["snappy"] / loads["jsonl"],
                                               loads["zstd"], loads["zstd"] / loads["jsonl"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
