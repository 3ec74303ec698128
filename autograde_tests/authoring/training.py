"""Train the course's Transformer on a toy sequence-to-sequence task, and record what it learned.

The task (``toy_task``), generated in code: read a string of 1 to 10 digits and write it reversed (or
sorted).

Run it from the repository's root (``make train`` runs both placements and writes the book's cached run):

    python -m autograde_tests.authoring.training                       # Post-LN, about three minutes on one CPU core
    python -m autograde_tests.authoring.training --norm-first          # the same model with Pre-LN
    python -m autograde_tests.authoring.training --steps 300 --out /tmp/run.json
    # the paper's recipe:
    python -m autograde_tests.authoring.training --schedule paper --label-smoothing 0.1 --dropout 0.1

Seeded and reproducible on one machine; it runs on a GPU unchanged when PyTorch sees one.
"""

import argparse
import json
import math
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from ..reference import Transformer, greedy_decode, teacher_forcing_loss
from ..toy_task import BOS, EOS, FIRST_DIGIT, PAD, VOCAB, random_digits, solve, to_batch

LOSS_EVERY = 10  # the record keeps the mean loss of each window of this many steps


@dataclass
class Config:
    task: str = "reverse"  # or "sort"
    min_len: int = 1
    max_len: int = 10  # digits per sequence
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 128
    dropout: float = 0.0
    norm_first: bool = False  # False: Post-LN (the paper); True: Pre-LN
    batch_size: int = 64
    steps: int = 1600
    lr: float = 1e-3  # the peak learning rate of the cosine schedule (the paper's schedule sets its own)
    warmup: int = 200  # warm-up steps of either schedule: Post-LN needs the warm-up
    schedule: str = "cosine"  # or "paper": warm-up, then decay with the inverse square root of the step
    label_smoothing: float = 0.0  # the paper trains with 0.1
    eval_size: int = 1000  # held-out sequences, never trained on
    eval_every: int = 100
    seed: int = 0
    device: str = "auto"  # "auto": CUDA when available, else the CPU


# ------------------------------------------------------------------------------------------ the data


def held_out_set(config: Config) -> list[list[int]]:
    """The evaluation sequences: drawn from their own seed, distinct, and excluded from training."""
    generator = torch.Generator().manual_seed(config.seed + 1)
    seen, held_out = set(), []
    while len(held_out) < config.eval_size:
        for digits in random_digits(generator, config.eval_size, config.min_len, config.max_len):
            if tuple(digits) not in seen and len(held_out) < config.eval_size:
                seen.add(tuple(digits))
                held_out.append(digits)
    return held_out


def training_batches(config: Config, held_out: list[list[int]]):
    """An endless stream of random training batches that never contain a held-out sequence."""
    generator = torch.Generator().manual_seed(config.seed + 2)
    excluded = {tuple(d) for d in held_out}
    while True:
        batch = []
        while len(batch) < config.batch_size:
            drawn = random_digits(generator, config.batch_size, config.min_len, config.max_len)
            batch += [d for d in drawn if tuple(d) not in excluded]
        yield to_batch(batch[: config.batch_size], config.task)


def tokens_to_text(tokens: list[int]) -> str:
    """'3 1 4' for digit tokens; BOS, EOS and PAD are dropped, decoding stops at the first EOS."""
    digits = []
    for token in tokens:
        if token == EOS:
            break
        if token >= FIRST_DIGIT:
            digits.append(str(token - FIRST_DIGIT))
    return " ".join(digits)


# ------------------------------------------------------------------------------------------ measuring


@torch.no_grad()
def exact_match(model: Transformer, sequences: list[list[int]], task: str, device, batch_size: int = 250) -> float:
    """The share of ``sequences`` whose greedy decoding is exactly the answer, EOS included."""
    model.eval()
    correct = 0
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        src, tgt = (t.to(device) for t in to_batch(chunk, task))
        out = greedy_decode(model, src, tgt.size(1), BOS, EOS, src != PAD)  # (B, <= T)
        out = nn.functional.pad(out, (0, tgt.size(1) - out.size(1)), value=EOS)
        # EOS-padding after the end is what greedy_decode writes; compare up to the target's EOS.
        expected = torch.where(tgt == PAD, EOS, tgt)
        correct += int((out == expected).all(dim=1).sum())
    return correct / len(sequences)


