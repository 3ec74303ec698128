"""What the mistakes tests (``test_0N_*_mistakes.py``) share: whether a mistake's result shows on a case."""

import torch


def differs(got: torch.Tensor, want: torch.Tensor) -> bool:
    """``got`` is another result than ``want``: another shape, or other numbers beyond float64's rounding."""
    return got.shape != want.shape or not torch.allclose(got, want, atol=1e-9)


def shows(got, want: torch.Tensor) -> bool:
    """A result a learner's code could return (a finite tensor) that differs from the reference's."""
    return isinstance(got, torch.Tensor) and bool(torch.isfinite(got).all()) and differs(got, want)
