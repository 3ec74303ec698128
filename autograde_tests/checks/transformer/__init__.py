"""Checks for chapter 05_transformer: the positional encoding, the two layers, the whole model, the
teacher-forcing loss and greedy decoding.

Every module check loads the reference's (random) weights into the learner's module by name, so no answer
depends on initialisation order. Each exercise is graded on its own where it can be: the Transformer check
compares the numbers with stand-in layers (``stand_in_models``) in place of the learner's EncoderLayer and
DecoderLayer, and the loss and decoding checks drive a stand-in model. Properties (causality, padding,
batch order) and the "can it learn" check run the learner's whole model. Visible checks use one set of shapes and seeds;
the hidden ones nbgrader runs use others.

One module per exercise: ``positional_encoding``, ``layers`` (EncoderLayer and DecoderLayer), ``model``
(Transformer; the mistakes it names are in ``model_mistakes``, its "can it learn" part in ``learning``), ``loss``
(teacher_forcing_loss) and ``greedy_decode``; ``cases`` holds what several of them draw their cases with.
"""

from .greedy_decode import (
    GREEDY_MISTAKES,
    HIDDEN_DECODE,
    VISIBLE_DECODE,
    _greedy,
    check_greedy_decode,
    decode_inputs,
    decoding_model,
)
from .layers import (
    DECODER_MISTAKES,
    ENCODER_MISTAKES,
    HIDDEN_LAYER,
    VISIBLE_LAYER,
    _encoder_arguments,
    _layer_case,
    check_decoder_layer,
    check_encoder_layer,
)
from .learning import LEARN_STEPS
from .loss import HIDDEN_DATA, LOSS_MISTAKES, PAD, VISIBLE_DATA, _loss_case, check_teacher_forcing_loss
from .model import HIDDEN_MODEL, VISIBLE_MODEL, _model_case, _with_stand_in_layers, check_transformer
from .model_mistakes import DECODE_MISTAKES, ENCODE_MISTAKES, FORWARD_MISTAKES
from .positional_encoding import PE_HIDDEN, PE_MISTAKES, PE_VISIBLE, check_positional_encoding
