"""The chapter-6 checks pass every correct way of writing the code and name every known mistake.

The chapter's catalogued mistakes (the list the checks' docstring keeps), one buggy variant each, written
as a learner would, mostly the reference with one thing changed:
    RoPE rotating the wrong pairs (interleaved instead of the course's half-split), RoPE applied to v,
    positions restarting at 0 for cached tokens, the cache appended on the wrong axis, RMSNorm subtracting
    the mean, softmax over the wrong axis in sampling, top-k applied after softmax without renormalising,
    temperature applied after softmax, the loss not shifted;
and near relatives (eps outside the root, RoPE on q only or before the heads are split, a causal mask blind
to the cache, Post-Norm, no final norm, blocks given the wrong cache or none, a softmax before the
cross-entropy, top-p and top-k off by one, the cache not used); and the deviations of published code the
contract does not allow (a draw over sorted or top-k probabilities, temperature 0 used as a divisor, logits
turned to float32).
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autograde_tests.reference as R
from autograde_tests.checks import (
    check_apply_rotary,
    check_decoder_block,
    check_generate,
    check_gpt,
    check_lm_loss,
    check_rms_norm,
)

pytestmark = pytest.mark.usefixtures("learner_side", "one_thread")  # in-process and through the wire; one thread


# ------------------------------------------------------------------------ RMSNorm


class RMSNormFunctional(R.RMSNorm):
    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)


class RMSNormRsqrt(nn.Module):
    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d_model)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps))


class RMSNormCentred(R.RMSNorm):
    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class RMSNormEpsOutside(R.RMSNorm):
    def forward(self, x):
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * self.weight


class RMSNormUnscaled(R.RMSNorm):
    def forward(self, x):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class RMSNormWithoutEps(R.RMSNorm):
    def forward(self, x):
        return x / x.pow(2).mean(-1, keepdim=True).sqrt() * self.weight


class RMSNormOfTheSum(R.RMSNorm):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + self.eps) * self.weight


class RMSNormOverTheWholeTensor(R.RMSNorm):
    def forward(self, x):
        return x / torch.sqrt(x.pow(2).mean() + self.eps) * self.weight


class RMSNormFixedEps(R.RMSNorm):
    def forward(self, x):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class RMSNormInFloat32(R.RMSNorm):
    """In float32 on purpose, as published RMSNorms do for speed: fails in float64 only."""

    def forward(self, x):
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class RMSNormDetached(R.RMSNorm):
    def forward(self, x):
        return x / torch.sqrt(x.detach().pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


@pytest.mark.parametrize("RMSNorm", [R.RMSNorm, RMSNormFunctional, RMSNormRsqrt])
@pytest.mark.parametrize("hidden", [False, True])
def test_rms_norm_check_passes_correct_variants(RMSNorm, hidden, capsys):
    check_rms_norm(RMSNorm, hidden=hidden)
    assert "✔ RMSNorm" in capsys.readouterr().out


@pytest.mark.parametrize("RMSNorm, message", [
    (RMSNormCentred, "RMSNorm subtracts the mean"),
    (RMSNormEpsOutside, "eps is added outside the square root"),
    (RMSNormUnscaled, "not scaled by the learnable weight"),
    (RMSNormWithoutEps, "eps is left out"),
    (RMSNormOfTheSum, "the root of the sum of squares, not of their mean"),
    (RMSNormOverTheWholeTensor, "the mean square is taken over the whole tensor"),
    (RMSNormFixedEps, "ignores its eps argument and uses 1e-6"),
    (RMSNormInFloat32, "float32 precision only in the output"),
    (RMSNormDetached, "the gradient with respect to `x` differs from the reference"),
])
def test_rms_norm_check_names_the_mistake(RMSNorm, message):
    with pytest.raises(AssertionError, match=message):
        check_rms_norm(RMSNorm)


# ------------------------------------------------------------------------ apply_rotary


def rotary_complex(x, positions, base=10000.0):
    """Each pair (x1, x2) as the complex number x1 + i·x2, turned by e^(i·angle)."""
    half = x.size(-1) // 2
    theta = base ** (-torch.arange(0, x.size(-1), 2, dtype=torch.float64, device=x.device) / x.size(-1))
    turn = torch.polar(torch.ones(len(positions), half, dtype=torch.float64, device=x.device), positions[:, None] * theta)
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * turn
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


def rotary_rotate_half(x, positions, base=10000.0):
    """Hugging Face's form: x·cos + rotate_half(x)·sin, with the angles repeated over both halves."""
    inv_freq = 1.0 / base ** (torch.arange(0, x.size(-1), 2, dtype=torch.float64, device=x.device) / x.size(-1))
    angle = torch.cat([positions[:, None] * inv_freq] * 2, dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * angle.cos().to(x.dtype) + torch.cat([-x2, x1], dim=-1) * angle.sin().to(x.dtype)


def rotary_interleaved(x, positions, base=10000.0):
    theta = base ** (-torch.arange(0, x.size(-1), 2, dtype=torch.float64) / x.size(-1))
    angle = positions[:, None] * theta
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def rotary_backwards(x, positions, base=10000.0):
    return R.apply_rotary(x, -positions, base)


def rotary_from_zero(x, positions, base=10000.0):
    return R.apply_rotary(x, torch.arange(x.size(-2), device=x.device), base)


def rotary_feature_frequencies(x, positions, base=10000.0):
    half = x.size(-1) // 2
    angle = positions[:, None] * base ** (-torch.arange(half, dtype=torch.float64) / x.size(-1))
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rotary_in_float32(x, positions, base=10000.0):
    return R.apply_rotary(x.float(), positions, base).to(x.dtype)


def rotary_consecutive_from_the_first(x, positions, base=10000.0):
    return R.apply_rotary(x, positions[0] + torch.arange(x.size(-2), device=x.device), base)


def rotary_ignoring_the_base(x, positions, base=10000.0):
    return R.apply_rotary(x, positions)


def rotary_rotate_half_with_interleaved_angles(x, positions, base=10000.0):
    """Hugging Face's rotate_half with Meta's layout of the angles, (θ0, θ0, θ1, θ1, ...)."""
    inv_freq = 1.0 / base ** (torch.arange(0, x.size(-1), 2, dtype=torch.float64, device=x.device) / x.size(-1))
    angle = torch.repeat_interleave(positions[:, None] * inv_freq, 2, dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * angle.cos().to(x.dtype) + torch.cat([-x2, x1], dim=-1) * angle.sin().to(x.dtype)


@pytest.mark.parametrize("apply_rotary", [R.apply_rotary, rotary_complex, rotary_rotate_half])
@pytest.mark.parametrize("hidden", [False, True])
def test_apply_rotary_check_passes_correct_variants(apply_rotary, hidden, capsys):
    check_apply_rotary(apply_rotary, hidden=hidden)
    assert "✔ apply_rotary" in capsys.readouterr().out


@pytest.mark.parametrize("apply_rotary, message", [
    (rotary_interleaved, r"RoPE rotates the wrong pairs: neighbouring features \(2i, 2i \+ 1\)"),
    (rotary_backwards, "turns the pairs the wrong way"),
    (rotary_from_zero, "positions argument is ignored"),
    (rotary_feature_frequencies, "the frequencies use the feature index i"),
    (rotary_consecutive_from_the_first, r"only the first position is used: .* need not be consecutive"),
    (rotary_in_float32, "float32 precision only in the rotated tensor"),
    (rotary_rotate_half_with_interleaved_angles, "the angles are laid out for neighbouring pairs"),
])
def test_apply_rotary_check_names_the_mistake(apply_rotary, message):
    with pytest.raises(AssertionError, match=message):
        check_apply_rotary(apply_rotary)


def test_apply_rotary_hidden_cases_name_a_base_that_is_ignored():
    with pytest.raises(AssertionError, match="the base argument is ignored: the frequencies use 10000"):
        check_apply_rotary(rotary_ignoring_the_base, hidden=True)


# ------------------------------------------------------------------------ DecoderBlock


class BlockBase(R.DecoderBlock):
    """The reference block with its attention written as a method the variants change."""

    def rotate(self, t, positions):
        return R.apply_rotary(t, positions)

    def append(self, cache, k, v):
        return torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)

    def allowed(self, T, total, device):
        return torch.arange(total, device=device) <= torch.arange(total - T, total, device=device)[:, None]

    def project(self, h, positions):
        B, T, _ = h.shape
        q, k, v = (w(h).view(B, T, self.n_heads, self.d_k).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
        return self.rotate(q, positions), self.rotate(k, positions), v

    def ffn(self, h):
        return self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))

    def attention(self, h, positions, cache):
        """The attention sublayer on its input h: its output, and the cache with the new keys and values."""
        B, T, _ = h.shape
        q, k, v = self.project(h, positions)
        if cache is not None:
            k, v = self.append(cache, k, v)
        out, _ = R.scaled_dot_product_attention(q, k, v, self.allowed(T, k.size(2), h.device))
        return self.w_o(out.transpose(1, 2).reshape(B, T, -1)), (k, v)

    def forward(self, x, positions, cache=None):
        attended, cache = self.attention(self.attn_norm(x), positions, cache)
        x = x + attended
        return x + self.ffn(self.ffn_norm(x)), cache


