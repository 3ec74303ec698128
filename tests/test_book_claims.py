"""What chapters 5 to 8 state, held to what it rests on: the pinned torch, the cached data the pages read,
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

from autograde_tests import nbgrader_course
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


# ------------------------------------------------------------------------------------------ chapter 8
# The page's numbers, recomputed as the page computes them: the reference's tokeniser on the course's text,
# its first 90% to learn from and its last 10% to measure on.

TOKENS_PAGE = "08_tokens"
SIZES = (256, 384, 512, 1024, 2048)


@pytest.fixture(scope="module")
def bpe():
    """The page's setup: the text, its 90/10 split, the 1,792 merges of a vocabulary of 2,048 learned from the
    first 90% (about 7 s), and the held-out tokens per byte of every vocabulary the page plots."""
    from autograde_tests.reference.tokens import encode, train_bpe

    text = (REPO / "autograde_tests" / "text" / "shakespeare.txt").read_text()
    cut = int(0.9 * len(text))
    train, held_out = text[:cut], text[cut:]
    merges = train_bpe(train, max(SIZES))
    held_out_bytes = len(held_out.encode("utf-8"))
    per_byte = {size: len(encode(held_out, merges[: size - 256])) / held_out_bytes for size in SIZES}
    return {"text": text, "train": train, "held_out": held_out, "merges": merges, "tokens_per_byte": per_byte}


def _bpe_runs() -> tuple[dict, dict]:
    return (json.loads((STATIC / "06_decoder_only" / "shakespeare.json").read_text()),
            json.loads((STATIC / "08_tokens" / "bpe_run.json").read_text()))


def test_chapter_8_words_unseen_in_training_are_the_quoted_share(bpe):
    """'7.9% of the words in the last 10% were never seen (one distinct word in four)': words cut the way the
    chapter cuts text, GPT-2's pattern."""
    import regex

    from autograde_tests.reference.tokens import PATTERN

    seen = set(regex.findall(PATTERN, bpe["train"]))
    words = regex.findall(PATTERN, bpe["held_out"])
    unseen = sum(word not in seen for word in words) / len(words)
    distinct = set(words)
    unseen_distinct = sum(word not in seen for word in distinct) / len(distinct)
    quoted = f"and {unseen:.1%} of the words in the last 10% were never seen (one distinct word in four)"
    assert quoted in page(TOKENS_PAGE)
    assert round(4 * unseen_distinct) == 1, unseen_distinct


def test_chapter_8_text_is_ascii_and_chapter_6_has_76_characters(bpe):
    """'76 of them for the course's Shakespeare', 'Because the text is ASCII, one byte is one character',
    'the course's million characters'."""
    text, (characters, _) = bpe["text"], _bpe_runs()
    assert len(set(text)) == len(characters["vocab"]) == 76
    assert text.isascii() and len(text.encode("utf-8")) == len(text)
    assert round(len(text), -6) == 1_000_000
    page_text = page(TOKENS_PAGE)
    assert "every character of the text is a token, 76 of them for the course's Shakespeare" in page_text
    assert "Because the text is ASCII, one byte is one character." in page_text


def test_chapter_8_utf_8_lengths_are_the_quoted_ones():
    """'1 for ASCII, 2 for accented Latin, Greek or Cyrillic letters, 3 for the Chinese characters in common
    use, 4 for emoji'; `é` is `c3 a9`. The characters in common use: GB2312's 6,763, all in the BMP (Unicode's
    rarer ideographs, most of its 90,000, lie beyond it and take 4)."""
    assert ("(1 for ASCII, 2 for accented Latin, Greek or Cyrillic letters, 3 for the Chinese characters in common "
            "use, 4 for emoji)") in page(TOKENS_PAGE)
    examples = (("aZ0 ~", 1), ("éüñàçøÅΩλЖя", 2), ("東京寿司食", 3), ("🍣🙂👩🚀", 4))
    for characters, length in examples:
        assert {len(c.encode("utf-8")) for c in characters} == {length}, characters
    common = [bytes([lead, trail]).decode("gb2312") for lead in range(0xB0, 0xF8) for trail in range(0xA1, 0xFF)
              if (lead, trail) not in {(0xD7, t) for t in range(0xFA, 0xFF)}]
    assert len(common) == 6763 and {len(c.encode("utf-8")) for c in common} == {3}
    assert "é".encode("utf-8") == bytes.fromhex("c3a9") and "`é` is the two bytes `c3 a9`" in page(TOKENS_PAGE)


