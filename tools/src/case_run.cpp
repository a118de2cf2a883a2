// SPDX-License-Identifier: Apache-2.0
// Running a loaded case on a backend at the case's storage type (SPEC §9,
// §10): its tensors as T, the entry point of Kernels<T>, the outputs back as
// float32 (exact for bf16 and f16).
#include <string>
#include <vector>

#include "case.hpp"

namespace tandem::tool {
namespace {

/// The entry points a backend offers at T, with the backend's name.
template <class T>
struct Typed {
  const Kernels<T>& k;
  const Backend& backend;
};

/// A case's tensors as T (exact: every value was read from T's encoding, or
/// is a float32 for T = float) and the float32 and integer views the call
/// also takes.
template <class T>
class TypedInputs {
 public:
  explicit TypedInputs(const Case& c) : c_(c) {
    for (const auto& [name, t] : c.inputs) {
      auto& v = data_[name];
      v.reserve(t.array.values.size());
      for (float x : t.array.values) v.push_back(T(static_cast<double>(x)));
    }
  }
  std::span<const T> operator()(const std::string& name) const {
    auto it = data_.find(name);
    return it == data_.end() ? std::span<const T>() : std::span<const T>(it->second);
  }
  std::span<const float> f32(const std::string& name) const {
    auto it = c_.inputs.find(name);
    return it == c_.inputs.end() ? std::span<const float>() : it->second.array.values;
  }
  Indices indices(const std::string& name) const {
    auto it = c_.inputs.find(name);
    return it == c_.inputs.end() ? Indices() : Indices(it->second.array.integers);
  }
  AttentionInputs<T> attention() const {
    AttentionInputs<T> in{(*this)("q"), (*this)("k"), (*this)("v"), f32("mask")};
    in.sinks = (*this)("sinks");
    in.alibi_slopes = f32("alibi_slopes");
    in.cu_seqlens_q = indices("cu_seqlens_q");
    in.cu_seqlens_k = indices("cu_seqlens_k");
    in.seqused_k = indices("seqused_k");
    in.block_table = indices("block_table");
    in.cache_seqlens = indices("cache_seqlens");
    in.key_origin = indices("key_origin");
    return in;
  }
  /// The codes of a quantized k or v as bytes (int8 two's complement, e4m3 bits).
  std::vector<std::uint8_t> codes(const std::string& name) const {
    std::vector<std::uint8_t> out;
    for (std::int64_t x : c_.inputs.at(name).array.integers) {
      out.push_back(static_cast<std::uint8_t>(x));
    }
    return out;
  }

