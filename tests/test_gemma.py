"""The Gemma family (Gemma 1/2/3 text) against transformers: logits, greedy decoding on a ragged
batch, tree verification under sliding windows, HF and GGUF conversion, speculative decoding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax as sj
from specjax.drafters import DraftModel, PromptLookup, TokenRecycling
from specjax.models import KVCache, forward, init_params
from specjax.sampling import SamplingParams

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)
WINDOW = 4  # shorter than the prompts and the trees' paths: windowing in prefill and verification

# name -> (config class, extra kwargs): scales, caps and rope bases that differ from the defaults
# by enough to be seen at 1e-4
FAMILIES = {
    "gemma": ("GemmaConfig", dict(num_hidden_layers=2)),
    "gemma2": ("Gemma2Config", dict(num_hidden_layers=3, sliding_window=WINDOW, query_pre_attn_scalar=12,
                                    attn_logit_softcapping=0.5, final_logit_softcapping=0.8)),
    "gemma3": ("Gemma3TextConfig", dict(
        num_hidden_layers=4, sliding_window=WINDOW, query_pre_attn_scalar=6,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
        rope_parameters={"full_attention": dict(rope_type="linear", factor=4.0, rope_theta=50.0),
                         "sliding_attention": dict(rope_type="default", rope_theta=10.0)})),
}
PROMPTS = [[5, 17, 33, 9, 60, 71, 12, 5, 17], [40, 3], [8, 8, 90, 14, 22, 8]]


def hf_config(name: str):
    cls_name, extra = FAMILIES[name]
    return getattr(transformers, cls_name)(**{**BASE, **extra})


def randomised(model, seed):
    """Norms start at zero (scale 1 + w): randomise them, and widen the weights so that the
    caps, the window and the rope bases change the logits well beyond the tolerance."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_((0.3 if n.endswith("norm.weight") else 0.15) * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """name -> (transformers model, saved folder), built once per module."""
    cache = {}

    def get(name):
        if name not in cache:
            folder = tmp_path_factory.mktemp(name)
            hf = randomised(transformers.AutoModelForCausalLM.from_config(hf_config(name)), seed=0)
            hf.save_pretrained(folder)
            cache[name] = (hf, folder)
        return cache[name]

    return get


def hf_logits(hf, tokens):
    with torch.no_grad():
        return hf(torch.tensor(np.asarray(tokens))).logits.numpy()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_transformers(family, gemma):
    hf, folder = gemma(family)
    model = sj.load(folder)
    tokens = np.random.RandomState(0).randint(3, 96, size=(2, 11))
    ref = hf_logits(hf, tokens)
    assert np.abs(ref).max() > 0.1  # the logits are not all near zero
    np.testing.assert_allclose(np.asarray(sj.forward(model, jnp.asarray(tokens))), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_matches_transformers_on_a_ragged_batch(family, gemma):
    hf, folder = gemma(family)
    out = sj.generate(sj.load(folder), PROMPTS, max_new_tokens=8)
    for i, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        assert out.tokens[i].tolist() == want, (family, i)
