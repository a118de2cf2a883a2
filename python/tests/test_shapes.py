# SPDX-License-Identifier: Apache-2.0
"""A bad shape of any argument of any op is a tandem.Error that names that
argument: the C++ shape rules (SPEC §1, §8) name the inputs as the Python API
calls them, and Python passes their errors on as they are."""

import numpy as np
import pytest
import torch

import tandem
import tandem.torch as tt


def randn(*shape):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def qkv():
    return randn(2, 5, 4, 8), randn(2, 7, 2, 8), randn(2, 7, 2, 6)


def packed(**kw):
    args = dict(cu_seqlens_q=np.array([0, 2, 5]), cu_seqlens_k=np.array([0, 4, 7]))
    args.update(kw)
    q = args.pop("q", randn(5, 4, 8))
    return tandem.attention(q, randn(7, 2, 8), randn(7, 2, 8), **args)


def paged(**kw):
    args = dict(q=randn(2, 1, 4, 8), k_cache=randn(6, 4, 2, 8), v_cache=randn(6, 4, 2, 8),
                block_table=np.array([[0, 1], [2, 3]], np.int32),
                cache_seqlens=np.array([8, 5], np.int32))
    args.update(kw)
    return tandem.attention_with_kvcache(**args)


def block(**kw):
    B, S, E = 2, 5, 8
    args = dict(x=randn(B, S, E), w_qkv=randn(3 * E, E), w_out=randn(E, E), num_heads=2)
    args.update(kw)
    return tandem.attention_block(**args)


ROPE_TABLE = randn(6, 4)

