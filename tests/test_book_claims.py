"""What chapters 5 to 7 state, held to what it rests on: the pinned torch, the cached data the pages read,
the measured benchmarks, the course's reference and the reference list (issue 27).

These read the Markdown sources, not the built book, so they run without `make book`.
"""

import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from autograde_tests import course
from autograde_tests.authoring import training
from autograde_tests.authoring.lm_training import attention_rows
from autograde_tests.reference import apply_rotary

REPO = Path(__file__).resolve().parents[1]
BOOK = REPO / "book"
STATIC = BOOK / "_static"


def page(name: str) -> str:
    """A page's Markdown with every run of whitespace made one space, so that a sentence can be matched
    whatever its line breaks."""
    return " ".join((BOOK / f"{name}.md").read_text().split())


def scale_run() -> dict:
    run = json.loads((STATIC / "07_attention_at_scale" / "scale.json").read_text())
    return {(r["kind"], r["T"]): r for r in run["runs"] if r["device"] == "cpu"}


def measured_table(number: int) -> list[list[str]]:
    """The rows of figure ``number``'s table in book/benchmarks_measured.md, each a list of its cells."""
    text = (BOOK / "benchmarks_measured.md").read_text()
    section = re.search(rf"^## {number}\. .*?(?=^## |\Z)", text, re.MULTILINE | re.DOTALL).group(0)
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row] for row in rows[1:]]  # without the header


# ------------------------------------------------------------------------------------------ chapter 7


def test_chapter_7_quotes_the_sdpa_priority_order_of_the_pinned_torch():
    from torch.nn.attention import SDPBackend

    sentence = re.search(r"In torch (\d+\.\d+) the order is (.*?), as the private", page("07_attention_at_scale"))
    assert sentence, "chapter 7 no longer states the order of F.scaled_dot_product_attention's kernels"
    version, order = sentence.groups()
    assert torch.__version__.startswith(version + "."), f"the page quotes torch {version}, the pin is {torch.__version__}"
    names = {"FlashAttention-2": SDPBackend.FLASH_ATTENTION, "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
             '"math"': SDPBackend.MATH, "cuDNN": SDPBackend.CUDNN_ATTENTION}
    quoted = sorted(names, key=lambda name: order.index(name))
    pinned = [SDPBackend(i) for i in torch._C._get_sdp_priority_order()]
    assert [names[name] for name in quoted] == pinned[:len(quoted)], (quoted, pinned)
    assert all(backend not in names.values() for backend in pinned[len(quoted):])


def test_top_left_causal_is_is_causal_and_bottom_right_is_causal_lower_right():
    """The two alignments chapter 7 prints (`tril()` and `tril(n - m)`) are PyTorch's `is_causal=True` and
    `causal_lower_right(m, n)`; they agree when m = n."""
    from torch.nn.attention.bias import causal_lower_right

    text = page("07_attention_at_scale")
    assert "torch.ones(m, n, dtype=torch.int).tril()" in text and "tril(n - m)" in text
    assert "causal_lower_right(m, n)" in text
    for m, n in ((2, 5), (5, 2), (4, 4)):
        q, k = torch.randn(1, 1, m, 8, dtype=torch.float64), torch.randn(1, 1, n, 8, dtype=torch.float64)
        v = torch.eye(n, dtype=torch.float64)[None, None]  # the output is the attention weights themselves
        ones = torch.ones(m, n, dtype=torch.int)
        top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)[0, 0] > 0
        assert torch.equal(top_left, ones.tril().bool())
        if m <= n:  # with m > n the first m - n queries would have no key in the bottom-right alignment
            bottom_right = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(m, n))[0, 0] > 0
            assert torch.equal(bottom_right, ones.tril(n - m).bool())
            assert bottom_right[-1].all(), "the last query sees every key"
        if m == n:
            assert torch.equal(top_left, bottom_right)


