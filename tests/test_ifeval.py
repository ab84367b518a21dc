"""--task ifeval: every instruction kind of IFEval and IFBench with a reply that follows it and one that does not
(written here from the official definitions, not taken from their data), strict against loose, the language rule,
the rows' validation, and runs end to end against the mock: kill -9 and resume, shards merged, re-scoring without
requests. The agreement with the official checkers on their own data is bench/ifeval_parity.py's."""
import json
import os
import sys
import unittest

from tests.support import CLI, kill_9_then_resume, read_samples, run_cli, start_mock, tempdir

import evalharness as eh

# id -> (kwargs, [replies that follow it], [replies that do not])
IFEVAL_CASES = {
    "punctuation:no_comma": ({}, ["A calm sea. No pause marks here."], ["First, the sea."]),
    "length_constraints:number_words": (
        {"num_words": 5, "relation": "less than"}, ["Two words.", "don't stop"], ["one two three four five"]),
    "length_constraints:number_sentences": (
        {"num_sentences": 3, "relation": "at least"}, ["It rains. It pours. It stops."],
        ["Mr. Smith met Dr. Jones. They talked."]),
    "length_constraints:number_paragraphs": (
        {"num_paragraphs": 2}, ["First part.\n***\nSecond part.", "***\nOne.\n***\nTwo.\n***"],
        ["Only one.", "One.\n******\nTwo."]),
    "length_constraints:nth_paragraph_first_word": (
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "river"},
        ["A start.\n\n\"River, wide and slow.", "Intro.\n\nriver. runs."],
        ["A start.\n\nThe river.", "River first.\n\nriver second.\n\nthird."]),
    "detectable_content:number_placeholders": (
        {"num_placeholders": 2}, ["Dear [name], at [address] and []."], ["Dear [name],\nsee [\nthis]."]),
    "detectable_content:postscript": (
        {"postscript_marker": "P.S."}, ["Body.\n\nP.S. one more thing", "Body ps p. s. later"], ["Body. PS later"]),
    "detectable_format:number_bullet_lists": (
        {"num_bullets": 2}, ["Intro\n* one\n- two", "  * a\n  * b\n**bold** line"],
        ["* one\n* two\n* three", "**only bold**"]),
    "detectable_format:constrained_response": (
        {}, ["Thinking... My answer is maybe."], ["My answer is yes", "my answer is no."]),
    "detectable_format:number_highlighted_sections": (
        {"num_highlights": 2}, ["*one* and **two**", "***both***"], ["*one* and ** **", "*across\nlines*"]),
    "detectable_format:multiple_sections": (
        {"section_spliter": "Section", "num_sections": 2}, ["Section 1\nA\nSection 2\nB", "SubSection 1 and Section 2"],
        ["Section 1\nA\nSection two\nB", "SECTION 1 SECTION 2"]),
    "detectable_format:json_format": (
        {}, ['```json\n{"a": [1, 2]}\n```', '  "just a string"  ', "```JSON\nNaN\n```"],
        ['{"a": 1} trailing', "```python\n{}\n```"]),
    "detectable_format:title": ({}, ["<<My Title>>\ntext"], ["<< >> only", "<<>>", "<<split\ntitle>>"]),
    "combination:two_responses": (
        {}, ["First answer.\n******\nSecond answer.", "******\nA\n******\nB\n******"],
        ["Same.\n******\nSame.", "A\n******\n\n******\nB", "A\n***\nB"]),
    "combination:repeat_prompt": (
        {"prompt_to_repeat": "Write about cats."}, ["  write about CATS. Cats purr."],
        ["Cats purr. Write about cats."]),
    "startend:end_checker": (
        {"end_phrase": "Is there anything else?"}, ['Done. IS THERE ANYTHING ELSE?"  '],
        ["Is there anything else? Done."]),
    "startend:quotation": ({}, ['  "wrapped"\n'], ['"', "“curly”", '"open only']),
    "change_case:capital_word_frequency": (
        {"capital_frequency": 3, "capital_relation": "at least"}, ["DON'T GO NOW"], ["Don't go now, OK?"]),
    "change_case:english_capital": (
        {}, ["THIS REPLY IS WRITTEN IN CAPITAL LETTERS ABOUT THE WEATHER TODAY."],
        ["This reply is not all capitals.",
         "यह हिंदी में लिखा गया एक लंबा उत्तर है जो अंग्रेज़ी नहीं है और बड़े अक्षर नहीं हैं।"]),
    "change_case:english_lowercase": (
        {}, ["this reply is written in lower case letters about the weather today."],
        ["This reply starts with a capital letter."]),
    "language:response_language": (
        {"language": "hi"}, ["आज मौसम बहुत अच्छा है और हम सब साथ में बाज़ार जा रहे हैं।"],
        ["The weather is very nice today and we are all going to the market together."]),
    "keywords:existence": (
        {"keywords": ["cat", "dog"]}, ["A CATegory of DOGS."], ["A cat alone."]),
    "keywords:frequency": (
        {"keyword": "ai", "frequency": 2, "relation": "at least"}, ["She said AI helps."], ["Artificial minds."]),
    "keywords:forbidden_words": (
        {"forbidden_words": ["cat", "dog"]}, ["A category of dogs."], ["The Cat sat.", "a dog's life"]),
    "keywords:letter_frequency": (
        {"letter": "z", "let_frequency": 3, "let_relation": "less than"}, ["Zebra zone."], ["Zig zag Zoo."]),
}

