# SPDX-License-Identifier: Apache-2.0
"""tandem.torch and tandem.transformers in bfloat16 and float16 (SPEC §10):
the registered ops pass torch.library.opcheck (their fake lse is float32, as
the kernel's), autograd's gradients lie within SPEC §10.5's bound of the
gradients in double, scaled_dot_product_attention takes bf16/f16 tensors and
masks, a bf16 Llama with attn_implementation="tandem" matches "sdpa", and the
quantized-cache ops (SPEC §10.4) agree with the NumPy path and with a float
computation on the cache dequantized by hand, forward only."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tandem
import tandem.torch as tt

LOW = (torch.bfloat16, torch.float16)
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def name(dtype):
    return str(dtype).replace("torch.", "")


def offered(entry, dtype, backend="reference"):
    if not tandem.offers(entry, name(dtype), backend):
        pytest.skip(f"{backend} does not offer {entry} at {name(dtype)} yet")


def randn(*shape, dtype, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).requires_grad_(grad)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("rounding", ("pytorch", "exact"))
def test_attention_ops_pass_opcheck(dtype, rounding):
    offered("attention_forward_lse", dtype)
    offered("attention_backward_saved", dtype)
    q, k, v = (randn(2, 3, 4, 8, dtype=dtype, seed=i) for i in range(3))
    args = (q, k, v, None, "bshd", "causal", 0, None, 0.0, "reference", None, None, None, None,
            None, rounding)
    torch.library.opcheck(torch.ops.tandem.attention.default, args)
    out, lse = torch.ops.tandem.attention(*args)
    assert out.dtype == dtype and lse.dtype == torch.float32
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.tandem.attention_backward.default,
                          (q, k, v, None, out, lse, dout, "bshd", "causal", 0, None, 0.0,
                           "reference", None, None, None, None, None, False, rounding))


@pytest.mark.parametrize("dtype", LOW)
def test_rope_axial_rope_swiglu_ops_pass_opcheck(dtype):
    offered("rope_forward", dtype)
    offered("axial_rope_forward", dtype)
    offered("swiglu_forward", dtype)
    x = randn(2, 4, 12, dtype=dtype)
    angle = torch.rand(4, 3) * 6
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    torch.library.opcheck(torch.ops.tandem.rope.default,
                          (x, cos, sin, 6, 4, "gptj", None, False, "reference"))
    torch.library.opcheck(torch.ops.tandem.axial_rope.default,
                          (randn(2, 8, 8, dtype=dtype), 2, 2, 2, 100.0, 2, False, "reference"))
    torch.library.opcheck(torch.ops.tandem.swiglu.default,
                          (randn(3, 2, 10, dtype=dtype), False, "reference"))


def within_gradient_bound(got, exact, dtype, terms):
    """A gradient of T against the gradient in double: each of its elements
    a sum of `terms` products of rounded factors, within a few u_T of the
    largest magnitude (SPEC §10.2's rounding points, §10.5)."""
    e = exact.double()
    bound = 4 * UNIT[dtype] * (e.abs() + e.abs().max()) * (1 + terms * UNIT[dtype]) + 1e-6
    assert bool(((got.double() - e).abs() <= bound).all()), float(
        ((got.double() - e).abs() - bound).max())


@pytest.mark.parametrize("backend", ("reference", "optimized"))
@pytest.mark.parametrize("dtype", LOW)
def test_autograd_gradients_within_the_bound_of_double(backend, dtype):
    offered("attention_forward_lse", dtype, backend)
    offered("attention_backward_saved", dtype, backend)
    q, k, v = (randn(2, 6, 4, 8, dtype=dtype, grad=True, seed=10 + i) for i in range(3))
    sinks = randn(4, dtype=dtype, grad=True, seed=14)
    out = tt.attention(q, k, v, mask="causal", sinks=sinks, backend=backend)
    assert out.dtype == dtype
    dout = randn(*out.shape, dtype=dtype, seed=15)
    grads = torch.autograd.grad(out, (q, k, v, sinks), dout)
    exact = [x.detach().double().requires_grad_() for x in (q, k, v, sinks)]
    ref = tt.attention(*exact[:3], mask="causal", sinks=exact[3], backend="reference")
    ref_grads = torch.autograd.grad(ref, exact, dout.double())
    for g, r in zip(grads, ref_grads):
        assert g.dtype == dtype
        within_gradient_bound(g, r, dtype, terms=6)


@pytest.mark.parametrize("dtype", LOW)
def test_rounding_reaches_the_kernels_through_autograd(dtype):
    offered("attention_forward_lse", dtype)
    offered("attention_backward_saved", dtype)
    q, k, v = (randn(1, 40, 2, 16, dtype=dtype, grad=True, seed=20 + i) for i in range(3))
    for rounding in ("pytorch", "exact"):
        out = tt.attention(q, k, v, rounding=rounding, backend="reference")
        plain = tandem.attention(q.detach(), k.detach(), v.detach(), rounding=rounding,
                                 backend="reference")
        assert torch.equal(out, plain), rounding
        out.sum().backward()
        dq = tandem.attention_backward(q.detach(), k.detach(), v.detach(),
                                       torch.ones_like(out), rounding=rounding,
                                       backend="reference")[0]
        assert torch.equal(q.grad, dq), rounding
        q.grad = k.grad = v.grad = None


@pytest.mark.parametrize("backend", ("reference", "optimized"))
@pytest.mark.parametrize("dtype", LOW)
def test_sdpa_takes_low_precision_tensors_and_masks(backend, dtype):
    offered("attention_forward", dtype, backend)
    q, k, v = (randn(2, 4, 5, 8, dtype=dtype, seed=30 + i) for i in range(3))
    mask = randn(1, 1, 5, 5, dtype=dtype, seed=33)  # a float mask of q's dtype: added exactly
    for kw in (dict(is_causal=True), dict(attn_mask=mask), {}):
        got = tt.sdpa_softcap(q, k, v, backend=backend, **kw)
        assert got.dtype == dtype
        m = kw.get("attn_mask")
        exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                               attn_mask=None if m is None else m.double(),
                                               is_causal=kw.get("is_causal", False))
        mags = F.scaled_dot_product_attention(q.double(), k.double(), v.double().abs(),
                                              attn_mask=None if m is None else m.double(),
                                              is_causal=kw.get("is_causal", False))
        u = UNIT[dtype]
        bound = u * exact.abs() + u * mags + 2.0 ** -20 * mags
        assert bool(((got.double() - exact).abs() <= bound).all()), kw
    if backend == "optimized":
        assert tt.scaled_dot_product_attention(q, k, v).dtype == dtype  # the fast path


