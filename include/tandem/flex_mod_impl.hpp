// SPDX-License-Identifier: Apache-2.0
/// @file flex_mod_impl.hpp
/// @brief The definitions of flex_mod.hpp: the builder's type rules, the
///        interval checks of check_mod() and the reverse-mode derivative of
///        differentiate() (SPEC §13). Included by flex_mod.hpp only.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "tandem/error.hpp"
#include "tandem/flex_mod.hpp"

namespace tandem {

namespace detail {

/// Operand count of op: 0 for leaves, 3 for where, 1 for unary ops.
constexpr int mod_arity(ModOp op) {
  switch (op) {
    case ModOp::score:
    case ModOp::batch:
    case ModOp::head:
    case ModOp::q_idx:
    case ModOp::kv_idx:
    case ModOp::constant:
    case ModOp::load:
      return 0;
    case ModOp::neg:
    case ModOp::abs:
    case ModOp::exp:
    case ModOp::log:
    case ModOp::tanh:
    case ModOp::sigmoid:
    case ModOp::to_real:
    case ModOp::logical_not:
      return 1;
    case ModOp::where:
      return 3;
    default:
      return 2;
  }
}

[[noreturn]] inline void mod_type_error(ModOp op, const std::string& got,
                                        const std::string& wants) {
  throw Error("mod", std::string("mod operation ") + to_string(op) + " got " + got + ": " + wants);
}

/// The type of `op` on operands of types ta, tb, tc (the rules of SPEC §13.1).
inline ModType mod_result_type(ModOp op, ModType ta, ModType tb, ModType tc) {
  const auto one = [&](ModType t) { return std::string(to_string(t)); };
  const auto two = [&] { return one(ta) + " and " + one(tb); };
  const bool numeric = ta == tb && ta != ModType::boolean;
  switch (op) {
    case ModOp::add:
    case ModOp::sub:
    case ModOp::mul:
    case ModOp::minimum:
    case ModOp::maximum:
      if (!numeric) mod_type_error(op, two(), "wants two reals or two integers");
      return ta;
    case ModOp::div:
      if (ta != ModType::real || tb != ModType::real) mod_type_error(op, two(), "wants reals");
      return ModType::real;
    case ModOp::floor_div:
    case ModOp::mod:
      if (ta != ModType::integer || tb != ModType::integer) {
        mod_type_error(op, two(), "wants integers");
      }
      return ModType::integer;
    case ModOp::neg:
    case ModOp::abs:
      if (ta == ModType::boolean) mod_type_error(op, one(ta), "wants a real or an integer");
      return ta;
    case ModOp::exp:
    case ModOp::log:
    case ModOp::tanh:
    case ModOp::sigmoid:
      if (ta != ModType::real) mod_type_error(op, one(ta), "wants a real");
      return ModType::real;
    case ModOp::to_real:
      if (ta == ModType::real) mod_type_error(op, one(ta), "wants an integer or a boolean");
      return ModType::real;
    case ModOp::lt:
    case ModOp::le:
    case ModOp::gt:
    case ModOp::ge:
      if (!numeric) mod_type_error(op, two(), "wants two reals or two integers");
      return ModType::boolean;
    case ModOp::eq:
    case ModOp::ne:
      if (ta != tb) mod_type_error(op, two(), "wants two operands of one type");
      return ModType::boolean;
    case ModOp::logical_and:
    case ModOp::logical_or:
      if (ta != ModType::boolean || tb != ModType::boolean) {
        mod_type_error(op, two(), "wants booleans");
      }
      return ModType::boolean;
    case ModOp::logical_not:
      if (ta != ModType::boolean) mod_type_error(op, one(ta), "wants a boolean");
      return ModType::boolean;
    case ModOp::where:
      if (ta != ModType::boolean || tb != tc) {
        mod_type_error(op, one(ta) + ", " + one(tb) + " and " + one(tc),
                       "wants a boolean condition and two values of one type");
      }
      return tb;
    default:
      mod_type_error(op, "no operands", "is a leaf (use the builder's leaf functions)");
  }
}

/// True for the ops whose operands a real one promotes (add, …, where's values).
constexpr bool mod_promotes(ModOp op) {
  switch (op) {
    case ModOp::add:
    case ModOp::sub:
    case ModOp::mul:
    case ModOp::div:
    case ModOp::minimum:
    case ModOp::maximum:
    case ModOp::lt:
    case ModOp::le:
    case ModOp::gt:
    case ModOp::ge:
    case ModOp::eq:
    case ModOp::ne:
    case ModOp::where:
      return true;
    default:
      return false;
  }
}

/// Python's a // b and a % b (rounding toward −inf); b != 0.
constexpr std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  const std::int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
constexpr std::int64_t floor_mod(std::int64_t a, std::int64_t b) {
  const std::int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

}  // namespace detail

// ---------------------------------------------------------------------------
// The builder

inline std::int32_t ModProgram::intern(ModNode n) {
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i] == n) return static_cast<std::int32_t>(i);
  }
  require(nodes_.size() < (1U << 20), "mod", static_cast<std::int64_t>(nodes_.size()),
          "nodes: a mod has at most 2^20 nodes");
  nodes_.push_back(n);
  return static_cast<std::int32_t>(nodes_.size() - 1);
}

