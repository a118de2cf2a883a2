# SPDX-License-Identifier: Apache-2.0
"""tandem.testing can fail: correct user kernels pass, each deliberately
broken one fails with a shrunk configuration and a replayable test."""

import functools
import re

import numpy as np
import pytest

import tandem
from tandem import testing as T
from kernels import (TORCH_2_5, lowp_attention_backward, numpy_attention, numpy_rope,
                     sdpa_attention, sdpa_attention_backward, torch_swiglu)

BUDGET = dict(seed=12, time_budget=20.0)
# torch < 2.5's SDPA gives NaN, not 0, for a query that sees no key
# (pytorch/pytorch#110213), which the policy rejects, as it should.
SDPA_ZERO_ROWS = pytest.mark.skipif(
    not TORCH_2_5, reason="torch < 2.5's SDPA gives NaN for a query that sees no key")


def gqa_bug_attention(q, k, v, **kw):
    return numpy_attention(q, k, v, bug="gqa", **kw)


def causal_offset_bug_attention(q, k, v, **kw):
    return numpy_attention(q, k, v, bug="causal_offset", **kw)


def no_max_bug_attention(q, k, v, **kw):
    return numpy_attention(q, k, v, bug="no_max", **kw)


def gqa_sum_bug_backward(q, k, v, dout, **kw):
    return sdpa_attention_backward(q, k, v, dout, bug="gqa_sum", **kw)


def rope_pairs_bug(x, cos, sin, **kw):
    return numpy_rope(x, cos, sin, bug="pairs", **kw)


def failure(check, fn, **kw):
    with pytest.raises(T.CheckFailure) as info:
        check(fn, **BUDGET, **kw)
    report = str(info.value)
    assert "Minimal configuration" in report and f"seed={info.value.config.seed}" in report
    assert f"def test_{fn.__name__}_" in report and repr(info.value.config) in report
    return info.value.config, report


# -- correct kernels pass ----------------------------------------------------

@SDPA_ZERO_ROWS
def test_torch_sdpa_through_an_adapter_passes():
    T.check_attention(sdpa_attention, array="torch", softcap=False, **BUDGET)


def test_numpy_float32_attention_passes():
    T.check_attention(numpy_attention, **BUDGET)


def test_tandem_itself_passes_forward_and_backward():
    T.check_attention(tandem.attention, max_examples=60, **BUDGET)
    T.check_attention_backward(tandem.attention_backward, max_examples=60, **BUDGET)


@SDPA_ZERO_ROWS
def test_torch_autograd_backward_through_an_adapter_passes():
    T.check_attention_backward(sdpa_attention_backward, array="torch", softcap=False,
                               max_examples=100, **BUDGET)


def test_numpy_rope_and_torch_swiglu_pass():
    T.check_rope(numpy_rope, **BUDGET)
    T.check_swiglu(torch_swiglu, array="torch", **BUDGET)


# -- broken kernels fail, shrunk to what the bug needs ------------------------

def test_gqa_head_modulo_is_caught_at_four_heads_over_two():
    config, _ = failure(T.check_attention, gqa_bug_attention)
    # h % Hkv and h // (H/Hkv) agree unless Hkv >= 2 and H/Hkv >= 2
    assert (config.H, config.Hkv) == (4, 2)
    assert (config.B, config.Sq, config.Sk, config.D, config.Dv) == (1, 1, 1, 1, 1)


def test_causal_without_the_offset_is_caught_with_fewer_queries_than_keys():
    config, _ = failure(T.check_attention, causal_offset_bug_attention)
    assert config.mask in ("causal", "sliding_window") and config.Sq < config.Sk
    assert (config.Sq, config.Sk, config.H, config.D) == (1, 2, 1, 1)


def test_softmax_without_max_subtraction_is_caught_on_large_scores():
    config, report = failure(T.check_attention, no_max_bug_attention)
    assert config.amplitude == 32.0 and (config.Sq, config.Sk, config.D) == (1, 1, 1)
    assert "non-finite" in report


