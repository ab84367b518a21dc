#!/usr/bin/env python3
"""Write the Parquet files tests/test_parquet.py reads, and the rows pyarrow reads from them. Run by hand, never by
CI (pyarrow and fastparquet in a throwaway virtualenv, as bench/parquet_parity.py says):

    /tmp/pq/bin/python bench/parquet_fixtures.py        # writes tests/data/parquet/

Each file is small (a few dozen rows of bench/parquet_parity.py's table, every type with nulls at every level) and
is written with one codec, encoding or layout; expected.json holds pyarrow's ``to_pylist()`` rows of each table in a
tagged JSON form, and which table each file holds (pyarrow's rows of every file are checked equal to its table's
here); tests/test_parquet.py puts evalharness's rows in the same form. The tests need neither pyarrow
nor this script: the files and expected.json are committed.
"""

import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from parquet_parity import table  # noqa: E402
from tests.test_parquet import _tagged as tagged, codec_text  # noqa: E402  (the test compares in the same form)

OUT = os.path.join(HERE, "..", "tests", "data", "parquet")


def main():
    os.makedirs(OUT, exist_ok=True)
    text = codec_text()
    for name, data in (("text.zst", pa.Codec("zstd", compression_level=19).compress(text, asbytes=True)),
                       ("text-fast.zst", pa.Codec("zstd", compression_level=1).compress(text, asbytes=True)),
                       ("text.snappy", pa.compress(text, codec="snappy", asbytes=True)),
                       ("text.lz4", pa.compress(text, codec="lz4_raw", asbytes=True))):
        with open(os.path.join(OUT, name), "wb") as fh:
            fh.write(data)
        print("%-34s %6d bytes (of %d)" % (name, len(data), len(text)))
    full = table(40, 2024)
    flat = full.select(["id", "i32", "i64", "u64", "f64", "flag", "s", "cat", "b", "fb", "date"])
    nested = full.select(["id", "li", "choices", "lli", "st", "arc", "lst", "m", "image"])
    # INT96 as pyarrow reads it: timestamp[ns], which wraps past 2262 (evalharness reads the instant stored), so
    # its table holds in-range nanosecond timestamps only
    tables = {"full": full, "flat": flat, "nested": nested, "int96": full.select(["id", "ts_ns"]),
              "id": flat.select(["id"])}
    files = {
        "types-snappy.parquet": (full, dict(compression="SNAPPY")),
        "types-zstd-v2.parquet": (full, dict(compression="ZSTD", data_page_version="2.0")),
        "flat-none.parquet": (flat, dict(compression="NONE", use_dictionary=False)),
        "flat-gzip-checksums.parquet": (flat, dict(compression="GZIP", write_page_checksum=True)),
        "flat-lz4.parquet": (flat, dict(compression="LZ4", data_page_version="2.0")),
        "nested-zstd-small-pages.parquet": (nested, dict(compression="ZSTD", data_page_size=300, write_batch_size=7,
                                                         row_group_size=25)),
        "nested-legacy-lists.parquet": (nested, dict(compression="SNAPPY", use_compliant_nested_type=False)),
        "delta-binary.parquet": (flat, dict(compression="NONE", use_dictionary=False, column_encoding={
            "i32": "DELTA_BINARY_PACKED", "i64": "DELTA_BINARY_PACKED", "u64": "DELTA_BINARY_PACKED",
            "date": "DELTA_BINARY_PACKED"})),
        "delta-length.parquet": (flat, dict(compression="NONE", use_dictionary=False, data_page_version="2.0",
                                            column_encoding={"s": "DELTA_LENGTH_BYTE_ARRAY",
                                                             "b": "DELTA_LENGTH_BYTE_ARRAY"})),
        "delta-byte-array.parquet": (flat, dict(compression="SNAPPY", use_dictionary=False, column_encoding={
            "s": "DELTA_BYTE_ARRAY", "cat": "DELTA_BYTE_ARRAY", "fb": "DELTA_BYTE_ARRAY"})),
        "byte-stream-split.parquet": (flat, dict(compression="NONE", use_dictionary=False, column_encoding={
            "f64": "BYTE_STREAM_SPLIT", "i32": "BYTE_STREAM_SPLIT", "fb": "BYTE_STREAM_SPLIT"})),
        "int96.parquet": (tables["int96"], dict(use_deprecated_int96_timestamps=True)),
        "brotli.parquet": (tables["id"], dict(compression="BROTLI")),
    }
    expected, which = {}, {}
    for name, (tab, opts) in files.items():
        path = os.path.join(OUT, name)
        pq.write_table(tab, path, **opts)
        maps = [f.name for f in tab.schema if pa.types.is_map(f.type)]
        rows = pq.read_table(path).to_pylist()
        for row in rows:
            for key in maps:
                if row[key] is not None:
                    row[key] = dict(row[key])
        key = next(k for k, t in tables.items() if t is tab)
        rows = [tagged(r) for r in rows]
        if expected.setdefault(key, rows) != rows:
            sys.exit("%s: pyarrow reads other rows than its table's" % name)
        which[name] = key
        print("%-34s %6d bytes  %d rows" % (name, os.path.getsize(path), len(rows)))
    try:
        import fastparquet
        import pandas as pd
        frame = pd.DataFrame({"id": ["r%d" % i for i in range(40)], "n": [i * 7 - 100 for i in range(40)],
                              "x": [None if i % 5 == 0 else i / 3 for i in range(40)],
                              "s": [None if i % 7 == 0 else "text %d é" % i for i in range(40)]})
        path = os.path.join(OUT, "fastparquet.parquet")
        fastparquet.write(path, frame, compression="SNAPPY", row_group_offsets=15)
        expected["fastparquet"] = [tagged(r) for r in pq.read_table(path).to_pylist()]
        which["fastparquet.parquet"] = "fastparquet"
        print("%-34s %6d bytes" % ("fastparquet.parquet", os.path.getsize(path)))
    except ImportError:
        print("fastparquet is not installed: its file is not written")
    with open(os.path.join(OUT, "expected.json"), "w") as fh:
        json.dump({"pyarrow": pa.__version__, "files": which, "tables": expected}, fh, sort_keys=True)
        fh.write("\n")
    print("expected.json: %d bytes" % os.path.getsize(os.path.join(OUT, "expected.json")))


if __name__ == "__main__":
    main()
