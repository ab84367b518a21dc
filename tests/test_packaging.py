"""Packaging: standard library only, the reproducible zipapp, and the Python versions it runs on."""
import ast
import glob
import hashlib
import importlib.util
import json
import marshal
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import unittest
import zipfile

import evalharness as eh
from tests.support import CLI, MODULE, ROOT, clean_env, tempdir, unstamped


def stdlib_names():
    names = getattr(sys, "stdlib_module_names", None)
    if names is not None:
        return set(names)
    return None


def is_stdlib(name: str) -> bool:
    names = stdlib_names()
    if names is not None:
        return name in names
    if name in sys.builtin_module_names:  # compiled into the interpreter (sys, time, ...)
        return True
    spec = importlib.util.find_spec(name)  # 3.8/3.9: a module is stdlib if it lives in the stdlib folder
    if spec is None:
        return False
    if spec.origin in ("built-in", "frozen"):
        return True
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    origin = os.path.realpath(spec.origin or "")
    return origin.startswith(stdlib + os.sep) and "site-packages" not in origin


def find_python(version: str):
    """The interpreter for 'X.Y' as .ci/run's find_python finds it: a pyenv one (under $PYENV_ROOT, ~/.pyenv or
    /root/.pyenv), else pythonX.Y on PATH; None when this machine has none."""
    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv"), "/root/.pyenv"]
    for root in filter(None, roots):
        for exe in sorted(glob.glob(os.path.join(root, "versions", version + ".*", "bin", "python" + version))):
            if os.access(exe, os.X_OK):
                return exe
    return shutil.which("python" + version)


