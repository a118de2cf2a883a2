// SPDX-License-Identifier: Apache-2.0
// Validation and shape rules of the RoPE, axial RoPE, SwiGLU and attention
// block plans (SPEC §4–8): every rule of make() and from_shapes() raises an
// Error naming the parameter and the value, the shape rules fold and choose
// as SPEC says, and a kernel given views that do not fit its plan throws
// before it writes anything.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/attention_block.hpp"
#include "tandem/axial_rope.hpp"
#include "tandem/backend.hpp"
#include "tandem/error.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/rope.hpp"
#include "tandem/swiglu.hpp"
#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"
#endif

namespace {

using tandem::AttentionBlockParams;
using tandem::AttentionBlockPlan;
using tandem::AxialRopeAttrs;
using tandem::AxialRopeParams;
using tandem::AxialRopePlan;
using tandem::RopeAttrs;
using tandem::RopeParams;
using tandem::RopePlan;
using tandem::Shape;
using tandem::SwigluParams;
using tandem::SwigluPlan;
using tandem::TableRows;

using tandem::test::expect_error_message;

constexpr std::int64_t kHuge = std::int64_t{1} << 62;  // 4611686018427387904

// ---------------------------------------------------------------------------
// RopePlan

/// A valid call: B' = 2, S = 3, W = 8, D = 4, a [3, 2] table, position rows.
RopeParams rope_params() {
  RopeParams p;
  p.batch = 2;
  p.seq = 3;
  p.width = 8;
  p.head_dim = 4;
  p.table_rows = 3;
  return p;
}

TEST(RopePlan, MakeFillsDefaults) {
  const RopePlan plan = RopePlan::make(rope_params());
  EXPECT_EQ(plan.n_rot, 4);           // n_rot defaults to D
  EXPECT_EQ(plan.T, 2);               // T defaults to n_rot/2
  EXPECT_EQ(plan.src_row_stride, 8);  // the stride defaults to W
  EXPECT_EQ(plan.heads(), 2);
  EXPECT_EQ(plan.src_extent(), 2 * 3 * 8);
  EXPECT_EQ(plan.out_size(), 2 * 3 * 8);
  // Position rows: token (1, 2) reads row 2; token rows would read 1·3 + 2 = 5.
  EXPECT_EQ(plan.table_row(1, 2), 2);
}

TEST(RopePlan, MakeRejectsEachBadParameter) {
  auto with = [](auto change) {
    RopeParams p = rope_params();
    change(p);
    return [p] { RopePlan::make(p); };
  };
  expect_error_message(with([](RopeParams& p) { p.batch = 0; }), "batch", "batch = 0 must be >= 1");
  expect_error_message(with([](RopeParams& p) { p.seq = 0; }), "seq", "seq = 0 must be >= 1");
  expect_error_message(with([](RopeParams& p) { p.head_dim = 0; }), "head_dim",
                       "head_dim = 0 must be >= 1");
  expect_error_message(with([](RopeParams& p) { p.width = 6; }), "width",
                       "width = 6 must be a positive multiple of head_dim = 4");
  expect_error_message(with([](RopeParams& p) { p.n_rot = 5; }), "n_rot",
                       "n_rot = 5 must be even and <= head_dim = 4");
  expect_error_message(with([](RopeParams& p) { p.n_rot = 6; }), "n_rot",
                       "n_rot = 6 must be even and <= head_dim = 4");
  expect_error_message(with([](RopeParams& p) { p.n_rot = -2; }), "n_rot",
                       "n_rot = -2 must be even and <= head_dim = 4");
  expect_error_message(with([](RopeParams& p) { p.table_stride = 1; }), "table_stride",
                       "table_stride = 1 must be >= n_rot/2 = 2");
  expect_error_message(with([](RopeParams& p) { p.table_rows = 2; }), "table_rows",
                       "table_rows = 2 must be >= seq = 3 for position rows");
  expect_error_message(with([](RopeParams& p) { p.rows = TableRows::token; }), "table_rows",
                       "table_rows = 3 must be batch*seq = 6 for token rows");
  expect_error_message(with([](RopeParams& p) { p.src_row_stride = 7; }), "src_row_stride",
                       "src_row_stride = 7 must be >= width = 8");
  expect_error_message(with([](RopeParams& p) { p.batch = kHuge; }), "batch*seq",
                       "batch*seq overflows a 64-bit size (4611686018427387904 * 3)");
  expect_error_message(with([](RopeParams& p) { p.layout = tandem::RopeLayout::thd; }), "batch",
                       "batch = 2 must be 1 for layout thd (packed tokens: seq = T)");
  expect_error_message(with([](RopeParams& p) {
                         p.layout = tandem::RopeLayout::bhsd;
                         p.src_row_stride = 8;
                       }),
                       "src_row_stride",
                       "src_row_stride = 8 must be 0 for layout bhsd (a contiguous source)");
  expect_error_message(with([](RopeParams& p) {
                         p.rows = TableRows::position_ids;
                         p.table_rows = 0;
                       }),
                       "table_rows",
                       "table_rows = 0 must be >= 1 for position_ids rows (max_position)");
}

TEST(RopePlan, MakeAcceptsTheEdgesOfEachRule) {
  RopeParams p = rope_params();
  p.n_rot = 0;  // no rotation, no table columns
  EXPECT_EQ(RopePlan::make(p).T, 0);
  p = rope_params();
  p.n_rot = 2;  // partial rotation; a table built for D/2 = 2 columns is fine
  p.table_stride = 2;
  EXPECT_EQ(RopePlan::make(p).T, 2);
  p = rope_params();
  p.table_rows = 100;  // a longer table, position rows
  EXPECT_EQ(RopePlan::make(p).R, 100);
  p.table_rows = 6;  // exactly batch*seq, token rows
  p.rows = TableRows::token;
  EXPECT_EQ(RopePlan::make(p).table_row(1, 2), 5);
  p = rope_params();
  p.src_row_stride = 24;  // q out of a fused qkv row
  EXPECT_EQ(RopePlan::make(p).src_extent(), 5 * 24 + 8);
  p = rope_params();
  p.rows = TableRows::position_ids;  // any number of rows: positions pick them
  p.table_rows = 1;
  EXPECT_EQ(RopePlan::make(p).R, 1);
}

TEST(RopePlan, StridesPlaceEveryHeadOfEveryToken) {
  RopeParams p = rope_params();  // B = 2, S = 3, two heads of D = 4
  p.src_row_stride = 10;
  RopePlan plan = RopePlan::make(p);
  EXPECT_EQ(plan.layout, tandem::RopeLayout::bshd);
  EXPECT_EQ(plan.src.at(1, 2, 1), (1 * 3 + 2) * 10 + 4);  // token row, then head
  EXPECT_EQ(plan.out.at(1, 2, 1), (1 * 3 + 2) * 8 + 4);   // contiguous
  p.src_row_stride = 0;
  p.layout = tandem::RopeLayout::bhsd;  // [B, H, S, D]
  plan = RopePlan::make(p);
  EXPECT_EQ(plan.src.at(1, 2, 1), ((1 * 2 + 1) * 3 + 2) * 4);
  EXPECT_EQ(plan.out.at(1, 2, 1), ((1 * 2 + 1) * 3 + 2) * 4);
  EXPECT_EQ(plan.src_extent(), 48);
  p.layout = tandem::RopeLayout::thd;  // [T, H, D], one sequence axis
  p.batch = 1;
  p.seq = 6;
  p.table_rows = 6;
  p.src_row_stride = 12;
  plan = RopePlan::make(p);
  EXPECT_EQ(plan.src.at(0, 5, 1), 5 * 12 + 4);
  EXPECT_EQ(plan.src_extent(), 5 * 12 + 8);
  EXPECT_EQ(plan.out_size(), 48);
}

TEST(RopePlan, FromShapesReadsEachLayout) {
  RopeAttrs a;
  // Rank 4 with an explicit layout: bhsd [B, H, S, D] = [2, 3, 5, 4].
  a.layout = tandem::RopeLayout::bhsd;
  RopePlan plan = RopePlan::from_shapes({2, 3, 5, 4}, {5, 2}, {5, 2}, a);
  EXPECT_EQ(plan.layout, tandem::RopeLayout::bhsd);
  EXPECT_EQ(plan.B, 2);
  EXPECT_EQ(plan.S, 5);
  EXPECT_EQ(plan.W, 12);
  EXPECT_EQ(plan.D, 4);  // head_dim: the last dim
  EXPECT_EQ(plan.heads(), 3);
  // The same shape as bshd [B, S, H, D]: S = 3, H = 5.
  a.layout = tandem::RopeLayout::bshd;
  plan = RopePlan::from_shapes({2, 3, 5, 4}, {5, 2}, {5, 2}, a);
  EXPECT_EQ(plan.S, 3);
  EXPECT_EQ(plan.heads(), 5);
  // Rank 4 without a layout: num_heads decides when exactly one of dims 1, 2 equals it.
  a = {};
  a.num_heads = 3;
  EXPECT_EQ(RopePlan::from_shapes({2, 3, 5, 4}, {5, 2}, {5, 2}, a).layout,
            tandem::RopeLayout::bhsd);
  a.num_heads = 5;
  EXPECT_EQ(RopePlan::from_shapes({2, 3, 5, 4}, {5, 2}, {5, 2}, a).layout,
            tandem::RopeLayout::bshd);
  // [B, S, H*D] = [2, 5, 12] with head_dim 4, or num_heads 3 → 3 heads per token.
  a = {};
  a.head_dim = 4;
  plan = RopePlan::from_shapes({2, 5, 12}, {5, 2}, {5, 2}, a);
  EXPECT_EQ(plan.layout, tandem::RopeLayout::bshd);
  EXPECT_EQ(plan.B, 2);
  EXPECT_EQ(plan.S, 5);
  EXPECT_EQ(plan.W, 12);
  EXPECT_EQ(plan.heads(), 3);
  a = {};
  a.num_heads = 3;
  EXPECT_EQ(RopePlan::from_shapes({2, 5, 12}, {5, 2}, {5, 2}, a).D, 4);
  // thd [T, H, D] = [7, 3, 4]: one sequence axis of 7 tokens.
  a = {};
  a.layout = tandem::RopeLayout::thd;
  plan = RopePlan::from_shapes({7, 3, 4}, {7, 2}, {7, 2}, a);
  EXPECT_EQ(plan.B, 1);
  EXPECT_EQ(plan.S, 7);
  EXPECT_EQ(plan.heads(), 3);
  EXPECT_EQ(plan.D, 4);
  // Rank 2 [S, W]: B = 1, bshd (or thd, the same thing).
  a = {};
  a.head_dim = 4;
  plan = RopePlan::from_shapes({5, 12}, {5, 2}, {5, 2}, a);
  EXPECT_EQ(plan.B, 1);
  EXPECT_EQ(plan.S, 5);
  // n_rot, style and the table shape pass through.
  a.n_rot = 2;
  a.style = tandem::RopeStyle::gptj;
  plan = RopePlan::from_shapes({2, 5, 12}, {7, 3}, {7, 3}, a);
  EXPECT_EQ(plan.n_rot, 2);
  EXPECT_EQ(plan.style, tandem::RopeStyle::gptj);
  EXPECT_EQ(plan.R, 7);
  EXPECT_EQ(plan.T, 3);
}

TEST(RopePlan, FromShapesRejectsAnAmbiguousOrInconsistentLayout) {
  RopeAttrs a;
  // Rank 4 is never guessed: no layout and no num_heads.
  expect_error_message(
      [&] {
        RopePlan::from_shapes({2, 3, 5, 4}, {5, 2}, {5, 2}, a);
      },
      "layout",
      "layout = (absent) is ambiguous for x.shape = [2, 3, 5, 4]; give layout bshd or bhsd (or "
      "num_heads)");
  // num_heads equal to both dims 1 and 2, or to neither.
  a.num_heads = 3;
  expect_error_message(
      [&] {
        RopePlan::from_shapes({2, 3, 3, 4}, {5, 2}, {5, 2}, a);
      },
      "layout",
      "layout = (absent) is ambiguous for x.shape = [2, 3, 3, 4] and num_heads = 3; give layout "
      "bshd or bhsd");
  expect_error_message(
      [&] {
        RopePlan::from_shapes({2, 4, 5, 4}, {5, 2}, {5, 2}, a);
      },
      "layout",
      "layout = (absent) is ambiguous for x.shape = [2, 4, 5, 4] and num_heads = 3; give layout "
      "bshd or bhsd");
  // An explicit layout whose head axis disagrees with num_heads.
  a.layout = tandem::RopeLayout::bshd;
  expect_error_message(
      [&] {
        RopePlan::from_shapes({2, 3, 5, 4}, {5, 2}, {5, 2}, a);
      },
      "x.shape", "x.shape = [2, 3, 5, 4] must have num_heads = 3 on its head axis (bshd)");
  // head_dim must be the last dim when x has a head axis.
  a = {};
  a.layout = tandem::RopeLayout::bhsd;
  a.head_dim = 2;
  expect_error_message(
      [&] {
        RopePlan::from_shapes({2, 3, 5, 4}, {5, 2}, {5, 2}, a);
      },
      "head_dim", "head_dim = 2 must equal the last dim of x.shape = [2, 3, 5, 4]");
  // Layouts that do not fit the rank.
  a = {};
  a.layout = tandem::RopeLayout::thd;
  expect_error_message(
      [&] {
        RopePlan::from_shapes({2, 3, 5, 4}, {5, 2}, {5, 2}, a);
      },
      "layout",
      "layout = thd needs rank 2 or 3 ([T, H*D] or [T, H, D]), not x.shape = [2, 3, 5, 4]");
  a.layout = tandem::RopeLayout::bhsd;
  a.head_dim = 4;
  expect_error_message(
      [&] {
        RopePlan::from_shapes({2, 5, 12}, {5, 2}, {5, 2}, a);
      },
      "layout", "layout = bhsd needs rank 4 [B, H, S, D], not x.shape = [2, 5, 12]");
  // num_heads and head_dim that disagree with W.
  a = {};
  a.head_dim = 4;
  a.num_heads = 2;
  expect_error_message(
      [&] {
        RopePlan::from_shapes({2, 5, 12}, {5, 2}, {5, 2}, a);
      },
      "num_heads", "num_heads = 2 must equal the last dim of x.shape = [2, 5, 12] / head_dim = 4");
  a = {};
  a.num_heads = 5;
  expect_error_message(
      [&] {
        RopePlan::from_shapes({2, 5, 12}, {5, 2}, {5, 2}, a);
      },
      "x.shape", "x.shape = [2, 5, 12] must have a last dim divisible by num_heads = 5");
  a.num_heads = 0;
  expect_error_message(
      [&] {
        RopePlan::from_shapes({2, 5, 12}, {5, 2}, {5, 2}, a);
      },
      "num_heads", "num_heads = 0 must be >= 1");
}

TEST(RopePlan, FromShapesTakesPositionIdsOfTheTokenAxes) {
  RopeAttrs a;
  a.head_dim = 4;
  // [B, S] for [B, S, W]; any table length (max_position).
  RopePlan plan = RopePlan::from_shapes({2, 3, 8}, {100, 2}, {100, 2}, Shape{2, 3}, a);
  EXPECT_EQ(plan.rows, TableRows::position_ids);
  EXPECT_EQ(plan.R, 100);
  plan = RopePlan::from_shapes({2, 3, 8}, {1, 2}, {1, 2}, Shape{2, 3}, a);
  EXPECT_EQ(plan.R, 1);
  // [S] for [S, W]; [T] for thd; [B, S] for either rank-4 layout.
  EXPECT_EQ(RopePlan::from_shapes({3, 8}, {9, 2}, {9, 2}, Shape{3}, a).rows,
            TableRows::position_ids);
  a = {};
  a.layout = tandem::RopeLayout::thd;
  EXPECT_EQ(RopePlan::from_shapes({5, 2, 4}, {9, 2}, {9, 2}, Shape{5}, a).S, 5);
  a.layout = tandem::RopeLayout::bhsd;
  EXPECT_EQ(RopePlan::from_shapes({2, 3, 5, 4}, {9, 2}, {9, 2}, Shape{2, 5}, a).S, 5);
  expect_error_message(
      [&] {
        RopePlan::from_shapes({2, 3, 5, 4}, {9, 2}, {9, 2}, Shape{2, 3}, a);
      },
      "positions.shape", "positions.shape = [2, 3] must be x's token axes [B, S] = [2, 5]");
  a.layout = tandem::RopeLayout::thd;
  expect_error_message(
      [&] {
        RopePlan::from_shapes({5, 2, 4}, {9, 2}, {9, 2}, Shape{1, 5}, a);
      },
      "positions.shape", "positions.shape = [1, 5] must be x's token axes [T] = [5]");
  // table_rows and positions: position_ids or nothing.
  a = {};
  a.head_dim = 4;
  a.table_rows = TableRows::token;
  expect_error_message(
      [&] {
        RopePlan::from_shapes({2, 3, 8}, {6, 2}, {6, 2}, Shape{2, 3}, a);
      },
      "table_rows", "table_rows = token must be absent (or position_ids) when positions are given");
  a.table_rows = TableRows::position_ids;
  EXPECT_EQ(RopePlan::from_shapes({2, 3, 8}, {6, 2}, {6, 2}, Shape{2, 3}, a).rows,
            TableRows::position_ids);
  expect_error_message(
      [&] {
        RopePlan::from_shapes({2, 3, 8}, {6, 2}, {6, 2}, a);
      },
      "positions", "positions = (absent) is required for table_rows = position_ids");
}

TEST(RopePlan, FromShapesChoosesTableRows) {
  // token iff R == B'·S and B' > 1, else position (which needs R >= S).
  RopeAttrs a;
  a.head_dim = 4;
  auto rows_for = [&](const Shape& x, std::int64_t R) {
    return RopePlan::from_shapes(x, {R, 2}, {R, 2}, a).rows;
  };
  EXPECT_EQ(rows_for({2, 3, 4}, 6), TableRows::token);     // R = B'·S = 6, B' = 2
  EXPECT_EQ(rows_for({1, 3, 4}, 3), TableRows::position);  // R = B'·S but B' = 1
  EXPECT_EQ(rows_for({3, 4}, 3), TableRows::position);     // rank 2, B' = 1
  EXPECT_EQ(rows_for({2, 3, 4}, 3), TableRows::position);  // R = S
  EXPECT_EQ(rows_for({2, 3, 4}, 4), TableRows::position);  // S < R != B'·S
  EXPECT_EQ(rows_for({2, 3, 4}, 9), TableRows::position);  // a longer table
  expect_error_message(
      [&] {
        rows_for({2, 3, 4}, 2);
      },
      "table_rows", "table_rows = 2 must be >= seq = 3 for position rows");
  // An explicit choice overrides the rule, and is checked.
  a.table_rows = TableRows::position;
  EXPECT_EQ(rows_for({2, 3, 4}, 6), TableRows::position);
  a.table_rows = TableRows::token;
  expect_error_message(
      [&] {
        rows_for({2, 3, 4}, 4);
      },
      "table_rows", "table_rows = 4 must be batch*seq = 6 for token rows");
}

TEST(RopePlan, FromShapesRejectsBadShapes) {
  RopeAttrs a;
  a.head_dim = 4;
  expect_error_message(
      [&] {
        RopePlan::from_shapes({4}, {1, 2}, {1, 2}, a);
      },
      "x.shape", "x.shape = [4] must have rank 2, 3 or 4");
  expect_error_message(
      [&] {
        RopePlan::from_shapes({1, 2, 3, 5, 4}, {5, 2}, {5, 2}, a);
      },
      "x.shape", "x.shape = [1, 2, 3, 5, 4] must have rank 2, 3 or 4");
  expect_error_message(
      [&] {
        RopePlan::from_shapes({2, -1, 4}, {1, 2}, {1, 2}, a);
      },
      "x.shape", "x.shape = [2, -1, 4] has a negative dimension");
  expect_error_message(
      [&] {
        RopePlan::from_shapes({1, 3, 4}, {3}, {3}, a);
      },
      "cos.shape", "cos.shape = [3] must be [R, T]");
  expect_error_message(
      [&] {
        RopePlan::from_shapes({1, 3, 4}, {3, 2}, {3, 1}, a);
      },
      "sin.shape", "sin.shape = [3, 1] must equal cos.shape = [3, 2]");
  expect_error_message(
      [&] {
        RopePlan::from_shapes({1, 3, 4}, {3, 1}, {3, 1}, a);
      },
      "cos.shape",
      "cos.shape = [3, 1] must have T >= max(n_rot/2, 1) = 2 (T = 0 only for n_rot = 0)");
  {  // an empty table [R, 0] where nothing is rotated, and only there
    RopeAttrs none = a;
    none.n_rot = 0;
    EXPECT_EQ(RopePlan::from_shapes({1, 3, 4}, {3, 0}, {3, 0}, none).T, 0);
    none.n_rot = 2;
    expect_error_message(
        [&] {
          RopePlan::from_shapes({1, 3, 4}, {3, 0}, {3, 0}, none);
        },
        "cos.shape",
        "cos.shape = [3, 0] must have T >= max(n_rot/2, 1) = 1 (T = 0 only for "
        "n_rot = 0)");
  }
  expect_error_message(
      [&] {
        RopePlan::from_shapes({1, 3, 6}, {3, 2}, {3, 2}, a);
      },
      "width", "width = 6 must be a positive multiple of head_dim = 4");
  // head_dim (or num_heads) is required without a head axis (rank 4 and thd take the last dim).
  expect_error_message(
      [] {
        RopePlan::from_shapes({1, 3, 4}, {3, 2}, {3, 2}, {});
      },
      "head_dim",
      "head_dim = (absent) is required for x.shape = [1, 3, 4] (no head axis): give head_dim or "
      "num_heads");
  expect_error_message(
      [] {
        RopePlan::from_shapes({3, 4}, {3, 2}, {3, 2}, {});
      },
      "head_dim",
      "head_dim = (absent) is required for x.shape = [3, 4] (no head axis): give head_dim or "
      "num_heads");
  a.n_rot = 3;
  expect_error_message(
      [&] {
        RopePlan::from_shapes({1, 3, 4}, {3, 2}, {3, 2}, a);
      },
      "n_rot", "n_rot = 3 must be even and <= head_dim = 4");
  // Sizes are checked for overflow, even of an empty x.
  a.n_rot.reset();
  expect_error_message(
      [&] {
        RopePlan::from_shapes({kHuge, 4, 0}, {3, 2}, {3, 2}, a);
      },
      "x.shape", "x.shape overflows a 64-bit size (4611686018427387904 * 4)");
}

// ---------------------------------------------------------------------------
// RopeQkPlan

TEST(RopeQkPlan, KSharesEverythingButItsHeadsAndStride) {
  tandem::RopeQkParams p;
  p.q = rope_params();  // B = 2, S = 3, two heads of D = 4
  p.q.src_row_stride = 24;
  p.k_width = 4;  // one kv head (GQA)
  p.k_src_row_stride = 24;
  const tandem::RopeQkPlan plan = tandem::RopeQkPlan::make(p);
  EXPECT_EQ(plan.q.heads(), 2);
  EXPECT_EQ(plan.k.heads(), 1);
  EXPECT_EQ(plan.k.S, 3);
  EXPECT_EQ(plan.k.R, 3);
  EXPECT_EQ(plan.k.src_row_stride, 24);
  EXPECT_EQ(plan.k.out_size(), 2 * 3 * 4);
  // Errors about k's own parameters name them.
  p.k_width = 6;
  expect_error_message([&] { tandem::RopeQkPlan::make(p); }, "k_width",
                       "k_width = 6 must be a positive multiple of head_dim = 4");
  p.k_width = 4;
  p.k_src_row_stride = 3;
  expect_error_message([&] { tandem::RopeQkPlan::make(p); }, "k_src_row_stride",
                       "k_src_row_stride = 3 must be >= width = 4");
  // q's are q's.
  p.q.n_rot = 3;
  expect_error_message([&] { tandem::RopeQkPlan::make(p); }, "n_rot",
                       "n_rot = 3 must be even and <= head_dim = 4");
}

TEST(RopeQkPlan, FromShapesGivesKTheLayoutAndHeadWidthOfQ) {
  RopeAttrs a;
  a.num_heads = 4;  // q [B, S, H, D] = [2, 3, 4, 8]: bshd
  tandem::RopeQkPlan plan =
      tandem::RopeQkPlan::from_shapes({2, 3, 4, 8}, {2, 3, 2, 8}, {3, 4}, {3, 4}, std::nullopt, a);
  EXPECT_EQ(plan.q.layout, tandem::RopeLayout::bshd);
  EXPECT_EQ(plan.k.layout, tandem::RopeLayout::bshd);
  EXPECT_EQ(plan.k.heads(), 2);
  // Rank 3 [B, S, H*D]: k's head width is q's.
  a = {};
  a.num_heads = 4;
  plan = tandem::RopeQkPlan::from_shapes({2, 3, 32}, {2, 3, 8}, {6, 4}, {6, 4}, Shape{2, 3}, a);
  EXPECT_EQ(plan.q.D, 8);
  EXPECT_EQ(plan.k.heads(), 1);
  EXPECT_EQ(plan.k.rows, TableRows::position_ids);
  expect_error_message(
      [&] {
        tandem::RopeQkPlan::from_shapes({2, 3, 32}, {2, 4, 8}, {6, 4}, {6, 4}, Shape{2, 3}, a);
      },
      "k.shape", "k.shape = [2, 4, 8] must have the token axes of q.shape = [2, 3, 32]");
  expect_error_message(
      [&] {
        tandem::RopeQkPlan::from_shapes({2, 3, 32}, {2, 3, 1, 8}, {6, 4}, {6, 4}, Shape{2, 3}, a);
      },
      "k.shape", "k.shape = [2, 3, 1, 8] must have the rank of q.shape = [2, 3, 32]");
  expect_error_message(
      [&] {
        tandem::RopeQkPlan::from_shapes({2, 3, 32}, {2, 3, 12}, {6, 4}, {6, 4}, Shape{2, 3}, a);
      },
      "k_width", "k_width = 12 must be a positive multiple of head_dim = 8");
  expect_error_message(
      [&] {
        tandem::RopeQkPlan::from_shapes({2, 3, 4, 8}, {2, 3, 2, 8}, {6, 4}, {6, 4}, Shape{2, 3},
                                        {});
      },
      "layout",
      "layout = (absent) is ambiguous for q.shape = [2, 3, 4, 8]; give layout bshd or bhsd (or "
      "num_heads)");
}

// ---------------------------------------------------------------------------
// rope_call: the inputs as a binding gives them

/// The shapes of a call on x with tables cos and sin [6, 4].
tandem::RopeShapes rope_shapes(Shape x) {
  tandem::RopeShapes s;
  s.x = std::move(x);
  s.cos = Shape{6, 4};
  s.sin = Shape{6, 4};
  return s;
}

TEST(RopeCall, ReadsOneCosSinCacheAsTwoTables) {
  tandem::RopeShapes s = rope_shapes({2, 5, 4, 8});
  s.cos.reset();
  s.sin.reset();
  s.cos_sin_cache = Shape{6, 8};
  RopeAttrs a;
  a.layout = tandem::RopeLayout::bshd;
  const tandem::RopeCall call = tandem::rope_call(s, a, {});
  EXPECT_EQ(call.cache_split, 4);
  EXPECT_EQ(call.params.q.table_rows, 6);
  EXPECT_EQ(call.params.q.table_stride, 4);
  EXPECT_EQ(call.x, (Shape{2, 5, 32}));
  EXPECT_EQ(tandem::rope_call(rope_shapes({2, 5, 4, 8}), a, {}).cache_split, 0);
  s.cos_sin_cache = Shape{6, 7};
  expect_error_message([&] { tandem::rope_call(s, a, {}); }, "cos_sin_cache.shape",
                       "cos_sin_cache.shape = [6, 7] must be [R, 2T] (cos | sin)");
  s.cos_sin_cache = Shape{6, 8};
  s.sin = Shape{6, 4};
  expect_error_message([&] { tandem::rope_call(s, a, {}); }, "cos_sin_cache",
                       "cos_sin_cache = [6, 8] must not be given with cos and sin: give one of "
                       "the two");
  s = rope_shapes({2, 5, 4, 8});
  s.sin.reset();
  expect_error_message([&] { tandem::rope_call(s, a, {}); }, "sin",
                       "sin = (absent) is required: give cos and sin, or cos_sin_cache");
}

TEST(RopeCall, FoldsTheLeadingAxesOfOneSourceWithoutALayout) {
  const tandem::RopeCall call = tandem::rope_call(rope_shapes({2, 3, 5, 8}), {}, {});
  EXPECT_EQ(call.x, (Shape{6, 5, 8}));
  EXPECT_EQ(call.params.q.head_dim, 8);
  EXPECT_EQ(call.params.q.batch, 6);
  RopeAttrs a;
  a.head_dim = 4;
  EXPECT_EQ(tandem::rope_call(rope_shapes({2, 3, 2, 5, 8}), a, {}).params.q.batch, 12);
  EXPECT_EQ(tandem::rope_call(rope_shapes({2, 3, 2, 5, 8}), a, {}).params.q.head_dim, 4);
  // A layout reads the head axis: bhsd [B, H, S, D] viewed as it is.
  a = {};
  a.layout = tandem::RopeLayout::bhsd;
  EXPECT_EQ(tandem::rope_call(rope_shapes({2, 3, 5, 8}), a, {}).x, (Shape{2, 3, 5, 8}));
  tandem::RopeShapes s = rope_shapes({2, 3, 5, 8});
  s.positions = Shape{2, 3};
  expect_error_message([&] { tandem::rope_call(s, {}, {}); }, "layout",
                       "layout = (absent) is ambiguous with positions for x.shape = [2, 3, 5, 8] "
                       "(read as [..., S, W] rows): give layout bshd or bhsd");
}

TEST(RopeCall, QAndKOfRankFourNeedALayout) {
  tandem::RopeShapes s = rope_shapes({2, 5, 4, 8});
  s.k = Shape{2, 5, 2, 8};
  const tandem::RopeNames names{"q"};  // built in place: GCC 12 -Wrestrict misfires on x = "q"
  expect_error_message([&] { tandem::rope_call(s, {}, names); }, "layout",
                       "layout = (absent) must be given (bshd or bhsd) for q.shape = [2, 5, 4, "
                       "8] and k.shape = [2, 5, 2, 8]");
  RopeAttrs a;
  a.layout = tandem::RopeLayout::bshd;
  const tandem::RopeCall call = tandem::rope_call(s, a, names);
  EXPECT_EQ(call.x, (Shape{2, 5, 32}));
  EXPECT_EQ(call.k, (Shape{2, 5, 16}));
  EXPECT_EQ(call.params.k_width, 16);
}

// ---------------------------------------------------------------------------
// AxialRopePlan

/// A valid call: B' = 1, W = 8, one head (D = 8), a 2×2 grid, r = 2, S = 8.
AxialRopeParams axial_params() {
  AxialRopeParams p;
  p.seq = 8;
  p.width = 8;
  p.end_x = 2;
  p.end_y = 2;
  p.repeat_factor = 2;
  return p;
}

TEST(AxialRopePlan, MakeRejectsEachBadParameter) {
  EXPECT_EQ(AxialRopePlan::make(axial_params()).D, 8);
  auto with = [](auto change) {
    AxialRopeParams p = axial_params();
    change(p);
    return [p] { AxialRopePlan::make(p); };
  };
  expect_error_message(with([](AxialRopeParams& p) { p.batch = 0; }), "batch",
                       "batch = 0 must be >= 1");
  expect_error_message(with([](AxialRopeParams& p) { p.seq = 0; }), "seq", "seq = 0 must be >= 1");
  expect_error_message(with([](AxialRopeParams& p) { p.num_heads = 0; }), "num_heads",
                       "num_heads = 0 must be >= 1");
  expect_error_message(with([](AxialRopeParams& p) { p.num_heads = 3; }), "width",
                       "width = 8 must be a positive multiple of num_heads = 3");
  expect_error_message(with([](AxialRopeParams& p) { p.width = 6; }), "head_dim",
                       "head_dim = 6 (width / num_heads) must be divisible by 4");
  expect_error_message(with([](AxialRopeParams& p) { p.num_heads = 4; }), "head_dim",
                       "head_dim = 2 (width / num_heads) must be divisible by 4");
  expect_error_message(with([](AxialRopeParams& p) { p.end_x = 0; }), "end_x",
                       "end_x = 0 must be >= 1");
  expect_error_message(with([](AxialRopeParams& p) { p.end_y = 0; }), "end_y",
                       "end_y = 0 must be >= 1");
  expect_error_message(with([](AxialRopeParams& p) { p.repeat_factor = 0; }), "repeat_factor",
                       "repeat_factor = 0 must be >= 1");
  expect_error_message(with([](AxialRopeParams& p) { p.theta = 0.0; }), "theta",
                       "theta = 0.000000 must be finite and > 0");
  expect_error_message(with([](AxialRopeParams& p) { p.theta = -2.0; }), "theta",
                       "theta = -2.000000 must be finite and > 0");
  expect_error_message(
      with([](AxialRopeParams& p) { p.theta = std::numeric_limits<double>::infinity(); }), "theta",
      "theta = inf must be finite and > 0");
  // S must be r·end_x·end_y.
  expect_error_message(with([](AxialRopeParams& p) { p.seq = 7; }), "seq",
                       "seq = 7 must equal repeat_factor*end_x*end_y = 8");
  expect_error_message(with([](AxialRopeParams& p) { p.repeat_factor = 1; }), "seq",
                       "seq = 8 must equal repeat_factor*end_x*end_y = 4");
  expect_error_message(with([](AxialRopeParams& p) { p.src_row_stride = 4; }), "src_row_stride",
                       "src_row_stride = 4 must be >= width = 8");
  expect_error_message(with([](AxialRopeParams& p) { p.end_x = kHuge; }), "end_x*end_y",
                       "end_x*end_y overflows a 64-bit size (4611686018427387904 * 2)");
}

TEST(AxialRopePlan, FromShapesFoldsAndChecksTheGrid) {
  AxialRopeAttrs a;
  a.end_x = 2;
  a.end_y = 2;
  // [B, H, S, D] = [1, 2, 4, 8]: B' = 2, one head of D = 8 per row.
  AxialRopePlan plan = AxialRopePlan::from_shapes({1, 2, 4, 8}, a);
  EXPECT_EQ(plan.B, 2);
  EXPECT_EQ(plan.S, 4);
  EXPECT_EQ(plan.W, 8);
  EXPECT_EQ(plan.D, 8);
  // [B, S, H*D] = [3, 4, 16] with num_heads 2: D = 8.
  a.num_heads = 2;
  plan = AxialRopePlan::from_shapes({3, 4, 16}, a);
  EXPECT_EQ(plan.B, 3);
  EXPECT_EQ(plan.D, 8);
  EXPECT_EQ(plan.num_heads, 2);
  expect_error_message([&] { AxialRopePlan::from_shapes({16}, a); }, "x.shape",
                       "x.shape = [16] must have rank >= 2");
  expect_error_message(
      [&] {
        AxialRopePlan::from_shapes({1, 5, 16}, a);
      },
      "seq", "seq = 5 must equal repeat_factor*end_x*end_y = 4");
  expect_error_message(
      [&] {
        AxialRopePlan::from_shapes({1, 4, 12}, a);
      },
      "head_dim", "head_dim = 6 (width / num_heads) must be divisible by 4");
  a.repeat_factor = 3;
  a.theta = 100.0;
  plan = AxialRopePlan::from_shapes({1, 12, 16}, a);
  EXPECT_EQ(plan.repeat_factor, 3);
  EXPECT_EQ(plan.theta, 100.0);
}

// ---------------------------------------------------------------------------
// SwigluPlan

TEST(SwigluPlan, ShapeRulesAndHalves) {
  SwigluPlan plan = SwigluPlan::from_shapes({2, 3, 8}, true);
  EXPECT_EQ(plan.rows, 6);
  EXPECT_EQ(plan.n, 4);
  EXPECT_EQ(plan.in_size(), 48);
  EXPECT_EQ(plan.out_size(), 24);
  EXPECT_EQ(plan.gate_offset(), 0);
  EXPECT_EQ(plan.up_offset(), 4);
  plan = SwigluPlan::from_shapes({8}, false);
  EXPECT_EQ(plan.rows, 1);
  EXPECT_EQ(plan.gate_offset(), 4);
  EXPECT_EQ(plan.up_offset(), 0);
}

TEST(SwigluPlan, RejectsBadShapes) {
  expect_error_message([] { SwigluPlan::from_shapes({}, true); }, "x.shape",
                       "x.shape = [] must have rank >= 1");
  expect_error_message(
      [] {
        SwigluPlan::from_shapes({2, 3}, true);
      },
      "x.shape", "x.shape = [2, 3] must have an even, non-zero last dim (2n)");
  expect_error_message(
      [] {
        SwigluPlan::from_shapes({2, 0}, true);
      },
      "x.shape", "x.shape = [2, 0] must have an even, non-zero last dim (2n)");
  expect_error_message(
      [] {
        SwigluPlan::from_shapes({2, -4}, true);
      },
      "x.shape", "x.shape = [2, -4] has a negative dimension");
  expect_error_message(
      [] {
        SwigluPlan::from_shapes({0, 4}, true);
      },
      "rows", "rows = 0 must be >= 1");
  expect_error_message([] { SwigluPlan::make({0, 2, true}); }, "rows", "rows = 0 must be >= 1");
  expect_error_message([] { SwigluPlan::make({3, 0, true}); }, "n", "n = 0 must be >= 1");
  expect_error_message(
      [] {
        SwigluPlan::make({kHuge, 2, true});
      },
      "x", "x overflows a 64-bit size (4611686018427387904 * 2)");
}

// ---------------------------------------------------------------------------
// AttentionBlockPlan

/// x [B, S, E] = [2, 3, 8], H = 2 (D = 4), with optional parts.
AttentionBlockPlan block_from_shapes(const std::optional<Shape>& b_qkv,
                                     const std::optional<Shape>& b_out,
                                     const std::optional<Shape>& keep,
                                     const std::optional<Shape>& cos,
                                     const std::optional<Shape>& sin, std::int64_t heads = 2) {
  return AttentionBlockPlan::from_shapes({2, 3, 8}, {24, 8}, b_qkv, {8, 8}, b_out, keep, cos, sin,
                                         heads);
}

TEST(AttentionBlockPlan, PlansItsParts) {
  const AttentionBlockPlan plain =
      block_from_shapes(std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  EXPECT_EQ(plain.D, 4);
  EXPECT_FALSE(plain.has_rope);
  EXPECT_EQ(plain.attention.mask, tandem::MaskKind::none);
  EXPECT_EQ(plain.attention.q.seq, 24);  // q, k, v all read out of qkv rows of 3E
  EXPECT_EQ(plain.attention.k.seq, 24);
  EXPECT_EQ(plain.attention.v.seq, 24);
  EXPECT_EQ(plain.attention.scale, 0.5);  // 1/sqrt(4)

  // With every option; R = 6 = B·S would mean token rows for a plain RoPE
  // call, but the block always uses position rows.
  const AttentionBlockPlan full =
      block_from_shapes(Shape{24}, Shape{8}, Shape{2, 3}, Shape{6, 2}, Shape{6, 2});
  EXPECT_TRUE(full.qkv_bias);
  EXPECT_TRUE(full.out_bias);
  EXPECT_EQ(full.attention.mask, tandem::MaskKind::key_padding);
  ASSERT_TRUE(full.has_rope);
  EXPECT_EQ(full.rope.src_row_stride, 24);
  EXPECT_EQ(full.rope.n_rot, 4);
  EXPECT_EQ(full.rope.style, tandem::RopeStyle::neox);
  EXPECT_EQ(full.rope.rows, TableRows::position);
  EXPECT_EQ(full.attention.q.seq, 8);  // q, k contiguous after RoPE
  EXPECT_EQ(full.attention.k.seq, 8);
  EXPECT_EQ(full.attention.v.seq, 24);
}

TEST(AttentionBlockPlan, FromShapesRejectsBadShapes) {
  const auto none = std::nullopt;
  expect_error_message(
      [] {
        AttentionBlockPlan::from_shapes({3, 8}, {24, 8}, {}, {8, 8}, {}, {}, {}, {}, 2);
      },
      "x.shape", "x.shape = [3, 8] must be [B, S, E]");
  expect_error_message(
      [] {
        AttentionBlockPlan::from_shapes({2, 3, 8}, {8, 24}, {}, {8, 8}, {}, {}, {}, {}, 2);
      },
      "w_qkv.shape", "w_qkv.shape = [8, 24] must be [3E, E] = [24, 8]");
  expect_error_message([&] { block_from_shapes(Shape{8}, none, none, none, none); }, "b_qkv.shape",
                       "b_qkv.shape = [8] must be [3E] = [24]");
  expect_error_message(
      [] {
        AttentionBlockPlan::from_shapes({2, 3, 8}, {24, 8}, {}, {8, 4}, {}, {}, {}, {}, 2);
      },
      "w_out.shape", "w_out.shape = [8, 4] must be [E, E] = [8, 8]");
  expect_error_message([&] { block_from_shapes(none, Shape{24}, none, none, none); }, "b_out.shape",
                       "b_out.shape = [24] must be [E] = [8]");
  expect_error_message(
      [&] {
        block_from_shapes(none, none, Shape{3, 2}, none, none);
      },
      "key_padding.shape", "key_padding.shape = [3, 2] must be [B, S] = [2, 3] (a keep mask)");
  expect_error_message(
      [&] {
        block_from_shapes(none, none, none, Shape{3, 2}, none);
      },
      "sin", "sin = (absent) must be given with the other RoPE table");
  expect_error_message(
      [&] {
        block_from_shapes(none, none, none, none, Shape{3, 2});
      },
      "cos", "cos = (absent) must be given with the other RoPE table");
  expect_error_message([&] { block_from_shapes(none, none, none, Shape{6}, Shape{6}); },
                       "cos.shape", "cos.shape = [6] must be [R, T]");
  expect_error_message(
      [&] {
        block_from_shapes(none, none, none, Shape{3, 2}, Shape{3, 1});
      },
      "sin.shape", "sin.shape = [3, 1] must equal cos.shape = [3, 2]");
  expect_error_message(
      [&] {
        block_from_shapes(none, none, none, Shape{3, 0}, Shape{3, 0});
      },
      "cos.shape", "cos.shape = [3, 0] must have T >= 1");
  // The RoPE part is validated as a RoPE call: T >= D/2 and R >= S.
  expect_error_message(
      [&] {
        block_from_shapes(none, none, none, Shape{3, 1}, Shape{3, 1});
      },
      "table_stride", "table_stride = 1 must be >= n_rot/2 = 2");
  expect_error_message(
      [&] {
        block_from_shapes(none, none, none, Shape{2, 2}, Shape{2, 2});
      },
      "table_rows", "table_rows = 2 must be >= seq = 3 for position rows");
  expect_error_message([&] { block_from_shapes(none, none, none, none, none, 3); }, "embed",
                       "embed = 8 must be a positive multiple of num_heads = 3");
  expect_error_message([&] { block_from_shapes(none, none, none, none, none, 0); }, "num_heads",
                       "num_heads = 0 must be >= 1");
  expect_error_message(
      [] {
        AttentionBlockPlan::from_shapes({1, 1, kHuge}, {3, 1}, {}, {1, 1}, {}, {}, {}, {}, 1);
      },
      "x.shape", "x.shape overflows a 64-bit size (4611686018427387904 * 3)");
}

TEST(AttentionBlockPlan, MakeRejectsEachBadParameter) {
  auto with = [](auto change) {
    AttentionBlockParams p;
    p.batch = 2;
    p.seq = 3;
    p.embed = 8;
    p.heads = 2;
    change(p);
    return [p] { AttentionBlockPlan::make(p); };
  };
  expect_error_message(with([](AttentionBlockParams& p) { p.batch = 0; }), "batch",
                       "batch = 0 must be >= 1");
  expect_error_message(with([](AttentionBlockParams& p) { p.seq = 0; }), "seq",
                       "seq = 0 must be >= 1");
  expect_error_message(with([](AttentionBlockParams& p) { p.embed = 0; }), "embed",
                       "embed = 0 must be a positive multiple of num_heads = 2");
  // RoPE needs an even head width: E = 6, H = 6 → D = 1, n_rot = D = 1.
  expect_error_message(with([](AttentionBlockParams& p) {
                         p.embed = 6;
                         p.heads = 6;
                         p.rope = true;
                         p.table_rows = 3;
                       }),
                       "n_rot", "n_rot = 1 must be even and <= head_dim = 1");
}

// ---------------------------------------------------------------------------
// Views that do not fit: every entry throws before it writes anything.

std::vector<tandem::Backend> backends() {
  std::vector<tandem::Backend> all = {tandem::reference::backend()};
#ifdef TANDEM_HAVE_OPTIMIZED
  all.push_back(tandem::optimized::backend());
#endif
  return all;
}

constexpr float kSentinel = 7.25f;

/// Calls f(out) with a sentinel-filled out of `n` elements; expects an Error
/// naming `parameter` with `message`, and out untouched.
template <class F>
void expect_untouched(const tandem::Backend& b, std::size_t n, F&& f, const std::string& parameter,
                      const std::string& message) {
  SCOPED_TRACE(b.name + ": " + message);
  std::vector<float> out(n, kSentinel);
  expect_error_message([&] { f(std::span<float>(out)); }, parameter, message);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], kSentinel) << "element " << i;
}

