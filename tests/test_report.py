"""Reports: the numbers of the table on a hand-made fixture run, the HTML in headless Chromium (no console errors,
charts with data, a screenshot kept as an artifact), escaping and secrets, comparison of two runs, and agreement
with what the run itself printed."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

from tests.support import CLI, STAMP_RE, clean_env, eh, qa_rows, run_cli, start_mock, tempdir, write_jsonl

T0 = 1_800_000_000.0
SECRET = "sk-evalharness-test-SECRET-0123456789abcdef"
ARTIFACTS = os.environ.get("EVALHARNESS_TEST_ARTIFACTS") or os.path.join(tempfile.gettempdir(),
                                                                         "evalharness-test-artifacts")


EVIL = "<script>alert('evil')</script>"


def qa_fixture(d: str, *, scores=(1, 1, 1, 0, 1, 0, 0, 1), evil_response=None, model="m", evil_text=False,
               prefix="s") -> str:
    """Eight scored samples (a: 1 1 1 0, b: 1 0 0 1 → 5/8), two failed (overload, fatal), latencies 0.1..0.8 s.
    Each has a question ("Question N?"); ``evil_text`` puts a <script> in s4's question, response and reference."""
    run = os.path.join(d, "run-qa")
    os.makedirs(run)
    recs = []
    for i, score in enumerate(scores, 1):
        evil = evil_text and i == 4
        recs.append({"id": "%s%d" % (prefix, i), "status": "ok", "score": float(score), "error": None,
                     "error_class": None, "question": "Question %d? %s" % (i, EVIL if evil else ""),
                     "extracted": "extracted-%d" % i,
                     "category": "a" if i <= 4 else "b", "scorer": "exact", "answer": EVIL if evil else "x",
                     "response": evil_response if (evil_response and i == 4) else
                     ("resp %d %s" % (i, EVIL if evil else "")), "prompt_tokens": 10,
                     "completion_tokens": i, "latency_s": i / 10.0, "ttft_s": 0.01, "started_at": T0 + i,
                     "finished_at": T0 + i + i / 10.0})
    recs.append({"id": prefix + "9", "status": "failed", "question": "Question 9?", "score": None, "error": "HTTP 429 from http://x/v1 (overload; 6 "
                 "attempts)", "error_class": "overload", "category": "a", "started_at": T0 + 9, "finished_at": T0 + 10})
    recs.append({"id": prefix + "10", "status": "failed", "score": None, "error": "HTTP 401: bad key %s" % SECRET,
                 "error_class": "fatal", "category": "b", "started_at": T0 + 10, "finished_at": T0 + 10.5})
    write_jsonl(os.path.join(run, "samples.jsonl"), recs)
    with open(os.path.join(run, "run.json"), "w") as fh:
        json.dump({"task": "qa", "status": "finished", "endpoint": {"model": model, "base_url": "http://gpu7:8000/v1"},
                   "dataset": {"name": "fx.jsonl", "rows": 10, "sha256": "ab" * 32}, "discovered_limit": 7,
                   "concurrency": {"initial": 4}, "evalharness_version": "0.1.0", "python": "3.11.7",
                   "identity": {"settings": {"temperature": 0.0, "max_tokens": 256}},
                   "history": [{"status": "killed", "started_at": "2027-01-15T08:00:00Z",
                                "ended_at": "2027-01-15T08:00:05Z"},
                               {"status": "finished", "started_at": "2027-01-15T08:01:00Z",
                                "ended_at": "2027-01-15T08:01:09Z"}]}, fh)
    write_jsonl(os.path.join(run, "events.jsonl"), [
        {"t": T0 + 1, "type": "run_start"}, {"t": T0 + 3, "type": "limit", "limit": 9, "previous": 4},
        {"t": T0 + 5, "type": "drain", "limit": 6, "drain_s": 2.0}, {"t": T0 + 8, "type": "limit", "limit": 7}])
    return run


