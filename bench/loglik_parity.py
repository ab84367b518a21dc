#!/usr/bin/env python3
"""evalharness --task choice against llama-cpp-python's server (issue 35; run by hand, never by CI).

Builds a throwaway virtualenv (`--venv-dir DIR` keeps it and reuses it): gguf 0.19.0 + numpy, and llama-cpp-python
0.3.36 with `[server]` built from its PyPI source package (llama.cpp compiled: 15-40 minutes on 2 shared cores; the
built wheel stays in DIR/wheels, so a rerun installs in seconds). Writes bench/real_server.py's tiny random-weight
LLaMA GGUF (SPM tokenizer, 150 whole words) and rows of five layouts (arc, piqa, hellaswag, boolq, winogrande) from
its words, starts `python -m llama_cpp.server` (logits_all is on by default there), then:

  1. the server's own answers to what evalharness sends (raw requests, status and body kept): /extras/tokenize
     (BOS? leading space?), /v1/completions with a text prompt, a list of text prompts, token ids, lists of ids;
  2. `evalharness.py run --task choice` on each file straight against the server: exit code, tokenization in
     run.json, rows ok / failed and the first error;
  3. when rows failed in 2: the same runs through a pass-through proxy that only splits a request of several
     prompts into one request per prompt (the server takes one), as the nearest thing the server answers: "text"
     hides the tokenizer endpoint (evalharness sends text and takes the echoed tokens' offsets); "ids" passes it
     and sends each token-id prompt as its text, checked to tokenize back to the same ids (what the server's
     Llama.create_completion does with a list of ids, had the request type let them through);
  4. the reference, in-process, by the same library from the same file (`llama_cpp.Llama(logits_all=True)`): each
     prompt evaluated, log-softmax at each position (float64), the continuation's tokens summed — under both
     boundary rules: "tokenizer" (lm-eval's whole-minus-context over the server's /extras/tokenize, what evalharness
     does when it finds that endpoint) and "offsets" (the tokens of the text prompt, BOS first as the server adds
     it, whose true end in the text, from the GGUF's own pieces, is past the context);
  5. per choice |Δll| (max, count over 1e-3) and per row acc / acc_norm predictions (lm-eval's: argmax of ll, and of
     ll / len(choice) in characters) for every run that gave log-likelihoods;
  6. lm-eval 0.4.13 `local-completions` (pip-installed into the same venv) on the arc rows via a custom task yaml,
     with each tokenizer backend it offers that could apply; what it did, or exactly why it could not.

Usage: python3 bench/loglik_parity.py [--venv-dir DIR] [--rows 42] [--keep DIR] [--direct all|first|none] [--no-lm-eval]
"""
import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROGRAM = os.path.join(ROOT, "evalharness.py")
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
import evalharness as eh  # noqa: E402
import real_server  # noqa: E402  (its TINY_MODEL: the GGUF writer and its word list)

SDIST = "llama-cpp-python==0.3.36"
LM_EVAL = ["lm-eval[api]==0.4.13", "transformers"]   # transformers: an HF tokenizer converted from the GGUF
MODEL_SHAPE = (128, 2, 4, 256, 2048)   # embedding, layers, heads, feed-forward, context
ALIAS = "tiny"                         # the name the server lists (--model_alias) and evalharness asks for
TOL = 1e-3
LAYOUTS = ("arc", "piqa", "hellaswag", "boolq", "winogrande")
WORDS = list(dict.fromkeys(re.search(r'words = """(.*?)"""', real_server.TINY_MODEL, re.S).group(1).split()))[:150]
STRANGERS = ("zebra", "quux", "Kyoto", "x-ray", "42", "naïve")   # not in the vocabulary: pieces and byte fallback

