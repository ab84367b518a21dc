#!/usr/bin/env bash
# Build dist/evalharness.pyz reproducibly: the same sources give the same bytes (sorted entries, fixed timestamps
# from SOURCE_DATE_EPOCH or 2020-01-01, fixed permissions). Prints the archive's sha256.
#
# For a fast start the archive also holds the module's bytecode for each supported Python found on this machine
# (evalharness.cpython-38.pyc ... evalharness.cpython-313.pyc: optimize=0, unchecked-hash, so the bytes do not
# depend on file times), compiled by that version's own interpreter: the highest X.Y.Z of `pyenv versions --bare`,
# else pythonX.Y on PATH; a version not found is skipped with a note on stderr. __main__.py loads the one whose
# magic number matches the running interpreter and compiles the archive's source for any other, and under -O
# (EVALHARNESS_DEBUG_LOADER=1 makes it say which on stderr). PYC_VERSIONS="3.8 3.13" limits the bytecode to
# those versions ("none": source only).
# So the bytes depend on the interpreters found as well as on the sources: to reproduce an archive on another
# machine, build with the same X.Y.Z releases (the build lists them on stderr) or the same PYC_VERSIONS.
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
OUT="${1:-dist/evalharness.pyz}"
mkdir -p "$(dirname "$OUT")"
"$PY" - "$OUT" <<'PY'
import hashlib, os, re, shutil, stat, subprocess, sys, tempfile, time, zipfile

out = sys.argv[1]
epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "1577836800"))  # 2020-01-01T00:00:00Z
stamp = time.gmtime(max(epoch, 315532800))[:6]                   # zip cannot store dates before 1980
SUPPORTED = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")
wanted = os.environ.get("PYC_VERSIONS", " ".join(SUPPORTED)).replace(",", " ").split()
if wanted == ["none"]:
    wanted = []
unknown = sorted(set(wanted) - set(SUPPORTED))
if unknown:
    sys.exit("build_zipapp.sh: PYC_VERSIONS=%r: %s not supported (choose from %s, or none)"
             % (os.environ["PYC_VERSIONS"], " ".join(unknown), " ".join(SUPPORTED)))

# __main__.py: syntax any Python parses (no f-strings), so an old interpreter gets a clear message, not a traceback.
# zipimport uses no cached bytecode and compiles the ~9k-line module twice per start (once for get_filename, once
# for get_code), so __main__.py makes the module itself, the way importlib's SourceFileLoader does: code from the
# archive's evalharness.<cache_tag>.pyc when it fits this interpreter, else compiled once from the archive's
# source; registered in sys.modules before it runs (pickle, dataclasses and `import evalharness` find it); the
# __file__, __spec__ and code file names a plain import from the archive gives, so tracebacks name
# evalharness.pyz/evalharness.py and linecache reads the lines from the archive through __loader__.
main = r'''# evalharness zipapp entry point, written by build_zipapp.sh.
import sys
if sys.version_info < (3, 8):
    sys.stderr.write('evalharness requires Python >= 3.8 (this is Python %s)\n' % sys.version.split()[0])
    sys.exit(2)


def _bytecode(loader, name):
    """(code object, None) from the archive's pyc NAME if it fits this interpreter, else (None, why not)."""
    if sys.flags.optimize:
        return None, 'python -O: the archive has optimize=0 bytecode only'
    try:
        data = loader.get_data(name)
    except OSError:
        return None, 'no %s in the archive' % name
    import marshal
    from importlib.util import MAGIC_NUMBER
    if data[:4] != MAGIC_NUMBER or data[4:8] != b'\x01\x00\x00\x00':  # flags 0b01: unchecked hash
        return None, '%s is not unchecked-hash bytecode for this interpreter' % name
    try:
        code = marshal.loads(memoryview(data)[16:])
    except (EOFError, ValueError, TypeError):
        code = None
    if type(code) is not type(_bytecode.__code__):
        return None, '%s is damaged' % name
    return code, None


def _from_archive(loader, archive):
    """The module made from the archive (a zipimporter's), the way SourceFileLoader makes one; and how."""
    import os
    import importlib.util
    from importlib.machinery import ModuleSpec
    origin = os.path.join(archive, 'evalharness.py')
    spec = ModuleSpec('evalharness', loader, origin=origin)
    spec.has_location = True
    tag = sys.implementation.cache_tag
    pyc = 'evalharness.%s.pyc' % tag
    code, why = _bytecode(loader, pyc) if tag else (None, 'no bytecode cache tag')
    if code is None:
        code = compile(loader.get_data('evalharness.py'), origin, 'exec', dont_inherit=True)
        how = 'source %s (%s)' % (origin, why)
    else:
        import _imp
        _imp._fix_co_filename(code, origin)  # every nested code object too, as SourceFileLoader does
        spec.cached = os.path.join(archive, pyc)
        how = 'bytecode %s' % spec.cached
    module = importlib.util.module_from_spec(spec)
    sys.modules['evalharness'] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop('evalharness', None)  # as the import system does: no half-made module left behind
        raise
    return module, how


def _load():
    """The evalharness module; EVALHARNESS_DEBUG_LOADER=1: say on stderr where it came from."""
    import os
    loader = globals().get('__loader__')
    archive = getattr(loader, 'archive', None)  # a zipimporter when run from the .pyz
    if archive is None:
        import evalharness as module  # run from a folder: the usual import, with its __pycache__
        how = 'import %s' % module.__file__
    else:
        module, how = _from_archive(loader, archive)
    if os.environ.get('EVALHARNESS_DEBUG_LOADER', '') not in ('', '0'):
        sys.stderr.write('evalharness loader: %s\n' % how)
    return module


sys.exit(_load().main())
'''.encode()

