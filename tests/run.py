#!/usr/bin/env python3
"""Run the evalharness test suite and end with one line 'N passed, N failed, N skipped'.

Test modules run in parallel, each in a subprocess of its own (``-j N`` at a time, longest first); one module's
tests never split across processes. Each child writes its unittest output to a per-module log and one JSON line per
finished test (id, outcome, skip reason, failure text, seconds). A module that runs past ``--timeout`` is killed
with its process group and its unfinished tests count as failed; a module that crashes shows its log's tail.
Every skipped test is printed with its reason. Before the result line: each failure's traceback with the test's
name, the time by module and the slowest tests.

Under ``--no-skips`` or CI=true a skip is a failure, unless the test's id is in ALLOWED_SKIPS (with why it cannot
run on a CI machine).

Usage: python3 tests/run.py [-q] [-j N] [--no-skips] [--timeout S] [--logs DIR] [TEST_NAME_PREFIX ...]
       e.g. python3 tests/run.py tests.test_scoring tests.test_client.TestGate.test_x
Exit status: 0 when nothing failed, 1 otherwise, 2 on a usage error.
"""
import argparse
import collections
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.abspath(__file__)

# test id -> why it cannot run on the CI machine (a skip of any other test fails under --no-skips / CI=true)
ALLOWED_SKIPS = {}

# The order when no timing cache is there yet: the long modules first.
LONG_MODULES = ("tests.test_swe", "tests.test_scaleout", "tests.test_images", "tests.test_dockerbed",
                "tests.test_run", "tests.test_client")
TIMES_FILE = os.path.join(os.path.expanduser("~"), ".cache", "evalharness", "test-times.json")
DEFAULT_TIMEOUT_S = 1200


# ---------------------------------------------------------------------------------------------------- child side

class RecordingResult(unittest.TextTestResult):
    """A text result that also writes one JSON line per finished test (and per class- or module-level error)."""

    def __init__(self, stream, descriptions, verbosity, record=None):
        super().__init__(stream, descriptions, verbosity)
        self.record = record
        self._last = time.monotonic()
        self._current = None

    def _new(self, test):
        return {"id": test.id(), "outcome": "pass", "reason": "", "text": "", "time": 0.0}

    def startTest(self, test):
        super().startTest(test)
        self._current = self._new(test)

    def _mark(self, test, outcome, text="", reason=""):
        rec = self._current if self._current is not None and self._current["id"] == test.id() else None
        if rec is None:  # setUpClass / tearDownModule and the like: not inside startTest/stopTest
            rec = self._new(test)
            rec.update(outcome=outcome, text=text, reason=reason)
            self._write(rec)
            return
        rank = {"pass": 0, "skip": 1, "fail": 2, "error": 3}
        if rank[outcome] >= rank[rec["outcome"]]:
            rec["outcome"] = outcome
        if text:
            rec["text"] += text
        if reason:
            rec["reason"] = reason

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._mark(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._mark(test, "error", self._exc_info_to_string(err, test))

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            self._mark(test, "fail" if failed else "error",
                       "%s\n%s" % (subtest.id(), self._exc_info_to_string(err, test)))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._mark(test, "skip", reason=reason)

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._mark(test, "fail", "unexpected success (the test is marked expectedFailure)\n")

    def stopTest(self, test):
        super().stopTest(test)
        now = time.monotonic()
        if self._current is not None:
            self._current["time"] = now - self._last
            self._write(self._current)
            self._current = None
        self._last = now

    def _write(self, rec):
        if self.record is not None:
            self.record.write(json.dumps(rec) + "\n")
            self.record.flush()


def _test_ids(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            for name in _test_ids(item):
                yield name
        else:
            yield item.id()


def child_main(record_path, names, verbosity):
    """Run the tests ``names`` in this process, unittest's output on stderr, JSON lines into ``record_path``."""
    sys.path.insert(0, ROOT)
    os.chdir(ROOT)
    suite = unittest.TestLoader().loadTestsFromNames(names)
    with open(record_path, "a", encoding="utf-8") as record:
        record.write(json.dumps({"planned": list(_test_ids(suite))}) + "\n")
        record.flush()
        runner = unittest.TextTestRunner(verbosity=verbosity, stream=sys.stderr,
                                         resultclass=lambda *a: RecordingResult(*a, record=record))
        result = runner.run(suite)
        record.write(json.dumps({"finished": result.testsRun}) + "\n")
    return 0


# ---------------------------------------------------------------------------------------------------- parent side

def module_of(name):
    """'tests.test_x' of a test name prefix ('tests.test_x.C.test_y', 'tests.test_x', 'test_x.C')."""
    parts = name.split(".")
    if parts[0] == "tests" and len(parts) > 1:
        return "tests." + parts[1]
    return "tests." + parts[0] if parts[0].startswith("test_") else parts[0]


def load_times():
    try:
        with open(TIMES_FILE, encoding="utf-8") as fh:
            data = json.load(fh)
        return {k: float(v) for k, v in data.items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def save_times(measured):
    """Remember each whole module's wall time (merged into what other runs wrote); best effort."""
    try:
        times = load_times()
        times.update(measured)
        os.makedirs(os.path.dirname(TIMES_FILE), exist_ok=True)
        tmp = "%s.%d.tmp" % (TIMES_FILE, os.getpid())
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(times, fh, indent=0, sort_keys=True)
        os.replace(tmp, TIMES_FILE)
    except OSError:
        pass


def ordered(modules):
    """Longest first: by the timing cache, else the known long modules first, then by name."""
    times = load_times()
    static = {m: len(LONG_MODULES) - i for i, m in enumerate(LONG_MODULES)}
    return sorted(modules, key=lambda m: (-times.get(m, -1.0), -static.get(m, 0), m))


class Job:
    """One module's child process, its log and its JSON record."""

    def __init__(self, module, names, log_dir, verbosity):
        self.module, self.names = module, names
        self.log = os.path.join(log_dir, module + ".log")
        self.record = os.path.join(log_dir, module + ".jsonl")
        self.verbosity = verbosity
        self.proc = None
        self.started = self.ended = 0.0
        self.killed_after = None

    def start(self):
        for path in (self.log, self.record):
            if os.path.exists(path):
                os.unlink(path)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, HERE, "--child", self.record, "-v", str(self.verbosity)]
                                         + self.names, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=ROOT, env=env, start_new_session=True)
        self.started = time.monotonic()

    def kill(self, timeout_s):
        """Stop the child's whole process group: SIGTERM, then SIGKILL after 10 s."""
        self.killed_after = timeout_s
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
            try:
                os.killpg(self.proc.pid, sig)
            except OSError:
                pass
            try:
                self.proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # what the group's other members still hold
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass

    def results(self):
        """(planned test ids or None, [records], finished normally)."""
        planned, records, finished = None, [], False
        try:
            with open(self.record, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    try:
                        item = json.loads(line)
                    except ValueError:
                        continue  # a line cut by a kill
                    if "planned" in item:
                        planned = item["planned"]
                    elif "finished" in item:
                        finished = True
                    else:
                        records.append(item)
        except OSError:
            pass
        return planned, records, finished

    def log_tail(self, n=40):
        try:
            with open(self.log, "rb") as fh:
                lines = fh.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])


