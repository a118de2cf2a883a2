// SPDX-License-Identifier: Apache-2.0
// FlexAttention-written masks against the native features they equal, each
// side measured in the same run (op attention_features, kind `flex`: the
// tags `feature` for the flex call, `plain` for the native one, one shape
// tag per form; the report's features table divides one by the other). The
// flex side is written as torch users write it, with the block mask
// create_block_mask makes of it (128 × 128 blocks), layout bhsd:
//   causal    mask_mod kv_idx <= q_idx                     native causal
//   window    (q_idx - kv_idx <= 128) & (kv_idx <= q_idx)  sliding window 128
//   softcap   30·tanh(score / 30), causal                  softcap 30, causal
//   alibi     score − slopes[h]·abs(q_idx − kv_idx), causal ALiBi slopes [H]
//   document  doc[q_idx] == doc[kv_idx] & causal           4 packed sequences
// Each is a native form (SPEC §13.5) and runs on the native kernels; the
// document mask as packed sequences.
// Both sides have the same B, H, S, D and FLOPs (the visible pairs). Side
// `paired` times both calls in turn inside each round of one benchmark, for
// the report's flex ÷ native ratio; side `density` sets the S = 8192 window
// beside a dense call for the speed its block density predicts.
// Op flex_backward times each form's backward (the forward rerun, then dq,
// dk, dv), which the report sets beside torch's backward on the CPU
// (autograd through SDPA's math path, bench/peers/peers.py).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_paired.hpp"
#include "tandem/reference/flex.hpp"

namespace tandem::bench {
namespace {

enum class Form : std::uint8_t { causal, window, softcap, alibi, document };

constexpr std::int64_t kWindow = 128, kSoftcap = 30, kDocuments = 4;

const char* name(Form f) {
  constexpr const char* names[] = {"causal", "window", "softcap", "alibi", "document"};
  return names[static_cast<int>(f)];
}

/// The ALiBi slopes 2^(−8(h+1)/H) of H heads.
std::vector<float> alibi_slopes(std::int64_t H) {
  std::vector<float> m(static_cast<std::size_t>(H));
  for (std::int64_t h = 0; h < H; ++h) {
    m[static_cast<std::size_t>(h)] =
        std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(H));
  }
  return m;
}

/// Each key's document: kDocuments equal runs over S.
std::vector<std::int64_t> documents(std::int64_t S) {
  std::vector<std::int64_t> doc(static_cast<std::size_t>(S));
  for (std::int64_t j = 0; j < S; ++j) doc[static_cast<std::size_t>(j)] = j * kDocuments / S;
  return doc;
}

/// Visible (i, j) pairs of one (b, h) of form f over S queries and keys.
double visible_pairs(Form f, std::int64_t S) {
  double pairs = 0.0;
  for (std::int64_t i = 0; i < S; ++i) {
    std::int64_t first = 0;  // the first key query i sees
    if (f == Form::window) first = std::max<std::int64_t>(0, i - kWindow);
    // the first j of i's document n = i·K/S: the least j with j·K/S = n
    if (f == Form::document) first = ((i * kDocuments / S) * S + kDocuments - 1) / kDocuments;
    pairs += static_cast<double>(i - first + 1);
  }
  return pairs;
}

/// The flex call of form f over shape s.
struct FlexFixture {
  FlexPlan plan;
  FlexBlockMask blocks;
  std::vector<float> q, k, v, out, lse, slopes;
  std::vector<std::int64_t> doc;

