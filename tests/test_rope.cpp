// SPDX-License-Identifier: Apache-2.0
// RoPE (SPEC §4) on cases small enough to work out by hand: rotations by 90°
// and 0°, the partial-rotation tail, table padding, position and token rows,
// position ids, strided sources, the bshd, bhsd and thd layouts, q and k in
// one call, and the backward as the transpose.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/reference/rope.hpp"
#include "tandem/rope.hpp"

namespace {

using tandem::RopeParams;
using tandem::RopePlan;
using tandem::RopeStyle;
using tandem::RopeTables;
using tandem::TableRows;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// A one-token, one-head plan of width D with a one-row table of m = n_rot/2 columns.
RopePlan one_head(std::int64_t D, std::int64_t n_rot, RopeStyle style, std::int64_t T = 0) {
  RopeParams p;
  p.seq = 1;
  p.width = D;
  p.head_dim = D;
  p.n_rot = n_rot;
  p.style = style;
  p.table_rows = 1;
  p.table_stride = T;
  return RopePlan::make(p);
}

std::vector<double> forward(const RopePlan& plan, const std::vector<double>& x,
                            const std::vector<double>& cos, const std::vector<double>& sin) {
  std::vector<double> out(static_cast<std::size_t>(plan.out_size()));
  tandem::reference::rope_forward<double>(plan, x, RopeTables<double>{cos, sin},
                                          std::span<double>(out));
  return out;
}

std::vector<double> backward(const RopePlan& plan, const std::vector<double>& dy,
                             const std::vector<double>& cos, const std::vector<double>& sin) {
  std::vector<double> dx(static_cast<std::size_t>(plan.out_size()));
  tandem::reference::rope_backward<double>(plan, dy, RopeTables<double>{cos, sin},
                                           std::span<double>(dx));
  return dx;
}

void expect_exact(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "element " << i;
}

TEST(Rope, NeoxRotatesPairIAndIPlusMByItsOwnAngle) {
  // D = 4, m = 2: pairs (0, 2) and (1, 3). Angle 0 is 90° (c = 0, s = 1),
  // angle 1 is 0° (c = 1, s = 0). x = [1, 2, 3, 4]:
  //   pair (0, 2): y0 = 1·0 − 3·1 = −3,  y2 = 3·0 + 1·1 = 1
  //   pair (1, 3): y1 = 2·1 − 4·0 =  2,  y3 = 4·1 + 2·0 = 4
  const RopePlan plan = one_head(4, 4, RopeStyle::neox);
  expect_exact(forward(plan, {1, 2, 3, 4}, {0, 1}, {1, 0}), {-3, 2, 1, 4});
  // Both angles 90°: [−3, −4, 1, 2].
  expect_exact(forward(plan, {1, 2, 3, 4}, {0, 0}, {1, 1}), {-3, -4, 1, 2});
}

TEST(Rope, GptjRotatesPair2IAnd2IPlus1ByItsOwnAngle) {
  // D = 4: pairs (0, 1) and (2, 3). Angle 0 is 90°, angle 1 is 0°:
  //   pair (0, 1): y0 = 1·0 − 2·1 = −2,  y1 = 2·0 + 1·1 = 1
  //   pair (2, 3): y2 = 3,               y3 = 4
  const RopePlan plan = one_head(4, 4, RopeStyle::gptj);
  expect_exact(forward(plan, {1, 2, 3, 4}, {0, 1}, {1, 0}), {-2, 1, 3, 4});
  // Both angles 90°: [−2, 1, −4, 3].
  expect_exact(forward(plan, {1, 2, 3, 4}, {0, 0}, {1, 1}), {-2, 1, -4, 3});
}

TEST(Rope, GeneralAngleFollowsTheFormula) {
  // c = 0.6, s = 0.8 (a 3-4-5 triangle). NeoX, D = 2, pair (0, 1), x = [1, 3]:
  //   y0 = 1·0.6 − 3·0.8 = −1.8,  y1 = 3·0.6 + 1·0.8 = 2.6
  const RopePlan plan = one_head(2, 2, RopeStyle::neox);
  const std::vector<double> y = forward(plan, {1, 3}, {0.6}, {0.8});
  EXPECT_NEAR(y[0], -1.8, 1e-15);
  EXPECT_NEAR(y[1], 2.6, 1e-15);
  // The float32 backend gives the same numbers to float precision.
  const std::vector<float> xf = {1, 3}, cf = {0.6f}, sf = {0.8f};
  std::vector<float> yf(2);
  tandem::reference::backend().rope_forward(plan, xf, RopeTables<float>{cf, sf}, yf);
  EXPECT_NEAR(yf[0], -1.8f, 1e-6f);
  EXPECT_NEAR(yf[1], 2.6f, 1e-6f);
}

TEST(Rope, PartialRotationLeavesTheTailOfEveryHeadUntouched) {
  // D = 6, n_rot = 4 (m = 2), two heads per row (W = 12), both angles 90°.
  // Head 0, x = [1..6]:  neox pairs (0,2), (1,3) → [−3, −4, 1, 2, 5, 6]
  // Head 1, x = [7..12]: neox                     → [−9, −10, 7, 8, 11, 12]
  // gptj pairs (0,1), (2,3): head 0 → [−2, 1, −4, 3, 5, 6], head 1 → [−8, 7, −10, 9, 11, 12]
  RopeParams p;
  p.seq = 1;
  p.width = 12;
  p.head_dim = 6;
  p.n_rot = 4;
  p.table_rows = 1;
  const std::vector<double> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  p.style = RopeStyle::neox;
  expect_exact(forward(RopePlan::make(p), x, {0, 0}, {1, 1}),
               {-3, -4, 1, 2, 5, 6, -9, -10, 7, 8, 11, 12});
  p.style = RopeStyle::gptj;
  expect_exact(forward(RopePlan::make(p), x, {0, 0}, {1, 1}),
               {-2, 1, -4, 3, 5, 6, -8, 7, -10, 9, 11, 12});
}

TEST(Rope, TablePaddingColumnsAreNeverRead) {
  // D = 6, n_rot = 2 (m = 1), a table built for D/2 = 3 columns (T = 3) whose
  // columns 1 and 2 are NaN. Only column 0 (90°) may be read:
  //   neox pair (0, 1): y0 = −x1 = −2, y1 = x0 = 1; dims 2..5 copied.
  for (RopeStyle style : {RopeStyle::neox, RopeStyle::gptj}) {
    const RopePlan plan = one_head(6, 2, style, /*T=*/3);
    ASSERT_EQ(plan.T, 3);
    const std::vector<double> cos = {0, kNaN, kNaN}, sin = {1, kNaN, kNaN};
    // With m = 1 both styles pair (0, 1).
    expect_exact(forward(plan, {1, 2, 3, 4, 5, 6}, cos, sin), {-2, 1, 3, 4, 5, 6});
    // Backward (rotation by −90°): dx0 = dy1 = 2, dx1 = −dy0 = −1.
    expect_exact(backward(plan, {1, 2, 3, 4, 5, 6}, cos, sin), {2, -1, 3, 4, 5, 6});
  }
}

TEST(Rope, PositionRowsReadRowSOfALongerTable) {
  // B' = 2, S = 2, D = W = 2, a table of R = 5 rows (built for a longer
  // sequence; 5 != B'·S so rows are by position). Row 0: 0°, row 1: 90°,
  // rows 2..4 NaN (never read). x = [[1,2],[3,4]], [[5,6],[7,8]]:
  //   s = 0 unchanged; s = 1: [x0, x1] → [−x1, x0]
  //   → [1, 2], [−4, 3], [5, 6], [−8, 7]
  RopeParams p;
  p.batch = 2;
  p.seq = 2;
  p.width = 2;
  p.head_dim = 2;
  p.table_rows = 5;
  p.rows = TableRows::position;
  const RopePlan plan = RopePlan::make(p);
  const std::vector<double> cos = {1, 0, kNaN, kNaN, kNaN}, sin = {0, 1, kNaN, kNaN, kNaN};
  expect_exact(forward(plan, {1, 2, 3, 4, 5, 6, 7, 8}, cos, sin), {1, 2, -4, 3, 5, 6, -8, 7});
}

TEST(Rope, TokenRowsReadRowBTimesSPlusS) {
  // x [2, 2, 2] with a [4, 1] table: R = B'·S = 4 and B' = 2 > 1 → token rows.
  // Row r rotates by r·90°: (c, s) = (1, 0), (0, 1), (−1, 0), (0, −1).
  //   (b0, s0) row 0: [1, 2] → [1, 2]
  //   (b0, s1) row 1: [3, 4] → [−4, 3]
  //   (b1, s0) row 2: [5, 6] → [−5, −6]
  //   (b1, s1) row 3: [7, 8] → [7·0 − 8·(−1), 8·0 + 7·(−1)] = [8, −7]
  // Position rows would have given (b1, s0) → [5, 6] and (b1, s1) → [−8, 7].
  tandem::RopeAttrs a;
  a.head_dim = 2;
  const RopePlan plan = RopePlan::from_shapes({2, 2, 2}, {4, 1}, {4, 1}, a);
  ASSERT_EQ(plan.rows, TableRows::token);
  const std::vector<double> cos = {1, 0, -1, 0}, sin = {0, 1, 0, -1};
  expect_exact(forward(plan, {1, 2, 3, 4, 5, 6, 7, 8}, cos, sin), {1, 2, -4, 3, -5, -6, 8, -7});
}

TEST(Rope, SourceRowStrideSkipsTheGapsBetweenRows) {
  // S = 2, W = D = 4, source row stride 6: x = [1, 2, 3, 4, NaN, NaN, 5, 6, 7, 8]
  // (10 = (2−1)·6 + 4 elements). Row 0 of the table 90°, row 1 0°, neox:
  //   s = 0: [1, 2, 3, 4] → [−3, −4, 1, 2];  s = 1: [5, 6, 7, 8] unchanged.
  // The backward reads dy with the same stride: s = 0 rotates by −90°:
  //   [1, 2, 3, 4] → [dy0·0 + dy2·1, dy1·0 + dy3·1, dy2·0 − dy0·1, dy3·0 − dy1·1] = [3, 4, −1, −2]
  RopeParams p;
  p.seq = 2;
  p.width = 4;
  p.head_dim = 4;
  p.table_rows = 2;
  p.src_row_stride = 6;
  const RopePlan plan = RopePlan::make(p);
  ASSERT_EQ(plan.src_extent(), 10);
  const std::vector<double> x = {1, 2, 3, 4, kNaN, kNaN, 5, 6, 7, 8};
  const std::vector<double> cos = {0, 0, 1, 1}, sin = {1, 1, 0, 0};
  expect_exact(forward(plan, x, cos, sin), {-3, -4, 1, 2, 5, 6, 7, 8});
  expect_exact(backward(plan, x, cos, sin), {3, 4, -1, -2, 5, 6, 7, 8});
}

TEST(Rope, BhsdInputRotatesEveryHeadOfATokenByItsRow) {
  // x [B=1, H=2, S=3, D=2] in layout bhsd: head h of token s at (h·3 + s)·2.
  // The [3, 1] table (R = 3 != B·S → position rows) rotates row s by s·90°:
  // (1, 0), (0, 1), (−1, 0). x = 1..12:
  //   head 0: [1,2] → [1,2];   [3,4] → [−4,3];   [5,6] → [−5,−6]
  //   head 1: [7,8] → [7,8];   [9,10] → [−10,9]; [11,12] → [−11,−12]
  tandem::RopeAttrs a;
  a.layout = tandem::RopeLayout::bhsd;
  const RopePlan plan = RopePlan::from_shapes({1, 2, 3, 2}, {3, 1}, {3, 1}, a);
  ASSERT_EQ(plan.B, 1);
  ASSERT_EQ(plan.S, 3);
  ASSERT_EQ(plan.W, 4);
  ASSERT_EQ(plan.D, 2);
  ASSERT_EQ(plan.rows, TableRows::position);
  const std::vector<double> cos = {1, 0, -1}, sin = {0, 1, 0};
  std::vector<double> x(12);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i + 1);
  const std::vector<double> y = forward(plan, x, cos, sin);
  expect_exact(y, {1, 2, -4, 3, -5, -6, 7, 8, -10, 9, -11, -12});
  // The same as RoPE on each head alone ([1, 3, 2], one batch).
  a = {};
  a.head_dim = 2;
  const RopePlan per_head = RopePlan::from_shapes({1, 3, 2}, {3, 1}, {3, 1}, a);
  for (std::size_t h = 0; h < 2; ++h) {
    const std::vector<double> x_h(x.begin() + 6 * h, x.begin() + 6 * (h + 1));
    const std::vector<double> y_h(y.begin() + 6 * h, y.begin() + 6 * (h + 1));
    expect_exact(forward(per_head, x_h, cos, sin), y_h);
  }
}

