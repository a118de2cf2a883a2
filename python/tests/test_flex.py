# SPDX-License-Identifier: Apache-2.0
"""tandem.flex_attention (SPEC §13) against torch: the forward against
torch's own flex_attention (eager, CPU), the backward against torch's
autograd through the materialized computation (softmax of the modified,
masked scores; SDPA with the materialized bias for a learned bias), for
causal, sliding window, ALiBi, softcap, document and prefix-LM masks and a
learned bias; tandem.create_block_mask against torch's; tracing errors name
the operation and the callable; validate_block_mask finds a full block that
is not all kept; invalid input raises tandem.Error before anything is
written.

Tolerances. float64 runs the reference in double, as torch's float64 does:
the two differ by rounding only, a few units of γ_n = n·2^-53 with n = D + Sk
(the dot products, then the sums over keys) times the size of the values,
so float64 is compared at 64·γ_n. float32 runs the reference in double from
the float32 inputs and rounds each output once (SPEC §13.4): within 2^-24 of
the float64 result on the same inputs, relative, plus the float64 tolerance.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import tandem
from tandem import _ext
from tandem import flex as flex_module

flex_api = pytest.importorskip("torch.nn.attention.flex_attention")

torch.manual_seed(19)

B, H, HKV, SQ, SK, D = 2, 4, 2, 24, 40, 8
U64, U32 = 2.0**-53, 2.0**-24
TOL64 = 64 * (D + SK) * U64


def qkv(dtype=torch.float64, h=H, hkv=H, sq=SQ, sk=SK, grad=False):
    def t(*shape):
        return torch.randn(*shape, dtype=dtype).requires_grad_(grad)
    return t(B, h, sq, D), t(B, hkv, sk, D), t(B, hkv, sk, D)


def indices(sq=SQ, sk=SK):
    """b, h, q_idx, kv_idx as broadcasting int64 tensors [B,1,1,1] … [1,1,1,Sk]."""
    return (torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, H, 1, 1),
            torch.arange(sq).view(1, 1, sq, 1), torch.arange(sk).view(1, 1, 1, sk))


def materialized(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """The math of SPEC §13.4 with torch ops on whole tensors (differentiable):
    softmax over visible keys of score_mod(scale·q kᵀ), times v."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q @ k.transpose(-1, -2)
    b, h, i, j = indices(q.shape[2], k.shape[2])
    t = score_mod(s, b, h, i, j) if score_mod else s
    if mask_mod is not None:
        t = torch.where(mask_mod(b, h, i, j), t, -math.inf)
    return torch.softmax(t, -1) @ v


def close(got, want, tol):
    """|got − want| <= tol·(1 + |want|) elementwise."""
    err = (got - want).abs() / (1 + want.abs())
    assert err.max().item() <= tol, f"max scaled error {err.max().item():.3g} > {tol:.3g}"


# the mods of the tests, with the tensors they capture
WINDOW = 6
SLOPES = torch.tensor([2.0**-(i + 1) for i in range(H)], dtype=torch.float64)
DOCS = torch.tensor([0] * 9 + [1] * 20 + [2] * 11)  # a document id per position (SQ <= SK)
PREFIX = torch.tensor([5, 13])                       # a prefix length per batch entry


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= WINDOW)


def document(b, h, q_idx, kv_idx):
    return (DOCS[q_idx] == DOCS[kv_idx]) & (q_idx >= kv_idx)


def prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx < PREFIX[b]) | (q_idx >= kv_idx)


def alibi(score, b, h, q_idx, kv_idx):
    return score + SLOPES[h] * (kv_idx - q_idx)


def softcap(score, b, h, q_idx, kv_idx):
    return 20.0 * torch.tanh(score / 20.0)


MASKS = {"causal": causal, "sliding_window": sliding, "document": document,
         "prefix_lm": prefix_lm}
SCORES = {"alibi": alibi, "softcap": softcap}
CASES = [(None, m) for m in MASKS] + [(s, None) for s in SCORES] + [("alibi", "causal"),
                                                                     ("softcap", "sliding_window")]


