"""End to end: the `run` command in a subprocess against the mock model in this process, over real loopback HTTP."""
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import unittest
import unittest.mock

from tests.support import CLI, clean_env, dead_port, eh, qa_rows, read_samples, run_cli, start_mock, tempdir, tree_text, \
    write_jsonl




def deterministic(summary):
    """The summary without wall-clock measurements (latency, throughput), which differ run to run."""
    return {k: v for k, v in summary.items() if k not in ("performance", "status")}


class RunCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempdir(self)
        self.rows = qa_rows(60)
        self.dataset = write_jsonl(os.path.join(self.dir, "qa.jsonl"), self.rows)

    def args(self, url, out, *extra):
        return ["run", "--dataset", self.dataset, "--model", "m", "--base-url", url, "--out", out,
                "--request-timeout", "10"] + list(extra)

    def popen(self, args, env=None):
        proc = subprocess.Popen([sys.executable, CLI] + args, env=env or clean_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, universal_newlines=True)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        return proc


class TestResume(RunCase):
    def test_resuming_with_another_model_is_refused_and_changes_nothing(self):
        mock = start_mock(self, oracle_rows=self.rows, served=("m2",))
        out = os.path.join(self.dir, "run")
        self.assertEqual(run_cli(self.args(mock.url, out, "--limit", "5")).returncode, 0)
        before = read_samples(out)
        other = run_cli(self.args(mock.url, out, "--limit", "5") + ["--model", "m2"])
        self.assertEqual(other.returncode, 2, other.stderr)
        self.assertRegex(other.stderr.strip(), r'^evalharness: --out .* holds a run made with other generation '
                                                r'settings: model "m" -> "m2"; use another --out to keep both, or add '
                                                r'--restart to start it over \(its results move to .*superseded\)$')
        self.assertEqual(read_samples(out), before)

    def ids_written(self, out):
        """The ids of the whole lines in the run's samples.jsonl (a kill can leave a torn last line)."""
        try:
            with open(os.path.join(out, "samples.jsonl"), "rb") as fh:
                lines = fh.read().split(b"\n")[:-1]
        except FileNotFoundError:
            return []
        return [json.loads(line.decode("utf-8"))["id"] for line in lines]

    def asked(self, mock):
        """{row id: requests the mock has had for its prompt}."""
        with mock.state.lock:
            return {r["id"]: mock.state.seen[r["prompt"]] for r in self.rows}

    def test_a_rerun_asks_only_for_the_missing_ids_and_gives_the_same_summary_when_killed_9_before_or_during_the_run(
            self):
        mock = start_mock(self, oracle_rows=self.rows, seed=3, skill=0.7, decode_tok_s=400, reasoning_tokens=20,
                          knee=4)
        ref = os.path.join(self.dir, "ref")
        done = run_cli(self.args(mock.url, ref, "--fixed-concurrency", "4"))
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(os.path.join(ref, "summary.json")) as fh:
            want = deterministic(json.load(fh))
        self.assertEqual(want["counts"]["ok"], 60)
        # each kill lands when samples.jsonl holds k whole lines: k = 0 as soon as the run has written run.json
        # (before its first sample, or about then), then 1, 20 and 40 of the 60 (mid-run, unless this process is held
        # off the CPU while the run writes the rest: at least one of them must land mid-run)
        mid_run = []
        for k in (0, 1, 20, 40):
            out = os.path.join(self.dir, "killed-%d" % k)
            proc = self.popen(self.args(mock.url, out, "--fixed-concurrency", "4"))
            deadline = time.monotonic() + 60
            while (len(self.ids_written(out)) < k or not os.path.exists(os.path.join(out, "run.json"))) \
                    and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            kept = self.ids_written(out)
            before = len(kept)
            self.assertGreaterEqual(before, k, "the run ended or stalled before its sample %d" % k)
            if before < 60:
                mid_run.append(before)
            asked = self.asked(mock)
            again = run_cli(self.args(mock.url, out, "--fixed-concurrency", "4"))
            self.assertEqual(again.returncode, 0, again.stderr)
            # the samples written are not asked again (a request the kill cut short may reach the mock late: only
            # the kept ones are counted exactly)
            now = self.asked(mock)
            self.assertEqual({i: now[i] - asked[i] for i in kept}, {i: 0 for i in kept}, "killed at %d" % before)
            self.assertEqual([i for i in now if i not in kept and now[i] == asked[i]], [], "killed at %d" % before)
            ids = [r["id"] for r in read_samples(out)]
            self.assertEqual(sorted(ids), sorted(r["id"] for r in self.rows), "killed at %d samples" % before)
            self.assertEqual(len(ids), len(set(ids)), "duplicate ids after a kill at %d samples" % before)
            with open(os.path.join(out, "summary.json")) as fh:
                self.assertEqual(deterministic(json.load(fh)), want, "killed at %d samples" % before)
            if before:
                self.assertIn("resuming", again.stderr)
        self.assertTrue([n for n in mid_run if n > 0], mid_run)  # a half-written run was resumed

    def test_a_resume_reruns_infrastructure_failures_and_retry_failed_also_request_failures(self):
        flaky = start_mock(self, oracle_rows=self.rows, faults=eh.parse_faults("500=0.3"), seed=1)
        out = os.path.join(self.dir, "run")
        first = run_cli(self.args(flaky.url, out, "--max-retries", "0"))
        self.assertEqual(first.returncode, 1, first.stderr)  # some samples failed
        self.assertIn("incomplete: the score is over", first.stderr)
        self.assertIn("re-run the same command to resume (run directory %s)" % out, first.stderr)
        failed = {r["id"] for r in read_samples(out) if r["status"] == "failed"}
        self.assertTrue(failed)
        self.assertEqual({r["error_class"] for r in read_samples(out) if r["status"] == "failed"}, {"server_error"})
        healthy = start_mock(self, oracle_rows=self.rows, seed=1)
        plain = run_cli(self.args(healthy.url, out))  # 5xx is the server's trouble: run again without a flag
        self.assertEqual(plain.returncode, 0, plain.stderr)
        self.assertIn("%d infrastructure failure(s) run again" % len(failed), plain.stderr)
        self.assertEqual(healthy.stats()["counters"]["requests"], len(failed))
        records = read_samples(out)
        self.assertEqual(sorted(r["id"] for r in records), sorted(r["id"] for r in self.rows))
        self.assertTrue(all(r["status"] == "ok" for r in records))
        # a failure caused by the request (HTTP 400) stays until --retry-failed
        bad_out = os.path.join(self.dir, "bad")
        rejecting = start_mock(self, oracle_rows=self.rows, faults=eh.parse_faults("400=0.2"), seed=2)
        self.assertEqual(run_cli(self.args(rejecting.url, bad_out)).returncode, 1)
        rejected = {r["id"] for r in read_samples(bad_out) if r["status"] == "failed"}
        self.assertTrue(rejected)
        self.assertEqual({r["error_class"] for r in read_samples(bad_out) if r["status"] == "failed"}, {"bad_request"})
        again = run_cli(self.args(healthy.url, bad_out))
        self.assertEqual(again.returncode, 1, again.stderr)
        self.assertIn("failed kept (caused by the request or the patch: a re-run would repeat them)", again.stderr)
        self.assertNotIn("--retry-failed", again.stderr)  # the hint says what helps: fixing the request
        self.assertIn("failed because the endpoint rejected the request (HTTP 4xx; the prompt plus --max-tokens is "
                      "longer than the model's context", again.stderr)
        retried = run_cli(self.args(healthy.url, bad_out, "--retry-failed"))
        self.assertEqual(retried.returncode, 0, retried.stderr)
        self.assertEqual(healthy.stats()["counters"]["requests"], len(failed) + len(rejected))
        ids = [r["id"] for r in read_samples(bad_out)]
        self.assertEqual(sorted(ids), sorted(r["id"] for r in self.rows))

    def test_second_process_on_the_same_run_exits_with_a_clear_message(self):
        mock = start_mock(self, oracle_rows=self.rows, decode_tok_s=20, reasoning_tokens=10)
        out = os.path.join(self.dir, "run")
        first = self.popen(self.args(mock.url, out, "--fixed-concurrency", "2"))
        deadline = time.time() + 20
        while not os.path.exists(os.path.join(out, "run.json")) and time.time() < deadline:
            time.sleep(0.05)
        second = run_cli(self.args(mock.url, out))
        first.kill()
        first.communicate()
        self.assertEqual(second.returncode, 1)
        self.assertIn("in use by pid %d" % first.pid, second.stderr)
        self.assertEqual(len(second.stderr.strip().splitlines()), 1, second.stderr)

    def test_ctrl_c_records_finished_samples_exits_130_and_resume_completes(self):
        mock = start_mock(self, oracle_rows=self.rows, decode_tok_s=100, reasoning_tokens=10)
        out = os.path.join(self.dir, "run")
        proc = self.popen(self.args(mock.url, out, "--fixed-concurrency", "2"))
        deadline = time.time() + 20
        while time.time() < deadline:
            path = os.path.join(out, "samples.jsonl")
            if os.path.exists(path) and os.path.getsize(path) > 0:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 130, err)
        partial = read_samples(out)
        self.assertTrue(0 < len(partial) < 60, len(partial))
        with open(os.path.join(out, "run.json")) as fh:
            self.assertEqual(json.load(fh)["status"], "interrupted")
        again = run_cli(self.args(mock.url, out))
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertEqual(len(read_samples(out)), 60)