TEST(Rope, BshdRank4HeadsOfOneTokenShareItsRow) {
  // x [B=1, S=3, H=2, D=2] in layout bshd (FlashAttention's and vLLM's):
  // token s holds both heads, [x(s,0), x(s,1)], at s·4. Same table: s·90°.
  //   s = 0: [1,2 | 3,4] unchanged
  //   s = 1: [5,6 | 7,8] → [−6,5 | −8,7]
  //   s = 2: [9,10 | 11,12] → [−9,−10 | −11,−12]
  // (Folded as [B, H, S, D], the same numbers would be rotated by the head
  // index and the wrong token's angle.)
  tandem::RopeAttrs a;
  a.num_heads = 2;  // dims 1 and 2 are 3 and 2: num_heads picks bshd
  const RopePlan plan = RopePlan::from_shapes({1, 3, 2, 2}, {3, 1}, {3, 1}, a);
  ASSERT_EQ(plan.layout, tandem::RopeLayout::bshd);
  ASSERT_EQ(plan.S, 3);
  ASSERT_EQ(plan.heads(), 2);
  std::vector<double> x(12);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i + 1);
  expect_exact(forward(plan, x, {1, 0, -1}, {0, 1, 0}),
               {1, 2, 3, 4, -6, 5, -8, 7, -9, -10, -11, -12});
}

