"""A small Parquet writer for the tests, written from the format's specification (parquet.thrift, the encodings
document), independent of evalharness's reader: uncompressed data pages v1, PLAIN values, levels in the RLE/bit-packed
hybrid or the deprecated BIT_PACKED form. Columns are typed by their first non-null value: str (UTF8), int (INT64),
float (DOUBLE), bool, a list of those (the 3-level LIST form), a dict of those (an optional struct).

    write_parquet(path, rows, row_group_size=None, levels="RLE", extra_columns=())

``extra_columns``: raw (schema element, values) leaves appended to the schema, for types the writer does not make
itself (an INTERVAL column, to be refused by the reader)."""
import struct

# Thrift compact protocol types
T_TRUE, T_FALSE, T_I32, T_I64, T_BINARY, T_LIST, T_STRUCT = 1, 2, 5, 6, 8, 9, 12
BOOLEAN, INT32, INT64, DOUBLE, BYTE_ARRAY, FIXED = 0, 1, 2, 5, 6, 7
REQUIRED, OPTIONAL, REPEATED = 0, 1, 2


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _zigzag(n):
    return (n << 1) ^ (n >> 63)


def _value(kind, v):
    if kind in (T_I32, T_I64):
        return _varint(_zigzag(v))
    if kind == T_BINARY:
        v = v.encode() if isinstance(v, str) else v
        return _varint(len(v)) + v
    if kind == T_STRUCT:
        return thrift_struct(v)
    if kind == T_LIST:
        elem, items = v
        head = bytes([(len(items) << 4) | elem]) if len(items) < 15 else bytes([0xF0 | elem]) + _varint(len(items))
        return head + b"".join(_value(elem, x) for x in items)
    raise ValueError(kind)


def thrift_struct(fields):
    """Compact-protocol bytes of a struct: ``fields`` is a list of (field id, type, value), ids ascending."""
    out, last = bytearray(), 0
    for fid, kind, v in fields:
        if v is None:
            continue
        if kind == "bool":
            kind, v = (T_TRUE if v else T_FALSE), None
        delta = fid - last
        out += bytes([(delta << 4) | kind]) if 0 < delta < 16 else bytes([kind]) + _varint(_zigzag(fid))
        if v is not None:
            out += _value(kind, v)
        last = fid
    return bytes(out + b"\x00")


