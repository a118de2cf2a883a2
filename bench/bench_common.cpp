// SPDX-License-Identifier: Apache-2.0
// Shared machinery of tandem_bench: configuration, backends, the plan,
// buffers, roofline counters and the peak-RSS probe.
#include "bench_common.hpp"

#include <malloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "tandem/reference/backend.hpp"
#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"
#endif

namespace tandem::bench {

Config& config() {
  static Config c;
  return c;
}

bool op_selected(const std::string& op) {
  const auto& ops = config().ops;
  return ops.empty() || std::find(ops.begin(), ops.end(), op) != ops.end();
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

namespace {
bool backend_selected(const std::string& name) {
  const auto& b = config().backends;
  return b.empty() || std::find(b.begin(), b.end(), name) != b.end();
}
}  // namespace

std::vector<BackendUnderTest> backends_at(int threads, bool include_reference) {
  std::vector<BackendUnderTest> out;
  if (include_reference && backend_selected("reference")) {
    out.push_back({"reference", 1, [] { return tandem::reference::backend(); }});
  }
#ifdef TANDEM_HAVE_OPTIMIZED
  if (backend_selected("optimized")) {
    out.push_back({"optimized", threads, [threads] {
                     return tandem::optimized::backend(tandem::optimized::Options{threads});
                   }});
  }
#else
  (void)threads;
#endif
  return out;
}

std::vector<Spec>& plan() {
  static std::vector<Spec> p;
  return p;
}

double default_min_time() {
  if (config().min_time > 0) return config().min_time;
  switch (config().preset) {
    case Preset::quick:
      return 0.05;
    case Preset::standard:
      return 0.3;
    case Preset::full:
      return 0.5;
  }
  return 0.3;
}

void add(Spec spec, std::function<void(benchmark::State&)> fn, double min_time) {
  const std::string name = spec.name;
  auto* b = benchmark::RegisterBenchmark(name.c_str(),
                                         [fn = std::move(fn)](benchmark::State& st) { fn(st); });
  b->UseRealTime();
  b->Unit(benchmark::kMillisecond);
  b->MinTime(min_time > 0 ? min_time : default_min_time());
  plan().push_back(std::move(spec));
}

// ---- buffers ----------------------------------------------------------------------

std::vector<std::vector<std::int32_t>> shuffled_block_tables(std::size_t caches,
                                                             std::int64_t per_cache) {
  std::vector<std::int32_t> blocks(caches * static_cast<std::size_t>(per_cache));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937(7));
  std::vector<std::vector<std::int32_t>> tables;
  for (std::size_t c = 0; c < caches; ++c) {
    const auto first = blocks.begin() + static_cast<std::ptrdiff_t>(c) * per_cache;
    tables.emplace_back(first, first + per_cache);
  }
  return tables;
}

std::vector<float> random_buffer(std::size_t n, std::uint64_t seed, float lo, float hi) {
  std::vector<float> v(n);
  constexpr std::size_t kBlock = 1 << 16;
  const std::int64_t blocks = static_cast<std::int64_t>((n + kBlock - 1) / kBlock);
  const float span = hi - lo;
#pragma omp parallel for schedule(static)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    // splitmix64 per block: the values do not depend on the thread count.
    std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(blk) + 1;
    const std::size_t begin = static_cast<std::size_t>(blk) * kBlock;
    const std::size_t end = std::min(n, begin + kBlock);
    for (std::size_t i = begin; i < end; ++i) {
      state += 0x9E3779B97F4A7C15ull;
      std::uint64_t z = state;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      v[i] = lo + span * static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
    }
  }
  return v;
}

std::vector<float> zero_buffer(std::size_t n) {
  std::vector<float> v(n, 0.0f);  // value-initialised: every page written
  return v;
}

namespace detail {
AnyFixture& current_fixture() {
  static AnyFixture f;
  return f;
}
}  // namespace detail

