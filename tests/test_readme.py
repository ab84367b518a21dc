"""The README, followed by a newcomer: every shell block marked ```sh runnable runs as written, in README order, in one
temporary directory holding a copy of evalharness.py and build_zipapp.sh (the README's first runnable block builds
dist/evalharness.pyz there with ./build_zipapp.sh; the later ones use it), against the mock servers a runnable
background block starts; each exits with the code its marker states (0 unless `exit=N`). The examples' fixed ports
(8000, 8080) are replaced by free ones: the one change made to a block. A ```sh not-run: REASON block (a real server,
a cluster, Docker images) is not run: its evalharness command lines are parsed with the real command line."""
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import unittest

from tests.support import ROOT, clean_env, eh, tempdir

README = os.path.join(ROOT, "README.md")
FENCE = re.compile(r"^```sh(?P<info>[^\n]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"^ (?:runnable(?P<exit> exit=\d+)?(?P<bg> background)?|not-run: (?P<why>\S.*))$")
PORTS = (8000, 8080)  # the examples' fixed ports, replaced by free ones
PROGRAM = re.compile(r"(?:^|/)evalharness(?:\.pyz|\.py)?$")
SHELL_OPERATORS = {"&&", "||", ";", "|", "&"}


def blocks(text):
    """[(line, info, body)] of every ```sh block of the README, in order."""
    return [(text.count("\n", 0, m.start()) + 1, m.group("info"), m.group("body")) for m in FENCE.finditer(text)]


def command_lines(body):
    """The argument lists of the evalharness commands of a block (continuations joined, comments, redirections and
    command substitutions taken out; a heredoc's text skipped)."""
    body = re.sub(r"<<'?(\w+)'?\n.*?^\1$", "", body, flags=re.M | re.S)
    body = re.sub(r"\\\n", " ", body)
    found = []
    for line in body.splitlines():
        line = re.sub(r"\$\([^)]*\)", "X", line)                 # $(date +%F)
        line = re.sub(r"(?<!\S)\d?>>?\s*\S+", "", line)           # > last.json 2>> eval.log
        words = shlex.shlex(line, posix=True, punctuation_chars=True)
        words.whitespace_split = True
        words.commenters = "#"
        segment = []
        for word in list(words) + [";"]:
            if word in SHELL_OPERATORS:
                at = next((i for i, w in enumerate(segment) if PROGRAM.search(w) and (
                    i == 0 or re.search(r"(^|/)python[\d.]*$", segment[i - 1]))), None)  # run, not copied
                if at is not None:
                    found.append(segment[at + 1:])
                segment = []
            else:
                segment.append(word)
    return found


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def answers(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class TestReadme(unittest.TestCase):

    def setUp(self):
        with open(README, encoding="utf-8") as fh:
            self.blocks = blocks(fh.read())

    def marker(self, line, info):
        m = MARKER.match(info)
        self.assertIsNotNone(m, "README.md:%d: a ```sh block without a marker (runnable [exit=N] [background], or "
                                "not-run: REASON): %r" % (line, info))
        return m

    def test_every_shell_block_is_marked_and_several_run(self):
        marks = [self.marker(line, info) for line, info, _ in self.blocks]
        self.assertGreaterEqual(sum(1 for m in marks if not m.group("why")), 6)
        self.assertTrue(any(m.group("bg") for m in marks))

    def test_blocks_that_are_not_run_use_only_options_the_command_line_has(self):
        parser = eh._build_parser()
        checked = 0
        for line, info, body in self.blocks:
            if not self.marker(line, info).group("why"):
                continue
            for argv in command_lines(body):
                checked += 1
                try:
                    args = parser.parse_args(argv)
                    if args.command == "slurm" and args.action == "submit":
                        # the options after --, parsed as `run` (or `suite`) parses them (not the files they name)
                        eh._slurm_run_args(args.run_args, check=False)
                except SystemExit as exc:
                    self.fail("README.md:%d: %s does not parse (exit %s)" % (line, shlex.join(argv), exc.code))
        self.assertGreaterEqual(checked, 10)

    def test_runnable_blocks_run_as_written_against_the_mock(self):
        work = tempdir(self)
        for name in ("evalharness.py", "build_zipapp.sh"):
            shutil.copy2(os.path.join(ROOT, name), os.path.join(work, name))
        bindir = os.path.join(tempdir(self), "bin")  # python3: the interpreter running this test
        os.makedirs(bindir)
        os.symlink(sys.executable, os.path.join(bindir, "python3"))
        env = clean_env(PATH=bindir + os.pathsep + os.environ.get("PATH", ""), EVALHARNESS_PROGRESS_S="5")
        ports = {p: free_port() for p in PORTS}
        ran = 0
        for line, info, body in self.blocks:
            m = self.marker(line, info)
            if m.group("why"):
                continue
            script = re.sub(r"\b(%s)\b" % "|".join(map(str, PORTS)), lambda g: str(ports[int(g.group(1))]), body)
            ran += 1
            if m.group("bg"):
                proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=work, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
                self.addCleanup(self.stop, proc)
                for port in map(int, re.findall(r"--port (\d+)", script)):
                    deadline = time.monotonic() + 60
                    while not answers(port) and time.monotonic() < deadline:
                        if proc.poll() not in (None, 0):  # (0: bash is done, what it started in the background runs)
                            self.fail("README.md:%d: the background block failed (exit %d)" % (line, proc.poll()))
                        time.sleep(0.1)
                    self.assertTrue(answers(port), "README.md:%d: nothing answers on port %d" % (line, port))
                continue
            res = subprocess.run(["bash", "-e", "-c", script], cwd=work, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
            want = int(m.group("exit").split("=")[1]) if m.group("exit") else 0
            self.assertEqual(res.returncode, want, "README.md:%d: exit %d, the README says %d\n%s\nstdout:\n%s\n"
                             "stderr:\n%s" % (line, res.returncode, want, script, res.stdout[-3000:],
                                              res.stderr[-3000:]))
        self.assertGreaterEqual(ran, 6)
        # what the blocks say they made is there
        for path in ("dist/evalharness.pyz", "qa.jsonl", "mine.jsonl", "runs/qwen/report.html",
                     "runs/local/summary.json"):
            self.assertTrue(os.path.exists(os.path.join(work, path)), path)
        self.assertFalse(os.path.exists(os.path.join(work, "runs", "sharded")))  # slurm submit --dry-run

    @staticmethod
    def stop(proc):
        """End the background block's process group (bash and the servers it started, all started by this test),
        and wait until none of them is left."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                break  # the group is gone
            proc.wait(timeout=20)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    os.killpg(proc.pid, 0)
                except OSError:
                    return
                time.sleep(0.1)


if __name__ == "__main__":
    unittest.main()
