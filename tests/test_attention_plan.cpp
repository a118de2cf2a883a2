// SPDX-License-Identifier: Apache-2.0
// Every validation rule of AttentionPlan (make and from_shapes), the shape
// rules of SPEC §1, and the view checks of the reference backend's attention
// entry points: the error names the parameter and the value, and the output
// buffers are untouched after a throw (SPEC §8).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/attention.hpp"
#include "tandem/reference/backend.hpp"

namespace {

using tandem::AttentionAttrs;
using tandem::AttentionGrads;
using tandem::AttentionInputs;
using tandem::AttentionParams;
using tandem::AttentionPlan;
using tandem::AttentionShapes;
using tandem::Layout;
using tandem::MaskKind;
using tandem::Shape;

using tandem::test::attention_attrs;
using tandem::test::expect_error;
using tandem::test::expect_make_error;
using tandem::test::sentinel;
using tandem::test::untouched;

// A valid starting point: B=2 Sq=3 Sk=5 H=4 Hkv=2 D=8.
AttentionParams valid() {
  AttentionParams p;
  p.B = 2;
  p.Sq = 3;
  p.Sk = 5;
  p.H = 4;
  p.Hkv = 2;
  p.D = 8;
  return p;
}

void expect_shapes_error(const Shape& q, const Shape& k, const Shape& v,
                         const std::optional<Shape>& mask, const AttentionAttrs& a,
                         const std::string& parameter,
                         std::initializer_list<std::string> fragments) {
  expect_error([&] { AttentionPlan::from_shapes(q, k, v, mask, a); }, parameter, fragments);
}

constexpr std::int64_t kTwo40 = std::int64_t(1) << 40;
constexpr std::int64_t kTwo32 = std::int64_t(1) << 32;

// ---------------------------------------------------------------------------
// make: what it derives

TEST(AttentionPlanMake, DefaultsAndDerivedStrides) {
  AttentionParams p = valid();
  p.Hkv = 0;  // means H
  const AttentionPlan plan = AttentionPlan::make(p);
  EXPECT_EQ(plan.Hkv, 4);
  EXPECT_EQ(plan.Dv, 8);                               // v_head_dim 0 means D
  EXPECT_DOUBLE_EQ(plan.scale, 1.0 / std::sqrt(8.0));  // 1/sqrt(D)
  EXPECT_EQ(plan.q_offset(), 2);                       // Sk - Sq = 5 - 3
  EXPECT_EQ(plan.mask_size(), 0);
  // bshd q [2, 3, 4, 8]: rows of H*D = 32, batch = Sq*32 = 96.
  EXPECT_EQ(plan.q.seq, 32);
  EXPECT_EQ(plan.q.head, 8);
  EXPECT_EQ(plan.q.batch, 96);
  EXPECT_EQ(plan.q.extent, 2 * 3 * 4 * 8);
}

TEST(AttentionPlanMake, BhsdStridesAndGroups) {
  AttentionParams p = valid();
  p.layout = Layout::bhsd;
  p.Dv = 6;
  const AttentionPlan plan = AttentionPlan::make(p);
  // k [B, Hkv, Sk, D] = [2, 2, 5, 8]: seq = 8, head = 5*8 = 40, batch = 2*40 = 80.
  EXPECT_EQ(plan.k.seq, 8);
  EXPECT_EQ(plan.k.head, 40);
  EXPECT_EQ(plan.k.batch, 80);
  // out [B, H, Sq, Dv] = [2, 4, 3, 6], contiguous: extent 144.
  EXPECT_EQ(plan.o.extent, 144);
  EXPECT_EQ(plan.dv.extent, 2 * 2 * 5 * 6);
  // H/Hkv = 2: heads 0, 1 -> kv 0; heads 2, 3 -> kv 1.
  EXPECT_EQ(plan.group(), 2);
  EXPECT_EQ(plan.kv_head(0), 0);
  EXPECT_EQ(plan.kv_head(1), 0);
  EXPECT_EQ(plan.kv_head(2), 1);
  EXPECT_EQ(plan.kv_head(3), 1);
}

TEST(AttentionPlanMake, RowStridesWidenOnlyTheirTensor) {
  AttentionParams p = valid();
  p.q_row_stride = 40;  // >= H*D = 32
  const AttentionPlan plan = AttentionPlan::make(p);
  EXPECT_EQ(plan.q.seq, 40);
  // last row starts at (B*Sq - 1) * 40 = 200 and is 32 wide
  EXPECT_EQ(plan.q.extent, 5 * 40 + 32);
  EXPECT_EQ(plan.o.seq, 32);  // outputs stay contiguous
  EXPECT_EQ(plan.dq.seq, 32);
}

TEST(AttentionPlanMake, MaskSizesAndRows) {
  AttentionParams p = valid();
  p.mask = MaskKind::key_padding;
  AttentionPlan plan = AttentionPlan::make(p);
  EXPECT_EQ(plan.mask_size(), 2 * 5);    // [B, Sk]
  EXPECT_EQ(plan.mask_row(1, 3, 2), 5);  // batch 1's keep row, whatever h and i

  p.mask = MaskKind::bias;
  p.bias_batch = 1;
  p.bias_heads = 4;
  plan = AttentionPlan::make(p);
  EXPECT_EQ(plan.mask_size(), 1 * 4 * 3 * 5);  // [1, H, Sq, Sk]
  // (b, h, i) = (1, 2, 1) -> row ((0*4 + 2)*3 + 1)*5 = 35: batch broadcast
  EXPECT_EQ(plan.mask_row(1, 2, 1), 35);
}

// ---------------------------------------------------------------------------
// make: every rule

TEST(AttentionPlanMake, SizesMustBePositive) {
  AttentionParams p = valid();
  p.B = 0;
  expect_make_error(p, "B", {"B = 0", ">= 1"});
  p = valid();
  p.Sq = 0;
  expect_make_error(p, "Sq", {"Sq = 0", ">= 1"});
  p = valid();
  p.Sk = -1;
  expect_make_error(p, "Sk", {"Sk = -1", ">= 1"});
  p = valid();
  p.H = 0;
  expect_make_error(p, "H", {"H = 0", ">= 1"});
  p = valid();
  p.D = 0;
  expect_make_error(p, "D", {"D = 0", ">= 1"});
  p = valid();
  p.Dv = -3;
  expect_make_error(p, "Dv", {"Dv = -3", ">= 1"});
}

TEST(AttentionPlanMake, KvHeadsMustDivideHeads) {
  AttentionParams p = valid();
  p.Hkv = 3;
  expect_make_error(p, "Hkv", {"Hkv = 3", "must divide H = 4"});
  p.Hkv = -2;
  expect_make_error(p, "Hkv", {"Hkv = -2"});
  p.Hkv = 8;  // more kv heads than query heads
  expect_make_error(p, "Hkv", {"Hkv = 8", "H = 4"});
}

TEST(AttentionPlanMake, WindowRules) {
  AttentionParams p = valid();
  p.mask = MaskKind::sliding_window;
  p.window = -1;
  expect_make_error(p, "window", {"window = -1", ">= 0"});
  p.window = 0;  // itself only: valid
  EXPECT_EQ(AttentionPlan::make(p).window, 0);
  for (MaskKind kind : {MaskKind::none, MaskKind::causal, MaskKind::key_padding, MaskKind::bias}) {
    p.mask = kind;
    p.window = 4;
    expect_make_error(
        p, "window",
        {"window = 4", "must be 0", std::string("mask is ") + tandem::to_string(kind)});
  }
}

TEST(AttentionPlanMake, ScaleMustBeFiniteAndNonZero) {
  AttentionParams p = valid();
  p.scale = 0.0;
  expect_make_error(p, "scale", {"scale = 0", "finite and non-zero"});
  p.scale = std::numeric_limits<double>::infinity();
  expect_make_error(p, "scale", {"scale = inf"});
  p.scale = std::numeric_limits<double>::quiet_NaN();
  expect_make_error(p, "scale", {"scale = ", "nan"});
  p.scale = -0.25;  // negative is allowed (finite, non-zero)
  EXPECT_DOUBLE_EQ(AttentionPlan::make(p).scale, -0.25);
}

TEST(AttentionPlanMake, SoftcapMustBeFiniteAndNonNegative) {
  AttentionParams p = valid();
  p.softcap = -1.0;
  expect_make_error(p, "softcap", {"softcap = -1", ">= 0"});
  p.softcap = std::numeric_limits<double>::infinity();
  expect_make_error(p, "softcap", {"softcap = inf"});
  p.softcap = std::numeric_limits<double>::quiet_NaN();
  expect_make_error(p, "softcap", {"softcap = ", "nan"});
}

TEST(AttentionPlanMake, BiasBroadcastDims) {
  AttentionParams p = valid();
  p.mask = MaskKind::bias;
  p.bias_batch = 3;
  expect_make_error(p, "bias_batch", {"bias_batch = 3", "must be 1 or B = 2 (Bb of a bias"});
  p.bias_batch = 2;
  p.bias_heads = 2;
  expect_make_error(p, "bias_heads", {"bias_heads = 2", "must be 1 or H = 4 (Hb of a bias"});
  p.bias_heads = 4;
  const AttentionPlan plan = AttentionPlan::make(p);
  EXPECT_EQ(plan.mask_size(), 2 * 4 * 3 * 5);
  // Without a bias, the broadcast dims are ignored and reset to 1.
  p.mask = MaskKind::none;
  EXPECT_EQ(AttentionPlan::make(p).bias_batch, 1);
}

TEST(AttentionPlanMake, RowStrideRules) {
  AttentionParams p = valid();
  p.q_row_stride = 31;  // < H*D = 32
  expect_make_error(p, "q_row_stride", {"q_row_stride = 31", ">= heads*width = 32"});
  p = valid();
  p.k_row_stride = 15;  // < Hkv*D = 16
  expect_make_error(p, "k_row_stride", {"k_row_stride = 15", "16"});
  p = valid();
  p.Dv = 3;
  p.v_row_stride = 5;  // < Hkv*Dv = 6
  expect_make_error(p, "v_row_stride", {"v_row_stride = 5", "6"});
  p = valid();
  p.layout = Layout::bhsd;
  p.q_row_stride = 40;
  expect_make_error(p, "q_row_stride", {"q_row_stride = 40", "must be 0 or 32", "bhsd"});
  p.q_row_stride = 32;  // the contiguous value is fine
  EXPECT_EQ(AttentionPlan::make(p).q.seq, 8);
}

TEST(AttentionPlanMake, SizeOverflowIsAnErrorNotUndefined) {
  AttentionParams p = valid();
  p.B = kTwo40;
  p.Sq = kTwo40;  // B*Sq = 2^80
  expect_make_error(p, "q", {"overflows a 64-bit size"});
  p = valid();
  p.H = std::int64_t(1) << 62;
  p.Hkv = 1;
  p.D = 4;  // H*D = 2^64
  expect_make_error(p, "q", {"overflows"});
  p = valid();
  p.q_row_stride = std::numeric_limits<std::int64_t>::max() / 2;  // rows * stride overflows
  expect_make_error(p, "q", {"overflows"});
}

TEST(AttentionPlanMake, BiasSizeOverflowOnlyWhenABiasIsGiven) {
  AttentionParams p;
  p.Sq = kTwo32;
  p.Sk = kTwo32;
  p.H = 1;
  p.D = 1;
  // q, k, v have 2^32 elements each: fine, no mask formed.
  EXPECT_EQ(AttentionPlan::make(p).q.extent, kTwo32);
  // A bias [1, 1, Sq, Sk] would have 2^64 elements.
  p.mask = MaskKind::bias;
  expect_make_error(p, "mask", {"overflows"});
}

// ---------------------------------------------------------------------------
// from_shapes: the shape rules of SPEC §1

TEST(AttentionPlanShapes, Rank4BshdWhenDim2IsTheHeads) {
  // q [2, 6, 4, 8], H = 4: dim 2 == H, dim 1 != H -> bshd.
  const AttentionPlan plan = AttentionPlan::from_shapes({2, 6, 4, 8}, {2, 10, 2, 8}, {2, 10, 2, 16},
                                                        std::nullopt, attention_attrs(4));
  EXPECT_EQ(plan.layout, Layout::bshd);
  EXPECT_EQ(plan.B, 2);
  EXPECT_EQ(plan.Sq, 6);
  EXPECT_EQ(plan.Sk, 10);
  EXPECT_EQ(plan.Hkv, 2);  // from k's head axis
  EXPECT_EQ(plan.D, 8);
  EXPECT_EQ(plan.Dv, 16);  // from v's last dim
}

TEST(AttentionPlanShapes, Rank4BhsdWhenDim1IsTheHeads) {
  // q [2, 4, 6, 8], H = 4: dim 1 == H -> bhsd, Sq = 6; k [2, 1, 10, 8] -> Hkv = 1.
  const AttentionPlan plan = AttentionPlan::from_shapes({2, 4, 6, 8}, {2, 1, 10, 8}, {2, 1, 10, 3},
                                                        std::nullopt, attention_attrs(4));
  EXPECT_EQ(plan.layout, Layout::bhsd);
  EXPECT_EQ(plan.Sq, 6);
  EXPECT_EQ(plan.Sk, 10);
  EXPECT_EQ(plan.Hkv, 1);
  EXPECT_EQ(plan.Dv, 3);
}

TEST(AttentionPlanShapes, AmbiguousRank4LayoutAsksForOne) {
  // Both dims 1 and 2 equal H = 4 (S == H): no silent guess.
  expect_shapes_error({2, 4, 4, 8}, {2, 4, 4, 8}, {2, 4, 4, 8}, std::nullopt, attention_attrs(4),
                      "layout", {"ambiguous", "[2, 4, 4, 8]", "num_heads = 4", "bshd or bhsd"});
  // Neither equals H.
  expect_shapes_error({2, 3, 5, 8}, {2, 3, 5, 8}, {2, 3, 5, 8}, std::nullopt, attention_attrs(4),
                      "layout", {"ambiguous", "[2, 3, 5, 8]", "give layout"});
  // An explicit layout settles it.
  AttentionAttrs a = attention_attrs(4);
  a.layout = tandem::QkvLayout::bhsd;
  const AttentionPlan plan =
      AttentionPlan::from_shapes({2, 4, 4, 8}, {2, 2, 7, 8}, {2, 2, 7, 8}, std::nullopt, a);
  EXPECT_EQ(plan.layout, Layout::bhsd);
  EXPECT_EQ(plan.Sk, 7);
  EXPECT_EQ(plan.Hkv, 2);
}

TEST(AttentionPlanShapes, ExplicitLayoutMustPutTheHeadsOnTheHeadAxis) {
  AttentionAttrs a = attention_attrs(4);
  a.layout = tandem::QkvLayout::bshd;
  // bshd head axis is dim 2 = 6, not 4
  expect_shapes_error({2, 4, 6, 8}, {2, 4, 6, 8}, {2, 4, 6, 8}, std::nullopt, a, "q.shape",
                      {"[2, 4, 6, 8]", "num_heads = 4", "head axis (bshd)"});
}

TEST(AttentionPlanShapes, Rank3IsBshdWithHeadsFolded) {
  // q [2, 5, 32], H = 4 -> D = 8; k [2, 7, 16] -> Hkv = 16/8 = 2, Sk = 7;
  // v [2, 7, 24] -> Dv = 24/2 = 12.
  const AttentionPlan plan = AttentionPlan::from_shapes({2, 5, 32}, {2, 7, 16}, {2, 7, 24},
                                                        std::nullopt, attention_attrs(4));
  EXPECT_EQ(plan.layout, Layout::bshd);
  EXPECT_EQ(plan.B, 2);
  EXPECT_EQ(plan.Sq, 5);
  EXPECT_EQ(plan.Sk, 7);
  EXPECT_EQ(plan.D, 8);
  EXPECT_EQ(plan.Hkv, 2);
  EXPECT_EQ(plan.Dv, 12);
}

TEST(AttentionPlanShapes, Rank2HasOneBatch) {
  // q [5, 32], H = 2 -> B = 1, D = 16; k [9, 16] -> Hkv = 1.
  const AttentionPlan plan =
      AttentionPlan::from_shapes({5, 32}, {9, 16}, {9, 4}, std::nullopt, attention_attrs(2));
  EXPECT_EQ(plan.B, 1);
  EXPECT_EQ(plan.Sq, 5);
  EXPECT_EQ(plan.Sk, 9);
  EXPECT_EQ(plan.D, 16);
  EXPECT_EQ(plan.Hkv, 1);
  EXPECT_EQ(plan.Dv, 4);
}

TEST(AttentionPlanShapes, RankAndHeadCountRules) {
  expect_shapes_error({5, 32}, {9, 16}, {9, 16}, std::nullopt, attention_attrs(0), "num_heads",
                      {"num_heads = 0"});
  expect_shapes_error({32}, {16}, {16}, std::nullopt, attention_attrs(2), "q.shape",
                      {"q.shape = [32]", "rank 2, 3 or 4"});
  expect_shapes_error({1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}, std::nullopt,
                      attention_attrs(2), "q.shape", {"[1, 2, 3, 4, 5]", "rank 2, 3 or 4"});
  expect_shapes_error({2, 5, 32}, {7, 16}, {2, 7, 16}, std::nullopt, attention_attrs(4), "k.shape",
                      {"k.shape = [7, 16]", "rank of q.shape = [2, 5, 32]"});
  expect_shapes_error({2, 5, 32}, {2, 7, 16}, {7, 16}, std::nullopt, attention_attrs(4), "v.shape",
                      {"v.shape = [7, 16]", "rank of q.shape"});
  AttentionAttrs a = attention_attrs(4);
  a.layout = tandem::QkvLayout::bhsd;
  expect_shapes_error({2, 5, 32}, {2, 7, 16}, {2, 7, 16}, std::nullopt, a, "layout",
                      {"layout = bhsd", "must be bshd for rank-3"});
}

TEST(AttentionPlanShapes, NegativeAndOverflowingShapes) {
  expect_shapes_error({2, -5, 32}, {2, 7, 16}, {2, 7, 16}, std::nullopt, attention_attrs(4),
                      "q.shape", {"[2, -5, 32]", "negative"});
  expect_shapes_error({kTwo40, kTwo40, 32}, {2, 7, 16}, {2, 7, 16}, std::nullopt,
                      attention_attrs(4), "q.shape", {"overflows"});
  expect_shapes_error({2, 5, 32}, {2, 7, 16}, {2, 7, -16}, std::nullopt, attention_attrs(4),
                      "v.shape", {"negative"});
}

TEST(AttentionPlanShapes, Rank4CrossTensorRules) {
  // k batch differs
  expect_shapes_error({2, 6, 4, 8}, {3, 10, 2, 8}, {3, 10, 2, 8}, std::nullopt, attention_attrs(4),
                      "k.shape", {"k.shape = [3, 10, 2, 8]", "B = 2"});
  // k head width differs from q's
  expect_shapes_error({2, 6, 4, 8}, {2, 10, 2, 4}, {2, 10, 2, 8}, std::nullopt, attention_attrs(4),
                      "k.shape", {"[2, 10, 2, 4]", "D = 8"});
  // v's sequence differs from k's
  expect_shapes_error({2, 6, 4, 8}, {2, 10, 2, 8}, {2, 9, 2, 8}, std::nullopt, attention_attrs(4),
                      "v.shape", {"v.shape = [2, 9, 2, 8]", "must match k.shape = [2, 10, 2, 8]"});
  // v's heads differ from k's
  expect_shapes_error({2, 6, 4, 8}, {2, 10, 2, 8}, {2, 10, 1, 8}, std::nullopt, attention_attrs(4),
                      "v.shape", {"must match k.shape"});
  // Hkv = 3 from k does not divide H = 4
  expect_shapes_error({2, 6, 4, 8}, {2, 10, 3, 8}, {2, 10, 3, 8}, std::nullopt, attention_attrs(4),
                      "k.shape", {"k.shape = [2, 10, 3, 8]", "head count (3)", "num_heads = 4"});
  // an empty v head is not "Dv = D"
  expect_shapes_error({2, 6, 4, 8}, {2, 10, 2, 8}, {2, 10, 2, 0}, std::nullopt, attention_attrs(4),
                      "v.shape", {"v.shape = [2, 10, 2, 0]", "no empty axis"});
  // an empty axis anywhere is the input's error, before make() could say Sq, H or Sk
  expect_shapes_error({1, 0, 4, 8}, {1, 10, 2, 8}, {1, 10, 2, 8}, std::nullopt, attention_attrs(4),
                      "q.shape", {"q.shape = [1, 0, 4, 8] must have every dim >= 1"});
  expect_shapes_error({1, 6, 0, 8}, {1, 10, 2, 8}, {1, 10, 2, 8}, std::nullopt, {}, "q.shape",
                      {"q.shape = [1, 6, 0, 8]", "no empty axis"});
  expect_shapes_error({1, 6, 4, 8}, {1, 0, 2, 8}, {1, 0, 2, 8}, std::nullopt, attention_attrs(4),
                      "k.shape", {"k.shape = [1, 0, 2, 8]", "no empty axis"});
}

TEST(AttentionPlanShapes, Rank3CrossTensorRules) {
  // q's last dim 30 is not a multiple of H = 4
  expect_shapes_error({2, 5, 30}, {2, 7, 16}, {2, 7, 16}, std::nullopt, attention_attrs(4),
                      "q.shape", {"q.shape = [2, 5, 30]", "divisible by num_heads = 4"});
  // q's last dim 0: no head width
  expect_shapes_error({2, 5, 0}, {2, 7, 16}, {2, 7, 16}, std::nullopt, attention_attrs(4),
                      "q.shape", {"no empty axis"});
  // k's last dim 12 is not a multiple of D = 8
  expect_shapes_error({2, 5, 32}, {2, 7, 12}, {2, 7, 16}, std::nullopt, attention_attrs(4),
                      "k.shape", {"k.shape = [2, 7, 12]", "divisible by D = 8"});
  // k's last dim 0
  expect_shapes_error({2, 5, 32}, {2, 7, 0}, {2, 7, 16}, std::nullopt, attention_attrs(4),
                      "k.shape", {"no empty axis"});
  // k batch differs
  expect_shapes_error({2, 5, 32}, {1, 7, 16}, {1, 7, 16}, std::nullopt, attention_attrs(4),
                      "k.shape", {"B = 2"});
  // v's length differs from k's
  expect_shapes_error({2, 5, 32}, {2, 7, 16}, {2, 6, 16}, std::nullopt, attention_attrs(4),
                      "v.shape", {"must match k.shape = [2, 7, 16]"});
  // v's last dim 15 is not a multiple of Hkv = 2
  expect_shapes_error({2, 5, 32}, {2, 7, 16}, {2, 7, 15}, std::nullopt, attention_attrs(4),
                      "v.shape", {"v.shape = [2, 7, 15]", "divisible by k's head count 2"});
  // v's last dim 0
  expect_shapes_error({2, 5, 32}, {2, 7, 16}, {2, 7, 0}, std::nullopt, attention_attrs(4),
                      "v.shape", {"v.shape = [2, 7, 0]", "no empty axis"});
  // Hkv = 24/8 = 3 does not divide H = 4
  expect_shapes_error({2, 5, 32}, {2, 7, 24}, {2, 7, 24}, std::nullopt, attention_attrs(4),
                      "k.shape", {"head count (3)", "divides num_heads = 4"});
}

TEST(AttentionPlanShapes, KeyPaddingMaskShape) {
  const Shape q{2, 5, 32}, k{2, 7, 16}, v{2, 7, 16};
  const AttentionAttrs a = attention_attrs(4, MaskKind::key_padding);
  EXPECT_EQ(AttentionPlan::from_shapes(q, k, v, Shape{2, 7}, a).mask_size(), 14);
  // A keep mask is named key_padding, Python's argument (SPEC §8).
  expect_shapes_error(q, k, v, Shape{2, 6}, a, "key_padding.shape",
                      {"key_padding.shape = [2, 6]", "[B, Sk] = [2, 7]", "keep mask"});
  expect_shapes_error(q, k, v, Shape{1, 7}, a, "key_padding.shape", {"[2, 7]"});
  expect_shapes_error(q, k, v, Shape{2, 1, 7}, a, "key_padding.shape",
                      {"key_padding.shape = [2, 1, 7]"});
  expect_shapes_error(q, k, v, std::nullopt, a, "key_padding",
                      {"key_padding = (absent)", "required for mask key_padding"});
}

TEST(AttentionPlanShapes, BiasMaskBroadcastShapes) {
  const Shape q{2, 5, 32}, k{2, 7, 16}, v{2, 7, 16};
  const AttentionAttrs a = attention_attrs(4, MaskKind::bias);
  struct Ok {
    Shape mask;
    std::int64_t bias_batch, bias_heads;
  };
  for (const Ok& ok : {Ok{{1, 1, 5, 7}, 1, 1}, Ok{{2, 1, 5, 7}, 2, 1}, Ok{{1, 4, 5, 7}, 1, 4},
                       Ok{{2, 4, 5, 7}, 2, 4}, Ok{{5, 7}, 1, 1}}) {
    const AttentionPlan plan = AttentionPlan::from_shapes(q, k, v, ok.mask, a);
    EXPECT_EQ(plan.bias_batch, ok.bias_batch) << tandem::to_string(ok.mask);
    EXPECT_EQ(plan.bias_heads, ok.bias_heads) << tandem::to_string(ok.mask);
    EXPECT_EQ(plan.mask_size(), ok.bias_batch * ok.bias_heads * 5 * 7);
  }
  // A bias is named bias, and a wrong head count is said in terms of its shape.
  for (const Shape& bad : {Shape{3, 1, 5, 7}, Shape{1, 2, 5, 7}, Shape{1, 1, 4, 7},
                           Shape{1, 1, 5, 6}, Shape{5, 6}, Shape{1, 5, 7}}) {
    expect_shapes_error(q, k, v, bad, a, "bias.shape",
                        {"bias.shape = " + tandem::to_string(bad), "[Bb, Hb, Sq, Sk]",
                         "Hb in {1, 4}", "Sq = 5", "Sk = 7", "additive bias"});
  }
  expect_shapes_error(q, k, v, std::nullopt, a, "bias", {"required for mask bias"});
}

TEST(AttentionPlanShapes, MaskGivenForAKindThatTakesNone) {
  const Shape q{2, 5, 32}, k{2, 7, 16}, v{2, 7, 16};
  for (MaskKind kind : {MaskKind::none, MaskKind::causal, MaskKind::sliding_window}) {
    expect_shapes_error(
        q, k, v, Shape{2, 7}, attention_attrs(4, kind), "mask",
        {"mask = [2, 7]", std::string("must be absent for mask ") + tandem::to_string(kind)});
  }
}

TEST(AttentionPlanShapes, WindowOnlyForSlidingWindow) {
  const Shape q{2, 5, 32}, k{2, 7, 16}, v{2, 7, 16};
  AttentionAttrs a = attention_attrs(4, MaskKind::causal);
  a.window = 3;
  expect_shapes_error(q, k, v, std::nullopt, a, "window", {"window = 3", "mask is causal"});
  a.mask = MaskKind::sliding_window;
  EXPECT_EQ(AttentionPlan::from_shapes(q, k, v, std::nullopt, a).window, 3);
}

TEST(AttentionPlanShapes, ScaleAndSoftcapPassThrough) {
  AttentionAttrs a = attention_attrs(4);
  a.scale = 0.0;
  expect_shapes_error({2, 5, 32}, {2, 7, 16}, {2, 7, 16}, std::nullopt, a, "scale", {"scale = 0"});
  a.scale = 0.5;
  a.softcap = 30.0;
  const AttentionPlan plan =
      AttentionPlan::from_shapes({2, 5, 32}, {2, 7, 16}, {2, 7, 16}, std::nullopt, a);
  EXPECT_DOUBLE_EQ(plan.scale, 0.5);
  EXPECT_DOUBLE_EQ(plan.softcap, 30.0);
}

// ---------------------------------------------------------------------------
// The backend entry points check their views before writing anything.

struct Buffers {
  AttentionPlan plan;
  std::vector<float> q, k, v, mask, dout, out, dq, dk, dv;
  explicit Buffers(const AttentionParams& p)
      : plan(AttentionPlan::make(p)),
        q(plan.q.extent, 0.5f),
        k(plan.k.extent, 0.25f),
        v(plan.v.extent, 1.0f),
        mask(plan.mask_size(), 1.0f),
        dout(plan.o.extent, 1.0f),
        out(plan.o.extent, sentinel()),
        dq(plan.dq.extent, sentinel()),
        dk(plan.dk.extent, sentinel()),
        dv(plan.dv.extent, sentinel()) {}
  AttentionInputs<float> inputs() const { return {q, k, v, mask}; }
};

AttentionParams padded() {
  AttentionParams p = valid();
  p.mask = MaskKind::key_padding;
  p.Dv = 4;
  p.q_row_stride = 40;
  return p;
}

TEST(AttentionEntryChecks, ForwardRejectsBadViewsAndLeavesOutAlone) {
  const tandem::Backend ref = tandem::reference::backend();
  Buffers buf(padded());
  const AttentionInputs<float> good = buf.inputs();
  const std::span<const float> q_short(buf.q.data(), buf.q.size() - 1);
  const std::span<const float> k_short(buf.k.data(), buf.k.size() - 1);
  const std::span<const float> v_short(buf.v.data(), buf.v.size() - 1);
  const std::span<const float> mask_short(buf.mask.data(), buf.mask.size() - 1);
  const std::string q_need = ">= " + std::to_string(buf.plan.q.extent);
  const std::string mask_need = "must be " + std::to_string(buf.plan.mask_size());

  AttentionInputs<float> in = good;
  in.q = q_short;
  expect_error([&] { ref.attention_forward(buf.plan, in, buf.out); }, "q.size()",
               {"q.size() = " + std::to_string(buf.q.size() - 1), q_need});
  in = good;
  in.k = k_short;
  expect_error([&] { ref.attention_forward(buf.plan, in, buf.out); }, "k.size()", {"k.size()"});
  in = good;
  in.v = v_short;
  expect_error([&] { ref.attention_forward(buf.plan, in, buf.out); }, "v.size()", {"v.size()"});
  in = good;
  in.mask = mask_short;
  expect_error([&] { ref.attention_forward(buf.plan, in, buf.out); }, "mask.size()",
               {"mask.size() = " + std::to_string(buf.mask.size() - 1), mask_need});
  in = good;
  in.mask = {};
  expect_error([&] { ref.attention_forward(buf.plan, in, buf.out); }, "mask.size()",
               {"mask.size() = 0"});
  EXPECT_TRUE(untouched(buf.out));

  // out one too long
  std::vector<float> out_long(buf.out.size() + 1, sentinel());
  expect_error([&] { ref.attention_forward(buf.plan, good, out_long); }, "out.size()",
               {"out.size() = " + std::to_string(out_long.size()),
                "must be " + std::to_string(buf.plan.o.extent)});
  EXPECT_TRUE(untouched(out_long));

  // A mask passed to a kind that takes none is an error too.
  AttentionParams p = valid();
  Buffers none(p);
  std::vector<float> stray(3, 1.0f);
  in = none.inputs();
  in.mask = stray;
  expect_error([&] { ref.attention_forward(none.plan, in, none.out); }, "mask.size()",
               {"mask.size() = 3", "must be 0"});
  EXPECT_TRUE(untouched(none.out));

  // And the good call does write.
  ref.attention_forward(buf.plan, good, buf.out);
  EXPECT_FALSE(untouched(buf.out));
}

TEST(AttentionEntryChecks, BackwardRejectsBadViewsAndLeavesEveryGradientAlone) {
  const tandem::Backend ref = tandem::reference::backend();
  Buffers buf(padded());
  const AttentionInputs<float> in = buf.inputs();
  const std::span<float> dq(buf.dq), dk(buf.dk), dv(buf.dv);
  const std::span<const float> dout(buf.dout);
  const auto all_untouched = [&] {
    return untouched(buf.dq) && untouched(buf.dk) && untouched(buf.dv);
  };

  // dout one short
  expect_error(
      [&] {
        ref.attention_backward(buf.plan, in, dout.first(dout.size() - 1), {dq, dk, dv});
      },
      "dout.size()", {"dout.size() = " + std::to_string(dout.size() - 1)});
  // each gradient in turn one short; none at all; dsinks for a plan without sinks
  expect_error(
      [&] {
        ref.attention_backward(buf.plan, in, dout, {dq.first(1), dk, dv});
      },
      "dq.size()", {"dq.size() = 1", "must be " + std::to_string(dq.size())});
  expect_error(
      [&] {
        ref.attention_backward(buf.plan, in, dout, {dq, dk.first(2), dv});
      },
      "dk.size()", {"dk.size() = 2"});
  expect_error(
      [&] {
        ref.attention_backward(buf.plan, in, dout, {{}, {}, dv.first(1)});
      },
      "dv.size()", {"dv.size() = 1", "must be " + std::to_string(dv.size())});
  expect_error([&] { ref.attention_backward(buf.plan, in, dout, {}); }, "grads",
               {"at least one of dq, dk, dv, dsinks"});
  std::vector<float> dsinks(4, sentinel());
  expect_error(
      [&] {
        ref.attention_backward(buf.plan, in, dout, {dq, dk, dv, dsinks});
      },
      "dsinks.size()", {"dsinks.size() = 4", "must be 0"});
  // a bad input view, with good gradients
  AttentionInputs<float> bad = in;
  bad.v = bad.v.first(bad.v.size() - 1);
  expect_error(
      [&] {
        ref.attention_backward(buf.plan, bad, dout, {dq, dk, dv});
      },
      "v.size()", {"v.size()"});
  EXPECT_TRUE(all_untouched());

  // the single-gradient entries
  expect_error([&] { ref.attention_backward_dq(buf.plan, in, dout.first(dout.size() - 1), dq); },
               "dout.size()", {"dout.size()"});
  expect_error([&] { ref.attention_backward_dq(buf.plan, in, dout, dq.first(dq.size() - 1)); },
               "dq.size()", {"dq.size()"});
  expect_error([&] { ref.attention_backward_dk(buf.plan, bad, dout, dk); }, "v.size()",
               {"v.size()"});
  expect_error(
      [&] { ref.attention_backward_dk(buf.plan, in, dout, dv); }, "dk.size()",
      {"dk.size() = " + std::to_string(dv.size()), "must be " + std::to_string(dk.size())});
  expect_error(
      [&] { ref.attention_backward_dv(buf.plan, in, dout, dk); }, "dv.size()",
      {"dv.size() = " + std::to_string(dk.size()), "must be " + std::to_string(dv.size())});
  AttentionInputs<float> no_mask = in;
  no_mask.mask = {};
  expect_error([&] { ref.attention_backward_dv(buf.plan, no_mask, dout, dv); }, "mask.size()",
               {"mask.size() = 0"});
  EXPECT_TRUE(all_untouched());

  // Any non-empty subset is computed, and only it.
  ref.attention_backward(buf.plan, in, dout, {dq, {}, dv});
  EXPECT_FALSE(untouched(buf.dq));
  EXPECT_TRUE(untouched(buf.dk));
  EXPECT_FALSE(untouched(buf.dv));
  ref.attention_backward(buf.plan, in, dout, {{}, dk, {}});
  EXPECT_FALSE(untouched(buf.dk));
}

}  // namespace

