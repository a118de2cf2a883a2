# SPDX-License-Identifier: Apache-2.0
"""Random score_mods and mask_mods as Python source (tandem.testing's
FlexAttention strategies, SPEC §13).

A program is a list of instructions, each an operation of SPEC §13.1 on
earlier values (their picks taken modulo the values of the type it wants),
as props/mod_gen.cpp draws them in C++: Hypothesis shrinks a list toward
fewer and simpler instructions, so a failing mod shrinks toward a small one.
The program's result is its last value of the wanted type (real for a
score_mod, boolean for a mask_mod); instructions the result does not read
are left out of the source. Every value stays bounded (products by
constants or by a tanh, exp of a tanh, a quotient by 1 + |y|), integers
never overflow, and captured tensors are read at clamped indices, so each
program passes SPEC §13.2 at every shape. Alongside the source, each
program bounds the float64 rounding error of its result (`error_bound`).
"""

import math

from hypothesis import strategies as st

#: Operations by name: (result type, operand types, source template, the
#: roles that draw it). r real, i integer, c boolean; {k} is a small
#: constant. A mask_mod's reals are table entries and exact operations on
#: them, so two implementations round them alike and compare them alike;
#: a score_mod's reals carry the score's rounding, so a score_mod compares
#: them with constants only (a comparison of two reals that are equal in
#: exact arithmetic would flip with the last bit of the score).
OPS = {
    "add": ("r", "rr", "({0} + {1})", "sm"),
    "sub": ("r", "rr", "({0} - {1})", "sm"),
    "add_int": ("r", "ri", "({0} + {1})", "sm"),
    "add_const": ("r", "r", "({0} + {k})", "sm"),
    "mul_const": ("r", "r", "({0} * {k})", "sm"),
    "mul_tanh": ("r", "rr", "({0} * torch.tanh({1}))", "s"),
    "div": ("r", "rr", "({0} / (1.0 + torch.abs({1})))", "s"),
    "minimum": ("r", "rr", "torch.minimum({0}, {1})", "sm"),
    "maximum": ("r", "rr", "torch.maximum({0}, {1})", "sm"),
    "abs": ("r", "r", "torch.abs({0})", "sm"),
    "neg": ("r", "r", "(-{0})", "sm"),
    "tanh": ("r", "r", "torch.tanh({0})", "s"),
    "exp_tanh": ("r", "r", "torch.exp(torch.tanh({0}))", "s"),
    "where": ("r", "crr", "torch.where({0}, {1}, {2})", "sm"),
    "table": ("r", "i", "table[torch.clamp({0}, 0, {n_table_1})]", "sm"),
    "iadd": ("i", "ii", "({0} + {1})", "sm"),
    "isub": ("i", "ii", "({0} - {1})", "sm"),
    "imul_const": ("i", "i", "({0} * {ik})", "sm"),
    "ifloordiv": ("i", "i", "({0} // {ik})", "sm"),
    "imod": ("i", "i", "({0} % {ik})", "sm"),
    "iminimum": ("i", "ii", "torch.minimum({0}, {1})", "sm"),
    "imaximum": ("i", "ii", "torch.maximum({0}, {1})", "sm"),
    "iabs": ("i", "i", "torch.abs({0})", "sm"),
    "iwhere": ("i", "cii", "torch.where({0}, {1}, {2})", "sm"),
    "ids": ("i", "i", "ids[torch.clamp({0}, 0, {n_ids_1})]", "sm"),
    "lt": ("c", "ii", "({0} < {1})", "sm"),
    "le": ("c", "ii", "({0} <= {1})", "sm"),
    "eq": ("c", "ii", "({0} == {1})", "sm"),
    "ne": ("c", "ii", "({0} != {1})", "sm"),
    "ge_const": ("c", "i", "({0} >= {ik})", "sm"),
    "rgt": ("c", "rr", "({0} > {1})", "m"),
    "rgt_const": ("c", "r", "({0} > {k})", "sm"),
    "and": ("c", "cc", "({0} & {1})", "sm"),
    "or": ("c", "cc", "({0} | {1})", "sm"),
    "not": ("c", "c", "(~{0})", "sm"),
}
#: The real constants (exact in binary) and the positive integer constants.
REALS = (0.5, -1.5, 2.0, 0.25)
INTEGERS = (2, 3, 5)
U64 = 2.0 ** -53


