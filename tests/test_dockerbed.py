"""Self-tests of tests/dockerbed.py: images, save archives (legacy and OCI), registries, the PUT store, the call log,
the hung port, a dead DOCKER_HOST and a second dockerd. Quick (well under a minute); nothing is left behind."""
import hashlib
import http.client
import json
import os
import socket
import tarfile
import unittest
import urllib.error
import urllib.request
from unittest import mock

from tests import dockerbed as bed
from tests.support import tempdir

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http(method: str, url: str, data: bytes = None):
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with _OPENER.open(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _members(path: str) -> dict:
    """name -> bytes (files) or None (dirs/links) of a tar (any compression)."""
    out = {}
    with tarfile.open(path, "r:*") as tar:
        for m in tar.getmembers():
            assert m.name not in out, "duplicate member %s" % m.name
            out[m.name] = tar.extractfile(m).read() if m.isfile() else None
    return out


class PlainHelpersTest(unittest.TestCase):
    """Helpers that need no Docker daemon."""

    def test_unique_is_a_valid_repository_part(self):
        names = {bed.unique("Evh_Test!") for _ in range(50)}
        self.assertEqual(len(names), 50)
        for name in names:
            self.assertRegex(name, r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")
            self.assertIn("-%d-" % os.getpid(), name)

    def test_full_ref(self):
        self.assertEqual(bed.full_ref("x:1"), "docker.io/library/x:1")
        self.assertEqual(bed.full_ref("evh/x:1"), "docker.io/evh/x:1")
        self.assertEqual(bed.full_ref("127.0.0.1:5000/evh/x:1"), "127.0.0.1:5000/evh/x:1")
        self.assertEqual(bed.full_ref("localhost/x:1"), "localhost/x:1")

    def test_hung_port_accepts_and_never_answers(self):
        host, port = bed.hung_port(self).rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=2) as s:
            s.sendall(b"GET /v2/ HTTP/1.0\r\n\r\n")
            s.settimeout(0.3)
            with self.assertRaises(socket.timeout):
                s.recv(1)

    def test_stdlib_put_store(self):
        url, root = bed.start_stdlib_put_store(self)
        _exercise_put_store(self, url, root, json_listing=False)
        self.assertEqual(_http("PUT", url + "/a/../../escape", b"x")[0], 400)

    def test_dead_docker_host(self):
        host = bed.dead_docker_host(self)
        self.assertTrue(host.startswith("unix:///tmp/"))
        self.assertTrue(os.path.exists(host[len("unix://"):]))
        with mock.patch.dict(os.environ, {"DOCKER_HOST": host}):
            if not bed.shutil.which("docker"):
                bed._unavailable(self, "docker CLI not found")  # a skip, or a failure under REQUIRE_DOCKER=1
            reason = bed.docker_reason()
            self.assertIn("no Docker daemon answers at %s" % host, reason)
            with mock.patch.dict(os.environ, {bed.REQUIRE_ENV: "0"}):
                with self.assertRaises(unittest.SkipTest):
                    bed.require_docker(self)
            with mock.patch.dict(os.environ, {bed.REQUIRE_ENV: "1"}):
                with self.assertRaises(self.failureException) as ctx:
                    bed.require_docker(self)
            self.assertIn("EVALHARNESS_REQUIRE_DOCKER=1 but no Docker daemon answers", str(ctx.exception))


def _exercise_put_store(test, url, root, json_listing):
    data = os.urandom(300 * 1024)
    target = url + "/images/evh/x/demo-1.tar.gz"
    test.assertEqual(_http("PUT", target, data)[0], 201)
    test.assertEqual(_http("PUT", target, data)[0], 204)
    status, body = _http("GET", target)
    test.assertEqual((status, hashlib.sha256(body).hexdigest()), (200, hashlib.sha256(data).hexdigest()))
    with open(os.path.join(root, "images", "evh", "x", "demo-1.tar.gz"), "rb") as fh:
        test.assertEqual(fh.read(), data)
    # a chunked body (what `curl -T -` sends)
    host, port = url[len("http://"):].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("PUT", "/images/evh/x/chunked.tar", body=iter([b"abc", b"def" * 1000]), encode_chunked=True)
    test.assertEqual(conn.getresponse().status, 201)
    conn.close()
    test.assertEqual(_http("GET", url + "/images/evh/x/chunked.tar"), (200, b"abc" + b"def" * 1000))
    status, body = _http("GET", url + "/images/evh/x/")
    test.assertEqual(status, 200)
    if json_listing:
        test.assertEqual(sorted(e["name"] for e in json.loads(body)), ["chunked.tar", "demo-1.tar.gz"])
    test.assertEqual(_http("DELETE", target)[0], 204)
    test.assertEqual(_http("GET", target)[0], 404)


class DockerBedTest(unittest.TestCase):
    """Helpers that need a Docker daemon (skipped without one unless EVALHARNESS_REQUIRE_DOCKER=1)."""

    def setUp(self):
        bed.require_docker(self)

    def ref(self, tag: str = "1") -> str:
        return "evh-test/%s:%s" % (bed.unique("bed"), tag)

    def test_make_image_differs_per_files_and_runs(self):
        a, b = self.ref(), self.ref()
        ida = bed.make_image(self, a, files={"/etc/evh-id": "image a\n"}, size_kb=256)
        idb = bed.make_image(self, b, files={"/etc/evh-id": "image b\n"})
        self.assertTrue(ida.startswith("sha256:"))
        self.assertNotEqual(ida, idb)
        self.assertEqual(bed.image_id(a), ida)
        self.assertTrue(bed.image_exists(b))
        self.assertNotEqual(bed.layers(a), bed.layers(b))
        self.assertEqual(len(bed.layers(a)), 1)
        size_a = int(bed.docker("image", "inspect", "--format", "{{.Size}}", a).stdout)
        size_b = int(bed.docker("image", "inspect", "--format", "{{.Size}}", b).stdout)
        self.assertGreaterEqual(size_a - size_b, 256 * 1024)
        run = bed.docker("run", "--rm", "--network", "none", a, "sh", "-c", "cat /etc/evh-id; ls /bin | wc -l")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stdout.splitlines()[0], "image a")
        bed.rmi(a, "evh-test/absent-%s:1" % bed.unique())
        self.assertFalse(bed.image_exists(a))
        self.assertEqual(bed.image_id(a), "")

    def test_derived_image_shares_the_base_layer(self):
        base, derived = self.ref("base"), self.ref("derived")
        bed.make_image(self, base, files={"/etc/evh-id": "base\n"})
        bed.make_image(self, derived, base=base, files={"/app/run.sh": "#!/bin/sh\necho derived\n"}, size_kb=64)
        base_layers, derived_layers = bed.layers(base), bed.layers(derived)
        self.assertEqual(len(base_layers), 1)
        self.assertEqual(len(derived_layers), 2)
        self.assertEqual(derived_layers[0], base_layers[0])
        cmd = bed.docker("image", "inspect", "--format", "{{json .Config.Cmd}}", derived).stdout.strip()
        self.assertEqual(json.loads(cmd), ["/bin/sh"])
        run = bed.docker("run", "--rm", "--network", "none", derived, "sh", "-c", "cat /etc/evh-id; /app/run.sh")
        self.assertEqual((run.returncode, run.stdout), (0, "base\nderived\n"), run.stderr)

    def _three_images(self):
        base, d1, d2 = self.ref("base"), self.ref("d1"), self.ref("d2")
        bed.make_image(self, base, files={"/etc/evh-id": "base\n"})
        bed.make_image(self, d1, base=base, files={"/etc/evh-id": "d1\n"})
        bed.make_image(self, d2, base=base, files={"/etc/evh-id": "d2\n"})
        return [base, d1, d2]

    def _check_oci(self, path, refs, keep):
        files = _members(path)
        self.assertEqual(json.loads(files["oci-layout"]), {"imageLayoutVersion": "1.0.0"})
        blobs = {n[len("blobs/sha256/"):]: b for n, b in files.items() if n.startswith("blobs/sha256/") and b}
        for hx, data in blobs.items():
            self.assertEqual(hashlib.sha256(data).hexdigest(), hx)
        index = json.loads(files["index.json"])
        self.assertEqual((index["schemaVersion"], index["mediaType"]), (2, bed.MT_INDEX))
        by_name = {d["annotations"][bed.ANN_IMAGE_NAME]: d for d in index["manifests"]}
        self.assertEqual(sorted(by_name), sorted(bed.full_ref(r) for r in refs))
        base_layer = bed.layers(refs[0])[0]
        for ref in refs:
            desc = by_name[bed.full_ref(ref)]
            self.assertEqual(desc["annotations"][bed.ANN_REF_NAME], ref.rsplit(":", 1)[1])
            self.assertEqual(desc["mediaType"], bed.MT_MANIFEST)
            manifest_bytes = blobs[desc["digest"].split(":")[1]]
            self.assertEqual(len(manifest_bytes), desc["size"])
            manifest = json.loads(manifest_bytes)
            self.assertEqual((manifest["schemaVersion"], manifest["mediaType"]), (2, bed.MT_MANIFEST))
            self.assertEqual(manifest["config"]["digest"], bed.image_id(ref))
            self.assertEqual(manifest["config"]["mediaType"], bed.MT_CONFIG)
            config = json.loads(blobs[manifest["config"]["digest"].split(":")[1]])
            digests = [l["digest"] for l in manifest["layers"]]
            self.assertEqual(digests, config["rootfs"]["diff_ids"])
            self.assertEqual(digests, bed.layers(ref))
            self.assertEqual(digests[0], base_layer)
            for l in manifest["layers"]:
                self.assertEqual(l["mediaType"], bed.MT_LAYER)
                self.assertEqual(l["size"], len(blobs[l["digest"].split(":")[1]]))
        # shared base layer stored once: 1 base + 2 derived layers
        layer_blobs = {d for r in refs for d in bed.layers(r)}
        self.assertEqual(len(layer_blobs), 3)
        if keep:
            entries = json.loads(files["manifest.json"])
            self.assertEqual(sorted(t for e in entries for t in e["RepoTags"]), sorted(refs))
            for e in entries:
                for p in [e["Config"]] + e["Layers"]:
                    self.assertTrue(p.startswith("blobs/sha256/") and files.get(p), p)
            self.assertIn("repositories", files)
        else:
            self.assertNotIn("manifest.json", files)
            self.assertNotIn("repositories", files)
            referenced = {desc["digest"] for desc in index["manifests"]}
            for desc in index["manifests"]:
                m = json.loads(blobs[desc["digest"].split(":")[1]])
                referenced |= {m["config"]["digest"]} | {l["digest"] for l in m["layers"]}
            self.assertEqual({"sha256:" + hx for hx in blobs}, referenced)  # nothing unreferenced
        return files

    def test_save_and_legacy_to_oci(self):
        refs = self._three_images()
        d = tempdir(self)
        plain = bed.docker_save(self, os.path.join(d, "batch.tar"), refs)
        gz = bed.docker_save(self, os.path.join(d, "batch.tar.gz"), refs, gzip=True)
        with open(gz, "rb") as fh:
            self.assertEqual(fh.read(2), b"\x1f\x8b")
        legacy = _members(plain)
        with tarfile.open(plain) as tar:  # the shared base layer appears as a symlinked layer.tar: resolution is tested
            self.assertTrue(any(m.issym() and m.name.endswith("/layer.tar") for m in tar.getmembers()))
        self.assertIn("manifest.json", legacy)
        self.assertFalse(any(n.startswith("blobs/") for n in legacy))  # docker 20.10 writes the legacy layout
        self.assertEqual(sorted(t for e in json.loads(legacy["manifest.json"]) for t in e["RepoTags"]), sorted(refs))
        with self.assertRaises(ValueError):
            bed.docker_save(self, os.path.join(d, "x.tar"), refs, gzip=True)

        docker25 = os.path.join(d, "docker25.tar")
        bed.legacy_to_oci(plain, docker25)
        self._check_oci(docker25, refs, keep=True)
        pure = os.path.join(d, "pure.tar.gz")
        bed.legacy_to_oci(gz, pure, keep_manifest_json=False)
        with open(pure, "rb") as fh:
            self.assertEqual(fh.read(2), b"\x1f\x8b")
        self._check_oci(pure, refs, keep=False)
        # saved by ID: no RepoTags, so one index entry without name annotations
        by_id = bed.docker_save(self, os.path.join(d, "by-id.tar"), [bed.image_id(refs[1])])
        bed.legacy_to_oci(by_id, os.path.join(d, "by-id-oci.tar"))
        index = json.loads(_members(os.path.join(d, "by-id-oci.tar"))["index.json"])
        self.assertEqual(len(index["manifests"]), 1)
        self.assertNotIn("annotations", index["manifests"][0])
        again = os.path.join(d, "again.tar.gz")
        bed.legacy_to_oci(gz, again, keep_manifest_json=False)
        with open(pure, "rb") as a, open(again, "rb") as b:
            self.assertEqual(a.read(), b.read())  # deterministic output

    def test_registry_push_pull_and_pull_through_cache(self):
        reg = bed.start_registry(self)
        self.assertEqual(_http("GET", "http://%s/v2/" % reg)[0], 200)
        ref = self.ref()
        ident = bed.make_image(self, ref, files={"/etc/evh-id": "pushed\n"})
        pushed = bed.push_to_registry(ref, reg)
        self.addCleanup(bed.rmi, pushed)
        self.assertEqual(pushed, "%s/%s" % (reg, ref))
        self.assertFalse(bed.image_exists(pushed))  # the registry tag is dropped locally
        self.assertIn(ref.split(":")[0], json.loads(_http("GET", "http://%s/v2/_catalog" % reg)[1])["repositories"])
        bed.rmi(ref)
        self.assertFalse(bed.image_exists(ident))
        pull = bed.docker("pull", "-q", pushed)
        self.assertEqual(pull.returncode, 0, pull.stderr)
        self.assertEqual(bed.image_id(pushed), ident)

        cache = bed.start_registry(self, proxy_of=reg)
        via_cache = "%s/%s" % (cache, ref)
        self.addCleanup(bed.rmi, via_cache)
        pull = bed.docker("pull", "-q", via_cache)
        self.assertEqual(pull.returncode, 0, pull.stderr)
        self.assertEqual(bed.image_id(via_cache), ident)
        missing = bed.docker("pull", "-q", "%s/evh-test/nope:1" % reg)
        self.assertEqual(missing.returncode, 1)
        self.assertIn("manifest unknown", missing.stderr)

    def test_put_store(self):
        url, root = bed.start_put_store(self)
        _exercise_put_store(self, url, root, json_listing=bool(bed.shutil.which("nginx") or
                                                                os.path.exists("/usr/sbin/nginx")))

    def test_docker_call_log(self):
        env, log = bed.docker_call_log(self)
        self.assertEqual(bed.count_calls(log), 0)
        for args in (["version", "--format", "{{.Server.Version}}"], ["image", "inspect", "evh-test/absent:1"]):
            bed.subprocess.run(["docker"] + args, env=env, stdout=bed.subprocess.DEVNULL,
                               stderr=bed.subprocess.DEVNULL, timeout=60)
        self.assertEqual(bed.count_calls(log), 2)
        self.assertEqual(bed.read_calls(log), ["version --format {{.Server.Version}}",
                                               "image inspect evh-test/absent:1"])

    def test_second_dockerd_is_empty_and_loads_a_docker25_archive(self):
        docker0 = os.path.exists("/sys/class/net/docker0")

        def docker0_untouched():  # runs after the daemon's cleanup (registered first)
            self.assertEqual(os.path.exists("/sys/class/net/docker0"), docker0, "the second dockerd changed docker0")
        self.addCleanup(docker0_untouched)
        host = bed.start_second_dockerd(self)
        self.assertEqual(os.path.exists("/sys/class/net/docker0"), docker0)
        self.assertTrue(host.startswith("unix:///tmp/") and len(host) < 108)
        info = bed.docker("info", "--format", "{{json .}}", host=host)
        self.assertEqual(info.returncode, 0, info.stderr)
        self.assertEqual(json.loads(info.stdout)["Images"], 0)
        self.assertEqual(bed.docker("images", "-q", host=host).stdout.strip(), "")
        with mock.patch.dict(os.environ, {"DOCKER_HOST": host}):
            self.assertEqual(bed.docker_reason(), "")
        # Docker 20.10 loads a Docker-25-style archive through its manifest.json
        ref = self.ref()
        ident = bed.make_image(self, ref, files={"/etc/evh-id": "second\n"})
        d = tempdir(self)
        oci = os.path.join(d, "oci.tar")
        bed.legacy_to_oci(bed.docker_save(self, os.path.join(d, "one.tar"), [ref]), oci)
        load = bed.docker("load", "-i", oci, host=host)
        self.assertEqual(load.returncode, 0, load.stderr)
        self.assertEqual(bed.image_id(ref, host=host), ident)
        run = bed.docker("run", "--rm", ref, "cat", "/etc/evh-id", host=host)  # default network: its own bridge
        self.assertEqual((run.returncode, run.stdout), (0, "second\n"), run.stderr)


if __name__ == "__main__":
    unittest.main()
