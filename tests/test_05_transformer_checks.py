"""The chapter-5 checks pass every correct way of writing the code and name every known mistake.

Each buggy variant is one entry of the design's mistake list for 05_transformer (or a near relative),
written the way a learner would write it: mostly one of this file's correct variants with one edit
(``tests.variants.variant``), by hand where the mistake is in the structure (another __init__, other
layers); each test asserts the message that names it.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autograde_tests.reference as R
from autograde_tests.checks import (
    check_decoder_layer,
    check_encoder_layer,
    check_greedy_decode,
    check_positional_encoding,
    check_teacher_forcing_loss,
    check_transformer,
)
from autograde_tests.checks.transformer import (
    GREEDY_MISTAKES,
    HIDDEN_DECODE,
    VISIBLE_DECODE,
    decode_inputs,
    decoding_model,
)
from tests.conftest import fails
from tests.variants import variant

pytestmark = pytest.mark.usefixtures("learner_side", "one_thread")  # in-process and through the wire; one thread


def pe_annotated(max_len, d_model):
    pe = torch.zeros(max_len, d_model)
    position = torch.arange(0, max_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def pe_stacked(max_len, d_model):
    pos = torch.arange(max_len) * 1.0
    freq = 10000 ** (-torch.arange(0, d_model, 2) / d_model)
    angle = pos[:, None] * freq  # (max_len, d_model / 2)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(max_len, d_model)


def pe_python_loops(max_len, d_model):
    rows = []
    for pos in range(max_len):
        row = []
        for k in range(d_model):
            angle = pos / 10000 ** ((k - k % 2) / d_model)
            row.append(math.sin(angle) if k % 2 == 0 else math.cos(angle))
        rows.append(row)
    return torch.tensor(rows)


@pytest.mark.parametrize("positional_encoding", [pe_annotated, pe_stacked, pe_python_loops, R.positional_encoding])
@pytest.mark.parametrize("hidden", [False, True])
def test_positional_encoding_check_passes_correct_variants(positional_encoding, hidden, capsys):
    check_positional_encoding(positional_encoding, hidden=hidden)
    assert "✔ positional_encoding" in capsys.readouterr().out


# ------------------------------------------------------------------------ positional_encoding: mistakes


@pytest.mark.parametrize(
    "positional_encoding, message",
    [
        (variant(pe_stacked, ("[angle.sin(), angle.cos()]", "[angle.cos(), angle.sin()]")), r"sin and cos are swapped"),
        (variant(pe_python_loops, ("(k - k % 2) / d_model", "k / d_model")), r"exponent uses the feature index"),
        # concatenated: all the sines, then all the cosines, instead of interleaved
        (variant(pe_stacked, ("torch.stack", "torch.cat")), r"first half .* second half"),
        (variant(pe_annotated, ("return pe", "return pe.T")), r"\(d_model, max_len\) instead of \(max_len, d_model\)"),
        (variant(pe_annotated, ("return pe", "return pe.float()")),
         r"returns torch.float32 when the default dtype is torch.float64"),
    ],
)
def test_positional_encoding_check_names_the_mistake(positional_encoding, message):
    with fails(message):
        check_positional_encoding(positional_encoding)


def test_unwritten_exercise_says_so():
    def positional_encoding(max_len, d_model):
        raise NotImplementedError()

    with fails("is not written yet"):
        check_positional_encoding(positional_encoding)


# ------------------------------------------------------------------------ EncoderLayer: correct


class EncoderExplicit(nn.Module):
    """Without SublayerConnection: the residual wiring written out, the norms kept where the names say."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = R.MultiHeadAttention(d_model, n_heads, bias=True)
        self.ffn = R.PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayers = nn.ModuleList(nn.Module() for _ in range(2))
        for sublayer in self.sublayers:
            sublayer.norm = nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x, padding_mask=None):
        mask = None if padding_mask is None else padding_mask.view(x.size(0), 1, 1, -1)
        n1, n2 = self.sublayers[0].norm, self.sublayers[1].norm
        if self.norm_first:
            h = n1(x)
            x = x + self.drop(self.self_attn(h, h, mask)[0])
            return x + self.drop(self.ffn(n2(x)))
        x = n1(x + self.drop(self.self_attn(x, mask=mask)[0]))
        return n2(x + self.drop(self.ffn(x)))