def test_chapter_7_naive_time_per_doubling_is_the_measured_one():
    """8.8x at the doubling that leaves the cache, then about 4x again: the numbers quoted from scale.json."""
    text = page("07_attention_at_scale")
    runs = scale_run()
    lengths = sorted({t for _, t in runs})
    naive = "naive (chapter 1)"
    growth = [runs[naive, b]["seconds"] / runs[naive, a]["seconds"] for a, b in zip(lengths, lengths[1:])]
    leave = re.search(r"The doubling from (\d+) to (\d+), where they leave it, costs ([\d.]+) times", text)
    assert leave, "chapter 7 no longer quotes the doubling that leaves the cache"
    start, _, quoted = leave.groups()
    at = lengths.index(int(start))
    assert f"{growth[at]:.1f}" == quoted
    assert growth[at] > 2 * 4, "the page says that doubling costs more than twice the four times of the arithmetic"
    after = re.search(r"the doublings after it cost about four times again \(([^)]*)\)", text).group(1)
    assert after == ", ".join(f"{g:.1f}×" for g in growth[at + 1:])
    assert all(3.5 < g < 5 for g in growth[at + 1:])
    assert f"({growth[at]:.1f} times in this chapter's run)" in text  # the summary


def test_chapter_7_tiled_memory_grows_at_most_twice_per_doubling_as_quoted():
    text = page("07_attention_at_scale")
    runs = scale_run()
    lengths = sorted({t for _, t in runs})
    tiled = sorted({kind for kind, _ in runs if kind.startswith("tiled")})
    for kind in tiled:
        growth = [runs[kind, b]["peak_bytes"] / runs[kind, a]["peak_bytes"] for a, b in zip(lengths, lengths[1:])]
        assert all(g <= 2.0 for g in growth), (kind, growth)
        assert growth == sorted(growth), f"{kind}: the growth should approach 2x as T grows, {growth}"
    quoted = re.search(r"for tiles of (\d+), from ([\d.]+)× \((\d+) to (\d+)\) to ([\d.]+)× \((\d+) to (\d+)\)", text)
    assert quoted, "chapter 7 no longer quotes the range of the tiled memory's growth"
    block, low, a1, b1, high, a2, b2 = quoted.groups()
    kind = f"tiled, blocks of {block}"
    assert f"{runs[kind, int(b1)]['peak_bytes'] / runs[kind, int(a1)]['peak_bytes']:.1f}" == low
    assert f"{runs[kind, int(b2)]['peak_bytes'] / runs[kind, int(a2)]['peak_bytes']:.1f}" == high
    assert (int(a1), int(b2)) == (lengths[0], lengths[-1])


def test_chapter_7_figure_3_numbers_are_the_measured_ones():
    """'about 1.6 times slower ... up to T = 512, then about 6.6 times ... and the one doubling from 512 to
    1024 cost 15 times', and the score memory of its eight heads, from figure 3's table."""
    text = page("07_attention_at_scale")
    rows = {}
    for what, value, _, ratio in measured_table(3):
        found = re.search(r"attention forward, h=(\d+), d_k=64, sequence length (\d+)", what)
        if found:
            heads = int(found.group(1))
            rows[int(found.group(2))] = (float(ratio.rstrip("×")), value)
    assert heads == 8 and "Figure 3 ran eight heads at once" in text
    assert all(round(rows[n][0], 1) in (1.5, 1.6, 1.7) for n in rows if n <= 512)
    assert all(round(rows[n][0], 1) == 6.6 for n in (1024, 2048))
    assert round(float(re.search(r"\(([\d.]+)× the time at 512\)", rows[1024][1]).group(1))) == 15
    assert "about 1.6 times slower" in text and "about 6.6 times slower" in text and "cost 15 times" in text
    for n, mib in ((512, 8), (1024, 32)):
        assert heads * n * n * 4 == mib * 2**20
    assert "8 MiB at $T = 512$ and 32 MiB at $T = 1024$" in text


