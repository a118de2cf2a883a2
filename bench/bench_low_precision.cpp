// SPDX-License-Identifier: Apache-2.0
// Attention forward and backward (from the forward's saved out and lse) with
// q, k, v, out and the gradients stored as f32, bf16 and f16 (SPEC §10):
// one benchmark per shape whose every iteration runs the three storage types
// in turn (PairedTimes), so that the bf16 ÷ f32 ratio is measured within one
// run under the same conditions. The FLOPs are those of the f32 op
// (bench_attention.cpp): the storage type changes the bytes, not the
// arithmetic the formula asks for.
//
// Where the CPU has AVX512-BF16 the forward times a fourth kind, `bf16_dot`:
// the same bf16 call with optimized::enable_bf16_dot(true) (SPEC §10.5; off
// by default), so both bf16 paths are paired with f32 in the same iterations.
//
// Ops `attention_forward_stored` and `attention_backward_saved_stored`,
// tagged `stored` (the report splits each into one row per type, named
// `<op>_<type>` without `_stored`) and `peer` (the peers run their bf16
// attention on the same shapes).
#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_paired.hpp"
#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"
#endif

namespace tandem::bench {
namespace {

enum Kind : std::size_t { kF32, kBf16, kF16, kBf16Dot };

/// Whether this CPU can run the bf16 forward's AVX512-BF16 products.
bool bf16_dot_supported() {
#ifdef TANDEM_HAVE_OPTIMIZED
  return optimized::bf16_dot_supported();
#else
  return false;
#endif
}

/// The kinds one benchmark times: f32, bf16, f16, and bf16_dot for an
/// optimized forward on a CPU with AVX512-BF16.
std::vector<std::string> kind_names(bool dot) {
  std::vector<std::string> names = {"f32", "bf16", "f16"};
  if (dot) names.emplace_back("bf16_dot");
  return names;
}

/// Switches the bf16 forward's AVX512-BF16 products on or off.
void use_bf16_dot([[maybe_unused]] bool on) {
#ifdef TANDEM_HAVE_OPTIMIZED
  optimized::enable_bf16_dot(on);
#endif
}

/// The buffers of one storage type T: inputs rounded once from the same f32
/// values, the saved out and lse of one untimed forward (backward only).
template <class T>
struct Typed {
  std::vector<T> q, k, v, out, dout, dq, dk, dv;
  std::vector<float> lse;

  static std::vector<T> from(const std::vector<float>& x) {
    std::vector<T> y;
    y.reserve(x.size());
    for (const float v : x) y.emplace_back(v);
    return y;
  }

  Typed(const AttentionPlan& plan, const Kernels<T>& be, bool backward) {
    q = from(random_buffer(static_cast<std::size_t>(plan.q.extent), 1));
    k = from(random_buffer(static_cast<std::size_t>(plan.k.extent), 2));
    v = from(random_buffer(static_cast<std::size_t>(plan.v.extent), 3));
    out = from(zero_buffer(static_cast<std::size_t>(plan.o.extent)));
    if (!backward) return;
    dout = from(random_buffer(static_cast<std::size_t>(plan.o.extent), 4));
    dq = from(zero_buffer(static_cast<std::size_t>(plan.dq.extent)));
    dk = from(zero_buffer(static_cast<std::size_t>(plan.dk.extent)));
    dv = from(zero_buffer(static_cast<std::size_t>(plan.dv.extent)));
    lse = zero_buffer(static_cast<std::size_t>(plan.lse_size()));
    be.attention_forward_lse(plan, inputs(), out, lse);  // the training step's forward
  }

  [[nodiscard]] AttentionInputs<T> inputs() const { return {q, k, v, {}}; }

  /// One timed call: the forward, or the backward from the saved state.
  void call(const AttentionPlan& plan, const Kernels<T>& be, bool backward) {
    if (backward) {
      be.attention_backward_saved(plan, inputs(), {out, lse}, dout, {dq, dk, dv});
    } else {
      be.attention_forward(plan, inputs(), out);
    }
  }
};

struct StoredAttnFixture {
  AttentionPlan plan;
  bool backward;
  Typed<float> f32;
  Typed<bfloat16> bf16;
  Typed<float16> f16;