class EncoderWithWhere(R.EncoderLayer):
    """The padding mask expanded to every query by hand."""

    def forward(self, x, padding_mask=None):
        mask = None
        if padding_mask is not None:
            mask = padding_mask.unsqueeze(1).unsqueeze(2).expand(-1, -1, x.size(1), -1)
        x = self.sublayers[0](x, lambda h: self.self_attn(h, h, mask)[0])
        return self.sublayers[1](x, lambda h: self.ffn(h))


CORRECT_ENCODERS = [R.EncoderLayer, EncoderExplicit, EncoderWithWhere]


@pytest.mark.parametrize("EncoderLayer", CORRECT_ENCODERS)
@pytest.mark.parametrize("hidden", [False, True])
def test_encoder_layer_check_passes_correct_variants(EncoderLayer, hidden, capsys):
    check_encoder_layer(EncoderLayer, hidden=hidden)
    assert "✔ EncoderLayer" in capsys.readouterr().out


# ------------------------------------------------------------------------ EncoderLayer: mistakes


EncoderIgnoringPadding = variant(EncoderWithWhere, ("self.self_attn(h, h, mask)", "self.self_attn(h, h)"))


class EncoderIgnoringNormFirst(R.EncoderLayer):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first=not norm_first)


class EncoderWithoutBiases(R.EncoderLayer):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first)
        self.self_attn = R.MultiHeadAttention(d_model, n_heads)


@pytest.mark.parametrize(
    "EncoderLayer, message",
    [
        (EncoderIgnoringPadding, r"padding mask is ignored"),
        (variant(EncoderExplicit, ("else padding_mask.view", "else (~padding_mask).view")),
         r"padding mask polarity inverted"),
        (variant(EncoderExplicit, ("view(x.size(0), 1, 1, -1)", "view(x.size(0), 1, -1, 1)")),
         r"query axis instead of the key axis"),
        (EncoderIgnoringNormFirst, r"Pre-LN and Post-LN swapped"),
        (EncoderWithoutBiases, r"attention has no biases"),
        # F.dropout's training defaults to True: it never sees the module's eval mode
        (variant(EncoderWithWhere, ("lambda h: self.ffn(h)", "lambda h: F.dropout(self.ffn(h), 0.5)")),
         r"dropout is still active"),
    ],
)
def test_encoder_layer_check_names_the_mistake(EncoderLayer, message):
    with fails(message):
        check_encoder_layer(EncoderLayer)


# ------------------------------------------------------------------------ DecoderLayer: correct


