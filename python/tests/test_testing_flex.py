# SPDX-License-Identifier: Apache-2.0
"""tandem.testing.check_flex_attention can fail: torch's eager
flex_attention and tandem.flex_attention pass as they are; each
deliberately broken FlexAttention fails with a shrunk case whose message
holds the mods' source and a pytest test that replays the failure."""

import dataclasses
import math
import textwrap

import pytest
import torch

import tandem
from tandem import testing as T

flex_api = pytest.importorskip("torch.nn.attention.flex_attention")

BUDGET = dict(seed=19, time_budget=10.0)


def flex_without_score_mod(q, k, v, score_mod=None, block_mask=None, scale=None,
                           enable_gqa=False):
    return tandem.flex_attention(q, k, v, block_mask=block_mask, scale=scale,
                                 enable_gqa=enable_gqa)


def flex_scale_after_mod(q, k, v, score_mod=None, block_mask=None, scale=None,
                         enable_gqa=False):
    """t = scale * score_mod(<q, k>) instead of score_mod(scale <q, k>)."""
    sc = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    mod = None if score_mod is None else (lambda s, b, h, i, j: score_mod(s, b, h, i, j) * sc)
    return tandem.flex_attention(q, k, v, score_mod=mod, block_mask=block_mask,
                                 scale=1.0 if mod else scale, enable_gqa=enable_gqa)


def flex_gqa_tiled(q, k, v, score_mod=None, block_mask=None, scale=None, enable_gqa=False):
    """Query head h reads kv head h % Hkv (k.repeat) instead of h // (H/Hkv)."""
    g = q.shape[1] // k.shape[1]
    return tandem.flex_attention(q, k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1),
                                 score_mod=score_mod, block_mask=block_mask, scale=scale)


def flex_partial_as_full(q, k, v, score_mod=None, block_mask=None, scale=None,
                         enable_gqa=False):
    """Ignores mask_mod: every listed block is taken as full."""
    if block_mask is not None:
        block_mask = dataclasses.replace(block_mask, mask_mod=None)
    return tandem.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                 scale=scale, enable_gqa=enable_gqa)


def flex_full_dropped(q, k, v, score_mod=None, block_mask=None, scale=None, enable_gqa=False):
    """Reads the partial blocks only: the full blocks are hidden."""
    if block_mask is not None:
        block_mask = dataclasses.replace(
            block_mask, full_kv_num_blocks=torch.zeros_like(block_mask.full_kv_num_blocks))
    return tandem.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                 scale=scale, enable_gqa=enable_gqa)


def failure(fn, **kw):
    """The FlexFailure of check_flex_attention(fn); checks that its message
    holds a pasted test that, run, fails the same way."""
    with pytest.raises(T.FlexFailure) as info:
        T.check_flex_attention(fn, max_examples=200, **BUDGET, **kw)
    case, report = info.value.case, str(info.value)
    assert "Minimal case" in report and f"seed={case.seed}" in report
    for role in ("score_mod", "mask_mod"):
        if getattr(case, role) is not None:
            assert textwrap.indent(case.source(role), "    ") in report
    pasted = textwrap.dedent(report.split("paste into a test file:\n")[1])
    assert f"def test_{fn.__name__}_flex_attention_regression():" in pasted
    scope = {}
    exec(pasted, scope)  # noqa: S102 - the test the message gives
    with pytest.raises(T.FlexFailure):
        scope[f"test_{fn.__name__}_flex_attention_regression"]()
    return case, report


# -- correct implementations pass ---------------------------------------------

def test_torch_eager_flex_attention_passes():
    T.check_flex_attention(flex_api.flex_attention, max_examples=25, **BUDGET)


def test_tandem_flex_attention_passes_forward_and_backward():
    T.check_flex_attention(tandem.flex_attention, max_examples=40, **BUDGET)
    T.check_flex_attention(tandem.flex_attention, check_grads=True, max_examples=25, **BUDGET)


