"""Each ggml tensor type the importer takes, checked block by block against values computed by
hand from the format's definition (ggml's ``ggml-common.h`` block structs and the scalar
``dequantize_row_*`` functions of ``ggml-quants.c``), not against the ``gguf`` package that does
the importing. Blocks are random bytes with finite fp16 scales (seeded); each check writes them
into a GGUF with gguf's writer and reads them back through :func:`dequantized`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from specserve.gguf_import.source import TENSOR_TYPES, open_reader
from specserve.gguf_import.tensors import dequantized
from tests.helpers.gguf_files import write_raw_tensor_gguf

QK_K = 256


def _f16(b: bytes, at: int) -> float:
    return float(np.frombuffer(b[at:at + 2], dtype="<f2")[0])


def _q8_0(b: bytes) -> list[float]:  # half d; int8 qs[32]
    d = np.float32(_f16(b, 0))
    return [float(d * np.float32(struct.unpack_from("b", b, 2 + j)[0])) for j in range(32)]


def _q4_0(b: bytes) -> list[float]:  # half d; u8 qs[16]: low nibbles 0..15, high 16..31
    d = np.float32(_f16(b, 0))
    qs = b[2:18]
    return ([float(np.float32((q & 0xF) - 8) * d) for q in qs]
            + [float(np.float32((q >> 4) - 8) * d) for q in qs])


def _q4_1(b: bytes) -> list[float]:  # half d, m; u8 qs[16]
    d, m = np.float32(_f16(b, 0)), np.float32(_f16(b, 2))
    qs = b[4:20]
    return ([float(np.float32(q & 0xF) * d + m) for q in qs]
            + [float(np.float32(q >> 4) * d + m) for q in qs])


def _q5_bits(qh: int, j: int) -> tuple[int, int]:
    return ((qh >> j) << 4) & 0x10, (qh >> (j + 12)) & 0x10


def _q5_0(b: bytes) -> list[float]:  # half d; u8 qh[4] (a u32); u8 qs[16]
    d = np.float32(_f16(b, 0))
    qh = struct.unpack_from("<I", b, 2)[0]
    qs = b[6:22]
    lo, hi = [], []
    for j, q in enumerate(qs):
        h0, h1 = _q5_bits(qh, j)
        lo.append(float(np.float32(((q & 0xF) | h0) - 16) * d))
        hi.append(float(np.float32(((q >> 4) | h1) - 16) * d))
    return lo + hi


def _q5_1(b: bytes) -> list[float]:  # half d, m; u8 qh[4]; u8 qs[16]
    d, m = np.float32(_f16(b, 0)), np.float32(_f16(b, 2))
    qh = struct.unpack_from("<I", b, 4)[0]
    qs = b[8:24]
    lo, hi = [], []
    for j, q in enumerate(qs):
        h0, h1 = _q5_bits(qh, j)
        lo.append(float(np.float32((q & 0xF) | h0) * d + m))
        hi.append(float(np.float32((q >> 4) | h1) * d + m))
    return lo + hi


def _scale_min_k4(j: int, s: bytes) -> tuple[int, int]:  # ggml's get_scale_min_k4
    if j < 4:
        return s[j] & 63, s[j + 4] & 63
    return (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


def _q4_k(b: bytes) -> list[float]:  # half d, dmin; u8 scales[12]; u8 qs[128]
    d, dmin = np.float32(_f16(b, 0)), np.float32(_f16(b, 2))
    scales, qs = b[4:16], b[16:144]
    y: list[float] = []
    for j in range(4):  # 64 values: 32 low nibbles, then 32 high nibbles of the same bytes
        q = qs[32 * j:32 * j + 32]
        sc, mn = _scale_min_k4(2 * j, scales)
        y += [float(d * np.float32(sc) * np.float32(v & 0xF) - dmin * np.float32(mn)) for v in q]
        sc, mn = _scale_min_k4(2 * j + 1, scales)
        y += [float(d * np.float32(sc) * np.float32(v >> 4) - dmin * np.float32(mn)) for v in q]
    return y


def _q5_k(b: bytes) -> list[float]:  # half d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
    d, dmin = np.float32(_f16(b, 0)), np.float32(_f16(b, 2))
    scales, qh, qs = b[4:16], b[16:48], b[48:176]
    y: list[float] = []
    for j in range(4):
        q = qs[32 * j:32 * j + 32]
        u1, u2 = 1 << (2 * j), 2 << (2 * j)
        sc, mn = _scale_min_k4(2 * j, scales)
        y += [float(d * np.float32(sc) * np.float32((v & 0xF) + (16 if qh[i] & u1 else 0))
                    - dmin * np.float32(mn)) for i, v in enumerate(q)]
        sc, mn = _scale_min_k4(2 * j + 1, scales)
        y += [float(d * np.float32(sc) * np.float32((v >> 4) + (16 if qh[i] & u2 else 0))
                    - dmin * np.float32(mn)) for i, v in enumerate(q)]
    return y


def _q6_k(b: bytes) -> list[float]:  # u8 ql[128]; u8 qh[64]; int8 scales[16]; half d
    ql, qh = b[0:128], b[128:192]
    sc = struct.unpack_from("16b", b, 192)
    d = np.float32(_f16(b, 208))
    y = [0.0] * QK_K
    for n in range(2):  # two halves of 128 values
        lo, hi, s, base = ql[64 * n:64 * n + 64], qh[32 * n:32 * n + 32], sc[8 * n:], 128 * n
        for i in range(32):
            k = i // 16
            q1 = ((lo[i] & 0xF) | (((hi[i] >> 0) & 3) << 4)) - 32
            q2 = ((lo[i + 32] & 0xF) | (((hi[i] >> 2) & 3) << 4)) - 32
            q3 = ((lo[i] >> 4) | (((hi[i] >> 4) & 3) << 4)) - 32
            q4 = ((lo[i + 32] >> 4) | (((hi[i] >> 6) & 3) << 4)) - 32
            for off, q, si in ((0, q1, 0), (32, q2, 2), (64, q3, 4), (96, q4, 6)):
                y[base + i + off] = float(d * np.float32(s[k + si]) * np.float32(q))
    return y


# type -> (block bytes, values per block, byte offsets of fp16 scales, reference)
BLOCKS: dict[str, tuple[int, int, tuple[int, ...], Callable[[bytes], list[float]]]] = {
    "Q8_0": (34, 32, (0,), _q8_0),
    "Q4_0": (18, 32, (0,), _q4_0),
    "Q4_1": (20, 32, (0, 2), _q4_1),
    "Q5_0": (22, 32, (0,), _q5_0),
    "Q5_1": (24, 32, (0, 2), _q5_1),
    "Q4_K": (144, QK_K, (0, 2), _q4_k),
    "Q5_K": (176, QK_K, (0, 2), _q5_k),
    "Q6_K": (210, QK_K, (208,), _q6_k),
}


def _random_blocks(qtype: str, rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    """uint8 [rows, blocks_per_row * block bytes]: random bytes, fp16 scales finite."""
    size, _, scale_at, _ = BLOCKS[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows * blocks_per_row, size), dtype=np.uint8)
    for at in scale_at:
        scales = rng.normal(0, 0.05, size=rows * blocks_per_row).astype("<f2")
        raw[:, at:at + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, blocks_per_row * size)


def _read_back(tmp_path: Path, qtype: str, raw: np.ndarray) -> np.ndarray:
    path = write_raw_tensor_gguf(tmp_path / f"{qtype}.gguf", {"w.weight": (qtype, raw, 0)})
    (t,) = open_reader(path).tensors
    assert t.tensor_type.name == qtype
    return dequantized(t)


@pytest.mark.parametrize("qtype", sorted(BLOCKS))
def test_quantized_blocks_match_the_format_definition(tmp_path: Path, qtype: str) -> None:
    size, per_block, _, ref = BLOCKS[qtype]
    rows, per_row = 3, 2  # several blocks per row: block order within a row matters
    raw = _random_blocks(qtype, rows, per_row, seed=len(qtype) * 7 + size)
    got = _read_back(tmp_path, qtype, raw)
    assert got.shape == (rows, per_row * per_block)
    blocks = raw.reshape(rows * per_row, size)
    want = np.array([ref(bytes(b)) for b in blocks], dtype=np.float32).reshape(got.shape)
    # ggml computes in float32; gguf's numpy port may associate d * sc * q differently
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16"])
def test_float_types_are_exact(tmp_path: Path, qtype: str) -> None:
    rng = np.random.default_rng(5)
    vals = rng.normal(size=(4, 40)).astype(np.float32)
    if qtype == "F32":
        raw = vals
    elif qtype == "F16":
        raw = vals.astype(np.float16)
    else:  # bfloat16: the high 16 bits of each float32 (truncation), stored as raw bytes
        raw = (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(4, 80)
    got = _read_back(tmp_path, qtype, raw)
    if qtype == "BF16":
        want = ((vals.view(np.uint32) >> 16) << 16).view(np.float32)
    else:
        want = raw.astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_every_supported_type_is_checked_here() -> None:
    assert set(TENSOR_TYPES) == set(BLOCKS) | {"F32", "F16", "BF16"}
