"""Datasets: load_dataset(), Dataset (validate / iter_items), demo_dataset(), and the CLI's handling of bad input."""
import json
import os
import re
import types
import unittest

from tests.support import eh, read_samples, run_cli, start_mock, tempdir, write_jsonl


def row(rid="a", **fields):
    out = {"id": rid, "prompt": "What is it?", "answer": "x"}
    out.update(fields)
    return out


FORMATS_SCORER = {"gsm8k": "numeric", "mmlu": "choice", "mmlu-pro": "choice", "gpqa": "choice", "math": "math",
                  "aime": "math", "arc": "choice"}


class _DatasetCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempdir(self)

    def jsonl(self, rows, name="qa.jsonl") -> str:
        return write_jsonl(os.path.join(self.dir, name), rows)

    def text(self, text, name) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        return path

    def assertDatasetError(self, path, *needles, **kw):
        """load_dataset(path) raises DatasetError whose message contains every needle; returns the message."""
        with self.assertRaises(eh.DatasetError) as cm:
            eh.load_dataset(path, **kw)
        msg = str(cm.exception)
        for needle in needles:
            self.assertIn(needle, msg)
        self.assertNotIn("\n", msg)
        return msg


class TestLoadDataset(_DatasetCase):
    def test_jsonl_loads_all_rows_when_valid(self):
        path = self.jsonl([row("a"), row("b", scorer="numeric", answer="3"), row("c", choices=["x", "y"], answer="A")])
        ds = eh.load_dataset(path)
        self.assertEqual((ds.count, ds.ids, ds.name), (3, {"a", "b", "c"}, "qa.jsonl"))
        self.assertEqual(len(ds.sha256), 64)

    def test_json_list_loads_all_rows_when_valid(self):
        path = self.text(json.dumps([row("a"), row("b")], indent=2), "qa.json")
        ds = eh.load_dataset(path)
        self.assertEqual((ds.count, ds.ids), (2, {"a", "b"}))
        self.assertEqual([it.id for it in ds.iter_items()], ["a", "b"])

    def test_integer_ids_become_strings_when_loaded(self):
        ds = eh.load_dataset(self.jsonl([row(1), row(2)]))
        self.assertEqual(ds.ids, {"1", "2"})

    def test_malformed_json_line_is_named_when_blank_lines_precede_it(self):
        path = self.jsonl([row("a"), "", "   ", row("b"), '{"id": "c", "prompt": '])
        msg = self.assertDatasetError(path, "qa.jsonl:5:", "invalid JSON")
        self.assertNotIn("qa.jsonl:3", msg)

    def test_row_line_number_counts_blank_lines_when_row_is_bad(self):
        path = self.jsonl([row("a"), "", {"id": "b", "prompt": "p"}])
        self.assertDatasetError(path, "qa.jsonl:3:", "'answer'", "missing")

    def test_empty_id_is_rejected_when_blank_string(self):
        self.assertDatasetError(self.jsonl([row("  ")]), "qa.jsonl:1:", "field 'id'")

    def test_duplicate_id_names_both_lines_when_repeated(self):
        path = self.jsonl([row("a"), row("b"), "", row("a")])
        msg = self.assertDatasetError(path, "qa.jsonl:4:", "field 'id'", "'a'", "qa.jsonl:1")
        self.assertIn("duplicates", msg)

    def test_missing_answer_names_field_when_absent(self):
        self.assertDatasetError(self.jsonl([row("a"), {"id": "b", "prompt": "p"}]),
                                "qa.jsonl:2:", "field 'answer'", "missing")

    def test_unknown_scorer_lists_valid_scorers_when_named(self):
        msg = self.assertDatasetError(self.jsonl([row("a", scorer="fuzzy")]), "qa.jsonl:1:", "field 'scorer'", "'fuzzy'")
        for name in ("choice", "exact", "normalized", "numeric", "regex"):
            self.assertIn(name, msg)

    def test_unknown_default_scorer_is_config_error_when_given(self):
        with self.assertRaises(eh.ConfigError) as cm:
            eh.load_dataset(self.jsonl([row("a")]), default_scorer="fuzzy")
        self.assertIn("'fuzzy'", str(cm.exception))
        self.assertIn("normalized", str(cm.exception))

    def test_choice_answer_rejected_when_letter_out_of_range(self):
        path = self.jsonl([row("a", scorer="choice", choices=["yes", "no"], answer="C")])
        self.assertDatasetError(path, "qa.jsonl:1:", "field 'answer'", "'C'", "A, B")

    def test_choice_answer_rejected_when_neither_letter_nor_choice_text(self):
        path = self.jsonl([row("a", choices=["yes", "no"], answer="maybe")])
        self.assertDatasetError(path, "qa.jsonl:1:", "field 'answer'", "'maybe'")

    def test_choice_scorer_requires_choices_when_none_given(self):
        self.assertDatasetError(self.jsonl([row("a", scorer="choice", answer="A")]), "qa.jsonl:1:", "field 'choices'")

    def test_choice_letter_is_upper_cased_when_given_lower_case(self):
        ds = eh.load_dataset(self.jsonl([row("a", choices=["yes", "no"], answer=" b ")]))
        self.assertEqual(next(ds.iter_items()).answer, "B")

    def test_choices_are_rendered_into_the_prompt_when_present(self):
        ds = eh.load_dataset(self.jsonl([row("a", prompt="Pick one.", choices=["yes", "no"], answer="A")]))
        content = next(ds.iter_items()).messages[-1]["content"]
        self.assertTrue(content.startswith("Pick one."))
        self.assertIn("A. yes\nB. no", content)

    def test_invalid_regex_names_pattern_when_uncompilable(self):
        self.assertDatasetError(self.jsonl([row("a", scorer="regex", pattern="(")]), "qa.jsonl:1:", "field 'pattern'",
                                "regular expression")

    def test_regex_without_group_names_pattern_when_no_capture(self):
        self.assertDatasetError(self.jsonl([row("a", scorer="regex", pattern=r"ANSWER:\s*\w+")]), "qa.jsonl:1:",
                                "field 'pattern'", "group")

    def test_prompt_and_messages_together_are_rejected_when_both_given(self):
        path = self.jsonl([row("a", messages=[{"role": "user", "content": "hi"}])])
        self.assertDatasetError(path, "qa.jsonl:1:", "'prompt'", "'messages'")

    def test_neither_prompt_nor_messages_is_rejected_when_both_absent(self):
        self.assertDatasetError(self.jsonl([{"id": "a", "answer": "x"}]), "qa.jsonl:1:", "'prompt'", "'messages'")

    def test_messages_must_end_with_user_when_last_is_assistant(self):
        msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
        self.assertDatasetError(self.jsonl([{"id": "a", "answer": "x", "messages": msgs}]), "qa.jsonl:1:",
                                "field 'messages'", "user")

    def test_messages_item_with_bad_role_is_named_when_invalid(self):
        msgs = [{"role": "robot", "content": "hi"}, {"role": "user", "content": "hi"}]
        self.assertDatasetError(self.jsonl([{"id": "a", "answer": "x", "messages": msgs}]), "qa.jsonl:1:",
                                "field 'messages'", "item 0")

    def test_messages_are_kept_in_order_when_valid(self):
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
        ds = eh.load_dataset(self.jsonl([{"id": "a", "answer": "x", "messages": msgs}]))
        self.assertEqual(list(next(ds.iter_items()).messages), msgs)

    def test_numeric_answer_without_number_is_rejected_when_scorer_numeric(self):
        self.assertDatasetError(self.jsonl([row("a", scorer="numeric", answer="many")]), "qa.jsonl:1:",
                                "field 'answer'", "'many'", "numeric")

    def test_negative_tolerance_is_rejected_when_given(self):
        self.assertDatasetError(self.jsonl([row("a", scorer="numeric", answer="1", tolerance=-1)]), "qa.jsonl:1:",
                                "field 'tolerance'")

    def test_non_object_row_is_rejected_when_a_list(self):
        self.assertDatasetError(self.jsonl([row("a"), [1, 2]]), "qa.jsonl:2:", "JSON object")

    def test_json_list_reports_line_of_bad_item_when_items_span_lines(self):
        text = ('[\n'
                '  {"id": "a", "prompt": "p", "answer": "x"},\n'
                '  {"id": "b", "prompt": "p", "answer": "x"},\n'
                '\n'
                '  {"id": "c",\n'
                '   "prompt": "p"}\n'
                ']\n')
        self.assertDatasetError(self.text(text, "qa.json"), "qa.json:5:", "field 'answer'", "missing")

    def test_json_list_reports_duplicate_with_both_lines_when_repeated(self):
        text = '[{"id": "a", "prompt": "p", "answer": "x"},\n\n {"id": "a", "prompt": "p", "answer": "y"}]'
        self.assertDatasetError(self.text(text, "qa.json"), "qa.json:3:", "qa.json:1", "field 'id'")

    def test_json_list_reports_line_of_syntax_error_when_malformed(self):
        text = '[\n {"id": "a", "prompt": "p", "answer": "x"},\n {"id": "b", "prompt": "p", "answer": }\n]'
        self.assertDatasetError(self.text(text, "qa.json"), "qa.json:3:", "invalid JSON")

    def test_json_object_instead_of_list_is_rejected_when_it_holds_no_list_of_rows(self):
        self.assertDatasetError(self.text(json.dumps(row("a")), "qa.json"), "qa.json:1:", "list", "holds none")

    def test_empty_dataset_is_rejected_when_no_rows(self):
        self.assertDatasetError(self.text("\n\n", "qa.jsonl"), "no rows")
        self.assertDatasetError(self.text("[]", "qa.json"), "no rows")

    def test_missing_file_is_rejected_when_path_does_not_exist(self):
        self.assertDatasetError(os.path.join(self.dir, "nope.jsonl"), "nope.jsonl", "does not exist")

    def test_other_extension_is_rejected_when_not_json_jsonl_csv_or_tsv(self):
        self.assertDatasetError(self.text(json.dumps(row("a")) + "\n", "qa.txt"), "qa.txt", ".jsonl, .json, .csv, .tsv")