def build_python(version: str):
    """The interpreter build_zipapp.sh compiles X.Y's bytecode with (its interpreter(), step for step): the highest
    X.Y.Z of `pyenv versions --bare` by `pyenv prefix`, else pythonX.Y on PATH; None when it finds none."""
    try:
        names = subprocess.run(["pyenv", "versions", "--bare"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               universal_newlines=True, timeout=30, env=clean_env()).stdout.split()
    except OSError:
        names = []
    patches = [v for v in names if re.match(re.escape(version) + r"\.\d+$", v)]
    if patches:
        best = max(patches, key=lambda v: [int(p) for p in v.split(".")])
        res = subprocess.run(["pyenv", "prefix", best], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             universal_newlines=True, timeout=30, env=clean_env())
        exe = os.path.join(res.stdout.strip(), "bin", "python" + version)
        if res.returncode == 0 and os.access(exe, os.X_OK):
            return exe
    return shutil.which("python" + version)


def build(out_path: str, **env) -> str:
    """Build the zipapp at out_path (env: e.g. PYC_VERSIONS="3.8"); returns what the build printed on stdout."""
    res = subprocess.run(["bash", os.path.join(ROOT, "build_zipapp.sh"), out_path], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True, timeout=60, env=clean_env(**env))
    assert res.returncode == 0, res.stderr
    return res.stdout


SUPPORTED = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")


def supported_pythons(test):
    """[(X.Y, interpreter)] for each supported Python the build finds here (found the way it finds them); skips if
    none."""
    found = [(v, build_python(v)) for v in SUPPORTED]
    found = [(v, exe) for v, exe in found if exe]
    if not found:
        test.skipTest("no Python %s-%s on this machine (pyenv or PATH)" % (SUPPORTED[0], SUPPORTED[-1]))
    return found


# Run with a zipapp's path: runs it as `python PYZ --version` does (runpy), with builtins.compile watched, then
# prints (last line) JSON on the module it made. The zipapp compiles through builtins.compile (its __main__.py
# and zipimport's frozen code both call it), so "compiled" lists every compile of evalharness.py.
PROBE = r"""
import builtins, json, linecache, pickle, runpy, sys
pyz = sys.argv[1]
compiled = []
real_compile = builtins.compile
def spy(source, filename, *args, **kwargs):
    compiled.append(str(filename))
    return real_compile(source, filename, *args, **kwargs)
builtins.compile = spy
sys.argv = [pyz, "--version"]
try:
    runpy.run_path(pyz, run_name="__main__")
except SystemExit as exc:
    status = exc.code
finally:
    builtins.compile = real_compile
eh = sys.modules["evalharness"]
import evalharness
main = eh.main.__code__
error = pickle.loads(pickle.dumps(eh.HarnessError("boom")))
print(json.dumps({
    "exit": status, "tag": sys.implementation.cache_tag, "version": eh.__version__,
    "compiled": [f for f in compiled if f.endswith("evalharness.py")],
    "file": eh.__file__, "cached": getattr(eh, "__cached__", None), "origin": eh.__spec__.origin,
    "spec_name": eh.__spec__.name, "import_gives_it": evalharness is eh, "co_filename": main.co_filename,
    "line": linecache.getline(main.co_filename, main.co_firstlineno, eh.__dict__).strip(),
    "unpickled": type(error) is eh.HarnessError and str(error) == "boom"}))
"""

# Run with a zipapp's path: what this interpreter's pyc in it holds, against the archive's own source.
CHECK_PYC = r"""
import importlib.util, json, marshal, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as zf:
    source = zf.read("evalharness.py")
    data = zf.read("evalharness.%s.pyc" % sys.implementation.cache_tag)
code = marshal.loads(data[16:])
print(json.dumps({
    "magic": data[:4] == importlib.util.MAGIC_NUMBER, "flags": int.from_bytes(data[4:8], "little"),
    "source_hash": data[8:16] == importlib.util.source_hash(source),
    "optimize": [level for level in (0, 1, 2)
                 if code == compile(source, "evalharness.py", "exec", dont_inherit=True, optimize=level)]}))
"""


def run_python(exe, args, **env):
    return subprocess.run([exe] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          env=clean_env(**env), timeout=120)


def probe(test, exe, pyz, *flags):
    """(the PROBE's JSON for pyz under exe, the loader line __main__.py wrote on stderr, the first stdout line)."""
    res = run_python(exe, list(flags) + ["-c", PROBE, pyz], EVALHARNESS_DEBUG_LOADER="1")
    test.assertEqual(res.returncode, 0, "%s: %s" % (exe, res.stderr))
    lines = res.stdout.splitlines()
    return json.loads(lines[-1]), res.stderr.strip(), lines[0]


def rewrite(pyz, out, **replace):
    """A copy of the zipapp pyz at out with the entries in replace (name=bytes) replaced."""
    with zipfile.ZipFile(pyz) as src, open(out, "wb") as raw:
        raw.write(b"#!/usr/bin/env python3\n")
        with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                dst.writestr(info, replace.get(info.filename, src.read(info.filename)))


class TestStdlibOnly(unittest.TestCase):
    def test_module_imports_only_standard_library_modules(self):
        with open(MODULE, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_LazyModule":
                imported.add(node.args[0].value.split(".")[0])  # imported at first use (the fast start)
        imported.discard("__future__")
        # stdlib in newer Pythons only, imported where they exist with a fallback (tomllib: 3.11+)
        newer = {"tomllib"}
        if sys.version_info < (3, 11):
            imported -= newer
        self.assertIn("urllib", imported)  # the walk found the imports at all
        outside = sorted(m for m in imported if not is_stdlib(m))
        self.assertEqual(outside, [], "non-stdlib imports: %s" % outside)

    def test_checker_rejects_a_third_party_module(self):
        self.assertFalse(is_stdlib("requests_not_installed_anywhere"))
        self.assertTrue(is_stdlib("json"))


# Run by a Python with the project on sys.path: the modules importing evalharness adds, and what each proxy names.
IMPORT_COST = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
before = set(sys.modules)
import evalharness
added = sorted(set(sys.modules) - before)
lazy = {k: [v._name, list(v._submodules)] for k, v in vars(evalharness).items() if type(v).__name__ == "_LazyModule"}
print(json.dumps({"added": added, "lazy": lazy}))
"""


class TestFastStart(unittest.TestCase):
    """The module imports no standard-library module when it loads (they load at first use, a fast start)."""

    def test_importing_the_module_loads_nothing_but_itself(self):
        res = run_python(sys.executable, ["-c", IMPORT_COST, ROOT])
        self.assertEqual(res.returncode, 0, res.stderr)
        found = json.loads(res.stdout)
        self.assertEqual([m for m in found["added"] if m not in ("evalharness", "__future__")], [])
        self.assertIn("json", found["lazy"])  # the probe saw the proxies at all
        for name, submodules in found["lazy"].values():  # each proxy names a module that imports
            for full in [name] + ["%s.%s" % (name, s) for s in submodules]:
                self.assertIsNotNone(importlib.util.find_spec(full), full)

    def test_a_lazy_module_becomes_the_real_module_at_first_use(self):
        proxy = eh._LazyModule("json")
        self.assertEqual(proxy.dumps([1]), "[1]")
        self.assertIsInstance(eh.__dict__["_LazyModule"]("email", ("utils",)).utils, type(sys))
        eh.json.dumps([1])  # the module's own proxy, used: replaced by the real module in the module's globals
        self.assertIs(eh.__dict__["json"], sys.modules["json"])
        self.assertIsInstance(eh.__dict__["urllib"], eh._LazyModule)  # a package's proxy stays ...
        self.assertIs(eh.urllib.parse, sys.modules["urllib.parse"])  # ... and hands out its submodules

    def test_lazy_patterns_keep_their_inline_flags(self):
        self.assertTrue(eh.SECRET_FIELD_RE.search("OPENAI_API_KEY"))
        self.assertEqual(eh._ACTION_RE.findall("x\n```bash\nls\n```\n"), ["ls\n"])
        self.assertEqual(eh._PUNCTUATION, __import__("string").punctuation)


class TestRecord(unittest.TestCase):
    """_record, the module's small stand-in for dataclasses (whose import and code generation slowed every start)."""

    def setUp(self):
        @eh._record
        class Point:
            x: int
            y: int = 0
            tags: list = eh._Factory(list)
        self.Point = Point

    def test_fields_defaults_factories_and_errors(self):
        p = self.Point(1)
        self.assertEqual((p.x, p.y, p.tags), (1, 0, []))
        self.assertIsNot(p.tags, self.Point(2).tags)  # a new list per instance
        self.assertEqual(self.Point(1, y=2), self.Point(x=1, y=2, tags=[]))
        self.assertEqual(repr(self.Point(1)), "%s(x=1, y=0, tags=[])" % self.Point.__qualname__)
        for bad in (lambda: self.Point(), lambda: self.Point(1, x=2), lambda: self.Point(1, z=2),
                    lambda: self.Point(1, 2, [], 4)):
            self.assertRaises(TypeError, bad)

    def test_frozen_hashable_replace_and_asdict(self):
        p = self.Point(1, 2, ())
        with self.assertRaises(AttributeError):
            p.x = 3
        self.assertEqual(hash(p), hash(self.Point(1, 2, ())))
        q = eh._replace(p, y=5)
        self.assertEqual((q.x, q.y, p.y), (1, 5, 2))
        self.assertRaises(TypeError, eh._replace, p, z=1)
        nested = self.Point(self.Point(1), [self.Point(2)], {"k": (self.Point(3),)})
        self.assertEqual(eh._asdict(nested), {"x": {"x": 1, "y": 0, "tags": []},
                                              "y": [{"x": 2, "y": 0, "tags": []}],
                                              "tags": {"k": ({"x": 3, "y": 0, "tags": []},)}})

    def test_a_record_that_is_not_frozen_can_change_and_is_not_hashable(self):
        @eh._record(frozen=False)
        class Box:
            v: int
        box = Box(1)
        box.v = 2
        self.assertEqual(box, Box(2))
        self.assertRaises(TypeError, hash, box)


class TestZipapp(unittest.TestCase):
    def test_two_builds_have_the_same_sha256_and_the_build_prints_it(self):
        d = tempdir(self)
        a, b = os.path.join(d, "a.pyz"), os.path.join(d, "b.pyz")
        printed = build(a)
        build(b)
        with open(a, "rb") as fa, open(b, "rb") as fb:
            da, db = fa.read(), fb.read()
        self.assertEqual(hashlib.sha256(da).hexdigest(), hashlib.sha256(db).hexdigest())
        self.assertIn(hashlib.sha256(da).hexdigest(), printed)
        with zipfile.ZipFile(a) as zf:
            names = zf.namelist()
        self.assertEqual(names, sorted(names))
        self.assertEqual([n for n in names if not n.endswith(".pyc")], ["__main__.py", "evalharness.py"])
        self.assertTrue(names[1:-1], "no bytecode in the archive")
        for name in names[1:-1]:
            self.assertRegex(name, r"^evalharness\.cpython-3\d+\.pyc$")

    def test_pyz_and_module_behave_the_same(self):
        d = tempdir(self)
        pyz = os.path.join(d, "e.pyz")
        build(pyz)
        for args in (["--version"], ["run", "--help"], ["run", "--dataset", "/nonexistent.jsonl", "--model", "m",
                                                         "--base-url", "http://127.0.0.1:9/v1"]):
            a = subprocess.run([sys.executable, pyz] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True, env=clean_env(), timeout=60)
            b = subprocess.run([sys.executable, CLI] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True, env=clean_env(), timeout=60)
            self.assertEqual((a.returncode, a.stdout, unstamped(a.stderr)), (b.returncode, b.stdout, unstamped(b.stderr)),
                             args)  # (stderr is a pipe: its lines start with the time)

    def test_demo_runs_on_supported_pythons_and_37_is_refused(self):
        d = tempdir(self)
        pyz = os.path.join(d, "e.pyz")
        build(pyz)
        ran = []
        here = "%d.%d" % sys.version_info[:2]  # (the Python running the suite is always one of them)
        for version in sorted({"3.8", "3.11", "3.13", here}, key=lambda v: int(v.split(".")[1])):
            exe = find_python(version) or (sys.executable if version == here else None)
            if exe is None:
                continue
            res = subprocess.run([exe, pyz, "demo", "--out", os.path.join(d, "demo-" + version), "--no-progress"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                                 env=clean_env(), timeout=120)
            self.assertEqual(res.returncode, 0, "%s: %s" % (version, res.stderr))
            self.assertIn("score", res.stdout)
            self.assertTrue(os.path.exists(os.path.join(d, "demo-" + version, "summary.json")))
            ran.append(version)
        self.assertIn(here, ran)
        self.assertTrue(ran)
        old = find_python("3.7")
        if old is None:
            self.skipTest("no Python 3.7 on this machine to check the refusal")
        res = subprocess.run([old, pyz, "demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, env=clean_env(), timeout=60)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("requires Python >= 3.8", res.stderr)


class TestZipappBytecode(unittest.TestCase):
    """The zipapp starts from the bytecode built for the running Python, else from the source."""

    def test_archive_holds_bytecode_of_its_source_at_optimize_0_for_each_python_found(self):
        d = tempdir(self)
        pyz = os.path.join(d, "e.pyz")
        build(pyz)
        with zipfile.ZipFile(pyz) as zf:
            names = set(zf.namelist())
        pythons = supported_pythons(self)
        for version, exe in pythons:
            res = run_python(exe, ["-c", CHECK_PYC, pyz])
            self.assertEqual(res.returncode, 0, "%s: %s" % (version, res.stderr))
            pyc = json.loads(res.stdout)
            self.assertEqual((pyc["magic"], pyc["flags"], pyc["source_hash"]), (True, 1, True), version)
            self.assertIn(0, pyc["optimize"], version)
            self.assertNotIn(2, pyc["optimize"], version)  # -OO drops docstrings: the check tells levels apart
        tags = {run_python(exe, ["-c", "import sys; print(sys.implementation.cache_tag)"]).stdout.strip()
                for _, exe in pythons}
        self.assertEqual(tags - {n[len("evalharness."):-len(".pyc")] for n in names if n.endswith(".pyc")}, set())

    def test_each_python_runs_the_zipapp_from_its_bytecode_without_compiling_the_module(self):
        d = tempdir(self)
        pyz = os.path.join(d, "e.pyz")
        build(pyz)
        for version, exe in supported_pythons(self):
            got, loader, first = probe(self, exe, pyz)
            pyc = os.path.join(pyz, "evalharness.%s.pyc" % got["tag"])
            source = os.path.join(pyz, "evalharness.py")
            self.assertEqual(loader, "evalharness loader: bytecode " + pyc, version)
            self.assertEqual(got["compiled"], [], version)
            self.assertEqual((got["exit"], first), (0, "evalharness " + got["version"]), version)
            self.assertEqual((got["file"], got["origin"], got["cached"], got["spec_name"]),
                             (source, source, pyc, "evalharness"), version)
            self.assertTrue(got["import_gives_it"] and got["unpickled"], version)
            self.assertEqual(got["co_filename"], source, version)  # tracebacks name the archive's source
            self.assertTrue(got["line"].startswith("def main("), version)
            res = run_python(exe, [pyz, "--version"], EVALHARNESS_DEBUG_LOADER="1")  # as a user runs it
            self.assertEqual((res.returncode, res.stdout.strip()), (0, first), version)
            self.assertIn("evalharness loader: bytecode ", res.stderr, version)

    def test_a_python_without_bytecode_in_the_archive_compiles_the_source_once(self):
        pythons = [(v, find_python(v)) for v in SUPPORTED]
        pythons = [(v, exe) for v, exe in pythons if exe]
        d = tempdir(self)
        cases = [(sys.executable, os.path.join(d, "none.pyz"), "none")]
        if len(pythons) > 1:  # built with one Python's bytecode only, run by another
            cases.append((pythons[-1][1], os.path.join(d, "one.pyz"), pythons[0][0]))
            cases.append((pythons[0][1], os.path.join(d, "other.pyz"), pythons[-1][0]))
        for exe, pyz, only in cases:
            build(pyz, PYC_VERSIONS=only)
            got, loader, first = probe(self, exe, pyz)
            source = os.path.join(pyz, "evalharness.py")
            self.assertEqual(loader, "evalharness loader: source %s (no evalharness.%s.pyc in the archive)"
                             % (source, got["tag"]), (exe, only))
            self.assertEqual(got["compiled"], [source], (exe, only))  # once: zipimport alone would compile twice
            self.assertEqual((got["exit"], first), (0, "evalharness " + got["version"]))
            self.assertEqual((got["file"], got["origin"], got["co_filename"]), (source, source, source))
            self.assertTrue(got["import_gives_it"] and got["unpickled"] and got["line"].startswith("def main("))

    def test_damaged_or_foreign_bytecode_and_python_O_fall_back_to_the_source(self):
        d = tempdir(self)
        pyz = os.path.join(d, "e.pyz")
        build(pyz)
        name = "evalharness.%s.pyc" % sys.implementation.cache_tag
        here = "%d.%d" % sys.version_info[:2]
        with zipfile.ZipFile(pyz) as zf:
            if name not in zf.namelist():
                self.assertIsNone(build_python(here), "the build has a Python %s but put no %s in the archive"
                                  % (here, name))
                self.skipTest("the build found no Python %s for bytecode" % here)
            good = zf.read(name)
        bad = [("not unchecked-hash bytecode", b"\0\0\0\0" + good[4:]),   # another Python's magic number
               ("not unchecked-hash bytecode", good[:4] + b"\3\0\0\0" + good[8:]),  # checked hash
               ("damaged", good[:1000]),                                    # cut short
               ("damaged", good[:16] + marshal.dumps(12345))]               # not a code object
        cases = []
        for i, (why, data) in enumerate(bad):
            cases.append((os.path.join(d, "bad%d.pyz" % i), why, []))
            rewrite(pyz, cases[-1][0], **{name: data})
        cases += [(pyz, "python -O", ["-O"]), (pyz, "python -O", ["-OO"])]
        for path, why, flags in cases:
            got, loader, first = probe(self, sys.executable, path, *flags)
            self.assertTrue(loader.startswith("evalharness loader: source %s (" % os.path.join(path, "evalharness.py")),
                            loader)
            self.assertIn(why, loader)
            self.assertEqual(len(got["compiled"]), 1, why)
            self.assertEqual((got["exit"], first), (0, "evalharness " + got["version"]), why)


if __name__ == "__main__":
    unittest.main()
