"""The chapter-6 reference is proven against PyTorch's RMSNorm and Hugging Face's LlamaForCausalLM.

``transformers`` is a test-only dependency: a tiny LlamaConfig builds a model with random weights, no
download. LLaMA pairs RoPE's features half-split (``rotate_half``), as the course does, so the weights
copy across one for one. transformers computes two things in float32 whatever the model's dtype, the RMS
statistic and RoPE's angles (for half-precision training); the float64 comparisons raise those two to
float64, and change nothing else. Its attention runs as PyTorch's scaled_dot_product_attention ("sdpa"):
its "eager" attention takes the softmax in float32 too.
"""

import pytest
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama

from autograde_tests.reference import (
    GPT,
    DecoderBlock,
    RMSNorm,
    apply_rotary,
    generate,
    lm_loss,
    load_hf_llama,
    load_meta_llama,
)
from autograde_tests.reference.decoder_only import interleaved_to_half_split

from .conftest import assert_close, randomise
from .strategies import dtypes, lengths, seeds

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, D_MODEL, N_HEADS, N_LAYERS, D_FF = 13, 16, 4, 2, 24


def llama(dtype: torch.dtype, seed: int, n_kv_heads: int = N_HEADS, tied: bool = False) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=D_MODEL, intermediate_size=D_FF, num_hidden_layers=N_LAYERS,
                         num_attention_heads=N_HEADS, num_key_value_heads=n_kv_heads, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=tied,
                         attn_implementation="sdpa")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype).eval()
    with torch.no_grad():  # norms away from their starting ones, so a misplaced norm shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    return model


def from_llama(model: LlamaForCausalLM) -> GPT:
    """Our GPT with the Hugging Face model's weights, loaded by the reference's ``load_hf_llama``."""
    ours = GPT(VOCAB, D_MODEL, N_HEADS, N_LAYERS, D_FF, n_kv_heads=model.config.num_key_value_heads)
    ours = ours.to(model.dtype).eval()
    return load_hf_llama(ours, model.state_dict())


