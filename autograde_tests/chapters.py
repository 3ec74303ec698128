"""The course's chapters, in order: the one table that the reference, the checks, the grader's sandbox and the
tests read.

A row holds a chapter's id (its book page, its two notebooks and its nbgrader assignment), the names a
learner writes in its notebook (the reference exports them from the chapter's module) and their checks, in
the notebook's order, and one typical mistake, which ``make demo`` and the end-to-end tests hand in: a solution
cell's grade id, a fragment of its code, and what a learner wrote instead; and the installed libraries that
would compute the chapter's answers (a tokenizer library for chapter 8), which a kernel graded on it cannot
import (``grading.kernel_view``). A graded kernel imports this table
(through the reference's package), so it holds names and those fragments only, never code that computes an
answer.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Chapter:
    id: str
    graded: tuple[str, ...]
    checks: tuple[str, ...]
    typical_mistake: tuple[str, str, str]  # (solution cell, correct fragment, mistaken fragment)
    answering_libraries: tuple[str, ...] = ()  # top-level packages, hidden from a kernel graded on this chapter

    @property
    def module(self) -> str:
        """The chapter's module in ``reference`` and in ``checks``: its id without the number."""
        return self.id.split("_", 1)[1]


CHAPTERS = (
    Chapter("01_attention", ("softmax", "scaled_dot_product_attention"),
            ("check_softmax", "check_scaled_dot_product_attention"),
            ("scaled_dot_product_attention", " / math.sqrt(d_k)", "")),
    Chapter("02_multi_head_attention", ("split_heads", "merge_heads", "MultiHeadAttention"),
            ("check_split_heads", "check_merge_heads", "check_multi_head_attention"),
            ("MultiHeadAttention", ", bias=bias)", ")")),
    Chapter("03_attention_variants",
            ("causal_mask", "padding_mask", "SelfAttention", "CausalSelfAttention", "CrossAttention"),
            ("check_causal_mask", "check_padding_mask", "check_self_attention", "check_causal_self_attention",
             "check_cross_attention"),
            ("CausalSelfAttention", ", device=x.device", "")),
    Chapter("04_ffn_layernorm_residual",
            ("PositionwiseFeedForward", "ffn_as_conv1d", "LayerNorm", "SublayerConnection"),
            ("check_positionwise_feed_forward", "check_ffn_as_conv1d", "check_layer_norm", "check_sublayer_connection"),
            ("layer_norm", "unbiased=False", "unbiased=True")),
    Chapter("05_transformer", ("positional_encoding", "EncoderLayer", "DecoderLayer", "Transformer",
                               "teacher_forcing_loss", "greedy_decode"),
            ("check_positional_encoding", "check_encoder_layer", "check_decoder_layer", "check_transformer",
             "check_teacher_forcing_loss", "check_greedy_decode"),
            ("transformer", " * math.sqrt(self.d_model)", "")),
    Chapter("06_decoder_only", ("RMSNorm", "apply_rotary", "DecoderBlock", "GPT", "lm_loss", "generate",
                                "load_hf_llama", "load_meta_llama"),
            ("check_rms_norm", "check_apply_rotary", "check_decoder_block", "check_gpt", "check_lm_loss",
             "check_generate", "check_load_hf_llama", "check_load_meta_llama"),
            ("generate", "probs = logits.softmax(dim=-1)", "probs = logits.softmax(dim=0)")),
    Chapter("07_attention_at_scale", ("online_softmax", "tiled_attention"),
            ("check_online_softmax", "check_tiled_attention"),
            ("tiled_attention", "acc * correction + p", "acc + p")),
    Chapter("08_tokens", ("train_bpe", "encode", "decode"), ("check_train_bpe", "check_encode", "check_decode"),
            ("decode", 'b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")',
             '"".join(vocab[i].decode("utf-8", errors="replace") for i in ids)'),
            answering_libraries=("tiktoken", "tokenizers", "transformers", "sentencepiece")),
)


def by_id(chapter: str) -> Chapter:
    """The row of the chapter whose id is ``chapter`` (``"05_transformer"``)."""
    return next(row for row in CHAPTERS if row.id == chapter)


def hidden_in_grading(chapter: str) -> list[str]:
    """The chapters' modules a kernel graded on ``chapter`` (e.g. ``"03_attention_variants"``, or its module
    name ``"attention_variants"``) must not see: that chapter's and every later one's, each would hand over
    the answer. (Of the rest of the package, the kernel is given even less: ``grading.kernel_view``.)"""
    order = [c.module for c in CHAPTERS]
    module = chapter.split("_", 1)[1] if chapter[:1].isdigit() else chapter
    return order[order.index(module):]
