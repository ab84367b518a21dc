"""A real Slurm 22.05 cluster on this host for the tests: munged, slurmctld and two slurmd ("n1", "n2", one CPU
each) as root, under one scratch directory, with no systemd and no file under /etc (the recipe of
shared/facts/scaleout.md section 1). Up in under a second once installed (`apt-get install slurm-wlm`), down in ~2 s.

    with SlurmCluster() as cluster:      # raises unittest.SkipTest when Slurm is not installed (and
        env = cluster.env()              # EVALHARNESS_REQUIRE_SLURM is not 1: then it fails)
        subprocess.run(["sbatch", ...], env=env)
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

REQUIRE_ENV = "EVALHARNESS_REQUIRE_SLURM"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "scontrol")

CONF = """ClusterName=evaltest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.sock
SlurmctldPort={port}
SlurmdPort={dport}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.txt
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
KillWait=5
MinJobAge=600
"""


def missing():
    """The Slurm programs not on PATH (empty when the cluster can run)."""
    return [b for b in BINARIES if shutil.which(b) is None]


class SlurmCluster:
    def __init__(self, nodes=2, port=None):
        self.nodes, self.port = nodes, port  # port: slurmctld's (default: a free one, as are the slurmds')
        self.dir = None
        self.epilog_lines = []

    def __enter__(self):
        gone = missing()
        if gone:
            why = "Slurm is not installed (missing %s; apt-get install slurm-wlm)" % ", ".join(gone)
            if os.environ.get(REQUIRE_ENV) == "1":
                raise AssertionError(why + " and %s=1" % REQUIRE_ENV)
            raise unittest.SkipTest(why)
        if os.geteuid() != 0:
            why = "the Slurm test cluster runs its daemons as root (this is uid %d)" % os.geteuid()
            if os.environ.get(REQUIRE_ENV) == "1":
                raise AssertionError(why + " and %s=1" % REQUIRE_ENV)
            raise unittest.SkipTest(why)
        self.dir = tempfile.mkdtemp(prefix="evalharness-slurm-")
        os.chmod(self.dir, 0o755)  # munged refuses a socket under a directory without o+x
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def env(self, **extra):
        env = dict(os.environ, SLURM_CONF=os.path.join(self.dir, "slurm.conf"))
        env.update(extra)
        return env

    def _start(self):
        d = self.dir
        for sub in ("munge", "state", "spool", "log", "out"):
            os.makedirs(os.path.join(d, sub))
        os.chmod(os.path.join(d, "munge"), 0o755)
        key = os.path.join(d, "munge", "munge.key")
        with open(key, "wb") as fh:
            fh.write(os.urandom(128))
        os.chmod(key, 0o400)
        subprocess.run(["munged", "--socket=%s/munge/munge.sock" % d, "--key-file=%s" % key,
                        "--pid-file=%s/munge/munged.pid" % d, "--log-file=%s/munge/munged.log" % d,
                        "--seed-file=%s/munge/munged.seed" % d], check=True, timeout=30)
        # free ports, so clusters of test processes running at the same time (tests/run.py -j, several CI suites)
        # do not meet; a port taken between this choice and the daemon's bind fails the start with its log
        ports = _free_ports(self.nodes + 2) if self.port is None else list(range(self.port, self.port + self.nodes + 2))
        conf = CONF.format(d=d, port=ports[0], dport=ports[1])
        for i in range(1, self.nodes + 1):
            conf += ("NodeName=n%d NodeHostname=localhost NodeAddr=127.0.0.1 Port=%d CPUs=1 RealMemory=1000 "
                     "State=UNKNOWN\n" % (i, ports[1 + i]))
        conf += "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        conf += "".join(self.epilog_lines)
        with open(os.path.join(d, "slurm.conf"), "w") as fh:
            fh.write(conf)
        env = self.env()
        subprocess.run(["slurmctld"], check=True, env=env, timeout=30)
        for i in range(1, self.nodes + 1):
            subprocess.run(["slurmd", "-N", "n%d" % i], check=True, env=env, timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            res = subprocess.run(["sinfo", "-h", "-o", "%t %D"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 universal_newlines=True, env=env, timeout=10)
            if res.stdout.strip() == "idle %d" % self.nodes:
                return
            time.sleep(0.1)
        raise AssertionError("slurm not idle after 20 s: %s" % self.log_tail())

    def log_tail(self, n=20):
        out = []
        for name in sorted(os.listdir(os.path.join(self.dir, "log"))):
            with open(os.path.join(self.dir, "log", name), errors="replace") as fh:
                out.append("%s:\n%s" % (name, "".join(fh.readlines()[-n:])))
        return "\n".join(out)

    def _pids(self):
        pids = []
        names = [n for n in os.listdir(self.dir) if n.endswith(".pid")] + ["munge/munged.pid"]
        for name in names:
            try:
                with open(os.path.join(self.dir, name)) as fh:
                    pids.append(int(fh.read().strip()))
            except (OSError, ValueError):
                pass
        return pids

    def __exit__(self, *exc):
        if self.dir is None:
            return
        pids = self._pids()
        for pid in pids:  # all at once: one after another takes ~2 s each
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            time.sleep(0.1)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None


def _free_ports(n):
    """n distinct loopback ports nothing listens on now (bound together, then closed)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie of ours is gone for this purpose
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
