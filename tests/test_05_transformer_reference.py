"""The chapter-5 reference is proven against PyTorch's Transformer layers and stacks, and against the paper.

torch's boolean masks mean "blocked" where ours mean "may attend": every comparison converts with ``~``.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from autograde_tests.checks.harness import default_dtype
from autograde_tests.reference import (
    DecoderLayer,
    EncoderLayer,
    Transformer,
    causal_mask,
    greedy_decode,
    padding_mask,
    positional_encoding,
    teacher_forcing_loss,
)

from .conftest import assert_close, randomise
from .strategies import dtypes, head_widths, heads, seeds

pytestmark = pytest.mark.usefixtures("one_thread")



def random_lengths(gen: torch.Generator, batch: int, length: int) -> torch.Tensor:
    """Lengths in 1 .. length, the first one full, so that padding really happens and no row is empty."""
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    lengths[0] = length
    return lengths


@st.composite
def layer_settings(draw):
    n_heads = draw(heads)
    return dict(
        d_model=n_heads * draw(head_widths),
        n_heads=n_heads,
        d_ff=draw(st.integers(1, 24)),
        norm_first=draw(st.booleans()),
        dtype=draw(dtypes),
        batch=draw(st.integers(1, 4)),
        src_len=draw(st.integers(1, 8)),
        tgt_len=draw(st.integers(1, 8)),
        padded=draw(st.booleans()),
        seed=draw(seeds),
    )



@pytest.mark.parametrize("max_len, d_model", [(1, 1), (7, 4), (50, 16), (9, 5), (300, 64)])
def test_positional_encoding_is_the_papers_sinusoids(max_len, d_model):
    pe = positional_encoding(max_len, d_model)
    assert pe.shape == (max_len, d_model) and pe.dtype == torch.get_default_dtype()
    expected = torch.tensor(
        [
            [
                math.sin(pos / 10000 ** (i / d_model)) if i % 2 == 0 else math.cos(pos / 10000 ** ((i - 1) / d_model))
                for i in range(d_model)
            ]
            for pos in range(max_len)
        ]
    )
    assert_close(pe, expected)


def test_positional_encoding_follows_the_default_dtype():
    with default_dtype(torch.float64):
        pe = positional_encoding(20, 8)
    assert pe.dtype == torch.float64
    assert_close(pe[7, 2], torch.tensor(math.sin(7 / 10000 ** (2 / 8)), dtype=torch.float64))


def test_position_zero_is_sin_0_cos_0():
    assert torch.equal(positional_encoding(3, 6)[0], torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]))


def test_a_shift_by_k_positions_is_the_same_rotation_for_every_position():
    """PE[pos + k] is a fixed linear function of PE[pos]: each (sin, cos) pair is rotated by angle k·ω_i."""
    d_model, k = 8, 5
    with default_dtype(torch.float64):
        pe = positional_encoding(40, d_model)
    omega = 1 / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    rotated = torch.empty_like(pe[:-k])
    sin, cos = pe[:-k, 0::2], pe[:-k, 1::2]
    rotated[:, 0::2] = sin * torch.cos(k * omega) + cos * torch.sin(k * omega)
    rotated[:, 1::2] = cos * torch.cos(k * omega) - sin * torch.sin(k * omega)
    torch.testing.assert_close(rotated, pe[k:], rtol=1e-9, atol=1e-9)


def test_every_position_gets_a_different_code():
    pe = positional_encoding(128, 32)
    distances = torch.cdist(pe, pe) + torch.eye(128) * 1e3
    assert distances.min() > 0.1


# ------------------------------------------------------------------------------ the layers vs torch


@settings(max_examples=60, deadline=None)
@given(s=layer_settings())
def test_encoder_layer_from_torch_matches_nn_transformer_encoder_layer(s):
    gen = torch.Generator().manual_seed(s["seed"])
    layer = nn.TransformerEncoderLayer(
        s["d_model"], s["n_heads"], s["d_ff"], dropout=0.0, batch_first=True, norm_first=s["norm_first"],
        dtype=s["dtype"],
    )
    layer = randomise(layer, s["seed"]).eval()
    x = torch.randn(s["batch"], s["src_len"], s["d_model"], generator=gen, dtype=torch.float64).to(s["dtype"])
    mask = padding_mask(random_lengths(gen, s["batch"], s["src_len"]), s["src_len"]) if s["padded"] else None
    expected = layer(x, src_key_padding_mask=None if mask is None else ~mask)
    assert_close(EncoderLayer.from_torch(layer)(x, mask), expected)


@settings(max_examples=60, deadline=None)
@given(s=layer_settings())
def test_decoder_layer_from_torch_matches_nn_transformer_decoder_layer(s):
    gen = torch.Generator().manual_seed(s["seed"])
    layer = nn.TransformerDecoderLayer(
        s["d_model"], s["n_heads"], s["d_ff"], dropout=0.0, batch_first=True, norm_first=s["norm_first"],
        dtype=s["dtype"],
    )
    layer = randomise(layer, s["seed"]).eval()
    B, S, T, d = s["batch"], s["src_len"], s["tgt_len"], s["d_model"]
    x = torch.randn(B, T, d, generator=gen, dtype=torch.float64).to(s["dtype"])
    memory = torch.randn(B, S, d, generator=gen, dtype=torch.float64).to(s["dtype"])
    tgt_mask = padding_mask(random_lengths(gen, B, T), T) if s["padded"] else None
    memory_mask = padding_mask(random_lengths(gen, B, S), S) if s["padded"] else None
    expected = layer(
        x,
        memory,
        tgt_mask=~causal_mask(T),
        tgt_key_padding_mask=None if tgt_mask is None else ~tgt_mask,
        memory_key_padding_mask=None if memory_mask is None else ~memory_mask,
    )
    assert_close(DecoderLayer.from_torch(layer)(x, memory, tgt_mask, memory_mask), expected)


@pytest.mark.parametrize("layer_class", [EncoderLayer, DecoderLayer])
def test_every_attention_in_a_layer_has_biases_like_torchs(layer_class):
    layer = layer_class(8, 2, 16)
    attentions = [m for name, m in layer.named_children() if name.endswith("attn")]
    assert attentions and all(attention.w_q.bias is not None and attention.w_o.bias is not None
                              for attention in attentions)


def test_layer_parameters_have_the_documented_names():
    encoder_keys = set(EncoderLayer(8, 2, 16).state_dict())
    decoder_keys = set(DecoderLayer(8, 2, 16).state_dict())
    attention = {f"w_{p}.{t}" for p in "qkvo" for t in ("weight", "bias")}
    ffn = {f"ffn.linear{i}.{t}" for i in (1, 2) for t in ("weight", "bias")}

    def norms(n):
        return {f"sublayers.{i}.norm.{t}" for i in range(n) for t in ("weight", "bias")}

    assert encoder_keys == {f"self_attn.{k}" for k in attention} | ffn | norms(2)
    assert decoder_keys == {f"{a}.{k}" for a in ("self_attn", "cross_attn") for k in attention} | ffn | norms(3)


def test_from_torch_copies_layer_norm_eps_and_refuses_what_it_cannot_represent():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, layer_norm_eps=1e-3)
    assert EncoderLayer.from_torch(layer).sublayers[0].norm.eps == 1e-3
    with pytest.raises(ValueError, match="ReLU"):
        EncoderLayer.from_torch(nn.TransformerEncoderLayer(8, 2, 16, activation="gelu", batch_first=True))
    with pytest.raises(ValueError, match="batch_first"):
        DecoderLayer.from_torch(nn.TransformerDecoderLayer(8, 2, 16))


# ------------------------------------------------------------------------------ the stacks vs torch


def embedded(model: Transformer, tokens: torch.Tensor, table: nn.Embedding) -> torch.Tensor:
    """The contract's embedding, written out: table(tokens) · √d_model + PE[position]."""
    return table(tokens) * math.sqrt(model.d_model) + positional_encoding(tokens.size(1), model.d_model).to(
        table.weight.dtype
    )


