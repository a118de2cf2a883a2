# SPDX-License-Identifier: Apache-2.0
"""The attention features (sinks, ALiBi, packed sequences, paged KV caches)
and RoPE by position ids and layouts, against NumPy formulas written here
(and in kernels.py); their gradients against finite differences; their
errors. Every case runs on both backends."""

import numpy as np
import pytest
import torch

import tandem
from kernels import numpy_attention, numpy_rope

rng = np.random.default_rng(11)
BACKENDS = ["reference", "optimized"]


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def plain(layout="bshd", mask="none", window=0, scale=None, softcap=0.0):
    return dict(layout=layout, mask=mask, window=window, scale=scale, softcap=softcap)


def to_layout(layout, *xs):
    if layout == "bshd":
        return xs
    return tuple(np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in xs)


# ---------------------------------------------------------------------------
# Sinks and ALiBi


FEATURE_CASES = [
    dict(sinks=True),
    dict(sinks=True, mask="causal"),
    dict(alibi="per_head"),
    dict(alibi="per_batch_head", mask="sliding_window", window=2),
    dict(sinks=True, alibi="per_head", softcap=4.0),
]


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("case", range(len(FEATURE_CASES)))
@pytest.mark.parametrize("backend", BACKENDS)
def test_sinks_and_alibi_match_the_numpy_formula(layout, case, backend):
    c = dict(FEATURE_CASES[case])
    B, Sq, Sk, H, Hkv = 2, 5, 7, 4, 2
    q, k, v = to_layout(layout, randn(B, Sq, H, 8), randn(B, Sk, Hkv, 8), randn(B, Sk, Hkv, 6))
    sinks = randn(H) if c.pop("sinks", False) else None
    kind = c.pop("alibi", None)
    slopes = None if kind is None else \
        tandem.alibi_slopes(H) if kind == "per_head" else rng.uniform(0, 1, (B, H)).astype(
            np.float32)
    kw = dict(plain(layout, **c), sinks=sinks, alibi_slopes=slopes)
    out = tandem.attention(q, k, v, backend=backend, **kw)
    ref = tandem.attention(*(x.astype(np.float64) for x in (q, k, v)), backend="reference",
                           **dict(kw, sinks=None if sinks is None else sinks.astype(np.float64)))
    np.testing.assert_allclose(out, ref, atol=3e-6, rtol=1e-5)
    expect = numpy_attention(*(x.astype(np.float64) for x in (q, k, v)), sinks=sinks,
                             alibi_slopes=slopes, **plain(layout, **c))
    np.testing.assert_allclose(ref, expect, atol=1e-12, rtol=1e-12)


def test_the_sink_takes_part_in_the_softmax_and_its_lse():
    # one key, one query: p = e^s / (e^sink + e^s), out = p v, lse = log(e^sink + e^s)
    q, k, v = (np.full((1, 1, 1, 1), x, np.float64) for x in (2.0, 0.5, 3.0))
    sink = np.array([0.25])
    out, lse = tandem.attention_forward_lse(q, k, v, scale=1.0, sinks=sink)
    p = np.exp(1.0) / (np.exp(0.25) + np.exp(1.0))
    assert out[0, 0, 0, 0] == pytest.approx(3.0 * p, rel=1e-14)
    assert lse[0, 0, 0] == pytest.approx(np.log(np.exp(0.25) + np.exp(1.0)), rel=1e-14)
    # a query that sees no key gets 0, and its lse is the sink
    bias = np.full((1, 1, 1, 1), -np.inf, np.float32)
    out, lse = tandem.attention_forward_lse(q, k, v, sinks=sink, bias=bias)
    assert out[0, 0, 0, 0] == 0.0 and lse[0, 0, 0] == 0.25


