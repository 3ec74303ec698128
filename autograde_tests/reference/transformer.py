"""Chapter 05_transformer: embeddings, positional encoding, encoder and decoder layers, the whole model.

    encoder layer   x = Sub(x, self-attention over x)                 (padding mask on the keys)
                    x = Sub(x, FFN)
    decoder layer   y = Sub(y, masked self-attention over y)          (causal AND padding mask)
                    y = Sub(y, cross-attention from y to the memory)  (the source's padding mask)
                    y = Sub(y, FFN)
where Sub is a ``SublayerConnection`` (residual + LayerNorm, Post-LN or Pre-LN) and the memory is the
encoder's output. (Vaswani et al., 2017, section 3.1 and figure 1.)

Shapes, batch first: source tokens ``src`` (B, S), target tokens ``tgt`` (B, T), states (B, ·, d_model).
Masks are boolean, ``True`` = may attend; a padding mask is (B, n), ``True`` for real tokens.

Every attention here has biases (``MultiHeadAttention(d_model, n_heads, bias=True)``), as in the paper's
reference code and in ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``, so that
``from_torch`` can copy every weight of those layers.
"""

import math

import torch
from torch import nn

from .attention_variants import causal_mask
from .ffn_layernorm_residual import LayerNorm, PositionwiseFeedForward, SublayerConnection
from .multi_head_attention import MultiHeadAttention


def positional_encoding(max_len: int, d_model: int) -> torch.Tensor:
    """(max_len, d_model) sinusoids, in the default dtype:

        PE[pos, 2i]     = sin(pos / 10000^(2i / d_model))
        PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model))

    Each pair of features is a clock of its own frequency, from one turn every 2π positions down to one
    every 10000·2π; the position is read off all the clocks together. Computed in float64 so that the
    float32 result is correctly rounded even for large ``pos``.
    """
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d_model / 2),)
    angle = position / 10000 ** (two_i / d_model)  # (max_len, ceil(d_model / 2))
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])  # an odd d_model has one sine more than cosines
    return pe.to(torch.get_default_dtype())


def _copy_norm(ours: LayerNorm, theirs: nn.LayerNorm) -> None:
    ours.eps = theirs.eps
    ours.load_state_dict(theirs.state_dict())


def _copy_ffn(ours: PositionwiseFeedForward, layer: nn.Module) -> None:
    ours.linear1.load_state_dict(layer.linear1.state_dict())
    ours.linear2.load_state_dict(layer.linear2.state_dict())


def _check_torch_layer(layer: nn.Module) -> None:
    if not layer.self_attn.batch_first:
        raise ValueError("only batch_first=True layers are supported")
    if layer.activation is not nn.functional.relu and not isinstance(layer.activation, nn.ReLU):
        raise ValueError("only the ReLU activation is supported")


