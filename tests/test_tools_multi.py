"""BFCL's multi-turn categories (Tool back-ends, Multi-turn tools, Tool runs): the back-ends' rules against results
bfcl-eval's own classes gave (tests/data/bfcl_multi_backends.json), the executor's and the checker's rules, rows of
our own in bfcl-eval's layout run end to end against the mock in both tool modes, a held-back function, the step
limit against a real HTTP server that never stops calling, kill -9 and resume, shards merged, the report's
trajectories."""
import http.server
import json
import os
import sys
import threading
import unittest

from tests.support import CLI, ROOT, kill_9_then_resume, read_samples, run_cli, start_mock, tempdir

sys.path.insert(0, ROOT)
import evalharness as eh  # noqa: E402

FS_ROOT = {"alex": {"type": "directory", "contents": {
    "docs": {"type": "directory", "contents": {"notes.txt": {"type": "file", "content": "alpha\nbeta\ngamma"}}},
    "log.txt": {"type": "file", "content": "one two"}}}}
TWITTER = {"username": "ann", "password": "pw", "authenticated": True, "tweets": {}, "comments": {}, "retweets": {},
           "following_list": ["bob"], "tweet_counter": 0}


def docs_of(cls_name):
    """Function documents in bfcl-eval's layout for a back-end's public methods (from their signatures)."""
    cls = eh._mt_backends()[cls_name]
    out = []
    for name in eh._mt_methods(cls):
        import inspect
        params = [p for p in inspect.signature(getattr(cls, name)).parameters.values() if p.name != "self"]
        out.append({"name": name, "description": "The %s function." % name, "parameters": {
            "type": "dict", "properties": {p.name: {"type": "string", "description": p.name} for p in params},
            "required": [p.name for p in params if p.default is inspect.Parameter.empty]},
            "response": {"type": "dict", "properties": {}}})
    return out


def mt_rows(n_copies=1):
    """Rows of our own in bfcl-eval's layout: (category, question row, ground truth)."""
    rows = []
    for i in range(n_copies):
        tag = "" if n_copies == 1 else " (%d)" % i
        rows += [
            ("multi_turn_base", {"id": "multi_turn_base_%d" % (3 * i), "question": [
                [{"role": "user", "content": "Go into docs and make a folder named archive." + tag}],
                [{"role": "user", "content": "Move notes.txt into archive."}],
                [{"role": "user", "content": "Show me notes.txt from inside archive."}]],
                "initial_config": {"GorillaFileSystem": {"root": FS_ROOT}}, "involved_classes": ["GorillaFileSystem"],
                "path": []},
             [["cd(folder='docs')", "mkdir(dir_name='archive')"], ["mv(source='notes.txt', destination='archive')"],
              ["cd(folder='archive')", "cat('notes.txt')"]]),
            ("multi_turn_base", {"id": "multi_turn_base_%d" % (3 * i + 1), "question": [
                [{"role": "user", "content": "Post 'launch day' on Twitter." + tag}],
                [{"role": "user", "content": "Log in as USR001 and tell Bob (USR002) it is done."}],
                [{"role": "user", "content": "Anything else? No, that is all."}]],
                "initial_config": {"TwitterAPI": TWITTER}, "involved_classes": ["TwitterAPI", "MessageAPI"]},
             [["post_tweet(content='launch day')"], ["message_login(user_id='USR001')",
                                                     "send_message(receiver_id='USR002', message='done')"], []]),
            ("multi_turn_base", {"id": "multi_turn_base_%d" % (3 * i + 2), "question": [
                [{"role": "user", "content": "Log in and put 100 in my trading account." + tag}],
                [{"role": "user", "content": "Buy 10 AAPL at 227.16."}]],
                "initial_config": {}, "involved_classes": ["TradingBot", "MathAPI"]},
             [["trading_login(username='a', password='b')", "fund_account(amount=100)"],
              ["place_order(order_type='Buy', symbol='AAPL', price=227.16, amount=10)"]]),
        ]
    return rows


