// SPDX-License-Identifier: Apache-2.0
// The optimized streaming kernels (RoPE, axial RoPE, SwiGLU) and the
// attention block against the reference backend, on every Highway target this
// CPU runs (scalar fallback included), on sizes just below, at and above the
// lane counts (4, 8, 16 floats) and odd ones, with 1 and 2 threads giving
// bitwise identical results, and with guard sentinels after every output.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/optimized/backend.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/tandem.hpp"

#ifdef TANDEM_HAVE_OPTIMIZED

namespace {

namespace opt = tandem::optimized;
namespace test = tandem::test;
using test::Guarded;
using Vec = std::vector<float>;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// Runs `call(backend, out)` for the reference and for the optimized backend
/// with 1 and 2 threads; checks the guards, the 1-vs-2-thread bitwise
/// identity and the agreement with the reference.
void compare(std::int64_t out_size,
             const std::function<void(const tandem::Backend&, std::span<float>)>& call, double rtol,
             double atol) {
  Guarded want(out_size);
  call(tandem::reference::backend(), want.view());
  test::for_each_target([&] {
    Guarded one(out_size), two(out_size);
    call(opt::backend(opt::Options{1}), one.view());
    call(opt::backend(opt::Options{2}), two.view());
    EXPECT_TRUE(one.guards_intact()) << "1 thread wrote past the output";
    EXPECT_TRUE(two.guards_intact()) << "2 threads wrote past the output";
    EXPECT_TRUE(test::bitwise(one.values(), two.values())) << "1 and 2 threads differ";
    EXPECT_TRUE(test::close(one.values(), want.values(), rtol, atol));
  });
}

// ---------------------------------------------------------------------------
// RoPE

struct RopeCase {
  std::int64_t B, S, heads, D, n_rot;
  tandem::RopeStyle style;
  std::int64_t extra_T = 0;       ///< table stride beyond n_rot/2
  bool token_rows = false;        ///< R = B·S, token rows
  std::int64_t extra_rows = 0;    ///< table rows beyond S (position rows, position ids)
  std::int64_t extra_stride = 0;  ///< source row stride beyond W (bshd)
  tandem::RopeLayout layout = tandem::RopeLayout::bshd;
  bool position_ids = false;  ///< rows from random int32 positions in [0, R)
  std::int64_t k_heads = 0;   ///< > 0: q and k in one call, k with this many heads
};

std::string describe(const RopeCase& c) {
  return std::string(tandem::to_string(c.layout)) + " B=" + std::to_string(c.B) +
         " S=" + std::to_string(c.S) + " heads=" + std::to_string(c.heads) +
         " D=" + std::to_string(c.D) + " n_rot=" + std::to_string(c.n_rot) + " " +
         tandem::to_string(c.style) + " T+=" + std::to_string(c.extra_T) +
         (c.position_ids ? " position_ids"
          : c.token_rows ? " token"
                         : " position") +
         " R+=" + std::to_string(c.extra_rows) + " stride+=" + std::to_string(c.extra_stride) +
         " k_heads=" + std::to_string(c.k_heads);
}

tandem::RopeParams rope_params(const RopeCase& c) {
  tandem::RopeParams p;
  p.batch = c.B;
  p.seq = c.S;
  p.head_dim = c.D;
  p.width = c.heads * c.D;
  p.layout = c.layout;
  p.n_rot = c.n_rot;
  p.style = c.style;
  p.table_stride = c.n_rot / 2 + c.extra_T;
  p.rows = c.position_ids ? tandem::TableRows::position_ids
           : c.token_rows ? tandem::TableRows::token
                          : tandem::TableRows::position;
  p.table_rows = c.token_rows ? c.B * c.S : c.S + c.extra_rows;
  if (c.extra_stride > 0) p.src_row_stride = p.width + c.extra_stride;
  if (p.table_stride == 0) p.table_stride = 1;  // n_rot = 0: a one-column table
  return p;
}

void check_rope(const RopeCase& c, std::uint32_t seed) {
  SCOPED_TRACE(describe(c));
  tandem::RopeQkParams qk;
  qk.q = rope_params(c);
  qk.k_width = (c.k_heads > 0 ? c.k_heads : 1) * c.D;
  if (c.extra_stride > 0) qk.k_src_row_stride = qk.k_width + c.extra_stride;
  const tandem::RopeQkPlan both = tandem::RopeQkPlan::make(qk);
  const tandem::RopePlan& plan = both.q;
  const Vec x =
      test::random_values<float>(static_cast<std::size_t>(plan.src_extent()), seed, -2, 2);
  const Vec xk =
      test::random_values<float>(static_cast<std::size_t>(both.k.src_extent()), seed + 2, -2, 2);
  // Real rotations: c = cos(θ), s = sin(θ) for random angles.
  const Vec angles =
      test::random_values<float>(static_cast<std::size_t>(plan.R * plan.T), seed + 1, -10, 10);
  Vec cos(angles.size()), sin(angles.size());
  for (std::size_t i = 0; i < angles.size(); ++i) {
    cos[i] = std::cos(angles[i]);
    sin[i] = std::sin(angles[i]);
  }
  std::vector<std::int32_t> positions;
  if (c.position_ids) {
    std::mt19937 gen(seed + 3);
    for (std::int64_t t = 0; t < plan.B * plan.S; ++t) {
      positions.push_back(static_cast<std::int32_t>(gen() % static_cast<std::uint32_t>(plan.R)));
    }
  }
  const tandem::RopeTables<float> tables{cos, sin,
                                         tandem::Indices(std::span<const std::int32_t>(positions))};
  for (const bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "backward" : "forward");
    const auto& one = backward ? &tandem::Backend::rope_backward : &tandem::Backend::rope_forward;
    compare(
        plan.out_size(),
        [&](const tandem::Backend& b, std::span<float> out) { (b.*one)(plan, x, tables, out); },
        1e-5, 1e-6);
    if (c.k_heads == 0) continue;
    // q and k in one call: each output as the reference's, bitwise across threads.
    const auto& two =
        backward ? &tandem::Backend::rope_backward_qk : &tandem::Backend::rope_forward_qk;
    const std::int64_t nq = plan.out_size(), nk = both.k.out_size();
    compare(
        nq + nk,
        [&](const tandem::Backend& b, std::span<float> out) {
          (b.*two)(both, x, xk, tables, out.first(nq), out.subspan(nq));
        },
        1e-5, 1e-6);
  }
}

