// SPDX-License-Identifier: Apache-2.0
#include "mod_gen.hpp"

#include <algorithm>

namespace tandem::props {
namespace {

/// The pools of values built so far, by type.
struct Pools {
  std::vector<ModValue> real, integer, boolean;

  static ModValue pick(const std::vector<ModValue>& pool, int i) {
    return pool[static_cast<std::size_t>(i) % pool.size()];
  }
  void push(ModValue v, const ModProgram& p) {
    switch (p.node(v.id).type) {
      case ModType::real:
        real.push_back(v);
        break;
      case ModType::integer:
        integer.push_back(v);
        break;
      case ModType::boolean:
        boolean.push_back(v);
        break;
    }
  }
};

/// The kinds of node an instruction adds.
enum class Kind : int {
  add,
  sub,
  mul,
  div,
  neg,
  minimum,
  maximum,
  abs,
  exp,
  log,
  tanh,
  sigmoid,  // reals
  iadd,
  isub,
  imul,
  ineg,
  imin,
  imax,
  iabs,
  floor_div,
  mod,  // integers
  to_real,
  compare,
  icompare,
  logic,
  lnot,
  where_real,
  where_int,
  load_t,
  load_ids,
  constant,
  count
};

ModValue compare(ModProgram& m, int which, ModValue x, ModValue y) {
  constexpr ModOp ops[] = {ModOp::lt, ModOp::le, ModOp::gt, ModOp::ge, ModOp::eq, ModOp::ne};
  return m.apply(ops[static_cast<std::size_t>(which) % 6], x, y);
}

/// x clamped to [0, hi].
ModValue clamp(ModProgram& m, ModValue x, std::int64_t hi) {
  return m.apply(ModOp::minimum, m.apply(ModOp::maximum, x, m.integer(0)), m.integer(hi));
}

void add_instruction(ModProgram& m, Pools& pools, const ModInstruction& in, std::int32_t t,
                     std::int32_t ids, const ModDomain& d) {
  const auto r = [&](int i) { return Pools::pick(pools.real, i); };
  const auto n = [&](int i) { return Pools::pick(pools.integer, i); };
  const auto bo = [&](int i) { return Pools::pick(pools.boolean, i); };
  const ModValue one = m.real(1.0);
  ModValue v;
  switch (static_cast<Kind>(in.op % static_cast<int>(Kind::count))) {
    case Kind::add:
      v = r(in.a) + r(in.b);
      break;
    case Kind::sub:
      v = r(in.a) - r(in.b);
      break;
    case Kind::mul:
      v = r(in.a) * r(in.b);
      break;
    case Kind::div:
      v = r(in.a) / (one + r(in.b) * r(in.b));
      break;
    case Kind::neg:
      v = -r(in.a);
      break;
    case Kind::minimum:
      v = m.apply(ModOp::minimum, r(in.a), r(in.b));
      break;
    case Kind::maximum:
      v = m.apply(ModOp::maximum, r(in.a), r(in.b));
      break;
    case Kind::abs:
      v = m.apply(ModOp::abs, r(in.a));
      break;
    case Kind::exp:
      v = m.apply(ModOp::exp, m.apply(ModOp::tanh, r(in.a)));
      break;
    case Kind::log:
      v = m.apply(ModOp::log, one + r(in.a) * r(in.a));
      break;
    case Kind::tanh:
      v = m.apply(ModOp::tanh, r(in.a));
      break;
    case Kind::sigmoid:
      v = m.apply(ModOp::sigmoid, r(in.a));
      break;
    case Kind::iadd:
      v = n(in.a) + n(in.b);
      break;
    case Kind::isub:
      v = n(in.a) - n(in.b);
      break;
    case Kind::imul:
      v = n(in.a) * n(in.b);
      break;
    case Kind::ineg:
      v = -n(in.a);
      break;
    case Kind::imin:
      v = m.apply(ModOp::minimum, n(in.a), n(in.b));
      break;
    case Kind::imax:
      v = m.apply(ModOp::maximum, n(in.a), n(in.b));
      break;
    case Kind::iabs:
      v = m.apply(ModOp::abs, n(in.a));
      break;
    case Kind::floor_div:  // by a nonzero constant, of either sign
      v = m.apply(ModOp::floor_div, n(in.a),
                  m.integer(in.constant % 5 >= 0 ? in.constant % 5 + 1 : in.constant % 5));
      break;
    case Kind::mod:
      v = m.apply(ModOp::mod, n(in.a), m.integer(in.constant % 2 == 0 ? 3 : -4));
      break;
    case Kind::to_real:
      v = m.apply(ModOp::to_real, in.b % 2 ? n(in.a) : bo(in.a));
      break;
    case Kind::compare:
      v = compare(m, in.c, r(in.a), r(in.b));
      break;
    case Kind::icompare:
      v = compare(m, in.c, n(in.a), n(in.b));
      break;
    case Kind::logic:
      v = in.c % 2 ? (bo(in.a) && bo(in.b)) : (bo(in.a) || bo(in.b));
      break;
    case Kind::lnot:
      v = !bo(in.a);
      break;
    case Kind::where_real:
      v = m.apply(ModOp::where, bo(in.c), r(in.a), r(in.b));
      break;
    case Kind::where_int:
      v = m.apply(ModOp::where, bo(in.c), n(in.a), n(in.b));
      break;
    case Kind::load_t:
      v = m.load(t, {m.h(), clamp(m, n(in.a), kModTableWidth - 1)});
      break;
    case Kind::load_ids:
      v = m.load(ids, {in.b % 2 ? m.kv_idx() : clamp(m, m.q_idx(), d.Sk - 1)});
      break;
    case Kind::constant:
      v = in.b % 2 ? m.integer(in.constant % 7) : m.real(0.25 * (in.constant % 9));
      break;
    case Kind::count:
      break;
  }
  pools.push(v, m);
}

}  // namespace

ModProgram build_mod(const ModCase& c) {
  ModProgram m;
  const std::int32_t t = m.capture({"t", {c.domain.H, kModTableWidth}, ModType::real});
  const std::int32_t ids = m.capture({"ids", {c.domain.Sk}, ModType::integer, 0, kModIdsHi});
  Pools pools;
  if (c.role == ModRole::score_mod) pools.real.push_back(m.score());
  pools.real.push_back(m.real(0.5));
  for (const ModValue v : {m.b(), m.h(), m.q_idx(), m.kv_idx(), m.integer(2)}) {
    pools.integer.push_back(v);
  }
  pools.boolean.push_back(m.q_idx() >= m.kv_idx());
  for (const ModInstruction& in : c.code) add_instruction(m, pools, in, t, ids, c.domain);
  m.set_result(c.role == ModRole::score_mod ? pools.real.back() : pools.boolean.back());
  return m;
}

rc::Gen<ModCase> gen_mod_case(ModRole role, int max_len) {
  return rc::gen::exec([role, max_len] {
    ModCase c;
    c.role = role;
    c.domain = {*rc::gen::inRange<std::int64_t>(1, 3), *rc::gen::inRange<std::int64_t>(1, 4),
                *rc::gen::inRange<std::int64_t>(1, 7), *rc::gen::inRange<std::int64_t>(1, 8)};
    const auto gen_in = rc::gen::exec([] {
      ModInstruction in;
      in.op = *rc::gen::inRange(0, static_cast<int>(Kind::count));
      in.a = *rc::gen::inRange(0, 64);
      in.b = *rc::gen::inRange(0, 64);
      in.c = *rc::gen::inRange(0, 64);
      in.constant = *rc::gen::inRange(-20, 21);
      return in;
    });
    const int len = *rc::gen::inRange(0, max_len + 1);
    c.code =
        *rc::gen::container<std::vector<ModInstruction>>(static_cast<std::size_t>(len), gen_in);
    return c;
  });
}

std::string describe(const ModCase& c) {
  const ModProgram m = build_mod(c);
  return std::string(c.role == ModRole::score_mod ? "score_mod" : "mask_mod") +
         " over B=" + std::to_string(c.domain.B) + " H=" + std::to_string(c.domain.H) +
         " Sq=" + std::to_string(c.domain.Sq) + " Sk=" + std::to_string(c.domain.Sk) + ", " +
         std::to_string(m.nodes().size()) + " nodes: " + m.render(m.result(), 12);
}

ModProgram with_learned_bias(ModProgram f) {
  const ModValue r{&f, f.result()};
  const ModValue i = f.apply(
      ModOp::minimum, f.apply(ModOp::maximum, f.q_idx() - f.kv_idx() + f.integer(3), f.integer(0)),
      f.integer(kModTableWidth - 1));
  f.set_result(r + f.load(0, {f.h(), i}) * f.apply(ModOp::tanh, f.score()));
  return f;
}

}  // namespace tandem::props