class BlockTorchAttention(BlockBase):
    """PyTorch's attention with an explicit mask, and the cache handed back as a list."""

    def forward(self, x, positions, cache=None):
        B, T, _ = x.shape
        q, k, v = self.project(self.attn_norm(x), positions)
        if cache is not None:
            k, v = torch.cat([cache[0], k], -2), torch.cat([cache[1], v], -2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.allowed(T, k.size(2), x.device))
        x = x + self.w_o(out.transpose(1, 2).flatten(2))
        return x + self.ffn(self.ffn_norm(x)), [k, v]


class BlockEinsum(BlockBase):
    """Scores with einsum, the mask from triu, and complex-number RoPE."""

    def rotate(self, t, positions):
        return rotary_complex(t, positions)

    def forward(self, x, positions, cache=None):
        B, T, _ = x.shape
        q, k, v = self.project(self.attn_norm(x), positions)
        if cache is not None:
            k, v = torch.cat((cache[0], k), 2), torch.cat((cache[1], v), 2)
        scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(self.d_k)
        future = torch.ones(T, k.size(2), dtype=torch.bool, device=x.device).triu(k.size(2) - T + 1)
        weights = scores.masked_fill(future, float("-inf")).softmax(-1)
        x = x + self.w_o(torch.einsum("bhts,bhsd->bthd", weights, v).reshape(B, T, -1))
        return x + self.ffn(self.ffn_norm(x)), (k, v)


