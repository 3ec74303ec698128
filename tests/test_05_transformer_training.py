"""The toy task and the training loop: the data is right, a few steps make the loss fall, a run is
reproducible and leaves the record the book plots. The full convergence run is ``make train``, not a test;
its cached record is checked here."""

import json
from pathlib import Path

import pytest
import torch

from autograde_tests.authoring import training
from autograde_tests.authoring.training import Config
from autograde_tests.toy_task import BOS, EOS, FIRST_DIGIT, PAD, solve, to_batch

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
CACHED = REPO / "book" / "_static" / "05_transformer"  # the runs `make train` caches for the book
CACHED_RUNS = sorted(CACHED.glob("*.json"))
TINY = dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, batch_size=16, eval_size=20, max_len=5, device="cpu")


def test_the_answers_are_the_reversed_or_sorted_digits():
    assert solve([3, 1, 4, 1], "reverse") == [1, 4, 1, 3]
    assert solve([3, 1, 4, 1], "sort") == [1, 1, 3, 4]
    with pytest.raises(ValueError, match="unknown task"):
        solve([1], "copy")


def test_a_batch_is_source_then_eos_and_bos_answer_eos_padded():
    src, tgt = to_batch([[1, 2, 3], [7]], "reverse")
    d = FIRST_DIGIT
    assert src.tolist() == [[d + 1, d + 2, d + 3, EOS], [d + 7, EOS, PAD, PAD]]
    assert tgt.tolist() == [[BOS, d + 3, d + 2, d + 1, EOS], [BOS, d + 7, EOS, PAD, PAD]]
    assert training.tokens_to_text(tgt[0].tolist()) == "3 2 1"


def test_held_out_sequences_are_distinct_and_never_trained_on():
    config = Config(eval_size=300, max_len=3, batch_size=64)  # short sequences: collisions would be common
    held_out = training.held_out_set(config)
    assert len(held_out) == len({tuple(d) for d in held_out}) == 300
    assert all(1 <= len(d) <= 3 for d in held_out)
    excluded = {tuple(FIRST_DIGIT + x for x in d) for d in held_out}
    batches = training.training_batches(config, held_out)
    for _ in range(20):
        src, _ = next(batches)
        assert src.size(0) == 64
        for row in src.tolist():
            assert tuple(t for t in row if t >= FIRST_DIGIT) not in excluded


def test_learning_rate_warms_up_then_decays_to_zero():
    config = Config(lr=1e-3, warmup=10, steps=110)
    rates = [training.learning_rate(config, step) for step in range(110)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(rates[10:], rates[11:]))
    assert rates[-1] < 1e-6


def test_exact_match_counts_whole_sequences(monkeypatch):
    sequences = [[1, 2], [3, 4, 5], [6]]

    def oracle(model, src, max_len, bos_id, eos_id, src_padding_mask=None):
        _, tgt = to_batch(sequences, "reverse")
        out = torch.where(tgt == PAD, EOS, tgt)
        out[1, 2] = FIRST_DIGIT + 9  # one wrong digit in the second sequence
        return out[:, : int(src_padding_mask.sum(1).max()) + 1]  # stops early, as greedy_decode may

    monkeypatch.setattr(training, "greedy_decode", oracle)
    assert training.exact_match(torch.nn.Linear(1, 1), sequences, "reverse", "cpu") == pytest.approx(2 / 3)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_a_few_training_steps_make_the_loss_fall(norm_first):
    result = training.train(Config(steps=60, eval_every=60, lr=3e-3, warmup=10, norm_first=norm_first, **TINY),
                            progress=False)
    losses = result["loss"]  # the mean of each window of ten steps
    assert len(losses) == 6 and result["loss_every"] == 10
    assert losses[-1] < 0.9 * losses[0]


def test_a_seeded_run_is_reproducible():
    config = Config(steps=8, eval_every=8, **TINY)
    assert training.train(config, progress=False)["loss"] == training.train(config, progress=False)["loss"]