def test_chapter_8_unicode_defines_about_150000_characters():
    """The pinned Python's Unicode (14.0) assigns 144,697 characters, not counting controls, surrogates,
    private use and unassigned code points; later versions more (15.1: 149,813)."""
    import sys
    import unicodedata

    assigned = sum(unicodedata.category(chr(c)) not in ("Cn", "Co", "Cs", "Cc") for c in range(sys.maxunicode + 1))
    assert abs(assigned - 150_000) < 0.05 * 150_000, (unicodedata.unidata_version, assigned)
    assert "Unicode defines about 150,000 characters" in page(TOKENS_PAGE)


def test_chapter_8_unseen_marketable_is_three_pieces(bpe):
    import regex

    from autograde_tests.reference.tokens import PATTERN, encode, token_bytes

    assert " marketable" not in set(regex.findall(PATTERN, bpe["train"]))
    vocab = token_bytes(bpe["merges"])
    assert [vocab[i] for i in encode(" marketable", bpe["merges"])] == [b" mark", b"et", b"able"]
    assert 'writes the unseen `" marketable"` as `" mark"`, `"et"`, `"able"`' in page(TOKENS_PAGE)


def test_chapter_8_half_the_tokens_is_a_quarter_of_attention_and_twice_the_text():
    assert (1 / 2) ** 2 == 1 / 4
    assert ("A tokeniser that writes the same text in half the tokens makes attention about four times cheaper, "
            "and lets a context of fixed length, counted in tokens, hold twice as much text") in page(TOKENS_PAGE)


def test_chapter_8_gpt_2s_vocabulary_and_end_of_text_id_are_tiktokens():
    """'Its vocabulary is 50,257 tokens: the 256 bytes, 50,000 merges, and one special token', and
    '<|endoftext|> is id 50,256: 256 + 50,000 + 0', from tiktoken's definition of GPT-2's encoding (its
    download of the ranks replaced: only the counts and the ids are read)."""
    from unittest import mock

    import tiktoken_ext.openai_public as openai_public

    with mock.patch.object(openai_public, "data_gym_to_mergeable_bpe_ranks", return_value={}):
        gpt2 = openai_public.gpt2()
    assert gpt2["explicit_n_vocab"] == 50_257 == 256 + 50_000 + len(gpt2["special_tokens"])
    assert gpt2["special_tokens"] == {"<|endoftext|>": 256 + 50_000 + 0}
    text = page(TOKENS_PAGE)
    assert "Its vocabulary is 50,257 tokens: the 256 bytes, 50,000 merges, and one special token" in text
    assert "`<|endoftext|>` is id 50,256: $256 + 50{,}000 + 0$" in text


def test_chapter_8_toy_sentence_merges_at_first_then_he_before_th():
    """'"at" comes first: six occurrences. Then "th" and "he" both occur four times', and the tie goes to the
    smaller pair: "he", (104, 101), before "th", (116, 104)."""
    from collections import Counter

    import regex

    from autograde_tests.reference.tokens import PATTERN, token_bytes, train_bpe

    toy = "the cat sat on the mat; the rat sat on the hat"
    assert f'toy = "{toy}"' in (BOOK / f"{TOKENS_PAGE}.md").read_text()
    counts = Counter(pair for piece in regex.findall(PATTERN, toy) for pair in zip(piece, piece[1:]))
    assert counts[("a", "t")] == 6 == max(counts.values())
    assert counts[("t", "h")] == counts[("h", "e")] == 4 == sorted(counts.values())[-2]
    assert [n for n in counts.values() if n == 4] == [4, 4], "only the two tie at four"
    merges = train_bpe(toy, 256 + 8)
    vocab = token_bytes(merges)
    assert [vocab[256 + i] for i in range(2)] == [b"at", b"he"] and merges[1] == (104, 101)
    assert (116, 104) not in merges, '"th" lost the tie, and then "t" joined "he" instead'
    text = page(TOKENS_PAGE)
    assert '`"at"` comes first: six occurrences. Then `"th"` and `"he"` both occur four times' in text
    assert '`"he"`, $(104, 101)$, before `"th"`, $(116, 104)$' in text