class BlockInterleaved(BlockBase):
    def rotate(self, t, positions):
        return rotary_interleaved(t, positions)


class BlockRotatesValues(BlockBase):
    def project(self, h, positions):
        q, k, v = super().project(h, positions)
        return q, k, self.rotate(v, positions)


class BlockRotatesQueriesOnly(BlockBase):
    def project(self, h, positions):
        B, T, _ = h.shape
        q, k, v = (w(h).view(B, T, self.n_heads, self.d_k).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
        return self.rotate(q, positions), k, v


class BlockPositionsFromZero(BlockBase):
    def project(self, h, positions):
        return super().project(h, torch.arange(h.size(1), device=h.device))


class BlockCacheOnHeads(BlockBase):
    def append(self, cache, k, v):
        return torch.cat([cache[0], k], dim=1), torch.cat([cache[1], v], dim=1)


class BlockMaskBlindToCache(BlockBase):
    def allowed(self, T, total, device):
        return torch.ones(T, total, dtype=torch.bool, device=device).tril()


class BlockChapter3Mask(BlockBase):
    """Chapter 3's (T, T) causal mask, which cannot be laid over T_past + T keys."""

    def allowed(self, T, total, device):
        return torch.ones(T, T, device=device).tril().bool()


class BlockCacheOfTheNewTokensOnly(BlockBase):
    def forward(self, x, positions, cache=None):
        out, (k, v) = super().forward(x, positions, cache)
        past = 0 if cache is None else cache[0].size(2)
        return out, (k[:, :, past:], v[:, :, past:])


class BlockNoMask(BlockBase):
    def allowed(self, T, total, device):
        return None


class BlockGateSwapped(BlockBase):
    def ffn(self, h):
        return self.w_down(F.silu(self.w_up(h)) * self.w_gate(h))


class BlockRopeBeforeTheHeads(BlockBase):
    def project(self, h, positions):
        B, T, _ = h.shape
        q, k = self.rotate(self.w_q(h), positions), self.rotate(self.w_k(h), positions)
        return (t.view(B, T, self.n_heads, self.d_k).transpose(1, 2) for t in (q, k, self.w_v(h)))


class BlockUnscaled(BlockBase):
    def project(self, h, positions):
        q, k, v = super().project(h, positions)
        return q * math.sqrt(self.d_k), k, v  # as if the scores were never divided by sqrt(d_k)


class BlockPostNorm(BlockBase):
    def forward(self, x, positions, cache=None):
        attended, cache = self.attention(x, positions, cache)
        x = self.attn_norm(x + attended)
        return self.ffn_norm(x + self.ffn(x)), cache


class BlockOneNorm(BlockBase):
    def forward(self, x, positions, cache=None):
        attended, cache = self.attention(self.attn_norm(x), positions, cache)
        x = x + attended
        return x + self.ffn(self.attn_norm(x)), cache


def apply_rotary(x, positions, base=10000.0):
    """This module's "notebook" RoPE, wrong (interleaved pairs): BlockAsInTheNotebook calls it by name."""
    return rotary_interleaved(x, positions, base)


class BlockAsInTheNotebook(BlockBase):
    """Right, but built on this module's wrong apply_rotary and an RMSNorm without its weight."""

    def __init__(self, d_model, n_heads, d_ff, eps=1e-6):
        super().__init__(d_model, n_heads, d_ff, eps)
        self.attn_norm, self.ffn_norm = RMSNormWithoutTheWeight(d_model, eps), RMSNormWithoutTheWeight(d_model, eps)

    def rotate(self, t, positions):
        return apply_rotary(t, positions)


class BlockMaskOnTheCPU(BlockBase):
    def allowed(self, T, total, device):
        return torch.arange(total) <= torch.arange(total - T, total)[:, None]


def test_a_block_that_makes_its_mask_on_a_fixed_device_is_told_so():
    with pytest.raises(AssertionError, match="makes a tensor on a fixed device"):
        check_decoder_block(BlockMaskOnTheCPU)


def test_a_correct_block_gets_full_marks_whatever_its_apply_rotary_and_rms_norm_do(capsys):
    check_decoder_block(BlockAsInTheNotebook, hidden=True)
    assert "✔ DecoderBlock" in capsys.readouterr().out


@pytest.mark.parametrize("DecoderBlock", [R.DecoderBlock, BlockTorchAttention, BlockEinsum])
@pytest.mark.parametrize("hidden", [False, True])
def test_decoder_block_check_passes_correct_variants(DecoderBlock, hidden, capsys):
    check_decoder_block(DecoderBlock, hidden=hidden)
    assert "✔ DecoderBlock" in capsys.readouterr().out


@pytest.mark.parametrize("DecoderBlock, message", [
    (BlockInterleaved, "RoPE rotates the wrong pairs: interleaved"),
    (BlockRotatesValues, "RoPE is applied to v too"),
    (BlockRotatesQueriesOnly, "RoPE is applied to q only"),
    (BlockPositionsFromZero, "positions restarting at 0 for cached tokens"),
    (BlockCacheOnHeads, "the cache is appended on the wrong axis"),
    (BlockMaskBlindToCache, "the causal mask ignores the cached tokens"),
    (BlockNoMask, "no causal mask"),
    (BlockChapter3Mask, r"It fails only when given cached tokens \(with an empty cache it runs\): with T_past"),
    (BlockCacheOfTheNewTokensOnly, "the cache returned holds only the new tokens' keys and values"),
    (BlockGateSwapped, "gate and up projections are swapped"),
    (BlockRopeBeforeTheHeads, "RoPE is applied before the heads are split"),
    (BlockUnscaled, r"the scores are not scaled by 1/sqrt\(d_k\)"),
    (BlockPostNorm, r"the norms come after the residual sums \(Post-Norm"),
    (BlockOneNorm, "the FFN's input goes through attn_norm"),
])
def test_decoder_block_check_names_the_mistake(DecoderBlock, message):
    with pytest.raises(AssertionError, match=message):
        check_decoder_block(DecoderBlock)


def test_an_error_only_with_a_cache_keeps_the_traceback_of_the_learners_code(learner_side):
    """In the learner's notebook; a graded run's feedback shows the message alone."""
    with pytest.raises(AssertionError) as failed:
        check_decoder_block(BlockChapter3Mask)
    if learner_side == "in-process":
        assert any("in forward" in line for line in failed.value.learner_frames), failed.value.learner_frames


# ------------------------------------------------------------------------ GPT


class GPTBase(R.GPT):
    def positions(self, idx, cache):
        past = 0 if cache is None else cache[0][0].size(2)
        return torch.arange(past, past + idx.size(1), device=idx.device)

    def embedding(self, idx):
        return self.embed(idx)

    def final(self, x):
        return self.norm(x)

    def forward(self, idx, cache=None):
        x, positions, new_cache = self.embedding(idx), self.positions(idx, cache), []
        for block, layer_cache in zip(self.blocks, cache or [None] * len(self.blocks)):
            x, layer_cache = block(x, positions, layer_cache)
            new_cache.append(layer_cache)
        return self.head(self.final(x)), new_cache


class GPTTupleCache(GPTBase):
    """The model's cache as a tuple, its length read from the values' time axis."""

    def forward(self, idx, cache=None):
        past = cache[0][1].shape[-2] if cache else 0
        positions = torch.arange(idx.size(1), device=idx.device) + past
        x, caches = self.embed(idx), ()
        for i, block in enumerate(self.blocks):
            x, c = block(x, positions, cache[i] if cache else None)
            caches += (c,)
        return self.head(self.norm(x)), caches


class GPTPositionsFromZero(GPTBase):
    def positions(self, idx, cache):
        return torch.arange(idx.size(1), device=idx.device)


class GPTNoFinalNorm(GPTBase):
    def final(self, x):
        return x


class GPTScaledEmbedding(GPTBase):
    def embedding(self, idx):
        return self.embed(idx) * math.sqrt(self.embed.embedding_dim)


class GPTDetachedEmbedding(GPTBase):
    def embedding(self, idx):
        return self.embed(idx).detach()


class GPTFirstCacheForEveryBlock(GPTBase):
    def forward(self, idx, cache=None):
        x, positions, new_cache = self.embedding(idx), self.positions(idx, cache), []
        for block in self.blocks:
            x, layer_cache = block(x, positions, None if cache is None else cache[0])
            new_cache.append(layer_cache)
        return self.head(self.final(x)), new_cache


class GPTBlocksWithoutTheCache(GPTBase):
    def forward(self, idx, cache=None):
        x, positions, new_cache = self.embedding(idx), self.positions(idx, cache), []
        for block in self.blocks:
            x, layer_cache = block(x, positions)
            new_cache.append(layer_cache)
        return self.head(self.final(x)), new_cache


class GPTPastFromTheHeadsAxis(GPTBase):
    def positions(self, idx, cache):
        past = 0 if cache is None else cache[0][0].shape[1]
        return torch.arange(past, past + idx.size(1), device=idx.device)


class GPTLogitsInFloat32(GPTBase):
    """Meta's LLaMA returns self.output(h).float(): on purpose, for a half-precision model."""

    def forward(self, idx, cache=None):
        logits, new_cache = super().forward(idx, cache)
        return logits.float(), new_cache


@pytest.mark.parametrize("GPT", [R.GPT, GPTBase, GPTTupleCache])
@pytest.mark.parametrize("hidden", [False, True])
def test_gpt_check_passes_correct_variants(GPT, hidden, capsys):
    check_gpt(GPT, hidden=hidden)
    assert "✔ GPT" in capsys.readouterr().out


@pytest.mark.parametrize("GPT, message", [
    (GPTPositionsFromZero, "positions restarting at 0 for cached tokens"),
    (GPTNoFinalNorm, "no final norm"),
    (GPTScaledEmbedding, r"embeddings are scaled by sqrt\(d_model\)"),
    (GPTDetachedEmbedding, "no gradient reaches the parameter embed.weight"),
    (GPTFirstCacheForEveryBlock, "every block is given the first block's cache"),
    (GPTBlocksWithoutTheCache, "the blocks are not given the cache"),
    (GPTPastFromTheHeadsAxis, "the cache's length is read on the wrong axis"),
    (GPTLogitsInFloat32, r"the logits is torch.float32 but the inputs are torch.float64: a .float\(\) on the result"),
])
def test_gpt_check_names_the_mistake(GPT, message):
    with pytest.raises(AssertionError, match=message):
        check_gpt(GPT)


class RMSNormWithoutTheWeight(R.RMSNorm):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def test_a_correct_gpt_gets_full_marks_whatever_its_blocks_and_norm_do(capsys):
    """One mistake costs one exercise: the blocks and the final norm have checks of their own."""
    class GPTWithBadBlocksAndNorm(R.GPT):
        def __init__(self, vocab, d_model, n_heads, n_layers, d_ff, eps=1e-6):
            super().__init__(vocab, d_model, n_heads, n_layers, d_ff, eps)
            self.blocks = nn.ModuleList(BlockMaskBlindToCache(d_model, n_heads, d_ff) for _ in range(n_layers))
            self.norm = RMSNormWithoutTheWeight(d_model)

    check_gpt(GPTWithBadBlocksAndNorm, hidden=True)
    assert "✔ GPT" in capsys.readouterr().out


# ------------------------------------------------------------------------ lm_loss


def loss_from_full_logits(model, idx):
    logits, _ = model(idx)  # causal: the logits before the last are those of idx[:, :-1]
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), idx[:, 1:])


