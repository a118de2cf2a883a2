// SPDX-License-Identifier: Apache-2.0
// The optimized attention forward with bf16 and f16 storage (SPEC §10.2) on
// every Highway target this CPU runs, against the optimized float forward on
// the same (widened) inputs: with the `exact` profile the result is the
// float result rounded once, bit for bit, and lse is the float lse; with
// `pytorch` (the weights rounded to T before P·V) the output lies within
// SPEC §10.5's bound of the float result, and it does round (it differs from
// `exact`). Both profiles agree with the reference at T within §10.5's
// bound (reference::attention_forward_rounding). Every feature of the forward is covered (masks,
// GQA, Dv != D, softcap, sinks, ALiBi, packed sequences, a paged cache, row strides, bhsd, a
// split-key decode), results are bitwise identical for 1, 2 and 3 threads, and the `ggml` profile
// is an Error naming `rounding` before anything is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/reference/rounding_bound.hpp"
#include "tandem/tandem.hpp"

#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"

namespace {

namespace opt = tandem::optimized;
namespace test = tandem::test;
using tandem::AlibiKind;
using tandem::AttentionParams;
using tandem::bfloat16;
using tandem::float16;
using tandem::Layout;
using tandem::MaskKind;
using tandem::Rounding;
using Vec = std::vector<float>;

/// One call of the forward: its parameters and how its feature inputs are
/// filled (beyond q, k, v).
struct Feature {
  std::string name;
  AttentionParams params;
  std::function<void(test::AttentionCase<float>&, std::mt19937&)> setup = {};
};

/// Random values in [lo, hi) that T holds exactly.
template <class T>
void fill_exact(std::vector<float>& x, std::mt19937& gen, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (float& e : x) e = static_cast<float>(static_cast<double>(T(dist(gen))));
}

std::vector<Feature> features() {
  std::vector<Feature> f;
  auto p = test::attention_params(2, 37, 45, 4, 2, 24);
  f.push_back({"gqa", p});
  p.layout = Layout::bhsd;
  p.Dv = 40;
  f.push_back({"bhsd, Dv != D", p});
  p = test::attention_params(1, 70, 70, 2, 1, 32, 0, Layout::bshd, MaskKind::causal);
  f.push_back({"causal", p});
  p.mask = MaskKind::sliding_window;
  p.window = 13;
  f.push_back({"sliding window", p});
  p = test::attention_params(2, 19, 33, 2, 2, 16, 0, Layout::bshd, MaskKind::key_padding);
  f.push_back({"key padding", p, [](test::AttentionCase<float>& c, std::mt19937& gen) {
                 std::bernoulli_distribution keep(0.7);
                 for (float& m : c.mask) m = keep(gen) ? 1.0f : 0.0f;
               }});
  p.mask = MaskKind::bias;
  p.bias_heads = 2;
  f.push_back({"bias", p, [](test::AttentionCase<float>& c, std::mt19937& gen) {
                 std::uniform_real_distribution<float> dist(-3.0f, 1.0f);
                 for (float& m : c.mask) m = dist(gen);
               }});
  p = test::attention_params(1, 21, 50, 4, 2, 16, 8);
  p.softcap = 5.0;
  p.sinks = true;
  p.alibi = AlibiKind::per_head;
  f.push_back({"softcap, sinks, ALiBi", p, [](test::AttentionCase<float>& c, std::mt19937& gen) {
                 fill_exact<bfloat16>(c.sinks, gen, -1.0f, 3.0f);
                 c.slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
               }});
  p = test::attention_params(1, 30, 41, 2, 1, 16, 0, Layout::bshd, MaskKind::causal);
  p.num_seqs = 2;
  f.push_back({"packed sequences", p, [](test::AttentionCase<float>& c, std::mt19937&) {
                 c.cu_q = {0, 12, 30};
                 c.cu_k = {0, 20, 41};
                 c.used = {17, 21};
               }});
  p = test::attention_params(2, 1, 0, 8, 2, 64);
  p.num_blocks = 40;
  p.block_size = 16;
  p.max_blocks = 16;
  f.push_back({"paged decode", p, [](test::AttentionCase<float>& c, std::mt19937&) {
                 c.table.resize(32);
                 for (std::size_t i = 0; i < c.table.size(); ++i) {
                   c.table[i] = static_cast<std::int32_t>((i * 7) % 40);
                 }
                 c.lens = {256, 173};
               }});
  p = test::attention_params(1, 1, 3000, 8, 2, 64);
  p.sinks = true;
  f.push_back({"split-key decode, sinks", p, [](test::AttentionCase<float>& c, std::mt19937& gen) {
                 fill_exact<bfloat16>(c.sinks, gen, 0.0f, 4.0f);
               }});
  p = test::attention_params(1, 90, 77, 6, 2, 15, 0, Layout::bshd, MaskKind::causal);
  p.Dv = 9;
  f.push_back({"odd D and Dv, causal GQA", p});
  p = test::attention_params(1, 80, 300, 2, 1, 128);
  f.push_back({"D = 128", p});
  p = test::attention_params(2, 23, 29, 3, 3, 16, 12);
  p.q_row_stride = 3 * 16 + 5;
  p.k_row_stride = 3 * 16 + 16 + 3;
  p.v_row_stride = 3 * 12 + 7;
  f.push_back({"row strides", p});
  return f;
}

/// The inputs of `f` in float, each value one of T (q, k, v in [-2, 2]).
template <class T>
test::AttentionCase<float> make_case(const Feature& f, Rounding rounding, unsigned seed) {
  AttentionParams p = f.params;
  p.rounding = rounding;
  test::AttentionCase<float> c(p);
  std::mt19937 gen(seed);
  fill_exact<T>(c.q, gen, -2.0f, 2.0f);
  fill_exact<T>(c.k, gen, -2.0f, 2.0f);
  fill_exact<T>(c.v, gen, -2.0f, 2.0f);
  if (f.setup) f.setup(c, gen);
  for (float& s : c.sinks) s = static_cast<float>(static_cast<double>(T(s)));
  return c;
}

/// c's inputs in storage type T (every value exact) and their view.
template <class T>
struct StoredInputs {
  std::vector<T> q, k, v, sinks;
  tandem::AttentionInputs<T> in;
  explicit StoredInputs(const test::AttentionCase<float>& c)
      : q(test::stored<T>(c.q)),
        k(test::stored<T>(c.k)),
        v(test::stored<T>(c.v)),
        sinks(test::stored<T>(c.sinks)) {
    const tandem::AttentionInputs<float> wide = c.inputs();
    in = {q, k, v, wide.mask};
    in.sinks = sinks;
    in.alibi_slopes = wide.alibi_slopes;
    in.cu_seqlens_q = wide.cu_seqlens_q;
    in.cu_seqlens_k = wide.cu_seqlens_k;
    in.seqused_k = wide.seqused_k;
    in.block_table = wide.block_table;
    in.cache_seqlens = wide.cache_seqlens;
  }
  StoredInputs(const StoredInputs&) = delete;
  StoredInputs& operator=(const StoredInputs&) = delete;
};

/// A result in T and its lse.
template <class T>
struct Result {
  std::vector<T> out;
  Vec lse;
};

/// The optimized backend on `threads` threads.
tandem::Backend backend_on(int threads) {
  opt::Options o;
  o.threads = threads;
  return opt::backend(o);
}

/// The optimized forward_lse of storage type T on c's inputs.
template <class T>
Result<T> run_stored(const test::AttentionCase<float>& c, int threads) {
  const tandem::Backend b = backend_on(threads);
  const StoredInputs<T> stored(c);
  Result<T> r{std::vector<T>(c.plan.o.extent, T(0.0)), Vec(c.plan.lse_size(), 0.0f)};
  b.kernels<T>().attention_forward_lse(c.plan, stored.in, r.out, r.lse);
  return r;
}

/// The optimized float forward_lse on c's inputs.
Result<float> run_float(const test::AttentionCase<float>& c) {
  const tandem::Backend b = backend_on(2);
  Result<float> r{Vec(c.plan.o.extent, 0.0f), Vec(c.plan.lse_size(), 0.0f)};
  b.attention_forward_lse(c.plan, c.inputs(), r.out, r.lse);
  return r;
}

template <class T>
void exact_is_the_float_result_rounded_once() {
  for (const Feature& f : features()) {
    SCOPED_TRACE(f.name);
    const auto c = make_case<T>(f, tandem::kRoundingExact, 7);
    // A decode step leaves for the kernel that reads K and V as stored
    // (attention_decode_stored.cpp), whose float32 sums run in another order
    // than the float forward's: there the result is within one rounding of T
    // of RN_T(float result), lse within float32 rounding; elsewhere the float
    // tiles run on the widened inputs, and the bits are RN_T's.
    // The same holds where a bf16 call's wide tiles multiply with the CPU's
    // AVX512-BF16 products (their float32 sums in pairs, SPEC §10.5).
    const bool decode = f.name.find("decode") != std::string::npos;
    test::for_each_path([&] {
      const Result<float> want = run_float(c);
      const Result<T> got = run_stored<T>(c, 2);
      const bool bf16_dot = std::is_same_v<T, bfloat16> && opt::bf16_dot_active();
      if (!decode && !bf16_dot) {
        EXPECT_TRUE(test::same_bits(got.out, test::stored<T>(want.out)));
        EXPECT_TRUE(test::bitwise(got.lse, want.lse));
        return;
      }
      const double u = tandem::storage_traits<T>::unit_roundoff;
      for (std::size_t i = 0; i < got.out.size(); ++i) {
        const double o = static_cast<double>(got.out[i]), w = want.out[i];
        ASSERT_LE(std::fabs(o - w), 2 * u * std::fabs(w) + 1e-5) << "out[" << i << "]";
      }
      EXPECT_EQ(test::mismatch("lse", std::span<const float>(got.lse),
                               std::span<const float>(want.lse), 1e-5, 1e-6),
                "");
    });
  }
}

template <class T>
void pytorch_is_within_the_bound_and_rounds() {
  const double u = tandem::storage_traits<T>::unit_roundoff;
  for (const Feature& f : features()) {
    SCOPED_TRACE(f.name);
    const auto c = make_case<T>(f, tandem::kRoundingPytorch, 11);
    // SPEC §10.5: u·|o| + u·Σ_j p_ij |v_j| + ε, with Σ_j p_ij |v_j| <= max |v|
    // and ε (float32, far below) as 1e-5
    const double vmax = test::max_abs(c.v);
    test::for_each_path([&] {
      const Result<float> want = run_float(c);
      const Result<T> got = run_stored<T>(c, 2);
      std::size_t rounded = 0;
      for (std::size_t i = 0; i < got.out.size(); ++i) {
        const double o = static_cast<double>(got.out[i]), w = want.out[i];
        ASSERT_LE(std::fabs(o - w), u * std::fabs(w) + u * vmax + 1e-5)
            << "out[" << i << "] = " << o << ", float " << w;
        rounded += got.out[i].bits != T(w).bits;
      }
      // the weights' rounding shows in some outputs (a decode row of few
      // outputs aside, every call has hundreds)
      if (got.out.size() > 256) {
        EXPECT_GT(rounded, 0u);
      }
      EXPECT_EQ(test::mismatch("lse", std::span<const float>(got.lse),
                               std::span<const float>(want.lse), 1e-5, 1e-6),
                "");
    });
  }
}

/// L of props/README.md, from above: |scale|·D·max|q|·max|k| (at least
/// ‖q‖·‖k‖) plus the largest bias, ALiBi penalty and sink.
double logit_bound(const test::AttentionCase<float>& c) {
  double extra = 0.0;
  for (const float m : c.mask) extra = std::max(extra, std::fabs(double{m}));
  for (const float a : c.slopes) extra = std::max(extra, a * double(c.plan.Sk + c.plan.Sq));
  for (const float s : c.sinks) extra = std::max(extra, std::fabs(double{s}));
  return c.plan.scale * double(c.plan.D) * test::max_abs(c.q) * test::max_abs(c.k) + extra;
}

/// SPEC §10.5 against the reference at T, the same profile: |o − o*| <=
/// ulp_T(o*)/2 + ε_i + flip_i, with ε_i the float32 tolerance of the
/// attention properties (64·2^−23·(1+L)·(max|v| + |o*|), props/README.md),
/// which also bounds the relative error of a float32 weight (rel_delta).
template <class T>
void agrees_with_the_reference(Rounding rounding, const std::vector<Feature>& fs = features()) {
  for (const Feature& f : fs) {
    SCOPED_TRACE(f.name);
    const auto c = make_case<T>(f, rounding, 13);
    const double tol = 64 * 0x1p-23 * (1 + logit_bound(c));
    const StoredInputs<T> stored(c);
    const tandem::reference::RoundingBound bound =
        tandem::reference::attention_forward_rounding<T>(c.plan, stored.in, tol);
    const double vmax = test::max_abs(c.v);
    test::for_each_path([&] {
      const Result<T> got = run_stored<T>(c, 2);
      for (std::size_t i = 0; i < got.out.size(); ++i) {
        const double o = static_cast<double>(got.out[i]), want = bound.unrounded[i];
        const double half_ulp = tandem::reference::ulp_of<T>(std::fabs(want)) / 2;
        ASSERT_LE(std::fabs(o - want), half_ulp + tol * (vmax + std::fabs(want)) + bound.flip[i])
            << "out[" << i << "] = " << o << ", reference o* " << want;
      }
    });
  }
}

template <class T>
void any_thread_count_gives_the_same_bits() {
  for (const Feature& f : features()) {
    SCOPED_TRACE(f.name);
    const auto c = make_case<T>(f, tandem::kRoundingPytorch, 3);
    const Result<T> one = run_stored<T>(c, 1);
    for (const int threads : {2, 3}) {
      const Result<T> r = run_stored<T>(c, threads);
      EXPECT_TRUE(test::same_bits(r.out, one.out)) << threads << " threads";
      EXPECT_TRUE(test::bitwise(r.lse, one.lse)) << threads << " threads";
    }
  }
}

template <class T>
void ggml_is_rejected_before_anything_is_written() {
  const auto c = make_case<T>(features().front(), tandem::kRoundingGgml, 5);
  const tandem::Backend b = opt::backend();
  const StoredInputs<T> stored(c);
  const tandem::AttentionInputs<T>& in = stored.in;
  std::vector<T> out(c.plan.o.extent, T(0.0));
  for (T& o : out) o.bits = 0x7FC1;
  const std::vector<T> before = out;
  Vec lse(c.plan.lse_size(), test::sentinel());
  test::expect_error([&] { b.kernels<T>().attention_forward(c.plan, in, out); }, "rounding",
                     {"ggml"});
  test::expect_error([&] { b.kernels<T>().attention_forward_lse(c.plan, in, out, lse); },
                     "rounding", {"ggml"});
  EXPECT_TRUE(test::same_bits(out, before));
  EXPECT_TRUE(test::untouched(lse));
}

TEST(OptimizedLowPrecisionForward, ExactIsTheFloatResultRoundedOnceBf16) {
  exact_is_the_float_result_rounded_once<bfloat16>();
}
TEST(OptimizedLowPrecisionForward, ExactIsTheFloatResultRoundedOnceF16) {
  exact_is_the_float_result_rounded_once<float16>();
}
TEST(OptimizedLowPrecisionForward, PytorchIsWithinTheBoundAndRoundsBf16) {
  pytorch_is_within_the_bound_and_rounds<bfloat16>();
}
TEST(OptimizedLowPrecisionForward, PytorchIsWithinTheBoundAndRoundsF16) {
  pytorch_is_within_the_bound_and_rounds<float16>();
}
TEST(OptimizedLowPrecisionForward, AgreesWithTheReferenceBf16) {
  agrees_with_the_reference<bfloat16>(tandem::kRoundingPytorch);
  agrees_with_the_reference<bfloat16>(tandem::kRoundingExact);
}
TEST(OptimizedLowPrecisionForward, AgreesWithTheReferenceF16) {
  agrees_with_the_reference<float16>(tandem::kRoundingPytorch);
  agrees_with_the_reference<float16>(tandem::kRoundingExact);
}
/// Calls whose bf16 operands vdpbf16ps would flush (SPEC §10.5): every v a
/// bf16 denormal (flushed, the output would be 0), or some q and k elements
/// denormal among normal ones; their blocks take the float products.
std::vector<Feature> denormal_features() {
  std::vector<Feature> f;
  const auto p = test::attention_params(1, 40, 70, 2, 1, 32, 0, Layout::bshd, MaskKind::causal);
  f.push_back({"denormal v", p, [](test::AttentionCase<float>& c, std::mt19937& gen) {
                 fill_exact<bfloat16>(c.v, gen, -0x1p-127f, 0x1p-127f);
               }});
  f.push_back({"denormal q and k elements", p, [](test::AttentionCase<float>& c, std::mt19937&) {
                 for (std::size_t i = 0; i < c.q.size(); i += 7) c.q[i] = 0x1p-130f;
                 for (std::size_t i = 0; i < c.k.size(); i += 5) c.k[i] = -0x1p-129f;
               }});
  return f;
}

TEST(OptimizedLowPrecisionForward, DenormalOperandsAgreeWithTheReferenceBf16) {
  agrees_with_the_reference<bfloat16>(tandem::kRoundingPytorch, denormal_features());
  agrees_with_the_reference<bfloat16>(tandem::kRoundingExact, denormal_features());
}

/// Where this CPU has AVX512-BF16, enable_bf16_dot(true) makes a bf16 forward
/// take it on the best target (its sums run in another order than the
/// portable float tiles': some lse bits differ), and the default is off.
TEST(OptimizedLowPrecisionForward, Bf16DotProductsAreTakenWhereSupported) {
  if (!opt::bf16_dot_supported()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  const Feature f{"causal",
                  test::attention_params(1, 200, 200, 4, 2, 64, 0, Layout::bshd, MaskKind::causal)};
  for (const Rounding rounding : {tandem::kRoundingPytorch, tandem::kRoundingExact}) {
    const auto c = make_case<bfloat16>(f, rounding, 17);
    EXPECT_FALSE(opt::bf16_dot_active());
    const Result<bfloat16> off = run_stored<bfloat16>(c, 2);
    opt::enable_bf16_dot(true);
    EXPECT_TRUE(opt::bf16_dot_active());
    const Result<bfloat16> on = run_stored<bfloat16>(c, 2);
    opt::enable_bf16_dot(false);
    EXPECT_FALSE(test::bitwise(on.lse, off.lse)) << rounding.name;
  }
}

TEST(OptimizedLowPrecisionForward, AnyThreadCountGivesTheSameBitsBf16) {
  any_thread_count_gives_the_same_bits<bfloat16>();
}
TEST(OptimizedLowPrecisionForward, AnyThreadCountGivesTheSameBitsF16) {
  any_thread_count_gives_the_same_bits<float16>();
}
TEST(OptimizedLowPrecisionForward, GgmlIsRejectedBf16) {
  ggml_is_rejected_before_anything_is_written<bfloat16>();
}
TEST(OptimizedLowPrecisionForward, GgmlIsRejectedF16) {
  ggml_is_rejected_before_anything_is_written<float16>();
}

}  // namespace
#endif  // TANDEM_HAVE_OPTIMIZED
