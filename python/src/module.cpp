// SPDX-License-Identifier: Apache-2.0
/// @file module.cpp
/// @brief tandem._ext: the kernels of the public API for Python (nanobind).
///
/// A client of include/tandem like the `tandem` command. The Python package
/// (python/tandem/) reads each op's keyword arguments, asks the C++ shape
/// rules for the op's Params and the shapes its arrays are read in
/// (attention_call, SPEC §1), and allocates the outputs; each kernel function
/// here makes the op's plan (which validates the call), checks every array
/// against it without copying it, releases the GIL and runs the kernel. Element type (the
/// storage type of the call, SPEC §10.1): float32, bfloat16 and float16 run the named backend
/// (`backend.kernels<T>()`); float64 runs the reference templated in double.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>

#include "arrays.hpp"
#include "tandem/reference/attention_block.hpp"
#include "tandem/reference/backend.hpp"
#include "tandem/reference/flex.hpp"
#include "tandem/reference/kernels.hpp"
#include "tandem/reference/rounding_bound.hpp"
#include "tandem/tandem.hpp"
#ifdef TANDEM_PYTHON_HAVE_OPTIMIZED
#include "tandem/optimized/backend.hpp"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace tandem::python {
namespace {

// ---------------------------------------------------------------------------
// Which implementation runs a call

/// The implementations by name, built once (the optimized one again when
/// its thread count or its batch-invariant switch changes).
struct Implementations {
  int threads = 0;
  /// optimized::Geometry::invariant of the optimized backend (SPEC §12).
  bool invariant = false;
  std::optional<Backend> optimized;
  Backend reference = tandem::reference::backend();
  Kernels<float> optimized_k, reference_k = reference,
                              reference_fp32acc = tandem::reference::kernels<float, float>();
  Kernels<double> reference_f64 = tandem::reference::kernels<double>();

