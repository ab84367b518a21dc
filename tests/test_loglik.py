"""--task choice: multiple choice by log-likelihood over /v1/completions, against the mock's toy language model.

The toy model's closed form (README: The mock model): a token is a word with the whitespace before it, and its
log-probability is -(1 + 0.1 x its characters). Expected values here are worked out by hand from it (``toy_ll``
below restates it independently of the module).
"""
import json
import math
import os
import re
import sys
import unittest

from tests.support import CLI, eh, kill_9_after, read_samples, run_cli, settled_counter, tempdir, write_jsonl


def toy_ll(text):
    """The toy model's log-likelihood of ``text`` scored as a continuation (its tokens: whitespace + word)."""
    return round(sum(-(1.0 + 0.1 * len(t)) for t in re.findall(r"\s*\S+|\s+", text)), 6)


ROWS = {
    "mmlu": [  # " A" .. " D" tie: the first wins (numpy's argmax)
        {"question": "2 + 2 = ?", "choices": ["4", "5", "6", "7"], "answer": 0, "subject": "elementary_mathematics"},
        {"question": "3 + 3 = ?", "choices": ["5", "7", "6", "9"], "answer": 2, "subject": "elementary_mathematics"},
    ],
    "arc": [
        {"id": "arc-1", "question": "What melts ice?", "choices": {"text": ["heat", "a very cold winter night"],
                                                                    "label": ["A", "B"]}, "answerKey": "A"},
        {"id": "arc-2", "question": "What is wet?", "choices": {"text": ["water", "dry desert sand dunes"],
                                                                 "label": ["1", "2"]}, "answerKey": "2"},
    ],
    "hellaswag": [
        {"ind": 7, "activity_label": "Baking", "ctx_a": "A man mixes flour.", "ctx_b": "he THEN",
         "endings": ["bakes [title] it", "walks to the shop and buys a whole new kitchen"], "label": "0"},
        {"ind": 8, "activity_label": "Running", "ctx_a": "A woman runs.", "ctx_b": "she",
         "endings": ["stops", "keeps running along the long river path"], "label": "1"},
    ],
    "winogrande": [
        {"qID": "w1", "sentence": "The cup fell off the table because _ was wobbly.", "option1": "it",
         "option2": "the cup that was on it", "answer": "1"},
        {"qID": "w2", "sentence": "Anna thanked Maria because _ helped.", "option1": "Maria", "option2": "she",
         "answer": "2"},  # (the toy model ignores the context: the two options tie, and the first wins)
    ],
    "piqa": [
        {"goal": "Open a jar", "sol1": "twist the lid", "sol2": "hit it with a hammer repeatedly", "label": 0},
        {"goal": "Dry hands", "sol1": "use a towel", "sol2": "use a very wet and cold towel", "label": 1},
    ],
    "boolq": [
        {"passage": "Paris is in France.", "question": "is paris in france", "label": 1},
        {"passage": "Ice is hot.", "question": "is ice hot", "answer": False},  # (" no" -1.3 beats " yes" -1.4)
    ],
}


def expected_acc(rows, layout):
    """acc per row id from the closed form: the choice with the highest log-likelihood (first of equals); a row
    with no id is named by its line."""
    out = {}
    for line, row in enumerate(rows, 1):
        doc = eh._choice_doc(row, "x", layout)
        if layout == "winogrande":  # the option fills the blank; the text after it is scored (the same for both)
            lls = [toy_ll(" " + doc["target"]) for _ in doc["choices"]]
        else:
            lls = [toy_ll(" " + c) for c in doc["choices"]]
        pred = max(range(len(lls)), key=lambda i: (lls[i], -i))
        out[str(doc["id"]) if doc["id"] not in (None, "") else str(line)] = 1.0 if pred == doc["gold"] else 0.0
    return out


PROBES = 3  # the pre-flight's completions requests: the echo, a token-id prompt, two prompts at once


def start_mock(test, **config):
    config.setdefault("model", "m")
    server = eh.MockServer(eh.MockConfig(**config)).start()
    test.addCleanup(server.close)
    return server


def run_choice(path, mock, out, *extra, timeout=120):
    return run_cli(["run", "--task", "choice", "--dataset", path, "--model", "m", "--base-url", mock.url, "--out",
                    out, "--no-progress"] + list(extra), timeout=timeout)


