// SPDX-License-Identifier: Apache-2.0
// Conventions across systems (docs page "Conventions across systems"): every
// row of the page's table that can be checked numerically, checked here on
// the reference backend. Each test builds the other system's convention from
// its documented definition (a mask built the way that system builds it, a
// formula written the way its code writes it) and shows where tandem agrees
// and where it differs.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/tandem.hpp"

namespace {

using std::int64_t;
constexpr float kInf = std::numeric_limits<float>::infinity();

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

// One attention call on the reference backend; q, k, v contiguous in `p.layout`.
struct Attention {
  tandem::AttentionParams p;
  std::vector<float> q, k, v;

  Attention(int64_t Sq, int64_t Sk, int64_t H = 1, int64_t Hkv = 1, int64_t D = 4,
            unsigned seed = 1) {
    p.Sq = Sq;
    p.Sk = Sk;
    p.H = H;
    p.Hkv = Hkv;
    p.D = D;
    q = tandem::test::random_values<float>(Sq * H * D, seed);
    k = tandem::test::random_values<float>(Sk * Hkv * D, seed + 1);
    v = tandem::test::random_values<float>(Sk * Hkv * D, seed + 2);
  }

  std::vector<float> run(tandem::MaskKind kind, const std::vector<float>& mask = {},
                         int64_t window = 0, double softcap = 0.0) const {
    tandem::AttentionParams a = p;
    a.mask = kind;
    a.window = window;
    a.softcap = softcap;
    const auto plan = tandem::AttentionPlan::make(a);
    std::vector<float> out(plan.o.extent);
    tandem::reference::backend().attention_forward(plan, {q, k, v, mask}, out);
    return out;
  }

