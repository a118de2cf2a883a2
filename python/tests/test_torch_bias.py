# SPDX-License-Identifier: Apache-2.0
"""The bias gradient (SPEC §3.1) in Python and torch, and F.sdpa's attn_mask
dtype rules: tandem.attention_backward(_saved) return dbias when asked; the
ops pass opcheck and gradcheck with a bias that requires grad; a learned bias
trained through tandem.torch.scaled_dot_product_attention gets the gradient
PyTorch's own SDPA gives it; masks of other dtypes are refused as torch
refuses them."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tandem
import tandem.torch as tt

torch.manual_seed(17)


def qkv(B=2, H=4, L=3, S=5, E=6, dtype=torch.float64, grad=False):
    def t(*shape):
        return torch.randn(*shape, dtype=dtype, requires_grad=grad)
    return t(B, H, L, E), t(B, H, S, E), t(B, H, S, E)


# ------------------------------------------------------------------ tandem API


@pytest.mark.parametrize("bias_shape", [(1, 4, 3, 5), (2, 1, 3, 5), (1, 1, 3, 5), (3, 5)])
def test_attention_backward_returns_dbias_in_the_bias_shape(bias_shape):
    rng = np.random.default_rng(1)
    q, k, v, dout = (rng.standard_normal(s) for s in [(2, 3, 4, 6), (2, 5, 4, 6), (2, 5, 4, 6),
                                                      (2, 3, 4, 6)])
    bias = rng.standard_normal(bias_shape)
    bias.reshape(-1)[1] = -math.inf
    got = tandem.attention_backward(q, k, v, dout, bias=bias, grads=("dq", "dk", "dv", "dbias"),
                                    backend="reference")
    assert len(got) == 4 and got[3].shape == bias_shape
    # torch's autograd through its own SDPA (bhsd) is the ground truth
    tq, tk, tv = (torch.from_numpy(x).transpose(1, 2).requires_grad_() for x in (q, k, v))
    tb = torch.from_numpy(bias).requires_grad_()
    out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tb)
    out.backward(torch.from_numpy(dout).transpose(1, 2))
    np.testing.assert_allclose(got[3], tb.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[0], tq.grad.transpose(1, 2).numpy(), rtol=1e-5, atol=1e-6)
    assert got[3].reshape(-1)[1] == 0  # the hidden key
    # dbias alone, and the saved-state form, agree (float32 optimized)
    q32, k32, v32, d32 = (x.astype(np.float32) for x in (q, k, v, dout))
    (alone,) = [g for g in tandem.attention_backward(q32, k32, v32, d32, bias=bias,
                                                    grads=("dbias",)) if g is not None]
    out32, lse = tandem.attention_forward_lse(q32, k32, v32, bias=bias)
    saved = tandem.attention_backward_saved(q32, k32, v32, out32, lse, d32, bias=bias,
                                            grads=("dbias",))
    np.testing.assert_allclose(alone, got[3], rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(saved[3], got[3], rtol=2e-4, atol=2e-5)


def test_dbias_is_only_computed_when_asked_and_only_for_a_bias():
    rng = np.random.default_rng(2)
    q, k, v, dout = (rng.standard_normal((1, 3, 2, 4)).astype(np.float32) for _ in range(4))
    bias = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    sinks = rng.standard_normal(2).astype(np.float32)
    assert len(tandem.attention_backward(q, k, v, dout, bias=bias)) == 3  # as before
    with_sinks = tandem.attention_backward(q, k, v, dout, bias=bias, sinks=sinks,
                                           grads=("dq", "dk", "dv", "dsinks", "dbias"))
    assert [g.shape for g in with_sinks[3:]] == [(2,), (1, 2, 3, 3)]
    with pytest.raises(tandem.Error, match="dbias") as e:
        tandem.attention_backward(q, k, v, dout, mask="causal", grads=("dq", "dbias"))
    assert e.value.parameter == "grads"


# ------------------------------------------------------------------ torch ops


@pytest.mark.parametrize("bias_shape,softcap", [((1, 4, 3, 5), 0.0), ((2, 1, 3, 5), 2.0),
                                                ((1, 1, 3, 5), 0.0)])
def test_attention_op_with_a_learned_bias_passes_opcheck_and_gradcheck(bias_shape, softcap):
    q, k, v = qkv(grad=True)
    bias = torch.randn(bias_shape, dtype=torch.float64, requires_grad=True)
    attrs = ("bhsd", "bias", 0, None, softcap, "reference")
    torch.library.opcheck(torch.ops.tandem.attention.default, (q, k, v, bias, *attrs))
    # the kernels hold the bias in float32 (SPEC §2): finite differences of 1e-3
    assert torch.autograd.gradcheck(
        lambda q, k, v, b: torch.ops.tandem.attention(q, k, v, b, *attrs)[0], (q, k, v, bias),
        eps=1e-3, atol=1e-3, rtol=1e-3)
    out, lse = torch.ops.tandem.attention(q, k, v, bias, *attrs)
    torch.library.opcheck(torch.ops.tandem.attention_backward.default,
                          (q.detach(), k.detach(), v.detach(), bias.detach(), out.detach(), lse,
                           torch.randn_like(out), *attrs), {"dbias": True})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask_shape", [(4, 3, 5), (1, 1, 3, 5), (2, 4, 3, 5), (3, 5),
                                        (2, 1, 1, 5)])
def test_sdpa_learned_bias_gets_torchs_gradient(dtype, mask_shape):
    q, k, v = qkv(dtype=dtype, grad=True)
    bias = torch.randn(mask_shape, dtype=dtype, requires_grad=True)
    # (tandem holds the bias in float32, SPEC §2: a float64 call is off by its rounding)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-5, atol=1e-6)
    out = tt.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, bias), dout)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    ref_grads = torch.autograd.grad(ref, (q, k, v, bias), dout)
    torch.testing.assert_close(out, ref, **tol)
    for name, g, r in zip(("dq", "dk", "dv", "dbias"), grads, ref_grads):
        assert g.shape == r.shape and g.dtype == r.dtype, name
        torch.testing.assert_close(g, r, **tol, msg=name)


def test_sdpa_with_only_the_mask_requiring_grad_is_not_detached():
    q, k, v = qkv(dtype=torch.float32)
    bias = torch.randn(4, 3, 5, requires_grad=True)
    out = tt.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    assert out.requires_grad
    out.sum().backward()
    expected = bias.detach().clone().requires_grad_()
    F.scaled_dot_product_attention(q, k, v, attn_mask=expected).sum().backward()
    torch.testing.assert_close(bias.grad, expected.grad, rtol=1e-4, atol=1e-5)


def test_tt_attention_bias_gets_its_gradient_and_a_keep_mask_none():
    q, k, v = (t.transpose(1, 2).detach().requires_grad_() for t in qkv())
    bias = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    tt.attention(q, k, v, bias=bias).sum().backward()
    assert bias.grad is not None and bias.grad.shape == (3, 5)
    keep = torch.ones(2, 5, requires_grad=True)
    tt.attention(q, k, v, key_padding=keep).sum().backward()
    assert keep.grad is None


# ------------------------------------------------------- attn_mask dtype rules

MASK_DTYPES = [torch.bool, torch.float32, torch.float64, torch.float16, torch.bfloat16,
               torch.int64, torch.int32, torch.uint8]


@pytest.mark.parametrize("query_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask_dtype", MASK_DTYPES)
def test_sdpa_attn_mask_dtypes_follow_torch(query_dtype, mask_dtype):
    q, k, v = qkv(dtype=query_dtype)
    mask = torch.randint(0, 2, (3, 5)).to(mask_dtype)  # a tokenizer's 0/1 mask, in any dtype
    mask[:, 0] = 1
    try:
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    except RuntimeError as e:
        assert "attn_mask dtype" in str(e)
        with pytest.raises(tandem.Error, match="attn_mask dtype") as err:
            tt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert err.value.parameter == "attn_mask"
        assert str(mask_dtype) in str(err.value)
        return
    got = tt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    tol = 1e-5 if query_dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)


def test_sdpa_integer_mask_is_refused_not_added():
    q, k, v = qkv(dtype=torch.float32)
    keep = torch.tensor([[1, 1, 0, 0, 0]] * 3)  # int64: torch refuses it
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    with pytest.raises(tandem.Error, match="attn_mask"):
        tt.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    # as bool it hides the keys, as torch does
    torch.testing.assert_close(tt.scaled_dot_product_attention(q, k, v, attn_mask=keep.bool()),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=keep.bool()),
                               rtol=1e-5, atol=1e-6)