class TestLayouts(unittest.TestCase):
    def test_each_layout_is_announced_and_scores_as_the_closed_form_says(self):
        d = tempdir(self)
        mock = start_mock(self)
        for layout, rows in ROWS.items():
            path = write_jsonl(os.path.join(d, layout + ".jsonl"), rows)
            res = run_choice(path, mock, os.path.join(d, "run-" + layout), "--json")
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertIn("%s layout (2 rows)" % layout, res.stderr)
            records = read_samples(os.path.join(d, "run-" + layout))
            self.assertEqual(len(records), 2, layout)
            want = expected_acc(rows, layout)
            self.assertEqual(sorted(want.values()), [0.0, 1.0], layout)  # one row the toy model gets wrong
            self.assertEqual({r["id"]: r["score"] for r in records}, want, layout)
            self.assertEqual(json.loads(res.stdout)["score"]["mean"], 0.5, layout)

    def test_the_log_likelihoods_are_the_toy_models_sums_over_the_continuations(self):
        d = tempdir(self)
        path = write_jsonl(os.path.join(d, "piqa.jsonl"), ROWS["piqa"])
        out = os.path.join(d, "run")
        self.assertEqual(run_choice(path, start_mock(self), out).returncode, 0)
        rec = {r["id"]: r for r in read_samples(out)}["1"]
        self.assertEqual(rec["ll"], [toy_ll(" twist the lid"), toy_ll(" hit it with a hammer repeatedly")])
        self.assertEqual(rec["ll"], [-4.4, -9.2])  # 1.6 + 1.4 + 1.4; 1.4 + 1.3 + 1.5 + 1.2 + 1.7 + 2.1
        self.assertEqual(rec["tokens"], [3, 6])
        self.assertEqual((rec["pred"], rec["gold"], rec["score"]), (0, 0, 1.0))
        self.assertIn("Question: Open a jar\nAnswer:", rec["question"])

    def test_hellaswag_text_is_cleaned_as_lm_eval_does(self):
        doc = eh._choice_doc(ROWS["hellaswag"][0], "x", "hellaswag")
        self.assertEqual(doc["text"], "Baking: A man mixes flour. He then")  # capitalize() lowers the rest
        self.assertEqual(doc["choices"][0], "bakes. it")
        self.assertEqual(eh._hellaswag_clean(" a [header] b  c "), "a b c")

    def test_a_row_in_another_layout_or_with_a_bad_field_is_one_line_naming_the_line(self):
        d = tempdir(self)
        path = write_jsonl(os.path.join(d, "mixed.jsonl"), ROWS["piqa"] + [ROWS["boolq"][0]])
        res = run_choice(path, start_mock(self), os.path.join(d, "run"))
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("mixed.jsonl:3: a boolq row in a piqa file", res.stderr)
        bad = write_jsonl(os.path.join(d, "bad.jsonl"), [dict(ROWS["piqa"][0], label=5)])
        res = run_choice(bad, start_mock(self), os.path.join(d, "run2"))
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("bad.jsonl:1: field 'label' must be a choice's index 0..1, got 5", res.stderr)
        self.assertFalse(os.path.exists(os.path.join(d, "run")))