# ---------------------------------------------------------------------------
# Quantized KV caches as torch ops (SPEC §10.4): forward only

KINDS = ("int8", "e4m3")
CODES = {"int8": torch.int8, "e4m3": torch.float8_e4m3fn}
STORAGE = (torch.float32,) + LOW


def quantized_case(dtype, seed, Sq=3, Sk=9, H=4, Hkv=2, D=8, Dv=6):
    return (randn(2, Sq, H, D, dtype=dtype, seed=seed), randn(2, Sk, Hkv, D, dtype=dtype,
                                                              seed=seed + 1),
            randn(2, Sk, Hkv, Dv, dtype=dtype, seed=seed + 2))


# torch's schema check (opcheck's test_schema) multiplies every tensor it
# sees, which torch's CPU kernels do not for float8_e4m3fn: e4m3 ops get the
# other opcheck tests.
OPCHECKS = {"int8": ("test_schema", "test_autograd_registration", "test_faketensor",
                     "test_aot_dispatch_dynamic"),
            "e4m3": ("test_autograd_registration", "test_faketensor",
                     "test_aot_dispatch_dynamic")}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", STORAGE)
def test_quantized_cache_ops_pass_opcheck(kind, dtype):
    offered("quantize_kv", dtype)
    offered("attention_forward_quantized", dtype)
    q, k, v = quantized_case(dtype, 200)
    torch.library.opcheck(torch.ops.tandem.quantize_kv.default,
                          (k, v, kind, "bshd", None, "reference"), test_utils=OPCHECKS[kind])
    kc, vc, ks, vs = torch.ops.tandem.quantize_kv(k, v, kind, "bshd", None, "reference")
    assert kc.dtype == vc.dtype == CODES[kind] and ks.dtype == vs.dtype == torch.float32
    assert kc.shape == k.shape and vc.shape == v.shape
    assert ks.shape == ((2, 9, 2) if kind == "int8" else (2,))
    for mask_kind in ("none", "causal"):
        torch.library.opcheck(torch.ops.tandem.attention_forward_quantized.default,
                              (q, kc, vc, ks, vs, kind, None, "bshd", mask_kind, 0, None, 0.0,
                               "reference", None, None, "pytorch"), test_utils=OPCHECKS[kind])
    # the fake's scale shapes follow the other layouts too
    for layout, kk, vv in (("bhsd", k.transpose(1, 2).contiguous(), v.transpose(1, 2)
                            .contiguous()), ("bshd", k.flatten(2), v.flatten(2))):
        heads = 2 if kk.dim() == 3 else None
        torch.library.opcheck(torch.ops.tandem.quantize_kv.default,
                              (kk, vv, kind, layout, heads, "reference"),
                              test_utils=OPCHECKS[kind])


