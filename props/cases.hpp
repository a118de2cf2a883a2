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

/// Numerical extremes an attention case's data may be pushed to (dense
/// cases; the properties that draw them state what still holds).
enum class Extreme {
  none,
  huge_logits,  ///< q and k scaled so that max |s| (before softcap) = logit_target
  far_bias,  ///< bias: −inf and far negative finite entries (−1e30, −FLT_MAX, ...) beside finite
             ///< ones
  subnormal,     ///< some of q, k, v, dO scaled into the subnormal range
  equal_scores,  ///< every key row of a (batch, kv head) the same: all scores of a row equal
  equal_logits,  ///< as equal_scores, at |s| = logit_target
};
const char* to_string(Extreme e);

/// An attention case: the plan's parameters and how its data is drawn.
struct AttentionCase {
  AttentionParams params;
  std::uint64_t seed = 0;
  double qk_mag = 1.0;           ///< q and k uniform in [−qk_mag, qk_mag]
  bool masked_rows = false;      ///< key_padding/bias: force fully masked query rows
  double hide = 0.3;             ///< key_padding/bias: fraction of hidden keys
  double sink_mag = 1.0;         ///< sinks uniform in [−sink_mag, sink_mag]
  bool standard_slopes = false;  ///< ALiBi: alibi_standard_slopes (else uniform in [0, 1.5])
  ///@{
  /// Packed sequences (SPEC §2.9): per sequence its queries, its key slot and
  /// the keys it uses (empty: the whole slot, no seqused_k).
  std::vector<i64> q_lens, k_slots, k_used;
  ///@}
  std::vector<i64> cache_lens;  ///< paged (SPEC §2.10): keys of each batch entry
  bool index64 = false;         ///< index inputs held as int64 (else int32)
  Extreme extreme = Extreme::none;
  double logit_target = 1e4;  ///< huge_logits, equal_logits: max |s| before softcap
  ///@{
  /// subnormal: which of q, k, v, dO are scaled, and by how much.
  bool tiny_q = false, tiny_k = false, tiny_v = false, tiny_dout = false;
  double tiny_scale = 0x1p-130;
  ///@}
};
std::ostream& operator<<(std::ostream& os, const AttentionCase& c);

/// How often the generator draws a feature.
enum class Draw { never, sometimes, always };

/// What the generator may draw.
struct AttentionGen {
  std::optional<MaskKind> mask;  ///< fixed mask kind
  std::optional<Layout> layout;  ///< fixed layout
  bool strides = true;           ///< padded bshd row strides
  bool softcap = true;           ///< softcap > 0 sometimes
  int max_dim = 33;
  ///@{
  /// The features of SPEC §2.7–2.10. varlen and paged exclude each other (and
  /// the key_padding and bias masks); `always` for one of them wins.
  Draw sinks = Draw::never, alibi = Draw::never, varlen = Draw::never, paged = Draw::never;
  ///@}
  bool seqused_gaps = false;  ///< varlen: some sequence uses fewer keys than its slot
  /// Shapes at the edges of the optimized backend's default geometry (key
  /// blocks of 64, query tiles of 384 or 192 rows, split-key decode from
  /// 2048 keys): `sometimes` is one dense case in ten.
  Draw long_shapes = Draw::sometimes;
  /// Numerical extremes (Extreme), dense cases only: `sometimes` is one
  /// case in eight.
  Draw extremes = Draw::sometimes;

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
  /// Every feature sometimes (sinks, ALiBi; dense, varlen or paged).
  AttentionGen with_features() const {
    AttentionGen g = *this;
    g.sinks = g.alibi = g.varlen = g.paged = Draw::sometimes;
    return g;
  }
  /// Feature `f` (a member such as &AttentionGen::sinks) drawn as `d`.
  AttentionGen with(Draw AttentionGen::*f, Draw d) const {
    AttentionGen g = *this;
    g.*f = d;
    return g;
  }
};
rc::Gen<AttentionCase> gen_attention(AttentionGen g = {});

/// Logical tensors of an attention case (bshd order): q [B,Sq,H,D],
/// k [B',S',Hkv,D], v [B',S',Hkv,Dv] (B' = kv_batch(), S' = kv_seq(): the
/// cache blocks of a paged case), dout [B,Sq,H,Dv]; mask as the plan takes
/// it; sinks [H], ALiBi slopes, and the index inputs (SPEC §2.7–2.10).
struct AttentionData {
  AttentionPlan plan;
  std::vector<float> q, k, v, dout, mask;
  std::vector<float> sinks, slopes;
  ///@{
  /// cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, cache_seqlens, key_origin (empty
  /// when not taken).
  std::vector<i64> cu_q, cu_k, used, table, lens, origin;
  ///@}
  bool index64 = false;  ///< pass the index inputs as int64 (else int32)
};
AttentionData make_data(const AttentionCase& c);
/// The same data under another plan of the same logical shapes.
AttentionData with_plan(const AttentionData& d, const AttentionParams& p);

