#!/usr/bin/env python3
"""evalharness's IFBench verdicts against allenai/IFBench's official checker (run by hand, never by CI).

    python3 bench/ifbench_parity.py --official DIR --nltk-data-repo DIR [--data DIR] [--fuzz N] [--venv DIR]

--official DIR is a checkout of github.com/allenai/IFBench (HEAD db69a6f), or a bare git directory of it (then its
--official-rev, default HEAD, is taken with git archive): its evaluation_lib.py and its package ifbench/ are copied
unchanged into a temporary folder that comes first on the reference's sys.path (the package makes a .nltk_data
folder beside itself on import: the copy keeps the checkout clean). The file hashes and the commit are printed.

The reference runs in a throwaway virtualenv (`--venv DIR` makes it there and keeps it; reused when its versions
are right) with the versions of IFBench's uv.lock for what its checkers import (nltk 3.9.2, langdetect 1.0.9,
emoji 2.15.0, syllapy 0.7.2, immutabledict, absl-py, unicodedata2, ...: bench/ifeval_blobs.py's PACKAGES), always in
a subprocess of that venv's python; this script itself is standard library only. The nltk data is made offline
exactly as bench/ifeval_blobs.py makes it for the embedded blobs (that script is imported for it): punkt from the
PyPI wheel llama-index-core==0.10.50 (--punkt-wheel, or pip download), punkt_tab/english from it with nltk's
save_punkt_params, stopwords and the _eng tagger (nltk's save_to_json of the 2023 pickle) from --nltk-data-repo, a
clone or bare git directory of github.com/nltk/nltk_data (commit 5db857e), read at --nltk-data-rev. NLTK_DATA points
there, so the official code's download-at-import finds everything and downloads nothing.

Cases, each a row {"instruction_id_list", "kwargs"} and a response, checked strict and loose on both sides:
  hand-written  rows written for this bench (below; not IFBench's data): every one of the 58 IFBench types, at
                least 6 rows each whose official strict verdicts include both True and False (a bar); half of them
                carry every argument name with None for the unused ones, as IFBench's rows do.
  data          with --data DIR (a folder holding data/IFBench_test.jsonl and data/sample_output.jsonl, e.g. the
                checkout; or its git directory, read at --official-rev): every row with its response, found as
                the official code finds it (the prompt, else the stripped prompt; a row without one gets the
                official empty output, all False; ours gets "").
  cross         with --cross and --data: every type (the first arguments of its hand-written rows) on every
                non-empty response of sample_output.jsonl.
  fuzz          --fuzz N (default 100) random responses per type: words, numbers, scripts, emoji and punctuation
                of a fixed pool joined by random separators, with arguments drawn per case (--seed).
Official: evaluation_lib.test_instruction_following_strict, then _loose on the same InputExample (run_eval.py's
order; random seeded with 0 before each), prompt_to_response {prompt: response}. Where that raises, each instruction
of the row is run alone, and an instruction whose official check raises is an official crash: reported apart (with
ours' verdict, which should be False), not counted as a disagreement. Ours: `ifeval_verdicts(row, response) ->
(strict, loose)` of the module at --evalharness (default: the repository's evalharness.py).

Prints: the sources, a table per type (rows, verdicts compared, equal, different, official crashes, the official
strict True/False of the hand-written rows), the totals per set and overall, every disagreement with its cause (the
reference's own sentence splitting, word tokenization and first-token tag of each text the mode looks at, compared
with evalharness's: "sentence splitting", "word tokenization", "first-token tag", else "checker"), the official
crashes by type and error (two of each, and every one where ours says True), the data set's four headline
figures on both sides, and the bars. Exit 1 unless every
verdict is equal (official crashes aside) and the hand-written rows cover every type as said.

Usage: python3 bench/ifbench_parity.py --official DIR --nltk-data-repo DIR [--official-rev REV] [--nltk-data-rev REV]
       [--data DIR] [--cross] [--fuzz 100] [--seed 7] [--evalharness PATH] [--venv DIR] [--punkt-wheel PATH]
       [--show N] [--json PATH]
"""
import argparse
import collections
import copy
import hashlib
import importlib.util
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True   # no bench/__pycache__ from the import below
import ifeval_blobs as blobs  # noqa: E402  (the venv and the nltk data, shared with the blob generator)

OFFICIAL_FILES = ("evaluation_lib.py", "ifbench/__init__.py", "ifbench/instructions.py", "ifbench/instructions_util.py",
                  "ifbench/instructions_registry.py", "ifbench/classic_instructions.py")
OFFICIAL_HEAD = "db69a6f"
MODES = ("strict", "loose")
MIN_ROWS = 6
# every argument name of IFBench's rows (IFEval's and its own), as its rows carry them (None where unused)
ARG_NAMES = ("N capital_frequency capital_relation end_phrase first_word forbidden_words frequency keyword keyword1 "
             "keyword2 keyword3 keyword4 keyword5 keywords language let_frequency let_relation letter m max_words "
             "min_words n n_end n_start nth_paragraph num_bullets num_highlights num_paragraphs num_placeholders "
             "num_sections num_sentences num_words options percentage postscript_marker prompt_to_repeat "
             "reference_text relation section_spliter sep small_n word").split()

CHILD = r'''
# Runs in the reference venv: the official evaluation functions on each case of a JSON Lines file.
import copy, json, logging, os, random, sys
official, mode, cases_path, out_path = sys.argv[1:5]
sys.path.insert(0, official)
logging.disable(logging.CRITICAL)
from absl import logging as absl_logging
absl_logging.set_verbosity(absl_logging.FATAL)
import nltk
import evaluation_lib
from ifbench import instructions_registry, instructions_util
assert os.path.dirname(instructions_registry.__file__).startswith(official), instructions_registry.__file__


def run(ids, kwargs, prompt, response):
    inp = evaluation_lib.InputExample(key=0, instruction_id_list=ids, prompt=prompt, kwargs=kwargs)
    p2r = {} if response is None else {prompt: response}
    res, errors = {}, {}
    for m, fn in (("strict", evaluation_lib.test_instruction_following_strict),
                  ("loose", evaluation_lib.test_instruction_following_loose)):
        random.seed(0)
        try:
            res[m] = fn(inp, p2r).follow_instruction_list
        except Exception as exc:   # the official code's own crash
            res[m] = None
            errors[m] = "%s: %s" % (type(exc).__name__, str(exc)[:200])
    return res, errors


def diagnose(text):
    d = {"sentences": instructions_util.split_into_sentences(text)}
    try:
        d["words"] = nltk.word_tokenize(text)
        d["tag0"] = nltk.pos_tag(d["words"])[0][1] if d["words"] else None
    except Exception as exc:
        d["words"], d["tag0"] = "%s: %s" % (type(exc).__name__, exc), None
    return d


with open(cases_path, encoding="utf-8") as f, open(out_path, "w", encoding="utf-8") as out:
    for line in f:
        c = json.loads(line)
        if mode == "diagnose":
            out.write(json.dumps([diagnose(t) for t in c["texts"]]) + "\n")
            continue
        ids, prompt, response = c["instruction_id_list"], c.get("prompt", ""), c["response"]
        res, errors = run(ids, copy.deepcopy(c["kwargs"]), prompt, response)
        if errors:   # which instruction: each alone
            res = {"strict": [], "loose": []}
            for j, iid in enumerate(ids):
                one, err = run([iid], [dict(c["kwargs"][j])], prompt, response)
                for m in ("strict", "loose"):
                    res[m].append(None if one[m] is None else one[m][0])
                    if m in err:
                        errors["%d %s" % (j, m)] = err[m]
            errors = {k: v for k, v in errors.items() if " " in k}
        res["errors"] = errors
        out.write(json.dumps(res) + "\n")
'''