// ---------------------------------------------------------------------------
// from_shapes: the caller's names of the inputs (SPEC §8)

void expect_named_error(const AttentionShapes& s, const AttentionAttrs& a,
                        const tandem::AttentionNames& names, const std::string& parameter,
                        std::initializer_list<std::string> fragments) {
  expect_error([&] { AttentionPlan::from_shapes(s, a, names); }, parameter, fragments);
}

TEST(AttentionPlanNames, ErrorsNameTheCallersInputs) {
  tandem::AttentionNames torch;  // F.scaled_dot_product_attention's arguments
  torch.q = "query";
  torch.k = "key";
  torch.v = "value";
  torch.mask = "attn_mask";
  AttentionAttrs a = attention_attrs(4);
  expect_named_error({{2, 6, 4, 8}, {2, 10, 2, 4}, {2, 10, 2, 8}}, a, torch, "key.shape",
                     {"key.shape = [2, 10, 2, 4]", "D = 8 (query's last dim)"});
  expect_named_error({{2, 6, 4, 8}, {2, 10, 2, 8}, {2, 9, 2, 8}}, a, torch, "value.shape",
                     {"value.shape = [2, 9, 2, 8]", "must match key.shape"});
  expect_named_error({{2, 6, 4}, {2, 10, 2, 8}, {2, 10, 2, 8}}, a, torch, "key.shape",
                     {"must have the rank of query.shape = [2, 6, 4]"});
  a.mask = MaskKind::bias;
  expect_named_error({{2, 6, 4, 8}, {2, 10, 2, 8}, {2, 10, 2, 8}, Shape{1, 3, 6, 10}}, a, torch,
                     "attn_mask.shape", {"attn_mask.shape = [1, 3, 6, 10]", "Hb in {1, 4}"});
  a.mask = MaskKind::key_padding;
  expect_named_error({{2, 6, 4, 8}, {2, 10, 2, 8}, {2, 10, 2, 8}}, a, torch, "attn_mask",
                     {"attn_mask = (absent)"});
}

