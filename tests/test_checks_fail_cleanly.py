"""Every check fails a wrong answer with its own message, never with an exception from inside the check.

Each wrong answer is the reference, off by a little (outputs scaled by 1.01, a mask bit flipped, a token
changed), sometimes only when a padding mask is given, so that the check meets a wrong number no known
mistake explains, on every case shape (B != T != n) and in both the visible and hidden runs.
"""

import pytest
import torch

import autograde_tests.reference as R
from autograde_tests.checks import (  # noqa: F401  (looked up by name, so the learner_side fixture can wrap them)
    check_apply_rotary,
    check_causal_mask,
    check_causal_self_attention,
    check_cross_attention,
    check_decoder_block,
    check_decoder_layer,
    check_encoder_layer,
    check_ffn_as_conv1d,
    check_generate,
    check_gpt,
    check_greedy_decode,
    check_layer_norm,
    check_lm_loss,
    check_load_hf_llama,
    check_load_meta_llama,
    check_merge_heads,
    check_multi_head_attention,
    check_padding_mask,
    check_positional_encoding,
    check_positionwise_feed_forward,
    check_rms_norm,
    check_scaled_dot_product_attention,
    check_self_attention,
    check_softmax,
    check_split_heads,
    check_sublayer_connection,
    check_teacher_forcing_loss,
    check_transformer,
)
from autograde_tests.checks.harness import WIDTH, shown

from .conftest import fails

pytestmark = pytest.mark.usefixtures("learner_side")  # each test in-process and through the wire


def off(result):
    """A result a little wrong: floating tensors scaled by 1.01, in tuples too."""
    if isinstance(result, tuple):
        return tuple(off(r) for r in result)
    return result * 1.01 if isinstance(result, torch.Tensor) and result.is_floating_point() else result


def wrong_function(fn):
    def wrong(*args, **kwargs):
        return off(fn(*args, **kwargs))
    return wrong


def wrong_module(cls, masked_only: bool = False):
    """``cls`` whose forward is off by a little (only when it is given a mask, with ``masked_only``)."""
    class Wrong(cls):
        def forward(self, *args, **kwargs):
            result = super().forward(*args, **kwargs)
            masked = any(isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in (*args, *kwargs.values()))
            return off(result) if masked or not masked_only else result
    Wrong.__name__ = Wrong.__qualname__ = f"Wrong{cls.__name__}"
    return Wrong


def flipped_mask(fn):
    def wrong(*args, **kwargs):
        mask = fn(*args, **kwargs).clone()
        mask.view(-1)[-1] = ~mask.view(-1)[-1]
        return mask
    return wrong


def wrong_conv(ffn):
    conv = R.ffn_as_conv1d(ffn)
    conv.__class__ = wrong_module(type(conv))
    return conv


def another_last_token(*args, **kwargs):
    out = R.greedy_decode(*args, **kwargs).clone()
    out[:, -1] = (out[:, -1] + 1) % 13
    return out


def another_last_sample(model, idx, *args, **kwargs):
    out = R.generate(model, idx, *args, **kwargs).clone()
    out[:, -1] = (out[:, -1] + 1) % 9  # every sampling case has a vocabulary of at least 9
    return out


def loaded_off(load):
    """A loader that loads, then scales the final norm's weight by 1.01."""
    def wrong(model, checkpoint):
        load(model, checkpoint)
        with torch.no_grad():
            model.norm.weight.mul_(1.01)
        return model
    return wrong


WRONG = {
    "check_softmax": wrong_function(R.softmax),
    "check_scaled_dot_product_attention": wrong_function(R.scaled_dot_product_attention),
    "check_split_heads": wrong_function(R.split_heads),
    "check_merge_heads": wrong_function(R.merge_heads),
    "check_multi_head_attention": wrong_module(R.MultiHeadAttention, masked_only=True),
    "check_causal_mask": flipped_mask(R.causal_mask),
    "check_padding_mask": flipped_mask(R.padding_mask),
    "check_self_attention": wrong_module(R.SelfAttention, masked_only=True),
    "check_causal_self_attention": wrong_module(R.CausalSelfAttention, masked_only=True),
    "check_cross_attention": wrong_module(R.CrossAttention, masked_only=True),
    "check_positionwise_feed_forward": wrong_module(R.PositionwiseFeedForward),
    "check_ffn_as_conv1d": wrong_conv,
    "check_layer_norm": wrong_module(R.LayerNorm),
    "check_sublayer_connection": wrong_module(R.SublayerConnection),
    "check_positional_encoding": wrong_function(R.positional_encoding),
    "check_encoder_layer": wrong_module(R.EncoderLayer, masked_only=True),
    "check_decoder_layer": wrong_module(R.DecoderLayer, masked_only=True),
    "check_transformer": wrong_module(R.Transformer),
    "check_teacher_forcing_loss": wrong_function(R.teacher_forcing_loss),
    "check_greedy_decode": another_last_token,
    "check_rms_norm": wrong_module(R.RMSNorm),
    "check_apply_rotary": wrong_function(R.apply_rotary),
    "check_decoder_block": wrong_module(R.DecoderBlock),
    "check_gpt": wrong_module(R.GPT),
    "check_lm_loss": wrong_function(R.lm_loss),
    "check_generate": another_last_sample,
    "check_load_hf_llama": loaded_off(R.load_hf_llama),
    "check_load_meta_llama": loaded_off(R.load_meta_llama),
}


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
@pytest.mark.parametrize("check_name", WRONG)
def test_a_wrong_answer_fails_with_the_check_s_own_short_message(check_name, hidden):
    with fails() as failure:
        globals()[check_name](WRONG[check_name], hidden=hidden)
    assert failure.value.exercise and failure.value.problem, failure.value
    message = failure.value.render()  # its length and its lines as a learner reads them
    assert len(message) < 1200, message
    # As a notebook shows it: no line wider than the output area holds, so JupyterLab breaks no word.
    assert all(len(line) <= WIDTH for line in shown(f"AssertionError: {message}")), shown(f"AssertionError: {message}")


def test_a_wrong_causal_self_attention_with_b_t_and_n_all_different_fails_cleanly():
    """The reported crash: a padded case whose batch size differs from its length reached a mistake
    candidate that combined (T, T) and (B, T) masks."""
    with fails(exercise="CausalSelfAttention"):
        check_causal_self_attention(WRONG["check_causal_self_attention"], hidden=True)
