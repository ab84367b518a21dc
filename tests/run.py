#!/usr/bin/env python3
"""Run the evalharness test suite with unittest and end with one line 'N passed, N failed, N skipped'.

Before that line it prints where the time went: the slowest test modules and tests, each charged with the wall time
since the previous test ended (so a class's setUpClass counts with its first test).

Usage: python3 tests/run.py [-q] [TEST_NAME_PREFIX ...]   e.g. python3 tests/run.py tests.test_scoring
Exit status: 0 when nothing failed, 1 otherwise.
"""
import collections
import os
import sys
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TimedResult(unittest.TextTestResult):
    """A text result that also keeps each test's wall time, counted from the end of the test before it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.took = []          # (seconds, test id)
        self._last = time.monotonic()

    def stopTest(self, test):
        super().stopTest(test)
        now = time.monotonic()
        self.took.append((now - self._last, test.id()))
        self._last = now


def print_times(took, out, most=8):
    """The slowest modules and tests of a run, one line each."""
    if not took:
        return
    by_module = collections.Counter()
    for seconds, name in took:
        by_module[name.split(".")[1] if name.startswith("tests.") else name.split(".")[0]] += seconds
    out.write("time by module: %s\n" % ", ".join("%s %.0fs" % (m, s) for m, s in by_module.most_common(most)))
    out.write("slowest tests: %s\n" % ", ".join("%s %.0fs" % (name.split(".", 1)[-1], s)
                                                 for s, name in sorted(took, reverse=True)[:most]))


def main(argv):
    quiet = "-q" in argv
    names = [a for a in argv if not a.startswith("-")]
    sys.path.insert(0, ROOT)
    os.chdir(ROOT)
    loader = unittest.TestLoader()
    if names:
        suite = loader.loadTestsFromNames(names)
    else:
        suite = loader.discover(os.path.join(ROOT, "tests"), pattern="test_*.py", top_level_dir=ROOT)
    runner = unittest.TextTestRunner(verbosity=1 if quiet else 2, stream=sys.stderr, resultclass=TimedResult)
    result = runner.run(suite)
    print_times(result.took, sys.stdout)
    failed = len(result.failures) + len(result.errors) + len(getattr(result, "unexpectedSuccesses", []))
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    if result.testsRun == 0:
        print("no tests ran")
        return 1
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
