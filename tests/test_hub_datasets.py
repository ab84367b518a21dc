"""Datasets as the Hub ships them: a downloaded folder (the README's configs, or the conventional file names), its
config and split chosen and announced, Parquet rows read by every kind that reads rows, a run resumed across
formats, the `dataset` command, and what is refused. Parquet files are written by tests/parquetbed.py."""
import json
import logging
import os
import unittest

from tests.parquetbed import write_parquet
from tests.support import eh, qa_rows, read_samples, run_cli, start_mock, tempdir, write_jsonl

README = """---
license: mit
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: "main/test-*"
- config_name: socratic
  data_files:
  - split: test
    path: [socratic/test-*.parquet]
dataset_info:
  features:
  - name: question
    dtype: string
---
# A dataset card
"""


def gsm_rows(n, start=0):
    return [{"question": "What is %d plus %d?" % (i, i + 1), "answer": "So it is %d.\n#### %d" % (2 * i + 1, 2 * i + 1)}
            for i in range(start, start + n)]


class _Folder(unittest.TestCase):
    def setUp(self):
        self.dir = tempdir(self)

    def folder(self, files, readme=None, name="gsm8k"):
        """A dataset folder: {relative path: rows} written as Parquet (.parquet) or JSONL; README.md if given."""
        root = os.path.join(self.dir, name)
        for rel, rows in files.items():
            path = os.path.join(root, *rel.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_parquet(path, rows) if rel.endswith(".parquet") else write_jsonl(path, rows)
        if readme is not None:
            with open(os.path.join(root, "README.md"), "w", encoding="utf-8") as fh:
                fh.write(readme)
        return root

    def gsm_folder(self):
        return self.folder({"main/test-00000-of-00002.parquet": gsm_rows(6),
                            "main/test-00001-of-00002.parquet": gsm_rows(4, start=6),
                            "main/train-00000-of-00001.parquet": gsm_rows(3, start=100),
                            "socratic/test-00000-of-00001.parquet": gsm_rows(2, start=200)}, README)


class TestFolders(_Folder):
    def test_the_readme_configs_name_the_files_and_a_split_over_two_shards_reads_in_order(self):
        root = self.gsm_folder()
        with self.assertLogs("evalharness", logging.INFO) as logs:
            path = eh.DataPath(root, "main", None)
        self.assertEqual((path.config, path.split_name, path.label), ("main", "test", "gsm8k[main/test]"))
        self.assertEqual([os.path.relpath(f, root) for f in path.files],
                         [os.path.join("main", "test-0000%d-of-00002.parquet" % i) for i in (0, 1)])
        rows = [row for _w, row in eh._iter_raw_rows(path)]
        self.assertEqual(rows, gsm_rows(10))
        self.assertEqual(len(logs.output), 1)
        self.assertIn("dataset %s: config main, split test: 2 files (main/test-00000-of-00002.parquet, "
                      "main/test-00001-of-00002.parquet); other splits: train; other configs: socratic; --subset and "
                      "--split choose" % root, logs.output[0])
        self.assertEqual(eh.DataPath(root, "socratic", "test").files[0],
                         os.path.join(root, "socratic", "test-00000-of-00001.parquet"))

    def test_two_configs_without_a_default_are_one_line_listing_them(self):
        root = self.gsm_folder()
        with self.assertRaises(eh.DatasetError) as cm:
            eh.DataPath(root)
        self.assertEqual(str(cm.exception), "%s: 2 configs (from README.md): choose one with --subset: main: test "
                                            "(2 files), train (1 file); socratic: test (1 file)" % root)
        with self.assertRaisesRegex(eh.DatasetError, r"no config 'mian' \(from README.md\); it holds main: "):
            eh.DataPath(root, "mian")
        with self.assertRaisesRegex(eh.DatasetError, "config main has no split 'dev'; its splits: test, train$"):
            eh.DataPath(root, "main", "dev")

    def test_the_defaults_are_the_only_config_else_default_else_all_and_the_test_split(self):
        only = self.folder({"data/train-00000-of-00001.parquet": gsm_rows(2),
                            "data/test-00000-of-00001.parquet": gsm_rows(3)}, name="one")
        self.assertEqual((eh.DataPath(only).config, eh.DataPath(only).split_name), ("default", "test"))
        named = self.folder({"default/validation.jsonl": gsm_rows(2), "other/validation.jsonl": gsm_rows(1)},
                            name="two")
        self.assertEqual((eh.DataPath(named).config, eh.DataPath(named).split_name), ("default", "validation"))
        mmlu = self.folder({"all/dev-00000-of-00001.parquet": gsm_rows(1),
                            "all/test-00000-of-00001.parquet": gsm_rows(2),
                            "abstract_algebra/test-00000-of-00001.parquet": gsm_rows(1)}, name="mmlu")
        self.assertEqual((eh.DataPath(mmlu).config, eh.DataPath(mmlu).split_name), ("all", "test"))
        two_splits = self.folder({"train.jsonl": gsm_rows(2), "validation.jsonl": gsm_rows(1)}, name="three")
        with self.assertRaisesRegex(eh.DatasetError, "config default has 2 splits and none is test: choose one with "
                                                     "--split: train, validation$"):
            eh.DataPath(two_splits)
        self.assertEqual(len(list(eh._iter_raw_rows(eh.DataPath(two_splits, split="validation")))), 1)

    def test_split_words_are_named_as_the_hub_names_them_and_a_card_may_mark_its_default_config(self):
        root = self.folder({"dev.jsonl": gsm_rows(1), "eval.jsonl": gsm_rows(2), "notes.jsonl": gsm_rows(3),
                            "x/valid/0000.parquet": gsm_rows(1)}, name="words")
        layout, source = eh.hub_layout(root)
        self.assertEqual(source, "the file names")
        # notes.jsonl says no split while others do: left out, as the Hub's loader leaves it; x/valid/0000.parquet
        # is the Hub's Parquet conversion (CONFIG/SPLIT/0000.parquet): the folder names its split as it is
        self.assertEqual({c: {s: len(f) for s, f in splits.items()} for c, splits in layout.items()},
                         {"default": {"validation": 1, "test": 1}, "x": {"valid": 1}})
        mnli = self.folder({"mnli/train/0000.parquet": gsm_rows(2), "mnli/validation_matched/0000.parquet": gsm_rows(1),
                            "mnli/validation_mismatched/0000.parquet": gsm_rows(1),
                            "data/auxiliary_train-00000-of-00001-ab12cd.parquet": gsm_rows(1),
                            "data/test2.jsonl": gsm_rows(1)}, name="glue")
        self.assertEqual({c: sorted(s) for c, s in eh.hub_layout(mnli)[0].items()},
                         {"mnli": ["train", "validation_matched", "validation_mismatched"],
                          "default": ["auxiliary_train", "test"]})
        folders = self.folder({"train/0000.parquet": gsm_rows(2), "test/0000.parquet": gsm_rows(3)}, name="folders")
        self.assertEqual({c: sorted(s) for c, s in eh.hub_layout(folders)[0].items()}, {"default": ["test", "train"]})
        readme = ("---\nconfigs:\n- config_name: small\n  data_files: small/*.jsonl\n- config_name: large\n"
                  "  default: true\n  data_files:\n  - split: test\n    path: large/*.jsonl\n---\n")
        marked = self.folder({"small/a.jsonl": gsm_rows(1), "large/b.jsonl": gsm_rows(2)}, readme, name="marked")
        path = eh.DataPath(marked)
        self.assertEqual((path.config, path.split_name, len(path.files)), ("large", "test", 1))
        self.assertEqual(eh.DataPath(marked, "small").split_name, "train")  # data_files without a split: train
        mapping = ("---\nconfigs:\n- config_name: default\n  data_files:\n    validation: v/*.jsonl\n"
                   "    test: [t/a.jsonl, t/b.jsonl]\n---\n")
        root = self.folder({"v/x.jsonl": gsm_rows(1), "t/a.jsonl": gsm_rows(1), "t/b.jsonl": gsm_rows(2)}, mapping,
                           name="mapping")
        self.assertEqual({s: len(f) for s, f in eh.hub_layout(root)[0]["default"].items()}, {"validation": 1, "test": 2})

    def test_readme_globs_with_double_stars_and_lists_choose_the_files(self):
        readme = ("---\nconfigs:\n  - config_name: default\n    default: true\n    data_files:\n      - split: test\n"
                  "        path:\n          - \"data/**/test-*.parquet\"\n          - extra/more_test.jsonl\n---\n")
        root = self.folder({"data/a/test-00000-of-00001.parquet": gsm_rows(2), "data/b/c/test-1.parquet": gsm_rows(1),
                            "extra/more_test.jsonl": gsm_rows(1, start=9), "data/a/train-0.parquet": gsm_rows(5)},
                           readme, name="globs")
        path = eh.DataPath(root)
        self.assertEqual([os.path.relpath(f, root).replace(os.sep, "/") for f in path.files],
                         ["data/a/test-00000-of-00001.parquet", "data/b/c/test-1.parquet", "extra/more_test.jsonl"])

    def test_a_folder_of_csv_files_reads_its_cells_as_text(self):
        root = os.path.join(self.dir, "csvs")
        os.makedirs(root)
        with open(os.path.join(root, "test.csv"), "w", encoding="utf-8") as fh:
            fh.write("id,question,choices,answer\nq1,Which?,\"[\"\"2\"\", \"\"0\"\"]\",0\n")
        ds = eh.Dataset(root).validate()
        self.assertFalse(ds.typed)  # as a lone .csv file: a digit cell is a position first
        self.assertEqual(next(ds.iter_items()).answer, "A")

    def test_a_folder_without_data_files_is_refused_in_one_line(self):
        os.makedirs(os.path.join(self.dir, "empty", ".cache"))
        with self.assertRaisesRegex(eh.DatasetError, r"empty: no data files in this folder \(.parquet, .jsonl"):
            eh.DataPath(os.path.join(self.dir, "empty"))


class TestKindsReadParquet(_Folder):
    def test_code_choice_and_swe_rows_are_recognised_as_the_hub_lays_them_out(self):
        humaneval = write_parquet(os.path.join(self.dir, "he.parquet"), [
            {"task_id": "HumanEval/0", "prompt": "def f(x):\n", "canonical_solution": "    return x\n",
             "test": "def check(candidate):\n    assert candidate(1) == 1\n", "entry_point": "f"}])
        code = eh.CodeDataset(humaneval)
        self.assertEqual((code.layout, code.count, code.name), ("humaneval", 1, "he.parquet"))
        subjects = [{"question": "Q%d?" % i, "choices": ["a", "b", "c", "d"], "answer": i % 4,
                     "subject": "algebra"} for i in range(6)]
        mmlu = self.folder({"all/test-00000-of-00001.parquet": subjects[:4],
                            "all/dev-00000-of-00001.parquet": subjects[4:]}, name="mmlu")
        with self.assertLogs("evalharness", logging.INFO) as logs:
            fewshot = eh._fewshot_path(mmlu, None)
        self.assertEqual(fewshot.split_name, "dev")
        self.assertIn("few-shot examples %s: config all, split dev" % mmlu, logs.output[0])
        ds = eh.ChoiceDataset(eh.DataPath(mmlu), shots=2, fewshot_path=fewshot)
        self.assertEqual((ds.layout, ds.count, ds.name), ("mmlu", 4, "mmlu[all/test]"))
        swe = write_parquet(os.path.join(self.dir, "swe.parquet"), [
            {"instance_id": "o__r-1", "repo": "o/r", "base_commit": "a" * 40, "problem_statement": "fix it",
             "FAIL_TO_PASS": json.dumps(["tests/test_a.py::test_x"]), "PASS_TO_PASS": "[]", "version": "1.0",
             "patch": "", "test_patch": "diff --git a/t b/t\n", "environment_setup_commit": "b" * 40}])
        inst = eh.SWEDataset(swe).validate().items[0]
        self.assertEqual(inst.fail_to_pass, ("tests/test_a.py::test_x",))

    def test_arc_choices_as_a_struct_of_lists_and_mbpp_test_lists_are_recognised(self):
        arc = write_parquet(os.path.join(self.dir, "arc.parquet"), [
            {"id": "Mercury_%d" % i, "question": "Which is a planet?",
             "choices": {"text": ["Moon", "Mars", "Sun", "Io"], "label": ["A", "B", "C", "D"]}, "answerKey": "B"}
            for i in range(3)])
        ds = eh.load_dataset(arc)
        self.assertEqual((ds.format, ds.count), ("arc", 3))
        self.assertEqual(next(ds.iter_items()).answer, "B")
        self.assertEqual(eh.ChoiceDataset(arc).layout, "arc")
        mbpp = write_parquet(os.path.join(self.dir, "mbpp.parquet"), [
            {"task_id": 2, "text": "Write a function to add.", "code": "def add(a, b):\n    return a + b",
             "test_list": ["assert add(1, 2) == 3"], "test_setup_code": "", "challenge_test_list": []}])
        self.assertEqual(eh.CodeDataset(mbpp).layout, "mbpp")

    def test_an_image_column_is_kept_as_bytes_and_the_row_still_reads(self):
        rows = [{"id": "v1", "prompt": "What is shown?", "answer": "a cat",
                 "image": {"bytes": b"\x89PNG\r\n\x1a\n\x00\xff", "path": "cat.png"}}]
        path = write_parquet(os.path.join(self.dir, "vqa.parquet"), rows)
        self.assertEqual(next(eh._iter_raw_rows(path))[1]["image"], rows[0]["image"])
        self.assertEqual(eh.load_dataset(path).ids, {"v1"})


class TestRunsOnHubFolders(_Folder):
    def test_a_jsonl_run_resumes_from_the_same_rows_as_parquet_without_new_requests(self):
        rows = qa_rows(12)
        jsonl = write_jsonl(os.path.join(self.dir, "qa.jsonl"), rows)
        root = self.folder({"data/test-00000-of-00002.parquet": rows[:7], "data/test-00001-of-00002.parquet": rows[7:]},
                           name="qa")
        mock = start_mock(self, oracle_rows=rows)
        out = os.path.join(self.dir, "run")
        base = ["--model", "m", "--base-url", mock.url, "--out", out, "--no-progress"]
        first = run_cli(["run", "--dataset", jsonl] + base)
        self.assertEqual(first.returncode, 0, first.stderr)
        asked = mock.stats()["counters"]["requests"]
        self.assertEqual(asked, 12)
        again = run_cli(["run", "--dataset", root] + base)
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertEqual(mock.stats()["counters"]["requests"], asked)  # nothing asked again
        self.assertIn("resuming %s: 12 of 12 samples kept" % out, again.stderr)
        self.assertIn("dataset %s: config default, split test: 2 files" % root, again.stderr)
        self.assertEqual(len(read_samples(out)), 12)
        with open(os.path.join(out, "run.json"), encoding="utf-8") as fh:
            info = json.load(fh)["dataset"]
        self.assertEqual((info["name"], info["subset"], info["split"], info["files"]),
                         ("qa[test]", "default", "test", [os.path.join("data", "test-0000%d-of-00002.parquet" % i)
                                                          for i in (0, 1)]))

    def test_bad_files_and_misplaced_choices_are_one_line_and_write_nothing(self):
        mock = start_mock(self, oracle_rows=qa_rows(3))
        cut = os.path.join(self.dir, "cut.parquet")
        with open(write_parquet(cut, qa_rows(3)), "rb") as fh:
            data = fh.read()
        with open(cut, "wb") as fh:
            fh.write(data[:-30])
        for dataset, extra, needle in (
                (cut, [], "evalharness: %s: cut off (it does not end with PAR1: an interrupted download or copy?); "
                          "download or copy the file again" % cut),
                (write_jsonl(os.path.join(self.dir, "qa.jsonl"), qa_rows(3)), ["--subset", "main"],
                 "evalharness: --subset chooses within a dataset folder, and %s is a file" %
                 os.path.join(self.dir, "qa.jsonl")),
                (self.gsm_folder(), ["--split", "test"], "2 configs (from README.md): choose one with --subset")):
            out = os.path.join(self.dir, "never")
            res = run_cli(["run", "--dataset", dataset, "--model", "m", "--base-url", mock.url, "--out", out] + extra)
            with self.subTest(dataset=dataset):
                self.assertEqual(res.returncode, 2, res.stderr)
                self.assertIn(needle, res.stderr)
                self.assertEqual(len(res.stderr.strip().splitlines()), 1, res.stderr)
                self.assertFalse(os.path.exists(out))
        tools = run_cli(["run", "--task", "tools", "--dataset", cut, "--subset", "x", "--model", "m", "--base-url",
                         mock.url])
        self.assertIn("--subset is not an option of --task tools", tools.stderr)


class TestSuiteOnAHubFolder(_Folder):
    def test_two_configs_of_one_folder_are_two_benchmarks_of_a_suite(self):
        root = self.gsm_folder()
        rows = gsm_rows(10) + gsm_rows(2, start=200)
        mock = start_mock(self, oracle_rows=[eh.FORMATS["gsm8k"].convert(r) for r in rows])
        suite = os.path.join(self.dir, "suite.toml")
        with open(suite, "w", encoding="utf-8") as fh:
            fh.write('model = "m"\nbase_url = "%s"\nout = "runs"\n\n[[benchmark]]\nname = "gsm-main"\n'
                     'dataset = "gsm8k"\nsubset = "main"\n\n[[benchmark]]\nname = "gsm-socratic"\n'
                     'dataset = "gsm8k"\nsubset = "socratic"\nsplit = "test"\n' % mock.url)
        res = run_cli(["suite", suite, "--json", "--no-progress"], timeout=300)
        self.assertEqual(res.returncode, 0, res.stderr)
        cells = {c["column"]: c for c in json.loads(res.stdout)["cells"]}
        self.assertEqual({k: c["n"] for k, c in cells.items()}, {"gsm-main": 10, "gsm-socratic": 2})
        for name, subset in (("gsm-main", "main"), ("gsm-socratic", "socratic")):
            with open(os.path.join(self.dir, "runs", "m", name, "run.json"), encoding="utf-8") as fh:
                info = json.load(fh)["dataset"]
            self.assertEqual((info["subset"], info["split"], info["name"]), (subset, "test",
                                                                             "gsm8k[%s/test]" % subset))


class TestDatasetCommand(_Folder):
    def test_it_shows_the_files_layout_rows_fields_and_first_row(self):
        root = self.gsm_folder()
        res = run_cli(["dataset", root, "--subset", "main"])
        self.assertEqual(res.returncode, 0, res.stderr)
        lines = res.stdout.splitlines()
        self.assertEqual(lines[0], "dataset %s: config main, split test" % root)
        self.assertRegex(lines[1], r"^  main/test-00000-of-00002.parquet: Parquet, 6 rows in 1 row group, "
                                   r"UNCOMPRESSED, .* \(written by tests/parquetbed.py\)$")
        self.assertIn("rows: 10", lines)
        self.assertIn("layout: --task qa reads the gsm8k layout (question, answer ending in '#### N'): its template, "
                      "scorer numeric", lines)
        self.assertIn("fields (the Parquet schema's types):", lines)
        self.assertRegex(res.stdout, r'\n  question  string +"What is 0 plus 1\?"\n')
        self.assertEqual(json.loads(lines[-1]), gsm_rows(1)[0])
        choice = run_cli(["dataset", root, "--subset", "main", "--task", "choice"])
        self.assertEqual(choice.returncode, 1)
        self.assertIn("layout: --task choice does not read these rows (the first row has: question, answer)",
                      choice.stdout)

    def test_jsonl_writes_every_row_as_read_and_a_run_reads_the_same_rows_from_it(self):
        rows = [{"id": "r%d" % i, "prompt": "p%d" % i, "answer": "a", "blob": b"\x00\x01", "n": i,
                 "tags": ["x", None]} for i in range(5)]
        src = write_parquet(os.path.join(self.dir, "in.parquet"), rows)
        res = run_cli(["dataset", src, "--jsonl"])
        self.assertEqual(res.returncode, 0, res.stderr)
        written = [json.loads(line) for line in res.stdout.splitlines()]
        self.assertEqual(written, [dict(r, blob="AAE=") for r in rows])
        converted = write_jsonl(os.path.join(self.dir, "out.jsonl"), written)
        self.assertEqual(eh.load_dataset(converted).fps, eh.load_dataset(src).fps)


if __name__ == "__main__":
    unittest.main()
