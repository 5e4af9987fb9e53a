"""Fuzzing the safetensors and GGUF readers with mutations of valid files.

Every case starts from a small valid seed file (written by the safetensors package / gguf-py, the
independent references) and mutates it: bit flips in the header, truncations at every field boundary,
huge claimed lengths and counts, overflowing dims, wrong JSON types, duplicated names, shuffled offsets,
random bytes, and structure-level rewrites (a GGUF rebuilt from edited key/values and tensor infos, a
safetensors header re-serialized from an edited JSON object). Each case must either

  * load AND materialize every tensor (raw, cast to float32, dequantized) equal to what the safetensors
    package / gguf-py read from the same bytes, or
  * raise `LazyWeightsError`,

within a time bound (`CASE_SECONDS`), without crashing, hanging or blowing up memory. Anything else (another
exception, a value that differs from the reference, a file we accept but the reference refuses) is a bug.

The same mutation engine has two drivers: hypothesis (`st.data()`, derandomized, a few hundred cases per
format in the default run) and a seeded `random.Random` (`benchmarks/fuzz_long.py` runs >= 10,000 cases
per format in a subprocess pool under `RLIMIT_AS`; the `slow` tests below run it too).

Run one case by hand:  python benchmarks/fuzz_long.py --replay safetensors 1234
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import resource
import signal
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import pytest

CASE_SECONDS = 2.0          # every case must finish (load + materialize) within this
FUZZ_SEED = 20240611        # seeds of the random driver: case i of format f uses Random(f"{f}-{SEED}-{i}")
DEFAULT_CASES = int(os.environ.get("LW_FUZZ_CASES", "400"))  # per format, in the default (hypothesis) run

INTERESTING_INTS = [0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 33, 63, 64, 255, 256, 4095, 4096, 65535, 65536,
                    2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**40, 2**53, 2**62, 2**63 - 1, 2**63,
                    2**63 + 1, 2**64 - 32, 2**64 - 1]


# --- choosers: one engine, two drivers ---------------------------------------------------------------------
class RandomChooser:
    """Decisions from a seeded `random.Random` (the long run)."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, seq):
        return seq[self.rng.randrange(len(seq))]

    def bytes(self, n: int) -> bytes:
        return bytes(self.rng.getrandbits(8) for _ in range(n))


class HypothesisChooser:
    """Decisions drawn from hypothesis (`st.data()`), so failures shrink."""

    def __init__(self, data):
        from hypothesis import strategies as st

        self.data, self.st = data, st

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))

    def choice(self, seq):
        return seq[self.int(0, len(seq) - 1)]

    def bytes(self, n: int) -> bytes:
        return self.data.draw(self.st.binary(min_size=n, max_size=n))


def _interesting(ch, around: int | None = None) -> int:
    k = ch.int(0, 3)
    if k == 0 and around is not None:
        return max(0, around + ch.int(-2, 2))
    if k == 1:
        return ch.int(0, 2**64 - 1)
    return ch.choice(INTERESTING_INTS)


# --- seeds --------------------------------------------------------------------------------------------------
def safetensors_seed() -> bytes:
    """A small valid safetensors file with every dtype code lazyweights reads, a 0-d and an empty tensor,
    and metadata that looks like code (it must stay a string)."""
    import ml_dtypes
    from safetensors.numpy import save

    rng = np.random.default_rng(7)
    tensors = {
        "model.embed.weight": rng.standard_normal((3, 4)).astype(np.float32),
        "model.layers.0.q.weight": rng.standard_normal((5,)).astype(np.float16),
        "model.layers.0.k.weight": rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16),
        "model.layers.0.f8": rng.standard_normal((4,)).astype(ml_dtypes.float8_e4m3fn),
        "model.layers.0.f8b": rng.standard_normal((2, 2)).astype(ml_dtypes.float8_e5m2),
        "model.layers.0.e8m0": np.array([1.0, 0.5], ml_dtypes.float8_e8m0fnu),
        "model.layers.0.i64": np.array([-1, 2**40], np.int64),
        "model.layers.0.i8": np.array([[-3, 4], [5, -6]], np.int8),
        "model.layers.0.u16": np.array([1, 65535], np.uint16),
        "model.layers.0.mask": np.array([True, False, True]),
        "model.layers.0.f64": np.array([1e-300], np.float64),
        "model.empty": np.zeros((0, 4), np.uint8),
        "model.scale": np.array(0.125, np.float32),
    }
    blob = save(tensors, metadata={"format": "pt", "note": "__import__('os').system('touch /tmp/lw-pwned')"})
    # The package writes __metadata__ from a hash map (its key order changes between runs): fix the order so
    # case i is the same bytes in every process.
    n, header, data = _st_split(blob)
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    raw = json.dumps(header, separators=(",", ":")).encode()
    return _st_pack(None, data, raw=raw + b" " * (-(8 + len(raw)) % 8))


_GGUF_SEED: bytes | None = None