def mods(case):
    s, m = case
    return SCORES.get(s), MASKS.get(m)


def torch_block_mask(mask_mod, block=8):
    return flex_api.create_block_mask(mask_mod, B, None, SQ, SK, device="cpu",
                                      BLOCK_SIZE=block)


# ---------------------------------------------------------------------- forward


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_forward_matches_torch_flex_attention(case):
    score_mod, mask_mod = mods(case)
    q, k, v = qkv()
    bm = torch_block_mask(mask_mod) if mask_mod else None
    want, want_lse = flex_api.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm,
                                             return_lse=True)
    got, lse = tandem.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm,
                                     return_lse=True)
    assert got.shape == want.shape and lse.shape == (B, H, SQ) and lse.dtype == torch.float64
    close(got, want, TOL64)
    close(lse, want_lse, TOL64)
    # tandem's own block mask gives the same result
    if mask_mod:
        own = tandem.create_block_mask(mask_mod, B, None, SQ, SK, BLOCK_SIZE=8)
        close(tandem.flex_attention(q, k, v, score_mod=score_mod, block_mask=own), want, TOL64)


@pytest.mark.parametrize("name", MASKS)
def test_create_block_mask_matches_torch(name):
    ours = tandem.create_block_mask(MASKS[name], B, None, SQ, SK, BLOCK_SIZE=8)
    theirs = torch_block_mask(MASKS[name])

    def blocks(m, num, idx):
        n, ix = getattr(m, num), getattr(m, idx)
        return [[sorted(ix[b, 0, r, :n[b, 0, r]].tolist()) for r in range(n.shape[2])]
                for b in range(n.shape[0])]

    for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
        assert blocks(ours, num, idx) == blocks(theirs, num, idx), num
    tandem.validate_block_mask(ours, B, H, SQ, SK)
    tandem.validate_block_mask(theirs, B, H, SQ, SK)
    tandem.validate_block_mask(theirs)  # B, H, SQ, SK of the mask itself


@pytest.mark.skipif(not hasattr(flex_api, "AuxRequest"), reason="torch < 2.9 has no AuxRequest")
def test_return_aux_gives_lse_as_torch():
    q, k, v = qkv()
    bm = torch_block_mask(sliding)
    want, aux = flex_api.flex_attention(q, k, v, block_mask=bm,
                                        return_aux=flex_api.AuxRequest(lse=True))
    got, mine = tandem.flex_attention(q, k, v, block_mask=bm,
                                      return_aux=flex_api.AuxRequest(lse=True))
    close(got, want, TOL64)
    close(mine.lse, aux.lse, TOL64)
    assert mine.max_scores is None
    with pytest.raises(tandem.Error) as e:
        tandem.flex_attention(q, k, v, return_aux=flex_api.AuxRequest(max_scores=True))
    assert e.value.parameter == "return_aux.max_scores"


def test_gqa_and_scale_match_torch():
    q, k, v = qkv(hkv=HKV)
    bm = torch_block_mask(causal)
    want = flex_api.flex_attention(q, k, v, score_mod=alibi, block_mask=bm, scale=0.3,
                                   enable_gqa=True)
    got = tandem.flex_attention(q, k, v, score_mod=alibi, block_mask=bm, scale=0.3,
                                enable_gqa=True)
    close(got, want, TOL64)
    with pytest.raises(tandem.Error) as e:
        tandem.flex_attention(q, k, v)
    assert e.value.parameter == "enable_gqa"
    # the backward sums each kv head's gradient over its query heads
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    dout = torch.randn(B, H, SQ, D, dtype=torch.float64)
    got = torch.autograd.grad(tandem.flex_attention(q, k, v, score_mod=alibi, block_mask=bm,
                                                    scale=0.3, enable_gqa=True), (q, k, v), dout)
    want = torch.autograd.grad(materialized(q, k, v, alibi, causal, scale=0.3), (q, k, v), dout)
    for g, w in zip(got, want):
        close(g, w, TOL64)


