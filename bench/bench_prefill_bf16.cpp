// SPDX-License-Identifier: Apache-2.0
// bf16 prefill against f32 prefill on the optimized backend (SPEC §10.2,
// `pytorch` profile): the bf16 forward with the CPU's AVX512-BF16 dot
// products (where it has them) and with them switched off (the portable
// widen-then-float tiles), each as a ratio to the f32 forward on the same
// values. Each iteration times the three calls back to back, in an order
// that rotates from one iteration to the next, and the ratios are formed
// per iteration (paired): the counters are their median, minimum and
// maximum over the iterations of one run.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"

#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"
#include "tandem/rounding.hpp"
#include "tandem/storage.hpp"

namespace tandem::bench {
namespace {

/// The calls of one iteration: f32, bf16 with the dot products, bf16 widened.
enum Kind { kF32, kBf16Dot, kBf16Widen, kKinds };
constexpr std::array<const char*, kKinds> kKindNames = {"f32", "bf16_dot", "bf16_widen"};

struct PrefillFixture {
  AttentionPlan plan, plan_bf16;
  std::vector<float> q, k, v, out;
  std::vector<bfloat16> q16, k16, v16, out16;
  explicit PrefillFixture(const AttnShape& shape) : plan(shape.plan()) {
    AttentionParams p = shape.params();
    p.rounding = kRoundingPytorch;
    plan_bf16 = AttentionPlan::make(p);
    q = random_buffer(static_cast<std::size_t>(plan.q.extent), 1, -2.f, 2.f);
    k = random_buffer(static_cast<std::size_t>(plan.k.extent), 2, -2.f, 2.f);
    v = random_buffer(static_cast<std::size_t>(plan.v.extent), 3, -2.f, 2.f);
    out = zero_buffer(static_cast<std::size_t>(plan.o.extent));
    // the same values in both types: f32 holds every bf16
    for (auto* x : {&q, &k, &v}) {
      for (float& e : *x) e = static_cast<float>(static_cast<double>(bfloat16(e)));
    }
    for (const float e : q) q16.emplace_back(static_cast<double>(e));
    for (const float e : k) k16.emplace_back(static_cast<double>(e));
    for (const float e : v) v16.emplace_back(static_cast<double>(e));
    out16.assign(out.size(), bfloat16(0.0));
  }
  void run(int kind, const Backend& be) {
    if (kind == kF32) {
      be.attention_forward(plan, {q, k, v, {}}, out);
      return;
    }
    optimized::enable_bf16_dot(kind == kBf16Dot);
    be.kernels<bfloat16>().attention_forward(plan_bf16, {q16, k16, v16, {}}, out16);
    optimized::enable_bf16_dot(false);
  }
};

/// The median of xs (sorted in place).
double median(std::vector<double>& xs) {
  std::sort(xs.begin(), xs.end());
  const std::size_t n = xs.size();
  return n == 0 ? 0.0 : n % 2 == 1 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
}

void add_prefill(const AttnShape& shape, int threads) {
  Spec s;
  s.op = "prefill_bf16";
  s.backend = "optimized";
  s.shape = shape.tag();
  s.threads = threads;
  s.name = s.op + "/" + s.backend + "/" + s.shape + "/threads:" + std::to_string(threads);
  s.tags = {"stored"};
  shape.describe(s);
  s.params["flops"] = shape.forward_flops();
  const std::string key = s.name;
  add(
      s,
      [shape, threads, key](benchmark::State& st) {
        PrefillFixture* fx = nullptr;
        optimized::Options options;
        options.threads = threads;
        const Backend be = optimized::backend(options);
        try {
          fx = &cached_fixture<PrefillFixture>(
              key, [&] { return std::make_unique<PrefillFixture>(shape); });
          for (int k = 0; k < kKinds; ++k) fx->run(k, be);  // warm-up
        } catch (const std::exception& e) {
          st.SkipWithError(e.what());
          return;
        }
        PrefillFixture& f = *fx;
        std::array<std::vector<double>, kKinds> seconds;
        std::int64_t iteration = 0;
        for (auto _ : st) {
          for (int i = 0; i < kKinds; ++i) {
            const int k = static_cast<int>((iteration + i) % kKinds);
            const auto t0 = std::chrono::steady_clock::now();
            f.run(k, be);
            benchmark::ClobberMemory();
            seconds[static_cast<std::size_t>(k)].push_back(seconds_since(t0));
          }
          ++iteration;
        }
        for (int k = 0; k < kKinds; ++k) {
          std::vector<double> ratio, ms;
          for (std::size_t i = 0; i < seconds[0].size(); ++i) {
            ratio.push_back(seconds[0][i] / seconds[static_cast<std::size_t>(k)][i]);
            ms.push_back(seconds[static_cast<std::size_t>(k)][i] * 1e3);
          }
          const std::string name = kKindNames[static_cast<std::size_t>(k)];
          st.counters[name + "_ms"] = median(ms);
          if (k == kF32) continue;
          // f32 time over this kind's, per iteration: > 1 is faster than f32
          st.counters[name + "_speedup"] = median(ratio);
          st.counters[name + "_speedup_min"] = ratio.front();
          st.counters[name + "_speedup_max"] = ratio.back();
        }
        st.counters["threads"] = threads;
        st.counters["bf16_dot_supported"] = optimized::bf16_dot_supported() ? 1 : 0;
      },
      std::max(8.0, default_min_time()));
}

}  // namespace

void register_prefill_bf16() {
  if (!op_selected("prefill_bf16")) return;
  const Config& c = config();
  const bool quick = c.preset == Preset::quick;
  const std::vector<std::int64_t> seqs = !c.seqs.empty() ? c.seqs
                                         : quick         ? std::vector<std::int64_t>{1024}
                                                 : std::vector<std::int64_t>{1024, 2048, 4096};
  const std::vector<std::int64_t> dims = !c.dims.empty() ? c.dims
                                         : quick         ? std::vector<std::int64_t>{64}
                                                         : std::vector<std::int64_t>{64, 128};
  std::vector<int> thread_counts{std::max(1, c.threads)};
  if (c.threads > 1) thread_counts.push_back(1);
  for (const int threads : thread_counts) {
    for (const std::int64_t D : dims) {
      for (const std::int64_t S : seqs) {
        for (const bool causal : {false, true}) {
          AttnShape a;
          a.B = 1;
          a.H = a.Hkv = 4;
          a.Sq = a.Sk = S;
          a.D = a.Dv = D;
          a.causal = causal;
          add_prefill(a, threads);
        }
      }
    }
  }
}

}  // namespace tandem::bench
#else
namespace tandem::bench {
void register_prefill_bf16() {}
}  // namespace tandem::bench
#endif
