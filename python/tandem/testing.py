# SPDX-License-Identifier: Apache-2.0
"""Property-based differential testing of your own kernels against tandem's
reference in double, with Hypothesis.

    from tandem.testing import check_attention
    check_attention(my_attention)          # my_attention(q, k, v, *, layout, mask, ...)

Each check draws *configurations* (shapes, mask kind, window, softcap, bias
broadcast, strides, ...) from a Hypothesis strategy that shrinks toward the
smallest shape; the tensor contents come from a seed in the configuration
(NumPy's generator), so a failure shrinks to a small configuration rather
than to odd numbers. The function under test receives float32 arrays
(NumPy, or torch tensors with array="torch") and must return float32 results.

Policy (FlashAttention's): on every drawn configuration the error of your
output against the reference computed in double must be at most
`k` times the error of tandem's float32 reference (every sum accumulated in
float32) plus `floor`; the output must be finite wherever the reference is;
a query that sees no key must give 0 (masked_rows_policy="zero", tandem's
and PyTorch's rule; "any" skips those rows); and, with deterministic=True,
two calls on the same inputs must agree bit for bit.

Storage types (SPEC §10): `dtypes=("float32", "bfloat16", "float16")` draws
the configuration's storage type too; q, k, v, sinks and dout are then drawn
in float32 and rounded to it (NumPy: ml_dtypes.bfloat16, np.float16; torch:
torch.bfloat16, torch.float16; masks and ALiBi slopes stay float32) and the
function must return that type. A bfloat16 or float16 output is held to SPEC
§10.5's bound against the exact attention of the stored inputs,
`u_T |o| + u_T sum_j p_ij |v_j|` (u_T = 2^-8 for bf16, 2^-11 for f16) plus the
float32 allowance above; a failure says which rounding profile's reference
("pytorch", "exact", "ggml"; tandem's reference in T) is nearest to the
output, and explain_rounding(fn, config) says it for any configuration.
A bfloat16 or float16 backward is held to the reference's own bound in T
with the profile it implements (Policy(rounding=...), "pytorch" by
default): SPEC §10.5's `|g - g*| <= ulp_T(g*)/2 + flip + eps`, g* each
gradient before its final rounding and flip the slack of the rounded
operands RN_T(p_ij), RN_T(dx_ij) that float32 may round the other way, both
computed by the C++ reference (reference::attention_backward_rounding);
explain_rounding_backward(fn, config) names the nearest profile.

Batch invariance (SPEC §12): check_invariance(fn) runs a kernel on a batch
and on its parts, packed and separate, on a paged cache and contiguous keys,
on a prefill and on its decode steps and chunks, and raises
InvarianceFailure at the first query row whose bits differ (which check,
sequence, query, head, max |diff|).

FlexAttention (SPEC §13): check_flex_attention(fn) checks anyone's
flex_attention with torch's signature (torch's own, tandem.flex_attention)
against tandem's reference in float64, on drawn shapes, block masks and
score_mods and mask_mods drawn as small programs (flex_mods; each a Python
callable with its source), and raises FlexFailure with the smallest failing
case, its mods' source and a pytest test to paste.

A failure raises CheckFailure with the minimal configuration, its seed and
a pytest test to paste. Exploration stops after `time_budget` seconds
(Hypothesis' per-example deadline is off); shrinking a failure always runs
to the end.
"""

import dataclasses
import math
from typing import Optional

import numpy as np

from ._errors import MissingExtra

try:
    from hypothesis import strategies as st
except ImportError as e:
    raise MissingExtra("tandem.testing", "Hypothesis", "testing", "hypothesis", e) from e

from . import _api
from ._flex_check import (FlexCase, FlexFailure, block_mask_of,
                          check_flex_attention_case, corrupted_block_masks, flex_cases,
                          flex_mods)
from ._flex_check import run as _flex_run
from ._search import shrunk_failure

__all__ = [
    "AttentionConfig", "RopeConfig", "SwigluConfig", "CheckFailure",
    "attention_configs", "rope_configs", "swiglu_configs",
    "check_attention", "check_attention_backward", "check_rope", "check_swiglu",
    "check_attention_config", "check_attention_backward_config", "check_rope_config",
    "check_swiglu_config", "explain_rounding", "explain_rounding_backward", "MASKS", "LAYOUTS",
    "ALIBI", "DTYPES",
    "ROUNDINGS", "INVARIANCE_CHECKS", "InvarianceConfig", "InvarianceFailure",
    "check_invariance", "check_backward_invariance", "BACKWARD_INVARIANCE_CHECKS",
    "FlexCase", "FlexFailure", "flex_cases", "flex_mods",
    "check_flex_attention", "check_flex_attention_case", "corrupted_block_masks",
    "block_mask_of",
]

MASKS = ("none", "causal", "sliding_window", "key_padding", "bias")
LAYOUTS = ("bshd", "bhsd")
ALIBI = ("none", "per_head", "per_batch_head")
#: The storage types a configuration may have (SPEC §10.1), and their unit roundoffs.
DTYPES = ("float32", "bfloat16", "float16")
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
#: The rounding profiles of a bfloat16 or float16 call (SPEC §10.2).
ROUNDINGS = ("pytorch", "exact", "ggml")
#: The optional inputs of an attention call, passed as keyword arguments
#: when a configuration has them.
_OPTIONAL = ("bias", "key_padding", "sinks", "alibi_slopes")


class CheckFailure(AssertionError):
    """A kernel disagreed with the reference; `config` is the (shrunk)
    configuration and the message holds a pytest test that replays it."""

    def __init__(self, report, config):
        super().__init__(report)
        self.config = config


# ---------------------------------------------------------------------------
# Configurations and their tensors


def _rng(seed):
    return np.random.default_rng(seed)


def _storage(x, dtype):
    """float32 values x rounded to the storage type `dtype` (NumPy; bfloat16
    is ml_dtypes')."""
    if dtype == "float32":
        return x
    if dtype == "float16":
        return x.astype(np.float16)
    import ml_dtypes
    return x.astype(ml_dtypes.bfloat16)


def _to_torch(a):
    """A NumPy array as a torch tensor, the same memory (bf16 through its bits)."""
    import torch
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _framework(arrays, array):
    """The arrays as NumPy arrays or torch tensors (same memory)."""
    if array == "numpy":
        return arrays
    if array == "torch":
        return {n: None if a is None else _to_torch(a) for n, a in arrays.items()}
    raise ValueError(f"array = {array!r} must be 'numpy' or 'torch'")