TEST(Rope, PositionIdsPickTheTableRowOfEachToken) {
  // Two tokens, one head of D = 2, a 3-row table: row 0 at 0°, row 1 at 90°,
  // row 2 at 180°. positions = [2, 0]: token 0 reads row 2, token 1 row 0.
  //   token 0: [1, 2] → [1·(−1) − 2·0, 2·(−1) + 1·0] = [−1, −2]
  //   token 1: [3, 4] → [3, 4]
  // Row 1 is never read (NaN there changes nothing).
  const std::vector<double> cos = {1, kNaN, -1}, sin = {0, kNaN, 0};
  const std::vector<std::int64_t> pos64 = {2, 0};
  const std::vector<std::int32_t> pos32 = {2, 0};
  tandem::RopeAttrs a;
  a.head_dim = 2;
  const RopePlan plan = RopePlan::from_shapes({2, 2}, {3, 1}, {3, 1}, tandem::Shape{2}, a);
  ASSERT_EQ(plan.rows, TableRows::position_ids);
  for (const tandem::Indices& positions : {tandem::Indices(std::span<const std::int64_t>(pos64)),
                                           tandem::Indices(std::span<const std::int32_t>(pos32))}) {
    std::vector<double> y(4), dx(4);
    tandem::reference::rope_forward<double>(plan, std::vector<double>{1, 2, 3, 4},
                                            RopeTables<double>{cos, sin, positions},
                                            std::span<double>(y));
    expect_exact(y, {-1, -2, 3, 4});
    // The backward reads the same rows (a 180° rotation is its own transpose).
    tandem::reference::rope_backward<double>(plan, std::vector<double>{1, 2, 3, 4},
                                             RopeTables<double>{cos, sin, positions},
                                             std::span<double>(dx));
    expect_exact(dx, {-1, -2, 3, 4});
  }
}

