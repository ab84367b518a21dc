"""AdaptiveGate (limit algorithm + admission) and SessionGate.

The algorithm is driven in virtual time by a closed-loop toy server (no threads, no sleeps); the admission
mechanics are also checked with real threads and bounded waits.
"""
import collections
import heapq
import itertools
import math
import os
import random
import threading
import time
import unittest

from tests.support import eh


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def drive(gate, clock, speed_of, seconds, *, tokens=lambda rng: 200, seed=1, ttft_s=0.05, cap=None, spread=0.0,
          retry_after_s=None):
    """Keep the gate full against a processor-sharing server: at every moment each in-flight stream advances at
    speed_of(in_flight) tokens/s (as in a continuous-batching engine), after a fixed time to first token. With
    ``cap``, a request admitted past that many in flight is refused at once (``overload``, a hidden stream cap);
    ``retry_after_s`` goes with each refusal (a quota rather than a cap); with ``spread``, each request's work is
    its tokens times a log-normal factor of that sigma (stream-to-stream speed differences, as on a hosted API).

    Returns the list of (time, limit) after each completion.
    """
    rng = random.Random(seed)
    heap, n = [], 0      # (virtual progress at which the request finishes, n, permit, tokens)
    progress = 0.0       # tokens each stream has received since the start (integral of speed_of(in_flight) dt)
    seen = []
    end = clock.t + seconds

    def advance_to_next():
        nonlocal progress
        rate = speed_of(max(1, gate.in_flight))
        target = heap[0][0]
        clock.t += max(0.0, target - progress) / rate
        progress = max(progress, target)

    while clock.t < end:
        while True:
            permit = gate.try_acquire()
            if permit is None:
                break
            if cap is not None and gate.in_flight > cap:
                gate.release(permit, "overload", retry_after_s=retry_after_s)
                continue
            n += 1
            tok = tokens(rng)
            # the time to first token is charged as progress at the current speed
            work = tok * (rng.lognormvariate(0.0, spread) if spread else 1.0)
            heapq.heappush(heap, (progress + work + ttft_s * speed_of(gate.in_flight), n, permit, tok))
        if not heap:
            until = gate.draining_until()
            clock.t = until if until is not None else clock.t + 1.0
            continue
        advance_to_next()
        _, _, permit, tok = heapq.heappop(heap)
        gate.release(permit, "ok", tok)
        seen.append((clock.t, gate.limit))
    while heap:  # finish what is in flight so in_flight returns to 0
        advance_to_next()
        _, _, permit, tok = heapq.heappop(heap)
        gate.release(permit, "ok", tok)
    return seen


def time_mean(seen):
    """The time-weighted mean limit over a list of (time, limit) as drive() returns."""
    return sum(l * (t1 - t0) for (t0, l), (t1, _) in zip(seen, seen[1:])) / (seen[-1][0] - seen[0][0])


def overload_when_full(gate, clock, after_s=0.0, retry_after_s=None):
    """Fill the gate and fail the last request admitted (``overload``) ``after_s`` later: at once, as an endpoint
    refusing one stream too many; after a minute, as a request that timed out (a collapse). The others come back
    without a sample. Returns how many were in flight (the level that failed)."""
    permits = []
    while True:
        permit = gate.try_acquire()
        if permit is None:
            break
        permits.append(permit)
    clock.t += after_s
    gate.release(permits[-1], "overload", retry_after_s=retry_after_s)
    for permit in permits[:-1]:
        gate.release(permit, "ignore")
    return len(permits)


def hosted_lengths(rng):
    """A hosted API's answer lengths: log-normal around 300 tokens, from 5 to 3000."""
    return int(min(3000, max(5, rng.lognormvariate(math.log(300), 1.0))))


def drive_hosted(seed, seconds, cap):
    """``drive`` against a hosted API from a cold start at 16: per-stream speed independent of the load (60 tok/s),
    streams x/÷1.6 apart, hosted_lengths behind a 0.8 s time to first token, a hidden cap of CAP."""
    clock = Clock()
    gate = eh.AdaptiveGate(16, 1, 512, clock=clock, drain_s=5.0)
    return drive(gate, clock, lambda c: 60.0, seconds, tokens=hosted_lengths, seed=seed, ttft_s=0.8, cap=cap,
                 spread=0.5)


class TestGradientLimit(unittest.TestCase):
    def test_limit_grows_to_the_cap_when_per_stream_speed_holds(self):
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 256, clock=clock)
        seen = drive(gate, clock, lambda c: 50.0, 600)
        self.assertEqual(max(l for _, l in seen), 256)
        self.assertEqual(seen[-1][1], 256)

    def test_limit_shrinks_when_per_stream_speed_falls_with_load(self):
        # beyond 16 streams every extra stream costs throughput (it falls as C^-0.5): the best concurrency is 16
        clock = Clock()
        gate = eh.AdaptiveGate(64, 1, 512, clock=clock)
        speed = lambda c: 50.0 if c <= 16 else 50.0 * (16.0 / c) ** 1.5
        seen = drive(gate, clock, speed, 3000)
        late = [l for t, l in seen if t > 1500]
        self.assertLess(sum(late) / len(late), 40)
        self.assertGreater(sum(late) / len(late), 6)

    def test_limit_holds_at_a_knee_without_swinging_past_it_and_back(self):
        # flat per-stream speed up to the knee, then thrashing (throughput falls): the limit settles near the
        # knee and stays there, instead of cutting far below it and jumping far above it again
        for knee in (8, 16, 32):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 512, clock=clock)
            seen = drive(gate, clock, lambda c, k=knee: 50.0 if c <= k else 50.0 * (k / c) ** 1.5, 3000)
            late = [l for t, l in seen if t > 1500]
            self.assertLessEqual(max(late), 1.5 * knee, knee)
            self.assertGreaterEqual(min(late), 0.6 * knee, knee)

    def test_limit_does_not_drift_upward_on_a_throughput_plateau(self):
        # past 24 streams per-stream speed falls as 1/C: aggregate throughput is flat, more streams buy nothing
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 512, clock=clock)
        speed = lambda c: 50.0 if c <= 24 else 50.0 * 24.0 / c
        seen = drive(gate, clock, speed, 3000)
        late = [l for t, l in seen if t > 1500]
        self.assertLess(max(late), 3 * 24)
        self.assertLess(sum(late) / len(late), 2 * 24)

    def test_a_length_heavy_mix_does_not_read_as_congestion(self):
        # 70% short and 30% very long answers on a server that scales perfectly: the limit must still climb
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 256, clock=clock)
        mix = lambda rng: rng.randint(20, 80) if rng.random() < 0.7 else rng.randint(2000, 6000)
        seen = drive(gate, clock, lambda c: 40.0, 4000, tokens=mix)
        self.assertGreaterEqual(seen[-1][1], 128)

    def test_bounds_hold_whatever_the_speeds(self):
        clock = Clock()
        gate = eh.AdaptiveGate(8, 4, 40, clock=clock)
        rng = random.Random(5)
        seen = drive(gate, clock, lambda c: rng.choice([1.0, 500.0, 50.0 / c]), 2000)
        self.assertTrue(all(4 <= l <= 40 for _, l in seen))
        self.assertEqual(gate.in_flight, 0)

    def test_noisy_windows_neither_cut_nor_fence_in_a_limit_that_speed_does_not_depend_on(self):
        # a hosted API: per-stream speed does not depend on the load, but streams differ (x/÷1.6 in speed, lengths
        # from 5 to 3000 tokens behind a 0.8 s time to first token), and a hidden cap refuses the 41st stream;
        # the limit must stay near the cap, not be walked down by windows that merely differ by chance
        for seed in range(1, 9):
            seen = drive_hosted(seed, 3000, cap=40)
            late = [(t, l) for t, l in seen if t > 600]
            mean = time_mean(late)
            self.assertGreaterEqual(mean, 30, seed)
            self.assertGreaterEqual(min(l for _, l in late), 12, seed)

    def test_a_cold_start_climbs_a_noisy_hosted_api_to_its_cap_within_a_few_windows(self):
        # the hosted API above with a cap of 64, from a cold start at 16: windows of seconds whose speeds differ by
        # x2.5 by chance read as no evidence either way; a probe's +10% a window took 55-107 s (and on one seed
        # never) to reach 56 streams, ~2% of a 9-minute run (gate_sim --quota's hosted scenarios). Until evidence
        # says no (a significant fall, a plateau, a refusal, an overload) the cold start climbs by first_step
        for seed in range(1, 11):
            seen = drive_hosted(seed, 120, cap=64)
            reached = next((t for t, l in seen if l >= 56), math.inf)
            self.assertLess(reached, 45.0, seed)

    def test_the_climb_ends_once_speed_per_stream_falls_with_the_load(self):
        # the climb is for an endpoint whose speed per stream does not depend on our load. An engine sharing its
        # capacity among our streams (60 / (1 + (C/16)^2) tok/s each: throughput peaks at 16 streams), behind the
        # hosted API's noise (lengths, x/÷1.6 streams, 0.8 s to first token) that makes many windows no evidence:
        # once a window runs clearly slower than the first (x0.7), no window climbs by first_step any more (it
        # climbed on from 76 to 108 streams on seed 3, and in gate_sim's agent family S4 small-cache-larger it took
        # the model gate to where a slow window then walked it down: efficiency 0.946 -> 0.934)
        climbs = 0
        for seed in range(1, 9):
            clock = Clock()
            gate = eh.AdaptiveGate(4, 1, 512, clock=clock, drain_s=5.0)
            gate._algorithm.trace = []
            drive(gate, clock, lambda c: 60.0 / (1.0 + (c / 16.0) ** 2), 300, tokens=hosted_lengths, seed=seed,
                  ttft_s=0.8, spread=0.5)
            judged = [w for w in gate._algorithm.trace if w[3] is not None]
            first_s = judged[0][2]
            slow = next(i for i, w in enumerate(judged) if w[2] < 0.7 * first_s)
            late = [w for w in judged[slow + 1:] if w[3] == gate._algorithm.first_step]
            self.assertEqual(late, [], seed)
            climbs += sum(1 for w in judged[:slow + 1] if w[3] == gate._algorithm.first_step)
        self.assertGreater(climbs, 8)  # it did climb while speed held

    def test_a_model_gate_behind_a_session_gate_does_not_climb(self):
        # an agent run's session gate ramps the load itself; the model gate's climb set its limit where slow windows
        # walked it down (gate_sim's agent family). The hosted API of the climb's test: with a session gate in front
        # only the first window steps by first_step; without, most runs climb (the cold start's test)
        alone = 0
        for seed in range(1, 7):
            for sessions in (False, True):
                clock = Clock()
                gate = eh.AdaptiveGate(16, 1, 512, clock=clock, drain_s=5.0)
                if sessions:
                    eh.SessionGate(gate, clock=clock)
                gate._algorithm.trace = []
                drive(gate, clock, lambda c: 60.0, 120, tokens=hosted_lengths, seed=seed, ttft_s=0.8, cap=64,
                      spread=0.5)
                steps = [w[3] for w in gate._algorithm.trace if w[3] is not None]
                climbs = sum(1 for st in steps[1:] if st == gate._algorithm.first_step)
                if sessions:
                    self.assertEqual(climbs, 0, seed)
                else:
                    alone += climbs
        self.assertGreater(alone, 6)

    def test_shocks_shared_by_a_whole_window_are_learned_as_noise_not_read_as_knees(self):
        # continuous batching far below its knee (one more stream still pays up to ~360 streams, the bound is
        # 128), but every 5 s all streams slow down or speed up together by a random x/÷1.13 (a long prompt's
        # prefill, a preemption wave): inside a window the requests agree, so only how far windows land from the
        # fit shows that noise; unlearned, single shocked windows read as knees and cut the limit to 15-50
        for seed in range(1, 7):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 128, clock=clock)
            rng, shocks = random.Random(seed), {}

            def speed(c):
                slot = int(clock.t / 5.0)
                if slot not in shocks:
                    shocks[slot] = math.exp(rng.gauss(0.0, 0.12))
                return shocks[slot] / (0.020 + 0.0005 * c)

            seen = drive(gate, clock, speed, 3000, tokens=lambda r: r.randint(100, 300), seed=seed)
            late = [(t, l) for t, l in seen if t > 1000]
            mean = time_mean(late)
            self.assertGreaterEqual(mean, 110, seed)
            self.assertGreaterEqual(min(l for _, l in late), 48, seed)

    def test_the_limit_does_not_grow_while_streams_are_too_slow_for_a_longest_answer_to_finish(self):
        # continuous batching: speed 1/(20 ms + 0.5 ms per stream); left alone the gradient settles near 360
        # streams (where one more stream stops paying), but 3% of the answers are 6000 tokens (max_tokens), and at
        # 20 tok/s (60 streams) those take longer than the 300 s request timeout: past that speed it must not grow
        speed = lambda c: 1.0 / (0.020 + 0.0005 * c)
        mix = lambda rng: 6000 if rng.random() < 0.03 else 200
        highs = {}
        for max_tokens in (None, 6000):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 512, clock=clock, max_tokens=max_tokens, deadline_s=300.0)
            seen = drive(gate, clock, speed, 3000, tokens=mix)
            highs[max_tokens] = max(l for t, l in seen if t > 1000)
        self.assertLess(highs[6000], 130)  # (one ramp step from just above the floor may pass it, no more)
        self.assertGreater(highs[None], 200)  # (the floor is what holds it)

    def test_a_small_window_whose_first_answers_settle_the_way_is_judged_without_waiting_for_more(self):
        # after the first probe (16 -> 22 streams) the next window is small (9 requests) and waiting for its fifth
        # answer costs a whole request latency at a low limit. Three answers that already show the speed holding
        # (or collapsing) decide it; three that leave e near e* (speed falling as C^-0.9: e = 0.1) do not
        def second_window(exponent):
            limit = eh.GradientLimit(16, 1, 512)
            rng = random.Random(7)
            start = first_probe(limit, rng)
            self.assertGreater(start, 16)
            judged_after = None
            for i, stamp in enumerate(next_window(limit)):
                speed = 50.0 * (start / 16.0) ** -exponent * rng.lognormvariate(0.0, 0.03)
                limit.on_sample(20.0 + i, stamp, speed, start, 4.0)
                if limit.limit != start:
                    judged_after = i + 1
                    break
            return judged_after, limit.limit / start

        judged_after, ratio = second_window(0.0)  # speed holds: grow
        self.assertEqual(judged_after, 3)
        self.assertGreater(ratio, 3)
        judged_after, ratio = second_window(3.0)  # speed collapses: cut
        self.assertEqual(judged_after, 3)
        self.assertLess(ratio, 1)
        judged_after, _ = second_window(0.9)  # e = e*: no decision on three answers
        self.assertGreaterEqual(judged_after, 5)

    def test_only_a_burst_that_at_least_doubles_the_load_belongs_to_no_window(self):
        # the admissions that fill new headroom all start at once: after a ramp step (x4 and more) that is a wave of
        # prefills, a transient no window should be judged by; after a probe (+42%) they are ordinary requests,
        # and making the next window wait for them to be replaced first costs a request latency at a low limit
        limit = eh.GradientLimit(16, 1, 512)
        rng = random.Random(3)
        probe = first_probe(limit, rng)
        self.assertTrue(16 < probe < 32, probe)
        stamps = [limit.window_stamp() for _ in range(8)]
        self.assertNotIn(0, stamps)  # the probe's new streams are the next window's first requests
        for i, stamp in enumerate(stamps + next_window(limit)):
            limit.on_sample(20.0 + i, stamp, 50.0 * rng.lognormvariate(0.0, 0.03), probe, 4.0)
            if limit.limit != probe:
                break
        self.assertGreater(limit.limit, 2 * probe)  # speed held: a ramp step
        burst = int(limit.limit) - int(probe)
        stamps = [limit.window_stamp() for _ in range(burst + 1)]
        self.assertEqual(stamps[:burst], [0] * burst)
        self.assertNotEqual(stamps[-1], 0)

    def test_discovered_limit_is_reported_after_saturated_windows(self):
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 64, clock=clock)
        drive(gate, clock, lambda c: 50.0, 600)
        self.assertEqual(gate.discovered_limit, 64)

    def test_the_discovered_limit_is_where_the_limit_circled_not_where_it_stopped(self):
        # a sharp knee at 8 streams (throughput falls gently past it, as on bench/gate_http.py's mock): the limit
        # circles 6..16, probing either side; what a later run starts from is the median of the last saturated
        # windows' outcomes, in 8..11, not wherever the last probe happened to leave it (7 or 16 on some seeds)
        speed = lambda c: 100.0 if c <= 8 else 100.0 * 8 / c / (1 + 0.15 * (c - 8) / 8)
        for seed in range(1, 9):
            for seconds in (200, 300):
                clock = Clock()
                gate = eh.AdaptiveGate(16, 1, 512, clock=clock)
                drive(gate, clock, speed, seconds, tokens=lambda r: r.randint(40, 80), seed=seed)
                self.assertTrue(8 <= gate.discovered_limit <= 11, (seed, seconds, gate.discovered_limit))


