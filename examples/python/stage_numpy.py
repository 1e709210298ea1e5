"""Stage one MoE layer's inputs with NumPy arrays (the CPU backend).

    python3 examples/python/stage_numpy.py
"""
import numpy as np

import megamoe

T, H, K = 16, 1024, 8
rng = np.random.default_rng(0)
hidden = (rng.standard_normal((T, H)) * 4).astype(np.float32)
topk_weights = rng.random((T, K), dtype=np.float32)
topk_ids = rng.integers(0, 256, (T, K), dtype=np.int32)
is_padding = np.zeros(T, dtype=np.bool_)
is_padding[-1] = True

# Buffers from the one shape rule, then the vLLM-compatible call.
for scheme in (megamoe.MXFP8, megamoe.MXFP4, megamoe.FP8_FP32_G128):
    shapes = megamoe.output_shapes(T, H, K, scheme)
    x_q = np.empty(shapes.x_fp8.shape, dtype=np.uint8)
    x_sf = np.empty(shapes.x_sf.shape, dtype=np.dtype(shapes.x_sf.dtype))
    idx = np.empty((T, K), dtype=np.int64)
    w = np.empty((T, K), dtype=np.float32)
    megamoe.prepare_megamoe_inputs(hidden, topk_weights, topk_ids, x_q, x_sf, idx, w,
                                   is_padding=is_padding, hidden_quant=scheme)
    approx = megamoe.dequantize(x_q, x_sf, scheme)
    snr = 10 * np.log10((hidden ** 2).sum() / ((hidden - approx) ** 2).sum())
    assert (idx[-1] == -1).all() and (w[-1] == 0).all()
    print(f"{scheme.name:>14}: x_q {x_q.shape}, x_sf {x_sf.shape} {x_sf.dtype}, SNR {snr:.1f} dB")