TEST(Rope, PositionIdsOfABatchAreIndexedByBatchAndToken) {
  // x [B=2, S=2, H*D=2] with positions [[1, 0], [0, 1]] on a 2-row table
  // (row 0: 0°, row 1: 90°). Token (b, s) reads positions[b·2 + s]:
  //   (0,0) row 1: [1,2] → [−2,1];   (0,1) row 0: [3,4] → [3,4]
  //   (1,0) row 0: [5,6] → [5,6];    (1,1) row 1: [7,8] → [−8,7]
  tandem::RopeAttrs a;
  a.head_dim = 2;
  const RopePlan plan = RopePlan::from_shapes({2, 2, 2}, {2, 1}, {2, 1}, tandem::Shape{2, 2}, a);
  const std::vector<std::int32_t> pos = {1, 0, 0, 1};
  std::vector<double> y(8);
  tandem::reference::rope_forward<double>(
      plan, std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8},
      RopeTables<double>{std::vector<double>{1, 0}, std::vector<double>{0, 1},
                         tandem::Indices(std::span<const std::int32_t>(pos))},
      std::span<double>(y));
  expect_exact(y, {-2, 1, 3, 4, 5, 6, -8, 7});
}

TEST(Rope, PackedTokensReadTheirOwnPositions) {
  // thd: two sequences of lengths 2 and 1 packed as T = 3 tokens [T, H=1, D=2];
  // positions restart per sequence: [0, 1, 0]. Row 0: 0°, row 1: 90°.
  //   t0 [1,2] → [1,2];  t1 [3,4] → [−4,3];  t2 [5,6] → [5,6]
  tandem::RopeAttrs a;
  a.layout = tandem::RopeLayout::thd;
  const RopePlan plan = RopePlan::from_shapes({3, 1, 2}, {2, 1}, {2, 1}, tandem::Shape{3}, a);
  ASSERT_EQ(plan.B, 1);
  ASSERT_EQ(plan.S, 3);
  const std::vector<std::int64_t> pos = {0, 1, 0};
  std::vector<double> y(6);
  tandem::reference::rope_forward<double>(
      plan, std::vector<double>{1, 2, 3, 4, 5, 6},
      RopeTables<double>{std::vector<double>{1, 0}, std::vector<double>{0, 1},
                         tandem::Indices(std::span<const std::int64_t>(pos))},
      std::span<double>(y));
  expect_exact(y, {1, 2, -4, 3, 5, 6});
}