class DecoderExplicit(nn.Module):
    """Masks built by hand with triu and unsqueeze, the sublayers written out."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = R.MultiHeadAttention(d_model, n_heads, bias=True)
        self.cross_attn = R.MultiHeadAttention(d_model, n_heads, bias=True)
        self.ffn = R.PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayers = nn.ModuleList(R.SublayerConnection(d_model, dropout, norm_first) for _ in range(3))

    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        T = x.size(1)
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
        self_mask = ~future
        if tgt_padding_mask is not None:
            self_mask = self_mask.unsqueeze(0).unsqueeze(0) & tgt_padding_mask.unsqueeze(1).unsqueeze(2)
        cross_mask = None if memory_padding_mask is None else memory_padding_mask.unsqueeze(1).unsqueeze(1)
        x = self.sublayers[0](x, lambda h: self.self_attn(h, mask=self_mask)[0])
        x = self.sublayers[1](x, lambda h: self.cross_attn(h, memory, mask=cross_mask)[0])
        return self.sublayers[2](x, self.ffn)


class DecoderWithFloatMaskLogic(R.DecoderLayer):
    """The causal and padding masks combined with torch.logical_and, over explicit (B, 1, T, T) shapes."""

    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        B, T, _ = x.shape
        self_mask = R.causal_mask(T, device=x.device).expand(B, 1, T, T)
        if tgt_padding_mask is not None:
            self_mask = torch.logical_and(self_mask, tgt_padding_mask[:, None, None, :])
        cross_mask = None
        if memory_padding_mask is not None:
            cross_mask = memory_padding_mask[:, None, None, :].expand(B, 1, T, memory.size(1))
        for i, f in enumerate(
            (lambda h: self.self_attn(h, h, self_mask)[0], lambda h: self.cross_attn(h, memory, cross_mask)[0],
             self.ffn)
        ):
            x = self.sublayers[i](x, f)
        return x


CORRECT_DECODERS = [R.DecoderLayer, DecoderExplicit, DecoderWithFloatMaskLogic]


@pytest.mark.parametrize("DecoderLayer", CORRECT_DECODERS)
@pytest.mark.parametrize("hidden", [False, True])
def test_decoder_layer_check_passes_correct_variants(DecoderLayer, hidden, capsys):
    check_decoder_layer(DecoderLayer, hidden=hidden)
    assert "✔ DecoderLayer" in capsys.readouterr().out


# ------------------------------------------------------------------------ DecoderLayer: mistakes


DecoderWithoutCausalMask = variant(DecoderExplicit, ("self_mask = ~future", "self_mask = torch.ones_like(future)"))


@pytest.mark.parametrize(
    "DecoderLayer, message",
    [
        (DecoderWithoutCausalMask, r"decoder self-attention without the causal mask"),
        (variant(DecoderExplicit, ("self_mask = ~future", "self_mask = ~future.T")), r"causal mask is transposed"),
        (variant(DecoderExplicit, ("diagonal=1", "diagonal=0")), r"causal mask excludes the diagonal"),
        (variant(DecoderExplicit, ("self.cross_attn(h, memory, mask=cross_mask)", "self.cross_attn(h)")),
         r"cross-attention attends to the decoder's own states"),
        (variant(DecoderExplicit, ("self.cross_attn(h, memory, mask=cross_mask)", "self.cross_attn(h, memory)")),
         r"ignores the memory padding mask"),
        (variant(DecoderExplicit, (" & tgt_padding_mask.unsqueeze(1).unsqueeze(2)", "")),
         r"ignores the target padding mask"),
        (variant(DecoderExplicit, ("& tgt_padding_mask.unsqueeze", "& memory_padding_mask.unsqueeze"),
                 ("else memory_padding_mask.unsqueeze", "else tgt_padding_mask.unsqueeze")),
         r"padding masks are swapped|raised RuntimeError"),
        (variant(DecoderExplicit, ("dtype=torch.bool, device=x.device)", "dtype=torch.bool)")), r"fixed device"),
    ],
)
def test_decoder_layer_check_names_the_mistake(DecoderLayer, message):
    with fails(message):
        check_decoder_layer(DecoderLayer)


class DecoderIgnoringNormFirst(R.DecoderLayer):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first=False)


class DecoderWithoutCrossBiases(R.DecoderLayer):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first)
        self.cross_attn = R.MultiHeadAttention(d_model, n_heads)


@pytest.mark.parametrize(
    "DecoderLayer, message",
    [(DecoderIgnoringNormFirst, r"Pre-LN and Post-LN swapped"),
     (DecoderWithoutCrossBiases, r"attention has no biases")],
)
def test_decoder_layer_check_names_layer_wide_mistakes(DecoderLayer, message):
    with fails(message):
        check_decoder_layer(DecoderLayer)


# ------------------------------------------------------------------------ Transformer: correct


class TransformerOnTheFly(nn.Module):
    """The positional encoding computed in every call, on the tokens' device; Identity as Post-LN's norms."""

    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0, norm_first=False,
                 max_len=512):
        super().__init__()
        self.d_model = d_model
        self.src_embed, self.tgt_embed = nn.Embedding(src_vocab, d_model), nn.Embedding(tgt_vocab, d_model)
        self.encoder_layers = nn.ModuleList(
            [R.EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers)]
        )
        self.decoder_layers = nn.ModuleList(
            [R.DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers)]
        )
        self.encoder_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.head = nn.Linear(d_model, tgt_vocab)

    def _embed(self, tokens, table):
        pe = R.positional_encoding(tokens.size(1), self.d_model).to(table.weight)
        return table(tokens) * self.d_model**0.5 + pe.unsqueeze(0)

    def encode(self, src, src_padding_mask=None):
        x = self._embed(src, self.src_embed)
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=src_padding_mask)
        return self.encoder_norm(x)

    def decode(self, tgt, memory, tgt_padding_mask=None, src_padding_mask=None):
        y = self._embed(tgt, self.tgt_embed)
        for layer in self.decoder_layers:
            y = layer(y, memory, tgt_padding_mask=tgt_padding_mask, memory_padding_mask=src_padding_mask)
        return self.head(self.decoder_norm(y))

    def forward(self, src, tgt, src_padding_mask=None, tgt_padding_mask=None):
        return self.decode(tgt, self.encode(src, src_padding_mask), tgt_padding_mask, src_padding_mask)


class TransformerPersistentBuffer(R.Transformer):
    """A persistent (1, max_len, d_model) PE buffer, the scale applied through Embedding-like multiplication."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        pe = self.pe
        del self.pe
        self.register_buffer("pe", pe.unsqueeze(0))  # persistent: it is in the state_dict

    def embed(self, tokens, embedding):
        return embedding(tokens).mul(math.sqrt(self.d_model)).add(self.pe[:, : tokens.size(1), :])