def test_standard_alibi_slopes_are_press_et_al():
    def press(H):  # the geometric sequence of the paper, with its rule for H not a power of 2
        n = 2 ** int(np.floor(np.log2(H)))
        first = [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
        return first + [2.0 ** (-8.0 * (h + 1) / (2 * n)) for h in range(2 * n)][::2][:H - n]
    for H in (1, 2, 6, 8, 12):
        np.testing.assert_allclose(tandem.alibi_slopes(H), press(H), rtol=1e-7)
    assert tandem.alibi_slopes(8).dtype == np.float32
    with pytest.raises(tandem.Error) as e:
        tandem.alibi_slopes(0)
    assert e.value.parameter == "num_heads"


@pytest.mark.parametrize("mask", ["none", "causal"])
def test_dsinks_matches_finite_differences_and_the_saved_state_pair(mask):
    B, Sq, Sk, H, Hkv = 2, 3, 4, 4, 2
    q, k, v = randn(B, Sq, H, 3, dtype=np.float64), randn(B, Sk, Hkv, 3, dtype=np.float64), \
        randn(B, Sk, Hkv, 2, dtype=np.float64)
    sinks, dout = randn(H, dtype=np.float64), randn(B, Sq, H, 2, dtype=np.float64)
    kw = dict(mask=mask, alibi_slopes=tandem.alibi_slopes(H))
    dq, dk, dv, dsinks = tandem.attention_backward(q, k, v, dout, sinks=sinks, **kw)
    assert dsinks.shape == (H,) and dsinks.dtype == np.float64
    loss = lambda s: np.sum(tandem.attention(q, k, v, sinks=s, **kw) * dout)  # noqa: E731
    for h in range(H):
        e = np.zeros(H)
        e[h] = 1e-6
        assert dsinks[h] == pytest.approx((loss(sinks + e) - loss(sinks - e)) / 2e-6, abs=1e-8)
    # dq still right with sinks and ALiBi
    e = np.zeros_like(q)
    e[1, 2, 3, 1] = 1e-6
    fd = (np.sum(tandem.attention(q + e, k, v, sinks=sinks, **kw) * dout) -
          np.sum(tandem.attention(q - e, k, v, sinks=sinks, **kw) * dout)) / 2e-6
    assert dq[1, 2, 3, 1] == pytest.approx(fd, abs=1e-8)
    # only dsinks asked for; the others are None
    only = tandem.attention_backward(q, k, v, dout, sinks=sinks, grads=("dsinks",), **kw)
    assert only[:3] == (None, None, None)
    np.testing.assert_allclose(only[3], dsinks, rtol=1e-13, atol=1e-15)
    out, lse = tandem.attention_forward_lse(q, k, v, sinks=sinks, **kw)
    saved = tandem.attention_backward_saved(q, k, v, out, lse, dout, sinks=sinks, **kw)
    for a, b in zip(saved, (dq, dk, dv, dsinks)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sinks_and_alibi_backward_in_float32_agrees_with_double(backend):
    q, k, v = randn(2, 5, 4, 8), randn(2, 6, 2, 8), randn(2, 6, 2, 8)
    sinks, dout, slopes = randn(4), randn(2, 5, 4, 8), tandem.alibi_slopes(4)
    g32 = tandem.attention_backward(q, k, v, dout, backend=backend, sinks=sinks,
                                    alibi_slopes=slopes, mask="causal")
    g64 = tandem.attention_backward(*(x.astype(np.float64) for x in (q, k, v, dout)),
                                    sinks=sinks.astype(np.float64), alibi_slopes=slopes,
                                    mask="causal")
    for a, b in zip(g32, g64):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


# ---------------------------------------------------------------------------
# Packed sequences


def packed(lengths_q, lengths_k, H=4, Hkv=2, D=8, Dv=6):
    q, k, v = randn(sum(lengths_q), H, D), randn(sum(lengths_k), Hkv, D), \
        randn(sum(lengths_k), Hkv, Dv)
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)])
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)])
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("array", ["numpy", "torch"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_sequences_are_attended_one_by_one(index_dtype, array, backend):
    lq, lk = [3, 1, 4], [5, 2, 4]
    q, k, v, cu_q, cu_k = packed(lq, lk)
    used = np.array([5, 0, 3])  # sequence 1 sees no key, sequence 2 its first 3
    slopes = rng.uniform(0, 1, (3, 4)).astype(np.float32)
    kw = dict(mask="causal", sinks=randn(4), alibi_slopes=slopes)
    args = [q, k, v, cu_q.astype(index_dtype), cu_k.astype(index_dtype),
            used.astype(index_dtype)]
    if array == "torch":
        args = [torch.from_numpy(x) for x in args]
        kw["sinks"], kw["alibi_slopes"] = torch.from_numpy(kw["sinks"]), torch.from_numpy(slopes)
    out = tandem.attention(*args[:3], backend=backend, cu_seqlens_q=args[3],
                           cu_seqlens_k=args[4], seqused_k=args[5], **kw)
    assert type(out) is type(args[0]) and tuple(out.shape) == (8, 4, 6)
    out = np.asarray(out)
    for s in range(3):
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s] + used[s])
        expect = numpy_attention(q[None, rows], k[None, keys], v[None, keys], sinks=kw["sinks"],
                                 alibi_slopes=slopes[s], **plain(mask="causal"))[0]
        np.testing.assert_allclose(out[rows], expect, atol=3e-6, rtol=1e-5)
    assert np.all(out[cu_q[1]:cu_q[2]] == 0)  # no key, and the sink has no value


