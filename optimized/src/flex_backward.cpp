// SPDX-License-Identifier: Apache-2.0
// The optimized FlexAttention backward (SPEC §13.4): Highway SIMD (one
// dynamic dispatch per call) and OpenMP over (b, kv head) tasks.
//
// A call whose mods are a native form (flex_native.hpp, SPEC §13.5) runs on
// the native attention backward (its forward rerun) instead.
//
// Must agree with tandem::reference::flex_backward (and
// flex_backward_stored; reference/include/tandem/reference/flex.hpp) to
// float rounding:
//   dv_j += p_ij dO_i,  dt_ij = p_ij (<dO_i, v_j> − <dO_i, o_i>),
//   ds_ij = dt_ij · ∂t/∂s,  dq_i += scale ds_ij k_j,  dk_j += scale ds_ij q_i,
//   dT[e] += dt_ij · ∂t/∂T[e] for each load of a real tensor element T[e].
// The order differs on purpose:
//  - a task owns one (b, kv head g): the query heads of its GQA group and
//    all their rows, so it alone writes dk and dv of (b, g) and dq of those
//    heads; the captured tensors' gradients are summed per task into its own
//    buffer, and the tasks' buffers are added in task order at the end
//    (never atomics): bitwise identical for any number of threads;
//  - each query tile (as the forward's) is first recomputed by the
//    forward's own function (flex_softmax-inl.h: o and lse, the forward's
//    bits), then its chunks are visited again: s, the mask and the score_mod's
//    gradient program (the score_mod's nodes and ∂t/∂s, ∂t/∂T) over the
//    whole chunk, p = e^{t − lse}, dp = <dO_i, v_j> as the scores' float
//    multiply-add chain over e. The reference recomputes one row at a time
//    in its scalar type and sums over keys j for each row i.
// bf16 and f16 calls read their inputs widened to float (exact) and round
// each gradient to T once.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "flex_backward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "buffer.hpp"
#include "convert-inl.h"
#include "flex_call.hpp"
#include "flex_scores-inl.h"
#include "flex_softmax-inl.h"
#include "flex_widen-inl.h"
#include "tandem/storage.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {
namespace {

using flex::Call;
using flex::Chunk;
using flex::TileScratch;

/// The float gradients being accumulated (nullptr: not computed) and dout.
struct Grads {
  const float* dout = nullptr;   ///< `[B,H,Sq,Dv]`
  float* dq = nullptr;           ///< `[B,H,Sq,D]`
  float* dk = nullptr;           ///< `[B,Hkv,Sk,D]`
  float* dv = nullptr;           ///< `[B,Hkv,Sk,Dv]`
  std::vector<bool> tensor;      ///< per score_mod tensor: its gradient is wanted
  std::vector<std::int64_t> at;  ///< per tensor: its offset in a task's dT buffer
  std::int64_t dT_size = 0;      ///< elements of one task's dT buffer
};

/// Per-thread scratch of the backward: the forward's tile, the chunk's p,
/// dp (then dt), ds and the rows' D_i = <dO_i, o_i>.
struct BackScratch {
  TileScratch tile;
  std::vector<float> p, dp, ds, D;
  explicit BackScratch(const Call& c)
      : tile(c), p(tile.chunk.s.size()), dp(p.size()), ds(p.size()), D(flex::kTileRows) {}
};

/// y[e] += a · x[e] for e < n.
inline void AddScaled(float a, const float* x, std::int64_t n, float* y) {
  const DF d;
  const std::int64_t N = Lanes();
  const VF va = hn::Set(d, a);
  std::int64_t e = 0;
  for (; e + N <= n; e += N) {
    hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + e), hn::LoadU(d, y + e)), d, y + e);
  }
  for (; e < n; ++e) y[e] += a * x[e];
}