def test_chapter_8_overlapping_pairs_count_twice_and_merge_once():
    """'"aaa" holds the pair (a, a) twice ... becomes "aa", "a"', and Hugging Face's trainer counts the same
    way: with "aaa" ten times and "bc" fifteen, (a, a) is counted 20 times and merged first by both."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from autograde_tests.reference.tokens import merge, train_bpe

    assert merge([97, 97, 97], (97, 97), 256) == [256, 97]
    text = " ".join(["aaa"] * 10 + ["bc"] * 15)
    assert train_bpe(text, 257) == [(97, 97)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=257, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    assert json.loads(tokenizer.to_str())["model"]["merges"] in ([["a", "a"]], ["a a"])
    text = page(TOKENS_PAGE)
    assert '`"aaa"` holds the pair $(a, a)$ twice' in text and '`"aaa"` becomes `"aa"`, `"a"`' in text
    assert "Hugging Face's trainer counts the same way" in text


def test_chapter_8_pieces_of_the_whole_text_are_the_quoted_counts(bpe):
    """'the course's million characters hold about 285,000 pieces but only about 15,700 distinct ones'."""
    import regex

    from autograde_tests.reference.tokens import PATTERN

    pieces = regex.findall(PATTERN, bpe["text"])
    quoted = (f"hold about {round(len(pieces), -3):,} pieces but only about {round(len(set(pieces)), -2):,} "
              "distinct ones")
    assert quoted == "hold about 285,000 pieces but only about 15,700 distinct ones"
    assert quoted in page(TOKENS_PAGE)


def test_chapter_8_learns_1792_merges_and_the_first_k_are_a_smaller_vocabularys(bpe):
    """'learns the 1,792 merges of a vocabulary of 2,048'; 'The first k of them are exactly the merges of a
    vocabulary of 256 + k tokens, since training is greedy'."""
    from autograde_tests.reference.tokens import train_bpe

    assert len(bpe["merges"]) == 2048 - 256 == 1792
    assert train_bpe(bpe["train"][:200_000], 256 + 40) == train_bpe(bpe["train"][:200_000], 256 + 80)[:40]
    text = page(TOKENS_PAGE)
    assert "learns the 1,792 merges of a vocabulary of 2,048 from the first 90% of the course's text" in text
    assert "The reference learned 1,792 merges from the first 90% of the text." in text


def test_chapter_8_regex_demo_cuts_as_the_page_says_and_as_tiktokens_gpt_2_pattern():
    """The demo line's pieces: two spaces before "Ham" give one to a piece of its own, "'Tis" is " '" and
    "Tis", "2019's" keeps its "'s" apart; the seven contractions; and the pattern cuts as tiktoken's GPT-2
    pattern (r50k) does, on the demo line and on the whole course text."""
    import regex
    from tiktoken_ext.openai_public import r50k_pat_str

    from autograde_tests.reference.tokens import PATTERN

    line = "Enter Hamlet.  Ham. 'Tis 2019's end!\n"
    pieces = regex.findall(PATTERN, line)
    assert pieces == ["Enter", " Hamlet", ".", " ", " Ham", ".", " '", "Tis", " 2019", "'s", " end", "!", "\n"]
    assert pieces == regex.findall(r50k_pat_str, line)
    text = (REPO / "autograde_tests" / "text" / "shakespeare.txt").read_text()
    assert regex.findall(PATTERN, text) == regex.findall(r50k_pat_str, text)
    contractions = PATTERN.split("| ?\\p{L}")[0].split("|")
    assert contractions == ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
    assert f'print(regex.findall(PATTERN, "{line[:-1]}\\n"))' in (BOOK / f"{TOKENS_PAGE}.md").read_text()
    source = page(TOKENS_PAGE)
    assert "seven English contractions (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`)" in source
    assert "Shakespeare's `'Tis` is cut into `\" '\"` and `\"Tis\"`" in source
    assert "the possessive of a number (`2019's`) keeps its `'s` apart" in source


