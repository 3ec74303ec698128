"""The "can it learn" part of chapter 5's Transformer check: the learner's whole model, trained where it
lives on one fixed batch of reversals, then judged here on strings it was never shown."""

import math

import torch

from ...reference import transformer as ref
from ...remote.proxy import make_in_kernel
from ...toy_task import BOS, PAD, VOCAB, random_digits, to_batch
from .. import stand_in_models
from ..harness import (
    call,
    construct,
    copy_weights,
    expect_tensor,
    fail,
    learner_step,
)
from ..how import kernel_reported
from .model_mistakes import MODEL_HINT

# The "can it learn" check: trained on one fixed batch of reversals, the model must then reverse strings it
# was never shown. They are drawn after training and only their digits are sent: the grader decodes them
# greedily itself, token by token, so no answer it judges ever reaches the learner's kernel before it is judged.
LEARN_BATCH, LEARN_LENGTHS, LEARN_STEPS, LEARN_LOSS, LEARN_LR = 64, (2, 4), 120, 0.05, 3e-3
LEARN_CALL = 10  # steps a call: each call is one request to a graded kernel, well within a cell's time
FRESH, FRESH_RIGHT = 64, 16  # the reference reverses about 30 of 64 after its 50-odd steps; untrained, none


def _expect_it_learns(name, Transformer, seed: int, norm_first: bool) -> None:
    """Train the learner's whole model (reference initial weights) on one fixed batch, where it lives, then
    judge here how many fresh strings it reverses."""
    forked = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=forked):
        torch.manual_seed(seed)
        reference = ref.Transformer(VOCAB, VOCAB, 32, 4, 2, 64, norm_first=norm_first)
        model = construct(name, Transformer, VOCAB, VOCAB, 32, 4, 2, 64, norm_first=norm_first)
        copy_weights(name, model, reference, MODEL_HINT)
        rng = torch.Generator().manual_seed(seed)
        trained = random_digits(rng, LEARN_BATCH, *LEARN_LENGTHS)
        src, tgt = to_batch(trained, "reverse")
        run = _train(name, model, src, tgt)
        losses = run.get("losses") if isinstance(run, dict) else None
        if not (isinstance(losses, list) and losses and all(isinstance(x, float) for x in losses)):
            losses = [math.nan]
        _note_the_training_run(name, model, run, losses)
        fresh = _fresh_strings(rng, {tuple(digits) for digits in trained})
        right = _reversed_correctly(name, model.eval(), *to_batch(fresh, "reverse"))
    if right < FRESH_RIGHT:
        fail(name,
             f"cannot learn: trained on one fixed batch of {LEARN_BATCH} reversals (up to {LEARN_STEPS} Adam steps, "
             f"the loss went from {losses[0]:.3f} to {losses[-1]:.3f}), it then reversed {right} of {FRESH} strings it "
             f"was never shown, and {FRESH_RIGHT} are needed (the reference, trained the same way, reverses about 30)",
             "the numbers matched the reference with stand-in layers, so look at your own EncoderLayer and "
             "DecoderLayer, and at anything that stops gradients (.detach(), torch.no_grad, .item()).")


def _train(name, model, src: torch.Tensor, tgt: torch.Tensor):
    """Train ``model`` where it lives, ``LEARN_CALL`` steps a call: the training run's last report."""
    inputs, labels = tgt[:, :-1], tgt[:, 1:]
    training = make_in_kernel(model, stand_in_models.Training, model, src, inputs, labels, PAD, LEARN_LR)
    for _ in range(0, LEARN_STEPS, LEARN_CALL):
        run = learner_step(name, lambda: training.run(LEARN_CALL, LEARN_LOSS), (src, tgt))
        if not isinstance(run, dict) or run.get("done") is not False:
            return run
    return run


def _note_the_training_run(name, model, run, losses: list[float]) -> None:
    """What the training run in the kernel reported about itself (``kernel_reported``)."""
    unused = run.get("unused") if isinstance(run, dict) else None
    if unused:
        kernel_reported(name, model,
                        f"the parameters {', '.join(map(str, unused[:4]))} get no gradient: forward never uses them",
                        "every submodule the notebook names must take part in forward (and nothing be detached).")
    if not math.isfinite(losses[-1]):
        kernel_reported(name, model,
                        f"training on a fixed batch, the loss became {losses[-1]} at step {len(losses) - 1}")


def _fresh_strings(rng: torch.Generator, trained: set[tuple[int, ...]]) -> list[list[int]]:
    """``FRESH`` strings of digits, none of them among those the model was trained on."""
    fresh: list[list[int]] = []
    while len(fresh) < FRESH:
        drawn = random_digits(rng, FRESH, *LEARN_LENGTHS)
        fresh += [d for d in drawn if tuple(d) not in trained][: FRESH - len(fresh)]
    return fresh


def _reversed_correctly(name, model, src: torch.Tensor, tgt: torch.Tensor) -> int:
    """How many of ``src`` the model reverses, each written up to its EOS, decoding greedily here: the model
    is given the source and its own tokens so far, never the answer."""
    written = torch.full((src.size(0), 1), BOS, dtype=torch.long)
    with torch.no_grad():
        for _ in range(tgt.size(1) - 1):
            logits = call(name, model, src, written, src != PAD, written != PAD)
            expect_tensor(name, "the logits", logits, (*written.shape, VOCAB), like=torch.empty(0))
            written = torch.cat([written, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    real = tgt != PAD
    return sum(bool(torch.equal(written[b][real[b]], tgt[b][real[b]])) for b in range(src.size(0)))
