#!/usr/bin/env python3
"""evalharness's BFCL verdicts against bfcl-eval's own checker (issue 37; run by hand, never by CI).

Builds a throwaway virtualenv (`--venv-dir DIR` keeps and reuses it) with the PyPI wheel of bfcl-eval (default
2026.3.23) installed --no-deps, plus only what its checker's import chain needs (tenacity, filelock, python-dotenv,
tree_sitter 0.21.3 with its Java and JavaScript grammars, pydantic, tqdm, requests, numpy 1.26.4, pandas,
tabulate, typer, overrides) — not the provider SDKs, torch or faiss. The one module that imports every provider's
SDK, bfcl_eval.constants.model_config, is replaced in the child process by a stand-in whose only entry says what
the checker asks of it: underscore_to_dot, True for native tool calls ("-FC" models), False for prompt mode. The
verdicts come from bfcl-eval's own runner functions (eval_runner._evaluate_single_ast_entry and
_evaluate_single_relevance_entry: decoding, format checks, ast_checker), with a handler whose decode_ast is the
OpenAI handler's (json.loads of each call's arguments for native calls; default_decode_ast_prompting for text).

Cases: every row of every category evalharness supports, from the files shipped inside the wheel (read from a
temporary copy; nothing is kept), each with model outputs made from its possible answer: the right calls (each
parameter's first allowed value), the second allowed value, optional parameters left out, and mutations: a wrong
value, a missing required parameter, an extra parameter, a swapped function, a wrong type, an int for a float,
the calls in another order, no call; relevance rows: a call and no call. Both tool modes. Prints the agreement
per category and mode on right/wrong (and on the error type), and every disagreement.

Usage: python3 bench/bfcl_parity.py [--venv-dir DIR] [--wheel PATH] [--limit N] [--show 20]
"""
import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import evalharness as eh  # noqa: E402

VERSION = "2026.3.23"
DEPS = ["tenacity", "filelock==3.20.0", "python-dotenv", "tree_sitter==0.21.3", "tree-sitter-java==0.21.0",
        "tree-sitter-javascript==0.21.4", "pydantic", "tqdm", "requests", "numpy==1.26.4", "pandas", "tabulate",
        "typer", "overrides"]

CHILD = r'''
import json, sys, types
stub = types.ModuleType("bfcl_eval.constants.model_config")
class _Config:
    def __init__(self, fc):
        self.underscore_to_dot = fc
class _Mapping(dict):
    def __missing__(self, key):
        return _Config(key.endswith("-FC"))
stub.MODEL_CONFIG_MAPPING = _Mapping()
sys.modules["bfcl_eval.constants.model_config"] = stub
from bfcl_eval.constants.enums import Language, ReturnFormat
from bfcl_eval.eval_checker import eval_runner
from bfcl_eval.model_handler.utils import default_decode_ast_prompting

class Handler:  # decode_ast as bfcl_eval's OpenAI completions handler does it
    def __init__(self, fc):
        self.is_fc_model = fc
    def decode_ast(self, result, language, has_tool_call_tag):
        if self.is_fc_model:
            out = []
            for invoked in result:
                name = list(invoked.keys())[0]
                out.append({name: json.loads(invoked[name])})
            return out
        return default_decode_ast_prompting(result, language, has_tool_call_tag)

handlers = {True: Handler(True), False: Handler(False)}
for line in sys.stdin:
    c = json.loads(line)
    fc = c["mode"] == "native"
    model = "bench-FC" if fc else "bench-prompt"
    try:
        if "relevance" in c["category"]:
            r = eval_runner._evaluate_single_relevance_entry(handlers[fc], c["id"], c["raw"], c["prompt"], model,
                                                              c["category"])
        else:
            r = eval_runner._evaluate_single_ast_entry(handlers[fc], c["id"], c["raw"], c["answer"], c["prompt"],
                                                       model, c["category"], language=Language.PYTHON,
                                                       return_format=ReturnFormat.PYTHON, has_tool_call_tag=False)
        out = {"valid": r["valid"], "error_type": r.get("error_type")}
    except Exception as exc:  # bfcl-eval's own crash on the case
        out = {"valid": None, "error_type": "crash: %s: %s" % (type(exc).__name__, exc)}
    sys.stdout.write(json.dumps(out) + "\n")
'''


