"""Train chapter 6's decoder-only model on Shakespeare, one character per token (or one byte-level BPE token,
chapter 8's), and record what it learned.

The text ships with the course (``autograde_tests/text/shakespeare.txt``, public domain; its README gives
the provenance): the first 90% trains, the last 10% (the end of A Midsummer Night's Dream) is held out.
With ``--tokens bpe`` the merges are learned from the training 90% alone (chapter 8's reference
``train_bpe``), and the same model, block length in tokens, batch size and steps train on the token ids.
Losses per token of two tokenizers do not compare; both runs record their held-out loss in bits per byte
of text, which does (``bits_per_byte``).

Run it from the repository's root (``make train`` writes the book's cached runs):

    python -m autograde_tests.authoring.lm_training                        # a few minutes on one CPU core
    python -m autograde_tests.authoring.lm_training --steps 200 --out /tmp/run.json
    python -m autograde_tests.authoring.lm_training --tokens bpe --vocab-size 512 --out /tmp/bpe.json

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

from ..reference import GPT, apply_rotary, generate, lm_loss
from ..reference import tokens as bpe
from .training import learning_rate, pick_device, windows

TEXT = Path(__file__).resolve().parents[1] / "text" / "shakespeare.txt"
LOSS_EVERY = 10  # the record keeps the mean loss of each window of this many steps
PROMPT = "Ham.\n"
SENTENCE = "To be, or not to be, that is the question."  # the attention maps' sentence
TEMPERATURES = (0.0, 0.5, 0.8, 1.2)


@dataclass
class Config:
    d_model: int = 96
    n_heads: int = 4
    n_layers: int = 3
    d_ff: int = 256  # 2/3 · 4 · d_model: SwiGLU's three matrices hold as many weights as a ReLU FFN's two of 4·d_model
    block: int = 128  # tokens of context per training sequence: samples stay within it (see ``record``)
    batch_size: int = 16
    steps: int = 1200
    lr: float = 3e-3
    warmup: int = 100
    schedule: str = "cosine"  # training.learning_rate's warm-up then cosine decay
    eval_every: int = 100
    eval_batches: int = 8
    seed: int = 0
    device: str = "auto"
    tokens: str = "characters"  # or "bpe": chapter 8's byte-level BPE, learned from the training split
    vocab_size: int | None = None  # "bpe" only: 256 bytes + the merges; characters take every one of the text


class Characters:
    """The vocabulary: every character of the text, sorted; a token id is a character's index."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        self.size = len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in text])

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)

    def fields(self) -> dict:
        """What the run's record keeps of the vocabulary."""
        return {"vocab": self.chars}


class BytePairs:
    """Chapter 8's byte-level BPE vocabulary: ``vocab_size`` tokens, the 256 bytes and the merges that
    ``train_bpe`` learns from ``text``; a token id is the reference's (``tokens.encode``)."""

    def __init__(self, text: str, vocab_size: int):
        self.merges = bpe.train_bpe(text, vocab_size)
        self.size = 256 + len(self.merges)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor(bpe.encode(text, self.merges))

    def decode(self, ids) -> str:
        return bpe.decode(ids, self.merges)

    def fields(self) -> dict:
        """What the run's record keeps of the vocabulary: the merges, as [left id, right id] in rank order."""
        return {"merges": [list(pair) for pair in self.merges]}


def load_text() -> str:
    return TEXT.read_text(encoding="ascii")


def split(data):
    """The first 90% of the text (a str, or a tensor of one token per character) trains, the rest is held out."""
    cut = int(0.9 * len(data))
    return data[:cut], data[cut:]


def bits_per_byte(nats_per_token: float, tokens: int, n_bytes: int) -> float:
    """A mean loss in nats per token, as bits per byte of the text those ``tokens`` encode in ``n_bytes``
    bytes of UTF-8: nats per token × tokens per byte ÷ ln 2 (nats to bits).

    A loss per token depends on the tokenizer (a BPE token holds several bytes, so each is harder to
    guess than one character); per byte of the same text, the losses of any two tokenizers compare. With one
    token per ASCII character, ``tokens == n_bytes`` and it is the loss in bits."""
    return nats_per_token * tokens / n_bytes / math.log(2)


