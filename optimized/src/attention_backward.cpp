// SPDX-License-Identifier: Apache-2.0
// The optimized attention backward: FlashAttention-2 on the CPU, Highway SIMD
// (dynamic dispatch) and OpenMP over (sequence, kv head) tasks.
//
// Must agree with tandem::reference::attention_backward (and its _dq, _dk,
// _dv forms) in reference/include/tandem/reference/attention.hpp to float
// rounding. The order of operations differs on purpose:
//  - P is recomputed tile by tile from the log-sum-exp of the forward
//    (p = exp(s − lse)), which this file forms itself with the same online
//    softmax as attention_forward.cpp, instead of one softmax over all keys;
//    memory stays O(Sk·(D + Dv)) per thread for the dK/dV accumulators plus
//    O(tile), never [Sq, Sk];
//  - rowsum(dO ∘ O) is taken from that recomputed O;
//  - given the forward's saved out and lse (attention_backward_saved), the
//    forward run over each query block is skipped: P comes from the saved
//    lse and rowsum(dO ∘ O) from the saved out (five matrix products per
//    tile instead of seven);
//  - every product is a float fused multiply-add chain in the micro-kernel's
//    order where the reference sums in double; p = 2^(x − lse·log2 e) in
//    base 2 as in the forward (attn::SoftmaxExp2, ~2e-7 relative), tanh and
//    log2 are Highway's.
// Determinism: one task owns one (sequence, kv head) and everything it writes
// (dQ rows of its G query heads, dK and dV rows of its kv head); inside it the
// query blocks and key blocks run in a fixed order, so dK/dV (summed over all
// query rows of the group, GQA included) and dQ (summed over key blocks) are
// the same for any thread count and any schedule. With few (sequence, kv head)
// pairs the query blocks of each are split into parts (a number fixed by the
// shape and the geometry, see QueryParts), each summing its own dK/dV
// partial, added in part order at the end. No atomics.
// dbias (SPEC §3) is dS before the softcap factor and the scale, written by
// the tile that forms it: straight into dbias when the bias has one row per
// (batch, head), else into a [B, H, Sq, Sk] scratch that BiasGradientSum
// then sums over the broadcast axes in (batch, head) order. A call that does
// not ask for dbias runs none of it.
// Storage types (SPEC §10.2): the code is written once over the gradients'
// type T (float, bfloat16, float16). A bf16 or f16 call's q, k, v, sinks,
// dout and saved out are widened to float32 once at entry (WideViews, exact),
// everything runs in float32 as for float, and each gradient is rounded once
// at its store (attention_backward_storage-inl.h). With the pytorch profile
// P is rounded to T after dS has taken it and before dV, and dX (dS after the
// softcap's factor, without the scale, which dq and dk take at their store)
// before dQ and dK; without the saved state the forward runs first
// (ForwardRun) and its stored out and lse are the saved state. Agrees with reference::kernels<T>()
// within SPEC §10.5's bounds.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_backward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "attention_backward_storage-inl.h"
#include "attention_forward_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using attn::Call;
using attn::Tile;

/// What the gradients of one call need besides the Call: dout, the
/// gradients asked for (of storage type T; the inputs are float32, widened
/// at entry), the forward's saved state (or null), where dS rows go for
/// dbias (see BiasRow) and where the call rounds (SPEC §10.2).
template <class T>
struct Backward {
  const Call& c;
  const float* dout;
  const AttentionGrads<T>& grads;
  const AttentionSaved<float>* saved;
  T* dbias_rows;      ///< dS `[B, H, Sq, Sk]` straight into grads.dbias, else null
  float* ds_scratch;  ///< dS `[B, H, Sq, Sk]` to sum over the broadcast axes, else null
  bool want_dq, want_dk, want_dv, want_dsinks, want_dbias;
  bool need_ds;    ///< dS, for dQ, dK or dbias
  bool need_dsum;  ///< rowsum(dO ∘ O), for dS or dsinks
  bool need_keys;  ///< a pass over the key blocks, for dQ, dK, dV or dbias
  /// RN_T(p) before dV and RN_T(dx) before dQ and dK (a low-precision T and
  /// plan.rounding.operands); dS is then rounded before the scale, which dq
  /// and dk take at their store (grad_scale), else it is folded into dS.
  bool round_operands;
  float grad_scale;  ///< scale when round_operands, else 1
  Backward(const Call& call, const float* dout_, const AttentionGrads<T>& g,
           const AttentionSaved<float>* saved_, T* dbias_rows_, float* ds_scratch_)
      : c(call),
        dout(dout_),
        grads(g),
        saved(saved_),
        dbias_rows(dbias_rows_),
        ds_scratch(ds_scratch_),
        want_dq(!g.dq.empty()),
        want_dk(!g.dk.empty()),
        want_dv(!g.dv.empty()),
        want_dsinks(!g.dsinks.empty()),
        want_dbias(!g.dbias.empty()),
        need_ds(want_dq || want_dk || want_dbias),
        need_dsum(need_ds || want_dsinks),
        need_keys(want_dq || want_dk || want_dv || want_dbias),
        round_operands(is_low_precision_v<T> && call.plan->rounding.operands),
        grad_scale(round_operands ? call.scale : 1.0f) {}
};

/// Per-thread scratch of the backward: the forward's, the tile's dO and Q in
/// both orientations, dP/dS, tanh(s/c), dQ, the rows' lse, dsum and 1/l, the
/// dK/dV accumulators of one kv head (rows of Dp / Dvp floats, the widths
/// rounded up to whole vectors), dS before the cap's factor (dbias), and the
/// tile's dq rows before their rounding (a low-precision T).
struct BackwardScratch {
  attn::ForwardScratch fwd;
  Buffer Qp, dOt, dOp, dPt, tanh_s, dQt, lse, dsum, inv, dK, dV, dBt, dQrows;
  std::int64_t Dp, Dvp;
  /// `own_sums`: dK and dV accumulate here (one part per kv head); else in
  /// the call's partial sums.
  template <class T>
  BackwardScratch(const Backward<T>& bw, bool own_sums) : fwd(bw.c, true) {
    const AttentionPlan& p = *bw.c.plan;
    const std::int64_t R = bw.c.max_rows_p, ld = bw.c.max_stride, N = Lanes();
    const std::int64_t key_block = bw.c.key_block;
    Dp = RoundUp(p.D, N);
    Dvp = RoundUp(p.Dv, N);
    if (bw.want_dk) Qp.resize(R * Dp);
    if (bw.need_dsum) dOt.resize(p.Dv * ld);
    if (bw.want_dv) dOp.resize(R * Dvp);
    if (bw.need_ds) dPt.resize(key_block * ld);
    if (bw.need_ds && p.softcap > 0) tanh_s.resize(key_block * ld);
    if (bw.want_dq) dQt.resize(p.D * ld);
    lse.resize(R);
    dsum.resize(R);
    inv.resize(R);
    if (bw.want_dk && own_sums) dK.resize(bw.c.max_Sk * Dp);
    if (bw.want_dv && own_sums) dV.resize(bw.c.max_Sk * Dvp);
    if (bw.want_dbias) dBt.resize(key_block * ld);
    if (bw.want_dq && is_low_precision_v<T>) dQrows.resize(R * p.D);
  }
};

