// SPDX-License-Identifier: Apache-2.0
/// @file reference/flex_mod.hpp
/// @brief The reference interpreter of the mod language (SPEC §13.1): one
///        node at a time, at one point (b, h, q_idx, kv_idx), in the scalar
///        type S (double, or complex for complex-step gradients).
#pragma once

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <span>
#include <vector>

#include "tandem/flex_mod.hpp"
#include "tandem/indices.hpp"
#include "tandem/reference/scalar.hpp"

namespace tandem::reference {

/// The value of one node: its real, integer or boolean part (by its type).
template <class S>
struct ModValueAt {
  S real{};                  ///< a real node's value
  std::int64_t integer = 0;  ///< an integer node's value; a boolean's 0 or 1
};

/// The captured tensors of a program (tandem::ModCaptures), in S.
template <class S>
using ModTensorsOf = ModCaptures<S>;

/// Where a program is evaluated: the score (score_mod) and the indices.
template <class S>
struct ModPoint {
  S score{};            ///< s = scale·<q_i, k_j>
  std::int64_t b = 0;   ///< b
  std::int64_t h = 0;   ///< h (the query head)
  std::int64_t q = 0;   ///< q_idx
  std::int64_t kv = 0;  ///< kv_idx
};

/// The row-major offset of load node n's element (check_mod bounded it).
template <class S>
std::int64_t mod_offset(const ModProgram& p, const ModNode& n,
                        const std::vector<ModValueAt<S>>& val) {
  const auto& shape = p.tensors()[static_cast<std::size_t>(n.tensor)].shape;
  std::int64_t at = 0;
  for (std::size_t a = 0; a < shape.size(); ++a) {
    at = at * shape[a] + val[static_cast<std::size_t>(n.index[a])].integer;
  }
  return at;
}

/// Evaluates every node of `p` at `x` into `val` (resized to the node
/// count); val[p.result()] is the mod's value. Reals compare by their real
/// parts, so a complex step rides through where(), minimum and maximum.
template <class S>
void evaluate_mod(const ModProgram& p, const ModTensorsOf<S>& tensors, const ModPoint<S>& x,
                  std::vector<ModValueAt<S>>& val) {
  val.assign(p.nodes().size(), {});
  for (std::size_t id = 0; id < p.nodes().size(); ++id) {
    const ModNode& n = p.nodes()[id];
    const auto arg = [&](int a) -> const ModValueAt<S>& {
      return val[static_cast<std::size_t>(n.arg[static_cast<std::size_t>(a)])];
    };
    const bool real = n.type == ModType::real;
    // The operands' type (the node's own for arithmetic; comparisons give booleans).
    const bool real_args =
        n.arg[0] >= 0 && p.node(n.arg[0]).type == ModType::real && n.op != ModOp::where;
    const S xr = n.arg[0] >= 0 ? arg(0).real : S{}, yr = n.arg[1] >= 0 ? arg(1).real : S{};
    const std::int64_t xi = n.arg[0] >= 0 ? arg(0).integer : 0;
    const std::int64_t yi = n.arg[1] >= 0 ? arg(1).integer : 0;
    const auto cmp = [&](auto less_or) {  // a boolean from the real or integer operands
      return real_args ? less_or(real_part(xr), real_part(yr)) : less_or(xi, yi);
    };
    ModValueAt<S>& out = val[id];
    switch (n.op) {
      case ModOp::score:
        out.real = x.score;
        break;
      case ModOp::batch:
        out.integer = x.b;
        break;
      case ModOp::head:
        out.integer = x.h;
        break;
      case ModOp::q_idx:
        out.integer = x.q;
        break;
      case ModOp::kv_idx:
        out.integer = x.kv;
        break;
      case ModOp::constant:
        out.real = S(n.value);
        out.integer = n.ivalue;
        break;
      case ModOp::load: {
        const auto at = static_cast<std::size_t>(mod_offset(p, n, val));
        const auto t = static_cast<std::size_t>(n.tensor);
        if (real) {
          out.real = tensors.real[t][at];
        } else {
          out.integer = tensors.integer[t][at];
        }
        break;
      }
      // s' = x + y, x − y, x·y, x / y, −x
      case ModOp::add:
        real ? void(out.real = xr + yr) : void(out.integer = xi + yi);
        break;
      case ModOp::sub:
        real ? void(out.real = xr - yr) : void(out.integer = xi - yi);
        break;
      case ModOp::mul:
        real ? void(out.real = xr * yr) : void(out.integer = xi * yi);
        break;
      case ModOp::div:
        out.real = xr / yr;
        break;
      case ModOp::neg:
        real ? void(out.real = -xr) : void(out.integer = -xi);
        break;
      // min(x, y), max(x, y): the first operand on a tie
      case ModOp::minimum:
        real ? void(out.real = real_part(xr) <= real_part(yr) ? xr : yr)
             : void(out.integer = std::min(xi, yi));
        break;
      case ModOp::maximum:
        real ? void(out.real = real_part(xr) >= real_part(yr) ? xr : yr)
             : void(out.integer = std::max(xi, yi));
        break;
      case ModOp::abs:
        real ? void(out.real = real_part(xr) < 0 ? -xr : xr)
             : void(out.integer = xi < 0 ? -xi : xi);
        break;
      // x // y and x % y round toward −inf
      case ModOp::floor_div:
        out.integer = detail::floor_div(xi, yi);
        break;
      case ModOp::mod:
        out.integer = detail::floor_mod(xi, yi);
        break;
      case ModOp::exp:
        out.real = std::exp(xr);
        break;
      case ModOp::log:
        out.real = std::log(xr);
        break;
      case ModOp::tanh:
        out.real = std::tanh(xr);
        break;
      case ModOp::sigmoid:  // σ(x) = 1 / (1 + e^−x)
        out.real = S(1) / (S(1) + std::exp(-xr));
        break;
      case ModOp::to_real:
        out.real = S(static_cast<double>(xi));
        break;
      case ModOp::lt:
        out.integer = cmp([](auto a, auto b) { return a < b; });
        break;
      case ModOp::le:
        out.integer = cmp([](auto a, auto b) { return a <= b; });
        break;
      case ModOp::gt:
        out.integer = cmp([](auto a, auto b) { return a > b; });
        break;
      case ModOp::ge:
        out.integer = cmp([](auto a, auto b) { return a >= b; });
        break;
      case ModOp::eq:
        out.integer = cmp([](auto a, auto b) { return a == b; });
        break;
      case ModOp::ne:
        out.integer = cmp([](auto a, auto b) { return a != b; });
        break;
      case ModOp::logical_and:
        out.integer = (xi != 0 && yi != 0) ? 1 : 0;
        break;
      case ModOp::logical_or:
        out.integer = (xi != 0 || yi != 0) ? 1 : 0;
        break;
      case ModOp::logical_not:
        out.integer = xi != 0 ? 0 : 1;
        break;
      case ModOp::where:  // where(c, x, y)
        out = xi != 0 ? arg(1) : arg(2);
        break;
    }
  }
}

}  // namespace tandem::reference