def test_the_record_holds_what_the_book_plots():
    result = training.train(Config(steps=4, eval_every=2, **TINY), progress=False)
    json.dumps(result)  # it is written as JSON
    assert [e["step"] for e in result["evaluations"]] == [2, 4]
    assert 0.0 <= result["exact_match"] <= 1.0
    assert len(result["examples"]) == 8 and {"source", "target", "prediction"} <= set(result["examples"][0])
    example = result["attention_example"]
    maps = torch.tensor(example["cross_attention"])  # (layers, heads, T, S)
    assert maps.shape == (1, 2, len(example["decoder_input"]), len(example["source"]))
    torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]), atol=5e-3, rtol=0)  # rounded
    steps = result["decoding_steps"]
    assert steps[0]["prefix"] == ["<bos>"] and len(steps[0]["candidates"]) == 3


def test_the_command_line_writes_the_record(tmp_path, capsys):
    out = tmp_path / "run.json"
    training.main(["--steps", "2", "--eval-size", "10", "--eval-every", "2", "--quiet", "--device", "cpu",
                   "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["config"]["steps"] == 2 and record["config"]["norm_first"] is False
    assert "Post-LN, reverse: exact match" in capsys.readouterr().out


def test_training_shows_a_progress_bar_with_the_loss(capsys):
    training.train(training.Config(steps=3, eval_size=10, eval_every=3, device="cpu"), progress=True)
    err = capsys.readouterr().err
    assert "training: 100%" in err and "3/3" in err and "loss=" in err


def test_the_cached_runs_in_the_book_reach_99_percent_for_both_placements():
    runs = {json.loads(path.read_text())["config"]["norm_first"]: json.loads(path.read_text()) for path in CACHED_RUNS}
    assert set(runs) == {False, True}, "run `make train` to write the cached runs"
    for run in runs.values():
        assert run["exact_match"] >= 0.99 and run["config"]["eval_size"] >= 1000
        assert len(run["loss"]) == run["config"]["steps"] // run["loss_every"]
    assert sum(path.stat().st_size for path in CACHED_RUNS) < 40_000


def test_the_paper_schedule_warms_up_linearly_then_decays_as_the_inverse_square_root():
    config = Config(schedule="paper", d_model=64, warmup=100, steps=1000)
    rates = [training.learning_rate(config, step) for step in range(1000)]
    peak = max(range(1000), key=rates.__getitem__)
    assert peak == 99 and rates[99] == pytest.approx((64 * 100) ** -0.5)  # (d_model * warmup) ** -0.5
    assert rates[49] == pytest.approx(rates[99] / 2)  # linear before the peak
    assert rates[399] == pytest.approx(rates[99] / 2)  # 1 / sqrt(step) after it: four times the steps, half the rate


def test_without_smoothing_the_objective_is_the_teacher_forcing_loss():
    torch.manual_seed(0)
    model = training.Transformer(16, 16, 16, 2, 1, 32)
    src, tgt = to_batch([[1, 2, 3], [4]], "reverse")
    objective, loss = training.smoothed_loss(model, src, tgt, 0.0)
    torch.testing.assert_close(objective, training.teacher_forcing_loss(model, src, tgt, PAD))
    smoothed, plain = training.smoothed_loss(model, src, tgt, 0.1)
    torch.testing.assert_close(plain, loss)
    assert smoothed > plain  # smoothing charges for confidence: the objective sits above the plain loss here


def test_the_cached_recipe_runs_are_the_options_the_book_names():
    runs = {p.stem: json.loads(p.read_text())["config"] for p in (CACHED / "recipe").glob("*.json")}
    assert set(runs) == {"paper_schedule", "paper_recipe", "cosine_smoothing_dropout"}, "run `make train`"
    assert runs["paper_schedule"]["schedule"] == "paper" and runs["paper_schedule"]["label_smoothing"] == 0
    assert runs["paper_recipe"]["schedule"] == "paper"
    for name in ("paper_recipe", "cosine_smoothing_dropout"):
        assert runs[name]["label_smoothing"] == 0.1 and runs[name]["dropout"] == 0.1
    assert runs["cosine_smoothing_dropout"]["schedule"] == "cosine"


def test_the_paper_schedule_keeps_moving_where_the_cosine_run_settles():
    """What the book's recipe section says of the cached runs: at d_model 64 the paper's rate stays high."""
    def last_five(run):
        return [e["exact_match"] for e in json.loads(run.read_text())["evaluations"][-5:]]

    assert max(last_five(CACHED / "recipe" / "paper_schedule.json")) < 1.0
    assert min(last_five(CACHED / "post_ln.json")) == 1.0
    assert min(last_five(CACHED / "recipe" / "cosine_smoothing_dropout.json")) == 1.0