/// A bound on |logit|: |scale|·max‖q_i‖·max‖k_j‖ (≤ softcap when capped)
/// plus max |finite bias| plus the largest ALiBi penalty, and at least max |sink|.
double logit_bound(const AttentionData& d);

/// Logical out [B,Sq,H,Dv] of a backend (guarded output; junk in every gap).
std::vector<float> run_forward(const Backend& be, const AttentionData& d);
struct Grads {
  std::vector<float> dq, dk, dv;  ///< logical, shapes of q, k, v
  std::vector<float> dsinks;      ///< [H] (plans with sinks)
  std::vector<float> dbias;       ///< [Bb, Hb, Sq, Sk] (bias plans, when asked for)
};
/// Which gradients a backward call asks for (dsinks only when the plan has
/// sinks, dbias only when asked for and the plan has a bias).
struct Want {
  bool dq = true, dk = true, dv = true, dsinks = true, dbias = false;
};
/// One-call backward; a gradient not asked for comes back empty.
Grads run_backward(const Backend& be, const AttentionData& d, Want want = {});
/// dq, dk, dv from the three separate entry points.
Grads run_backward_separate(const Backend& be, const AttentionData& d);

/// What a backend's attention_forward_lse saved: out as the backend wrote it
/// (contiguous, plan.o) and lse `[B,H,Sq]` (guarded outputs).
struct Saved {
  std::vector<float> out, lse;
};
Saved run_forward_lse(const Backend& be, const AttentionData& d);
/// The backend's attention_backward_saved from `saved`.
Grads run_backward_saved(const Backend& be, const AttentionData& d, const Saved& saved,
                         Want want = {});
/// The log-sum-exp `[B,H,Sq]` of reference<double>.
std::vector<double> reference_lse(const AttentionData& d);

/// The index inputs of a case held as it asks (int32 or int64), alive as
/// long as the views attach() hands out.
class IndexStore {
 public:
  explicit IndexStore(const AttentionData& d);
  /// Sets the sinks-free feature views of `in`: ALiBi slopes and the index inputs.
  template <class T>
  void attach(AttentionInputs<T>& in) const {
    in.alibi_slopes = slopes_;
    in.cu_seqlens_q = view(0);
    in.cu_seqlens_k = view(1);
    in.seqused_k = view(2);
    in.block_table = view(3);
    in.cache_seqlens = view(4);
    in.key_origin = view(5);
  }

 private:
  [[nodiscard]] Indices view(int which) const;
  bool wide_;
  std::vector<float> slopes_;
  std::vector<std::int32_t> i32_[6];
  std::vector<std::int64_t> i64_[6];
};

/// The sequences of a case: AttentionPlan::sequence on its index inputs
/// (which this object keeps alive for the block-table views it hands out).
class Sequences {
 public:
  explicit Sequences(const AttentionData& d) : idx_(d), plan_(d.plan) { idx_.attach(in_); }
  [[nodiscard]] i64 size() const { return plan_.sequences(); }
  [[nodiscard]] AttentionSeq operator[](i64 n) const { return plan_.sequence(in_, n); }

 private:
  IndexStore idx_;
  AttentionInputs<float> in_;
  AttentionPlan plan_;
};

/// The reference at scalar T (double: ground truth; complex: complex step),
/// accumulator Acc; q, k, v, the sinks and (bias_step) the bias may be
/// perturbed by `t·u` (complex step).
template <class T, class Acc>
std::vector<T> reference_forward(const AttentionData& d, std::span<const T> q, std::span<const T> k,
                                 std::span<const T> v, std::span<const T> sinks,
                                 std::span<const T> bias_step = {});
std::vector<double> reference_forward(const AttentionData& d);
struct GradsD {
  std::vector<double> dq, dk, dv, dsinks;
  std::vector<double> dbias;  ///< [Bb, Hb, Sq, Sk] (bias plans)
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
  AttentionBlockInputs<float> inputs() const;
};
BlockData make_data(const BlockCase& c);
std::vector<float> run_block(const Backend& be, const BlockData& d);
/// The block composed of reference<double> ops (projections in double).
std::vector<double> reference_block(const BlockData& d);

}  // namespace tandem::props