inline ModValue ModProgram::leaf(ModOp op, ModType type) {
  ModNode n;
  n.op = op;
  n.type = type;
  return handle(intern(n));
}

inline ModValue ModProgram::real(double x) {
  require(!std::isnan(x), "mod", "nan", "constant: a mod's real constant must not be NaN");
  ModNode n;
  n.op = ModOp::constant;
  n.type = ModType::real;
  n.value = x;
  return handle(intern(n));
}

inline ModValue ModProgram::integer(std::int64_t x) {
  ModNode n;
  n.op = ModOp::constant;
  n.type = ModType::integer;
  n.ivalue = x;
  return handle(intern(n));
}

inline ModValue ModProgram::boolean(bool x) {
  ModNode n;
  n.op = ModOp::constant;
  n.type = ModType::boolean;
  n.ivalue = x ? 1 : 0;
  return handle(intern(n));
}

inline std::int32_t ModProgram::capture(ModTensor t) {
  const auto rank = static_cast<std::int64_t>(t.shape.size());
  require(rank >= 1 && rank <= kModMaxRank, t.name + ".rank", rank, "must be 1 to 4");
  std::int64_t n = 1;
  for (const auto e : t.shape) {
    require(e >= 1, t.name + ".shape", e, "extents must be >= 1");
    n = checked_mul(n, e, t.name);
  }
  require(t.type != ModType::boolean, t.name, "boolean",
          "must be real or integer (store a boolean tensor as integers)");
  if (t.type == ModType::integer) {
    require(t.lo <= t.hi, t.name + ".lo", t.lo, "must be <= hi = " + std::to_string(t.hi));
  }
  require(tensors_.size() < 64, "mod", static_cast<std::int64_t>(tensors_.size()),
          "tensors: a mod captures at most 64 tensors");
  tensors_.push_back(std::move(t));
  return static_cast<std::int32_t>(tensors_.size() - 1);
}

inline ModValue ModProgram::load(std::int32_t tensor, std::initializer_list<ModValue> index) {
  std::vector<std::int32_t> ids;
  for (const auto& v : index) ids.push_back(v.id);
  return load(tensor, ids);
}

inline ModValue ModProgram::load(std::int32_t tensor, std::span<const std::int32_t> index) {
  ModNode n;
  n.op = ModOp::load;
  n.tensor = tensor;
  for (std::size_t a = 0; a < index.size() && a < n.index.size(); ++a) n.index[a] = index[a];
  return handle(add(n));
}

inline std::int32_t ModProgram::promoted(std::int32_t id, ModType to) {
  if (id < 0 || to != ModType::real || node(id).type == ModType::real) return id;
  return apply(ModOp::to_real, id).id;
}

inline ModValue ModProgram::apply(ModOp op, ModValue a, ModValue b, ModValue c) {
  std::int32_t ia = a.id, ib = b.id, ic = c.id;
  if (detail::mod_promotes(op)) {
    std::int32_t& x = op == ModOp::where ? ib : ia;
    std::int32_t& y = op == ModOp::where ? ic : ib;
    if (x >= 0 && y >= 0) {
      const bool real = node(x).type == ModType::real || node(y).type == ModType::real;
      const bool boolean = node(x).type == ModType::boolean || node(y).type == ModType::boolean;
      if (real && !boolean) {
        x = promoted(x, ModType::real);
        y = promoted(y, ModType::real);
      }
    }
  }
  if (op == ModOp::div && ia >= 0 && ib >= 0) {  // Python's / on integers is real
    ia = promoted(ia, ModType::real);
    ib = promoted(ib, ModType::real);
  }
  return apply(op, ia, ib, ic);
}