  StoredAttnFixture(const AttnShape& s, const Backend& be, bool bwd)
      : plan(s.plan()),
        backward(bwd),
        f32(plan, be, bwd),
        bf16(plan, be.bf16, bwd),
        f16(plan, be.f16, bwd) {}

  void run(std::size_t kind, const Backend& be) {
    if (kind == kF32) f32.call(plan, be, backward);
    if (kind == kBf16) bf16.call(plan, be.bf16, backward);
    if (kind == kF16) f16.call(plan, be.f16, backward);
    if (kind == kBf16Dot) {
      use_bf16_dot(true);
      bf16.call(plan, be.bf16, backward);
      use_bf16_dot(false);
    }
  }
};

void add_stored_attention(bool backward, const BackendUnderTest& bu, const AttnShape& shape) {
  Spec s;
  s.op = backward ? "attention_backward_saved_stored" : "attention_forward_stored";
  s.backend = bu.name;
  s.shape = shape.tag();
  s.threads = bu.threads;
  s.name = s.op + "/" + s.backend + "/" + s.shape;
  s.tags = {"stored", "peer"};
  shape.describe(s);
  // backward: 2.5× the forward's FLOPs, as bench_attention.cpp counts it
  const double flop = (backward ? 2.5 : 1.0) * shape.forward_flops();
  s.params["flop"] = flop;
  const std::string key = s.name;
  const int threads = bu.threads;
  const std::vector<std::string> names = kind_names(!backward && bf16_dot_supported());
  auto be = std::make_shared<Backend>(bu.make());
  add(
      s,
      [be, shape, backward, flop, threads, key, names](benchmark::State& st) {
        StoredAttnFixture* fx = nullptr;
        try {
          if (!be->bf16.attention_forward || !be->f16.attention_forward ||
              (backward && (!be->attention_backward_saved || !be->bf16.attention_backward_saved ||
                            !be->f16.attention_backward_saved))) {
            st.SkipWithError("the backend lacks a bf16 or f16 entry point");
            return;
          }
          fx = &cached_fixture<StoredAttnFixture>(
              key, [&] { return std::make_unique<StoredAttnFixture>(shape, *be, backward); });
          for (std::size_t k = 0; k < names.size(); ++k) fx->run(k, *be);  // warm-up
        } catch (const std::exception& e) {
          st.SkipWithError(e.what());
          return;
        }
        StoredAttnFixture& f = *fx;
        PairedTimes times(names);
        times.time_iterations(st, [&](std::size_t k) { f.run(k, *be); });
        times.set_counters(st);
        const double peak = peak_gflops(threads);
        for (std::size_t k = 0; k < names.size(); ++k) {
          const double t = times.mean_seconds(k);
          const double gflops = t > 0 ? flop / t / 1e9 : 0;
          st.counters[names[k] + "_GFLOP/s"] = gflops;
          st.counters[names[k] + "_frac_peak"] = gflops / peak;
        }
        st.counters["threads"] = threads;
      },
      std::max(1.0, default_min_time()));  // several iterations, so that the ratios have a spread
}

}  // namespace

void register_low_precision() {
  const Config& c = config();
  const bool quick = c.preset == Preset::quick;
  const std::vector<std::int64_t> dims =
      !c.dims.empty() ? c.dims : std::vector<std::int64_t>{64, 128};
  const std::vector<std::int64_t> seqs = !c.seqs.empty() ? c.seqs
                                         : quick         ? std::vector<std::int64_t>{1024}
                                                 : std::vector<std::int64_t>{1024, 2048, 4096};
  for (const bool backward : {false, true}) {
    if (!op_selected(backward ? "attention_backward_saved_stored" : "attention_forward_stored"))
      continue;
    for (const std::int64_t D : dims) {
      if (quick && D != 128) continue;
      if (backward && D != 128 && c.dims.empty()) continue;  // the backward at D = 128 only
      for (const bool causal : {false, true}) {
        if (quick && causal) continue;
        for (const std::int64_t S : seqs) {
          AttnShape a;
          a.Sq = a.Sk = S;
          a.D = a.Dv = D;
          a.causal = causal;
          for (const auto& bu : backends_at(c.threads, false)) {
            if (bu.name == "optimized") add_stored_attention(backward, bu, a);
          }
        }
      }
    }
  }
}

}  // namespace tandem::bench