def miss_func_row():
    return ("multi_turn_miss_func", {"id": "multi_turn_miss_func_0", "question": [
        [{"role": "user", "content": "Go into docs."}],
        [{"role": "user", "content": "Show the last line of notes.txt."}], []],
        "initial_config": {"GorillaFileSystem": {"root": FS_ROOT}}, "involved_classes": ["GorillaFileSystem"],
        "missed_function": {"2": ["tail"]}},
        [["cd(folder='docs')"], [], ["tail(file_name='notes.txt', lines=1)"]])


def write_mt(d, rows, name="BFCL_v4_multi_turn_base.json", classes=None):
    """A question file, its possible_answer/ twin and multi_turn_func_doc/ beside it, as bfcl-eval ships them."""
    os.makedirs(os.path.join(d, "possible_answer"), exist_ok=True)
    os.makedirs(os.path.join(d, "multi_turn_func_doc"), exist_ok=True)
    with open(os.path.join(d, name), "w") as fh:
        fh.writelines(json.dumps(q) + "\n" for _, q, _ in rows)
    with open(os.path.join(d, "possible_answer", name), "w") as fh:
        fh.writelines(json.dumps({"id": q["id"], "ground_truth": gt}) + "\n" for _, q, gt in rows)
    for cls in classes if classes is not None else {c for _, q, _ in rows for c in q["involved_classes"]}:
        with open(os.path.join(d, "multi_turn_func_doc", eh.MT_DOC_FILES[cls]), "w") as fh:
            fh.writelines(json.dumps(doc) + "\n" for doc in docs_of(cls))
    return os.path.join(d, name)


def made_from(row, turns_calls, mode):
    """Replies as made (per turn, per step) that make these calls, each turn's calls in one step then text."""
    out = []
    for calls in turns_calls:
        steps = []
        if calls:
            parts = [eh.mt_call_arguments(row, c) for c in calls]
            if mode == "native":
                steps.append({"text": "", "tool_calls": [{"id": "c%d" % i, "name": n, "arguments": json.dumps(k)}
                                                         for i, (n, k) in enumerate(parts)]})
            else:
                steps.append({"text": "[%s]" % ", ".join("%s(%s)" % (n, ", ".join("%s=%r" % kv for kv in k.items()))
                                                         for n, k in parts), "tool_calls": []})
        steps.append({"text": "Done.", "tool_calls": []})
        out.append(steps)
    return out


def run_tools(path, url, out, *extra):
    return run_cli(["run", "--task", "tools", "--dataset", path, "--model", "m", "--base-url", url, "--out", out,
                    "--no-progress"] + list(extra))