inline ModValue ModProgram::apply(ModOp op, std::int32_t a, std::int32_t b, std::int32_t c) {
  ModNode n;
  n.op = op;
  n.arg = {a, b, c};
  return handle(add(n));
}

inline std::int32_t ModProgram::add(const ModNode& given) {
  ModNode n = given;
  const auto here = static_cast<std::int32_t>(nodes_.size());
  const int arity = detail::mod_arity(n.op);
  for (int a = 0; a < 3; ++a) {
    const std::int32_t id = n.arg[static_cast<std::size_t>(a)];
    if (a < arity) {
      require(id >= 0 && id < here, std::string("mod.") + to_string(n.op), id,
              "operand must name an earlier node (0 <= id < " + std::to_string(here) + ")");
    } else {
      require(id == -1, std::string("mod.") + to_string(n.op), id,
              "operand given to an operation that takes " + std::to_string(arity));
    }
  }
  const auto type = [&](int a) { return arity > a ? node(n.arg[a]).type : ModType::real; };
  switch (n.op) {
    case ModOp::score:
      n.type = ModType::real;
      break;
    case ModOp::batch:
    case ModOp::head:
    case ModOp::q_idx:
    case ModOp::kv_idx:
      n.type = ModType::integer;
      break;
    case ModOp::constant:
      if (n.type == ModType::real) {
        require(!std::isnan(n.value), "mod", "nan", "constant must not be NaN");
        n.ivalue = 0;
      } else {
        n.value = 0.0;
        if (n.type == ModType::boolean) n.ivalue = n.ivalue != 0 ? 1 : 0;
      }
      break;
    case ModOp::load: {
      require(n.tensor >= 0 && n.tensor < static_cast<std::int32_t>(tensors_.size()), "mod.load",
              n.tensor, "must name a captured tensor");
      const auto& t = tensors_[static_cast<std::size_t>(n.tensor)];
      const auto rank = static_cast<int>(t.shape.size());
      for (int a = 0; a < kModMaxRank; ++a) {
        const std::int32_t id = n.index[static_cast<std::size_t>(a)];
        if (a >= rank) {
          require(id == -1, "mod.load", a + 1,
                  "indices given to " + t.name + ", which has rank " + std::to_string(rank));
          continue;
        }
        require(id >= 0 && id < here, "mod.load", id,
                "index " + std::to_string(a) + " of " + t.name + " must name an earlier node");
        require(node(id).type == ModType::integer, "mod.load", to_string(node(id).type),
                "index " + std::to_string(a) + " of " + t.name + " must be an integer");
      }
      n.type = t.type;
      break;
    }
    default:
      n.type = detail::mod_result_type(n.op, type(0), type(1), type(2));
  }
  return intern(n);
}

inline void ModProgram::set_result(ModValue v) {
  set_result(v.id);
}

inline void ModProgram::set_result(std::int32_t id) {
  require(id >= 0 && id < static_cast<std::int32_t>(nodes_.size()), "mod.result", id,
          "must name a node");
  result_ = id;
}

inline bool ModProgram::reads(ModOp op, std::int32_t id) const {
  if (id < 0) return false;
  std::vector<char> live(nodes_.size(), 0);
  live[static_cast<std::size_t>(id)] = 1;
  for (std::int32_t i = id; i >= 0; --i) {
    if (!live[static_cast<std::size_t>(i)]) continue;
    const ModNode& n = node(i);
    if (n.op == op) return true;
    for (const auto a : n.arg) {
      if (a >= 0) live[static_cast<std::size_t>(a)] = 1;
    }
    for (const auto a : n.index) {
      if (a >= 0) live[static_cast<std::size_t>(a)] = 1;
    }
  }
  return false;
}

