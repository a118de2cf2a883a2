# SPDX-License-Identifier: Apache-2.0
"""Randomly initialized small Llama, Mistral (sliding window), Gemma 2
(logit softcap) and gpt-oss (attention sinks, sliding window, a small
mixture of experts), built from configs (no weights downloaded), give the same
logits, greedy tokens and training gradients with attn_implementation="tandem"
as with "eager"."""

import copy

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, Gemma2Config, LlamaConfig, MistralConfig

import tandem
import tandem.transformers  # noqa: F401  (registers "tandem" and "tandem_reference")

SMALL = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
CONFIGS = {
    "llama": lambda: LlamaConfig(**SMALL),
    "mistral": lambda: MistralConfig(**SMALL, sliding_window=5),
    "gemma2": lambda: Gemma2Config(**SMALL, head_dim=16, sliding_window=5,
                                   attn_logit_softcapping=5.0, query_pre_attn_scalar=16),
    "gpt_oss": lambda: GptOssConfig(**SMALL, head_dim=16, sliding_window=5, num_local_experts=4,
                                    num_experts_per_tok=2),
}


# gpt-oss came with transformers 4.55; the minimum tandem.transformers
# supports (4.53, CI's minimum-versions step) runs the other models.
GptOssConfig = getattr(transformers, "GptOssConfig", None)
NEEDS_GPT_OSS = pytest.mark.skipif(
    GptOssConfig is None, reason=f"gpt-oss needs transformers >= 4.55, this is "
    f"{transformers.__version__} (tandem.transformers needs 4.53)")

# (model, implementation): every model with "tandem" (the optimized backend),
# gpt-oss's sinks with "tandem_reference" too
CASES = [pytest.param(name, "tandem", marks=NEEDS_GPT_OSS if name == "gpt_oss" else ())
         for name in CONFIGS] + [pytest.param("gpt_oss", "tandem_reference", marks=NEEDS_GPT_OSS)]


def pair(name, impl="tandem"):
    """The same random model twice: eager attention and tandem's."""
    torch.manual_seed(0)
    config = CONFIGS[name]()
    eager = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager")
    ours = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=impl)
    ours.load_state_dict(eager.state_dict())
    assert (eager.config._attn_implementation, ours.config._attn_implementation) == \
        ("eager", impl)
    return eager, ours


