"""A small Parquet writer for the tests, written from the format's specification (parquet.thrift, the encodings
document), independent of evalharness's reader: uncompressed data pages v1, PLAIN values, levels in the RLE/bit-packed
hybrid or the deprecated BIT_PACKED form. Columns are typed by their first non-null value: str (UTF8), int (INT64),
float (DOUBLE), bool, bytes, and lists (the 3-level LIST form) and dicts (optional structs) of those, nested.

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

    def add(self, r, d, value):
        self.reps.append(r)
        self.defs.append(d)
        if d == self.max_def:
            self.values.append(value)


class _Node:
    """A column of the schema: "scalar" (an optional leaf), "struct" (an optional group) or "list" (an optional
    LIST group, its repeated group "list", its optional "element"), typed by the sample values."""

    def __init__(self, name, samples, path, def_level, rep_level):
        self.name = name
        sample = next((v for v in samples if v is not None), "")
        self.leaves = []
        if isinstance(sample, list):
            self.kind = "list"
            self.rep_level = rep_level + 1
            self.element = _Node("element", [x for v in samples for x in (v or ())], path + (name, "list"),
                                 def_level + 2, rep_level + 1)
            self.leaves = self.element.leaves
        elif isinstance(sample, dict):
            self.kind = "struct"
            self.children = [_Node(k, [v.get(k) if v else None for v in samples], path + (name,), def_level + 1,
                                   rep_level) for k in sample]
            self.leaves = [leaf for c in self.children for leaf in c.leaves]
        else:
            self.kind = "scalar"
            self.ptype, self.annotation = _scalar(sample)
            self.leaves = [_Leaf(path + (name,), self.ptype, def_level + 1, rep_level)]

    def elements(self):
        if self.kind == "scalar":
            return [[(1, T_I32, self.ptype), (3, T_I32, OPTIONAL), (4, T_BINARY, self.name)] + self.annotation]
        if self.kind == "struct":
            return [[(3, T_I32, OPTIONAL), (4, T_BINARY, self.name), (5, T_I32, len(self.children))]] + \
                [e for c in self.children for e in c.elements()]
        return [[(3, T_I32, OPTIONAL), (4, T_BINARY, self.name), (5, T_I32, 1), (6, T_I32, 3)],
                [(3, T_I32, REPEATED), (4, T_BINARY, "list"), (5, T_I32, 1)]] + self.element.elements()

    def shred(self, value, r, d):
        """The levels of ``value`` (r: its repetition level, d: the definition level its parent reached)."""
        if value is None:
            for leaf in self.leaves:
                leaf.add(r, d, None)
        elif self.kind == "scalar":
            self.leaves[0].add(r, d + 1, value)
        elif self.kind == "struct":
            for c in self.children:
                c.shred(value.get(c.name), r, d + 1)
        elif not value:
            for leaf in self.leaves:
                leaf.add(r, d + 1, None)
        else:
            for i, x in enumerate(value):
                self.element.shred(x, r if i == 0 else self.rep_level, d + 2)


def _schema(rows):
    names = []
    for r in rows:
        names += [k for k in r if k not in names]
    return names, [_Node(n, [r.get(n) for r in rows], (), 0, 0) for n in names]


def _field(element, fid):
    return next(v for f, _t, v in element if f == fid)


def write_parquet(path, rows, row_group_size=None, levels="RLE", extra_columns=()):
    """Write ``rows`` (dicts) as a Parquet file; returns ``path``."""
    names, nodes = _schema(rows)
    elements = [e for n in nodes for e in n.elements()]
    for element, _values in extra_columns:
        elements.append(element)
        names.append(_field(element, 4))
    size = row_group_size or max(1, len(rows))
    groups = [rows[i:i + size] for i in range(0, len(rows), size)] or [[]]
    body = bytearray(b"PAR1")
    meta_groups = []
    for group in groups:
        _names, gnodes = _schema(rows)  # the same schema, fresh level buffers
        for r in group:
            for node in gnodes:
                node.shred(r.get(node.name), 0, 0)
        gleaves = [leaf for node in gnodes for leaf in node.leaves]
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
    root = [(4, T_BINARY, "schema"), (5, T_I32, len(names))]  # the top-level columns
    footer = thrift_struct([(1, T_I32, 1), (2, T_LIST, (T_STRUCT, [root] + elements)), (3, T_I64, len(rows)),
                            (4, T_LIST, (T_STRUCT, meta_groups)), (6, T_BINARY, "tests/parquetbed.py")])
    body += footer + struct.pack("<I", len(footer)) + b"PAR1"
    with open(path, "wb") as fh:
        fh.write(bytes(body))
    return path
