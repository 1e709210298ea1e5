"""Helpers shared by the Python test files (schemes, the reference's messages, bitwise
comparison, vLLM QuantKey look-alikes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

import megamoe

SCHEMES = {
    "MXFP8": megamoe.MXFP8,
    "FP8_UE8M0_G128": megamoe.FP8_UE8M0_G128,
    "FP8_FP32_G128": megamoe.FP8_FP32_G128,
    "FP8_FP32_G32": megamoe.FP8_FP32_G32,
}

SEED_SCHEME = (
    "DeepSeek V4 MegaMoE input staging requires symmetric dynamic fp8 per-group "
    "quantization with a group size dividing 128 and E8M0 or fp32 scales, got "
)
SEED_H128 = "DeepSeek V4 MegaMoE input staging requires hidden_size to be a multiple of 128."
SEED_TOPK = (
    "DeepSeek V4 MegaMoE input staging requires topk_weights and topk_ids to have the same shape."
)
SEED_PAIR = (
    "DeepSeek V4 MegaMoE shared input staging requires both shared_x_sf and shared_block_m."
)
SEED_UE8M0 = (
    "DeepSeek V4 MegaMoE shared input staging currently requires UE8M0-packed hidden scales."
)
SEED_BM = "MegaMoE shared_block_m must be positive."


def bits(a: np.ndarray) -> np.ndarray:
    """Raw bits of an array (so NaN payloads and -0.0 compare exactly)."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def assert_bitwise(got: np.ndarray, want: np.ndarray, what: str) -> None:
    g, w = bits(got), bits(want)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    bad = np.argwhere(g != w)
    assert bad.size == 0, (
        f"{what}: {len(bad)} mismatches, first at {tuple(bad[0])}: "
        f"got {g[tuple(bad[0])]:#x}, want {w[tuple(bad[0])]:#x}"
    )


@dataclass(frozen=True)
class GroupShape:
    row: int
    col: int

    def is_per_group(self) -> bool:
        return self.row == 1 and self.col >= 1


@dataclass(frozen=True)
class ScaleDesc:
    dtype: Any
    static: bool
    group_shape: GroupShape


@dataclass(frozen=True)
class QuantKey:
    dtype: Any
    scale: ScaleDesc
    scale2: Optional[ScaleDesc] = None
    symmetric: bool = True

    def __str__(self) -> str:
        return f"QuantKey({self.dtype},{self.scale})"


def key(elem="float8_e4m3fn", sdtype="float8_e8m0fnu", G=32, row=1, static=False, sym=True, scale2=False):
    sc = ScaleDesc(sdtype, static, GroupShape(row, G))
    return QuantKey(elem, sc, sc if scale2 else None, sym)