CORRECT_TRANSFORMERS = [R.Transformer, TransformerOnTheFly, TransformerPersistentBuffer]


@pytest.mark.parametrize("Transformer", CORRECT_TRANSFORMERS)
@pytest.mark.parametrize("hidden", [False, True])
def test_transformer_check_passes_correct_variants(Transformer, hidden, capsys):
    check_transformer(Transformer, hidden=hidden)
    assert "✔ Transformer" in capsys.readouterr().out


# ------------------------------------------------------------------------ Transformer: mistakes


TransformerUnscaled = variant(TransformerOnTheFly, (" * self.d_model**0.5", ""), method="_embed")


class DuplicateFinalNorm(R.Transformer):
    def __init__(self, *args, norm_first=False, **kwargs):
        super().__init__(*args, norm_first=norm_first, **kwargs)
        self.encoder_norm, self.decoder_norm = R.LayerNorm(self.d_model), R.LayerNorm(self.d_model)


class PreLNWithoutFinalNorm(R.Transformer):
    def __init__(self, *args, norm_first=False, **kwargs):
        super().__init__(*args, norm_first=norm_first, **kwargs)
        self.encoder_norm = self.decoder_norm = None


class TransformerWithNonCausalLayers(R.Transformer):
    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0, norm_first=False,
                 max_len=512):
        super().__init__(src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout, norm_first, max_len)
        self.decoder_layers = nn.ModuleList(
            DecoderWithoutCausalMask(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers)
        )


class TransformerWithLayersIgnoringPadding(R.Transformer):
    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0, norm_first=False,
                 max_len=512):
        super().__init__(src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout, norm_first, max_len)
        self.encoder_layers = nn.ModuleList(
            EncoderIgnoringPadding(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers)
        )