  // An additive [1, 1, Sq, Sk] bias: 0 where visible(i, j), −inf elsewhere.
  template <class F>
  std::vector<float> bias(F visible) const {
    std::vector<float> b(p.Sq * p.Sk);
    for (int64_t i = 0; i < p.Sq; ++i)
      for (int64_t j = 0; j < p.Sk; ++j) b[i * p.Sk + j] = visible(i, j) ? 0.0f : -kInf;
    return b;
  }
};

// --- Causal alignment -------------------------------------------------------

// PyTorch SDPA is_causal=True builds `torch.ones(L, S).tril(diagonal=0)`:
// query i sees keys j <= i (top-left). JAX's is_causal does the same. tandem's
// causal is bottom-right (PyTorch's causal_lower_right, FlashAttention >= 2.1).
TEST(Conventions, CausalIsBottomRightNotPyTorchIsCausalTopLeft) {
  const Attention a(3, 5);
  const int64_t Sq = 3, Sk = 5;
  const auto causal = a.run(tandem::MaskKind::causal);
  const auto top_left =
      a.run(tandem::MaskKind::bias, a.bias([](int64_t i, int64_t j) { return j <= i; }));
  const auto bottom_right = a.run(tandem::MaskKind::bias, a.bias([&](int64_t i, int64_t j) {
    return j <= i + (Sk - Sq);  // torch.nn.attention.bias.causal_lower_right
  }));
  EXPECT_LE(max_abs_diff(causal, bottom_right), 1e-6);
  EXPECT_GT(max_abs_diff(causal, top_left), 1e-2) << "top-left and bottom-right agree at Sq < Sk?";
}

TEST(Conventions, CausalAlignmentsAgreeWhenSquare) {
  const Attention a(4, 4);
  const auto causal = a.run(tandem::MaskKind::causal);
  const auto top_left =
      a.run(tandem::MaskKind::bias, a.bias([](int64_t i, int64_t j) { return j <= i; }));
  EXPECT_LE(max_abs_diff(causal, top_left), 1e-6);
}

// A decode step (Sq = 1) sees the whole cache under tandem's causal; under a
// top-left mask it would see only key 0.
TEST(Conventions, DecodeStepSeesWholeCache) {
  const Attention a(1, 6);
  const auto causal = a.run(tandem::MaskKind::causal);
  const auto none = a.run(tandem::MaskKind::none);
  const auto top_left =
      a.run(tandem::MaskKind::bias, a.bias([](int64_t i, int64_t j) { return j <= i; }));
  EXPECT_LE(max_abs_diff(causal, none), 1e-6);
  EXPECT_GT(max_abs_diff(causal, top_left), 1e-2);
}

// FlashAttention: query i attends to keys in
// [i + Sk − Sq − window_size[0], i + Sk − Sq + window_size[1]]; window (w, 0)
// is tandem's sliding_window(w) whenever Sq <= Sk.
TEST(Conventions, FlashAttentionWindowW0IsSlidingWindowW) {
  for (int64_t w : {0, 1, 2, 5}) {
    const Attention a(4, 7);
    const int64_t Sq = 4, Sk = 7;
    const auto fa =
        a.bias([&](int64_t i, int64_t j) { return i + Sk - Sq - w <= j && j <= i + Sk - Sq + 0; });
    EXPECT_LE(max_abs_diff(a.run(tandem::MaskKind::sliding_window, {}, w),
                           a.run(tandem::MaskKind::bias, fa)),
              1e-6)
        << "w = " << w;
  }
}

// With Sq > Sk, FlashAttention's causal rows i < Sq − Sk see no key (output 0);
// tandem clamps the offset at 0 (top-left for those shapes), so they differ.
TEST(Conventions, CausalWithMoreQueriesThanKeysClampsTheOffset) {
  const Attention a(5, 2);
  const int64_t Sq = 5, Sk = 2;
  const auto causal = a.run(tandem::MaskKind::causal);
  const auto clamped =
      a.run(tandem::MaskKind::bias, a.bias([](int64_t i, int64_t j) { return j <= i; }));
  const auto flash =
      a.run(tandem::MaskKind::bias, a.bias([&](int64_t i, int64_t j) { return j <= i + Sk - Sq; }));
  EXPECT_LE(max_abs_diff(causal, clamped), 1e-6);
  EXPECT_GT(max_abs_diff(causal, flash), 1e-2);
  // FlashAttention's first Sq − Sk rows are fully masked: tandem gives 0 there.
  for (int64_t i = 0; i < Sq - Sk; ++i)
    for (int64_t d = 0; d < 4; ++d) EXPECT_EQ(flash[i * 4 + d], 0.0f);
}

// JAX's local_window_size=(left, right): query i sees keys with
// i − left <= j <= i + right, positions counted from the top-left like its
// is_causal. (w, 0) is tandem's sliding_window(w) only when Sq == Sk.
TEST(Conventions, JaxLocalWindowIsTopLeft) {
  const int64_t w = 2;
  auto jax = [&](const Attention& a) {
    return a.bias([&](int64_t i, int64_t j) { return i <= j + w && i >= j - 0; });
  };
  const Attention square(5, 5);
  EXPECT_LE(max_abs_diff(square.run(tandem::MaskKind::sliding_window, {}, w),
                         square.run(tandem::MaskKind::bias, jax(square))),
            1e-6);
  const Attention wide(3, 6);
  EXPECT_GT(max_abs_diff(wide.run(tandem::MaskKind::sliding_window, {}, w),
                         wide.run(tandem::MaskKind::bias, jax(wide))),
            1e-2);
}

// --- Sliding window ---------------------------------------------------------

// Hugging Face (Mistral, masking_utils): key visible iff
// kv <= q and kv > q − sliding_window, i.e. sliding_window keys counting the
// query itself. tandem's sliding_window(w) shows w + 1 keys.
TEST(Conventions, HuggingFaceSlidingWindowIsWPlusOne) {
  const int64_t S = 8, w = 3;
  const Attention a(S, S);
  auto hf = [&](int64_t sliding_window) {
    return a.bias([=](int64_t q, int64_t kv) { return kv <= q && kv > q - sliding_window; });
  };
  const auto tandem_w = a.run(tandem::MaskKind::sliding_window, {}, w);
  EXPECT_LE(max_abs_diff(tandem_w, a.run(tandem::MaskKind::bias, hf(w + 1))), 1e-6);
  EXPECT_GT(max_abs_diff(tandem_w, a.run(tandem::MaskKind::bias, hf(w))), 1e-3);
}

// --- Mask polarity ----------------------------------------------------------

// PyTorch SDPA boolean attn_mask: True = take part (masked_fill(not mask, -inf));
// tandem's keep = 1 is the same polarity.
TEST(Conventions, KeepMaskIsPyTorchBooleanAttnMask) {
  const Attention a(3, 5);
  const std::vector<bool> attn_mask = {true, true, false, true, false};
  std::vector<float> keep;
  keep.reserve(attn_mask.size());
  for (bool m : attn_mask) keep.push_back(m ? 1.0f : 0.0f);
  const auto sdpa = a.bias([&](int64_t, int64_t j) { return bool(attn_mask[j]); });
  EXPECT_LE(
      max_abs_diff(a.run(tandem::MaskKind::key_padding, keep), a.run(tandem::MaskKind::bias, sdpa)),
      1e-6);
}

// nn.MultiheadAttention key_padding_mask: True = ignore (a padded key). Its
// keep mask is the negation; passing it unchanged is the polarity bug.
TEST(Conventions, MultiheadAttentionKeyPaddingMaskIsInverted) {
  const Attention a(3, 5);
  const std::vector<bool> key_padding_mask = {false, false, false, true, true};
  std::vector<float> keep, wrong;
  for (bool pad : key_padding_mask) {
    keep.push_back(pad ? 0.0f : 1.0f);
    wrong.push_back(pad ? 1.0f : 0.0f);
  }
  const auto mha = a.bias([&](int64_t, int64_t j) { return !key_padding_mask[j]; });
  const auto expected = a.run(tandem::MaskKind::bias, mha);
  EXPECT_LE(max_abs_diff(a.run(tandem::MaskKind::key_padding, keep), expected), 1e-6);
  EXPECT_GT(max_abs_diff(a.run(tandem::MaskKind::key_padding, wrong), expected), 1e-2);
}

// ggml (soft_max_ext, flash_attn_ext) and PyTorch float masks are additive:
// 0 keeps, −inf hides; that is tandem's bias kind, where −inf means excluded.
TEST(Conventions, AdditiveMaskWithMinusInfinityHidesKeys) {
  const Attention a(2, 4);
  const auto bias = a.bias([](int64_t, int64_t j) { return j != 1; });
  const std::vector<float> keep = {1, 0, 1, 1};
  EXPECT_LE(
      max_abs_diff(a.run(tandem::MaskKind::bias, bias), a.run(tandem::MaskKind::key_padding, keep)),
      1e-6);
  // A finite stand-in for −inf is not exclusion: a fully masked row would
  // average the hidden values instead of giving 0 (bias [Sq, Sk] = [2, 4]).
  const auto all_hidden = a.run(tandem::MaskKind::bias, std::vector<float>(8, -kInf));
  const auto all_finite = a.run(tandem::MaskKind::bias, std::vector<float>(8, -1e9f));
  for (float o : all_hidden) EXPECT_EQ(o, 0.0f);
  EXPECT_GT(max_abs_diff(all_hidden, all_finite), 1e-3);
}

// --- Default scale and softcap ---------------------------------------------

// PyTorch (1/sqrt(query.size(-1))), FlashAttention (softmax_scale=None) and
// JAX (scale=None) all default to 1/sqrt(D) of q and k, not of v.
TEST(Conventions, DefaultScaleIsOneOverSqrtOfQueryWidth) {
  tandem::AttentionParams p;
  p.Sq = p.Sk = 2;
  p.H = 1;
  p.D = 16;
  p.Dv = 4;
  EXPECT_DOUBLE_EQ(tandem::AttentionPlan::make(p).scale, 0.25);
}

// Gemma 2 (Hugging Face), FlashAttention's softcap and ggml's logit_softcap:
// cap the *scaled* score, c·tanh(scale·<q,k>/c), before adding the mask.
TEST(Conventions, SoftcapAppliesAfterScaleBeforeBias) {
  const double c = 0.5;
  Attention a(2, 3, 1, 1, 4, 7);
  for (float& x : a.q) x *= 4.0f;  // scores well into tanh's bend
  const auto got = a.run(tandem::MaskKind::none, {}, 0, c);
  const double scale = 0.5;  // 1/sqrt(4)
  auto expected = [&](bool cap_after_scale) {
    std::vector<float> out(8);
    for (int64_t i = 0; i < 2; ++i) {
      double s[3], m = -1e300, l = 0;
      for (int64_t j = 0; j < 3; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < 4; ++d) dot += double(a.q[i * 4 + d]) * a.k[j * 4 + d];
        s[j] = cap_after_scale ? c * std::tanh(scale * dot / c) : scale * c * std::tanh(dot / c);
        m = std::max(m, s[j]);
      }
      for (double x : s) l += std::exp(x - m);
      for (int64_t d = 0; d < 4; ++d) {
        double o = 0;
        for (int64_t j = 0; j < 3; ++j) o += std::exp(s[j] - m) / l * a.v[j * 4 + d];
        out[i * 4 + d] = static_cast<float>(o);
      }
    }
    return out;
  };
  EXPECT_LE(max_abs_diff(got, expected(true)), 1e-6);
  EXPECT_GT(max_abs_diff(got, expected(false)), 1e-3);
}

