"""SWE test bed: a Debian base image with bash, git, python3 and pytest built offline-capable with debootstrap, and
three small task images with a git repo at /testbed and a real failing test each (pytest, django-style and
sympy-style output), plus their SWE-bench instance rows (gold, test, skip and broken patches): `build_task_images`.
`build_layout_images` builds two more in SWE-bench's own image layout (a conda-style env at
/opt/miniconda3/envs/testbed), where the official eval script must re-run the install step for the fix to count:
"djsetup" (django 2.2, ``python setup.py install``) and "xtbuild" (xarray 2022.03, ``python -m pip install -e .``
with a build step).

Images are built once per machine and reused: the base image is cached as a tarball under
``$EVALHARNESS_TESTBED_CACHE`` (default /var/cache/evalharness-testbed, or ~/.cache/evalharness-testbed when that
is not writable); task images carry a label with the hash of their content and are rebuilt only when it changes.
File locks make concurrent test processes build once: one for the base tarball, one per daemon (DOCKER_HOST)
for the task images, so suites on separate daemons build at the same time.

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


def _daemon_lock(name: str) -> "_Lock":
    """A lock for ``name`` on the daemon DOCKER_HOST names: suites on different daemons build at the same time."""
    key = hashlib.sha1((os.environ.get("DOCKER_HOST") or "default").encode()).hexdigest()[:12]
    return _Lock("%s-%s" % (name, key))


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
            # as SWE-bench's pytest parser keys them (the word after the status): cut at the first space, #290
            "f2p": ["tests/test_calc.py::test_mul[two", "tests/test_calc.py::test_mul[zero"],
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


_PRICING_TESTS = textwrap.dedent('''\
    import unittest

    from shop.pricing import discount


    class PricingTests(unittest.TestCase):
        def test_no_discount(self):
            self.assertEqual(discount(100, 0), 100)
    ''')  # the django-style images' test module at the base commit


def _djangoish() -> dict:
    files = {
        "shop/__init__.py": "",
        "shop/pricing.py": "def discount(price, pct):\n    return price - price * pct / 10\n",
        "tests/runtests.py": _RUNTESTS,
        "tests/pricing/__init__.py": "",
        "tests/pricing/tests.py": _PRICING_TESTS,
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
            # Python 3.11's unittest spelling, which this image's runner prints (SWE-bench keys ids as printed)
            "f2p": ["test_ten_percent (pricing.tests.PricingTests.test_ten_percent)"],
            "p2p": ["test_no_discount (pricing.tests.PricingTests.test_no_discount)"]}


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


def _commit(repo: str, spec: dict) -> dict:
    """Commit ``spec["files"]`` as the base commit of a new repository at ``repo``; return the base commit and the
    gold, test, skip and broken patches against it."""
    os.makedirs(repo)
    _git(repo, "init", "-q", "-b", "main")
    execs = spec.get("executable", ())
    _write(repo, spec["files"], execs)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "initial commit")
    out = {"base_commit": _git(repo, "rev-parse", "HEAD").strip(), "gold": _diff(repo, spec["gold"], execs),
           "test": _diff(repo, spec["test"], execs), "skip": _diff(repo, spec["skip"], execs)}
    # the first removed line of the gold patch changed, so its hunk no longer matches the file
    out["broken"] = re.sub(r"^(-(?!--).*)$", r"\1  # not in the file", out["gold"], count=1, flags=re.M)
    return out


def _build_image(ref: str, digest: str, work: str, dockerfile: str, log) -> None:
    """Build ``ref`` from the context ``work`` unless the image there already carries ``digest``."""
    if _image_label(ref) == digest:
        return
    with open(os.path.join(work, "Dockerfile"), "w") as fh:
        fh.write(dockerfile + "LABEL %s=%s\nCMD [\"/bin/bash\"]\n" % (LABEL, digest))
    t0 = time.monotonic()
    _run(["docker", "build", "-q", "-t", ref, work], env=dict(os.environ, DOCKER_BUILDKIT="0"))
    log("swebed: built %s in %.1f s" % (ref, time.monotonic() - t0))


def _base_id(log) -> str:
    base = ensure_base_image(log)
    return subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", base], stdout=subprocess.PIPE,
                          universal_newlines=True).stdout.strip()


def _row(spec: dict, made: dict, ref: str, version: str) -> dict:
    return {"instance_id": "evh__%s-1" % spec["key"], "repo": spec["repo"], "base_commit": made["base_commit"],
            "problem_statement": spec["problem"], "patch": made["gold"], "test_patch": made["test"],
            "FAIL_TO_PASS": json.dumps(spec["f2p"]), "PASS_TO_PASS": json.dumps(spec["p2p"]),
            "version": version, "image": ref, "_skip_patch": made["skip"], "_broken_patch": made["broken"]}


def build_task_images(log=print) -> List[dict]:
    """Build (or reuse) the three task images; return their SWE-bench instance rows plus extra patches under
    "_skip_patch" and "_broken_patch"."""
    base_id = _base_id(log)
    rows = []
    with _daemon_lock("tasks"):
        for make in TASKS:
            spec = make()
            work = tempfile.mkdtemp(prefix="swe-task-")
            try:
                made = _commit(os.path.join(work, "testbed"), spec)
                ref = "%s:%s" % (TASK_REPO, spec["key"])
                digest = hashlib.sha256(json.dumps([base_id, made["base_commit"], sorted(spec["files"].items())])
                                        .encode()).hexdigest()[:16]
                _build_image(ref, digest, work, "FROM %s\nCOPY testbed/ /testbed/\nWORKDIR /testbed\n" % BASE_IMAGE,
                             log)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            rows.append(_row(spec, made, ref, "1.0"))
    return rows


def instance_rows(rows: List[dict]) -> List[dict]:
    """The rows without the test-only extra patches (what a dataset file holds)."""
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


# ----------------------------------------------------------------------------- two images in SWE-bench's layout
# SWE-bench's images hold a conda env at /opt/miniconda3/envs/testbed that the official eval script activates
# (`source /opt/miniconda3/bin/activate`, `conda activate testbed`) before it re-runs the repository's install
# step, which a test of a non-editable install or of a compiled extension depends on. These two images have
# that layout without conda or network: a venv with Debian's pytest visible, a shell-function `conda`, a stand-in
# pip, and a repository whose tests see a fix only once the install step has run again.

_CONDA_SH = r'''# Stand-in for conda's shell hook (there is no conda in this image): `conda activate NAME`
# puts the env's bin first on PATH in place of the active env's, `conda deactivate` takes it off.
conda() {
    local name prefix p
    case "${1:-}" in
    activate)
        name="${2:-base}"
        if [ "$name" = base ]; then prefix=/opt/miniconda3; else prefix="/opt/miniconda3/envs/$name"; fi
        if [ ! -d "$prefix/bin" ]; then
            echo "EnvironmentNameNotFound: Could not find conda environment: $name" >&2
            return 1
        fi
        conda deactivate
        export PATH="$prefix/bin:$PATH" CONDA_PREFIX="$prefix" CONDA_DEFAULT_ENV="$name" CONDA_SHLVL=1
        ;;
    deactivate)
        if [ -n "${CONDA_PREFIX:-}" ]; then
            p=":$PATH:"
            p="${p//":$CONDA_PREFIX/bin:"/:}"
            p="${p#:}"
            export PATH="${p%:}" CONDA_SHLVL=0
            unset CONDA_PREFIX CONDA_DEFAULT_ENV
        fi
        ;;
    *)
        echo "conda: this stand-in knows only 'conda activate [NAME]' and 'conda deactivate'" >&2
        return 2
        ;;
    esac
}
'''

_ACTIVATE = '''# Stand-in for conda's bin/activate: defines the conda shell function and activates NAME (default base).
. /opt/miniconda3/etc/profile.d/conda.sh
conda activate "${1:-base}"
'''

_PIP_INIT = '''"""Stand-in for pip in the offline SWE test bed (no network, no setuptools): only
``python -m pip install -e DIR``, which runs ``setup.py develop`` in DIR as pip does for a legacy editable
install."""
__version__ = "0+swebed"
'''

_PIP_MAIN = '''import os
import subprocess
import sys

import pip

QUIET = {"-v", "--verbose", "-q", "--quiet", "--no-build-isolation", "--no-use-pep517", "--no-deps"}


def main(argv):
    args = [a for a in argv if a not in QUIET]
    if args == ["--version"]:
        print("pip %s from %s (python %d.%d)" % ((pip.__version__, os.path.dirname(pip.__file__))
                                                 + sys.version_info[:2]))
        return 0
    if len(args) != 3 or args[:2] not in (["install", "-e"], ["install", "--editable"]):
        print("ERROR: this stand-in pip (offline test bed) does only 'pip install -e DIR', not: pip %s"
              % " ".join(argv), file=sys.stderr)
        return 1
    path = os.path.abspath(args[2].split("[", 1)[0])
    print("Obtaining file://%s" % path)
    name = subprocess.run([sys.executable, "setup.py", "--name"], cwd=path, stdout=subprocess.PIPE,
                          universal_newlines=True).stdout.strip()
    print("Installing collected packages: %s\\n  Running setup.py develop for %s" % (name, name), flush=True)
    if subprocess.call([sys.executable, "setup.py", "develop"], cwd=path) != 0:
        print("error: subprocess-exited-with-error", file=sys.stderr)
        return 1
    print("Successfully installed %s" % name)
    return 0


sys.exit(main(sys.argv[1:]))
'''

_MAKE_ENV = '''#!/bin/bash
# The testbed env of SWE-bench's images without conda: a venv that sees Debian's pytest, the stand-in pip in its
# site-packages, a pytest launcher on the env's python (Debian's /usr/bin/pytest runs /usr/bin/python3, which
# would not see the env's site-packages), and ~/.bashrc activating it for login shells as SWE-bench's do.
set -euo pipefail
env=/opt/miniconda3/envs/testbed
python3 -m venv --without-pip --system-site-packages "$env"
site=$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp -r /tmp/swebed/pip "$site/pip"
printf '%s\\n' "#!$env/bin/python" "import sys" "from pytest import console_main" "sys.exit(console_main())" \\
    > "$env/bin/pytest"
chmod 755 "$env/bin/pytest"
echo "source /opt/miniconda3/etc/profile.d/conda.sh && conda activate testbed" > /root/.bashrc
'''

_RUNTESTS_22 = '''#!/usr/bin/env python
"""A tiny stand-in for django 2.2's tests/runtests.py: unittest at verbosity 2 over test labels, in the output
format of the Pythons django 2.2 ran on (``test_x (app.tests.Class)``). As in django, sys.path[0] is tests/ and
the code under test is the installed copy (``python setup.py install``), not the checkout."""
import argparse
import importlib
import os
import sys
import unittest
import unittest.util


class _Result(unittest.TextTestResult):
    def getDescription(self, test):
        name = str(test)
        if isinstance(test, unittest.TestCase):  # Python 3.11+ would print "name (module.Class.name)"
            name = "%s (%s)" % (test._testMethodName, unittest.util.strclass(type(test)))
        doc = test.shortDescription() if self.descriptions else None
        return "%s\\n%s" % (name, doc) if doc else name


ap = argparse.ArgumentParser(description="Run the test suite.")
ap.add_argument("modules", nargs="*", metavar="module")
ap.add_argument("-v", "--verbosity", type=int, default=1, choices=[0, 1, 2, 3])
ap.add_argument("--settings")
ap.add_argument("--parallel", type=int, nargs="?", default=0, const=1)
args = ap.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
importlib.import_module(args.settings or os.environ.get("DJANGO_SETTINGS_MODULE", "test_sqlite"))
import shop  # noqa: E402
if args.verbosity >= 1:
    print("Testing against Django installed in '%s'" % os.path.dirname(shop.__file__))
loader = unittest.defaultTestLoader
suite = loader.loadTestsFromNames(args.modules) if args.modules else loader.discover(here, top_level_dir=here)
print("System check identified no issues (0 silenced).")
sys.stdout.flush()
result = unittest.TextTestRunner(stream=sys.stdout, verbosity=args.verbosity, resultclass=_Result).run(suite)
sys.exit(bool(result.failures or result.errors))
'''

_SETUP_INSTALL = '''"""Build script of shop, standard library only (the test bed has no setuptools or distutils):
``python setup.py install`` copies shop/ into this Python's site-packages, a non-editable install as in
SWE-bench's django images."""
import os
import shutil
import sys
import sysconfig

