"""What chapter 5's Transformer check names: the hint to the submodules the notebook names, and the
mistakes of encode, decode and forward, edits of the reference Transformer's methods."""

from functools import partial

from ...reference import transformer as ref
from ..harness import Mistake, edited

MODEL_HINT = (
    "the notebook names the submodules src_embed, tgt_embed (nn.Embedding), encoder_layers, decoder_layers "
    "(nn.ModuleList), encoder_norm, decoder_norm (LayerNorm(d_model) for Pre-LN, None for Post-LN) and head "
    "(nn.Linear(d_model, tgt_vocab))."
)


# The reference Transformer's methods with ``changes`` made to their source and ``names`` in place of the
# module's (``edited``), called as the comments say: the mistakes of encode, decode and forward, and the
# embedding mistakes that encode and decode make through ``embed``.
_embedding = partial(edited, ref.Transformer.embed)  # (model, tokens, embedding)
_encode = partial(edited, ref.Transformer.encode)  # (model, src, src_padding_mask)
_decode = partial(edited, ref.Transformer.decode)  # (model, tgt, memory, tgt_padding_mask, src_padding_mask)
_forward = partial(edited, ref.Transformer.forward)  # (model, src, tgt, src_padding_mask, tgt_padding_mask)


EMBEDDED = ("self.embed(", "embed(self, ")  # encode or decode with an ``_embedding`` mistake as ``embed``
SCALED, PE = "embedding(tokens) * math.sqrt(self.d_model)", "x + self.pe[: tokens.size(1)]"
EMBEDDING_MISTAKES = [
    ("token embeddings not scaled by sqrt(d_model) before the positional encoding is added",
     "multiply embedding(tokens) by math.sqrt(d_model), then add the positional encoding.",
     _embedding((SCALED, "embedding(tokens)"))),
    ("positional encoding indexed by batch instead of position: sequence b got PE[b] at every "
     "position (pe[:x.size(0)] on a batch-first tensor)",
     "the positions are axis 1 of (B, T, d_model): add pe[:T], which broadcasts over the batch.",
     _embedding((PE, "x + self.pe[: tokens.size(0), None, :]"))),
    ("the positional encoding is not added: without it attention cannot tell the positions apart",
     "add pe[:T] (T = tokens.size(1)) to the scaled embeddings.",
     _embedding((PE, "x"))),
    ("the positional encoding is added twice",
     "add it once, in one place (for example a helper that both encode and decode call).",
     _embedding((PE, "x + 2 * self.pe[: tokens.size(1)]"))),
    ("the positional encoding is added before the sqrt(d_model) scale, so it was scaled too",
     "scale the embeddings first, then add the positional encoding: embedding(tokens) * sqrt(d_model) + pe[:T].",
     _embedding((SCALED, "embedding(tokens)"), (PE, f"({PE}) * math.sqrt(self.d_model)"))),
]
DUPLICATE_NORM = (
    "a duplicate final LayerNorm on a Post-LN stack: each Post-LN layer already ends with a LayerNorm",
    "only Pre-LN stacks end with a final LayerNorm (their last residual sum was never normalised); "
    "for norm_first=False set encoder_norm = decoder_norm = None and skip them.",
)
LAYER_NORM = "nn.functional.layer_norm(x, x.shape[-1:])"  # a duplicate norm has no weights of its own

ENCODE_MISTAKES = [
    Mistake(problem, hint, _encode(EMBEDDED, embed=embedding)) for problem, hint, embedding in EMBEDDING_MISTAKES
] + [
    Mistake("the encoder layers do not get src_padding_mask: the source's padding is attended to",
            "call every encoder layer as layer(x, src_padding_mask).",
            _encode(("layer(x, src_padding_mask)", "layer(x)"))),
    Mistake(*DUPLICATE_NORM, _encode(("return x if", f"return {LAYER_NORM} if"))),
]
DECODER_LAYERS = "layer(x, memory, tgt_padding_mask, src_padding_mask)"
DECODE_MISTAKES = [
    Mistake(problem, hint, _decode(EMBEDDED, embed=embedding)) for problem, hint, embedding in EMBEDDING_MISTAKES
] + [
    Mistake("decoder fed the source embeddings: the target tokens were looked up in src_embed",
            "decode embeds the target tokens with tgt_embed; src_embed belongs to encode.",
            _decode(("self.embed(tgt, self.tgt_embed)", "self.embed(tgt, self.src_embed)"))),
] + [
    Mistake("cross-attention attending to the decoder's own states instead of the encoder output: each decoder "
            "layer was given x as its memory",
            "call every decoder layer as layer(x, memory, tgt_padding_mask, src_padding_mask).",
            _decode((DECODER_LAYERS, f"layer(x, x, tgt_padding_mask, {memory_mask})")))
    for memory_mask in ("None", "tgt_padding_mask")  # the mask that fits the states given, or none
] + [
    Mistake("the decoder layers do not get src_padding_mask: the cross-attention attends to the source's padding",
            "pass src_padding_mask to every decoder layer, as its memory_padding_mask.",
            _decode((DECODER_LAYERS, "layer(x, memory, tgt_padding_mask, None)"))),
    Mistake("the decoder layers do not get tgt_padding_mask",
            "pass tgt_padding_mask to every decoder layer.",
            _decode((DECODER_LAYERS, "layer(x, memory, None, src_padding_mask)"))),
    Mistake(*DUPLICATE_NORM,
            _decode(("self.head(x)", f"self.head(x if self.decoder_norm is not None else {LAYER_NORM})"))),
]
DECODE_CALL = "self.decode(tgt, memory, tgt_padding_mask, src_padding_mask)"
FORWARD_MISTAKES = [
    Mistake("forward passes the padding masks the wrong way round",
            "the notebook's order is forward(src, tgt, src_padding_mask, tgt_padding_mask); encode takes "
            "src_padding_mask, decode takes (tgt, memory, tgt_padding_mask, src_padding_mask).",
            # Never computed on the check's cases (S != T: the swapped masks cannot broadcast); the learner's forward
            # raises instead, and the check's message then asks whether the masks are the wrong way round.
            _forward((DECODE_CALL, "self.decode(tgt, memory, src_padding_mask, tgt_padding_mask)"))),
    Mistake("forward does not pass src_padding_mask on to decode, so the cross-attention sees the source's padding",
            "memory = self.encode(src, src_padding_mask); return self.decode(tgt, memory, tgt_padding_mask, "
            "src_padding_mask).",
            _forward((DECODE_CALL, "self.decode(tgt, memory, tgt_padding_mask, None)"))),
    Mistake("forward does not pass src_padding_mask on to encode",
            "memory = self.encode(src, src_padding_mask).",
            _forward(("self.encode(src, src_padding_mask)", "self.encode(src)"))),
]