// --- GQA ----------------------------------------------------------------------

// PyTorch's enable_gqa repeats k and v with repeat_interleave(H/Hkv) on the head
// axis: query head h reads kv head h / (H/Hkv), as tandem does; tiling the kv
// heads (h mod Hkv) is a different, wrong mapping.
TEST(Conventions, GqaIsRepeatInterleaveNotTile) {
  const int64_t S = 3, H = 4, Hkv = 2, D = 4, G = H / Hkv;
  const Attention gqa(S, S, H, Hkv, D, 11);
  const auto got = gqa.run(tandem::MaskKind::none);
  auto expand = [&](bool interleave) {
    Attention mha(S, S, H, H, D, 11);
    mha.q = gqa.q;
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t g = interleave ? h / G : h % Hkv;
          mha.k[(s * H + h) * D + d] = gqa.k[(s * Hkv + g) * D + d];
          mha.v[(s * H + h) * D + d] = gqa.v[(s * Hkv + g) * D + d];
        }
    return mha.run(tandem::MaskKind::none);
  };
  EXPECT_LE(max_abs_diff(got, expand(true)), 1e-6);
  EXPECT_GT(max_abs_diff(got, expand(false)), 1e-3);
}

// --- SwiGLU order -------------------------------------------------------------

std::vector<float> swiglu(const std::vector<float>& x, int64_t n, bool gate_first) {
  const auto plan = tandem::SwigluPlan::from_shapes(
      {static_cast<int64_t>(x.size()) / (2 * n), 2 * n}, gate_first);
  std::vector<float> y(plan.out_size());
  tandem::reference::backend().swiglu_forward(plan, x, y);
  return y;
}

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// ggml_swiglu(a) = silu(first half)·second half (ggml_swiglu_swapped the
// reverse); Hugging Face's LLaMA MLP act(gate_proj(x))·up_proj(x) with a fused
// [gate; up] projection is the same: tandem's gate_first = true.
TEST(Conventions, GgmlSwigluIsGateFirst) {
  const int64_t n = 5;
  const auto x = tandem::test::random_values<float>(3 * (2 * n), 21);
  const auto y = swiglu(x, n, true);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const double g = x[r * 2 * n + i], u = x[r * 2 * n + n + i];
      EXPECT_NEAR(y[r * n + i], g * sigmoid(g) * u, 1e-6);
    }
}

