// SPDX-License-Identifier: Apache-2.0
// Malformed views given to the entry points of low-precision storage and
// quantized caches (SPEC §8, §10): attention_forward_quantized, quantize_kv,
// the bf16/f16 forward with lse and backward family, the attention block,
// and the optimized backend's attention_decode_stored. Each call has one
// defect; it must throw a tandem::Error naming the input at fault and write
// nothing: every output, guards included, still holds its sentinel. A valid
// call on the same buffers first shows that the call writes them when
// nothing is wrong. On the reference and the optimized backend (every
// target), at float32, bfloat16 and float16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "support/tandem_test_support.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/tandem.hpp"
#ifdef TANDEM_HAVE_OPTIMIZED
#include "tandem/optimized/decode.hpp"
#endif

namespace tandem::test {
namespace {

/// The backends under test, each with a body that runs a check on it
/// (the optimized one once per target).
void for_each_backend(const std::function<void(const Backend&)>& check) {
  {
    SCOPED_TRACE("reference");
    check(reference::backend());
  }
#ifdef TANDEM_HAVE_OPTIMIZED
  const Backend opt = optimized::backend(optimized::Options{2});
  SCOPED_TRACE("optimized");
  for_each_target([&] { check(opt); });
#endif
}

/// One malformed call: what is wrong, the call, and the parameter its
/// Error must name.
struct Bad {
  std::string what;
  std::function<void()> call;
  std::string parameter;
  std::vector<std::string> fragments = {};  ///< what the message must also say
};

/// Each bad call throws an Error naming its parameter, and `clean()` (the
/// outputs' sentinels, reset before each call by `reset()`) holds after it.
void expect_rejected(const std::vector<Bad>& bad, const std::function<void()>& reset,
                     const std::function<bool()>& clean) {
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    reset();
    try {
      b.call();
      ADD_FAILURE() << "no tandem::Error thrown (expected one about " << b.parameter << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.parameter(), b.parameter) << "message: " << e.what();
      for (const std::string& fragment : b.fragments) {
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
            << "message \"" << e.what() << "\" lacks \"" << fragment << "\"";
      }
    }
    EXPECT_TRUE(clean()) << "an output was written by a malformed call";
  }
}

template <class T>
std::vector<T> values_of(std::int64_t n, unsigned seed) {
  const std::vector<float> x = random_values(static_cast<std::size_t>(n), seed);
  std::vector<T> out;
  out.reserve(x.size());
  for (const float e : x) out.push_back(T(static_cast<double>(e)));
  return out;
}

template <class T>
std::span<const T> shorter(const std::vector<T>& x) {
  return std::span<const T>(x).first(x.size() - 1);
}

template <class T>
class Malformed : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bfloat16, float16>;
TYPED_TEST_SUITE(Malformed, StorageTypes);

/// attention_forward_quantized (SPEC §10.4): codes, scales, the plain k and
/// v it must not be given, q, out and the plan's kv_cache.
TYPED_TEST(Malformed, AttentionForwardQuantizedWritesNothing) {
  using T = TypeParam;
  for (const KvCache cache : {KvCache::int8, KvCache::e4m3}) {
    SCOPED_TRACE(std::string(to_string(cache)));
    AttentionParams params = attention_params(1, 1, 8, 2, 1, 16);
    params.kv_cache = cache;
    AttentionCase<T> c(params);
    c.q = values_of<T>(c.plan.q.extent, 1);
    const AttentionPlan plain = AttentionPlan::make(attention_params(1, 1, 8, 2, 1, 16));
    AttentionInputs<T> in = c.inputs();
    in.k = {};
    in.v = {};
    AttentionInputs<T> with_k = in;
    with_k.k = c.k;
    AttentionInputs<T> short_q = in;
    short_q.q = shorter(c.q);
    const std::vector<std::uint8_t> codes(static_cast<std::size_t>(c.plan.k.extent), 0x11);
    const std::vector<float> scales(static_cast<std::size_t>(c.plan.kv_scale_size()), 0.5f);
    std::vector<float> nan_scale = scales, negative_scale = scales;
    nan_scale.back() = std::numeric_limits<float>::quiet_NaN();
    negative_scale.back() = -0.25f;
    std::vector<float> long_scales = scales;
    long_scales.push_back(0.5f);
    const QuantizedKv kv{codes, codes, scales, scales};
    for_each_backend([&](const Backend& b) {
      const auto& f = b.kernels<T>().attention_forward_quantized;
      ASSERT_TRUE(f) << b.name << " offers no attention_forward_quantized";
      GuardedOf<T> out(c.plan.o.extent);
      f(c.plan, in, kv, out.view());
      EXPECT_TRUE(out.written_within_guards());
      const auto run = [&](const AttentionPlan& p, const AttentionInputs<T>& i,
                           const QuantizedKv& q,
                           std::span<T> o) { return [&f, p, i, q, o] { f(p, i, q, o); }; };
      const std::span<T> o = out.view();
      expect_rejected(
          {
              {"k codes short", run(c.plan, in, {shorter(codes), codes, scales, scales}, o),
               "k_codes.size()"},
              {"v codes short", run(c.plan, in, {codes, shorter(codes), scales, scales}, o),
               "v_codes.size()"},
              {"k scales one too many", run(c.plan, in, {codes, codes, long_scales, scales}, o),
               "k_scale.size()"},
              {"v scale NaN",
               run(c.plan, in, {codes, codes, scales, nan_scale}, o),
               "v_scale",
               {"v_scale[" + std::to_string(scales.size() - 1) + "]", "finite"}},
              {"k scale negative",
               run(c.plan, in, {codes, codes, negative_scale, scales}, o),
               "k_scale",
               {">= 0"}},
              {"plain k beside the codes", run(c.plan, with_k, kv, o), "k.size()"},
              {"q short", run(c.plan, short_q, kv, o), "q.size()"},
              {"out short", run(c.plan, in, kv, o.first(o.size() - 1)), "out.size()"},
              {"plain plan", run(plain, in, kv, o), "kv_cache"},
          },
          [&] { out.reset(); }, [&] { return out.untouched(); });
    });
  }
}