def test_rope_pairs_swapped_is_caught_with_four_rotated_dims():
    config, _ = failure(T.check_rope, rope_pairs_bug)
    # (i, i+1) and (2i, 2i+1) coincide for n_rot = 2
    assert config.style == "neox" and config.n_rot == 4 and config.B == 1 and config.S == 1


@SDPA_ZERO_ROWS
def test_gqa_gradients_not_summed_over_the_group_are_caught():
    config, report = failure(T.check_attention_backward, gqa_sum_bug_backward, array="torch",
                             softcap=False)
    assert (config.H, config.Hkv, config.Sq, config.Sk) == (2, 1, 1, 1)
    assert report.splitlines()[5].lstrip().startswith(("dk:", "dv:"))  # dk = 0 when Sk = 1


def test_a_nondeterministic_kernel_fails():
    calls = []

    def flaky_attention(q, k, v, **kw):
        calls.append(1)
        out = tandem.attention(q, k, v, **kw)
        return out + np.float32(1e-7) * (len(calls) % 2)

    _, report = failure(T.check_attention, flaky_attention)
    assert "differ" in report


def test_a_kernel_that_raises_fails_with_the_exception():
    def raising_attention(q, k, v, **kw):
        if kw.get("mask") == "causal":
            raise RuntimeError("causal not implemented")
        return tandem.attention(q, k, v, **kw)

    config, report = failure(T.check_attention, raising_attention)
    assert config.mask == "causal" and "causal not implemented" in report


def test_the_pasted_regression_test_replays_the_failure():
    config, report = failure(T.check_attention, gqa_bug_attention)
    with pytest.raises(T.CheckFailure):
        T.check_attention_config(gqa_bug_attention, config)
    T.check_attention_config(numpy_attention, config)  # and a correct kernel passes it


def test_masked_rows_policy():
    config = T.AttentionConfig(B=2, H=2, Hkv=1, Sq=3, Sk=4, D=4, Dv=4, mask="key_padding",
                               masked_rows=True, seed=5)

    def nan_rows(q, k, v, **kw):  # NaN where no key is visible, as a naive kernel gives
        out = tandem.attention(q, k, v, **kw)
        out[(kw["key_padding"] == 0).all(-1)] = np.nan
        return out

    with pytest.raises(T.CheckFailure, match="non-finite"):
        T.check_attention_config(nan_rows, config)
    T.check_attention_config(nan_rows, config, policy=T.Policy(masked_rows="any"))


def test_strategies_shrink_toward_the_smallest_configuration():
    from hypothesis import find
    smallest = find(T.attention_configs(), lambda c: True)
    assert (smallest.B, smallest.H, smallest.Sq, smallest.Sk, smallest.D) == (1, 1, 1, 1, 1)
    assert (smallest.mask, smallest.layout, smallest.strided) == ("none", "bshd", False)
    gqa = find(T.attention_configs(), lambda c: c.H != c.Hkv and c.mask == "bias")
    assert (gqa.H, gqa.Hkv, gqa.Sq, gqa.Sk) == (2, 1, 1, 1)


def test_the_docs_page_shows_this_shrunk_failure_verbatim():
    import os
    from kernels import my_attention
    with pytest.raises(T.CheckFailure) as info:
        T.check_attention(my_attention, **BUDGET)
    page = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "pages", "10_python.md")
    with open(page) as f:
        shown = f.read().split("```text\n", 1)[1].split("```", 1)[0]
    assert shown == str(info.value)


# -- sinks and ALiBi, drawn when asked for ------------------------------------

FEATURES = dict(sinks=True, alibi=T.ALIBI)


def sink_numerator_bug_attention(q, k, v, **kw):
    return numpy_attention(q, k, v, bug="sink_numerator", **kw)


def test_numpy_attention_with_sinks_and_alibi_passes_and_the_reference_backward_too():
    T.check_attention(numpy_attention, **FEATURES, **BUDGET)
    T.check_attention_backward(functools.partial(tandem.attention_backward, backend="reference"),
                               max_examples=60, **FEATURES, **BUDGET)


def test_a_sink_added_to_the_numerator_is_caught_with_one_key():
    config, report = failure(T.check_attention, sink_numerator_bug_attention, **FEATURES)
    assert config.sinks and (config.B, config.H, config.Sq, config.Sk) == (1, 1, 1, 1)
    assert "sinks=True" in report


