"""--task harbor: container tasks in Harbor's folder layout. The TOML reader against tomllib, the folder checks and
the reward rules without Docker; then task folders of our own on real Docker (tests/swebed.py's Debian base image)
with the mock's agent policies: reference solutions, a do-nothing agent, agents that plant a reward, replace the
tests or leave a process behind, verifiers that write no reward or run past their timeout, environments built
from a local image once, a missing base, kill -9 and resume, shards and merge, a lost engine host."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import unittest
import uuid

from tests import dockerbed as bed
from tests.support import CLI, clean_env, kill_9_then_resume, read_samples, run_cli, start_mock, tempdir, wait_until

import evalharness as eh

BASE = "evalharness-swe-base:test"


def write_task(root, name, *, toml, instruction, test, solve=None, dockerfile=None, files=None):
    """A task folder ROOT/NAME in Harbor's layout; returns its path."""
    d = os.path.join(root, name)
    for sub, text in (("task.toml", toml), ("instruction.md", instruction), ("tests/test.sh", test),
                      ("solution/solve.sh", solve), ("environment/Dockerfile", dockerfile)):
        if text is not None:
            os.makedirs(os.path.dirname(os.path.join(d, sub)), exist_ok=True)
            with open(os.path.join(d, sub), "w", encoding="utf-8") as fh:
                fh.write(textwrap.dedent(text))
    for sub, text in (files or {}).items():
        os.makedirs(os.path.dirname(os.path.join(d, sub)), exist_ok=True)
        with open(os.path.join(d, sub), "w", encoding="utf-8") as fh:
            fh.write(text)
    return d


def hello_task(root, name="hello", verifier_sleep=0, reward_if_missing="0", category="files"):
    """Write /app/<name>.txt holding the word hello; the verifier writes 1 when it does (after VERIFIER_SLEEP s),
    else REWARD_IF_MISSING ("" writes nothing)."""
    otherwise = "echo %s > /logs/verifier/reward.txt" % reward_if_missing if reward_if_missing else "true"
    return write_task(root, name, toml='''\
        schema_version = "1.4"
        [metadata]
        category = "%s"
        [verifier]
        timeout_sec = 60.0
        [agent]
        timeout_sec = 120.0
        [environment]
        docker_image = "%s"
        workdir = "/app"
        ''' % (category, BASE), instruction="Create the file /app/%s.txt holding the word hello.\n" % name,
        test='''\
        #!/bin/bash
        sleep %s
        if [ "$(cat /app/%s.txt 2>/dev/null)" = hello ]; then echo 1 > /logs/verifier/reward.txt; else %s; fi
        ''' % (verifier_sleep, name, otherwise), solve="#!/bin/bash\necho hello > /app/%s.txt\n" % name)


def built_task(root, name="built", base=BASE, nonce=None):
    """Built from environment/Dockerfile (FROM BASE, WORKDIR /work, a file made at build time); reward.json with
    two metrics: correct (the agent's answer) and lint (always 1)."""
    return write_task(root, name, toml='''\
        [verifier]
        timeout_sec = 60
        [environment]
        build_timeout_sec = 300
        ''', instruction="Write twice the number in /work/n to /work/double.\n",
        dockerfile="FROM %s\nWORKDIR /work\nRUN echo 3 > /work/n\nLABEL test.nonce=%s\n" % (
            base, nonce or uuid.uuid4().hex),
        test='''\
        #!/bin/bash
        c=0; [ "$(cat /work/double 2>/dev/null)" = 6 ] && c=1
        echo "{\\"correct\\": $c, \\"lint\\": 1}" > /logs/verifier/reward.json
        ''', solve="#!/bin/bash\necho $(( $(cat /work/n) * 2 )) > /work/double\n")


