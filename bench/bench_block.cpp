// SPDX-License-Identifier: Apache-2.0
// The BERT-shaped attention block (SPEC §7): QKV projection with bias,
// attention, output projection with bias. FLOPs: 2·B·S·E·3E + 2·B·S·E·E for
// the projections plus the attention's 4·B·H·S²·D.
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace tandem::bench {
namespace {

struct BlockFixture {
  AttentionBlockPlan plan;
  std::vector<float> x, w_qkv, b_qkv, w_out, b_out, out;

  explicit BlockFixture(const AttentionBlockPlan& p) : plan(p) {
    const auto E = static_cast<std::size_t>(p.E);
    x = random_buffer(static_cast<std::size_t>(p.x_size()), 51);
    const float w = 1.0f / std::sqrt(static_cast<float>(E));
    w_qkv = random_buffer(3 * E * E, 52, -w, w);
    b_qkv = random_buffer(3 * E, 53, -0.1f, 0.1f);
    w_out = random_buffer(E * E, 54, -w, w);
    b_out = random_buffer(E, 55, -0.1f, 0.1f);
    out = zero_buffer(static_cast<std::size_t>(p.x_size()));
  }
  [[nodiscard]] AttentionBlockInputs inputs() const {
    return {x, w_qkv, b_qkv, w_out, b_out, {}, {}, {}};
  }
};

void add_block(const BackendUnderTest& bu, std::int64_t B, std::int64_t S, std::int64_t E,
               std::int64_t H, const std::vector<std::string>& tags) {
  AttentionBlockParams p;
  p.batch = B;
  p.seq = S;
  p.embed = E;
  p.heads = H;
  p.qkv_bias = p.out_bias = true;
  const AttentionBlockPlan plan = AttentionBlockPlan::make(p);
  const double tokens = static_cast<double>(B * S);
  const double proj = 2.0 * tokens * static_cast<double>(E) * static_cast<double>(4 * E);
  const double attn = 4.0 * static_cast<double>(B * H) * static_cast<double>(S) *
                      static_cast<double>(S) * static_cast<double>(E / H);
  Spec s;
  s.op = "attention_block";
  s.backend = bu.name;
  s.shape = join_tag({{"B", B}, {"S", S}, {"E", E}, {"H", H}});
  s.threads = bu.threads;
  s.name = s.op + "/" + s.backend + "/" + s.shape;
  s.tags = tags;
  s.params = {{"B", double(B)},    {"S", double(S)},     {"E", double(E)},
              {"H", double(H)},    {"D", double(E / H)}, {"proj_flop", proj},
              {"attn_flop", attn}, {"flop", proj + attn}};
  const std::string key = s.name;
  const int threads = bu.threads;
  auto be = std::make_shared<Backend>(bu.make());
  add(s, [be, plan, key, proj, attn, threads](benchmark::State& st) {
    BlockFixture* fx = nullptr;
    try {
      fx = &cached_fixture<BlockFixture>(key, [&] { return std::make_unique<BlockFixture>(plan); });
      be->attention_block(fx->plan, fx->inputs(), fx->out);  // warm-up
    } catch (const std::exception& e) {
      st.SkipWithError(e.what());
      return;
    }
    const AttentionBlockInputs in = fx->inputs();
    const auto loop_start = std::chrono::steady_clock::now();
    for (auto _ : st) {
      be->attention_block(fx->plan, in, fx->out);
      benchmark::ClobberMemory();
    }
    set_flop_counters(st, proj + attn, threads, seconds_since(loop_start));
  });
}

}  // namespace

void register_block() {
  if (!op_selected("attention_block")) return;
  const Config& c = config();
  const bool quick = c.preset == Preset::quick;
  for (const auto& bu : backends_at(c.threads, false)) {
    add_block(bu, quick ? 2 : 8, 512, 768, 12, {"main", "peer"});
  }
  for (const auto& bu : backends_at(c.threads, true)) {
    add_block(bu, 1, 128, 768, 12, {"small"});
  }
}

}  // namespace tandem::bench
