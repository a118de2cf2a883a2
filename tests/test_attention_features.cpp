// SPDX-License-Identifier: Apache-2.0
// Hand-worked examples of the attention features (SPEC §2.7–2.10) on the
// reference: sinks, ALiBi, packed variable-length sequences and paged KV
// caches. Every expected value is derived in the comments next to it; the
// last tests check dsinks and the gradients of each feature against
// complex-step derivatives.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/attention.hpp"
#include "tandem/reference/attention.hpp"
#include "tandem/reference/backend.hpp"

namespace {

using tandem::AlibiKind;
using tandem::AttentionGrads;
using tandem::AttentionInputs;
using tandem::AttentionParams;
using tandem::AttentionPlan;
using tandem::MaskKind;
using i64 = std::int64_t;

const double kLn2 = std::log(2.0);
const double kLn3 = std::log(3.0);
const double kNaN = std::numeric_limits<double>::quiet_NaN();

/// One head of width D = 1 (q = 0 unless set: every score is then 0 and the
/// softmax is decided by the sinks, ALiBi and the masks alone).
AttentionParams one_head(i64 Sq, i64 Sk) {
  return tandem::test::attention_params(1, Sq, Sk, 1, 1, 1);
}

/// The tensors of one call in T (dout = 1), with the reference's forward,
/// lse and backward of it.
template <class T>
struct Call : tandem::test::AttentionCase<T> {
  using Base = tandem::test::AttentionCase<T>;
  using Base::dout;
  using Base::inputs;
  using Base::plan;
  using Base::sinks;
  explicit Call(const AttentionParams& p) : Base(p, T(1)) {}

