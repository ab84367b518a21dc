"""RunStore (crash-safe run directory) and summarize() (metrics with confidence intervals)."""
import json
import os
import unittest

from tests.support import eh, tempdir


def rec(sid, status="ok", score=1.0, **kw):
    base = {"id": sid, "status": status, "score": score if status == "ok" else None,
            "error": None if status == "ok" else "boom", "error_class": None if status == "ok" else "overload",
            "category": "c", "scorer": "exact"}
    base.update(kw)
    return base


class TestRunStore(unittest.TestCase):
    def test_append_is_durable_and_reloaded_when_reopened(self):
        d = tempdir(self)
        with eh.RunStore(d) as store:
            store.append(rec("a"))
            store.append(rec("b", "failed"))
        with eh.RunStore(d) as store:
            self.assertEqual(store.finished, {"a": "ok", "b": "failed"})

    def test_torn_last_line_is_cut_when_reopened(self):
        d = tempdir(self)
        with eh.RunStore(d) as store:
            store.append(rec("a"))
        with open(os.path.join(d, "samples.jsonl"), "a") as fh:
            fh.write('{"id": "b", "status": "o')  # a crash in the middle of a write
        with eh.RunStore(d) as store:
            self.assertEqual(store.finished, {"a": "ok"})
            store.append(rec("b"))
        with open(os.path.join(d, "samples.jsonl")) as fh:
            lines = fh.read().splitlines()
        self.assertEqual([json.loads(l)["id"] for l in lines], ["a", "b"])
        with open(os.path.join(d, "events.jsonl")) as fh:
            self.assertIn("torn last line", fh.read())

    def test_torn_line_is_cut_when_it_is_the_only_line(self):
        d = tempdir(self)
        with open(os.path.join(d, "samples.jsonl"), "w") as fh:
            fh.write('{"id": "a", "sta')
        with eh.RunStore(d) as store:
            self.assertEqual(store.finished, {})
        self.assertEqual(os.path.getsize(os.path.join(d, "samples.jsonl")), 0)

    def test_corrupt_middle_line_is_an_error_naming_the_line(self):
        d = tempdir(self)
        with open(os.path.join(d, "samples.jsonl"), "w") as fh:
            fh.write(json.dumps(rec("a")) + "\nGARBAGE\n" + json.dumps(rec("b")) + "\n")
        with self.assertRaises(eh.HarnessError) as cm:
            eh.RunStore(d).open()
        self.assertIn("samples.jsonl:2", str(cm.exception))

    def test_second_open_is_refused_while_the_first_holds_the_lock(self):
        d = tempdir(self)
        first = eh.RunStore(d).open()
        self.addCleanup(first.close)
        with self.assertRaises(eh.RunLockedError) as cm:
            eh.RunStore(d).open()
        self.assertIn("pid %d" % os.getpid(), str(cm.exception))
        first.close()
        eh.RunStore(d).open().close()  # released: a third open succeeds

    def test_stale_lock_of_a_dead_process_is_taken_over(self):
        d = tempdir(self)
        with open(os.path.join(d, ".lock"), "w") as fh:
            fh.write("pid 999999 on otherhost since 2020-01-01T00:00:00Z")
        with eh.RunStore(d) as store:
            self.assertTrue(any("took over" in n for n in store.notes))

    def test_a_rewrite_that_drops_failed_records_survives_reopening(self):
        d = tempdir(self)
        with eh.RunStore(d) as store:
            for sid, st in (("a", "ok"), ("b", "failed"), ("c", "ok"), ("d", "failed")):
                store.append(rec(sid, st))
            self.assertEqual(store.rewrite(lambda r: None if r["status"] == "failed" else r), (2, 0))
            store.append(rec("b"))
        with eh.RunStore(d) as store:
            self.assertEqual(sorted(store.iter_samples(), key=lambda r: r["id"])[1]["status"], "ok")
            self.assertEqual(store.finished, {"a": "ok", "b": "ok", "c": "ok"})

    def test_rewrite_keeps_one_current_record_per_id_and_moves_the_rest_to_superseded(self):
        d = tempdir(self)
        with eh.RunStore(d) as store:
            for r in (rec("a", score=0.0), rec("b"), rec("a", score=1.0), rec("c", "failed"), rec("d")):
                store.append(r)
            self.assertEqual(store.duplicates, 1)
            dropped, replaced = store.rewrite(lambda r: None if r["id"] == "c" else
                                              dict(r, score=0.5) if r["id"] == "d" else r)
            self.assertEqual((dropped, replaced), (1, 1))
            self.assertEqual(store.finished, {"a": "ok", "b": "ok", "d": "ok"})
            self.assertEqual(store.duplicates, 0)
            store.append(rec("c"))  # the file is open for appends again
        with open(os.path.join(d, "samples.jsonl")) as fh:
            current = [json.loads(line) for line in fh]
        self.assertEqual([(r["id"], r["score"]) for r in current], [("b", 1.0), ("a", 1.0), ("d", 0.5), ("c", 1.0)])
        with open(os.path.join(d, "superseded.jsonl")) as fh:
            old = [json.loads(line) for line in fh]
        self.assertEqual([(r["id"], r["status"], r["score"]) for r in old],
                         [("a", "ok", 0.0), ("c", "failed", None), ("d", "ok", 1.0)])

    def test_a_crash_before_the_rename_leaves_the_old_file_whole(self):
        """A fault that cannot be produced for real at that exact instant: os.replace raises as a crash would
        stop the process there (the rewritten copy is not yet in place)."""
        d = tempdir(self)
        with eh.RunStore(d) as store:
            store.append(rec("a"))
            store.append(rec("b", "failed"))
        with open(os.path.join(d, "samples.jsonl")) as fh:
            before = fh.read()
        real = eh.os.replace

        def crash(src, dst):
            raise OSError("crashed")
        store = eh.RunStore(d).open()
        self.addCleanup(store.close)
        eh.os.replace = crash
        try:
            with self.assertRaises(OSError):
                store.rewrite(lambda r: None)
        finally:
            eh.os.replace = real
        with open(os.path.join(d, "samples.jsonl")) as fh:
            self.assertEqual(fh.read(), before)
        store.close()
        with eh.RunStore(d) as again:
            self.assertEqual(again.finished, {"a": "ok", "b": "failed"})

    def test_restart_moves_the_results_aside_and_starts_empty(self):
        d = tempdir(self)
        with eh.RunStore(d) as store:
            store.append(rec("a"))
            store.write_json("summary.json", {"x": 1})
            dest = store.restart()
            self.assertEqual(store.finished, {})
            store.append(rec("b"))
        self.assertTrue(dest.startswith(os.path.join(d, "superseded", "")))
        self.assertEqual(sorted(os.listdir(dest)), ["samples.jsonl", "summary.json"])
        with open(os.path.join(dest, "samples.jsonl")) as fh:
            self.assertEqual([json.loads(l)["id"] for l in fh], ["a"])
        with open(os.path.join(d, "samples.jsonl")) as fh:
            self.assertEqual([json.loads(l)["id"] for l in fh], ["b"])

    def test_unwritable_out_is_a_config_error(self):
        d = tempdir(self)
        blocker = os.path.join(d, "file")
        open(blocker, "w").close()
        with self.assertRaises(eh.ConfigError) as cm:
            eh.RunStore(os.path.join(blocker, "run")).open()
        self.assertIn("writable", str(cm.exception))


