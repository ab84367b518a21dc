#!/usr/bin/env python3
"""evalharness's IFEval verdicts against google-research's own instruction_following_eval (run by hand, never by CI).

    python3 bench/ifeval_parity.py --official DIR [--data DIR] [--venv DIR] [--json out.json]

--official DIR is the folder `instruction_following_eval/` as google-research/google-research ships it
(instructions.py, instructions_registry.py, instructions_util.py, evaluation_lib.py, evaluation_main.py); it is
imported unchanged as the package `instruction_following_eval` (through a symbolic link in a temporary folder).
--data DIR holds the upstream data files (default: ../shared/data/ifeval beside the repository):
input_data_gpt4_20231107_145030.jsonl, input_data_20231114_e4c89b64.jsonl, input_response_data_gpt4_20231107_145030
.jsonl, input_response_data_text_bison.jsonl.

The reference runs in a throwaway virtualenv (`--venv DIR` makes it there and keeps it; reused when its imports
work) with absl-py, langdetect 1.0.9, nltk 3.8.1 and immutabledict from PyPI, always in a subprocess of that venv's
python; this script itself is standard library only. nltk's English Punkt model is not downloaded from nltk's
servers: the PyPI wheel llama-index-core==0.10.50 (fetched with `pip download --no-deps`, or given with
--punkt-wheel) carries nltk's `punkt` package unchanged under llama_index/core/_static/nltk_cache/tokenizers/punkt/;
those files are extracted to VENV/nltk_data/tokenizers/punkt/ and NLTK_DATA points there. nltk 3.8.1 loads
`tokenizers/punkt/PY3/english.pickle` from it for instructions_util.count_sentences and nltk.word_tokenize (its
sha256 is printed).

Response sets, each with the prompt file it answers: the GPT-4 responses with input_data_gpt4_20231107_145030.jsonl;
the text-bison responses with the first release of the prompts, input_data_20231114_e4c89b64.jsonl. That release
leaves the kwargs of its 42 `combination:repeat_prompt` instructions empty, on which the official
RepeatPromptThenAnswer raises "prompt_to_repeat must be set." (the official CLI aborts on that pairing), so the
bench fills prompt_to_repeat with the prompt minus its closing sentence "First repeat the request word for word
without change, then give your answer (1. ...)" — the derivation reproduces the shipped prompt_to_repeat of every
row of the GPT-4 prompt file that closes with that sentence (printed) — and both sides see the filled rows.

Edited responses: from every original response, deterministic edits (seeded by --seed) that flip instructions
both ways: upper/lower case, commas removed/added, quotes wrapped/unwrapped, ```json fences added/removed,
postscripts added/removed, truncation to fewer words or sentences, padding, the `******` split made/joined, the
`***` dividers, text in another language, *highlights*, bullets, <<titles>>, end phrases, keywords, letters,
placeholders, sections, paragraphs, the repeated prompt, plus a sampled set of generic edits (empty, whitespace
only, a first or last line added, CRLF newlines, halving). The table shows, per edit, how many official verdicts
it flipped relative to the original response, each way.

The official verdicts come from evaluation_lib.test_instruction_following_strict / _loose per (row, response),
with langdetect seeded (DetectorFactory.seed = --seed) and `random.seed(--seed)` before each call; the official
code seeds neither, so it is also run --unseeded-runs times as shipped and every verdict that changes is listed
(the official code's own instability), and the official CLI (evaluation_main) is run once per set as shipped.
Ours: `ifeval_verdicts(row, response) -> (strict, loose)` of the module at --evalharness (default: the
repository's evalharness.py), row = {"key", "prompt", "instruction_id_list", "kwargs"}; before importing it this
script puts IFEVAL_PARITY_PYTHON (the venv's python), IFEVAL_PARITY_PACKAGE_DIR (the folder holding the
`instruction_following_eval` link) and NLTK_DATA in its own environment, so a stand-in module can call the
reference.

Prints the instruction-level agreement per set and mode, the four headline figures of each official set for
both sides and their difference in points, the official instability, the edit table, and every disagreement with
its cause (language detection / sentence splitting / word tokenization / random letter / other). Bars (exit 1 if
one fails): at least --min-edits edited responses; instruction-level verdicts equal on at least 99.8% of all
verdicts, in strict and in loose mode; each headline figure of each official set within 0.2 points; no malformed
answer from ifeval_verdicts. Also printed, not barred: the range of each headline figure over the unseeded runs,
and the agreement on the verdicts that no unseeded run changed. --json PATH writes everything, disagreements
included; --dump PATH writes every case (response and both sides' verdicts) as JSON Lines, for debugging.

Usage: python3 bench/ifeval_parity.py --official DIR [--data DIR] [--evalharness PATH] [--venv DIR]
       [--punkt-wheel PATH] [--seed 0] [--unseeded-runs 5] [--min-edits 1000] [--max-edits N] [--limit N]
       [--official-only] [--no-cli] [--show N] [--json PATH] [--dump PATH]
"""
import argparse
import collections
import copy
import hashlib
import importlib.util
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no bench/__pycache__ from the import below
import ifeval_blobs as blobs  # noqa: E402  (the Punkt wheel and its extraction, shared with the blob generator)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PACKAGES = ["absl-py", "langdetect==1.0.9", "nltk==3.8.1", "immutabledict"]
PUNKT_WHEEL = "llama-index-core==0.10.50"
PUNKT_PREFIX = "llama_index/core/_static/nltk_cache/tokenizers/punkt/"
OFFICIAL_FILES = ("instructions.py", "instructions_registry.py", "instructions_util.py", "evaluation_lib.py",
                  "evaluation_main.py")
SETS = (  # name, prompt file, response file
    ("gpt4", "input_data_gpt4_20231107_145030.jsonl", "input_response_data_gpt4_20231107_145030.jsonl"),
    ("text_bison", "input_data_20231114_e4c89b64.jsonl", "input_response_data_text_bison.jsonl"),
)
PAPER = {"gpt4": (76.89, 83.57, 79.30, 85.37)}   # the IFEval paper's GPT-4 row
FIGURES = ("prompt-level strict", "instruction-level strict", "prompt-level loose", "instruction-level loose")
MODES = ("strict", "loose")
AGREEMENT_BAR = 99.8
HEADLINE_BAR = 0.2
REPEAT_TAIL = ("First repeat the request word for word without change, then give your answer (1. do not say any "
               "words or characters before repeating the request; 2. the request you need to repeat does not "
               "include this sentence)")
LANG_IDS = ("language:response_language", "change_case:english_capital", "change_case:english_lowercase")