def test_packed_rank2_with_num_heads_equals_rank3():
    q, k, v, cu_q, cu_k = packed([2, 3], [4, 1])
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, mask="causal")
    out3 = tandem.attention(q, k, v, backend="reference", **kw)
    out2 = tandem.attention(q.reshape(5, 32), k.reshape(5, 16), v.reshape(5, 12), num_heads=4,
                            backend="reference", **kw)
    np.testing.assert_array_equal(out2, out3.reshape(5, 24))


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_backward_equals_each_sequence_backward(backend):
    lq, lk = [2, 3], [3, 4]
    q, k, v, cu_q, cu_k = packed(lq, lk, D=4, Dv=3)
    dout = randn(5, 4, 3)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, mask="causal", sinks=randn(4))
    dq, dk, dv, dsinks = tandem.attention_backward(q, k, v, dout, backend=backend, **kw)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    total = np.zeros(4)
    for s in range(2):
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        g = tandem.attention_backward(*(x[None].astype(np.float64) for x in
                                        (q[rows], k[keys], v[keys], dout[rows])),
                                      mask="causal", sinks=kw["sinks"].astype(np.float64))
        for got, ref, sl in zip((dq, dk, dv), g[:3], (rows, keys, keys)):
            np.testing.assert_allclose(got[sl], ref[0], atol=2e-5, rtol=1e-4)
        total += g[3]
    np.testing.assert_allclose(dsinks, total, atol=2e-5, rtol=1e-4)


# ---------------------------------------------------------------------------
# Paged KV cache