BAD_SHAPES = [
    # attention: q, k, v and the mask
    (lambda: tandem.attention(randn(2, 5, 4, 8, 1), *qkv()[1:]), "q.shape", "rank 2, 3 or 4"),
    (lambda: tandem.attention(qkv()[0], randn(2, 7, 16), qkv()[2]), "k.shape", "rank of q.shape"),
    (lambda: tandem.attention(qkv()[0], randn(2, 7, 2, 4), qkv()[2]), "k.shape", "k.shape"),
    (lambda: tandem.attention(*qkv()[:2], randn(2, 6, 2, 6)), "v.shape", "v.shape"),
    (lambda: tandem.attention(*qkv(), bias=np.zeros((1, 1, 5, 4))), "bias.shape", "bias.shape"),
    (lambda: tandem.attention(*qkv(), bias=np.zeros((1, 3, 5, 7))), "bias.shape", "Hb in {1, 4}"),
    (lambda: tandem.attention(*qkv(), key_padding=np.ones((2, 6))), "key_padding.shape",
     "key_padding.shape"),
    (lambda: tandem.attention(*qkv(), mask="bias"), "mask", "mask"),
    # an empty axis, caught by the shape rules before make()
    (lambda: tandem.attention(randn(1, 0, 2, 4), randn(1, 3, 2, 4), randn(1, 3, 2, 4)),
     "q.shape", "q.shape = [1, 0, 2, 4] must have every dim >= 1"),
    (lambda: tandem.attention(randn(1, 2, 2, 4), randn(1, 0, 2, 4), randn(1, 0, 2, 4)),
     "k.shape", "no empty axis"),
    (lambda: tandem.attention(randn(1, 2, 2, 4), randn(1, 3, 2, 4), randn(1, 3, 2, 0)),
     "v.shape", "no empty axis"),
    (lambda: paged(k_cache=randn(0, 4, 2, 8)), "k_cache.shape", "no empty axis"),
    (lambda: tt.scaled_dot_product_attention(torch.randn(1, 2, 0, 8), torch.randn(1, 2, 3, 8),
                                             torch.randn(1, 2, 3, 8)), "query.shape",
     "no empty axis"),
    # the features
    (lambda: tandem.attention(*qkv(), sinks=randn(3)), "sinks.shape", "sinks.shape"),
    (lambda: tandem.attention(*qkv(), alibi_slopes=np.ones((3, 4))), "alibi_slopes.shape",
     "alibi_slopes.shape"),
    (lambda: packed(cu_seqlens_q=np.array([[0, 5]])), "cu_seqlens_q.shape", "cu_seqlens_q"),
    (lambda: packed(cu_seqlens_k=np.array([0, 7])), "cu_seqlens_k.shape", "cu_seqlens_k"),
    (lambda: packed(seqused_k=np.array([1, 1, 1])), "seqused_k.shape", "seqused_k"),
    (lambda: packed(q=randn(5, 3, 8)), "k.shape", "divides num_heads = 3"),
    (lambda: paged(block_table=np.zeros((3, 2), np.int32)), "block_table.shape", "block_table"),
    (lambda: paged(cache_seqlens=np.zeros(3, np.int32)), "cache_seqlens.shape",
     "cache_seqlens"),
    (lambda: paged(k_cache=randn(6, 4, 2, 4)), "k_cache.shape", "k_cache.shape"),
    (lambda: paged(v_cache=randn(6, 3, 2, 8)), "v_cache.shape", "must match k_cache.shape"),
    # RoPE
    (lambda: tandem.rope(randn(2, 5, 4, 8, 1), ROPE_TABLE, ROPE_TABLE, layout="bshd"), "x.shape",
     "x.shape"),
    (lambda: tandem.rope(randn(2, 5, 32), ROPE_TABLE, ROPE_TABLE, head_dim=8,
                         positions=np.zeros((2, 4), np.int32)), "positions.shape", "positions"),
    (lambda: tandem.rope(randn(5, 8), head_dim=8, cos_sin_cache=randn(6, 7)),
     "cos_sin_cache.shape", "cos_sin_cache"),
    (lambda: tandem.rope(randn(2, 5, 4, 8), randn(6), randn(6), layout="bshd"), "cos.shape",
     "cos.shape"),
    (lambda: tandem.rope(randn(2, 5, 4, 8), ROPE_TABLE, ROPE_TABLE, layout="thd"), "layout",
     "x.shape = [2, 5, 4, 8]"),
    (lambda: tandem.rope_backward(randn(2, 5, 4, 8, 1), ROPE_TABLE, ROPE_TABLE, layout="bshd"),
     "dy.shape", "dy.shape"),
    (lambda: tandem.rope_qk(randn(2, 5, 4, 8), randn(2, 4, 2, 8), ROPE_TABLE, ROPE_TABLE,
                            layout="bshd"), "k.shape", "k.shape"),
    (lambda: tandem.rope_qk(randn(2, 5, 4, 8, 1), randn(2, 5, 2, 8), ROPE_TABLE, ROPE_TABLE,
                            layout="bshd"), "q.shape", "q.shape"),
    # RoPE: every argument of rope, rope_backward, rope_qk, rope_qk_backward and tandem.torch's
    (lambda: tandem.rope(randn(2, 5, 4, 8), ROPE_TABLE, randn(6, 2), layout="bshd"),
     "sin.shape", "must equal cos.shape"),
    (lambda: tandem.rope(randn(2, 5, 4, 8), None, ROPE_TABLE, layout="bshd"), "cos",
     "cos_sin_cache"),
    (lambda: tandem.rope(randn(2, 5, 4, 8), ROPE_TABLE, layout="bshd"), "sin", "sin"),
    (lambda: tandem.rope(randn(5, 8), ROPE_TABLE, ROPE_TABLE, head_dim=8,
                         cos_sin_cache=randn(6, 8)), "cos_sin_cache", "cos and sin"),
    (lambda: tandem.rope(randn(5, 8), head_dim=8, cos_sin_cache=randn(6, 2, 4)),
     "cos_sin_cache.shape", "[R, 2T]"),
    (lambda: tandem.rope(randn(5, 8), head_dim=16, cos_sin_cache=randn(6, 2)),
     "cos_sin_cache.shape", "T >= max(n_rot/2, 1) = 8"),
    (lambda: tandem.rope(randn(2, 5, 4, 8), ROPE_TABLE, ROPE_TABLE, layout="bshd", head_dim=4),
     "head_dim", "x.shape = [2, 5, 4, 8]"),
    (lambda: tandem.rope(randn(2, 5, 32), ROPE_TABLE, ROPE_TABLE), "head_dim",
     "x.shape = [2, 5, 32]"),
    (lambda: tandem.rope(randn(2, 5, 32), ROPE_TABLE, ROPE_TABLE, layout="bhsd"), "layout",
     "x.shape = [2, 5, 32]"),
    (lambda: tandem.rope(randn(2, 3, 5, 8), ROPE_TABLE, ROPE_TABLE,
                         positions=np.zeros((2, 5), np.int32)), "layout", "positions"),
    (lambda: tandem.rope(randn(5, 4, 8), ROPE_TABLE, ROPE_TABLE, layout="thd",
                         positions=np.zeros((1, 5), np.int32)), "positions.shape", "[T]"),
    (lambda: tandem.rope_backward(randn(2, 5, 4, 8), ROPE_TABLE, ROPE_TABLE, layout="bshd",
                                  positions=np.zeros((2, 4), np.int32)), "positions.shape",
     "dy's token axes"),
    (lambda: tandem.rope_qk(randn(2, 5, 4, 8), randn(2, 5, 2, 8), ROPE_TABLE, ROPE_TABLE),
     "layout", "q.shape = [2, 5, 4, 8]"),
    (lambda: tandem.rope_qk(randn(2, 5, 4, 8), randn(2, 5, 2, 8, 1), ROPE_TABLE, ROPE_TABLE,
                            layout="bshd"), "k.shape", "rank of q.shape"),
    (lambda: tandem.rope_qk(randn(2, 5, 4, 8), randn(2, 5, 2, 8), randn(6, 4, 1), ROPE_TABLE,
                            layout="bshd"), "cos.shape", "cos.shape"),
    (lambda: tandem.rope_qk(randn(2, 5, 4, 8), randn(2, 5, 2, 8), ROPE_TABLE, randn(5, 4),
                            layout="bshd"), "sin.shape", "sin.shape"),
    (lambda: tandem.rope_qk(randn(2, 5, 4, 8), randn(2, 5, 2, 8), layout="bshd",
                            cos_sin_cache=randn(6, 3)), "cos_sin_cache.shape", "cos_sin_cache"),
    (lambda: tandem.rope_qk(randn(2, 5, 4, 8), randn(2, 5, 2, 8), ROPE_TABLE, ROPE_TABLE,
                            layout="bshd", positions=np.zeros(10, np.int32)), "positions.shape",
     "q's token axes [B, S] = [2, 5]"),
    (lambda: tandem.rope_qk_backward(randn(2, 5, 4, 8, 1), randn(2, 5, 2, 8), ROPE_TABLE,
                                     ROPE_TABLE, layout="bshd"), "dq_out.shape", "dq_out.shape"),
    (lambda: tandem.rope_qk_backward(randn(2, 5, 4, 8), randn(2, 4, 2, 8), ROPE_TABLE,
                                     ROPE_TABLE, layout="bshd"), "dk_out.shape",
     "token axes of dq_out.shape"),
    (lambda: tt.rope(torch.randn(2, 5, 4, 8, 1), torch.randn(6, 4), torch.randn(6, 4),
                     layout="bshd"), "x.shape", "x.shape"),
    (lambda: tt.rope(torch.randn(2, 5, 4, 8), torch.randn(6, 4), torch.randn(6, 4),
                     layout="bshd", positions=torch.zeros(2, 4, dtype=torch.int64)),
     "positions.shape", "positions.shape"),
    # SwiGLU
    (lambda: tandem.swiglu(randn(3, 5)), "x.shape", "x.shape"),
    (lambda: tandem.swiglu_backward(randn(3, 4), randn(3, 3)), "dy.shape", "dy.shape"),
    # the attention block
    (lambda: block(x=randn(2, 5)), "x.shape", "x.shape"),
    (lambda: block(w_qkv=randn(8, 8)), "w_qkv.shape", "w_qkv.shape"),
    (lambda: block(b_qkv=randn(8)), "b_qkv.shape", "b_qkv.shape"),
    (lambda: block(w_out=randn(8, 4)), "w_out.shape", "w_out.shape"),
    (lambda: block(b_out=randn(4)), "b_out.shape", "b_out.shape"),
    (lambda: block(key_padding=np.ones((2, 4))), "key_padding.shape", "key_padding.shape"),
    (lambda: block(cos=randn(5), sin=randn(5)), "cos.shape", "cos.shape"),
]


