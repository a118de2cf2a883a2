// SPDX-License-Identifier: Apache-2.0
// The optimized attention backward: FlashAttention-2 on the CPU, Highway SIMD
// (dynamic dispatch) and OpenMP over (batch, kv head) tasks.
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
//    order where the reference sums in double; exp is a polynomial on 2^f
//    (attn::SoftmaxExp, ~1e-7 relative), tanh and log are Highway's.
// Determinism: one task owns one (batch, kv head) and everything it writes
// (dQ rows of its G query heads, dK and dV rows of its kv head); inside it the
// query blocks and key blocks run in a fixed order, so dK/dV (summed over all
// query rows of the group, GQA included) and dQ (summed over key blocks) are
// the same for any thread count and any schedule. With fewer than kMinTasks
// (batch, kv head) pairs the query blocks of each are split into parts (a
// number fixed by the shape, see QueryParts), each summing its own dK/dV
// partial, added in part order at the end. No atomics.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_backward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "attention_forward_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;

/// Per-thread scratch of the backward: the forward's, the tile's dO and Q in
/// both orientations, dP/dS, tanh, dQ, and the dK/dV accumulators of one kv
/// head (rows of Dp / Dvp floats, the widths rounded up to whole vectors).
struct BackwardScratch {
  attn::ForwardScratch fwd;
  Buffer Qp, dOt, dOp, dPt, T, dQt, lse, Drow, inv, dK, dV;
  std::int64_t Dp, Dvp;
  /// `own_sums`: dK and dV accumulate here (one part per kv head); else in
  /// the call's partial sums.
  BackwardScratch(const attn::Call& c, bool want_dq, bool want_dk, bool want_dv, bool own_sums)
      : fwd(c) {
    const AttentionPlan& p = *c.plan;
    const std::int64_t R = c.max_rows_p, N = Lanes();
    Dp = RoundUp(p.D, N);
    Dvp = RoundUp(p.Dv, N);
    const bool need_ds = want_dq || want_dk;
    if (want_dk) Qp.resize(R * Dp);
    if (need_ds) dOt.resize(p.Dv * R);
    if (want_dv) dOp.resize(R * Dvp);
    if (need_ds) dPt.resize(attn::kKeyBlock * R);
    if (need_ds && p.softcap > 0) T.resize(attn::kKeyBlock * R);
    if (want_dq) dQt.resize(p.D * R);
    lse.resize(R);
    Drow.resize(R);
    inv.resize(R);
    if (want_dk && own_sums) dK.resize(p.Sk * Dp);
    if (want_dv && own_sums) dV.resize(p.Sk * Dvp);
  }
};

/// Dst[r][x] = src_r[x] (x < width, zero up to wp) and/or Dt[x][r] = src_r[x]
/// for the rows of a tile; padding rows are zero.
template <class RowPtr>
void PackRows(const attn::Tile& t, std::int64_t width, std::int64_t wp, RowPtr row, float* Dst,
              float* Dt) {
  for (std::int64_t r = 0; r < t.rows_p; ++r) {
    const float* src = r < t.rows ? row(r) : nullptr;
    if (Dst != nullptr) {
      float* dst = Dst + r * wp;
      for (std::int64_t x = 0; x < wp; ++x) dst[x] = src != nullptr && x < width ? src[x] : 0.0f;
    }
    if (Dt != nullptr) {
      for (std::int64_t x = 0; x < width; ++x)
        Dt[x * t.rows_p + r] = src != nullptr ? src[x] : 0.0f;
    }
  }
}

/// Query-block parts of one (batch, kv head): 1 when there are kMinTasks
/// (batch, kv head) tasks or more, else enough parts for kMinTasks tasks
/// (at most one per query block), part k taking query blocks k, k + parts,
/// ... (interleaved, so causal parts weigh alike). Each part sums its own
/// dK/dV partial over its query rows and the partials are added in part
/// order afterwards; the count depends on the shape alone, never on the
/// thread count, and keeps the partials within kPartialBytes.
constexpr std::int64_t kMinTasks = 8;
constexpr std::int64_t kPartialBytes = std::int64_t{64} << 20;
std::int64_t QueryParts(const attn::Call& c) {
  const AttentionPlan& p = *c.plan;
  const std::int64_t heads = p.B * p.Hkv;
  if (heads >= kMinTasks) return 1;
  std::int64_t parts = std::min((kMinTasks + heads - 1) / heads, c.n_qblocks);
  const std::int64_t part_bytes = 4 * heads * p.Sk * (p.D + p.Dv);
  while (parts > 1 && parts * part_bytes > kPartialBytes) --parts;
  return std::max<std::int64_t>(parts, 1);
}

