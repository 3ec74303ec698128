"""Compact style: short expressions, comprehensions, stacking instead of slice assignment."""

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
    a = torch.arange(0.0, max_len).outer(10000.0 ** (-torch.arange(0.0, d_model, 2) / d_model))
    return torch.stack((a.sin(), a.cos()), dim=-1).flatten(1)


class EncoderLayer(nn.Module):
    """Self-attention, then the FFN, each inside a residual connection with a LayerNorm."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=True)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayers = nn.ModuleList([SublayerConnection(d_model, dropout, norm_first),
                                        SublayerConnection(d_model, dropout, norm_first)])

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, S, d_model); padding_mask: (B, S), True = real token. Returns (B, S, d_model)."""
        m = padding_mask if padding_mask is None else padding_mask.unsqueeze(1).unsqueeze(1)
        return self.sublayers[1](self.sublayers[0](x, lambda z: self.self_attn(z, mask=m)[0]), self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the memory, then the FFN, each in a residual connection."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.self_attn, self.cross_attn = (MultiHeadAttention(d_model, n_heads, bias=True) for _ in "sc")
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayers = nn.ModuleList([SublayerConnection(d_model, dropout, norm_first) for _ in "abc"])

    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        """x: (B, T, d_model); memory: (B, S, d_model); masks (B, T) and (B, S), True = real token."""
        sm = causal_mask(x.shape[1], device=x.device)
        sm = sm if tgt_padding_mask is None else sm & tgt_padding_mask.unsqueeze(1).unsqueeze(1)
        cm = None if memory_padding_mask is None else memory_padding_mask.unsqueeze(1).unsqueeze(1)
        first, second, third = self.sublayers
        x = first(x, lambda z: self.self_attn(z, mask=sm)[0])
        return third(second(x, lambda z: self.cross_attn(z, memory, cm)[0]), self.ffn)


class Transformer(nn.Module):
    """The encoder-decoder: encode the source once, decode the target against that memory."""

    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0, norm_first=False,
                 max_len=512):
        super().__init__()
        self.d_model = d_model
        self.src_embed, self.tgt_embed = nn.Embedding(src_vocab, d_model), nn.Embedding(tgt_vocab, d_model)
        for e in (self.src_embed, self.tgt_embed):
            nn.init.normal_(e.weight, 0.0, 1 / math.sqrt(d_model))
        self.register_buffer("pe", positional_encoding(max_len, d_model), persistent=False)
        self.drop = nn.Dropout(dropout)
        args = (d_model, n_heads, d_ff, dropout, norm_first)
        self.encoder_layers = nn.ModuleList([EncoderLayer(*args) for _ in range(n_layers)])
        self.decoder_layers = nn.ModuleList([DecoderLayer(*args) for _ in range(n_layers)])
        self.encoder_norm, self.decoder_norm = (LayerNorm(d_model), LayerNorm(d_model)) if norm_first else (None, None)
        self.head = nn.Linear(d_model, tgt_vocab)

    def embed(self, tokens, embedding):
        """(B, T) token ids -> (B, T, d_model): embedding * sqrt(d_model) + PE, then dropout."""
        return self.drop(embedding(tokens) * self.d_model ** 0.5 + self.pe[: tokens.shape[-1]])

    def encode(self, src, src_padding_mask=None):
        """src: (B, S) token ids -> memory (B, S, d_model)."""
        h = self.embed(src, self.src_embed)
        for layer in self.encoder_layers:
            h = layer(h, src_padding_mask)
        return h if self.encoder_norm is None else self.encoder_norm(h)

    def decode(self, tgt, memory, tgt_padding_mask=None, src_padding_mask=None):
        """tgt: (B, T) token ids, memory: (B, S, d_model) -> logits (B, T, tgt_vocab)."""
        h = self.embed(tgt, self.tgt_embed)
        for layer in self.decoder_layers:
            h = layer(h, memory, tgt_padding_mask, src_padding_mask)
        return self.head(h if self.decoder_norm is None else self.decoder_norm(h))

    def forward(self, src, tgt, src_padding_mask=None, tgt_padding_mask=None):
        """src: (B, S), tgt: (B, T) token ids -> logits (B, T, tgt_vocab)."""
        return self.decode(tgt, self.encode(src, src_padding_mask), tgt_padding_mask, src_padding_mask)


def teacher_forcing_loss(model, src, tgt, pad_id):
    """Mean cross-entropy of predicting tgt[:, 1:] from tgt[:, :-1] (and the source), pads ignored."""
    inp = tgt[:, :-1]
    logits = model(src, inp, src != pad_id, inp != pad_id)
    return F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=pad_id)


@torch.no_grad()
def greedy_decode(model, src, max_len, bos_id, eos_id, src_padding_mask=None):
    """(B, S) source -> (B, L <= max_len) LongTensor starting with bos_id; after eos_id, padded with eos_id."""
    mem = model.encode(src, src_padding_mask)
    out = src.new_full((src.shape[0], 1), bos_id, dtype=torch.long)
    for _ in range(max_len - 1):
        ended = (out[:, 1:] == eos_id).any(1)
        if ended.all():
            break
        nxt = model.decode(out, mem, None, src_padding_mask)[:, -1].argmax(-1).masked_fill(ended, eos_id)
        out = torch.cat((out, nxt[:, None]), 1)
    return out
