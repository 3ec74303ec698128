"""Style: functional, torch.nn.functional calls on the modules' own weights, dropout as a stored rate."""

import torch
import torch.nn.functional as F
from torch import nn


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.p = dropout
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.relu(F.linear(x, self.linear1.weight, self.linear1.bias))
        hidden = F.dropout(hidden, p=self.p, training=self.training)
        return F.linear(hidden, self.linear2.weight, self.linear2.bias)


class Conv1dFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.p = dropout
        self.conv1 = nn.Conv1d(d_model, d_ff, 1)
        self.conv2 = nn.Conv1d(d_ff, d_model, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.relu(self.conv1(x.movedim(-1, 1)))
        hidden = F.dropout(hidden, p=self.p, training=self.training)
        return self.conv2(hidden).movedim(1, -1)


def ffn_as_conv1d(ffn: nn.Module) -> nn.Module:
    rate = getattr(ffn, "p", None)
    if rate is None:
        rate = getattr(getattr(ffn, "dropout", None), "p", 0.0)
    w1, b1 = ffn.linear1.weight.detach(), ffn.linear1.bias.detach()
    w2, b2 = ffn.linear2.weight.detach(), ffn.linear2.bias.detach()
    module = Conv1dFeedForward(w1.shape[1], w1.shape[0], rate).to(device=w1.device, dtype=w1.dtype)
    module.load_state_dict({
        "conv1.weight": w1[:, :, None], "conv1.bias": b1,
        "conv2.weight": w2[:, :, None], "conv2.bias": b2,
    })
    return module.train(ffn.training)


class LayerNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - torch.mean(x, dim=-1, keepdim=True)
        variance = torch.mean(centred * centred, dim=-1, keepdim=True)
        return torch.addcmul(self.bias, centred * torch.rsqrt(variance + self.eps), self.weight)


class SublayerConnection(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.p = dropout
        self.norm_first = norm_first
        self.norm = LayerNorm(d_model)

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        drop = lambda t: F.dropout(t, p=self.p, training=self.training)
        if not self.norm_first:
            return self.norm(torch.add(x, drop(sublayer(x))))
        return torch.add(x, drop(sublayer(self.norm(x))))
