#!/usr/bin/env python3
"""Mutation check (issue 40): does the test suite notice when a documented behaviour breaks?

Each mutant below changes one line of evalharness.py (or of build_zipapp.sh, where the zipapp's version guard
lives) so that one documented behaviour no longer holds, then runs the test modules or classes that cover that
behaviour against the changed copy. A mutant is *killed* when a test fails, and *survives* when they all pass: a
survivor is a behaviour the suite does not pin down. The original text of each mutant must occur exactly once in
its file; when code moves or changes and it no longer does, the script stops before running anything and names
the mutant to update. The checkout is never modified: every mutant runs in its own temporary copy of the tree
(`python3 tests/run.py -q TARGETS` inside it), so this can run while you work.

Usage: python3 bench/mutants.py [--jobs 1] [--only NAME[,NAME...]] [--list] [--timeout 900] [--baseline] [--verbose]
  --list      the mutants, the behaviour each breaks and its tests; runs nothing
  --only      run these mutants only (repeatable, or comma-separated)
  --jobs N    mutants run at once (default 1: the suite itself uses threads, servers and Docker)
  --timeout   seconds for one mutant's tests; a mutant still running then is stopped and reported as a timeout
  --baseline  first run each mutant's tests on the unchanged copy: they must pass, or a kill means nothing
  --verbose   print the first failing test's traceback for each killed mutant (always for a broken one)
Prints one line per mutant as it finishes (killed: by which test; survived; timeout; broken) and a summary line.
Exit status: 0 when every mutant was killed, 1 when any survived, timed out or could not run, 2 on a usage error
or a mutant whose original text is not found exactly once.
Needs what the targets need: Docker for the SWE mutant, the pyenv Pythons (3.7 among them) for the version guard.
"""
import argparse
import collections
import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = "evalharness.py"

Mutant = collections.namedtuple("Mutant", "name breaks original replacement targets file")


def mutant(name, breaks, original, replacement, targets, file=MODULE):
    return Mutant(name, breaks, original, replacement, tuple(targets.split()), file)


