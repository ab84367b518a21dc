"""HTTP model client: ModelClient against the in-module MockServer and small recording servers, over real loopback.

Retries are made fast by patching RETRY_BASE_S (the backoff base, read at call time); every fault a test needs is
produced for real by a server on 127.0.0.1:0.
"""
import email.utils
import http.server
import json
import os
import threading
import time
import unittest
from unittest import mock

from tests.support import dead_port, eh, qa_rows, read_samples, run_cli, start_mock, tempdir, wait_until, write_jsonl

MESSAGES = [{"role": "user", "content": "Say something."}]
MOCK_TEXT = "This is the mock model."  # what the mock answers without an oracle: 5 tokens






def run_threads(target, n: int, timeout_s: float):
    """Run ``target(i)`` in n threads; return the threads still alive after ``timeout_s`` (should be none)."""
    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t for t in threads if t.is_alive()]


def fast_retries(test: unittest.TestCase, base_s: float = 0.01) -> None:
    """Shrink the retry backoff base for this test (restored in cleanup)."""
    patcher = mock.patch.object(eh, "RETRY_BASE_S", base_s)
    patcher.start()
    test.addCleanup(patcher.stop)


def client(url: str, **config) -> "eh.ModelClient":
    config.setdefault("model", "mock-model")
    config.setdefault("request_timeout_s", 10.0)
    cancel = config.pop("cancel", None)
    gate = config.pop("gate", None)
    health = config.pop("health", None)
    return eh.ModelClient(eh.ClientConfig(base_url=url, **config), gate=gate, cancel=cancel, health=health)


# -- a scripted recording server: one response per request, in order (the last repeats) -------------------------

