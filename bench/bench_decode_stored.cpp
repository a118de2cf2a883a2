// SPDX-License-Identifier: Apache-2.0
// Decode with K and V stored as f32, bf16, f16, int8 and e4m3 codes (SPEC
// §10.4): one benchmark per shape whose every iteration runs the five in
// turn, so that they are measured in one run under the same conditions, and
// reports each one's time, the bytes it actually reads (K and V in their
// stored width, plus the int8 scales), GB/s, the fraction of the read
// bandwidth the roofline probe measures, and its speedup over f32; beside
// the wall time, the process's CPU time per call (all threads), which a
// machine shared with other work inflates less, and the fastest call of
// each kind (the least disturbed). At least 4 s per shape.
//
// The caches of every kind are views of one pool of bytes larger than the
// last-level cache (beyond_cache_bytes), visited in turn, so that each call
// reads K and V from memory. Every byte of the pool lies in [0x30, 0x3B] or
// [0xB0, 0xBB]: read as f32, bf16, f16, int8 or e4m3 every value is a
// normal number (no subnormal slows any kind down).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_paired.hpp"

#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"
#include "tandem/optimized/decode.hpp"

namespace tandem::bench {
namespace {

/// The stored kinds, in the order each iteration runs them.
enum Kind { kF32, kBf16, kF16, kInt8, kE4m3, kKinds };
constexpr std::array<const char*, kKinds> kKindNames = {"f32", "bf16", "f16", "int8", "e4m3"};

/// CPU time of the whole process so far (seconds, every thread).
double process_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

/// Bytes of K and V (and scales) one call of `kind` reads.
double bytes_read(const AttentionPlan& p, int kind) {
  const double elems = static_cast<double>(p.B * p.Sk * p.Hkv) * static_cast<double>(p.D + p.Dv);
  const double width[kKinds] = {4, 2, 2, 1, 1};
  double bytes = elems * width[kind];
  if (kind == kInt8) bytes += 8.0 * static_cast<double>(p.B * p.Sk * p.Hkv);  // two scales
  return bytes;
}

struct StoredFixture {
  AttentionPlan plan, plan_int8, plan_e4m3;
  std::vector<std::uint8_t> pool;
  std::vector<float> q, out, scales_int8, scales_e4m3;
  std::vector<bfloat16> q_bf16, out_bf16;
  std::vector<float16> q_f16, out_f16;
  std::array<std::size_t, kKinds> caches{}, next{};

  explicit StoredFixture(const AttnShape& s) : plan(s.plan()) {
    AttentionParams p = s.params();
    p.kv_cache = KvCache::int8;
    plan_int8 = AttentionPlan::make(p);
    p.kv_cache = KvCache::e4m3;
    plan_e4m3 = AttentionPlan::make(p);
    pool.resize(beyond_cache_bytes() + static_cast<std::size_t>(bytes_read(plan, kF32)));
    // x in [0, 24) from each byte of a splitmix64 stream: eight bytes per step (a
    // distribution object per byte took most of a short run's time filling the pool)
    std::uint64_t state = 7, bits = 0;
    for (std::size_t i = 0; i < pool.size(); ++i) {
      if (i % 8 == 0) {
        std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        bits = z ^ (z >> 31);
      }
      const auto x = static_cast<int>(((bits >> (8 * (i % 8))) & 0xFF) * 24 >> 8);
      pool[i] = static_cast<std::uint8_t>((x < 12 ? 0x30 : 0xB0 - 12) + x);
    }
    for (int k = 0; k < kKinds; ++k) {
      const double kv = bytes_read(plan, k) - (k == kInt8 ? 8.0 * plan.B * plan.Sk * plan.Hkv : 0);
      caches[k] =
          std::max<std::size_t>(2, static_cast<std::size_t>(static_cast<double>(pool.size()) / kv));
      while (static_cast<double>(caches[k]) * kv > static_cast<double>(pool.size())) --caches[k];
    }
    q = random_buffer(static_cast<std::size_t>(plan.q.extent), 11);
    for (const float x : q) q_bf16.emplace_back(x);
    for (const float x : q) q_f16.emplace_back(x);
    out = zero_buffer(static_cast<std::size_t>(plan.o.extent));
    out_bf16.resize(out.size());
    out_f16.resize(out.size());
    scales_int8 = random_buffer(caches[kInt8] * 2 * plan_int8.kv_scale_size(), 12, 0.001f, 0.01f);
    scales_e4m3.assign(2 * plan_e4m3.kv_scale_size(), 0.01f);
  }

  /// The bytes of cache c of `kind`: K then V.
  const std::uint8_t* cache(int kind, std::size_t c) const {
    const double kv = static_cast<double>(plan.k.extent + plan.v.extent) * (kind == kF32   ? 4
                                                                            : kind <= kF16 ? 2
                                                                                           : 1);
    return pool.data() + static_cast<std::size_t>(kv) * c;
  }