 private:
  const Case& c_;
  std::map<std::string, std::vector<T>> data_;
};

template <class T>
std::vector<float> widen(const std::vector<T>& v) {
  std::vector<float> out;
  out.reserve(v.size());
  for (const T& x : v) out.push_back(static_cast<float>(static_cast<double>(x)));
  return out;
}

template <class T>
std::vector<T> sized(std::int64_t n) {
  return std::vector<T>(static_cast<std::size_t>(n));
}

/// Throws unless the entry point is offered (an empty std::function is not).
template <class F>
void need(const Case& c, const Backend& backend, const F& fn, const char* entry) {
  if (fn) return;
  throw NotOffered(c.spec.name, backend.name, "",
                   std::string("backend '") + backend.name + "' does not offer " + entry +
                       " for dtype " + std::string(to_string(c.spec.dtype)));
}

template <class T>
void run_attention(const Case& c, const Typed<T>& b, AttentionPlan plan,
                   std::map<std::string, std::vector<float>>& out) {
  const TypedInputs<T> in(c);
  auto o = sized<T>(plan.o.extent);
  if (plan.kv_cache == KvCache::plain) {
    need(c, b.backend, b.k.attention_forward, "attention_forward");
    b.k.attention_forward(plan, in.attention(), o);
  } else {
    need(c, b.backend, b.k.attention_forward_quantized, "attention_forward_quantized");
    AttentionInputs<T> rest = in.attention();
    rest.k = {};
    rest.v = {};
    const auto kc = in.codes("k"), vc = in.codes("v");
    b.k.attention_forward_quantized(plan, rest,
                                    QuantizedKv{kc, vc, in.f32("k_scale"), in.f32("v_scale")}, o);
  }
  out["out"] = widen(o);
}

template <class T>
void run_attention_backward(const Case& c, const Typed<T>& b, const AttentionPlan& plan,
                            std::map<std::string, std::vector<float>>& out) {
  need(c, b.backend, b.k.attention_backward, "attention_backward");
  const TypedInputs<T> in(c);
  auto dq = sized<T>(plan.dq.extent), dk = sized<T>(plan.dk.extent), dv = sized<T>(plan.dv.extent),
       dsinks = sized<T>(plan.sinks ? plan.H : 0),
       dbias = sized<T>(plan.mask == MaskKind::bias ? plan.mask_size() : 0);
  b.k.attention_backward(plan, in.attention(), in("dout"), {dq, dk, dv, dsinks, dbias});
  out["dq"] = widen(dq);
  out["dk"] = widen(dk);
  out["dv"] = widen(dv);
  if (plan.sinks) out["dsinks"] = widen(dsinks);
  if (plan.mask == MaskKind::bias) out["dbias"] = widen(dbias);
}

template <class T>
void run_rope(const Case& c, const Typed<T>& b, std::map<std::string, std::vector<float>>& out) {
  const TypedInputs<T> in(c);
  const RopeTables<T> tables{in("cos"), in("sin"), in.indices("positions")};
  switch (c.spec.op) {
    case Op::rope:
    case Op::rope_backward: {
      const auto& plan = std::get<RopePlan>(c.planned.plan);
      const bool fwd = c.spec.op == Op::rope;
      const auto& fn = fwd ? b.k.rope_forward : b.k.rope_backward;
      need(c, b.backend, fn, fwd ? "rope_forward" : "rope_backward");
      auto y = sized<T>(plan.out_size());
      fn(plan, in(fwd ? "x" : "dout"), tables, y);
      out[fwd ? "out" : "dx"] = widen(y);
      break;
    }
    default: {
      const auto& plan = std::get<RopeQkPlan>(c.planned.plan);
      const bool fwd = c.spec.op == Op::rope_qk;
      const auto& fn = fwd ? b.k.rope_forward_qk : b.k.rope_backward_qk;
      need(c, b.backend, fn, fwd ? "rope_forward_qk" : "rope_backward_qk");
      auto q = sized<T>(plan.q.out_size()), k = sized<T>(plan.k.out_size());
      fn(plan, in(fwd ? "q" : "dq_out"), in(fwd ? "k" : "dk_out"), tables, q, k);
      out[fwd ? "q_out" : "dq"] = widen(q);
      out[fwd ? "k_out" : "dk"] = widen(k);
      break;
    }
  }
}

template <class T>
void run_elementwise(const Case& c, const Typed<T>& b,
                     std::map<std::string, std::vector<float>>& out) {
  const TypedInputs<T> in(c);
  switch (c.spec.op) {
    case Op::axial_rope:
    case Op::axial_rope_backward: {
      const auto& plan = std::get<AxialRopePlan>(c.planned.plan);
      const bool fwd = c.spec.op == Op::axial_rope;
      const auto& fn = fwd ? b.k.axial_rope_forward : b.k.axial_rope_backward;
      need(c, b.backend, fn, fwd ? "axial_rope_forward" : "axial_rope_backward");
      auto y = sized<T>(plan.out_size());
      fn(plan, in(fwd ? "x" : "dout"), y);
      out[fwd ? "out" : "dx"] = widen(y);
      break;
    }
    case Op::swiglu: {
      const auto& plan = std::get<SwigluPlan>(c.planned.plan);
      need(c, b.backend, b.k.swiglu_forward, "swiglu_forward");
      auto y = sized<T>(plan.out_size());
      b.k.swiglu_forward(plan, in("x"), y);
      out["out"] = widen(y);
      break;
    }
    default: {
      const auto& plan = std::get<SwigluPlan>(c.planned.plan);
      need(c, b.backend, b.k.swiglu_backward, "swiglu_backward");
      auto dx = sized<T>(plan.in_size());
      b.k.swiglu_backward(plan, in("x"), in("dout"), dx);
      out["dx"] = widen(dx);
      break;
    }
  }
}

/// attention_block at the case's storage type (SPEC §7, §10.2); the keep mask is float32.
template <class T>
void run_block(const Case& c, const Typed<T>& b, std::map<std::string, std::vector<float>>& out) {
  const auto& plan = std::get<AttentionBlockPlan>(c.planned.plan);
  need(c, b.backend, b.k.attention_block, "attention_block");
  const TypedInputs<T> in(c);
  auto y = sized<T>(plan.x_size());
  b.k.attention_block(plan,
                      {in("x"), in("w_qkv"), in("b_qkv"), in("w_out"), in("b_out"), in.f32("mask"),
                       in("cos"), in("sin")},
                      y);
  out["out"] = widen(y);
}

/// Throws NotOffered when a backend's flex entry point says it does not
/// implement the call (an Error whose parameter is the entry point's name).
template <class F>
void flex_call(const Case& c, const Backend& backend, const char* entry, const F& call) {
  try {
    call();
  } catch (const Error& e) {
    if (e.parameter() != entry) throw;
    throw NotOffered(c.spec.name, "backend " + backend.name, entry, e.what());
  }
}

/// flex_attention and flex_attention_backward (SPEC §13.4, §9.7): the mods'
/// real tensors in T, their integer tensors and the block mask as integers.
template <class T>
void run_flex(const Case& c, const Typed<T>& b, std::map<std::string, std::vector<float>>& out) {
  const auto& plan = std::get<FlexPlan>(c.planned.plan);
  const TypedInputs<T> data(c);
  const FlexInputs<T> in = flex_inputs<T>(c, data);
  if (c.spec.op == Op::flex_attention) {
    need(c, b.backend, b.k.flex_forward, "flex_forward");
    auto o = sized<T>(plan.out_size());
    auto lse = sized<stat_t<T>>(plan.lse_size());
    flex_call(c, b.backend, "flex_forward", [&] { b.k.flex_forward(plan, in, o, lse); });
    out["out"] = widen(o);
    out["lse"] = widen(lse);
    return;
  }
  need(c, b.backend, b.k.flex_backward, "flex_backward");
  auto dq = sized<T>(plan.q_size()), dk = sized<T>(plan.k_size()), dv = sized<T>(plan.v_size());
  const auto& tensors = plan.params().score_mod.tensors();
  std::vector<std::vector<T>> dt;
  dt.reserve(tensors.size());
  for (const auto& t : tensors) dt.push_back(sized<T>(t.type == ModType::real ? t.size() : 0));
  FlexGrads<T> g{dq, dk, dv, {}};
  for (auto& d : dt) g.d_score_tensors.emplace_back(d);
  flex_call(c, b.backend, "flex_backward", [&] { b.k.flex_backward(plan, in, data("dout"), g); });
  out["dq"] = widen(dq);
  out["dk"] = widen(dk);
  out["dv"] = widen(dv);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    if (tensors[t].type == ModType::real) out["d" + tensors[t].name] = widen(dt[t]);
  }
}

template <class T>
std::map<std::string, std::vector<float>> run_typed(const Case& c, const Backend& backend,
                                                    std::optional<Rounding> rounding) {
  const Typed<T> b{backend.kernels<T>(), backend};
  std::map<std::string, std::vector<float>> out;
  switch (c.spec.op) {
    case Op::attention:
    case Op::attention_backward: {
      AttentionPlan plan = std::get<AttentionPlan>(c.planned.plan);
      if (rounding) plan.rounding = *rounding;
      if (c.spec.op == Op::attention) {
        run_attention(c, b, plan, out);
      } else {
        run_attention_backward(c, b, plan, out);
      }
      break;
    }
    case Op::rope:
    case Op::rope_backward:
    case Op::rope_qk:
    case Op::rope_qk_backward:
      run_rope(c, b, out);
      break;
    case Op::axial_rope:
    case Op::axial_rope_backward:
    case Op::swiglu:
    case Op::swiglu_backward:
      run_elementwise(c, b, out);
      break;
    case Op::attention_block:
      run_block(c, b, out);
      break;
    case Op::flex_attention:
    case Op::flex_attention_backward:
      run_flex(c, b, out);
      break;
  }
  return out;
}

}  // namespace

std::map<std::string, std::vector<float>> run_case(const Case& c, const Backend& backend,
                                                   std::optional<Rounding> rounding) {
  try {
    switch (c.spec.dtype) {
      case DType::bf16:
        return run_typed<bfloat16>(c, backend, rounding);
      case DType::f16:
        return run_typed<float16>(c, backend, rounding);
      default:
        return run_typed<float>(c, backend, rounding);
    }
  } catch (const Error& e) {
    if (e.parameter() == "rounding") {  // a profile the backend does not implement (SPEC §10.2)
      throw NotOffered(c.spec.name, "backend " + backend.name, e.parameter(),
                       std::string("does not offer the profile: ") + e.what());
    }
    throw CaseError(c.spec.name, "backend " + backend.name, e.parameter(),
                    std::string("rejected the call: ") + e.what());
  }
}

}  // namespace tandem::tool