def test_drawn_features_reach_the_kernel():
    seen = set()

    def spy(q, k, v, **kw):
        seen.update(n for n in ("sinks", "alibi_slopes") if kw.get(n) is not None)
        if kw.get("alibi_slopes") is not None:
            seen.add(kw["alibi_slopes"].shape == (q.shape[0], q.shape[2 if kw["layout"] ==
                                                                          "bshd" else 1]))
        return numpy_attention(q, k, v, **kw)

    T.check_attention(spy, max_examples=80, **FEATURES, **BUDGET)
    assert {"sinks", "alibi_slopes", True, False} <= seen


# -- bfloat16 and float16 backwards (SPEC §10.5's bound from C++) -----------

# The NumPy backward knows the masks without an array; sinks and softcap drawn.
LOWP_BACKWARD = dict(masks=("none", "causal", "sliding_window"), sinks=True,
                     dtypes=("bfloat16", "float16"), max_examples=60)


def lowp_backward(profile="pytorch", bug=None):
    def backward(q, k, v, dout, **kw):
        return lowp_attention_backward(q, k, v, dout, profile=profile, bug=bug, **kw)

    backward.__name__ = f"lowp_backward_{profile}" + (f"_{bug}" if bug else "")
    return backward


@pytest.mark.parametrize("profile", ("pytorch", "exact"))
def test_a_correct_low_precision_backward_passes(profile):
    T.check_attention_backward(lowp_backward(profile), policy=T.Policy(rounding=profile),
                               **LOWP_BACKWARD, **BUDGET)


@pytest.mark.parametrize("backend", ("optimized", "reference"))
@pytest.mark.parametrize("profile", ("pytorch", "exact"))
def test_tandem_s_own_low_precision_backward_passes(backend, profile):
    if not tandem.offers("attention_backward", "bfloat16", backend):
        pytest.skip(f"{backend} offers no bfloat16 backward")
    fn = functools.partial(tandem.attention_backward, rounding=profile, backend=backend)
    T.check_attention_backward(fn, policy=T.Policy(rounding=profile), sinks=True,
                               alibi=T.ALIBI, dtypes=("bfloat16", "float16"), max_examples=60,
                               **BUDGET)


def test_a_backward_that_drops_the_rounding_of_p_is_caught():
    config, report = failure(T.check_attention_backward, lowp_backward(bug="p_unrounded"),
                             **LOWP_BACKWARD)
    assert config.dtype in ("bfloat16", "float16") and "dv (" in report
    assert "SPEC §10.5's bound" in report and "+ flip" in report


def test_a_backward_that_rounds_ds_before_the_softcap_factor_is_caught():
    config, report = failure(T.check_attention_backward, lowp_backward(bug="ds"),
                             **LOWP_BACKWARD)
    assert config.softcap > 0, config  # without a softcap dx = ds: the contract's rounding
    assert re.search(r"\b(dq|dk) \((bfloat16|float16), rounding='pytorch'\): error", report)


def test_a_pytorch_profile_backward_fails_the_exact_profile_and_is_explained():
    """The profile matters: the pytorch kernel held to the exact profile's
    reference fails, and explain_rounding_backward names pytorch."""
    config, report = failure(T.check_attention_backward, lowp_backward("pytorch"),
                             policy=T.Policy(rounding="exact"), **LOWP_BACKWARD)
    assert "rounding='exact'" in report and "nearest rounding profile: pytorch" in report
    best, errors = T.explain_rounding_backward(lowp_backward("pytorch"), config)
    assert best == "pytorch" and errors["pytorch"] < errors["exact"], errors


def test_a_float32_gradient_for_bfloat16_inputs_is_caught():
    def float32_grads(q, k, v, dout, **kw):
        return tuple(g.astype(np.float32) for g in lowp_backward()(q, k, v, dout, **kw))

    _, report = failure(T.check_attention_backward, float32_grads, **LOWP_BACKWARD)
    assert "expected bfloat16" in report or "expected float16" in report
