#!/usr/bin/env python3
"""SWE-bench scoring parity: evalharness against the official `swebench` package (by hand; CI never runs it).

One synthetic but realistic instance is made for every (repo, version) of swebench 4.1.0's
MAP_REPO_VERSION_TO_SPECS_PY whose test_cmd is set: the 12 SWE-bench repositories and the other repositories of
the table (dbt-core has no test_cmd and is left out). Each is a dataset row (test patch in the repository's
layout, FAIL_TO_PASS / PASS_TO_PASS ids as its runner prints them, kept as the official parsers keep them), and
gets a dozen or so eval logs in its runner's real format (pytest -rA in the styles of pytest 3 to 8, ANSI colour
for the pytest_v2 repositories, django at verbosity 2, sympy's bin/test, seaborn, tox around sphinx), wrapped as
an eval script's output is (xtrace lines, the markers, a `>>>>> Test Exit Code: N` line in some), plus broken logs
(patch apply failed, markers missing, no results). Compared:

  1. the eval script: 4.1.0's make_eval_script_list_py joined as TestSpec.eval_script joins it, against
     evalharness.swe_eval_script, after undoing evalharness's two deliberate additions (the activation lines
     inside `if [ -f /opt/miniconda3/bin/activate ]; then ...; fi`, and `rc=$?` after the test command with
     `echo '>>>>> Test Exit Code: '$rc` after the end marker); any other difference in the commands is reported;
  2. the verdict on each log: 5.0.2's get_logs_eval + get_eval_report (get_eval_tests_report,
     get_resolution_status == RESOLVED_FULL), the same in 4.1.0, and evalharness.swe_verdict;
  3. the patch-apply chain: evalharness.SWE_APPLY_CMDS against GIT_APPLY_CMDS of 5.0.2 and 4.1.0.

Verdicts are printed as res (RESOLVED_FULL), unres (graded, not resolved) or none (no parseable results:
SWE-bench's patch_successfully_applied is false, an error instance).

The official code runs in throwaway virtualenvs, one per version (`pip install swebench==4.1.0` and
`swebench==5.0.2` from the package index, both at once; if an install with dependencies fails: `--no-deps` plus
unidiff, requests, python-dotenv and tqdm, and the child stubs the other modules swebench imports (docker,
datasets, modal, ...), for swebench's own imports only). Each venv's python runs a child script that reads the
instances and logs as JSON and writes the official results as JSON. This process imports only the standard
library and evalharness (from the repository root).

    python3 bench/swebench_parity.py [--keep-venv DIR] [--seed N] [--max-lines N] [--repo SUBSTR] [--no-deps]

It makes the two venvs in a temporary directory and removes them (--keep-venv DIR: made in DIR, kept, and reused
when DIR already holds them; about 1 GB with dependencies, 60 MB with --no-deps). About a minute: making the
venvs takes some 35 s (8 s with --no-deps, none when reused), generating and comparing ~280 instances and ~5200
logs some 10 s. Exit 0 whatever it finds; 1 when it could not run.

Output: the differences, one per line, grouped (verdict differences from 5.0.2; where 4.1.0 and 5.0.2 disagree;
per-test reports that differ under the same verdict; eval-script differences; errors), the patch-apply chain, a
table of verdicts per log case, a table of counts per repository, and one summary line:
`parity: N instances over R repos / V (repo, version) pairs, L logs: D verdict differences from 5.0.2 (K where
4.1.0 and 5.0.2 disagree; U outside the README's documented choices), S eval-script differences`, where K counts
the D logs on which 4.1.0 and 5.0.2 also disagree (evalharness sided with 4.1.0 or with neither), U those no
documented choice explains (the target is 0; the line above it counts the differences by cause) and S the
instances whose eval script differs.

Measured 2026-12-01 (seeds 1-4): 283 instances over 19 repos, 5203 logs, 329-332 differences from 5.0.2, all of
them where 4.1.0 and 5.0.2 disagree and all explained by the two documented choices (the exit-code rule: ~306;
pytest_v2 XFAIL keyed by its id: 24); 0 undocumented; 0 eval-script differences.
"""
import argparse
import collections
import difflib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import evalharness as eh  # noqa: E402

VERSIONS = ("4.1.0", "5.0.2")
V4, V5 = VERSIONS
SWE_REPOS = ("astropy/astropy", "django/django", "matplotlib/matplotlib", "mwaskom/seaborn", "pallets/flask",
             "psf/requests", "pydata/xarray", "pylint-dev/pylint", "pytest-dev/pytest", "scikit-learn/scikit-learn",
             "sphinx-doc/sphinx", "sympy/sympy")
# swebench's own imports that a --no-deps install needs for grading, log_parsers and test_spec; the rest is stubbed
FALLBACK_DEPS = ("unidiff", "requests", "python-dotenv", "tqdm")
STUBBED_ROOTS = ("docker", "datasets", "modal", "tenacity", "ghapi", "fastcore", "bs4", "git", "rich", "typer",
                 "chardet", "yaml", "dotenv", "tqdm", "requests", "huggingface_hub", "pre_commit")
WIDTH = 120
START, END = ">>>>> Start Test Output", ">>>>> End Test Output"
BAD_MARKERS = (">>>>> Patch Apply Failed", ">>>>> Reset Failed", ">>>>> Tests Errored", ">>>>> Tests Timed Out")
EXIT_CODE_RE = re.compile(r">>>>> Test Exit Code:\s*(-?\d+)")  # the first one, as 5.0.2 reads it
NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")

# ----------------------------------------------------------------------------- the child (runs in a venv)

CHILD = r'''
import ast, importlib.abc, importlib.machinery, json, os, shutil, sys, tempfile, types

STUBBED = []


def install_stubs(roots):
    """Stand-ins for modules a --no-deps install lacks (found after the real ones, so installed modules win)."""
    class Meta(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return cls

    class Stub(metaclass=Meta):
        def __init__(self, *a, **k):
            pass

        def __call__(self, *a, **k):
            return a[0] if len(a) == 1 and not k and callable(a[0]) else Stub()

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Stub()

        def __iter__(self):
            return iter(())

    class StubModule(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Stub

    def from_swebench():
        """Is the import being made by swebench's code (not, say, requests probing for an optional module)?"""
        f = sys._getframe(2)
        while f is not None:
            name = f.f_globals.get("__name__") or ""
            if not name.startswith(("importlib", "_frozen_importlib")):
                return name.split(".")[0] == "swebench"
            f = f.f_back
        return False

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            if fullname.split(".")[0] in roots and from_swebench():
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            STUBBED.append(spec.name)
            mod = StubModule(spec.name)
            mod.__path__ = []
            return mod

        def exec_module(self, module):
            pass

    sys.meta_path.append(Finder())


def apply_chain(pkg_dir):
    """GIT_APPLY_CMDS, read from the source (run_evaluation imports docker and friends), plus what surrounds it."""
    out = {"where": None, "cmds": None, "reset_between": None, "reverse_check": None}
    for rel in ("harness/constants/__init__.py", "harness/run_evaluation.py"):
        path = os.path.join(pkg_dir, *rel.split("/"))
        if not os.path.exists(path):
            continue
        src = open(path, encoding="utf-8").read()
        for node in ast.parse(src).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "GIT_APPLY_CMDS" for t in node.targets):
                out.update(where=rel, cmds=ast.literal_eval(node.value))
        if "run_evaluation" in rel:
            out["reset_between"] = "git checkout -- . ; git clean -fd" if "git checkout -- . ; git clean -fd" in src \
                else None
            out["reverse_check"] = "git apply --check --reverse" in src
    return out


def main():
    with open(sys.argv[1], encoding="utf-8") as fh:
        req = json.load(fh)
    if req.get("stub"):
        install_stubs(set(req["stub"]))
    import swebench
    from swebench.harness import grading
    version = swebench.__version__
    pkg_dir = os.path.dirname(swebench.__file__)
    out = {"version": version, "apply": apply_chain(pkg_dir), "stubbed": STUBBED}
    major = int(version.split(".")[0])
    if major < 5:
        from swebench.harness.constants.python import MAP_REPO_VERSION_TO_SPECS_PY as SPECS
        from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY as PARSERS
        from swebench.harness.constants import FAIL_ONLY_REPOS
    else:
        from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY as PARSERS
        from swebench.harness.log_parsers import PARSER_REGISTRY
        from swebench.harness.constants import FAIL_ONLY_REPOS
        from swebench.types import TestSpec
    if req["op"] == "table":
        out["table"] = {repo: {v: {k: s.get(k) for k in ("test_cmd", "install", "eval_commands", "python")}
                               for v, s in specs.items()} for repo, specs in SPECS.items()}
        out["parsers"] = {repo: fn.__name__ for repo, fn in PARSERS.items()}
    if req["op"] != "eval":
        return out
    if major < 5:
        from swebench.harness.test_spec.python import make_eval_script_list_py
    scripts, verdicts = {}, {}
    tmp = tempfile.mkdtemp(prefix="swebench-parity-")
    for n, inst in enumerate(req["instances"]):
        iid, repo = inst["instance_id"], inst["repo"]
        f2p, p2p = json.loads(inst["FAIL_TO_PASS"]), json.loads(inst["PASS_TO_PASS"])
        if major < 5:
            try:
                lst = make_eval_script_list_py(inst, SPECS[repo][inst["version"]], "testbed", "/testbed",
                                               inst["base_commit"], inst["test_patch"])
                # as TestSpec.eval_script joins it
                scripts[iid] = {"script": "\n".join(["#!/bin/bash", "set -uxo pipefail"] + lst) + "\n"}
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                scripts[iid] = {"error": "%s: %s" % (type(exc).__name__, exc)}
            spec = types.SimpleNamespace(instance_id=iid, repo=repo, version=inst["version"],
                                         FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p)
        else:
            fn = PARSERS.get(repo)
            name = inst.get("log_parser") or next((k for k, f in PARSER_REGISTRY.items() if f is fn), None)
            spec = TestSpec(instance_id=iid, image="", eval_script_list=[], repo=repo, version=inst["version"],
                            FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p, log_parser=name or "",
                            eval_type="fail_only" if repo in FAIL_ONLY_REPOS else "pass_and_fail")
        pred = {"instance_id": iid, "model_patch": "diff", "model_name_or_path": "parity"}
        for case, log in req["logs"].get(iid, []):
            path = os.path.join(tmp, "log%d.txt" % n)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(log)
            try:
                statuses, found = grading.get_logs_eval(spec, path)
                rep = grading.get_eval_report(spec, pred, path, True)[iid]
                verdicts["%s\t%s" % (iid, case)] = {
                    "found": rep["patch_successfully_applied"], "resolved": rep["resolved"],
                    "tests_status": rep.get("tests_status"), "statuses": statuses,
                    "found_logs_eval": found}
            except Exception as exc:  # noqa: BLE001
                verdicts["%s\t%s" % (iid, case)] = {"error": "%s: %s" % (type(exc).__name__, exc)}
    shutil.rmtree(tmp, ignore_errors=True)
    out.update(scripts=scripts, verdicts=verdicts)
    return out


result = main()
with open(sys.argv[2], "w", encoding="utf-8") as fh:
    json.dump(result, fh)
'''