def paged_cache(k, v, block_size, num_blocks, max_blocks):
    """k, v [B, Sk, Hkv, D] spread over the blocks of a cache in a shuffled
    order: (k_cache, v_cache, block_table)."""
    B, Sk = k.shape[:2]
    k_cache = randn(num_blocks, block_size, *k.shape[2:])
    v_cache = randn(num_blocks, block_size, *v.shape[2:])
    order = rng.permutation(num_blocks)
    table = np.full((B, max_blocks), -1, np.int64)  # unused entries are never read
    used = 0
    for b in range(B):
        for j in range(-(-Sk // block_size)):
            blk = order[used]
            used += 1
            table[b, j] = blk
            n = min(block_size, Sk - j * block_size)
            k_cache[blk, :n] = k[b, j * block_size:j * block_size + n]
            v_cache[blk, :n] = v[b, j * block_size:j * block_size + n]
    return k_cache, v_cache, table


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_cache_equals_attention_over_each_entry_s_keys(index_dtype, backend):
    B, Sq, H, Hkv, D = 3, 2, 4, 2, 8
    k, v = randn(B, 11, Hkv, D), randn(B, 11, Hkv, D)
    k_cache, v_cache, table = paged_cache(k, v, block_size=4, num_blocks=12, max_blocks=4)
    lengths = np.array([11, 5, 2], index_dtype)
    q, sinks = randn(B, Sq, H, D), randn(H)
    out, lse = tandem.attention_with_kvcache(q, k_cache, v_cache, table.astype(index_dtype),
                                             lengths, backend=backend, mask="causal", sinks=sinks,
                                             return_lse=True)
    assert out.shape == (B, Sq, H, D) and lse.shape == (B, H, Sq)
    for b in range(B):
        n = lengths[b]
        expect = numpy_attention(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], sinks=sinks,
                                 **plain(mask="causal"))
        np.testing.assert_allclose(out[b:b + 1], expect, atol=3e-6, rtol=1e-5)
    # the cache is read in place: a key written into a used slot changes the output
    assert tandem._ext.address(k_cache) == k_cache.__array_interface__["data"][0]
    v_cache[table[2, 0], 1] += 1.0
    again = tandem.attention_with_kvcache(q, k_cache, v_cache, table.astype(index_dtype),
                                          lengths, backend=backend, mask="causal", sinks=sinks)
    assert not np.array_equal(again[2], out[2]) and np.array_equal(again[:2], out[:2])


def test_paged_cache_with_torch_tensors():
    k, v = randn(2, 6, 1, 4), randn(2, 6, 1, 4)
    k_cache, v_cache, table = paged_cache(k, v, block_size=2, num_blocks=8, max_blocks=3)
    q = randn(2, 1, 2, 4)
    lengths = torch.tensor([6, 3], dtype=torch.int32)
    out = tandem.attention_with_kvcache(*(torch.from_numpy(x) for x in (q, k_cache, v_cache)),
                                        torch.from_numpy(table), lengths, backend="reference")
    assert isinstance(out, torch.Tensor)
    for b, n in enumerate((6, 3)):
        expect = numpy_attention(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], **plain())
        np.testing.assert_allclose(out[b:b + 1].numpy(), expect, atol=3e-6, rtol=1e-5)


# ---------------------------------------------------------------------------
# Errors: tandem.Error naming the parameter


def _q():
    return randn(2, 5, 4, 8), randn(2, 7, 2, 8), randn(2, 7, 2, 6)


def _packed_call(**kw):
    q, k, v, cu_q, cu_k = packed([2, 3], [4, 3])
    args = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    args.update(kw)
    return tandem.attention(q, k, v, backend="reference", **args)


def _paged_call(**kw):
    k_cache, v_cache = randn(6, 4, 2, 8), randn(6, 4, 2, 8)
    args = dict(block_table=np.array([[0, 1], [2, 3]], np.int32),
                cache_seqlens=np.array([8, 5], np.int32))
    args.update(kw)
    return tandem.attention_with_kvcache(randn(2, 1, 4, 8), k_cache, v_cache, args.pop(
        "block_table"), args.pop("cache_seqlens"), backend="reference", **args)