TEST(OptimizedRope, HeadWidthsAroundTheLaneCounts) {
  std::uint32_t seed = 1;
  for (tandem::RopeStyle style : {tandem::RopeStyle::neox, tandem::RopeStyle::gptj}) {
    // m = n_rot/2 pairs per head: 1, 3..5, 7..9, 15..17, 31..33 straddle 4, 8, 16 lanes.
    for (std::int64_t m : {1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33}) {
      check_rope({2, 3, 2, 2 * m, 2 * m, style}, seed++);
    }
  }
}

TEST(OptimizedRope, PartialRotationPassesTheTailThrough) {
  std::uint32_t seed = 100;
  for (tandem::RopeStyle style : {tandem::RopeStyle::neox, tandem::RopeStyle::gptj}) {
    check_rope({1, 4, 3, 10, 4, style}, seed++);
    check_rope({2, 3, 2, 36, 18, style}, seed++);
    check_rope({1, 5, 1, 64, 34, style}, seed++);
    check_rope({2, 2, 3, 7, 0, style}, seed++);  // n_rot = 0: all copied, odd D
    check_rope({3, 2, 2, 9, 8, style}, seed++);  // odd D, one pass-through dim
  }
}

TEST(OptimizedRope, StridedTablesTokenRowsAndSourceStrides) {
  std::uint32_t seed = 200;
  for (tandem::RopeStyle style : {tandem::RopeStyle::neox, tandem::RopeStyle::gptj}) {
    check_rope({2, 5, 2, 16, 16, style, /*T+*/ 3}, seed++);
    check_rope({2, 5, 2, 34, 30, style, /*T+*/ 5, false, /*R+*/ 7}, seed++);
    check_rope({3, 4, 2, 18, 18, style, 0, /*token*/ true}, seed++);
    check_rope({3, 4, 2, 40, 32, style, 2, /*token*/ true, 0, /*stride+*/ 11}, seed++);
    check_rope({2, 6, 3, 16, 16, style, 0, false, 0, /*stride+ 2·3·16*/ 96}, seed++);
    check_rope({1, 9, 1, 6, 6, style, 1, false, 4, /*stride+*/ 1}, seed++);
  }
}

