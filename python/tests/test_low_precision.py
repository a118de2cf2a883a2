# SPDX-License-Identifier: Apache-2.0
"""bfloat16 and float16 storage (SPEC §10): NumPy (ml_dtypes.bfloat16,
np.float16) and torch tensors cross without a copy, one storage type per
call (the input that differs is named), lse and masks float32, the rounding
profiles by name, a backend that does not offer an entry point at a storage
type says so; and the results against exact arithmetic within SPEC §10.5's
bound, the optimized backend against the reference, RoPE and SwiGLU rounded
once, the quantized caches of SPEC §10.4."""

import ml_dtypes
import numpy as np
import pytest
import torch

import tandem
from tandem import _arrays, _ext

BF16 = ml_dtypes.bfloat16
#: unit roundoff u of each storage type (SPEC §10.1)
UNIT = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
NUMPY = {"bfloat16": BF16, "float16": np.float16}
TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16}
LOW = ("bfloat16", "float16")
BACKENDS = ("reference", "optimized")


def offered(entry, dtype, backend):
    """Skips the test (with the reason) when `backend` does not offer `entry`
    at `dtype`; test_not_offered checks that such a call raises."""
    if not tandem.offers(entry, dtype, backend):
        pytest.skip(f"{backend} does not offer {entry} at {dtype} yet")


def draw(shape, dtype, seed, scale=1.0):
    """Standard normal values rounded to `dtype` (NumPy)."""
    x = scale * np.random.default_rng(seed).standard_normal(shape)
    return x.astype(np.float32).astype(NUMPY[dtype])


def f64(x):
    """The exact values of a stored array, in float64."""
    if isinstance(x, torch.Tensor):
        return x.detach().double().numpy()
    return np.asarray(x).astype(np.float64)


# ---------------------------------------------------------------------------
# Crossing, storage types, names


@pytest.mark.parametrize("dtype", LOW)
def test_arrays_cross_without_a_copy(dtype):
    a = draw((3, 5), dtype, 0)
    assert _ext.address(_arrays.crossing(a)) == a.ctypes.data
    t = torch.from_numpy(a.astype(np.float32)).to(TORCH[dtype])
    assert _ext.address(_arrays.crossing(t)) == t.data_ptr()
    # a bf16 NumPy array crosses as its bits: the same memory, read as uint16
    if dtype == "bfloat16":
        assert _arrays.crossing(a).dtype == np.uint16


def bad_calls(dtype):
    """(call, parameter) pairs mixing storage types: q of `dtype` and one input of float32."""
    lo, hi = draw((1, 4, 2, 8), dtype, 1), draw((1, 4, 2, 8), dtype, 1).astype(np.float32)
    x, x32 = draw((3, 8), dtype, 2), draw((3, 8), dtype, 2).astype(np.float32)
    cos = np.ones((4, 4), NUMPY[dtype])
    return [
        (lambda: tandem.attention(lo, hi, lo), "k.dtype"),
        (lambda: tandem.attention(lo, lo, hi), "v.dtype"),
        (lambda: tandem.attention(lo, lo, lo, sinks=np.zeros(2, np.float32)), "sinks.dtype"),
        (lambda: tandem.attention_backward(lo, lo, lo, hi), "dout.dtype"),
        (lambda: tandem.attention_backward_saved(lo, lo, lo, lo, np.zeros((1, 2, 4), np.float32),
                                                 hi), "dout.dtype"),
        (lambda: tandem.swiglu_backward(x, x32[:, :4]), "dy.dtype"),
        (lambda: tandem.rope(lo, cos.astype(np.float32), cos), "cos.dtype"),
        (lambda: tandem.rope_qk(lo, hi, cos, cos, layout="bshd"), "k.dtype"),
    ]


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("case", range(8))
def test_a_call_mixing_storage_types_names_the_input_that_differs(dtype, case):
    call, parameter = bad_calls(dtype)[case]
    with pytest.raises(tandem.Error) as info:
        call()
    assert info.value.parameter == parameter, str(info.value)
    assert "one storage type" in str(info.value)