def swe_fixture(d: str, n: int = 3, traj_chars: int = 300) -> str:
    run = os.path.join(d, "run-swe")
    os.makedirs(os.path.join(run, "trajectories"))
    recs = []
    for i in range(n):
        iid = "o__r-%d" % i
        resolved = i % 3 == 0
        recs.append({"id": iid, "status": "ok", "score": 1.0 if resolved else 0.0, "error": None, "repo": "o/r",
                     "category": "o/r", "scorer": "swebench", "outcome": "resolved" if resolved else "unresolved",
                     "resolved": resolved, "f2p": [1 if resolved else 0, 1], "p2p": [2, 2], "steps": 4,
                     "exit_reason": "submitted", "model_patch": "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n"
                     "@@ -1 +1 @@\n-a = 1\n+a = 2  # <b>bold?</b>\n", "started_at": T0 + i, "finished_at": T0 + i + 5,
                     "completion_tokens": 50})
        with open(os.path.join(run, "trajectories", iid + ".json"), "w") as fh:
            json.dump({"instance_id": iid, "exit_reason": "submitted", "messages": [
                {"role": "system", "content": "sys"}, {"role": "user", "content": "fix it " + "y" * traj_chars},
                {"role": "assistant", "content": "```bash\necho <script>alert(2)</script>\n```"}]}, fh)
    write_jsonl(os.path.join(run, "samples.jsonl"), recs)
    with open(os.path.join(run, "run.json"), "w") as fh:
        json.dump({"task": "swe", "status": "finished", "endpoint": {"model": "m"},
                   "dataset": {"name": "swe.jsonl", "rows": n}, "concurrency": {"initial": 8}}, fh)
    return run


def two_runs(test, a_kw=None, **b_kw):
    """Two fixture runs in a temp dir: A as qa_fixture makes it (``a_kw``), B with ``b_kw``; (dir, A, B)."""
    d = tempdir(test)
    os.makedirs(os.path.join(d, "a"))
    os.makedirs(os.path.join(d, "b"))
    return d, qa_fixture(os.path.join(d, "a"), **(a_kw or {})), qa_fixture(os.path.join(d, "b"), **b_kw)


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return ""


def require_chromium(test: unittest.TestCase) -> str:
    """The headless browser's executable; the test skips without one (fails under EVALHARNESS_REQUIRE_DOCKER=1)."""
    exe = chromium()
    if not exe:
        if os.environ.get("EVALHARNESS_REQUIRE_DOCKER") == "1":
            test.fail("EVALHARNESS_REQUIRE_DOCKER=1 (CI) but chromium is not installed")
        test.skipTest("chromium is not installed (Debian package chromium)")
    return exe


