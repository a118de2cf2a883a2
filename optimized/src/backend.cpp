// SPDX-License-Identifier: Apache-2.0
// The optimized backend as a tandem::Backend: validates the Options once and
// binds every entry point to the kernels of optimized/src. The views of each
// call are validated by the entry points themselves (entry_points.hpp).
#include "tandem/optimized/backend.hpp"

#include <cstdint>
#include <limits>
#include <string>

#include "entry_points.hpp"

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

/// The dq, dk or dv alone entry point.
std::function<void(const AttentionPlan&, const AttentionInputs<float>&, std::span<const float>,
                   std::span<float>)>
one_gradient(const Options& options, Gradient which) {
  return [options, which](const AttentionPlan& plan, const AttentionInputs<float>& in,
                          std::span<const float> dout, std::span<float> grad) {
    detail::attention_backward_one(plan, in, dout, which, grad, options);
  };
}

}  // namespace

Backend backend(Options options) {
  require(options.threads >= 0, "threads", options.threads, "must be >= 0 (0 = all cores)");
  validate(options.geometry);
  Backend b;
  b.name = "optimized";
  b.attention_forward = [options](const AttentionPlan& plan, const AttentionInputs<float>& in,
                                  std::span<float> out) {
    detail::attention_forward(plan, in, out, options);
  };
  b.attention_forward_lse = [options](const AttentionPlan& plan, const AttentionInputs<float>& in,
                                      std::span<float> out, std::span<float> lse) {
    detail::attention_forward_lse(plan, in, out, lse, options);
  };
  b.attention_backward = [options](const AttentionPlan& plan, const AttentionInputs<float>& in,
                                   std::span<const float> dout, const AttentionGrads<float>& g) {
    detail::attention_backward(plan, in, dout, g, nullptr, options);
  };
  b.attention_backward_saved = [options](
                                   const AttentionPlan& plan, const AttentionInputs<float>& in,
                                   const AttentionSaved<float>& saved, std::span<const float> dout,
                                   const AttentionGrads<float>& g) {
    detail::attention_backward(plan, in, dout, g, &saved, options);
  };
  b.attention_backward_dq = one_gradient(options, Gradient::dq);
  b.attention_backward_dk = one_gradient(options, Gradient::dk);
  b.attention_backward_dv = one_gradient(options, Gradient::dv);

  b.rope_forward = [options](const RopePlan& plan, std::span<const float> x,
                             const RopeTables<float>& tables, std::span<float> out) {
    detail::rope_forward(plan, x, tables, out, options);
  };
  b.rope_backward = [options](const RopePlan& plan, std::span<const float> dy,
                              const RopeTables<float>& tables, std::span<float> dx) {
    detail::rope_backward(plan, dy, tables, dx, options);
  };
  b.rope_forward_qk = [options](const RopeQkPlan& plan, std::span<const float> q,
                                std::span<const float> k, const RopeTables<float>& tables,
                                std::span<float> q_out, std::span<float> k_out) {
    detail::rope_qk(plan, q, k, tables, q_out, k_out, false, options);
  };
  b.rope_backward_qk = [options](const RopeQkPlan& plan, std::span<const float> dq_out,
                                 std::span<const float> dk_out, const RopeTables<float>& tables,
                                 std::span<float> dq, std::span<float> dk) {
    detail::rope_qk(plan, dq_out, dk_out, tables, dq, dk, true, options);
  };
  b.axial_rope_forward = [options](const AxialRopePlan& plan, std::span<const float> x,
                                   std::span<float> out) {
    detail::axial_rope_forward(plan, x, out, options);
  };
  b.axial_rope_backward = [options](const AxialRopePlan& plan, std::span<const float> dy,
                                    std::span<float> dx) {
    detail::axial_rope_backward(plan, dy, dx, options);
  };
  b.swiglu_forward = [options](const SwigluPlan& plan, std::span<const float> x,
                               std::span<float> out) {
    detail::swiglu_forward(plan, x, out, options);
  };
  b.swiglu_backward = [options](const SwigluPlan& plan, std::span<const float> x,
                                std::span<const float> dy, std::span<float> dx) {
    detail::swiglu_backward(plan, x, dy, dx, options);
  };
  b.attention_block = [options](const AttentionBlockPlan& plan, const AttentionBlockInputs& in,
                                std::span<float> out) {
    detail::attention_block(plan, in, out, options);
  };
  return b;
}

}  // namespace tandem::optimized