/// The backward of one tile of query rows against the key blocks it may
/// see: LoadRowStatistics, then KeyBlock for each block in key order, then
/// WriteDq. dK and dV (rows of s.Dp / s.Dvp floats) accumulate over the
/// tiles of a task.
template <class T>
class TileBackward {
 public:
  TileBackward(const Backward<T>& bw, const Tile& t, BackwardScratch& s)
      : bw_(bw),
        c_(bw.c),
        t_(t),
        s_(s),
        keys_(c_.keys(t.n, t.g)),
        values_(c_.values(t.n, t.g)),
        score_(c_, t_, s.fwd.score) {}

  /// Packs the tile's Q and dO, and forms each row's lse and
  /// dsum = rowsum(dO ∘ O): from the saved state when given, else by the
  /// forward over the tile. Clears the tile's dQ.
  void LoadRowStatistics() {
    const AttentionPlan& p = *c_.plan;
    const auto q_row = [&](std::int64_t r) { return t_.q_row(c_, r); };
    const auto do_row = [&](std::int64_t r) { return bw_.dout + t_.o_at(c_, r); };
    // Qt carries the factor of the forward's packed queries (Call::q_scale)
    attn::PackRows(t_, p.D, s_.Dp, q_row, bw_.want_dk ? s_.Qp.get() : nullptr, s_.fwd.Qt.get(),
                   c_.q_scale);
    attn::PackRows(t_, p.Dv, s_.Dvp, do_row, bw_.want_dv ? s_.dOp.get() : nullptr,
                   bw_.need_dsum ? s_.dOt.get() : nullptr);
    if (bw_.saved != nullptr) {
      SavedRowStatistics();
    } else {
      ForwardRowStatistics();
    }
    if (bw_.want_dq) std::fill(s_.dQt.get(), s_.dQt.get() + p.D * t_.stride, 0.0f);
    rows_finite_ = RowStatisticsFinite();
  }

  /// dV, dK (the sums over the task's rows) and the tile's dQ for the keys
  /// of block kb, by the careful path where it must (see Skip in gemm-inl.h).
  /// dS is formed from P before P is rounded for dV (SPEC §10.2: ds_ij takes
  /// the float32 p_ij, dV takes RN_T(p_ij)).
  void KeyBlock(const attn::KeyBlock& kb, float* dK, float* dV) {
    const AttentionPlan& p = *c_.plan;
    const std::int64_t R = t_.stride, ks = s_.fwd.Kp->stride(), vs = s_.fwd.Vp->stride();
    // only the rows lo .. active_end−1 may see a key of this block
    const std::int64_t active = std::min(kb.hi, t_.rows) - kb.lo;
    float* Pt = s_.fwd.St.get();
    const PackedBlock packed = Pack(kb);
    const float *Kp = packed.Kp, *Vp = packed.Vp;
    const bool careful = packed.careful;
    // S <- Q K^T (transposed: St[jj][r])
    Gemm(kb.nk, kb.hi - kb.lo, p.D, Kp, ks, 1, s_.fwd.Qt.get() + kb.lo, R, Pt + kb.lo, R, false);
    Probabilities(kb, careful);
    float* dSt = s_.dPt.get();
    if (bw_.need_ds) {
      // dP <- dO V^T (transposed: dPt[jj][r])
      Gemm(kb.nk, kb.hi - kb.lo, p.Dv, Vp, vs, 1, s_.dOt.get() + kb.lo, R, dSt + kb.lo, R, false);
      ScoreGradient(kb, careful);
      if (bw_.want_dbias) WriteBiasRows(kb);
    }
    // dV <- dV + P^T dO  (careful: the products P marks hidden left out;
    // rounding keeps a mark −0.0)
    if (bw_.want_dv) {
      if (bw_.round_operands) RoundProbabilities(kb);
      GemmCareful<Skip::by_a>(careful, kb.nk, s_.Dvp, active, Pt + kb.lo, R, 1,
                              s_.dOp.get() + kb.lo * s_.Dvp, s_.Dvp, dV + kb.j0 * s_.Dvp, s_.Dvp,
                              true, Pt + kb.lo);
    }
    if (!bw_.need_ds) return;
    // dK <- dK + scale * dS^T Q  (careful: dS is A, P's marks say which
    // products to leave out)
    if (bw_.want_dk) {
      GemmCareful<Skip::by_a>(careful, kb.nk, s_.Dp, active, dSt + kb.lo, R, 1,
                              s_.Qp.get() + kb.lo * s_.Dp, s_.Dp, dK + kb.j0 * s_.Dp, s_.Dp, true,
                              Pt + kb.lo);
    }
    // dQ <- dQ + scale * dS K (transposed: dQt[d][r])
    if (bw_.want_dq) {  // dS is B here, P's marks laid out alike
      GemmCareful<Skip::by_b>(careful, p.D, kb.hi - kb.lo, kb.nk, Kp, 1, ks, dSt + kb.lo, R,
                              s_.dQt.get() + kb.lo, R, true, Pt + kb.lo);
    }
  }

  /// dsink_h += −p_sink,i · dsum_i, p_sink,i = exp(sink_h − lse_i), for the
  /// tile's rows in order, into dsink[h − g·G] (in double):
  ///   forward: l_i = exp(sink_h − m_i) + Σ_j exp(s_ij − m_i), the sink has no value
  void SinkGradient(double* dsink) const {
    for (std::int64_t r = 0; r < t_.rows; ++r) {
      const double lse = s_.lse.get()[r], sink = c_.sinks[t_.head(r)];
      dsink[r % t_.G] -= std::exp(sink - lse) * static_cast<double>(s_.dsum.get()[r]);
    }
  }