def gguf_seed() -> bytes:
    """A small valid GGUF v3 file written by gguf-py: every scalar value type, string/int/float/bool and
    nested arrays, plain tensors (f32/f16/bf16/i8, 1-3 dims) and quantized ones (legacy, K, IQ, ternary)."""
    global _GGUF_SEED
    if _GGUF_SEED is not None:
        return _GGUF_SEED
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFValueType as V

    rng = np.random.default_rng(11)

    def blocks(rows, cols, qt):
        block, size = gguf.GGML_QUANT_SIZES[qt]
        b = rng.integers(0, 256, (rows, cols // block * size), dtype=np.uint8)
        return b

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "seed.gguf")
        w = gguf.GGUFWriter(path, "llama")
        w.add_name("fuzz seed")
        w.add_block_count(1)
        for key, value, vt, sub in [
            ("t.u8", 200, V.UINT8, None), ("t.i8", -100, V.INT8, None), ("t.u16", 60000, V.UINT16, None),
            ("t.i16", -30000, V.INT16, None), ("t.u32", 4_000_000_000, V.UINT32, None),
            ("t.i32", -2_000_000_000, V.INT32, None), ("t.u64", 2**63 + 5, V.UINT64, None),
            ("t.i64", -(2**62), V.INT64, None), ("t.f32", 0.5, V.FLOAT32, None), ("t.f64", 1e-300, V.FLOAT64, None),
            ("t.bool", True, V.BOOL, None),
            ("t.code", "__import__('os').system('touch /tmp/lw-pwned')", V.STRING, None),
            ("t.strs", ["a", "", "☃", "<0x0A>"], V.ARRAY, V.STRING), ("t.ints", [1, -2, 3], V.ARRAY, V.INT32),
            ("t.floats", [0.25, -1.5], V.ARRAY, V.FLOAT32), ("t.bools", [True, False], V.ARRAY, V.BOOL),
            ("t.nested", [[1, 2], [3]], V.ARRAY, V.ARRAY),
        ]:
            w.add_key_value(key, value, vt, sub_type=sub)
        w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((4, 8)).astype(np.float32))
        w.add_tensor("blk.0.attn_k.weight", rng.standard_normal((2, 8)).astype(np.float16))
        w.add_tensor("blk.0.attn_v.weight",
                     gguf.quants.quantize(rng.standard_normal((2, 4)).astype(np.float32), Q.BF16), raw_dtype=Q.BF16)
        w.add_tensor("blk.0.i8", np.array([1, -2, 3], np.int8))
        w.add_tensor("token_embd.weight", rng.standard_normal((3, 2, 4)).astype(np.float32))
        w.add_tensor("blk.0.q8_0", gguf.quants.quantize(rng.standard_normal((2, 32)).astype(np.float32), Q.Q8_0),
                     raw_dtype=Q.Q8_0)
        w.add_tensor("blk.0.q4_0", gguf.quants.quantize(rng.standard_normal((1, 64)).astype(np.float32), Q.Q4_0),
                     raw_dtype=Q.Q4_0)
        for qt in (Q.Q4_K, Q.Q6_K, Q.IQ2_XXS, Q.IQ4_NL, Q.IQ1_S, Q.TQ2_0):
            block = gguf.GGML_QUANT_SIZES[qt][0]
            w.add_tensor(f"blk.0.{qt.name.lower()}", blocks(1, max(block, 32), qt), raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "rb") as fh:
            _GGUF_SEED = fh.read()
    return _GGUF_SEED


# --- GGUF structure: a walker for valid files and a builder -------------------------------------------------
_GGUF_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes


@dataclass
class GGUFDoc:
    """A parsed (valid) GGUF: what the builder needs to write it back, and every field's byte span."""

    version: int
    kvs: list  # [key bytes, value type, encoded value bytes]
    infos: list  # [name bytes, ne list, ggml type, offset]
    data: bytes
    data_start: int
    fields: list = field(default_factory=list)  # (offset, size, kind)


