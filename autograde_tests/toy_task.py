"""Chapter 5's toy task: read a string of digits, write it reversed (or sorted).

Token ids and batches, shared by the checks and the training run. Both sides are padded to the longest
sequence of a batch:

    src = d_1 ... d_n EOS PAD ...          tgt = BOS d_n ... d_1 EOS PAD ...
"""

import torch

PAD, BOS, EOS = 0, 1, 2
FIRST_DIGIT = 3  # digit d is token 3 + d
VOCAB = FIRST_DIGIT + 10


def solve(digits: list[int], task: str) -> list[int]:
    """The answer the model must write for ``digits``."""
    if task == "reverse":
        return digits[::-1]
    if task == "sort":
        return sorted(digits)
    raise ValueError(f"unknown task {task!r}: use 'reverse' or 'sort'")


def random_digits(generator: torch.Generator, count: int, min_len: int, max_len: int) -> list[list[int]]:
    lengths = torch.randint(min_len, max_len + 1, (count,), generator=generator).tolist()
    return [torch.randint(10, (n,), generator=generator).tolist() for n in lengths]


def to_batch(sequences: list[list[int]], task: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Digit lists -> (src (B, S), tgt (B, T)) token ids, padded with PAD."""
    longest = max(len(s) for s in sequences)
    src = torch.full((len(sequences), longest + 1), PAD, dtype=torch.long)
    tgt = torch.full((len(sequences), longest + 2), PAD, dtype=torch.long)
    for b, digits in enumerate(sequences):
        tokens = [FIRST_DIGIT + d for d in digits]
        answer = [FIRST_DIGIT + d for d in solve(digits, task)]
        src[b, : len(tokens) + 1] = torch.tensor(tokens + [EOS])
        tgt[b, : len(answer) + 2] = torch.tensor([BOS] + answer + [EOS])
    return src, tgt


def reversal_batch(generator: torch.Generator, batch: int, min_len: int, max_len: int):
    """(src (B, S), tgt (B, T)) for ``batch`` random strings of ``min_len`` to ``max_len`` digits, reversed."""
    return to_batch(random_digits(generator, batch, min_len, max_len), "reverse")
