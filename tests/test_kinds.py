"""A kind of evaluation is one place: a kind defined here, outside the module, through the registry alone (its
section would be this class, its options set and its record; nothing of the module is edited) gets its options in
`run --help`, runs, resumes after kill -9, runs as two shards that merge, shows its block in `report` and `report
--json`, and has its cell on the leaderboard. And an option the chosen kind does not use is refused, naming the
kinds that use it.

Run as a script (``python3 tests/test_kinds.py ARGS``) this module is evalharness's command line with the echo kind
registered: the subprocesses of the tests run it so."""
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import unittest

if __name__ == "__main__":  # the command line with the echo kind: the tests' subprocesses
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.support import (ROOT, clean_env, eh, kill_9_after, read_samples, start_mock, tempdir,  # noqa: E402
                           unstamped, write_jsonl)

SCRIPT = os.path.abspath(__file__)

# ----------------------------------------------------------------------------- the echo kind (what a section holds)
_ECHO_OPTIONS = eh._OptionSet(
    "echo words",
    eh._Opt("--echo-prefix", default="Repeat this word:", metavar="TEXT",
            help="what comes before the word in the question (default %(default)s)"))


@eh._record
class EchoOptions:
    """--task echo's own settings."""

    echo_prefix: str = "Repeat this word:"


class _Word:
    def __init__(self, sid: str, word: str):
        self.id, self.word = sid, word


class _Words:
    """The rows of an echo dataset: JSONL {"id", "word"}."""

    def __init__(self, path: str, limit=None):
        with open(path, "rb") as fh:
            data = fh.read()
        rows = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()][:limit]
        self.items = [_Word(str(r["id"]), str(r["word"])) for r in rows]
        self.name, self.path, self.sha256 = os.path.basename(path), path, hashlib.sha256(data).hexdigest()
        self.ids = {w.id for w in self.items}
        self.count = len(self.items)
        self.fps = {w.id: (eh._fingerprint(w.word), eh._fingerprint(w.word)) for w in self.items}
        self.scorers = set()

    def iter_items(self):
        return iter(self.items)


@eh._kind
class _EchoKind(eh._Kind):
    """Echo words: the model asked to repeat a word, scored 1 when its reply holds it."""

    name = "echo"
    noun = "word"
    rows = "JSONL rows {id, word}"
    option_sets = (eh._SAMPLING_OPTIONS, eh._RESCORE_OPTIONS, _ECHO_OPTIONS)
    Options = EchoOptions
    headline = "echoed"

    def load(self, run, dataset):
        run.dataset = self.wrap(run, _Words(run.cfg.dataset, run.cfg.limit))

    def prompts(self, run):
        return ("%s %s" % (run.cfg.options.echo_prefix, w.word) for w in run.dataset.iter_items())

    def settings(self, cfg):
        return {"task": "echo", "model": cfg.model, "prefix": cfg.options.echo_prefix,
                "temperature": cfg.temperature, "max_tokens": cfg.max_tokens}

    def rescored(self, run, rec, item, score_fp):
        return dict(rec, score=float(item.word in rec["response"]), fp=dict(rec["fp"], score=score_fp))

    def work(self, run):
        client, prefix = run.client, run.cfg.options.echo_prefix

        def work(item):
            started = time.time()
            try:
                res = client.chat([{"role": "user", "content": "%s %s" % (prefix, item.word)}])
            except eh.ModelAPIError as exc:
                return {"id": item.id, "status": "failed", "score": None, "error": str(exc),
                        "error_class": exc.error_class, "started_at": started, "finished_at": time.time()}
            return {"id": item.id, "status": "ok", "score": float(item.word in res.text), "error": None,
                    "error_class": None, "word": item.word, "response": res.text, "latency_s": res.latency_s,
                    "prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
                    "started_at": round(started, 3), "finished_at": round(time.time(), 3)}
        return work

    def merged(self, summary, records, info):
        summary["echo"] = {"words": len(records), "echoed": sum(1 for r in records if r.get("score") == 1.0)}

    def finish(self, run, summary):
        self.merged(summary, self.finished_ok(run), run.run_info)
        return "echo: %(echoed)d of %(words)d words echoed\n" % summary["echo"]

    def report_data(self, run, records, data):
        data["echo_longest"] = max((r["word"] for r in records if r.get("word")), key=len, default=None)

    def report_lines(self, data):
        return ["echo: %d of %d words echoed; the longest word asked: %s" % (
            data["summary"]["echo"]["echoed"], data["summary"]["echo"]["words"], data["echo_longest"])]

    def report_json(self, data, out):
        out["echo"] = dict(data["summary"]["echo"], longest=data["echo_longest"])


