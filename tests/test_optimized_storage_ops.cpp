// SPDX-License-Identifier: Apache-2.0
// The optimized RoPE, axial RoPE and SwiGLU at bf16 and f16 storage (SPEC
// §10.2), on every Highway target this CPU supports:
//  - each output is RN_T of the float call's output on the widened inputs
//    (and widened tables), bit for bit: the low-precision kernels widen on
//    load, compute exactly what the float kernel computes, and round once;
//  - the backward is the transpose of the forward in bf16 within the bound
//    derived at transpose_bound below;
//  - the bits do not depend on the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/tandem.hpp"

#ifdef TANDEM_HAVE_OPTIMIZED

namespace {

using tandem::bfloat16;
using tandem::float16;
using tandem::test::stored;
using tandem::test::widened;

/// n values of T uniform in [lo, hi) before rounding.
template <class T>
std::vector<T> random_stored(std::int64_t n, unsigned seed, float lo = -4.0f, float hi = 4.0f) {
  return stored<T>(tandem::test::random_values(static_cast<std::size_t>(n), seed, lo, hi));
}

/// An output of n values of T, with 16 guard values on either side, all
/// holding a NaN no kernel writes until the call.
template <class T>
class GuardedOut {
 public:
  static constexpr std::size_t kGuard = 16;
  explicit GuardedOut(std::int64_t n)
      : n_(static_cast<std::size_t>(n)), buf_(n_ + 2 * kGuard, T::from_bits(0x7FA5)) {}
  [[nodiscard]] std::span<T> view() { return {buf_.data() + kGuard, n_}; }
  [[nodiscard]] std::vector<T> values() const {
    return {buf_.begin() + kGuard, buf_.begin() + static_cast<std::ptrdiff_t>(kGuard + n_)};
  }
  [[nodiscard]] bool guards_intact() const {
    for (std::size_t i = 0; i < kGuard; ++i) {
      if (buf_[i].bits != 0x7FA5 || buf_[kGuard + n_ + i].bits != 0x7FA5) return false;
    }
    return true;
  }