@pytest.mark.parametrize(
    "Transformer, message",
    [
        (TransformerUnscaled, r"token embeddings not scaled by sqrt\(d_model\)"),
        # the sequence-first habit: one encoding row per sequence, broadcast over its positions
        (variant(TransformerOnTheFly, ("tokens.size(1)", "tokens.size(0)"), ("pe.unsqueeze(0)", "pe.unsqueeze(1)"),
                 method="_embed"), r"positional encoding indexed by batch instead of position"),
        (variant(TransformerOnTheFly, (" + pe.unsqueeze(0)", ""), method="_embed"),
         r"positional encoding is not added"),
        (variant(TransformerOnTheFly, ("+ pe.unsqueeze(0)", "+ pe.unsqueeze(0) + pe.unsqueeze(0)"), method="_embed"),
         r"positional encoding is added twice"),
        (variant(TransformerOnTheFly, ("table(tokens) * self.d_model**0.5 + pe.unsqueeze(0)",
                                       "(table(tokens) + pe.unsqueeze(0)) * self.d_model**0.5"), method="_embed"),
         r"added before the sqrt\(d_model\) scale"),
        (variant(TransformerOnTheFly, ("self.tgt_embed", "self.src_embed"), method="decode"),
         r"decoder fed the source embeddings"),
        (variant(TransformerOnTheFly, ("self.decode(tgt,", "self.decode(src,"),
                 ("tgt_padding_mask, src_padding_mask)", "src_padding_mask, src_padding_mask)")),
         r"the decoder was fed the source"),
        (variant(TransformerOnTheFly, ("layer(y, memory,", "layer(y, y,"),
                 (", memory_padding_mask=src_padding_mask", ""), method="decode"),
         r"cross-attention attending to the decoder's own states"),
        (DuplicateFinalNorm, r"duplicate final LayerNorm on a Post-LN stack"),
        # a parameter-free layer_norm before the final norm: a second LayerNorm where Post-LN's is the Identity
        (variant(TransformerOnTheFly, ("self.encoder_norm(x)", "self.encoder_norm(F.layer_norm(x, (self.d_model,)))"),
                 method="encode"), r"duplicate final LayerNorm on a Post-LN stack"),
        (PreLNWithoutFinalNorm, r"Pre-LN stack .* must end with a final LayerNorm"),
        (variant(TransformerOnTheFly, ("layer(x, padding_mask=src_padding_mask)", "layer(x)"), method="encode"),
         r"encoder layers do not get src_padding_mask"),
        (variant(TransformerOnTheFly, ("return self.head(self.decoder_norm(y))", "return y"), method="decode"),
         r"returns the decoder's states"),
        (variant(TransformerOnTheFly, ("tgt_padding_mask, src_padding_mask)", "src_padding_mask, tgt_padding_mask)")),
         r"padding masks (are )?passed the wrong way round"),
        (TransformerWithNonCausalLayers, r"decoder can see the future"),
        (TransformerWithLayersIgnoringPadding, r"changing the source's padding tokens changed the logits"),
        (variant(TransformerOnTheFly, ("return self.encoder_norm(x)", "return self.encoder_norm(x).detach()"),
                 method="encode"), r"get no gradient"),
        (variant(TransformerOnTheFly, (".to(table.weight)", ""), method="_embed"), r"fixed device"),
    ],
)
def test_transformer_check_names_the_mistake(Transformer, message):
    with fails(message):
        check_transformer(Transformer)


def test_transformer_check_finds_a_model_that_cannot_learn(monkeypatch):
    """A model whose numbers are right but which a training step cannot improve: the optimiser sees no
    parameters (they are hidden from .parameters())."""

    class Unlearnable(R.Transformer):
        def parameters(self, recurse=True):
            return iter([nn.Parameter(torch.zeros(1))])

    with fails(r"cannot learn: trained on one fixed batch"):
        check_transformer(Unlearnable)


# ------------------------------------------------------------------------ teacher_forcing_loss


def loss_gathered(model, src, tgt, pad_id):
    inputs, labels = tgt[:, :-1], tgt[:, 1:]
    log_probs = model(src, inputs, src != pad_id, inputs != pad_id).log_softmax(-1)
    picked = log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    real = labels != pad_id
    return -(picked * real).sum() / real.sum()


def loss_flattened(model, src, tgt, pad_id):
    logits = model(src, tgt[:, :-1], src_padding_mask=src.ne(pad_id), tgt_padding_mask=tgt[:, :-1].ne(pad_id))
    labels = tgt[:, 1:].reshape(-1)
    keep = labels != pad_id
    return F.cross_entropy(logits.reshape(-1, logits.size(-1))[keep], labels[keep])


@pytest.mark.parametrize("loss_fn", [R.teacher_forcing_loss, loss_gathered, loss_flattened])
@pytest.mark.parametrize("hidden", [False, True])
def test_teacher_forcing_loss_check_passes_correct_variants(loss_fn, hidden, capsys):
    check_teacher_forcing_loss(loss_fn, hidden=hidden)
    assert "✔ teacher_forcing_loss" in capsys.readouterr().out


SHIFTED = "inputs, labels = tgt[:, :-1], tgt[:, 1:]"  # loss_gathered's decoder inputs and labels


