# SPDX-License-Identifier: Apache-2.0
"""The driver of tandem.testing.check_flex_attention: anyone's
FlexAttention (torch's signature) against tandem's reference in float64 on
drawn FlexCases (shapes, block masks, mods drawn by _flex_programs; SPEC
§13.4). The tolerance is stated in check_flex_attention's docstring and
computed by `tolerances`."""

import dataclasses
import math
import re
import textwrap
from typing import Optional

import numpy as np
from hypothesis import strategies as st

from ._flex_programs import U64, Program, instructions
from ._search import shrunk_failure

#: The captured tensors of every drawn mod: `table`, N_TABLE float64
#: entries, and `ids`, N_IDS integers in [0, ID_MAX], both from the seed.
N_TABLE, N_IDS, ID_MAX = 8, 8, 3


class FlexFailure(AssertionError):
    """A FlexAttention disagreed with the reference; `case` is the (shrunk)
    FlexCase and the message holds a pytest test that replays it."""

    def __init__(self, report, case):
        super().__init__(report)
        self.case = case


@dataclasses.dataclass(frozen=True)
class FlexCase:
    """One flex_attention call: q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B,
    Hkv, Sk, Dv] (bhsd, float64), scale (None: 1/sqrt(D)); `block`: None
    (no block mask, so no mask_mod) or (q_block, kv_block) of a block mask
    made by create_block_mask from `mask_mod` over B (None, broadcast, when
    `mask_batch` is False: drawn so only when mask_mod does not read b) and
    H (None when `mask_heads` is False, likewise for h);
    score_mod and mask_mod are programs (instructions of
    tandem.testing.flex_mods, or None), `source(role)` their Python source;
    contents (q, k, v, dout, table, ids) from `seed`."""
    B: int = 1
    H: int = 1
    Hkv: int = 1
    Sq: int = 1
    Sk: int = 1
    D: int = 1
    Dv: int = 1
    scale: Optional[float] = None
    block: Optional[tuple] = None
    mask_batch: bool = False
    mask_heads: bool = False
    score_mod: Optional[tuple] = None
    mask_mod: Optional[tuple] = None
    seed: int = 0

    def tensors(self):
        """q, k, v, dout, table, ids as float64 (ids int64) torch tensors."""
        import torch
        rng = np.random.default_rng(self.seed)

        def t(*shape):
            return torch.from_numpy(rng.standard_normal(shape))
        q, k, v = t(self.B, self.H, self.Sq, self.D), t(self.B, self.Hkv, self.Sk, self.D), \
            t(self.B, self.Hkv, self.Sk, self.Dv)
        dout = t(self.B, self.H, self.Sq, self.Dv)
        table = t(N_TABLE)
        ids = torch.from_numpy(rng.integers(0, ID_MAX + 1, N_IDS))
        return {"q": q, "k": k, "v": v, "dout": dout, "table": table, "ids": ids}

    def program(self, role):
        """The Program of `role` ("score_mod" or "mask_mod"), or None."""
        code = getattr(self, role)
        return None if code is None else Program(role, code, N_TABLE, N_IDS, ID_MAX)

    def source(self, role):
        """The Python source of `role`, or None."""
        prog = self.program(role)
        return None if prog is None else prog.source

    def mods(self, table, ids):
        """(score_mod, mask_mod) as callables reading `table` and `ids`."""
        return (mod_callable(self.source("score_mod"), "score_mod", table, ids),
                mod_callable(self.source("mask_mod"), "mask_mod", table, ids))


def mod_callable(source, role, table, ids):
    """The function `role` that `source` defines, reading torch, `table`
    and `ids` as globals; None for None."""
    if source is None:
        return None
    import torch
    scope = {"torch": torch, "table": table, "ids": ids}
    exec(compile(textwrap.dedent(source), f"<{role}>", "exec"), scope)  # noqa: S102
    fn = scope[role]
    fn.source = textwrap.dedent(source)
    return fn