// PyTorch's F.glu(x) = a·σ(b) with a the first half, b the second: the gate is
// second and there is no silu. tandem's gate_first = false is silu(b)·a =
// F.glu(x)·b — related, not equal.
TEST(Conventions, TorchGluGatesWithTheSecondHalfAndIsNotSwiglu) {
  const int64_t n = 4;
  const auto x = tandem::test::random_values<float>(2 * (2 * n), 22);
  const auto y = swiglu(x, n, false);
  double glu_vs_swiglu = 0;
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const double a = x[r * 2 * n + i], b = x[r * 2 * n + n + i];
      const double glu = a * sigmoid(b);
      EXPECT_NEAR(y[r * n + i], glu * b, 1e-6);
      glu_vs_swiglu = std::max(glu_vs_swiglu, std::fabs(y[r * n + i] - glu));
    }
  EXPECT_GT(glu_vs_swiglu, 1e-3);
}

// --- RoPE ---------------------------------------------------------------------

std::vector<float> rope(const std::vector<float>& x, const tandem::Shape& xs,
                        const std::vector<float>& cos, const std::vector<float>& sin,
                        const tandem::Shape& ts, tandem::RopeAttrs attrs) {
  const auto plan = tandem::RopePlan::from_shapes(xs, ts, ts, attrs);
  std::vector<float> y(plan.out_size());
  tandem::reference::backend().rope_forward(plan, x, {cos, sin}, y);
  return y;
}