def feed(limit, now, load, speed):
    """One window straight into a limit algorithm: requests admitted until the window closes (after the burst that
    fills new headroom, which belongs to no window), then all back at ``speed`` tokens/s having lived under ``load``
    streams (no gate: the loads are what the test says). Returns the limit."""
    for stamp in next_window(limit):
        limit.on_sample(now, stamp, speed, load, 4.0)
    return limit.limit


def next_window(limit):
    """The stamps of the requests admitted into the window now open until it closes (after a burst that belongs to
    no window)."""
    stamps = []
    for _ in range(10000):
        stamp = limit.window_stamp()
        if stamp:
            stamps.append(stamp)
        elif stamps:
            break
    return stamps


def first_probe(limit, rng):
    """A fresh GradientLimit(16, ...) with its cold-start window back (6 of 16 answers at ~50 tok/s, a 3% spread,
    under 16 streams): it takes its first probe step. Returns the limit it stepped to."""
    stamps = [limit.window_stamp() for _ in range(16)]
    for i, stamp in enumerate(stamps[:6]):
        limit.on_sample(5.0 + i, stamp, 50.0 * rng.lognormvariate(0.0, 0.03), 16.0, 4.0)
    return limit.limit


class TestEndpointChanges(unittest.TestCase):
    def test_a_window_as_loaded_as_the_last_and_much_slower_is_the_endpoint_changing(self):
        # the limit climbed to its bound (300) while speed held; then a window at the same load (up to rounding in
        # its time-average) comes back half as fast: that pair shows no slope, it is the endpoint that changed
        # (capacity taken away), so the limit probes down instead of growing on the slope of the old endpoint
        limit = eh.GradientLimit(16, 1, 300)
        for t in range(4):
            feed(limit, 10.0 * t, limit.limit, 50.0)  # the gate full, speed holding
        self.assertEqual(limit.limit, 300)
        self.assertLess(feed(limit, 40.0, 300.0 * (1 + 1e-12), 25.0), 300)

    def test_an_endpoint_that_got_faster_is_probed_without_waiting_out_an_old_overload(self):
        # a collapse (timeout) put the limit under a 2-minute hold below the level that failed; then the endpoint
        # gets three times faster at the same load (capacity given back): that overload said nothing about this
        # endpoint, so the limit creeps past the level at once instead of sitting out the hold
        limit = eh.GradientLimit(16, 1, 4096)
        for t in range(3):
            feed(limit, float(t), limit.limit, 50.0)
        limit.on_overload(10.0, 30.0, limit.limit)  # held until 10 + 4 x 30 s
        t = 40.0
        while True:  # back up to just under the level, where it holds
            held = limit.limit
            feed(limit, t, limit.limit, 50.0)
            t += 5.0
            if limit.limit == held:
                break
        for _ in range(4):
            feed(limit, t, limit.limit, 150.0)
            t += 5.0
        self.assertLess(t, 130.0)  # (all of it within the hold)
        self.assertGreater(limit.limit, 1.1 * held)

    def test_a_brownout_is_not_read_as_congestion(self):
        # past 32 streams aggregate throughput is flat; for 40 s everything runs 3x slower whatever the load (a
        # brownout, which cutting the limit cannot help): the limit must stay where it was
        for start in (500.0, 600.0, 700.0):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 512, clock=clock)

            def speed(c, start=start):
                s = 50.0 if c <= 32 else 50.0 * 32.0 / c
                return s / 3.0 if start <= clock.t < start + 40.0 else s
            seen = drive(gate, clock, speed, start + 300.0)
            before = min(l for t, l in seen if 300 < t < start)
            after = min(l for t, l in seen if t >= start)
            self.assertGreater(before, 16)
            self.assertGreaterEqual(after, 0.85 * before, start)

    def test_the_limit_sits_under_an_overload_level_while_probing_it_would_cost_another_pause(self):
        clock = Clock()
        gate = eh.AdaptiveGate(40, 1, 5000, clock=clock, drain_s=30.0)
        while gate.limit <= 40:  # climb a little
            drive(gate, clock, lambda c: 50.0, 1)
        level = gate.limit
        self.assertGreater(level, 40)
        self.assertLess(level, 1000)
        overload_when_full(gate, clock, after_s=60.0)  # a timeout, no Retry-After: a 30 s pause
        cut_at = clock.t
        seen = drive(gate, clock, lambda c: 50.0, 400)
        hold_end = cut_at + 30.0 * (1 + 3.0)
        self.assertLessEqual(max(l for t, l in seen if t < hold_end), level)
        self.assertGreaterEqual(max(l for t, l in seen if t < hold_end), int(0.9 * level))  # just under it
        self.assertGreater(seen[-1][1], level)  # afterwards it creeps past and finds the room again


    def test_the_level_remembered_is_the_load_that_overloaded_not_the_limit_grown_past_it(self):
        # 64 streams is all the endpoint takes while the limit had grown to 90: the 65th fails (refused at once,
        # or timed out a minute later): the limit must then sit under 64, not under 90. Refused: at once, and it
        # stays there while the cap holds (each probe past it one refusal); timed out: while probing again would
        # cost another pause
        for after_s in (0.0, 60.0):
            clock = Clock()
            gate = eh.AdaptiveGate(90, 1, 512, clock=clock, drain_s=30.0)
            permits = [gate.try_acquire() for _ in range(65)]
            clock.t += after_s
            gate.release(permits[-1], "overload")  # the 65th
            for permit in permits[:-1]:
                gate.release(permit, "ignore")
            cut_at = clock.t
            seen = drive(gate, clock, lambda c: 50.0, 300, cap=64)
            during = [l for t, l in seen if t < cut_at + 30.0 * 4]
            self.assertLessEqual(max(during), 66 if after_s == 0 else 64, after_s)  # (a probe is one stream)
            self.assertGreaterEqual(min(during) if after_s == 0 else max(during), 56, after_s)  # not far below

    def test_probing_a_hidden_cap_costs_one_refusal_a_probe_and_no_throughput(self):
        # a hidden cap of 40 streams answers the 41st with 429 and no Retry-After: the limit sits at the cap and
        # probes past it after half a request's latency without a refusal (a cap raised again is found within
        # seconds): each probe is one refused request and a pause only until the next answer frees a slot
        results = {}
        for name in ("adaptive", "fixed"):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 512, clock=clock, drain_s=30.0) if name == "adaptive" else \
                eh.AdaptiveGate(40, 1, 40, clock=clock, algorithm=eh.FixedLimit(40))
            refusals = []
            gate.on_event = lambda ev: refusals.append(ev) if ev["type"] == "drain" else None
            seen = drive(gate, clock, lambda c: 50.0, 2000, cap=40)
            results[name] = (len(seen), len(refusals))
        answers, refused = results["adaptive"]
        self.assertGreaterEqual(answers, 0.97 * results["fixed"][0])  # (requests take ~4 s: 20,000 answers)
        self.assertLessEqual(refused, 2000 / (0.5 * 4.0) * 1.2)  # one probe per half latency, at most
        self.assertGreaterEqual(refused, 100)  # it does probe (restored capacity must be found)

    def test_a_refusal_on_arrival_is_not_cut_for_but_a_collapse_is(self):
        # the same level fails twice over: refused at once (a stream cap's or a quota's 429: the server did no
        # work, the level is exactly what it takes now) and timed out after a minute (a collapse): the first puts
        # the limit just under the level, the second cuts it and comes back halfway to it
        for retry_after_s in (None, 2.0):
            after = {}
            for after_s in (0.0, 60.0):
                clock = Clock()
                gate = eh.AdaptiveGate(40, 1, 200, clock=clock)
                drive(gate, clock, lambda c: 50.0, 30)  # requests take ~4 s
                level = overload_when_full(gate, clock, after_s=after_s, retry_after_s=retry_after_s)
                after[after_s] = gate.limit
                seen = drive(gate, clock, lambda c: 50.0, 120)
                after[after_s, "next"] = next((l for _, l in seen if l != after[after_s]), None)
            self.assertEqual(after[0.0], level - 1)
            self.assertEqual(after[60.0], int(0.7 * level))
            self.assertLess(after[60.0, "next"], 0.9 * level)  # (halfway back)

    def test_a_hidden_stream_cap_keeps_the_limit_at_the_cap(self):
        # a hosted API refuses the 41st stream at once (429, no Retry-After) and never slows down: once found,
        # the limit stays at the cap (each probe past it costs one refusal, not a cut and a long pause)
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 512, clock=clock, drain_s=30.0)
        seen = drive(gate, clock, lambda c: 50.0, 2000, cap=40)
        reached = next(t for t, l in seen if l >= 40)
        late = [l for t, l in seen if t > reached]
        self.assertGreaterEqual(min(late), 38)
        self.assertLessEqual(max(late), 44)

    def test_the_pause_after_an_overload_is_not_read_as_slow_requests(self):
        # one overload, then a 30 s pause; the endpoint's speed never changes: the first window after the pause
        # must not count the pause as its requests' slowness (a second cut on a healthy endpoint)
        for drain in (10.0, 30.0):
            clock = Clock()
            gate = eh.AdaptiveGate(64, 1, 512, clock=clock, drain_s=drain)
            drive(gate, clock, lambda c: 50.0, 60)
            overload_when_full(gate, clock, after_s=60.0)
            cut = gate.limit
            seen = drive(gate, clock, lambda c: 50.0, 200)
            self.assertGreaterEqual(min(l for _, l in seen), cut, drain)


