// SPDX-License-Identifier: Apache-2.0
// Axial 2-D RoPE (SPEC §5) on hand-worked grids: which half of a head turns
// with the column px and which with the row py, the frequencies f_k, the
// repeat factor, heads, strided sources, and the backward as the transpose.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <random>
#include <span>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/axial_rope.hpp"
#include "tandem/reference/axial_rope.hpp"
#include "tandem/reference/backend.hpp"

namespace {

using tandem::AxialRopeParams;
using tandem::AxialRopePlan;

const double c1 = std::cos(1.0), s1 = std::sin(1.0);
const double c2 = std::cos(2.0), s2 = std::sin(2.0);

AxialRopePlan plan_of(std::int64_t batch, std::int64_t width, std::int64_t heads,
                      std::int64_t end_x, std::int64_t end_y, double theta = 10000.0,
                      std::int64_t repeat = 1, std::int64_t stride = 0) {
  AxialRopeParams p;
  p.batch = batch;
  p.seq = repeat * end_x * end_y;
  p.width = width;
  p.num_heads = heads;
  p.end_x = end_x;
  p.end_y = end_y;
  p.theta = theta;
  p.repeat_factor = repeat;
  p.src_row_stride = stride;
  return AxialRopePlan::make(p);
}

std::vector<double> forward(const AxialRopePlan& plan, const std::vector<double>& x) {
  std::vector<double> out(static_cast<std::size_t>(plan.out_size()));
  tandem::reference::axial_rope_forward<double>(plan, x, std::span<double>(out));
  return out;
}

std::vector<double> backward(const AxialRopePlan& plan, const std::vector<double>& dy) {
  std::vector<double> dx(static_cast<std::size_t>(plan.out_size()));
  tandem::reference::axial_rope_backward<double>(plan, dy, std::span<double>(dx));
  return dx;
}

/// x with every row (b, s) equal to `row`, rows `stride` apart (gaps NaN).
std::vector<double> repeated_rows(const AxialRopePlan& plan, const std::vector<double>& row) {
  std::vector<double> x(static_cast<std::size_t>(plan.src_extent()),
                        std::numeric_limits<double>::quiet_NaN());
  for (std::int64_t r = 0; r < plan.B * plan.S; ++r) {
    for (std::int64_t w = 0; w < plan.W; ++w) x[r * plan.src_row_stride + w] = row[w];
  }
  return x;
}

void expect_row(const std::vector<double>& out, std::int64_t row, const std::vector<double>& want,
                double tol) {
  const auto W = static_cast<std::int64_t>(want.size());
  for (std::int64_t w = 0; w < W; ++w) {
    EXPECT_NEAR(out[row * W + w], want[w], tol) << "row " << row << " column " << w;
  }
}

TEST(AxialRope, TwoByTwoGridD4) {
  // D = 4: one frequency f_0 = theta^0 = 1, so pair j = 0 (dims 0, 1) turns by
  // px·1 and pair j = 1 (dims 2, 3) by py·1. end_x = end_y = 2, S = 4:
  //   s = 0: px = 0, py = 0;  s = 1: px = 1, py = 0;
  //   s = 2: px = 0, py = 1;  s = 3: px = 1, py = 1.
  // Every row is x = [1, 2, 3, 4]; a pair (a, b) turned by 1 rad is
  // (a·cos1 − b·sin1, b·cos1 + a·sin1).
  const AxialRopePlan plan = plan_of(1, 4, 1, 2, 2);
  const std::vector<double> y = forward(plan, repeated_rows(plan, {1, 2, 3, 4}));
  expect_row(y, 0, {1, 2, 3, 4}, 0.0);
  expect_row(y, 1, {c1 - 2 * s1, 2 * c1 + s1, 3, 4}, 1e-15);
  expect_row(y, 2, {1, 2, 3 * c1 - 4 * s1, 4 * c1 + 3 * s1}, 1e-15);
  expect_row(y, 3, {c1 - 2 * s1, 2 * c1 + s1, 3 * c1 - 4 * s1, 4 * c1 + 3 * s1}, 1e-15);
}

TEST(AxialRope, SecondFrequencyAndANonSquareGrid) {
  // D = 8: f_0 = 1 and f_1 = theta^(−4/8) = theta^(−1/2); theta = 4/π² makes
  // f_1 = π/2. Pairs j = 0, 1 (dims 0..3) turn by px·f_0, px·f_1, pairs
  // j = 2, 3 (dims 4..7) by py·f_0, py·f_1. end_x = 3, end_y = 2, S = 6,
  // px = s mod 3, py = s div 3. Every row is x = [1..8].
  //   s = 1 (px 1, py 0): angles 1, π/2, 0, 0
  //     → [c1 − 2s1, 2c1 + s1, −4, 3, 5, 6, 7, 8]
  //   s = 5 (px 2, py 1): angles 2, π, 1, π/2
  //     → [c2 − 2s2, 2c2 + s2, −3, −4, 5c1 − 6s1, 6c1 + 5s1, −8, 7]
  const double theta = 4.0 / (std::numbers::pi * std::numbers::pi);
  const AxialRopePlan plan = plan_of(1, 8, 1, 3, 2, theta);
  const std::vector<double> y = forward(plan, repeated_rows(plan, {1, 2, 3, 4, 5, 6, 7, 8}));
  expect_row(y, 1, {c1 - 2 * s1, 2 * c1 + s1, -4, 3, 5, 6, 7, 8}, 1e-14);
  expect_row(y, 5, {c2 - 2 * s2, 2 * c2 + s2, -3, -4, 5 * c1 - 6 * s1, 6 * c1 + 5 * s1, -8, 7},
             1e-14);
}

TEST(AxialRope, RepeatFactorRepeatsThePositions) {
  // end_x = 2, end_y = 1, r = 2 → S = 4 and p = s mod 2: tokens 2 and 3 sit
  // where tokens 0 and 1 do. D = 4, every row [1, 2, 3, 4], py = 0 always:
  //   s = 0, 2: [1, 2, 3, 4];  s = 1, 3: [c1 − 2s1, 2c1 + s1, 3, 4]
  const AxialRopePlan plan = plan_of(1, 4, 1, 2, 1, 10000.0, 2);
  ASSERT_EQ(plan.S, 4);
  const std::vector<double> y = forward(plan, repeated_rows(plan, {1, 2, 3, 4}));
  for (std::int64_t s : {0, 2}) expect_row(y, s, {1, 2, 3, 4}, 0.0);
  for (std::int64_t s : {1, 3}) expect_row(y, s, {c1 - 2 * s1, 2 * c1 + s1, 3, 4}, 1e-15);
}

TEST(AxialRope, EveryHeadAndBatchTurnsAlike) {
  // W = 8, num_heads = 2 → D = 4; B' = 2. Token s = 3 of a 2×2 grid
  // (px = py = 1) turns every pair of both heads by 1 rad, in both batches:
  //   head 0 [1, 2, 3, 4] → [c1 − 2s1, 2c1 + s1, 3c1 − 4s1, 4c1 + 3s1]
  //   head 1 [5, 6, 7, 8] → [5c1 − 6s1, 6c1 + 5s1, 7c1 − 8s1, 8c1 + 7s1]
  const AxialRopePlan plan = plan_of(2, 8, 2, 2, 2);
  ASSERT_EQ(plan.D, 4);
  const std::vector<double> y = forward(plan, repeated_rows(plan, {1, 2, 3, 4, 5, 6, 7, 8}));
  const std::vector<double> want = {c1 - 2 * s1,     2 * c1 + s1,     3 * c1 - 4 * s1,
                                    4 * c1 + 3 * s1, 5 * c1 - 6 * s1, 6 * c1 + 5 * s1,
                                    7 * c1 - 8 * s1, 8 * c1 + 7 * s1};
  expect_row(y, 3, want, 1e-14);      // b = 0, s = 3
  expect_row(y, 4 + 3, want, 1e-14);  // b = 1, s = 3
  // A [B=1, H=2, S=4, D=4] input folds to B' = 2 batches of one head: the
  // same turns, head by head.
  tandem::AxialRopeAttrs a;
  a.end_x = 2;
  a.end_y = 2;
  const AxialRopePlan bhsd = AxialRopePlan::from_shapes({1, 2, 4, 4}, a);
  ASSERT_EQ(bhsd.B, 2);
  ASSERT_EQ(bhsd.D, 4);
  std::vector<double> x(32);
  for (std::size_t i = 0; i < 16; ++i) x[i] = static_cast<double>(i % 4 + 1);   // head 0
  for (std::size_t i = 16; i < 32; ++i) x[i] = static_cast<double>(i % 4 + 5);  // head 1
  const std::vector<double> yb = forward(bhsd, x);
  expect_row(yb, 3, {want[0], want[1], want[2], want[3]}, 1e-14);  // head 0, s = 3
  expect_row(yb, 7, {want[4], want[5], want[6], want[7]}, 1e-14);  // head 1, s = 3
}

TEST(AxialRope, StridedSourceSkipsTheGaps) {
  // Source row stride 6 for W = 4 (the gaps are NaN and must not be read);
  // 2×1 grid: s = 1 has px = 1. dy read with the same stride, turned by −1 rad:
  //   (a, b) → (a·cos1 + b·sin1, b·cos1 − a·sin1)
  const AxialRopePlan plan = plan_of(1, 4, 1, 2, 1, 10000.0, 1, 6);
  const std::vector<double> x = repeated_rows(plan, {1, 2, 3, 4});
  ASSERT_EQ(x.size(), 10u);
  const std::vector<double> y = forward(plan, x);
  expect_row(y, 0, {1, 2, 3, 4}, 0.0);
  expect_row(y, 1, {c1 - 2 * s1, 2 * c1 + s1, 3, 4}, 1e-15);
  const std::vector<double> dx = backward(plan, x);
  expect_row(dx, 0, {1, 2, 3, 4}, 0.0);
  expect_row(dx, 1, {c1 + 2 * s1, 2 * c1 - s1, 3, 4}, 1e-15);
}

TEST(AxialRope, BackwardIsTheTransposeOfForward) {
  // <axial(x), y> == <x, axial_backward(y)>, with two batches, two heads,
  // a repeat factor and a strided source (sums over the W columns only).
  const AxialRopePlan plan = plan_of(2, 16, 2, 3, 2, 100.0, 2, 19);
  const auto n = static_cast<std::size_t>(plan.src_extent());
  const std::vector<double> x = tandem::test::random_values<double>(n, 5),
                            y = tandem::test::random_values<double>(n, 6);
  const std::vector<double> fx = forward(plan, x), by = backward(plan, y);
  double lhs = 0.0, rhs = 0.0;
  for (std::int64_t r = 0; r < plan.B * plan.S; ++r) {
    for (std::int64_t w = 0; w < plan.W; ++w) {
      lhs += fx[r * plan.W + w] * y[r * plan.src_row_stride + w];
      rhs += x[r * plan.src_row_stride + w] * by[r * plan.W + w];
    }
  }
  EXPECT_NEAR(lhs, rhs, 1e-13);
  EXPECT_GT(std::abs(lhs), 1e-3);
}

TEST(AxialRope, BackwardUndoesForward) {
  // Each pair turns by a true angle, so the transpose is the inverse.
  const AxialRopePlan plan = plan_of(2, 16, 2, 3, 2, 100.0, 2);
  const std::vector<double> x =
      tandem::test::random_values<double>(static_cast<std::size_t>(plan.out_size()), 9);
  const std::vector<double> back = backward(plan, forward(plan, x));
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-14) << i;
}

TEST(AxialRope, Float32BackendAgreesWithDouble) {
  const AxialRopePlan plan = plan_of(1, 8, 1, 3, 2, 10000.0);
  const std::vector<double> x =
      tandem::test::random_values<double>(static_cast<std::size_t>(plan.out_size()), 3);
  const std::vector<float> xf(x.begin(), x.end());
  std::vector<float> yf(xf.size()), dxf(xf.size());
  const tandem::Backend b = tandem::reference::backend();
  b.axial_rope_forward(plan, xf, yf);
  b.axial_rope_backward(plan, xf, dxf);
  const std::vector<double> xd(xf.begin(), xf.end());
  const std::vector<double> y = forward(plan, xd), dx = backward(plan, xd);
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(yf[i], y[i], 1e-6) << i;
    EXPECT_NEAR(dxf[i], dx[i], 1e-6) << i;
  }
}

}  // namespace
