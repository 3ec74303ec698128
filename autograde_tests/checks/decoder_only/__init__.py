"""Checks for chapter 06_decoder_only: RMSNorm, RoPE, the decoder block with its KV cache, the model, the
language-model loss and sampling, and loading a checkpoint in Hugging Face's and in Meta's layout.

One module per exercise, each with its cases, its catalogued mistakes (listed in its docstring; the tests hold
one buggy implementation per entry) and its check:

    rms_norm    check_rms_norm
    rotary      check_apply_rotary
    block       check_decoder_block
    gpt         check_gpt
    loss        check_lm_loss
    generate    check_generate
    loading     check_load_hf_llama, check_load_meta_llama (they share most of their helpers)

and ``models``, what more than one of them builds: the options the block's and the model's cases pass, the
learner's modules built with their submodules recorded, PyTorch's RMSNorm and the stand-in language model.

Module checks load the reference's random weights by name. Each exercise is graded on its own where it can
be: the block check lends PyTorch's RMSNorm as the block's norms and the course's RoPE as the
``apply_rotary`` its code calls; the GPT check runs every case with stand-in blocks (``stand_in_models``) and
PyTorch's RMSNorm in place of the learner's; the loss and sampling checks drive a stand-in model; the loaders
load into a stand-in with a GPT's parameters (``stand_in_models.load_target``), whose weights the check reads
back and judges by a reference GPT's logits. Sampling is reproducible because the exercise fixes how a token
is drawn: ``torch.multinomial(probs, 1, generator=generator)`` on the final probabilities.
"""

# The checks (``autograde_tests.checks`` reads them from here), then what the tests import from this package:
# each exercise's cases, mistakes and inputs, a helper the block and the GPT share, and the mistake generators a
# graded kernel must not reach.
from ...reference import decoder_only as ref
from ..harness import edited
from .block import BLOCK_MISTAKES, HIDDEN_BLOCK, VISIBLE_BLOCK, _block, _block_inputs, check_decoder_block
from .generate import (
    HIDDEN_SAMPLE,
    SAMPLE_MISTAKES,
    VISIBLE_SAMPLE,
    _options,
    _sample,
    _sample_inputs,
    check_generate,
)
from .gpt import GPT_MISTAKES, HIDDEN_MODEL, VISIBLE_MODEL, _gpt, _model_inputs, check_gpt
from .loading import (
    HF_MISTAKES,
    HF_NAMES,
    HIDDEN_LOAD,
    META_MISTAKES,
    META_NAMES,
    VISIBLE_LOAD,
    _load_inputs,
    _loading,
    _reordered,
    check_load_hf_llama,
    check_load_meta_llama,
)
from .loss import HIDDEN_LOSS, LOSS_MISTAKES, VISIBLE_LOSS, _loss_inputs, check_lm_loss
from .models import _expect_built
from .rms_norm import HIDDEN_NORM, NORM_MISTAKES, VISIBLE_NORM, _norm_inputs, check_rms_norm
from .rotary import HIDDEN_ROTARY, ROTARY_MISTAKES, VISIBLE_ROTARY, _rotary_inputs, check_apply_rotary