def parse_gguf(b: bytes) -> GGUFDoc:
    """Walk a valid GGUF (the seed) recording every field; trusts the input."""
    pos = 4
    fields = [(0, 4, "magic")]

    def u(fmt, kind):
        nonlocal pos
        n = struct.calcsize(fmt)
        v = struct.unpack_from(fmt, b, pos)[0]
        fields.append((pos, n, kind))
        pos += n
        return v

    def string(kind):
        nonlocal pos
        n = u("<Q", f"{kind}-len")
        fields.append((pos, n, f"{kind}-bytes"))
        s = b[pos:pos + n]
        pos += n
        return s

    def value(t):
        nonlocal pos
        if t in _GGUF_SCALAR:
            fields.append((pos, _GGUF_SCALAR[t], "scalar"))
            pos += _GGUF_SCALAR[t]
        elif t == 8:
            string("string")
        else:
            sub = u("<I", "array-type")
            count = u("<Q", "array-count")
            for _ in range(count):
                value(sub)

    version = u("<I", "version")
    n_t = u("<Q", "tensor-count")
    n_kv = u("<Q", "kv-count")
    kvs = []
    for _ in range(n_kv):
        key = string("key")
        t = u("<I", "value-type")
        start = pos
        value(t)
        kvs.append([key, t, b[start:pos]])
    infos = []
    for _ in range(n_t):
        name = string("name")
        nd = u("<I", "n-dims")
        ne = [u("<Q", "dim") for _ in range(nd)]
        t = u("<I", "ggml-type")
        off = u("<Q", "offset")
        infos.append([name, ne, t, off])
    data_start = -(-pos // 32) * 32
    fields.append((data_start, 0, "data-start"))
    return GGUFDoc(version, kvs, infos, b[data_start:], data_start, fields)


def build_gguf(doc: GGUFDoc, *, magic=b"GGUF", n_tensors=None, n_kv=None, n_dims=None, pad_to=32) -> bytes:
    out = [magic, struct.pack("<IQQ", doc.version, len(doc.infos) if n_tensors is None else n_tensors,
                              len(doc.kvs) if n_kv is None else n_kv)]
    for key, t, val in doc.kvs:
        out += [struct.pack("<Q", len(key)), key, struct.pack("<I", t), val]
    for i, (name, ne, t, off) in enumerate(doc.infos):
        nd = len(ne) if not n_dims or i not in n_dims else n_dims[i]
        out += [struct.pack("<Q", len(name)), name, struct.pack("<I", nd),
                b"".join(struct.pack("<Q", d % 2**64) for d in ne), struct.pack("<IQ", t % 2**32, off % 2**64)]
    head = b"".join(out)
    if pad_to:
        head += b"\0" * (-len(head) % pad_to)
    return head + doc.data


def _clone(doc: GGUFDoc) -> GGUFDoc:
    return GGUFDoc(doc.version, [list(kv) for kv in doc.kvs], [[n, list(ne), t, o] for n, ne, t, o in doc.infos],
                   doc.data, doc.data_start, doc.fields)


# --- byte-level mutations (both formats) ---------------------------------------------------------------------
def _bitflips(b: bytes, ch, lo: int, hi: int) -> bytes:
    out = bytearray(b)
    hi = min(hi, len(out))
    if hi <= lo:
        return bytes(out)
    for _ in range(ch.int(1, 8)):
        i = ch.int(lo, hi - 1)
        out[i] ^= 1 << ch.int(0, 7)
    return bytes(out)


def _overwrite(b: bytes, off: int, new: bytes) -> bytes:
    return b[:off] + new + b[off + len(new):]


# --- safetensors mutations -------------------------------------------------------------------------------------
def _st_split(b: bytes):
    (n,) = struct.unpack_from("<Q", b, 0)
    return n, json.loads(b[8:8 + n]), b[8 + n:]


def _st_pack(header, data: bytes, *, raw: bytes | None = None, length=None) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode() if raw is None else raw
    return struct.pack("<Q", (len(raw) if length is None else length) % 2**64) + raw + data


_ST_DTYPES = ["BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "BF16", "F32", "F64",
              "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F8_E4M3FNUZ", "C64", "f32", "", "F32 ", 5, None,
              ["F32"], {"F32": 1}, True]


def _bad_shape(ch, shape):
    options = [
        [], [-1], [2**63], [2**64], [2**62, 0], [0, 2**62], [2**40, 0], [0, 2**63 - 1], [2**31, 2**31, 0],
        [1.5], ["2"], None, {}, [True], [1] * ch.int(9, 100), [2**32, 2**32], [2**21] * 3,
        list(reversed(shape)), shape + [1], shape[:-1], [d + 1 for d in shape], [0] * len(shape),
        [ch.choice(INTERESTING_INTS) for _ in range(ch.int(0, 4))], "[3,4]", [[3], [4]], [-0.0],
    ]
    return ch.choice(options)


def _bad_offsets(ch, offs, size):
    b, e = offs
    options = [[e, b], [b, e + 1], [b - 1, e], [b + 1, e + 1], [b, b], [0, 0], [2**64, 2**64 + 4],
               [-4, 0], [b], [b, e, e], None, [float(b), float(e)], [str(b), str(e)], [b, 2**63],
               [size, size + (e - b)], [_interesting(ch, b), _interesting(ch, e)], [True, e]]
    return ch.choice(options)


def mutate_safetensors(ch, seed: bytes) -> tuple[str, bytes]:
    n, header, data = _st_split(seed)
    names = [k for k in header if k != "__metadata__"]
    kind = ch.choice(["bitflip-header", "bitflip-length", "truncate", "length", "dtype", "shape", "offsets",
                      "swap-offsets", "entry-type", "extra-key", "drop-entry", "duplicate-name", "rename",
                      "metadata", "root", "json-text", "padding", "data-bytes", "append", "random", "splice",
                      "multi"])
    if kind == "multi":  # several structural edits at once
        out = seed
        for _ in range(ch.int(2, 4)):
            _, out2 = mutate_safetensors(ch, seed)
            out = out2 if ch.int(0, 1) else out
        return kind, out
    if kind == "bitflip-header":
        return kind, _bitflips(seed, ch, 8, 8 + n)
    if kind == "bitflip-length":
        return kind, _bitflips(seed, ch, 0, 8)
    if kind == "truncate":
        bounds = [0, 1, 7, 8, 9, 8 + n - 1, 8 + n, 8 + n + 1, len(seed) - 1]
        for k in names:
            b, e = header[k]["data_offsets"]
            bounds += [8 + n + b, 8 + n + e - 1, 8 + n + e + 1]
        cut = ch.choice(bounds) if ch.int(0, 3) else ch.int(0, len(seed))
        return kind, seed[:max(0, min(cut, len(seed)))]
    if kind == "length":
        return kind, _overwrite(seed, 0, struct.pack("<Q", ch.choice(
            [n + 1, n - 1, 0, 1, 2, len(seed), len(seed) - 8, len(seed) - 7, 100_000_000, 100_000_001,
             2**63, 2**64 - 1, _interesting(ch, n)]) % 2**64))
    if kind == "random":
        return kind, ch.bytes(ch.int(0, 64)) if ch.int(0, 1) else seed[:8] + ch.bytes(ch.int(0, 2 * n))
    if kind == "splice":  # random bytes over part of the header
        at = ch.int(8, 8 + n - 1)
        return kind, _overwrite(seed, at, ch.bytes(ch.int(1, 16)))[:len(seed)]
    if kind == "data-bytes":  # valid layout, different tensor bytes: must load and match the reference
        if not data:
            return kind, seed
        at = ch.int(0, len(data) - 1)
        return kind, seed[:8 + n] + _overwrite(data, at, ch.bytes(min(len(data) - at, ch.int(1, 64))))
    if kind == "append":
        return kind, seed + ch.bytes(ch.int(1, 16))
    if kind == "padding":  # whitespace or junk after the JSON, inside the declared length
        pad = ch.choice([b" " * ch.int(1, 9), b"\n", b"\0", b"\t ", b" x"])
        raw = json.dumps(header, separators=(",", ":")).encode() + pad
        return kind, _st_pack(None, data, raw=raw)
    if kind == "json-text":
        raw = ch.choice([b"[" * 100_000, b"{" * 50_000, b'{"a":' * 20_000, b"1e99999", b"NaN", b'"x"', b"null",
                         b'{"a":{"dtype":"F32","shape":[1e400],"data_offsets":[0,4]}}',
                         b'{"a":{"dtype":"F32","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,4]}}',
                         b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}', b"\xff\xfe{}", b"{}",
                         b'{"\xed\xa0\x80":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}',
                         b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"dtype":"I8"}}',
                         b'{"__metadata__":{"k":"v","k":"w"}}', b'{"__metadata__":null}'])
        return kind, _st_pack(None, ch.choice([b"", b"\0" * 4, data]), raw=raw)
    if kind == "root":
        return kind, _st_pack(ch.choice([[], "x", 3, None, [header], True]), data)
    if kind == "metadata":
        header["__metadata__"] = ch.choice([None, [], "x", {"k": 1}, {"k": None}, {"k": {"a": "b"}}, {"k": ["a"]},
                                            {"": ""}, {"eval": "__import__('os').system('touch /tmp/lw-pwned')"},
                                            {"k": "v" * 10_000}, {str(i): str(i) for i in range(ch.int(0, 500))}])
        return kind, _st_pack(header, data)
    # per-entry edits
    name = ch.choice(names)
    entry = header[name]
    if kind == "dtype":
        entry["dtype"] = ch.choice(_ST_DTYPES)
    elif kind == "shape":
        entry["shape"] = _bad_shape(ch, list(entry["shape"]))
    elif kind == "offsets":
        entry["data_offsets"] = _bad_offsets(ch, entry["data_offsets"], len(data))
    elif kind == "swap-offsets":
        other = header[ch.choice(names)]
        entry["data_offsets"], other["data_offsets"] = other["data_offsets"], entry["data_offsets"]
    elif kind == "entry-type":
        header[name] = ch.choice([None, [], "F32", 1, [entry], {"dtype": "F32"}])
    elif kind == "extra-key":
        entry[ch.choice(["extra", "__metadata__", "dtype2", ""])] = ch.choice([1, "x", None, [1]])
    elif kind == "drop-entry":
        del header[name]
    elif kind == "duplicate-name":  # two entries with one name, only expressible in JSON text
        other = ch.choice(names)
        raw = json.dumps(header, separators=(",", ":")).encode()
        key = json.dumps(other).encode() + b":"
        dup = json.dumps(name).encode() + b":"
        if other != name:
            raw = raw.replace(key, dup, 1)
        else:
            raw = raw.replace(b"{" + dup, b"{" + dup + json.dumps(entry).encode() + b"," + dup, 1)
        return kind, _st_pack(None, data, raw=raw)
    elif kind == "rename":
        new = ch.choice(["", "__metadata__", "a" * 5000, "\u2603", "x\x00y", "../../etc/passwd",
                         "model.layers.0.q.weight"])
        header[new] = header.pop(name)
    return kind, _st_pack(header, data)