class TestLayouts(_DatasetCase):
    """The layouts people export benchmarks in (columns as the public dataset cards have them, rows our own)."""

    def items(self, path, **kw):
        return list(eh.load_dataset(path, **kw).iter_items())

    def test_question_answer_rows_without_ids_load_with_stable_content_ids(self):
        rows = [{"question": "What is 2+2?", "answer": "4"}, {"question": "Capital of France?", "answer": "Paris"},
                {"question": "What is 2+2?", "answer": "4"}]
        first = self.items(self.jsonl(rows))
        self.assertEqual([i.messages[-1]["content"] for i in first], [r["question"] for r in rows])
        ids = [i.id for i in first]
        self.assertEqual(len(set(ids)), 3)
        self.assertTrue(all(re.match(r"^row-[0-9a-f]{12}(-2)?$", i) for i in ids), ids)
        self.assertEqual(ids[2], ids[0] + "-2")  # the same content twice: numbered in file order
        again = self.items(self.jsonl([rows[1], rows[0]], name="reordered.jsonl"))
        self.assertEqual({i.id: i.answer for i in again}, {ids[1]: "Paris", ids[0]: "4"})

    def test_aliases_read_prompt_and_answer_from_the_usual_names(self):
        for prompt_key, answer_key in (("problem", "solution"), ("input", "target"), ("query", "gold"),
                                       ("question", "reference"), ("prompt", "label")):
            (item,) = self.items(self.jsonl([{prompt_key: "Q?", answer_key: "A"}], name=prompt_key + ".jsonl"),
                                 format="none")  # problem + solution is also the MATH layout
            self.assertEqual((item.messages[-1]["content"], item.answer), ("Q?", "A"), prompt_key)

    def test_a_missing_answer_names_the_aliases_the_rows_columns_and_the_field_option(self):
        msg = self.assertDatasetError(self.jsonl([{"prompt": "p", "tagret": "x"}]), "qa.jsonl:1:", "'answer'",
                                      "target", "the row has: prompt, tagret", "--field answer=tagret")
        self.assertIn("is missing", msg)
        self.assertDatasetError(self.jsonl([{"prompt": "p", "notes": "x"}], name="b.jsonl"), "b.jsonl:1:",
                                "field 'answer' is missing", "the row has: prompt, notes", "--field answer=COLUMN")

    def test_a_missing_column_names_the_rows_columns_and_the_near_miss(self):
        cases = [({"questoin": "What is 2+2?", "answer": "4"}, {},
                  "field 'prompt' is missing (also read from question, problem, input, query, or give 'messages'); "
                  "the row has: questoin, answer; column 'questoin' looks like 'question': rename it, or map it: "
                  "--field prompt=questoin"),
                 ({"question": "What is 2+2?", "Answer": "4"}, {},
                  "field 'answer' is missing (also read from target, reference, solution, label, gold); the row has: "
                  "question, Answer; column 'Answer' looks like 'answer': rename it, or map it: --field "
                  "answer=Answer"),
                 ({"question": "What is 2+2?", "Answer": "4"}, {"answer": "Anwser"},
                  "--field answer=Anwser: no column 'Anwser' in this row; it has: question, Answer (did you mean "
                  "--field answer=Answer?)")]
        for i, (raw, fields, want) in enumerate(cases):
            path = self.jsonl([raw], name="c%d.jsonl" % i)
            self.assertEqual(self.assertDatasetError(path, fields=fields), "%s:1: %s" % (path, want))
        csv_path = self.text("Frage,Antwort\nWie viel ist 2+2?,4\n", "de.csv")
        self.assertDatasetError(csv_path, "de.csv:2: --field answer=Antwrot: no column 'Antwrot' in this row; it has: "
                                "Frage, Antwort (did you mean --field answer=Antwort?)",
                                fields={"prompt": "Frage", "answer": "Antwrot"})
        res = run_cli(["run", "--dataset", self.jsonl([cases[1][0]], name="cli.jsonl"), "--model", "m",
                       "--base-url", "http://127.0.0.1:9/v1"])
        self.assertEqual(res.returncode, 2)
        self.assertIn("the row has: question, Answer; column 'Answer' looks like 'answer'", res.stderr)

    def test_field_mapping_names_columns_of_any_name(self):
        path = self.jsonl([{"uid": 7, "Frage": "Wie viel ist 2+2?", "Antwort": "4", "Thema": "math"}])
        (item,) = self.items(path, fields={"prompt": "Frage", "answer": "Antwort", "category": "Thema"})
        self.assertEqual((item.id, item.messages[-1]["content"], item.answer, item.category),
                         ("7", "Wie viel ist 2+2?", "4", "math"))
        with self.assertRaisesRegex(eh.ConfigError, "'promt' is not a row field"):
            eh.load_dataset(path, fields={"promt": "Frage"})

    def test_a_near_miss_field_name_warns_with_the_suggestion(self):
        path = self.jsonl([row("a", categroy="geo", notes="free text"), row("b", categroy="geo")])
        with self.assertLogs("evalharness", "WARNING") as logs:
            ds = eh.load_dataset(path)
        self.assertEqual(len(ds.warnings), 1)  # once per column, and not for an unrelated one ("notes")
        self.assertIn("qa.jsonl:1: field 'categroy' is not used; did you mean 'category'? (or map it: --field "
                      "category=categroy)", logs.output[0])

    def test_csv_and_tsv_with_a_header_and_a_bom_load(self):
        path = self.text("\ufeffid,question,answer,category\nq1,\"Name a colour, any colour\",red,misc\n"
                         "q2,Two plus two?,4,math\n", "qa.csv")
        items = self.items(path)
        self.assertEqual([(i.id, i.messages[-1]["content"], i.answer, i.category) for i in items],
                         [("q1", "Name a colour, any colour", "red", "misc"), ("q2", "Two plus two?", "4", "math")])
        tsv = self.text("question\tanswer\nTwo plus two?\t4\n", "qa.tsv")
        self.assertEqual([i.answer for i in self.items(tsv)], ["4"])
        bad = self.text("question,answer\nq,a,extra\n", "bad.csv")
        self.assertDatasetError(bad, "bad.csv:2:", "more cells than the header")

    def test_a_bom_jsonl_and_a_json_object_wrapping_a_list_load(self):
        path = os.path.join(self.dir, "bom.jsonl")
        with open(path, "wb") as fh:
            fh.write(b"\xef\xbb\xbf" + json.dumps(row("a")).encode() + b"\n")
        self.assertEqual([i.id for i in self.items(path)], ["a"])
        wrapped = self.text('{"version": 2,\n "data": [\n  {"id": "a", "prompt": "p", "answer": "x"},\n'
                            '  {"id": "b", "prompt": "p"}\n]}', "wrapped.json")
        self.assertDatasetError(wrapped, "wrapped.json:4:", "'answer'")  # the line of the bad row
        self.assertEqual(len(self.items(self.text('{"rows": [%s]}' % json.dumps(row("a")), "w2.json"))), 1)
        bom = self.text("\ufeff[%s]" % json.dumps(row("a")), "bom.json")
        self.assertEqual(len(self.items(bom)), 1)
        two = self.text('{"train": [%s], "test": [%s]}' % (json.dumps(row("a")), json.dumps(row("b"))), "two.json")
        self.assertDatasetError(two, "exactly one such list", "'train', 'test'")

    def test_an_integer_index_is_always_a_position_even_when_the_choices_are_numbers(self):
        """The MMLU case: choices ["2","0","1","3"] with answer 0 is A, not the choice whose text is "0"."""
        (item,) = self.items(self.jsonl([{"question": "x?", "choices": ["2", "0", "1", "3"], "answer": 0}]))
        self.assertEqual(item.answer, "A")
        (item,) = self.items(self.jsonl([{"question": "x?", "choices": ["red", "green", "blue"], "answer": 2}],
                                        name="idx.jsonl"))
        self.assertEqual(item.answer, "C")
        (item,) = self.items(self.jsonl([{"question": "x?", "choices": ["red", "green"], "answer": "1"}],
                                        name="digit.jsonl"))
        self.assertEqual(item.answer, "B")  # a digit string that is no choice's text: a position
        (item,) = self.items(self.jsonl([{"question": "x?", "choices": ["2", "0", "1"], "answer": "0"}],
                                        name="text.jsonl"))
        self.assertEqual(item.answer, "B")  # in JSON a string is the choice's text first
        csv_path = self.text('question,choices,answer\nx?,"[""2"", ""0"", ""1"", ""3""]",0\n', "mmlu.csv")
        self.assertEqual([i.answer for i in self.items(csv_path)], ["A"])  # CSV has no types: a position
        self.assertDatasetError(self.jsonl([{"question": "x?", "choices": ["a", "b"], "answer": 2}], name="o.jsonl"),
                                "'answer'", "index 2", "indexes 0 to 1")

    def test_choices_as_a_dict_as_arc_text_and_label_and_as_columns(self):
        (d,) = self.items(self.jsonl([{"question": "x?", "choices": {"A": "one", "B": "two"}, "answer": "B"}]))
        self.assertEqual((d.choices, d.answer), (("one", "two"), "B"))
        arc = {"question": "x?", "choices": {"text": ["sun", "moon", "star"], "label": ["1", "2", "3"]},
               "answerKey": "2"}
        (a,) = self.items(self.jsonl([arc], name="arc.jsonl"), fields={"answer": "answerKey"})
        self.assertEqual((a.choices, a.answer), (("sun", "moon", "star"), "B"))
        cols = self.text("question,A,B,C,D,answer\nx?,w,x,y,z,C\n", "cols.csv")
        (c,) = self.items(cols)
        self.assertEqual((c.choices, c.answer, c.scorer), (("w", "x", "y", "z"), "C", "choice"))
        self.assertIn("A. w\nB. x\nC. y\nD. z", c.messages[-1]["content"])