/// p, dt (in s.dp) and ds of rows [i0, i0 + rows) of (b, h) against chunk
/// `ch`, whose t and gradient program the caller has evaluated; dO the
/// rows' output gradients, s.D their <dO_i, o_i> and s.tile.l their lse.
void ChunkGradients(const Call& c, const Chunk& ch, std::int64_t rows, const float* dO,
                    const float* vt, BackScratch& s) {
  const ModGradient& df = c.plan->score_grad();
  const bool has_mod = !c.plan->params().score_mod.empty();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const DF d;
  flex::Products(dO, rows, c.Dv, vt + ch.j0, c.kt_stride, ch.stride, 1.0f, s.dp.data());
  const float* t = s.tile.chunk.t.data();
  const float* dsc = has_mod && df.d_score >= 0 ? s.tile.chunk.score_mod.real(df.d_score) : nullptr;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float lse = s.tile.l[static_cast<std::size_t>(r)];
    for (std::int64_t j = 0; j < ch.stride; ++j) {
      const std::int64_t e = r * ch.stride + j;
      const bool live = t[e] != kNegInf && lse != kNegInf;
      const float p = live ? hn::GetLane(hn::Exp(d, hn::Set(d, t[e] - lse))) : 0.0f;
      const float dt = live ? p * (s.dp[e] - s.D[static_cast<std::size_t>(r)]) : 0.0f;
      s.p[e] = p;
      s.dp[e] = dt;
      s.ds[e] = !live ? 0.0f : !has_mod ? dt : dsc == nullptr ? 0.0f : dt * dsc[e];
    }
  }
}

/// dq, dk, dv and the task's dT of one chunk, from s.p, s.dp (dt) and s.ds.
void ChunkAccumulate(const Call& c, std::int64_t b, std::int64_t h, std::int64_t i0,
                     std::int64_t rows, const Chunk& ch, const Grads& g, BackScratch& s,
                     float* dT) {
  const std::int64_t kv = b * c.Hkv + h / c.G;
  const float* k = c.k + kv * c.Sk * c.D;
  const float* q = c.q + ((b * c.H + h) * c.Sq + i0) * c.D;
  const float* dO = g.dout + ((b * c.H + h) * c.Sq + i0) * c.Dv;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < ch.cols; ++j) {
      const std::int64_t e = r * ch.stride + j, key = ch.j0 + j;
      if (g.dv != nullptr && s.p[e] != 0.0f) {
        AddScaled(s.p[e], dO + r * c.Dv, c.Dv, g.dv + (kv * c.Sk + key) * c.Dv);
      }
      if (s.ds[e] == 0.0f) continue;
      const float sds = c.scale * s.ds[e];
      if (g.dq != nullptr) {
        AddScaled(sds, k + key * c.D, c.D, g.dq + ((b * c.H + h) * c.Sq + i0 + r) * c.D);
      }
      if (g.dk != nullptr) AddScaled(sds, q + r * c.D, c.D, g.dk + (kv * c.Sk + key) * c.D);
    }
  }
  if (dT == nullptr) return;
  const ModGradient& df = c.plan->score_grad();
  const flex::ModTile& vals = s.tile.chunk.score_mod;
  for (const ModGradient::Load& l : df.loads) {
    const auto tensor = static_cast<std::size_t>(df.program.node(l.node).tensor);
    if (!g.tensor[tensor]) continue;
    float* dst = dT + g.at[tensor];
    const std::int64_t* off = vals.integer(l.node);
    const float* dl = vals.real(l.d);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < ch.cols; ++j) {
        const std::int64_t e = r * ch.stride + j;
        if (s.tile.chunk.t[e] == -std::numeric_limits<float>::infinity()) continue;
        dst[off[e]] += s.dp[e] * dl[e];
      }
    }
  }
}

/// The backward of query tile `t` of (b, h).
void BackwardTile(const Call& c, std::int64_t b, std::int64_t h, std::int64_t t, const Grads& g,
                  BackScratch& s, float* dT) {
  const auto [i0, last] = c.tile_rows(t);
  if (i0 >= last) return;
  const std::int64_t rows = last - i0;
  flex::TileChunks(c, b, h, t, s.tile);
  flex::ForwardTileRows(c, b, h, i0, rows, s.tile);
  const float* dO = g.dout + ((b * c.H + h) * c.Sq + i0) * c.Dv;
  for (std::int64_t r = 0; r < rows; ++r) {  // D_i = <dO_i, o_i>
    float sum = 0.0f;
    for (std::int64_t e = 0; e < c.Dv; ++e) sum += dO[r * c.Dv + e] * s.tile.o[r * c.Dv + e];
    s.D[static_cast<std::size_t>(r)] = sum;
  }
  const float* vt = c.vt + (b * c.Hkv + h / c.G) * c.Dv * c.kt_stride;
  const ModProgram& df = c.plan->score_grad().program;
  for (const Chunk& ch : s.tile.chunks) {
    flex::ChunkScores(c, b, h, i0, rows, ch, df, s.tile.chunk);
    ChunkGradients(c, ch, rows, dO, vt, s);
    ChunkAccumulate(c, b, h, i0, rows, ch, g, s, dT);
  }
}