@pytest.mark.parametrize("case", range(len(BAD_SHAPES)))
def test_a_bad_shape_names_the_argument(case):
    call, parameter, fragment = BAD_SHAPES[case]
    with pytest.raises(tandem.Error) as info:
        call()
    assert info.value.parameter == parameter, str(info.value)
    assert str(info.value).startswith(parameter.split(".")[0]), str(info.value)
    assert fragment in str(info.value), str(info.value)


def test_no_message_names_an_internal_field():
    for call, _, _ in BAD_SHAPES:
        with pytest.raises(tandem.Error) as info:
            call()
        for field in ("bias_heads", "bias_batch", "kv_heads", "v_head_dim", "seq_q", "seq_k"):
            assert field not in str(info.value), str(info.value)


SDPA_BAD_SHAPES = [
    (lambda q: tt.scaled_dot_product_attention(q[0], q, q), "key.shape"),
    (lambda q: tt.scaled_dot_product_attention(q, q[..., :4], q), "key.shape"),
    (lambda q: tt.scaled_dot_product_attention(q, q, q[:, :, :2]), "value.shape"),
    (lambda q: tt.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(5, 3)),
     "attn_mask"),
]


@pytest.mark.parametrize("case", range(len(SDPA_BAD_SHAPES)))
def test_the_torch_drop_in_names_torchs_arguments(case):
    call, parameter = SDPA_BAD_SHAPES[case]
    with pytest.raises(tandem.Error) as info:
        call(torch.randn(1, 4, 3, 8))
    assert info.value.parameter.split(".")[0] == parameter.split(".")[0], str(info.value)


def test_thd_is_the_packed_layout_of_attention():
    q, k, v = randn(5, 4, 8), randn(7, 2, 8), randn(7, 2, 8)
    cu = dict(cu_seqlens_q=np.array([0, 2, 5]), cu_seqlens_k=np.array([0, 4, 7]))
    out = tandem.attention(q, k, v, layout="thd", **cu)
    assert out.shape == (5, 4, 8)
    np.testing.assert_array_equal(out, tandem.attention(q, k, v, **cu))
    folded = tandem.attention(q.reshape(5, 32), k.reshape(7, 16), v.reshape(7, 16),
                              layout="thd", num_heads=4, **cu)
    np.testing.assert_array_equal(folded.reshape(5, 4, 8), out)
    with pytest.raises(tandem.Error) as info:  # thd is packed tokens: it takes cu_seqlens
        tandem.attention(q, k, v, layout="thd", num_heads=4)
    assert info.value.parameter == "layout", str(info.value)


def test_bias_of_shape_sq_sk_is_one_bias_for_every_head():
    q, k, v = qkv()
    bias = randn(5, 7)
    np.testing.assert_array_equal(tandem.attention(q, k, v, bias=bias),
                                  tandem.attention(q, k, v, bias=bias[None, None]))
