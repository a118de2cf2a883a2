// SPDX-License-Identifier: Apache-2.0
/// @file bench_common.hpp
/// @brief What every tandem benchmark shares: the run configuration, the
///        backends under test, the registry of planned benchmarks, reusable
///        buffers, the roofline the figures are divided by, and the peak-RSS
///        probe for the extra memory a call needs.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/backend.hpp"

namespace tandem::bench {

/// How large and how many benchmarks to plan.
enum class Preset {
  quick,     ///< a few small shapes: checks the whole pipeline in about a minute
  standard,  ///< the report's default set (fits a 15-minute budget on 2 cores)
  full,      ///< standard plus longer sequences
};

/// The run configuration, from command-line flags and TANDEM_THREADS.
struct Config {
  Preset preset = Preset::standard;
  int threads = 0;                    ///< main thread count of the optimized backend
  std::vector<int> scaling_threads;   ///< thread counts of the scaling benchmarks
  std::vector<std::string> ops;       ///< empty = every op
  std::vector<std::string> backends;  ///< empty = every backend built in
  std::vector<std::int64_t> seqs;     ///< attention sequence lengths; empty = preset's
  std::vector<std::int64_t> dims;     ///< attention head widths; empty = preset's
  double min_time = 0.0;              ///< per-benchmark minimum time (s); 0 = preset's
  bool print_plan = false;            ///< print the plan as JSON and exit
  /// Roofline given on the command line (threads → GFLOP/s, copy GB/s, read
  /// GB/s); measured on first use for thread counts that are missing.
  std::map<int, double> peak_gflops, copy_gbs, read_gbs;
};

/// The configuration of this run (set once by main before registration).
Config& config();

/// True when op `op` is selected by --ops (or no --ops was given).
bool op_selected(const std::string& op);

/// Number of cores this process may use (sched_getaffinity).
int available_cores();

/// One backend under test at one thread count.
struct BackendUnderTest {
  std::string name;  ///< "reference" or "optimized"
  int threads = 1;   ///< threads it uses (the reference is single-threaded)
  std::function<Backend()> make;
};

/// The backends selected by --backends, built into this binary, at thread
/// count `threads` (the reference always at 1).
std::vector<BackendUnderTest> backends_at(int threads, bool include_reference);

/// What the report needs to know about one planned benchmark beyond its name.
struct Spec {
  std::string name;     ///< `<op>/<backend>/<shape>[/threads:N]`
  std::string op;       ///< attention_forward, attention_backward, ..., roofline_fma
  std::string backend;  ///< reference, optimized, or probe
  std::string shape;    ///< shape tag, e.g. B1_H8_S2048_D128_causal
  int threads = 1;
  std::map<std::string, double> params;  ///< B, H, Hkv, Sq, Sk, D, Dv, causal, bytes, flops...
  /// main, scaling, memory, small, peer; the attention features: features,
  /// feature or plain, and the comparison's kind (varlen, alibi, sinks, paged_decode)
  std::vector<std::string> tags;
};

/// Every benchmark registered so far, in registration order.
std::vector<Spec>& plan();

/// Registers `fn` under spec.name with real-time measurement and the preset's
/// minimum time (or `min_time` when positive) and records the spec.
void add(Spec spec, std::function<void(benchmark::State&)> fn, double min_time = 0.0);

/// Minimum measuring time of one benchmark in this preset (seconds).
double default_min_time();

// ---- buffers ---------------------------------------------------------------

/// A float buffer filled once with uniform values in [lo, hi), deterministic
/// in `seed`, and touched so its pages are resident before any timing.
std::vector<float> random_buffer(std::size_t n, std::uint64_t seed, float lo = -1.f,
                                 float hi = 1.f);

/// A zeroed float buffer whose pages are resident.
std::vector<float> zero_buffer(std::size_t n);

/// `caches` block tables of `per_cache` entries each over one pool of
/// caches·per_cache blocks, shuffled (fixed seed): the blocks of each cache
/// scattered through the pool, as a serving cache's are.
std::vector<std::vector<std::int32_t>> shuffled_block_tables(std::size_t caches,
                                                             std::int64_t per_cache);

/// Keeps the inputs of one benchmark alive across the repeated calls that
/// Google Benchmark makes while it picks an iteration count, so buffers are
/// allocated and first touched once. Holds one fixture at a time: asking for
/// another key frees the previous one.
template <class Fixture>
Fixture& cached_fixture(const std::string& key,
                        const std::function<std::unique_ptr<Fixture>()>& make,
                        bool* created = nullptr);

namespace detail {
struct AnyFixture {
  std::string key;
  std::shared_ptr<void> value;
};
AnyFixture& current_fixture();
}  // namespace detail

template <class Fixture>
Fixture& cached_fixture(const std::string& key,
                        const std::function<std::unique_ptr<Fixture>()>& make, bool* created) {
  detail::AnyFixture& slot = detail::current_fixture();
  if (slot.key != key || !slot.value) {
    slot.value.reset();  // free the previous fixture before allocating the next
    slot.key.clear();
    std::shared_ptr<Fixture> f = make();
    slot.value = f;
    slot.key = key;
    if (created) *created = true;
  } else if (created) {
    *created = false;
  }
  return *static_cast<Fixture*>(slot.value.get());
}

// ---- roofline ----------------------------------------------------------------

/// fp32 FMA peak with `threads` threads (GFLOP/s): the --roofline value, else
/// measured now and remembered.
double peak_gflops(int threads);
/// Copy bandwidth with `threads` threads (GB/s, bytes read + written): the
/// --roofline value, else measured now and remembered.
double copy_gbs(int threads);
/// Read bandwidth with `threads` threads (GB/s): the --roofline value, else
/// measured now and remembered.
double read_gbs(int threads);
/// Bytes of one roofline array (and the least a memory-bound benchmark
/// cycles through): 256 MiB, or twice the last-level cache where that is
/// larger, so that none of it stays in cache between passes.
std::size_t beyond_cache_bytes();

/// Runs about `seconds` of independent FMA chains on `threads` threads with
/// the Highway target dynamic dispatch picks; returns GFLOP/s counted against
/// each thread's own CPU time (the cores' capability, unaffected by other
/// processes) and, in *wall_gflops when given, against wall time.
double measure_fma_gflops(int threads, double seconds, double* wall_gflops = nullptr);
/// Copies `bytes` between two resident arrays `passes` times on `threads`
/// threads; returns GB/s counting bytes read + bytes written.
double measure_copy_gbs(int threads, std::size_t bytes, int passes);
/// Sums `bytes` of a resident array `passes` times; returns GB/s read.
double measure_read_gbs(int threads, std::size_t bytes, int passes);
/// The Highway target the roofline probe runs (HWY_DYNAMIC_DISPATCH's choice).
std::string roofline_target();

/// Seconds elapsed since t0 (wall clock).
double seconds_since(std::chrono::steady_clock::time_point t0);

/// Sets GFLOP/s and frac_peak (or GB/s and frac_copy, with `read_only`
/// frac_read too: a benchmark that only reads its bytes) for a benchmark
/// doing `flops` floating-point operations (or moving `bytes`) per
/// iteration on `threads` threads, whose timed loop took `seconds` of wall
/// time in all.
void set_flop_counters(benchmark::State& state, double flops, int threads, double seconds);
void set_byte_counters(benchmark::State& state, double bytes, int threads, double seconds,
                       bool read_only = false);

// ---- memory ---------------------------------------------------------------------

/// Measures the extra resident memory that one call of `fn` needs beyond what
/// is already resident (inputs and outputs): resets the peak RSS, calls `fn`
/// once and returns (peak RSS − RSS before) in bytes, or −1 where the kernel
/// does not allow resetting the peak.
double extra_memory_bytes(const std::function<void()>& fn);

/// "B1_H8_S2048_D128" style tags.
std::string join_tag(const std::vector<std::pair<std::string, std::int64_t>>& parts);

// ---- registration of the benchmark families ------------------------------------------

/// A dense attention shape of the benchmarks: B, H query heads, Hkv kv heads,
/// Sq queries, Sk keys, head widths D and Dv, causal or no mask; FLOPs of one
/// forward call: 2·D + 2·Dv per visible (i, j) pair of each (b, h).
struct AttnShape {
  std::int64_t B = 1, H = 8, Hkv = 8, Sq = 0, Sk = 0, D = 128, Dv = 128;
  bool causal = false;