# (name, the behaviour it breaks, the original text (found exactly once), its replacement, the test targets)
MUTANTS = (
    mutant("python37-guard",
           "the zipapp refuses Python < 3.8 with a clear message",
           "if sys.version_info < (3, 8):",
           "if sys.version_info < (3, 7):",
           "tests.test_packaging.TestZipapp.test_demo_runs_on_supported_pythons_and_37_is_refused",
           file="build_zipapp.sh"),
    mutant("429-not-retried",
           "429 is an overload: retried (after Retry-After) and cuts the adaptive limit",
           '((429, 429), "overload", "overload")',
           '((429, 429), "fatal", "overload")',
           "tests.test_client.TestRetryAfter tests.test_client.TestClassification"),
    mutant("5xx-kept-on-resume",
           "a sample failed with a 5xx is the server's trouble: a resume runs it again",
           '"server_error": (False, False)',
           '"server_error": (True, False)',
           "tests.test_run.TestResume."
           "test_a_resume_reruns_infrastructure_failures_and_retry_failed_also_request_failures"),
    mutant("resume-ignores-retry-failed",
           "--retry-failed runs again the failures a resume keeps (caused by the request)",
           "if eclass in _KEEP_ON_RESUME and not retry_failed:",
           "if eclass in _KEEP_ON_RESUME:",
           "tests.test_run.TestResume."
           "test_a_resume_reruns_infrastructure_failures_and_retry_failed_also_request_failures"),
    mutant("swe-format-error-limit",
           "an agent stops after max_format_errors (3) replies in a row without exactly one action",
           "if format_errors >= opts.max_format_errors:",
           "if format_errors > opts.max_format_errors:",
           "tests.test_swe.TestAgentPolicies.test_chatty_ends_with_the_format_error_after_three_replies"),
    mutant("breaker-threshold",
           "the circuit breaker trips at the 12th consecutive sample failed with an endpoint-is-unusable class",
           "return self._consecutive == self.threshold",
           "return self._consecutive == self.threshold + 1",
           "tests.test_run.TestFailures.test_endpoint_down_aborts_with_exit_3_within_seconds_naming_the_cause "
           "tests.test_run.TestCircuitBreaker"),
    mutant("report-unescaped-response",
           "model-provided text in the HTML report is escaped (a <script> in a reply stays text)",
           'return "<span%s>%s</span>" % (css, _esc(text))',
           'return "<span%s>%s</span>" % (css, text)',
           "tests.test_report.TestHtmlReport.test_model_and_dataset_text_is_escaped_and_secrets_are_absent"),
    mutant("pass-at-k-biased",
           "pass@k is the unbiased estimator 1 - C(n-c, k) / C(n, k), not 1 - (1 - c/n)^k",
           "return 1.0 - _comb(n - c, k) / _comb(n, k)",
           "return 1.0 - (1.0 - c / n) ** k",
           "tests.test_identity.TestEpochs."
           "test_epochs_give_pass_at_k_as_the_closed_form_and_resume_each_row_and_epoch_once"),
    mutant("qa-articles-kept",
           "the normalized scorer drops the articles a, an, the (SQuAD-style)",
           'text = _ARTICLES_RE.sub(" ", text)',
           "text = text",
           "tests.test_scoring.TestNormalizedScorer tests.test_scoring.TestRegexScorer"),
    mutant("math-dfrac-kept",
           "the math scorer reads \\dfrac and \\tfrac as \\frac",
           r's = re.sub(r"\\[dt]frac", r"\\frac", s)',
           "s = s",
           "tests.test_scoring.TestMathScorer"),
    mutant("gate-clamp-max",
           "the gate's limit stays within min_limit..max_limit whatever its algorithm says",
           "return max(self.min_limit, min(self.max_limit, int(value)))",
           "return max(self.min_limit, int(value))",
           "tests.test_gates.TestOverloadAndDrain tests.test_gates.TestGradientLimit"),
    mutant("merge-overlapping-shards",
           "merge takes each shard exactly once: the same shard given twice is refused",
           "if index in shards:",
           "if index in shards and False:",
           "tests.test_scaleout.TestMerge.test_merge_refuses_mixed_runs_and_overlapping_shards_with_one_line_each"),
    mutant("secret-masked-echo",
           "a key echoed masked (sk-abc1****wxyz) is scrubbed by its 8-char head or 6-char tail",
           'text = re.sub(r"\\S*(?:%s|%s)\\S*" % (head, tail), "[REDACTED]", text)',
           "text = text",
           "tests.test_client.TestSecrets tests.test_run.TestSecrets "
           "tests.test_report.TestHtmlReport.test_model_and_dataset_text_is_escaped_and_secrets_are_absent"),
    mutant("extract-code-first-block",
           "the program in a reply is its last python block",
           "return found[-1] if found[-1].strip() else None",
           "return found[0] if found[0].strip() else None",
           "tests.test_code.TestExtractionAndComparison"),
    mutant("lcb-line-count",
           "LiveCodeBench's stdout comparison needs the same number of lines",
           "if len(a) != len(b):",
           "if len(a) < len(b):",
           "tests.test_code.TestExtractionAndComparison"),
    mutant("code-timeout-class",
           "a program still running at its time limit is a timeout",
           "if res.get(\"timed_out\"):",
           "if res.get(\"timed_out\") and False:",
           "tests.test_code.TestLocalSandbox"),
    mutant("unpickler-allows-builtins",
           "the LiveCodeBench test decoder refuses every class or function reference in a pickle (builtins too)",
           'raise pickle.UnpicklingError("refused %s.%s: only a plain string may come out" % (module, name))',
           # builtins come out (eval among them); any other reference is still refused
           'return super().find_class(module, name) if module == "builtins" else (_ for _ in ()).throw('
           'pickle.UnpicklingError("refused %s.%s: only a plain string may come out" % (module, name)))',
           "tests.test_code.TestLayouts"),
    mutant("no-proxy-run-host",
           "a run adds its endpoint's host to NO_PROXY/no_proxy unless --use-proxy",
           "exclude_from_proxy([run.base_url])",
           "exclude_from_proxy([])",
           "tests.test_client.TestProxy "
           "tests.test_run.TestFailures.test_a_run_appends_its_endpoint_host_to_no_proxy_unless_use_proxy"),
    mutant("acc-norm-unnormalised",
           "acc_norm divides each choice's log-likelihood by the choice's length in characters",
           "norm = [ll / max(1, len(c)) for ll, c in zip(lls, choices)]",
           "norm = list(lls)",
           "tests.test_loglik.TestMetrics"),
    mutant("loglik-boundary-kept",
           "whitespace at the end of a context moves to the front of the continuation (lm-eval's _encode_pair)",
           "    n = len(context) - len(context.rstrip())\n    if n:",
           "    n = 0\n    if n:",
           "tests.test_loglik.TestMetrics"),
    mutant("refused-gives-up",
           "a refused request is the endpoint's trouble: it retries past its retries while others are answered",
           "        if refused or err.turned_away:\n            # nothing listened",
           "        if False:\n            # nothing listened",
           "tests.test_client.TestOutageRace"),
    mutant("ppl-words-whitespace",
           "perplexity's word count is lm-eval's re.split(r'\\s+', text): a trailing newline counts one more piece",
           'return len(re.split(r"\\s+", text))',
           "return len(text.split())",
           "tests.test_first_runs.TestNumbers.test_the_word_count_is_lm_evals_a_trailing_newline_one_more"),
    mutant("rate-older-reply-wins",
           "a rate-limit reply to an older request never overwrites the state a newer request's reply stated",
           'if group in self._stated and at < self._stated[group]["t"]:',
           'if False and group in self._stated and at < self._stated[group]["t"]:',
           "tests.test_first_runs.TestNumbers.test_a_reply_to_an_older_request_never_overwrites_a_newer_stated_state"),
)