class TestAdaptiveConcurrency(RunCase):
    def test_adaptive_run_records_limit_changes_and_the_next_run_starts_from_the_discovered_limit(self):
        mock = start_mock(self, oracle_rows=self.rows, decode_tok_s=400, reasoning_tokens=30, knee=4, thrash=0.5)
        limits = os.path.join(self.dir, "limits.json")
        env = clean_env(EVALHARNESS_LIMITS_FILE=limits)
        first = os.path.join(self.dir, "first")
        res = run_cli(self.args(mock.url, first, "--initial-concurrency", "24"), env=env)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("adaptive, starting at 24 (--initial-concurrency)", res.stderr)
        with open(os.path.join(first, "run.json")) as fh:
            info = json.load(fh)
        self.assertTrue(info["concurrency"]["adaptive"])
        self.assertEqual(info["concurrency"]["rule"], "gradient")
        with open(os.path.join(first, "events.jsonl")) as fh:
            changes = [json.loads(l) for l in fh if '"limit"' in l and '"type": "limit"' in l]
        self.assertTrue(changes, "no limit change recorded")
        self.assertEqual(changes[0]["previous"], 24)  # the gate started where it was told and moved from there
        self.assertEqual(info["concurrency"]["initial"], 24)
        found = info["discovered_limit"]
        with open(limits) as fh:
            self.assertEqual(list(json.load(fh).values())[0]["limit"], found)
        second = os.path.join(self.dir, "second")
        res2 = run_cli(self.args(mock.url, second), env=env)
        self.assertEqual(res2.returncode, 0, res2.stderr)
        self.assertIn("adaptive, starting at %d (discovered by an earlier run on this endpoint)" % found, res2.stderr)
        pinned = run_cli(self.args(mock.url, os.path.join(self.dir, "pinned"), "--fixed-concurrency", "3"), env=env)
        self.assertIn("concurrency: fixed at 3", pinned.stderr)
        with open(os.path.join(self.dir, "pinned", "run.json")) as fh:
            self.assertEqual(json.load(fh)["concurrency"], {"adaptive": False, "initial": 3, "initial_from": "fixed",
                                                            "final": 3, "max": 3, "rule": None,
                                                            "server_metrics": None})


