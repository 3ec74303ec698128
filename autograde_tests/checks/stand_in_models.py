"""The stand-ins the checks hand to the learner's code (chapters 4 to 6), and chapter 5's "can it learn" run.

Grading ``SublayerConnection`` alone means handing it a sublayer; grading ``Transformer`` alone means
running it with layers that are not the learner's; grading ``teacher_forcing_loss``, ``greedy_decode``,
``GPT``, ``lm_loss`` and ``generate`` means handing them a model or blocks. In a graded run each is lent
(``remote.lent``): it stays in the grader, which answers every call the kernel's code makes on it and keeps
its record (the calls a sublayer received, the tokens a model was fed); the kernel holds a stub with a copy
of its weights. Built from PyTorch alone, they are deliberately not answers: each layer mixes positions by a
plain average over the keys it may see, which makes it use every mask the way attention would, and nothing
more. The checks compute the expected numbers with the very same stand-ins. Chapter 6's (``StandInBlock``,
``StandInLM``) do the same for a decoder-only model: a block that takes positions and a cache as a
DecoderBlock does. ``Training`` runs in the kernel, on the learner's own model.
"""

import math

import torch
from torch import nn


def _masked_mean(values: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """(B, m, n) bool ``allowed`` × (B, n, d) ``values`` -> (B, m, d): each row's average over what it may
    see, zero where it may see nothing."""
    weights = allowed.to(values.dtype)
    return weights @ values / weights.sum(-1, keepdim=True).clamp(min=1)


def _allowed(m: int, padding_mask: torch.Tensor | None, n: int, like: torch.Tensor) -> torch.Tensor:
    """(B or 1, m, n): every key, or the real ones of a (B, n) padding mask."""
    if padding_mask is None:
        return torch.ones(1, m, n, dtype=torch.bool, device=like.device)
    return padding_mask[:, None, :].expand(-1, m, -1)


# ------------------------------------------------------------------ chapter 4: the sublayers


class CountedSublayer:
    """A sublayer the learner did not write, counting its calls (lent: the count is the grader's)."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = 0

    def __call__(self, h):
        self.calls += 1
        return self.fn(h)


def attention_sublayer(h: torch.Tensor) -> torch.Tensor:
    """Parameter-free self-attention, a sublayer that mixes positions (PyTorch's own attention)."""
    return torch.nn.functional.scaled_dot_product_attention(h, h, h)


def position_wise_sublayer(state: dict) -> nn.Sequential:
    """tanh of one linear layer with the weights in ``state`` ("0.weight", "0.bias"): a sublayer with
    parameters that acts on each position alone, and deliberately not chapter 4's FFN (which is an answer)."""
    d_model, dtype = state["0.weight"].shape[0], state["0.weight"].dtype
    layers = nn.Sequential(nn.Linear(d_model, d_model), nn.Tanh()).to(dtype)
    layers.load_state_dict(state)
    return layers.eval()


# ------------------------------------------------------------------ chapter 5: layers and a model


class StandInEncoderLayer(nn.Module):
    """``layer(x, padding_mask=None)``: x + tanh(own(x)) + the average of mix(x) over the real positions."""

    def __init__(self, d_model: int):
        super().__init__()
        self.own, self.mix = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, x, padding_mask=None):
        T = x.size(1)
        return x + torch.tanh(self.own(x)) + _masked_mean(self.mix(x), _allowed(T, padding_mask, T, x))


class StandInDecoderLayer(nn.Module):
    """``layer(x, memory, tgt_padding_mask=None, memory_padding_mask=None)``: x + tanh(own(x)) + the average
    of mix(x) over the real positions up to each one + the average of read(memory) over the real memory."""

    def __init__(self, d_model: int):
        super().__init__()
        self.own, self.mix = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.read = nn.Linear(d_model, d_model)

    def forward(self, x, memory, tgt_padding_mask=None, memory_padding_mask=None):
        T, S = x.size(1), memory.size(1)
        past = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        own = _masked_mean(self.mix(x), _allowed(T, tgt_padding_mask, T, x) & past)
        read = _masked_mean(self.read(memory), _allowed(T, memory_padding_mask, S, x))
        return x + torch.tanh(self.own(x)) + own + read


def stand_in_layers(kind: str, state: dict) -> nn.ModuleList:
    """A ModuleList of stand-in ``"encoder"`` or ``"decoder"`` layers holding the weights in ``state``
    ("0.own.weight", ...); the number of layers and d_model come from the keys and shapes."""
    count = 1 + max(int(key.split(".")[0]) for key in state)
    d_model, dtype = state["0.own.weight"].shape[0], state["0.own.weight"].dtype
    layer = StandInEncoderLayer if kind == "encoder" else StandInDecoderLayer
    layers = nn.ModuleList(layer(d_model) for _ in range(count)).to(dtype)
    layers.load_state_dict(state)
    return layers


class StandInModel(nn.Module):
    """What ``teacher_forcing_loss`` and ``greedy_decode`` are given: ``encode``, ``decode`` and ``forward``
    with the contract's signatures, token embeddings and the stand-in layers (no positional encoding)."""

    def __init__(self, vocab: int, d_model: int):
        super().__init__()
        self.src_embed, self.tgt_embed = nn.Embedding(vocab, d_model), nn.Embedding(vocab, d_model)
        self.encoder, self.decoder = StandInEncoderLayer(d_model), StandInDecoderLayer(d_model)
        self.head = nn.Linear(d_model, vocab)

    def encode(self, src, src_padding_mask=None):
        return self.encoder(self.src_embed(src), src_padding_mask)

    def decode(self, tgt, memory, tgt_padding_mask=None, src_padding_mask=None):
        return self.head(self.decoder(self.tgt_embed(tgt), memory, tgt_padding_mask, src_padding_mask))

    def forward(self, src, tgt, src_padding_mask=None, tgt_padding_mask=None):
        return self.decode(tgt, self.encode(src, src_padding_mask), tgt_padding_mask, src_padding_mask)


def stand_in_model(state: dict) -> StandInModel:
    """A float64 ``StandInModel`` holding the weights in ``state``."""
    vocab, d_model = state["src_embed.weight"].shape
    model = StandInModel(vocab, d_model).double()
    model.load_state_dict(state)
    return model.eval()


class Training:
    """Adam on one fixed batch, a few steps at a time (in a graded run each call is a short request): until the
    cross-entropy of ``model(src, decoder_input)`` against ``labels`` (padding ignored) is below ``stop``. The
    checks judge the trained model themselves, on strings it was not trained on, whose answers are never sent
    here: what this reports (the losses, the parameters that got no gradient at the first step) is only a
    note in a graded run."""

    def __init__(self, model: nn.Module, src, decoder_input, labels, pad: int, lr: float):
        self.model, self.batch, self.pad = model, (src, decoder_input, labels), pad
        self.optimiser = torch.optim.Adam(model.parameters(), lr=lr)
        self.losses: list[float] = []
        self.unused: list[str] = []

    def run(self, steps: int, stop: float) -> dict:
        """Up to ``steps`` more steps: the losses so far, the unused parameters, and whether training is over."""
        src, decoder_input, labels = self.batch
        self.model.train()
        for _ in range(steps):
            logits = self.model(src, decoder_input, src != self.pad, decoder_input != self.pad)
            loss = nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=self.pad)
            self.losses.append(loss.item())
            if not math.isfinite(self.losses[-1]) or self.losses[-1] < stop:
                return self._report(done=True)
            self.optimiser.zero_grad()
            loss.backward()
            if len(self.losses) == 1:
                self.unused = [key for key, p in self.model.named_parameters() if p.grad is None]
                if self.unused:
                    return self._report(done=True)
            self.optimiser.step()
        return self._report(done=False)

    def _report(self, done: bool) -> dict:
        return {"losses": list(self.losses), "unused": list(self.unused), "done": done}


