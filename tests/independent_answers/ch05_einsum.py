"""Einsum style: outer products, full-size masks and the output head written as einsum contractions."""

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
    dtype = torch.get_default_dtype()
    feature = torch.arange(d_model)
    parity = feature % 2
    rate = torch.pow(10000.0, -(feature - parity).to(dtype) / d_model)  # both features of a pair share 2i
    angle = torch.einsum("p,f->pf", torch.arange(max_len).to(dtype), rate)
    return torch.where(parity.bool(), angle.cos(), angle.sin())


class EncoderLayer(nn.Module):
    """Self-attention, then the FFN, each inside a residual connection with a LayerNorm."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, True)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayers = nn.ModuleList([SublayerConnection(d_model, dropout, norm_first)])
        self.sublayers.extend([SublayerConnection(d_model, dropout, norm_first)])

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, S, d_model); padding_mask: (B, S), True = real token. Returns (B, S, d_model)."""
        grid = None
        if padding_mask is not None:
            every_query = torch.ones(x.shape[1], dtype=x.dtype, device=x.device)
            # (B, S, S): query i may see key j when key j is real; one head axis for broadcasting.
            grid = torch.einsum("q,bk->bqk", every_query, padding_mask.to(x.dtype)).gt(0.5)[:, None]
        attend, feed = self.sublayers
        y = attend(x, lambda s: self.self_attn(s, s, grid)[0])
        return feed(y, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the memory, then the FFN, each in a residual connection."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, True)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, True)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayers = nn.ModuleList()
        self.sublayers.extend(SublayerConnection(d_model, dropout, norm_first) for _ in range(3))

    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        """x: (B, T, d_model); memory: (B, S, d_model); masks (B, T) and (B, S), True = real token."""
        T, dt, dev = x.shape[1], x.dtype, x.device
        tri = causal_mask(T, device=dev).to(dt)  # (T, T), 1 on and below the diagonal
        if tgt_padding_mask is None:
            own = tri.gt(0.5)
        else:
            own = torch.einsum("qk,bk->bqk", tri, tgt_padding_mask.to(dt)).gt(0.5)[:, None]  # (B, 1, T, T)
        other = None
        if memory_padding_mask is not None:
            rows = torch.ones(T, dtype=dt, device=dev)
            other = torch.einsum("q,bk->bqk", rows, memory_padding_mask.to(dt)).gt(0.5)[:, None]  # (B, 1, T, S)
        y = self.sublayers[0](x, lambda s: self.self_attn(s, s, own)[0])
        y = self.sublayers[1](y, lambda s: self.cross_attn(s, memory, other)[0])
        y = self.sublayers[2](y, self.ffn)
        return y


class Transformer(nn.Module):
    """The encoder-decoder: encode the source once, decode the target against that memory."""

    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0, norm_first=False,
                 max_len=512):
        super().__init__()
        self.d_model = d_model
        self.head = nn.Linear(d_model, tgt_vocab)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.src_embed.weight.data.normal_(std=1 / d_model ** 0.5)
        self.tgt_embed.weight.data.normal_(std=1 / d_model ** 0.5)
        self.register_buffer("pe", positional_encoding(max_len, d_model), persistent=False)
        self.encoder_layers = nn.ModuleList(EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first)
                                            for _ in range(n_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first)
                                            for _ in range(n_layers))
        self.encoder_norm = LayerNorm(d_model) if norm_first else None
        self.decoder_norm = LayerNorm(d_model) if norm_first else None
        self.emb_drop = nn.Dropout(p=dropout)

    def embed(self, tokens, embedding):
        """(B, T) token ids -> (B, T, d_model): embedding * sqrt(d_model) + PE, then dropout."""
        B, T = tokens.shape
        rows = embedding.weight.index_select(0, tokens.reshape(-1)).reshape(B, T, self.d_model)
        return self.emb_drop(rows.mul(math.sqrt(self.d_model)).add(self.pe[:T].unsqueeze(0)))

    def encode(self, src, src_padding_mask=None):
        """src: (B, S) token ids -> memory (B, S, d_model)."""
        z = self.embed(src, self.src_embed)
        for block in self.encoder_layers:
            z = block(z, src_padding_mask)
        if self.encoder_norm is not None:
            z = self.encoder_norm(z)
        return z

    def decode(self, tgt, memory, tgt_padding_mask=None, src_padding_mask=None):
        """tgt: (B, T) token ids, memory: (B, S, d_model) -> logits (B, T, tgt_vocab)."""
        z = self.embed(tgt, self.tgt_embed)
        for block in self.decoder_layers:
            z = block(z, memory, tgt_padding_mask, src_padding_mask)
        if self.decoder_norm is not None:
            z = self.decoder_norm(z)
        return torch.einsum("btd,vd->btv", z, self.head.weight) + self.head.bias

    def forward(self, src, tgt, src_padding_mask=None, tgt_padding_mask=None):
        """src: (B, S), tgt: (B, T) token ids -> logits (B, T, tgt_vocab)."""
        enc = self.encode(src, src_padding_mask)
        return self.decode(tgt, enc, tgt_padding_mask, src_padding_mask)


def teacher_forcing_loss(model, src, tgt, pad_id):
    """Mean cross-entropy of predicting tgt[:, 1:] from tgt[:, :-1] (and the source), pads ignored."""
    prev, nxt = tgt[:, :-1], tgt[:, 1:]
    log_p = model(src, prev, src != pad_id, prev != pad_id).log_softmax(dim=-1)  # (B, T, V)
    picked = log_p.gather(-1, nxt.unsqueeze(-1)).squeeze(-1)  # (B, T): log-probability of the right token
    keep = (nxt != pad_id).to(log_p.dtype)
    return -torch.einsum("bt,bt->", picked, keep) / keep.sum()


@torch.no_grad()
def greedy_decode(model, src, max_len, bos_id, eos_id, src_padding_mask=None):
    """(B, S) source -> (B, L <= max_len) LongTensor starting with bos_id; after eos_id, padded with eos_id."""
    enc = model.encode(src, src_padding_mask)
    seq = torch.tensor([[bos_id]], dtype=torch.long, device=src.device).repeat(src.shape[0], 1)
    alive = torch.ones(src.shape[0], dtype=torch.long, device=src.device)  # 1 until eos_id is written
    while seq.shape[1] < max_len and alive.sum() > 0:
        best = model.decode(seq, enc, None, src_padding_mask)[:, -1].argmax(dim=-1)
        token = best * alive + eos_id * (1 - alive)
        seq = torch.cat((seq, token.unsqueeze(1)), dim=1)
        alive = alive * (token != eos_id).long()
    return seq