# ----------------------------------------------------------------------------- without Docker
TOML_SAMPLE = r'''
# a comment
schema_version = "1.4"
title = 'literal \n stays'
"quoted key" = 1_000
dotted.key.here = -0.5e3
hex = 0xdead_BEEF
oct = 0o755
bin = 0b1010
flt = +1.5
inf_ = -inf
big = 12345678901234567890
empty = ""
esc = "tab\there \"q\" \u00e9 \U0001F600 back\\slash"
multi = """
first line \
    joined
second "quoted" line"""
''' + "lit_multi = '''\nraw \\n text'''\n" + r'''bools = [true, false,]
nested = [[1, 2], ["a", 'b'], []]
inline = { a = 1, b.c = "x", d = { e = [1.0, 2.5] } }
long = [
  1,  # one
  2,
]

[task]
name = "org/task-name"
keywords = ["a", "b"]

[metadata]
category = "software-engineering"

[verifier]
timeout_sec = 900.0
env = { TOKEN = "${EH_TEST_TOKEN:-fallback}" }

[verifier.extra]
x = 1

[[steps_like]]
n = 1
[[steps_like]]
n = 2

[environment]
build_timeout_sec = 600.0
cpus = 2
memory_mb = 4096
allow_internet = false
'''


def tomllib_values(text):
    """tomllib's values of TEXT as repr: in process on 3.11+, else by Debian's /usr/bin/python3 (3.11)."""
    try:
        import tomllib
        return repr(tomllib.loads(text))
    except ImportError:
        pass
    for python in ("/usr/bin/python3", shutil.which("python3.11"), shutil.which("python3.12")):
        if python and subprocess.run([python, "-c", "import tomllib"], capture_output=True).returncode == 0:
            res = subprocess.run([python, "-c", "import sys, tomllib; print(repr(tomllib.loads(sys.stdin.read())))"],
                                 input=text, capture_output=True, universal_newlines=True, timeout=60)
            if res.returncode != 0:
                raise AssertionError(res.stderr)
            return res.stdout.strip()
    raise AssertionError("no Python with tomllib on this machine (Debian 12's python3 has it)")


class TestToml(unittest.TestCase):
    def toml_files(self):
        d = tempdir(self)
        hello_task(d)
        built_task(d)
        yield "sample", TOML_SAMPLE
        for name in sorted(os.listdir(d)):
            with open(os.path.join(d, name, "task.toml"), encoding="utf-8") as fh:
                yield name, fh.read()
        # the shape of the template in the PyPI package harbor 0.25.0 (harbor/cli/template-task/task.toml)
        yield "template", ('schema_version = "1.4"\n\n[metadata]\n\n[verifier]\ntimeout_sec = 900.0\n\n[agent]\n'
                           'timeout_sec = 900.0\n\n[environment]\nbuild_timeout_sec = 600.0\n')

    def test_the_reader_gives_tomllibs_values_on_every_file(self):
        for name, text in self.toml_files():
            with self.subTest(name):
                self.assertEqual(repr(eh._TomlReader(text).parse()), tomllib_values(text))

    def test_bad_toml_is_an_error_with_its_line(self):
        for text, line in (("a = 1\nb = \n", 2), ("[t]\nx = 1\n[t]\n", 3), ("a = 'open\n", 1), ("a = 1 2\n", 1),
                           ("a = 1\na = 2\n", 2), ("d = 1979-05-27\n", 1)):
            with self.subTest(text):
                with self.assertRaisesRegex(ValueError, r"\(line %d\)" % line):
                    eh._TomlReader(text).parse()