class EncoderLayer(nn.Module):
    """Self-attention, then the FFN, each inside a residual connection with a LayerNorm.

    Submodules: ``self_attn`` (MultiHeadAttention with biases), ``ffn`` (PositionwiseFeedForward) and
    ``sublayers``, the two SublayerConnections (0: around the attention, 1: around the FFN).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=True)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayers = nn.ModuleList(SublayerConnection(d_model, dropout, norm_first) for _ in range(2))

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, S, d_model); padding_mask: (B, S) bool, ``True`` = real token. Returns (B, S, d_model).

        Padded positions still get an output (they attend to the real tokens); nothing reads it.
        """
        mask = None if padding_mask is None else padding_mask[:, None, None, :]  # (B, 1, 1, S)
        x = self.sublayers[0](x, lambda h: self.self_attn(h, h, mask)[0])
        return self.sublayers[1](x, self.ffn)

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> "EncoderLayer":
        """The same function as ``layer`` (batch_first, ReLU; in eval mode), with its weights copied."""
        _check_torch_layer(layer)
        d_model, n_heads = layer.self_attn.embed_dim, layer.self_attn.num_heads
        module = cls(d_model, n_heads, layer.linear1.out_features, layer.dropout.p, layer.norm_first)
        module.to(layer.linear1.weight)
        module.self_attn = MultiHeadAttention.from_torch(layer.self_attn)
        _copy_ffn(module.ffn, layer)
        for sublayer, norm in zip(module.sublayers, (layer.norm1, layer.norm2)):
            _copy_norm(sublayer.norm, norm)
        return module.train(layer.training)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the memory, then the FFN, each inside a residual connection.

    Submodules: ``self_attn`` and ``cross_attn`` (MultiHeadAttention with biases), ``ffn`` and
    ``sublayers``, the three SublayerConnections in that order.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=True)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, bias=True)
        self.ffn = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.sublayers = nn.ModuleList(SublayerConnection(d_model, dropout, norm_first) for _ in range(3))

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        tgt_padding_mask: torch.Tensor | None = None,
        memory_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, T, d_model) target states; memory: (B, S, d_model) the encoder's output.

        tgt_padding_mask: (B, T), memory_padding_mask: (B, S), bool, ``True`` = real token.
        Returns (B, T, d_model); position t depends on the targets 0 .. t only.
        """
        self_mask = causal_mask(x.size(1), device=x.device)  # (T, T)
        if tgt_padding_mask is not None:
            self_mask = self_mask & tgt_padding_mask[:, None, None, :]  # (B, 1, T, T)
        cross_mask = None if memory_padding_mask is None else memory_padding_mask[:, None, None, :]  # (B,1,1,S)
        x = self.sublayers[0](x, lambda h: self.self_attn(h, h, self_mask)[0])
        # Queries from the decoder, keys and values from the encoder: this is where the source comes in.
        x = self.sublayers[1](x, lambda h: self.cross_attn(h, memory, cross_mask)[0])
        return self.sublayers[2](x, self.ffn)

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> "DecoderLayer":
        """The same function as ``layer`` (batch_first, ReLU; in eval mode, called with a causal
        ``tgt_mask``), with its weights copied."""
        _check_torch_layer(layer)
        d_model, n_heads = layer.self_attn.embed_dim, layer.self_attn.num_heads
        module = cls(d_model, n_heads, layer.linear1.out_features, layer.dropout.p, layer.norm_first)
        module.to(layer.linear1.weight)
        module.self_attn = MultiHeadAttention.from_torch(layer.self_attn)
        module.cross_attn = MultiHeadAttention.from_torch(layer.multihead_attn)
        _copy_ffn(module.ffn, layer)
        for sublayer, norm in zip(module.sublayers, (layer.norm1, layer.norm2, layer.norm3)):
            _copy_norm(sublayer.norm, norm)
        return module.train(layer.training)


class Transformer(nn.Module):
    """The encoder-decoder: encode the source once, then decode target tokens against that memory.

    Submodules: ``src_embed`` and ``tgt_embed`` (nn.Embedding), ``encoder_layers`` and ``decoder_layers``
    (nn.ModuleList of ``n_layers`` layers each), ``encoder_norm`` and ``decoder_norm`` (a final LayerNorm
    for Pre-LN stacks, ``None`` for Post-LN, whose layers already end with one), ``head``
    (nn.Linear(d_model, tgt_vocab)). The positional encoding is a non-persistent buffer ``pe``.
    """

    def __init__(
        self,
        src_vocab: int,
        tgt_vocab: int,
        d_model: int,
        n_heads: int,
        n_layers: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        max_len: int = 512,
    ):
        super().__init__()
        self.d_model = d_model
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.register_buffer("pe", positional_encoding(max_len, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers)
        )
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers)
        )
        # A Pre-LN stack's last residual sum was never normalised; a Post-LN layer's output already is.
        self.encoder_norm = LayerNorm(d_model) if norm_first else None
        self.decoder_norm = LayerNorm(d_model) if norm_first else None
        self.head = nn.Linear(d_model, tgt_vocab)
        for embedding in (self.src_embed, self.tgt_embed):
            # N(0, 1/d_model) entries, so that after the √d_model scale each has the size of the PE's.
            nn.init.normal_(embedding.weight, std=d_model**-0.5)

    def embed(self, tokens: torch.Tensor, embedding: nn.Embedding) -> torch.Tensor:
        """(B, T) token ids -> (B, T, d_model): embedding · √d_model + PE[position], then dropout."""
        x = embedding(tokens) * math.sqrt(self.d_model)  # (B, T, d_model)
        # The PE is indexed by position (axis 1), and broadcast over the batch.
        return self.dropout(x + self.pe[: tokens.size(1)])

    def encode(self, src: torch.Tensor, src_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """src: (B, S) token ids; src_padding_mask: (B, S), ``True`` = real. Returns the memory (B, S, d_model)."""
        x = self.embed(src, self.src_embed)
        for layer in self.encoder_layers:
            x = layer(x, src_padding_mask)
        return x if self.encoder_norm is None else self.encoder_norm(x)

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        tgt_padding_mask: torch.Tensor | None = None,
        src_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tgt: (B, T) token ids; memory: (B, S, d_model). Returns logits (B, T, tgt_vocab).

        The logits at position t score the token that comes *after* tgt[:, t].
        """
        x = self.embed(tgt, self.tgt_embed)
        for layer in self.decoder_layers:
            x = layer(x, memory, tgt_padding_mask, src_padding_mask)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self.head(x)  # (B, T, tgt_vocab)

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        src_padding_mask: torch.Tensor | None = None,
        tgt_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """src: (B, S), tgt: (B, T) token ids, with their padding masks. Returns logits (B, T, tgt_vocab)."""
        memory = self.encode(src, src_padding_mask)
        return self.decode(tgt, memory, tgt_padding_mask, src_padding_mask)