/// The backward of one (batch b, kv head g) over the query blocks of part
/// `part` of `parts` (qb = part, part + parts, ...): each against every key
/// block it may see. dK and dV (Sk rows of s.Dp / s.Dvp floats) accumulate
/// the part's sums; with one part they are written to grads at the end.
void BackwardTask(const attn::Call& c, std::int64_t b, std::int64_t g, std::int64_t part,
                  std::int64_t parts, const float* dout, const AttentionGrads<float>& grads,
                  const AttentionSaved<float>* saved, BackwardScratch& s, float* dK, float* dV) {
  const AttentionPlan& p = *c.plan;
  const DF d;
  const std::int64_t N = Lanes();
  const bool want_dq = !grads.dq.empty(), want_dk = !grads.dk.empty(), want_dv = !grads.dv.empty();
  const bool need_ds = want_dq || want_dk;
  const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  const VF pos_inf = hn::Set(d, std::numeric_limits<float>::infinity());
  const VF scale = hn::Set(d, c.scale);
  const float* k_rows = c.k + p.k.at(b, 0, g);
  const float* v_rows = c.v + p.v.at(b, 0, g);
  if (want_dk) std::fill(dK, dK + p.Sk * s.Dp, 0.0f);
  if (want_dv) std::fill(dV, dV + p.Sk * s.Dvp, 0.0f);

  for (std::int64_t qb = part; qb < c.n_qblocks; qb += parts) {
    const attn::Tile t(c, b, g, qb);
    const std::int64_t R = t.rows_p;
    const auto q_row = [&](std::int64_t r) {
      return c.q + p.q.at(b, t.query(r, c.G), t.head(r, c.G));
    };
    const auto do_row = [&](std::int64_t r) {
      return dout + p.o.at(b, t.query(r, c.G), t.head(r, c.G));
    };
    PackRows(t, p.D, s.Dp, q_row, want_dk ? s.Qp.get() : nullptr, s.fwd.Qt.get());
    PackRows(t, p.Dv, s.Dvp, do_row, want_dv ? s.dOp.get() : nullptr,
             need_ds ? s.dOt.get() : nullptr);

    float* HWY_RESTRICT Drow = s.Drow.get();
    if (saved != nullptr) {
      // lse <- the saved log-sum-exp; dsum <- rowsum(dO * O) from the saved O
      // (padding rows: lse = −inf, so their P is 0)
      for (std::int64_t r = 0; r < R; ++r) {
        const bool real = r < t.rows;
        const std::int64_t i = t.query(r, c.G), h = t.head(r, c.G);
        s.lse.get()[r] = real ? saved->lse[static_cast<std::size_t>(p.lse_at(b, h, i))]
                              : -std::numeric_limits<float>::infinity();
        float dsum = 0.0f;
        for (std::int64_t x = 0; real && need_ds && x < p.Dv; ++x) {
          dsum += do_row(r)[x] * saved->out[static_cast<std::size_t>(p.o.at(b, i, h) + x)];
        }
        Drow[r] = dsum;
      }
    } else {
      // lse <- the forward's log-sum-exp; O (unnormalized) only when dsum needs it
      attn::ForwardTile(c, t, s.fwd, need_ds);
      attn::FinishRows(t, s.fwd, s.inv.get(), s.lse.get());
    }
    if (need_ds && saved == nullptr) {
      // dsum <- rowsum(dO * O)
      const float* Ot = s.fwd.Ot.get();
      const float* dOt = s.dOt.get();
      for (std::int64_t r0 = 0; r0 < R; r0 += N) {
        VF acc = hn::Zero(d);
        for (std::int64_t dv = 0; dv < p.Dv; ++dv) {
          acc = hn::MulAdd(hn::LoadU(d, dOt + dv * R + r0), hn::LoadU(d, Ot + dv * R + r0), acc);
        }
        hn::StoreU(hn::Mul(acc, hn::LoadU(d, s.inv.get() + r0)), d, Drow + r0);
      }
    }
    if (want_dq) std::fill(s.dQt.get(), s.dQt.get() + p.D * R, 0.0f);
    // Whether every row has a finite lse (or −inf: no visible key), a
    // finite dsum and finite q and dO. A row that sees a key holding NaN or
    // inf may not, nor a row whose own q or dO does: then exp(−inf − lse),
    // 0·(dP − dsum), 0·q and 0·dO are NaN even for the keys hidden from it,
    // which must not reach their dK and dV (see careful below).
    bool rows_finite = true;
    for (std::int64_t r = 0; r < t.rows; ++r) {
      const float x = s.lse.get()[r];
      rows_finite =
          rows_finite && (std::isfinite(x) || x == -std::numeric_limits<float>::infinity());
      rows_finite = rows_finite && (!need_ds || std::isfinite(Drow[r]));
    }
    if (want_dk) rows_finite = rows_finite && RowsFinite(s.Qp.get(), s.Dp, p.D, t.rows);
    if (want_dv) rows_finite = rows_finite && RowsFinite(s.dOp.get(), s.Dvp, p.Dv, t.rows);

    attn::ScoreTransform score(c, t, s.fwd.score);
    float* HWY_RESTRICT Pt = s.fwd.St.get();
    float* HWY_RESTRICT dSt = s.dPt.get();
    float* T = c.softcap > 0.0f && need_ds ? s.T.get() : nullptr;
    for (std::int64_t j0 = t.j_begin, nk = 0; j0 < t.j_end; j0 += nk) {
      nk = t.BlockSize(c, j0);
      const std::int64_t ks = attn::PackedStride(p.D), vs = attn::PackedStride(p.Dv);
      float* Kp = s.fwd.Kp.get();
      float* Vp = s.fwd.Vp.get();
      // only the rows lo .. hi−1 may see a key of this block
      std::int64_t lo, hi;
      t.ActiveColumns(c, j0, nk, lo, hi);
      const std::int64_t k_rows_active = std::min(hi, t.rows) - lo;
      if (k_rows_active <= 0) continue;
      score.SetBlock(j0, nk);
      attn::PackKeyRows(k_rows, p.k.seq, p.D, j0, nk, Kp);
      score.ZeroHiddenRows(Kp, ks, nk);
      if (need_ds) {
        attn::PackKeyRows(v_rows, p.v.seq, p.Dv, j0, nk, Vp);
        score.ZeroHiddenRows(Vp, vs, nk);
      }
      // Careful path (as in attn::ForwardTile). Where a key of the block is
      // hidden from some rows, its entry of P must be exactly 0 and never
      // meet its k or v: a NaN or an infinity in its v would reach dS through
      // 0·(dP − dsum), one in its k would reach dQ through 0·k, and a row
      // with a non-finite lse or dsum (it sees such a key elsewhere) would
      // make exp(−inf − lse) and 0·(dP − dsum) NaN for the keys hidden from
      // it, reaching their dV and dK. For such blocks the hidden entries of P
      // are set to −0.0 (whatever exp gave), dS to 0 there, and dQ, dK and
      // dV leave their products out (Skip), so that a NaN or an
      // infinity in a row's own q or dO reaches no key hidden from it either.
      // The all-finite case (checked here, one integer max per vector of K
      // and V) keeps the plain products.
      const bool careful = (score.hides_per_row() || score.any_hidden()) &&
                           !(rows_finite && (!want_dq || RowsFinite(Kp, ks, p.D, nk)) &&
                             (!need_ds || RowsFinite(Vp, vs, p.Dv, nk)));
      // S <- Q K^T (transposed: St[jj][r])
      Gemm(nk, hi - lo, p.D, Kp, ks, 1, s.fwd.Qt.get() + lo, R, Pt + lo, R, false);
      // P <- exp(S - lse); a row with no visible key (lse = −inf) gets
      // exp(s − inf) = 0 for every key instead of exp(−inf − (−inf)).
      for (std::int64_t r0 = lo; r0 < hi; r0 += N) {
        const VF lse = hn::LoadU(d, s.lse.get() + r0);
        const VF lse_use = hn::IfThenElse(hn::Eq(lse, neg_inf), pos_inf, lse);
        if (score.plain_at(r0)) {  // scale only
          for (std::int64_t jj = 0; jj < nk; ++jj) {
            const VF sc = hn::Mul(hn::LoadU(d, Pt + jj * R + r0), scale);
            hn::StoreU(attn::SoftmaxExp(d, hn::Sub(sc, lse_use)), d, Pt + jj * R + r0);
          }
        } else {
          for (std::int64_t jj = 0; jj < nk; ++jj) {
            const VF sc = score(hn::LoadU(d, Pt + jj * R + r0), jj, r0, T);
            hn::StoreU(attn::SoftmaxExp(d, hn::Sub(sc, lse_use)), d, Pt + jj * R + r0);
          }
          if (careful) score.MarkHidden(Pt, nk, r0);
        }
      }
      // dV <- dV + P^T dO  (careful: the products P marks hidden left out)
      if (want_dv) {
        GemmCareful<Skip::by_a>(careful, nk, s.Dvp, k_rows_active, Pt + lo, R, 1,
                                s.dOp.get() + lo * s.Dvp, s.Dvp, dV + j0 * s.Dvp, s.Dvp, true,
                                Pt + lo);
      }
      if (!need_ds) continue;
      // dP <- dO V^T (transposed: dPt[jj][r])
      Gemm(nk, hi - lo, p.Dv, Vp, vs, 1, s.dOt.get() + lo, R, dSt + lo, R, false);
      // dS <- P * (dP - dsum) * (1 - tanh^2) * scale   (the softcap factor
      // only when softcap > 0; scale folded in here for dQ and dK)
      for (std::int64_t r0 = lo; r0 < hi; r0 += N) {
        const VF dsum = hn::LoadU(d, Drow + r0);
        for (std::int64_t jj = 0; jj < nk; ++jj) {
          const std::int64_t at = jj * R + r0;
          VF ds = hn::Mul(hn::LoadU(d, Pt + at), hn::Sub(hn::LoadU(d, dSt + at), dsum));
          if (T != nullptr) {
            const VF th = hn::LoadU(d, T + at);
            ds = hn::Mul(ds, hn::NegMulAdd(th, th, hn::Set(d, 1.0f)));
          }
          hn::StoreU(hn::Mul(ds, scale), d, dSt + at);
        }
        // ds = 0 exactly where the key is hidden (dP, tanh may be NaN there)
        for (std::int64_t jj = 0; careful && jj < nk; ++jj) {
          const std::int64_t at = jj * R + r0;
          hn::StoreU(
              hn::IfThenElseZero(NotHiddenMark(d, hn::LoadU(d, Pt + at)), hn::LoadU(d, dSt + at)),
              d, dSt + at);
        }
      }
      // dK <- dK + scale * dS^T Q  (careful: dS is A, P's marks say which
      // products to leave out)
      if (want_dk) {
        GemmCareful<Skip::by_a>(careful, nk, s.Dp, k_rows_active, dSt + lo, R, 1,
                                s.Qp.get() + lo * s.Dp, s.Dp, dK + j0 * s.Dp, s.Dp, true, Pt + lo);
      }
      // dQ <- dQ + scale * dS K (transposed: dQt[d][r])
      if (want_dq) {  // dS is B here, P's marks laid out alike
        GemmCareful<Skip::by_b>(careful, p.D, hi - lo, nk, Kp, 1, ks, dSt + lo, R, s.dQt.get() + lo,
                                R, true, Pt + lo);
      }
    }
    if (want_dq) {
      const float* dQt = s.dQt.get();
      for (std::int64_t r = 0; r < t.rows; ++r) {
        float* dst = grads.dq.data() + p.dq.at(b, t.query(r, c.G), t.head(r, c.G));
        for (std::int64_t x = 0; x < p.D; ++x) dst[x] = dQt[x * R + r];
      }
    }
  }
  for (std::int64_t j = 0; parts == 1 && j < p.Sk; ++j) {
    if (want_dk) std::copy_n(dK + j * s.Dp, p.D, grads.dk.data() + p.dk.at(b, j, g));
    if (want_dv) std::copy_n(dV + j * s.Dvp, p.Dv, grads.dv.data() + p.dv.at(b, j, g));
  }
}

}  // namespace

