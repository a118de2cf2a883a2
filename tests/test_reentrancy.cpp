// SPDX-License-Identifier: Apache-2.0
// Reentrancy: tandem is called from programs with threads of their own
// (servers, data loaders). Many std::threads call every entry point of the
// reference and the optimized backends at once — different shapes, masks,
// geometries and `threads` settings per call — and every result has the bits
// of the same call made alone; that the jobs call every entry point is
// counted through tandem::for_each_entry_point. Run under ThreadSanitizer by
// .ci/tsan.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/reference/flex.hpp"

namespace {

using tandem::AttentionPlan;
using tandem::Backend;
using tandem::Layout;
using tandem::MaskKind;
using tandem::test::attention_params;
using tandem::test::random_values;

/// One call: runs it on fresh outputs and returns every output, concatenated.
struct Job {
  std::string name;
  std::function<std::vector<float>()> run;
};

/// Inputs of one attention call, owned: the dense ones, and those of the
/// features its plan takes (sinks, ALiBi slopes, packed sequences' offsets,
/// a paged cache's block table and lengths).
struct AttentionCase {
  AttentionPlan plan;
  std::vector<float> q, k, v, mask, dout, sinks, slopes;
  std::vector<std::int64_t> cu_q, cu_k, table, lens;
  tandem::AttentionInputs<float> inputs() const {
    return {q, k, v, mask, sinks, slopes, cu_q, cu_k, {}, table, lens};
  }
};

/// An attention case with random data; `fill` sets the feature inputs.
AttentionCase attention_case(const tandem::AttentionParams& p, unsigned seed,
                             const std::function<void(AttentionCase&)>& fill = {}) {
  AttentionCase a;
  a.plan = AttentionPlan::make(p);
  if (fill) fill(a);
  const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
  if (p.sinks) a.sinks = random_values(n(p.H), seed + 5, -2.0f, 2.0f);
  a.q = random_values(n(a.plan.q.extent), seed);
  a.k = random_values(n(a.plan.k.extent), seed + 1);
  a.v = random_values(n(a.plan.v.extent), seed + 2);
  a.mask = random_values(n(a.plan.mask_size()), seed + 3, -2.0f, 2.0f);
  if (p.alibi != tandem::AlibiKind::none) {
    a.slopes =
        random_values(n(p.alibi == tandem::AlibiKind::per_head ? p.H : a.plan.sequences() * p.H),
                      seed + 6, 0.0f, 1.0f);
  }
  if (p.mask == MaskKind::key_padding) {
    for (std::size_t j = 0; j < a.mask.size(); ++j) a.mask[j] = j % 3 == 1 ? 0.0f : 1.0f;
  }
  a.dout = random_values(n(a.plan.o.extent), seed + 4);
  return a;
}

std::vector<float> zeros(std::int64_t n) {
  return std::vector<float>(static_cast<std::size_t>(n), 0.0f);
}

/// scales ++ codes ++ out of quantize_kv and attention_forward_quantized with
/// `a`'s plan as an int8 and an e4m3 cache (SPEC §10.4), where `b` offers them.
void add_quantized_jobs(const Backend& b, const std::string& tag, const AttentionCase& a,
                        std::vector<Job>& jobs) {
  if (!b.quantize_kv || !b.attention_forward_quantized) return;
  for (const tandem::KvCache kind : {tandem::KvCache::int8, tandem::KvCache::e4m3}) {
    AttentionPlan p = a.plan;
    p.kv_cache = kind;
    jobs.push_back(
        {tag + " quantize_kv + attention_forward_quantized " + to_string(kind), [b, &a, p] {
           std::vector<std::uint8_t> kc(static_cast<std::size_t>(p.k.extent)),
               vc(static_cast<std::size_t>(p.v.extent));
           std::vector<float> ks = zeros(p.kv_scale_size()), vs = zeros(p.kv_scale_size()),
                              out = zeros(p.o.extent);
           b.quantize_kv(p, a.k, a.v, {kc, vc, ks, vs});
           tandem::AttentionInputs<float> in = a.inputs();
           in.k = {};
           in.v = {};
           b.attention_forward_quantized(p, in, {kc, vc, ks, vs}, out);
           for (const auto* c : {&kc, &vc}) ks.insert(ks.end(), c->begin(), c->end());
           ks.insert(ks.end(), vs.begin(), vs.end());
           ks.insert(ks.end(), out.begin(), out.end());
           return ks;
         }});
  }
}

/// out ++ lse ++ dq ++ dk ++ dv (++ dsinks) of every attention entry point of
/// `b`: the forward ones alone for a paged cache (which has no backward); and
/// the quantized cache's (add_quantized_jobs).
void add_attention_jobs(const Backend& b, const std::string& tag, const AttentionCase& a,
                        std::vector<Job>& jobs) {
  add_quantized_jobs(b, tag, a, jobs);
  const AttentionPlan& p = a.plan;
  jobs.push_back({tag + " attention_forward", [b, &a, p] {
                    std::vector<float> out = zeros(p.o.extent);
                    b.attention_forward(p, a.inputs(), out);
                    return out;
                  }});
  if (p.paged()) {
    jobs.push_back({tag + " attention_forward_lse", [b, &a, p] {
                      std::vector<float> out = zeros(p.o.extent), lse = zeros(p.lse_size());
                      b.attention_forward_lse(p, a.inputs(), out, lse);
                      out.insert(out.end(), lse.begin(), lse.end());
                      return out;
                    }});
    return;
  }
  jobs.push_back({tag + " attention_forward_lse + backward_saved", [b, &a, p] {
                    std::vector<float> out = zeros(p.o.extent), lse = zeros(p.lse_size());
                    b.attention_forward_lse(p, a.inputs(), out, lse);
                    std::vector<float> dq = zeros(p.dq.extent), dk = zeros(p.dk.extent),
                                       dv = zeros(p.dv.extent);
                    b.attention_backward_saved(p, a.inputs(), {out, lse}, a.dout, {dq, dk, dv});
                    for (const auto* x : {&lse, &dq, &dk, &dv})
                      out.insert(out.end(), x->begin(), x->end());
                    return out;
                  }});
  jobs.push_back({tag + " attention_backward", [b, &a, p] {
                    std::vector<float> dq = zeros(p.dq.extent), dk = zeros(p.dk.extent),
                                       dv = zeros(p.dv.extent), dsinks = zeros(p.sinks ? p.H : 0);
                    b.attention_backward(p, a.inputs(), a.dout, {dq, dk, dv, dsinks});
                    for (const auto* x : {&dk, &dv, &dsinks})
                      dq.insert(dq.end(), x->begin(), x->end());
                    return dq;
                  }});
  jobs.push_back({tag + " attention_backward_dq/dk/dv", [b, &a, p] {
                    std::vector<float> dq = zeros(p.dq.extent), dk = zeros(p.dk.extent),
                                       dv = zeros(p.dv.extent);
                    b.attention_backward_dq(p, a.inputs(), a.dout, dq);
                    b.attention_backward_dk(p, a.inputs(), a.dout, dk);
                    b.attention_backward_dv(p, a.inputs(), a.dout, dv);
                    dq.insert(dq.end(), dk.begin(), dk.end());
                    dq.insert(dq.end(), dv.begin(), dv.end());
                    return dq;
                  }});
}

/// The inputs of the other ops, owned, shared by every job.
struct OtherInputs {
  tandem::RopePlan rope;
  tandem::RopeQkPlan rope_qk;
  std::vector<float> x, xk, cos, sin;
  tandem::AxialRopePlan axial;
  std::vector<float> ax;
  tandem::SwigluPlan swiglu;
  std::vector<float> sx, sdy;
  tandem::AttentionBlockPlan block;
  std::vector<float> bx, w_qkv, b_qkv, w_out, b_out, keep;
  tandem::FlexPlan flex;  // causal with a learned relative bias, through a block mask
  tandem::FlexBlockMask flex_blocks;
  std::vector<float> fq, fk, fv, frel, fdout;