def test_chapter_7_counts_of_hbm_accesses_are_right():
    """192 KB of SRAM holds 98,304 16-bit numbers, 24 times d^2 for d = 64 and 6 times for d = 128; the
    A100's 312 teraFLOP/s over 1.5 to 2.0 TB/s is 150 to 210 operations per byte."""
    text = page("07_attention_at_scale")
    numbers = 192 * 1024 // 2
    assert f"holds {numbers:,} numbers of 16 bits, {numbers // 64**2} times as many" in text
    assert f"With $d = 128$ the factor falls to {numbers // 128**2}." in text
    low, high = 312e12 / 2.0e12, 312e12 / 1.5e12
    quoted = re.search(r"(\d+) to (\d+) operations for each byte", text).groups()
    assert int(quoted[0]) <= low and high <= int(quoted[1]) and int(quoted[1]) - high < 5 and low - int(quoted[0]) < 10
    # the tiled count N^2 d^2 / M is N d, the size of the inputs, when M = N d (Proposition 3's argument)
    n, d = 1024, 64
    assert n**2 * d**2 / (n * d) == n * d


def test_a_decoding_step_does_about_one_operation_per_byte():
    """Chapter 7: a (1, d) @ (d, d) product in 16-bit floats, a decoding step's linear layer, does about one
    operation per byte it moves; a prompt of 2048 tokens about a thousand."""
    def intensity(rows, d=4096, size=2):
        return 2 * rows * d * d / (size * (rows * d + d * d + rows * d))

    assert round(intensity(1), 1) == 1.0 and intensity(2048) > 500
    assert "an arithmetic intensity of one operation per byte" in page("07_attention_at_scale")


# ------------------------------------------------------------------------------------------ chapter 6


def test_chapter_6_previous_character_head_weight_is_the_cached_runs():
    run = json.loads((STATIC / "06_decoder_only" / "shakespeare.json").read_text())
    maps = attention_rows(run["attention"]["maps"])
    pos = torch.arange(len(run["attention"]["sentence"]))
    previous = float(maps[..., pos[1:], pos[1:] - 1].mean(-1).max())
    assert f"on average {previous:.2f} of each row's weight sits just left of the diagonal" in page("06_decoder_only")
    assert previous < 0.9, "the page no longer says 'nearly all', and the cached run must not contradict it"


def test_chapter_6_warm_up_is_the_cached_runs():
    run = json.loads((STATIC / "06_decoder_only" / "shakespeare.json").read_text())
    quoted = re.search(r"this chapter's run over its first (\d+)", page("06_decoder_only")).group(1)
    assert int(quoted) == run["config"]["warmup"]


def test_chapter_6_counts_the_changes_its_table_lists():
    text = (BOOK / "06_decoder_only.md").read_text()
    section = text.split("## What changed since 2017")[1].split("\n\n**")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith(("| part", "| ---"))]
    words = {3: "three", 4: "four", 5: "five", 6: "six"}
    assert f"changed in the {words[len(rows)]} places of the table" in " ".join(section.split())


def _meta_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Meta's LLaMA RoPE: neighbouring features (2i, 2i + 1) as one complex number, turned by positions · θ_i."""
    d = x.size(-1)
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64)[: d // 2] / d)
    turn = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64), positions.double()[:, None] * theta)
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(pairs * turn).flatten(-2).to(x.dtype)


def test_half_split_rope_is_metas_interleaved_rope_after_the_converters_permutation():
    """Chapter 6: neighbour pairs (the RoPE paper, Meta's LLaMA code) and half-split pairs (GPT-NeoX, Hugging
    Face's rotate_half, this course) are the same model up to a fixed reordering of the features, the one
    Hugging Face's converter applies to the rows of W_q and W_k; without it the two differ."""
    d = 16
    x = torch.randn(2, 3, 7, d, dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 5, 9, 10, 40])
    # the converter's "permute for sliced rotary": within a head, features 0, 2, 4, ... then 1, 3, 5, ...
    order = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    meta = _meta_rotary(x, positions)
    assert torch.allclose(apply_rotary(x[..., order], positions), meta[..., order])
    assert not torch.allclose(apply_rotary(x, positions), meta)
    text = page("06_decoder_only")
    assert "The RoPE paper pairs neighbouring features $(2i, 2i+1)$, and so does Meta's own LLaMA code" in text
    assert "GPT-NeoX, and Hugging Face's `rotate_half`, pair feature $i$ with feature $i + d_k/2$" in text
    assert not re.search(r"as LLaMA does|LLaMA's code, and Hugging Face", text)


