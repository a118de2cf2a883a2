// SPDX-License-Identifier: Apache-2.0
// The mod language of SPEC §13.1 interpreted over a whole tile of points at
// once: node by node, each node's value for every (q_idx, kv_idx) of the
// tile computed before the next node is looked at, so that the cost of
// reading the program (one switch per node) is shared by the tile's
// elements. Real nodes are float32 (SPEC §13.1's table) and run as Highway
// float vectors; integer and boolean nodes are int64 arrays (booleans 0 or
// 1) in plain loops, which the compiler vectorizes where it can.
//
// Agrees with tandem::reference::evaluate_mod (reference/flex_mod.hpp) at
// every point: the same operations in the same program order, in float
// instead of the reference's scalar type; minimum, maximum, abs and where
// pick the same operand (the first on a tie), exp, log and tanh are
// Highway's float approximations (≤ 4 ulp, hwy/contrib/math).
//
// A tile is `rows` query rows of one (b, h) times `cols` keys, held with
// `stride` >= cols elements per row (stride a multiple of the lane count);
// the elements past cols repeat the row's last key (an index inside the
// call's domain, so that every load stays inside its tensor, SPEC §13.2)
// and are the caller's to ignore. Included once per Highway target (the
// toggle guard below), after <hwy/highway.h>.
#if defined(TANDEM_OPTIMIZED_FLEX_MOD_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TANDEM_OPTIMIZED_FLEX_MOD_TILE_INL_H_
#undef TANDEM_OPTIMIZED_FLEX_MOD_TILE_INL_H_
#else
#define TANDEM_OPTIMIZED_FLEX_MOD_TILE_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "simd-inl.h"
#include "tandem/flex_mod.hpp"

HWY_BEFORE_NAMESPACE();
namespace tandem::optimized::HWY_NAMESPACE {
namespace flex {

/// The points of one tile: (b, h) and the query rows [i0, i0 + rows) times
/// the keys [j0, j0 + cols), `stride` elements per row.
struct TilePoints {
  std::int64_t b = 0, h = 0;                  ///< batch entry and query head
  std::int64_t i0 = 0, rows = 0;              ///< the query rows
  std::int64_t j0 = 0, cols = 0, stride = 0;  ///< the keys and the row stride
  [[nodiscard]] std::int64_t size() const { return rows * stride; }  ///< elements held
};

/// The values of every node of one program over one tile: a float array
/// for each real node and an int64 array for each integer or boolean node
/// (a real load's array holds the row-major offset of the element it read).
class ModTile {
 public:
  /// The value of real node `id` (after Evaluate).
  [[nodiscard]] const float* real(std::int32_t id) const { return real_.data() + at(id); }
  /// The value of integer or boolean node `id`, or a real load's offsets.
  [[nodiscard]] const std::int64_t* integer(std::int32_t id) const { return int_.data() + at(id); }

  /// Evaluates every node of `p` at the points `x`, with `score` (`x.size()`
  /// elements; unused by a mask_mod) the value of the score leaf.
  void Evaluate(const ModProgram& p, const ModCaptures<float>& tensors, const TilePoints& x,
                const float* score) {
    n_ = x.size();
    const auto need = static_cast<std::size_t>(n_) * p.nodes().size();
    if (real_.size() < need) {
      real_.resize(need);
      int_.resize(need);
    }
    for (std::size_t id = 0; id < p.nodes().size(); ++id) {
      Node(p, tensors, x, score, static_cast<std::int32_t>(id));
    }
  }

 private:
  [[nodiscard]] std::size_t at(std::int32_t id) const {
    return static_cast<std::size_t>(id) * static_cast<std::size_t>(n_);
  }
  float* real_out(std::int32_t id) { return real_.data() + at(id); }
  std::int64_t* int_out(std::int32_t id) { return int_.data() + at(id); }

