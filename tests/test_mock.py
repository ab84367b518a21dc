"""Mock model server: routes, capacity model, hard cap, oracle policy, fault specs and shutdown, over real loopback."""
import http.client
import json
import threading
import time
import unittest

from tests.support import eh, start_mock, wait_until


def request(server, method: str, path: str, body=None, timeout: float = 10.0):
    """One raw HTTP request to the mock; returns (status, headers dict, body bytes)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def chat_body(content: str = "hello", **extra):
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    body.update(extra)
    return body




def demo_items():
    return list(eh.Dataset(None, rows=eh.demo_dataset(), name="demo").validate().iter_items())


def oracle_answers(server, items):
    """Ask the mock every item (non-streaming) and return the reply texts in order."""
    c = eh.ModelClient(eh.ClientConfig(base_url=server.url, model="mock-model", stream=False, max_retries=0,
                                       request_timeout_s=10))
    return [c.chat(list(item.messages)).text for item in items]


def hanging_request(test, server):
    """Start a chat request in a thread that the mock holds (hang fault); return the thread and its outcome list."""
    outcome = []

    def run():
        try:
            outcome.append(request(server, "POST", "/v1/chat/completions", chat_body(), timeout=10)[0])
        except Exception as exc:  # noqa: BLE001 - the connection is dropped when the server closes
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    test.addCleanup(thread.join, 10)
    test.assertTrue(wait_until(lambda: server.stats()["active"] == 1), "the request never reached the mock")
    return thread, outcome


class TestRoutes(unittest.TestCase):
    def test_models_lists_the_configured_model_when_asked(self):
        srv = start_mock(self, model="unit-test-model")
        code, _headers, body = request(srv, "GET", "/v1/models")
        self.assertEqual(code, 200)
        self.assertEqual([m["id"] for m in json.loads(body)["data"]], ["unit-test-model"])

    def test_stats_counts_requests_and_completions_when_chats_were_served(self):
        srv = start_mock(self)
        for stream in (True, False):
            self.assertEqual(request(srv, "POST", "/v1/chat/completions", chat_body(stream=stream))[0], 200)
        code, _headers, body = request(srv, "GET", "/stats")
        self.assertEqual(code, 200)
        stats = json.loads(body)
        self.assertEqual(stats["active"], 0)
        self.assertEqual(stats["max_active"], 1)
        self.assertEqual(stats["counters"]["requests"], 2)
        self.assertEqual(stats["counters"]["completed"], 2)
        self.assertEqual(stats, srv.stats())

    def test_unknown_route_is_404_when_path_is_not_served(self):
        srv = start_mock(self)
        self.assertEqual(request(srv, "GET", "/v1/nothing")[0], 404)
        self.assertEqual(request(srv, "POST", "/v1/embeddings", chat_body())[0], 404)
        # /v1/completions is served (the log-likelihood kinds' toy model): a chat body there has no prompt
        self.assertEqual(request(srv, "POST", "/v1/completions", chat_body())[0], 400)


class _NotedWaits(threading.Event):
    """Stands in for the mock's closing event (set when it closes; its waits are how the mock spends a token's time)
    and notes every wait the mock asks of it, by the thread asking: the mock's own account of each request's time,
    each token's delay at the load it was decoded under, whatever a busy machine adds to the sleeps."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()  # guards asked
        self.asked = {}  # handler thread -> seconds asked

    def wait(self, timeout=None):
        if timeout is not None:
            with self.lock:
                thread = threading.current_thread()
                self.asked[thread] = self.asked.get(thread, 0.0) + timeout
        return super().wait(timeout)