TEST(Rope, QkRotatesQAndKHeadsByTheSameRows) {
  // GQA: q [S=2, H=2, D=2], k [S=2, Hkv=1, D=2] (bshd, rank 4 with B = 1),
  // positions [1, 0] on a 2-row table (row 0: 0°, row 1: 90°):
  //   token 0 (row 1): q [1,2 | 3,4] → [−2,1 | −4,3],  k [5,6] → [−6,5]
  //   token 1 (row 0): q [7,8 | 9,10] unchanged,       k [11,12] unchanged
  tandem::RopeAttrs a;
  a.layout = tandem::RopeLayout::bshd;
  const tandem::RopeQkPlan plan = tandem::RopeQkPlan::from_shapes(
      {1, 2, 2, 2}, {1, 2, 1, 2}, {2, 1}, {2, 1}, tandem::Shape{1, 2}, a);
  ASSERT_EQ(plan.q.heads(), 2);
  ASSERT_EQ(plan.k.heads(), 1);
  const std::vector<std::int64_t> pos = {1, 0};
  const std::vector<double> cos = {1, 0}, sin = {0, 1};
  const RopeTables<double> tables{cos, sin, tandem::Indices(std::span<const std::int64_t>(pos))};
  const std::vector<double> q = {1, 2, 3, 4, 7, 8, 9, 10}, k = {5, 6, 11, 12};
  std::vector<double> q_out(8), k_out(4), dq(8), dk(4);
  tandem::reference::rope_forward_qk<double>(plan, q, k, tables, std::span<double>(q_out),
                                             std::span<double>(k_out));
  expect_exact(q_out, {-2, 1, -4, 3, 7, 8, 9, 10});
  expect_exact(k_out, {-6, 5, 11, 12});
  // The backward rotates back by −90°.
  tandem::reference::rope_backward_qk<double>(plan, q_out, k_out, tables, std::span<double>(dq),
                                              std::span<double>(dk));
  expect_exact(dq, q);
  expect_exact(dk, k);
}

TEST(Rope, BackwardUndoesForwardWithTrueCosSin) {
  // With c_i = cos(a), s_i = sin(a) each pair's rotation is orthogonal, so the
  // transpose is the inverse: rope_backward(rope_forward(x)) == x.
  for (RopeStyle style : {RopeStyle::neox, RopeStyle::gptj}) {
    RopeParams p;
    p.batch = 2;
    p.seq = 3;
    p.width = 12;
    p.head_dim = 6;
    p.n_rot = 4;
    p.style = style;
    p.table_rows = 3;
    const RopePlan plan = RopePlan::make(p);
    std::vector<double> cos(6), sin(6);
    const std::vector<double> angle = tandem::test::random_values<double>(6, 7);
    for (std::size_t i = 0; i < 6; ++i) {
      cos[i] = std::cos(3.0 * angle[i]);
      sin[i] = std::sin(3.0 * angle[i]);
    }
    const std::vector<double> x = tandem::test::random_values<double>(72, 11);
    const std::vector<double> back = backward(plan, forward(plan, x, cos, sin), cos, sin);
    for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-14) << i;
  }
}

