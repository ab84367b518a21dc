"""Suites: many benchmarks of several kinds for one or more models in one process, one gate per endpoint, one table
(issue 50). Against the mock over loopback; the code benchmark in the local sandbox (no Docker needed)."""
import json
import os
import signal
import subprocess
import sys
import unittest

from tests.support import (CLI, clean_env, eh, qa_rows, read_samples, run_cli, tempdir, wait_until,
                           write_jsonl)
from tests.test_code import HE_ROWS
from tests.test_loglik import ROWS as CHOICE_ROWS
from tests.test_tools import write_bfcl


def write_suite(d, text, name="nightly.toml"):
    path = os.path.join(d, name)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


class _Suite(unittest.TestCase):
    def setUp(self):
        self.dir = tempdir(self)
        self.qa = qa_rows(30)
        write_jsonl(os.path.join(self.dir, "qa.jsonl"), self.qa)
        write_jsonl(os.path.join(self.dir, "mc.jsonl"), CHOICE_ROWS["mmlu"])
        write_jsonl(os.path.join(self.dir, "he.jsonl"), HE_ROWS)
        self.bfcl = write_bfcl(self.dir, "BFCL_v4_simple_python.json")

    def mock(self, **config):
        config.setdefault("model", "m")
        server = eh.MockServer(eh.MockConfig(**config), oracle=eh.Dataset(None, rows=self.qa, name="o").validate(),
                               tools=eh.ToolDataset(self.bfcl)).start()
        self.addCleanup(server.close)
        return server

    def four(self, url, extra="", defaults=""):
        return write_suite(self.dir, '''\
name = "nightly"
model = "m"
base_url = "%s"
out = "runs/nightly"
%s
[defaults]
max_tokens = 256
%s

[[benchmark]]
name = "qa"
dataset = "qa.jsonl"
scorer = "numeric"

[[benchmark]]
name = "mmlu"
task = "choice"
dataset = "mc.jsonl"

[[benchmark]]
name = "bfcl"
task = "tools"
dataset = "BFCL_v4_simple_python.json"

[[benchmark]]
name = "humaneval"
task = "code"
dataset = "he.jsonl"
sandbox = "local"
''' % (url, extra, defaults))


