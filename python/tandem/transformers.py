# SPDX-License-Identifier: Apache-2.0
"""The attention implementation "tandem" for Hugging Face transformers.

    import tandem.transformers   # registers "tandem" and "tandem_reference"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="tandem")

"tandem" runs float32 on the optimized backend, "tandem_reference" on the
reference (for checking, and for features the optimized backend does not
implement yet). Importing this module registers the attention function with
transformers.AttentionInterface and, for the masks, SDPA's mask builder with
AttentionMaskInterface under the same name: the model's causal, sliding-window
and padding masks reach tandem as a boolean mask (or none, with is_causal),
the logit softcap (Gemma 2) as tandem's softcap, the attention sinks of
gpt-oss (`s_aux`, the module's `sinks` parameter) as tandem's sinks, with
their gradient, grouped kv heads without being repeated. Dropout is not
supported (train with attention_dropout=0).

A left-padded batch (generate's) runs as packed sequences (SPEC §2.9): when
the mask is exactly a left-padded causal or sliding-window mask, each batch
row's real keys and the queries at their positions are one sequence, so its
64-key blocks start at its first real key, as when the prompt runs alone,
and under tandem.invariant() a prompt gets its bits alone (SPEC §12.1). A
decode step is packed only under tandem.invariant(): copying each row's keys
costs more than the padding it skips. Under tandem.invariant() a cache that
has dropped its oldest keys (a sliding-window layer's) passes key_origin,
its first key's position read off the position ids, so that its blocks are
those of the whole sequence (SPEC §12.1).
"""

from . import torch as _tt  # first: without PyTorch, the message names the torch extra
from . import _api
import tandem as _tandem
from ._errors import MissingExtra

try:
    import torch as _torch
    import transformers
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask  # >= 4.53
except ImportError as e:
    raise MissingExtra("tandem.transformers", "transformers >= 4.53", "transformers",
                       "transformers", e) from e

__all__ = ["attention_forward", "register", "NAME", "REFERENCE_NAME"]

NAME = "tandem"
REFERENCE_NAME = "tandem_reference"


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      softcap=None, is_causal=None, backend="optimized", **kwargs):
    """transformers' attention-function contract: query [B, H, Sq, D], key
    and value [B, Hkv, Sk, D]; attention_mask None or [B, 1|H, Sq, Sk] (bool:
    True attends; float: added); `s_aux` [H], the sink logits of gpt-oss
    (module.sinks when the model passes none); returns (out [B, Sq, H, D], None).
    A left-padded causal or sliding-window mask (_left_padding) runs as packed
    sequences, one per batch row, each from its first real key."""
    sinks = kwargs.get("s_aux")
    if sinks is None and isinstance(getattr(module, "sinks", None), _torch.Tensor):
        sinks = module.sinks
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # As SDPA: causal from the flag only when there is no mask and more than
    # one query (a single decoding query sees the whole cache).
    is_causal = bool(is_causal and attention_mask is None and query.shape[2] > 1)
    # A decode step packs only under tandem.invariant(): its copies cost more than the padded
    # keys it skips (a prefill's skipped padding pays for them).
    pack = not dropout and (query.shape[2] > 1 or _tandem.is_invariant())
    B, Sq, Sk = query.shape[0], query.shape[2], key.shape[2]
    position_ids = kwargs.get("position_ids")
    padding = _left_padding(attention_mask, B, Sq, Sk, position_ids) if pack else None
    # Under tandem.invariant() a cache that dropped its oldest keys (a sliding window's)
    # says where its key 0 sits, so that the blocks are those of the whole sequence.
    origin = None
    if _tandem.is_invariant() and not dropout and Sq <= Sk:
        if padding is not None:
            origin = _key_origin(position_ids, padding[0], Sk)
        elif attention_mask is None and (is_causal or Sq == 1):  # every key real, causal
            none = _torch.zeros(B, dtype=_torch.int64)
            origin = _key_origin(position_ids, none, Sk)
            padding = (none, None) if origin is not None else None
    if padding is not None:
        return _packed_forward(query, key, value, *padding, scaling, softcap, sinks, backend,
                               origin), None
    out = _tt.sdpa_softcap(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                           is_causal=is_causal, scale=scaling,
                           enable_gqa=key.shape[1] != query.shape[1], softcap=softcap or 0.0,
                           sinks=sinks, backend=backend)
    return out.transpose(1, 2).contiguous(), None


def _left_padding_mask(pad, window, Sq, Sk):
    """The boolean mask [B, Sq, Sk] of a left-padded batch: batch row b's
    keys j >= pad[b] real, its queries at key positions Sk - Sq + i
    (bottom-right), each seeing the real keys j <= its position and, with a
    `window` of w keys (transformers' sliding_window), j > its position - w."""
    pos = _torch.arange(Sk - Sq, Sk).view(1, Sq, 1)
    j = _torch.arange(Sk).view(1, 1, Sk)
    keep = (j >= pad.view(-1, 1, 1)) & (j <= pos)
    return keep & (j > pos - window) if window is not None else keep


