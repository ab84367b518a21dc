"""--task tools: BFCL question files and their possible answers (rows of our own in BFCL's shape), the decoders and
the AST checker's rules, end to end against the mock in both tool modes, the pre-flight's refusal, resume, shards
and the report. The agreement with bfcl-eval's own checker on its shipped files is bench/bfcl_parity.py's."""
import json
import os
import sys
import unittest

from tests.support import CLI, kill_9_then_resume, read_samples, run_cli, start_mock, tempdir

import evalharness as eh


def fn(name, props, required=()):
    return {"name": name, "description": "The %s function." % name,
            "parameters": {"type": "dict", "properties": props, "required": list(required)}}


INT = {"type": "integer", "description": "an integer"}
FLOAT = {"type": "float", "description": "a float"}
STR = {"type": "string", "description": "a string"}
AREA = fn("geometry.area", {"base": INT, "height": FLOAT, "unit": STR}, ["base", "height"])
WEATHER = fn("get_weather", {"city": STR, "days": INT, "tags": {"type": "array", "items": {"type": "string"},
                                                               "description": "tags"},
                             "opts": {"type": "dict", "description": "options", "properties": {
                                 "metric": {"type": "boolean", "description": "metric units"}}}}, ["city"])
NEWS = fn("news", {"topic": STR}, ["topic"])


def q(text, system=None):
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return [msgs]


def bfcl_rows():
    """(questions, answers) covering every supported category, in BFCL's shape."""
    qs = [
        {"id": "simple_python_0", "question": q("Area of a triangle with base 10 and height 5?"), "function": [AREA]},
        {"id": "simple_python_1", "question": q("Weather in Paris for 3 days, metric, tagged rain and wind?"),
         "function": [WEATHER]},
        {"id": "multiple_0", "question": q("News about rust?"), "function": [AREA, WEATHER, NEWS]},
        {"id": "parallel_0", "question": q("Weather in Paris and in Rome?"), "function": [WEATHER]},
        {"id": "parallel_multiple_0", "question": q("News about go, and the area of base 2 height 3?"),
         "function": [NEWS, AREA]},
        {"id": "irrelevance_0", "question": q("Who wrote Hamlet?"), "function": [AREA]},
        {"id": "live_simple_0-0-0", "question": q("Weather in Oslo?", system="Be brief."), "function": [WEATHER]},
        {"id": "live_multiple_0-0-0", "question": q("News on chess?"), "function": [WEATHER, NEWS]},
        {"id": "live_parallel_0-0-0", "question": q("News on tea and on coffee?"), "function": [NEWS]},
        {"id": "live_parallel_multiple_0-0-0", "question": q("Weather in Lima and news on llamas?"),
         "function": [WEATHER, NEWS]},
        {"id": "live_irrelevance_0-0-0", "question": q("Tell me a joke."), "function": [NEWS]},
        {"id": "live_relevance_0-0-0", "question": q("Anything new about space?"), "function": [NEWS]},
    ]
    answers = [
        {"id": "simple_python_0", "ground_truth": [{"geometry.area": {"base": [10], "height": [5.0],
                                                                      "unit": ["units", ""]}}]},
        {"id": "simple_python_1", "ground_truth": [{"get_weather": {"city": ["Paris", "Paris, France"], "days": [3],
                                                                    "tags": [["rain", "wind"]],
                                                                    "opts": [{"metric": [True]}]}}]},
        {"id": "multiple_0", "ground_truth": [{"news": {"topic": ["rust"]}}]},
        {"id": "parallel_0", "ground_truth": [{"get_weather": {"city": ["Paris"], "days": ["", 1]}},
                                              {"get_weather": {"city": ["Rome"], "days": ["", 1]}}]},
        {"id": "parallel_multiple_0", "ground_truth": [{"news": {"topic": ["go", "golang"]}},
                                                       {"geometry.area": {"base": [2], "height": [3.0]}}]},
        {"id": "live_simple_0-0-0", "ground_truth": [{"get_weather": {"city": ["Oslo"]}}]},
        {"id": "live_multiple_0-0-0", "ground_truth": [{"news": {"topic": ["chess"]}}]},
        {"id": "live_parallel_0-0-0", "ground_truth": [{"news": {"topic": ["tea"]}}, {"news": {"topic": ["coffee"]}}]},
        {"id": "live_parallel_multiple_0-0-0", "ground_truth": [{"get_weather": {"city": ["Lima"]}},
                                                                {"news": {"topic": ["llamas"]}}]},
    ]
    return qs, answers


