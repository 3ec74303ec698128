"""Chapter 02_multi_head_attention: project, split into heads, attend per head, merge, project back.

MultiHead(X, Y) = Concat(head_1, ..., head_h) W_O,   head_i = Attention(X W_Q^i, Y W_K^i, Y W_V^i)
                                                                   (Vaswani et al., 2017, section 3.2.2)

X (B, m, d_model) goes into the Q port, Y (B, n, d_model) into the K and V ports; in self-attention
Y is X. Each of the h heads works in d_k = d_model / h dimensions, so all heads together cost what one
head of size d_model would. Mask convention: boolean, broadcastable to (B, h, m, n), ``True`` = may attend.
"""

import torch
from torch import nn

from .attention import scaled_dot_product_attention


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, d_model) -> (B, h, T, d_k): feature block i of every position becomes head i."""
    B, T, d_model = x.shape
    d_k = d_model // n_heads
    # The features split as (h, d_k); the transpose then groups each head's rows over all positions.
    return x.reshape(B, T, n_heads, d_k).transpose(1, 2)  # (B, h, T, d_k)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, T, h * d_k), the inverse of ``split_heads``: heads side by side again."""
    B, h, T, d_k = x.shape
    # Transpose back first, so that each position's heads are concatenated, not positions mixed.
    return x.transpose(1, 2).reshape(B, T, h * d_k)  # (B, T, d_model)


class MultiHeadAttention(nn.Module):
    """h scaled dot-product attentions in parallel, each over its own d_k-dimensional projection.

    Submodules ``w_q, w_k, w_v, w_o``: each ``nn.Linear(d_model, d_model, bias=bias)``. The Q/K/V
    projections of all heads are one matrix each: head i owns output rows i*d_k .. (i+1)*d_k - 1.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = False):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self, x: torch.Tensor, y: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``x`` to ``y`` (to ``x`` itself when ``y`` is None).

        Args:
            x: (B, m, d_model), the query side.
            y: (B, n, d_model), the key/value side; defaults to ``x`` (self-attention).
            mask: optional bool, broadcastable to (B, h, m, n); ``True`` = may attend. A causal mask is
                (m, n); a key padding mask (B, n) must be given as (B, 1, 1, n).

        Returns:
            output: (B, m, d_model).
            weights: (B, h, m, n), one attention map per head.
        """
        y = x if y is None else y
        q = split_heads(self.w_q(x), self.n_heads)  # (B, h, m, d_k)
        k = split_heads(self.w_k(y), self.n_heads)  # (B, h, n, d_k)
        v = split_heads(self.w_v(y), self.n_heads)  # (B, h, n, d_k)
        heads, weights = scaled_dot_product_attention(q, k, v, mask)  # (B, h, m, d_k), (B, h, m, n)
        return self.w_o(merge_heads(heads)), weights  # (B, m, d_model)

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> "MultiHeadAttention":
        """The same function as ``mha`` (in eval mode), with its weights copied.

        ``nn.MultiheadAttention`` stacks W_Q, W_K, W_V into one (3 d_model, d_model) ``in_proj_weight``;
        its biases are all on or all off.
        """
        if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("only kdim = vdim = embed_dim, without add_bias_kv or add_zero_attn, is supported")
        bias = mha.in_proj_bias is not None
        module = cls(mha.embed_dim, mha.num_heads, bias=bias).to(
            dtype=mha.in_proj_weight.dtype, device=mha.in_proj_weight.device
        )
        with torch.no_grad():
            for linear, weight in zip((module.w_q, module.w_k, module.w_v), mha.in_proj_weight.chunk(3)):
                linear.weight.copy_(weight)
            module.w_o.weight.copy_(mha.out_proj.weight)
            if bias:
                for linear, b in zip((module.w_q, module.w_k, module.w_v), mha.in_proj_bias.chunk(3)):
                    linear.bias.copy_(b)
                module.w_o.bias.copy_(mha.out_proj.bias)
        return module
