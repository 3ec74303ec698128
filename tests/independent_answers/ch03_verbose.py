"""Verbose style: meshgrid index grids, explicit shapes and a comment for every step."""
import torch
from torch import nn

from autograde_tests.reference import MultiHeadAttention


def causal_mask(size: int, device=None) -> torch.Tensor:
    """(size, size) bool, True on and below the diagonal."""
    # Index of every position, on the requested device.
    position_indices = torch.arange(size, device=device)
    # Two (size, size) grids: the query index of each cell (its row) and the key index (its column).
    query_index_grid, key_index_grid = torch.meshgrid(position_indices, position_indices, indexing="ij")
    # A query may see a key that is not later than itself: key index <= query index.
    may_attend = torch.le(key_index_grid, query_index_grid)
    return may_attend


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """(B, max_len) bool, True for the first lengths[b] positions of sequence b."""
    number_of_sequences = lengths.shape[0]
    # Without an explicit width, the mask is as wide as the longest sequence.
    if max_len is None:
        longest_sequence = torch.max(lengths)
        mask_width = int(longest_sequence)
    else:
        mask_width = max_len
    # The positions 0 .. width-1, repeated for every sequence: (B, width).
    positions_per_row = torch.arange(mask_width, device=lengths.device).expand(number_of_sequences, mask_width)
    # Each sequence's length as a column: (B, 1).
    length_column = lengths.view(number_of_sequences, 1)
    # A position is a real token when it comes before the sequence's length.
    is_real_token = torch.lt(positions_per_row, length_column)
    return is_real_token


class SelfAttention(nn.Module):
    """Q, K and V all from x; padded keys hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        # The only parameters: one multi-head attention layer.
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, padding_mask=None):
        attention_mask = None
        if padding_mask is not None:
            batch_size, number_of_keys = padding_mask.shape
            # Padding hides keys (the last axis of the weights), for every head and every query:
            # (B, T) -> (B, 1, 1, T).
            attention_mask = padding_mask.view(batch_size, 1, 1, number_of_keys)
        # Queries, keys and values all come from x.
        attended_output, _unused_weights = self.attn(x, x, attention_mask)
        return attended_output


class CausalSelfAttention(nn.Module):
    """Q, K and V all from x; future and padded keys hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, padding_mask=None):
        sequence_length = x.size(1)
        # Future keys hidden: (T, T), made where x lives.
        no_peeking_mask = causal_mask(sequence_length, device=x.device)
        if padding_mask is None:
            attention_mask = no_peeking_mask
        else:
            batch_size = padding_mask.size(0)
            # Padded keys hidden: (B, 1, 1, T).
            real_keys_mask = padding_mask.view(batch_size, 1, 1, sequence_length)
            # A key is usable only if both masks allow it; broadcasting gives (B, 1, T, T).
            attention_mask = torch.bitwise_and(no_peeking_mask, real_keys_mask)
        attended_output, _unused_weights = self.attn(x, x, attention_mask)
        return attended_output


class CrossAttention(nn.Module):
    """Q from x, K and V from memory; padded memory positions hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, memory, memory_padding_mask=None):
        attention_mask = None
        if memory_padding_mask is not None:
            batch_size, memory_length = memory_padding_mask.shape
            # The memory supplies the keys, so its padding hides keys: (B, 1, 1, n).
            attention_mask = memory_padding_mask.view(batch_size, 1, 1, memory_length)
        # x asks the questions (Q port); the memory answers (K and V ports).
        attended_output, _unused_weights = self.attn(x, memory, attention_mask)
        return attended_output