WORDS = ["apple", "banana", "cherry", "damson", "elderberry", "fig", "grape", "huckleberry", "kiwi", "lemon",
         "mango", "nectarine", "orange", "papaya", "quince", "raspberry", "strawberry", "tangerine", "ugli", "vanilla"]


def echo_cli(args, timeout=120):
    res = subprocess.run([sys.executable, SCRIPT] + list(args), env=clean_env(), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout)
    res.stderr = unstamped(res.stderr)
    return res


class TestAKindDefinedOutside(unittest.TestCase):

    def setUp(self):
        self.dir = tempdir(self)
        self.dataset = write_jsonl(os.path.join(self.dir, "words.jsonl"),
                                   [{"id": "w%02d" % i, "word": w} for i, w in enumerate(WORDS)])
        oracle = [{"id": "o%02d" % i, "prompt": "Repeat this word: %s" % w, "answer": w, "scorer": "includes"}
                  for i, w in enumerate(WORDS)]
        self.mock = start_mock(self, oracle_rows=oracle, skill=0.7, ttft_s=0.15)

    def run_args(self, out, *extra):
        return ["run", "--task", "echo", "--dataset", self.dataset, "--model", "m", "--base-url", self.mock.url,
                "--fixed-concurrency", "2", "--out", out, "--no-progress"] + list(extra)

    def test_its_options_are_in_run_help_in_a_group_named_after_it(self):
        res = echo_cli(["run", "--help"])
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("echo words (--task echo):", res.stdout)
        self.assertIn("--echo-prefix TEXT", res.stdout)
        self.assertIn("echo (Echo words)", " ".join(res.stdout.split()))
        # the module's own command line (no echo kind) has none of it
        plain = subprocess.run([sys.executable, os.path.join(ROOT, "evalharness.py"), "run", "--help"],
                               stdout=subprocess.PIPE, universal_newlines=True, timeout=60)
        self.assertNotIn("--echo-prefix", plain.stdout)

    def test_a_run_killed_9_resumes_each_word_once_and_its_block_is_in_the_summary(self):
        out = os.path.join(self.dir, "run")
        kill_9_after(self, [sys.executable, SCRIPT] + self.run_args(out), out, 4, 60)
        kept = [r["id"] for r in read_samples(out)]
        self.assertLess(len(kept), len(WORDS), "the run finished before the kill")
        res = echo_cli(self.run_args(out))
        self.assertEqual(res.returncode, 0, res.stderr)
        got = [r["id"] for r in read_samples(out)]
        self.assertEqual(sorted(got), sorted("w%02d" % i for i in range(len(WORDS))))  # each once
        self.assertEqual(got[:len(kept)], kept)  # what finished before the kill is kept, not run again
        records = read_samples(out)
        echoed = sum(1 for r in records if r["score"] == 1.0)
        self.assertTrue(0 < echoed < len(WORDS), echoed)  # skill 0.7: some right, some wrong
        self.assertIn("echo: %d of %d words echoed" % (echoed, len(WORDS)), res.stdout)
        self.assertIn("resuming", res.stderr)

    def test_two_shards_merge_and_report_and_leaderboard_show_its_block(self):
        whole = os.path.join(self.dir, "runs", "whole")
        res = echo_cli(self.run_args(whole, "--label", "whole"))
        self.assertEqual(res.returncode, 0, res.stderr)
        sharded = os.path.join(self.dir, "runs", "sharded")
        for i in range(2):
            res = echo_cli(self.run_args(sharded, "--shard", "%d/2" % i, "--label", "sharded"))
            self.assertEqual(res.returncode, 0, res.stderr)
        res = echo_cli(["merge", sharded])
        self.assertEqual(res.returncode, 0, res.stderr)
        by_id = lambda d: {r["id"]: r["score"] for r in read_samples(d)}  # noqa: E731
        self.assertEqual(by_id(sharded), by_id(whole))  # the oracle's answer is fixed per prompt
        echoed = sum(1 for v in by_id(whole).values() if v == 1.0)
        longest = max(WORDS, key=len)
        for run_dir in (whole, sharded):
            text = echo_cli(["report", run_dir])
            self.assertEqual(text.returncode, 0, text.stderr)
            self.assertIn("echo: %d of %d words echoed; the longest word asked: %s" % (echoed, len(WORDS), longest),
                          text.stdout)
            as_json = echo_cli(["report", run_dir, "--json"])
            self.assertEqual(as_json.returncode, 0, as_json.stderr)
            got = json.loads(as_json.stdout)
            self.assertEqual(got["echo"], {"words": len(WORDS), "echoed": echoed, "longest": longest})
            self.assertEqual(got["task"], "echo")
        with open(os.path.join(sharded, "summary.json")) as fh:
            self.assertEqual(json.load(fh)["echo"], {"words": len(WORDS), "echoed": echoed})  # merge's summary
        board = echo_cli(["report", os.path.join(self.dir, "runs"), "--json"])
        self.assertEqual(board.returncode, 0, board.stderr)
        cells = json.loads(board.stdout)["cells"]
        # the whole run and the merged one (the shards are its parts), a row each
        self.assertEqual(sorted(c["row"] for c in cells), ["sharded", "whole"])
        for cell in cells:
            self.assertEqual((cell["task"], cell["metric"], cell["column"]), ("echo", "echoed", "echo words.jsonl"))
            self.assertAlmostEqual(cell["mean"], echoed / len(WORDS))

    def test_its_option_is_refused_for_another_kind_and_another_kinds_for_it(self):
        res = echo_cli(["run", "--task", "qa", "--dataset", self.dataset, "--model", "m", "--base-url",
                        self.mock.url, "--echo-prefix", "Say:"])
        self.assertEqual(res.returncode, 2)
        self.assertIn("--echo-prefix is not an option of --task qa: it is used by --task echo", res.stderr)
        res = echo_cli(self.run_args(os.path.join(self.dir, "x"), "--system-prompt", "Be brief."))
        self.assertEqual(res.returncode, 2)
        self.assertIn("--system-prompt is not an option of --task echo: it is used by --task qa, code", res.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "x")))  # refused before anything is written


