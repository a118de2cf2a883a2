# SPDX-License-Identifier: Apache-2.0
"""Batch-invariant inference (SPEC §12) from Python: tandem.set_invariant and
tandem.invariant() switch the optimized backend's Geometry::invariant;
tandem.testing.check_invariance passes an invariant kernel (tandem's
reference, a NumPy kernel written for a fixed order, the optimized backend
with the switch on) and catches each broken one at the row that differs."""

import functools

import numpy as np
import pytest

import tandem
from tandem import testing as T
from kernels import ordered_attention, ordered_paged_attention

# Short sequences (the checks call the kernels a few thousand times)
SMALL = T.InvarianceConfig(lengths=(1, 4, 9, 17, 40), chunks=(3, 8), block_sizes=(1, 4, 16),
                           sinks=True)
reference = functools.partial(tandem.attention, backend="reference")
reference_paged = functools.partial(tandem.attention_with_kvcache, backend="reference")


def reference_lse(q, k, v, **kw):
    return tandem.attention_forward_lse(q, k, v, backend="reference", **kw)


# -- the switch ------------------------------------------------------------------

def test_the_switch_and_its_context_manager_restore_the_state():
    assert not tandem.is_invariant()
    with tandem.invariant():
        assert tandem.is_invariant()
        with tandem.invariant(False):
            assert not tandem.is_invariant()
        assert tandem.is_invariant()
    assert not tandem.is_invariant()
    with pytest.raises(RuntimeError, match="inside"):
        with tandem.invariant():
            raise RuntimeError("inside")
    assert not tandem.is_invariant()
    tandem.set_invariant(True)
    try:
        tandem.set_threads(1)  # a rebuild for the thread count keeps the switch
        assert tandem.is_invariant() and tandem.threads() == 1
    finally:
        tandem.set_threads(0)
        tandem.set_invariant(False)
    assert not tandem.is_invariant() and tandem.threads() == 0


def test_results_under_the_switch_agree_with_the_reference():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 70, h, 16)).astype(np.float32) for h in (4, 2, 2))
    with tandem.invariant():
        out = tandem.attention(q, k, v, mask="causal")
    np.testing.assert_allclose(out, reference(q, k, v, mask="causal"), atol=2e-6, rtol=1e-5)


def test_a_cache_that_dropped_its_first_keys_keeps_its_bits_through_key_origin():
    # a sliding window of w keys before each query: a decode step over the last w + 1 keys,
    # key_origin the first one's position, against the whole prefill's row (SPEC §12.1)
    rng = np.random.default_rng(3)
    S, w = 1200, 200
    q = rng.standard_normal((1, S, 4, 32)).astype(np.float32)
    k, v = (rng.standard_normal((1, S, 2, 32)).astype(np.float32) for _ in range(2))
    with tandem.invariant():
        whole = tandem.attention(q, k, v, window=w)
        for t in (201, 300, 1023, 1024, 1199):
            first = t - w
            step = tandem.attention(q[:, t:t + 1], k[:, first:t + 1], v[:, first:t + 1],
                                    window=w, key_origin=np.array([first]))
            assert np.array_equal(step[0, 0], whole[0, t]), t
        for bad, parameter in (([-1], "key_origin"), ([0, 0], "key_origin.shape")):
            with pytest.raises(tandem.Error) as e:
                tandem.attention(q[:, :1], k[:, :5], v[:, :5], key_origin=np.array(bad))
            assert e.value.parameter == parameter, str(e.value)


# -- invariant kernels pass ------------------------------------------------------------

@pytest.mark.parametrize("array", ["numpy", "torch"])
def test_the_reference_backend_passes_every_check(array):
    rows = T.check_invariance(reference, paged_fn=reference_paged, config=SMALL, array=array)
    # every check but "origin", which needs a sliding window (below)
    assert set(rows) == set(T.INVARIANCE_CHECKS) - {"origin"} and min(rows.values()) > 0, rows


def test_the_reference_passes_with_lse_a_sliding_window_and_long_sequences():
    config = T.InvarianceConfig(lengths=(3, 70, 1030), mask="sliding_window", window=80,
                                chunks=(100,), block_sizes=(64,), H=2, Hkv=1, D=8, Dv=8)
    rows = T.check_invariance(reference_lse, config=config,
                              checks=("batch", "packed", "chunked_prefill"))
    assert min(rows.values()) > 0, rows


WINDOW = T.InvarianceConfig(lengths=(70, 200), mask="sliding_window", window=61, H=2, Hkv=1,
                            D=8, Dv=8)


def test_a_cache_from_its_key_origin_passes_the_origin_check_and_one_without_it_fails():
    rows = T.check_invariance(reference, config=WINDOW, checks=("origin",))
    assert rows["origin"] == (70 - 62) + (200 - 62), rows
    with tandem.invariant():
        T.check_invariance(tandem.attention, config=WINDOW, checks=("origin", "decode"))

        def forgets_the_origin(q, k, v, key_origin=None, **kw):
            return tandem.attention(q, k, v, **kw)

        with pytest.raises(T.InvarianceFailure) as e:
            T.check_invariance(forgets_the_origin, config=WINDOW, checks=("origin",))
    assert e.value.check == "origin" and "key_origin" in e.value.detail, str(e.value)