# Rows in each public dataset card's column layout (the content is ours).
FORMAT_ROWS = {
    "gsm8k": [{"question": "Tom has %d apples and buys 4 more. How many apples does he have?" % n,
               "answer": "He has %d + 4 = <<%d+4=%d>>%d apples.\n#### %s" % (n, n, n + 4, n + 4, format(n + 4, ","))}
              for n in (3, 10, 996)],
    "mmlu": [{"question": "Which number is the additive identity?", "subject": "abstract_algebra",
              "choices": ["0", "2", "1", "3"], "answer": 0},
             {"question": "How many elements has the group Z_4?", "subject": "abstract_algebra",
              "choices": ["2", "0", "1", "4"], "answer": 3}],
    "mmlu-pro": [{"question_id": 70 + i, "question": "Pick option %s." % "ABCDEFGHIJ"[i],
                  "options": ["option %d" % k for k in range(10)], "answer": "ABCDEFGHIJ"[i], "answer_index": i,
                  "cot_content": "", "category": "math", "src": "ours"} for i in (2, 9)],
    "gpqa": [{"Record ID": "rec%d" % i, "Question": "Which particle is described by case %d?" % i,
              "Correct Answer": "right %d" % i, "Incorrect Answer 1": "wrong a", "Incorrect Answer 2": "wrong b",
              "Incorrect Answer 3": "wrong c", "High-level domain": "Physics", "Subdomain": "Particles"}
             for i in range(6)],
    "math": [{"problem": "What is $1/2 + 0$?", "solution": "Adding zero: $\\boxed{\\frac{1}{2}}$.",
              "answer": "\\frac{1}{2}", "subject": "Algebra", "level": 1, "unique_id": "test/algebra/1.json"},
             {"problem": "Give the interval of x with 0 <= x < 1.", "solution": "It is $\\boxed{[0,1)}$.",
              "answer": "[0,1)", "subject": "Algebra", "level": 2, "unique_id": "test/algebra/2.json"}],
    "aime": [{"id": 60, "problem": "Find the remainder of 2024 divided by 1000.", "solution": "It is 24.",
              "answer": 24, "url": "https://example.invalid/aime/60"}],
    "arc": [{"id": "Mercury_1", "question": "Which is a planet?",
             "choices": {"text": ["the Moon", "the Sun", "Mars", "Sirius"], "label": ["A", "B", "C", "D"]},
             "answerKey": "C"},
            {"id": "Mercury_2", "question": "Which is a gas at room temperature?",
             "choices": {"text": ["iron", "helium", "salt"], "label": ["1", "2", "3"]}, "answerKey": "2"}],
}