  /// out[e] = f(x[e], y[e]) on float vectors.
  template <class F>
  void RealBinary(std::int32_t id, std::int32_t a, std::int32_t b, F f) {
    const DF d;
    const float *x = real(a), *y = real(b);
    float* out = real_out(id);
    for (std::int64_t e = 0; e < n_; e += Lanes()) {
      hn::StoreU(f(d, hn::LoadU(d, x + e), hn::LoadU(d, y + e)), d, out + e);
    }
  }
  /// out[e] = f(x[e]) on float vectors.
  template <class F>
  void RealUnary(std::int32_t id, std::int32_t a, F f) {
    const DF d;
    const float* x = real(a);
    float* out = real_out(id);
    for (std::int64_t e = 0; e < n_; e += Lanes())
      hn::StoreU(f(d, hn::LoadU(d, x + e)), d, out + e);
  }
  /// out[e] = f(x[e], y[e]) on int64 (or, for comparisons, the reals' values).
  template <class F>
  void IntBinary(std::int32_t id, std::int32_t a, std::int32_t b, F f) {
    const std::int64_t *x = integer(a), *y = integer(b);
    std::int64_t* out = int_out(id);
    for (std::int64_t e = 0; e < n_; ++e) out[e] = f(x[e], y[e]);
  }
  template <class F>
  void Compare(const ModProgram& p, std::int32_t id, std::int32_t a, std::int32_t b, F f) {
    if (p.node(a).type == ModType::real) {
      const float *x = real(a), *y = real(b);
      std::int64_t* out = int_out(id);
      for (std::int64_t e = 0; e < n_; ++e) out[e] = f(x[e], y[e]) ? 1 : 0;
    } else {
      IntBinary(id, a, b, [f](std::int64_t x, std::int64_t y) -> std::int64_t { return f(x, y); });
    }
  }

  void Leaf(std::int32_t id, const TilePoints& x, ModOp op, const float* score);
  void Load(const ModProgram& p, const ModCaptures<float>& tensors, std::int32_t id);
  bool Arithmetic(const ModProgram& p, std::int32_t id);
  bool Transcendental(const ModNode& n, std::int32_t id);
  bool Logic(const ModProgram& p, std::int32_t id);
  void Node(const ModProgram& p, const ModCaptures<float>& tensors, const TilePoints& x,
            const float* score, std::int32_t id);

