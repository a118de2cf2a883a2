# SPDX-License-Identifier: Apache-2.0
"""Batch-invariant generation with tandem.transformers (SPEC §12): under
tandem.invariant(), small random Llama (GQA), Mistral (sliding window) and
gpt-oss (sinks, sliding window, experts) models give, bit for bit, the
logits and greedy tokens of recomputing the whole sequence at every step
when they generate with a KV cache that keeps every key at its position,
and a prompt batched with others (left padding for generate, right padding
for a forward) gives the bits it gives alone; across key 64, the first of
the 64-key blocks of SPEC §12. Left padding moves a prompt's keys along the
call's key axis; tandem.transformers runs a left-padded batch as packed
sequences, each from its first real key, which keeps its blocks. A
sliding-window cache that drops the keys its window left behind moves them
too; tandem.transformers then passes key_origin, the position of the cache's
first key (read off the position ids), which keeps them: the model's own
sliding-window cache generates the bits of recomputing, across key 64.

Attention is not a model's only reduction: PyTorch's matrix products sum in
an order that depends on the number of rows (one row, a decode step, takes
another path than many), so the models' linear layers and gpt-oss's experts
run here through a product summed in a fixed order (fixed_order_matmul);
with "tandem_reference" (the reference backend, invariant by construction)
the tests check that the rest of the model is invariant, with "tandem" the
optimized backend's attention under the switch."""

import copy

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, MistralConfig

import tandem
import tandem.transformers  # noqa: F401  (registers "tandem" and "tandem_reference")

SMALL = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
GptOssConfig = getattr(transformers, "GptOssConfig", None)
CONFIGS = {
    "llama": lambda: LlamaConfig(**SMALL),
    "mistral": lambda: MistralConfig(**SMALL, sliding_window=5),
    "gpt_oss": lambda: GptOssConfig(**SMALL, head_dim=16, sliding_window=5, num_local_experts=4,
                                    num_experts_per_tok=2),
}
NEEDS_GPT_OSS = pytest.mark.skipif(
    GptOssConfig is None, reason=f"gpt-oss needs transformers >= 4.55, this is "
    f"{transformers.__version__}")
CASES = [pytest.param(name, impl, marks=NEEDS_GPT_OSS if name == "gpt_oss" else ())
         for impl in ("tandem_reference", "tandem") for name in CONFIGS]
NEW_TOKENS = 12
SHORT = (9, 14, 5)  # prompt lengths: every key in the first 64-key block
LONG = (60, 75, 9)  # keys on both sides of key 64, the first block boundary


def fixed_order_matmul(x, w):
    """x [..., K] @ w [K, N], summed over K one term at a time in order:
    each row's bits independent of the other rows."""
    acc = torch.zeros(*x.shape[:-1], w.shape[-1], dtype=x.dtype)
    for i in range(x.shape[-1]):
        acc = acc + x[..., i:i + 1] * w[i]
    return acc


def fixed_order_linear(x, weight, bias=None):
    out = fixed_order_matmul(x, weight.t())
    return out if bias is None else out + bias


def fixed_order_experts(self, hidden_states, router_indices=None, routing_weights=None):
    """GptOssExperts.forward (transformers 4.55 to 5) with fixed_order_matmul:
    each token's experts added in expert order."""
    next_states = torch.zeros_like(hidden_states)
    hit = torch.nn.functional.one_hot(router_indices, num_classes=self.num_experts)
    hit = hit.permute(2, 1, 0)
    for e in range(self.num_experts):
        top_k_pos, token_idx = torch.where(hit[e])
        if token_idx.numel() == 0:
            continue
        gate_up = fixed_order_matmul(hidden_states[token_idx], self.gate_up_proj[e]) + \
            self.gate_up_proj_bias[e]
        out = fixed_order_matmul(self._apply_gate(gate_up), self.down_proj[e]) + \
            self.down_proj_bias[e]
        next_states.index_add_(0, token_idx, out * routing_weights[token_idx, top_k_pos, None])
    return next_states


@pytest.fixture
def fixed_order(monkeypatch):
    monkeypatch.setattr(torch.nn.functional, "linear", fixed_order_linear)
    if GptOssConfig is not None:
        from transformers.models.gpt_oss import modeling_gpt_oss
        monkeypatch.setattr(modeling_gpt_oss.GptOssExperts, "forward", fixed_order_experts)
    with tandem.invariant(), torch.no_grad():
        yield


def model(name, impl):
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(copy.deepcopy(CONFIGS[name]()), attn_implementation=impl)
    assert m.config._attn_implementation == impl
    return m.eval()


def prompts(lengths):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 101, (n,), generator=g) for n in lengths]


