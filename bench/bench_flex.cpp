// SPDX-License-Identifier: Apache-2.0
// FlexAttention written causal against the native causal path, each side
// measured in the same run (op attention_features, kind `flex`: the tags
// `feature` for the flex call, `plain` for the native one, the same shape
// tag; the report's features table divides one by the other). The flex
// side is torch's usual form: mask_mod kv_idx <= q_idx with the block mask
// create_block_mask makes of it (128 × 128 blocks: full below the diagonal,
// partial on it), layout bhsd; the native side is attention_forward with
// MaskKind::causal (bshd), the same B, H, S, D and FLOPs.
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "tandem/reference/flex.hpp"

namespace tandem::bench {
namespace {

/// The inputs and outputs of one flex causal call of shape s.
struct FlexFixture {
  FlexPlan plan;
  FlexBlockMask blocks;
  std::vector<float> q, k, v, out, lse;

  explicit FlexFixture(const AttnShape& s) {
    FlexParams p;
    p.B = s.B, p.H = s.H, p.Hkv = s.Hkv, p.Sq = s.Sq, p.Sk = s.Sk, p.D = s.D, p.Dv = s.Dv;
    ModProgram& m = p.mask_mod;
    m.set_result(m.kv_idx() <= m.q_idx());
    blocks = reference::create_block_mask<float>(FlexPlan::make(p), {}, 128, 128, true, true);
    p.block_mask = blocks.shape;
    plan = FlexPlan::make(p);
    q = random_buffer(static_cast<std::size_t>(plan.q_size()), 1);
    k = random_buffer(static_cast<std::size_t>(plan.k_size()), 2);
    v = random_buffer(static_cast<std::size_t>(plan.v_size()), 3);
    out = zero_buffer(static_cast<std::size_t>(plan.out_size()));
    lse = zero_buffer(static_cast<std::size_t>(plan.lse_size()));
  }
};

/// The inputs and output of the native causal call of shape s.
struct NativeFixture {
  AttentionPlan plan;
  std::vector<float> q, k, v, out;
  explicit NativeFixture(const AttnShape& s) : plan(s.plan()) {
    q = random_buffer(static_cast<std::size_t>(plan.q.extent), 1);
    k = random_buffer(static_cast<std::size_t>(plan.k.extent), 2);
    v = random_buffer(static_cast<std::size_t>(plan.v.extent), 3);
    out = zero_buffer(static_cast<std::size_t>(plan.o.extent));
  }
};

/// Registers one side (flex: `feature`, native: `plain`) of the comparison.
void add_side(const BackendUnderTest& bu, const AttnShape& s, bool flex) {
  Spec spec;
  spec.op = "attention_features";
  spec.backend = bu.name;
  spec.shape = "flex_forward_" + s.tag();
  spec.threads = bu.threads;
  spec.name = spec.op + "/" + spec.backend + "/" + spec.shape + (flex ? "/feature" : "/plain");
  spec.tags = {"features", "flex", flex ? "feature" : "plain"};
  s.describe(spec);
  const double flops = s.forward_flops();
  spec.params["flop"] = flops;
  const std::string key = spec.name;
  const int threads = bu.threads;
  auto be = std::make_shared<Backend>(bu.make());
  add(spec, [be, s, flex, flops, threads, key](benchmark::State& st) {
    std::function<void()> call;
    try {
      if (flex) {
        auto& f =
            cached_fixture<FlexFixture>(key, [&] { return std::make_unique<FlexFixture>(s); });
        call = [&f, be] {
          const FlexInputs<float> in{f.q, f.k, f.v, {}, {}, f.blocks.data()};
          be->flex_forward(f.plan, in, f.out, f.lse);
        };
      } else {
        auto& f =
            cached_fixture<NativeFixture>(key, [&] { return std::make_unique<NativeFixture>(s); });
        call = [&f, be] { be->attention_forward(f.plan, {f.q, f.k, f.v, {}}, f.out); };
      }
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
  });
}

}  // namespace

void register_flex() {
  if (!op_selected("attention_features")) return;
  const Config& c = config();
  AttnShape s;  // B 1, H 8, D 128
  s.Sq = s.Sk = c.preset == Preset::quick ? 512 : 2048;
  s.causal = true;
  for (const auto& bu : backends_at(c.threads, false)) {
    add_side(bu, s, true);
    add_side(bu, s, false);
  }
}

}  // namespace tandem::bench
