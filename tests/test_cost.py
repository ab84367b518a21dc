"""--prices and --cost-limit: each sample's cost equal to a hand computation from its stored usage, in the summary,
run.json, the table, the report and the comparison; a cost limit stops the run (exit 4) within one request's
reservation, and the same command with a higher limit finishes with each sample once. Against the mock over
loopback."""
import json
import os
import unittest

from tests.support import qa_rows, read_samples, run_cli, start_mock, tempdir, write_jsonl

import evalharness as eh

PRICES = [{"model": "m", "input": 2.0, "cached_input": 0.5, "output": 8.0, "threshold": 12, "input_above": 4.0,
           "output_above": 16.0}]


def hand_cost(rec):
    """What the price table says a record's request cost, from its stored usage."""
    p, c, o = rec["prompt_tokens"], rec.get("cached_tokens") or 0, rec["completion_tokens"]
    above = p > 12
    inp, out = (4.0, 16.0) if above else (2.0, 8.0)
    return ((p - c) * inp + c * 0.5 + o * out) / 1e6


class TestPrices(unittest.TestCase):
    def setUp(self):
        self.d = tempdir(self)
        self.prices = os.path.join(self.d, "prices.json")
        with open(self.prices, "w", encoding="utf-8") as fh:
            json.dump(PRICES, fh)
        rows = qa_rows(30)
        for i, r in enumerate(rows):  # prompts on both sides of the 12-token threshold
            r["prompt"] = r["prompt"] + " and some more words" * (i % 3)
        self.rows = rows
        self.dataset = write_jsonl(os.path.join(self.d, "qa.jsonl"), rows)
        self.mock = start_mock(self, oracle_rows=rows, cached_share=0.25)

    def run_qa(self, out, *extra):
        return run_cli(["run", "--dataset", self.dataset, "--model", "m", "--base-url", self.mock.url, "--out", out,
                        "--no-progress", "--prices", self.prices] + list(extra))

    def test_each_samples_cost_is_the_price_table_on_its_usage_everywhere(self):
        out = os.path.join(self.d, "run")
        res = self.run_qa(out, "--fixed-concurrency", "4")
        self.assertEqual(res.returncode, 0, res.stderr)
        recs = read_samples(out)
        self.assertTrue(any(r["prompt_tokens"] > 12 for r in recs) and any(r["prompt_tokens"] <= 12 for r in recs))
        self.assertTrue(all(r.get("cached_tokens") for r in recs))
        for r in recs:
            self.assertAlmostEqual(r["cost"]["model"], hand_cost(r), places=8)
        total = sum(hand_cost(r) for r in recs)
        with open(os.path.join(out, "summary.json"), encoding="utf-8") as fh:
            self.assertAlmostEqual(json.load(fh)["cost"]["total"], total, places=5)
        with open(os.path.join(out, "run.json"), encoding="utf-8") as fh:
            info = json.load(fh)["cost"]
        self.assertAlmostEqual(info["spent_this_attempt"], total, places=6)
        self.assertAlmostEqual(info["samples"]["total"], total, places=5)
        line = "cost: %s over 30 sample(s)" % eh._fmt_money(round(total, 6))
        self.assertIn(line, res.stdout)  # the table
        self.assertIn(line, run_cli(["report", out]).stdout)
        self.assertAlmostEqual(json.loads(run_cli(["report", out, "--json"]).stdout)["cost"]["total"], total,
                               places=5)
        self.assertEqual(run_cli(["report", out, "--html"]).returncode, 0)
        with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
            self.assertIn(eh._fmt_money(round(total, 6)), fh.read())
        other = os.path.join(self.d, "unpriced")
        self.assertEqual(run_cli(["run", "--dataset", self.dataset, "--model", "m", "--base-url", self.mock.url,
                                  "--out", other, "--no-progress"]).returncode, 0)
        cmp_text = run_cli(["report", out, other]).stdout
        self.assertIn("cost of the run: A %s  B no price" % eh._fmt_money(round(total, 6)), cmp_text)

    def test_log_likelihood_requests_are_priced_too(self):
        """--task choice asks /v1/completions (several prompts a request) and /tokenize: each record's cost is the
        price table on the usage its completions requests reported (the tokenizer's requests report none)."""
        from tests.test_loglik import ROWS
        path = write_jsonl(os.path.join(self.d, "arc.jsonl"), ROWS["arc"])
        mock = start_mock(self)
        out = os.path.join(self.d, "choice")
        res = run_cli(["run", "--task", "choice", "--dataset", path, "--model", "m", "--base-url", mock.url,
                       "--out", out, "--no-progress", "--prices", self.prices, "--json"])
        self.assertEqual(res.returncode, 0, res.stderr)
        recs = read_samples(out)
        self.assertEqual(len(recs), len(ROWS["arc"]))
        for r in recs:
            self.assertGreater(r["prompt_tokens"], 0)
            self.assertAlmostEqual(r["cost"]["model"], hand_cost(r), places=8)
        self.assertAlmostEqual(json.loads(res.stdout)["cost"]["total"], sum(hand_cost(r) for r in recs), places=6)

    def test_an_unknown_model_says_no_price_never_zero(self):
        with open(self.prices, "w", encoding="utf-8") as fh:
            json.dump([dict(PRICES[0], model="other")], fh)
        out = os.path.join(self.d, "run")
        res = self.run_qa(out)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("has no price for model 'm'", res.stderr)
        self.assertIn("cost: no price over 0 sample(s); 30 sample(s) with no price", res.stdout)
        self.assertTrue(all(r["cost"] == {"model": None} for r in read_samples(out)))

    def test_a_bad_price_file_is_one_line_naming_the_row_and_field(self):
        bad = os.path.join(self.d, "prices.csv")
        with open(bad, "w", encoding="utf-8") as fh:
            fh.write("model,input,output\nm,2,eight\n")
        res = run_cli(["run", "--dataset", self.dataset, "--model", "m", "--base-url", self.mock.url, "--out",
                       os.path.join(self.d, "x"), "--prices", bad])
        self.assertEqual(res.returncode, 2)
        self.assertEqual(res.stderr.strip(), "evalharness: %s:2: field 'output' must be a number, got 'eight'" % bad)
        self.assertFalse(os.path.exists(os.path.join(self.d, "x")))

    def test_the_cost_limit_stops_within_one_reservation_and_a_higher_limit_resumes(self):
        out = os.path.join(self.d, "run")
        full = os.path.join(self.d, "full")
        self.assertEqual(self.run_qa(full, "--fixed-concurrency", "2").returncode, 0)
        whole = sum(hand_cost(r) for r in read_samples(full))
        limit = whole / 2
        res = self.run_qa(out, "--fixed-concurrency", "2", "--max-tokens", "16", "--cost-limit", "%.8f" % limit)
        self.assertEqual(res.returncode, eh.EXIT_BUDGET, res.stderr)
        self.assertIn("cost limit reached", res.stderr)
        self.assertIn("raise --cost-limit and run the same command to resume", res.stderr)
        first = read_samples(out)
        spent = sum(r["cost"]["model"] for r in first)
        reservation = (40 * 4.0 + 16 * 16.0) / 1e6  # a request's most: a long prompt above the threshold
        self.assertLessEqual(spent, limit + reservation)
        self.assertLess(len(first), 30)
        self.assertGreater(len(first), 0)
        res = self.run_qa(out, "--fixed-concurrency", "2", "--max-tokens", "16", "--cost-limit", "%.8f" % (whole * 3))
        self.assertEqual(res.returncode, 0, res.stderr)
        ids = [r["id"] for r in read_samples(out)]
        self.assertEqual(sorted(ids), sorted(r["id"] for r in self.rows))  # each once
        with open(os.path.join(out, "events.jsonl"), encoding="utf-8") as fh:
            self.assertEqual(sum(1 for e in map(json.loads, fh) if e["type"] == "cost_limit"), 1)

    def test_a_cost_limit_needs_prices_for_the_model(self):
        res = run_cli(["run", "--dataset", self.dataset, "--model", "gpt-x", "--base-url", self.mock.url, "--out",
                       os.path.join(self.d, "x"), "--prices", self.prices, "--cost-limit", "1"])
        self.assertEqual(res.returncode, 2)
        self.assertIn("--cost-limit: %s has no price for model 'gpt-x'" % self.prices, res.stderr)


if __name__ == "__main__":
    unittest.main()
