#!/usr/bin/env python3
"""Zipapp start time: how long `python evalharness.pyz` takes before it does anything, per Python, against a bare
`python -c pass`; and whether two builds give the same bytes.

Usage: python3 bench/startup.py [--runs 15] [--shim]
Builds the zipapp from a snapshot of evalharness.py and build_zipapp.sh in a temp dir (twice, to compare sha256;
once more with PYC_VERSIONS=none: the source fallback), makes a small run directory with `evalharness.py demo`,
then for each of 3.8, 3.11 and 3.13 found under pyenv takes the median wall time of --runs runs (interleaved) of:
`python -c pass`; an empty zipapp (the floor: runpy and zipimport cost that much before any code runs);
`--version` of the archive as it was before (source only, a plain `from evalharness import main`: zipimport
compiles the module twice, for get_filename and get_code), of the source fallback, and of the zipapp; and the
zipapp's `report RUN_DIR`; each also as a ratio to the bare start. Target (the "fast start" issue): the zipapp's
`--version` within 1.3x of `python -c pass`; "floor" is --version over the empty zipapp. --shim runs each Python
through the pyenv shim (`PYENV_VERSION=X.Y.Z python3`), as the issue's numbers were taken; the default runs the
interpreter itself. The last column is the part of the start spent in the standard-library imports evalharness
makes (`-X importtime`): argparse's (re, gettext, locale; shutil on 3.8) for any command.
The machine is shared and noisy: compare the ratios printed in one run, not across runs.
"""
import argparse
import glob
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSIONS = ("3.8", "3.11", "3.13")


def find_python(version):
    """(pyenv version name, interpreter path) of the highest X.Y.Z installed for 'X.Y', or None."""
    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv"), "/root/.pyenv"]
    found = []
    for root in filter(None, roots):
        for exe in glob.glob(os.path.join(root, "versions", version + ".*", "bin", "python" + version)):
            name = os.path.basename(os.path.dirname(os.path.dirname(exe)))
            if name.replace(".", "").isdigit():
                found.append(([int(p) for p in name.split(".")], name, exe))
    return max(found)[1:] if found else None


def build(snapshot, out, **env):
    res = subprocess.run(["bash", os.path.join(snapshot, "build_zipapp.sh"), out], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True, env=dict(os.environ, **env), timeout=600)
    if res.returncode != 0:
        sys.exit("build failed:\n" + res.stderr)
    sys.stderr.write(res.stderr)
    with open(out, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def before_archive(pyz, out):
    """The archive as it was before it carried bytecode: __main__.py imports the source from the zip."""
    main = b"import sys\nfrom evalharness import main\nsys.exit(main())\n"
    with zipfile.ZipFile(pyz) as src, open(out, "wb") as raw:
        raw.write(b"#!/usr/bin/env python3\n")
        with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as dst:
            dst.writestr("__main__.py", main)
            dst.writestr("evalharness.py", src.read("evalharness.py"))


def medians(commands, runs, env):
    """{label: median wall seconds} over `runs` rounds, each round running every command once (interleaved, so
    a slow spell of the machine hits all of them alike)."""
    times = {label: [] for label, _ in commands}
    for _ in range(runs):
        for label, cmd in commands:
            t0 = time.perf_counter()
            res = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=120)
            times[label].append(time.perf_counter() - t0)
            if res.returncode != 0:
                sys.exit("%s failed (exit %d):\n%s" % (" ".join(cmd), res.returncode, res.stderr.decode()[-2000:]))
    return {label: statistics.median(ts) for label, ts in times.items()}


