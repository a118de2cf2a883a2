# SPDX-License-Identifier: Apache-2.0
"""tandem's kernels on NumPy arrays and torch tensors: results against the
reference in double and against NumPy formulas, zero-copy views, errors."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import tandem
from tandem import _ext
from kernels import numpy_attention, numpy_rope

rng = np.random.default_rng(7)


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def qkv(B=2, Sq=5, Sk=7, H=4, Hkv=2, D=8, Dv=6, layout="bshd"):
    q, k, v = randn(B, Sq, H, D), randn(B, Sk, Hkv, D), randn(B, Sk, Hkv, Dv)
    if layout == "bhsd":
        q, k, v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v))
    return q, k, v


def f64(*xs):
    return [x.astype(np.float64) for x in xs]


MASK_CASES = [dict(), dict(mask="causal"), dict(mask="sliding_window", window=2),
              dict(window=3), dict(softcap=5.0), dict(scale=0.3, mask="causal"),
              dict(key_padding=np.array([[1, 1, 0, 1, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0]])),
              dict(bias=randn(1, 4, 5, 7)), dict(bias=randn(2, 1, 5, 7)), dict(bias=randn(5, 7))]


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("case", range(len(MASK_CASES)))
@pytest.mark.parametrize("backend", ["optimized", "reference"])
def test_attention_matches_the_reference_in_double_and_numpy(layout, case, backend):
    kw = MASK_CASES[case]
    q, k, v = qkv(layout=layout)
    out = tandem.attention(q, k, v, layout=layout, backend=backend, **kw)
    ref = tandem.attention(*f64(q, k, v), layout=layout, **kw)
    assert out.dtype == np.float32 and ref.dtype == np.float64 and out.shape == ref.shape
    np.testing.assert_allclose(out, ref, atol=2e-6, rtol=1e-5)
    plain = dict(layout=layout, mask=kw.get("mask", "sliding_window" if "window" in kw else
                                               "none"), window=kw.get("window", 0),
                 scale=kw.get("scale"), softcap=kw.get("softcap", 0.0))
    bias = kw.get("bias")
    expect = numpy_attention(q, k, v, bias=None if bias is None else bias.reshape(
        (1, 1) * (bias.ndim == 2) + bias.shape), key_padding=kw.get("key_padding"), **plain)
    np.testing.assert_allclose(ref, expect, atol=1e-5, rtol=1e-5)


def test_torch_in_torch_out_numpy_in_numpy_out():
    q, k, v = qkv()
    out_np = tandem.attention(q, k, v, mask="causal")
    out_t = tandem.attention(*(torch.from_numpy(x).requires_grad_() for x in (q, k, v)),
                             mask="causal")
    assert isinstance(out_np, np.ndarray) and isinstance(out_t, torch.Tensor)
    np.testing.assert_array_equal(out_np, out_t.numpy())


def test_rank3_and_rank2_inputs_with_num_heads():
    q, k, v = qkv()
    out = tandem.attention(q, k, v, mask="causal")
    r3 = tandem.attention(q.reshape(2, 5, 32), k.reshape(2, 7, 16), v.reshape(2, 7, 12),
                          num_heads=4, mask="causal")
    r2 = tandem.attention(q[0].reshape(5, 32), k[0].reshape(7, 16), v[0].reshape(7, 12),
                          num_heads=4, mask="causal")
    np.testing.assert_array_equal(r3, out.reshape(2, 5, 24))
    np.testing.assert_array_equal(r2, out[0].reshape(5, 24))


def test_row_strided_views_are_read_in_place():
    # q, k, v packed in one qkv buffer [B, S, 3*H*D], as a fused projection writes them
    B, S, H, D = 2, 6, 4, 8
    qkv_buf = randn(B, S, 3 * H * D)
    view = lambda i: qkv_buf[:, :, i * H * D:(i + 1) * H * D].reshape(B, S, H, D)  # noqa: E731
    q, k, v = view(0), view(1), view(2)
    assert not q.flags.c_contiguous
    for x in (q, k, v):  # nanobind hands the kernel the caller's first element
        assert tandem._ext.address(x) == x.__array_interface__["data"][0]
    out = tandem.attention(q, k, v, mask="causal")
    np.testing.assert_array_equal(out, tandem.attention(*(x.copy() for x in (q, k, v)),
                                                        mask="causal"))
    # the kernel reads the parent's memory: writing into it changes the result
    qkv_buf[:, :, 2 * H * D:] *= 2  # v doubles, so out doubles
    np.testing.assert_allclose(tandem.attention(q, k, v, mask="causal"), 2 * out, rtol=1e-6)
    tq = torch.from_numpy(qkv_buf)[:, :, :H * D].reshape(B, S, H, D)
    assert tandem._ext.address(tq) == tq.data_ptr()


def test_non_contiguous_inputs_are_copied_and_still_right():
    q, k, v = qkv(layout="bshd")
    qt, kt, vt = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # bhsd views, not contiguous
    out = tandem.attention(qt, kt, vt, layout="bhsd")
    np.testing.assert_allclose(out.transpose(0, 2, 1, 3), tandem.attention(q, k, v), atol=1e-6)


def test_float64_runs_the_reference_in_double_whatever_the_backend():
    q, k, v = f64(*qkv())
    a = tandem.attention(q, k, v, mask="causal", backend="optimized")
    b = tandem.attention(q, k, v, mask="causal", backend="reference")
    assert a.dtype == np.float64
    np.testing.assert_array_equal(a, b)


def test_fully_masked_rows_give_zero():
    q, k, v = qkv()
    bias = np.zeros((1, 1, 5, 7), np.float32)
    bias[..., 2, :] = -np.inf
    out = tandem.attention(q, k, v, bias=bias)
    assert np.all(out[:, 2] == 0) and np.all(np.isfinite(out))


@pytest.mark.parametrize("grads", [("dq", "dk", "dv"), ("dq",), ("dk", "dv")])
def test_backward_matches_finite_differences_and_the_saved_state_pair(grads):
    q, k, v = f64(*qkv(Sq=3, Sk=4, D=3, Dv=2))
    kw = dict(mask="causal", softcap=4.0)
    dout = rng.standard_normal((2, 3, 4, 2))
    g = tandem.attention_backward(q, k, v, dout, grads=grads, **kw)
    loss = lambda q, k, v: np.sum(tandem.attention(q, k, v, **kw) * dout)  # noqa: E731
    for name, x, gx in zip(("dq", "dk", "dv"), (q, k, v), g):
        if name not in grads:
            assert gx is None
            continue
        idx = (0, 1, 1, 1) if name == "dq" else (1, 2, 1, 0)
        xp, xm = x.copy(), x.copy()
        xp[idx] += 1e-6
        xm[idx] -= 1e-6
        args = lambda y: [y if n == name else z for n, z in  # noqa: E731
                          zip(("dq", "dk", "dv"), (q, k, v))]
        fd = (loss(*args(xp)) - loss(*args(xm))) / 2e-6
        assert abs(gx[idx] - fd) < 1e-6
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    out, lse = tandem.attention_forward_lse(q32, k32, v32, **kw)
    assert lse.shape == (2, 4, 3) and lse.dtype == np.float32
    saved = tandem.attention_backward_saved(q32, k32, v32, out, lse, dout.astype(np.float32),
                                            **kw)
    for a, b in zip(saved, tandem.attention_backward(q, k, v, dout, **kw)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_rope_matches_numpy_and_its_backward_is_the_transpose():
    x = randn(2, 5, 3 * 8)
    angle = rng.uniform(-3, 3, (6, 3))
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    for style in ("neox", "gptj"):
        kw = dict(head_dim=8, n_rot=6, style=style, table_rows="position")
        np.testing.assert_allclose(tandem.rope(x, cos, sin, **kw), numpy_rope(x, cos, sin, **kw),
                                   atol=1e-6)
        y = randn(2, 5, 24)
        lhs = np.sum(tandem.rope(x, cos, sin, **kw) * y, dtype=np.float64)
        rhs = np.sum(x * tandem.rope_backward(y, cos, sin, **kw), dtype=np.float64)
        assert abs(lhs - rhs) < 1e-4
    x4 = torch.from_numpy(randn(2, 3, 5, 8))  # rank 4: [B, H, S, D], head_dim from the last axis
    out = tandem.rope(x4, torch.from_numpy(cos), torch.from_numpy(sin), n_rot=6)
    assert isinstance(out, torch.Tensor) and out.shape == x4.shape


def test_rope_reads_row_strided_input_in_place():
    parent = randn(2, 5, 40)
    x = parent[:, :, :24]
    cos, sin = np.ones((5, 4), np.float32), np.zeros((5, 4), np.float32)
    out = tandem.rope(x, cos, sin, head_dim=8)
    np.testing.assert_array_equal(out, x)  # angle 0: the identity
    assert tandem._ext.address(x) == x.__array_interface__["data"][0]


def test_axial_rope_backward_is_the_transpose():
    x, y = randn(2, 12, 16), randn(2, 12, 16)
    kw = dict(end_x=3, end_y=2, num_heads=2, repeat_factor=2)
    lhs = np.sum(tandem.axial_rope(x, **kw) * y, dtype=np.float64)
    rhs = np.sum(x * tandem.axial_rope_backward(y, **kw), dtype=np.float64)
    assert abs(lhs - rhs) < 1e-4


def test_swiglu_and_its_gradient():
    x = randn(3, 4, 10)
    g, u = x[..., :5].astype(np.float64), x[..., 5:].astype(np.float64)
    np.testing.assert_allclose(tandem.swiglu(x), g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tandem.swiglu(x, gate_first=False), u / (1 + np.exp(-u)) * g,
                               rtol=1e-5, atol=1e-6)
    x64, dy = x.astype(np.float64), rng.standard_normal((3, 4, 5))
    dx = tandem.swiglu_backward(x64, dy)
    e = np.zeros_like(x64)
    e[1, 2, 7] = 1e-6
    fd = np.sum((tandem.swiglu(x64 + e) - tandem.swiglu(x64 - e)) * dy) / 2e-6
    assert abs(dx[1, 2, 7] - fd) < 1e-7


def test_attention_block_matches_its_parts():
    B, S, H, D = 2, 5, 2, 4
    E = H * D
    x, w_qkv, w_out, b_qkv = randn(B, S, E), randn(3 * E, E), randn(E, E), randn(3 * E)
    keep = np.array([[1, 1, 1, 0, 1], [1, 0, 1, 1, 1]])
    out = tandem.attention_block(x, w_qkv, w_out, num_heads=H, b_qkv=b_qkv, key_padding=keep)
    qkv_ = x.astype(np.float64) @ w_qkv.T.astype(np.float64) + b_qkv
    q, k, v = (qkv_[..., i * E:(i + 1) * E].reshape(B, S, H, D) for i in range(3))
    a = tandem.attention(q, k, v, key_padding=keep).reshape(B, S, E)
    np.testing.assert_allclose(out, a @ w_out.T.astype(np.float64), atol=1e-4)


ERRORS = [
    (lambda q, k, v: tandem.attention(q, k[..., :4], v), "k.shape"),
    (lambda q, k, v: tandem.attention(q, k[:, :, :1].repeat(3, 2), v[:, :, :1].repeat(3, 2)),
     "k.shape"),
    (lambda q, k, v: tandem.attention(q, k, v, mask="diagonal"), "mask"),
    (lambda q, k, v: tandem.attention(q, k, v, layout="sbhd"), "layout"),
    (lambda q, k, v: tandem.attention(q, k, v, window=-1), "window"),
    (lambda q, k, v: tandem.attention(q, k, v, mask="causal", window=2), "window"),
    (lambda q, k, v: tandem.attention(q, k, v, scale=float("inf")), "scale"),
    (lambda q, k, v: tandem.attention(q, k, v, softcap=-1.0), "softcap"),
    (lambda q, k, v: tandem.attention(q, k, v, bias=np.zeros((3, 1, 5, 7))), "bias.shape"),
    (lambda q, k, v: tandem.attention(q, k, v, key_padding=np.ones((2, 6))),
     "key_padding.shape"),
    (lambda q, k, v: tandem.attention(q, k, v, mask="causal", bias=np.zeros((5, 7))), "bias"),
    (lambda q, k, v: tandem.attention(q, k.astype(np.float64), v), "k.dtype"),
    (lambda q, k, v: tandem.attention(q.astype(np.int32), k, v), "q.dtype"),
    # q's dtype is the call's storage type: the input that differs is named (SPEC §10.1)
    (lambda q, k, v: tandem.attention(q.astype(np.float16), k, v), "k.dtype"),
    (lambda q, k, v: tandem.attention(q, k, v, backend="cuda"), "backend"),
    (lambda q, k, v: tandem.attention(q.reshape(2, 5, 32), k, v), "num_heads"),
    (lambda q, k, v: tandem.attention_backward(q, k, v, np.ones((2, 5, 4, 5), np.float32)),
     "dout.shape"),
    (lambda q, k, v: tandem.rope(q, np.ones((5, 4), np.float32), np.ones((5, 4), np.float32),
                                 n_rot=3), "n_rot"),
    (lambda q, k, v: tandem.swiglu(np.ones((2, 3), np.float32)), "x.shape"),
    (lambda q, k, v: tandem.axial_rope(q, end_x=3, end_y=2), "seq"),
]


@pytest.mark.parametrize("case", range(len(ERRORS)))
def test_errors_are_tandem_errors_naming_the_parameter(case):
    call, parameter = ERRORS[case]
    q, k, v = qkv()
    with pytest.raises(tandem.Error) as info:
        call(q, k, v)
    assert isinstance(info.value, ValueError)
    assert info.value.parameter == parameter, str(info.value)
    assert str(info.value).startswith(parameter.split(".")[0]), str(info.value)


def test_the_gil_is_released_while_a_kernel_runs():
    q, k, v = qkv(B=1, Sq=1024, Sk=1024, H=8, Hkv=8, D=64, Dv=64)
    inside = threading.Event()
    result = []

    def work():
        inside.set()
        for _ in range(3):
            result.append(tandem.attention(q, k, v, backend="reference"))

    worker = threading.Thread(target=work)
    worker.start()
    inside.wait()
    ticks = 0
    t0 = time.monotonic()
    while worker.is_alive():
        ticks += 1
    seconds = time.monotonic() - t0
    worker.join()
    # the reference takes seconds; with the GIL held this thread could not count
    assert seconds > 0.3 and ticks > 10000, (seconds, ticks)


SIMD_TARGET = """
import numpy as np, tandem
q = np.ones((1, 4, 1, 8), np.float32)
try:
    tandem.attention(q, q, q, backend="optimized")
    print("ran on", tandem.simd_target())
except tandem.Error as e:
    print("error", e.parameter, e)
"""


def run_with_target(name):
    env = dict(os.environ, TANDEM_TARGET=name)
    out = subprocess.run([sys.executable, "-c", SIMD_TARGET], env=env, check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


@pytest.mark.skipif(not _ext.has_optimized(), reason="built without the optimized backend")
def test_tandem_target_chooses_the_simd_target_of_the_process():
    # SPEC 11.5: read once, at the process's first optimized call
    assert run_with_target("SCALAR") == "ran on SCALAR"
    refused = run_with_target("AVX9")
    assert refused.startswith("error TANDEM_TARGET TANDEM_TARGET: target = AVX9"), refused
    assert "SCALAR" in refused, refused  # it names the targets this CPU runs