CHILD = r'''
# Runs in the reference venv: the official evaluation functions on each case of a JSON Lines file.
import json, random, sys
package_parent, mode, seed, cases_path, out_path = sys.argv[1:6]
sys.path.insert(0, package_parent)
seed = int(seed)
from absl import logging as absl_logging
absl_logging.set_verbosity(absl_logging.FATAL)   # langdetect failures are logged with the whole text
import langdetect
from instruction_following_eval import evaluation_lib, instructions_util
if mode in ("seeded", "diagnose"):
    langdetect.DetectorFactory.seed = seed
with open(cases_path, encoding="utf-8") as f, open(out_path, "w", encoding="utf-8") as out:
    for line in f:
        c = json.loads(line)
        if mode == "diagnose":
            text, d = c["text"], {}
            try:
                d["lang"] = langdetect.detect(text)
                d["langs"] = [str(x) for x in langdetect.detect_langs(text)][:3]
            except Exception as exc:
                d["lang"] = "%s: %s" % (type(exc).__name__, exc)
            d["sentences"] = instructions_util.count_sentences(text)
            d["words"] = instructions_util.count_words(text)
            d["capital_words"] = sum(1 for w in instructions_util.nltk.word_tokenize(text) if w.isupper())
            out.write(json.dumps(d) + "\n")
            continue
        inp = evaluation_lib.InputExample(key=c["key"], instruction_id_list=c["instruction_id_list"],
                                          prompt=c["prompt"], kwargs=c["kwargs"])
        res = {}
        for m, fn in (("strict", evaluation_lib.test_instruction_following_strict),
                      ("loose", evaluation_lib.test_instruction_following_loose)):
            if mode == "seeded":
                random.seed(seed)
            try:
                res[m] = fn(inp, {c["prompt"]: c["response"]}).follow_instruction_list
            except Exception as exc:   # the official code's own crash on this case
                res[m] = None
                res[m + "_error"] = "%s: %s" % (type(exc).__name__, exc)
        out.write(json.dumps(res) + "\n")
'''

PROBE = r'''
import importlib.metadata as md, nltk, sys
sys.path.insert(0, sys.argv[1])
from instruction_following_eval import instructions_util
tok = nltk.data.load("nltk:tokenizers/punkt/english.pickle")
assert len(tok.tokenize("Mr. Smith came. He left at 5 p.m. today! Did he?")) == 3
print(nltk.data.find("tokenizers/punkt/english.pickle"))
print(" ".join("%s %s" % (p, md.version(p)) for p in ("absl-py", "langdetect", "nltk", "immutabledict")))
'''