// Hugging Face LLaMA: emb = cat(freqs, freqs), cos/sin of shape [S, D], and
// q·cos + rotate_half(q)·sin with rotate_half(x) = cat(−x2, x1). tandem's
// neox reads that [S, D] table as it is (T = D; only columns < D/2 are used).
TEST(Conventions, HuggingFaceRotateHalfIsNeoxWithFullWidthTable) {
  const int64_t S = 5, D = 8, m = D / 2;
  const auto x = tandem::test::random_values<float>(S * D, 31);
  std::vector<float> cos(S * D), sin(S * D);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t i = 0; i < D; ++i) {
      const double freq = std::pow(10000.0, -2.0 * (i % m) / D);  // cat(freqs, freqs)
      cos[s * D + i] = static_cast<float>(std::cos(s * freq));
      sin[s * D + i] = static_cast<float>(std::sin(s * freq));
    }
  tandem::RopeAttrs attrs;
  attrs.head_dim = D;
  attrs.style = tandem::RopeStyle::neox;
  const auto y = rope(x, {S, D}, cos, sin, {S, D}, attrs);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t i = 0; i < D; ++i) {
      const double rh = i < m ? -x[s * D + i + m] : x[s * D + i - m];  // rotate_half
      const double hf = x[s * D + i] * double(cos[s * D + i]) + rh * sin[s * D + i];
      EXPECT_NEAR(y[s * D + i], hf, 1e-5) << "s = " << s << ", i = " << i;
    }
}

// GPT-J / ggml mode 0 / Meta's complex-number LLaMA code: adjacent pairs
// (x[2i], x[2i+1]) as the complex number x[2i] + i·x[2i+1] times e^{iθ_i}.
TEST(Conventions, InterleavedComplexRotationIsGptj) {
  const int64_t S = 4, D = 6, m = D / 2;
  const auto x = tandem::test::random_values<float>(S * D, 32);
  std::vector<float> cos(S * m), sin(S * m);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t i = 0; i < m; ++i) {
      cos[s * m + i] = static_cast<float>(std::cos(s * std::pow(10000.0, -2.0 * i / D)));
      sin[s * m + i] = static_cast<float>(std::sin(s * std::pow(10000.0, -2.0 * i / D)));
    }
  tandem::RopeAttrs attrs;
  attrs.head_dim = D;
  attrs.style = tandem::RopeStyle::gptj;
  const auto y = rope(x, {S, D}, cos, sin, {S, m}, attrs);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t i = 0; i < m; ++i) {
      const std::complex<double> z(x[s * D + 2 * i], x[s * D + 2 * i + 1]);
      const std::complex<double> r = z * std::complex<double>(cos[s * m + i], sin[s * m + i]);
      EXPECT_NEAR(y[s * D + 2 * i], r.real(), 1e-5);
      EXPECT_NEAR(y[s * D + 2 * i + 1], r.imag(), 1e-5);
    }
}

// ggml's rope takes one position per token (an int32 tensor); tandem's `token`
// rows with the table gathered by those positions give the same result as
// each packed sequence rotated on its own with `position` rows.
TEST(Conventions, PerTokenPositionsAreTokenRows) {
  const int64_t D = 4, m = D / 2;
  const std::vector<int64_t> pos = {0, 1, 2, 0, 1, 2};  // two packed sequences of 3
  auto angle = [&](int64_t p, int64_t i) { return p * std::pow(10000.0, -2.0 * i / D); };
  std::vector<float> ct(6 * m), st(6 * m), cp(3 * m), sp(3 * m);
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t i = 0; i < m; ++i) {
      ct[t * m + i] = static_cast<float>(std::cos(angle(pos[t], i)));
      st[t * m + i] = static_cast<float>(std::sin(angle(pos[t], i)));
    }
  for (int64_t s = 0; s < 3; ++s)
    for (int64_t i = 0; i < m; ++i) {
      cp[s * m + i] = static_cast<float>(std::cos(angle(s, i)));
      sp[s * m + i] = static_cast<float>(std::sin(angle(s, i)));
    }
  const auto x = tandem::test::random_values<float>(2 * (3 * D), 33);
  tandem::RopeAttrs token;
  token.head_dim = D;
  token.table_rows = tandem::TableRows::token;
  tandem::RopeAttrs position;
  position.head_dim = D;
  position.table_rows = tandem::TableRows::position;
  const auto packed = rope(x, {2, 3, D}, ct, st, {6, m}, token);
  const auto separate = rope(x, {2, 3, D}, cp, sp, {3, m}, position);
  EXPECT_LE(max_abs_diff(packed, separate), 1e-6);
}