def numpy_of(x):
    """A tensor as NumPy (bf16 as ml_dtypes', e4m3 codes as their uint8 bits)."""
    from tandem.testing import _numpy
    return x.view(torch.uint8).numpy() if x.dtype == torch.float8_e4m3fn else _numpy(x)


@pytest.mark.parametrize("backend", ("reference", "optimized"))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", STORAGE)
def test_quantized_ops_match_the_numpy_path_bit_for_bit(backend, kind, dtype):
    offered("quantize_kv", dtype, backend)
    offered("attention_forward_quantized", dtype, backend)
    q, k, v = quantized_case(dtype, 210)
    cache = tt.quantize_kv(k, v, kind=kind, backend=backend)
    ref = tandem.quantize_kv(numpy_of(k), numpy_of(v), kind=kind, backend=backend)
    assert cache.kv_cache == ref.kv_cache == kind
    for got, want in zip(cache[:4], ref[:4]):
        assert np.array_equal(numpy_of(got).view(np.uint8), want.view(np.uint8))
    for kw in (dict(mask="causal"), dict(mask="sliding_window", window=3), dict(softcap=5.0)):
        out = tt.attention_forward_quantized(q, **cache._asdict(), backend=backend, **kw)
        assert out.dtype == dtype and out.shape == (2, 3, 4, 6)
        want = tandem.attention(numpy_of(q), **ref._asdict(), backend=backend, **kw)
        assert np.array_equal(numpy_of(out).view(np.uint8), want.view(np.uint8)), kw


def dequantized(codes, scale, kind):
    """sigma * code in float64: the values a quantized cache stands for."""
    c = codes.to(torch.float32).double()
    s = scale.double()
    return c * (s[..., None] if kind == "int8" else s[None, None, :, None])


@pytest.mark.parametrize("backend", ("reference", "optimized"))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", STORAGE)
def test_quantized_attention_within_the_bound_of_the_dequantized_float_computation(
        backend, kind, dtype):
    """Against the attention in double of q and of the cache dequantized by
    hand, SPEC §10.5's bound of exact arithmetic with |v_j| = sigma_j |c_j|:
    u_T |o| + u_T sum_j p_ij |v_j| + the float32 arithmetic's 2^-18 sum_j
    p_ij |v_j| (as in test_low_precision's)."""
    offered("quantize_kv", dtype, backend)
    offered("attention_forward_quantized", dtype, backend)
    q, k, v = quantized_case(dtype, 220, Sq=5, Sk=33, D=16, Dv=16)
    cache = tt.quantize_kv(k, v, kind=kind, backend=backend)
    out = tt.attention_forward_quantized(q, **cache._asdict(), mask="causal", backend=backend)
    kd, vd = dequantized(cache.k, cache.k_scale, kind), dequantized(cache.v, cache.v_scale, kind)
    group = q.shape[2] // kd.shape[2]

    def sdpa(vals):
        return F.scaled_dot_product_attention(
            q.double().transpose(1, 2), kd.repeat_interleave(group, 2).transpose(1, 2),
            vals.repeat_interleave(group, 2).transpose(1, 2),
            attn_mask=torch.ones(5, 33, dtype=torch.bool).tril(33 - 5)).transpose(1, 2)

    exact, weights = sdpa(vd), sdpa(vd.abs())
    u = UNIT.get(dtype, 2.0 ** -24)
    bound = u * exact.abs() + u * weights + 2.0 ** -18 * weights
    err = (out.double() - exact).abs()
    assert bool((err <= bound).all()), float((err - bound).max())
    # and quantization itself is visible: the unquantized attention differs by more
    plain = tt.attention(q, k, v, mask="causal", backend=backend)
    assert not torch.equal(plain, out)