 private:
  std::size_t n_;
  std::vector<T> buf_;
};

/// got[i] has the bits of RN_T(f32[i]) for every i (and the guards held).
template <class T>
::testing::AssertionResult rounds_float(const GuardedOut<T>& got, const std::vector<float>& f32) {
  if (!got.guards_intact()) return ::testing::AssertionFailure() << "wrote outside its output";
  const std::vector<T> g = got.values();
  if (g.size() != f32.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (std::size_t i = 0; i < g.size(); ++i) {
    const T want(static_cast<double>(f32[i]));
    if (g[i].bits != want.bits) {
      return ::testing::AssertionFailure()
             << "element " << i << ": bits " << g[i].bits << " (" << static_cast<float>(g[i])
             << "), want RN_T(" << f32[i] << ") = bits " << want.bits;
    }
  }
  return ::testing::AssertionSuccess();
}

/// A RoPE case: plan, source, tables and positions in T, and the same
/// widened to float.
template <class T>
struct RopeCase {
  tandem::RopePlan plan;
  std::vector<T> x, cos, sin;
  std::vector<std::int32_t> positions;

  /// Random x, and tables of angles uniform in [lo, hi).
  RopeCase(const tandem::RopeParams& p, unsigned seed, float lo = -3.2f, float hi = 3.2f)
      : plan(tandem::RopePlan::make(p)) {
    x = random_stored<T>(plan.src_extent(), seed);
    std::vector<float> c(static_cast<std::size_t>(plan.R * plan.T));
    std::vector<float> s(c.size());
    std::mt19937 gen(seed + 1);
    std::uniform_real_distribution<float> angle(lo, hi);
    for (std::size_t i = 0; i < c.size(); ++i) {
      const float a = angle(gen);
      c[i] = std::cos(a);
      s[i] = std::sin(a);
    }
    cos = stored<T>(c);
    sin = stored<T>(s);
    if (plan.rows == tandem::TableRows::position_ids) {
      std::uniform_int_distribution<std::int32_t> row(0, static_cast<std::int32_t>(plan.R - 1));
      for (std::int64_t i = 0; i < plan.B * plan.S; ++i) positions.push_back(row(gen));
    }
  }
  [[nodiscard]] tandem::RopeTables<T> tables() const { return {cos, sin, positions}; }
};

/// The tables of c widened to float (positions shared).
template <class T>
struct WideTables {
  std::vector<float> cos, sin;
  explicit WideTables(const RopeCase<T>& c) : cos(widened(c.cos)), sin(widened(c.sin)) {}
  [[nodiscard]] tandem::RopeTables<float> of(const RopeCase<T>& c) const {
    return {cos, sin, c.positions};
  }
};

/// RoPE parameters in one line.
tandem::RopeParams rope_params(std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D,
                               std::int64_t n_rot, tandem::RopeStyle style,
                               tandem::RopeLayout layout, tandem::TableRows rows, std::int64_t R,
                               std::int64_t table_stride = 0, std::int64_t src_row_stride = 0) {
  tandem::RopeParams p;
  p.batch = B;
  p.seq = S;
  p.width = H * D;
  p.head_dim = D;
  p.n_rot = n_rot;
  p.style = style;
  p.layout = layout;
  p.rows = rows;
  p.table_rows = R;
  p.table_stride = table_stride;
  p.src_row_stride = src_row_stride;
  return p;
}

/// Cases with every style and layout, tails of every vector width
/// (m = 10, 19, 6), pass-through dims, padded tables and rows, and
/// position ids.
std::vector<tandem::RopeParams> rope_cases() {
  using tandem::RopeLayout, tandem::RopeStyle, tandem::TableRows;
  return {
      rope_params(2, 5, 3, 20, 20, RopeStyle::neox, RopeLayout::bshd, TableRows::position, 7),
      rope_params(1, 130, 2, 38, 38, RopeStyle::gptj, RopeLayout::bhsd, TableRows::position, 130),
      rope_params(2, 3, 2, 16, 12, RopeStyle::neox, RopeLayout::bhsd, TableRows::token, 6, 9),
      rope_params(1, 9, 2, 14, 12, RopeStyle::gptj, RopeLayout::thd, TableRows::position_ids, 20, 6,
                  40),
      rope_params(3, 4, 1, 64, 64, RopeStyle::neox, RopeLayout::bshd, TableRows::token, 12),
  };
}

template <class T>
void expect_rope_rounds_float() {
  const tandem::Backend opt = tandem::optimized::backend();
  const tandem::Kernels<T>& k = opt.kernels<T>();
  unsigned seed = 100;
  for (const tandem::RopeParams& p : rope_cases()) {
    const RopeCase<T> c(p, seed++);
    SCOPED_TRACE(c.plan.describe());
    const std::vector<float> x = widened(c.x);
    const WideTables<T> wide(c);
    for (const bool backward : {false, true}) {
      SCOPED_TRACE(backward ? "backward" : "forward");
      std::vector<float> f32(static_cast<std::size_t>(c.plan.out_size()));
      GuardedOut<T> got(c.plan.out_size());
      (backward ? opt.rope_backward : opt.rope_forward)(c.plan, x, wide.of(c), f32);
      (backward ? k.rope_backward : k.rope_forward)(c.plan, c.x, c.tables(), got.view());
      EXPECT_TRUE(rounds_float(got, f32));
    }
  }
}

template <class T>
void expect_rope_qk_rounds_float() {
  const tandem::Backend opt = tandem::optimized::backend();
  const tandem::Kernels<T>& k = opt.kernels<T>();
  tandem::RopeQkParams p;
  p.q = rope_params(2, 7, 4, 22, 22, tandem::RopeStyle::gptj, tandem::RopeLayout::bshd,
                    tandem::TableRows::position, 9);
  p.k_width = 2 * 22;
  const tandem::RopeQkPlan plan = tandem::RopeQkPlan::make(p);
  const RopeCase<T> c(p.q, 7);
  const std::vector<T> kx = random_stored<T>(plan.k.src_extent(), 8);
  const std::vector<float> qf = widened(c.x), kf = widened(kx);
  const WideTables<T> wide(c);
  for (const bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "backward" : "forward");
    std::vector<float> q32(static_cast<std::size_t>(plan.q.out_size()));
    std::vector<float> k32(static_cast<std::size_t>(plan.k.out_size()));
    GuardedOut<T> q_got(plan.q.out_size()), k_got(plan.k.out_size());
    (backward ? opt.rope_backward_qk : opt.rope_forward_qk)(plan, qf, kf, wide.of(c), q32, k32);
    (backward ? k.rope_backward_qk : k.rope_forward_qk)(plan, c.x, kx, c.tables(), q_got.view(),
                                                        k_got.view());
    EXPECT_TRUE(rounds_float(q_got, q32));
    EXPECT_TRUE(rounds_float(k_got, k32));
  }
}

/// Axial RoPE cases: D = 8 (pairs per half 2), D = 44 (11, a tail on every
/// target), a repeated grid and padded rows.
std::vector<tandem::AxialRopeParams> axial_cases() {
  std::vector<tandem::AxialRopeParams> out;
  tandem::AxialRopeParams p;
  p.batch = 2, p.end_x = 3, p.end_y = 2, p.seq = 6, p.num_heads = 2, p.width = 16;
  out.push_back(p);
  p.batch = 1, p.end_x = 4, p.end_y = 3, p.repeat_factor = 2, p.seq = 24, p.num_heads = 3;
  p.width = 3 * 44, p.src_row_stride = 3 * 44 + 5, p.theta = 100.0;
  out.push_back(p);
  return out;
}

template <class T>
void expect_axial_rounds_float() {
  const tandem::Backend opt = tandem::optimized::backend();
  const tandem::Kernels<T>& k = opt.kernels<T>();
  unsigned seed = 200;
  for (const tandem::AxialRopeParams& p : axial_cases()) {
    const tandem::AxialRopePlan plan = tandem::AxialRopePlan::make(p);
    SCOPED_TRACE(plan.describe());
    const std::vector<T> x = random_stored<T>(plan.src_extent(), seed++);
    const std::vector<float> xf = widened(x);
    for (const bool backward : {false, true}) {
      SCOPED_TRACE(backward ? "backward" : "forward");
      std::vector<float> f32(static_cast<std::size_t>(plan.out_size()));
      GuardedOut<T> got(plan.out_size());
      (backward ? opt.axial_rope_backward : opt.axial_rope_forward)(plan, xf, f32);
      (backward ? k.axial_rope_backward : k.axial_rope_forward)(plan, x, got.view());
      EXPECT_TRUE(rounds_float(got, f32));
    }
  }
}

template <class T>
void expect_swiglu_rounds_float() {
  const tandem::Backend opt = tandem::optimized::backend();
  const tandem::Kernels<T>& k = opt.kernels<T>();
  unsigned seed = 300;
  for (const bool gate_first : {true, false}) {
    for (const std::int64_t n : {1, 7, 37, 64}) {
      const tandem::SwigluPlan plan = tandem::SwigluPlan::make({3, n, gate_first});
      SCOPED_TRACE(plan.describe());
      // gates out to ±20, where σ saturates
      const std::vector<T> x = random_stored<T>(plan.in_size(), seed++, -20.0f, 20.0f);
      const std::vector<T> dy = random_stored<T>(plan.out_size(), seed++);
      const std::vector<float> xf = widened(x), dyf = widened(dy);
      std::vector<float> y32(static_cast<std::size_t>(plan.out_size()));
      GuardedOut<T> y(plan.out_size());
      opt.swiglu_forward(plan, xf, y32);
      k.swiglu_forward(plan, x, y.view());
      EXPECT_TRUE(rounds_float(y, y32));
      std::vector<float> dx32(static_cast<std::size_t>(plan.in_size()));
      GuardedOut<T> dx(plan.in_size());
      opt.swiglu_backward(plan, xf, dyf, dx32);
      k.swiglu_backward(plan, x, dy, dx.view());
      EXPECT_TRUE(rounds_float(dx, dx32));
    }
  }
}

TEST(OptimizedStorageOps, RopeIsTheFloatRopeRoundedOnceOnEveryTarget) {
  tandem::test::for_each_target([] {
    expect_rope_rounds_float<bfloat16>();
    expect_rope_rounds_float<float16>();
  });
}

TEST(OptimizedStorageOps, RopeQkIsTheFloatRopeQkRoundedOnceOnEveryTarget) {
  tandem::test::for_each_target([] {
    expect_rope_qk_rounds_float<bfloat16>();
    expect_rope_qk_rounds_float<float16>();
  });
}

TEST(OptimizedStorageOps, AxialRopeIsTheFloatAxialRopeRoundedOnceOnEveryTarget) {
  tandem::test::for_each_target([] {
    expect_axial_rounds_float<bfloat16>();
    expect_axial_rounds_float<float16>();
  });
}

TEST(OptimizedStorageOps, SwigluIsTheFloatSwigluRoundedOnceOnEveryTarget) {
  tandem::test::for_each_target([] {
    expect_swiglu_rounds_float<bfloat16>();
    expect_swiglu_rounds_float<float16>();
  });
}

/// The bound on |<F(x), y> − <x, G(y)>| for a stored rotation F (forward)
/// and G (backward) of x and y of type T, where exactly <Rx, y> = <x, Rᵀy>
/// (G rotates with the same table values, sines negated: the transpose).
///
/// Each rotated output is f = fma(x_i, c, −fl(x_p·s)) in float (x_p the
/// other member of its pair), then RN_T(f). With u = 2^−24 and |c|, |s| <= 1:
/// |f − (Rx)_i| <= u·|x_p s| + u·(|x_i c| + (1+u)|x_p s|) <= 2.001u·a_i,
/// a_i = |x_i c| + |x_p s| <= |x_i| + |x_p| = P(x)_i; the rounding to T
/// adds at most u_T·|f| + η_T (η_T half T's smallest subnormal spacing, for
/// results below T's normal range), so |F_i − (Rx)_i| <= (u_T + 2.01u)·P(x)_i
/// + η_T. Summed against |y_i|, likewise for G, plus the double rounding of
/// the two inner products:
///
///     B = (u_T + 2.01u)·(Σ P(x)_i|y_i| + Σ |x_i|P(y)_i) + η_T·(Σ|y_i| + Σ|x_i|)
///         + 10^−12·(Σ|F_i y_i| + Σ|x_i G_i|)
template <class T>
double transpose_bound(const std::vector<float>& x, const std::vector<float>& y,
                       const std::vector<float>& fx, const std::vector<float>& gy,
                       const std::vector<std::size_t>& partner) {
  const double u = std::ldexp(1.0, -24);
  const double u_t = tandem::storage_traits<T>::unit_roundoff;
  const double eta = std::is_same_v<T, bfloat16> ? std::ldexp(1.0, -134) : std::ldexp(1.0, -25);
  double pairs = 0, sums = 0, products = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t p = partner[i];
    pairs += (std::abs(x[i]) + std::abs(x[p])) * std::abs(y[i]);
    pairs += std::abs(x[i]) * (std::abs(y[i]) + std::abs(y[p]));
    sums += std::abs(x[i]) + std::abs(y[i]);
    products += std::abs(double(fx[i]) * y[i]) + std::abs(double(x[i]) * gy[i]);
  }
  return (u_t + 2.01 * u) * pairs + eta * sums + 1e-12 * products;
}