class TestFolders(unittest.TestCase):
    def test_a_bad_folder_is_one_line_naming_folder_file_and_field_and_the_others_load(self):
        d = tempdir(self)
        hello_task(d)
        bad = hello_task(d, "badcpus")
        with open(os.path.join(bad, "task.toml"), "a", encoding="utf-8") as fh:
            fh.write("cpus = \"two\"\n")
        notests = hello_task(d, "notests")
        os.remove(os.path.join(notests, "tests", "test.sh"))
        noenv = write_task(d, "noenv", toml="[verifier]\ntimeout_sec = 10\n", instruction="x\n", test="true\n")
        old = write_task(d, "oldlayout", toml=None, instruction=None, test=None, files={"task.yaml": "instruction: x\n"})
        ts = eh.TaskSet(d)
        errors = {t.id: t.error for t in ts.items}
        self.assertEqual(errors["hello"], "")
        self.assertEqual(errors["badcpus"], "%s: task.toml: [environment].cpus must be a positive number, got 'two'"
                         % bad)
        self.assertEqual(errors["notests"], "%s: tests/test.sh: missing (the verifier, which writes "
                                            "/logs/verifier/reward.txt)" % notests)
        self.assertIn("%s: task.toml: [environment] docker_image: not set, and environment/Dockerfile is missing"
                      % noenv, errors["noenv"])
        self.assertIn("%s: task.yaml: the older Terminal-Bench layout is not read" % old, errors["oldlayout"])
        self.assertTrue(all("\n" not in e for e in errors.values()))

    def test_env_tables_take_the_hosts_variables_and_hide_secret_ones(self):
        d = tempdir(self)
        path = hello_task(d)
        with open(os.path.join(path, "task.toml"), "a", encoding="utf-8") as fh:
            fh.write('env = { MODE = "${EH_TASK_MODE:-plain}", API_TOKEN = "${EH_TASK_TOKEN}" }\n')
        os.environ["EH_TASK_TOKEN"] = "tok-secret-123456"
        self.addCleanup(os.environ.pop, "EH_TASK_TOKEN")
        task = eh.read_task(path)
        self.assertEqual(dict(task.env), {"MODE": "plain", "API_TOKEN": "tok-secret-123456"})
        self.assertNotIn("tok-secret-123456", eh._redact("the token is tok-secret-123456"))
        del os.environ["EH_TASK_TOKEN"]
        self.assertIn("needs the environment variable EH_TASK_TOKEN", eh.read_task(path).error)
        os.environ["EH_TASK_TOKEN"] = "x"


class TestRewards(unittest.TestCase):
    def test_rewards_are_read_as_harbor_reads_them(self):
        p = eh._parse_rewards
        self.assertEqual(p({"reward.txt": b" 0.5\n"}, None), (0.5, {"reward": 0.5}, ""))
        self.assertEqual(p({"reward.json": b'{"a": 1, "b": 0}', "reward.txt": b"0"}, None)[:2],
                         (0.5, {"a": 1.0, "b": 0.0}))  # reward.json first, the mean its headline
        self.assertEqual(p({"reward.json": b'{"a": 1, "b": 0}'}, "b")[0], 0.0)
        for files in ({}, {"reward.txt": b""}, {"reward.txt": b"pass"}, {"reward.txt": b"nan"},
                      {"reward.json": b"[1]"}, {"reward.json": b'{"a": true}'}, {"reward.json": b"{}"},
                      {"reward.json": b'{"a": Infinity}'}):
            with self.subTest(files):
                reward, _, why = p(files, None)
                self.assertIsNone(reward)
                self.assertTrue(why)


# ----------------------------------------------------------------------------- on real Docker
class _DockerTasks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        bed.require_docker_for_class()
        from tests import swebed
        swebed.ensure_base_image(log=lambda *a: None)

    def setUp(self):
        bed.hold_daemon_runs(self)

    def run_tasks(self, dataset, out, policy="oracle", *extra, mock=None, timeout=600):
        if "--check-reference" in extra:
            args = ["run", "--task", "harbor", "--dataset", dataset, "--out", out, "--no-progress"]
        else:
            mock = mock or start_mock(self, swe=eh.TaskSet(dataset), swe_policy=policy)
            args = ["run", "--task", "harbor", "--dataset", dataset, "--model", "m", "--base-url", mock.url,
                    "--out", out, "--no-progress", "--exec-timeout", "30"]
        res = run_cli(args + list(extra), timeout=timeout)
        return res, ({r["id"]: r for r in read_samples(out)} if os.path.exists(os.path.join(out, "samples.jsonl"))
                     else {})

    def remove_image(self, ref):
        self.addCleanup(bed.docker, "rmi", "-f", ref, timeout=120)