def test_chapter_8_gpt_4s_pattern_takes_contractions_in_either_case_and_digits_in_threes():
    """'GPT-4's matches the contractions in either case and cuts numbers into groups of at most three digits',
    from tiktoken's cl100k_base (its download replaced: only the pattern is read)."""
    from unittest import mock

    import regex
    import tiktoken_ext.openai_public as openai_public

    from autograde_tests.reference.tokens import PATTERN

    with mock.patch.object(openai_public, "load_tiktoken_bpe", return_value={}):
        gpt4 = openai_public.cl100k_base()["pat_str"]
    assert regex.findall(gpt4, "'TIS 1234567") == ["'T", "IS", " ", "123", "456", "7"]
    assert regex.findall(PATTERN, "'TIS 1234567") == ["'", "TIS", " 1234567"]
    assert ("GPT-4's matches the contractions in either case and cuts numbers into groups of at most three "
            "digits") in page(TOKENS_PAGE)


def test_chapter_8_special_tokens_take_ids_after_the_merges_and_tiktoken_refuses_them_by_default():
    """The j-th special token is 256 + len(merges) + j; the course's encode turns every occurrence into it;
    tiktoken refuses such text unless the caller allows the token by name, and decodes with errors="replace"."""
    import tiktoken

    from autograde_tests.reference.tokens import decode, encode, token_bytes

    merges, end = [(104, 105)], "<|endoftext|>"
    assert encode(f"hi{end}hi{end}", merges, ["<|x|>", end]) == [256, 256 + 1 + 1, 256, 258]
    vocab = token_bytes(merges)
    ranks = {piece: i for i, piece in enumerate(vocab)}
    assert all(isinstance(piece, bytes) for piece in ranks), "tiktoken's vocabulary: a token's bytes to its rank"
    from autograde_tests.reference.tokens import PATTERN

    encoding = tiktoken.Encoding("course", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens={end: 257})
    with pytest.raises(ValueError):
        encoding.encode(f"hi{end}")
    assert encoding.encode(f"hi{end}", allowed_special={end}) == encode(f"hi{end}", merges, [end]) == [256, 257]
    cut = list("é".encode("utf-8"))[:1]
    assert encoding.decode(cut) == decode(cut, merges) == "\ufffd"
    text = page(TOKENS_PAGE)
    assert ("tiktoken by default refuses to encode text that contains a special token, unless the caller allows "
            "it by name") in text
    assert 'writes the replacement character U+FFFD for them, as tiktoken does' in text


def test_chapter_8_abcd_encodes_by_rank_not_by_the_longest_match():
    """'With the merges (c, d), then (b, cd), then (a, b), the piece abcd encodes as a, bcd; the longest match
    from the left would give ab, cd.'"""
    from autograde_tests.reference.tokens import encode, token_bytes

    a, b, c, d = b"abcd"
    merges = [(c, d), (b, 256), (a, b)]
    vocab = token_bytes(merges)
    assert [vocab[i] for i in encode("abcd", merges)] == [b"a", b"bcd"]

    def longest_from_the_left(piece: bytes) -> list[bytes]:
        tokens = []
        while piece:
            token = max((t for t in vocab if piece.startswith(t)), key=len)
            tokens.append(token)
            piece = piece[len(token):]
        return tokens

    assert longest_from_the_left(b"abcd") == [b"ab", b"cd"]
    quoted = "the piece `abcd` encodes as `a`, `bcd`; the longest match from the left would give `ab`, `cd`"
    assert quoted in page(TOKENS_PAGE)