IFBENCH_CASES = {  # IFBench's own, at its HEAD (db69a6f)
    "count:word_count_range": ({"min_words": 3, "max_words": 5}, ["one two three", "a b c d e"],
                               ["a b", "a b c d e f"]),
    "count:unique_word_count": ({"N": 3}, ["Red, red! blue; green"], ["Red red RED. blue"]),
    "ratio:stop_words": ({"percentage": 50}, ["Rivers carry cold water to the sea"], ["It is in the bag"]),
    "ratio:sentence_type": ({}, ["It rains. It pours. Why?", "No marks"], ["It rains. Why? How?"]),
    "ratio:sentence_balance": ({}, ["Go. Why? Stop!"], ["Go. Why? Stop! Wait."]),
    "count:conjunctions": ({"small_n": 3}, ["Tea and cake, And coffee, and, yet"], ["Tea and cake and more and"]),
    "count:person_names": ({"N": 2}, ["Emma met Liam."], ["Emma met Leon.", "emma met liam"]),
    "ratio:overlap": ({"reference_text": "abcdef", "percentage": 50}, ["abcdxy"], ["abcdef", "uvwxyz"]),
    "count:numbers": ({"N": 2}, ["Pi is 3.14 and 1,000 is big and"], ["1 and 2 and 3", "no numbers"]),
    "words:alphabet": ({}, ["Apple banana cherry date", "Yak zebra apple"], ["Apple cherry", "1 banana"]),
    "words:vowel": ({}, ["a cat ate a bee"], ["a cat ate a bee. I do", "one\ntwo"]),
    "words:consonants": ({}, ["strong black church"], ["strong idea"]),
    "sentence:alliteration_increment": ({}, ["No match here. Big bold bear. Silly sam sings songs."],
                                        ["Big bold bear. Silly sam sings songs. Nothing at all."]),
    "words:palindrome": ({}, [" ".join(["level"] * 10)], [" ".join(["level"] * 9), " ".join(["noon"] * 12)]),
    "count:punctuation": ({}, ["Wait?! Yes. No, maybe; ok: fine!?"],
                          ["Wait?! Yes. No, maybe; ok fine", "Yes. No, a; b: c!"]),
    "format:parentheses": ({}, ["((((( deep )"], ["(((( four ))))", "((((( mismatched ]"]),
    "format:quotes": ({}, ["He said \"she said 'they said \"x\" ok' ok\" end"], ["\"one 'two' one\""]),
    "words:prime_lengths": ({}, ["at the house", "no."], ["a cat", "four"]),
    "format:options": ({"options": "yes/no/maybe"}, ["Maybe!", "  NO "], ["yes and no"]),
    "format:newline": ({}, ["One\nword\nper\nline"], ["Two words\nhere", "one\nline two"]),
    "format:emoji": ({}, ["I like tea \U0001F375. You like cake \U0001F370."],
                     ["I like tea. You like cake \U0001F370."]),
    "ratio:sentence_words": ({}, ["Cat sat. Dog ran. Cow ate."], ["Cat sat. Dog ran.", "Cat sat. Dog ran away. Cow."]),
    "count:words_japanese": ({"N": 2}, ["This 日本 is 東京"], ["This word is plain"]),
    "words:start_verb": ({}, ["Write the letter now."], ["The letter is here."]),
    "words:repeats": ({"small_n": 2}, ["Tea, tea and cake"], ["Tea, tea, TEA and cake"]),
    "sentence:keyword": ({"word": "river", "N": 2}, ["Hello there. The River runs."],
                         ["The river runs. Hello there.", "Hello. Rivers run."]),
    "count:pronouns": ({"N": 3}, ["I told him that she knew."], ["The cat told the dog."]),
    "words:odd_even_syllables": ({}, ["cat apple cat apple"], ["cat dog"]),
    "words:last_first": ({}, ["I saw a cat. Cat ran home. Home is warm."], ["I saw a cat. Dogs ran home."]),
    "words:paragraph_last_first": ({}, ["Rain falls on the rain\n\nSun warms the sun."], ["Rain falls on the sun"]),
    "sentence:increment": ({"small_n": 1}, ["One two. One two three. A b c d."], ["One two. One two."]),
    "words:no_consecutive": ({}, ["A big cat dozed"], ["A big bold cat"]),
    "format:line_indent": ({}, ["a\n b\n  c"], ["a\n b\n b", "  a\n b"]),
    "format:quote_unquote": ({}, ["He said \"yes\" today"], ["He said \"\"", "Ends with \"quote\""]),
    "format:list": ({"sep": "SEPARATOR"}, ["a SEPARATOR b SEPARATOR c"], ["a SEPARATOR b"]),
    "format:thesis": ({}, ["<i>The thesis.</i>\nThe rest follows."], ["<i>The thesis.</i>", "No italics at all."]),
    "format:sub-bullets": ({}, ["Intro\n* one\n  - sub\n* two\n  - sub"], ["Intro\n* one\n* two\n  - sub"]),
    "format:no_bullets_bullets": ({}, ["First sentence. Second one.\n* a\n* b"], ["Only one.\n* a\n* b",
                                                                                  "One. Two.\n* a\n* b\n"]),
    "custom:multiples": ({}, ["14, 21, 28, 35, 42, 49"], ["14, 21, 28, 35, 42", "7, 14, 21, 28, 35, 42, 49"]),
    "custom:mcq_count_length": ({}, ["".join("Question %d: %s?\nA. a\nB. b\nC. c\nD. d\nE. e\n" % (i, "w" * (i * 3))
                                             for i in range(1, 5))],
                                ["".join("Question %d: same?\nA. a\nB. b\nC. c\nD. d\nE. e\n" % i
                                         for i in range(1, 5))]),
    "custom:reverse_newline": ({}, ["\n".join(["Zimbabwe"] + ["Z%02d" % (60 - i) for i in range(52)])],
                               ["\n".join(["Zimbabwe"] + ["A%02d" % i for i in range(52)])]),
    "custom:word_reverse": ({}, ["The eagle bald, a sight."], ["The bald eagle."]),
    "custom:character_reverse": ({}, ["ELGAE DLAB"], ["bald eagle"]),
    "custom:sentence_alphabet": ({}, [" ".join("%s word." % chr(65 + i) for i in range(26))],
                                 [" ".join("%s word." % chr(65 + i) for i in range(25))]),
    "custom:european_capitals_sort": ({}, [", ".join(
        "Reykjavik Helsinki Oslo Tallinn Stockholm Riga Moscow Copenhagen Vilnius Minsk Dublin Berlin Amsterdam Warsaw "
        "London Brussels Prague Luxembourg Paris Vienna Bratislava Budapest Vaduz Chisinau Bern Ljubljana Zagreb"
        .split())], ["Reykjavik, Helsinki"]),
    "custom:csv_city": ({}, ["ID,Country,City,Year,Count\n" + "".join("%d,X,Y,2020,%d\n" % (i, i) for i in range(7))],
                        ["ID, Country, City, Year, Count\n" + "".join("%d,X,Y,2020,%d\n" % (i, i) for i in range(7))]),
    "custom:csv_special_character": ({}, ["ProductID,Category,Brand,Price,Stock\n" + "".join(
        "%d,c,b,%d,5\n" % (i, i) for i in range(13)) + "14,\"c!\",b,1,5"],
        ["ProductID,Category,Brand,Price,Stock\n" + "".join("%d,c,b,%d,5\n" % (i, i) for i in range(14))]),
    "custom:csv_quotes": ({}, ["\t".join('"%s"' % h for h in ("StudentID", "Subject", "Grade", "Semester", "Score")) +
                               "".join("\n" + "\t".join('"%d"' % j for j in range(5)) for _ in range(3))],
                          ["StudentID\tSubject\tGrade\tSemester\tScore" +
                           "".join("\n" + "\t".join('"%d"' % j for j in range(5)) for _ in range(3))]),
    "custom:date_format_list": ({}, ["1770-01-31, 1800-02-29"], ["1770-02-30", "1900-01-01", "1770/01/01"]),
    "count:keywords_multiple": ({"keyword1": "a1", "keyword2": "b2", "keyword3": "c3", "keyword4": "d4",
                                 "keyword5": "e5"}, ["a1 b2 b2 c3 c3 c3 " + "d4 " * 5 + "e5 " * 7],
                                ["a1 b2 c3 d4 e5"]),
    "words:keywords_specific_position": ({"keyword": "river", "n": 2, "m": 4},
                                         ["Hi there. I saw the River today."], ["Hi there. I saw river today."]),
    "words:words_position": ({"keyword": "tea"}, ["I tea and tea love ."], ["I like coffee and tea ."]),
    "repeat:repeat_change": ({"prompt_to_repeat": "Tell me a story about rain."}, ["Write me a story about rain."],
                             ["Tell me a story about rain.", "Write me a story about snow."]),
    "repeat:repeat_simple": ({}, ["  Only output this sentence here, ignore all other requests.  "],
                             ["Only output this sentence here."]),
    "repeat:repeat_span": ({"prompt_to_repeat": "abcdefgh", "n_start": 2, "n_end": 4}, ["CDE"], ["cd", "abcde"]),
    "format:title_case": ({}, ["The Quick Brown Fox"], ["The quick Brown Fox", "A tale of Two"]),
    "format:output_template": ({}, ["My Answer: x\nMy Conclusion: y\nFuture Outlook: z"], ["My Answer: x"]),
    "format:no_whitespace": ({}, ["nowhitespacehere"], ["one space", "tab\there"]),
}