def loss_by_hand(model, idx):
    logits, _ = model(idx[:, :-1])
    return -logits.log_softmax(-1).gather(-1, idx[:, 1:, None]).mean()


def loss_unshifted(model, idx):
    logits, _ = model(idx)
    return F.cross_entropy(logits.flatten(0, 1), idx.flatten())


def loss_copies_its_input(model, idx):
    logits, _ = model(idx[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), idx[:, :-1].flatten())


def loss_shifted_backwards(model, idx):
    logits, _ = model(idx[:, 1:])
    return F.cross_entropy(logits.flatten(0, 1), idx[:, :-1].flatten())


def loss_of_probabilities(model, idx):
    logits, _ = model(idx[:, :-1])
    return F.cross_entropy(F.softmax(logits, dim=-1).flatten(0, 1), idx[:, 1:].flatten())


def loss_nll_of_logits(model, idx):
    logits, _ = model(idx[:, :-1])
    return F.nll_loss(logits.reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1))


def loss_summed(model, idx):
    logits, _ = model(idx[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten(), reduction="sum")


def loss_of_the_last_position(model, idx):
    logits, _ = model(idx[:, :-1])
    return F.cross_entropy(logits[:, -1, :], idx[:, -1])


@pytest.mark.parametrize("lm_loss", [R.lm_loss, loss_from_full_logits, loss_by_hand])
@pytest.mark.parametrize("hidden", [False, True])
def test_lm_loss_check_passes_correct_variants(lm_loss, hidden, capsys):
    check_lm_loss(lm_loss, hidden=hidden)
    assert "✔ lm_loss" in capsys.readouterr().out


@pytest.mark.parametrize("lm_loss, message", [
    (loss_unshifted, "loss not shifted: the model reads idx and is scored on idx itself"),
    (loss_copies_its_input, r"loss not shifted: the labels are idx\[:, :-1\]"),
    (loss_shifted_backwards, "the shift goes the wrong way"),
    (loss_of_probabilities, "the logits went through a softmax before F.cross_entropy"),
    (loss_nll_of_logits, "F.nll_loss was given the raw logits"),
    (loss_summed, "the loss is summed over the predictions, not averaged"),
    (loss_of_the_last_position, "only the last position is scored"),
])
def test_lm_loss_check_names_the_mistake(lm_loss, message):
    with pytest.raises(AssertionError, match=message):
        check_lm_loss(lm_loss)


# ------------------------------------------------------------------------ generate


def probabilities(logits, temperature, top_k, top_p, softmax_dim=-1, renormalise=True, temperature_after=False,
                  kth_dropped=False, crossing_dropped=False, p_before_k=False):
    """Sorted-logits top-k and a top-p mask computed in sorted order, then scattered back."""
    if not temperature_after:
        logits = logits / temperature
    if top_k is not None and renormalise and not p_before_k:
        kth = logits.sort(dim=-1, descending=True).values[:, top_k - 1:top_k]
        logits = torch.where(logits > kth if kth_dropped else logits >= kth, logits, -math.inf)
    probs = F.softmax(logits, dim=softmax_dim)
    if temperature_after:
        probs = probs / temperature
    if top_k is not None and not renormalise:
        probs = torch.where(probs >= probs.topk(top_k, dim=-1).values[:, -1:], probs, 0.0)
    if top_p is not None:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) if crossing_dropped else sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = before >= top_p
        drop_sorted[:, 0] = False
        drop = drop_sorted.gather(-1, order.argsort(-1))
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    if top_k is not None and p_before_k:
        probs = torch.where(probs >= probs.topk(top_k, dim=-1).values[:, -1:], probs, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def make_generate(use_the_cache=True, always_cached=False, position=-1, in_float32=False, seeded=True, **mistake):
    @torch.no_grad()
    def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True, generator=None):
        cache, tokens = None, [idx]
        for _ in range(max_new_tokens):
            seq = torch.cat(tokens, dim=1)
            if (use_cache or always_cached) and use_the_cache:
                logits, cache = model(seq if cache is None else tokens[-1], cache)
            else:
                logits, _ = model(seq)
            last = logits[:, position, :]
            last = last.float() if in_float32 else last
            if temperature == 0:
                tokens.append(last.argmax(-1)[:, None])
            else:
                probs = probabilities(last, temperature, top_k, top_p, **mistake)
                tokens.append(torch.multinomial(probs, num_samples=1, generator=generator if seeded else None))
        return torch.cat(tokens, dim=1)

    return generate


