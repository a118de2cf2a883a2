# SPDX-License-Identifier: Apache-2.0
"""tandem's kernels on NumPy arrays and PyTorch tensors.

Each function reads its keyword arguments into the op's Params (the one
place per op that maps Python arguments to the C++ API), allocates outputs
of the caller's kind and calls tandem._ext, which makes the plan (validating
the call), checks every array against it without copying, and runs the
kernel with the GIL released. float32 runs `backend`; float64 runs the
reference in double whatever `backend` says.
"""

from . import _arrays as A
from . import _ext
from ._errors import Error

__all__ = [
    "attention", "attention_backward", "attention_forward_lse", "attention_backward_saved",
    "rope", "rope_backward", "axial_rope", "axial_rope_backward", "swiglu",
    "swiglu_backward", "attention_block",
]

_LAYOUTS = {"bshd": _ext.Layout.bshd, "bhsd": _ext.Layout.bhsd}
_MASKS = {"none": _ext.MaskKind.none, "causal": _ext.MaskKind.causal,
          "sliding_window": _ext.MaskKind.sliding_window}
_STYLES = {"neox": _ext.RopeStyle.neox, "gptj": _ext.RopeStyle.gptj}
_TABLE_ROWS = {"position": _ext.TableRows.position, "token": _ext.TableRows.token}


def _choice(name, value, table):
    try:
        return table[value]
    except (KeyError, TypeError):
        raise Error(f"{name} = {value!r} must be one of {', '.join(table)}", name) from None


# ---------------------------------------------------------------------------
# Attention


