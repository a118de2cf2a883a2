#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Measures tandem's peers on the shapes and thread counts of a tandem_bench plan.

Run inside the peer environment (`make peers` creates .venv-peers/):

    .venv-peers/bin/python bench/peers/peers.py --plan plan.json --out peers.json
    .venv-peers/bin/python bench/peers/peers.py --list      # which peers are importable

The plan is `tandem_bench --plan` output; every benchmark tagged `peer` is
measured with each peer implementation of its op, at the benchmark's thread
count. Each (library, thread count) runs in its own subprocess whose CPU
affinity and library thread settings are restricted to that many cores, so
thread settings never leak between measurements; a peer that is missing or
fails is reported, never fatal.

Where tandem's Python package is importable (report.py puts the package of
.venv/ on PYTHONPATH), each peer's forward attention and decode are timed in
alternating rounds with tandem.attention on the same inputs in the same
process (--rounds; measure_paired), and each record keeps both sides' seconds
per call in every round, so that the report's speed-ups are paired ratios.

Peers (each only where importable):
  torch_eager    PyTorch eager ops: QKᵀ, softmax, PV; HF rotate-half RoPE;
                 SAM 2's complex-multiply axial RoPE; silu(g)*u
  torch_sdpa     torch.nn.functional.scaled_dot_product_attention (flash path on CPU)
  torch_mha      torch.nn.MultiheadAttention (the BERT block), eval + inference mode
  torch_flex_compiled  torch.compile(flex_attention) (Inductor's CPU template) on
                 bench_flex.cpp's FlexAttention forms, beside tandem.flex_attention with
                 the same Python mods and torch's block mask
  torch_sdpa_math  the flex backward (bench_flex.cpp's flex_backward) as torch runs it on
                 the CPU: autograd through SDPA's math path, the mask materialized
  openvino_sdpa  OpenVINO ScaledDotProductAttention-13 compiled for CPU
  onnxruntime_attention  ONNX Runtime, ONNX Attention-23 (else com.microsoft MultiHeadAttention)
  jax_dpa        jax.nn.dot_product_attention, jitted, XLA CPU
  ggml_fa_f32    ggml's CPU flash attention (ggml_flash_attn_ext, ggml-python), f32 K and V
  ggml_fa_f16    the same with K and V in f16 (as llama.cpp keeps its KV cache)
  ggml_fa_q8_0   the same with K and V in q8_0, beside tandem's int8 decode (checked on
                 ggml-python 0.0.45: its CPU flash attention takes q8_0 K/V and agrees with
                 attention over the dequantized values)

Beside tandem's bf16 benchmarks (plan entries tagged `stored`): torch_sdpa on bf16 tensors,
openvino_sdpa with INFERENCE_PRECISION_HINT bf16 (where OpenVINO lists BF16 for the CPU),
ggml_fa_f16; beside its int8 decode, ggml_fa_q8_0.
  ggml           ggml_rope_ext (NeoX) and ggml_swiglu

Backward of the torch peers times autograd's backward alone (the forward graph
is built once and kept: torch is not charged for recomputing its forward,
which tandem's backward does). JAX's jitted vjp includes its forward.
"""
import argparse
import ctypes
import json
import math
import os
import subprocess
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from alternate import alternate, visit_rounds  # noqa: E402 - bench/alternate.py

LIBRARIES = ("torch", "openvino", "onnxruntime", "jax", "ggml")
PIP_NAMES = {"torch": "torch", "openvino": "openvino", "onnxruntime": "onnxruntime onnx",
             "jax": "jax", "ggml": "ggml-python"}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Availability


def library_version(lib):
    """Version string of an importable library, else None (no import side effects kept)."""
    code = {
        "torch": "import torch; print(torch.__version__)",
        "openvino": "import openvino as ov; print(ov.get_version())",
        "onnxruntime": "import onnxruntime, onnx; print(onnxruntime.__version__ + ' (onnx ' + onnx.__version__ + ')')",
        "jax": "import jax, jaxlib; print(jax.__version__ + ' (jaxlib ' + jaxlib.__version__ + ')')",
        "ggml": "import importlib.metadata as m, ggml; print('ggml-python ' + m.version('ggml-python'))",
    }[lib]
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else None


def list_peers():
    return {lib: library_version(lib) for lib in LIBRARIES}


# ---------------------------------------------------------------------------
# Timing


def clear_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_bytes():
    rss = hwm = None
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm


def measure(fn, min_time, measure_memory=False):
    """Mean seconds per call over at least min_time after one warm-up call
    (which also compiles, for JIT peers). With measure_memory, the warm-up's
    peak RSS growth in bytes (or None)."""
    extra = None
    if measure_memory and clear_peak_rss():
        rss0, _ = rss_bytes()
        fn()
        _, hwm = rss_bytes()
        extra = max(0, hwm - rss0)
    else:
        fn()
    reps, total = 0, 0.0
    # Like Google Benchmark: grow the repetition count until min_time is covered.
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        reps += n
        total += dt
        if total >= min_time:
            break
        per = total / reps
        n = max(1, min(1000, int((min_time - total) / max(per, 1e-9) * 1.2) + 1))
    return total / reps, reps, extra


def measure_paired(ours, theirs, min_time, rounds):
    """tandem's call `ours` and the peer's `theirs` timed in alternation on the same shape
    (bench/alternate.py): ([our seconds per call in each round], [theirs in each round])."""
    mine, peer = alternate([ours, theirs], min_time, rounds)
    return mine, peer


# ---------------------------------------------------------------------------
# tandem, measured in the peers' process beside each peer


def pairable(task):
    """Whether tandem is timed beside the peers on `task` (tandem_partner): f32 forward
    attention, decode and the flex forms."""
    op, storage = split_op(task["op"])
    return storage is None and (op in ("attention_forward", "decode") or is_flex(task))


def tandem_partner(task, threads):
    """tandem's forward attention or decode of an f32 task through its Python package
    (tandem.attention on the same NumPy inputs as the peers: seeds 1, 2, 3, and the same
    caches cycled for decode; tandem.flex_attention for a flex form), or None where the package is not importable or the task is
    not one tandem is paired on."""
    if not pairable(task):
        return None
    try:
        import numpy as np
        import tandem
    except Exception:  # noqa: BLE001 - no package, or one built for another Python
        return None
    tandem.set_threads(threads)
    if is_flex(task):  # the same mods and block mask, traced by tandem.flex on each call
        import torch
        a = flex_call_args(task)
        if task["op"] == "flex_backward":  # autograd's backward of tandem's op, as torch's
            q, k, v = (x.clone().requires_grad_(True) for x in (a.q, a.k, a.v))
            out = tandem.flex_attention(q, k, v, score_mod=a.score_mod, block_mask=a.block_mask)
            return lambda: torch.autograd.grad(out, (q, k, v), a.dout, retain_graph=True)
        return lambda: tandem.flex_attention(a.q, a.k, a.v, score_mod=a.score_mod,
                                             block_mask=a.block_mask)
    B, H, Hkv, Sq, Sk, D, Dv, causal = attn_dims(task["params"])
    decode = split_op(task["op"])[0] == "decode"
    caches = decode_caches(task["params"], 4) if decode else 1
    q = rng_arrays(np, [(B, H, Sq, D)], 1)[0]
    ks = rng_arrays(np, [(B, Hkv, Sk, D)] * caches, 2)
    vs = rng_arrays(np, [(B, Hkv, Sk, Dv)] * caches, 3)
    mask = "causal" if causal else None
    state = {"c": 0}

    def call():
        c = state["c"]
        state["c"] = (c + 1) % caches
        return tandem.attention(q, ks[c], vs[c], layout="bhsd", mask=mask)
    return call


# ---------------------------------------------------------------------------
# Inputs


def rng_arrays(np, shapes, seed=0, lo=-1.0, hi=1.0):
    g = np.random.default_rng(seed)
    return [g.uniform(lo, hi, size=s).astype(np.float32) for s in shapes]


# The peers' ops of a tandem benchmark timing several storage types (the report names
# tandem's rows <op>_<type>; the saved-state backward is compared with autograd's backward).
STORED_PEER_OPS = {
    "attention_forward_stored": ("attention_forward_bf16",),
    "attention_backward_saved_stored": ("attention_backward_bf16",),
    "decode_stored": ("decode_bf16", "decode_int8"),
}


def split_op(op):
    """(the op, its storage type or None): attention_forward_bf16 → (attention_forward, bf16)."""
    for kind in ("bf16", "f16", "int8"):
        if op.endswith("_" + kind):
            return op[: -len(kind) - 1], kind
    return op, None


def decode_caches(p, bytes_per_element):
    """How many caches a decode task cycles through: its plan's count, else enough caches of
    this element size to fill the pool tandem's decode_stored reads (none stays in cache)."""
    if "caches" in p:
        return int(p["caches"])
    one = p["B"] * p["Hkv"] * p["Sk"] * (p["D"] + p["Dv"]) * bytes_per_element
    return max(2, math.ceil(p.get("pool_bytes", 0) / one))


def attn_dims(p):
    return (int(p["B"]), int(p["H"]), int(p["Hkv"]), int(p["Sq"]), int(p["Sk"]), int(p["D"]),
            int(p["Dv"]), bool(p["causal"]))


def is_flex(task):
    """A FlexAttention form of bench_flex.cpp (op attention_features, the forward, or
    flex_backward; shape flex_<form>_…)."""
    return task["op"] in ("attention_features", "flex_backward") \
        and task["shape"].startswith("flex_")


def flex_call_args(task):
    """A bench_flex.cpp form as torch users write it (float32, bhsd, seeds 1, 2, 3 and 4
    for dO; torch's create_block_mask, 128 × 128 blocks): a namespace of q, k, v, dout,
    score_mod, mask_mod, block_mask, the form, the slopes and the softcap; the same Python
    callables for torch and for tandem.flex_attention, which traces them."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask
    np = __import__("numpy")
    p = task["params"]
    B, H, Hkv, S, _, D, Dv, _ = attn_dims(p)
    form = task["shape"].split("_")[1]
    window, cap, docs = int(p["window"]), float(p["softcap"]), int(p["documents"])
    q, k, v = (torch.from_numpy(a) for a in rng_arrays(
        np, [(B, H, S, D), (B, Hkv, S, D), (B, Hkv, S, Dv)], 1))
    dout = torch.from_numpy(rng_arrays(np, [(B, H, S, Dv)], 4)[0])
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])
    doc = torch.arange(S) * docs // S

    def mask_mod(b, h, q_idx, kv_idx):
        visible = kv_idx <= q_idx
        if form == "window":
            return (q_idx - kv_idx <= window) & visible
        if form == "document":
            return (doc[q_idx] == doc[kv_idx]) & visible
        return visible

    def softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    score_mod = {"softcap": softcap, "alibi": alibi}.get(form)
    block_mask = create_block_mask(mask_mod, None, None, S, S, device="cpu", BLOCK_SIZE=128)
    return types.SimpleNamespace(q=q, k=k, v=v, dout=dout, score_mod=score_mod,
                                 mask_mod=mask_mod, block_mask=block_mask, form=form,
                                 slopes=slopes, cap=cap)


# ---------------------------------------------------------------------------
# torch


def torch_flex_impls(task):
    """torch.compile(flex_attention) on a bench_flex.cpp form (compiled on its first call,
    the warm-up: Inductor's CPU template, forward only), or for flex_backward the backward
    torch has on the CPU: autograd through SDPA's math path with the mask materialized."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention
    a = flex_call_args(task)
    if task["op"] == "flex_backward":
        return torch_flex_math_backward(a)
    compiled = torch.compile(flex_attention)

    def call():
        with torch.inference_mode():
            return compiled(a.q, a.k, a.v, score_mod=a.score_mod, block_mask=a.block_mask)
    return [("torch_flex_compiled", call, {"note": "torch.compile(flex_attention)"})]


def torch_flex_math_backward(a):
    """autograd's backward (the forward graph built once) of SDPA's math path with the
    form's mask materialized as [S, S] (ALiBi: a float bias [H, S, S]); the softcap,
    which SDPA cannot take, as the same math written out (scores, tanh, softmax, P·V)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    S, D = a.q.shape[2], a.q.shape[3]
    i, j = torch.arange(S).view(S, 1), torch.arange(S).view(1, S)
    visible = a.mask_mod(0, 0, i, j)
    q, k, v = (x.clone().requires_grad_(True) for x in (a.q, a.k, a.v))
    note = "SDPA math path, mask materialized, autograd backward only"
    if a.form == "softcap":
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        t = (a.cap * torch.tanh(s / a.cap)).masked_fill(~visible, float("-inf"))
        out = torch.softmax(t, dim=-1) @ v
        note = "softcap: the math written out (SDPA takes no score_mod), autograd backward only"
    else:
        mask = visible
        if a.form == "alibi":
            bias = -a.slopes.view(-1, 1, 1) * (i - j).abs()
            mask = bias.masked_fill(~visible, float("-inf"))
        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def call():
        return torch.autograd.grad(out, (q, k, v), a.dout, retain_graph=True)
    return [("torch_sdpa_math", call, {"note": note})]


def torch_impls(task, threads):
    """Yields (peer, callable, info) for one task."""
    import torch
    import torch.nn.functional as F
    np = __import__("numpy")
    torch.set_num_threads(threads)
    if is_flex(task):
        return torch_flex_impls(task)
    op, storage = split_op(task["op"])
    p = task["params"]
    impls = []
    if storage not in (None, "bf16"):
        return impls
    # bf16: the same values rounded to bfloat16 tensors, SDPA alone (its CPU flash path)
    dtype = torch.bfloat16 if storage == "bf16" else torch.float32
    if op in ("attention_forward", "attention_backward", "decode"):
        B, H, Hkv, Sq, Sk, D, Dv, causal = attn_dims(p)
        g = H // Hkv
        caches = decode_caches(p, 2 if storage else 4) if op == "decode" else 1

        def tensor(a):
            return torch.from_numpy(a).to(dtype)
        q = tensor(rng_arrays(np, [(B, H, Sq, D)], 1)[0])
        ks = [tensor(a) for a in rng_arrays(np, [(B, Hkv, Sk, D)] * caches, 2)]
        vs = [tensor(a) for a in rng_arrays(np, [(B, Hkv, Sk, Dv)] * caches, 3)]
        scale = 1.0 / math.sqrt(D)
        off = max(Sk - Sq, 0)
        hidden = None
        if causal:
            i = torch.arange(Sq).unsqueeze(1) + off
            j = torch.arange(Sk).unsqueeze(0)
            hidden = j > i  # bottom-right aligned, as tandem's causal

        def eager(q_, k_, v_):
            if g > 1:  # GQA without copying K and V: group the query heads
                qg = q_.view(B, Hkv, g * Sq, D)
                s = torch.matmul(qg, k_.transpose(-1, -2)) * scale
                s = s.view(B, Hkv, g, Sq, Sk)
            else:
                s = torch.matmul(q_, k_.transpose(-1, -2)) * scale
            if hidden is not None:
                s = s.masked_fill(hidden, float("-inf"))
            pr = torch.softmax(s, dim=-1)
            if g > 1:
                return torch.matmul(pr.view(B, Hkv, g * Sq, Sk), v_).view(B, H, Sq, Dv)
            return torch.matmul(pr, v_)

        def sdpa(q_, k_, v_):
            kw = {}
            if g > 1:
                kw["enable_gqa"] = True
            if causal and Sq != Sk:
                return F.scaled_dot_product_attention(q_, k_, v_, attn_mask=~hidden, **kw)
            return F.scaled_dot_product_attention(q_, k_, v_, is_causal=causal, **kw)

        if op in ("attention_forward", "decode"):
            state = {"c": 0}

            def fwd(f):
                def call():
                    c = state["c"]
                    state["c"] = (c + 1) % caches
                    with torch.inference_mode():
                        return f(q, ks[c], vs[c])
                return call
            if storage:
                info = {"note": "bf16 tensors"}
                if op == "decode":  # the bytes of K and V it reads, in bf16
                    info["kv_bytes"] = 2 * B * Hkv * Sk * (D + Dv)
                impls.append(("torch_sdpa", fwd(sdpa), info))
            else:
                impls.append(("torch_eager", fwd(eager), {}))
                impls.append(("torch_sdpa", fwd(sdpa), {}))
        else:
            dout = tensor(rng_arrays(np, [(B, H, Sq, Dv)], 4)[0])

            def bwd(f):
                qq = q.clone().requires_grad_(True)
                kk = ks[0].clone().requires_grad_(True)
                vv = vs[0].clone().requires_grad_(True)
                out = f(qq, kk, vv)

                def call():
                    return torch.autograd.grad(out, (qq, kk, vv), dout, retain_graph=True)
                return call
            if storage:
                impls.append(("torch_sdpa", bwd(sdpa),
                              {"note": "bf16 tensors, autograd backward only"}))
            else:
                impls.append(("torch_sdpa", bwd(sdpa), {"note": "autograd backward only"}))
                impls.append(("torch_eager", bwd(eager), {"note": "autograd backward only"}))
    elif op in ("rope_forward", "rope_backward"):
        B, S, H, D = (int(p[k]) for k in ("B", "S", "H", "D"))
        x = torch.from_numpy(rng_arrays(np, [(B, S, H, D)], 5)[0])
        m = D // 2
        inv = 10000.0 ** (-torch.arange(0, m, dtype=torch.float64) * 2.0 / D)
        ang = torch.arange(S, dtype=torch.float64).unsqueeze(1) * inv
        emb = torch.cat([ang, ang], dim=-1)  # HF: cos/sin [S, D]
        cos = emb.cos().float().view(1, S, 1, D)
        sin = emb.sin().float().view(1, S, 1, D)

        def rope(x_):
            x1, x2 = x_[..., :m], x_[..., m:]
            return x_ * cos + torch.cat((-x2, x1), dim=-1) * sin
        if op == "rope_forward":
            def call():
                with torch.inference_mode():
                    return rope(x)
            impls.append(("torch_eager", call, {}))
        else:
            xx = x.clone().requires_grad_(True)
            y = rope(xx)
            dy = torch.from_numpy(rng_arrays(np, [(B, S, H, D)], 6)[0])

            def call():
                return torch.autograd.grad(y, xx, dy, retain_graph=True)
            impls.append(("torch_eager", call, {"note": "autograd backward only"}))
    elif op in ("axial_rope_forward", "axial_rope_backward"):
        B, S, W, H = (int(p[k]) for k in ("B", "S", "W", "H"))
        D = W // H
        side = int(round(math.sqrt(S)))
        x = torch.from_numpy(rng_arrays(np, [(B, H, S, D)], 7)[0])
        # SAM 2's compute_axial_cis / apply_rotary_enc: complex multiply.
        freqs = 1.0 / (10000.0 ** (torch.arange(0, D, 4)[: D // 4].float() / D))
        t = torch.arange(side * side, dtype=torch.float32)
        tx, ty = t % side, torch.div(t, side, rounding_mode="floor")
        fx = torch.outer(tx, freqs)
        fy = torch.outer(ty, freqs)
        cis = torch.cat([torch.polar(torch.ones_like(fx), fx),
                         torch.polar(torch.ones_like(fy), fy)], dim=-1)  # [S, D/2]

        def axial(x_):
            xc = torch.view_as_complex(x_.reshape(*x_.shape[:-1], -1, 2))
            return torch.view_as_real(xc * cis).flatten(3)
        if op == "axial_rope_forward":
            def call():
                with torch.inference_mode():
                    return axial(x)
            impls.append(("torch_eager", call, {}))
        else:
            xx = x.clone().requires_grad_(True)
            y = axial(xx)
            dy = torch.from_numpy(rng_arrays(np, [tuple(y.shape)], 8)[0])

            def call():
                return torch.autograd.grad(y, xx, dy, retain_graph=True)
            impls.append(("torch_eager", call, {"note": "autograd backward only"}))
    elif op in ("swiglu_forward", "swiglu_backward"):
        rows, n = int(p["rows"]), int(p["n"])
        x = torch.from_numpy(rng_arrays(np, [(rows, 2 * n)], 9, -4, 4)[0])

        def swiglu(x_):
            return F.silu(x_[:, :n]) * x_[:, n:]
        if op == "swiglu_forward":
            def call():
                with torch.inference_mode():
                    return swiglu(x)
            impls.append(("torch_eager", call, {}))
        else:
            xx = x.clone().requires_grad_(True)
            y = swiglu(xx)
            dy = torch.from_numpy(rng_arrays(np, [(rows, n)], 10)[0])

            def call():
                return torch.autograd.grad(y, xx, dy, retain_graph=True)
            impls.append(("torch_eager", call, {"note": "autograd backward only"}))
    elif op == "attention_block":
        B, S, E, H = (int(p[k]) for k in ("B", "S", "E", "H"))
        mha = torch.nn.MultiheadAttention(E, H, bias=True, batch_first=True).eval()
        x = torch.from_numpy(rng_arrays(np, [(B, S, E)], 11)[0])

        def call():
            with torch.inference_mode():
                return mha(x, x, x, need_weights=False)[0]
        impls.append(("torch_mha", call, {}))
    return impls


# ---------------------------------------------------------------------------
# OpenVINO


def openvino_impls(task, threads):
    op, storage = split_op(task["op"])
    if op != "attention_forward" or storage not in (None, "bf16"):
        return []
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops
    B, H, Hkv, Sq, Sk, D, Dv, causal = attn_dims(task["params"])
    if Hkv != H or (causal and Sq != Sk):
        return []
    core = ov.Core()
    precision = "f32"
    if storage == "bf16":
        # bf16 inference precision only where OpenVINO says this CPU computes in bf16
        caps = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        if "BF16" not in caps:
            raise RuntimeError("OpenVINO reports no bf16 on this CPU (OPTIMIZATION_CAPABILITIES: "
                               + ", ".join(caps) + "): its bf16 SDPA is not measured")
        precision = "bf16"
    q = ops.parameter([B, H, Sq, D], np.float32, name="q")
    k = ops.parameter([B, H, Sk, D], np.float32, name="k")
    v = ops.parameter([B, H, Sk, Dv], np.float32, name="v")
    out = ops.scaled_dot_product_attention(q, k, v, causal=causal)
    model = ov.Model([out], [q, k, v], "sdpa")
    compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                 "INFERENCE_PRECISION_HINT": precision,
                                                 "PERFORMANCE_HINT": "LATENCY"})
    req = compiled.create_infer_request()
    arrays = rng_arrays(np, [(B, H, Sq, D), (B, H, Sk, D), (B, H, Sk, Dv)], 1)
    for i, a in enumerate(arrays):
        req.set_input_tensor(i, ov.Tensor(a, shared_memory=True))

    keep = (core, compiled, model, arrays)  # the request needs them alive

    def call():
        req.infer()
        return keep
    info = {"note": "f32 inputs, INFERENCE_PRECISION_HINT bf16"} if storage else {}
    return [("openvino_sdpa", call, info)]


# ---------------------------------------------------------------------------
# ONNX Runtime


def onnxruntime_impls(task, threads):
    if task["op"] != "attention_forward":  # (no low-precision peer)
        return []
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper
    B, H, Hkv, Sq, Sk, D, Dv, causal = attn_dims(task["params"])
    if Hkv != H or (causal and Sq != Sk):
        return []
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3

    def session(model):
        return ort.InferenceSession(model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])

    errors = []
    # ONNX Attention-23: 4-D [B, H, S, D] inputs.
    try:
        node = helper.make_node("Attention", ["q", "k", "v"], ["o"], is_causal=int(causal))
        graph = helper.make_graph(
            [node], "attn",
            [helper.make_tensor_value_info("q", TensorProto.FLOAT, [B, H, Sq, D]),
             helper.make_tensor_value_info("k", TensorProto.FLOAT, [B, H, Sk, D]),
             helper.make_tensor_value_info("v", TensorProto.FLOAT, [B, H, Sk, Dv])],
            [helper.make_tensor_value_info("o", TensorProto.FLOAT, [B, H, Sq, Dv])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
        model.ir_version = min(model.ir_version, 10)
        sess = session(model)
        q, k, v = rng_arrays(np, [(B, H, Sq, D), (B, H, Sk, D), (B, H, Sk, Dv)], 1)
        feeds = {"q": q, "k": k, "v": v}
        return [("onnxruntime_attention", lambda: sess.run(None, feeds), {"note": "ONNX Attention-23"})]
    except Exception as e:  # noqa: BLE001 - fall back to the contrib op
        errors.append(f"Attention-23: {e}")
    try:
        attrs = {"num_heads": H}
        if causal:
            attrs["unidirectional"] = 1
        node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"],
                                domain="com.microsoft", **attrs)
        graph = helper.make_graph(
            [node], "mha",
            [helper.make_tensor_value_info("q", TensorProto.FLOAT, [B, Sq, H * D]),
             helper.make_tensor_value_info("k", TensorProto.FLOAT, [B, Sk, H * D]),
             helper.make_tensor_value_info("v", TensorProto.FLOAT, [B, Sk, H * Dv])],
            [helper.make_tensor_value_info("o", TensorProto.FLOAT, [B, Sq, H * Dv])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = min(model.ir_version, 9)
        sess = session(model)
        q, k, v = rng_arrays(np, [(B, Sq, H * D), (B, Sk, H * D), (B, Sk, H * Dv)], 1)
        feeds = {"q": q, "k": k, "v": v}
        return [("onnxruntime_attention", lambda: sess.run(None, feeds),
                 {"note": "com.microsoft MultiHeadAttention"})]
    except Exception as e:  # noqa: BLE001
        errors.append(f"MultiHeadAttention: {e}")
    raise RuntimeError("; ".join(errors))


# ---------------------------------------------------------------------------
# JAX


def jax_impls(task, threads):
    op = task["op"]
    if op not in ("attention_forward", "attention_backward"):
        return []
    import jax
    import jax.numpy as jnp
    import numpy as np
    B, H, Hkv, Sq, Sk, D, Dv, causal = attn_dims(task["params"])
    if Hkv != H or Dv != D or (causal and Sq != Sk):
        return []
    q, k, v, do = (jnp.asarray(a) for a in rng_arrays(
        np, [(B, Sq, H, D), (B, Sk, H, D), (B, Sk, H, Dv), (B, Sq, H, Dv)], 1))

    def f(q_, k_, v_):
        return jax.nn.dot_product_attention(q_, k_, v_, is_causal=causal, implementation="xla")
    if op == "attention_forward":
        fj = jax.jit(f)
        return [("jax_dpa", lambda: fj(q, k, v).block_until_ready(), {})]

    def fb(q_, k_, v_, do_):
        _, vjp = jax.vjp(f, q_, k_, v_)
        return vjp(do_)
    fbj = jax.jit(fb)
    return [("jax_dpa", lambda: jax.block_until_ready(fbj(q, k, v, do)),
             {"note": "jitted vjp, includes its forward"})]


# ---------------------------------------------------------------------------
# ggml (ggml-python: ctypes bindings to ggml's CPU backend)


class GgmlGraph:
    """One ggml context holding input tensors and the graphs built on them;
    call() runs graph i (in turn, when there are several) on `threads`
    threads."""

    def __init__(self, mem_bytes, threads):
        import ggml
        self.ggml = ggml
        self.threads = threads
        params = ggml.ggml_init_params(mem_size=int(mem_bytes) + (64 << 20), mem_buffer=None,
                                       no_alloc=False)
        self.ctx = ggml.ggml_init(params)
        if not self.ctx:
            raise RuntimeError("ggml_init failed")
        self.graphs = []
        self.next = 0

    def tensor(self, gtype, ne, values=None):
        """A new tensor of ggml type `gtype` and shape ne (ggml order, the
        fastest first), filled from `values` (numpy, shape reversed)."""
        from ggml import utils
        t = self.ggml.ggml_new_tensor(self.ctx, gtype, len(ne), (ctypes.c_int64 * len(ne))(*ne))
        if values is not None:
            utils.to_numpy(t)[...] = values
        return t

    def add_graph(self, out):
        """A graph computing `out`, planned once with its own work buffer
        (ggml_graph_compute_with_ctx would take a new work buffer from the
        context at every call, until the context's pool runs out)."""
        gf = self.ggml.ggml_new_graph(self.ctx)
        self.ggml.ggml_build_forward_expand(gf, out)
        plan = self.ggml.ggml_graph_plan(gf, self.threads)
        work = ctypes.create_string_buffer(max(1, int(plan.work_size)))
        plan.work_data = ctypes.cast(work, ctypes.POINTER(ctypes.c_ubyte))
        self.graphs.append((gf, plan, work))

    def call(self):
        gf, plan, _ = self.graphs[self.next]
        self.next = (self.next + 1) % len(self.graphs)
        self.ggml.ggml_graph_compute(gf, ctypes.byref(plan))
        return self

    def __del__(self):
        if getattr(self, "ctx", None):
            self.ggml.ggml_free(self.ctx)


def q8_0_bytes(np, x):
    """ggml's q8_0 blocks of x (rows of a multiple of 32 values): per 32 values an f16 scale
    d = max|x| / 127 and the codes round(x / d) as int8 (ggml's quantize_row_q8_0)."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    d = np.abs(blocks).max(axis=1) / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    codes = np.rint(blocks * inv[:, None]).astype(np.int8)
    out = np.empty((blocks.shape[0], 34), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = codes.view(np.uint8)
    return out.tobytes()


def ggml_kv_tensor(g, kv_type, ne, values):
    """A K or V tensor of type f32, f16 or q8_0 holding `values` (numpy, shape reversed)."""
    import numpy as np
    ggml = g.ggml
    if kv_type == ggml.GGML_TYPE_Q8_0:
        t = g.tensor(kv_type, ne)
        data = q8_0_bytes(np, values)
        if len(data) != ggml.ggml_nbytes(t):
            raise RuntimeError(f"q8_0: {len(data)} bytes for a tensor of {ggml.ggml_nbytes(t)}")
        ctypes.memmove(ggml.ggml_get_data(t), data, len(data))
        return t
    np_type = np.float16 if kv_type == ggml.GGML_TYPE_F16 else np.float32
    return g.tensor(kv_type, ne, values.astype(np_type))


def ggml_impls(task, threads):
    """ggml_flash_attn_ext with f32 and with f16 K and V (forward, decode),
    ggml_rope_ext (NeoX) and ggml_swiglu."""
    import numpy as np
    import ggml
    op, storage = split_op(task["op"])
    p = task["params"]
    F32, F16 = ggml.GGML_TYPE_F32, ggml.GGML_TYPE_F16
    impls = []
    # K/V types: f32 and f16 beside tandem's f32; f16 (the same bytes) beside its bf16; q8_0
    # (int8 codes, an f16 scale per 32) beside its int8
    kv_types = {None: ((F32, "ggml_fa_f32", 4.0), (F16, "ggml_fa_f16", 2.0)),
                "bf16": ((F16, "ggml_fa_f16", 2.0),),
                "int8": ((ggml.GGML_TYPE_Q8_0, "ggml_fa_q8_0", 34 / 32),)}.get(storage, ())
    if op in ("attention_forward", "decode") and kv_types and (op == "decode" or storage != "int8"):
        B, H, Hkv, Sq, Sk, D, Dv, causal = attn_dims(p)
        for kv_type, name, width in kv_types:
            caches = decode_caches(p, width) if op == "decode" else 1
            kv_bytes = math.ceil(caches * B * Hkv * Sk * (D + Dv) * width)
            # per cache: K, V, an output and a graph (its nodes' metadata lives in the context too)
            per_cache = 4 * B * H * Sq * Dv + ggml.ggml_graph_overhead() + 4 * ggml.ggml_tensor_overhead()
            g = GgmlGraph(4 * B * H * Sq * (D + Dv) + kv_bytes + caches * per_cache + 2 * Sk * (Sq + 64)
                          + (8 << 20), threads)
            q, = rng_arrays(np, [(B, H, Sq, D)], 1)
            qt = g.tensor(F32, (D, Sq, H, B), q)
            mask = None
            if causal:  # f16 additive mask [Sk, Sq padded], bottom-right aligned as tandem's
                pad = (Sq + 63) // 64 * 64
                i = np.arange(pad)[:, None] + max(Sk - Sq, 0)
                m = np.where(np.arange(Sk)[None, :] > i, -np.inf, 0.0).astype(np.float16)
                mask = g.tensor(F16, (Sk, pad), m)
            for c in range(caches):
                k, v = rng_arrays(np, [(B, Hkv, Sk, D), (B, Hkv, Sk, Dv)], 2 + 2 * c)
                kt = ggml_kv_tensor(g, kv_type, (D, Sk, Hkv, B), k)
                vt = ggml_kv_tensor(g, kv_type, (Dv, Sk, Hkv, B), v)
                out = ggml.ggml_flash_attn_ext(g.ctx, qt, kt, vt, mask, 1.0 / math.sqrt(D), 0.0, 0.0)
                ggml.ggml_flash_attn_ext_set_prec(out, ggml.GGML_PREC_F32)
                g.add_graph(out)
            note = {F32: "f32", F16: "K and V in f16"}.get(kv_type, "K and V in q8_0")
            one = B * Hkv * Sk * (D + Dv) * width
            impls.append((name, g.call, {"note": note, "kv_bytes": one}))
    elif op == "rope_forward":
        B, S, H, D = (int(p[k]) for k in ("B", "S", "H", "D"))
        x, = rng_arrays(np, [(B, S, H, D)], 5)
        g = GgmlGraph(2 * 4 * x.size + 4 * S, threads)
        xt = g.tensor(F32, (D, H, S, B), x)
        pos = g.tensor(ggml.GGML_TYPE_I32, (S,), np.arange(S, dtype=np.int32))
        out = ggml.ggml_rope_ext(g.ctx, xt, pos, None, D, ggml.GGML_ROPE_TYPE_NEOX, 0, 10000.0, 1.0,
                                 0.0, 1.0, 0.0, 0.0)
        g.add_graph(out)
        impls.append(("ggml", g.call, {"note": "angles computed on the fly"}))
    elif op == "swiglu_forward":
        rows, n = int(p["rows"]), int(p["n"])
        x, = rng_arrays(np, [(rows, 2 * n)], 9, -4, 4)
        g = GgmlGraph(4 * x.size + 4 * rows * n, threads)
        xt = g.tensor(F32, (2 * n, rows), x)
        g.add_graph(ggml.ggml_swiglu(g.ctx, xt))  # silu(first half)·second half
        impls.append(("ggml", g.call, {}))
    return impls


IMPLS = {"torch": torch_impls, "openvino": openvino_impls, "onnxruntime": onnxruntime_impls,
         "jax": jax_impls, "ggml": ggml_impls}


# ---------------------------------------------------------------------------
# Worker: one library, one thread count


def flops_or_bytes(task, seconds, info):
    """The rates of one call of `seconds`; a decode counts the bytes of K and V the peer
    stores (`kv_bytes` of its info, else the plan's f32 bytes)."""
    p = task["params"]
    r = {}
    if task["op"].startswith("decode"):
        r["GB/s"] = info.get("kv_bytes", p.get("bytes", 0)) / seconds / 1e9
        r["GFLOP/s"] = p["flop"] / seconds / 1e9
    elif "flop" in p:
        r["GFLOP/s"] = p["flop"] / seconds / 1e9
    elif "bytes" in p:
        r["GB/s"] = p["bytes"] / seconds / 1e9
    return r


def measure_task(fn, ours, min_time, rounds, want_mem, share=1.0):
    """The record's timing fields: paired with tandem's call `ours` where there is one (the
    peer's and tandem's seconds per call in each round, their medians; `share` of min_time,
    the visit's part of the rounds), else the peer alone."""
    if ours is None or rounds < 2:
        sec, reps, extra = measure(fn, min_time, want_mem)
        return {"seconds": sec, "reps": reps}, sec, extra
    extra = None
    if want_mem:  # the peer's first call alone, before the paired rounds
        _, _, extra = measure(fn, 0.0, True)
    mine, theirs = measure_paired(ours, fn, min_time * share, rounds)
    sec = sorted(theirs)[len(theirs) // 2]
    return ({"seconds": sec, "rounds": rounds, "peer_rounds_s": theirs,
             "tandem_rounds_s": mine, "tandem_seconds": sorted(mine)[len(mine) // 2]},
            sec, extra)


def worker(lib, threads, tasks, out_path, min_time, deadline, memory, rounds, share):
    version = library_version_inproc(lib)
    with open(out_path, "a") as out:
        for task in tasks:
            base = {"op": task["op"], "shape": task["shape"], "threads": threads, "library": lib,
                    "version": version, "tandem_name": task["name"]}
            if time.time() > deadline:
                out.write(json.dumps({**base, "peer": lib, "error": "skipped: peer time budget spent"}) + "\n")
                out.flush()
                continue
            try:
                impls = IMPLS[lib](task, threads)
            except Exception as e:  # noqa: BLE001 - report and go on
                out.write(json.dumps({**base, "peer": lib, "error": f"{type(e).__name__}: {e}"[:400]}) + "\n")
                out.flush()
                continue
            partner_error = None
            try:
                ours = tandem_partner(task, threads) if rounds >= 2 else None
            except Exception as e:  # noqa: BLE001 - time the peer alone; --strict fails
                partner_error = f"{type(e).__name__}: {e}"[:400]
                log(f"  tandem beside {lib} on {task['op']}/{task['shape']}: {partner_error}"[:200])
                ours = None
            for peer, fn, info in impls:
                rec = {**base, "peer": peer, **info}
                if partner_error:
                    rec["tandem_error"] = partner_error
                if time.time() > deadline:
                    rec["error"] = "skipped: peer time budget spent"
                else:
                    try:
                        want_mem = memory and task["op"] == "attention_forward" and lib == "torch"
                        timing, sec, extra = measure_task(fn, ours, min_time, rounds, want_mem,
                                                          share)
                        rec.update({**timing, **flops_or_bytes(task, sec, info)})
                        if extra is not None:
                            p = task["params"]
                            out_bytes = 4 * p["B"] * p["H"] * p["Sq"] * p["Dv"]
                            rec["extra_MiB"] = max(0.0, extra - out_bytes) / 2**20
                        paired = (f" (tandem {timing['tandem_seconds'] * 1e3:.2f} ms, paired)"
                                  if "tandem_seconds" in timing else "")
                        log(f"  {peer:22s} {task['op']}/{task['shape']} t={threads}: {sec*1e3:9.2f} ms"
                            + paired)
                    except Exception as e:  # noqa: BLE001
                        rec["error"] = f"{type(e).__name__}: {e}"[:400]
                        log(f"  {peer:22s} {task['op']}/{task['shape']} t={threads}: failed ({rec['error'][:120]})")
                out.write(json.dumps(rec) + "\n")
                out.flush()
            del impls, ours


def library_version_inproc(lib):
    try:
        if lib == "torch":
            import torch
            return torch.__version__
        if lib == "openvino":
            import openvino as ov
            return ov.get_version()
        if lib == "onnxruntime":
            import onnxruntime
            return onnxruntime.__version__
        if lib == "jax":
            import jax
            return jax.__version__
        if lib == "ggml":
            import importlib.metadata
            return "ggml-python " + importlib.metadata.version("ggml-python")
    except Exception:  # noqa: BLE001
        return None
    return None


def limit_threads_env(threads):
    """Environment and affinity for a worker restricted to `threads` cores."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    # XLA sizes its CPU thread pool by the schedulable CPUs (the worker's affinity).
    if threads == 1:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return env


# ---------------------------------------------------------------------------
# Driver


def first_visit(r):
    """merge_visits' record of `r`, the first visit that measured it (or failed)."""
    rec = dict(r, visits=0 if "error" in r else 1)
    if "peer_rounds_s" in r:
        rec["visit_rounds"] = [len(r["peer_rounds_s"])]
    return rec


def merge_visits(by_visit):
    """One record per (op, shape, threads, peer) from the records of every visit: the
    paired rounds of the visits concatenated (peer_rounds_s, tandem_rounds_s; visit_rounds
    says how many came from each visit, in order), their medians as seconds and
    tandem_seconds, the first visit's other fields (its extra memory, its rates recomputed
    by the caller from seconds), `visits` the number merged.
    A measurement that failed in one visit keeps the other's; failed in all, the first
    error."""
    merged, order = {}, []
    for records in by_visit:
        for r in records:
            key = (r.get("op"), r.get("shape"), r.get("threads"), r.get("peer"))
            if key not in merged:
                merged[key] = first_visit(r)
                order.append(key)
                continue
            m = merged[key]
            if "error" in r:
                continue
            if "error" in m:
                merged[key] = first_visit(r)
                continue
            m["visits"] += 1
            for field in ("peer_rounds_s", "tandem_rounds_s"):
                if field in m and field in r:
                    m[field] = list(m[field]) + list(r[field])
            if "visit_rounds" in m and "peer_rounds_s" in r:
                m["visit_rounds"] = list(m["visit_rounds"]) + [len(r["peer_rounds_s"])]
            if "peer_rounds_s" in m and "tandem_rounds_s" in m:
                scale = median(m["peer_rounds_s"]) / m["seconds"] if m.get("seconds") else 1.0
                m["seconds"] = median(m["peer_rounds_s"])
                m["tandem_seconds"] = median(m["tandem_rounds_s"])
                m["rounds"] = len(m["peer_rounds_s"])
                for rate in ("GFLOP/s", "GB/s"):
                    if m.get(rate):
                        m[rate] = m[rate] / scale
    return [merged[k] for k in order]


def median(x):
    x = sorted(x)
    return x[len(x) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", help="tandem_bench --plan output (JSON)")
    ap.add_argument("--out", help="where to write the peer results (JSON)")
    ap.add_argument("--peers", default=",".join(LIBRARIES),
                    help="libraries to try (default: %(default)s)")
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per measurement")
    ap.add_argument("--budget", type=float, default=600.0,
                    help="seconds for all peers together; later measurements are skipped")
    ap.add_argument("--rounds", type=int, default=7,
                    help="alternating rounds of tandem and the peer where tandem's package is "
                         "importable (0: the peer alone)")
    ap.add_argument("--visits", type=int, default=1, choices=range(1, 65), metavar="V",
                    help="worker processes per peer, each with part of the rounds and of "
                         "--min-time (merged)")
    ap.add_argument("--list", action="store_true", help="print which peers are importable")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tasks", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--share", type=float, default=1.0, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        if args.threads and hasattr(os, "sched_setaffinity"):
            cpus = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, set(cpus[: args.threads]))
        with open(args.tasks) as f:
            tasks = json.load(f)
        worker(args.worker, args.threads, tasks, args.out, args.min_time, args.deadline,
               args.memory, args.rounds, args.share)
        return 0

    if args.list:
        avail = list_peers()
        print(json.dumps(avail, indent=1))
        return 0

    if not args.plan or not args.out:
        ap.error("--plan and --out are required (or --list)")
    with open(args.plan) as f:
        plan = json.load(f)
    wanted = [p for p in args.peers.split(",") if p]
    versions = {lib: library_version(lib) for lib in wanted}
    for lib, v in versions.items():
        log(f"peers: {lib}: {v if v else 'not installed'}")

    # One task per distinct (op, shape, threads) tagged peer; a benchmark of several storage
    # types (tagged stored) gives one task per low-precision op its peers have.
    tasks, seen = [], set()
    for b in plan["benchmarks"]:
        if "peer" not in b["tags"] or b["backend"] == "probe":
            continue
        for t in ([dict(b, op=op) for op in STORED_PEER_OPS.get(b["op"], ())]
                  if "stored" in b["tags"] else [b]):
            key = (t["op"], t["shape"], t["threads"])
            if key not in seen:
                seen.add(key)
                tasks.append(t)
    # The shapes the report's targets name first, then the rest from small to large,
    # so a spent budget costs the least important measurements.
    first = {"B1_H8_S4096_D128_causal": 0, "B1_H8_S4096_D128": 1, "B1_H8_S2048_D128": 2}
    tasks.sort(key=lambda t: (first.get(t["shape"], 3), t["params"].get("flop", t["params"].get("bytes", 0))))
    by_threads = {}
    for t in tasks:
        by_threads.setdefault(t["threads"], []).append(t)

    results = []
    tmpdir = os.path.dirname(os.path.abspath(args.out))
    start = time.time()
    deadline = start + args.budget
    main_threads = plan.get("threads")
    groups = [(lib, th) for th in sorted(by_threads, key=lambda t: (t != main_threads, -t))
              for lib in wanted if versions.get(lib)]

    def visit_tasks(vi, th):
        # later visits add rounds to the paired measurements only (merge_visits)
        return by_threads[th] if vi == 0 else [t for t in by_threads[th] if pairable(t)]

    def weight(vi, lib, th):
        # torch measures two implementations of most ops and every op; the others attention only.
        w = 2.0 if lib == "torch" else 0.6
        return w * len(visit_tasks(vi, th)) * (1.0 if th == main_threads else 0.5)
    # With --visits V each group's paired measurements are taken in V visits, each its own
    # worker process, each after every group's previous one (minutes later), each with part
    # of the rounds and the same part of --min-time (so a round lasts as long whatever V;
    # the unpaired ones are measured in the first visit only): a peer's speed moves
    # between processes (thread placement, allocation) by more than within one, and the
    # merged rounds' spread then holds that move (merge_visits).
    visits = visit_rounds(args.rounds, args.visits)
    schedule = [(v, g) for v in range(len(visits)) for g in groups if visit_tasks(v, g[1])]
    by_visit = []
    for si, (vi, (lib, th)) in enumerate(schedule):
        ts = visit_tasks(vi, th)
        share = weight(vi, lib, th) / sum(weight(v, *g) for v, g in schedule[si:])
        left = max(0.0, deadline - time.time())
        group_deadline = time.time() + share * left
        log(f"peers: [{si + 1}/{len(schedule)}] {lib} with {th} thread(s), visit {vi + 1} of "
            f"{len(visits)} ({visits[vi]} rounds): {len(ts)} shape(s), "
            f"{share * left:.0f} s of the {left:.0f} s peer budget left")
        task_file = os.path.join(tmpdir, f".peer-tasks-{lib}-{th}.json")
        part_file = os.path.join(tmpdir, f".peer-results-{lib}-{th}.jsonl")
        with open(task_file, "w") as f:
            json.dump(ts, f)
        if os.path.exists(part_file):
            os.remove(part_file)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", lib, "--threads", str(th),
               "--tasks", task_file, "--out", part_file,
               "--min-time", str(args.min_time), "--share", str(visits[vi] / sum(visits)),
               "--deadline", str(group_deadline), "--rounds", str(visits[vi])]
        if vi == 0:
            cmd.append("--memory")
        try:
            proc = subprocess.run(cmd, env=limit_threads_env(th),
                                  timeout=max(60.0, group_deadline - time.time() + 120))
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        got = []
        if os.path.exists(part_file):
            with open(part_file) as f:
                got = [json.loads(line) for line in f if line.strip()]
            os.remove(part_file)
        os.remove(task_file)
        if rc != 0:
            log(f"peers: {lib} worker ended with {rc}; {len(got)} result(s) kept")
            results.append({"library": lib, "threads": th, "peer": lib,
                            "error": f"worker exited with {rc} after {len(got)} result(s)"})
        by_visit.append(got)
    results.extend(merge_visits(by_visit))

    tandem_version = None
    try:
        import tandem
        tandem_version = tandem.__version__
    except Exception:  # noqa: BLE001 - timed alone, unpaired
        pass
    doc = {"versions": versions, "tandem_paired": tandem_version, "rounds": args.rounds,
           "missing": [lib for lib in wanted if not versions.get(lib)],
           "install": "make peers",
           "pip": {lib: PIP_NAMES[lib] for lib in wanted},
           "results": results,
           "seconds": time.time() - start}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
