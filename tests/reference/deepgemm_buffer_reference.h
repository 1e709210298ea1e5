// deepgemm_buffer_reference.h: an independent rendering of DeepGEMM's MegaMoE symmetric-buffer
// formulas (recorded from DeepGEMM 0274ad7b: csrc/apis/mega_moe.hpp, csrc/apis/sm90_mega.hpp,
// deep_gemm/include/deep_gemm/layout/mega_moe.cuh, scheduler/mega_moe.cuh,
// csrc/jit_kernels/heuristics/mega_moe.hpp; the ring layout from DeepGEMM main 54e2261:
// csrc/apis/mega.hpp and its layout/mega_moe.cuh), for the tests. It does not call the library
// and shares none of its code: the buffer is a chain of (name, records, record bytes) as
// DeepGEMM's Buffer objects are, the signal block's size is the sizeof of a struct declared
// with DeepGEMM's fields, the block-size heuristic runs in double with each fp32 step rounded
// explicitly. Valid arguments only (the tests check rejections against the rules in their
// own text).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace dgref {

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t up(int64_t a, int64_t b) { return cdiv(a, b) * b; }

// The fixed signal block at the start of the workspace, field by field.
struct alignas(128) Signals {
  uint32_t grid_sync[4];
  uint32_t nvl_counter;
  int nvl_signals[2];
  uint32_t tasks[4];
  alignas(128) uint64_t combine_ready[72];
  alignas(128) uint64_t peer_grid[72];
  alignas(128) uint64_t send_count[2048];
  uint64_t recv_count[2048];
  uint64_t recv_count_sum[512];
  uint32_t l1_full[1 << 20];
  uint32_t l1_empty[1 << 20];
  uint64_t l2_full_mask[1 << 20];
  uint32_t l2_empty[1 << 20];
  uint32_t shared_l2_full[1 << 15];
  uint32_t l2_full[1 << 20];
};

struct Piece {
  std::string name;
  int64_t offset, bytes;
};

struct Ref {
  int64_t T = 0, pool = 0, ring = 0, sf_ring = 0, shared_sf = 0, workspace = 0, total = 0;
  std::vector<Piece> pieces;  // every buffer with bytes, and every view DeepGEMM slices
  void chain(const std::string& name, int64_t records, int64_t record_bytes, bool view = true) {
    const int64_t bytes = records * record_bytes;
    if (view || bytes > 0) pieces.push_back({name, total, bytes});
    total += bytes;
  }
};

// The pool: routed tokens (each token once per distinct local expert) plus padding of every
// local expert to the largest block, aligned to the blocks' lcm.
inline int64_t pool(int64_t R, int64_t E, int64_t T, int64_t K, int64_t max_bm, int64_t lcm) {
  const int64_t er = E / R;
  return up(R * T * std::min(K, er) + er * (max_bm - 1), lcm);
}

// The L1/L2 schedule's live blocks (M pool blocks, 2-SM clusters, N tiles of 256 columns).
inline int64_t live(int64_t M, int64_t sms, int64_t H, int64_t IH) {
  const int64_t clusters = sms / 2, n1 = IH / 128, n2 = H / 256;
  const int64_t tasks1 = M * n1, waves1 = cdiv(tasks1, clusters);
  const int64_t for_first_l2 = cdiv(cdiv(clusters, n2) * n1, clusters);
  const int64_t for_interleave = cdiv(n1 + (M - 1) * std::max<int64_t>(n1 - n2, 0), clusters) + 1;
  const int64_t warm = std::min(std::max(for_first_l2, for_interleave), waves1);
  const int64_t after_warm = cdiv(std::min(warm * clusters, tasks1), n1);
  const int64_t growth = n2 > n1 ? cdiv(M * (n2 - n1), n2) : 0;
  return std::min(M, after_warm + growth + cdiv(clusters, std::min(n1, n2)));
}

// DeepGEMM 0274ad7b, Blackwell: mma "fp8xfp4", "fp8xfp8", "bf16xbf16", "fp4xfp4".
inline Ref sm100(int64_t R, int64_t E, int64_t T0, int64_t K, int64_t H, int64_t IH, int64_t S, const std::string& mma,
                 int64_t sms) {
  static const int64_t kBms[] = {8, 16, 32, 64, 96, 128, 192, 240};
  Ref r;
  const int64_t T = up(T0, 1920), er = E / R;
  r.T = T;
  int64_t ring = 0;
  for (int64_t bm : kBms) ring = std::max(ring, live(cdiv(T * R * std::min(K, er), bm) + er, sms, H, IH) * bm);
  ring = up(ring, 1920);
  const bool fp4 = mma == "fp4xfp4", bf16 = mma == "bf16xbf16", sf = !bf16;
  const int64_t bits = bf16 ? 16 : fp4 ? 4 : 8, gran = fp4 ? 16 : 32;
  const int64_t sbits = fp4 ? 16 : bits;
  const bool shared_sf = sf && sbits < 16;
  int64_t nsf = 0;
  if (sf) {
    for (int64_t bm : kBms) nsf = std::max(nsf, ring / bm * up(bm, 128));
  }
  const int64_t nsh = shared_sf ? cdiv(T, 8) * 128 : 0;
  r.pool = pool(R, E, T, K, 240, 1920);
  r.ring = ring;
  r.sf_ring = nsf;
  r.shared_sf = S > 0 ? nsh : 0;
  r.workspace = up(static_cast<int64_t>(sizeof(Signals)) + E * T * 4 + r.pool * 12, 16);
  r.chain("workspace", 1, r.workspace, false);
  r.chain("routed_topk_weights", r.pool, bits == 4 ? 4 : 0, false);
  r.chain("x", T, H * bits / 8);
  if (sf) r.chain("x_sf", T, H / gran);
  r.chain("topk_idx", T, K * 8);
  r.chain("topk_weights", T, K * 4);
  if (S > 0) {
    if (shared_sf) r.chain("shared_l1_acts_sf", nsh, H / gran);
    r.chain("shared_l2_acts", T, S * IH * sbits / 8);
    if (shared_sf) r.chain("shared_l2_acts_sf", nsh, S * IH / gran);
  }
  r.chain("l1_acts", ring, H * bits / 8);
  if (sf) r.chain("l1_acts_sf", nsf, H / gran);
  r.chain("l1_topk_weights", ring, bits == 4 ? 0 : 4, false);
  r.chain("l2_acts", ring, IH * bits / 8);
  if (sf) r.chain("l2_acts_sf", nsf, IH / gran);
  r.chain("combine", (K + (S > 0 ? 1 : 0)) * T, 2 * H, false);
  return r;
}

