#!/usr/bin/env python3
"""Regenerates the data blobs of evalharness's section "Instruction data" from their sources (run by hand, never by CI).

    python3 bench/ifeval_blobs.py --nltk-data-repo DIR [--venv DIR] [--evalharness PATH] [--write]

For each constant it prints one line: the name, "equal" or "differs", the sizes of the embedded and the regenerated
value, and for a differing blob whether the decoded payload (after base85 and zlib) is equal, so that a different
zlib is told apart from different data; then whether the source lines would come out the same ("layout"). Exit 1
when a constant differs (0 with --write, which rewrites the differing constants in place in --evalharness: only the
string lines between `NAME = (` and its closing `)`, nothing else of the file).

Sources, each fetched or taken as said here (nothing is downloaded from nltk's servers):
  _PUNKT_EN      nltk's English Punkt parameters: `tokenizers/punkt/PY3/english.pickle` of nltk_data's `punkt`
                 package, as the PyPI wheel llama-index-core==0.10.50 ships it unchanged under
                 llama_index/core/_static/nltk_cache/tokenizers/punkt/ (fetched with `pip download --no-deps`
                 into VENV/wheels, or --punkt-wheel PATH). Read here with the standard library's pickle (nltk's
                 classes replaced by stand-ins, nltk is not imported), reduced to what the decisions need.
  _LD_BLOB       langdetect 1.0.9 from PyPI, installed in the venv: its `profiles/` (55 JSON profiles, read in the
                 os.listdir order of that folder, which is stored in the blob: langdetect loads them in that order
                 and it decides exact ties) and `utils/messages.properties`; pruned to --ld-budget n-grams (12000)
                 and quantized at --ld-scale steps per octave (3), the values that are embedded. The listing order
                 is the filesystem's (ext4 lists a folder in hash order, seeded per filesystem; tmpfs newest
                 first): elsewhere the blob can differ in that order alone, which the script then checks and says;
                 --ld-order embedded takes the order stored in the embedded blob instead.
  _IB_TAGGER     nltk 3.9.2's averaged perceptron tagger (`taggers/averaged_perceptron_tagger_eng`), the part that
                 tags token 0 of a sentence, exact (all weights, no quantization). nltk 3.9 reads it as JSON, which
                 only nltk's servers offer (not used here): it is made from the pickle
                 `averaged_perceptron_tagger/averaged_perceptron_tagger.pickle` in
                 `packages/taggers/averaged_perceptron_tagger.zip` of the nltk/nltk_data GitHub
                 repository (--nltk-data-repo), loaded into nltk 3.9.2's PerceptronTagger and written with its own
                 save_to_json(lang="eng") (an assumption: that nltk's published _eng package is this conversion).
  _IB_STOPWORDS  nltk.corpus.stopwords.words("english") without the words holding an apostrophe, from
                 `packages/corpora/stopwords.zip` of the same repository (unzipped to corpora/stopwords/).
  _IB_SYLLABLES  syllapy 0.7.2 from PyPI: its dictionary minus the entries its own rules reproduce.
  _IB_EMOJI      emoji 2.15.0 from PyPI: the single-code-point keys of emoji.EMOJI_DATA, as hex ranges.

--nltk-data-repo DIR is a clone of github.com/nltk/nltk_data (a work tree, a bare git directory, or any folder
holding the two files at those paths); the files are read from the folder when there, otherwise with
`git show REV:PATH` (--nltk-data-rev, default HEAD). The embedded blobs were made from commit 5db857e (2023-02-02);
the sha256 of each file read is printed with a note when it is not that commit's. Only the IFBench constants need it.

The packages are installed in a throwaway virtualenv (`--venv DIR` makes it there and keeps it; reused when its
versions are right) with the versions of allenai/IFBench's uv.lock (PACKAGES below; langdetect 1.0.9 is among
them), and run in subprocesses of that venv's python; this script itself is standard library only. The nltk data
folder VENV/nltk_data (punkt, punkt_tab/english made with nltk's save_punkt_params, stopwords, the _eng tagger) is
what bench/ifbench_parity.py gives the official IFBench code as NLTK_DATA; that script imports this one for it.

Usage: python3 bench/ifeval_blobs.py [--nltk-data-repo DIR] [--nltk-data-rev REV] [--venv DIR] [--punkt-wheel PATH]
       [--evalharness PATH] [--only NAME,...] [--ld-budget 12000] [--ld-scale 3] [--ld-order listdir] [--write]
"""
import argparse
import ast
import base64
import collections
import hashlib
import json
import math
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# allenai/IFBench's uv.lock (HEAD db69a6f) versions of what its checkers import (spacy, httpx, pydantic left out:
# the checkers do not use them)
PACKAGES = ["nltk==3.9.2", "langdetect==1.0.9", "emoji==2.15.0", "syllapy==0.7.2", "immutabledict==4.2.2",
            "absl-py==2.3.1", "setuptools==80.9.0", "regex==2025.11.3", "click==8.3.1", "joblib==1.5.3",
            "tqdm==4.67.1", "six==1.17.0", "unicodedata2==17.0.0"]