class TestFailures(RunCase):
    def test_endpoint_down_aborts_with_exit_3_within_seconds_naming_the_cause(self):
        url = "http://127.0.0.1:%d/v1" % dead_port()
        out = os.path.join(self.dir, "run")
        t0 = time.monotonic()
        res = run_cli(self.args(url, out))
        elapsed = time.monotonic() - t0
        self.assertEqual(res.returncode, 3, res.stderr)
        self.assertLess(elapsed, 20)
        first = [l for l in res.stderr.splitlines() if "first failure" in l]
        self.assertEqual(len(first), 1, res.stderr)
        self.assertIn("connection refused", first[0])
        self.assertIn(url, first[0])
        self.assertIn("circuit breaker", res.stderr)
        # the breaker trips at the 12th failure in a row; what the other workers held then (one worker more than the
        # starting limit of 16) may still be recorded; the rest were never dispatched
        records = read_samples(out)
        self.assertEqual({r["error_class"] for r in records}, {"unreachable"})
        self.assertGreaterEqual(len(records), eh.BREAKER_THRESHOLD)
        self.assertLessEqual(len(records), eh.BREAKER_THRESHOLD + eh.DEFAULT_INITIAL_CONCURRENCY)

    def test_dead_proxy_in_environment_does_not_affect_a_loopback_endpoint(self):
        mock = start_mock(self, oracle_rows=self.rows)
        proxy = "http://127.0.0.1:%d" % dead_port()
        env = clean_env(http_proxy=proxy, https_proxy=proxy, HTTP_PROXY=proxy, HTTPS_PROXY=proxy, ALL_PROXY=proxy,
                        NO_PROXY="example.internal")
        res = run_cli(self.args(mock.url, os.path.join(self.dir, "run")), env=env)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(mock.stats()["counters"]["requests"], 60)

    def test_a_run_appends_its_endpoint_host_to_no_proxy_unless_use_proxy(self):
        """What the run starts (docker, a judge, an image store client) bypasses a proxy for the endpoint too."""
        mock = start_mock(self, oracle_rows=self.rows)
        for use_proxy, want in ((True, "example.internal"), (False, "example.internal,127.0.0.1")):
            env = {"NO_PROXY": "example.internal", "no_proxy": "example.internal",
                   "EVALHARNESS_LIMITS_FILE": os.path.join(self.dir, "limits.json")}
            with unittest.mock.patch.dict(os.environ, env):
                for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
                    os.environ.pop(var, None)  # (--use-proxy would send the requests to a proxy of this machine)
                cfg = eh.RunConfig(dataset=self.dataset, model="m", base_url=mock.url, progress=False,
                                   out=os.path.join(self.dir, "run-%s" % use_proxy), use_proxy=use_proxy)
                code, _ = eh.run_qa(cfg, stdout=io.StringIO())
                self.assertEqual((code, os.environ["NO_PROXY"], os.environ["no_proxy"]), (0, want, want), use_proxy)

    def test_injected_faults_end_with_every_sample_scored_or_failed_with_a_reason(self):
        mock = start_mock(self, oracle_rows=self.rows, retry_after_s=0.05, hang_s=30,
                          faults=eh.parse_faults("429=0.15,503=0.1,reset=0.05,hang=0.03,malformed=0.05,"
                                                 "truncate=0.05,500=0.05"))
        out = os.path.join(self.dir, "run")
        res = run_cli(self.args(mock.url, out, "--request-timeout", "1", "--max-retries", "3", "--fixed-concurrency",
                                "8"), timeout=180)
        self.assertIn(res.returncode, (0, 1), res.stderr)
        self.assertNotIn("Traceback", res.stderr)
        records = read_samples(out)
        self.assertEqual(sorted(r["id"] for r in records), sorted(r["id"] for r in self.rows))
        for r in records:
            if r["status"] == "failed":
                self.assertTrue(r["error"] and r["error_class"], r)
            else:
                self.assertIn(r["score"], (0.0, 1.0))
        counters = mock.stats()["counters"]
        for kind in ("429", "503", "reset", "hang", "malformed", "truncate"):
            self.assertGreater(counters.get("fault_" + kind, 0), 0, kind)


