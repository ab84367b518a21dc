#!/usr/bin/env python3
"""Harbor's own task templates through evalharness's task reader (issue 36; run by hand, never by CI).

Downloads the PyPI wheel of `harbor` (default 0.25.0, no dependencies) into a temporary directory, unpacks it, and
for every folder in it holding a task.toml: reads task.toml with evalharness's TOML reader (the one Python 3.8-3.10
use) and with tomllib (this Python's, 3.11+), compares the values, then loads the folder as a task
(evalharness.read_task) and prints what it understood or the one line why it cannot run. Nothing is kept.

Usage: python3 bench/harbor_templates.py [--version 0.25.0] [--wheel PATH]
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import evalharness as eh  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--version", default="0.25.0")
    ap.add_argument("--wheel", default=None, help="a downloaded wheel (default: pip download it)")
    args = ap.parse_args()
    try:
        import tomllib
    except ImportError:
        sys.exit("run this with Python 3.11+ (it compares the reader with tomllib)")
    with tempfile.TemporaryDirectory(prefix="evalharness-harbor-") as tmp:
        wheel = args.wheel
        if wheel is None:  # harbor needs Python 3.12+: ask for that wheel whatever runs this
            subprocess.run([sys.executable, "-m", "pip", "download", "harbor==%s" % args.version, "--no-deps", "-q",
                            "-d", tmp, "--python-version", "3.12", "--only-binary=:all:"], check=True)
            wheel = glob.glob(os.path.join(tmp, "harbor-*.whl"))[0]
        zipfile.ZipFile(wheel).extractall(os.path.join(tmp, "x"))
        folders = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(tmp, "x", "**", "task.toml"),
                                                                recursive=True))
        same = 0
        for folder in folders:
            rel = os.path.relpath(folder, os.path.join(tmp, "x"))
            with open(os.path.join(folder, "task.toml"), encoding="utf-8") as fh:
                text = fh.read()
            equal = eh._TomlReader(text).parse() == tomllib.loads(text)
            same += equal
            task = eh.read_task(folder)
            known = {"schema_version", "task", "metadata", "verifier", "agent", "environment", "solution", "steps"}
            extra = sorted(set(tomllib.loads(text)) - known)
            print("%s\n  toml: %s; %s" % (rel, "reader == tomllib" if equal else "READER DIFFERS FROM TOMLLIB",
                                          "loads: image %s%s, verifier %g s, agent %s s, network %s, solution %s" % (
                                              task.image, " (built from environment/)" if task.build else "",
                                              task.verifier_timeout_s, task.agent_timeout_s, task.network,
                                              task.solution) if not task.error else "cannot run: %s" % task.error))
            if extra:
                print("  top-level keys not used by evalharness: %s" % ", ".join(extra))
        print("%d task.toml file(s) in harbor %s; the reader equals tomllib on %d" % (len(folders), args.version,
                                                                                   same))


if __name__ == "__main__":
    main()