PUNKT_WHEEL = "llama-index-core==0.10.50"
PUNKT_PREFIX = "llama_index/core/_static/nltk_cache/tokenizers/punkt/"
PUNKT_SHA256 = "5cad3758596392364e3be9803dbd7ebeda384b68937b488a01365f5551bb942c"   # PY3/english.pickle
NLTK_DATA_FILES = {   # what, path in nltk/nltk_data, sha256 at 5db857e (the embedded blobs' source)
    "stopwords": ("packages/corpora/stopwords.zip",
                  "15c94179887425ca1bedc265608cab9f27d650211f709bb929e320990a4b01d1"),
    "tagger": ("packages/taggers/averaged_perceptron_tagger.zip",
               "e1f13cf2532daadfd6f3bc481a49859f0b8ea6432ccdcd83e6a49a5f19008de9"),
}
NAMES = ("_PUNKT_EN", "_IB_TAGGER", "_IB_SYLLABLES", "_IB_EMOJI", "_IB_STOPWORDS", "_LD_BLOB")
IB_NAMES = ("_IB_TAGGER", "_IB_SYLLABLES", "_IB_EMOJI", "_IB_STOPWORDS")

PROBE = r'''
import importlib.metadata as md, json, sys
out = {}
for spec in sys.argv[1:]:
    name = spec.split("==")[0]
    try:
        out[name] = md.version(name)
    except md.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
'''

# Runs in the venv: nltk's own writers make the nltk 3.9 formats (punkt_tab, the _eng tagger's JSON) from pickles.
MAKE_NLTK_DATA = r'''
import os, pickle, sys
from nltk.tokenize.punkt import save_punkt_params
from nltk.tag.perceptron import PerceptronTagger
D = sys.argv[1]
with open(os.path.join(D, "tokenizers/punkt/PY3/english.pickle"), "rb") as f:
    tok = pickle.load(f)
os.makedirs(os.path.join(D, "tokenizers/punkt_tab"), exist_ok=True)
save_punkt_params(tok._params, dir=os.path.join(D, "tokenizers/punkt_tab/english"))
if os.path.exists(os.path.join(D, "taggers/averaged_perceptron_tagger")):
    with open(os.path.join(D, "taggers/averaged_perceptron_tagger/averaged_perceptron_tagger.pickle"), "rb") as f:
        w, td, cl = pickle.load(f)
    t = PerceptronTagger(load=False)
    t.model.weights, t.tagdict, t.classes = w, td, cl
    t.model.classes = cl
    t.save_to_json(lang="eng", loc=os.path.join(D, "taggers/averaged_perceptron_tagger_eng"))
    print(len(w), len(td), len(cl))
'''

# Runs in the venv with NLTK_DATA set: IFBench's data from the packages it reads at run time (prints JSON).
GEN_IFBENCH = r'''
import base64, json, os, re, string, zlib
import emoji, nltk, syllapy
import importlib.metadata as md

# nltk's 14 feature templates in its order; the fixed value a template has at token 0 (None: depends on the text)
TEMPLATES = [("bias", ""), ("i suffix", None), ("i pref1", None), ("i-1 tag", "-START-"), ("i-2 tag", "-START2-"),
             ("i tag+i-2 tag", "-START- -START2-"), ("i word", None), ("i-1 tag+i word", "-START- "),
             ("i-1 word", "-START2-"), ("i-1 suffix", "T2-"), ("i-2 word", "-START-"), ("i+1 word", None),
             ("i+1 suffix", None), ("i+2 word", None)]


def varint(out, n):
    while True:
        b, n = n & 127, n >> 7
        out.append(b | 128 if n else b)
        if not n:
            return


def tagger_blob():
    loc = nltk.data.find("taggers/averaged_perceptron_tagger_eng")
    def load(a):
        with open(os.path.join(loc, "averaged_perceptron_tagger_eng.%s.json" % a)) as f:
            return json.load(f)
    weights, tagdict, classes = load("weights"), load("tagdict"), sorted(load("classes"))
    ci = {c: i for i, c in enumerate(classes)}
    fams = []
    for name, fixed in TEMPLATES:
        fam = {}
        for f, ws in weights.items():
            if name == "bias":
                if f != "bias":
                    continue
                key = ""
            elif not f.startswith(name + " "):
                continue
            else:
                key = f[len(name) + 1:]
                if fixed is not None:
                    if fixed.endswith(" "):   # "i-1 tag+i word": only previous tag -START-, key = the word
                        if not key.startswith(fixed):
                            continue
                        key = key[len(fixed):]
                    elif key != fixed:
                        continue
                    else:
                        key = ""
            items = []
            for t, w in ws.items():
                m = round(w * 1000)
                assert m / 1000 == w, (f, t, w)
                if m:
                    items.append((ci[t], m))
            if items:
                assert "\n" not in key
                fam[key] = sorted(items)
        fams.append(fam)
    keys = sorted({k for fam in fams for k in fam})
    kid = {k: i for i, k in enumerate(keys)}
    st, tg, wt = bytearray(), bytearray(), []
    for fam in fams:
        varint(st, len(fam))
        prev = -1
        for k in sorted(fam, key=kid.get):
            varint(st, kid[k] - prev - 1)
            prev = kid[k]
            varint(st, len(fam[k]))
            pt = -1
            for t, m in fam[k]:
                tg.append(t - pt - 1)
                pt = t
                wt.append(m * 2 if m >= 0 else -m * 2 - 1)
    assert all(" " not in w and "\n" not in w for w in tagdict)
    head = "\n".join([" ".join(classes), " ".join(["1"] * len(TEMPLATES))]
                     + ["%s %d" % (w, ci[t]) for w, t in sorted(tagdict.items())])
    assert max(wt) < 1 << 24
    planes = bytes(u >> s & 255 for s in (0, 8, 16) for u in wt)
    parts = [head.encode(), "\n".join(keys).encode(), bytes(st), bytes(tg), planes]
    raw = b"".join(len(p).to_bytes(4, "little") + p for p in parts)
    stats = {"features": len(weights), "tagdict": len(tagdict), "classes": len(classes),
             "position0_features": sum(map(len, fams)), "weights": len(tg)}
    return base64.b85encode(zlib.compress(raw, 9)).decode(), stats


def syllable_blob():
    d, p = syllapy.WORD_DICT, string.punctuation
    def fallback(w):
        m = re.match("([^-]+)-(.+)", w)
        if m:
            a, b = syllapy.count(m.group(1)), syllapy.count(m.group(2))
            return 0 if a == 0 or b == 0 else a + b
        return syllapy._syllables(w)
    keep = {}
    for w, n in d.items():   # keys count() can reach: already normalized, no digits
        if w and w == w.strip().lower().strip(p) and not re.search(r"\d", w) and fallback(w) != n:
            assert " " not in w and "|" not in w
            keep.setdefault(n, []).append(w)
    text = "|".join(" ".join(sorted(keep.get(n, []))) for n in range(1, max(keep) + 1))
    return base64.b85encode(zlib.compress(text.encode(), 9)).decode(), {"entries": len(d), "kept": sum(
        map(len, keep.values()))}


def emoji_ranges():
    rs = []
    for c in sorted(ord(k) for k in emoji.EMOJI_DATA if len(k) == 1):
        if rs and rs[-1][1] == c - 1:
            rs[-1][1] = c
        else:
            rs.append([c, c])
    return " ".join("%X" % a if a == b else "%X-%X" % (a, b) for a, b in rs)


tagger, tstats = tagger_blob()
syl, sstats = syllable_blob()
sw = nltk.corpus.stopwords.words("english")
print(json.dumps({"_IB_TAGGER": tagger, "_IB_SYLLABLES": syl, "_IB_EMOJI": emoji_ranges(),
                  "_IB_STOPWORDS": [w for w in sw if "'" not in w],
                  "stats": {"tagger": tstats, "syllables": sstats, "stopwords": len(sw)},
                  "tagger_dir": nltk.data.find("taggers/averaged_perceptron_tagger_eng"),
                  "stopwords_dir": nltk.data.find("corpora/stopwords"),
                  "versions": {p: md.version(p) for p in ("nltk", "emoji", "syllapy")}}))
'''