def generate(m, ids, mask=None, every_key=True):
    """Greedy generation with the KV cache: (sequences, [B, steps, vocab]
    logits). every_key: a cache that keeps every key at its position
    (DynamicCache() without the model's config: no sliding-window layer
    dropping the keys the window left behind); else the model's default."""
    cache = DynamicCache() if every_key else None
    g = m.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                   do_sample=False, output_logits=True, return_dict_in_generate=True,
                   pad_token_id=0, past_key_values=cache)
    return g.sequences, torch.stack(g.logits, 1)


def first_difference(a, b):
    """'[index] a vs b, max |diff|' of the first element whose bits differ, or None."""
    bad = (a.view(torch.int32) != b.view(torch.int32)).nonzero()
    if not len(bad):
        return None
    i = tuple(bad[0].tolist())
    return f"{list(i)}: {a[i].item()!r} vs {b[i].item()!r}, max |diff| " \
        f"{(a - b).abs().max().item():.3e}"


def check_cached_against_recomputed(m, lengths, every_key=True):
    ids = prompts(lengths)[0][None]
    seq, logits = generate(m, ids, every_key=every_key)
    P = ids.shape[1]
    for t in range(NEW_TOKENS):
        full = m(seq[:, :P + t]).logits[:, -1]
        diff = first_difference(logits[:, t], full)
        assert diff is None, f"step {t} (query {P + t - 1}): cached vs recomputed logits, " \
            f"first at {diff}"
        assert seq[0, P + t] == full[0].argmax()


def check_left_padded_against_alone(m, lengths):
    ps = prompts(lengths)
    n = max(len(p) for p in ps)
    ids = torch.zeros(len(ps), n, dtype=torch.long)
    mask = torch.zeros(len(ps), n, dtype=torch.long)
    for b, p in enumerate(ps):
        ids[b, n - len(p):], mask[b, n - len(p):] = p, 1
    seq, logits = generate(m, ids, mask)
    for b, p in enumerate(ps):
        alone_seq, alone = generate(m, p[None])
        diff = first_difference(logits[b], alone[0])
        assert diff is None, f"prompt {b} (length {len(p)}, left padding {n - len(p)}) " \
            f"batched vs alone: first logit at [step, token] {diff}"
        assert torch.equal(seq[b, n:], alone_seq[0, len(p):])


@pytest.mark.parametrize("name,impl", CASES)
def test_generating_with_the_cache_gives_the_bits_of_recomputing(fixed_order, name, impl):
    # the prompt's 60 keys and the new ones cross key 64
    check_cached_against_recomputed(model(name, impl), LONG)


@pytest.mark.parametrize("name", ["mistral", pytest.param("gpt_oss", marks=NEEDS_GPT_OSS)])
def test_a_sliding_window_cache_across_a_key_block_gives_the_bits_of_recomputing(
        fixed_order, name):
    # the cache keeps the last window's keys only: key_origin says where its key 0 sits
    m = model(name, "tandem")
    ids = prompts(LONG)[0][None]
    cache = m.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0,
                       return_dict_in_generate=True).past_key_values
    layers = getattr(cache, "layers", None)  # transformers >= 4.54; else key_cache
    kept = min(x.keys.shape[-2] for x in layers) if layers is not None else \
        min(k.shape[-2] for k in cache.key_cache)
    if kept >= ids.shape[1] + 1:
        pytest.skip(f"transformers {transformers.__version__}'s default {name} cache keeps "
                    "every key: no key moves")
    check_cached_against_recomputed(m, LONG, every_key=False)


@pytest.mark.parametrize("name,impl", CASES)
def test_a_prompt_left_padded_in_a_batch_generates_the_bits_it_generates_alone(
        fixed_order, name, impl):
    check_left_padded_against_alone(model(name, impl), SHORT)


@pytest.mark.parametrize("name,impl", CASES)
def test_a_prompt_left_padded_across_a_key_block_generates_the_bits_it_generates_alone(
        fixed_order, name, impl):
    # the padding moves the prompts' keys along the call's key axis (the 9-key
    # prompt's by 66, past key 64): tandem.transformers packs each batch row
    # from its first real key, so its 64-key blocks are those it has alone
    check_left_padded_against_alone(model(name, impl), LONG)


@pytest.mark.parametrize("name,impl", CASES)
def test_a_prompt_right_padded_in_a_batch_gives_the_logits_it_gives_alone(
        fixed_order, name, impl):
    m = model(name, impl)
    ps = prompts(LONG)
    n = max(len(p) for p in ps)
    ids = torch.zeros(len(ps), n, dtype=torch.long)
    mask = torch.zeros(len(ps), n, dtype=torch.long)
    for b, p in enumerate(ps):
        ids[b, :len(p)], mask[b, :len(p)] = p, 1
    batched = m(ids, attention_mask=mask).logits
    for b, p in enumerate(ps):
        alone = m(p[None]).logits[0]
        diff = first_difference(batched[b, :len(p)], alone)
        assert diff is None, f"prompt {b} (length {len(p)}) batched vs alone: first logit " \
            f"at [position, token] {diff}"