# ----------------------------------------------------------------------------------------------------------------
# the reference venv


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def make_venv(vdir):
    py = os.path.join(vdir, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", vdir], check=True)
    if subprocess.run([py, "-c", "import absl, langdetect, nltk, immutabledict"], capture_output=True).returncode:
        subprocess.run([py, "-m", "pip", "install", "-q"] + PACKAGES, check=True)
    return py


def get_punkt(vdir, wheel):
    """nltk's English Punkt package from the llama-index-core wheel, into VDIR/nltk_data; returns NLTK_DATA (the
    wheel found or pip-downloaded, and the package extracted, as bench/ifeval_blobs.py does for the embedded model)."""
    data = os.path.join(vdir, "nltk_data")
    if not os.path.exists(os.path.join(data, "tokenizers", "punkt", "PY3", "english.pickle")):
        blobs.extract_punkt(blobs.get_punkt_wheel(vdir, wheel), data)
    return data


def run_child(py, env, package_parent, mode, seed, cases, tmp, tag):
    """Starts the reference on cases (dicts); returns a function that waits and gives its result list."""
    cases_path = os.path.join(tmp, "cases-%s.jsonl" % tag)
    out_path = os.path.join(tmp, "out-%s.jsonl" % tag)
    if not os.path.exists(cases_path):
        with open(cases_path, "w", encoding="utf-8") as f:
            for c in cases:
                f.write(json.dumps(c) + "\n")
    err = open(os.path.join(tmp, "err-%s.txt" % tag), "w")
    proc = subprocess.Popen([py, "-c", CHILD, package_parent, mode, str(seed), cases_path, out_path], env=env,
                            stdout=subprocess.DEVNULL, stderr=err)

    def wait():
        rc = proc.wait()
        err.close()
        if rc != 0:
            with open(err.name) as f:
                sys.exit("the reference (%s) failed:\n%s" % (mode, f.read()[-3000:]))
        with open(out_path, encoding="utf-8") as f:
            out = [json.loads(line) for line in f]
        if len(out) != len(cases):
            sys.exit("the reference (%s) answered %d of %d cases" % (mode, len(out), len(cases)))
        return out
    return wait


# ----------------------------------------------------------------------------------------------------------------
# data


def load_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def derive_prompt_to_repeat(prompt):
    return prompt[:-len(REPEAT_TAIL)].strip() if prompt.endswith(REPEAT_TAIL) else None


def fill_repeat_prompt(rows):
    """Fills empty prompt_to_repeat kwargs (first-release prompts) from the prompt; returns how many."""
    filled = 0
    for row in rows:
        for i, (iid, kw) in enumerate(zip(row["instruction_id_list"], row["kwargs"])):
            if iid == "combination:repeat_prompt" and not kw.get("prompt_to_repeat"):
                ptr = derive_prompt_to_repeat(row["prompt"])
                if ptr is None:
                    sys.exit("row %s: no prompt_to_repeat and no closing repeat sentence to derive it from"
                             % row["key"])
                row["kwargs"][i] = dict(kw, prompt_to_repeat=ptr)
                filled += 1
    return filled


def check_derivation(rows):
    """(equal, total): the derivation against shipped prompt_to_repeat values."""
    equal = total = 0
    for row in rows:
        for iid, kw in zip(row["instruction_id_list"], row["kwargs"]):
            if iid == "combination:repeat_prompt" and kw.get("prompt_to_repeat"):
                d = derive_prompt_to_repeat(row["prompt"])
                if d is not None:
                    total += 1
                    equal += d == kw["prompt_to_repeat"].strip()
    return equal, total


# ----------------------------------------------------------------------------------------------------------------
# edits: each takes (response, kwargs of the instruction, context) and gives a new response or None


def _sub_first_word(text, word):
    m = re.search(r"\w+", text)
    return text[:m.start()] + word + text[m.end():] if m else None


def _first_words(text, n):
    """text cut just before its (n+1)-th \\w+ word: exactly n words when it had more."""
    ms = list(re.finditer(r"\w+", text))
    if n >= len(ms):
        return None
    return text[:ms[n].start()].rstrip() if n > 0 else ""


def _simple_sentences(text):
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def _pool_text(ctx, want_lang=None, avoid_lang=None):
    """A response of another response_language row, written in want_lang (or not in avoid_lang)."""
    cands = [(lang, key, text) for lang, key, text in ctx["pool"] if key != ctx["key"]
             and (want_lang is None or lang == want_lang) and (avoid_lang is None or lang != avoid_lang)]
    if not cands:
        return None
    return ctx["rng"].choice(sorted(cands))[2]


def _english_text(ctx):
    cands = [t for k, t in ctx["english"] if k != ctx["key"]]
    return ctx["rng"].choice(cands) if cands else None


def _once(text, old, new):
    return text.replace(old, new, 1) if old in text else None


def _re_remove(pattern, text, flags=0):
    new = re.sub(pattern, "", text, flags=flags)
    return new if new != text else None


CASE = [
    ("upper", lambda r, kw, c: r.upper()),
    ("lower", lambda r, kw, c: r.lower()),
    ("upper_but_one_word", lambda r, kw, c: (lambda u, m: u[:m.start()] + m.group(0).lower() + u[m.end():] if m
                                             else None)(r.upper(), re.search(r"[A-Z]{2,}", r.upper()))),
    ("lower_but_one_word", lambda r, kw, c: (lambda l, m: l[:m.start()] + m.group(0).upper() + l[m.end():] if m
                                             else None)(r.lower(), re.search(r"[a-z]{2,}", r.lower()))),
    ("foreign_text_lower", lambda r, kw, c: (_pool_text(c, avoid_lang="en") or "").lower() or None),
    ("foreign_text_upper", lambda r, kw, c: (_pool_text(c, avoid_lang="en") or "").upper() or None),
]


def _caps_words(r, kw, c, delta):
    n = max(0, kw.get("capital_frequency", 1) + delta)
    return r.lower().rstrip() + "\n" + " ".join(["NOTE"] * n)


def _section_edit(r, kw, c):
    spl, n = kw.get("section_spliter", "Section").strip(), kw.get("num_sections", 2)
    paras = [p for p in re.split(r"\n\s*\n", r.strip()) if p.strip()]
    if len(paras) < n:
        paras = paras + ["More."] * (n - len(paras))
    size = -(-len(paras) // n)
    chunks = [paras[i:i + size] for i in range(0, len(paras), size)]
    return "\n\n".join("%s %d\n%s" % (spl, i + 1, "\n\n".join(ch)) for i, ch in enumerate(chunks))


def _nth_paragraph(r, kw, word):
    paras = r.split("\n\n")
    n = kw.get("nth_paragraph", 1)
    if n > len(paras) or not paras[n - 1].strip():
        return None
    new = _sub_first_word(paras[n - 1], word)
    if new is None:
        return None
    paras[n - 1] = new
    return "\n\n".join(paras)


def _split_two(r, kw, c):
    paras = [p for p in r.strip().split("\n\n") if p.strip()]
    if len(paras) >= 2:
        h = len(paras) // 2
        return "\n\n".join(paras[:h]) + "\n******\n" + "\n\n".join(paras[h:])
    sents = _simple_sentences(r)
    if len(sents) >= 2:
        h = len(sents) // 2
        return " ".join(sents[:h]) + "\n******\n" + " ".join(sents[h:])
    return None


def _remove_ps(r, kw, c):
    m = re.search(r"(?im)^\W*p\.?\s?p?\.?\s?s\b", r)
    return r[:m.start()].rstrip() if m and r[:m.start()].strip() else None


def _keyword_times(r, kw, c, delta):
    k = kw.get("keyword", "")
    base = re.sub(re.escape(k), "", r, flags=re.IGNORECASE) if k else r
    return base.rstrip() + "\n" + " ".join([k] * max(0, kw.get("frequency", 1) + delta))


def _letter_times(r, kw, c, delta):
    let = kw.get("letter") or "e"
    base = r.replace(let.lower(), "").replace(let.upper(), "")
    return base.rstrip() + "\n" + " ".join([let] * max(0, kw.get("let_frequency", 1) + delta))


def _words_edit(r, kw, c, delta):
    n = kw.get("num_words", 100) + delta
    cut = _first_words(r, n)
    if cut is not None:
        return cut
    have = len(re.findall(r"\w+", r))
    return r.rstrip() + " " + " ".join(["more"] * (n - have))


def _sentences_edit(r, kw, c, delta):
    n = kw.get("num_sentences", 3) + delta
    sents = _simple_sentences(r)
    if n <= 0:
        return None
    if len(sents) > n:
        return " ".join(sents[:n])
    return r.rstrip() + " " + " ".join("This is extra sentence %d." % i for i in range(n - len(sents)))


EDITS = {
    "change_case:english_capital": CASE,
    "change_case:english_lowercase": CASE,
    "change_case:capital_word_frequency": [
        ("upper", lambda r, kw, c: r.upper()),
        ("lower", lambda r, kw, c: r.lower()),
        ("caps_words_threshold_minus_1", lambda r, kw, c: _caps_words(r, kw, c, -1)),
        ("caps_words_threshold", lambda r, kw, c: _caps_words(r, kw, c, 0)),
    ],
    "punctuation:no_comma": [
        ("remove_commas", lambda r, kw, c: r.replace(",", "") if "," in r else None),
        ("add_comma", lambda r, kw, c: re.sub(r"^(\W*\w+)", r"\1,", r, count=1)),
        ("fullwidth_commas", lambda r, kw, c: r.replace(",", "\uff0c") if "," in r else None),
    ],
    "startend:quotation": [
        ("wrap_quotes", lambda r, kw, c: '"' + r.strip() + '"'),
        ("unwrap_quotes", lambda r, kw, c: r.strip().strip('"')),
        ("curly_quotes", lambda r, kw, c: "\u201c" + r.strip().strip('"') + "\u201d"),
    ],
    "detectable_format:json_format": [
        ("json_fence", lambda r, kw, c: "```json\n" + r.strip() + "\n```"),
        ("json_fence_upper", lambda r, kw, c: "```JSON\n" + r.strip() + "\n```"),
        ("unfence", lambda r, kw, c: _re_remove(r"(?m)^```\w*[ \t]*\n?", r)),
        ("json_preamble", lambda r, kw, c: "Here is the JSON you asked for:\n" + r),
        ("json_truncated", lambda r, kw, c: r.rstrip().rstrip("`").rstrip()[:-1]),
        ("json_dumped", lambda r, kw, c: json.dumps({"response": r})),
    ],
    "detectable_content:postscript": [
        ("add_postscript", lambda r, kw, c: r.rstrip() + "\n\n" + kw.get("postscript_marker", "P.S.").strip()
         + " Thanks for reading."),
        ("add_other_postscript", lambda r, kw, c: r.rstrip() + "\n\n" + (
            "P.S." if kw.get("postscript_marker", "").strip() == "P.P.S" else "P.P.S") + " One more thing."),
        ("remove_postscript", _remove_ps),
        ("postscript_without_dots", lambda r, kw, c: re.sub(r"P\.\s?P\.\s?S\.?|P\.\s?S\.?", "PS", r)
         if re.search(r"P\.\s?S|P\.\s?P", r) else None),
    ],
    "length_constraints:number_words": [
        ("words_threshold_minus_1", lambda r, kw, c: _words_edit(r, kw, c, -1)),
        ("words_threshold", lambda r, kw, c: _words_edit(r, kw, c, 0)),
        ("truncate_half_words", lambda r, kw, c: _first_words(r, len(re.findall(r"\w+", r)) // 2)),
    ],
    "length_constraints:number_sentences": [
        ("sentences_threshold_minus_1", lambda r, kw, c: _sentences_edit(r, kw, c, -1)),
        ("sentences_threshold", lambda r, kw, c: _sentences_edit(r, kw, c, 0)),
        ("truncate_first_sentence", lambda r, kw, c: (_simple_sentences(r) or [None])[0]),
        ("abbreviation_sentences", lambda r, kw, c: r.rstrip() + " Mr. Smith met Dr. Jones at 5 p.m. on Jan. 3, "
         "e.g. at the U.S. office... \"Really?\" she asked. (He left.) No. 7 was next!"),
    ],
    "length_constraints:number_paragraphs": [
        ("join_dividers", lambda r, kw, c: re.sub(r"\s*\*\*\*+\s*", "\n\n", r) if "***" in r else None),
        ("add_divider", lambda r, kw, c: _once(r, "\n\n", "\n\n***\n\n")),
        ("double_divider", lambda r, kw, c: _once(r, "***", "******")),
        ("divide_every_paragraph", lambda r, kw, c: re.sub(r"\n\s*\n", "\n\n***\n\n", r.strip())
         if "\n\n" in r.strip() else None),
        ("dividers_at_both_ends", lambda r, kw, c: "***\n" + r.strip() + "\n***"),
    ],
    "length_constraints:nth_paragraph_first_word": [
        ("single_newlines", lambda r, kw, c: re.sub(r"\n\n+", "\n", r) if "\n\n" in r else None),
        ("other_first_word", lambda r, kw, c: _nth_paragraph(r, kw, "Zebra")),
        ("required_first_word", lambda r, kw, c: _nth_paragraph(r, kw, kw.get("first_word", "x").capitalize())),
        ("quadruple_newline", lambda r, kw, c: _once(r, "\n\n", "\n\n\n\n")),
        ("triple_newline", lambda r, kw, c: _once(r, "\n\n", "\n\n\n")),
    ],
    "detectable_content:number_placeholders": [
        ("remove_brackets", lambda r, kw, c: r.replace("[", "(").replace("]", ")") if "[" in r else None),
        ("placeholders_threshold", lambda r, kw, c: r.replace("[", "(").replace("]", ")").rstrip() + "\n"
         + " ".join("[p%d]" % i for i in range(kw.get("num_placeholders", 1)))),
        ("placeholders_threshold_minus_1", lambda r, kw, c: r.replace("[", "(").replace("]", ")").rstrip() + "\n"
         + " ".join("[p%d]" % i for i in range(kw.get("num_placeholders", 1) - 1))),
    ],
    "detectable_format:number_bullet_lists": [
        ("remove_bullets", lambda r, kw, c: _re_remove(r"(?m)^(?=\s*[*-])(\s*)[*-]+\s?", r)),
        ("add_bullet", lambda r, kw, c: r.rstrip() + "\n* One more point."),
        ("exact_bullets", lambda r, kw, c: re.sub(r"(?m)^(\s*)[*-]+\s?", r"\1", r).rstrip() + "\n"
         + "\n".join("* Point %d." % i for i in range(kw.get("num_bullets", 1)))),
        ("dash_bullets", lambda r, kw, c: re.sub(r"(?m)^(\s*)\*(\s)", r"\1-\2", r) if re.search(r"(?m)^\s*\*\s", r)
         else None),
        ("bold_first_line", lambda r, kw, c: "**Note:** read on.\n" + r),
    ],
    "detectable_format:constrained_response": [
        ("add_answer", lambda r, kw, c: r.rstrip() + "\nMy answer is yes."),
        ("remove_answer", lambda r, kw, c: _once(r, "My answer is", "I think it is")),
        ("lowercase_answer", lambda r, kw, c: r.replace("My answer is", "my answer is") if "My answer is" in r
         else None),
    ],
    "detectable_format:number_highlighted_sections": [
        ("remove_stars", lambda r, kw, c: r.replace("*", "") if "*" in r else None),
        ("add_highlights", lambda r, kw, c: r.rstrip() + "\n" + " ".join(
            "*part %d*" % i for i in range(kw.get("num_highlights", 1)))),
        ("bold_highlights", lambda r, kw, c: re.sub(r"(?<!\*)\*([^\n*]+)\*(?!\*)", r"**\1**", r)),
        ("empty_highlights", lambda r, kw, c: r.replace("*", "").rstrip() + "\n** ** * * ****"),
    ],
    "detectable_format:multiple_sections": [
        ("remove_sections", lambda r, kw, c: re.sub(re.escape(kw.get("section_spliter", "Section").strip())
                                                    + r"\s?\d+", "Part", r)),
        ("make_sections", _section_edit),
        ("lowercase_spliter", lambda r, kw, c: r.replace(kw.get("section_spliter", "Section").strip(),
                                                         kw.get("section_spliter", "Section").strip().lower())),
    ],
    "detectable_format:title": [
        ("add_title", lambda r, kw, c: "<<A Title>>\n" + r),
        ("remove_title", lambda r, kw, c: r.replace("<<", "").replace(">>", "") if "<<" in r else None),
        ("empty_title", lambda r, kw, c: "<< >>\n" + r.replace("<<", "").replace(">>", "")),
        ("title_across_lines", lambda r, kw, c: "<<A\nTitle>>\n" + r.replace("<<", "").replace(">>", "")),
    ],
    "combination:two_responses": [
        ("join_responses", lambda r, kw, c: r.replace("******", "\n") if "******" in r else None),
        ("split_in_two", _split_two),
        ("same_twice", lambda r, kw, c: r.strip() + "\n******\n" + r.strip()),
        ("three_responses", lambda r, kw, c: r.rstrip() + "\n******\nA third response."),
        ("empty_middle_response", lambda r, kw, c: _once(r, "******", "******\n******")),
    ],
    "combination:repeat_prompt": [
        ("prepend_prompt", lambda r, kw, c: kw.get("prompt_to_repeat", "") + "\n" + r),
        ("drop_repeated_prompt", lambda r, kw, c: r.strip()[len(kw.get("prompt_to_repeat", "").strip()):].strip()
         if r.strip().lower().startswith(kw.get("prompt_to_repeat", "").strip().lower()) else None),
        ("preamble_before_repeat", lambda r, kw, c: "Sure! " + r),
    ],
    "startend:end_checker": [
        ("append_end_phrase", lambda r, kw, c: r.rstrip() + "\n" + kw.get("end_phrase", "")),
        ("text_after_end_phrase", lambda r, kw, c: r.rstrip() + "\nThank you!"),
        ("end_phrase_quoted", lambda r, kw, c: '"' + r.strip() + '"'),
    ],
    "language:response_language": [
        ("other_language", lambda r, kw, c: _pool_text(c, avoid_lang=kw.get("language"))),
        ("target_language_text", lambda r, kw, c: _pool_text(c, want_lang=kw.get("language"))),
        ("append_english", lambda r, kw, c: (lambda e: r.rstrip() + "\n\n" + e if e else None)(_english_text(c))),
        ("english_only", lambda r, kw, c: _english_text(c)),
    ],
    "keywords:existence": [
        ("remove_keywords", lambda r, kw, c: (lambda new: new if new != r else None)(
            re.sub("|".join(re.escape(k) for k in kw.get("keywords", ["zzz"])), "", r, flags=re.IGNORECASE))),
        ("add_keywords", lambda r, kw, c: r.rstrip() + "\n" + " ".join(kw.get("keywords", []))),
        ("remove_first_keyword", lambda r, kw, c: _re_remove(re.escape(kw.get("keywords", ["zzz"])[0]), r,
                                                             re.IGNORECASE)),
    ],
    "keywords:frequency": [
        ("remove_keyword", lambda r, kw, c: _re_remove(re.escape(kw.get("keyword", "zzz").strip()), r,
                                                       re.IGNORECASE)),
        ("keyword_threshold", lambda r, kw, c: _keyword_times(r, kw, c, 0)),
        ("keyword_threshold_minus_1", lambda r, kw, c: _keyword_times(r, kw, c, -1)),
    ],
    "keywords:forbidden_words": [
        ("add_forbidden_word", lambda r, kw, c: r.rstrip() + " " + kw.get("forbidden_words", ["zzz"])[0] + "."),
        ("remove_forbidden_words", lambda r, kw, c: (lambda new: new if new != r else None)(re.sub(
            r"\b(?:%s)\b" % "|".join(re.escape(w) for w in kw.get("forbidden_words", ["zzz"])), "", r,
            flags=re.IGNORECASE))),
        ("forbidden_word_inside_word", lambda r, kw, c: r.rstrip() + " " + kw.get("forbidden_words", ["z"])[0]
         + "xyz."),
    ],
    "keywords:letter_frequency": [
        ("remove_letter", lambda r, kw, c: (lambda let: r.replace(let.lower(), "").replace(let.upper(), ""))(
            kw.get("letter") or "e")),
        ("letter_threshold", lambda r, kw, c: _letter_times(r, kw, c, 0)),
        ("letter_threshold_minus_1", lambda r, kw, c: _letter_times(r, kw, c, -1)),
    ],
}

GENERIC = [   # applied to a seeded sample of the rows (each with probability GENERIC_RATE)
    ("empty", lambda r, kw, c: ""),
    ("whitespace_only", lambda r, kw, c: " \n\t \n"),
    ("first_line_added", lambda r, kw, c: "Sure, here is my answer:\n" + r),
    ("last_line_added", lambda r, kw, c: r.rstrip() + "\nI hope this helps!"),
    ("crlf_newlines", lambda r, kw, c: r.replace("\n", "\r\n") if "\n" in r else None),
    ("truncate_half", lambda r, kw, c: r[:len(r) // 2]),
    ("first_line_bold", lambda r, kw, c: (lambda lines: "\n".join(["**%s**" % lines[0]] + lines[1:]))(
        r.split("\n")) if r.strip() else None),
]
GENERIC_RATE = 0.2


def derive_edits(set_name, row, response, pool, english, seed):
    """[(edit name, edited response)] for one original response, deterministic for a seed."""
    out, seen = [], {response}
    todo = []
    for iid, kw in zip(row["instruction_id_list"], row["kwargs"]):
        for name, fn in EDITS.get(iid, ()):
            todo.append((name, fn, kw))
    pick = random.Random("%s:%s:%s:generic" % (seed, set_name, row["key"]))
    for name, fn in GENERIC:
        if pick.random() < GENERIC_RATE:
            todo.append((name, fn, {}))
    for name, fn, kw in todo:
        ctx = {"key": (set_name, row["key"]), "pool": pool, "english": english,
               "rng": random.Random("%s:%s:%s:%s" % (seed, set_name, row["key"], name))}
        try:
            text = fn(response, kw, ctx)
        except (IndexError, KeyError, TypeError, ValueError, re.error):
            text = None
        if text is None or text in seen:
            continue
        seen.add(text)
        out.append((name, text))
    return out


# ----------------------------------------------------------------------------------------------------------------
# scoring and causes


def loose_variants(response):
    lines = response.split("\n")
    first, last, both = "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()
    return [response, response.replace("*", ""), first, last, both, first.replace("*", ""), last.replace("*", ""),
            both.replace("*", "")]


def random_letter(kw):
    letter = kw.get("letter")
    return not (isinstance(letter, str) and len(letter) == 1 and 97 <= ord(letter.lower()) <= 122)


def cause_of(iid, kw, response, mode):
    texts = [response] if mode == "strict" else loose_variants(response)
    if iid == "keywords:letter_frequency" and random_letter(kw):
        return "random letter"
    if iid == "language:response_language":
        return "language detection"
    if iid == "change_case:english_capital":
        return "language detection" if any(t.strip() and t.isupper() for t in texts) else "other"
    if iid == "change_case:english_lowercase":
        return "language detection" if any(t.strip() and t.islower() for t in texts) else "other"
    if iid == "length_constraints:number_sentences":
        return "sentence splitting"
    if iid in ("change_case:capital_word_frequency", "length_constraints:number_words"):
        return "word tokenization"
    return "other"


def headline(cases, verdicts):
    """The four figures (percent) over cases (one per row) and their verdicts {mode: [bools]}."""
    out = []
    for mode in MODES:
        lists = [v[mode] for v in verdicts]
        prompt = 100.0 * sum(all(x) for x in lists) / len(lists)
        inst = 100.0 * sum(sum(x) for x in lists) / sum(len(x) for x in lists)
        out += [prompt, inst]
    return out


def excerpt(text, n=70):
    t = repr(text[:n])
    return t + ("…" if len(text) > n else "")


# ----------------------------------------------------------------------------------------------------------------


def load_ours(path):
    spec = importlib.util.spec_from_file_location("evalharness", path)
    if spec is None:
        sys.exit("cannot import %s" % path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["evalharness"] = mod
    spec.loader.exec_module(mod)
    fn = getattr(mod, "ifeval_verdicts", None)
    if fn is None:
        sys.exit("%s has no ifeval_verdicts(row, response) -> (strict, loose)" % path)
    return fn


def run_ours(fn, cases):
    out, problems = [], []
    for i, c in enumerate(cases):
        row = {"key": c["key"], "prompt": c["prompt"], "instruction_id_list": list(c["instruction_id_list"]),
               "kwargs": copy.deepcopy(c["kwargs"])}
        n = len(row["instruction_id_list"])
        try:
            got = fn(row, c["response"])
        except Exception as exc:   # counted as a disagreement on every instruction of the case
            out.append({"strict": None, "loose": None, "error": "%s: %s" % (type(exc).__name__, exc)})
            continue
        ok = (isinstance(got, (tuple, list)) and len(got) == 2
              and all(isinstance(x, (list, tuple)) and len(x) == n and all(isinstance(b, bool) for b in x)
                      for x in got))
        if not ok:
            problems.append((i, repr(got)[:200]))
            out.append({"strict": None, "loose": None, "error": "malformed answer: %s" % repr(got)[:200]})
            continue
        out.append({"strict": list(got[0]), "loose": list(got[1])})
    return out, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--official", required=True, metavar="DIR",
                    help="the instruction_following_eval folder as google-research ships it")
    ap.add_argument("--data", metavar="DIR", default=os.path.join(os.path.dirname(ROOT), "shared", "data", "ifeval"),
                    help="folder with the upstream prompt and response files (default ../shared/data/ifeval)")
    ap.add_argument("--evalharness", metavar="PATH", default=os.path.join(ROOT, "evalharness.py"),
                    help="module exposing ifeval_verdicts (default: the repository's evalharness.py)")
    ap.add_argument("--venv", "--venv-dir", dest="venv", metavar="DIR", default=None,
                    help="make (or reuse) the reference venv here and keep it (default: a temporary one)")
    ap.add_argument("--punkt-wheel", metavar="PATH", default=None,
                    help="a local llama_index_core-0.10.50 wheel (default: pip download it)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the edits and of the seeded reference (default 0)")
    ap.add_argument("--unseeded-runs", type=int, default=5, help="runs of the reference as shipped (default 5)")
    ap.add_argument("--min-edits", type=int, default=1000, help="bar: edited responses at least (default 1000)")
    ap.add_argument("--max-edits", type=int, default=0, help="keep a seeded sample of this many edits (default all)")
    ap.add_argument("--limit", type=int, default=0, help="first N rows of each set only (default all)")
    ap.add_argument("--official-only", action="store_true", help="reference side only (no evalharness)")
    ap.add_argument("--no-cli", action="store_true", help="skip the run of the official evaluation_main")
    ap.add_argument("--show", type=int, default=-1, help="disagreements printed (default -1: all)")
    ap.add_argument("--json", metavar="PATH", help="write the whole result as JSON here")
    ap.add_argument("--dump", metavar="PATH", help="write every case (response, both sides' verdicts) as JSON Lines")
    args = ap.parse_args()

    official = os.path.abspath(args.official)
    missing = [f for f in OFFICIAL_FILES if not os.path.isfile(os.path.join(official, f))]
    if missing:
        sys.exit("%s lacks %s" % (official, ", ".join(missing)))
    t0 = time.time()
    report = {"official": {"dir": official, "sha256": {f: sha256(os.path.join(official, f)) for f in OFFICIAL_FILES}}}

    with tempfile.TemporaryDirectory(prefix="evalharness-ifeval-") as tmp:
        vdir = os.path.abspath(args.venv) if args.venv else os.path.join(tmp, "venv")
        py = make_venv(vdir)
        nltk_data = get_punkt(vdir, args.punkt_wheel)
        package_parent = os.path.join(tmp, "pkg")
        os.makedirs(package_parent)
        os.symlink(official, os.path.join(package_parent, "instruction_following_eval"))
        env = dict(os.environ, NLTK_DATA=nltk_data, PYTHONPATH=package_parent, PYTHONDONTWRITEBYTECODE="1")
        probe = subprocess.run([py, "-c", PROBE, package_parent], env=env, capture_output=True,
                               universal_newlines=True)
        if probe.returncode:
            sys.exit("the reference venv does not work:\n" + probe.stderr[-3000:])
        pickle_path, versions = probe.stdout.split("\n")[:2]
        report["venv"] = {"dir": vdir, "packages": versions}
        report["punkt"] = {"source": "PyPI wheel %s, %s" % (PUNKT_WHEEL, PUNKT_PREFIX), "loaded": pickle_path,
                           "sha256": sha256(pickle_path)}
        print("reference: %s (files sha256: %s)" % (official, ", ".join(
            "%s %s" % (f, h[:12]) for f, h in report["official"]["sha256"].items())))
        print("venv: %s (%s)" % (vdir, versions))
        print("Punkt: %s -> NLTK_DATA=%s; nltk loads %s (sha256 %s)" % (
            PUNKT_WHEEL, nltk_data, pickle_path, report["punkt"]["sha256"][:16]))

        # -------- the cases: originals of both sets, then edits
        cases, meta = [], []   # meta: (group, set, key, edit, original case index)
        report["sets"] = {}
        pool, english = [], []
        rows_by_set = {}
        for name, prompts, responses in SETS:
            rows = load_jsonl(os.path.join(args.data, prompts))
            if args.limit:
                rows = rows[:args.limit]
            to_response = {}
            for r in load_jsonl(os.path.join(args.data, responses)):
                to_response[r["prompt"]] = r["response"]
            lost = [row["key"] for row in rows if row["prompt"] not in to_response]
            if lost:
                sys.exit("%s: %d prompts of %s have no response in %s (the official code raises KeyError): %s" % (
                    name, len(lost), prompts, responses, lost[:10]))
            filled = fill_repeat_prompt(rows)
            rows_by_set[name] = rows
            info = {"prompts": prompts, "responses": responses, "rows": len(rows), "filled_prompt_to_repeat": filled}
            if filled:
                eq, tot = check_derivation(load_jsonl(os.path.join(args.data, SETS[0][1])))
                info["derivation_check"] = "%d of %d shipped prompt_to_repeat values reproduced" % (eq, tot)
            report["sets"][name] = info
            for row in rows:
                resp = to_response[row["prompt"]]
                meta.append(("original", name, row["key"], "original", len(cases)))
                cases.append(dict(row, response=resp))
                for iid, kw in zip(row["instruction_id_list"], row["kwargs"]):
                    if iid == "language:response_language":
                        pool.append((kw["language"], (name, row["key"]), resp))
                if not any(i in LANG_IDS for i in row["instruction_id_list"]) and len(resp) > 200:
                    english.append(((name, row["key"]), resp))
        n_orig = len(cases)
        edits = []
        for i in range(n_orig):
            group, name, key, _, _ = meta[i]
            row = cases[i]
            for edit, text in derive_edits(name, row, row["response"], pool, english, args.seed):
                edits.append((("edited", name, key, edit, i), dict(row, response=text)))
        if args.max_edits and len(edits) > args.max_edits:
            keep = sorted(random.Random(args.seed).sample(range(len(edits)), args.max_edits))
            edits = [edits[i] for i in keep]
        for m, c in edits:
            meta.append(m)
            cases.append(c)
        n_edits = len(cases) - n_orig
        for name in report["sets"]:
            print("%s: %d rows (%s with %s)%s" % (
                name, report["sets"][name]["rows"], report["sets"][name]["responses"], report["sets"][name]["prompts"],
                "; %d empty prompt_to_repeat filled from the prompt (%s)" % (
                    report["sets"][name]["filled_prompt_to_repeat"], report["sets"][name]["derivation_check"])
                if report["sets"][name]["filled_prompt_to_repeat"] else ""))
        print("edited responses: %d (from both sets)" % n_edits)

        # -------- the reference: seeded, unseeded runs, the CLI
        strip = ["key", "prompt", "instruction_id_list", "kwargs", "response"]
        child_cases = [{k: c[k] for k in strip} for c in cases]
        waits = [run_child(py, env, package_parent, "seeded", args.seed, child_cases, tmp, "seeded")]
        for k in range(args.unseeded_runs):
            waits.append(run_child(py, env, package_parent, "unseeded", 0, child_cases, tmp, "unseeded%d" % k))
        ours_out, problems = None, []
        if not args.official_only:
            os.environ.update(IFEVAL_PARITY_PYTHON=py, IFEVAL_PARITY_PACKAGE_DIR=package_parent, NLTK_DATA=nltk_data)
            fn = load_ours(os.path.abspath(args.evalharness))
            t1 = time.time()
            ours_out, problems = run_ours(fn, cases)
            report["ours_seconds"] = round(time.time() - t1, 1)
        seeded = waits[0]()
        unseeded = [w() for w in waits[1:]]
        crashed = [i for i, s in enumerate(seeded) if s["strict"] is None or s["loose"] is None]
        if crashed:
            c = crashed[0]
            sys.exit("the official code crashed on %d cases, e.g. %s %s: %s" % (
                len(crashed), meta[c][1], meta[c][2], seeded[c].get("strict_error") or seeded[c].get("loose_error")))

        unstable = {}   # (case, instr, mode) -> list of verdicts over the runs
        for i, s in enumerate(seeded):
            for mode in MODES:
                for j, v in enumerate(s[mode]):
                    runs = [u[i][mode][j] if u[i][mode] is not None else None for u in unseeded]
                    if any(r != v for r in runs):
                        unstable[(i, j, mode)] = [v] + runs

        cli = {}
        if not args.no_cli:
            for name, prompts, responses in SETS:
                rows = rows_by_set[name]
                pfile = os.path.join(tmp, "cli-prompts-%s.jsonl" % name)
                with open(pfile, "w", encoding="utf-8") as f:
                    for row in rows:
                        f.write(json.dumps({k: row[k] for k in ("key", "instruction_id_list", "prompt", "kwargs")})
                                + "\n")
                odir = os.path.join(tmp, "cli-%s" % name)
                os.makedirs(odir)
                run = subprocess.run([py, "-m", "instruction_following_eval.evaluation_main",
                                      "--input_data=%s" % (pfile if report["sets"][name]["filled_prompt_to_repeat"]
                                                           or args.limit else os.path.join(args.data, prompts)),
                                      "--input_response_data=%s" % os.path.join(args.data, responses),
                                      "--output_dir=%s" % odir], env=env, capture_output=True,
                                     universal_newlines=True)
                if run.returncode:
                    cli[name] = {"error": run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed"}
                    continue
                res = {m: [r["follow_instruction_list"] for r in load_jsonl(os.path.join(odir,
                                                                                      "eval_results_%s.jsonl" % m))]
                       for m in MODES}
                cli[name] = {"verdicts": res}

        # -------- comparisons
        groups = collections.OrderedDict()
        for name, _, _ in SETS:
            groups[name] = [i for i in range(n_orig) if meta[i][1] == name]
        groups["edited"] = list(range(n_orig, len(cases)))
        groups["all"] = list(range(len(cases)))

        report["headline"] = {}
        print("\nheadline figures, percent (official: the official functions, seeded; CLI: evaluation_main as "
              "shipped, unseeded)")
        print("%-11s %-25s %9s %9s %8s %9s %8s" % ("set", "figure", "official", "CLI", "paper", "ours", "diff"))
        headline_bar_ok = True
        for name, _, _ in SETS:
            idx = groups[name]
            off = headline(idx, [seeded[i] for i in idx])
            cli_fig = headline(idx, [{m: cli[name]["verdicts"][m][k] for m in MODES} for k in range(len(idx))]) \
                if "verdicts" in cli.get(name, {}) else None
            ours_fig = None
            if ours_out is not None:
                ours_fig = headline(idx, [{m: ours_out[i][m] if ours_out[i][m] is not None
                                           else [not x for x in seeded[i][m]] for m in MODES} for i in idx])
            entry = {}
            for f, figure in enumerate(FIGURES):
                e = {"official": round(off[f], 2)}
                if cli_fig:
                    e["cli"] = round(cli_fig[f], 2)
                if name in PAPER and not args.limit:
                    e["paper"] = PAPER[name][f]
                if ours_fig:
                    e["ours"] = round(ours_fig[f], 2)
                    e["diff_points"] = round(ours_fig[f] - off[f], 2)
                    if abs(ours_fig[f] - off[f]) > HEADLINE_BAR + 1e-9:
                        headline_bar_ok = False
                entry[figure] = e
                print("%-11s %-25s %9.2f %9s %8s %9s %8s" % (
                    name, figure, off[f], "%.2f" % cli_fig[f] if cli_fig else "-",
                    "%.2f" % e["paper"] if "paper" in e else "-", "%.2f" % ours_fig[f] if ours_fig else "-",
                    "%+.2f" % e["diff_points"] if ours_fig else "-"))
            runs = [headline(idx, [u[i] for i in idx]) for u in unseeded
                    if all(u[i]["strict"] is not None and u[i]["loose"] is not None for i in idx)]
            if runs:
                for f, figure in enumerate(FIGURES):
                    entry[figure]["unseeded_range"] = [round(min(r[f] for r in runs), 2),
                                                       round(max(r[f] for r in runs), 2)]
                print("%-11s the %d unseeded runs of the official functions: %s" % (name, len(runs), ", ".join(
                    "%s %.2f-%.2f" % ((figure,) + tuple(entry[figure]["unseeded_range"])) for figure in FIGURES)))
            report["headline"][name] = entry
            if "error" in cli.get(name, {}):
                print("%-11s CLI failed: %s" % (name, cli[name]["error"]))

        report["cli"] = {}
        for name, _, _ in SETS:
            if "verdicts" not in cli.get(name, {}):
                report["cli"][name] = cli.get(name, {"skipped": True})
                continue
            diff = []
            for k, i in enumerate(groups[name]):
                for mode in MODES:
                    for j, (a, b) in enumerate(zip(seeded[i][mode], cli[name]["verdicts"][mode][k])):
                        if a != b:
                            diff.append({"key": meta[i][2], "instruction": cases[i]["instruction_id_list"][j],
                                         "mode": mode, "seeded": a, "cli": b,
                                         "known_unstable": (i, j, mode) in unstable or cause_of(
                                             cases[i]["instruction_id_list"][j], cases[i]["kwargs"][j],
                                             cases[i]["response"], mode) in ("random letter", "language detection")})
            report["cli"][name] = {"differences_from_seeded": diff}
            print("%s: the CLI's verdicts differ from the seeded functions' on %d instruction verdicts%s" % (
                name, len(diff), (": " + ", ".join("%s %s %s" % (d["key"], d["instruction"], d["mode"])
                                                   for d in diff)) if diff else ""))

        # instability
        report["instability"] = {"unseeded_runs": args.unseeded_runs, "changed": []}
        by_group = collections.Counter()
        for (i, j, mode), vs in sorted(unstable.items()):
            group, name, key, edit, _ = meta[i]
            iid = cases[i]["instruction_id_list"][j]
            cause = cause_of(iid, cases[i]["kwargs"][j], cases[i]["response"], mode)
            by_group[(name if group == "original" else "edited", mode)] += 1
            report["instability"]["changed"].append({"set": name, "key": key, "edit": edit, "instruction": iid,
                                                     "mode": mode, "verdicts": vs, "cause": cause})
        print("\nofficial instability: %d unseeded runs; verdicts that changed between runs (seeded run included): "
              "%s" % (args.unseeded_runs, ", ".join("%s %s %d" % (g, m, n) for (g, m), n in sorted(by_group.items()))
                      or "none"))
        for u in report["instability"]["changed"]:
            print("  %s %s %s %s %s: %s (%s)" % (u["set"], u["key"], u["edit"], u["instruction"], u["mode"],
                                                 "".join("T" if v else "F" for v in u["verdicts"]), u["cause"]))

        # edit table: official flips relative to the original response
        flips = collections.OrderedDict()
        for i in range(n_orig, len(cases)):
            edit, orig = meta[i][3], meta[i][4]
            e = flips.setdefault(edit, {"responses": 0, "strict": [0, 0], "loose": [0, 0]})
            e["responses"] += 1
            for mode in MODES:
                for a, b in zip(seeded[orig][mode], seeded[i][mode]):
                    if a and not b:
                        e[mode][0] += 1
                    elif b and not a:
                        e[mode][1] += 1
        report["edits"] = {"count": n_edits, "by_edit": flips}
        print("\nedits (official verdicts flipped relative to the original response: true->false / false->true)")
        print("%-32s %9s %15s %15s" % ("edit", "responses", "strict T>F/F>T", "loose T>F/F>T"))
        for edit, e in sorted(flips.items()):
            print("%-32s %9d %15s %15s" % (edit, e["responses"], "%d/%d" % tuple(e["strict"]),
                                           "%d/%d" % tuple(e["loose"])))

        bars = [{"name": "edited responses", "value": n_edits, "limit": ">= %d" % args.min_edits,
                 "pass": n_edits >= args.min_edits}]
        if ours_out is not None:
            # agreement
            report["agreement"] = {}
            print("\ninstruction-level agreement (official seeded vs ours)")
            print("%-11s %-6s %9s %9s %9s" % ("group", "mode", "verdicts", "equal", "percent"))
            for g, idx in groups.items():
                report["agreement"][g] = {}
                for mode in MODES:
                    tot = eq = 0
                    for i in idx:
                        n = len(seeded[i][mode])
                        tot += n
                        if ours_out[i][mode] is not None:
                            eq += sum(a == b for a, b in zip(seeded[i][mode], ours_out[i][mode]))
                    pct = 100.0 * eq / tot if tot else 100.0
                    report["agreement"][g][mode] = {"verdicts": tot, "equal": eq, "percent": round(pct, 3)}
                    print("%-11s %-6s %9d %9d %8.3f%%" % (g, mode, tot, eq, pct))
                    if g == "all":
                        st_tot = st_eq = 0
                        for i in idx:
                            for j, a in enumerate(seeded[i][mode]):
                                if (i, j, mode) in unstable:
                                    continue
                                st_tot += 1
                                st_eq += ours_out[i][mode] is not None and ours_out[i][mode][j] == a
                        report["agreement"]["all, official-stable verdicts"] = report["agreement"].get(
                            "all, official-stable verdicts", {})
                        report["agreement"]["all, official-stable verdicts"][mode] = {
                            "verdicts": st_tot, "equal": st_eq, "percent": round(100.0 * st_eq / st_tot, 3)}
                        print("%-11s %-6s %9d %9d %8.3f%%  (verdicts the unseeded official runs never changed)" % (
                            "all stable", mode, st_tot, st_eq, 100.0 * st_eq / st_tot))
                        bars.append({"name": "agreement %s" % mode, "value": round(pct, 3),
                                     "limit": ">= %.1f%%" % AGREEMENT_BAR, "pass": pct >= AGREEMENT_BAR})
            bars.append({"name": "headline figures", "value": max(
                abs(e.get("diff_points", 0)) for s in report["headline"].values() for e in s.values()),
                "limit": "<= %.1f points" % HEADLINE_BAR, "pass": headline_bar_ok})
            bars.append({"name": "well-formed answers", "value": len(cases) - len(problems),
                         "limit": "== %d" % len(cases), "pass": not problems})

            # disagreements
            dis = []
            for i in range(len(cases)):
                for mode in MODES:
                    ours_v = ours_out[i][mode]
                    for j, a in enumerate(seeded[i][mode]):
                        b = None if ours_v is None else ours_v[j]
                        if a == b:
                            continue
                        iid = cases[i]["instruction_id_list"][j]
                        cause = cause_of(iid, cases[i]["kwargs"][j], cases[i]["response"], mode)
                        if ours_v is None:
                            cause = "other (ours: %s)" % ours_out[i].get("error", "")[:120]
                        dis.append({"set": meta[i][1], "key": meta[i][2], "edit": meta[i][3], "case": i,
                                    "instruction": iid, "kwargs": cases[i]["kwargs"][j], "mode": mode,
                                    "official": a, "ours": b, "excerpt": excerpt(cases[i]["response"]),
                                    "cause": cause, "official_unstable": (i, j, mode) in unstable})
            # diagnostics from the reference for the disagreeing texts
            if dis:
                texts = sorted({d["case"] for d in dis})
                diag = run_child(py, env, package_parent, "diagnose", args.seed,
                                 [{"text": cases[i]["response"]} for i in texts], tmp, "diagnose")()
                diag = dict(zip(texts, diag))
                for d in dis:
                    g = diag[d["case"]]
                    if d["cause"] == "language detection":
                        d["detail"] = "langdetect(seeded) %s %s" % (g["lang"], " ".join(g.get("langs", [])))
                    elif d["cause"] == "sentence splitting":
                        d["detail"] = "Punkt sentences %d (%s %s)" % (g["sentences"], d["kwargs"].get("relation"),
                                                                      d["kwargs"].get("num_sentences"))
                    elif d["instruction"] == "change_case:capital_word_frequency":
                        d["detail"] = "word_tokenize all-caps tokens %d (%s %s)" % (
                            g["capital_words"], d["kwargs"].get("capital_relation"),
                            d["kwargs"].get("capital_frequency"))
                    elif d["instruction"] == "length_constraints:number_words":
                        d["detail"] = "\\w+ words %d (%s %s)" % (g["words"], d["kwargs"].get("relation"),
                                                                 d["kwargs"].get("num_words"))
                    else:
                        d["detail"] = ""
            report["disagreements"] = dis
            causes = collections.Counter(d["cause"] for d in dis)
            print("\ndisagreements: %d%s" % (len(dis), (" (" + ", ".join(
                "%s %d" % kv for kv in causes.most_common()) + ")") if dis else ""))
            shown = dis if args.show < 0 else dis[:args.show]
            for d in shown:
                print("  %s %s %s %s %s: official %s, ours %s; %s%s; %s%s" % (
                    d["set"], d["key"], d["edit"], d["instruction"], d["mode"], d["official"], d["ours"], d["cause"],
                    " (official unstable)" if d["official_unstable"] else "", d["excerpt"],
                    "; " + d["detail"] if d.get("detail") else ""))
            if problems:
                print("malformed answers from ifeval_verdicts: %d, e.g. case %d: %s" % (
                    len(problems), problems[0][0], problems[0][1]))

        if args.dump:
            with open(args.dump, "w", encoding="utf-8") as f:
                for i, c in enumerate(cases):
                    f.write(json.dumps({"set": meta[i][1], "key": meta[i][2], "edit": meta[i][3],
                                        "instruction_id_list": c["instruction_id_list"], "kwargs": c["kwargs"],
                                        "response": c["response"], "official": {m: seeded[i][m] for m in MODES},
                                        "ours": None if ours_out is None else {m: ours_out[i][m] for m in MODES}},
                                       ensure_ascii=False) + "\n")
        report["bars"] = bars
        report["pass"] = all(b["pass"] for b in bars)
        report["seconds"] = round(time.time() - t0, 1)
        print("\nbars:")
        for b in bars:
            print("  %-22s %-12s %-16s %s" % (b["name"], b["value"], b["limit"], "PASS" if b["pass"] else "FAIL"))
        print("%s in %.0f s" % ("PASS" if report["pass"] else "FAIL", report["seconds"]))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=1, ensure_ascii=False)
    sys.exit(0 if report["pass"] else 1)


if __name__ == "__main__":
    main()
