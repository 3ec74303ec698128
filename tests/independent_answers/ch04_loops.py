"""Style: explicit Python loops over positions, features and layers, one small step at a time."""

import torch
import torch.nn.functional as F
from torch import nn


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Walk along the sequence and push every token through the same two layers on its own.
        per_position = []
        for t in range(x.shape[1]):
            token = x[:, t, :]
            widened = self.linear1(token).clamp(min=0)
            per_position.append(self.linear2(self.dropout(widened)))
        return torch.stack(per_position, dim=1)


class Conv1dFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.conv1 = nn.Conv1d(d_model, d_ff, kernel_size=1)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv1d(d_ff, d_model, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.permute(0, 2, 1)
        for step, conv in enumerate((self.conv1, self.conv2)):
            if step == 1:
                h = self.dropout(h)
            h = conv(h)
            if step == 0:
                h = h.clamp(min=0)
        return h.permute(0, 2, 1)


def ffn_as_conv1d(ffn: nn.Module) -> nn.Module:
    first, second = ffn.linear1, ffn.linear2
    result = Conv1dFeedForward(first.in_features, first.out_features, ffn.dropout.p)
    result = result.to(first.weight)
    with torch.no_grad():
        for conv, linear in ((result.conv1, first), (result.conv2, second)):
            for channel in range(linear.out_features):
                conv.weight[channel, :, 0] = linear.weight[channel]
                conv.bias[channel] = linear.bias[channel]
    result.train(ffn.training)
    return result


class LayerNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        total = torch.zeros_like(x[..., 0])
        for i in range(d):
            total = total + x[..., i]
        mean = total / d
        squares = torch.zeros_like(mean)
        for i in range(d):
            squares = squares + (x[..., i] - mean) ** 2
        inverse_std = 1.0 / torch.sqrt(squares / d + self.eps)
        features = []
        for i in range(d):
            features.append((x[..., i] - mean) * inverse_std * self.weight[i] + self.bias[i])
        return torch.stack(features, dim=-1)


class SublayerConnection(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.norm_first = norm_first
        self.norm = LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        if self.norm_first:
            inner = self.norm(x)
        else:
            inner = x
        total = x + self.dropout(sublayer(inner))
        if not self.norm_first:
            total = self.norm(total)
        return total