class TestMetrics(unittest.TestCase):
    def test_acc_norm_divides_by_the_choices_characters_without_the_delimiter(self):
        """A: 'abcdefghij' (1 token, 10 chars), B: 'abcdefghi jklmnopqrs' (2 tokens, 20 chars). By their own
        lengths B wins (-4.1/20 > -2.1/10); counting the leading space A would (-2.1/11 > -4.1/21); unnormalised
        A wins (-2.1 > -4.1). So with gold B: acc 0, acc_norm 1."""
        d = tempdir(self)
        row = {"id": "n1", "question": "Pick", "choices": {"text": ["abcdefghij", "abcdefghi jklmnopqrs"],
                                                          "label": ["A", "B"]}, "answerKey": "B"}
        path = write_jsonl(os.path.join(d, "arc.jsonl"), [row])
        out = os.path.join(d, "run")
        res = run_choice(path, start_mock(self), out, "--json")
        self.assertEqual(res.returncode, 0, res.stderr)
        rec = read_samples(out)[0]
        self.assertEqual(rec["ll"], [-2.1, -4.1])
        self.assertEqual((rec["pred"], rec["pred_norm"], rec["score"], rec["acc_norm"]), (0, 1, 0.0, 1.0))
        summary = json.loads(res.stdout)
        self.assertEqual((summary["choice"]["acc"]["mean"], summary["choice"]["acc_norm"]["mean"]), (0.0, 1.0))

    def test_the_whitespace_at_the_end_of_the_context_moves_to_the_continuation(self):
        """'Answer: ' + 'Paris' is scored as 'Answer:' + ' Paris' (one token, -1.6), in both token modes; kept on
        the context, the space would be a token of its own and the continuation 'Paris' (-1.5) or nothing."""
        for tokenizer in (True, False):
            mock = start_mock(self, tokenizer=tokenizer)
            client = eh.ModelClient(eh.ClientConfig(base_url=mock.url, model="m"))
            found = eh.probe_loglik(client, {})
            self.assertEqual((found.tokenizer is not None, found.ids, found.batch), (tokenizer, tokenizer, True))
            values, _ = eh._LoglikScorer(client, found).score([("Answer: ", "Paris"), ("Answer:", " Paris")])
            self.assertEqual([(v["ll"], v["tokens"]) for v in values], [(-1.6, 1), (-1.6, 1)], tokenizer)

    def test_without_a_tokenizer_endpoint_the_offsets_give_the_same_values_and_run_json_says_which(self):
        d = tempdir(self)
        path = write_jsonl(os.path.join(d, "arc.jsonl"), ROWS["arc"])
        lls = {}
        for tokenizer in (True, False):
            out = os.path.join(d, "run-%s" % tokenizer)
            self.assertEqual(run_choice(path, start_mock(self, tokenizer=tokenizer), out).returncode, 0)
            lls[tokenizer] = {r["id"]: r["ll"] for r in read_samples(out)}
            with open(os.path.join(out, "run.json"), encoding="utf-8") as fh:
                self.assertEqual(json.load(fh)["tokenization"], "vLLM/SGLang /tokenize" if tokenizer else "offsets")
        self.assertEqual(lls[True], lls[False])
        self.assertEqual(lls[True]["arc-1"], [toy_ll(" heat"), toy_ll(" a very cold winter night")])

    def test_a_server_that_takes_one_text_prompt_and_adds_a_space_and_a_token_scores_the_same(self):
        """As llama-cpp-python's server answers (found so by bench/loglik_parity.py): token-id prompts and lists of
        prompts are HTTP 500, its tokenizer adds a start token and a space before the text, the echo drops the
        start token, and an empty byte token is generated before the asked one. The values must be the same as a
        plain server's: one request a choice, as text, the continuation the last N echoed prompt tokens."""
        d = tempdir(self)
        path = write_jsonl(os.path.join(d, "arc.jsonl"), ROWS["arc"])
        lls = {}
        for quirks in (False, True):
            for tokenizer in (True, False):
                mock = start_mock(self, llama_cpp_python=quirks, tokenizer=tokenizer)
                out = os.path.join(d, "run-%s-%s" % (quirks, tokenizer))
                res = run_choice(path, mock, out)
                self.assertEqual(res.returncode, 0, res.stderr)
                lls[quirks, tokenizer] = {r["id"]: (r["ll"], r["tokens"]) for r in read_samples(out)}
                with open(os.path.join(out, "run.json"), encoding="utf-8") as fh:
                    requests = json.load(fh)["requests"]
                self.assertIn("prompts as text, one a request" if quirks else
                              "prompts as %s, several a request" % ("token ids" if tokenizer else "text"), requests)
                if quirks:  # one request a choice, after the probes: 2 choices a row
                    self.assertGreaterEqual(mock.stats()["counters"]["completions"], 4)
        want = {"arc-1": ([toy_ll(" heat"), toy_ll(" a very cold winter night")], [1, 5]),
                "arc-2": ([toy_ll(" water"), toy_ll(" dry desert sand dunes")], [1, 4])}
        for key, got in lls.items():
            self.assertEqual({k: (list(v[0]), list(v[1])) for k, v in got.items()}, want, key)


class TestPreflight(unittest.TestCase):
    def test_a_server_with_generated_token_log_probabilities_only_is_refused_before_anything_is_written(self):
        d = tempdir(self)
        path = write_jsonl(os.path.join(d, "piqa.jsonl"), ROWS["piqa"])
        mock = start_mock(self, server_kind="llama.cpp")
        out = os.path.join(d, "run")
        res = run_choice(path, mock, out)
        self.assertEqual(res.returncode, 2, res.stderr)
        lines = [ln for ln in res.stderr.splitlines() if "pre-flight" in ln]
        self.assertEqual(len(lines), 1, res.stderr)
        self.assertIn("llama.cpp's llama-server returns log-probabilities for generated tokens only", lines[0])
        self.assertIn("serve the checkpoint with vLLM or SGLang", lines[0])
        self.assertFalse(os.path.exists(out))
        self.assertEqual(mock.stats()["counters"]["completions"], 1)  # the probe, nothing else


