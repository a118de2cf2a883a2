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
"""

from . import torch as _tt  # first: without PyTorch, the message names the torch extra
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
    (module.sinks when the model passes none); returns (out [B, Sq, H, D], None)."""
    sinks = kwargs.get("s_aux")
    if sinks is None and isinstance(getattr(module, "sinks", None), _torch.Tensor):
        sinks = module.sinks
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # As SDPA: causal from the flag only when there is no mask and more than
    # one query (a single decoding query sees the whole cache).
    is_causal = bool(is_causal and attention_mask is None and query.shape[2] > 1)
    out = _tt.sdpa_softcap(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                           is_causal=is_causal, scale=scaling,
                           enable_gqa=key.shape[1] != query.shape[1], softcap=softcap or 0.0,
                           sinks=sinks, backend=backend)
    return out.transpose(1, 2).contiguous(), None


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