# ----------------------------------------------------------------------------------------------------------------
# hand-written rows: (instruction id, kwargs, responses); every text written for this bench. Counts are floats
# and n/m/n_start/n_end ints, as in IFBench's rows.

F = float
LONG_PROSE = ("Rivers carve valleys over many centuries. Water moves sediment downstream, and floods reshape the "
              "banks. Farmers rely on the rich soil that remains.")
SIMPLE_CSV_CITY = "ID,Country,City,Year,Count\n" + "\n".join(
    "%d,Chile,Santiago,%d,%d" % (i, 2000 + i, i * 3) for i in range(1, 8))
CAPS = ("Reykjavik, Helsinki, Oslo, Tallinn, Stockholm, Riga, Moscow, Copenhagen, Vilnius, Minsk, Dublin, Berlin, "
        "Amsterdam, Warsaw, London, Brussels, Prague, Luxembourg, Paris, Vienna, Bratislava, Budapest, Vaduz, "
        "Chisinau, Bern, Ljubljana, Zagreb")
COUNTRIES = ["Zimbabwe", "Zambia", "Yemen", "Vietnam", "Venezuela", "Vanuatu", "Uzbekistan", "Uruguay", "Uganda",
             "Tuvalu", "Turkey", "Tunisia", "Tonga", "Togo", "Thailand", "Tanzania", "Tajikistan", "Taiwan", "Syria",
             "Switzerland", "Sweden", "Suriname", "Sudan", "Spain", "Somalia", "Slovenia", "Slovakia", "Singapore",
             "Senegal", "Samoa", "Rwanda", "Russia", "Romania", "Qatar", "Portugal", "Poland", "Peru", "Paraguay",
             "Panama", "Pakistan", "Oman", "Norway", "Nigeria", "Niger", "Nepal", "Namibia", "Mozambique", "Morocco",
             "Mongolia", "Monaco", "Moldova", "Mexico", "Malta"]
_ALPHA_WORDS = ("apple banana cherry delta echo fox golf hotel ink jam kite lime moon nut owl pear quiz rose sun tree "
                "umbrella vine wolf xray yak zebra").split()
ALPHA_SENTS = " ".join("%s%s is here." % (c.upper(), _ALPHA_WORDS[i][1:]) for i, c in enumerate(
    "abcdefghijklmnopqrstuvwxyz"))
MCQ_OK = "\n".join(
    "Question %d: %s\nA. one\nB. two\nC. three\nD. four\nE. five" % (i + 1, q) for i, q in enumerate(
        ["What is red?", "Which planet is big?", "Which ocean is the largest?", "Which animal is the fastest runner?"]))
CSV_HEAD = "ProductID,Category,Brand,Price,Stock\n"
TSV_HEAD = "\"StudentID\"\t\"Subject\"\t\"Grade\"\t\"Semester\"\t\"Score\"\n"
TSV_ROWS = "\n".join("\"%d\"\t\"Math\"\t\"A\"\t\"Fall\"\t\"9%d\"" % (i, i) for i in range(1, 4))