def test_chapter_8_encoding_speed_is_figure_10s():
    """'encodes the whole of the course's text, about a million bytes, in about half a second, two to three
    times tiktoken's time (figure 10 ...)': the measured appendix, not a timing taken as the book builds."""
    text = (REPO / "autograde_tests" / "text" / "shakespeare.txt").read_text()
    rows = [row for row in measured_table(10) if row[0].startswith("`encode`, the whole text") and "tiktoken" in row[2]]
    assert len(rows) == 2
    for what, median, against, ratio in rows:
        assert f"({len(text.encode('utf-8')):,} bytes)" in what
        assert round(float(median.removesuffix(" s")), 1) == 0.5, median
        assert 2 <= float(ratio.rstrip("×")) <= 3, ratio
    assert round(len(text.encode("utf-8")), -6) == 1_000_000
    assert ("The course's reference encodes the whole of the course's text, about a million bytes, in about half a "
            "second, two to three times tiktoken's time (figure 10 of the {doc}`benchmarks`, measured by `make bench`)"
            ) in page(TOKENS_PAGE)
    assert re.search(r"^Figure 10: byte-level BPE", (BOOK / "benchmarks.md").read_text(), re.MULTILINE)


def test_chapter_8_cafe_ends_in_two_tokens_that_are_no_character(bpe):
    from autograde_tests.reference.tokens import decode, encode, token_bytes

    vocab = token_bytes(bpe["merges"])
    tokens = [vocab[i] for i in encode("café", bpe["merges"])]
    assert tokens[-2:] == [b"\xc3", b"\xa9"] and b"".join(tokens) == "café".encode("utf-8")
    assert decode(encode("café", bpe["merges"]), bpe["merges"]) == "café"
    assert "a vocabulary learned from ASCII text has no merge for them, so `é` is two tokens" in page(TOKENS_PAGE)


def test_chapter_8_tokens_per_byte_are_the_quoted_ones(bpe):
    """The plots' alt text (about 0.6 at 384, 0.53 at 512, 0.44 at 1024, 0.38 at 2048; attention to about 0.15),
    the summary's 0.38, and each doubling of the vocabulary saving less."""
    ratio = bpe["tokens_per_byte"]
    assert ratio[256] == 1.0
    shown = (f"{ratio[384]:.1f}", f"{ratio[512]:.2f}", f"{ratio[1024]:.2f}", f"{ratio[2048]:.2f}")
    assert shown == ("0.6", "0.53", "0.44", "0.38")
    assert f"{ratio[2048] ** 2:.2f}" == "0.15"
    saved = [ratio[small] - ratio[2 * small] for small in (256, 512, 1024)]
    assert saved == sorted(saved, reverse=True), saved
    per_merge = [(ratio[small] - ratio[large]) / (large - small) for small, large in zip(SIZES, SIZES[1:])]
    assert per_merge == sorted(per_merge, reverse=True), "each merge saves fewer tokens than the one before"
    text = page(TOKENS_PAGE)
    assert "fall from 1 at 256 tokens (bytes) to about 0.6 at 384, 0.53 at 512, 0.44 at 1024 and 0.38 at 2048" in text
    assert ("falls from 1 to about 0.15, and the cost of the rest of the model, linear in the tokens, from 1 to "
            "about 0.38") in text
    assert "On held-out Shakespeare, 2,048 tokens give 0.38 tokens per byte" in text


