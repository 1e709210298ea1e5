// bench_router.cu: C++ timing of the fused router (megamoe::route_and_stage) against the
// router kernel followed by the staging (route, then prepare_inputs), each alone, and a
// same-run device copy of the staging's bytes, from CUDA-graph replays. The megamoe rows of
// bench/bench_router.py when the Python binding of the router is not there (that script
// runs this binary and merges its rows); the PyTorch and Triton baselines are the script's.
// Prints one JSON object per line.
//   usage: bench_router [--T 1,8,64,256,1024,4096] [--layers E:K:H,...] [--eplb 0,1]
//   (--eplb 2: the EPLB map with the record flag 0, no load counting)
//                       [--format mxfp8|fp8_fp32_g128] [--logits fp32|bf16] [--quick]
//   (--logits bf16: the same randn logits in bf16, truncated as the hidden states are)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_bench.cuh"
#include "megamoe/megamoe.h"

using namespace megamoe;

namespace {

__global__ void empty_kernel() {}

std::vector<long long> parse_list(const char* s) {
  std::vector<long long> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::atoll(item.c_str()));
  return v;
}

struct Layer {
  int64_t E, K, H;
};

std::vector<Layer> parse_layers(const char* s) {
  std::vector<Layer> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    Layer l{};
    if (std::sscanf(item.c_str(), "%lld:%lld:%lld", reinterpret_cast<long long*>(&l.E),
                    reinterpret_cast<long long*>(&l.K), reinterpret_cast<long long*>(&l.H)) != 3) {
      std::fprintf(stderr, "bad --layers item '%s' (E:K:H)\n", item.c_str());
      std::exit(2);
    }
    v.push_back(l);
  }
  return v;
}

