#!/usr/bin/env python3
"""Agreement of evalharness's `math` scorer with a widely used math-answer checker (Hugging Face's math-verify).

Run by hand, never by CI: it makes a throwaway virtualenv in a temporary directory, pip-installs math-verify there
(from the PyPI mirror), and asks it the same (reference, response) questions evalharness answers:

  1. tests/data/math_pairs.json: our table (each pair labelled match / no match by hand);
  2. DOCUMENTED below: cases in the style of math-verify's own public test suite (gold, prediction, its expected
     verdict), the ones that need no computer algebra (numbers, separators, fractions, roots, degrees, percent,
     units, intervals, tuples, boxed and $…$ extraction).

It prints, for each set, how often evalharness agrees with the labels, how often math-verify does, and how often
the two agree with each other, with the disagreements listed. Usage: python3 bench/math_agreement.py [--keep DIR]
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import evalharness as eh  # noqa: E402

# (gold, prediction, expected) as math-verify's test suite states them for cases with no algebra
DOCUMENTED = [
    ("-5", "-5", 1), ("7425000", "7,425,000", 1), ("1000", "1000.0", 1), ("1000.0", "1,000.0", 1),
    ("0.4", ".4", 1), ("1000.99", "1,000.99", 1), ("1000.99", "$1,000.99", 1), ("2", "AZYUK2A", 0),
    ("10/9", "\\frac{10}{9}", 1), ("-10/9", "-\\frac{10}{9}", 1), ("$[0,1)$", "$[0,1)$", 1),
    ("$[0,9)$", "$[0,1)$", 0), ("$(0,9)$", "$[0,9)$", 0), ("$9$", "Answer \\[ 9 \\]", 1), ("$9$", "Answer $ 9 $", 1),
    ("$9$", "Answer \\( 9 \\)", 1), ("$1/3$", "$\\frac13 $", 1), ("$1$", "$\\frac3{3} $", 1),
    ("$\\sqrt{3}$", "$\\sqrt3 $", 1), ("$1/3$", "$\\dfrac{1}{3} $", 1), ("$1/3$", "$\\tfrac{1}{3} $", 1),
    ("$1/3$", "$ 1/3 $", 1), ("$1/3$", "$\\left( \\frac{1}{3} \\right)$", 1), ("$1/3$", "$\\boxed{\\frac{1}{3}}$", 1),
    ("$1/3$", "$\\frac{1}{3} \\text{meters}$", 1), ("$1/3$", "$k = \\frac{1}{3}$", 1), ("$28\\%$", "28 %", 1),
    ("$\\frac{14}{3}$", "$=2+\\frac{5}{3}+1=\\boxed{\\frac{14}{3}}$", 1),
    ("$90^\\circ$", "Hence, the angle between the lines is $\\boxed{90^\\circ}.$", 1),
    ("$3\\sqrt{13}$", "$\\sqrt{117} = \\boxed{3\\sqrt{13}}$", 1), ("$2$", "there are $\\boxed{2}$ values", 1),
    ("$15\\mbox{ cm}^2$", "$\\frac{1}{2}\\times 3 \\times 10 = \\boxed{15\\mbox{ cm}^2}.$", 1),
    ("$-2,1$", "the only integer roots are $\\boxed{-2,1}.$", 1),
    ("$\\text{Evelyn}$", "Therefore, $\\boxed{\\text{Evelyn}}$ is our answer.", 1),
    ("$(3, \\frac{\\pi}{2})$", "the polar coordinates are $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$", 1),
]

PEER = r"""
import json, sys
from math_verify import parse, verify
out = []
for gold, pred in json.load(sys.stdin):
    try:
        g = gold if "$" in gold or "\\boxed" in gold else "$" + gold + "$"
        out.append(bool(verify(parse(g), parse(pred))))
    except Exception as exc:  # the peer's own failure counts as "no match"
        out.append(False)
print(json.dumps(out))
"""


def ours(gold: str, pred: str) -> bool:
    item = eh.QAItem(id="x", messages=(), answer=gold.strip("$"), scorer="math")
    return eh.score_response(item, pred)[0] == 1.0


def main(argv):
    keep = argv[argv.index("--keep") + 1] if "--keep" in argv else None
    with open(os.path.join(ROOT, "tests", "data", "math_pairs.json"), encoding="utf-8") as fh:
        table = [(p["reference"], p["response"], int(p["match"])) for p in json.load(fh)]
    venv = keep or tempfile.mkdtemp(prefix="evalharness-math-peer-")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "math-verify"], check=True)
    version = subprocess.run([py, "-c", "import importlib.metadata as m; print(m.version('math-verify'))"],
                             stdout=subprocess.PIPE, universal_newlines=True).stdout.strip()
    print("math-verify %s in %s" % (version, venv))
    for name, cases in (("tests/data/math_pairs.json", table), ("math-verify's documented cases", DOCUMENTED)):
        peer = json.loads(subprocess.run([py, "-c", PEER], input=json.dumps([(g, p) for g, p, _ in cases]),
                                         stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout)
        mine = [ours(g, p) for g, p, _ in cases]
        labels = [bool(e) for _, _, e in cases]
        n = len(cases)
        print("\n%s: %d cases (%d expected matches)" % (name, n, sum(labels)))
        print("  evalharness agrees with the labels: %d/%d" % (sum(a == b for a, b in zip(mine, labels)), n))
        print("  math-verify agrees with the labels: %d/%d" % (sum(a == b for a, b in zip(peer, labels)), n))
        print("  evalharness agrees with math-verify: %d/%d" % (sum(a == b for a, b in zip(mine, peer)), n))
        for (g, p, e), a, b in zip(cases, mine, peer):
            if a != b or a != bool(e):
                print("    label %d  evalharness %d  math-verify %d  gold %r  pred %r" % (e, a, b, g, p[:70]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