class TestFewShot(unittest.TestCase):
    def test_examples_are_the_same_on_two_runs_and_never_the_row_itself(self):
        d = tempdir(self)
        rows = [{"id": "r%d" % i, "question": "Question number %d?" % i,
                 "choices": {"text": ["yes %d" % i, "no"], "label": ["A", "B"]}, "answerKey": "A"} for i in range(8)]
        path = write_jsonl(os.path.join(d, "arc.jsonl"), rows)
        mock = start_mock(self)
        contexts = []
        for n in (1, 2):
            out = os.path.join(d, "run%d" % n)
            self.assertEqual(run_choice(path, mock, out, "--num-fewshot", "3").returncode, 0)
            contexts.append({r["id"]: r["question"] for r in read_samples(out)})
        self.assertEqual(contexts[0], contexts[1])
        for rid, text in contexts[0].items():
            i = int(rid[1:])
            blocks = text.split("\n\n")
            self.assertEqual(len(blocks), 4, text)  # three solved examples, then the row
            self.assertEqual(blocks[-1], "Question: Question number %d?\nAnswer:" % i)
            for ex in blocks[:3]:
                self.assertRegex(ex, r"^Question: Question number (\d)\?\nAnswer: yes \1$")
                self.assertNotIn("number %d?" % i, ex)
        self.assertGreater(len(set(contexts[0].values())), 1)

    def test_mmlu_takes_the_first_examples_of_the_rows_subject(self):
        d = tempdir(self)
        rows = [{"question": "Q%d" % i, "choices": ["a", "b", "c", "d"], "answer": i % 4,
                 "subject": "history" if i % 2 else "high_school_physics"} for i in range(6)]
        dev = write_jsonl(os.path.join(d, "dev.jsonl"), rows)
        test = write_jsonl(os.path.join(d, "test.jsonl"), [dict(rows[0], question="Target")])
        out = os.path.join(d, "run")
        self.assertEqual(run_choice(test, start_mock(self), out, "--num-fewshot", "2", "--fewshot-file",
                                    dev).returncode, 0)
        self.assertEqual(read_samples(out)[0]["question"],
                         "The following are multiple choice questions (with answers) about high school physics.\n\n"
                         "Q0\nA. a\nB. b\nC. c\nD. d\nAnswer: A\n\nQ2\nA. a\nB. b\nC. c\nD. d\nAnswer: C\n\n"
                         "Target\nA. a\nB. b\nC. c\nD. d\nAnswer:")


class TestResume(unittest.TestCase):
    def test_kill_9_mid_run_then_the_same_command_asks_only_for_the_missing_rows(self):
        d = tempdir(self)
        rows = [{"goal": "goal %d" % i, "sol1": "one", "sol2": "two words", "label": i % 2} for i in range(30)]
        path = write_jsonl(os.path.join(d, "piqa.jsonl"), rows)
        mock = start_mock(self, ttft_s=0.15)
        out = os.path.join(d, "run")
        args = [sys.executable, CLI, "run", "--task", "choice", "--dataset", path, "--model", "m", "--base-url",
                mock.url, "--out", out, "--no-progress", "--fixed-concurrency", "2"]
        kill_9_after(self, args, out, 4, 120)
        kept = {r["id"] for r in read_samples(out)}
        self.assertLess(len(kept), 30)
        asked = settled_counter(mock, "completions")  # (with the requests in flight at the kill)
        res = run_choice(path, mock, out)
        self.assertEqual(res.returncode, 0, res.stderr)
        records = read_samples(out)
        self.assertEqual(sorted(r["id"] for r in records), sorted(str(i + 1) for i in range(30)))
        self.assertEqual(mock.stats()["counters"]["completions"] - asked, PROBES + 30 - len(kept))

    def test_a_changed_right_answer_is_scored_again_from_the_stored_values_without_requests(self):
        d = tempdir(self)
        path = write_jsonl(os.path.join(d, "arc.jsonl"), ROWS["arc"])
        mock = start_mock(self)
        out = os.path.join(d, "run")
        self.assertEqual(run_choice(path, mock, out).returncode, 0)
        self.assertEqual({r["id"]: r["score"] for r in read_samples(out)}, {"arc-1": 1.0, "arc-2": 0.0})
        asked = mock.stats()["counters"]["completions"]
        write_jsonl(path, [ROWS["arc"][0], dict(ROWS["arc"][1], answerKey="1")])
        res = run_choice(path, mock, out)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("1 stored answer(s) re-scored", res.stderr)
        self.assertEqual(mock.stats()["counters"]["completions"] - asked, PROBES)  # the pre-flight's only
        self.assertEqual({r["id"]: r["score"] for r in read_samples(out)}, {"arc-1": 1.0, "arc-2": 1.0})