  /// dS = 0 of the tile's rows for the keys outside [j_begin, j_end), which
  /// no key block visits (none for a bias mask: it hides no block
  /// wholesale; kept so that every dS row is whole whatever the mask).
  void ClearBiasRowsOutside() const {
    if (!bw_.want_dbias) return;
    const auto clear = [&](auto* row) {
      using U = std::remove_pointer_t<decltype(row)>;
      std::fill(row, row + t_.j_begin, U{});
      std::fill(row + t_.j_end, row + t_.Sk, U{});
    };
    for (std::int64_t r = 0; r < t_.rows; ++r) {
      if (bw_.dbias_rows != nullptr) clear(BiasRow(bw_.dbias_rows, r));
      if (bw_.ds_scratch != nullptr) clear(BiasRow(bw_.ds_scratch, r));
    }
  }

  /// dq of the tile's rows, in the layout of q: RN_T(grad_scale · the
  /// float32 sum), through the rows of dQrows for a low-precision T.
  void WriteDq() const {
    if (!bw_.want_dq) return;
    const std::int64_t D = c_.plan->D;
    const attn::OutputRows sums{s_.dQt.get(), 1, t_.stride};
    if constexpr (std::is_same_v<T, float>) {
      attn::StoreRows(sums, t_.rows, D, nullptr,
                      [&](std::int64_t r) { return bw_.grads.dq.data() + t_.dq_at(c_, r); });
    } else {
      float* rows = s_.dQrows.get();
      attn::StoreRows(sums, t_.rows, D, nullptr, [&](std::int64_t r) { return rows + r * D; });
      for (std::int64_t r = 0; r < t_.rows; ++r) {
        attn::StoreRow(rows + r * D, D, bw_.grad_scale, bw_.grads.dq.data() + t_.dq_at(c_, r));
      }
    }
  }

