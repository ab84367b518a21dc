#!/usr/bin/env python3
"""evalharness's BFCL multi-turn back-ends and verdicts against bfcl-eval's own code (run by hand, never by CI).

The reference is bfcl-eval 2026.3.23 in a throwaway virtualenv (`--venv-dir DIR` keeps it and reuses it when it
already holds bfcl-eval): the wheel from the PyPI mirror (or `--wheel PATH`) installed --no-deps, plus mpmath==1.3.0
(bfcl-eval pins it: MathAPI.logarithm's text depends on it) and only what the imported modules need (tenacity,
filelock, python-dotenv, tqdm, overrides, numpy 1.26.4, pandas, tree_sitter 0.21.3 with its Java and JavaScript
grammars). bfcl_eval.constants.model_config, which imports every provider's SDK, is replaced in the child process by
an empty stand-in (the multi-turn runner never reads it). The question, answer and function-doc files are read
from the wheel (a temporary copy).

(a) Back-ends: for each of the eight classes, sequences of calls run on bfcl-eval's class and on evalharness's
    (eh.GorillaFileSystem, ...): the ground truth's calls of every row of the four categories on the row's
    initial_config (long_context off and on), seeded random sequences of valid and invalid calls (wrong types,
    unknown ids, edge values, missing, extra and positional arguments, two instances sharing one process state) from
    every distinct initial_config and our own, a few calls of every method from the defaults, and hand-written
    edge sequences. After every call (and after loading) it compares the result as BFCL's executor turns it into
    text (str as is; exactly-dict -> json.dumps, else str; an exception -> "Error during execution: " + str(e)) and
    the public state (every non-underscore attribute of every instance), with == on a plain picture of it (the
    file tree as name/contents, NaN as a marker) and as a type-exact canonical rendering. Also each public
    method's name and parameters (names, kinds, whether defaulted).
(b) Verdicts: for every row of the four categories (800), model trajectories made from its ground truth: the
    ground truth itself (all of a turn's calls in one step, and one call per step), and mutations: a wrong argument,
    a missing call, an extra call, a call moved to another turn, a held-back function called a turn early (miss_func:
    moved, and done in both turns), no call in a turn, a force-terminated row (one turn fewer), steps that are not
    calls (text, bad JSON, an unparsable reply) around the ground truth, and an executor edge call (unknown name,
    a forbidden name, Class.method, positional/empty-dict/nested arguments in prompt mode, a builtin, a module
    global). Each in both tool modes (native tool calls, prompt mode). evalharness: eh.mt_verdict; bfcl-eval: its own
    runner function eval_runner._evaluate_single_multi_turn_entry (decoding, dropped steps, force-termination, then
    multi_turn_checker) with a handler whose decode_execute is the OpenAI handler's. Compared: the verdict, the error
    type, and every execution the checker asks for (role, decoded call strings, result texts; both executors are
    wrapped to record them), since extra results of the model's can hide a wrong one from the verdict.
(c) Blob (`--blob` runs only this): eh._MT_LONG_CONTEXT decoded (Ellipsis appended to WATCH_LIST_EXTENSION, which
    JSON cannot hold) against func_source_code/long_context.py of the wheel (ast.literal_eval of each top-level
    assignment), value by value with == and type-exactly.

How the official side is kept honest (spec section 4): it runs in child processes of the venv's Python (3.11 like
this one) with PYTHONHASHSEED=0 and TZ=UTC (this script re-runs itself under the same, so both sides hash and tell
time alike); between two sequences or cases it deletes every cached *_instance of multi_turn_utils, reloads
long_context and then every back-end module (fresh mutable defaults and long-context constants), and resets
mpmath.mp.dps and decimal's context; each case has its own model name (bench<N>, also evalharness's label). The date
verify_traveler_information counts ages from is fixed on both sides (eh._MT_TODAY; travel_booking.datetime.today).
`--fresh N` sequences and N cases are run again each in a process of its own and must give the same.
evalharness runs here, each sequence in a new _MTWorld and each verdict in the world mt_verdict makes.

Known divergences, printed and counted apart (never as equal or different): a builtin or module global called by
the model (bfcl-eval's eval runs it; evalharness answers that it is not run); complex-number input to
MathAPI.logarithm (documented in evalharness as not supported); edit_ticket's "Invalid fields" list in another order
(compared as a set of names).

Usage: python3 bench/bfcl_multi_parity.py [--venv-dir DIR] [--wheel PATH] [--fuzz N] [--fresh N] [--show N]
                                          [--seed N] [--backends | --verdicts | --blob]
Prints, per class, the calls compared, equal, different and known, and each method's calls with a valid and an
invalid outcome; per category, tool mode and trajectory kind, the cases and how many have the same verdict and
error type; the blob check's PASS/FAIL; every difference (the first --show of each part in full); the wall time.
Last line: "N passed, M failed" (items compared); exit status 1 when anything differs. A default run takes about
2 minutes on 2 cores with a kept --venv-dir (building the venv adds about a minute).
"""
import argparse
import ast
import base64
import collections
import copy
import datetime
import decimal
import glob
import hashlib
import importlib
import inspect
import json
import os
import pickle
import random
import re
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
eh = None  # evalharness, imported by main() (the child process runs bfcl-eval only)

VERSION = "2026.3.23"
DEPS = ["mpmath==1.3.0", "tenacity", "filelock==3.20.0", "python-dotenv", "tqdm", "overrides", "numpy==1.26.4",
        "pandas", "tree_sitter==0.21.3", "tree-sitter-java==0.21.0", "tree-sitter-javascript==0.21.4"]
PKG = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
MODULES = {"GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api", "MessageAPI": "message_api",
           "TwitterAPI": "posting_api", "TicketAPI": "ticket_api", "TradingBot": "trading_bot",
           "TravelAPI": "travel_booking", "VehicleControlAPI": "vehicle_control"}
CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
TODAY = (2025, 6, 15, 12, 0, 0)  # the date both sides compute ages from
LONG = 3000  # results longer than this travel as a digest


# =====================================================================================================================
# Shared by both processes: how a call is run and recorded
# =====================================================================================================================
class Ref:
    """An argument read from the instance when the call is made (each side reads its own instance)."""

    def __init__(self, kind, *a):
        self.kind, self.a = kind, a

    def __repr__(self):
        return "Ref%r" % ((self.kind,) + self.a,)

    def get(self, inst):
        try:
            if self.kind == "attr":
                return getattr(inst, self.a[0])
            obj = getattr(inst, self.a[0])
            seq = list(obj.values()) if self.kind == "val" else list(obj)
            if self.kind == "keys":
                return seq
            v = seq[self.a[1] % len(seq)] if seq else "none-there"
            return v[self.a[2]] if self.kind == "item" and len(self.a) > 2 and seq else v
        except Exception:
            return "unresolved"


def shown(value):
    """What BFCL's execute_multi_turn_func_call makes of a return value."""
    if type(value) == str:  # noqa: E721 (the executor tests exact types)
        return value
    if type(value) == dict:  # noqa: E721
        try:
            return json.dumps(value)
        except Exception:
            return str(value)
    return str(value)


def run_call(inst, method, args, kwargs):
    args = copy.deepcopy([a.get(inst) if isinstance(a, Ref) else a for a in args])
    kwargs = copy.deepcopy({k: v.get(inst) if isinstance(v, Ref) else v for k, v in kwargs.items()})
    try:
        return "ok", shown(getattr(inst, method)(*args, **kwargs))
    except Exception as exc:  # (the executor's own rule: every failure becomes the result text)
        return "exc", "Error during execution: " + str(exc)


def squeeze(text):
    if len(text) <= LONG:
        return text
    return ("#", hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest(), len(text), text[:300])


def plain(v, path=None):
    """A picture of a state value for ==: the file tree as (name, contents), NaN as a marker, other objects by
    repr; containers as they are (so 1 == 1.0 == True, dicts ignore order, as BFCL's state check). A container
    met again inside itself (a directory copied into itself) is a marker."""
    t = type(v)
    if t is float:
        return ("<nan>",) if v != v else v
    if v is None or t in (str, int, bool):
        return v
    path = set() if path is None else path
    if id(v) in path:
        return ("<cycle>", getattr(v, "name", t.__name__))
    path.add(id(v))
    try:
        if t is dict:
            return {plain(k, path): plain(x, path) for k, x in v.items()}  # (a NaN key too)
        if t is list:
            return [plain(x, path) for x in v]
        if t is tuple:
            return tuple(plain(x, path) for x in v)
        if t in (set, frozenset):
            return frozenset(plain(x, path) for x in v)
        if t.__name__ == "Directory":
            return ("<dir>", v.name, plain(v.contents, path))
        if t.__name__ == "File":
            return ("<file>", v.name, v.content)
        return ("<obj>", t.__name__, repr(v))
    finally:
        path.discard(id(v))


def canon(v, w, path=None):
    """A type-exact rendering (written through w): ints, floats, bools, tuples and lists told apart, dicts in
    their order, sets sorted, a container inside itself as a marker."""
    t = type(v)
    if t in (str, bool) or v is None:
        w(repr(v))
        return
    if t is int:
        w("i%d" % v)
        return
    if t is float:
        w("f" + repr(v))
        return
    path = set() if path is None else path
    if id(v) in path:
        w("<cycle>")
        return
    path.add(id(v))
    if t in (dict, list, tuple):
        w({dict: "{", list: "[", tuple: "("}[t])
        for k, x in (v.items() if t is dict else enumerate(v)):
            if t is dict:
                canon(k, w, path)
                w(":")
            canon(x, w, path)
            w(",")
        w({dict: "}", list: "]", tuple: ")"}[t])
    elif t in (set, frozenset):
        parts = []
        for x in v:
            one = []
            canon(x, one.append, path)
            parts.append("".join(one))
        w("set(" + ",".join(sorted(parts)) + ")")
    elif t.__name__ in ("Directory", "File"):
        w(t.__name__ + "(")
        canon(v.name, w, path)
        canon(v.contents if t.__name__ == "Directory" else v.content, w, path)
        w(")")
    else:
        w("<%s %r>" % (t.__name__, v))
    path.discard(id(v))


def state_of(insts):
    """(plain picture, digest of the canonical rendering) of the public attributes of the instances."""
    pics, parts = [], []
    for inst in insts:
        public = {k: v for k, v in vars(inst).items() if not k.startswith("_")}
        pics.append({k: plain(v) for k, v in public.items()})
        canon({k: public[k] for k in sorted(public)}, parts.append)
        parts.append(";")
    return pics, hashlib.sha1("".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def run_sequence(seq, make):
    """Steps of one sequence: (kind, text, state digest, state picture or None when unchanged). make(i) gives the
    i-th instance, loaded; a load that fails ends the sequence."""
    steps, insts, last = [], [], None
    try:
        for i in range(seq["insts"]):
            insts.append(make(i))
        kind, text = "ok", "(loaded)"
    except Exception as exc:
        kind, text = "exc", "load: %s: %s" % (type(exc).__name__, exc)
    for call in [None] + (list(seq["calls"]) if kind == "ok" else []):
        if call is not None:
            idx, method, args, kwargs = call
            kind, text = run_call(insts[idx], method, args, kwargs)
        pic, digest = state_of(insts)
        steps.append((kind, squeeze(text), digest, pic if digest != last else None))
        last = digest
    return steps


def signatures(classes):
    out = {}
    for name, cls in classes.items():
        out[name] = sorted((n, [(p.name, p.kind.name, p.default is not inspect.Parameter.empty)
                                for p in inspect.signature(getattr(cls, n)).parameters.values() if p.name != "self"])
                           for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n)))
    return out


