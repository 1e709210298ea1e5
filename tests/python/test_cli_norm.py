"""megamoe-stage's norm form (--rmsnorm-weight) against a direct megamoe.rmsnorm_and_stage
call on the inputs it saved: every output file tensor (the staged buffers, y, residual_out)
bitwise equal, in several formats, with and without a residual, in full-buffer mode.

The CLI is the one the package carries (megamoe/bin, `pip install .`), else $MEGAMOE_STAGE,
else build-cpu/ or build/ of this tree; without one the tests skip.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess

import numpy as np
import pytest

import megamoe
from megamoe_testutil import dlpack_capsule

ROOT = pathlib.Path(__file__).resolve().parents[2]
DL_BFLOAT = (4, 16, 1)  # DLPack's (code, bits, lanes) of bfloat16
NP = {"BF16": np.uint16, "F32": np.float32, "I32": np.int32, "I64": np.int64, "BOOL": np.bool_, "U8": np.uint8,
      "F8_E4M3": np.uint8, "F8_E5M2": np.uint8}
# megamoe-stage --scheme -> the Python scheme of the same format.
SCHEMES = {"mxfp8": "MXFP8", "fp32-g128": "FP8_FP32_G128", "mxfp4": "MXFP4", "nvfp4-per-token": "NVFP4_PER_TOKEN"}


def cli():
    from megamoe.__main__ import cli_path

    for p in (os.environ.get("MEGAMOE_STAGE"), cli_path(), ROOT / "build-cpu" / "tools" / "megamoe-stage",
              ROOT / "build" / "tools" / "megamoe-stage"):
        if p and pathlib.Path(p).is_file() and os.access(p, os.X_OK):
            return str(p)
    pytest.skip("no megamoe-stage binary (pip install . or a build-cpu/ build)")


def read_st(path):
    """{name: numpy array} of a safetensors file (bf16 as uint16 bits, fp8 as uint8)."""
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(raw[8 + n + a:8 + n + b], NP[v["dtype"]]).reshape(v["shape"])
    return out


def bf(a):
    return dlpack_capsule(np.ascontiguousarray(a), dtype=DL_BFLOAT)


def direct(ins, scheme, residual, rows):
    """megamoe.rmsnorm_and_stage on the saved inputs; the outputs by the CLI's names."""
    T, H = ins["hidden_states"].shape
    K = ins["topk_ids"].shape[1]
    o = megamoe.output_shapes(rows, H, K, scheme)

    def alloc(spec):  # bytes 0x5A, as megamoe-stage fills the rows full-buffer mode leaves untouched
        dt = np.dtype(NP_OF[spec.dtype])
        return np.full(int(np.prod(spec.shape)) * dt.itemsize, 0x5A, np.uint8).view(dt).reshape(spec.shape)

    out = dict(x_q=alloc(o.x_fp8), x_sf=alloc(o.x_sf), topk_idx_out=alloc(o.topk_idx_out),
               topk_weights_out=alloc(o.topk_weights_out))
    kw = {}
    if o.x_scales is not None:
        out["x_scales"] = kw["x_scales"] = alloc(o.x_scales)
    y, ro = np.zeros((T, H), np.uint16), np.zeros((T, H), np.uint16)
    megamoe.rmsnorm_and_stage(bf(ins["hidden_states"]), bf(ins["residual"]) if residual else None,
                              bf(ins["rmsnorm_weight"]), ins["topk_weights"], ins["topk_ids"], out["x_q"], out["x_sf"],
                              out["topk_idx_out"], out["topk_weights_out"], is_padding=ins["is_padding"],
                              hidden_quant=scheme, eps=1e-6, y=bf(y), residual_out=bf(ro) if residual else None,
                              full_buffer=rows > T, **kw)
    out["y"] = y
    if residual:
        out["residual_out"] = ro
    return out


NP_OF = {"float8_e4m3fn": np.uint8, "uint8": np.uint8, "int32": np.int32, "float32": np.float32, "int64": np.int64}


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("residual", [True, False])
def test_cli_norm_equals_a_direct_call(tmp_path, scheme, residual):
    exe = cli()
    inp, out = tmp_path / "in.st", tmp_path / "out.st"
    args = [exe, "-T", "37", "-H", "512", "--iters", "1", "--device", "cpu", "--scheme", scheme, "--rmsnorm-weight",
            "random", "--write-y", "--save-inputs", str(inp), "--output", str(out)]
    if residual:
        args += ["--residual", "random", "--write-residual-out"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "stage check: bit-exact match" in r.stdout, r.stdout + r.stderr
    ins, got = read_st(inp), read_st(out)
    want = direct(ins, getattr(megamoe, SCHEMES[scheme]), residual, 37)
    got = {("x_q" if k == "x_fp8" else k): v for k, v in got.items()}
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].tobytes() == want[k].tobytes(), k


def test_cli_norm_full_buffer_equals_a_direct_call(tmp_path):
    exe = cli()
    inp, out = tmp_path / "in.st", tmp_path / "out.st"
    r = subprocess.run([exe, "-T", "21", "-H", "256", "--iters", "1", "--device", "cpu", "--rmsnorm-weight", "random",
                        "--residual", "random", "--write-y", "--write-residual-out", "--full-buffer", "--max-tokens",
                        "32", "--save-inputs", str(inp), "--output", str(out)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0 and "stage check: bit-exact match" in r.stdout, r.stdout + r.stderr
    got = {("x_q" if k == "x_fp8" else k): v for k, v in read_st(out).items()}
    want = direct(read_st(inp), megamoe.MXFP8, True, 32)
    for k in want:
        assert got[k].tobytes() == want[k].tobytes(), k
