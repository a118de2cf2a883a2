# SPDX-License-Identifier: Apache-2.0
"""tandem.torch: the registered ops pass torch.library.opcheck and
torch.autograd.gradcheck (float64 runs the reference in double), and
scaled_dot_product_attention behaves as torch's."""

import math

import pytest
import torch
import torch.nn.functional as F

import tandem
import tandem.torch as tt
from kernels import TORCH_2_5, torch_sdpa

torch.manual_seed(3)
f64 = dict(dtype=torch.float64)


def randn(*shape, grad=False, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype, requires_grad=grad)


ATTENTION_CASES = [
    ("bshd", "none", 0, None, 0.0, None),
    ("bhsd", "causal", 0, 0.4, 0.0, None),
    ("bshd", "sliding_window", 2, None, 3.0, None),
    ("bhsd", "bias", 0, None, 0.0, (1, 4, 3, 5)),
    ("bshd", "key_padding", 0, None, 0.0, (2, 5)),
]


def attention_args(layout, kind, window, scale, softcap, mask_shape, grad=False):
    shape = (lambda S, H, D: (2, S, H, D)) if layout == "bshd" else \
        (lambda S, H, D: (2, H, S, D))
    q, k, v = randn(*shape(3, 4, 3), grad=grad), randn(*shape(5, 2, 3), grad=grad), \
        randn(*shape(5, 2, 2), grad=grad)
    mask = None
    if kind == "bias":
        mask = torch.randn(mask_shape)
        mask[0, 1, 2, 3] = -math.inf
    if kind == "key_padding":
        mask = (torch.rand(mask_shape) < 0.7).float()
        mask[:, 0] = 1
    return q, k, v, mask, layout, kind, window, scale, softcap, "optimized"


@pytest.mark.parametrize("case", ATTENTION_CASES)
def test_attention_op_passes_opcheck_and_gradcheck(case):
    args = attention_args(*case)
    torch.library.opcheck(torch.ops.tandem.attention.default, args)
    q, k, v, mask, *attrs = attention_args(*case, grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: torch.ops.tandem.attention(q, k, v, mask, *attrs)[0], (q, k, v))
    out, lse = torch.ops.tandem.attention(q, k, v, mask, *attrs)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.tandem.attention_backward.default,
                          (q.detach(), k.detach(), v.detach(), mask, out.detach(), lse, dout,
                           *attrs))


def test_attention_float32_gradients_match_the_double_reference():
    q, k, v = (randn(2, 6, 4, 8, dtype=torch.float32, grad=True) for _ in range(3))
    out = tt.attention(q, k, v, mask="causal", softcap=10.0)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = tandem.attention_backward(*(x.detach().double() for x in (q, k, v, dout)),
                                    mask="causal", softcap=10.0)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g.double(), r, atol=2e-5, rtol=1e-4)


def test_rope_axial_rope_swiglu_ops_pass_opcheck_and_gradcheck():
    x = randn(2, 4, 12, grad=True)
    angle = torch.rand(4, 3, **f64) * 6
    cos, sin = angle.cos(), angle.sin()
    torch.library.opcheck(torch.ops.tandem.rope.default,
                          (x.detach(), cos, sin, 6, 4, "gptj", None, False, "optimized"))
    assert torch.autograd.gradcheck(lambda x: tt.rope(x, cos, sin, head_dim=6, n_rot=4,
                                                      style="gptj"), (x,))
    y = randn(2, 8, 8, grad=True)
    torch.library.opcheck(torch.ops.tandem.axial_rope.default,
                          (y.detach(), 2, 2, 2, 100.0, 2, False, "optimized"))
    assert torch.autograd.gradcheck(lambda y: tt.axial_rope(y, end_x=2, end_y=2, num_heads=2,
                                                            repeat_factor=2), (y,))
    z = randn(3, 2, 10, grad=True)
    torch.library.opcheck(torch.ops.tandem.swiglu.default, (z.detach(), False, "optimized"))
    assert torch.autograd.gradcheck(lambda z: tt.swiglu(z, gate_first=False), (z,))


def test_attention_block_op_passes_opcheck():
    x, w_qkv, w_out = (torch.randn(*s) for s in ((2, 3, 8), (24, 8), (8, 8)))
    torch.library.opcheck(torch.ops.tandem.attention_block.default,
                          (x, w_qkv, w_out, 2, None, None, None, None, None, "optimized"))


SDPA_CASES = [
    dict(L=6, S=6, is_causal=True),
    dict(L=7, S=4, is_causal=True),  # more queries than keys
    dict(L=3, S=8, is_causal=True),  # top-left differs from tandem's bottom-right here
    dict(L=5, S=7, mask=("bool", (5, 7))),
    dict(L=5, S=7, mask=("float", (2, 1, 5, 7))),
    dict(L=5, S=7, mask=("bool", (2, 1, 1, 7))),  # key padding
    dict(L=5, S=7, mask=("bool", (4, 1, 7))),  # broadcast over the batch
    dict(L=5, S=7, scale=0.25, Hkv=2, enable_gqa=True),
    dict(L=5, S=7, batch=(2, 3)),
    dict(L=5, S=7, rank3=True),
]


