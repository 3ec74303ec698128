"""Functional style: torch.nn.functional calls on the modules' parameters, complex phasors, recursion."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from autograde_tests.reference import (
    LayerNorm,
    MultiHeadAttention,
    PositionwiseFeedForward,
    SublayerConnection,
    causal_mask,
    padding_mask,
)


def positional_encoding(max_len: int, d_model: int) -> torch.Tensor:
    """(max_len, d_model): sin on the even features, cos on the odd ones, one frequency per pair."""
    omega = torch.pow(10000.0, torch.linspace(0, d_model - 2, d_model // 2) / -d_model)
    theta = torch.arange(float(max_len))[:, None] * omega
    # e^{i theta} = cos + i sin; its real view is (..., 2) = (cos, sin), so flip to (sin, cos) and interleave.
    phasor = torch.polar(torch.ones_like(theta), theta)
    return torch.view_as_real(phasor).flip(-1).reshape(max_len, d_model)


class EncoderLayer(nn.Module):
    """Self-attention, then the FFN, each inside a residual connection with a LayerNorm."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.sublayers = nn.ModuleList(map(lambda _: SublayerConnection(d_model, dropout, norm_first), range(2)))
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
        self.self_attn = MultiHeadAttention(d_model=d_model, n_heads=n_heads, bias=True)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, S, d_model); padding_mask: (B, S), True = real token. Returns (B, S, d_model)."""
        keys = padding_mask.unflatten(-1, (1, 1, -1)) if padding_mask is not None else None

        def attention(h):
            return self.self_attn(h, mask=keys)[0]

        return self.sublayers[1](self.sublayers[0](x, attention), self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the memory, then the FFN, each in a residual connection."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.sublayers = nn.ModuleList(map(lambda _: SublayerConnection(d_model, dropout, norm_first), range(3)))
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model=d_model, n_heads=n_heads, bias=True)
        self.self_attn = MultiHeadAttention(d_model=d_model, n_heads=n_heads, bias=True)

    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        """x: (B, T, d_model); memory: (B, S, d_model); masks (B, T) and (B, S), True = real token."""
        T = x.size(-2)
        seen = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        if tgt_padding_mask is not None:
            seen = torch.logical_and(seen, tgt_padding_mask.unflatten(-1, (1, 1, -1)))
        source = memory_padding_mask.unflatten(-1, (1, 1, -1)) if memory_padding_mask is not None else None

        def masked(h):
            return self.self_attn(h, mask=seen)[0]

        def crossed(h):
            return self.cross_attn(h, y=memory, mask=source)[0]

        h = self.sublayers[0](x, masked)
        h = self.sublayers[1](h, crossed)
        return self.sublayers[2](h, self.ffn)


class Transformer(nn.Module):
    """The encoder-decoder: encode the source once, decode the target against that memory."""

    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0, norm_first=False,
                 max_len=512):
        super().__init__()
        self.d_model = d_model
        self.p_drop = dropout
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        list(map(lambda table: nn.init.normal_(table.weight, std=d_model ** -0.5), (self.src_embed, self.tgt_embed)))
        self.encoder_layers = nn.ModuleList(
            map(lambda _: EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first), range(n_layers)))
        self.decoder_layers = nn.ModuleList(
            map(lambda _: DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first), range(n_layers)))
        self.encoder_norm = LayerNorm(d_model) if norm_first else None
        self.decoder_norm = LayerNorm(d_model) if norm_first else None
        self.head = nn.Linear(d_model, tgt_vocab)
        self.register_buffer("pe", positional_encoding(max_len, d_model), persistent=False)

    def embed(self, tokens, embedding):
        """(B, T) token ids -> (B, T, d_model): embedding * sqrt(d_model) + PE, then dropout."""
        looked_up = F.embedding(tokens, embedding.weight)
        x = torch.add(looked_up.mul(math.sqrt(self.d_model)), self.pe.narrow(0, 0, tokens.size(-1)))
        return F.dropout(x, p=self.p_drop, training=self.training)

    def encode(self, src, src_padding_mask=None):
        """src: (B, S) token ids -> memory (B, S, d_model)."""
        def run(x, layers):
            return run(layers[0](x, src_padding_mask), layers[1:]) if len(layers) else x

        memory = run(self.embed(src, self.src_embed), list(self.encoder_layers))
        return memory if self.encoder_norm is None else self.encoder_norm(memory)

    def decode(self, tgt, memory, tgt_padding_mask=None, src_padding_mask=None):
        """tgt: (B, T) token ids, memory: (B, S, d_model) -> logits (B, T, tgt_vocab)."""
        def run(x, layers):
            return run(layers[0](x, memory, tgt_padding_mask, src_padding_mask), layers[1:]) if len(layers) else x

        states = run(self.embed(tgt, self.tgt_embed), list(self.decoder_layers))
        if self.decoder_norm is not None:
            states = self.decoder_norm(states)
        return F.linear(states, self.head.weight, self.head.bias)

    def forward(self, src, tgt, src_padding_mask=None, tgt_padding_mask=None):
        """src: (B, S), tgt: (B, T) token ids -> logits (B, T, tgt_vocab)."""
        return self.decode(tgt, memory=self.encode(src, src_padding_mask=src_padding_mask),
                           tgt_padding_mask=tgt_padding_mask, src_padding_mask=src_padding_mask)


def teacher_forcing_loss(model, src, tgt, pad_id):
    """Mean cross-entropy of predicting tgt[:, 1:] from tgt[:, :-1] (and the source), pads ignored."""
    given, target = tgt.narrow(1, 0, tgt.size(1) - 1), tgt.narrow(1, 1, tgt.size(1) - 1)
    scores = model(src, given, src.ne(pad_id), given.ne(pad_id))
    return F.nll_loss(F.log_softmax(scores, dim=-1).permute(0, 2, 1), target, ignore_index=pad_id)


@torch.no_grad()
def greedy_decode(model, src, max_len, bos_id, eos_id, src_padding_mask=None):
    """(B, S) source -> (B, L <= max_len) LongTensor starting with bos_id; after eos_id, padded with eos_id."""
    memory = model.encode(src, src_padding_mask)

    def extend(prefix, stopped):
        if prefix.size(1) >= max_len or bool(stopped.all()):
            return prefix
        choice = model.decode(prefix, memory, src_padding_mask=src_padding_mask).select(1, -1).argmax(-1)
        choice = torch.where(stopped, torch.full_like(choice, eos_id), choice)
        return extend(torch.cat([prefix, choice.unsqueeze(-1)], dim=-1), stopped.logical_or(choice == eos_id))

    start = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
    return extend(start, torch.zeros(src.size(0), dtype=torch.bool, device=src.device))
