"""Loops style: explicit Python loops over positions, pairs, sublayers, layers and sequences."""

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
    table = torch.zeros(max_len, d_model)
    for pos in range(max_len):
        for k in range(0, d_model, 2):
            angle = pos / 10000 ** (k / d_model)
            table[pos, k] = math.sin(angle)
            if k + 1 < d_model:
                table[pos, k + 1] = math.cos(angle)
    return table


class EncoderLayer(nn.Module):
    """Self-attention, then the FFN, each inside a residual connection with a LayerNorm."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=True)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayers = nn.ModuleList()
        for _ in range(2):
            self.sublayers.append(SublayerConnection(d_model, dropout, norm_first))

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, S, d_model); padding_mask: (B, S), True = real token. Returns (B, S, d_model)."""
        keys = None
        if padding_mask is not None:
            keys = padding_mask.reshape(padding_mask.shape[0], 1, 1, padding_mask.shape[1])

        def attend(state):
            result, _ = self.self_attn(state, state, keys)
            return result

        steps = [attend, self.ffn]
        for connection, step in zip(self.sublayers, steps):
            x = connection(x, step)
        return x


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the memory, then the FFN, each in a residual connection."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=True)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, bias=True)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayers = nn.ModuleList()
        for _ in range(3):
            self.sublayers.append(SublayerConnection(d_model, dropout, norm_first))

    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        """x: (B, T, d_model); memory: (B, S, d_model); masks (B, T) and (B, S), True = real token."""
        B, T = x.shape[0], x.shape[1]
        # Row t may look at columns 0 .. t: fill the lower triangle one row at a time.
        future_hidden = torch.zeros(T, T, dtype=torch.bool, device=x.device)
        for t in range(T):
            future_hidden[t, : t + 1] = True
        self_keys = future_hidden
        if tgt_padding_mask is not None:
            self_keys = future_hidden & tgt_padding_mask.reshape(B, 1, 1, T)
        cross_keys = None
        if memory_padding_mask is not None:
            cross_keys = memory_padding_mask.reshape(B, 1, 1, memory_padding_mask.shape[1])

        def look_back(state):
            return self.self_attn(state, state, self_keys)[0]

        def read_source(state):
            return self.cross_attn(state, memory, cross_keys)[0]

        for connection, step in zip(self.sublayers, [look_back, read_source, self.ffn]):
            x = connection(x, step)
        return x


class Transformer(nn.Module):
    """The encoder-decoder: encode the source once, decode the target against that memory."""

    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0, norm_first=False,
                 max_len=512):
        super().__init__()
        self.d_model = d_model
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        with torch.no_grad():
            self.src_embed.weight.normal_(0.0, d_model ** -0.5)
            self.tgt_embed.weight.normal_(0.0, d_model ** -0.5)
        self.register_buffer("pe", positional_encoding(max_len, d_model), persistent=False)
        self.embed_dropout = nn.Dropout(dropout)
        self.encoder_layers = nn.ModuleList()
        self.decoder_layers = nn.ModuleList()
        for _ in range(n_layers):
            self.encoder_layers.append(EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first))
            self.decoder_layers.append(DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first))
        if norm_first:
            self.encoder_norm = LayerNorm(d_model)
            self.decoder_norm = LayerNorm(d_model)
        else:
            self.encoder_norm = None
            self.decoder_norm = None
        self.head = nn.Linear(d_model, tgt_vocab)

    def embed(self, tokens, embedding):
        """(B, T) token ids -> (B, T, d_model): embedding * sqrt(d_model) + PE, then dropout."""
        length = tokens.shape[1]
        vectors = embedding(tokens) * math.sqrt(self.d_model)
        vectors = vectors + self.pe[0:length].unsqueeze(0)
        return self.embed_dropout(vectors)

    def encode(self, src, src_padding_mask=None):
        """src: (B, S) token ids -> memory (B, S, d_model)."""
        state = self.embed(src, self.src_embed)
        for i in range(len(self.encoder_layers)):
            state = self.encoder_layers[i](state, padding_mask=src_padding_mask)
        if self.encoder_norm is not None:
            state = self.encoder_norm(state)
        return state

    def decode(self, tgt, memory, tgt_padding_mask=None, src_padding_mask=None):
        """tgt: (B, T) token ids, memory: (B, S, d_model) -> logits (B, T, tgt_vocab)."""
        state = self.embed(tgt, self.tgt_embed)
        for i in range(len(self.decoder_layers)):
            state = self.decoder_layers[i](state, memory, tgt_padding_mask=tgt_padding_mask,
                                           memory_padding_mask=src_padding_mask)
        if self.decoder_norm is not None:
            state = self.decoder_norm(state)
        return self.head(state)

    def forward(self, src, tgt, src_padding_mask=None, tgt_padding_mask=None):
        """src: (B, S), tgt: (B, T) token ids -> logits (B, T, tgt_vocab)."""
        memory = self.encode(src, src_padding_mask=src_padding_mask)
        logits = self.decode(tgt, memory, tgt_padding_mask=tgt_padding_mask, src_padding_mask=src_padding_mask)
        return logits


def teacher_forcing_loss(model, src, tgt, pad_id):
    """Mean cross-entropy of predicting tgt[:, 1:] from tgt[:, :-1] (and the source), pads ignored."""
    reads = tgt[:, :-1]
    wants = tgt[:, 1:]
    logits = model(src, reads, src != pad_id, reads != pad_id)
    total, count = 0, 0
    for b in range(tgt.shape[0]):
        real = wants[b] != pad_id
        total = total + F.cross_entropy(logits[b][real], wants[b][real], reduction="sum")
        count += int(real.sum())
    return total / count


@torch.no_grad()
def greedy_decode(model, src, max_len, bos_id, eos_id, src_padding_mask=None):
    """(B, S) source -> (B, L <= max_len) LongTensor starting with bos_id; after eos_id, padded with eos_id."""
    memory = model.encode(src, src_padding_mask)
    batch = src.shape[0]
    written = [[bos_id] for _ in range(batch)]
    finished = [False] * batch
    while len(written[0]) < max_len:
        if all(finished):
            break
        so_far = torch.tensor(written, dtype=torch.long, device=src.device)
        logits = model.decode(so_far, memory, src_padding_mask=src_padding_mask)
        best = logits[:, -1, :].argmax(dim=-1).tolist()
        for b in range(batch):
            if finished[b]:
                written[b].append(eos_id)
            else:
                written[b].append(best[b])
                if best[b] == eos_id:
                    finished[b] = True
    return torch.tensor(written, dtype=torch.long, device=src.device)
