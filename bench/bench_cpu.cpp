// bench_cpu.cpp: CPU staging throughput (megamoe::prepare_inputs on host tensors) next to
// a memcpy of the same byte count in the same run, per format, T, H and thread count.
// bench/run_cpu_bench.sh runs it with the NumPy rendering (bench/np_reference.py) and
// writes bench/results/cpu_<machine>_<commit>.json.
//
//   megamoe_bench_cpu [--T 1,64,1024,4096,16384] [--H 7168,4096] [--formats all|a,b,...]
//                     [--threads 1,0] [--min-time 0.5] [--scalar] [--json FILE]
//   megamoe_bench_cpu --dump DIR   (small staged problems for np_reference.py --check)
//
// Problem: bf16 hidden = randn * 17, K = 8 fp32 weights and int32 ids, every 5th token
// padded (the GPU benchmark's inputs); the same buffers every call, as in an engine. "bytes"
// counts every byte read and written. memcpy copies that many bytes from one buffer to
// another, on one thread or split over the same number of threads (a team started once).
// --threads 0 means every CPU (megamoe::set_cpu_threads(0)). --scalar times the scalar
// path (the vectorized quantizer off), the baseline the SIMD path replaced.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/simd.h"
#include "cpu_simd_hooks.h"  // (active_target: the instruction set it prints)
#include "megamoe/cpu.h"
#include "megamoe/megamoe.h"

namespace {

using megamoe::DType;
using megamoe::QuantScheme;
using megamoe::TensorRef;
using Clock = std::chrono::steady_clock;

struct Format {
  const char* name;
  QuantScheme q;
};

std::vector<Format> AllFormats() {
  return {{"mxfp8", QuantScheme::mxfp8()},
          {"fp8_fp32_g128", QuantScheme::fp8_fp32_g128()},
          {"mxfp4", QuantScheme::mxfp4()},
          {"mxfp4_rne", QuantScheme::mxfp4(megamoe::Rounding::kNearestEven)},
          {"nvfp4_static", QuantScheme::nvfp4_static()},
          {"nvfp4_per_token", QuantScheme::nvfp4_per_token()}};
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = std::min(s.find(',', b), s.size());
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

/// Threads started once that each copy a slice of a memcpy, so the multi-threaded memcpy
/// pays no thread start either.
class CopyTeam {
 public:
  explicit CopyTeam(int n) : n_(n) {
    for (int i = 1; i < n; ++i) threads_.emplace_back([this, i] { Loop(i); });
  }
  ~CopyTeam() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void Copy(void* dst, const void* src, size_t bytes) {
    dst_ = static_cast<char*>(dst);
    src_ = static_cast<const char*>(src);
    bytes_ = bytes;
    if (n_ > 1) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        pending_ = n_ - 1;
        ++generation_;
      }
      cv_.notify_all();
    }
    Slice(0);
    if (n_ > 1) {
      std::unique_lock<std::mutex> lk(mu_);
      done_cv_.wait(lk, [&] { return pending_ == 0; });
    }
  }

 private:
  void Slice(int i) {
    const size_t b = bytes_ * i / n_, e = bytes_ * (i + 1) / n_;
    std::memcpy(dst_ + b, src_ + b, e - b);
  }
  void Loop(int i) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
      }
      Slice(i);
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
  int n_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  char* dst_ = nullptr;
  const char* src_ = nullptr;
  size_t bytes_ = 0;
};