class TestUnusedOptions(unittest.TestCase):
    """An option the chosen kind does not use is refused in one line (exit 2), naming the option and the kinds that
    use it, before anything is read or written; in a mapping (a suite's benchmark) too."""

    CASES = [
        (["--task", "choice", "--system-prompt", "Be brief."], "--system-prompt is not an option of --task choice: "
                                                               "it is used by --task qa, code"),
        (["--task", "qa", "--num-fewshot", "5"], "--num-fewshot is not an option of --task qa: it is used by "
                                                 "--task choice"),
        (["--task", "harbor", "--score-only", "gold"], "--score-only is not an option of --task harbor: it is used "
                                                       "by --task swe"),
        (["--task", "tools", "--epochs", "3"], "--epochs is not an option of --task tools: it is used by --task qa, "
                                               "code"),
        (["--task", "perplexity", "--temperature", "0.7"], "--temperature is not an option of --task perplexity"),
    ]

    def test_each_is_refused_in_one_line_naming_the_kinds_that_use_it(self):
        d = tempdir(self)
        for extra, want in self.CASES:
            out = os.path.join(d, "never")
            res = subprocess.run([sys.executable, os.path.join(ROOT, "evalharness.py"), "run", "--dataset",
                                  os.path.join(d, "missing.jsonl"), "--model", "m", "--base-url",
                                  "http://127.0.0.1:9/v1", "--out", out] + extra, env=clean_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
            self.assertEqual(res.returncode, 2, (extra, res.stderr))
            err = unstamped(res.stderr).strip()
            self.assertIn(want, err, extra)
            self.assertEqual(len(err.splitlines()), 1, err)
            self.assertFalse(os.path.exists(out), extra)

    def test_a_mapping_is_checked_the_same_way_and_fills_the_kinds_record(self):
        cfg = eh.RunConfig(dataset="d.jsonl", model="m", base_url="http://x/v1", task="choice")
        given = eh._given_options("choice", {"num_fewshot": 5, "fewshot-seed": "7"}, "suite.toml [mmlu]")
        cfg = eh._kind_config(cfg, given)
        self.assertEqual((cfg.options.num_fewshot, cfg.options.fewshot_seed), (5, 7))
        with self.assertRaises(eh.ConfigError) as caught:
            eh._kind_config(cfg, eh._given_options("choice", {"system_prompt": "x"}, "suite.toml [mmlu]"),
                            "suite.toml [mmlu]")
        self.assertIn("suite.toml [mmlu]: --system-prompt is not an option of --task choice", str(caught.exception))
        with self.assertRaises(eh.ConfigError) as caught:
            eh._given_options("choice", {"num_fewshots": 5}, "suite.toml [mmlu]")
        self.assertIn("did you mean 'num_fewshot'?", str(caught.exception))
        stream = eh._kind_config(eh.RunConfig(dataset="d", model="m", base_url="u", task="qa"),
                                 eh._given_options("qa", {"no_stream": True}, "x"))
        self.assertFalse(stream.stream)
        stream = eh._kind_config(eh.RunConfig(dataset="d", model="m", base_url="u", task="qa"),
                                 eh._given_options("qa", {"stream": False}, "x"))
        self.assertFalse(stream.stream)

    def test_a_run_config_made_in_code_is_held_to_the_same_rule(self):
        cfg = eh.RunConfig(dataset="d.jsonl", model="m", base_url="http://127.0.0.1:9/v1", task="choice",
                           system_prompt="Be brief.")
        with self.assertRaises(eh.ConfigError) as caught:
            eh.run_evaluation(cfg)
        self.assertIn("--system-prompt is not an option of --task choice", str(caught.exception))
        with self.assertRaises(eh.ConfigError) as caught:
            eh.run_evaluation(eh.RunConfig(dataset="d.jsonl", model="m", base_url="u", task="qa",
                                           options=eh.ChoiceOptions()))
        self.assertIn("--task qa takes a QAOptions", str(caught.exception))


class TestSections(unittest.TestCase):
    """The module reads top-down: its docstring lists its sections as the banners say, and no section is over 1,000
    lines (the lines of an encoded data blob, base85 text in a string literal, are data, not lines to read: the
    Instruction data section holds models of thousands of them, Tool data BFCL's long-context constants)."""

    def test_the_docstring_lists_the_banners_in_order_and_no_section_is_over_1000_lines(self):
        with open(os.path.join(ROOT, "evalharness.py"), encoding="utf-8") as fh:
            lines = fh.read().split("\n")
        banner = "# " + "=" * 77
        found = [(i, lines[i + 1][2:]) for i in range(len(lines) - 2)
                 if lines[i] == banner and lines[i + 2] == banner and lines[i + 1].startswith("# ")]
        block = eh.__doc__.split("Sections, lowest layer first")[1].split("\n\n")[0]
        listed = " ".join(line for line in block.splitlines() if line.startswith("    "))
        listed = [" ".join(s.split()) for s in listed.split(",")]
        self.assertEqual(listed, [name for _, name in found])
        blob = re.compile(r'^ +"[0-9A-Za-z!#$%&()*+\-;<=>?@^_`{|}~]{40,}"$')
        sizes = {name: sum(1 for line in lines[i:found[k + 1][0] if k + 1 < len(found) else len(lines)]
                           if not blob.match(line)) for k, (i, name) in enumerate(found)}
        self.assertEqual({n: s for n, s in sizes.items() if s > 1000}, {})
        self.assertLess(sum(1 for line in lines if blob.match(line)), 6500)  # (the data: about 6,000 lines now)


if __name__ == "__main__":
    sys.exit(eh.main())