def batch(data: torch.Tensor, config: Config, generator: torch.Generator) -> torch.Tensor:
    """(batch_size, block + 1) windows of the text at random places: block inputs and their next tokens."""
    starts = torch.randint(len(data) - config.block - 1, (config.batch_size,), generator=generator)
    return torch.stack([data[s : s + config.block + 1] for s in starts.tolist()])


@torch.no_grad()
def held_out_loss(model: GPT, data: torch.Tensor, config: Config, device) -> float:
    """The mean loss, in nats per token, on ``eval_batches`` fixed batches of the held-out text."""
    model.eval()
    generator = torch.Generator().manual_seed(config.seed + 1)
    losses = [lm_loss(model, batch(data, config, generator).to(device)).item() for _ in range(config.eval_batches)]
    model.train()
    return sum(losses) / len(losses)


@torch.no_grad()
def attention_maps(model: GPT, idx: torch.Tensor) -> list:
    """Every block's attention weights for idx (1, T): [layer][head][query][key <= query] (the causal part
    only, half the size), recomputed from the block's own q and k (read with forward pre-hooks: the
    reference model is not changed for this)."""
    maps = []

    def weights(block, args):
        x, positions = args[0], args[1]
        B, T, _ = x.shape
        h = block.attn_norm(x)
        q, k = (apply_rotary(w(h).view(B, T, block.n_heads, block.d_k).transpose(1, 2), positions)
                for w in (block.w_q, block.w_k))  # (B, h, T, d_k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(block.d_k)  # (B, h, T, T)
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        maps.append(scores.masked_fill(future, float("-inf")).softmax(-1)[0])

    hooks = [block.register_forward_pre_hook(weights) for block in model.blocks]
    try:
        model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return [[[[round(w, 3) for w in row[: t + 1]] for t, row in enumerate(head.tolist())] for head in layer]
            for layer in maps]


def attention_rows(maps: list) -> torch.Tensor:
    """The (layers, heads, T, T) weights of ``attention_maps``' causal rows, zeros above the diagonal."""
    T = len(maps[0][0])
    return torch.tensor([[[row + [0.0] * (T - len(row)) for row in head] for head in layer] for layer in maps])


def tokenize(text: str, config: Config) -> tuple[Characters | BytePairs, torch.Tensor, torch.Tensor, dict]:
    """The vocabulary ``config.tokens`` names, the training and held-out token ids (1-D int64 tensors), and
    the seconds it took to learn the vocabulary and to encode both splits. BPE learns from the training
    split only: the held-out text stays unseen by the tokenizer as by the model."""
    train_text, held_out_text = split(text)
    start = time.perf_counter()
    vocab = BytePairs(train_text, config.vocab_size) if config.tokens == "bpe" else Characters(text)
    learned = time.perf_counter()
    train_data, val_data = vocab.encode(train_text), vocab.encode(held_out_text)
    seconds = {"train": round(learned - start, 2), "encode": round(time.perf_counter() - learned, 2)}
    return vocab, train_data, val_data, seconds


def train(config: Config, progress: bool = True, text: str | None = None) -> dict:
    """Train from scratch as ``config`` says, on ``text`` (default: the course's Shakespeare); return the
    run's record (loss curves, bits per byte, samples, attention)."""
    device = pick_device(config.device)
    torch.manual_seed(config.seed)
    text = load_text() if text is None else text
    vocab, train_data, val_data, tokenizer_seconds = tokenize(text, config)
    model = GPT(vocab.size, config.d_model, config.n_heads, config.n_layers, config.d_ff).to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.1)
    generator = torch.Generator().manual_seed(config.seed + 2)
    bar = tqdm(total=config.steps, desc="training", unit="step", disable=not progress)
    losses, evaluations = [], []
    start = time.perf_counter()
    for step in range(config.steps):
        loss = lm_loss(model, batch(train_data, config, generator).to(device))
        optimiser.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimiser.param_groups:
            group["lr"] = learning_rate(config, step)
        optimiser.step()
        losses.append(loss.item())
        bar.update()
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
            evaluations.append({"step": step + 1, "seconds": round(time.perf_counter() - start, 1),
                                "val_loss": round(held_out_loss(model, val_data, config, device), 4)})
            bar.set_postfix(loss=f"{losses[-1]:.3f}", val=f"{evaluations[-1]['val_loss']:.3f}", refresh=False)
    seconds = time.perf_counter() - start
    bar.close()
    held_out = {"tokens": len(val_data), "bytes": len(split(text)[1].encode("utf-8"))}
    return record(model.eval(), vocab, config, device, losses, evaluations, seconds, held_out, tokenizer_seconds)