def test_a_numpy_kernel_written_for_a_fixed_order_passes():
    rows = T.check_invariance(ordered_attention, paged_fn=ordered_paged_attention, config=SMALL)
    assert min(rows.values()) > 0, rows


def test_the_optimized_backend_passes_under_the_switch():
    config = T.InvarianceConfig(sinks=True)  # lengths across 64-key blocks, 1024-key chunks
    with tandem.invariant():
        rows = T.check_invariance(tandem.attention, paged_fn=tandem.attention_with_kvcache,
                                  config=config)
        T.check_invariance(tandem.attention_forward_lse, config=config,
                           checks=("batch", "packed", "chunked_prefill"))
        tandem.set_threads(1)
        try:
            T.check_invariance(tandem.attention, config=config, checks=("batch", "packed"))
        finally:
            tandem.set_threads(0)
    assert min(rows.values()) > 0, rows


def test_the_switch_reaches_the_kernels():
    # Without it the default geometry's order is another: sequences packed
    # together are not summed as each alone (the check's default sequences
    # show it), so the pass above is the switch's doing.
    config = T.InvarianceConfig(sinks=True)
    with pytest.raises(T.InvarianceFailure) as info:
        T.check_invariance(tandem.attention, config=config, checks=("packed",))
    assert info.value.check == "packed"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_optimized_backend_passes_in_low_precision(dtype):
    config = T.InvarianceConfig(lengths=(1, 65, 1030), chunks=(64,), block_sizes=(16,),
                                dtype=dtype, sinks=True)
    with tandem.invariant():
        rows = T.check_invariance(tandem.attention, paged_fn=tandem.attention_with_kvcache,
                                  config=config, array="torch")
    assert min(rows.values()) > 0, rows


def test_under_the_switch_the_thread_count_changes_no_bit():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((3, 1100, h, 32)).astype(np.float32) for h in (8, 2, 2))
    with tandem.invariant():
        runs = []
        for n in (1, 2, 0):
            tandem.set_threads(n)
            runs.append(tandem.attention_forward_lse(q[:, -5:], k, v, mask="causal"))
        tandem.set_threads(0)
    for out, lse in runs[1:]:
        assert np.array_equal(out, runs[0][0]) and np.array_equal(lse, runs[0][1])


# -- broken kernels are caught at the row that differs --------------------------------

def caught(bug, **kw):
    fn = functools.partial(ordered_attention, bug=bug)
    paged = functools.partial(ordered_paged_attention, bug=bug)
    with pytest.raises(T.InvarianceFailure) as info:
        T.check_invariance(fn, paged_fn=paged, config=SMALL, **kw)
    e = info.value
    assert f"query {e.query}, head {e.head}" in str(e) and e.check in str(e)
    return fn, e


def test_a_batch_dependent_output_is_caught_at_its_row():
    fn, e = caught("nudge_batch")
    # first the batch of every sequence cut to 1 key: entry 1's row 0, head 2
    assert (e.check, e.sequence, e.query, e.head, e.output) == ("batch", 1, 0, 2, "out")
    q, k, v = SMALL.sequences()[1]
    x = fn(q[None, :1], k[None, :1], v[None, :1], sinks=SMALL.sink_logits(), layout="bshd",
           **SMALL.kwargs())[0, 0, 2]
    moved = np.nextafter(x, np.float32(np.inf))  # an ulp up, in the batch
    assert e.max_diff == float(np.abs(moved.astype(np.float64) - x).max()) > 0


def test_split_keys_sized_by_the_batch_are_caught_at_a_row_that_differs():
    fn, e = caught("split_by_batch")
    assert e.check == "batch" and e.output == "out"
    # the reported row does differ between the batch and the sequence alone
    m = e.query + 1
    members = [s for s, L in enumerate(SMALL.lengths) if L >= m]
    seqs = SMALL.sequences()
    kw = dict(SMALL.kwargs(), layout="bshd", sinks=SMALL.sink_logits())
    q, k, v = (np.stack([seqs[s][i][:m] for s in members]) for i in range(3))
    whole = fn(q[:, m - 1:], k, v, **kw)[members.index(e.sequence), 0, e.head]
    s = e.sequence
    alone = fn(q[members.index(s)][None, m - 1:], k[members.index(s)][None],
               v[members.index(s)][None], **kw)[0, 0, e.head]
    assert not np.array_equal(whole, alone)
    assert e.max_diff == float(np.abs(whole.astype(np.float64) - alone).max())