class TestBackends(unittest.TestCase):
    """Each back-end's main rules: call sequences and the results bfcl-eval's own classes gave for them."""

    def test_every_sequence_gives_the_official_results(self):
        with open(os.path.join(ROOT, "tests", "data", "bfcl_multi_backends.json")) as fh:
            cases = json.load(fh)["cases"]
        self.assertEqual({c for case in cases for c in case["classes"]}, set(eh.MT_DOC_FILES))
        for i, case in enumerate(cases):
            with self.subTest(classes=case["classes"], long_context=case["long_context"]):
                row = eh.MultiTurnRow(id="row_%d" % i, category="multi_turn_long_context" if case["long_context"]
                                      else "multi_turn_base", turns=((),), classes=tuple(case["classes"]),
                                      config=case["config"], functions=(), held={}, truth=((),), source="test")
                got = eh._MTWorld(row, {"model": "ref%d" % i}).execute("model", case["calls"])
                for call, want, have in zip(case["calls"], case["results"], got):
                    self.assertEqual(have, want, call)
                self.assertEqual(len(got), len(case["calls"]))

    def test_a_rows_instances_share_what_one_official_process_shares_and_rows_do_not(self):
        row = eh.MultiTurnRow(id="multi_turn_base_9", category="multi_turn_base", turns=((),),
                              classes=("TwitterAPI",), config={"TwitterAPI": TWITTER}, functions=(), held={},
                              truth=((),), source="test")
        world = eh._MTWorld(row, {"model": "m", "truth": "t"})
        world.execute("model", ["post_tweet(content='a')", "mention(tweet_id=0, mentioned_usernames=['@bob'])"])
        # post_tweet's default list is shared: the ground truth's next post omitting mentions carries @bob
        self.assertIn('"mentions": ["@bob"]', world.execute("truth", ["post_tweet(content='b')"])[0])
        fresh = eh._MTWorld(row, {"model": "m"})
        self.assertIn('"mentions": []', fresh.execute("model", ["post_tweet(content='b')"])[0])
        travel = eh.MultiTurnRow(id="multi_turn_long_context_1", category="multi_turn_long_context", turns=((),),
                                 classes=("TravelAPI",), config={"TravelAPI": {"access_token": "tok"}}, functions=(),
                                 held={}, truth=((),), source="test")
        world = eh._MTWorld(travel, {"model": "m", "truth": "t"})
        card = next(iter(world.of("model")["TravelAPI"].credit_card_list))
        world.of("model")["TravelAPI"].credit_card_list[card]["balance"] -= 1000
        self.assertEqual(world.of("truth")["TravelAPI"].credit_card_list[card]["balance"],
                         world.of("model")["TravelAPI"].credit_card_list[card]["balance"])
        other = eh._MTWorld(travel, {"model": "m"}).of("model")["TravelAPI"].credit_card_list[card]["balance"]
        self.assertEqual(other, world.of("model")["TravelAPI"].credit_card_list[card]["balance"] + 1000)


class TestExecutor(unittest.TestCase):
    def setUp(self):
        self.row = eh.MultiTurnRow(id="multi_turn_base_0", category="multi_turn_base", turns=((),),
                                   classes=("GorillaFileSystem", "MathAPI"), config={"GorillaFileSystem": {
                                       "root": FS_ROOT}}, functions=(), held={}, truth=((),), source="test")

    def run_calls(self, *calls):
        return eh._MTWorld(self.row, {"model": "model"}).execute("model", list(calls))

    def test_failures_come_back_as_bfcls_texts_and_nothing_is_evald(self):
        got = self.run_calls("exit()", "os.remove(path='x')", "foo(a=1)", "cd(folder='a', folder='b')",
                             "GorillaFileSystem.cd(folder='docs')", "add(a=1)", "print(x=1)",
                             "cd(folder=__import__('os').getcwd())", "cd(folder='docs'")
        self.assertEqual(got[:6], [
            "Error during execution: Function call exit is not allowed.",
            "Error during execution: Function call remove is not allowed.",
            "Error during execution: name 'foo' is not defined",
            "Error during execution: keyword argument repeated: folder (<string>, line 1)",
            "Error during execution: name 'GorillaFileSystem' is not defined",
            "Error during execution: MathAPI.add() missing 1 required positional argument: 'b'"])
        self.assertIn("not run here", got[6])
        self.assertIn("not run here", got[7])
        self.assertTrue(got[8].startswith("Error during execution: "), got[8])

    def test_results_as_text_nested_calls_and_the_instance_name_written_into_strings(self):
        got = self.run_calls("cd(folder='docs')", "mkdir(dir_name='x')", "ls()", "cd(folder=pwd())",
                             "echo(content='run ls() now', file_name='notes.txt')", "cat(file_name='notes.txt')")
        self.assertEqual(got[:3], ['{"current_working_directory": "docs"}', "None",
                                   '{"current_directory_content": ["notes.txt", "x"]}'])
        self.assertEqual(got[3], "Error during execution: 'dict' object has no attribute 'rstrip'")  # pwd() ran
        # BFCL prefixes anything that looks like a method call, inside strings too: the file says so
        self.assertIn("run model_multi_turn_base_0_GorillaFileSystem_instance.ls() now", got[5])

    def test_decoding_native_and_prompt_replies_as_bfcl_writes_them_back(self):
        step = {"text": "", "tool_calls": [{"id": "1", "name": "cd", "arguments": '{"folder": "a", "n": 1.5}'}]}
        self.assertEqual(eh.mt_decode_step(step, "native"), ["cd(folder='a',n=1.5)"])
        for bad in ('{"folder": ', '[1]', "null"):
            with self.assertRaises(eh._BfclDecodeError):
                eh.mt_decode_step({"tool_calls": [{"name": "cd", "arguments": bad}]}, "native")
        self.assertEqual(eh.mt_decode_step({"text": "```\n[cd(folder='a'), sort('x'), f(a=g(b=1), c={'k': 2})]\n```"},
                                           "prompt"), ["cd(folder='a')", "sort()", "f(a=g(b=1), c={'k': 2})"])
        with self.assertRaises(eh._BfclDecodeError):  # an empty dict argument fails BFCL's decoder: the turn ends
            eh.mt_decode_step({"text": "[edit_ticket(ticket_id=1, updates={})]"}, "prompt")
        with self.assertRaises(eh._BfclDecodeError):
            eh.mt_decode_step({"text": "I cannot do that."}, "prompt")