class TestReport(unittest.TestCase):
    def test_the_report_gives_acc_norm_and_a_wrong_rows_context_with_each_choices_log_likelihood(self):
        d = tempdir(self)
        path = write_jsonl(os.path.join(d, "arc.jsonl"), ROWS["arc"])
        out = os.path.join(d, "run")
        self.assertEqual(run_choice(path, start_mock(self), out).returncode, 0)
        text = run_cli(["report", out])
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn("acc_norm 0.500 [", text.stdout)
        self.assertIn("arc layout, 0-shot, token boundaries: vLLM/SGLang /tokenize", text.stdout)
        self.assertEqual(run_cli(["report", out, "--html"]).returncode, 0)
        with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
            page = fh.read()
        self.assertIn("Question: What is wet?\nAnswer:", page)  # arc-2, the wrong row: its context
        self.assertIn("0. &#x27; water&#x27;: log-likelihood %.4f over 1 token(s)" % toy_ll(" water"), page)
        self.assertIn("* 1. &#x27; dry desert sand dunes&#x27;: log-likelihood %.4f over 4 token(s)"
                      % toy_ll(" dry desert sand dunes"), page)


class TestShards(unittest.TestCase):
    def test_two_shards_merged_equal_one_run_row_for_row_with_acc_norm(self):
        d = tempdir(self)
        rows = [{"id": "s%d" % i, "question": "Question %d" % i, "choices": {
            "text": ["abcdefghij", "abcdefghi jklmnopqrs", "x" * (i + 1)], "label": ["A", "B", "C"]},
            "answerKey": "ABC"[i % 3]} for i in range(12)]
        path = write_jsonl(os.path.join(d, "arc.jsonl"), rows)
        mock = start_mock(self)
        single, sharded = os.path.join(d, "single"), os.path.join(d, "sharded")
        one = run_choice(path, mock, single, "--json")
        self.assertEqual(one.returncode, 0, one.stderr)
        for i in range(2):
            res = run_choice(path, mock, sharded, "--shard", "%d/2" % i)
            self.assertEqual(res.returncode, 0, res.stderr)
        res = run_cli(["merge", sharded])
        self.assertEqual(res.returncode, 0, res.stderr)
        strip = ("started_at", "finished_at", "latency_s", "fp", "attempts")

        def rows_of(out):
            return {r["id"]: {k: v for k, v in r.items() if k not in strip} for r in read_samples(out)}
        self.assertEqual(rows_of(sharded), rows_of(single))
        self.assertEqual(len(rows_of(sharded)), 12)
        with open(os.path.join(sharded, "summary.json"), encoding="utf-8") as fh:
            merged = json.load(fh)
        whole = json.loads(one.stdout)
        self.assertEqual(merged["choice"]["acc_norm"], whole["choice"]["acc_norm"])
        self.assertEqual(merged["score"], whole["score"])
        self.assertEqual(merged["choice"]["tokenization"], "vLLM/SGLang /tokenize")


