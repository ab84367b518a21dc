"""SWE test bed: a Debian base image with bash, git, python3 and pytest built offline-capable with debootstrap, and
three small task images with a git repo at /testbed and a real failing test each (pytest, django-style and
sympy-style output), plus their SWE-bench instance rows (gold, test, skip and broken patches).

Images are built once per machine and reused: the base image is cached as a tarball under
``$EVALHARNESS_TESTBED_CACHE`` (default /var/cache/evalharness-testbed, or ~/.cache/evalharness-testbed when that
is not writable); task images carry a label with the hash of their content and are rebuilt only when it changes.
A file lock makes concurrent test processes build once.

    python3 tests/swebed.py build     # what .ci/run calls before the suites (prints timings)
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Dict, List

try:
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

BASE_IMAGE = "evalharness-swe-base:test"
TASK_REPO = "evalharness-swe-task"
LABEL = "evalharness.testbed"
GIT_ENV = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid",
           "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
           "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"}
PACKAGES = "git,python3,python3-pytest,ca-certificates,patch,procps"


def _apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (CI machines may point elsewhere), else deb.debian.org."""
    for path in ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"):
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        for m in re.finditer(r"(?:^URIs:\s*|^deb\s+(?:\[[^\]]*\]\s*)?)(\S+)", text, re.M):
            url = m.group(1).rstrip("/")
            if url.startswith("http") and not url.endswith("-security"):
                return url
    return "http://deb.debian.org/debian"


MIRROR = _apt_mirror()


def cache_dir() -> str:
    path = os.environ.get("EVALHARNESS_TESTBED_CACHE")
    if not path:
        path = "/var/cache/evalharness-testbed"
        try:
            os.makedirs(path, exist_ok=True)
            if not os.access(path, os.W_OK):
                raise OSError
        except OSError:
            path = os.path.join(os.path.expanduser("~"), ".cache", "evalharness-testbed")
    os.makedirs(path, exist_ok=True)
    return path