/// A code byte quantize_kv never writes: −128 for int8 (codes clamp to
/// ±127), 0xFF (a NaN) for e4m3 (codes saturate to ±448).
std::uint8_t unwritten_code(KvCache cache) {
  return cache == KvCache::int8 ? 0x80 : 0xFF;
}

/// quantize_kv's views, good and bad, for one cache kind (SPEC §10.4).
template <class T>
struct QuantizeCall {
  AttentionPlan plan, plain;
  std::vector<T> k, v, k_nan, v_inf;
  GuardedOf<std::uint8_t> kc, vc;
  GuardedOf<float> ks, vs;

  explicit QuantizeCall(KvCache cache)
      : plan(AttentionPlan::make(params(cache))),
        plain(AttentionPlan::make(params(KvCache::plain))),
        k(values_of<T>(plan.k.extent, 2)),
        v(values_of<T>(plan.v.extent, 3)),
        k_nan(k),
        v_inf(v),
        kc(plan.k.extent, unwritten_code(cache)),
        vc(plan.v.extent, unwritten_code(cache)),
        ks(plan.kv_scale_size()),
        vs(plan.kv_scale_size()) {
    k_nan[3] = T(std::nan(""));
    v_inf.back() = T(std::numeric_limits<double>::infinity());
  }
  static AttentionParams params(KvCache cache) {
    AttentionParams p = attention_params(2, 1, 5, 2, 2, 8);
    p.kv_cache = cache;
    return p;
  }
  QuantizedKvOut out() { return {kc.view(), vc.view(), ks.view(), vs.view()}; }
  void reset() {
    kc.reset();
    vc.reset();
    ks.reset();
    vs.reset();
  }
  [[nodiscard]] bool clean() const {
    return kc.untouched() && vc.untouched() && ks.untouched() && vs.untouched();
  }
  /// The valid call writes every code and scale, and nothing beside them.
  void expect_valid_call_writes(const Backend& b) {
    reset();
    b.kernels<T>().quantize_kv(plan, k, v, out());
    EXPECT_TRUE(kc.written_within_guards() && vc.written_within_guards() &&
                ks.written_within_guards() && vs.written_within_guards());
  }
  std::function<void()> call(const Backend& b, const AttentionPlan& p, std::span<const T> kk,
                             std::span<const T> vv, const QuantizedKvOut& o) {
    const auto& f = b.kernels<T>().quantize_kv;
    return [&f, p, kk, vv, o] { f(p, kk, vv, o); };
  }
  /// Bad k or v values: not finite.
  std::vector<Bad> bad_values(const Backend& b) {
    return {
        {"k holds a NaN", call(b, plan, k_nan, v, out()), "k", {"finite"}},
        {"v holds an infinity", call(b, plan, k, v_inf, out()), "v", {"finite"}},
    };
  }
};

