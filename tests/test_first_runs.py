"""What a new user met on real benchmark files (issue 49): offline defaults that failed, numbers that misled, a
release that removed others' images (that one is in test_images), messages that named the wrong thing. Each test
names its item."""
import http.server
import json
import os
import re
import socketserver
import threading
import unittest

from tests import dockerbed as bed
from tests.support import (clean_env, eh, read_samples, run_cli, start_mock, tempdir, write_jsonl)
from tests.test_tasks import BASE, write_task
from tests.test_tools import write_bfcl


# ----------------------------------------------------------------------------- a server that fails some rows alone

class _PoisonHandler(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint that answers every chat request, except that it closes the connection,
    without a response, on any request whose prompt holds POISON (a real fault over loopback: the client sees the
    connection closed before the status line)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _json(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        if self.path.rstrip("/").endswith("/models"):
            self.server.models_asked += 1
            self._json({"object": "list", "data": [{"id": "m", "object": "model"}]})
        else:
            self.send_error(404)

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        text = json.dumps(body.get("messages"))
        if "POISON" in text:
            self.close_connection = True
            return  # no status line: the connection closes
        answer = re.search(r"What is (\d+) plus (\d+)", text)
        reply = "The result is %d." % (int(answer.group(1)) + int(answer.group(2))) if answer else "Hello."
        self._json({"id": "x", "object": "chat.completion", "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}})


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    models_asked = 0


def start_poison(test):
    server = _Server(("127.0.0.1", 0), _PoisonHandler)
    thread = threading.Thread(target=server.serve_forever, name="evalharness-test-poison", daemon=True)
    thread.start()
    test.addCleanup(lambda: (server.shutdown(), server.server_close(), thread.join(5)))
    return server, "http://127.0.0.1:%d/v1" % server.server_address[1]


class TestRequestsFailingAlone(unittest.TestCase):
    def test_rows_the_endpoint_drops_alone_at_the_end_fail_and_the_run_ends_without_an_outage(self):
        """Item 3: the endpoint closes the connection on two rows and answers every other one. Those two fail
        after their retries once nothing else is left and GET /models answers (run again on resume); the run
        ends normally (exit 1: incomplete), not aborted as an outage (exit 3) after --outage-budget."""
        d = tempdir(self)
        rows = [{"id": "q%d" % i, "prompt": "What is %d plus %d?" % (i, i), "answer": str(2 * i), "scorer": "numeric"}
                for i in range(8)] + [{"id": "p%d" % i, "prompt": "POISON %d" % i, "answer": "x"} for i in range(2)]
        path = write_jsonl(os.path.join(d, "qa.jsonl"), rows)
        server, url = start_poison(self)
        out = os.path.join(d, "run")
        res = run_cli(["run", "--dataset", path, "--model", "m", "--base-url", url, "--out", out, "--no-progress",
                       "--max-retries", "1", "--outage-budget", "60", "--fixed-concurrency", "4"], timeout=180)
        self.assertEqual(res.returncode, 1, res.stderr)  # incomplete, not aborted (3)
        recs = {r["id"]: r for r in read_samples(out)}
        self.assertEqual(sorted(recs), sorted(r["id"] for r in rows))
        self.assertEqual({k: r["status"] for k, r in recs.items() if k.startswith("p")}, {"p0": "failed",
                                                                                           "p1": "failed"})
        self.assertEqual({recs["p0"]["error_class"], recs["p1"]["error_class"]}, {"connection"})
        self.assertTrue(all(recs["q%d" % i]["score"] == 1.0 for i in range(8)))
        self.assertGreater(server.models_asked, 1)  # the pre-flight's, then the check that it still answers
        with open(os.path.join(out, "run.json")) as fh:
            self.assertEqual(json.load(fh)["status"], "finished")
        self.assertIn("2 failed for infrastructure reasons, which a resume runs again", res.stderr)


# ----------------------------------------------------------------------------- numbers

def simple_python(test, d):
    """BFCL's simple_python rows of the tool tests as D/BFCL_v4_simple_python.json, and a mock answering them right
    (skill 1)."""
    from tests.test_tools import bfcl_rows
    qs, ans = bfcl_rows()
    path = write_bfcl(d, "BFCL_v4_simple_python.json", [q for q in qs if q["id"].startswith("simple_python")],
                      [a for a in ans if a["id"].startswith("simple_python")])
    mock = eh.MockServer(eh.MockConfig(model="m", skill=1.0), tools=eh.ToolDataset(path)).start()
    test.addCleanup(mock.close)
    return path, mock


class TestNumbers(unittest.TestCase):
    def test_an_epochs_run_shows_mean_at_k_and_pass_at_k_in_its_html_report(self):
        """Item 5 (and 9: rows and samples both said)."""
        d = tempdir(self)
        rows = [{"id": "q%d" % i, "prompt": "What is %d plus %d?" % (i, i + 1), "answer": str(2 * i + 1),
                 "scorer": "numeric"} for i in range(6)]
        path = write_jsonl(os.path.join(d, "qa.jsonl"), rows)
        mock = start_mock(self, oracle_rows=rows, skill=0.6)
        out = os.path.join(d, "run")
        res = run_cli(["run", "--dataset", path, "--model", "m", "--base-url", mock.url, "--out", out,
                       "--no-progress", "--epochs", "3", "--json"])
        self.assertEqual(res.returncode, 0, res.stderr)
        rep = json.loads(res.stdout)["repeats"]
        with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
            page = fh.read()
        self.assertIn("mean@3 (95% CI clustered by row, 6 rows)", page)
        self.assertIn("%.3f <span class=muted>[%.3f, %.3f]</span>" % (rep["mean"]["mean"], rep["mean"]["ci95"][0],
                                                                     rep["mean"]["ci95"][1]), page)
        for k, v in rep["pass_at"].items():
            self.assertIn("pass@%s %.3f" % (k, v["value"]), page)
        text = run_cli(["report", out]).stdout
        self.assertIn("dataset: qa.jsonl (6 rows x 3 epochs = 18 samples,", text)

    def test_one_document_has_no_interval_and_its_tokens_are_counted(self):
        """Item 7: bits per byte of one document is a value, not a mean with [0, 1] around it; the tokens the
        windows sent are counted."""
        d = tempdir(self)
        path = write_jsonl(os.path.join(d, "doc.jsonl"), [{"id": "d1", "text": "The cat sat on the mat\n"}])
        out = os.path.join(d, "run")
        from tests.test_loglik import start_mock as loglik_mock
        res = run_cli(["run", "--task", "perplexity", "--dataset", path, "--model", "m", "--base-url",
                       loglik_mock(self).url, "--out", out, "--no-progress", "--json"])
        self.assertEqual(res.returncode, 0, res.stderr)
        summary = json.loads(res.stdout)
        self.assertIsNone(summary["score"]["ci95"])
        self.assertEqual(summary["score"]["n"], 1)
        rec = read_samples(out)[0]
        self.assertGreaterEqual(summary["tokens"]["prompt"], rec["scored_tokens"])
        self.assertGreater(rec["scored_tokens"], 0)
        text = run_cli(["report", out]).stdout
        self.assertIn("(no interval)", text)
        self.assertNotIn("[0.000, 1.000]", text)
        self.assertRegex(text, r"tokens: prompt [1-9]")

    def test_the_word_count_is_lm_evals_a_trailing_newline_one_more(self):
        """Item 18: len(re.split(r"\\s+", text)), not len(text.split())."""
        self.assertEqual(eh._ppl_words("The cat sat\n"), 4)
        self.assertEqual(eh._ppl_words("The cat sat"), 3)
        self.assertEqual(eh._ppl_words(" a  b "), 4)

    def test_a_value_outside_0_1_keeps_its_interval_unclipped(self):
        """Bits per byte are not scores in [0, 1]: their interval is not clipped to it."""
        ci = eh._mean_ci([1.5, 2.5, 2.0])
        self.assertEqual(ci["mean"], 2.0)
        self.assertGreater(ci["ci95"][1], 2.0)
        self.assertLess(ci["ci95"][0], 2.0)
        self.assertGreater(ci["ci95"][0], 1.0)

    def test_the_bfcl_headline_is_the_accuracy_and_a_partial_aggregate_says_so(self):
        """Item 6: a run of simple_python only: the first card is its accuracy; non-live AST is shown as not
        computed (its other categories were not run), never as the headline."""
        d = tempdir(self)
        path, mock = simple_python(self, d)
        out = os.path.join(d, "run")
        res = run_cli(["run", "--task", "tools", "--dataset", path, "--model", "m", "--base-url", mock.url,
                       "--out", out, "--no-progress"])
        self.assertEqual(res.returncode, 0, res.stderr)
        with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
            page = fh.read()
        first = re.search(r"<div class=card><div class=muted>(.*?)</div><div class=big>(.*?)</div></div>", page)
        self.assertEqual(first.group(1), "accuracy over 2 questions")
        self.assertTrue(first.group(2).startswith("1.000"), first.group(2))
        self.assertIn("BFCL non-live AST</div><div class=big><span class=muted style='font-size:14px'>not "
                      "computed: no multiple, parallel, parallel_multiple in this run</span>", page)

    def test_code_records_each_programs_own_time(self):
        """Item 4: a program's exec_s is its own runs' time, not its whole batch's (programs of one batch run one
        after another: their own times add up to at most the batch's)."""
        from tests.test_code import HE_ROWS
        d = tempdir(self)
        rows = [dict(r, task_id="S/%d" % i, canonical_solution="    import time; time.sleep(0.2)\n" +
                     r["canonical_solution"]) for i, r in enumerate(HE_ROWS * 3)]
        path = write_jsonl(os.path.join(d, "he.jsonl"), rows)
        out = os.path.join(d, "run")
        res = run_cli(["run", "--task", "code", "--dataset", path, "--check-reference", "--sandbox", "local",
                       "--code-workers", "1", "--out", out, "--no-progress"])
        self.assertEqual(res.returncode, 0, res.stderr)
        recs = read_samples(out)
        self.assertEqual(len(recs), 6)
        for r in recs:
            self.assertGreaterEqual(r["exec_s"], 0.2)
            self.assertLessEqual(r["exec_s"], r["sandbox_s"])
        self.assertLessEqual(sum(r["exec_s"] for r in recs), max(r["sandbox_s"] for r in recs) + 0.05)

    def test_cost_of_samples_with_no_price_is_null_not_zero(self):
        """Item 11."""
        self.assertIsNone(eh.cost_summary([{"cost": {"model": None}}, {"cost": {"model": None}}])["total"])
        self.assertEqual(eh.cost_summary([{"cost": {"model": 0.5}}])["total"], 0.5)

    def test_a_requests_per_minute_cap_holds_each_request_a_little_past_the_minute(self):
        """Item 12: a request reaches the server a little after it is sent; under --requests-per-minute 2 the
        third waits the minute and the arrival margin, so a server counting arrivals never sees three."""
        clock = [1000.0]
        pacer = eh.RatePacer(rpm=2, clock=lambda: clock[0], wall=lambda: 0.0)
        cost = eh.RatePacer.costs(10, 10)
        pacer.admit(cost)
        pacer.admit(cost)
        self.assertAlmostEqual(pacer.delay(cost), 60.0 + eh.RatePacer.ARRIVAL_MARGIN_S, places=6)
        clock[0] += 60.0
        self.assertGreater(pacer.delay(cost), 0.0)  # 60 s after: still held
        clock[0] += eh.RatePacer.ARRIVAL_MARGIN_S
        self.assertEqual(pacer.delay(cost), 0.0)

    def test_a_reply_to_an_older_request_never_overwrites_a_newer_stated_state(self):
        """Item 19: replies come out of order; the state of the newest request stands."""
        pacer = eh.RatePacer(clock=lambda: 100.0, wall=lambda: 0.0)
        headers = lambda left: {"x-ratelimit-limit-requests": "100", "x-ratelimit-remaining-requests": left,  # noqa
                                "x-ratelimit-reset-requests": "60s"}
        pacer.observe(headers("3"), sent_at=50.0)
        pacer.observe(headers("90"), sent_at=40.0)  # sent earlier, answered later
        self.assertEqual(pacer._stated["requests"]["remaining"], 3.0)
        pacer.observe(headers("80"), sent_at=60.0)  # a newer one does replace it
        self.assertEqual(pacer._stated["requests"]["remaining"], 80.0)


class TestTextReports(unittest.TestCase):
    def test_a_task_below_reward_1_says_its_reward_and_why(self):
        """Item 8: "rewarded (reward 0.0)" read as a success; the line gives the reward and the verifier's last
        line."""
        recs = [{"id": "cipher", "status": "ok", "verdict": "rewarded", "reward": 0.0, "why": "",
                 "verifier_tail": "collected 3 items\nFAILED test_decode - AssertionError: 'abc' != 'xyz'"},
                {"id": "pipes", "status": "ok", "verdict": "no_reward", "reward": None,
                 "why": "the verifier wrote no /logs/verifier/reward.txt or reward.json"}]
        summary = {"tasks": {"verified": 2, "mean_reward": 0.0, "verdicts": {"rewarded": 1, "no_reward": 1},
                             "reward_means": {"reward": 0.0}}}
        lines = eh._task_lines(summary, recs)
        self.assertIn("  cipher: reward 0.0: FAILED test_decode - AssertionError: 'abc' != 'xyz'", lines)
        self.assertIn("  pipes: no_reward: the verifier wrote no /logs/verifier/reward.txt or reward.json", lines)
        self.assertFalse(any("rewarded (reward" in line for line in lines))

    def test_rows_and_epochs_are_both_said(self):
        """Item 9."""
        rows = dict(eh._config_rows({"dataset": {"name": "HumanEval.jsonl.gz", "rows": 300, "epochs": 3,
                                                 "sha256": "ab"}}))
        self.assertEqual(rows["dataset"], "HumanEval.jsonl.gz (100 rows x 3 epochs = 300 samples, sha256 ab)")
        rows = dict(eh._config_rows({"dataset": {"name": "qa.jsonl", "rows": 42, "sha256": "cd"}}))
        self.assertEqual(rows["dataset"], "qa.jsonl (42 rows, sha256 cd)")

    def test_the_leaderboard_names_the_settings_that_differ_marks_lower_is_better_and_fits_the_width(self):
        """Item 10: two runs of one model differing by --tool-mode, and a perplexity run, in one folder."""
        d = tempdir(self)
        from tests.test_loglik import start_mock as loglik_mock
        path, mock = simple_python(self, d)
        runs = os.path.join(d, "runs")
        for mode in ("native", "prompt"):
            res = run_cli(["run", "--task", "tools", "--dataset", path, "--model", "m", "--base-url", mock.url,
                           "--out", os.path.join(runs, mode), "--no-progress", "--tool-mode", mode])
            self.assertEqual(res.returncode, 0, res.stderr)
        docs = write_jsonl(os.path.join(d, "docs.jsonl"), [{"id": "d%d" % i, "text": "The cat sat on the mat %d" % i}
                                                            for i in range(3)])
        res = run_cli(["run", "--task", "perplexity", "--dataset", docs, "--model", "m", "--base-url",
                       loglik_mock(self).url, "--out", os.path.join(runs, "ppl"), "--no-progress"])
        self.assertEqual(res.returncode, 0, res.stderr)
        board = json.loads(run_cli(["report", runs, "--json"]).stdout)
        # (the perplexity run has no --tool-mode: it keeps the plain label)
        self.assertEqual(sorted(board["rows"]), ['m', 'm [tool_mode "native"]', 'm [tool_mode "prompt"]'])
        wide = run_cli(["report", runs], env=clean_env(COLUMNS="400")).stdout
        self.assertIn("perplexity docs.jsonl (bits/byte, lower is better)", wide)
        self.assertIn("tools BFCL_v4_simple_python.json (accuracy)", wide)
        self.assertGreater(max(len(line) for line in wide.splitlines()), 80)
        narrow = run_cli(["report", runs], env=clean_env(COLUMNS="80")).stdout
        self.assertLessEqual(max(len(line) for line in narrow.splitlines()), 80, narrow)
        self.assertIn("tools BFCL_v4_simple_python.json (accuracy)", narrow)
        self.assertRegex(narrow, r'(?m)^  m \[tool_mode "prompt"\]  1\.000 \[')


# ----------------------------------------------------------------------------- messages

class TestMessages(unittest.TestCase):
    def test_a_bfcl_file_without_its_answers_names_the_missing_file(self):
        """Item 14a."""
        d = tempdir(self)
        path = write_bfcl(d, "BFCL_v4_simple_python.json")
        os.remove(os.path.join(d, "possible_answer", "BFCL_v4_simple_python.json"))
        with self.assertRaises(eh.DatasetError) as caught:
            eh.ToolDataset(path)
        msg = str(caught.exception)
        self.assertIn(os.path.join(d, "possible_answer", "BFCL_v4_simple_python.json") + " does not exist", msg)
        self.assertNotIn("simple_python_0", msg)

    def test_a_bfcl_file_run_as_qa_is_named_and_sent_to_task_tools(self):
        """Item 14b: BFCL's .json files are JSON Lines; as a QA dataset they were 'invalid JSON: Extra data'."""
        d = tempdir(self)
        path = write_bfcl(d, "BFCL_v4_simple_python.json")
        res = run_cli(["run", "--dataset", path, "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--out",
                       os.path.join(d, "never")])
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("its rows are BFCL questions (tool calls: id, question, function): run it with --task tools",
                      res.stderr)
        self.assertFalse(os.path.exists(os.path.join(d, "never")))

    def test_help_names_every_kind_exit_code_4_and_one_tool_mode_rule(self):
        """Item 15."""
        top = run_cli(["--help"]).stdout
        self.assertNotIn("on QA sets", top)
        self.assertIn("run --task: qa, code, choice, perplexity, swe, harbor, tools", " ".join(top.split()))
        run = " ".join(run_cli(["run", "--help"]).stdout.split())
        self.assertIn("4 --cost-limit reached", run)
        tool_mode = run.split("--tool-mode [{native,prompt}] ", 1)[1].split("(--task tools):", 1)[0]
        self.assertEqual(tool_mode.count("default"), 1, tool_mode)


# ----------------------------------------------------------------------------- on real Docker

class TestOfflineDefaults(unittest.TestCase):
    def setUp(self):
        bed.require_docker(self)

    def test_a_sandbox_image_nobody_can_deliver_stops_the_run_before_anything_is_written(self):
        """Item 1: one line naming the image and the ways to provide it, exit 2, no run directory."""
        from tests.test_code import HE_ROWS
        d = tempdir(self)
        path = write_jsonl(os.path.join(d, "he.jsonl"), HE_ROWS)
        image = "evalharness-test/absent-%s:1" % bed.unique("img")
        out = os.path.join(d, "run")
        res = run_cli(["run", "--task", "code", "--dataset", path, "--check-reference", "--code-image", image,
                       "--out", out, "--no-progress"])
        self.assertEqual(res.returncode, 2, res.stderr)
        err = [line for line in res.stderr.strip().splitlines() if "sandbox image" in line]
        self.assertEqual(len(err), 1, res.stderr)
        self.assertEqual(res.stderr.strip().splitlines()[-1], err[0])  # the run's last word
        self.assertIn("the sandbox image %s is not on the container engine and no --image-tars, --image-store or "
                      "--image-mirrors delivers it" % image, err[0])
        self.assertIn("docker save", err[0])
        self.assertFalse(os.path.exists(out))

class TestHarborNetworkAndOracle(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        bed.require_docker_for_class()
        from tests import swebed
        swebed.ensure_base_image(log=lambda *a: None)

    def task(self, root, name, extra_toml=""):
        """The verifier rewards 1 when the container has a network interface besides lo; the solution calls a
        file beside solve.sh (/solution/helper.sh), as real tasks' solutions do."""
        return write_task(root, name, toml='''\
            [verifier]
            timeout_sec = 60.0
            [environment]
            docker_image = "%s"
            workdir = "/app"
            %s
            ''' % (BASE, extra_toml), instruction="Nothing to do.\n", test='''\
            #!/bin/bash
            ls /sys/class/net
            [ "$(cat /app/helped 2>/dev/null)" = yes ] || { echo "the solution's helper did not run"; echo 0 > /logs/verifier/reward.txt; exit 0; }
            if ls /sys/class/net | grep -qv '^lo$'; then echo 1 > /logs/verifier/reward.txt
            else echo "curl: (6) Could not resolve host: example.org"; echo 0 > /logs/verifier/reward.txt; fi
            ''', solve="#!/bin/bash\nbash /solution/helper.sh\n",
            files={"solution/helper.sh": "#!/bin/bash\necho yes > /app/helped\n"})

    def test_tasks_get_a_network_unless_they_or_the_run_say_none_and_a_failed_lookup_is_named(self):
        """Item 2 (and 17: the mock's oracle runs solve.sh with the task's solution/ beside it)."""
        d = tempdir(self)
        tasks = os.path.join(d, "tasks")
        self.task(tasks, "open")
        self.task(tasks, "closed", "allow_internet = false")
        mock = eh.MockServer(eh.MockConfig(model="m"), swe=eh.TaskSet(tasks)).start()
        self.addCleanup(mock.close)
        for extra, want in (([], {"open": 1.0, "closed": 0.0}), (["--network-none"], {"open": 0.0, "closed": 0.0})):
            out = os.path.join(d, "run%d" % len(extra))
            res = run_cli(["run", "--task", "harbor", "--dataset", tasks, "--model", "m", "--base-url", mock.url,
                           "--out", out, "--no-progress", "--exec-timeout", "30"] + extra, timeout=600)
            recs = {r["id"]: r for r in read_samples(out)}
            self.assertEqual({k: r["reward"] for k, r in recs.items()}, want, res.stderr)
            with open(os.path.join(out, "run.json")) as fh:
                network = json.load(fh)["network"]
            self.assertEqual(network, "none for every task (--network-none)" if extra else
                             "each task's own (allow_internet; on unless the task says false)")
            why = recs["closed"]["why"]
            self.assertIn("the verifier's output shows a failed name lookup or connection", why)
            self.assertIn("--network-none" if extra else "allow_internet = false", why)
            text = run_cli(["report", out]).stdout
            self.assertIn("closed: reward 0.0: ", text)


if __name__ == "__main__":
    unittest.main()