TEST(BadViews, RopeLeavesTheOutputUntouched) {
  RopeParams p = rope_params();  // B' = 2, S = 3, W = 8, [3, 2] table
  p.src_row_stride = 10;         // source extent 5·10 + 8 = 58
  const RopePlan plan = RopePlan::make(p);
  const std::vector<float> x(58, 1.0f), x_short(57, 1.0f), table(6, 0.5f), table_bad(5, 0.5f);
  for (const tandem::Backend& b : backends()) {
    for (const bool fwd : {true, false}) {
      const auto& entry = fwd ? b.rope_forward : b.rope_backward;
      ASSERT_TRUE(static_cast<bool>(entry)) << b.name;
      const std::string src = fwd ? "x" : "dy", dst = fwd ? "out" : "dx";
      expect_untouched(
          b, 48,
          [&](std::span<float> o) {
            entry(plan, x_short, {table, table}, o);
          },
          src + ".size()", src + ".size() = 57 must be >= 58");
      expect_untouched(
          b, 48,
          [&](std::span<float> o) {
            entry(plan, x, {table_bad, table}, o);
          },
          "cos.size()", "cos.size() = 5 must be 6");
      expect_untouched(
          b, 48,
          [&](std::span<float> o) {
            entry(plan, x, {table, table_bad}, o);
          },
          "sin.size()", "sin.size() = 5 must be 6");
      expect_untouched(
          b, 49,
          [&](std::span<float> o) {
            entry(plan, x, {table, table}, o);
          },
          dst + ".size()", dst + ".size() = 49 must be 48");
    }
  }
}