NAME, VERSION = "shop", "2.2"
HERE = os.path.dirname(os.path.abspath(__file__))


def install():
    src, dest = os.path.join(HERE, NAME), os.path.join(sysconfig.get_paths()["purelib"], NAME)
    print("running install\\nrunning build_py")
    shutil.rmtree(dest, ignore_errors=True)
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        out = os.path.normpath(os.path.join(dest, os.path.relpath(dirpath, src)))
        os.makedirs(out, exist_ok=True)
        for name in sorted(f for f in filenames if f.endswith(".py")):
            shutil.copyfile(os.path.join(dirpath, name), os.path.join(out, name))  # a new mtime: no stale .pyc
            print("copying %s -> %s" % (os.path.relpath(os.path.join(dirpath, name), HERE), out))
    print("Installed %s\\nFinished processing dependencies for %s==%s" % (dest, NAME, VERSION))


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        install()
    elif sys.argv[1:] in (["--name"], ["--version"]):
        print(NAME if sys.argv[1] == "--name" else VERSION)
    else:
        sys.exit("usage: setup.py install | --name | --version (a stand-in for setuptools)")
'''


def _djsetup() -> dict:
    """django <= 2.2: tests import the package installed in site-packages, so only ``python setup.py install``
    after the patch puts the fix under test."""
    files = {
        "setup.py": _SETUP_INSTALL,
        "shop/__init__.py": "",
        "shop/pricing.py": "def discount(price, pct):\n    return price - price * pct / 10\n",
        "tests/runtests.py": _RUNTESTS_22,
        "tests/test_sqlite.py": "# The settings the official test command names; the stand-in runner imports them.\n"
                                "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3'}}\n"
                                "SECRET_KEY = 'django_tests_secret_key'\n",
        "tests/pricing/__init__.py": "",
        "tests/pricing/tests.py": _PRICING_TESTS,
    }
    tests_after = files["tests/pricing/tests.py"] + "\n    def test_ten_percent(self):\n" \
        "        self.assertEqual(discount(200, 10), 180)\n"
    skip_runner = _RUNTESTS_22.replace("result = unittest", textwrap.dedent('''\
        def _skip(s):
            for t in s:
                if isinstance(t, unittest.TestSuite):
                    _skip(t)
                elif t._testMethodName == "test_ten_percent":
                    setattr(type(t), "test_ten_percent", unittest.skip("not today")(lambda self: None))
        _skip(suite)
        result = unittest'''))
    return {"key": "djsetup", "repo": "django/django", "version": "2.2", "install": "python setup.py install",
            "files": files, "executable": ["tests/runtests.py"],
            "problem": "shop.pricing.discount(200, 10) gives 0 instead of 180: the percentage is divided by 10.",
            "gold": {"shop/pricing.py": files["shop/pricing.py"].replace("/ 10", "/ 100")},
            "test": {"tests/pricing/tests.py": tests_after},
            "skip": {"tests/runtests.py": skip_runner},
            "f2p": ["test_ten_percent (pricing.tests.PricingTests)"],
            "p2p": ["test_no_discount (pricing.tests.PricingTests)"]}


_SETUP_DEVELOP = '''"""Build script of xtk, standard library only (the test bed has no setuptools or distutils).
``build_ext --inplace`` "compiles" the kernels in xtk/_ext.src to xtk/_ext.py (untracked, as a C extension's .so
would be); ``develop`` builds them and puts this checkout on sys.path with a .pth, which ``pip install -e .``
runs."""
import os
import re
import sys
import sysconfig