with open("evalharness.py", "rb") as fh:
    module = fh.read()  # one read: the bytecode is compiled from these bytes, not from a file that may change


def interpreter(version, pyenv_names):
    """The python executable for 'X.Y' (pyenv's highest X.Y.Z, else pythonX.Y on PATH), or None."""
    patches = [v for v in pyenv_names if re.match(re.escape(version) + r"\.\d+$", v)]
    if patches:
        best = max(patches, key=lambda v: [int(p) for p in v.split(".")])
        res = subprocess.run(["pyenv", "prefix", best], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             universal_newlines=True, timeout=30)
        exe = os.path.join(res.stdout.strip(), "bin", "python" + version)
        if res.returncode == 0 and os.access(exe, os.X_OK):
            return exe
    return shutil.which("python" + version)


# In the compiling interpreter: no site, no PYTHON* settings (PYTHONOPTIMIZE would change the code), a fixed hash
# seed (3.8/3.9 marshal frozenset constants in hash order). Prints the cache tag the pyc is named by and the release.
COMPILE = (
    "import py_compile, sys\n"
    "py_compile.compile(sys.argv[1], cfile=sys.argv[2], dfile='evalharness.py', doraise=True, optimize=0,\n"
    "                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n"
    "print(sys.implementation.cache_tag, sys.version.split()[0])\n"
)
entries = {"__main__.py": main, "evalharness.py": module}
tmpdir = tempfile.mkdtemp(prefix="evalharness-build-")
try:
    if wanted:
        try:
            pyenv_names = subprocess.run(["pyenv", "versions", "--bare"], stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, universal_newlines=True, timeout=30).stdout.split()
        except OSError:
            pyenv_names = []
            sys.stderr.write("build_zipapp.sh: no pyenv on PATH; looking for pythonX.Y on PATH\n")
        source = os.path.join(tmpdir, "evalharness.py")
        with open(source, "wb") as fh:
            fh.write(module)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["PYTHONHASHSEED"] = "0"
        jobs = []
        for version in wanted:
            exe = interpreter(version, pyenv_names)
            if exe is None:
                sys.stderr.write("build_zipapp.sh: no Python %s on this machine: no bytecode for it (it runs from "
                                 "the source)\n" % version)
                continue
            cfile = os.path.join(tmpdir, version + ".pyc")
            jobs.append((version, exe, cfile, subprocess.Popen(
                [exe, "-S", "-c", COMPILE, source, cfile], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                universal_newlines=True, env=env, cwd=tmpdir)))
        done = []
        for job in jobs:  # wait for all of them before checking, so none is left running
            done.append(job + job[-1].communicate(timeout=300))
        built = []
        for version, exe, cfile, proc, stdout, stderr in done:
            tag, _, release = stdout.strip().partition(" ")
            if proc.returncode != 0 or not re.match(r"[a-z]+-\d+$", tag):
                sys.exit("build_zipapp.sh: %s could not compile evalharness.py (exit %s):\n%s"
                         % (exe, proc.returncode, stderr.strip()))
            name = "evalharness.%s.pyc" % tag
            if name not in entries:
                with open(cfile, "rb") as fh:
                    entries[name] = fh.read()
                built.append("%s (%s)" % (tag, release))
        sys.stderr.write("build_zipapp.sh: bytecode for %s\n" % (", ".join(built) or "no Python"))
finally:
    shutil.rmtree(tmpdir, True)

tmp = out + ".tmp"
with open(tmp, "wb") as raw:
    raw.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(raw, "w") as zf:
        for name, data in sorted(entries.items()):
            info = zipfile.ZipInfo(name, date_time=stamp)
            # what a start reads is stored as is: inflating the ~0.4-0.8 MB bytecode cost ~2 ms of each start (and
            # importing zlib); only the source, read by an interpreter with no bytecode here, is compressed
            info.compress_type = zipfile.ZIP_DEFLATED if name == "evalharness.py" else zipfile.ZIP_STORED
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            info.create_system = 3
            zf.writestr(info, data, compresslevel=9)
os.chmod(tmp, 0o755)
os.replace(tmp, out)
with open(out, "rb") as fh:
    digest = hashlib.sha256(fh.read()).hexdigest()
print("%s  %s" % (digest, out))
PY
