"""`--engine podman`: image delivery (a podman multi-image archive, a gzip'd store tarball piped in decompressed)
and a SWE instance end to end, on Debian's podman 4.3 as root.

Podman here needs a containers.conf with ulimits no higher than the machine allows (no CAP_SYS_RESOURCE) and the
cgroupfs manager (testbed.md §8); the tests write one and point CONTAINERS_CONF at it.
"""
import fcntl
import io
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from tests import dockerbed as bed
from tests.support import eh, start_mock, tempdir, write_jsonl

CONF = """[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


LOCK = "/tmp/evalharness-test-podman.lock"


def podman(*args, input=None, timeout=300):
    return subprocess.run(["podman"] + list(args), input=input, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout)


class TestPodman(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        if not shutil.which("podman"):
            if os.environ.get(bed.REQUIRE_ENV) == "1":
                raise AssertionError("%s=1 but podman is not installed (Debian package podman)" % bed.REQUIRE_ENV)
            raise unittest.SkipTest("podman is not installed (Debian package podman)")
        # podman as root has one store for the machine: test processes running at the same time (several CI
        # suites) would remove each other's images and see each other's containers, so one holds it at a time
        lock = open(LOCK, "a")
        cls.addClassCleanup(lock.close)
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        cls.dir = tempfile.mkdtemp(prefix="evalharness-podman-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        conf = os.path.join(cls.dir, "containers.conf")
        with open(conf, "w") as fh:
            fh.write(CONF)
        old = os.environ.get("CONTAINERS_CONF")
        os.environ["CONTAINERS_CONF"] = conf
        cls.addClassCleanup(lambda: os.environ.pop("CONTAINERS_CONF") if old is None else
                            os.environ.__setitem__("CONTAINERS_CONF", old))
        cls.u = bed.unique("evhpm")
        cls.refs = ["%s/img:%d" % (cls.u, i) for i in range(2)]
        for i, ref in enumerate(cls.refs):
            buf = io.BytesIO()
            bed._busybox_rootfs_tar(buf, {"/n": "podman %d\n" % i}, 64)
            out = podman("import", "--change", 'CMD ["/bin/sh"]', "-", ref, input=buf.getvalue())
            if out.returncode:
                raise AssertionError("podman import: %s" % out.stderr.decode())
            cls.addClassCleanup(podman, "rmi", "-f", ref)
        cls.ids = {r: eh._full_id(podman("image", "inspect", "--format", "{{.Id}}", r).stdout.decode())
                   for r in cls.refs}
        cls.docker = eh.DockerCLI("podman")

    def _service(self, **kw):
        svc = eh.ImageService(self.docker, index_path=os.path.join(tempdir(self), "index.json"),
                              state_path=os.path.join(tempdir(self), "state.json"), keep_images=True, **kw)
        self.addCleanup(svc.close)
        return svc

    def test_one_image_out_of_a_podman_multi_image_archive(self):
        tars = os.path.join(tempdir(self), "tars")
        os.makedirs(tars)
        out = podman("save", "-m", "-o", os.path.join(tars, "batch.tar"), *self.refs)
        self.assertEqual(out.returncode, 0, out.stderr)
        podman("rmi", "-f", self.refs[1])
        svc = self._service(tar_dirs=[tars])
        svc.register([self.refs[0], self.refs[1]])
        self.assertEqual(svc.status(self.refs[0]).source, "local")  # podman's localhost/ prefix is understood
        st = svc.wait_ready(self.refs[1], 120)
        self.assertTrue(st.source.startswith("tar:"), st)
        self.assertEqual(self.docker.image_id(self.refs[1]), self.ids[self.refs[1]])

    def test_a_gzipped_store_tarball_is_decompressed_for_podman(self):
        store = os.path.join(tempdir(self), "store")
        entry = eh.ImageStore(store).push(self.docker, self.refs[0])
        self.assertEqual(entry["image_id"], self.ids[self.refs[0]])
        podman("rmi", "-f", self.refs[0])
        svc = self._service(store=store)
        svc.register([self.refs[0]])
        self.assertEqual(svc.wait_ready(self.refs[0], 120).source, "store")
        self.assertEqual(self.docker.image_id(self.refs[0]), self.ids[self.refs[0]])

    def test_a_swe_instance_end_to_end_on_podman(self):
        bed.require_docker(self)
        from tests import swebed
        rows = [r for r in swebed.build_task_images(log=lambda *a: None) if r["instance_id"] == "evh__calc-1"]
        image = rows[0]["image"]
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        out = podman("load", input=save.stdout.read(), timeout=600)
        save.wait()
        self.assertEqual(out.returncode, 0, out.stderr)
        self.addCleanup(podman, "rmi", "-f", image)
        d = tempdir(self)
        ds_path = write_jsonl(os.path.join(d, "swe.jsonl"), swebed.instance_rows(rows))
        ds = eh.SWEDataset(ds_path).validate()
        mock = start_mock(self, swe=ds, swe_policy="sleepy")
        cfg = eh.RunConfig(dataset=ds_path, model="m", base_url=mock.url, task="swe", out=os.path.join(d, "run"),
                           progress=False, fixed_concurrency=2,
                           options=eh.SWEOptions(exec_timeout_s=2, eval_timeout_s=120,
                                                 images=eh.ImageOptions(keep=True, engine="podman")))
        code, run_dir = eh.run_swe(cfg, stdout=io.StringIO())
        with open(os.path.join(run_dir, "samples.jsonl")) as fh:
            rec = json.loads(fh.readline())
        self.assertEqual(code, 0, rec)
        self.assertEqual((rec["outcome"], rec["timeouts"]), ("resolved", 1))
        left = podman("ps", "-a", "--filter", "label=evalharness.run", "--format", "{{.Names}}").stdout.decode()
        self.assertEqual(left.strip(), "")


if __name__ == "__main__":
    unittest.main()
