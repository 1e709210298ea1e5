"""Stage one MoE layer's inputs with PyTorch tensors (CUDA when available, else CPU), eagerly
and under torch.compile.

    python3 examples/python/stage_torch.py
"""
import torch

import megamoe

dev = "cuda" if torch.cuda.is_available() and megamoe.has_cuda_backend() else "cpu"
T, H, K = 32, 4096, 8
hidden = torch.randn(T, H, dtype=torch.bfloat16, device=dev)
topk_weights = torch.rand(T, K, device=dev)
topk_ids = torch.randint(0, 256, (T, K), dtype=torch.int32, device=dev)

staged = megamoe.stage(hidden, topk_weights, topk_ids, scheme=megamoe.MXFP8)  # allocating form
approx = megamoe.dequantize(staged.x_fp8, staged.x_sf, megamoe.MXFP8)
err = ((approx.float() - hidden.float()).norm() / hidden.float().norm()).item()
print(f"{dev}: x_fp8 {tuple(staged.x_fp8.shape)} {staged.x_fp8.dtype}, relative error {err:.4f}")


@torch.compile(fullgraph=True)
def layer(h, w, ids, x_fp8, x_sf, idx, w_out):
    megamoe.prepare_megamoe_inputs(h, w, ids, x_fp8, x_sf, idx, w_out)  # torch.ops.megamoe.prepare_inputs
    return idx.sum()


out = [torch.empty_like(t) for t in (staged.x_fp8, staged.x_sf, staged.topk_idx, staged.topk_weights)]
layer(hidden, topk_weights, topk_ids, *out)
assert torch.equal(out[0].view(torch.uint8), staged.x_fp8.view(torch.uint8))
print("torch.compile(fullgraph=True): same bytes")