/// The gradients of call `c` into g (zeroed by the caller): one OpenMP task
/// per (b, kv head), each with its own dT buffer, added in task order.
void Backward(const Call& call, const Grads& g, std::span<float* const> dT_out, int threads) {
  // k and v transposed once per call (flex::Products)
  Call c = call;
  c.kt_stride = flex::TransposedStride(c);
  Buffer kt(c.B * c.Hkv * c.D * c.kt_stride, Buffer::Init::uninitialized);
  Buffer vt(c.B * c.Hkv * c.Dv * c.kt_stride, Buffer::Init::uninitialized);
  flex::TransposeAll(c.k, c.B * c.Hkv, c.Sk, c.D, c.kt_stride, kt.get(), threads);
  flex::TransposeAll(c.v, c.B * c.Hkv, c.Sk, c.Dv, c.kt_stride, vt.get(), threads);
  c.kt = kt.get();
  c.vt = vt.get();
  const std::int64_t n_tasks = c.B * c.Hkv;
  const int nt =
      static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n_tasks)));
  std::vector<std::unique_ptr<BackScratch>> scratch;
  scratch.reserve(static_cast<std::size_t>(nt));
  for (int i = 0; i < nt; ++i) scratch.push_back(std::make_unique<BackScratch>(c));
  Buffer parts(g.dT_size > 0 ? n_tasks * g.dT_size : 0);  // zero
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (std::int64_t task = 0; task < n_tasks; ++task) {
    const std::int64_t b = task / c.Hkv, kvh = task % c.Hkv;
    BackScratch& s = *scratch[static_cast<std::size_t>(omp_get_thread_num())];
    float* dT = g.dT_size > 0 ? parts.get() + task * g.dT_size : nullptr;
    for (std::int64_t h = kvh * c.G; h < (kvh + 1) * c.G; ++h) {
      for (std::int64_t t = 0; t < c.tiles(); ++t) BackwardTile(c, b, h, t, g, s, dT);
    }
  }
  if (g.dT_size == 0) return;
    // dT[e] = Σ_task parts[task][e], in task order, each e by one thread
#pragma omp parallel for schedule(static) num_threads(nt)
  for (std::int64_t e = 0; e < g.dT_size; ++e) {
    float sum = 0.0f;
    for (std::int64_t task = 0; task < n_tasks; ++task) sum += parts.get()[task * g.dT_size + e];
    const auto tensor =
        static_cast<std::size_t>(std::upper_bound(g.at.begin(), g.at.end(), e) - g.at.begin() - 1);
    dT_out[tensor][e - g.at[tensor]] = sum;
  }
}

/// The float views of a call's gradients in T: for float the outputs
/// themselves (zeroed), else zeroed float buffers that Finish() rounds to T
/// once.
template <class T>
class FloatGrads {
 public:
  /// The float view of x (nullptr when x is empty: not computed).
  float* view(std::span<T> x) {
    if (x.empty()) return nullptr;
    if constexpr (std::is_same_v<T, float>) {
      std::fill(x.begin(), x.end(), 0.0f);
      return x.data();
    } else {
      buffers_.emplace_back(static_cast<std::int64_t>(x.size()));  // zero
      outs_.push_back(x);
      return buffers_.back().get();
    }
  }
  /// Each buffer rounded to T into its output.
  void Finish(int threads) {
    for (std::size_t i = 0; i < outs_.size(); ++i) {
      Narrow(buffers_[i].get(), static_cast<std::int64_t>(outs_[i].size()), outs_[i].data(),
             threads);
    }
  }

