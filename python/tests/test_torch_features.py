# SPDX-License-Identifier: Apache-2.0
"""tandem.torch with the attention features: the ops with sinks, ALiBi and
packed sequences pass torch.library.opcheck and torch.autograd.gradcheck in
float64 (dsinks included); the paged op passes opcheck, agrees with
attention over each entry's keys and says in tandem's words that it has no
backward; float32 on the optimized backend agrees with the reference."""

import math

import pytest
import torch

import tandem
import tandem.torch as tt

torch.manual_seed(5)


def randn(*shape, dtype=torch.float64, grad=False):
    return torch.randn(*shape, dtype=dtype, requires_grad=grad)


def attrs(layout="bshd", kind="none", window=0, scale=None, softcap=0.0, backend="reference"):
    return (layout, kind, window, scale, softcap, backend)


def sinks_and_gradcheck(q, k, v, sinks, a, features):
    """opcheck of both ops, gradcheck in q, k, v (and sinks when given)."""
    op = torch.ops.tandem.attention
    torch.library.opcheck(op.default, (q, k, v, None, *a, sinks, *features))
    inputs = [x.detach().requires_grad_() for x in (q, k, v)]
    if sinks is not None:
        inputs.append(sinks.detach().requires_grad_())
    assert torch.autograd.gradcheck(
        lambda *x: op(x[0], x[1], x[2], None, *a, x[3] if sinks is not None else None,
                      *features)[0], inputs)
    out, lse = op(q, k, v, None, *a, sinks, *features)
    torch.library.opcheck(torch.ops.tandem.attention_backward.default,
                          (q, k, v, None, out, lse, torch.randn_like(out), *a, sinks,
                           *features))


FEATURE_CASES = [
    dict(sinks=True),
    dict(sinks=True, layout="bhsd", kind="causal"),
    dict(alibi=(4,)),
    dict(alibi=(2, 4), kind="sliding_window", window=2, softcap=3.0),
    dict(sinks=True, alibi=(4,), kind="causal"),
]


@pytest.mark.parametrize("case", FEATURE_CASES)
def test_sinks_and_alibi_ops_pass_opcheck_and_gradcheck(case):
    c = dict(case)
    sinks = randn(4) if c.pop("sinks", False) else None
    alibi = c.pop("alibi", None)
    slopes = None if alibi is None else torch.rand(alibi)
    a = attrs(**c)
    shape = (lambda S, H, D: (2, S, H, D)) if a[0] == "bshd" else (lambda S, H, D: (2, H, S, D))
    q, k, v = randn(*shape(3, 4, 3)), randn(*shape(5, 2, 3)), randn(*shape(5, 2, 2))
    sinks_and_gradcheck(q, k, v, sinks, a, (slopes, None, None, None))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_packed_ops_pass_opcheck_and_gradcheck(index_dtype):
    q, k, v = randn(5, 4, 3), randn(6, 2, 3), randn(6, 2, 2)
    cu_q = torch.tensor([0, 2, 5], dtype=index_dtype)
    cu_k = torch.tensor([0, 4, 6], dtype=index_dtype)
    used = torch.tensor([3, 2], dtype=index_dtype)
    sinks_and_gradcheck(q, k, v, randn(4), attrs(kind="causal"),
                        (torch.rand(2, 4), cu_q, cu_k, used))


def test_tt_attention_gradients_with_sinks_match_the_api():
    q, k, v = randn(2, 4, 4, 3, grad=True), randn(2, 6, 2, 3, grad=True), \
        randn(2, 6, 2, 2, grad=True)
    sinks = randn(4, grad=True)
    kw = dict(mask="causal", alibi_slopes=tandem.alibi_slopes(4))
    out = tt.attention(q, k, v, sinks=sinks, backend="reference", **kw)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sinks), dout)
    ref = tandem.attention_backward(*(x.detach() for x in (q, k, v, dout)),
                                    sinks=sinks.detach(), **kw)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-14)
    # a sink logit of -inf would be no sink: a large negative one is nearly none
    far = tt.attention(q, k, v, sinks=torch.full((4,), -1e3, dtype=torch.float64),
                       backend="reference", **kw)
    torch.testing.assert_close(far, tt.attention(q, k, v, backend="reference", **kw))


def test_packed_tt_attention_equals_per_sequence_calls():
    q, k, v = randn(7, 2, 4, grad=True), randn(9, 1, 4, grad=True), randn(9, 1, 4, grad=True)
    cu_q, cu_k = [0, 3, 7], [0, 5, 9]
    out = tt.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, mask="causal",
                       backend="reference")
    assert out.shape == (7, 2, 4)
    for s in range(2):
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        one = tt.attention(q[None, rows], k[None, keys], v[None, keys], mask="causal",
                           backend="reference")
        torch.testing.assert_close(out[rows], one[0], rtol=1e-12, atol=1e-14)
    dq, = torch.autograd.grad(out.sum(), (q,))
    assert dq.shape == q.shape and torch.isfinite(dq).all()