ERRORS = [
    (lambda: tandem.attention(*_q(), sinks=randn(3), backend="reference"), "sinks.shape"),
    (lambda: tandem.attention(*_q(), sinks=randn(4, dtype=np.float64)), "sinks.dtype"),
    (lambda: tandem.attention(*_q(), sinks=np.array([0, np.nan, 0, 0], np.float32),
                              backend="reference"), "sinks"),
    (lambda: tandem.attention(*_q(), alibi_slopes=np.ones(3)), "alibi_slopes.shape"),
    (lambda: tandem.attention(*_q(), alibi_slopes=np.ones((2, 2, 4))), "alibi_slopes.shape"),
    (lambda: tandem.attention(*_q(), alibi_slopes=np.ones((3, 4)), backend="reference"),
     "alibi_slopes.shape"),
    (lambda: _packed_call(cu_seqlens_k=None), "cu_seqlens_k"),
    (lambda: _packed_call(cu_seqlens_q=np.array([0, 3, 2, 5]),
                          cu_seqlens_k=np.array([0, 1, 4, 7])), "cu_seqlens_q"),
    (lambda: _packed_call(cu_seqlens_q=np.array([0, 2, 4])), "cu_seqlens_q"),
    (lambda: _packed_call(cu_seqlens_k=np.array([0, 7])), "cu_seqlens_k.shape"),
    (lambda: _packed_call(cu_seqlens_q=np.array([0.0, 2.0, 5.0])), "cu_seqlens_q.dtype"),
    (lambda: _packed_call(seqused_k=np.array([4, 4])), "seqused_k"),
    (lambda: _packed_call(layout="bhsd"), "layout"),
    (lambda: _packed_call(key_padding=np.ones((1, 7))), "mask"),
    (lambda: tandem.attention(*_q(), seqused_k=np.array([1, 1])), "seqused_k"),
    (lambda: _paged_call(block_table=np.array([[0, 6], [2, 3]])), "block_table"),
    (lambda: _paged_call(cache_seqlens=np.array([9, 5])), "cache_seqlens"),
    (lambda: _paged_call(cache_seqlens=np.array([8, 5, 1])), "cache_seqlens.shape"),
    (lambda: _paged_call(block_table=np.array([0, 1, 2, 3])), "block_table.shape"),
    (lambda: _paged_call(block_table=np.ones((2, 2), np.float32)), "block_table.dtype"),
    (lambda: _paged_call(cache_seqlens=None), "cache_seqlens"),
    (lambda: tandem.rope(randn(2, 5, 8), randn(6, 4), randn(6, 4), head_dim=8,
                         positions=np.array([[0, 1, 2, 3, 6], [0, 0, 0, 0, 0]])), "positions"),
    (lambda: tandem.rope(randn(2, 5, 8), randn(6, 4), randn(6, 4), head_dim=8,
                         positions=np.zeros(10, np.int32)), "positions.shape"),
    (lambda: tandem.rope(randn(2, 5, 8), randn(6, 4), randn(6, 4), head_dim=8,
                         positions=np.zeros((2, 5), np.int32), table_rows="token"), "table_rows"),
    (lambda: tandem.rope(randn(2, 3, 5, 8), randn(6, 4), randn(6, 4),
                         positions=np.zeros((2, 5), np.int32)), "layout"),
    (lambda: tandem.rope(randn(5, 8), head_dim=8, cos_sin_cache=randn(6, 7)),
     "cos_sin_cache.shape"),
    (lambda: tandem.rope_qk(randn(2, 5, 4, 8), randn(2, 4, 2, 8), randn(6, 4), randn(6, 4),
                            layout="bshd"), "k.shape"),
]


@pytest.mark.parametrize("case", range(len(ERRORS)))
def test_feature_errors_name_the_parameter(case):
    call, parameter = ERRORS[case]
    with pytest.raises(tandem.Error) as info:
        call()
    assert info.value.parameter == parameter, str(info.value)
    assert str(info.value).startswith(parameter.split(".")[0]), str(info.value)


# ---------------------------------------------------------------------------
# RoPE by position ids and layouts


