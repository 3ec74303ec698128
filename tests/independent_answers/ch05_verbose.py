"""Verbose style: every step named and commented, the residual connections written out by hand."""

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
    # Positions 0 .. max_len - 1 as a column; float by arithmetic, so the default dtype decides.
    positions = torch.arange(max_len).unsqueeze(1) * 1.0
    # The even feature indices 2i, one per (sin, cos) pair.
    even_feature_indices = torch.arange(0, d_model, 2) * 1.0
    # 1 / 10000^(2i / d_model), written as exp(-ln(10000) * 2i / d_model).
    inverse_wavelengths = torch.exp(even_feature_indices * (-math.log(10000.0) / d_model))
    # One angle per position and pair: (max_len, d_model / 2).
    angles = positions * inverse_wavelengths.unsqueeze(0)
    encoding = torch.zeros(max_len, d_model)
    encoding[:, 0::2] = torch.sin(angles)  # even features: sines
    encoding[:, 1::2] = torch.cos(angles)  # odd features: cosines of the same frequency
    return encoding


class EncoderLayer(nn.Module):
    """Self-attention, then the FFN, each inside a residual connection with a LayerNorm."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        # Sublayer 1: multi-head self-attention, with biases as in torch's encoder layer.
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=True)
        # Sublayer 2: the position-wise feed-forward network.
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        # One residual connection (and its LayerNorm) per sublayer.
        attention_connection = SublayerConnection(d_model, dropout, norm_first)
        feed_forward_connection = SublayerConnection(d_model, dropout, norm_first)
        self.sublayers = nn.ModuleList([attention_connection, feed_forward_connection])
        # Remember where the LayerNorm goes, and the dropout applied to each sublayer's output.
        self.norm_first = norm_first
        self.residual_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, S, d_model); padding_mask: (B, S), True = real token. Returns (B, S, d_model)."""
        # The padding mask hides padded keys from every head and every query: (B, S) -> (B, 1, 1, S).
        if padding_mask is None:
            attention_mask = None
        else:
            batch_size, source_length = padding_mask.shape
            attention_mask = padding_mask.view(batch_size, 1, 1, source_length)

        def self_attention(hidden):
            attended, _attention_weights = self.self_attn(hidden, hidden, attention_mask)
            return attended

        def residual(index, hidden, sublayer):
            norm = self.sublayers[index].norm
            if self.norm_first:
                # Pre-LN: normalise, apply the sublayer, add the untouched input.
                return hidden + self.residual_dropout(sublayer(norm(hidden)))
            # Post-LN: apply the sublayer, add the input, then normalise the sum.
            return norm(hidden + self.residual_dropout(sublayer(hidden)))

        after_attention = residual(0, x, self_attention)
        after_feed_forward = residual(1, after_attention, self.ffn)
        return after_feed_forward


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the memory, then the FFN, each in a residual connection."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        # Sublayer 1: masked self-attention over the target written so far.
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=True)
        # Sublayer 2: cross-attention, decoder queries against the encoder's memory.
        self.cross_attn = MultiHeadAttention(d_model, n_heads, bias=True)
        # Sublayer 3: the position-wise feed-forward network.
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        connections = [SublayerConnection(d_model, dropout, norm_first) for _sublayer in range(3)]
        self.sublayers = nn.ModuleList(connections)
        self.norm_first = norm_first
        self.residual_dropout = nn.Dropout(dropout)

    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        """x: (B, T, d_model); memory: (B, S, d_model); masks (B, T) and (B, S), True = real token."""
        batch_size, target_length = x.shape[0], x.shape[1]

        # Self-attention mask: the causal triangle (T, T), and, if given, the target's real tokens (B, 1, 1, T).
        lower_triangle = causal_mask(target_length, device=x.device)
        if tgt_padding_mask is None:
            self_attention_mask = lower_triangle
        else:
            target_keys = tgt_padding_mask.view(batch_size, 1, 1, target_length)
            self_attention_mask = torch.logical_and(lower_triangle, target_keys)  # (B, 1, T, T)

        # Cross-attention mask: the source's real tokens, as keys, (B, 1, 1, S).
        if memory_padding_mask is None:
            cross_attention_mask = None
        else:
            source_length = memory_padding_mask.shape[1]
            cross_attention_mask = memory_padding_mask.view(batch_size, 1, 1, source_length)

        def masked_self_attention(hidden):
            # Each target position attends to the real target positions up to itself.
            attended, _attention_weights = self.self_attn(hidden, hidden, self_attention_mask)
            return attended

        def cross_attention(hidden):
            # Queries come from the decoder (hidden); keys and values from the encoder (memory).
            attended, _attention_weights = self.cross_attn(hidden, memory, cross_attention_mask)
            return attended

        def residual(index, hidden, sublayer):
            norm = self.sublayers[index].norm
            if self.norm_first:
                return hidden + self.residual_dropout(sublayer(norm(hidden)))
            return norm(hidden + self.residual_dropout(sublayer(hidden)))

        after_self_attention = residual(0, x, masked_self_attention)
        after_cross_attention = residual(1, after_self_attention, cross_attention)
        after_feed_forward = residual(2, after_cross_attention, self.ffn)
        return after_feed_forward