def test_torch_tensors_mixing_storage_types_are_refused():
    q = torch.randn(1, 3, 2, 4, dtype=torch.bfloat16)
    with pytest.raises(tandem.Error) as info:
        tandem.attention(q, q, q.half())
    assert info.value.parameter == "v.dtype"
    assert "must be bfloat16" in str(info.value)


def test_lse_of_a_low_precision_call_must_be_float32():
    q = draw((1, 4, 2, 8), "bfloat16", 3)
    with pytest.raises(tandem.Error) as info:
        tandem.attention_backward_saved(q, q, q, q, np.zeros((1, 2, 4), BF16), q)
    assert info.value.parameter == "lse.dtype"
    assert "float32" in str(info.value)


@pytest.mark.parametrize("mask", [torch.bfloat16, torch.float16, BF16, np.float16])
def test_a_low_precision_mask_is_read_exactly_into_float32(mask):
    values = np.array([[0.0, -1.5, 3.140625, -np.inf]], np.float32)
    m = torch.from_numpy(values).to(mask) if isinstance(mask, torch.dtype) else \
        values.astype(mask)
    got = _arrays.to_float32(m, "bias")
    got = got.numpy() if isinstance(got, torch.Tensor) else got
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, values)  # every value above is a bf16 and an f16


def test_rounding_profiles_by_name():
    q = np.random.default_rng(4).standard_normal((1, 4, 2, 8)).astype(np.float32)
    with pytest.raises(tandem.Error) as info:
        tandem.attention(q, q, q, rounding="truncate")
    assert info.value.parameter == "rounding"
    assert "pytorch, exact, ggml" in str(info.value)
    # float32 storage rounds nothing in between, whatever the profile (SPEC §10.2)
    ref = tandem.attention(q, q, q, backend="reference")
    for r in ("pytorch", "exact", "ggml"):
        np.testing.assert_array_equal(tandem.attention(q, q, q, rounding=r,
                                                       backend="reference"), ref)


