"""Reference implementations of every name the learners implement (see the course contract).

The names and signatures here are the contract's; the tests prove each one against PyTorch's own.
"""

from .attention import scaled_dot_product_attention, softmax
from .attention_variants import CausalSelfAttention, CrossAttention, SelfAttention, causal_mask, padding_mask
from .ffn_layernorm_residual import LayerNorm, PositionwiseFeedForward, SublayerConnection, ffn_as_conv1d
from .multi_head_attention import MultiHeadAttention, merge_heads, split_heads
from .transformer import (
    DecoderLayer,
    EncoderLayer,
    Transformer,
    greedy_decode,
    positional_encoding,
    teacher_forcing_loss,
)

__all__ = ["softmax", "scaled_dot_product_attention"]
__all__ += ["split_heads", "merge_heads", "MultiHeadAttention"]
__all__ += ["causal_mask", "padding_mask", "SelfAttention", "CausalSelfAttention", "CrossAttention"]
__all__ += ["PositionwiseFeedForward", "ffn_as_conv1d", "LayerNorm", "SublayerConnection"]
__all__ += ["positional_encoding", "EncoderLayer", "DecoderLayer", "Transformer", "teacher_forcing_loss"]
__all__ += ["greedy_decode"]
