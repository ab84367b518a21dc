#!/usr/bin/env python3
"""The adaptive gate against a real server no one here wrote: llama.cpp's llama-server (evalharness issue 21).

Builds `llama-server` once into a cache directory (the C++ target only, from the llama.cpp bundled in the PyPI
source package llama-cpp-python 0.3.36: cmake + ninja, Release, static, about 9 minutes on 2 cores), writes a small
random-weight LLaMA-architecture GGUF (with the PyPI `gguf` and `numpy` packages in a throwaway virtualenv in a
temporary directory: nothing of it reaches the program; MODEL_SHAPE sets its size), starts servers with 4, 16 and
32 slots (`-np`, with `--metrics`), and for each runs `evalharness run` on 480 questions of 64 output tokens, in
three rounds (after one run not counted: a fresh server's first is slow): each round runs a fixed sweep (1 ... 64 in
flight) once and the adaptive gate cold (no cached limit) and warm (the limit that cold run cached), in an order
shuffled per round, so a shared machine's drift touches every setting alike. Prints medians over the rounds: wall (first
request to last answer), output tokens/s, time to first token p50/p95, the discovered limit and the ratios to the best
fixed setting (the smallest concurrency within 2% of the fastest median fixed wall; walls are compared with the
fastest). Each sweep also runs slots+1 and slots+2 (`--no-near-slots` drops them): a fixed count at the slots leaves
a slot idle while its next request is on its way, so the best fixed is often just above them. Run by hand (over an
hour with the default sweep; pass a shorter one per slot count, e.g. `--slots 4 --sweep 2,4,6,8,16`), never by CI.

Usage: python3 bench/real_server.py [--slots 4,16,32] [--sweep 1,2,4,8,16,32,64] [--no-near-slots] [--repeats 3]
       [--rows 480] [--max-tokens 64] [--llama-server PATH] [--model PATH] [--cache DIR] [--server-metrics auto|off]
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "evalharness.py")
SDIST = "llama-cpp-python==0.3.36"
TINY_MODEL = r'''
# Writes a tiny random-weight LLaMA-architecture GGUF with an SPM tokenizer and a chat template.
import sys
import numpy as np, gguf
rng = np.random.default_rng(0)
n_embd, n_layer, n_head, n_ff, ctx = (int(x) for x in sys.argv[2:7]) if len(sys.argv) > 2 else (64, 2, 4, 128, 2048)
words = """the of and to a in is it you that he was for on are with as I his they be at one have this from or had by
hot word but what some we can out other were all there when up use your how said an each she which do their time
if will way about many then them write would like so these her long make thing see him two has look more day could
go come did number sound no most people my over know water than call first who may down side been now find any new
work part take get place made live where after back little only round man year came show every good me give our under
name very through just form sentence great think say help low line differ turn cause much mean before move right boy
old too same tell does set three want air well also play small end put home read hand port large spell add even land
here must big high such follow act why ask men change went light kind off need house picture try us again animal point
mother world near build self earth father head stand own page should country found answer school grow study still
learn plant cover food sun four between state keep eye never last let thought city tree cross farm hard start might
story saw far sea draw left late run while press close night real life few north open seem together next white
children begin got walk example ease paper group always music those both mark often letter until mile river car feet
care second book carry took science eat room friend began idea fish mountain stop once base hear horse cut sure watch
color face wood main enough plain girl usual young ready above
ever red list though feel talk bird soon body dog family""".split()
words = list(dict.fromkeys(words))[:150]
toks, scores, types = [], [], []
def add(t, s, ty): toks.append(t); scores.append(s); types.append(ty)
add("<unk>", 0.0, gguf.TokenType.UNKNOWN)
add("<s>", 0.0, gguf.TokenType.CONTROL)
add("</s>", 0.0, gguf.TokenType.CONTROL)
for b in range(256): add(f"<0x{b:02X}>", 0.0, gguf.TokenType.BYTE)
add("▁", -1.0, gguf.TokenType.NORMAL)
for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?:'-<>|/":
    add(c, -2.0, gguf.TokenType.NORMAL)
# SPM merges pairwise, so every prefix of "▁word" must be a token for whole words to form
seen = set(toks)
for i, w in enumerate(words):
    for k in range(2, len(w) + 2):
        piece = ("▁" + w)[:k]
        if piece not in seen:
            seen.add(piece); add(piece, -10.0 + k, gguf.TokenType.NORMAL)
n_vocab = len(toks)

w = gguf.GGUFWriter(sys.argv[1], "llama")
w.add_name("tiny-random-llama")
w.add_context_length(ctx)
w.add_embedding_length(n_embd)
w.add_block_count(n_layer)
w.add_feed_forward_length(n_ff)
w.add_head_count(n_head)
w.add_head_count_kv(n_head)
w.add_layer_norm_rms_eps(1e-5)
w.add_rope_dimension_count(n_embd // n_head)
w.add_rope_freq_base(10000.0)
w.add_vocab_size(n_vocab)
w.add_file_type(gguf.LlamaFileType.ALL_F32)
w.add_tokenizer_model("llama")
w.add_tokenizer_pre("default")
w.add_token_list(toks)
w.add_token_scores(scores)
w.add_token_types(types)
w.add_bos_token_id(1)
w.add_eos_token_id(2)
w.add_unk_token_id(0)
w.add_add_bos_token(True)
w.add_add_eos_token(False)
w.add_chat_template(
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")

def t(name, *shape, scale=0.05):
    w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))
t("token_embd.weight", n_vocab, n_embd, scale=0.5)
w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
t("output.weight", n_vocab, n_embd, scale=0.5)
for i in range(n_layer):
    p = f"blk.{i}."
    w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, np.float32))
    for n in ("attn_q", "attn_k", "attn_v", "attn_output"): t(p + n + ".weight", n_embd, n_embd)
    t(p + "ffn_gate.weight", n_ff, n_embd); t(p + "ffn_up.weight", n_ff, n_embd); t(p + "ffn_down.weight", n_embd, n_ff)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
print("vocab", n_vocab)
'''


def log(msg):
    print("real_server: %s" % msg, file=sys.stderr, flush=True)


def venv_python(tmp, packages):
    """A throwaway virtualenv in TMP with PACKAGES pip-installed (the bench's one exception to stdlib only)."""
    env_dir = os.path.join(tmp, "venv")
    subprocess.run([sys.executable, "-m", "venv", env_dir], check=True)
    py = os.path.join(env_dir, "bin", "python")
    subprocess.run([py, "-m", "pip", "install", "-q"] + packages, check=True)
    return py


def build_llama_server(cache):
    """Build llama-server into CACHE once (the sdist's vendored llama.cpp, only the server target)."""
    binary = os.path.join(cache, "llama-server")
    if os.path.exists(binary):
        return binary
    os.makedirs(cache, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        log("building llama-server (about 9 minutes on 2 cores)")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", SDIST,
                        "-d", tmp], check=True)
        sdist = [f for f in os.listdir(tmp) if f.endswith(".tar.gz")][0]
        with tarfile.open(os.path.join(tmp, sdist)) as tar:
            tar.extractall(tmp)
        src = os.path.join(tmp, sdist[:-len(".tar.gz")], "vendor", "llama.cpp")
        build = os.path.join(tmp, "build")
        subprocess.run(["cmake", "-S", src, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                        "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=OFF",
                        "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", build, "--target", "llama-server", "-j", str(os.cpu_count() or 2)],
                       check=True, stdout=subprocess.DEVNULL)
        shutil.copy2(os.path.join(build, "bin", "llama-server"), binary)
    return binary