class TestCircuitBreaker(unittest.TestCase):
    """The breaker on its own, fed finished records (no threads, no endpoint)."""

    def test_trips_once_at_the_12th_consecutive_failure_saying_the_endpoint_is_unusable(self):
        breaker = eh._CircuitBreaker()
        auth = {"id": "s", "status": "failed", "error_class": "auth"}
        self.assertEqual([breaker.record(auth) for _ in range(13)], [False] * 11 + [True, False])

    def test_a_success_resets_the_count_and_other_failures_neither_count_nor_reset_it(self):
        breaker = eh._CircuitBreaker(3)
        fed = [("failed", "unreachable"), ("failed", "not_found"), ("ok", None), ("failed", "auth"),
               ("failed", "docker"), ("failed", "server_error"), ("failed", "bad_request"), ("failed", "timeout"),
               ("failed", "unreachable")]
        got = [breaker.record({"id": "s%d" % i, "status": st, "error_class": cls}) for i, (st, cls) in enumerate(fed)]
        self.assertEqual(got, [False] * 8 + [True])


class TestReasoningModels(RunCase):
    """The mock thinks before it answers: in reasoning_content, as <think> in the content, or past the budget."""

    def run_reasoning(self, out, *extra, **mock_cfg):
        mock = start_mock(self, oracle_rows=self.rows, seed=3, **mock_cfg)
        res = run_cli(self.args(mock.url, out, "--limit", "20", *extra))
        return mock, res

    def test_reasoning_in_a_field_or_in_think_tags_never_reaches_the_scorer_and_its_tokens_are_counted(self):
        ref_mock, ref = self.run_reasoning(os.path.join(self.dir, "plain"))
        self.assertEqual(ref.returncode, 0, ref.stderr)
        with open(os.path.join(self.dir, "plain", "summary.json")) as fh:
            want = json.load(fh)["score"]
        for style in ("field", "think"):
            out = os.path.join(self.dir, style)
            mock, res = self.run_reasoning(out, reasoning_tokens=30, reasoning_style=style)
            self.assertEqual(res.returncode, 0, res.stderr)
            records = read_samples(out)
            for r in records:
                self.assertNotIn("think", r["response"])
                self.assertTrue(r["reasoning"].startswith("thinking"), r)
                self.assertEqual(r["reasoning_tokens"], 30 + (2 if style == "think" else 0))
                self.assertIsNone(r["no_answer"])
            with open(os.path.join(out, "summary.json")) as fh:
                summary = json.load(fh)
            self.assertEqual(summary["score"], want, style)  # the same answers, the same score
            self.assertEqual(summary["tokens"]["reasoning"], 20 * (30 + (2 if style == "think" else 0)))

    def test_a_budget_spent_on_reasoning_is_one_wrong_answer_not_a_retry_or_a_failure(self):
        for style in ("field", "think"):
            out = os.path.join(self.dir, "budget-" + style)
            mock, res = self.run_reasoning(out, "--max-tokens", "10", reasoning_tokens=30, reasoning_style=style)
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertEqual(mock.stats()["counters"]["requests"], 20)  # once each: not retried
            records = read_samples(out)
            self.assertEqual(len(records), 20)
            for r in records:
                self.assertEqual((r["status"], r["score"]), ("ok", 0.0))
                self.assertEqual(r["no_answer"], "no answer: reasoning used all 10 tokens")
                self.assertEqual(r["finish_reason"], "length")
            self.assertIn("no answer: 20 reply(ies) spent the whole token budget reasoning", res.stdout)

    def test_split_reasoning_takes_what_follows_the_last_think_block(self):
        self.assertEqual(eh._split_reasoning("<think>hmm</think>\nParis"), ("Paris", "hmm", True))
        self.assertEqual(eh._split_reasoning("<think>a</think>x<think>b</think> y"), ("y", "a</think>x<think>b", True))
        self.assertEqual(eh._split_reasoning("Paris"), ("Paris", "", True))
        self.assertEqual(eh._split_reasoning("<think>still going"), ("", "still going", False))
        self.assertEqual(eh._split_reasoning("hmm</think>Paris"), ("Paris", "hmm", True))  # template ate <think>


