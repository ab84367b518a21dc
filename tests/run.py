#!/usr/bin/env python3
"""Run the evalharness test suite with unittest and end with one line 'N passed, N failed, N skipped'.

Usage: python3 tests/run.py [-q] [TEST_NAME_PREFIX ...]   e.g. python3 tests/run.py tests.test_scoring
Exit status: 0 when nothing failed, 1 otherwise.
"""
import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    runner = unittest.TextTestRunner(verbosity=1 if quiet else 2, stream=sys.stderr)
    result = runner.run(suite)
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
