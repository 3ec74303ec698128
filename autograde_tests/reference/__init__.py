"""Reference implementations of every name the learners implement (see the course contract).

The names and signatures here are the contract's; the tests prove each one against PyTorch's own.
Each name is imported from its chapter's module when first used (``lazy``): a graded kernel, which is given
the earlier chapters' pieces but not the chapter it is graded on, can still import this package.
"""

from ..lazy import exports

CHAPTER_MODULES = {
    "attention": ["softmax", "scaled_dot_product_attention"],
    "multi_head_attention": ["split_heads", "merge_heads", "MultiHeadAttention"],
    "attention_variants": ["causal_mask", "padding_mask", "SelfAttention", "CausalSelfAttention", "CrossAttention"],
    "ffn_layernorm_residual": ["PositionwiseFeedForward", "ffn_as_conv1d", "LayerNorm", "SublayerConnection"],
    "transformer": ["positional_encoding", "EncoderLayer", "DecoderLayer", "Transformer", "teacher_forcing_loss",
                    "greedy_decode"],
    "decoder_only": ["RMSNorm", "apply_rotary", "DecoderBlock", "GPT", "lm_loss", "generate", "load_hf_llama",
                     "load_meta_llama"],
    "attention_at_scale": ["online_softmax", "tiled_attention"],
}
__all__, __getattr__ = exports(__name__, CHAPTER_MODULES)


def hidden_in_grading(chapter: str) -> list[str]:
    """The chapters' modules a kernel graded on ``chapter`` (e.g. ``"03_attention_variants"``, or its module
    name ``"attention_variants"``) must not see: that chapter's and every later one's, each would hand over
    the answer. Chapter ids drop their number to name modules. (Of the rest of the package, the kernel is
    given even less: ``grading.kernel_view``.)"""
    module = chapter.split("_", 1)[1] if chapter[:1].isdigit() else chapter
    order = list(CHAPTER_MODULES)
    return order[order.index(module):]