class _AttentionCall:
    """An attention call read from Python arguments: the Params, the input
    arrays (q, k, v as rank-4 views of the caller's memory where possible;
    the mask as float32), and how to give outputs back in the caller's rank."""

    def __init__(self, q, k, v, layout="bshd", num_heads=None, mask=None, window=None,
                 scale=None, softcap=0.0, bias=None, key_padding=None):
        q, k, v = A.as_array(q, "q"), A.as_array(k, "k"), A.as_array(v, "v")
        A.same_dtype("k", k, "q", q)
        A.same_dtype("v", v, "q", q)
        self.like = q
        self.shapes = {"q": tuple(q.shape), "k": tuple(k.shape), "v": tuple(v.shape)}
        L = _choice("layout", layout, _LAYOUTS)
        self.rank = q.ndim
        if q.ndim != 4:
            q, k, v = self._to_rank4(q, k, v, layout, num_heads)
        for name, x in (("k", k), ("v", v)):
            if x.ndim != q.ndim:
                raise Error(f"{name}.shape = {list(x.shape)} must have the rank of q.shape = "
                            f"{list(q.shape)}", f"{name}.shape")
        s_ax, h_ax = (1, 2) if L == _ext.Layout.bshd else (2, 1)
        p = _ext.AttentionParams()
        p.layout = L
        p.batch, p.seq_q, p.heads, p.head_dim = q.shape[0], q.shape[s_ax], q.shape[h_ax], q.shape[3]
        p.seq_k, p.kv_heads, p.v_head_dim = k.shape[s_ax], k.shape[h_ax], v.shape[3]
        if num_heads is not None and num_heads != p.heads:
            raise Error(f"num_heads = {num_heads} must be q's head count {p.heads} "
                        f"(q.shape = {list(q.shape)}, layout {layout})", "num_heads")
        if p.heads < 1 or p.kv_heads < 1 or p.head_dim < 1 or p.v_head_dim < 1:
            raise Error(f"q.shape = {list(q.shape)}, k.shape = {list(k.shape)}, v.shape = "
                        f"{list(v.shape)} must have no empty head axis", "q.shape")
        q, p.q_row_stride = self._rows(q, L, p.heads, p.head_dim)
        k, p.k_row_stride = self._rows(k, L, p.kv_heads, p.head_dim)
        v, p.v_row_stride = self._rows(v, L, p.kv_heads, p.v_head_dim)
        if scale is not None:
            p.scale = float(scale)
        p.softcap = float(softcap or 0.0)
        self.inputs = {"q": q, "k": k, "v": v, "mask": self._mask(p, mask, window, bias,
                                                                  key_padding)}
        self.params = p

    @staticmethod
    def _to_rank4(q, k, v, layout, num_heads):
        """[B, S, H*D] or [S, H*D] (bshd) as [B, S, H, D] views."""
        if q.ndim not in (2, 3):
            raise Error(f"q.shape = {list(q.shape)} must have rank 2, 3 or 4", "q.shape")
        if layout != "bshd":
            raise Error(f"layout = {layout!r} must be 'bshd' for rank-{q.ndim} tensors", "layout")
        if num_heads is None:
            raise Error(f"num_heads = None must be given for rank-{q.ndim} q "
                        f"(q.shape = {list(q.shape)})", "num_heads")
        if q.ndim == 2:
            q, k, v = q[None], k[None] if k.ndim == 2 else k, v[None] if v.ndim == 2 else v
        if q.shape[-1] % num_heads:
            raise Error(f"q.shape = {list(q.shape)} must have a last dim divisible by "
                        f"num_heads = {num_heads}", "q.shape")
        D = q.shape[-1] // num_heads
        if D < 1 or k.ndim != 3 or k.shape[-1] % D:
            raise Error(f"k.shape = {list(k.shape)} must be [B, Sk, Hkv*{D}]", "k.shape")
        Hkv = k.shape[-1] // D
        if v.ndim != 3 or Hkv < 1 or v.shape[-1] % Hkv:
            raise Error(f"v.shape = {list(v.shape)} must be [B, Sk, {Hkv}*Dv]", "v.shape")
        return (q.reshape(q.shape[0], q.shape[1], num_heads, D),
                k.reshape(k.shape[0], k.shape[1], Hkv, D),
                v.reshape(v.shape[0], v.shape[1], Hkv, v.shape[-1] // Hkv))

    @staticmethod
    def _rows(x, layout, heads, width):
        """x itself and its row stride when the kernels can read it in place
        (bshd rows evenly spaced, or bhsd contiguous), else a contiguous copy."""
        if x.ndim == 4 and 0 not in x.shape:
            if layout == _ext.Layout.bshd and x.shape[2] == heads and x.shape[3] == width:
                rs = A.row_stride(x, heads, width)
                if rs is not None:
                    return x, rs
            elif A.is_contiguous(x):
                return x, 0
        return A.contiguous(x), 0

    @staticmethod
    def _mask(p, mask, window, bias, key_padding):
        """Sets p.mask (and window, bias broadcast) and returns the float32 mask."""
        given = [n for n, x in (("bias", bias), ("key_padding", key_padding)) if x is not None]
        if mask is None:
            mask = "sliding_window" if window is not None else "none"
        if len(given) > 1 or (given and mask != "none"):
            raise Error(f"{given[-1]}: give one of mask={mask!r}, bias, key_padding "
                        "(tandem applies one mask kind per call)", given[-1])
        if key_padding is not None:
            p.mask = _ext.MaskKind.key_padding
            return A.to_float32(key_padding, "key_padding")
        if bias is not None:
            m = A.to_float32(bias, "bias")
            if m.ndim == 2:
                m = m.reshape(1, 1, *m.shape)
            if m.ndim != 4:
                raise Error(f"bias.shape = {list(m.shape)} must be [Bb, Hb, Sq, Sk] or [Sq, Sk]",
                            "bias.shape")
            p.mask = _ext.MaskKind.bias
            p.bias_batch, p.bias_heads = m.shape[0], m.shape[1]
            return m
        p.mask = _choice("mask", mask, _MASKS)
        if window is not None:
            p.window = int(window)
        return None

    def out_shape(self, S, heads, width):
        p = self.params
        if p.layout == _ext.Layout.bshd:
            return (p.batch, S, heads, width)
        return (p.batch, heads, S, width)

    def empty(self, S, heads, width):
        return A.empty(self.like, self.out_shape(S, heads, width))

    def back(self, x, name):
        """A gradient (rank 4) in the shape of the caller's input `name`."""
        return x if x is None or self.rank == 4 else x.reshape(self.shapes[name])

    def out_back(self, out):
        """out [B, Sq, H, Dv] in the caller's rank."""
        if self.rank == 4:
            return out
        return out.reshape(*self.shapes["q"][:-1], self.params.heads * self.params.v_head_dim)

    def dout(self, dout):
        d = A.as_array(dout, "dout")
        A.same_dtype("dout", d, "q", self.like)
        shape = self.out_shape(self.params.seq_q, self.params.heads, self.params.v_head_dim)
        if self.rank != 4:
            if d.size != self.params.batch * self.params.seq_q * self.params.heads * \
                    self.params.v_head_dim:
                raise Error(f"dout.shape = {list(d.shape)} must have the shape of out", "dout")
            d = d.reshape(shape)
        return d if A.is_contiguous(d) else A.contiguous(d)


def attention(q, k, v, *, layout="bshd", num_heads=None, mask=None, window=None, scale=None,
              softcap=0.0, bias=None, key_padding=None, backend="optimized"):
    """Scaled dot-product attention (SPEC §2): out [B, Sq, H, Dv] (bshd) or
    [B, H, Sq, Dv] (bhsd).

    q [B,Sq,H,D], k [B,Sk,Hkv,D], v [B,Sk,Hkv,Dv] in `layout` (rank 3
    [B,S,H*D] and rank 2 [S,H*D] are bshd and need `num_heads`); Hkv divides
    H (query head h reads kv head h // (H/Hkv)). `mask`: "none", "causal" or
    "sliding_window" (keys a-window..a, a = i + max(Sk-Sq, 0)); or an additive
    `bias` [Bb, Hb, Sq, Sk] (Bb in {1, B}, Hb in {1, H}; -inf hides a key);
    or `key_padding` [B, Sk] (nonzero = attend). `scale` defaults to
    1/sqrt(D); `softcap` c > 0 caps scores to c*tanh(s/c). A query that sees
    no key gets 0. NumPy in, NumPy out; torch in, torch out."""
    call = _AttentionCall(q, k, v, layout, num_heads, mask, window, scale, softcap, bias,
                          key_padding)
    p = call.params
    out = call.empty(p.seq_q, p.heads, p.v_head_dim)
    _ext.attention_forward(backend, p, call.inputs, out, None)
    return call.out_back(out)


def attention_forward_lse(q, k, v, **kwargs):
    """attention() and the log-sum-exp lse [B, H, Sq] that
    attention_backward_saved starts from (lse_i = log sum_j exp(s_ij) over
    the visible keys; -inf for a query that sees none). Returns (out, lse)."""
    backend = kwargs.pop("backend", "optimized")
    call = _AttentionCall(q, k, v, **kwargs)
    p = call.params
    out = call.empty(p.seq_q, p.heads, p.v_head_dim)
    lse = A.empty(call.like, (p.batch, p.heads, p.seq_q))
    _ext.attention_forward(backend, p, call.inputs, out, lse)
    return call.out_back(out), lse


def _grads(call, want):
    p = call.params
    shapes = {"dq": (p.seq_q, p.heads, p.head_dim), "dk": (p.seq_k, p.kv_heads, p.head_dim),
              "dv": (p.seq_k, p.kv_heads, p.v_head_dim)}
    for name in want:
        if name not in shapes:
            raise Error(f"grads = {tuple(want)!r} may name only dq, dk, dv", "grads")
    return {name: call.empty(*shapes[name]) if name in want else None for name in shapes}


def _grads_back(call, g):
    return tuple(call.back(g[n], n[1]) for n in ("dq", "dk", "dv"))


def attention_backward(q, k, v, dout, *, grads=("dq", "dk", "dv"), backend="optimized",
                       **kwargs):
    """The gradients of attention() for the loss <dout, out>: (dq, dk, dv),
    each of its input's shape; only those named in `grads` are computed (the
    others are None). Keyword arguments as for attention()."""
    call = _AttentionCall(q, k, v, **kwargs)
    g = _grads(call, grads)
    _ext.attention_backward(backend, call.params, call.inputs, call.dout(dout), g["dq"], g["dk"],
                            g["dv"])
    return _grads_back(call, g)


def attention_backward_saved(q, k, v, out, lse, dout, *, backend="optimized", **kwargs):
    """(dq, dk, dv) from the forward's saved out and lse
    (attention_forward_lse), without running the forward again."""
    call = _AttentionCall(q, k, v, **kwargs)
    g = _grads(call, ("dq", "dk", "dv"))
    saved_out = call.dout(out)
    lse = A.as_array(lse, "lse")
    _ext.attention_backward_saved(backend, call.params, call.inputs, saved_out,
                                  lse if A.is_contiguous(lse) else A.contiguous(lse),
                                  call.dout(dout), g["dq"], g["dk"], g["dv"])
    return _grads_back(call, g)


# ---------------------------------------------------------------------------
# RoPE, axial RoPE, SwiGLU


def _rope(src, cos, sin, head_dim, n_rot, style, table_rows, backend, backward):
    name = "dy" if backward else "x"
    src = A.as_array(src, name)
    cos, sin = A.as_array(cos, "cos"), A.as_array(sin, "sin")
    A.same_dtype("cos", cos, name, src)
    A.same_dtype("sin", sin, name, src)
    x3, rs = A.rows_view(src, name)
    p = _ext.RopeParams()
    p.batch, p.seq, p.width = x3.shape
    if head_dim is None:
        if src.ndim < 4:
            raise Error(f"head_dim = None must be given for {name}.shape = {list(src.shape)} "
                        "(rank < 4)", "head_dim")
        head_dim = src.shape[-1]
    p.head_dim = int(head_dim)
    if n_rot is not None:
        p.n_rot = int(n_rot)
    p.style = _choice("style", style, _STYLES)
    if cos.ndim != 2 or tuple(sin.shape) != tuple(cos.shape):
        raise Error(f"cos.shape = {list(cos.shape)}, sin.shape = {list(sin.shape)} must both "
                    "be [R, T]", "cos.shape")
    p.table_rows, p.table_stride = cos.shape
    if table_rows is None:
        table_rows = "token" if p.table_rows == p.batch * p.seq and p.batch > 1 else "position"
    p.rows = _choice("table_rows", table_rows, _TABLE_ROWS)
    p.src_row_stride = rs
    out = A.empty(src, x3.shape)
    _ext.rope(backend, p, x3, A.contiguous(cos), A.contiguous(sin), out, backward)
    return out.reshape(src.shape)


def rope(x, cos, sin, *, head_dim=None, n_rot=None, style="neox", table_rows=None,
         backend="optimized"):
    """Rotary position embedding (SPEC §4) of x [..., S, W] (W/head_dim heads
    per row; head_dim defaults to x's last dim when x has rank >= 4), with
    tables cos, sin [R, T]: pair i < n_rot/2 of every head, (i, i + n_rot/2)
    for style "neox" or (2i, 2i+1) for "gptj", rotates by the angle whose cos
    and sin are row r, column i of the tables; r is the position s
    (table_rows "position") or the token index b*S + s ("token")."""
    return _rope(x, cos, sin, head_dim, n_rot, style, table_rows, backend, False)


def rope_backward(dy, cos, sin, *, head_dim=None, n_rot=None, style="neox", table_rows=None,
                  backend="optimized"):
    """The gradient of rope(): dy rotated by minus the angle (the transpose)."""
    return _rope(dy, cos, sin, head_dim, n_rot, style, table_rows, backend, True)


def _axial_rope(src, num_heads, end_x, end_y, theta, repeat_factor, backend, backward):
    name = "dy" if backward else "x"
    src = A.as_array(src, name)
    x3, rs = A.rows_view(src, name)
    p = _ext.AxialRopeParams()
    p.batch, p.seq, p.width = x3.shape
    p.num_heads, p.end_x, p.end_y = int(num_heads), int(end_x), int(end_y)
    p.theta, p.repeat_factor, p.src_row_stride = float(theta), int(repeat_factor), rs
    out = A.empty(src, x3.shape)
    _ext.axial_rope(backend, p, x3, out, backward)
    return out.reshape(src.shape)


def axial_rope(x, *, end_x, end_y, num_heads=1, theta=10000.0, repeat_factor=1,
               backend="optimized"):
    """Axial 2-D RoPE (SPEC §5) of x [..., S, W], S = repeat_factor*end_x*end_y,
    heads of width W/num_heads (divisible by 4)."""
    return _axial_rope(x, num_heads, end_x, end_y, theta, repeat_factor, backend, False)


def axial_rope_backward(dy, *, end_x, end_y, num_heads=1, theta=10000.0, repeat_factor=1,
                        backend="optimized"):
    """The gradient of axial_rope() (the transpose)."""
    return _axial_rope(dy, num_heads, end_x, end_y, theta, repeat_factor, backend, True)


def _swiglu_params(x, gate_first):
    if x.ndim < 1 or x.shape[-1] < 2 or x.shape[-1] % 2:
        raise Error(f"x.shape = {list(x.shape)} must have an even, non-zero last dim (2n)",
                    "x.shape")
    p = _ext.SwigluParams()
    p.n = x.shape[-1] // 2
    p.rows = x.size // (2 * p.n) if not A.is_torch(x) else x.numel() // (2 * p.n)
    p.gate_first = bool(gate_first)
    return p


def swiglu(x, *, gate_first=True, backend="optimized"):
    """SwiGLU (SPEC §6): x [..., 2n] -> silu(g)*u [..., n], the gate g the
    first half of the last axis (gate_first) or the second."""
    x = A.as_array(x, "x")
    p = _swiglu_params(x, gate_first)
    out = A.empty(x, (p.rows, p.n))
    _ext.swiglu_forward(backend, p, A.contiguous(x).reshape(p.rows, 2 * p.n), out)
    return out.reshape(*x.shape[:-1], p.n)


def swiglu_backward(x, dy, *, gate_first=True, backend="optimized"):
    """dx [..., 2n], the gradient of swiglu() at x for dy [..., n]."""
    x, dy = A.as_array(x, "x"), A.as_array(dy, "dy")
    A.same_dtype("dy", dy, "x", x)
    p = _swiglu_params(x, gate_first)
    dx = A.empty(x, (p.rows, 2 * p.n))
    _ext.swiglu_backward(backend, p, A.contiguous(x).reshape(p.rows, 2 * p.n),
                         A.contiguous(dy).reshape(p.rows, p.n) if dy.ndim else dy, dx)
    return dx.reshape(x.shape)


def attention_block(x, w_qkv, w_out, *, num_heads, b_qkv=None, b_out=None, key_padding=None,
                    cos=None, sin=None, backend="optimized"):
    """The fused attention block (SPEC §7), float32: x [B, S, E],
    w_qkv [3E, E] (rows q, k, v), w_out [E, E], optional b_qkv [3E],
    b_out [E], key_padding [B, S] (nonzero = attend), NeoX RoPE tables
    cos, sin [R, T] applied to q and k. Returns [B, S, E]."""
    x = A.as_array(x, "x")
    inputs = {"x": A.contiguous(x)}
    for name, a in (("w_qkv", w_qkv), ("w_out", w_out), ("b_qkv", b_qkv), ("b_out", b_out),
                    ("cos", cos), ("sin", sin)):
        if a is not None:
            a = A.as_array(a, name)
            A.same_dtype(name, a, "x", x)
            inputs[name] = A.contiguous(a)
    if key_padding is not None:
        inputs["mask"] = A.to_float32(key_padding, "key_padding")
    out = A.empty(x, tuple(x.shape))
    _ext.attention_block(backend, int(num_heads), inputs, out)
    return out