def model_from_torch_stacks(encoder, decoder, src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, norm_first,
                            dtype):
    """Our Transformer whose layers and final norms are copies of torch's stacks'."""
    model = Transformer(src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, norm_first=norm_first).to(dtype)
    model.encoder_layers = nn.ModuleList(EncoderLayer.from_torch(layer) for layer in encoder.layers)
    model.decoder_layers = nn.ModuleList(DecoderLayer.from_torch(layer) for layer in decoder.layers)
    if norm_first:
        model.encoder_norm.load_state_dict(encoder.norm.state_dict())
        model.decoder_norm.load_state_dict(decoder.norm.state_dict())
    return randomise_embeddings(model.eval())


def randomise_embeddings(model: Transformer) -> Transformer:
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in (model.src_embed.weight, model.tgt_embed.weight, model.head.weight, model.head.bias):
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) / math.sqrt(model.d_model))
    return model


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_encode_and_decode_are_torchs_stacks_on_the_embedded_tokens(norm_first, dtype):
    d_model, n_heads, n_layers, d_ff, B, S, T = 12, 3, 3, 20, 3, 7, 5
    kwargs = dict(dropout=0.0, batch_first=True, norm_first=norm_first, dtype=dtype)
    encoder = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(d_model, n_heads, d_ff, **kwargs),
        n_layers,
        norm=nn.LayerNorm(d_model, dtype=dtype) if norm_first else None,
        enable_nested_tensor=False,
    )
    decoder = nn.TransformerDecoder(
        nn.TransformerDecoderLayer(d_model, n_heads, d_ff, **kwargs),
        n_layers,
        norm=nn.LayerNorm(d_model, dtype=dtype) if norm_first else None,
    )
    encoder, decoder = randomise(encoder, 1).eval(), randomise(decoder, 2).eval()
    model = model_from_torch_stacks(encoder, decoder, 11, 9, d_model, n_heads, n_layers, d_ff, norm_first, dtype)
    gen = torch.Generator().manual_seed(3)
    src, tgt = torch.randint(11, (B, S), generator=gen), torch.randint(9, (B, T), generator=gen)
    src_mask, tgt_mask = padding_mask(torch.tensor([7, 3, 5]), S), padding_mask(torch.tensor([2, 5, 4]), T)

    memory = encoder(embedded(model, src, model.src_embed), src_key_padding_mask=~src_mask)
    assert_close(model.encode(src, src_mask), memory)
    states = decoder(
        embedded(model, tgt, model.tgt_embed),
        memory,
        tgt_mask=~causal_mask(T),
        tgt_key_padding_mask=~tgt_mask,
        memory_key_padding_mask=~src_mask,
    )
    assert_close(model.decode(tgt, memory, tgt_mask, src_mask), model.head(states))
    assert_close(model(src, tgt, src_mask, tgt_mask), model.head(states))


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_against_nn_transformer_whose_post_ln_stacks_carry_a_duplicate_final_norm(norm_first):
    """nn.Transformer ends both stacks with a LayerNorm even for Post-LN; the course's Post-LN does not."""
    d_model, n_heads, n_layers, d_ff = 8, 2, 2, 16
    theirs = nn.Transformer(
        d_model, n_heads, n_layers, n_layers, d_ff, dropout=0.0, batch_first=True, norm_first=norm_first,
        dtype=torch.float64,
    )
    theirs = randomise(theirs, 4).eval()
    model = model_from_torch_stacks(
        theirs.encoder, theirs.decoder, 10, 10, d_model, n_heads, n_layers, d_ff, norm_first, torch.float64
    )
    gen = torch.Generator().manual_seed(5)
    src, tgt = torch.randint(10, (2, 6), generator=gen), torch.randint(10, (2, 4), generator=gen)
    x, y = embedded(model, src, model.src_embed), embedded(model, tgt, model.tgt_embed)
    if not norm_first:
        with torch.no_grad():
            assert not torch.allclose(model.head(theirs(x, y, tgt_mask=~causal_mask(4))), model(src, tgt))
        theirs.encoder.norm, theirs.decoder.norm = nn.Identity(), nn.Identity()
    with torch.no_grad():
        assert_close(model(src, tgt), model.head(theirs(x, y, tgt_mask=~causal_mask(4))))


