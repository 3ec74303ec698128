"""What several of chapter 5's checks draw their cases with: padding masks (the layers, the model and
decoding), inputs moved to the device and dtype under test (the layers and the model), and the stand-in model
that the loss and decoding checks drive."""

import torch
from torch import nn

from ...reference.attention_variants import padding_mask
from .. import stand_in_models
from ..harness import SeededRandom, randomise


def _padding_mask(rng: SeededRandom, batch: int, length: int) -> torch.Tensor:
    """A (batch, length) padding mask of lengths in 1 .. length, the first one full: padding happens and no
    sequence is empty."""
    lengths = torch.randint(1, length + 1, (batch,), generator=rng.generator)
    lengths[0] = length
    return padding_mask(lengths, length)


def _to(tensors, device, dtype=None):
    """Move a tuple of tensors (or None) to ``device``; floating ones also to ``dtype``."""
    return tuple(
        None if t is None else t.to(device, dtype if dtype is not None and t.is_floating_point() else t.dtype)
        for t in tensors
    )


def _stand_in_model(vocab: int, d_model: int, seed: int) -> nn.Module:
    """A float64 stand-in model with random weights (its weights are what crosses to the learner's side)."""
    model = randomise(stand_in_models.StandInModel(vocab, d_model).double(), SeededRandom(seed))
    return stand_in_models.stand_in_model(model.state_dict())