PLATEAU = 0.02  # run-to-run noise of a wall here (2 cores shared by server and client)
MODEL_SHAPE = (768, 4, 12, 2048, 4096)  # embedding, layers, heads, feed-forward, context: ~33 s at 16 slots here


def write_model(cache):
    """A random-weight LLaMA GGUF of MODEL_SHAPE (about 100 MB): its text is random words and never stops by
    itself, so every answer runs to --max-tokens."""
    path = os.path.join(cache, "small-%s.gguf" % "-".join(str(x) for x in MODEL_SHAPE))
    if not os.path.exists(path):
        with tempfile.TemporaryDirectory() as tmp:
            py = venv_python(tmp, ["gguf", "numpy"])
            script = os.path.join(tmp, "model.py")
            with open(script, "w") as fh:
                fh.write(TINY_MODEL)
            subprocess.run([py, script, path] + [str(x) for x in MODEL_SHAPE], check=True)
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary, model, slots):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="llama-%d-" % slots, suffix=".log", delete=False)
        self.proc = subprocess.Popen([binary, "-m", model, "--host", "127.0.0.1", "--port", str(self.port),
                                      "-np", str(slots), "-c", str(slots * 1024), "-t", "2", "--metrics"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise SystemExit("llama-server did not become ready (log %s)" % self.log.name)

    @property
    def url(self):
        return "http://127.0.0.1:%d/v1" % self.port

    def stop(self):
        died = self.proc.poll()  # it exited by itself: its log says why
        if died is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        if died is None:
            os.unlink(self.log.name)  # kept when the server failed to start (that error names it) or died
        else:
            log("llama-server exited by itself (%d) during the runs; its log: %s" % (died, self.log.name))


def percentile(xs, q):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def one_run(url, dataset, workdir, label, gate_args, limits_file, max_tokens, metrics):
    out = os.path.join(workdir, label)
    env = dict(os.environ, EVALHARNESS_LIMITS_FILE=limits_file, NO_PROXY="127.0.0.1")
    cmd = [sys.executable, PROGRAM, "run", "--dataset", dataset, "--model", "tiny", "--no-model-check",
           "--base-url", url, "--out", out, "--max-tokens", str(max_tokens), "--no-progress",
           "--server-metrics", metrics] + gate_args
    t0 = time.time()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if res.returncode not in (0, 1):
        raise SystemExit("run %s failed (%d): %s" % (label, res.returncode, res.stderr[-2000:]))
    samples = [json.loads(line) for line in open(os.path.join(out, "samples.jsonl"))]
    with open(os.path.join(out, "run.json")) as fh:
        run = json.load(fh)
    start = min(s["started_at"] for s in samples)
    end = max(s["finished_at"] for s in samples)
    tokens = sum(s.get("completion_tokens") or 0 for s in samples)
    ttft = [s.get("ttft_s") for s in samples]
    shutil.rmtree(out, ignore_errors=True)
    return {"wall": end - start, "process_wall": wall, "tok_s": tokens / max(end - start, 1e-9),
            "ttft_p50": percentile(ttft, 0.5), "ttft_p95": percentile(ttft, 0.95),
            "discovered": run.get("discovered_limit"), "failed": sum(1 for s in samples if s.get("status") != "ok")}


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", default="4,16,32")
    ap.add_argument("--sweep", default="1,2,4,8,16,32,64")
    ap.add_argument("--no-near-slots", dest="near_slots", action="store_false",
                    help="do not add slots+1 and slots+2 to each sweep")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=480)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--llama-server", default=None, help="an existing binary (default: build into --cache)")
    ap.add_argument("--model", default=None, help="an existing GGUF (default: write the tiny one into --cache)")
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/evalharness/bench/llama"))
    ap.add_argument("--server-metrics", default="auto", choices=("auto", "off"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    binary = args.llama_server or build_llama_server(args.cache)
    model = args.model or write_model(args.cache)
    work = tempfile.mkdtemp(prefix="real-server-")
    dataset = os.path.join(work, "questions.jsonl")
    with open(dataset, "w") as fh:
        for i in range(args.rows):
            fh.write(json.dumps({"id": "q%03d" % i, "question": "Tell a story number %d." % i, "answer": "x"}) + "\n")
    rows = []
    for slots in [int(x) for x in args.slots.split(",")]:
        server = Server(binary, model, slots)
        limits = os.path.join(work, "limits-%d.json" % slots)
        try:
            log("server with %d slots on %s" % (slots, server.url))
            sweep = [int(x) for x in args.sweep.split(",")]
            if args.near_slots:  # a fixed count at the slots leaves idle the slot whose request is on its way
                sweep = sorted(set(sweep) | {slots + 1, slots + 2})
            fixed_runs = {c: [] for c in sweep}
            cold, warm = [], []

            def run_gate(r):
                if os.path.exists(limits):
                    os.remove(limits)
                cold.append(one_run(server.url, dataset, work, "cold-%d" % r, ["--initial-concurrency", "auto"],
                                    limits, args.max_tokens, args.server_metrics))
                warm.append(one_run(server.url, dataset, work, "warm-%d" % r, ["--initial-concurrency", "auto"],
                                    limits, args.max_tokens, args.server_metrics))
                log("  round %d cold %.1fs (limit %s, failed %d), warm %.1fs (limit %s, failed %d)" % (
                    r + 1, cold[-1]["wall"], cold[-1]["discovered"], cold[-1]["failed"], warm[-1]["wall"],
                    warm[-1]["discovered"], warm[-1]["failed"]))

            # a fresh server's first run is slower than the rest (24 in flight against 16 slots: 46.7 s first, then
            # 37-38 s at 16-18): one run, not counted, before the rounds
            one_run(server.url, dataset, work, "warm-up", ["--fixed-concurrency", str(slots)], limits, args.max_tokens,
                    args.server_metrics)
            for r in range(args.repeats):
                # every round runs the whole sweep and the gate cold then warm (from what that cold run cached), in
                # an order shuffled per round: the drift of a shared machine touches them all alike
                order = sweep + [None]
                random.Random("round-%d-%d" % (slots, r)).shuffle(order)
                for c in order:
                    if c is None:
                        run_gate(r)
                        continue
                    fixed_runs[c].append(one_run(server.url, dataset, work, "fixed%d-%d" % (c, r),
                                                 ["--fixed-concurrency", str(c)], limits, args.max_tokens,
                                                 args.server_metrics))
                    log("  round %d fixed %3d: wall %.1fs, TTFT p50 %s, failed %d" % (
                        r + 1, c, fixed_runs[c][-1]["wall"], fixed_runs[c][-1]["ttft_p50"],
                        fixed_runs[c][-1]["failed"]))

            fixed = {c: {k: median([x[k] for x in runs]) for k in runs[0]} for c, runs in fixed_runs.items()}
            # on a plateau several settings are within noise of the fastest: the best fixed concurrency is the
            # smallest within PLATEAU of the fastest median wall (as gate_sim's oracle takes the smallest within
            # 1% of the best goodput); walls are compared with the fastest
            fastest = min(f["wall"] for f in fixed.values())
            best_c = min(c for c in fixed if fixed[c]["wall"] <= (1.0 + PLATEAU) * fastest)
            for name, runs in (("cold", cold), ("warm", warm)):
                m = {k: median([r[k] for r in runs]) for k in runs[0]}
                rows.append({"slots": slots, "mode": name, "best_fixed": best_c, "best_wall": fastest,
                             "best_ttft_p50": fixed[best_c]["ttft_p50"], "wall": m["wall"], "tok_s": m["tok_s"],
                             "ttft_p50": m["ttft_p50"], "ttft_p95": m["ttft_p95"], "discovered": m["discovered"],
                             "failed": sum(r["failed"] for r in runs),
                             "walls": [round(r["wall"], 1) for r in runs],
                             "discovered_all": [r["discovered"] for r in runs],
                             "wall_ratio": m["wall"] / fastest,
                             "limit_ratio": (m["discovered"] or 0) / best_c,
                             "ttft_ratio": (m["ttft_p50"] or 0) / max(fixed[best_c]["ttft_p50"] or 1e-9, 1e-9),
                             "fixed": {c: round(f["wall"], 1) for c, f in fixed.items()},
                             "fixed_walls": {c: [round(x["wall"], 1) for x in runs] for c, runs in fixed_runs.items()}})
        finally:
            server.stop()
    print("real_server: llama-server, %d requests of %d tokens, medians of %d; wall = first start to last finish"
          % (args.rows, args.max_tokens, args.repeats))
    print("%5s %5s %6s %8s %8s %8s %9s %9s %9s %6s %7s %7s %6s  %s" % (
        "slots", "mode", "best C", "best s", "wall s", "tok/s", "TTFT p50", "TTFT p95", "found", "wall x",
        "limit x", "TTFT x", "failed", "walls / limits"))
    for r in rows:
        print("%5d %5s %6d %8.1f %8.1f %8.0f %9.3f %9.3f %9s %6.2f %7.2f %7.2f %6d  %s / %s" % (
            r["slots"], r["mode"], r["best_fixed"], r["best_wall"], r["wall"], r["tok_s"], r["ttft_p50"] or 0,
            r["ttft_p95"] or 0, r["discovered"], r["wall_ratio"], r["limit_ratio"], r["ttft_ratio"], r["failed"],
            r["walls"], r["discovered_all"]))
    for r in rows[:1]:
        print("fixed sweeps (wall s): " + "; ".join("%d slots: %s" % (x["slots"], x["fixed"]) for x in rows[::2]))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