TEST(OptimizedRope, LayoutsPositionIdsAndQkInOnePass) {
  using L = tandem::RopeLayout;
  std::uint32_t seed = 300;
  for (tandem::RopeStyle style : {tandem::RopeStyle::neox, tandem::RopeStyle::gptj}) {
    // bhsd [B, H, S, D] with every kind of table row.
    check_rope({2, 5, 3, 16, 16, style, 0, false, 2, 0, L::bhsd}, seed++);
    check_rope({2, 5, 3, 18, 12, style, 1, true, 0, 0, L::bhsd}, seed++);
    check_rope({2, 5, 3, 34, 34, style, 0, false, 9, 0, L::bhsd, true}, seed++);
    // Position ids (any order, repeats, a table shorter than S), bshd and thd.
    check_rope({3, 7, 2, 16, 16, style, 2, false, -4, 5, L::bshd, true}, seed++);
    check_rope({1, 11, 4, 10, 8, style, 0, false, 30, 3, L::thd, true}, seed++);
    // q and k (GQA 4:1, 3:2, and k with more heads than q) in one call.
    check_rope({2, 6, 4, 32, 32, style, 0, false, 3, 7, L::bshd, true, 1}, seed++);
    check_rope({2, 6, 3, 12, 8, style, 1, true, 0, 0, L::bhsd, false, 2}, seed++);
    check_rope({1, 9, 2, 18, 18, style, 0, false, 0, 2, L::thd, false, 5}, seed++);
    // bhsd runs in blocks of 128 tokens: several blocks and a partial last one.
    check_rope({2, 300, 3, 8, 8, style, 0, false, 5, 0, L::bhsd, true, 2}, seed++);
  }
}

// ---------------------------------------------------------------------------
// Axial RoPE

struct AxialCase {
  std::int64_t B, heads, D, end_x, end_y, repeat;
  double theta = 10000.0;
  std::int64_t extra_stride = 0;
};

void check_axial(const AxialCase& c, std::uint32_t seed) {
  SCOPED_TRACE("B=" + std::to_string(c.B) + " heads=" + std::to_string(c.heads) +
               " D=" + std::to_string(c.D) + " end_x=" + std::to_string(c.end_x) +
               " end_y=" + std::to_string(c.end_y) + " r=" + std::to_string(c.repeat) +
               " stride+=" + std::to_string(c.extra_stride));
  tandem::AxialRopeParams p;
  p.batch = c.B;
  p.seq = c.repeat * c.end_x * c.end_y;
  p.num_heads = c.heads;
  p.width = c.heads * c.D;
  p.end_x = c.end_x;
  p.end_y = c.end_y;
  p.theta = c.theta;
  p.repeat_factor = c.repeat;
  p.src_row_stride = p.width + c.extra_stride;
  const tandem::AxialRopePlan plan = tandem::AxialRopePlan::make(p);
  const Vec x =
      test::random_values<float>(static_cast<std::size_t>(plan.src_extent()), seed, -2, 2);
  // Angles up to max(end_x, end_y) radians: table rounding is relative to 1.
  {
    SCOPED_TRACE("forward");
    compare(
        plan.out_size(),
        [&](const tandem::Backend& b, std::span<float> out) { b.axial_rope_forward(plan, x, out); },
        1e-5, 2e-6);
  }
  {
    SCOPED_TRACE("backward");
    compare(
        plan.out_size(),
        [&](const tandem::Backend& b, std::span<float> dx) { b.axial_rope_backward(plan, x, dx); },
        1e-5, 2e-6);
  }
}

TEST(OptimizedAxialRope, HeadWidthsAroundTheLaneCounts) {
  std::uint32_t seed = 300;
  // D/4 pairs per half: 1, 3..5, 7..9, 15..17 straddle 4, 8, 16 lanes.
  for (std::int64_t q : {1, 3, 4, 5, 7, 8, 9, 15, 16, 17}) {
    check_axial({2, 2, 4 * q, 3, 2, 1}, seed++);
  }
}

TEST(OptimizedAxialRope, GridsRepeatsThetaAndStrides) {
  std::uint32_t seed = 400;
  check_axial({1, 1, 32, 5, 3, 2}, seed++);
  check_axial({2, 3, 12, 1, 7, 1}, seed++);
  check_axial({2, 2, 16, 7, 1, 3, 100.0}, seed++);
  check_axial({3, 1, 64, 4, 4, 1, 10000.0, /*stride+*/ 5}, seed++);
  check_axial({1, 2, 20, 3, 3, 2, 500.0, /*stride+*/ 40}, seed++);
}

// ---------------------------------------------------------------------------
// SwiGLU

