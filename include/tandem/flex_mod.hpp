// SPDX-License-Identifier: Apache-2.0
/// @file flex_mod.hpp
/// @brief The mod language of programmable attention (SPEC §13): a small
///        typed expression IR for FlexAttention's `score_mod(score, b, h,
///        q_idx, kv_idx)` and `mask_mod(b, h, q_idx, kv_idx)`, defined once
///        here and interpreted by each backend.
///
/// A ModProgram is a list of nodes in evaluation order: each node reads only
/// nodes before it, so the list is its own topological order and a backend
/// evaluates it front to back. Its leaves are the inputs (score, b, h, q_idx,
/// kv_idx), constants and elements of captured tensors (`bias[h, q_idx −
/// kv_idx]`). Values have one of three types: real (the backend's scalar
/// type: float, double, complex for complex-step gradients), integer (int64)
/// and boolean. The builder checks types as each node is added, so an
/// ill-typed program cannot be built; check_mod() checks, once per plan, that
/// no index can leave its tensor and no integer division can divide by zero
/// over the call's ranges of b, h, q_idx and kv_idx (interval arithmetic),
/// and differentiate() derives the program's gradient symbolically
/// (∂f/∂score and ∂f/∂ every element of a real tensor it reads).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "tandem/error.hpp"
#include "tandem/indices.hpp"

namespace tandem {

/// The type of a mod value (SPEC §13.1).
enum class ModType : std::uint8_t {
  real,     ///< the backend's scalar type (float in the optimized backend)
  integer,  ///< int64
  boolean,  ///< true or false
};

/// "real", "integer", "boolean".
constexpr const char* to_string(ModType t) {
  switch (t) {
    case ModType::real:
      return "real";
    case ModType::integer:
      return "integer";
    case ModType::boolean:
      return "boolean";
  }
  return "?";
}

/// The operations of the mod language (SPEC §13.1). Arithmetic takes two
/// operands of one type (real or integer), comparisons two of one type and
/// give a boolean; integer division and remainder round toward −inf (Python's
/// `//` and `%`, what torch does for integer tensors).
enum class ModOp : std::uint8_t {
  score,     ///< the scaled score s = scale·<q, k> (real; score_mod only)
  batch,     ///< b, the batch entry (integer)
  head,      ///< h, the query head (integer; GQA's query head, not its kv head)
  q_idx,     ///< the query's index along Sq (integer)
  kv_idx,    ///< the key's index along Sk (integer)
  constant,  ///< a real, integer or boolean constant
  load,      ///< tensor[i0, i1, …]: an element of a captured tensor
  add,
  sub,
  mul,
  div,  ///< real division
  neg,
  minimum,
  maximum,
  abs,
  floor_div,  ///< integer a // b, rounding toward −inf
  mod,        ///< integer a % b, the sign of b (a − b·(a // b))
  exp,
  log,
  tanh,
  sigmoid,
  to_real,  ///< integer or boolean (false 0, true 1) to real
  lt,
  le,
  gt,
  ge,
  eq,
  ne,
  logical_and,
  logical_or,
  logical_not,
  where,  ///< where(c, x, y): x where c, else y (x, y of one type)
};

/// The operation's name as the mod language spells it ("add", "floor_div").
constexpr const char* to_string(ModOp op) {
  constexpr std::array<const char*, 33> names = {
      "score",       "b",          "h",           "q_idx", "kv_idx", "constant", "load",
      "add",         "sub",        "mul",         "div",   "neg",    "minimum",  "maximum",
      "abs",         "floor_div",  "mod",         "exp",   "log",    "tanh",     "sigmoid",
      "to_real",     "lt",         "le",          "gt",    "ge",     "eq",       "ne",
      "logical_and", "logical_or", "logical_not", "where", "?"};
  const auto i = static_cast<std::size_t>(op);
  return i < names.size() - 1 ? names[i] : "?";
}

/// Highest rank of a captured tensor.
inline constexpr int kModMaxRank = 4;

/// One node of a ModProgram: an operation on earlier nodes.
struct ModNode {
  ModOp op = ModOp::constant;                   ///< what it computes
  ModType type = ModType::real;                 ///< the type of its value (derived by the builder)
  std::array<std::int32_t, 3> arg{-1, -1, -1};  ///< operand nodes (ids below this node's)
  double value = 0.0;                           ///< a real constant
  std::int64_t ivalue = 0;                      ///< an integer constant, or a boolean one (0 or 1)
  std::int32_t tensor = -1;                     ///< load: the captured tensor it reads
  std::array<std::int32_t, kModMaxRank> index{-1, -1, -1, -1};  ///< load: its index nodes

