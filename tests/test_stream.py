"""A report read in one pass (issue 39): the latest record per id through partition files, the summary and figures
fed records in any order, percentiles past the exact limit, and a real run's report read for display (only the
samples it lists kept) against the same run read whole."""
import json
import math
import os
import random
import shutil
import unittest

from tests.support import eh, qa_rows, read_samples, run_cli, start_mock, tempdir, write_jsonl


def patched(test, **values):
    """Set module constants of evalharness for one test."""
    for name, value in values.items():
        old = getattr(eh, name)
        setattr(eh, name, value)
        test.addCleanup(setattr, eh, name, old)


def record(rng, i, sid):
    ok = rng.random() < 0.8
    start = 1000.0 + i * 0.37 + rng.random()
    return {"id": sid, "status": "ok" if ok else "failed", "score": float(rng.random() < 0.6) if ok else None,
            "category": rng.choice(["a", "b", "c"]), "scorer": "exact",
            "error": None if ok else "boom %d" % i, "error_class": None if ok else rng.choice(["overload", "http"]),
            "prompt_tokens": rng.randint(5, 50), "completion_tokens": rng.randint(1, 64),
            "latency_s": round(rng.lognormvariate(0, 0.7), 4), "ttft_s": round(rng.random(), 4),
            "started_at": round(start, 3), "finished_at": round(start + 0.5 + rng.random() * 3, 3),
            "finish_reason": "stop", "served_model": "m", "cost": {"answer": round(rng.random() / 100, 6)}}


class TestLatestRecords(unittest.TestCase):
    def test_partitions_on_disk_give_the_latest_record_of_each_wanted_id_in_file_order(self):
        """3,000 lines of 1,000 ids (each written 1 to 4 times: retries) and 100 ids no longer in the dataset: the
        same records through 1 partition and through ~60 (4 KB each), as a dict of the last line per id would
        give; a line appended after the first read is not read."""
        rng = random.Random(7)
        d = tempdir(self)
        path = os.path.join(d, "samples.jsonl")
        lines = []
        for i in range(3000):
            sid = "q%04d" % rng.randrange(1100)
            lines.append(dict(record(rng, i, sid), line=i))
        wanted = ["q%04d" % i for i in range(1000)]
        expect = {}
        for r in lines:
            expect.pop(r["id"], None)
            expect[r["id"]] = r
        expect = [r for r in sorted(expect.values(), key=lambda r: r["line"]) if r["id"] in set(wanted)]
        for size in (eh.PARTITION_BYTES, 4096):
            with self.subTest(partition_bytes=size):
                patched(self, PARTITION_BYTES=size)
                with open(path, "w", encoding="utf-8") as fh:
                    for r in lines:
                        fh.write(json.dumps(r, sort_keys=True) + "\n")
                    fh.write('{"id": "q0001", "status": "o')  # a torn tail
                latest = eh._LatestRecords(path, wanted)
                with open(path, "a", encoding="utf-8") as fh:
                    fh.write("\n" + json.dumps(dict(lines[0], line=-1)) + "\n")  # after the first read
                got = list(latest)
                self.assertEqual([r["line"] for r in got], [r["line"] for r in expect])
                self.assertEqual(latest.count, len(expect))
                self.assertGreater(len(expect), 900)