/// dq, dk, dv (those asked for) for every (b, h): one OpenMP task per
/// (batch, kv head, query part) (see QueryParts), then, with several parts,
/// the parts' dK/dV partials added in part order.
void AttentionBackwardTarget(const AttentionPlan& plan, const AttentionInputs<float>& in,
                             std::span<const float> dout, const AttentionGrads<float>& grads,
                             const AttentionSaved<float>* saved, int threads) {
  const attn::Call c(plan, in);
  const bool want_dq = !grads.dq.empty(), want_dk = !grads.dk.empty(), want_dv = !grads.dv.empty();
  const std::int64_t parts = QueryParts(c), heads = plan.B * plan.Hkv;
  const std::int64_t n_tasks = heads * parts;
  const int nt =
      static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n_tasks)));
  // Scratch for every thread and the partial sums, allocated before any
  // output is written (an allocation failure is an exception here, not
  // inside the parallel region).
  std::vector<std::unique_ptr<BackwardScratch>> scratch;
  scratch.reserve(static_cast<std::size_t>(nt));
  for (int i = 0; i < nt; ++i) {
    scratch.push_back(std::make_unique<BackwardScratch>(c, want_dq, want_dk, want_dv, parts == 1));
  }
  const std::int64_t Dp = scratch[0]->Dp, Dvp = scratch[0]->Dvp;
  Buffer part_dk, part_dv;  // [heads·parts][Sk][Dp or Dvp]
  if (parts > 1 && want_dk) part_dk.resize(n_tasks * plan.Sk * Dp);
  if (parts > 1 && want_dv) part_dv.resize(n_tasks * plan.Sk * Dvp);