# --- GGUF mutations ------------------------------------------------------------------------------------------
_INT_FIELDS = ("version", "tensor-count", "kv-count", "key-len", "value-type", "string-len", "array-type",
               "array-count", "name-len", "n-dims", "dim", "ggml-type", "offset", "scalar")


def mutate_gguf(ch, seed: bytes) -> tuple[str, bytes]:
    doc = parse_gguf(seed)
    kind = ch.choice(["bitflip-header", "bitflip-any", "truncate", "set-field", "shuffle-offsets", "dup-name",
                      "dup-key", "alignment", "dims", "ggml-type", "offsets", "version", "counts", "split",
                      "bad-utf8", "deep-array", "array-type", "data-bytes", "random", "append", "magic", "multi"])
    if kind == "multi":
        out = seed
        for _ in range(ch.int(2, 3)):
            out = mutate_gguf(ch, seed)[1] if ch.int(0, 1) else out
        return kind, out
    if kind == "bitflip-header":
        return kind, _bitflips(seed, ch, 0, doc.data_start)
    if kind == "bitflip-any":
        return kind, _bitflips(seed, ch, 0, len(seed))
    if kind == "truncate":
        off, size, _ = ch.choice(doc.fields)
        cut = ch.choice([off, off + size, off + 1, off + size - 1]) if ch.int(0, 3) else ch.int(0, len(seed))
        return kind, seed[:max(0, min(cut, len(seed)))]
    if kind == "set-field":
        ints = [f for f in doc.fields if f[2].split("-bytes")[0] in _INT_FIELDS or f[2].endswith("-len")]
        off, size, fk = ch.choice(ints)
        cur = int.from_bytes(seed[off:off + size], "little")
        v = _interesting(ch, cur) % (1 << (8 * size))
        return f"{kind}:{fk}", _overwrite(seed, off, v.to_bytes(size, "little"))
    if kind == "data-bytes":
        at = ch.int(doc.data_start, len(seed) - 1)
        return kind, _overwrite(seed, at, ch.bytes(min(len(seed) - at, ch.int(1, 64))))
    if kind == "random":
        return kind, (b"GGUF" + ch.bytes(ch.int(0, 200))) if ch.int(0, 1) else ch.bytes(ch.int(0, 64))
    if kind == "append":
        return kind, seed + ch.bytes(ch.int(1, 40))
    if kind == "magic":
        return kind, ch.choice([b"GGUF"[::-1], b"GGML", b"gguf", b"\0GGU"]) + seed[4:]
    doc = _clone(doc)
    kw = {}
    if kind == "shuffle-offsets":
        offs = [i[3] for i in doc.infos]
        perm = offs[:]
        for i in range(len(perm) - 1, 0, -1):
            j = ch.int(0, i)
            perm[i], perm[j] = perm[j], perm[i]
        for info, o in zip(doc.infos, perm):
            info[3] = o
    elif kind == "dup-name":
        a, b = ch.choice(doc.infos), ch.choice(doc.infos)
        b[0] = a[0]
    elif kind == "dup-key":
        a, b = ch.choice(doc.kvs), ch.choice(doc.kvs)
        b[0] = a[0]
    elif kind == "alignment":
        t = ch.choice([4, 4, 4, 10, 5, 8])
        v = ch.choice([0, 1, 2, 3, 8, 16, 48, 64, 2**31, 2**32 - 1, 4096])
        enc = struct.pack("<Q", v) if t == 10 else (b"\x01\0\0\0\0\0\0\0x" if t == 8 else struct.pack("<I", v))
        doc.kvs.append([b"general.alignment", t, enc])
        kw["pad_to"] = v if t == 4 and v and not v & (v - 1) and v <= 4096 else 32
    elif kind == "dims":
        info = ch.choice(doc.infos)
        info[1] = ch.choice([[], [0], [0, 2**62], [2**62, 0], [2**32, 2**32], [2**63, 1], [2**64 - 1],
                             [1] * ch.int(5, 12), [info[1][0] + 1] + info[1][1:], list(reversed(info[1])),
                             [2**21] * 3, [0, 2**63 - 1, 2], [_interesting(ch) for _ in range(ch.int(1, 4))],
                             info[1] + [2**40, 0]])
        if ch.int(0, 3) == 0:  # n_dims disagreeing with the dims that follow
            kw["n_dims"] = {doc.infos.index(info): ch.choice([0, 9, 2**31, 2**32 - 1, len(info[1]) + 1])}
    elif kind == "ggml-type":
        ch.choice(doc.infos)[2] = ch.choice(list(range(0, 42)) + [2**31, 2**32 - 1])
    elif kind == "offsets":
        info = ch.choice(doc.infos)
        info[3] = ch.choice([1, 4, 31, 33, 2**40, 2**63, 2**64 - 32, 2**64 - 1, len(doc.data), len(doc.data) - 32,
                             ch.choice(doc.infos)[3], _interesting(ch, info[3])])
    elif kind == "version":
        doc.version = ch.choice([0, 1, 2, 4, 0x03000000, 2**32 - 1])
    elif kind == "counts":
        kw[ch.choice(["n_tensors", "n_kv"])] = ch.choice([0, 1, len(doc.infos) + 1, len(doc.kvs) + 1, 2**31,
                                                          2**60, 2**64 - 1, _interesting(ch)])
    elif kind == "split":
        doc.kvs.append([b"split.count", 2, struct.pack("<H", ch.choice([0, 1, 2, 3, 65535]))])
        if ch.int(0, 1):
            doc.kvs.append([b"split.no", 2, struct.pack("<H", ch.choice([0, 1, 5]))])
        if ch.int(0, 1):
            doc.kvs.append([b"split.tensors.count", 5, struct.pack("<i", ch.choice([-1, 0, 3, len(doc.infos)]))])
    elif kind == "bad-utf8":
        bad = ch.choice([b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"a\x00b", b""])
        if ch.int(0, 1):
            ch.choice(doc.infos)[0] = bad
        else:
            ch.choice(doc.kvs)[0] = bad if ch.int(0, 1) else b"k" + bad
            if ch.int(0, 1):
                doc.kvs.append([b"t.badstr", 8, struct.pack("<Q", len(bad)) + bad])
    elif kind == "deep-array":
        depth = ch.int(1, 40)
        body = b"".join(struct.pack("<IQ", 9, 1) for _ in range(depth - 1)) + struct.pack("<IQ", 0, 1) + b"\x07"
        doc.kvs.append([b"t.deep", 9, body])
    elif kind == "array-type":
        sub = ch.choice(list(range(0, 14)) + [2**31])
        count = ch.choice([0, 1, 3, 2**40, 2**64 - 1])
        doc.kvs.append([b"t.arr", 9, struct.pack("<IQ", sub % 2**32, count) + ch.bytes(ch.int(0, 24))])
    return kind, build_gguf(doc, **kw)


