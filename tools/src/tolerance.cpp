// SPDX-License-Identifier: Apache-2.0
// The default tolerance of a bf16 or f16 case, derived from the error bounds
// of SPEC §10.5 (the derivation, step by step, is SPEC §9.5).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "case.hpp"

namespace tandem::tool {
namespace {

/// max |x| over the values of the inputs `names` that the case has.
double max_abs(const Case& c, std::initializer_list<const char*> names) {
  double m = 0.0;
  for (const char* name : names) {
    auto it = c.inputs.find(name);
    if (it == c.inputs.end()) continue;
    for (float x : it->second.array.values) m = std::max(m, std::fabs(static_cast<double>(x)));
  }
  return m;
}

/// max |v_j| of the values attention reads: plain v, or the bound
/// max σ · max |c| of a quantized one (SPEC §10.4).
double max_abs_v(const Case& c) {
  if (c.spec.kv_cache == KvCache::plain) return max_abs(c, {"v"});
  const bool e4m3 = c.spec.kv_cache == KvCache::e4m3;
  double codes = 0.0;
  for (std::int64_t code : c.inputs.at("v").array.integers) {
    const double d =
        e4m3 ? static_cast<double>(float8_e4m3::from_bits(static_cast<std::uint8_t>(code)))
             : static_cast<double>(code);
    if (std::isfinite(d)) codes = std::max(codes, std::fabs(d));
  }
  return codes * max_abs(c, {"v_scale"});
}

/// u of the storage type: 2^-8 (bf16), 2^-11 (f16).
double storage_unit_roundoff(DType t) {
  return t == DType::bf16 ? storage_traits<bfloat16>::unit_roundoff
                          : storage_traits<float16>::unit_roundoff;
}

}  // namespace

Tolerance low_precision_tolerance(const Case& c) {
  const double u = storage_unit_roundoff(c.spec.dtype);
  // Half the spacing of f16's subnormals (2^-24), per rounding of a tiny
  // value, where u·|x| no longer bounds the error; bf16's are below float32's.
  const double tiny = c.spec.dtype == DType::f16 ? std::ldexp(1.0, -25) : 0.0;
  const Tolerance f32 = op_info(c.spec.op).tolerance;  // the float32 arithmetic (ε)
  switch (c.spec.op) {
    case Op::attention:
      // Both sides within u|o| + u·Σ_j p_ij|v_j| + ε of exact attention, Σ_j p_ij <= 1.
      return {2 * u, 2 * u * max_abs_v(c) + 2 * tiny + f32.atol};
    case Op::rope:
    case Op::rope_backward:
    case Op::rope_qk:
    case Op::rope_qk_backward:
    case Op::axial_rope:
    case Op::axial_rope_backward: {
      // Ours rounds x1·c − x2·s once; a framework in T also rounds both products:
      // u|y| + u|y| + u(|x1 c| + |x2 s|), and |x1 c| + |x2 s| <= 2 max|x|.
      const double x = max_abs(c, {"x", "dout", "q", "k", "dq_out", "dk_out"});
      return {2 * u, 2 * u * x + 4 * tiny + f32.atol};
    }
    case Op::swiglu:
      // Ours rounds silu(g)·u once; a framework rounds silu(g), then the product.
      return {3 * u, 3 * tiny + f32.atol};
    case Op::attention_backward:
    case Op::swiglu_backward:
    case Op::attention_block:
    case Op::flex_attention:
    case Op::flex_attention_backward:
      break;
  }
  // SPEC §10.5 bounds the forwards of single ops only; a gradient's rounded
  // sums, and the block's roundings compounded through its parts (§10.5
  // states no direct bound for the block), are bounded in the output's own
  // scale (SPEC §9.5).
  double scale = 0.0;
  for (const auto& [name, t] : c.expected) {
    for (float x : t.array.values) {
      if (std::isfinite(x)) scale = std::max(scale, std::fabs(static_cast<double>(x)));
    }
  }
  return {4 * u, 4 * u * scale + 4 * tiny + f32.atol};
}

Tolerance flex_tolerance(const Case& c) {
  // u of T, float32's 2^-24 included: the reference rounds o (and lse) to T
  // once, and a framework's result in T is taken to be within the same
  // bound of the exact attention of the stored inputs (SPEC §9.7).
  const double u =
      c.spec.dtype == DType::f32 ? std::ldexp(1.0, -24) : storage_unit_roundoff(c.spec.dtype);
  const double tiny = c.spec.dtype == DType::f16 ? std::ldexp(1.0, -25) : 0.0;
  const Tolerance eps = op_info(c.spec.op).tolerance;  // the float32 arithmetic (ε)
  if (c.spec.op == Op::flex_attention) {
    // As attention (SPEC §9.5): both sides within u|o| + u·Σ_j p_ij|v_j| + ε, Σ_j p_ij <= 1.
    return {2 * u, 2 * u * max_abs(c, {"v"}) + 2 * tiny + eps.atol};
  }
  // As attention_backward: in the gradients' own scale.
  double scale = 0.0;
  for (const auto& [name, t] : c.expected) {
    for (float x : t.array.values) {
      if (std::isfinite(x)) scale = std::max(scale, std::fabs(static_cast<double>(x)));
    }
  }
  return {4 * u, 4 * u * scale + 4 * tiny + eps.atol};
}

}  // namespace tandem::tool
