// router_accuracy.cpp: the accuracy of the router's own exp and log1p (src/core/router.h)
// over every fp32 input, against the correctly rounded result and against glibc's expf /
// log1pf (docs/ROUTER.md quotes its output).
//
// The correctly rounded fp32 of e^x (log(1+y)) is decided from glibc's double exp (log1p),
// accurate to about one double ulp: when that double lies farther than 2^-50 (relative)
// from every fp32 rounding boundary, its own rounding is the correct one. Closer than that,
// x87 long double (64-bit significand) decides, with a margin of 2^-60; an input that even
// this cannot decide is "unresolved" and passes only if it is one of kSettledLog1p (two
// log1p inputs, settled with mpmath at 300 bits) with that result. Errors in ulps are
// |result - exact| / ulp(exact) with the double (or long double) value standing for exact.
//
// --only scores compares the router's fast score path (core::router_score: fused
// multiply-adds, a refined reciprocal, the exact chain where it cannot decide) with the
// exact chain (core::router_score_exact) on every fp32 logit, bit for bit, and counts the
// fallbacks.
//
// Usage: router_accuracy [--threads N] [--exceptions] [--only exp|log1p|scores]
//   --exceptions  print the misrounded inputs as (input, correct result) pairs, the form of
//                 log1p_exception() in src/core/router.h (with that table in place the
//                 program finds none), and the unresolved ones.
//   --only        one function, or the score paths.
// Build: cmake -DMEGAMOE_BUILD_BENCH=ON ... && ninja megamoe_router_accuracy, or directly
//   g++ -O2 -std=c++17 -ffp-contract=off -Isrc bench/router_accuracy.cpp -o router_accuracy -lpthread
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/router.h"

namespace {

float f_of(uint32_t u) { return megamoe::core::bits_float(u); }
uint32_t u_of(float f) { return megamoe::core::float_bits(f); }

/// Where @p v (an approximation of the exact value, relative error <= tol) rounds to in
/// fp32, or false when a rounding boundary lies within the error.
template <typename Real>
bool decided_round(Real v, Real tol, float* out) {
  const float f = static_cast<float>(v);
  if (std::isinf(f) && std::fabs(v) < static_cast<Real>(FLT_MAX) * 2) {
    // overflow boundary: FLT_MAX + half an ulp
    const Real bound = static_cast<Real>(FLT_MAX) + static_cast<Real>(std::ldexp(1.0, 103));
    if (std::fabs(std::fabs(v) - bound) <= tol * std::fabs(v)) return false;
    *out = f;
    return true;
  }
  if (std::isinf(f) || v == 0) {
    *out = f;
    return true;
  }
  // The boundary on v's side of f: the midpoint to the neighbour in v's direction.
  const float nb = std::nextafter(f, static_cast<Real>(f) < v ? INFINITY : -INFINITY);
  const Real mid = (static_cast<Real>(f) + static_cast<Real>(nb)) / 2;
  if (std::fabs(v - mid) <= tol * std::fabs(v)) return false;
  *out = f;
  return true;
}

/// ulp of the fp32 binade of |v| (2^-149 in the subnormal range).
double ulp_at(long double v) {
  const long double a = std::fabs(v);
  if (a < static_cast<long double>(FLT_MIN)) return std::ldexp(1.0, -149);
  int e;
  std::frexp(static_cast<double>(a), &e);  // a = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 24);
}

struct Stats {
  uint64_t inputs = 0;
  uint64_t wrong = 0;       // not the correctly rounded result
  uint64_t unresolved = 0;  // the reference could not decide
  uint64_t vs_glibc = 0;    // results differing from glibc's
  uint64_t glibc_wrong = 0;
  double max_ulp = 0, glibc_max_ulp = 0;
  uint32_t max_ulp_at = 0, glibc_max_ulp_at = 0;
  std::vector<std::pair<uint32_t, uint32_t>> exceptions;  // (x, correct y) of misrounded inputs
  std::vector<std::pair<uint32_t, uint32_t>> undecided;   // (x, megamoe's y) of unresolved inputs