def run_jobs(jobs, n_jobs, timeout_s, out):
    """Run the jobs in their order, at most n_jobs at a time; report each as it ends."""
    waiting, running = list(jobs), []
    while waiting or running:
        while waiting and len(running) < n_jobs:
            job = waiting.pop(0)
            job.start()
            running.append(job)
        time.sleep(0.05)
        for job in list(running):
            if job.proc.poll() is None and time.monotonic() - job.started > timeout_s:
                job.kill(timeout_s)
            if job.proc.poll() is not None:
                job.ended = time.monotonic()
                running.remove(job)
                report_job(job, out)


def report_job(job, out):
    _, records, _ = job.results()
    count = collections.Counter(r["outcome"] for r in records)
    how = "killed after %d s" % job.killed_after if job.killed_after else "exit %d" % job.proc.returncode
    out.write("%s: %d passed, %d failed, %d skipped in %.0fs (%s)\n" % (
        job.module, count["pass"], count["fail"] + count["error"], count["skip"], job.ended - job.started, how))
    out.flush()


def collect(jobs, no_skips, out):
    """Print skips, failures and crashed modules; return (passed, failed, skipped, [(seconds, test id)])."""
    passed = failed = skipped = 0
    took, skips, failures, broken = [], [], [], []
    for job in jobs:
        planned, records, finished = job.results()
        seen = set()
        for rec in records:
            seen.add(rec["id"])
            took.append((rec.get("time", 0.0), rec["id"]))
            if rec["outcome"] == "pass":
                passed += 1
            elif rec["outcome"] == "skip":
                skips.append(rec)
                if no_skips and rec["id"] not in ALLOWED_SKIPS:
                    failed += 1
                    failures.append((rec["id"], "skipped, and skips are not allowed here (--no-skips or CI=true; "
                                                "ALLOWED_SKIPS in tests/run.py does not name it): %s\n"
                                     % rec["reason"]))
                else:
                    skipped += 1
            else:
                failed += 1
                failures.append((rec["id"], rec["text"]))
        ok = finished and job.proc.returncode == 0 and not job.killed_after
        if not ok:
            if job.killed_after:
                why = "was killed after %d s (the module timeout; see --timeout)" % job.killed_after
            else:
                why = "ended with exit %s before its tests finished" % job.proc.returncode
            missing = [t for t in (planned or []) if t not in seen]
            for i, name in enumerate(missing):
                failed += 1
                failures.append((name, "not finished%s: module %s %s\n" % (
                    " (the test running then)" if i == 0 else "", job.module, why)))
            if not missing:
                failed += 1
                failures.append((job.module, "module %s %s\n" % (job.module, why)))
            broken.append((job, why))
    for rec in skips:
        out.write("SKIP %s: %s\n" % (rec["id"], rec["reason"]))
    for name, text in failures:
        out.write("=" * 100 + "\nFAIL %s\n%s" % (name, text if text.endswith("\n") else text + "\n"))
    for job, why in broken:
        out.write("=" * 100 + "\nmodule %s %s; the end of its log (%s):\n%s\n" % (job.module, why, job.log,
                                                                             job.log_tail()))
    if failures:
        out.write("=" * 100 + "\n")
    return passed, failed, skipped, took