class TestBuiltinFormats(_DatasetCase):
    def test_each_format_is_detected_and_converted(self):
        want = {"gsm8k": ("numeric", ["7", "14", "1000"]), "mmlu": ("choice", ["A", "D"]),
                "mmlu-pro": ("choice", ["C", "J"]), "math": ("math", ["\\frac{1}{2}", "[0,1)"]),
                "aime": ("math", ["24"]), "arc": ("choice", ["C", "B"])}
        for name, rows in FORMAT_ROWS.items():
            ds = eh.load_dataset(self.jsonl(rows, name=name + ".jsonl"))
            self.assertEqual(ds.format, name)
            items = list(ds.iter_items())
            self.assertEqual({i.scorer for i in items}, {FORMATS_SCORER[name]}, name)
            if name in want:
                self.assertEqual([i.answer for i in items], want[name][1], name)
            text = items[0].messages[-1]["content"]
            if FORMATS_SCORER[name] == "choice":
                self.assertIn("A) ", text)
                self.assertIn("End your reply with 'Answer: LETTER'", text)
            elif name in ("math", "aime"):
                self.assertIn("\\boxed{}", text)
        (mmlu,) = [i for i in eh.load_dataset(self.jsonl(FORMAT_ROWS["mmlu"][:1], name="m.jsonl")).iter_items()]
        self.assertEqual(mmlu.answer, "A")  # choices ["0","2","1","3"], answer 0: a position, not the text "0"
        self.assertEqual([i.category for i in eh.load_dataset(self.jsonl(FORMAT_ROWS["gpqa"], name="g.jsonl"))
                          .iter_items()], ["Physics"] * 6)

    def test_no_column_a_format_reads_is_warned_about_as_unused(self):
        for name, rows in FORMAT_ROWS.items():
            with self.assertLogs("evalharness", "INFO") as logs:
                ds = eh.load_dataset(self.jsonl(rows, name=name + ".jsonl"))
            self.assertEqual(ds.format, name)
            self.assertEqual(ds.warnings, [], name)  # ARC's answerKey, GPQA's Question: read by the format
            self.assertFalse([line for line in logs.output if "is not used" in line], name)
        # a misspelt column next to a format's columns is still said
        arc = dict(FORMAT_ROWS["arc"][0], categroy="space")
        self.assertEqual(len(eh.load_dataset(self.jsonl([arc], name="arc2.jsonl")).warnings), 1)

    def test_each_format_declares_every_column_it_reads(self):
        class Reads(dict):
            def __getitem__(self, key):
                self.read.add(key)
                return dict.__getitem__(self, key)

            def get(self, key, default=None):
                self.read.add(key)
                return dict.get(self, key, default)

        for name, rows in FORMAT_ROWS.items():
            fmt = eh.FORMATS[name]
            for raw in rows:
                rec = Reads(raw)
                rec.read = set()
                self.assertTrue(fmt.detect(rec), name)
                fmt.convert(rec)
                self.assertLessEqual(rec.read & set(raw), set(fmt.reads), name)

    def test_gpqa_choices_are_shuffled_the_same_way_every_time(self):
        a = [(i.id, i.choices, i.answer) for i in eh.load_dataset(self.jsonl(FORMAT_ROWS["gpqa"], name="a.jsonl"))
             .iter_items()]
        b = [(i.id, i.choices, i.answer) for i in eh.load_dataset(self.jsonl(FORMAT_ROWS["gpqa"], name="b.jsonl"))
             .iter_items()]
        self.assertEqual(a, b)
        self.assertGreater(len({answer for _, _, answer in a}), 1)  # the correct one is not always A
        for (_, choices, answer), row in zip(a, FORMAT_ROWS["gpqa"]):
            self.assertEqual(choices["ABCD".index(answer)], row["Correct Answer"])

    def test_format_none_and_an_explicit_format(self):
        path = self.jsonl(FORMAT_ROWS["gsm8k"])
        self.assertIsNone(eh.load_dataset(path, format="none").format)
        self.assertEqual(eh.load_dataset(path, format="gsm8k").format, "gsm8k")
        with self.assertRaisesRegex(eh.ConfigError, "'gsm9k' is not a built-in format"):
            eh.load_dataset(path, format="gsm8k".replace("8", "9"))
        self.assertDatasetError(self.jsonl([{"question": "q"}], name="bad.jsonl"), "field 'answer'", format="gsm8k")

    def test_rows_of_each_format_score_right_against_the_mock_oracle(self):
        for name, rows in FORMAT_ROWS.items():
            path = self.jsonl(rows, name=name + ".jsonl")
            for skill, want in ((1.0, 1.0), (0.0, 0.0)):
                mock = start_mock(self, oracle_rows=rows, skill=skill)
                out = os.path.join(self.dir, "%s-%s" % (name, skill))
                res = run_cli(["run", "--dataset", path, "--model", "m", "--base-url", mock.url, "--out", out,
                               "--no-progress", "--json"])
                self.assertEqual(res.returncode, 0, res.stderr)
                self.assertIn("its columns are the %s layout" % name, res.stderr)
                self.assertEqual(json.loads(res.stdout)["score"]["mean"], want, (name, skill, read_samples(out)))