class TestSecrets(RunCase):
    KEY = "sk-evalharness-test-SECRET-0123456789abcdef"

    def test_api_key_appears_in_no_file_and_no_output_on_success_and_on_auth_failure(self):
        good = start_mock(self, oracle_rows=self.rows, api_key=self.KEY)
        out = os.path.join(self.dir, "ok")
        env = clean_env(OPENAI_API_KEY=self.KEY)
        res = run_cli(self.args(good.url, out, "--extra-body", '{"api_key": "%s", "top_p": 1}' % self.KEY),
                      env=env)
        self.assertEqual(res.returncode, 0, res.stderr)
        wrong = start_mock(self, oracle_rows=self.rows, api_key="sk-some-other-key-000000000000")
        out2 = os.path.join(self.dir, "denied")
        res2 = run_cli(self.args(wrong.url, out2), env=env)
        self.assertEqual(res2.returncode, 2, res2.stderr)  # the pre-flight's GET /v1/models is refused
        self.assertIn("HTTP 401", res2.stderr)
        self.assertIn("refused the API key", res2.stderr)
        self.assertFalse(os.path.exists(out2))
        for text in (res.stdout, res.stderr, res2.stdout, res2.stderr, tree_text(out), tree_text(out2)):
            self.assertNotIn(self.KEY, text)
            self.assertNotIn(self.KEY[:8], text)
            self.assertNotIn(self.KEY[-6:], text)


class TestPreflight(RunCase):
    """What the endpoint serves, checked before the first sample (issue 22), end to end through `run`."""

    def test_a_model_the_endpoint_does_not_list_exits_2_naming_the_served_ones_and_writes_nothing(self):
        mock = start_mock(self, oracle_rows=self.rows, model="llama-3-8b", served=("qwen-7b",))
        out = os.path.join(self.dir, "run")
        res = run_cli(self.args(mock.url, out))
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertEqual(res.stderr.strip().splitlines(), [
            "evalharness: --model 'm' is not served by %s; it serves: llama-3-8b, qwen-7b (pass one of these to "
            "--model, or --no-model-check if this server's list is not what it serves)" % mock.url])
        self.assertFalse(os.path.exists(out))
        self.assertEqual(mock.stats()["counters"].get("requests", 0), 0)

    def test_a_wrong_api_path_exits_2_before_any_sample_is_written(self):
        mock = start_mock(self, oracle_rows=self.rows)
        out = os.path.join(self.dir, "run")
        url = mock.url.replace("/v1", "/v2")
        res = run_cli(self.args(url, out))
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("%s/models and %s/chat/completions answer HTTP 404" % (url, url), res.stderr)
        self.assertIn("--base-url http://HOST:PORT/v1", res.stderr)
        self.assertFalse(os.path.exists(out))
        # the endpoint's own URL, as pasted from a curl example, is understood
        res = run_cli(self.args(mock.url + "/chat/completions", out, "--limit", "3"))
        self.assertEqual(res.returncode, 0, res.stderr)

    def test_replies_under_another_model_name_are_recorded_and_flagged_once(self):
        mock = start_mock(self, oracle_rows=self.rows, model="/models/tiny.gguf", reply_model="/models/tiny.gguf")
        out = os.path.join(self.dir, "run")
        res = run_cli(self.args(mock.url, out, "--limit", "12", "--no-model-check"))
        self.assertEqual(res.returncode, 0, res.stderr)
        flagged = [line for line in res.stderr.splitlines() if "replies name the model" in line]
        self.assertEqual(len(flagged), 1, res.stderr)
        self.assertEqual({r["served_model"] for r in read_samples(out)}, {"/models/tiny.gguf"})
        self.assertIn("served as: /models/tiny.gguf in 12 answers (the replies' model field; --model was m)",
                      res.stdout)
        with open(os.path.join(out, "run.json")) as fh:
            server = json.load(fh)["server"]
        self.assertEqual((server["models"], server["model_checked"]), (["/models/tiny.gguf"], False))
        self.assertIn("replies named another model", open(os.path.join(out, "report.html")).read())

    def test_a_request_longer_than_the_served_context_is_warned_about_once_and_cut_answers_counted(self):
        mock = start_mock(self, oracle_rows=self.rows, server_kind="llama.cpp", context_len=40, reasoning_tokens=50)
        out = os.path.join(self.dir, "run")
        res = run_cli(self.args(mock.url, out, "--limit", "10", "--max-tokens", "100"))
        self.assertEqual(res.returncode, 0, res.stderr)
        warned = [line for line in res.stderr.splitlines() if "longer than the served context" in line]
        self.assertEqual(warned, ["evalharness: --max-tokens 100 plus the prompt is longer than the served context of "
                                  "40 tokens (llama.cpp n_ctx (/props)) for 10 of 10 requests (prompts estimated at "
                                  "~4 characters a token): the server will cut those answers short or refuse them; "
                                  "lower --max-tokens"])
        self.assertIn("cut: 10 of 10 answers stopped at the token limit", res.stdout)
        report = run_cli(["report", out]).stdout
        self.assertIn("endpoint: llama.cpp at %s; serving m; context 40 tokens (n_ctx (/props))" % mock.url, report)
        fits = run_cli(self.args(mock.url, os.path.join(self.dir, "fits"), "--limit", "10", "--max-tokens", "20"))
        self.assertNotIn("served context", fits.stderr)

    def test_a_context_overflow_refused_by_the_server_names_the_cause_and_offers_no_retry(self):
        mock = start_mock(self, oracle_rows=self.rows, server_kind="vllm", context_len=40)
        out = os.path.join(self.dir, "run")
        res = run_cli(self.args(mock.url, out, "--limit", "4", "--max-tokens", "100"))
        self.assertEqual(res.returncode, 1, res.stderr)
        last = res.stderr.strip().splitlines()[-1]
        self.assertIn("4 failed because the endpoint rejected the request (HTTP 4xx; the prompt plus --max-tokens is "
                      "longer than the model's context: HTTP 400", last)
        self.assertIn("maximum context length is 40 tokens", last)
        self.assertNotIn("--retry-failed", res.stderr)


