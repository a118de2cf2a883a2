# SPDX-License-Identifier: Apache-2.0
"""tandem: the attention family of transformer kernels, computed twice — a
readable reference and an optimized SIMD backend — for NumPy and PyTorch.

    import tandem
    out = tandem.attention(q, k, v, mask="causal")        # NumPy or torch in, same out

`tandem.torch` registers the kernels as PyTorch operators with autograd and
offers `scaled_dot_product_attention` with PyTorch's signature;
`tandem.flex_attention` is torch's FlexAttention (score_mod and mask_mod as
Python functions, traced into SPEC §13's mod language);
`tandem.transformers` registers the attention implementation "tandem" with
Hugging Face transformers; `tandem.testing` checks your own kernels against
the reference with Hypothesis, and their batch invariance (which
`tandem.invariant()` gives the optimized backend). Every invalid call
raises tandem.Error (a ValueError) naming the parameter. The three modules need the package's extras
(pip install 'tandem[torch,testing,transformers]'); imported without one,
they raise tandem.MissingExtra (a ModuleNotFoundError) naming it.
"""

import contextlib

from . import _ext
from ._api import (alibi_slopes, attention, attention_backward, attention_backward_saved,
                   attention_block, attention_forward_lse, attention_with_kvcache, axial_rope,
                   axial_rope_backward, QuantizedKv, quantize_kv, rope, rope_backward, rope_qk,
                   rope_qk_backward, swiglu, swiglu_backward)
from ._errors import Error, MissingExtra

__version__ = _ext.version()

__all__ = [
    "Error", "MissingExtra", "attention", "attention_backward", "attention_forward_lse",
    "attention_backward_saved", "attention_with_kvcache", "alibi_slopes", "rope",
    "rope_backward", "rope_qk", "rope_qk_backward", "axial_rope", "axial_rope_backward",
    "swiglu", "swiglu_backward", "attention_block", "quantize_kv", "QuantizedKv", "offers",
    "set_threads", "threads", "set_invariant", "is_invariant", "invariant", "simd_target",
    "flex_attention", "create_block_mask", "validate_block_mask", "BlockMask",
]

_FLEX = ("flex_attention", "create_block_mask", "validate_block_mask", "BlockMask")


def __getattr__(name):
    """tandem.flex_attention, create_block_mask, validate_block_mask and
    BlockMask (tandem.flex), imported on first use: they need torch."""
    if name in _FLEX:
        from . import flex
        return getattr(flex, name)
    raise AttributeError(f"module 'tandem' has no attribute {name!r}")


def offers(entry, dtype="float32", backend="optimized"):
    """Whether `backend` offers the kernel entry point `entry` (a member of
    tandem::Kernels: "attention_forward", "quantize_kv", ...) at storage type
    `dtype` ("float32", "float64", "bfloat16", "float16"; SPEC §10.1); a
    call to one it does not offer raises tandem.Error naming the backend."""
    try:
        t = getattr(_ext.Dtype, str(dtype).replace("torch.", ""))
    except AttributeError:
        raise Error(f"dtype = {dtype!r} must be float32, float64, bfloat16 or float16",
                    "dtype") from None
    return _ext.offers(backend, t, entry)


def set_threads(n):
    """Threads of the optimized backend per call (0 = every core)."""
    _ext.set_threads(int(n))


def threads():
    """The thread count set by set_threads (0 = every core)."""
    return _ext.threads()


def set_invariant(on):
    """Batch-invariant inference on the optimized backend (SPEC §12): with
    `on`, the backend is rebuilt with optimized::Geometry::invariant, and a
    query row's out and lse (a sequence's dq, dk, dv) are bitwise the same
    whatever else its call holds and however the call is split: the Sq of
    the call (prefill, decode step, prefill chunk against the same cache),
    the batch, packed or separate sequences, a paged or contiguous cache and
    the thread count (same storage type, same SIMD target). The reference
    backend is invariant either way. Process-wide, like set_threads: not to
    be called while another thread runs a kernel."""
    _ext.set_invariant(bool(on))


def is_invariant():
    """Whether set_invariant(True) is in force."""
    return _ext.invariant()


@contextlib.contextmanager
def invariant(on=True):
    """set_invariant(on) for the body of a `with` block, the previous state
    restored on leaving it (also on an exception):

        with tandem.invariant():
            tokens = model.generate(ids, max_new_tokens=32)
    """
    before = is_invariant()
    set_invariant(on)
    try:
        yield
    finally:
        set_invariant(before)


def simd_target():
    """The Highway target the optimized backend dispatches to ("AVX2", ...): the
    CPU's best, or the one the environment variable TANDEM_TARGET names."""
    return _ext.simd_target()