def print_times(jobs, took, out, most=8):
    """The slowest modules (wall time of their process) and tests (wall time since the test before ended, so a
    class's setUpClass counts with its first test), one line each."""
    by_module = sorted(((j.ended - j.started, j.module.split(".")[-1]) for j in jobs), reverse=True)
    if by_module:
        out.write("time by module: %s\n" % ", ".join("%s %.0fs" % (m, s) for s, m in by_module[:most]))
    if took:
        out.write("slowest tests: %s\n" % ", ".join("%s %.0fs" % (name.split(".", 1)[-1], s)
                                                     for s, name in sorted(took, reverse=True)[:most]))


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="tests/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("-q", action="store_true", help="no per-test output, one line per module")
    parser.add_argument("-j", type=int, default=max(2, os.cpu_count() or 1),
                        help="test modules run at the same time (default: max(2, CPU count) = %(default)s)")
    parser.add_argument("--no-skips", action="store_true",
                        help="a skip is a failure unless ALLOWED_SKIPS names it (also when CI=true)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="seconds a module may run before it is killed (default %(default)s)")
    parser.add_argument("--logs", help="directory for the per-module logs (default: a new temp directory)")
    parser.add_argument("names", nargs="*", help="test name prefixes, e.g. tests.test_scoring")
    args = parser.parse_args(argv)
    if args.j < 1:
        parser.error("-j must be at least 1")
    return args


def main(argv):
    if argv[:1] == ["--child"]:
        verbosity = int(argv[3]) if argv[2:3] == ["-v"] else 1
        return child_main(argv[1], argv[4:] if argv[2:3] == ["-v"] else argv[2:], verbosity)
    args = parse_args(argv)
    no_skips = args.no_skips or os.environ.get("CI", "").lower() == "true"
    os.chdir(ROOT)
    if args.names:
        groups = collections.OrderedDict()
        for name in args.names:
            groups.setdefault(module_of(name), []).append(name)
    else:
        groups = collections.OrderedDict(
            ("tests." + os.path.basename(p)[:-3], ["tests." + os.path.basename(p)[:-3]])
            for p in sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py"))))
    log_dir = args.logs or tempfile.mkdtemp(prefix="evalharness-test-logs-")
    os.makedirs(log_dir, exist_ok=True)
    out = sys.stdout
    jobs = [Job(m, groups[m], log_dir, 1 if args.q else 2) for m in ordered(groups)]
    out.write("%d module(s), %d at a time, logs in %s\n" % (len(jobs), args.j, log_dir))
    out.flush()
    try:
        run_jobs(jobs, args.j, args.timeout, out)
    except KeyboardInterrupt:
        for job in jobs:
            if job.proc is not None and job.proc.poll() is None:
                job.kill(0)
        raise
    if not args.q:
        for job in jobs:
            out.write("-" * 100 + "\n%s (%s):\n%s\n" % (job.module, job.log, job.log_tail(10 ** 6)))
    passed, failed, skipped, took = collect(jobs, no_skips, out)
    if not args.names:
        save_times({j.module: j.ended - j.started for j in jobs if not j.killed_after and j.proc.returncode == 0})
    print_times(jobs, took, out)
    if passed + failed + skipped == 0:
        out.write("no tests ran\n")
        return 1
    if failed == 0 and not args.logs:
        shutil.rmtree(log_dir, ignore_errors=True)  # kept (its path printed above) only when something failed
    out.write("%d passed, %d failed, %d skipped\n" % (passed, failed, skipped))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