class StandInBlock(nn.Module):
    """``block(x, positions, cache=None) -> (x, (k, v))``, a DecoderBlock's signature: x + tanh(own(x) +
    cos(positions)·phase) + the average of mix(x) over every token up to each one, the cached ones included.

    Its cache has the contract's layout with one head: k (B, 1, T, 1) holds the positions, v (B, 1, T, d_model)
    the mixed states; both grow along axis 2, time.
    """

    def __init__(self, d_model: int):
        super().__init__()
        self.own, self.mix = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.phase = nn.Parameter(torch.zeros(d_model))

    def forward(self, x, positions, cache=None):
        B, T, _ = x.shape
        k = positions.to(x.dtype)[None, None, :, None].expand(B, 1, T, 1)  # (B, 1, T, 1)
        v = self.mix(x)[:, None]  # (B, 1, T, d_model)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        past = k.size(2) - T
        allowed = torch.arange(k.size(2), device=x.device) <= torch.arange(past, past + T, device=x.device)[:, None]
        average = _masked_mean(v[:, 0], allowed[None])  # (B, T, d_model)
        turn = torch.cos(positions.to(x.dtype))[:, None] * self.phase  # (T, d_model): where each token is
        return x + torch.tanh(self.own(x) + turn) + average, (k, v)