class TestChecker(unittest.TestCase):
    def setUp(self):
        d = tempdir(self)
        self.ds = eh.MultiTurnDataset(write_mt(d, mt_rows() + []))
        self.fs, self.social = self.ds.items[0], self.ds.items[1]

    def verdict(self, row, calls, mode="native"):
        return eh.mt_verdict(row, made_from(row, calls, mode), mode)

    def test_the_ground_truth_passes_in_both_modes_and_each_rule_fails_its_case(self):
        for row in self.ds.items:
            for mode in ("native", "prompt"):
                self.assertTrue(self.verdict(row, row.truth, mode)["valid"], (row.id, mode))
        gt = [list(t) for t in self.fs.truth]
        wrong = self.verdict(self.fs, [gt[0], ["mv(source='notes.txt', destination='elsewhere')"], gt[2]])
        self.assertEqual((wrong["error_type"], wrong["turn"]), ("multi_turn:instance_state_mismatch", 1))
        self.assertIn("root", wrong["differences"])
        # a read-only call missing: the state is right, a ground-truth result is not among the model's
        missing = self.verdict(self.fs, [gt[0], gt[1], ["cd(folder='archive')"]])
        self.assertEqual((missing["error_type"], missing["missing"]), (
            "multi_turn:execution_response_mismatch", ['{"file_content": "alpha\\nbeta\\ngamma"}']))
        empty = self.verdict(self.fs, [gt[0], [], gt[2]])
        self.assertEqual((empty["error_type"], empty["turn"]), ("multi_turn:empty_turn_model_response", 1))
        short = eh.mt_verdict(self.fs, made_from(self.fs, gt[:2], "native"), "native")
        self.assertEqual(short["error_type"], "multi_turn:force_terminated")
        # an extra read-only call is allowed; results of earlier turns count for later ones
        self.assertTrue(self.verdict(self.fs, [gt[0] + ["ls()"], gt[1], gt[2]])["valid"])
        self.assertTrue(self.verdict(self.fs, [gt[0] + ["cat(file_name='notes.txt')"], gt[1],
                                               ["cd(folder='archive')"]])["valid"])
        # a turn the ground truth does not act in is not checked, but what the model does there still runs
        social = [list(t) for t in self.social.truth]
        self.assertTrue(self.verdict(self.social, social[:2] + [["get_user_stats(username='ann')"]])["valid"])
        later = self.verdict(self.social, social[:2] + [["post_tweet(content='extra')"]])
        self.assertTrue(later["valid"])  # (its last turn is unchecked: nothing after it compares the state)

    def test_seeded_results_must_match_in_number_and_order(self):
        social = [list(t) for t in self.social.truth]
        twice = self.verdict(self.social, [social[0], ["message_login(user_id='USR001')",
                                                       "send_message(receiver_id='USR002', message='x')",
                                                       "send_message(receiver_id='USR002', message='done')"], []])
        self.assertEqual(twice["error_type"], "multi_turn:instance_state_mismatch")  # ids drawn in another order