# ----------------------------------------------------------------------------------------------------------------
# the venv and the nltk data (bench/ifbench_parity.py uses these too)


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def make_venv(vdir, packages=PACKAGES, log=print):
    """A venv at vdir with the pinned packages (installed only when a version is not right); returns its python."""
    py = os.path.join(vdir, "bin", "python")
    if not os.path.exists(py):
        log("making the venv %s" % vdir)
        subprocess.run([sys.executable, "-m", "venv", vdir], check=True)
    want = {p.split("==")[0]: p.split("==")[1] for p in packages}
    have = json.loads(subprocess.run([py, "-c", PROBE] + list(packages), check=True, capture_output=True,
                                     universal_newlines=True).stdout)
    if any(have.get(name) != v for name, v in want.items()):
        log("installing %s" % " ".join(packages))
        subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + list(packages),
                       check=True)
    return py


def get_punkt_wheel(vdir, wheel=None):
    """The llama-index-core 0.10.50 wheel: the given one, or one pip-downloaded into VDIR/wheels."""
    if wheel:
        return wheel
    cache = os.path.join(vdir, "wheels")
    os.makedirs(cache, exist_ok=True)
    found = [n for n in os.listdir(cache) if n.startswith("llama_index_core-0.10.50")]
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                        "-d", cache, PUNKT_WHEEL], check=True)
        found = [n for n in os.listdir(cache) if n.startswith("llama_index_core-0.10.50")]
    return os.path.join(cache, found[0])


def extract_punkt(wheel, data):
    """nltk_data's punkt package as the wheel carries it, into DATA/tokenizers/punkt (.DS_Store left out)."""
    target = os.path.join(data, "tokenizers", "punkt")
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            if not name.startswith(PUNKT_PREFIX) or name.endswith("/") or name.endswith(".DS_Store"):
                continue
            dest = os.path.join(target, name[len(PUNKT_PREFIX):])
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as out:
                out.write(z.read(info))
    return os.path.join(target, "PY3", "english.pickle")


def repo_file(repo, path, rev="HEAD"):
    """(bytes, where): a file of the nltk_data clone, from its work tree or else from git at rev."""
    direct = os.path.join(repo, path)
    if os.path.isfile(direct):
        with open(direct, "rb") as f:
            return f.read(), direct
    proc = subprocess.run(["git", "-C", repo, "show", "%s:%s" % (rev, path)], capture_output=True)
    if proc.returncode:
        sys.exit("cannot read %s from %s (neither a file there nor `git show %s:%s`): %s" % (
            path, repo, rev, path, proc.stderr.decode(errors="replace").strip()))
    commit = subprocess.run(["git", "-C", repo, "rev-parse", "--short", rev], capture_output=True,
                            universal_newlines=True).stdout.strip()
    return proc.stdout, "%s at %s (%s)" % (path, rev, commit)