# =====================================================================================================================
# The child process: bfcl-eval's side
# =====================================================================================================================
def child_main(kind, src, dst):
    import types
    stub = types.ModuleType("bfcl_eval.constants.model_config")
    stub.MODEL_CONFIG_MAPPING = {}
    sys.modules["bfcl_eval.constants.model_config"] = stub
    import mpmath
    lc = importlib.import_module(PKG + ".long_context")
    mods = {c: importlib.import_module("%s.%s" % (PKG, m)) for c, m in MODULES.items()}
    utils = importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")

    class Today(datetime.datetime):
        @classmethod
        def today(cls, *a):
            return cls(*TODAY)

    def reset():
        g = vars(utils)
        for key in [k for k in g if k.endswith("_instance")]:
            del g[key]
        importlib.reload(lc)
        for m in mods.values():
            importlib.reload(m)
        mods["TravelAPI"].datetime = Today
        mpmath.mp.dps = 15
        decimal.setcontext(decimal.Context())

    with open(src, "rb") as f:
        data = pickle.load(f)
    out = {"python": sys.version.split()[0], "mpmath": mpmath.__version__}
    if kind == "backends":
        results = []
        for seq in data:
            reset()
            cls = getattr(mods[seq["cls"]], seq["cls"])

            def make(i, cls=cls, seq=seq):
                inst = cls()
                if seq["cls"] != "MathAPI":
                    inst._load_scenario(copy.deepcopy(seq["config"]), long_context=seq["lc"])
                return inst
            results.append(run_sequence(seq, make))
        out["results"] = results
        out["signatures"] = signatures({c: getattr(mods[c], c) for c in MODULES})
    else:
        from bfcl_eval.eval_checker import eval_runner
        from bfcl_eval.model_handler.utils import convert_to_function_call, default_decode_execute_prompting

        class Handler:  # decode_execute as bfcl-eval's OpenAICompletionsHandler does it
            def __init__(self, fc):
                self.is_fc_model = fc

            def decode_execute(self, result, has_tool_call_tag):
                if self.is_fc_model:
                    return convert_to_function_call(result)
                return default_decode_execute_prompting(result)

        handlers = {"native": Handler(True), "prompt": Handler(False)}
        checker = importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")
        execute, log = checker.execute_multi_turn_func_call, []

        def recording(*a, **kw):  # every execution the checker asks for: role, call strings, result texts
            results, instances = execute(*a, **kw)
            role = "truth" if kw["model_name"].endswith("_ground_truth") else "model"
            log.append((role, list(kw["func_call_list"]), [squeeze(r) for r in results]))
            return results, instances
        checker.execute_multi_turn_func_call = recording
        results = []
        for case in data["cases"]:
            reset()
            del log[:]
            row = copy.deepcopy(data["rows"][case["id"]])
            try:
                r = eval_runner._evaluate_single_multi_turn_entry(
                    handlers[case["mode"]], case["id"], copy.deepcopy(case["result"]), data["truth"][case["id"]], row,
                    case["model"], case["id"].rsplit("_", 1)[0])
                err = r.get("error") or {}
                msg = err.get("error_message")
                detail = err.get("details") or {}
                results.append({"valid": r["valid"], "error_type": err.get("error_type"),
                                "message": (msg[0] if isinstance(msg, list) else msg or "")[:300],
                                "detail": json.dumps({k: v for k, v in detail.items() if k in (
                                    "differences", "missing_items")}, default=str)[:600], "exec": list(log)})
            except Exception as exc:  # bfcl-eval's own crash on the case
                results.append({"valid": None, "error_type": "crash: %s: %s" % (type(exc).__name__, exc),
                                "message": "", "detail": "", "exec": list(log)})
        reset()
        out["results"] = results
    with open(dst, "wb") as f:
        pickle.dump(out, f, protocol=4)


