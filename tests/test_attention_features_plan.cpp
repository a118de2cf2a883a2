// SPDX-License-Identifier: Apache-2.0
// The validation rules of the attention features (SPEC §8, §2.7–2.10): plan
// parameters (make), shapes (from_shapes) and the inputs every entry point
// checks (check_inputs, check_grads). Each error names the parameter and the
// value, and no output is written before it is thrown.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/attention.hpp"
#include "tandem/reference/backend.hpp"

namespace {

using tandem::AlibiKind;
using tandem::AttentionAttrs;
using tandem::AttentionGrads;
using tandem::AttentionInputs;
using tandem::AttentionParams;
using tandem::AttentionPlan;
using tandem::AttentionShapes;
using tandem::Layout;
using tandem::MaskKind;
using tandem::Shape;
using tandem::test::attention_attrs;
using tandem::test::attention_params;
using tandem::test::expect_error;
using tandem::test::expect_make_error;
using tandem::test::sentinel;
using tandem::test::untouched;
using i64 = std::int64_t;

// ---------------------------------------------------------------------------
// make()

AttentionParams base() {
  return attention_params(1, 5, 7, 4, 2, 8);
}

TEST(AttentionFeaturePlan, PackedSequencesAreABatchOfOne) {
  AttentionParams p = base();
  p.num_seqs = 3;
  const AttentionPlan plan = AttentionPlan::make(p);
  EXPECT_TRUE(plan.varlen());
  EXPECT_EQ(plan.sequences(), 3);
  EXPECT_EQ(plan.lse_size(), 4 * 5);  // [1, H, total_q]
  p.B = 2;
  expect_make_error(p, "B", {"B = 2", "must be 1 with packed sequences"});
  p.B = 1;
  p.layout = Layout::bhsd;  // [H, total_q, D]: each head's rows one run
  const AttentionPlan heads_first = AttentionPlan::make(p);
  EXPECT_EQ(heads_first.q.head, 5 * 8);
  EXPECT_EQ(heads_first.k.head, 7 * 8);
  EXPECT_EQ(heads_first.q.seq, 8);
  EXPECT_EQ(heads_first.lse_size(), 4 * 5);
  p.layout = Layout::bshd;
  for (MaskKind m : {MaskKind::key_padding, MaskKind::bias}) {
    p.mask = m;
    expect_make_error(p, "mask",
                      {std::string("mask = ") + tandem::to_string(m),
                       "must be none, causal or sliding_window with packed sequences"});
  }
  p.mask = MaskKind::none;
  p.num_seqs = -1;
  expect_make_error(p, "num_seqs", {"num_seqs = -1", "must be >= 0"});
}

TEST(AttentionFeaturePlan, PagedCacheShapes) {
  AttentionParams p = base();
  p.B = 2;
  p.Sk = 0;
  p.num_blocks = 10;
  p.block_size = 4;
  p.max_blocks = 3;
  const AttentionPlan plan = AttentionPlan::make(p);
  EXPECT_TRUE(plan.paged());
  EXPECT_EQ(plan.Sk, 12);  // max_blocks·block_size, the longest cache
  EXPECT_EQ(plan.kv_batch(), 10);
  EXPECT_EQ(plan.kv_seq(), 4);
  EXPECT_EQ(plan.k.extent, 10 * 4 * 2 * 8);
  p.Sk = 12;
  EXPECT_EQ(AttentionPlan::make(p).Sk, 12);
  p.Sk = 11;
  expect_make_error(p, "Sk", {"Sk = 11", "must be 0 or max_blocks*block_size = 12"});
  p.Sk = 0;
  p.block_size = 0;
  expect_make_error(p, "block_size", {"block_size = 0", "must be >= 1 for a paged cache"});
  p.block_size = 4;
  p.max_blocks = 0;
  expect_make_error(p, "max_blocks", {"max_blocks = 0"});
  p.max_blocks = 3;
  p.num_blocks = -1;
  expect_make_error(p, "num_blocks", {"num_blocks = -1"});
  p.num_blocks = 10;
  p.layout = Layout::bhsd;
  expect_make_error(p, "layout", {"must be bshd with a paged cache"});
  p.layout = Layout::bshd;
  p.mask = MaskKind::key_padding;
  expect_make_error(p, "mask", {"must be none, causal or sliding_window with a paged cache"});
  p.mask = MaskKind::causal;
  p.B = 1;
  p.num_seqs = 2;
  expect_make_error(p, "num_blocks", {"a paged cache and packed sequences do not combine"});
  p.num_seqs = 0;
  p.max_blocks = std::int64_t(1) << 40;
  p.block_size = std::int64_t(1) << 40;
  expect_make_error(p, "max_blocks*block_size", {"overflows a 64-bit size"});
  p.block_size = 1;
  p.B = std::int64_t(1) << 30;
  expect_make_error(p, "block_table", {"overflows a 64-bit size"});
}

TEST(AttentionFeaturePlan, SinksAndAlibiSizes) {
  AttentionParams p = base();
  p.B = 3;
  p.sinks = true;
  p.alibi = AlibiKind::per_head;
  AttentionPlan plan = AttentionPlan::make(p);
  EXPECT_EQ(plan.slopes_size(), 4);
  EXPECT_EQ(plan.slope_at(2, 1), 1);
  p.alibi = AlibiKind::per_batch_head;
  plan = AttentionPlan::make(p);
  EXPECT_EQ(plan.slopes_size(), 12);
  EXPECT_EQ(plan.slope_at(2, 1), 9);
  EXPECT_NE(plan.describe().find("sinks alibi=per_batch_head"), std::string::npos)
      << plan.describe();
}

// ---------------------------------------------------------------------------
// from_shapes()

void expect_shapes_error(const AttentionShapes& s, const AttentionAttrs& a,
                         const std::string& parameter,
                         std::initializer_list<std::string> fragments) {
  expect_error([&] { AttentionPlan::from_shapes(s, a); }, parameter, fragments);
}

/// Packed: 2 sequences, 9 query tokens, 11 key tokens, H = 4, Hkv = 2, D = 8.
AttentionShapes packed() {
  AttentionShapes s;
  s.q = {9, 4, 8};
  s.k = {11, 2, 8};
  s.v = {11, 2, 6};
  s.cu_seqlens_q = Shape{3};
  s.cu_seqlens_k = Shape{3};
  return s;
}

/// Paged: B = 2, Sq = 1, caches of 10 blocks of 16, tables of 4 entries.
AttentionShapes paged() {
  AttentionShapes s;
  s.q = {2, 1, 4, 8};
  s.k = {10, 16, 2, 8};
  s.v = {10, 16, 2, 8};
  s.block_table = Shape{2, 4};
  s.cache_seqlens = Shape{2};
  return s;
}

TEST(AttentionFeatureShapes, PackedSequences) {
  AttentionShapes s = packed();
  const AttentionPlan plan = AttentionPlan::from_shapes(s, attention_attrs(4, MaskKind::causal));
  EXPECT_EQ(plan.num_seqs, 2);
  EXPECT_EQ(plan.B, 1);
  EXPECT_EQ(plan.Sq, 9);
  EXPECT_EQ(plan.Sk, 11);
  EXPECT_EQ(plan.Hkv, 2);
  EXPECT_EQ(plan.Dv, 6);
  // rank 2 [T, H·D] too
  AttentionShapes s2 = s;
  s2.q = {9, 32};
  s2.k = {11, 16};
  s2.v = {11, 12};
  EXPECT_EQ(AttentionPlan::from_shapes(s2, attention_attrs(4)).Dv, 6);
  s2.seqused_k = Shape{2};
  EXPECT_EQ(AttentionPlan::from_shapes(s2, attention_attrs(4)).num_seqs, 2);

  AttentionShapes bad = s;
  bad.cu_seqlens_k.reset();
  expect_shapes_error(bad, attention_attrs(4), "cu_seqlens_k", {"is required with cu_seqlens_q"});
  bad = s;
  bad.cu_seqlens_q.reset();
  expect_shapes_error(bad, attention_attrs(4), "cu_seqlens_q", {"is required with cu_seqlens_k"});
  bad = s;
  bad.cu_seqlens_k = Shape{4};
  expect_shapes_error(bad, attention_attrs(4), "cu_seqlens_k.shape",
                      {"cu_seqlens_k.shape = [4]", "must be [3]"});
  bad = s;
  bad.cu_seqlens_q = bad.cu_seqlens_k = Shape{1};
  expect_shapes_error(bad, attention_attrs(4), "cu_seqlens_q.shape", {"n >= 1 sequences"});
  bad = s;
  bad.cu_seqlens_q = Shape{3, 1};
  expect_shapes_error(bad, attention_attrs(4), "cu_seqlens_q.shape",
                      {"cu_seqlens_q.shape = [3, 1]"});
  bad = s;
  bad.seqused_k = Shape{3};
  expect_shapes_error(bad, attention_attrs(4), "seqused_k.shape", {"must be [2]"});
  bad = s;
  bad.q = {1, 9, 4, 8};
  bad.k = {1, 11, 2, 8};
  bad.v = {1, 11, 2, 6};
  expect_shapes_error(bad, attention_attrs(4), "q.shape",
                      {"must be [total_q, H, D] or [total_q, H*D]"});
  bad = s;
  bad.q = {9, 2, 8};
  expect_shapes_error(bad, attention_attrs(4), "q.shape",
                      {"num_heads = 4 on its head axis (packed"});
  AttentionAttrs a = attention_attrs(4);
  a.layout = tandem::QkvLayout::bhsd;
  expect_shapes_error(s, a, "layout", {"must be thd or bshd (or absent) with packed sequences"});
  AttentionShapes with_mask = s;
  with_mask.mask = Shape{1, 1, 9, 11};
  expect_shapes_error(with_mask, attention_attrs(4, MaskKind::bias), "mask",
                      {"must be none, causal or sliding_window with packed sequences"});
  // seqused_k without packed sequences
  AttentionShapes dense;
  dense.q = {2, 5, 32};
  dense.k = {2, 7, 16};
  dense.v = {2, 7, 16};
  dense.seqused_k = Shape{2};
  expect_shapes_error(dense, attention_attrs(4), "seqused_k", {"is only taken with cu_seqlens_q"});
}

TEST(AttentionFeatureShapes, KeyOriginIsOnePerSequence) {
  // dense: one per batch entry; packed: one per sequence (SPEC §12.1)
  AttentionShapes dense;
  dense.q = {2, 5, 32};
  dense.k = {2, 7, 16};
  dense.v = {2, 7, 16};
  dense.key_origin = Shape{2};
  EXPECT_EQ(AttentionPlan::from_shapes(dense, attention_attrs(4)).B, 2);
  dense.key_origin = Shape{1};
  expect_shapes_error(dense, attention_attrs(4), "key_origin.shape",
                      {"key_origin.shape = [1] must be [2]"});
  dense.key_origin = Shape{2, 1};
  expect_shapes_error(dense, attention_attrs(4), "key_origin.shape", {"must be [2]"});
  AttentionShapes packed;
  packed.q = {9, 4, 8};
  packed.k = {11, 2, 8};
  packed.v = {11, 2, 6};
  packed.cu_seqlens_q = packed.cu_seqlens_k = Shape{4};
  packed.key_origin = Shape{3};
  EXPECT_EQ(AttentionPlan::from_shapes(packed, attention_attrs(4)).num_seqs, 3);
  packed.key_origin = Shape{1};
  expect_shapes_error(packed, attention_attrs(4), "key_origin.shape", {"must be [3]"});
}

TEST(AttentionFeatureShapes, PagedCache) {
  const AttentionShapes s = paged();
  const AttentionPlan plan = AttentionPlan::from_shapes(s, attention_attrs(4, MaskKind::causal));
  EXPECT_EQ(plan.B, 2);
  EXPECT_EQ(plan.num_blocks, 10);
  EXPECT_EQ(plan.block_size, 16);
  EXPECT_EQ(plan.max_blocks, 4);
  EXPECT_EQ(plan.Sk, 64);
  AttentionShapes bad = s;
  bad.cache_seqlens.reset();
  expect_shapes_error(bad, attention_attrs(4), "cache_seqlens", {"is required with block_table"});
  bad = s;
  bad.block_table.reset();
  expect_shapes_error(bad, attention_attrs(4), "block_table", {"is required with cache_seqlens"});
  bad = s;
  bad.block_table = Shape{3, 4};
  expect_shapes_error(bad, attention_attrs(4), "block_table.shape",
                      {"block_table.shape = [3, 4]", "[B, max_blocks] with B = 2"});
  bad = s;
  bad.cache_seqlens = Shape{3};
  expect_shapes_error(bad, attention_attrs(4), "cache_seqlens.shape", {"must be [2]"});
  bad = s;
  bad.q = {2, 1, 32};
  bad.k = {10, 16, 16};
  bad.v = {10, 16, 16};
  expect_shapes_error(bad, attention_attrs(4), "k.shape",
                      {"must be [num_blocks, block_size, Hkv, D]"});
  bad = s;
  bad.v = {10, 8, 2, 8};
  expect_shapes_error(bad, attention_attrs(4), "v.shape", {"must match k.shape = [10, 16, 2, 8]"});
  bad = s;
  bad.cu_seqlens_q = bad.cu_seqlens_k = Shape{3};
  expect_shapes_error(bad, attention_attrs(4), "block_table", {"do not combine"});
}

TEST(AttentionFeatureShapes, SinksAndAlibi) {
  AttentionShapes s = paged();
  s.sinks = Shape{4};
  s.alibi_slopes = Shape{4};
  AttentionPlan plan = AttentionPlan::from_shapes(s, attention_attrs(4));
  EXPECT_TRUE(plan.sinks);
  EXPECT_EQ(plan.alibi, AlibiKind::per_head);
  s.alibi_slopes = Shape{2, 4};  // [B, H]
  EXPECT_EQ(AttentionPlan::from_shapes(s, attention_attrs(4)).alibi, AlibiKind::per_batch_head);
  AttentionShapes p = packed();
  p.alibi_slopes = Shape{2, 4};  // [n, H]
  EXPECT_EQ(AttentionPlan::from_shapes(p, attention_attrs(4)).alibi, AlibiKind::per_batch_head);
  p.alibi_slopes = Shape{1, 4};
  expect_shapes_error(p, attention_attrs(4), "alibi_slopes.shape",
                      {"alibi_slopes.shape = [1, 4]", "must be [H] = [4] or [n, H] = [2, 4]"});
  s.alibi_slopes.reset();
  s.sinks = Shape{2};
  expect_shapes_error(s, attention_attrs(4), "sinks.shape", {"sinks.shape = [2]", "must be [4]"});
  s.sinks = Shape{4, 1};
  expect_shapes_error(s, attention_attrs(4), "sinks.shape", {"sinks.shape = [4, 1]"});
}

// ---------------------------------------------------------------------------
// The inputs every entry point checks before writing (reference backend)

/// A packed call of 2 sequences (3 and 2 queries; slots of 4 and 3 keys),
/// H = 2, Hkv = 1, D = 4, with sinks and [n, H] ALiBi slopes, and every
/// output a sentinel.
struct PackedCall {
  AttentionPlan plan;
  std::vector<float> q, k, v, dout, sinks, slopes, out, lse, dq, dk, dv, dsinks;
  std::vector<std::int32_t> cu_q{0, 3, 5}, cu_k{0, 4, 7}, used{4, 1};

