"""Style: verbose, one named intermediate per step with comments, activation kept as a module."""

import torch
import torch.nn.functional as F
from torch import nn


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        # The expansion layer: every token goes from d_model features up to d_ff features.
        self.linear1 = nn.Linear(in_features=d_model, out_features=d_ff, bias=True)
        # The non-linearity between the two layers.
        self.activation = nn.ReLU()
        # Dropout on the hidden features (active only in training mode).
        self.dropout = nn.Dropout(p=dropout)
        # The projection back down from d_ff to d_model features.
        self.linear2 = nn.Linear(in_features=d_ff, out_features=d_model, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (batch, positions, d_model); nn.Linear works on the last axis only.
        expanded = self.linear1(x)                    # (batch, positions, d_ff)
        activated = self.activation(expanded)         # negative values clipped to zero
        regularised = self.dropout(activated)         # identity in eval mode
        projected = self.linear2(regularised)         # (batch, positions, d_model)
        return projected


class Conv1dFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        # A kernel of width one sees a single position: the same map as nn.Linear on the features.
        self.conv1 = nn.Conv1d(in_channels=d_model, out_channels=d_ff, kernel_size=1)
        self.activation = nn.ReLU()
        self.dropout = nn.Dropout(p=dropout)
        self.conv2 = nn.Conv1d(in_channels=d_ff, out_channels=d_model, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Conv1d expects (batch, channels, length), so the features must become the channel axis.
        channels_first = x.transpose(1, 2)                    # (batch, d_model, positions)
        expanded = self.conv1(channels_first)                 # (batch, d_ff, positions)
        activated = self.activation(expanded)
        regularised = self.dropout(activated)
        projected = self.conv2(regularised)                   # (batch, d_model, positions)
        positions_first = projected.transpose(1, 2)           # back to (batch, positions, d_model)
        return positions_first


def ffn_as_conv1d(ffn: nn.Module) -> nn.Module:
    # Read the sizes from the first linear layer: its weight is (d_ff, d_model).
    hidden_size = ffn.linear1.weight.shape[0]
    model_size = ffn.linear1.weight.shape[1]
    dropout_probability = ffn.dropout.p
    convolutional = Conv1dFeedForward(model_size, hidden_size, dropout_probability)

    # A Linear weight (out, in) becomes a Conv1d kernel (out, in, 1) by adding the width axis.
    first_kernel = ffn.linear1.weight.detach().clone().unsqueeze(2)
    first_bias = ffn.linear1.bias.detach().clone()
    second_kernel = ffn.linear2.weight.detach().clone().unsqueeze(2)
    second_bias = ffn.linear2.bias.detach().clone()

    # Fresh parameters holding copies, so the original FFN is never touched.
    convolutional.conv1.weight = nn.Parameter(first_kernel)
    convolutional.conv1.bias = nn.Parameter(first_bias)
    convolutional.conv2.weight = nn.Parameter(second_kernel)
    convolutional.conv2.bias = nn.Parameter(second_bias)

    # Match the training/eval mode of the network we copied.
    convolutional.train(mode=ffn.training)
    return convolutional


class LayerNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        # gamma, the per-feature scale, starts at one so the initial map is a pure standardisation.
        self.weight = nn.Parameter(torch.ones(d_model))
        # beta, the per-feature shift, starts at zero.
        self.bias = nn.Parameter(torch.zeros(d_model))
        # The small constant that keeps the division finite for a constant feature vector.
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feature_count = x.size(-1)
        # The mean of each position's features.
        feature_sum = x.sum(dim=-1, keepdim=True)
        mean = feature_sum / feature_count
        # Deviation from that mean, and the biased variance (divide by d, not d - 1).
        deviation = x - mean
        squared_deviation = deviation.pow(2)
        variance = squared_deviation.sum(dim=-1, keepdim=True) / feature_count
        # eps belongs inside the square root.
        standard_deviation = (variance + self.eps).sqrt()
        normalised = deviation / standard_deviation
        # The learnable affine map, broadcast over every leading axis.
        scaled = normalised * self.weight
        shifted = scaled + self.bias
        return shifted


class SublayerConnection(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        # The LayerNorm of this residual block (the checks may swap in their own).
        self.norm = LayerNorm(d_model)
        # Dropout that will act only on what the sublayer produces.
        self.dropout = nn.Dropout(dropout)
        # False: Post-LN, as in the original paper. True: Pre-LN.
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        residual = x  # the identity path is never normalised nor dropped out
        if self.norm_first:
            # Pre-LN: normalise what goes into the sublayer, add the untouched residual afterwards.
            sublayer_input = self.norm(x)
            sublayer_output = sublayer(sublayer_input)
            dropped = self.dropout(sublayer_output)
            output = residual + dropped
        else:
            # Post-LN: add first, normalise the sum.
            sublayer_output = sublayer(x)
            dropped = self.dropout(sublayer_output)
            summed = residual + dropped
            output = self.norm(summed)
        return output