def decoded(model, idx, max_new_tokens, use_cache, pick):
    """The loop the published generates below share; ``pick`` turns the last logits (B, vocab) into (B, 1) tokens."""
    out, cache = idx, None
    for _ in range(max_new_tokens):
        logits, cache = model(out if cache is None or not use_cache else out[:, -1:], cache if use_cache else None)
        out = torch.cat([out, pick(logits[:, -1])], 1)
    return out


@torch.no_grad()
def generate_drawing_in_sorted_order(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                                     use_cache=True, generator=None):
    """Meta's LLaMA's way to draw: over the probabilities sorted in descending order, the index mapped back."""
    def pick(logits):
        if temperature == 0:
            return logits.argmax(-1, keepdim=True)
        probs_sort, probs_idx = torch.sort(probabilities(logits, temperature, top_k, top_p), dim=-1, descending=True)
        return torch.gather(probs_idx, -1, torch.multinomial(probs_sort, 1, generator=generator))

    return decoded(model, idx, max_new_tokens, use_cache, pick)


@torch.no_grad()
def generate_drawing_among_the_top_k(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                                     use_cache=True, generator=None):
    """nanochat's way to draw with top-k: over the k largest alone, the index mapped back."""
    def pick(logits):
        if temperature == 0:
            return logits.argmax(-1, keepdim=True)
        if top_k is None:
            return torch.multinomial(probabilities(logits, temperature, None, top_p), 1, generator=generator)
        values, ids = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1)
        return ids.gather(1, torch.multinomial(F.softmax(values / temperature, dim=-1), 1, generator=generator))

    return decoded(model, idx, max_new_tokens, use_cache, pick)