class TestVerdicts(_DockerTasks):
    def test_reference_solutions_earn_1_and_reward_json_keeps_both_metrics(self):
        d = tempdir(self)
        hello_task(os.path.join(d, "tasks"))
        self.remove_image(eh.read_task(built_task(os.path.join(d, "tasks"))).image)
        res, recs = self.run_tasks(os.path.join(d, "tasks"), os.path.join(d, "ref"), None, "--check-reference")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual({k: r["reward"] for k, r in recs.items()}, {"hello": 1.0, "built": 1.0})
        self.assertEqual(recs["built"]["rewards"], {"correct": 1.0, "lint": 1.0})
        self.assertEqual((recs["built"]["workdir"], recs["hello"]["workdir"]), ("/work", "/app"))
        self.assertIn("reference check: 2 of 2 task(s) earn reward 1", res.stdout)
        self.assertTrue(os.path.exists(os.path.join(d, "ref", "logs", "built.verifier.txt")))

    def test_only_doing_the_task_earns_the_reward_whatever_the_agent_plants(self):
        d = tempdir(self)
        tasks = os.path.join(d, "tasks")
        hello_task(tasks)
        # the verifier waits 4 s, then writes reward 1 only when the file is right (nothing otherwise): a reward
        # file that a process left by the agent writes in the meantime would count if that process lived on
        hello_task(tasks, "slowcheck", verifier_sleep=4, reward_if_missing="")
        for policy, want in (("oracle", {"hello": 1.0, "slowcheck": 1.0}), ("noop", {"hello": 0.0}),
                             ("plant", {"hello": 0.0}), ("tamper", {"hello": 0.0}),
                             ("linger", {"hello": 0.0, "slowcheck": None})):
            with self.subTest(policy):
                res, recs = self.run_tasks(tasks, os.path.join(d, policy), policy)
                self.assertEqual(res.returncode, 0, res.stderr)
                self.assertEqual({k: recs[k]["reward"] for k in want}, want)
                self.assertEqual({recs[k]["exit_reason"] for k in want}, {"submitted"})
                if policy == "linger":
                    self.assertEqual(recs["slowcheck"]["verdict"], "no_reward")
                    self.assertEqual(recs["slowcheck"]["score"], 0.0)

    def test_the_agent_and_the_verifier_run_as_their_users_with_their_env(self):
        d = tempdir(self)
        write_task(os.path.join(d, "tasks"), "users", toml='''\
            [agent]
            user = "nobody"
            [verifier]
            user = "nobody"
            env = { EXPECT = "nobody" }
            [environment]
            docker_image = "%s"
            ''' % BASE, instruction="Write your user name to /tmp/who.\n",
            solve="#!/bin/bash\nid -un > /tmp/who\n", test='''\
            #!/bin/bash
            [ "$(id -un)" = "$EXPECT" ] && [ "$(cat /tmp/who)" = "$EXPECT" ] && echo 1 > /logs/verifier/reward.txt
            echo "verifier ran as $(id -un); the agent wrote $(cat /tmp/who)"
            ''')
        for policy in ("oracle", None):
            with self.subTest(policy or "reference"):
                extra = ("--check-reference",) if policy is None else ()
                res, recs = self.run_tasks(os.path.join(d, "tasks"), os.path.join(d, policy or "ref"), policy,
                                           *extra)
                self.assertEqual(res.returncode, 0, res.stderr)
                self.assertEqual(recs["users"]["reward"], 1.0, recs["users"])
                self.assertIn("verifier ran as nobody; the agent wrote nobody", recs["users"]["verifier_tail"])

    def test_a_verifier_with_no_reward_or_past_its_timeout_fails_the_task_with_that_reason(self):
        d = tempdir(self)
        tasks = os.path.join(d, "tasks")
        hello_task(tasks, "silent", reward_if_missing="")
        slow = hello_task(tasks, "slow", verifier_sleep=60)
        with open(os.path.join(slow, "task.toml"), encoding="utf-8") as fh:
            text = fh.read().replace("timeout_sec = 60.0", "timeout_sec = 3.0", 1)
        with open(os.path.join(slow, "task.toml"), "w", encoding="utf-8") as fh:
            fh.write(text)
        res, recs = self.run_tasks(tasks, os.path.join(d, "run"), "noop")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual((recs["silent"]["verdict"], recs["silent"]["status"], recs["silent"]["score"]),
                         ("no_reward", "ok", 0.0))
        self.assertEqual(recs["silent"]["why"], "the verifier wrote no /logs/verifier/reward.txt or reward.json")
        self.assertEqual(recs["slow"]["verdict"], "verifier_timeout")
        self.assertIn("past its 3 s timeout", recs["slow"]["why"])
        self.assertLess(recs["slow"]["verifier_s"], 20)  # stopped inside at 3 s (+5 s KILL), not at 60
        text = run_cli(["report", os.path.join(d, "run")]).stdout
        self.assertIn("tasks below reward 1 (2):", text)
        self.assertIn("slow: verifier_timeout: the verifier ran past its 3 s timeout", text)
        self.assertEqual(run_cli(["report", os.path.join(d, "run"), "--html"]).returncode, 0)
        with open(os.path.join(d, "run", "report.html"), encoding="utf-8") as fh:
            page = fh.read()
        self.assertIn("<h2>Tasks</h2>", page)
        self.assertIn("Create the file /app/silent.txt holding the word hello.", page)  # the instruction
        self.assertIn("<em>$ echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT</em>", page)  # the agent's last step