  [[nodiscard]] AttentionParams params() const {
    AttentionParams p;
    p.B = B;
    p.Sq = Sq;
    p.Sk = Sk;
    p.H = H;
    p.Hkv = Hkv;
    p.D = D;
    p.Dv = Dv;
    p.layout = Layout::bshd;
    p.mask = causal ? MaskKind::causal : MaskKind::none;
    return p;
  }
  [[nodiscard]] AttentionPlan plan() const { return AttentionPlan::make(params()); }

  /// The benchmarks' decode step: B sequences of one query each against Sk
  /// keys, H = 32 query heads over Hkv = 8 kv heads, D = Dv = 128.
  static AttnShape decode_step(std::int64_t B, std::int64_t Sk) {
    AttnShape d;
    d.B = B;
    d.H = 32;
    d.Hkv = 8;
    d.Sq = 1;
    d.Sk = Sk;
    d.D = d.Dv = 128;
    return d;
  }

  /// Number of visible (i, j) pairs of one (b, h).
  [[nodiscard]] double visible_pairs() const {
    if (!causal) return static_cast<double>(Sq) * static_cast<double>(Sk);
    const std::int64_t off = Sk > Sq ? Sk - Sq : 0;
    double pairs = 0.0;
    for (std::int64_t i = 0; i < Sq; ++i) pairs += static_cast<double>(std::min(Sk, off + i + 1));
    return pairs;
  }

