"""megamoe's router on CUDA against vLLM's PyTorch rendering on CUDA: how far the weights
are apart and why (docs/ROUTER.md, "Against vLLM's torch router").

vLLM's rendering: s = sqrt(softplus(logits.float())), topk(s + bias), gather, s / sum(s)
(clamped at 1e-20), times the routed scaling factor. Per case (T tokens, E experts, top K,
logit dtype) it prints one JSON row: tokens whose ids differ (and whether each is a
near-tie: the chosen biased scores, sorted, within 2 ulp of vLLM's), and over the weights
of the tokens whose ids agree the ulp distance's histogram, its maximum and the largest
|dw| / (eps |w|). Two attributions: torch's CUDA scores against the correctly rounded ones
(exp and log1p in double, each rounded once), and vLLM's formula fed with the correctly
rounded scores but summed by torch.sum instead of in k order.

    python dev/router_vs_torch.py [--T 4096] [--seeds 4]   (a CUDA GPU and torch needed)
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import megamoe

F32 = np.float32
EPS = 2.0**-23
CASES = [(256, 6, "float32"), (384, 6, "float32"), (384, 6, "bfloat16"), (64, 8, "float32"), (512, 16, "bfloat16")]


def exact_scores(x: np.ndarray) -> np.ndarray:
    """sqrt(softplus(x)) with exp, log1p and sqrt each correctly rounded to fp32."""
    x = np.asarray(x, F32)
    with np.errstate(all="ignore"):
        e = np.exp(x.astype(np.float64)).astype(F32)
        sp = np.where(x > 20, x, np.log1p(e.astype(np.float64)).astype(F32))
        return np.sqrt(sp.astype(F32))


def ulps(a, b):
    def ordered(v):
        i = np.asarray(v, F32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordered(a) - ordered(b))


def vllm(logits, bias, K, alpha):
    s = torch.sqrt(torch.nn.functional.softplus(logits.float()))
    _, idx = torch.topk(s + bias.float(), k=K, dim=-1)
    w = s.gather(1, idx)
    return (w / w.sum(dim=-1, keepdim=True).clamp(min=1e-20) * alpha).float(), idx, s


def case(T, E, K, dtype, seed, alpha=1.5):
    g = torch.Generator(device="cuda").manual_seed(1000 * seed + E + K)
    logits = (torch.randn(T, E, device="cuda", generator=g) * 4).to(getattr(torch, dtype))
    bias = (torch.randn(E, device="cuda", generator=g) * 0.05 + 8.0).to(getattr(torch, dtype))
    w = torch.empty(T, K, device="cuda")
    ids = torch.empty(T, K, device="cuda", dtype=torch.int32)
    megamoe.route(logits, bias, w, ids, routed_scaling_factor=alpha)
    vw, vids, ts = vllm(logits, bias, K, alpha)
    torch.cuda.synchronize()
    b = ts + bias.float()
    ours_b = b.gather(1, ids.long()).sort(dim=1, descending=True).values.cpu().numpy()
    theirs_b = b.gather(1, vids).sort(dim=1, descending=True).values.cpu().numpy()
    same = (ids.long() == vids).all(dim=1).cpu().numpy()
    near_tie = ulps(ours_b, theirs_b).max(axis=1) <= 2
    wo, wv = w.cpu().numpy()[same], vw.cpu().numpy()[same]
    d = ulps(wo, wv)
    rel = np.abs(wo.astype(np.float64) - wv) / np.abs(wv.astype(np.float64)) / EPS
    # Attributions: torch's CUDA scores against the correctly rounded ones; torch.sum's
    # order on the correctly rounded scores against k order (ours).
    x = logits.float().cpu().numpy()
    exact = exact_scores(x)
    score_ulps = ulps(ts.cpu().numpy(), exact)
    se = torch.from_numpy(exact).cuda().gather(1, ids.long())
    ksum = torch.zeros(T, device="cuda")
    for k in range(K):
        ksum = ksum + se[:, k]
    w_k = (se / ksum.clamp(min=1e-20)[:, None] * alpha).cpu().numpy()[same]
    w_t = (se / se.sum(dim=-1, keepdim=True).clamp(min=1e-20) * alpha).cpu().numpy()[same]
    return dict(T=T, E=E, K=K, dtype=dtype, seed=seed, device=torch.cuda.get_device_name(),
                tokens_ids_differ=int((~same).sum()), of_them_near_ties=int((~same & near_tie).sum()),
                weights_compared=int(d.size), weights_differ=int((d > 0).sum()),
                frac_differ=float((d > 0).mean()), max_ulp=int(d.max()) if d.size else 0,
                ulp_hist={str(u): int((d == u).sum()) for u in range(int(d.max()) + 1 if d.size else 0)},
                max_rel_eps=float(rel.max()) if rel.size else 0.0,
                torch_scores_off=float((score_ulps > 0).mean()), torch_scores_max_ulp=int(score_ulps.max()),
                ours_equals_kordered_exact=bool(np.array_equal(wo.view(np.uint32), w_k.view(np.uint32))),
                torchsum_vs_korder_max_ulp=int(ulps(w_t, w_k).max()) if w_k.size else 0,
                torchsum_vs_korder_frac=float((ulps(w_t, w_k) > 0).mean()) if w_k.size else 0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--seeds", type=int, default=4)
    a = ap.parse_args()
    for E, K, dtype in CASES:
        for seed in range(a.seeds):
            print(json.dumps(case(a.T, E, K, dtype, seed)), flush=True)


if __name__ == "__main__":
    main()