TEST(BadViews, RopePositionsAreCheckedBeforeAnythingIsWritten) {
  RopeParams p = rope_params();  // B = 2, S = 3, W = 8: 6 tokens, 48 outputs
  p.rows = TableRows::position_ids;
  p.table_rows = 3;  // max_position = 3
  const RopePlan plan = RopePlan::make(p);
  const std::vector<float> x(48, 1.0f), table(6, 0.5f);
  const std::vector<std::int64_t> good = {0, 1, 2, 2, 1, 0}, high = {0, 1, 2, 3, 1, 0},
                                  short_ = {0, 1, 2};
  const std::vector<std::int32_t> negative = {0, 1, 2, 2, -1, 0};
  using Pos64 = std::span<const std::int64_t>;
  struct Bad {
    tandem::Indices positions;
    std::string parameter, message;
  };
  const std::vector<Bad> bad = {
      {tandem::Indices(Pos64(high)), "positions",
       "positions[3] = 3 must be in [0, max_position = 3) (the rows of cos and sin)"},
      {tandem::Indices(std::span<const std::int32_t>(negative)), "positions",
       "positions[4] = -1 must be in [0, max_position = 3) (the rows of cos and sin)"},
      {tandem::Indices(Pos64(short_)), "positions.size()", "positions.size() = 3 must be 6"},
      {tandem::Indices(), "positions.size()", "positions.size() = 0 must be 6"},
  };
  for (const tandem::Backend& b : backends()) {
    for (const bool fwd : {true, false}) {
      const auto& entry = fwd ? b.rope_forward : b.rope_backward;
      for (const Bad& c : bad) {
        expect_untouched(
            b, 48,
            [&](std::span<float> o) {
              entry(plan, x, {table, table, c.positions}, o);
            },
            c.parameter, c.message);
      }
      std::vector<float> out(48, kSentinel);
      entry(plan, x, {table, table, tandem::Indices(Pos64(good))}, out);  // the good ones run
      EXPECT_NE(out[0], kSentinel);
    }
  }
  // Positions given to a plan that reads rows by position.
  const RopePlan by_position = RopePlan::make(rope_params());
  for (const tandem::Backend& b : backends()) {
    expect_untouched(
        b, 48,
        [&](std::span<float> o) {
          b.rope_forward(by_position, x, {table, table, tandem::Indices(Pos64(good))}, o);
        },
        "positions.size()", "positions.size() = 6 must be 0 for table_rows = position");
  }
}