  [[nodiscard]] double forward_flops() const {
    return static_cast<double>(B * H) * visible_pairs() * 2.0 * static_cast<double>(D + Dv);
  }

  [[nodiscard]] std::string tag() const {
    std::vector<std::pair<std::string, std::int64_t>> parts{{"B", B}, {"H", H}};
    if (Hkv != H) parts.push_back({"Hkv", Hkv});
    if (Sq == Sk) {
      parts.push_back({"S", Sq});
    } else {
      parts.push_back({"Sq", Sq});
      parts.push_back({"Sk", Sk});
    }
    parts.push_back({"D", D});
    if (Dv != D) parts.push_back({"Dv", Dv});
    return join_tag(parts) + (causal ? "_causal" : "");
  }

  void describe(Spec& s) const {
    s.params["B"] = static_cast<double>(B);
    s.params["H"] = static_cast<double>(H);
    s.params["Hkv"] = static_cast<double>(Hkv);
    s.params["Sq"] = static_cast<double>(Sq);
    s.params["Sk"] = static_cast<double>(Sk);
    s.params["D"] = static_cast<double>(D);
    s.params["Dv"] = static_cast<double>(Dv);
    s.params["causal"] = causal ? 1.0 : 0.0;
    s.params["scores_bytes"] =
        static_cast<double>(B * H) * static_cast<double>(Sq) * static_cast<double>(Sk) * 4.0;
    s.params["io_bytes"] =
        4.0 * static_cast<double>(B) * static_cast<double>(Sq * H * (D + Dv) + Sk * Hkv * (D + Dv));
  }
};

void register_roofline();
void register_attention();
void register_features();
/// FlexAttention written causal against the native causal forward (bench_flex.cpp).
void register_flex();
void register_streaming();
void register_block();
/// Decode over K/V stored as f32, bf16, f16, int8, e4m3 (bench_decode_stored.cpp).
void register_decode_stored();
/// Attention forward and backward with f32, bf16, f16 storage (bench_low_precision.cpp).
void register_low_precision();
/// The default and the batch-invariant order timed in turn (bench_invariance.cpp).
void register_invariance();

}  // namespace tandem::bench