/// quantize_kv (SPEC §10.4): k and v, the four outputs' sizes and the
/// plan's kv_cache.
TYPED_TEST(Malformed, QuantizeKvViewsWriteNothing) {
  using T = TypeParam;
  for (const KvCache cache : {KvCache::int8, KvCache::e4m3}) {
    SCOPED_TRACE(std::string(to_string(cache)));
    QuantizeCall<T> q(cache);
    for_each_backend([&](const Backend& b) {
      ASSERT_TRUE(b.kernels<T>().quantize_kv) << b.name << " offers no quantize_kv";
      q.expect_valid_call_writes(b);
      const QuantizedKvOut out = q.out();
      QuantizedKvOut short_kc = out, short_vc = out, short_ks = out, no_vs = out;
      short_kc.k = out.k.first(out.k.size() - 1);
      short_vc.v = out.v.first(out.v.size() - 1);
      short_ks.k_scale = out.k_scale.first(out.k_scale.size() - 1);
      no_vs.v_scale = {};
      expect_rejected(
          {
              {"k short", q.call(b, q.plan, shorter(q.k), q.v, out), "k.size()"},
              {"v short", q.call(b, q.plan, q.k, shorter(q.v), out), "v.size()"},
              {"k codes short", q.call(b, q.plan, q.k, q.v, short_kc), "k_codes.size()"},
              {"v codes short", q.call(b, q.plan, q.k, q.v, short_vc), "v_codes.size()"},
              {"k scales short", q.call(b, q.plan, q.k, q.v, short_ks), "k_scale.size()"},
              {"v scales missing", q.call(b, q.plan, q.k, q.v, no_vs), "v_scale.size()"},
              {"plain plan", q.call(b, q.plain, q.k, q.v, out), "kv_cache"},
          },
          [&] { q.reset(); }, [&] { return q.clean(); });
    });
  }
}

/// quantize_kv throws naming k or v before writing anything when one of
/// their values is not finite (SPEC §10.4): the reference.
TYPED_TEST(Malformed, QuantizeKvNonFiniteValuesWriteNothingOnTheReference) {
  using T = TypeParam;
  for (const KvCache cache : {KvCache::int8, KvCache::e4m3}) {
    SCOPED_TRACE(std::string(to_string(cache)));
    QuantizeCall<T> q(cache);
    const Backend b = reference::backend();
    q.expect_valid_call_writes(b);
    expect_rejected(
        q.bad_values(b), [&] { q.reset(); }, [&] { return q.clean(); });
  }
}

#ifdef TANDEM_HAVE_OPTIMIZED
/// The same on the optimized backend (the rule is check_quantize's, which
/// both backends call).
TYPED_TEST(Malformed, QuantizeKvNonFiniteValuesWriteNothingOnTheOptimizedBackend) {
  using T = TypeParam;
  for (const KvCache cache : {KvCache::int8, KvCache::e4m3}) {
    SCOPED_TRACE(std::string(to_string(cache)));
    QuantizeCall<T> q(cache);
    const Backend b = optimized::backend(optimized::Options{2});
    for_each_target([&] {
      q.expect_valid_call_writes(b);
      expect_rejected(
          q.bad_values(b), [&] { q.reset(); }, [&] { return q.clean(); });
    });
  }
}
#endif