@pytest.mark.parametrize(
    "loss_fn, message",
    [
        (variant(loss_gathered, (SHIFTED, "inputs, labels = tgt, tgt")),
         r"targets not shifted right .* reads the very token it must predict"),
        (variant(loss_gathered, (SHIFTED, "inputs, labels = tgt[:, :-1], tgt[:, :-1]")),
         r"targets not shifted right .* asked to copy what it sees"),
        (variant(loss_gathered, (SHIFTED, "inputs, labels = tgt[:, 1:], tgt[:, :-1]")), r"shift goes the wrong way"),
        (variant(loss_flattened, ("[keep], labels[keep]", ", labels")), r"padding positions are counted in the loss"),
        (variant(loss_flattened, ("src_padding_mask=src.ne(pad_id), ", "")), r"source padding mask is not passed"),
        (variant(loss_gathered, ("log_softmax(-1)", "log_softmax(-1).detach()")), r"detached from the model"),
        (variant(loss_flattened, ("labels[keep])", "labels[keep]).item()")), r"should be a torch.Tensor, got float"),
    ],
)
def test_teacher_forcing_loss_check_names_the_mistake(loss_fn, message):
    with fails(message):
        check_teacher_forcing_loss(loss_fn)


# ------------------------------------------------------------------------ greedy_decode


@pytest.mark.parametrize("case", VISIBLE_DECODE + HIDDEN_DECODE)
def test_every_decoding_case_tells_every_mistake_apart(case):
    model, (src, mask) = decoding_model(case), decode_inputs(case)
    expected = R.greedy_decode(model, src, case.max_len, case.bos, case.eos, mask)
    for mistake in GREEDY_MISTAKES:
        with torch.no_grad():
            mistaken = mistake.compute(model, src, case.max_len, case.bos, case.eos, mask)
        length = max(mistaken.size(1), expected.size(1))
        padded = [torch.cat([t, torch.full((t.size(0), length - t.size(1)), case.eos)], dim=1)
                  for t in (mistaken, expected)]
        assert not torch.equal(*padded), mistake.problem


@pytest.mark.parametrize("cases", [VISIBLE_DECODE, HIDDEN_DECODE], ids=["visible", "hidden"])
def test_decoding_cases_include_sequences_that_end_early_and_ones_that_do_not(cases):
    ended_early = ran_to_the_end = 0
    for case in cases:
        src, mask = decode_inputs(case)
        out = R.greedy_decode(decoding_model(case), src, case.max_len, case.bos, case.eos, mask)
        first_eos = [(row == case.eos).nonzero()[0].item() if (row == case.eos).any() else None for row in out]
        ended_early += sum(e is not None and e < case.max_len - 1 for e in first_eos)
        ran_to_the_end += sum(e is None for e in first_eos)
    assert ended_early >= 2 and ran_to_the_end >= 2


@pytest.mark.parametrize("case", VISIBLE_DECODE + HIDDEN_DECODE)
def test_decoding_cases_have_no_near_ties_that_rounding_could_flip(case):
    model, (src, mask) = decoding_model(case), decode_inputs(case)
    out = R.greedy_decode(model, src, case.max_len, case.bos, case.eos, mask)
    with torch.no_grad():
        logits = model(src, out[:, :-1], mask)
    top2 = logits.topk(2, dim=-1).values
    assert (top2[..., 0] - top2[..., 1]).min() > 1e-4


@torch.no_grad()
def greedy_rerunning_the_model(model, src, max_len, bos_id, eos_id, src_padding_mask=None):
    ys = torch.full((src.size(0), 1), bos_id, device=src.device)
    while ys.size(1) < max_len:
        logits = model(src, ys, src_padding_mask)
        next_token = logits[:, -1, :].argmax(-1, keepdim=True)
        ended = (ys == eos_id).any(dim=1, keepdim=True)
        ys = torch.cat([ys, torch.where(ended, torch.full_like(next_token, eos_id), next_token)], dim=1)
        if (ys == eos_id).any(dim=1).all():
            break
    return ys


