# SPDX-License-Identifier: Apache-2.0
"""The bias gradient (SPEC §3.1) in Python: tandem.attention_backward(_saved)
return dbias when asked."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tandem

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