  /// One call of `kind` on its next cache.
  void run(int kind, const Backend& be, const optimized::Options& options) {
    const std::size_t c = next[kind];
    next[kind] = (c + 1) % caches[kind];
    const std::uint8_t* base = cache(kind, c);
    const auto nk = static_cast<std::size_t>(plan.k.extent),
               nv = static_cast<std::size_t>(plan.v.extent);
    if (kind == kF32) {
      const auto* k = reinterpret_cast<const float*>(base);
      be.attention_forward(plan, {q, {k, nk}, {k + nk, nv}, {}}, out);
    } else if (kind == kBf16) {
      const auto* k = reinterpret_cast<const bfloat16*>(base);
      const AttentionInputs<bfloat16> in{q_bf16, {k, nk}, {k + nk, nv}, {}};
      optimized::attention_decode_stored<bfloat16>(plan, in, out_bf16, {}, options);
    } else if (kind == kF16) {
      const auto* k = reinterpret_cast<const float16*>(base);
      const AttentionInputs<float16> in{q_f16, {k, nk}, {k + nk, nv}, {}};
      optimized::attention_decode_stored<float16>(plan, in, out_f16, {}, options);
    } else {
      const AttentionPlan& pq = kind == kInt8 ? plan_int8 : plan_e4m3;
      const std::vector<float>& sc = kind == kInt8 ? scales_int8 : scales_e4m3;
      const auto ns = static_cast<std::size_t>(pq.kv_scale_size());
      const std::size_t s0 = kind == kInt8 ? 2 * ns * c : 0;
      const QuantizedKv kv{
          {base, nk}, {base + nk, nv}, {sc.data() + s0, ns}, {sc.data() + s0 + ns, ns}};
      be.attention_forward_quantized(pq, {q, {}, {}, {}}, kv, out);
    }
  }
};

void add_stored(const AttnShape& shape, int threads) {
  Spec s;
  s.op = "decode_stored";
  s.backend = "optimized";
  s.shape = shape.tag();
  s.threads = threads;
  s.name = s.op + "/" + s.backend + "/" + s.shape;
  s.tags = {"stored", "peer"};  // the peers decode in bf16, f16 and q8_0 on the same shapes
  shape.describe(s);
  s.params["flop"] = shape.forward_flops();
  s.params["pool_bytes"] = static_cast<double>(beyond_cache_bytes());
  const AttentionPlan plan = shape.plan();
  for (int k = 0; k < kKinds; ++k)
    s.params[std::string("bytes_") + kKindNames[k]] = bytes_read(plan, k);
  const std::string key = s.name;
  add(
      s,
      [shape, threads, key](benchmark::State& st) {
        StoredFixture* fx = nullptr;
        optimized::Options options;
        options.threads = threads;
        const Backend be = optimized::backend(options);
        try {
          fx = &cached_fixture<StoredFixture>(
              key, [&] { return std::make_unique<StoredFixture>(shape); });
          for (int k = 0; k < kKinds; ++k) fx->run(k, be, options);  // warm-up
        } catch (const std::exception& e) {
          st.SkipWithError(e.what());
          return;
        }
        StoredFixture& f = *fx;
        std::array<double, kKinds> seconds{}, cpu{}, fastest{};
        fastest.fill(1e30);
        PairedTimes paired({kKindNames.begin(), kKindNames.end()});
        for (auto _ : st) {
          for (int k = 0; k < kKinds; ++k) {
            const auto t0 = std::chrono::steady_clock::now();
            const double c0 = process_cpu_s();
            f.run(k, be, options);
            benchmark::ClobberMemory();
            const double t = seconds_since(t0);
            seconds[k] += t;
            paired.add(static_cast<std::size_t>(k), t);
            fastest[k] = std::min(fastest[k], t);
            cpu[k] += process_cpu_s() - c0;
          }
        }
        paired.set_counters(st);
        const auto n = static_cast<double>(st.iterations());
        const double read = read_gbs(threads);
        for (int k = 0; k < kKinds; ++k) {
          const std::string name = kKindNames[k];
          const double gbs = seconds[k] > 0 ? bytes_read(f.plan, k) * n / seconds[k] / 1e9 : 0;
          st.counters[name + "_ms"] = n > 0 ? seconds[k] / n * 1e3 : 0;
          st.counters[name + "_min_ms"] = fastest[k] * 1e3;
          st.counters[name + "_min_speedup"] = fastest[kF32] / fastest[k];
          st.counters[name + "_min_GB/s"] = bytes_read(f.plan, k) / fastest[k] / 1e9;
          st.counters[name + "_cpu_ms"] = n > 0 ? cpu[k] / n * 1e3 : 0;
          st.counters[name + "_cpu_speedup"] = cpu[k] > 0 ? cpu[kF32] / cpu[k] : 0;
          st.counters[name + "_GB/s"] = gbs;
          st.counters[name + "_frac_read"] = gbs / read;
          st.counters[name + "_speedup"] = seconds[k] > 0 ? seconds[kF32] / seconds[k] : 0;
        }
        st.counters["read_GB/s"] = read;
        st.counters["threads"] = threads;
      },
      std::max(4.0, default_min_time()));
}

}  // namespace

void register_decode_stored() {
  if (!op_selected("decode_stored")) return;
  const Config& c = config();
  const std::vector<std::int64_t> seqs = c.preset == Preset::quick
                                             ? std::vector<std::int64_t>{4096}
                                             : std::vector<std::int64_t>{4096, 16384};
  for (const std::int64_t Sk : seqs) {
    add_stored(AttnShape::decode_step(1, Sk), c.threads);
  }
}

}  // namespace tandem::bench
#else
namespace tandem::bench {
void register_decode_stored() {}
}  // namespace tandem::bench
#endif