 private:
  /// The packed rows of one key block: K always, V for dS (else null), and
  /// whether the block takes the careful path.
  struct PackedBlock {
    const float* Kp;
    const float* Vp;
    bool careful;
  };
  /// Prepares the score transform for block kb and packs its K (and V)
  /// rows, zero for a padding key (PackedRows, kept across the task's tiles).
  PackedBlock Pack(const attn::KeyBlock& kb) {
    score_.SetBlock(kb.j0, kb.nk);
    const std::int64_t head = t_.kv_index(c_);
    float* Kp = s_.fwd.Kp->Get(keys_, head, kb.j0, kb.nk);
    score_.ZeroHiddenRows(Kp, s_.fwd.Kp->stride(), kb.nk);
    float* Vp = nullptr;
    if (bw_.need_ds) {
      Vp = s_.fwd.Vp->Get(values_, head, kb.j0, kb.nk);
      score_.ZeroHiddenRows(Vp, s_.fwd.Vp->stride(), kb.nk);
    }
    return {Kp, Vp, Careful(Kp, Vp, kb.nk)};
  }
  /// lse <- the saved log-sum-exp; dsum <- rowsum(dO * O) from the saved O
  /// (padding rows: lse = −inf, so their P is 0).
  void SavedRowStatistics() {
    const AttentionPlan& p = *c_.plan;
    for (std::int64_t r = 0; r < t_.rows_p; ++r) {
      const bool real = r < t_.rows;
      s_.lse.get()[r] = real ? bw_.saved->lse[static_cast<std::size_t>(t_.lse_at(c_, r))]
                             : -std::numeric_limits<float>::infinity();
      float dsum = 0.0f;
      for (std::int64_t x = 0; real && bw_.need_dsum && x < p.Dv; ++x) {
        const std::int64_t at = t_.o_at(c_, r) + x;
        dsum += bw_.dout[at] * bw_.saved->out[static_cast<std::size_t>(at)];
      }
      s_.dsum.get()[r] = dsum;
    }
  }
  /// lse <- the forward's log-sum-exp; O (unnormalized) only when dsum needs
  /// it, then dsum <- rowsum(dO * O): O = Ot·(1/l) as the forward stores it,
  /// rounded to T first for a low-precision T (SPEC §10.2: δ_i takes O_i as
  /// stored in T).
  void ForwardRowStatistics() {
    attn::ForwardTileTransposed(c_, t_, s_.fwd, bw_.need_dsum);
    attn::FinishRows(c_, t_, s_.fwd.m.get(), s_.fwd.l.get(), s_.inv.get(), s_.lse.get());
    if (!bw_.need_dsum) return;
    const DF d;
    const std::int64_t R = t_.stride;
    const float* Ot = s_.fwd.Ot.get();
    const float* dOt = s_.dOt.get();
    for (std::int64_t r0 = 0; r0 < t_.rows_p; r0 += Lanes()) {
      VF acc = hn::Zero(d);
      const VF inv = hn::LoadU(d, s_.inv.get() + r0);
      for (std::int64_t dv = 0; dv < c_.plan->Dv; ++dv) {
        const VF o = hn::LoadU(d, Ot + dv * R + r0);
        if constexpr (std::is_same_v<T, float>) {
          acc = hn::MulAdd(hn::LoadU(d, dOt + dv * R + r0), o, acc);
        } else {
          acc = hn::MulAdd(hn::LoadU(d, dOt + dv * R + r0), RoundAs<T>(d, hn::Mul(o, inv)), acc);
        }
      }
      if constexpr (std::is_same_v<T, float>) acc = hn::Mul(acc, inv);
      hn::StoreU(acc, d, s_.dsum.get() + r0);
    }
  }
  /// Whether every row has a finite lse (or −inf: no visible key), a finite
  /// dsum and finite q and dO (the rows' part of the careful test).
  bool RowStatisticsFinite() const {
    bool finite = true;
    for (std::int64_t r = 0; r < t_.rows; ++r) {
      const float x = s_.lse.get()[r];
      finite = finite && (std::isfinite(x) || x == -std::numeric_limits<float>::infinity());
      finite = finite && (!bw_.need_ds || std::isfinite(s_.dsum.get()[r]));
    }
    const AttentionPlan& p = *c_.plan;
    if (bw_.want_dk) finite = finite && RowsFinite(s_.Qp.get(), s_.Dp, p.D, t_.rows);
    if (bw_.want_dv) {
      finite = finite && RowsFinite(s_.dOp.get(), s_.Dvp, p.Dv, t_.rows);
    }
    return finite;
  }
  /// Whether the current block takes the careful path: a key of it may be
  /// hidden from some rows, and the rows, or the packed K (for dQ) or V
  /// rows, are not all finite.
  bool Careful(const float* Kp, const float* Vp, std::int64_t nk) const {
    const AttentionPlan& p = *c_.plan;
    if (!score_.hides_per_row() && !score_.any_hidden()) return false;
    return !(rows_finite_ && (!bw_.want_dq || RowsFinite(Kp, s_.fwd.Kp->stride(), p.D, nk)) &&
             (!bw_.need_ds || RowsFinite(Vp, s_.fwd.Vp->stride(), p.Dv, nk)));
  }
  /// P <- exp(S − lse) = 2^(x − lse·log2 e) in place (St of the block, x
  /// the scores in log2 units, see ScoreTransform); a row with no visible
  /// key (lse = −inf) gets 2^(x − inf) = 0 for every key instead of
  /// 2^(−inf − (−inf)). tanh(s/c) is kept for dS. Careful: the hidden
  /// entries marked −0.0.
  void Probabilities(const attn::KeyBlock& kb, bool careful) {
    const DF d;
    const std::int64_t R = t_.stride;
    float* Pt = s_.fwd.St.get();
    float* tanh_s = c_.softcap > 0.0f && bw_.need_ds ? s_.tanh_s.get() : nullptr;
    for (std::int64_t r0 = kb.lo; r0 < kb.hi; r0 += Lanes()) {
      const VF lse = hn::LoadU(d, s_.lse.get() + r0);
      const VF lse2 = hn::Mul(hn::IfThenElse(hn::Eq(lse, hn::Set(d, -kInf)), hn::Set(d, kInf), lse),
                              hn::Set(d, attn::kLog2e));
      if (score_.plain_at(r0)) {  // the raw products are the scores
        for (std::int64_t jj = 0; jj < kb.nk; ++jj) {
          const VF x = hn::LoadU(d, Pt + jj * R + r0);
          hn::StoreU(attn::SoftmaxExp2(d, hn::Sub(x, lse2)), d, Pt + jj * R + r0);
        }
      } else {
        for (std::int64_t jj = 0; jj < kb.nk; ++jj) {
          const VF x = score_(hn::LoadU(d, Pt + jj * R + r0), jj, r0, tanh_s);
          hn::StoreU(attn::SoftmaxExp2(d, hn::Sub(x, lse2)), d, Pt + jj * R + r0);
        }
        if (careful) score_.MarkHidden(Pt, kb.nk, r0);
      }
    }
  }
  /// dS <- P * (dP - dsum) * (1 - tanh^2) * scale in place of dP (the
  /// softcap factor only when softcap > 0; scale folded in here for dQ and
  /// dK), and P * (dP - dsum) alone into dBt for dbias; careful: dS = 0
  /// exactly where the key is hidden (dP and tanh may be NaN there). When
  /// the operands are rounded, dS <- RN_T(P * (dP - dsum) * (1 - tanh^2))
  /// instead and the scale is left to dq's and dk's store (SPEC §10.2).
  void ScoreGradient(const attn::KeyBlock& kb, bool careful) {
    const DF d;
    const std::int64_t R = t_.stride;
    const float* Pt = s_.fwd.St.get();
    float* dSt = s_.dPt.get();
    float* dBt = bw_.want_dbias ? s_.dBt.get() : nullptr;
    const float* tanh_s = c_.softcap > 0.0f ? s_.tanh_s.get() : nullptr;
    const VF scale = hn::Set(d, c_.scale);
    const bool round = bw_.round_operands;
    for (std::int64_t r0 = kb.lo; r0 < kb.hi; r0 += Lanes()) {
      const VF dsum = hn::LoadU(d, s_.dsum.get() + r0);
      for (std::int64_t jj = 0; jj < kb.nk; ++jj) {
        const std::int64_t at = jj * R + r0;
        VF ds = hn::Mul(hn::LoadU(d, Pt + at), hn::Sub(hn::LoadU(d, dSt + at), dsum));
        if (dBt != nullptr) hn::StoreU(ds, d, dBt + at);
        if (tanh_s != nullptr) {
          const VF th = hn::LoadU(d, tanh_s + at);
          ds = hn::Mul(ds, hn::NegMulAdd(th, th, hn::Set(d, 1.0f)));
        }
        hn::StoreU(round ? RoundAs<T>(d, ds) : hn::Mul(ds, scale), d, dSt + at);
      }
      for (std::int64_t jj = 0; careful && jj < kb.nk; ++jj) {
        const std::int64_t at = jj * R + r0;
        const auto seen = NotHiddenMark(d, hn::LoadU(d, Pt + at));
        hn::StoreU(hn::IfThenElseZero(seen, hn::LoadU(d, dSt + at)), d, dSt + at);
        if (dBt != nullptr)
          hn::StoreU(hn::IfThenElseZero(seen, hn::LoadU(d, dBt + at)), d, dBt + at);
      }
    }
  }
  /// P <- RN_T(P) in place for the block's columns (the operand of dV;
  /// hidden marks −0.0 stay −0.0, every other p_ij >= 0 stays >= +0).
  void RoundProbabilities(const attn::KeyBlock& kb) {
    const DF d;
    const std::int64_t R = t_.stride;
    float* Pt = s_.fwd.St.get();
    for (std::int64_t jj = 0; jj < kb.nk; ++jj) {
      for (std::int64_t r0 = kb.lo; r0 < kb.hi; r0 += Lanes()) {
        float* at = Pt + jj * R + r0;
        hn::StoreU(RoundAs<T>(d, hn::LoadU(d, at)), d, at);
      }
    }
  }
  /// Row (b, h, i) of dS rows `[B, H, Sq, Sk]` (dbias itself, or the
  /// scratch) for the tile's row r.
  template <class U>
  U* BiasRow(U* rows, std::int64_t r) const {
    const AttentionPlan& p = *c_.plan;
    return rows + ((t_.b * p.H + t_.head(r)) * p.Sq + t_.query(r)) * p.Sk;
  }
  /// The block's dS (before the cap's factor and the scale, dBt) into the
  /// dS rows of the tile's real rows: RN_T into dbias itself, float32 into
  /// the scratch (rounded once after its sum, BiasGradientSum):
  ///   forward: s_ij = s_ij + bias_ij, so dbias_ij = ds_ij (reference pass 7)
  void WriteBiasRows(const attn::KeyBlock& kb) const {
    const std::int64_t R = t_.stride;
    const float* dBt = s_.dBt.get();
    for (std::int64_t r = kb.lo; r < std::min(kb.hi, t_.rows); ++r) {
      if (bw_.dbias_rows != nullptr) {
        attn::StoreColumn(dBt + r, R, kb.nk, BiasRow(bw_.dbias_rows, r) + kb.j0);
      } else {
        attn::StoreColumn(dBt + r, R, kb.nk, BiasRow(bw_.ds_scratch, r) + kb.j0);
      }
    }
  }