MUTATORS = {"safetensors": (mutate_safetensors, safetensors_seed), "gguf": (mutate_gguf, gguf_seed)}


def make_case(fmt: str, ch) -> tuple[str, bytes]:
    mutate, seed = MUTATORS[fmt]
    return mutate(ch, seed())


def random_case(fmt: str, index: int, seed: int = FUZZ_SEED) -> tuple[str, bytes]:
    """Case `index` of the deterministic random driver."""
    return make_case(fmt, RandomChooser(random.Random(f"{fmt}-{seed}-{index}")))


# --- checking one case ---------------------------------------------------------------------------------------
class Mismatch(AssertionError):
    """lazyweights and the reference reader disagree about a file both accept (or only we accept)."""


@dataclass
class Outcome:
    kind: str      # "loaded-ok" | "LazyWeightsError" | "other-exception" | "mismatch"
    detail: str = ""
    seconds: float = 0.0
    tensors: int = 0


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    # (gguf-py gives BF16 as uint8 rows of bytes: compare the bytes; shapes are checked against the header)
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b, equal_nan=True))


def _reference_safetensors(data: bytes):
    from safetensors import deserialize

    try:
        return {k: v for k, v in deserialize(bytes(data))}, None
    except Exception as e:  # noqa: BLE001 - any refusal
        return None, e


