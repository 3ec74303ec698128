"""The chapter-1 checks pass every correct way of writing the code and name every known mistake.

Each buggy variant is one of the chapter's plausible mistakes (or a near relative), written the way a learner
would write it; each test asserts the message that names it.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from autograde_tests.checks import check_scaled_dot_product_attention, check_softmax
from autograde_tests.checks.attention import VISIBLE_ATTENTION
from autograde_tests.reference import scaled_dot_product_attention as reference_attention
from autograde_tests.reference import softmax as reference_softmax

from .conftest import fails

pytestmark = pytest.mark.usefixtures("learner_side")  # each test in-process and through the wire

# ------------------------------------------------------------------------------ softmax: correct


def softmax_amax(x, dim=-1):
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)


def softmax_logsumexp(x, dim=-1):
    return torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True))


def softmax_inplace_on_a_copy(x, dim=-1):
    y = x.clone()
    y -= y.max(dim, keepdim=True).values
    y.exp_()
    y /= y.sum(dim, keepdim=True)
    return y


@pytest.mark.parametrize("softmax", [softmax_amax, softmax_logsumexp, softmax_inplace_on_a_copy])
@pytest.mark.parametrize("hidden", [False, True])
def test_softmax_check_passes_correct_variants(softmax, hidden, capsys):
    check_softmax(softmax, hidden=hidden)
    assert "✔ softmax" in capsys.readouterr().out


# ------------------------------------------------------------------------------ softmax: mistakes


def softmax_builtin(x, dim=-1):
    return torch.softmax(x, dim=dim)


def softmax_builtin_by_another_name(x, dim=-1):
    normalise = F.softmax
    return normalise(x, dim)


def softmax_via_log_softmax(x, dim=-1):
    return F.log_softmax(x, dim=dim).exp()


def softmax_without_max_shift(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def softmax_ignoring_dim(x, dim=-1):
    return softmax_amax(x, dim=-1)


def softmax_modifying_input(x, dim=-1):
    x -= x.amax(dim=dim, keepdim=True)
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def softmax_without_keepdim(x, dim=-1):
    e = torch.exp(x - x.amax(dim=dim))
    return e / e.sum(dim=dim)


def softmax_fixed_dtype(x, dim=-1):
    return softmax_amax(x, dim).float()


def softmax_fixed_device(x, dim=-1):
    out = torch.empty(x.shape, dtype=x.dtype)  # forgot device=x.device
    out[:] = softmax_amax(x, dim)
    return out


def softmax_returning_numpy(x, dim=-1):
    return softmax_amax(x, dim).numpy()


@pytest.mark.parametrize(
    "softmax, message",
    [
        (softmax_builtin, r"calls a built-in softmax"),
        (softmax_builtin_by_another_name, r"calls a built-in softmax"),
        (softmax_via_log_softmax, r"calls a built-in softmax .*log_softmax"),
        (softmax_without_max_shift, r"inf or NaN .* exp overflows"),
        (softmax_ignoring_dim, r"normalises over dim 2 when called with dim=1"),
        (softmax_modifying_input, r"modified its input `x` in place"),
        (softmax_without_keepdim, r"raised RuntimeError"),
        (softmax_fixed_dtype, r"torch.float32 but the inputs are torch.float64"),
        (softmax_fixed_device, r"fixed device"),
        (softmax_returning_numpy, r"should be a torch.Tensor, got ndarray"),
    ],
)
def test_softmax_check_names_the_mistake(softmax, message):
    with fails(message, exercise="softmax"):
        check_softmax(softmax)


def test_softmax_check_never_prints_a_pass_for_wrong_code(capsys):
    with fails():
        check_softmax(softmax_without_max_shift)
    assert "✔" not in capsys.readouterr().out


# -------------------------------------------------------------------- attention: correct variants


def attention_matmul_minus_inf(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = reference_softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v, weights


def attention_einsum_large_negative(q, k, v, mask=None):
    scores = torch.einsum("...md,...nd->...mn", q * q.size(-1) ** -0.5, k)
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    weights = softmax_logsumexp(scores)
    if mask is not None:
        weights = weights * mask  # a fully masked row came out uniform; zero it
    return torch.einsum("...mn,...nv->...mv", weights, v), weights


def attention_where_nan_to_num(q, k, v, mask=None):
    scores = (q / math.sqrt(q.shape[-1])) @ k.mT
    if mask is not None:
        scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
        weights = softmax_inplace_on_a_copy(scores) * mask.any(dim=-1, keepdim=True)
    else:
        weights = softmax_inplace_on_a_copy(scores)
    return torch.matmul(weights, v), weights


CORRECT_ATTENTION = [attention_matmul_minus_inf, attention_einsum_large_negative, attention_where_nan_to_num]


@pytest.mark.parametrize("attention", CORRECT_ATTENTION)
@pytest.mark.parametrize("hidden", [False, True])
def test_attention_check_passes_correct_variants(attention, hidden, capsys):
    check_scaled_dot_product_attention(attention, hidden=hidden)
    assert "✔ scaled_dot_product_attention" in capsys.readouterr().out


def test_attention_check_passes_code_that_reads_values_which_meta_tensors_lack():
    def skips_an_all_true_mask(q, k, v, mask=None):
        if mask is not None and mask.all().item():
            mask = None
        return attention_matmul_minus_inf(q, k, v, mask)

    check_scaled_dot_product_attention(skips_an_all_true_mask, hidden=True)


def test_attention_check_passes_the_reference():
    check_scaled_dot_product_attention(reference_attention, hidden=True)


# -------------------------------------------------------------------------- attention: mistakes


def attention_without_scale(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = reference_softmax(scores).nan_to_num(0.0)
    return weights @ v, weights


def attention_scaled_by_d_v(q, k, v, mask=None):
    return attention_matmul_minus_inf(q * math.sqrt(q.size(-1) / v.size(-1)), k, v, mask)


def attention_softmax_over_queries(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = reference_softmax(scores, dim=-2).nan_to_num(0.0)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v, weights


def attention_mask_inverted(q, k, v, mask=None):
    return attention_matmul_minus_inf(q, k, v, None if mask is None else ~mask)


def attention_masked_with_zero(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, 0.0)
    weights = reference_softmax(scores)
    return weights @ v, weights


def attention_nan_for_empty_rows(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = reference_softmax(scores)
    return weights @ v, weights


def attention_returns_weights_before_masking(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    raw = reference_softmax(scores)
    output, _ = attention_matmul_minus_inf(q, k, v, mask)
    return output, raw


def attention_output_from_unmasked_weights(q, k, v, mask=None):
    raw = reference_softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)))
    _, weights = attention_matmul_minus_inf(q, k, v, mask)
    return raw @ v, weights


def attention_calls_torch_softmax(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v, weights


def attention_calls_sdpa(q, k, v, mask=None):
    _, weights = attention_matmul_minus_inf(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), weights


def attention_default_mask_on_cpu(q, k, v, mask=None):
    if mask is None:
        mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool)  # forgot device=q.device
    return attention_matmul_minus_inf(q, k, v, mask)


def attention_output_buffer_in_float32(q, k, v, mask=None):
    output, weights = attention_matmul_minus_inf(q, k, v, mask)
    buffer = torch.zeros(output.shape, device=q.device)  # forgot dtype=q.dtype
    buffer += output
    return buffer, weights


def attention_modifies_q(q, k, v, mask=None):
    q /= math.sqrt(q.size(-1))
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = reference_softmax(scores).nan_to_num(0.0)
    return weights @ v, weights


def attention_returns_output_only(q, k, v, mask=None):
    return attention_matmul_minus_inf(q, k, v, mask)[0]


@pytest.mark.parametrize(
    "attention, message",
    [
        (attention_without_scale, r"without the 1/sqrt\(d_k\) scale"),
        (attention_scaled_by_d_v, r"scaled by sqrt\(d_v\)"),
        (attention_softmax_over_queries, r"softmax over the wrong axis"),
        (attention_mask_inverted, r"mask polarity inverted"),
        (attention_masked_with_zero, r"set to 0 instead of -inf"),
        (attention_nan_for_empty_rows, r"NaN for a query whose keys are all masked"),
        (attention_returns_weights_before_masking, r"mask is ignored: .*weights returned before masking"),
        (attention_output_from_unmasked_weights, r"mask is ignored: .*output computed from unmasked weights"),
        (attention_calls_torch_softmax, r"calls a built-in softmax"),
        (attention_calls_sdpa, r"calls F.scaled_dot_product_attention"),
        (attention_default_mask_on_cpu, r"fixed device"),
        (attention_output_buffer_in_float32, r"output is torch.float32 but the inputs are torch.float64"),
        (attention_modifies_q, r"modified its input `q` in place"),
        (attention_returns_output_only, r"should return a tuple \(output, weights\)"),
    ],
)

def test_attention_check_names_the_mistake(attention, message):
    with fails(message):
        check_scaled_dot_product_attention(attention)
    with fails(message):
        check_scaled_dot_product_attention(attention, hidden=True)


def test_hidden_attention_check_fails_an_answer_fitted_to_the_visible_example():
    visible_shapes = {(*case.batch, case.m, case.d_k) for case in VISIBLE_ATTENTION}

    def fitted(q, k, v, mask=None):
        if tuple(q.shape) in visible_shapes:
            return reference_attention(q, k, v, mask)
        return torch.zeros(*q.shape[:-1], v.size(-1)), torch.zeros(*q.shape[:-1], k.size(-2))

    check_scaled_dot_product_attention(fitted)
    with fails():
        check_scaled_dot_product_attention(fitted, hidden=True)


def test_unrecognised_wrong_attention_shows_the_largest_error_and_where():
    def off_by_a_bit(q, k, v, mask=None):
        output, weights = reference_attention(q, k, v, mask)
        return output + 0.01, weights

    with fails(r"the output and the reference differ:\n  largest error 0.01 at index \("):
        check_scaled_dot_product_attention(off_by_a_bit)


# ------------------------------------------------------------------- deviations seen in real code


def attention_filling_minus_1e9(q, k, v, mask=None):
    """The most common choice in public code: a large negative number, and no zeroing afterwards."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    weights = softmax_amax(scores)
    return weights @ v, weights


