#!/usr/bin/env python3
"""SWE end-to-end benchmark with pull-ahead (needs a Docker daemon; images are built offline by tests/swebed.py).

N task instances (copies of the three test-bed tasks, each with its own image carrying an extra layer of random
bytes so that delivering it costs real work) are run with the mock's oracle agent, whose every reply is delayed
(--reply-s) so generation takes time. Images come from a docker-save batch in a tar directory. Measured, in one run:

  G   generation alone: images already present
  D   delivery alone: `evalharness images load` of every image from the batch
  W   a run with pull-ahead (images removed first): target W <= 1.1 x max(G, D)
  W0  the same run with --no-pull-ahead (each image delivered when its sample starts)

plus containers started per minute.

    python3 bench/swe.py [--instances 16] [--mb 80] [--reply-s 3.0] [--sessions 4] [--json]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import evalharness as eh  # noqa: E402
from tests import dockerbed as bed  # noqa: E402
from tests import swebed  # noqa: E402

MODULE = os.path.join(ROOT, "evalharness.py")


def _docker(*args, **kw):
    return subprocess.run(["docker"] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=16)
    ap.add_argument("--mb", type=float, default=80.0, help="random payload per image (MB)")
    ap.add_argument("--reply-s", type=float, default=3.0, help="delay of every model reply (s)")
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (run dirs, events) for a look")
    args = ap.parse_args()
    reason = bed.docker_reason()
    if reason:
        raise SystemExit("bench/swe.py: " + reason)
    rows = swebed.build_task_images(log=lambda *a: None)
    work = tempfile.mkdtemp(prefix="evh-bench-swe-")
    tag = "evh-bench-swe-%d" % os.getpid()
    images, dataset_rows = [], []
    mock = None
    try:
        # N distinct images: a task image plus a layer of random bytes
        for i in range(args.instances):
            src = rows[i % len(rows)]
            ctx = os.path.join(work, "ctx%d" % i)
            os.makedirs(ctx)
            with open(os.path.join(ctx, "payload.bin"), "wb") as fh:
                fh.write(os.urandom(int(args.mb * 1e6)))
            with open(os.path.join(ctx, "Dockerfile"), "w") as fh:
                fh.write("FROM %s\nCOPY payload.bin /opt/payload.bin\n" % src["image"])
            ref = "%s:%d" % (tag, i)
            out = subprocess.run(["docker", "build", "-q", "-t", ref, ctx], env=dict(os.environ, DOCKER_BUILDKIT="0"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
            if out.returncode:
                raise SystemExit(out.stderr)
            shutil.rmtree(ctx)
            images.append(ref)
            row = {k: v for k, v in src.items() if not k.startswith("_")}
            row.update(instance_id="%s-%d" % (src["instance_id"], i), image=ref)
            dataset_rows.append(row)
        tars = os.path.join(work, "tars")
        os.makedirs(tars)
        t0 = time.perf_counter()
        out = _docker("save", "-o", os.path.join(tars, "batch.tar"), *images)
        if out.returncode:
            raise SystemExit(out.stderr)
        save_s = time.perf_counter() - t0
        ds = os.path.join(work, "swe.jsonl")
        with open(ds, "w") as fh:
            for row in dataset_rows:
                fh.write(json.dumps(row) + "\n")
        dataset = eh.SWEDataset(ds).validate()
        mock = eh.MockServer(eh.MockConfig(model="m", ttft_s=args.reply_s), swe=dataset).start()
        env = dict(os.environ, EVALHARNESS_TAR_INDEX=os.path.join(work, "index.json"),
                   EVALHARNESS_IMAGE_STATE=os.path.join(work, "state.json"), EVALHARNESS_PROGRESS_S="5")
        subprocess.run([sys.executable, MODULE, "images", "index", tars], env=env, stdout=subprocess.DEVNULL,
                       check=True)

        detail = {}

        def run(label, extra):
            out_dir = os.path.join(work, "run-" + label)
            t = time.perf_counter()
            proc = subprocess.run([sys.executable, MODULE, "run", "--task", "swe", "--dataset", ds, "--model", "m",
                                   "--base-url", mock.url, "--out", out_dir, "--max-sessions", str(args.sessions),
                                   "--fixed-concurrency", str(args.sessions), "--image-tars", tars, "--json",
                                   "--no-progress", "--keep-images"] + extra, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, universal_newlines=True)
            wall = time.perf_counter() - t
            if proc.returncode:
                raise SystemExit("%s run failed (%d): %s" % (label, proc.returncode, proc.stderr[-2000:]))
            resolved = json.loads(proc.stdout)["swebench"]["resolved_instances"]
            with open(os.path.join(out_dir, "samples.jsonl")) as fh:
                recs = [json.loads(line) for line in fh]
            detail[label] = {k: round(sum(r.get(k) or 0 for r in recs) / len(recs), 2)
                             for k in ("image_wait_s", "agent_s", "eval_s")}
            return wall, resolved

        def remove_images():
            _docker("rmi", *images)

        # G: images present
        gen_s, gen_ok = run("gen", [])
        # D: delivery alone
        remove_images()
        t = time.perf_counter()
        subprocess.run([sys.executable, MODULE, "images", "load", "--image-tars", tars, "--no-progress"] + images,
                       env=env, stdout=subprocess.DEVNULL, check=True)
        deliver_s = time.perf_counter() - t
        # W: pull-ahead; W0: delivery at sample start
        remove_images()
        ahead_s, ahead_ok = run("ahead", [])
        remove_images()
        lazy_s, lazy_ok = run("lazy", ["--no-pull-ahead"])
        res = {"instances": args.instances, "image_mb": args.mb, "reply_s": args.reply_s, "sessions": args.sessions,
               "batch_bytes": os.path.getsize(os.path.join(tars, "batch.tar")), "save_s": round(save_s, 2),
               "generation_s": round(gen_s, 2), "delivery_s": round(deliver_s, 2),
               "pull_ahead_s": round(ahead_s, 2), "no_pull_ahead_s": round(lazy_s, 2),
               "ratio_to_max": round(ahead_s / max(gen_s, deliver_s), 3),
               "ratio_to_sum": round(ahead_s / (gen_s + deliver_s), 3),
               "resolved": [gen_ok, ahead_ok, lazy_ok],
               "containers_per_min": round(2 * args.instances / ahead_s * 60, 1), "per_sample_means": detail}
    finally:
        if mock is not None:
            mock.close()
        _docker("rmi", "-f", *images) if images else None
        if args.keep:
            print("kept %s" % work, file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print("%d instances, %d sessions, images %.0f MB each (batch %.0f MB), model replies delayed %.1f s"
          % (res["instances"], res["sessions"], res["image_mb"], res["batch_bytes"] / 1e6, res["reply_s"]))
    print("generation alone G = %.1f s; delivery alone D = %.1f s; max %.1f s, sum %.1f s"
          % (res["generation_s"], res["delivery_s"], max(res["generation_s"], res["delivery_s"]),
             res["generation_s"] + res["delivery_s"]))
    print("with pull-ahead W = %.1f s = %.2f x max(G, D) (target <= 1.1), %.2f x (G + D); without pull-ahead "
          "%.1f s" % (res["pull_ahead_s"], res["ratio_to_max"], res["ratio_to_sum"], res["no_pull_ahead_s"]))
    print("resolved (G, W, W0 runs): %s of %d each; containers started per minute (agent + eval) with pull-ahead: "
          "%.0f" % (res["resolved"], res["instances"], res["containers_per_min"]))
    print("per-sample means (image wait, agent, eval seconds): %s" % json.dumps(res["per_sample_means"]))


if __name__ == "__main__":
    main()