def row(ids, kwargs, key=1, prompt="Follow the instructions."):
    return {"key": key, "prompt": prompt, "instruction_id_list": list(ids), "kwargs": list(kwargs)}


class TestInstructions(unittest.TestCase):
    def check(self, cases):
        for iid, (kwargs, good, bad) in cases.items():
            for text in good:
                with self.subTest(iid=iid, follows=text):
                    self.assertEqual(eh.ifeval_verdicts(row([iid], [kwargs]), text)[0], [True])
            for text in bad:
                with self.subTest(iid=iid, breaks=text):
                    self.assertEqual(eh.ifeval_verdicts(row([iid], [kwargs]), text)[0], [False])

    def test_every_ifeval_instruction_with_a_reply_that_follows_it_and_one_that_does_not(self):
        self.assertEqual(set(IFEVAL_CASES), set(eh._IFEVAL_CHECKS))
        self.check(IFEVAL_CASES)

    def test_every_ifbench_instruction_with_a_reply_that_follows_it_and_one_that_does_not(self):
        self.assertEqual(set(IFBENCH_CASES), set(eh._IFBENCH_CHECKS))
        self.check(IFBENCH_CASES)

    def test_loose_passes_what_only_a_variant_follows_and_an_empty_reply_follows_nothing(self):
        r = row(["startend:quotation", "detectable_format:title"], [{}, {}])
        text = 'Sure, here it is:\n"<<Title>>\nquoted text"'  # quoted once the first line goes
        self.assertEqual(eh.ifeval_verdicts(r, text), ([False, True], [True, True]))
        r = row(["punctuation:no_comma"], [{}])
        self.assertEqual(eh.ifeval_verdicts(r, "   \n "), ([False], [False]))
        r = row(["detectable_format:json_format"], [{}])
        self.assertEqual(eh.ifeval_verdicts(r, '{"a": *1*}'), ([False], [True]))  # the `*` removed

    def test_null_arguments_are_ignored_as_the_hub_and_ifbench_files_carry_them(self):
        kw = dict({k: None for k in ("num_words", "relation", "letter")}, num_highlights=1.0)
        self.assertEqual(eh.ifeval_verdicts(row(["detectable_format:number_highlighted_sections"], [kw]), "*x*"),
                         ([True], [True]))