def batch():
    torch.manual_seed(1)
    ids = torch.randint(0, 101, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    return ids, mask


@pytest.mark.parametrize("name,impl", CASES)
def test_logits_and_greedy_tokens_match_eager(name, impl):
    eager, ours = pair(name, impl)
    ids, mask = batch()
    with torch.no_grad():
        a = eager(ids, attention_mask=mask).logits
        b = ours(ids, attention_mask=mask).logits
    # padded positions see no key: eager averages them, tandem (as SDPA) gives 0
    torch.testing.assert_close(b[0], a[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(b[1, 3:], a[1, 3:], atol=2e-5, rtol=1e-4)
    kw = dict(max_new_tokens=10, do_sample=False)
    assert torch.equal(eager.generate(ids, attention_mask=mask, **kw),
                       ours.generate(ids, attention_mask=mask, **kw))


@pytest.mark.parametrize("name,impl", CASES)
def test_a_training_step_has_the_same_gradients(name, impl):
    eager, ours = pair(name, impl)
    ids, _ = batch()
    for model in (eager, ours):
        model.train()
        model(ids, labels=ids).loss.backward()
    for (n, a), (_, b) in zip(eager.named_parameters(), ours.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=5e-5, rtol=1e-3, msg=n)


def test_tandem_is_actually_called():
    calls = []
    original = tandem.transformers.attention_forward

    def spy(*args, **kwargs):
        calls.append(kwargs.get("softcap"))
        return original(*args, **kwargs)

    from transformers import AttentionInterface
    AttentionInterface.register("tandem", spy)
    try:
        _, ours = pair("gemma2")
        with torch.no_grad():
            ours(batch()[0])
    finally:
        tandem.transformers.register()
    assert calls == [5.0, 5.0]  # two layers, each with the softcap


def left_padded(pad, Sq, Sk, window=None):
    """A boolean [B, 1, Sq, Sk] mask written out key by key: batch row b's keys
    from pad[b] on real, query i at key position Sk - Sq + i seeing the real
    keys up to its position, and with a window of w keys only the last w."""
    m = torch.zeros(len(pad), 1, Sq, Sk, dtype=torch.bool)
    for b, p in enumerate(pad):
        for i in range(Sq):
            a = Sk - Sq + i
            for j in range(Sk):
                m[b, 0, i, j] = p <= j <= a and (window is None or j > a - window)
    return m


@pytest.mark.parametrize("Sq,Sk,window", [(7, 7, None), (7, 7, 3), (1, 9, None), (2, 9, 8)])
def test_a_left_padded_mask_is_read_as_its_pad_counts(Sq, Sk, window):
    pad = [0, 3, Sk]  # none, some, every key
    found = tandem.transformers._left_padding(left_padded(pad, Sq, Sk, window), 3, Sq, Sk)
    assert found is not None
    assert found[0].tolist() == pad
    assert found[1] == window  # the first row's last query sees fewer keys than it has


def test_where_a_window_hides_the_padding_the_position_ids_say_where_it_ends():
    read = tandem.transformers._left_padding
    m = left_padded([0, 3], 1, 9, window=4)  # a decode step: query 8 sees keys 5 to 8
    assert read(m, 2, 1, 9) is None  # the mask alone cannot tell: the general path
    pad, window = read(m, 2, 1, 9, position_ids=torch.tensor([[8], [5]]))
    assert pad.tolist() == [0, 3] and window == 4
    # position ids that end the padding after the first key a query sees
    assert read(m, 2, 1, 9, position_ids=torch.tensor([[2], [0]])) is None
    # where each row's first query with a key sees fewer keys than another query
    # (row 1's sees 1 of 7), no window cut them: the mask tells
    pad, window = read(left_padded([0, 6], 4, 9, window=7), 2, 4, 9)
    assert pad.tolist() == [0, 6] and window == 7


def test_other_masks_take_the_general_path():
    read = tandem.transformers._left_padding
    m = left_padded([2, 0], 6, 6)
    assert read(m, 2, 6, 6) is not None
    assert read(m.flip(-1).flip(-2), 2, 6, 6) is None  # right padding
    hole = m.clone()
    hole[0, 0, 4, 3] = False  # a hidden key inside the real ones
    assert read(hole, 2, 6, 6) is None
    heads = m.expand(2, 2, 6, 6).clone()
    heads[0, 1, 5, 0] = True  # another mask for one head
    assert read(heads, 2, 6, 6) is None
    assert read(m.float(), 2, 6, 6) is None  # an additive mask
    assert read(None, 2, 6, 6) is None


@pytest.mark.parametrize("name,impl", CASES)
def test_a_left_padded_batch_runs_as_packed_sequences(monkeypatch, name, impl):
    calls = []
    packed = tandem.transformers._packed_forward

    def spy(*args):
        calls.append(args[3].tolist())  # the pad counts
        return packed(*args)

    monkeypatch.setattr(tandem.transformers, "_packed_forward", spy)
    _, ours = pair(name, impl)
    ids, mask = batch()
    with torch.no_grad():
        ours(ids, attention_mask=mask)
    assert calls == [[0, 3]] * 2  # both layers
    calls.clear()
    with torch.no_grad():
        ours(ids, attention_mask=mask.flip(-1))  # right padding: the general path
    assert calls == []


@pytest.mark.parametrize("Sq,window,sinks", [(9, None, False), (9, 4, True), (2, None, True)])
def test_a_left_padded_row_gets_the_bits_of_its_real_part_alone(Sq, window, sinks):
    B, H, Hkv, Sk, D = 3, 4, 2, 9, 8
    pad = [0, 3, Sk - 1]
    torch.manual_seed(2)
    q = torch.randn(B, H, Sq, D)
    k, v = torch.randn(B, Hkv, Sk, D), torch.randn(B, Hkv, Sk, D)
    s = torch.randn(H) if sinks else None
    module = type("Attention", (), {"sinks": s})()
    mask = left_padded(pad, Sq, Sk, window)
    with tandem.invariant():
        out, _ = tandem.transformers.attention_forward(module, q, k, v, mask, scaling=0.3)
        for b, p in enumerate(pad):
            qp = max(p - (Sk - Sq), 0)  # the queries at padding positions
            alone = tandem.torch.attention(
                q[b, :, qp:].transpose(0, 1)[None].contiguous(),
                k[b, :, p:].transpose(0, 1)[None].contiguous(),
                v[b, :, p:].transpose(0, 1)[None].contiguous(), mask="causal" if window is None
                else None, window=None if window is None else window - 1, scale=0.3, sinks=s)
            assert torch.equal(out[b, qp:], alone[0]), f"batch row {b}"
            assert torch.equal(out[b, :qp], torch.zeros_like(out[b, :qp])), f"batch row {b}"