// ---- roofline ---------------------------------------------------------------------

namespace {
/// The roofline figure of `threads` in `known` (given with --roofline, or
/// measured before), else measure() now, remembered.
double remembered(std::map<int, double>& known, int threads,
                  const std::function<double()>& measure) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(threads);
  if (it != known.end()) return it->second;
  return known[threads] = measure();
}
}  // namespace

std::size_t beyond_cache_bytes() {
  static const std::size_t bytes = [] {
    std::size_t b = std::size_t(256) << 20;
#ifdef _SC_LEVEL3_CACHE_SIZE
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 > 0) b = std::max(b, 2 * static_cast<std::size_t>(l3));
#endif
    return b;
  }();
  return bytes;
}

double peak_gflops(int threads) {
  return remembered(config().peak_gflops, threads,
                    [&] { return measure_fma_gflops(threads, 0.3); });
}

double copy_gbs(int threads) {
  return remembered(config().copy_gbs, threads,
                    [&] { return measure_copy_gbs(threads, beyond_cache_bytes(), 8); });
}

double read_gbs(int threads) {
  return remembered(config().read_gbs, threads,
                    [&] { return measure_read_gbs(threads, beyond_cache_bytes(), 8); });
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void set_flop_counters(benchmark::State& state, double flops, int threads, double seconds) {
  const double rate = seconds > 0 ? flops * static_cast<double>(state.iterations()) / seconds : 0;
  state.counters["GFLOP/s"] = rate / 1e9;
  state.counters["frac_peak"] = rate / 1e9 / peak_gflops(threads);
  state.counters["threads"] = threads;
  state.counters["flop"] = flops;
}

void set_byte_counters(benchmark::State& state, double bytes, int threads, double seconds,
                       bool read_only) {
  const double rate = seconds > 0 ? bytes * static_cast<double>(state.iterations()) / seconds : 0;
  state.counters["GB/s"] = rate / 1e9;
  state.counters["frac_copy"] = rate / 1e9 / copy_gbs(threads);
  if (read_only) state.counters["frac_read"] = rate / 1e9 / read_gbs(threads);
  state.counters["threads"] = threads;
  state.counters["bytes"] = bytes;
}

// ---- memory ------------------------------------------------------------------------

namespace {
/// VmRSS and VmHWM of this process in bytes; false when unreadable.
bool read_rss(double* rss, double* hwm) {
  std::ifstream f("/proc/self/status");
  if (!f) return false;
  std::string line;
  bool got_rss = false, got_hwm = false;
  while (std::getline(f, line)) {
    long long kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %lld kB", &kb) == 1) {
      *rss = static_cast<double>(kb) * 1024.0;
      got_rss = true;
    } else if (std::sscanf(line.c_str(), "VmHWM: %lld kB", &kb) == 1) {
      *hwm = static_cast<double>(kb) * 1024.0;
      got_hwm = true;
    }
  }
  return got_rss && got_hwm;
}

/// Resets VmHWM to the current RSS (Linux >= 4.0); false when not allowed.
bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}
}  // namespace

double extra_memory_bytes(const std::function<void()>& fn) {
  malloc_trim(0);  // give freed heap back so reuse of old pages does not hide new needs
  if (!reset_peak_rss()) {
    fn();
    return -1.0;
  }
  double rss0 = 0, hwm0 = 0;
  if (!read_rss(&rss0, &hwm0)) {
    fn();
    return -1.0;
  }
  fn();
  double rss1 = 0, hwm1 = 0;
  if (!read_rss(&rss1, &hwm1)) return -1.0;
  return std::max(0.0, hwm1 - rss0);
}

std::string join_tag(const std::vector<std::pair<std::string, std::int64_t>>& parts) {
  std::string s;
  for (const auto& [k, v] : parts) {
    if (!s.empty()) s += "_";
    s += k + std::to_string(v);
  }
  return s;
}

}  // namespace tandem::bench
