"""Run identity, resume and outages, end to end: `run` in a subprocess against the mock model over real loopback
HTTP (in this process, or a `serve-mock` subprocess where the test kills and restarts the server)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import unittest

from tests.support import CLI, clean_env, dead_port, eh, qa_rows, read_samples, run_cli, start_mock, tempdir, \
    wait_until, whole_samples, write_jsonl


def deterministic(summary):
    """The summary without wall-clock measurements (latency, throughput), which differ run to run."""
    return {k: v for k, v in summary.items() if k not in ("performance", "status")}


def summary_of(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as fh:
        return json.load(fh)


def changed_rows(rows, which):
    """The same ids, other questions and answers for the rows at the positions ``which``."""
    out = []
    for i, row in enumerate(rows):
        if i in which:
            row = dict(row, prompt="What is %d times 3?" % i, answer=str(3 * i))
        out.append(row)
    return out


def oracle_extra(rows, which):
    """The changed rows under ids of their own, for the mock's oracle (it answers by the question's text)."""
    return [dict(r, id="new-" + r["id"]) for i, r in enumerate(rows) if i in which]


class IdentityCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempdir(self)
        self.rows = qa_rows(30)

    def dataset(self, rows, name="qa.jsonl"):
        return write_jsonl(os.path.join(self.dir, name), rows)

    def args(self, url, out, dataset, *extra):
        argv = ["run", "--dataset", dataset, "--model", "m", "--base-url", url, "--request-timeout", "10",
                "--no-progress"]
        return argv + (["--out", out] if out else []) + list(extra)

    def requests(self, mock):
        return mock.stats()["counters"].get("requests", 0)

    def finished(self, out):
        """Whole lines of OUT/samples.jsonl (a line the run is writing is not yet one: CI once read half a line)."""
        path = os.path.join(out, "samples.jsonl")
        if not os.path.exists(path):
            return 0
        with open(path, "rb") as fh:
            return fh.read().count(b"\n")

    def kill_after(self, argv, out, n_finished, timeout_s=60):
        """Start `run ARGV`, SIGKILL it once ``n_finished`` samples are on disk."""
        proc = subprocess.Popen([sys.executable, CLI] + argv, env=clean_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        self.assertTrue(wait_until(lambda: self.finished(out) >= n_finished, timeout_s))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()


class TestRunIdentity(IdentityCase):
    def test_a_changed_dataset_reruns_only_the_changed_rows_and_equals_a_fresh_run(self):
        b_rows = changed_rows(self.rows, {3, 7, 20})
        mock = start_mock(self, oracle_rows=self.rows + oracle_extra(b_rows, {3, 7, 20}), seed=4, skill=0.7)
        a, b = self.dataset(self.rows, "a.jsonl"), self.dataset(b_rows, "b.jsonl")
        out = os.path.join(self.dir, "run")
        self.assertEqual(run_cli(self.args(mock.url, out, a)).returncode, 0)
        before = self.requests(mock)
        res = run_cli(self.args(mock.url, out, b))
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("3 changed row(s) run again", res.stderr)
        self.assertEqual(self.requests(mock) - before, 3)
        ids = [r["id"] for r in read_samples(out)]
        self.assertEqual(sorted(ids), sorted(r["id"] for r in b_rows))  # every id once
        fresh = os.path.join(self.dir, "fresh")
        self.assertEqual(run_cli(self.args(mock.url, fresh, b)).returncode, 0)
        self.assertEqual(deterministic(summary_of(out)), deterministic(summary_of(fresh)))
        reported = eh.report_data(eh.load_run(out))["summary"]
        for key in ("counts", "score", "by_category", "complete"):
            self.assertEqual(reported[key], summary_of(fresh)[key], key)
        with open(os.path.join(out, "superseded.jsonl")) as fh:
            old = [json.loads(line) for line in fh]
        self.assertEqual(sorted(r["id"] for r in old), ["q20", "q3", "q7"])
        self.assertTrue(all(r["answer"] == a_row["answer"] for r in old for a_row in self.rows
                            if a_row["id"] == r["id"]))

    def test_rows_without_ids_resume_after_the_file_is_reordered(self):
        rows = [{"question": r["prompt"], "answer": r["answer"], "scorer": "numeric"} for r in self.rows[:10]]
        rows.append(dict(rows[0]))  # the same row twice: numbered, both kept
        mock = start_mock(self, oracle_rows=self.rows[:10])
        out = os.path.join(self.dir, "run")
        self.assertEqual(run_cli(self.args(mock.url, out, self.dataset(rows, "a.jsonl"))).returncode, 0)
        n_requests = self.requests(mock)
        before = {r["id"]: r["score"] for r in read_samples(out)}
        self.assertEqual(len(before), 11)
        reordered = self.dataset(list(reversed(rows)), "b.jsonl")
        res = run_cli(self.args(mock.url, out, reordered))
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(self.requests(mock), n_requests)  # every row kept
        self.assertIn("11 of 11 samples kept", res.stderr)
        self.assertEqual({r["id"]: r["score"] for r in read_samples(out)}, before)

    def test_each_changed_generation_setting_refuses_to_resume_naming_it(self):
        mock = start_mock(self, oracle_rows=self.rows, served=("m2",))
        ds = self.dataset(self.rows[:4])
        out = os.path.join(self.dir, "run")
        self.assertEqual(run_cli(self.args(mock.url, out, ds)).returncode, 0)
        before = read_samples(out)
        n_requests = self.requests(mock)
        cases = [(["--temperature", "0.7"], r"temperature 0\.0 -> 0\.7"),
                 (["--max-tokens", "64"], r"max_tokens null -> 64"),
                 (["--system-prompt", "Be brief."], r'system_prompt null -> "Be brief\."'),
                 (["--extra-body", '{"top_p": 0.5}'], r'extra_body null -> \{"top_p": 0\.5\}'),
                 (["--seed", "3"], r"seed null -> 3"),
                 (["--no-stream"], r"stream true -> false"),
                 (["--model", "m2"], r'model "m" -> "m2"')]
        for extra, want in cases:
            res = run_cli(self.args(mock.url, out, ds, *extra))
            self.assertEqual(res.returncode, 2, (extra, res.stderr))
            lines = res.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, res.stderr)
            self.assertRegex(lines[0], r"holds a run made with other generation settings: %s; use another --out "
                                       r"to keep both, or add --restart" % want)
        self.assertEqual(read_samples(out), before)
        self.assertEqual(self.requests(mock), n_requests)
        restarted = run_cli(self.args(mock.url, out, ds, "--temperature", "0.7", "--restart"))
        self.assertEqual(restarted.returncode, 0, restarted.stderr)
        self.assertEqual(self.requests(mock) - n_requests, 4)
        moved = os.listdir(os.path.join(out, "superseded"))
        self.assertEqual(len(moved), 1)
        self.assertEqual(read_samples(os.path.join(out, "superseded", moved[0])), before)
        self.assertEqual(len(read_samples(out)), 4)
        with open(os.path.join(out, "run.json")) as fh:
            self.assertEqual(json.load(fh)["identity"]["settings"]["temperature"], 0.7)

    def test_a_changed_scorer_rescores_stored_answers_without_a_model_request(self):
        mock = start_mock(self, oracle_rows=self.rows, seed=2, skill=0.6)  # replies "The result is N."
        plain = [{k: v for k, v in r.items() if k != "scorer"} for r in self.rows]
        ds = self.dataset(plain)
        out = os.path.join(self.dir, "run")
        self.assertEqual(run_cli(self.args(mock.url, out, ds, "--scorer", "exact")).returncode, 0)
        self.assertEqual(summary_of(out)["score"]["mean"], 0.0)  # a sentence never equals "7" exactly
        n_requests = self.requests(mock)
        res = run_cli(self.args(mock.url, out, ds, "--scorer", "numeric"))
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(self.requests(mock), n_requests)
        self.assertIn("30 stored answer(s) re-scored", res.stderr)
        fresh = os.path.join(self.dir, "fresh")
        self.assertEqual(run_cli(self.args(mock.url, fresh, ds, "--scorer", "numeric")).returncode, 0)
        self.assertGreater(summary_of(out)["score"]["mean"], 0.3)
        self.assertEqual(deterministic(summary_of(out)), deterministic(summary_of(fresh)))
        self.assertEqual(len(read_samples(out)), 30)
        n_requests = self.requests(mock)
        again = run_cli(self.args(mock.url, out, ds, "--scorer", "numeric", "--rescore"))
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("30 stored answer(s) re-scored", again.stderr)
        self.assertEqual(self.requests(mock), n_requests)
        self.assertEqual(deterministic(summary_of(out)), deterministic(summary_of(fresh)))

    def test_the_same_command_without_out_resumes_and_another_model_gets_its_own_directory(self):
        mock = start_mock(self, oracle_rows=self.rows, served=("m2",))
        ds = self.dataset(self.rows[:5])
        cwd = tempdir(self)
        first = run_cli(self.args(mock.url, None, ds), cwd=cwd)
        self.assertEqual(first.returncode, 0, first.stderr)
        dirs = os.listdir(os.path.join(cwd, "runs"))
        self.assertEqual(len(dirs), 1)
        self.assertRegex(dirs[0], r"^qa-m-qa-[0-9a-f]{8}$")
        n_requests = self.requests(mock)
        second = run_cli(self.args(mock.url, None, ds), cwd=cwd)
        self.assertEqual(second.returncode, 0, second.stderr)
        self.assertIn("resuming", second.stderr)
        self.assertEqual(self.requests(mock), n_requests)
        self.assertEqual(os.listdir(os.path.join(cwd, "runs")), dirs)
        other = run_cli(self.args(mock.url, None, ds) + ["--model", "m2"], cwd=cwd)
        self.assertEqual(other.returncode, 0, other.stderr)
        self.assertEqual(len(os.listdir(os.path.join(cwd, "runs"))), 2)
        self.assertEqual(self.requests(mock), n_requests + 5)


class TestOutages(IdentityCase):
    """The endpoint is a `serve-mock` process killed with SIGKILL (a crashed server) and started again."""

    def serve(self, port, oracle):
        proc = subprocess.Popen([sys.executable, CLI, "serve-mock", "--port", str(port), "--model", "m", "--oracle", oracle,
                                 "--decode-tok-s", "60", "--reasoning-tokens", "20"], env=clean_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.wait()))
        line = proc.stdout.readline()
        self.assertIn("listening on", line, proc.stderr.read() if proc.poll() is not None else line)
        return proc

    def start_run(self, url, out, ds, *extra):
        proc = subprocess.Popen([sys.executable, CLI] + self.args(url, out, ds, "--fixed-concurrency", "4",
                                                                      *extra),
                                env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                universal_newlines=True)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        return proc

    def test_a_server_down_for_10s_mid_run_ends_with_every_sample_scored_as_without_the_outage(self):
        ds = self.dataset(self.rows)
        ref_mock = start_mock(self, oracle_rows=self.rows, decode_tok_s=60, reasoning_tokens=20)  # as serve()
        ref = os.path.join(self.dir, "ref")
        self.assertEqual(run_cli(self.args(ref_mock.url, ref, ds, "--fixed-concurrency", "4")).returncode, 0)
        port = dead_port()
        url = "http://127.0.0.1:%d/v1" % port
        server = self.serve(port, ds)
        out = os.path.join(self.dir, "run")
        run = self.start_run(url, out, ds)
        self.assertTrue(wait_until(lambda: self.finished(out) >= 3, 30))
        server.kill()
        server.wait()
        time.sleep(10)
        self.assertIsNone(run.poll(), "the run gave up during a 10 s outage")
        self.serve(port, ds)
        _, err = run.communicate(timeout=120)
        self.assertEqual(run.returncode, 0, err)
        records = read_samples(out)
        self.assertEqual(sorted(r["id"] for r in records), sorted(r["id"] for r in self.rows))
        self.assertEqual([r for r in records if r["status"] != "ok"], [])
        self.assertEqual(deterministic(summary_of(out)), deterministic(summary_of(ref)))
        self.assertTrue(any(r["attempts"] > 1 for r in records), "no request saw the outage")

    def test_an_outage_longer_than_the_budget_exits_3_in_time_and_the_resume_reruns_the_rest_once(self):
        ds = self.dataset(self.rows)
        port = dead_port()
        url = "http://127.0.0.1:%d/v1" % port
        server = self.serve(port, ds)
        out = os.path.join(self.dir, "run")
        run = self.start_run(url, out, ds, "--outage-budget", "4")
        self.assertTrue(wait_until(lambda: self.finished(out) >= 3, 30))
        server.kill()
        server.wait()
        t_kill = time.monotonic()
        _, err = run.communicate(timeout=60)
        elapsed = time.monotonic() - t_kill
        self.assertEqual(run.returncode, 3, err)
        self.assertLess(elapsed, 4 + 8, err)  # the budget plus a few seconds (a request in flight, backoff)
        self.assertGreaterEqual(elapsed, 4, err)
        self.assertRegex(err, r"no successful answer for \d+ s \(outage budget, --outage-budget\); last error: "
                              r"connection refused to %s" % re.escape(url))
        self.assertIn("re-run the same command to resume (run directory %s)" % out, err)
        done = {r["id"] for r in read_samples(out) if r["status"] == "ok"}
        self.assertLess(len(done), 30)
        mock = start_mock(self, oracle_rows=self.rows)
        again = run_cli(self.args(mock.url, out, ds))
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertEqual(self.requests(mock), 30 - len(done))  # each missing sample once
        self.assertEqual(sorted(r["id"] for r in read_samples(out)), sorted(r["id"] for r in self.rows))

    def test_kill_9_during_a_resume_that_reruns_changed_rows_loses_and_duplicates_nothing(self):
        b_rows = changed_rows(self.rows, set(range(0, 30, 2)))
        oracle = self.dataset(self.rows + oracle_extra(b_rows, set(range(0, 30, 2))), "oracle.jsonl")
        a, b = self.dataset(self.rows, "a.jsonl"), self.dataset(b_rows, "b.jsonl")
        port = dead_port()
        self.serve(port, oracle)
        url = "http://127.0.0.1:%d/v1" % port
        out = os.path.join(self.dir, "run")
        self.assertEqual(run_cli(self.args(url, out, a, "--fixed-concurrency", "4")).returncode, 0)
        new_answer = {r["id"]: r["answer"] for i, r in enumerate(b_rows) if i % 2 == 0}
        for n_new in (2, 8):
            run = self.start_run(url, out, b)
            self.assertTrue(wait_until(lambda: sum(1 for r in whole_samples(out)
                                                   if new_answer.get(r["id"]) == r["answer"]) >= n_new, 30))
            run.send_signal(signal.SIGKILL)
            run.communicate()
        again = run_cli(self.args(url, out, b, "--fixed-concurrency", "4"))
        self.assertEqual(again.returncode, 0, again.stderr)
        ids = [r["id"] for r in read_samples(out)]
        self.assertEqual(sorted(ids), sorted(r["id"] for r in b_rows))
        fresh = os.path.join(self.dir, "fresh")
        self.assertEqual(run_cli(self.args(url, fresh, b, "--fixed-concurrency", "4")).returncode, 0)
        self.assertEqual(deterministic(summary_of(out)), deterministic(summary_of(fresh)))


class TestEpochs(IdentityCase):
    def closed_form(self, records, k):
        """pass@k averaged over rows, from the stored outcomes: 1 - C(n-c, k) / C(n, k)."""
        from math import comb
        rows = {}
        for r in records:
            rows.setdefault(r["row_id"], []).append(r["score"])
        vals = [1 - comb(len(v) - int(sum(v)), k) / comb(len(v), k) for v in rows.values()]
        return sum(vals) / len(vals)

    def test_epochs_give_pass_at_k_as_the_closed_form_and_resume_each_row_and_epoch_once(self):
        mock = start_mock(self, oracle_rows=self.rows, skill=0.5, seed=9, decode_tok_s=200, reasoning_tokens=10)
        ds = self.dataset(self.rows[:12])
        out = os.path.join(self.dir, "run")
        self.kill_after(self.args(mock.url, out, ds, "--epochs", "5", "--fixed-concurrency", "2"), out, 15)
        self.assertLess(len(read_samples(out)), 60)
        res = run_cli(self.args(mock.url, out, ds, "--epochs", "5", "--json"))
        self.assertEqual(res.returncode, 0, res.stderr)
        records = read_samples(out)
        pairs = [(r["row_id"], r["epoch"]) for r in records]
        self.assertEqual(sorted(pairs), sorted((r["id"], e) for r in self.rows[:12] for e in range(1, 6)))
        self.assertEqual(sorted(r["id"] for r in records), sorted("%s#%d" % p for p in pairs))
        s = json.loads(res.stdout)
        rep = s["repeats"]
        self.assertEqual((rep["epochs"], rep["rows"]), (5, 12))
        for k in (1, 2, 4, 5):
            self.assertAlmostEqual(rep["pass_at"][str(k)]["value"], self.closed_form(records, k), places=6)
        self.assertAlmostEqual(rep["pass_at"]["1"]["value"], s["score"]["mean"], places=6)  # pass@1 = mean@K
        self.assertGreater(rep["pass_at"]["5"]["value"], rep["pass_at"]["1"]["value"])  # the seeds do differ
        rows = {}
        for r in records:
            rows.setdefault(r["row_id"], []).append(r)
        votes = []
        for samples in rows.values():
            samples.sort(key=lambda r: r["epoch"])
            counts = {}
            for r in samples:
                counts[r["extracted"]] = counts.get(r["extracted"], 0) + 1
            top = max(counts.values())
            winner = next(r for r in samples if counts[r["extracted"]] == top)
            votes.append(winner["score"])
        self.assertAlmostEqual(rep["maj"]["mean"], sum(votes) / len(votes), places=6)
        # the interval is over the 12 rows, not the 60 samples: wider than a per-sample interval would be
        means = [sum(r["score"] for r in v) / 5 for v in rows.values()]
        self.assertAlmostEqual(rep["mean"]["mean"], sum(means) / 12, places=6)
        self.assertEqual(rep["mean"]["n"], 12)
        table = run_cli(["report", out]).stdout
        self.assertIn("mean@5", table)
        self.assertIn("pass@5 %.3f" % rep["pass_at"]["5"]["value"], table)
        changed = run_cli(self.args(mock.url, out, ds, "--epochs", "3"))
        self.assertEqual(changed.returncode, 2, changed.stderr)
        self.assertIn("epochs 5 -> 3", changed.stderr)


class TestJudge(IdentityCase):
    """The judge scorer: a grader model (the mock's judge policy compares the quoted response with the quoted
    reference) through its own client and gate."""

    def setUp(self):
        super().setUp()
        self.plain = [{"id": "j%d" % i, "prompt": "Name thing number %d." % i, "answer": "thing %d" % i,
                       "scorer": "includes"} for i in range(12)]

    def test_judge_scores_as_the_reference_comparison_and_stores_its_prompt_reply_and_tokens(self):
        mock = start_mock(self, oracle_rows=self.plain, skill=0.5, seed=4)
        ds = self.dataset([{k: v for k, v in r.items() if k != "scorer"} for r in self.plain])
        ref = os.path.join(self.dir, "includes")
        self.assertEqual(run_cli(self.args(mock.url, ref, ds, "--scorer", "includes")).returncode, 0)
        grader = start_mock(self, model="grader", served=("grader2",))
        out = os.path.join(self.dir, "judge")
        res = run_cli(self.args(mock.url, out, ds, "--scorer", "judge", "--judge-model", "grader",
                                "--judge-base-url", grader.url))
        self.assertEqual(res.returncode, 0, res.stderr)
        want = {r["id"]: r["score"] for r in read_samples(ref)}
        self.assertTrue(0 < sum(want.values()) < 12)
        records = read_samples(out)
        self.assertEqual({r["id"]: r["score"] for r in records}, want)
        self.assertEqual(self.requests(grader), 12)
        self.assertEqual(self.requests(mock), 24)  # 12 for each run: the grader's requests went to the grader
        for r in records:
            self.assertIn("[Reference answer]\n%s\n" % r["answer"], r["judge"]["prompt"])
            self.assertIn("[Response]\n%s\n" % r["response"], r["judge"]["prompt"])
            self.assertRegex(r["judge"]["reply"], r"GRADE: [CI]$")
            self.assertEqual(r["extracted"], r["judge"]["verdict"])
        s, s_ref = summary_of(out), summary_of(ref)
        self.assertEqual((s["tokens"]["prompt"], s["tokens"]["completion"]),
                         (s_ref["tokens"]["prompt"], s_ref["tokens"]["completion"]))  # the graded model's own
        self.assertEqual(s["tokens"]["judge"]["prompt"], sum(r["judge"]["prompt_tokens"] for r in records))
        self.assertGreater(s["tokens"]["judge"]["prompt"], 0)
        self.assertEqual(s_ref["tokens"]["judge"], {"prompt": 0, "completion": 0})
        other = run_cli(self.args(mock.url, out, ds, "--scorer", "judge", "--judge-model", "grader2",
                                  "--judge-base-url", grader.url))
        self.assertEqual(other.returncode, 2)
        self.assertIn("judge.model \"grader\" -> \"grader2\"", other.stderr)  # a changed judge is another run

    def test_a_judge_that_fails_fails_its_samples_and_the_resume_runs_them_again(self):
        mock = start_mock(self, oracle_rows=self.plain, skill=1.0)
        ds = self.dataset([{k: v for k, v in r.items() if k != "scorer"} for r in self.plain])
        out = os.path.join(self.dir, "run")
        port = dead_port()
        args = self.args(mock.url, out, ds, "--scorer", "judge", "--judge-base-url",
                         "http://127.0.0.1:%d/v1" % port, "--max-retries", "1")
        res = run_cli(args)
        self.assertNotEqual(res.returncode, 0)
        failed = [r for r in read_samples(out) if r["status"] == "failed"]
        self.assertTrue(failed)
        self.assertEqual({r["error_class"] for r in failed}, {"judge"})
        self.assertTrue(all(r["error"].startswith("judge: connection refused") for r in failed), failed[0])
        grader = eh.MockServer(eh.MockConfig(model="m"), port=port).start()  # grades as the evaluated model
        self.addCleanup(grader.close)
        again = run_cli(args)
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("infrastructure failure(s) run again", again.stderr)
        self.assertEqual(sorted(r["id"] for r in read_samples(out)), sorted(r["id"] for r in self.plain))
        self.assertEqual(summary_of(out)["score"]["mean"], 1.0)


class TestHonestHeadlines(IdentityCase):
    def test_a_killed_run_reports_interrupted_and_incomplete_over_n_of_N_in_table_json_and_html(self):
        mock = start_mock(self, oracle_rows=self.rows, decode_tok_s=40, reasoning_tokens=20)
        ds = self.dataset(self.rows)
        out = os.path.join(self.dir, "run")
        self.kill_after(self.args(mock.url, out, ds, "--fixed-concurrency", "2"), out, 3)
        n = len(read_samples(out))
        text = run_cli(["report", out])
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn("| interrupted", text.stdout)
        self.assertNotIn("running", text.stdout)
        self.assertIn("over %d of 30 (%d not run): INCOMPLETE" % (n, 30 - n), text.stdout)
        data = json.loads(run_cli(["report", out, "--json"]).stdout)  # the summary at the top, as run --json
        self.assertEqual(data["status"], "interrupted")
        self.assertFalse(data["complete"])
        self.assertEqual(data["headline"], "score %.3f over %d of 30 (%d not run): INCOMPLETE"
                         % (data["score"]["mean"], n, 30 - n))
        self.assertEqual((data["counts"]["ok"], data["counts"]["total"]), (n, 30))
        self.assertEqual(run_cli(["report", out, "--html"]).returncode, 0)
        with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
            page = fh.read()
        self.assertIn("score over %d of 30 (INCOMPLETE)" % n, page)
        self.assertIn("Incomplete run:", page)
        self.assertIn("status interrupted", page)
        # a live run is still "running"
        live = subprocess.Popen([sys.executable, CLI] + self.args(mock.url, out, ds, "--fixed-concurrency", "1"),
                                env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.addCleanup(lambda: live.poll() is None and live.kill())
        self.assertTrue(wait_until(lambda: "pid %d " % live.pid in open(os.path.join(out, ".lock")).read(), 30))
        self.assertEqual(json.loads(run_cli(["report", out, "--json"]).stdout)["status"], "running")
        live.kill()
        live.communicate()

    def test_answers_cut_at_the_token_limit_are_counted_shown_and_warned_about(self):
        mock = start_mock(self, oracle_rows=self.rows, skill=1.0)  # "The result is N." is 5 tokens
        ds = self.dataset(self.rows[:10])
        out = os.path.join(self.dir, "run")
        res = run_cli(self.args(mock.url, out, ds, "--max-tokens", "3"))
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(summary_of(out)["finish_reasons"], {"length": 10})
        self.assertIn("cut: 10 of 10 answers stopped at the token limit", res.stdout)
        self.assertIn("10 of 10 answers were cut at the token limit (finish_reason length)", res.stderr)
        whole = run_cli(self.args(mock.url, os.path.join(self.dir, "whole"), ds))
        self.assertEqual(summary_of(os.path.join(self.dir, "whole"))["finish_reasons"], {"stop": 10})
        self.assertNotIn("cut", whole.stderr)
        with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
            self.assertIn("answers cut at the token limit", fh.read())

    def test_run_json_lists_every_attempt_a_killed_one_too(self):
        mock = start_mock(self, oracle_rows=self.rows, decode_tok_s=40, reasoning_tokens=20)
        ds = self.dataset(self.rows)
        out = os.path.join(self.dir, "run")
        self.kill_after(self.args(mock.url, out, ds, "--fixed-concurrency", "2"), out, 2)
        self.assertEqual(run_cli(self.args(mock.url, out, ds)).returncode, 0)
        with open(os.path.join(out, "run.json")) as fh:
            history = json.load(fh)["history"]
        self.assertEqual([h["status"] for h in history], ["killed", "finished"])
        self.assertTrue(all(h["started_at"] and h["ended_at"] for h in history), history)
        self.assertNotEqual(history[0]["pid"], history[1]["pid"])

    def test_a_finished_run_with_failures_says_incomplete_and_counts_them_as_wrong_too(self):
        mock = start_mock(self, oracle_rows=self.rows, faults=eh.parse_faults("400=0.3"), seed=5, skill=1.0)
        ds = self.dataset(self.rows)
        out = os.path.join(self.dir, "run")
        res = run_cli(self.args(mock.url, out, ds, "--json"))
        self.assertEqual(res.returncode, 1, res.stderr)
        s = json.loads(res.stdout)
        failed = s["counts"]["failed"]
        self.assertGreater(failed, 0)
        self.assertFalse(s["complete"])
        self.assertEqual(s["score"]["mean"], 1.0)
        self.assertAlmostEqual(s["score_failed_as_wrong"]["mean"], (30 - failed) / 30, places=5)
        table = run_cli(["report", out]).stdout
        self.assertIn("over %d of 30 (%d failed): INCOMPLETE" % (30 - failed, failed), table)
        self.assertIn("counting the %d failed or not run as wrong (n=30)" % failed, table)


if __name__ == "__main__":
    unittest.main()
