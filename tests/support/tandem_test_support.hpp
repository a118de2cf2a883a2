// SPDX-License-Identifier: Apache-2.0
/// @file tandem_test_support.hpp
/// @brief What the unit tests (tests/) and the property suite (props/) share:
///        guarded output buffers, bitwise and tolerance comparison, the
///        check that a call (AttentionPlan::make among them) throws
///        tandem::Error naming a parameter, seeded random values, attention
///        parameters in one line, and (with the optimized backend) a loop
///        over its SIMD targets.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "tandem/tandem.hpp"
#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"
#endif

namespace tandem::test {

/// The sentinel around and inside outputs before a call: a NaN with a
/// payload no kernel computes.
inline float sentinel() {
  return std::bit_cast<float>(0x7fa5a5a5u);
}
/// The junk written into every gap of an input (stride padding, table
/// padding): a NaN, so any read of it poisons the result.
inline float junk() {
  return std::bit_cast<float>(0x7fc0beefu);
}
inline bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}
inline bool is_sentinel(float x) {
  return same_bits(x, sentinel());
}

/// An output buffer of n floats with kGuard sentinels on either side; the
/// view handed to a kernel is exactly n long and starts as sentinels too.
class Guarded {
 public:
  static constexpr std::size_t kGuard = 16;
  explicit Guarded(std::int64_t n)
      : n_(static_cast<std::size_t>(n)), buf_(n_ + 2 * kGuard, sentinel()) {}
  [[nodiscard]] std::span<float> view() { return {buf_.data() + kGuard, n_}; }
  [[nodiscard]] std::vector<float> values() const {
    return {buf_.begin() + kGuard, buf_.begin() + static_cast<std::ptrdiff_t>(kGuard + n_)};
  }
  /// Empty when both guards still hold the sentinel, else where one was
  /// overwritten.
  [[nodiscard]] std::string guard_damage() const {
    for (std::size_t i = 0; i < kGuard; ++i) {
      if (!is_sentinel(buf_[i])) {
        return "wrote " + std::to_string(kGuard - i) + " element(s) before the output (value " +
               std::to_string(buf_[i]) + ")";
      }
      if (!is_sentinel(buf_[kGuard + n_ + i])) {
        return "wrote element " + std::to_string(n_ + i) + " past an output of " +
               std::to_string(n_) + " (value " + std::to_string(buf_[kGuard + n_ + i]) + ")";
      }
    }
    return {};
  }
  [[nodiscard]] bool guards_intact() const { return guard_damage().empty(); }
  /// Empty when every element of the view was written, else the first one
  /// that was not.
  [[nodiscard]] std::string unwritten() const {
    for (std::size_t i = 0; i < n_; ++i) {
      if (is_sentinel(buf_[kGuard + i])) {
        return "output element " + std::to_string(i) + " of " + std::to_string(n_) +
               " was never written";
      }
    }
    return {};
  }
  /// Whether no element of the view was written.
  [[nodiscard]] bool untouched() const {
    for (std::size_t i = 0; i < n_; ++i) {
      if (!is_sentinel(buf_[kGuard + i])) return false;
    }
    return true;
  }

 private:
  std::size_t n_;
  std::vector<float> buf_;
};

/// The sentinel of an output of T before a call, a value no kernel writes:
/// sentinel() for float, a NaN of both bfloat16 and float16 (0x7FA5) for the
/// 16-bit storage types.
template <class T>
T sentinel_of() {
  if constexpr (std::is_same_v<T, float>) {
    return sentinel();
  } else {
    static_assert(sizeof(T) == 2, "float, bfloat16 or float16");
    return T::from_bits(0x7FA5);
  }
}

/// Guarded for any output type T (bfloat16 and float16 outputs, a quantized
/// cache's code bytes), compared by bits: a view of n elements with kGuard
/// copies of `fill` on either side and in it, `fill` a value the kernel
/// never writes (sentinel_of<T>() by default).
template <class T>
class GuardedOf {
 public:
  static constexpr std::size_t kGuard = 16;
  explicit GuardedOf(std::int64_t n, T fill = sentinel_of<T>())
      : n_(static_cast<std::size_t>(n)), fill_(fill), buf_(n_ + 2 * kGuard, fill) {}
  [[nodiscard]] std::span<T> view() { return {buf_.data() + kGuard, n_}; }
  /// Every element `fill` again, in place (views taken before stay valid).
  void reset() { std::fill(buf_.begin(), buf_.end(), fill_); }
  /// Whether no element of the buffer, guards included, was written.
  [[nodiscard]] bool untouched() const { return std::all_of(buf_.begin(), buf_.end(), is_fill()); }
  /// Whether every element of the view was written and neither guard was.
  [[nodiscard]] bool written_within_guards() const {
    const auto view_begin = buf_.begin() + static_cast<std::ptrdiff_t>(kGuard);
    const auto view_end = view_begin + static_cast<std::ptrdiff_t>(n_);
    return std::all_of(buf_.begin(), view_begin, is_fill()) &&
           std::all_of(view_end, buf_.end(), is_fill()) &&
           std::none_of(view_begin, view_end, is_fill());
  }

