"""Images: DockerCLI, the tar index, single-image extraction, the image store, the mirror chain and ImageService,
against a real dockerd (tests/dockerbed.py: busybox images, docker save batches, docker-registry, nginx WebDAV,
a second isolated dockerd for loads into an empty store)."""
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import time
import unittest

from tests import dockerbed as bed
from tests.support import CLI, ROOT, ClassCtx, clean_env, dead_port, eh, tempdir, write_jsonl




def _run_py(code: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a Python snippet (with evalharness importable) in a fresh process."""
    prog = "import sys; sys.path.insert(0, %r)\nimport evalharness as eh\n" % ROOT + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", prog], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=timeout)


class TestRefsAndNames(unittest.TestCase):
    """Pure functions: no daemon needed."""

    def test_normalize_ref_when_spelled_differently(self):
        for given, want in [("x", "x:latest"), ("docker.io/library/x:1", "x:1"), ("localhost/a/b:2", "a/b:2"),
                            ("127.0.0.1:5000/a/b", "127.0.0.1:5000/a/b:latest"), ("a/b@sha256:ab", "a/b@sha256:ab"),
                            ("docker.io/swebench/x:latest", "swebench/x:latest")]:
            self.assertEqual(eh._normalize_ref(given), want, given)

    def test_strip_registry_keeps_the_repository_path(self):
        self.assertEqual(eh._strip_registry("127.0.0.1:5000/a/b:1"), "a/b:1")
        self.assertEqual(eh._strip_registry("ghcr.io/epoch/x:2"), "epoch/x:2")
        self.assertEqual(eh._strip_registry("swebench/x:1"), "swebench/x:1")

    def test_swe_image_name_follows_the_hub_scheme(self):
        self.assertEqual(eh.swe_image_name("django__django-11099"),
                         "swebench/sweb.eval.x86_64.django_1776_django-11099:latest")
        self.assertEqual(eh.swe_image_name("Astropy__astropy-1", "sweb.eval.x86_64.{id}:v1"),
                         "sweb.eval.x86_64.astropy__astropy-1:v1")
        with self.assertRaises(eh.ConfigError):
            eh.swe_image_name("a__b-1", "x/{nope}")

    def test_dataset_images_name_the_line_of_a_row_without_image_or_id(self):
        d = tempdir(self)
        path = write_jsonl(os.path.join(d, "ds.jsonl"), [{"instance_id": "a__b-1"}, {"image": "x:1"},
                                                          {"instance_id": "a__b-1"}])
        self.assertEqual(eh.dataset_images(path), ["swebench/sweb.eval.x86_64.a_1776_b-1:latest", "x:1"])
        write_jsonl(path, [{"image": "x:1"}, {"problem": "no id"}])
        with self.assertRaisesRegex(eh.DatasetError, r"ds\.jsonl:2: .*'image' or 'instance_id'"):
            eh.dataset_images(path)

    def test_engine_option_rejects_unknown_engines(self):
        with self.assertRaisesRegex(eh.ConfigError, "docker or podman"):
            eh.DockerCLI("containerd")

    def test_missing_engine_binary_is_a_clear_error(self):
        cli = eh.DockerCLI(binary="/nonexistent/docker-xyz")
        with self.assertRaisesRegex(eh.DockerError, "command not found"):
            cli.list_images()

    def test_tar_index_skips_unreadable_archives_with_a_reason(self):
        d = tempdir(self)
        with open(os.path.join(d, "junk.tar.gz"), "wb") as fh:
            fh.write(b"not gzip at all")
        index = eh.TarIndex([d], os.path.join(d, "index.json"))
        stats = index.refresh()
        self.assertEqual((stats["scanned"], stats["failed"], stats["images"]), (1, 1, 0))
        self.assertIn("not a readable tar archive", index.archives()[os.path.join(d, "junk.tar.gz")]["error"])

    def test_kept_images_are_said_to_be_kept_for_the_reason_that_holds(self):
        for keep, reason, env, want in ((True, "images pull keeps what it delivers", {}, "images pull keeps what it "
                                         "delivers"), (True, "", {}, "--keep-images"),
                                        (None, "", {"EVALHARNESS_KEEP_SWE_IMAGES": "1"},
                                         "EVALHARNESS_KEEP_SWE_IMAGES is set")):
            d = tempdir(self)
            res = _run_py("""
                import logging, sys
                logging.basicConfig(stream=sys.stdout, format="%%(message)s", level=logging.INFO)
                service = eh.ImageService(eh.DockerCLI(binary="/nonexistent/docker"), keep_images=%r,
                                          keep_reason=%r, state_path=%r)
                entry = eh._ImageEntry("x/y:1")
                entry.ours = True
                service._entries["x/y:1"] = entry
                service.release()
                """ % (keep, reason, os.path.join(d, "state.json")), clean_env(**env))
            self.assertEqual(res.returncode, 0, res.stderr)
            self.assertIn("keeping 1 image(s) this process loaded (%s); `evalharness images release` removes them "
                          "later" % want, res.stdout)
            if keep is not None:
                self.assertNotIn("EVALHARNESS_KEEP_SWE_IMAGES", res.stdout)

    def test_release_with_nothing_kept_does_not_explain_the_kept(self):
        d = tempdir(self)
        res = subprocess.run([sys.executable, CLI, "images", "release", "--engine", "docker"],
                             env=clean_env(EVALHARNESS_IMAGE_STATE=os.path.join(d, "state.json"),
                                           PATH="/nonexistent"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(res.stdout, "0 removed, 0 kept, 0 failed\n")

    def test_tar_index_rejects_a_missing_directory(self):
        with self.assertRaisesRegex(eh.ConfigError, "--image-tars: .*nope.* is not a directory"):
            eh.TarIndex(["/nonexistent/nope"]).refresh()


class _Fixture(unittest.TestCase):
    """Ten distinct one-layer images plus a base with two derived images (shared layer), saved as batches."""

    @classmethod
    def setUpClass(cls):
        ctx = ClassCtx(cls)
        bed.require_docker(ctx)
        cls.u = bed.unique("evh")
        cls.dir = tempdir(ctx)
        cls.refs = ["%s/img:%d" % (cls.u, i) for i in range(10)]
        cls.ids = {}
        for i, ref in enumerate(cls.refs):
            cls.ids[ref] = bed.make_image(ctx, ref, files={"/n": "image %d\n" % i}, size_kb=64 * (i + 1))
        cls.base = "%s/base:1" % cls.u
        cls.ids[cls.base] = bed.make_image(ctx, cls.base, files={"/base": "b\n"}, size_kb=512)
        cls.derived = ["%s/derived:%d" % (cls.u, i) for i in (1, 2)]
        for i, ref in enumerate(cls.derived):
            cls.ids[ref] = bed.make_image(ctx, ref, base=cls.base, files={"/d": "derived %d\n" % i})
        # the base's layer again under another config: docker save stores its second copy as a symlink
        cls.twin = "%s/twin:1" % cls.u
        cls.ids[cls.twin] = bed.make_image(ctx, cls.twin, files={"/base": "b\n"}, size_kb=0, cmd='["/bin/true"]')
        cls.tars = os.path.join(cls.dir, "tars")
        os.makedirs(cls.tars)
        cls.batch = bed.docker_save(ctx, os.path.join(cls.tars, "batch10.tar"), cls.refs)
        cls.shared = bed.docker_save(ctx, os.path.join(cls.tars, "shared.tar.gz"), [cls.base, cls.twin] + cls.derived,
                                     gzip=True)
        cls.index_path = os.path.join(cls.dir, "index.json")


class TestTarIndexAndExtraction(_Fixture):

    def test_index_lists_every_image_and_a_second_process_rescans_nothing(self):
        index = eh.TarIndex([self.tars], self.index_path + ".a")
        first = index.refresh()
        self.assertEqual((first["archives"], first["scanned"], first["images"]), (2, 2, 14))
        for ref in self.refs + [self.base, self.twin] + self.derived:
            self.assertEqual(index.lookup(ref)["image_id"], self.ids[ref], ref)
        out = _run_py("""
            index = eh.TarIndex([%r], %r)
            print(index.refresh()["scanned"], index.lookup(%r)["archive"])
        """ % (self.tars, self.index_path + ".a", self.refs[3]), clean_env())
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), ["0", self.batch])
        # touching one archive rescans that one only
        st = os.stat(self.shared)
        os.utime(self.shared, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
        again = eh.TarIndex([self.tars], self.index_path + ".a").refresh()
        self.assertEqual((again["scanned"], again["reused"], again["images"]), (1, 1, 14))

    def test_two_processes_indexing_at_once_lose_nothing(self):
        path = self.index_path + ".b"
        d1, d2 = os.path.join(self.dir, "only-batch"), os.path.join(self.dir, "only-shared")
        for d, src in ((d1, self.batch), (d2, self.shared)):
            os.makedirs(d, exist_ok=True)
            dst = os.path.join(d, os.path.basename(src))
            if not os.path.exists(dst):
                os.link(src, dst)
        code = "print(eh.TarIndex([%r], %r).refresh()['images'])"
        procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, %r)\nimport evalharness as "
                                   "eh\n" % ROOT + code % (d, path)], stdout=subprocess.PIPE, universal_newlines=True,
                                  env=clean_env()) for d in (d1, d2)]
        outs = [p.communicate(timeout=120)[0].strip() for p in procs]
        self.assertEqual(outs, ["10", "4"])
        with open(path) as fh:
            cached = json.load(fh)["archives"]
        self.assertEqual(sorted(cached), sorted([os.path.join(d1, "batch10.tar"), os.path.join(d2, "shared.tar.gz")]))

    def test_extracted_stream_holds_one_image_and_the_layers_its_links_point_to(self):
        index = eh.TarIndex([self.tars], self.index_path + ".c")
        index.refresh()
        for ref in self.derived + [self.twin, self.base, self.refs[4]]:
            entry = index.lookup(ref)
            buf = io.BytesIO()
            written = eh.stream_image_from_archive(entry, ref, buf)
            self.assertEqual(written, len(buf.getvalue()))
            buf.seek(0)
            with tarfile.open(fileobj=buf) as tf:
                names = {m.name: m for m in tf.getmembers()}
                manifest = json.load(tf.extractfile("manifest.json"))
            self.assertEqual([m["RepoTags"] for m in manifest], [[ref]])
            for layer in manifest[0]["Layers"]:
                target = layer
                while names[target].issym():  # every link's target travels with it
                    target = os.path.normpath(os.path.join(os.path.dirname(target), names[target].linkname))
                self.assertTrue(names[target].isfile(), (ref, layer, target))
            self.assertLessEqual(written, 1.2 * entry["image_bytes"] + 64 * 1024, ref)


class TestLoadsIntoAnEmptyDaemon(_Fixture):
    """Loads go into a second, isolated dockerd with an empty store, so nothing is skipped because it exists."""

    def setUp(self):
        self.host = bed.start_second_dockerd(self)
        self.docker = eh.DockerCLI(host=self.host)

    def _service(self, **kw):
        kw.setdefault("index_path", self.index_path + ".load")
        kw.setdefault("state_path", os.path.join(tempdir(self), "state.json"))
        svc = eh.ImageService(self.docker, **kw)
        self.addCleanup(svc.close)
        return svc

    def test_one_image_from_a_ten_image_batch_loads_alone_with_its_original_id(self):
        ref = self.refs[6]
        svc = self._service(tar_dirs=[self.batch], keep_images=True)
        svc.register([ref])
        status = svc.wait_ready(ref, timeout_s=120)
        self.assertEqual(status.source, "tar:" + self.batch)
        self.assertEqual(self.docker.list_images(), {ref: self.ids[ref]})
        index = eh.TarIndex([self.batch], self.index_path + ".load")
        index.refresh()
        own = index.lookup(ref)
        self.assertLessEqual(status.bytes, 1.2 * own["image_bytes"])
        self.assertLess(status.bytes, os.path.getsize(self.batch) / 3)

    def test_an_image_whose_layer_is_a_link_in_the_batch_loads_into_an_empty_store(self):
        with tarfile.open(self.shared) as tf:
            links = [m.name for m in tf.getmembers() if m.issym() or m.islnk()]
        self.assertTrue(links, "the fixture must hold a layer stored as a link")
        index = eh.TarIndex([self.shared], self.index_path + ".link")
        index.refresh()
        linked = [r for r in [self.base, self.twin] + self.derived if set(index.lookup(r)["layers"]) & set(links)]
        self.assertTrue(linked, (links, "no image lists the link"))
        svc = self._service(tar_dirs=[self.shared], keep_images=True)
        svc.register(linked[:1])  # alone, into a store that lacks the layer the link points to
        self.assertEqual(svc.wait_ready(linked[0], timeout_s=120).state, "ready")
        self.assertEqual(self.docker.list_images(), {linked[0]: self.ids[linked[0]]})
        out = self.docker.text(["run", "--rm", "--network", "none", linked[0], "cat", "/base"])
        self.assertEqual(out, "b\n")  # the linked layer's content arrived

    def test_oci_layout_archives_load_with_and_without_a_docker_manifest(self):
        oci_dir = os.path.join(tempdir(self), "oci")
        os.makedirs(oci_dir)
        bed.legacy_to_oci(self.shared, os.path.join(oci_dir, "docker25.tar"), keep_manifest_json=True)
        bed.legacy_to_oci(self.batch, os.path.join(oci_dir, "pure.tar.gz"), keep_manifest_json=False)
        index = eh.TarIndex([oci_dir], self.index_path + ".oci")
        index.refresh()
        self.assertEqual(index.lookup(self.derived[0])["layout"], "oci")
        self.assertEqual(index.lookup(self.refs[2])["layout"], "oci")
        svc = self._service(tar_dirs=[oci_dir], index_path=self.index_path + ".oci", keep_images=True)
        svc.register([self.derived[0], self.refs[2]])
        for ref in (self.derived[0], self.refs[2]):
            status = svc.wait_ready(ref, timeout_s=120)
            self.assertTrue(status.source.startswith("tar:" + oci_dir), status)
            self.assertEqual(self.docker.image_id(ref), self.ids[ref])

    def test_store_round_trip_and_a_corrupt_tarball_is_refused(self):
        store_dir = os.path.join(tempdir(self), "store")
        store = eh.ImageStore(store_dir)
        main = eh.DockerCLI()
        entry = store.push(main, self.refs[1])
        self.assertEqual(entry["image_id"], self.ids[self.refs[1]])
        store.push(main, self.refs[2])
        svc = self._service(store=store_dir)
        svc.register([self.refs[1]])
        self.assertEqual(svc.wait_ready(self.refs[1], 120).source, "store")
        self.assertEqual(self.docker.image_id(self.refs[1]), self.ids[self.refs[1]])
        # corrupt one byte of the other tarball inside the store
        path = os.path.join(store_dir, *store.read_index()[self.refs[2]]["file"].split("/"))
        with open(path, "r+b") as fh:
            fh.seek(100)
            byte = fh.read(1)
            fh.seek(100)
            fh.write(bytes([byte[0] ^ 0xFF]))
        svc.register([self.refs[2]])
        with self.assertRaisesRegex(eh.ImageError, "sha256 mismatch"):
            svc.wait_ready(self.refs[2], 120)
        self.assertIsNone(self.docker.image_id(self.refs[2]))

    def test_http_store_push_verifies_the_round_trip_and_delivers(self):
        url, root = bed.start_put_store(self)
        store = eh.ImageStore(url + "/swe")
        entry = store.push(eh.DockerCLI(), self.refs[3])
        self.assertTrue(os.path.exists(os.path.join(root, "swe", *entry["file"].split("/"))))
        with open(os.path.join(root, "swe", "index.json")) as fh:
            self.assertEqual(json.load(fh)["images"][self.refs[3]]["sha256"], entry["sha256"])
        svc = self._service(store=url + "/swe")
        svc.register([self.refs[3]])
        self.assertEqual(svc.wait_ready(self.refs[3], 120).source, "store")
        self.assertEqual(self.docker.image_id(self.refs[3]), self.ids[self.refs[3]])

    def test_mirror_chain_skips_a_dead_mirror_and_tags_the_canonical_name(self):
        registry = bed.start_registry(self)
        bed.push_to_registry(self.refs[5], registry)
        dead = "127.0.0.1:%d" % dead_port()
        events = []
        svc = self._service(mirrors=[dead, registry], on_event=lambda kind, **f: events.append((kind, f)))
        svc.register([self.refs[5]])
        status = svc.wait_ready(self.refs[5], 120)
        self.assertEqual(status.source, "mirror:" + registry)
        self.assertEqual(self.docker.list_images(), {self.refs[5]: self.ids[self.refs[5]]})  # mirror tag dropped
        self.assertIn(("image_ready", {"image": self.refs[5], "source": "mirror:" + registry,
                                       "seconds": status.seconds, "bytes": None}), events)

    def test_all_mirrors_down_names_every_failure(self):
        dead = "127.0.0.1:%d" % dead_port()
        hung = bed.hung_port(self)
        registry = bed.start_registry(self)  # up, but without the image
        svc = self._service(mirrors=[dead, hung, registry], mirror_timeout_s=3)
        svc.register([self.refs[7]])
        t0 = time.monotonic()
        with self.assertRaises(eh.ImageError) as cm:
            svc.wait_ready(self.refs[7], 120)
        msg = str(cm.exception)
        self.assertLess(time.monotonic() - t0, 60)
        self.assertIn("mirror:%s: " % dead, msg)
        self.assertIn("connection refused", msg)
        self.assertIn("mirror:%s: " % hung, msg)
        self.assertIn("timed out after 3 s", msg)
        self.assertIn("mirror:%s: " % registry, msg)
        self.assertIn("not found", msg)

    def test_wait_ready_blocks_on_a_slow_load_and_times_out_at_its_limit(self):
        """The delivery is slowed on purpose by a docker wrapper that sleeps before `load`."""
        wrapper = os.path.join(tempdir(self), "slow-docker")
        with open(wrapper, "w") as fh:
            fh.write('#!/bin/sh\nfor a in "$@"; do [ "$a" = load ] && sleep 3; done\nexec docker "$@"\n')
        os.chmod(wrapper, 0o755)
        svc = self._service(tar_dirs=[self.batch], keep_images=True)
        svc.docker = eh.DockerCLI(host=self.host, binary=wrapper)
        svc.register([self.refs[8]])
        with self.assertRaisesRegex(eh.ImageError, r"not ready after 1 s \(still delivering\)"):
            svc.wait_ready(self.refs[8], timeout_s=1)
        t0 = time.monotonic()
        status = svc.wait_ready(self.refs[8], timeout_s=60)
        self.assertEqual(status.state, "ready")
        self.assertGreater(time.monotonic() - t0, 0.5)  # it really waited for the load


class TestServiceOnTheMainDaemon(_Fixture):

    def test_registering_present_images_costs_one_call_then_none(self):
        """Counting every docker invocation with a wrapper first on PATH."""
        tags = ["%s/present:%d" % (self.u, i) for i in range(100)]
        for t in tags:
            bed.docker("tag", self.refs[0], t)
        self.addCleanup(bed.rmi, *tags)
        env, log = bed.docker_call_log(self)
        out = _run_py("""
            import json
            log = %r
            def calls():
                return sum(1 for _ in open(log))
            svc = eh.ImageService(eh.DockerCLI(), state_path=log + ".state")
            svc.register(%r)
            first = calls()
            svc.register(%r)
            second = calls() - first
            states = sorted({(s.state, s.source) for s in svc.statuses()})
            print(json.dumps([first, second, states]))
        """ % (log, tags, list(reversed(tags))), env)
        self.assertEqual(out.returncode, 0, out.stderr)
        first, second, states = json.loads(out.stdout)
        self.assertLessEqual(first, 1, bed.read_calls(log))
        self.assertEqual(second, 0)
        self.assertEqual(states, [["ready", "local"]])

    def test_an_unreachable_daemon_makes_register_and_wait_ready_return_at_once(self):
        dead = bed.dead_docker_host(self)
        svc = eh.ImageService(eh.DockerCLI(host=dead), tar_dirs=[self.batch], index_path=self.index_path + ".d",
                              state_path=os.path.join(tempdir(self), "s.json"))
        self.addCleanup(svc.close)
        t0 = time.monotonic()
        svc.register(self.refs[:3])
        status = svc.wait_ready(self.refs[0], timeout_s=5)
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual((status.state, status.source), ("ready", "optimistic"))

    def test_exit_removes_exactly_the_images_this_process_loaded(self):
        loaded, present = self.refs[9], self.refs[0]
        for keep in ("", "1"):
            bed.rmi(loaded)
            self.assertFalse(bed.image_exists(loaded))
            state = os.path.join(tempdir(self), "state.json")
            env = clean_env(EVALHARNESS_KEEP_SWE_IMAGES=keep, EVALHARNESS_IMAGE_STATE=state)
            out = _run_py("""
                svc = eh.ImageService(tar_dirs=[%r], index_path=%r)
                svc.register([%r, %r])
                print(svc.wait_ready(%r, 120).source, svc.status(%r).source)
                # no close(): the atexit hook must release
            """ % (self.batch, self.index_path + ".e", loaded, present, loaded, present), env)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout.split(), ["tar:" + self.batch, "local"])
            self.assertTrue(bed.image_exists(present), "an image present before the run must survive")
            self.assertEqual(bed.image_exists(loaded), bool(keep), "keep=%r" % keep)
            if keep:  # kept images are listed in the state file and `images release` removes them later
                rel = subprocess.run([sys.executable, CLI, "images", "release"], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
                self.assertEqual(rel.returncode, 0, rel.stderr)
                self.assertIn("removed " + loaded, rel.stdout)
                self.assertFalse(bed.image_exists(loaded))
                self.assertTrue(bed.image_exists(present))

    def test_a_container_gone_between_the_listing_and_its_inspection_uses_nothing(self):
        """The race a CI run met in `images release`: the running containers were listed, one of them (another
        test's) was removed before `docker inspect` read it, and the inspection's "No such object" failed the
        command. Made for real and made certain: a container is started and removed, and the listing replays its
        id to the real daemon through a wrapper that answers `ps -q` alone (every other call is docker's own)."""
        gone = bed.docker("run", "-d", "--network", "none", self.refs[1], "sleep", "300").stdout.strip()
        live = bed.docker("run", "-d", "--network", "none", self.refs[2], "sleep", "300").stdout.strip()
        self.addCleanup(bed.docker, "rm", "-f", live)
        bed.docker("rm", "-f", gone)
        wrapper = os.path.join(tempdir(self), "docker")
        with open(wrapper, "w") as fh:
            fh.write('#!/bin/sh\nif [ "$1" = ps ]; then printf "%s\\n%s\\n"; exit 0; fi\nexec docker "$@"\n'
                     % (gone[:12], live[:12]))
        os.chmod(wrapper, 0o755)
        self.assertEqual(eh._running_image_ids(eh.DockerCLI(binary=wrapper)), {eh._full_id(self.ids[self.refs[2]])})
        with open(wrapper, "w") as fh:  # any other failure of the inspection still stops it
            fh.write('#!/bin/sh\nif [ "$1" = ps ]; then echo %s; exit 0; fi\necho "permission denied" >&2; exit 1\n'
                     % live[:12])
        with self.assertRaises(eh.DockerError):
            eh._running_image_ids(eh.DockerCLI(binary=wrapper))

    def test_release_leaves_what_a_live_process_uses_or_a_running_container_runs(self):
        """Issue 49 (13): one process loads an image and exits (keeping it); a second, still running, found it
        present and uses it: `images release` keeps it, naming that process and its run; once the second has
        exited it goes. An image a running container uses is kept even with --all."""
        used, boxed = self.refs[8], self.refs[7]
        state = os.path.join(tempdir(self), "state.json")
        env = clean_env(EVALHARNESS_KEEP_SWE_IMAGES="1", EVALHARNESS_IMAGE_STATE=state)
        for ref in (used, boxed):
            bed.rmi(ref)
            out = _run_py("""
                svc = eh.ImageService(tar_dirs=[%r], index_path=%r)
                print(svc.wait_ready(%r, 120).source)
                svc.close()
            """ % (self.batch, self.index_path + ".r", ref), env)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout.split(), ["tar:" + self.batch])  # loaded, kept: its loader has exited
        run_dir = os.path.join(tempdir(self), "later-run")
        second = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, %r)\nimport evalharness "
                                   "as eh\nsvc = eh.ImageService(run_dir=%r)\nsvc.register([%r])\nprint("
                                   "svc.wait_ready(%r, 60).source, flush=True)\nsys.stdin.readline()\nsvc.close()"
                                   % (ROOT, run_dir, used, used)], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, universal_newlines=True)
        self.addCleanup(lambda: second.poll() is None and second.kill())
        self.assertEqual(second.stdout.readline().split(), ["local"])  # it found the image present and uses it
        box = bed.docker("run", "-d", "--network", "none", boxed, "sleep", "300").stdout.strip()
        self.addCleanup(bed.docker, "rm", "-f", box)

        def release(*extra):
            res = subprocess.run([sys.executable, CLI, "images", "release"] + list(extra), env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
            self.assertEqual(res.returncode, 0, res.stderr)
            return res.stdout

        out = release()
        self.assertIn("kept %s: used by process %d (run %s), still running" % (used, second.pid, run_dir), out)
        self.assertIn("kept %s: a running container uses it" % boxed, out)
        self.assertTrue(bed.image_exists(used) and bed.image_exists(boxed))
        second.stdin.write("\n")
        second.stdin.flush()
        self.assertEqual(second.wait(60), 0)
        out = release()
        self.assertIn("removed " + used, out)
        self.assertFalse(bed.image_exists(used))
        self.assertIn("kept %s: a running container uses it" % boxed, release("--all"))  # never that one
        bed.docker("rm", "-f", box)
        self.assertIn("removed " + boxed, release())
        self.assertFalse(bed.image_exists(boxed))
        with open(state) as fh:
            self.assertEqual(json.load(fh)["images"], {})

    def test_cli_index_push_pull_and_load_with_progress_lines(self):
        d = tempdir(self)
        url, _root = bed.start_put_store(self)
        env = clean_env(EVALHARNESS_TAR_INDEX=os.path.join(d, "index.json"),
                        EVALHARNESS_IMAGE_STATE=os.path.join(d, "state.json"), EVALHARNESS_PROGRESS_S="0.2")

        def cli(*argv):
            return subprocess.run([sys.executable, CLI, "images"] + list(argv), env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, universal_newlines=True, timeout=300)

        out = cli("index", self.tars)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"2 archive\(s\): 2 scanned, 0 unchanged; 14 image\(s\)")
        self.assertRegex(cli("index", self.tars).stdout, r"0 scanned, 2 unchanged")
        pushed = cli("push", "--image-store", url + "/s", self.refs[1], self.refs[2])
        self.assertEqual(pushed.returncode, 0, pushed.stderr)
        self.assertEqual(len(re.findall(r"^pushed \d/2 .*verified", pushed.stdout, re.M)), 2)
        bed.rmi(self.refs[1], self.refs[2], self.refs[3])
        pulled = cli("pull", "--image-store", url + "/s", self.refs[1], self.refs[2])
        self.assertEqual(pulled.returncode, 0, pulled.stderr)
        self.assertEqual({self.refs[1], self.refs[2]}, {line.split()[0] for line in pulled.stdout.splitlines()
                                                        if " ready " in line})
        self.assertEqual(bed.image_id(self.refs[1]), self.ids[self.refs[1]])  # kept: a pull is a pre-warm
        self.assertIn("keeping 2 image(s) this process loaded (images pull keeps what it delivers)", pulled.stderr)
        self.assertNotIn("EVALHARNESS_KEEP_SWE_IMAGES", pulled.stderr)  # (not set)
        loaded = cli("load", "--image-tars", self.tars, self.refs[3])
        self.assertEqual(loaded.returncode, 0, loaded.stderr)
        self.assertRegex(loaded.stderr, r"images \d/1 ready")  # plain progress lines when not on a terminal
        self.assertEqual(bed.image_id(self.refs[3]), self.ids[self.refs[3]])
        missing = cli("load", "%s/nowhere:1" % self.u, "--no-progress")
        self.assertEqual(missing.returncode, 1)
        self.assertIn("FAILED image %s/nowhere:1 is not local and no source has it" % self.u, missing.stdout)

    def test_plan_names_the_source_of_every_image_and_the_bytes_needed(self):
        d = tempdir(self)
        store_dir = os.path.join(d, "store")
        stored = self.derived[0]  # in the store, not in the batch given to the plan
        eh.ImageStore(store_dir).push(eh.DockerCLI(), stored)
        bed.rmi(stored, self.refs[4])
        missing = "%s/nowhere:1" % self.u
        ds = write_jsonl(os.path.join(d, "ds.jsonl"), [{"instance_id": "x__y-%d" % i, "image": img} for i, img in
                                                       enumerate([self.refs[0], self.refs[4], stored, missing])])
        out = subprocess.run([sys.executable, CLI, "images", "plan", "--dataset", ds, "--image-tars", self.batch,
                              "--tar-index", self.index_path + ".p", "--image-store", store_dir, "--json"],
                             env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, timeout=60)
        self.assertEqual(out.returncode, 1, out.stderr)  # something is missing
        plan = {row["image"]: row for row in json.loads(out.stdout)["images"]}
        self.assertEqual(plan[self.refs[0]]["source"], "present")
        self.assertEqual(plan[self.refs[4]]["source"], "tar " + self.batch)
        self.assertTrue(plan[stored]["source"].startswith("store images/"), plan[stored])
        self.assertEqual(plan[missing]["source"], "missing")
        index = eh.TarIndex([self.batch], self.index_path + ".p")
        index.refresh()
        self.assertEqual(plan[self.refs[4]]["bytes"], index.lookup(self.refs[4])["image_bytes"])
        self.assertEqual(json.loads(out.stdout)["bytes_needed"],
                         plan[self.refs[4]]["bytes"] + plan[stored]["bytes"])
        text = subprocess.run([sys.executable, CLI, "images", "plan", "--dataset", ds, "--image-tars", self.batch,
                               "--tar-index", self.index_path + ".p", "--image-store", store_dir],
                              env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=60).stdout
        self.assertRegex(text, r"4 image\(s\): 1 missing, 1 present, 1 store, 1 tar; to load: .*free at ")

    def test_plan_with_an_unreachable_store_names_it_and_plans_the_other_sources(self):
        d = tempdir(self)
        bed.rmi(self.refs[8])
        missing = "%s/nowhere:2" % self.u
        store = "http://127.0.0.1:%d/swe" % dead_port()
        ds = write_jsonl(os.path.join(d, "ds.jsonl"), [{"instance_id": "x__y-%d" % i, "image": img} for i, img in
                                                       enumerate([self.refs[0], self.refs[8], missing])])
        out = subprocess.run([sys.executable, CLI, "images", "plan", "--dataset", ds, "--image-tars", self.batch,
                              "--tar-index", os.path.join(d, "index.json"), "--image-store", store, "--json"],
                             env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True, timeout=60)
        self.assertEqual(out.returncode, 1, out.stderr)  # one image is missing: not because of the store
        plan = {row["image"]: row["source"] for row in json.loads(out.stdout)["images"]}
        self.assertEqual(plan, {self.refs[0]: "present", self.refs[8]: "tar " + self.batch, missing: "missing"})
        warned = [line for line in out.stderr.splitlines() if "image store unusable" in line]
        self.assertEqual(len(warned), 1, out.stderr)  # said once, naming the store
        self.assertIn(store, warned[0])


if __name__ == "__main__":
    unittest.main()
