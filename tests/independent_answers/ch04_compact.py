"""Style: compact, short expressions and tensor methods (relu(), mT, var_mean, rsqrt)."""

import torch
import torch.nn.functional as F
from torch import nn


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.linear1, self.linear2, self.drop = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.drop(self.linear1(x).relu()))


class Conv1dFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.conv1, self.conv2, self.drop = nn.Conv1d(d_model, d_ff, 1), nn.Conv1d(d_ff, d_model, 1), nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.drop(self.conv1(x.mT).relu())).mT


def ffn_as_conv1d(ffn: nn.Module) -> nn.Module:
    a, b = ffn.linear1, ffn.linear2
    c = Conv1dFeedForward(a.in_features, a.out_features, ffn.dropout.p).to(a.weight)
    with torch.no_grad():
        for conv, lin in ((c.conv1, a), (c.conv2, b)):
            conv.weight.copy_(lin.weight[..., None])
            conv.bias.copy_(lin.bias)
    return c.train(ffn.training)


class LayerNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.zeros(d_model)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var, mu = torch.var_mean(x, dim=-1, correction=0, keepdim=True)
        return (x - mu) * (var + self.eps).rsqrt() * self.weight + self.bias


class SublayerConnection(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.norm, self.drop, self.norm_first = LayerNorm(d_model), nn.Dropout(dropout), norm_first

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        return x + self.drop(sublayer(self.norm(x))) if self.norm_first else self.norm(x + self.drop(sublayer(x)))
