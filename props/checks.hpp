// SPDX-License-Identifier: Apache-2.0
/// @file checks.hpp
/// @brief The tolerances of the suite, in one place.
///
/// A float result `got` passes against a double `exp` when every element
/// satisfies `|got − exp| <= atol + rtol·|exp|` (NaN-aware, in double):
///
/// | op | atol | rtol |
/// |---|---|---|
/// | attention (fwd, bwd) | 64·ε·(1+L)·max(M, N) + U | 64·ε·(1+L) |
/// | rope, axial rope     | 32·ε·max|x|          | 32·ε |
/// | swiglu (fwd, bwd)    | 32·ε·M               | 64·ε |
/// | attention block      | 512·ε·max(M, 1)      | 512·ε |
///
/// ε = 2⁻²³, M = max |exp| over the compared tensor, L = logit_bound() (a
/// bound on |score|: exp's relative error grows with it), N the tensor's
/// natural scale from the inputs (out: max|v|; dq: |scale|·‖dO‖·‖V‖·‖K‖;
/// dk: |scale|·‖dO‖·‖V‖·‖Q‖; dv: ‖dO‖, row norms), so that an exact zero
/// reached by cancellation still has a float-sized tolerance, and U the
/// rounding of subnormal results (AttentionScales::underflow).
#pragma once

#include <string>

#include "cases.hpp"

namespace tandem::props {

/// Natural scales of one attention case: L bounds |logit|; out, dq, dk, dv
/// bound the size of each output's terms (dk and dv include the largest
/// column sum Σ_i p_ij, since they add up one term per query row that sees a key).
struct AttentionScales {
  double L = 0, out = 0, dq = 0, dk = 0, dv = 0;
  double dsinks = 0;  ///< ‖dO‖·‖V‖ times the query rows a sink's gradient sums over
  double dbias = 0;  ///< 2·‖dO‖·‖V‖ times the (b, h) rows a bias element's gradient sums over
  /// The absolute error float has below its normal range: a result summed
  /// from n terms of a few products each, n = G·Sq + Sk + D + Dv (the longest
  /// chains: over the rows of a kv head for dk and dv, over keys for out and
  /// dq, over d for the dot products), is off by up to 4n half-steps of
  /// 2^−149 (Higham's model with underflow: fl(x·y) = x·y·(1 + δ) + η with
  /// |η| <= 2^−150; sums of subnormals are exact), however small M and N.
  double underflow = 0;
};
AttentionScales scales(const AttentionData& d);

/// The attention tolerance of the table above; `nat` is N, plus sc.underflow.
std::string attention_close(const std::string& what, std::span<const double> got,
                            std::span<const double> exp, double nat, const AttentionScales& sc);
std::string attention_close(const std::string& what, const std::vector<float>& got,
                            const std::vector<double>& exp, double nat, const AttentionScales& sc);
/// Two float results of one backend that must agree (same tolerance, exp = b).
std::string attention_same(const std::string& what, const std::vector<float>& a,
                           const std::vector<float>& b, double nat, const AttentionScales& sc);

/// The gradients of one backend against ground truth / another run, with
/// names prefixed by `tag`: dq, dk, dv, dsinks and dbias, each where `got` has it.
std::string grads_close(const std::string& tag, const Grads& got, const GradsD& exp,
                        const AttentionScales& sc);
std::string grads_same(const std::string& tag, const Grads& a, const Grads& b,
                       const AttentionScales& sc);

std::string rope_close(const std::string& what, const std::vector<float>& got,
                       const std::vector<double>& exp, double xmax);
std::string swiglu_close(const std::string& what, const std::vector<float>& got,
                         const std::vector<double>& exp);
std::string block_close(const std::string& what, const std::vector<float>& got,
                        const std::vector<double>& exp);

/// <grad, u> of the backend and of reference<double> against the complex-step
/// directional derivative d/dt <dO, O(x + t·u)> of reference<complex<double>>,
/// for u on q, k, v and (with sinks) the sinks in turn. Empty when all agree.
std::string complex_step_mismatch(const Backend& be, const AttentionCase& c);

/// SPEC §2 visibility of key j to query (b, h, i), for properties that reason about masks.
bool visible(const AttentionPlan& p, std::span<const float> mask, i64 b, i64 h, i64 i, i64 j);

GradsD to_double(const Grads& g);

}  // namespace tandem::props
