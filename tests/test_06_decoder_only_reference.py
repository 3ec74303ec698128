"""The chapter-6 reference is proven against PyTorch's RMSNorm and Hugging Face's LlamaForCausalLM.

``transformers`` is a test-only dependency: a tiny LlamaConfig builds a model with random weights, no
download. LLaMA pairs RoPE's features half-split (``rotate_half``), as the course does, so the weights
copy across one for one. transformers computes two things in float32 whatever the model's dtype, the RMS
statistic and RoPE's angles (for half-precision training); the float64 comparisons raise those two to
float64, and change nothing else. Its attention runs as PyTorch's scaled_dot_product_attention ("sdpa"):
its "eager" attention takes the softmax in float32 too.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama

from autograde_tests.reference import GPT, DecoderBlock, RMSNorm, apply_rotary, generate, lm_loss

from .conftest import assert_close, dtypes, randomise

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, D_MODEL, N_HEADS, N_LAYERS, D_FF = 13, 16, 4, 2, 24


def llama(dtype: torch.dtype, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_FF, num_hidden_layers=N_LAYERS,
                         num_attention_heads=N_HEADS, num_key_value_heads=N_HEADS, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype).eval()
    with torch.no_grad():  # norms away from their starting ones, so a misplaced norm shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    return model


def from_llama(model: LlamaForCausalLM) -> GPT:
    """Our GPT with the Hugging Face model's weights, name for name."""
    ours = GPT(VOCAB, D_MODEL, N_HEADS, N_LAYERS, D_FF).to(model.dtype).eval()
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "w_q": "self_attn.q_proj",
             "w_k": "self_attn.k_proj", "w_v": "self_attn.v_proj", "w_o": "self_attn.o_proj",
             "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj", "w_down": "mlp.down_proj"}
    theirs = dict(model.named_parameters())
    state = {"embed.weight": theirs["model.embed_tokens.weight"], "norm.weight": theirs["model.norm.weight"],
             "head.weight": theirs["lm_head.weight"]}
    for i in range(N_LAYERS):
        for ours_name, their_name in names.items():
            state[f"blocks.{i}.{ours_name}.weight"] = theirs[f"model.layers.{i}.{their_name}.weight"]
    ours.load_state_dict(state)
    return ours