class TestOnePass(unittest.TestCase):
    def test_quantiles_past_the_exact_limit_stay_within_half_a_percent(self):
        patched(self, SKETCH_EXACT=500)
        rng = random.Random(3)
        values = [rng.lognormvariate(0, 1.2) for _ in range(20000)]
        q = eh._Quantiles()
        for v in values:
            q.add(v)
        self.assertFalse(q.exact)
        exact = sorted(values)
        for p in (1, 50, 90, 95, 99):
            want = eh._percentile(exact, p)
            self.assertLess(abs(q.percentile(p) - want) / want, 0.005, p)
        hist, ref = q.histogram(), eh._histogram(values)
        self.assertEqual(sum(hist["counts"]), len(values))
        self.assertEqual(hist["edges"], ref["edges"])
        self.assertLess(max(abs(a - b) for a, b in zip(hist["counts"], ref["counts"])), 0.02 * len(values))

    def test_the_summary_fed_in_any_order_equals_summarize_and_plain_arithmetic(self):
        rng = random.Random(11)
        recs = [record(rng, i, "s%d" % i) for i in range(2000)]
        want = eh.summarize(recs, total=2100)
        shuffled = list(recs)
        rng.shuffle(shuffled)
        acc = eh._Summary()
        for r in shuffled:
            acc.add(r)
        got = acc.result(2100)
        self.assertEqual(json.dumps(got, sort_keys=True), json.dumps(want, sort_keys=True))
        scores = [r["score"] for r in recs if r["status"] == "ok"]
        self.assertEqual(got["score"]["n"], len(scores))
        self.assertAlmostEqual(got["score"]["mean"], sum(scores) / len(scores), places=6)
        lo, hi = eh._wilson_ci(sum(scores), len(scores))
        self.assertEqual(got["score"]["ci95"], [round(lo, 6), round(hi, 6)])
        self.assertEqual(got["counts"]["pending"], 100)
        self.assertAlmostEqual(got["performance"]["active_s"], eh._active_seconds(
            [(r["started_at"], r["finished_at"]) for r in recs]), places=3)
        failed = sorted((r["id"], r) for r in recs if r["status"] != "ok")
        first = {}
        for sid, r in failed:
            first.setdefault(r["error_class"], r["error"])
        self.assertEqual(got["error_examples"], first)  # the smallest id's error, in any order
        self.assertAlmostEqual(got["cost"]["total"], sum(r["cost"]["answer"] for r in recs), places=5)
        graded = [r["score"] for r in recs if r["status"] == "ok" and r["category"] == "a"]
        mean = sum(graded) / len(graded)
        ci = eh._mean_ci([v * 0.5 + 0.25 for v in graded])  # not 0/1: the normal interval
        sd = math.sqrt(sum((v * 0.5 + 0.25 - (mean * 0.5 + 0.25)) ** 2 for v in graded) / (len(graded) - 1))
        self.assertAlmostEqual(ci["ci95"][1] - ci["ci95"][0], 2 * 1.959964 * sd / math.sqrt(len(graded)), places=5)


class TestReportReadForDisplay(unittest.TestCase):
    def test_a_real_runs_report_read_in_one_pass_equals_the_whole_read_and_lists_the_smallest_wrong_ids(self):
        """A run of 400 rows on the mock (it knows the answers of half: the rest are wrong), resumed once so that
        the store holds superseded lines: `report --json` (read for display) equals the report of the run read
        whole; with the limits made small in-process (10 samples listed, exact percentiles to 50 values, 2 KB
        partitions), the same counts and scores, percentiles within 0.6%, the 10 smallest wrong ids listed and
        the rest counted, the completions over time summing to the samples."""
        d = tempdir(self)
        rows = qa_rows(400)
        path = write_jsonl(os.path.join(d, "qa.jsonl"), rows)
        mock = start_mock(self, oracle_rows=rows[:200])
        out = os.path.join(d, "run")
        args = ["run", "--dataset", path, "--model", "m", "--base-url", mock.url, "--out", out, "--no-progress",
                "--max-tokens", "16"]
        self.assertIn(run_cli(args).returncode, (0, 1))
        first = read_samples(out)
        # a retried sample appended again: a later line of the same id replaces it
        with open(os.path.join(out, "samples.jsonl"), "a", encoding="utf-8") as fh:
            for r in first[:30]:
                fh.write(json.dumps(dict(r, status="ok", score=1.0), sort_keys=True) + "\n")
        res = run_cli(["report", out, "--json"])
        self.assertEqual(res.returncode, 0, res.stderr)
        streamed = json.loads(res.stdout)
        whole = eh.report_json(dict(eh.report_data(eh.load_run(out)), run_info=eh.load_run(out)["run"]))
        whole = json.loads(json.dumps(whole))
        self.assertEqual({k: v for k, v in streamed.items() if k != "report"},
                         {k: v for k, v in whole.items() if k != "report"})
        for key in ("failures", "series", "latency_hist", "latency_label"):
            self.assertEqual(streamed["report"][key], whole["report"][key], key)
        self.assertEqual(streamed["counts"]["finished"], 400)

        patched(self, SAMPLES_SHOWN=10, SKETCH_EXACT=50, PARTITION_BYTES=2048)
        run = eh.load_run(out, shown_only=True)
        full = eh.load_run(out)
        bad = sorted(sid for sid, r in full["samples"].items() if r.get("status") != "ok" or (r.get("score") or 0) < 1)
        self.assertGreater(len(bad), 100)
        self.assertEqual(list(run["samples"]), bad[:10])
        self.assertEqual(run["bad_total"], len(bad))
        s, w = run["summary"], eh.summarize(full["samples"].values(), total=full["total"])
        for key in ("counts", "score", "by_category", "errors", "tokens"):
            self.assertEqual(s[key], w[key], key)
        for p in ("p50", "p95", "p99"):
            self.assertLess(abs(s["performance"]["latency_s"][p] - w["performance"]["latency_s"][p]),
                            0.006 * w["performance"]["latency_s"][p] + 1e-4, p)
        series = run["series"]
        self.assertAlmostEqual(sum(series["rate"]) * series["bin_s"], 400, delta=0.5)
        self.assertLessEqual(max(v for _, v in series["in_flight"]), max(v for _, v in whole["report"]["series"]["in_flight"]))
        page = eh.render_html(eh.report_data(run), run)
        self.assertIn("%d more not shown" % (len(bad) - 10), page)
        for sid in bad[:10]:
            self.assertIn(">%s<" % sid, page)
        self.assertNotIn(">%s<" % bad[10], page)