@pytest.fixture
def llama_in_float64(monkeypatch):
    """transformers' RMS statistic and RoPE angles in the model's dtype instead of float32."""

    def rms_norm(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    def rotary(self, x, position_ids):
        half = self.inv_freq.numel()
        inv_freq = self.config.rope_parameters["rope_theta"] ** (
            -torch.arange(half, dtype=torch.float64) * 2 / (2 * half))
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", rms_norm)
    monkeypatch.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", rotary)


@pytest.mark.parametrize("seed, n_kv_heads", [(0, N_HEADS), (1, N_HEADS), (5, N_HEADS // 2), (6, 1)])
def test_gpt_logits_match_llama_in_float64(llama_in_float64, seed, n_kv_heads):
    model = llama(torch.float64, seed, n_kv_heads)
    idx = torch.randint(VOCAB, (3, 9), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        assert_close(from_llama(model)(idx)[0], model(idx).logits)


@pytest.mark.parametrize("n_kv_heads", [N_HEADS, N_HEADS // 2])
def test_gpt_logits_match_llama_in_float32_as_transformers_computes_them(n_kv_heads):
    model = llama(torch.float32, 2, n_kv_heads)
    idx = torch.randint(VOCAB, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert_close(from_llama(model)(idx)[0], model(idx).logits)


@pytest.mark.parametrize("n_kv_heads", [N_HEADS, N_HEADS // 2, 1])
def test_gpt_cached_logits_match_llama_with_its_cache(llama_in_float64, n_kv_heads):
    model = llama(torch.float64, 3, n_kv_heads)
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
    for i, (k, v) in enumerate(cache):  # the same keys (rotated) and values, (B, h_kv, T, d_k): never repeated
        assert_close(k, past.layers[i].keys)
        assert_close(v, past.layers[i].values)


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), d_model=st.integers(1, 24),
       eps=st.sampled_from([1e-6, 1e-5, 0.1]), dtype=dtypes, seed=seeds)
def test_rms_norm_matches_torch_rms_norm(shape, d_model, eps, dtype, seed):
    ours = randomise(RMSNorm(d_model, eps).to(dtype), seed)
    theirs = nn.RMSNorm(d_model, eps=eps).to(dtype)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(*shape, d_model, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    assert_close(ours(x), theirs(x))


def test_rms_norm_has_only_a_scale_named_weight_like_torch():
    assert dict(RMSNorm(6).named_parameters()).keys() == dict(nn.RMSNorm(6).named_parameters()).keys() == {"weight"}


@settings(max_examples=25, deadline=None)
@given(heads=st.integers(1, 3), length=lengths, half=st.integers(1, 6), shift=st.integers(1, 500),
       dtype=dtypes, seed=seeds)
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


@pytest.mark.parametrize("n_kv_heads", [1, 2])
def test_grouped_query_block_caches_only_its_kv_heads(n_kv_heads):
    block = randomise(DecoderBlock(D_MODEL, N_HEADS, D_FF, n_kv_heads=n_kv_heads).double(), 4)
    assert block.w_k.out_features == block.w_v.out_features == n_kv_heads * (D_MODEL // N_HEADS)
    _, (k, v) = block(torch.randn(2, 5, D_MODEL, dtype=torch.float64), torch.arange(5))
    assert k.shape == v.shape == (2, n_kv_heads, 5, D_MODEL // N_HEADS)


def test_grouped_query_attention_equals_multi_head_with_each_kv_head_copied_to_its_group():
    grouped = randomise(DecoderBlock(D_MODEL, N_HEADS, D_FF, n_kv_heads=2).double(), 7)
    full = DecoderBlock(D_MODEL, N_HEADS, D_FF).double()
    state = grouped.state_dict()
    for key in ("w_k.weight", "w_v.weight"):  # (h_kv · d_k, d_model) -> (h · d_k, d_model), head j from KV head j // 2
        state[key] = (state[key].view(2, D_MODEL // N_HEADS, D_MODEL).repeat_interleave(2, dim=0)
                      .reshape(D_MODEL, D_MODEL))
    full.load_state_dict(state)
    x = torch.randn(3, 6, D_MODEL, dtype=torch.float64)
    assert_close(grouped(x, torch.arange(6))[0], full(x, torch.arange(6))[0])


@settings(max_examples=15, deadline=None)
@given(length=st.integers(2, 9), split=st.integers(1, 8), dtype=dtypes, seed=seeds)
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
@given(k=st.integers(1, 4), seed=seeds)
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


# ------------------------------------------------------------------------ loading a checkpoint
# Hugging Face's Llama checkpoints are what ``save_pretrained`` writes (no lm_head when the head is tied); Meta's
# layout is built from them by the inverse of the reordering Hugging Face's converter applies to wq and wk
# (convert_llama_weights_to_hf.py, "permute for sliced rotary"), and proven on its own against Meta's own RoPE,
# which turns neighbouring features as one complex number.

HF_TO_META = {"model.embed_tokens": "tok_embeddings", "model.norm": "norm", "lm_head": "output",
              "input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm",
              "self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
              "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo",
              "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3", "mlp.down_proj": "feed_forward.w2"}


def lively(model: LlamaForCausalLM, seed: int) -> LlamaForCausalLM:
    """``model`` with weights of a useful size (``randomise``): transformers' initialisation (std 0.02) leaves the
    scores near 0, where RoPE, and so the order of the rows of wq and wk, would barely show in the logits."""
    return randomise(model, seed)


def saved(model: LlamaForCausalLM, folder) -> dict:
    """The state dict a downloaded checkpoint holds: the model saved by ``save_pretrained``, read back."""
    model.save_pretrained(folder)
    return safetensors.torch.load_file(folder / "model.safetensors")


def to_meta(state: dict, d_k: int) -> dict:
    """A Hugging Face Llama state dict in Meta's layout: Meta's names, and in each head of wq and wk the rows of
    pair i, (i, i + d_k/2) in Hugging Face's, put next to each other at (2i, 2i + 1)."""
    meta = {}
    for key, w in state.items():
        name = key.removesuffix(".weight")
        if name.startswith("model.layers."):
            i, part = name.removeprefix("model.layers.").split(".", 1)
            name = f"layers.{i}.{HF_TO_META[part]}"
            if part in ("self_attn.q_proj", "self_attn.k_proj"):
                w = w.view(-1, 2, d_k // 2, w.size(1)).transpose(1, 2).reshape(w.shape)
        else:
            name = HF_TO_META[name]
        meta[f"{name}.weight"] = w.clone()
    return meta


def loaded_into_a_random_gpt(loader, checkpoint: dict, model: LlamaForCausalLM) -> GPT:
    """A GPT with random weights of its own (so a weight not loaded shows), loaded by ``loader``."""
    config = model.config
    ours = randomise(GPT(VOCAB, D_MODEL, N_HEADS, N_LAYERS, D_FF, n_kv_heads=config.num_key_value_heads), 11)
    ours = ours.to(model.dtype).eval()
    assert loader(ours, checkpoint) is ours  # in place, and returned
    return ours


LOADS = [(torch.float64, False, N_HEADS), (torch.float64, True, N_HEADS // 2), (torch.float64, False, 1),
         (torch.float32, True, 1), (torch.float32, False, N_HEADS // 2)]


@pytest.mark.parametrize("dtype, tied, n_kv_heads", LOADS)
def test_load_hf_llama_gives_the_logits_of_the_saved_llama(dtype, tied, n_kv_heads, request, tmp_path):
    if dtype == torch.float64:
        request.getfixturevalue("llama_in_float64")
    model = lively(llama(dtype, 20 + n_kv_heads, n_kv_heads, tied), n_kv_heads)
    checkpoint = saved(model, tmp_path)
    assert ("lm_head.weight" in checkpoint) is not tied  # a tied checkpoint holds no head: it is the embedding
    ours = loaded_into_a_random_gpt(load_hf_llama, checkpoint, model)
    idx = torch.randint(VOCAB, (3, 9), generator=torch.Generator().manual_seed(n_kv_heads))
    with torch.no_grad():
        assert_close(ours(idx)[0], model(idx).logits)


@pytest.mark.parametrize("dtype, tied, n_kv_heads", LOADS)
def test_load_meta_llama_gives_the_same_logits_from_metas_layout(dtype, tied, n_kv_heads, request, tmp_path):
    if dtype == torch.float64:
        request.getfixturevalue("llama_in_float64")
    model = lively(llama(dtype, 30 + n_kv_heads, n_kv_heads, tied), n_kv_heads)
    checkpoint = to_meta(saved(model, tmp_path), D_MODEL // N_HEADS)
    assert ("output.weight" in checkpoint) is not tied
    ours = loaded_into_a_random_gpt(load_meta_llama, checkpoint, model)
    idx = torch.randint(VOCAB, (2, 10), generator=torch.Generator().manual_seed(n_kv_heads))
    with torch.no_grad():
        assert_close(ours(idx)[0], model(idx).logits)


def test_metas_layout_differs_from_hugging_faces_and_loads_wrong_without_the_reordering(tmp_path):
    """The test's Meta layout is not Hugging Face's under other names: loaded as Hugging Face's, it gives other
    logits."""
    model = lively(llama(torch.float64, 40, N_HEADS // 2), 40)
    hf = saved(model, tmp_path)
    meta = to_meta(hf, D_MODEL // N_HEADS)
    renamed = {key: meta[next(iter(to_meta({key: w}, D_MODEL // N_HEADS)))] for key, w in hf.items()}
    unordered = loaded_into_a_random_gpt(load_hf_llama, renamed, model)
    idx = torch.randint(VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.allclose(unordered(idx)[0], model(idx).logits, rtol=0.01, atol=0.01)


def meta_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Meta's LLaMA RoPE (apply_rotary_emb): features (2i, 2i + 1) as the complex number x_2i + i·x_2i+1, turned
    by e^(i·p·θ_i), θ_i = base^(-2i/d_k)."""
    d_k = x.size(-1)
    theta = base ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
    turn = torch.polar(torch.ones(len(positions), d_k // 2, dtype=torch.float64), positions[:, None].double() * theta)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d_k // 2, 2).contiguous())
    return torch.view_as_real(z * turn).flatten(-2).to(x.dtype)


@pytest.mark.parametrize("n_heads, n_kv_heads, d_k", [(2, 2, 8), (4, 2, 6), (3, 1, 12)])
def test_reordered_rows_give_metas_rotated_scores_with_the_courses_rope(n_heads, n_kv_heads, d_k):
    """Meta's scores, from its own weights and RoPE, are the course's from the reordered weights and half-split
    RoPE: the query and key features are permuted alike, so every dot product is the same."""
    d_model, T = n_heads * d_k, 7
    gen = torch.Generator().manual_seed(n_heads * 100 + d_k)
    x = torch.randn(T, d_model, generator=gen, dtype=torch.float64)
    wq = torch.randn(n_heads * d_k, d_model, generator=gen, dtype=torch.float64)
    wk = torch.randn(n_kv_heads * d_k, d_model, generator=gen, dtype=torch.float64)
    positions = torch.arange(3, 3 + T)

    def scores(q_weight, k_weight, rotary):
        q = rotary((x @ q_weight.T).view(T, n_heads, d_k).transpose(0, 1), positions)  # (h, T, d_k)
        k = rotary((x @ k_weight.T).view(T, n_kv_heads, d_k).transpose(0, 1), positions)  # (h_kv, T, d_k)
        return q @ k.repeat_interleave(n_heads // n_kv_heads, dim=0).transpose(-2, -1)  # (h, T, T)

    theirs = scores(wq, wk, meta_rotary)
    ours = scores(interleaved_to_half_split(wq, d_k), interleaved_to_half_split(wk, d_k), apply_rotary)
    assert_close(ours, theirs)
    assert not torch.allclose(scores(wq, wk, apply_rotary), theirs)  # unordered, the course's RoPE turns other pairs


@pytest.mark.parametrize("loader, layout", [(load_hf_llama, lambda state: state),
                                            (load_meta_llama, lambda state: to_meta(state, D_MODEL // N_HEADS))])
def test_a_loaded_model_keeps_its_dtype_and_shares_no_memory_with_the_checkpoint(loader, layout, tmp_path):
    model = llama(torch.float32, 50, N_HEADS // 2)
    checkpoint = {key: w.to(torch.bfloat16) for key, w in layout(saved(model, tmp_path)).items()}  # as published
    kept = {key: w.clone() for key, w in checkpoint.items()}
    ours = loaded_into_a_random_gpt(loader, checkpoint, llama(torch.float64, 50, N_HEADS // 2))
    assert {p.dtype for p in ours.parameters()} == {torch.float64}
    assert all(torch.equal(checkpoint[key], w) for key, w in kept.items())  # the checkpoint is left as it was
    before = {key: p.clone() for key, p in ours.state_dict().items()}
    for w in checkpoint.values():
        w.zero_()
    assert all(torch.equal(p, before[key]) for key, p in ours.state_dict().items())