  static constexpr float kInf = std::numeric_limits<float>::infinity();
  const Backward<T>& bw_;
  const Call& c_;
  const Tile t_;
  BackwardScratch& s_;
  attn::KeyRows keys_, values_;
  attn::ScoreTransform score_;
  bool rows_finite_ = true;
};

/// Query-block parts of one (sequence, kv head) (see Geometry): part k
/// takes query blocks k, k + parts, ... (interleaved, so causal parts weigh
/// alike). 1 when there are backward_min_tasks (sequence, kv head) tasks or
/// more, else enough parts for backward_min_tasks tasks (at most one per
/// query block of the longest sequence) whose dK/dV partials stay within
/// kPartialBytes; or backward_query_parts when set. Each part sums its own
/// dK/dV partial over its query rows and the partials are added in part
/// order afterwards; the count depends on the shape, the sequences' lengths
/// and the geometry alone, never on the thread count. An invariant call
/// (SPEC §12) takes one part: the count depends on the other sequences of
/// the call, and with one part dK and dV are chains over a sequence's query
/// rows in order whatever its tiles.
constexpr std::int64_t kPartialBytes = std::int64_t{64} << 20;
std::int64_t QueryParts(const Call& c) {
  const AttentionPlan& p = *c.plan;
  const Geometry& geo = *c.geometry;
  if (c.invariant) return 1;
  std::int64_t max_qblocks = 1;
  for (std::int64_t n = 0; n < c.sequences(); ++n)
    max_qblocks = std::max(max_qblocks, c.qblocks(n));
  if (geo.backward_query_parts > 0) return std::min(geo.backward_query_parts, max_qblocks);
  const std::int64_t heads = c.sequences() * p.Hkv, min_tasks = geo.backward_min_tasks;
  if (heads >= min_tasks) return 1;
  std::int64_t parts = std::min((min_tasks + heads - 1) / heads, max_qblocks);
  const std::int64_t part_bytes =
      static_cast<std::int64_t>(sizeof(float)) * p.Hkv * c.first_key.back() * (p.D + p.Dv);
  while (parts > 1 && parts * part_bytes > kPartialBytes) --parts;
  return std::max<std::int64_t>(parts, 1);
}

/// The dK/dV partials of a call with several query parts: per (sequence n,
/// kv head g, part) the rows of n's key slot, `width` floats each
/// (slot(n) rows; only the first Sk_n are summed into).
class PartialSums {
 public:
  PartialSums(const Call& c, std::int64_t parts, std::int64_t width, bool wanted)
      : c_(c), parts_(parts), width_(width) {
    if (wanted) data_.resize(c.plan->Hkv * c.first_key.back() * parts * width);
  }
  float* at(std::int64_t n, std::int64_t g, std::int64_t part) const {
    const std::int64_t slot = c_.slot(n);
    return data_.get() +
           ((c_.first_key[n] * c_.plan->Hkv + g * slot) * parts_ + part * slot) * width_;
  }
  /// RN_T(factor · Σ_part partial row j of (n, g)), the sum in part order,
  /// into dst (width elements), a vector of them at a time.
  template <class T>
  void Sum(std::int64_t n, std::int64_t g, std::int64_t j, std::int64_t width, float factor,
           T* dst) const {
    const std::int64_t slot = c_.slot(n), N = Lanes();
    const float* first = at(n, g, 0) + j * width_;
    HWY_ALIGN float sums[kMaxFloatLanes];
    for (std::int64_t x0 = 0; x0 < width; x0 += N) {
      const std::int64_t m = std::min(N, width - x0);
      for (std::int64_t x = x0; x < x0 + m; ++x) {
        float sum = first[x];
        for (std::int64_t k = 1; k < parts_; ++k) sum += first[k * slot * width_ + x];
        sums[x - x0] = sum;
      }
      attn::StoreRow(sums, m, factor, dst + x0);
    }
  }

 private:
  const Call& c_;
  std::int64_t parts_, width_;
  Buffer data_;
};

/// The backward of one (sequence n, kv head g) over the query blocks of
/// part `part` of `parts` (qb = part, part + parts, ...): each against every
/// key block it may see. dK and dV (Sk_n rows of s.Dp / s.Dvp floats)
/// accumulate the part's sums; with one part they are written to the
/// gradients at the end, with dk = dv = 0 for the padding keys of the slot.
/// dsink (G doubles) sums the sinks' gradient over the part's rows.
template <class T>
void BackwardTask(const Backward<T>& bw, std::int64_t n, std::int64_t g, std::int64_t part,
                  std::int64_t parts, BackwardScratch& s, float* dK, float* dV, double* dsink) {
  const Call& c = bw.c;
  const std::int64_t Sk = c.seqs[n].Sk;
  if (bw.want_dk) std::fill(dK, dK + Sk * s.Dp, 0.0f);
  if (bw.want_dv) std::fill(dV, dV + Sk * s.Dvp, 0.0f);
  for (std::int64_t qb = part; qb < c.qblocks(n); qb += parts) {
    const Tile t(c, n, g, qb);
    TileBackward<T> tile(bw, t, s);
    tile.LoadRowStatistics();
    if (bw.want_dsinks) tile.SinkGradient(dsink);
    if (!bw.need_keys) continue;
    tile.ClearBiasRowsOutside();
    attn::ForEachKeyBlock(c, t, t.j_begin, t.j_end,
                          [&](const attn::KeyBlock& kb) { tile.KeyBlock(kb, dK, dV); });
    tile.WriteDq();
  }
  const AttentionPlan& p = *c.plan;
  for (std::int64_t j = 0; parts == 1 && j < c.slot(n); ++j) {
    T* dk = bw.want_dk ? bw.grads.dk.data() + c.dk_at(n, j, g) : nullptr;
    T* dv = bw.want_dv ? bw.grads.dv.data() + c.dv_at(n, j, g) : nullptr;
    if (dk != nullptr && j < Sk) attn::StoreRow(dK + j * s.Dp, p.D, bw.grad_scale, dk);
    if (dv != nullptr && j < Sk) attn::StoreRow(dV + j * s.Dvp, p.Dv, 1.0f, dv);
    if (dk != nullptr && j >= Sk) std::fill_n(dk, p.D, T{});
    if (dv != nullptr && j >= Sk) std::fill_n(dv, p.Dv, T{});
  }
}

