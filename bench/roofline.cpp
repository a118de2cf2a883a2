// SPDX-License-Identifier: Apache-2.0
// The roofline probe: this machine's fp32 FMA peak, copy bandwidth and read
// bandwidth, measured with the Highway target that dynamic dispatch picks
// (the same choice the optimized backend makes), on OpenMP threads. Every
// benchmark figure is divided by these to give frac_peak, frac_copy and
// (for decode, which only reads) frac_read.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "roofline.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace tandem::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// Runs `rounds` rounds of 12 independent FMA chains (more than
/// latency × FMA ports on current cores, so the chains never wait on each
/// other), stores a value depending on all of them in *sink and returns the
/// number of floating-point operations done (2 per lane per FMA).
double FmaChains(std::int64_t rounds, float* sink) {
  const hn::ScalableTag<float> d;
  const auto m = hn::Set(d, 0.9999999f);
  const auto c = hn::Set(d, 1e-7f);
  auto a0 = hn::Set(d, 1.00f), a1 = hn::Set(d, 1.01f), a2 = hn::Set(d, 1.02f);
  auto a3 = hn::Set(d, 1.03f), a4 = hn::Set(d, 1.04f), a5 = hn::Set(d, 1.05f);
  auto a6 = hn::Set(d, 1.06f), a7 = hn::Set(d, 1.07f), a8 = hn::Set(d, 1.08f);
  auto a9 = hn::Set(d, 1.09f), a10 = hn::Set(d, 1.10f), a11 = hn::Set(d, 1.11f);
  for (std::int64_t r = 0; r < rounds; ++r) {
    a0 = hn::MulAdd(a0, m, c);
    a1 = hn::MulAdd(a1, m, c);
    a2 = hn::MulAdd(a2, m, c);
    a3 = hn::MulAdd(a3, m, c);
    a4 = hn::MulAdd(a4, m, c);
    a5 = hn::MulAdd(a5, m, c);
    a6 = hn::MulAdd(a6, m, c);
    a7 = hn::MulAdd(a7, m, c);
    a8 = hn::MulAdd(a8, m, c);
    a9 = hn::MulAdd(a9, m, c);
    a10 = hn::MulAdd(a10, m, c);
    a11 = hn::MulAdd(a11, m, c);
  }
  auto s =
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  s = hn::Add(s, hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  *sink = hn::GetLane(hn::SumOfLanes(d, s));
  return static_cast<double>(rounds) * 12.0 * static_cast<double>(hn::Lanes(d)) * 2.0;
}

/// dst[i] = src[i] for i < n; both vector-aligned, n a multiple of 4 vectors.
void CopyFloats(const float* HWY_RESTRICT src, float* HWY_RESTRICT dst, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t N = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    const auto v0 = hn::Load(d, src + i);
    const auto v1 = hn::Load(d, src + i + N);
    const auto v2 = hn::Load(d, src + i + 2 * N);
    const auto v3 = hn::Load(d, src + i + 3 * N);
    hn::Store(v0, d, dst + i);
    hn::Store(v1, d, dst + i + N);
    hn::Store(v2, d, dst + i + 2 * N);
    hn::Store(v3, d, dst + i + 3 * N);
  }
  for (; i < n; ++i) dst[i] = src[i];
}

/// Sum of src[0..n) with four vector accumulators.
float SumFloats(const float* HWY_RESTRICT src, std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  std::size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::Add(s0, hn::Load(d, src + i));
    s1 = hn::Add(s1, hn::Load(d, src + i + N));
    s2 = hn::Add(s2, hn::Load(d, src + i + 2 * N));
    s3 = hn::Add(s3, hn::Load(d, src + i + 3 * N));
  }
  float rest = 0.0f;
  for (; i < n; ++i) rest += src[i];
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3)))) + rest;
}

/// The target this code was compiled for.
std::int64_t ThisTarget() {
  return HWY_TARGET;
}

}  // namespace tandem::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <hwy/aligned_allocator.h>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace tandem::bench {