def _numpy(x):
    """A result of the function under test as a NumPy array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            import ml_dtypes
            return x.view(dtype=__import__("torch").int16).numpy().view(ml_dtypes.bfloat16)
        x = x.numpy()
    return np.asarray(x)


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """One attention call: q [B,Sq,H,D], k [B,Sk,Hkv,D], v [B,Sk,Hkv,Dv] in
    `layout`, a mask kind (window for sliding_window; bias [Bb,Hb,Sq,Sk] with
    Bb = B if bias_batch else 1, Hb = H if bias_heads else 1; keep [B,Sk]
    for key_padding), softcap, scale (None = 1/sqrt(D)); masked_rows: some
    queries see no key; strided: q, k, v are views with row strides (bshd) or
    transposed views (bhsd); q and k scaled by `amplitude` (large scores);
    sinks: a logit per query head [H] (scaled by `amplitude` too); alibi:
    ALiBi slopes [H] ("per_head") or [B, H] ("per_batch_head") in [0, 1);
    dtype: the storage type of q, k, v, sinks and dout (SPEC §10.1); contents
    from `seed`."""
    B: int = 1
    H: int = 1
    Hkv: int = 1
    Sq: int = 1
    Sk: int = 1
    D: int = 1
    Dv: int = 1
    layout: str = "bshd"
    mask: str = "none"
    window: int = 0
    softcap: float = 0.0
    scale: Optional[float] = None
    bias_batch: bool = False
    bias_heads: bool = False
    masked_rows: bool = False
    strided: bool = False
    amplitude: float = 1.0
    sinks: bool = False
    alibi: str = "none"
    seed: int = 0
    dtype: str = "float32"

    def _heads(self, rng, S, heads, width, amplitude):
        """A [B, S, heads, width] tensor in the config's layout (a strided view
        when `strided`)."""
        x = (amplitude * rng.standard_normal((self.B, S, heads, width))).astype(np.float32)
        x = _storage(x, self.dtype)
        if self.layout == "bhsd":
            x = np.ascontiguousarray(x.transpose(0, 2, 1, 3))
            if self.strided:  # a transposed view of a bshd buffer
                x = np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
            return x
        if self.strided:  # rows padded by 3 elements: a row-strided view
            parent = np.zeros((self.B, S, heads * width + 3), x.dtype)
            parent[:, :, :heads * width] = x.reshape(self.B, S, heads * width)
            x = parent[:, :, :heads * width].reshape(self.B, S, heads, width)
        return x

    def arrays(self):
        """q, k, v, bias and key_padding (None unless the mask takes it),
        sinks and alibi_slopes (None unless the configuration has them) as
        float32 NumPy arrays drawn from the seed."""
        rng = _rng(self.seed)
        q = self._heads(rng, self.Sq, self.H, self.D, self.amplitude)
        k = self._heads(rng, self.Sk, self.Hkv, self.D, self.amplitude)
        v = self._heads(rng, self.Sk, self.Hkv, self.Dv, 1.0)
        bias = keep = None
        if self.mask == "bias":
            shape = (self.B if self.bias_batch else 1, self.H if self.bias_heads else 1,
                     self.Sq, self.Sk)
            bias = rng.standard_normal(shape).astype(np.float32)
            bias[rng.random(shape) < 0.2] = -np.inf
            if self.masked_rows:
                bias[..., rng.integers(self.Sq), :] = -np.inf
        if self.mask == "key_padding":
            keep = (rng.random((self.B, self.Sk)) < 0.8).astype(np.float32)
            keep[:, rng.integers(self.Sk)] = 1.0
            if self.masked_rows:
                keep[rng.integers(self.B)] = 0.0
        sinks = _storage((self.amplitude * rng.standard_normal(self.H)).astype(np.float32),
                         self.dtype) if self.sinks else None
        slopes = None if self.alibi == "none" else rng.uniform(
            0, 1, (self.H,) if self.alibi == "per_head" else (self.B, self.H)).astype(np.float32)
        return {"q": q, "k": k, "v": v, "bias": bias, "key_padding": keep, "sinks": sinks,
                "alibi_slopes": slopes}

    def kwargs(self):
        """The keyword arguments of tandem.attention (and of your function)."""
        return {"layout": self.layout,
                "mask": self.mask if self.mask in ("none", "causal", "sliding_window") else None,
                "window": self.window if self.mask == "sliding_window" else None,
                "scale": self.scale, "softcap": self.softcap}

    def dout(self):
        """dL/dout for the backward check: [B,Sq,H,Dv] in the layout."""
        x = _rng(self.seed + 1).standard_normal((self.B, self.Sq, self.H, self.Dv))
        if self.layout == "bhsd":
            x = x.transpose(0, 2, 1, 3)
        return _storage(np.ascontiguousarray(x, dtype=np.float32), self.dtype)


@st.composite
def attention_configs(draw, masks=MASKS, layouts=LAYOUTS, gqa=True, v_head_dim=True,
                      softcap=True, scale=True, bias_broadcast=True, masked_rows=True,
                      strided=True, large_scores=True, sinks=False, alibi=(), max_batch=2,
                      max_heads=4, max_seq=12, max_dim=12, dtypes=("float32",)):
    """AttentionConfigs; each switch off (False, or a shorter tuple) leaves
    that feature out; the features off by default (sinks=True, alibi=ALIBI
    or a part of it) pass `sinks` and `alibi_slopes` to the function under
    test; `dtypes` (a part of DTYPES) the storage types drawn. Every choice
    lists its simplest option first, so a failure shrinks to B = H = Sq = Sk
    = D = 1, no mask, contiguous, unless it needs more."""
    B = draw(st.integers(1, max_batch))
    Hkv = draw(st.integers(1, max_heads))
    group = draw(st.integers(1, max(1, max_heads // Hkv))) if gqa else 1
    Sq = draw(st.integers(1, max_seq))
    Sk = draw(st.integers(1, max_seq))
    D = draw(st.integers(1, max_dim))
    Dv = draw(st.integers(1, max_dim)) if v_head_dim else D
    mask = draw(st.sampled_from(masks))
    return AttentionConfig(
        B=B, H=Hkv * group, Hkv=Hkv, Sq=Sq, Sk=Sk, D=D, Dv=Dv,
        layout=draw(st.sampled_from(layouts)), mask=mask,
        window=draw(st.integers(0, Sk)) if mask == "sliding_window" else 0,
        softcap=draw(st.sampled_from((0.0, 5.0, 30.0))) if softcap else 0.0,
        scale=draw(st.sampled_from((None, 0.5, 2.0))) if scale else None,
        bias_batch=mask == "bias" and bias_broadcast and draw(st.booleans()),
        bias_heads=mask == "bias" and bias_broadcast and draw(st.booleans()),
        masked_rows=mask in ("bias", "key_padding") and masked_rows and draw(st.booleans()),
        strided=strided and draw(st.booleans()),
        amplitude=draw(st.sampled_from((1.0, 4.0, 32.0))) if large_scores else 1.0,
        sinks=sinks and draw(st.booleans()),
        alibi=draw(st.sampled_from(("none",) + tuple(a for a in alibi if a != "none"))),
        seed=draw(st.integers(0, 2**32 - 1)), dtype=draw(st.sampled_from(tuple(dtypes))))


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """One RoPE call: x [B, S, heads*D] (a row-strided view when `strided`),
    n_rot rotated dims, style, tables cos/sin [R, T] with R = S + extra rows
    (position) or B*S (token) and T = n_rot/2 + extra columns; angles from
    `seed`."""
    B: int = 1
    S: int = 1
    heads: int = 1
    D: int = 2
    n_rot: int = 2
    style: str = "neox"
    table_rows: str = "position"
    extra_rows: int = 0
    extra_cols: int = 0
    strided: bool = False
    seed: int = 0

    def arrays(self):
        rng = _rng(self.seed)
        W = self.heads * self.D
        x = rng.standard_normal((self.B, self.S, W)).astype(np.float32)
        if self.strided:
            parent = np.zeros((self.B, self.S, W + 5), np.float32)
            parent[:, :, :W] = x
            x = parent[:, :, :W]
        R = self.B * self.S if self.table_rows == "token" else self.S + self.extra_rows
        angle = rng.uniform(-math.pi, math.pi, (R, self.n_rot // 2 + self.extra_cols))
        return {"x": x, "cos": np.cos(angle).astype(np.float32),
                "sin": np.sin(angle).astype(np.float32)}

    def kwargs(self):
        return {"head_dim": self.D, "n_rot": self.n_rot, "style": self.style,
                "table_rows": self.table_rows}


@st.composite
def rope_configs(draw, styles=("neox", "gptj"), partial=True, token_rows=True, strided=True,
                 max_batch=3, max_seq=8, max_heads=3, max_dim=16):
    """RopeConfigs (D even; n_rot < D when partial)."""
    B = draw(st.integers(1, max_batch))
    D = 2 * draw(st.integers(1, max_dim // 2))
    rows = draw(st.sampled_from(("position", "token") if token_rows and B > 1 else
                                ("position",)))
    return RopeConfig(
        B=B, S=draw(st.integers(1, max_seq)), heads=draw(st.integers(1, max_heads)), D=D,
        n_rot=2 * draw(st.integers(0, D // 2)) if partial else D,
        style=draw(st.sampled_from(styles)), table_rows=rows,
        extra_rows=draw(st.integers(0, 2)), extra_cols=draw(st.integers(0, 2)),
        strided=strided and draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)))


@dataclasses.dataclass(frozen=True)
class SwigluConfig:
    """One SwiGLU call: x [rows, 2n] scaled by `amplitude`, contents from `seed`."""
    rows: int = 1
    n: int = 1
    gate_first: bool = True
    amplitude: float = 1.0
    seed: int = 0

    def arrays(self):
        x = self.amplitude * _rng(self.seed).standard_normal((self.rows, 2 * self.n))
        return {"x": x.astype(np.float32)}

    def kwargs(self):
        return {"gate_first": self.gate_first}


@st.composite
def swiglu_configs(draw, max_rows=8, max_n=16):
    """SwigluConfigs, including large gates (exp overflow)."""
    return SwigluConfig(rows=draw(st.integers(1, max_rows)), n=draw(st.integers(1, max_n)),
                        gate_first=draw(st.sampled_from((True, False))),
                        amplitude=draw(st.sampled_from((1.0, 10.0, 100.0))),
                        seed=draw(st.integers(0, 2**32 - 1)))


# ---------------------------------------------------------------------------
# Comparison under FlashAttention's policy


@dataclasses.dataclass(frozen=True)
class Policy:
    """Error <= k * (err32 + eps32 * |s|max * |ref|max) + floor, where err32
    is the float32 reference's own error, eps32 = 2^-24 and |s|max a bound of
    the attention scores (0 for RoPE and SwiGLU): a float32 kernel may be off
    by a rounding of its largest score, which the float32 reference escapes
    when its softmax is exact by structure (a single visible key). Finite
    where the reference is; masked rows 0 ("zero") or unchecked ("any");
    bit-identical repeated calls (deterministic). `rounding`: the profile
    (SPEC §10.2) a bfloat16 or float16 backward implements, whose reference
    it is held to (the forward's bound, against exact arithmetic, holds for
    "pytorch" and "exact" alike)."""
    k: float = 4.0
    floor: float = 1e-5
    masked_rows: str = "zero"
    deterministic: bool = True
    rounding: str = "pytorch"


EPS32 = 2.0 ** -24


def _compare(name, got, ref64, ref32, policy, skip=None, score_bound=0.0):
    """The first way `got` breaks the policy, as text; None when it holds."""
    got = _numpy(got)
    if got.shape != ref64.shape:
        return f"{name}: shape {list(got.shape)}, expected {list(ref64.shape)}"
    got = got.astype(np.float64)
    check = np.ones(ref64.shape, bool) if skip is None else ~skip
    bad = check & ~np.isfinite(got)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return (f"{name}: non-finite value {got[idx]} at index {idx} (reference "
                f"{ref64[idx]:.6g}): NaN/inf policy broken")
    err = np.where(check, np.abs(got - ref64), 0.0)
    err32 = float(np.max(np.where(check, np.abs(ref32.astype(np.float64) - ref64), 0.0),
                      initial=0.0))
    rounding = EPS32 * score_bound * float(np.max(np.abs(ref64), initial=0.0))
    tol = policy.k * (err32 + rounding) + policy.floor
    if err.size and err.max() > tol:
        idx = tuple(int(i) for i in np.unravel_index(np.argmax(err), err.shape))
        return (f"{name}: max abs error {err.max():.3e} at index {idx} (got {got[idx]:.6g}, "
                f"reference {ref64[idx]:.6g}) > tolerance {tol:.3e} = {policy.k:g} x (float32 "
                f"reference error {err32:.3e} + score rounding {rounding:.1e}) + floor "
                f"{policy.floor:.1e}")
    return None


def _call(fn, arrays, positional, kwargs, array):
    """fn(*positional arrays, **kwargs), with bias, key_padding, sinks and
    alibi_slopes as keyword arguments when the configuration has them."""
    inputs = _framework(arrays, array)
    kw = dict(kwargs)
    for opt in _OPTIONAL:
        if inputs.get(opt) is not None:
            kw[opt] = inputs[opt]
    return fn(*(inputs[n] for n in positional), **kw)


def _deterministic(name, fn, call, policy):
    if not policy.deterministic:
        return None
    a, b = (call() for _ in range(2))
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    for x, y in zip(a, b):
        if x is not None and not np.array_equal(_numpy(x), _numpy(y), equal_nan=True):
            return f"{name}: two calls on the same inputs differ (determinism policy)"
    return None


def _masked_rows(config, arrays):
    """[B, Sq, H] (bshd) / [B, H, Sq] (bhsd) boolean: queries that see no key."""
    c = config
    seen = np.ones((c.B, c.H, c.Sq), bool)
    if c.mask == "bias":
        seen = np.broadcast_to(np.isfinite(arrays["bias"]).any(-1), (c.B, c.H, c.Sq))
    if c.mask == "key_padding":
        seen = np.broadcast_to((arrays["key_padding"] != 0).any(-1)[:, None, None],
                               (c.B, c.H, c.Sq))
    rows = ~seen
    return rows.transpose(0, 2, 1) if c.layout == "bshd" else rows


def _score_bound(config, arrays):
    """A bound of |s_ij| <= |scale| max|q_i| max|k_j| (+ max|bias|), capped
    by softcap (+ the largest ALiBi term; at least max|sink|)."""
    scale = config.scale if config.scale is not None else 1 / math.sqrt(config.D)
    q, k = arrays["q"].astype(np.float64), arrays["k"].astype(np.float64)
    s = abs(scale) * np.linalg.norm(q, axis=-1).max() * np.linalg.norm(k, axis=-1).max()
    if config.softcap > 0:
        s = min(s, config.softcap)
    if arrays["bias"] is not None:
        b = arrays["bias"][np.isfinite(arrays["bias"])]
        s += float(np.abs(b).max(initial=0.0))
    if arrays.get("alibi_slopes") is not None:
        s += float(np.abs(arrays["alibi_slopes"]).max()) * max(config.Sq, config.Sk)
    if arrays.get("sinks") is not None:
        s = max(s, float(np.abs(arrays["sinks"]).max()))
    return s


def _ref_kwargs(config, arrays):
    kw = config.kwargs()
    for opt in _OPTIONAL:
        if arrays[opt] is not None:
            kw[opt] = arrays[opt]
    return kw


def _f64(arrays):
    """The tensors in float64 for the reference in double (masks and ALiBi
    slopes stay float32)."""
    return {n: a if a is None or n in ("bias", "key_padding", "alibi_slopes") else
            a.astype(np.float64) for n, a in arrays.items()}


def _raise_on(problem, config):
    if problem:
        raise CheckFailure(problem, config)


def check_attention_config(fn, config, array="numpy", policy=Policy()):
    """Runs `fn` on one AttentionConfig; raises CheckFailure on a mismatch."""
    _raise_on(_attention_problem(fn, config, array, policy), config)


def _attention_problem(fn, config, array, policy):
    arrays = config.arrays()
    try:
        got = _call(fn, arrays, ("q", "k", "v"), config.kwargs(), array)
    except Exception as e:  # the kernel under test raised: a failure too
        return f"out: the function raised {type(e).__name__}: {e}"
    if config.dtype != "float32":
        return _low_precision_problem(fn, config, arrays, got, array, policy)
    a64 = _f64(arrays)
    ref64 = _api.attention(a64["q"], a64["k"], a64["v"], backend="reference",
                           **_ref_kwargs(config, a64))
    ref32 = _api.attention(arrays["q"], arrays["k"], arrays["v"], backend="reference_fp32acc",
                           **_ref_kwargs(config, arrays))
    masked = _masked_rows(config, arrays)[..., None]
    skip = np.broadcast_to(masked, ref64.shape) if policy.masked_rows == "any" else None
    return _compare("out", got, ref64, ref32, policy, skip, _score_bound(config, arrays)) or \
        _deterministic(
        "out", fn, lambda: _call(fn, arrays, ("q", "k", "v"), config.kwargs(), array), policy)


def _low_precision_problem(fn, config, arrays, got, array, policy):
    """SPEC §10.5 for a bfloat16 or float16 output: |o - o_exact| <= u_T |o_exact|
    + u_T sum_j p_ij |v_j| + the float32 allowance of _compare, o_exact the
    attention in double of the stored inputs."""
    out = _numpy(got)
    if out.dtype.name != config.dtype:
        return f"out: dtype {out.dtype.name}, expected {config.dtype} (q's storage type)"
    a64 = _f64(arrays)
    kw = _ref_kwargs(config, a64)
    ref64 = _api.attention(a64["q"], a64["k"], a64["v"], backend="reference", **kw)
    mags = _api.attention(a64["q"], a64["k"], np.abs(a64["v"]), backend="reference", **kw)
    a32 = {n: a if a is None or a.dtype == np.float32 else a.astype(np.float32)
           for n, a in arrays.items()}
    ref32 = _api.attention(a32["q"], a32["k"], a32["v"], backend="reference_fp32acc",
                           **_ref_kwargs(config, a32))
    masked = np.broadcast_to(_masked_rows(config, arrays)[..., None], ref64.shape)
    skip = masked if policy.masked_rows == "any" else np.zeros(ref64.shape, bool)
    o = out.astype(np.float64)
    if (~skip & ~np.isfinite(o)).any():
        idx = tuple(int(i) for i in np.argwhere(~skip & ~np.isfinite(o))[0])
        return f"out: non-finite value {o[idx]} at index {idx}: NaN/inf policy broken"
    u = UNIT_ROUNDOFF[config.dtype]
    err32 = float(np.max(np.abs(ref32.astype(np.float64) - ref64), initial=0.0))
    allowance = policy.k * (err32 + EPS32 * _score_bound(config, a32) *
                            float(np.max(np.abs(ref64), initial=0.0))) + policy.floor
    tol = u * np.abs(ref64) + u * mags + allowance
    err = np.where(skip, 0.0, np.abs(o - ref64))
    if err.size and (err > tol).any():
        idx = tuple(int(i) for i in np.unravel_index(np.argmax(err - tol), err.shape))
        return (f"out ({config.dtype}): error {err[idx]:.3e} at index {idx} (got {o[idx]:.6g}, "
                f"exact {ref64[idx]:.6g}) > SPEC §10.5's bound {tol[idx]:.3e} = u_T |o| "
                f"{u * abs(ref64[idx]):.2e} + u_T sum p|v| {u * mags[idx]:.2e} + float32 "
                f"allowance {allowance:.1e}; {_explanation(out, config, arrays)}")
    return _deterministic(
        "out", fn, lambda: _call(fn, arrays, ("q", "k", "v"), config.kwargs(), array), policy)


def _profile_errors(out, config, arrays):
    """{profile: max |out - tandem's reference in T with that profile|}."""
    kw = _ref_kwargs(config, arrays)
    o = out.astype(np.float64)
    errs = {}
    for r in ROUNDINGS:
        ref = _api.attention(arrays["q"], arrays["k"], arrays["v"], backend="reference",
                             rounding=r, **kw)
        errs[r] = float(np.max(np.abs(o - ref.astype(np.float64)), initial=0.0))
    return errs


def _explanation(out, config, arrays):
    """Which profile's reference is nearest to `out`, as text."""
    try:
        errs = _profile_errors(out, config, arrays)
    except Exception as e:  # the reference does not offer T yet
        return f"no rounding profile to compare with ({e})"
    best = min(errs, key=errs.get)
    listed = ", ".join(f"{r} {e:.2e}" for r, e in errs.items())
    return f"nearest rounding profile: {best} (max |out - reference|: {listed})"


def explain_rounding(fn, config, array="numpy"):
    """Runs `fn` on one bfloat16 or float16 AttentionConfig and returns
    (profile, errors): the rounding profile (SPEC §10.2: "pytorch", "exact",
    "ggml") whose reference in the config's storage type is nearest to fn's
    output, and the largest distance to each, so that a kernel's error can be
    told apart from another library's rounding (SPEC §10.3)."""
    if config.dtype == "float32":
        raise ValueError("explain_rounding needs a bfloat16 or float16 configuration "
                         "(float32 rounds nothing in between)")
    arrays = config.arrays()
    out = _numpy(_call(fn, arrays, ("q", "k", "v"), config.kwargs(), array))
    errs = _profile_errors(out, config, arrays)
    return min(errs, key=errs.get), errs


def check_attention_backward_config(fn, config, array="numpy", policy=Policy()):
    """Runs the backward `fn(q, k, v, dout, **kwargs) -> (dq, dk, dv)`
    (and dsinks as a fourth when the configuration has sinks) on one
    AttentionConfig; raises CheckFailure on a mismatch."""
    _raise_on(_attention_backward_problem(fn, config, array, policy), config)


def _attention_backward_problem(fn, config, array, policy):
    arrays = dict(config.arrays(), dout=config.dout())
    names = ("dq", "dk", "dv", "dsinks") if config.sinks else ("dq", "dk", "dv")
    what = ", ".join(names)
    try:
        got = _call(fn, arrays, ("q", "k", "v", "dout"), config.kwargs(), array)
    except Exception as e:
        return f"{what}: the function raised {type(e).__name__}: {e}"
    ref64, ref32 = _backward_references(config, arrays, names)
    if not isinstance(got, (tuple, list)) or len(got) != len(names):
        return f"{what}: the function must return ({what})"
    if config.dtype != "float32":
        return _low_precision_backward_problem(fn, config, arrays, names, got, array, policy)
    for name, g, r64, r32 in zip(names, got, ref64, ref32):
        problem = _compare(name, g, r64, r32, policy, None, _score_bound(config, arrays))
        if problem:
            return problem
    return _deterministic(what, fn, lambda: _call(
        fn, arrays, ("q", "k", "v", "dout"), config.kwargs(), array), policy)


def _backward_references(config, arrays, names):
    """The gradients `names` of the reference in double and of the float32
    reference (every sum in float32) on the stored inputs read in float32:
    their difference is what float32 arithmetic costs on this call."""
    a64 = _f64(arrays)
    ref64 = _api.attention_backward(a64["q"], a64["k"], a64["v"], a64["dout"],
                                    backend="reference", **_ref_kwargs(config, a64))
    a32 = _widened(arrays)
    kw = _ref_kwargs(config, a32)
    ref32 = [_api.attention_backward(a32["q"], a32["k"], a32["v"], a32["dout"],
                                     grads=(g,), backend="reference_fp32acc", **kw)[i]
             for i, g in enumerate(names)]
    return ref64, ref32


def _widened(arrays):
    """The stored tensors read exactly into float32 (SPEC §10.1)."""
    return {n: a if a is None or a.dtype == np.float32 else a.astype(np.float32)
            for n, a in arrays.items()}


def _ulp(x, dtype):
    """ulp_T(|x|), elementwise: the spacing of T's values at |x| (SPEC §10.1:
    bf16 has 8 significant bits and normal exponents from -126, f16 11 and
    -14; below them the subnormal spacing)."""
    fraction, min_exp = {"bfloat16": (7, -126), "float16": (10, -14)}[dtype]
    _, e = np.frexp(np.abs(x))  # |x| = f 2^e with f in [1/2, 1): the binade 2^(e-1)
    e = np.where(x == 0, min_exp, np.maximum(e - 1, min_exp))
    return np.ldexp(1.0, (e - fraction).astype(np.int32))


def _backward_bound(config, arrays, rounding, rel_delta):
    """{dq, dk, dv: (g*, flip)}: SPEC §10.5's bound of the backward from C++
    (reference::attention_backward_rounding via tandem._ext): each gradient
    before its final rounding in T under `rounding`, and the slack of its
    rounded operands RN_T(p_ij), RN_T(dx_ij) that float32 arithmetic within
    `rel_delta` may round the other way; float64, in the inputs' shapes."""
    from . import _ext
    call = _api._AttentionCall(arrays["q"], arrays["k"], arrays["v"], rounding=rounding,
                               **_ref_kwargs(config, arrays))
    bound = {}
    for g, x in (("dq", "q"), ("dk", "k"), ("dv", "v")):
        bound[g] = (np.empty(call.views[x]), np.empty(call.views[x]))
    _api._run(_ext.attention_backward_rounding, call.params, call.inputs,
              call.dout(arrays["dout"]), rel_delta, *bound["dq"], *bound["dk"], *bound["dv"])
    return {g: tuple(call.back(a, g[1]) for a in b) for g, b in bound.items()}


def _delta_slack(config, arrays, rounding, rel_delta):
    """How far a kernel's dq, dk (and dsinks) may move because its stored
    forward O_i, which delta_i = <dO_i, O_i> reads (SPEC §10.2), is another
    value of T than the reference's: where o*_id lies within its flip (from
    C++: reference::attention_forward_rounding) and float32's 2 rel_delta
    sum_j p_ij |v_jd| of a rounding boundary, O_id may be one ulp_T away, so
    delta_i by Delta_i = sum_d ulp_T(o_id) |dO_id|. Then dx_ij = p_ij (dp_ij -
    delta_i) moves by p_ij Delta_i and RN_T(dx_ij) by up to that plus two ulp_T
    of |dx_ij| + p_ij Delta_i <= p_ij b_i, b_i = 2 max|v| sum_d |dO_id| +
    Delta_i; with c_i = Delta_i + 2 u_T b_i the gradients move by at most
    scale c_i sum_j p_ij |k_j| (dq), scale sum_i p_ij c_i |q_i| (dk), both
    computed by the reference in double, and sum_i Delta_i (dsinks, p_sink <=
    1). None when no O_id is ambiguous (the common case)."""
    from . import _ext
    call = _api._AttentionCall(arrays["q"], arrays["k"], arrays["v"], rounding=rounding,
                               **_ref_kwargs(config, arrays))
    o_star, flip = np.empty(call.views["out"]), np.empty(call.views["out"])
    _api._run(_ext.attention_forward_rounding, call.params, call.inputs, rel_delta, o_star, flip)
    a64 = _f64(arrays)
    kw = _ref_kwargs(config, a64)
    mags = _api.attention(a64["q"], a64["k"], np.abs(a64["v"]), backend="reference", **kw)
    reach = flip + 2 * rel_delta * mags
    ambiguous = _storage_of(o_star - reach, config.dtype) != _storage_of(o_star + reach,
                                                                         config.dtype)
    if not ambiguous.any():
        return None
    dout = np.abs(a64["dout"])
    delta = np.sum(np.where(ambiguous, _ulp(np.abs(o_star) + reach, config.dtype), 0) * dout,
                   axis=-1, keepdims=True)
    b = 2 * float(np.max(np.abs(a64["v"]), initial=0.0)) * dout.sum(-1, keepdims=True) + delta
    c = np.where(delta > 0, delta + 2 * UNIT_ROUNDOFF[config.dtype] * b, 0.0)
    dq, dk = _p_sums(config, a64, c)
    heads = 2 if config.layout == "bshd" else 1
    dsinks = delta.sum(axis=tuple(a for a in range(4) if a != heads))
    return {"dq": dq, "dk": dk, "dv": 0.0, "dsinks": dsinks}


def _p_sums(config, a64, c):
    """(scale c_i sum_j p_ij |k_j|, scale sum_i p_ij c_i |q_i|) for a weight
    c_i per query row ([..., 1] in out's layout), by the reference in double:
    the second is dv of a backward whose values are k and whose dout is c |q|."""
    kw = _ref_kwargs(config, a64)
    scale = abs(config.scale if config.scale is not None else 1 / math.sqrt(config.D))
    dq = scale * c * _api.attention(a64["q"], a64["k"], np.abs(a64["k"]), backend="reference",
                                    **kw)
    dk = scale * _api.attention_backward(a64["q"], a64["k"], a64["k"], c * np.abs(a64["q"]),
                                         grads=("dv",), backend="reference", **kw)[2]
    return dq, dk


def _operand_error(config, arrays, rel_delta):
    """The float32 error of the unrounded operands, which SPEC §10.5's eps
    holds: p_ij and dx_ij within rel_delta (dx's scale |ds| + 2 p |delta| <=
    p_ij b_i, b_i = 4 max|v| sum_d |dO_id|) give dv rel_delta sum_i p_ij
    |dO_i|, dq and dk rel_delta times _p_sums of b, dsinks rel_delta sum_i
    b_i."""
    a64 = _f64(arrays)
    dout = np.abs(a64["dout"])
    b = 4 * float(np.max(np.abs(a64["v"]), initial=0.0)) * dout.sum(-1, keepdims=True)
    dq, dk = _p_sums(config, a64, b)
    dv = _api.attention_backward(a64["q"], a64["k"], a64["v"], dout, grads=("dv",),
                                 backend="reference", **_ref_kwargs(config, a64))[2]
    heads = 2 if config.layout == "bshd" else 1
    dsinks = b.sum(axis=tuple(a for a in range(4) if a != heads))
    return {n: rel_delta * x for n, x in (("dq", dq), ("dk", dk), ("dv", dv),
                                           ("dsinks", dsinks))}


def _storage_of(x, dtype):
    """float64 values rounded once to T (RN_T, SPEC §10.1), back in float64."""
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float64)
    import ml_dtypes
    return x.astype(ml_dtypes.bfloat16).astype(np.float64)