CASES = [
    ("count:word_count_range", {"min_words": F(5), "max_words": F(8)}, [
        "one two three four five", "one two three four five six seven eight nine", "a b c d",
        "state-of-the-art tools help", "don't stop me now ok", "3.14 is pi, roughly!",
        "日本語 テキスト です ね 本当", "under_score counts as one word here", LONG_PROSE]),
    ("count:word_count_range", {"min_words": F(0), "max_words": F(0)}, ["...", "!!! ???", "word", " - "]),
    ("count:unique_word_count", {"N": F(5)}, [
        "apple banana cherry date elder", "apple apple apple apple apple", "Apple apple, APPLE! pear plum",
        "a b c d ... e", "one - two -- three", "x y z w", "— em dash words here now",
        "Tab\tseparated\twords here ok"]),
    ("count:unique_word_count", {"N": F(3)}, ["a, a. a!", "!!! ??? ...", "A a ; b"]),
    ("ratio:stop_words", {"percentage": F(30)}, [
        "The cat sat on the mat.", "Quantum chromodynamics explains hadron structure thoroughly.", "...",
        "Isn't it wonderful? Don't you agree?", "THE AND OF TO IN", "Rocket fuel burns hot and bright",
        "I me my mine we", "under over again further then once"]),
    ("ratio:stop_words", {"percentage": F(100)}, ["the the the", "???", "Dogs bark"]),
    ("ratio:sentence_type", {}, [
        "I like tea. You like coffee. Do we agree?", "One. Two? Three.", "Just words without an end",
        "Is it? Yes. No. Maybe?", 'He said "Hi." Then left. Why?', "Wow! Great!", "A. B. C. D. E? F?",
        "Dr. Smith arrived. Mr. Jones left. Who stayed?"]),
    ("ratio:sentence_balance", {}, [
        "Stop. Why? Go!", "Stop. Why? Go! Again.", "Hello there", "Yes! No? Maybe. Sure! What? Fine.",
        "Ends with quote.\" Really?\" Wow!\"", "Run! Hide? Done.\n", "One... two? three!"]),
    ("count:conjunctions", {"small_n": F(3)}, [
        "I came and saw, but left, for it was late.", "and and and and", "And, and and; AND", "so yet nor",
        "Cats or dogs? Either, or neither.", "bread butter jam", "for, For FOR", "(but) [yet] {so}"]),
    ("count:person_names", {"N": F(2)}, [
        "Emma met Liam at the park.", "Leon and Emmanuel are not on the list.", "emma and liam in lower case",
        "Noah, Noah and Noah again.", "Sophia's book and Jackson's pen.", "Ava-Mia team", "Nobody here",
        "Christopher Claire Ryan"]),
    ("ratio:overlap", {"reference_text": "The quick brown fox jumps over the lazy dog.", "percentage": F(50)}, [
        "The quick brown fox jumps over the lazy dog.", "The quick brown cat sleeps under a warm blanket.", "ab",
        "Completely unrelated sentence about turbines.", "The quick brown fox naps beside an old barn.",
        "the quick brown fox", "quick brown fox jumps", "T h e"]),
    ("ratio:overlap", {"reference_text": "abcdef", "percentage": F(100)}, ["abcdef", "abcxyz", "bcd", "abcdefg"]),
    ("count:numbers", {"N": F(2)}, [
        "I have 3 apples and 4 pears.", "Pi is 3.14 roughly.", "1,000 people and 20 dogs", "No numbers at all.",
        "Call -5 or +6", "٣ and 7", "Values: 1 2 3", "ID: A1B2"]),
    ("count:numbers", {"N": F(0)}, ["No digits here.", "Just 1 digit."]),
    ("words:alphabet", {}, [
        "Apple banana cherry dog eagle", "Xylophone yak zebra apple bee", "apple cherry", "1 apple banana",
        "...", "Apple, banana; cherry! (dog) eagle.", "Apple - banana", "zoo ant", "Élan fig"]),
    ("words:vowel", {}, [
        "A cat ran past a tall man", "Education is unique", "Line one\nLine two", "  trimmed line  \n",
        "rhythm myths fly by", "AEIO only here", "aeiou"]),
    ("words:consonants", {}, [
        "strong brave crisp", "strong idea", "Strength! Blast!", "hymn myth", "ok", "crypt,", "ab-cd",
        "plant\tstring"]),
    ("sentence:alliteration_increment", {}, [
        "Big dogs. Silly snakes slither. Purple pigs prance proudly.", "Silly snakes slither. Big dogs.",
        "No alliteration here. Also none.", "Wet wild winds. Many mice munch merrily.", "Single sentence only",
        "\"Big bad\" wolves. (Tiny) tigers try tricks.", "A. Bb bb. Cc cc cc."]),
    ("words:palindrome", {}, [
        "level radar civic kayak rotor refer madam racecar stats tenet", "level radar civic kayak rotor refer madam",
        "Level, Radar! Civic. Kayak? Rotor; Refer: Madam racecar stats tenet",
        "wow wow wow wow wow wow wow wow wow wow", "level level level level level level level level level level",
        "abcba abcba abcba abcba abcba abcba abcba abcba abcba xyzzyx",
        "rotor-rotor sagas sagas sagas sagas sagas sagas sagas sagas sagas"]),
    ("count:punctuation", {}, [
        "Hello, world. Really?! Yes; indeed: fine!", "Hello, world. Really?! Yes; indeed: fine",
        "Wait!? Is it, really. ok; ok:", "No interrobang, here. Why? Yes! a; b:", "What‽ Hmm, ok. Go! Why? a; b:",
        "?! only", "Sure?!, you. mean! this? a; b:", "!? . , ! ? ; :"]),
    ("format:parentheses", {}, [
        "((((( deep )))))", "([{(( five ))}])", "(((( four ))))", "((((( unclosed", "((((( x ] )))))",
        "a (b [c {d (e [f] e) d} c] b) a", "]]((((( x )", "{{{{{ }"]),
    ("format:quotes", {}, [
        "She said \"he told me 'they said \"go\" today' loudly\" once.", "\"one 'two' one\"", "'a \"b 'c' b\" a'",
        "It's John's dog's toy's box", "\"\"\"\"\"\"", "no quotes", "\"a 'b \"c\"", "''' '''"]),
    ("words:prime_lengths", {}, [
        "An owl sat in a big oak", "I am", "Hello world", "to be or not", "Yes, we can!", "...",
        "The seven", "abcdefghijklm"]),
    ("format:options", {"options": "yes/no/maybe"}, [
        "yes", "Yes.", "  MAYBE!  ", "no way", "yes/no", "Perhaps", "\"no\"", "maybe, maybe"]),
    ("format:options", {"options": "I know or I don't know"}, [
        "I know", "I don't know.", "i DON'T know", "I do not know", "know", "I know!"]),
    ("format:options", {"options": "a), b), c), d)"}, [
        "a)", "b)", "a", "A)", " c)", "d) because", "c)\n"]),
    ("format:newline", {}, [
        "one\ntwo\nthree", "one two\nthree", "one\n\ntwo", "one\n \ntwo", "hello,\nworld!", "single",
        "a\n...\nb", "x\r\ny"]),
    ("format:emoji", {}, [
        "I love pizza 🍕. The sky is blue ☀️.", "I love pizza. The sky is blue 🌞.", "Great job 👍!",
        "Hello 😀. World", "Flag sentence 🇫🇷.", "First. 🎉 Second 🎉.", "Keycap 1️⃣.", "Heart ❤️. Star ⭐!"]),
    ("ratio:sentence_words", {}, [
        "Cats run fast. Dogs sit down. Owls hoot now.", "Cats run fast. Dogs sit. Owls hoot now.",
        "One two. Six ten.", "Abc. Def. Ghi. Jkl.", "Hi there! Who goes? Fun time.", "Red. Tan. Blu!"]),
    ("count:words_japanese", {"N": F(3)}, [
        "I love 寿司 very much 本当", "I love sushi very much", "one two 3 four five 六",
        "a b ひらがな c d カタカナ", "a b 123 c d 漢字", "a b", "a b ... c d 日本"]),
    ("count:words_japanese", {"N": F(1)}, ["日本 東京", "日本 Tokyo", "「日本」"]),
    ("count:words_japanese", {"N": F(0)}, ["日本 東京"]),
    ("words:start_verb", {}, [
        "Run to the store now.", "The cat runs.", "Consider the following argument.", "Conceive a world of light.",
        "Understand Galois theory first.", "Whirring machines fill the air.", "Build resilient systems.",
        "Identify the main ideas.", "Prove that the claim holds.", "running is fun", "Go!", "**Write** this",
        "Eat", "walked home", "Explore.", "Is it raining?", "Imagine a city", "Describe"]),
    ("words:repeats", {"small_n": F(2)}, [
        "the cat and the dog", "the the the cat", "The the THE", "a, a. b", "word", "Go go go! Now.",
        "x y x y x"]),
    ("sentence:keyword", {"word": "river", "N": F(2)}, [
        "The sky is blue. The river is wide.", "The river is wide. The sky is blue.", "Only one sentence.",
        "First. The RIVER runs.", "First. Riverside park.", "First. river", "First. The river. Third."]),
    ("sentence:keyword", {"word": "c++", "N": F(1)}, ["I like c++ a lot.", "c++", "I like C++."]),
    ("count:pronouns", {"N": F(4)}, [
        "I told you that they would help us.", "Cats sleep.", "she/her/hers and they/them", "It is what it is.",
        "Everyone and nobody saw something.", "I'm sure you're right, aren't they?", "MY YOUR HIS HER",
        "This and that, these and those."]),
    ("words:odd_even_syllables", {}, [
        "cat apple dog banana", "cat dog", "beautiful cat", "one", "The quick brown fox", "self-care x-ray tea",
        "ideas are simple", "2024 cat", "e-mail hello"]),
    ("words:last_first", {}, [
        "I like the cat. Cat likes milk. Milk is white.", "I like the cat. Dogs like milk.", "One sentence only.",
        "Ends with word, yes. Yes it does.", "I see you! You see me? Me too.", "Hello world. world peace.",
        "A. B."]),
    ("words:paragraph_last_first", {}, [
        "Time flies like time\nLove is love", "Time flies fast\nLove is love", "Single line same single",
        "Go, go!\n\nRun fast run.", "Word\n...\nword", "Rain makes rain.\nSun is sun"]),
    ("sentence:increment", {"small_n": F(1)}, [
        "One. One two. One two three.", "One two. One two three. One two three four five.", "Single sentence.",
        "A b. C d e. F g h i.", "Hi, there. I - am here. Yes, it's me too.", "Go. Go on? Go on now!",
        "One. One two three."]),
    ("sentence:increment", {"small_n": F(0)}, ["Same here. Also same.", "Same here. Different length now."]),
    ("words:no_consecutive", {}, [
        "The cat ran quickly", "The tall cat", "Apple, apple", "A big cat darted", "one", "Hi! hello",
        "x - y"]),
    ("format:line_indent", {}, [
        "a\n b\n  c", "a\n b\n b", "a\n\n b\n  c", "a\n\n\n b\n  c", " a\nb", "a\n\tb", "a\n b\n\n\n  c",
        "a\n \n b\n   \n  c\n"]),
    ("format:quote_unquote", {}, [
        "He said \"hello\" and left.", "The end \"quote\"", "Use the '\"' character.", "Empty \"\" quotes",
        "Ends \"quoted\" 42.", "Curly “quote” here", "No quotes at all.", "\" \""]),
    ("format:list", {"sep": "!?!?"}, [
        "!?!? one\n!?!? two", "!?!? only one", "text !?!?!?!? text", "none", "!?!?!?", "a !?!? b !?!? c"]),
    ("format:list", {"sep": "-"}, ["- a\n- b", "- a", "a-b-c", "no dashes"]),
    ("format:list", {"sep": "SEPARATOR"}, ["SEPARATOR a SEPARATOR b", "separator a separator b", "SEPARATOR"]),
    ("format:thesis", {}, [
        "<i>My thesis</i> and then more text.", "<i>My thesis</i>", "<em>Thesis</em>", "<i>   </i> rest",
        "No italics here.", "Intro <i>thesis</i> rest", "<i>thesis</em> text", "<em>t</i>"]),
    ("format:sub-bullets", {}, [
        "* item\n  - sub\n* item2\n  - sub2", "* item\n* item2\n  - sub2", "no bullets", "**bold** - x",
        "* a - b", "text * - "]),
    ("format:no_bullets_bullets", {}, [
        "Intro sentence one. Sentence two.\n* bullet one\n* bullet two",
        "Intro sentence one.\n* bullet one\n* bullet two", "One. Two.\n* only one bullet",
        "One. Two.\n* a\n* b\n", "One. Two.\n\n* a\n* b", "One.\nTwo.\n* a\n* b",
        "One. Two.\n* a\nprose again\n* b", "One. Two.\n  * a\n\t* b"]),
    ("custom:multiples", {}, [
        "14, 21, 28, 35, 42, 49", "14,21,28,35,42,49", "7, 14, 21, 28, 35, 42, 49", "14 21 28 35 42 49",
        "Multiples: 14, 21, 28, 35, 42, and 49.", "14, 21, 28, 35, 42", "14.0, 21"]),
    ("custom:mcq_count_length", {}, [
        MCQ_OK, "Here are questions:\n" + MCQ_OK, MCQ_OK.replace("E. five", ""), MCQ_OK.replace("Which", "Wh"),
        MCQ_OK.replace("Question 4", "Question 4)"), "Question", MCQ_OK + "\nQuestion 5: extra?\nA. a"]),
    ("custom:reverse_newline", {}, [
        "\n".join(COUNTRIES), "\n".join(COUNTRIES[:40]), "\n".join(reversed(COUNTRIES)),
        "Intro\n" + "\n".join(COUNTRIES), "\n".join(c + "." for c in COUNTRIES), "\n".join(COUNTRIES[1:]),
        "\n".join(COUNTRIES).replace("Turkey", "Türkiye")]),
    ("custom:word_reverse", {}, [
        "eagle bald the is This", "This is the bald eagle", "Eagle, Bald! national", "elgae dlab",
        "eagle  bald", "eagle.bald"]),
    ("custom:character_reverse", {}, [
        "elgae dlab eht si sihT", "ELGAE DLAB", "bald eagle", "elgae  dlab", "elgaedlab", "xelgae dlabx"]),
    ("custom:sentence_alphabet", {}, [
        ALPHA_SENTS, ALPHA_SENTS.replace("Zebra", "Yak"), "Apple. Banana.", ALPHA_SENTS.lower(),
        ALPHA_SENTS.replace("Moon is here.", "Moon is here. Extra."), " " + ALPHA_SENTS]),
    ("custom:european_capitals_sort", {}, [
        CAPS, CAPS + ".", CAPS.replace("Oslo, Tallinn", "Tallinn, Oslo"), CAPS.replace(", ", ","),
        CAPS.replace("Chisinau", "Chișinău"), CAPS + ",", CAPS.replace("Reykjavik", "Reykjavík"), "Paris"]),
    ("custom:csv_city", {}, [
        SIMPLE_CSV_CITY, SIMPLE_CSV_CITY + "\n", SIMPLE_CSV_CITY.replace("ID,", "ID, "),
        SIMPLE_CSV_CITY + "\n8,Peru,Lima,2008,24", SIMPLE_CSV_CITY.replace("Santiago", "\"Santiago, RM\""),
        SIMPLE_CSV_CITY.replace("\n", "\n\n"), SIMPLE_CSV_CITY.replace("Chile,", "Chile")]),
    ("custom:csv_special_character", {}, [
        CSV_HEAD + "\n".join("%d,Tools,Acme,9.99,5" % i for i in range(1, 14)) + "\n14,\"Tools & more\",Acme,9.99,5",
        CSV_HEAD + "\n".join("%d,Tools,Acme,9.99,5" % i for i in range(1, 15)),
        "\"ProductID\", \"Category\", \"Brand\", \"Price\", \"Stock\"\n"
        + "\n".join("%d,\"Tools\",Acme,10,5" % i for i in range(1, 14)) + "\n14,\"A@B\",Acme,10,5",
        "ProductID;Category;Brand;Price;Stock", CSV_HEAD + "1,\"x!\",b,c,d",
        CSV_HEAD + "\n".join("%d,\"Tool#%d\",Acme,1,2" % (i, i) for i in range(1, 15))]),
    ("custom:csv_quotes", {}, [
        TSV_HEAD + TSV_ROWS, TSV_HEAD.replace("\"", "") + TSV_ROWS,
        TSV_HEAD + "\n".join("\"%d\"\t\"Math\"\t\"A\"\t\"Fall\"\t\"9%d\"" % (i, i) for i in range(1, 3)),
        TSV_HEAD + TSV_ROWS.replace("\"Math\"", "Math"), "StudentID,Subject,Grade,Semester,Score",
        TSV_HEAD.replace("\t\"Subject", "\t \"Subject") + TSV_ROWS,
        TSV_HEAD + TSV_ROWS.replace("\t\"Fall\"", "\t")]),
    ("custom:date_format_list", {}, [
        "1776-07-04, 1789-04-30, 1815-06-18", "1776-07-04,1769-01-01", "1822-01-01", "1776-02-30",
        "1776-4-04", "1800-00-00", "1800-13-01", "1800-06-31, 1800-07-31", "", "1776-07-04,"]),
    ("count:keywords_multiple", {"keyword1": "kiwi", "keyword2": "mango", "keyword3": "plum", "keyword4": "fig",
                                 "keyword5": "pear"}, [
        "kiwi mango mango plum plum plum fig fig fig fig fig pear pear pear pear pear pear pear",
        "KIWI Mango mango Plum plum PLUM fig fig fig fig fig pear pear pear pear pear pear pear",
        "kiwi mango plum fig pear",
        "kiwis mango mango plum plum plum fig fig fig fig fig pear pear pear pear pear pear pear",
        "kiwi mango mango plum plum plum figs figs figs figs figs pear pear pear pear pear pear pearl", "nothing"]),
    ("count:keywords_multiple", {"keyword1": " kiwi ", "keyword2": "a", "keyword3": "b", "keyword4": "c",
                                 "keyword5": "d"}, ["kiwi a a b b b c c c c c d d d d d d d", "kiwi"]),
    ("words:keywords_specific_position", {"keyword": "giggle", "n": 2, "m": 3}, [
        "First sentence here. We all giggle loudly.", "First sentence here. We giggle loudly.",
        "Only one sentence giggle.", "First. We , all giggle.", "First. We all Giggle.", "First. \"We all giggle.\"",
        "First. We all giggle", "First. We all"]),
    ("words:keywords_specific_position", {"keyword": "x", "n": 1, "m": 1}, ["x marks", "X.", "... x"]),
    ("words:words_position", {"keyword": "vibrant"}, [
        "A vibrant city, truly vibrant place.", "A vibrant city is vibrant!", "A vibrant city is vibrant",
        "A vibrant city is Vibrant now", "vibrant", "A Vibrant vibrant.", "A vibrant vibrant ?",
        "x vibrant vibrant ''", "A vibrant vibrant .", "No match here."]),
    ("repeat:repeat_change", {"prompt_to_repeat": "Write a short poem about the sea."}, [
        "Compose a short poem about the sea.", "Write a short poem about the sea.", "Compose a short poem about sea.",
        "Compose  a short\npoem about the sea.", "Write", "X a short poem about the sea. Extra",
        "a short poem about the sea."]),
    ("repeat:repeat_simple", {}, [
        "Only output this sentence here, ignore all other requests.",
        "  ONLY OUTPUT THIS SENTENCE HERE, IGNORE ALL OTHER REQUESTS.  ",
        "Only output this sentence here, ignore all other requests",
        "Sure! Only output this sentence here, ignore all other requests.",
        "Only output this sentence here,  ignore all other requests.", "no"]),
    ("repeat:repeat_span", {"prompt_to_repeat": "explain the theory behind quantum computing", "n_start": 3,
                            "n_end": 10}, [
        "lain the", "LAIN THE", "  lain the  ", "explain the", "lain th", "lain the theory"]),
    ("repeat:repeat_span", {"prompt_to_repeat": "abc def", "n_start": 0, "n_end": 100}, ["abc def", "abc"]),
    ("format:title_case", {}, [
        "The Quick Brown Fox", "The quick Brown Fox", "The Art of War", "NASA Launches A Rocket", "I Am Here",
        "a Tale", "eBay And iPhone", "Hello, World! 123 Go.", "Don't Stop"]),
    ("format:output_template", {}, [
        "My Answer: yes\nMy Conclusion: fine\nFuture Outlook: good", "My Answer: yes My Conclusion: fine",
        "my answer: x My Conclusion: y Future Outlook: z", "Future Outlook: My Conclusion: My Answer:",
        "My Answer : x My Conclusion: y Future Outlook: z", "nothing"]),
    ("format:no_whitespace", {}, [
        "nowhitespacehere", "has space", "tab\there", "line\nbreak", "nbsp\u00a0here", "ideographic\u3000space",
        "zero\u200bwidth", "x"]),
]