def drive_quota(gate, clock, seconds, *, quota=lambda t: 120, cap=None, latency=lambda t: 5.0, seed=1,
                retry_after_s=None):
    """Keep the gate full against a hosted API that states no limits: a request the server takes lasts
    latency(t) seconds (times a +-20% spread; per-stream speed independent of load); it takes at most quota(t)
    requests in any trailing minute (a sliding-window log) and, with ``cap``, at most that many at once; anything
    past either is refused 50 ms later (429, with ``retry_after_s`` or none). Returns (the times of the requests
    it took, the number it refused, the (time, limit) after each event)."""
    rng = random.Random(seed)
    heap, n, log, taken, refused, seen, active = [], 0, collections.deque(), [], 0, [], 0
    end = clock.t + seconds
    while clock.t < end:
        while True:
            permit = gate.try_acquire()
            if permit is None:
                break
            n += 1
            while log and log[0] <= clock.t - 60.0:
                log.popleft()
            if len(log) >= quota(clock.t) or (cap is not None and active >= cap):
                heapq.heappush(heap, (clock.t + 0.05, n, permit, False))
                continue
            log.append(clock.t)
            taken.append(clock.t)
            active += 1
            heapq.heappush(heap, (clock.t + latency(clock.t) * rng.uniform(0.8, 1.2), n, permit, True))
        waits = [w for w in (gate.draining_until(), gate.paced_until()) if w is not None and w > clock.t]
        nxt = min([heap[0][0]] if heap else [] + [max(waits)] if waits else [clock.t + 1.0])
        if waits and (not heap or max(waits) < heap[0][0]):
            clock.t = max(waits)
            continue
        if not heap:
            clock.t = nxt
            continue
        clock.t, _, permit, ok = heapq.heappop(heap)
        if ok:
            active -= 1
            gate.release(permit, "ok", 200)
        else:
            refused += 1
            gate.release(permit, "overload", retry_after_s=retry_after_s)
        seen.append((clock.t, gate.limit))
    return taken, refused, seen


def taken_between(taken, a, b):
    return sum(1 for t in taken if a <= t < b)


class TestRefusals(unittest.TestCase):
    """Issue 54: an endpoint that answers 429 and states no limits (a quota of requests a minute, a hard cap on
    streams). A refusal at a load the endpoint accepted lately is a rate: admissions are paced at the rate it
    accepted, the limit never falls below what it accepted (Little's law), and after half a latency without a
    refusal the limit grows by one stream per answer."""

    def test_a_rate_quota_is_used_whole_with_about_the_refusals_of_its_best_fixed_limit(self):
        # 120 requests a minute at ~5 s each: 10 streams in flight use it whole (Little's law). A cold start's
        # first burst fills the window in seconds, and a sliding window frees those slots a minute later all at
        # once: whoever takes them refuses itself the minute after (fixed 10 too). The reference rule through the
        # same gate (no pace, no Little's-law floor) takes no more of the quota and is refused five times as often
        got = {}
        for name in ("adaptive", "fixed", "aimd"):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 512, clock=clock) if name == "adaptive" else \
                eh.AdaptiveGate(10, 1, 10, clock=clock, algorithm=eh.FixedLimit(10)) if name == "fixed" else \
                eh.AdaptiveGate(16, 1, 512, clock=clock, algorithm=eh.AIMDLimit(16, 1, 512))
            taken, refused, seen = drive_quota(gate, clock, 600, quota=lambda t: 120)
            got[name] = (taken_between(taken, 60, 600), refused, seen)
        taken, refused, seen = got["adaptive"]
        self.assertGreaterEqual(taken, 0.99 * 120 * 9)
        self.assertLess(refused, 1.1 * got["fixed"][1])
        self.assertLess(refused, 0.25 * got["aimd"][1])
        self.assertGreaterEqual(taken, got["aimd"][0])
        reached = next(i for i, (_, l) in enumerate(seen) if l >= 10)
        self.assertGreaterEqual(min(l for _, l in seen[reached:]), 0.6 * 10)

    def test_a_halved_quota_holds_the_rate_it_accepts_and_a_restored_one_is_found_within_seconds(self):
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 512, clock=clock)
        quota = lambda t: 60 if 200 <= t < 400 else 120  # noqa: E731
        taken, refused, seen = drive_quota(gate, clock, 600, quota=quota)
        self.assertGreaterEqual(taken_between(taken, 260, 400), 0.95 * 60 * 140 / 60)  # the half, used whole
        halved = [l for t, l in seen if 260 <= t < 400]
        self.assertGreaterEqual(min(halved), 0.6 * 5)  # (5 streams carry the half)
        back = next(t for t in range(400, 600) if taken_between(taken, t, t + 10) >= 0.9 * 20)
        self.assertLessEqual(back - 400, 15)  # (three latencies)

    def test_a_quartered_quota_keeps_the_streams_it_accepted_while_its_pace_holds_the_rate(self):
        # 600 requests a minute at ~5 s each (50 streams), quartered for 200 s: 12.5 streams carry the quarter. Its
        # refusals fall at loads below what it accepted a minute earlier (a rate): the pace holds the rate, and the
        # limit keeps up to 1.5x the streams accepted (was: cut to what was accepted, 11-12 on these seeds)
        for seed in (1, 2, 3):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 512, clock=clock)
            quota = lambda t: 150 if 200 <= t < 400 else 600  # noqa: E731
            taken, refused, seen = drive_quota(gate, clock, 600, quota=quota, seed=seed)
            self.assertGreaterEqual(taken_between(taken, 260, 400), 0.95 * 150 * 140 / 60, seed)
            self.assertGreaterEqual(min(l for t, l in seen if 260 <= t < 400), 1.2 * 12.5, seed)

    def test_slower_answers_under_a_quota_raise_the_limit_rather_than_cut_it(self):
        # a brownout: every request 3x slower for a minute, no errors: a quota-bound client needs three times the
        # streams to hold its rate (Little's law), up to the endpoint's cap of 24
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 512, clock=clock)
        latency = lambda t: 15.0 if 200 <= t < 260 else 5.0  # noqa: E731
        taken, refused, seen = drive_quota(gate, clock, 400, quota=lambda t: 120, cap=24, latency=latency)
        before = min(l for t, l in seen if 150 <= t < 200)
        during = [l for t, l in seen if 200 <= t < 280]
        self.assertGreaterEqual(min(during), before)
        self.assertGreaterEqual(max(during), 20)

    def test_what_refused_is_told_from_the_loads_the_endpoint_accepted(self):
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 512, clock=clock)
        self.assertIsNone(gate._refused_by(0.0, 5))  # nothing accepted yet: no telling
        permits = [gate.try_acquire() for _ in range(10)]
        clock.t = 5.0
        for p in permits:
            gate.release(p, "ok", 100)
        self.assertEqual(gate._refused_by(5.0, 11), "cap")  # more than ever accepted
        self.assertEqual(gate._refused_by(5.0, 9), "cap")  # (within the loads' own noise)
        self.assertEqual(gate._refused_by(5.0, 8), "rate")  # clearly less than it accepted
        self.assertIsNone(gate._refused_by(70.0, 8))  # a minute later the evidence is gone

    def test_a_caps_retry_after_holds_that_request_only_and_a_rates_paces_every_admission(self):
        for level, kind in ((11, "cap"), (4, "rate")):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 512, clock=clock)
            permits = [gate.try_acquire() for _ in range(10)]
            clock.t = 5.0
            for p in permits:
                gate.release(p, "ok", 100)
            permits = [gate.try_acquire() for _ in range(level)]
            gate.release(permits[-1], "overload", retry_after_s=5.0)  # refused at once, with Retry-After
            if kind == "cap":  # the next answer frees a slot: admission resumes then, not in 5 s
                self.assertIsNone(gate.try_acquire())
                gate.release(permits[0], "ok", 100)
                self.assertIsNotNone(gate.try_acquire())
                self.assertIsNone(gate.paced_until())
            else:  # a rate: the refused request waits out its Retry-After; the others one gap of the pace
                gap = 5.0 / (13 * 1.05)  # 13 taken in its first 5 s, plus 5%
                self.assertAlmostEqual(gate.draining_until(), 5.0 + gap, places=6)
                gate.release(permits[0], "ok", 100)
                self.assertIsNone(gate.try_acquire())  # (an answer does not end a rate's pause)
                clock.t = 5.0 + gap
                self.assertIsNotNone(gate.try_acquire())
                self.assertIsNone(gate.try_acquire())  # paced: one admission per gap
                self.assertAlmostEqual(gate.paced_until(), 5.0 + 2 * gap, places=6)
                clock.t = 5.0 + 2 * gap
                self.assertIsNotNone(gate.try_acquire())
                self.assertIsNone(gate.try_acquire())
                clock.t = 5.0 + 0.45 * gate._ok_latency
                gate.release(permits[1], "ok", 100)
                self.assertGreater(gate._pace_gap, 0)  # (an answer, but not yet quiet)
                clock.t = 5.0 + 0.55 * gate._ok_latency  # half a request's latency with no refusal: the pace ends
                gate.release(permits[2], "ok", 100)
                self.assertEqual(gate._pace_gap, 0)
                self.assertIsNotNone(gate.try_acquire())
                self.assertIsNotNone(gate.try_acquire())

    def test_a_refusal_with_nothing_left_in_flight_pauses_nothing(self):
        # refused at the only load it ever had (a cap, or a rate too small to tell): its pause lasts until a
        # request finishes, and with none in flight none will; admission goes on at once (issue 54: over HTTP a
        # quota of 2 a second at 0.4 s a request stood 30 s idle at a run's tail)
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 512, clock=clock)
        for _ in range(3):
            p = gate.try_acquire()
            clock.t += 0.4
            gate.release(p, "ok", 10)
        p = gate.try_acquire()
        clock.t += 0.01
        gate.release(p, "overload")  # refused at once, no Retry-After, at a load of 1
        self.assertIsNotNone(gate.try_acquire())

    def test_a_refused_request_comes_back_to_the_gate_at_once_when_its_limit_answers_refusals(self):
        """The retry's wait after a 429 (ModelClient._backoff_s, no request sent): the default limit, once the
        endpoint accepted requests, answers refusals itself (limit, pace), so the request waits only
        REFUSED_BACKOFF_S (or a Retry-After); a fixed limit, or nothing accepted yet, keeps the doubling backoff."""
        err = eh.ModelAPIError("HTTP 429", kind="overload", status=429)
        for name in ("adaptive", "fixed", "adaptive-cold"):
            gate = eh.AdaptiveGate(16, 1, 512) if name != "fixed" else eh.AdaptiveGate(algorithm=eh.FixedLimit(8))
            if name != "adaptive-cold":
                gate.release(gate.try_acquire(), "ok", 10)
            c = eh.ModelClient(eh.ClientConfig(base_url="http://127.0.0.1:9/v1", model="m"), gate=gate)
            waits = [c._backoff_s(5, err) for _ in range(20)]
            if name == "adaptive":
                self.assertLessEqual(max(waits), eh.REFUSED_BACKOFF_S)
                ra = eh.ModelAPIError("HTTP 429", kind="overload", status=429, retry_after_s=3.0)
                self.assertEqual(c._backoff_s(5, ra), 3.0)
            else:
                self.assertGreaterEqual(min(waits), 0.5 * eh.RETRY_BASE_S * 16, name)