def _low_precision_backward_problem(fn, config, arrays, names, got, array, policy):
    """SPEC §10.5 for bfloat16 or float16 gradients against tandem's
    reference in T with the profile policy.rounding: |g - g*| <= ulp_T(g*)/2
    + flip + eps for dq, dk, dv (g* and flip from C++: _backward_bound; plus
    _delta_slack where the stored O itself is ambiguous), and
    |g - r| <= ulp_T(r) + eps for dsinks (rounded once from an unrounded
    sum, as the reference's r is: SPEC §10.2); eps = k x the float32
    reference's own error + floor + the unrounded operands' float32 error
    (_operand_error). The float32 error of p_ij and dx_ij is
    taken as rel_delta = k eps32 (D + 4)(1 + |s|max + ln Sk): exp turns the
    absolute error of a score (<= D eps32 |s|max) and of lse into a
    relative one."""
    grads = [_numpy(g) for g in got]
    for name, g in zip(names, grads):
        if g.dtype.name != config.dtype:
            return f"{name}: dtype {g.dtype.name}, expected {config.dtype} (q's storage type)"
    ref64, ref32 = _backward_references(config, arrays, names)
    score = _score_bound(config, _widened(arrays))
    rel_delta = policy.k * EPS32 * (config.D + 4) * (1 + score + math.log(max(config.Sk, 1)))
    bound = _backward_bound(config, arrays, policy.rounding, rel_delta)
    moved = _delta_slack(config, arrays, policy.rounding, rel_delta)
    operands = _operand_error(config, arrays, rel_delta)
    if "dsinks" in names:
        ref_t = _api.attention_backward(arrays["q"], arrays["k"], arrays["v"], arrays["dout"],
                                        grads=("dsinks",), backend="reference",
                                        rounding=policy.rounding, **_ref_kwargs(config, arrays))
        bound["dsinks"] = (ref_t[3].astype(np.float64), None)
    for name, g, r64, r32 in zip(names, grads, ref64, ref32):
        if g.shape != r64.shape:
            return f"{name}: shape {list(g.shape)}, expected {list(r64.shape)}"
        g = g.astype(np.float64)
        if not np.isfinite(g).all():
            idx = tuple(int(i) for i in np.argwhere(~np.isfinite(g))[0])
            return f"{name}: non-finite value {g[idx]} at index {idx}: NaN/inf policy broken"
        center, flip = bound[name]
        eps = policy.k * float(np.max(np.abs(r32.astype(np.float64) - r64), initial=0.0)) + \
            policy.floor + operands[name]
        once = _ulp(np.abs(center) + eps, config.dtype)  # one rounding of a value near center
        rounding = once if flip is None else once / 2 + flip
        tol = rounding + eps + (0.0 if moved is None else moved[name])
        err = np.abs(g - center)
        if err.size and (err > tol).any():
            idx = tuple(int(i) for i in np.unravel_index(np.argmax(err - tol), err.shape))
            slack = "" if flip is None else f" + flip {flip[idx]:.2e}"
            if moved is not None:
                slack += f" + stored-O slack {np.broadcast_to(moved[name], err.shape)[idx]:.2e}"
            half = "ulp_T" if flip is None else "ulp_T/2"
            return (f"{name} ({config.dtype}, rounding={policy.rounding!r}): error "
                    f"{err[idx]:.3e} at index {idx} (got {g[idx]:.6g}, reference before its "
                    f"rounding {center[idx]:.6g}) > SPEC §10.5's bound {tol[idx]:.3e} = {half} "
                    f"{(once[idx] if flip is None else once[idx] / 2):.2e}{slack} + float32 "
                    f"allowance {np.broadcast_to(eps, err.shape)[idx]:.1e}; "
                    f"{_backward_explanation(grads, names, config, arrays)}")
    return _deterministic(", ".join(names), fn, lambda: _call(
        fn, arrays, ("q", "k", "v", "dout"), config.kwargs(), array), policy)