/// What the tasks of a call write besides the gradients, allocated before
/// any output is written (an allocation failure is an exception here, not
/// inside the parallel region): each thread's scratch, the query parts'
/// dK/dV partials (with several parts) and each task's G dsinks partials.
struct TaskBuffers {
  std::vector<std::unique_ptr<BackwardScratch>> scratch;
  PartialSums part_dk, part_dv;
  std::vector<double> dsink_parts;
  template <class T>
  TaskBuffers(const Backward<T>& bw, std::int64_t parts, std::int64_t n_tasks, int threads)
      : scratch(ThreadScratch(bw, parts, threads)),
        part_dk(bw.c, parts, scratch[0]->Dp, parts > 1 && bw.want_dk),
        part_dv(bw.c, parts, scratch[0]->Dvp, parts > 1 && bw.want_dv),
        dsink_parts(bw.want_dsinks ? static_cast<std::size_t>(n_tasks * bw.c.plan->group()) : 0,
                    0.0) {}

 private:
  template <class T>
  static std::vector<std::unique_ptr<BackwardScratch>> ThreadScratch(const Backward<T>& bw,
                                                                     std::int64_t parts,
                                                                     int threads) {
    std::vector<std::unique_ptr<BackwardScratch>> scratch;
    scratch.reserve(static_cast<std::size_t>(threads));
    for (int i = 0; i < threads; ++i) {
      scratch.push_back(std::make_unique<BackwardScratch>(bw, parts == 1));
    }
    return scratch;
  }
};

/// Task `task` of a call of `parts` query parts: (sequence n, kv head g) =
/// divmod(task / parts, Hkv), part task % parts, summing dK and dV in the
/// thread's scratch s (one part) or in the part's partials.
template <class T>
void RunTask(const Backward<T>& bw, std::int64_t task, std::int64_t parts, BackwardScratch& s,
             TaskBuffers& buf) {
  const AttentionPlan& plan = *bw.c.plan;
  const std::int64_t head = task / parts, part = task % parts;
  const std::int64_t n = head / plan.Hkv, g = head % plan.Hkv;
  float* dK = parts == 1 ? s.dK.get() : buf.part_dk.at(n, g, part);
  float* dV = parts == 1 ? s.dV.get() : buf.part_dv.at(n, g, part);
  double* dsink =
      bw.want_dsinks ? &buf.dsink_parts[static_cast<std::size_t>(task * plan.group())] : nullptr;
  BackwardTask(bw, n, g, part, parts, s, dK, dV, dsink);
}

/// dk and dv row j of sequence n, kv head g, = Σ_part partial in part order
/// (0 for a padding key of the slot), rounded once (dk with grad_scale).
template <class T>
void AddParts(const Backward<T>& bw, std::int64_t n, std::int64_t g, std::int64_t j,
              const PartialSums& part_dk, const PartialSums& part_dv) {
  const AttentionPlan& plan = *bw.c.plan;
  const bool padding = j >= bw.c.seqs[n].Sk;
  if (bw.want_dk) {
    T* dst = bw.grads.dk.data() + bw.c.dk_at(n, j, g);
    if (padding) std::fill_n(dst, plan.D, T{});
    if (!padding) part_dk.Sum(n, g, j, plan.D, bw.grad_scale, dst);
  }
  if (bw.want_dv) {
    T* dst = bw.grads.dv.data() + bw.c.dv_at(n, j, g);
    if (padding) std::fill_n(dst, plan.Dv, T{});
    if (!padding) part_dv.Sum(n, g, j, plan.Dv, 1.0f, dst);
  }
}

/// Whether dbias has one row per (batch, head), so that the dS rows are
/// dbias itself; else they go to a `[B, H, Sq, Sk]` scratch.
bool BiasRowsAreDbias(const AttentionPlan& plan) {
  return plan.bias_batch == plan.B && plan.bias_heads == plan.H;
}

/// dbias `[Bb, Hb, Sq, Sk]` = the dS rows `[B, H, Sq, Sk]` summed over b
/// when Bb = 1 and over h when Hb = 1, in the order (b, h), in double:
///   dbias_{bb,hb,i,j} = Σ_{b ∈ bb's, h ∈ hb's} ds_{b,h,i,j}   (reference pass 7)
/// One output row per iteration: the same sums for any thread count; each
/// rounded once to T.
template <class T>
void BiasGradientSum(const AttentionPlan& plan, const float* ds_rows, std::span<T> dbias) {
  const std::int64_t Bb = plan.bias_batch, Hb = plan.bias_heads, Sq = plan.Sq, Sk = plan.Sk;
  const std::int64_t nb = Bb == 1 ? plan.B : 1, nh = Hb == 1 ? plan.H : 1;
#pragma omp for schedule(static)
  for (std::int64_t row = 0; row < Bb * Hb * Sq; ++row) {
    const std::int64_t bb = row / (Hb * Sq), hb = row / Sq % Hb, i = row % Sq;
    T* dst = dbias.data() + row * Sk;
    for (std::int64_t j = 0; j < Sk; ++j) {
      double sum = 0.0;
      for (std::int64_t b = bb; b < bb + nb; ++b) {
        for (std::int64_t h = hb; h < hb + nh; ++h)
          sum += ds_rows[((b * plan.H + h) * Sq + i) * Sk + j];
      }
      dst[j] = attn::RoundSum<T>(sum);
    }
  }
}