def paged(B=2, Sk=7, Hkv=2, D=4, block_size=3, num_blocks=8, max_blocks=3,
          dtype=torch.float64):
    k, v = randn(B, Sk, Hkv, D, dtype=dtype), randn(B, Sk, Hkv, D, dtype=dtype)
    k_cache = randn(num_blocks, block_size, Hkv, D, dtype=dtype)
    v_cache = randn(num_blocks, block_size, Hkv, D, dtype=dtype)
    order = torch.randperm(num_blocks)
    table = torch.zeros((B, max_blocks), dtype=torch.int32)
    for b in range(B):
        for j in range(math.ceil(Sk / block_size)):
            blk = int(order[b * max_blocks + j])
            table[b, j] = blk
            n = min(block_size, Sk - j * block_size)
            k_cache[blk, :n] = k[b, j * block_size:j * block_size + n]
            v_cache[blk, :n] = v[b, j * block_size:j * block_size + n]
    return k, v, k_cache, v_cache, table


@pytest.mark.parametrize("backend", ["reference", "optimized"])
def test_paged_op_passes_opcheck_and_agrees_with_attention(backend):
    dtype = torch.float32 if backend == "optimized" else torch.float64
    k, v, k_cache, v_cache, table = paged(dtype=dtype)
    q, sinks = randn(2, 2, 4, 4, dtype=dtype), randn(4, dtype=dtype)
    lengths = torch.tensor([7, 4], dtype=torch.int64)
    args = (q, k_cache, v_cache, table, lengths, sinks, None, "causal", 0, None, 0.0, backend)
    out = tt.attention_with_kvcache(q, k_cache, v_cache, table, lengths, mask="causal",
                                    sinks=sinks, backend=backend)
    torch.library.opcheck(torch.ops.tandem.attention_with_kvcache.default, args)
    for b, n in enumerate((7, 4)):
        one = tt.attention(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], mask="causal",
                           sinks=sinks, backend="reference")
        torch.testing.assert_close(out[b:b + 1], one, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("grad", ["q", "k_cache", "sinks"])
def test_paged_op_backward_says_it_is_forward_only(grad):
    k, v, k_cache, v_cache, table = paged()
    q, sinks = randn(2, 2, 4, 4), randn(4)
    {"q": q, "k_cache": k_cache, "sinks": sinks}[grad].requires_grad_()
    out = tt.attention_with_kvcache(q, k_cache, v_cache, table, torch.tensor([7, 4]),
                                    sinks=sinks, backend="reference")
    with pytest.raises(tandem.Error, match=r"paged KV cache is forward only .*"
                                           r"tandem\.torch\.attention .*cu_seqlens_q"):
        out.sum().backward()


@pytest.mark.parametrize("feature", ["sinks", "alibi", "packed"])
def test_float32_optimized_agrees_with_the_reference(feature):
    q, k, v = (randn(2, 5, 2, 8, dtype=torch.float32, grad=True) for _ in range(3))
    kw = {"sinks": dict(sinks=randn(2, dtype=torch.float32, grad=True)),
          "alibi": dict(alibi_slopes=tandem.alibi_slopes(2)),
          "packed": dict(cu_seqlens_q=[0, 4, 10], cu_seqlens_k=[0, 6, 10])}[feature]
    if feature == "packed":
        q, k, v = (x.detach().reshape(10, 2, 8).requires_grad_() for x in (q, k, v))
    inputs = (q, k, v) + ((kw["sinks"],) if feature == "sinks" else ())
    ref = tt.attention(q, k, v, mask="causal", backend="reference", **kw)
    ref_grads = torch.autograd.grad(ref.sum(), inputs)
    out = tt.attention(q, k, v, mask="causal", backend="optimized", **kw)
    grads = torch.autograd.grad(out.sum(), inputs)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
def test_rope_op_with_positions_passes_opcheck_and_gradcheck(layout):
    shape = {"bshd": (2, 3, 2, 4), "bhsd": (2, 2, 3, 4), "thd": (6, 2, 4)}[layout]
    x = randn(*shape)
    angle = torch.rand(7, 2, dtype=torch.float64) * 6
    cos, sin = angle.cos(), angle.sin()
    pos = torch.randint(0, 7, (6,) if layout == "thd" else (2, 3), dtype=torch.int32)
    torch.library.opcheck(torch.ops.tandem.rope.default,
                          (x, cos, sin, None, None, "gptj", None, False, "reference", layout, pos))
    assert torch.autograd.gradcheck(
        lambda x: tt.rope(x, cos, sin, style="gptj", layout=layout, positions=pos,
                          backend="reference"), (x.requires_grad_(),))
    torch.testing.assert_close(tt.rope(x, cos, sin, layout=layout, positions=pos),
                               tandem.rope(x, cos, sin, layout=layout, positions=pos))