class TestAIMDLimit(unittest.TestCase):
    def test_one_more_per_success_at_load_and_a_tenth_less_per_overload(self):
        # Netflix concurrency-limits' AIMDLimit test expectations: 20 + a success at 10 in flight -> 21;
        # 30 + a drop -> 27; a success with fewer than half in flight leaves it
        limit = eh.AIMDLimit(20, 1, 200)
        self.assertEqual(limit.on_sample(0.0, 0, 10.0, 10.0), 21)
        self.assertEqual(limit.on_sample(0.0, 0, 10.0, 5.0), 21)
        limit = eh.AIMDLimit(30, 1, 200)
        self.assertEqual(limit.on_overload(0.0, refused=True), 27)
        self.assertEqual(eh.AIMDLimit(200, 1, 200).on_sample(0.0, 0, 1.0, 200.0), 200)


class TestOverloadAndDrain(unittest.TestCase):
    def test_one_overload_cuts_once_per_epoch_and_late_failures_of_older_permits_do_not_cut_again(self):
        clock = Clock()
        gate = eh.AdaptiveGate(20, 1, 100, clock=clock)
        permits = [gate.try_acquire() for _ in range(20)]
        self.assertTrue(all(permits))
        clock.t = 60.0  # timed out (an overload refused at once cuts nothing: see TestEndpointChanges)
        gate.release(permits[0], "overload")
        self.assertEqual(gate.limit, 14)  # 20 x 0.7
        for p in permits[1:]:
            clock.t += 0.5
            gate.release(p, "overload")
        self.assertEqual(gate.limit, 14)
        self.assertEqual(gate.in_flight, 0)
        # a permit admitted after the cut belongs to the new epoch: its overload cuts again
        clock.t = 100.0
        fresh = gate.try_acquire()
        clock.t = 160.0
        gate.release(fresh, "overload")
        self.assertEqual(gate.limit, 9)  # 14 x 0.7 = 9.8, rounded down

    def test_nothing_is_admitted_during_the_drain_and_admission_resumes_exactly_at_its_end(self):
        # a collapse (an overload after the server worked on it for 5 s: no refusal on arrival)
        clock = Clock()
        clock.t = 5.0
        gate = eh.AdaptiveGate(10, 1, 100, clock=clock, drain_s=30.0)
        p = gate.try_acquire()
        clock.t = 10.0
        gate.release(p, "overload")
        self.assertEqual(gate.draining_until(), 40.0)
        for t in (10.0, 25.0, 39.999):
            clock.t = t
            self.assertIsNone(gate.try_acquire(), t)
        clock.t = 40.0
        self.assertIsNotNone(gate.try_acquire())
        self.assertIsNone(gate.draining_until())

    def test_a_raised_quota_is_found_again_within_seconds(self):
        # a hosted quota lets 20 streams through, then 40 (another client stopped, a tier raised): its refusals
        # come back at once with Retry-After, a rate saying when to retry rather than a cap; the limit waits out
        # the pause only and probes past the old level in growing steps
        took = {}
        for retry_after_s in (2.0, None):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 512, clock=clock, drain_s=30.0)
            drive(gate, clock, lambda c: 50.0, 300, cap=20, retry_after_s=retry_after_s)
            raised = clock.t
            seen = drive(gate, clock, lambda c: 50.0, 600, cap=40, retry_after_s=retry_after_s)
            took[retry_after_s] = next(t for t, l in seen if l >= 36) - raised
        # found within a few latencies (~4 s each) either way: after half a latency with no refusal the limit
        # grows by one stream per answer (the rule held a cap's level for minutes before, issue 54)
        self.assertLess(took[2.0], 12)
        self.assertLess(took[None], 12)

    def test_a_refusal_pauses_until_a_request_succeeds_or_until_its_retry_after(self):
        # refused on arrival: without Retry-After the server is full for now, and the next success frees a slot;
        # with Retry-After the server said when: before any success with others in flight (no telling a cap from
        # a rate yet; a cap's Retry-After is its own request's) the pause ends at a success too (or at the
        # Retry-After, whichever comes first)
        for retry_after_s in (None, 5.0):
            clock = Clock()
            gate = eh.AdaptiveGate(10, 1, 100, clock=clock, drain_s=30.0)
            events = []
            gate.on_event = lambda ev: events.append(ev["type"])
            first, second = gate.try_acquire(), gate.try_acquire()
            gate.release(second, "overload", retry_after_s=retry_after_s)
            self.assertEqual(gate.draining_until(), clock.t + (30.0 if retry_after_s is None else 5.0))
            clock.t += 0.1
            self.assertIsNone(gate.try_acquire())
            gate.release(first, "ok", 100)
            self.assertEqual(events.count("drain_end"), 1)  # (the report's shading)
            self.assertIsNone(gate.draining_until())
            self.assertIsNotNone(gate.try_acquire())

    def test_a_rates_retry_after_is_the_refused_requests_own_and_the_pace_holds_the_others(self):
        # refused at a load clearly below one the endpoint accepted (a rate): admissions are paced at the rate it
        # accepted, and the others wait one gap of that pace, not the Retry-After (the refused request's client
        # waits that out): a cap lowered mid-run reads as a rate until its old loads age out, and a whole
        # Retry-After at each refusal left the freed slots empty (gate_sim SQ-P4r)
        clock = Clock()
        gate = eh.AdaptiveGate(10, 1, 100, clock=clock, drain_s=30.0)
        warm = [gate.try_acquire() for _ in range(10)]  # (10 accepted at once: a refusal at 2 in flight is a rate's)
        clock.t = 1.0
        for p in warm:
            gate.release(p, "ok", 100)
        first, second = gate.try_acquire(), gate.try_acquire()
        gate.release(second, "overload", retry_after_s=5.0)
        gap = 1.0 / (11 * (1.0 + gate.pace_margin))  # 12 admitted, 1 refused, over the 1 s since the first
        self.assertAlmostEqual(gate.draining_until(), 1.0 + gap, places=6)
        clock.t = 1.0 + 0.5 * gap
        self.assertIsNone(gate.try_acquire())
        clock.t = 1.0 + gap
        self.assertIsNotNone(gate.try_acquire())
        self.assertAlmostEqual(gate.paced_until(), 1.0 + 2 * gap, places=6)  # (the pace spaces the next ones)
        self.assertIsNone(gate.try_acquire())

    def test_a_caps_refusal_takes_the_limit_just_under_it_with_no_floor_of_what_was_accepted(self):
        # a hosted API's hidden stream cap of 48 (with and without Retry-After): refused at the most it accepted
        # lately, the limit goes one under the load the refusal met; the floor of what the last minute accepted
        # (Little's law, for a rate's refusals, where a slower stream needs more in flight) counted the cap's own
        # streams and their noise and held it over the cap, each probe refused again (before: 100 refusals
        # against 643 answers over two minutes, 24 now)
        for retry_after_s in (None, 1.0):
            clock = Clock()
            gate = eh.AdaptiveGate(48, 1, 512, clock=clock, drain_s=5.0)
            outcomes = []
            release = gate.release
            gate.release = lambda p, o, *a, **k: (outcomes.append((clock.t, o)), release(p, o, *a, **k))[1]
            seen = drive(gate, clock, lambda c: 60.0, 300, tokens=hosted_lengths, ttft_s=0.8, spread=0.5, cap=48,
                         retry_after_s=retry_after_s)
            late = [o for t, o in outcomes if t > 180]
            self.assertLess(late.count("overload"), 0.06 * late.count("ok"), retry_after_s)
            self.assertGreaterEqual(min(l for t, l in seen if t > 180), 46, retry_after_s)  # (and no deeper cut)

    def test_a_refusal_at_a_load_accepted_since_the_last_one_is_the_servers_race_not_a_lower_cap(self):
        # a server that counts a stream until its handler ends refuses a request sent the moment the answer
        # before it came back (bench/gate_http.py's mock at a cap of 8 did, every few seconds): a request admitted
        # since the last refusal was accepted at that load, so the limit keeps it (it fell to 7 each time, an
        # eighth of the throughput lost until the next probe); a refusal at a load none was accepted at since cuts
        clock = Clock()
        gate = eh.AdaptiveGate(9, 1, 100, clock=clock)
        held = [gate.try_acquire() for _ in range(9)]
        clock.t = 0.01
        gate.release(held.pop(), "overload")  # the 9th: refused at once, a cap of 8
        self.assertEqual(gate.limit, 8)
        for i in range(12):  # answers, each slot refilled at once (the new one admitted at 8)
            clock.t = 1.0 + 0.25 * i
            gate.release(held.pop(0), "ok", 100)
            held.append(gate.try_acquire())
            self.assertEqual(gate.in_flight, 8)  # (the limit probes past 8 meanwhile: a cap's refusals end that)
        clock.t = 4.0
        gate.release(held.pop(0), "ok", 100)
        racer = gate.try_acquire()  # sent at once: the server had not yet freed that slot
        clock.t = 4.01
        gate.release(racer, "overload")
        self.assertEqual(gate.limit, 8)
        # refused at 8 again, with nothing admitted since the last refusal accepted at 8: the cap is lower now
        clock.t = 4.02
        gate.release(held.pop(0), "ok", 100)  # (a slot frees: the pause a refusal holds ends)
        held.append(gate.try_acquire())
        again = gate.try_acquire()
        self.assertEqual(gate.in_flight, 8)
        clock.t = 4.03
        gate.release(again, "overload")
        self.assertLess(gate.limit, 8)

    def test_retry_after_shortens_the_drain_but_never_lengthens_it(self):
        clock = Clock()
        gate = eh.AdaptiveGate(10, 1, 100, clock=clock, drain_s=30.0)
        gate.release(gate.try_acquire(), "overload", retry_after_s=3.0)
        self.assertEqual(gate.draining_until(), 3.0)
        clock.t = 3.0
        gate.release(gate.try_acquire(), "overload", retry_after_s=999.0)
        self.assertEqual(gate.draining_until(), 33.0)

    def test_ignore_neither_samples_nor_cuts(self):
        clock = Clock()
        gate = eh.AdaptiveGate(10, 1, 100, clock=clock)
        for _ in range(50):
            gate.release(gate.try_acquire(), "ignore")
        self.assertEqual(gate.limit, 10)
        self.assertIsNone(gate.draining_until())

    def test_fixed_limit_never_moves_and_never_drains(self):
        clock = Clock()
        gate = eh.AdaptiveGate(5, 1, 5, clock=clock, algorithm=eh.FixedLimit(5))
        gate.release(gate.try_acquire(), "overload")
        self.assertEqual(gate.limit, 5)
        self.assertIsNone(gate.draining_until())
        drive(gate, clock, lambda c: 10.0, 100)
        self.assertEqual(gate.limit, 5)

    def test_an_algorithm_s_limit_outside_the_gate_s_bounds_is_clamped_to_them(self):
        clock = Clock()
        self.assertEqual(eh.AdaptiveGate(4, 2, 8, clock=clock, algorithm=eh.FixedLimit(1)).limit, 2)
        gate = eh.AdaptiveGate(4, 2, 8, clock=clock, algorithm=eh.FixedLimit(20))
        self.assertEqual(gate.limit, 8)
        permits = [gate.try_acquire() for _ in range(9)]
        self.assertEqual((gate.in_flight, permits[-1]), (8, None))
        for permit in permits[:-1]:  # each success passes the algorithm's 20 through the gate's one door again
            gate.release(permit, "ok", 100)
        self.assertEqual((gate.limit, gate.in_flight), (8, 0))

    def test_limit_events_are_reported(self):
        clock = Clock()
        gate = eh.AdaptiveGate(10, 1, 100, clock=clock)
        events = []
        gate.on_event = events.append
        gate.release(gate.try_acquire(), "overload")
        self.assertEqual([e["type"] for e in events], ["drain", "limit"])
        self.assertEqual(events[1]["previous"], 10)

    def test_double_release_is_ignored(self):
        gate = eh.AdaptiveGate(2, 1, 2, algorithm=eh.FixedLimit(2))
        p = gate.try_acquire()
        gate.release(p)
        gate.release(p)
        self.assertEqual(gate.in_flight, 0)


