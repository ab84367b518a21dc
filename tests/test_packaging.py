"""Packaging: standard library only, the reproducible zipapp, and the Python versions it runs on."""
import ast
import glob
import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
import unittest

from tests.support import MODULE, ROOT, clean_env, tempdir


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
    """The interpreter for 'X.Y' from pyenv, or None when this machine has none."""
    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv"), "/root/.pyenv"]
    for root in filter(None, roots):
        for exe in sorted(glob.glob(os.path.join(root, "versions", version + ".*", "bin", "python" + version))):
            return exe
    return None


def build(out_path: str) -> str:
    res = subprocess.run(["bash", os.path.join(ROOT, "build_zipapp.sh"), out_path], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True, timeout=60, env=clean_env())
    assert res.returncode == 0, res.stderr
    return res.stdout


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
        imported.discard("__future__")
        self.assertIn("urllib", imported)  # the walk found the imports at all
        outside = sorted(m for m in imported if not is_stdlib(m))
        self.assertEqual(outside, [], "non-stdlib imports: %s" % outside)

    def test_checker_rejects_a_third_party_module(self):
        self.assertFalse(is_stdlib("requests_not_installed_anywhere"))
        self.assertTrue(is_stdlib("json"))


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
        import zipfile
        with zipfile.ZipFile(a) as zf:
            self.assertEqual(sorted(zf.namelist()), ["__main__.py", "evalharness.py"])

    def test_pyz_and_module_behave_the_same(self):
        d = tempdir(self)
        pyz = os.path.join(d, "e.pyz")
        build(pyz)
        for args in (["--version"], ["run", "--help"], ["run", "--dataset", "/nonexistent.jsonl", "--model", "m",
                                                         "--base-url", "http://127.0.0.1:9/v1"]):
            a = subprocess.run([sys.executable, pyz] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True, env=clean_env(), timeout=60)
            b = subprocess.run([sys.executable, MODULE] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True, env=clean_env(), timeout=60)
            self.assertEqual((a.returncode, a.stdout, a.stderr), (b.returncode, b.stdout, b.stderr), args)

    def test_demo_runs_on_supported_pythons_and_37_is_refused(self):
        d = tempdir(self)
        pyz = os.path.join(d, "e.pyz")
        build(pyz)
        ran = []
        for version in ("3.8", "3.11", "3.13"):
            exe = find_python(version) or (sys.executable if sys.version.startswith(version + ".") else None)
            if exe is None:
                continue
            res = subprocess.run([exe, pyz, "demo", "--out", os.path.join(d, "demo-" + version), "--no-progress"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                                 env=clean_env(), timeout=120)
            self.assertEqual(res.returncode, 0, "%s: %s" % (version, res.stderr))
            self.assertIn("score", res.stdout)
            self.assertTrue(os.path.exists(os.path.join(d, "demo-" + version, "summary.json")))
            ran.append(version)
        self.assertIn(sys.version[:4].rstrip("."), ran + [sys.version[:4].rstrip(".")])
        self.assertTrue(ran)
        old = find_python("3.7")
        if old is None:
            self.skipTest("no Python 3.7 on this machine to check the refusal")
        res = subprocess.run([old, pyz, "demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, env=clean_env(), timeout=60)
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("requires Python >= 3.8", res.stderr)


if __name__ == "__main__":
    unittest.main()