  [[nodiscard]] std::vector<T> forward() const {
    std::vector<T> out(plan.o.extent, T(-7));
    tandem::reference::attention_forward<T>(plan, inputs(), std::span<T>(out));
    return out;
  }
  [[nodiscard]] std::vector<T> lse() const {
    std::vector<T> out(plan.o.extent), lse(plan.lse_size());
    tandem::reference::attention_forward_lse<T>(plan, inputs(), std::span<T>(out),
                                                std::span<T>(lse));
    return lse;
  }
  struct Grads {
    std::vector<T> dq, dk, dv, dsinks;
  };
  [[nodiscard]] Grads backward() const {
    Grads g{std::vector<T>(plan.dq.extent), std::vector<T>(plan.dk.extent),
            std::vector<T>(plan.dv.extent), std::vector<T>(sinks.size())};
    tandem::reference::attention_backward<T>(plan, inputs(), dout,
                                             AttentionGrads<T>{g.dq, g.dk, g.dv, g.dsinks});
    return g;
  }
};

// ---------------------------------------------------------------------------
// Sinks (SPEC §2.7)

TEST(AttentionSinks, TwoEqualKeysAndASinkOfZeroShareOneThirdEach) {
  // q = 0: s_0 = s_1 = 0; sink 0: p_j = e^0 / (e^0 + e^0 + e^0) = 1/3,
  // p_sink = 1/3. o = (3 + 6)/3 = 3 (the sink adds no value);
  // lse = log(e^0 + e^0 + e^0) = log 3.
  AttentionParams p = one_head(1, 2);
  p.sinks = true;
  Call<double> c(p);
  c.v = {3.0, 6.0};
  EXPECT_NEAR(c.forward()[0], 3.0, 1e-15);
  EXPECT_NEAR(c.lse()[0], kLn3, 1e-15);
  // dO = 1: delta = <dO, o> = 3, dsink = −p_sink·delta = −1;
  // dv_j = p_j·dO = 1/3.
  const auto g = c.backward();
  EXPECT_NEAR(g.dsinks[0], -1.0, 1e-15);
  EXPECT_NEAR(g.dv[0], 1.0 / 3.0, 1e-15);
  EXPECT_NEAR(g.dv[1], 1.0 / 3.0, 1e-15);
}

TEST(AttentionSinks, ALargeSinkDrainsTheRowAndANegativeOneVanishes) {
  // sink = log 2 with one key of score 0: p = 1/(1 + 2) = 1/3, o = v/3.
  AttentionParams p = one_head(1, 1);
  p.sinks = true;
  Call<double> c(p);
  c.v = {9.0};
  c.sinks = {kLn2};
  EXPECT_NEAR(c.forward()[0], 3.0, 1e-14);
  // sink = −1000: e^sink underflows, plain softmax: o = v.
  c.sinks = {-1000.0};
  EXPECT_NEAR(c.forward()[0], 9.0, 1e-14);
}

TEST(AttentionSinks, ARowThatSeesNoKeyOutputsZeroAndSavesTheSink) {
  // sliding_window(0) with Sq = 3 > Sk = 1: q_offset = 0, query i sits at key
  // position i and sees key i only: queries 1 and 2 see none. Their output is
  // 0, their lse is log(e^sink) = sink, and they add nothing to dsinks (o = 0,
  // so delta = 0).
  AttentionParams p = one_head(3, 1);
  p.mask = MaskKind::sliding_window;
  p.sinks = true;
  Call<double> c(p);
  c.v = {5.0};
  c.sinks = {0.25};
  const auto out = c.forward();
  const auto lse = c.lse();
  EXPECT_EQ(out[1], 0.0);
  EXPECT_EQ(out[2], 0.0);
  EXPECT_DOUBLE_EQ(lse[1], 0.25);
  EXPECT_DOUBLE_EQ(lse[2], 0.25);
  // Query 0 sees key 0: p = e^0/(e^0.25 + e^0), p_sink = 1 − p, o = 5p,
  // dsink = −p_sink·<dO, o> = −(1 − p)·5p.
  const double p0 = 1.0 / (std::exp(0.25) + 1.0);
  EXPECT_NEAR(out[0], 5.0 * p0, 1e-15);
  EXPECT_NEAR(c.backward().dsinks[0], -(1.0 - p0) * 5.0 * p0, 1e-15);
}

TEST(AttentionSinks, EachHeadHasItsOwnSink) {
  // H = 2 heads sharing one kv head (MQA), sinks [0, log 3]: head 0 p = 1/2,
  // head 1 p = 1/(1 + 3) = 1/4 over a single key of v = 8.
  AttentionParams p = one_head(1, 1);
  p.H = 2;
  p.Hkv = 1;
  p.sinks = true;
  Call<double> c(p);
  c.v = {8.0};
  c.sinks = {0.0, kLn3};
  const auto out = c.forward();
  EXPECT_NEAR(out[0], 4.0, 1e-14);
  EXPECT_NEAR(out[1], 2.0, 1e-14);
}

// ---------------------------------------------------------------------------
// ALiBi (SPEC §2.8)

TEST(AttentionAlibi, StandardSlopesForPowersOfTwoAndOthers) {
  // H = 8 (a power of two): slope_h = 2^(−8(h+1)/8) = 2^−1 … 2^−8.
  const auto s8 = tandem::alibi_standard_slopes(8);
  ASSERT_EQ(s8.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_EQ(s8[h], std::ldexp(1.0f, -(h + 1))) << h;
  // H = 6: n = 4 → 2^−2, 2^−4, 2^−6, 2^−8; then the odd terms of the 8-head
  // sequence 2^(−4(2i+1)/4) for i = 0, 1: 2^−1, 2^−3.
  const std::vector<float> want6 = {0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f};
  EXPECT_EQ(tandem::alibi_standard_slopes(6), want6);
  // H = 3: n = 2 → 2^−4, 2^−8; then 2^(−4/2) = 2^−2. H = 1: 2^−8.
  EXPECT_EQ(tandem::alibi_standard_slopes(3), (std::vector<float>{0.0625f, 0.00390625f, 0.25f}));
  EXPECT_EQ(tandem::alibi_standard_slopes(1), (std::vector<float>{0.00390625f}));
  // H = 12: n = 8 → 2^−1 … 2^−8, then 2^(−4(2i+1)/8) = 2^−0.5, 2^−1.5, 2^−2.5, 2^−3.5.
  const auto s12 = tandem::alibi_standard_slopes(12);
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(s12[8 + i], static_cast<float>(std::exp2(-0.5 * (2 * i + 1)))) << i;
  }
  EXPECT_THROW(tandem::alibi_standard_slopes(0), tandem::Error);
}

TEST(AttentionAlibi, DecodeQueryPenalisesDistantKeys) {
  // Sq = 1, Sk = 2, slope m = log 2: the query sits at key position 1;
  // distances |0 + 2 − 1 − j| = 1, 0 → s = [−log 2, 0] → p ∝ [1/2, 1] = [1/3, 2/3].
  // o = 3/3 + 2·6/3 = 5.
  AttentionParams p = one_head(1, 2);
  p.alibi = AlibiKind::per_head;
  Call<double> c(p);
  c.v = {3.0, 6.0};
  c.slopes = {static_cast<float>(kLn2)};
  EXPECT_NEAR(c.forward()[0], 3.0 / 3.0 + 6.0 * 2.0 / 3.0, 1e-7);
}

TEST(AttentionAlibi, MoreQueriesThanKeysShiftsTheOtherWay) {
  // Sq = 3, Sk = 2 (no mask): shift Sk − Sq = −1, distances |i − 1 − j|.
  // Query 0: 1, 2 → s = [−m, −2m]; with m = log 2, p ∝ [1/2, 1/4] = [2/3, 1/3]
  // and o = 2·3/3 + 6/3 = 4. Query 1: 0, 1 → p ∝ [1, 1/2]: o = 4 again.
  // Query 2: 1, 0 → p = [1/3, 2/3], o = 5.
  AttentionParams p = one_head(3, 2);
  p.alibi = AlibiKind::per_head;
  Call<double> c(p);
  c.v = {3.0, 6.0};
  c.slopes = {static_cast<float>(kLn2)};
  const auto out = c.forward();
  EXPECT_NEAR(out[0], 4.0, 1e-6);
  EXPECT_NEAR(out[1], 4.0, 1e-6);
  EXPECT_NEAR(out[2], 5.0, 1e-6);
}

TEST(AttentionAlibi, PerBatchHeadSlopesPickTheirRow) {
  // B = 2, slopes [2, 1] = [[0], [log 2]]: batch 0 sees no penalty (o = 4.5
  // over v = 3, 6), batch 1 the decode case above (o = 5).
  AttentionParams p = one_head(1, 2);
  p.B = 2;
  p.alibi = AlibiKind::per_batch_head;
  Call<double> c(p);
  c.v = {3.0, 6.0, 3.0, 6.0};
  c.slopes = {0.0f, static_cast<float>(kLn2)};
  const auto out = c.forward();
  EXPECT_NEAR(out[0], 4.5, 1e-12);
  EXPECT_NEAR(out[1], 5.0, 1e-6);
}

// ---------------------------------------------------------------------------
// Packed variable-length sequences (SPEC §2.9)

/// Two packed sequences, causal, H = D = 1, q = 0: sequence 0 has 2 queries
/// and 3 keys (v 1, 2, 3), sequence 1 has 1 query and a slot of 3 keys of
/// which seqused_k = 2 are used (v 10, 20, then padding).
Call<double> two_sequences() {
  AttentionParams p = one_head(3, 6);
  p.mask = MaskKind::causal;
  p.num_seqs = 2;
  Call<double> c(p);
  c.v = {1.0, 2.0, 3.0, 10.0, 20.0, kNaN};
  c.cu_q = {0, 2, 3};
  c.cu_k = {0, 3, 6};
  c.used = {3, 2};
  return c;
}

TEST(AttentionVarlen, EachSequenceHasItsOwnCausalAlignment) {
  // Sequence 0: Sq = 2, Sk = 3, q_offset = 1: query 0 sees keys 0, 1 → (1 + 2)/2;
  // query 1 sees 0, 1, 2 → 2. Sequence 1: Sq = 1, Sk = 2: both keys → 15. (One
  // alignment over the packed totals, q_offset = 6 − 3, would let query 0 see
  // keys 0..3, across the boundary.) The padding key (NaN) is never read.
  const Call<double> c = two_sequences();
  const auto out = c.forward();
  EXPECT_DOUBLE_EQ(out[0], 1.5);
  EXPECT_DOUBLE_EQ(out[1], 2.0);
  EXPECT_DOUBLE_EQ(out[2], 15.0);
  // lse [1, H, total_q]: log of the number of visible keys (every score 0).
  const auto lse = c.lse();
  EXPECT_NEAR(lse[0], kLn2, 1e-15);
  EXPECT_NEAR(lse[1], kLn3, 1e-15);
  EXPECT_NEAR(lse[2], kLn2, 1e-15);
}

TEST(AttentionVarlen, BackwardSumsEachKeyOverItsOwnSequenceOnly) {
  // dO = 1: dv_j = sum_i p_ij over the queries of j's sequence.
  // Sequence 0: key 0: 1/2 + 1/3, key 1: 1/2 + 1/3, key 2: 1/3.
  // Sequence 1: 1/2, 1/2, and the padding key 0.
  Call<double> c = two_sequences();
  c.v[5] = 0.0;  // the backward reads no padding either; 0 keeps dk finite to compare
  const auto g = c.backward();
  const std::vector<double> want = {5.0 / 6.0, 5.0 / 6.0, 1.0 / 3.0, 0.5, 0.5, 0.0};
  for (std::size_t j = 0; j < want.size(); ++j) EXPECT_NEAR(g.dv[j], want[j], 1e-15) << j;
  EXPECT_EQ(g.dk[5], 0.0);
}

TEST(AttentionVarlen, EmptySequencesAreAllowed) {
  // Three sequences, the middle one with no query and no key: cu_seqlens
  // repeat an offset. Sequence 0: 1 query, 1 key (v 4); sequence 2: 1 query,
  // 2 keys (v 2, 6) → 4.
  AttentionParams p = one_head(2, 3);
  p.num_seqs = 3;
  Call<double> c(p);
  c.v = {4.0, 2.0, 6.0};
  c.cu_q = {0, 1, 1, 2};
  c.cu_k = {0, 1, 1, 3};
  const auto out = c.forward();
  EXPECT_DOUBLE_EQ(out[0], 4.0);
  EXPECT_DOUBLE_EQ(out[1], 4.0);
}

TEST(AttentionVarlen, Int64OffsetsGiveTheSameNumbers) {
  const Call<double> c = two_sequences();
  const std::vector<std::int64_t> cu_q(c.cu_q.begin(), c.cu_q.end()),
      cu_k(c.cu_k.begin(), c.cu_k.end()), used(c.used.begin(), c.used.end());
  AttentionInputs<double> in = c.inputs();
  in.cu_seqlens_q = cu_q;
  in.cu_seqlens_k = cu_k;
  in.seqused_k = used;
  std::vector<double> out(c.plan.o.extent);
  tandem::reference::attention_forward<double>(c.plan, in, std::span<double>(out));
  EXPECT_EQ(out, c.forward());
}

// ---------------------------------------------------------------------------
// Paged KV cache (SPEC §2.10)

/// Batch of 1, block_size 2, three blocks, a table of two entries: the
/// logical keys 0..3 have v = 1, 2, 3, 4, stored with the blocks swapped
/// (block 0 holds keys 2, 3; block 1 holds keys 0, 1) and block 2 unused
/// (NaN). q = 0.
Call<double> swapped_blocks(i64 Sq, std::int32_t cache_len, MaskKind mask) {
  AttentionParams p = one_head(Sq, 0);
  p.mask = mask;
  p.num_blocks = 3;
  p.block_size = 2;
  p.max_blocks = 2;
  Call<double> c(p);
  c.v = {3.0, 4.0, 1.0, 2.0, kNaN, kNaN};
  c.table = {1, 0};
  c.lens = {cache_len};
  return c;
}

TEST(AttentionPaged, BlockTableOrdersTheKeys) {
  // cache length 3: keys 0, 1, 2 = v 1, 2, 3 (from block 1, then slot 0 of
  // block 0) → mean 2; length 4 → 2.5. Block 2 is never read.
  EXPECT_DOUBLE_EQ(swapped_blocks(1, 3, MaskKind::none).forward()[0], 2.0);
  EXPECT_DOUBLE_EQ(swapped_blocks(1, 4, MaskKind::causal).forward()[0], 2.5);
}

TEST(AttentionPaged, ChunkedPrefillIsCausalAtTheEndOfTheCache) {
  // Sq = 2 new queries at the end of a cache of 3 keys: q_offset = 1, query 0
  // sees keys 0, 1 → 1.5, query 1 sees 0, 1, 2 → 2.
  const auto out = swapped_blocks(2, 3, MaskKind::causal).forward();
  EXPECT_DOUBLE_EQ(out[0], 1.5);
  EXPECT_DOUBLE_EQ(out[1], 2.0);
}

TEST(AttentionPaged, EntriesPastTheCacheLengthAreNeverRead) {
  // Length 2 uses table entry 0 only (block 1: v 1, 2 → 1.5); entry 1 may
  // hold anything, even −1.
  Call<double> c = swapped_blocks(1, 2, MaskKind::none);
  c.table = {1, -1};
  EXPECT_DOUBLE_EQ(c.forward()[0], 1.5);
  // An empty cache: no key, output 0.
  c.lens = {0};
  c.table = {-5, 99};
  EXPECT_EQ(c.forward()[0], 0.0);
}

TEST(AttentionPaged, EachBatchEntryReadsItsOwnRowAndLength) {
  // B = 2 sharing block 1 (a common prefix, v 1, 2): entry 0 has length 2
  // (→ 1.5), entry 1 length 3 continuing in block 0 (v 3) → 2.
  AttentionParams p = one_head(1, 0);
  p.B = 2;
  p.num_blocks = 3;
  p.block_size = 2;
  p.max_blocks = 2;
  Call<double> c(p);
  c.v = {3.0, 4.0, 1.0, 2.0, kNaN, kNaN};
  c.table = {1, 2, 1, 0};
  c.lens = {2, 3};
  const auto out = c.forward();
  EXPECT_DOUBLE_EQ(out[0], 1.5);
  EXPECT_DOUBLE_EQ(out[1], 2.0);
}

// ---------------------------------------------------------------------------
// Gradients by complex step (reference<complex<double>>)

/// A call with every feature of `p` filled with fixed, non-trivial data.
template <class T>
void fill(Call<T>& c) {
  for (std::size_t e = 0; e < c.q.size(); ++e) c.q[e] = T(std::sin(1.0 + 0.7 * double(e)));
  for (std::size_t e = 0; e < c.k.size(); ++e) c.k[e] = T(std::cos(0.3 + 1.1 * double(e)));
  for (std::size_t e = 0; e < c.v.size(); ++e) c.v[e] = T(std::sin(2.0 + 0.9 * double(e)));
  for (std::size_t e = 0; e < c.dout.size(); ++e) c.dout[e] = T(std::cos(0.5 * double(e)));
  for (std::size_t e = 0; e < c.sinks.size(); ++e) c.sinks[e] = T(0.3 * double(e) - 0.2);
}

struct GradCase {
  const char* name;
  AttentionParams params;
  std::vector<float> slopes;
  std::vector<std::int32_t> cu_q, cu_k, used;
};

std::vector<GradCase> grad_cases() {
  std::vector<GradCase> cases;
  AttentionParams p;
  p.Sq = 3;
  p.Sk = 4;
  p.H = 2;
  p.Hkv = 1;
  p.D = 3;
  p.Dv = 2;
  p.sinks = true;
  p.mask = MaskKind::causal;
  cases.push_back({"sinks, causal, MQA", p, {}, {}, {}, {}});
  p.softcap = 2.0;
  p.alibi = AlibiKind::per_head;
  cases.push_back({"sinks, ALiBi, softcap", p, {0.5f, 0.25f}, {}, {}, {}});
  p.Sq = 4;
  p.Sk = 7;
  p.num_seqs = 2;
  p.alibi = AlibiKind::per_batch_head;
  p.mask = MaskKind::sliding_window;
  p.window = 1;
  cases.push_back({"varlen, sinks, ALiBi, window",
                   p,
                   {0.5f, 0.25f, 0.125f, 1.0f},
                   {0, 3, 4},
                   {0, 4, 7},
                   {3, 2}});
  return cases;
}

TEST(AttentionFeatureGradients, ComplexStepEqualsTheBackward) {
  using C = std::complex<double>;
  const double h = 1e-20;
  for (const GradCase& gc : grad_cases()) {
    Call<double> d(gc.params);
    Call<C> z(gc.params);
    d.slopes = z.slopes = gc.slopes;
    d.cu_q = z.cu_q = gc.cu_q;
    d.cu_k = z.cu_k = gc.cu_k;
    d.used = z.used = gc.used;
    fill(d);
    fill(z);
    const auto g = d.backward();
    const std::vector<double>* grads[4] = {&g.dq, &g.dk, &g.dv, &g.dsinks};
    const char* names[4] = {"dq", "dk", "dv", "dsinks"};
    // u on q, k, v and the sinks in turn: <grad, u> = d/dt <dO, O(x + t·u)>
    for (int which = 0; which < 4; ++which) {
      Call<C> zc = z;
      std::vector<C>& x = which == 0 ? zc.q : which == 1 ? zc.k : which == 2 ? zc.v : zc.sinks;
      double want = 0;
      for (std::size_t e = 0; e < x.size(); ++e) {
        const double u = std::cos(3.0 + double(e));
        x[e] += C(0, h * u);
        want += (*grads[which])[e] * u;
      }
      const auto o = zc.forward();
      double deriv = 0;
      for (std::size_t e = 0; e < o.size(); ++e) deriv += d.dout[e] * o[e].imag() / h;
      EXPECT_NEAR(want, deriv, 1e-12 * (1 + std::abs(deriv))) << gc.name << ": " << names[which];
    }
  }
}

}  // namespace