def _hybrid(values, width):
    """RLE/bit-packed hybrid bytes of ``values``: one bit-packed run (padded to a multiple of 8)."""
    padded = list(values) + [0] * (-len(values) % 8)
    acc = 0
    for i, v in enumerate(padded):
        acc |= v << (i * width)
    return _varint(((len(padded) // 8) << 1) | 1) + acc.to_bytes(len(padded) * width // 8, "little")


def _bit_packed(values, width):
    """The deprecated BIT_PACKED encoding: from the most significant bit, no length prefix."""
    acc, nbits = 0, 0
    for v in values:
        acc = (acc << width) | v
        nbits += width
    pad = -nbits % 8
    return (acc << pad).to_bytes((nbits + pad) // 8, "big")


def _plain(ptype, values):
    if ptype == INT64:
        return struct.pack("<%dq" % len(values), *values)
    if ptype == INT32:
        return struct.pack("<%di" % len(values), *values)
    if ptype == DOUBLE:
        return struct.pack("<%dd" % len(values), *values)
    if ptype == BOOLEAN:
        acc = 0
        for i, v in enumerate(values):
            acc |= int(v) << i
        return acc.to_bytes((len(values) + 7) // 8, "little")
    if ptype == FIXED:
        return b"".join(values)
    return b"".join(struct.pack("<I", len(b)) + b for b in (v.encode() if isinstance(v, str) else v for v in values))


def _scalar(v):
    """(physical type, schema fields for the type's annotation) of a Python value."""
    if isinstance(v, bool):
        return BOOLEAN, []
    if isinstance(v, int):
        return INT64, []
    if isinstance(v, float):
        return DOUBLE, []
    if isinstance(v, bytes):
        return BYTE_ARRAY, []
    return BYTE_ARRAY, [(6, T_I32, 0)]  # UTF8


class _Leaf:
    def __init__(self, path, ptype, max_def, max_rep):
        self.path, self.ptype, self.max_def, self.max_rep = path, ptype, max_def, max_rep
        self.defs, self.reps, self.values = [], [], []


def _schema_and_leaves(rows):
    names = []
    for r in rows:
        names += [k for k in r if k not in names]
    elements, leaves, shapes = [], [], {}
    for name in names:
        sample = next((r[name] for r in rows if r.get(name) is not None), "")
        if isinstance(sample, list):
            inner = next((x for r in rows for x in (r.get(name) or ()) if x is not None), "")
            ptype, ann = _scalar(inner)
            elements += [[(3, T_I32, OPTIONAL), (4, T_BINARY, name), (5, T_I32, 1), (6, T_I32, 3)],
                         [(3, T_I32, REPEATED), (4, T_BINARY, "list"), (5, T_I32, 1)],
                         [(1, T_I32, ptype), (3, T_I32, OPTIONAL), (4, T_BINARY, "element")] + ann]
            leaves.append(_Leaf((name, "list", "element"), ptype, 3, 1))
            shapes[name] = ("list", leaves[-1])
        elif isinstance(sample, dict):
            keys = list(sample)
            elements.append([(3, T_I32, OPTIONAL), (4, T_BINARY, name), (5, T_I32, len(keys))])
            subs = {}
            for key in keys:
                ptype, ann = _scalar(next((r[name][key] for r in rows if r.get(name) and r[name].get(key) is not None),
                                          ""))
                elements.append([(1, T_I32, ptype), (3, T_I32, OPTIONAL), (4, T_BINARY, key)] + ann)
                leaves.append(_Leaf((name, key), ptype, 2, 0))
                subs[key] = leaves[-1]
            shapes[name] = ("struct", subs)
        else:
            ptype, ann = _scalar(sample)
            elements.append([(1, T_I32, ptype), (3, T_I32, OPTIONAL), (4, T_BINARY, name)] + ann)
            leaves.append(_Leaf((name,), ptype, 1, 0))
            shapes[name] = ("scalar", leaves[-1])
    return names, elements, leaves, shapes


def _levels(rows, shapes):
    for r in rows:
        for name, (shape, leaf) in shapes.items():
            v = r.get(name)
            if shape == "scalar":
                leaf.reps.append(0)
                leaf.defs.append(0 if v is None else 1)
                if v is not None:
                    leaf.values.append(v)
            elif shape == "struct":
                for key, sub in leaf.items():
                    x = None if v is None else v.get(key)
                    sub.reps.append(0)
                    sub.defs.append(0 if v is None else 1 if x is None else 2)
                    if x is not None:
                        sub.values.append(x)
            else:
                if v is None or not v:
                    leaf.reps.append(0)
                    leaf.defs.append(0 if v is None else 1)
                for i, x in enumerate(v or ()):
                    leaf.reps.append(0 if i == 0 else 1)
                    leaf.defs.append(2 if x is None else 3)
                    if x is not None:
                        leaf.values.append(x)


def _field(element, fid):
    return next(v for f, _t, v in element if f == fid)


def write_parquet(path, rows, row_group_size=None, levels="RLE", extra_columns=()):
    """Write ``rows`` (dicts) as a Parquet file; returns ``path``."""
    names, elements, leaves, shapes = _schema_and_leaves(rows)
    for element, _values in extra_columns:
        elements.append(element)
        names.append(_field(element, 4))
    size = row_group_size or max(1, len(rows))
    groups = [rows[i:i + size] for i in range(0, len(rows), size)] or [[]]
    body = bytearray(b"PAR1")
    meta_groups = []
    for group in groups:
        names_, _e, gleaves, gshapes = _schema_and_leaves(rows)  # the same schema, fresh level buffers
        _levels(group, gshapes)
        chunks = []
        for leaf in gleaves + [("extra", element, values) for element, values in extra_columns]:
            if isinstance(leaf, tuple):
                _, element, values = leaf
                leaf = _Leaf((_field(element, 4),), _field(element, 1), 1, 0)
                leaf.defs = [0 if v is None else 1 for v in values[:len(group)]]
                leaf.reps = [0] * len(leaf.defs)
                leaf.values = [v for v in values[:len(group)] if v is not None]
            page = bytearray()
            level = _bit_packed if levels == "BIT_PACKED" else _hybrid
            for lv, mx in ((leaf.reps, leaf.max_rep), (leaf.defs, leaf.max_def)):
                if mx:
                    data = level(lv, mx.bit_length())
                    page += data if levels == "BIT_PACKED" else struct.pack("<I", len(data)) + data
            page += _plain(leaf.ptype, leaf.values)
            enc = 4 if levels == "BIT_PACKED" else 3
            header = thrift_struct([(1, T_I32, 0), (2, T_I32, len(page)), (3, T_I32, len(page)),
                                    (5, T_STRUCT, [(1, T_I32, len(leaf.defs)), (2, T_I32, 0), (3, T_I32, enc),
                                                   (4, T_I32, enc)])])
            offset = len(body)
            body += header + page
            meta = [(1, T_I32, leaf.ptype), (2, T_LIST, (T_I32, [0, enc])), (3, T_LIST, (T_BINARY, list(leaf.path))),
                    (4, T_I32, 0), (5, T_I64, len(leaf.defs)), (6, T_I64, len(header) + len(page)),
                    (7, T_I64, len(header) + len(page)), (9, T_I64, offset)]
            chunks.append([(2, T_I64, offset), (3, T_STRUCT, meta)])
        meta_groups.append([(1, T_LIST, (T_STRUCT, chunks)), (2, T_I64, len(body)), (3, T_I64, len(group))])
    root = [(4, T_BINARY, "schema"), (5, T_I32, len(names))]
    footer = thrift_struct([(1, T_I32, 1), (2, T_LIST, (T_STRUCT, [root] + elements)), (3, T_I64, len(rows)),
                            (4, T_LIST, (T_STRUCT, meta_groups)), (6, T_BINARY, "tests/parquetbed.py")])
    body += footer + struct.pack("<I", len(footer)) + b"PAR1"
    with open(path, "wb") as fh:
        fh.write(bytes(body))
    return path