class TestPromptTemplates(_DatasetCase):
    def test_a_template_fills_the_question_the_choices_the_letters_and_row_fields(self):
        path = self.jsonl([{"id": "a", "question": "Best colour?", "choices": ["red", "blue"], "answer": "B",
                            "topic": "art"}])
        (item,) = eh.load_dataset(path, format="none", template="[{topic}] {question}\n{choices}\nPick {letters}. "
                                                                 "Use \\boxed{} if you like.").iter_items()
        self.assertEqual(item.messages[-1]["content"], "[art] Best colour?\nA) red\nB) blue\nPick A, B. Use "
                                                       "\\boxed{} if you like.")

    def test_a_missing_template_field_names_the_row_and_the_field(self):
        path = self.jsonl([row("a", topic="x"), row("b")])
        self.assertDatasetError(path, "qa.jsonl:2:", "{topic}", "no field 'topic'", template="{topic}: {question}")
        mc = self.jsonl([row("a", choices=["x", "y"], answer="A")], name="mc.jsonl")
        self.assertDatasetError(mc, "mc.jsonl:1:", "no {choices}", template="{question}")

    def test_the_cli_takes_a_template_file_or_text_and_refuses_text_without_a_field(self):
        res = run_cli(["run", "--dataset", self.jsonl([row("a")]), "--model", "m", "--base-url",
                       "http://127.0.0.1:9/v1", "--prompt-template", "no fields here"])
        self.assertEqual(res.returncode, 2)
        self.assertIn("neither a file nor a template naming a field", res.stderr)