def stand_in_blocks(state: dict) -> nn.ModuleList:
    """A ModuleList of ``StandInBlock`` holding the weights in ``state`` ("0.own.weight", ...)."""
    count = 1 + max(int(key.split(".")[0]) for key in state)
    d_model, dtype = state["0.own.weight"].shape[0], state["0.own.weight"].dtype
    blocks = nn.ModuleList(StandInBlock(d_model) for _ in range(count)).to(dtype)
    blocks.load_state_dict(state)
    return blocks


class StandInLM(nn.Module):
    """What ``lm_loss`` and ``generate`` are given: ``forward(idx, cache=None) -> (logits, cache)``, a GPT's
    signature, with one ``StandInBlock``. A call given a cache adds ``recall`` to its logits, so that the
    tokens drawn show whether generation used the cache; ``fed`` lists how many tokens each call was given
    (lent, the model keeps that record in the grader)."""

    def __init__(self, vocab: int, d_model: int):
        super().__init__()
        self.embed, self.block, self.head = (nn.Embedding(vocab, d_model), StandInBlock(d_model),
                                             nn.Linear(d_model, vocab))
        self.recall = nn.Parameter(torch.zeros(vocab))
        self.fed: list[int] = []

    def forward(self, idx, cache=None):
        self.fed.append(idx.size(1))
        past = 0 if cache is None else cache[0][0].size(2)
        x, block_cache = self.block(self.embed(idx), torch.arange(past, past + idx.size(1), device=idx.device),
                                    None if cache is None else cache[0])
        logits = self.head(x) if cache is None else self.head(x) + self.recall
        return logits, [block_cache]


def stand_in_lm(state: dict) -> StandInLM:
    """A ``StandInLM`` holding the weights in ``state``, in their dtype."""
    vocab, d_model = state["embed.weight"].shape
    model = StandInLM(vocab, d_model).to(state["embed.weight"].dtype)
    model.load_state_dict(state)
    return model.eval()


def seeded_generator(device: str, seed: int) -> torch.Generator:
    """The generator a check hands to ``generate``, made where the learner's code runs."""
    return torch.Generator(device=device).manual_seed(seed)


# ------------------------------------------------------------------ chapter 6: what a checkpoint is loaded into


class LoadTarget(nn.Module):
    """What ``load_hf_llama`` and ``load_meta_llama`` are given: a GPT's parameters under a GPT's names, and
    each block's head counts (``n_heads``, ``n_kv_heads``, ``d_k``). It computes nothing (no forward): the check
    reads back the weights the learner's code put into it, and computes the logits itself."""


def load_target(state: dict, n_heads: int) -> LoadTarget:
    """A ``LoadTarget`` holding ``state`` (a GPT's: "embed.weight", "blocks.0.w_q.weight", ..., "head.weight"),
    in its dtype and on its device: nn.Embedding, bias-free nn.Linear and nn.RMSNorm, as their shapes say."""
    vocab, d_model = state["embed.weight"].shape
    target = LoadTarget()
    target.embed = nn.Embedding(vocab, d_model)
    target.blocks = nn.ModuleList()
    for key, weight in state.items():
        parts = key.split(".")
        if parts[0] != "blocks":
            continue
        while len(target.blocks) <= int(parts[1]):
            target.blocks.append(nn.Module())
        part = (nn.RMSNorm(weight.shape[0]) if weight.dim() == 1
                else nn.Linear(weight.shape[1], weight.shape[0], bias=False))
        setattr(target.blocks[int(parts[1])], parts[2], part)
    target.norm, target.head = nn.RMSNorm(d_model), nn.Linear(d_model, vocab, bias=False)
    for block in target.blocks:
        block.n_heads, block.d_k = n_heads, d_model // n_heads
        block.n_kv_heads = block.w_k.out_features // block.d_k
    target.to(device=state["embed.weight"].device, dtype=state["embed.weight"].dtype)
    target.load_state_dict(state)
    return target.eval()
