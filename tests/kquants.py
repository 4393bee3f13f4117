"""Q4_K, Q5_K and Q6_K quantisation in numpy, for tiny test models whose matrices take the K-quant
kernels (gguf-py reads these formats but does not write them).

Simple, not llama.cpp's search for the best scales: each sub-block's range is mapped onto the
quant levels directly. The block layouts are ggml's (ggml-common.h); `gguf.quants.dequantize`
reads them back, which tests/test_tiny_gguf.py checks.
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _f16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16)


def quantize_q4_K(weights: np.ndarray) -> np.ndarray:
    """(rows, k) float32, k a multiple of 256 -> (rows, k / 256 * 144) uint8 of block_q4_K."""
    rows, k = weights.shape
    d, dmin, scales, q = _scaled_with_mins(weights, 15)
    q = q.reshape(-1, 4, 2, 32)  # [sb][pair][low|high][l]
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(-1, 128)
    blocks = np.concatenate(
        [d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), scales, qs], axis=1
    )
    return blocks.reshape(rows, k // QK_K * 144)


def quantize_q5_K(weights: np.ndarray) -> np.ndarray:
    """(rows, k) float32, k a multiple of 256 -> (rows, k / 256 * 176) uint8 of block_q5_K:
    Q4_K's layout for the low 4 bits, and qh[l] bit 2j (2j + 1) the fifth bit of weight
    64j + l (64j + 32 + l)."""
    rows, k = weights.shape
    d, dmin, scales, q = _scaled_with_mins(weights, 31)
    q = q.reshape(-1, 4, 2, 32)  # [sb][pair][low|high][l]
    qs = ((q[:, :, 0, :] & 15) | ((q[:, :, 1, :] & 15) << 4)).reshape(-1, 128)
    high = (q >> 4).astype(np.uint8)  # [sb][pair j][half h][l] -> bit 2j + h of qh[l]
    shifts = (2 * np.arange(4)[:, None] + np.arange(2)[None, :]).astype(np.uint8)
    qh = (high << shifts[None, :, :, None]).sum(axis=(1, 2), dtype=np.uint8)
    blocks = np.concatenate(
        [d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), scales, qh, qs],
        axis=1,
    )
    return blocks.reshape(rows, k // QK_K * 176)


def _scaled_with_mins(
    weights: np.ndarray, levels: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's shared part: per super-block d and dmin (fp16), the 12 bytes of 6-bit
    sub-block scales and mins, and the quants 0..levels, (super-blocks, 256)."""
    x = weights.reshape(-1, 8, 32).astype(np.float32)  # super-blocks x sub-blocks x weights
    low = np.minimum(x.min(axis=2), 0.0)
    scale = (x.max(axis=2) - low) / levels
    d = _f16(scale.max(axis=1) / 63.0)
    dmin = _f16(-low.min(axis=1) / 63.0)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.nan_to_num(np.rint(scale / d32)), 0, 63).astype(np.uint8)
        mn = np.clip(np.nan_to_num(np.rint(-low / dmin32)), 0, 63).astype(np.uint8)
        step = (d32 * sc)[:, :, None]
        q = np.nan_to_num(np.rint((x + (dmin32 * mn)[:, :, None]) / step))
    q = np.clip(q, 0, levels).astype(np.uint8).reshape(-1, 256)
    scales = np.zeros((x.shape[0], 12), np.uint8)
    scales[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    scales[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    return d, dmin, scales, q


def quantize_q6_K(weights: np.ndarray) -> np.ndarray:
    """(rows, k) float32, k a multiple of 256 -> (rows, k / 256 * 210) uint8 of block_q6_K."""
    rows, k = weights.shape
    x = weights.reshape(-1, 16, 16).astype(np.float32)  # super-blocks x sub-blocks x weights
    scale = np.abs(x).max(axis=2) / 31.0
    d = _f16(scale.max(axis=1) / 127.0)
    d32 = d.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.nan_to_num(np.rint(scale / d32)), -128, 127).astype(np.int8)
        step = (d32 * sc)[:, :, None]
        q = np.nan_to_num(np.rint(x / step)) + 32
    q = np.clip(q, 0, 63).astype(np.uint8).reshape(-1, 2, 4, 32)  # [sb][half][t][l]
    ql = np.concatenate(
        [
            (q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4),
            (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4),
        ],
        axis=2,
    ).reshape(-1, 128)
    qh = (
        (q[:, :, 0] >> 4)
        | ((q[:, :, 1] >> 4) << 2)
        | ((q[:, :, 2] >> 4) << 4)
        | ((q[:, :, 3] >> 4) << 6)
    ).reshape(-1, 64)
    blocks = np.concatenate([ql, qh, sc.view(np.uint8), d.view(np.uint8).reshape(-1, 2)], axis=1)
    return blocks.reshape(rows, k // QK_K * 210)