#pragma omp parallel num_threads(nt)
  {
    BackwardScratch& s = *scratch[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < n_tasks; ++task) {
      const std::int64_t head = task / parts, part = task % parts;
      float* dK = parts == 1 ? s.dK.get() : part_dk.get() + task * plan.Sk * Dp;
      float* dV = parts == 1 ? s.dV.get() : part_dv.get() + task * plan.Sk * Dvp;
      BackwardTask(c, head / plan.Hkv, head % plan.Hkv, part, parts, dout.data(), grads, saved, s,
                   dK, dV);
    }
    // dK, dV <- Σ_part partial, in part order (the barrier above: all written)
    if (parts > 1 && (want_dk || want_dv)) {
#pragma omp for schedule(static)
      for (std::int64_t row = 0; row < heads * plan.Sk; ++row) {
        const std::int64_t head = row / plan.Sk, j = row % plan.Sk;
        const std::int64_t b = head / plan.Hkv, g = head % plan.Hkv;
        const auto add_parts = [&](const float* partial, std::int64_t wp, std::int64_t width,
                                   float* dst) {
          for (std::int64_t x = 0; x < width; ++x) {
            float sum = partial[(head * parts * plan.Sk + j) * wp + x];
            for (std::int64_t k = 1; k < parts; ++k) {
              sum += partial[((head * parts + k) * plan.Sk + j) * wp + x];
            }
            dst[x] = sum;
          }
        };
        if (want_dk) add_parts(part_dk.get(), Dp, plan.D, grads.dk.data() + plan.dk.at(b, j, g));
        if (want_dv) add_parts(part_dv.get(), Dvp, plan.Dv, grads.dv.data() + plan.dv.at(b, j, g));
      }
    }
  }
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "attention.hpp"

namespace tandem::optimized {
HWY_EXPORT(AttentionBackwardTarget);

namespace detail {

void attention_backward(const AttentionPlan& plan, const AttentionInputs<float>& in,
                        std::span<const float> dout, const AttentionGrads<float>& grads,
                        const AttentionSaved<float>* saved, int threads) {
  check_inputs(plan, in);
  require_size(dout.size(), plan.o.extent, "dout");
  require(!(grads.dq.empty() && grads.dk.empty() && grads.dv.empty()), "grads",
          std::string("(dq, dk and dv all empty)"), "must ask for at least one gradient");
  check_grads(plan, grads, false);
  if (saved != nullptr) check_saved(plan, *saved);
  if (threads <= 0) threads = omp_get_max_threads();
  HWY_DYNAMIC_DISPATCH(AttentionBackwardTarget)(plan, in, dout, grads, saved, threads);
}

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