@st.composite
def instructions(draw, role, max_size=6):
    """[(op, picks, constant index)]: a program of `role` ("score_mod" or
    "mask_mod"); simplest first (few instructions, the first operations)."""
    ops = [name for name, op in OPS.items() if role[0] in op[3]]
    if role == "score_mod":  # reads of the captured table often: its gradient is checked
        ops += ["table"] * 3
    one = st.tuples(st.sampled_from(ops), st.tuples(*[st.integers(0, 7)] * 3),
                    st.integers(0, len(REALS) - 1))
    return draw(st.lists(one, max_size=max_size))


class Program:
    """A program of `role` over the call (B, H, Sq, Sk) with a float table
    of n_table elements and an integer id table of n_ids elements (values in
    [0, id_max]): its source (`source`, a def named after the role), the
    names it reads, and a float64 error bound of its result."""

    def __init__(self, role, code, n_table, n_ids, id_max):
        self.role, self.code = role, tuple(tuple(x) if isinstance(x, list) else x for x in code)
        self.n_table, self.n_ids, self.id_max = n_table, n_ids, id_max
        leaves = ["b", "h", "q_idx", "kv_idx"]
        self.values = [("score", "r")] if role == "score_mod" else []
        self.values += [(name, "i") for name in leaves]
        self.nodes = []  # (op, operand value numbers, constant index)
        for op, picks, k in code:
            rtype, types, _, _ = OPS[op]
            of = {t: [n for n, (_, vt) in enumerate(self.values) if vt == t] for t in "ric"}
            if any(not of[t] for t in types):
                continue  # no value of a wanted type yet: the instruction is inert
            args = [of[t][p % len(of[t])] for t, p in zip(types, picks)]
            self.nodes.append((op, args, k))
            self.values.append((f"v{len(self.nodes) - 1}", rtype))
        want = "r" if role == "score_mod" else "c"
        last = [n for n, (_, t) in enumerate(self.values) if t == want]
        self.result = last[-1] if last else None
        self.source = self._source(leaves)

    def _expr(self, n):
        return self.values[n][0]

    def _text(self, node):
        op, args, k = node
        return OPS[op][2].format(*(self._expr(a) for a in args), k=REALS[k],
                                 ik=INTEGERS[k % len(INTEGERS)], n_table_1=self.n_table - 1,
                                 n_ids_1=self.n_ids - 1)

    def _live(self):
        """The node numbers the result reads (in order)."""
        first = len(self.values) - len(self.nodes)
        live, todo = set(), [self.result] if self.result is not None else []
        while todo:
            n = todo.pop()
            if n >= first and n - first not in live:
                live.add(n - first)
                todo.extend(self.nodes[n - first][1])
        return sorted(live)

    def _source(self, leaves):
        args = (["score"] if self.role == "score_mod" else []) + leaves
        lines = [f"def {self.role}({', '.join(args)}):"]
        for i in self._live():
            lines.append(f"    v{i} = {self._text(self.nodes[i])}")
        if self.result is None:  # no result of the wanted type: score, or causal
            lines.append("    return score" if self.role == "score_mod" else
                         "    return q_idx >= kv_idx")
        else:
            lines.append(f"    return {self._expr(self.result)}")
        return "\n".join(lines) + "\n"

    def canonical(self):
        """The code of the same program without the instructions its result
        does not read (inert or dead), picks renumbered: what a case keeps."""
        first = len(self.values) - len(self.nodes)
        live = self._live()
        kept = {}  # old value number -> new one
        types = [t for _, t in self.values[:first]]
        for n in range(first):
            kept[n] = n
        code = []
        for i in live:
            op, args, k = self.nodes[i]
            picks = []
            for a in args:
                same = [m for m, t in enumerate(types) if t == self.values[a][1]]
                picks.append(same.index(kept[a]))
            code.append((op, tuple(picks + [0] * (3 - len(picks))), k))
            kept[first + i] = len(types)
            types.append(self.values[first + i][1])
        return tuple(code)

    def reads(self, name):
        """Whether the source reads the captured tensor `name`."""
        return f"{name}[" in self.source

    def error_bound(self, score, score_error, table, shape, values=None):
        """(max |result|, max |rounding error of the result|) in float64 for
        |score| <= `score`, its error <= `score_error`, |table| <= `table`
        and indices over `shape` (B, H, Sq, Sk): first-order forward error
        analysis node by node (each operation rounds once, u = 2^-53;
        tanh, exp and the quotient are 1-Lipschitz on their bounded
        arguments up to the factors below, and libm's are within 2 u)."""
        u = U64
        mag = [(score, score_error)] if self.role == "score_mod" else []
        if values is not None:
            mag = values
            mag += [(score, score_error)] if self.role == "score_mod" else []
        mag += [(float(s - 1), 0.0) for s in shape]
        for op, args, k in self.nodes:
            (a, ea), (b, eb), (c, _) = ([mag[x] for x in args] + [(0.0, 0.0)] * 3)[:3]
            ik = INTEGERS[k % len(INTEGERS)]
            if op in ("add", "sub", "iadd", "isub"):
                m, e = a + b, ea + eb + u * (a + b)
            elif op == "add_int":
                m, e = a + b, ea + u * (a + b)
            elif op == "add_const":
                m, e = a + abs(REALS[k]), ea + u * (a + abs(REALS[k]))
            elif op == "mul_const":
                m, e = a * abs(REALS[k]), ea * abs(REALS[k])  # powers of 2 or 1.5: one rounding
                e += u * m
            elif op == "mul_tanh":
                m, e = a, ea + a * (eb + 2 * u) + u * a
            elif op == "div":
                m, e = a, ea + a * (eb + 2 * u) + 2 * u * a
            elif op in ("minimum", "maximum", "where", "iminimum", "imaximum", "iwhere"):
                m, e = (max(a, b), max(ea, eb)) if op[-5:] != "where" else (max(b, c), max(
                    mag[args[1]][1], mag[args[2]][1]))
            elif op in ("abs", "neg", "iabs"):
                m, e = a, ea
            elif op == "tanh":
                m, e = min(a, 1.0), ea + 2 * u
            elif op == "exp_tanh":
                m, e = math.e, math.e * (ea + 4 * u)
            elif op == "table":
                m, e = table, 0.0
            elif op == "imul_const":
                m, e = a * ik, 0.0
            elif op == "ifloordiv":
                m, e = a, 0.0
            elif op == "imod":
                m, e = float(ik - 1), 0.0
            elif op == "ids":
                m, e = float(self.id_max), 0.0
            else:  # booleans
                m, e = 1.0, 0.0
            mag.append((m, e))
        if self.result is None:
            return (score, score_error) if self.role == "score_mod" else (1.0, 0.0)
        return mag[self.result]

    def slope_bound(self, score, table, shape):
        """A bound of |d result / d score| (the chain rule of SPEC §13.3 node
        by node, with the magnitudes of error_bound; 0 for a mask_mod)."""
        return self._derivative_bound(score, table, shape, of_table=False)

    def table_slope_bound(self, score, table, shape):
        """A bound of |d result / d table[e]| for any one entry e: the same
        chain rule with each read of table contributing 1 (a result that
        reads e twice has both reads counted); 0 for a mask_mod."""
        return self._derivative_bound(score, table, shape, of_table=True)

    def _derivative_bound(self, score, table, shape, of_table):
        if self.role != "score_mod":
            return 0.0
        mag = [m for m, _ in self._magnitudes(score, table, shape)]
        d = [0.0 if of_table else 1.0] + [0.0] * 4
        for (op, args, k), n in zip(self.nodes, range(5, len(mag))):
            da, db = ([d[x] for x in args] + [0.0, 0.0])[:2]
            if op in ("add", "sub"):
                s = da + db
            elif op in ("add_int", "add_const", "abs", "neg", "tanh"):
                s = da
            elif op == "mul_const":
                s = abs(REALS[k]) * da
            elif op in ("mul_tanh", "div"):
                s = da + mag[args[0]] * db
            elif op == "exp_tanh":
                s = math.e * da
            elif op in ("minimum", "maximum"):
                s = max(da, db)
            elif op == "where":
                s = max(d[args[1]], d[args[2]])
            elif op == "table":
                s = 1.0 if of_table else 0.0
            else:  # integers, booleans
                s = 0.0
            d.append(s)
        if self.result is None:
            return 0.0 if of_table else 1.0
        return d[self.result]

    def _magnitudes(self, score, table, shape):
        """[(max |value|, error)] of every value (error_bound's pass)."""
        out = []
        self.error_bound(score, 0.0, table, shape, out)
        return out
