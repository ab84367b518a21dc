"""Parquet and the codecs: every codec, encoding and layout against the rows pyarrow reads from the same files
(tests/data/parquet, written by bench/parquet_fixtures.py; expected.json is pyarrow's to_pylist()), files the tests'
own writer makes (tests/parquetbed.py: the deprecated BIT_PACKED levels, nesting, row groups), and the refusals."""
import base64
import datetime
import decimal
import json
import os
import shutil
import struct
import unittest

from tests.parquetbed import write_parquet
from tests.support import ROOT, eh, tempdir

DATA = os.path.join(ROOT, "tests", "data", "parquet")
EPOCH = datetime.datetime(1970, 1, 1)
EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _tagged(v):
    """A row's value in the JSON form expected.json holds pyarrow's values in (bench/parquet_fixtures.py writes it
    with this function; pandas' Timestamp and numpy's floats are pyarrow's values there)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return {"float": repr(v)}
    if isinstance(v, bytes):
        return {"bytes": base64.b64encode(v).decode()}
    if isinstance(v, decimal.Decimal):
        return {"decimal": str(v)}
    if type(v).__name__ == "Timestamp":
        return {"ns": int(v.value), "utc": v.tzinfo is not None}
    if isinstance(v, datetime.datetime):
        delta = v - (EPOCH_UTC if v.tzinfo is not None else EPOCH)
        return {"ns": (delta.days * 86400 + delta.seconds) * 10 ** 9 + delta.microseconds * 1000
                + getattr(v, "nanosecond", 0), "utc": v.tzinfo is not None}
    if isinstance(v, (datetime.date, datetime.time)):
        return {"iso": v.isoformat()}
    if isinstance(v, dict):
        return {"dict": [[_tagged(k), _tagged(x)] for k, x in v.items()]}
    if isinstance(v, (list, tuple)):
        return [_tagged(x) for x in v]
    if type(v).__name__ == "UUID":
        return str(v)
    if type(v).__module__ == "numpy":
        return {"float": repr(float(v))}
    raise TypeError(type(v))


def codec_text():
    """What the codec blobs decompress to (bench/parquet_fixtures.py compresses this text)."""
    words = ("the model answers each question of the benchmark with a short reasoning and then the final answer "
             "which the scorer compares with the reference after normalising case spacing and punctuation").split()
    out, i, size = [], 0, 0
    while size < 300000:
        size += len(words[(i * 7919 + (i * i) % 104729) % len(words)]) + 1 + (i % 17 == 0)
        out.append(words[(i * 7919 + (i * i) % 104729) % len(words)] + (" " if i % 17 else ".\n"))
        i += 1
    return "".join(out).encode()


_EXPECTED = {}


def expected():
    """expected.json (read at first use: bench/parquet_fixtures.py imports this module to write it)."""
    if not _EXPECTED:
        with open(os.path.join(DATA, "expected.json"), encoding="utf-8") as fh:
            _EXPECTED.update(json.load(fh))
    return _EXPECTED


def _raw(name):
    with open(os.path.join(DATA, name), "rb") as fh:
        return fh.read()


class TestCodecs(unittest.TestCase):
    """Each decoder against bytes pyarrow's codecs compressed (300 kB of text: several zstd blocks, so repeated
    FSE tables and treeless Huffman literals; level 19 and level 1)."""

    def test_each_codec_decompresses_to_the_original_bytes(self):
        text = codec_text()
        for name, decode in (("text.zst", eh._zstd_decompress), ("text-fast.zst", eh._zstd_decompress),
                             ("text.snappy", eh._snappy_decompress), ("text.lz4", eh._lz4_block_decompress)):
            with self.subTest(name=name):
                self.assertEqual(decode(_raw(name)), text)
        import gzip
        self.assertEqual(eh._gzip_decompress(gzip.compress(text) + gzip.compress(b"more")), text + b"more")

    def test_cut_or_damaged_data_raises_a_corrupt_error_when_decoded(self):
        for name, decode in (("text.zst", eh._zstd_decompress), ("text.snappy", eh._snappy_decompress)):
            data = _raw(name)
            with self.subTest(name=name, fault="cut"), self.assertRaises(eh._CorruptError):
                decode(data[:len(data) // 2])
        # an LZ4 block carries no length: a cut one may decode short (the page's size check refuses it)
        data = _raw("text.lz4")
        try:
            self.assertLess(len(eh._lz4_block_decompress(data[:len(data) // 2])), len(codec_text()))
        except eh._CorruptError:
            pass
        bad = bytearray(_raw("text.zst"))
        bad[0] ^= 0xFF
        with self.assertRaisesRegex(eh._CorruptError, "not a zstd frame"):
            eh._zstd_decompress(bytes(bad))
        with self.assertRaisesRegex(eh._CorruptError, "refers .* before the start"):
            eh._snappy_decompress(b"\x05\x01\x10")  # a copy from 16 bytes back into nothing


class TestPyarrowFiles(unittest.TestCase):
    """Rows read from files pyarrow (and fastparquet) wrote equal pyarrow's to_pylist(), value for value."""

    def assertRowsAsPyarrow(self, name):
        got = [_tagged(r) for r in eh.ParquetFile(os.path.join(DATA, name)).iter_rows()]
        want = expected()["tables"][expected()["files"][name]]
        self.assertEqual(len(got), len(want), name)
        for i, (a, b) in enumerate(zip(got, want)):
            self.assertEqual(a, b, "%s row %d" % (name, i))

    def test_each_codec_reads_as_pyarrow_reads_it(self):
        for name in ("flat-none.parquet", "types-snappy.parquet", "flat-gzip-checksums.parquet",
                     "types-zstd-v2.parquet", "flat-lz4.parquet"):
            with self.subTest(name=name):
                self.assertRowsAsPyarrow(name)

    def test_each_encoding_reads_as_pyarrow_reads_it(self):
        # PLAIN and RLE_DICTIONARY (types-snappy), DELTA_*, BYTE_STREAM_SPLIT, RLE booleans in pages v2
        for name in ("delta-binary.parquet", "delta-length.parquet", "delta-byte-array.parquet",
                     "byte-stream-split.parquet", "types-zstd-v2.parquet"):
            with self.subTest(name=name):
                self.assertRowsAsPyarrow(name)

    def test_nesting_and_nulls_read_as_pyarrow_reads_them_when_pages_and_groups_are_small(self):
        for name in ("nested-zstd-small-pages.parquet", "nested-legacy-lists.parquet"):
            with self.subTest(name=name):
                self.assertRowsAsPyarrow(name)
        self.assertEqual(len(eh.ParquetFile(os.path.join(DATA, "nested-zstd-small-pages.parquet")).groups), 2)

    def test_int96_timestamps_and_a_fastparquet_file_read_as_pyarrow_reads_them(self):
        self.assertRowsAsPyarrow("int96.parquet")
        self.assertRowsAsPyarrow("fastparquet.parquet")

    def test_the_schema_names_each_type_when_read(self):
        fields = dict(eh.ParquetFile(os.path.join(DATA, "types-snappy.parquet")).fields)
        self.assertEqual({k: fields[k] for k in ("u64", "d9", "ts_us_utc", "t_ns", "choices", "arc", "m", "image",
                                                 "lst")}, {
            "u64": "uint64", "d9": "decimal(9,2)", "ts_us_utc": "timestamp[us, UTC]", "t_ns": "time[ns]",
            "choices": "list<string>", "arc": "struct<text: list<string>, label: list<string>>",
            "m": "map<string, int64>", "image": "struct<bytes: binary, path: string>",
            "lst": "list<struct<x: int64, y: list<string>>>"})

    def test_special_floats_and_exact_decimals_are_kept_when_read(self):
        rows = list(eh.ParquetFile(os.path.join(DATA, "types-snappy.parquet")).iter_rows())
        f64 = {repr(r["f64"]) for r in rows if r["f64"] is not None}
        self.assertEqual({"nan", "-0.0", "inf", "-inf"} & f64, {"nan", "-0.0", "inf", "-inf"}, f64)
        d38 = [r["d38"] for r in rows if r["d38"] is not None]
        self.assertTrue(all(isinstance(d, decimal.Decimal) and d.as_tuple().exponent == -10 for d in d38))