  OtherInputs() {
    tandem::RopeParams rp;
    rp.batch = 2;
    rp.seq = 37;
    rp.head_dim = 20;
    rp.width = 60;  // 3 heads
    rp.n_rot = 12;
    rp.table_rows = 37;
    rope = tandem::RopePlan::make(rp);
    tandem::RopeQkParams qp;
    qp.q = rp;
    qp.k_width = 20;
    rope_qk = tandem::RopeQkPlan::make(qp);
    x = random_values(4440, 11);   // [2, 37, 60]
    xk = random_values(1480, 12);  // [2, 37, 20]
    cos = random_values(222, 13);  // [37, 6]
    sin = random_values(222, 14);
    tandem::AxialRopeParams ap;
    ap.batch = 2;
    ap.end_x = 5;
    ap.end_y = 3;
    ap.repeat_factor = 2;
    ap.seq = 30;
    ap.width = 32;  // 2 heads of 16
    ap.num_heads = 2;
    axial = tandem::AxialRopePlan::make(ap);
    ax = random_values(1920, 15);  // [2, 30, 32]
    tandem::SwigluParams sp;
    sp.rows = 70;
    sp.n = 23;
    swiglu = tandem::SwigluPlan::make(sp);
    sx = random_values(3220, 16, -6.0f, 6.0f);  // [70, 46]
    sdy = random_values(1610, 17);              // [70, 23]
    flex_inputs();
    const std::int64_t B = 2, S = 19, E = 24;
    block = tandem::AttentionBlockPlan::from_shapes({B, S, E}, {3 * E, E}, tandem::Shape{3 * E},
                                                    {E, E}, tandem::Shape{E}, tandem::Shape{B, S},
                                                    std::nullopt, std::nullopt, 3);
    bx = random_values(B * S * E, 18);
    w_qkv = random_values(3 * E * E, 19, -0.3f, 0.3f);
    b_qkv = random_values(3 * E, 20);
    w_out = random_values(E * E, 21, -0.3f, 0.3f);
    b_out = random_values(E, 22);
    keep.assign(B * S, 1.0f);
    keep[5] = keep[S + 7] = 0.0f;
  }
  void flex_inputs();
};

void add_other_jobs(const Backend& b, const std::string& tag, const OtherInputs& in,
                    std::vector<Job>& jobs) {
  jobs.push_back({tag + " rope_forward/backward", [b, &in] {
                    const tandem::RopeTables<float> tables{in.cos, in.sin};
                    std::vector<float> y(in.x.size()), dx(in.x.size());
                    b.rope_forward(in.rope, in.x, tables, y);
                    b.rope_backward(in.rope, y, tables, dx);
                    y.insert(y.end(), dx.begin(), dx.end());
                    return y;
                  }});
  jobs.push_back({tag + " rope_forward_qk/backward_qk", [b, &in] {
                    const tandem::RopeTables<float> tables{in.cos, in.sin};
                    std::vector<float> q(in.x.size()), k(in.xk.size()), dq(in.x.size()),
                        dk(in.xk.size());
                    b.rope_forward_qk(in.rope_qk, in.x, in.xk, tables, q, k);
                    b.rope_backward_qk(in.rope_qk, q, k, tables, dq, dk);
                    for (const auto* v : {&k, &dq, &dk}) q.insert(q.end(), v->begin(), v->end());
                    return q;
                  }});
  jobs.push_back({tag + " axial_rope_forward/backward", [b, &in] {
                    std::vector<float> y(in.ax.size()), dx(in.ax.size());
                    b.axial_rope_forward(in.axial, in.ax, y);
                    b.axial_rope_backward(in.axial, y, dx);
                    y.insert(y.end(), dx.begin(), dx.end());
                    return y;
                  }});
  jobs.push_back({tag + " swiglu_forward/backward", [b, &in] {
                    std::vector<float> y(in.sdy.size()), dx(in.sx.size());
                    b.swiglu_forward(in.swiglu, in.sx, y);
                    b.swiglu_backward(in.swiglu, in.sx, in.sdy, dx);
                    y.insert(y.end(), dx.begin(), dx.end());
                    return y;
                  }});
  jobs.push_back({tag + " flex_forward/backward", [b, &in] {
                    const tandem::FlexInputs<float> fi{
                        in.fq, in.fk, in.fv, {{in.frel}, {{}}}, {}, in.flex_blocks.data()};
                    std::vector<float> out(in.fq.size()), lse(168), dq(in.fq.size());
                    std::vector<float> dk(in.fk.size()), dv(in.fv.size()), drel(in.frel.size());
                    b.flex_forward(in.flex, fi, out, lse);
                    b.flex_backward(in.flex, fi, in.fdout, {dq, dk, dv, {drel}});
                    for (const auto* v : {&lse, &dq, &dk, &dv, &drel}) {
                      out.insert(out.end(), v->begin(), v->end());
                    }
                    return out;
                  }});
  jobs.push_back({tag + " attention_block", [b, &in] {
                    std::vector<float> out(in.bx.size());
                    const tandem::AttentionBlockInputs<float> bi{
                        in.bx, in.w_qkv, in.b_qkv, in.w_out, in.b_out, in.keep, {}, {}};
                    b.attention_block(in.block, bi, out);
                    return out;
                  }});
}

/// FlexAttention's inputs: B 2, H 4, Hkv 2, S 21, D 8, blocks of 8.
void OtherInputs::flex_inputs() {
  tandem::FlexParams fp;
  fp.B = 2;
  fp.H = 4;
  fp.Hkv = 2;
  fp.Sq = fp.Sk = 21;
  fp.D = 8;
  tandem::ModProgram& m = fp.mask_mod;
  m.set_result(m.kv_idx() <= m.q_idx());
  tandem::ModProgram& s = fp.score_mod;
  const auto rel = s.capture({"rel", {4, 41}, tandem::ModType::real, 0, 0});
  s.set_result(s.score() + s.load(rel, {s.h(), s.q_idx() - s.kv_idx() + s.integer(20)}));
  flex_blocks = tandem::reference::create_block_mask<float>(tandem::FlexPlan::make(fp), {}, 8, 8);
  fp.block_mask = flex_blocks.shape;
  flex = tandem::FlexPlan::make(fp);
  fq = random_values(1344, 18);  // [2, 4, 21, 8]
  fk = random_values(672, 19);   // [2, 2, 21, 8]
  fv = random_values(672, 20);
  frel = random_values(164, 21);
  fdout = random_values(1344, 22);
}

/// The backends of the test: the reference, and the optimized backend at 1,
/// 2 and 3 threads per call and at the default threads, at the default
/// geometry and at a small one (blocks of 3 keys, split-key decode from 2
/// chunks of 5 keys, the backward in query parts), so that concurrent calls
/// take every path of the kernels.
std::vector<std::pair<std::string, Backend>> backends() {
  std::vector<std::pair<std::string, Backend>> out{{"reference", tandem::reference::backend()}};
#ifdef TANDEM_HAVE_OPTIMIZED
  namespace opt = tandem::optimized;
  opt::Geometry small;
  small.key_block = 3;
  small.edge_block = 2;
  small.rows_per_tile = 6;
  small.rows_per_tile_banded = 4;
  small.split_keys_chunk = 5;
  small.split_keys_contiguous_heads = 1 << 20;
  small.backward_min_tasks = 6;
  for (int t : {0, 1, 2, 3}) {
    out.emplace_back("optimized threads=" + std::to_string(t), opt::backend(opt::Options{t}));
    out.emplace_back("optimized small threads=" + std::to_string(t),
                     opt::backend(opt::Options{t, small}));
  }
#endif
  return out;
}

/// Attention cases: causal prefill in bshd crossing key blocks, a GQA decode
/// step over a long cache (split-key decode at the default geometry), a
/// sliding window with softcap in bhsd, key padding and a bias.
std::vector<AttentionCase> attention_cases() {
  std::vector<AttentionCase> out;
  out.push_back(attention_case(
      attention_params(2, 70, 70, 4, 2, 16, 8, Layout::bshd, MaskKind::causal), 100));
  out.push_back(attention_case(attention_params(1, 1, 2100, 4, 1, 8), 200));
  auto windowed =
      attention_params(1, 23, 41, 2, 2, 12, 12, Layout::bhsd, MaskKind::sliding_window, 6);
  windowed.softcap = 5.0;
  out.push_back(attention_case(windowed, 300));
  out.push_back(attention_case(
      attention_params(2, 9, 67, 3, 1, 5, 7, Layout::bshd, MaskKind::key_padding), 400));
  auto biased = attention_params(1, 13, 29, 2, 1, 9, 9, Layout::bshd, MaskKind::bias);
  biased.bias_heads = 2;
  out.push_back(attention_case(biased, 500));
  // sinks and ALiBi per head, causal, GQA
  auto sinks = attention_params(2, 33, 40, 4, 2, 8, 8, Layout::bshd, MaskKind::causal);
  sinks.sinks = true;
  sinks.alibi = tandem::AlibiKind::per_head;
  out.push_back(attention_case(sinks, 600));
  // three packed sequences (one without queries), ALiBi per sequence
  auto packed = attention_params(1, 30, 75, 2, 1, 8, 8, Layout::bshd, MaskKind::causal);
  packed.num_seqs = 3;
  packed.alibi = tandem::AlibiKind::per_batch_head;
  out.push_back(attention_case(packed, 700, [](AttentionCase& a) {
    a.cu_q = {0, 20, 20, 30};
    a.cu_k = {0, 25, 60, 75};
  }));
  // decode steps from a paged cache: blocks of 16, shuffled
  auto paged = attention_params(2, 1, 0, 4, 2, 16, 16);
  paged.num_blocks = 12;
  paged.block_size = 16;
  paged.max_blocks = 5;
  out.push_back(attention_case(paged, 800, [](AttentionCase& a) {
    a.table = {7, 2, 9, 0, -1, 4, 11, 1, 3, 10};  // [2, 5]; entry 0 needs 4 blocks
    a.lens = {60, 70};
  }));
  return out;
}

/// `b` with every entry point counting its calls in `calls[name]` (serial
/// calls only), whatever its signature.
Backend counting(Backend b, std::map<std::string, int>& calls) {
  tandem::for_each_entry_point(b, [&calls](std::string_view name, auto& entry) {
    int& n = calls[std::string(name)];
    entry = [inner = entry, &n](const auto&... args) {
      ++n;
      inner(args...);
    };
  });
  return b;
}

TEST(Reentrancy, TheJobsCallEveryEntryPoint) {
  std::map<std::string, int> calls;
  const Backend b = counting(tandem::reference::backend(), calls);
  const std::vector<AttentionCase> cases = attention_cases();
  const OtherInputs other;
  std::vector<Job> jobs;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    add_attention_jobs(b, "case " + std::to_string(i), cases[i], jobs);
  }
  add_other_jobs(b, "reference", other, jobs);
  for (const Job& job : jobs) job.run();
  for (const auto& [name, n] : calls) EXPECT_GT(n, 0) << name << " is in no job";
}