# ----------------------------------------------------------------------------- virtualenvs

def _venv_python(d):
    return os.path.join(d, "bin", "python")


def _installed(py, version):
    try:
        out = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('swebench'))"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and out.stdout.strip() == version


def make_venvs(base, python, force_no_deps, say):
    """{version: {python, no_deps, reused, seconds}}: both installs run at once; a failed one is retried
    --no-deps with FALLBACK_DEPS (the child then stubs swebench's other imports)."""
    t0 = time.monotonic()
    envs, procs = {}, {}
    for v in VERSIONS:
        d = os.path.join(base, "swebench-" + v)
        py = _venv_python(d)
        marker = os.path.join(d, "parity-no-deps")
        if _installed(py, v) and (os.path.exists(marker) or not force_no_deps):
            envs[v] = {"python": py, "no_deps": os.path.exists(marker), "reused": True, "dir": d}
            continue
        shutil.rmtree(d, ignore_errors=True)
        subprocess.run([python, "-m", "venv", d], check=True)
        envs[v] = {"python": py, "no_deps": False, "reused": False, "dir": d}
        if force_no_deps:
            continue
        log = open(os.path.join(d, "pip-install.log"), "w")
        procs[v] = (subprocess.Popen([py, "-m", "pip", "install", "-q", "swebench==" + v], stdout=log,
                                     stderr=subprocess.STDOUT), log)
    for v, (proc, log) in procs.items():
        proc.wait()
        log.close()
        if proc.returncode == 0 and _installed(envs[v]["python"], v):
            continue
        with open(log.name) as fh:
            tail = [ln for ln in fh.read().splitlines() if "is ignored: it is neither" not in ln][-5:]
        say("pip install swebench==%s failed (%s); retrying --no-deps plus %s"
            % (v, " | ".join(tail)[:200] or "exit %d" % proc.returncode, " ".join(FALLBACK_DEPS)))
    for v, env in envs.items():
        if env["reused"] or _installed(env["python"], v):
            continue
        with open(os.path.join(env["dir"], "pip-install-nodeps.log"), "w") as log:
            for args in (["--no-deps", "swebench==" + v], list(FALLBACK_DEPS)):
                rc = subprocess.run([env["python"], "-m", "pip", "install", "-q"] + args, stdout=log,
                                    stderr=subprocess.STDOUT).returncode
                if rc:
                    raise SystemExit("bench/swebench_parity.py: pip install %s failed (see %s)" % (args, log.name))
        open(os.path.join(env["dir"], "parity-no-deps"), "w").close()
        env["no_deps"] = True
    for env in envs.values():
        env["seconds"] = time.monotonic() - t0
    return envs


def run_child(env, request, work):
    req_path = os.path.join(work, "req-%d.json" % os.getpid())
    out_path = os.path.join(work, "out-%d.json" % os.getpid())
    child = os.path.join(work, "parity_child.py")
    with open(child, "w", encoding="utf-8") as fh:
        fh.write(CHILD)
    request = dict(request, stub=list(STUBBED_ROOTS) if env["no_deps"] else None)
    with open(req_path, "w", encoding="utf-8") as fh:
        json.dump(request, fh)
    proc = subprocess.run([env["python"], child, req_path, out_path], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=900,
                          env=dict(os.environ, PYTHONUTF8="1", PYTHONDONTWRITEBYTECODE="1"), cwd=work)
    if proc.returncode:
        raise SystemExit("bench/swebench_parity.py: the %s child failed:\n%s" % (env["python"], proc.stderr[-3000:]))
    with open(out_path, encoding="utf-8") as fh:
        return json.load(fh)


# ----------------------------------------------------------------------------- instances