 private:
  std::vector<Buffer> buffers_;
  std::vector<std::span<T>> outs_;
};

/// The backward at storage type T (validated by the caller): float
/// gradients written in place, bf16 and f16 ones through float buffers
/// rounded to T once.
template <class T>
void BackwardStored(const FlexPlan& plan, const FlexInputs<T>& in, std::span<const T> dout,
                    const FlexGrads<T>& grads, int threads) {
  flex::WideInputs wide;
  const Call c = flex::MakeCall(plan, in, wide, threads);
  Grads g;
  Buffer dO_wide;
  if constexpr (std::is_same_v<T, float>) {
    g.dout = dout.data();
  } else {
    dO_wide.resize(plan.out_size(), Buffer::Init::uninitialized);
    Widen(dout.data(), plan.out_size(), dO_wide.get(), threads);
    g.dout = dO_wide.get();
  }
  FloatGrads<T> out;
  g.dq = out.view(grads.dq), g.dk = out.view(grads.dk), g.dv = out.view(grads.dv);
  // the wanted tensors' gradients, laid end to end in each task's buffer
  const auto& ts = plan.params().score_mod.tensors();
  g.tensor.assign(ts.size(), false);
  g.at.assign(ts.size(), 0);
  std::vector<float*> dT_out(ts.size(), nullptr);
  for (std::size_t t = 0; t < grads.d_score_tensors.size(); ++t) {
    g.at[t] = g.dT_size;
    dT_out[t] = out.view(grads.d_score_tensors[t]);
    g.tensor[t] = dT_out[t] != nullptr;
    if (g.tensor[t]) g.dT_size += ts[t].size();
  }
  Backward(c, g, dT_out, threads);
  out.Finish(threads);
}

}  // namespace

/// The backward of SPEC §13.4 at float, bf16 and f16 (BackwardStored).
void FlexBackwardTarget(const FlexPlan& plan, const FlexInputs<float>& in,
                        std::span<const float> dout, const FlexGrads<float>& grads, int threads) {
  BackwardStored(plan, in, dout, grads, threads);
}
void FlexBackwardBf16Target(const FlexPlan& plan, const FlexInputs<bfloat16>& in,
                            std::span<const bfloat16> dout, const FlexGrads<bfloat16>& grads,
                            int threads) {
  BackwardStored(plan, in, dout, grads, threads);
}
void FlexBackwardF16Target(const FlexPlan& plan, const FlexInputs<float16>& in,
                           std::span<const float16> dout, const FlexGrads<float16>& grads,
                           int threads) {
  BackwardStored(plan, in, dout, grads, threads);
}

}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "entry_points.hpp"
#include "flex_native.hpp"

namespace tandem::optimized {
HWY_EXPORT(FlexBackwardTarget);
HWY_EXPORT(FlexBackwardBf16Target);
HWY_EXPORT(FlexBackwardF16Target);

namespace detail {

template <class T>
void flex_backward(const FlexPlan& plan, const FlexInputs<T>& in, std::span<const T> dout,
                   const FlexGrads<T>& grads, const Options& options) {
  plan.check_grads(in, dout.size(), grads);
  if (flex::native_backward(plan, in, dout, grads, options)) return;
  const int threads = threads_of(options);
  if constexpr (std::is_same_v<T, float>) {
    HWY_DYNAMIC_DISPATCH(FlexBackwardTarget)(plan, in, dout, grads, threads);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    HWY_DYNAMIC_DISPATCH(FlexBackwardBf16Target)(plan, in, dout, grads, threads);
  } else {
    HWY_DYNAMIC_DISPATCH(FlexBackwardF16Target)(plan, in, dout, grads, threads);
  }
}

template void flex_backward(const FlexPlan&, const FlexInputs<float>&, std::span<const float>,
                            const FlexGrads<float>&, const Options&);
template void flex_backward(const FlexPlan&, const FlexInputs<bfloat16>&, std::span<const bfloat16>,
                            const FlexGrads<bfloat16>&, const Options&);
template void flex_backward(const FlexPlan&, const FlexInputs<float16>&, std::span<const float16>,
                            const FlexGrads<float16>&, const Options&);

}  // namespace detail
}  // namespace tandem::optimized
#endif  // HWY_ONCE