def write_bfcl(d, name="BFCL_v4_mixed.json", rows=None, answers=None):
    """The questions as d/NAME and the answers as d/possible_answer/NAME (JSON Lines, as bfcl-eval ships them)."""
    qs, ans = bfcl_rows()
    rows, answers = rows if rows is not None else qs, answers if answers is not None else ans
    os.makedirs(os.path.join(d, "possible_answer"), exist_ok=True)
    for path, items in ((os.path.join(d, name), rows), (os.path.join(d, "possible_answer", name), answers)):
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in items))
    return os.path.join(d, name)


def run_tools(path, mock, out, *extra):
    return run_cli(["run", "--task", "tools", "--dataset", path, "--model", "m", "--base-url", mock.url, "--out", out,
                    "--no-progress"] + list(extra))


class TestChecker(unittest.TestCase):
    def setUp(self):
        self.ds = eh.ToolDataset(write_bfcl(tempdir(self)))
        self.rows = {r.id: r for r in self.ds.items}

    def verdict(self, rid, text):
        return eh.bfcl_verdict(self.rows[rid], {"text": text}, "prompt")

    def test_the_ast_rules(self):
        cases = [  # (row, reply in BFCL's prompt format, right?, BFCL's error type)
            ("simple_python_0", "[geometry.area(base=10, height=5)]", True, None),  # an int for a float
            ("simple_python_0", "geometry.area(base=10, height=5.0, unit='Units')", True, None),  # case, no brackets
            ("simple_python_0", "[geometry.area(base=10)]", False, "simple_function_checker:missing_required"),
            ("simple_python_0", "[geometry.area(base=11, height=5)]", False, "value_error:others"),
            ("simple_python_0", "[geometry.area(base=10.0, height=5)]", False, "type_error:simple"),
            ("simple_python_0", "[geometry.area(base=10, height=5, color='red')]", False,
             "simple_function_checker:unexpected_param"),
            ("simple_python_0", "[area(base=10, height=5)]", False, "simple_function_checker:wrong_func_name"),
            ("simple_python_0", "[]", False, "simple_function_checker:wrong_count"),
            ("simple_python_0", "I cannot do that.", False, "ast_decoder:decoder_failed"),
            ("simple_python_1", "[get_weather(city='paris, france', days=3, tags=['Rain', 'wind'], "
                                "opts={'metric': True})]", True, None),  # strings as BFCL compares them
            ("simple_python_1", "[get_weather(city='Paris', days=3, tags=['wind', 'rain'], opts={'metric': True})]",
             False, "value_error:list/tuple"),
            ("simple_python_1", "[get_weather(city='Paris', days=3, tags=['rain', 'wind'], opts={'metric': False})]",
             False, "value_error:dict_value"),
            ("simple_python_1", "[get_weather(city='Paris', days=3, tags=['rain', 'wind'])]", False,
             "simple_function_checker:missing_optional"),
            ("parallel_0", "[get_weather(city='Rome'), get_weather(city='Paris', days=1)]", True, None),  # any order
            ("parallel_0", "[get_weather(city='Rome')]", False, "parallel_function_checker_no_order:wrong_count"),
            ("parallel_0", "[get_weather(city='Rome'), get_weather(city='Rome')]", False,
             "parallel_function_checker_no_order:cannot_find_match"),
            ("parallel_multiple_0", "[geometry.area(base=2, height=3), news(topic='golang')]", True, None),
            ("multiple_0", "[news(topic='rust')]", True, None),
            ("multiple_0", "[get_weather(city='rust')]", False, "simple_function_checker:wrong_func_name"),
            ("irrelevance_0", "Hamlet was written by Shakespeare.", True, None),
            ("irrelevance_0", "[geometry.area(base=1, height=1)]", False, "irrelevance_error:decoder_success"),
            ("live_relevance_0-0-0", "[news(topic='space')]", True, None),
            ("live_relevance_0-0-0", "[]", False, "relevance_error:decoder_failed"),
        ]
        for rid, text, right, error_type in cases:
            with self.subTest(rid=rid, text=text):
                v = self.verdict(rid, text)
                self.assertEqual((v["valid"], v["error_type"]), (right, error_type), v["why"])

    def test_native_calls_are_checked_on_the_names_the_tools_carried(self):
        row = self.rows["simple_python_0"]
        call = {"name": "geometry_area", "arguments": json.dumps({"base": 10, "height": 5})}
        self.assertTrue(eh.bfcl_verdict(row, {"tool_calls": [call]}, "native")["valid"])
        dotted = dict(call, name="geometry.area")  # as BFCL: the checker expects the underscore name
        self.assertEqual(eh.bfcl_verdict(row, {"tool_calls": [dotted]}, "native")["error_type"],
                         "simple_function_checker:wrong_func_name")
        self.assertEqual(eh.bfcl_verdict(row, {"tool_calls": [dict(call, arguments="{base: 10")]}, "native")
                         ["error_type"], "ast_decoder:decoder_failed")
        self.assertEqual(eh.bfcl_tools([AREA])[0]["function"]["name"], "geometry_area")
        self.assertEqual(eh.bfcl_tools([AREA])[0]["function"]["parameters"]["properties"]["height"]["type"], "number")

    def test_the_prompt_decoder_reads_python_calls_as_bfcl_does_and_runs_nothing(self):
        self.assertEqual(eh.bfcl_decode_text("```\n[a.b.c(x=-1, y=(1, 2), z=[{'k': None}], w=2*3, v=f(1))]\n```"),
                         [{"a.b.c": {"x": -1, "y": (1, 2), "z": [{"k": None}], "w": 6, "v": "f(1)"}}])
        for bad in ("[x]", "[f(x=1), 2]", "import os", "[f(x=__import__('os').system('true') + 1)]",
                    "[f(x=9**9**9)]"):
            with self.subTest(bad):
                with self.assertRaises(eh._BfclDecodeError):
                    eh.bfcl_decode_text(bad)

    def test_the_prompt_is_bfcls_with_the_python_hint_and_a_rows_system_message_after_it(self):
        msgs = eh.bfcl_messages(self.rows["live_simple_0-0-0"], "prompt")
        self.assertEqual(len(msgs), 2)
        self.assertTrue(msgs[0]["content"].startswith("You are an expert in composing functions.You are given"))
        self.assertTrue(msgs[0]["content"].endswith("\n\nBe brief."))
        self.assertIn("Note that the provided function is in Python 3 syntax.", msgs[0]["content"])
        self.assertEqual(eh.bfcl_messages(self.rows["live_simple_0-0-0"], "native")[0]["content"], "Be brief.")