inline std::string ModProgram::render(std::int32_t id, int depth) const {
  const ModNode& n = node(id);
  if (depth < 0) return std::string(1, '%') + std::to_string(id);
  const auto r = [&](int a) { return render(n.arg[static_cast<std::size_t>(a)], depth - 1); };
  const auto infix = [&](const char* sym) {
    std::string s(1, '(');  // appended, not "(" + …: GCC 12 misreads that insert (-Wrestrict)
    s += r(0);
    s += ' ';
    s += sym;
    s += ' ';
    s += r(1);
    s += ')';
    return s;
  };
  switch (n.op) {
    case ModOp::score:
    case ModOp::batch:
    case ModOp::head:
    case ModOp::q_idx:
    case ModOp::kv_idx:
      return to_string(n.op);
    case ModOp::constant:
      if (n.type == ModType::boolean) return n.ivalue ? "true" : "false";
      if (n.type == ModType::integer) return std::to_string(n.ivalue);
      {
        std::string s = std::to_string(n.value);
        if (std::isinf(n.value)) s = n.value > 0 ? "inf" : "-inf";
        return s;
      }
    case ModOp::load: {
      const auto& t = tensors_[static_cast<std::size_t>(n.tensor)];
      std::string s = t.name + "[";
      for (std::size_t a = 0; a < t.shape.size(); ++a) {
        s += (a ? ", " : "") + render(n.index[a], depth - 1);
      }
      return s + "]";
    }
    case ModOp::add:
      return infix("+");
    case ModOp::sub:
      return infix("-");
    case ModOp::mul:
      return infix("*");
    case ModOp::div:
      return infix("/");
    case ModOp::floor_div:
      return infix("//");
    case ModOp::mod:
      return infix("%");
    case ModOp::lt:
      return infix("<");
    case ModOp::le:
      return infix("<=");
    case ModOp::gt:
      return infix(">");
    case ModOp::ge:
      return infix(">=");
    case ModOp::eq:
      return infix("==");
    case ModOp::ne:
      return infix("!=");
    case ModOp::logical_and:
      return infix("&");
    case ModOp::logical_or:
      return infix("|");
    case ModOp::neg:
      return "-" + r(0);
    case ModOp::logical_not:
      return "~" + r(0);
    case ModOp::where:
      return "where(" + r(0) + ", " + r(1) + ", " + r(2) + ")";
    case ModOp::minimum:
    case ModOp::maximum:
      return std::string(to_string(n.op)) + "(" + r(0) + ", " + r(1) + ")";
    default:
      return std::string(to_string(n.op)) + "(" + r(0) + ")";
  }
}

// ---------------------------------------------------------------------------
// check_mod: types of the result, and interval arithmetic over the domain

namespace detail {

/// Interval arithmetic for check_mod: the range of an integer node from its
/// operands' ranges; throws Error when a value can overflow or a divisor can
/// be 0.
class ModRanges {
 public:
  ModRanges(const ModProgram& p, const std::string& what) : p_(p), what_(what) {}

  ModRange of(std::int32_t id, const std::vector<ModRange>& r, const ModDomain& d) const {
    const ModNode& n = p_.node(id);
    const auto at = [&](int a) { return r[static_cast<std::size_t>(n.arg[a])]; };
    switch (n.op) {
      case ModOp::batch:
        return {0, d.B - 1};
      case ModOp::head:
        return {0, d.H - 1};
      case ModOp::q_idx:
        return {0, d.Sq - 1};
      case ModOp::kv_idx:
        return {0, d.Sk - 1};
      case ModOp::constant:
        return {n.ivalue, n.ivalue};
      case ModOp::load: {
        const auto& t = p_.tensors()[static_cast<std::size_t>(n.tensor)];
        return {t.lo, t.hi};
      }
      case ModOp::add:
        return {sum(id, at(0).lo, at(1).lo), sum(id, at(0).hi, at(1).hi)};
      case ModOp::sub:
        return {sum(id, at(0).lo, negate(id, at(1).hi)), sum(id, at(0).hi, negate(id, at(1).lo))};
      case ModOp::neg:
        return {negate(id, at(0).hi), negate(id, at(0).lo)};
      case ModOp::mul:
        return corners(id, at(0), at(1),
                       [&](std::int64_t x, std::int64_t y) { return product(id, x, y); });
      case ModOp::minimum:
        return {std::min(at(0).lo, at(1).lo), std::min(at(0).hi, at(1).hi)};
      case ModOp::maximum:
        return {std::max(at(0).lo, at(1).lo), std::max(at(0).hi, at(1).hi)};
      case ModOp::abs: {
        const ModRange a = at(0);
        const std::int64_t top = std::max(negate(id, a.lo), a.hi);
        if (a.lo >= 0) return a;
        if (a.hi <= 0) return {negate(id, a.hi), negate(id, a.lo)};
        return {0, top};
      }
      case ModOp::floor_div:
        nonzero(id, at(1));
        return corners(id, at(0), at(1), [&](std::int64_t x, std::int64_t y) {
          require(!(x == std::numeric_limits<std::int64_t>::min() && y == -1), what_, p_.render(id),
                  "may overflow int64");
          return detail::floor_div(x, y);
        });
      case ModOp::mod: {
        const ModRange b = at(1);
        nonzero(id, b);
        if (b.lo > 0) {
          const ModRange a = at(0);
          if (a.lo >= 0 && a.hi < b.lo) return a;  // a % b = a
          return {0, b.hi - 1};
        }
        return {b.lo + 1, 0};
      }
      case ModOp::where:
        return {std::min(at(1).lo, at(2).lo), std::max(at(1).hi, at(2).hi)};
      default:  // booleans and the rest: no bound needed beyond [0, 1]
        return {0, 1};
    }
  }