class TestDatasetLimitAndStreaming(_DatasetCase):
    def test_limit_stops_validation_before_a_bad_row_when_reached(self):
        path = self.jsonl([row("a"), row("b"), "{this is not json", {"no": "id"}])
        ds = eh.load_dataset(path, limit=2)
        self.assertEqual((ds.count, ds.ids), (2, {"a", "b"}))

    def test_iter_items_stops_before_a_bad_row_past_the_limit_when_limited(self):
        # Regression (fixed): iter_items() pulls (and parses) the next raw row before checking ``n >= self.count``, so with
        # --limit 2 a malformed line 3 that validate() never read raises DatasetError after a and b.
        path = self.jsonl([row("a"), row("b"), "{this is not json"])
        ds = eh.load_dataset(path, limit=2)
        self.assertEqual([it.id for it in ds.iter_items()], ["a", "b"])

    def test_limit_stops_before_a_bad_item_when_json_list(self):
        text = '[\n{"id": "a", "prompt": "p", "answer": "x"},\n{"id": "b"},\n{oops\n]'
        ds = eh.load_dataset(self.text(text, "qa.json"), limit=1)
        self.assertEqual((ds.count, ds.ids), (1, {"a"}))

    def test_limit_larger_than_dataset_keeps_all_rows_when_given(self):
        ds = eh.load_dataset(self.jsonl([row("a"), row("b")]), limit=10)
        self.assertEqual(ds.count, 2)

    def test_iter_items_yields_validated_ids_in_file_order_when_iterated(self):
        rows = [row("q%d" % i) for i in (3, 1, 2, 10)]
        ds = eh.load_dataset(self.jsonl(rows))
        items = list(ds.iter_items())
        self.assertEqual([it.id for it in items], ["q3", "q1", "q2", "q10"])
        self.assertEqual(set(it.id for it in items), ds.ids)
        self.assertTrue(all(isinstance(it, eh.QAItem) for it in items))
        self.assertTrue(items[1].source.endswith(os.sep + "qa.jsonl:2"), items[1].source)

    def test_iter_items_is_lazy_generator_when_file_changes_after_validate(self):
        path = self.jsonl([row("a"), row("b"), row("c")])
        ds = eh.load_dataset(path)
        # break line 3 after validation: a streaming reader hands out a and b before it reaches the damage
        self.jsonl([row("a"), row("b"), "{broken"])
        it = ds.iter_items()
        self.assertIsInstance(it, types.GeneratorType)
        self.assertEqual(next(it).id, "a")
        self.assertEqual(next(it).id, "b")
        with self.assertRaises(eh.DatasetError):
            next(it)

    def test_iter_items_stops_at_validated_count_when_rows_appended(self):
        path = self.jsonl([row("a"), row("b")])
        ds = eh.load_dataset(path)
        self.jsonl([row("a"), row("b"), row("c")])
        self.assertEqual([it.id for it in ds.iter_items()], ["a", "b"])

    def test_iter_items_can_be_repeated_when_called_twice(self):
        ds = eh.load_dataset(self.jsonl([row("a"), row("b")]))
        self.assertEqual([i.id for i in ds.iter_items()], ["a", "b"])
        self.assertEqual([i.id for i in ds.iter_items()], ["a", "b"])