def _check_safetensors(path: str, data: bytes, w, block_bytes) -> int:
    import lazyweights as lw
    from lazyweights.formats.safetensors import DTYPE_CODES

    ref, err = _reference_safetensors(data)
    if ref is None:
        raise Mismatch(f"lazyweights accepts a file the safetensors package refuses: {err}")
    names = [n for n, _ in w.items()]
    if sorted(names) != sorted(ref):
        raise Mismatch(f"tensor names differ: {sorted(names)} vs {sorted(ref)}")
    wants, expect = {}, {}
    for n in names:
        r = ref[n]
        rec = w.records[n]
        if DTYPE_CODES[r["dtype"]] is not rec.dtype or list(rec.shape) != list(r["shape"]):
            raise Mismatch(f"{n}: {rec.dtype.name}{list(rec.shape)} vs {r['dtype']}{r['shape']}")
        arr = np.frombuffer(bytes(r["data"]), rec.dtype.to_numpy()).reshape(rec.shape)
        wd = w[n].data()
        wants[n], expect[n] = wd, ("bytes", arr)
        if arr.size <= 1 << 16:  # a fused value op over the same (maybe hostile) shape
            wants[n + "#f32"] = wd.astype(lw.DType.float32)
            expect[n + "#f32"] = ("values", arr.astype(np.float32))
    _compare(lw.plan(wants).materialize(scheduler="sync", block_bytes=block_bytes), expect, w.records)
    return len(names)


def _check_gguf(path: str, w, block_bytes) -> int:
    import gguf

    import lazyweights as lw

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001
        if isinstance(e, IndexError) and any(not r.shape and r.extra["ggml_type"] in (30,) for r in w.records.values()):
            # gguf-py cannot shape a tensor with 0 dims of a type it reads as bytes (BF16: it indexes
            # shape[-1]); llama.cpp reads n_dims=0 as one element, as we do. Check against the file's bytes.
            with open(path, "rb") as fh:
                raw = fh.read()
            wants = {n: w[n].data() for n in w.records}
            got = lw.plan(wants).materialize(scheduler="sync", block_bytes=block_bytes)
            for n, r in w.records.items():
                if got[n].tobytes() != raw[r.offset:r.offset + r.nbytes] or got[n].shape != r.shape:
                    raise Mismatch(f"{n}: materialized bytes differ from the file's") from None
            return len(wants)
        raise Mismatch(f"lazyweights accepts a file gguf-py refuses: {type(e).__name__}: {e}") from None
    ref = {t.name: t for t in reader.tensors}
    names = [n for n, _ in w.items()]
    if sorted(names) != sorted(ref):
        raise Mismatch(f"tensor names differ: {sorted(names)} vs {sorted(ref)}")
    wants, expect = {}, {}
    for n in names:
        t, rec = ref[n], w.records[n]
        if int(t.tensor_type) != rec.extra["ggml_type"] or [int(d) for d in t.shape] != list(rec.extra["ne"]):
            raise Mismatch(f"{n}: type/ne {rec.extra} vs {t.tensor_type.name} {list(t.shape)}")
        raw = np.asarray(t.data)
        wd = w[n].data()
        wants[n], expect[n] = wd, ("bytes", raw)
        if rec.encoding is not None and raw.size <= 1 << 16:
            try:
                deq = gguf.quants.dequantize(raw, t.tensor_type)
            except (NotImplementedError, ValueError):
                deq = None
            if deq is not None:
                wants[n + "#deq"] = wd.dequantize()
                expect[n + "#deq"] = ("values", np.asarray(deq, np.float32).reshape(wd.dequantize().shape))
        elif rec.encoding is None and rec.dtype.is_float and raw.size <= 1 << 16:
            wants[n + "#f32"] = wd.astype(lw.DType.float32)
            vals = raw.view(rec.dtype.to_numpy()).reshape(rec.shape) if raw.dtype == np.uint8 else raw
            expect[n + "#f32"] = ("values", vals.astype(np.float32))
    _compare(lw.plan(wants).materialize(scheduler="sync", block_bytes=block_bytes), expect, w.records)
    # metadata: every key gguf-py can decode must read the same
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            theirs = f.contents()
        except Exception:  # noqa: BLE001 - gguf-py cannot decode it (invalid UTF-8, nested arrays...)
            continue
        ours = w.metadata.get(key) if key not in ("split.no", "split.count", "split.tensors.count") else theirs
        if getattr(ours, "type", None) is not None and int(ours.type) == 9:
            continue  # gguf-py flattens nested arrays ([[1, 2], [3]] -> [1, 2, 3]); we keep the nesting
        ours = ours.tolist() if hasattr(ours, "tolist") else ours
        if not _meta_equal(ours, theirs):
            raise Mismatch(f"metadata {key!r}: {ours!r} vs gguf-py {theirs!r}")
    return len(names)