/// <a, b> in double.
double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

/// The other member of element i's pair in a contiguous `[.., D]` tensor
/// whose every dim rotates: i ± D/2 within a head (NeoX) or i ^ 1 (GPT-J,
/// axial RoPE).
std::vector<std::size_t> partners(std::size_t n, std::size_t D, bool interleaved) {
  std::vector<std::size_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t j = i % D, m = D / 2;
    out[i] = interleaved ? (i ^ 1u) : (j < m ? i + m : i - m);
  }
  return out;
}

/// y with each pair (y_i, y_p) = (−x_p, x_i), i the first member: x turned
/// by a quarter, exactly, so that x_i·y_p − x_p·y_i = x_i² + x_p² > 0.
template <class T>
std::vector<T> quarter_turn(const std::vector<T>& x, const std::vector<std::size_t>& partner) {
  std::vector<T> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t p = partner[i];
    y[i] = i < p ? T::from_bits(static_cast<std::uint16_t>(x[p].bits ^ 0x8000u)) : x[p];
  }
  return y;
}

/// For x and y of T, rotated by `forward` and `backward` (each `(src, dst)`):
/// |<F(x), y> − <x, G(y)>| <= B (transpose_bound), for a random y and for
/// y = quarter_turn(x). With all sines >= 0 the second y also shows that B
/// can fail: G = F (a forward where the transpose is due) misses it by
/// Σ 2·s·(x_i² + x_p²), over ten times B.
template <class T, class Rotate>
void expect_transpose(const std::vector<T>& x, const std::vector<T>& random_y,
                      const std::vector<std::size_t>& partner, const Rotate& forward,
                      const Rotate& backward) {
  const auto rotated = [](const Rotate& f, const std::vector<T>& src) {
    GuardedOut<T> out(static_cast<std::int64_t>(src.size()));
    f(std::span<const T>(src), out.view());
    EXPECT_TRUE(out.guards_intact());
    return widened(out.values());
  };
  const std::vector<float> xf = widened(x), fx = rotated(forward, x);
  for (const bool turned : {false, true}) {
    SCOPED_TRACE(turned ? "y = quarter turn of x" : "random y");
    const std::vector<T> y = turned ? quarter_turn(x, partner) : random_y;
    const std::vector<float> yf = widened(y), gy = rotated(backward, y);
    const double bound = transpose_bound<T>(xf, yf, fx, gy, partner);
    EXPECT_LE(std::abs(dot(fx, yf) - dot(xf, gy)), bound);
    if (turned) {
      EXPECT_GT(std::abs(dot(fx, yf) - dot(xf, rotated(forward, y))), 10 * bound);
    }
  }
}