  /// Rebuilds the optimized backend with `n` threads per call (0 = every
  /// core) and Geometry::invariant = `inv`, the other fields the defaults.
  void rebuild(int n, bool inv) {
#ifdef TANDEM_PYTHON_HAVE_OPTIMIZED
    tandem::optimized::Geometry geo;
    geo.invariant = inv;
    optimized = tandem::optimized::backend(tandem::optimized::Options{n, geo});
    optimized_k = *optimized;
    threads = n;
    invariant = inv;
#else
    (void)n;
    (void)inv;
#endif
  }
  void set_threads(int n) {
    rebuild(n, invariant);
  }
  void set_invariant(bool on) {
    rebuild(threads, on);
  }
};

Implementations& implementations() {
  static Implementations impl = [] {
    Implementations i;
    i.rebuild(0, false);
    return i;
  }();
  return impl;
}

const char* const kBackends = "optimized, reference or reference_fp32acc";

/// The kernels that run a call with element type T on backend `name`:
/// float32, bfloat16 and float16 on the named backend (`backend.kernels<T>()`,
/// SPEC §10), float64 on the reference in double.
template <class T>
const Kernels<T>& kernels(const std::string& name) {
  Implementations& impl = implementations();
  if constexpr (is_low_precision_v<T>) {
    if (name == "optimized" && impl.optimized) return impl.optimized->template kernels<T>();
    if (name == "reference") return impl.reference.template kernels<T>();
    throw Error("backend", "backend = '" + name + "' must be optimized or reference for " +
                               dtype_name(dtype_v<T>) +
                               (name == "optimized" ? " (built without the optimized backend)"
                                                    : " (reference_fp32acc runs float32 only)"));
  } else if constexpr (std::is_same_v<T, double>) {
    if (name == "optimized" || name == "reference") return impl.reference_f64;
    throw Error("backend", "backend = '" + name + "' must be optimized or reference for float64 " +
                               "(both run the reference in double)");
  } else {
    if (name == "optimized" && impl.optimized) return impl.optimized_k;
    if (name == "reference") return impl.reference_k;
    if (name == "reference_fp32acc") return impl.reference_fp32acc;
    throw Error("backend", "backend = '" + name + "' must be " + kBackends);
  }
}

/// Calls f(T{}) with T the element type of `a` (float, double, bfloat16 or
/// float16): the call's storage type, which every other input of T must have
/// (require_layout names the one that differs before anything is written).
template <class F>
void with_dtype(const In& a, const std::string& name, F&& f) {
  const Dtype t = dtype_of(a, name);
  first_input = name;
  switch (t) {
    case Dtype::float32:
      f(float{});
      break;
    case Dtype::float64:
      f(double{});
      break;
    case Dtype::bfloat16:
      f(bfloat16{});
      break;
    case Dtype::float16:
      f(float16{});
      break;
  }
}

/// `entry` of backend `backend` at storage type T; throws Error naming the
/// backend when it does not offer it there (an empty std::function, SPEC §10.1).
template <class T, class F>
const F& offered(const F& entry, const char* name, const std::string& backend) {
  if (!entry) {
    throw Error("backend", "backend = '" + backend + "' does not offer " + name + " at " +
                               dtype_name(dtype_v<T>) + " storage (SPEC §10)");
  }
  return entry;
}

/// lse `[B,H,Sq]` of storage type T: stat_t<T>, float32 for bfloat16 and
/// float16 (SPEC §10.1), T otherwise; writable.
template <class T>
std::span<stat_t<T>> lse_out(const std::optional<Out>& a, const Shape& shape) {
  if constexpr (std::is_same_v<stat_t<T>, T>) {
    return out_span<T>(a, "lse", shape);
  } else {
    return a ? float_out_span(*a, "lse", shape) : std::span<float>{};
  }
}

/// lse `[B,H,Sq]` of storage type T, read-only (as lse_out).
template <class T>
std::span<const stat_t<T>> lse_in(const In& a, const Shape& shape) {
  if constexpr (std::is_same_v<stat_t<T>, T>) {
    return in_span<T>(a, "lse", contiguous(shape), count(shape));
  } else {
    return float_span(a, "lse", contiguous(shape), count(shape));
  }
}

// ---------------------------------------------------------------------------
// Attention

/// Shape and strides of a multi-head tensor of the plan: [B, S, heads, width]
/// in bshd, [B, heads, S, width] in bhsd, placed by `st` (B and S: the
/// batch and sequence axes, `[num_blocks, block_size]` for a paged cache).
Expect heads_layout(const AttentionPlan& p, const Strides& st, std::int64_t B, std::int64_t S,
                    std::int64_t heads, std::int64_t width) {
  if (p.layout == Layout::bshd) return {{B, S, heads, width}, {st.batch, st.seq, st.head, 1}};
  return {{B, heads, S, width}, {st.batch, st.head, st.seq, 1}};
}

/// The shape of the mask the plan's kind takes (keep [B, Sk] or bias
/// [Bb, Hb, Sq, Sk]); nullopt when it takes none.
std::optional<Shape> mask_shape(const AttentionPlan& p) {
  if (p.mask == MaskKind::key_padding) return Shape{p.B, p.Sk};
  if (p.mask == MaskKind::bias) return Shape{p.bias_batch, p.bias_heads, p.Sq, p.Sk};
  return std::nullopt;
}

/// An input of `inputs` by name; nullopt when absent or None.
std::optional<In> input(const nb::dict& inputs, const char* name) {
  if (!inputs.contains(name) || inputs[name].is_none()) return std::nullopt;
  return nb::cast<In>(inputs[name]);
}

/// The feature inputs of `inputs` (SPEC §2.7–2.10) into `in`: sinks [H]
/// (element type T), ALiBi slopes [H] or [n, H] (float32), cu_seqlens_q and
/// cu_seqlens_k [n+1], seqused_k [n] (optional), key_origin [n] (optional), block_table [B,
/// max_blocks] and cache_seqlens [B] (int32 or int64), each given exactly when the plan takes it;
/// the kernel checks their values.
template <class T>
void feature_inputs(const AttentionPlan& p, const nb::dict& inputs, AttentionInputs<T>& in) {
  const auto taken = [&](const char* name, bool takes) {
    std::optional<In> a = input(inputs, name);
    if (takes && !a) fail(name, "(absent)", "is required by the call (" + p.describe() + ")");
    if (!takes && a) {
      fail(name, to_string(shape_of(*a)),
           "must be absent (the call takes none: " + p.describe() + ")");
    }
    return a;
  };
  if (const std::optional<In> sinks = taken("sinks", p.sinks)) {
    in.sinks = in_span<T>(*sinks, "sinks", contiguous({p.H}), p.H);
  }
  if (const std::optional<In> slopes = taken("alibi_slopes", p.alibi != AlibiKind::none)) {
    const Shape s = p.alibi == AlibiKind::per_head ? Shape{p.H} : Shape{p.sequences(), p.H};
    in.alibi_slopes = float_span(*slopes, "alibi_slopes", contiguous(s), count(s));
  }
  const std::int64_t n = p.num_seqs;
  in.cu_seqlens_q = index_view(taken("cu_seqlens_q", p.varlen()), "cu_seqlens_q", {n + 1});
  in.cu_seqlens_k = index_view(taken("cu_seqlens_k", p.varlen()), "cu_seqlens_k", {n + 1});
  const std::optional<In> used = input(inputs, "seqused_k");
  if (used && !p.varlen()) taken("seqused_k", false);
  in.seqused_k = index_view(used, "seqused_k", {n});
  in.block_table = index_view(taken("block_table", p.paged()), "block_table", {p.B, p.max_blocks});
  in.cache_seqlens = index_view(taken("cache_seqlens", p.paged()), "cache_seqlens", {p.B});
  in.key_origin = index_view(input(inputs, "key_origin"), "key_origin", {p.sequences()});
}

/// The one place where the arrays of an attention call become its views:
/// q, k, v (read through the plan's strides; k and v not for a quantized
/// cache, whose codes are quantized_kv's), the mask and the feature inputs.
template <class T>
AttentionInputs<T> attention_inputs(const AttentionPlan& p, const nb::dict& inputs) {
  const auto need = [&](const char* name) {
    std::optional<In> a = input(inputs, name);
    if (!a) throw Error(name, std::string(name) + " = (absent) is required");
    return *a;
  };
  AttentionInputs<T> in;
  const std::int64_t KB = p.kv_batch(), KS = p.kv_seq();
  in.q = in_span<T>(need("q"), "q", heads_layout(p, p.q, p.B, p.Sq, p.H, p.D), p.q.extent);
  if (p.kv_cache == KvCache::plain) {
    in.k = in_span<T>(need("k"), "k", heads_layout(p, p.k, KB, KS, p.Hkv, p.D), p.k.extent);
    in.v = in_span<T>(need("v"), "v", heads_layout(p, p.v, KB, KS, p.Hkv, p.Dv), p.v.extent);
  }
  const std::optional<In> mask = input(inputs, "mask");
  const std::optional<Shape> shape = mask_shape(p);
  if (mask && !shape) {
    throw Error("mask", std::string("mask = ") + to_string(shape_of(*mask)) +
                            " must be absent for mask kind " + to_string(p.mask));
  }
  if (shape && !mask) {
    fail("mask", "(absent)", std::string("is required for mask kind ") + to_string(p.mask));
  }
  if (shape) in.mask = mask_span(mask, *shape);
  feature_inputs(p, inputs, in);
  return in;
}

/// The contiguous shape of an output with the plan's layout: [B, S, heads,
/// width] (bshd) or [B, heads, S, width] (bhsd).
Shape heads_shape(const AttentionPlan& p, std::int64_t B, std::int64_t S, std::int64_t heads,
                  std::int64_t width) {
  return heads_layout(p, {}, B, S, heads, width).shape;
}

/// The shape of out and dout: [B, Sq, H, Dv] in the plan's layout.
Shape out_shape(const AttentionPlan& p) {
  return heads_shape(p, p.B, p.Sq, p.H, p.Dv);
}

/// The shape of input `name` in `shapes` (name → shape; absent or None: not given).
std::optional<Shape> given_shape(const nb::dict& shapes, const char* name) {
  if (!shapes.contains(name) || shapes[name].is_none()) return std::nullopt;
  return nb::cast<Shape>(shapes[name]);
}

/// An attention call by the C++ shape rules (attention_params_from_shapes,
/// SPEC §1, §2.7–2.10): its Params from the shapes of the inputs given
/// (`shapes`: q, k, v, mask, sinks, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
/// seqused_k, block_table, cache_seqlens, key_origin), the attrs and the caller's names of
/// the inputs (errors name them), and the shapes the kernels read the arrays
/// in: q, k, v, out `[B, Sq, H, Dv]` in the plan's layout (a paged k, v
/// `[num_blocks, block_size, Hkv, D]`), lse `[B, H, Sq]`, the mask (keep
/// `[B, Sk]`, bias `[Bb, Hb, Sq, Sk]`), and `given_out`: out in q's rank.
nb::tuple attention_call(const nb::dict& shapes, const AttentionAttrs& attrs,
                         const AttentionNames& names) {
  AttentionShapes s;
  const auto need = [&](const char* key, const std::string& name) {
    std::optional<Shape> x = given_shape(shapes, key);
    if (!x) throw Error(name, name + " = (absent) is required");
    return *x;
  };
  s.q = need("q", names.q);
  s.k = need("k", names.k);
  s.v = need("v", names.v);
  s.mask = given_shape(shapes, "mask");
  s.sinks = given_shape(shapes, "sinks");
  s.alibi_slopes = given_shape(shapes, "alibi_slopes");
  s.cu_seqlens_q = given_shape(shapes, "cu_seqlens_q");
  s.cu_seqlens_k = given_shape(shapes, "cu_seqlens_k");
  s.seqused_k = given_shape(shapes, "seqused_k");
  s.key_origin = given_shape(shapes, "key_origin");
  s.block_table = given_shape(shapes, "block_table");
  s.cache_seqlens = given_shape(shapes, "cache_seqlens");
  const AttentionParams params = attention_params_from_shapes(s, attrs, names);
  const AttentionPlan p = AttentionPlan::make(params);
  const std::int64_t KB = p.kv_batch(), KS = p.kv_seq();
  nb::dict views;
  views["q"] = heads_shape(p, p.B, p.Sq, p.H, p.D);
  views["k"] = heads_shape(p, KB, KS, p.Hkv, p.D);
  views["v"] = heads_shape(p, KB, KS, p.Hkv, p.Dv);
  views["out"] = out_shape(p);
  views["lse"] = Shape{p.B, p.H, p.Sq};
  if (const std::optional<Shape> m = mask_shape(p)) views["mask"] = *m;
  // q's rank: heads on their own axis (rank 4, packed [total, H, D]) or folded ([.., H·D])
  Shape given = s.q;
  given.back() = s.q.size() == 4 || (p.varlen() && s.q.size() == 3) ? p.Dv : p.H * p.Dv;
  views["given_out"] = given;
  return nb::make_tuple(params, views);
}

void attention_forward(const std::string& backend, const AttentionParams& params,
                       const nb::dict& inputs, const Out& out, const std::optional<Out>& lse) {
  const AttentionPlan plan = AttentionPlan::make(params);
  with_dtype(nb::cast<In>(inputs["q"]), "q", [&](auto tag) {
    using T = decltype(tag);
    const Kernels<T>& k = kernels<T>(backend);
    const AttentionInputs<T> in = attention_inputs<T>(plan, inputs);
    const std::span<T> o = out_span<T>(out, "out", out_shape(plan));
    const std::span<stat_t<T>> l = lse_out<T>(lse, {plan.B, plan.H, plan.Sq});
    if (lse) {
      const auto& f = offered<T>(k.attention_forward_lse, "attention_forward_lse", backend);
      nb::gil_scoped_release release;
      f(plan, in, o, l);
    } else {
      const auto& f = offered<T>(k.attention_forward, "attention_forward", backend);
      nb::gil_scoped_release release;
      f(plan, in, o);
    }
  });
}

/// attention_forward on raw addresses, with a plan made beforehand: q, k, v
/// and out contiguous in the plan's layout, of the plan's sizes, element
/// type `dtype`. The caller vouches for all of that
/// (tandem.torch's inference fast path checks it on the tensors and keeps
/// one plan per shape; anything else takes the DLPack path): it spares the
/// DLPack exports and the plan's validation on every call.
void attention_forward_contiguous(const std::string& backend, const AttentionPlan& plan,
                                  std::uintptr_t q, std::uintptr_t k, std::uintptr_t v,
                                  std::uintptr_t out, Dtype dtype) {
  const auto run = [&](auto tag) {
    using T = decltype(tag);
    const Kernels<T>& kernel = kernels<T>(backend);
    // The addresses come from tensors (data_ptr()): the casts are the point.
    const auto in = [](std::uintptr_t a, std::int64_t n) {
      return std::span<const T>(reinterpret_cast<const T*>(a),  // NOLINT(performance-no-int-to-ptr)
                                static_cast<std::size_t>(n));
    };
    const AttentionInputs<T> inputs{in(q, plan.q.extent), in(k, plan.k.extent),
                                    in(v, plan.v.extent)};
    const std::span<T> o(reinterpret_cast<T*>(out),  // NOLINT(performance-no-int-to-ptr)
                         static_cast<std::size_t>(plan.o.extent));
    const auto& f = offered<T>(kernel.attention_forward, "attention_forward", backend);
    nb::gil_scoped_release release;
    f(plan, inputs, o);
  };
  switch (dtype) {
    case Dtype::float32:
      run(float{});
      break;
    case Dtype::float64:
      run(double{});
      break;
    case Dtype::bfloat16:
      run(bfloat16{});
      break;
    case Dtype::float16:
      run(float16{});
      break;
  }
}

/// The gradients an attention backward writes: dq, dk, dv, dsinks and dbias
/// (an absent one is neither computed nor written).
struct GradOutputs {
  ///@{
  /// [B, Sq, H, D], [B, Sk, Hkv, D], [B, Sk, Hkv, Dv] in the plan's layout; [H];
  /// [Bb, Hb, Sq, Sk].
  std::optional<Out> dq, dk, dv, dsinks, dbias;
  ///@}
};

/// dq, dk, dv, dsinks, dbias views for the outputs given (an absent one stays empty).
template <class T>
AttentionGrads<T> attention_grads(const AttentionPlan& p, const GradOutputs& g) {
  const std::int64_t KB = p.kv_batch(), KS = p.kv_seq();
  const bool bias = p.mask == MaskKind::bias;
  return {out_span<T>(g.dq, "dq", heads_shape(p, p.B, p.Sq, p.H, p.D)),
          out_span<T>(g.dk, "dk", heads_shape(p, KB, KS, p.Hkv, p.D)),
          out_span<T>(g.dv, "dv", heads_shape(p, KB, KS, p.Hkv, p.Dv)),
          out_span<T>(g.dsinks, "dsinks", {p.sinks ? p.H : 0}),
          out_span<T>(g.dbias, "dbias",
                      bias ? Shape{p.bias_batch, p.bias_heads, p.Sq, p.Sk} : Shape{0})};
}

void attention_backward(const std::string& backend, const AttentionParams& params,
                        const nb::dict& inputs, const In& dout, const std::optional<Out>& dq,
                        const std::optional<Out>& dk, const std::optional<Out>& dv,
                        const std::optional<Out>& dsinks, const std::optional<Out>& dbias) {
  const AttentionPlan plan = AttentionPlan::make(params);
  if (!dq && !dk && !dv && !dsinks && !dbias) {
    fail("dq", "(absent)", "or dk, dv, dsinks, dbias must be asked for");
  }
  with_dtype(nb::cast<In>(inputs["q"]), "q", [&](auto tag) {
    using T = decltype(tag);
    const Kernels<T>& k = kernels<T>(backend);
    const AttentionInputs<T> in = attention_inputs<T>(plan, inputs);
    const std::span<const T> d =
        in_span<T>(dout, "dout", contiguous(out_shape(plan)), plan.o.extent);
    const AttentionGrads<T> g = attention_grads<T>(plan, {dq, dk, dv, dsinks, dbias});
    if ((dq && dk && dv) || dsinks || dbias) {
      const auto& f = offered<T>(k.attention_backward, "attention_backward", backend);
      nb::gil_scoped_release release;
      f(plan, in, d, g);
      return;
    }
    if (dq) offered<T>(k.attention_backward_dq, "attention_backward_dq", backend);
    if (dk) offered<T>(k.attention_backward_dk, "attention_backward_dk", backend);
    if (dv) offered<T>(k.attention_backward_dv, "attention_backward_dv", backend);
    nb::gil_scoped_release release;
    if (dq) k.attention_backward_dq(plan, in, d, g.dq);
    if (dk) k.attention_backward_dk(plan, in, d, g.dk);
    if (dv) k.attention_backward_dv(plan, in, d, g.dv);
  });
}

void attention_backward_saved(const std::string& backend, const AttentionParams& params,
                              const nb::dict& inputs, const In& out, const In& lse, const In& dout,
                              const Out& dq, const Out& dk, const Out& dv,
                              const std::optional<Out>& dsinks, const std::optional<Out>& dbias) {
  const AttentionPlan plan = AttentionPlan::make(params);
  with_dtype(nb::cast<In>(inputs["q"]), "q", [&](auto tag) {
    using T = decltype(tag);
    const Kernels<T>& k = kernels<T>(backend);
    const AttentionInputs<T> in = attention_inputs<T>(plan, inputs);
    const Expect o = contiguous(out_shape(plan));
    const AttentionSaved<T> saved{in_span<T>(out, "out", o, plan.o.extent),
                                  lse_in<T>(lse, {plan.B, plan.H, plan.Sq})};
    const std::span<const T> d = in_span<T>(dout, "dout", o, plan.o.extent);
    const AttentionGrads<T> g = attention_grads<T>(plan, {dq, dk, dv, dsinks, dbias});
    const auto& f = offered<T>(k.attention_backward_saved, "attention_backward_saved", backend);
    nb::gil_scoped_release release;
    f(plan, in, saved, d, g);
  });
}

/// SPEC §10.5's agreement bound of attention_forward at the call's storage type T and
/// rounding profile (reference::attention_forward_rounding): o*, out before its final
/// rounding (`unrounded`), and the slack of its ambiguous weights (`flip`), float64
/// `[B, Sq, H, Dv]` in the plan's layout; `rel_delta` as for attention_backward_rounding.
void attention_forward_rounding(const AttentionParams& params, const nb::dict& inputs,
                                double rel_delta, const Out& unrounded, const Out& flip) {
  const AttentionPlan plan = AttentionPlan::make(params);
  require(rel_delta >= 0, "rel_delta", rel_delta, "must be >= 0");
  const std::span<double> o = out_span<double>(unrounded, "unrounded", out_shape(plan));
  const std::span<double> f = out_span<double>(flip, "flip", out_shape(plan));
  with_dtype(nb::cast<In>(inputs["q"]), "q", [&](auto tag) {
    using T = decltype(tag);
    const AttentionInputs<T> in = attention_inputs<T>(plan, inputs);
    tandem::reference::RoundingBound b;
    {
      nb::gil_scoped_release release;
      b = tandem::reference::attention_forward_rounding<T>(plan, in, rel_delta);
    }
    std::copy(b.unrounded.begin(), b.unrounded.end(), o.begin());
    std::copy(b.flip.begin(), b.flip.end(), f.begin());
  });
}

/// SPEC §10.5's agreement bound of attention_backward at the call's storage type T and
/// rounding profile (reference::attention_backward_rounding, the reference in T summing in
/// double): each gradient before its final rounding, g* (`dq`, `dk`, `dv`), and the slack
/// of its ambiguous rounded operands RN_T(p_ij), RN_T(dx_ij) (`dq_flip`, `dk_flip`,
/// `dv_flip`), all float64 in the shapes of dq [B, Sq, H, D], dk [B, Sk, Hkv, D], dv
/// [B, Sk, Hkv, Dv] in the plan's layout. `rel_delta` bounds the relative float32 error of
/// p_ij and dx_ij in the kernel held to the bound.
void attention_backward_rounding(const AttentionParams& params, const nb::dict& inputs,
                                 const In& dout, double rel_delta, const Out& dq,
                                 const Out& dq_flip, const Out& dk, const Out& dk_flip,
                                 const Out& dv, const Out& dv_flip) {
  const AttentionPlan plan = AttentionPlan::make(params);
  require(rel_delta >= 0, "rel_delta", rel_delta, "must be >= 0");
  const std::int64_t KB = plan.kv_batch(), KS = plan.kv_seq();
  const Shape sq = heads_shape(plan, plan.B, plan.Sq, plan.H, plan.D);
  const Shape sk = heads_shape(plan, KB, KS, plan.Hkv, plan.D);
  const Shape sv = heads_shape(plan, KB, KS, plan.Hkv, plan.Dv);
  const std::span<double> outs[] = {
      out_span<double>(dq, "dq", sq), out_span<double>(dq_flip, "dq_flip", sq),
      out_span<double>(dk, "dk", sk), out_span<double>(dk_flip, "dk_flip", sk),
      out_span<double>(dv, "dv", sv), out_span<double>(dv_flip, "dv_flip", sv)};
  with_dtype(nb::cast<In>(inputs["q"]), "q", [&](auto tag) {
    using T = decltype(tag);
    const AttentionInputs<T> in = attention_inputs<T>(plan, inputs);
    const std::span<const T> d =
        in_span<T>(dout, "dout", contiguous(out_shape(plan)), plan.o.extent);
    tandem::reference::BackwardRoundingBound b;
    {
      nb::gil_scoped_release release;
      b = tandem::reference::attention_backward_rounding<T>(plan, in, d, rel_delta);
    }
    const std::vector<double>* from[] = {&b.dq.unrounded, &b.dq.flip,      &b.dk.unrounded,
                                         &b.dk.flip,      &b.dv.unrounded, &b.dv.flip};
    for (std::size_t n = 0; n < std::size(outs); ++n) {
      std::copy(from[n]->begin(), from[n]->end(), outs[n].begin());
    }
  });
}

// ---------------------------------------------------------------------------
// Quantized KV caches (SPEC §10.4)

/// The shape of a quantized cache's scales: `[B', S', Hkv]` for int8 (one per
/// key row and kv head), `[Hkv]` for e4m3 (one per kv head).
Shape scale_shape(const AttentionPlan& p) {
  if (p.kv_cache == KvCache::e4m3) return {p.Hkv};
  return {p.kv_batch(), p.kv_seq(), p.Hkv};
}

/// The codes (inputs "k", "v", read through the plan's strides) and float32
/// scales ("k_scale", "v_scale") of a quantized cache.
QuantizedKv quantized_inputs(const AttentionPlan& p, const nb::dict& inputs) {
  const auto need = [&](const char* name) {
    std::optional<In> a = input(inputs, name);
    if (!a) throw Error(name, std::string(name) + " = (absent) is required");
    return *a;
  };
  const bool int8 = p.kv_cache == KvCache::int8;
  const std::int64_t KB = p.kv_batch(), KS = p.kv_seq();
  const Shape s = scale_shape(p);
  return {code_span(need("k"), "k", heads_layout(p, p.k, KB, KS, p.Hkv, p.D), p.k.extent, int8),
          code_span(need("v"), "v", heads_layout(p, p.v, KB, KS, p.Hkv, p.Dv), p.v.extent, int8),
          float_span(need("k_scale"), "k_scale", contiguous(s), count(s)),
          float_span(need("v_scale"), "v_scale", contiguous(s), count(s))};
}

/// out = attention of q over a quantized cache (params.kv_cache int8 or e4m3):
/// the codes in inputs "k" and "v", their scales in "k_scale" and "v_scale".
void attention_forward_quantized(const std::string& backend, const AttentionParams& params,
                                 const nb::dict& inputs, const Out& out) {
  const AttentionPlan plan = AttentionPlan::make(params);
  require(plan.kv_cache != KvCache::plain, "kv_cache", std::string("plain"),
          "must be int8 or e4m3 for a quantized cache");
  with_dtype(nb::cast<In>(inputs["q"]), "q", [&](auto tag) {
    using T = decltype(tag);
    const Kernels<T>& k = kernels<T>(backend);
    const AttentionInputs<T> in = attention_inputs<T>(plan, inputs);
    const QuantizedKv kv = quantized_inputs(plan, inputs);
    const std::span<T> o = out_span<T>(out, "out", out_shape(plan));
    const auto& f =
        offered<T>(k.attention_forward_quantized, "attention_forward_quantized", backend);
    nb::gil_scoped_release release;
    f(plan, in, kv, o);
  });
}

/// The codes (contiguous, the shapes of k and v) and scales of k and v for
/// params.kv_cache (SPEC §10.4); k and v contiguous in the plan's layout.
void quantize_kv(const std::string& backend, const AttentionParams& params, const In& k,
                 const In& v, const Out& k_codes, const Out& v_codes, const Out& k_scale,
                 const Out& v_scale) {
  const AttentionPlan plan = AttentionPlan::make(params);
  require(plan.kv_cache != KvCache::plain, "kind", std::string("plain"), "must be int8 or e4m3");
  with_dtype(k, "k", [&](auto tag) {
    using T = decltype(tag);
    const Kernels<T>& kernel = kernels<T>(backend);
    const std::int64_t KB = plan.kv_batch(), KS = plan.kv_seq();
    const Expect ek = heads_layout(plan, plan.k, KB, KS, plan.Hkv, plan.D);
    const Expect ev = heads_layout(plan, plan.v, KB, KS, plan.Hkv, plan.Dv);
    const std::span<const T> ks = in_span<T>(k, "k", ek, plan.k.extent);
    const std::span<const T> vs = in_span<T>(v, "v", ev, plan.v.extent);
    const bool int8 = plan.kv_cache == KvCache::int8;
    const auto codes = [&](const Out& a, const char* name, const Expect& e, std::int64_t n) {
      const std::span<const std::uint8_t> c = code_span(a, name, e, n, int8);
      return std::span<std::uint8_t>(const_cast<std::uint8_t*>(c.data()), c.size());
    };
    const Shape s = scale_shape(plan);
    const QuantizedKvOut out{
        codes(k_codes, "k_codes", ek, plan.k.extent), codes(v_codes, "v_codes", ev, plan.v.extent),
        float_out_span(k_scale, "k_scale", s), float_out_span(v_scale, "v_scale", s)};
    const auto& f = offered<T>(kernel.quantize_kv, "quantize_kv", backend);
    nb::gil_scoped_release release;
    f(plan, ks, vs, out);
  });
}

// ---------------------------------------------------------------------------
// RoPE, axial RoPE, SwiGLU, the attention block

/// Shape and strides of a [B', S, W] source read with a row stride.
Expect rows_layout(std::int64_t B, std::int64_t S, std::int64_t W, std::int64_t row_stride) {
  return {{B, S, W}, {S * row_stride, row_stride, 1}};
}

/// Shape and strides of a RoPE source: [B, H, S, D] contiguous (bhsd), or
/// [B, S, W] rows with the plan's row stride (bshd; thd with B = 1).
Expect rope_source(const RopePlan& plan) {
  if (plan.layout == RopeLayout::bhsd) return contiguous({plan.B, plan.heads(), plan.S, plan.D});
  return rows_layout(plan.B, plan.S, plan.W, plan.src_row_stride);
}

/// The contiguous shape of a RoPE output: that of the source.
Shape rope_out_shape(const RopePlan& plan) {
  return rope_source(plan).shape;
}

/// The cos and sin tables [R, T] (contiguous) and the position ids [B·S]
/// (int32 or int64, contiguous; absent unless the plan reads position ids).
template <class T>
RopeTables<T> rope_tables(const RopePlan& plan, const In& cos, const In& sin,
                          const std::optional<In>& positions) {
  return {in_span<T>(cos, "cos", contiguous({plan.R, plan.T}), plan.R * plan.T),
          in_span<T>(sin, "sin", contiguous({plan.R, plan.T}), plan.R * plan.T),
          index_view(positions, "positions", {plan.B * plan.S})};
}

/// A RoPE call by the C++ shape rules (rope_call, SPEC §4): its params
/// from the shapes of the inputs given (`shapes`: x, k, cos, sin,
/// cos_sin_cache, positions; k for rope_qk), the attrs and the caller's names
/// of the inputs (errors name them), and the views: x and k (`[B, S, W]`
/// rows or `[B, H, S, D]`; the outputs' shapes too) and cache_split (T of a
/// cos_sin_cache `[R, 2T]`, else 0).
nb::tuple rope_call_of(const nb::dict& shapes, const RopeAttrs& attrs, const RopeNames& names) {
  RopeShapes s;
  const std::optional<Shape> x = given_shape(shapes, "x");
  if (!x) throw Error(names.x, names.x + " = (absent) is required");
  s.x = *x;
  s.k = given_shape(shapes, "k");
  s.cos = given_shape(shapes, "cos");
  s.sin = given_shape(shapes, "sin");
  s.cos_sin_cache = given_shape(shapes, "cos_sin_cache");
  s.positions = given_shape(shapes, "positions");
  const RopeCall call = rope_call(s, attrs, names);
  nb::dict views;
  views["x"] = call.x;
  if (s.k) views["k"] = call.k;
  views["cache_split"] = call.cache_split;
  return nb::make_tuple(call.params, views);
}

void rope(const std::string& backend, const RopeParams& params, const In& x, const In& cos,
          const In& sin, const std::optional<In>& positions, const Out& out, bool backward) {
  const RopePlan plan = RopePlan::make(params);
  const char* src = backward ? "dy" : "x";
  with_dtype(x, src, [&](auto tag) {
    using T = decltype(tag);
    const Kernels<T>& k = kernels<T>(backend);
    const std::span<const T> s = in_span<T>(x, src, rope_source(plan), plan.src_extent());
    const RopeTables<T> tables = rope_tables<T>(plan, cos, sin, positions);
    const std::span<T> o = out_span<T>(out, backward ? "dx" : "out", rope_out_shape(plan));
    const auto& f = backward ? offered<T>(k.rope_backward, "rope_backward", backend)
                             : offered<T>(k.rope_forward, "rope_forward", backend);
    nb::gil_scoped_release release;
    f(plan, s, tables, o);
  });
}

void rope_qk(const std::string& backend, const RopeQkParams& params, const In& q, const In& k,
             const In& cos, const In& sin, const std::optional<In>& positions, const Out& q_out,
             const Out& k_out, bool backward) {
  const RopeQkPlan plan = RopeQkPlan::make(params);
  const RopeQkNames& names = backward ? kRopeQkBackward : kRopeQkForward;
  with_dtype(q, names.q, [&](auto tag) {
    using T = decltype(tag);
    const Kernels<T>& kernel = kernels<T>(backend);
    const std::span<const T> qs = in_span<T>(q, names.q, rope_source(plan.q), plan.q.src_extent());
    const std::span<const T> ks = in_span<T>(k, names.k, rope_source(plan.k), plan.k.src_extent());
    const RopeTables<T> tables = rope_tables<T>(plan.q, cos, sin, positions);
    const std::span<T> qo = out_span<T>(q_out, names.q_out, rope_out_shape(plan.q));
    const std::span<T> ko = out_span<T>(k_out, names.k_out, rope_out_shape(plan.k));
    const auto& f = backward ? offered<T>(kernel.rope_backward_qk, "rope_backward_qk", backend)
                             : offered<T>(kernel.rope_forward_qk, "rope_forward_qk", backend);
    nb::gil_scoped_release release;
    f(plan, qs, ks, tables, qo, ko);
  });
}

void axial_rope(const std::string& backend, const AxialRopeParams& params, const In& x,
                const Out& out, bool backward) {
  const AxialRopePlan plan = AxialRopePlan::make(params);
  const char* src = backward ? "dy" : "x";
  with_dtype(x, src, [&](auto tag) {
    using T = decltype(tag);
    const Kernels<T>& k = kernels<T>(backend);
    const std::span<const T> s = in_span<T>(
        x, src, rows_layout(plan.B, plan.S, plan.W, plan.src_row_stride), plan.src_extent());
    const std::span<T> o = out_span<T>(out, backward ? "dx" : "out", {plan.B, plan.S, plan.W});
    const auto& f = backward ? offered<T>(k.axial_rope_backward, "axial_rope_backward", backend)
                             : offered<T>(k.axial_rope_forward, "axial_rope_forward", backend);
    nb::gil_scoped_release release;
    f(plan, s, o);
  });
}

void swiglu_forward(const std::string& backend, const SwigluParams& params, const In& x,
                    const Out& out) {
  const SwigluPlan plan = SwigluPlan::make(params);
  with_dtype(x, "x", [&](auto tag) {
    using T = decltype(tag);
    const Kernels<T>& k = kernels<T>(backend);
    const std::span<const T> s =
        in_span<T>(x, "x", contiguous({plan.rows, 2 * plan.n}), plan.in_size());
    const std::span<T> o = out_span<T>(out, "out", {plan.rows, plan.n});
    const auto& f = offered<T>(k.swiglu_forward, "swiglu_forward", backend);
    nb::gil_scoped_release release;
    f(plan, s, o);
  });
}

void swiglu_backward(const std::string& backend, const SwigluParams& params, const In& x,
                     const In& dy, const Out& dx) {
  const SwigluPlan plan = SwigluPlan::make(params);
  with_dtype(x, "x", [&](auto tag) {
    using T = decltype(tag);
    const Kernels<T>& k = kernels<T>(backend);
    const std::span<const T> s =
        in_span<T>(x, "x", contiguous({plan.rows, 2 * plan.n}), plan.in_size());
    const std::span<const T> d =
        in_span<T>(dy, "dy", contiguous({plan.rows, plan.n}), plan.out_size());
    const std::span<T> o = out_span<T>(dx, "dx", {plan.rows, 2 * plan.n});
    const auto& f = offered<T>(k.swiglu_backward, "swiglu_backward", backend);
    nb::gil_scoped_release release;
    f(plan, s, d, o);
  });
}

/// The attention block at x's storage type (float32, float64, bfloat16, float16; SPEC §7,
/// §10.2): inputs x, w_qkv, w_out and the optional b_qkv, b_out, cos, sin, all contiguous and of
/// x's type, and the optional float32 mask (keep).
void attention_block(const std::string& backend, std::int64_t num_heads, const nb::dict& inputs,
                     const Out& out) {
  const std::optional<In> x = input(inputs, "x");
  if (!x) fail("x", "(absent)", "is required");
  const char* names[] = {"x", "w_qkv", "b_qkv", "w_out", "b_out", "mask", "cos", "sin"};
  constexpr int kMask = 5;
  std::optional<In> a[8];
  std::optional<Shape> s[8];
  for (int i = 0; i < 8; ++i) {
    a[i] = input(inputs, names[i]);
    if (a[i]) s[i] = shape_of(*a[i]);
  }
  if (!a[1]) fail("w_qkv", "(absent)", "is required");
  if (!a[3]) fail("w_out", "(absent)", "is required");
  const AttentionBlockPlan plan =
      AttentionBlockPlan::from_shapes(*s[0], *s[1], s[2], *s[3], s[4], s[5], s[6], s[7], num_heads);
  with_dtype(*x, "x", [&](auto tag) {
    using T = decltype(tag);
    std::span<const T> v[8];
    std::span<const float> keep;
    for (int i = 0; i < 8; ++i) {
      if (!a[i]) continue;
      if (i == kMask) {
        keep = in_span<float>(*a[i], names[i], contiguous(*s[i]), count(*s[i]));
      } else {
        v[i] = in_span<T>(*a[i], names[i], contiguous(*s[i]), count(*s[i]));
      }
    }
    const AttentionBlockInputs<T> in{v[0], v[1], v[2], v[3], v[4], keep, v[6], v[7]};
    const std::span<T> o = out_span<T>(out, "out", *s[0]);
    const auto& f = offered<T>(kernels<T>(backend).attention_block, "attention_block", backend);
    nb::gil_scoped_release release;
    f(plan, in, o);
  });
}

/// Whether backend `backend` offers entry point `entry` at storage type `dtype`.
bool offers(const std::string& backend, Dtype dtype, const std::string& entry) {
  bool found = false, offered = false;
  const auto visit = [&](auto tag) {
    for_each_entry_point(kernels<decltype(tag)>(backend),
                         [&](std::string_view name, const auto& f) {
                           if (name != entry) return;
                           found = true;
                           offered = static_cast<bool>(f);
                         });
  };
  switch (dtype) {
    case Dtype::float32:
      visit(float{});
      break;
    case Dtype::float64:
      visit(double{});
      break;
    case Dtype::bfloat16:
      visit(bfloat16{});
      break;
    case Dtype::float16:
      visit(float16{});
      break;
  }
  if (!found) throw Error("entry", "entry = '" + entry + "' is not an entry point");
  return offered;
}

// ---------------------------------------------------------------------------
// FlexAttention (SPEC §13)

/// The operation spelled `name` by to_string(ModOp) ("add", "floor_div", "b").
ModOp mod_op(const std::string& name, const std::string& what) {
  for (int i = 0; i <= static_cast<int>(ModOp::where); ++i) {
    const auto op = static_cast<ModOp>(i);
    if (name == to_string(op)) return op;
  }
  throw Error(what, what + " uses operation '" + name + "', which the mod language lacks");
}

/// The type spelled `name` by to_string(ModType).
ModType mod_type(const std::string& name, const std::string& what) {
  for (const ModType t : {ModType::real, ModType::integer, ModType::boolean}) {
    if (name == to_string(t)) return t;
  }
  throw Error(what, what + " uses type '" + name + "': wants real, integer or boolean");
}

/// A program from the node list the Python tracer recorded (`spec`: a dict
/// with `name`, the callable's name for messages; `tensors`, one (name,
/// shape, type, lo, hi) per captured tensor; `nodes`, one (op, args, type,
/// value, ivalue, tensor, index) per node, operands by their position in the
/// list, and the pseudo-operation `as_real`, a cast to float: to_real
/// unless its operand is real; `result`, the position of the result).
/// Leaves, constants and loads
/// are added by their fields (ModProgram::add); operations through
/// ModProgram::apply, which converts an integer operand against a real one
/// as torch promotes. An Error names `what` ("score_mod") and the callable.
ModProgram mod_program(const nb::handle& spec, const std::string& what) {
  ModProgram p;
  if (spec.is_none()) return p;
  const auto name = nb::cast<std::string>(spec["name"]);
  try {
    for (const nb::handle t : nb::cast<nb::list>(spec["tensors"])) {
      p.capture(ModTensor{nb::cast<std::string>(t[0]), nb::cast<std::vector<std::int64_t>>(t[1]),
                          mod_type(nb::cast<std::string>(t[2]), what), nb::cast<std::int64_t>(t[3]),
                          nb::cast<std::int64_t>(t[4])});
    }
    std::vector<std::int32_t> id;  // the program's node of each recorded node
    const auto node = [&](std::int64_t at) -> std::int32_t {
      if (at < 0) return -1;
      require(at < static_cast<std::int64_t>(id.size()), what, at,
              "operand must name an earlier node");
      return id[static_cast<std::size_t>(at)];
    };
    for (const nb::handle r : nb::cast<nb::list>(spec["nodes"])) {
      const auto op_name = nb::cast<std::string>(r[0]);
      const auto args = nb::cast<std::vector<std::int64_t>>(r[1]);
      require(args.size() <= 3, what, static_cast<std::int64_t>(args.size()),
              "operands given: an operation takes at most 3");
      std::array<std::int32_t, 3> a{-1, -1, -1};
      for (std::size_t i = 0; i < args.size(); ++i) a[i] = node(args[i]);
      if (op_name == "as_real") {  // a cast to float: to_real unless already real
        require(a[0] >= 0, what, -1, "as_real needs an operand");
        id.push_back(p.node(a[0]).type == ModType::real ? a[0] : p.apply(ModOp::to_real, a[0]).id);
        continue;
      }
      const ModOp op = mod_op(op_name, what);
      if (op <= ModOp::load) {
        ModNode n;
        n.op = op;
        n.arg = a;
        n.type = mod_type(nb::cast<std::string>(r[2]), what);
        n.value = nb::cast<double>(r[3]);
        n.ivalue = nb::cast<std::int64_t>(r[4]);
        n.tensor = nb::cast<std::int32_t>(r[5]);
        const auto index = nb::cast<std::vector<std::int64_t>>(r[6]);
        require(index.size() <= kModMaxRank, what, static_cast<std::int64_t>(index.size()),
                "indices given: a tensor has rank 1 to 4");
        for (std::size_t i = 0; i < index.size(); ++i) n.index[i] = node(index[i]);
        id.push_back(p.add(n));
      } else {
        id.push_back(p.apply(op, ModValue{&p, a[0]}, ModValue{&p, a[1]}, ModValue{&p, a[2]}).id);
      }
    }
    p.set_result(node(nb::cast<std::int64_t>(spec["result"])));
  } catch (const Error& e) {
    throw Error(what, what + " " + name + ": " + e.what());
  }
  return p;
}

/// FlexPlan::make(p), an Error about a mod naming its callable too (`score_mod`,
/// `mask_mod`: the specs mod_program read p's programs from).
FlexPlan flex_plan(FlexParams p, const nb::handle& score_mod, const nb::handle& mask_mod) {
  try {
    return FlexPlan::make(std::move(p));
  } catch (const Error& e) {
    const nb::handle spec = e.parameter() == "score_mod"  ? score_mod
                            : e.parameter() == "mask_mod" ? mask_mod
                                                          : nb::none();
    if (spec.is_none()) throw;
    throw Error(e.parameter(), std::string(e.what()) + " (in " + e.parameter() + " " +
                                   nb::cast<std::string>(spec["name"]) + ")");
  }
}

/// The shape of input `name` of `shapes` (flex_params_from_shapes checks it).
Shape flex_shape(const nb::dict& shapes, const char* name) {
  if (!shapes.contains(name)) fail(name, "(absent)", "is required");
  return nb::cast<Shape>(shapes[name]);
}

/// The sizes of a FlexAttention call from the shapes of q `[B,H,Sq,D]`, k
/// `[B,Hkv,Sk,D]` and v `[B,Hkv,Sk,Dv]` (torch's flex_attention): k and v
/// agree with q on B and D, with each other on B, Hkv and Sk, and Hkv != H
/// needs enable_gqa.
FlexParams flex_sizes(const nb::dict& shapes, bool enable_gqa) {
  FlexParams p = flex_params_from_shapes(flex_shape(shapes, "query"), flex_shape(shapes, "key"),
                                         flex_shape(shapes, "value"), {"query", "key", "value"});
  if (p.Hkv != p.H && !enable_gqa) {
    fail("enable_gqa", "False",
         "needs Hkv = H: key has " + std::to_string(p.Hkv) + " heads, query " +
             std::to_string(p.H) + " (pass enable_gqa=True for grouped-query attention)");
  }
  return p;
}

/// The block mask's shape from the shapes of its arrays (`bm`: q_block,
/// kv_block, and the shapes of kv_num_blocks `[B', H', nQ]`, kv_indices
/// `[B', H', nQ, width]` and, when given, full_kv_num_blocks and
/// full_kv_indices); FlexPlan::make checks it against the call.
FlexBlockMaskShape flex_block_mask_shape(const nb::dict& bm) {
  const auto num = nb::cast<Shape>(bm["kv_num_blocks"]);
  const auto idx = nb::cast<Shape>(bm["kv_indices"]);
  if (num.size() != 3) fail("block_mask.kv_num_blocks.shape", to_string(num), "must be [B, H, nQ]");
  if (idx.size() != 4 || idx[0] != num[0] || idx[1] != num[1] || idx[2] != num[2]) {
    fail("block_mask.kv_indices.shape", to_string(idx),
         "must be [B, H, nQ, width] with B, H, nQ of kv_num_blocks " + to_string(num));
  }
  FlexBlockMaskShape s{nb::cast<std::int64_t>(bm["q_block"]),
                       nb::cast<std::int64_t>(bm["kv_block"]),
                       num[0],
                       num[1],
                       idx[3],
                       0,
                       false};
  if (bm.contains("full_kv_indices") && !bm["full_kv_indices"].is_none()) {
    const auto full = nb::cast<Shape>(bm["full_kv_indices"]);
    if (full.size() != 4 || full[0] != num[0] || full[1] != num[1] || full[2] != num[2]) {
      fail("block_mask.full_kv_indices.shape", to_string(full),
           "must be [B, H, nQ, width] with B, H, nQ of kv_num_blocks " + to_string(num));
    }
    s.has_full = true;
    s.full_width = full[3];
  }
  return s;
}

/// A FlexAttention call by the C++ rules (torch's flex_attention's
/// signature): the sizes from `shapes` (query, key, value), the scale, the
/// two programs (mod_program) and the block mask's shape (None: no block
/// mask), validated by FlexPlan::make. Returns the plan and the shapes of
/// out `[B,H,Sq,Dv]` and lse `[B,H,Sq]`.
nb::tuple flex_call(const nb::dict& shapes, bool enable_gqa, std::optional<double> scale,
                    const nb::object& score_mod, const nb::object& mask_mod,
                    const std::optional<nb::dict>& block_mask) {
  FlexParams p = flex_sizes(shapes, enable_gqa);
  p.scale = scale;
  p.score_mod = mod_program(score_mod, "score_mod");
  p.mask_mod = mod_program(mask_mod, "mask_mod");
  if (block_mask) p.block_mask = flex_block_mask_shape(*block_mask);
  FlexPlan plan = flex_plan(std::move(p), score_mod, mask_mod);
  nb::dict views;
  const FlexParams& q = plan.params();
  views["out"] = Shape{q.B, q.H, q.Sq, q.Dv};
  views["lse"] = Shape{q.B, q.H, q.Sq};
  return nb::make_tuple(std::move(plan), views);
}

/// The data of a mod's captured tensors (`arrays`, in capture order): a real
/// one of storage type T, an integer one int32 or int64, each contiguous in
/// its declared shape.
template <class T>
ModCaptures<T> mod_captures(const ModProgram& p, const nb::list& arrays, const std::string& what) {
  const auto& ts = p.tensors();
  if (arrays.size() != ts.size()) {
    fail(what + " tensors", std::to_string(arrays.size()),
         "given: the " + what + " captured " + std::to_string(ts.size()));
  }
  ModCaptures<T> c;
  for (std::size_t t = 0; t < ts.size(); ++t) {
    const std::string name = what + " tensor " + ts[t].name;
    const auto a = nb::cast<In>(arrays[t]);
    const Shape shape(ts[t].shape.begin(), ts[t].shape.end());
    if (ts[t].type == ModType::real) {
      c.real.push_back(in_span<T>(a, name, contiguous(shape), count(shape)));
      c.integer.emplace_back();
    } else {
      c.real.emplace_back();
      c.integer.push_back(index_view(a, name, shape));
    }
  }
  return c;
}

/// The mask_mod's tensors and the block mask's arrays (with the plan's
/// block mask) of a FlexAttention call (`inputs`), into `in`.
template <class T>
void flex_mask_inputs(const FlexPlan& plan, const nb::dict& inputs, FlexInputs<T>& in) {
  const FlexParams& p = plan.params();
  in.mask_tensors =
      mod_captures<T>(p.mask_mod, nb::cast<nb::list>(inputs["mask_tensors"]), "mask_mod");
  if (!p.block_mask) return;
  const FlexBlockMaskShape& s = *p.block_mask;
  const auto view = [&](const char* key, std::int64_t width) {
    const Shape shape =
        width < 0 ? Shape{s.B, s.H, plan.q_blocks()} : Shape{s.B, s.H, plan.q_blocks(), width};
    const std::string name = std::string("block_mask.") + key;
    const std::optional<In> a = input(inputs, key);
    if (!a) fail(name, "(absent)", "is required");
    return index_view(a, name, shape);
  };
  in.block_mask.kv_num_blocks = view("kv_num_blocks", -1);
  in.block_mask.kv_indices = view("kv_indices", s.width);
  if (s.has_full) {
    in.block_mask.full_kv_num_blocks = view("full_kv_num_blocks", -1);
    in.block_mask.full_kv_indices = view("full_kv_indices", s.full_width);
  }
}

/// The views of a FlexAttention call (`inputs`: query, key, value, the
/// score_mod's and mask_mod's tensors, and the block mask's arrays with the
/// plan's block mask), of storage type T.
template <class T>
FlexInputs<T> flex_inputs(const FlexPlan& plan, const nb::dict& inputs) {
  const FlexParams& p = plan.params();
  FlexInputs<T> in;
  in.q = in_span<T>(nb::cast<In>(inputs["query"]), "query", contiguous({p.B, p.H, p.Sq, p.D}),
                    plan.q_size());
  in.k = in_span<T>(nb::cast<In>(inputs["key"]), "key", contiguous({p.B, p.Hkv, p.Sk, p.D}),
                    plan.k_size());
  in.v = in_span<T>(nb::cast<In>(inputs["value"]), "value", contiguous({p.B, p.Hkv, p.Sk, p.Dv}),
                    plan.v_size());
  in.score_tensors =
      mod_captures<T>(p.score_mod, nb::cast<nb::list>(inputs["score_tensors"]), "score_mod");
  flex_mask_inputs(plan, inputs, in);
  return in;
}

/// out `[B,H,Sq,Dv]` and, when given, lse `[B,H,Sq]` (stat_t of the storage
/// type) of a FlexAttention call (Kernels::flex_forward, SPEC §13.4).
void flex_forward(const std::string& backend, const FlexPlan& plan, const nb::dict& inputs,
                  const Out& out, const std::optional<Out>& lse) {
  const FlexParams& p = plan.params();
  with_dtype(nb::cast<In>(inputs["query"]), "query", [&](auto tag) {
    using T = decltype(tag);
    const Kernels<T>& k = kernels<T>(backend);
    const FlexInputs<T> in = flex_inputs<T>(plan, inputs);
    const std::span<T> o = out_span<T>(out, "out", {p.B, p.H, p.Sq, p.Dv});
    const std::span<stat_t<T>> l = lse_out<T>(lse, {p.B, p.H, p.Sq});
    const auto& f = offered<T>(k.flex_forward, "flex_forward", backend);
    nb::gil_scoped_release release;
    f(plan, in, o, l);
  });
}

/// dq, dk, dv and the gradients of the score_mod's real tensors (each when
/// given; `d_tensors` one entry per score_mod tensor, None where not wanted,
/// or empty) from dout `[B,H,Sq,Dv]` (Kernels::flex_backward, SPEC §13.4).
void flex_backward(const std::string& backend, const FlexPlan& plan, const nb::dict& inputs,
                   const In& dout, const std::optional<Out>& dq, const std::optional<Out>& dk,
                   const std::optional<Out>& dv, const std::vector<std::optional<Out>>& d_tensors) {
  const FlexParams& p = plan.params();
  with_dtype(nb::cast<In>(inputs["query"]), "query", [&](auto tag) {
    using T = decltype(tag);
    const Kernels<T>& k = kernels<T>(backend);
    const FlexInputs<T> in = flex_inputs<T>(plan, inputs);
    const std::span<const T> d =
        in_span<T>(dout, "dout", contiguous({p.B, p.H, p.Sq, p.Dv}), plan.out_size());
    FlexGrads<T> g{out_span<T>(dq, "dq", {p.B, p.H, p.Sq, p.D}),
                   out_span<T>(dk, "dk", {p.B, p.Hkv, p.Sk, p.D}),
                   out_span<T>(dv, "dv", {p.B, p.Hkv, p.Sk, p.Dv}),
                   {}};
    const auto& ts = p.score_mod.tensors();
    for (std::size_t t = 0; t < d_tensors.size() && t < ts.size(); ++t) {
      const Shape shape(ts[t].shape.begin(), ts[t].shape.end());
      g.d_score_tensors.push_back(
          out_span<T>(d_tensors[t], "d_score_tensors[" + std::to_string(t) + "]", shape));
    }
    if (d_tensors.size() > ts.size()) g.d_score_tensors.resize(d_tensors.size());
    const auto& f = offered<T>(k.flex_backward, "flex_backward", backend);
    nb::gil_scoped_release release;
    f(plan, in, d, g);
  });
}

/// torch's create_block_mask by the reference (reference::create_block_mask):
/// the blocks of q_block × kv_block where `mask_mod` (with its tensors,
/// `mask_tensors`, real ones float64) keeps every element (full), some
/// (partial) or none, over B × H × Sq × Sk. Returns kv_num_blocks,
/// kv_indices, full_kv_num_blocks and full_kv_indices (int32, flat) with
/// their shapes.
nb::dict create_block_mask(const nb::object& mask_mod, const nb::list& mask_tensors, std::int64_t B,
                           std::int64_t H, std::int64_t Sq, std::int64_t Sk, std::int64_t q_block,
                           std::int64_t kv_block) {
  FlexParams p;
  p.B = B;
  p.H = H;
  p.Sq = Sq;
  p.Sk = Sk;
  p.D = 1;
  p.mask_mod = mod_program(mask_mod, "mask_mod");
  const FlexPlan plan = flex_plan(std::move(p), nb::none(), mask_mod);
  const ModCaptures<double> c =
      mod_captures<double>(plan.params().mask_mod, mask_tensors, "mask_mod");
  FlexBlockMask m;
  {
    nb::gil_scoped_release release;
    m = tandem::reference::create_block_mask(plan, c, q_block, kv_block);
  }
  const auto& s = m.shape;
  const std::int64_t nq = plan.params().Sq / q_block + (plan.params().Sq % q_block != 0);
  nb::dict r;
  r["kv_num_blocks"] = nb::make_tuple(m.kv_num_blocks, Shape{s.B, s.H, nq});
  r["kv_indices"] = nb::make_tuple(m.kv_indices, Shape{s.B, s.H, nq, s.width});
  r["full_kv_num_blocks"] = nb::make_tuple(m.full_kv_num_blocks, Shape{s.B, s.H, nq});
  r["full_kv_indices"] = nb::make_tuple(m.full_kv_indices, Shape{s.B, s.H, nq, s.full_width});
  return r;
}

/// reference::validate_block_mask for a plan with a block mask (flex_call)
/// and its inputs (`inputs`: mask_tensors and the block mask's arrays; the
/// call's q, k, v are not read: zeros stand in): None when every full block
/// is all kept by mask_mod and every hidden block none, else the first
/// block that is not, in words.
std::optional<std::string> validate_block_mask(const FlexPlan& plan, const nb::dict& inputs) {
  const std::vector<double> q(static_cast<std::size_t>(plan.q_size())),
      k(static_cast<std::size_t>(plan.k_size())), v(static_cast<std::size_t>(plan.v_size()));
  FlexInputs<double> in;
  flex_mask_inputs(plan, inputs, in);
  in.q = q;
  in.k = k;
  in.v = v;
  nb::gil_scoped_release release;
  return tandem::reference::validate_block_mask(plan, in);
}

// ---------------------------------------------------------------------------
// Errors

/// tandem::Error becomes tandem.Error(message, parameter), a ValueError
/// defined in Python (tandem/_errors.py).
void register_errors() {
  static nb::object error_type = nb::module_::import_("tandem._errors").attr("Error");
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* payload) {
        try {
          std::rethrow_exception(p);
        } catch (const tandem::Error& e) {
          nb::handle type(static_cast<PyObject*>(payload));
          nb::object exc = type(e.what(), e.parameter());
          PyErr_SetObject(type.ptr(), exc.ptr());
        }
      },
      error_type.ptr());
}

}  // namespace
}  // namespace tandem::python