@pytest.fixture
def llama_in_float64(monkeypatch):
    """transformers' RMS statistic and RoPE angles in the model's dtype instead of float32."""

    def rms_norm(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    def rotary(self, x, position_ids):
        half = self.inv_freq.numel()
        inv_freq = self.config.rope_parameters["rope_theta"] ** (-torch.arange(half, dtype=torch.float64) * 2 / (2 * half))
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", rms_norm)
    monkeypatch.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", rotary)


@pytest.mark.parametrize("seed", [0, 1])
def test_gpt_logits_match_llama_in_float64(llama_in_float64, seed):
    model = llama(torch.float64, seed)
    idx = torch.randint(VOCAB, (3, 9), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        assert_close(from_llama(model)(idx)[0], model(idx).logits)


def test_gpt_logits_match_llama_in_float32_as_transformers_computes_them():
    model = llama(torch.float32, 2)
    idx = torch.randint(VOCAB, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert_close(from_llama(model)(idx)[0], model(idx).logits)


def test_gpt_cached_logits_match_llama_with_its_cache(llama_in_float64):
    model = llama(torch.float64, 3)
    ours = from_llama(model)
    idx = torch.randint(VOCAB, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        theirs = model(idx[:, :6], use_cache=True)
        logits, cache = ours(idx[:, :6])
        assert_close(logits, theirs.logits)
        past = theirs.past_key_values
        for t in range(6, 10):
            theirs = model(idx[:, t:t + 1], cache=past, use_cache=True)
            past = theirs.past_key_values
            logits, cache = ours(idx[:, t:t + 1], cache)
            assert_close(logits, theirs.logits)
    for i, (k, v) in enumerate(cache):  # the same keys (rotated) and values, (B, h, T, d_k)
        assert_close(k, past.layers[i].keys)
        assert_close(v, past.layers[i].values)


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), d_model=st.integers(1, 24),
       eps=st.sampled_from([1e-6, 1e-5, 0.1]), dtype=dtypes, seed=st.integers(0, 2**16))
def test_rms_norm_matches_torch_rms_norm(shape, d_model, eps, dtype, seed):
    ours = randomise(RMSNorm(d_model, eps).to(dtype), seed)
    theirs = nn.RMSNorm(d_model, eps=eps).to(dtype)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(*shape, d_model, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    assert_close(ours(x), theirs(x))


def test_rms_norm_has_only_a_scale_named_weight_like_torch():
    assert dict(RMSNorm(6).named_parameters()).keys() == dict(nn.RMSNorm(6).named_parameters()).keys() == {"weight"}


@settings(max_examples=25, deadline=None)
@given(heads=st.integers(1, 3), length=st.integers(1, 7), half=st.integers(1, 6), shift=st.integers(1, 500),
       dtype=dtypes, seed=st.integers(0, 2**16))
def test_rope_scores_depend_only_on_the_offset(heads, length, half, shift, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, heads, length, 2 * half, generator=gen, dtype=torch.float64) for _ in range(2))
    positions = torch.randint(0, 50, (length,), generator=gen)
    scores = apply_rotary(q, positions) @ apply_rotary(k, positions).transpose(-2, -1)
    shifted = apply_rotary(q, positions + shift) @ apply_rotary(k, positions + shift).transpose(-2, -1)
    assert_close(shifted.to(dtype), scores.to(dtype))


def test_rope_is_a_rotation_and_the_identity_at_position_zero():
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    rotated = apply_rotary(x, torch.arange(5))
    assert_close(rotated.norm(dim=-1), x.norm(dim=-1))
    assert_close(rotated[:, :, 0], x[:, :, 0])


def test_rope_pairs_each_feature_with_the_one_half_a_head_away_as_llama_does():
    x = torch.randn(1, 2, 4, D_MODEL // N_HEADS, dtype=torch.float64)
    positions = torch.arange(3, 7)
    cos, sin = modeling_llama.LlamaRotaryEmbedding(llama(torch.float64, 0).config)(x, positions[None])
    theirs, _ = modeling_llama.apply_rotary_pos_emb(x, x, cos, sin)
    torch.testing.assert_close(apply_rotary(x, positions), theirs, rtol=1e-6, atol=1e-6)  # their angles: float32


def test_block_cache_grows_along_time_and_holds_rotated_keys():
    block = randomise(DecoderBlock(D_MODEL, N_HEADS, D_FF).double(), 4)
    x = torch.randn(2, 5, D_MODEL, dtype=torch.float64)
    out, (k, v) = block(x, torch.arange(5))
    assert out.shape == x.shape and k.shape == v.shape == (2, N_HEADS, 5, D_MODEL // N_HEADS)
    _, (k2, _) = block(x[:, :1], torch.tensor([5]), (k, v))
    assert k2.shape == (2, N_HEADS, 6, D_MODEL // N_HEADS)
    assert torch.equal(k2[:, :, :5], k)


@settings(max_examples=15, deadline=None)
@given(length=st.integers(2, 9), split=st.integers(1, 8), dtype=dtypes, seed=st.integers(0, 2**16))
def test_gpt_is_causal_and_cached_decoding_equals_uncached(length, split, dtype, seed):
    split = min(split, length - 1)
    model = randomise(GPT(VOCAB, D_MODEL, N_HEADS, N_LAYERS, D_FF).to(dtype), seed).eval()
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(VOCAB, (3, length), generator=gen)
    with torch.no_grad():
        full, _ = model(idx)
        changed = idx.clone()
        changed[:, split:] = torch.randint(VOCAB, changed[:, split:].shape, generator=gen)
        assert_close(model(changed)[0][:, :split], full[:, :split])
        first, cache = model(idx[:, :split])
        steps = [first]
        for t in range(split, length):
            logits, cache = model(idx[:, t:t + 1], cache)
            steps.append(logits)
    assert_close(torch.cat(steps, dim=1), full)


def test_lm_loss_scores_each_token_from_the_ones_before_it():
    model = randomise(GPT(VOCAB, D_MODEL, N_HEADS, N_LAYERS, D_FF).double(), 5).eval()
    idx = torch.randint(VOCAB, (3, 8))
    logits, _ = model(idx)
    expected = -logits[:, :-1].log_softmax(-1).gather(-1, idx[:, 1:, None]).mean()
    assert_close(lm_loss(model, idx), expected)


def small_model(seed: int) -> GPT:
    return randomise(GPT(VOCAB, D_MODEL, N_HEADS, N_LAYERS, D_FF).double(), seed).eval()


@pytest.mark.parametrize("options", [{}, {"top_k": 3}, {"top_p": 0.8}, {"temperature": 0.7, "top_k": 5, "top_p": 0.9}])
def test_seeded_generation_is_reproducible_and_the_cache_changes_nothing(options):
    model, idx = small_model(6), torch.randint(VOCAB, (3, 4))
    runs = [generate(model, idx, 8, use_cache=cached, generator=torch.Generator().manual_seed(7), **options)
            for cached in (True, False, True)]
    assert runs[0].shape == (3, 12) and torch.equal(runs[0][:, :4], idx)
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_temperature_towards_zero_is_greedy():
    model, idx = small_model(8), torch.randint(VOCAB, (4, 3))
    greedy = generate(model, idx, 6, temperature=0)
    steps = [model(greedy[:, :t])[0][:, -1].argmax(-1) for t in range(3, 9)]
    assert torch.equal(greedy[:, 3:], torch.stack(steps, dim=1))
    assert torch.equal(generate(model, idx, 6, temperature=1e-4, generator=torch.Generator().manual_seed(0)), greedy)


@settings(max_examples=10, deadline=None)
@given(k=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_top_k_never_samples_outside_the_k_largest(k, seed):
    model, idx = small_model(seed), torch.randint(VOCAB, (4, 3), generator=torch.Generator().manual_seed(seed))
    out = generate(model, idx, 5, temperature=3.0, top_k=k, generator=torch.Generator().manual_seed(seed))
    for t in range(3, 8):
        allowed = model(out[:, :t])[0][:, -1].topk(k, dim=-1).indices
        assert (allowed == out[:, t:t + 1]).any(dim=1).all()


def test_top_p_keeps_the_most_likely_token_even_when_it_alone_passes_p():
    model, idx = small_model(9), torch.randint(VOCAB, (4, 3))
    assert torch.equal(generate(model, idx, 5, top_p=1e-9, generator=torch.Generator().manual_seed(0)),
                       generate(model, idx, 5, temperature=0))