def test_final_layer_norms_exist_for_pre_ln_only():
    post, pre = Transformer(10, 9, 8, 2, 2, 16), Transformer(10, 9, 8, 2, 2, 16, norm_first=True)
    assert post.encoder_norm is None and post.decoder_norm is None
    assert isinstance(pre.encoder_norm, nn.Module) and isinstance(pre.decoder_norm, nn.Module)
    assert {k for k in pre.state_dict() if k not in post.state_dict()} == {
        f"{stack}_norm.{t}" for stack in ("encoder", "decoder") for t in ("weight", "bias")
    }


def test_the_positional_encoding_is_not_a_parameter_and_not_saved():
    model = Transformer(10, 9, 8, 2, 1, 16)
    assert "pe" not in model.state_dict() and all("pe" != name for name, _ in model.named_parameters())
    assert model.double().pe.dtype == torch.float64


# ------------------------------------------------------------------------------ properties of the model


def small_model(norm_first=False, seed=0) -> Transformer:
    torch.manual_seed(seed)
    return randomise(Transformer(13, 11, 16, 4, 2, 32, norm_first=norm_first).double(), seed).eval()


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_future_target_tokens_never_change_earlier_logits(norm_first):
    model = small_model(norm_first)
    src, tgt = torch.randint(13, (3, 6)), torch.randint(11, (3, 7))
    logits = model(src, tgt)
    for t in range(1, 7):
        changed = tgt.clone()
        changed[:, t:] = torch.randint(11, changed[:, t:].shape)
        assert_close(model(src, changed)[:, :t], logits[:, :t])


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_source_padding_never_changes_the_output(norm_first):
    model = small_model(norm_first, seed=1)
    src, tgt = torch.randint(13, (3, 8)), torch.randint(11, (3, 5))
    src_mask = padding_mask(torch.tensor([8, 5, 2]), 8)
    other_padding = torch.where(src_mask, src, torch.randint(13, src.shape))
    assert not torch.equal(other_padding, src)
    assert_close(model(other_padding, tgt, src_mask), model(src, tgt, src_mask))
    assert_close(model(src[1:2, :5], tgt[1:2]), model(src, tgt, src_mask)[1:2])  # as if never padded