class TestOneSuite(_Suite):
    def test_four_benchmarks_of_four_kinds_give_one_table_equal_to_each_runs_own_report(self):
        path = self.four(self.mock(skill=0.7).url)
        res = run_cli(["suite", path, "--json", "--no-progress"], timeout=300)
        self.assertEqual(res.returncode, 0, res.stderr)
        board = json.loads(res.stdout)
        self.assertEqual(board["columns"], ["qa", "mmlu", "bfcl", "humaneval"])
        self.assertEqual(board["rows"], ["m"])
        out = os.path.join(self.dir, "runs", "nightly")
        with open(os.path.join(out, "suite.json")) as fh:
            suite = json.load(fh)
        self.assertEqual([b["state"] for b in suite["benchmarks"]], ["finished"] * 4)
        for cell in board["cells"]:
            run_dir = os.path.join(out, "m", cell["column"])
            self.assertEqual(os.path.realpath(cell["run_dir"]), os.path.realpath(run_dir))
            own = json.loads(run_cli(["report", run_dir, "--json"]).stdout)
            self.assertEqual((cell["mean"], cell["ci95"], cell["n"]), (own["score"]["mean"], own["score"]["ci95"],
                                                                       own["score"]["n"]), cell["column"])
            self.assertEqual(own["task"], cell["task"])
        # the folder's leaderboard is the suite's table too
        again = json.loads(run_cli(["report", out, "--json"]).stdout)
        self.assertEqual(sorted((c["mean"], c["n"]) for c in again["cells"]),
                         sorted((c["mean"], c["n"]) for c in board["cells"]))
        # a finished suite costs nothing the second time: the same figures, no new sample
        figures = lambda cells: sorted((c["column"], c["mean"], c["ci95"], c["n"], c["finished"])  # noqa: E731
                                       for c in cells)
        lines = {b: len(read_samples(os.path.join(out, "m", b))) for b in board["columns"]}
        res = run_cli(["suite", path, "--json", "--no-progress"], timeout=300)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(figures(json.loads(res.stdout)["cells"]), figures(board["cells"]))
        self.assertEqual({b: len(read_samples(os.path.join(out, "m", b))) for b in board["columns"]}, lines)

    def test_nights_of_checkpoints_are_rows_of_the_suites_folder_report(self):
        """The nightly cron: the same suite with --label ckpt-N each night; `report OUT` a row per checkpoint and a
        column per benchmark."""
        path = self.four(self.mock(skill=0.7).url)
        for step in ("ckpt-1000", "ckpt-2000"):
            res = run_cli(["suite", path, "--no-progress", "--label", step, "--only", "qa,mmlu"], timeout=300)
            self.assertEqual(res.returncode, 0, res.stderr)
        board = json.loads(run_cli(["report", os.path.join(self.dir, "runs", "nightly"), "--json"]).stdout)
        self.assertEqual(board["rows"], ["ckpt-1000", "ckpt-2000"])
        self.assertEqual(board["columns"], ["qa", "mmlu"])

    def test_kill_9_mid_suite_then_the_same_command_gives_every_sample_once_in_every_benchmark(self):
        mock = self.mock(skill=0.7, ttft_s=0.1)
        path = self.four(mock.url, defaults="fixed_concurrency = 2")
        out = os.path.join(self.dir, "runs", "nightly")
        proc = subprocess.Popen([sys.executable, CLI, "suite", path, "--no-progress"], env=clean_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        qa_samples = os.path.join(out, "m", "qa", "samples.jsonl")

        def lines():
            with open(qa_samples, "rb") as fh:
                return fh.read().count(b"\n")
        self.assertTrue(wait_until(lambda: os.path.exists(qa_samples) and lines() >= 5, 60))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        self.assertLess(lines(), len(self.qa), "the suite finished before the kill")
        res = run_cli(["suite", path, "--no-progress"], timeout=300)
        self.assertEqual(res.returncode, 0, res.stderr)
        want = {"qa": len(self.qa), "mmlu": len(CHOICE_ROWS["mmlu"]), "bfcl": 12, "humaneval": len(HE_ROWS)}
        for bench, n in want.items():
            ids = [r["id"] for r in read_samples(os.path.join(out, "m", bench))]
            self.assertEqual(len(ids), len(set(ids)), bench)  # each once
            self.assertEqual(len(ids), n, bench)

    def test_a_benchmark_refused_at_its_preflight_leaves_the_others_running_and_the_suite_exits_1(self):
        path = self.four(self.mock(skill=0.7, tools_refused=True).url)
        res = run_cli(["suite", path, "--json", "--no-progress"], timeout=300)
        self.assertEqual(res.returncode, 1, res.stderr)
        with open(os.path.join(self.dir, "runs", "nightly", "suite.json")) as fh:
            states = {b["benchmark"]: b for b in json.load(fh)["benchmarks"]}
        self.assertEqual({k: v["state"] for k, v in states.items()},
                         {"qa": "finished", "mmlu": "finished", "bfcl": "refused", "humaneval": "finished"})
        self.assertIn("refuses requests with tools", states["bfcl"]["why"])
        self.assertIn("m/bfcl refused", res.stderr)
        self.assertEqual(json.loads(res.stdout)["columns"], ["qa", "mmlu", "humaneval"])

    def test_a_bad_suite_file_is_one_line_naming_the_file_the_benchmark_and_the_key_and_nothing_is_written(self):
        url = "http://127.0.0.1:9/v1"
        cases = [
            ("[[benchmark]]\nname = 'mmlu'\ntask = 'choice'\ndataset = 'mc.jsonl'\nnum_fewshots = 5\n",
             "[mmlu]: 'num_fewshots' is not an option of any kind (did you mean 'num_fewshot'?)"),
            ("[[benchmark]]\nname = 'qa'\ndataset = 'qa.jsonl'\nnum_fewshot = 5\n",
             "[qa]: --num-fewshot is not an option of --task qa: it is used by --task choice"),
            ("[[benchmark]]\nname = 'qa'\ndataset = 'qa.jsonl'\n[[benchmark]]\nname = 'qa'\ndataset = 'qa.jsonl'\n",
             "two benchmarks are named 'qa'"),
            ("[[benchmark]]\nname = 'qa'\ndataset = 'missing.jsonl'\n", "[qa]: dataset "),
            ("benchmarks = 1\n", "unknown key 'benchmarks' (did you mean 'benchmark'?)"),
        ]
        for body, want in cases:
            path = write_suite(self.dir, "model = 'm'\nbase_url = '%s'\nout = 'bad'\n%s" % (url, body), "bad.toml")
            res = run_cli(["suite", path], timeout=60)
            self.assertEqual(res.returncode, 2, (body, res.stderr))
            err = res.stderr.strip().splitlines()
            self.assertEqual(len(err), 1, res.stderr)
            self.assertIn(path, err[0])
            self.assertIn(want, err[0])
            self.assertFalse(os.path.exists(os.path.join(self.dir, "bad")), body)

    def test_two_shards_merged_equal_one_suite(self):
        url = self.mock(skill=0.7).url
        path = self.four(url)
        res = run_cli(["suite", path, "--no-progress"], timeout=300)
        self.assertEqual(res.returncode, 0, res.stderr)
        sharded = os.path.join(self.dir, "runs", "sharded")
        for i in range(2):
            res = run_cli(["suite", path, "--no-progress", "--shard", "%d/2" % i, "--out", sharded], timeout=300)
            self.assertEqual(res.returncode, 0, res.stderr)
        res = run_cli(["merge", sharded])
        self.assertEqual(res.returncode, 0, res.stderr)
        for bench in ("qa", "mmlu", "bfcl", "humaneval"):
            one = {r["id"]: r["score"] for r in read_samples(os.path.join(self.dir, "runs", "nightly", "m", bench))}
            two = {r["id"]: r["score"] for r in read_samples(os.path.join(sharded, "m", bench))}
            self.assertEqual(two, one, bench)
        with open(os.path.join(sharded, "suite.json")) as fh:
            self.assertEqual([b["state"] for b in json.load(fh)["benchmarks"]], ["merged"] * 4)


class TestKeys(_Suite):
    def test_the_files_api_key_env_names_the_variable_holding_the_key_which_is_written_nowhere(self):
        key = "sk-suite-test-0123456789abcdef"
        mock = self.mock(api_key=key)
        path = write_suite(self.dir, 'model = "m"\nbase_url = "%s"\napi_key_env = "EVH_SUITE_KEY"\nout = "k"\n'
                                     '[[benchmark]]\nname = "qa"\ndataset = "qa.jsonl"\n' % mock.url)
        res = run_cli(["suite", path, "--no-progress"], env=clean_env(EVH_SUITE_KEY=key), timeout=120)
        self.assertEqual(res.returncode, 0, res.stderr)
        for base, _dirs, files in os.walk(os.path.join(self.dir, "k")):
            for name in files:
                with open(os.path.join(base, name), "rb") as fh:
                    self.assertNotIn(key.encode(), fh.read(), name)


class TestModels(_Suite):
    def test_two_models_give_two_rows_and_each_endpoint_has_a_gate_of_its_own(self):
        """Each [[model]] pins its own concurrency; its two benchmarks together never have more requests in flight
        at its endpoint than that (one gate for both), and do reach it."""
        a, b = self.mock(ttft_s=0.05, model="a"), self.mock(ttft_s=0.05, model="b")
        write_jsonl(os.path.join(self.dir, "qa2.jsonl"), qa_rows(30, prefix="r"))
        path = write_suite(self.dir, '''\
out = "runs/two"
[[model]]
model = "a"
base_url = "%s"
fixed_concurrency = 2
[[model]]
model = "b"
base_url = "%s"
label = "bee"
fixed_concurrency = 3
[[benchmark]]
name = "one"
dataset = "qa.jsonl"
[[benchmark]]
name = "two"
dataset = "qa2.jsonl"
''' % (a.url, b.url))
        res = run_cli(["suite", path, "--json", "--no-progress"], timeout=300)
        self.assertEqual(res.returncode, 0, res.stderr)
        board = json.loads(res.stdout)
        self.assertEqual(sorted(board["rows"]), ["a", "bee"])
        self.assertEqual(board["columns"], ["one", "two"])
        self.assertEqual(a.stats()["max_active"], 2)
        self.assertEqual(b.stats()["max_active"], 3)


if __name__ == "__main__":
    unittest.main()