def teacher_forcing_loss(model: Transformer, src: torch.Tensor, tgt: torch.Tensor, pad_id: int) -> torch.Tensor:
    """The mean cross-entropy of predicting each next target token from the true tokens before it.

    Args:
        src: (B, S) source token ids, padded with ``pad_id``.
        tgt: (B, T) target token ids ``[bos, y_1, ..., y_k, eos, pad, ...]``, padded with ``pad_id``.

    Returns:
        a scalar: the mean over the real (non-pad) tokens of tgt[:, 1:]. The decoder reads the targets
        shifted right, tgt[:, :-1]: at position t it sees tokens 0 .. t and must predict token t + 1.
    """
    decoder_input, labels = tgt[:, :-1], tgt[:, 1:]  # (B, T - 1) each
    logits = model(src, decoder_input, src != pad_id, decoder_input != pad_id)  # (B, T - 1, V)
    return nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=pad_id)


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: torch.Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int,
    src_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Generate the target one token at a time, always taking the most likely next token.

    Args:
        src: (B, S) source token ids; src_padding_mask: (B, S) bool, ``True`` = real token.
        max_len: the most tokens an output may have, ``bos_id`` included.

    Returns:
        (B, L) LongTensor, L <= max_len, starting with ``bos_id``. A sequence that has emitted ``eos_id``
        is padded with ``eos_id``; decoding stops early once every sequence has.
    """
    memory = model.encode(src, src_padding_mask)  # (B, S, d_model): the source is encoded once
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)  # (B,)
    while ys.size(1) < max_len and not done.all():
        logits = model.decode(ys, memory, src_padding_mask=src_padding_mask)  # (B, t, V)
        next_token = logits[:, -1].argmax(dim=-1)  # (B,): only the last position predicts something new
        next_token = torch.where(done, eos_id, next_token)
        ys = torch.cat([ys, next_token[:, None]], dim=1)  # (B, t + 1)
        done = done | (next_token == eos_id)
    return ys
