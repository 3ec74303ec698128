"""The course's chapters, in order: the one table that the reference, the checks, the grader's sandbox and the
tests read.

A row holds a chapter's id (its book page, its two notebooks and its nbgrader assignment), the names a
learner writes in its notebook (the reference exports them from the chapter's module) and their checks, in
the notebook's order. A graded kernel imports this table (through the reference's package), so it holds names
only, never code.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Chapter:
    id: str
    graded: tuple[str, ...]
    checks: tuple[str, ...]

    @property
    def module(self) -> str:
        """The chapter's module in ``reference`` and in ``checks``: its id without the number."""
        return self.id.split("_", 1)[1]


CHAPTERS = (
    Chapter("01_attention", ("softmax", "scaled_dot_product_attention"),
            ("check_softmax", "check_scaled_dot_product_attention")),
    Chapter("02_multi_head_attention", ("split_heads", "merge_heads", "MultiHeadAttention"),
            ("check_split_heads", "check_merge_heads", "check_multi_head_attention")),
    Chapter("03_attention_variants",
            ("causal_mask", "padding_mask", "SelfAttention", "CausalSelfAttention", "CrossAttention"),
            ("check_causal_mask", "check_padding_mask", "check_self_attention", "check_causal_self_attention",
             "check_cross_attention")),
    Chapter("04_ffn_layernorm_residual", ("PositionwiseFeedForward", "ffn_as_conv1d", "LayerNorm", "SublayerConnection"),
            ("check_positionwise_feed_forward", "check_ffn_as_conv1d", "check_layer_norm", "check_sublayer_connection")),
    Chapter("05_transformer", ("positional_encoding", "EncoderLayer", "DecoderLayer", "Transformer",
                               "teacher_forcing_loss", "greedy_decode"),
            ("check_positional_encoding", "check_encoder_layer", "check_decoder_layer", "check_transformer",
             "check_teacher_forcing_loss", "check_greedy_decode")),
    Chapter("06_decoder_only", ("RMSNorm", "apply_rotary", "DecoderBlock", "GPT", "lm_loss", "generate",
                                "load_hf_llama", "load_meta_llama"),
            ("check_rms_norm", "check_apply_rotary", "check_decoder_block", "check_gpt", "check_lm_loss",
             "check_generate", "check_load_hf_llama", "check_load_meta_llama")),
    Chapter("07_attention_at_scale", ("online_softmax", "tiled_attention"),
            ("check_online_softmax", "check_tiled_attention")),
)


def hidden_in_grading(chapter: str) -> list[str]:
    """The chapters' modules a kernel graded on ``chapter`` (e.g. ``"03_attention_variants"``, or its module
    name ``"attention_variants"``) must not see: that chapter's and every later one's, each would hand over
    the answer. (Of the rest of the package, the kernel is given even less: ``grading.kernel_view``.)"""
    order = [c.module for c in CHAPTERS]
    module = chapter.split("_", 1)[1] if chapter[:1].isdigit() else chapter
    return order[order.index(module):]