def test_outputs_do_not_depend_on_batch_order():
    model = small_model(seed=2)
    src, tgt = torch.randint(13, (5, 6)), torch.randint(11, (5, 4))
    src_mask, tgt_mask = padding_mask(torch.tensor([6, 2, 4, 5, 1]), 6), padding_mask(torch.tensor([4, 4, 1, 3, 2]), 4)
    order = torch.tensor([3, 0, 4, 2, 1])
    assert_close(model(src[order], tgt[order], src_mask[order], tgt_mask[order]),
                 model(src, tgt, src_mask, tgt_mask)[order])


def test_embeddings_are_scaled_by_sqrt_d_model_before_the_positional_encoding_is_added():
    model = small_model(seed=3)
    tokens = torch.randint(13, (2, 5))
    expected = model.src_embed(tokens) * 4.0 + positional_encoding(5, 16).double()
    assert_close(model.embed(tokens, model.src_embed), expected)


def test_fresh_embeddings_are_about_as_large_as_the_positional_encoding():
    model = Transformer(10, 10, 64, 4, 1, 128)
    scaled = model.src_embed.weight * math.sqrt(64)
    # Mean square 1 per feature; the PE's is 1/2 (sin² + cos² = 1 per pair): the same order of size.
    assert 0.7 < scaled.pow(2).mean(-1).mean().item() < 1.3


def test_dropout_is_active_in_training_and_off_in_eval():
    torch.manual_seed(0)
    model = Transformer(10, 10, 16, 2, 1, 32, dropout=0.5)
    src, tgt = torch.randint(10, (2, 5)), torch.randint(10, (2, 4))
    assert not torch.allclose(model.train()(src, tgt), model(src, tgt))
    assert torch.equal(model.eval()(src, tgt), model(src, tgt))


# ------------------------------------------------------------------------------ teacher forcing


def test_teacher_forcing_loss_predicts_each_next_token_from_the_ones_before():
    model = small_model(seed=4)
    pad, bos, eos = 0, 1, 2
    src = torch.tensor([[5, 6, 7, eos], [8, 9, eos, pad]])
    tgt = torch.tensor([[bos, 7, 6, 5, eos], [bos, 9, 8, eos, pad]])
    total, count = 0.0, 0
    for b in range(2):
        real_src = src[b : b + 1, : int((src[b] != pad).sum())]
        for t in range(1, int((tgt[b] != pad).sum())):  # predict tgt[b, t] from tgt[b, :t]
            logits = model(real_src, tgt[b : b + 1, :t])[0, -1]
            total += -torch.log_softmax(logits, -1)[tgt[b, t]]
            count += 1
    assert_close(teacher_forcing_loss(model, src, tgt, pad), total / count)