class TestFiles(unittest.TestCase):
    def test_unsupported_categories_and_missing_answers_are_one_line(self):
        d = tempdir(self)
        qs, ans = bfcl_rows()
        for rid, line, want in (
                ("multi_turn_base_0", 2, "category multi_turn_base is not run here: it is a multi-turn category: its "
                                         "rows go in a file of their own"),
                ("simple_java_0", 1, "category simple_java is not run here"),
                ("memory_kv_0", 1, "category memory_kv is not run here")):
            with self.subTest(rid):
                path = write_bfcl(d, rows=[qs[0]] * (line - 1) + [dict(qs[0], id=rid)], answers=ans)
                res = run_cli(["run", "--task", "tools", "--dataset", path, "--model", "m", "--base-url",
                               "http://127.0.0.1:9/v1", "--out", os.path.join(d, "x")])
                self.assertEqual(res.returncode, 2)
                self.assertIn("BFCL_v4_mixed.json:%d: %s" % (line, want), res.stderr)
                self.assertEqual(len(res.stderr.strip().splitlines()), 1, res.stderr)
        path = write_bfcl(d, answers=[a for a in ans if a["id"] != "multiple_0"])
        with self.assertRaisesRegex(eh.DatasetError, r"BFCL_v4_mixed.json:3: field 'id' has no possible answer"):
            eh.ToolDataset(path)