def materialized_flex_attention(q, k, v, score_mod=None, block_mask=None, scale=None,
                                enable_gqa=False):
    """SPEC §13.4 with torch ops on whole tensors (differentiable): the
    softmax over visible keys of score_mod(scale q kᵀ), times v; the block
    mask is create_block_mask's, so a key is visible where its mask_mod
    holds."""
    B, H, Sq, D = q.shape
    g = H // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (1 / math.sqrt(D) if scale is None else scale) * q @ k.transpose(-1, -2)
    b, h, i, j = (torch.arange(n).view(*[n if a == d else 1 for a in range(4)])
                  for d, n in enumerate((B, H, Sq, k.shape[2])))
    t = torch.broadcast_to(score_mod(s, b, h, i, j), s.shape) if score_mod else s
    if block_mask is not None:
        t = torch.where(block_mask.mask_mod(b, h, i, j), t, -math.inf)
    p = torch.softmax(t, -1).nan_to_num()  # a row that sees no key: 0
    return p @ v


def test_a_materialized_implementation_passes_forward_and_backward():
    T.check_flex_attention(materialized_flex_attention, check_grads=True, max_examples=60,
                           **BUDGET)


# -- broken implementations fail, shrunk to what the bug needs -----------------

def test_a_dropped_score_mod_is_caught_with_one_key_of_two():
    case, report = failure(flex_without_score_mod)
    assert case.score_mod is not None and "def score_mod" in report
    # one key's score change is a softmax shift: it needs two keys to show
    assert (case.B, case.H, case.Sq, case.Sk, case.block) == (1, 1, 1, 2, None)


def test_the_scale_after_the_mod_is_caught():
    case, _ = failure(flex_scale_after_mod)
    assert case.score_mod is not None and case.Sk == 2 and case.Sq == 1


def test_a_tiled_gqa_head_mapping_is_caught_at_four_heads_over_two():
    case, _ = failure(flex_gqa_tiled)
    assert (case.H, case.Hkv) == (4, 2) and (case.B, case.Sq, case.D, case.Dv) == (1, 1, 1, 1)


def test_a_partial_block_taken_as_full_is_caught():
    case, _ = failure(flex_partial_as_full)
    # a partial block needs two elements, one kept and one hidden
    assert case.block is not None and case.mask_mod is not None
    assert (case.B, case.H, case.D, case.Dv) == (1, 1, 1, 1) and case.Sq * case.Sk == 2


def test_dropped_full_blocks_are_caught():
    case, _ = failure(flex_full_dropped)
    assert case.block is not None and case.mask_mod is not None


def flex_gradients_scaled(q, k, v, **kw):
    """The right out, every gradient 1.5 times too large."""
    out = tandem.flex_attention(q, k, v, **kw)
    return out + 0.5 * (out - out.detach())


def test_a_wrong_backward_is_caught_with_check_grads():
    T.check_flex_attention(flex_gradients_scaled, max_examples=10, **BUDGET)  # out is right
    case, report = failure(flex_gradients_scaled, check_grads=True)
    assert any(line.startswith(("  dq:", "  dk:", "  dv:")) for line in report.splitlines())
    assert (case.B, case.H, case.Sq) == (1, 1, 1)


def flex_table_detached(q, k, v, score_mod=None, **kw):
    """The right out, dq, dk and dv; no gradient reaches the captured
    table (the mod's global `table` swapped for its detached copy)."""
    if score_mod is not None and "table" in score_mod.__globals__:
        score_mod.__globals__["table"] = score_mod.__globals__["table"].detach()
    return tandem.flex_attention(q, k, v, score_mod=score_mod, **kw)


#: score + table[clamp(kv_idx, 0, 7)]: value 4 of the integers is kv_idx,
#: then the score (value 0) plus that entry (value 5)
TABLE_BIAS = (("table", (3, 0, 0), 0), ("add", (0, 1, 0), 0))


def test_a_dropped_captured_tensor_gradient_is_caught_with_check_grads():
    case = T.FlexCase(Sq=2, Sk=3, D=2, Dv=2, score_mod=TABLE_BIAS, seed=5)
    assert "table[torch.clamp(kv_idx" in case.source("score_mod")
    T.check_flex_attention_case(tandem.flex_attention, case, check_grads=True)
    T.check_flex_attention_case(flex_table_detached, case)  # out is right
    with pytest.raises(T.FlexFailure, match="dtable"):
        T.check_flex_attention_case(flex_table_detached, case, check_grads=True)
    # and the random search finds it, shrunk to a mod that reads the table
    case, report = failure(flex_table_detached, check_grads=True)
    assert "table[" in case.source("score_mod")
    assert any(line.startswith("  dtable:") for line in report.splitlines())