@torch.no_grad()
def cross_attention(model: Transformer, digits: list[int], task: str, device) -> list[list[list[list[float]]]]:
    """The cross-attention weights of every decoder layer for one teacher-forced example.

    Returns [layer][head][target position][source position], the decoder reading BOS + answer and the
    source being the digits + EOS. Read with forward hooks: the reference model is not changed for this.
    """
    model.eval()
    src, tgt = (t.to(device) for t in to_batch([digits], task))
    maps = []
    hooks = [
        layer.cross_attn.register_forward_hook(lambda module, args, out: maps.append(out[1][0]))
        for layer in model.decoder_layers
    ]
    try:
        model(src, tgt[:, :-1])
    finally:
        for hook in hooks:
            hook.remove()
    return [[[[round(w, 3) for w in row] for row in head.tolist()] for head in layer] for layer in maps]


@torch.no_grad()
def decoding_steps(model: Transformer, digits: list[int], task: str, device, top: int = 3) -> list[dict]:
    """Greedy decoding of one example, step by step: the prefix so far and the most likely next tokens."""
    model.eval()
    src, _ = (t.to(device) for t in to_batch([digits], task))
    memory = model.encode(src)
    ys = torch.tensor([[BOS]], device=device)
    steps = []
    while ys.size(1) < len(digits) + 2:
        probabilities = model.decode(ys, memory)[0, -1].softmax(-1)
        best = probabilities.topk(top)
        steps.append(
            {
                "prefix": [token_name(t) for t in ys[0].tolist()],
                "candidates": [
                    [token_name(t), float(f"{p:.3g}")] for t, p in zip(best.indices.tolist(), best.values.tolist())
                ],
            }
        )
        ys = torch.cat([ys, best.indices[:1][None]], dim=1)
        if int(ys[0, -1]) == EOS:
            break
    return steps


def token_name(token: int) -> str:
    return {PAD: "<pad>", BOS: "<bos>", EOS: "<eos>"}.get(token, str(token - FIRST_DIGIT))


# ------------------------------------------------------------------------------------------ training


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def learning_rate(config: Config, step: int) -> float:
    """The learning rate at ``step`` (counted from 0).

    ``"cosine"``: linear warm-up over ``warmup`` steps to ``lr``, then a cosine decay to zero at the last step.
    ``"paper"`` (Vaswani et al., 2017, eq. 3): ``d_model**-0.5 * min(s**-0.5, s * warmup**-1.5)`` with
    ``s = step + 1``: linear warm-up, a peak of ``(d_model * warmup)**-0.5``, then 1/sqrt(s) decay.
    """
    if config.schedule == "paper":
        s = step + 1
        return config.d_model**-0.5 * min(s**-0.5, s * config.warmup**-1.5)
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * 0.5 * (1 + math.cos(math.pi * progress))