class TestEnvironments(_DockerTasks):
    def test_a_dockerfile_builds_once_and_a_missing_base_fails_its_task_alone(self):
        d = tempdir(self)
        tasks = os.path.join(d, "tasks")
        image = eh.read_task(built_task(tasks)).image
        self.remove_image(image)
        built_task(tasks, "orphan", base="evalharness-missing-base:none")
        hello_task(tasks)
        res, recs = self.run_tasks(tasks, os.path.join(d, "one"), "oracle")
        self.assertEqual(res.returncode, 1, res.stderr)  # a failed task: the run is not whole
        self.assertEqual((recs["built"]["environment"], recs["built"]["reward"], recs["hello"]["reward"]),
                         ("built", 1.0, 1.0))
        self.assertEqual(recs["orphan"]["status"], "failed")
        self.assertEqual(recs["orphan"]["error_class"], "image")
        self.assertIn("task orphan: environment/Dockerfile builds FROM evalharness-missing-base:none, which is not "
                      "on this engine", recs["orphan"]["error"])
        created = bed.docker("image", "inspect", "--format", "{{.Created}}", image, timeout=30).stdout
        res, recs = self.run_tasks(tasks, os.path.join(d, "two"), "oracle")
        self.assertEqual(recs["built"]["environment"], "cached")
        self.assertEqual(recs["built"]["reward"], 1.0)
        self.assertEqual(bed.docker("image", "inspect", "--format", "{{.Created}}", image, timeout=30).stdout,
                         created)


class TestResumeAndShards(_DockerTasks):
    def test_kill_9_mid_run_then_the_same_command_runs_each_task_once(self):
        d = tempdir(self)
        tasks = os.path.join(d, "tasks")
        for i in range(6):
            hello_task(tasks, "t%d" % i)
        mock = start_mock(self, swe=eh.TaskSet(tasks), swe_policy="oracle", ttft_s=0.5)
        out = os.path.join(d, "run")
        args = [sys.executable, CLI, "run", "--task", "harbor", "--dataset", tasks, "--model", "m", "--base-url",
                mock.url, "--out", out, "--no-progress", "--max-sessions", "2"]
        kill_9_then_resume(self, args, out, 2, ["t%d" % i for i in range(6)], 300)

    def test_shards_of_12_tasks_merge_to_the_single_process_result(self):
        d = tempdir(self)
        tasks = os.path.join(d, "tasks")
        for i in range(12):
            hello_task(tasks, "t%02d" % i, category="odd" if i % 2 else "even")
        mock = start_mock(self, swe=eh.TaskSet(tasks), swe_policy="oracle")
        res, single = self.run_tasks(tasks, os.path.join(d, "single"), mock=mock)
        self.assertEqual(res.returncode, 0, res.stderr)
        sharded = os.path.join(d, "sharded")
        for i in range(2):
            res, _ = self.run_tasks(tasks, sharded, "oracle", "--shard", "%d/2" % i, mock=mock)
            self.assertEqual(res.returncode, 0, res.stderr)
        res = run_cli(["merge", sharded])
        self.assertEqual(res.returncode, 0, res.stderr)
        keep = ("id", "status", "reward", "rewards", "verdict", "category", "score", "exit_reason")
        merged = {r["id"]: {k: r.get(k) for k in keep} for r in read_samples(sharded)}
        self.assertEqual(merged, {k: {f: r.get(f) for f in keep} for k, r in single.items()})
        self.assertEqual(len(merged), 12)
        with open(os.path.join(sharded, "summary.json"), encoding="utf-8") as fh:
            self.assertEqual(json.load(fh)["tasks"]["verdicts"], {"rewarded": 12})
        self.assertEqual(len(os.listdir(os.path.join(sharded, "logs"))), 12)  # each shard's verifier logs