  /// Field-wise equality (the builder's hash-consing compares nodes).
  friend bool operator==(const ModNode&, const ModNode&) = default;
};

/// A tensor captured by a mod, row-major and contiguous: `shape`, its element
/// type (real: the call's scalar type; integer: int32 or int64 storage) and,
/// for an integer tensor, the range [lo, hi] its values are declared to lie
/// in (the plan's index checks rely on it; each call checks the values).
struct ModTensor {
  std::string name;                 ///< how errors and render() name it ("bias")
  std::vector<std::int64_t> shape;  ///< rank 1 to kModMaxRank, every extent >= 1
  ModType type = ModType::real;     ///< real or integer
  std::int64_t lo = 0;              ///< integer tensors: the least value
  std::int64_t hi = 0;              ///< integer tensors: the greatest value

  /// Number of elements (overflow-checked by ModProgram::capture).
  [[nodiscard]] std::int64_t size() const {
    std::int64_t n = 1;
    for (const auto e : shape) n *= e;
    return n;
  }
};

/// The data of the tensors a program captured, in capture order: a real
/// tensor's elements in the call's scalar type T (row-major, its shape), an
/// integer tensor's as Indices (int32 or int64); the other view is empty.
template <class T>
struct ModCaptures {
  std::vector<std::span<const T>> real;  ///< one per tensor (empty for an integer one)
  std::vector<Indices> integer;          ///< one per tensor (empty for a real one)
};

class ModProgram;

/// A handle to a node of a program being built, for writing mods as
/// expressions: `m.apply(ModOp::where, m.q_idx() >= m.kv_idx(), s, m.real(-INFINITY))`.
/// Arithmetic mixing real and integer operands converts the integer one
/// (to_real), as torch promotes an integer tensor against a float one.
struct ModValue {
  ModProgram* program = nullptr;  ///< the program the node belongs to
  std::int32_t id = -1;           ///< the node
};

/// A mod: its nodes, the tensors it captured and the node it returns.
class ModProgram {
 public:
  ///@{
  /// The inputs, as nodes (each made once).
  ModValue score() { return leaf(ModOp::score, ModType::real); }
  ModValue b() { return leaf(ModOp::batch, ModType::integer); }
  ModValue h() { return leaf(ModOp::head, ModType::integer); }
  ModValue q_idx() { return leaf(ModOp::q_idx, ModType::integer); }
  ModValue kv_idx() { return leaf(ModOp::kv_idx, ModType::integer); }
  ///@}
  ///@{
  /// Constants. Throws Error for a NaN real constant.
  ModValue real(double x);
  ModValue integer(std::int64_t x);
  ModValue boolean(bool x);
  ///@}

  /// Captures tensor `t` and returns its number (for load()). Throws Error
  /// for a rank outside 1…4, an extent < 1, an element count that overflows,
  /// a boolean tensor, or an integer tensor with lo > hi.
  std::int32_t capture(ModTensor t);

  /// tensor[index…]: one integer index per axis of the tensor.
  ModValue load(std::int32_t tensor, std::initializer_list<ModValue> index);
  /// tensor[index…] with the index given as node ids of this program.
  ModValue load(std::int32_t tensor, std::span<const std::int32_t> index);

  /// Adds `op` on operands a, b, c (−1: absent) and returns it, after
  /// checking the operand count and types (Error names the operation and the
  /// types it got). An identical node already present is returned instead.
  ModValue apply(ModOp op, std::int32_t a, std::int32_t b = -1, std::int32_t c = -1);
  /// As above, on handles, converting an integer operand of arithmetic,
  /// comparison, minimum, maximum and where to real when the other is real.
  ModValue apply(ModOp op, ModValue a, ModValue b = {}, ModValue c = {});

  ///@{
  /// The node returned by the mod.
  void set_result(ModValue v);
  void set_result(std::int32_t id);
  [[nodiscard]] std::int32_t result() const { return result_; }
  ///@}

  ///@{
  /// The nodes and the captured tensors.
  [[nodiscard]] const std::vector<ModNode>& nodes() const { return nodes_; }
  [[nodiscard]] const std::vector<ModTensor>& tensors() const { return tensors_; }
  [[nodiscard]] const ModNode& node(std::int32_t id) const {
    return nodes_[static_cast<std::size_t>(id)];
  }
  ///@}
  /// True when nothing was built (a call without this mod).
  [[nodiscard]] bool empty() const { return nodes_.empty(); }
  /// True when the value of node `id` depends on the leaf `op`.
  [[nodiscard]] bool reads(ModOp op, std::int32_t id) const;

  /// Adds a node given by its fields (how a program arrives from Python): the
  /// operands must be earlier nodes, the type is derived (the node's own is
  /// ignored). Returns its id.
  std::int32_t add(const ModNode& n);

  /// Infix text of node `id` for messages: "bias[h, ((q_idx - kv_idx) + 7)]";
  /// operands nested deeper than `depth` print as their node ("%12").
  [[nodiscard]] std::string render(std::int32_t id, int depth = 6) const;

