// SPDX-License-Identifier: Apache-2.0
/// @file support.hpp
/// @brief What every property shares: strided placement of logical tensors,
///        the reference at any scalar type, and the registry of backends and
///        properties; guarded output buffers and NaN-aware comparison come
///        from the test-support header shared with tests/.
///
/// Logical tensors are always held in `bshd` order `[B, S, heads, width]`;
/// place() writes one into memory by a plan's Strides (junk in every gap)
/// and gather() reads it back, so properties never depend on a layout.
#pragma once

#include <rapidcheck.h>

#include <bit>
#include <complex>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "broken/broken.hpp"
#include "support/tandem_test_support.hpp"
#include "tandem/tandem.hpp"

namespace tandem::props {

using i64 = std::int64_t;

/// float32 machine epsilon.
inline constexpr double kEps = 1.1920928955078125e-07;

using test::bit_mismatch;
using test::Guarded;
using test::is_sentinel;
using test::junk;
using test::mismatch;
using test::same_bits;
using test::sentinel;

/// A seeded source of test data.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : g_(seed * 0x9E3779B97F4A7C15ull + 12345) {}
  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(g_);
  }
  i64 index(i64 n) { return std::uniform_int_distribution<i64>(0, n - 1)(g_); }
  bool coin(double p) { return uniform(0, 1) < p; }
  /// n floats uniform in [−mag, mag].
  std::vector<float> values(std::size_t n, double mag) {
    std::vector<float> v(n);
    for (auto& x : v) x = static_cast<float>(uniform(-mag, mag));
    return v;
  }

 private:
  std::mt19937_64 g_;
};

/// Places a logical `[B,S,heads,width]` tensor into memory of st.extent
/// elements by `st`, junk everywhere else.
template <class T, class U>
std::vector<T> place(const Strides& st, i64 B, i64 S, i64 heads, i64 width,
                     std::span<const U> logical, T gap = T(junk())) {
  std::vector<T> mem(static_cast<std::size_t>(st.extent), gap);
  for (i64 b = 0; b < B; ++b)
    for (i64 s = 0; s < S; ++s)
      for (i64 h = 0; h < heads; ++h)
        for (i64 d = 0; d < width; ++d)
          mem[st.at(b, s, h) + d] = static_cast<T>(logical[((b * S + s) * heads + h) * width + d]);
  return mem;
}

/// Reads a `[B,S,heads,width]` tensor out of memory laid out by `st`.
template <class T>
std::vector<T> gather(const Strides& st, i64 B, i64 S, i64 heads, i64 width,
                      std::span<const T> mem) {
  std::vector<T> out(static_cast<std::size_t>(B * S * heads * width));
  for (i64 b = 0; b < B; ++b)
    for (i64 s = 0; s < S; ++s)
      for (i64 h = 0; h < heads; ++h)
        for (i64 d = 0; d < width; ++d)
          out[((b * S + s) * heads + h) * width + d] = mem[st.at(b, s, h) + d];
  return out;
}

/// Converts to double (real part for complex).
template <class T>
std::vector<double> to_double(std::span<const T> v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_arithmetic_v<T>) {
      out[i] = static_cast<double>(v[i]);
    } else {
      out[i] = v[i].real();
    }
  }
  return out;
}
template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  return to_double(std::span<const T>(v));
}

/// max |x| over the finite entries (0 for none).
double max_abs(std::span<const double> x);
inline double max_abs(const std::vector<double>& x) {
  return max_abs(std::span<const double>(x));
}
/// max |got − exp| (NaN where exactly one side is NaN counts as +inf).
double max_err(std::span<const double> got, std::span<const double> exp);

/// Fails the current property with `msg` unless it is empty.
#define TANDEM_REQUIRE_EMPTY(msg)               \
  do {                                          \
    const std::string tandem_m_ = (msg);        \
    if (!tandem_m_.empty()) RC_FAIL(tandem_m_); \
  } while (0)