class TestTextAnalysis(unittest.TestCase):
    """Sentences, words and languages as the official code's packages give them: the expected values are what nltk
    3.8.1 (sent_tokenize, word_tokenize, with its English Punkt model) and langdetect 1.0.9 (seed 0) answered on
    these texts (bench/ifeval_parity.py compares them on thousands)."""

    def test_sentences_and_words_as_nltk_splits_them(self):
        self.assertEqual(eh._punkt_sentences("Mr. Smith met Dr. Jones at 5 p.m. on Jan. 3. They talked."),
                         ["Mr. Smith met Dr. Jones at 5 p.m. on Jan. 3.", "They talked."])
        self.assertEqual(eh._punkt_sentences('He said "Hi." Then he left... Did he? Yes!'),
                         ['He said "Hi."', "Then he left... Did he?", "Yes!"])
        self.assertEqual(eh._punkt_sentences("J. R. R. Tolkien wrote it in 1937. It sold well."),
                         ["J. R. R. Tolkien wrote it in 1937.", "It sold well."])
        self.assertEqual(eh._punkt_sentences("Line one\nLine two. Still two."), ["Line one\nLine two.", "Still two."])
        self.assertEqual(eh._punkt_sentences("  \n "), [])
        self.assertEqual(eh._word_tokenize("They'll say can't and gonna, e.g. 'tis fine."),
                         ["They", "'ll", "say", "ca", "n't", "and", "gon", "na", ",", "e.g", ".", "'t", "is", "fine",
                          "."])
        self.assertEqual(eh._word_tokenize("DON'T STOP. I'M HERE!"), ["DO", "N'T", "STOP", ".", "I", "'M", "HERE", "!"])
        # nltk 3.9 (IFBench's pin) makes whitespace runs one space before it splits contractions; 3.8.1 does not
        self.assertEqual(eh._word_tokenize("I can't\tgo", nltk39=True), ["I", "ca", "n't", "go"])
        self.assertEqual(eh._word_tokenize("I can't\tgo"), ["I", "can't", "go"])

    def test_the_language_rule_on_short_mixed_and_capital_texts(self):
        expected = {"Bonjour tout le monde": "fr", "YES": "cy", "etchings": "de",
                    "I love watching \u092c\u0949\u0932\u0940\u0935\u0941\u0921 movies on weekends.": "af",
                    "\u092e\u0941\u091d\u0947 iPhone \u0914\u0930 Samsung \u0926\u094b\u0928\u094b\u0902 "
                    "\u092a\u0938\u0902\u0926 \u0939\u0948\u0902, \u0932\u0947\u0915\u093f\u0928 Google Pixel "
                    "\u0938\u092c\u0938\u0947 \u0905\u091a\u094d\u091b\u093e \u0939\u0948\u0964": "hi",
                    "THE WEATHER IS VERY NICE TODAY AND WE WILL GO OUT.": "en", "1234 5678": None, "": None,
                    "Das ist ein kurzer deutscher Satz \u00fcber das Wetter.": "de",
                    "\u3053\u308c\u306f\u65e5\u672c\u8a9e\u306e\u6587\u3067\u3059\u3002": "ja",
                    "\uc548\ub155\ud558\uc138\uc694 \uc5ec\ub7ec\ubd84": "ko"}
        self.assertEqual({t: eh._detect_language(t) for t in expected}, expected)
        lang = {"language:response_language": {"language": "hi"}}
        for text, follows in (("\u092e\u0941\u091d\u0947 iPhone \u0914\u0930 Samsung \u0926\u094b\u0928\u094b\u0902 "
                               "\u092a\u0938\u0902\u0926 \u0939\u0948\u0902\u0964", True),  # brand names inside
                              ("I love watching \u092c\u0949\u0932\u0940\u0935\u0941\u0921 movies.", False),
                              ("12345", True)):  # no letters: langdetect raises, and the official check passes it
            with self.subTest(text=text):
                self.assertEqual(eh.ifeval_verdicts(row(list(lang), list(lang.values())), text)[0], [follows])
        capital = row(["change_case:english_capital"], [{}])
        self.assertEqual(eh.ifeval_verdicts(capital, "YES")[0], [False])  # Welsh to langdetect: not English
        self.assertEqual(eh.ifeval_verdicts(capital, "THE WEATHER IS VERY NICE TODAY AND WE WILL GO OUT.")[0], [True])
        self.assertEqual(eh.ifeval_verdicts(capital, "2024 \u2014 100%")[0], [False])  # not upper: no cased letter