# repository -> (runner kind, [(test file, class or None)], source file the model's patch edits)
PROFILES = {
    "astropy/astropy": ("pytest", [("astropy/io/fits/tests/test_header.py", "TestHeaderFunctions"),
                                   ("astropy/units/tests/test_format.py", None),
                                   ("astropy/modeling/tests/test_separable.py", None),
                                   ("astropy/io/ascii/tests/test_qdp.py", None)], "astropy/io/fits/card.py"),
    "django/django": ("django", [("tests/migrations/test_operations.py", "OperationTests"),
                                 ("tests/admin_views/tests.py", "AdminViewBasicTest"),
                                 ("tests/model_fields/test_jsonfield.py", "TestQuerying"),
                                 ("tests/utils_tests/test_http.py", "URLEncodeTests")], "django/db/models/query.py"),
    "matplotlib/matplotlib": ("pytest", [("lib/matplotlib/tests/test_axes.py", None),
                                         ("lib/matplotlib/tests/test_widgets.py", None),
                                         ("lib/mpl_toolkits/mplot3d/tests/test_axes3d.py", None)],
                              "lib/matplotlib/axes/_base.py"),
    "mwaskom/seaborn": ("pytest", [("tests/test_relational.py", "TestLinePlotter"),
                                   ("tests/_core/test_plot.py", "TestPlotting"),
                                   ("tests/test_categorical.py", None)], "seaborn/_core/scales.py"),
    "pallets/flask": ("pytest", [("tests/test_blueprints.py", None), ("tests/test_basic.py", None),
                                 ("tests/test_config.py", None)], "src/flask/blueprints.py"),
    "psf/requests": ("pytest", [("tests/test_requests.py", "TestRequests"), ("tests/test_utils.py", None),
                                ("test_requests.py", "RequestsTestCase")], "requests/sessions.py"),
    "pydata/xarray": ("pytest", [("xarray/tests/test_dataset.py", "TestDataset"),
                                 ("xarray/tests/test_dataarray.py", "TestDataArray"),
                                 ("xarray/tests/test_computation.py", None)], "xarray/core/dataset.py"),
    "pylint-dev/pylint": ("pytest", [("tests/test_self.py", "TestRunTC"),
                                     ("tests/checkers/unittest_imports.py", "TestImportsChecker"),
                                     ("tests/lint/unittest_lint.py", None)], "pylint/lint/pylinter.py"),
    "pytest-dev/pytest": ("pytest", [("testing/test_skipping.py", "TestXFail"), ("testing/test_terminal.py", None),
                                     ("testing/python/collect.py", "TestFunction")], "src/_pytest/skipping.py"),
    "scikit-learn/scikit-learn": ("pytest", [("sklearn/linear_model/tests/test_logistic.py", None),
                                             ("sklearn/metrics/tests/test_ranking.py", None),
                                             ("sklearn/utils/tests/test_validation.py", None)],
                                  "sklearn/utils/validation.py"),
    "sphinx-doc/sphinx": ("pytest", [("tests/test_ext_autodoc.py", None), ("tests/test_domain_py.py", None),
                                     ("tests/test_build_html.py", None)], "sphinx/ext/autodoc/__init__.py"),
    "sympy/sympy": ("sympy", [("sympy/core/tests/test_basic.py", None), ("sympy/printing/tests/test_latex.py", None),
                              ("sympy/solvers/tests/test_solveset.py", None)], "sympy/core/basic.py"),
    "marshmallow-code/marshmallow": ("pytest", [("tests/test_fields.py", "TestField"),
                                                ("tests/test_schema.py", None)], "src/marshmallow/fields.py"),
    "pvlib/pvlib-python": ("pytest", [("pvlib/tests/test_irradiance.py", None), ("pvlib/tests/test_pvsystem.py", None)],
                           "pvlib/irradiance.py"),
    "pydicom/pydicom": ("pytest", [("pydicom/tests/test_dataset.py", "TestDataset"),
                                   ("pydicom/tests/test_filereader.py", None)], "pydicom/dataset.py"),
    "pylint-dev/astroid": ("pytest", [("tests/unittest_inference.py", "InferenceTest"),
                                      ("tests/test_nodes.py", None)], "astroid/nodes/node_classes.py"),
    "pyvista/pyvista": ("pytest", [("tests/test_polydata.py", None), ("tests/plotting/test_plotting.py", None)],
                        "pyvista/core/pointset.py"),
    "sqlfluff/sqlfluff": ("pytest", [("test/rules/std_test.py", None), ("test/cli/commands_test.py", None)],
                          "src/sqlfluff/rules/L003.py"),
    "swe-bench/humaneval": ("pytest", [("test.py", None)], "main.py"),
}
PATH_PARAM_REPOS = ("psf/requests", "pydicom/pydicom", "pylint-dev/pylint")
V2_REPOS = ("astropy/astropy", "scikit-learn/scikit-learn", "sphinx-doc/sphinx")
VERBS = ("parse", "roundtrip", "repr", "init", "copy", "update", "compare", "validate", "render", "serialize",
         "merge", "resolve", "convert", "format", "select", "reduce", "sort", "lookup")
NOUNS = ("header", "unit", "index", "empty_input", "nested_keys", "unicode", "large_values", "defaults", "kwargs",
         "none", "dtype", "alias", "missing_key", "scalar", "timezone", "offsets")
PLAIN_PARAMS = ("[True]", "[False]", "[float32]", "[int64-2]", "[1-0]", "[case3]", "[None-x]", "[a[0]-b]")
PATH_PARAMS = {"psf/requests": "/testbed/tests/certs/valid/ca.crt", "pydicom/pydicom": "/testbed/pydicom/data/"
               "test_files/CT_small.dcm", "pylint-dev/pylint": "/testbed/tests/regrtest_data/dummy_plugin"}
SPACED_PARAMS = ("[a b]", "[log(photon /cm**2 /s)]", "[[1, 2]]", "[x - y]", "[s = 'a b']")
DJANGO_DOCS = ("Regression test for #10348: ChangeList.get_results() will count", "A model with a JSONField can be "
               "saved and queried.", "Tests for the URL encoding of non-ASCII query strings.")


def _hex(rng, n=40):
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def _hunk(rng, path, added, new=False):
    """One file of a unified git diff with correct hunk counts (the official side parses it with unidiff)."""
    if new:
        return ("diff --git a/{p} b/{p}\nnew file mode 100644\nindex 0000000..{i}\n--- /dev/null\n+++ b/{p}\n"
                "@@ -0,0 +1,{n} @@\n{body}").format(p=path, i=_hex(rng, 7), n=len(added),
                                                    body="".join("+%s\n" % a for a in added))
    start = rng.randint(5, 400)
    ctx = ["", "", "    assert result == expected"]
    return ("diff --git a/{p} b/{p}\nindex {a}..{b} 100644\n--- a/{p}\n+++ b/{p}\n@@ -{s},3 +{s},{m} @@\n"
            "{ctx}{body}").format(p=path, a=_hex(rng, 7), b=_hex(rng, 7), s=start, m=3 + len(added),
                                  ctx="".join(" %s\n" % c for c in ctx), body="".join("+%s\n" % a for a in added))


class Test:
    """A test as its runner prints it (``printed``) and as a dataset lists it (``dataset``, what SWE-bench's
    parsers kept when the dataset was made: ids cut at the first space (#290), path parameters cut to their last
    part, matplotlib's MouseButton written as a number)."""

    def __init__(self, repo, kind, file, cls, name, param="", doc=None, py311=False):
        self.file, self.cls, self.name, self.param, self.doc = file, cls, name, param, doc
        self.line = 10 + (sum(map(ord, name + param)) % 900)
        if kind == "django":
            module = file[len("tests/"):-3].replace("/", ".")
            where = "%s.%s" % (module, cls) + (".%s" % name if py311 else "")
            self.printed = "%s (%s)" % (name, where)
            self.dataset = doc or self.printed
        elif kind == "sympy":
            self.printed = self.dataset = name
        else:
            self.printed = "::".join([file] + ([cls] if cls else []) + [name + param])
            did = self.printed.split()[0]
            if repo in PATH_PARAM_REPOS:
                m = re.match(r"(.*?)\[(.*)\]$", did)
                if m and m.group(2).startswith("/") and not m.group(2).startswith("//") and "*" not in m.group(2):
                    did = "%s[/%s]" % (m.group(1), m.group(2).split("/")[-1])
            elif repo == "matplotlib/matplotlib":
                did = did.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3")
            self.dataset = did