/// A backend under test, with the variants that must give identical bits
/// (the same backend at 1, 2 and 3 threads) and a hook run before each use
/// (the optimized backend selects its SIMD target there).
struct Subject {
  std::string name;  ///< test-name friendly: reference, optimized_AVX2, broken_gqa_mod
  Backend backend;
  std::vector<Backend> thread_variants;
  std::function<void()> enter = [] {};
  std::function<void()> leave = [] {};
  /// Whether the backend implements sinks, ALiBi, packed sequences and paged
  /// caches (SPEC §2.7–2.10): the properties of those features run only then.
  bool attention_features = true;
  /// Whether the subject differs from another one only in its attention
  /// kernels (the optimized backend at a small Geometry): only properties
  /// that call attention run on it, and those that span every op draw the
  /// attention ops alone (attention_ops()).
  bool attention_only = false;
  /// Whether the subject promises batch-invariant results (SPEC §12): a
  /// query row's out and lse, a sequence's dq, dk, dv, the same bits however
  /// the call around it is shaped. The reference and the scalar fixtures do
  /// by construction, the optimized backend with Geometry::invariant set.
  bool invariant = true;
  /// Whether only the invariance properties run on the subject (the
  /// optimized backend with Geometry::invariant set: the other properties
  /// run on it at its plain geometries).
  bool invariance_only = false;
  /// Another backend that must give the subject's bits on every call, and
  /// what it is: the optimized backend at a random Geometry with invariant
  /// set and a random thread count (drawn with RapidCheck inside the
  /// property). Empty: a random thread variant stands in.
  std::function<std::pair<Backend, std::string>()> invariant_variant;
};

/// reference, broken_none, and optimized at every supported target (when built).
std::vector<Subject> correct_subjects();
/// The broken fixture with `bug` planted, named broken_<bug>, at 1, 2 and 3 "threads".
Subject fixture_subject(broken::Bug bug);

/// The outputs of one call, each as the backend wrote it.
using Outputs = std::vector<std::vector<float>>;
/// Empty when `replay` gives identical bits on a repeated call of s.backend
/// and on every thread variant of s, otherwise what differs; `what` names the call.
std::string same_bits_on_every_run(const Subject& s,
                                   const std::function<Outputs(const Backend&)>& replay,
                                   const std::string& what);

/// One property: a body run once per generated case, `cases` times in CI.
struct Property {
  std::string name;
  std::string
      group;  ///< agreement, transpose, gradient, layout, semantic, memory, determinism, accuracy
  int cases;
  std::function<void(const Subject&)> body;
  bool attention_features = false;  ///< exercises SPEC §2.7–2.10: only for subjects that have them
  bool calls_attention = true;      ///< false: RoPE, axial RoPE or SwiGLU alone
  bool invariance = false;          ///< a property of SPEC §12: only for subjects that promise it
};

/// Every property of the suite.
const std::vector<Property>& properties();
/// Whether an invariance-only subject runs `p` besides the invariance
/// properties: the attention's agreement with the reference, so that the
/// invariant order is also the right function.
inline bool checks_invariant_agreement(const Property& p) {
  return p.name == "agree_attention_forward" || p.name == "agree_attention_backward" ||
         p.name == "agree_attention_features_forward" ||
         p.name == "agree_attention_features_backward";
}

/// Whether `p` runs on `s` (a feature property needs a subject with the
/// features, an attention-only subject a property that calls attention, an
/// invariance property a subject that promises it, an invariance-only
/// subject an invariance property or an agreement one).
inline bool runs_on(const Property& p, const Subject& s) {
  return (!p.attention_features || s.attention_features) &&
         (!s.attention_only || p.calls_attention) && (!p.invariance || s.invariant) &&
         (!s.invariance_only || p.invariance || checks_invariant_agreement(p));
}
const Property& property(const std::string& name);

/// Cases to run for `p`: p.cases × TANDEM_PROPS_SCALE (default 1), or
/// RC_PARAMS's max_success when it sets one.
int case_count(const Property& p);

/// Runs p on s through RapidCheck. `quiet` (fixtures) prints nothing and skips
/// shrinking; otherwise failures print the counterexample and the RC_PARAMS
/// that replays it. Returns the failure message, empty on success.
/// `seed` fixes RapidCheck's seed (the fixture test does, so it is repeatable).
std::string run_property(const Property& p, const Subject& s, int cases, bool quiet,
                         std::optional<std::uint64_t> seed = {});

/// Runs `body` as a semantic property of no backend (the mod language, the
/// reference FlexAttention): `cases` cases (× TANDEM_PROPS_SCALE); `quiet`
/// as run_property, with a fixed seed so that a fixture is repeatable.
inline std::string run_semantic(const std::string& name, int cases,
                                const std::function<void()>& body, bool quiet) {
  const Property p{name, "semantic", cases, [body](const Subject&) { body(); }};
  Subject s;
  s.name = "semantic";
  return run_property(p, s, case_count(p), quiet,
                      quiet ? std::optional<std::uint64_t>(13) : std::nullopt);
}

}  // namespace tandem::props