/// Median seconds per call of f: warm up, then repeat until min_time has passed (at least
/// 3 calls).
double TimeIt(const std::function<void()>& f, double min_time) {
  const auto w0 = Clock::now();
  do f();
  while (std::chrono::duration<double>(Clock::now() - w0).count() < std::min(0.02, min_time));
  std::vector<double> t;
  const auto t0 = Clock::now();
  while (t.size() < 3 || std::chrono::duration<double>(Clock::now() - t0).count() < min_time) {
    const auto a = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

uint16_t Bf16(float f) {  // round to nearest even (inputs are finite)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/// One staging problem and its buffers.
struct Problem {
  int64_t T, H, K = 8;
  QuantScheme q;
  std::vector<uint16_t> hidden;
  std::vector<float> w;
  std::vector<int32_t> ids;
  std::vector<uint8_t> pad;
  std::vector<uint8_t> xq;
  std::vector<int32_t> sf;
  std::vector<int64_t> idx;
  std::vector<float> w_out, x_scales;
  float gs = 17.0f * 5.0f / 2688.0f;  // a calibrated global scale: amax ~ 5 sigma
  megamoe::StageArgs a;
  int64_t bytes = 0;

  Problem(int64_t T_, int64_t H_, const QuantScheme& q_, uint32_t seed) : T(T_), H(H_), q(q_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 17.0f);
    hidden.resize(static_cast<size_t>(T * H));
    for (auto& h : hidden) h = Bf16(n(rng));
    w.resize(static_cast<size_t>(T * K));
    ids.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = static_cast<float>(rng() % 1000) / 1000.0f;
      ids[i] = static_cast<int32_t>(rng() % 256);
    }
    pad.resize(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pad[t] = t % 5 == 4;
    const megamoe::OutputShapes s = megamoe::output_shapes(T, H, K, q);
    xq.assign(static_cast<size_t>(s.x_q.numel()), 0);
    sf.assign(static_cast<size_t>(s.x_sf.numel()), 0);
    idx.assign(w.size(), 0);
    w_out.assign(w.size(), 0.0f);
    a.hidden_states = TensorRef(hidden.data(), DType::kBFloat16, {T, H});
    a.topk_weights = TensorRef(w.data(), DType::kFloat32, {T, K});
    a.topk_ids = TensorRef(ids.data(), DType::kInt32, {T, K});
    a.is_padding = TensorRef(pad.data(), DType::kUInt8, {T});
    a.x_q = TensorRef(xq.data(), s.x_q.dtype, {s.x_q.shape[0], s.x_q.shape[1]});
    a.x_sf = TensorRef(sf.data(), s.x_sf.dtype, {s.x_sf.shape[0], s.x_sf.shape[1]});
    a.topk_idx_out = TensorRef(idx.data(), DType::kInt64, {T, K});
    a.topk_weights_out = TensorRef(w_out.data(), DType::kFloat32, {T, K});
    a.hidden_quant = q;
    if (s.global_scale) a.global_scale = TensorRef(&gs, DType::kFloat32, {1});
    if (s.x_scales) {
      x_scales.assign(static_cast<size_t>(T), 0.0f);
      a.x_scales = TensorRef(x_scales.data(), DType::kFloat32, {T});
    }
    bytes = T * H * 2 + T * K * (4 + 4 + 8 + 4) + T + s.x_q.numel() + s.x_sf.numel() * 4 +
            (s.x_scales ? T * 4 : 0) + (s.global_scale ? 4 : 0);
  }
};

template <typename T>
void WriteRaw(const std::string& path, const std::vector<T>& v) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(v.data(), sizeof(T), v.size(), f) != v.size()) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  std::fclose(f);
}

