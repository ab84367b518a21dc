#!/usr/bin/env python3
"""Deterministic discrete-event simulation of concurrency limiters against LLM servers (evalharness issue 3).

Virtual time in integer microseconds; separate seeded random streams for the workload, server noise and error
injection; the workload is drawn up front so every limiter sees the same jobs; same seed => byte-identical output.

Servers
  A  continuous batching (vLLM-like): step time tau0 + tau1*B + p/P (chunked prefill budget M), FIFO wait queue,
     B_max, a KV pool of K tokens with preemption + recompute of the newest sequence, an LRU prefix cache of idle
     agent sessions, client timeouts (the request is cancelled and its work wasted), optional 503 past a queue.
  B  hosted API: load-independent latency (TTFT lognormal + tokens at ~60 tok/s), token buckets (RPM, ITPM on input,
     OTPM charged on max_tokens then refunded) answered with 429 + Retry-After, a hidden stream cap (429, no
     Retry-After), transient 5xx, brownouts (latency x2-3, no errors).
  Q  a hosted API or gateway that states no limits (issue 54): load-independent latency as B, a hidden stream cap
     answered 429 (with or without Retry-After), and one quota mechanism answered 429 without headers: a sliding-
     window request log, a fixed window reset each clock minute, a token bucket (prompt debited on admission, the
     answer when it ends), or a hard cap alone; brownouts with and without shedding (429 / 503) past half the cap.
Workloads  W1 single-turn log-normal lengths; W1b bimodal (70% short, 30% long reasoning); W2 agentic sessions whose
           context grows each turn, with tool waits between turns.
Scenarios  S1 steady, S2 capacity halved at T/3 and restored at 2T/3, S3 hosted quota halved and restored (with
           background 5xx and brownouts), S4 agentic, S5 bimodal, S6 brownouts only (no quota, no 5xx; the hidden
           stream cap stays).
--quota    server Q's scenarios instead (P4s sliding window, P4f fixed window, P4b token bucket, P4c / P4r a cap
           of 48 without / with Retry-After): S1 steady, SH the limit halved at T/3 and restored at 2T/3, SQ
           quartered and restored, SB four brownouts (latency x2-3, no errors), SD halved plus a brownout, SX4 / SX5
           two brownouts shedding with 429 / 503, S5 the bimodal workload. Their C* is what the issue means by the
           best concurrency: the streams the oracle's server accepted, time-averaged (Little's law), per phase
           (over its last two thirds: the phase before's leftover quota is spent in its first minute); minL/C*L
           is the lowest limit over the phase (in a phase whose C* rose, from when the limit reached 0.9 of it).
Limiters   oracle (best fixed C from a sweep on the same seeds; best fixed session count for S4), fixed 10,
           inspect-style, Netflix Gradient2 (defaults, 1 s windows), AIMD (+1 a success at load, x0.9 an
           overload) alone and through evalharness's gate (aimd-gate: --limit-rule aimd), admit-all sessions (S4),
           evalharness AdaptiveGate / SessionGate. The evalharness gate sees each answer's time to first token (it streams) and,
           with --server-metrics on (the default), engine A's running / waiting gauges every 0.5 s (single-turn
           runs) and its KV pool size (S4: the session gate admits by the sessions' contexts, which each turn's
           usage reports, as an agent run does against vLLM or SGLang; off: it climbs the count of sessions).
S4         a family of agent workloads (FAMILY: tool waits, context growth, session lengths, prefix cache against
           the working set, small box and large node, a queue much larger or barely larger than the best count,
           all at once or arriving over time), each against its own best fixed session count; --held-out runs ten
           other workloads (HELD_OUT) the session gate was not tuned on.

A run still going at 4x the makespan of a reference setting (fixed 32, or 8 sessions) is cut there and flagged
`cut` (only settings far behind the oracle are; their goodput up to the cut is reported). All scenarios, 10 seeds,
2 jobs: about 32 minutes on a 2-core machine (the single-turn ones 14); --quota about as long again.

Usage: python3 bench/gate_sim.py [--seeds 10] [--scenarios S1-P1,S4-P1,...] [--json OUT] [--jobs 2]
       [--variants V,...] [--held-out] [--footprint-reference ALPHA] [--quota]
"""
import argparse
import collections
import hashlib
import heapq
import json
import math
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import evalharness as eh  # noqa: E402

US = 1000000
SERVER_METRICS = True  # the engine model serves running / waiting gauges to the adaptive gate (--server-metrics)
METRICS_POLL_S = 0.5
C_SWEEP = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
S_SWEEP = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48]

PROFILES = {
    "P1": dict(kind="A", tau0=0.020, tau1=0.0005, P=8000.0, M=2048, B_max=256, K=180000, timeout_s=300.0,
               q503=None),
    "P2": dict(kind="A", tau0=0.025, tau1=0.00008, P=50000.0, M=8192, B_max=512, K=900000, timeout_s=300.0,
               q503=512),
    "P3": dict(kind="B", cap=64, rpm=1000.0, itpm=400000.0, otpm=80000.0, p5xx=0.003, timeout_s=600.0),
    # issue 54: hosted APIs that state no limits (server Q). W1 requests take ~9 s, so 375 requests a minute bind at
    # ~56 in flight (Little's law), under a hidden cap of 64 streams answered 429 without Retry-After; the bucket
    # holds as many tokens a minute (W1: ~1,560 tokens a request); the cap profiles have no quota, 48 streams
    "P4s": dict(kind="Q", mech="sliding", quota=375, cap=64, timeout_s=600.0),
    "P4f": dict(kind="Q", mech="fixed", quota=375, cap=64, timeout_s=600.0),
    "P4b": dict(kind="Q", mech="bucket", quota=585000, cap=64, timeout_s=600.0),
    "P4c": dict(kind="Q", mech="cap", cap=48, timeout_s=600.0),
    "P4r": dict(kind="Q", mech="cap", cap=48, cap_retry_after=1, timeout_s=600.0),
}
# server Q's scenarios: the quota (or cap) x0.5 / x0.25 at T/3 and restored at 2T/3, the same halved with one
# brownout, four brownouts (latency x2-3, no errors), two brownouts that shed load past half the cap (429 or 503)
LIMIT_EVENTS = {"S2": ((2.0, 0.5), (0.5, 2.0)), "S3": ((0.5, None), (2.0, None)), "S3h": ((0.5, None), (2.0, None)),
                "SH": ((0.5,), (2.0,)), "SQ": ((0.25,), (4.0,)), "SD": ((0.5,), (2.0,))}


# ----------------------------------------------------------------------------------------------------------------
# event loop
# ----------------------------------------------------------------------------------------------------------------
class Loop:
    def __init__(self):
        self.now = 0
        self._q = []
        self._n = 0

    def at(self, t_us, fn, *args):
        self._n += 1
        heapq.heappush(self._q, (max(int(t_us), self.now), self._n, fn, args))

    def after(self, dt_s, fn, *args):
        self.at(self.now + int(round(dt_s * US)), fn, *args)

    def clock(self):
        return self.now / US

    def run(self, stop):
        while self._q and not stop():
            t, _, fn, args = heapq.heappop(self._q)
            self.now = t
            fn(*args)


class Req:
    __slots__ = ("job", "ctx", "out", "max_tokens", "session", "cb", "t_submit", "t_first", "done", "cancelled",
                 "seq", "cached", "headers", "on_headers")

    def __init__(self, job, ctx, out, max_tokens, session, cb):
        self.job, self.ctx, self.out, self.max_tokens, self.session, self.cb = job, ctx, out, max_tokens, session, cb
        self.t_submit = self.t_first = None
        self.done = self.cancelled = False
        self.seq = None
        self.cached = None  # prompt tokens the engine found in its prefix cache (first admission), as usage reports
        self.headers = None  # server B with headers: its rate-limit headers on the reply
        self.on_headers = None  # told when the reply's headers arrive (with its first token, as a stream's do)


# ----------------------------------------------------------------------------------------------------------------
# server A: continuous batching engine
# ----------------------------------------------------------------------------------------------------------------
class Seq:
    __slots__ = ("req", "prompt", "prefill_left", "gen_base", "g0", "finish_g", "order", "alive", "decoding")