class TestHelp(unittest.TestCase):
    def test_every_option_of_every_command_says_its_default_or_that_it_is_required(self):
        parser = eh._build_parser()
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        commands = dict(sub.choices)
        for group in ("images", "slurm"):
            nested = next(a for a in sub.choices[group]._actions if a.__class__.__name__ == "_SubParsersAction")
            commands.update({"%s %s" % (group, k): v for k, v in nested.choices.items()})
        self.assertEqual(len(commands), 17)
        silent = ["%s %s" % (name, a.option_strings[-1]) for name, p in commands.items() for a in p._actions
                  if a.option_strings and a.dest != "help" and not re.search(r"default|required", a.help or "", re.I)]
        self.assertEqual(silent, [])
        for name in ("run", "serve-mock"):
            text = sub.choices[name].format_help()  # %(default)s expands: none is left raw
            self.assertNotIn("%(", text)
        self.assertIn("(default 0.0)", " ".join(sub.choices["run"].format_help().split()))

    def test_main_builds_only_the_command_it_runs_and_still_knows_the_others(self):
        sub_of = lambda parser: next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        report = sub_of(eh._build_parser("report")).choices
        self.assertEqual(list(report), ["demo", "run", "suite", "serve-mock", "report", "images", "dataset", "merge", "slurm"])
        self.assertEqual([a.dest for a in report["run"]._actions], ["help"])  # a name and its help only
        self.assertIn("--html", {s for a in report["report"]._actions for s in a.option_strings})
        full = {s for a in sub_of(eh._build_parser()).choices["run"]._actions for s in a.option_strings}
        self.assertIn("--max-sample-tokens", full)
        res = subprocess.run([sys.executable, CLI, "--version"], stdout=subprocess.PIPE, timeout=60)
        self.assertEqual(res.stdout.decode().strip(), "evalharness " + eh.__version__)
        res = subprocess.run([sys.executable, CLI, "-v", "rn"], stderr=subprocess.PIPE, timeout=60)
        self.assertEqual(res.returncode, 2)
        self.assertIn("invalid choice: 'rn' (choose from 'demo', 'run'", res.stderr.decode())

    def test_each_images_action_lists_only_the_options_it_uses(self):
        parser = eh._build_parser()
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        isub = next(a for a in sub.choices["images"]._actions if a.__class__.__name__ == "_SubParsersAction")
        for action, want in (("release", {"--engine", "--docker-host", "--all"}),
                             ("index", {"--image-tars", "--tar-index", "--json"}),
                             ("push", {"--image-store", "--engine", "--docker-host", "--image-workers", "--dataset",
                                       "--image-template"})):
            p = isub.choices[action]
            got = {a.option_strings[-1] for a in p._actions if a.option_strings} - {"--help", "--verbose"}
            self.assertEqual(got, want, action)
            args = parser.parse_args(["images", action])
            for dest in ("image_tars", "image_store", "keep_images", "allow_pull", "mirror_timeout", "json_out"):
                self.assertTrue(hasattr(args, dest), (action, dest))  # what the code reads has its default
        load = {a.option_strings[-1] for a in isub.choices["load"]._actions if a.option_strings}
        self.assertIn("--image-mirrors", load)

    def test_numbers_under_secret_looking_names_are_kept_and_secrets_are_not(self):
        cfg = eh._redact_config({"max_sample_tokens": 5000, "token_budget": 7, "swe": {"max_sample_tokens": 3},
                                 "api_key": "sk-abc", "auth_token": "t0k3n", "password": "", "use_key": True})
        self.assertEqual(cfg, {"max_sample_tokens": 5000, "token_budget": 7, "swe": {"max_sample_tokens": 3},
                               "api_key": "[REDACTED]", "auth_token": "[REDACTED]", "password": "",
                               "use_key": True})