class TestDemoDataset(unittest.TestCase):
    def test_demo_set_is_large_and_varied_when_built(self):
        rows = eh.demo_dataset()
        self.assertGreaterEqual(len(rows), 40)
        self.assertEqual({r["scorer"] for r in rows}, {"exact", "normalized", "regex", "choice", "numeric"})
        self.assertGreaterEqual(len({r["category"] for r in rows}), 3)

    def test_demo_set_validates_with_unique_ids_when_loaded(self):
        rows = eh.demo_dataset()
        ds = eh.Dataset(None, rows=rows, name="demo").validate()
        self.assertEqual(ds.count, len(rows))
        self.assertEqual(ds.ids, {r["id"] for r in rows})
        self.assertEqual([it.id for it in ds.iter_items()], [r["id"] for r in rows])

    def test_demo_set_is_a_fresh_copy_when_caller_mutates_it(self):
        rows = eh.demo_dataset()
        rows[0]["answer"] = "changed"
        rows.pop()
        self.assertNotEqual(eh.demo_dataset()[0]["answer"], "changed")
        self.assertEqual(len(eh.demo_dataset()), len(rows) + 1)

    def test_demo_export_writes_a_dataset_that_loads_as_the_demo_set(self):
        d = tempdir(self)
        demo = list(eh.Dataset(None, rows=eh.demo_dataset(), name="demo").validate().iter_items())
        for name in ("qa.jsonl", "qa.json"):
            res = run_cli(["demo", "--export", os.path.join(d, name)], cwd=d)
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertIn("wrote the demo's %d rows to " % len(demo), res.stdout)
            self.assertFalse(os.path.exists(os.path.join(d, "runs")))  # nothing was run
            got = list(eh.load_dataset(os.path.join(d, name)).iter_items())
            self.assertEqual([eh._replace(i, source="") for i in got], [eh._replace(i, source="") for i in demo])
        with open(os.path.join(d, "qa.jsonl"), encoding="utf-8") as fh:
            self.assertEqual(list(json.loads(fh.readline())), ["id", "prompt", "answer", "scorer", "category"])
        res = run_cli(["demo", "--export", os.path.join(d, "qa.csv")])
        self.assertEqual(res.returncode, 2)
        self.assertIn(".jsonl or .json", res.stderr)