class TestPerplexity(unittest.TestCase):
    DOCS = [{"id": "d1", "text": "The cat sat on the mat and the dog ran far away"}, {"id": "d2", "text": "Hello world"}]

    def test_every_token_is_scored_once_whatever_the_window_and_the_figures_are_lm_evals(self):
        """d1: 12 tokens, -(1.3 + 1.4 + 1.4 + 1.3 + 7 x 1.4 + 1.5) = -16.7; d2: -(1.5 + 1.6) = -3.1 (each first token
        after the start token). Over 14 words and 58 bytes: word perplexity exp(19.8 / 14), byte perplexity
        exp(19.8 / 58), bits per byte 19.8 / 58 / ln 2."""
        d = tempdir(self)
        path = write_jsonl(os.path.join(d, "docs.jsonl"), self.DOCS)
        mock = start_mock(self)
        for max_length, windows in (("2", {"d1": 6, "d2": 1}), ("5", {"d1": 3, "d2": 1}), ("100", {"d1": 1, "d2": 1})):
            out = os.path.join(d, "run" + max_length)
            res = run_cli(["run", "--task", "perplexity", "--dataset", path, "--model", "m", "--base-url", mock.url,
                           "--out", out, "--no-progress", "--json", "--max-length", max_length])
            self.assertEqual(res.returncode, 0, res.stderr)
            recs = {r["id"]: r for r in read_samples(out)}
            self.assertEqual({k: (r["ll"], r["tokens"], r["scored_tokens"]) for k, r in recs.items()},
                             {"d1": (toy_ll(self.DOCS[0]["text"]), 12, 12), "d2": (-3.1, 2, 2)}, max_length)
            self.assertEqual(recs["d1"]["ll"], -16.7)
            self.assertEqual({k: r["windows"] for k, r in recs.items()}, windows)
            p = json.loads(res.stdout)["perplexity"]
            self.assertEqual((p["words"], p["bytes"], p["loglikelihood"]), (14, 58, -19.8))
            self.assertAlmostEqual(p["word_perplexity"], math.exp(19.8 / 14), places=5)
            self.assertAlmostEqual(p["byte_perplexity"], math.exp(19.8 / 58), places=5)
            self.assertAlmostEqual(p["bits_per_byte"], 19.8 / 58 / math.log(2), places=5)
            # each document's own figures: d1 16.7 over 12 words and 47 bytes; d2 3.1 over 2 words and 11 bytes
            self.assertAlmostEqual(recs["d1"]["word_perplexity"], math.exp(16.7 / 12), places=5)
            self.assertAlmostEqual(recs["d1"]["byte_perplexity"], math.exp(16.7 / 47), places=5)
            self.assertAlmostEqual(recs["d2"]["score"], 3.1 / 11 / math.log(2), places=5)
            self.assertAlmostEqual(recs["d2"]["word_perplexity"], math.exp(3.1 / 2), places=5)

    def test_the_report_gives_each_documents_figures_and_the_whole_corpus(self):
        d = tempdir(self)
        path = write_jsonl(os.path.join(d, "docs.jsonl"), self.DOCS)
        out = os.path.join(d, "run")
        res = run_cli(["run", "--task", "perplexity", "--dataset", path, "--model", "m", "--base-url",
                       start_mock(self).url, "--out", out, "--no-progress"])
        self.assertEqual(res.returncode, 0, res.stderr)
        text = run_cli(["report", out])
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn("word perplexity %.4f" % math.exp(19.8 / 14), text.stdout)
        rows = [line.split() for line in text.stdout.splitlines() if line.startswith("  d")]
        # d1 first: 16.7 / 47 bytes is more bits per byte than d2's 3.1 / 11
        self.assertEqual([r[0] for r in rows], ["d1", "d2"])
        self.assertEqual(rows[0][1:], ["12", "12", "47", "%.4f" % math.exp(16.7 / 12), "%.4f" % math.exp(16.7 / 47),
                                       "%.4f" % (16.7 / 47 / math.log(2))])
        js = json.loads(run_cli(["report", out, "--json"]).stdout)["report"]["documents"]
        self.assertEqual(js["total"], 2)
        self.assertAlmostEqual(js["documents"][1]["word_perplexity"], math.exp(3.1 / 2), places=5)
        self.assertEqual(run_cli(["report", out, "--html"]).returncode, 0)
        with open(os.path.join(out, "report.html"), encoding="utf-8") as fh:
            page = fh.read()
        self.assertIn("<h2>Documents</h2>", page)
        self.assertIn("<td class=n>%.4f</td>" % math.exp(16.7 / 12), page)

    def test_windows_are_lm_evals_rolling_ones(self):
        self.assertEqual(eh.rolling_windows([1, 2, 3, 4, 5], 0, 2), [([0], [1, 2]), ([2], [3, 4]), ([4], [5])])
        self.assertEqual(eh.rolling_windows([1, 2], 0, 5), [([0], [1, 2])])
        self.assertEqual(eh.rolling_windows([], 0, 5), [])

    def test_a_server_without_a_tokenizer_endpoint_is_refused_before_anything_is_written(self):
        d = tempdir(self)
        path = write_jsonl(os.path.join(d, "docs.jsonl"), self.DOCS)
        out = os.path.join(d, "run")
        res = run_cli(["run", "--task", "perplexity", "--dataset", path, "--model", "m", "--base-url",
                       start_mock(self, tokenizer=False).url, "--out", out])
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("--task perplexity needs the server's tokenizer endpoint", res.stderr)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