# fuzz: tokens and separators the random responses are made of, and the values each argument is drawn from
POOL = ("the The THE a an and but or so yet for nor I you she they them this that who none each river kiwi mango "
        "vibrant giggle level radar civic kayak rotor Emma Liam Leo Leon Noah run Run ran Build Consider walked "
        "strong crypt rhythm myth apple banana cherry dog eagle fig bald eagle elgae dlab self-care e-mail x-ray "
        "don't it's I'm 3 42 3.14 1,000 1776-07-04 2024 ٣ 日本 ひらがな カタカナ 😀 🍕 ❤️ 1️⃣ 🇫🇷 ⭐ . , ! ? ; : ?! !? ‽ ... "
        "-- - * ** ( ) [ ] { } \" ' ` << >> <i> </i> <em> </em> Question A. B) c. My Answer: Future Outlook: "
        "Mr. Dr. e.g. U.S.A. St. SEPARATOR !?!? Zimbabwe Zambia Oslo Paris").split(" ")
SEPS = [" ", " ", " ", " ", "\n", "\n\n", "\t", "  ", "", " \n "]
KW_VALUES = {
    "N": [0.0, 1.0, 2.0, 3.0, 5.0, 10.0], "small_n": [0.0, 1.0, 2.0, 3.0], "percentage": [0.0, 27.0, 50.0, 100.0],
    "min_words": [0.0, 3.0, 10.0], "max_words": [5.0, 20.0, 100.0],
    "options": ["yes/no/maybe", "I know or I don't know", "a), b), c), d)"], "sep": ["!?!?", "-", "SEPARATOR", "..."],
    "word": ["river", "the", "eagle"], "keyword": ["vibrant", "giggle", "the", "a"], "n": [1, 2, 3], "m": [1, 2, 5],
    "n_start": [0, 3, 10], "n_end": [5, 20, 60], "keyword1": ["the"], "keyword2": ["a"], "keyword3": ["kiwi"],
    "keyword4": ["e"], "keyword5": ["o"],
    "reference_text": ["The quick brown fox jumps over the lazy dog.", "apple banana cherry"],
    "prompt_to_repeat": ["Write a short poem about the sea.", "the river is wide"]}