class TestOwnWriter(unittest.TestCase):
    """Files of tests/parquetbed.py: the deprecated BIT_PACKED levels (most significant bit first, as the format
    says; pyarrow reads them least significant first: apache/arrow#42368), lists, structs and nulls, row groups."""

    ROWS = [{"id": "a", "n": 1, "x": 1.5, "ok": True, "choices": ["p", "q", None], "st": {"k": "v", "m": 2}},
            {"id": "b", "n": None, "x": None, "ok": False, "choices": [], "st": None},
            {"id": "c", "n": 3, "x": -0.0, "ok": None, "choices": None, "st": {"k": None, "m": None}}]

    def setUp(self):
        self.dir = tempdir(self)

    def test_rows_round_trip_when_levels_are_rle_or_bit_packed_and_groups_are_small(self):
        for levels in ("RLE", "BIT_PACKED"):
            for group in (None, 2, 1):
                with self.subTest(levels=levels, group=group):
                    path = write_parquet(os.path.join(self.dir, "t.parquet"), self.ROWS, row_group_size=group,
                                         levels=levels)
                    got = list(eh.ParquetFile(path).iter_rows())
                    self.assertEqual(got, self.ROWS)
                    self.assertEqual(repr(got[2]["x"]), "-0.0")

    def test_lists_of_structs_of_lists_and_lists_of_lists_round_trip_with_nulls_at_every_level(self):
        rows = [{"id": "a", "arc": {"text": ["x", "y"], "label": ["A", "B"]},
                 "lst": [{"x": 1, "y": ["p", None]}, None, {"x": None, "y": []}], "ll": [[1, 2], [], None]},
                {"id": "b", "arc": None, "lst": [], "ll": None},
                {"id": "c", "arc": {"text": [], "label": None}, "lst": None, "ll": [[None]]}]
        for group in (None, 2):
            path = write_parquet(os.path.join(self.dir, "n.parquet"), rows, row_group_size=group)
            self.assertEqual(list(eh.ParquetFile(path).iter_rows()), rows)
        self.assertEqual(dict(eh.ParquetFile(path).fields)["lst"], "list<struct<x: int64, y: list<string>>>")

    def test_a_type_not_supported_is_refused_in_one_line_naming_the_column(self):
        interval = [(1, 5, 7), (2, 5, 12), (3, 5, 1), (4, 8, "span"), (6, 5, 21)]  # FIXED[12], INTERVAL
        path = write_parquet(os.path.join(self.dir, "t.parquet"), [{"id": "a"}],
                             extra_columns=[(interval, [b"\0" * 12])])
        with self.assertRaisesRegex(eh.DatasetError, r"t\.parquet: column span: the INTERVAL type is not read; "
                                                     r"drop the column") as cm:
            eh.ParquetFile(path)
        self.assertNotIn("\n", str(cm.exception))