# ----------------------------------------------------------------------------- one mutant

Result = collections.namedtuple("Result", "mutant status detail seconds report")

_FAILED_TEST_RE = re.compile(r"^(FAIL|ERROR): (\w+) \(([\w.]+?)(?:\.\2)?\)", re.M)
_COUNTS_RE = re.compile(r"^(\d+) passed, (\d+) failed, (\d+) skipped$", re.M)
_SKIP_FILES = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", "dist", ".mypy_cache")


def check_originals(mutants):
    """Every mutant's original text occurs exactly once in its file (else code moved: update the mutant)."""
    problems = []
    for m in mutants:
        with open(os.path.join(ROOT, m.file), encoding="utf-8") as fh:
            n = fh.read().count(m.original)
        if n != 1:
            problems.append("%s: its original text occurs %d times in %s (needs exactly 1): %r"
                            % (m.name, n, m.file, m.original))
        if m.original == m.replacement:
            problems.append("%s: the replacement is the original" % m.name)
    return problems


def copy_tree(dest):
    """The checkout (its files, not .git or caches) copied to DEST."""
    shutil.copytree(ROOT, dest, ignore=_SKIP_FILES, symlinks=True)


def mutate(tree, m):
    path = os.path.join(tree, m.file)
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    assert text.count(m.original) == 1, m.name  # checked before any run; the copy is of the same files
    text = text.replace(m.original, m.replacement)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    if m.file.endswith(".py"):
        compile(text, path, "exec")  # a mutant that does not even compile would be "killed" by every test


_live_lock = threading.Lock()  # guards _live
_live = set()                  # the test processes running now (each leads its own process group)


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the tests' own servers and subprocesses are in its group
    except ProcessLookupError:
        pass


def run_tests(tree, targets, timeout_s):
    """(exit status or None on timeout, stdout, stderr) of tests/run.py -q TARGETS inside TREE."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.Popen([sys.executable, os.path.join("tests", "run.py"), "-q"] + list(targets), cwd=tree,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                            errors="replace", start_new_session=True)
    with _live_lock:
        _live.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        return None, out, err
    finally:
        with _live_lock:
            _live.discard(proc)


def first_failure(err):
    """The first failing test's report in unittest's output (its header and traceback), or the output's tail."""
    blocks = re.split(r"(?m)^(?:=|-){70}$", err)
    for i, block in enumerate(blocks):
        if _FAILED_TEST_RE.search(block) and i + 1 < len(blocks):
            return (block.strip() + "\n" + blocks[i + 1].strip()).strip()
    return "\n".join(err.strip().splitlines()[-20:])