 private:
  ModValue leaf(ModOp op, ModType type);
  ModValue handle(std::int32_t id) { return {this, id}; }
  std::int32_t intern(ModNode n);
  std::int32_t promoted(std::int32_t id, ModType to);

  std::vector<ModNode> nodes_;
  std::vector<ModTensor> tensors_;
  std::int32_t result_ = -1;
};

///@{
/// Expression operators on handles of one program (ModProgram::apply).
inline ModValue operator+(ModValue a, ModValue b) {
  return a.program->apply(ModOp::add, a, b);
}
inline ModValue operator-(ModValue a, ModValue b) {
  return a.program->apply(ModOp::sub, a, b);
}
inline ModValue operator*(ModValue a, ModValue b) {
  return a.program->apply(ModOp::mul, a, b);
}
inline ModValue operator/(ModValue a, ModValue b) {
  return a.program->apply(ModOp::div, a, b);
}
inline ModValue operator-(ModValue a) {
  return a.program->apply(ModOp::neg, a);
}
inline ModValue operator<(ModValue a, ModValue b) {
  return a.program->apply(ModOp::lt, a, b);
}
inline ModValue operator<=(ModValue a, ModValue b) {
  return a.program->apply(ModOp::le, a, b);
}
inline ModValue operator>(ModValue a, ModValue b) {
  return a.program->apply(ModOp::gt, a, b);
}
inline ModValue operator>=(ModValue a, ModValue b) {
  return a.program->apply(ModOp::ge, a, b);
}
inline ModValue operator==(ModValue a, ModValue b) {
  return a.program->apply(ModOp::eq, a, b);
}
inline ModValue operator!=(ModValue a, ModValue b) {
  return a.program->apply(ModOp::ne, a, b);
}
inline ModValue operator&&(ModValue a, ModValue b) {
  return a.program->apply(ModOp::logical_and, a, b);
}
inline ModValue operator||(ModValue a, ModValue b) {
  return a.program->apply(ModOp::logical_or, a, b);
}
inline ModValue operator!(ModValue a) {
  return a.program->apply(ModOp::logical_not, a);
}
///@}

/// The ranges of the inputs over one call: 0 <= b < B, 0 <= h < H,
/// 0 <= q_idx < Sq, 0 <= kv_idx < Sk.
struct ModDomain {
  std::int64_t B = 1;   ///< batch size (>= 1)
  std::int64_t H = 1;   ///< query heads (>= 1)
  std::int64_t Sq = 1;  ///< query rows (>= 1)
  std::int64_t Sk = 1;  ///< keys (>= 1)
};

/// What a program is for: a score_mod returns a real; a mask_mod returns a
/// boolean and does not read score.
enum class ModRole : std::uint8_t { score_mod, mask_mod };

/// The closed range [lo, hi] an integer or boolean node takes over a domain.
struct ModRange {
  std::int64_t lo = 0;  ///< least value
  std::int64_t hi = 0;  ///< greatest value
};

/// Checks program `p` for `role` over `domain` (SPEC §13.2): the result's
/// type, score read only by a score_mod, every load's index within its
/// tensor, no integer division or remainder by a divisor that can be 0, and
/// no integer value that can overflow int64. Returns the range of every node
/// (lo = hi = 0 for reals). Throws Error naming `what` ("score_mod") and the
/// expression (ModProgram::render) that fails.
std::vector<ModRange> check_mod(const ModProgram& p, ModRole role, const ModDomain& domain,
                                const std::string& what);

/// The gradient of a score_mod f(score, captured tensors), as nodes added to
/// a copy of f (SPEC §13.3): `d_score` = ∂f/∂score (−1 when f does not depend
/// on score: the derivative is 0), and for each load of a real tensor the
/// node ∂f/∂(that element), so that a backend adds `ds · ∂f/∂t[index]` to
/// dt[index] for each load (a tensor read twice has two loads). Integer and
/// boolean nodes carry no gradient; where() passes it to the operand it
/// chose; minimum and maximum to the first operand on a tie; abs has
/// derivative 0 at 0 (sign(0) = 0, as torch).
struct ModGradient {
  ModProgram program;         ///< f's nodes, then the derivative's
  std::int32_t d_score = -1;  ///< ∂f/∂score, −1 for 0
  /// A load of a real tensor and the node holding ∂f/∂ the element it read.
  struct Load {
    std::int32_t node = -1;  ///< the load (its tensor and index nodes)
    std::int32_t d = -1;     ///< ∂f/∂ that element
  };
  std::vector<Load> loads;  ///< one per load of a real tensor that f depends on
};

/// Differentiates score_mod `f` (a program checked by check_mod).
ModGradient differentiate(const ModProgram& f);

}  // namespace tandem

#include "tandem/flex_mod_impl.hpp"
