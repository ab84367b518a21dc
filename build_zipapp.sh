#!/usr/bin/env bash
# Build dist/evalharness.pyz reproducibly: the same sources give the same bytes (sorted entries, fixed timestamps
# from SOURCE_DATE_EPOCH or 2020-01-01, fixed permissions, no .pyc). Prints the archive's sha256.
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
OUT="${1:-dist/evalharness.pyz}"
mkdir -p "$(dirname "$OUT")"
"$PY" - "$OUT" <<'PY'
import hashlib, os, stat, sys, time, zipfile

out = sys.argv[1]
epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "1577836800"))  # 2020-01-01T00:00:00Z
stamp = time.gmtime(max(epoch, 315532800))[:6]                   # zip cannot store dates before 1980
# __main__.py: syntax any Python parses (no f-strings), so an old interpreter gets a clear message, not a traceback.
main = (
    "import sys\n"
    "if sys.version_info < (3, 8):\n"
    "    sys.stderr.write('evalharness requires Python >= 3.8 (this is Python %s)\\n' % sys.version.split()[0])\n"
    "    sys.exit(2)\n"
    "from evalharness import main\n"
    "sys.exit(main())\n"
).encode()
with open("evalharness.py", "rb") as fh:
    module = fh.read()
tmp = out + ".tmp"
with open(tmp, "wb") as raw:
    raw.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(raw, "w") as zf:
        for name, data in sorted([("__main__.py", main), ("evalharness.py", module)]):
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            info.create_system = 3
            zf.writestr(info, data, compresslevel=9)
os.chmod(tmp, 0o755)
os.replace(tmp, out)
with open(out, "rb") as fh:
    digest = hashlib.sha256(fh.read()).hexdigest()
print("%s  %s" % (digest, out))
PY