def drive_slots(gate, clock, slots, seconds, *, service=lambda rng: rng.uniform(0.3, 0.7), seed=1, ttft_s=0.01,
                stream=True, metrics_every=None, batch=lambda running: 1.0):
    """A server with ``slots`` that runs requests first come, first served, each for its own service time, and
    keeps the rest waiting in its queue (as llama-server -np does): a streamed answer's time to first token is its
    wait plus ``ttft_s``. With ``metrics_every``, the gate reads the server's running / waiting counts that often
    (--server-metrics). ``batch``: a request's service time is multiplied by batch(running) (a larger batch's
    steps are slower, as llama-server's on 2 cores: running ** 0.67 leaves throughput growing as running ** 0.33).
    Returns [(time, limit)] after each completion."""
    rng = random.Random(seed)
    events, queue, seen = [], collections.deque(), []
    running = n = 0
    end = clock.t + seconds
    next_poll = clock.t + metrics_every if metrics_every else math.inf

    def admit_and_start():
        nonlocal running, n
        while True:
            permit = gate.try_acquire()
            if permit is None:
                break
            queue.append((permit, clock.t))
        while running < slots and queue:
            permit, arrived = queue.popleft()
            running, n = running + 1, n + 1
            took = service(rng) * batch(running)
            heapq.heappush(events, (clock.t + took, n, permit, clock.t - arrived + ttft_s))

    admit_and_start()
    while clock.t < end and events:
        if events[0][0] > next_poll:
            clock.t = next_poll
            gate.on_server(running, len(queue))
            next_poll += metrics_every
            continue
        t, _, permit, ttft = heapq.heappop(events)
        clock.t, running = t, running - 1
        gate.release(permit, "ok", 64, ttft_s=ttft if stream else None)
        seen.append((clock.t, gate.limit))
        admit_and_start()
    return seen