def test_chapter_8_first_merges_save_most_and_2048_tokens_cost_what_is_quoted(bpe):
    """'The first 128 merges cut the text by 40%; the next 1,664 cut what was left by only 36%', '0.384 tokens
    per byte, attention costs 0.384² ≈ 0.15', 'a context of 1,024 tokens holds about 2,700 characters'."""
    ratio = bpe["tokens_per_byte"]
    first, rest = 1 - ratio[384] / ratio[256], 1 - ratio[2048] / ratio[384]
    quoted = (f"The first {384 - 256} merges cut the text by {first:.0%}; the next {2048 - 384:,} cut what was left "
              f"by only {rest:.0%}.")
    assert quoted == "The first 128 merges cut the text by 40%; the next 1,664 cut what was left by only 36%."
    text = page(TOKENS_PAGE)
    assert quoted in text
    assert f"{ratio[2048]:.2f}" == "0.38" and f"{ratio[2048]:.3f}" == "0.384"
    assert f"{0.384 ** 2:.2f}" == f"{ratio[2048] ** 2:.2f}" == "0.15"  # 0.38² itself is 0.144
    assert "At 2,048 tokens the model reads 0.384 tokens per byte, attention costs $0.384^2 \\approx 0.15$" in text
    characters = 1024 / ratio[2048]  # ASCII: a byte is a character
    assert round(characters, -2) == 2700, characters
    assert "a context of 1,024 tokens holds about 2,700 characters of Shakespeare instead of 1,024" in text


def test_chapter_8_merge_table_shows_spaces_first_the_at_11_and_words_last(bpe):
    """'Spaces come first: " t", " a", " s" ... by rank 11 " the" is one token. The last merges are whole words
    (" yours", " bless") and pieces that several words share ("ated", "cks")'."""
    import regex

    from autograde_tests.reference.tokens import PATTERN, token_bytes

    vocab = token_bytes(bpe["merges"])
    ranks = {vocab[256 + r]: r for r in range(len(bpe["merges"]))}
    assert [ranks[b" t"], ranks[b" a"], ranks[b" s"]] == [0, 2, 3]
    assert ranks[b" the"] == 11
    last = [vocab[256 + r] for r in range(len(bpe["merges"]) - 8, len(bpe["merges"]))]
    assert {b" yours", b" bless", b"ated", b"cks"} <= set(last), last
    words = set(regex.findall(PATTERN, bpe["train"]))
    assert all(sum(piece in word for word in words) >= 3 for piece in ("ated", "cks"))
    text = page(TOKENS_PAGE)
    assert ('Spaces come first: `" t"`, `" a"`, `" s"` begin words everywhere, and by rank 11 `" the"` is one '
            'token.') in text
    assert ('The last merges are whole words (`" yours"`, `" bless"`) and pieces that several words share '
            '(`"ated"`, `"cks"`)') in text


def test_chapter_8_fast_libraries_thread_batches_and_write_the_space_as_g_dot():
    """tiktoken's encode_batch uses Python threads; Hugging Face's byte-level tokens show the space byte as Ġ
    and " the" as Ġthe."""
    import inspect

    import tiktoken
    from tokenizers import pre_tokenizers

    assert "ThreadPoolExecutor" in inspect.getsource(tiktoken.Encoding.encode_batch)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    assert [piece for piece, _ in byte_level.pre_tokenize_str(" the")] == ["Ġthe"]
    text = page(TOKENS_PAGE)
    assert "tiktoken's `encode_batch` uses Python threads" in text
    assert "the space byte appears as `Ġ`, and `\" the\"` as `Ġthe`" in text


def test_chapter_8_bits_per_byte_of_a_character_model_is_its_loss_over_ln_2():
    """'2 nats per character is 2.9 bits per byte', ln 2 ≈ 0.69; and both cached runs' bits per byte follow
    the page's formula from their held-out loss."""
    assert f"{math.log(2):.2f}" == "0.69" and f"{2 / math.log(2):.1f}" == "2.9"
    assert "$\\ln 2 \\approx 0.69$: 2 nats per character is 2.9 bits per byte" in page(TOKENS_PAGE)
    for run in _bpe_runs():
        recomputed = run["val_loss"] * run["held_out_tokens"] / (math.log(2) * run["held_out_bytes"])
        assert round(recomputed, 3) == round(run["bits_per_byte"], 3)