/// The transpose identity for RoPE (both styles) and axial RoPE at storage
/// type T, every sine >= 0 (angles in [0, π)).
template <class T>
void expect_transpose_within_bound() {
  const tandem::Backend opt = tandem::optimized::backend();
  const tandem::Kernels<T>& k = opt.kernels<T>();
  using tandem::RopeLayout, tandem::RopeStyle, tandem::TableRows;
  using Rotate = std::function<void(std::span<const T>, std::span<T>)>;
  for (const RopeStyle style : {RopeStyle::neox, RopeStyle::gptj}) {
    const RopeCase<T> c(
        rope_params(2, 33, 3, 26, 26, style, RopeLayout::bshd, TableRows::position, 33), 400, 0.0f,
        3.14f);
    SCOPED_TRACE(c.plan.describe());
    const Rotate forward = [&](std::span<const T> src, std::span<T> dst) {
      k.rope_forward(c.plan, src, c.tables(), dst);
    };
    const Rotate backward = [&](std::span<const T> src, std::span<T> dst) {
      k.rope_backward(c.plan, src, c.tables(), dst);
    };
    expect_transpose(c.x, random_stored<T>(c.plan.out_size(), 401),
                     partners(c.x.size(), 26, style == RopeStyle::gptj), forward, backward);
  }
  // angles px·f_k, py·f_k <= 2 < π
  tandem::AxialRopeParams p;
  p.batch = 2, p.end_x = 3, p.end_y = 3, p.repeat_factor = 2, p.seq = 18, p.num_heads = 2;
  p.width = 2 * 40;
  const tandem::AxialRopePlan plan = tandem::AxialRopePlan::make(p);
  SCOPED_TRACE(plan.describe());
  const Rotate forward = [&](std::span<const T> src, std::span<T> dst) {
    k.axial_rope_forward(plan, src, dst);
  };
  const Rotate backward = [&](std::span<const T> src, std::span<T> dst) {
    k.axial_rope_backward(plan, src, dst);
  };
  const std::vector<T> x = random_stored<T>(plan.src_extent(), 402);
  expect_transpose(x, random_stored<T>(plan.out_size(), 403), partners(x.size(), 40, true), forward,
                   backward);
}