  PackedCall() {
    AttentionParams p;
    p.Sq = 5;
    p.Sk = 7;
    p.H = 2;
    p.Hkv = 1;
    p.D = 4;
    p.num_seqs = 2;
    p.sinks = true;
    p.alibi = AlibiKind::per_batch_head;
    p.mask = MaskKind::causal;
    plan = AttentionPlan::make(p);
    q.assign(plan.q.extent, 0.5f);
    k.assign(plan.k.extent, 0.25f);
    v.assign(plan.v.extent, 1.0f);
    dout.assign(plan.o.extent, 1.0f);
    sinks = {0.5f, -1.0f};
    slopes = {0.5f, 0.25f, 0.125f, 1.0f};
    out.assign(plan.o.extent, sentinel());
    lse.assign(plan.lse_size(), sentinel());
    dq.assign(plan.dq.extent, sentinel());
    dk.assign(plan.dk.extent, sentinel());
    dv.assign(plan.dv.extent, sentinel());
    dsinks.assign(2, sentinel());
  }
  [[nodiscard]] AttentionInputs<float> inputs() const {
    AttentionInputs<float> in{q, k, v};
    in.sinks = sinks;
    in.alibi_slopes = slopes;
    in.cu_seqlens_q = cu_q;
    in.cu_seqlens_k = cu_k;
    in.seqused_k = used;
    return in;
  }
};

/// Every entry point of the reference backend rejects `in` with an Error
/// about `parameter` (message fragments `fragments`) and writes nothing.
void expect_every_entry_rejects(PackedCall& c, const AttentionInputs<float>& in,
                                const std::string& parameter,
                                std::initializer_list<std::string> fragments) {
  const tandem::Backend ref = tandem::reference::backend();
  expect_error([&] { ref.attention_forward(c.plan, in, c.out); }, parameter, fragments);
  expect_error([&] { ref.attention_forward_lse(c.plan, in, c.out, c.lse); }, parameter, fragments);
  expect_error(
      [&] {
        ref.attention_backward(c.plan, in, c.dout, {c.dq, c.dk, c.dv, c.dsinks});
      },
      parameter, fragments);
  expect_error([&] { ref.attention_backward_dk(c.plan, in, c.dout, c.dk); }, parameter, fragments);
  for (const auto* x : {&c.out, &c.lse, &c.dq, &c.dk, &c.dv, &c.dsinks}) {
    EXPECT_TRUE(untouched(*x)) << parameter;
  }
}

TEST(AttentionFeatureInputs, CuSeqlensMustStartAtZeroRiseAndEndAtTheTotal) {
  PackedCall c;
  AttentionInputs<float> in = c.inputs();
  const std::vector<std::int32_t> first_not_zero = {1, 3, 5}, decreasing = {0, 6, 5},
                                  short_total = {0, 3, 4};
  in.cu_seqlens_q = first_not_zero;
  expect_every_entry_rejects(c, in, "cu_seqlens_q", {"cu_seqlens_q[0] = 1", "must be 0"});
  in.cu_seqlens_q = decreasing;
  expect_every_entry_rejects(c, in, "cu_seqlens_q",
                             {"cu_seqlens_q[2] = 5", "must be >= cu_seqlens_q[1] = 6"});
  in.cu_seqlens_q = short_total;
  expect_every_entry_rejects(c, in, "cu_seqlens_q",
                             {"cu_seqlens_q[2] = 4", "must be the total number of rows, 5"});
  const std::vector<std::int64_t> long_total = {0, 4, 8}, too_few = {0, 4};
  in = c.inputs();
  in.cu_seqlens_k = long_total;
  expect_every_entry_rejects(c, in, "cu_seqlens_k",
                             {"cu_seqlens_k[2] = 8", "must be the total number of rows, 7"});
  in.cu_seqlens_k = too_few;
  expect_every_entry_rejects(c, in, "cu_seqlens_k.size()",
                             {"cu_seqlens_k.size() = 2", "must be 3"});
  in.cu_seqlens_k = {};
  expect_every_entry_rejects(c, in, "cu_seqlens_k.size()", {"cu_seqlens_k.size() = 0"});
}

TEST(AttentionFeatureInputs, SeqUsedKMustFitItsSlot) {
  PackedCall c;
  AttentionInputs<float> in = c.inputs();
  const std::vector<std::int32_t> too_many = {5, 1}, negative = {4, -1}, one = {4};
  in.seqused_k = too_many;
  expect_every_entry_rejects(c, in, "seqused_k", {"seqused_k[0] = 5", "must lie in [0, 4]"});
  in.seqused_k = negative;
  expect_every_entry_rejects(c, in, "seqused_k", {"seqused_k[1] = -1", "must lie in [0, 3]"});
  in.seqused_k = one;
  expect_every_entry_rejects(c, in, "seqused_k.size()", {"seqused_k.size() = 1", "must be 2"});
}

TEST(AttentionFeatureInputs, SinksAndSlopesMustBeFiniteAndShaped) {
  PackedCall c;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  AttentionInputs<float> in = c.inputs();
  const std::vector<float> nan_sink = {0.5f, nan}, inf_sink = {inf, 0.0f};
  in.sinks = nan_sink;
  expect_every_entry_rejects(c, in, "sinks", {"sinks[1] = nan", "must be finite"});
  in.sinks = inf_sink;
  expect_every_entry_rejects(c, in, "sinks", {"sinks[0] = inf", "must be finite"});
  in.sinks = std::span<const float>(c.sinks).first(1);
  expect_every_entry_rejects(c, in, "sinks.size()", {"sinks.size() = 1", "must be 2"});
  in = c.inputs();
  std::vector<float> slopes = c.slopes;
  slopes[3] = -inf;
  in.alibi_slopes = slopes;
  expect_every_entry_rejects(c, in, "alibi_slopes", {"alibi_slopes[3] = -inf", "must be finite"});
  in.alibi_slopes = std::span<const float>(c.slopes).first(2);
  expect_every_entry_rejects(c, in, "alibi_slopes.size()",
                             {"alibi_slopes.size() = 2", "must be 4"});
}

TEST(AttentionFeatureInputs, FeatureInputsThePlanDoesNotTakeAreErrors) {
  // A dense plan given cu_seqlens, a block table or sinks: each must be empty.
  AttentionParams p = base();
  const AttentionPlan plan = AttentionPlan::make(p);
  std::vector<float> q(plan.q.extent), k(plan.k.extent), v(plan.v.extent),
      out(plan.o.extent, sentinel()), sinks(4);
  std::vector<std::int32_t> cu = {0, 5};
  const tandem::Backend ref = tandem::reference::backend();
  AttentionInputs<float> in{q, k, v};
  in.cu_seqlens_q = cu;
  expect_error([&] { ref.attention_forward(plan, in, out); }, "cu_seqlens_q.size()",
               {"cu_seqlens_q.size() = 2", "must be 0"});
  in = {q, k, v};
  in.block_table = cu;
  expect_error([&] { ref.attention_forward(plan, in, out); }, "block_table.size()", {"must be 0"});
  in = {q, k, v};
  in.sinks = sinks;
  expect_error([&] { ref.attention_forward(plan, in, out); }, "sinks.size()",
               {"sinks.size() = 4", "must be 0"});
  EXPECT_TRUE(untouched(out));
}

/// A paged decode call: B = 2, block_size 4, 5 blocks, tables of 3 entries.
struct PagedCall {
  AttentionPlan plan;
  std::vector<float> q, k, v, out;
  std::vector<std::int32_t> table{2, 0, -1, 4, 1, 3}, lens{6, 12};
  PagedCall() {
    AttentionParams p;
    p.B = 2;
    p.Sq = 1;
    p.H = 2;
    p.D = 4;
    p.num_blocks = 5;
    p.block_size = 4;
    p.max_blocks = 3;
    plan = AttentionPlan::make(p);
    q.assign(plan.q.extent, 0.5f);
    k.assign(plan.k.extent, 0.25f);
    v.assign(plan.v.extent, 1.0f);
    out.assign(plan.o.extent, sentinel());
  }
  [[nodiscard]] AttentionInputs<float> inputs() const {
    AttentionInputs<float> in{q, k, v};
    in.block_table = table;
    in.cache_seqlens = lens;
    return in;
  }
};

TEST(AttentionFeatureInputs, BlockTableEntriesInUseMustNameABlock) {
  const tandem::Backend ref = tandem::reference::backend();
  PagedCall c;
  // The valid call: entry [0, 2] = −1 is past cache_seqlens[0] = 6 (2 blocks).
  ref.attention_forward(c.plan, c.inputs(), c.out);
  EXPECT_FALSE(untouched(c.out));
  c.out.assign(c.out.size(), sentinel());
  c.table[1] = 5;
  expect_error([&] { ref.attention_forward(c.plan, c.inputs(), c.out); }, "block_table",
               {"block_table[1] = 5", "must lie in [0, num_blocks = 5)", "entry [0, 1]",
                "cache_seqlens[0] = 6"});
  c.table[1] = 0;
  c.table[5] = -1;
  expect_error([&] { ref.attention_forward(c.plan, c.inputs(), c.out); }, "block_table",
               {"block_table[5] = -1", "entry [1, 2]"});
  c.table[5] = 3;
  c.lens[1] = 13;
  expect_error([&] { ref.attention_forward(c.plan, c.inputs(), c.out); }, "cache_seqlens",
               {"cache_seqlens[1] = 13", "must lie in [0, 12]"});
  c.lens[1] = -1;
  expect_error([&] { ref.attention_forward(c.plan, c.inputs(), c.out); }, "cache_seqlens",
               {"cache_seqlens[1] = -1"});
  c.lens = {6};
  expect_error([&] { ref.attention_forward(c.plan, c.inputs(), c.out); }, "cache_seqlens.size()",
               {"cache_seqlens.size() = 1", "must be 2"});
  c.lens = {6, 12};
  c.table.pop_back();
  expect_error([&] { ref.attention_forward(c.plan, c.inputs(), c.out); }, "block_table.size()",
               {"block_table.size() = 5", "must be 6"});
  EXPECT_TRUE(untouched(c.out));
}

TEST(AttentionFeatureInputs, PagedCachesHaveNoBackward) {
  const tandem::Backend ref = tandem::reference::backend();
  PagedCall c;
  std::vector<float> dq(c.plan.dq.extent, sentinel()), dout(c.plan.o.extent, 1.0f);
  expect_error(
      [&] {
        ref.attention_backward(c.plan, c.inputs(), dout, {dq, {}, {}});
      },
      "block_table", {"has no backward"});
  expect_error([&] { ref.attention_backward_dq(c.plan, c.inputs(), dout, dq); }, "block_table",
               {"has no backward"});
  EXPECT_TRUE(untouched(dq));
}

TEST(AttentionFeatureInputs, DsinksAloneOrWithOthers) {
  const tandem::Backend ref = tandem::reference::backend();
  PackedCall c;
  // dsinks alone
  ref.attention_backward(c.plan, c.inputs(), c.dout, {{}, {}, {}, c.dsinks});
  EXPECT_FALSE(untouched(c.dsinks));
  EXPECT_TRUE(untouched(c.dq) && untouched(c.dk) && untouched(c.dv));
  const std::vector<float> alone = c.dsinks;
  // the same numbers with all four
  ref.attention_backward(c.plan, c.inputs(), c.dout, {c.dq, c.dk, c.dv, c.dsinks});
  EXPECT_EQ(c.dsinks, alone);
  // wrong size
  std::vector<float> three(3, sentinel());
  expect_error(
      [&] {
        ref.attention_backward(c.plan, c.inputs(), c.dout, {{}, {}, {}, three});
      },
      "dsinks.size()", {"dsinks.size() = 3", "must be 2"});
  EXPECT_TRUE(untouched(three));
}

}  // namespace