def test_tensors_in_any_layout_are_taken():
    # q, k, v as the transposes of bshd tensors, as a model hands them over
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
               for x in qkv())
    assert not q.is_contiguous()
    out = tandem.flex_attention(q, k, v, score_mod=alibi)
    close(out, materialized(q, k, v, alibi), TOL64)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(materialized(q, k, v, alibi), (q, k, v), dout)
    for g, w in zip(got, want):
        close(g, w, TOL64)


def test_a_row_that_sees_nothing_has_zero_out_and_minus_inf_lse():
    q, k, v = qkv()

    def late(b, h, q_idx, kv_idx):
        return kv_idx > q_idx + 30  # rows 10… see no key

    out, lse = tandem.flex_attention(q, k, v, block_mask=tandem.create_block_mask(
        late, None, None, SQ, SK, BLOCK_SIZE=8), return_lse=True)
    assert (out[:, :, 10:] == 0).all() and (lse[:, :, 10:] == -math.inf).all()
    assert torch.isfinite(lse[:, :, :9]).all()


@pytest.mark.parametrize("case", [(None, "document"), ("softcap", "sliding_window")],
                         ids=lambda c: f"{c[0]}-{c[1]}")
def test_float32_is_the_float64_result_rounded_once(case):
    """The reference's float32 contract (SPEC §13.4); the optimized backend's is §13.5's."""
    score_mod, mask_mod = mods(case)
    q, k, v = qkv(torch.float32)
    bm = tandem.create_block_mask(mask_mod, B, None, SQ, SK, BLOCK_SIZE=8)
    got, lse = tandem.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm,
                                     return_lse=True, backend="reference")
    want, want_lse = tandem.flex_attention(q.double(), k.double(), v.double(),
                                           score_mod=score_mod, block_mask=bm, return_lse=True)
    assert got.dtype == lse.dtype == torch.float32
    close(got.double(), want, U32 + TOL64)
    close(lse.double(), want_lse, U32 + TOL64)
    # and within float32's own rounding of torch's float32 flex_attention (n = D + Sk terms)
    close(got, flex_api.flex_attention(q, k, v, score_mod=score_mod,
                                       block_mask=torch_block_mask(mask_mod)),
          4 * (D + SK) * U32)


# --------------------------------------------------------------------- backward


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_backward_matches_autograd_of_the_materialized_math(case):
    score_mod, mask_mod = mods(case)
    q, k, v = qkv(grad=True)
    dout = torch.randn(B, H, SQ, D, dtype=torch.float64)
    bm = tandem.create_block_mask(mask_mod, B, None, SQ, SK, BLOCK_SIZE=8) if mask_mod else None
    got = torch.autograd.grad(tandem.flex_attention(q, k, v, score_mod=score_mod,
                                                    block_mask=bm), (q, k, v), dout)
    want = torch.autograd.grad(materialized(q, k, v, score_mod, mask_mod), (q, k, v), dout)
    for g, w in zip(got, want):
        close(g, w, TOL64)


def test_alibi_slopes_and_a_softcap_get_their_gradients():
    q, k, v = qkv(grad=True)
    slopes = SLOPES.clone().requires_grad_()
    cap = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)

    def mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap) + slopes[h] * (kv_idx - q_idx)

    dout = torch.randn(B, H, SQ, D, dtype=torch.float64)
    args = (q, k, v, slopes, cap)
    got = torch.autograd.grad(tandem.flex_attention(q, k, v, score_mod=mod), args, dout)
    want = torch.autograd.grad(materialized(q, k, v, mod), args, dout)
    for g, w in zip(got, want):
        close(g, w, TOL64)


def test_only_captured_tensors_that_require_grad_get_one(monkeypatch):
    # two captured tensors, one wanting its gradient: the kernels are asked
    # for that one alone (a gradient nobody wants costs the native path)
    q, k, v = qkv(grad=True)
    slopes, bias = SLOPES.clone(), torch.randn(SK, dtype=torch.float64, requires_grad=True)

    def mod(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx) + bias[kv_idx]

    asked = []
    backward = flex_module._flex_backward_op

    def spy(*args):
        asked.append(list(args[-1]))
        return backward(*args)
    monkeypatch.setattr(flex_module, "_flex_backward_op", spy)
    dout = torch.randn(B, H, SQ, D, dtype=torch.float64)
    got = torch.autograd.grad(tandem.flex_attention(q, k, v, score_mod=mod), (q, bias), dout)
    assert asked == [[True, True, True, False, True]] and slopes.grad is None
    close(got[1], torch.autograd.grad(materialized(q, k, v, mod), bias, dout)[0], TOL64)