def make_nltk_data(py, vdir, repo=None, rev="HEAD", wheel=None, log=print):
    """VDIR/nltk_data, made anew: punkt from the wheel, punkt_tab/english from it with nltk's save_punkt_params,
    and (with repo) stopwords and the _eng tagger from the nltk_data clone. Returns (folder, info lines)."""
    data = os.path.join(vdir, "nltk_data")
    if os.path.exists(data):
        shutil.rmtree(data)
    os.makedirs(data)
    info = []
    wheel = get_punkt_wheel(vdir, wheel)
    pk = extract_punkt(wheel, data)
    with open(pk, "rb") as f:
        h = sha256_bytes(f.read())
    info.append("punkt: %s from %s, sha256 %s%s" % (os.path.relpath(pk, data), os.path.basename(wheel), h[:16],
                                                     "" if h == PUNKT_SHA256 else " (NOT the expected %s)" % (
                                                         PUNKT_SHA256[:16])))
    if repo:
        for what, (path, want) in sorted(NLTK_DATA_FILES.items()):
            blob, where = repo_file(repo, path, rev)
            h = sha256_bytes(blob)
            info.append("%s: %s, sha256 %s%s" % (what, where, h[:16], "" if h == want else
                                                 " (not nltk_data 5db857e's %s)" % want[:16]))
            sub = os.path.join(data, "corpora" if what == "stopwords" else "taggers")
            os.makedirs(sub, exist_ok=True)
            zpath = os.path.join(sub, os.path.basename(path))
            with open(zpath, "wb") as f:
                f.write(blob)
            with zipfile.ZipFile(zpath) as z:
                z.extractall(sub)
            os.remove(zpath)
    proc = subprocess.run([py, "-c", MAKE_NLTK_DATA, data], capture_output=True, universal_newlines=True,
                          env=dict(os.environ, NLTK_DATA=data, PYTHONWARNINGS="ignore"))
    if proc.returncode:
        sys.exit("making the nltk data failed:\n" + proc.stderr[-3000:])
    if repo:
        w, td, cl = proc.stdout.split()
        info.append("tagger pickle: %s features, %s tagdict words, %s classes -> taggers/averaged_perceptron_tagger_"
                    "eng (nltk's save_to_json)" % (w, td, cl))
    info.append("punkt_tab/english: from the punkt pickle with nltk's save_punkt_params")
    return data, info


# ----------------------------------------------------------------------------------------------------------------
# _PUNKT_EN: nltk's English Punkt parameters, reduced to what evalharness's _punkt_sentences decides with
#
# abbrev_types: all. collocations: the ("##number##", w) pairs; a pair (initial, w) is dropped where the initial
# is a one-letter non-abbreviation and w has no orthographic data (the orthographic rules then give the same).
# sent_starters: folded into UPPER_TRUE where the type has HAS_LC, the rest kept. ortho_context: only three tests
# of the flags c matter, UPPER_TRUE = (c & LC) and not (c & MID_UC), HAS_LC = c & LC, LOWER_UNK = not (c & UC) and
# (c & BEG_LC); types giving (False, False, False) are dropped, the others are classes T (True, True, False),
# A (False, True, False), U (True, True, True). Text: abbrev_types | "w1 w2" collocations | sent_starters | U words
# | a front-coded sorted list of the T, A and U words (each entry: a letter chr(65 + d), d = characters dropped from
# the end of the previous word, then the new tail; the tail's first character upper-cased for A words).

BEG_UC, MID_UC, UNK_UC, BEG_LC, MID_LC, UNK_LC = 2, 4, 8, 16, 32, 64
UC = BEG_UC | MID_UC | UNK_UC
LC = BEG_LC | MID_LC | UNK_LC
PUNKT_CLASS = {(True, True, False): "T", (False, True, False): "A", (True, True, True): "U",
               (False, False, False): None}


class _Stand:
    """Stand-in for nltk's Punkt classes: keeps whatever state the pickle gives it."""

    def __setstate__(self, state):
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state


class _PunktUnpickler(pickle.Unpickler):
    _ALLOWED = {("builtins", "set"): set, ("builtins", "int"): int,
                ("collections", "defaultdict"): collections.defaultdict}
    _NLTK = ("PunktSentenceTokenizer", "PunktParameters", "PunktLanguageVars", "PunktToken")

    def find_class(self, module, name):
        if module == "nltk.tokenize.punkt" and name in self._NLTK:
            return type(name, (_Stand,), {})
        if (module, name) in self._ALLOWED:
            return self._ALLOWED[(module, name)]
        raise pickle.UnpicklingError("unexpected global %s.%s" % (module, name))


def _punkt_params(path):
    with open(path, "rb") as f:
        tok = _PunktUnpickler(f).load()
    assert getattr(tok._lang_vars, "state", None) == 1, vars(tok._lang_vars)   # nltk's default language vars
    assert tok._Token.__name__ == "PunktToken"
    p = tok._params
    return set(p.abbrev_types), set(p.collocations), set(p.sent_starters), dict(p.ortho_context)


def _ortho_class(c):
    return (bool(c & LC) and not c & MID_UC, bool(c & LC), not c & UC and bool(c & BEG_LC))


def _front_code(words, mark):
    out, prev = [], ""
    for w in words:
        n = 0
        while n < min(len(w), len(prev)) and w[n] == prev[n]:
            n += 1
        if mark[w]:
            while not ("a" <= w[n] <= "z"):
                n -= 1
        tail = w[n:]
        if mark[w]:
            tail = tail[0].upper() + tail[1:]
        d = len(prev) - n
        assert 0 <= d < 26 and tail
        out.append(chr(65 + d) + tail)
        prev = w
    return "".join(out)