def _backward_profile_errors(grads, names, config, arrays):
    """{profile: max over the gradients of max |g - tandem's reference in T
    with that profile|}."""
    kw = _ref_kwargs(config, arrays)
    errs = {}
    for r in ROUNDINGS:
        ref = _api.attention_backward(arrays["q"], arrays["k"], arrays["v"], arrays["dout"],
                                      backend="reference", rounding=r, **kw)
        errs[r] = max(float(np.max(np.abs(_numpy(g).astype(np.float64) - x.astype(np.float64)),
                                   initial=0.0)) for g, x in zip(grads, ref))
    return errs


def _backward_explanation(grads, names, config, arrays):
    try:
        errs = _backward_profile_errors(grads, names, config, arrays)
    except Exception as e:  # the reference does not offer T's backward
        return f"no rounding profile to compare with ({e})"
    listed = ", ".join(f"{r} {e:.2e}" for r, e in errs.items())
    return (f"nearest rounding profile: {min(errs, key=errs.get)} (max |gradient - "
            f"reference|: {listed})")


def explain_rounding_backward(fn, config, array="numpy"):
    """explain_rounding for a backward `fn(q, k, v, dout, **kwargs) -> (dq,
    dk, dv[, dsinks])` on one bfloat16 or float16 AttentionConfig: the
    profile whose reference backward in T is nearest to fn's gradients (the
    largest distance over them), and the distance to each."""
    if config.dtype == "float32":
        raise ValueError("explain_rounding_backward needs a bfloat16 or float16 configuration "
                         "(float32 rounds nothing in between)")
    arrays = dict(config.arrays(), dout=config.dout())
    names = ("dq", "dk", "dv", "dsinks") if config.sinks else ("dq", "dk", "dv")
    got = _call(fn, arrays, ("q", "k", "v", "dout"), config.kwargs(), array)
    errs = _backward_profile_errors(got, names, config, arrays)
    return min(errs, key=errs.get), errs