class TestCapacity(unittest.TestCase):
    def run_streams(self, srv, n: int):
        """n concurrent streaming chats started together; returns the time the mock gave each, sorted."""
        c = eh.ModelClient(eh.ClientConfig(base_url=srv.url, model="mock-model", stream=True, max_retries=0,
                                           request_timeout_s=60))
        barrier = threading.Barrier(n)
        results = []

        def run():
            barrier.wait(30)
            results.append(c.chat([{"role": "user", "content": "go"}]))

        srv.state.closing.asked.clear()
        threads = [threading.Thread(target=run, daemon=True) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual([r.completion_tokens for r in results], [10] * n)
        return sorted(srv.state.closing.asked.values())

    def test_streams_slow_down_and_throughput_saturates_when_past_the_knee(self):
        # 10 tokens (5 reasoning + 5 answer) at 20 tok/s: 0.5 s a stream up to the knee of 4 streams, as many tokens
        # a second from each (4 streams, 4x the throughput), 2 s with 16 (each a quarter as fast: the same
        # throughput). Read from the time the mock gives each token, not from a wall clock that a busy machine
        # stretches (16 streams are 16 handler threads on 2 cores).
        srv = start_mock(self, decode_tok_s=20, knee=4, reasoning_tokens=5)
        srv.state.closing = _NotedWaits()
        for n in (1, 4):
            self.assertEqual([round(s, 6) for s in self.run_streams(srv, n)], [0.5] * n)
        slow = self.run_streams(srv, 16)
        self.assertEqual(srv.stats()["max_active"], 16)
        self.assertEqual(len(slow), 16)
        # each stream's tokens come at 1/20 s times the streams then running over 4: 2 s when all 16 overlap
        # throughout; the first and last tokens of a stream may overlap fewer (they start within ms of each other)
        self.assertLessEqual(slow[-1], 2.0 + 1e-6)
        self.assertGreater(sum(slow) / 16, 1.5)

    def test_extra_request_gets_overload_status_and_retry_after_when_past_the_hard_cap(self):
        for code, retry_after in ((429, 2), (503, 2), (429, 0)):  # (0: no Retry-After, as a gateway's cap)
            with self.subTest(overload_status=code, retry_after=retry_after):
                srv = start_mock(self, max_concurrency=1, overload_status=code, retry_after_s=retry_after,
                                 faults=(("hang", 1.0),))
                thread, outcome = hanging_request(self, srv)
                status, headers, body = request(srv, "POST", "/v1/chat/completions", chat_body("another"))
                self.assertEqual(status, code)
                self.assertEqual(headers.get("Retry-After"), "2" if retry_after else None)
                self.assertIn("capacity", json.loads(body)["error"]["message"])
                self.assertEqual(srv.stats()["counters"]["over_cap"], 1)
                srv.close()
                thread.join(5)
                self.assertFalse(thread.is_alive())


class TestOracle(unittest.TestCase):
    def test_answers_are_identical_when_seed_is_the_same(self):
        items = demo_items()
        rows = eh.demo_dataset()
        first = oracle_answers(start_mock(self, oracle_rows=rows, seed=5, skill=0.5), items)
        again = oracle_answers(start_mock(self, oracle_rows=rows, seed=5, skill=0.5), items)
        other = oracle_answers(start_mock(self, oracle_rows=rows, seed=6, skill=0.5), items)
        self.assertEqual(first, again)
        self.assertNotEqual(first, other)  # the seed does decide which answers are right

    def test_accuracy_is_near_skill_when_skill_is_0_8(self):
        items = demo_items()
        srv = start_mock(self, oracle_rows=eh.demo_dataset(), skill=0.8)
        scores = [eh.score_response(item, text)[0] for item, text in zip(items, oracle_answers(srv, items))]
        accuracy = sum(scores) / len(scores)
        self.assertEqual(len(scores), 42)
        self.assertGreaterEqual(accuracy, 0.6)
        self.assertLessEqual(accuracy, 0.95)

    def scores(self, skill: float):
        """{id: (score, answer)} of the mock's answer to every demo item, with that skill."""
        items = demo_items()
        answers = oracle_answers(start_mock(self, oracle_rows=eh.demo_dataset(), skill=skill), items)
        self.assertEqual((len(items), len(answers)), (42, 42))
        return {item.id: (eh.score_response(item, text)[0], text) for item, text in zip(items, answers)}

    def test_every_answer_scores_one_when_skill_is_1(self):
        got = self.scores(1.0)
        self.assertEqual({i: s for i, (s, _) in got.items() if s != 1.0}, {}, got)

    def test_every_answer_scores_zero_when_skill_is_0(self):
        got = self.scores(0.0)
        self.assertEqual({i: s for i, (s, _) in got.items() if s != 0.0}, {}, got)


class TestParseFaults(unittest.TestCase):
    def test_parse_faults_returns_pairs_when_spec_is_valid(self):
        self.assertEqual(eh.parse_faults(" 429=0.1, reset=0.05 ,"), (("429", 0.1), ("reset", 0.05)))
        self.assertEqual(eh.parse_faults(""), ())
        self.assertEqual(eh.parse_faults("hang=1"), (("hang", 1.0),))

    def test_parse_faults_raises_config_error_when_spec_is_bad(self):
        for spec in ("429", "429=", "429=abc", "teapot=0.1", "429=1.5", "500=-0.1", "503=nan", "reset=inf",
                     "429=0.6,503=0.6", "=0.1"):
            with self.subTest(spec=spec):
                with self.assertRaises(eh.ConfigError):
                    eh.parse_faults(spec)


class TestClose(unittest.TestCase):
    def test_close_returns_promptly_when_a_request_hangs(self):
        srv = start_mock(self, faults=(("hang", 1.0),))  # hang_s defaults to an hour
        thread, outcome = hanging_request(self, srv)
        t0 = time.monotonic()
        srv.close()
        self.assertLess(time.monotonic() - t0, 2.0)
        thread.join(3)
        self.assertFalse(thread.is_alive(), "the hung request was not released by close()")
        self.assertEqual(len(outcome), 1)
        srv.close()  # idempotent


if __name__ == "__main__":
    unittest.main()