def _punkt_decode(text):
    """Mirror of evalharness's decoder, to check the blob against the pickle."""
    ab, co, ss, uw, stream = text.split("|")
    up, haslc, prev = set(), set(), ""
    for d, tail in re.findall(r"([A-Z])([A-Z]?[^A-Z]*)", stream):
        w = prev[:len(prev) - (ord(d) - 65)] + tail.lower()
        haslc.add(w)
        if not tail[0].isupper():
            up.add(w)
        prev = w
    return (set(ab.split("\n")), {tuple(x.split(" ")) for x in co.split("\n")}, set(ss.split("\n")),
            up, haslc, set(uw.split("\n")))


def punkt_blob(pickle_path):
    """(blob, stats line) from tokenizers/punkt/PY3/english.pickle."""
    abbrev, colloc, starters, ortho = _punkt_params(pickle_path)
    classes = {}
    for typ, c in ortho.items():
        k = PUNKT_CLASS[_ortho_class(c)]   # KeyError if a new combination ever appears
        if k:
            classes[typ] = k
    assert all(re.match(r"[a-z][a-z0-9./%-]*$", t) for t in classes), "unexpected characters"
    kept_colloc = {(a, b) for a, b in colloc
                   if not (len(a) == 1 and "a" <= a <= "z" and a not in abbrev
                           and _ortho_class(ortho.get(b, 0)) == (False, False, False))}
    kept_starters = {s for s in starters if not _ortho_class(ortho.get(s, 0))[1]}
    for s in starters - kept_starters:
        classes[s] = {"A": "T"}.get(classes[s], classes[s])
    uwords = sorted(t for t, k in classes.items() if k == "U")
    stream = _front_code(sorted(classes), {t: k == "A" for t, k in classes.items()})
    parts = ["\n".join(sorted(abbrev)), "\n".join("%s %s" % ab for ab in sorted(kept_colloc)),
             "\n".join(sorted(kept_starters)), "\n".join(uwords), stream]
    assert not any("|" in x for x in parts)
    text = "|".join(parts)
    blob = base64.b85encode(zlib.compress(text.encode("ascii"), 9)).decode("ascii")
    d_ab, d_co, d_ss, d_up, d_lc, d_lo = _punkt_decode(zlib.decompress(base64.b85decode(blob)).decode("ascii"))
    assert d_ab == abbrev and d_co == kept_colloc and d_ss == kept_starters
    for typ in set(ortho) | starters | {"zzz-absent", "the", "mr", "mich."}:
        up, haslc, lounk = _ortho_class(ortho.get(typ, 0))
        assert (up or (haslc and typ in starters), haslc, lounk) == (typ in d_up, typ in d_lc, typ in d_lo), typ
    n = collections.Counter(classes.values())
    return blob, ("types T %d, A %d, U %d; abbreviations %d, collocations %d of %d, sentence starters %d of %d" % (
        n["T"], n["A"], n["U"], len(abbrev), len(kept_colloc), len(colloc), len(kept_starters), len(starters)))


# ----------------------------------------------------------------------------------------------------------------
# _LD_BLOB: langdetect's profiles, pruned and quantized
#
# Layout (zlib, then base85): an ASCII head "langs\nscale floor fine_scale fine_n split\nn1 n2 n3 vi_bytes
# alphabet_bytes key_bytes\n\n" (langs in the profiles' os.listdir order), the 5x24 Vietnamese composed characters
# (UTF-8), a 0x5200-byte CJK class table for U+4E00..U+9FFF (class id, | 0x80 on the class representative), the
# alphabet of the kept n-grams (UTF-8), the n-grams (1-grams, 2-grams, 3-grams, each sorted; each as the number of
# characters shared with the previous one, then its first new character as a 1-byte step up from the previous
# gram's character there or 0 and a 2-byte alphabet index, then further characters as 2-byte indices), a 7-byte
# little-endian bitmask of languages per n-gram, then one byte per entry q = round(x * fine_scale), x = -log2(p +
# floor); for 2/3-grams that are not ALL-CAPS forms, x beyond `split` is stored as split + (x - split) * scale /
# fine_scale.

VI_BASE = "AEIOUYaeiouy\u00c2\u00ca\u00d4\u00e2\u00ea\u00f4\u0102\u0103\u01a0\u01a1\u01af\u01b0"


def _read_properties(path):
    props = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                props[k] = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), v)
    return props