class TestServerQueue(unittest.TestCase):
    """A server that queues what it cannot run (slots) has a throughput plateau past its slots: the limit must
    come back to where throughput stopped growing, from its own metrics or from what its queue does to the time
    to first token, and a warm start is a hint it verifies. In virtual time (drive_slots)."""

    def late_mean(self, seen):
        return time_mean(seen[len(seen) // 2:])

    def test_a_queue_in_the_first_tokens_holds_the_limit_near_the_slots(self):
        for seed in (1, 2, 3):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 256, clock=clock)
            seen = drive_slots(gate, clock, 4, 600, seed=seed)
            self.assertLessEqual(self.late_mean(seen), 6.0, seed)
            self.assertGreaterEqual(self.late_mean(seen), 3.0, seed)
            self.assertLessEqual(gate.discovered_limit, 6, seed)

    def test_without_first_tokens_the_plateau_is_no_evidence_of_a_queue(self):
        # (the reading needs streamed answers; unstreamed ones leave the limit to the speed gradient, which a
        # plateau's noise lets wander: this is what the first-token reading above and the metrics below fix)
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 256, clock=clock)
        seen = drive_slots(gate, clock, 4, 600, stream=False)
        self.assertGreater(max(lim for _, lim in seen), 8)

    def test_the_server_s_own_metrics_hold_the_limit_near_what_it_runs(self):
        for seed in (1, 2, 3):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 256, clock=clock)
            events = []
            gate.on_event = events.append
            seen = drive_slots(gate, clock, 8, 300, seed=seed, stream=False, metrics_every=0.5)
            self.assertLessEqual(self.late_mean(seen), 9.5, seed)  # 8 and an eighth: 9
            self.assertGreaterEqual(self.late_mean(seen), 7.0, seed)
            late = [(t1 - t0) for (t0, lim), (t1, _) in zip(seen, seen[1:]) if t0 > 30 and lim > 12]
            self.assertLess(sum(late), 0.05 * (seen[-1][0] - 30), seed)  # above 1.5x the slots: brief probes
            self.assertTrue(any(e.get("cause") == "server_queue" for e in events))

    def test_with_metrics_a_few_slots_are_never_left_idle(self):
        # 4 slots: the limit's steps (a tenth of 4 is a whole stream) must not take it under what the server runs
        # while it queues (the plateau past the slots is all the gradient sees)
        for seed in (1, 2, 3):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 256, clock=clock)
            seen = drive_slots(gate, clock, 4, 300, seed=seed, stream=False, metrics_every=0.5)
            under = sum(t1 - t0 for (t0, lim), (t1, _) in zip(seen, seen[1:]) if t0 > 30 and lim < 4)
            self.assertEqual(under, 0.0, seed)
            self.assertLessEqual(self.late_mean(seen), 5.0, seed)

    def readings(self, gate, running, waiting=2):
        """The server's gauges, one reading per count in ``running``, with the gate holding that many and more:
        the server runs or queues each of them (none on its way)."""
        permits = [gate.try_acquire() for _ in range(max(running) + waiting)]
        for ran in running:
            gate.on_server(ran, len(permits) - ran)
        for permit in permits:
            if permit is not None:
                gate.release(permit, "ok", 64)

    def test_a_fixed_count_of_slots_is_a_floor_and_a_moving_batch_is_not(self):
        # every stream past 4 slows the rest down (e = 0 past 4: the gradient walks the limit down toward 4); a
        # server that ran 10 of ours in its last 8 readings with a queue (or 9 in one: a slot just freed, refilled
        # at its next step) has 10 slots: the limit stays at them and an eighth; one whose batch moved with its
        # memory (9, 10, 11 ...) has no floor
        for running, low, high in (([10] * 8, 11, 11.5), ([10, 10, 9, 10, 10, 10, 10, 10], 11, 11.5),
                                   ([9, 10, 11, 10, 9, 11, 10, 10], 1, 8)):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 256, clock=clock)
            self.readings(gate, running)
            self.assertEqual(gate.limit, 11)  # (the second reading: 10 ran, and an eighth)
            seen = drive(gate, clock, lambda c: 50.0 if c <= 4 else 200.0 / c, 300)
            late = seen[len(seen) // 2:]
            self.assertGreaterEqual(min(lim for _, lim in late), low, running)
            self.assertLessEqual(time_mean(late), high, running)

    def test_one_reading_with_a_queue_is_a_burst_s(self):
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 256, clock=clock)
        permits = [gate.try_acquire() for _ in range(16)]
        gate.on_server(8, 8)  # a burst of new requests waits a step for its prefills
        self.assertEqual(gate.limit, 16)
        gate.on_server(8, 8)  # a queue that lasts: held at what runs and an eighth
        self.assertEqual(gate.limit, 9)
        self.assertIsNotNone(permits[-1])

    def test_the_discovered_limit_is_the_hold_when_a_slow_start_overshot_a_queueing_server(self):
        # test_client's --server-metrics run in virtual time: 4 slots, unstreamed answers of about 0.1 s, the gauges
        # read every 0.5 s. The slow start doubles 16 -> 22 -> 45 between the first reading with a queue (one is a
        # burst's) and the second, which holds the limit at 4 and an eighth; the windows judged on the way up chose
        # 22 and 45, which the server never ran (before: discovered 45 from the hold on for a second of the run, what
        # a run ending then reported: "45 not less than or equal to 6" in CI)
        for seed in (1, 2, 3):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 256, clock=clock)
            held = []
            gate.on_event = lambda e: held.append((e["running"], e["limit"], gate.discovered_limit)) \
                if e.get("cause") == "server_queue" else None
            drive_slots(gate, clock, 4, 2.0, seed=seed, stream=False, metrics_every=0.5,
                        service=lambda rng: rng.uniform(0.08, 0.12))
            self.assertEqual(held, [(4, 4, 4)], seed)  # (running, the limit held, the discovered limit)
            self.assertEqual((gate.limit, gate.discovered_limit), (4, 4), seed)

    def test_the_hold_counts_ours_on_their_way(self):
        # 14 of ours in flight, the server runs 10 and queues 2: 2 are on their way (sent and not yet seen, or
        # answered and not yet back) and would leave slots idle if the hold did not count them
        for held, on_way, expected in ((12, 0, 11), (14, 2, 13)):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 256, clock=clock)
            permits = [gate.try_acquire() for _ in range(held)]
            gate.on_server(10, 2)
            gate.on_server(10, 2)
            self.assertEqual(gate.limit, expected, on_way)
            self.assertEqual(gate._algorithm._on_way[-1], on_way)
            self.assertTrue(all(permits))

    def test_fast_first_tokens_keep_the_server_s_queue_short(self):
        # 32 slots whose first tokens take 0.01 s of a 0.5 s answer: a queue of an eighth (4) would make each first
        # token wait 4 x 0.5 / 32 = 0.06 s, six unqueued ones; the hold keeps it to about one (32 x 0.01 / 0.5)
        for seed in (1, 2):
            clock = Clock()
            gate = eh.AdaptiveGate(16, 1, 256, clock=clock)
            seen = drive_slots(gate, clock, 32, 200, seed=seed, metrics_every=0.5)
            late = seen[len(seen) // 2:]
            self.assertGreaterEqual(min(lim for _, lim in late), 32, seed)
            self.assertLessEqual(time_mean(late), 34.0, seed)

    def test_until_the_server_queues_the_limit_doubles(self):
        # 32 slots, every stream slower the larger the batch (throughput grows only as running ** 0.33) and noisy:
        # the gradient alone climbs by steps of about x1.4 and its noise walks it back; with the server's metrics
        # (nothing of ours waits) the limit doubles each window until the server queues, then holds
        for seed in (1, 2, 3):
            clock = Clock()
            gate = eh.AdaptiveGate(8, 1, 256, clock=clock)
            seen = drive_slots(gate, clock, 32, 120, seed=seed, metrics_every=0.5, stream=False,
                               batch=lambda running: running ** 0.67)
            reached = min(t for t, lim in seen if lim >= 32)
            self.assertLess(reached, 10.0, seed)
            late = [(t, lim) for t, lim in seen if t > 20]
            self.assertGreaterEqual(min(lim for _, lim in late), 32, seed)
            self.assertLessEqual(time_mean(late), 38.0, seed)  # (32, an eighth: no first tokens to tell)

    def test_a_slow_start_ends_where_throughput_falls(self):
        # a server that runs all it is sent (256 slots, no queue ever) but whose throughput falls past 8 in flight
        # (each step of a larger batch costs more than it serves): the doubling must stop and come back (from
        # 130-160 in flight, where each window takes long: the way down is slow, and past the half it is under 24)
        for seed in (1, 2):
            clock = Clock()
            gate = eh.AdaptiveGate(4, 1, 256, clock=clock)
            seen = drive_slots(gate, clock, 256, 300, seed=seed, metrics_every=0.5, stream=False,
                               batch=lambda running: max(1.0, running / 8.0) ** 1.5)
            self.assertFalse(gate._algorithm._slow_start, seed)
            self.assertLessEqual(time_mean(seen[len(seen) // 2:]), 24.0, seed)
            self.assertLess(seen[-1][1], 16, seed)

    def test_an_overload_forgets_the_slots(self):
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 256, clock=clock)
        self.readings(gate, [10] * 8)
        self.assertEqual(gate._algorithm._slots(), 10)
        self.assertEqual(gate.limit, 11)
        overload_when_full(gate, clock)
        self.assertIsNone(gate._algorithm._slots())

    def test_metrics_with_no_queue_change_nothing(self):
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 512, clock=clock)
        for _ in range(20):
            gate.on_server(10, 0)
        self.assertEqual(gate.limit, 16)
        seen = drive(gate, clock, lambda c: 50.0, 300)  # every stream as fast at any load: the limit climbs
        self.assertGreater(seen[-1][1], 100)

    def test_a_warm_start_is_a_hint_that_is_verified(self):
        # an earlier run cached 64 (a server since restarted with 4 slots): the first probe is downward, and the
        # limit comes down to the slots instead of holding what the server merely tolerates
        for seed in (1, 2):
            clock = Clock()
            gate = eh.AdaptiveGate(64, 1, 256, clock=clock, algorithm=eh.GradientLimit(64, 1, 256, warm=True))
            seen = drive_slots(gate, clock, 4, 300, seed=seed)
            self.assertLessEqual(self.late_mean(seen), 6.0, seed)
            self.assertLessEqual(gate.discovered_limit, 6, seed)

    def test_a_warm_start_probes_down_first_and_a_cold_one_up(self):
        for warm, direction in ((True, -1), (False, 1)):
            clock = Clock()
            gate = eh.AdaptiveGate(32, 1, 256, clock=clock, algorithm=eh.GradientLimit(32, 1, 256, warm=warm))
            seen = drive(gate, clock, lambda c: 50.0, 200)
            first_change = next(lim for _, lim in seen if lim != 32)
            self.assertEqual((first_change > 32) - (first_change < 32), direction)


class TestServerMetrics(unittest.TestCase):
    """The running / waiting gauges from /metrics pages in each server's exposition format (llama.cpp's captured
    from a real llama-server under load; vLLM's and SGLang's written as their documentation shows them)."""

    def page(self, name):
        with open(os.path.join(os.path.dirname(__file__), "data", "metrics", name)) as fh:
            return fh.read()

    def test_each_server_s_gauges(self):
        self.assertEqual(eh.server_load(self.page("vllm.txt")), ("vllm", 47.0, 12.0))  # two engines summed
        self.assertEqual(eh.server_load(self.page("sglang.txt")), ("sglang", 128.0, 2826.0))
        self.assertEqual(eh.server_load(self.page("llamacpp.txt")), ("llama.cpp", 16.0, 3.0))

    def test_the_exposition_format_s_corners(self):
        text = ('# HELP a A gauge.\n# TYPE a gauge\n\n'
                'a{path="/x y",note="say \\"hi\\" {not a brace}"} 2.5e+01 1712345678000\n'
                'a{path="z"} 5\n'
                'b NaN\n'
                'c +Inf\n'
                'not a sample\n'
                'd{unclosed="1" 3\n')
        self.assertEqual(eh.parse_prometheus(text), {"a": 30.0, "c": float("inf")})
        self.assertIsNone(eh.server_load("vllm:num_requests_running 3\n"))  # half a pair is no reading
        self.assertIsNone(eh.server_load("<html>404</html>"))

    def test_the_kv_pool_each_server_states(self):
        # vLLM: num_gpu_blocks x block_size in its cache_config_info labels (the page's 27456 blocks of 16)
        self.assertEqual(eh.server_kv_pool(self.page("vllm.txt")), ("vllm", 439296))
        newer = ('vllm:cache_config_info{block_size="832",kv_cache_size_tokens="619479",num_gpu_blocks="745"} 1.0\n'
                 'vllm:cache_config_info{block_size="16",engine="1",kv_cache_size_tokens="None",'
                 'num_gpu_blocks="1000"} 1.0\n')
        self.assertEqual(eh.server_kv_pool(newer), ("vllm", 619479 + 16000))  # its own count first; per engine
        unknown = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n'
        self.assertIsNone(eh.server_kv_pool(unknown))
        # SGLang: max_total_num_tokens per data-parallel rank; tensor-parallel ranks hold one pool between them
        sglang = ('sglang:max_total_num_tokens{dp_rank="0",tp_rank="0"} 144870.0\n'
                  'sglang:max_total_num_tokens{dp_rank="0",tp_rank="1"} 144870.0\n'
                  'sglang:max_total_num_tokens{dp_rank="1",tp_rank="0"} 144870.0\n')
        self.assertEqual(eh.server_kv_pool(sglang), ("sglang", 2 * 144870))
        self.assertIsNone(eh.server_kv_pool(self.page("sglang.txt")))  # (that page does not state it)
        self.assertIsNone(eh.server_kv_pool(self.page("llamacpp.txt")))  # llama-server states no pool
        self.assertIsNone(eh.server_kv_pool("<html>404</html>"))

    def test_labels_are_read_with_their_escapes(self):
        text = 'a{x="1",y="q\\"}z",z="a\\\\b\\nc"} 3\n'
        self.assertEqual(list(eh.prometheus_samples(text)), [("a", {"x": "1", "y": 'q"}z', "z": "a\\b\nc"}, 3.0)])

    def test_the_metrics_url_sits_next_to_the_api(self):
        self.assertEqual(eh.metrics_url("http://127.0.0.1:8000/v1"), "http://127.0.0.1:8000/metrics")
        self.assertEqual(eh.metrics_url("https://gw.example/llm/v1/"), "https://gw.example/llm/metrics")


class TestTurnedAway(unittest.TestCase):
    def test_a_connection_turned_away_lowers_the_limit_with_no_pause(self):
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 256, clock=clock)
        events = []
        gate.on_event = events.append
        permits = [gate.try_acquire() for _ in range(16)]
        clock.t = 1.0  # a SYN retransmit later: reset before any response
        gate.release(permits[11], "overload", turned_away=True)  # it met 12 in flight
        self.assertEqual(gate.limit, 11)
        self.assertIsNone(gate.draining_until())
        gate.release(permits[7], "overload", turned_away=True)  # same epoch, a lower level: lower still
        self.assertEqual(gate.limit, 7)
        self.assertEqual([e["type"] for e in events], ["limit", "limit"])
        self.assertEqual({e["cause"] for e in events}, {"turned_away"})
        gate.release(permits[12], "overload", turned_away=True)  # a level above the limit: nothing new
        self.assertEqual(gate.limit, 7)
        gate.release(permits[0], "overload")  # a collapse of the same epoch is not cut twice
        self.assertEqual(gate.limit, 7)
        self.assertIsNone(gate.draining_until())

    def test_a_collapse_still_drains(self):
        clock = Clock()
        gate = eh.AdaptiveGate(16, 1, 256, clock=clock)
        gate.release(gate.try_acquire(), "ok", 10)  # a success 5 s long: failures much sooner are refusals
        permit = gate.try_acquire()
        clock.t = 30.0
        gate.release(permit, "overload")  # a timeout
        self.assertIsNotNone(gate.draining_until())


class TestGateThreads(unittest.TestCase):
    def test_many_threads_never_exceed_the_limit_and_leak_no_permit(self):
        gate = eh.AdaptiveGate(8, 2, 32)
        violations, errors = [], []
        lock = threading.Lock()

        def worker(seed):
            rng = random.Random(seed)
            try:
                for _ in range(200):
                    p = gate.acquire(timeout_s=20)
                    with lock:
                        if gate.in_flight > gate.limit and not p.released:
                            # the limit may have been cut after admission; at admission it must have held
                            if p.inflight_at_admit > gate.limit + 32:
                                violations.append(p.inflight_at_admit)
                    outcome = rng.choice(["ok"] * 8 + ["ignore"])
                    gate.release(p, outcome, rng.randint(1, 50))
            except Exception as exc:  # surfaced below
                errors.append(exc)

        admitted_over = []
        original = gate._try_locked

        def checked():
            permit = original()
            if permit is not None and permit.inflight_at_admit > gate.limit:
                admitted_over.append((permit.inflight_at_admit, gate.limit))
            return permit
        gate._try_locked = checked
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertFalse(any(t.is_alive() for t in threads))
        self.assertEqual(errors, [])
        self.assertEqual(admitted_over, [])
        self.assertEqual(violations, [])
        self.assertEqual(gate.in_flight, 0)

    def test_acquire_times_out_with_a_clear_error(self):
        gate = eh.AdaptiveGate(1, 1, 1, algorithm=eh.FixedLimit(1))
        p = gate.acquire()
        with self.assertRaises(eh.GateTimeoutError) as cm:
            gate.acquire(timeout_s=0.2)
        self.assertIn("limit 1", str(cm.exception))
        gate.release(p)


def drive_sessions(sessions, clock, theta_of, seconds, *, population=10 ** 6, wait_s=6.0, tokens=200, seed=1):
    """Agents in virtual time: ``population`` sessions queue at the door; an admitted session alternates a model
    turn (tokens x theta_of(active sessions) seconds, through the model gate) and a tool wait (exponential, mean
    wait_s); it leaves after 20 turns. theta_of models server memory: past some count contexts evict each other
    and every turn slows. A turn the model gate cannot take yet polls it, and its permit says when it was asked
    for (as ``acquire`` does). Returns [(time, active, session limit)] after each turn."""
    rng = random.Random(seed)
    heap, seen = [], []
    turns, ready = {}, {}
    ids = iter(range(population))
    end = clock.t + seconds

    def admit():
        while len(turns) < population:
            slot = sessions.try_enter()
            if slot is None:
                return
            sid = next(ids)
            turns[sid] = 0
            heapq.heappush(heap, (clock.t, sid, "turn", slot))

    admit()
    while heap and clock.t < end:
        t, sid, kind, slot = heapq.heappop(heap)
        clock.t = t
        if kind == "turn":
            ready.setdefault(sid, t)
            permit = sessions.gate.try_acquire()
            if permit is None:  # the model gate is full: try again a little later
                heapq.heappush(heap, (t + 0.5, sid, "turn", slot))
                continue
            permit.asked_at = ready.pop(sid)
            heapq.heappush(heap, (t + tokens * theta_of(sessions.active), sid, ("done", permit), slot))
        else:
            sessions.gate.release(kind[1], "ok", tokens)
            turns[sid] += 1
            if turns[sid] >= 20:
                sessions.leave(slot)
                admit()
            else:
                heapq.heappush(heap, (t + rng.expovariate(1.0 / wait_s), sid, "turn", slot))
            seen.append((clock.t, sessions.active, sessions.session_limit))
            admit()
    return seen


class TestSessionSlots(unittest.TestCase):
    def test_a_server_with_slots_holds_that_many_sessions_whatever_the_gate(self):
        for adaptive in (True, False):
            with self.subTest(adaptive=adaptive):
                clock = Clock()
                gate = eh.AdaptiveGate(64, 1, 64, clock=clock) if adaptive else eh.AdaptiveGate(
                    64, 1, 64, clock=clock, algorithm=eh.FixedLimit(64))
                self.assertEqual(gate.adaptive, adaptive)
                sessions = eh.SessionGate(gate, clock=clock, slots=3)
                held = [sessions.try_enter() for _ in range(3)]
                self.assertTrue(all(held))
                self.assertIsNone(sessions.try_enter())  # all three slots held: a newcomer waits
                self.assertEqual((sessions.rule, sessions.capacity), ("slots", 3))
                seen = drive_sessions(eh.SessionGate(gate, clock=clock, slots=3), clock, lambda s: 0.02, 3000)
                self.assertEqual(max(a for _, a, _ in seen), 3)
                sessions.leave(held[0])
                self.assertIsNotNone(sessions.try_enter())


class TestSessionCountLimit(unittest.TestCase):
    def test_finds_the_session_count_before_the_memory_cliff_and_holds_it(self):
        # up to 8 sessions fit in server memory; each one more makes every turn twice as slow: best count 8
        clock = Clock()
        gate = eh.AdaptiveGate(64, 1, 64, clock=clock)
        sessions = eh.SessionGate(gate, clock=clock)
        theta = lambda s: 0.02 if s <= 8 else 0.02 * 2.0 ** (s - 8)
        seen = drive_sessions(sessions, clock, theta, 20000)
        late = [a for t, a, _ in seen if t > 5000]
        mean = sum(late) / len(late)
        self.assertGreaterEqual(mean, 6.5)
        self.assertLessEqual(mean, 9.0)
        self.assertLessEqual(max(lim for t, _, lim in seen if t > 5000), 10)

    def test_keeps_adding_sessions_while_turns_do_not_slow_down(self):
        clock = Clock()
        gate = eh.AdaptiveGate(512, 1, 512, clock=clock)
        sessions = eh.SessionGate(gate, clock=clock)
        seen = drive_sessions(sessions, clock, lambda s: 0.02, 6000)
        self.assertGreaterEqual(seen[-1][2], 20)

    def test_moves_one_session_at_a_time(self):
        clock = Clock()
        gate = eh.AdaptiveGate(64, 1, 64, clock=clock)
        sessions = eh.SessionGate(gate, clock=clock)
        events = []
        sessions.on_event = events.append
        seen = drive_sessions(sessions, clock, lambda s: 0.02 * (1.0 + 0.3 * s), 8000)
        limits = [lim for _, _, lim in seen]
        changes = [(a, b) for a, b in zip(limits, limits[1:]) if a != b]
        self.assertEqual([(e["previous"], e["limit"]) for e in events], changes)  # each change is reported
        self.assertLessEqual(max(abs(b - a) for a, b in zip(limits, limits[1:])), 1)
        self.assertGreater(len(set(limits)), 2)

    def test_no_banking_when_nobody_waits_at_the_door(self):
        # only six agents exist: once all are in, nobody waits at the door, so the count has no evidence to grow on
        clock = Clock()
        gate = eh.AdaptiveGate(64, 1, 64, clock=clock)
        sessions = eh.SessionGate(gate, clock=clock)
        seen = drive_sessions(sessions, clock, lambda s: 0.02, 3000, population=6)
        self.assertLessEqual(max(lim for _, _, lim in seen), 6)

    def test_keeps_adding_sessions_when_turn_costs_are_noisy(self):
        # each session added costs 2% more per token (so the count should keep growing), and a shock shared by
        # all turns (sigma 0.2, a new one every minute) swamps that 2% in any one window: a count measured a
        # little worse than the best is measured again within a few windows instead of fencing the count in for
        # the long memory (which left it at 38 / 39 / 35 on these seeds)
        finals = []
        for seed in (1, 2, 3):
            clock = Clock()
            gate = eh.AdaptiveGate(512, 1, 512, clock=clock)
            sessions = eh.SessionGate(gate, clock=clock)
            rng, shock = random.Random(seed), {}

            def theta(s):
                minute = int(clock.t // 60)
                if minute not in shock:
                    shock[minute] = math.exp(rng.gauss(0.0, 0.2))
                return 0.02 * (1 + 0.02 * s) * shock[minute]
            finals.append(drive_sessions(sessions, clock, theta, 8000, seed=seed)[-1][2])
        self.assertGreaterEqual(sorted(finals)[1], 42, finals)

    def test_turns_queued_at_the_model_gate_do_not_count_as_tool_time(self):
        # the model gate (fixed at 2) is the bottleneck: past 3 sessions more only queue there, a plateau the count
        # wanders on. Counted as tool time (a growing W), that queue made every larger count look better and the
        # count ran away (36 by then, 80 at the end). The capacity rule is the real one, the gate side included: its
        # duty (in flight / active) holds nothing here, since a turn queued at the model gate holds no permit, so
        # the duty reads 2 / active; only its floor (0.05) stops a runaway count, at 40 sessions (where every seed
        # sits from 10000 s on when the queue counts as tool time; 10.8-20.2 on average when it does not, seeds 1-10).
        for seed in (1, 2, 3):
            clock = Clock()
            gate = eh.AdaptiveGate(2, 1, 2, clock=clock, algorithm=eh.FixedLimit(2))
            sessions = eh.SessionGate(gate, clock=clock, algorithm=eh.SessionCountLimit())
            seen = drive_sessions(sessions, clock, lambda s: 0.02, 20000, wait_s=2.0, seed=seed)
            late = [active for t, active, _ in seen if t > 10000]
            self.assertGreater(len(late), 1000, seed)
            self.assertLess(sum(late) / len(late), 30.0, seed)

    def test_a_turn_queued_in_acquire_reports_its_wait_to_listeners(self):
        clock = Clock()
        gate = eh.AdaptiveGate(1, 1, 1, clock=clock, algorithm=eh.FixedLimit(1))
        heard = []
        gate.add_listener(lambda now, outcome, tokens, latency: heard.append(latency))
        first = gate.acquire()
        got = []
        waiter = threading.Thread(target=lambda: got.append(gate.acquire(timeout_s=30)))
        waiter.start()
        deadline = time.monotonic() + 10
        while not gate._cond._waiters and time.monotonic() < deadline:  # the waiter is blocked in acquire
            time.sleep(0.01)
        clock.t = 5.0
        gate.release(first, "ok", 10)
        waiter.join(10)
        self.assertEqual(len(got), 1)
        clock.t = 7.0
        gate.release(got[0], "ok", 10)
        self.assertEqual(heard, [5.0, 7.0])  # the second turn waited 5 s for its permit and was served 2 s

    def test_capacity_is_the_smaller_of_the_gate_side_and_the_memory_side(self):
        clock = Clock()
        gate = eh.AdaptiveGate(10, 1, 100, clock=clock)
        sessions = eh.SessionGate(gate, clock=clock, algorithm=eh.SessionCountLimit(initial=3))
        self.assertEqual(sessions.capacity, 3)
        self.assertEqual(sessions.session_limit, 3)
        fixed = eh.SessionGate(eh.AdaptiveGate(4, 1, 4, clock=clock, algorithm=eh.FixedLimit(4)), clock=clock)
        self.assertIsNone(fixed.session_limit)  # a pinned model gate pins the sessions too
        self.assertEqual(fixed.capacity, 4)



def drive_agents(sessions, clock, seconds, *, kv_tokens, fixed=None, population=10 ** 6, start=2000, growth=1000,
                 turns=(10, 30), tokens=200, decode_s=0.02, prefill_s=2.5e-4,
                 wait=lambda rng: rng.expovariate(0.25), arrive_s=None, seed=1):
    """Agents in virtual time against a server whose prefix cache holds ``kv_tokens``: the contexts of the turns
    running and, least recently used first out, of the sessions in their tools. A session's context starts at
    ``start`` tokens and grows each turn by the answer's ``tokens`` and a tool observation (log-normal, sigma 0.7,
    of median ``growth`` - ``tokens``); it leaves after a number of turns drawn uniformly from ``turns``. A turn prefills what the cache lacks (its new tokens, or its whole context when it was evicted)
    on the server's one prefill engine, first come first served, then decodes its answer (tokens x decode_s); a
    miss is what makes a count past the pool fall off a cliff. ``fixed`` admits that many instead of asking the
    gate; ``arrive_s`` spaces the agents' arrivals at the door (None: all there at the start). Each turn reports
    its usage to the session gate (as the agent loop does). Returns a dict: tokens per second, the timeline
    [(time, active, limit)], sessions admitted and finished, misses and turns, and the turns each admitted session
    got (continuity)."""
    rng = random.Random(seed)
    heap, seq = [], itertools.count()
    cache = collections.OrderedDict()  # idle sessions' cached contexts, least recently used first
    state = {"running": 0, "prefill_free": clock.t, "tokens": 0, "misses": 0, "turns": 0, "arrived": 0, "admitted": 0}
    ctx, length, done_turns, slots = {}, {}, collections.Counter(), {}
    door = collections.deque()
    timeline = []
    end = clock.t + seconds

    def evict():
        while cache and sum(cache.values()) + state["running"] > kv_tokens:
            cache.popitem(last=False)

    def admit():
        while door:
            if fixed is not None:
                slot = object() if len(slots) < fixed else None
            else:
                slot = sessions.try_enter()
            if slot is None:
                return
            sid = door.popleft()
            slots[sid], ctx[sid] = slot, start
            length[sid] = rng.randint(*turns)
            state["admitted"] += 1
            heapq.heappush(heap, (clock.t, next(seq), "turn", sid, None))

    def arrive():
        door.append(state["arrived"])
        state["arrived"] += 1
        if arrive_s is not None and state["arrived"] < population:
            heapq.heappush(heap, (clock.t + arrive_s, next(seq), "arrive", None, None))
        admit()

    if arrive_s is None:
        door.extend(range(population if population < 10 ** 5 else 10 ** 5))
        admit()
    else:
        heapq.heappush(heap, (clock.t, next(seq), "arrive", None, None))
    while heap and heap[0][0] < end:
        t, _, kind, sid, info = heapq.heappop(heap)
        clock.t = t
        if kind == "arrive":
            arrive()
            continue
        admit()  # (agents at the door wait on the gate: any event may let one in)
        if kind == "turn":
            permit = sessions.gate.try_acquire() if fixed is None else None
            cached = cache.pop(sid, None)
            state["running"] += ctx[sid]
            evict()
            hit = cached is not None
            work = (ctx[sid] - cached if hit else ctx[sid]) * prefill_s
            state["prefill_free"] = max(t, state["prefill_free"]) + work
            state["misses"] += 0 if hit else 1
            heapq.heappush(heap, (state["prefill_free"] + tokens * decode_s, next(seq), "done", sid, (permit, t)))
            continue
        permit, asked = info
        state["running"] -= ctx[sid]
        state["tokens"] += tokens
        state["turns"] += 1
        done_turns[sid] += 1
        if fixed is None:
            sessions.gate.release(permit, "ok", tokens)
            sessions.report(slots[sid], ctx[sid], tokens, t - asked)
        cache[sid] = ctx[sid] + tokens
        evict()
        ctx[sid] += tokens + int(rng.lognormvariate(math.log(max(1, growth - tokens)), 0.7))
        if done_turns[sid] >= length[sid]:
            cache.pop(sid, None)
            slot = slots.pop(sid)
            if fixed is None:
                sessions.leave(slot)
            admit()
        else:
            heapq.heappush(heap, (t + wait(rng), next(seq), "turn", sid, None))
        timeline.append((t, len(slots), None if fixed is not None else sessions.session_limit))
    return {"rate": state["tokens"] / seconds, "timeline": timeline, "admitted": state["admitted"],
            "finished": sum(1 for sid, n in done_turns.items() if n >= length[sid]), "misses": state["misses"],
            "turns": state["turns"], "done_turns": done_turns, "lengths": length}


def footprint_gate(clock, kv_tokens, **kw):
    """A session gate with the memory side by footprint (the KV pool known) over a model gate that never binds."""
    gate = eh.AdaptiveGate(10000, 1, 10000, clock=clock, algorithm=eh.FixedLimit(10000))
    return eh.SessionGate(gate, clock=clock, algorithm=eh.SessionLimit(kv_tokens, **kw))


class TestSessionLimit(unittest.TestCase):
    K = 100000

    def test_gets_near_the_best_fixed_count_below_the_cliff(self):
        # contexts from 2k growing ~1k a turn for 10-30 turns, a pool of 100k: past ~6 sessions their caches evict
        # each other and the one prefill engine drowns in whole contexts (a fixed 7 does 0.7x a fixed 5, 12 0.5x)
        rates = {n: drive_agents(None, Clock(), 6000, kv_tokens=self.K, fixed=n)["rate"] for n in range(3, 13)}
        best = max(rates, key=rates.get)
        self.assertLess(rates[12], 0.6 * rates[best])  # (there is a cliff to stay off)
        clock = Clock()
        run = drive_agents(footprint_gate(clock, self.K), clock, 6000, kv_tokens=self.K)
        self.assertGreaterEqual(run["rate"], 0.85 * rates[best], (run["rate"], rates))
        late = [a for t, a, _ in run["timeline"] if t > 1000]
        self.assertLess(abs(sum(late) / len(late) - best), 0.3 * best, (sum(late) / len(late), best))

    def test_grows_toward_a_large_best_count_at_once(self):
        # a pool of 2M tokens holds ~150 such sessions: the count is there within the first minute, not climbed
        clock = Clock()
        run = drive_agents(footprint_gate(clock, 2000000), clock, 600, kv_tokens=2000000, prefill_s=1e-6)
        early = [a for t, a, _ in run["timeline"] if 30 < t < 60]
        self.assertGreaterEqual(min(early), 100)
        self.assertLess(run["misses"], run["admitted"] * 1.1)  # (first turns only: the pool holds them all)

    def test_backs_off_when_contexts_outgrow_what_it_expected(self):
        # it expects contexts to grow 500 tokens a turn and they grow 2,500: it admits some 10 at first (when the
        # best fixed count is 3-4), then lets the count come down as sessions finish, to what the pool holds
        clock = Clock()
        sessions = footprint_gate(clock, 2 * self.K, prior_growth=500.0, prior_turns=20.0)
        run = drive_agents(sessions, clock, 6000, kv_tokens=2 * self.K, growth=2500)
        timeline = run["timeline"]
        self.assertGreaterEqual(max(a for t, a, _ in timeline if t < 60), 8)
        under = [t for t, a, lim in timeline if lim < a]  # the limit under what was admitted: nobody comes in
        self.assertGreater(len(under), 0.3 * len(timeline))
        late = [a for t, a, _ in timeline if t > 4500]
        self.assertLessEqual(max(late), 6)
        self.assertLess(abs(sum(late) / len(late) - 3.5), 1.5, sum(late) / len(late))

    def test_admits_at_most_twice_the_sessions_that_have_shown_a_turn(self):
        # a pool that the prior says holds ~75 sessions: until turns come back it is a prior, not evidence, and a
        # prior wrong by 2x would fill the pool twice over with sessions that keep their slots
        clock = Clock()
        sessions = footprint_gate(clock, 2000000)
        slots = list(iter(sessions.try_enter, None))  # (admitted until one is refused)
        self.assertEqual(len(slots), 4)  # (the initial count)
        for n, slot in enumerate(slots, 1):
            clock.t += 5.0
            sessions.report(slot, 3000, 200, 5.0)
            self.assertEqual(sessions.session_limit, max(4, 2 * n))
        finished = 0
        for i in range(40):  # more come (as the limit lets them) and finish after one short turn each
            clock.t += 0.1
            slot = sessions.try_enter() or slots[3]
            sessions.report(slot, 3000, 200, 1.0)
            if slot is not slots[3]:
                sessions.leave(slot)
                finished += 1
        self.assertGreater(finished, 30)
        while sessions.try_enter() is not None:
            pass
        # twice the 4 admitted first (all reported) and those finished; the pool alone would take hundreds of these
        self.assertEqual(sessions.active, 2 * (4 + finished))

    def test_keeps_admitted_sessions_to_their_end(self):
        # the same overshoot: every session admitted, however far over the pool, gets all its turns
        clock = Clock()
        sessions = footprint_gate(clock, 2 * self.K, prior_growth=500.0, prior_turns=20.0)
        run = drive_agents(sessions, clock, 20000, kv_tokens=2 * self.K, growth=2500, population=30)
        self.assertEqual(run["admitted"], 30)
        self.assertEqual(run["finished"], 30)
        self.assertEqual(run["done_turns"], run["lengths"])
        self.assertEqual(sessions.active, 0)

    def test_does_not_grow_without_waiting_agents(self):
        # one agent a minute, each done in a few minutes: each gets in as it arrives, and with nobody at the door
        # the limit is what runs (the pool would hold hundreds)
        clock = Clock()
        sessions = footprint_gate(clock, 10 ** 7)
        run = drive_agents(sessions, clock, 3000, kv_tokens=10 ** 7, arrive_s=60.0, population=40)
        self.assertEqual(run["admitted"], 40)
        self.assertTrue(all(lim <= max(a, 1) for _, a, lim in run["timeline"]))
        slot = sessions.try_enter()  # one more at the door: room at once
        self.assertIsNotNone(slot)
        self.assertGreater(sessions._algorithm.footprint()[0], 0)

    def test_long_tool_waits_hold_more_sessions_in_the_same_pool(self):
        # a cache idle longer than a turn is the first evicted and costs one prefill when its session comes back:
        # sessions whose tools run a minute are counted at a fraction of their contexts
        counts = {}
        for name, wait in (("none", lambda rng: 0.05), ("minute", lambda rng: 60.0)):
            clock = Clock()
            run = drive_agents(footprint_gate(clock, self.K), clock, 4000, kv_tokens=self.K, wait=wait)
            late = [a for t, a, _ in run["timeline"] if t > 1500]
            counts[name] = sum(late) / len(late)
        self.assertGreater(counts["minute"], 2 * counts["none"], counts)

    def test_learns_the_sessions_lengths_from_those_that_finished(self):
        limit = eh.SessionLimit(10 ** 6, prior_turns=30.0)
        self.assertAlmostEqual(limit.turns_left(0)[0], 30.0)
        for i, n in enumerate(range(10, 41)):  # lengths 10..40, mean 25
            key = object()
            for turn in range(n):
                limit.report(float(turn), key, 1000 + 100 * turn, 10, 1.0)
            limit.leave(float(n), key)
        mean, var = limit.turns_left(0)
        self.assertAlmostEqual(mean, (25 * 31 + 2 * 30) / 33, places=6)
        self.assertAlmostEqual(limit.turns_left(30)[0], (sum(n - 30 for n in range(31, 41)) + 2 * 15) / 12,
                               places=6)
        self.assertGreater(var, 0)

    def test_counts_contexts_and_reports_through_the_gate(self):
        clock = Clock()
        sessions = footprint_gate(clock, 100000)
        self.assertEqual(sessions.rule, "footprint")
        slots = [sessions.try_enter() for _ in range(3)]
        self.assertEqual([s is not None for s in slots], [True, True, False])  # two sessions as expected fit
        self.assertEqual(sessions.session_limit, 2)
        for slot in slots[:2]:
            sessions.report(slot, 30000, 100, 2.0)
        held, var, newcomer, _ = sessions._algorithm.footprint()
        self.assertGreater(held, 2 * 30100)  # two contexts of 30k, still growing
        self.assertLess(sessions.session_limit, 2)  # they outgrow the pool: nobody comes in ...
        self.assertIsNone(sessions.try_enter())
        sessions.leave(slots[0])
        self.assertEqual(sessions.active, 1)
        self.assertEqual(sessions.session_limit, 1)  # ... until one leaves (the other keeps its slot)

    def test_limit_events_at_most_every_five_seconds(self):
        clock = Clock()
        sessions = footprint_gate(clock, self.K)
        events = []
        sessions.on_event = lambda e: events.append((clock.t, e))
        drive_agents(sessions, clock, 2000, kv_tokens=self.K)
        self.assertGreater(len(events), 5)
        self.assertEqual([e["previous"] for _, e in events[1:]], [e["limit"] for _, e in events[:-1]])
        times = [t for t, _ in events]
        self.assertTrue(all(b - a >= 5.0 for a, b in zip(times, times[1:])), times[:20])


class TestSessionGate(unittest.TestCase):
    def test_capacity_tracks_the_gate_limit_up_and_down(self):
        clock = Clock()
        gate = eh.AdaptiveGate(10, 1, 100, clock=clock)
        # the memory-side count is measured on sessions' turns; with none yet, it must not be what binds here
        sessions = eh.SessionGate(gate, clock=clock, algorithm=eh.SessionCountLimit(initial=1000))
        self.assertEqual(sessions.capacity, 10)  # duty starts at 1: one model request per session
        permit = gate.try_acquire()
        clock.t = 60.0  # a timeout: the limit is cut
        gate.release(permit, "overload")
        self.assertEqual(sessions.capacity, 7)
        clock.t = 160.0
        drive(gate, clock, lambda c: 50.0, 300)
        self.assertGreater(gate.limit, 20)
        self.assertEqual(sessions.capacity, gate.limit)

    def test_capacity_grows_when_sessions_spend_time_in_tools(self):
        clock = Clock()
        gate = eh.AdaptiveGate(4, 1, 4, clock=clock, algorithm=eh.FixedLimit(4))
        sessions = eh.SessionGate(gate, clock=clock)
        slots = [sessions.try_enter() for _ in range(4)]
        self.assertTrue(all(slots))
        self.assertIsNone(sessions.try_enter())
        held = gate.try_acquire()  # one of four sessions holds a model request; three are in tools
        for _ in range(20):
            clock.t += 10
            sessions.capacity
        self.assertGreaterEqual(sessions.capacity, 12)  # 4 / duty 0.25 ~ 16
        self.assertIsNotNone(sessions.try_enter())
        gate.release(held)

    def test_newcomers_enter_in_arrival_order(self):
        gate = eh.AdaptiveGate(1, 1, 1, algorithm=eh.FixedLimit(1))
        sessions = eh.SessionGate(gate)
        first = sessions.enter(timeout_s=5)
        order, threads = [], []
        for i in range(4):
            def waiter(i=i):
                slot = sessions.enter(timeout_s=30)
                order.append(i)
                sessions.leave(slot)
            t = threading.Thread(target=waiter)
            t.start()
            threads.append(t)
            deadline = 50
            while sessions.waiting < i + 1 and deadline:  # arrival order is the order they reached the door
                threading.Event().wait(0.02)
                deadline -= 1
        self.assertEqual(sessions.waiting, 4)
        sessions.leave(first)
        for t in threads:
            t.join(30)
        self.assertEqual(order, [0, 1, 2, 3])
        self.assertEqual(sessions.active, 0)

    def test_admitted_sessions_keep_getting_model_permits_while_newcomers_wait(self):
        gate = eh.AdaptiveGate(2, 1, 2, algorithm=eh.FixedLimit(2))
        sessions = eh.SessionGate(gate)
        a, b = sessions.enter(timeout_s=5), sessions.enter(timeout_s=5)
        got = []
        t = threading.Thread(target=lambda: got.append(sessions.enter(timeout_s=30)))
        t.start()
        deadline = 100
        while sessions.waiting < 1 and deadline:
            threading.Event().wait(0.02)
            deadline -= 1
        self.assertEqual(sessions.waiting, 1)
        for _ in range(5):  # continuity: the admitted sessions' turns are never refused for the newcomer
            p1, p2 = gate.acquire(timeout_s=1), gate.acquire(timeout_s=1)
            gate.release(p1)
            gate.release(p2)
        self.assertEqual(got, [])
        sessions.leave(a)
        t.join(30)
        self.assertEqual(len(got), 1)
        sessions.leave(b)
        sessions.leave(got[0])

    def test_enter_times_out_and_leaves_the_door(self):
        gate = eh.AdaptiveGate(1, 1, 1, algorithm=eh.FixedLimit(1))
        sessions = eh.SessionGate(gate)
        slot = sessions.enter()
        with self.assertRaises(eh.GateTimeoutError):
            sessions.enter(timeout_s=0.2)
        self.assertEqual(sessions.waiting, 0)
        sessions.leave(slot)


if __name__ == "__main__":
    unittest.main()