/// The forward with lse and the backward family at T (SPEC §2.5, §3, §8):
/// inputs, dout, the saved out and lse, each gradient's size, an empty
/// request, dsinks without sinks.
TYPED_TEST(Malformed, ForwardLseAndBackwardWriteNothing) {
  using T = TypeParam;
  AttentionCase<T> c(attention_params(1, 5, 7, 2, 1, 8, 0, Layout::bshd, MaskKind::causal));
  c.q = values_of<T>(c.plan.q.extent, 4);
  c.k = values_of<T>(c.plan.k.extent, 5);
  c.v = values_of<T>(c.plan.v.extent, 6);
  c.dout = values_of<T>(c.plan.o.extent, 7);
  const AttentionPlan& p = c.plan;
  const AttentionInputs<T> in = c.inputs();
  AttentionInputs<T> short_k = in;
  short_k.k = shorter(c.k);
  const std::span<const T> dout = c.dout;
  GuardedOf<T> out(p.o.extent), dq(p.dq.extent), dk(p.dk.extent), dv(p.dv.extent);
  GuardedOf<T> dsinks(p.H);
  GuardedOf<float> lse(p.lse_size());
  const auto reset = [&] {
    for (GuardedOf<T>* g : {&out, &dq, &dk, &dv, &dsinks}) g->reset();
    lse.reset();
  };
  const auto clean = [&] {
    return out.untouched() && lse.untouched() && dq.untouched() && dk.untouched() &&
           dv.untouched() && dsinks.untouched();
  };
  for_each_backend([&](const Backend& b) {
    const Kernels<T>& kt = b.kernels<T>();
    ASSERT_TRUE(kt.attention_forward_lse && kt.attention_backward && kt.attention_backward_saved &&
                kt.attention_backward_dq && kt.attention_backward_dk && kt.attention_backward_dv)
        << b.name << " lacks an entry point of the forward with lse or the backward";
    reset();
    kt.attention_forward_lse(p, in, out.view(), lse.view());
    EXPECT_TRUE(out.written_within_guards() && lse.written_within_guards());
    const std::vector<T> saved_out(out.view().begin(), out.view().end());
    const std::vector<float> saved_lse(lse.view().begin(), lse.view().end());
    const AttentionSaved<T> saved{saved_out, saved_lse};
    const AttentionSaved<T> short_lse{saved_out, shorter(saved_lse)};
    const AttentionSaved<T> short_out{shorter(saved_out), saved_lse};
    reset();
    kt.attention_backward(p, in, dout, {dq.view(), dk.view(), dv.view()});
    EXPECT_TRUE(dq.written_within_guards() && dk.written_within_guards() &&
                dv.written_within_guards());
    const auto grads = [&] { return AttentionGrads<T>{dq.view(), dk.view(), dv.view()}; };
    const auto all_short = [&] {
      return AttentionGrads<T>{dq.view(), dk.view().first(dk.view().size() - 1), dv.view()};
    };
    const auto with_dsinks = [&] {
      AttentionGrads<T> g = grads();
      g.dsinks = dsinks.view();
      return g;
    };
    expect_rejected(
        {
            {"forward_lse: k short",
             [&] { kt.attention_forward_lse(p, short_k, out.view(), lse.view()); }, "k.size()"},
            {"forward_lse: lse short",
             [&] { kt.attention_forward_lse(p, in, out.view(), lse.view().first(1)); },
             "lse.size()"},
            {"forward_lse: out short",
             [&] { kt.attention_forward_lse(p, in, out.view().first(1), lse.view()); },
             "out.size()"},
            {"backward: k short", [&] { kt.attention_backward(p, short_k, dout, grads()); },
             "k.size()"},
            {"backward: dout short",
             [&] { kt.attention_backward(p, in, shorter(c.dout), grads()); }, "dout.size()"},
            {"backward: dk short", [&] { kt.attention_backward(p, in, dout, all_short()); },
             "dk.size()"},
            {"backward: nothing asked", [&] { kt.attention_backward(p, in, dout, {}); }, "grads"},
            {"backward: dsinks without sinks",
             [&] { kt.attention_backward(p, in, dout, with_dsinks()); }, "dsinks.size()"},
            {"backward_saved: lse short",
             [&] { kt.attention_backward_saved(p, in, short_lse, dout, grads()); }, "lse.size()"},
            {"backward_saved: out short",
             [&] { kt.attention_backward_saved(p, in, short_out, dout, grads()); }, "out.size()"},
            {"backward_saved: dout short",
             [&] { kt.attention_backward_saved(p, in, saved, shorter(c.dout), grads()); },
             "dout.size()"},
            {"backward_dq: dq short",
             [&] { kt.attention_backward_dq(p, in, dout, dq.view().first(1)); }, "dq.size()"},
            {"backward_dk: dk long", [&] { kt.attention_backward_dk(p, in, dout, dq.view()); },
             "dk.size()"},
            {"backward_dv: dout short",
             [&] { kt.attention_backward_dv(p, in, shorter(c.dout), dv.view()); }, "dout.size()"},
        },
        reset, clean);
  });
}