NAME, VERSION = "xtk", "2022.3.0"
HERE = os.path.dirname(os.path.abspath(__file__))


def build_ext():
    src, dest = os.path.join(HERE, NAME, "_ext.src"), os.path.join(HERE, NAME, "_ext.py")
    print("running build_ext\\nbuilding '%s._ext' extension" % NAME)
    out = ["# Generated from _ext.src by `python setup.py build_ext --inplace`: do not edit.\\n"]
    with open(src, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = re.match(r"kernel\\s+(\\w+\\(.*?\\))\\s+=\\s+(.+)$", line)
            if not m:
                sys.exit("%s:%d: error: expected 'kernel NAME(ARGS) = EXPR', got %r" % (src, n, line))
            out.append("\\n\\ndef %s:\\n    return %s\\n" % m.groups())
    with open(dest + ".tmp", "w", encoding="utf-8") as fh:
        fh.write("".join(out))
    os.replace(dest + ".tmp", dest)
    print("writing %s" % os.path.relpath(dest, HERE))


def develop():
    build_ext()
    pth = os.path.join(sysconfig.get_paths()["purelib"], "__editable__.%s-%s.pth" % (NAME, VERSION))
    with open(pth, "w", encoding="utf-8") as fh:
        fh.write(HERE + "\\n")
    print("running develop\\nCreating %s (link to .)" % pth)


if __name__ == "__main__":
    commands = {("build_ext", "--inplace"): build_ext, ("build_ext", "-i"): build_ext, ("develop",): develop}
    if tuple(sys.argv[1:]) in commands:
        commands[tuple(sys.argv[1:])]()
    elif sys.argv[1:] in (["--name"], ["--version"]):
        print(NAME if sys.argv[1] == "--name" else VERSION)
    else:
        sys.exit("usage: setup.py build_ext --inplace | develop | --name | --version (a stand-in for setuptools)")
'''


def _xtbuild() -> dict:
    """An editable install with a native build (xarray, scikit-learn, matplotlib): the fix is in a source that
    only ``python -m pip install -e .`` compiles, so without the rebuild the tests run the old build."""
    src = ("# xtk's native kernels: `python -m pip install -e .` (setup.py build_ext --inplace) compiles them to\n"
           "# xtk/_ext.py.\n"
           "kernel nansum(values) = sum(v for v in values if v == v)\n"
           "kernel nanmean(values) = sum(v for v in values if v == v) / len(values)\n")
    files = {
        ".gitignore": "__pycache__/\n*.egg-info/\n/build/\n/xtk/_ext.py\n",
        "setup.py": _SETUP_DEVELOP,
        "xtk/__init__.py": '"""xtk: reductions that skip NaN; the kernels are built from _ext.src."""\n'
                           "from xtk._ext import nanmean, nansum\n\n__all__ = ['nanmean', 'nansum']\n",
        "xtk/_ext.src": src,
        "tests/test_reduce.py": textwrap.dedent('''\
            import math

            import xtk


            def test_nansum_skips_nan():
                assert xtk.nansum([1.0, math.nan, 3.0]) == 4.0


            def test_nanmean_without_nan():
                assert xtk.nanmean([1.0, 2.0, 3.0]) == 2.0
            '''),
    }
    tests_after = files["tests/test_reduce.py"] + \
        "\n\ndef test_nanmean_skips_nan():\n    assert xtk.nanmean([1.0, math.nan, 3.0]) == 2.0\n"
    return {"key": "xtbuild", "repo": "pydata/xarray", "version": "2022.03", "install": "python -m pip install -e .",
            "files": files,
            "problem": "xtk.nanmean([1.0, nan, 3.0]) returns 1.33 instead of 2.0: NaNs are counted in the divisor.",
            "gold": {"xtk/_ext.src": src.replace("/ len(values)", "/ len([v for v in values if v == v])")},
            "test": {"tests/test_reduce.py": tests_after},
            "skip": {"tests/conftest.py": "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n"
                                          "    for item in items:\n"
                                          "        if item.name == 'test_nanmean_skips_nan':\n"
                                          "            item.add_marker(pytest.mark.skip(reason='not today'))\n"},
            "f2p": ["tests/test_reduce.py::test_nanmean_skips_nan"],
            "p2p": ["tests/test_reduce.py::test_nansum_skips_nan", "tests/test_reduce.py::test_nanmean_without_nan"]}


LAYOUT_TASKS = (_djsetup, _xtbuild)
_LAYOUT_CONTEXT = {"opt/miniconda3/etc/profile.d/conda.sh": _CONDA_SH, "opt/miniconda3/bin/activate": _ACTIVATE,
                   "swebed/pip/__init__.py": _PIP_INIT, "swebed/pip/__main__.py": _PIP_MAIN,
                   "swebed/make-env.sh": _MAKE_ENV}
# the install step runs once at build time, so the image holds the base commit's build, and must leave the
# checkout clean (the generated module is ignored, nothing else is written to /testbed)
_LAYOUT_DOCKERFILE = """FROM %s
COPY opt/ /opt/
COPY swebed/ /tmp/swebed/
RUN bash /tmp/swebed/make-env.sh && rm -rf /tmp/swebed
COPY testbed/ /testbed/
WORKDIR /testbed
RUN bash -c 'source /opt/miniconda3/bin/activate && conda activate testbed && %s && test -z "$(git status --porcelain)"'
"""


def build_layout_images(log=print) -> List[dict]:
    """Build (or reuse) the two images in SWE-bench's layout (conda env at /opt/miniconda3/envs/testbed, install
    step re-run by the official eval script); return their rows as `build_task_images` does, the official install
    command under "_install"."""
    base_id = _base_id(log)
    rows = []
    with _daemon_lock("tasks"):
        for make in LAYOUT_TASKS:
            spec = make()
            work = tempfile.mkdtemp(prefix="swe-task-")
            try:
                made = _commit(os.path.join(work, "testbed"), spec)
                _write(work, _LAYOUT_CONTEXT, ["opt/miniconda3/bin/activate", "swebed/make-env.sh"])
                ref = "%s:%s" % (TASK_REPO, spec["key"])
                dockerfile = _LAYOUT_DOCKERFILE % (BASE_IMAGE, spec["install"])
                digest = hashlib.sha256(json.dumps([base_id, made["base_commit"], sorted(spec["files"].items()),
                                                    sorted(_LAYOUT_CONTEXT.items()), dockerfile]).encode()
                                        ).hexdigest()[:16]
                _build_image(ref, digest, work, dockerfile, log)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            rows.append(dict(_row(spec, made, ref, spec["version"]), _install=spec["install"]))
    return rows


if __name__ == "__main__":
    if sys.argv[1:] == ["build"]:
        t0 = time.monotonic()
        built = build_task_images() + build_layout_images()
        print("swebed: %d task images ready in %.1f s: %s" % (len(built), time.monotonic() - t0,
                                                               ", ".join(r["image"] for r in built)))
    else:
        sys.exit("usage: python3 tests/swebed.py build")