class TestSlots(_DockerTasks):
    def test_an_agent_run_on_llama_cpp_with_3_slots_never_holds_more_than_3_sessions(self):
        """The mock as llama.cpp states total_slots 3 in /props; eight tasks, --max-sessions 8: the sessions'
        spans (entered, left) overlap three deep at most, and do reach three."""
        d = tempdir(self)
        tasks = os.path.join(d, "tasks")
        for i in range(8):
            hello_task(tasks, "t%d" % i)
        mock = start_mock(self, swe=eh.TaskSet(tasks), swe_policy="oracle", server_kind="llama.cpp", slots=3,
                          ttft_s=0.4)
        res, recs = self.run_tasks(tasks, os.path.join(d, "run"), "oracle", "--max-sessions", "8", mock=mock)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("states 3 slot(s) (/props total_slots): at most 3 agent sessions at once", res.stderr)
        spans = [r["session_at"] for r in recs.values()]
        self.assertEqual(len(spans), 8)
        edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
        depth, deepest = 0, 0
        for _, step in edges:
            depth += step
            deepest = max(deepest, depth)
        self.assertEqual(deepest, 3)
        with open(os.path.join(d, "run", "run.json"), encoding="utf-8") as fh:
            self.assertEqual(json.load(fh)["concurrency"]["sessions"], "slots")


class TestSeveralEngines(_DockerTasks):
    def test_a_task_on_a_lost_engine_runs_again_on_the_other(self):
        d = tempdir(self)
        tars = os.path.join(d, "tars")
        os.makedirs(tars)
        res = bed.docker("save", "-o", os.path.join(tars, "base.tar"), BASE, timeout=600)
        self.assertEqual(res.returncode, 0, res.stderr)
        second = bed.NetnsDockerd(self)
        tasks = os.path.join(d, "tasks")
        for i in range(4):
            hello_task(tasks, "t%d" % i, verifier_sleep=3)
        mock = start_mock(self, swe=eh.TaskSet(tasks), swe_policy="oracle", ttft_s=1.0)
        out = os.path.join(d, "run")
        local = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        proc = subprocess.Popen([sys.executable, CLI, "run", "--task", "harbor", "--dataset", tasks, "--model",
                                 "m", "--base-url", mock.url, "--out", out, "--docker-host", local, "--docker-host",
                                 second.host, "--max-containers", "1", "--image-tars", tars, "--tar-index",
                                 os.path.join(d, "idx.json"), "--no-progress"],
                                env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                universal_newlines=True)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        run_id = __import__("hashlib").sha1(os.path.abspath(out).encode()).hexdigest()[:12]

        def ours_there():
            r = bed.docker("ps", "--filter", "label=evalharness.run=%s" % run_id, "--format", "{{.Names}}",
                           host=second.host, timeout=30)
            return r.returncode == 0 and bool(r.stdout.split())
        self.assertTrue(wait_until(ours_there, 300), "no task container on the second engine")
        time.sleep(1.0)
        second.kill()
        _, err = proc.communicate(timeout=600)
        self.assertEqual(proc.returncode, 0, err[-3000:])
        recs = {r["id"]: r for r in read_samples(out)}
        self.assertEqual(sorted(recs), ["t%d" % i for i in range(4)])
        self.assertTrue(all(r["reward"] == 1.0 for r in recs.values()), recs)
        moved = [r for r in recs.values() if r.get("moved_from")]
        self.assertTrue(moved, "no task moved off the killed engine")
        self.assertTrue(all(r["moved_from"] == [second.host] and r["docker_host"] != second.host for r in moved))


if __name__ == "__main__":
    unittest.main()