 private:
  std::int64_t sum(std::int32_t id, std::int64_t x, std::int64_t y) const {
    std::int64_t s = 0;
    require(!__builtin_add_overflow(x, y, &s), what_, p_.render(id), "may overflow int64");
    return s;
  }
  std::int64_t negate(std::int32_t id, std::int64_t x) const {
    require(x != std::numeric_limits<std::int64_t>::min(), what_, p_.render(id),
            "may overflow int64");
    return -x;
  }
  std::int64_t product(std::int32_t id, std::int64_t x, std::int64_t y) const {
    std::int64_t s = 0;
    require(!__builtin_mul_overflow(x, y, &s), what_, p_.render(id), "may overflow int64");
    return s;
  }
  void nonzero(std::int32_t id, const ModRange& b) const {
    require(b.lo > 0 || b.hi < 0, what_, p_.render(id),
            "divides by " + p_.render(p_.node(id).arg[1]) + ", which may be 0 (it takes [" +
                std::to_string(b.lo) + ", " + std::to_string(b.hi) + "])");
  }
  /// The range of f over the box a × b, for f monotone in each argument on
  /// the box (products; floor division by a divisor of one sign).
  template <class F>
  static ModRange corners(std::int32_t, const ModRange& a, const ModRange& b, F f) {
    const std::int64_t v[4] = {f(a.lo, b.lo), f(a.lo, b.hi), f(a.hi, b.lo), f(a.hi, b.hi)};
    return {*std::min_element(v, v + 4), *std::max_element(v, v + 4)};
  }

  const ModProgram& p_;
  const std::string& what_;
};

}  // namespace detail

inline std::vector<ModRange> check_mod(const ModProgram& p, ModRole role, const ModDomain& domain,
                                       const std::string& what) {
  require(domain.B >= 1 && domain.H >= 1 && domain.Sq >= 1 && domain.Sk >= 1, what, "domain",
          "needs B, H, Sq and Sk >= 1");
  require(p.result() >= 0, what, "no result", "must return a node (set_result)");
  const ModNode& out = p.node(p.result());
  if (role == ModRole::score_mod) {
    require(out.type == ModType::real, what, p.render(p.result()),
            std::string("must return a real score, not a ") + to_string(out.type));
  } else {
    require(out.type == ModType::boolean, what, p.render(p.result()),
            std::string("must return a boolean, not a ") + to_string(out.type));
    require(!p.reads(ModOp::score, p.result()), what, p.render(p.result()),
            "must not read score (a mask_mod sees b, h, q_idx and kv_idx only)");
  }
  std::vector<ModRange> r(p.nodes().size());
  const detail::ModRanges ranges(p, what);
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(p.nodes().size()); ++id) {
    const ModNode& n = p.node(id);
    if (n.type != ModType::real) r[static_cast<std::size_t>(id)] = ranges.of(id, r, domain);
    if (n.op != ModOp::load) continue;
    const auto& t = p.tensors()[static_cast<std::size_t>(n.tensor)];
    for (std::size_t a = 0; a < t.shape.size(); ++a) {
      const ModRange x = r[static_cast<std::size_t>(n.index[a])];
      require(x.lo >= 0 && x.hi < t.shape[a], what, p.render(id),
              "reads outside " + t.name + ": index " + std::to_string(a) + " (" +
                  p.render(n.index[a]) + ") takes [" + std::to_string(x.lo) + ", " +
                  std::to_string(x.hi) + "] over the call, and axis " + std::to_string(a) +
                  " has extent " + std::to_string(t.shape[a]));
    }
  }
  return r;
}

// ---------------------------------------------------------------------------
// differentiate: reverse mode over the node list

namespace detail {

/// Builds the adjoints of f's real nodes into g, back to front.
class ModAdjoints {
 public:
  explicit ModAdjoints(const ModProgram& f) : g_(f), adj_(f.nodes().size(), -1) {}

