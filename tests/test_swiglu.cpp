// SPDX-License-Identifier: Apache-2.0
// SwiGLU (SPEC §6): silu at points where σ is known by hand, both gate
// orders, the backward at hand-worked points and against finite differences
// and the complex step.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/reference/swiglu.hpp"
#include "tandem/swiglu.hpp"

namespace {

using tandem::SwigluPlan;

const double ln3 = std::log(3.0);

std::vector<double> forward(const SwigluPlan& plan, const std::vector<double>& x) {
  std::vector<double> y(static_cast<std::size_t>(plan.out_size()));
  tandem::reference::swiglu_forward<double>(plan, x, std::span<double>(y));
  return y;
}

std::vector<double> backward(const SwigluPlan& plan, const std::vector<double>& x,
                             const std::vector<double>& dy) {
  std::vector<double> dx(static_cast<std::size_t>(plan.in_size()));
  tandem::reference::swiglu_backward<double>(plan, x, dy, std::span<double>(dx));
  return dx;
}

// Hand values used below:
//   σ(0) = 1/(1 + e^0) = 1/2, silu(0) = 0·1/2 = 0
//   σ(ln 3) = 1/(1 + 1/3) = 3/4, silu(ln 3) = (3/4)·ln 3
//   σ(−ln 3) = 1/(1 + 3) = 1/4, silu(−ln 3) = −(1/4)·ln 3

TEST(Swiglu, ForwardAtKnownSigmaGateFirst) {
  // One row, n = 3, gate first: x = [g | u] = [0, ln3, −ln3 | 5, 2, 4]
  //   y0 = silu(0)·5 = 0
  //   y1 = (3/4)·ln3·2 = 1.5·ln3
  //   y2 = −(1/4)·ln3·4 = −ln3
  const SwigluPlan plan = SwigluPlan::from_shapes({1, 6}, true);
  const std::vector<double> y = forward(plan, {0, ln3, -ln3, 5, 2, 4});
  EXPECT_EQ(y[0], 0.0);
  EXPECT_NEAR(y[1], 1.5 * ln3, 1e-15);
  EXPECT_NEAR(y[2], -ln3, 1e-15);
}

TEST(Swiglu, ForwardUpFirstTakesTheGateFromTheSecondHalf) {
  // The same numbers with the halves swapped: x = [u | g] = [5, 2, 4 | 0, ln3, −ln3]
  // gives the same y; read gate-first it would be a different function
  // (y1 = silu(2)·ln3 ≈ 1.76·1.10).
  const SwigluPlan plan = SwigluPlan::from_shapes({1, 6}, false);
  const std::vector<double> y = forward(plan, {5, 2, 4, 0, ln3, -ln3});
  EXPECT_EQ(y[0], 0.0);
  EXPECT_NEAR(y[1], 1.5 * ln3, 1e-15);
  EXPECT_NEAR(y[2], -ln3, 1e-15);
}

TEST(Swiglu, RowsAreIndependent) {
  // x [2, 2, 2] = 4 rows of [g | u] (n = 1): y_r = silu(g_r)·u_r.
  //   [ln3 | 4] → 3·ln3,  [0 | 7] → 0,  [−ln3 | −8] → 2·ln3,  [ln3 | 0] → 0
  const SwigluPlan plan = SwigluPlan::from_shapes({2, 2, 2}, true);
  ASSERT_EQ(plan.rows, 4);
  ASSERT_EQ(plan.n, 1);
  const std::vector<double> y = forward(plan, {ln3, 4, 0, 7, -ln3, -8, ln3, 0});
  EXPECT_NEAR(y[0], 3 * ln3, 1e-15);
  EXPECT_EQ(y[1], 0.0);
  EXPECT_NEAR(y[2], 2 * ln3, 1e-15);
  EXPECT_EQ(y[3], 0.0);
}

TEST(Swiglu, BackwardAtHandPointsInBothHalfOrders) {
  // dg = dy·u·σ(g)·(1 + g·(1 − σ(g))), du = dy·silu(g).
  //   (g, u, dy) = (ln3, 2, 1): du = (3/4)·ln3;
  //       dg = 1·2·(3/4)·(1 + ln3·(1/4)) = 1.5 + 0.375·ln3
  //   (g, u, dy) = (0, 5, 2):   du = 2·0 = 0;  dg = 2·5·(1/2)·(1 + 0) = 5
  //   (g, u, dy) = (−ln3, 4, −1): du = −1·(−(1/4)·ln3) = ln3/4;
  //       dg = −1·4·(1/4)·(1 − ln3·(3/4)) = −1 + 0.75·ln3
  const double dg0 = 1.5 + 0.375 * ln3, du0 = 0.75 * ln3;
  const double dg1 = 5.0, du1 = 0.0;
  const double dg2 = -1.0 + 0.75 * ln3, du2 = 0.25 * ln3;
  const std::vector<double> dy = {1, 2, -1};
  {
    const SwigluPlan plan = SwigluPlan::from_shapes({6}, true);
    const std::vector<double> dx = backward(plan, {ln3, 0, -ln3, 2, 5, 4}, dy);
    // dx = [dg | du]
    EXPECT_NEAR(dx[0], dg0, 1e-15);
    EXPECT_NEAR(dx[1], dg1, 1e-15);
    EXPECT_NEAR(dx[2], dg2, 1e-15);
    EXPECT_NEAR(dx[3], du0, 1e-15);
    EXPECT_EQ(dx[4], du1);
    EXPECT_NEAR(dx[5], du2, 1e-15);
  }
  {
    const SwigluPlan plan = SwigluPlan::from_shapes({6}, false);
    const std::vector<double> dx = backward(plan, {2, 5, 4, ln3, 0, -ln3}, dy);
    // dx = [du | dg], in the input's half order
    EXPECT_NEAR(dx[0], du0, 1e-15);
    EXPECT_EQ(dx[1], du1);
    EXPECT_NEAR(dx[2], du2, 1e-15);
    EXPECT_NEAR(dx[3], dg0, 1e-15);
    EXPECT_NEAR(dx[4], dg1, 1e-15);
    EXPECT_NEAR(dx[5], dg2, 1e-15);
  }
}

TEST(Swiglu, BackwardMatchesCentralDifferences) {
  // L(x) = <swiglu(x), dy>; dL/dx_k ≈ (L(x + h e_k) − L(x − h e_k)) / 2h,
  // with error O(h²) ≈ 1e-10 for h = 1e-5 and values of order 1.
  for (bool gate_first : {true, false}) {
    const SwigluPlan plan = SwigluPlan::from_shapes({3, 8}, gate_first);
    const std::vector<double> x = tandem::test::random_values<double>(24, 1, -3.0, 3.0),
                              dy = tandem::test::random_values<double>(12, 2, -1.0, 1.0);
    const std::vector<double> dx = backward(plan, x, dy);
    const auto loss = [&](const std::vector<double>& xx) {
      const std::vector<double> y = forward(plan, xx);
      double l = 0.0;
      for (std::size_t i = 0; i < y.size(); ++i) l += y[i] * dy[i];
      return l;
    };
    const double h = 1e-5;
    for (std::size_t k = 0; k < x.size(); ++k) {
      std::vector<double> xp = x, xm = x;
      xp[k] += h;
      xm[k] -= h;
      const double fd = (loss(xp) - loss(xm)) / (2 * h);
      EXPECT_NEAR(dx[k], fd, 1e-8) << "k = " << k << " gate_first = " << gate_first;
    }
  }
}

TEST(Swiglu, BackwardMatchesTheComplexStep) {
  // For an analytic f, Im f(x + i·h·e_k) / h = ∂f/∂x_k + O(h²) with no
  // cancellation, so h = 1e-20 gives the derivative to rounding.
  using C = std::complex<double>;
  for (bool gate_first : {true, false}) {
    const SwigluPlan plan = SwigluPlan::from_shapes({2, 6}, gate_first);
    const std::vector<double> x = tandem::test::random_values<double>(12, 3, -4.0, 4.0),
                              dy = tandem::test::random_values<double>(6, 4, -1.0, 1.0);
    const std::vector<double> dx = backward(plan, x, dy);
    const double h = 1e-20;
    for (std::size_t k = 0; k < x.size(); ++k) {
      std::vector<C> xc(x.begin(), x.end());
      xc[k] += C(0.0, h);
      std::vector<C> yc(static_cast<std::size_t>(plan.out_size()));
      tandem::reference::swiglu_forward<C>(plan, xc, std::span<C>(yc));
      double d = 0.0;
      for (std::size_t i = 0; i < yc.size(); ++i) d += yc[i].imag() / h * dy[i];
      EXPECT_NEAR(dx[k], d, 1e-14 * (1.0 + std::abs(d))) << "k = " << k;
    }
  }
}

TEST(Swiglu, Float32BackendAgreesWithDouble) {
  const SwigluPlan plan = SwigluPlan::from_shapes({4, 10}, true);
  const std::vector<double> x0 = tandem::test::random_values<double>(40, 5, -5.0, 5.0),
                            dy0 = tandem::test::random_values<double>(20, 6, -1.0, 1.0);
  const std::vector<float> xf(x0.begin(), x0.end()), dyf(dy0.begin(), dy0.end());
  std::vector<float> yf(20), dxf(40);
  const tandem::Backend b = tandem::reference::backend();
  b.swiglu_forward(plan, xf, yf);
  b.swiglu_backward(plan, xf, dyf, dxf);
  const std::vector<double> x(xf.begin(), xf.end()), dy(dyf.begin(), dyf.end());
  const std::vector<double> y = forward(plan, x), dx = backward(plan, x, dy);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(yf[i], y[i], 1e-6 * (1 + std::abs(y[i])));
  for (std::size_t i = 0; i < dx.size(); ++i) {
    EXPECT_NEAR(dxf[i], dx[i], 1e-6 * (1 + std::abs(dx[i])));
  }
}

}  // namespace