TEST(AttentionPlanNames, FeatureInputsByTheirNames) {
  tandem::AttentionNames n;
  n.k = "k_cache";
  n.v = "v_cache";
  n.block_table = "table";
  AttentionShapes s{{2, 1, 4, 8}, {6, 16, 2, 8}, {6, 16, 2, 8}};
  s.block_table = Shape{3, 4};
  s.cache_seqlens = Shape{2};
  expect_named_error(s, attention_attrs(4), n, "table.shape", {"table.shape = [3, 4]", "B = 2"});
  s.block_table = Shape{2, 4};
  s.v = {6, 16, 1, 8};
  expect_named_error(s, attention_attrs(4), n, "v_cache.shape", {"must match k_cache.shape"});
}

TEST(AttentionPlanNames, HeadCountFromTheHeadAxis) {
  AttentionAttrs a;  // num_heads 0: from q's head axis, where it has one
  a.layout = tandem::QkvLayout::bhsd;
  const AttentionPlan plan =
      AttentionPlan::from_shapes({{2, 4, 6, 8}, {2, 2, 6, 8}, {2, 2, 6, 8}}, a);
  EXPECT_EQ(plan.H, 4);
  EXPECT_EQ(plan.Hkv, 2);
  a.layout.reset();
  expect_named_error({{2, 4, 6, 8}, {2, 2, 6, 8}, {2, 2, 6, 8}}, a, {}, "num_heads",
                     {"num_heads = 0", "without a layout"});
  expect_named_error({{2, 6, 32}, {2, 6, 16}, {2, 6, 16}}, a, {}, "num_heads",
                     {"num_heads = 0", "q.shape = [2, 6, 32]", "no head axis"});
  // H is looked for first: q without a head axis needs num_heads whatever k and v are
  expect_named_error({{2, 6, 32}, {2, 6, 2, 8}, {2, 6, 2, 8}}, a, {}, "num_heads",
                     {"num_heads = 0", "no head axis"});
  a.layout = tandem::QkvLayout::thd;  // [total, H, D] has a head axis even without cu_seqlens
  expect_named_error({{9, 4, 8}, {12, 2, 8}, {12, 2, 8}}, a, {}, "layout",
                     {"layout = thd", "without packed sequences"});
}

TEST(AttentionPlanNames, ThdIsThePackedLayout) {
  AttentionAttrs a;
  a.layout = tandem::QkvLayout::thd;
  AttentionShapes s{{9, 4, 8}, {12, 2, 8}, {12, 2, 8}};
  s.cu_seqlens_q = Shape{3};
  s.cu_seqlens_k = Shape{3};
  const AttentionPlan plan = AttentionPlan::from_shapes(s, a);  // H from [total, H, D]
  EXPECT_EQ(plan.num_seqs, 2);
  EXPECT_EQ(plan.H, 4);
  EXPECT_EQ(plan.Sq, 9);
  EXPECT_EQ(plan.layout, Layout::bshd);
  // thd without cu_seqlens is not a layout of q, k, v
  a.num_heads = 4;
  expect_named_error({{9, 4, 8}, {12, 2, 8}, {12, 2, 8}}, a, {}, "layout",
                     {"layout = thd", "without packed sequences (cu_seqlens_q)"});
  expect_named_error({{1, 9, 4, 8}, {1, 12, 2, 8}, {1, 12, 2, 8}}, a, {}, "layout",
                     {"layout = thd", "needs packed sequences"});
}