void check_swiglu(std::int64_t rows, std::int64_t n, bool gate_first, const Vec& x, const Vec& dy) {
  SCOPED_TRACE("rows=" + std::to_string(rows) + " n=" + std::to_string(n) +
               (gate_first ? " gate_first" : " up_first"));
  const tandem::SwigluPlan plan = tandem::SwigluPlan::make({rows, n, gate_first});
  {
    SCOPED_TRACE("forward");
    compare(
        plan.out_size(),
        [&](const tandem::Backend& b, std::span<float> out) { b.swiglu_forward(plan, x, out); },
        1e-5, 1e-6);
  }
  {
    SCOPED_TRACE("backward");
    compare(
        plan.in_size(),
        [&](const tandem::Backend& b, std::span<float> dx) { b.swiglu_backward(plan, x, dy, dx); },
        1e-5, 1e-6);
  }
}

TEST(OptimizedSwiglu, WidthsAroundTheLaneCountsBothOrders) {
  std::uint32_t seed = 500;
  for (bool gate_first : {true, false}) {
    for (std::int64_t n : {1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 100}) {
      const std::int64_t rows = 3;
      const Vec x =
          test::random_values<float>(static_cast<std::size_t>(rows * 2 * n), seed++, -6, 6);
      const Vec dy = test::random_values<float>(static_cast<std::size_t>(rows * n), seed++, -2, 2);
      check_swiglu(rows, n, gate_first, x, dy);
    }
  }
}

TEST(OptimizedSwiglu, ExtremeAndNonFiniteGates) {
  // Gates where exp(−g) overflows float or double, zero, and non-finite
  // values, which propagate by IEEE rules (−inf·σ(−inf) = −inf·0 = NaN).
  const Vec gates = {-200.f, -120.f, -100.f, -88.f, -30.f, -1e-3f, 0.f,  1e-3f, 30.f,
                     88.f,   100.f,  120.f,  200.f, kInf,  -kInf,  kNaN, -0.f};
  const std::int64_t n = static_cast<std::int64_t>(gates.size());
  for (bool gate_first : {true, false}) {
    Vec x(static_cast<std::size_t>(2 * n));
    const Vec up = test::random_values<float>(gates.size(), 600, 0.5f, 2.0f);
    for (std::int64_t i = 0; i < n; ++i) {
      x[gate_first ? i : n + i] = gates[i];
      x[gate_first ? n + i : i] = up[i];
    }
    const Vec dy = test::random_values<float>(gates.size(), 601, 0.5f, 2.0f);
    check_swiglu(1, n, gate_first, x, dy);
  }
}

TEST(OptimizedSwiglu, ManyRowsSplitAcrossThreads) {
  const std::int64_t rows = 257, n = 45;
  const Vec x = test::random_values<float>(static_cast<std::size_t>(rows * 2 * n), 700, -8, 8);
  const Vec dy = test::random_values<float>(static_cast<std::size_t>(rows * n), 701, -2, 2);
  check_swiglu(rows, n, true, x, dy);
}

// ---------------------------------------------------------------------------
// Attention block

struct BlockCase {
  std::int64_t B, S, E, H;
  bool qkv_bias, out_bias, keep, rope;
};