@pytest.mark.parametrize("case", SDPA_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sdpa_matches_torch(case, dtype):
    batch = case.get("batch", (2,))
    H, Hkv, E = 4, case.get("Hkv", 4), 6
    L, S = case["L"], case["S"]
    if case.get("rank3"):
        q, k, v = torch.randn(3, L, E), torch.randn(3, S, E), torch.randn(3, S, 5)
    else:
        q = torch.randn(*batch, H, L, E)
        k, v = torch.randn(*batch, Hkv, S, E), torch.randn(*batch, Hkv, S, 5)
    q, k, v = (x.to(dtype).requires_grad_() for x in (q, k, v))
    kw = dict(is_causal=case.get("is_causal", False), scale=case.get("scale"),
              enable_gqa=case.get("enable_gqa", False))
    if "mask" in case:
        kind, shape = case["mask"]
        m = torch.rand(shape) < 0.7
        m[..., 0] = True
        kw["attn_mask"] = m if kind == "bool" else torch.randn(shape).to(dtype)
    out = tt.scaled_dot_product_attention(q, k, v, **kw)
    ref = torch_sdpa(q, k, v, **kw)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(out, ref, **tol)
    dout = torch.randn_like(out)
    for g, r in zip(torch.autograd.grad(out, (q, k, v), dout),
                    torch.autograd.grad(ref, (q, k, v), dout)):
        torch.testing.assert_close(g, r, **tol)


def test_sdpa_fully_masked_rows_give_zero_as_torch():
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    m = torch.ones(3, 5, dtype=torch.bool)
    m[1] = False
    out = tt.scaled_dot_product_attention(q, k, v, attn_mask=m)
    assert torch.all(out[:, :, 1] == 0)
    if not TORCH_2_5:
        pytest.skip(f"torch {torch.__version__}'s SDPA gives NaN there (0 from torch 2.5)")
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=m))


@pytest.mark.skipif(not TORCH_2_5, reason=f"torch {torch.__version__}'s SDPA has no "
                    "enable_gqa; tandem's has torch 2.5's signature")
def test_sdpa_signature_is_torchs():
    import inspect
    # torch's is a builtin: its signature is the first line of its docstring
    theirs = " ".join(F.scaled_dot_product_attention.__doc__.split(")")[0].split())
    ours = str(inspect.signature(tt.scaled_dot_product_attention))[:-1]
    assert theirs == "scaled_dot_product_attention" + ours


@pytest.mark.parametrize("call,parameter", [
    (lambda q: tt.scaled_dot_product_attention(q, q, q, dropout_p=0.1), "dropout_p"),
    (lambda q: tt.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 3, dtype=bool),
                                               is_causal=True), "attn_mask"),
    (lambda q: tt.scaled_dot_product_attention(q, q[:, :2], q[:, :2]), "key.shape"),
    (lambda q: tt.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(5, 3)),
     "attn_mask"),
])
def test_sdpa_errors(call, parameter):
    with pytest.raises(tandem.Error) as info:
        call(torch.randn(1, 4, 3, 8))
    assert info.value.parameter == parameter


def test_compiles_without_graph_breaks():
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    f = torch.compile(lambda q, k, v: tt.scaled_dot_product_attention(q, k, v, is_causal=True),
                      fullgraph=True, backend="eager")
    torch.testing.assert_close(f(q, k, v), F.scaled_dot_product_attention(q, k, v,
                                                                          is_causal=True))


@pytest.mark.parametrize("case", [dict(), dict(is_causal=True), dict(L=9, S=5, is_causal=True),
                                  dict(L=3, S=8, is_causal=True), dict(Hkv=2, enable_gqa=True),
                                  dict(scale=0.3), dict(transposed=True), dict(dtype=torch.float64)])
def test_sdpa_inference_fast_path_matches_torch(case):
    # without autograd, contiguous [B, H, L, E] tensors go to the kernel by address
    L, S, Hkv = case.get("L", 6), case.get("S", 6), case.get("Hkv", 4)
    dtype = case.get("dtype", torch.float32)
    q = torch.randn(2, 4, L, 8, dtype=dtype)
    k, v = torch.randn(2, Hkv, S, 8, dtype=dtype), torch.randn(2, Hkv, S, 5, dtype=dtype)
    if case.get("transposed"):  # not contiguous: the general path
        q = torch.randn(2, L, 4, 8, dtype=dtype).transpose(1, 2)
    kw = {n: case[n] for n in ("is_causal", "scale", "enable_gqa") if n in case}
    with torch.no_grad():
        out = tt.scaled_dot_product_attention(q, k, v, **kw)
    torch.testing.assert_close(out, torch_sdpa(q, k, v, **kw),
                               atol=1e-5 if dtype == torch.float32 else 1e-12, rtol=1e-5)