class TestHeldBack(unittest.TestCase):
    def test_a_held_back_function_is_offered_at_its_turn_last_without_the_hint(self):
        d = tempdir(self)
        ds = eh.MultiTurnDataset(write_mt(d, [miss_func_row()], name="BFCL_v4_multi_turn_miss_func.json"))
        row = ds.items[0]
        names = [t["function"]["name"] for t in eh.mt_visible(row, 1)]
        self.assertNotIn("tail", names)
        after = eh.mt_visible(row, 2)
        self.assertEqual(after[-1]["function"]["name"], "tail")
        self.assertNotIn("Python 3 syntax", after[-1]["function"]["description"])
        self.assertIn("Python 3 syntax", after[0]["function"]["description"])
        self.assertEqual(eh.mt_turn_messages(row, 2, "native"), [{"role": "user", "content": eh.MT_HELD_MESSAGE}])
        prompt = eh.mt_turn_messages(row, 2, "prompt")[0]["content"]
        self.assertTrue(prompt.startswith("[{'name': 'tail'") and prompt.endswith("\n" + eh.MT_HELD_MESSAGE))
        self.assertNotIn('"name": "tail"', eh.mt_turn_messages(row, 0, "prompt")[0]["content"])
        gt = [list(t) for t in row.truth]
        self.assertTrue(eh.mt_verdict(row, made_from(row, gt, "native"), "native")["valid"])
        # called a turn early (the model guessed it): its result counts, but the hold-out turn still needs a call
        early = made_from(row, [gt[0], gt[2], []], "native")
        self.assertEqual(eh.mt_verdict(row, early, "native")["error_type"], "multi_turn:empty_turn_model_response")
        self.assertTrue(eh.mt_verdict(row, made_from(row, [gt[0], gt[2], ["pwd()"]], "native"), "native")["valid"])