/// Small problems and their staged outputs, raw little-endian, with a manifest, for
/// np_reference.py --check (the NumPy rendering must give the same bytes).
int Dump(const std::string& dir) {
  std::string manifest = "[\n";
  const std::vector<Format> formats = AllFormats();
  for (size_t fi = 0; fi < formats.size(); ++fi) {
    const Format& f = formats[fi];
    Problem p(37, 1024, f.q, 11);
    // Some non-finite and tiny inputs too: the rendering must agree there as well.
    p.hidden[5] = 0x7FC0;
    p.hidden[200] = 0xFF80;
    p.hidden[1500] = 0x0001;
    for (int i = 0; i < 64; ++i) p.hidden[3000 + i] = 0x8000;
    megamoe::prepare_inputs(p.a);
    const std::string b = dir + "/" + f.name;
    WriteRaw(b + "_hidden.bin", p.hidden);
    WriteRaw(b + "_w.bin", p.w);
    WriteRaw(b + "_ids.bin", p.ids);
    WriteRaw(b + "_pad.bin", p.pad);
    WriteRaw(b + "_xq.bin", p.xq);
    WriteRaw(b + "_sf.bin", p.sf);
    WriteRaw(b + "_idx.bin", p.idx);
    WriteRaw(b + "_wout.bin", p.w_out);
    WriteRaw(b + "_xscales.bin", p.x_scales);
    char line[256];
    std::snprintf(line, sizeof line, "  {\"format\": \"%s\", \"T\": %lld, \"H\": %lld, \"K\": %lld, \"gs\": %.9g}%s\n",
                  f.name, static_cast<long long>(p.T), static_cast<long long>(p.H), static_cast<long long>(p.K),
                  static_cast<double>(p.gs), fi + 1 == formats.size() ? "" : ",");
    manifest += line;
  }
  manifest += "]\n";
  FILE* m = std::fopen((dir + "/manifest.json").c_str(), "w");
  if (m == nullptr) return 1;
  std::fputs(manifest.c_str(), m);
  std::fclose(m);
  std::printf("wrote %s/manifest.json\n", dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> Ts = {"1", "64", "1024", "4096", "16384"}, Hs = {"7168", "4096"}, threads = {"1", "0"};
  std::vector<Format> formats = AllFormats();
  double min_time = 0.5;
  std::string json;
  bool scalar = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--T") Ts = Split(value());
    else if (arg == "--H") Hs = Split(value());
    else if (arg == "--threads") threads = Split(value());
    else if (arg == "--min-time") min_time = std::atof(value().c_str());
    else if (arg == "--json") json = value();
    else if (arg == "--scalar") scalar = true;
    else if (arg == "--dump") return Dump(value());
    else if (arg == "--formats") {
      const std::string v = value();
      if (v != "all") {
        std::vector<Format> picked;
        for (const std::string& n : Split(v)) {
          const auto it = std::find_if(formats.begin(), formats.end(), [&](const Format& f) { return n == f.name; });
          if (it == formats.end()) {
            std::fprintf(stderr, "unknown format %s\n", n.c_str());
            return 2;
          }
          picked.push_back(*it);
        }
        formats = picked;
      }
    } else {
      std::fprintf(stderr, "unknown argument %s (see the comment at the top of bench/bench_cpu.cpp)\n", arg.c_str());
      return 2;
    }
  }
  megamoe::cpu::simd::set_enabled(!scalar);
  FILE* out = json.empty() ? nullptr : std::fopen(json.c_str(), "a");
  if (!json.empty() && out == nullptr) {
    std::fprintf(stderr, "cannot open %s\n", json.c_str());
    return 1;
  }
  const char* target = scalar ? "scalar" : megamoe::cpu::simd::active_target();
  std::printf("instruction set: %s; CPUs: %d\n", target, (megamoe::set_cpu_threads(0), megamoe::cpu_threads()));
  std::printf("%-16s %6s %6s %4s %10s %11s %8s %11s %8s %7s\n", "format", "H", "T", "thr", "MB", "megamoe us",
              "GB/s", "memcpy us", "GB/s", "%memcpy");
  for (const std::string& hs : Hs) {
    const int64_t H = std::atoll(hs.c_str());
    for (const std::string& ts : Ts) {
      const int64_t T = std::atoll(ts.c_str());
      for (const Format& f : formats) {
        Problem p(T, H, f.q, static_cast<uint32_t>(T * 31 + H));
        std::vector<char> src(static_cast<size_t>(p.bytes), 1), dst(static_cast<size_t>(p.bytes), 0);
        for (const std::string& th : threads) {
          const int n = std::atoi(th.c_str());
          megamoe::set_cpu_threads(n);
          const int used = megamoe::cpu_threads();
          const double t_stage = TimeIt([&] { megamoe::prepare_inputs(p.a); }, min_time);
          CopyTeam team(used);
          const double t_copy = TimeIt([&] { team.Copy(dst.data(), src.data(), src.size()); }, min_time);
          const double gb = static_cast<double>(p.bytes) / 1e9;
          std::printf("%-16s %6lld %6lld %4d %10.2f %11.1f %8.2f %11.1f %8.2f %6.0f%%\n", f.name,
                      static_cast<long long>(H), static_cast<long long>(T), used, gb * 1e3, t_stage * 1e6,
                      gb / t_stage, t_copy * 1e6, gb / t_copy, 100.0 * t_copy / t_stage);
          std::fflush(stdout);
          if (out != nullptr) {
            std::fprintf(out,
                         "{\"format\": \"%s\", \"H\": %lld, \"T\": %lld, \"threads\": %d, \"bytes\": %lld, "
                         "\"megamoe_us\": %.3f, \"megamoe_gbps\": %.4f, \"memcpy_us\": %.3f, \"memcpy_gbps\": %.4f, "
                         "\"target\": \"%s\"}\n",
                         f.name, static_cast<long long>(H), static_cast<long long>(T), used,
                         static_cast<long long>(p.bytes), t_stage * 1e6, gb / t_stage, t_copy * 1e6, gb / t_copy,
                         target);
            std::fflush(out);
          }
        }
      }
    }
  }
  if (out != nullptr) std::fclose(out);
  return 0;
}