# =====================================================================================================================
# The reference virtualenv
# =====================================================================================================================
def venv_python(path, wheel):
    py = os.path.join(path, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", path], check=True)
    probe = "import bfcl_eval, mpmath, numpy, pandas, tenacity, overrides, dotenv, tqdm, filelock, tree_sitter; " \
            "assert mpmath.__version__ == '1.3.0'"
    if subprocess.run([py, "-c", probe], capture_output=True).returncode:
        for cmd in ([py, "-m", "pip", "install", "-q", "--no-deps", wheel], [py, "-m", "pip", "install", "-q"] + DEPS):
            done = subprocess.run(cmd, capture_output=True, universal_newlines=True)
            if done.returncode:
                sys.exit("%s failed:\n%s" % (" ".join(cmd), (done.stdout + done.stderr)[-3000:]))
    return py


def wrapped(head, items, width=118):
    """head followed by the items, comma-separated, in lines of at most width characters."""
    line = head
    for k, item in enumerate(items):
        piece = item + (", " if k + 1 < len(items) else "")
        if len(line) + len(piece) > width and line.strip():
            print(line.rstrip())
            line = "    "
        line += piece
    print(line)


def child_env():
    env = dict(os.environ, PYTHONHASHSEED="0", TZ="UTC", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    return env


def launch(py, kind, payload, tmp, tag):
    src, dst = os.path.join(tmp, tag + ".in"), os.path.join(tmp, tag + ".out")
    with open(src, "wb") as f:
        pickle.dump(payload, f, protocol=4)
    proc = subprocess.Popen([py, os.path.abspath(__file__), "--child", kind, src, dst], env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    return proc, dst


def collect(proc, dst, what):
    out, err = proc.communicate()
    if proc.returncode:
        sys.exit("bfcl-eval's side (%s) failed:\n%s" % (what, (out + err)[-3000:]))
    with open(dst, "rb") as f:
        return pickle.load(f)


# =====================================================================================================================
# (a) Back-end sequences
# =====================================================================================================================
JUNK = [None, 0, 1.5, True, [], ["a"], {}, {"k": 1}, ("t",)]
BAD = [None, "", "abc", 0, -1, 2.5, float("nan"), float("inf"), True, [], {}, ["x"], {"k": 1}, 10 ** 20, "\u00b2",
       (1, 2), "12"]
TEXTS = ["hello", "line1\nline2\nline1\n", "", "a b  c\td", "zeta\nalpha\nBeta\n\nalpha", "\u65e5\u672c\u8a9e",
         "x" * 40, " trailing \n", "budget analysis\nBudget Analysis 2024\nfinal", "\n\n", "run ls() now"]
ALL_DOORS = ["driver", "passenger", "rear_left", "rear_right"]
AIRPORTS = "SFO LAX JFK ORD BOS RMS SBK CRH ATV HKG LHR CDG OKD PEK PVG HND CIA GFD XXX sfo".split()
CURRENCIES = "USD RMB EUR JPY GBP CAD AUD INR RUB BRL MXN XXX".split()
ZIPS = "83214 74532 56108 62947 71354 83462 47329 52013 69238 51479 94016 94704 08540 00000".split()
UNITS = ["km", "m", "cm", "mm", "um", "nm", "ft", "in", "kg", "lb", "miles", "yd", "celsius", "fahrenheit", "KM", "",
         None]


def years_ago(n, days=0):
    t = datetime.date(*TODAY[:3]) + datetime.timedelta(days=days)
    try:
        return t.replace(year=t.year - n).isoformat()
    except ValueError:  # 29 February
        return (t - datetime.timedelta(days=1)).replace(year=t.year - n).isoformat()


def math_number(r):
    k = r.random()
    if k < 0.45:
        return r.choice([0, 1, -1, 2, 10, 1000, 10 ** 20, 10 ** 400, -7, 0.5, -0.0, 1e-300, 1e308, 3.14159,
                         float("nan"), float("inf"), -float("inf"), True, False, 2.5, -2.5, 7, 1e16 + 1])
    if k < 0.75:
        return round(r.uniform(-1000, 1000), r.randrange(0, 6))
    if k < 0.9:
        return r.randrange(-10 ** 6, 10 ** 6)
    return r.choice([None, "5", "abc", [1], {"a": 1}, "1e5", 1j])


def math_list(r):
    if r.random() < 0.7:
        return [math_number(r) if r.random() < 0.2 else round(r.uniform(-100, 100), 3)
                for _ in range(r.randrange(1, 8))]
    return r.choice([[], None, "123", 5, {"a": 1}, ["a", "b"], [[1], [2]], [1, "a"], [None], (1, 2), [1e308, 1e308],
                     [float("nan"), 1]])


def log_value(r):
    k = r.random()
    if k < 0.35:
        return 10 ** r.uniform(-300, 300) if r.random() < 0.5 else r.uniform(0, 100)
    if k < 0.55:
        return r.randrange(1, 10 ** r.randrange(1, 30))
    if k < 0.65:
        return r.choice([1 + 2.0 ** -r.randrange(1, 53), 1 - 2.0 ** -r.randrange(1, 54),
                         0.25 + 2.0 ** -r.randrange(30, 55), 0.5 + 2.0 ** -r.randrange(20, 54)])
    if k < 0.8:
        return r.choice([2, 10, 2.718281828459045, 8, 100, 1000, 0.5, 1, 0, 16, 1024, 3, 7, 1e-5, 5e-324])
    if k < 0.9:
        return r.choice([-8, -2, -0.5, -1e10, float("inf"), -float("inf"), float("nan"), True, -1])
    return r.choice(["8", "2.5", "1e5", "-.5", "1/3", "0x10", "0b101", "0o17", "0x1.8p1", "5.", "1_0", " inf ",
                     "abc", "", None, [1], {"a": 2}, "2e", "1/0", "(5)", "3L", "+oo", "nan", "1.2.3", "1e-30",
                     "infinity", "-nan", "1.0_5", "1_000.5", "1e+2", "-3.25e-7", "0/5", "1/2/3", "7/-2", "1e400",
                     "1e-400", "0.1", "1e1_0"])


def fs_tree(cfg):
    dirs, files, contents, paths = [], [], [], []

    def walk(node, prefix):
        for k, v in node.items():
            if not isinstance(v, dict):
                continue
            if v.get("type") == "directory":
                dirs.append(k)
                paths.append(prefix + k)
                walk(v.get("contents", {}), prefix + k + "/")
            else:
                files.append(k)
                if isinstance(v.get("content"), str):
                    contents.append(v["content"])
    root = cfg.get("root") or {}
    if root:
        walk(root[list(root)[0]].get("contents", {}), "")
    return dirs, files, contents, paths


def pools(cls, cfg):
    """Argument pools of a class for one initial config: {param or 'method.param': [(weight, values), ...]}; a
    callable value is called with the generator's random.Random."""
    if cls == "GorillaFileSystem":
        dirs, files, contents, paths = fs_tree(cfg)
        specials = [".", "..", "/", "", "a/b", "x/", "/x", "bad|n", "q?.txt", "c:d", "sp ace.txt", ".hidden",
                    "\u00fcn\u00ef.txt", "image_344822349461074042.jpg", "log.txt"]
        new = ["new_dir", "new.txt", "notes.md", "copy.txt", "sub"]
        deep = paths + ["/" + p for p in paths] + [p + "/" for p in paths] + ["./" + p for p in paths[:3]]
        rel = [p.rsplit("/", 1)[-1] for p in paths]
        name = [(0.35, files), (0.2, dirs), (0.22, new), (0.15, specials), (0.08, JUNK)]
        sub = [s[:k] for s in files + dirs for k in (1, 3) if s] + ["txt", ".", "", "zz"]
        pats = [w for c in contents for w in c.split()[:3]] + ["a", "", "line", "zzz"]
        return {"folder": [(0.35, dirs + rel), (0.25, [".."]), (0.1, [".", "/", "../", "//"]), (0.1, deep),
                           (0.15, specials + new + files), (0.05, JUNK)],
                "dir_name": name, "file_name": name, "source": name, "file_name1": name, "file_name2": name,
                "destination": [(0.3, dirs), (0.3, new + files), (0.3, specials + JUNK)],
                "content": [(0.6, TEXTS), (0.3, contents), (0.1, [123, None, ["x"]])],
                "echo.file_name": [(0.7, [None] + files + new), (0.3, specials + dirs + JUNK)],
                "path": [(0.4, [".", "/"]), (0.35, deep + dirs), (0.25, ["", "nope", "..", None, 5, "./", "/nope/x"])],
                "name": [(0.5, sub), (0.4, [None]), (0.1, [5, ["a"]])],
                "mode": [(0.8, ["l", "w", "c"]), (0.2, ["x", "", None, ["l"], "L"])],
                "pattern": [(0.9, pats), (0.1, [None, 5])],
                "a": [(0.8, [True, False]), (0.2, [None, 1, "x", 0])],
                "human_readable": [(0.8, [True, False]), (0.2, [None, "yes", 0, 1])],
                "lines": [(0.7, [0, 1, 2, 3, 5, 10, 100]), (0.3, [-1, -3, "2", 2.5, None, True])]}
    if cls == "MathAPI":
        num = [(1, [math_number])]
        return {"value": [(1, [log_value])], "logarithm.base": [(1, [log_value])],
                "logarithm.precision": [(0.8, [lambda r: r.randrange(1, 40), 15, 16, 17]),
                                        (0.2, [0, -3, 100, lambda r: r.randrange(40, 300), 2.5, "10", None, True])],
                "numbers": [(1, [math_list])], "a": num, "b": num, "part": num, "whole": num, "number": num,
                "unit_in": [(1, UNITS)], "unit_out": [(1, UNITS)],
                "power.base": [(1, [2, 10, -2, 0, 0.5, 2.5, -8, 1e10, "2", None])],
                "exponent": [(1, [0, 1, 2, 3, -1, 0.5, -0.5, 1 / 3, 100, 400, 1024, 2.5, None])],
                "square_root.precision": [(1, [lambda r: r.randrange(1, 60), 10, 28, 0, -1, 2.5, None, "5", 200])],
                "decimal_places": [(1, [0, 1, 2, 3, -1, -2, None, 2.5, "2", 10])]}
    if cls == "MessageAPI":
        umap = cfg.get("user_map") or {"Alice": "USR001", "Bob": "USR002", "Catherine": "USR003", "Daniel": "USR004"}
        names = list(umap) + ["Alice", "Zed", "eve", "", "Bob "]
        ids = list(umap.values()) + ["USR001", "USR005", "USR999", "usr001", ""]
        return {"user": [(0.9, names), (0.1, JUNK)],
                "user_id": [(0.6, ids), (0.3, [Ref("attr", "current_user")]), (0.1, JUNK)],
                "receiver_id": [(0.8, ids), (0.1, [Ref("item", "inbox", 0), Ref("val", "user_map", 1)]),
                                (0.1, JUNK)],
                "message": [(0.9, ["Hello", "Could you upload the file?", "", "UPLOAD now", "\u65e5\u672c",
                                   "Meeting at 3 PM"]), (0.1, [123, None, ["x"]])],
                "user_name": [(0.6, ["Frank", "Grace", "Heidi", "Ivan"]), (0.3, names), (0.1, JUNK)],
                "keyword": [(0.9, ["upload", "file", "Meeting", "", "UPLOAD", "connect", "zzz"]), (0.1, [None, 5])]}
    if cls == "TwitterAPI":
        tids = [int(k) for k in cfg.get("tweets", {}) if str(k).lstrip("-").isdigit()]
        counter = cfg.get("tweet_counter", 0) if isinstance(cfg.get("tweet_counter", 0), int) else 0
        people = [cfg.get("username", "john"), "john", "alice", "bob", "charlie", ""]
        text = [(0.9, TEXTS), (0.1, [None, 5])]
        return {"authenticate_twitter.username": [(0.7, [Ref("attr", "username")]), (0.3, people + [None])],
                "password": [(0.7, [Ref("attr", "password")]), (0.3, ["wrong", None, "", cfg.get("password", "")])],
                "username": [(0.9, people), (0.1, JUNK)],
                "tweet_id": [(0.5, tids + list(range(counter, counter + 3)) + [0, 1]),
                             (0.3, [Ref("key", "tweets", 0), Ref("key", "tweets", -1), Ref("attr", "tweet_counter")]),
                             (0.2, [str(t) for t in tids[:2]] + [-1, 999, None, 1.5, True, [0]])],
                "content": text, "comment_content": text,
                "tags": [(0.8, [["#a"], [], ["#Budget", "#x"]]), (0.2, [None, "#tag", [1]])],
                "mentions": [(0.8, [["@a"], [], ["@bob"]]), (0.2, [None, "@str", [1]])],
                "mentioned_usernames": [(0.8, [["@x"], ["@y", "@z"], []]), (0.2, ["@s", None, [1], ("@t",)])],
                "username_to_follow": [(0.9, people), (0.1, JUNK)], "username_to_unfollow": [(0.9, people),
                                                                                            (0.1, JUNK)],
                "keyword": [(0.9, ["analysis", "#budget", "budget", "", "Stay", "#ANALYSIS", "zzz", "tuned"]),
                            (0.1, [None, 5])]}
    return {k: [(1, v)] for k, v in GOOD[cls].items()}


R = Ref
GOOD = {  # the argument pools of the four service back-ends (from check_b)
    "TicketAPI": {
        "title": ["Bug report", "", "Network issue", "\u00dcn\u00efcode \u2713"],
        "description": ["Details here", "", "x" * 300],
        "priority": [1, 2, 3, 4, 5, 0, 6, -1, 3.5, 5.0, True, "3"],
        "ticket_id": [R("item", "ticket_queue", i, "id") for i in (0, 1, -1, 3, 2)] + [1, 2, 999, "1", 1.0],
        "resolution": ["Fixed it", ""],
        "updates": [{"title": "New"}, {"status": "Closed", "priority": 3}, {"description": None},
                    {"priority": None, "title": "T"}, {"assignee": "bob", "due": "x"},
                    {"a": 1, "b": 2, "c": 3, "title": "z", "zz": None}, {str(i): i for i in range(25)}, {1: "x"},
                    {"status": "In Progress"}, {"priority": 9}, {"title": "A", "owner": "B", "tags": "C"}],
        "username": ["alice", "", R("attr", "current_user"), "bob"],
        "password": ["pw", "", "secret"],
        "status": ["Open", "open", "Closed", "Resolved", "In Progress", None, "", "CLOSED"]},
    "TradingBot": {
        "name": ["Apple", "Google", "Tesla", "Microsoft", "Nvidia", "Zeta Corp", "Alpha Tech", "Omega Industries",
                 "Quasar Ltd.", "Neptune Systems", "Synex Solutions", "Amazon", "Gorilla", "Unknown Co", "apple"],
        "symbol": [R("key", "stocks", i) for i in (0, 3, -1)] + ["AAPL", "NVDA", "XYZ", "aapl",
                                                               R("key", "watch_list", 0)],
        "order_id": [R("key", "orders", 0), R("key", "orders", -1), R("key", "orders", 1), 12345, 12446, 99999,
                     "12345"],
        "order_type": ["Buy", "Sell", "buy", "SELL", "Hold"],
        "price": [100.0, 227.16, 1.5, 0, -5, 1e7, 150, 2840.34],
        "amount": [1, 10, 100, 0, -1, 2.5, 1000000, 500.0, 10000.0, 0.01, 1e9],
        "username": ["user", ""], "password": ["pw", ""],
        "start_date": ["2024-09-01", "2024-09-02", "2024-08-31", None, "2024-9-1", "09/01/2024", ""],
        "end_date": ["2024-09-01", "2024-09-02", "2024-09-03", None, "2024-13-01", ""],
        "sector": ["Technology", "Automobile", "Energy", "technology"],
        "stocks": [["AAPL", "GOOG"], ["TSLA", "ZETA", "XYZ"], [], R("keys", "stocks"), ["NVDA", "AAPL", "ALPH"]],
        "min_price": [0, 100, 300.0, 1000, 5000], "max_price": [0, 100, 300.0, 1000, 5000, 1e9],
        "stock": ["AAPL", "ZETA", "XYZ", "NVDA", "GOOG"],
        "threshold": [0.1, 0.0, 0.2, 1, -1, 0.12]},
    "TravelAPI": {
        "client_id": ["cid"], "client_secret": ["secret"], "refresh_token": ["tok"],
        "grant_type": ["read_write", "read", "write"],
        "user_first_name": ["Michael", "Emma", R("attr", "user_first_name")],
        "user_last_name": ["Thompson", "Smith", R("attr", "user_last_name")],
        "access_token": [R("attr", "access_token")] * 5 + ["wrong", "", None],
        "card_number": ["1234567812345678", "4111111111111111", R("key", "credit_card_list", 0)],
        "expiration_date": ["12/2028"], "cardholder_name": ["Michael Thompson"],
        "card_verification_number": [123, 456],
        "card_id": [R("key", "credit_card_list", i) for i in (0, -1, 1, 2)] + ["000", "144756014165"],
        "travel_date": ["2024-11-15", "2024-12-01", "2024-11-16", "2024-13-01", "11/15/2024", "2024-1-5",
                        "\u0661\u0669\u0669\u0660-01-01", "2024-11-1\u00b2", "2025-02-29"],
        "travel_from": AIRPORTS, "travel_to": AIRPORTS,
        "travel_class": ["economy", "business", "first", "economy", "Economy", "premium"],
        "booking_id": [R("key", "booking_record", 0), R("key", "booking_record", -1), "nope", None, "booking_901",
                       R("key", "booking_record", 1)],
        "insurance_id": [None, "ins"],
        "base_currency": CURRENCIES, "target_currency": CURRENCIES,
        "value": [100, 2.5, 1000.0, 0, -3, "1", "2", 1e300],
        "first_name": [R("attr", "user_first_name")] * 3 + ["Other"],
        "last_name": [R("attr", "user_last_name")] * 3 + ["Other"],
        "date_of_birth": ["1990-01-01", years_ago(18), years_ago(18, 1), years_ago(18, -1), "2010-05-05",
                          "1990-02-30", "01/01/1990", "\u0661\u0669\u0669\u0660-01-01", "2000-02-29"],
        "passport_number": ["US1234567", "UK123", "", "us123"],
        "budget_limit": [100, 1000.0, "200", "abc", 1e9, -5, 0, "1e3"],
        "location": ["Rivermist", "Stonebrook", "Maplecrest", "Silverpine", "Shadowridge", "London", "Paris",
                     "Sunset Valley", "Oakendale", "Willowbend", "Crescent Hollow", "Autumnville", "Pinehaven",
                     "Greenfield", "San Francisco", "Los Angeles", "New York", "Chicago", "Boston", "Beijing",
                     "Hong Kong", "Rome", "Tokyo", "Atlantis"],
        "insurance_type": ["comprehensive"], "insurance_cost": [50, 50.0, 1e9, 0, -10],
        "message": ["Help me"], "lastModifiedAfter": [None, "2024-01-01"], "includeRemoved": [None, "yes"]},
    "VehicleControlAPI": {
        "ignitionMode": ["START", "STOP", "start"],
        "fuelAmount": [10, 10.5, 45, 50, 60, 0, -1, 1e-9],
        "unlock": [True, False],
        "door": [["driver"], ["driver", "passenger", "rear_left", "rear_right"], ["passenger", "rear_left"], [],
                 ["trunk"], "driver"],
        "temperature": [22, 72.5, -40, 25.0], "unit": ["celsius", "fahrenheit", "kelvin"],
        "fanSpeed": [0, 50, 100, 101, -1, 75],
        "mode": ["auto", "cool", "heat", "defrost", "on", "off", "engage", "release", "blink"],
        "option": ["fuel", "battery", "doors", "climate", "headlights", "parkingBrake", "brakePedal", "engine",
                   "bogus"],
        "pedalPosition": [0, 0.5, 1, 1.0, 1.5, -0.1, 0.0],
        "speed": [0, 65, 67, 120, 125, -5, 60.0, "60"], "activate": [True, False],
        "distanceToNextVehicle": [100, 50.5, "50", "abc"],
        "messages": [["a", "b"], [], "x"], "distance": [100, 1000, 0, 1e6],
        "liter": [10, 2.5, 0], "gallon": [10, 2.5, 0],
        "cityA": ZIPS, "cityB": ZIPS,
        "city": ["Rivermist", "Stonebrook", "Maplecrest", "Silverpine", "Shadowridge", "Sunset Valley", "Oakendale",
                 "Willowbend", "Crescent Hollow", "Autumnville", "San Francisco", "Atlantis"],
        "destination": ["123 Main St, Rivermist, CA"]},
}
WEIGHTS = {"GorillaFileSystem": {"cd": 3}, "MathAPI": {"logarithm": 8, "square_root": 2},
           "MessageAPI": {"message_login": 2, "send_message": 2},
           "TwitterAPI": {"authenticate_twitter": 2, "post_tweet": 3, "mention": 2}}
RECIPES = {  # prefixes that open the deeper branches (login and the like)
    "MessageAPI": [[("message_login", [], {"user_id": R("attr", "current_user")})]],
    "TwitterAPI": [[("authenticate_twitter", [], {"username": R("attr", "username"),
                                                  "password": R("attr", "password")})]],
    "TicketAPI": [[("ticket_login", [], {"username": "alice", "password": "pw"})],
                  [("ticket_login", [], {"username": R("attr", "current_user"), "password": "pw"})]],
    "TradingBot": [[("trading_login", [], {"username": "u", "password": "p"})]],
    "TravelAPI": [[("authenticate_travel", [], {"client_id": "c", "client_secret": "s", "refresh_token": "r",
                                                "grant_type": "read_write", "user_first_name": "Michael",
                                                "user_last_name": "Thompson"})],
                  [("authenticate_travel", [], {"client_id": "c", "client_secret": "s", "refresh_token": "r",
                                                "grant_type": "read", "user_first_name": "Michael",
                                                "user_last_name": "Thompson"}),
                   ("register_credit_card", [], {"access_token": R("attr", "access_token"),
                                                 "card_number": "4111111111111111", "expiration_date": "12/2030",
                                                 "cardholder_name": "Michael Thompson",
                                                 "card_verification_number": 321})]],
    "VehicleControlAPI": [[("lockDoors", [], {"unlock": False, "door": ALL_DOORS}),
                           ("pressBrakePedal", [], {"pedalPosition": 1.0}),
                           ("startEngine", [], {"ignitionMode": "START"})],
                          [("fillFuelTank", [], {"fuelAmount": 20.0}),
                           ("lockDoors", [], {"unlock": False, "door": ALL_DOORS})]],
}
TICKETS = [{"id": 1, "title": "Login bug", "description": "d", "status": "Open", "priority": 3, "created_by": "alice"},
           {"id": 2, "title": "Crash", "description": "", "status": "Closed", "priority": 5, "created_by": "bob"},
           {"id": 3, "title": "Slow", "description": "x", "status": "Resolved", "priority": 1, "created_by": "alice",
            "resolution": "cache"}]
DEEP = {"root": {"home": {"type": "directory", "contents": {
    "a": {"type": "directory", "contents": {
        "b": {"type": "directory", "contents": {
            "deep.txt": {"type": "file", "content": "one\ntwo\nthree\nfour\n"},
            "c": {"type": "directory", "contents": {}}}},
        "a.txt": {"type": "file", "content": "zeta\nalpha\nBeta\n\nalpha"},
        ".hidden": {"type": "file", "content": "secret"}}},
    "log.txt": {"type": "file", "content": "l1\nl2\nl3\nl4\nl5\nl6\nl7\nl8\nl9\nl10\nl11\nl12"},
    "report.txt": {"type": "file", "content": "budget analysis\nBudget Analysis 2024"},
    "sp ace.txt": {"type": "file", "content": "\u65e5\u672c\u8a9e"},
    "empty": {"type": "directory", "contents": {}},
    "weird": {"type": "link", "content": "ignored"},
    "a.txt": {"type": "file", "content": "zeta\nalpha\nbeta"}}}}}
OWN = {  # initial configs of our own, besides the rows' (from check_a and check_b)
    "GorillaFileSystem": [{}, {"root": {"r": {"type": "directory", "contents": {}}}}, DEEP,
                          {"root": {"/": {"type": "directory", "contents": {"x.txt": {"type": "file",
                                                                                      "content": "x"}}}}},
                          {"root": {"w": {"type": "directory", "contents": {"pics": {"type": "directory", "contents": {
                              "image_344822349461074042.jpg": {"type": "file", "content": "already here"}}}}}}}],
    "MathAPI": [{}],
    "MessageAPI": [{}, {"random_seed": 7, "current_user": "USR002"},
                   {"user_count": 4, "current_user": "USR001", "user_map": {"Alice": "USR001", "Bob": "USR002",
                                                                           "Eve": "USR005"},
                    "inbox": [{"USR002": "Hi"}, {"USR005": "Upload it"}, {"USR002": "Bye"}, {"USR002": "Hi"}]},
                   {"current_user": "USR003", "inbox": [], "message_count": 0},
                   {"current_user": "USR001", "inbox": [{"USR002": "ok"}, {}, {"USR003": "x"}]},
                   {"current_user": "USR001", "generated_ids": [12345]}],
    "TwitterAPI": [{}, {"authenticated": True},
                   {"username": "ann", "password": "pw", "authenticated": True, "tweet_counter": 2,
                    "tweets": {"0": {"id": 0, "username": "ann", "content": "Budget analysis", "tags": ["#Budget"],
                                     "mentions": []},
                               "1": {"id": 1, "username": "bob", "content": "Hello", "tags": [],
                                     "mentions": ["@ann"]}},
                    "comments": {"1": [{"username": "x", "content": "c"}]}, "retweets": {"ann": [1]},
                    "following_list": ["bob"]},
                   {"tweet_counter": 5, "tweets": {"3": {"id": 3, "username": "john", "content": "no tags"}}}],
    "TicketAPI": [{}, {"current_user": "alice"},
                  {"current_user": "alice", "ticket_queue": TICKETS, "ticket_counter": 4},
                  {"current_user": "bob", "ticket_queue": TICKETS}, {"current_user": "x", "ticket_counter": "7"},
                  {"ticket_queue": [{"id": 1}], "current_user": "alice"}, {"current_user": ""}],
    "TradingBot": [{}, {"authenticated": True, "market_status": "Open"},
                   {"orders": {"12345": {"id": 12345, "order_type": "Buy", "symbol": "AAPL", "price": 1.0, "amount": 1,
                                         "status": "Open"}, "7": {"id": 7, "symbol": "TSLA", "status": "Completed"},
                               "x1": {"id": "x1", "symbol": "ZZZ", "status": "Pending"}}, "authenticated": True},
                   {"random_seed": 42, "authenticated": True, "market_status": "Open"},
                   {"account_info": {"account_id": 1}, "authenticated": True, "market_status": "Open"},
                   {"transaction_history": [{"type": "deposit", "amount": 1, "timestamp": "2024-09-01 11:00:00"},
                                            {"type": "x", "amount": 2, "timestamp": "bad"}], "authenticated": True},
                   {"random_seed": "seed", "authenticated": True, "market_status": "Open",
                    "account_info": {"account_id": 2, "balance": 5.0}}],
    "TravelAPI": [{}, {"token_expires_in": 0, "access_token": "abc"}, {"random_seed": 7}, {"random_seed": "seed"},
                  {"access_token": "abc", "token_expires_in": 2, "budget_limit": 5000.0, "user_first_name": "A",
                   "user_last_name": "B", "credit_card_list": {"c1": {"card_number": "1", "balance": 10000.0},
                                                               "c2": {"card_number": "2"}},
                   "booking_record": {"b1": {"card_id": "c9", "travel_cost": 10.0, "travel_date": "2024-01-01",
                                             "travel_from": "SFO", "travel_to": "LAX", "travel_class": "economy",
                                             "transaction_id": "t"}, "b2": {"card_id": "c1"}}}],
    "VehicleControlAPI": [{}, {"doorStatus": dict.fromkeys(ALL_DOORS, "locked"), "brakePedalStatus": "pressed",
                               "brakePedalForce": 1000.0, "engineState": "stopped", "fuelLevel": 10.0},
                          {"engineState": "running", "fuelLevel": 49.5, "random_seed": 9},
                          {"doorStatus": {"driver": "locked"}, "remainingUnlockedDoors": 0},
                          {"fuelLevel": -1.0, "frontLeftTirePressure": 20.0, "slopeAngle": 5.0,
                           "parkingBrakeForce": 100.0}],
}
_BOOK = "book_flight(access_token='abc', card_id='{}', travel_date='2024-11-15', travel_from='{}', travel_to='{}', " \
        "travel_class='{}')"
_GATED = ["get_booking_history(access_token='abc')", "set_budget_limit(access_token='abc', budget_limit=100)",
          "get_credit_card_balance(access_token='abc', card_id='c1')", _BOOK.format("c1", "SFO", "LAX", "economy"),
          "retrieve_invoice(access_token='abc', booking_id='b1')",
          "cancel_booking(access_token='abc', booking_id='b1')",
          "purchase_insurance(access_token='abc', insurance_type='full', booking_id='b1', insurance_cost=5, "
          "card_id='c1')", "register_credit_card(access_token='abc', card_number='9', expiration_date='1/30', "
          "cardholder_name='A B', card_verification_number=1)"]
DIRECTED = [  # hand-written sequences (class, config, calls) for branches random calls rarely reach
    ("GorillaFileSystem", DEEP, ["cd('home')", "cp('a', 'a')", "ls()", "cd('a')", "cd('a')", "pwd()", "cd('..')",
                                "pwd()", "find()", "du()", "cd('/')", "find('/', 'b')"]),
    ("GorillaFileSystem", DEEP, ["mv('a', 'a')", "ls()", "cd('a')", "find('.', 'txt')", "du(True)"]),
    ("GorillaFileSystem", DEEP, ["cp('a', 'a2')", "cd('a2')", "cd('b')", "cd('..')", "pwd()",
                                "echo('changed', 'deep.txt')", "cd('/')", "cd('a')", "cd('b')", "cat('deep.txt')",
                                "mv('deep.txt', 'c')", "cat('deep.txt')"]),
    ("GorillaFileSystem", DEEP, ["mv('a', 'z')", "cd('z')", "cd('b')", "cd('..')", "pwd()", "cd('..')", "pwd()",
                                "cd('..')", "cd('..')", "ls(True)"]),
    ("GorillaFileSystem", DEEP, ["touch('.')", "ls(True)", "echo('x', '.')", "cat('.')", "mv('a', '.')",
                                "cp('a.txt', '.')", "rmdir('.')", "rm('.')", "ls(True)"]),
    ("GorillaFileSystem", DEEP, ["echo('x', 'a')", "mv('a.txt', 'a')", "cp('a.txt', 'a')", "mkdir('q')", "cd('q')",
                                "mkdir('a')", "cd('..')", "cp('a', 'q')", "mv('a', 'q')", "cd('..')", "cd('..')",
                                "find(None)", "find('a/b/c')", "find('/a/b')"]),
    ("GorillaFileSystem", DEEP, ["mkdir(('t',))", "ls()", "cd(('t',))", "pwd()", "touch(['l'])",
                                "echo('" + "y" * 3000 + "', 'log.txt')", "du(True)", "tail('log.txt', 0)",
                                "tail('log.txt', -2)", "wc('log.txt', 'c')", "diff('a.txt', 'log.txt')"]),
    ("GorillaFileSystem", {}, ["pwd()", "cd('..')", "ls()", "mkdir('d')", "cd('d')", "pwd()", "du()"]),
    ("MessageAPI", {"current_user": "USR001", "generated_ids": {67410, 41772}},
     ["send_message('USR002', 'a')", "send_message('USR003', 'b')", "view_messages_sent()"]),
    ("MessageAPI", OWN["MessageAPI"][2], ["delete_message('USR002')", "view_messages_sent()", "add_contact('Zoe')",
                                          "add_contact('Zoe')", "list_users()"]),
    ("TwitterAPI", {"authenticated": True}, ["post_tweet('a')", "mention(0, ['@x'])", "post_tweet('b')",
                                             "get_tweet(1)", "post_tweet('c', [], [])", "mention(2, '@s')",
                                             "search_tweets('A')", "get_user_stats('john')"]),
    ("MathAPI", {}, ["si_unit_conversion(10 ** 400, 'km', 'm')", "imperial_si_conversion(10 ** 400, 'm', 'ft')",
                     "imperial_si_conversion(100, 'celsius', 'fahrenheit')", "min_value([])",
                     "imperial_si_conversion(212.0, 'fahrenheit', 'celsius')", "max_value([])"]),
    ("TravelAPI", {"access_token": "abc", "token_expires_in": 2, "budget_limit": 5000.0, "user_first_name": "A",
                   "user_last_name": "B", "credit_card_list": {
                       "c1": {"card_number": "1", "balance": 10000.0}, "c2": {"card_number": "2"},
                       "c3": {"card_number": "3", "balance": 10.0}, "c4": {"card_number": "4", "balance": 4000.0}},
                   "booking_record": {"b1": {"card_id": "c1", "travel_cost": 10.0, "travel_date": "2024-01-01",
                                             "travel_from": "SFO", "travel_to": "LAX", "travel_class": "economy",
                                             "transaction_id": "t"}}},
     [_BOOK.format(c, "SFO", "LAX", "economy") for c in ("c2", "c3", "c4", "c1")]
     + [_BOOK.format("c1", "JFK", "PEK", k) for k in ("first", "Economy", "business", "coach", "FIRST")]
     + [_BOOK.format("c1", "SFO", "ZZZ", "economy"), _BOOK.format("c1", "HKG", "SFO", "economy")] + _GATED
     + ["get_flight_cost(travel_from='SFO', travel_to='LAX', travel_date='2024-11-15', travel_class='coach')",
        "get_flight_cost(travel_from='SFO', travel_to='LAX', travel_date='2024-11-1\u00b2', travel_class='first')",
        "verify_traveler_information(first_name='A', last_name='B', date_of_birth='1990-01-01', "
        "passport_number='US1')", "compute_exchange_rate(base_currency='USD', target_currency='USD', value=1)"]),
    ("TravelAPI", {"user_first_name": "A", "user_last_name": "B"},
     ["verify_traveler_information(first_name='A', last_name='B', date_of_birth='%s', passport_number='US1')"
      % years_ago(18, d) for d in (-1, 0, 1)]),
    ("TravelAPI", {"access_token": "abc", "token_expires_in": 0}, _GATED),
    ("TravelAPI", {"access_token": "abc"}, _GATED),
    ("VehicleControlAPI", {"fuelLevel": -1.0}, ["fillFuelTank(fuelAmount=0.5)", "fillFuelTank(fuelAmount=0)",
                                                "fillFuelTank(fuelAmount=1.5)", "startEngine(ignitionMode='START')"]),
    ("VehicleControlAPI", {}, ["estimate_distance(cityA='%s', cityB='%s')" % (a, b) for a in ZIPS for b in ZIPS]),
    ("TicketAPI", {"current_user": "alice", "ticket_queue": TICKETS},
     ["edit_ticket(ticket_id=1, updates={'assignee': 'a', 'due_date': 'b', 'tags': 'c', 'owner': 'd'})",
      "edit_ticket(ticket_id=1, updates={'title': 'x', 'status': 'Open', 'bogus': 1, 'other': 2})",
      "edit_ticket(ticket_id=3, updates={'title': 'x', 'status': 'Open', 'description': None, 'priority': 2})"]),
]


def parse_call(text):
    """A call string as (name, positional values, keyword values), or None when an argument is not a literal."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return None
    try:
        return node.func.id, [ast.literal_eval(a) for a in node.args], \
            {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    except ValueError:
        return None


def pick(rng, groups):
    groups = [(w, vals) for w, vals in groups if vals]
    x = rng.random() * sum(w for w, _ in groups)
    for w, vals in groups:
        if x < w:
            break
        x -= w
    v = rng.choice(vals)
    return v(rng) if callable(v) else v


def random_call(rng, cls, method, params, pool, inst=0):
    """A call of method with values from the pools (sometimes a junk value, a default left out, a required argument
    missing, an unexpected keyword, positional style, one argument too many)."""
    args, kwargs = [], {}
    for name, has_default in params:
        if has_default and rng.random() < 0.3:
            continue
        groups = pool.get(method + "." + name) or pool.get(name)
        kwargs[name] = pick(rng, groups) if groups and rng.random() < 0.88 else rng.choice(BAD)
    roll = rng.random()
    if roll < 0.03 and kwargs:
        kwargs.pop(rng.choice(sorted(kwargs)))
    elif roll < 0.05:
        kwargs["unexpected_arg"] = 1
    elif roll < 0.11:
        for name, _ in params:
            if name not in kwargs:
                break
            args.append(kwargs.pop(name))
        if roll < 0.07:
            args.append("one too many")
    return (inst, method, args, kwargs)


def build_sequences(rows, fuzz, seed):
    """Every sequence of part (a): {id, cls, config, lc, insts, calls: [(instance, method, args, kwargs)], tag}."""
    classes = eh._mt_backends()
    params = {c: {m: [(p.name, p.default is not inspect.Parameter.empty)
                      for p in inspect.signature(getattr(k, m)).parameters.values() if p.name != "self"]
                  for m in eh._mt_methods(k)} for c, k in classes.items()}
    seqs, seen = [], set()

    def add(cls, config, lc, calls, tag, insts=1):
        key = repr((cls, json.dumps(config, sort_keys=True, default=repr), lc, insts, calls))
        if key not in seen:
            seen.add(key)
            seqs.append({"id": len(seqs), "cls": cls, "config": config, "lc": lc, "insts": insts, "calls": calls,
                         "tag": tag})

    configs = collections.defaultdict(list)
    for raw, truth in rows:
        for cls in raw["involved_classes"]:
            cfg = raw["initial_config"].get(cls, {}) if cls != "MathAPI" else {}
            calls = []
            for turn in truth:
                for text in turn:
                    parsed = parse_call(text)
                    if parsed and parsed[0] in params[cls]:
                        calls.append((0, parsed[0], parsed[1], parsed[2]))
            for lc in (False, True):
                add(cls, cfg, lc, calls, "truth:" + raw["id"])
            if cfg not in configs[cls]:
                configs[cls].append(cfg)
    for cls, extra in OWN.items():
        configs[cls].extend(c for c in extra if c not in configs[cls])
    rng = random.Random(seed)
    for cls in sorted(configs):
        names = sorted(params[cls])
        weights = [WEIGHTS.get(cls, {}).get(n, 1) for n in names]
        for k, cfg in enumerate(configs[cls] if cls != "MathAPI" else [{}] * (10 * fuzz)):
            pool = pools(cls, cfg)
            for lc in ((False, True) if cls != "MathAPI" else (False,)):
                for f in range(fuzz):
                    r = random.Random(rng.random())
                    insts = 2 if f == 0 and cls != "MathAPI" else 1
                    calls = []
                    if cls in RECIPES and r.random() < 0.7:
                        recipe = r.choice(RECIPES[cls])
                        for i in range(insts):
                            calls += [(i, m, a, kw) for m, a, kw in recipe]
                    for _ in range(r.randint(10, 30)):
                        m = r.choices(names, weights)[0]
                        calls.append(random_call(r, cls, m, params[cls][m], pool, r.randrange(insts)))
                    add(cls, cfg, lc, calls, "fuzz:%s:%d" % (cls, k), insts)
        for m in names:  # every method from the defaults, valid and invalid, long_context off and on
            for lc in (False, True):
                r = random.Random(rng.random())
                pool = pools(cls, {})
                calls = [(0, n, a, kw) for n, a, kw in (RECIPES.get(cls) or [[]])[0]]
                calls += [random_call(r, cls, m, params[cls][m], pool) for _ in range(8)]
                add(cls, {}, lc, calls, "method:%s.%s" % (cls, m))
    for cls, cfg, texts in DIRECTED:
        for lc in (False, True):
            calls = []
            for text in texts:
                node = ast.parse(text, mode="eval").body
                calls.append((0, node.func.id, [eval(compile(ast.Expression(a), "<a>", "eval")) for a in node.args],
                              {k.arg: ast.literal_eval(k.value) for k in node.keywords}))
            add(cls, cfg, lc, calls, "directed")
    specials = [-8, -0.5, -1, 0, 1, 2, 0.25, -float("inf"), float("inf"), float("nan"), True, "1e2e3", "1/0", "0/0",
                "-inf", 1e-320]
    for prec in (1, 15, 30):
        add("MathAPI", {}, False, [(0, "logarithm", [v, b, prec], {}) for v in specials for b in specials],
            "grid:logarithm:%d" % prec)
    add("MathAPI", {}, False, [(0, "logarithm", [v, b, prec], {}) for v in (77.69, "1e5", "abc", 0, 1, "inf")
                               for b in (10, "1.2.3", 0, 1, "inf") for prec in (eh._MP_LOG_DIGITS, eh._MP_LOG_DIGITS + 1, 10 ** 11, 2 ** 64,
                                            eh._MP_SHIFT_OVERFLOW - 1, eh._MP_SHIFT_OVERFLOW, 10 ** 20)],
        "grid:logarithm:huge precision")
    gaps = ["1+2j", "2j", "(1-1j)", "1e500", "-2.5e-450", "1" + "0" * 450 + ".5"]
    add("MathAPI", {}, False, [(0, "logarithm", [v, b, p], {}) for v in gaps for b in (2, "3j", "1e-999")
                               for p in (5, 30)], "complex:logarithm")
    return seqs


def eh_sequences(seqs):
    results = []
    for seq in seqs:
        decimal.setcontext(decimal.Context())
        row = eh.MultiTurnRow(id="bench_seq_%d" % seq["id"], category=CATEGORIES[3 if seq["lc"] else 0],
                              turns=((),), classes=(seq["cls"],), config={seq["cls"]: seq["config"]}, functions=(),
                              held={}, truth=((),), source="bench")
        world = eh._MTWorld(row, {"i0": "bench_i0", "i1": "bench_i1"})
        results.append(run_sequence(seq, lambda i, w=world, c=seq["cls"]: w.of("i%d" % i)[c]))
    return results


ERROR_MARK = re.compile(r'(?i)\berror\b|"[a-z_]*(status|success)": false|not (found|authenticated|logged)')


def known_call(seq, call, a, b):
    """Why a differing call is a known divergence, or None."""
    if call is None:
        return None
    _, method, args, kwargs = call
    if method == "logarithm" and any(isinstance(v, complex) or (isinstance(v, str) and "j" in v.lower())
                                     for v in list(args[:2]) + [kwargs.get("value"), kwargs.get("base")]):
        return "complex input to MathAPI.logarithm (evalharness: not supported)"
    if method == "logarithm":
        precision = kwargs.get("precision", args[2] if len(args) > 2 else None)
        if isinstance(precision, int) and precision > eh._MP_LOG_DIGITS and b[1] == '{"error": ""}':
            return "a logarithm at more than %d digits (evalharness refuses it; bfcl-eval computes it)" % (
                eh._MP_LOG_DIGITS)
    if method == "edit_ticket" and a[2] == b[2] and same_fields(a[1], b[1]):
        return "edit_ticket's invalid fields in another order"
    return None


def compare_sequences(seqs, ref, ours):
    per_class = collections.defaultdict(lambda: [0, 0, 0, 0])  # compared, equal, different, known
    per_method = collections.defaultdict(lambda: [0, 0, 0])  # calls, valid outcome, invalid outcome
    diffs, known = [], collections.defaultdict(list)
    for seq, a_steps, b_steps in zip(seqs, ref, ours):
        cls = seq["cls"]
        calls = [None] + list(seq["calls"])
        last_a = last_b = None
        for i in range(max(len(a_steps), len(b_steps))):
            tally = per_class[cls]
            tally[0] += 1
            if i >= len(a_steps) or i >= len(b_steps):
                tally[2] += 1
                diffs.append((seq, i, "steps", "%d steps" % len(a_steps), "%d steps" % len(b_steps), []))
                break
            a, b = a_steps[i], b_steps[i]
            last_a = a[3] if a[3] is not None else last_a
            last_b = b[3] if b[3] is not None else last_b
            if calls[i] is not None:
                m = per_method[(cls, calls[i][1])]
                m[0] += 1
                invalid = a[0] == "exc" or (isinstance(a[1], str) and ERROR_MARK.search(a[1][:400]) and
                                            (calls[i][2] or calls[i][3]))
                m[2 if invalid else 1] += 1
            what = [w for w, same in (("result", a[:2] == b[:2]), ("state ==", last_a == last_b),
                                      ("state rendering", a[2] == b[2])) if not same]
            if not what:
                tally[1] += 1
                continue
            why = known_call(seq, calls[i], a, b) if what == ["result"] else None
            if why:
                tally[3] += 1
                known[why].append((seq, i, a, b))
                continue
            tally[2] += 1
            diffs.append((seq, i, ", ".join(what), a, b, differing_attributes(last_a, last_b)))
    return per_class, per_method, diffs, known


def differing_attributes(a, b):
    """instance#attribute names whose pictures differ (by == or by repr, which tells 1 from 1.0 and dict order)."""
    out = []
    for i in range(max(len(a or []), len(b or []))):
        x = a[i] if a and i < len(a) else {}
        y = b[i] if b and i < len(b) else {}
        out += ["#%d.%s%s" % (i, k, "" if x.get(k) != y.get(k) else " (== equal, repr differs)")
                for k in sorted(set(x) | set(y)) if repr(x.get(k)) != repr(y.get(k))]
    return out


def show_step(x):
    text = x[1] if isinstance(x[1], str) else "%s... (%d chars, sha1 %s)" % (x[1][3][:200], x[1][2], x[1][1][:12])
    return "%s %r" % (x[0], text[:300])


# =====================================================================================================================
# (b) Verdict cases
# =====================================================================================================================
DONE = "Done."
CANNOT = "I cannot do that with the functions I have."
READ_ONLY = {"GorillaFileSystem": "pwd", "TradingBot": "get_current_time", "TwitterAPI": "posting_get_login_status",
             "MessageAPI": "message_get_login_status", "TicketAPI": "ticket_get_login_status",
             "TravelAPI": "travel_get_login_status", "VehicleControlAPI": "get_outside_temperature_from_weather_com",
             "MathAPI": "absolute_value"}


def mutate_value(v):
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1000
    if isinstance(v, float):
        return v + 1000.5
    if isinstance(v, str):
        return v + " zz"
    if isinstance(v, (list, tuple)):
        return list(v) + ["zz"]
    if isinstance(v, dict):
        return dict(v, zz=1)
    return "zz"


def call_text(name, kwargs):
    return "%s(%s)" % (name, ", ".join("%s=%r" % kv for kv in kwargs.items()))


def trajectories(row):
    """[(kind, turns, known)] of a row: turns = per turn a list of abstract steps: ("calls", [(name, kwargs)]),
    ("text", s), or ("mode", {"native": step, "prompt": step})."""
    gt = [[eh.mt_call_arguments(row, c) for c in turn] for turn in row.truth]
    rng = random.Random(zlib.crc32(row.id.encode()))
    spots = [(t, i) for t, turn in enumerate(gt) for i in range(len(turn))]

    def build(per_turn, split=False, extra=None):
        turns = []
        for t, calls in enumerate(per_turn):
            steps = list((extra or {}).get(t, []))
            if calls:
                steps += [("calls", [c]) for c in calls] if split else [("calls", list(calls))]
                steps.append(("text", DONE))
            else:
                steps.append(("text", CANNOT))
            turns.append(steps)
        return turns

    def edited(fn):
        new = [list(turn) for turn in gt]
        fn(new)
        return new

    out = [("truth", build(gt), None), ("truth_steps", build(gt, split=True), None)]
    with_args = [(t, i) for t, i in spots if gt[t][i][1]]
    if with_args:
        t, i = rng.choice(with_args)
        name, kwargs = gt[t][i]
        key = rng.choice(sorted(kwargs))
        out.append(("wrong_arg", build(edited(lambda n: n[t].__setitem__(i, (name, dict(
            kwargs, **{key: mutate_value(kwargs[key])}))))), None))
    if spots:
        multi = [(t, i) for t, i in spots if len(gt[t]) > 1]
        t, i = rng.choice(multi or spots)
        out.append(("missing_call", build(edited(lambda n: n[t].pop(i))), None))
        t, i = rng.choice(spots)
        out.append(("extra_call", build(edited(lambda n: n[t].insert(i + 1, gt[t][i]))), None))
        t, i = rng.choice(spots)
        to = t - 1 if t > 0 and (t + 1 >= len(gt) or rng.random() < 0.5) else t + 1
        if to < len(gt):
            out.append(("moved_call", build(edited(lambda n: (n[t].pop(i), n[to].append(gt[t][i])))), None))
        t = rng.choice(sorted({t for t, _ in spots}))
        out.append(("no_call_turn", build(edited(lambda n: n[t].clear())), None))
    for h, docs in sorted(row.held.items()):
        names = {d["name"] for d in docs}
        early = [c for c in gt[h] if c[0] in names]
        if early and h > 0:
            out.append(("held_early", build(edited(lambda n: (n[h - 1].extend(early), n[h].__setitem__(
                slice(None), [c for c in gt[h] if c[0] not in names])))), None))
            out.append(("held_early_kept", build(edited(lambda n: n[h - 1].extend(early))), None))
    out.append(("force_terminated", build(gt)[:-1], None))
    noise = {}
    for t, turn in enumerate(gt):
        first = turn[0] if turn else ("ls", {})
        native = [{"text": "", "tool_calls": [{"id": "call_x", "name": first[0], "arguments": ""}]},
                  {"text": "", "tool_calls": [{"id": "call_x", "name": first[0], "arguments": "[1]"}]},
                  {"text": "", "tool_calls": []}, {"text": "Let me check that first.", "tool_calls": []}][t % 4]
        prompt = ["```python\n[%s]\n```" % call_text(*first), "[]", "I will call %s now." % call_text(*first),
                  "Let me check that first."][t % 4]
        noise[t] = [("mode", {"native": ("raw", native), "prompt": ("text", prompt)})]
    out.append(("noise_steps", build(gt, extra=noise), None))
    t0 = next((t for t, turn in enumerate(gt) if turn), None)
    if t0 is not None:
        name, kwargs = gt[t0][0]
        key = next(iter(kwargs), None)
        edges = [("unknown name", ("calls", [("foo_unknown", {"x": 1})]), None),
                 ("forbidden name", ("calls", [("exit", {})]), None),
                 ("Class.method", ("calls", [("%s.%s" % (row.classes[0], name), kwargs)]), None),
                 ("builtin", ("calls", [("print", {"x": 1})]), "a builtin called (bfcl-eval's eval runs it)"),
                 ("module global", ("calls", [("json.dumps", {"obj": 1})]),
                  "a module global called (bfcl-eval's eval runs it)")]
        if key is not None:
            rest = ", ".join("%s=%r" % kv for kv in list(kwargs.items())[1:])
            tail = (", " + rest) if rest else ""
            inner = READ_ONLY[row.classes[0]]
            edges += [("positional / extra keyword", ("mode", {
                "prompt": ("text", "[%s(%r%s)]" % (name, kwargs[key], tail)),
                "native": ("calls", [(name, dict(kwargs, zz_extra=1))])}), None),
                ("empty dict / missing argument", ("mode", {
                    "prompt": ("text", "[%s(%s={}%s)]" % (name, key, tail)),
                    "native": ("calls", [(name, {})])}), None),
                ("nested unknown call", ("mode", {
                    "prompt": ("text", "[%s(%s={'nosuch': {'a': 1}}%s)]" % (name, key, tail)),
                    "native": ("calls", [(name, dict(kwargs, **{key: {"nosuch": {"a": 1}}}))])}), None),
                ("nested call", ("mode", {
                    "prompt": ("text", "[%s(%s={'%s': {}}%s)]" % (name, key, inner, tail)),
                    "native": ("calls", [(inner, {})])}), None)]
        label, step, known = edges[zlib.crc32(row.id.encode()) % len(edges)]
        out.append(("edge: " + label, build(gt, extra={t0: [step]}), known))
    return out


def first_exec_difference(theirs, ours):
    """None when both ran the same calls with the same results; ("order", ...) when they differ only in the order
    of edit_ticket's invalid fields; else (index, bfcl-eval's execution, evalharness's)."""
    reordered = False
    for i in range(max(len(theirs), len(ours))):
        a = theirs[i] if i < len(theirs) else None
        b = ours[i] if i < len(ours) else None
        if a == b:
            continue
        if a and b and a[:2] == b[:2] and len(a[2]) == len(b[2]) and all(
                x == y or same_fields(x, y) for x, y in zip(a[2], b[2])):
            reordered = True
            continue
        return (i, a, b)
    return ("order", None, None) if reordered else None


def same_fields(x, y):
    found = [re.search(r"Invalid fields for update: (.*)\"\}$", t) if isinstance(t, str) else None for t in (x, y)]
    return all(found) and sorted(found[0].group(1).split(", ")) == sorted(found[1].group(1).split(", "))


def render(turns, mode):
    """(evalharness's turns, bfcl-eval's result) of abstract turns in a tool mode."""
    ours, theirs = [], []
    for steps in turns:
        a, b = [], []
        for step in steps:
            if step[0] == "mode":
                step = step[1][mode]
            if step[0] == "text":
                a.append({"text": step[1], "tool_calls": []})
                b.append(step[1])
            elif step[0] == "raw":
                a.append(step[1])
                b.append([{c["name"]: c["arguments"]} for c in step[1]["tool_calls"]] if step[1]["tool_calls"]
                         or not step[1]["text"] else step[1]["text"])
            elif mode == "native":
                made = [{"id": "call_%d" % k, "name": n, "arguments": json.dumps(kw)} for k, (n, kw) in
                        enumerate(step[1])]
                a.append({"text": "", "tool_calls": made})
                b.append([{m["name"]: m["arguments"]} for m in made])
            else:
                text = "[%s]" % ", ".join(call_text(n, kw) for n, kw in step[1])
                a.append({"text": text, "tool_calls": []})
                b.append(text)
        ours.append(a)
        theirs.append(b)
    return ours, theirs


# =====================================================================================================================
# (c) The long-context blob
# =====================================================================================================================
def blob_check(wheel):
    """[(name, ok, note)] for every constant of long_context.py, and whether the name sets agree."""
    with zipfile.ZipFile(wheel) as z:
        src = z.read("bfcl_eval/eval_checker/multi_turn_eval/func_source_code/long_context.py").decode("utf-8")
    official = {}
    for node in ast.parse(src).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and node.value is not None:
            official[target.id] = ast.literal_eval(node.value)
    ours = json.loads(zlib.decompress(base64.b85decode(eh._MT_LONG_CONTEXT)).decode("utf-8"))
    if isinstance(ours.get("WATCH_LIST_EXTENSION"), list):
        ours["WATCH_LIST_EXTENSION"].append(...)
    out = [("(names)", set(ours) == set(official), "only in evalharness: %s; only in bfcl-eval: %s" % (
        sorted(set(ours) - set(official)), sorted(set(official) - set(ours))))]
    for name in sorted(official):
        if name not in ours:
            continue
        a, b = [], []
        canon(official[name], a.append)
        canon(ours[name], b.append)
        same = official[name] == ours[name] and "".join(a) == "".join(b)
        out.append((name, same, "%s of %d" % (type(official[name]).__name__, len(official[name]))
                    if hasattr(official[name], "__len__") else repr(official[name])[:60]))
    return out


# =====================================================================================================================
# main
# =====================================================================================================================
def load_rows(root):
    rows = {}
    for cat in CATEGORIES:
        name = "BFCL_v4_%s.json" % cat
        with open(os.path.join(root, name), encoding="utf-8") as f:
            raw = [json.loads(line) for line in f if line.strip()]
        with open(os.path.join(root, "possible_answer", name), encoding="utf-8") as f:
            truth = {a["id"]: a["ground_truth"] for a in (json.loads(line) for line in f if line.strip())}
        rows[cat] = (eh.MultiTurnDataset(os.path.join(root, name)).items, raw, truth)
    return rows


def part_backends(py, rows, args, tmp, totals):
    t0 = time.time()
    seqs = build_sequences([(r, truth[r["id"]]) for _, raw, truth in rows.values() for r in raw], args.fuzz,
                           args.seed)
    proc, dst = launch(py, "backends", seqs, tmp, "backends")
    ours = eh_sequences(seqs)
    ref = collect(proc, dst, "back-ends")
    per_class, per_method, diffs, known = compare_sequences(seqs, ref["results"], ours)
    ours_sig = signatures(eh._mt_backends())
    print("\n== (a) back-ends: %d sequences (%s), bfcl-eval on Python %s, mpmath %s; evalharness on Python %s" % (
        len(seqs), ", ".join("%s %d" % kv for kv in sorted(collections.Counter(
            s["tag"].split(":")[0] for s in seqs).items())), ref["python"], ref["mpmath"],
        sys.version.split()[0]))
    print("%-18s %8s %8s %8s %6s   %s" % ("class", "compared", "equal", "differ", "known", "signatures"))
    for cls in MODULES:
        n, eq, bad, kn = per_class[cls]
        sig_bad = [m for m, _ in ref["signatures"][cls] if dict(ref["signatures"][cls]).get(m) !=
                   dict(ours_sig[cls]).get(m)] + [m for m, _ in ours_sig[cls] if m not in dict(ref["signatures"][cls])]
        print("%-18s %8d %8d %8d %6d   %d methods, %s" % (cls, n, eq, bad, kn, len(ref["signatures"][cls]),
                                                        "equal" if not sig_bad else "DIFFER: %s" % sig_bad))
        totals["passed"] += eq + len(ref["signatures"][cls]) - len(sig_bad)
        totals["failed"] += bad + len(sig_bad)
        totals["known"] += kn
    if ref["python"].rsplit(".", 1)[0] != sys.version.split()[0].rsplit(".", 1)[0]:
        print("WARNING: bfcl-eval ran on Python %s, evalharness on %s: exception texts may differ by version" % (
            ref["python"], sys.version.split()[0]))
    print("per-method calls: valid/invalid (valid: answered without an exception or an error, or a method without "
          "arguments answered; invalid: the rest)")
    uncovered = []
    for cls in MODULES:
        names = [m for m, _ in ref["signatures"][cls]]
        cells = []
        for m in names:
            n, ok, err = per_method[(cls, m)]
            cells.append("%s %d/%d" % (m, ok, err))
            if not ok or not err:
                uncovered.append("%s.%s (%s)" % (cls, m, "never called" if not n else "no valid outcome" if not ok
                                                 else "no invalid outcome"))
        wrapped("  %s: " % cls, cells)
    wrapped("methods not covered both ways: ", uncovered or ["none"])
    for why, found in sorted(known.items()):
        print("KNOWN (a) %d call(s): %s; e.g." % (len(found), why))
        for seq, i, a, b in found[:3]:
            call = seq["calls"][i - 1]
            print("   %s(*%r, **%r): bfcl-eval %s / evalharness %s" % (call[1], call[2], call[3], show_step(a)[:150],
                                                                      show_step(b)[:150]))
    for seq, i, what, a, b, attrs in diffs[:args.show]:
        call = ([None] + list(seq["calls"]))[i] if i <= len(seq["calls"]) else None
        print("DIFF (a) seq %d %s %s lc=%s step %d %s [%s%s]\n   bfcl-eval  : %s\n   evalharness: %s" % (
            seq["id"], seq["cls"], seq["tag"], seq["lc"], i, "load" if call is None else "%s(*%r, **%r) on #%d" % (
                call[1], call[2], call[3], call[0]), what, (": " + ", ".join(attrs)) if attrs else "",
            show_step(a) if isinstance(a, tuple) else a, show_step(b) if isinstance(b, tuple) else b))
    if len(diffs) > args.show:
        print("... %d more differences in (a)" % (len(diffs) - args.show))
    if diffs:
        groups = collections.Counter((d[0]["cls"], ([None] + list(d[0]["calls"]))[d[1]][1] if d[1] else "load", d[2])
                                     for d in diffs if d[1] <= len(d[0]["calls"]))
        print("(a) differences by class, method and what differs:")
        for k, n in groups.most_common(40):
            print("   %6d  %s.%s [%s]" % ((n,) + k))
        if len(groups) > 40:
            print("   ... %d more groups" % (len(groups) - 40))
    print("(a) took %.0fs" % (time.time() - t0))
    return seqs, ref["results"]


def part_verdicts(py, rows, args, tmp, totals):
    t0 = time.time()
    cases, payload_rows, payload_truth = [], {}, {}
    for cat, (items, raw, truth) in rows.items():
        raw_by_id = {r["id"]: r for r in raw}
        for row in items:
            payload_rows[row.id] = raw_by_id[row.id]
            payload_truth[row.id] = truth[row.id]
            for kind, turns, known in trajectories(row):
                for mode in ("native", "prompt"):
                    ours, theirs = render(turns, mode)
                    cases.append({"id": row.id, "row": row, "category": cat, "mode": mode, "kind": kind,
                                  "ours": ours, "result": theirs, "known": known,
                                  "model": "bench%d" % len(cases)})
    payload = {"rows": payload_rows, "truth": payload_truth,
               "cases": [{k: c[k] for k in ("id", "mode", "result", "model")} for c in cases]}
    proc, dst = launch(py, "verdicts", payload, tmp, "verdicts")
    execute, log = eh._MTWorld.execute, []

    def recording(world, role, calls):  # every execution mt_verdict makes: role, call strings, result texts
        results = execute(world, role, calls)
        log.append((role, list(calls), [squeeze(r) for r in results]))
        return results
    ours = []
    eh._MTWorld.execute = recording
    try:
        for c in cases:
            del log[:]
            try:
                v = eh.mt_verdict(c["row"], c["ours"], c["mode"], label=c["model"])
            except Exception as exc:  # evalharness's own crash on the case (a difference)
                v = {"valid": None, "error_type": "crash: %s: %s" % (type(exc).__name__, exc), "why": ""}
            v["exec"] = list(log)
            ours.append(v)
    finally:
        eh._MTWorld.execute = execute
    ref = collect(proc, dst, "verdicts")["results"]
    table = collections.defaultdict(lambda: [0, 0, 0, 0, 0])  # cases, same verdict, same error type, same runs, known
    diffs, known, order = [], collections.defaultdict(lambda: [0, 0]), 0
    for c, v, r in zip(cases, ours, ref):
        cell = table[(c["kind"].split(":")[0], c["category"], c["mode"])]
        same_v = v["valid"] == r["valid"]
        same_e = same_v and (v["error_type"] or None) == (r["error_type"] or None)
        first = first_exec_difference(r["exec"], v["exec"])
        if first is not None and first[0] == "order":
            order += 1
            first = None
        if c["known"]:
            cell[4] += 1
            known[c["known"]][0] += 1
            known[c["known"]][1] += same_e
            continue
        cell[0] += 1
        cell[1] += same_v
        cell[2] += same_e
        cell[3] += first is None
        if same_e and first is None:
            totals["passed"] += 1
        else:
            totals["failed"] += 1
            diffs.append((c, v, r, first))
    totals["known"] += sum(n for n, _ in known.values())
    print("\n== (b) verdicts: %d cases (%d rows), bfcl-eval's _evaluate_single_multi_turn_entry vs eh.mt_verdict" % (
        len(cases), len(payload_rows)))
    combos = [(cat, mode) for cat in CATEGORIES for mode in ("native", "prompt")]
    print("cells: cases/equal verdicts/equal error types/equal executions (every decoded call and result text of "
          "both roles; known divergences apart)")
    for half in (combos[:4], combos[4:]):
        print("%-16s" % "kind" + "".join("%22s" % ("%s %s" % (cat.replace("multi_turn_", ""), mode))
                                         for cat, mode in half))
        for kind in sorted({k for k, _, _ in table}) + ["total"]:
            cells = [table.get((kind, cat, mode), [0] * 5)[:4] if kind != "total" else [
                sum(v[j] for (k, c, m), v in table.items() if (c, m) == (cat, mode)) for j in range(4)]
                for cat, mode in half]
            print("%-16s" % kind + "".join("%22s" % ("%d/%d/%d/%d" % tuple(x) if x[0] else "-") for x in cells))
    by_cat = collections.defaultdict(lambda: [0, 0, 0, 0])
    for (kind, cat, mode), cell in table.items():
        for key in ((kind, "all"), ("all", "all")):
            by_cat[key] = [x + y for x, y in zip(by_cat[key], cell[:4])]
    wrapped("all categories and modes: ", ["%s %d/%d/%d/%d" % ((kind,) + tuple(by_cat[(kind, "all")]))
                                            for kind in sorted({k for k, _, _ in table}) + ["all"]])
    print("edit_ticket's invalid-field lists in another order (compared as sets): %d case(s)" % order)
    valid = collections.Counter((c["kind"].split(":")[0], r["valid"]) for c, r in zip(cases, ref))
    wrapped("bfcl-eval's verdicts by kind (valid/invalid): ", [
        "%s %d/%d" % (k, valid[(k, True)], valid[(k, False)]) for k in sorted({k for k, _ in valid})])
    for why, (n, same) in sorted(known.items()):
        print("KNOWN (b) %d case(s), %d with the same verdict and error type: %s" % (n, same, why))
    for c, v, r, first in diffs[:args.show]:
        print("DIFF (b) %s %s %s: evalharness %s %s (%s) / bfcl-eval %s %s (%s %s)" % (
            c["id"], c["mode"], c["kind"], v["valid"], v["error_type"], v["why"][:200], r["valid"], r["error_type"],
            r["message"][:200], r["detail"][:300]))
        if first is not None:
            print("   first differing execution #%d: bfcl-eval %s\n%s evalharness %s" % (
                first[0], repr(first[1])[:400], " " * 35, repr(first[2])[:400]))
    if len(diffs) > args.show:
        print("... %d more differences in (b)" % (len(diffs) - args.show))
    if diffs:
        groups = collections.Counter()
        for c, v, r, first in diffs:
            what = "verdict" if v["valid"] != r["valid"] else "error type" if (v["error_type"] or None) != (
                r["error_type"] or None) else "execution only"
            where = "-"
            if first is not None:
                a, b = first[1], first[2]
                if a and b and a[1] == b[1]:
                    where = "results of " + ", ".join(sorted({call.split("(")[0] for call, x, y in zip(
                        a[1], a[2], b[2]) if x != y}))
                else:
                    where = "calls of %s role" % (a or b)[0]
            groups[(c["kind"].split(":")[0], what, where)] += 1
        print("(b) differences by kind, what differs and the first differing execution:")
        for k, n in groups.most_common(40):
            print("   %6d  %s: %s, %s" % ((n,) + k))
        if len(groups) > 40:
            print("   ... %d more groups" % (len(groups) - 40))
    print("(b) took %.0fs" % (time.time() - t0))
    return cases, payload, ref


def fresh_checks(py, n, seqs, seq_results, vcases, vpayload, vresults, tmp, totals):
    """Some sequences and cases again, each in a process of its own: the batch's resets must leave nothing."""
    if n <= 0:
        return
    t0 = time.time()
    bad = checked = 0
    if seqs:
        pick_seqs = [s for s in seqs if s["lc"] or s["cls"] in ("TwitterAPI", "MathAPI", "TravelAPI")]
        step = max(1, len(pick_seqs) // n)
        for s in pick_seqs[::step][:n]:
            proc, dst = launch(py, "backends", [s], tmp, "fresh")
            got = collect(proc, dst, "fresh back-end sequence")["results"][0]
            checked += 1
            if got != seq_results[s["id"]]:
                bad += 1
                print("FRESH (a) seq %d (%s %s) differs when run in a process of its own" % (s["id"], s["cls"],
                                                                                           s["tag"]))
    if vcases:
        idx = [i for i, c in enumerate(vcases) if c["row"].long_context or {"TwitterAPI", "MathAPI", "TravelAPI"} &
               set(c["row"].classes)]
        step = max(1, len(idx) // n)
        for i in idx[::step][:n]:
            case = vpayload["cases"][i]
            one = {"rows": {case["id"]: vpayload["rows"][case["id"]]}, "truth": {case["id"]: vpayload["truth"][
                case["id"]]}, "cases": [case]}
            proc, dst = launch(py, "verdicts", one, tmp, "fresh")
            got = collect(proc, dst, "fresh verdict case")["results"][0]
            checked += 1
            if got != vresults[i]:
                bad += 1
                print("FRESH (b) case %s %s %s differs when run in a process of its own: %s / %s" % (
                    case["id"], case["mode"], vcases[i]["kind"], got, vresults[i]))
    print("\nfresh-process checks: %d run each in a process of its own, %d differ from the batch (%.0fs)" % (
        checked, bad, time.time() - t0))
    totals["passed"] += checked - bad
    totals["failed"] += bad


def main():
    global eh
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv-dir", default=None, help="keep the reference virtualenv here (reused when present)")
    ap.add_argument("--wheel", default=None, help="a local bfcl-eval wheel (default: %s from PyPI)" % VERSION)
    ap.add_argument("--fuzz", type=int, default=4, help="random sequences per initial config and long_context "
                    "setting (default 4)")
    ap.add_argument("--seed", type=int, default=20260323)
    ap.add_argument("--fresh", type=int, default=20, help="sequences and cases run again, each in a fresh process "
                    "(default 20 of each)")
    ap.add_argument("--show", type=int, default=50, help="differences printed in full per part (default 50; all are "
                    "counted and grouped)")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--backends", action="store_true", help="only part (a)")
    only.add_argument("--verdicts", action="store_true", help="only part (b)")
    only.add_argument("--blob", action="store_true", help="only part (c)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(*args.child)
        return 0
    if os.environ.get("PYTHONHASHSEED") != "0" or os.environ.get("TZ") != "UTC":
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:], child_env())
    sys.path.insert(0, ROOT)
    import evalharness
    eh = evalharness
    eh._MT_TODAY = datetime.datetime(*TODAY)
    t0 = time.time()
    totals = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="evalharness-bfcl-mt-") as tmp:
        wheel = args.wheel
        if wheel is None:
            cmd = [sys.executable, "-m", "pip", "download", "bfcl-eval==%s" % VERSION, "--no-deps", "-q", "-d", tmp,
                   "--only-binary=:all:"]
            done = subprocess.run(cmd, capture_output=True, universal_newlines=True)
            if done.returncode:
                sys.exit("%s failed:\n%s" % (" ".join(cmd), (done.stdout + done.stderr)[-3000:]))
            wheel = glob.glob(os.path.join(tmp, "bfcl_eval-*.whl"))[0]
        print("bfcl-eval %s (%s) vs evalharness (%s)" % (VERSION, os.path.basename(wheel),
                                                         os.path.join(ROOT, "evalharness.py")))
        if not args.blob:
            py = venv_python(args.venv_dir or os.path.join(tmp, "venv"), wheel)
            with zipfile.ZipFile(wheel) as z:
                for name in z.namelist():
                    if name.startswith("bfcl_eval/data/") and name.endswith(".json") and "/unused" not in name:
                        z.extract(name, tmp)
            rows = load_rows(os.path.join(tmp, "bfcl_eval", "data"))
            seqs = seq_results = vcases = vpayload = vresults = None
            if not args.verdicts:
                seqs, seq_results = part_backends(py, rows, args, tmp, totals)
            if not args.backends:
                vcases, vpayload, vresults = part_verdicts(py, rows, args, tmp, totals)
            fresh_checks(py, args.fresh, seqs, seq_results, vcases, vpayload, vresults, tmp, totals)
        if not args.backends and not args.verdicts:
            checks = blob_check(wheel)
            bad = [(n, note) for n, ok, note in checks if not ok]
            print("\n== (c) blob: eh._MT_LONG_CONTEXT vs the wheel's long_context.py: %d constants; %s" % (
                len(checks) - 1, "PASS" if not bad else "FAIL"))
            for n, ok, note in checks:
                print("  %-30s %s  %s" % (n, "equal" if ok else "DIFFERS", note))
            totals["passed"] += len(checks) - len(bad)
            totals["failed"] += len(bad)
    print("\nknown divergences (not counted): %d; wall time %.0fs" % (totals["known"], time.time() - t0))
    print("%d passed, %d failed" % (totals["passed"], totals["failed"]))
    return 1 if totals["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