 private:
  [[nodiscard]] auto is_fill() const {
    return [this](const T& x) { return std::memcmp(&x, &fill_, sizeof(T)) == 0; };
  }
  std::size_t n_;
  T fill_;
  std::vector<T> buf_;
};

/// Empty when every element satisfies `|got − exp| <= atol + rtol·|exp|`
/// (NaN matches only NaN, an infinity only the same infinity), otherwise a
/// message naming `what`, the first bad index, both values and the bound.
template <class G, class E>
std::string mismatch(const std::string& what, std::span<const G> got, std::span<const E> exp,
                     double atol, double rtol) {
  if (got.size() != exp.size()) {
    return what + ": " + std::to_string(got.size()) + " elements, expected " +
           std::to_string(exp.size());
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), e = static_cast<double>(exp[i]);
    bool ok;
    if (std::isnan(e) || std::isnan(g)) {
      ok = std::isnan(e) && std::isnan(g);
    } else if (std::isinf(e) || std::isinf(g)) {
      ok = g == e;
    } else {
      ok = std::abs(g - e) <= atol + rtol * std::abs(e);
    }
    if (!ok) {
      std::ostringstream os;
      os.precision(9);
      os << what << "[" << i << "] = " << g << ", expected " << e << " (|diff| " << std::abs(g - e)
         << " > atol " << atol << " + rtol " << rtol << "·|exp|)";
      return os.str();
    }
  }
  return {};
}
template <class G, class E>
std::string mismatch(const std::string& what, const std::vector<G>& got, const std::vector<E>& exp,
                     double atol, double rtol) {
  return mismatch(what, std::span<const G>(got), std::span<const E>(exp), atol, rtol);
}

/// As mismatch(), demanding identical bits.
inline std::string bit_mismatch(const std::string& what, std::span<const float> a,
                                std::span<const float> b) {
  if (a.size() != b.size()) return what + ": sizes differ";
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!same_bits(a[i], b[i])) {
      std::ostringstream os;
      os.precision(9);
      os << what << "[" << i << "] differs: " << a[i] << " vs " << b[i];
      return os.str();
    }
  }
  return {};
}
inline bool bitwise_equal(std::span<const float> a, std::span<const float> b) {
  return bit_mismatch("", a, b).empty();
}

/// GoogleTest: got agrees with want to `atol + rtol·|want|` (see mismatch).
template <class G, class E>
::testing::AssertionResult close(const std::vector<G>& got, const std::vector<E>& want, double rtol,
                                 double atol) {
  const std::string m = mismatch("element", got, want, atol, rtol);
  if (m.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << m;
}
/// GoogleTest: EXPECT_TRUE(close(...)).
template <class G, class E>
void expect_close(const std::vector<G>& got, const std::vector<E>& want, double rtol, double atol) {
  EXPECT_TRUE(close(got, want, rtol, atol));
}
/// GoogleTest: the same bits (NaNs included).
inline ::testing::AssertionResult bitwise(std::span<const float> a, std::span<const float> b) {
  const std::string m = bit_mismatch("element", a, b);
  if (m.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << m;
}

/// Whether two arrays of float or of a 16-bit storage type (bfloat16,
/// float16) hold the same bits, element for element (NaNs included).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  if constexpr (std::is_same_v<T, float>) {
    return bitwise_equal(a, b);
  } else {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                      [](const T& x, const T& y) { return x.bits == y.bits; });
  }
}

/// RN_T of each value: x stored as T (exact where x holds values of T).
template <class T>
std::vector<T> stored(const std::vector<float>& x) {
  std::vector<T> out;
  out.reserve(x.size());
  for (const float e : x) out.emplace_back(static_cast<double>(e));
  return out;
}

/// Each value of T as float32 (exact: every bf16 and f16 value is one).
template <class T>
std::vector<float> widened(const std::vector<T>& x) {
  std::vector<float> out;
  out.reserve(x.size());
  for (const T& e : x) out.push_back(static_cast<float>(static_cast<double>(e)));
  return out;
}

/// max |x_i| (0 for an empty x; the gaps of strided rows hold 0).
inline double max_abs(const std::vector<float>& x) {
  double m = 0.0;
  for (const float e : x) m = std::max(m, std::fabs(static_cast<double>(e)));
  return m;
}

