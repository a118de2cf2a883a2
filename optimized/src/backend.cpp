// SPDX-License-Identifier: Apache-2.0
// The optimized backend as a tandem::Backend: every entry point bound to the
// Highway + OpenMP kernels of optimized/src. Each entry validates its views
// against the plan (the check_* helpers) before any kernel writes.
#include "tandem/optimized/backend.hpp"

#include <omp.h>

#include "attention.hpp"
#include "streaming.hpp"

namespace tandem::optimized {
namespace {

/// The OpenMP threads of one call: Options::threads, or all of OpenMP's
/// threads (omp_get_max_threads at call time) when it is 0.
int resolve_threads(const Options& options) {
  return options.threads > 0 ? options.threads : omp_get_max_threads();
}

/// The attention features the optimized kernels do not implement yet — sinks,
/// ALiBi, packed sequences, paged caches (SPEC §2.7–2.10): the one place that
/// refuses them, first thing in every attention entry point, so that no call
/// returns a wrong result. The reference backend implements them all.
void require_supported(const AttentionPlan& plan) {
  const char* input = plan.sinks                      ? "sinks"
                      : plan.alibi != AlibiKind::none ? "alibi_slopes"
                      : plan.varlen()                 ? "cu_seqlens_q"
                      : plan.paged()                  ? "block_table"
                                                      : nullptr;
  if (input != nullptr) {
    throw Error(input, std::string(input) + " (" + plan.describe() +
                           ") is not supported by the optimized backend yet");
  }
}

/// dq, dk or dv alone: validates that one gradient and computes only it.
enum class Grad { dq, dk, dv };

std::function<void(const AttentionPlan&, const AttentionInputs<float>&, std::span<const float>,
                   std::span<float>)>
one_gradient(Options options, Grad which) {
  return [options, which](const AttentionPlan& plan, const AttentionInputs<float>& in,
                          std::span<const float> dout, std::span<float> grad) {
    require_supported(plan);
    check_inputs(plan, in);
    require_size(dout.size(), plan.o.extent, "dout");
    AttentionGrads<float> g;
    switch (which) {
      case Grad::dq:
        require_size(grad.size(), plan.dq.extent, "dq");
        g.dq = grad;
        break;
      case Grad::dk:
        require_size(grad.size(), plan.dk.extent, "dk");
        g.dk = grad;
        break;
      case Grad::dv:
        require_size(grad.size(), plan.dv.extent, "dv");
        g.dv = grad;
        break;
    }
    detail::attention_backward(plan, in, dout, g, nullptr, resolve_threads(options));
  };
}

}  // namespace

Backend backend(Options options) {
  require(options.threads >= 0, "threads", options.threads, "must be >= 0 (0 = all cores)");
  Backend b;
  b.name = "optimized";
  b.attention_forward = [options](const AttentionPlan& plan, const AttentionInputs<float>& in,
                                  std::span<float> out) {
    require_supported(plan);
    check_inputs(plan, in);
    require_size(out.size(), plan.o.extent, "out");
    detail::attention_forward(plan, in, out, {}, resolve_threads(options));
  };
  b.attention_forward_lse = [options](const AttentionPlan& plan, const AttentionInputs<float>& in,
                                      std::span<float> out, std::span<float> lse) {
    require_supported(plan);
    check_inputs(plan, in);
    require_size(out.size(), plan.o.extent, "out");
    require_size(lse.size(), plan.lse_size(), "lse");
    detail::attention_forward(plan, in, out, lse, resolve_threads(options));
  };
  b.attention_backward = [options](const AttentionPlan& plan, const AttentionInputs<float>& in,
                                   std::span<const float> dout, const AttentionGrads<float>& g) {
    require_supported(plan);
    check_inputs(plan, in);
    require_size(dout.size(), plan.o.extent, "dout");
    check_grads(plan, g, true);
    detail::attention_backward(plan, in, dout, g, nullptr, resolve_threads(options));
  };
  b.attention_backward_saved = [options](
                                   const AttentionPlan& plan, const AttentionInputs<float>& in,
                                   const AttentionSaved<float>& saved, std::span<const float> dout,
                                   const AttentionGrads<float>& g) {
    require_supported(plan);
    check_inputs(plan, in);
    check_saved(plan, saved);
    require_size(dout.size(), plan.o.extent, "dout");
    check_grads(plan, g, true);
    detail::attention_backward(plan, in, dout, g, &saved, resolve_threads(options));
  };
  b.attention_backward_dq = one_gradient(options, Grad::dq);
  b.attention_backward_dk = one_gradient(options, Grad::dk);
  b.attention_backward_dv = one_gradient(options, Grad::dv);

  b.rope_forward = [options](const RopePlan& plan, std::span<const float> x,
                             const RopeTables<float>& tables, std::span<float> out) {
    detail::rope_forward(plan, x, tables, out, resolve_threads(options));
  };
  b.rope_backward = [options](const RopePlan& plan, std::span<const float> dy,
                              const RopeTables<float>& tables, std::span<float> dx) {
    detail::rope_backward(plan, dy, tables, dx, resolve_threads(options));
  };
  b.axial_rope_forward = [options](const AxialRopePlan& plan, std::span<const float> x,
                                   std::span<float> out) {
    detail::axial_rope_forward(plan, x, out, resolve_threads(options));
  };
  b.axial_rope_backward = [options](const AxialRopePlan& plan, std::span<const float> dy,
                                    std::span<float> dx) {
    detail::axial_rope_backward(plan, dy, dx, resolve_threads(options));
  };
  b.swiglu_forward = [options](const SwigluPlan& plan, std::span<const float> x,
                               std::span<float> out) {
    detail::swiglu_forward(plan, x, out, resolve_threads(options));
  };
  b.swiglu_backward = [options](const SwigluPlan& plan, std::span<const float> x,
                                std::span<const float> dy, std::span<float> dx) {
    detail::swiglu_backward(plan, x, dy, dx, resolve_threads(options));
  };
  b.attention_block = [options](const AttentionBlockPlan& plan, const AttentionBlockInputs& in,
                                std::span<float> out) {
    detail::attention_block(plan, in, out, resolve_threads(options));
  };
  return b;
}

}  // namespace tandem::optimized