HWY_EXPORT(FmaChains);
HWY_EXPORT(CopyFloats);
HWY_EXPORT(SumFloats);
HWY_EXPORT(ThisTarget);

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// CPU time consumed by the calling thread (seconds).
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// One FMA trial: `rounds` rounds on every one of `threads` threads.
struct FmaTrial {
  double wall_rate = 0.0;  ///< FLOPs of all threads / wall time
  double cpu_rate = 0.0;   ///< sum over threads of FLOPs / that thread's CPU time
  double wall_s = 0.0;
};

FmaTrial fma_trial(int threads, std::int64_t rounds) {
  std::vector<float> sink(static_cast<std::size_t>(threads) * 16, 0.0f);
  double flops = 0.0, cpu_rate = 0.0;
  const double t0 = now_s();
#pragma omp parallel num_threads(threads) reduction(+ : flops, cpu_rate)
  {
    const int t = omp_get_thread_num();
    const double c0 = thread_cpu_s();
    const double f =
        HWY_DYNAMIC_DISPATCH(FmaChains)(rounds, &sink[static_cast<std::size_t>(t) * 16]);
    const double c = thread_cpu_s() - c0;
    flops += f;
    cpu_rate += c > 0 ? f / c : 0.0;
  }
  FmaTrial r;
  r.wall_s = now_s() - t0;
  r.wall_rate = flops / r.wall_s;
  r.cpu_rate = cpu_rate;
  benchmark::DoNotOptimize(sink.data());
  return r;
}

/// Chunk [begin, end) of n floats for thread t of `threads`, a multiple of 64.
void chunk(std::size_t n, int threads, int t, std::size_t* begin, std::size_t* end) {
  const std::size_t per = (n / static_cast<std::size_t>(threads) + 63) / 64 * 64;
  *begin = std::min(n, per * static_cast<std::size_t>(t));
  *end = std::min(n, *begin + per);
}
}  // namespace

double measure_fma_gflops(int threads, double seconds, double* wall_gflops) {
  // Calibrate on a short run, then take the best of three trials of about
  // seconds/3 each. Each thread's rate is its FLOPs over its own CPU time, so
  // the peak is what the cores can do even while other processes share them
  // (the wall-clock rate is returned too: it drops when they do).
  std::int64_t rounds = 1 << 16;
  const FmaTrial first = fma_trial(threads, rounds);
  const double cpu_share = first.wall_rate > 0 ? first.cpu_rate / first.wall_rate : 1.0;
  rounds = std::max<std::int64_t>(
      1 << 16, static_cast<std::int64_t>(static_cast<double>(rounds) * seconds / 3.0 /
                                         (first.wall_s * std::max(1.0, cpu_share))));
  double best_cpu = 0.0, best_wall = 0.0;
  for (int trial = 0; trial < 3; ++trial) {
    const FmaTrial t = fma_trial(threads, rounds);
    best_cpu = std::max(best_cpu, t.cpu_rate);
    best_wall = std::max(best_wall, t.wall_rate);
  }
  if (wall_gflops) *wall_gflops = best_wall / 1e9;
  return best_cpu / 1e9;
}

double measure_copy_gbs(int threads, std::size_t bytes, int passes) {
  const std::size_t n = bytes / sizeof(float);
  auto src = hwy::AllocateAligned<float>(n);
  auto dst = hwy::AllocateAligned<float>(n);
  // First touch by the thread that will copy each chunk.
#pragma omp parallel num_threads(threads)
  {
    std::size_t b = 0, e = 0;
    chunk(n, threads, omp_get_thread_num(), &b, &e);
    for (std::size_t i = b; i < e; ++i) {
      src[i] = static_cast<float>(i & 1023);
      dst[i] = 0.0f;
    }
  }
  double best = 0.0;
  for (int pass = 0; pass <= passes; ++pass) {  // pass 0 warms up
    const double t0 = now_s();
#pragma omp parallel num_threads(threads)
    {
      std::size_t b = 0, e = 0;
      chunk(n, threads, omp_get_thread_num(), &b, &e);
      HWY_DYNAMIC_DISPATCH(CopyFloats)(src.get() + b, dst.get() + b, e - b);
    }
    const double dt = now_s() - t0;
    benchmark::DoNotOptimize(dst.get());
    if (pass > 0) best = std::max(best, 2.0 * static_cast<double>(n * sizeof(float)) / dt);
  }
  return best / 1e9;
}