class TestSummarize(unittest.TestCase):
    def test_counts_means_and_wilson_interval_match_hand_computed_values(self):
        records = [rec("a", score=1.0, category="x"), rec("b", score=0.0, category="x"),
                   rec("c", score=1.0, category="y"), rec("d", score=1.0, category="y"),
                   rec("e", "failed", category="y")]
        s = eh.summarize(records, total=6)
        self.assertEqual(s["counts"], {"total": 6, "finished": 5, "ok": 4, "failed": 1, "pending": 1})
        self.assertEqual(s["score"]["mean"], 0.75)
        # Wilson 95% for 3/4: centre (0.75 + z²/8)/(1 + z²/4), half z·sqrt(0.75·0.25/4 + z²/64)/(1 + z²/4)
        z = 1.959964
        denom = 1 + z * z / 4
        centre = (0.75 + z * z / 8) / denom
        half = z * (0.75 * 0.25 / 4 + z * z / 64) ** 0.5 / denom
        self.assertAlmostEqual(s["score"]["ci95"][0], centre - half, places=5)
        self.assertAlmostEqual(s["score"]["ci95"][1], centre + half, places=5)
        self.assertAlmostEqual(s["score"]["ci95"][0], 0.3006, places=3)
        self.assertEqual(s["by_category"]["x"]["mean"], 0.5)
        self.assertEqual(s["by_category"]["y"], {"mean": 1.0, "ci95": s["by_category"]["y"]["ci95"], "n": 2,
                                                 "failed": 1})
        self.assertEqual(s["errors"], {"overload": 1})

    def test_partial_scores_use_a_normal_interval(self):
        s = eh.summarize([rec("a", score=0.5), rec("b", score=0.75), rec("c", score=0.25)])
        self.assertAlmostEqual(s["score"]["mean"], 0.5, places=6)
        half = 1.959964 * 0.25 / 3 ** 0.5  # sample sd 0.25, n 3
        self.assertAlmostEqual(s["score"]["ci95"][0], 0.5 - half, places=5)
        self.assertAlmostEqual(s["score"]["ci95"][1], 0.5 + half, places=5)
        clipped = eh.summarize([rec("a", score=0.5), rec("b", score=1.0), rec("c", score=0.0)])
        self.assertEqual(clipped["score"]["ci95"], [0.0, 1.0])  # the interval never leaves [0, 1]

    def test_latency_percentiles_and_active_time_exclude_gaps_between_resumes(self):
        records = [rec("a", latency_s=1.0, started_at=100.0, finished_at=101.0, completion_tokens=10),
                   rec("b", latency_s=2.0, started_at=100.5, finished_at=102.0, completion_tokens=10),
                   rec("c", latency_s=3.0, started_at=200.0, finished_at=203.0, completion_tokens=10)]
        perf = eh.summarize(records)["performance"]
        self.assertEqual(perf["latency_s"]["p50"], 2.0)
        self.assertAlmostEqual(perf["latency_s"]["p95"], 2.9, places=6)
        self.assertEqual(perf["active_s"], 5.0)  # [100, 102] + [200, 203]; the gap is not working time
        self.assertEqual(perf["samples_per_s"], 0.6)

    def test_last_record_of_an_id_wins(self):
        s = eh.summarize([rec("a", "failed"), rec("a", score=1.0)])
        self.assertEqual(s["counts"]["ok"], 1)
        self.assertEqual(s["counts"]["failed"], 0)


if __name__ == "__main__":
    unittest.main()
