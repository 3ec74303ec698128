"""Chapter 5's check of ``positional_encoding(max_len, d_model)``: the sinusoidal encoding, compared in
float64 with the reference, and the mistakes that it names."""

import torch

from ...reference import transformer as ref
from ..harness import (
    Mistake,
    call,
    candidates,
    close,
    default_dtype,
    edited,
    expect_tensor,
    fail,
    name_the_mistake,
    one_thread,
    run_cases,
    strict_numerics,
)

PE_VISIBLE = [(10, 8), (6, 4), (50, 16)]
PE_HIDDEN = [(20, 12), (3, 2), (64, 32), (1, 6), (33, 10)]
PE_HINT = "PE[pos, 2i] = sin(pos / 10000^(2i / d_model)) and PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model))."


def _encoding(*changes: tuple[str, str]):
    """The reference's positional_encoding with ``changes`` made to its source (``edited``), in float64: a
    mistake."""
    encoding = edited(ref.positional_encoding, *changes)

    def compute(max_len: int, d_model: int) -> torch.Tensor:
        with default_dtype(torch.float64):
            return encoding(max_len, d_model)

    return compute


SINES, COSINES = "pe[:, 0::2] = torch.sin(angle)", "pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])"
PE_MISTAKES = [
    Mistake("sin and cos are swapped: the even features should be sines and the odd ones cosines",
            PE_HINT,
            _encoding((SINES, "pe[:, 0::2] = torch.cos(angle)"),
                      (COSINES, "pe[:, 1::2] = torch.sin(angle[:, : d_model // 2])"))),
    Mistake("the exponent uses the feature index k instead of the pair index 2i = k - k % 2: the sine and the "
            "cosine of a pair should share one frequency",
            "compute one frequency per pair, from torch.arange(0, d_model, 2), and use it for both features.",
            _encoding(("torch.arange(0, d_model, 2, dtype=torch.float64)",
                       "torch.arange(d_model, dtype=torch.float64)"),
                      (SINES, "pe[:, 0::2] = torch.sin(angle[:, 0::2])"),
                      (COSINES, "pe[:, 1::2] = torch.cos(angle[:, 1::2])"))),
    Mistake("the sines fill the first half of the features and the cosines the second half; they should alternate",
            "assign pe[:, 0::2] = sin(...) and pe[:, 1::2] = cos(...).",
            _encoding((SINES, "pe[:, : angle.size(1)] = torch.sin(angle)"),
                      (COSINES, "pe[:, angle.size(1) :] = torch.cos(angle[:, : d_model // 2])"))),
]


def check_positional_encoding(positional_encoding, hidden: bool = False) -> None:
    """Check a learner's ``positional_encoding(max_len, d_model) -> (max_len, d_model)``."""
    name = "positional_encoding"

    def check_case(_: int, case: tuple[int, int], device, dtype) -> None:
        max_len, d_model = case
        with default_dtype(torch.float64):
            expected = ref.positional_encoding(max_len, d_model)
        with default_dtype(dtype):
            out = call(name, positional_encoding, max_len, d_model)
        if isinstance(out, torch.Tensor) and tuple(out.shape) == (d_model, max_len) and d_model != max_len:
            fail(name, f"the output has shape {tuple(out.shape)}: (d_model, max_len) instead of (max_len, d_model)")
        if isinstance(out, torch.Tensor) and out.dtype != dtype and out.is_floating_point():
            fail(name, f"returns {out.dtype} when the default dtype is {dtype}",
                 "make the tensors without a fixed dtype (torch.zeros(max_len, d_model), torch.arange(max_len) "
                 "turned float by arithmetic) so that the result follows torch.get_default_dtype(): the model "
                 "check runs in float64 too.")
        expect_tensor(name, "the output", out, expected.shape, like=torch.empty(0, dtype=dtype, device=device))
        if not close(out, expected):
            name_the_mistake(name, "the encoding", out, expected, candidates(PE_MISTAKES, max_len, d_model))

    with strict_numerics(), one_thread():  # the encoding takes no device: it is made on the CPU alone
        run_cases(name, PE_HIDDEN if hidden else PE_VISIBLE, check_case, cpu_only=True)
