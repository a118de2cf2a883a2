// SPDX-License-Identifier: Apache-2.0
/// @file cases.hpp
/// @brief The generated cases of every op (shapes and options drawn by
///        RapidCheck, data drawn from a seed), how to run them on a backend
///        and on the reference at any scalar type, and their tolerances.
#pragma once

#include <complex>
#include <optional>
#include <ostream>
#include <span>
#include <utility>
#include <vector>

#include "support.hpp"

namespace tandem::props {

// ================================================================ attention

/// An attention case: the plan's parameters and how its data is drawn.
struct AttentionCase {
  AttentionParams params;
  std::uint64_t seed = 0;
  double qk_mag = 1.0;       ///< q and k uniform in [−qk_mag, qk_mag]
  bool masked_rows = false;  ///< key_padding/bias: force fully masked query rows
  double hide = 0.3;         ///< key_padding/bias: fraction of hidden keys
};
std::ostream& operator<<(std::ostream& os, const AttentionCase& c);

/// What the generator may draw.
struct AttentionGen {
  std::optional<MaskKind> mask;  ///< fixed mask kind
  std::optional<Layout> layout;  ///< fixed layout
  bool strides = true;           ///< padded bshd row strides
  bool softcap = true;           ///< softcap > 0 sometimes
  int max_dim = 33;

  AttentionGen with_mask(MaskKind m) const {
    AttentionGen g = *this;
    g.mask = m;
    return g;
  }
  AttentionGen with_layout(Layout l) const {
    AttentionGen g = *this;
    g.layout = l;
    return g;
  }
  AttentionGen no_strides() const {
    AttentionGen g = *this;
    g.strides = false;
    return g;
  }
  AttentionGen no_softcap() const {
    AttentionGen g = *this;
    g.softcap = false;
    return g;
  }
  AttentionGen with_max_dim(int d) const {
    AttentionGen g = *this;
    g.max_dim = d;
    return g;
  }
};
rc::Gen<AttentionCase> gen_attention(AttentionGen g = {});

/// Logical tensors of an attention case (bshd order): q [B,Sq,H,D],
/// k [B,Sk,Hkv,D], v [B,Sk,Hkv,Dv], dout [B,Sq,H,Dv]; mask as the plan takes it.
struct AttentionData {
  AttentionPlan plan;
  std::vector<float> q, k, v, dout, mask;
};
AttentionData make_data(const AttentionCase& c);
/// The same data under another plan of the same logical shapes.
AttentionData with_plan(const AttentionData& d, const AttentionParams& p);

/// A bound on |logit|: |scale|·max‖q_i‖·max‖k_j‖ (≤ softcap when capped)
/// plus max |finite bias|.
double logit_bound(const AttentionData& d);

/// Logical out [B,Sq,H,Dv] of a backend (guarded output; junk in every gap).
std::vector<float> run_forward(const Backend& be, const AttentionData& d);
struct Grads {
  std::vector<float> dq, dk, dv;  ///< logical, shapes of q, k, v
};
/// One-call backward.
Grads run_backward(const Backend& be, const AttentionData& d);
/// dq, dk, dv from the three separate entry points.
Grads run_backward_separate(const Backend& be, const AttentionData& d);

/// What a backend's attention_forward_lse saved: out as the backend wrote it
/// (contiguous, plan.o) and lse `[B,H,Sq]` (guarded outputs).
struct Saved {
  std::vector<float> out, lse;
};
Saved run_forward_lse(const Backend& be, const AttentionData& d);
/// The backend's attention_backward_saved from `saved`.
Grads run_backward_saved(const Backend& be, const AttentionData& d, const Saved& saved);
/// The log-sum-exp `[B,H,Sq]` of reference<double>.
std::vector<double> reference_lse(const AttentionData& d);

/// The reference at scalar T (double: ground truth; complex: complex step),
/// accumulator Acc; q, k, v may be perturbed by `t·u` (complex step).
template <class T, class Acc>
std::vector<T> reference_forward(const AttentionData& d, std::span<const T> q, std::span<const T> k,
                                 std::span<const T> v);
std::vector<double> reference_forward(const AttentionData& d);
struct GradsD {
  std::vector<double> dq, dk, dv;
};
GradsD reference_backward(const AttentionData& d);
/// reference<float, float>: pure single precision.
std::vector<float> reference_forward_ff(const AttentionData& d);
Grads reference_backward_ff(const AttentionData& d);

// ===================================================================== rope

struct RopeCase {
  RopeParams params;
  std::uint64_t seed = 0;
  bool true_tables =
      false;  ///< cos/sin of real angles (pos·θ^(−2i/n_rot)), token rows repeat positions
  bool int32_positions = false;  ///< position ids held as int32 (else int64)
};
std::ostream& operator<<(std::ostream& os, const RopeCase& c);
struct RopeGen {
  bool strides = true;
  std::optional<TableRows> rows;
  bool position_ids = true;  ///< rows may be position ids (when not fixed)
  std::optional<bool> true_tables;
  std::optional<RopeStyle> style;
  std::optional<RopeLayout> layout;
  bool full_rot = false;  ///< n_rot = D