std::vector<uint8_t> to_host(const void* p, size_t n) {
  std::vector<uint8_t> h(n);
  CK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<long long> Ts = {1, 8, 64, 256, 1024, 4096};
  std::vector<Layer> layers = {{256, 6, 4096}, {384, 6, 7168}};
  std::vector<long long> eplbs = {0, 1};
  std::string format = "mxfp8", logits_dtype = "fp32";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--T" && next) Ts = parse_list(argv[++i]);
    else if (a == "--layers" && next) layers = parse_layers(argv[++i]);
    else if (a == "--eplb" && next) eplbs = parse_list(argv[++i]);
    else if (a == "--format" && next) format = argv[++i];
    else if (a == "--logits" && next) logits_dtype = argv[++i];
    else if (a == "--quick") Ts = {1, 64, 1024};
    else {
      std::fprintf(stderr, "usage: %s [--T list] [--layers E:K:H,...] [--eplb 0,1,2] [--format mxfp8|fp8_fp32_g128] [--logits fp32|bf16] [--quick]\n",
                   argv[0]);
      return 2;
    }
  }
  const QuantScheme scheme = format == "fp8_fp32_g128" ? QuantScheme::fp8_fp32_g128() : QuantScheme::mxfp8();
  if (format != "mxfp8" && format != "fp8_fp32_g128") {
    std::fprintf(stderr, "--format: mxfp8 or fp8_fp32_g128\n");
    return 2;
  }
  if (logits_dtype != "fp32" && logits_dtype != "bf16") {
    std::fprintf(stderr, "--logits: fp32 or bf16\n");
    return 2;
  }
  const bool logits_bf16 = logits_dtype == "bf16";
  const float alpha = 1.5f;  // DeepSeek-V4's routed_scaling_factor
  const int64_t R = 2;       // EPLB replica slots: the first 32 experts have a second replica
  const int64_t extra = 32;
  int64_t maxT = 0, maxE = 0, maxK = 0, maxH = 0;
  for (long long T : Ts) maxT = std::max<int64_t>(maxT, T);
  for (const Layer& l : layers) maxE = std::max(maxE, l.E), maxK = std::max(maxK, l.K), maxH = std::max(maxH, l.H);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const Device d = Device::cuda(0);
  void *logits, *bias, *hs, *xq, *sf, *io, *wo, *ids, *w, *io2, *wo2, *ids2, *w2, *xq2, *sf2, *l2p, *rc, *load, *rec, *cpy;
  CK(cudaMalloc(&logits, maxT * maxE * 4));
  CK(cudaMalloc(&bias, maxE * 4));
  CK(cudaMalloc(&hs, maxT * maxH * 2));
  for (void** p : {&xq, &xq2}) CK(cudaMalloc(p, maxT * maxH));
  for (void** p : {&sf, &sf2}) CK(cudaMalloc(p, maxT * maxH / 32 * 4));
  for (void** p : {&io, &io2}) CK(cudaMalloc(p, maxT * maxK * 8));
  for (void** p : {&wo, &wo2, &ids, &w, &ids2, &w2}) CK(cudaMalloc(p, maxT * maxK * 4));
  CK(cudaMalloc(&l2p, maxE * R * 4));
  CK(cudaMalloc(&rc, maxE * 4));
  CK(cudaMalloc(&load, (maxE + extra) * 4));
  CK(cudaMalloc(&rec, 4));
  CK(cudaMalloc(&cpy, maxT * maxH * 4 + (1 << 20)));
  {  // logits randn (fp32, or bf16: the fp32 bits' high half), bias randn * 0.1, hidden bf16 randn * 17
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> lg(maxT * maxE), b(maxE);
    for (auto& x : lg) x = nd(rng);
    for (auto& x : b) x = 0.1f * nd(rng);
    const auto bf16_bits = [](float f) {  // (truncated)
      uint32_t u;
      std::memcpy(&u, &f, 4);
      return static_cast<uint16_t>(u >> 16);
    };
    std::vector<uint16_t> h(maxT * maxH);
    for (auto& x : h) x = bf16_bits(17.f * nd(rng));
    if (logits_bf16) {
      std::vector<uint16_t> lh(lg.size());
      for (size_t i = 0; i < lg.size(); ++i) lh[i] = bf16_bits(lg[i]);
      CK(cudaMemcpy(logits, lh.data(), lh.size() * 2, cudaMemcpyHostToDevice));
    } else {
      CK(cudaMemcpy(logits, lg.data(), lg.size() * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaMemcpy(bias, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(hs, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    const int32_t one = 1;
    CK(cudaMemcpy(rec, &one, 4, cudaMemcpyHostToDevice));
  }
  const double empty_us = time_graph(s, [&] { empty_kernel<<<1, 32, 0, s>>>(); }, 100, 20);
  std::printf("{\"kind\":\"empty_kernel\",\"us\":%.3f}\n", empty_us);
  for (const Layer& L : layers) {
    const int64_t E = L.E, K = L.K, H = L.H, P = E + extra;
    {  // EPLB map: logical l -> physical l, and the first `extra` also -> E + l (2 replicas)
      std::vector<int32_t> m(E * R, -1), c(E, 1);
      for (int64_t l = 0; l < E; ++l) {
        m[l * R] = static_cast<int32_t>(l);
        if (l < extra) m[l * R + 1] = static_cast<int32_t>(E + l), c[l] = 2;
      }
      CK(cudaMemcpy(l2p, m.data(), m.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(rc, c.data(), c.size() * 4, cudaMemcpyHostToDevice));
    }
    for (long long eplb : eplbs) {
      for (long long T : Ts) {
        const OutputShapes sh = output_shapes(T, H, K, scheme);
        RouterArgs r;
        r.router_logits = TensorRef(logits, logits_bf16 ? DType::kBFloat16 : DType::kFloat32, {T, E}, d);
        r.e_score_correction_bias = TensorRef(bias, DType::kFloat32, {E}, d);
        r.top_k = K;
        r.routed_scaling_factor = alpha;
        r.topk_ids = TensorRef(ids, DType::kInt32, {T, K}, d);
        r.topk_weights = TensorRef(w, DType::kFloat32, {T, K}, d);
        {
          const int32_t flag = eplb == 2 ? 0 : 1;
          CK(cudaMemcpy(rec, &flag, 4, cudaMemcpyHostToDevice));
        }
        if (eplb) {
          r.logical_to_physical_map = TensorRef(l2p, DType::kInt32, {E, R}, d);
          r.logical_replica_count = TensorRef(rc, DType::kInt32, {E}, d);
          r.expert_load_view = TensorRef(load, DType::kInt32, {P}, d);
          r.record_enabled = TensorRef(rec, DType::kInt32, {1}, d);
        }
        StageArgs st;  // the fused call's staging half: topk inputs left empty
        st.hidden_states = TensorRef(hs, DType::kBFloat16, {T, H}, d);
        st.x_q = TensorRef(xq, sh.x_q.dtype, {T, sh.x_q.shape[1]}, d);
        st.x_sf = TensorRef(sf, sh.x_sf.dtype, {T, sh.x_sf.shape[1]}, d);
        st.topk_idx_out = TensorRef(io, DType::kInt64, {T, K}, d);
        st.topk_weights_out = TensorRef(wo, DType::kFloat32, {T, K}, d);
        st.hidden_quant = scheme;
        // Two steps into separate buffers: route (public ids2 / w2), then staging from them.
        RouterArgs r2 = r;
        r2.topk_ids = TensorRef(ids2, DType::kInt32, {T, K}, d);
        r2.topk_weights = TensorRef(w2, DType::kFloat32, {T, K}, d);
        StageArgs st2 = st;
        st2.x_q = TensorRef(xq2, sh.x_q.dtype, {T, sh.x_q.shape[1]}, d);
        st2.x_sf = TensorRef(sf2, sh.x_sf.dtype, {T, sh.x_sf.shape[1]}, d);
        st2.topk_idx_out = TensorRef(io2, DType::kInt64, {T, K}, d);
        st2.topk_weights_out = TensorRef(wo2, DType::kFloat32, {T, K}, d);
        st2.topk_ids = r2.topk_ids;
        st2.topk_weights = r2.topk_weights;
        auto fused = [&] { route_and_stage(r, st, s); };
        auto two_step = [&] {
          route(r2, s);
          prepare_inputs(st2, s);
        };
        auto route_only = [&] { route(r2, s); };
        auto stage_only = [&] { prepare_inputs(st2, s); };
        // Correctness first (poisoned outputs, one eager call each): the fused bytes equal
        // the two steps', and the EPLB load counts T x K entries per call.
        const size_t nq = sh.x_q.numel() * dtype_size(sh.x_q.dtype);
        const size_t nsf = sh.x_sf.numel() * dtype_size(sh.x_sf.dtype);
        for (void* p : {xq, xq2}) CK(cudaMemsetAsync(p, 0xA5, nq, s));
        for (void* p : {sf, sf2}) CK(cudaMemsetAsync(p, 0xA5, nsf, s));
        for (void* p : {io, io2}) CK(cudaMemsetAsync(p, 0xA5, T * K * 8, s));
        for (void* p : {wo, wo2, ids, ids2, w, w2}) CK(cudaMemsetAsync(p, 0xA5, T * K * 4, s));
        CK(cudaMemsetAsync(load, 0, P * 4, s));
        fused();
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(s));
        std::vector<int32_t> l1(P);
        CK(cudaMemcpy(l1.data(), load, P * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemsetAsync(load, 0, P * 4, s));
        two_step();
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(s));
        std::vector<int32_t> l2(P);
        CK(cudaMemcpy(l2.data(), load, P * 4, cudaMemcpyDeviceToHost));
        bool same = to_host(xq, nq) == to_host(xq2, nq) && to_host(sf, nsf) == to_host(sf2, nsf) &&
                    to_host(io, T * K * 8) == to_host(io2, T * K * 8) && to_host(wo, T * K * 4) == to_host(wo2, T * K * 4) &&
                    to_host(ids, T * K * 4) == to_host(ids2, T * K * 4) && to_host(w, T * K * 4) == to_host(w2, T * K * 4);
        long long recorded = 0;
        for (int32_t v : l1) recorded += v;
        same = same && l1 == l2;
        const int calls = T >= 1024 ? 10 : 20, reps = T >= 1024 ? 15 : 30;
        const double fused_us = time_graph(s, fused, calls, reps);
        const double two_us = time_graph(s, two_step, calls, reps);
        const double route_us = time_graph(s, route_only, calls, reps);
        const double stage_us = time_graph(s, stage_only, calls, reps);
        // Bytes of the fused call: logits + bias in, hidden in, x_q / x_sf / both top-k pairs out.
        const double bytes = T * E * (logits_bf16 ? 2.0 : 4.0) + E * 4.0 + T * H * 2.0 + nq + nsf + T * K * (4 + 4 + 8 + 4.0);
        const size_t half = static_cast<size_t>(bytes / 2);
        const double copy_us = time_graph(
            s, [&] { CK(cudaMemcpyAsync(cpy, static_cast<char*>(cpy) + ((half + 255) / 256) * 256, half, cudaMemcpyDeviceToDevice, s)); },
            calls, reps);
        std::printf("{\"kind\":\"router\",\"source\":\"cpp\",\"format\":\"%s\",\"logits\":\"%s\",\"E\":%lld,\"K\":%lld,\"H\":%lld,\"T\":%lld,"
                    "\"eplb\":%s,\"record\":%s,\"bytes\":%.0f,\"fused_us\":%.3f,\"route_then_stage_us\":%.3f,\"route_us\":%.3f,"
                    "\"stage_us\":%.3f,\"copy_us\":%.3f,\"fused_equals_two_step\":%s,\"eplb_recorded\":%lld}\n",
                    format.c_str(), logits_dtype.c_str(), (long long)E, (long long)K, (long long)H, T, eplb ? "true" : "false", eplb == 1 ? "true" : "false", bytes, fused_us,
                    two_us, route_us, stage_us, copy_us, same ? "true" : "false", recorded);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