def record(model: GPT, vocab: Characters | BytePairs, config: Config, device, losses, evaluations, seconds,
           held_out: dict, tokenizer_seconds: dict) -> dict:
    """What a run leaves behind: everything the book plots, small enough to commit. ``held_out`` holds the
    held-out split's length in tokens and in UTF-8 bytes; ``tokenizer_seconds`` what ``tokenize`` returned."""
    prompt = vocab.encode(PROMPT)[None].to(device)
    n_prompt = prompt.shape[1]
    samples = {}
    for temperature in TEMPERATURES:  # within the trained context: RoPE positions past it were never seen
        drawn = generate(model, prompt, config.block - n_prompt, temperature=temperature,
                         generator=torch.Generator(device=device).manual_seed(config.seed))
        samples[str(temperature)] = vocab.decode(drawn[0, n_prompt:].tolist())
    sentence = vocab.encode(SENTENCE)[None].to(device)
    val_loss = evaluations[-1]["val_loss"]
    run = {
        "config": asdict(config),
        "device": device.type,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "seconds": round(seconds, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": vocab.size,
        **vocab.fields(),
        "tokenizer_seconds": tokenizer_seconds,
        "held_out_tokens": held_out["tokens"],
        "held_out_bytes": held_out["bytes"],
        "tokens_per_byte": round(held_out["tokens"] / held_out["bytes"], 4),
        "loss_every": LOSS_EVERY,
        "loss": [float(f"{sum(window) / len(window):.4g}") for window in windows(losses, LOSS_EVERY)],
        "evaluations": evaluations,
        "val_loss": val_loss,
        # the loss of the held-out batches, at the tokens per byte of the whole held-out split
        "bits_per_byte": round(bits_per_byte(val_loss, held_out["tokens"], held_out["bytes"]), 4),
        "prompt": PROMPT,
        "samples": samples,
        "attention": {"sentence": SENTENCE, "maps": attention_maps(model, sentence)},
    }
    if isinstance(vocab, Characters):  # chapter 6's figure of the next character's distribution
        with torch.no_grad():
            next_logits = model(vocab.encode("To be, or not to b")[None].to(device))[0][0, -1]
        run["next_char"] = {"context": "To be, or not to b", "logits": [round(v, 4) for v in next_logits.tolist()]}
    return run


def main(argv: list[str] | None = None) -> dict:
    defaults = Config()
    parser = argparse.ArgumentParser(prog="python -m autograde_tests.authoring.lm_training",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", choices=["characters", "bpe"], default=defaults.tokens,
                        help="one token per character (default), or chapter 8's byte-level BPE")
    parser.add_argument("--vocab-size", type=int, default=512,
                        help="with --tokens bpe: 256 bytes + the merges (default 512)")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--eval-every", type=int, default=defaults.eval_every)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--device", default=defaults.device, help="auto (default), cpu or cuda")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for PyTorch (default 1)")
    parser.add_argument("--out", type=Path, help="write the run's record here, as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = Config(steps=args.steps, batch_size=args.batch_size, lr=args.lr, eval_every=args.eval_every,
                    seed=args.seed, device=args.device, tokens=args.tokens,
                    vocab_size=args.vocab_size if args.tokens == "bpe" else None)
    result = train(config, progress=not args.quiet)
    print(f"held-out loss {result['val_loss']:.3f} nats per token, {result['bits_per_byte']:.3f} bits per byte, after "
          f"{config.steps} steps ({result['seconds']:.0f} s on {result['device']}); uniform guessing: "
          f"{math.log(result['vocab_size']):.2f} nats per token")
    print(f"sample at temperature 0.8:\n{result['samples']['0.8']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, separators=(",", ":")) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