TEST(OptimizedStorageOps, BackwardIsTheTransposeWithinItsBoundOnEveryTarget) {
  tandem::test::for_each_target([] {
    expect_transpose_within_bound<bfloat16>();
    expect_transpose_within_bound<float16>();
  });
}

/// Bitwise the same output of T for 1 and 3 threads: RoPE by token and by
/// head, axial RoPE, SwiGLU forward and backward.
template <class T>
void expect_thread_count_invariant() {
  const tandem::Backend one = tandem::optimized::backend(tandem::optimized::Options(1));
  const tandem::Backend three = tandem::optimized::backend(tandem::optimized::Options(3));
  const auto same = [](const GuardedOut<T>& a, const GuardedOut<T>& b) {
    const std::vector<T> x = a.values(), y = b.values();
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (x[i].bits != y[i].bits) return false;
    }
    return a.guards_intact() && b.guards_intact();
  };
  for (const tandem::RopeParams& p : rope_cases()) {
    const RopeCase<T> c(p, 500);
    GuardedOut<T> a(c.plan.out_size()), b(c.plan.out_size());
    one.kernels<T>().rope_forward(c.plan, c.x, c.tables(), a.view());
    three.kernels<T>().rope_forward(c.plan, c.x, c.tables(), b.view());
    EXPECT_TRUE(same(a, b)) << c.plan.describe();
  }
  for (const tandem::AxialRopeParams& p : axial_cases()) {
    const tandem::AxialRopePlan plan = tandem::AxialRopePlan::make(p);
    const std::vector<T> x = random_stored<T>(plan.src_extent(), 501);
    GuardedOut<T> a(plan.out_size()), b(plan.out_size());
    one.kernels<T>().axial_rope_backward(plan, x, a.view());
    three.kernels<T>().axial_rope_backward(plan, x, b.view());
    EXPECT_TRUE(same(a, b)) << plan.describe();
  }
  const tandem::SwigluPlan plan = tandem::SwigluPlan::make({7, 37, false});
  const std::vector<T> x = random_stored<T>(plan.in_size(), 502, -20.0f, 20.0f);
  const std::vector<T> dy = random_stored<T>(plan.out_size(), 503);
  GuardedOut<T> a(plan.in_size()), b(plan.in_size());
  one.kernels<T>().swiglu_backward(plan, x, dy, a.view());
  three.kernels<T>().swiglu_backward(plan, x, dy, b.view());
  EXPECT_TRUE(same(a, b)) << plan.describe();
}

TEST(OptimizedStorageOps, ResultsDoNotDependOnTheThreadCount) {
  expect_thread_count_invariant<bfloat16>();
  expect_thread_count_invariant<float16>();
}

}  // namespace

#endif  // TANDEM_HAVE_OPTIMIZED