# ------------------------------------------------------------------------------------------ chapter 5


def test_paper_schedule_peak_depends_on_d_model_and_warm_up():
    def peak(d_model, warmup):
        config = training.Config(schedule="paper", d_model=d_model, warmup=warmup)
        return max(training.learning_rate(config, s) for s in range(3 * warmup))

    for d_model, warmup in ((512, 4000), (64, 200), (64, 800)):
        assert math.isclose(peak(d_model, warmup), (d_model * warmup) ** -0.5, rel_tol=1e-9)
    assert peak(64, 800) < peak(64, 200)
    assert "The peak depends on both $d_\\text{model}$ and the warm-up length" in page("05_transformer")


# ---------------------------------------------------------------------------- references and benchmarks


# Each work issue 27 asked for, by its first author and year, and the page that cites it where it is used.
REFERENCES = {("Szegedy", "2016"): "05_transformer", ("Kingma", "2015"): "05_transformer",
              ("Srivastava", "2014"): "05_transformer", ("Dauphin", "2017"): "06_decoder_only",
              ("Ainslie", "2023"): "07_attention_at_scale", ("Shazeer", "2019"): "07_attention_at_scale",
              ("Radford", "2018"): "06_decoder_only", ("Loshchilov", "2019"): "06_decoder_only",
              ("Chen", "2023"): "06_decoder_only", ("Raffel", "2020"): "06_decoder_only",
              ("Lewis", "2020"): "06_decoder_only", ("Dao", "2023"): "07_attention_at_scale"}


def _entries() -> list[str]:
    text = (BOOK / "references.md").read_text()
    return [" ".join(entry.split()) for entry in re.findall(r"^- .*(?:\n  .*)*", text, re.MULTILINE)]


@pytest.mark.parametrize(("author", "year"), sorted(REFERENCES))
def test_reference_is_listed_and_cited_where_it_is_used(author, year):
    assert any(entry.startswith(f"- {author},") and f"({year})" in entry for entry in _entries()), (
        f"references.md has no entry for {author} ({year})")
    cited = re.search(rf"\b{author}(?: et al\.| and [A-Z][a-zA-Z]+)?(?:, | \(){year}\b", page(REFERENCES[author, year]))
    assert cited, f"{REFERENCES[author, year]}.md does not cite {author} ({year})"


def test_references_name_the_bench_figure_chapter_7_draws():
    """references.md and chapter 7 name the same `make bench` figure, the one that writes scale.json."""
    figure = re.search(r'make bench ARGS="--figures (\d)"', page("07_attention_at_scale")).group(1)
    assert f'chapter 07\'s plots of time and memory draw the run that `make bench ARGS="--figures {figure}"`' in page("references")
    assert re.search(rf"^Figure {figure}: attention at scale", (BOOK / "benchmarks.md").read_text(), re.MULTILINE)


def test_gpt_is_2018_and_gpt_2_is_2019():
    entries = _entries()
    assert any("(2018)" in e and "Generative Pre-Training* (GPT)" in e for e in entries)
    assert any("(2019)" in e and "(GPT-2)" in e for e in entries)
    assert "GPT (Radford et al., 2018), GPT-2 (Radford et al., 2019)" in page("06_decoder_only")


def test_benchmark_figure_1_times_every_chapter():
    autograded = [re.search(r"of solved (\S+)", what).group(1) for what, *_ in measured_table(1) if "of solved" in what]
    assert autograded == course.chapters(REPO)


@pytest.mark.parametrize("term", ["HBM", "SRAM", "arithmetic intensity"])
def test_glossary_defines_the_terms_of_chapter_7_with_their_chinese_names(term):
    glossary = (BOOK / "glossary.md").read_text()
    definition = re.search(rf"^{re.escape(term)}\n  (.*)$", glossary, re.MULTILINE)
    assert definition and "{.language-zh}" in definition.group(1), f"glossary.md lacks {term} with its Chinese name"
    assert f"{{term}}`{term}`" in (BOOK / "07_attention_at_scale.md").read_text()