TEST(Rope, BackwardIsTheTransposeOfForward) {
  // <rope(x), y> == <x, rope_backward(y)> for any tables (not only true
  // rotations), with a strided source, a partial rotation and a padded table.
  for (RopeStyle style : {RopeStyle::neox, RopeStyle::gptj}) {
    RopeParams p;
    p.batch = 2;
    p.seq = 3;
    p.width = 12;
    p.head_dim = 6;
    p.n_rot = 4;
    p.style = style;
    p.table_rows = 4;
    p.table_stride = 3;
    p.src_row_stride = 15;
    const RopePlan plan = RopePlan::make(p);
    const std::vector<double> cos = tandem::test::random_values<double>(12, 1),
                              sin = tandem::test::random_values<double>(12, 2);
    const auto n_src = static_cast<std::size_t>(plan.src_extent());
    const std::vector<double> x = tandem::test::random_values<double>(n_src, 3),
                              y = tandem::test::random_values<double>(n_src, 4);
    const std::vector<double> fx = forward(plan, x, cos, sin);
    const std::vector<double> by = backward(plan, y, cos, sin);
    // Sum over rows r and columns w < W: source element at r·stride + w,
    // output element at r·W + w.
    double lhs = 0.0, rhs = 0.0;
    for (std::int64_t r = 0; r < plan.B * plan.S; ++r) {
      for (std::int64_t w = 0; w < plan.W; ++w) {
        lhs += fx[r * plan.W + w] * y[r * plan.src_row_stride + w];
        rhs += x[r * plan.src_row_stride + w] * by[r * plan.W + w];
      }
    }
    EXPECT_NEAR(lhs, rhs, 1e-13);
    EXPECT_GT(std::abs(lhs), 1e-3);  // a non-trivial inner product
  }
}

TEST(Rope, NRotZeroCopiesTheSource) {
  // n_rot = 0: no pair is rotated and the table has no columns (T = 0), so
  // out = x and dx = dy, also from a strided source.
  RopeParams p;
  p.seq = 2;
  p.width = 3;
  p.head_dim = 3;
  p.n_rot = 0;
  p.table_rows = 2;
  p.src_row_stride = 4;
  const RopePlan plan = RopePlan::make(p);
  ASSERT_EQ(plan.T, 0);
  const std::vector<double> x = {1, 2, 3, kNaN, 4, 5, 6};
  expect_exact(forward(plan, x, {}, {}), {1, 2, 3, 4, 5, 6});
  expect_exact(backward(plan, x, {}, {}), {1, 2, 3, 4, 5, 6});
}

TEST(Rope, ComplexStepOfTheLinearMapIsTheMap) {
  // RoPE is linear in x, so for complex x = a + i·b, rope(x) = rope(a) + i·rope(b):
  // the complex instantiation (used for complex-step checks) carries the
  // imaginary part through the same rotation.
  using C = std::complex<double>;
  RopeParams p;
  p.batch = 2;
  p.seq = 2;
  p.width = 8;
  p.head_dim = 4;
  p.table_rows = 2;
  p.style = RopeStyle::gptj;
  const RopePlan plan = RopePlan::make(p);
  const std::vector<double> a = tandem::test::random_values<double>(32, 21),
                            b = tandem::test::random_values<double>(32, 22);
  const std::vector<double> cos = tandem::test::random_values<double>(4, 23),
                            sin = tandem::test::random_values<double>(4, 24);
  std::vector<C> xc(32), cosc(cos.begin(), cos.end()), sinc(sin.begin(), sin.end()), yc(32);
  for (std::size_t i = 0; i < 32; ++i) xc[i] = C(a[i], b[i]);
  tandem::reference::rope_forward<C>(plan, xc, RopeTables<C>{cosc, sinc}, std::span<C>(yc));
  const std::vector<double> ya = forward(plan, a, cos, sin), yb = forward(plan, b, cos, sin);
  for (std::size_t i = 0; i < 32; ++i) {
    EXPECT_NEAR(yc[i].real(), ya[i], 1e-15) << i;
    EXPECT_NEAR(yc[i].imag(), yb[i], 1e-15) << i;
  }
}

}  // namespace