  FlexFixture(Form f, const AttnShape& s) {
    FlexParams p;
    p.B = s.B, p.H = s.H, p.Hkv = s.Hkv, p.Sq = s.Sq, p.Sk = s.Sk, p.D = s.D, p.Dv = s.Dv;
    ModProgram& m = p.mask_mod;
    ModValue visible = m.kv_idx() <= m.q_idx();
    if (f == Form::window) visible = (m.q_idx() - m.kv_idx() <= m.integer(kWindow)) && visible;
    if (f == Form::document) {
      const std::int32_t t = m.capture({"doc", {s.Sk}, ModType::integer, 0, kDocuments - 1});
      visible = (m.load(t, {m.q_idx()}) == m.load(t, {m.kv_idx()})) && visible;
      doc = documents(s.Sk);
    }
    m.set_result(visible);
    ModProgram& g = p.score_mod;
    if (f == Form::softcap) {
      const ModValue c = g.real(kSoftcap);
      g.set_result(c * g.apply(ModOp::tanh, g.score() / c));
    }
    if (f == Form::alibi) {
      const std::int32_t t = g.capture({"slopes", {s.H}, ModType::real, 0, 0});
      const ModValue d = g.apply(ModOp::abs, g.q_idx() - g.kv_idx());
      g.set_result(g.score() - g.load(t, {g.h()}) * g.apply(ModOp::to_real, d));
      slopes = alibi_slopes(s.H);
    }
    blocks = reference::create_block_mask<float>(FlexPlan::make(p), mask_tensors(), 128, 128, true,
                                                 true);
    p.block_mask = blocks.shape;
    plan = FlexPlan::make(p);
    q = random_buffer(static_cast<std::size_t>(plan.q_size()), 1);
    k = random_buffer(static_cast<std::size_t>(plan.k_size()), 2);
    v = random_buffer(static_cast<std::size_t>(plan.v_size()), 3);
    out = zero_buffer(static_cast<std::size_t>(plan.out_size()));
    lse = zero_buffer(static_cast<std::size_t>(plan.lse_size()));
  }
  [[nodiscard]] ModCaptures<float> mask_tensors() const {
    return doc.empty() ? ModCaptures<float>{} : ModCaptures<float>{{{}}, {Indices{doc}}};
  }
  [[nodiscard]] FlexInputs<float> inputs() const {
    const ModCaptures<float> score =
        slopes.empty() ? ModCaptures<float>{} : ModCaptures<float>{{slopes}, {Indices{}}};
    return {q, k, v, score, mask_tensors(), blocks.data()};
  }
};

/// The native call form f equals.
struct NativeFixture {
  AttentionPlan plan;
  std::vector<float> q, k, v, out, slopes;
  std::vector<std::int64_t> cu;

