// SPDX-License-Identifier: Apache-2.0
// The optimized backend as a tandem::Backend: validates the Options once and
// binds every entry point of tandem::Kernels<T> (float, bfloat16, float16)
// to the kernels of optimized/src, each called with the options. The views of each
// call are validated by the entry points themselves (entry_points.hpp).
#include "tandem/optimized/backend.hpp"

#include <cstdint>
#include <limits>
#include <string>

#include "entry_points.hpp"
#include "tandem/optimized/decode.hpp"
#include "tandem/optimized/tuning.hpp"

namespace tandem::optimized {
namespace {

using detail::Gradient;

/// Throws Error unless `value` of geometry field `field` lies in [lo, hi].
void require_in(std::int64_t value, const std::string& field, std::int64_t lo, std::int64_t hi) {
  require(value >= lo && value <= hi, "geometry." + field, value,
          "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

/// Validates every field of the geometry (the ranges of Geometry's fields).
void validate(const Geometry& g) {
  constexpr std::int64_t kMaxKeys = 4096, kMaxRows = 65536, kMax = std::int64_t{1} << 20;
  require_in(g.key_block, "key_block", 1, kMaxKeys);
  require(g.edge_block >= 1 && g.edge_block <= g.key_block, "geometry.edge_block", g.edge_block,
          "must be in [1, key_block = " + std::to_string(g.key_block) + "]");
  require_in(g.rows_per_tile, "rows_per_tile", 1, kMaxRows);
  require_in(g.rows_per_tile_banded, "rows_per_tile_banded", 1, kMaxRows);
  require(g.decode_tiles == DecodeTiles::one_vector || g.decode_tiles == DecodeTiles::never ||
              g.decode_tiles == DecodeTiles::always,
          "geometry.decode_tiles", static_cast<std::int64_t>(g.decode_tiles),
          "must be one_vector, never or always");
  require_in(g.split_keys_chunk, "split_keys_chunk", 0, kMax);
  require_in(g.split_keys_min_chunks, "split_keys_min_chunks", 0, kMax);
  require_in(g.split_keys_contiguous_heads, "split_keys_contiguous_heads", 0,
             std::numeric_limits<std::int64_t>::max());
  require_in(g.split_keys_step, "split_keys_step", 1, kMax);
  require_in(g.backward_min_tasks, "backward_min_tasks", 1, kMax);
  require_in(g.backward_query_parts, "backward_query_parts", 0, kMax);
}

/// The entry point that calls `kernel` with the call's arguments, then the
/// options.
template <auto kernel>
auto with_options(const Options& options) {
  return [options](const auto&... args) { kernel(args..., options); };
}

/// The options of one attention call of `plan`: the geometry of its shape
/// class where the tuning has one (tuning.hpp: bit-neutral fields only).
Options for_call(const Options& options, const AttentionPlan& plan, bool backward) {
  if (!options.tuning) return options;
  Options o = options;
  o.geometry = options.tuning->geometry(shape_class(plan, backward), options.geometry);
  return o;
}

/// As with_options, for an attention forward: the call's tuned geometry.
template <auto kernel>
auto forward_tuned(const Options& options) {
  return [options](const AttentionPlan& plan, const auto&... args) {
    kernel(plan, args..., for_call(options, plan, false));
  };
}

/// The dq, dk or dv alone entry point at storage type T.
template <class T>
auto one_gradient(const Options& options, Gradient which) {
  return [options, which](const AttentionPlan& plan, const AttentionInputs<T>& in,
                          std::span<const T> dout, std::span<T> grad) {
    detail::attention_backward_one<T>(plan, in, dout, which, grad, for_call(options, plan, true));
  };
}

/// The five backward entry points of storage type T (float, bf16, f16).
template <class T>
void bind_backward(Kernels<T>& k, const Options& options) {
  k.attention_backward = [options](const AttentionPlan& plan, const AttentionInputs<T>& in,
                                   std::span<const T> dout, const AttentionGrads<T>& g) {
    detail::attention_backward<T>(plan, in, dout, g, nullptr, for_call(options, plan, true));
  };
  k.attention_backward_saved = [options](const AttentionPlan& plan, const AttentionInputs<T>& in,
                                         const AttentionSaved<T>& saved, std::span<const T> dout,
                                         const AttentionGrads<T>& g) {
    detail::attention_backward<T>(plan, in, dout, g, &saved, for_call(options, plan, true));
  };
  k.attention_backward_dq = one_gradient<T>(options, Gradient::dq);
  k.attention_backward_dk = one_gradient<T>(options, Gradient::dk);
  k.attention_backward_dv = one_gradient<T>(options, Gradient::dv);
}

/// RoPE of q and k in one call (`transpose`: the backward).
template <class T>
auto rope_qk(const Options& options, bool transpose) {
  return [options, transpose](const RopeQkPlan& plan, std::span<const T> q, std::span<const T> k,
                              const RopeTables<T>& tables, std::span<T> q_dst, std::span<T> k_dst) {
    detail::rope_qk(plan, q, k, tables, q_dst, k_dst, transpose, options);
  };
}

/// Binds RoPE, axial RoPE and SwiGLU at storage type T (float, bfloat16,
/// float16; SPEC §10.2).
template <class T>
void bind_rope_swiglu(Kernels<T>& k, const Options& options) {
  k.rope_forward = with_options<detail::rope_forward<T>>(options);
  k.rope_backward = with_options<detail::rope_backward<T>>(options);
  k.rope_forward_qk = rope_qk<T>(options, false);
  k.rope_backward_qk = rope_qk<T>(options, true);
  k.axial_rope_forward = with_options<detail::axial_rope_forward<T>>(options);
  k.axial_rope_backward = with_options<detail::axial_rope_backward<T>>(options);
  k.swiglu_forward = with_options<detail::swiglu_forward<T>>(options);
  k.swiglu_backward = with_options<detail::swiglu_backward<T>>(options);
}

/// The quantized-cache entry points of Kernels<T> (SPEC §10.4).
template <class T>
void bind_quantized(Kernels<T>& k, const Options& options) {
  k.attention_forward_quantized = [options](const AttentionPlan& plan, const AttentionInputs<T>& in,
                                            const QuantizedKv& kv, std::span<T> out) {
    detail::attention_forward_quantized<T>(plan, in, kv, out, options);
  };
  k.quantize_kv = [options](const AttentionPlan& plan, std::span<const T> kk, std::span<const T> v,
                            const QuantizedKvOut& out) {
    detail::quantize_kv<T>(plan, kk, v, out, options);
  };
}

/// FlexAttention (SPEC §13.4) at storage type T (float, bfloat16, float16).
template <class T>
void bind_flex(Kernels<T>& k, const Options& options) {
  k.flex_forward = with_options<detail::flex_forward<T>>(options);
  k.flex_backward = with_options<detail::flex_backward<T>>(options);
}

}  // namespace

Backend backend(Options options) {
  require(options.threads >= 0, "threads", options.threads, "must be >= 0 (0 = all cores)");
  validate(options.geometry);
  force_environment_target();
  if (!options.tuning && options.tuning_from_environment) options.tuning = environment_tuning();
  Backend b;
  b.name = "optimized";
  b.attention_forward = forward_tuned<detail::attention_forward>(options);
  b.attention_forward_lse = forward_tuned<detail::attention_forward_lse>(options);
  bind_backward<float>(b, options);
  bind_backward<bfloat16>(b.bf16, options);
  bind_backward<float16>(b.f16, options);
  bind_rope_swiglu(b.kernels<float>(), options);
  bind_rope_swiglu(b.bf16, options);
  bind_rope_swiglu(b.f16, options);
  b.attention_block = with_options<detail::attention_block<float>>(options);
  b.bf16.attention_block = with_options<detail::attention_block<bfloat16>>(options);
  b.f16.attention_block = with_options<detail::attention_block<float16>>(options);
  b.bf16.attention_forward = forward_tuned<detail::attention_forward_stored<bfloat16>>(options);
  b.bf16.attention_forward_lse =
      forward_tuned<detail::attention_forward_lse_stored<bfloat16>>(options);
  b.f16.attention_forward = forward_tuned<detail::attention_forward_stored<float16>>(options);
  b.f16.attention_forward_lse =
      forward_tuned<detail::attention_forward_lse_stored<float16>>(options);
  bind_quantized<float>(b, options);
  bind_quantized<bfloat16>(b.bf16, options);
  bind_quantized<float16>(b.f16, options);
  bind_flex<float>(b, options);
  bind_flex<bfloat16>(b.bf16, options);
  bind_flex<float16>(b.f16, options);
  return b;
}

template <class T>
bool attention_decode_stored(const AttentionPlan& plan, const AttentionInputs<T>& in,
                             std::span<T> out, std::span<float> lse, const Options& options) {
  require(options.threads >= 0, "threads", options.threads, "must be >= 0 (0 = all cores)");
  validate(options.geometry);
  return detail::attention_decode_stored<T>(plan, in, out, lse, options);
}

template bool attention_decode_stored<bfloat16>(const AttentionPlan&,
                                                const AttentionInputs<bfloat16>&,
                                                std::span<bfloat16>, std::span<float>,
                                                const Options&);
template bool attention_decode_stored<float16>(const AttentionPlan&,
                                               const AttentionInputs<float16>&, std::span<float16>,
                                               std::span<float>, const Options&);

}  // namespace tandem::optimized