// SAM 2 compute_axial_cis / apply_rotary_enc: freqs = theta^(−4k/D), k < D/4,
// t_x = t mod end_x, t_y = t div end_x, cat([freqs_x, freqs_y]), and adjacent
// pairs rotated as complex numbers.
TEST(Conventions, Sam2AxialRope) {
  const int64_t end_x = 3, end_y = 2, S = end_x * end_y, D = 8;
  const double theta = 10000.0;
  const auto x = tandem::test::random_values<float>(S * D, 41);
  tandem::AxialRopeAttrs attrs;
  attrs.end_x = end_x;
  attrs.end_y = end_y;
  const auto plan = tandem::AxialRopePlan::from_shapes({S, D}, attrs);
  std::vector<float> y(plan.out_size());
  tandem::reference::backend().axial_rope_forward(plan, x, y);
  for (int64_t t = 0; t < S; ++t) {
    const int64_t row = t / end_x;  // the grid position (t % end_x, t / end_x)
    const auto tx = static_cast<double>(t % end_x), ty = static_cast<double>(row);
    for (int64_t j = 0; j < D / 2; ++j) {
      const int64_t k = j % (D / 4);
      const double freq = 1.0 / std::pow(theta, static_cast<double>(4 * k) / D);
      const double angle = (j < D / 4 ? tx : ty) * freq;
      const std::complex<double> z(x[t * D + 2 * j], x[t * D + 2 * j + 1]);
      const auto r = z * std::polar(1.0, angle);
      EXPECT_NEAR(y[t * D + 2 * j], r.real(), 1e-5);
      EXPECT_NEAR(y[t * D + 2 * j + 1], r.imag(), 1e-5);
    }
  }
}

// --- Layout -------------------------------------------------------------------

// PyTorch SDPA takes (B, H, S, D) — tandem's bhsd; FlashAttention and JAX take
// (B, S, H, D) — bshd. The same data in either layout gives the same numbers.
TEST(Conventions, BhsdIsTheTransposeOfBshd) {
  const int64_t B = 2, S = 3, H = 2, D = 4;
  tandem::AttentionAttrs attrs;
  attrs.num_heads = H;
  attrs.layout = tandem::QkvLayout::bshd;
  const auto bshd = tandem::AttentionPlan::from_shapes({B, S, H, D}, {B, S, H, D}, {B, S, H, D},
                                                       std::nullopt, attrs);
  attrs.layout = tandem::QkvLayout::bhsd;
  const auto bhsd = tandem::AttentionPlan::from_shapes({B, H, S, D}, {B, H, S, D}, {B, H, S, D},
                                                       std::nullopt, attrs);
  std::vector<float> in[3], tr[3];
  for (int t = 0; t < 3; ++t) {
    in[t] = tandem::test::random_values<float>(B * S * H * D, 50 + t);
    tr[t].resize(in[t].size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d)
            tr[t][bhsd.q.at(b, s, h) + d] = in[t][bshd.q.at(b, s, h) + d];
  }
  std::vector<float> o1(bshd.o.extent), o2(bhsd.o.extent);
  const auto ref = tandem::reference::backend();
  ref.attention_forward(bshd, {in[0], in[1], in[2]}, o1);
  ref.attention_forward(bhsd, {tr[0], tr[1], tr[2]}, o2);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d)
          EXPECT_EQ(o1[bshd.o.at(b, s, h) + d], o2[bhsd.o.at(b, s, h) + d]);
}

}  // namespace