@torch.no_grad()
def generate_dividing_by_a_zero_temperature(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                                            use_cache=True, generator=None):
    """nanoGPT's loop, which always samples: temperature 0 divides by zero."""
    return decoded(model, idx, max_new_tokens, use_cache, lambda logits: torch.multinomial(
        probabilities(logits, temperature, top_k, top_p), 1, generator=generator))


def generate_one_row_at_a_time(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True,
                               generator=None):
    """The reference's loop, with the draw written as a method call on the probabilities."""
    out, cache = idx, None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits, cache = model(out if cache is None or not use_cache else out[:, -1:], cache if use_cache else None)
            last = logits[:, -1]
            if temperature == 0:
                nxt = last.argmax(-1, keepdim=True)
            else:
                nxt = probabilities(last, temperature, top_k, top_p).multinomial(1, generator=generator)
            out = torch.cat([out, nxt], 1)
    return out


@pytest.mark.parametrize("generate", [R.generate, make_generate(), generate_one_row_at_a_time])
@pytest.mark.parametrize("hidden", [False, True])
def test_generate_check_passes_correct_variants(generate, hidden, capsys):
    check_generate(generate, hidden=hidden)
    assert "✔ generate" in capsys.readouterr().out


@pytest.mark.parametrize("generate, message", [
    (make_generate(softmax_dim=0), "softmax over the wrong axis in sampling"),
    (make_generate(renormalise=False), "top-k applied after softmax without renormalising"),
    (make_generate(temperature_after=True), "temperature applied after softmax"),
    (make_generate(use_the_cache=False), "use_cache=True but the model was given"),
    (make_generate(always_cached=True), r"use_cache=False but the model was given \[3, 1, 1, 1, 1\] tokens"),
    (make_generate(kth_dropped=True), "top-k keeps k - 1 tokens"),
    (make_generate(crossing_dropped=True), "top-p drops the token that crosses top_p"),
    (make_generate(p_before_k=True), "top-p applied before top-k"),
    (make_generate(position=0), "the logits of the first position are used"),
    (make_generate(seeded=False), "torch.multinomial was called 8 times without the generator"),
    (generate_drawing_in_sorted_order, "drawn over the probabilities sorted in descending order"),
    (generate_drawing_among_the_top_k, "drawn over the top k probabilities alone"),
    (generate_dividing_by_a_zero_temperature, "temperature=0 was used as a divisor"),
])
def test_generate_check_names_the_mistake(generate, message):
    with pytest.raises(AssertionError, match=message):
        check_generate(generate)


def test_unwritten_exercise_says_so():
    def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True, generator=None):
        raise NotImplementedError()

    with pytest.raises(AssertionError, match="is not written yet"):
        check_generate(generate)