// DeepGEMM 0274ad7b, Hopper FP8: the full pool instead of a ring.
inline Ref sm90(int64_t R, int64_t E, int64_t T0, int64_t K, int64_t H, int64_t IH) {
  Ref r;
  const int64_t T = up(T0, 128);
  r.T = T;
  r.pool = r.ring = pool(R, E, T, K, 240, 1920);
  r.sf_ring = r.pool / 64 * 128;
  r.workspace = up(static_cast<int64_t>(sizeof(Signals)) + E * T * 4 + r.pool * 12, 16);
  r.chain("workspace", 1, r.workspace, false);
  r.chain("x", T, H);
  r.chain("x_sf", T, H / 32);
  r.chain("topk_idx", T, K * 8);
  r.chain("topk_weights", T, K * 4);
  r.chain("l1_acts", r.pool, H);
  r.chain("l1_acts_sf", r.sf_ring, H / 32);
  r.chain("l1_topk_weights", r.pool, 4, false);
  r.chain("l2_acts", r.pool, IH);
  r.chain("l2_acts_sf", r.sf_ring, IH / 16);
  r.chain("combine", K * T, 2 * H, false);
  return r;
}

// DeepGEMM main 54e2261, the ring layout: mma "fp8xfp4" or "bf16xbf16"; ring 0 = the ring
// DeepGEMM's Python picks.
inline Ref sm100_ring(int64_t R, int64_t E, int64_t T0, int64_t K, int64_t H, int64_t IH, const std::string& mma,
                      int64_t ring) {
  static const int64_t kBms[] = {8, 16, 32, 64, 96, 128, 192};
  Ref r;
  const int64_t T = up(T0, 384), er = E / R;
  r.T = T;
  if (ring == 0) {
    const int64_t lo = T * R;
    const int64_t hi = er == 1 ? T * R : std::min(T * R * er, up(T * R * K + er * 383, 384));
    const int64_t decode = std::min<int64_t>(4224 * 72 * 6, up(4224 * 72 * 6 + 6 * 383, 384));
    ring = std::min(std::max(T >= 6144 ? up(786432, 384) : decode, lo), hi);
  }
  const bool sf = mma == "fp8xfp4";
  const int64_t eb = sf ? 1 : 2;
  int64_t nsf = 0;
  for (int64_t bm : kBms) nsf = std::max(nsf, ring / bm * up(bm, 128));
  r.ring = ring;
  r.sf_ring = sf ? nsf : 0;
  r.pool = pool(R, E, T, K, 192, 384);
  r.workspace = up(32 + E * 16 + er * 8 + (ring / 8) * 4 * 4 + er * R * (R * T) * 4 + r.pool * 12, 16);
  r.chain("workspace", 1, r.workspace, false);
  r.chain("x", T, H * eb);
  if (sf) r.chain("x_sf", T, H / 32);
  r.chain("topk_idx", T, K * 8);
  r.chain("topk_weights", T, K * 4);
  r.chain("l1_acts", ring, H * eb);
  if (sf) r.chain("l1_acts_sf", nsf, H / 32);
  r.chain("l1_topk_weights", ring, 4, false);
  r.chain("l2_acts", ring, IH * eb);
  if (sf) r.chain("l2_acts_sf", nsf, IH / 32);
  r.chain("combine", K * T, 2 * H, false);
  return r;
}

// get_block_m_for_mega_moe: the fp32 heuristic, each operation computed in double (exact for
// one product, quotient or root of floats) and rounded to fp32.
inline int64_t block_m(int64_t R, int64_t E, int64_t num_tokens, int64_t K) {
  auto fl = [](double v) { return static_cast<double>(static_cast<float>(v)); };
  const double e =
      fl(fl(fl(fl(static_cast<double>(num_tokens)) * fl(static_cast<double>(R))) * fl(static_cast<double>(K))) /
         fl(static_cast<double>(E)));
  const double c = fl(e + fl(std::sqrt(e)));
  if (e <= 24) return e <= 10 ? 16 : 32;
  int64_t n = static_cast<int64_t>(std::ceil(fl(c / 240)));
  if (n == 1 && c > 192 && E / R < 14) n = 2;
  for (int64_t bm : {64, 128, 192}) {
    if (fl(static_cast<double>(n * bm)) >= c) return bm;
  }
  return 240;
}

}  // namespace dgref