TEST(BadViews, RopeQkChecksQAndKBeforeWritingEither) {
  tandem::RopeQkParams p;
  p.q = rope_params();  // q: 6 tokens of W = 8 (48); k: W = 4 (24)
  p.q.rows = TableRows::position_ids;
  p.k_width = 4;
  const tandem::RopeQkPlan plan = tandem::RopeQkPlan::make(p);
  const std::vector<float> q(48, 1.0f), k(24, 1.0f), k_short(23, 1.0f), table(6, 0.5f);
  const std::vector<std::int64_t> good = {0, 1, 2, 2, 1, 0}, high = {0, 1, 2, 3, 1, 0};
  using Pos64 = std::span<const std::int64_t>;
  for (const tandem::Backend& b : backends()) {
    for (const bool fwd : {true, false}) {
      const auto& entry = fwd ? b.rope_forward_qk : b.rope_backward_qk;
      ASSERT_TRUE(static_cast<bool>(entry)) << b.name;
      const tandem::RopeQkNames names = fwd ? tandem::kRopeQkForward : tandem::kRopeQkBackward;
      const std::string k_name = names.k, k_out_name = names.k_out;
      // Each bad view leaves both outputs untouched.
      struct Call {
        std::span<const float> k;
        std::vector<std::int64_t> positions;
        std::size_t k_out;
        std::string parameter, message;
      };
      const std::vector<Call> calls = {
          {k, high, 24, "positions",
           "positions[3] = 3 must be in [0, max_position = 3) (the rows of cos and sin)"},
          {k_short, good, 24, k_name + ".size()", k_name + ".size() = 23 must be >= 24"},
          {k, good, 25, k_out_name + ".size()", k_out_name + ".size() = 25 must be 24"},
      };
      for (const Call& c : calls) {
        std::vector<float> k_out(c.k_out, kSentinel);
        expect_untouched(
            b, 48,
            [&](std::span<float> q_out) {
              entry(plan, q, c.k, {table, table, tandem::Indices(Pos64(c.positions))}, q_out,
                    k_out);
            },
            c.parameter, c.message);
        for (float v : k_out) ASSERT_EQ(v, kSentinel);
      }
    }
  }
}