  void merge(const Stats& o) {
    inputs += o.inputs;
    wrong += o.wrong;
    unresolved += o.unresolved;
    vs_glibc += o.vs_glibc;
    glibc_wrong += o.glibc_wrong;
    if (o.max_ulp > max_ulp) max_ulp = o.max_ulp, max_ulp_at = o.max_ulp_at;
    if (o.glibc_max_ulp > glibc_max_ulp) glibc_max_ulp = o.glibc_max_ulp, glibc_max_ulp_at = o.glibc_max_ulp_at;
    exceptions.insert(exceptions.end(), o.exceptions.begin(), o.exceptions.end());
    undecided.insert(undecided.end(), o.undecided.begin(), o.undecided.end());
  }
};

/// Inputs whose exact log(1 + y) lies within 2^-66 of an fp32 midpoint, beyond long
/// double: their correctly rounded results, computed with mpmath at 300 bits.
constexpr std::pair<uint32_t, uint32_t> kSettledLog1p[] = {{0x35400003u, 0x353FFFFFu}, {0xB53FFFFDu, 0xB5400001u}};

/// Every unresolved input of @p s is settled above, with megamoe giving the settled result.
bool unresolved_settled(const Stats& s) {
  for (const auto& [x, y] : s.undecided) {
    bool ok = false;
    for (const auto& [sx, sy] : kSettledLog1p) ok = ok || (x == sx && y == sy);
    if (!ok) return false;
  }
  return true;
}

bool same(float a, float b) { return (a != a && b != b) || u_of(a) == u_of(b); }

/// One function over inputs [lo, hi] (bit patterns).
template <typename Mine, typename Glibc, typename RefD, typename RefL>
void run_range(uint64_t lo, uint64_t hi, Mine mine, Glibc glibc, RefD ref_d, RefL ref_l, Stats* st) {
  for (uint64_t b = lo; b <= hi; ++b) {
    const float x = f_of(static_cast<uint32_t>(b));
    const float m = mine(x), g = glibc(x);
    ++st->inputs;
    const double d = ref_d(x);
    float cr;
    long double exact = d;
    if (!(d == d)) {
      cr = NAN;
    } else if (!decided_round<double>(d, std::ldexp(1.0, -50), &cr)) {
      exact = ref_l(x);
      if (!decided_round<long double>(exact, std::ldexp(1.0L, -60), &cr)) {
        ++st->unresolved;
        st->undecided.emplace_back(static_cast<uint32_t>(b), u_of(m));
        continue;
      }
    }
    if (!same(m, g)) ++st->vs_glibc;
    auto err = [&](float r) -> double {
      if (r != r || cr != cr) return same(r, cr) ? 0.0 : INFINITY;
      if (std::isinf(r) || std::isinf(cr)) return u_of(r) == u_of(cr) ? 0.0 : INFINITY;
      return static_cast<double>(std::fabs(static_cast<long double>(r) - exact) / ulp_at(exact));
    };
    if (!same(m, cr)) {
      ++st->wrong;
      st->exceptions.emplace_back(static_cast<uint32_t>(b), u_of(cr));
    }
    if (!same(g, cr)) ++st->glibc_wrong;
    const double em = err(m), eg = err(g);
    if (em > st->max_ulp) st->max_ulp = em, st->max_ulp_at = static_cast<uint32_t>(b);
    if (eg > st->glibc_max_ulp) st->glibc_max_ulp = eg, st->glibc_max_ulp_at = static_cast<uint32_t>(b);
  }
}

/// Calls fn(lo, hi, worker) for blocks [lo, hi] of 2^22 bit patterns covering all 2^32,
/// taken in turn by @p threads workers (0 .. threads-1).
template <typename Fn>
void for_all_blocks(int threads, Fn fn) {
  std::vector<std::thread> pool;
  std::atomic<uint64_t> next{0};
  constexpr uint64_t kBlock = uint64_t{1} << 22;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      for (;;) {
        const uint64_t lo = next.fetch_add(kBlock);
        if (lo > 0xFFFFFFFFull) return;
        fn(lo, lo + kBlock - 1, i);
      }
    });
  }
  for (auto& t : pool) t.join();
}

template <typename... F>
Stats run_all(int threads, F... f) {
  std::vector<Stats> part(static_cast<size_t>(threads));
  for_all_blocks(threads, [&](uint64_t lo, uint64_t hi, int i) { run_range(lo, hi, f..., &part[static_cast<size_t>(i)]); });
  Stats all;
  for (const Stats& s : part) all.merge(s);
  std::sort(all.exceptions.begin(), all.exceptions.end());
  std::sort(all.undecided.begin(), all.undecided.end());
  return all;
}