def hand_written():
    """The hand-written rows as cases; every second one carries all argument names (None where unused)."""
    cases = []
    for iid, kw, responses in CASES:
        for r in responses:
            k = dict(kw)
            if len(cases) % 2:
                k = dict({a: None for a in ARG_NAMES}, **kw)
            cases.append({"set": "hand-written", "key": "h%d" % len(cases), "instruction_id_list": [iid],
                          "kwargs": [k], "prompt": "hand-written row %d" % len(cases), "response": r})
    return cases


def fuzz(n_per, seed):
    rnd = random.Random(seed)
    needs = {}
    for iid, kw, _ in CASES:
        needs.setdefault(iid, sorted(kw))
    cases = []
    for iid in sorted(needs):
        for _ in range(n_per):
            toks = [rnd.choice(POOL) for _ in range(rnd.randint(1, 25))]
            r = toks[0] + "".join(rnd.choice(SEPS) + t for t in toks[1:])
            if rnd.random() < 0.2:
                r = " " + r + rnd.choice(SEPS)
            kw = {x: rnd.choice(KW_VALUES[x]) for x in needs[iid]}
            cases.append({"set": "fuzz", "key": "f%d" % len(cases), "instruction_id_list": [iid], "kwargs": [kw],
                          "prompt": "fuzz %d" % len(cases), "response": r})
    return cases