def smoothed_loss(model: Transformer, src, tgt, label_smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The training objective and the plain teacher-forcing cross-entropy the record keeps.

    With label smoothing eps the labels become ``1 - eps`` on the true token and ``eps / V`` spread over the
    vocabulary: the objective can no longer reach zero, so the runs are compared on the plain loss.
    """
    if label_smoothing == 0:
        loss = teacher_forcing_loss(model, src, tgt, PAD)
        return loss, loss
    decoder_input = tgt[:, :-1]  # (B, T - 1): the target shifted right, as in teacher_forcing_loss
    logits = model(src, decoder_input, src != PAD, decoder_input != PAD).flatten(0, 1)  # (B * (T - 1), V)
    labels = tgt[:, 1:].flatten()  # (B * (T - 1),)
    objective = nn.functional.cross_entropy(logits, labels, ignore_index=PAD, label_smoothing=label_smoothing)
    with torch.no_grad():
        loss = nn.functional.cross_entropy(logits, labels, ignore_index=PAD)
    return objective, loss


def train(config: Config, progress: bool = True) -> dict:
    """Train from scratch as ``config`` says; return the run's record (loss curve, accuracy, examples, maps)."""
    device = pick_device(config.device)
    torch.manual_seed(config.seed)
    model = Transformer(
        VOCAB, VOCAB, config.d_model, config.n_heads, config.n_layers, config.d_ff, config.dropout,
        config.norm_first, max_len=config.max_len + 2,
    ).to(device)
    optimiser = torch.optim.Adam(model.parameters(), lr=config.lr, betas=(0.9, 0.98), eps=1e-9)
    held_out = held_out_set(config)
    batches = training_batches(config, held_out)
    bar = tqdm(total=config.steps, desc="training", unit="step", disable=not progress)
    losses, evaluations = [], []
    start = time.perf_counter()
    for step in range(config.steps):
        model.train()
        src, tgt = (t.to(device) for t in next(batches))
        objective, loss = smoothed_loss(model, src, tgt, config.label_smoothing)
        optimiser.zero_grad()
        objective.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimiser.param_groups:
            group["lr"] = learning_rate(config, step)
        optimiser.step()
        losses.append(loss.item())
        bar.update()
        bar.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
        if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
            evaluations.append({"step": step + 1, "exact_match": exact_match(model, held_out, config.task, device)})
    seconds = time.perf_counter() - start
    bar.close()
    return record(model, config, device, losses, evaluations, held_out, seconds)


def record(model, config: Config, device, losses, evaluations, held_out, seconds) -> dict:
    """What a run leaves behind: everything the book plots, small enough to commit (about 10 KB)."""
    examples = sorted(held_out[:200], key=len)[-8:]  # the longest of the first 200 held-out sequences
    src, _ = to_batch(examples, config.task)
    predictions = greedy_decode(model.eval(), src.to(device), config.max_len + 2, BOS, EOS, (src != PAD).to(device))
    longest = max(held_out, key=len)
    return {
        "config": asdict(config),
        "device": device.type,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "seconds": round(seconds, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "loss_every": LOSS_EVERY,
        "loss": [float(f"{sum(window) / len(window):.3g}") for window in windows(losses, LOSS_EVERY)],
        "evaluations": evaluations,
        "exact_match": evaluations[-1]["exact_match"],
        "examples": [
            {"source": tokens_to_text([FIRST_DIGIT + d for d in digits]),
             "target": tokens_to_text([FIRST_DIGIT + d for d in solve(digits, config.task)]),
             "prediction": tokens_to_text(prediction[1:])}
            for digits, prediction in zip(examples, predictions.tolist())
        ],
        "attention_example": {
            "source": [token_name(FIRST_DIGIT + d) for d in longest] + ["<eos>"],
            "decoder_input": ["<bos>"] + [token_name(FIRST_DIGIT + d) for d in solve(longest, config.task)],
            "cross_attention": cross_attention(model, longest, config.task, device),
        },
        "decoding_steps": decoding_steps(model, longest[:5], config.task, device),
    }


def windows(values: list, size: int) -> list[list]:
    return [values[i : i + size] for i in range(0, len(values), size)]


def main(argv: list[str] | None = None) -> dict:
    defaults = Config()
    parser = argparse.ArgumentParser(prog="python -m autograde_tests.authoring.training",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=["reverse", "sort"], default=defaults.task)
    parser.add_argument("--norm-first", action="store_true", help="Pre-LN instead of the paper's Post-LN")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr, help="peak learning rate of the cosine schedule")
    parser.add_argument("--warmup", type=int, default=defaults.warmup, help="warm-up steps (either schedule)")
    parser.add_argument(
        "--schedule", choices=["cosine", "paper"], default=defaults.schedule,
        help="cosine decay after the warm-up (default), or the paper's inverse square root",
    )
    parser.add_argument("--label-smoothing", type=float, default=defaults.label_smoothing, help="the paper uses 0.1")
    parser.add_argument("--dropout", type=float, default=defaults.dropout, help="the paper uses 0.1")
    parser.add_argument("--eval-size", type=int, default=defaults.eval_size)
    parser.add_argument("--eval-every", type=int, default=defaults.eval_every)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--device", default=defaults.device, help="auto (default), cpu or cuda")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="CPU threads for PyTorch (default 1: for a model this small, more threads mostly wait on each other)",
    )
    parser.add_argument("--out", type=Path, help="write the run's record here, as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = Config(
        task=args.task, norm_first=args.norm_first, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        warmup=args.warmup, schedule=args.schedule, label_smoothing=args.label_smoothing, dropout=args.dropout,
        eval_size=args.eval_size, eval_every=args.eval_every, seed=args.seed, device=args.device,
    )
    result = train(config, progress=not args.quiet)
    placement = "Pre-LN" if config.norm_first else "Post-LN"
    print(
        f"{placement}, {config.task}: exact match {result['exact_match']:.1%} on {config.eval_size} held-out "
        f"sequences after {config.steps} steps ({result['seconds']:.0f} s on {result['device']})"
    )
    for example in result["examples"][-3:]:
        print(f"  {example['source']:>20}  ->  {example['prediction']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, separators=(",", ":")) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