/// dsinks[h] = Σ over the tasks of h's kv head, in task order, of their
/// partial sums (task (n·Hkv + g)·parts + part holds G of them), rounded
/// once to T.
template <class T>
void WriteSinkGradient(const Backward<T>& bw, std::int64_t parts,
                       const std::vector<double>& partial) {
  const AttentionPlan& plan = *bw.c.plan;
  const std::int64_t G = plan.group();
  for (std::int64_t h = 0; h < plan.H; ++h) {
    const std::int64_t g = h / G;
    double sum = 0.0;
    for (std::int64_t n = 0; n < bw.c.sequences(); ++n) {
      for (std::int64_t part = 0; part < parts; ++part) {
        sum += partial[static_cast<std::size_t>(((n * plan.Hkv + g) * parts + part) * G + h % G)];
      }
    }
    bw.grads.dsinks[static_cast<std::size_t>(h)] = attn::RoundSum<T>(sum);
  }
}

/// dq, dk, dv, dsinks, dbias (those asked for): one OpenMP task per
/// (sequence, kv head, query part) (see QueryParts), then, with several
/// parts, the parts' dK/dV partials added in part order, a broadcast bias's
/// dS rows summed (BiasGradientSum), and the tasks' dsinks partials in task
/// order.
///
/// A task runs its query-block tiles (attn::Tile, as the forward's) in
/// order, each against its visible key blocks (TileBackward). Agrees with
/// reference::attention_backward (and its _dq, _dk, _dv and saved forms) to
/// float rounding; the order differs because P is recomputed tile by tile
/// from the log-sum-exp (the forward's, or the saved one), dK and dV are
/// summed over query blocks and dQ over key blocks in float multiply-add
/// chains, and with several parts their partials are added afterwards (see
/// the top of this file). Inputs in float32 (widened at entry for a
/// low-precision T), gradients in T, each rounded once at its store.
template <class T>
void AttentionBackwardCall(const AttentionPlan& plan, const AttentionInputs<float>& in,
                           std::span<const float> dout, const AttentionGrads<T>& grads,
                           const AttentionSaved<float>* saved, const Geometry& geometry,
                           int threads) {
  const Call c(plan, in, geometry);
  // dS rows for dbias: dbias itself, or a zeroed [B, H, Sq, Sk] scratch to sum from
  const bool sum_ds = !grads.dbias.empty() && !BiasRowsAreDbias(plan);
  Buffer ds_scratch;
  if (sum_ds) {
    ds_scratch.resize(checked_mul(
        checked_mul(checked_mul(plan.B, plan.H, "dbias"), plan.Sq, "dbias"), plan.Sk, "dbias"));
  }
  T* dbias_rows = grads.dbias.empty() || sum_ds ? nullptr : grads.dbias.data();
  const Backward<T> bw(c, dout.data(), grads, saved, dbias_rows,
                       sum_ds ? ds_scratch.get() : nullptr);
  const std::int64_t parts = QueryParts(c), heads = c.sequences() * plan.Hkv;
  const std::int64_t n_tasks = heads * parts;
  const int nt =
      static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n_tasks)));
  TaskBuffers buf(bw, parts, n_tasks, nt);
  // dk and dv rows (key row x of the B·Sk, kv head g) enumerated x·Hkv + g
  const std::int64_t n_rows = c.first_key.back() * plan.Hkv;
#pragma omp parallel num_threads(nt)
  {
    BackwardScratch& s = *buf.scratch[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < n_tasks; ++task) RunTask(bw, task, parts, s, buf);
    // dK, dV <- Σ_part partial, in part order (the barrier above: all written)
    if (parts > 1 && (bw.want_dk || bw.want_dv)) {
#pragma omp for schedule(static)
      for (std::int64_t row = 0; row < n_rows; ++row) {
        const std::int64_t x = row / plan.Hkv, n = attn::SequenceOf(c.first_key, x);
        AddParts(bw, n, row % plan.Hkv, x - c.first_key[n], buf.part_dk, buf.part_dv);
      }
    }
    if (sum_ds) BiasGradientSum(plan, ds_scratch.get(), grads.dbias);
  }
  if (bw.want_dsinks) WriteSinkGradient(bw, parts, buf.dsink_parts);
}

}  // namespace

///@{
/// The backward of one storage type (AttentionBackwardCall), and the
/// widening of its inputs: the per-target functions dispatched by name.
void AttentionBackwardF32(const AttentionPlan& plan, const AttentionInputs<float>& in,
                          std::span<const float> dout, const AttentionGrads<float>& grads,
                          const AttentionSaved<float>* saved, const Geometry& geometry,
                          int threads) {
  AttentionBackwardCall(plan, in, dout, grads, saved, geometry, threads);
}
void AttentionBackwardBf16(const AttentionPlan& plan, const AttentionInputs<float>& in,
                           std::span<const float> dout, const AttentionGrads<bfloat16>& grads,
                           const AttentionSaved<float>* saved, const Geometry& geometry,
                           int threads) {
  AttentionBackwardCall(plan, in, dout, grads, saved, geometry, threads);
}
void AttentionBackwardF16(const AttentionPlan& plan, const AttentionInputs<float>& in,
                          std::span<const float> dout, const AttentionGrads<float16>& grads,
                          const AttentionSaved<float>* saved, const Geometry& geometry,
                          int threads) {
  AttentionBackwardCall(plan, in, dout, grads, saved, geometry, threads);
}
void WidenBf16(const bfloat16* src, std::int64_t n, float* dst, int threads) {
  Widen(src, n, dst, threads);
}
void WidenF16(const float16* src, std::int64_t n, float* dst, int threads) {
  Widen(src, n, dst, threads);
}
///@}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "entry_points.hpp"

