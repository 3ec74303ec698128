"""Graded checks: plain functions a notebook's test cell calls with the learner's object.

Each raises AssertionError with a message a learner can act on, and prints a pass line only when
every case passed. ``hidden=True`` is what nbgrader runs at grading time: other seeds, other shapes.
"""

from .attention import check_scaled_dot_product_attention, check_softmax
from .attention_variants import (
    check_causal_mask,
    check_causal_self_attention,
    check_cross_attention,
    check_padding_mask,
    check_self_attention,
)
from .multi_head_attention import check_merge_heads, check_multi_head_attention, check_split_heads
from .ffn_layernorm_residual import (
    check_ffn_as_conv1d,
    check_layer_norm,
    check_positionwise_feed_forward,
    check_sublayer_connection,
)
from .transformer import (
    check_decoder_layer,
    check_encoder_layer,
    check_greedy_decode,
    check_positional_encoding,
    check_teacher_forcing_loss,
    check_transformer,
)

__all__ = ["check_softmax", "check_scaled_dot_product_attention"]
__all__ += ["check_split_heads", "check_merge_heads", "check_multi_head_attention"]
__all__ += ["check_causal_mask", "check_padding_mask", "check_self_attention", "check_causal_self_attention"]
__all__ += ["check_cross_attention"]
__all__ += ["check_positionwise_feed_forward", "check_ffn_as_conv1d", "check_layer_norm", "check_sublayer_connection"]
__all__ += ["check_positional_encoding", "check_encoder_layer", "check_decoder_layer", "check_transformer"]
__all__ += ["check_teacher_forcing_loss", "check_greedy_decode"]