def venv(path):
    py = os.path.join(path, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", path], check=True)
    return py


def install(py, wheel):
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", wheel], check=True)
    subprocess.run([py, "-m", "pip", "install", "-q"] + DEPS, check=True)


def mutate_value(v):
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1000
    if isinstance(v, float):
        return v + 1000.5
    if isinstance(v, str):
        return v + " zz"
    if isinstance(v, list):
        return v + ["zz"]
    return None


def outputs(row):
    """(label, calls) made from the row's possible answer: [(name, {param: value})] lists, or None for no call."""
    if row.expected is None:
        f = row.functions[0] if row.functions else {"name": "lookup", "parameters": {"required": ["query"]}}
        return [("call", [(f["name"], {p: "x" for p in f["parameters"].get("required") or ()})]), ("no_call", None)]
    right = [(name, eh._realize(params)) for call in row.expected for name, params in call.items()]
    out = [("right", right), ("no_call", None)]
    desc = {f["name"]: f for f in row.functions}
    name0, params0 = right[0]
    first = next(iter(params0), None)
    if first is not None:
        wrong = mutate_value(params0[first])
        if wrong is not None:
            out.append(("wrong_value", [(name0, dict(params0, **{first: wrong}))] + right[1:]))
        typed = str(params0[first]) if not isinstance(params0[first], str) else 12345
        out.append(("wrong_type", [(name0, dict(params0, **{first: typed}))] + right[1:]))
    required = [p for p in (desc.get(name0, {}).get("parameters", {}).get("required") or ()) if p in params0]
    if required:
        out.append(("missing_required", [(name0, {k: v for k, v in params0.items() if k != required[0]})]
                    + right[1:]))
    out.append(("extra_param", [(name0, dict(params0, zz_extra=1))] + right[1:]))
    others = [f["name"] for f in row.functions if f["name"] != name0]
    out.append(("swapped_function", [(others[0] if others else name0 + "_x", params0)] + right[1:]))
    props = desc.get(name0, {}).get("parameters", {}).get("properties", {})
    floats = [p for p, v in params0.items() if (props.get(p) or {}).get("type") == "float" and isinstance(v, float)
              and v == int(v)]
    if floats:
        out.append(("int_for_float", [(name0, dict(params0, **{floats[0]: int(params0[floats[0]])}))] + right[1:]))
    if len(right) > 1:
        out.append(("other_order", list(reversed(right))))
    second = []
    for call in row.expected:
        for name, params in call.items():
            alt = {}
            for p, allowed in params.items():
                vals = [a for a in allowed if a != ""]
                if vals:
                    alt[p] = eh._realize(vals[1] if len(vals) > 1 else vals[0])
            second.append((name, alt))
    if second != right:
        out.append(("second_value", second))
    optional_out = [(name, {p: v for p, v in eh._realize(params).items() if "" not in params.get(p, [])})
                    for call in row.expected for name, params in call.items()]
    if optional_out != right:
        out.append(("optional_left_out", optional_out))
    return out


def text_forms(text):
    """Prompt-mode replies of other shapes, for BFCL's decoder: in a code fence, without the brackets, after a
    sentence, integers written as sums, a call as a value, names quoted."""
    forms = [("fenced", "```python\n%s\n```" % text), ("bare", text[1:-1]), ("sentence", "Sure: " + text),
             ("quoted", "'%s'" % text)]
    summed = re.sub(r"=(\d+)([,)])", lambda m: "=%d + %d%s" % (int(m.group(1)) - 1, 1, m.group(2))
                    if int(m.group(1)) > 0 else m.group(0), text)
    if summed != text:
        forms.append(("summed", summed))
    negated = re.sub(r"=(\d+)([,)])", r"=-\1\2", text)
    if negated != text:
        forms.append(("negated", negated))
    called = re.sub(r"=('[^']*')([,)])", r"=str(\1)\2", text, count=1)
    if called != text:
        forms.append(("called", called))
    return forms


def as_made(calls, mode):
    """(evalharness's record of the reply, bfcl-eval's model result) for calls in a mode."""
    if mode == "native":
        if not calls:
            return {"text": "I cannot help with that.", "tool_calls": []}, "I cannot help with that."
        made = [{"name": n.replace(".", "_"), "arguments": json.dumps(p)} for n, p in calls]
        return {"text": "", "tool_calls": made}, [{m["name"]: m["arguments"]} for m in made]
    text = "I cannot help with that." if not calls else "[%s]" % ", ".join(
        "%s(%s)" % (n, ", ".join("%s=%r" % kv for kv in p.items())) for n, p in calls)
    return {"text": text}, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv-dir", default=None)
    ap.add_argument("--wheel", default=None)
    ap.add_argument("--limit", type=int, default=None, help="rows per category (default: all)")
    ap.add_argument("--show", type=int, default=20, help="disagreements printed (default 20)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="evalharness-bfcl-") as tmp:
        wheel = args.wheel
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "bfcl-eval==%s" % VERSION, "--no-deps", "-q",
                            "-d", tmp, "--python-version", "3.12", "--only-binary=:all:"], check=True)
            wheel = glob.glob(os.path.join(tmp, "bfcl_eval-*.whl"))[0]
        vdir = args.venv_dir or os.path.join(tmp, "venv")
        py = venv(vdir)
        if subprocess.run([py, "-c", "import bfcl_eval, tenacity, overrides"], capture_output=True).returncode:
            install(py, wheel)
        data = os.path.join(tmp, "data")
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith("bfcl_eval/data/") and name.endswith(".json") and "/unused" not in name:
                    z.extract(name, data)
        root = os.path.join(data, "bfcl_eval", "data")
        cases, ours = [], []
        for cat in eh.BFCL_CATEGORIES:
            path = os.path.join(root, "BFCL_v4_%s.json" % cat)
            ds = eh.ToolDataset(path, limit=args.limit)
            raw_rows = {r["id"]: r for _, r in eh._bfcl_rows(path)}
            truth = {r["id"]: r["ground_truth"] for _, r in eh._bfcl_rows(ds.answers_path)} if ds.answers_path \
                else {}
            for row in ds.items:
                made_all = []
                for label, calls in outputs(row):
                    for mode in ("native", "prompt"):
                        made_all.append((label, mode) + as_made(calls, mode))
                        if mode == "prompt" and label in ("right", "call") and calls:
                            text = made_all[-1][3]
                            for form, shaped in text_forms(text):
                                made_all.append(("%s_%s" % (label, form), mode, {"text": shaped}, shaped))
                for label, mode, made, result in made_all:
                    v = eh.bfcl_verdict(row, made, mode)
                    ours.append((cat, mode, label, row.id, v, made))
                    cases.append({"id": row.id, "category": cat, "mode": mode, "raw": result,
                                  "prompt": raw_rows[row.id], "answer": truth.get(row.id)})
        child = subprocess.run([py, "-c", CHILD], input="".join(json.dumps(c) + "\n" for c in cases),
                               capture_output=True, universal_newlines=True)
        if child.returncode != 0:
            sys.exit("bfcl-eval's side failed:\n" + child.stderr[-3000:])
        theirs = [json.loads(line) for line in child.stdout.splitlines()]
        assert len(theirs) == len(ours)
        table = collections.defaultdict(lambda: [0, 0, 0, 0])  # cases, same verdict, same error type, wrong-ok
        labels = collections.Counter()
        shown = 0
        for (cat, mode, label, rid, v, made), t in zip(ours, theirs):
            entry = table[(cat, mode)]
            entry[0] += 1
            same = v["valid"] == t["valid"]
            entry[1] += same
            entry[2] += same and (v["valid"] or v["error_type"] == t["error_type"])
            entry[3] += not v["valid"]
            labels[(label, v["valid"])] += 1
            if not same and shown < args.show:
                shown += 1
                print("DISAGREE %s %s %s %s: evalharness %s (%s: %s) / bfcl-eval %s (%s)\n   made %s" % (
                    cat, mode, label, rid, v["valid"], v["error_type"], v["why"][:200], t["valid"], t["error_type"],
                    json.dumps(made)[:300]))
        print("\nbfcl-eval %s vs evalharness: per category and tool mode" % VERSION)
        print("%-24s %-7s %7s %9s %10s %7s" % ("category", "mode", "cases", "verdicts", "err types", "wrong"))
        total = [0, 0, 0]
        for (cat, mode), (n, same, same_type, wrong) in sorted(table.items()):
            print("%-24s %-7s %7d %8.2f%% %9.2f%% %7d" % (cat, mode, n, 100.0 * same / n, 100.0 * same_type / n,
                                                          wrong))
            total[0] += n
            total[1] += same
            total[2] += same_type
        print("all: %d cases, verdicts equal on %d (%.3f%%), error types too on %d" % (
            total[0], total[1], 100.0 * total[1] / total[0], total[2]))
        print("outputs by kind (evalharness's verdict): " + ", ".join(
            "%s %s %d" % (label, "right" if ok else "wrong", n) for (label, ok), n in sorted(labels.items())))


if __name__ == "__main__":
    main()
