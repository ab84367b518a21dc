"""`report FOLDER`: a leaderboard over a runs folder, checked against each run's own `report --json`, as text,
JSON, CSV and an HTML page opened in headless Chromium (its cells, its sorting, its links)."""
import csv
import io
import json
import os
import re
import subprocess
import unittest

from tests.support import ClassCtx, qa_rows, run_cli, start_mock, tempdir, write_jsonl
from tests.test_report import require_chromium

MODELS = (("m-small", 0.3), ("m-mid", 0.6), ("m-big", 0.95))


class TestLeaderboard(unittest.TestCase):
    """3 models x 2 datasets against the mock (each model a mock of its own skill): m-mid's beta run is incomplete
    (the mock fails a third of its requests with HTTP 400, which is not retried), m-big's alpha run is two shards
    merged, m-small's alpha run was made twice (the older one is not shown without --all), and a folder holds one
    shard of a run never merged."""

    @classmethod
    def setUpClass(cls):
        ctx = ClassCtx(cls)
        cls.d = tempdir(ctx)
        cls.runs = os.path.join(cls.d, "runs")
        rows = {"alpha": qa_rows(12, "a"), "beta": qa_rows(10, "b")}
        cls.data = {}
        for name, r in rows.items():
            cls.data[name] = os.path.join(cls.d, name + ".jsonl")
            write_jsonl(cls.data[name], r)
        cls.mocks = {}
        for model, skill in MODELS:
            cls.mocks[model] = start_mock(ctx, oracle_rows=rows["alpha"] + rows["beta"], model=model, skill=skill,
                                          seed=7, decode_tok_s=2000)
        cls.mocks["m-mid-faulty"] = start_mock(ctx, oracle_rows=rows["beta"], model="m-mid", skill=0.6, seed=7,
                                               decode_tok_s=2000, faults=(("400", 0.34),))
        cls.dirs = {}

        def run(model, ds, out, *extra, mock=None):
            res = run_cli(["run", "--dataset", cls.data[ds], "--model", model, "--base-url",
                           (mock or cls.mocks[model]).url, "--out", out, "--fixed-concurrency", "4"] + list(extra))
            assert res.returncode in (0, 1), res.stderr
            return out

        cls.old_small = run("m-small", "alpha", os.path.join(cls.runs, "a-older-small-alpha"), "--label", "small")
        for model, _ in MODELS:
            for ds in ("alpha", "beta"):
                out = os.path.join(cls.runs, "%s-%s" % (model, ds))
                if (model, ds) == ("m-mid", "beta"):
                    run(model, ds, out, mock=cls.mocks["m-mid-faulty"])
                elif (model, ds) == ("m-big", "alpha"):
                    for i in (0, 1):
                        run(model, ds, out, "--shard", "%d/2" % i)
                    res = run_cli(["merge", out])
                    assert res.returncode == 0, res.stderr
                else:
                    run(model, ds, out, *(("--label", "small") if model == "m-small" else ()))
                cls.dirs[(model, ds)] = out
        run("m-mid", "alpha", os.path.join(cls.d, "loose", "unmerged"), "--shard", "0/2")
        cls.own = {}
        for key, out in cls.dirs.items():
            res = run_cli(["report", out, "--json"])
            assert res.returncode == 0, res.stderr
            cls.own[key] = json.loads(res.stdout)

    def board(self, *args):
        res = run_cli(["report", self.runs] + list(args))
        return res

    def cell_of(self, cells, model, ds):
        want = os.path.normpath(self.dirs[(model, ds)])
        found = [c for c in cells if os.path.normpath(c["run_dir"]) == want]
        self.assertEqual(len(found), 1, (model, ds, [c["run_dir"] for c in cells]))
        return found[0]

    def test_each_cell_is_its_run_s_own_report_and_the_incomplete_run_is_flagged(self):
        res = self.board("--json")
        self.assertEqual(res.returncode, 1, res.stderr)  # a cell is incomplete: said, and not a clean exit
        self.assertIn("INCOMPLETE: 1 cell(s)", res.stderr)
        board = json.loads(res.stdout)
        self.assertEqual(board["columns"], ["qa alpha.jsonl", "qa beta.jsonl"])
        self.assertEqual(board["rows"], ["m-big", "m-mid", "small"])  # m-small's runs carry --label small
        self.assertEqual(len(board["cells"]), 6)
        for (model, ds), own in self.own.items():
            cell = self.cell_of(board["cells"], model, ds)
            self.assertEqual((cell["mean"], cell["ci95"], cell["n"]),
                             (own["score"]["mean"], own["score"]["ci95"], own["score"]["n"]), (model, ds))
            self.assertEqual(cell["complete"], own["complete"] and own["status"] == "finished", (model, ds))
            self.assertEqual(cell["complete"], (model, ds) != ("m-mid", "beta"))
            self.assertEqual(cell["model"], model)
        self.assertGreater(self.own[("m-mid", "beta")]["counts"]["failed"], 0)
        # shards are parts: the merged run is one cell, and neither its shards nor a lone shard is a run
        self.assertFalse([c for c in board["cells"] if "shard-" in c["run_dir"]])
        self.assertEqual(self.cell_of(board["cells"], "m-big", "alpha")["n"], 12)
        self.assertEqual(board["unmerged_shards"], [])  # (the loose shard is in another folder)
        text = self.board().stdout
        row = [line for line in text.splitlines() if line.startswith("m-mid ")][0]
        own = self.own[("m-mid", "beta")]
        self.assertIn("%.3f [%.3f, %.3f] n=%d INCOMPLETE %d/10" % (
            own["score"]["mean"], own["score"]["ci95"][0], own["score"]["ci95"][1], own["score"]["n"],
            own["counts"]["ok"]), row)

    def test_the_latest_run_per_model_and_dataset_unless_all_and_a_lone_shard_is_named_not_shown(self):
        board = json.loads(self.board("--json").stdout)
        self.assertNotIn(os.path.normpath(self.old_small), [os.path.normpath(c["run_dir"]) for c in board["cells"]])
        every = json.loads(self.board("--json", "--all").stdout)
        self.assertEqual(len(every["cells"]), 7)
        self.assertIn("small [a-older-small-alpha]", every["rows"])
        res = run_cli(["report", os.path.join(self.d, "loose"), "--json"])
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("no finished run under", res.stderr)
        self.assertIn("only shards, not merged: %s" % os.path.join(self.d, "loose", "unmerged", "shard-0-of-2"),
                      res.stderr)
        res = run_cli(["report", self.runs, os.path.join(self.d, "loose")])
        self.assertEqual(res.returncode, 1)
        self.assertIn("is a shard, not a whole run (merge its folder: evalharness merge %s)"
                      % os.path.join(self.d, "loose", "unmerged"), res.stdout)

    def test_a_run_s_own_report_names_its_label(self):
        """--label names the leaderboard's row and is shown in that run's own report (text, JSON, HTML)."""
        own, other = self.own[("m-small", "alpha")], self.own[("m-big", "beta")]
        self.assertEqual(own["label"], "small")
        self.assertIn(["label", "small"], own["report"]["config_rows"])
        self.assertNotIn("label", other)
        self.assertNotIn("label", [k for k, _ in other["report"]["config_rows"]])
        out = self.dirs[("m-small", "alpha")]
        res = run_cli(["report", out])
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertRegex(res.stdout, r"(?m)^\s*label:?\s+small$")
        with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
            self.assertIn("<tr><th>label</th><td>small</td></tr>", fh.read())

    def test_csv_parses_back_to_the_json_numbers(self):
        board = json.loads(self.board("--json").stdout)
        res = self.board("--csv")
        rows = list(csv.DictReader(io.StringIO(res.stdout)))
        self.assertEqual(len(rows), 6)
        for row in rows:
            cell = [c for c in board["cells"] if c["run_dir"] == row["run_dir"]][0]
            self.assertEqual((float(row["mean"]), float(row["ci_low"]), float(row["ci_high"]), int(row["n"])),
                             (cell["mean"], cell["ci95"][0], cell["ci95"][1], cell["n"]))
            self.assertEqual(row["complete"], "1" if cell["complete"] else "0")
            self.assertEqual(row["column"], cell["column"])

    def test_a_baseline_row_gives_each_cell_of_its_columns_the_paired_difference_of_report_a_b(self):
        board = json.loads(self.board("--json", "--baseline", "small").stdout)
        for model, ds in (("m-mid", "alpha"), ("m-big", "beta"), ("m-mid", "beta")):
            cell = self.cell_of(board["cells"], model, ds)
            res = run_cli(["report", self.dirs[("m-small", ds)], self.dirs[(model, ds)], "--json"])
            pair = json.loads(res.stdout)
            self.assertEqual((cell["delta"]["diff"], cell["delta"]["ci95"], cell["delta"]["paired"]),
                             (pair["score"]["diff"], pair["score"]["ci95"], pair["paired_scored"]), (model, ds))
        self.assertNotIn("delta", self.cell_of(board["cells"], "m-small", "alpha"))
        bad = self.board("--baseline", "nobody")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--baseline 'nobody' names no run directory and no row; rows: m-big, m-mid, small", bad.stderr)

    def test_the_html_page_in_chromium_shows_the_cells_sorts_by_a_column_and_links_each_run_s_report(self):
        exe = require_chromium(self)
        page = os.path.join(tempdir(self), "board.html")
        res = self.board("--html", page)
        self.assertEqual(res.returncode, 1, res.stderr)
        with open(page, encoding="utf-8") as fh:
            source = fh.read()
        # a copy that clicks the header of the beta column once the page's own sorting script is in place
        clicked = os.path.join(os.path.dirname(page), "clicked.html")
        with open(clicked, "w", encoding="utf-8") as fh:
            fh.write(source.replace("</body>", "<script>document.querySelectorAll('#leaderboard th')[2].click();"
                                              "</script></body>"))
        flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--user-data-dir=" + tempdir(self), "--dump-dom"]
        doms = {}
        for name, path in (("page", page), ("clicked", clicked)):
            dom = subprocess.run(flags + ["file://" + path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 universal_newlines=True, timeout=120)
            self.assertEqual(dom.returncode, 0, dom.stderr[-2000:])
            doms[name] = dom.stdout
        self.assertIn('data-ready="1"', doms["page"])  # the script ran
        for (model, ds), own in self.own.items():
            self.assertIn("%.3f</a> <span class=\"muted\">[%.3f, %.3f] n=%d</span>" % (
                own["score"]["mean"], own["score"]["ci95"][0], own["score"]["ci95"][1], own["score"]["n"]),
                doms["page"])
        self.assertIn("INCOMPLETE", doms["page"])
        links = re.findall(r'<a href="([^"]+)">', doms["page"])
        self.assertEqual(len(links), 6)
        for link in links:  # each to its run's report.html, written where it was missing
            target = os.path.normpath(os.path.join(os.path.dirname(page), link))
            self.assertTrue(target.endswith("report.html") and os.path.exists(target), target)
        self.assertEqual(sorted(os.path.dirname(os.path.normpath(os.path.join(os.path.dirname(page), x)))
                                for x in links), sorted(os.path.normpath(d) for d in self.dirs.values()))

        def order(dom):
            body = dom[dom.index("<tbody>"):dom.index("</tbody>")]
            return [re.sub("<[^>]+>", "", r.split("</td>")[0]) for r in body.split("<tr>")[1:]]

        betas = {self.cell_of(json.loads(self.board("--json").stdout)["cells"], m, "beta")["mean"]: m
                 for m, _ in MODELS}
        by_beta = [betas[v] for v in sorted(betas)]
        self.assertEqual(order(doms["page"]), ["m-big", "m-mid", "small"])
        self.assertEqual([{"m-small": "small"}.get(m, m) for m in by_beta], order(doms["clicked"]))
        self.assertNotEqual(order(doms["page"]), order(doms["clicked"]))


if __name__ == "__main__":
    unittest.main()