class EngineA:
    def __init__(self, loop, prof, rng, stats):
        self.loop, self.p, self.rng, self.stats = loop, dict(prof), rng, stats
        self.waiting = collections.deque()
        self.prefilling = collections.deque()
        self.running = []          # admission order (newest last): preemption victim
        self.heap = []             # (finish_g, order, seq) of decoding seqs
        self.n_dec = 0
        self.G = 0                 # global decode step counter
        self.kv_const = 0          # sum(prompt + gen_base - g0) over decoding seqs; kv = kv_const + n_dec * G
        self.kv_prefill = 0        # KV held by prefilling seqs (their whole prompt)
        self.cache = collections.OrderedDict()  # session -> cached tokens (idle sessions' prefix KV), LRU first
        self.cache_tokens = 0
        self.order = 0
        self.busy = False
        self.seg = None            # (t_start_us, dt_us, k_steps) of the uniform decode segment in progress
        self.seg_event = 0

    # capacity changes (S2)
    def scale(self, tau1_factor, k_factor):
        self._sync()
        self.p["tau1"] *= tau1_factor
        self.p["K"] = int(self.p["K"] * k_factor)
        self._kick()

    def kv_used(self):
        return self.kv_const + self.n_dec * self.G + self.kv_prefill + self.cache_tokens

    def submit(self, req):
        req.t_submit = self.loop.now
        q503 = self.p.get("q503")
        if q503 is not None and len(self.waiting) >= q503:
            self.loop.after(0.002, self._finish_err, req, "503", None)
            return
        self._sync()
        self.waiting.append(req)
        self._kick()

    def cancel(self, req):
        """Client timeout: drop the request wherever it is; its work is wasted."""
        if req.done:
            return
        self._sync()
        req.cancelled = True
        seq = req.seq
        if seq is None:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        elif seq.alive:
            self.stats["wasted_tokens"] += self._seq_tokens(seq)
            self._drop_seq(seq)
        self._kick()

    def _seq_tokens(self, seq):
        gen = (seq.gen_base + self.G - seq.g0) if seq.decoding else 0
        return seq.prompt + gen

    def _drop_seq(self, seq):
        seq.alive = False
        self.running.remove(seq)
        if seq.decoding:
            self.n_dec -= 1
            self.kv_const -= seq.prompt + seq.gen_base - seq.g0
        else:
            self.prefilling.remove(seq)
            self.kv_prefill -= seq.prompt

    def _finish_err(self, req, kind, retry_after):
        if not req.cancelled:
            req.done = True
            req.cb(req, kind, retry_after)

    # --- scheduling ---------------------------------------------------------------------------------------------
    def _admit(self):
        K, watermark = self.p["K"], int(0.01 * self.p["K"])
        while self.waiting and len(self.running) < self.p["B_max"]:
            req = self.waiting[0]
            cached = 0
            if req.session is not None and req.session in self.cache:
                cached = min(self.cache[req.session], req.ctx)
            need = req.ctx - cached
            free = K - self.kv_used()
            while free < need + watermark and self.cache:   # evict idle sessions' caches first (LRU)
                sid, tok = self.cache.popitem(last=False)
                self.cache_tokens -= tok
                if sid == req.session:
                    cached, need = 0, req.ctx
                free = K - self.kv_used()
            if free < need + watermark:
                break
            self.waiting.popleft()
            if req.cached is None:
                req.cached = cached
            if req.session is not None:
                if cached and req.session in self.cache:
                    self.cache_tokens -= self.cache.pop(req.session)
                    self.stats["cache_hits"] += 1
                else:
                    self.stats["cache_misses"] += 1
            seq = Seq()
            seq.req, seq.prompt, seq.prefill_left = req, req.ctx, max(1, need)
            seq.gen_base = seq.g0 = seq.finish_g = 0
            self.order += 1
            seq.order, seq.alive, seq.decoding = self.order, True, False
            req.seq = seq
            self.running.append(seq)
            self.prefilling.append(seq)
            self.kv_prefill += seq.prompt

    def _kick(self):
        if not self.busy:
            self.busy = True
            self.loop.at(self.loop.now, self._step)

    def _sync(self):
        """Apply the decode steps of the segment in progress that have completed by now."""
        if self.seg is None:
            return
        t0, dt, k = self.seg
        n = min(k - 1, (self.loop.now - t0) // dt)
        self.G += n
        # the step in progress finishes first; then _step re-plans with the new state
        self.seg_event += 1
        self.seg = None
        self.busy = True
        self.loop.at(t0 + (n + 1) * dt, self._step_boundary, self.seg_event)

    def _step_boundary(self, token):
        if token != self.seg_event:
            return
        self.G += 1
        self._complete_finished()
        self._step()

    def _noise(self):
        return math.exp(self.rng.gauss(0.0, 0.03))

    def _step(self):
        self.seg = None
        self._complete_finished()
        self._admit()
        if not self.running:
            self.busy = False
            return
        self.busy = True
        # out of KV for the next step: preempt the newest sequence (recompute later)
        while self.running and self.kv_used() + self.n_dec > self.p["K"]:
            if self.cache:
                sid, tok = self.cache.popitem(last=False)
                self.cache_tokens -= tok
                continue
            victim = self.running[-1]
            tokens = self._seq_tokens(victim)
            self.stats["preemptions"] += 1
            self.stats["wasted_tokens"] += tokens
            gen = (victim.gen_base + self.G - victim.g0) if victim.decoding else 0
            self._drop_seq(victim)
            req = victim.req
            # vLLM recompute: back to the head of the queue, needing prefill of context + generated text
            req.seq = None
            req.ctx += gen
            req.out = max(1, req.out - gen)
            self.waiting.appendleft(req)
        p = self.p
        if self.prefilling:
            budget, used = p["M"], 0
            finished = []
            for seq in self.prefilling:
                take = min(budget - used, seq.prefill_left)
                seq.prefill_left -= take
                used += take
                if seq.prefill_left == 0:
                    finished.append(seq)
                if used >= budget:
                    break
            dt = (p["tau0"] + p["tau1"] * self.n_dec + used / p["P"]) * self._noise()
            self.loop.after(dt, self._after_prefill_step, finished)
            return
        if self.n_dec == 0:
            self.busy = False
            return
        # a uniform decode segment up to the next completion or KV exhaustion
        next_finish = self.heap[0][0] - self.G if self.heap else 1
        free = p["K"] - self.kv_used()
        k = max(1, min(next_finish, free // max(1, self.n_dec)))
        dt = int(round((p["tau0"] + p["tau1"] * self.n_dec) * self._noise() * US))
        self.seg = (self.loop.now, max(dt, 1), k)
        self.seg_event += 1
        self.loop.at(self.loop.now + dt * k, self._seg_end, self.seg_event)

    def forget(self, session):
        """A session ended: its cached prefix is no longer needed."""
        if session in self.cache:
            self.cache_tokens -= self.cache.pop(session)

    def _seg_end(self, token):
        if token != self.seg_event or self.seg is None:
            return
        t0, dt, k = self.seg
        self.G += k
        self.seg = None
        self._complete_finished()
        self._step()

    def _after_prefill_step(self, finished):
        self.G += 1  # decoding seqs advanced one token during the mixed step
        for seq in finished:
            if not seq.alive:
                continue
            self.prefilling.remove(seq)
            self.kv_prefill -= seq.prompt
            seq.decoding = True
            seq.gen_base, seq.g0 = 1, self.G
            seq.finish_g = self.G + max(0, seq.req.out - 1)
            self.kv_const += seq.prompt + seq.gen_base - seq.g0
            self.n_dec += 1
            heapq.heappush(self.heap, (seq.finish_g, seq.order, seq))
            if seq.req.t_first is None:
                seq.req.t_first = self.loop.now
        self._complete_finished()
        self._step()

    def _complete_finished(self):
        while self.heap and (not self.heap[0][2].alive or self.heap[0][0] <= self.G):
            _, _, seq = heapq.heappop(self.heap)
            if not seq.alive:
                continue
            tokens = self._seq_tokens(seq)
            self._drop_seq(seq)
            req = seq.req
            if req.session is not None:   # the session's KV stays cached while its tool runs
                self.cache[req.session] = tokens
                self.cache_tokens += tokens
            req.done = True
            req.cb(req, "ok", None)


# ----------------------------------------------------------------------------------------------------------------
# server B: hosted API
# ----------------------------------------------------------------------------------------------------------------
class Bucket:
    def __init__(self, per_min, t0):
        self.rate = per_min / 60.0
        self.cap = per_min
        self.level = per_min
        self.t = t0

    def refill(self, now_s):
        self.level = min(self.cap, self.level + (now_s - self.t) * self.rate)
        self.t = now_s

    def wait_for(self, need):
        return 0.0 if self.level >= need else (need - self.level) / self.rate


class Hosted:
    """What the hosted servers (B, Q) share: a cancelled request is dropped; a reply goes to its callback once."""

    def cancel(self, req):
        req.cancelled = True

    def _reply(self, req, kind, retry_after):
        if req.cancelled or req.done:
            return
        req.done = True
        req.cb(req, kind, retry_after)


class ServerB(Hosted):
    def __init__(self, loop, prof, rng, err_rng, stats, brownouts=(), errors=True, quotas=True, headers=False):
        self.headers = headers  # every reply states the buckets (anthropic-ratelimit-* names), as hosted APIs do
        self.loop, self.p, self.rng, self.err_rng, self.stats = loop, dict(prof), rng, err_rng, stats
        self.buckets = {k: Bucket(self.p[k], 0.0) for k in ("rpm", "itpm", "otpm")}
        self.active = 0
        self.brownouts = list(brownouts)
        self.errors = errors
        self.quotas = quotas

    def scale(self, quota_factor, _unused=None):
        now = self.loop.clock()
        for b in self.buckets.values():
            b.refill(now)
            b.rate *= quota_factor
            b.cap *= quota_factor
            b.level = min(b.level, b.cap)

    def slow(self, now_s):
        for s, e, f in self.brownouts:
            if s <= now_s < e:
                return f
        return 1.0

    def submit(self, req):
        req.t_submit = self.loop.now
        now = self.loop.clock()
        if self.active >= self.p["cap"]:
            self.loop.after(0.05, self._reply, req, "429", None)
            return
        if self.errors and self.err_rng.random() < self.p["p5xx"]:
            self.loop.after(0.2, self._reply, req, "5xx", None)
            return
        for b in self.buckets.values():
            b.refill(now)
        needs = {"rpm": 1, "itpm": req.ctx, "otpm": req.max_tokens} if self.quotas else {}
        wait = max([self.buckets[k].wait_for(v) for k, v in needs.items()] + [0.0])
        if wait > 0:
            self.state(req)
            self.loop.after(0.05, self._reply, req, "429", math.ceil(wait))
            return
        for k, v in needs.items():
            self.buckets[k].level -= v
        self.state(req)
        self.active += 1
        slow = self.slow(now)
        ttft = math.exp(self.rng.gauss(math.log(0.8), 0.5)) + req.ctx / 20000.0
        speed = 60.0 * self.rng.uniform(0.8, 1.2)
        latency = (ttft + req.out / speed) * slow
        req.t_first = self.loop.now + int(ttft * slow * US)
        if req.headers is not None and req.on_headers is not None:
            self.loop.at(req.t_first, req.on_headers)
        self.loop.after(latency, self._complete, req)

    def state(self, req):
        """The reply's rate-limit headers: each bucket's limit, what remains and when it is full again."""
        if not (self.headers and self.quotas):
            return
        req.headers = {}
        for key, group in (("rpm", "requests"), ("itpm", "input-tokens"), ("otpm", "output-tokens")):
            b = self.buckets[key]
            level = max(0.0, b.level)
            req.headers["anthropic-ratelimit-%s-limit" % group] = "%d" % b.cap
            req.headers["anthropic-ratelimit-%s-remaining" % group] = "%d" % level
            req.headers["anthropic-ratelimit-%s-reset" % group] = "%.3fs" % ((b.cap - level) / b.rate)

    def _complete(self, req):
        self.active -= 1
        b = self.buckets["otpm"]
        b.refill(self.loop.clock())
        b.level = min(b.cap, b.level + (req.max_tokens - req.out))  # refund the unused reservation
        self._reply(req, "ok", None)


class ServerQ(Hosted):
    """A hosted API or gateway that states no limits (issue 54): per-stream latency independent of load (as server
    B), a hidden stream cap answered 429 (with ``cap_retry_after`` seconds of Retry-After, or none), and one quota
    mechanism answered 429 with no headers at all, written from how real limiters count:
      sliding  at most ``quota`` requests admitted in any trailing 60 s (a sliding-window log);
      fixed    at most ``quota`` requests a clock minute, the count reset on minute boundaries (many gateways);
      bucket   a token bucket of ``quota`` tokens a minute, burst one minute: a request is admitted while the bucket
               holds its prompt; its prompt is debited then and its answer when it ends (usage counted afterwards,
               as LiteLLM-style gateways do), so the level may go below zero;
      cap      no quota: the stream cap alone binds.
    ``scale(f)`` multiplies the quota (or, for cap, the cap). Brownouts (start, end, latency factor, shed): while one
    lasts, a request admitted is that much slower; with ``shed`` ("429" or "503") the server also sheds load past
    half its stream cap, answering at once."""

    def __init__(self, loop, prof, rng, stats, brownouts=()):
        self.loop, self.p, self.rng, self.stats = loop, dict(prof), rng, stats
        self.mech, self.quota, self.cap = self.p["mech"], float(self.p.get("quota", 0)), int(self.p["cap"])
        self.brownouts = list(brownouts)
        self.active = 0
        self.log = collections.deque()  # sliding: admission times in the last 60 s
        self.minute, self.count = -1, 0  # fixed: the clock minute and its count
        self.level, self.t = self.quota, 0.0  # bucket: tokens, refilled continuously

    def scale(self, factor, _unused=None):
        self._refill(self.loop.clock())
        if self.mech == "cap":
            self.cap = max(1, int(round(self.cap * factor)))
        else:
            self.quota *= factor
            self.level = min(self.level, self.quota)

    def brownout(self, now_s):
        for s, e, f, shed in self.brownouts:
            if s <= now_s < e:
                return f, shed
        return 1.0, None

    def _refill(self, now):
        if self.mech == "bucket":
            self.level = min(self.quota, self.level + (now - self.t) * self.quota / 60.0)
        self.t = now

    def _quota_admits(self, now, req):
        if self.mech == "sliding":
            while self.log and self.log[0] <= now - 60.0:
                self.log.popleft()
            if len(self.log) >= self.quota:
                return False
            self.log.append(now)
        elif self.mech == "fixed":
            minute = int(now // 60)
            if minute != self.minute:
                self.minute, self.count = minute, 0
            if self.count >= self.quota:
                return False
            self.count += 1
        elif self.mech == "bucket":
            self._refill(now)
            if self.level < req.ctx:
                return False
            self.level -= req.ctx
        return True

    def submit(self, req):
        req.t_submit = self.loop.now
        now = self.loop.clock()
        slow, shed = self.brownout(now)
        if shed is not None and self.active >= self.cap // 2:
            self.loop.after(0.05, self._reply, req, shed, None)
            return
        if self.active >= self.cap:
            self.loop.after(0.05, self._reply, req, "429", self.p.get("cap_retry_after"))
            return
        if not self._quota_admits(now, req):
            self.loop.after(0.05, self._reply, req, "429", None)
            return
        self.active += 1
        ttft = math.exp(self.rng.gauss(math.log(0.8), 0.5)) + req.ctx / 20000.0
        speed = 60.0 * self.rng.uniform(0.8, 1.2)
        req.t_first = self.loop.now + int(ttft * slow * US)
        self.loop.after((ttft + req.out / speed) * slow, self._complete, req)

    def _complete(self, req):
        self.active -= 1
        if self.mech == "bucket":
            self._refill(self.loop.clock())
            self.level -= req.out
        self._reply(req, "ok", None)


# ----------------------------------------------------------------------------------------------------------------
# workloads
# ----------------------------------------------------------------------------------------------------------------
def lognormal(rng, median, sigma):
    return math.exp(rng.gauss(math.log(median), sigma))


def workload_w1(seed, n=3000, bimodal=False):
    rng = random.Random("w1-%d-%s" % (seed, bimodal))
    jobs = []
    for _ in range(n):
        ctx = int(min(8000, max(16, lognormal(rng, 800, 0.8))))
        if bimodal:
            out = rng.randint(50, 200) if rng.random() < 0.7 else rng.randint(2000, 8000)
        else:
            out = int(min(4096, max(1, lognormal(rng, 300, 1.0))))
        jobs.append((ctx, out))
    return jobs


def workload_w2(seed, n=300, wait="base", growth="base", lengths="base", max_ctx=131072):
    """Agent sessions: a start context, then turns (context, output, tool wait after it); the context grows by the
    reply and a tool observation each turn, and a session ends early when its next context would not fit the
    model's window (max_ctx). wait: base (log-normal median 2 s, 5% 30-120 s), zero (~50 ms), exp (mean 5 s), heavy
    (log-normal median 3 s, sigma 2: a few percent take minutes, capped at 15 min); growth: the observation's median
    (base 1000, small 250, large 3000 tokens); lengths: turns per session (base 10-40 uniform, fixed 25, variable
    log-normal median 15, 2-200). The base settings draw exactly the original W2."""
    tag = "" if (wait, growth, lengths) == ("base", "base", "base") else "-%s-%s-%s" % (wait, growth, lengths)
    rng = random.Random("w2-%d%s" % (seed, tag))
    obs_median = {"base": 1000, "small": 250, "large": 3000}[growth]
    sessions = []
    for _ in range(n):
        ctx = rng.randint(2000, 4000)
        if lengths == "base":
            count = rng.randint(10, 40)
        elif lengths == "fixed":
            count = 25
        else:
            count = int(min(200, max(2, lognormal(rng, 15, 1.0))))
        turns = []
        for _t in range(count):
            out = int(max(5, lognormal(rng, 200, 0.7)))
            if wait == "base":
                w = rng.uniform(30, 120) if rng.random() < 0.05 else lognormal(rng, 2.0, 1.0)
            elif wait == "zero":
                w = lognormal(rng, 0.05, 0.5)
            elif wait == "exp":
                w = rng.expovariate(1.0 / 5.0)
            else:
                w = min(900.0, lognormal(rng, 3.0, 2.0))
            obs = int(lognormal(rng, obs_median, 0.7))
            turns.append((ctx, out, w))
            ctx = ctx + out + obs
            if ctx + 4096 > max_ctx:
                break
        sessions.append(turns)
    return sessions


# ----------------------------------------------------------------------------------------------------------------
# limiters: each has try_acquire(), release(permit, outcome, output_tokens), limit
# ----------------------------------------------------------------------------------------------------------------
class InspectStyle:
    """inspect_ai adaptive connections (defaults min 10, start 20, max 100, cooldown 15 s, x0.8, +5%)."""

    def __init__(self, clock, min_l=10, start=20, max_l=100):
        self.clock, self.min, self.max = clock, min_l, max_l
        self.limit, self.in_flight = start, 0
        self.slow_start = True
        self.successes = 0
        self.peak = 0
        self.cool_until = -1.0

    def try_acquire(self):
        if self.in_flight >= self.limit:
            return None
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        return object()

    @staticmethod
    def nice_up(x):
        return int(math.ceil(x / 5.0) * 5) if x >= 10 else int(x)

    @staticmethod
    def nice_down(x):
        return int(math.floor(x / 5.0) * 5) if x >= 10 else int(x)

    def release(self, permit, outcome="ok", output_tokens=0, rate_limited=False, retry_after=None, **_):
        self.in_flight -= 1
        now = self.clock()
        if rate_limited:
            if now >= self.cool_until:
                self.limit = max(self.min, 1, self.nice_down(int(0.8 * self.limit)))
                self.slow_start = False
            self.cool_until = max(self.cool_until, now + max(retry_after or 0, 15.0))
            self.successes, self.peak = 0, self.in_flight
            return
        if outcome != "ok":
            self.successes, self.peak = 0, self.in_flight  # transient: pause growth
            return
        if now < self.cool_until:
            return
        self.successes += 1
        if self.successes >= max(self.limit, 4):
            if self.peak >= 0.8 * self.limit:
                if self.slow_start:
                    self.limit = min(self.max, self.limit * 2)
                else:
                    self.limit = min(self.max, self.nice_up(self.limit + max(1, round(0.05 * self.limit))))
            self.successes, self.peak = 0, self.in_flight


class FloatLimiter:
    """A limiter with a float limit L: admits while fewer than int(L) are in flight; ``permit()`` is what it hands
    out."""

    @property
    def limit(self):
        return int(self.L)

    def try_acquire(self):
        if self.in_flight >= int(self.L):
            return None
        self.in_flight += 1
        return self.permit()


class Gradient2(FloatLimiter):
    """Netflix Gradient2Limit (defaults) inside WindowedLimit (1 s windows, >= 10 samples)."""

    def __init__(self, clock, initial=20, min_l=20, max_l=200):
        self.clock = clock
        self.L = float(initial)
        self.min, self.max = min_l, max_l
        self.in_flight = 0
        self.long = None
        self.n_long = 0
        self.win_start = None
        self.win = []
        self.win_max_inflight = 0

    def permit(self):
        return (self.clock(), self.in_flight)

    def release(self, permit, outcome="ok", output_tokens=0, **_):
        self.in_flight -= 1
        if outcome == "ignore":
            return
        now = self.clock()
        start, inflight = permit
        rtt = now - start
        if self.win_start is None:
            self.win_start = now
        self.win.append(rtt)
        self.win_max_inflight = max(self.win_max_inflight, inflight)
        if now - self.win_start < 1.0:
            return
        if len(self.win) >= 10:
            self._update(sum(self.win) / len(self.win), self.win_max_inflight)
        self.win, self.win_max_inflight, self.win_start = [], 0, now

    def _update(self, short, inflight):
        if self.long is None:
            self.long, self.n_long = short, 1
        elif self.n_long < 10:
            self.n_long += 1
            self.long += (short - self.long) / self.n_long
        else:
            self.long += (short - self.long) * 2.0 / 601.0
        long = self.long
        if long / short > 2:
            self.long *= 0.95
        if inflight < self.L / 2:
            return
        g = max(0.5, min(1.0, 1.5 * long / short))
        new = self.L * g + 4
        new = self.L * 0.8 + new * 0.2
        self.L = max(self.min, min(self.max, new))


class AIMD(FloatLimiter):
    """Netflix AIMDLimit as issue 54 names it (the reference a 429 gate must match): +1 per success while at least
    half the limit is in flight, x0.9 on every overload (429, 503, timeout; latency ignored), 1..512 from 20."""

    def __init__(self, clock, initial=20, min_l=1, max_l=512):
        self.L, self.min, self.max, self.in_flight = float(initial), min_l, max_l, 0

    def permit(self):
        return self.in_flight

    def release(self, permit, outcome="ok", output_tokens=0, **_):
        self.in_flight -= 1
        if outcome == "overload":
            self.L = max(self.min, math.floor(0.9 * self.L))
        elif outcome == "ok" and 2 * permit >= self.L:
            self.L = min(self.max, self.L + 1)


class GateAdapter:
    """evalharness AdaptiveGate (or a fixed limit on the same machinery) behind the simulator's interface."""

    def __init__(self, gate):
        self.gate = gate

    @property
    def limit(self):
        return self.gate.limit

    def try_acquire(self):
        return self.gate.try_acquire()

    def release(self, permit, outcome="ok", output_tokens=0, retry_after=None, ttft_s=None, **_):
        self.gate.release(permit, outcome, output_tokens, retry_after_s=retry_after, ttft_s=ttft_s)

    def draining_until(self):
        until = [t for t in (self.gate.draining_until(), self.gate.paced_until()) if t is not None]
        return max(until) if until else None


class PacedGate(GateAdapter):
    """evalharness's AdaptiveGate and, before it, its RatePacer reading the server's rate-limit headers (a run
    against a hosted API that states them): a request starts when both admit it."""

    def __init__(self, gate, clock):
        super().__init__(gate)
        self.clock = clock
        self.pacer = eh.RatePacer(clock=clock, wall=lambda: 0.0)
        self.next_t = None
        self.entries = {}  # permit -> its pacer entry

    def try_acquire(self, cost=None):
        if cost is not None:
            wait = self.pacer.delay(cost)
            if wait > 0:
                self.next_t = self.clock() + wait
                return None
        permit = self.gate.try_acquire()
        if permit is not None and cost is not None:
            self.entries[id(permit)] = self.pacer.admit(cost)
        return permit

    def release(self, permit, outcome="ok", output_tokens=0, retry_after=None, ttft_s=None, headers=None,
                sent_at=None, **_):
        self.pacer.observe(headers, sent_at)
        entry = self.entries.pop(id(permit), None)
        if outcome == "ok":  # as the client settles an answer: its usage
            self.pacer.settle(entry, None, output_tokens)
        super().release(permit, outcome, output_tokens, retry_after, ttft_s)

    def draining_until(self):
        until = super().draining_until()
        if self.next_t is not None and self.next_t > self.clock():
            until = self.next_t if until is None else max(until, self.next_t)
        return until


def max_tokens_of(scenario):
    return 8192 if scenario == "S5" else 4096


def make_limiter(name, clock, max_tokens=None, deadline_s=None):
    """max_tokens, deadline_s: what evalharness passes from its own settings (--max-tokens, --request-timeout)."""
    if name.startswith("fixed"):
        c = int(name[5:])
        return GateAdapter(eh.AdaptiveGate(c, 1, max(c, 1), clock=clock, algorithm=eh.FixedLimit(c)))
    if name == "inspect":
        return InspectStyle(clock)
    if name == "gradient2":
        return Gradient2(clock)
    if name == "aimd":
        return AIMD(clock)
    if name == "aimd-gate":  # evalharness --limit-rule aimd: the same rule through the gate's epochs and pauses
        return GateAdapter(eh.AdaptiveGate(20, 1, 512, clock=clock, algorithm=eh.AIMDLimit(20, 1, 512)))
    if name == "adaptive":
        return GateAdapter(eh.AdaptiveGate(16, 1, 512, clock=clock, max_tokens=max_tokens, deadline_s=deadline_s))
    if name == "unlimited":
        return GateAdapter(eh.AdaptiveGate(100000, 1, 100000, clock=clock, algorithm=eh.FixedLimit(100000)))
    raise ValueError(name)


# ----------------------------------------------------------------------------------------------------------------
# one simulated run
# ----------------------------------------------------------------------------------------------------------------
def quota_brownouts(scenario, seed, T):
    """Server Q's brownouts (start, end, latency factor, shed) for a scenario: SB four (x2-3, 30-60 s, spread over
    the run), SD one, SX4 / SX5 two at x2 that shed load with 429 / 503; none otherwise."""
    rng = random.Random("qbrown-%d-%s" % (seed, scenario))
    starts = {"SB": (0.12, 0.35, 0.58, 0.8), "SD": (0.15,), "SX4": (0.25, 0.6), "SX5": (0.25, 0.6)}.get(scenario, ())
    shed = {"SX4": "429", "SX5": "503"}.get(scenario)
    out = []
    for share in starts:
        t = share * T + rng.uniform(-10, 10)
        out.append((t, t + rng.uniform(30, 60), 2.0 if shed else rng.uniform(2, 3), shed))
    return out


class Run:
    def __init__(self, scenario, profile, limiter_name, seed, T=None, sessions=None, horizon=None):
        self.scenario, self.profile, self.seed = scenario, profile, seed
        self.horizon_us = None if horizon is None else int(horizon * US)  # a run still going then is cut there
        self.cut = False
        self.loop = Loop()
        self.stats = collections.Counter()
        prof = PROFILES[profile]
        noise = random.Random("noise-%d-%s" % (seed, scenario))
        errs = random.Random("errors-%d-%s" % (seed, scenario))
        self.rng = random.Random("client-%d" % seed)
        self.T = T
        if prof["kind"] == "A":
            self.server = EngineA(self.loop, prof, noise, self.stats)
        elif prof["kind"] == "Q":
            self.server = ServerQ(self.loop, prof, noise, self.stats, quota_brownouts(scenario, seed, T or 600.0))
        else:
            brownouts = []
            if scenario in ("S3", "S3h", "S6"):
                brng = random.Random("brown-%d" % seed)
                t = brng.uniform(60, 240)
                horizon = (T or 3000) * 1.5
                while t < horizon:
                    d = brng.uniform(30, 60)
                    brownouts.append((t, t + d, brng.uniform(2, 3) if scenario != "S6" else 3.0))
                    t += d + brng.uniform(120, 360)
            # S6 isolates false alarms: brownouts only (no quota, no 5xx; the hidden stream cap stays)
            self.server = ServerB(self.loop, prof, noise, errs, self.stats, brownouts, errors=(scenario != "S6"),
                                  quotas=(scenario != "S6"), headers=(scenario == "S3h"))
        self.timeout_s = prof["timeout_s"]
        self.limiter_name = limiter_name
        self.limiter = make_limiter(limiter_name, self.loop.clock, max_tokens_of(scenario), self.timeout_s)
        if scenario == "S3h" and limiter_name == "adaptive":  # evalharness reads the headers it is sent
            self.limiter = PacedGate(self.limiter.gate, self.loop.clock)
        if limiter_name == "adaptive" and scenario.startswith("S4"):  # as evalharness's agent runs: no queue
            self.limiter.gate._algorithm.queue_share = math.inf       # reading from first tokens
        # as evalharness: server metrics for single-turn runs only (agent runs do not read them)
        if SERVER_METRICS and limiter_name == "adaptive" and isinstance(self.server, EngineA) and \
                not scenario.startswith("S4"):
            self.loop.at(int(METRICS_POLL_S * US), self.poll_metrics)
        self.limit_trace = []    # (t_s, limit)
        self.goodput_bins = collections.defaultdict(float)  # 1 s bins of output tokens of successful requests
        self.accepted_bins = collections.defaultdict(float)  # 1 s bins of stream-seconds of successful requests
        self.n_left = 0
        self.pending = collections.deque()
        self.retries = collections.Counter()
        self.sessions_limit = sessions
        self.session_gate = None
        self.t_end = 0
        self.pump_scheduled = False
        if scenario in LIMIT_EVENTS and T:
            f_drop, f_back = LIMIT_EVENTS[scenario]
            self.loop.at(int(T / 3 * US), self.server.scale, *f_drop)
            self.loop.at(int(2 * T / 3 * US), self.server.scale, *f_back)

    # --- helpers -----------------------------------------------------------------------------------------------
    def finished(self):
        if self.n_left == 0:
            return True
        if self.horizon_us is not None and self.loop.now > self.horizon_us:
            # far worse than the oracle (a thrashing setting): its goodput so far is all that matters
            self.cut = True
            return True
        return False

    def trace(self):
        lim = self.limiter.limit
        if not self.limit_trace or self.limit_trace[-1][1] != lim:
            self.limit_trace.append((self.loop.clock(), lim))

    def credit(self, req, out):
        """Spread a successful request's tokens over its service time (smooth goodput curves), and its stream-seconds
        from submission over the seconds it spans (the concurrency the server accepted: Little's law per bin)."""
        t0, t1 = req.t_submit / US, self.loop.clock()
        b = int(t0)
        while b < t1:
            self.accepted_bins[b] += min(t1, b + 1) - max(t0, b)
            b += 1
        t0 = (req.t_first if req.t_first is not None else req.t_submit) / US
        if t1 - t0 < 1e-6:
            self.goodput_bins[int(t1)] += out
            return
        rate = out / (t1 - t0)
        b = int(t0)
        while b < t1:
            lo, hi = max(t0, b), min(t1, b + 1)
            self.goodput_bins[b] += rate * (hi - lo)
            b += 1

    # --- single-turn client ------------------------------------------------------------------------------------
    def run_single(self, jobs, max_tokens):
        self.jobs = jobs
        self.max_tokens = max_tokens
        self.n_left = len(jobs)
        self.pending.extend(range(len(jobs)))
        self.loop.at(0, self.pump)
        self.loop.run(self.finished)
        self.t_end = self.loop.clock()
        return self.result()

    def pump(self):
        self.pump_scheduled = False
        while self.pending:
            if isinstance(self.limiter, PacedGate):  # what the next request reserves against the stated limits
                ctx, out = self.jobs[self.pending[0]]
                permit = self.limiter.try_acquire(eh.RatePacer.costs(ctx, self.max_tokens))
            else:
                permit = self.limiter.try_acquire()
            if permit is None:
                break
            self.trace()
            job = self.pending.popleft()
            ctx, out = self.jobs[job]
            self.send(job, ctx, min(out, self.max_tokens), None, permit, self.on_single_done)
        self.schedule_drain_pump()

    def schedule_drain_pump(self):
        until = getattr(self.limiter, "draining_until", lambda: None)()
        if until is not None and not self.pump_scheduled and self.pending:
            self.pump_scheduled = True
            self.loop.at(int(math.ceil(until * US)) + 1, self.pump)

    def send(self, job, ctx, out, session, permit, done_cb):
        state = {"permit": permit, "timed_out": False}

        def cb(req, kind, retry_after):
            if state["timed_out"]:
                return
            done_cb(job, req, kind, retry_after, state)
        req = Req(job, ctx, out, self.max_tokens, session, cb)
        state["req"] = req
        if isinstance(self.limiter, PacedGate):  # a streamed answer's headers come before its tokens
            req.on_headers = lambda: self.limiter.pacer.observe(req.headers, req.t_submit / US + 1e-9)
        self.server.submit(req)
        self.loop.after(self.timeout_s, self.on_timeout, req, state, done_cb, job)

    def on_timeout(self, req, state, done_cb, job):
        if req.done or state["timed_out"]:
            return
        state["timed_out"] = True
        self.server.cancel(req)
        done_cb(job, req, "timeout", None, state)

    def outcome_of(self, kind):
        return "ok" if kind == "ok" else ("ignore" if kind == "5xx" else "overload")

    def release(self, state, kind, out, retry_after):
        self.stats["n_" + kind] += 1
        req = state.get("req")
        ttft = None  # what a streamed answer shows: its time to first token
        if kind == "ok" and req is not None and req.t_first is not None:
            ttft = max(0.0, (req.t_first - req.t_submit) / US)
        self.limiter.release(state["permit"], self.outcome_of(kind), out if kind == "ok" else 0,
                             rate_limited=(kind == "429"), retry_after=retry_after, ttft_s=ttft,
                             headers=req.headers if req is not None else None,
                             sent_at=req.t_submit / US + 1e-9 if req is not None and req.t_submit is not None else None)
        self.trace()

    def poll_metrics(self):
        """The engine's Prometheus-style gauges, read every METRICS_POLL_S as evalharness --server-metrics does:
        requests it runs (admitted to its batch) and keeps waiting in its queue."""
        if self.n_left == 0:
            return
        self.limiter.gate.on_server(len(self.server.running), len(self.server.waiting))
        self.loop.after(METRICS_POLL_S, self.poll_metrics)

    def backoff(self, job, kind, retry_after):
        self.retries[job] += 1
        k = self.retries[job]
        wait = min(60.0, 1.0 * 2 ** min(k - 1, 10)) * (0.5 + 0.5 * self.rng.random())
        gate = getattr(self.limiter, "gate", None)
        if kind in ("429", "503") and isinstance(gate, eh.AdaptiveGate) and gate.spaces_refusals():
            # as evalharness's client (ModelClient._backoff_s): refused by an endpoint that accepts others, a
            # request comes back to the gate's line at once (its limit and pace space the retries)
            wait = eh.REFUSED_BACKOFF_S * (0.5 + 0.5 * self.rng.random())
            if retry_after is not None:
                wait = max(wait, retry_after)
        if retry_after is not None:
            wait = max(wait, retry_after)
        return wait

    def on_single_done(self, job, req, kind, retry_after, state):
        out = req.out if kind == "ok" else 0
        if kind == "ok":
            out = self.jobs[job][1] if self.jobs[job][1] <= self.max_tokens else self.max_tokens
            self.credit(req, out)
            self.stats["good_tokens"] += out
            self.n_left -= 1
            self.t_end = self.loop.clock()
            self.release(state, kind, out, retry_after)
        else:
            self.release(state, kind, 0, retry_after)
            wait = self.backoff(job, kind, retry_after)
            self.loop.after(wait, self.requeue, job)
        self.pump()

    def requeue(self, job):
        self.pending.appendleft(job)
        self.pump()

    # --- agentic sessions --------------------------------------------------------------------------------------
    def run_sessions(self, sessions, mode, arrivals=None):
        """mode: ('fixed', S) | ('all',) | ('gate',) | ('inspect',); arrivals: each session's arrival time (s) at
        the door (None: all at once)."""
        self.sessions = sessions
        self.max_tokens = max_tokens_of(self.scenario)
        self.mode = mode
        self.n_left = len(sessions)
        self.door = collections.deque(range(len(sessions)) if arrivals is None else ())
        self.session_trace = []  # (t, session count allowed) whenever it changes
        self.active = {}
        self.s_start, self.s_end, self.s_ideal = {}, {}, {}
        self.turn_idx = collections.Counter()
        self.waiting_turns = collections.deque()
        self.t_ready = {}  # session -> when its waiting turn became ready
        if mode[0] == "gate":  # with server metrics the session gate knows the KV pool (vLLM cache_config_info)
            kv = PROFILES[self.profile].get("K") if SERVER_METRICS else None
            self.session_gate = eh.SessionGate(self.limiter.gate, clock=self.loop.clock, kv_tokens=kv)
        if arrivals is None:
            self.loop.at(0, self.admit_sessions)
        else:
            for sid, t in enumerate(arrivals):
                self.loop.at(int(t * US), self._arrive, sid)
        self.loop.run(self.finished)
        self.t_end = self.loop.clock()
        res = self.result()
        res["sessions_trace"] = self.session_trace
        slowdowns = []
        for s, turns in enumerate(sessions):
            ideal = sum(t[1] * PROFILES[self.profile].get("tau0", 0.02) + t[2] for t in turns)
            # a cut run: unfinished sessions count up to the cut; a session's time starts at its arrival
            start = self.s_start.get(s, self.t_end) if arrivals is None else min(arrivals[s], self.t_end)
            slowdowns.append(max(self.s_end.get(s, self.t_end) - start, ideal) / ideal)
        res["fairness"] = (sum(slowdowns) ** 2) / (len(slowdowns) * sum(x * x for x in slowdowns))
        hits, misses = self.stats["cache_hits"], self.stats["cache_misses"]
        res["hit_rate"] = hits / max(1, hits + misses)
        return res

    def session_capacity(self):
        m = self.mode[0]
        if m == "fixed":
            return self.mode[1]
        if m == "all":
            return 10 ** 9
        if m == "inspect":
            return self.limiter.limit + 5
        if m == "footprint":  # ('footprint', alpha): an oracle of memory, see evaluate_family
            budget = self.mode[1] * PROFILES[self.profile]["K"]
            held = sum(self.midlife(s) for s in self.active)
            fits = not self.active or (self.door and held + self.midlife(self.door[0]) <= budget)
            return len(self.active) + (1 if fits else 0)
        return None

    def midlife(self, s):
        """A session's context halfway from its next turn to its end (knows the future: the footprint oracle's)."""
        turns = self.sessions[s]
        ctx = turns[min(self.turn_idx[s], len(turns) - 1)][0]
        return 0.5 * (ctx + turns[-1][0] + turns[-1][1])

    def _arrive(self, sid):
        self.door.append(sid)
        self.admit_sessions()

    def trace_sessions(self):
        if self.mode[0] == "gate":
            lim = self.session_gate.capacity
        elif self.mode[0] == "inspect":
            lim = self.session_capacity()
        else:
            lim = min(self.session_capacity(), len(self.sessions))
        if not self.session_trace or self.session_trace[-1][1] != lim:
            self.session_trace.append((self.loop.clock(), lim))

    def admit_sessions(self):
        self.trace_sessions()
        while self.door:
            if self.mode[0] == "gate":
                slot = self.session_gate.try_enter()
                if slot is None:
                    break
            else:
                if len(self.active) >= self.session_capacity():
                    break
                slot = True
            s = self.door.popleft()
            self.active[s] = slot
            self.s_start[s] = self.loop.clock()
            self.t_ready[s] = self.loop.clock()
            self.waiting_turns.append(s)
        self.pump_turns()

    def pump_turns(self):
        while self.waiting_turns:
            permit = self.limiter.try_acquire()
            if permit is None:
                break
            self.trace()
            s = self.waiting_turns.popleft()
            permit.asked_at = self.t_ready.pop(s, permit.asked_at)  # (the sim polls try_acquire)
            ctx, out, _wait = self.sessions[s][self.turn_idx[s]]
            self.send(s, ctx, out, s, permit, self.on_turn_done)
        until = getattr(self.limiter, "draining_until", lambda: None)()
        if until is not None and not self.pump_scheduled and self.waiting_turns:
            self.pump_scheduled = True
            self.loop.at(int(math.ceil(until * US)) + 1, self._pump_turns_timer)

    def _pump_turns_timer(self):
        self.pump_scheduled = False
        self.pump_turns()

    def on_turn_done(self, s, req, kind, retry_after, state):
        if kind != "ok":
            self.release(state, kind, 0, retry_after)
            self.loop.after(self.backoff(s, kind, retry_after), self._retry_turn, s)
            self.pump_turns()
            return
        ctx, out, wait = self.sessions[s][self.turn_idx[s]]
        self.retries[s] = 0
        self.credit(req, out)
        self.stats["good_tokens"] += out
        if self.session_gate is not None:  # as evalharness's agent loop: the turn's usage and seconds
            self.session_gate.report(self.active[s], ctx, out, self.loop.clock() - state["permit"].asked_at)
        self.release(state, kind, out, retry_after)
        self.trace_sessions()
        self.turn_idx[s] += 1
        if self.turn_idx[s] >= len(self.sessions[s]):
            self.s_end[s] = self.loop.clock()
            slot = self.active.pop(s)
            if hasattr(self.server, "forget"):
                self.server.forget(s)
            if self.mode[0] == "gate":
                self.session_gate.leave(slot)
            self.n_left -= 1
            self.admit_sessions()
        else:
            self.loop.after(wait, self._retry_turn, s)
        self.pump_turns()

    def _retry_turn(self, s):
        self.t_ready[s] = self.loop.clock()
        self.waiting_turns.append(s)
        if self.session_gate is not None:
            self.admit_sessions()
        else:
            self.pump_turns()

    # --- metrics -----------------------------------------------------------------------------------------------
    def result(self):
        makespan = max(self.t_end, 1e-9)
        good = self.stats["good_tokens"]
        changes = sum(1 for i in range(1, len(self.limit_trace)) if self.limit_trace[i][1] != self.limit_trace[i - 1][1])
        return {"makespan": makespan, "goodput": good / makespan, "cut": self.cut, "n429": self.stats["n_429"],
                "n503": self.stats["n_503"], "n5xx": self.stats["n_5xx"], "ntimeout": self.stats["n_timeout"],
                "wasted": self.stats["wasted_tokens"], "preemptions": self.stats["preemptions"],
                "changes_per_min": changes / (makespan / 60.0), "bins": dict(self.goodput_bins),
                "accepted": dict(self.accepted_bins),
                "trace": self.limit_trace}


def best_of(sweep):
    """The oracle's choice: the smallest setting within 1% of the best goodput (plateau noise must not pick a
    wasteful setting with thousands of extra 429s)."""
    top = max(r["goodput"] for r in sweep.values())
    return min(k for k, r in sweep.items() if r["goodput"] >= 0.99 * top)


# S4, the agentic family: each variant is a server profile (a PROFILES key) and a workload; its best fixed session
# count comes from its own sweep. arrive: sessions reach the door over time (exponential gaps of that mean, seconds)
# instead of all at once.
PROFILES["P1-K90k"] = dict(PROFILES["P1"], K=90000)      # prefix cache smaller than a few sessions' contexts
PROFILES["P1-K600k"] = dict(PROFILES["P1"], K=600000)    # about the working set at the compute knee
PROFILES["P1-K8M"] = dict(PROFILES["P1"], K=8000000)     # larger than every session's context at once
FAMILY = collections.OrderedDict([
    ("small-base", dict(profile="P1")),
    ("small-tools-zero", dict(profile="P1", wait="zero")),
    ("small-tools-exp", dict(profile="P1", wait="exp")),
    ("small-tools-heavy", dict(profile="P1", wait="heavy")),
    ("small-growth-small", dict(profile="P1", growth="small")),
    ("small-growth-large", dict(profile="P1", growth="large")),
    ("small-length-fixed", dict(profile="P1", lengths="fixed")),
    ("small-length-variable", dict(profile="P1", lengths="variable")),
    ("small-cache-smaller", dict(profile="P1-K90k")),
    ("small-cache-equal", dict(profile="P1-K600k")),
    ("small-cache-larger", dict(profile="P1-K8M")),
    ("small-queue-barely", dict(profile="P1", n=8)),
    ("small-arrivals", dict(profile="P1", arrive=8.0)),
    ("large-base", dict(profile="P2")),
    ("large-tools-heavy", dict(profile="P2", wait="heavy")),
    ("large-growth-large", dict(profile="P2", growth="large")),
    ("large-queue-barely", dict(profile="P2", n=40)),
    ("large-arrivals", dict(profile="P2", arrive=1.5)),
])

# workloads the session gate was not tuned on (--held-out): other mixes of the same knobs, two more pools and a
# slower prefill
PROFILES["P1-K300k"] = dict(PROFILES["P1"], K=300000)
PROFILES["P1-K2M"] = dict(PROFILES["P1"], K=2000000)
PROFILES["P1-prefill3k"] = dict(PROFILES["P1"], P=3000.0)
HELD_OUT = collections.OrderedDict([
    ("large-tools-zero", dict(profile="P2", wait="zero")),
    ("large-tools-exp", dict(profile="P2", wait="exp")),
    ("small-heavy+growth-large", dict(profile="P1", wait="heavy", growth="large")),
    ("large-length-variable", dict(profile="P2", lengths="variable")),
    ("K300k-growth-small", dict(profile="P1-K300k", growth="small")),
    ("large-arrivals-heavy", dict(profile="P2", arrive=1.5, wait="heavy")),
    ("small-zero+variable", dict(profile="P1", wait="zero", lengths="variable")),
    ("K2M-growth-large", dict(profile="P1-K2M", growth="large")),
    ("small-slow-prefill", dict(profile="P1-prefill3k")),
    ("queue20-exp", dict(profile="P1", n=20, wait="exp")),
])


def variant_of(name):
    return FAMILY[name] if name in FAMILY else HELD_OUT[name]


def family_workload(variant, seed):
    v = variant_of(variant)
    sessions = workload_w2(seed, n=v.get("n", 300), wait=v.get("wait", "base"), growth=v.get("growth", "base"),
                           lengths=v.get("lengths", "base"))
    arrivals = None
    if v.get("arrive"):
        rng, t, arrivals = random.Random("arrive-%d-%s" % (seed, variant)), 0.0, []
        for _ in sessions:
            arrivals.append(t)
            t += rng.expovariate(1.0 / v["arrive"])
    return sessions, arrivals


def run_one(args):
    scenario, profile, limiter, seed, T, mode, horizon = args
    r = Run(scenario, profile, limiter, seed, T=T, horizon=horizon)
    if scenario.startswith("S4:"):
        sessions, arrivals = family_workload(scenario[3:], seed)
        return r.run_sessions(sessions, mode, arrivals)
    if scenario == "S4":
        return r.run_sessions(workload_w2(seed), mode)
    jobs = workload_w1(seed, bimodal=(scenario == "S5"))
    return r.run_single(jobs, max_tokens_of(scenario))


# ----------------------------------------------------------------------------------------------------------------
# scenarios, oracle sweeps and the table
# ----------------------------------------------------------------------------------------------------------------
SCENARIOS = [("S1", "P1"), ("S1", "P2"), ("S1", "P3"), ("S2", "P1"), ("S3", "P3"), ("S4", "P1"), ("S5", "P1"),
             ("S5", "P3"), ("S6", "P3")]
# issue 54: APIs that answer 429 and state no limits (server Q; --quota runs these alone)
QUOTA_SCENARIOS = [("S1", "P4s"), ("SH", "P4s"), ("SQ", "P4s"), ("SB", "P4s"), ("SD", "P4s"), ("SX4", "P4s"),
                   ("SX5", "P4s"), ("S5", "P4s"), ("S1", "P4f"), ("SH", "P4f"), ("SQ", "P4f"), ("SB", "P4f"),
                   ("S1", "P4b"), ("SH", "P4b"), ("SQ", "P4b"), ("SB", "P4b"), ("S1", "P4c"), ("SH", "P4c"),
                   ("SQ", "P4c"), ("S1", "P4r"), ("SH", "P4r"), ("SQ", "P4r")]
CONTENDERS = ["fixed10", "inspect", "gradient2", "aimd", "aimd-gate", "adaptive"]
S4_CONTENDERS = [("admit-all", "unlimited", ("all",)), ("inspect", "inspect", ("inspect",)),
                 ("gradient2", "gradient2", ("all",)), ("adaptive", "adaptive", ("gate",))]


def window_rate(bins, t0, t1):
    return sum(v for b, v in bins.items() if t0 <= b < t1) / max(1e-9, t1 - t0)


def first_sustained(bins, start, end, target, win=30, hold=60, step=5):
    """First time >= start from which every 30 s window over the next `hold` s has rate >= target."""
    t = start
    while t + win <= end:
        if all(window_rate(bins, u, u + win) >= target for u in range(int(t), int(t + hold - win) + 1, step)):
            return t - start
        t += step
    return float("inf")


def phases(T, end):
    return [(0.0, T / 3), (T / 3, 2 * T / 3), (2 * T / 3, end)]


def median(xs):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def pool_map(fn, tasks, jobs):
    if jobs <= 1:
        return [fn(t) for t in tasks]
    import multiprocessing
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        return pool.map(fn, tasks, chunksize=1)


def run_missing(by, tasks, jobs):
    """Run the tasks not yet in BY (task -> result), in a pool of JOBS processes."""
    todo = [t for t in tasks if t not in by]
    for task, r in zip(todo, pool_map(run_one, todo, jobs)):
        by[task] = r


HORIZON = 4.0    # a run still going at HORIZON x the reference run's makespan is cut there (a thrashing setting)
REF_C, REF_S = 32, 8  # the reference settings run to completion first (their makespans set the horizons)


def evaluate(scenarios, seeds, jobs, log):
    """Runs every limiter on every scenario and seed; returns the table rows (medians over seeds).

    Order: (A) a reference fixed setting per profile and seed, uncapped; (B) the steady S1 sweeps, capped at
    HORIZON x the reference, giving T (the steady oracle makespan) per profile and seed; (C) references for the
    other scenarios; (D) every other run, capped likewise. The cap only shortens runs that are far behind the
    oracle (their goodput up to the cut is reported and flagged `cut`), and S1's sweep is the steady sweep."""
    t_start = time.time()
    by = {}

    def run_all(tasks):
        run_missing(by, tasks, jobs)

    def horizon(ref):
        return HORIZON * by[ref]["makespan"]

    def sweep_tasks(scen, prof, seed, t, ref):
        if scen == "S4":
            return [ref if s == REF_S else (scen, prof, "unlimited", seed, t, ("fixed", s), horizon(ref))
                    for s in S_SWEEP]
        return [ref if c == REF_C else (scen, prof, "fixed%d" % c, seed, t, None, horizon(ref)) for c in C_SWEEP]

    def contender_tasks(scen, prof, seed, t, ref):
        if scen == "S4":
            return [(scen, prof, lim, seed, t, mode, horizon(ref)) for _n, lim, mode in S4_CONTENDERS]
        return [(scen, prof, lim, seed, t, None, horizon(ref)) for lim in CONTENDERS]

    profiles = sorted({p for s, p in scenarios})
    steady_ref = {(p, seed): ("S1", p, "fixed%d" % REF_C, seed, None, None, None) for p in profiles for seed in seeds}
    run_all(list(steady_ref.values()))
    run_all([t for (p, seed), ref in steady_ref.items() for t in sweep_tasks("S1", p, seed, None, ref)])
    T = {}
    for (p, seed), ref in steady_ref.items():
        sweep = {c: by[t] for c, t in zip(C_SWEEP, sweep_tasks("S1", p, seed, None, ref))}
        T[(p, seed)] = sweep[best_of(sweep)]["makespan"]
    log("steady sweeps done (%.0fs)" % (time.time() - t_start))
    refs = {}
    for scen, prof in scenarios:
        for seed in seeds:
            if scen == "S1":
                refs[(scen, prof, seed)] = steady_ref[(prof, seed)]
            elif scen == "S4":
                refs[(scen, prof, seed)] = (scen, prof, "unlimited", seed, T[(prof, seed)], ("fixed", REF_S), None)
            else:
                refs[(scen, prof, seed)] = (scen, prof, "fixed%d" % REF_C, seed, T[(prof, seed)], None, None)
    run_all(list(refs.values()))
    tasks = []
    for (scen, prof, seed), ref in refs.items():
        t = None if scen == "S1" else T[(prof, seed)]
        tasks += sweep_tasks(scen, prof, seed, t, ref) + contender_tasks(scen, prof, seed, t, ref)
    run_all(tasks)
    log("scenario runs done (%.0fs, %d runs)" % (time.time() - t_start, len(by)))
    rows = []
    for scen, prof in scenarios:
        per_lim = collections.defaultdict(lambda: collections.defaultdict(list))
        for seed in seeds:
            t = T[(prof, seed)]
            ref = refs[(scen, prof, seed)]
            tt = None if scen == "S1" else t
            runs = [by[x] for x in contender_tasks(scen, prof, seed, tt, ref)]
            if scen == "S4":
                sweep = {s: by[x] for s, x in zip(S_SWEEP, sweep_tasks(scen, prof, seed, tt, ref))}
                best_s = best_of(sweep)
                oracle = sweep[best_s]
                entries = [("oracle(S=%d)" % best_s, oracle)] + \
                          [(name, r) for (name, _l, _m), r in zip(S4_CONTENDERS, runs)]
                c_star = best_s
            else:
                sweep = {c: by[x] for c, x in zip(C_SWEEP, sweep_tasks(scen, prof, seed, tt, ref))}
                c_star = best_of(sweep)
                oracle = sweep[c_star]
                entries = [("oracle", oracle)] + list(zip(CONTENDERS, runs))
            end = oracle["makespan"]
            ph_rates = None
            ph_best = None
            if scen in LIMIT_EVENTS:
                ph_rates = [max(window_rate(r["bins"], a, b) for r in sweep.values()) for a, b in phases(t, end)]
            if PROFILES[prof]["kind"] == "Q":
                # C* as the issue states it: the concurrency the server accepts (Little's law: the oracle's
                # successful streams in flight, time-averaged), per phase of a limit change over its steady part
                # (its last two thirds, and not the run's last tenth: a token bucket's or a window's leftover from
                # the phase before is spent in its first minute, and the run's tail runs out of work); else over
                # the middle of the run (its start and tail are no steady state)
                spans = phases(t, end) if scen in LIMIT_EVENTS else [(0.0, end)]
                ph_best = [window_rate(oracle["accepted"], a + (b - a) / 3, min(b, 0.9 * end)) for a, b in spans] \
                    if scen in LIMIT_EVENTS else [window_rate(oracle["accepted"], 0.1 * end, 0.8 * end)]
            for name, r in entries:
                m = per_lim[name.split("(")[0]]
                m["label"].append(name if name.startswith("oracle") else name)
                m["eff"].append(r["goodput"] / oracle["goodput"])
                m["c_star"].append(c_star)
                m["cut"].append(1 if r["cut"] else 0)
                for k in ("n429", "n503", "ntimeout", "n5xx", "wasted", "changes_per_min", "preemptions"):
                    m[k].append(r[k])
                rate1 = ph_rates[0] if ph_rates else oracle["goodput"]
                m["conv"].append(first_sustained(r["bins"], 0, r["makespan"], 0.9 * rate1) / r["makespan"])
                if ph_rates:
                    m["rec_drop"].append(first_sustained(r["bins"], t / 3, r["makespan"], 0.9 * ph_rates[1])
                                         / r["makespan"])
                    m["rec_restore"].append(first_sustained(r["bins"], 2 * t / 3, r["makespan"], 0.9 * ph_rates[2])
                                            / r["makespan"])
                if scen == "S4":
                    m["hit"].append(r["hit_rate"])
                    m["fair"].append(r["fairness"])
                trace = r["trace"]
                if trace and scen != "S4":  # (in S4 the model gate's limit is not the session count C* counts)
                    reached = [i for i, (_, lim) in enumerate(trace) if lim >= 0.5 * c_star]
                    m["min_after_half"].append(min(lim for _, lim in trace[reached[0]:]) / c_star if reached else 0.0)
                    if ph_best:
                        m["min_phase"].append(lowest_by_phase(trace, spans, ph_best))
                        m["c_little"].append(ph_best[0])
                    m["final_limit"].append(trace[-1][1])
        for name in per_lim:
            m = per_lim[name]
            row = {"scenario": scen, "profile": prof, "limiter": name}
            for k, v in m.items():
                if k == "label":
                    continue
                row[k] = (sum(v) if k == "cut" else round(median(v), 4)) if v else None
            rows.append(row)
    return rows, time.time() - t_start


def lowest_by_phase(trace, spans, bests):
    """The lowest limit / the phase's C* (spans: (start, end) each; bests: their C*): in the first span from when
    the limit first reached half its C*; in a phase whose C* rose, from when the limit first reached 0.9 of it (the
    climb before is the recovery, measured apart; never reached: the whole phase); else the whole phase."""
    worst, prev = math.inf, None
    for (a, b), best in zip(spans, bests):
        at = [(t, lim) for i, (t, lim) in enumerate(trace)
              if t < b and (t >= a or i + 1 == len(trace) or trace[i + 1][0] > a)]  # (in force in [a, b))
        start = 0.5 if prev is None else (0.9 if best > prev else None)
        if start is not None:
            reached = [i for i, (_, lim) in enumerate(at) if lim >= start * best]
            at = at[reached[0]:] if reached else at
        if at:
            worst = min(worst, min(lim for _, lim in at) / best)
        prev = best
    return worst


FAMILY_SWEEP = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96]
FAMILY_AT = (0.1, 0.25, 0.5, 0.75, 0.9)  # shares of the run at which the chosen session count is shown


def count_at(trace, t):
    """The session count in force at time t of a run's (t, count) trace."""
    lim = trace[0][1] if trace else 0
    for u, c in trace:
        if u > t:
            break
        lim = c
    return lim


def evaluate_family(variants, seeds, jobs, log, contender="adaptive", footprint=None):
    """S4's family: per variant and seed a fixed-session sweep (each run capped at HORIZON x the REF_S run) and
    the session gate; returns one row per variant (medians over seeds, and the worst seed's efficiency).
    footprint (alpha): also run a reference that knows the future, a session gate admitting while the admitted
    sessions' contexts halfway to their ends add up to at most alpha x the engine's KV pool, under the same
    adaptive model gate (row key "fp": its efficiency): what a memory-aware session gate could reach."""
    t_start = time.time()
    by = {}

    def run_all(tasks):
        run_missing(by, tasks, jobs)

    refs = {(v, seed): ("S4:" + v, variant_of(v)["profile"], "unlimited", seed, None, ("fixed", REF_S), None)
            for v in variants for seed in seeds}
    run_all(list(refs.values()))

    def sweep_task(v, seed, s):
        ref = refs[(v, seed)]
        return ref if s == REF_S else ref[:5] + (("fixed", s), HORIZON * by[ref]["makespan"])

    def gate_task(v, seed):
        ref = refs[(v, seed)]
        return ref[:2] + (contender, seed, None, ("gate",), HORIZON * by[ref]["makespan"])

    def fp_task(v, seed):
        return gate_task(v, seed)[:5] + (("footprint", footprint),) + gate_task(v, seed)[6:]

    run_all([sweep_task(v, seed, s) for v in variants for seed in seeds for s in FAMILY_SWEEP]
            + [gate_task(v, seed) for v in variants for seed in seeds]
            + ([fp_task(v, seed) for v in variants for seed in seeds] if footprint else []))
    log("family runs done (%.0fs, %d runs)" % (time.time() - t_start, len(by)))
    rows = []
    for v in variants:
        m = collections.defaultdict(list)
        for seed in seeds:
            sweep = {s: by[sweep_task(v, seed, s)] for s in FAMILY_SWEEP}
            best = best_of(sweep)
            oracle, r = sweep[best], by[gate_task(v, seed)]
            m["eff"].append(r["goodput"] / oracle["goodput"])
            m["best"].append(best)
            m["hit"].append(r["hit_rate"])
            m["oracle_hit"].append(oracle["hit_rate"])
            m["fair"].append(r["fairness"])
            m["oracle_fair"].append(oracle["fairness"])
            m["cut"].append(1 if r["cut"] else 0)
            if footprint:
                m["fp"].append(by[fp_task(v, seed)]["goodput"] / oracle["goodput"])
            for i, share in enumerate(FAMILY_AT):
                m["at%d" % i].append(count_at(r["sessions_trace"], share * r["makespan"]))
        row = {"variant": v, "profile": variant_of(v)["profile"], "worst_eff": round(min(m["eff"]), 4),
               "cut": sum(m["cut"]), "counts": [median(m["at%d" % i]) for i in range(len(FAMILY_AT))]}
        for k in ("eff", "best", "hit", "oracle_hit", "fair", "oracle_fair") + (("fp",) if footprint else ()):
            row[k] = round(median(m[k]), 4)
        rows.append(row)
    return rows, time.time() - t_start


def print_family(rows, seeds, out):
    out.write("S4 family (agent sessions; session gate %s): eff = session gate goodput / best fixed session "
              "count's (same seed), median of %d seeds; worst = the lowest seed; counts = the session count in force "
              "at %s of the run (with nobody at the door: those running)\n"
              % ("by footprint, KV pool known" if SERVER_METRICS else "count climbed, no KV pool", seeds,
                 "/".join("%d%%" % (100 * a) for a in FAMILY_AT)))
    fp = all("fp" in r for r in rows)
    out.write("%-22s %-8s %5s %5s %5s  %-24s %5s %5s %5s %5s %3s%s\n" % (
        "variant", "profile", "best", "eff", "worst", "counts", "hit", "hit*", "fair", "fair*", "cut",
        "    fp" if fp else ""))
    for r in rows:
        out.write("%-22s %-8s %5s %5.3f %5.3f  %-24s %5.2f %5.2f %5.2f %5.2f %3d%s\n" % (
            r["variant"], r["profile"], fmt(r["best"]), r["eff"], r["worst_eff"],
            "-".join(fmt(c) for c in r["counts"]), r["hit"], r["oracle_hit"], r["fair"], r["oracle_fair"],
            r["cut"], " %5.3f" % r["fp"] if fp else ""))
    effs = [r["eff"] for r in rows]
    out.write("family: min %.3f (%s), median %.3f over %d variants (* = the best fixed count's)\n" % (
        min(effs), rows[effs.index(min(effs))]["variant"], median(effs), len(rows)))
    if fp:
        fps = [r["fp"] for r in rows]
        out.write("fp = the footprint oracle (admits while the sessions' contexts halfway to their ends fit the KV "
                  "pool x alpha; knows the future): min %.3f (%s), median %.3f\n" % (
                      min(fps), rows[fps.index(min(fps))]["variant"], median(fps)))


def fmt(v, pct=False):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, float) and math.isinf(v):
        return "never"
    if pct:
        return "%.1f%%" % (100 * v)
    if isinstance(v, float) and v != int(v):
        return "%.3g" % v
    return str(int(v))


def print_table(rows, out):
    cols = [("scen", "scenario", 4), ("prof", "profile", 4), ("limiter", "limiter", 10), ("eff", "eff", 5),
            ("conv", "conv", 6), ("rec.drop", "rec_drop", 8), ("rec.rest", "rec_restore", 8), ("429", "n429", 6),
            ("503", "n503", 5), ("t/o", "ntimeout", 5), ("wasted", "wasted", 8), ("chg/min", "changes_per_min", 7),
            ("C*", "c_star", 4), ("minL/C*", "min_after_half", 7), ("C*L", "c_little", 4), ("minL/C*L", "min_phase", 8), ("hit", "hit", 5), ("fair", "fair", 5), ("cut", "cut", 3)]
    out.write("  ".join(h.rjust(w) for h, _, w in cols) + "\n")
    for r in rows:
        cells = []
        for h, k, w in cols:
            v = r.get(k)
            pct = k in ("conv", "rec_drop", "rec_restore")
            cells.append(fmt(v, pct).rjust(w))
        out.write("  ".join(cells) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--scenarios", default=",".join("%s-%s" % sp for sp in SCENARIOS),
                    help="comma list of SCENARIO-PROFILE, e.g. S1-P1,S4-P1")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quota", action="store_true",
                    help="the scenarios of APIs that answer 429 and state no limits instead (server Q, issue 54)")
    ap.add_argument("--json", default=None, help="write the result rows as JSON here")
    ap.add_argument("--server-metrics", choices=("on", "off"), default="on",
                    help="engine A serves running / waiting gauges that the adaptive gate reads, and its KV pool "
                         "size that the session gate reads (default on)")
    ap.add_argument("--footprint-reference", type=float, default=None, metavar="ALPHA",
                    help="S4 family: also run the footprint oracle (a session gate that knows each session's future "
                         "contexts and admits while their midlife sum fits ALPHA x the KV pool; column fp)")
    ap.add_argument("--variants", default=None,
                    help="comma list of S4 family variants (with S4 in --scenarios; with --held-out, of those): "
                         + ", ".join(FAMILY))
    ap.add_argument("--held-out", action="store_true",
                    help="S4: the workloads the session gate was not tuned on instead (%s)" % ", ".join(HELD_OUT))
    args = ap.parse_args()
    global SERVER_METRICS
    SERVER_METRICS = args.server_metrics == "on"
    scenarios = QUOTA_SCENARIOS if args.quota else [tuple(x.split("-")) for x in args.scenarios.split(",") if x]
    single = [sp for sp in scenarios if sp[0] != "S4"]
    seeds = list(range(1, args.seeds + 1))
    log = lambda m: sys.stderr.write("gate_sim: %s\n" % m)  # noqa: E731
    rows, took = evaluate(single, seeds, args.jobs, log) if single else ([], 0.0)
    if single:
        print("gate_sim: medians over %d seeds; server metrics %s; eff = goodput / oracle goodput (same seed); "
              "conv/rec = share of the run" % (args.seeds, args.server_metrics))
        print_table(rows, sys.stdout)
    if len(single) < len(scenarios):
        known = HELD_OUT if args.held_out else FAMILY
        variants = [v for v in (args.variants or ",".join(known)).split(",") if v]
        unknown = [v for v in variants if v not in known]
        if unknown:
            ap.error("unknown variant(s) %s; known: %s" % (", ".join(unknown), ", ".join(known)))
        family, took_f = evaluate_family(variants, seeds, args.jobs, log, footprint=args.footprint_reference)
        took += took_f
        print_family(family, args.seeds, sys.stdout)
        rows = rows + family
    sys.stdout.flush()
    blob = json.dumps(rows, sort_keys=True).encode()
    print("result sha256 %s (same seeds => same hash)" % hashlib.sha256(blob).hexdigest())
    sys.stderr.write("gate_sim: %.0fs wall\n" % took)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(json.dumps(rows, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