void check_block(const BlockCase& c, std::uint32_t seed) {
  SCOPED_TRACE("B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " E=" +
               std::to_string(c.E) + " H=" + std::to_string(c.H) + (c.qkv_bias ? " b_qkv" : "") +
               (c.out_bias ? " b_out" : "") + (c.keep ? " keep" : "") + (c.rope ? " rope" : ""));
  const std::int64_t D = c.E / c.H, R = c.S + 3, T = D / 2 + 1;
  tandem::AttentionBlockParams p;
  p.batch = c.B;
  p.seq = c.S;
  p.embed = c.E;
  p.heads = c.H;
  p.qkv_bias = c.qkv_bias;
  p.out_bias = c.out_bias;
  p.key_padding = c.keep;
  p.rope = c.rope;
  if (c.rope) {
    p.table_rows = R;
    p.table_stride = T;
  }
  const tandem::AttentionBlockPlan plan = tandem::AttentionBlockPlan::make(p);
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(c.E));
  const Vec x = test::random_values<float>(static_cast<std::size_t>(plan.x_size()), seed, -2, 2);
  const Vec w_qkv = test::random_values<float>(static_cast<std::size_t>(3 * c.E * c.E), seed + 1,
                                               -w_scale, w_scale);
  const Vec w_out =
      test::random_values<float>(static_cast<std::size_t>(c.E * c.E), seed + 2, -w_scale, w_scale);
  const Vec b_qkv =
      c.qkv_bias ? test::random_values<float>(static_cast<std::size_t>(3 * c.E), seed + 3, -2, 2)
                 : Vec{};
  const Vec b_out = c.out_bias
                        ? test::random_values<float>(static_cast<std::size_t>(c.E), seed + 4, -2, 2)
                        : Vec{};
  Vec keep;
  if (c.keep) {
    keep = test::random_values<float>(static_cast<std::size_t>(c.B * c.S), seed + 5, 0, 1);
    for (float& k : keep) k = k < 0.3f ? 0.0f : 1.0f;
    keep[0] = 1.0f;
    keep[static_cast<std::size_t>(c.S) - 1] = 0.0f;
  }
  Vec cos, sin;
  if (c.rope) {
    const Vec angles =
        test::random_values<float>(static_cast<std::size_t>(R * T), seed + 6, -10, 10);
    for (float a : angles) {
      cos.push_back(std::cos(a));
      sin.push_back(std::sin(a));
    }
  }
  const tandem::AttentionBlockInputs<float> in{x, w_qkv, b_qkv, w_out, b_out, keep, cos, sin};
  compare(
      plan.x_size(),
      [&](const tandem::Backend& b, std::span<float> out) { b.attention_block(plan, in, out); },
      1e-4, 2e-5);
}

TEST(OptimizedAttentionBlock, AgreesWithTheReference) {
  std::uint32_t seed = 800;
  check_block({1, 1, 4, 1, false, false, false, false}, seed += 10);
  check_block({2, 5, 12, 3, true, true, false, false}, seed += 10);
  check_block({2, 7, 12, 2, false, true, true, false}, seed += 10);
  check_block({2, 6, 16, 2, true, false, false, true}, seed += 10);
  check_block({3, 9, 40, 5, true, true, true, true}, seed += 10);
  check_block({1, 17, 72, 4, true, true, false, true}, seed += 10);  // K = 72: a K tail
  check_block({2, 5, 33, 3, true, true, true, false}, seed += 10);   // odd E, M, N
  check_block({2, 53, 24, 3, true, true, true, true}, seed += 10);   // 106 rows: 3 row blocks
}

// ---------------------------------------------------------------------------
// Validation: errors name the parameter and leave the output untouched.

TEST(OptimizedValidation, BadViewsThrowBeforeWriting) {
  const tandem::Backend b = opt::backend(opt::Options{2});
  tandem::RopeParams rp;
  rp.seq = 3;
  rp.width = 8;
  rp.head_dim = 8;
  rp.table_rows = 3;
  const tandem::RopePlan rope = tandem::RopePlan::make(rp);
  const Vec x(24, 1.0f), table(12, 0.5f);
  Guarded short_out(23);
  test::expect_error(
      [&] {
        b.rope_forward(rope, x, {table, table}, short_out.view());
      },
      "out.size()");
  EXPECT_TRUE(short_out.untouched());

  Guarded out(24);
  test::expect_error(
      [&] {
        b.rope_backward(rope, std::span<const float>(x).first(23), {table, table}, out.view());
      },
      "dy.size()");
  test::expect_error(
      [&] {
        b.rope_forward(rope, x, {std::span<const float>(table).first(11), table}, out.view());
      },
      "cos.size()");
  EXPECT_TRUE(out.untouched());

  const tandem::SwigluPlan sw = tandem::SwigluPlan::make({2, 4, true});
  const Vec sx(16, 1.0f), sdy(8, 1.0f);
  Guarded dx(15);
  test::expect_error([&] { b.swiglu_backward(sw, sx, sdy, dx.view()); }, "dx.size()");
  EXPECT_TRUE(dx.untouched());

  tandem::AxialRopeParams ap;
  ap.seq = 4;
  ap.width = 8;
  ap.end_x = 2;
  ap.end_y = 2;
  const tandem::AxialRopePlan axial = tandem::AxialRopePlan::make(ap);
  Guarded aout(32);
  test::expect_error(
      [&] { b.axial_rope_forward(axial, std::span<const float>(sx).first(16), aout.view()); },
      "x.size()");
  EXPECT_TRUE(aout.untouched());

  EXPECT_THROW(opt::backend(opt::Options{-1}), tandem::Error);
}

}  // namespace

#endif  // TANDEM_HAVE_OPTIMIZED