def tables(R, T):
    angle = rng.uniform(-3, 3, (R, T))
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def rope_by_rows(x, cos, sin, rows, style="neox", n_rot=None):
    """RoPE of x [N, H, D] with table row rows[t] for token t (NumPy)."""
    N, H, D = x.shape
    n_rot = D if n_rot is None else n_rot
    y = numpy_rope(x.reshape(1, N, H * D), cos[rows], sin[rows], head_dim=D, n_rot=n_rot,
                   style=style, table_rows="position")
    return y.reshape(N, H, D)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_reads_the_table_rows_of_the_position_ids(index_dtype, style, backend):
    B, S, H, D, R = 2, 5, 3, 8, 9
    cos, sin = tables(R, 3)
    x = randn(B, S, H, D)
    pos = rng.integers(0, R, (B, S)).astype(index_dtype)
    kw = dict(n_rot=6, style=style, positions=pos, backend=backend)
    expect = rope_by_rows(x.reshape(B * S, H, D), cos, sin, pos.reshape(-1), style,
                          6).reshape(B, S, H, D)
    np.testing.assert_allclose(tandem.rope(x, cos, sin, layout="bshd", **kw), expect, atol=1e-6)
    np.testing.assert_allclose(tandem.rope(x.reshape(B, S, H * D), cos, sin, head_dim=D, **kw),
                               expect.reshape(B, S, H * D), atol=1e-6)
    xt = np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    np.testing.assert_allclose(tandem.rope(xt, cos, sin, layout="bhsd", **kw),
                               expect.transpose(0, 2, 1, 3), atol=1e-6)
    thd = tandem.rope(x.reshape(B * S, H, D), cos, sin, layout="thd",
                      **dict(kw, positions=pos.reshape(-1)))
    np.testing.assert_allclose(thd, expect.reshape(B * S, H, D), atol=1e-6)
    # torch tensors, and one cos_sin_cache [R, 2T] as vLLM keeps it
    cache = torch.from_numpy(np.concatenate([cos, sin], axis=1))
    t = tandem.rope(torch.from_numpy(x), layout="bshd", cos_sin_cache=cache,
                    **dict(kw, positions=torch.from_numpy(pos)))
    np.testing.assert_allclose(t.numpy(), expect, atol=1e-6)


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "thd"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_qk_equals_two_rope_calls_and_its_backward_is_the_transpose(layout, backend):
    B, S, H, Hkv, D, R = 2, 4, 4, 2, 8, 10
    cos, sin = tables(R, 4)
    shape = {"bshd": lambda h: (B, S, h, D), "bhsd": lambda h: (B, h, S, D),
             "thd": lambda h: (B * S, h, D)}[layout]
    q, k = randn(*shape(H)), randn(*shape(Hkv))
    pos = rng.integers(0, R, (B * S,) if layout == "thd" else (B, S))
    kw = dict(layout=layout, positions=pos, style="gptj", backend=backend)
    q_out, k_out = tandem.rope_qk(q, k, cos, sin, **kw)
    np.testing.assert_array_equal(q_out, tandem.rope(q, cos, sin, **kw))
    np.testing.assert_array_equal(k_out, tandem.rope(k, cos, sin, **kw))
    dq_out, dk_out = randn(*q.shape), randn(*k.shape)
    dq, dk = tandem.rope_qk_backward(dq_out, dk_out, cos, sin, **kw)
    lhs = np.sum(q_out * dq_out, dtype=np.float64) + np.sum(k_out * dk_out, dtype=np.float64)
    rhs = np.sum(q * dq, dtype=np.float64) + np.sum(k * dk, dtype=np.float64)
    assert abs(lhs - rhs) < 1e-4
    np.testing.assert_array_equal(dq, tandem.rope_backward(dq_out, cos, sin, **kw))


def test_rope_with_positions_reads_a_row_strided_source_in_place():
    parent = randn(2, 5, 40)
    x = parent[:, :, :24]  # [B, S, H*D] rows 40 apart
    cos, sin = np.ones((7, 4), np.float32), np.zeros((7, 4), np.float32)
    pos = np.array([[6, 5, 4, 3, 2], [0, 1, 2, 3, 4]], np.int32)
    out = tandem.rope(x, cos, sin, head_dim=8, positions=pos)
    np.testing.assert_array_equal(out, x)  # angle 0: the identity
    assert tandem._ext.address(x) == x.__array_interface__["data"][0]
    assert tandem._ext.address(pos) == pos.__array_interface__["data"][0]