@st.composite
def flex_mods(draw, role, table, ids, id_max=ID_MAX, max_size=6):
    """score_mods or mask_mods (`role`) as Python functions of torch ops
    reading the float tensor `table` [n] and the integer tensor `ids` [m]
    (values in [0, id_max]), each with its text (`fn.source`) and its
    Program (`fn.program`: the float64 error bound); they shrink toward
    fewer instructions (an empty score_mod returns score, an empty mask_mod
    is causal, q_idx >= kv_idx). Pass them to torch as they are."""
    code = draw(instructions(role, max_size))
    prog = Program(role, code, int(table.numel()), int(ids.numel()), id_max)
    fn = mod_callable(prog.source, role, table, ids)
    fn.program = prog
    return fn


def reads(codes, leaf):
    """Whether the drawn mask_mod reads `leaf` ("b" or "h"): its block mask
    is then made per batch entry (head), as a broadcast one is right only
    for a mask_mod that does not read it."""
    body = Program("mask_mod", codes["mask_mod"], N_TABLE, N_IDS, ID_MAX).source
    return re.search(rf"\b{leaf}\b", body.split(":", 1)[1]) is not None


@st.composite
def flex_cases(draw, gqa=True, v_head_dim=True, scale=True, block_masks=True, score_mods=True,
               max_batch=2, max_heads=4, max_seq=20, max_dim=8, max_block=8, max_size=6):
    """FlexCases; each switch off leaves that feature out. Every choice
    lists its simplest first, so a failure shrinks to B = H = Sq = Sk = D
    = 1, no block mask, no score_mod, unless it needs more."""
    B = draw(st.integers(1, max_batch))
    Hkv = draw(st.integers(1, max_heads))
    group = draw(st.integers(1, max(1, max_heads // Hkv))) if gqa else 1
    Sq, Sk = draw(st.integers(1, max_seq)), draw(st.integers(1, max_seq))
    D = draw(st.integers(1, max_dim))
    Dv = draw(st.integers(1, max_dim)) if v_head_dim else D
    codes = {}
    for role, on in (("score_mod", score_mods), ("mask_mod", block_masks)):
        if on and draw(st.booleans()):
            code = draw(instructions(role, max_size))
            codes[role] = Program(role, code, N_TABLE, N_IDS, ID_MAX).canonical()
    block = None
    if "mask_mod" in codes:
        block = (draw(st.integers(1, max_block)), draw(st.integers(1, max_block)))
    return FlexCase(
        B=B, H=Hkv * group, Hkv=Hkv, Sq=Sq, Sk=Sk, D=D, Dv=Dv,
        scale=draw(st.sampled_from((None, 0.5, 2.0))) if scale else None, block=block,
        mask_batch=block is not None and (reads(codes, "b") or draw(st.booleans())),
        mask_heads=block is not None and (reads(codes, "h") or draw(st.booleans())),
        score_mod=codes.get("score_mod"), mask_mod=codes.get("mask_mod"),
        seed=draw(st.integers(0, 2**32 - 1)))


# ---------------------------------------------------------------------------
# One case


def block_mask_of(case, mask_mod, kind):
    """The case's block mask (None without one): tandem.create_block_mask's,
    as tandem's BlockMask or (kind "torch") torch's, from the same blocks."""
    if case.block is None:
        return None
    from . import flex
    bm = flex.create_block_mask(mask_mod, case.B if case.mask_batch else None,
                                case.H if case.mask_heads else None, case.Sq, case.Sk,
                                BLOCK_SIZE=tuple(case.block))
    if kind == "tandem":
        return bm
    from torch.nn.attention.flex_attention import BlockMask
    return BlockMask.from_kv_blocks(bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks,
                                    bm.full_kv_indices, BLOCK_SIZE=tuple(case.block),
                                    mask_mod=mask_mod, seq_lengths=(case.Sq, case.Sk))


def tolerances(case, t):
    """{name: tolerance} of out, dq, dk, dv and dtable for the case's
    tensors `t` (check_flex_attention's docstring states the bound)."""
    u = U64
    scale = 1 / math.sqrt(case.D) if case.scale is None else case.scale
    qn, kn = (float(t[x].norm(dim=-1).max()) for x in ("q", "k"))
    S = scale * qn * kn
    s_err = (case.D + 2) * u * S
    prog = case.program("score_mod") or Program("score_mod", (), N_TABLE, N_IDS, ID_MAX)
    table = float(t["table"].abs().max())
    shape = (case.B, case.H, case.Sq, case.Sk)
    T, E = prog.error_bound(S, s_err, table, shape)
    F = prog.slope_bound(S, table, shape)
    F_table = prog.table_slope_bound(S, table, shape)
    gamma = lambda n: n * u / (1 - n * u)  # noqa: E731
    eps_e = 2 * E + 2 * u * T + 2 * u        # e^{t - max}: t's and the max's error, exp's
    vmax, dmax = float(t["v"].abs().max()), float(t["dout"].abs().max())
    one = (2 * eps_e + 2 * gamma(case.Sk + 1)) * vmax
    eps_g = 2 * eps_e + 4 * (len(prog.nodes) + 1) * u + 4 * E + gamma(
        case.Sq + case.Sk + case.D + case.Dv + 4)
    G = case.H // case.Hkv
    dt = 2 * case.Dv * dmax * vmax  # |<dO_i, v_j> - <dO_i, o_i>|
    qmax, kmax = float(t["q"].abs().max()), float(t["k"].abs().max())
    rows = case.B * case.H * case.Sq
    mags = {"out": None, "dq": scale * F * dt * kmax, "dk": G * case.Sq * scale * F * dt * qmax,
            "dv": G * case.Sq * dmax, "dtable": rows * F_table * dt}
    tol = {"out": 2 * one}
    for name in ("dq", "dk", "dv"):
        tol[name] = 2 * eps_g * mags[name]
    # dtable sums the score gradients of every row: its own summation error
    tol["dtable"] = 2 * (eps_g + gamma(rows * case.Sk)) * mags["dtable"]
    return tol


def _problem_of(fn, case, check_grads, kind):
    """The first way fn breaks the case, as text; None when it holds."""
    import torch

    from . import flex
    t = case.tensors()
    score_mod, mask_mod = case.mods(t["table"], t["ids"])
    tol = tolerances(case, t)
    gqa = case.H != case.Hkv
    ref_bm = block_mask_of(case, mask_mod, "tandem")
    bm = ref_bm if kind == "tandem" else block_mask_of(case, mask_mod, kind)

    # the captured table's gradient too, when the score_mod reads it
    with_table = check_grads and score_mod is not None and "table[" in case.source("score_mod")

    def run(f, mask):
        q, k, v = (t[x].clone().requires_grad_(check_grads) for x in "qkv")
        table = t["table"].clone().requires_grad_(with_table)
        mod = case.mods(table, t["ids"])[0] if with_table else score_mod
        step = "out"
        try:
            out = f(q, k, v, score_mod=mod, block_mask=mask, scale=case.scale, enable_gqa=gqa)
            grads = {}
            if check_grads:
                step = "the backward"
                wrt = (q, k, v, table) if with_table else (q, k, v)
                grads = dict(zip(("dq", "dk", "dv", "dtable"), torch.autograd.grad(
                    out, wrt, t["dout"], allow_unused=True)))
        except Exception as e:  # noqa: BLE001 - the implementation under test failed
            return None, f"{step}: the implementation raised {type(e).__name__}: {e}"
        return out, grads

    want, want_g = run(flex.flex_attention, ref_bm)
    got, got_g = run(fn, bm)
    if got is None:
        return got_g
    # autograd gives None for an input the output does not depend on: 0
    results = [("out", got, want)]
    for n, w in want_g.items():
        w = torch.zeros_like(t[n[1:]]) if w is None else w
        results.append((n, torch.zeros_like(w) if got_g[n] is None else got_g[n], w))
    for name, g, w in results:
        p = _compare(name, g, w.detach(), tol[name])
        if p:
            return p
    return None


def _compare(name, got, want, tol):
    if not hasattr(got, "detach"):
        return f"{name}: returned {type(got).__name__}, expected a torch.Tensor"
    got = got.detach().to(want.dtype)
    if tuple(got.shape) != tuple(want.shape):
        return f"{name}: shape {list(got.shape)}, expected {list(want.shape)}"
    bad = ~got.isfinite()
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        return f"{name}: non-finite value {float(got[idx])} at index {idx} (reference " \
               f"{float(want[idx]):.6g})"
    err = (got - want).abs()
    if err.numel() and float(err.max()) > tol:
        idx = tuple(int(i) for i in np.unravel_index(int(err.argmax()), err.shape))
        return (f"{name}: max abs error {float(err.max()):.3e} at index {idx} (got "
                f"{float(got[idx]):.6g}, reference {float(want[idx]):.6g}) > tolerance "
                f"{tol:.3e}")
    return None


def _kind(fn, block_masks):
    if block_masks is not None:
        if block_masks not in ("tandem", "torch"):
            raise ValueError(f"block_masks = {block_masks!r} must be 'tandem' or 'torch'")
        return block_masks
    module = getattr(getattr(fn, "func", fn), "__module__", "") or ""
    return "torch" if module.split(".")[0] == "torch" else "tandem"


def check_flex_attention_case(fn, case, check_grads=False, block_masks=None):
    """Runs `fn` on one FlexCase; raises FlexFailure on a mismatch (the
    message states it)."""
    problem = _problem_of(fn, case, check_grads, _kind(fn, block_masks))
    if problem:
        raise FlexFailure(problem, case)


# ---------------------------------------------------------------------------
# The report and the Hypothesis driver


def _names(fn):
    named = getattr(fn, "func", fn)
    fname = getattr(named, "__name__", "my_flex_attention")
    module = getattr(named, "__module__", None) or "mymodule"
    if module in ("__main__", "builtins", "functools") or fname == "<lambda>":
        module, fname = "mymodule", "my_flex_attention"
    return module, fname


def report(fn, case, problem, check_grads, block_masks):
    """The failure message: the case, the problem, the mods and a pytest
    test that replays it."""
    module, fname = _names(fn)
    opts = (", check_grads=True" if check_grads else "") + \
        (f", block_masks={block_masks!r}" if block_masks is not None else "")
    mods = "".join(textwrap.indent(case.source(role), "    ") + "\n"
                   for role in ("score_mod", "mask_mod") if getattr(case, role) is not None)
    return f"""tandem.testing: {fname} disagrees with tandem's reference (flex_attention).
Minimal case (shrunk by Hypothesis):

    {case!r}

  {problem}

The mods (table: {N_TABLE} float64 values, ids: {N_IDS} integers in [0, {ID_MAX}], both from
the seed):

{mods}
The tensor contents (q, k, v, dout, table, ids) come from seed={case.seed}.
To replay, paste into a test file:

    from tandem.testing import FlexCase, check_flex_attention_case
    from {module} import {fname}

    def test_{fname}_flex_attention_regression():
        check_flex_attention_case({fname}, {case!r}{opts})
"""


def run(fn, check_grads, block_masks, max_examples, time_budget, seed, space):
    kind = _kind(fn, block_masks)
    found = shrunk_failure(flex_cases(**space),
                           lambda case: _problem_of(fn, case, check_grads, kind),
                           max_examples, time_budget, seed)
    if found:
        case, problem = found
        raise FlexFailure(report(fn, case, problem, check_grads, block_masks), case)


@st.composite
def corrupted_block_masks(draw, block_mask):
    """(a corrupted copy of `block_mask`, what was changed), for a block mask
    made by create_block_mask, or None when it has no partial block: one
    partial block (where mask_mod keeps some elements and hides others) is
    marked full, or dropped (hidden). validate_block_mask must report
    either."""
    import torch
    num, idx = block_mask.kv_num_blocks, block_mask.kv_indices
    partial = [tuple(int(x) for x in at) for at in (num > 0).nonzero()]
    if not partial:
        return None
    b, h, m = draw(st.sampled_from(partial))
    slot = draw(st.integers(0, int(num[b, h, m]) - 1))
    block = int(idx[b, h, m, slot])
    keep = [int(x) for x in idx[b, h, m, :int(num[b, h, m])] if int(x) != block]
    num, idx = num.clone(), idx.clone()
    num[b, h, m] -= 1
    idx[b, h, m, :len(keep)] = torch.tensor(keep, dtype=idx.dtype)
    fnum, fidx = block_mask.full_kv_num_blocks.clone(), block_mask.full_kv_indices.clone()
    where = f"kv block {block} of query block {m} (b {b}, h {h})"
    if draw(st.booleans()):
        fidx[b, h, m, int(fnum[b, h, m])] = block
        fnum[b, h, m] += 1
        what = f"{where} marked full"
    else:
        what = f"{where} dropped"
    return dataclasses.replace(block_mask, kv_num_blocks=num, kv_indices=idx,
                               full_kv_num_blocks=fnum, full_kv_indices=fidx), what