def check_rope_config(fn, config, array="numpy", policy=Policy()):
    """Runs `fn(x, cos, sin, *, head_dim, n_rot, style, table_rows)` on one
    RopeConfig; raises CheckFailure on a mismatch."""
    _raise_on(_rope_problem(fn, config, array, policy), config)


def _rope_problem(fn, config, array, policy):
    arrays = config.arrays()
    try:
        got = _call(fn, arrays, ("x", "cos", "sin"), config.kwargs(), array)
    except Exception as e:
        return f"out: the function raised {type(e).__name__}: {e}"
    a64 = {n: a.astype(np.float64) for n, a in arrays.items()}
    ref64 = _api.rope(a64["x"], a64["cos"], a64["sin"], backend="reference", **config.kwargs())
    ref32 = _api.rope(arrays["x"], arrays["cos"], arrays["sin"], backend="reference_fp32acc",
                      **config.kwargs())
    return _compare("out", got, ref64, ref32, policy) or _deterministic(
        "out", fn, lambda: _call(fn, arrays, ("x", "cos", "sin"), config.kwargs(), array),
        policy)


def check_swiglu_config(fn, config, array="numpy", policy=Policy()):
    """Runs `fn(x, *, gate_first)` on one SwigluConfig; raises CheckFailure
    on a mismatch."""
    _raise_on(_swiglu_problem(fn, config, array, policy), config)


def _swiglu_problem(fn, config, array, policy):
    arrays = config.arrays()
    try:
        got = _call(fn, arrays, ("x",), config.kwargs(), array)
    except Exception as e:
        return f"out: the function raised {type(e).__name__}: {e}"
    ref64 = _api.swiglu(arrays["x"].astype(np.float64), backend="reference", **config.kwargs())
    ref32 = _api.swiglu(arrays["x"], backend="reference_fp32acc", **config.kwargs())
    return _compare("out", got, ref64, ref32, policy) or _deterministic(
        "out", fn, lambda: _call(fn, arrays, ("x",), config.kwargs(), array), policy)


# ---------------------------------------------------------------------------
# The Hypothesis driver


def _report(fn, what, config, problem, array, policy):
    named = getattr(fn, "func", fn)  # a functools.partial names its function
    fname = getattr(named, "__name__", "my_kernel")
    module = getattr(named, "__module__", None) or "mymodule"
    if module in ("__main__", "builtins", "functools") or fname == "<lambda>":
        module, fname = "mymodule", "my_kernel"
    pol = "" if policy == Policy() else f", policy={policy!r}"
    arr = "" if array == "numpy" else f", array={array!r}"
    imports = type(config).__name__ + (", Policy" if pol else "")
    return f"""tandem.testing: {fname} disagrees with tandem's reference ({what}).
Minimal configuration (shrunk by Hypothesis):

    {config!r}

  {problem}

The tensor contents come from seed={config.seed}. To replay, paste into a test file:

    from tandem.testing import {imports}, check_{what}_config
    from {module} import {fname}

    def test_{fname}_{what}_regression():
        check_{what}_config({fname}, {config!r}{arr}{pol})
"""