class Instance:
    def __init__(self, repo, version, spec, n, rng):
        self.repo, self.version, self.spec = repo, version, spec
        self.kind, files, self.source = PROFILES.get(repo, ("pytest", [("tests/test_core.py", None)], "src/core.py"))
        owner, name = repo.split("/")
        self.id = "%s__%s-%d" % (owner, name, 1000 + n * 37 + rng.randint(0, 30))
        self.base = _hex(rng)
        self.py311 = spec.get("python") == "3.11"
        self.style = self._style(rng)
        self.ansi = repo in V2_REPOS and n % 2 == 0
        names = iter(rng.sample(["test_%s_%s" % (v, o) for v in VERBS for o in NOUNS], 40))
        shape = n % 5  # 0 one file, 1 two files, 2 a new file besides, 3 only new files, 4 a data file besides
        picked = files[:2] if shape == 1 else files[:1]
        if shape == 3 and self.kind == "django":
            picked = [("tests/%s_regress/tests.py" % files[0][0].split("/")[1], "RegressTests")]
        self.new_files = {f for f, _ in picked} if shape == 3 else set()
        mk = lambda f, c, nm, p="", doc=None: Test(repo, self.kind, f, c, nm, p, doc, self.py311)  # noqa: E731
        f0, c0 = picked[0]
        self.f2p, self.p2p, self.extra = [], [], []
        self.f2p.append(mk(f0, c0, next(names)))
        if self.kind == "pytest":
            self.f2p.append(mk(f0, c0, next(names), rng.choice(PLAIN_PARAMS)))
            if n % 2 == 0:  # an id with a space in a parameter: the dataset holds it cut short (#290)
                self.f2p.append(mk(f0, None, next(names), SPACED_PARAMS[n // 2 % len(SPACED_PARAMS)]))
        elif self.kind == "django" and n % 3 == 0:
            self.f2p.append(mk(f0, c0, next(names), doc=DJANGO_DOCS[n % len(DJANGO_DOCS)]))
        for i in range(rng.randint(3, 5)):
            f, c = picked[i % len(picked)]
            self.p2p.append(mk(f, c, next(names)))
        if repo in PATH_PARAM_REPOS:
            self.p2p.append(mk(f0, None, next(names), "[%s]" % PATH_PARAMS[repo]))
            self.p2p.append(mk(f0, None, next(names), "[//server/share]"))
            self.p2p.append(mk(f0, None, next(names), "[/tmp/*.py]"))
        if repo == "matplotlib/matplotlib":
            self.p2p.append(mk(f0, None, next(names), "[MouseButton.LEFT]"))
            self.p2p.append(mk(f0, None, next(names), "[MouseButton.RIGHT-png]"))
        for i in range(3):  # run but not listed (the last of a sympy file is never listed: its line ends [OK])
            f, c = picked[i % len(picked)]
            self.extra.append(mk(f, c, next(names)))
        self.wrapped_progress = repo == "pytest-dev/pytest" and version in ("5.4", "6.0")  # pytest-5262, -7521
        # the test patch
        parts = []
        for f, _ in picked:
            added = ["def %s():" % t.name for t in self.f2p + self.p2p if t.file == f][:3] + ["    assert True"]
            parts.append(_hunk(rng, f, added, new=f in self.new_files))
        if shape == 2:
            d = os.path.dirname(f0) or "tests"
            parts.append(_hunk(rng, d + "/test_regression_%d.py" % n, ["def test_regression():", "    pass"], True))
        if shape == 4:
            d = os.path.dirname(f0) or "tests"
            parts.append(_hunk(rng, d + "/data/expected.json", ['{"key": 1}']))
        self.test_patch = "".join(parts)
        self.patch = _hunk(rng, self.source, ["    return value  # fixed"])
        self.row = {"instance_id": self.id, "repo": repo, "version": version, "base_commit": self.base,
                    "problem_statement": "%s: %s misbehaves on %s input." % (repo, self.f2p[0].name, version),
                    "patch": self.patch, "test_patch": self.test_patch,
                    "FAIL_TO_PASS": json.dumps([t.dataset for t in self.f2p]),
                    "PASS_TO_PASS": json.dumps([t.dataset for t in self.p2p] +
                                               (["[100%]"] if self.wrapped_progress else []))}

    def _style(self, rng):
        if self.repo == "pytest-dev/pytest":
            return self.version.split(".")[0]
        if self.repo == "astropy/astropy" and "classic" in (self.spec.get("test_cmd") or ""):
            return "classic"
        if self.repo == "mwaskom/seaborn":
            return rng.choice("78")
        return rng.choice("5678")

    @property
    def tests(self):
        return self.f2p + self.p2p + self.extra


def make_instances(table, rng, repo_filter):
    out = []
    repos = [r for r in SWE_REPOS if r in table] + sorted(r for r in table if r not in SWE_REPOS)
    for repo in repos:
        if repo_filter and repo_filter not in repo:
            continue
        versions = [v for v, s in table[repo].items() if s.get("test_cmd") is not None]
        for n, version in enumerate(versions):
            out.append(Instance(repo, version, table[repo][version], n, rng))
    return out


# ----------------------------------------------------------------------------- logs

def _colour(word, ansi):
    if not ansi:
        return word
    code = {"PASSED": "32", "FAILED": "31", "ERROR": "31", "SKIPPED": "33", "XFAIL": "33", "XPASS": "33"}[word]
    return ("\x1b[1m" if word in ("FAILED", "ERROR") else "") + "\x1b[%sm%s\x1b[0m" % (code, word)


def render_pytest(inst, outcomes, order):
    style, ansi = inst.style, inst.ansi
    old = style in ("3", "4", "classic")
    secs = "in 0.52s" if style not in ("3", "4", "5", "classic") else "in 0.52 seconds"
    lines = []
    if inst.repo != "mwaskom/seaborn":
        lines += ["============================= test session starts ==============================",
                  "platform linux -- Python 3.9.20, pytest-%s, py-1.11.0, pluggy-1.3.0"
                  % {"classic": "3.3.1"}.get(style, style + ".2.0"), "rootdir: /testbed",
                  ("inifile: setup.cfg" if old or style == "5" else "configfile: setup.cfg")]
        if inst.repo == "sphinx-doc/sphinx":
            lines += ["libraries: Sphinx-%s.0+/%s, docutils-0.17.1" % (inst.version, inst.base[:8]),
                      "base tempdir: /tmp/pytest-of-root/pytest-0"]
    lines += ["collected %d items" % len(order), ""]
    if style == "classic":  # -vv -o console_output_style=classic: one `id STATUS` line per test
        for t in order:
            lines.append("%s %s" % (t.printed, _colour(outcomes[t], ansi)))
    else:
        char = {"PASSED": ".", "FAILED": "F", "ERROR": "E", "SKIPPED": "s", "XFAIL": "x", "XPASS": "X"}
        for f in dict.fromkeys(t.file for t in order):
            dots = "".join(char[outcomes[t]] for t in order if t.file == f)
            lines.append("%s %s%s[100%%]" % (f, dots, " " * max(1, 70 - len(f) - len(dots))))
    if inst.wrapped_progress:
        lines.append("PASSED [100%]")
    failed = [t for t in order if outcomes[t] in ("FAILED", "ERROR")]
    if failed:
        lines += ["", "=================================== FAILURES ==================================="]
        for t in failed:
            lines += ["_" * 20 + " %s " % (t.name + t.param) + "_" * 20, "", "    def %s():" % t.name,
                      ">       assert compute(1) == 2", "E       assert 1 == 2", "", "%s:%d: AssertionError"
                      % (t.file, t.line)]
    lines += ["==================================== PASSES ====================================",
              "=========================== short test summary info ============================"]
    for word in ("PASSED", "SKIPPED", "XFAIL", "XPASS", "ERROR", "FAILED"):
        for t in order:
            if outcomes[t] != word:
                continue
            w = _colour(word, ansi)
            if word == "SKIPPED":
                lines.append("%s [1] %s:%d: requires scipy >= 1.9" % (w, t.file, t.line))
            elif word == "XFAIL":
                if old or style in ("5", "6"):
                    lines += ["%s %s" % (w, t.printed), "  reason: known bug #12"]
                else:
                    lines.append("%s %s - %sknown bug #12" % (w, t.printed, "reason: " if style == "7" else ""))
            elif word == "FAILED":
                lines.append("%s %s" % (w, t.printed) + ("" if old else " - assert 1 == 2"))
            elif word == "ERROR":
                lines.append("%s %s" % (w, t.printed) + ("" if old else " - RuntimeError: fixture setup failed"))
            else:
                lines.append("%s %s" % (w, t.printed))
    counts = collections.Counter(outcomes[t] for t in order)
    tally = ", ".join("%d %s" % (counts[k], label) for k, label in (
        ("FAILED", "failed"), ("PASSED", "passed"), ("SKIPPED", "skipped"), ("XFAIL", "xfailed"),
        ("XPASS", "xpassed"), ("ERROR", "error")) if counts[k])
    lines.append("=" * 20 + " %s %s " % (tally or "no tests ran", secs) + "=" * 20)
    if inst.repo == "sphinx-doc/sphinx":
        code = 1 if failed else 0
        lines = ["py39: commands[0]> python -X dev -m pytest -rA --durations 25 %s" % inst.f2p[0].file] + lines + [
            "py39: exit %d (0.81 seconds) /testbed> python -X dev -m pytest -rA pid=812" % code if code else
            "  py39: OK (0.85=setup[0.04]+cmd[0.81] seconds)",
            "  evaluation failed :( (0.95 seconds)" if code else "  congratulations :) (0.95 seconds)"]
    return lines


def render_django(inst, outcomes, order, later_line=False):
    words = {"PASSED": "ok", "FAILED": "FAIL", "ERROR": "ERROR", "SKIPPED": "skipped 'Requires PostgreSQL'",
             "XFAIL": "expected failure", "XPASS": "unexpected success"}
    if inst.version.startswith(("4.", "5.")):  # unittest shows the reason's repr: an apostrophe makes it "..."
        words["SKIPPED"] = "skipped \"Database doesn't support feature(s): supports_json_field\""
    lines = ["Testing against Django installed in '/testbed/django'",
             "Importing application %s" % inst.f2p[0].file.split("/")[1],
             "Found %d test(s)." % len(order), "Skipping setup of unused database(s): other.",
             "Operations to perform:", "  Synchronize unmigrated apps: auth, contenttypes, messages, sessions",
             "  Apply all migrations: admin, sites", "Running migrations:", "  Applying admin.0001_initial... OK",
             "  Applying sites.0001_initial... OK", "System check identified no issues (0 silenced)."]
    for k, t in enumerate(order):
        desc = t.printed if not t.doc else "%s\n%s" % (t.printed, t.doc)
        if later_line and k == 0 and outcomes[t] == "PASSED":
            lines += ["%s ... Internal Server Error: /admin/view/" % desc, "Traceback (most recent call last):",
                      "  File \"/testbed/django/core/handlers/exception.py\", line 47, in inner", "ok"]
        elif later_line and k == 1 and outcomes[t] == "PASSED":
            lines += ["%s ... System check identified no issues (0 silenced)." % desc, "ok"]
        else:
            lines.append("%s ... %s" % (desc, words[outcomes[t]]))
    for word, head in (("ERROR", "ERROR"), ("FAILED", "FAIL")):
        for t in order:
            if outcomes[t] == word:
                lines += ["", "=" * 70, "%s: %s" % (head, t.printed)] + ([t.doc] if t.doc else []) + [
                    "-" * 70, "Traceback (most recent call last):",
                    "  File \"/testbed/%s\", line %d, in %s" % (t.file, t.line, t.name),
                    "    self.assertEqual(response.status_code, 200)", "AssertionError: 500 != 200"]
    counts = collections.Counter(outcomes[t] for t in order)
    notes = ", ".join("%s=%d" % (k, counts[w]) for w, k in (
        ("FAILED", "failures"), ("ERROR", "errors"), ("SKIPPED", "skipped"), ("XFAIL", "expected failures"),
        ("XPASS", "unexpected successes")) if counts[w])
    bad = counts["FAILED"] or counts["ERROR"] or counts["XPASS"]
    lines += ["", "-" * 70, "Ran %d tests in 0.234s" % len(order), "",
              ("FAILED (%s)" % notes) if bad else ("OK (%s)" % notes if notes else "OK"),
              "Destroying test database for alias 'default'..."]
    return lines


def render_sympy(inst, outcomes, order):
    words = {"PASSED": "ok", "FAILED": "F", "ERROR": "E", "SKIPPED": "s", "XFAIL": "f", "XPASS": "X"}
    lines = ["============================= test process starts ==============================",
             "executable:         /opt/miniconda3/envs/testbed/bin/python  (3.9.20-final-0) [CPython]",
             "architecture:       64-bit", "cache:              no", "ground types:       python ",
             "numpy:              None", "random seed:        83117291",
             "hash randomization: on (PYTHONHASHSEED=2416587921)", ""]
    files = list(dict.fromkeys(t.file for t in order))
    for f in files:
        mine = [t for t in order if t.file == f]
        lines.append("%s[%d] " % (f, len(mine)))
        bad = any(outcomes[t] in ("FAILED", "ERROR") for t in mine)
        for k, t in enumerate(mine):
            line = "%s %s" % (t.printed, words[outcomes[t]])
            if k == len(mine) - 1:
                line += " " * max(1, 76 - len(line)) + ("[FAIL]" if bad else "[OK]")
            lines.append(line)
        lines.append("")
    for t in order:
        if outcomes[t] in ("FAILED", "ERROR"):
            title = " %s:%s " % (t.file, t.name)
            lines += ["_" * 80, "_" * ((80 - len(title)) // 2) + title + "_" * ((81 - len(title)) // 2),
                      "Traceback (most recent call last):", "  File \"/testbed/%s\", line %d, in %s"
                      % (t.file, t.line, t.name), "    assert expand(x*(y + 1)) == x*y + x",
                      "AssertionError" if outcomes[t] == "FAILED" else "TypeError: unsupported operand", ""]
    counts = collections.Counter(outcomes[t] for t in order)
    tally = ", ".join("%d %s" % (counts[k], label) for k, label in (
        ("PASSED", "passed"), ("FAILED", "failed"), ("SKIPPED", "skipped"), ("XFAIL", "expected to fail"),
        ("ERROR", "exceptions")) if counts[k])
    lines.append("=" * 10 + " tests finished: %s, in 0.52 seconds " % (tally or "0 passed") + "=" * 10)
    if counts["FAILED"] or counts["ERROR"]:
        lines.append("DO *NOT* COMMIT!")
    return lines


def render(inst, outcomes, **kw):
    order = [t for t in inst.tests if t in outcomes]
    if inst.kind == "django":
        return render_django(inst, outcomes, order, **kw)
    if inst.kind == "sympy":
        return render_sympy(inst, outcomes, order)
    return render_pytest(inst, outcomes, order)


def test_command(inst):
    """What the xtrace line of the test command shows (the directives as 4.1.0's get_test_directives makes them)."""
    paths = re.findall(r"diff --git a/.* b/(.*)", inst.test_patch)
    paths = [p for p in paths if not p.endswith(NON_TEST_EXTS)]
    if inst.repo == "django/django":
        paths = [(p[:-3] if p.endswith(".py") else p)[len("tests/") if p.startswith("tests/") else 0:].replace("/", ".")
                 for p in paths]
    return " ".join([inst.spec["test_cmd"]] + paths)


def wrap(inst, body, exit_code, *, markers=True, end_marker=True, diff_extra="", after_end=(), bad_marker=None):
    """An eval script's output around the test output: xtrace lines (`+ cmd`), the model's diff shown by
    `git diff`, the install step, the test patch applied, the markers and the exit code line."""
    existing = [p for p in re.findall(r"^--- a/(.*)$", inst.test_patch, re.M)]
    reset = "+ git checkout %s %s" % (inst.base, " ".join(existing))
    lines = ["+ source /opt/miniconda3/bin/activate", "++ _CONDA_ROOT=/opt/miniconda3",
             "++ . /opt/miniconda3/etc/profile.d/conda.sh", "+++ export CONDA_EXE=/opt/miniconda3/bin/conda",
             "+ conda activate testbed", "+ local cmd=activate", "+ cd /testbed"]
    for cmd in inst.spec.get("eval_commands") or ():
        lines.append("+ " + cmd)
    lines += ["+ git config --global --add safe.directory /testbed", "+ cd /testbed", "+ git status",
              "On branch main", "Changes not staged for commit:", "\tmodified:   %s" % inst.source, "",
              "+ git show", "commit %s" % inst.base, "Author: A Developer <dev@example.org>",
              "Date:   Mon Mar 4 10:12:31 2024 +0100", "", "    Merge pull request #1234", "",
              "+ git -c core.fileMode=false diff %s" % inst.base] + (inst.patch + diff_extra).rstrip("\n").split("\n")
    lines += ["+ source /opt/miniconda3/bin/activate", "+ conda activate testbed"]
    if inst.spec.get("install"):
        lines += ["+ " + inst.spec["install"], "Obtaining file:///testbed",
                  "Successfully installed %s-%s.dev0" % (inst.repo.split("/")[1], inst.version)]
    lines += [reset, "Updated %d paths from %s" % (len(existing), inst.base[:7]), "+ git apply -v -"]
    lines += ["Checking patch %s..." % p for p in re.findall(r"^\+\+\+ b/(.*)$", inst.test_patch, re.M)]
    lines += ["Applied patch %s cleanly." % p for p in re.findall(r"^\+\+\+ b/(.*)$", inst.test_patch, re.M)]
    if markers:
        lines.append("+ : '%s'" % START)
    lines.append("+ " + test_command(inst))
    lines += body
    if exit_code is not None:
        lines.append("+ rc=%d" % exit_code)
    if markers and end_marker:
        lines.append("+ : '%s'" % END)
    lines += list(after_end)
    if exit_code is not None and end_marker:
        lines += ["+ echo '>>>>> Test Exit Code: %d'" % exit_code, ">>>>> Test Exit Code: %d" % exit_code]
    if end_marker:
        lines += [reset, "Updated %d paths from %s" % (len(existing), inst.base[:7])]
    if bad_marker:
        lines.append(bad_marker)
    return "\n".join(lines) + "\n"


def make_logs(inst):
    """(case, log) pairs for one instance."""
    f2p, p2p, extra = inst.f2p, inst.p2p, inst.extra
    gold = {t: "PASSED" for t in inst.tests}
    gold[extra[0]] = "SKIPPED"

    def with_(**over):
        out = dict(gold)
        for key, status in over.items():
            out[{"f0": f2p[0], "p0": p2p[0], "pl": p2p[-1], "e1": extra[1]}[key]] = status
        return out

    fail_code = 1
    cases = [
        ("pass", wrap(inst, render(inst, gold), 0)),
        ("pass-no-exit-code", wrap(inst, render(inst, gold), None)),
        ("f2p-fail", wrap(inst, render(inst, with_(f0="FAILED")), fail_code)),
        ("p2p-error", wrap(inst, render(inst, with_(p0="ERROR")), fail_code)),
        ("f2p-skipped", wrap(inst, render(inst, with_(f0="SKIPPED")), 0)),
        ("p2p-skipped", wrap(inst, render(inst, with_(pl="SKIPPED")), 0)),
        ("f2p-xfail", wrap(inst, render(inst, with_(f0="XFAIL")), 0)),
        ("f2p-xpass", wrap(inst, render(inst, with_(f0="XPASS")), 0 if inst.kind != "django" else 1)),
        ("exit1-all-pass", wrap(inst, render(inst, gold), 1)),
        ("exit1-unlisted-fail", wrap(inst, render(inst, with_(e1="FAILED")), 1)),
        ("exit-code-faked-in-diff", wrap(inst, render(inst, gold), 1, diff_extra=(
            "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n+++ b/conftest.py\n"
            "@@ -0,0 +1,2 @@\n+import atexit\n+atexit.register(print, '>>>>> Test Exit Code: 0')\n"))),
        ("results-after-end-marker", wrap(inst, [], 0, after_end=render(inst, gold))),
        ("empty-results", wrap(inst, {"django": ["Found 0 test(s).", "", "-" * 70, "Ran 0 tests in 0.000s", "",
                                                 "OK"],
                                      "sympy": ["=" * 10 + " tests finished: 0 passed, in 0.01 seconds " + "=" * 10]
                                      }.get(inst.kind, ["collected 0 items", "", "=" * 20 + " no tests ran in 0.01s "
                                                        + "=" * 20]), 5 if inst.kind == "pytest" else 0)),
        ("no-end-marker", wrap(inst, render(inst, gold)[:8], None, end_marker=False)),
        ("no-markers", wrap(inst, render(inst, gold), 0, markers=False)),
        ("patch-apply-failed", ">>>>> Patch Apply Failed:\nerror: patch failed: %s:12\nerror: %s: patch does not "
                               "apply\n" % (inst.source, inst.source)),
        ("timed-out-marker", wrap(inst, render(inst, gold), 0, bad_marker=">>>>> Tests Timed Out")),
    ]
    if inst.kind == "pytest":
        body = ["collected 0 items / 1 error", "", "==================================== ERRORS "
                "====================================", "_" * 10 + " ERROR collecting %s " % f2p[0].file + "_" * 10,
                "ImportError while importing test module '/testbed/%s'." % f2p[0].file,
                "=========================== short test summary info ============================",
                "ERROR %s" % f2p[0].file + ("" if inst.style in ("3", "4", "classic") else
                                            " - ImportError: cannot import name 'helper'"),
                "!!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!",
                "=" * 20 + " 1 error in 0.40s " + "=" * 20]
        cases.append(("collection-error", wrap(inst, body, 2)))
        spaced = [t for t in f2p if " " in t.printed]
        if spaced:  # a sibling parametrization cut to the same prefix fails (#290)
            sib = Test(inst.repo, inst.kind, spaced[0].file, spaced[0].cls, spaced[0].name,
                       spaced[0].param[:-1] + " other]")
            outcomes = dict(gold)
            outcomes[sib] = "FAILED"
            cases.append(("truncated-id-sibling-fails", wrap(inst, render_pytest(inst, outcomes, inst.tests + [sib]),
                                                              1)))
    if inst.kind == "django":
        cases.append(("status-on-later-line", wrap(inst, render(inst, gold, later_line=True), 0)))
    if inst.kind == "sympy":
        cases.append(("f2p-error", wrap(inst, render(inst, with_(f0="ERROR")), 1)))
    return cases


# ----------------------------------------------------------------------------- evalharness (the program under test)

def eh_verdict(inst, log):
    """evalharness's verdict on one log, in the shape compared with the official one."""
    v = eh.swe_verdict(inst, log)
    return {"found": bool(v["found"]), "resolved": bool(v["resolved"]), "tests_status": v.get("tests_status"),
            "statuses": v.get("statuses"), "warning": v.get("warning") or v.get("rejected")}


def _choice_of(inst, case, log, l5, l4, lo):
    """Which documented choice (README, SWE tasks: "Choices where the official versions disagree") explains a
    difference from 5.0.2, else "undocumented". The choices all follow 4.1.0, so a difference where evalharness
    disagrees with 4.1.0 too is never one of them."""
    if lo != l4:
        return "undocumented"
    code = re.search(r">>>>> Test Exit Code:\s*(-?\d+)", log)
    if l5 == "none" and code and int(code.group(1)) != 0:
        return "exit-code rule (flagged, not rejected)"
    if "XFAIL" in log and eh._SWE_PARSER_OF_REPO.get(inst.repo) == "pytest_v2":
        return "pytest_v2 XFAIL keyed by its id"
    return "undocumented"


def label(v):
    if "error" in v:
        return "error"
    return "none" if not v["found"] else ("res" if v["resolved"] else "unres")


# ----------------------------------------------------------------------------- eval-script comparison

ACTIVATE_IF = re.compile(r"^if \[ -f /opt/miniconda3/bin/activate \]; then (.+); fi$")


def commands(script):
    """A script's commands: one per line, a heredoc with its body as one."""
    out, lines, i = [], script.split("\n"), 0
    while i < len(lines):
        line = lines[i]
        m = re.search(r"<<-?\s*'?\"?(\w+)'?\"?\s*$", line)
        if m:
            j = i + 1
            while j < len(lines) and lines[j] != m.group(1):
                j += 1
            out.append("\n".join(lines[i:j + 1]))
            i = j + 1
            continue
        if line:
            out.append(line)
        i += 1
    return out


def normalise_ours(cmds):
    """Undo exactly evalharness's two deliberate additions."""
    out = []
    for c in cmds:
        m = ACTIVATE_IF.match(c)
        out.extend(m.group(1).split("; ") if m else [c])
    end = ": '%s'" % END
    keep = []
    for k, c in enumerate(out):
        if c == "rc=$?" and k + 1 < len(out) and out[k + 1] == end:
            continue
        if c == "echo '>>>>> Test Exit Code: '$rc" and keep and keep[-1] == end:
            continue
        keep.append(c)
    return keep


def _show(cmd, base):
    cmd = cmd.replace(base, "<base>")
    if "\n" in cmd:
        body = cmd.split("\n")
        return "%s (%d lines)" % (body[0], len(body) - 2)
    return cmd


def _kind(cmd, base, test_cmd_of):
    if "\n" in cmd and "<<" in cmd.split("\n")[0]:
        return "test-patch heredoc"
    if cmd.startswith("git checkout %s" % base):
        return "reset `git checkout <base> <files>`"
    if cmd == test_cmd_of:
        return "test command"
    return "`%s`" % cmd.replace(base, "<base>")


def script_diffs(official, ours, base):
    """[(signature, detail)] of every difference between the normalised command lists."""
    a, b = commands(official), normalise_ours(commands(ours))
    end = ": '%s'" % END
    test_a = a[a.index(end) - 1] if end in a else None
    out, missing, extra = [], {}, {}
    sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            continue
        after = _show(a[i1 - 1], base) if i1 else "(start)"
        if op == "replace" and i2 - i1 == j2 - j1:
            for x, y in zip(a[i1:i2], b[j1:j2]):
                kind = _kind(x, base, test_a)
                if kind == "test-patch heredoc":
                    xa, ya = x.split("\n"), y.split("\n")
                    if xa[0] != ya[0]:
                        detail = "official `%s`, ours `%s`" % (xa[0], ya[0])
                    elif [ln for ln in xa if ln] == [ln for ln in ya if ln]:
                        detail = "blank lines differ: official %d, ours %d (the official body ends with a blank " \
                                 "line: `{test_patch}\\n` before the delimiter)" % (xa.count(""), ya.count(""))
                    else:
                        detail = "body differs: %s" % next(
                            ("line %d official %r, ours %r" % (k, p, q) for k, (p, q) in enumerate(zip(xa, ya))
                             if p != q), "lengths %d/%d" % (len(xa), len(ya)))
                    out.append(("changed: test-patch heredoc: " + re.sub(r"\d+", "N", detail.split(":")[0]), detail))
                else:
                    out.append(("changed: %s" % kind, _delta(_show(x, base), _show(y, base))))
            continue
        for x in a[i1:i2]:
            missing[x] = after
        for y in b[j1:j2]:
            extra[y] = _show(b[j1 - 1], base) if j1 else "(start)"
    for x, after in missing.items():  # a command in both lists at other places was moved
        if x in extra:
            out.append(("moved: %s" % _kind(x, base, test_a), "`%s`: official after `%s`, ours after `%s`"
                        % (_show(x, base), after, extra.pop(x))))
        else:
            out.append(("missing in ours: %s" % _kind(x, base, test_a), "official `%s` (after `%s`)"
                        % (_show(x, base), after)))
    for y, after in extra.items():
        out.append(("extra in ours: %s" % _kind(y, base, test_a), "ours `%s` (after `%s`)" % (_show(y, base), after)))
    return out


def _delta(x, y):
    """``official `x` -> ours `y```, the words both start with elided."""
    xw, yw = x.split(" "), y.split(" ")
    k = 0
    while k < min(len(xw), len(yw)) - 1 and xw[k] == yw[k]:
        k += 1
    pre = "... " if k > 1 else ""
    k = k if k > 1 else 0
    return "official `%s%s` -> ours `%s%s`" % (pre, " ".join(xw[k:]), pre, " ".join(yw[k:]))


# ----------------------------------------------------------------------------- reporting

def _cut(text, width=WIDTH):
    text = text.replace("\n", "\\n").replace("\x1b", "\\e")
    return text if len(text) <= width else text[:width - 3] + "..."


def _short(test):
    """A test id's last part (``a/b.py::C::t[x]`` -> ``t[x]``)."""
    return test.split("::")[-1]


def _status(v, test):
    sm = v.get("statuses") or {}
    if test in sm:
        return sm[test]
    hits = sorted({sm[k] for k in sm if k.startswith(test)})
    return ("~" + "/".join(hits)) if hits else "-"


def _bucket(v, key, test):
    ts = v.get("tests_status")
    if not ts:
        return "-"
    if test in ts[key]["success"]:
        return "ok"
    if test in ts[key]["failure"]:
        return "fail"
    return "neither"


def _why_none(log, other):
    """Why a side found no results in ``log`` (``other``: the verdict of a side that found some)."""
    for bad in BAD_MARKERS:
        if bad in log:
            return "log has %r" % bad
    if START not in log or END not in log:
        return "a marker is missing"
    m = EXIT_CODE_RE.search(log)
    sm = other.get("statuses") or {}
    if m and int(m.group(1)) and sm and not any(s in ("FAILED", "ERROR") for s in sm.values()):
        return "exit code %s, no FAILED/ERROR parsed" % m.group(1)
    return "nothing parsed"


def explain(inst, log, a, a_name, b, b_name):
    """Why two verdicts differ (or their per-test reports do), in a few words."""
    if "error" in a or "error" in b:
        return "; ".join("%s raised %s" % (n, v["error"]) for n, v in ((a_name, a), (b_name, b)) if "error" in v)
    warn = next(("; ours only warns" + (" (exit code)" if "exit" in v["warning"] else ": " + v["warning"])
                 for v in (a, b) if v.get("warning")), "")
    if a["found"] != b["found"]:
        none, other = (a_name, b) if not a["found"] else (b_name, a)
        return "%s none (%s)%s" % (none, _why_none(log, other), warn)
    for key, tests in (("F2P", json.loads(inst.row["FAIL_TO_PASS"])), ("P2P", json.loads(inst.row["PASS_TO_PASS"]))):
        long_key = {"F2P": "FAIL_TO_PASS", "P2P": "PASS_TO_PASS"}[key]
        for t in tests:
            ba, bb = _bucket(a, long_key, t), _bucket(b, long_key, t)
            if ba != bb:
                return "%s %s: %s %s(%s), %s %s(%s)%s" % (key, _short(t), a_name, ba, _status(a, t), b_name, bb,
                                                          _status(b, t), warn)
    return "same per-test report" + warn


def _group_lines(title, items, max_lines, out):
    out.append("")
    out.append(_cut("== %s (%d)" % (title, len(items))))
    by = collections.OrderedDict()
    for key, line in items:
        by.setdefault(key, []).append(line)
    for key, lines in by.items():
        out.append(_cut("-- %s: %d" % (key, len(lines))))
        shown = lines if not max_lines else lines[:max_lines]
        out.extend("   " + _cut(ln, WIDTH - 3) for ln in shown)
        if len(shown) < len(lines):
            out.append("   ... %d more" % (len(lines) - len(shown)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep-venv", metavar="DIR", help="make the venvs in DIR and keep them (reused when present)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the synthetic instances (default 1)")
    ap.add_argument("--max-lines", type=int, default=0, help="lines shown per group (default 0: all)")
    ap.add_argument("--repo", default="", help="only repositories whose name contains this")
    ap.add_argument("--no-deps", action="store_true", help="install swebench --no-deps (the fallback) on purpose")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the venvs (swebench 5 needs >= 3.10)")
    args = ap.parse_args()
    say = lambda msg: print(_cut(msg), file=sys.stderr, flush=True)  # noqa: E731
    t_start = time.monotonic()
    work = tempfile.mkdtemp(prefix="swebench-parity-")
    base = os.path.abspath(args.keep_venv) if args.keep_venv else work
    os.makedirs(base, exist_ok=True)
    try:
        envs = make_venvs(base, args.python, args.no_deps, say)
        setup_s = max(e["seconds"] for e in envs.values())
        table_out = run_child(envs[V4], {"op": "table"}, work)
        table = {repo: specs for repo, specs in table_out["table"].items()
                 if any(s.get("test_cmd") is not None for s in specs.values())}
        skipped_repos = sorted(set(table_out["table"]) - set(table))
        rng = random.Random(args.seed)
        insts = make_instances(table, rng, args.repo)
        if not insts:
            raise SystemExit("bench/swebench_parity.py: no instance (--repo %r)" % args.repo)
        no_parser = {i.repo for i in insts if i.repo not in table_out["parsers"]}
        logs = {i.id: make_logs(i) for i in insts if i.repo not in no_parser}
        request = {"op": "eval", "instances": [i.row for i in insts], "logs": logs}
        t_child = time.monotonic()
        official = {v: run_child(envs[v], request, work) for v in VERSIONS}
        child_s = time.monotonic() - t_child
    finally:
        shutil.rmtree(work, ignore_errors=True)  # with --keep-venv the venvs are elsewhere, in DIR
    out = []
    # --- verdicts
    verdict_diffs, official_diffs, report_diffs, errors = [], [], [], []
    both = 0  # verdict differences from 5.0.2 on logs where 4.1.0 and 5.0.2 disagree
    choice = collections.Counter()  # difference from 5.0.2 -> the documented choice that explains it
    per_repo = collections.defaultdict(collections.Counter)
    # case -> [logs, Counter 5.0.2 labels, Counter 4.1.0, Counter ours, differences ours/5.0.2, 4.1.0/5.0.2]
    per_case = collections.defaultdict(lambda: [0, collections.Counter(), collections.Counter(),
                                                collections.Counter(), 0, 0])
    n_logs = 0
    for inst in insts:
        c = per_repo[inst.repo]
        c["instances"] += 1
        try:
            ehi = eh._validate_swe_row(inst.row, "bench", None)
        except eh.DatasetError as exc:
            errors.append(("evalharness refuses the row", "%s: %s" % (inst.id, exc)))
            continue
        inst.eh = ehi
        for case, log in logs.get(inst.id, []):
            n_logs += 1
            c["logs"] += 1
            key = "%s\t%s" % (inst.id, case)
            v5, v4 = official[V5]["verdicts"][key], official[V4]["verdicts"][key]
            ours = eh_verdict(ehi, log)
            l5, l4, lo = label(v5), label(v4), label(ours)
            head = "%s %s %s/%s/%s " % (inst.id, case, l5, l4, lo)
            per_case[case][0] += 1
            for k, lab in enumerate((l5, l4, lo)):
                per_case[case][1 + k][lab] += 1
            for name, v in ((V5, v5), (V4, v4)):
                if "error" in v:
                    errors.append(("official %s raised" % name, "%s %s: %s" % (inst.id, case, v["error"])))
            if l5 != lo:
                choice[_choice_of(inst, case, log, l5, l4, lo)] += 1
                c["verdict"] += 1
                c["resolved"] += (l5 == "res") != (lo == "res")
                per_case[case][4] += 1
                both += l4 != l5
                verdict_diffs.append(("%s: 5.0.2 %s, ours %s" % (case, l5, lo),
                                      head + explain(inst, log, v5, "5.0.2", ours, "ours")))
            elif l5 in ("res", "unres") and v5.get("tests_status") and ours.get("tests_status"):
                if any(set(v5["tests_status"][k][s]) != set(ours["tests_status"][k][s])
                       for k in ("FAIL_TO_PASS", "PASS_TO_PASS") for s in ("success", "failure")):
                    c["report"] += 1
                    report_diffs.append((case, head + explain(inst, log, v5, "5.0.2", ours, "ours")))
            if l5 != l4:
                c["official"] += 1
                per_case[case][5] += 1
                official_diffs.append(("%s: 5.0.2 %s, 4.1.0 %s" % (case, l5, l4),
                                       head + explain(inst, log, v5, "5.0.2", v4, "4.1.0")))
    # --- eval scripts
    script_items, script_insts = [], 0
    for inst in insts:
        got = official[V4]["scripts"].get(inst.id, {})
        if not hasattr(inst, "eh"):
            continue
        if "error" in got:
            errors.append(("official 4.1.0 make_eval_script_list_py raised", "%s: %s" % (inst.id, got["error"])))
            continue
        diffs = script_diffs(got["script"], eh.swe_eval_script(inst.eh), inst.base)
        if diffs:
            script_insts += 1
            per_repo[inst.repo]["script"] += 1
        for sig, detail in diffs:
            script_items.append((sig, "%s (%s %s): %s" % (inst.id, inst.repo, inst.version, detail)))
    script_items.sort(key=lambda kv: kv[0])
    out = report(args, insts, per_repo, per_case, verdict_diffs, official_diffs, report_diffs, script_items,
                 script_insts, errors, official)
    notes = []
    if skipped_repos:
        notes.append("left out (no test_cmd in the table): %s" % ", ".join(skipped_repos))
    if no_parser:
        notes.append("eval script only (no official log parser): %s" % ", ".join(sorted(no_parser)))
    for v in VERSIONS:
        e = envs[v]
        stubs = sorted(set(m.split(".")[0] for m in official[v]["stubbed"]))
        notes.append("swebench %s: %s%s" % (v, "venv reused" if e["reused"] else "venv made",
                                            ", --no-deps, stubbed: %s" % " ".join(stubs) if e["no_deps"] else ""))
    notes.append("venv set-up %.0f s, official children %.1f s, total %.0f s (seed %d)"
                 % (setup_s, child_s, time.monotonic() - t_start, args.seed))
    out += [""] + ["note: " + n for n in notes]
    out.append("differences from 5.0.2 by cause: " + ", ".join("%s %d" % kv for kv in sorted(choice.items())))
    out.append("parity: %d instances over %d repos / %d (repo, version) pairs, %d logs: %d verdict differences from "
               "5.0.2 (%d where 4.1.0 and 5.0.2 disagree; %d outside the README's documented choices), "
               "%d eval-script differences" % (
                   len(insts), len(per_repo), len({(i.repo, i.version) for i in insts}), n_logs, len(verdict_diffs),
                   both, choice.get("undocumented", 0), script_insts))
    print("\n".join(out))
    return 0


def _chain_delta(ours, theirs):
    ops = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=theirs, b=ours, autojunk=False).get_opcodes():
        if op in ("delete", "replace"):
            ops += ["-`%s`" % c for c in theirs[i1:i2]]
        if op in ("insert", "replace"):
            ops += ["+`%s`" % c for c in ours[j1:j2]]
    return "same" if not ops else "ours " + ", ".join(ops)


def report(args, insts, per_repo, per_case, verdict_diffs, official_diffs, report_diffs, script_items, script_insts,
           errors, official):
    out = ["swebench parity: evalharness against swebench %s and %s" % (V5, V4),
           "a difference line reads: instance, log case, verdicts 5.0.2/4.1.0/evalharness, why; verdicts: res",
           "(RESOLVED_FULL), unres (not resolved), none (no parseable results); a status ~S: no key is the id itself,",
           "the keys starting with it have S (#290's prefix rule)"]
    _group_lines("verdict differences from 5.0.2", sorted(verdict_diffs, key=lambda kv: kv[0]), args.max_lines, out)
    _group_lines("4.1.0 and 5.0.2 disagree (the official versions; 'why' compares 5.0.2 with 4.1.0)",
                 sorted(official_diffs, key=lambda kv: kv[0]), args.max_lines, out)
    _group_lines("per-test report differences from 5.0.2 with the same verdict",
                 sorted(report_diffs, key=lambda kv: kv[0]), args.max_lines, out)
    _group_lines("eval-script differences from 4.1.0's make_eval_script_list_py, in %d instances" % script_insts,
                 script_items, args.max_lines, out)
    if errors:
        _group_lines("errors", errors, args.max_lines, out)
    # the patch-apply chain
    out += ["", "== patch-apply chain"]
    ours = getattr(eh, "SWE_APPLY_CMDS", None)
    out.append(_cut("evalharness SWE_APPLY_CMDS: %s" % (" | ".join(ours) if ours is not None else "not defined")))
    src = open(os.path.join(ROOT, "evalharness.py"), encoding="utf-8").read()
    for v in VERSIONS:
        ap = official[v]["apply"]
        theirs = list(ap["cmds"] or [])
        out.append(_cut("%s GIT_APPLY_CMDS (%s): %s" % (v, ap["where"], " | ".join(theirs))))
        out.append(_cut("  evalharness vs %s: %s" % (v, _chain_delta(list(ours), theirs) if ours is not None
                                                      else "no SWE_APPLY_CMDS")))
        if ap.get("reset_between"):
            mine = getattr(eh, "SWE_APPLY_RESET", None)
            out.append(_cut("  %s resets the tree between attempts (`%s`); evalharness SWE_APPLY_RESET: %s" % (
                v, ap["reset_between"], ("same" if mine == ap["reset_between"] else "`%s`" % mine) if mine
                else "not defined")))
        if ap.get("reverse_check"):
            out.append("  %s then accepts a patch that is already applied (`git apply --check --reverse`); "
                       "evalharness.py %s" % (v, "has it" if "--check --reverse" in src else "does NOT"))
    # verdicts per log case
    out += ["", "== verdicts per log case (res/unres/none; diff: evalharness vs 5.0.2, official: 4.1.0 vs 5.0.2)",
            "%-28s %5s %-13s %-13s %-13s %5s %8s" % ("case", "logs", "5.0.2", "4.1.0", "evalharness", "diff",
                                                     "official")]
    for case, (n, c5, c4, co, d, o) in per_case.items():
        fmt = lambda c: "%d/%d/%d" % (c["res"], c["unres"], c["none"]) + ("/%derr" % c["error"] if c["error"] else "")
        out.append("%-28s %5d %-13s %-13s %-13s %5d %8d" % (case, n, fmt(c5), fmt(c4), fmt(co), d, o))
    # counts per repository
    out += ["", "== counts per repository (verdict: differs from 5.0.2; resolved: of those, res on one side only; "
                "official: 4.1.0", "   vs 5.0.2; report: same verdict, other per-test report; script: instances whose "
                "eval script differs)"]
    row = "%-30s %5s %5s %5s %7s %8s %8s %6s %6s"
    out.append(row % ("repository", "pairs", "inst", "logs", "verdict", "resolved", "official", "report", "script"))
    tot = collections.Counter()
    for repo in [r for r in SWE_REPOS if r in per_repo] + sorted(r for r in per_repo if r not in SWE_REPOS):
        c = per_repo[repo]
        c["pairs"] = len({i.version for i in insts if i.repo == repo})
        tot.update(c)
        out.append(row % (repo, c["pairs"], c["instances"], c["logs"], c["verdict"], c["resolved"], c["official"],
                          c["report"], c["script"]))
    out.append(row % ("total", tot["pairs"], tot["instances"], tot["logs"], tot["verdict"], tot["resolved"],
                      tot["official"], tot["report"], tot["script"]))
    return out

if __name__ == "__main__":
    sys.exit(main())