def test_quantized_codes_reach_the_kernel_without_a_copy(monkeypatch):
    from tandem import _ext
    q, k, v = quantized_case(torch.bfloat16, 230)
    seen = {}
    real = _ext.attention_forward_quantized

    def spy(backend, params, inputs, out):
        seen.update({n: _ext.address(inputs[n]) for n in ("q", "k", "v", "k_scale", "v_scale")})
        return real(backend, params, inputs, out)

    for kind in KINDS:
        cache = tt.quantize_kv(k, v, kind=kind, backend="reference")
        monkeypatch.setattr(_ext, "attention_forward_quantized", spy)
        tt.attention_forward_quantized(q, **cache._asdict(), backend="reference")
        monkeypatch.undo()
        given = dict(q=q, k=cache.k, v=cache.v, k_scale=cache.k_scale, v_scale=cache.v_scale)
        assert seen == {n: t.data_ptr() for n, t in given.items()}, kind


def test_quantized_cache_is_forward_only():
    q, k, v = quantized_case(torch.bfloat16, 240)
    cache = tt.quantize_kv(k, v, backend="reference")
    qg = q.clone().requires_grad_()
    with pytest.raises(tandem.Error, match="forward only") as info:
        tt.attention_forward_quantized(qg, **cache._asdict(), backend="reference")
    assert info.value.parameter == "q"
    with pytest.raises(tandem.Error, match="forward only") as info:
        tt.quantize_kv(k.clone().requires_grad_(), v, backend="reference")
    assert info.value.parameter == "k"
    with torch.no_grad():  # inference: runs, and gives the same bits
        out = tt.attention_forward_quantized(qg, **cache._asdict(), backend="reference")
    assert torch.equal(out, tt.attention_forward_quantized(q, **cache._asdict(),
                                                           backend="reference"))
    # the op itself, reached past the wrapper: its backward says the same
    out = torch.ops.tandem.attention_forward_quantized(
        qg, cache.k, cache.v, cache.k_scale, cache.v_scale, "int8", None, "bshd", "none", 0,
        None, 0.0, "reference", None, None, None)
    with pytest.raises(tandem.Error, match="forward only"):
        out.sum().backward()


# ---------------------------------------------------------------------------
# A bf16 Llama


def llama(impl):
    from transformers import AutoModelForCausalLM, LlamaConfig
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    return AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=impl)


@pytest.mark.parametrize("impl,backend", [("tandem", "optimized"),
                                          ("tandem_reference", "reference")])
def test_a_bf16_llama_with_tandem_matches_sdpa(impl, backend):
    """SPEC §10.5 bounds tandem's bf16 attention by the error of the naive
    computation in bf16 (FlashAttention's rule): so the bf16 model's logits
    and gradients with "tandem" lie within twice the distance of the bf16
    "sdpa" model to the float32 one, plus one rounding of the largest value;
    greedy tokens agree until a step whose top two logits lie within that."""
    for entry in ("attention_forward", "attention_forward_lse", "attention_backward_saved"):
        offered(entry, torch.bfloat16, backend)
    import tandem.transformers  # noqa: F401  (registers "tandem" and "tandem_reference")
    f32 = llama("sdpa")
    models = {"sdpa": llama("sdpa"), "tandem": llama(impl)}
    for m in models.values():
        m.load_state_dict(f32.state_dict())
        m.to(torch.bfloat16)
    u = UNIT[torch.bfloat16]
    ids = torch.randint(0, 101, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = f32(ids).logits.double()
        logits = {n: m(ids).logits.double() for n, m in models.items()}
    bound = 2 * (logits["sdpa"] - ref).abs().max() + u * ref.abs().max()
    assert (logits["tandem"] - ref).abs().max() <= bound

    kw = dict(max_new_tokens=8, do_sample=False)
    tokens = {n: m.generate(ids, **kw) for n, m in models.items()}
    differ = (tokens["tandem"] != tokens["sdpa"]).any(0).nonzero()
    if len(differ):  # the first step where they part: a near tie for sdpa too
        step = int(differ[0])
        with torch.no_grad():
            top = models["sdpa"](tokens["sdpa"][:, :step]).logits[:, -1].double().topk(2).values
        assert float((top[:, 0] - top[:, 1]).min()) <= 2 * bound

    grads = {}
    for n, m in {"f32": f32, **models}.items():
        m.train()
        m(ids, labels=ids).loss.backward()
        grads[n] = {p: w.grad.double() for p, w in m.named_parameters()}
    for p, g in grads["f32"].items():
        err_sdpa = (grads["sdpa"][p] - g).abs().max()
        err_tandem = (grads["tandem"][p] - g).abs().max()
        assert err_tandem <= 2 * err_sdpa + u * g.abs().max(), p