if __name__ == "__main__":
    unittest.main()


class TestMergeInBoundedMemory(unittest.TestCase):
    def test_a_merge_sorted_in_small_runs_on_disk_equals_the_merge_in_one_run_and_names_an_overlap(self):
        """Two shards of a 300-row run (real processes on the mock), one with a retried sample appended: merged
        in-process with runs of 7 records and 2 KB partitions, the output files are byte for byte those of the
        merge with the default sizes; run.json's ids are the sorted union of the shards' ids, written without a
        list; a sample both shards list (forged in one shard's run.json: two real shards never overlap) stops the
        merge with both directories named and the previous output intact."""
        d = tempdir(self)
        rows = qa_rows(300)
        path = write_jsonl(os.path.join(d, "qa.jsonl"), rows)
        mock = start_mock(self, oracle_rows=rows[:200])
        out = os.path.join(d, "run")
        for i in range(2):
            res = run_cli(["run", "--dataset", path, "--model", "m", "--base-url", mock.url, "--out", out,
                           "--no-progress", "--max-tokens", "16", "--shard", "%d/2" % i])
            self.assertEqual(res.returncode, 0, res.stderr)
        shard0 = os.path.join(out, "shard-0-of-2")
        recs = read_samples(shard0)
        with open(os.path.join(shard0, "samples.jsonl"), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(dict(recs[3], score=0.5), sort_keys=True) + "\n")

        def merged_files():
            code, _ = eh.merge_runs(out)
            self.assertEqual(code, 0)
            got = {}
            for name in ("samples.jsonl", "run.json", "summary.json"):
                with open(os.path.join(out, name), encoding="utf-8") as fh:
                    got[name] = fh.read()
            self.assertFalse(os.path.exists(os.path.join(out, eh.MERGE_SORT_DIR)))
            return got
        whole = merged_files()
        patched(self, MERGE_CHUNK_RECORDS=7, PARTITION_BYTES=2048, MERGE_FAN_IN=4)  # (about 22 runs a shard)
        small = merged_files()
        self.assertEqual(small["samples.jsonl"], whole["samples.jsonl"])
        self.assertEqual(json.loads(small["run.json"])["dataset"], json.loads(whole["run.json"])["dataset"])
        self.assertEqual(small["summary.json"], whole["summary.json"])
        lines = [json.loads(x) for x in small["samples.jsonl"].splitlines()]
        self.assertEqual([r["id"] for r in lines], sorted(r["id"] for r in lines))
        self.assertEqual(len(lines), 300)
        self.assertEqual(next(r for r in lines if r["id"] == recs[3]["id"])["score"], 0.5)  # the later line
        union = set()
        for i in range(2):
            with open(os.path.join(out, "shard-%d-of-2" % i, "run.json"), encoding="utf-8") as fh:
                union |= set(json.load(fh)["dataset"]["ids"])
        self.assertEqual(json.loads(small["run.json"])["dataset"]["ids"], sorted(union))

        shard1_json = os.path.join(out, "shard-1-of-2", "run.json")
        with open(shard1_json, encoding="utf-8") as fh:
            info = json.load(fh)
        info["dataset"]["ids"] = sorted(info["dataset"]["ids"] + [recs[0]["id"]])
        with open(os.path.join(out, "shard-1-of-2", "samples.jsonl"), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(recs[0], sort_keys=True) + "\n")
        with open(shard1_json, "w", encoding="utf-8") as fh:
            json.dump(info, fh)
        res = run_cli(["merge", out])
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertRegex(res.stderr.strip(), r"sample '%s' is in both \S+shard-0-of-2 and \S+shard-1-of-2 "
                                             r"\(overlapping shards\)$" % recs[0]["id"])
        with open(os.path.join(out, "samples.jsonl"), encoding="utf-8") as fh:
            self.assertEqual(fh.read(), whole["samples.jsonl"])  # the last merge's output, whole

    def test_sorted_runs_are_merged_on_disk_until_few_enough_are_open_at_once(self):
        """A shard of 103 records sorted in runs of 5 (21 files), with at most 3 merged at a time down to 2 files:
        never more than 3 runs open at once, the merged-away files removed, the records come back in id order."""
        d = tempdir(self)
        patched(self, MERGE_CHUNK_RECORDS=5, MERGE_FAN_IN=3)
        rng = random.Random(3)
        recs = [{"id": "r%03d" % i, "v": rng.random(), "text": "x\ty \u00e9"} for i in range(103)]
        rng.shuffle(recs)

        class Latest(list):
            count = len(recs)
        open_now, most = [0], [0]
        read = eh._SortedShard._read

        def counted(path):
            open_now[0] += 1
            most[0] = max(most[0], open_now[0])
            try:
                for x in read(path):
                    yield x
            finally:
                open_now[0] -= 1
        eh._SortedShard._read = staticmethod(counted)
        self.addCleanup(setattr, eh._SortedShard, "_read", staticmethod(read))
        srt = eh._SortedShard(Latest(recs), d, 0)
        self.assertEqual(len(srt.files), 21)
        srt.compact(2)
        self.assertEqual(len(srt.files), 2)
        self.assertEqual(sorted(os.listdir(d)), sorted(os.path.basename(p) for p in srt.files))
        back = [(sid, json.loads(line)) for sid, line in srt]
        self.assertEqual(most[0], 3)
        self.assertEqual([sid for sid, _ in back], sorted(r["id"] for r in recs))
        self.assertEqual([r for _, r in back], sorted(recs, key=lambda r: r["id"]))

    def test_run_json_ids_are_read_one_by_one_whatever_their_characters(self):
        d = tempdir(self)
        ids = ['a"b', "c\\d", "e]f", "ünï", "g,h", "x" * 300]
        path = os.path.join(d, "run.json")
        for listed in (ids, [], [1, 2]):
            with self.subTest(listed=listed[:2]):
                eh._write_json(path, {"dataset": {"ids": listed, "name": "n", "rows": 3}, "config": {"x": 1}})
                info, got = eh._run_json_lean(path)
                self.assertEqual(info, {"dataset": {"name": "n", "rows": 3}, "config": {"x": 1}})
                self.assertEqual(list(got()) if got else [], [str(i) for i in listed])