  RopeGen no_strides() const {
    RopeGen g = *this;
    g.strides = false;
    return g;
  }
  RopeGen with_rows(TableRows r) const {
    RopeGen g = *this;
    g.rows = r;
    return g;
  }
  RopeGen no_position_ids() const {
    RopeGen g = *this;
    g.position_ids = false;
    return g;
  }
  RopeGen with_true_tables() const {
    RopeGen g = *this;
    g.true_tables = true;
    return g;
  }
  RopeGen with_style(RopeStyle s) const {
    RopeGen g = *this;
    g.style = s;
    return g;
  }
  RopeGen with_layout(RopeLayout l) const {
    RopeGen g = *this;
    g.layout = l;
    return g;
  }
};
rc::Gen<RopeCase> gen_rope(RopeGen g = {});

/// Position ids as a test holds them: int64 values, viewed as int32 or int64 memory.
struct PositionIds {
  std::vector<std::int64_t> values;
  std::vector<std::int32_t> values32;  ///< the same values, when held as int32
  bool int32 = false;
  static PositionIds of(std::vector<std::int64_t> v, bool int32);
  Indices view() const;
};

struct RopeData {
  RopeParams params;  ///< the plan's parameters, to derive related plans from
  RopePlan plan;
  std::vector<float> x;         ///< logical [B, S, H, D] (bshd order, whatever the layout)
  std::vector<float> cos, sin;  ///< [R, T]; padding columns hold finite filler
  PositionIds positions;        ///< [B·S] in [0, R) for position_ids rows, else empty
  std::vector<float> dy;        ///< logical [B, S, H, D]
  RopeTables<float> tables() const { return {cos, sin, positions.view()}; }
};
RopeData make_data(const RopeCase& c);
/// Source memory of a plan: the logical [B, S, H, D] placed by plan.src, junk in the gaps.
std::vector<float> rope_source(const RopePlan& p, std::span<const float> logical);
/// The backend's forward (or backward) of logical x, read back as logical [B, S, H, D].
std::vector<float> run_rope(const Backend& be, const RopePlan& p, std::span<const float> x,
                            const RopeTables<float>& t, bool backward);
template <class T, class Acc>
std::vector<T> reference_rope(const RopePlan& p, std::span<const float> x,
                              const RopeTables<float>& t, bool backward);

/// q and k in one call: q is a RopeCase, k has k_heads heads and its own row padding.
struct RopeQkCase {
  RopeCase q;
  i64 k_heads = 1;
  i64 k_pad = 0;  ///< k's row stride beyond its width (bshd, thd)
};
std::ostream& operator<<(std::ostream& os, const RopeQkCase& c);
rc::Gen<RopeQkCase> gen_rope_qk();
struct RopeQkData {
  RopeQkPlan plan;
  RopeData q;                ///< q's data (x = q, dy = dq_out) and the shared tables
  std::vector<float> k, dk;  ///< logical k and dk_out [B, S, Hkv, D]
};
RopeQkData make_data(const RopeQkCase& c);
/// The backend's q-and-k forward (or backward): logical outputs of q and of k.
std::pair<std::vector<float>, std::vector<float>> run_rope_qk(const Backend& be,
                                                              const RopeQkData& d, bool backward);

struct AxialCase {
  AxialRopeParams params;
  std::uint64_t seed = 0;
};
std::ostream& operator<<(std::ostream& os, const AxialCase& c);
rc::Gen<AxialCase> gen_axial(bool strides = true);
struct AxialData {
  AxialRopePlan plan;
  std::vector<float> x, dy;  ///< logical [B', S, W]
};
AxialData make_data(const AxialCase& c);
std::vector<float> axial_source(const AxialRopePlan& p, std::span<const float> logical);
std::vector<float> run_axial(const Backend& be, const AxialRopePlan& p, std::span<const float> x,
                             bool backward);
template <class T, class Acc>
std::vector<T> reference_axial(const AxialRopePlan& p, std::span<const float> x, bool backward);

// =================================================================== swiglu

struct SwigluCase {
  SwigluParams params;
  std::uint64_t seed = 0;
  double mag = 4.0;
};
std::ostream& operator<<(std::ostream& os, const SwigluCase& c);
rc::Gen<SwigluCase> gen_swiglu();
struct SwigluData {
  SwigluPlan plan;
  std::vector<float> x, dy;
};
SwigluData make_data(const SwigluCase& c);
std::vector<float> run_swiglu(const Backend& be, const SwigluData& d, bool backward);
template <class T, class Acc>
std::vector<T> reference_swiglu(const SwigluPlan& p, std::span<const T> x, std::span<const T> dy,
                                bool backward);

// ========================================================== attention block

struct BlockCase {
  AttentionBlockParams params;
  std::uint64_t seed = 0;
};
std::ostream& operator<<(std::ostream& os, const BlockCase& c);
rc::Gen<BlockCase> gen_block();
struct BlockData {
  AttentionBlockPlan plan;
  std::vector<float> x, w_qkv, b_qkv, w_out, b_out, keep, cos, sin;
  AttentionBlockInputs inputs() const;
};
BlockData make_data(const BlockCase& c);
std::vector<float> run_block(const Backend& be, const BlockData& d);
/// The block composed of reference<double> ops (projections in double).
std::vector<double> reference_block(const BlockData& d);

}  // namespace tandem::props