  /// The native call form f equals, or with `dense` shape s's call with
  /// no mask (s.causal false) and no feature.
  NativeFixture(Form f, const AttnShape& s, bool dense = false)
      : plan(dense ? AttentionPlan::make(s.params()) : make(f, s)) {
    q = random_buffer(static_cast<std::size_t>(plan.q.extent), 1);
    k = random_buffer(static_cast<std::size_t>(plan.k.extent), 2);
    v = random_buffer(static_cast<std::size_t>(plan.v.extent), 3);
    out = zero_buffer(static_cast<std::size_t>(plan.o.extent));
    if (f == Form::alibi && !dense) slopes = alibi_slopes(s.H);
    if (f == Form::document && !dense) {
      for (std::int64_t n = 0; n <= kDocuments; ++n) cu.push_back(n * s.Sq / kDocuments);
    }
  }
  static AttentionPlan make(Form f, const AttnShape& s) {
    AttentionParams p = s.params();
    p.mask = f == Form::window ? MaskKind::sliding_window : MaskKind::causal;
    if (f == Form::window) p.window = kWindow;
    if (f == Form::softcap) p.softcap = kSoftcap;
    if (f == Form::alibi) p.alibi = AlibiKind::per_head;
    if (f == Form::document) p.num_seqs = kDocuments;
    return AttentionPlan::make(p);
  }
  [[nodiscard]] AttentionInputs<float> inputs() const {
    AttentionInputs<float> in{q, k, v, {}};
    in.alibi_slopes = slopes;
    if (!cu.empty()) in.cu_seqlens_q = in.cu_seqlens_k = Indices{cu};
    return in;
  }
};

/// The flex forward's FLOPs: 2·(D + Dv) per visible pair.
double forward_flops(Form f, const AttnShape& s) {
  return static_cast<double>(s.B * s.H) * visible_pairs(f, s.Sq) * 2.0 *
         static_cast<double>(s.D + s.Dv);
}

/// The spec of a benchmark of op `op` on form f (name: op/backend/shape
/// then `/side` when side is not empty), with the mods' constants as params
/// (bench/peers/peers.py builds the same mods from them) and `flops`.
Spec flex_spec(const BackendUnderTest& bu, Form f, const AttnShape& s, const std::string& op,
               const std::string& side, double flops) {
  Spec spec;
  spec.op = op;
  spec.backend = bu.name;
  spec.shape = std::string("flex_") + name(f) + "_" + s.tag();
  spec.threads = bu.threads;
  spec.name = spec.op + "/" + spec.backend + "/" + spec.shape + (side.empty() ? "" : "/" + side);
  s.describe(spec);
  spec.params["window"] = static_cast<double>(kWindow);
  spec.params["softcap"] = static_cast<double>(kSoftcap);
  spec.params["documents"] = static_cast<double>(kDocuments);
  spec.params["flop"] = flops;
  return spec;
}

/// The flex backward of form f (the forward rerun, as flex_backward does):
/// dq, dk, dv for a random dO.
struct FlexBackwardFixture : FlexFixture {
  std::vector<float> dout, dq, dk, dv;
  FlexBackwardFixture(Form f, const AttnShape& s)
      : FlexFixture(f, s),
        dout(random_buffer(static_cast<std::size_t>(plan.out_size()), 4)),
        dq(zero_buffer(q.size())),
        dk(zero_buffer(k.size())),
        dv(zero_buffer(v.size())) {}
};

/// Times `call` after one warm-up (a failure skips the benchmark).
void time_calls(benchmark::State& st, const std::function<void()>& call, double flops,
                int threads) {
  try {
    call();  // warm-up
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
    return;
  }
  const auto loop_start = std::chrono::steady_clock::now();
  for (auto _ : st) {
    call();
    benchmark::ClobberMemory();
  }
  set_flop_counters(st, flops, threads, seconds_since(loop_start));
}

/// Registers the flex backward of form f (op flex_backward, FLOPs 2.5× the
/// forward's), timed beside PyTorch's backward through SDPA's math path
/// with the mask materialized (bench/peers/peers.py).
void add_backward(const BackendUnderTest& bu, Form f, const AttnShape& s) {
  const double flops = 2.5 * forward_flops(f, s);
  Spec spec = flex_spec(bu, f, s, "flex_backward", "", flops);
  spec.tags = {"flex_backward", "peer"};
  const std::string key = spec.name;
  const int threads = bu.threads;
  auto be = std::make_shared<Backend>(bu.make());
  add(spec, [be, f, s, flops, threads, key](benchmark::State& st) {
    auto& x = cached_fixture<FlexBackwardFixture>(
        key, [&] { return std::make_unique<FlexBackwardFixture>(f, s); });
    time_calls(
        st,
        [&x, be] {
          be->flex_backward(x.plan, x.inputs(), x.dout, FlexGrads<float>{x.dq, x.dk, x.dv, {}});
        },
        flops, threads);
  });
}

/// Registers one side (flex: `feature`, native: `plain`) of form f.
void add_side(const BackendUnderTest& bu, Form f, const AttnShape& s, bool flex) {
  const double flops = forward_flops(f, s);
  Spec spec = flex_spec(bu, f, s, "attention_features", flex ? "feature" : "plain", flops);
  // the flex side is also timed beside PyTorch's compiled flex_attention
  spec.tags = {"features", "flex", flex ? "feature" : "plain"};
  if (flex) spec.tags.emplace_back("peer");
  const std::string key = spec.name;
  const int threads = bu.threads;
  auto be = std::make_shared<Backend>(bu.make());
  add(spec, [be, f, s, flex, flops, threads, key](benchmark::State& st) {
    if (flex) {
      auto& x =
          cached_fixture<FlexFixture>(key, [&] { return std::make_unique<FlexFixture>(f, s); });
      time_calls(
          st, [&x, be] { be->flex_forward(x.plan, x.inputs(), x.out, x.lse); }, flops, threads);
    } else {
      auto& x =
          cached_fixture<NativeFixture>(key, [&] { return std::make_unique<NativeFixture>(f, s); });
      time_calls(
          st, [&x, be] { be->attention_forward(x.plan, x.inputs(), x.out); }, flops, threads);
    }
  });
}

/// Blocks a flex call computes: the partial and full kv blocks of every
/// query block of its block mask, per (batch, head) of the mask.
double kept_blocks(const FlexFixture& x) {
  double n = 0;
  for (const std::int32_t c : x.blocks.kv_num_blocks) n += c;
  for (const std::int32_t c : x.blocks.full_kv_num_blocks) n += c;
  return n / static_cast<double>(x.blocks.shape.B * x.blocks.shape.H);
}

/// A flex call and the native call it is timed beside (one cached fixture).
struct PairFixture {
  FlexFixture flex;
  NativeFixture native;
};

/// Registers form f's flex call and its native equal timed in turn inside
/// every round of one benchmark (side `paired`, kinds native then flex):
/// its counters `median_speedup`, `speedup_p25`, `speedup_p75` are the
/// median and quartiles over the rounds of t_native / t_flex, so the flex
/// form's speed against the native path is a ratio of the same moments.
/// With `density`, the native side is in its place a dense call (no mask) at
/// S = 2048 and the ratio is scaled by kept blocks ÷ the dense call's
/// blocks (side `density`): the flex call's speed against the time its
/// block density predicts from the dense call's time per 128 × 128 block.
void add_paired(const BackendUnderTest& bu, Form f, const AttnShape& s, bool density) {
  Spec spec = flex_spec(bu, f, s, "attention_features", density ? "density" : "paired",
                        forward_flops(f, s));
  spec.tags = {"features", "flex", density ? "density" : "paired"};
  AttnShape dense = s;
  if (density) dense.Sq = dense.Sk = 2048, dense.causal = false;
  auto be = std::make_shared<Backend>(bu.make());
  add_paired_benchmark<PairFixture>(
      spec, {"native", "flex"},
      [f, s, dense, density] {
        return PairFixture{FlexFixture(f, s), NativeFixture(f, density ? dense : s, density)};
      },
      [be](PairFixture& x, std::size_t k) {
        if (k == 0) be->attention_forward(x.native.plan, x.native.inputs(), x.native.out);
        if (k == 1) be->flex_forward(x.flex.plan, x.flex.inputs(), x.flex.out, x.flex.lse);
      },
      [dense, density](benchmark::State& st, const PairedTimes& times, const PairFixture& x) {
        // t_native / t_flex, or for density (t_dense · kept / dense blocks) / t_flex
        const std::int64_t blocks = (dense.Sq / 128) * (dense.Sk / 128);  // 128 x 128 each
        times.set_speedup_counters(
            st, 1, density ? kept_blocks(x.flex) / static_cast<double>(blocks) : 1.0);
        st.counters["kept_blocks"] = kept_blocks(x.flex);
      });
}

}  // namespace

void register_flex() {
  const bool forward = op_selected("attention_features"), backward = op_selected("flex_backward");
  if (!forward && !backward) return;
  const Config& c = config();
  AttnShape s;  // B 1, H 8, D 128
  s.Sq = s.Sk = c.preset == Preset::quick ? 512 : 2048;
  s.causal = true;
  constexpr Form kForms[] = {Form::causal, Form::window, Form::softcap, Form::alibi,
                             Form::document};
  for (const auto& bu : backends_at(c.threads, false)) {
    for (const Form f : kForms) {
      if (backward) add_backward(bu, f, s);
    }
    if (!forward) continue;
    for (const Form f : kForms) {
      add_side(bu, f, s, true);
      add_side(bu, f, s, false);
      add_paired(bu, f, s, false);
    }
    if (c.preset != Preset::quick) {  // a 128-key window over a long sequence
      AttnShape w = s;
      w.Sq = w.Sk = 8192;
      add_side(bu, Form::window, w, true);
      add_side(bu, Form::window, w, false);
      add_paired(bu, Form::window, w, true);
    }
  }
}

}  // namespace tandem::bench