TEST(BadViews, AxialRopeLeavesTheOutputUntouched) {
  const AxialRopePlan plan = AxialRopePlan::make(axial_params());  // 8 rows of 8
  const std::vector<float> x(64, 1.0f), x_short(63, 1.0f);
  for (const tandem::Backend& b : backends()) {
    for (const bool fwd : {true, false}) {
      const auto& entry = fwd ? b.axial_rope_forward : b.axial_rope_backward;
      ASSERT_TRUE(static_cast<bool>(entry)) << b.name;
      const std::string src = fwd ? "x" : "dy", dst = fwd ? "out" : "dx";
      expect_untouched(
          b, 64, [&](std::span<float> o) { entry(plan, x_short, o); }, src + ".size()",
          src + ".size() = 63 must be >= 64");
      expect_untouched(
          b, 63, [&](std::span<float> o) { entry(plan, x, o); }, dst + ".size()",
          dst + ".size() = 63 must be 64");
    }
  }
}

TEST(BadViews, SwigluLeavesTheOutputUntouched) {
  const SwigluPlan plan = SwigluPlan::from_shapes({3, 8}, true);  // x 24, y 12
  const std::vector<float> x(24, 1.0f), x_bad(23, 1.0f), dy(12, 1.0f), dy_bad(13, 1.0f);
  for (const tandem::Backend& b : backends()) {
    ASSERT_TRUE(static_cast<bool>(b.swiglu_forward)) << b.name;
    ASSERT_TRUE(static_cast<bool>(b.swiglu_backward)) << b.name;
    expect_untouched(
        b, 12, [&](std::span<float> o) { b.swiglu_forward(plan, x_bad, o); }, "x.size()",
        "x.size() = 23 must be 24");
    expect_untouched(
        b, 11, [&](std::span<float> o) { b.swiglu_forward(plan, x, o); }, "out.size()",
        "out.size() = 11 must be 12");
    expect_untouched(
        b, 24, [&](std::span<float> o) { b.swiglu_backward(plan, x_bad, dy, o); }, "x.size()",
        "x.size() = 23 must be 24");
    expect_untouched(
        b, 24, [&](std::span<float> o) { b.swiglu_backward(plan, x, dy_bad, o); }, "dy.size()",
        "dy.size() = 13 must be 12");
    expect_untouched(
        b, 12, [&](std::span<float> o) { b.swiglu_backward(plan, x, dy, o); }, "dx.size()",
        "dx.size() = 12 must be 24");
  }
}