/// GoogleTest: f() throws tandem::Error whose parameter() is `parameter`
/// and whose message contains every fragment.
template <class F>
void expect_error(F&& f, const std::string& parameter,
                  std::initializer_list<std::string> fragments = {}) {
  try {
    f();
  } catch (const tandem::Error& e) {
    EXPECT_EQ(e.parameter(), parameter) << "message: " << e.what();
    const std::string message = e.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message \"" << message << "\" lacks \"" << fragment << "\"";
    }
    return;
  }
  ADD_FAILURE() << "no tandem::Error thrown (expected one about " << parameter << ")";
}
/// GoogleTest: f() throws tandem::Error naming `parameter` with exactly
/// this message.
template <class F>
void expect_error_message(F&& f, const std::string& parameter, const std::string& message) {
  try {
    f();
  } catch (const tandem::Error& e) {
    EXPECT_EQ(e.parameter(), parameter);
    EXPECT_EQ(std::string(e.what()), message);
    return;
  }
  ADD_FAILURE() << "no error; expected: " << message;
}

/// GoogleTest: AttentionPlan::make(p) throws as expect_error() describes.
inline void expect_make_error(const AttentionParams& p, const std::string& parameter,
                              std::initializer_list<std::string> fragments = {}) {
  expect_error([&] { AttentionPlan::make(p); }, parameter, fragments);
}

/// Whether every element of a plain output, filled with sentinel() before a
/// call, still holds it (Guarded::untouched for a buffer without guards).
inline bool untouched(std::span<const float> x) {
  for (const float e : x) {
    if (!is_sentinel(e)) return false;
  }
  return true;
}

/// n values uniform in [lo, hi) from a generator seeded with `seed`.
template <class T = float>
std::vector<T> random_values(std::size_t n, unsigned seed, T lo = T(-1), T hi = T(1)) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<T> dist(lo, hi);
  std::vector<T> v(n);
  for (T& e : v) e = dist(gen);
  return v;
}

/// The inputs of one attention call held in T, shaped by their plan: q, k,
/// v and dout filled with `fill` (dout with `dout_fill`), the mask input all
/// 1 (keep every key), and the feature inputs (sinks, ALiBi slopes, packed
/// offsets, a paged cache's table and lengths) empty until a test sets them.
template <class T>
struct AttentionCase {
  AttentionPlan plan;
  std::vector<T> q, k, v, dout, sinks;
  std::vector<float> mask, slopes;
  std::vector<std::int32_t> cu_q, cu_k, used, table, lens;

  explicit AttentionCase(const AttentionParams& p, T dout_fill = T(0))
      : plan(AttentionPlan::make(p)),
        q(plan.q.extent, T(0)),
        k(plan.k.extent, T(0)),
        v(plan.v.extent, T(0)),
        dout(plan.o.extent, dout_fill),
        sinks(plan.sinks ? plan.H : 0, T(0)),
        mask(plan.mask_size(), 1.0f) {}

  [[nodiscard]] AttentionInputs<T> inputs() const {
    AttentionInputs<T> in{q, k, v, mask};
    in.sinks = sinks;
    in.alibi_slopes = slopes;
    in.cu_seqlens_q = cu_q;
    in.cu_seqlens_k = cu_k;
    in.seqused_k = used;
    in.block_table = table;
    in.cache_seqlens = lens;
    return in;
  }
};

/// Attention parameters in one line (window for sliding_window only).
inline AttentionParams attention_params(std::int64_t B, std::int64_t Sq, std::int64_t Sk,
                                        std::int64_t H, std::int64_t Hkv, std::int64_t D,
                                        std::int64_t Dv = 0, Layout layout = Layout::bshd,
                                        MaskKind mask = MaskKind::none, std::int64_t window = 0) {
  AttentionParams p;
  p.B = B;
  p.Sq = Sq;
  p.Sk = Sk;
  p.H = H;
  p.Hkv = Hkv;
  p.D = D;
  p.Dv = Dv;
  p.layout = layout;
  p.mask = mask;
  p.window = window;
  return p;
}

/// Attention attrs for AttentionPlan::from_shapes in one line.
inline AttentionAttrs attention_attrs(std::int64_t H, MaskKind mask = MaskKind::none) {
  AttentionAttrs a;
  a.num_heads = H;
  a.mask = mask;
  return a;
}

#ifdef TANDEM_HAVE_OPTIMIZED
/// GoogleTest: runs `body` once per Highway target this CPU supports, with
/// the optimized backend's dispatch forced onto it, and restores the default
/// choice afterwards.
inline void for_each_target(const std::function<void()>& body) {
  const std::vector<std::int64_t> targets = optimized::supported_targets();
  ASSERT_FALSE(targets.empty());
  for (const std::int64_t t : targets) {
    optimized::force_target(t);
    SCOPED_TRACE("target " + optimized::target_name(t));
    body();
  }
  optimized::force_target(0);
}

/// As for_each_target, then once more on the best target with the bf16
/// forward's AVX512-BF16 products switched on where this CPU has them
/// (optimized::enable_bf16_dot, off by default): every path a bf16 call can
/// take here.
inline void for_each_path(const std::function<void()>& body) {
  for_each_target(body);
  if (!optimized::bf16_dot_supported()) return;
  optimized::enable_bf16_dot(true);
  SCOPED_TRACE("target " + optimized::current_target() + ", bf16 dot products on");
  body();
  optimized::enable_bf16_dot(false);
}
#endif

}  // namespace tandem::test
