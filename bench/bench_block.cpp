// SPDX-License-Identifier: Apache-2.0
// The BERT-shaped attention block (SPEC §7): QKV projection with bias,
// attention, output projection with bias. FLOPs: 2·B·S·E·3E + 2·B·S·E·E for
// the projections plus the attention's 4·B·H·S²·D. block_stored: the same
// block with bf16 and f16 storage against f32, paired within each iteration.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_paired.hpp"

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
  [[nodiscard]] AttentionBlockInputs<float> inputs() const {
    return {x, w_qkv, b_qkv, w_out, b_out, {}, {}, {}};
  }
};

/// The benchmarked block: x `[B, S, E]`, H heads, both biases.
AttentionBlockPlan block_plan(std::int64_t B, std::int64_t S, std::int64_t E, std::int64_t H) {
  AttentionBlockParams p;
  p.batch = B;
  p.seq = S;
  p.embed = E;
  p.heads = H;
  p.qkv_bias = p.out_bias = true;
  return AttentionBlockPlan::make(p);
}

void add_block(const BackendUnderTest& bu, std::int64_t B, std::int64_t S, std::int64_t E,
               std::int64_t H, const std::vector<std::string>& tags) {
  const AttentionBlockPlan plan = block_plan(B, S, E, H);
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
    const AttentionBlockInputs<float> in = fx->inputs();
    const auto loop_start = std::chrono::steady_clock::now();
    for (auto _ : st) {
      be->attention_block(fx->plan, in, fx->out);
      benchmark::ClobberMemory();
    }
    set_flop_counters(st, proj + attn, threads, seconds_since(loop_start));
  });
}

/// One block's inputs at f32, bf16 and f16 (the same values, rounded once).
struct StoredBlockFixture {
  BlockFixture f32;
  std::vector<bfloat16> x16, wq16, bq16, wo16, bo16, out16;
  std::vector<float16> xh, wqh, bqh, woh, boh, outh;

  explicit StoredBlockFixture(const AttentionBlockPlan& p) : f32(p) {
    const auto fill = [](const std::vector<float>& v, auto& b, auto& h) {
      for (const float x : v) {
        b.emplace_back(static_cast<double>(x));
        h.emplace_back(static_cast<double>(x));
      }
    };
    fill(f32.x, x16, xh);
    fill(f32.w_qkv, wq16, wqh);
    fill(f32.b_qkv, bq16, bqh);
    fill(f32.w_out, wo16, woh);
    fill(f32.b_out, bo16, boh);
    out16.resize(f32.out.size());
    outh.resize(f32.out.size());
  }
  /// The block at kind k: 0 = f32, 1 = bf16, 2 = f16.
  void run(int k, const Backend& be) {
    if (k == 0) {
      be.attention_block(f32.plan, f32.inputs(), f32.out);
    } else if (k == 1) {
      be.bf16.attention_block(f32.plan, {x16, wq16, bq16, wo16, bo16, {}, {}, {}}, out16);
    } else {
      be.f16.attention_block(f32.plan, {xh, wqh, bqh, woh, boh, {}, {}, {}}, outh);
    }
  }
};

/// f32, bf16 and f16 blocks of one shape run in turn in every iteration
/// (PairedTimes, bench_paired.hpp): each kind's time and the per-iteration
/// speed-ups f32 time ÷ bf16 time and f32 ÷ f16 (median and quartiles), so
/// both sides of a ratio see the same machine state.
void add_block_stored(const BackendUnderTest& bu, std::int64_t B, std::int64_t S, std::int64_t E,
                      std::int64_t H) {
  const AttentionBlockPlan plan = block_plan(B, S, E, H);
  Spec s;
  s.op = "block_stored";
  s.backend = bu.name;
  s.shape = join_tag({{"B", B}, {"S", S}, {"E", E}, {"H", H}});
  s.threads = bu.threads;
  s.name = s.op + "/" + s.backend + "/" + s.shape;
  s.tags = {"stored"};
  s.params = {{"B", double(B)}, {"S", double(S)}, {"E", double(E)}, {"H", double(H)}};
  const std::string key = s.name;
  auto be = std::make_shared<Backend>(bu.make());
  add(s, [be, plan, key](benchmark::State& st) {
    StoredBlockFixture* fx = nullptr;
    try {
      fx = &cached_fixture<StoredBlockFixture>(
          key, [&] { return std::make_unique<StoredBlockFixture>(plan); });
      for (int k = 0; k < 3; ++k) fx->run(k, *be);  // warm-up
    } catch (const std::exception& e) {
      st.SkipWithError(e.what());
      return;
    }
    PairedTimes times({"f32", "bf16", "f16"});
    times.time_iterations(st, [&](std::size_t k) { fx->run(static_cast<int>(k), *be); });
    times.set_counters(st);
  });
}

}  // namespace

void register_block() {
  // block_stored runs only when named in OPS (the report has no table for it)
  if (!config().ops.empty() && op_selected("block_stored")) {
    for (const auto& bu : backends_at(config().threads, false)) {
      add_block_stored(bu, config().preset == Preset::quick ? 2 : 8, 512, 768, 12);
    }
  }
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