def _load_profiles(pdir):
    """Profiles in os.listdir order, as langdetect loads them."""
    profs = []
    for name in os.listdir(pdir):
        path = os.path.join(pdir, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                profs.append(json.load(fh))
    return [p["name"] for p in profs], profs


def _cjk_table(props):
    classes = [v for k, v in props.items() if k.startswith("NGram.KANJI_")]
    arr = bytearray(0x5200)
    for i, cls in enumerate(classes):
        for ch in cls:
            arr[ord(ch) - 0x4E00] = i + 1
        arr[ord(cls[0]) - 0x4E00] |= 0x80
    return bytes(arr)


def _normalization_map(cjk):
    """langdetect's per-character normalization by Unicode block (as evalharness's _ld_normalization_map)."""
    m = {c: " " for c in range(0x80) if not ("A" <= chr(c) <= "Z" or "a" <= chr(c) <= "z")}
    m.update({c: " " for c in (0xA0, 0xAB, 0xB0, 0xBB)})
    m.update({0x219: "\u015f", 0x21B: "\u0163", 0x6CC: "\u064a"})
    m.update({c: " " for c in range(0x2000, 0x2070)})
    m.update({c: "\u1ec3" for c in range(0x1EA0, 0x1F00)})
    m.update({c: "\u3042" for c in range(0x3040, 0x30A0)})
    m.update({c: "\u30a2" for c in range(0x30A0, 0x3100)})
    m.update({c: "\u3105" for c in list(range(0x3100, 0x3130)) + list(range(0x31A0, 0x31C0))})
    m.update({c: "\uac00" for c in range(0xAC00, 0xD7B0)})
    reps = {cls & 0x7F: chr(0x4E00 + i) for i, cls in enumerate(cjk) if cls & 0x80}
    for i, cls in enumerate(cjk):
        if cls and not cls & 0x80:
            m[0x4E00 + i] = reps[cls]
    return m


def _reachable(gram, norm):
    """Can langdetect's n-gram extraction ever emit this profile key?"""
    for i, ch in enumerate(gram):
        if ch == " ":
            if 0 < i < len(gram) - 1 or gram == " " or gram == "  ":
                return False
        elif norm.get(ord(ch), ch) != ch:
            return False
    return not (len(gram) >= 2 and gram[-1].isupper() and gram[-2].isupper())


def _caps_form(gram):
    """The only n-grams an ALL-CAPS word emits: "X", " X", "Y ", "XY " (upper-case letters)."""
    core = gram.strip(" ")
    return all(ch.isupper() for ch in core) and (len(gram) <= 2 or gram.endswith(" ") and len(core) == 2)


def _ld_select(profs, norm, budget, min_p, single_w, floor):
    """gram -> {language index: probability} for the `budget` grams that matter most: unreachable grams dropped;
    score = largest probability x standard deviation over the languages of log(floor + p), x single_w for grams of
    one profile only; 1-grams and ALL-CAPS forms always kept; then entries below min_p[n-1] dropped."""
    table = {}
    for li, p in enumerate(profs):
        for g, f in p["freq"].items():
            n = len(g)
            if 1 <= n <= 3 and _reachable(g, norm):
                table.setdefault(g, {})[li] = f / p["n_words"][n - 1]
    scored = []
    for g, e in table.items():
        logs = [math.log(floor + e.get(li, 0.0)) for li in range(len(profs))]
        mean = sum(logs) / len(logs)
        spread = math.sqrt(sum((x - mean) ** 2 for x in logs) / len(logs))
        score = max(e.values()) * spread * (single_w if len(e) == 1 else 1.0)
        scored.append((float("inf") if len(g) == 1 or _caps_form(g) else score, g))
    scored.sort(reverse=True)
    out = {}
    for _, g in scored[:budget or len(scored)]:
        kept = {li: v for li, v in table[g].items() if v >= min_p[len(g) - 1]}
        if kept:
            out[g] = kept
    return out


def _ld_encode(langs, vi, cjk, table, scale, floor, fine_scale, fine_n, split):
    by_len = [sorted(g for g in table if len(g) == n) for n in (1, 2, 3)]
    alphabet = sorted(set("".join(table)))
    code = {ch: i for i, ch in enumerate(alphabet)}
    keys, masks, qs = bytearray(), bytearray(), bytearray()
    prev = ""
    for grams in by_len:
        for g in grams:
            shared = 0
            while shared < min(len(g), len(prev)) and g[shared] == prev[shared]:
                shared += 1
            keys.append(shared)
            for i, ch in enumerate(g[shared:]):
                step = code[ch] - code[prev[shared]] if i == 0 and shared < len(prev) else 0
                if 0 < step < 256:
                    keys.append(step)
                else:
                    if i == 0:
                        keys.append(0)
                    keys += code[ch].to_bytes(2, "big")
            prev = g
            masks += sum(1 << li for li in table[g]).to_bytes(7, "little")
            for li in sorted(table[g]):
                x = -math.log2(table[g][li] + floor)
                if not (len(g) <= fine_n or _caps_form(g)) and x > split:
                    x = split + (x - split) * scale / fine_scale
                qs.append(min(255, max(0, round(x * fine_scale))))
    vib, alb = vi.encode("utf-8"), "".join(alphabet).encode("utf-8")
    head = "%s\n%g %g %g %d %g\n%d %d %d %d %d %d\n\n" % (" ".join(langs), scale, floor, fine_scale, fine_n, split,
                                                         *(len(x) for x in by_len), len(vib), len(alb), len(keys))
    return head.encode("ascii") + vib + cjk + alb + bytes(keys) + bytes(masks) + bytes(qs)


def langdetect_blob(ld_dir, budget=12000, scale=3.0, order=None, min_p=(0.0, 2e-5, 2e-5), single_w=0.1,
                    fine_scale=16.0, fine_n=1, floor=5e-5, split=9.0):
    """(blob, stats line) from an installed langdetect package folder; order: the languages in this order instead
    of the folder's os.listdir order."""
    props = _read_properties(os.path.join(ld_dir, "utils", "messages.properties"))
    vi = "".join(props["NORMALIZED_VI_CHARS_" + m] for m in ("0300", "0301", "0303", "0309", "0323"))
    assert len(vi) == 120 and props["TO_NORMALIZE_VI_CHARS"] == VI_BASE
    cjk = _cjk_table(props)
    langs, profs = _load_profiles(os.path.join(ld_dir, "profiles"))
    if order is not None:
        if sorted(order) != sorted(langs):
            raise ValueError("the order names other languages than the profiles: %s" % " ".join(order))
        profs = [profs[langs.index(x)] for x in order]
        langs = list(order)
    table = _ld_select(profs, _normalization_map(cjk), budget, min_p, single_w, floor)
    raw = _ld_encode(langs, vi, cjk, table, scale, floor, fine_scale, fine_n, split)
    blob = base64.b85encode(zlib.compress(raw, 9)).decode("ascii")
    return blob, "%d languages (%s order: %s), %d n-grams" % (len(langs), "os.listdir" if order is None else
                                                               "given", " ".join(langs), len(table))


def ld_order(blob):
    """The language order stored in a _LD_BLOB (its first line), or None."""
    raw = payload(blob) if isinstance(blob, str) else None
    return raw.split(b"\n", 1)[0].decode("ascii").split() if raw else None


# ----------------------------------------------------------------------------------------------------------------
# the constants in evalharness.py: their source lines


def render(name, value):
    """The lines between `NAME = (` and `)` for a value, in the layout the file uses."""
    if name == "_IB_STOPWORDS":   # "w", items, lines up to 116 characters
        out, line = [], "   "
        for w in value:
            item = ' "%s",' % w
            if len(line) + len(item) > 116:
                out.append(line)
                line = "   "
            line += item
        return out + [line]
    if name == "_IB_EMOJI":   # words, each followed by a space, lines up to 108 characters between the quotes
        lines, line = [], ""
        for w in value.split():
            if len(line) + len(w) + 1 > 108:
                lines.append(line)
                line = ""
            line += w + " "
        return ['    "%s"' % x for x in lines + [line]]
    width = 114 if name == "_PUNKT_EN" else 108
    return ['    "%s"' % value[i:i + width] for i in range(0, len(value), width)] or ['    ""']


def find_constant(lines, name):
    """(first, end): lines[first] is `NAME = (` or `NAME: TYPE = (`, lines[end] its closing `)`."""
    pat = re.compile(r"%s(: [^=]+)? = \($" % re.escape(name))
    starts = [i for i, line in enumerate(lines) if pat.match(line)]
    if len(starts) != 1:
        raise ValueError("%d definitions of %s" % (len(starts), name))
    end = starts[0] + 1
    while lines[end] != ")":
        end += 1
    return starts[0], end


def embedded_value(lines, name):
    first, end = find_constant(lines, name)
    return ast.literal_eval("(\n" + "\n".join(lines[first + 1:end]) + "\n)"), lines[first + 1:end]


def payload(value):
    """The decoded bytes of a base85 + zlib blob, or None."""
    try:
        return zlib.decompress(base64.b85decode("".join(value.split())))
    except (ValueError, zlib.error):
        return None


def size_of(value):
    if isinstance(value, str):
        return "%d chars" % len(value)
    return "%d words" % len(value)


def compare(name, old, new, old_lines):
    """(equal, layout equal, line): the embedded value against the value the rendered lines of new hold (as
    _IB_EMOJI's lines end their words with a space, that value ends with one)."""
    new_lines = render(name, new)
    new = ast.literal_eval("(\n" + "\n".join(new_lines) + "\n)")
    equal = list(old) == list(new) if isinstance(new, (list, tuple)) else old == new
    layout = old_lines == new_lines
    if equal:
        text = "equal    %s" % size_of(new)
    else:
        text = "differs  embedded %s, regenerated %s" % (size_of(old), size_of(new))
        if name in ("_PUNKT_EN", "_LD_BLOB", "_IB_TAGGER", "_IB_SYLLABLES"):
            a, b = payload(old), payload(new)
            if a is not None and a == b:
                text += "; decoded payload equal (%d bytes): only the zlib stream differs" % len(a)
            elif a is not None and b is not None:
                k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                text += "; decoded payload differs (%d vs %d bytes, first difference at byte %d)" % (
                    len(a), len(b), k)
        elif isinstance(new, (list, tuple)):
            text += "; only embedded: %s; only regenerated: %s" % (
                sorted(set(old) - set(new))[:10], sorted(set(new) - set(old))[:10])
    text += "; layout %s (%d lines)" % ("equal" if layout else "differs", len(old_lines))
    return equal, layout, text


def write_constants(path, values):
    """Rewrites the string lines of each named constant in place; returns the names rewritten."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    done = []
    for name, value in values.items():
        first, end = find_constant(lines, name)
        new = render(name, value)
        if lines[first + 1:end] != new:
            lines[first + 1:end] = new
            done.append(name)
    if done:
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
    return done


# ----------------------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nltk-data-repo", metavar="DIR",
                    help="a clone (work tree or bare git directory) of github.com/nltk/nltk_data; needed for the "
                         "IFBench constants (made from commit 5db857e)")
    ap.add_argument("--nltk-data-rev", metavar="REV", default="HEAD",
                    help="the revision read with git show when the files are not in a work tree (default HEAD)")
    ap.add_argument("--venv", "--venv-dir", dest="venv", metavar="DIR", default=None,
                    help="make (or reuse) the venv here and keep it (default: a temporary one)")
    ap.add_argument("--punkt-wheel", metavar="PATH", default=None,
                    help="a local llama_index_core-0.10.50 wheel (default: pip download it)")
    ap.add_argument("--evalharness", metavar="PATH", default=os.path.join(ROOT, "evalharness.py"),
                    help="the module whose constants are compared (default: the repository's evalharness.py)")
    ap.add_argument("--only", metavar="NAMES", default=",".join(NAMES),
                    help="comma-separated constants (default all: %s)" % ",".join(NAMES))
    ap.add_argument("--ld-budget", type=int, default=12000, help="_LD_BLOB: n-grams kept (default 12000)")
    ap.add_argument("--ld-scale", type=float, default=3.0, help="_LD_BLOB: steps per octave (default 3)")
    ap.add_argument("--ld-order", choices=("listdir", "embedded"), default="listdir",
                    help="_LD_BLOB's language order: the profiles folder's os.listdir order (default), or the one "
                         "stored in the embedded blob")
    ap.add_argument("--write", action="store_true", help="rewrite the differing constants in --evalharness")
    args = ap.parse_args()

    only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in only if n not in NAMES]
    if unknown:
        sys.exit("unknown constants: %s (known: %s)" % (", ".join(unknown), ", ".join(NAMES)))
    need_ib = any(n in IB_NAMES for n in only)
    if need_ib and not args.nltk_data_repo:
        sys.exit("the IFBench constants need --nltk-data-repo DIR (a clone of github.com/nltk/nltk_data)")
    path = os.path.abspath(args.evalharness)
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    embedded = {n: embedded_value(lines, n) for n in only}

    new, notes = {}, []
    with tempfile.TemporaryDirectory(prefix="evalharness-blobs-") as tmp:
        vdir = os.path.abspath(args.venv) if args.venv else os.path.join(tmp, "venv")
        need_venv = need_ib or "_LD_BLOB" in only
        py = make_venv(vdir) if need_venv else None
        if need_venv:
            notes.append("venv: %s (%s)" % (vdir, " ".join(PACKAGES)))
        if "_PUNKT_EN" in only or need_ib:
            if need_ib:
                data, info = make_nltk_data(py, vdir, os.path.abspath(args.nltk_data_repo), args.nltk_data_rev,
                                            args.punkt_wheel)
                notes += ["nltk data %s:" % data] + ["  " + x for x in info]
            else:
                data = os.path.join(tmp, "nltk_data")
                pk = extract_punkt(get_punkt_wheel(vdir, args.punkt_wheel), data)
                with open(pk, "rb") as f:
                    h = sha256_bytes(f.read())
                notes.append("punkt: %s from %s, sha256 %s%s" % (pk, PUNKT_WHEEL, h[:16], "" if h == PUNKT_SHA256
                                                                 else " (NOT the expected %s)" % PUNKT_SHA256[:16]))
            if "_PUNKT_EN" in only:
                new["_PUNKT_EN"], stats = punkt_blob(os.path.join(data, "tokenizers", "punkt", "PY3",
                                                                  "english.pickle"))
                notes.append("_PUNKT_EN: " + stats)
        if "_LD_BLOB" in only:
            ld_dir = subprocess.run([py, "-c", "import langdetect, os; print(os.path.dirname(langdetect.__file__))"],
                                    check=True, capture_output=True, universal_newlines=True).stdout.strip()
            emb_order = ld_order(embedded["_LD_BLOB"][0])
            order = emb_order if args.ld_order == "embedded" else None
            if args.ld_order == "embedded" and not emb_order:
                sys.exit("--ld-order embedded: the embedded _LD_BLOB does not decode")
            new["_LD_BLOB"], stats = langdetect_blob(ld_dir, args.ld_budget, args.ld_scale, order)
            notes.append("_LD_BLOB: %s (budget %d, scale %g) from %s" % (stats, args.ld_budget, args.ld_scale,
                                                                        ld_dir))
            if order is None and emb_order and new["_LD_BLOB"] != embedded["_LD_BLOB"][0]:
                if ld_order(new["_LD_BLOB"]) != emb_order:   # is the listing order the only difference?
                    again, _ = langdetect_blob(ld_dir, args.ld_budget, args.ld_scale, emb_order)
                    notes.append("_LD_BLOB: this folder lists the profiles in another order than the embedded "
                                 "blob's (%s); with that order the regenerated blob is %s" % (
                                     " ".join(emb_order), "EQUAL: only the listing order differs (it depends on the "
                                     "filesystem; --ld-order embedded takes the blob's)"
                                     if again == embedded["_LD_BLOB"][0] else "still different"))
        if need_ib:
            proc = subprocess.run([py, "-c", GEN_IFBENCH], capture_output=True, universal_newlines=True,
                                  env=dict(os.environ, NLTK_DATA=data, PYTHONWARNINGS="ignore"))
            if proc.returncode:
                sys.exit("the IFBench generator failed:\n" + proc.stderr[-3000:])
            got = json.loads(proc.stdout)
            for n in IB_NAMES:
                if n in only:
                    new[n] = tuple(got[n]) if n == "_IB_STOPWORDS" else got[n]
            st = got["stats"]
            notes.append("IFBench data (%s): tagger %s from %s; syllapy entries %d, kept %d; stopwords %d, kept %d" % (
                ", ".join("%s %s" % kv for kv in sorted(got["versions"].items())),
                ", ".join("%s %s" % kv for kv in sorted(st["tagger"].items())), got["tagger_dir"],
                st["syllables"]["entries"], st["syllables"]["kept"], st["stopwords"], len(got["_IB_STOPWORDS"])))

    for x in notes:
        print(x)
    print("\n%s (%s)" % (path, "zlib %s" % zlib.ZLIB_RUNTIME_VERSION))
    results = {}
    for n in only:
        old, old_lines = embedded[n]
        results[n] = compare(n, old, new[n], old_lines)
        print("%-14s %s" % (n, results[n][2]))
    differing = [n for n in only if not (results[n][0] and results[n][1])]
    if args.write:
        done = write_constants(path, {n: new[n] for n in differing})
        print("rewritten in %s: %s" % (path, ", ".join(done) if done else "nothing (all equal)"))
        sys.exit(0)
    print("%s: %d of %d constants equal%s" % ("PASS" if not differing else "FAIL", len(only) - len(differing),
                                              len(only), (" (differ: %s)" % ", ".join(differing)) if differing else ""))
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