/// The attention block at T (SPEC §7, §10.2): each input's size and out's.
TYPED_TEST(Malformed, AttentionBlockWritesNothing) {
  using T = TypeParam;
  AttentionBlockParams bp;
  bp.batch = 2;
  bp.seq = 3;
  bp.embed = 8;
  bp.heads = 2;
  bp.qkv_bias = true;
  const AttentionBlockPlan plan = AttentionBlockPlan::make(bp);
  const std::int64_t E = plan.E;
  const std::vector<T> x = values_of<T>(plan.x_size(), 8), w_qkv = values_of<T>(3 * E * E, 9),
                       b_qkv = values_of<T>(3 * E, 10), w_out = values_of<T>(E * E, 11),
                       b_out = values_of<T>(E, 12);
  const std::vector<float> keep(static_cast<std::size_t>(plan.B * plan.S), 1.0f);
  const AttentionBlockInputs<T> in{x, w_qkv, b_qkv, w_out, {}, {}, {}, {}};
  GuardedOf<T> out(plan.x_size());
  for_each_backend([&](const Backend& b) {
    const auto& f = b.kernels<T>().attention_block;
    ASSERT_TRUE(f) << b.name << " offers no attention_block";
    out.reset();
    f(plan, in, out.view());
    EXPECT_TRUE(out.written_within_guards());
    const auto with = [&](auto change) {
      AttentionBlockInputs<T> i = in;
      change(i);
      return [&f, &plan, &out, i] { f(plan, i, out.view()); };
    };
    expect_rejected(
        {
            {"x short", with([&](auto& i) { i.x = shorter(x); }), "x.size()"},
            {"w_qkv short", with([&](auto& i) { i.w_qkv = shorter(w_qkv); }), "w_qkv.size()"},
            {"b_qkv missing", with([&](auto& i) { i.b_qkv = {}; }), "b_qkv.size()"},
            {"b_out given without out_bias", with([&](auto& i) { i.b_out = b_out; }),
             "b_out.size()"},
            {"w_out short", with([&](auto& i) { i.w_out = shorter(w_out); }), "w_out.size()"},
            {"keep without key_padding", with([&](auto& i) { i.keep = keep; }), "keep.size()"},
            {"out short", [&] { f(plan, in, out.view().first(E)); }, "out.size()"},
        },
        [&] { out.reset(); }, [&] { return out.untouched(); });
  });
}

#ifdef TANDEM_HAVE_OPTIMIZED
/// optimized::attention_decode_stored (decode.hpp): each view's size, the
/// mask it is not given, and a rounding profile it does not implement.
template <class T>
void check_decode_stored() {
  AttentionCase<T> c(attention_params(2, 1, 9, 4, 2, 16));
  c.q = values_of<T>(c.plan.q.extent, 13);
  c.k = values_of<T>(c.plan.k.extent, 14);
  c.v = values_of<T>(c.plan.v.extent, 15);
  AttentionParams ggml_params = attention_params(2, 1, 9, 4, 2, 16);
  ggml_params.rounding = kRoundingGgml;
  const AttentionPlan ggml = AttentionPlan::make(ggml_params);
  const AttentionPlan& p = c.plan;
  const AttentionInputs<T> in = c.inputs();
  const std::vector<float> keep(static_cast<std::size_t>(p.B * p.Sk), 1.0f);
  const auto with = [&](auto change) {
    AttentionInputs<T> i = in;
    change(i);
    return i;
  };
  GuardedOf<T> out(p.o.extent);
  GuardedOf<float> lse(p.lse_size());
  const optimized::Options options{2};
  for_each_target([&] {
    out.reset();
    lse.reset();
    ASSERT_TRUE(optimized::attention_decode_stored<T>(p, in, out.view(), lse.view(), options));
    EXPECT_TRUE(out.written_within_guards() && lse.written_within_guards());
    const auto run = [&](const AttentionPlan& plan, const AttentionInputs<T>& i, std::span<T> o,
                         std::span<float> l) {
      return [plan, i, o, l, &options] {
        optimized::attention_decode_stored<T>(plan, i, o, l, options);
      };
    };
    const std::span<T> o = out.view();
    const std::span<float> l = lse.view();
    expect_rejected(
        {
            {"q short", run(p, with([&](auto& i) { i.q = shorter(c.q); }), o, l), "q.size()"},
            {"k short", run(p, with([&](auto& i) { i.k = shorter(c.k); }), o, l), "k.size()"},
            {"v short", run(p, with([&](auto& i) { i.v = shorter(c.v); }), o, l), "v.size()"},
            {"a mask for a maskless plan", run(p, with([&](auto& i) { i.mask = keep; }), o, l),
             "mask.size()"},
            {"out short", run(p, in, o.first(o.size() - 1), l), "out.size()"},
            {"lse long by the guard", run(p, in, o, {l.data(), l.size() + 1}), "lse.size()"},
            {"ggml profile", run(ggml, in, o, l), "rounding", {"ggml"}},
        },
        [&] {
          out.reset();
          lse.reset();
        },
        [&] { return out.untouched() && lse.untouched(); });
  });
}

TEST(MalformedDecodeStored, Bf16WritesNothing) {
  check_decode_stored<bfloat16>();
}
TEST(MalformedDecodeStored, F16WritesNothing) {
  check_decode_stored<float16>();
}
#endif

}  // namespace
}  // namespace tandem::test