ENTRIES = {
    "attention_forward": lambda t, b: tandem.attention(t["q"], t["q"], t["q"], backend=b),
    "attention_forward_lse": lambda t, b: tandem.attention_forward_lse(t["q"], t["q"], t["q"],
                                                                       backend=b),
    "attention_backward": lambda t, b: tandem.attention_backward(t["q"], t["q"], t["q"], t["q"],
                                                                 backend=b),
    "swiglu_forward": lambda t, b: tandem.swiglu(t["x"], backend=b),
    "rope_forward": lambda t, b: tandem.rope(t["q"], t["cos"], t["cos"], backend=b),
    "quantize_kv": lambda t, b: tandem.quantize_kv(t["q"], t["q"], backend=b),
    "attention_block": lambda t, b: tandem.attention_block(t["x"].reshape(1, 3, 8),
                                                           t["w"], t["w"][:8], num_heads=2,
                                                           backend=b),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("entry", ENTRIES)
def test_an_entry_point_not_offered_is_an_error_naming_the_backend(backend, dtype, entry):
    t = {"q": draw((1, 4, 2, 8), dtype, 5), "x": draw((3, 8), dtype, 6),
         "cos": np.ones((4, 4), NUMPY[dtype]), "w": draw((24, 8), dtype, 7)}
    if tandem.offers(entry, dtype, backend):
        ENTRIES[entry](t, backend)  # an offered entry point runs
        return
    with pytest.raises(tandem.Error) as info:
        ENTRIES[entry](t, backend)
    assert info.value.parameter == "backend"
    assert f"does not offer {entry} at {dtype}" in str(info.value)


def test_reference_fp32acc_runs_float32_only():
    q = draw((1, 4, 2, 8), "bfloat16", 7)
    with pytest.raises(tandem.Error) as info:
        tandem.attention(q, q, q, backend="reference_fp32acc")
    assert info.value.parameter == "backend"


# ---------------------------------------------------------------------------
# Attention against exact arithmetic (SPEC §10.5) and across backends


def attention_case(dtype, seed, layout="bshd", Sq=5, Sk=9, H=4, Hkv=2, D=8, Dv=6):
    shape = (lambda S, h, d: (2, S, h, d)) if layout == "bshd" else (lambda S, h, d: (2, h, S, d))
    return (draw(shape(Sq, H, D), dtype, seed), draw(shape(Sk, Hkv, D), dtype, seed + 1),
            draw(shape(Sk, Hkv, Dv), dtype, seed + 2))


def exact_bound(q, k, v, dtype, rounding, **kw):
    """SPEC §10.5's bound of |o - o_exact| for the profile: u_T |o_exact| (the
    output's rounding) + u_T sum_j p_ij |v_j| (the weights', pytorch and ggml)
    + the float32 arithmetic (2^-20 of sum_j p_ij |v_j|); o_exact in double."""
    exact = tandem.attention(f64(q), f64(k), f64(v), backend="reference", **kw)
    weights = tandem.attention(f64(q), f64(k), np.abs(f64(v)), backend="reference", **kw)
    u = UNIT[dtype]
    bound = u * np.abs(exact) + 2.0 ** -20 * weights
    if rounding != "exact":
        bound += u * weights
    if rounding == "ggml":  # the accumulator rounded after every key: up to Sk roundings
        bound += u * k.shape[1] * weights
    return exact, bound


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("rounding", ("pytorch", "exact", "ggml"))
@pytest.mark.parametrize("mask", ("none", "causal"))
def test_reference_attention_within_the_bound_of_exact_arithmetic(dtype, rounding, mask):
    offered("attention_forward", dtype, "reference")
    q, k, v = attention_case(dtype, 10)
    out = tandem.attention(q, k, v, mask=mask, rounding=rounding, backend="reference")
    assert out.dtype == NUMPY[dtype]
    exact, bound = exact_bound(q, k, v, dtype, rounding, mask=mask)
    assert np.all(np.abs(f64(out) - exact) <= bound)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("layout", ("bshd", "bhsd"))
def test_lse_is_float32_and_near_the_exact_lse(dtype, layout):
    offered("attention_forward_lse", dtype, "reference")
    q, k, v = attention_case(dtype, 20, layout)
    out, lse = tandem.attention_forward_lse(q, k, v, layout=layout, backend="reference")
    assert lse.dtype == np.float32 and out.dtype == NUMPY[dtype]
    _, lse64 = tandem.attention_forward_lse(f64(q), f64(k), f64(v), layout=layout,
                                            backend="reference")
    np.testing.assert_allclose(lse, lse64, rtol=2.0 ** -22, atol=2.0 ** -22)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("rounding", ("pytorch", "exact"))
def test_optimized_attention_agrees_with_the_reference(dtype, rounding):
    """Within one ulp of T of the reference with the same profile plus the
    float32 arithmetic (SPEC §10.5's first bound, with every key taken as
    ambiguous: ulp_T(w) |v| / l summed, at most 2 u_T sum_j p_ij |v_j|)."""
    offered("attention_forward", dtype, "reference")
    offered("attention_forward", dtype, "optimized")
    q, k, v = attention_case(dtype, 30, Sq=7, Sk=33, D=16, Dv=16)
    for mask in ("none", "causal"):
        ref = f64(tandem.attention(q, k, v, mask=mask, rounding=rounding, backend="reference"))
        got = f64(tandem.attention(q, k, v, mask=mask, rounding=rounding, backend="optimized"))
        weights = tandem.attention(f64(q), f64(k), np.abs(f64(v)), mask=mask,
                                   backend="reference")
        u = UNIT[dtype]
        bound = 2 * u * np.abs(ref) + 2 * u * weights + 2.0 ** -20 * weights
        assert np.all(np.abs(got - ref) <= bound), np.max(np.abs(got - ref) - bound)


@pytest.mark.parametrize("dtype", LOW)
def test_backward_within_the_bound_of_exact_arithmetic(dtype):
    """dq, dk, dv of T against the gradients in double of the stored inputs:
    each a sum of rounded terms, within u_T of |dX| and of the sum of the
    terms' magnitudes, which the double gradients of |.|-inputs bound."""
    offered("attention_backward", dtype, "reference")
    q, k, v = attention_case(dtype, 40)
    dout = draw((2, 5, 4, 6), dtype, 43)
    got = tandem.attention_backward(q, k, v, dout, mask="causal", backend="reference")
    exact = tandem.attention_backward(f64(q), f64(k), f64(v), f64(dout), mask="causal",
                                      backend="reference")
    u = UNIT[dtype]
    for g, e, name in zip(got, exact, ("dq", "dk", "dv")):
        assert g.dtype == NUMPY[dtype], name
        scale = np.abs(e) + np.max(np.abs(e))
        assert np.all(np.abs(f64(g) - e) <= 8 * u * scale + 1e-6), name


@pytest.mark.parametrize("dtype", LOW)
def test_saved_backward_matches_the_plain_backward(dtype):
    offered("attention_backward_saved", dtype, "reference")
    q, k, v = attention_case(dtype, 50)
    dout = draw((2, 5, 4, 6), dtype, 53)
    out, lse = tandem.attention_forward_lse(q, k, v, backend="reference")
    saved = tandem.attention_backward_saved(q, k, v, out, lse, dout, backend="reference")
    plain = tandem.attention_backward(q, k, v, dout, backend="reference")
    for a, b in zip(saved, plain):
        np.testing.assert_array_equal(f64(a), f64(b))


# ---------------------------------------------------------------------------
# RoPE, axial RoPE, SwiGLU: every output element rounded once (SPEC §10.2)


def rounded_once(x64, dtype):
    """RN_T of float64 values, as float64 (each value rounded once to T)."""
    return x64.astype(np.float32).astype(NUMPY[dtype]).astype(np.float64)


def within_one_rounding(got, exact64, dtype, terms=0.0):
    """|got - exact| <= u_T |exact| + 2^-22 (|exact| + terms): the one rounding
    to T of a value computed in float32, whose own error is a few 2^-24 of the
    value or, for a difference (RoPE's x_1 c - x_2 s), of its terms' magnitude."""
    err = np.abs(f64(got) - exact64)
    bound = UNIT[dtype] * np.abs(exact64) + 2.0 ** -22 * (np.abs(exact64) + terms) + 1e-30
    assert np.all(err <= bound), float(np.max(err - bound))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", LOW)
def test_swiglu_rounds_once(backend, dtype):
    offered("swiglu_forward", dtype, backend)
    offered("swiglu_backward", dtype, backend)
    x, dy = draw((6, 16), dtype, 60, 3.0), draw((6, 8), dtype, 61)
    within_one_rounding(tandem.swiglu(x, backend=backend),
                        tandem.swiglu(f64(x), backend="reference"), dtype)
    within_one_rounding(tandem.swiglu_backward(x, dy, backend=backend),
                        tandem.swiglu_backward(f64(x), f64(dy), backend="reference"), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", LOW)
def test_rope_rounds_once(backend, dtype):
    offered("rope_forward", dtype, backend)
    offered("rope_forward_qk", dtype, backend)
    q, k = draw((2, 5, 4, 8), dtype, 70), draw((2, 5, 2, 8), dtype, 71)
    angle = np.random.default_rng(72).uniform(-3, 3, (5, 4))
    cos, sin = np.cos(angle).astype(NUMPY[dtype]), np.sin(angle).astype(NUMPY[dtype])
    exact = tandem.rope(f64(q), f64(cos), f64(sin), layout="bshd", backend="reference")
    terms = 2 * max(np.abs(f64(q)).max(), np.abs(f64(k)).max())  # |x_1 c| + |x_2 s|
    within_one_rounding(tandem.rope(q, cos, sin, layout="bshd", backend=backend), exact, dtype,
                        terms)
    qo, ko = tandem.rope_qk(q, k, cos, sin, layout="bshd", backend=backend)
    within_one_rounding(qo, exact, dtype, terms)
    within_one_rounding(ko, tandem.rope(f64(k), f64(cos), f64(sin), layout="bshd",
                                        backend="reference"), dtype, terms)


def grid(shape, step, limit, dtype, seed):
    """Multiples of `step` in [-limit, limit] (exact in bf16 and f16)."""
    x = np.random.default_rng(seed).integers(-limit / step, limit / step + 1, shape) * step
    return x.astype(np.float32).astype(NUMPY[dtype])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", LOW)
def test_attention_block_is_its_parts_in_the_storage_type(backend, dtype):
    # SPEC §10.2/§10.5: on a grid where the qkv projection is exact, qkv = RN_T(x w_qkv^T + b),
    # then the backend's own rope and attention in T, then the out projection rounded once.
    offered("attention_block", dtype, backend)
    B, S, H, D = 2, 5, 2, 4
    E = H * D
    x, w_qkv = grid((B, S, E), 2.0 ** -3, 2, dtype, 80), grid((3 * E, E), 2.0 ** -6, 0.5, dtype, 81)
    b_qkv, w_out = grid((3 * E,), 2.0 ** -9, 0.5, dtype, 82), draw((E, E), dtype, 83, 0.3)
    b_out = draw((E,), dtype, 84)
    angle = np.random.default_rng(85).uniform(-3, 3, (S, D // 2))
    cos, sin = np.cos(angle).astype(NUMPY[dtype]), np.sin(angle).astype(NUMPY[dtype])
    keep = np.array([[1, 1, 1, 0, 1], [1, 0, 1, 1, 1]])
    out = tandem.attention_block(x, w_qkv, w_out, num_heads=H, b_qkv=b_qkv, b_out=b_out,
                                 key_padding=keep, cos=cos, sin=sin, backend=backend)
    assert out.dtype == x.dtype and out.shape == x.shape
    qkv = (f64(x) @ f64(w_qkv).T + f64(b_qkv)).astype(np.float32).astype(NUMPY[dtype])
    q, k, v = (np.ascontiguousarray(qkv[..., i * E:(i + 1) * E]).reshape(B, S, H, D)
               for i in range(3))
    q = tandem.rope(q, cos, sin, layout="bshd", backend=backend)
    k = tandem.rope(k, cos, sin, layout="bshd", backend=backend)
    a = tandem.attention(q, k, v, key_padding=keep, backend=backend).reshape(B, S, E)
    exact = f64(a) @ f64(w_out).T + f64(b_out)
    # float32 summation of E products and a bias: (E + 1)·2^-24 of their magnitudes
    terms = (E + 1) / 4 * (np.abs(f64(a)) @ np.abs(f64(w_out)).T + np.abs(f64(b_out)))
    within_one_rounding(out, exact, dtype, terms)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", LOW)
def test_axial_rope_rounds_once(backend, dtype):
    offered("axial_rope_forward", dtype, backend)
    x = draw((2, 6, 16), dtype, 80)
    kw = dict(end_x=3, end_y=2, num_heads=2)
    within_one_rounding(tandem.axial_rope(x, backend=backend, **kw),
                        tandem.axial_rope(f64(x), backend="reference", **kw), dtype,
                        2 * np.abs(f64(x)).max())


# ---------------------------------------------------------------------------
# Quantized KV caches (SPEC §10.4)


def int8_codes(k64):
    """SPEC §10.4's int8 scales [B', S', Hkv] and codes of k [B', S', Hkv, D]."""
    sigma = (np.abs(k64).max(-1) / 127).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (k64 / sigma[..., None].astype(np.float64)).astype(np.float32)
    codes = np.where(sigma[..., None] > 0, np.clip(np.round(ratio), -127, 127), 0)
    return codes.astype(np.int8), sigma


def e4m3_codes(k64):
    """SPEC §10.4's e4m3 scales [Hkv] and codes of k [B', S', Hkv, D]."""
    sigma = (np.abs(k64).max(axis=(0, 1, 3)) / 448).astype(np.float32)
    ratio = (k64 / sigma[None, None, :, None].astype(np.float64)).astype(np.float32)
    return ratio.astype(ml_dtypes.float8_e4m3fn), sigma


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ("float32",) + LOW)
@pytest.mark.parametrize("kind", ("int8", "e4m3"))
def test_quantize_kv_follows_the_spec(backend, dtype, kind):
    offered("quantize_kv", dtype, backend)
    k = draw((2, 7, 2, 8), dtype, 90) if dtype != "float32" else \
        np.random.default_rng(90).standard_normal((2, 7, 2, 8)).astype(np.float32)
    v = k[..., :6].copy()
    k[0, 3] = 0  # a zero row: scale 0, codes 0
    cache = tandem.quantize_kv(k, v, kind=kind, backend=backend)
    assert cache.kv_cache == kind
    expect_codes, expect_scale = (int8_codes if kind == "int8" else e4m3_codes)(f64(k))
    np.testing.assert_array_equal(cache.k_scale, expect_scale)
    np.testing.assert_array_equal(cache.k.view(np.uint8), expect_codes.view(np.uint8))
    assert cache.k.shape == k.shape and cache.v.shape == v.shape
    assert cache.v_scale.shape == ((2, 7, 2) if kind == "int8" else (2,))


def dequantized(codes, scale, kind):
    """The values a quantized cache stands for, in float64: sigma * code."""
    c = codes.astype(np.float64) if kind == "int8" else codes.astype(np.float32).astype(
        np.float64)
    s = scale.astype(np.float64)
    return c * (s[..., None] if kind == "int8" else s[None, None, :, None])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ("float32",) + LOW)
@pytest.mark.parametrize("kind", ("int8", "e4m3"))
def test_attention_over_a_quantized_cache(backend, dtype, kind):
    """Against the attention in double of the values the codes stand for,
    within SPEC §10.5's bound of the call's storage type."""
    offered("quantize_kv", dtype, backend)
    offered("attention_forward_quantized", dtype, backend)
    q, k, v = attention_case(dtype, 100) if dtype != "float32" else [
        x.astype(np.float32) for x in attention_case("bfloat16", 100)]
    cache = tandem.quantize_kv(k, v, kind=kind, backend=backend)
    out = tandem.attention(q, **cache._asdict(), mask="causal", backend=backend)
    assert out.dtype == q.dtype
    kd, vd = dequantized(cache.k, cache.k_scale, kind), dequantized(cache.v, cache.v_scale, kind)
    exact = tandem.attention(f64(q), kd, vd, mask="causal", backend="reference")
    weights = tandem.attention(f64(q), kd, np.abs(vd), mask="causal", backend="reference")
    u = UNIT.get(dtype, 2.0 ** -24)
    bound = u * np.abs(exact) + u * weights + 2.0 ** -18 * weights
    assert np.all(np.abs(f64(out) - exact) <= bound)


def test_quantized_cache_errors_name_the_argument():
    q = np.zeros((1, 3, 2, 4), np.float32)
    with pytest.raises(tandem.Error) as info:
        tandem.quantize_kv(q, q, kind="int4")
    assert info.value.parameter == "kind"
    with pytest.raises(tandem.Error) as info:
        tandem.attention(q, q, q, kv_cache="int8", k_scale=np.ones((1, 3, 2), np.float32),
                         v_scale=np.ones((1, 3, 2), np.float32))
    assert info.value.parameter == "k.dtype"  # float codes
    codes = np.zeros((1, 3, 2, 4), np.int8)
    with pytest.raises(tandem.Error) as info:
        tandem.attention(q, codes, codes, kv_cache="int8", v_scale=np.ones((1, 3, 2)))
    assert info.value.parameter == "k_scale"
    with pytest.raises(tandem.Error) as info:
        tandem.attention(q, codes, codes, kv_cache="e4m3", k_scale=np.ones(2),
                         v_scale=np.ones(2))
    assert info.value.parameter == "k.dtype"  # int8 codes for an e4m3 cache


# ---------------------------------------------------------------------------
# tandem.testing in bfloat16 and float16


def test_configurations_draw_every_storage_type():
    from hypothesis import given, settings
    from tandem import testing as T

    seen = set()

    @settings(max_examples=60, database=None, deadline=None)
    @given(T.attention_configs(dtypes=T.DTYPES))
    def run(config):
        a = config.arrays()
        assert a["q"].dtype.name == config.dtype and a["dout"].dtype.name == config.dtype \
            if "dout" in a else a["q"].dtype.name == config.dtype
        if a["bias"] is not None:
            assert a["bias"].dtype == np.float32  # masks stay float32
        seen.add(config.dtype)

    run()
    assert seen == set(T.DTYPES)


LOWP_SPACE = dict(masks=("none", "causal"), softcap=False, alibi=(), max_examples=40,
                  time_budget=20.0, seed=0)


@pytest.mark.parametrize("array", ("numpy", "torch"))
@pytest.mark.parametrize("profile", ("pytorch", "exact"))
def test_a_correct_low_precision_kernel_passes(array, profile):
    from tandem import testing as T
    from kernels import lowp_attention

    def kernel(q, k, v, **kw):
        if array == "torch":
            import tandem.testing as T_
            got = lowp_attention(*(T_._numpy(x) for x in (q, k, v)), profile=profile, **kw)
            return T_._to_torch(np.ascontiguousarray(got))
        return lowp_attention(q, k, v, profile=profile, **kw)

    T.check_attention(kernel, array=array, dtypes=("bfloat16", "float16"), **LOWP_SPACE)


def test_scores_rounded_to_the_storage_type_are_caught():
    from tandem import testing as T
    from kernels import lowp_attention

    def scores_bug(q, k, v, **kw):
        return lowp_attention(q, k, v, bug="scores", **kw)

    with pytest.raises(T.CheckFailure) as info:
        T.check_attention(scores_bug, dtypes=("bfloat16",), **LOWP_SPACE)
    report = str(info.value)
    assert "SPEC §10.5's bound" in report and "dtype='bfloat16'" in report


def test_a_float32_output_for_bfloat16_inputs_is_caught():
    from tandem import testing as T
    from kernels import lowp_attention

    def float32_out(q, k, v, **kw):
        return lowp_attention(q, k, v, **kw).astype(np.float32)

    with pytest.raises(T.CheckFailure) as info:
        T.check_attention(float32_out, dtypes=("bfloat16",), **LOWP_SPACE)
    assert "expected bfloat16" in str(info.value)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("profile", ("pytorch", "exact", "ggml"))
def test_explain_rounding_names_the_profile_of_a_kernel(dtype, profile):
    """A kernel that is tandem's reference with one profile is explained by
    that profile, at distance 0."""
    offered("attention_forward", dtype, "reference")
    from tandem import testing as T

    config = T.AttentionConfig(B=1, H=2, Hkv=1, Sq=6, Sk=40, D=16, Dv=16, dtype=dtype, seed=3,
                               amplitude=4.0)

    def kernel(q, k, v, **kw):
        return tandem.attention(q, k, v, rounding=profile, backend="reference", **kw)

    best, errors = T.explain_rounding(kernel, config)
    assert best == profile and errors[profile] == 0.0, errors
    assert set(errors) == set(T.ROUNDINGS)