def test_chapter_8_bpe_run_is_chapter_6s_model_on_the_pages_merges(bpe):
    """'the merges of a vocabulary of 512, learned by the reference's train_bpe from the training 90% of the
    text, then the same layers, widths, batch, learning rate and 1,200 steps, on a CPU, in the same wall time',
    measured on the same held-out 10%."""
    from autograde_tests.authoring import lm_training

    characters, tokens = _bpe_runs()
    assert [tuple(pair) for pair in tokens["merges"]] == bpe["merges"][:512 - 256]
    held_out = bpe["held_out"]
    assert characters["held_out_bytes"] == tokens["held_out_bytes"] == len(held_out.encode("utf-8"))
    assert tokens["held_out_tokens"] == round(bpe["tokens_per_byte"][512] * tokens["held_out_bytes"])
    differs = {"tokens": ("characters", "bpe"), "vocab_size": (None, 512)}
    defaults = {"schedule": lm_training.Config().schedule}  # the character run predates the field
    for key in characters["config"].keys() | tokens["config"].keys():
        pair = (characters["config"].get(key, defaults.get(key)), tokens["config"].get(key, defaults.get(key)))
        assert pair == differs.get(key, (pair[0], pair[0])), key
    assert characters["config"]["steps"] == 1200 and characters["device"] == tokens["device"] == "cpu"
    assert abs(tokens["seconds"] - characters["seconds"]) < 0.05 * characters["seconds"]
    text = page(TOKENS_PAGE)
    assert ("the merges of a vocabulary of 512, learned by the reference's `train_bpe` from the training 90% of "
            "the text") in text
    assert "then the same layers, widths, batch, learning rate and 1,200 steps, on a CPU, in the same wall time" in text


def test_chapter_8_a_block_of_bpe_tokens_holds_about_240_characters_and_only_the_vocabulary_rows_grow():
    """'A block of 128 tokens now holds about 240 characters instead of 128'; 'the embedding and the output
    layer grow from 76 rows to 512, the only parameters that change' (two tables of d_model columns each)."""
    characters, tokens = _bpe_runs()
    block = tokens["config"]["block"]
    assert block == characters["config"]["block"] == 128
    held = round(block / tokens["tokens_per_byte"], -1)  # ASCII: a byte is a character
    assert held == 240, block / tokens["tokens_per_byte"]
    assert (len(characters["vocab"]), tokens["vocab_size"]) == (76, 512)
    d_model = tokens["config"]["d_model"]
    assert tokens["parameters"] - characters["parameters"] == 2 * (512 - 76) * d_model
    text = page(TOKENS_PAGE)
    assert f"A block of {block} tokens now holds about {held:.0f} characters instead of {block}" in text
    assert "the embedding and the output layer grow from 76 rows to 512, the only parameters that change" in text


def test_chapter_8_bpe_model_is_worse_per_token_better_per_byte_in_the_same_time():
    """'Per token, the BPE model's loss is far larger: each of its tokens stands for about two characters, and
    it chooses among 512 of them. Per byte of text, it is the better model, and it got there in the same
    time'; the figure's alt text (steps 100 to 1200, the BPE curve below at the end); 'a few hundred thousand
    parameters'."""
    characters, tokens = _bpe_runs()
    assert tokens["val_loss"] > 1.5 * characters["val_loss"]
    assert round(1 / tokens["tokens_per_byte"]) == 2 and tokens["vocab_size"] == 512
    assert tokens["bits_per_byte"] < characters["bits_per_byte"]
    assert tokens["seconds"] <= characters["seconds"] * 1.05
    for run in (characters, tokens):
        steps = [e["step"] for e in run["evaluations"]]
        assert (steps[0], steps[-1]) == (100, 1200)
        assert 100_000 < run["parameters"] < 1_000_000
    last = [run["evaluations"][-1]["val_loss"] * run["held_out_tokens"] / run["held_out_bytes"]
            for run in (characters, tokens)]
    assert last[1] < last[0]
    text = page(TOKENS_PAGE)
    assert ("Per token, the BPE model's loss is far larger: each of its tokens stands for about two characters, "
            "and it chooses among 512 of them. Per byte of text, it is the better model, and it got there in the "
            "same time.") in text
    assert "the BPE curve lies below the character curve at the end" in text
    assert "the model's few hundred thousand parameters" in text