class _Lock:
    def __init__(self, name: str):
        self.path = os.path.join(cache_dir(), name + ".lock")

    def __enter__(self):
        self.fh = open(self.path, "a")
        if fcntl:
            fcntl.flock(self.fh.fileno(), fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if fcntl:
            fcntl.flock(self.fh.fileno(), fcntl.LOCK_UN)
        self.fh.close()


def _run(argv, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    proc = subprocess.run(argv, **kw)
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace") if isinstance(proc.stderr, bytes) else proc.stderr
        raise RuntimeError("%s failed (exit %d): %s" % (" ".join(argv[:4]), proc.returncode, (err or "")[-800:]))
    return proc


def _image_label(ref: str) -> str:
    proc = subprocess.run(["docker", "image", "inspect", "--format",
                           '{{index .Config.Labels "%s"}}' % LABEL, ref], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, universal_newlines=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _image_exists(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def ensure_base_image(log=print) -> str:
    """The base image, from the daemon, else the cached tarball, else debootstrap (~45-80 s; needs the Debian
    package mirror)."""
    if _image_exists(BASE_IMAGE):
        return BASE_IMAGE
    with _Lock("base"):
        if _image_exists(BASE_IMAGE):
            return BASE_IMAGE
        cache = cache_dir()
        tarball = os.path.join(cache, "swe-base.tar.gz")
        if os.path.exists(tarball):
            t0 = time.monotonic()
            with open(tarball, "rb") as fh:
                _run(["docker", "load"], stdin=fh)
            log("swebed: loaded %s from %s in %.1f s" % (BASE_IMAGE, tarball, time.monotonic() - t0))
            return BASE_IMAGE
        t0 = time.monotonic()
        root = tempfile.mkdtemp(prefix="swe-base-", dir=cache)
        try:
            _run(["debootstrap", "--variant=minbase", "--include=" + PACKAGES, "bookworm", root, MIRROR])
            for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
                        "usr/share/info"):
                path = os.path.join(root, sub)
                for name in os.listdir(path) if os.path.isdir(path) else []:
                    full = os.path.join(path, name)
                    if os.path.isdir(full) and not os.path.islink(full):
                        shutil.rmtree(full, ignore_errors=True)
                    elif name != "lock":
                        os.unlink(full)
            locale = os.path.join(root, "usr/share/locale")
            for name in os.listdir(locale) if os.path.isdir(locale) else []:
                if name != "locale.alias":
                    shutil.rmtree(os.path.join(locale, name), ignore_errors=True)
            tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
            _run(["docker", "import", "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:"
                  "/bin", "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["/bin/bash"]', "-", BASE_IMAGE],
                 stdin=tar.stdout)
            tar.wait()
        finally:
            shutil.rmtree(root, ignore_errors=True)
        save = subprocess.Popen(["docker", "save", BASE_IMAGE], stdout=subprocess.PIPE)
        with open(tarball + ".tmp", "wb") as out:
            _run(["gzip", "-1"], stdin=save.stdout, stdout=out)
        save.wait()
        os.replace(tarball + ".tmp", tarball)
        log("swebed: built %s with debootstrap in %.1f s (cached at %s)" % (BASE_IMAGE, time.monotonic() - t0,
                                                                          tarball))
    return BASE_IMAGE


# ----------------------------------------------------------------------------- the three task repositories

def _calc() -> dict:
    files = {
        "calc/__init__.py": "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b + 1\n",
        "tests/__init__.py": "",
        "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
        "setup.cfg": "[tool:pytest]\ntestpaths = tests\n",
    }
    test_after = files["tests/test_calc.py"].replace("from calc import add", "import pytest\n\nfrom calc import add, mul") + \
        textwrap.dedent('''

            @pytest.mark.parametrize("a,b,want", [(2, 3, 6), (0, 5, 0)], ids=["two times three", "zero [edge]"])
            def test_mul(a, b, want):
                assert mul(a, b) == want
            ''')
    return {"key": "calc", "repo": "evh/calc", "files": files,
            "problem": "calc.mul(2, 3) returns 7 instead of 6: multiplication is off by one.",
            "gold": {"calc/__init__.py": files["calc/__init__.py"].replace("a * b + 1", "a * b")},
            "test": {"tests/test_calc.py": test_after},
            "skip": {"conftest.py": "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n"
                                    "    for item in items:\n        if item.name.startswith('test_mul'):\n"
                                    "            item.add_marker(pytest.mark.skip(reason='not today'))\n"},
            "f2p": ["tests/test_calc.py::test_mul[two times three]", "tests/test_calc.py::test_mul[zero [edge]]"],
            "p2p": ["tests/test_calc.py::test_add"]}


_RUNTESTS = '''#!/usr/bin/env python3
"""A tiny stand-in for django's tests/runtests.py: unittest at verbosity 2 over module labels."""
import argparse
import os
import sys
import unittest

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.dirname(here)]
ap = argparse.ArgumentParser()
ap.add_argument("--verbosity", type=int, default=1)
ap.add_argument("--settings")
ap.add_argument("--parallel")
ap.add_argument("labels", nargs="*")
args = ap.parse_args()
suite = unittest.defaultTestLoader.loadTestsFromNames(args.labels)
print("Testing against Django installed in '/testbed/django'")
print("System check identified no issues (0 silenced).")
result = unittest.TextTestRunner(verbosity=args.verbosity, stream=sys.stdout).run(suite)
sys.exit(0 if result.wasSuccessful() else 1)
'''


def _djangoish() -> dict:
    files = {
        "shop/__init__.py": "",
        "shop/pricing.py": "def discount(price, pct):\n    return price - price * pct / 10\n",
        "tests/runtests.py": _RUNTESTS,
        "tests/pricing/__init__.py": "",
        "tests/pricing/tests.py": textwrap.dedent('''\
            import unittest

            from shop.pricing import discount


            class PricingTests(unittest.TestCase):
                def test_no_discount(self):
                    self.assertEqual(discount(100, 0), 100)
            '''),
    }
    tests_after = files["tests/pricing/tests.py"] + "\n    def test_ten_percent(self):\n        " \
        "self.assertEqual(discount(200, 10), 180)\n"
    skip_runner = _RUNTESTS.replace(
        "result = unittest", "def _skip(s):\n    for t in s:\n        if isinstance(t, unittest.TestSuite):\n            _skip(t)\n"
        "        elif t._testMethodName == 'test_ten_percent':\n"
        "            setattr(type(t), 'test_ten_percent', unittest.skip('not today')(lambda self: None))\n"
        "_skip(suite)\nresult = unittest")
    return {"key": "django", "repo": "django/django", "files": files, "executable": ["tests/runtests.py"],
            "problem": "shop.pricing.discount(200, 10) gives 0 instead of 180: the percentage is divided by 10.",
            "gold": {"shop/pricing.py": files["shop/pricing.py"].replace("/ 10", "/ 100")},
            "test": {"tests/pricing/tests.py": tests_after},
            "skip": {"tests/runtests.py": skip_runner},
            "f2p": ["test_ten_percent (pricing.tests.PricingTests)"],
            "p2p": ["test_no_discount (pricing.tests.PricingTests)"]}


_BIN_TEST = '''#!/usr/bin/env python3
"""A tiny stand-in for sympy's bin/test: runs test_* functions of the given files, sympy's verbose format."""
import importlib.util
import os
import sys
import time
import traceback

sys.path.insert(0, os.getcwd())


class Skipped(Exception):
    pass


SKIP = set()
paths = [a for a in sys.argv[1:] if not a.startswith("-")]
passed = failed = skipped = 0
failures = []
t0 = time.time()
for path in paths:
    spec = importlib.util.spec_from_file_location("t_" + str(abs(hash(path))), path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    names = [n for n in vars(mod) if n.startswith("test_") and callable(getattr(mod, n))]
    print("%s[%d] " % (path, len(names)))
    for name in names:
        try:
            if name in SKIP:
                raise Skipped()
            getattr(mod, name)()
        except Skipped:
            skipped += 1
            print("%s s" % name)
        except AssertionError:
            failed += 1
            failures.append((path, name, traceback.format_exc()))
            print("%s F" % name)
        except Exception:
            failed += 1
            failures.append((path, name, traceback.format_exc()))
            print("%s E" % name)
        else:
            passed += 1
            print("%s ok" % name)
for path, name, tb in failures:
    print("_" * 20 + " %s:%s " % (path, name) + "_" * 20)
    print(tb)
print("tests finished: %d passed, %d failed, %d skipped, in %.2f seconds" % (passed, failed, skipped, time.time() - t0))
sys.exit(1 if failed else 0)
'''


def _sympyish() -> dict:
    files = {
        "symp/__init__.py": "",
        "symp/core.py": "def ident(x):\n    return x\n\n\ndef double(x):\n    return x + x + 1\n",
        "symp/tests/__init__.py": "",
        "symp/tests/test_core.py": "from symp.core import ident\n\n\ndef test_ident():\n    assert ident(3) == 3\n",
        "bin/test": _BIN_TEST,
    }
    tests_after = files["symp/tests/test_core.py"].replace("import ident", "import double, ident") + \
        "\n\ndef test_double():\n    assert double(4) == 8\n"
    return {"key": "sympy", "repo": "sympy/sympy", "files": files, "executable": ["bin/test"],
            "problem": "symp.core.double(4) returns 9; it should return 8.",
            "gold": {"symp/core.py": files["symp/core.py"].replace("x + x + 1", "x + x")},
            "test": {"symp/tests/test_core.py": tests_after},
            "skip": {"bin/test": _BIN_TEST.replace("SKIP = set()", "SKIP = {'test_double'}")},
            "f2p": ["test_double"], "p2p": ["test_ident"]}


TASKS = (_calc, _djangoish, _sympyish)


def _write(root: str, files: Dict[str, str], executable=()) -> None:
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(path, 0o755 if rel in executable else 0o644)


def _git(repo: str, *args: str) -> str:
    env = dict(os.environ, **GIT_ENV)
    return _run(["git", "-C", repo] + list(args), env=env, universal_newlines=True).stdout


def _diff(repo: str, changes: Dict[str, str], executable=()) -> str:
    """The git diff that turns the committed tree into one with ``changes`` applied (new files included)."""
    _write(repo, changes, executable)
    _git(repo, "add", "-A")
    patch = _git(repo, "diff", "--cached")
    _git(repo, "reset", "-q", "--hard")
    _git(repo, "clean", "-qfdx")
    return patch


def build_task_images(log=print) -> List[dict]:
    """Build (or reuse) the three task images; return their SWE-bench instance rows plus extra patches under
    "_skip_patch" and "_broken_patch"."""
    base = ensure_base_image(log)
    base_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", base], stdout=subprocess.PIPE,
                             universal_newlines=True).stdout.strip()
    rows = []
    with _Lock("tasks"):
        for make in TASKS:
            spec = make()
            work = tempfile.mkdtemp(prefix="swe-task-")
            try:
                repo = os.path.join(work, "testbed")
                os.makedirs(repo)
                _git(repo, "init", "-q", "-b", "main")
                _write(repo, spec["files"], spec.get("executable", ()))
                _git(repo, "add", "-A")
                _git(repo, "commit", "-q", "-m", "initial commit")
                base_commit = _git(repo, "rev-parse", "HEAD").strip()
                execs = spec.get("executable", ())
                gold = _diff(repo, spec["gold"], execs)
                test_patch = _diff(repo, spec["test"], execs)
                skip = _diff(repo, spec["skip"], execs)
                broken = gold.replace("-    return", "-    return  # not in the file", 1)
                ref = "%s:%s" % (TASK_REPO, spec["key"])
                digest = hashlib.sha256(json.dumps([base_id, base_commit, sorted(spec["files"].items())])
                                        .encode()).hexdigest()[:16]
                if _image_label(ref) != digest:
                    with open(os.path.join(work, "Dockerfile"), "w") as fh:
                        fh.write("FROM %s\nCOPY testbed/ /testbed/\nWORKDIR /testbed\nLABEL %s=%s\n"
                                 "CMD [\"/bin/bash\"]\n" % (base, LABEL, digest))
                    t0 = time.monotonic()
                    _run(["docker", "build", "-q", "-t", ref, work], env=dict(os.environ, DOCKER_BUILDKIT="0"))
                    log("swebed: built %s in %.1f s" % (ref, time.monotonic() - t0))
            finally:
                shutil.rmtree(work, ignore_errors=True)
            rows.append({"instance_id": "evh__%s-1" % spec["key"], "repo": spec["repo"], "base_commit": base_commit,
                         "problem_statement": spec["problem"], "patch": gold, "test_patch": test_patch,
                         "FAIL_TO_PASS": json.dumps(spec["f2p"]), "PASS_TO_PASS": json.dumps(spec["p2p"]),
                         "version": "1.0", "image": ref, "_skip_patch": skip, "_broken_patch": broken})
    return rows


def instance_rows(rows: List[dict]) -> List[dict]:
    """The rows without the test-only extra patches (what a dataset file holds)."""
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


if __name__ == "__main__":
    if sys.argv[1:] == ["build"]:
        t0 = time.monotonic()
        built = build_task_images()
        print("swebed: %d task images ready in %.1f s: %s" % (len(built), time.monotonic() - t0,
                                                               ", ".join(r["image"] for r in built)))
    else:
        sys.exit("usage: python3 tests/swebed.py build")