def test_learned_bias_gradient_matches_sdpa_with_the_materialized_bias():
    q, k, v = qkv(grad=True)
    bias = torch.randn(H, SQ, SK, dtype=torch.float64, requires_grad=True)

    def mod(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx, kv_idx]

    dout = torch.randn(B, H, SQ, D, dtype=torch.float64)
    got = torch.autograd.grad(tandem.flex_attention(q, k, v, score_mod=mod), (q, k, v, bias),
                              dout)
    want = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None]),
                               (q, k, v, bias), dout)
    for g, w in zip(got, want):
        close(g, w, TOL64)
    # a float32 bias of a float64 call is read as float64, its gradient given back as float32
    b32 = bias.detach().float().requires_grad_()

    def mod32(score, b, h, q_idx, kv_idx):
        return score + b32[h, q_idx, kv_idx]

    (g32,) = torch.autograd.grad(tandem.flex_attention(q, k, v, score_mod=mod32), (b32,), dout)
    assert g32.dtype == torch.float32


def test_gradcheck_through_a_clamped_relative_bias():
    q, k, v = (x[:1, :2, :5, :3].detach().clone().requires_grad_() for x in qkv())
    rel = torch.randn(9, dtype=torch.float64, requires_grad=True)

    def mod(score, b, h, q_idx, kv_idx):
        return score + rel[torch.clamp(q_idx - kv_idx, -4, 4) + 4]

    assert torch.autograd.gradcheck(lambda *a: tandem.flex_attention(*a[:3], score_mod=mod),
                                    (q, k, v, rel))


# ---------------------------------------------------------------- tracing errors


