"""Chapter 04_ffn_layernorm_residual: the position-wise FFN, LayerNorm and the residual connection.

FFN(x) = max(0, x W₁ + b₁) W₂ + b₂                  (Vaswani et al., 2017, eq. 2)
LayerNorm(x) = γ ⊙ (x - μ) / √(σ² + ε) + β          (Ba et al., 2016), μ, σ² over the features
Post-LN: LayerNorm(x + Dropout(Sublayer(x)))        (the paper)
Pre-LN:  x + Dropout(Sublayer(LayerNorm(x)))        (Xiong et al., 2020; most modern models)

Shapes: ``x`` is (B, T, d_model), batch first; the FFN and LayerNorm also accept any leading
dimensions (..., d_model), because both act on each position's feature vector on its own.
"""

import torch
from torch import nn


class PositionwiseFeedForward(nn.Module):
    """The same two-layer network applied to every position: d_model -> d_ff -> d_model, ReLU between.

    The weights are shared by all positions and no position sees another: mixing along the sequence
    is attention's job, transforming each token's features is this module's.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_model) -> (..., d_model)."""
        hidden = torch.relu(self.linear1(x))  # (..., d_ff)
        return self.linear2(self.dropout(hidden))  # (..., d_model)


class Conv1dFeedForward(nn.Module):
    """A position-wise FFN written as two 1x1 convolutions over the sequence, for (B, T, d_model) input.

    A kernel of size 1 sees one position at a time and slides the same weights along the sequence:
    exactly what the FFN's Linear layers do to each row of x.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0):
        super().__init__()
        self.conv1 = nn.Conv1d(d_model, d_ff, kernel_size=1)
        self.conv2 = nn.Conv1d(d_ff, d_model, kernel_size=1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, T, d_model) -> (B, T, d_model)."""
        channels = x.transpose(1, 2)  # (B, d_model, T): Conv1d wants the features as channels
        hidden = torch.relu(self.conv1(channels))  # (B, d_ff, T)
        out = self.conv2(self.dropout(hidden))  # (B, d_model, T)
        return out.transpose(1, 2)  # (B, T, d_model)


def ffn_as_conv1d(ffn: PositionwiseFeedForward) -> Conv1dFeedForward:
    """The 1x1-convolution form of ``ffn``, with a copy of its weights: same numbers on (B, T, d_model).

    A Linear weight is (out, in); a Conv1d weight is (out, in, kernel_size), so a kernel of size 1 is
    the Linear weight with a trailing axis of length 1.
    """
    d_ff, d_model = ffn.linear1.weight.shape
    conv = Conv1dFeedForward(d_model, d_ff, ffn.dropout.p).to(ffn.linear1.weight)
    with torch.no_grad():
        conv.conv1.weight.copy_(ffn.linear1.weight.unsqueeze(-1))  # (d_ff, d_model, 1)
        conv.conv1.bias.copy_(ffn.linear1.bias)
        conv.conv2.weight.copy_(ffn.linear2.weight.unsqueeze(-1))  # (d_model, d_ff, 1)
        conv.conv2.bias.copy_(ffn.linear2.bias)
    return conv.train(ffn.training)


class LayerNorm(nn.Module):
    """Normalise each position's feature vector to mean 0 and variance 1, then scale and shift it.

    The statistics are taken over the last axis only (the d_model features of one token), so the
    result does not depend on the other tokens or on the batch: the same at training and inference,
    for any batch size. The variance is the biased one (divide by d_model), as in ``nn.LayerNorm``.
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # γ: starts as the identity scale
        self.bias = nn.Parameter(torch.zeros(d_model))  # β

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_model) -> (..., d_model)."""
        mean = x.mean(dim=-1, keepdim=True)  # (..., 1)
        var = x.var(dim=-1, keepdim=True, unbiased=False)  # (..., 1)
        # ε inside the square root keeps a constant feature vector (σ² = 0) finite.
        return self.weight * (x - mean) / torch.sqrt(var + self.eps) + self.bias


class SublayerConnection(nn.Module):
    """A residual connection around ``sublayer`` with a LayerNorm, in either placement.

    Post-LN (``norm_first=False``, the paper):  norm(x + dropout(sublayer(x)))
    Pre-LN  (``norm_first=True``):               x + dropout(sublayer(norm(x)))

    Dropout touches only the sublayer's output, never the identity path: the residual carries x
    unchanged, which is what keeps gradients flowing through deep stacks.
    """

    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.norm = LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        """x: (B, T, d_model); ``sublayer`` maps (B, T, d_model) -> (B, T, d_model). Returns (B, T, d_model)."""
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))