def verdict(rc, out, err):
    """(status, detail) of one run of a mutant's targets."""
    counts = _COUNTS_RE.search(out)
    failed = _FAILED_TEST_RE.findall(err)
    if rc is None:
        return "timeout", "its tests still ran after the timeout"
    if "no tests ran" in out or (not counts and rc != 0 and not failed):
        return "broken", "the tests did not run: %s" % (err.strip().splitlines() or ["(no output)"])[-1]
    loader = [f for f in failed if f[2].startswith("unittest.loader")]
    if loader:
        return "broken", "target not found: %s" % loader[0][1]
    if rc == 0:
        passed, _, skipped = counts.groups() if counts else ("?", "0", "0")
        return "survived", "%s test(s) passed%s" % (passed, ", %s skipped" % skipped if skipped != "0" else "")
    if failed:
        kind, test, where = failed[0]
        return "killed", "%s %s.%s%s" % (kind, where, test, " (+%d more)" % (len(failed) - 1)
                                         if len(failed) > 1 else "")
    return "killed", "exit status %d" % rc


def run_mutant(m, timeout_s, baseline):
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="evalharness-mutant-%s-" % m.name)
    try:
        tree = os.path.join(tmp, "repo")
        copy_tree(tree)
        if baseline:
            rc, out, err = run_tests(tree, m.targets, timeout_s)
            status, detail = verdict(rc, out, err)
            if status != "survived":
                return Result(m, "broken", "unchanged code does not pass its tests (%s: %s)" % (status, detail),
                              time.monotonic() - t0, first_failure(err))
        try:
            mutate(tree, m)
        except SyntaxError as exc:
            return Result(m, "broken", "the mutated module does not compile: %s" % exc, time.monotonic() - t0, "")
        rc, out, err = run_tests(tree, m.targets, timeout_s)
        status, detail = verdict(rc, out, err)
        return Result(m, status, detail, time.monotonic() - t0, first_failure(err) if status != "survived" else "")
    finally:
        shutil.rmtree(tmp, True)


# ----------------------------------------------------------------------------- command line

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run these mutants only (repeatable or comma-separated; default: all)")
    p.add_argument("--list", action="store_true", help="list the mutants and their tests; run nothing")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for one mutant's tests (default 900)")
    p.add_argument("--verbose", action="store_true",
                   help="print the first failing test's traceback of each mutant (default: of a broken one only)")
    p.add_argument("--baseline", action="store_true",
                   help="check first that each mutant's tests pass on the unchanged code (default: off)")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be at least 1, got %d" % args.jobs)
    return args


def main(argv):
    args = parse_args(argv)
    names = [n for arg in args.only for n in arg.split(",") if n]
    known = {m.name: m for m in MUTANTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        sys.stderr.write("mutants.py: no mutant %s; choose from: %s\n" % (", ".join(unknown), ", ".join(known)))
        return 2
    chosen = [known[n] for n in names] if names else list(MUTANTS)
    problems = check_originals(chosen)
    if problems:
        sys.stderr.write("mutants.py: the code moved; update these mutants:\n  %s\n" % "\n  ".join(problems))
        return 2
    width = max(len(m.name) for m in chosen)
    if args.list:
        for m in chosen:
            where = "" if m.file == MODULE else " [%s]" % m.file
            print("%-*s  %s%s\n%*s  tests: %s" % (width, m.name, m.breaks, where, width, "", " ".join(m.targets)))
        return 0
    t0 = time.monotonic()
    print_lock = threading.Lock()  # guards stdout: one line per mutant, whole
    results = []

    def done(res):
        with print_lock:
            results.append(res)
            print("%-8s %-*s %5.0fs  %s" % (res.status.upper(), width, res.mutant.name, res.seconds, res.detail),
                  flush=True)
            if res.report and (args.verbose or res.status == "broken"):
                print("    " + res.report.replace("\n", "\n    "), flush=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_mutant, m, args.timeout, args.baseline) for m in chosen]
        try:
            for fut in concurrent.futures.as_completed(futures):
                done(fut.result())
        except KeyboardInterrupt:  # (the test processes lead groups of their own: Ctrl-C does not reach them)
            for fut in futures:
                fut.cancel()
            with _live_lock:
                for proc in _live:
                    _kill_group(proc)
            raise
    counts = collections.Counter(r.status for r in results)
    not_killed = sorted(r.mutant.name for r in results if r.status != "killed")
    print("%d mutants: %d killed, %d survived, %d timeout, %d broken in %.0fs%s"
          % (len(results), counts["killed"], counts["survived"], counts["timeout"], counts["broken"],
             time.monotonic() - t0, (" (not killed: %s)" % ", ".join(not_killed)) if not_killed else ""))
    return 0 if counts["killed"] == len(results) else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