def test_a_decode_step_summing_in_another_order_is_caught_at_the_first_such_step():
    fn, e = caught("decode_order", checks=("decode",))
    assert e.check == "decode" and e.output == "out"
    kw = dict(SMALL.kwargs(), layout="bshd", sinks=SMALL.sink_logits())
    first = None
    for s, (q, k, v) in enumerate(SMALL.sequences()):
        prefill = fn(q[None], k[None], v[None], **kw)[0]
        for t in range(len(q)):
            step = fn(q[None, t:t + 1], k[None, :t + 1], v[None, :t + 1], **kw)[0, 0]
            heads = np.flatnonzero((step != prefill[t]).any(-1))
            if heads.size:
                first = (s, t, int(heads[0]))
                break
        if first:
            break
    assert first == (e.sequence, e.query, e.head), (first, str(e))
    assert first[1] >= 2  # one key, or two added either way round, agree


def test_an_lse_that_depends_on_the_batch_is_caught_at_its_row():
    def lse_moved_in_a_batch(q, k, v, **kw):  # out right, lse [B, H, Sq] not
        out, lse = reference_lse(q, k, v, **kw)
        if q.shape[0] > 1 and "cu_seqlens_q" not in kw:
            lse[1, 3, -1] = np.nextafter(lse[1, 3, -1], np.float32(np.inf))
        return out, lse

    with pytest.raises(T.InvarianceFailure) as info:
        T.check_invariance(lse_moved_in_a_batch, config=SMALL)
    e = info.value
    assert (e.check, e.sequence, e.query, e.head, e.output) == ("batch", 1, 0, 3, "lse")


def test_a_packed_call_that_differs_is_caught_at_its_row():
    _, e = caught("nudge_packed")
    # the first sequence of the prefills packed together: sequence 2, row 0, head 1
    assert (e.check, e.sequence, e.query, e.head) == ("packed", 2, 0, 1)


def test_a_paged_call_that_differs_is_caught_at_its_row():
    _, e = caught("nudge_paged", checks=("paged",))
    # blocks of one key, decode steps (Sq 1): entry 0 is sequence 0, row 0, head 0
    assert (e.check, e.sequence, e.query, e.head) == ("paged", 0, 0, 0)
    assert "block size 1" in e.detail


def test_a_chunk_that_differs_is_caught_at_its_row():
    _, e = caught("nudge_chunk", checks=("chunked_prefill",))
    # chunks of 3: sequence 1 (4 keys) has the chunks 0:3 (all its keys so
    # far) and 3:4 (one query); sequence 2's chunk 3:6 is the first with
    # keys before its queries: its row 3, head 3
    assert (e.check, e.sequence, e.query, e.head) == ("chunked_prefill", 2, 3, 3)


def test_unknown_checks_are_refused():
    with pytest.raises(ValueError, match="prefil"):
        T.check_invariance(reference, checks=("prefil",))


# -- the backward (check_backward_invariance) -------------------------------------------

reference_backward = functools.partial(tandem.attention_backward, backend="reference")
BACKWARD = T.InvarianceConfig(lengths=(1, 4, 17, 65, 300), sinks=True)


@pytest.mark.parametrize("array", ["numpy", "torch"])
def test_the_reference_backward_passes(array):
    rows = T.check_backward_invariance(reference_backward, config=BACKWARD, array=array)
    assert set(rows) == set(T.BACKWARD_INVARIANCE_CHECKS) and min(rows.values()) > 0, rows


def test_the_optimized_backward_passes_under_the_switch_and_not_without():
    config = T.InvarianceConfig(lengths=(1, 65, 300, 1100), H=8, Hkv=2)
    with tandem.invariant():
        rows = T.check_backward_invariance(tandem.attention_backward, config=config)
    assert min(rows.values()) > 0, rows
    # the default order splits a lone sequence's query blocks into parts (few
    # sequence-head pairs to share out), a batch's not: the bits move
    with pytest.raises(T.InvarianceFailure) as info:
        T.check_backward_invariance(tandem.attention_backward, config=config)
    assert info.value.output in ("dq", "dk", "dv")


def batch_sized_backward(q, k, v, dout, **kw):
    """The reference's gradients, dk nudged by one ulp in calls of more than
    one sequence (a backward whose key sums depend on the batch)."""
    dq, dk, dv = reference_backward(q, k, v, dout, **kw)[:3]
    several = q.shape[0] > 1 if kw["layout"] == "bshd" else len(kw["cu_seqlens_q"]) > 2
    if several:
        dk = np.nextafter(dk, np.float32(np.inf)).astype(dk.dtype)
    return dq, dk, dv


@pytest.mark.parametrize("check", T.BACKWARD_INVARIANCE_CHECKS)
def test_a_batch_dependent_backward_is_caught_at_a_key(check):
    with pytest.raises(T.InvarianceFailure) as info:
        T.check_backward_invariance(batch_sized_backward, config=BACKWARD, checks=(check,))
    e = info.value
    assert e.check == check and e.output == "dk" and f"key {e.query}, head {e.head}" in str(e)
    assert e.max_diff > 0