def test_teacher_forcing_loss_is_differentiable():
    model = Transformer(10, 10, 8, 2, 1, 16)
    loss = teacher_forcing_loss(model, torch.randint(3, 10, (2, 4)), torch.randint(3, 10, (2, 5)), 0)
    loss.backward()
    assert loss.dim() == 0 and all(p.grad is not None for p in model.parameters())


# ------------------------------------------------------------------------------ greedy decoding


def naive_greedy(model, src, max_len, bos, eos):
    """One sequence, no padding, the whole model re-run at every step: the definition."""
    ys = [bos]
    while len(ys) < max_len and ys[-1] != eos:
        ys.append(int(model(src[None], torch.tensor([ys]))[0, -1].argmax()))
    return ys


def eos_prone_model(seed: int) -> Transformer:
    """A random model whose eos logit is raised, so that some sequences end early and others do not."""
    model = small_model(seed=seed)
    with torch.no_grad():
        model.head.bias[2] += 1.5
    return model


@pytest.mark.parametrize("seed", range(4))
def test_greedy_decode_of_a_padded_batch_is_each_sequence_decoded_alone(seed):
    model, bos, eos, max_len = eos_prone_model(seed), 1, 2, 9
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 5, 1, 6, 2])
    src = torch.randint(3, 13, (6, 7), generator=gen)
    out = greedy_decode(model, src, max_len, bos, eos, padding_mask(lengths, 7))
    assert out.dtype == torch.long and out.size(1) <= max_len
    assert (out[:, 0] == bos).all()
    for b, n in enumerate(lengths.tolist()):
        alone = naive_greedy(model, src[b, :n], max_len, bos, eos)
        padded_with_eos = alone + [eos] * (out.size(1) - len(alone))
        assert out[b].tolist() == padded_with_eos


def test_greedy_decode_stops_once_every_sequence_has_ended_and_pads_with_eos():
    ended = [0, 0]
    for seed in range(4):
        model = eos_prone_model(seed)
        src = torch.randint(3, 13, (6, 5), generator=torch.Generator().manual_seed(seed))
        out = greedy_decode(model, src, 12, 1, 2)
        finished = (out == 2).any(dim=1)
        if finished.all():
            assert (out[:, -1] == 2).all() and (out[:, -2] != 2).any()  # stopped at the last eos
        for row in out[finished]:
            first = int((row == 2).nonzero()[0])
            assert (row[first:] == 2).all()
        ended[0] += int(finished.sum())
        ended[1] += int((~finished).sum())
    assert ended[0] > 0 and ended[1] > 0  # the cases above include both kinds of sequences


def test_greedy_decode_never_exceeds_max_len_and_leaves_the_mode_alone():
    model = small_model(seed=5).train()  # dropout is 0: train mode changes nothing here but the flag
    assert greedy_decode(model, torch.randint(13, (3, 4)), 1, 1, 2).tolist() == [[1], [1], [1]]
    out = greedy_decode(model, torch.randint(13, (3, 4)), 6, 1, 10**6)  # an eos that never comes
    assert out.shape == (3, 6) and model.training


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
def test_greedy_decode_matches_nn_transformer_driven_the_same_way():
    theirs = randomise(
        nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True, norm_first=True, dtype=torch.float64), 8
    ).eval()
    model = model_from_torch_stacks(theirs.encoder, theirs.decoder, 10, 10, 8, 2, 1, 16, True, torch.float64)
    src = torch.randint(3, 10, (1, 6))
    ys = torch.tensor([[1]])
    memory = theirs.encoder(embedded(model, src, model.src_embed))
    with torch.no_grad():
        for _ in range(5):
            states = theirs.decoder(embedded(model, ys, model.tgt_embed), memory, tgt_mask=~causal_mask(ys.size(1)))
            ys = torch.cat([ys, model.head(states)[:, -1].argmax(-1, keepdim=True)], dim=1)
    ours = greedy_decode(model, src, 6, 1, eos_id=-1)
    assert torch.equal(ours, ys)


def test_greedy_decode_of_float_logits_uses_argmax_not_sampling():
    model = small_model(seed=9)
    src = torch.randint(13, (4, 5))
    assert torch.equal(greedy_decode(model, src, 7, 1, 2), greedy_decode(model, src, 7, 1, 2))
    first_step = model(src, torch.ones(4, 1, dtype=torch.long))[:, -1]
    assert torch.equal(greedy_decode(model, src, 2, 1, 2)[:, 1], F.softmax(first_step, -1).argmax(-1))