double measure_read_gbs(int threads, std::size_t bytes, int passes) {
  const std::size_t n = bytes / sizeof(float);
  auto src = hwy::AllocateAligned<float>(n);
#pragma omp parallel num_threads(threads)
  {
    std::size_t b = 0, e = 0;
    chunk(n, threads, omp_get_thread_num(), &b, &e);
    for (std::size_t i = b; i < e; ++i) src[i] = static_cast<float>(i & 1023);
  }
  double best = 0.0;
  float total = 0.0f;
  for (int pass = 0; pass <= passes; ++pass) {
    const double t0 = now_s();
    float s = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : s)
    {
      std::size_t b = 0, e = 0;
      chunk(n, threads, omp_get_thread_num(), &b, &e);
      s += HWY_DYNAMIC_DISPATCH(SumFloats)(src.get() + b, e - b);
    }
    const double dt = now_s() - t0;
    total += s;
    if (pass > 0) best = std::max(best, static_cast<double>(n * sizeof(float)) / dt);
  }
  benchmark::DoNotOptimize(total);
  return best / 1e9;
}

std::string roofline_target() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(ThisTarget)());
}

void register_roofline() {
  if (!op_selected("roofline")) return;
  std::vector<int> counts = config().scaling_threads;
  if (std::find(counts.begin(), counts.end(), config().threads) == counts.end()) {
    counts.push_back(config().threads);
  }
  std::sort(counts.begin(), counts.end());
  const std::size_t bytes = beyond_cache_bytes();
  const std::string mib = std::to_string(bytes >> 20) + "MiB";
  for (int t : counts) {
    Spec fma;
    fma.name = "roofline_fma/probe/fp32/threads:" + std::to_string(t);
    fma.op = "roofline_fma";
    fma.backend = "probe";
    fma.shape = "fp32";
    fma.threads = t;
    fma.tags = {"roofline"};
    add(
        fma,
        [t](benchmark::State& st) {
          double g = 0.0, wall = 0.0;
          for (auto _ : st) g = measure_fma_gflops(t, 0.3, &wall);
          st.counters["GFLOP/s"] = g;
          st.counters["GFLOP/s_wall"] = wall;
          st.counters["threads"] = t;
          st.SetLabel(roofline_target());
        },
        1e-9);
    Spec copy;
    copy.name = "roofline_copy/probe/2x" + mib + "/threads:" + std::to_string(t);
    copy.op = "roofline_copy";
    copy.backend = "probe";
    copy.shape = "2x" + mib;
    copy.threads = t;
    copy.params["bytes"] = 2.0 * static_cast<double>(bytes);
    copy.tags = {"roofline"};
    add(
        copy,
        [t, bytes](benchmark::State& st) {
          double g = 0.0;
          for (auto _ : st) g = measure_copy_gbs(t, bytes, 8);
          st.counters["GB/s"] = g;
          st.counters["threads"] = t;
        },
        1e-9);
    Spec read;
    read.name = "roofline_read/probe/" + mib + "/threads:" + std::to_string(t);
    read.op = "roofline_read";
    read.backend = "probe";
    read.shape = mib;
    read.threads = t;
    read.params["bytes"] = static_cast<double>(bytes);
    read.tags = {"roofline"};
    add(
        read,
        [t, bytes](benchmark::State& st) {
          double g = 0.0;
          for (auto _ : st) g = measure_read_gbs(t, bytes, 8);
          st.counters["GB/s"] = g;
          st.counters["threads"] = t;
        },
        1e-9);
  }
}

}  // namespace tandem::bench
#endif  // HWY_ONCE