  std::int64_t n_ = 0;
  std::vector<float> real_;
  std::vector<std::int64_t> int_;
};

/// The leaves: score, b, h, q_idx, kv_idx and constants.
inline void ModTile::Leaf(std::int32_t id, const TilePoints& x, ModOp op, const float* score) {
  std::int64_t* out = int_out(id);
  switch (op) {
    case ModOp::score:
      if (score != nullptr) std::copy(score, score + n_, real_out(id));
      return;
    case ModOp::batch:
      std::fill(out, out + n_, x.b);
      return;
    case ModOp::head:
      std::fill(out, out + n_, x.h);
      return;
    case ModOp::q_idx:
      for (std::int64_t r = 0; r < x.rows; ++r) {
        std::fill(out + r * x.stride, out + (r + 1) * x.stride, x.i0 + r);
      }
      return;
    default:  // kv_idx; the padding repeats the last key
      for (std::int64_t r = 0; r < x.rows; ++r) {
        for (std::int64_t c = 0; c < x.stride; ++c) {
          out[r * x.stride + c] = x.j0 + std::min(c, x.cols - 1);
        }
      }
      return;
  }
}

/// tensor[index…]: the row-major offset from the index nodes, then the element.
inline void ModTile::Load(const ModProgram& p, const ModCaptures<float>& tensors, std::int32_t id) {
  const ModNode& n = p.node(id);
  const auto t = static_cast<std::size_t>(n.tensor);
  const auto& shape = p.tensors()[t].shape;
  std::int64_t* off = int_out(id);
  std::fill(off, off + n_, 0);
  for (std::size_t a = 0; a < shape.size(); ++a) {
    const std::int64_t* ix = integer(n.index[a]);
    for (std::int64_t e = 0; e < n_; ++e) off[e] = off[e] * shape[a] + ix[e];
  }
  if (n.type == ModType::real) {
    const float* src = tensors.real[t].data();
    float* out = real_out(id);
    for (std::int64_t e = 0; e < n_; ++e) out[e] = src[off[e]];
  } else {
    const Indices& src = tensors.integer[t];
    for (std::int64_t e = 0; e < n_; ++e) off[e] = src[static_cast<std::size_t>(off[e])];
  }
}

/// add, sub, mul, div, neg, minimum, maximum, abs, floor_div, mod; false
/// for another operation.
inline bool ModTile::Arithmetic(const ModProgram& p, std::int32_t id) {
  const ModNode& n = p.node(id);
  const std::int32_t a = n.arg[0], b = n.arg[1];
  const bool real = n.type == ModType::real;
  switch (n.op) {
    case ModOp::add:
      real ? RealBinary(id, a, b, [](DF, VF x, VF y) { return hn::Add(x, y); })
           : IntBinary(id, a, b, [](std::int64_t x, std::int64_t y) { return x + y; });
      return true;
    case ModOp::sub:
      real ? RealBinary(id, a, b, [](DF, VF x, VF y) { return hn::Sub(x, y); })
           : IntBinary(id, a, b, [](std::int64_t x, std::int64_t y) { return x - y; });
      return true;
    case ModOp::mul:
      real ? RealBinary(id, a, b, [](DF, VF x, VF y) { return hn::Mul(x, y); })
           : IntBinary(id, a, b, [](std::int64_t x, std::int64_t y) { return x * y; });
      return true;
    case ModOp::div:
      RealBinary(id, a, b, [](DF, VF x, VF y) { return hn::Div(x, y); });
      return true;
    case ModOp::neg:
      real ? RealUnary(id, a, [](DF, VF x) { return hn::Neg(x); })
           : IntBinary(id, a, a, [](std::int64_t x, std::int64_t) { return -x; });
      return true;
    // the first operand on a tie, as the reference: x <= y ? x : y
    case ModOp::minimum:
      real ? RealBinary(id, a, b, [](DF, VF x, VF y) { return hn::IfThenElse(hn::Le(x, y), x, y); })
           : IntBinary(id, a, b, [](std::int64_t x, std::int64_t y) { return std::min(x, y); });
      return true;
    case ModOp::maximum:
      real ? RealBinary(id, a, b, [](DF, VF x, VF y) { return hn::IfThenElse(hn::Ge(x, y), x, y); })
           : IntBinary(id, a, b, [](std::int64_t x, std::int64_t y) { return std::max(x, y); });
      return true;
    case ModOp::abs:  // x < 0 ? −x : x (−0 stays −0, as the reference)
      real ? RealUnary(
                 id, a,
                 [](DF d, VF x) { return hn::IfThenElse(hn::Lt(x, hn::Zero(d)), hn::Neg(x), x); })
           : IntBinary(id, a, a, [](std::int64_t x, std::int64_t) { return x < 0 ? -x : x; });
      return true;
    case ModOp::floor_div:
      IntBinary(id, a, b, [](std::int64_t x, std::int64_t y) { return detail::floor_div(x, y); });
      return true;
    case ModOp::mod:
      IntBinary(id, a, b, [](std::int64_t x, std::int64_t y) { return detail::floor_mod(x, y); });
      return true;
    default:
      return false;
  }
}

/// e^x, NaN at NaN. Highway's Exp (and Log below) are written for finite
/// arguments: its Exp gives 0 at NaN (it is right at ±inf and past float's
/// range); the reference's std:: functions give IEEE's values, so the mods'
/// NaN and infinities reach the softmax alike (SPEC §13.4).
HWY_INLINE VF ExpOf(DF d, VF x) {
  return hn::IfThenElse(hn::IsNaN(x), x, hn::Exp(d, x));
}
/// log x: NaN for x < 0 and for NaN, −inf at 0, +inf at +inf (Highway's
/// Log gives finite values at each).
HWY_INLINE VF LogOf(DF d, VF x) {
  const VF inf = hn::Set(d, std::numeric_limits<float>::infinity());
  const VF zero = hn::Zero(d);
  const VF finite =
      hn::Log(d, hn::IfThenElse(hn::And(hn::Gt(x, zero), hn::Lt(x, inf)), x, hn::Set(d, 1.0f)));
  VF r = hn::IfThenElse(hn::Eq(x, inf), inf, finite);
  r = hn::IfThenElse(hn::Eq(x, zero), hn::Neg(inf), r);
  return hn::IfThenElse(hn::Or(hn::Lt(x, zero), hn::IsNaN(x)),
                        hn::Set(d, std::numeric_limits<float>::quiet_NaN()), r);
}
/// exp, log, tanh, sigmoid (σ(x) = 1 / (1 + e^−x)); false for another operation.
inline bool ModTile::Transcendental(const ModNode& n, std::int32_t id) {
  const std::int32_t a = n.arg[0];
  switch (n.op) {
    case ModOp::exp:
      RealUnary(id, a, [](DF d, VF x) { return ExpOf(d, x); });
      return true;
    case ModOp::log:
      RealUnary(id, a, [](DF d, VF x) { return LogOf(d, x); });
      return true;
    case ModOp::tanh:
      RealUnary(id, a, [](DF d, VF x) { return hn::Tanh(d, x); });
      return true;
    case ModOp::sigmoid:
      RealUnary(id, a, [](DF d, VF x) {
        const VF one = hn::Set(d, 1.0f);
        return hn::Div(one, hn::Add(one, ExpOf(d, hn::Neg(x))));
      });
      return true;
    default:
      return false;
  }
}

/// to_real, the comparisons, the logic and where; false for another operation.
inline bool ModTile::Logic(const ModProgram& p, std::int32_t id) {
  const ModNode& n = p.node(id);
  const std::int32_t a = n.arg[0], b = n.arg[1], c = n.arg[2];
  switch (n.op) {
    case ModOp::to_real: {
      const std::int64_t* x = integer(a);
      float* out = real_out(id);
      for (std::int64_t e = 0; e < n_; ++e) out[e] = static_cast<float>(static_cast<double>(x[e]));
      return true;
    }
    case ModOp::lt:
      Compare(p, id, a, b, [](auto x, auto y) { return x < y; });
      return true;
    case ModOp::le:
      Compare(p, id, a, b, [](auto x, auto y) { return x <= y; });
      return true;
    case ModOp::gt:
      Compare(p, id, a, b, [](auto x, auto y) { return x > y; });
      return true;
    case ModOp::ge:
      Compare(p, id, a, b, [](auto x, auto y) { return x >= y; });
      return true;
    case ModOp::eq:
      Compare(p, id, a, b, [](auto x, auto y) { return x == y; });
      return true;
    case ModOp::ne:
      Compare(p, id, a, b, [](auto x, auto y) { return x != y; });
      return true;
    case ModOp::logical_and:
      IntBinary(id, a, b, [](std::int64_t x, std::int64_t y) -> std::int64_t { return x && y; });
      return true;
    case ModOp::logical_or:
      IntBinary(id, a, b, [](std::int64_t x, std::int64_t y) -> std::int64_t { return x || y; });
      return true;
    case ModOp::logical_not:
      IntBinary(id, a, a, [](std::int64_t x, std::int64_t) -> std::int64_t { return !x; });
      return true;
    case ModOp::where: {
      const std::int64_t* cond = integer(a);
      if (n.type == ModType::real) {
        const float *x = real(b), *y = real(c);
        float* out = real_out(id);
        for (std::int64_t e = 0; e < n_; ++e) out[e] = cond[e] != 0 ? x[e] : y[e];
      } else {
        const std::int64_t *x = integer(b), *y = integer(c);
        std::int64_t* out = int_out(id);
        for (std::int64_t e = 0; e < n_; ++e) out[e] = cond[e] != 0 ? x[e] : y[e];
      }
      return true;
    }
    default:
      return false;
  }
}

/// Node `id` over the whole tile.
inline void ModTile::Node(const ModProgram& p, const ModCaptures<float>& tensors,
                          const TilePoints& x, const float* score, std::int32_t id) {
  const ModNode& n = p.node(id);
  switch (n.op) {
    case ModOp::score:
    case ModOp::batch:
    case ModOp::head:
    case ModOp::q_idx:
    case ModOp::kv_idx:
      Leaf(id, x, n.op, score);
      return;
    case ModOp::constant:
      if (n.type == ModType::real) {
        std::fill(real_out(id), real_out(id) + n_, static_cast<float>(n.value));
      } else {
        std::fill(int_out(id), int_out(id) + n_, n.ivalue);
      }
      return;
    case ModOp::load:
      Load(p, tensors, id);
      return;
    default:
      if (!Arithmetic(p, id) && !Transcendental(n, id)) Logic(p, id);
  }
}

}  // namespace flex
}  // namespace tandem::optimized::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // toggle guard