def _run(fn, what, strategy, problem_of, array, policy, max_examples, time_budget, seed):
    found = shrunk_failure(strategy, lambda config: problem_of(fn, config, array, policy),
                           max_examples, time_budget, seed)
    if found:
        config, problem = found
        raise CheckFailure(_report(fn, what, config, problem, array, policy), config)


def check_attention(fn, *, array="numpy", policy=Policy(), max_examples=200, time_budget=30.0,
                    seed=None, **space):
    """Checks `fn(q, k, v, *, layout, mask, window, scale, softcap[, bias]
    [, key_padding][, sinks][, alibi_slopes]) -> out` (tandem.attention's
    signature) on drawn AttentionConfigs; `space` takes attention_configs'
    switches (e.g. softcap=False, masks=("none", "causal")) to leave out what
    fn does not support, or to draw sinks and ALiBi (sinks=True,
    alibi=ALIBI). Raises CheckFailure with a shrunk configuration."""
    _run(fn, "attention", attention_configs(**space), _attention_problem, array, policy,
         max_examples, time_budget, seed)


def check_attention_backward(fn, *, array="numpy", policy=Policy(), max_examples=100,
                             time_budget=30.0, seed=None, **space):
    """Checks `fn(q, k, v, dout, **kwargs) -> (dq, dk, dv)` (kwargs as for
    check_attention; with sinks=True, -> (dq, dk, dv, dsinks)) on drawn
    AttentionConfigs; with dtypes=("bfloat16", ...) the gradients are T's
    and held to SPEC §10.5's bound of the profile policy.rounding (module
    docstring)."""
    _run(fn, "attention_backward", attention_configs(**space), _attention_backward_problem,
         array, policy, max_examples, time_budget, seed)


def check_rope(fn, *, array="numpy", policy=Policy(), max_examples=200, time_budget=30.0,
               seed=None, **space):
    """Checks `fn(x, cos, sin, *, head_dim, n_rot, style, table_rows) -> out`
    (tandem.rope's signature) on drawn RopeConfigs."""
    _run(fn, "rope", rope_configs(**space), _rope_problem, array, policy, max_examples,
         time_budget, seed)


def check_swiglu(fn, *, array="numpy", policy=Policy(), max_examples=200, time_budget=30.0,
                 seed=None, **space):
    """Checks `fn(x, *, gate_first) -> out` (tandem.swiglu's signature) on
    drawn SwigluConfigs."""
    _run(fn, "swiglu", swiglu_configs(**space), _swiglu_problem, array, policy, max_examples,
         time_budget, seed)


# ---------------------------------------------------------------------------
# Batch invariance (SPEC §12)

#: The invariance checks, in the order check_invariance runs them.
INVARIANCE_CHECKS = ("batch", "packed", "paged", "decode", "chunked_prefill", "origin")


class InvarianceFailure(AssertionError):
    """A row whose bits differ between two ways of computing it: the
    `check` (one of INVARIANCE_CHECKS or BACKWARD_INVARIANCE_CHECKS), the
    `sequence` (an index into the configuration's lengths), the `query`
    (the row's position in the sequence: a key's for dk and dv), the
    `head` (a kv head's for dk and dv), the output that differs (`output`:
    "out", "lse", "dq", "dk" or "dv"), the largest |difference| over the
    row (`max_diff`, inf when a NaN or inf differs) and what the row was
    compared with (`detail`)."""

    def __init__(self, check, sequence, query, head, output, max_diff, detail, config):
        self.check, self.sequence, self.query, self.head = check, sequence, query, head
        self.output, self.max_diff, self.detail, self.config = output, max_diff, detail, config
        row = "key" if output in ("dk", "dv") else "query"
        super().__init__(
            f"tandem.testing: {check} invariance broken: sequence {sequence} (length "
            f"{config.lengths[sequence]}), {row} {query}, head {head}: the bits of {output} "
            f"differ, max |diff| {max_diff:.3e} ({detail})\n    {config!r}")


@dataclasses.dataclass(frozen=True)
class InvarianceConfig:
    """The sequences of an invariance check: one per entry of `lengths`
    (prefill: Sq = Sk = length, bottom-right `mask` "causal" or
    "sliding_window" with `window`), q [L, H, D], k [L, Hkv, D], v
    [L, Hkv, Dv] drawn from `seed` and rounded to `dtype`; sinks [H] when
    `sinks`; `softcap`. `chunks`: the chunk sizes of the chunked prefills;
    `block_sizes`: those of the paged caches; `paged_queries`: the Sq of a
    paged call besides decode steps (Sq = 1). The default lengths cross the
    64-key blocks and the 1024-key chunks of tandem's invariant order."""
    lengths: tuple = (1, 5, 63, 64, 65, 130, 1100)
    H: int = 4
    Hkv: int = 2
    D: int = 16
    Dv: int = 16
    mask: str = "causal"
    window: int = 0
    softcap: float = 0.0
    sinks: bool = False
    chunks: tuple = (7, 64, 100)
    block_sizes: tuple = (1, 16, 64, 48)
    paged_queries: int = 3
    dtype: str = "float32"
    seed: int = 0

    def sequences(self):
        """[(q, k, v)] per sequence, NumPy arrays [L, heads, width]."""
        rng = _rng(self.seed)
        out = []
        for L in self.lengths:
            q, k, v = (_storage(rng.standard_normal((L, h, w)).astype(np.float32), self.dtype)
                       for h, w in ((self.H, self.D), (self.Hkv, self.D), (self.Hkv, self.Dv)))
            out.append((q, k, v))
        return out

    def sink_logits(self):
        if not self.sinks:
            return None
        return _storage(_rng(self.seed + 1).standard_normal(self.H).astype(np.float32),
                        self.dtype)

    def kwargs(self):
        """The keyword arguments of every call (tandem.attention's)."""
        return {"mask": self.mask, "window": self.window if self.mask == "sliding_window"
                else None, "scale": None, "softcap": self.softcap}


def _call_in(fn, arrays, kw, array):
    """fn(*arrays, **kw) with the NumPy arrays among them (and among kw's
    values) given in framework `array`; fn's result as it returns it."""
    arrays = [np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a for a in arrays]
    named = _framework(dict(enumerate(arrays), **{k: v for k, v in kw.items()
                                                   if isinstance(v, np.ndarray)}), array)
    kw = {k: named.get(k, v) for k, v in kw.items()}
    return fn(*(named[i] for i in range(len(arrays))), **kw)


def _bits(x):
    """x's elements as unsigned integers of their width (bitwise comparison)."""
    x = np.ascontiguousarray(x)
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