def attention_in_float32(q, k, v, mask=None):
    out, weights = reference_attention(q.float(), k.float(), v.float(), mask)
    return out.to(q.dtype), weights.to(q.dtype)


def test_a_large_negative_fill_is_named_with_the_course_s_convention():
    with fails(r"^a query whose keys are all masked gets uniform weights instead of zeros: the scores were filled "
               r"with a large negative number",
               hint=r"F\.scaled_dot_product_attention's in torch 2\.13, is zero weights and a zero output",
               exercise="scaled_dot_product_attention"):
        check_scaled_dot_product_attention(attention_filling_minus_1e9)


def test_a_result_right_to_float32_only_is_named_as_a_precision_mistake():
    with fails(r"^float32 precision only in the weights: it agrees with the reference only as far as float32's "
               r"rounding goes, not to float64's 1e-11 \(largest error \d", hint=r"^compute in the dtype you return",
               exercise="scaled_dot_product_attention"):
        check_scaled_dot_product_attention(attention_in_float32)


def attention_with_an_eps_in_the_normaliser(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    e = torch.exp(scores - scores.amax(-1, keepdim=True)).nan_to_num(0.0)
    weights = e / (e.sum(-1, keepdim=True) + 5e-9)
    return weights @ v, weights


def test_a_difference_smaller_than_float32_s_rounding_is_not_called_float32_precision():
    with fails(r"differ by a little, but more than float64's rounding and less than float32's \(largest error "
               r"[0-9.e-]+ of the largest value", hint="an eps added") as failure:
        check_scaled_dot_product_attention(attention_with_an_eps_in_the_normaliser)
    assert "float32 precision" not in failure.value.problem + failure.value.hint