def _meta_equal(a, b) -> bool:
    """Equality where NaN equals NaN (a bit-flipped float in a metadata array is a NaN on both sides)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_meta_equal(x, y) for x, y in zip(a, b))
    return a == b


def _compare(got: dict, expect: dict, records=None) -> None:
    for n, (how, ref) in expect.items():
        a = got[n]
        if how == "bytes" and tuple(a.shape) != tuple(records[n].shape):
            raise Mismatch(f"{n}: materialized shape {a.shape} is not the header's {records[n].shape}")
        ok = _same_bytes(a, ref) if how == "bytes" else _same_values(np.asarray(a), ref)
        if not ok:
            raise Mismatch(f"{n}: materialized {how} differ from the reference")


def check_case(fmt: str, data: bytes, workdir: str, block_bytes: int | None = None) -> Outcome:
    """Load `data` as a `fmt` file; materialize everything and compare with the reference reader."""
    import lazyweights as lw
    from lazyweights.formats.source import SourceFile

    path = os.path.join(workdir, "case.safetensors" if fmt == "safetensors" else "case.gguf")
    with open(path, "wb") as fh:
        fh.write(data)
    t0 = time.perf_counter()
    try:
        try:
            with np.errstate(all="ignore"):
                w = lw.load_weights(path)
                n = (_check_safetensors(path, data, w, block_bytes) if fmt == "safetensors"
                     else _check_gguf(path, w, block_bytes))
            return Outcome("loaded-ok", "", time.perf_counter() - t0, n)
        except Mismatch as e:
            return Outcome("mismatch", str(e)[:500], time.perf_counter() - t0)
        except lw.LazyWeightsError as e:
            return Outcome("LazyWeightsError", f"{type(e).__name__}: {e}"[:300], time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - exactly what we are looking for
            import traceback

            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-4:])
            return Outcome("other-exception", f"{type(e).__name__}: {e}\n{tb}"[:1500], time.perf_counter() - t0)
    finally:
        SourceFile._cache.pop(os.path.abspath(path), None)  # each case is a new file: drop its map
        os.unlink(path)


def warm_up(workdir: str) -> None:
    """Compile the kernels the checks use, so JIT time is not charged to the first case."""
    for fmt in MUTATORS:
        out = check_case(fmt, MUTATORS[fmt][1](), workdir)
        assert out.kind == "loaded-ok", out


def peak_rss_reset() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- the default run: hypothesis, derandomized -----------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz_dir():
    with tempfile.TemporaryDirectory(prefix="lw-fuzz-") as d:
        warm_up(d)
        yield d


class _Alarm(Exception):
    pass


def _run_guarded(fmt, data, workdir, stats):
    """check_case under a hard time guard (SIGALRM) and an address-space limit, in this process."""

    def on_alarm(signum, frame):
        raise _Alarm()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 10 * CASE_SECONDS)
    try:
        stats["n"] = stats.get("n", 0) + 1
        out = check_case(fmt, data, workdir, block_bytes=64 if stats["n"] % 2 else None)  # many blocks / one
    except _Alarm:
        out = Outcome("timeout", "SIGALRM after 10 x CASE_SECONDS")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    kinds = stats.setdefault("kinds", {})
    kinds[out.kind] = kinds.get(out.kind, 0) + 1
    stats["max_s"] = max(stats.get("max_s", 0.0), out.seconds)
    return out


@pytest.fixture
def address_space_limit():
    """Cap this process's address space (current + 3 GiB) while fuzzing: a header that makes us allocate
    what it claims fails with MemoryError (reported as a bug) instead of taking the machine down."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as fh:
        vm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + (3 << 30), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _hypothesis_fuzz(fmt, fuzz_dir, n_cases):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    stats: dict = {}

    @settings(max_examples=n_cases, derandomize=True, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data):
        kind, blob = make_case(fmt, HypothesisChooser(data))
        out = _run_guarded(fmt, blob, fuzz_dir, stats)
        assert out.kind in ("loaded-ok", "LazyWeightsError"), (kind, out.kind, out.detail)
        assert out.seconds < CASE_SECONDS, (kind, out.seconds)

    run()
    return stats


@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
def test_fuzz_hypothesis(fmt, fuzz_dir, address_space_limit):
    """DEFAULT_CASES derandomized hypothesis cases per format: load-and-match or LazyWeightsError, < 2 s."""
    stats = _hypothesis_fuzz(fmt, fuzz_dir, DEFAULT_CASES)
    kinds = stats["kinds"]
    print(f"\n{fmt}: {sum(kinds.values())} cases {kinds} max {stats['max_s'] * 1000:.1f} ms")
    assert kinds.get("loaded-ok", 0) > 0 and kinds.get("LazyWeightsError", 0) > 0


@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
def test_fuzz_random_driver_smoke(fmt, fuzz_dir, address_space_limit):
    """The long run's driver (seeded random) on its first 100 cases, in-process."""
    stats: dict = {}
    for i in range(100):
        kind, blob = random_case(fmt, i)
        out = _run_guarded(fmt, blob, fuzz_dir, stats)
        assert out.kind in ("loaded-ok", "LazyWeightsError"), (i, kind, out.kind, out.detail)
        assert out.seconds < CASE_SECONDS, (i, kind, out.seconds)


def test_seeds_load_and_match_references(fuzz_dir):
    for fmt in MUTATORS:
        out = check_case(fmt, MUTATORS[fmt][1](), fuzz_dir)
        assert out.kind == "loaded-ok" and out.tensors >= 10, out


@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
def test_mutators_are_deterministic(fmt):
    assert random_case(fmt, 5) == random_case(fmt, 5)
    kinds = {random_case(fmt, i)[0].split(":")[0] for i in range(300)}
    assert len(kinds) >= 15, kinds  # the driver reaches (nearly) every mutation kind