TEST(Reentrancy, ConcurrentCallsGiveTheBitsOfSerialCalls) {
  const std::vector<AttentionCase> cases = attention_cases();
  const OtherInputs other;
  const auto all = backends();
  std::vector<Job> jobs;
  jobs.reserve(all.size() * (4 * cases.size() + 5));
  for (const auto& [tag, b] : all) {
    for (std::size_t i = 0; i < cases.size(); ++i) {
      add_attention_jobs(b, tag + " case " + std::to_string(i), cases[i], jobs);
    }
    add_other_jobs(b, tag, other, jobs);
  }
  std::vector<std::vector<float>> serial;
  serial.reserve(jobs.size());
  for (const Job& job : jobs) serial.push_back(job.run());

  // Every thread runs every job, each starting at another one, twice over,
  // so that every pair of entry points overlaps somewhere.
  constexpr std::size_t kThreads = 8;
  std::vector<std::vector<std::string>> failures(kThreads);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::size_t n = jobs.size();
      for (std::size_t i = 0; i < 2 * n; ++i) {
        const std::size_t at = (t * n / kThreads + i) % n;
        if (!tandem::test::bitwise_equal(jobs[at].run(), serial[at])) {
          failures[t].push_back(jobs[at].name);
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (std::size_t t = 0; t < kThreads; ++t) {
    for (const std::string& name : failures[t]) ADD_FAILURE() << "thread " << t << ": " << name;
  }
  // The serial results are results: outputs of the right size with finite
  // values (the inputs are finite), so equal bits are not equal garbage.
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_FALSE(serial[i].empty()) << jobs[i].name;
    EXPECT_TRUE(std::all_of(serial[i].begin(), serial[i].end(), [](float x) {
      return std::isfinite(x);
    })) << jobs[i].name;
  }
}

}  // namespace