class TestCliRejectsBadInput(unittest.TestCase):
    BASE_URL = "http://127.0.0.1:9/v1"

    def setUp(self):
        self.dir = tempdir(self)
        self.out = os.path.join(self.dir, "run-out")
        self.good = write_jsonl(os.path.join(self.dir, "good.jsonl"), [row("a"), row("b")])

    def run_qa(self, *extra, dataset=None, base_url=None, out=None):
        return run_cli(["run", "--dataset", dataset or self.good, "--model", "m",
                        "--base-url", base_url or self.BASE_URL, "--out", out or self.out] + list(extra), timeout=60)

    def assertUsageError(self, proc, *needles):
        self.assertEqual(proc.returncode, 2, proc.stderr)
        lines = proc.stderr.splitlines()
        self.assertEqual(len(lines), 1, proc.stderr)
        for needle in needles:
            self.assertIn(needle, lines[0])
        self.assertEqual(proc.stdout, "")
        self.assertFalse(os.path.exists(self.out), "the run directory was created")

    def test_bad_row_exits_2_with_one_line_naming_file_line_and_field_when_run(self):
        bad = write_jsonl(os.path.join(self.dir, "BAD.jsonl"), [row("a"), "", {"id": "b", "prompt": "p"}])
        self.assertUsageError(self.run_qa(dataset=bad), "BAD.jsonl:3", "'answer'")

    def test_malformed_line_exits_2_with_one_line_when_run(self):
        bad = write_jsonl(os.path.join(self.dir, "BAD.jsonl"), [row("a"), "{nope"])
        self.assertUsageError(self.run_qa(dataset=bad), "BAD.jsonl:2", "invalid JSON")

    def test_unknown_scorer_exits_2_with_one_line_when_given(self):
        self.assertUsageError(self.run_qa("--scorer", "fuzzy"), "--scorer", "fuzzy")

    def test_non_http_base_url_exits_2_with_one_line_when_given(self):
        self.assertUsageError(self.run_qa(base_url="ftp://x"), "--base-url", "ftp://x")

    def test_base_url_without_host_exits_2_with_one_line_when_given(self):
        self.assertUsageError(self.run_qa(base_url="http://"), "--base-url", "'http://'")

    def test_out_under_a_regular_file_exits_2_and_writes_nothing_when_given(self):
        blocker = os.path.join(self.dir, "blocker")
        with open(blocker, "w") as fh:
            fh.write("keep me")
        before = sorted(os.listdir(self.dir))
        self.out = os.path.join(blocker, "run")
        self.assertUsageError(self.run_qa(), "--out", self.out)
        self.assertEqual(sorted(os.listdir(self.dir)), before)
        with open(blocker) as fh:
            self.assertEqual(fh.read(), "keep me")


class TestCliLimit(unittest.TestCase):
    def test_run_with_limit_ignores_a_bad_row_past_the_limit_when_run(self):
        # Regression (fixed): see test_iter_items_stops_before_a_bad_row_past_the_limit_when_limited. Through the CLI the run
        # exits 2 *after* creating the run directory, and worker threads print AttributeError tracebacks because
        # the store is closed under them (the runner does not join its workers when the item feed raises).
        d = tempdir(self)
        rows = [row("a"), row("b")]
        mock = start_mock(self, oracle_rows=rows, skill=1.0)
        path = write_jsonl(os.path.join(d, "qa.jsonl"), rows + ["{broken"])
        out = os.path.join(d, "out")
        proc = run_cli(["run", "--dataset", path, "--limit", "2", "--model", "m", "--base-url", mock.url,
                        "--out", out, "--no-progress", "--concurrency", "1"], timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)
        self.assertEqual(sorted(r["id"] for r in read_samples(out)), ["a", "b"])


if __name__ == "__main__":
    unittest.main()