void report(const char* name, const char* glibc_name, const Stats& s, bool tables) {
  std::printf("%s: %llu fp32 inputs (all bit patterns)\n", name, static_cast<unsigned long long>(s.inputs));
  std::printf("  megamoe: max error %.6f ulp (at 0x%08X = %a), %llu not correctly rounded, %llu unresolved\n",
              s.max_ulp, s.max_ulp_at, static_cast<double>(f_of(s.max_ulp_at)),
              static_cast<unsigned long long>(s.wrong), static_cast<unsigned long long>(s.unresolved));
  std::printf("  glibc %s: max error %.6f ulp (at 0x%08X = %a), %llu not correctly rounded\n", glibc_name,
              s.glibc_max_ulp, s.glibc_max_ulp_at, static_cast<double>(f_of(s.glibc_max_ulp_at)),
              static_cast<unsigned long long>(s.glibc_wrong));
  std::printf("  megamoe != glibc on %llu inputs (NaN == NaN)\n", static_cast<unsigned long long>(s.vs_glibc));
  if (tables) {
    for (const auto& [x, y] : s.exceptions) {
      std::printf("    {0x%08Xu, 0x%08Xu},  // %a -> %a\n", x, y, static_cast<double>(f_of(x)), static_cast<double>(f_of(y)));
    }
    for (const auto& [x, y] : s.undecided) {
      std::printf("    unresolved: 0x%08X (%a), megamoe gives 0x%08X (%a): decide with more precision\n", x,
                  static_cast<double>(f_of(x)), y, static_cast<double>(f_of(y)));
    }
  }
}

/// Every fp32 logit: router_score == router_score_exact bitwise; counts the fast path's
/// fallbacks (the logits below kExpFastMin apart) and keeps the first few.
bool run_scores(int threads) {
  namespace core = megamoe::core;
  std::atomic<uint64_t> differ{0}, low{0}, near{0};
  std::mutex mu;
  std::vector<uint32_t> near_at, differ_at;
  auto keep = [&](std::vector<uint32_t>& v, uint64_t b) {
    std::lock_guard<std::mutex> g(mu);
    if (v.size() < 16) v.push_back(static_cast<uint32_t>(b));
  };
  for_all_blocks(threads, [&](uint64_t lo, uint64_t hi, int) {
    uint64_t d = 0, l = 0, n = 0;
    for (uint64_t b = lo; b <= hi; ++b) {
      const float x = f_of(static_cast<uint32_t>(b));
      float fast;
      const bool ok = core::router_score_fast(x, fast);
      if (u_of(core::router_score(x)) != u_of(core::router_score_exact(x))) ++d, keep(differ_at, b);
      if (!ok && x < core::kExpFastMin) ++l;
      else if (!ok) ++n, keep(near_at, b);
    }
    differ += d;
    low += l;
    near += n;
  });
  std::printf("scores: %llu fp32 logits (all bit patterns)\n", 1ull << 32);
  std::printf("  router_score != router_score_exact on %llu\n", static_cast<unsigned long long>(differ.load()));
  std::printf("  fallbacks to the exact chain: %llu near a midpoint, %llu below %g\n",
              static_cast<unsigned long long>(near.load()), static_cast<unsigned long long>(low.load()),
              static_cast<double>(core::kExpFastMin));
  std::sort(near_at.begin(), near_at.end());
  for (uint32_t b : near_at) std::printf("    near a midpoint: 0x%08X (%a)\n", b, static_cast<double>(f_of(b)));
  for (uint32_t b : differ_at) std::printf("    DIFFERS: 0x%08X (%a)\n", b, static_cast<double>(f_of(b)));
  return differ.load() == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each report line as it is printed
  int threads = 2;
  bool tables = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--exceptions") {
      tables = true;
    } else if (a == "--only" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "exp" || std::string(argv[i + 1]) == "log1p" ||
                std::string(argv[i + 1]) == "scores")) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--exceptions] [--only exp|log1p|scores]\n", argv[0]);
      return 2;
    }
  }
  namespace core = megamoe::core;
  if (only == "scores") {
    const bool same = run_scores(threads);
    std::printf("%s\n", same ? "PASS: the fast score path gives the exact chain's bits for every fp32 logit" : "FAIL");
    return same ? 0 : 1;
  }
  bool ok = true;
  if (only != "log1p") {
    const Stats e = run_all(
        threads, [](float x) { return core::exp_f32(x); }, [](float x) { return std::exp(x); },
        [](float x) { return std::exp(static_cast<double>(x)); },
        [](float x) { return std::exp(static_cast<long double>(x)); });
    report("exp", "expf", e, tables);
    ok = ok && e.wrong == 0 && e.unresolved == 0;
  }
  if (only != "exp") {
    const Stats l = run_all(
        threads, [](float x) { return core::log1p_f32(x); }, [](float x) { return std::log1p(x); },
        [](float x) { return std::log1p(static_cast<double>(x)); },
        [](float x) { return std::log1p(static_cast<long double>(x)); });
    report("log1p", "log1pf", l, tables);
    // Unresolved inputs count as correct only when settled above (mpmath, 300 bits).
    ok = ok && l.wrong == 0 && unresolved_settled(l);
  }
  std::printf("%s\n", ok ? "PASS: correctly rounded for every fp32 input" : "FAIL");
  std::fflush(stdout);
  return ok ? 0 : 1;
}