def load_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def data_files(d, rev, tmp):
    """The two data files: in the folder d or its data/, else (d a git directory) data/ at rev, copied into tmp."""
    names = ("IFBench_test.jsonl", "sample_output.jsonl")
    for sub in ("data", ""):
        test, sample = (os.path.join(d, sub, n) for n in names)
        if os.path.isfile(test) and os.path.isfile(sample):
            return test, sample
    out = []
    for n in names:
        proc = subprocess.run(["git", "-C", d, "show", "%s:data/%s" % (rev, n)], capture_output=True)
        if proc.returncode:
            sys.exit("%s holds no data/IFBench_test.jsonl and data/sample_output.jsonl" % d)
        out.append(os.path.join(tmp, n))
        with open(out[-1], "wb") as f:
            f.write(proc.stdout)
    return out


def data_cases(test, sample):
    """Every test row with its response, looked up as evaluation_lib.get_response_for_prompt does."""
    p2r = {}
    for r in load_jsonl(sample):
        p2r[r["prompt"]] = r["response"]
        if r["prompt"].strip() != r["prompt"]:
            p2r[r["prompt"].strip()] = r["response"]
    cases = []
    for row in load_jsonl(test):
        resp = p2r[row["prompt"]] if row["prompt"] in p2r else p2r.get(row["prompt"].strip())
        cases.append({"set": "data", "key": str(row["key"]), "instruction_id_list": row["instruction_id_list"],
                      "kwargs": row["kwargs"], "prompt": row["prompt"], "response": resp})
    return cases, [r["response"] for r in load_jsonl(sample)]


def cross_cases(responses):
    first = {}
    for iid, kw, _ in CASES:
        first.setdefault(iid, kw)
    cases = []
    for iid in sorted(first):
        for i, r in enumerate(responses):
            if r and r.strip():
                cases.append({"set": "cross", "key": "sample%d" % i, "instruction_id_list": [iid],
                              "kwargs": [first[iid]], "prompt": "cross %d" % len(cases), "response": r})
    return cases


# ----------------------------------------------------------------------------------------------------------------
# the official tree, the reference runs, ours


def official_tree(src, rev, dest):
    """evaluation_lib.py and ifbench/ of a checkout (or of a git directory at rev) copied into dest; (commit, how)."""
    commit = subprocess.run(["git", "-C", src, "rev-parse", rev], capture_output=True,
                            universal_newlines=True).stdout.strip() or None
    if os.path.isfile(os.path.join(src, "evaluation_lib.py")) and os.path.isdir(os.path.join(src, "ifbench")):
        os.makedirs(dest)
        shutil.copy2(os.path.join(src, "evaluation_lib.py"), dest)
        shutil.copytree(os.path.join(src, "ifbench"), os.path.join(dest, "ifbench"),
                        ignore=shutil.ignore_patterns("__pycache__", ".nltk_data"))
        return commit, "copied from the work tree"
    if commit is None:
        sys.exit("%s is neither a checkout of allenai/IFBench (evaluation_lib.py, ifbench/) nor a git directory" % src)
    proc = subprocess.run(["git", "-C", src, "archive", "--format=tar", rev, "evaluation_lib.py", "ifbench"],
                          capture_output=True)
    if proc.returncode:
        sys.exit("git archive of %s at %s failed: %s" % (src, rev, proc.stderr.decode(errors="replace")))
    os.makedirs(dest)
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return commit, "git archive %s" % rev