class _AlwaysCalls(http.server.BaseHTTPRequestHandler):
    """A real server whose model never stops calling pwd() (the step limit's case)."""

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        if self.path.endswith("/chat/completions"):
            msg = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_%d" % len(self.server.bodies),
                   "type": "function", "function": {"name": "pwd", "arguments": "{}"}}]}
            if not body.get("tools"):
                msg = {"role": "assistant", "content": "[pwd()]"}
            reply = {"id": "x", "object": "chat.completion", "model": "m", "choices": [
                {"index": 0, "message": msg, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2}}
        else:
            reply = {"error": "not here"}
        data = json.dumps(reply).encode()
        self.send_response(200 if "error" not in reply else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        data = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
        self.send_response(200 if self.path.endswith("/models") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class TestEndToEnd(unittest.TestCase):
    def test_skill_1_is_right_and_skill_0_wrong_in_both_modes_with_the_trajectory_in_the_report(self):
        d = tempdir(self)
        path = write_mt(d, mt_rows())
        ds = eh.MultiTurnDataset(path)
        for mode in ("native", "prompt"):
            for skill in (1.0, 0.0):
                with self.subTest(mode=mode, skill=skill):
                    mock = start_mock(self, tools=ds, skill=skill)
                    out = os.path.join(d, "%s-%g" % (mode, skill))
                    res = run_tools(path, mock.url, out, "--tool-mode", mode, "--json")
                    self.assertEqual(res.returncode, 0, res.stderr)
                    summary = json.loads(res.stdout)
                    self.assertEqual(summary["tools"]["by_category"]["multi_turn_base"],
                                     {"accuracy": skill, "n": 3}, read_samples(out))
                    recs = read_samples(out)
                    self.assertTrue(all(r["scorer"] == "bfcl_multi_turn" and r["turns"] == len(r["made"]["turns"])
                                        for r in recs))
        text = run_cli(["report", os.path.join(d, "native-0")]).stdout
        self.assertIn("trajectories (3 wrong row(s); every one is in samples.jsonl):", text)
        self.assertIn("multi_turn_base_0 (multi_turn_base): multi_turn:", text)
        self.assertIn("    cd(folder='docs_wrong') -> {\"error\": \"cd: 'docs_wrong': No such file or directory\"}", text)
        self.assertIn("multi-turn - (no multi_turn_miss_func, multi_turn_miss_param, multi_turn_long_context)", text)
        right = json.loads(run_cli(["report", os.path.join(d, "prompt-1"), "--json"]).stdout)["trajectories"]
        self.assertEqual(right[0]["trajectory"][1]["steps"][0], {
            "calls": ["mv(source='notes.txt', destination='archive')"],
            "results": ['{"result": "\'notes.txt\' moved to \'archive/notes.txt\'"}']})
        self.assertEqual(right[0]["trajectory"][1]["changed"].keys(), {"GorillaFileSystem"})
        self.assertEqual(run_cli(["report", os.path.join(d, "native-0"), "--html"]).returncode, 0)
        with open(os.path.join(d, "native-0", "report.html"), encoding="utf-8") as fh:
            self.assertIn("<h2>Trajectories</h2>", fh.read())

    def test_a_miss_func_row_end_to_end_gets_the_held_back_function_at_its_turn(self):
        d = tempdir(self)
        path = write_mt(d, [miss_func_row()], name="BFCL_v4_multi_turn_miss_func.json")
        mock = start_mock(self, tools=eh.MultiTurnDataset(path), skill=1.0)
        for mode in ("native", "prompt"):
            out = os.path.join(d, mode)
            self.assertEqual(run_tools(path, mock.url, out, "--tool-mode", mode).returncode, 0)
            rec = read_samples(out)[0]
            self.assertEqual((rec["score"], rec["turns"]), (1.0, 3), rec)
            self.assertEqual(rec["trajectory"][2]["steps"][0]["calls"], ["tail(file_name='notes.txt', lines=1)"]
                             if mode == "prompt" else ["tail(file_name='notes.txt',lines=1)"])  # (as BFCL writes them)

    def test_a_model_that_never_stops_calling_is_stopped_after_21_steps_and_the_row_ends(self):
        d = tempdir(self)
        path = write_mt(d, mt_rows()[:1])
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AlwaysCalls)
        server.bodies = []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        url = "http://127.0.0.1:%d/v1" % server.server_address[1]
        for mode in ("native", "prompt"):
            out = os.path.join(d, mode)
            del server.bodies[:]
            res = run_tools(path, url, out, "--tool-mode", mode, "--fixed-concurrency", "1")
            self.assertEqual(res.returncode, 0, res.stderr)
            rec = read_samples(out)[0]
            self.assertEqual((rec["error_type"], rec["forced"], rec["turns"], rec["steps"]),
                             ("multi_turn:force_terminated", True, 1, 21))
            asked = [b for b in server.bodies if b.get("messages") and any(
                "docs and make a folder" in str(m.get("content")) for m in b["messages"])]
            self.assertEqual(len(asked), 21)  # the 21st step's call ran; the model was not asked again
            last = asked[-1]["messages"]
            if mode == "native":
                self.assertEqual([m["role"] for m in last[-3:]], ["tool", "assistant", "tool"])
                self.assertEqual(last[-1]["content"], '{"current_working_directory": "/alex"}')
            else:
                self.assertEqual(last[-1], {"role": "user", "content": "[{'role': 'tool', 'name': 'pwd()', "
                                                                       "'content': '{\"current_working_directory\": "
                                                                       "\"/alex\"}'}]"})

    def test_kill_9_then_resume_runs_each_row_once_and_two_shards_merge_to_the_same_verdicts(self):
        d = tempdir(self)
        rows = mt_rows(6)
        path = write_mt(d, rows)
        mock = start_mock(self, tools=eh.MultiTurnDataset(path), skill=0.5, ttft_s=0.05)
        out = os.path.join(d, "run")
        args = [sys.executable, CLI, "run", "--task", "tools", "--dataset", path, "--model", "m", "--base-url",
                mock.url, "--out", out, "--no-progress", "--fixed-concurrency", "2"]
        kill_9_then_resume(self, args, out, 3, [q["id"] for _, q, _ in rows], 120)
        single = {r["id"]: (r["score"], r["error_type"]) for r in read_samples(out)}
        self.assertTrue(0 < sum(s for s, _ in single.values()) < len(rows))
        sharded = os.path.join(d, "sharded")
        for i in range(2):
            self.assertEqual(run_tools(path, mock.url, sharded, "--shard", "%d/2" % i).returncode, 0)
        res = run_cli(["merge", sharded, "--json"])
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual({r["id"]: (r["score"], r["error_type"]) for r in read_samples(sharded)}, single)
        merged = json.loads(run_cli(["report", sharded, "--json"]).stdout)
        alone = json.loads(run_cli(["report", out, "--json"]).stdout)
        self.assertEqual(merged["tools"]["by_category"], alone["tools"]["by_category"])

    def test_a_changed_ground_truth_is_scored_again_from_the_stored_replies_without_requests(self):
        d = tempdir(self)
        rows = mt_rows()
        path = write_mt(d, rows)
        mock = start_mock(self, tools=eh.MultiTurnDataset(path), skill=1.0)
        out = os.path.join(d, "run")
        self.assertEqual(run_tools(path, mock.url, out, "--tool-mode", "prompt").returncode, 0)
        asked = mock.stats()["counters"]["requests"]
        rows[0][2][2] = ["cd(folder='archive')", "cat(file_name='notes.txt')", "ls()"]  # ls() never made
        write_mt(d, rows)
        res = run_tools(path, mock.url, out, "--tool-mode", "prompt", "--json")
        self.assertEqual(res.returncode, 0, res.stderr)
        recs = {r["id"]: r for r in read_samples(out)}
        self.assertEqual(recs["multi_turn_base_0"]["error_type"], "multi_turn:execution_response_mismatch")
        self.assertIn("rescored_at", recs["multi_turn_base_0"])
        self.assertNotIn("rescored_at", recs["multi_turn_base_1"])
        self.assertEqual(recs["multi_turn_base_1"]["score"], 1.0)
        self.assertEqual(mock.stats()["counters"]["requests"], asked)
        self.assertEqual(json.loads(res.stdout)["tools"]["by_category"]["multi_turn_base"]["accuracy"],
                         round(2 / 3, 6))


class TestBadInput(unittest.TestCase):
    def test_each_problem_is_one_line_naming_the_file_line_and_field(self):
        d = tempdir(self)
        rows = mt_rows()
        cases = [
            ("involved_classes", [(rows[0][0], dict(rows[0][1], involved_classes=["Nope"]), rows[0][2])],
             ":1: field 'involved_classes' must list back-ends among"),
            ("missed_function", [(rows[0][0], dict(rows[0][1], missed_function={"1": ["nope"]},
                                                   question=[rows[0][1]["question"][0], []]), rows[0][2][:2])],
             ":1: field 'missed_function' names 'nope', which no involved class has"),
            ("turns", [(rows[0][0], rows[0][1], rows[0][2][:2])],
             "field 'ground_truth' has 2 turn(s), the question 3"),
        ]
        for name, bad, want in cases:
            with self.subTest(name):
                path = write_mt(os.path.join(d, name), bad, classes=["GorillaFileSystem"])
                res = run_tools(path, "http://127.0.0.1:9/v1", os.path.join(d, name, "out"))
                self.assertEqual(res.returncode, 2, res.stderr)
                self.assertIn(want, res.stderr)
                self.assertEqual(len(res.stderr.strip().splitlines()), 1, res.stderr)
        os.makedirs(os.path.join(d, "nodocs", "possible_answer"))
        path = write_mt(os.path.join(d, "nodocs"), rows[:1], classes=[])
        res = run_tools(path, "http://127.0.0.1:9/v1", os.path.join(d, "nodocs", "out"))
        self.assertEqual(res.returncode, 2)
        self.assertIn("gorilla_file_system.json: no such file (the function documents of GorillaFileSystem", res.stderr)


if __name__ == "__main__":
    unittest.main()