def test_tracing_errors_name_the_operation_and_the_callable():
    q, k, v = qkv()

    def branchy(score, b, h, q_idx, kv_idx):
        return score if q_idx > kv_idx else -score

    def sine(score, b, h, q_idx, kv_idx):
        return torch.sin(score)

    table = torch.zeros(H, SK, dtype=torch.float64)

    def sliced(score, b, h, q_idx, kv_idx):
        return score + table[h, :]

    def float_index(score, b, h, q_idx, kv_idx):
        return score + SLOPES[score]

    for fn, what in ((branchy, "`if`"), (sine, "torch.sin"), (sliced, "slice"),
                     (float_index, "load")):
        with pytest.raises(tandem.Error) as e:
            tandem.flex_attention(q, k, v, score_mod=fn)
        assert e.value.parameter == "score_mod", fn
        assert fn.__name__ in str(e.value) and what in str(e.value), str(e.value)

    def chained(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx < kv_idx + 4

    def difference(b, h, q_idx, kv_idx):
        return q_idx - kv_idx

    for fn, what in ((chained, "chained comparison"), (difference, "boolean")):
        with pytest.raises(tandem.Error) as e:
            tandem.create_block_mask(fn, None, None, SQ, SK, BLOCK_SIZE=8)
        assert e.value.parameter == "mask_mod", fn
        assert fn.__name__ in str(e.value) and what in str(e.value), str(e.value)


def test_an_index_that_can_leave_its_tensor_is_refused_with_its_range():
    q, k, v = qkv()
    small = torch.zeros(H, SQ, SK - 1, dtype=torch.float64)

    def mod(score, b, h, q_idx, kv_idx):
        return score + small[h, q_idx, kv_idx]

    with pytest.raises(tandem.Error) as e:
        tandem.flex_attention(q, k, v, score_mod=mod)
    assert e.value.parameter == "score_mod" and "reads outside small" in str(e.value)
    assert "[0, 39]" in str(e.value), str(e.value)


# ------------------------------------------------------------ block mask checks


def test_validate_block_mask_finds_a_full_block_that_is_not_all_kept():
    bm = tandem.create_block_mask(causal, B, None, SQ, SK, BLOCK_SIZE=8)
    tandem.validate_block_mask(bm, B, H, SQ, SK)  # create_block_mask's own is right
    # move query block 1's diagonal block (partial: kv block 1) to the full list
    assert bm.kv_num_blocks[0, 0, 1] == 1 and bm.kv_indices[0, 0, 1, 0] == 1
    bad = tandem.BlockMask(bm.kv_num_blocks.clone(), bm.kv_indices.clone(),
                           bm.full_kv_num_blocks.clone(), bm.full_kv_indices.clone(),
                           bm.BLOCK_SIZE, causal, bm.seq_lengths)
    bad.kv_num_blocks[:, :, 1] = 0
    n = int(bad.full_kv_num_blocks[0, 0, 1])
    bad.full_kv_indices[:, :, 1, n] = 1
    bad.full_kv_num_blocks[:, :, 1] = n + 1
    with pytest.raises(tandem.Error) as e:
        tandem.validate_block_mask(bad, B, H, SQ, SK)
    assert e.value.parameter == "block_mask"
    assert "q block 1, kv block 1" in str(e.value) and "marked full" in str(e.value)
    # a torch BlockMask with the same fault
    tb = torch_block_mask(causal)
    tb.kv_num_blocks[:, :, 1] = 0
    m = int(tb.full_kv_num_blocks[0, 0, 1])
    tb.full_kv_indices[:, :, 1, m] = 1
    tb.full_kv_num_blocks[:, :, 1] = m + 1
    with pytest.raises(tandem.Error, match="marked full"):
        tandem.validate_block_mask(tb)


def test_bad_input_raises_and_writes_nothing():
    q, k, v = qkv()
    bm = tandem.create_block_mask(causal, B, None, SQ, SK, BLOCK_SIZE=8)
    spec = {"query": tuple(q.shape), "key": tuple(k.shape), "value": tuple(v.shape)}
    shapes = {"q_block": 8, "kv_block": 8, "kv_num_blocks": tuple(bm.kv_num_blocks.shape),
              "kv_indices": tuple(bm.kv_indices.shape),
              "full_kv_num_blocks": tuple(bm.full_kv_num_blocks.shape),
              "full_kv_indices": tuple(bm.full_kv_indices.shape)}
    plan, views = _ext.flex_call(spec, False, None, None, None, shapes)
    out = torch.full(views["out"], 7.0, dtype=torch.float64)
    lse = torch.full(views["lse"], 7.0, dtype=torch.float64)
    bad = bm.kv_indices.clone()
    bad[0, 0, 2, 0] = 99  # not a kv block of Sk
    inputs = {"query": q, "key": k, "value": v, "score_tensors": [], "mask_tensors": [],
              "kv_num_blocks": bm.kv_num_blocks, "kv_indices": bad,
              "full_kv_num_blocks": bm.full_kv_num_blocks,
              "full_kv_indices": bm.full_kv_indices}
    with pytest.raises(tandem.Error) as e:
        _ext.flex_forward("reference", plan, inputs, out, lse)
    assert e.value.parameter == "block_mask.kv_indices"
    assert (out == 7).all() and (lse == 7).all()
    dq, dk, dv = (torch.full_like(x, 7.0) for x in (q, k, v))
    with pytest.raises(tandem.Error) as e:
        _ext.flex_backward("reference", plan, inputs, torch.zeros_like(out), dq, dk, dv, [])
    assert e.value.parameter == "block_mask.kv_indices"
    assert all((x == 7).all() for x in (dq, dk, dv))
    # a wrong dtype, shape or head count, by name
    for args, kwargs, parameter in (
            ((q, k.float(), v), {}, "key.dtype"),
            ((q, k[:, :, :, :4], v), {}, "key.shape"),
            ((q[0], k, v), {}, "query.shape"),
            ((q, k, v), {"scale": -1.0}, "scale")):
        with pytest.raises(tandem.Error) as e:
            tandem.flex_attention(*args, **kwargs)
        assert e.value.parameter == parameter, (parameter, str(e.value))


@pytest.mark.skipif(not _ext.has_optimized(), reason="built without the optimized backend")
def test_the_optimized_backend_runs_flex_within_float32_sums():
    q, k, v = qkv(torch.float32)
    want = tandem.flex_attention(q, k, v, score_mod=softcap, backend="reference")
    got = tandem.flex_attention(q, k, v, score_mod=softcap, backend="optimized")
    close(got, want, 4 * (D + SK) * U32)  # float32 sums (n = D + Sk terms), as torch's float32


# ------------------------------------------------------------- torch operators


def test_the_operator_passes_opcheck_and_compiles():
    q, k, v = (x[:1, :2, :8, :4].detach().clone().requires_grad_() for x in qkv())
    bias = torch.randn(2, 8, 8, dtype=torch.float64, requires_grad=True)

    def mod(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx, kv_idx]

    bm = tandem.create_block_mask(causal, None, None, 8, 8, BLOCK_SIZE=4)
    args = tandem.flex._op_args(q, k, v, mod, bm, None, False, "reference")
    torch.library.opcheck(torch.ops.tandem.flex_attention.default, args)
    want = tandem.flex_attention(q, k, v, score_mod=mod, block_mask=bm)
    op = torch.compile(lambda *a: torch.ops.tandem.flex_attention(*a)[0], fullgraph=True)
    assert torch.equal(op(*args), want)
    # the whole function compiles too, the tracing of the mods left to Python
    got = torch.compile(tandem.flex_attention)(q, k, v, score_mod=mod, block_mask=bm)
    assert torch.equal(got, want)
    (d_bias,) = torch.autograd.grad(got.sum(), (bias,))
    (d_want,) = torch.autograd.grad(want.sum(), (bias,))
    assert torch.equal(d_bias, d_want)


needs_opaque = pytest.mark.skipif(flex_module._register_opaque is None,
                                  reason="torch without opaque constants (torch < 2.15)")


@needs_opaque
def test_flex_attention_compiles_with_fullgraph_and_trains():
    q, k, v = (x[:1, :2, :8, :4].detach().clone().requires_grad_() for x in qkv())
    bias = torch.randn(2, 8, 8, dtype=torch.float64, requires_grad=True)
    slopes = torch.tensor([0.5, -0.25], dtype=torch.float32)  # another dtype: cast in the call

    def mod(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx, kv_idx] + slopes[h] * (kv_idx - q_idx)

    bm = tandem.create_block_mask(causal, None, None, 8, 8, BLOCK_SIZE=4)
    args = flex_module._compiled_args(q, k, v, mod, bm, None, False, "reference")
    torch.library.opcheck(torch.ops.tandem.flex_attention_mods.default, args)
    flex = torch.compile(tandem.flex_attention, fullgraph=True)
    for backend in ("reference", "optimized"):
        want = tandem.flex_attention(q, k, v, score_mod=mod, block_mask=bm, backend=backend)
        got = flex(q, k, v, score_mod=mod, block_mask=bm, backend=backend)
        assert torch.equal(got, want)
        wrt = (q, k, v, bias)
        dout = torch.randn_like(want)
        assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(got, wrt, dout),
                                                     torch.autograd.grad(want, wrt, dout)))
    # torch's own BlockMask compiles as well
    torch_bm = flex_api.create_block_mask(causal, None, None, 8, 8, device="cpu", BLOCK_SIZE=4)
    assert torch.equal(flex(q, k, v, block_mask=torch_bm),
                       tandem.flex_attention(q, k, v, block_mask=torch_bm))
    # another mod is another graph (the mods are the graph's constants), not the first's
    got = flex(q, k, v, score_mod=softcap, block_mask=bm)
    assert torch.equal(got, tandem.flex_attention(q, k, v, score_mod=softcap, block_mask=bm))
    # a mod the language cannot express fails as in eager code, when the operator runs
    with pytest.raises(tandem.Error, match="torch.sin"):
        flex(q, k, v, score_mod=lambda s, b, h, i, j: torch.sin(s))