class TestEndToEnd(unittest.TestCase):
    def test_skill_1_scores_1_and_skill_0_scores_0_on_every_category_in_both_modes(self):
        d = tempdir(self)
        path = write_bfcl(d)
        ds = eh.ToolDataset(path)
        for mode in ("native", "prompt"):
            for skill in (1.0, 0.0):
                with self.subTest(mode=mode, skill=skill):
                    mock = start_mock(self, tools=ds, skill=skill)
                    out = os.path.join(d, "%s-%g" % (mode, skill))
                    res = run_tools(path, mock, out, "--tool-mode", mode, "--json")
                    self.assertEqual(res.returncode, 0, res.stderr)
                    summary = json.loads(res.stdout)
                    cats = summary["tools"]["by_category"]
                    self.assertEqual(set(cats), set(eh.BFCL_CATEGORIES))
                    self.assertEqual({c: v["accuracy"] for c, v in cats.items()},
                                     {c: skill for c in eh.BFCL_CATEGORIES})
                    self.assertEqual(summary["tools"]["non_live_ast"]["accuracy"], skill)
                    self.assertEqual(summary["tools"]["live_ast"]["accuracy"], skill)
                    recs = {r["id"]: r for r in read_samples(out)}
                    self.assertEqual(recs["parallel_0"]["made"]["tool_calls" if mode == "native" else "text"] != [],
                                     True)

    def test_an_endpoint_that_refuses_tools_stops_at_the_pre_flight(self):
        d = tempdir(self)
        path = write_bfcl(d)
        out = os.path.join(d, "run")
        mock = start_mock(self, tools=eh.ToolDataset(path), tools_refused=True)
        res = run_tools(path, mock, out)
        self.assertEqual(res.returncode, 2, res.stderr)
        last = res.stderr.strip().splitlines()[-1]
        self.assertIn("refuses requests with tools (HTTP 400 from %s/chat/completions: \"auto\" tool choice requires"
                      % mock.url, last)
        self.assertIn("start vLLM with --enable-auto-tool-choice", last)
        self.assertEqual(sum("refuses" in line for line in res.stderr.splitlines()), 1, res.stderr)
        self.assertFalse(os.path.exists(out))

    def test_kill_9_then_resume_each_row_once_shards_merge_and_the_report(self):
        d = tempdir(self)
        qs, ans = bfcl_rows()
        rows = [dict(qs[2], id="multiple_%d" % i, question=q("News number %d?" % i)) for i in range(40)]
        answers = [{"id": "multiple_%d" % i, "ground_truth": [{"news": {"topic": ["n%d" % i]}}]} for i in range(40)]
        path = write_bfcl(d, rows=rows, answers=answers)
        ds = eh.ToolDataset(path)
        mock = start_mock(self, tools=ds, skill=0.5, ttft_s=0.1)
        out = os.path.join(d, "run")
        args = [sys.executable, CLI, "run", "--task", "tools", "--dataset", path, "--model", "m", "--base-url",
                mock.url, "--out", out, "--no-progress", "--fixed-concurrency", "2"]
        kill_9_then_resume(self, args, out, 4, [r["id"] for r in rows], 120)
        single = {r["id"]: r["score"] for r in read_samples(out)}
        sharded = os.path.join(d, "sharded")
        for i in range(2):
            res = run_tools(path, mock, sharded, "--shard", "%d/2" % i)
            self.assertEqual(res.returncode, 0, res.stderr)
        res = run_cli(["merge", sharded])
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual({r["id"]: r["score"] for r in read_samples(sharded)}, single)
        text = run_cli(["report", out]).stdout
        self.assertIn("BFCL (native tool calls;", text)
        self.assertIn("misses by reason: simple_function_checker:wrong_func_name %d" % sum(
            1 for s in single.values() if s == 0.0), text)
        self.assertEqual(run_cli(["report", out, "--html"]).returncode, 0)
        with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
            page = fh.read()
        self.assertIn("news_wrong", page)  # a miss: the calls made, beside the expected ones

    def test_a_changed_answer_file_is_scored_again_without_requests(self):
        d = tempdir(self)
        path = write_bfcl(d)
        ds = eh.ToolDataset(path)
        mock = start_mock(self, tools=ds, skill=1.0)
        out = os.path.join(d, "run")
        self.assertEqual(run_tools(path, mock, out).returncode, 0)
        qs, ans = bfcl_rows()
        write_bfcl(d, answers=[dict(a, ground_truth=[{"news": {"topic": ["other"]}}]) if a["id"] == "multiple_0"
                               else a for a in ans])
        asked = mock.stats()["counters"]["requests"]
        res = run_tools(path, mock, out, "--json")
        self.assertEqual(res.returncode, 0, res.stderr)
        recs = {r["id"]: r for r in read_samples(out)}
        self.assertEqual(recs["multiple_0"]["score"], 0.0)
        self.assertEqual(recs["multiple_0"]["error_type"], "value_error:string")
        self.assertEqual(mock.stats()["counters"]["requests"], asked + 1)  # the pre-flight's tools probe only


if __name__ == "__main__":
    unittest.main()