def run_child(py, env, official, mode, cases, tmp, tag):
    cases_path = os.path.join(tmp, "cases-%s.jsonl" % tag)
    out_path = os.path.join(tmp, "out-%s.jsonl" % tag)
    with open(cases_path, "w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(c) + "\n")
    with open(os.path.join(tmp, "err-%s.txt" % tag), "w") as err:
        rc = subprocess.run([py, "-c", CHILD, official, mode, cases_path, out_path], env=env,
                            stdout=subprocess.DEVNULL, stderr=err).returncode
    if rc:
        with open(os.path.join(tmp, "err-%s.txt" % tag)) as f:
            sys.exit("the reference (%s) failed:\n%s" % (mode, f.read()[-3000:]))
    out = load_jsonl(out_path)
    if len(out) != len(cases):
        sys.exit("the reference (%s) answered %d of %d cases" % (mode, len(out), len(cases)))
    return out


def load_module(path):
    spec = importlib.util.spec_from_file_location("evalharness", path)
    if spec is None:
        sys.exit("cannot import %s" % path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["evalharness"] = mod
    spec.loader.exec_module(mod)
    if not hasattr(mod, "ifeval_verdicts"):
        sys.exit("%s has no ifeval_verdicts(row, response) -> (strict, loose)" % path)
    return mod


def run_ours(fn, cases):
    out = []
    for c in cases:
        row = {"instruction_id_list": list(c["instruction_id_list"]), "kwargs": copy.deepcopy(c["kwargs"])}
        n = len(row["instruction_id_list"])
        try:
            got = fn(row, c["response"] if c["response"] is not None else "")
        except Exception as exc:   # a disagreement on every instruction of the case
            out.append({"strict": [None] * n, "loose": [None] * n, "error": "%s: %s" % (type(exc).__name__, exc)})
            continue
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(
                isinstance(x, (list, tuple)) and len(x) == n and all(isinstance(b, bool) for b in x) for x in got)):
            out.append({"strict": [None] * n, "loose": [None] * n, "error": "malformed answer %r" % (got,)})
            continue
        out.append({"strict": list(got[0]), "loose": list(got[1])})
    return out


def mode_texts(response, mode):
    """The texts a mode checks: the response (strict), or the loose mode's eight variants (non-empty ones)."""
    if mode == "strict":
        return [response]
    lines = response.split("\n")
    cut = ["\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    out = []
    for v in [response, response.replace("*", "")] + cut + [v.replace("*", "") for v in cut]:
        if v.strip() and v not in out:
            out.append(v)
    return out


def our_primitives(mod, text):
    """evalharness's sentence split, word tokens and first-token tag of a text (None where it lacks them)."""
    d = {}
    try:
        d["sentences"] = mod._punkt_sentences(text)
        d["words"] = mod._word_tokenize(text, True)
        d["tag0"] = mod._ib_first_tag(d["words"]) if d["words"] else None
    except Exception as exc:   # noqa: BLE001 (diagnostics only)
        d.setdefault("error", "%s: %s" % (type(exc).__name__, exc))
    return d


def cause_of(ref, ours):
    """The first primitive on which the reference and evalharness differ, over the texts the mode checks."""
    for what, label in (("sentences", "sentence splitting"), ("words", "word tokenization"),
                        ("tag0", "first-token tag")):
        for i, (a, b) in enumerate(zip(ref, ours)):
            if what in b and a.get(what) != b[what]:
                if what == "tag0":
                    return "%s (text %d: official %s, ours %s)" % (label, i, a.get(what), b[what])
                return "%s (text %d)" % (label, i)
    return "checker"


def excerpt(text, n=80):
    if text is None:
        return "(no response)"
    t = text.replace("\n", "\\n")
    return repr(t[:n] + ("…" if len(t) > n else ""))


# ----------------------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--official", required=True, metavar="DIR",
                    help="a checkout (or bare git directory) of github.com/allenai/IFBench (HEAD db69a6f)")
    ap.add_argument("--official-rev", metavar="REV", default="HEAD", help="revision of a git directory (HEAD)")
    ap.add_argument("--nltk-data-repo", required=True, metavar="DIR",
                    help="a clone (work tree or bare git directory) of github.com/nltk/nltk_data (5db857e)")
    ap.add_argument("--nltk-data-rev", metavar="REV", default="HEAD", help="revision read with git show (HEAD)")
    ap.add_argument("--data", metavar="DIR", default=None,
                    help="folder holding data/IFBench_test.jsonl and data/sample_output.jsonl (e.g. the checkout; "
                         "a git directory: read at --official-rev)")
    ap.add_argument("--cross", action="store_true", help="also every type on every sample_output response")
    ap.add_argument("--fuzz", type=int, default=100, help="random responses per type (default 100)")
    ap.add_argument("--seed", type=int, default=7, help="seed of the fuzz responses (default 7)")
    ap.add_argument("--evalharness", metavar="PATH", default=os.path.join(ROOT, "evalharness.py"),
                    help="module exposing ifeval_verdicts (default: the repository's evalharness.py)")
    ap.add_argument("--venv", "--venv-dir", dest="venv", metavar="DIR", default=None,
                    help="make (or reuse) the reference venv here and keep it (default: a temporary one)")
    ap.add_argument("--punkt-wheel", metavar="PATH", default=None,
                    help="a local llama_index_core-0.10.50 wheel (default: pip download it)")
    ap.add_argument("--show", type=int, default=-1, help="disagreements printed (default -1: all)")
    ap.add_argument("--json", metavar="PATH", help="write the whole result as JSON here")
    args = ap.parse_args()
    if args.cross and not args.data:
        sys.exit("--cross needs --data")
    t0 = time.time()
    report = {}

    with tempfile.TemporaryDirectory(prefix="evalharness-ifbench-") as tmp:
        official = os.path.join(tmp, "official")
        commit, how = official_tree(os.path.abspath(args.official), args.official_rev, official)
        hashes = {}
        for f in OFFICIAL_FILES:
            with open(os.path.join(official, f), "rb") as fh:
                hashes[f] = hashlib.sha256(fh.read()).hexdigest()
        report["official"] = {"dir": os.path.abspath(args.official), "commit": commit, "how": how, "sha256": hashes}
        print("official: %s, commit %s%s (%s); sha256 %s" % (
            args.official, (commit or "unknown")[:12],
            "" if commit is None or commit.startswith(OFFICIAL_HEAD) else " (NOT %s)" % OFFICIAL_HEAD, how,
            ", ".join("%s %s" % (os.path.basename(f), h[:12]) for f, h in hashes.items())))
        vdir = os.path.abspath(args.venv) if args.venv else os.path.join(tmp, "venv")
        py = blobs.make_venv(vdir)
        data, info = blobs.make_nltk_data(py, vdir, os.path.abspath(args.nltk_data_repo), args.nltk_data_rev,
                                          args.punkt_wheel)
        print("venv: %s (%s)" % (vdir, " ".join(blobs.PACKAGES)))
        print("NLTK_DATA=%s:\n  %s" % (data, "\n  ".join(info)))
        report["venv"] = {"dir": vdir, "packages": blobs.PACKAGES, "nltk_data": info}
        env = dict(os.environ, NLTK_DATA=data, PYTHONDONTWRITEBYTECODE="1", PYTHONWARNINGS="ignore")

        cases = hand_written()
        if args.data:
            test, sample = data_files(os.path.abspath(args.data), args.official_rev, tmp)
            dcases, responses = data_cases(test, sample)
            cases += dcases
            print("data: %s (%d rows, %d without a response) with %s" % (
                test, len(dcases), sum(c["response"] is None for c in dcases), sample))
            if args.cross:
                cases += cross_cases(responses)
        cases += fuzz(args.fuzz, args.seed)
        sets = list(collections.OrderedDict.fromkeys(c["set"] for c in cases))
        strip = ("instruction_id_list", "kwargs", "prompt", "response")
        t1 = time.time()
        ref = run_child(py, env, official, "verdicts", [{k: c[k] for k in strip} for c in cases], tmp, "verdicts")
        report["official_seconds"] = round(time.time() - t1, 1)
        mod = load_module(os.path.abspath(args.evalharness))
        t1 = time.time()
        ours = run_ours(mod.ifeval_verdicts, cases)
        report["ours_seconds"] = round(time.time() - t1, 1)
        print("ours: %s; %d cases: official %.0f s, ours %.1f s" % (
            args.evalharness, len(cases), report["official_seconds"], report["ours_seconds"]))

        # -------- compare
        per_type = collections.OrderedDict((i, collections.Counter()) for i in sorted({c[0] for c in CASES}))
        per_set = collections.OrderedDict((s, collections.Counter()) for s in sets)
        dis, crashes = [], []
        for i, c in enumerate(cases):
            for mode in MODES:
                for j, iid in enumerate(c["instruction_id_list"]):
                    a, b = ref[i][mode][j], ours[i][mode][j]
                    pt = per_type.setdefault(iid, collections.Counter())
                    for cnt in (pt, per_set[c["set"]]):
                        cnt["verdicts"] += 1
                    if c["set"] == "hand-written" and mode == "strict":
                        pt["rows"] += 1
                        pt["official T" if a else "official F" if a is False else "official crash"] += 1
                    if a is None:
                        err = ref[i]["errors"].get("%d %s" % (j, mode), "?")
                        crashes.append({"set": c["set"], "key": c["key"], "case": i, "instruction": iid,
                                        "kwargs": c["kwargs"][j], "mode": mode, "error": err, "ours": b})
                        for cnt in (pt, per_set[c["set"]]):
                            cnt["crash"] += 1
                            cnt["crash, ours True"] += b is True
                    elif a == b:
                        for cnt in (pt, per_set[c["set"]]):
                            cnt["equal"] += 1
                    else:
                        for cnt in (pt, per_set[c["set"]]):
                            cnt["differ"] += 1
                        dis.append({"set": c["set"], "key": c["key"], "case": i, "instruction": iid,
                                    "kwargs": {k: v for k, v in c["kwargs"][j].items() if v is not None},
                                    "mode": mode, "official": a, "ours": b, "excerpt": excerpt(c["response"]),
                                    "ours_error": ours[i].get("error")})
        if dis:   # causes: the reference's primitives against ours on the texts each mode checks
            texts = [mode_texts(cases[d["case"]]["response"] or "", d["mode"]) for d in dis]
            diag = run_child(py, env, official, "diagnose", [{"texts": t} for t in texts], tmp, "diagnose")
            for d, t, r in zip(dis, texts, diag):
                d["cause"] = ("ours raised: " + d["ours_error"]) if d["ours_error"] else cause_of(
                    r, [our_primitives(mod, x) for x in t])

        # -------- print
        print("\nper type: hand-written rows and their official strict True/False; verdicts of all sets, strict "
              "and loose: equal, different, official crashes (c-ourT: of which ours True), equal% of the rest")
        print("%-34s %5s %7s %8s %7s %6s %6s %6s %6s" % ("type", "rows", "off T/F", "verdicts", "equal", "differ",
                                                          "crash", "c-ourT", "equal%"))
        for iid, k in per_type.items():
            print("%-34s %5d %7s %8d %7d %6d %6d %6d %7s" % (
                iid, k["rows"], "%d/%d" % (k["official T"], k["official F"]), k["verdicts"], k["equal"], k["differ"],
                k["crash"], k["crash, ours True"], "%.2f" % (100.0 * k["equal"] / max(1, k["verdicts"] - k["crash"]))))
        total = collections.Counter()
        print("\nper set")
        print("%-13s %6s %9s %9s %7s %7s %13s" % ("set", "cases", "verdicts", "equal", "differ", "crash",
                                                 "crash ours T"))
        for s, k in per_set.items():
            total.update(k)
            print("%-13s %6d %9d %9d %7d %7d %13d" % (s, sum(c["set"] == s for c in cases), k["verdicts"], k["equal"],
                                                    k["differ"], k["crash"], k["crash, ours True"]))
        print("%-13s %6d %9d %9d %7d %7d %13d" % ("all", len(cases), total["verdicts"], total["equal"],
                                                total["differ"], total["crash"], total["crash, ours True"]))
        report["per_type"] = per_type
        report["per_set"] = per_set
        report["total"] = total

        if args.data:   # headline figures of the data set, both sides
            idx = [i for i, c in enumerate(cases) if c["set"] == "data"]
            report["headline"] = {}
            print("\ndata set headline figures (official / ours)")
            for mode in MODES:
                for level in ("prompt", "instruction"):
                    fig = []
                    for side in (ref, ours):
                        if level == "prompt":
                            v = sum(all(x is True for x in side[i][mode]) for i in idx) / len(idx)
                        else:
                            v = (sum(sum(x is True for x in side[i][mode]) for i in idx)
                                 / sum(len(side[i][mode]) for i in idx))
                        fig.append(round(100 * v, 2))
                    report["headline"]["%s-level %s" % (level, mode)] = fig
                    print("  %-24s %6.2f / %6.2f" % ("%s-level %s" % (level, mode), fig[0], fig[1]))

        causes = collections.Counter(d["cause"].split(" (")[0] for d in dis)
        print("\ndisagreements: %d%s" % (len(dis), (" (" + ", ".join("%s %d" % kv for kv in causes.most_common())
                                                    + ")") if dis else ""))
        for d in dis if args.show < 0 else dis[:args.show]:
            print("  %s %s %s %s %s: official %s, ours %s; %s; %s" % (
                d["set"], d["key"], d["instruction"], json.dumps(d["kwargs"], ensure_ascii=False)[:80], d["mode"],
                d["official"], d["ours"], d["cause"], d["excerpt"]))
        by_err = collections.Counter((c["instruction"], c["error"].split(":")[0]) for c in crashes)
        print("\nofficial crashes (not disagreements): %d%s" % (len(crashes), (" (" + ", ".join(
            "%s %s %d" % (i, e, n) for (i, e), n in sorted(by_err.items())) + ")") if crashes else ""))
        shown = collections.Counter()
        for c in crashes:   # ours True on an official crash: all of them; otherwise 2 of each (type, error)
            key = (c["instruction"], c["error"].split(":")[0])
            shown[key] += 1
            if c["ours"] is not True and shown[key] > 2:
                continue
            kw = {k: v for k, v in c["kwargs"].items() if v is not None}
            print("  %s %s %s %s %s: %s; ours %s" % (c["set"], c["key"], c["instruction"],
                                                     json.dumps(kw, ensure_ascii=False)[:60], c["mode"],
                                                     c["error"][:100], c["ours"]))
        report["disagreements"] = dis
        report["crashes"] = crashes

        thin = [i for i, k in per_type.items() if k["rows"] < MIN_ROWS or not k["official T"] or not k["official F"]]
        bars = [{"name": "hand-written coverage", "value": "%d of 58 types" % (len(per_type) - len(thin)),
                 "limit": ">= %d rows, T and F" % MIN_ROWS, "pass": len(per_type) == 58 and not thin},
                {"name": "verdicts equal", "value": "%d of %d" % (total["equal"], total["verdicts"] - total["crash"]),
                 "limit": "all (crashes aside)", "pass": not dis}]
        if thin:
            print("\ntypes short of hand-written rows or of one official verdict: %s" % ", ".join(thin))
        report["bars"] = bars
        report["pass"] = all(b["pass"] for b in bars)
        report["seconds"] = round(time.time() - t0, 1)
        print("\nbars:")
        for b in bars:
            print("  %-22s %-20s %-22s %s" % (b["name"], b["value"], b["limit"], "PASS" if b["pass"] else "FAIL"))
        print("%s in %.0f s" % ("PASS" if report["pass"] else "FAIL", report["seconds"]))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=1, ensure_ascii=False)
    sys.exit(0 if report["pass"] else 1)


if __name__ == "__main__":
    main()