# --- the long run, as a test (marked slow: not in the default run) -------------------------------------------------
def _fuzz_long(monkeypatch):
    """benchmarks/fuzz_long.py, loaded from its file (no sys.path edit here). Its pool workers run it as a
    script and `import test_fuzz`: PYTHONPATH names this folder for them."""
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    mod = sys.modules.get("fuzz_long")
    if mod is None:
        path = os.path.join(os.path.dirname(os.path.dirname(here)), "benchmarks", "fuzz_long.py")
        spec = importlib.util.spec_from_file_location("fuzz_long", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["fuzz_long"] = mod
        spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
def test_fuzz_long_pool(fmt, tmp_path, monkeypatch):
    """10,000 cases per format in a subprocess pool under RLIMIT_AS (benchmarks/fuzz_long.py)."""
    fuzz_long = _fuzz_long(monkeypatch)
    table = fuzz_long.run_pool([fmt], int(os.environ.get("LW_FUZZ_LONG_CASES", "10000")),
                               crash_dir=str(tmp_path))
    row = table[fmt]
    assert row["other-exception"] == row["crash"] == row["timeout"] == row["mismatch"] == 0, row
    assert row["max_s"] < CASE_SECONDS, row


# --- regressions: cases the fuzzer found ---------------------------------------------------------------------------
def _st_file(tmp_path, header: dict, data: bytes = b"") -> str:
    p = tmp_path / "r.safetensors"
    p.write_bytes(_st_pack(header, data))
    return str(p)


def test_pool_reports_crash_hang_and_memory_limit(tmp_path, monkeypatch):
    """The long run's pool: a worker killed by SIGSEGV is a crash, a spinning case a timeout, an allocation
    past RLIMIT_AS a MemoryError; the pool restarts workers and finishes the other cases."""
    fuzz_long = _fuzz_long(monkeypatch)
    monkeypatch.setenv("LW_FUZZ_INJECT", "crash:gguf:3,hang:gguf:6,alloc:safetensors:2")
    table = fuzz_long.run_pool(["safetensors", "gguf"], 10, workers=2, mem_mb=512, timeout=3.0,
                               crash_dir=str(tmp_path))
    s, g = table["safetensors"], table["gguf"]
    assert (g["crash"], g["timeout"], g["cases"]) == (1, 1, 10), g
    assert (s["other-exception"], s["cases"]) == (1, 10) and "MemoryError" in s["bugs"][0][2], s
    assert os.path.exists(os.path.join(tmp_path, "gguf-3-crash.bin"))
    assert s["loaded-ok"] + s["LazyWeightsError"] == 9 and g["loaded-ok"] + g["LazyWeightsError"] == 8


def _expect_format_error(path, *needles):
    import lazyweights as lw

    t0 = time.perf_counter()
    with pytest.raises(lw.FormatError) as ei:
        lw.load_weights(path)
    assert time.perf_counter() - t0 < CASE_SECONDS
    for n in (str(path),) + needles:
        assert n in str(ei.value), str(ei.value)


def test_regression_json_integer_over_4300_digits(tmp_path):
    """Was a bare ValueError from json (sys.int_max_str_digits), not a FormatError."""
    p = tmp_path / "r.safetensors"
    p.write_bytes(_st_pack(None, b"", raw=b'{"a":{"dtype":"F32","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,4]}}'))
    _expect_format_error(p, "not valid JSON")


@pytest.mark.parametrize("code", [["F32"], {"F32": 1}, 5, None])
def test_regression_dtype_code_of_the_wrong_type(tmp_path, code):
    """A list/dict dtype code was a TypeError (unhashable) from the dtype lookup."""
    _expect_format_error(_st_file(tmp_path, {"a": {"dtype": code, "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
                         "'a'", "dtype")


@pytest.mark.parametrize("meta", [[], "", 0, False])
def test_regression_falsy_metadata_is_not_an_object(tmp_path, meta):
    """`__metadata__: []` was accepted as empty metadata (`or {}`); the safetensors package refuses it."""
    a = {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}
    _expect_format_error(_st_file(tmp_path, {"__metadata__": meta, "a": a}, b"\0"), "__metadata__")
    ok = _st_file(tmp_path, {"__metadata__": None, "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\7")
    import lazyweights as lw

    assert lw.load_weights(ok)["a"].data().to_numpy().tolist() == [7]  # null is allowed, as in safetensors


@pytest.mark.parametrize("shape,dtype", [([2**62, 0], "F32"), ([0, 2**62], "F32"), ([2**64, 0], "U8"),
                                         ([2**31, 2**31, 0], "U8"), ([0, 2**63 - 1], "U8"), ([1] * 33, "U8")])
def test_regression_unrepresentable_empty_shapes(tmp_path, shape, dtype):
    """Empty tensors whose other dims numpy cannot hold: a ValueError at materialize (or at the first cast);
    now a FormatError at load naming the tensor."""
    n = 1 if len(shape) == 33 else 0
    _expect_format_error(_st_file(tmp_path, {"a": {"dtype": dtype, "shape": shape, "data_offsets": [0, n]}}, b"\0" * n),
                         "'a'", "cannot be represented")


def test_regression_empty_tensor_with_huge_leading_dim_is_one_block(tmp_path):
    """`F16[2**60, 0]` cast to f32 was cut into 2**38 empty row blocks: a hang. Now one block, at once."""
    import lazyweights as lw

    w = lw.load_weights(_st_file(tmp_path, {"a": {"dtype": "F16", "shape": [2**60, 0], "data_offsets": [0, 0]}}))
    p = lw.plan({"a": w["a"].data().astype(lw.DType.float32), "b": w["a"].data().T.astype(lw.DType.bfloat16)})
    assert sorted(len(s.blocks) for s in p.steps()) == [0, 1]  # (0 rows: no block at all)
    t0 = time.perf_counter()
    out = p.materialize(block_bytes=64)
    assert time.perf_counter() - t0 < CASE_SECONDS
    assert out["a"].shape == (2**60, 0) and out["b"].shape == (0, 2**60)


def test_regression_gguf_unrepresentable_empty_shape(tmp_path):
    doc = parse_gguf(gguf_seed())
    doc.infos[0][1] = [2**62, 0]  # F32, no elements, no bytes
    p = tmp_path / "r.gguf"
    p.write_bytes(build_gguf(doc))
    _expect_format_error(p, repr(doc.infos[0][0].decode()), "cannot be represented")


def test_gguf_zero_dims_is_one_element(tmp_path):
    """n_dims = 0: llama.cpp reads it as one element ([1, 1, 1, 1]); we read a 0-d array of that element.
    (gguf-py's reader fails on it for BF16, an IndexError; the fuzz check compares with the file bytes.)"""
    import lazyweights as lw

    doc = parse_gguf(gguf_seed())
    doc.infos[0][1] = []  # F32 at offset 0: its first 4 bytes
    p = tmp_path / "r.gguf"
    p.write_bytes(build_gguf(doc))
    w = lw.load_weights(p)
    name = doc.infos[0][0].decode()
    assert w[name].data().shape == () and w[name].data().to_numpy() == np.frombuffer(doc.data[:4], np.float32)[0]
