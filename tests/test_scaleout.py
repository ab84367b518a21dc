"""Beyond one machine: `run --shard I/N` and `merge`, end to end against the mock model over real loopback HTTP
(shards as separate `run` processes), compared with a single-process run of the same dataset."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import unittest

from tests import slurmbed
from tests.support import CLI, MODULE, clean_env, eh, qa_rows, read_samples, run_cli, start_mock, tempdir, \
    write_jsonl

TIMING = ("started_at", "finished_at", "latency_s", "ttft_s")


def by_id(run_dir):
    """{id: record without its wall-clock fields}; fails on a duplicate id."""
    out = {}
    for rec in read_samples(run_dir):
        assert rec["id"] not in out, "duplicate id %s in %s" % (rec["id"], run_dir)
        out[rec["id"]] = {k: v for k, v in rec.items() if k not in TIMING}
    return out


def summary_of(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as fh:
        summary = json.load(fh)
    return {k: v for k, v in summary.items() if k not in ("performance", "status", "shards")}


def output_bytes(run_dir):
    names = ("samples.jsonl", "summary.json", "run.json", "events.jsonl", "report.html")
    out = {}
    for name in names:
        with open(os.path.join(run_dir, name), "rb") as fh:
            out[name] = fh.read()
    return out


class ShardCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempdir(self)
        self.rows = qa_rows(60)
        self.mock = start_mock(self, oracle_rows=self.rows, seed=3, skill=0.6)
        self.ds = write_jsonl(os.path.join(self.dir, "qa.jsonl"), self.rows)

    def run_args(self, out, *extra, dataset=None):
        return ["run", "--dataset", dataset or self.ds, "--model", "m", "--base-url", self.mock.url, "--out", out,
                "--no-progress"] + list(extra)

    def run_ok(self, args, **kw):
        res = run_cli(args, **kw)
        self.assertIn(res.returncode, (0, 1), res.stderr)  # 1: wrong answers only, never a failure here
        return res

    def sharded(self, out, count, *extra):
        for i in range(count):
            self.run_ok(self.run_args(out, "--shard", "%d/%d" % (i, count), *extra))


class TestShards(ShardCase):
    def test_shards_partition_the_dataset_stably_when_it_is_reordered_or_grows(self):
        ids = [r["id"] for r in self.rows]
        parts = [{i for i in ids if eh.shard_of(i, 4) == k} for k in range(4)]
        self.assertEqual(set().union(*parts), set(ids))
        self.assertEqual(sum(len(p) for p in parts), len(ids))
        self.assertTrue(all(5 <= len(p) <= 25 for p in parts), [len(p) for p in parts])  # a hash, not a range
        out = os.path.join(self.dir, "a")
        res = self.run_ok(self.run_args(out, "--shard", "1/4"))
        self.assertIn("(shard 1 of 4: a part of the run", res.stdout)  # its score is never read as the run's
        self.assertEqual(set(by_id(os.path.join(out, "shard-1-of-4"))), parts[1])
        self.assertIn("(shard 1 of 4", run_cli(["report", os.path.join(out, "shard-1-of-4")]).stdout)
        grown = write_jsonl(os.path.join(self.dir, "grown.jsonl"), list(reversed(self.rows)) + qa_rows(10, "new"))
        out2 = os.path.join(self.dir, "b")
        self.run_ok(self.run_args(out2, "--shard", "1/4", dataset=grown))
        got = set(by_id(os.path.join(out2, "shard-1-of-4")))
        self.assertEqual(got & set(ids), parts[1])  # every old row stays in its shard
        with open(os.path.join(out2, "shard-1-of-4", "run.json")) as fh:
            shard = json.load(fh)["shard"]
        self.assertEqual((shard["index"], shard["count"], shard["samples"], shard["samples_total"]),
                         (1, 4, len(got), 70))

    def test_shard_auto_reads_slurm_and_kubernetes_variables_and_refuses_without_them(self):
        self.assertEqual(eh.parse_shard("auto", {"SLURM_ARRAY_TASK_ID": "6", "SLURM_ARRAY_TASK_MIN": "4",
                                                 "SLURM_ARRAY_TASK_COUNT": "3"}), (2, 3))
        self.assertEqual(eh.parse_shard("auto", {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "0",
                                                 "SLURM_ARRAY_TASK_MAX": "4"}), (1, 5))
        self.assertEqual(eh.parse_shard("auto/8", {"JOB_COMPLETION_INDEX": "7"}), (7, 8))
        self.assertEqual(eh.parse_shard("auto/8", {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "3"}),
                         (3, 8))  # the count given: the task id as it is (a resubmitted single task keeps its shard)
        for text, env in (("auto", {}), ("auto/4", {}), ("3/3", {}), ("x/2", {}), ("auto/2", {"JOB_COMPLETION_INDEX":
                                                                                               "5"})):
            with self.assertRaises(eh.ConfigError, msg=text):
                eh.parse_shard(text, env)
        res = run_cli(self.run_args(os.path.join(self.dir, "c"), "--shard", "auto"))
        self.assertEqual(res.returncode, 2)
        self.assertEqual(len(res.stderr.strip().splitlines()), 1, res.stderr)
        self.assertIn("SLURM_ARRAY_TASK_ID is not set", res.stderr)

    def test_slurm_dry_run_prints_scripts_that_run_python3_from_path_and_writes_nothing(self):
        out = os.path.join(self.dir, "dry")
        res = run_cli(["slurm", "submit", "--shards", "2", "--dry-run", "--", "--dataset", self.ds, "--model", "m",
                       "--base-url", self.mock.url, "--out", out])
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertFalse(os.path.exists(out))  # printed only
        self.assertIn("# %s (not written: --dry-run)" % os.path.join(out, "slurm", "array.sh"), res.stdout)
        self.assertIn("\nexec python3 %s run " % MODULE, res.stdout)
        self.assertIn("\nexec python3 %s merge %s --partial" % (MODULE, out), res.stdout)
        self.assertIn("with python3 (from the nodes' PATH; slurm submit --python PATH names another)", res.stdout)
        self.assertNotIn(sys.executable, res.stdout)  # this host's interpreter (a pyenv folder under ~)
        named = run_cli(["slurm", "submit", "--shards", "2", "--dry-run", "--python", "/opt/py/bin/python3.11", "--",
                         "--dataset", self.ds, "--model", "m", "--out", out])
        self.assertEqual(named.stdout.count("\nexec /opt/py/bin/python3.11 %s " % MODULE), 2, named.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "c")))


class TestMerge(ShardCase):
    def test_a_merged_run_equals_a_single_process_run_sample_for_sample(self):
        single, out = os.path.join(self.dir, "single"), os.path.join(self.dir, "sharded")
        self.run_ok(self.run_args(single, "--epochs", "2"))
        self.sharded(out, 3, "--epochs", "2")
        res = run_cli(["merge", out])
        self.assertIn(res.returncode, (0,), res.stderr)
        self.assertIn("merged 3 of 3 shard(s)", res.stdout)
        merged, one = by_id(out), by_id(single)
        self.assertEqual(len(merged), 120)
        self.assertEqual(merged, one)
        self.assertEqual(summary_of(out), summary_of(single))
        with open(os.path.join(out, "run.json")) as fh:
            info = json.load(fh)
        self.assertEqual((info["status"], info["dataset"]["rows"], len(info["merged_from"])), ("finished", 120, 3))
        self.assertNotIn("discovered_limit", info)  # a shard's limit is its share: per shard, in merged_from only
        self.assertEqual(len([m for m in info["merged_from"] if "discovered_limit" in m]), 3)
        self.assertIsNone(info["config"]["shard"])
        events = eh._read_jsonl_tolerant(os.path.join(out, "events.jsonl"))
        self.assertEqual(sorted({e["shard"] for e in events if e["type"] == "run_start"}), [0, 1, 2])
        self.assertEqual([e["t"] for e in events], sorted(e["t"] for e in events))
        with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
            self.assertIn("120", fh.read())
        report = run_cli(["report", out, "--json"])
        self.assertEqual(report.returncode, 0, report.stderr)

    def test_merge_refuses_mixed_runs_and_overlapping_shards_with_one_line_each(self):
        a, b = os.path.join(self.dir, "a"), os.path.join(self.dir, "b")
        self.sharded(a, 2)
        self.run_ok(self.run_args(b, "--shard", "1/2", "--temperature", "0.5"))
        cases = ((["merge", os.path.join(self.dir, "m1"), os.path.join(a, "shard-0-of-2"),
                   os.path.join(b, "shard-1-of-2")], "shards of different runs (the settings differ: temperature"),
                 (["merge", os.path.join(self.dir, "m2"), a, os.path.join(b, "shard-1-of-2")],
                  "shards of different runs"),
                 (["merge", os.path.join(self.dir, "m3"), os.path.join(a, "shard-1-of-2"),
                   os.path.join(a, "shard-1-of-2")], "both shard 1 of 2 (overlapping shards)"))
        for args, want in cases:
            res = run_cli(args)
            self.assertEqual(res.returncode, 2, res.stderr)
            self.assertEqual(len(res.stderr.strip().splitlines()), 1, res.stderr)
            self.assertIn(want, res.stderr)
            self.assertFalse(os.path.exists(args[1]), args)  # nothing written
        three = os.path.join(self.dir, "three")
        self.run_ok(self.run_args(three, "--shard", "0/3"))
        res = run_cli(["merge", os.path.join(self.dir, "m4"), os.path.join(a, "shard-0-of-2"),
                       os.path.join(three, "shard-0-of-3")])
        self.assertEqual(res.returncode, 2)
        self.assertIn("the shard count differ: 2 vs 3", res.stderr)

    def test_missing_and_incomplete_shards_are_named_and_partial_merges_what_is_there(self):
        out = os.path.join(self.dir, "out")
        self.sharded(out, 3)
        os.rename(os.path.join(out, "shard-2-of-3"), os.path.join(self.dir, "away"))
        path = os.path.join(out, "shard-1-of-3", "samples.jsonl")
        with open(path) as fh:
            lines = fh.readlines()
        with open(path, "w") as fh:
            fh.writelines(lines[:3])
        res = run_cli(["merge", out])
        self.assertEqual(res.returncode, 2)
        self.assertIn("shard 2 of 3 missing", res.stderr)
        self.assertIn("shard 1 (%s: 3 of %d samples) incomplete" % (os.path.join(out, "shard-1-of-3"), len(lines)),
                      res.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "samples.jsonl")))
        res = run_cli(["merge", out, "--partial"])
        self.assertEqual(res.returncode, 1, res.stderr)
        self.assertIn("partial", res.stdout)
        with open(os.path.join(out, "summary.json")) as fh:
            summary = json.load(fh)
        self.assertEqual(summary["status"], "partial")
        self.assertEqual(summary["counts"]["total"], 60)
        self.assertEqual(summary["counts"]["pending"], 60 - len(by_id(out)))
        self.assertEqual(len(summary["shards"]["gaps"]), 2)
        # the missing shard comes back, the incomplete one resumes: the merge is whole again
        os.rename(os.path.join(self.dir, "away"), os.path.join(out, "shard-2-of-3"))
        self.run_ok(self.run_args(out, "--shard", "1/3"))
        res = run_cli(["merge", out])
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(len(by_id(out)), 60)

    def test_a_merge_killed_with_sigkill_and_run_again_gives_the_same_output(self):
        rows = qa_rows(3000)
        mock = start_mock(self, oracle_rows=rows, seed=1, skill=0.5)
        ds = write_jsonl(os.path.join(self.dir, "big.jsonl"), rows)
        out = os.path.join(self.dir, "big")
        for i in range(2):
            res = run_cli(["run", "--dataset", ds, "--model", "m", "--base-url", mock.url, "--out", out,
                           "--no-progress", "--shard", "%d/2" % i], timeout=300)
            self.assertIn(res.returncode, (0, 1), res.stderr)
        whole = os.path.join(self.dir, "whole")
        t0 = time.monotonic()
        res = run_cli(["merge", whole, out])
        took = time.monotonic() - t0
        self.assertEqual(res.returncode, 0, res.stderr)
        want = output_bytes(whole)
        midway = 0
        # killed at a share of a whole merge's time (start-up included), then as soon as its first output is there
        # (a machine whose load moved between the timed merge and these can put every timed kill before or after)
        for i, share in enumerate((0.5, 0.65, 0.8, 0.9, 0.95, "first output", "first output")):
            if share == "first output" and midway:
                break
            target = os.path.join(self.dir, "killed-%d" % i)
            proc = subprocess.Popen([sys.executable, CLI, "merge", target, out], env=clean_env(),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if share == "first output":
                deadline = time.monotonic() + 120
                while proc.poll() is None and time.monotonic() < deadline:
                    if os.path.isdir(target) and set(os.listdir(target)) & set(want):
                        break
                    time.sleep(0.002)
            else:
                time.sleep(took * share)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
            left = os.listdir(target) if os.path.isdir(target) else []
            if proc.returncode == -signal.SIGKILL and not set(want) <= set(left) and left:
                midway += 1  # killed with some of the output written
            res = run_cli(["merge", target, out])
            self.assertEqual(res.returncode, 0, res.stderr)
            got = output_bytes(target)
            self.assertEqual(sorted(got), sorted(want))
            for name in want:  # the report names its own directory
                self.assertEqual(got[name].replace(target.encode(), b"OUT"), want[name].replace(whole.encode(),
                                                                                             b"OUT"), name)
            self.assertEqual([n for n in os.listdir(target) if ".tmp." in n], [])  # no temporary file left
        self.assertGreater(midway, 0, "no merge was killed with part of its output written: nothing was tested")


class TestSharedGate(unittest.TestCase):
    """The shards of one run share the endpoint's limit through OUT/.gate/ (the files are real, the heartbeat is
    driven by hand, the clock injected)."""

    def setUp(self):
        self.dir = os.path.join(tempdir(self), ".gate")
        self.now = [1000.0]

    def shard(self, index, initial=16):
        make = lambda start: eh.GradientLimit(start, 1, 256)
        s = eh._SharedLimit(self.dir, index, make, initial, clock=lambda: self.now[0], heartbeat=False)
        self.addCleanup(s.close)
        return s

    def test_the_lowest_live_shard_leads_and_every_shard_runs_at_the_total_over_the_live_count(self):
        a = self.shard(0)
        self.assertTrue(a.leader)
        self.assertEqual((a.limit, a.total), (16, 16))
        b = self.shard(1)  # joins: takes its share of the leader's total at once
        self.assertFalse(b.leader)
        self.assertEqual(b.limit, 8)
        a.beat()  # the leader sees two live shards: 16 over 2
        self.assertEqual((a.limit, a.live), (8, 2))
        c = self.shard(2)
        a.beat(), b.beat(), c.beat()
        self.assertAlmostEqual(a.limit * 3, 16, delta=0.01)
        self.assertEqual((b.limit, c.limit), (a.limit, a.limit))
        self.assertEqual(b.on_sample(1.0, b.window_stamp(), 1.0, 1.0), a.limit)  # a follower does not adapt
        a.close()  # the leader finished: the next lowest leads the same total, over the two left
        b.beat(), c.beat()
        self.assertTrue(b.leader)
        self.assertAlmostEqual(b.limit * 2, 16, delta=0.01)
        self.assertEqual(c.limit, b.limit)

    def test_a_shared_limit_behind_a_session_gate_does_not_climb_even_in_a_controller_made_on_promotion(self):
        # an agent run's shards: SessionGate tells each shard's gate; the leader's controller stops climbing, and so
        # does the one a follower makes when it takes the lead
        a, b = self.shard(0), self.shard(1)
        for s in (a, b):
            eh.SessionGate(eh.AdaptiveGate(8, 1, 256, algorithm=s))
        self.assertFalse(a._inner._climb)
        a.close()
        b.beat()
        self.assertTrue(b.leader)
        self.assertFalse(b._inner._climb)
        self.assertTrue(self.shard(2)._inner._climb)  # (a controller not told climbs)

    def test_the_leader_reads_its_requests_load_as_the_endpoint_had_it_with_the_followers(self):
        a, b = self.shard(0), self.shard(1)
        gate_b = eh.AdaptiveGate(8, 1, 256, algorithm=b)
        b.gate = gate_b
        permits = [gate_b.try_acquire() for _ in range(5)]
        self.assertTrue(all(permits))
        b.beat()
        a.beat()
        self.assertEqual(a._others, 5)  # from b's file
        seen = []
        inner_on_sample = a._inner.on_sample
        a._inner.on_sample = lambda now, stamp, speed, load, elapsed, ttft_s: seen.append((load, ttft_s)) or \
            inner_on_sample(now, stamp, speed, load, elapsed, ttft_s)
        a.on_sample(1.0, a.window_stamp(), 10.0, 3.0, 0.5, ttft_s=0.2)
        self.assertEqual(seen, [(8.0, 0.2)])  # 3 of its own and b's 5; its first token reaches the leader's controller

    def test_a_killed_shard_stops_counting_once_its_file_is_stale(self):
        a, b = self.shard(0), self.shard(1)
        a.beat()
        self.assertEqual(a.live, 2)
        self.now[0] += eh.SHARED_GATE_STALE_S + 1  # b was killed: its file is no longer rewritten
        a.beat()
        self.assertEqual((a.live, a.limit), (1, 16))
        b.close()

    def test_a_followers_overload_reaches_the_leaders_controller(self):
        a, b = self.shard(0), self.shard(1)
        a.beat(), b.beat()
        before = a.limit
        b.on_overload(5.0, 0.0, None)
        self.assertLess(b.limit, before)  # backs off at once ...
        b.beat()
        a.beat()  # ... and the leader cuts the total
        self.assertLess(a.total, 2 * before)
        self.assertLess(a.limit, before)
        b.beat()
        self.assertEqual(b.limit, a.limit)

    def test_two_shard_processes_share_the_limit_while_they_run_and_leave_no_file(self):
        d = tempdir(self)
        rows = qa_rows(80)
        mock = start_mock(self, oracle_rows=rows, ttft_s=0.2)
        ds = write_jsonl(os.path.join(d, "qa.jsonl"), rows)
        out = os.path.join(d, "out")
        procs = [subprocess.Popen([sys.executable, CLI, "run", "--dataset", ds, "--model", "m", "--base-url",
                                   mock.url, "--out", out, "--no-progress", "--initial-concurrency", "2",
                                   "--shard", "%d/2" % i], env=clean_env(), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE) for i in range(2)]
        seen = []
        gate_dir = os.path.join(out, ".gate")
        while any(p.poll() is None for p in procs):
            files = [eh._read_json_file(os.path.join(gate_dir, n)) for n in
                     (os.listdir(gate_dir) if os.path.isdir(gate_dir) else [])]
            files = [f for f in files if f]
            if len(files) == 2 and all(f["live"] == 2 for f in files):
                seen.append(sorted((f["index"], f["leader"], f["limit"], f["total"]) for f in files))
            time.sleep(0.05)
        for p in procs:
            _, err = p.communicate(timeout=60)
            self.assertIn(p.returncode, (0, 1), err)
        self.assertTrue(seen, "the two shards never ran at the same time")
        self.assertTrue(all([x[1] for x in s] == [True, False] for s in seen))  # shard 0 leads
        self.assertTrue(any(s[0][2] == s[1][2] and s[0][3] == s[1][3] for s in seen), seen)  # at the leader's share
        self.assertEqual(os.listdir(gate_dir), [])  # each removed its file at its end
        self.assertEqual(len(by_id(os.path.join(out, "shard-0-of-2"))) + len(by_id(os.path.join(out,
                                                                                              "shard-1-of-2"))), 80)


class TestSlurm(ShardCase):
    """A real Slurm 22.05 cluster (munged, slurmctld, two slurmd on this host: tests/slurmbed.py); the array tasks
    run `evalharness.py run --shard auto/4` against the mock in this process over loopback."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = slurmbed.SlurmCluster(nodes=2)
        cls.cluster.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.__exit__(None, None, None)

    def setUp(self):
        super().setUp()
        self.rows = qa_rows(200)
        self.ds = write_jsonl(os.path.join(self.dir, "qa200.jsonl"), self.rows)
        self.env = clean_env(SLURM_CONF=self.cluster.env()["SLURM_CONF"])

    def slurm(self, *args):
        res = run_cli(["slurm"] + list(args), env=self.env)
        self.assertEqual(res.returncode, 0, res.stderr)
        return res

    def submit(self, mock, out, *extra):
        res = self.slurm("submit", "--shards", "4", "--time", "0:05:00", "--", "--dataset", self.ds, "--model", "m",
                         "--base-url", mock.url, "--out", out, "--no-progress", *extra)
        self.assertRegex(res.stdout, r"submitted array job \d+ \(4 shards\) and merge job \d+")
        return res

    def status(self, out):
        return json.loads(self.slurm("status", out, "--json").stdout)

    def wait_merge(self, out, timeout_s=240):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            st = self.status(out)
            if st["merge"].get("state") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
                return st
            time.sleep(0.5)
        self.fail("the merge job did not end in %d s: %s\n%s" % (timeout_s, st, self.cluster.log_tail()))

    def single(self, mock):
        single = os.path.join(self.dir, "single")
        self.run_ok(["run", "--dataset", self.ds, "--model", "m", "--base-url", mock.url, "--out", single,
                     "--no-progress"])
        return by_id(single), summary_of(single)

    def test_a_200_row_run_as_a_4_task_array_then_its_merge_job_equals_one_process(self):
        mock = start_mock(self, oracle_rows=self.rows, seed=5, skill=0.6)
        out = os.path.join(self.dir, "cluster")
        self.submit(mock, out)
        st = self.wait_merge(out)
        self.assertEqual(st["merge"]["state"], "COMPLETED", st)
        self.assertEqual(st["merge"]["result"], "finished")
        self.assertEqual({r["slurm"] for r in st["shards"]}, {"COMPLETED"})
        self.assertEqual(sum(r["done"] for r in st["shards"]), 200)
        one, one_summary = self.single(mock)
        merged = by_id(out)  # fails on an id twice
        self.assertEqual(merged, one)
        self.assertEqual(summary_of(out), one_summary)
        nodes = {r["node"] for r in st["shards"]}
        self.assertEqual(nodes, {"n1", "n2"})  # the array spread over both nodes
        with open(os.path.join(out, "slurm", "array.sh")) as fh:
            script = fh.read()
        self.assertIn("#SBATCH --array=0-3", script)
        self.assertIn("--shard auto/4", script)
        self.assertEqual(len([n for n in os.listdir(os.path.join(out, "slurm")) if n.endswith(".out")]), 5)

    def test_a_suite_runs_as_one_array_and_one_merge_job_equal_to_one_process(self):
        """Issue 50: `slurm submit --shards 2 -- suite FILE`: each array task runs its shard of every benchmark,
        the merge job merges every benchmark; the result equals the suite run in one process."""
        mock = start_mock(self, oracle_rows=self.rows, seed=5, skill=0.6)
        write_jsonl(os.path.join(self.dir, "a.jsonl"), self.rows[:60])
        write_jsonl(os.path.join(self.dir, "b.jsonl"), self.rows[60:100])
        path = os.path.join(self.dir, "nightly.toml")
        with open(path, "w") as fh:
            fh.write('model = "m"\nbase_url = "%s"\n[[benchmark]]\nname = "a"\ndataset = "a.jsonl"\n'
                     '[[benchmark]]\nname = "b"\ndataset = "b.jsonl"\n' % mock.url)
        out = os.path.join(self.dir, "cluster-suite")
        res = self.slurm("submit", "--shards", "2", "--time", "0:05:00", "--", "suite", path, "--out", out)
        self.assertRegex(res.stdout, r"submitted array job \d+ \(2 shards\) and merge job \d+")
        st = self.wait_merge(out)
        self.assertEqual((st["merge"]["state"], st["merge"]["result"]), ("COMPLETED", "finished"), st)
        self.assertEqual(sum(r["done"] for r in st["shards"]), 100)
        with open(os.path.join(out, "slurm", "array.sh")) as fh:
            self.assertIn("suite %s --no-progress --out %s --shard auto/2" % (path, out), fh.read())
        single = os.path.join(self.dir, "single-suite")
        self.run_ok(["suite", path, "--out", single, "--no-progress"])
        for bench in ("a", "b"):
            self.assertEqual(by_id(os.path.join(out, "m", bench)), by_id(os.path.join(single, "m", bench)), bench)

    def test_the_jobs_run_where_the_submitting_interpreter_does_not_exist(self):
        # submit with an interpreter whose path the nodes do not have (a pyenv or venv folder of the submitting
        # host: here a folder removed before the jobs start), from a directory of its own
        mock = start_mock(self, oracle_rows=self.rows[:24], seed=7, skill=0.6)
        ds = write_jsonl(os.path.join(self.dir, "qa24.jsonl"), self.rows[:24])
        host = os.path.join(self.dir, "host-only")
        os.makedirs(os.path.join(host, "bin"))
        python = os.path.join(host, "bin", "python3")
        os.symlink(os.path.realpath(sys.executable), python)
        out = os.path.join(self.dir, "elsewhere")
        res = subprocess.run([python, MODULE, "slurm", "submit", "--shards", "2", "--sbatch-option=--hold", "--",
                              "--dataset", ds, "--model", "m", "--base-url", mock.url, "--out", out, "--no-progress"],
                             env=self.env, cwd=host, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, timeout=60)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("the jobs run %s (the module) with python3 (from the nodes' PATH" % MODULE, res.stdout)
        jobs = re.search(r"array job (\d+) .* merge job (\d+)", res.stdout).groups()
        for name in ("array.sh", "merge.sh"):
            with open(os.path.join(out, "slurm", name)) as fh:
                script = fh.read()
            self.assertNotIn(python, script)
            self.assertRegex(script, r"\nexec python3 ")
        # the jobs start once the submitting interpreter is gone: from a directory where its path does not exist
        os.unlink(python)
        os.rmdir(os.path.join(host, "bin"))
        for job in jobs:
            rel = subprocess.run(["scontrol", "release", job], env=self.env, stderr=subprocess.PIPE, timeout=30)
            self.assertEqual(rel.returncode, 0, rel.stderr)
        st = self.wait_merge(out)
        self.assertEqual(st["merge"]["state"], "COMPLETED", (st, self.cluster.log_tail()))
        self.assertEqual(st["merge"]["result"], "finished")
        self.assertEqual(sum(r["done"] for r in st["shards"]), 24)

    def test_a_task_cancelled_mid_run_then_a_resubmit_is_still_exactly_once_and_complete(self):
        mock = start_mock(self, oracle_rows=self.rows, seed=6, skill=0.6, ttft_s=0.08)
        out = os.path.join(self.dir, "cancelled")
        res = self.submit(mock, out, "--fixed-concurrency", "1")
        array = re.search(r"array job (\d+)", res.stdout).group(1)
        shard0 = os.path.join(out, "shard-0-of-4", "samples.jsonl")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(eh._read_jsonl_tolerant(shard0)) < 3:
            time.sleep(0.2)
        self.assertGreaterEqual(len(eh._read_jsonl_tolerant(shard0)), 3, "shard 0 wrote fewer than 3 samples in "
                                "120 s: the cancel would not land mid-run\n%s" % self.cluster.log_tail())
        cancel = subprocess.run(["scancel", "%s_0" % array], env=self.env, stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(cancel.returncode, 0, cancel.stderr)
        st = self.wait_merge(out)
        rows0 = next(r for r in st["shards"] if r["shard"] == 0)
        self.assertEqual(rows0["slurm"], "CANCELLED", st)
        self.assertLess(rows0["done"], rows0["samples"])
        self.assertEqual(st["merge"]["result"], "partial")  # the merge job ran, said so, and exited 1
        with open(os.path.join(out, "shard-0-of-4", "run.json")) as fh:
            history = json.load(fh)["history"]
        self.assertIn(history[-1]["status"], ("interrupted", "killed"))
        self.submit(mock, out, "--fixed-concurrency", "1")  # the same command again
        st = self.wait_merge(out)
        self.assertEqual(st["merge"]["state"], "COMPLETED", st)
        self.assertEqual(st["merge"]["result"], "finished")
        self.assertEqual(st["submissions"], 2)
        one, _ = self.single(mock)
        self.assertEqual(by_id(out), one)  # each id once, all 200
        for r in st["shards"]:
            self.assertEqual(len(read_samples(os.path.join(out, "shard-%d-of-4" % r["shard"]))),
                             len(by_id(os.path.join(out, "shard-%d-of-4" % r["shard"]))))  # no duplicate line


if __name__ == "__main__":
    unittest.main()