  ModGradient run() {
    const std::int32_t out = g_.result();
    adj_[static_cast<std::size_t>(out)] = g_.real(1.0).id;
    for (std::int32_t id = out; id >= 0; --id) {
      const std::int32_t a = adj_[static_cast<std::size_t>(id)];
      if (a >= 0) pull(id, a);
    }
    ModGradient grad;
    grad.d_score = d_score_;
    grad.loads = loads_;
    grad.program = std::move(g_);
    return grad;
  }

 private:
  ModValue v(std::int32_t id) { return {&g_, id}; }
  ModValue mul(ModValue x, ModValue y) {
    if (is_one(x.id)) return y;
    if (is_one(y.id)) return x;
    return x * y;
  }
  bool is_one(std::int32_t id) const {
    const ModNode& n = g_.node(id);
    return n.op == ModOp::constant && n.type == ModType::real && n.value == 1.0;
  }
  /// adj[x] += d (reals only: integers and booleans carry no gradient).
  void add_to(std::int32_t x, ModValue d) {
    if (g_.node(x).type != ModType::real) return;
    auto& slot = adj_[static_cast<std::size_t>(x)];
    slot = slot < 0 ? d.id : (v(slot) + d).id;
  }

  /// Passes adjoint a of node id to its operands (the chain rule of op).
  void pull(std::int32_t id, std::int32_t a_id) {
    const ModNode n = g_.node(id);
    const ModValue a = v(a_id), x = v(n.arg[0]), y = v(n.arg[1]), self = v(id);
    const ModValue zero = g_.real(0.0), one = g_.real(1.0);
    switch (n.op) {
      case ModOp::score:
        d_score_ = a_id;
        break;
      case ModOp::load:
        if (n.type == ModType::real) loads_.push_back({id, a_id});
        break;
      case ModOp::add:  // d(x + y) = dx + dy
        add_to(x.id, a);
        add_to(y.id, a);
        break;
      case ModOp::sub:  // d(x − y) = dx − dy
        add_to(x.id, a);
        add_to(y.id, -a);
        break;
      case ModOp::mul:  // d(x·y) = y dx + x dy
        add_to(x.id, mul(a, y));
        add_to(y.id, mul(a, x));
        break;
      case ModOp::div:  // d(x/y) = dx/y − (x/y)/y dy
        add_to(x.id, a / y);
        add_to(y.id, -(mul(a, self) / y));
        break;
      case ModOp::neg:
        add_to(x.id, -a);
        break;
      case ModOp::minimum:  // the first operand on a tie
        add_to(x.id, g_.apply(ModOp::where, x <= y, a, zero));
        add_to(y.id, g_.apply(ModOp::where, x <= y, zero, a));
        break;
      case ModOp::maximum:
        add_to(x.id, g_.apply(ModOp::where, x >= y, a, zero));
        add_to(y.id, g_.apply(ModOp::where, x >= y, zero, a));
        break;
      case ModOp::abs:  // d|x| = sign(x) dx, sign(0) = 0
        if (n.type == ModType::real) {
          add_to(x.id,
                 g_.apply(ModOp::where, x > zero, a, g_.apply(ModOp::where, x < zero, -a, zero)));
        }
        break;
      case ModOp::exp:  // d e^x = e^x dx
        add_to(x.id, mul(a, self));
        break;
      case ModOp::log:  // d log x = dx / x
        add_to(x.id, a / x);
        break;
      case ModOp::tanh:  // d tanh x = (1 − tanh² x) dx
        add_to(x.id, mul(a, one - self * self));
        break;
      case ModOp::sigmoid:  // d σ(x) = σ(x)(1 − σ(x)) dx
        add_to(x.id, mul(a, self * (one - self)));
        break;
      case ModOp::where: {  // the operand chosen
        const ModValue c = x, t = y, e = v(n.arg[2]);
        add_to(t.id, g_.apply(ModOp::where, c, a, zero));
        add_to(e.id, g_.apply(ModOp::where, c, zero, a));
        break;
      }
      default:  // constants, to_real and integer ops: no real operand
        break;
    }
  }

  ModProgram g_;
  std::vector<std::int32_t> adj_;
  std::int32_t d_score_ = -1;
  std::vector<ModGradient::Load> loads_;
};

}  // namespace detail

inline ModGradient differentiate(const ModProgram& f) {
  require(f.result() >= 0, "score_mod", "no result", "must return a node (set_result)");
  require(f.node(f.result()).type == ModType::real, "score_mod", f.render(f.result()),
          "must return a real to be differentiated");
  return detail::ModAdjoints(f).run();
}

}  // namespace tandem