def _pad_counts(m, Sk, position_ids):
    """The candidate pad counts [B] of a boolean mask m [B, Sq, Sk], most
    trusted first. From the position ids (generate's: a real token's index
    among its row's real tokens), the last query's key position minus its
    position id. From the mask, a row's first key that a query sees, where
    that is sure to be the end of its padding: the row has no padding, or its
    first query with a key sees fewer keys than some query of the call (so no
    sliding window cut them); where a window hides the padding from every
    query, the mask cannot tell where it ends."""
    B = m.shape[0]
    if isinstance(position_ids, _torch.Tensor) and position_ids.dim() == 2 and \
            position_ids.shape[0] in (1, B) and position_ids.shape[1] == m.shape[1]:
        yield Sk - 1 - position_ids[:, -1].to(_torch.int64).expand(B)
    seen = m.any(1)
    first = _torch.where(seen.any(1), seen.to(_torch.int32).argmax(1), Sk).to(_torch.int64)
    counts = m.sum(2)
    first_count = counts.gather(1, (counts > 0).to(_torch.int32).argmax(1, keepdim=True))[:, 0]
    if bool(((first == 0) | (first == Sk) | (first_count < counts.max())).all()):
        yield first


def _left_padding(mask, B, Sq, Sk, position_ids=None):
    """(pad [B], window) when `mask` [B|1, 1|H, Sq, Sk] is, for every head,
    exactly _left_padding_mask(pad, window, Sq, Sk) for pad counts from
    _pad_counts and the window read off the mask (the keys a row's last query
    sees where that is fewer than the row's real keys); None for any other
    mask, which takes the general path."""
    if mask is None or mask.dtype != _torch.bool or mask.dim() != 4 or Sq > Sk or \
            _torch.compiler.is_compiling() or mask.device.type != "cpu":
        return None
    if mask.shape[0] not in (1, B) or mask.shape[2:] != (Sq, Sk):
        return None
    m = mask[:, 0]
    if mask.shape[1] != 1 and not _torch.equal(mask, m.unsqueeze(1).expand_as(mask)):
        return None
    m = m.expand(B, Sq, Sk)
    last = m[:, -1].sum(1)
    for pad in _pad_counts(m, Sk, position_ids):
        if bool(((pad < 0) | (pad > Sk)).any()):
            continue
        narrow = last < Sk - pad
        window = int(last[narrow][0]) if bool(narrow.any()) else None
        if _torch.equal(_left_padding_mask(pad, window, Sq, Sk), m):
            return pad, window
    return None


def _key_origin(position_ids, pad, Sk):
    """The position of each batch row's first real key in its whole
    sequence [B] (tandem's key_origin, SPEC §12.1), from the position ids
    (the last query's, as generate gives them: a token's index among its
    row's real tokens): position + 1 − (Sk − pad[b]). 0 while the cache
    keeps every key; more once a sliding-window cache has dropped the keys
    its window left behind. None when there are no position ids, they say
    nothing of the kind, or every row's origin is 0."""
    B = pad.shape[0]
    if not isinstance(position_ids, _torch.Tensor) or position_ids.dim() != 2 or \
            position_ids.shape[0] not in (1, B):
        return None
    origin = position_ids[:, -1].to(_torch.int64).expand(B) + 1 - (Sk - pad)
    return origin if bool((origin >= 0).all()) and bool((origin > 0).any()) else None


def _packed_forward(query, key, value, pad, window, scaling, softcap, sinks, backend,
                    origin=None):
    """attention_forward of a left-padded batch (_left_padding) as packed
    sequences (SPEC §2.9): batch row b's real keys [pad[b], Sk) and the
    queries at those positions are one sequence, whose 64-key blocks start
    at its first real key as when the prompt runs alone (SPEC §12), or at
    the position `origin[b]` (_key_origin) gives that key. The queries at
    padding positions see no key and get 0, as in the general path. Returns
    out [B, Sq, H, Dv]."""
    B, H, Sq, _ = query.shape
    Sk = key.shape[2]
    qpad = (pad - (Sk - Sq)).clamp(min=0).tolist()
    pad = pad.tolist()
    q = _torch.cat([query[b, :, qpad[b]:].transpose(0, 1) for b in range(B)])
    k = _torch.cat([key[b, :, pad[b]:].transpose(0, 1) for b in range(B)])
    v = _torch.cat([value[b, :, pad[b]:].transpose(0, 1) for b in range(B)])
    cu_q = _torch.tensor([0] + [Sq - n for n in qpad], dtype=_torch.int64).cumsum(0)
    cu_k = _torch.tensor([0] + [Sk - n for n in pad], dtype=_torch.int64).cumsum(0)
    mask = {"mask": "causal"} if window is None else {"window": window - 1}  # w + 1 keys
    # as sdpa_softcap: the operator (autograd, a compiler, sinks), else the kernel directly
    attention = _tt.attention if _tt._needs_op(q, k, v) or sinks is not None else _api.attention
    out = attention(q, k, v, scale=scaling, softcap=softcap or 0.0, sinks=sinks, cu_seqlens_q=cu_q,
                    cu_seqlens_k=cu_k, key_origin=origin, backend=backend, **mask)
    zeros = out.new_zeros((max(qpad), H, out.shape[-1]))
    rows = [_torch.cat([zeros[:qpad[b]], out[cu_q[b]:cu_q[b + 1]]]) for b in range(B)]
    return _torch.stack(rows)


def _reference_attention_forward(*args, **kwargs):
    """attention_forward on the reference backend."""
    return attention_forward(*args, backend="reference", **kwargs)


def _mask(*args, **kwargs):
    """SDPA's boolean mask, without the fix transformers applies for the SDPA
    of torch < 2.5 (a query that sees no key made to see every key, in place
    on a broadcast view, which fails): tandem gives such a query 0 itself, on
    every torch release."""
    kwargs.setdefault("allow_torch_fix", False)
    return sdpa_mask(*args, **kwargs)


def register():
    """Registers "tandem" and "tandem_reference" (done on import)."""
    AttentionInterface.register(NAME, attention_forward)
    AttentionInterface.register(REFERENCE_NAME, _reference_attention_forward)
    for name in (NAME, REFERENCE_NAME):
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, _mask)


register()