class TestBadFiles(unittest.TestCase):
    """A damaged file is one line naming the file (and the row group and column) and what to do."""

    def setUp(self):
        self.dir = tempdir(self)

    def bad(self, name, data, *needles):
        path = os.path.join(self.dir, name)
        with open(path, "wb") as fh:
            fh.write(data)
        with self.assertRaises(eh.DatasetError) as cm:
            list(eh.ParquetFile(path).iter_rows())
        msg = str(cm.exception)
        self.assertNotIn("\n", msg)
        for needle in (path,) + needles:
            self.assertIn(needle, msg)
        return msg

    def test_empty_truncated_and_foreign_files_are_refused_when_opened(self):
        data = _raw("flat-none.parquet")
        self.bad("empty.parquet", b"", "too short to be a Parquet file (it is empty)")
        self.bad("cut.parquet", data[:len(data) - 100], "cut off (it does not end with PAR1",
                 "download or copy the file again")
        self.bad("csv.parquet", b"id,prompt,answer\n1,a,b\n", "not a Parquet file (it starts with b'id,p'")
        self.bad("footer.parquet", data[:4] + data[-8:], "cut off (its footer says")

    def test_a_page_that_does_not_decompress_names_the_row_group_and_column(self):
        data = bytearray(_raw("types-snappy.parquet"))
        mid = len(data) // 3
        data[mid:mid + 400] = b"\xff" * 400
        self.bad("damaged.parquet", bytes(data), "row group 0, column ", "download or copy the file again")

    def test_a_page_whose_crc_does_not_match_is_refused(self):
        pf = eh.ParquetFile(os.path.join(DATA, "flat-gzip-checksums.parquet"))
        chunk = pf.groups[0][1][1][3]  # the second column's metadata
        data = bytearray(_raw("flat-gzip-checksums.parquet"))
        at = min(chunk[9], chunk.get(11) or chunk[9]) + chunk[7] - 3  # inside its last page's compressed data
        data[at] ^= 0x55
        self.bad("crc.parquet", bytes(data), "row group 0, column %s" % pf.leaves[1].name,
                 "a page's CRC does not match its bytes")

    def test_damaged_bytes_anywhere_give_one_line_and_never_another_exception(self):
        """Bytes changed at random in the fixtures (a seeded fuzz): every read ends in rows or in one DatasetError
        line, never a traceback of another type."""
        import random
        rnd = random.Random(51)
        names = sorted(n for n in os.listdir(DATA) if n.endswith(".parquet") and n != "brotli.parquet")
        for i in range(300):
            data = bytearray(_raw(names[i % len(names)]))
            for _ in range(rnd.randint(1, 4)):
                data[rnd.randrange(len(data))] = rnd.randrange(256)
            path = os.path.join(self.dir, "fuzz.parquet")
            with open(path, "wb") as fh:
                fh.write(bytes(data))
            try:
                list(eh.ParquetFile(path).iter_rows())
            except eh.DatasetError as exc:
                self.assertNotIn("\n", str(exc))
                self.assertTrue(str(exc).startswith(path), str(exc))

    def test_a_decompression_bomb_and_a_runaway_run_length_stop_at_what_the_page_says(self):
        rle_block = (1 | (1 << 1) | ((1 << 17) << 3)).to_bytes(3, "little") + b"x"  # 128 KiB of "x", not last
        frame = (0xFD2FB528).to_bytes(4, "little") + b"\x00\x00" + rle_block * 2000 + b"\x01\x00\x00"
        with self.assertRaisesRegex(eh._CorruptError, "decodes past the 1000 bytes expected"):
            eh._zstd_decompress(frame, 1000)  # 262 MB if it were let run
        with self.assertRaisesRegex(eh._CorruptError, "says 9999999 bytes where 10 are expected"):
            eh._snappy_decompress(b"\xff\xac\xe2\x04" + b"\x00a", 10)
        huge_run = bytes([0xFE, 0xFF, 0xFF, 0xFF, 0x0F]) + b"\x07"  # an RLE run of 2^31 - 1 sevens
        self.assertEqual(eh._rle_hybrid(huge_run, 0, len(huge_run), 3, 10), [7] * 10)

    def test_brotli_and_encryption_are_refused_with_the_fix(self):
        self.bad("brotli.parquet", _raw("brotli.parquet"), "compression BROTLI is not read; re-save the file with "
                 "zstd or snappy")
        data = _raw("flat-none.parquet")
        self.bad("enc.parquet", b"PARE" + data[4:-4] + b"PARE", "an encrypted Parquet file")


if __name__ == "__main__":
    unittest.main()
