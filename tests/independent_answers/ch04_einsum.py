"""Style: einsum for every contraction and reduction, layers read through their weight tensors."""

import torch
import torch.nn.functional as F
from torch import nn


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.einsum("...i,oi->...o", x, self.linear1.weight) + self.linear1.bias
        h = self.dropout(torch.maximum(h, torch.zeros_like(h)))
        return torch.einsum("...i,oi->...o", h, self.linear2.weight) + self.linear2.bias


class Conv1dFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.conv1 = nn.Conv1d(d_model, d_ff, kernel_size=1)
        self.conv2 = nn.Conv1d(d_ff, d_model, kernel_size=1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(torch.einsum("btc->bct", x))
        y = self.conv2(self.dropout(F.relu(y)))
        return torch.einsum("bct->btc", y)


def ffn_as_conv1d(ffn: nn.Module) -> nn.Module:
    d_ff, d_model = ffn.linear1.weight.shape
    out = Conv1dFeedForward(d_model, d_ff, ffn.dropout.p)
    out.to(device=ffn.linear1.weight.device, dtype=ffn.linear1.weight.dtype)
    with torch.no_grad():
        for layer, linear in zip((out.conv1, out.conv2), (ffn.linear1, ffn.linear2)):
            layer.weight.copy_(linear.weight.reshape(layer.weight.shape))
            layer.bias.copy_(linear.bias)
    out.train(ffn.training)
    return out


class LayerNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        mean = torch.einsum("...d->...", x).unsqueeze(-1) / d
        c = x - mean
        var = torch.einsum("...d,...d->...", c, c).unsqueeze(-1) / d
        return torch.einsum("...d,d->...d", c / torch.sqrt(var + self.eps), self.weight) + self.bias


class SublayerConnection(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.norm = LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        identity = lambda t: t
        before = self.norm if self.norm_first else identity
        after = identity if self.norm_first else self.norm
        return after(x + self.dropout(sublayer(before(x))))