NB_MODULE(_ext, m) {
  using namespace tandem;
  using namespace tandem::python;
  m.doc() = "tandem's kernels on NumPy arrays and PyTorch tensors (see the tandem package)";
  register_errors();
  // The package keeps _ext objects (argument names, cached Params) in module
  // globals and in torch's op registry, which the interpreter may still hold
  // at shutdown; nanobind would report them as leaks on every exit.
  nb::set_leak_warnings(false);

  nb::enum_<Dtype>(m, "Dtype")
      .value("float32", Dtype::float32)
      .value("float64", Dtype::float64)
      .value("bfloat16", Dtype::bfloat16)
      .value("float16", Dtype::float16);
  nb::enum_<KvCache>(m, "KvCache")
      .value("plain", KvCache::plain)
      .value("int8", KvCache::int8)
      .value("e4m3", KvCache::e4m3);
  nb::enum_<Layout>(m, "Layout").value("bshd", Layout::bshd).value("bhsd", Layout::bhsd);
  nb::enum_<MaskKind>(m, "MaskKind")
      .value("none", MaskKind::none)
      .value("causal", MaskKind::causal)
      .value("sliding_window", MaskKind::sliding_window)
      .value("key_padding", MaskKind::key_padding)
      .value("bias", MaskKind::bias);
  nb::enum_<AlibiKind>(m, "AlibiKind")
      .value("none", AlibiKind::none)
      .value("per_head", AlibiKind::per_head)
      .value("per_batch_head", AlibiKind::per_batch_head);
  nb::enum_<RopeLayout>(m, "RopeLayout")
      .value("bshd", RopeLayout::bshd)
      .value("bhsd", RopeLayout::bhsd)
      .value("thd", RopeLayout::thd);
  nb::enum_<RopeStyle>(m, "RopeStyle")
      .value("neox", RopeStyle::neox)
      .value("gptj", RopeStyle::gptj);
  nb::enum_<TableRows>(m, "TableRows")
      .value("position", TableRows::position)
      .value("token", TableRows::token)
      .value("position_ids", TableRows::position_ids);

  // The Params of each op: the Python package sets these fields from its
  // keyword arguments (one line per field there, one here).
  nb::class_<AttentionParams>(m, "AttentionParams")
      .def(nb::init<>())
      .def(nb::init<const AttentionParams&>(), "params"_a)
      .def_rw("B", &AttentionParams::B)
      .def_rw("Sq", &AttentionParams::Sq)
      .def_rw("Sk", &AttentionParams::Sk)
      .def_rw("H", &AttentionParams::H)
      .def_rw("Hkv", &AttentionParams::Hkv)
      .def_rw("D", &AttentionParams::D)
      .def_rw("Dv", &AttentionParams::Dv)
      .def_rw("layout", &AttentionParams::layout)
      .def_rw("mask", &AttentionParams::mask)
      .def_rw("window", &AttentionParams::window)
      .def_rw("scale", &AttentionParams::scale)
      .def_rw("softcap", &AttentionParams::softcap)
      .def_rw("q_row_stride", &AttentionParams::q_row_stride)
      .def_rw("k_row_stride", &AttentionParams::k_row_stride)
      .def_rw("v_row_stride", &AttentionParams::v_row_stride)
      .def_rw("bias_batch", &AttentionParams::bias_batch)
      .def_rw("bias_heads", &AttentionParams::bias_heads)
      .def_rw("sinks", &AttentionParams::sinks)
      .def_rw("alibi", &AttentionParams::alibi)
      .def_rw("num_seqs", &AttentionParams::num_seqs)
      .def_rw("num_blocks", &AttentionParams::num_blocks)
      .def_rw("block_size", &AttentionParams::block_size)
      .def_rw("max_blocks", &AttentionParams::max_blocks)
      .def_rw("kv_cache", &AttentionParams::kv_cache)
      // the rounding profile by name (SPEC §10.2): "pytorch", "exact", "ggml"
      .def_prop_rw(
          "rounding", [](const AttentionParams& p) { return std::string(p.rounding.name); },
          [](AttentionParams& p, const std::string& name) {
            const std::optional<Rounding> r = rounding_profile(name);
            if (!r) {
              throw Error("rounding",
                          "rounding = '" + name + "' must be one of " + rounding_profile_names());
            }
            p.rounding = *r;
          })
      .def("describe", [](const AttentionParams& p) { return AttentionPlan::make(p).describe(); });
  nb::enum_<QkvLayout>(m, "QkvLayout")
      .value("bshd", QkvLayout::bshd)
      .value("bhsd", QkvLayout::bhsd)
      .value("thd", QkvLayout::thd);
  nb::class_<AttentionAttrs>(m, "AttentionAttrs")
      .def(nb::init<>())
      .def_rw("num_heads", &AttentionAttrs::num_heads)
      .def_rw("layout", &AttentionAttrs::layout)
      .def_rw("mask", &AttentionAttrs::mask)
      .def_rw("window", &AttentionAttrs::window)
      .def_rw("scale", &AttentionAttrs::scale)
      .def_rw("softcap", &AttentionAttrs::softcap);
  nb::class_<AttentionNames>(m, "AttentionNames")
      .def(nb::init<>())
      .def_rw("q", &AttentionNames::q)
      .def_rw("k", &AttentionNames::k)
      .def_rw("v", &AttentionNames::v)
      .def_rw("mask", &AttentionNames::mask)
      .def_rw("sinks", &AttentionNames::sinks)
      .def_rw("alibi_slopes", &AttentionNames::alibi_slopes)
      .def_rw("cu_seqlens_q", &AttentionNames::cu_seqlens_q)
      .def_rw("cu_seqlens_k", &AttentionNames::cu_seqlens_k)
      .def_rw("seqused_k", &AttentionNames::seqused_k)
      .def_rw("key_origin", &AttentionNames::key_origin)
      .def_rw("block_table", &AttentionNames::block_table)
      .def_rw("cache_seqlens", &AttentionNames::cache_seqlens)
      .def("mask_of", &AttentionNames::mask_of, "kind"_a);
  m.def("attention_call", &attention_call, "shapes"_a, "attrs"_a, "names"_a);
  nb::class_<AttentionPlan>(m, "AttentionPlan")
      .def_static("make", &AttentionPlan::make, "params"_a)
      .def("describe", &AttentionPlan::describe);
  nb::class_<RopeParams>(m, "RopeParams")
      .def(nb::init<>())
      .def_rw("batch", &RopeParams::batch)
      .def_rw("seq", &RopeParams::seq)
      .def_rw("width", &RopeParams::width)
      .def_rw("head_dim", &RopeParams::head_dim)
      .def_rw("layout", &RopeParams::layout)
      .def_rw("n_rot", &RopeParams::n_rot)
      .def_rw("style", &RopeParams::style)
      .def_rw("table_rows", &RopeParams::table_rows)
      .def_rw("table_stride", &RopeParams::table_stride)
      .def_rw("rows", &RopeParams::rows)
      .def_rw("src_row_stride", &RopeParams::src_row_stride);
  nb::class_<RopeAttrs>(m, "RopeAttrs")
      .def(nb::init<>())
      .def_rw("head_dim", &RopeAttrs::head_dim)
      .def_rw("num_heads", &RopeAttrs::num_heads)
      .def_rw("layout", &RopeAttrs::layout)
      .def_rw("n_rot", &RopeAttrs::n_rot)
      .def_rw("style", &RopeAttrs::style)
      .def_rw("table_rows", &RopeAttrs::table_rows);
  nb::class_<RopeNames>(m, "RopeNames")
      .def(nb::init<>())
      .def_rw("x", &RopeNames::x)
      .def_rw("k", &RopeNames::k)
      .def_rw("cos", &RopeNames::cos)
      .def_rw("sin", &RopeNames::sin)
      .def_rw("positions", &RopeNames::positions)
      .def_rw("cos_sin_cache", &RopeNames::cos_sin_cache);
  m.def("rope_call", &rope_call_of, "shapes"_a, "attrs"_a, "names"_a);
  nb::class_<RopeQkParams>(m, "RopeQkParams")
      .def(nb::init<>())
      .def_rw("q", &RopeQkParams::q)
      .def_rw("k_width", &RopeQkParams::k_width)
      .def_rw("k_src_row_stride", &RopeQkParams::k_src_row_stride);
  nb::class_<AxialRopeParams>(m, "AxialRopeParams")
      .def(nb::init<>())
      .def_rw("batch", &AxialRopeParams::batch)
      .def_rw("seq", &AxialRopeParams::seq)
      .def_rw("width", &AxialRopeParams::width)
      .def_rw("num_heads", &AxialRopeParams::num_heads)
      .def_rw("end_x", &AxialRopeParams::end_x)
      .def_rw("end_y", &AxialRopeParams::end_y)
      .def_rw("theta", &AxialRopeParams::theta)
      .def_rw("repeat_factor", &AxialRopeParams::repeat_factor)
      .def_rw("src_row_stride", &AxialRopeParams::src_row_stride);
  nb::class_<SwigluParams>(m, "SwigluParams")
      .def(nb::init<>())
      .def_rw("rows", &SwigluParams::rows)
      .def_rw("n", &SwigluParams::n)
      .def_rw("gate_first", &SwigluParams::gate_first);

  m.def("attention_forward", &attention_forward, "backend"_a, "params"_a, "inputs"_a, "out"_a,
        "lse"_a.none());
  m.def("attention_forward_contiguous", &attention_forward_contiguous, "backend"_a, "plan"_a, "q"_a,
        "k"_a, "v"_a, "out"_a, "dtype"_a);
  m.def("attention_forward_quantized", &attention_forward_quantized, "backend"_a, "params"_a,
        "inputs"_a, "out"_a);
  m.def("quantize_kv", &quantize_kv, "backend"_a, "params"_a, "k"_a, "v"_a, "k_codes"_a,
        "v_codes"_a, "k_scale"_a, "v_scale"_a);
  m.def("attention_backward", &attention_backward, "backend"_a, "params"_a, "inputs"_a, "dout"_a,
        "dq"_a.none(), "dk"_a.none(), "dv"_a.none(), "dsinks"_a.none(), "dbias"_a.none());
  m.def("attention_forward_rounding", &attention_forward_rounding, "params"_a, "inputs"_a,
        "rel_delta"_a, "unrounded"_a, "flip"_a);
  m.def("attention_backward_rounding", &attention_backward_rounding, "params"_a, "inputs"_a,
        "dout"_a, "rel_delta"_a, "dq"_a, "dq_flip"_a, "dk"_a, "dk_flip"_a, "dv"_a, "dv_flip"_a);
  m.def("attention_backward_saved", &attention_backward_saved, "backend"_a, "params"_a, "inputs"_a,
        "out"_a, "lse"_a, "dout"_a, "dq"_a, "dk"_a, "dv"_a, "dsinks"_a.none(), "dbias"_a.none());
  m.def("alibi_standard_slopes", &alibi_standard_slopes, "num_heads"_a);
  m.def("rope", &rope, "backend"_a, "params"_a, "x"_a, "cos"_a, "sin"_a, "positions"_a.none(),
        "out"_a, "backward"_a);
  m.def("rope_qk", &rope_qk, "backend"_a, "params"_a, "q"_a, "k"_a, "cos"_a, "sin"_a,
        "positions"_a.none(), "q_out"_a, "k_out"_a, "backward"_a);
  m.def("axial_rope", &axial_rope, "backend"_a, "params"_a, "x"_a, "out"_a, "backward"_a);
  m.def(
      "swiglu_params",
      [](const Shape& x, bool gate_first, const std::string& name) {
        const SwigluPlan plan = SwigluPlan::from_shapes(x, gate_first, name);
        return SwigluParams{plan.rows, plan.n, plan.gate_first};
      },
      "x"_a, "gate_first"_a, "name"_a);
  m.def("swiglu_forward", &swiglu_forward, "backend"_a, "params"_a, "x"_a, "out"_a);
  m.def("swiglu_backward", &swiglu_backward, "backend"_a, "params"_a, "x"_a, "dy"_a, "dx"_a);
  m.def("attention_block", &attention_block, "backend"_a, "num_heads"_a, "inputs"_a, "out"_a);

  // FlexAttention (SPEC §13): the programs arrive as the node lists of the
  // Python tracer (tandem/flex.py), the plan is made and validated here.
  nb::class_<FlexPlan>(m, "FlexPlan")
      .def_prop_ro("scale", &FlexPlan::scale)
      .def_prop_ro("q_blocks", &FlexPlan::q_blocks)
      .def_prop_ro("kv_blocks", &FlexPlan::kv_blocks);
  m.def("flex_call", &flex_call, "shapes"_a, "enable_gqa"_a, "scale"_a.none(), "score_mod"_a.none(),
        "mask_mod"_a.none(), "block_mask"_a.none());
  m.def("flex_forward", &flex_forward, "backend"_a, "plan"_a, "inputs"_a, "out"_a, "lse"_a.none());
  m.def("flex_backward", &flex_backward, "backend"_a, "plan"_a, "inputs"_a, "dout"_a, "dq"_a.none(),
        "dk"_a.none(), "dv"_a.none(), "d_tensors"_a);
  m.def("create_block_mask", &create_block_mask, "mask_mod"_a.none(), "mask_tensors"_a, "B"_a,
        "H"_a, "Sq"_a, "Sk"_a, "q_block"_a, "kv_block"_a);
  m.def("validate_block_mask", &validate_block_mask, "plan"_a, "inputs"_a);

  m.def("offers", &offers, "backend"_a, "dtype"_a, "entry"_a);
  m.def("set_threads", [](int n) {
    require(n >= 0, "threads", n, "must be >= 0 (0 = every core)");
    implementations().set_threads(n);
  });
  m.def("threads", [] { return implementations().threads; });
  m.def(
      "set_invariant", [](bool on) { implementations().set_invariant(on); }, "on"_a);
  m.def("invariant", [] { return implementations().invariant; });
  m.def("has_optimized", [] { return implementations().optimized.has_value(); });
#ifdef TANDEM_PYTHON_HAVE_OPTIMIZED
  m.def("simd_target", [] {
    optimized::force_environment_target();  // as the first backend would
    return optimized::current_target();
  });
#else
  m.def("simd_target", [] { return std::string("(no optimized backend)"); });
#endif
  m.def("version", [] { return std::string(tandem::version); });
  // The address of the first element nanobind sees: tests compare it with
  // the caller's to show that an array crossed without a copy.
  m.def("address", [](const In& a) { return reinterpret_cast<std::uintptr_t>(a.data()); });
}