TEST(AttentionFeaturesPlanShapes, FeatureErrorsNameTheCallersInputs) {
  tandem::AttentionNames n;
  n.sinks = "s_aux";
  n.alibi_slopes = "slopes";
  n.cu_seqlens_q = "cu_q";
  n.cu_seqlens_k = "cu_k";
  const auto fails = [&](const tandem::AttentionShapes& s, const std::string& parameter,
                         std::initializer_list<std::string> fragments) {
    tandem::test::expect_error(
        [&] { tandem::AttentionPlan::from_shapes(s, tandem::test::attention_attrs(4), n); },
        parameter, fragments);
  };
  tandem::AttentionShapes s{{2, 5, 4, 8}, {2, 7, 2, 8}, {2, 7, 2, 8}};
  s.sinks = tandem::Shape{3};
  fails(s, "s_aux.shape", {"s_aux.shape = [3]", "num_heads = 4"});
  s.sinks.reset();
  s.alibi_slopes = tandem::Shape{3, 4};
  fails(s, "slopes.shape", {"slopes.shape = [3, 4]", "[n, H] = [2, 4]"});
  tandem::AttentionShapes p{{9, 4, 8}, {12, 2, 8}, {12, 2, 8}};
  p.cu_seqlens_q = tandem::Shape{3};
  fails(p, "cu_k", {"cu_k = (absent)", "required with cu_q"});
  p.cu_seqlens_k = tandem::Shape{4};
  fails(p, "cu_k.shape", {"cu_k.shape = [4]", "as cu_q"});
}