REFERENCE = r'''
# In-process reference: llama_cpp.Llama (logits_all) on the same file; reads items, writes log-likelihoods.
import json, sys
import numpy as np
import llama_cpp, gguf
model, items_path, out_path = sys.argv[1:4]
llm = llama_cpp.Llama(model_path=model, logits_all=True, n_ctx=2048, n_batch=512, verbose=False)
bos = llm.token_bos()
# the GGUF's own pieces (not llama.cpp's detokenizer): the true text each token covers
r = gguf.GGUFReader(model)
f = r.fields["tokenizer.ggml.tokens"]
pieces = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
def piece_bytes(t):
    p = pieces[t]
    if len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
        return bytes([int(p[3:5], 16)])
    return p.replace("\u2581", " ").encode("utf-8")

def tok_endpoint(text):   # what the server's /extras/tokenize does: add_bos default True, special=True
    return llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)

def tok_prompt(text):     # what create_completion does with a text prompt: BOS + tokenize(add_bos=False, special=True)
    return [bos] + llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

cache, last = {}, []
def evaluate(tokens):
    """llm.scores[:len(tokens)] for TOKENS; the prefix shared with the last prompt is kept (as the server's
    generate does: its KV cache and logits rows stay), the rest evaluated."""
    global last
    k = 0
    while k < min(len(last), len(tokens)) and last[k] == tokens[k]:
        k += 1
    if k == 0 or not llm._ctx.kv_cache_seq_rm(-1, k, -1):
        llm.reset()
        k = 0
    llm.n_tokens = k
    if k < len(tokens):
        llm.eval(tokens[k:])
    last = list(tokens)
    return llm.scores[:len(tokens)]

def logprobs(tokens):
    key = tuple(tokens)
    if key not in cache:
        s = np.array(evaluate(tokens), dtype=np.float64)
        m = s.max(axis=1, keepdims=True)
        lp = s - m - np.log(np.exp(s - m).sum(axis=1, keepdims=True))
        # lp[j] predicts token j+1; value of token j is lp[j-1][tokens[j]]
        vals = [None] + [float(lp[j - 1][tokens[j]]) for j in range(1, len(tokens))]
        greedy = [None] + [int(np.argmax(lp[j - 1])) == tokens[j] for j in range(1, len(tokens))]
        if len(cache) > 4000:
            cache.clear()
        cache[key] = (vals, greedy)
    return cache[key]

def split(c, x):
    n = len(c) - len(c.rstrip())
    return (c[:-n], c[-n:] + x) if n else (c, x)

out = {"bos": bos, "endpoint_adds_bos": tok_endpoint("Hello")[:1] == [bos], "rows": {}}
items = json.load(open(items_path))
for it in items:
    row = {}
    for rule in ("tokenizer", "offsets"):
        lls, ns, greedy = [], [], []
        for c, x in zip(it["contexts"], it["continuations"]):
            c, x = split(c, x)
            if rule == "tokenizer":
                whole, ctx = tok_endpoint(c + x), tok_endpoint(c)
                prompt, first = whole, len(ctx)
            else:
                prompt = tok_prompt(c + x)
                text = b"".join(piece_bytes(t) for t in prompt[1:]).decode("utf-8", "replace")
                lead = 1 if text.startswith(" ") and not (c + x).startswith(" ") else 0   # SPM's space prefix
                done, first = b"", len(prompt)
                for j in range(1, len(prompt)):   # a token's end: the characters complete after it
                    done += piece_bytes(prompt[j])
                    if len(done.decode("utf-8", "ignore")) - lead > len(c):
                        first = j
                        break
            vals, gr = logprobs(prompt)
            lls.append(sum(vals[first:]))
            ns.append(len(prompt) - first)
            greedy.append(all(gr[first:]))
        row[rule] = {"ll": lls, "tokens": ns, "greedy": greedy}
    out["rows"][it["key"]] = row
json.dump(out, open(out_path, "w"))
print("reference: %d rows" % len(items))
'''


def log(msg):
    print("loglik_parity: %s" % msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, check=True, **kw)