# -- the strategies ------------------------------------------------------------

def test_flex_mods_are_callables_with_their_source():
    from hypothesis import given, settings
    table = torch.randn(8, dtype=torch.float64)
    ids = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    seen = []

    @settings(max_examples=15, deadline=None, database=None)
    @given(T.flex_mods("score_mod", table, ids), T.flex_mods("mask_mod", table, ids))
    def run(score_mod, mask_mod):
        assert score_mod.source.startswith("def score_mod(score, b, h, q_idx, kv_idx):")
        assert mask_mod.source.startswith("def mask_mod(b, h, q_idx, kv_idx):")
        s = torch.randn(2, 3, 5, 7, dtype=torch.float64)
        b, h, i, j = (torch.arange(n).view(*[n if a == d else 1 for a in range(4)])
                      for d, n in enumerate((2, 3, 5, 7)))
        assert score_mod(s, b, h, i, j).dtype == torch.float64
        assert mask_mod(b, h, i, j).dtype == torch.bool
        seen.append(score_mod.source)
        # torch takes them as they are
        bm = flex_api.create_block_mask(mask_mod, 2, 3, 5, 7, device="cpu", BLOCK_SIZE=2)
        out = flex_api.flex_attention(*(torch.randn(2, 3, n, 4, dtype=torch.float64)
                                         for n in (5, 7, 7)), score_mod=score_mod,
                                      block_mask=bm)
        assert out.shape == (2, 3, 5, 4)

    run()
    assert len(set(seen)) > 3


def test_a_corrupted_block_mask_is_reported_by_validate_block_mask():
    case = T.FlexCase(Sq=1, Sk=2, block=(1, 2), mask_mod=())  # causal: one partial block
    t = case.tensors()
    _, mask_mod = case.mods(t["table"], t["ids"])
    bm = tandem.create_block_mask(mask_mod, None, None, 1, 2, BLOCK_SIZE=(1, 2))
    tandem.validate_block_mask(bm)
    wrong = dataclasses.replace(bm, kv_num_blocks=torch.zeros_like(bm.kv_num_blocks),
                                full_kv_num_blocks=bm.kv_num_blocks,
                                full_kv_indices=bm.kv_indices)
    with pytest.raises(tandem.Error, match="marked full"):
        tandem.validate_block_mask(wrong)


def flex_off_by_1e_10(q, k, v, **kw):
    """Right but for 1e-10 added to every output: far past float64's rounding."""
    return tandem.flex_attention(q, k, v, **kw) + 1e-10


def test_an_error_of_1e_10_is_past_the_tolerance():
    case, report = failure(flex_off_by_1e_10)
    assert (case.B, case.H, case.Sq, case.Sk, case.D, case.Dv) == (1, 1, 1, 1, 1, 1)
    assert "max abs error 1.000e-10" in report


def test_validate_block_mask_reports_every_corrupted_block_mask():
    from hypothesis import assume, given, settings
    from hypothesis import strategies as st
    seen = []

    @settings(max_examples=40, deadline=None, database=None)
    @given(T.flex_cases(score_mods=False).filter(lambda c: c.block is not None), st.data())
    def run(case, data):
        t = case.tensors()
        _, mask_mod = case.mods(t["table"], t["ids"])
        bm = T.block_mask_of(case, mask_mod, "tandem")
        tandem.validate_block_mask(bm, case.B, case.H)
        got = data.draw(T.corrupted_block_masks(bm))
        assume(got is not None)
        wrong, what = got
        with pytest.raises(tandem.Error, match="marked full" if "full" in what else "hidden"):
            tandem.validate_block_mask(wrong, case.B, case.H)
        seen.append(what)

    run()
    assert any("full" in w for w in seen) and any("dropped" in w for w in seen)