@torch.no_grad()
def greedy_to_max_len(model, src, max_len, bos_id, eos_id, src_padding_mask=None):
    """Never stops early: every sequence is padded with eos_id up to max_len, which the contract allows."""
    memory = model.encode(src, src_padding_mask)
    out = [torch.full((src.size(0),), bos_id, dtype=torch.long, device=src.device)]
    finished = torch.zeros_like(out[0], dtype=torch.bool)
    for _ in range(max_len - 1):
        logits = model.decode(torch.stack(out, dim=1), memory, None, src_padding_mask)
        token = logits[:, -1].argmax(-1).masked_fill(finished, eos_id)
        finished |= token == eos_id
        out.append(token)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("greedy_decode", [R.greedy_decode, greedy_rerunning_the_model, greedy_to_max_len])
@pytest.mark.parametrize("hidden", [False, True])
def test_greedy_decode_check_passes_correct_variants(greedy_decode, hidden, capsys):
    check_greedy_decode(greedy_decode, hidden=hidden)
    assert "✔ greedy_decode" in capsys.readouterr().out


GreedyFromTheFirstPosition = variant(greedy_rerunning_the_model, ("logits[:, -1, :]", "logits[:, 0, :]"))


def greedy_hard_coded_ids(model, src, max_len, bos_id, eos_id, src_padding_mask=None):
    return R.greedy_decode(model, src, max_len, 1, 2, src_padding_mask)


@pytest.mark.parametrize(
    "greedy_decode, message, hidden",
    [
        (variant(greedy_rerunning_the_model,
                 ("torch.where(ended, torch.full_like(next_token, eos_id), next_token)", "next_token")),
         r"kept generating tokens", False),
        (variant(greedy_rerunning_the_model, ("(ys == eos_id).any(dim=1).all()", "(ys == eos_id).any()")),
         r"stopped as soon as one sequence ended", False),
        (GreedyFromTheFirstPosition, r"logits at the first position", False),
        (variant(greedy_rerunning_the_model, ("model(src, ys, src_padding_mask)", "model(src, ys)")),
         r"src_padding_mask is not used", False),
        (variant(greedy_rerunning_the_model, ("ys.size(1) < max_len", "ys.size(1) <= max_len")),
         r"max_len counts the bos_id too", False),
        (variant(greedy_rerunning_the_model, ("bos_id, device", "0, device")), r"does not start with bos_id", False),
        (variant(greedy_rerunning_the_model, ("return ys", "return ys.tolist()")),
         r"should return a torch.Tensor, got list", False),
        (greedy_hard_coded_ids, r"does not start with bos_id=4", True),
    ],
)
def test_greedy_decode_check_names_the_mistake(greedy_decode, message, hidden):
    with fails(message):
        check_greedy_decode(greedy_decode, hidden=hidden)


# ------------------------------------------------------------------------ no pass line for wrong code


def test_checks_never_print_a_pass_for_wrong_code(capsys):
    with fails():
        check_transformer(TransformerUnscaled)
    with fails():
        check_greedy_decode(GreedyFromTheFirstPosition)
    assert "✔" not in capsys.readouterr().out


# ------------------------------------------------------------------- deviations seen in real code


def positional_encoding_in_float32(max_len, d_model):
    """Computed in float32 whatever the default dtype, then returned in it."""
    return R.positional_encoding(max_len, d_model).float().to(torch.get_default_dtype())


def test_an_encoding_right_to_float32_only_is_named_as_a_precision_mistake():
    with fails(r"^float32 precision only in the encoding: it agrees with the reference only as far as float32's "
               r"rounding goes, not to float64's 1e-11 \(largest error .* got \d\.\d{9,}, expected \d\.\d{9,}\)",
               exercise="positional_encoding"):
        check_positional_encoding(positional_encoding_in_float32)


def loss_that_raises(model, src, tgt, pad_id):
    raise ValueError("something went wrong")


def test_a_message_names_a_module_argument_by_its_class_not_its_whole_repr():
    with fails(r"^raised ValueError: something went wrong\n  when called with \(StandInModel, tensor of "
               r"shape") as failure:
        check_teacher_forcing_loss(loss_that_raises)
    assert (failure.value.raised, failure.value.exception) == ("ValueError", "something went wrong")
    assert len(failure.value.render()) < 300, failure.value.render()  # the whole message a learner reads