namespace tandem::optimized {
HWY_EXPORT(AttentionBackwardF32);
HWY_EXPORT(AttentionBackwardBf16);
HWY_EXPORT(AttentionBackwardF16);
HWY_EXPORT(WidenBf16);
HWY_EXPORT(WidenF16);

namespace {

/// x widened to float32 into buf (exact, SPEC §10.1), on `threads` threads;
/// empty for an empty x.
template <class T>
std::span<const float> widen_view(std::span<const T> x, Buffer& buf, int threads) {
  if (x.empty()) return {};
  const auto n = static_cast<std::int64_t>(x.size());
  buf.resize(n, Buffer::Init::uninitialized);
  if constexpr (std::is_same_v<T, bfloat16>) {
    HWY_DYNAMIC_DISPATCH(WidenBf16)(x.data(), n, buf.get(), threads);
  } else {
    HWY_DYNAMIC_DISPATCH(WidenF16)(x.data(), n, buf.get(), threads);
  }
  return {buf.get(), x.size()};
}

/// The float32 views of a validated backward call of storage type T: for
/// float the caller's views, else copies widened once (exact, SPEC §10.1) of
/// q, k, v, sinks, dout and the saved out; the mask, the slopes, the
/// offsets and the saved lse (float32 already) as given.
template <class T>
class WideViews {
 public:
  WideViews(const AttentionInputs<T>& x, std::span<const T> dout, const AttentionSaved<T>* saved,
            int threads) {
    if constexpr (std::is_same_v<T, float>) {
      in = x;
      dout_ = dout;
      if (saved != nullptr) saved_ = *saved;
    } else {
      in = retyped<float>(x, widen_view(x.q, q_, threads), widen_view(x.k, k_, threads),
                          widen_view(x.v, v_, threads), widen_view(x.sinks, sinks_, threads));
      dout_ = widen_view(dout, dout_buf_, threads);
      if (saved != nullptr) saved_ = {widen_view(saved->out, out_, threads), saved->lse};
    }
  }
  AttentionInputs<float> in;
  std::span<const float> dout() const { return dout_; }
  const AttentionSaved<float>* saved(const AttentionSaved<T>* given) const {
    return given != nullptr ? &saved_ : nullptr;
  }

 private:
  Buffer q_, k_, v_, sinks_, dout_buf_, out_;
  std::span<const float> dout_;
  AttentionSaved<float> saved_;
};

/// The per-target backward of storage type T.
template <class T>
void Dispatch(const AttentionPlan& plan, const AttentionInputs<float>& in,
              std::span<const float> dout, const AttentionGrads<T>& grads,
              const AttentionSaved<float>* saved, const Options& options) {
  const int threads = detail::threads_of(options);
  if constexpr (std::is_same_v<T, float>) {
    HWY_DYNAMIC_DISPATCH(AttentionBackwardF32)
    (plan, in, dout, grads, saved, options.geometry, threads);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    HWY_DYNAMIC_DISPATCH(AttentionBackwardBf16)
    (plan, in, dout, grads, saved, options.geometry, threads);
  } else {
    HWY_DYNAMIC_DISPATCH(AttentionBackwardF16)
    (plan, in, dout, grads, saved, options.geometry, threads);
  }
}

/// The saved state that a low-precision backward without one computes first
/// (SPEC §10.2): the forward's out as stored in T and its float lse, so that
/// δ takes O exactly as the forward stores it and both paths give the same
/// bits, as the reference's backward does. The forward runs on the
/// backward's own widened inputs (`wide`), so that they are widened once for
/// both; out is then widened for δ as a given saved out would be.
template <class T>
class ForwardRun {
 public:
  ForwardRun(const AttentionPlan& plan, const AttentionInputs<T>& in, const WideViews<T>& wide,
             const Options& options)
      : out_(static_cast<std::size_t>(plan.o.extent)),
        lse_(static_cast<std::size_t>(plan.lse_size())) {
    detail::attention_forward_lse_widened<T>(plan, in, wide.in, out_, lse_, options);
    wide_ = {widen_view(std::span<const T>(out_), wide_out_, detail::threads_of(options)), lse_};
  }
  /// The saved state as float32, for the backward on `wide`.
  const AttentionSaved<float>* wide_saved() const { return &wide_; }

 private:
  std::vector<T> out_;
  std::vector<float> lse_;
  Buffer wide_out_;
  AttentionSaved<float> wide_;
};

}  // namespace

namespace detail {

template <class T>
void attention_backward(const AttentionPlan& plan, const AttentionInputs<T>& in,
                        std::span<const T> dout, const AttentionGrads<T>& grads,
                        const AttentionSaved<T>* saved, const Options& options) {
  if constexpr (is_low_precision_v<T>) require_rounding(plan);
  check_inputs(plan, in);
  require_size(dout.size(), plan.o.extent, "dout");
  check_grads(plan, grads);
  if (saved != nullptr) check_saved(plan, *saved);
  const WideViews<T> wide(in, dout, saved, threads_of(options));
  if constexpr (is_low_precision_v<T>) {
    if (saved == nullptr) {  // the forward first, then the saved path, on the same wide inputs
      const ForwardRun<T> run(plan, in, wide, options);
      Dispatch(plan, wide.in, wide.dout(), grads, run.wide_saved(), options);
      return;
    }
  }
  Dispatch(plan, wide.in, wide.dout(), grads, wide.saved(saved), options);
}

template <class T>
void attention_backward_one(const AttentionPlan& plan, const AttentionInputs<T>& in,
                            std::span<const T> dout, Gradient which, std::span<T> grad,
                            const Options& options) {
  if constexpr (is_low_precision_v<T>) require_rounding(plan);
  check_inputs(plan, in);
  require_size(dout.size(), plan.o.extent, "dout");
  AttentionGrads<T> grads;
  switch (which) {
    case Gradient::dq:
      require_size(grad.size(), plan.dq.extent, "dq");
      grads.dq = grad;
      break;
    case Gradient::dk:
      require_size(grad.size(), plan.dk.extent, "dk");
      grads.dk = grad;
      break;
    case Gradient::dv:
      require_size(grad.size(), plan.dv.extent, "dv");
      grads.dv = grad;
      break;
  }
  const WideViews<T> wide(in, dout, nullptr, threads_of(options));
  if constexpr (is_low_precision_v<T>) {  // the forward first, as attention_backward
    const ForwardRun<T> run(plan, in, wide, options);
    Dispatch(plan, wide.in, wide.dout(), grads, run.wide_saved(), options);
  } else {
    Dispatch(plan, wide.in, wide.dout(), grads, nullptr, options);
  }
}

#define TANDEM_OPTIMIZED_BACKWARD(T)                                                       \
  template void attention_backward<T>(const AttentionPlan&, const AttentionInputs<T>&,     \
                                      std::span<const T>, const AttentionGrads<T>&,        \
                                      const AttentionSaved<T>*, const Options&);           \
  template void attention_backward_one<T>(const AttentionPlan&, const AttentionInputs<T>&, \
                                          std::span<const T>, Gradient, std::span<T>,      \
                                          const Options&);
TANDEM_OPTIMIZED_BACKWARD(float)
TANDEM_OPTIMIZED_BACKWARD(bfloat16)
TANDEM_OPTIMIZED_BACKWARD(float16)
#undef TANDEM_OPTIMIZED_BACKWARD

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
