"""Graded checks: plain functions a notebook's test cell calls with the learner's object.

Each raises AssertionError with a message a learner can act on, and prints a pass line only when
every case passed. ``hidden=True`` is what nbgrader runs at grading time: other seeds, other shapes.
Each check is imported from its chapter's module when first used (as in ``autograde_tests.reference``):
a graded kernel, which is given no check (they run in the grader; ``grading.kernel_view``), can still
import this package, and ``beside`` and ``stand_ins`` from it.
"""

from ..lazy import exports

CHAPTER_CHECKS = {
    "attention": ["check_softmax", "check_scaled_dot_product_attention"],
    "multi_head_attention": ["check_split_heads", "check_merge_heads", "check_multi_head_attention"],
    "attention_variants": ["check_causal_mask", "check_padding_mask", "check_self_attention",
                           "check_causal_self_attention", "check_cross_attention"],
    "ffn_layernorm_residual": ["check_positionwise_feed_forward", "check_ffn_as_conv1d", "check_layer_norm",
                               "check_sublayer_connection"],
    "transformer": ["check_positional_encoding", "check_encoder_layer", "check_decoder_layer", "check_transformer",
                    "check_teacher_forcing_loss", "check_greedy_decode"],
    "decoder_only": ["check_rms_norm", "check_apply_rotary", "check_decoder_block", "check_gpt", "check_lm_loss",
                     "check_generate", "check_load_hf_llama", "check_load_meta_llama"],
    "attention_at_scale": ["check_online_softmax", "check_tiled_attention"],
}
__all__, __getattr__ = exports(__name__, CHAPTER_CHECKS)