TEST(BadViews, AttentionBlockLeavesTheOutputUntouched) {
  // B = 2, S = 3, E = 8, H = 2 with b_qkv and a [3, 2] RoPE table; no b_out, no keep.
  const AttentionBlockPlan plan =
      block_from_shapes(Shape{24}, std::nullopt, std::nullopt, Shape{3, 2}, Shape{3, 2});
  const std::vector<float> x(48, 0.1f), w_qkv(192, 0.1f), b_qkv(24, 0.1f), w_out(64, 0.1f),
      table(6, 0.5f);
  const std::vector<float> x_bad(47, 0.1f), b_out(8, 0.1f), keep(6, 1.0f), table_bad(4, 0.5f);
  const tandem::AttentionBlockInputs<float> good{x, w_qkv, b_qkv, w_out, {}, {}, table, table};
  struct Case {
    tandem::AttentionBlockInputs<float> in;
    std::size_t out_size;
    std::string parameter, message;
  };
  std::vector<Case> cases;
  auto bad = [&](auto change, std::size_t n, std::string parameter, std::string message) {
    tandem::AttentionBlockInputs<float> in = good;
    change(in);
    cases.push_back({in, n, std::move(parameter), std::move(message)});
  };
  using In = tandem::AttentionBlockInputs<float>;
  bad([&](In& in) { in.x = x_bad; }, 48, "x.size()", "x.size() = 47 must be 48");
  bad([&](In& in) { in.w_qkv = w_out; }, 48, "w_qkv.size()", "w_qkv.size() = 64 must be 192");
  bad([&](In& in) { in.b_qkv = {}; }, 48, "b_qkv.size()", "b_qkv.size() = 0 must be 24");
  bad([&](In& in) { in.w_out = w_qkv; }, 48, "w_out.size()", "w_out.size() = 192 must be 64");
  bad([&](In& in) { in.b_out = b_out; }, 48, "b_out.size()", "b_out.size() = 8 must be 0");
  bad([&](In& in) { in.keep = keep; }, 48, "keep.size()", "keep.size() = 6 must be 0");
  bad([&](In& in) { in.cos = table_bad; }, 48, "cos.size()", "cos.size() = 4 must be 6");
  bad([&](In& in) { in.sin = {}; }, 48, "sin.size()", "sin.size() = 0 must be 6");
  bad([](In&) {}, 47, "out.size()", "out.size() = 47 must be 48");
  for (const tandem::Backend& b : backends()) {
    ASSERT_TRUE(static_cast<bool>(b.attention_block)) << b.name;
    for (const Case& c : cases) {
      expect_untouched(
          b, c.out_size, [&](std::span<float> o) { b.attention_block(plan, c.in, o); }, c.parameter,
          c.message);
    }
    // The good views run.
    std::vector<float> out(48, kSentinel);
    b.attention_block(plan, good, out);
    EXPECT_NE(out[0], kSentinel);
  }
}

}  // namespace

