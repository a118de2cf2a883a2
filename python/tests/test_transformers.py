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