def json_ok(text: str = "ok", usage: bool = True):
    def respond(h):
        out = {"id": "x", "object": "chat.completion",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
        if usage:
            out["usage"] = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        h.send_body(200, json.dumps(out).encode(), "application/json")
    return respond


def status(code: int, headers=None, body: bytes = b'{"error": {"message": "nope"}}'):
    def respond(h):
        h.send_body(code, body, "application/json", headers)
    return respond


def sse(*events: bytes):
    """A streamed response made of raw SSE bytes (the connection closes after the last one)."""
    def respond(h):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        for ev in events:
            h.wfile.write(ev)
        h.wfile.flush()
    return respond


def good_sse(text: str = "fine"):
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    return sse(b"data: " + json.dumps(chunk).encode() + b"\n\n", b"data: " + json.dumps(end).encode() + b"\n\n",
               b"data: [DONE]\n\n")


def drip(chunk: bytes, every_s: float, for_s: float, *, stream: bool):
    """Headers at once, then ``chunk`` every ``every_s`` for ``for_s`` (the body never completes)."""
    def respond(h):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream" if stream else "application/json")
        if not stream:
            h.send_header("Content-Length", "100000")
        h.end_headers()
        h.wfile.flush()
        end = time.monotonic() + for_s
        while time.monotonic() < end and not h.server.stopping.wait(every_s):
            try:
                h.wfile.write(chunk)
                h.wfile.flush()
            except OSError:
                return
    return respond


class _ScriptHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002
        pass

    def send_body(self, code, body, ctype, headers=None):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        srv = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with srv.lock:
            n = len(srv.requests)
            srv.requests.append({"t": time.monotonic(), "path": self.path, "headers": dict(self.headers),
                                 "body": json.loads(body.decode("utf-8"))})
        srv.script[min(n, len(srv.script) - 1)](self)


class _ScriptServer(http.server.ThreadingHTTPServer):
    daemon_threads = True


def start_script(test: unittest.TestCase, *script) -> "_ScriptServer":
    """A server on 127.0.0.1:0 answering request i with script[i] (the last repeats); records every request."""
    srv = _ScriptServer(("127.0.0.1", 0), _ScriptHandler)
    srv.script, srv.requests, srv.lock, srv.stopping = list(script), [], threading.Lock(), threading.Event()
    srv.url = "http://127.0.0.1:%d/v1" % srv.server_address[1]
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()

    def stop():
        srv.stopping.set()
        srv.shutdown()
        srv.server_close()
        thread.join(5)
    test.addCleanup(stop)
    return srv


# =============================================================================================================


class TestChatResult(unittest.TestCase):
    def test_streaming_returns_text_usage_latency_and_ttft_when_mock_streams(self):
        srv = start_mock(self, decode_tok_s=200)
        r = client(srv.url, stream=True).chat(MESSAGES)
        self.assertEqual(r.text, MOCK_TEXT)
        self.assertEqual(r.finish_reason, "stop")
        self.assertFalse(r.usage_estimated)
        self.assertEqual(r.completion_tokens, 5)
        self.assertGreater(r.prompt_tokens, 0)
        self.assertGreater(r.latency_s, 0)
        self.assertIsNotNone(r.ttft_s)
        self.assertGreater(r.ttft_s, 0)
        self.assertLessEqual(r.ttft_s, r.latency_s)
        self.assertEqual(r.attempts, 1)
        self.assertGreaterEqual(r.wall_s, r.latency_s)

    def test_non_streaming_returns_text_usage_latency_and_no_ttft_when_stream_false(self):
        srv = start_mock(self, decode_tok_s=200)
        r = client(srv.url, stream=False).chat(MESSAGES)
        self.assertEqual(r.text, MOCK_TEXT)
        self.assertEqual(r.finish_reason, "stop")
        self.assertFalse(r.usage_estimated)
        self.assertEqual(r.completion_tokens, 5)
        self.assertGreater(r.prompt_tokens, 0)
        self.assertGreater(r.latency_s, 0)
        self.assertIsNone(r.ttft_s)

    def test_usage_is_estimated_and_positive_when_server_sends_no_usage(self):
        srv = start_mock(self, send_usage=False)
        for stream in (True, False):
            with self.subTest(stream=stream):
                r = client(srv.url, stream=stream).chat(MESSAGES)
                self.assertEqual(r.text, MOCK_TEXT)
                self.assertTrue(r.usage_estimated)
                self.assertGreater(r.completion_tokens, 0)

    def test_finish_reason_is_length_when_max_tokens_is_below_the_reply(self):
        srv = start_mock(self)
        for stream in (True, False):
            with self.subTest(stream=stream):
                r = client(srv.url, stream=stream, max_tokens=2).chat(MESSAGES)
                self.assertEqual(r.finish_reason, "length")
                self.assertEqual(r.completion_tokens, 2)
                self.assertEqual(r.text, "This is ")

    def test_extra_body_is_merged_into_the_request_when_given(self):
        srv = start_script(self, json_ok())
        extra = {"top_p": 0.5, "chat_template_kwargs": {"enable_thinking": False}, "temperature": 0.7}
        client(srv.url, stream=False, max_tokens=9, extra_body=extra).chat(MESSAGES)
        body = srv.requests[0]["body"]
        self.assertEqual(srv.requests[0]["path"], "/v1/chat/completions")
        self.assertEqual(body["top_p"], 0.5)
        self.assertEqual(body["chat_template_kwargs"], {"enable_thinking": False})
        self.assertEqual(body["temperature"], 0.7)  # extra_body wins over the config's temperature
        self.assertEqual(body["model"], "mock-model")
        self.assertEqual(body["messages"], MESSAGES)
        self.assertEqual(body["max_tokens"], 9)
        self.assertFalse(body["stream"])


class TestRetryAfter(unittest.TestCase):
    def test_retry_after_parses_seconds_when_a_number(self):
        self.assertEqual(eh._retry_after_s("5"), 5.0)
        self.assertEqual(eh._retry_after_s(" 0.25 "), 0.25)
        self.assertEqual(eh._retry_after_s("-3"), 0.0)

    def test_retry_after_parses_an_http_date_when_a_date(self):
        when = email.utils.formatdate(time.time() + 30, usegmt=True)
        self.assertAlmostEqual(eh._retry_after_s(when), 30, delta=2)
        past = email.utils.formatdate(time.time() - 3600, usegmt=True)
        self.assertEqual(eh._retry_after_s(past), 0.0)

    def test_retry_after_is_capped_when_too_long(self):
        self.assertEqual(eh._retry_after_s("100000"), eh.RETRY_AFTER_CAP_S)
        far = email.utils.formatdate(time.time() + 86400, usegmt=True)
        self.assertEqual(eh._retry_after_s(far), eh.RETRY_AFTER_CAP_S)

    def test_retry_after_is_none_when_absent_or_garbage(self):
        for value in (None, "", "soon", "Mon, 99 Foo 20x"):
            with self.subTest(value=value):
                self.assertIsNone(eh._retry_after_s(value))

    def test_429_is_retried_after_the_retry_after_wait_when_header_present(self):
        fast_retries(self)
        srv = start_script(self, status(429, {"Retry-After": "0.6"}), json_ok("later"))
        t0 = time.monotonic()
        r = client(srv.url, stream=False).chat(MESSAGES)
        elapsed = time.monotonic() - t0
        self.assertEqual(r.text, "later")
        self.assertEqual(r.attempts, 2)
        self.assertEqual(len(srv.requests), 2)
        self.assertGreaterEqual(srv.requests[1]["t"] - srv.requests[0]["t"], 0.6)
        self.assertGreaterEqual(elapsed, 0.6)
        self.assertGreaterEqual(r.wall_s, 0.6)
        self.assertLess(elapsed, 3.0)


class TestClassification(unittest.TestCase):
    def test_429_and_503_are_overload_and_retried_when_persistent(self):
        fast_retries(self)
        for code in ("429", "503"):
            with self.subTest(status=code):
                srv = start_mock(self, faults=((code, 1.0),), retry_after_s=0.01)
                with self.assertRaises(eh.ModelAPIError) as cm:
                    client(srv.url, max_retries=2).chat(MESSAGES)
                self.assertEqual(cm.exception.kind, "overload")
                self.assertEqual(cm.exception.status, int(code))
                self.assertEqual(cm.exception.attempts, 3)
                self.assertEqual(srv.stats()["counters"]["requests"], 3)

    def test_500_is_transient_and_retried_when_persistent(self):
        fast_retries(self)
        srv = start_mock(self, faults=(("500", 1.0),))
        with self.assertRaises(eh.ModelAPIError) as cm:
            client(srv.url, max_retries=2).chat(MESSAGES)
        self.assertEqual(cm.exception.kind, "transient")
        self.assertEqual(cm.exception.status, 500)
        self.assertEqual(cm.exception.attempts, 3)
        self.assertEqual(srv.stats()["counters"]["requests"], 3)

    def test_500_then_success_returns_the_result_when_transient(self):
        fast_retries(self)
        srv = start_script(self, status(500), json_ok("recovered"))
        r = client(srv.url, stream=False).chat(MESSAGES)
        self.assertEqual((r.text, r.attempts), ("recovered", 2))

    def test_4xx_is_fatal_and_not_retried_when_status_is_400_401_or_404(self):
        fast_retries(self)
        for code in (400, 401, 404):
            with self.subTest(status=code):
                srv = start_script(self, status(code), json_ok())
                with self.assertRaises(eh.ModelAPIError) as cm:
                    client(srv.url, max_retries=3).chat(MESSAGES)
                self.assertEqual(cm.exception.kind, "fatal")
                self.assertEqual(cm.exception.status, code)
                self.assertEqual(cm.exception.attempts, 1)
                self.assertEqual(len(srv.requests), 1)

    def test_mock_4xx_answers_are_fatal_when_request_is_bad_unauthorised_or_unrouted(self):
        srv = start_mock(self)
        keyed = start_mock(self, api_key="sk-the-right-key-000000")
        cases = [(400, srv.url, []), (401, keyed.url, MESSAGES), (404, srv.url.replace("/v1", "/v2"), MESSAGES)]
        for code, url, messages in cases:
            with self.subTest(status=code):
                with self.assertRaises(eh.ModelAPIError) as cm:
                    client(url, max_retries=3).chat(messages)
                self.assertEqual((cm.exception.kind, cm.exception.status, cm.exception.attempts), ("fatal", code, 1))

    def test_connection_refused_is_overload_and_gives_up_quickly_when_nothing_listens(self):
        url = "http://127.0.0.1:%d/v1" % dead_port()
        t0 = time.monotonic()
        with self.assertRaises(eh.ModelAPIError) as cm:
            client(url, max_retries=5).chat(MESSAGES)
        self.assertLess(time.monotonic() - t0, 3.0)
        self.assertEqual(cm.exception.kind, "overload")
        self.assertEqual(cm.exception.attempts, eh.REFUSED_RETRIES + 1)
        self.assertIn("refused", str(cm.exception))

    def test_overload_error_within_bound_when_server_never_answers(self):
        # the 0.4 s timeout takes 0.40-0.50 s here, up to 2.1 s with six busy processes on the 2 cores: the bound is
        # more than 3x that, and a client without the timeout would wait out the 30 s hang
        srv = start_mock(self, faults=(("hang", 1.0),), hang_s=30)
        for stream in (True, False):
            with self.subTest(stream=stream):
                t0 = time.monotonic()
                with self.assertRaises(eh.ModelAPIError) as cm:
                    client(srv.url, stream=stream, request_timeout_s=0.4, max_retries=0).chat(MESSAGES)
                self.assertLess(time.monotonic() - t0, 8.0)
                self.assertEqual(cm.exception.kind, "overload")
                self.assertIn("timed out", str(cm.exception))

    def test_overload_error_within_bound_when_stream_trickles_keepalive_comments(self):
        # (bound as above: measured up to 2.1 s under load; without the deadline the 30 s of comments)
        srv = start_script(self, drip(b": keep-alive\n\n", 0.05, 30.0, stream=True))
        t0 = time.monotonic()
        with self.assertRaises(eh.ModelAPIError) as cm:
            client(srv.url, stream=True, request_timeout_s=0.4, max_retries=0).chat(MESSAGES)
        self.assertLess(time.monotonic() - t0, 8.0)
        self.assertEqual(cm.exception.kind, "overload")

    def test_overload_error_within_bound_when_non_streaming_body_drips(self):
        # Regression (fixed): request_timeout_s is only a per-socket-read timeout on the non-streaming path (_read_json calls
        # resp.read() with no overall deadline), so a server dripping one byte every 0.1 s holds the request far
        # past request_timeout_s; the streaming path has a deadline check. The drip lasts 30 s; the 0.3 s deadline
        # takes 0.30-0.38 s here, up to 2.0 s with six busy processes on the 2 cores: the bound is more than 3x that.
        srv = start_script(self, drip(b" ", 0.1, 30.0, stream=False))
        t0 = time.monotonic()
        with self.assertRaises(eh.ModelAPIError):
            client(srv.url, stream=False, request_timeout_s=0.3, max_retries=0).chat(MESSAGES)
        self.assertLess(time.monotonic() - t0, 8.0)


class TestOutageRace(unittest.TestCase):
    def test_a_refused_request_keeps_retrying_past_its_retries_whatever_others_got(self):
        """A refused connection is the endpoint's trouble, never the request's: answers to other requests (those in
        flight when the server went down, or sent just after it came back) land around this request's attempts,
        and it retries on until its own attempt gets through (the outage budget bounds it). The answers are made
        by the attempt itself (a fake attempt: thread timing under load cannot be produced on demand)."""
        fast_retries(self)
        health = eh._EndpointHealth()
        health.success()  # the endpoint had answered before
        c = eh.ModelClient(eh.ClientConfig(base_url="http://127.0.0.1:9/v1", model="m", max_retries=1),
                           health=health)
        calls = []

        def attempt():
            calls.append(health.successes)
            if len(calls) < 4:
                health.success()  # another request's answer, between this attempt and the next
                raise eh.ModelAPIError("connection refused", kind="overload", error_class="connection",
                                       refused=True)
            return eh.CompletionsResult(choices=())
        res = c._with_retries(attempt)
        self.assertEqual((res.attempts, calls), (4, [1, 2, 3, 4]))

    def test_a_request_that_fails_while_the_endpoint_answers_others_gives_up_after_its_retries(self):
        fast_retries(self)
        health = eh._EndpointHealth()
        health.success()
        c = eh.ModelClient(eh.ClientConfig(base_url="http://127.0.0.1:9/v1", model="m", max_retries=1),
                           health=health)
        calls = []

        def attempt():
            calls.append(1)
            health.success()  # others keep being answered, before and after each of this request's attempts
            raise eh.ModelAPIError("HTTP 500", kind="transient", error_class="server_error", status=500)
        with self.assertRaises(eh.ModelAPIError):
            c._with_retries(attempt)
        self.assertEqual(len(calls), 2)


class TestRefusedUnderLoad(unittest.TestCase):
    """A 429 is the endpoint's load while it refuses other requests too (issue 54: a binding quota without headers
    cost samples at --max-retries), and a request's own trouble when it alone is refused while others get answers."""

    def _server(self, refuse):
        """A recording server answering 429 (no Retry-After) to request i when ``refuse(i, body)``, 200 otherwise."""
        def respond(h):
            with h.server.lock:
                i = len(h.server.requests) - 1
                body = h.server.requests[-1]["body"]
            (status(429) if refuse(i, body) else json_ok())(h)
        return start_script(self, respond)

    def test_a_request_refused_past_its_retries_by_a_quota_others_meet_too_completes(self):
        fast_retries(self)
        srv = self._server(lambda i, body: i % 4 != 3)  # three in four refused, whoever sends them
        health = eh._EndpointHealth()
        health.success()
        results, errors = [], []

        def work(k):
            try:
                results.append(client(srv.url, stream=False, max_retries=1, health=health).chat(MESSAGES))
            except eh.ModelAPIError as exc:
                errors.append(exc)
        self.assertEqual(run_threads(work, 6, 60), [])
        self.assertEqual((len(results), errors), (6, []))
        # the quota's refusals were met: most requests were refused more than --max-retries allows
        self.assertGreater(max(r.attempts for r in results), 2)
        self.assertGreaterEqual(health.refusals, 3 * 6 - 3)

    def test_a_request_refused_alone_while_others_are_answered_gives_up_after_its_retries(self):
        fast_retries(self, 0.1)  # (others make SHED_ALONE attempts within its retries, on a loaded machine too)
        srv = self._server(lambda i, body: "TOO LARGE" in json.dumps(body))  # a request too large for the quota
        health = eh._EndpointHealth()
        health.success()
        stop = threading.Event()

        def others(k):
            while not stop.is_set():
                client(srv.url, stream=False, max_retries=1, health=health).chat(MESSAGES)
        background = [threading.Thread(target=others, args=(k,), daemon=True) for k in range(2)]
        for t in background:
            t.start()
        self.addCleanup(stop.set)
        cancel = threading.Event()  # (a request that retried for ever would end in _Cancelled, not the error)
        timer = threading.Timer(30.0, cancel.set)
        timer.start()
        self.addCleanup(timer.cancel)
        with self.assertRaises(eh.ModelAPIError) as cm:
            client(srv.url, stream=False, max_retries=2, health=health, cancel=cancel).chat(
                [{"role": "user", "content": "TOO LARGE"}])
        stop.set()
        # past its 2 retries, once the others' attempts (SHED_ALONE of them at least, none refused) say it is alone
        # (a request retried for ever ends in _Cancelled at 30 s, not this error; how many attempts it took before
        # the two others made SHED_ALONE depends on the machine's load: 7 on a loaded CI run, so a loose bound)
        self.assertEqual(cm.exception.status, 429)
        self.assertGreaterEqual(cm.exception.attempts, 3)
        self.assertLessEqual(cm.exception.attempts, 12)
        self.assertEqual(health.refusals, cm.exception.attempts)


class TestMalformed(unittest.TestCase):
    def test_malformed_sse_is_retried_when_the_next_attempt_is_good(self):
        fast_retries(self)
        srv = start_script(self, sse(b'data: {"choices": [{"delta": {"content": \n\n'), good_sse("fine"))
        r = client(srv.url, stream=True).chat(MESSAGES)
        self.assertEqual((r.text, r.attempts), ("fine", 2))

    def test_truncated_stream_is_retried_when_the_next_attempt_is_good(self):
        fast_retries(self)
        part = {"choices": [{"index": 0, "delta": {"content": "half"}, "finish_reason": None}]}
        srv = start_script(self, sse(b"data: " + json.dumps(part).encode() + b"\n\n"), good_sse("whole"))
        r = client(srv.url, stream=True).chat(MESSAGES)
        self.assertEqual((r.text, r.attempts), ("whole", 2))

    def test_error_is_fatal_after_max_retries_when_always_malformed(self):
        fast_retries(self)
        for stream in (True, False):
            with self.subTest(stream=stream):
                srv = start_mock(self, faults=(("malformed", 1.0),))
                with self.assertRaises(eh.ModelAPIError) as cm:
                    client(srv.url, stream=stream, max_retries=2).chat(MESSAGES)
                self.assertEqual(cm.exception.kind, "fatal")
                self.assertEqual(cm.exception.attempts, 3)
                self.assertEqual(srv.stats()["counters"]["requests"], 3)

    def test_truncated_stream_errors_after_max_retries_when_always_truncated(self):
        fast_retries(self)
        srv = start_mock(self, faults=(("truncate", 1.0),))
        with self.assertRaises(eh.ModelAPIError) as cm:
            client(srv.url, stream=True, max_retries=2).chat(MESSAGES)
        self.assertEqual(cm.exception.attempts, 3)
        self.assertIn(cm.exception.kind, ("overload", "fatal"))

    def test_wrong_shape_sse_event_raises_model_api_error_when_choices_are_not_objects(self):
        # Regression (fixed): _read_stream only guards json.loads and "chunk is a dict"; a well-formed JSON event of the wrong shape
        # ({"choices": ["x"]}, or a "delta" that is a string) raises AttributeError out of chat(), which is neither
        # retried nor a ModelAPIError, so one odd server response escapes the client's error contract.
        fast_retries(self)
        srv = start_script(self, sse(b'data: {"choices": ["x"]}\n\n', b"data: [DONE]\n\n"))
        with self.assertRaises(eh.ModelAPIError):
            client(srv.url, stream=True, max_retries=1).chat(MESSAGES)

    def test_usage_is_estimated_when_completion_tokens_is_not_a_number(self):
        # Regression: {"completion_tokens": "n/a"} used to raise ValueError out of chat(). A bad usage field must not
        # cost the sample: the answer is kept and the token count is estimated.
        body = {"choices": [{"message": {"content": "hi there"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": "n/a"}}
        srv = start_script(self, status(200, body=json.dumps(body).encode()))
        res = client(srv.url, stream=False, max_retries=0).chat(MESSAGES)
        self.assertEqual(res.text, "hi there")
        self.assertTrue(res.usage_estimated)
        self.assertGreater(res.completion_tokens, 0)

    def test_list_content_parts_are_joined_when_the_server_sends_parts(self):
        body = {"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                             "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
        srv = start_script(self, status(200, body=json.dumps(body).encode()))
        self.assertEqual(client(srv.url, stream=False, max_retries=0).chat(MESSAGES).text, "ab")

    def test_every_chat_returns_or_raises_model_api_error_when_mock_injects_all_faults(self):
        fast_retries(self)
        rows = qa_rows(40)
        faults = eh.parse_faults("429=0.3,503=0.1,reset=0.1,malformed=0.1,truncate=0.1,500=0.05")
        srv = start_mock(self, oracle_rows=rows, faults=faults, retry_after_s=0.05, seed=11)
        clients = [client(srv.url, stream=True, max_retries=3, request_timeout_s=5),
                   client(srv.url, stream=False, max_retries=3, request_timeout_s=5)]
        outcomes = {}

        def worker(i):
            for j in range(i, 40, 8):
                try:
                    outcomes[j] = clients[j % 2].chat([{"role": "user", "content": rows[j]["prompt"]}])
                except eh.ModelAPIError as exc:
                    outcomes[j] = exc
                except BaseException as exc:  # anything else is the failure this test looks for
                    outcomes[j] = ("unexpected", repr(exc))

        self.assertEqual(run_threads(worker, 8, timeout_s=25), [], "a chat hung")
        self.assertEqual(sorted(outcomes), list(range(40)))
        unexpected = [o for o in outcomes.values() if isinstance(o, tuple)]
        self.assertEqual(unexpected, [])
        ok = [o for o in outcomes.values() if isinstance(o, eh.ChatResult)]
        errors = [o for o in outcomes.values() if isinstance(o, eh.ModelAPIError)]
        self.assertTrue(ok and errors, "expected both successes and give-ups, got %d ok" % len(ok))
        self.assertTrue(all(r.text for r in ok))
        self.assertTrue(any(r.attempts > 1 for r in ok))
        self.assertTrue(all(e.kind in ("overload", "transient", "fatal") for e in errors))
        self.assertTrue(all(e.attempts == 4 for e in errors))
        counters = srv.stats()["counters"]
        for kind in ("429", "503", "reset", "malformed", "truncate", "500"):
            self.assertGreater(counters.get("fault_" + kind, 0), 0, kind)


class TestSecrets(unittest.TestCase):
    KEY = "sk-proj-" + "Zq7w" * 10 + "Xy91Lm"

    def setUp(self):
        env = mock.patch.dict(os.environ, {"OPENAI_API_KEY": self.KEY})
        env.start()
        self.addCleanup(env.stop)
        self.addCleanup(self._forget_key)

    def _forget_key(self):
        with eh._secrets_lock:
            if self.KEY in eh._secrets:
                eh._secrets.remove(self.KEY)

    def test_error_message_has_no_key_or_fragment_when_server_echoes_a_wrong_key(self):
        srv = start_mock(self, api_key="sk-proj-the-RIGHT-key-is-different-123456")
        with self.assertRaises(eh.ModelAPIError) as cm:
            client(srv.url).chat(MESSAGES)
        err = cm.exception
        self.assertEqual((err.kind, err.status, err.attempts), ("fatal", 401, 1))
        for text in (str(err), repr(err), " ".join(map(str, err.args))):
            self.assertIn("401", text)
            for fragment in (self.KEY, self.KEY[:8], self.KEY[-6:]):
                self.assertNotIn(fragment, text)

    def test_a_key_echoed_masked_is_scrubbed_by_its_head_or_its_tail(self):
        eh._register_secret(self.KEY)  # KEY[:8] is "sk-proj-", KEY[-6:] "Xy91Lm"
        self.assertEqual(eh._redact("Incorrect API key provided: sk-proj-Zq7w************91Lm. See docs."),
                         "Incorrect API key provided: [REDACTED] See docs.")
        self.assertEqual(eh._redact("key ...Xy91Lm rejected"), "key [REDACTED] rejected")
        self.assertEqual(eh._redact("key sk-other-Zq7w rejected"), "key sk-other-Zq7w rejected")

    def test_authorization_header_is_sent_when_key_is_set(self):
        srv = start_script(self, json_ok())
        client(srv.url, stream=False).chat(MESSAGES)
        headers = {k.lower(): v for k, v in srv.requests[0]["headers"].items()}
        self.assertEqual(headers.get("authorization"), "Bearer " + self.KEY)

    def test_no_authorization_header_when_key_is_unset(self):
        del os.environ["OPENAI_API_KEY"]
        srv = start_script(self, json_ok())
        client(srv.url, stream=False).chat(MESSAGES)
        self.assertNotIn("authorization", {k.lower() for k in srv.requests[0]["headers"]})


class TestProxy(unittest.TestCase):
    def setUp(self):
        env = mock.patch.dict(os.environ)
        env.start()
        self.addCleanup(env.stop)
        for var in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                    "NO_PROXY"):
            os.environ.pop(var, None)

    def test_client_reaches_loopback_mock_when_a_dead_proxy_is_configured(self):
        srv = start_mock(self)
        dead = "http://127.0.0.1:%d" % dead_port()
        os.environ.update({"http_proxy": dead, "https_proxy": dead, "HTTP_PROXY": dead})
        self.assertEqual(client(srv.url, use_proxy=False).chat(MESSAGES).text, MOCK_TEXT)
        # the control: a client that honours the environment does go through the dead proxy
        with self.assertRaises(eh.ModelAPIError):
            client(srv.url, use_proxy=True).chat(MESSAGES)
        # and exclude_from_proxy makes even a proxy-honouring client bypass it for that host
        eh.exclude_from_proxy([srv.url])
        self.assertEqual(client(srv.url, use_proxy=True).chat(MESSAGES).text, MOCK_TEXT)

    def test_exclude_from_proxy_appends_host_to_both_variables_when_entries_exist(self):
        os.environ["NO_PROXY"] = "example.com, .corp"
        os.environ["no_proxy"] = "10.0.0.1"
        added = eh.exclude_from_proxy(["http://127.0.0.1:8000/v1", "http://localhost:9/v1"])
        self.assertEqual(added, ["127.0.0.1", "localhost"])
        self.assertEqual(os.environ["NO_PROXY"], "example.com,.corp,127.0.0.1,localhost")
        self.assertEqual(os.environ["no_proxy"], "10.0.0.1,127.0.0.1,localhost")

    def test_exclude_from_proxy_does_not_duplicate_when_called_twice_or_host_present(self):
        os.environ["no_proxy"] = "127.0.0.1"
        eh.exclude_from_proxy(["http://127.0.0.1:8000/v1"])
        eh.exclude_from_proxy(["http://127.0.0.1:8001/v1", "http://127.0.0.1:8002/v1"])
        self.assertEqual(os.environ["NO_PROXY"], "127.0.0.1")
        self.assertEqual(os.environ["no_proxy"], "127.0.0.1")


class TestGateInterplay(unittest.TestCase):
    def test_in_flight_never_exceeds_the_limit_when_chats_share_a_fixed_gate(self):
        srv = start_mock(self, decode_tok_s=100)  # 5 tokens: ~50 ms per request
        gate = eh.AdaptiveGate(algorithm=eh.FixedLimit(2))
        c = client(srv.url, gate=gate)
        results = []

        def worker(i):
            for _ in range(2):
                results.append(c.chat(MESSAGES).text)

        self.assertEqual(run_threads(worker, 8, timeout_s=15), [])
        self.assertEqual(results, [MOCK_TEXT] * 16)
        self.assertEqual(srv.stats()["max_active"], 2)
        self.assertEqual(gate.in_flight, 0)

    def test_a_reset_before_any_response_is_turned_away_and_one_mid_stream_pauses(self):
        fast_retries(self)
        for stream, cause, drains in ((False, "turned_away", False), (True, "overload", True)):
            srv = start_mock(self, faults=(("reset", 1.0),), decode_tok_s=1000)
            gate = eh.AdaptiveGate(16, 1, 64)
            events = []
            gate.on_event = events.append
            permits = [gate.try_acquire() for _ in range(9)]  # the failing request meets 10 in flight
            with self.assertRaises(eh.ModelAPIError):
                client(srv.url, gate=gate, max_retries=0, stream=stream).chat(MESSAGES)
            for p in permits:
                gate.release(p, "ignore")
            self.assertEqual([e["cause"] for e in events if e["type"] == "limit"], [cause], stream)
            self.assertEqual(any(e["type"] == "drain" for e in events), drains, stream)
            self.assertEqual(gate.limit, 9, stream)  # just under the load it met (both back at once)

    def test_gate_permits_are_returned_when_attempts_fail(self):
        fast_retries(self)
        srv = start_mock(self, faults=(("503", 1.0),), retry_after_s=0.01)
        gate = eh.AdaptiveGate(algorithm=eh.FixedLimit(2))
        with self.assertRaises(eh.ModelAPIError):
            client(srv.url, gate=gate, max_retries=2).chat(MESSAGES)
        self.assertEqual(gate.in_flight, 0)

    def test_chat_raises_cancelled_promptly_when_cancel_is_set_during_a_retry_wait(self):
        srv = start_mock(self, faults=(("503", 1.0),), retry_after_s=30)  # the retry wait would be 30 s
        cancel = threading.Event()
        gate = eh.AdaptiveGate(algorithm=eh.FixedLimit(2))
        c = client(srv.url, cancel=cancel, gate=gate)
        outcome = []

        def worker(_i):
            try:
                c.chat(MESSAGES)
                outcome.append("returned")
            except eh._Cancelled:
                outcome.append("cancelled")
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                outcome.append(repr(exc))

        thread = threading.Thread(target=worker, args=(0,), daemon=True)
        thread.start()
        self.addCleanup(thread.join, 5)
        self.assertTrue(wait_until(lambda: srv.stats()["counters"].get("fault_503", 0) >= 1 and gate.in_flight == 0,
                                   timeout_s=30))
        t0 = time.monotonic()
        cancel.set()
        thread.join(10)
        self.assertFalse(thread.is_alive(), "chat did not stop when cancelled")
        # at most 0.01 s here, with six busy processes on the 2 cores too: the bound is far above 3x that and far
        # below the 30 s wait it cuts short
        self.assertLess(time.monotonic() - t0, 5.0)
        self.assertEqual(outcome, ["cancelled"])
        self.assertEqual(srv.stats()["counters"]["requests"], 1)


class TestPreflight(unittest.TestCase):
    """probe_endpoint against the mock dressed as each server kind (its /v1/models, /props, /info as the real
    servers lay them out; llama.cpp's as recorded from llama-server b1-0c1e570)."""

    def probe(self, srv, model="m", **kw):
        return eh.probe_endpoint(eh.ClientConfig(base_url=srv.url, model=model), **kw)

    def test_kind_and_context_are_read_where_each_server_states_them(self):
        cases = [("vllm", 4096, "vLLM", 4096, "max_model_len (/models)"),
                 ("sglang", 8192, "SGLang", 8192, "max_model_len (/models)"),
                 ("llama.cpp", 512, "llama.cpp", 512, "n_ctx (/props)"),
                 ("tgi", 2048, "TGI", 2048, "max_total_tokens (/info)"),
                 ("openai", 0, "OpenAI", None, None),
                 ("mock", 0, "evalharness mock", None, None)]
        for kind, ctx, want_kind, want_ctx, where in cases:
            with self.subTest(kind=kind):
                info = self.probe(start_mock(self, server_kind=kind, context_len=ctx, served=("other",)))
                self.assertEqual((info["kind"], info["context_len"], info["context_from"]),
                                 (want_kind, want_ctx, where))
                self.assertEqual(info["models"], ["m", "other"])
                self.assertTrue(info["model_checked"])

    def test_a_model_not_listed_is_refused_naming_the_served_ones_unless_the_check_is_off(self):
        srv = start_mock(self, model="served-a", served=("served-b",))
        with self.assertRaises(eh.ConfigError) as cm:
            self.probe(srv, model="no-such-model")
        self.assertIn("--model 'no-such-model' is not served by %s; it serves: served-a, served-b" % srv.url,
                      str(cm.exception))
        self.assertIn("--no-model-check", str(cm.exception))
        info = self.probe(srv, model="no-such-model", check_model=False)
        self.assertFalse(info["model_checked"])
        self.assertEqual(srv.stats()["counters"].get("requests", 0), 0)  # no chat was sent for any of it

    def test_a_wrong_path_is_refused_when_models_and_chat_both_answer_404(self):
        srv = start_mock(self)
        with self.assertRaises(eh.ConfigError) as cm:
            eh.probe_endpoint(eh.ClientConfig(base_url=srv.url.replace("/v1", "/v2"), model="m"))
        self.assertIn("/v2/models and ", str(cm.exception))
        self.assertIn("the path of --base-url looks wrong", str(cm.exception))

    def test_a_server_without_a_model_list_passes_when_its_chat_answers(self):
        srv = start_mock(self, server_kind="nolist")
        info = self.probe(srv, model="anything")
        self.assertIsNone(info["models"])
        self.assertIn("lists no models", info["note"])
        self.assertEqual(srv.stats()["counters"]["requests"], 1)  # the one-token chat that proved the path

    def test_an_unreachable_endpoint_is_left_to_the_outage_rules(self):
        info = eh.probe_endpoint(eh.ClientConfig(base_url="http://127.0.0.1:%d/v1" % dead_port(), model="m"))
        self.assertIsNone(info["models"])
        self.assertIn("connection refused", info["note"])

    def test_a_refused_key_is_a_configuration_error_that_never_shows_the_key(self):
        srv = start_mock(self, api_key="sk-right-key-0000000000000000")
        key = "sk-wrong-key-preflight-1234567890"
        with mock.patch.dict(os.environ, {"PREFLIGHT_KEY": key}):
            with self.assertRaises(eh.ConfigError) as cm:
                eh.probe_endpoint(eh.ClientConfig(base_url=srv.url, model="m", api_key_env="PREFLIGHT_KEY"))
        self.assertIn("HTTP 401", str(cm.exception))
        self.assertNotIn(key, str(cm.exception))

    def test_odd_lists_ollama_tags_and_a_key_that_may_not_list(self):
        srv = start_mock(self, model="llama3:latest")
        self.assertTrue(self.probe(srv, model="llama3")["model_checked"])  # Ollama serves a bare name as :latest
        keyed = start_mock(self, api_key="sk-right-key-0000000000000000")
        info = eh.probe_endpoint(eh.ClientConfig(base_url=keyed.url, model="m"), check_model=False)
        self.assertIn("HTTP 401", info["note"])  # --no-model-check: the run's own calls decide

    def test_a_models_body_of_the_wrong_shape_is_no_list_not_a_crash(self):
        class Odd(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = b'{"data": 5}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass
        httpd = http.server.HTTPServer(("127.0.0.1", 0), Odd)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        self.addCleanup(httpd.server_close)
        self.addCleanup(httpd.shutdown)
        info = eh.probe_endpoint(eh.ClientConfig(base_url="http://127.0.0.1:%d/v1" % httpd.server_port, model="m"))
        self.assertEqual(info["models"], [])
        self.assertFalse(info["model_checked"])

    def test_the_reply_model_field_is_kept_streamed_or_not(self):
        srv = start_mock(self, reply_model="org/served-name")
        for stream in (True, False):
            c = eh.ModelClient(eh.ClientConfig(base_url=srv.url, model="m", stream=stream, max_retries=0))
            with self.assertLogs("evalharness", "WARNING") as logs:
                self.assertEqual([c.chat(MESSAGES).model for _ in range(3)], ["org/served-name"] * 3)
            self.assertEqual(len(logs.output), 1, logs.output)  # flagged once, not per reply
            self.assertIn("name the model 'org/served-name', not 'm'", logs.output[0])

    def test_a_base_url_ending_in_chat_completions_means_its_base(self):
        self.assertEqual(eh._normalize_base_url("http://h:8000/v1/chat/completions/"), "http://h:8000/v1")
        self.assertEqual(eh._normalize_base_url("http://h:8000/chat/completions"), "http://h:8000/v1")

    def test_the_context_warning_counts_requests_over_the_context_once(self):
        info = {"context_len": 100, "context_from": "max_model_len (/models)", "kind": "vLLM"}
        text = eh._context_warning(info, 90, ["x" * 20, "x" * 60, "short"])  # ~5, ~15, ~2 tokens
        self.assertIn("for 1 of 3 requests", text)
        self.assertIn("context of 100 tokens (vLLM max_model_len (/models))", text)
        self.assertIsNone(eh._context_warning(info, 50, ["x" * 20]))
        self.assertIsNone(eh._context_warning(info, None, ["x" * 2000]))
        self.assertIsNone(eh._context_warning({"context_len": None}, 5000, ["x"]))


class _OneAtATimeHandler(http.server.BaseHTTPRequestHandler):
    """A chat completion after ``service_s``, one request at a time (see _SmallBacklogServer): 200 take 4 s."""

    protocol_version = "HTTP/1.1"
    service_s = 0.02  # (at 10 ms a request a whole run lasts as long as the two 1 s SYN retries a burst can cost)

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(self.service_s)
        self._send({"id": "x", "object": "chat.completion", "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "7"},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}})

    def _send(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


class _SmallBacklogServer(http.server.HTTPServer):
    """Python's plain http.server: one request at a time, an accept queue of 5. The kernel turns away the
    connections that do not fit (a reset about a second after they were opened, when the SYN is retried)."""

    request_queue_size = 5


class TestSmallBacklog(unittest.TestCase):
    def run_wall(self, url, dataset, out, *args):
        res = run_cli(["run", "--dataset", dataset, "--model", "m", "--base-url", url, "--out", out,
                       "--no-progress"] + list(args), timeout=300)
        self.assertEqual(res.returncode, 0, res.stderr[-2000:])
        samples = read_samples(out)
        self.assertEqual(len(samples), 200)
        self.assertTrue(all(s["status"] == "ok" for s in samples))
        return max(s["finished_at"] for s in samples) - min(s["started_at"] for s in samples)

    def test_an_adaptive_run_loses_only_syn_retries_to_the_best_fixed_one_and_never_drains_when_the_backlog_is_small(
            self):
        # before: the resets read as a collapse (x0.7 and a 30 s drain pause, twice): 60-94 s against ~1 s
        server = _SmallBacklogServer(("127.0.0.1", 0), _OneAtATimeHandler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        url = "http://127.0.0.1:%d/v1" % server.server_address[1]
        tmp = tempdir(self)
        dataset = write_jsonl(os.path.join(tmp, "q.jsonl"), qa_rows(200))
        fixed = {c: self.run_wall(url, dataset, os.path.join(tmp, "fixed%d" % c), "--fixed-concurrency", str(c))
                 for c in (1, 2, 4)}
        out = os.path.join(tmp, "adaptive")
        wall = self.run_wall(url, dataset, out)
        with open(os.path.join(out, "events.jsonl")) as fh:
            events = [json.loads(line) for line in fh]
        # (whether the kernel resets a connection or only retries its SYN a second later varies: either way no
        # pause; the unit tests in test_gates show a reset's own handling)
        self.assertEqual([e for e in events if e["type"].startswith("drain")], [])
        # over the best fixed run (4.2-4.7 s here), the adaptive one took 0.1-3.1 s more, idle and with six busy
        # processes on the 2 cores: what the kernel's SYN retries (1 s, then 3 s) cost the bursts past the accept
        # queue, which no limit avoids on its first burst. The bound is 3x+ that; a reset read as a collapse costs a
        # 30 s drain pause (twice: 60-94 s). (It was 2x the best fixed run: 8.4-9.4 s, met at 7.75 s under load.)
        self.assertLessEqual(wall, min(fixed.values()) + 10.0, (wall, fixed))


class TestServerMetricsRuns(unittest.TestCase):
    """--server-metrics against the mock with slots, whose /metrics (for the vllm, sglang and llama.cpp kinds)
    says how many requests run and wait."""

    def run_mock(self, *args, **config):
        mock_server = start_mock(self, decode_tok_s=400.0, reasoning_tokens=30, **config)
        tmp = tempdir(self)
        dataset = write_jsonl(os.path.join(tmp, "q.jsonl"), qa_rows(240))
        out = os.path.join(tmp, "out")
        res = run_cli(["run", "--dataset", dataset, "--model", "m", "--base-url", mock_server.url, "--out", out,
                       "--no-progress", "--no-stream"] + list(args), timeout=300)
        return res, out

    def test_the_gate_holds_near_the_slots_the_server_runs(self):
        for kind in ("llama.cpp", "vllm", "sglang"):
            res, out = self.run_mock("--server-metrics", "on", slots=4, server_kind=kind)
            self.assertEqual(res.returncode, 0, res.stderr[-2000:])
            with open(os.path.join(out, "run.json")) as fh:
                run = json.load(fh)
            self.assertEqual(run["concurrency"]["server_metrics"], kind)
            # 4 slots; unstreamed: the metrics alone. Without them (--server-metrics off) this run finds 15-19. With
            # them 4-6 idle; 7 met twice under CI's load (three suites at once on 2 cores): a client slow to read its
            # answers leaves the server's queue empty, and the hold grows to keep more on their way (on_server)
            with open(os.path.join(out, "events.jsonl")) as fh:
                held = [json.loads(line) for line in fh if '"server_queue"' in line]
            self.assertTrue(held, kind)
            # (the server's readings that moved the limit, and ours in flight then: what to read when this fails)
            self.assertLessEqual(run["discovered_limit"], 8, (kind, [(e["limit"], e["running"], e["waiting"],
                                                                      e["in_flight"]) for e in held]))

    def test_on_requires_metrics_and_auto_goes_on_without(self):
        res, out = self.run_mock("--server-metrics", "on")
        self.assertEqual(res.returncode, 2)
        self.assertEqual(len(res.stderr.strip().splitlines()), 1, res.stderr)
        self.assertIn("/metrics", res.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "samples.jsonl")) and read_samples(out))  # none sent
        res, out = self.run_mock()
        self.assertEqual(res.returncode, 0, res.stderr[-2000:])
        with open(os.path.join(out, "run.json")) as fh:
            self.assertIsNone(json.load(fh)["concurrency"]["server_metrics"])


if __name__ == "__main__":
    unittest.main()