TEST(RopePlanShapes, ErrorsNameTheCallersInputs) {
  tandem::RopeAttrs a;
  tandem::RopeNames n;
  n.x = "dy";
  n.cos = "cos_sin_cache";
  n.sin = "cos_sin_cache";
  n.positions = "pos";
  const auto fails = [&](auto&& f, const std::string& parameter,
                         std::initializer_list<std::string> fragments) {
    tandem::test::expect_error(f, parameter, fragments);
  };
  const tandem::Shape x{2, 6, 4, 8}, table{16, 4};
  a.layout = tandem::RopeLayout::bshd;
  fails(
      [&] {
        tandem::RopePlan::from_shapes({2, 6, 32, 1, 1}, table, table, std::nullopt, a, n);
      },
      "dy.shape", {"dy.shape = [2, 6, 32, 1, 1]", "rank 2, 3 or 4"});
  fails([&] { tandem::RopePlan::from_shapes(x, {16}, {16}, std::nullopt, a, n); },
        "cos_sin_cache.shape", {"cos_sin_cache.shape = [16]", "[R, T]"});
  fails(
      [&] {
        tandem::RopePlan::from_shapes(x, table, table, tandem::Shape{2, 5}, a, n);
      },
      "pos.shape", {"pos.shape = [2, 5]", "dy's token axes"});
  n.x = "q_in";
  n.k = "k_in";
  fails(
      [&] {
        tandem::RopeQkPlan::from_shapes(x, {2, 5, 2, 8}, table, table, std::nullopt, a, n);
      },
      "k_in.shape", {"k_in.shape = [2, 5, 2, 8]", "token axes of q_in.shape"});
}

TEST(RopePlanShapes, SwigluAndTheBlockNameTheCallersInputs) {
  tandem::test::expect_error(
      [] {
        SwigluPlan::from_shapes({4, 7}, true, "dy");
      },
      "dy.shape", {"dy.shape = [4, 7]", "even"});
  const auto block = [](const std::string& keep_name) {
    AttentionBlockPlan::from_shapes({2, 6, 8}, {24, 8}, std::nullopt, {8, 8}, std::nullopt,
                                    tandem::Shape{2, 5}, std::nullopt, std::nullopt, 2, keep_name);
  };
  tandem::test::expect_error([&] { block("key_padding"); }, "key_padding.shape",
                             {"key_padding.shape = [2, 5]", "[B, S] = [2, 6]"});
  tandem::test::expect_error([&] { block("mask"); }, "mask.shape", {"mask.shape = [2, 5]"});
}