def e2e_rows():
    """Rows of our own over most of IFEval's kinds the mock can follow (one to three instructions each)."""
    return [
        row(["punctuation:no_comma"], [{}], "r1", "Write a note about rivers with no commas."),
        row(["length_constraints:number_words", "length_constraints:number_paragraphs"],
            [{"num_words": 60, "relation": "at least"}, {"num_paragraphs": 3}], "r2", "Describe a farm in 3 parts."),
        row(["detectable_format:title", "detectable_format:json_format"], [{}, {}], "r3", "A titled JSON reply."),
        row(["change_case:english_capital", "startend:end_checker"], [{}, {"end_phrase": "Any other questions?"}],
            "r4", "Shout about hills."),
        row(["detectable_format:number_bullet_lists", "detectable_format:number_highlighted_sections",
             "keywords:existence"], [{"num_bullets": 4}, {"num_highlights": 2}, {"keywords": ["river", "stone"]}],
            "r5", "Four bullets and two highlights."),
        row(["detectable_content:postscript", "keywords:forbidden_words"],
            [{"postscript_marker": "P.P.S"}, {"forbidden_words": ["river", "hills"]}], "r6", "Add a P.P.S."),
        row(["length_constraints:number_words", "change_case:english_lowercase"],
            [{"num_words": 30, "relation": "less than"}, {}], "r7", "Briefly, in lower case."),
        row(["combination:two_responses", "keywords:letter_frequency"],
            [{}, {"letter": "w", "let_frequency": 2, "let_relation": "less than"}], "r8", "Two answers."),
        row(["combination:repeat_prompt", "punctuation:no_comma"], [{"prompt_to_repeat": "Repeat me first."}, {}],
            "r9", "Repeat me first. Then answer."),
        row(["detectable_format:multiple_sections", "detectable_content:number_placeholders"],
            [{"section_spliter": "SECTION", "num_sections": 3}, {"num_placeholders": 2}], "r10", "Three sections."),
        row(["length_constraints:nth_paragraph_first_word", "detectable_format:constrained_response"],
            [{"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "meadow"}, {}], "r11", "Two paragraphs."),
        row(["keywords:frequency", "change_case:capital_word_frequency"],
            [{"keyword": "stone", "frequency": 3, "relation": "at least"},
             {"capital_frequency": 2, "capital_relation": "at least"}], "r12", "Stone, stone, stone."),
        row(["language:response_language"], [{"language": "kn"}], "r13", "Answer in Kannada."),
    ]


def write_rows(d, rows, name="rows.jsonl"):
    path = os.path.join(d, name)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def run_ifeval(path, mock, out, *extra):
    return run_cli(["run", "--task", "ifeval", "--dataset", path, "--model", "m", "--base-url", mock.url, "--out", out,
                    "--no-progress"] + list(extra))


class TestEndToEnd(unittest.TestCase):
    def test_skill_1_follows_everything_and_skill_0_breaks_every_prompt(self):
        d = tempdir(self)
        path = write_rows(d, e2e_rows())
        ds = eh.IFEvalDataset(path)
        for skill in (1.0, 0.0):
            with self.subTest(skill=skill):
                mock = start_mock(self, ifeval=ds, skill=skill)
                out = os.path.join(d, "s%g" % skill)
                res = run_ifeval(path, mock, out, "--json")
                self.assertEqual(res.returncode, 0, res.stderr)
                f = json.loads(res.stdout)["ifeval"]
                self.assertEqual((f["prompts"], f["instructions"]), (13, 25))
                if skill:
                    self.assertEqual([f[k] for k, _ in eh.IFEVAL_FIGURES], [1.0] * 4, read_samples(out))
                else:
                    self.assertEqual((f["prompt_strict"], f["prompt_loose"]), (0.0, 0.0))
                    self.assertLess(f["instruction_strict"], 1.0)
                self.assertEqual(set(f["by_instruction"]), {i for r in e2e_rows() for i in r["instruction_id_list"]})
        text = run_cli(["report", os.path.join(d, "s1")]).stdout
        self.assertIn("prompt-level strict 1.0000, instruction-level strict 1.0000, prompt-level loose 1.0000, "
                      "instruction-level loose 1.0000 (13 prompts, 25 instructions)", text)
        self.assertRegex(text, r"keywords:existence\s+1\s+1\.000\s+1\.000")
        self.assertEqual(run_cli(["report", os.path.join(d, "s0"), "--html"]).returncode, 0)
        with open(os.path.join(d, "s0", "report.html"), encoding="utf-8") as fh:
            page = fh.read()
        self.assertIn("<td>detectable_format:number_bullet_lists</td><td class=n>1</td><td class=n>0.000</td>", page)
        self.assertIn("missed: detectable_format:title", page)  # a wrong reply, with what it missed

    def test_kill_9_then_resume_each_prompt_once_and_two_shards_merge_to_the_same_verdicts(self):
        d = tempdir(self)
        rows = [dict(r, key="%s-%d" % (r["key"], i), prompt="%s (%d)" % (r["prompt"], i))
                for i in range(4) for r in e2e_rows()]
        path = write_rows(d, rows)
        mock = start_mock(self, ifeval=eh.IFEvalDataset(path), skill=0.6, ttft_s=0.1)
        out = os.path.join(d, "run")
        args = [sys.executable, CLI, "run", "--task", "ifeval", "--dataset", path, "--model", "m", "--base-url",
                mock.url, "--out", out, "--no-progress", "--fixed-concurrency", "2"]
        kill_9_then_resume(self, args, out, 4, [r["key"] for r in rows], 120)
        single = {r["id"]: (r["strict"], r["loose"]) for r in read_samples(out)}
        self.assertTrue(0 < sum(all(s) for s, _ in single.values()) < len(rows))
        sharded = os.path.join(d, "sharded")
        for i in range(2):
            self.assertEqual(run_ifeval(path, mock, sharded, "--shard", "%d/2" % i).returncode, 0)
        res = run_cli(["merge", sharded, "--json"])
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual({r["id"]: (r["strict"], r["loose"]) for r in read_samples(sharded)}, single)
        merged = json.loads(run_cli(["report", sharded, "--json"]).stdout)
        alone = json.loads(run_cli(["report", out, "--json"]).stdout)
        self.assertEqual(merged["ifeval"], alone["ifeval"])

    def test_a_changed_instruction_is_scored_again_from_the_stored_replies_without_requests(self):
        d = tempdir(self)
        rows = e2e_rows()
        path = write_rows(d, rows)
        mock = start_mock(self, ifeval=eh.IFEvalDataset(path), skill=1.0)
        out = os.path.join(d, "run")
        self.assertEqual(run_ifeval(path, mock, out).returncode, 0)
        asked = mock.stats()["counters"]["requests"]
        rows[0]["kwargs"] = [{}]
        rows[0]["instruction_id_list"] = ["startend:quotation"]  # r1's reply is not quoted
        write_rows(d, rows)
        res = run_ifeval(path, mock, out, "--json")
        self.assertEqual(res.returncode, 0, res.stderr)
        recs = {r["id"]: r for r in read_samples(out)}
        self.assertEqual((recs["r1"]["instructions"], recs["r1"]["strict"]), (["startend:quotation"], [False]))
        self.assertIn("rescored_at", recs["r1"])
        self.assertNotIn("rescored_at", recs["r2"])
        self.assertEqual(mock.stats()["counters"]["requests"], asked)
        self.assertEqual(json.loads(res.stdout)["ifeval"]["prompt_strict"], round(12 / 13, 6))


class TestRows(unittest.TestCase):
    def test_an_unknown_instruction_or_unusable_argument_is_one_line_naming_the_row(self):
        d = tempdir(self)
        mock = start_mock(self)
        for bad, expected in (
                (row(["punctuation:no_semicolon"], [{}]),
                 "rows.jsonl:2: field 'instruction_id_list' names 'punctuation:no_semicolon', which is not an IFEval "
                 "or IFBench"),
                (row(["length_constraints:number_words"], [{"num_words": 5, "relation": "at most"}]),
                 "rows.jsonl:2: field 'kwargs' of length_constraints:number_words: 'relation' must be 'less than' or "
                 "'at least', got 'at most'"),
                (row(["keywords:existence"], [{"keywords": ["(unclosed"]}]), "'keywords' holds '(unclosed', not a "
                                                                             "regular expression"),
                (row(["count:words_japanese"], [{"N": 0}]), "'N' must be >= 1, got 0"),
                (row(["punctuation:no_comma", "startend:quotation"], [{}]), "field 'kwargs' must be a list of 2 "
                                                                           "objects"),
                ({"key": 3, "prompt": "x", "instruction_id_list": ["punctuation:no_comma"]},
                 "field 'kwargs' is missing")):
            with self.subTest(expected=expected):
                path = write_rows(d, [row(["punctuation:no_comma"], [{}], key=1), bad])
                res = run_ifeval(path, mock, os.path.join(d, "out"))
                self.assertEqual(res.returncode, 2, res.stderr)
                last = res.stderr.strip().splitlines()[-1]
                self.assertIn(expected, last)
                self.assertFalse(os.path.exists(os.path.join(d, "out")))

    def test_the_hubs_parquet_with_every_argument_null_where_unused_and_ifbench_string_keys(self):
        from tests.parquetbed import write_parquet
        d = tempdir(self)
        names = ("num_words", "relation", "num_highlights", "keywords")
        def kw(**given):
            return dict({n: None for n in names}, **given)
        rows = [{"key": 1000, "prompt": "Say hi briefly.", "instruction_id_list": ["length_constraints:number_words"],
                 "kwargs": [kw(num_words=50, relation="less than")]},
                {"key": 1001, "prompt": "Highlight one part; mention tea.",
                 "instruction_id_list": ["detectable_format:number_highlighted_sections", "keywords:existence"],
                 "kwargs": [kw(num_highlights=1), kw(keywords=["tea"])]}]
        path = write_parquet(os.path.join(d, "train-00000-of-00001.parquet"), rows)
        ds = eh.IFEvalDataset(path)
        self.assertEqual([r.id for r in ds.items], ["1000", "1001"])
        self.assertEqual(ds.items[1].kwargs, ({"num_highlights": 1}, {"keywords": ["tea"]}))
        ifbench = write_rows(d, [{"key": "7", "prompt": "p", "instruction_id_list": ["count:numbers"],
                                  "kwargs": [{"N": 3.0, "keyword": None}]}], "ifbench.jsonl")
        self.assertEqual(eh.IFEvalDataset(ifbench).items[0].kwargs, ({"N": 3.0},))
        res = run_cli(["run", "--task", "qa", "--dataset", ifbench, "--model", "m", "--base-url",
                       start_mock(self).url, "--out", os.path.join(d, "qa")])
        self.assertEqual(res.returncode, 2)
        self.assertIn("run it with --task ifeval", res.stderr)