class TestReportNumbers(unittest.TestCase):

    def test_table_numbers_match_hand_computed_values(self):
        data = eh.report_data(eh.load_run(qa_fixture(tempdir(self))))
        s = data["summary"]
        self.assertEqual(s["counts"], {"total": 10, "finished": 10, "ok": 8, "failed": 2, "pending": 0})
        self.assertAlmostEqual(s["score"]["mean"], 0.625)
        # Wilson 95% for 5/8, 3/4, 2/4, computed by hand
        self.assertEqual([round(x, 4) for x in s["score"]["ci95"]], [0.3057, 0.8632])
        self.assertEqual([round(x, 4) for x in s["by_category"]["a"]["ci95"]], [0.3006, 0.9544])
        self.assertEqual([round(x, 4) for x in s["by_category"]["b"]["ci95"]], [0.15, 0.85])
        self.assertEqual((s["by_category"]["a"]["failed"], s["by_category"]["b"]["failed"]), (1, 1))
        lat = s["performance"]["latency_s"]
        self.assertEqual((lat["p50"], lat["p95"], lat["p99"]), (0.45, 0.765, 0.793))
        self.assertEqual(s["tokens"]["completion"], 36)
        self.assertEqual({k: v["count"] for k, v in data["failures"].items()}, {"overload": 1, "fatal": 1})
        self.assertEqual(data["discovered_limit"], 7)
        text = eh.format_report(data)
        self.assertIn("score   0.625  [0.306, 0.863]  over 8 of 10 (2 failed): INCOMPLETE", text)
        self.assertIn("score   0.500  counting the 2 failed or not run as wrong (n=10)", text)
        self.assertIn("discovered concurrency: 7", text)
        self.assertRegex(text, r"overload\s+1  e\.g\. s9: HTTP 429")

    def test_timeline_holds_in_flight_limit_and_drain(self):
        ser = eh.report_data(eh.load_run(qa_fixture(tempdir(self))))["series"]
        self.assertEqual(max(v for _, v in ser["in_flight"]), 1)  # the fixture's samples never overlap
        self.assertEqual([v for _, v in ser["limit"]], [4, 9, 6, 7, 7])
        self.assertEqual(ser["drains"], [(4.0, 6.0)])
        self.assertAlmostEqual(sum(ser["rate"]) * ser["bin_s"], 10, places=2)

    def test_resumes_and_a_breaker_trip_are_marked_counts_get_integer_ticks_and_bursts_wider_bins(self):
        run = qa_fixture(tempdir(self))
        with open(os.path.join(run, "events.jsonl"), "a") as fh:
            for ev in ({"t": T0 + 6, "type": "breaker_open"}, {"t": T0 + 7, "type": "run_start"}):
                fh.write(json.dumps(ev) + "\n")
        data = eh.report_data(eh.load_run(run))
        self.assertEqual(data["series"]["marks"], [(5.0, "breaker"), (6.0, "resume")])
        page = eh.render_html(data, eh.load_run(run))
        chart = page[page.index('id="chart-concurrency"'):]
        chart = chart[:chart.index("</svg>")]
        self.assertEqual(chart.count('class="mark"'), 2)
        ticks = re.findall(r'text-anchor="end">([^<]+)<', chart)
        self.assertTrue(ticks and all(re.fullmatch(r"\d+", t) for t in ticks), ticks)  # no 1.62 on a count axis
        # 10 completions: one bin (about eight completions a bin), not ten one-second spikes
        self.assertEqual(len(data["series"]["rate"]), 1)

    def test_idle_hours_between_attempts_are_cut_from_the_time_axis_and_said(self):
        run = qa_fixture(tempdir(self))  # samples T0+1 .. T0+10.5; then a resume five hours later
        idle = 5 * 3600.0
        late = [{"id": "r%d" % i, "status": "ok", "score": 1.0, "category": "a", "scorer": "exact",
                 "completion_tokens": 3, "latency_s": 0.5, "started_at": T0 + 10.5 + idle + i,
                 "finished_at": T0 + 11 + idle + i} for i in range(1, 9)]
        write_jsonl(os.path.join(run, "samples.jsonl"), eh._read_jsonl_tolerant(os.path.join(run, "samples.jsonl"))
                    + late)
        with open(os.path.join(run, "events.jsonl"), "a") as fh:
            for ev in ({"t": T0 + 10.5 + idle, "type": "run_start"},
                       {"t": T0 + 12.5 + idle, "type": "drain", "limit": 5, "drain_s": 1.0}):
                fh.write(json.dumps(ev) + "\n")
        data = eh.report_data(eh.load_run(run))
        ser = data["series"]
        self.assertEqual(ser["breaks"], [(9.5, idle)])  # at the resume, 9.5 s of activity after the first start
        self.assertEqual(ser["duration_s"], 18.0)       # 9.5 s before, 8.5 s after: not five hours
        self.assertIn((9.5, "resume (5h00m idle, cut)"), ser["marks"])
        self.assertEqual(ser["drains"][-1], (11.5, 12.5))
        self.assertLessEqual(max(t for t, _ in ser["in_flight"]), 18.0)
        self.assertAlmostEqual(sum(ser["rate"]) * ser["bin_s"], 18, places=2)  # every completion in a bin
        page = eh.render_html(data, eh.load_run(run))
        self.assertIn("The time axis leaves out 5h00m between attempts", page)
        self.assertIn("idle time between attempts cut", page)
        # a short pause between attempts stays on the axis as it was
        self.assertEqual(eh.report_data(eh.load_run(qa_fixture(tempdir(self))))["series"]["breaks"], [])

    def test_in_flight_counts_requests_at_the_endpoint_not_samples_waiting_out_a_backoff(self):
        recs = [{"id": "slow", "status": "ok", "score": 1.0, "started_at": T0, "finished_at": T0 + 10,
                 "latency_s": 1.0},  # nine seconds of retries and backoff, then a one-second request
                {"id": "quick", "status": "ok", "score": 1.0, "started_at": T0 + 1, "finished_at": T0 + 3,
                 "latency_s": 2.0}]
        ser = eh._timeline(recs, [], {})
        self.assertEqual(max(v for _, v in ser["in_flight"]), 1)
        swe = [dict(r, latency_s=None) for r in recs]  # SWE records: the whole session is in flight
        self.assertEqual(max(v for _, v in eh._timeline(swe, [], {})["in_flight"]), 2)

    def test_a_pause_that_ended_early_is_shaded_only_until_it_ended(self):
        # a refusal without Retry-After pauses for at most 30 s but ends at the next success: the gate says so
        run = qa_fixture(tempdir(self))
        write_jsonl(os.path.join(run, "events.jsonl"), [
            {"t": T0 + 1, "type": "run_start"}, {"t": T0 + 5, "type": "drain", "limit": 6, "drain_s": 30.0},
            {"t": T0 + 6.5, "type": "drain_end"}, {"t": T0 + 8, "type": "drain", "limit": 5, "drain_s": 2.0},
            {"t": T0 + 20, "type": "drain_end"}])  # (one after its pause was over changes nothing)
        ser = eh.report_data(eh.load_run(run))["series"]
        self.assertEqual(ser["drains"], [(4.0, 5.5), (7.0, 9.0)])

    def test_a_killed_run_with_a_torn_tail_still_reports(self):
        run = qa_fixture(tempdir(self))
        with open(os.path.join(run, "samples.jsonl"), "a") as fh:
            fh.write('{"id": "s11", "status": "ok", "sco')
        os.unlink(os.path.join(run, "run.json"))
        data = eh.report_data(eh.load_run(run))
        self.assertEqual(data["summary"]["counts"]["finished"], 10)

    def test_swe_report_counts_and_sizes_stay_bounded_with_long_trajectories(self):
        run = swe_fixture(tempdir(self), n=300, traj_chars=200_000)
        path = eh.write_html_report(run)
        size = os.path.getsize(path)
        self.assertLess(size, 5_000_000)
        with open(path, encoding="utf-8") as fh:
            page = fh.read()
        self.assertIn("characters not shown", page)  # long trajectories are cut with a note
        self.assertEqual(page.count("<details>"), 300)
        data = eh.report_data(eh.load_run(run))
        self.assertEqual((data["swebench"]["resolved_instances"], data["swebench"]["total_instances"]), (100, 300))

    def test_the_configuration_says_when_the_run_started_and_how_long_it_took_in_words(self):
        history = [{"status": "finished", "started_at": "2026-12-03T07:05:00Z", "ended_at": "2026-12-03T09:18:41Z"}]
        self.assertEqual(eh._started_took(history), "Thu 3 Dec 2026 07:05 UTC, took 2 h 13 min")
        running = history + [{"status": "running", "started_at": "2026-12-04T00:00:00Z", "ended_at": None}]
        self.assertEqual(eh._started_took(running),
                         "Thu 3 Dec 2026 07:05 UTC, still running (took 2 h 13 min before) over 2 attempts "
                         "(2 h 13 min from the first start to the last end)")
        self.assertEqual([eh._duration_words(s) for s in (0, 45, 60, 192, 3600, 7980, 90000, 3 * 86400)],
                         ["0 s", "45 s", "1 min", "3 min 12 s", "1 h", "2 h 13 min", "1 d 1 h", "3 d"])
        text = eh.format_report(eh.report_data(eh.load_run(qa_fixture(tempdir(self)))))
        self.assertIn("\nstarted: Fri 15 Jan 2027 08:00 UTC, took 14 s over 2 attempts", text)
        self.assertIn("2027-01-15T08:00:00Z to 2027-01-15T08:01:09Z", text)  # next to the span

    def test_bad_arguments_are_one_line_errors(self):
        d = tempdir(self)
        for argv, pattern in ((["report", d], "has no samples.jsonl"), (["report", os.path.join(d, "nope")],
                              "is not a run directory"), (["report", d, d, d], "no finished run under")):
            proc = subprocess.run([sys.executable, CLI] + argv, env=clean_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
            self.assertEqual(proc.returncode, 2, proc.stderr)
            self.assertRegex(proc.stderr.strip(), "^" + STAMP_RE + "evalharness: .*" + pattern)
            self.assertEqual(len(proc.stderr.strip().splitlines()), 1)


class TestHtmlReport(unittest.TestCase):

    def _page(self, run):
        env = clean_env(OPENAI_API_KEY=SECRET)
        proc = subprocess.run([sys.executable, CLI, "report", run, "--html"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        path = os.path.join(run, "report.html")
        with open(path, encoding="utf-8") as fh:
            return path, fh.read()

    def test_model_and_dataset_text_is_escaped_and_secrets_are_absent(self):
        run = qa_fixture(tempdir(self), evil_response="<script>alert('x')</script>")
        _, page = self._page(run)
        self.assertNotIn("<script>alert", page)
        self.assertIn("&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;", page)
        self.assertNotIn(SECRET, page)
        self.assertNotIn(SECRET[:12], page)
        self.assertEqual(page.count("<script>"), 1)  # only the report's own table-sorting script
        self.assertNotRegex(page, r'(src|href)="(https?:)?//')  # nothing external

    def test_paths_and_plain_words_in_key_named_variables_are_not_treated_as_secrets(self):
        """Scrubbing them would cut unrelated text out of reports (a trajectory that mentions the path)."""
        env = {"GOOGLE_APPLICATION_CREDENTIALS": "/home/u/gcp/sa.json", "PIP_KEYRING_PROVIDER": "subprocess",
               "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz012345"}
        old = dict(os.environ)
        try:
            os.environ.update(env)
            eh._register_env_secrets()
        finally:
            os.environ.clear()
            os.environ.update(old)
        self.assertEqual(eh._esc("cat /home/u/gcp/sa.json; subprocess.run()"),
                         "cat /home/u/gcp/sa.json; subprocess.run()")
        self.assertNotIn("hf_abcdefgh", eh._esc("token hf_abcdefghijklmnopqrstuvwxyz012345 <b>"))
        self.assertTrue(eh._esc("token hf_abcdefghijklmnopqrstuvwxyz012345 <b>").endswith("&lt;b&gt;"))

    def test_html_opens_in_headless_chromium_with_charts_and_no_console_errors(self):
        exe = require_chromium(self)
        os.makedirs(ARTIFACTS, exist_ok=True)
        d = tempdir(self)
        for kind, run in (("qa", qa_fixture(d)), ("swe", swe_fixture(d))):
            path, _ = self._page(run)
            flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--user-data-dir=" + tempdir(self), "--enable-logging=stderr", "--v=0"]
            dom = subprocess.run(flags + ["--dump-dom", "file://" + path], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
            self.assertEqual(dom.returncode, 0, dom.stderr[-2000:])
            console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
            self.assertEqual(console, [], "console messages in %s report" % kind)
            self.assertIn('data-ready="1"', dom.stdout)  # the inline script ran to its end
            for chart in ("chart-concurrency", "chart-throughput", "chart-tokens", "chart-latency"):
                m = re.search(r'<svg id="%s" class="chart" [^>]*data-points="(\d+)"' % chart, dom.stdout)
                self.assertIsNotNone(m, "%s: %s missing or empty" % (kind, chart))
                self.assertGreater(int(m.group(1)), 0)
            self.assertRegex(dom.stdout, r'<polyline class="series" data-name="(requests in flight|sessions)" [^>]*points="[\d.]+,')
            if kind == "swe":
                self.assertEqual(dom.stdout.count("<details>"), 3)
                self.assertIn('<ins>+a = 2  # &lt;b&gt;bold?&lt;/b&gt;</ins>', dom.stdout)
            # this process's own file, then renamed: test processes running at the same time share ARTIFACTS
            shot = os.path.join(ARTIFACTS, "report-%s.%d.png" % (kind, os.getpid()))
            out = subprocess.run(flags + ["--window-size=1280,2400", "--screenshot=" + shot, "file://" + path],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
            self.assertEqual(out.returncode, 0)
            self.assertGreater(os.path.getsize(shot), 10_000)
            os.replace(shot, os.path.join(ARTIFACTS, "report-%s.png" % kind))


    def dom(self, path):
        exe = require_chromium(self)
        flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--user-data-dir=" + tempdir(self), "--enable-logging=stderr",
                 "--v=0", "--dump-dom", "file://" + path]
        dom = subprocess.run(flags, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                             timeout=120)
        self.assertEqual(dom.returncode, 0, dom.stderr[-2000:])
        self.assertEqual([line for line in dom.stderr.splitlines() if "CONSOLE" in line], [])
        return dom.stdout

    def test_samples_show_question_extracted_answer_and_error_class_and_hostile_text_stays_text(self):
        d = tempdir(self)
        page = self.dom(self._page(qa_fixture(d, evil_text=True))[0])
        samples = page[page.index('id="samples"'):]
        samples = samples[:samples.index("</table>")]
        self.assertIn("Question 6?", samples)        # a wrong sample: its question, extracted answer, response
        self.assertIn("extracted-6", samples)
        self.assertIn("resp 6", samples)
        self.assertIn("Question 9?", samples)        # a failed one: its class and message
        self.assertIn("overload", samples)
        self.assertIn("HTTP 429 from http://x/v1", samples)
        self.assertEqual(samples.count("&lt;script&gt;alert('evil')&lt;/script&gt;"), 3)  # question, reference, reply
        self.assertNotIn("alert('evil')</script>", page)
        config = page[page.index('id="config"'):]
        for text in ("m at gpu7", "temperature 0.0, max_tokens 256", "sha256 " + "ab" * 32, "evalharness 0.1.0",
                     "2 attempt(s): killed", "Fri 15 Jan 2027 08:00 UTC, took 14 s over 2 attempts (1 min 9 s "
                     "from the first start to the last end)"):
            self.assertIn(text, config[:config.index("</table>")])

    def test_comparison_page_names_the_models_and_shows_a_flipped_samples_question(self):
        d, a, b = two_runs(self, a_kw=dict(model="llama-3-8b"), scores=(1, 1, 1, 1, 1, 1, 0, 0), model="qwen-7b")
        proc = subprocess.run([sys.executable, CLI, "report", a, b, "--html"], env=clean_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60,
                              cwd=d)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertFalse(os.path.exists(os.path.join(d, "comparison.html")))  # not into the current directory
        page = self.dom(os.path.join(a, "comparison.html"))
        self.assertIn("(model llama-3-8b)", page)
        self.assertIn("(model qwen-7b)", page)
        flipped = page[page.index('id="flipped"'):]
        self.assertIn("worse in B", flipped)
        self.assertIn("Question 8?", flipped)  # s8 regressed: its question and both responses
        self.assertIn("resp 8", flipped)
        self.assertIn('id="categories"', page)


class TestComparison(unittest.TestCase):

    def test_two_runs_that_share_no_sample_exit_1_with_a_warning(self):
        d, a, b = two_runs(self, prefix="other")
        proc = subprocess.run([sys.executable, CLI, "report", a, b], env=clean_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertIn("share no sample id: nothing was compared", proc.stderr)

    def test_per_category_deltas_with_paired_intervals(self):
        d, a, b = two_runs(self, scores=(1, 1, 1, 1, 1, 1, 0, 0))
        cats = eh.compare_runs(eh.load_run(a), eh.load_run(b))["by_category"]
        self.assertEqual({k: (v["n"], v["diff"]) for k, v in cats.items()}, {"a": (4, 0.25), "b": (4, 0.0)})
        self.assertLessEqual(cats["a"]["ci95"][0], 0.25)

    def test_paired_difference_flips_and_resolved_only_in_one(self):
        d, a, b = two_runs(self, scores=(1, 1, 1, 1, 1, 1, 0, 0))
        c = eh.compare_runs(eh.load_run(a), eh.load_run(b))
        self.assertEqual((c["common"], c["paired_scored"]), (10, 8))
        self.assertEqual((c["improved"], c["regressed"]), (["s4", "s6"], ["s8"]))
        self.assertAlmostEqual(c["score"]["diff"], 1 / 8)
        lo, hi = c["score"]["ci95"]
        self.assertLessEqual(lo, 1 / 8)
        self.assertGreaterEqual(hi, 1 / 8)
        self.assertLess(lo, hi)
        self.assertEqual(c, eh.compare_runs(eh.load_run(a), eh.load_run(b)))  # seeded: the same every time
        lat = c["metrics"]["latency_s"]  # the fixture's latencies are equal in both runs
        self.assertEqual((lat["n"], lat["diff"], lat["ci95"]), (8, 0.0, [0.0, 0.0]))
        proc = subprocess.run([sys.executable, CLI, "report", a, b], env=clean_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("better in B:            2  s4, s6", proc.stdout)
        self.assertIn("worse in B:             1  s8", proc.stdout)

    def test_swe_runs_list_instances_resolved_by_only_one(self):
        d = tempdir(self)
        os.makedirs(os.path.join(d, "a"))
        os.makedirs(os.path.join(d, "b"))
        a = swe_fixture(os.path.join(d, "a"), n=3)
        b = swe_fixture(os.path.join(d, "b"), n=3)
        with open(os.path.join(b, "samples.jsonl")) as fh:
            recs = [json.loads(line) for line in fh]
        recs[0].update(resolved=False, score=0.0, outcome="unresolved")
        recs[1].update(resolved=True, score=1.0, outcome="resolved")
        write_jsonl(os.path.join(b, "samples.jsonl"), recs)
        c = eh.compare_runs(eh.load_run(a), eh.load_run(b))
        self.assertEqual((c["resolved_only_in_a"], c["resolved_only_in_b"]), (["o__r-0"], ["o__r-1"]))


class TestReportAgreesWithTheRun(unittest.TestCase):

    def test_the_report_table_is_the_table_the_run_printed(self):
        out = os.path.join(tempdir(self), "demo")
        proc = subprocess.run([sys.executable, CLI, "demo", "--out", out], env=clean_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(os.path.exists(os.path.join(out, "report.html")))  # written at the end of every run
        rep = subprocess.run([sys.executable, CLI, "report", out], env=clean_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
        self.assertEqual(rep.returncode, 0, rep.stderr)
        printed = proc.stdout.strip().splitlines()
        # the whole table, from its head to the run directory (a run that printed nothing would match any report)
        self.assertEqual(printed[:2], ["evalharness qa | model demo-mock | dataset demo | finished",
                                       "samples: 42 total, 42 ok, 0 failed, 0 pending"])
        self.assertEqual(printed[-1], "run directory: %s" % out)
        self.assertEqual(rep.stdout.strip().splitlines()[:len(printed)], printed)
        with open(os.path.join(out, "summary.json")) as fh:
            summary = json.load(fh)
        js = subprocess.run([sys.executable, CLI, "report", out, "--json"], env=clean_env(),
                            stdout=subprocess.PIPE, universal_newlines=True, timeout=60)
        mine = json.loads(js.stdout)  # the summary at the top, as summary.json and run --json have it
        for key in ("counts", "score", "by_category", "by_scorer", "tokens", "errors"):
            self.assertEqual(mine[key], summary[key], key)
        # the progress line's final counts are the report's
        last = [line for line in proc.stderr.splitlines() if " done | " in line][-1]
        m = re.search(r"(\d+)/(\d+) done \| (\d+) failed", last)
        self.assertEqual((int(m.group(1)), int(m.group(2)), int(m.group(3))),
                         (mine["counts"]["finished"], mine["counts"]["total"], mine["counts"]["failed"]))

    def test_report_json_has_the_top_level_shape_of_run_json(self):
        d = tempdir(self)
        mock = start_mock(self, oracle_rows=qa_rows(12), skill=0.5, faults=(("400", 0.25),), seed=2)
        ds = write_jsonl(os.path.join(d, "qa.jsonl"), qa_rows(12))
        out = os.path.join(d, "run")
        run = run_cli(["run", "--dataset", ds, "--model", "m", "--base-url", mock.url, "--out", out, "--json",
                       "--no-progress"])
        self.assertEqual(run.returncode, 1, run.stderr)  # some requests were refused (HTTP 400): incomplete
        printed = json.loads(run.stdout)
        report = json.loads(run_cli(["report", out, "--json"]).stdout)
        self.assertIsNotNone(report["headline"])
        self.assertLessEqual(set(printed), set(report))
        for key in printed:
            if key != "performance":  # (wall-clock: the report's counts from the records alone)
                self.assertEqual(report[key], printed[key], key)
        self.assertEqual(report["report"]["failures"]["bad_request"]["count"], printed["counts"]["failed"])
        with open(os.path.join(out, "summary.json")) as fh:
            self.assertLessEqual(set(json.load(fh)), set(report))

    def test_an_incomplete_runs_header_says_incomplete_and_the_scorer_row_names_where_it_came_from(self):
        d = tempdir(self)
        mock = start_mock(self, oracle_rows=qa_rows(12), skill=0.5, faults=(("400", 0.25),), seed=2)
        plain = write_jsonl(os.path.join(d, "qa.jsonl"), qa_rows(12))
        out = os.path.join(d, "run")
        run = run_cli(["run", "--dataset", plain, "--model", "m", "--base-url", mock.url, "--out", out,
                       "--no-progress"])
        self.assertEqual(run.returncode, 1, run.stderr)
        title = run.stdout.splitlines()[0]
        self.assertTrue(title.endswith("| incomplete"), title)
        self.assertIn("INCOMPLETE", run.stdout)
        text = run_cli(["report", out]).stdout
        self.assertEqual(text.splitlines()[0], title)
        self.assertIn("\nscorer: includes (the default: no format matched)\n", text)
        self.assertNotIn("format's", text)
        with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
            self.assertIn("status incomplete", fh.read())
        with open(os.path.join(out, "run.json")) as fh:
            self.assertEqual(json.load(fh)["status"], "finished")  # the process ended normally
        gsm = write_jsonl(os.path.join(d, "gsm.jsonl"), [{"question": r["prompt"], "answer": "So #### " + r["answer"]}
                                                         for r in qa_rows(3)])
        out2 = os.path.join(d, "gsm")
        whole = start_mock(self)
        run = run_cli(["run", "--dataset", gsm, "--model", "m", "--base-url", whole.url, "--out", out2,
                       "--no-progress"])
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertTrue(run.stdout.splitlines()[0].endswith("| finished"), run.stdout)
        self.assertIn("\nscorer: numeric (the gsm8k format's)\n", run_cli(["report", out2]).stdout)


if __name__ == "__main__":
    unittest.main()