class _Invariance:
    """The calls of check_invariance and their comparison. A row is
    (sequence, query position, head); each check computes rows two ways and
    `compare` raises InvarianceFailure at the first row (in the order of the
    rows given, then heads) whose bits differ."""

    def __init__(self, fn, paged_fn, config, array):
        self.fn, self.paged_fn, self.c, self.array = fn, paged_fn, config, array
        self.seqs = config.sequences()
        self.sinks = config.sink_logits()
        self.rows = dict.fromkeys(INVARIANCE_CHECKS, 0)
        self._alone = {}  # (sequence, Sq) -> its rows, fn on it alone

    def _kw(self, extra):
        kw = dict(self.c.kwargs(), **extra)
        if self.sinks is not None:
            kw["sinks"] = self.sinks
        return kw

    def _run(self, fn, arrays, kw):
        """fn(*arrays, **kw) in the chosen framework; (out, lse or None) as
        NumPy arrays."""
        got = _call_in(fn, arrays, kw, self.array)
        if isinstance(got, (tuple, list)):
            return _numpy(got[0]), None if got[1] is None else _numpy(got[1])
        return _numpy(got), None

    def call(self, q, k, v, **extra):
        """fn on q [B, Sq, H, D] (or packed [total, H, D] with cu_seqlens)."""
        layout = "thd" if "cu_seqlens_q" in extra else "bshd"
        return self._run(self.fn, (q, k, v), self._kw(dict(extra, layout=layout)))

    def paged_call(self, q, k_cache, v_cache, table, seqlens):
        return self._run(self.paged_fn, (q, k_cache, v_cache, table, seqlens), self._kw({}))

    def compare(self, check, detail, seq, pos, got, want):
        """got and want: (out [R, H, Dv], lse [R, H] or None) for the rows
        (seq[r], pos[r]); raises InvarianceFailure at the first that differs."""
        self.rows[check] += len(seq)
        bad = {}
        for name, g, w in (("out", got[0], want[0]), ("lse", got[1], want[1])):
            if g is None or w is None:
                continue
            if g.shape != w.shape or g.dtype != w.dtype:
                raise AssertionError(f"tandem.testing: {check}: {name} {g.dtype}"
                                     f"{list(g.shape)} vs {w.dtype}{list(w.shape)} ({detail})")
            bad[name] = (_bits(g) != _bits(w)).reshape(len(seq), self.c.H, -1).any(-1)
        either = np.logical_or.reduce(list(bad.values()))
        if either.any():
            r, h = (int(i) for i in np.argwhere(either)[0])
            name = "out" if bad["out"][r, h] else "lse"
            g, w = (x[0 if name == "out" else 1][r, h] for x in (got, want))
            with np.errstate(invalid="ignore"):
                d = np.abs(np.asarray(g).astype(np.float64) - np.asarray(w).astype(np.float64))
            d = float(np.max(np.where(np.isnan(d), np.inf, d), initial=0.0))
            raise InvarianceFailure(check, int(seq[r]), int(pos[r]), h, name, d, detail, self.c)

    # -- per-sequence calls --------------------------------------------------

    def alone(self, s, Sq):
        """fn on sequence s alone, its last Sq queries against all its keys:
        (out [Sq, H, Dv], lse [Sq, H] or None)."""
        if (s, Sq) not in self._alone:
            q, k, v = self.seqs[s]
            out, lse = self.call(q[None, len(q) - Sq:], k[None], v[None])
            self._alone[s, Sq] = out[0], None if lse is None else lse[0].T
        return self._alone[s, Sq]

    # -- the checks ------------------------------------------------------------

    def batch(self):
        """Every sequence of at least m keys, cut to its first m (a prefill,
        and a decode step at m - 1), for each length m: the batch in one
        call, then each entry alone and the two halves of the batch."""
        for m in sorted(set(self.c.lengths)):
            members = [s for s, L in enumerate(self.c.lengths) if L >= m]
            for Sq in sorted({m, 1}):
                def part(ids):
                    q, k, v = (np.stack([self.seqs[s][i][:m] for s in ids]) for i in range(3))
                    return self.call(q[:, m - Sq:], k, v)
                whole = part(members)
                half = (len(members) + 1) // 2
                parts = [[s] for s in members] + ([members[:half], members[half:]]
                                                   if len(members) > 2 else [])
                for ids in parts:
                    got = part(ids)
                    at = [members.index(s) for s in ids]
                    seq = np.repeat(ids, Sq)
                    pos = np.tile(np.arange(m - Sq, m), len(ids))
                    self.compare("batch", f"entries {ids} alone vs a batch of "
                                 f"{len(members)} (Sq {Sq}, Sk {m})", seq, pos,
                                 _flat(got), _flat(_take(whole, at)))

    def packed(self):
        """The sequences packed along the token axis (cu_seqlens_q,
        cu_seqlens_k) against each alone: the prefills, and each sequence's
        last paged_queries queries (fewer when shorter)."""
        lengths = list(self.c.lengths)
        for sq in (lengths, [min(L, self.c.paged_queries) for L in lengths]):
            q = np.concatenate([s[0][L - n:] for s, L, n in zip(self.seqs, lengths, sq)])
            k, v = (np.concatenate([s[i] for s in self.seqs]) for i in (1, 2))
            cu_q = np.concatenate([[0], np.cumsum(sq)]).astype(np.int32)
            cu_k = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            out, lse = self.call(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
            lse = None if lse is None else lse.reshape(self.c.H, -1).T
            for s, (L, n) in enumerate(zip(lengths, sq)):
                rows = slice(cu_q[s], cu_q[s + 1])
                self.compare("packed", f"sequence {s} alone vs {len(lengths)} packed "
                             f"(Sq {n}, Sk {L})", np.full(n, s), np.arange(L - n, L),
                             self.alone(s, n), (out[rows], None if lse is None else lse[rows]))

    def paged(self):
        """Every sequence's keys in a paged cache of each block size (blocks
        in a shuffled order, spare blocks between them), its last Sq queries
        (Sq = 1 and paged_queries) in one batched paged call, against the
        same keys contiguous, each sequence alone."""
        if self.paged_fn is None:
            return
        rng = _rng(self.c.seed + 2)
        for bs in self.c.block_sizes:
            for Sq in sorted({1, self.c.paged_queries}):
                ids = [s for s, L in enumerate(self.c.lengths) if L >= Sq]
                need = [-(-self.c.lengths[s] // bs) for s in ids]
                nblocks = 2 * sum(need) + 1
                kc = np.zeros((nblocks, bs, self.c.Hkv, self.c.D), self.seqs[0][1].dtype)
                vc = np.zeros((nblocks, bs, self.c.Hkv, self.c.Dv), self.seqs[0][2].dtype)
                for x in (kc, vc):  # what no sequence owns: never read
                    x[...] = _storage(rng.standard_normal(x.shape).astype(np.float32),
                                      self.c.dtype)
                order = rng.permutation(nblocks)
                table = np.zeros((len(ids), max(need)), np.int32)
                used = 0
                for b, s in enumerate(ids):
                    _, k, v = self.seqs[s]
                    for j in range(need[b]):
                        blk = table[b, j] = order[used]
                        used += 1
                        n = min(bs, len(k) - j * bs)
                        kc[blk, :n], vc[blk, :n] = k[j * bs:j * bs + n], v[j * bs:j * bs + n]
                q = np.stack([self.seqs[s][0][self.c.lengths[s] - Sq:] for s in ids])
                seqlens = np.array([self.c.lengths[s] for s in ids], np.int32)
                got = self.paged_call(q, kc, vc, table, seqlens)
                for b, s in enumerate(ids):
                    L = self.c.lengths[s]
                    self.compare("paged", f"block size {bs}, a batch of {len(ids)} (Sq {Sq}) "
                                 f"vs the same keys contiguous, sequence {s} alone",
                                 np.full(Sq, s), np.arange(L - Sq, L), _flat(_take(got, [b])),
                                 self.alone(s, Sq))

    def decode(self):
        """Each sequence's prefill against its decode steps: query t alone
        against keys 0..t (the growing cache)."""
        for s, (q, k, v) in enumerate(self.seqs):
            L = len(q)
            want = self.alone(s, L)
            for t in range(L):
                out, lse = self.call(q[None, t:t + 1], k[None, :t + 1], v[None, :t + 1])
                self.compare("decode", f"decode step {t} vs the prefill of {L}", [s], [t],
                             (out[0], None if lse is None else lse[0].T),
                             (want[0][t:t + 1], None if want[1] is None else want[1][t:t + 1]))

    def chunked_prefill(self):
        """Each sequence's prefill against its prefill in chunks of c
        queries, each chunk against the keys up to its last query."""
        for s, (q, k, v) in enumerate(self.seqs):
            L = len(q)
            want = self.alone(s, L)
            for c in self.c.chunks:
                if c >= L:
                    continue
                for a in range(0, L, c):
                    b = min(a + c, L)
                    out, lse = self.call(q[None, a:b], k[None, :b], v[None, :b])
                    self.compare("chunked_prefill", f"chunk {a}:{b} (chunks of {c}) vs the "
                                 f"prefill of {L}", np.full(b - a, s), np.arange(a, b),
                                 (out[0], None if lse is None else lse[0].T),
                                 (want[0][a:b], None if want[1] is None else want[1][a:b]))


    def origin(self):
        """With mask "sliding_window": each sequence's decode steps from a
        cache that has dropped the keys the window hides from them (keys
        t - window .. t, key_origin = t - window, as a sliding-window cache
        keeps them), against its prefill (SPEC §12.1)."""
        if self.c.mask != "sliding_window":
            return
        for s, (q, k, v) in enumerate(self.seqs):
            L = len(q)
            want = self.alone(s, L)
            for t in range(self.c.window + 1, L):
                first = t - self.c.window
                out, lse = self.call(q[None, t:t + 1], k[None, first:t + 1],
                                     v[None, first:t + 1], key_origin=np.array([first]))
                self.compare("origin", f"decode step {t} from a cache of keys {first}..{t} "
                             f"(key_origin {first}) vs the prefill of {L}", [s], [t],
                             (out[0], None if lse is None else lse[0].T),
                             (want[0][t:t + 1], None if want[1] is None else want[1][t:t + 1]))


def _take(got, entries):
    """The batch entries `entries` of (out [B, Sq, H, Dv], lse [B, H, Sq])."""
    out, lse = got
    return out[entries], None if lse is None else lse[entries]


def _flat(got):
    """(out [B, Sq, H, Dv], lse [B, H, Sq]) as rows: ([B*Sq, H, Dv], [B*Sq, H])."""
    out, lse = got
    B, Sq, H = out.shape[:3]
    return (out.reshape(B * Sq, H, -1),
            None if lse is None else lse.transpose(0, 2, 1).reshape(B * Sq, H))


def check_invariance(fn, *, paged_fn=None, config=InvarianceConfig(), checks=INVARIANCE_CHECKS,
                     array="numpy"):
    """Checks that `fn` (tandem.attention's signature: fn(q, k, v, *, layout,
    mask, window, scale, softcap[, sinks][, cu_seqlens_q, cu_seqlens_k]) ->
    out, or (out, lse) as tandem.attention_forward_lse returns them)
    computes every query row bitwise the same however the call is cut (SPEC
    §12), on the sequences of `config` (InvarianceConfig):

    - "batch": a batch against its entries alone and its halves (prefills
      and decode steps; q [B, Sq, H, D], bshd);
    - "packed": the sequences packed (layout "thd", cu_seqlens_q,
      cu_seqlens_k) against each alone;
    - "paged": with `paged_fn` (tandem.attention_with_kvcache's signature:
      paged_fn(q, k_cache, v_cache, block_table, cache_seqlens, *, mask,
      window, scale, softcap[, sinks])), a batch over a paged cache of each
      block size against the same keys contiguous (fn, each sequence alone);
    - "decode": a prefill against its decode steps (query t alone against
      keys 0..t, mask bottom-right);
    - "chunked_prefill": a prefill against the same in chunks;
    - "origin" (mask "sliding_window" only; fn takes key_origin): a decode
      step from a cache without the keys the window hides, key_origin the
      position of its first key, against the prefill.

    `checks` picks some; `array` "torch" passes torch tensors. Raises
    InvarianceFailure at the first row whose bits differ (which check,
    sequence, query, head, output, max |diff|); else returns the number of
    rows each check compared, for the checks that apply to the config
    ("paged" needs paged_fn, "origin" a sliding window)."""
    unknown = set(checks) - set(INVARIANCE_CHECKS)
    if unknown:
        raise ValueError(f"checks: {sorted(unknown)} are not among {INVARIANCE_CHECKS}")
    run = _Invariance(fn, paged_fn, config, array)
    for name in INVARIANCE_CHECKS:
        if name in checks:
            getattr(run, name)()
    applies = {"paged": paged_fn is not None, "origin": config.mask == "sliding_window"}
    return {name: n for name, n in run.rows.items() if name in checks and applies.get(name, True)}


BACKWARD_INVARIANCE_CHECKS = ("batch", "packed")


def check_backward_invariance(fn, *, config=InvarianceConfig(),
                              checks=BACKWARD_INVARIANCE_CHECKS, array="numpy"):
    """Checks that `fn` (tandem.attention_backward's signature: fn(q, k, v,
    dout, *, layout, mask, window, scale, softcap[, sinks][, cu_seqlens_q,
    cu_seqlens_k]) -> (dq, dk, dv, ...)) gives every sequence's dq, dk and dv
    bitwise the same however it is batched (SPEC §12.1, the backward), on
    the prefills of `config` (dout drawn from seed + 3):

    - "batch": the sequences cut to each length m, in one batch against
      each alone and the two halves of the batch (bshd);
    - "packed": the sequences packed (layout "thd") against each alone.

    dsinks, a sum over the batch, is not compared. Raises
    InvarianceFailure at the first row (dq: a query's, dk and dv: a key's,
    per head) whose bits differ; else returns the rows each check compared."""
    unknown = set(checks) - set(BACKWARD_INVARIANCE_CHECKS)
    if unknown:
        raise ValueError(f"checks: {sorted(unknown)} are not among "
                         f"{BACKWARD_INVARIANCE_CHECKS}")
    run = _BackwardInvariance(fn, config, array)
    return {name: getattr(run, name)() for name in BACKWARD_INVARIANCE_CHECKS if name in checks}


class _BackwardInvariance:
    """The calls of check_backward_invariance: each sequence's prefill and
    its dout, the gradients of a batch or a packed call against those of
    each sequence alone."""

    def __init__(self, fn, config, array):
        self.fn, self.c, self.array = fn, config, array
        self.seqs = config.sequences()
        rng = _rng(config.seed + 3)
        self.douts = [_storage(rng.standard_normal((len(q), config.H, config.Dv))
                               .astype(np.float32), config.dtype) for q, _, _ in self.seqs]
        self.sinks = config.sink_logits()
        self._alone = {}  # (sequence, m) -> (dq, dk, dv) of its first m tokens alone

    def call(self, q, k, v, dout, **extra):
        """(dq, dk, dv) of fn as NumPy arrays."""
        kw = dict(self.c.kwargs(), layout="thd" if "cu_seqlens_q" in extra else "bshd",
                  **extra)
        if self.sinks is not None:
            kw["sinks"] = self.sinks
        got = _call_in(self.fn, (q, k, v, dout), kw, self.array)
        return tuple(_numpy(g) for g in got[:3])

    def alone(self, s, m):
        if (s, m) not in self._alone:
            (q, k, v), d = self.seqs[s], self.douts[s]
            got = self.call(q[None, :m], k[None, :m], v[None, :m], d[None, :m])
            self._alone[s, m] = tuple(g[0] for g in got)
        return self._alone[s, m]

    def compare(self, check, detail, s, got, want):
        """got, want: (dq [m, H, D], dk [m, Hkv, D], dv [m, Hkv, Dv]) of
        sequence s; the rows compared."""
        rows = 0
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            if g.shape != w.shape or g.dtype != w.dtype:
                raise AssertionError(f"tandem.testing: {check}: {name} {g.dtype}"
                                     f"{list(g.shape)} vs {w.dtype}{list(w.shape)} ({detail})")
            rows += g.shape[0]
            bad = (_bits(g) != _bits(w)).reshape(g.shape[0], g.shape[1], -1).any(-1)
            if bad.any():
                r, h = (int(i) for i in np.argwhere(bad)[0])
                with np.errstate(invalid="ignore"):
                    d = np.abs(g[r, h].astype(np.float64) - w[r, h].astype(np.float64))
                d = float(np.max(np.where(np.isnan(d), np.inf, d), initial=0.0))
                raise InvarianceFailure(check, s, r, h, name, d, detail, self.c)
        return rows

    def batch(self):
        rows = 0
        for m in sorted(set(self.c.lengths)):
            members = [s for s, L in enumerate(self.c.lengths) if L >= m]

            def part(ids):
                q, k, v = (np.stack([self.seqs[s][i][:m] for s in ids]) for i in range(3))
                return self.call(q, k, v, np.stack([self.douts[s][:m] for s in ids]))
            whole = part(members)
            half = (len(members) + 1) // 2
            for ids in ([members[:half], members[half:]] if len(members) > 2 else []):
                got = part(ids)
                for b, s in enumerate(ids):
                    rows += self.compare("batch", f"entries {ids} vs a batch of {len(members)} "
                                         f"(S {m})", s, tuple(g[b] for g in got),
                                         tuple(g[members.index(s)] for g in whole))
            for b, s in enumerate(members):
                rows += self.compare("batch", f"sequence {s} alone vs a batch of "
                                     f"{len(members)} (S {m})", s, self.alone(s, m),
                                     tuple(g[b] for g in whole))
        return rows

    def packed(self):
        lengths = list(self.c.lengths)
        q, k, v = (np.concatenate([s[i] for s in self.seqs]) for i in range(3))
        d = np.concatenate(self.douts)
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        got = self.call(q, k, v, d, cu_seqlens_q=cu, cu_seqlens_k=cu)
        rows = 0
        for s, L in enumerate(lengths):
            at = slice(cu[s], cu[s + 1])
            rows += self.compare("packed", f"sequence {s} alone vs {len(lengths)} packed "
                                 f"(S {L})", s, self.alone(s, L), tuple(g[at] for g in got))
        return rows


# ---------------------------------------------------------------------------
# FlexAttention (SPEC §13)


def check_flex_attention(fn, *, check_grads=False, block_masks=None, max_examples=60,
                         time_budget=30.0, seed=None, **space):
    """Checks `fn(q, k, v, score_mod=, block_mask=, scale=, enable_gqa=) ->
    out` (torch.nn.attention.flex_attention.flex_attention's signature:
    torch's eager flex_attention and tandem.flex_attention are checked as
    they are) against tandem's reference in float64 on drawn FlexCases:
    q [B, H, Sq, D], k, v [B, Hkv, Sk, D or Dv] (GQA, Sq != Sk, lengths
    not multiples of the block sizes), scale, score_mods and mask_mods drawn
    as programs (flex_mods), block masks made by tandem.create_block_mask
    (passed as tandem's BlockMask, or as torch's with block_masks="torch",
    the default when fn comes from torch). With check_grads=True, dq, dk and
    dv by torch.autograd.grad of fn's output against dout are checked too,
    and, when the score_mod reads the captured float tensor `table`, its
    gradient dtable (summed over every score that reads each entry).
    `space` takes flex_cases' switches (gqa=False, block_masks=False, ...).

    Tolerance (SPEC §13.4 in float64, where both sides only round, u =
    2^-53, gamma_n = n u / (1 - n u)): the score s = scale <q, k> is within
    (D + 2) u S of exact, S = scale max|q_i| max|k_j|; the mod's result t
    within E of exact and at most T in size, E and T bounded node by node
    by first-order forward error analysis (Program.error_bound); e^(t -
    max t) is then within eps = 2E + 2uT + 2u, relative, and each
    implementation's out within (2 eps + 2 gamma_(Sk+1)) max|v|. Two
    implementations each within that bound differ by at most twice it: the
    tolerance of out, absolute, elementwise. A gradient g is held to 2
    eps_g M_g, eps_g = 2 eps + 4 (L + 1) u + 4E + gamma_(Sq+Sk+D+Dv+4) (L
    the mod's length) and M_g a bound of |g| from the inputs' sizes and F
    >= |dt/ds| (Program.slope_bound): M_dv = G Sq max|dO|, M_dq = scale F
    dt max|k|, M_dk = G Sq scale F dt max|q|, dt = 2 Dv max|dO| max|v|, G =
    H / Hkv; dtable is held to 2 (eps_g + gamma_(B H Sq Sk)) M_dtable, M_dtable
    = B H Sq F_t dt with F_t >= |dt/dtable[e]| (Program.table_slope_bound).
    out and gradients must also be finite and of the reference's shape.

    Raises FlexFailure (an AssertionError) with the shrunk case, the mods'
    source and a pytest test that replays it."""
    _flex_run(fn, check_grads, block_masks, max_examples, time_budget, seed, space)