class TestProgressLine(RunCase):
    """The progress line on a real terminal (tmux), and plain lines without one."""

    def tmux_captures(self, width, url, out):
        if not shutil.which("tmux"):
            if os.environ.get("EVALHARNESS_REQUIRE_DOCKER") == "1":
                self.fail("EVALHARNESS_REQUIRE_DOCKER=1 (CI) but tmux is not installed")
            self.skipTest("tmux is not installed (Debian package tmux)")
        sock = "evh-%d-%d" % (os.getpid(), width)
        self.addCleanup(subprocess.run, ["tmux", "-L", sock, "kill-server"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
        cmd = " ".join(shlex.quote(a) for a in [sys.executable, CLI] + self.args(url, out, "--fixed-concurrency",
                                                                                    "2", "--limit", "24"))
        env = clean_env(EVALHARNESS_PROGRESS_S="0.1", TERM="xterm")
        subprocess.run(["tmux", "-L", sock, "new-session", "-d", "-x", str(width), "-y", "30", "-s", "p",
                        cmd + " > /dev/null; sleep 60"], env=env, check=True)
        shots = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not os.path.exists(os.path.join(out, "summary.json")):
            shot = subprocess.run(["tmux", "-L", sock, "capture-pane", "-p", "-t", "p"], stdout=subprocess.PIPE,
                                  universal_newlines=True).stdout
            if "done" in shot:
                shots.append(shot)
            time.sleep(0.3)
        self.assertTrue(os.path.exists(os.path.join(out, "summary.json")), "the run did not finish")
        self.assertGreater(len(shots), 3)
        return shots

    def test_the_terminal_holds_one_progress_line_fitted_to_60_and_200_columns(self):
        mock = start_mock(self, oracle_rows=self.rows, decode_tok_s=40, reasoning_tokens=10)
        for width in (60, 200):
            shots = self.tmux_captures(width, mock.url, os.path.join(self.dir, "run-%d" % width))
            for shot in shots:
                lines = [line for line in shot.splitlines() if line.strip()]
                progress = [line for line in lines if " done" in line]
                self.assertEqual(len(progress), 1, shot)  # one line redrawn, never a stack of wrapped ones
                self.assertLessEqual(len(progress[0]), width - 1, shot)
            rate = [re.search(r"\| [\d.]+/s \|", s) is not None for s in shots]
            if width == 200:
                self.assertTrue(all(rate), shots[-1])  # room for every part
                self.assertIn("in flight", shots[-1])
            else:
                self.assertFalse(any(rate), shots[-1])  # the rate goes first; the counts stay
                self.assertRegex(shots[-1], r"qa \d+/24 done \| 0 failed")

    def test_a_warning_printed_mid_run_goes_above_the_one_progress_line_on_60_columns(self):
        """The replies name another model than --model: the client warns at the first reply, which comes after the
        line was drawn (slow first tokens). The screen must show the warning from column 0 on lines of its own and
        one progress line below it, never the warning glued to the line (issue 33's 'in flight 4evalharness: ...')."""
        mock = start_mock(self, oracle_rows=self.rows, decode_tok_s=40, reasoning_tokens=10, ttft_s=0.8,
                          reply_model="another-name")
        shots = self.tmux_captures(60, mock.url, os.path.join(self.dir, "run"))
        warned = [shot for shot in shots if "replies name the model" in shot]
        self.assertTrue(warned, shots[-1])
        for shot in warned:
            lines = [line for line in shot.splitlines() if line.strip()]
            progress = [i for i, line in enumerate(lines) if " done" in line]
            self.assertEqual(len(progress), 1, shot)
            start = [i for i, line in enumerate(lines) if line.startswith("evalharness: the endpoint's replies")]
            self.assertEqual(len(start), 1, shot)  # the warning begins a line of its own, once
            self.assertLess(start[0], progress[0], shot)  # above the progress line
            self.assertNotIn("evalharness", lines[progress[0]], shot)
            self.assertRegex(lines[progress[0]], r"^qa \d+/24 done", shot)

    def test_a_terminal_that_reports_no_size_gets_the_default_width_not_one_column(self):
        import pty
        master, slave = pty.openpty()  # a new pty is 0x0 until someone sets its size (CI ptys, `script`)
        self.addCleanup(os.close, master)
        stream = os.fdopen(slave, "w")
        self.addCleanup(stream.close)
        parts = [("qa 1/9 done", 9), ("0 failed", 8), ("ETA 3s", 7)]
        with unittest.mock.patch.dict(os.environ, {"COLUMNS": "100"}):
            eh._Progress(lambda: parts, stream=stream).draw()
        self.assertIn(b"qa 1/9 done | 0 failed | ETA 3s", os.read(master, 4096))

    def test_plain_lines_start_with_a_utc_timestamp(self):
        mock = start_mock(self, oracle_rows=self.rows, decode_tok_s=40, reasoning_tokens=10)
        res = run_cli(self.args(mock.url, os.path.join(self.dir, "run"), "--limit", "12", "--fixed-concurrency", "2"),
                      env=clean_env(EVALHARNESS_PROGRESS_S="0.2"), stamped=True)
        plain = [line for line in res.stderr.splitlines() if " done" in line]
        self.assertTrue(plain, res.stderr)
        for line in plain:
            self.assertRegex(line, r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ qa \d+/12 done \| ")

    def test_without_a_terminal_every_stderr_line_starts_with_a_utc_timestamp(self):
        """A cron log mixes the log's messages, the progress lines and argparse's errors: each line of each is
        stamped when stderr is a pipe (on a terminal none is: the tmux tests see lines start with 'evalharness:')."""
        stamp = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ "
        mock = start_mock(self, oracle_rows=self.rows, decode_tok_s=40, reasoning_tokens=10,
                          reply_model="another-name")
        res = run_cli(self.args(mock.url, os.path.join(self.dir, "run"), "--limit", "12", "--fixed-concurrency", "2"),
                      env=clean_env(EVALHARNESS_PROGRESS_S="0.2"), stamped=True)
        lines = res.stderr.splitlines()
        self.assertTrue([line for line in lines if re.search(stamp + r"evalharness: the endpoint's replies", line)],
                        res.stderr)  # a log message
        self.assertTrue([line for line in lines if re.search(stamp + r"qa \d+/12 done", line)], res.stderr)
        bad = run_cli(["run", "--bogus-option"], stamped=True)
        bad_dataset = os.path.join(self.dir, "bad.jsonl")
        with open(bad_dataset, "w") as fh:
            fh.write('{"question": "2+2?", "tagret": "4"}\n')
        missing = run_cli(["run", "--dataset", bad_dataset, "--model", "m", "--base-url", mock.url,
                           "--out", os.path.join(self.dir, "bad")], stamped=True)
        self.assertEqual(missing.returncode, 2, missing.stderr)
        # the near-miss of a required column is named with the fix
        self.assertIn("column 'tagret' looks like 'target': rename it, or map it: --field answer=tagret",
                      missing.stderr)
        for text in (res.stderr, bad.stderr, missing.stderr):
            self.assertTrue(text.strip())
            for line in text.splitlines():
                self.assertRegex(line, stamp, text)
        self.assertRegex(bad.stderr, stamp + r"evalharness run: error: unrecognized argument: --bogus-option")

    def test_the_progress_line_says_paused_while_the_gate_waits_out_an_overload(self):
        # the mock turns requests away at once with 429 + Retry-After 3: the gate admits nothing for 3 s
        mock = start_mock(self, oracle_rows=self.rows, faults=(("429", 0.3),), retry_after_s=3.0, seed=1,
                          decode_tok_s=200)
        res = run_cli(self.args(mock.url, os.path.join(self.dir, "run"), "--limit", "12"),
                      env=clean_env(EVALHARNESS_PROGRESS_S="0.2"))
        self.assertIn(res.returncode, (0, 1), res.stderr)
        with open(os.path.join(self.dir, "run", "events.jsonl")) as fh:
            self.assertTrue([e for e in map(json.loads, fh) if e["type"] == "drain"], res.stderr)  # a real drain
        paused = [line for line in res.stderr.splitlines() if "paused" in line]
        self.assertTrue(paused, res.stderr)
        for line in paused:
            self.assertRegex(line, r" done \| .* \| paused \(overload\) [1-3] s($| \| )")
        self.assertTrue([line for line in res.stderr.splitlines() if " done | " in line and "paused" not in line])


if __name__ == "__main__":
    unittest.main()