def import_ms(exe, pyz, env):
    """ms spent in the top-level imports of a `--version` start that a bare start does not make (-X importtime)."""
    def top_level(cmd):
        res = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, universal_newlines=True,
                             env=env, timeout=120)
        out = {}
        for line in res.stderr.splitlines():
            parts = line.split("|")
            if line.startswith("import time:") and len(parts) == 3 and parts[1].strip().isdigit():
                name = parts[2]
                if name.startswith(" ") and not name.startswith("  "):
                    out[name.strip()] = int(parts[1])
        return out
    bare = top_level([exe, "-X", "importtime", "-c", "pass"])
    full = top_level([exe, "-X", "importtime", pyz, "--version"])
    return sum(us for name, us in full.items() if name not in bare) / 1000.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="runs per command; the median is reported (default 15)")
    ap.add_argument("--shim", action="store_true", help="run each Python through the pyenv shim python3")
    args = ap.parse_args()
    pythons = [(v, find_python(v)) for v in VERSIONS]
    pythons = [(v, found) for v, found in pythons if found]
    if not pythons:
        sys.exit("none of Python %s found under pyenv" % ", ".join(VERSIONS))
    tmp = tempfile.mkdtemp(prefix="evalharness-bench-startup-")
    try:
        snapshot = os.path.join(tmp, "src")  # evalharness.py may change while the bench runs
        os.mkdir(snapshot)
        for name in ("evalharness.py", "build_zipapp.sh"):
            shutil.copy2(os.path.join(ROOT, name), snapshot)
        pyz, again, plain = (os.path.join(tmp, n) for n in ("evalharness.pyz", "again.pyz", "source-only.pyz"))
        sha_a, sha_b = build(snapshot, pyz), build(snapshot, again)
        build(snapshot, plain, PYC_VERSIONS="none")
        before = os.path.join(tmp, "before.pyz")
        before_archive(plain, before)
        floor = os.path.join(tmp, "floor.pyz")  # any zipapp's start: runpy and zipimport, then nothing
        with open(floor, "wb") as raw:
            raw.write(b"#!/usr/bin/env python3\n")
            with zipfile.ZipFile(raw, "w") as zf:
                zf.writestr("__main__.py", "pass\n")
        print("sha256 of two builds: %s %s  -> %s" % (sha_a[:16], sha_b[:16],
                                                     "same" if sha_a == sha_b else "DIFFERENT (not reproducible)"))
        print("archive: %d bytes (source only: %d)" % (os.path.getsize(pyz), os.path.getsize(plain)))
        run_dir = os.path.join(tmp, "run")
        res = subprocess.run([sys.executable, os.path.join(snapshot, "evalharness.py"), "demo", "--out", run_dir,
                              "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
        if res.returncode != 0:
            sys.exit("demo run failed:\n" + res.stderr.decode()[-2000:])
        env = {k: v for k, v in os.environ.items() if k != "EVALHARNESS_DEBUG_LOADER"}
        env["EVALHARNESS_LIMITS_FILE"] = os.path.join(tmp, "limits.json")
        print("median of %d runs, ms (ratio to `python -c pass`)%s" % (args.runs, ", through the pyenv shim"
                                                                        if args.shim else ""))
        print("empty pyz: a zipapp whose __main__.py is `pass` (the floor of any zipapp); before: source only, a "
              "plain import;\nsource: the source fallback; 1.3x: --version within 1.3x of -c pass; floor: --version "
              "/ empty pyz; imports: ms of the stdlib imports")
        header = "%-7s %7s %14s %14s %14s %14s %14s %6s %5s %7s" % (
            "python", "-c pass", "empty pyz", "before", "source", "--version", "report RUN", "1.3x", "floor",
            "imports")
        print(header)
        for version, (name, exe) in pythons:
            penv = dict(env, PYENV_VERSION=name) if args.shim else env
            # the shim itself: under pyenv, PATH here starts with the running Python's own bin folder
            shim = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(exe)))), "shims",
                                "python3")
            python = [shim] if args.shim else [exe]
            loaded = subprocess.run(python + [pyz, "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    universal_newlines=True, env=dict(penv, EVALHARNESS_DEBUG_LOADER="1"),
                                    timeout=120).stderr.strip()
            m = medians([("bare", python + ["-c", "pass"]), ("floor", python + [floor]),
                         ("before", python + [before, "--version"]),
                         ("plain", python + [plain, "--version"]), ("version", python + [pyz, "--version"]),
                         ("report", python + [pyz, "report", run_dir])], args.runs, penv)
            bare = m["bare"]

            def cell(label):
                return "%5.0f (%4.1fx)" % (m[label] * 1000, m[label] / bare)
            ratio = m["version"] / bare
            print("%-7s %7.0f %14s %14s %14s %14s %14s %6s %5.2f %7.0f" % (
                name, bare * 1000, cell("floor"), cell("before"), cell("plain"), cell("version"), cell("report"),
                "met" if ratio <= 1.3 else "missed", m["version"] / m["floor"], import_ms(exe, pyz, env)))
            print("        %s" % loaded.replace(tmp + os.sep, ""))
    finally:
        shutil.rmtree(tmp, True)


if __name__ == "__main__":
    main()