class Transformer(nn.Module):
    """The encoder-decoder: encode the source once, decode the target against that memory."""

    def __init__(self, src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0, norm_first=False,
                 max_len=512):
        super().__init__()
        self.d_model = d_model
        self.embedding_scale = math.sqrt(d_model)

        # Token embeddings, started at N(0, 1/d_model) so that after the sqrt(d_model) scale they have
        # about the size of the positional encoding.
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        embedding_std = 1.0 / math.sqrt(d_model)
        nn.init.normal_(self.src_embed.weight, mean=0.0, std=embedding_std)
        nn.init.normal_(self.tgt_embed.weight, mean=0.0, std=embedding_std)

        # The sinusoids, a buffer that follows the module's device and dtype but is not saved.
        sinusoids = positional_encoding(max_len, d_model)
        self.register_buffer("pe", sinusoids, persistent=False)
        self.embedding_dropout = nn.Dropout(dropout)

        # The two stacks.
        encoder_layer_list = []
        decoder_layer_list = []
        for _layer_index in range(n_layers):
            encoder_layer_list.append(EncoderLayer(d_model, n_heads, d_ff, dropout=dropout, norm_first=norm_first))
            decoder_layer_list.append(DecoderLayer(d_model, n_heads, d_ff, dropout=dropout, norm_first=norm_first))
        self.encoder_layers = nn.ModuleList(encoder_layer_list)
        self.decoder_layers = nn.ModuleList(decoder_layer_list)

        # Only a Pre-LN stack needs a last LayerNorm: its final residual sum was never normalised.
        if norm_first:
            self.encoder_norm = LayerNorm(d_model)
            self.decoder_norm = LayerNorm(d_model)
        else:
            self.encoder_norm = None
            self.decoder_norm = None

        # From d_model features to one score per target word.
        self.head = nn.Linear(d_model, tgt_vocab)

    def embed(self, tokens, embedding):
        """(B, T) token ids -> (B, T, d_model): embedding * sqrt(d_model) + PE, then dropout."""
        sequence_length = tokens.shape[1]
        token_vectors = embedding(tokens)  # (B, T, d_model)
        scaled_token_vectors = token_vectors * self.embedding_scale
        position_vectors = self.pe[:sequence_length, :]  # (T, d_model), the same for each sequence
        combined = scaled_token_vectors + position_vectors  # broadcast over the batch
        return self.embedding_dropout(combined)

    def encode(self, src, src_padding_mask=None):
        """src: (B, S) token ids -> memory (B, S, d_model)."""
        hidden_states = self.embed(src, self.src_embed)
        for encoder_layer in self.encoder_layers:
            hidden_states = encoder_layer(hidden_states, src_padding_mask)
        if self.encoder_norm is not None:
            hidden_states = self.encoder_norm(hidden_states)
        memory = hidden_states
        return memory

    def decode(self, tgt, memory, tgt_padding_mask=None, src_padding_mask=None):
        """tgt: (B, T) token ids, memory: (B, S, d_model) -> logits (B, T, tgt_vocab)."""
        hidden_states = self.embed(tgt, self.tgt_embed)
        for decoder_layer in self.decoder_layers:
            hidden_states = decoder_layer(hidden_states, memory, tgt_padding_mask, src_padding_mask)
        if self.decoder_norm is not None:
            hidden_states = self.decoder_norm(hidden_states)
        logits = self.head(hidden_states)  # (B, T, tgt_vocab)
        return logits

    def forward(self, src, tgt, src_padding_mask=None, tgt_padding_mask=None):
        """src: (B, S), tgt: (B, T) token ids -> logits (B, T, tgt_vocab)."""
        encoder_output = self.encode(src, src_padding_mask)
        decoder_logits = self.decode(tgt, encoder_output, tgt_padding_mask, src_padding_mask)
        return decoder_logits


def teacher_forcing_loss(model, src, tgt, pad_id):
    """Mean cross-entropy of predicting tgt[:, 1:] from tgt[:, :-1] (and the source), pads ignored."""
    # The decoder reads BOS y_1 ... y_k and is scored on y_1 ... y_k EOS.
    decoder_input = tgt[:, :-1]
    next_tokens = tgt[:, 1:]
    source_is_real = src != pad_id
    decoder_input_is_real = decoder_input != pad_id
    logits = model(src, decoder_input, source_is_real, decoder_input_is_real)  # (B, T - 1, V)
    batch_size, steps, vocabulary_size = logits.shape
    flat_logits = logits.reshape(batch_size * steps, vocabulary_size)
    flat_labels = next_tokens.reshape(batch_size * steps)
    # ignore_index drops padded labels from both the sum and the count of the mean.
    loss = F.cross_entropy(flat_logits, flat_labels, ignore_index=pad_id, reduction="mean")
    return loss


@torch.no_grad()
def greedy_decode(model, src, max_len, bos_id, eos_id, src_padding_mask=None):
    """(B, S) source -> (B, L <= max_len) LongTensor starting with bos_id; after eos_id, padded with eos_id."""
    batch_size = src.shape[0]
    device = src.device

    # 1. Encode the source once.
    memory = model.encode(src, src_padding_mask)

    # 2. A buffer for the whole output, pre-filled with eos_id (the padding after an end), BOS first.
    output = torch.full((batch_size, max_len), eos_id, dtype=torch.long, device=device)
    output[:, 0] = bos_id
    has_finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
    length_written = 1

    # 3. One token per step, until every sequence has ended or the buffer is full.
    while length_written < max_len and not bool(has_finished.all()):
        prefix = output[:, :length_written]
        logits = model.decode(prefix, memory, None, src_padding_mask)  # (B, length_written, V)
        last_position_logits = logits[:, -1, :]
        most_likely_token = last_position_logits.argmax(dim=-1)  # (B,)
        # A sequence that has already ended gets eos_id again.
        next_token = most_likely_token.masked_fill(has_finished, eos_id)
        output[:, length_written] = next_token
        has_finished = has_finished | next_token.eq(eos_id)
        length_written += 1

    # 4. Keep only the columns that were written.
    return output[:, :length_written]