def test_chapter_8_question_5s_gpt_2_numbers_are_the_models():
    """'GPT-2's smallest model has d_model = 768 and the vocabulary of 50,257 tokens ... the model's 124
    million', from transformers' GPT-2 configuration and its parameters counted (the output layer tied to the
    embedding)."""
    from transformers import GPT2Config

    config = GPT2Config()
    d, layers, positions = config.n_embd, config.n_layer, config.n_positions
    assert (d, config.vocab_size) == (768, 50_257) and config.tie_word_embeddings
    layer = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    parameters = config.vocab_size * d + positions * d + layers * layer + 2 * d
    assert round(parameters, -6) == 124_000_000, parameters
    text = page(TOKENS_PAGE)
    assert "GPT-2's smallest model has $d_\\text{model} = 768$ and the vocabulary of 50,257 tokens" in text
    assert "what share of the model's 124 million is that" in text


def test_chapter_8_exercise_points_are_the_notebooks():
    notebook = json.loads((REPO / "notebooks" / "08_tokens" / "08_tokens.ipynb").read_text())
    points = {cell["metadata"]["nbgrader"]["grade_id"]: cell["metadata"]["nbgrader"]["points"]
              for cell in notebook["cells"] if cell["metadata"].get("nbgrader", {}).get("grade")}
    assert points == {"test_train_bpe": 6, "test_encode": 3, "test_decode": 2}
    text = page(TOKENS_PAGE)
    assert "(6 points, hard)" in text and "(3 points, medium)" in text and "(2 points, easy)" in text


@pytest.mark.parametrize(("author", "year"), [("Gage", "1994"), ("Sennrich", "2016"), ("Radford", "2019")])
def test_chapter_8_cites_the_listed_works(author, year):
    assert any(entry.startswith(f"- {author},") and f"({year})" in entry for entry in _entries())
    cited = re.search(rf"\b{author}(?: et al\.)? \({year}\)", page(TOKENS_PAGE))
    assert cited, f"chapter 8 does not cite {author} ({year})"


# ------------------------------------------------------------------------------------------ chapter 7


def test_chapter_7_quotes_the_sdpa_priority_order_of_the_pinned_torch():
    from torch.nn.attention import SDPBackend

    sentence = re.search(r"In torch (\d+\.\d+) the order is (.*?), as the private", page("07_attention_at_scale"))
    assert sentence, "chapter 7 no longer states the order of F.scaled_dot_product_attention's kernels"
    version, order = sentence.groups()
    assert torch.__version__.startswith(version + "."), \
        f"the page quotes torch {version}, the pin is {torch.__version__}"
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
    assert (f'chapter 07\'s plots of time and memory draw the run that '
            f'`make bench ARGS="--figures {figure}"`') in page("references")
    assert re.search(rf"^Figure {figure}: attention at scale", (BOOK / "benchmarks.md").read_text(), re.MULTILINE)


def test_gpt_is_2018_and_gpt_2_is_2019():
    entries = _entries()
    assert any("(2018)" in e and "Generative Pre-Training* (GPT)" in e for e in entries)
    assert any("(2019)" in e and "(GPT-2)" in e for e in entries)
    assert "GPT (Radford et al., 2018), GPT-2 (Radford et al., 2019)" in page("06_decoder_only")


def test_benchmark_figure_1_times_every_chapter():
    autograded = [re.search(r"of solved (\S+)", what).group(1) for what, *_ in measured_table(1) if "of solved" in what]
    assert autograded == nbgrader_course.chapters(REPO)


@pytest.mark.parametrize("term", ["HBM", "SRAM", "arithmetic intensity"])
def test_glossary_defines_the_terms_of_chapter_7_with_their_chinese_names(term):
    glossary = (BOOK / "glossary.md").read_text()
    definition = re.search(rf"^{re.escape(term)}\n  (.*)$", glossary, re.MULTILINE)
    assert definition and "{.language-zh}" in definition.group(1), f"glossary.md lacks {term} with its Chinese name"
    assert f"{{term}}`{term}`" in (BOOK / "07_attention_at_scale.md").read_text()
