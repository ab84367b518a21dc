"""Shared helpers for the evalharness tests: temp dirs, datasets, an in-process mock server, CLI subprocesses.

Everything a helper starts is stopped in the test's cleanup, so a test leaves no thread, process or file behind.
"""
import atexit
import json
import re
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import evalharness as eh  # noqa: E402

MODULE = os.path.join(ROOT, "evalharness.py")
CLI = os.path.join(ROOT, "tests", "cli.py")  # `python CLI ARGS` is `python MODULE ARGS` with cached bytecode


_PROCESS_DIR = []


def process_dir() -> str:
    """A temp folder for this test process (removed when it exits): for files a subprocess writes by itself."""
    if not _PROCESS_DIR:
        _PROCESS_DIR.append(tempfile.mkdtemp(prefix="evalharness-test-process-"))
        atexit.register(shutil.rmtree, _PROCESS_DIR[0], True)
    return _PROCESS_DIR[0]


def tempdir(test: unittest.TestCase) -> str:
    path = tempfile.mkdtemp(prefix="evalharness-test-")
    test.addCleanup(shutil.rmtree, path, True)
    return path


def write_jsonl(path: str, rows) -> str:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def qa_rows(n: int, prefix: str = "q"):
    """n simple numeric rows with known answers, across three categories."""
    cats = ("alpha", "beta", "gamma")
    return [{"id": "%s%d" % (prefix, i), "prompt": "What is %d plus %d?" % (i, i + 1), "answer": str(2 * i + 1),
             "scorer": "numeric", "category": cats[i % 3]} for i in range(n)]


def start_mock(test: unittest.TestCase, oracle_rows=None, swe=None, tools=None, ifeval=None,
               **config) -> "eh.MockServer":
    """Start a MockServer on 127.0.0.1:0 (stopped in cleanup); oracle_rows answer from those rows; ``swe`` (a
    SWEDataset) makes it an agent on those instances (policy: config swe_policy). It serves the model "m" (the
    name the tests run with) unless ``model`` says otherwise: the run's pre-flight checks that name."""
    config.setdefault("model", "m")
    oracle = eh.Dataset(None, rows=oracle_rows, name="oracle").validate() if oracle_rows else None
    server = eh.MockServer(eh.MockConfig(**config), oracle=oracle, swe=swe, tools=tools, ifeval=ifeval).start()
    test.addCleanup(server.close)
    return server


def clean_env(**extra) -> dict:
    """The current environment without proxies or keys that could leak into a test, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "openai_api_key",
                                "openai_base_url")}
    env["EVALHARNESS_PROGRESS_S"] = env.get("EVALHARNESS_PROGRESS_S", "1")
    # discovered limits go to a per-process temp file, never to the user's ~/.cache
    env["EVALHARNESS_LIMITS_FILE"] = os.path.join(process_dir(), "limits.json")
    env.update(extra)
    return env


def run_cli(args, *, env=None, timeout=120, cwd=None, python=None, stamped=False) -> subprocess.CompletedProcess:
    """Run ``python evalharness.py ARGS`` in a subprocess; returns the CompletedProcess (text mode). Its stderr (a
    pipe: each line starts with a UTC timestamp) comes without the timestamps unless ``stamped``."""
    res = subprocess.run([python or sys.executable, CLI] + list(args), env=env or clean_env(), cwd=cwd or ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout)
    if not stamped:
        res.stderr = unstamped(res.stderr)
    return res


def read_samples(run_dir: str):
    with open(os.path.join(run_dir, "samples.jsonl"), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def whole_samples(run_dir: str):
    """read_samples of a run still writing: its whole lines only (the last may be half written)."""
    with open(os.path.join(run_dir, "samples.jsonl"), "rb") as fh:
        data = fh.read()
    return [json.loads(line) for line in data[:data.rfind(b"\n") + 1].splitlines() if line.strip()]


def tree_text(run_dir: str) -> str:
    """Every file of a run directory concatenated (for secret scans)."""
    out = []
    for base, _dirs, files in os.walk(run_dir):
        for name in files:
            with open(os.path.join(base, name), "rb") as fh:
                out.append(fh.read().decode("utf-8", "replace"))
    return "\n".join(out)


def dead_port() -> int:
    """A loopback port where nothing listens (bound then closed, never listened on)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_until(predicate, timeout_s: float = 5.0) -> bool:
    """Poll ``predicate`` until it is true or ``timeout_s`` passes; return its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return bool(predicate())


def kill_9_after(test: unittest.TestCase, args, run_dir: str, lines: int, timeout_s: float) -> None:
    """Start ``args`` (a run writing RUN_DIR/samples.jsonl), SIGKILL it once the file has LINES whole lines (the
    test fails when that takes past TIMEOUT_S)."""
    proc = subprocess.Popen(args, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    test.addCleanup(lambda: proc.poll() is None and proc.kill())
    samples = os.path.join(run_dir, "samples.jsonl")

    def count():
        with open(samples, "rb") as fh:
            return fh.read().count(b"\n")
    test.assertTrue(wait_until(lambda: os.path.exists(samples) and count() >= lines, timeout_s),
                    "fewer than %d samples within %d s" % (lines, timeout_s))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def settled_counter(mock, name: str, quiet_s: float = 1.0, timeout_s: float = 30.0) -> int:
    """MOCK's counter NAME once it has stayed the same for QUIET_S: a request a killed client sent just before its
    SIGKILL may reach the mock's handler (which counts it) a moment after the kill returns."""
    last, since = mock.stats()["counters"].get(name, 0), time.monotonic()
    deadline = since + timeout_s
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.05)
        now = mock.stats()["counters"].get(name, 0)
        if now != last:
            last, since = now, time.monotonic()
    return last


def kill_9_then_resume(test: unittest.TestCase, args, run_dir: str, lines: int, ids, timeout_s: float) -> None:
    """kill_9_after, then the same command (run_cli of ``args[2:]``): every id of IDS once in samples.jsonl, and
    what finished before the kill kept first, not run again."""
    kill_9_after(test, args, run_dir, lines, timeout_s)
    kept = [r["id"] for r in read_samples(run_dir)]
    test.assertLess(len(kept), len(ids), "the run finished before the kill")
    res = run_cli(args[2:], timeout=max(120, timeout_s * 2))
    test.assertEqual(res.returncode, 0, res.stderr)
    got = [r["id"] for r in read_samples(run_dir)]
    test.assertEqual(sorted(got), sorted(ids))  # each once
    test.assertEqual(got[:len(kept)], kept)


STAMP_RE = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ "  # what starts every stderr line when stderr is no terminal


def unstamped(text: str) -> str:
    """stderr without the UTC timestamp that starts each of its lines when it is no terminal (a pipe)."""
    return re.sub(r"(?m)^" + STAMP_RE, "", text)


class ClassCtx:
    """Lets the helpers made for a TestCase (tempdir, start_mock, the test beds) register class-level cleanups from
    setUpClass: ``tempdir(ClassCtx(cls))``."""

    def __init__(self, cls):
        self.cls = cls

    def addCleanup(self, fn, *args, **kwargs):  # noqa: N802 - unittest's spelling
        self.cls.addClassCleanup(fn, *args, **kwargs)

    def fail(self, msg):
        raise AssertionError(msg)