# ----------------------------------------------------------------------------- the virtualenv
def venv(env_dir, want_lm_eval):
    """The venv's python: gguf + numpy + llama-cpp-python[server] (built once from the source package; the wheel
    is kept in env_dir/wheels) and, when asked, lm-eval."""
    py = os.path.join(env_dir, "venv", "bin", "python")
    if not os.path.exists(py):
        run([sys.executable, "-m", "venv", os.path.join(env_dir, "venv")])
    pip = [py, "-m", "pip", "install", "-q"]
    if subprocess.run([py, "-c", "import gguf, numpy"], capture_output=True).returncode:
        run(pip + ["gguf==0.19.0", "numpy"])
    if subprocess.run([py, "-c", "import llama_cpp.server.app"], capture_output=True).returncode:
        wheels = os.path.join(env_dir, "wheels")
        os.makedirs(wheels, exist_ok=True)
        built = [f for f in os.listdir(wheels) if f.startswith("llama_cpp_python-0.3.36")]
        if not built:
            dl = os.path.join(env_dir, "dl")
            os.makedirs(dl, exist_ok=True)
            # --no-binary for this package only: ':all:' would build its build tools (cmake, ninja) from source too
            run([py, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", "llama-cpp-python", SDIST, "-d", dl])
            sdist = os.path.join(dl, [f for f in os.listdir(dl) if f.endswith(".tar.gz")][0])
            log("building llama-cpp-python from %s (llama.cpp compiled: 15-40 minutes on 2 shared cores)" % sdist)
            t0 = time.time()
            # the multimodal library (mtmd) is imported only by the vision chat handlers: not built; -O0 compiles
            # in about a third of -O3's time, and the tiny model needs no speed (server and reference share the build)
            env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL="2", CMAKE_ARGS="-DLLAVA_BUILD=OFF "
                       "-DCMAKE_C_FLAGS_RELEASE='-O0 -DNDEBUG' -DCMAKE_CXX_FLAGS_RELEASE='-O0 -DNDEBUG'")
            run([py, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, sdist], env=env)
            log("built in %.0f s" % (time.time() - t0))
            built = [f for f in os.listdir(wheels) if f.startswith("llama_cpp_python-0.3.36")]
        run(pip + [os.path.join(wheels, built[0]) + "[server]"])
    if want_lm_eval and subprocess.run([py, "-c", "import lm_eval, transformers"], capture_output=True).returncode:
        run(pip + LM_EVAL)
    return py


def write_model(py, path):
    if not os.path.exists(path):
        script = path + ".py"
        with open(script, "w") as fh:
            fh.write(real_server.TINY_MODEL)
        run([py, script, path] + [str(x) for x in MODEL_SHAPE], stdout=subprocess.DEVNULL)
    return path


# ----------------------------------------------------------------------------- rows
def _words(rng, lo, hi, stranger=0.08):
    out = []
    for _ in range(rng.randint(lo, hi)):
        out.append(rng.choice(STRANGERS) if rng.random() < stranger else rng.choice(WORDS))
    return " ".join(out)


def make_rows(layout, n, seed=35):
    rng = random.Random("%s-%d" % (layout, seed))
    rows = []
    for i in range(n):
        rid = "%s-%03d" % (layout, i)
        if layout == "arc":
            labels = ["A", "B", "C", "D"] if i % 5 else ["1", "2", "3", "4"]
            rows.append({"id": rid, "question": _words(rng, 5, 14).capitalize() + "?",
                         "choices": {"text": [_words(rng, 1, 6) for _ in labels], "label": labels},
                         "answerKey": rng.choice(labels)})
        elif layout == "piqa":
            rows.append({"id": rid, "goal": _words(rng, 4, 12).capitalize(), "sol1": _words(rng, 3, 16),
                         "sol2": _words(rng, 3, 16), "label": rng.randint(0, 1)})
        elif layout == "hellaswag":
            rows.append({"ind": i, "activity_label": _words(rng, 1, 2, 0).title(),
                         "ctx_a": _words(rng, 6, 14).capitalize() + "." + (" [title] " + _words(rng, 2, 4)
                                                                           if i % 7 == 0 else ""),
                         "ctx_b": _words(rng, 2, 6), "endings": [_words(rng, 3, 12) + "." for _ in range(4)],
                         "label": rng.randint(0, 3)})
        elif layout == "boolq":
            rows.append({"id": rid, "passage": _words(rng, 15, 45).capitalize() + ".",
                         "question": _words(rng, 4, 9), "label": rng.random() < 0.5})
        else:
            o1, o2 = rng.choice(WORDS), rng.choice(WORDS)
            rows.append({"qID": rid, "sentence": "%s _ %s." % (_words(rng, 4, 12).capitalize(), _words(rng, 3, 9)),
                         "option1": o1, "option2": o2, "answer": rng.choice("12")})
    return rows


# ----------------------------------------------------------------------------- the server and raw probes
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=120):
    """(status, parsed JSON or text excerpt) of one POST."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw[:300].decode("utf-8", "replace")


class Server:
    def __init__(self, py, model, workdir):
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log_path = os.path.join(workdir, "server.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([py, "-m", "llama_cpp.server", "--model", model, "--model_alias", ALIAS,
                                      "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", "2048",
                                      "--interrupt_requests", "False"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit("llama_cpp.server exited %s (log %s)" % (self.proc.returncode, self.log_path))
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise SystemExit("llama_cpp.server did not answer /v1/models (log %s)" % self.log_path)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def probes(url):
    """The server's answers to the requests evalharness and lm-eval make (status, excerpt)."""
    out = {}
    st, body = post(url + "/extras/tokenize", {"input": "Hello world", "model": ALIAS})
    out["extras/tokenize 'Hello world'"] = (st, body)
    st, body = post(url + "/tokenize", {"prompt": "Hello world"})
    out["/tokenize"] = (st, str(body)[:120])
    ids = (out["extras/tokenize 'Hello world'"][1] or {}).get("tokens") or [1, 2]
    base = {"model": ALIAS, "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}
    for name, prompt in (("text", "Hello world"), ("[text]", ["Hello world"]), ("[text, text]",
                         ["Hello world", "Hello there"]), ("ids", ids), ("[ids]", [ids]), ("[ids, ids]", [ids, ids])):
        st, body = post(url + "/v1/completions", dict(base, prompt=prompt))
        if isinstance(body, dict) and body.get("choices"):
            lp = body["choices"][0].get("logprobs") or {}
            body = {"choices": len(body["choices"]), "tokens": lp.get("tokens"), "text_offset":
                    lp.get("text_offset"), "token_logprobs": [None if v is None else round(v, 4)
                                                             for v in lp.get("token_logprobs") or []]}
        out["completions prompt=%s" % name] = (st, body if isinstance(body, dict) else str(body)[:300])
    return out


# ----------------------------------------------------------------------------- the splitting proxy
def start_proxy(upstream, mode):
    """A pass-through that splits a /v1/completions request of several prompts into one request per prompt (the
    server takes one). Mode "text": tokenizer endpoints answer 404 (evalharness sends text and reads the offsets).
    Mode "ids": the tokenizer passes through and a token-id prompt goes as its text (the server's /extras/detokenize,
    less the SPM space prefix it keeps), checked to come back as the same tokens: what the server's
    Llama.create_completion would do with the ids themselves (a list prompt is used as given, its leading BOS
    dropped from the echo, as a text prompt's), had its request type let them through."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, status, data):
            raw = data if isinstance(data, bytes) else json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _forward(self, method, body=None):
            req = urllib.request.Request(upstream + self.path, data=body, method=method,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    return r.status, r.read()
            except urllib.error.HTTPError as e:
                return e.code, e.read()

        def do_GET(self):
            self._send(*self._forward("GET"))

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if "tokenize" in self.path and mode == "text":
                return self._send(404, {"detail": "Not Found (hidden by the bench's proxy)"})
            body = json.loads(raw or b"{}")
            prompt = body.get("prompt")
            if self.path.endswith("/completions") and isinstance(prompt, list) and prompt:
                if mode == "ids" and all(isinstance(t, int) for t in prompt):
                    prompt = [prompt]
                choices, usage = [], {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
                for i, p in enumerate(prompt):
                    if mode == "ids" and isinstance(p, list):
                        st, det = post(upstream + "/extras/detokenize", {"tokens": p})
                        text = det["text"][1:] if det["text"].startswith(" ") else det["text"]
                        st, back = post(upstream + "/extras/tokenize", {"input": text})
                        if back.get("tokens") != p:
                            return self._send(599, {"error": "proxy: ids %s... come back as %s..." % (
                                p[:8], back.get("tokens", [])[:8])})
                        p = text
                    status, one = self._forward("POST", json.dumps(dict(body, prompt=p)).encode())
                    if status != 200:
                        return self._send(status, one)
                    one = json.loads(one)
                    choices.append(dict(one["choices"][0], index=i))
                    for k in usage:
                        usage[k] += (one.get("usage") or {}).get(k) or 0
                return self._send(200, dict(one, choices=choices, usage=usage))
            self._send(*self._forward("POST", raw))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, name="loglik-parity-proxy", daemon=True).start()
    return server, "http://127.0.0.1:%d" % server.server_address[1]


# ----------------------------------------------------------------------------- evalharness runs
def evalharness_run(dataset, base_url, out):
    t0 = time.time()
    res = subprocess.run([sys.executable, PROGRAM, "run", "--task", "choice", "--dataset", dataset, "--model", ALIAS,
                          "--base-url", base_url + "/v1", "--out", out, "--no-progress", "--json"],
                         capture_output=True, text=True, timeout=7200)
    info = {"rc": res.returncode, "wall_s": round(time.time() - t0, 1), "stderr": res.stderr.strip().splitlines()[-6:],
            "records": {}}
    if os.path.exists(os.path.join(out, "run.json")):
        with open(os.path.join(out, "run.json")) as fh:
            run_json = json.load(fh)
        info["tokenization"] = run_json.get("tokenization", (run_json.get("extra") or {}).get("tokenization"))
    path = os.path.join(out, "samples.jsonl")
    if os.path.exists(path):
        with open(path) as fh:
            for line in fh:
                rec = json.loads(line)
                info["records"][rec["id"]] = rec
    return info


def preds(lls, choices):
    pred = max(range(len(lls)), key=lambda i: (lls[i], -i))
    norm = [ll / max(1, len(c)) for ll, c in zip(lls, choices)]
    return pred, max(range(len(norm)), key=lambda i: (norm[i], -i))


def compare(items, records, ref, rule):
    """Per choice |Δll| and per row predictions of evalharness's records against the reference under ``rule``."""
    diffs, over, token_mismatch, acc_diff, norm_diff, near_ties, ok, examples = [], 0, 0, 0, 0, 0, 0, []
    extra_generated = 0
    for it in items:
        rec = records.get(it["id"])
        if not rec or rec.get("status") != "ok":
            continue
        ok += 1
        r = ref["rows"][it["key"]][rule]
        for i, (a, b) in enumerate(zip(rec["ll"], r["ll"])):
            d = abs(a - b)
            diffs.append(d)
            if d > TOL:
                over += 1
                if len(examples) < 5:
                    examples.append("%s choice %d: evalharness %.6f over %d token(s), reference %.6f over %d" % (
                        it["id"], i, a, rec["tokens"][i], b, r["tokens"][i]))
            if rec["tokens"][i] != r["tokens"][i]:
                token_mismatch += 1
        # max_tokens 1, yet llama-cpp-python goes on while the text is an incomplete UTF-8 sequence (a byte token)
        extra_generated += (rec.get("completion_tokens") or 0) > len(it["choices"])
        p, pn = preds(r["ll"], it["choices"])
        acc_diff += p != rec["pred"]
        norm_diff += pn != rec["pred_norm"]
        top = sorted(r["ll"], reverse=True)
        near_ties += len(top) > 1 and top[0] - top[1] < TOL
    return {"rows_ok": ok, "choices": len(diffs), "max_abs_diff": max(diffs) if diffs else None, "over_tol": over,
            "token_count_mismatch": token_mismatch, "acc_pred_diff": acc_diff, "acc_norm_pred_diff": norm_diff,
            "ref_near_ties": near_ties, "extra_generated": extra_generated, "examples": examples}


# ----------------------------------------------------------------------------- lm-eval
LM_TASK = """task: parity_arc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices.label.index(answerKey)}}}}"
doc_to_choice: "{{{{choices.text}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def lm_eval_runs(py, url, arc_path, work):
    """lm-eval's local-completions on the arc rows with each tokenizer backend that could apply."""
    tasks = os.path.join(work, "lm_tasks")
    os.makedirs(tasks, exist_ok=True)
    with open(os.path.join(tasks, "parity_arc.yaml"), "w") as fh:
        fh.write(LM_TASK.format(path=arc_path))
    lm_eval = os.path.join(os.path.dirname(py), "lm_eval")
    results = {}
    hf = ",tokenizer=%s" % os.path.join(work, "hf_tokenizer")
    for name, backend, extra in (("remote", "remote", ""), ("huggingface, token ids", "huggingface", hf),
                                 ("huggingface, text", "huggingface", hf + ",tokenized_requests=False"),
                                 ("none", "none", "")):
        if backend == "huggingface" and not os.path.isdir(os.path.join(work, "hf_tokenizer")):
            results[name] = {"rc": None, "why": "no HF tokenizer of the GGUF (transformers could not convert it)"}
            continue
        out = os.path.join(work, "lm_out_" + re.sub(r"\W+", "_", name))
        cmd = [lm_eval, "--model", "local-completions", "--model_args",
               "base_url=%s/v1/completions,model=%s,tokenizer_backend=%s,max_retries=1,num_concurrent=1%s" % (
                   url, ALIAS, backend, extra), "--tasks", "parity_arc", "--include_path", tasks,
               "--output_path", out, "--log_samples", "--batch_size", "1"]
        t0 = time.time()
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=dict(os.environ,
                             HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false"))
        lines = [ln for ln in (res.stderr + res.stdout).splitlines() if ln.strip()]
        errs = [ln for ln in lines if re.search(r"Error|error|assert|Exception|refused|422|500", ln)]
        info = {"rc": res.returncode, "wall_s": round(time.time() - t0, 1), "cmd": " ".join(cmd),
                "error_lines": errs[-4:], "tail": lines[-3:]}
        info["samples"] = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs if f.startswith("samples_")]
        results[name] = info
    return results


def lm_eval_compare(results, items, ref):
    """Each lm-eval run's per-choice log-likelihoods and per-row predictions against the reference (tokenizer rule:
    lm-eval's own whole-minus-context)."""
    by_q = {it["question"]: it for it in items}
    for info in results.values():
        if info.get("rc") != 0 or not info.get("samples"):
            continue
        ll_diff, acc_diff, norm_diff, n = [], 0, 0, 0
        with open(info["samples"][0]) as fh:
            for line in fh:
                s = json.loads(line)
                it = by_q.get(s["doc"]["question"])
                if it is None:
                    continue
                n += 1
                lls = [float(r[0][0]) for r in s["resps"]]
                r = ref["rows"][it["key"]]["tokenizer"]
                ll_diff += [abs(a - b) for a, b in zip(lls, r["ll"])]
                p, pn = preds(r["ll"], it["choices"])
                lp, lpn = preds(lls, it["choices"])
                acc_diff += p != lp
                norm_diff += pn != lpn
        info.update(rows=n, max_abs_diff=max(ll_diff) if ll_diff else None,
                    over_tol=sum(d > TOL for d in ll_diff), acc_pred_diff=acc_diff, acc_norm_pred_diff=norm_diff)


HF_CONVERT = r'''
import sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1], gguf_file=sys.argv[2])
tok.save_pretrained(sys.argv[3])
print(tok("Question: the water")["input_ids"])
'''


# ----------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv-dir", default=None, help="keep the virtualenv (and the built wheel) here and reuse it")
    ap.add_argument("--rows", type=int, default=42, help="rows per layout (5 layouts: 210 rows)")
    ap.add_argument("--keep", default=None, help="keep the model, rows, runs and logs here")
    ap.add_argument("--direct", choices=("all", "first", "none"), default="all",
                    help="layouts run straight against the server: all, the first only (every layout sends the same "
                         "request shape; a refused run takes its outage budget, 2-6 minutes), none")
    ap.add_argument("--no-lm-eval", action="store_true")
    args = ap.parse_args()
    t_start = time.time()
    tmp = tempfile.mkdtemp(prefix="loglik-parity-")
    work = args.keep or tmp
    os.makedirs(work, exist_ok=True)
    server = proxy = None
    try:
        py = venv(args.venv_dir or os.path.join(tmp, "env"), not args.no_lm_eval)
        model = write_model(py, os.path.join(work, "tiny-%s.gguf" % "-".join(map(str, MODEL_SHAPE))))
        files, items = {}, []
        for layout in LAYOUTS:
            path = os.path.join(work, layout + ".jsonl")
            with open(path, "w") as fh:
                for row in make_rows(layout, args.rows):
                    fh.write(json.dumps(row) + "\n")
            files[layout] = path
            for it in eh.ChoiceDataset(path).items:
                items.append({"key": "%s/%s" % (layout, it.id), "layout": layout, "id": it.id,
                              "contexts": list(it.contexts), "continuations": list(it.continuations),
                              "choices": list(it.choices), "gold": it.gold})
        for it, row in zip([i for i in items if i["layout"] == "arc"], make_rows("arc", args.rows)):
            it["question"] = row["question"]
        items_path = os.path.join(work, "items.json")
        with open(items_path, "w") as fh:
            json.dump(items, fh)
        log("%d rows over %d layouts, %d choices" % (len(items), len(LAYOUTS),
                                                      sum(len(i["choices"]) for i in items)))

        t0 = time.time()
        ref_path = os.path.join(work, "reference.json")
        script = os.path.join(work, "reference.py")
        with open(script, "w") as fh:
            fh.write(REFERENCE)
        log("reference (in-process, beside the server's runs): %s" % script)
        reference = subprocess.Popen([py, script, model, items_path, ref_path])

        server = Server(py, model, work)
        probe = probes(server.url)
        runs = {}
        for layout in {"all": LAYOUTS, "first": LAYOUTS[:1], "none": ()}[args.direct]:
            log("evalharness on %s, straight to the server" % layout)
            runs[("direct", layout)] = evalharness_run(files[layout], server.url, os.path.join(work, "direct-" + layout))
        failed_direct = any(r["rc"] != 0 or sum(x.get("status") == "ok" for x in r["records"].values()) < args.rows
                            for (m, _), r in runs.items() if m == "direct") or args.direct == "none"
        if failed_direct:
            for mode in ("text", "ids"):
                proxy, purl = start_proxy(server.url, mode)
                for layout in LAYOUTS:
                    log("evalharness on %s, through the splitting proxy (%s)" % (layout, mode))
                    runs[("proxy-" + mode, layout)] = evalharness_run(files[layout], purl, os.path.join(
                        work, "proxy-%s-%s" % (mode, layout)))
                proxy.shutdown()
                proxy.server_close()
                proxy = None

        lm = None
        if not args.no_lm_eval:
            hf_dir = os.path.join(work, "hf_tokenizer")
            conv = subprocess.run([py, "-c", HF_CONVERT, os.path.dirname(model), os.path.basename(model), hf_dir],
                                  capture_output=True, text=True, timeout=600)
            hf_note = (conv.stdout.strip() or conv.stderr.strip().splitlines()[-1:]) if conv.returncode == 0 else \
                "transformers could not convert the GGUF's tokenizer: %s" % (
                    conv.stderr.strip().splitlines()[-1:] or "?")
            lm = {"hf_tokenizer": hf_note}
            lm.update(lm_eval_runs(py, server.url, files["arc"], work))

        if reference.wait() != 0:
            raise SystemExit("the reference failed (exit %s)" % reference.returncode)
        ref_wall = time.time() - t0
        with open(ref_path) as fh:
            ref = json.load(fh)
        both = [(a, b) for k in ref["rows"].values() for a, b in zip(k["tokenizer"]["ll"], k["offsets"]["ll"])]
        rule_gap = sum(abs(a - b) > TOL for a, b in both)
        lm_rows = {}
        if lm is not None:
            lm_rows = {k: v for k, v in lm.items() if k != "hf_tokenizer"}
            lm_eval_compare(lm_rows, [i for i in items if i["layout"] == "arc"], ref)

        # ------------------------------------------------------------------ the summary
        print("\n== llama-cpp-python 0.3.36 server, tiny random GGUF %s, %d rows (%s), %d choices" % (
            "x".join(map(str, MODEL_SHAPE)), len(items), ", ".join(LAYOUTS), sum(len(i["choices"]) for i in items)))
        print("-- raw answers of the server")
        for k, (st, body) in probe.items():
            print("  %-34s %s %s" % (k, st, json.dumps(body)[:400] if not isinstance(body, str) else body[:400]))
        print("-- reference: /extras/tokenize adds BOS: %s; %d of %d choices differ by >%g between the two boundary "
              "rules (%.0f s)" % (ref["endpoint_adds_bos"], rule_gap, len(both), TOL, ref_wall))
        for mode in ("direct", "proxy-text", "proxy-ids"):
            for layout in LAYOUTS:
                r = runs.get((mode, layout))
                if r is None:
                    continue
                recs = r["records"].values()
                n_ok = sum(x.get("status") == "ok" for x in recs)
                print("-- evalharness %s %-10s rc=%s tokenization=%s rows ok %d/%d, failed %d (%.0f s)" % (
                    mode, layout, r["rc"], r.get("tokenization"), n_ok, args.rows,
                    sum(x.get("status") == "failed" for x in recs), r["wall_s"]))
                errs = sorted({str(x.get("error"))[:300] for x in recs if x.get("status") != "ok"})
                for e in errs[:2]:
                    print("     error: %s" % e)
                if r["rc"] != 0 or not recs:
                    for ln in r["stderr"][-3:]:
                        print("     stderr: %s" % ln[:300])
        for mode in ("direct", "proxy-text", "proxy-ids"):
            sel = [(layout, r) for (m, layout), r in runs.items() if m == mode]
            if not sel:
                continue
            rule = None
            for _, r in sel:
                rule = rule or ("tokenizer" if (r.get("tokenization") or "").find("tokenize") >= 0 else
                                "offsets" if r.get("tokenization") else None)
            if not any(x.get("status") == "ok" for _, r in sel for x in r["records"].values()):
                print("== %s: no row gave log-likelihoods: nothing to compare" % mode)
                continue
            per = {}
            for layout, r in sel:
                its = [i for i in items if i["layout"] == layout]
                per[layout] = compare(its, r["records"], ref, rule or "offsets")
            tot = {k: sum(p[k] for p in per.values()) for k in ("rows_ok", "choices", "over_tol",
                                                                  "token_count_mismatch", "acc_pred_diff",
                                                                  "acc_norm_pred_diff", "ref_near_ties",
                                                                  "extra_generated")}
            mx = max((p["max_abs_diff"] for p in per.values() if p["max_abs_diff"] is not None), default=None)
            print("== %s vs reference (%s rule): rows %d, choices %d, max |dll| %s, over %g: %d, token counts differ: "
                  "%d, acc preds differ: %d, acc_norm preds differ: %d (reference near-ties < %g: %d; rows where the "
                  "server generated more than max_tokens 1: %d)" % (
                      mode, rule, tot["rows_ok"], tot["choices"], "%.3g" % mx if mx is not None else "-", TOL,
                      tot["over_tol"], tot["token_count_mismatch"], tot["acc_pred_diff"], tot["acc_norm_pred_diff"],
                      TOL, tot["ref_near_ties"], tot["extra_generated"]))
            for layout, p in per.items():
                print("   %-10s rows %d max |dll| %s over %d tokens-differ %d acc-diff %d acc_norm-diff %d" % (
                    layout, p["rows_ok"], "%.3g" % p["max_abs_diff"] if p["max_abs_diff"] is not None else "-",
                    p["over_tol"], p["token_count_mismatch"], p["acc_pred_diff"], p["acc_norm_pred_diff"]))
                for e in p["examples"][:2]:
                    print("     e.g. %s" % e)
        if lm is not None:
            print("== lm-eval 0.4.13 local-completions on the arc rows (HF tokenizer from the GGUF: %s)" % (
                lm.pop("hf_tokenizer"),))
            for backend, info in lm.items():
                print("  tokenizer_backend=%s: rc=%s %s" % (backend, info.get("rc"), json.dumps(
                    {k: v for k, v in info.items() if k not in ("rc", "cmd", "samples")})[:900]))
        print("== wall %.0f s (work dir %s)" % (time.time() - t_start, work))
        return 0
    finally:
        if proxy is not None:
            proxy.shutdown()
            proxy.server_close()
        if server is not None:
            server.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