class TestComparisonInOnePass(unittest.TestCase):
    def test_a_comparison_sorted_on_disk_equals_plain_arithmetic_over_the_whole_records(self):
        """Two real runs of 300 rows (the mock knows the first 200, then the last 200, of the answers), compared
        with runs of 7 records on disk, the bootstrap kept to 50 pairs (past it, the normal interval) and 5 ids
        listed a flip: every count, mean and interval equals plain arithmetic over the two runs' whole records,
        the listed flips are the first by id, and `report A B --json` (default sizes) has the same counts."""
        d = tempdir(self)
        rows = qa_rows(300)
        path = write_jsonl(os.path.join(d, "qa.jsonl"), rows)
        outs = []
        for name, known in (("a", rows[:200]), ("b", rows[100:])):
            mock = start_mock(self, oracle_rows=known, model="m-" + name)
            out = os.path.join(d, name)
            res = run_cli(["run", "--dataset", path, "--model", "m-" + name, "--base-url", mock.url, "--out", out,
                           "--no-progress", "--max-tokens", "16"])
            self.assertEqual(res.returncode, 0, res.stderr)
            outs.append(out)
        a, b = ({r["id"]: r for r in read_samples(o)} for o in outs)
        common = sorted(set(a) & set(b))
        pairs = [(a[i]["score"], b[i]["score"]) for i in common]
        diffs = [y - x for x, y in pairs]
        n = len(diffs)
        mean = sum(diffs) / n
        half = 1.959964 * math.sqrt(sum((x - mean) ** 2 for x in diffs) / (n - 1) / n)
        improved = [i for i in common if b[i]["score"] > a[i]["score"]]
        regressed = [i for i in common if b[i]["score"] < a[i]["score"]]
        self.assertTrue(improved and regressed)

        patched(self, MERGE_CHUNK_RECORDS=7, BOOTSTRAP_PAIRS=50, FLIPS_LISTED=5, MERGE_FAN_IN=6)
        c = eh.compare_runs(eh.load_run(outs[0], shown_only=True), eh.load_run(outs[1], shown_only=True), shown=3)
        self.assertEqual((c["common"], c["paired_scored"], c["only_in_a"], c["only_in_b"]), (300, 300, 0, 0))
        self.assertEqual(c["score"]["diff"], round(mean, 6))
        self.assertEqual(c["score"]["ci95"], [round(mean - half, 6), round(mean + half, 6)])
        self.assertIn("normal approximation", c["score"]["method"])
        self.assertEqual(c["score"]["a"], round(sum(x for x, _ in pairs) / n, 6))
        self.assertEqual((c["improved"], c["regressed"]), (improved[:5], regressed[:5]))
        self.assertEqual((c["flips"]["improved"], c["flips"]["regressed"]), (len(improved), len(regressed)))
        lat = [(a[i]["latency_s"], b[i]["latency_s"]) for i in common]
        self.assertEqual(c["metrics"]["latency_s"]["diff"], round(sum(y - x for x, y in lat) / n, 6))
        self.assertEqual([f["id"] for f in c["_flipped"]], sorted(regressed[:3]) + sorted(improved[:3]))
        self.assertEqual(c["_flipped"][0]["a"]["question"], a[regressed[0]]["question"])
        text = eh.format_comparison(c)
        self.assertRegex(text, r"better in B:\s+%d  %s …" % (len(improved), ", ".join(improved[:5])))

        res = run_cli(["report", outs[0], outs[1], "--json"])
        self.assertEqual(res.returncode, 0, res.stderr)
        whole = json.loads(res.stdout)
        self.assertNotIn("_flipped", whole)
        self.assertEqual((whole["improved"], whole["regressed"]), (improved, regressed))
        self.assertEqual(whole["score"]["diff"], c["score"]["diff"])
        self.assertEqual(whole["score"]["method"], "paired bootstrap, 1000, seed 0")
        # each category's interval names its method: past the (patched) 50 pairs the normal one, as plain arithmetic
        self.assertTrue(c["by_category"])
        for cat, m in c["by_category"].items():
            d_cat = [b[i]["score"] - a[i]["score"] for i in common if (b[i].get("category") or "uncategorized") == cat]
            self.assertEqual(m["n"], len(d_cat))
            self.assertGreater(len(d_cat), 50)  # (100 rows a category)
            mu = sum(d_cat) / len(d_cat)
            h = 1.959964 * math.sqrt(sum((x - mu) ** 2 for x in d_cat) / (len(d_cat) - 1) / len(d_cat))
            self.assertIn("normal approximation", m["method"])
            self.assertEqual(m["ci95"], [round(mu - h, 6), round(mu + h, 6)])
            self.assertEqual(whole["by_category"][cat]["method"], "paired bootstrap, 1000, seed 0")
        # a run.json that does not name its task (an older run) is read whole first: the same comparison
        older = os.path.join(d, "b-older")
        shutil.copytree(outs[1], older)
        with open(os.path.join(older, "run.json"), encoding="utf-8") as fh:
            info = json.load(fh)
        del info["task"]
        with open(os.path.join(older, "run.json"), "w", encoding="utf-8") as fh:
            json.dump(info, fh)
        self.assertEqual(eh._run_head(outs[1])["task"], "qa")
        self.assertIn("summary", eh._run_head(older))  # (load_run's answer)
        res = run_cli(["report", outs[0], older, "--json"])
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(dict(json.loads(res.stdout), b=whole["b"]), whole)
