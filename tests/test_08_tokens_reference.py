"""The chapter-8 reference is proven against other people's tokenizers: its encoding equals tiktoken's, built
from the same ranks, token for token on the whole of the course's text and on non-ASCII text; its merges equal
the BPE trainer of Hugging Face's ``tokenizers`` where no tie arises, and a slow test-only trainer's (which
counts every pair again after every merge) everywhere, ties included; and decoding undoes encoding on every
string."""

import json
from collections import Counter
from pathlib import Path

import pytest
import regex
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from autograde_tests.reference.tokens import PATTERN, decode, encode, token_bytes, train_bpe

TEXT = (Path(__file__).parents[1] / "autograde_tests" / "text" / "shakespeare.txt").read_text(encoding="utf-8")
END = "<|endoftext|>"
NON_ASCII = "naïve café, 東京で寿司🍣を食べた — «¿qué?» Ωμέγα 👩🏽‍🚀\u200d\t\r\n  end"


def tiktoken_encoding(merges, special_tokens=()) -> tiktoken.Encoding:
    """tiktoken's tokenizer with the reference's vocabulary: each token's bytes ranked by its id."""
    vocab = token_bytes(merges)
    ranks = {piece: i for i, piece in enumerate(vocab)}
    assert len(ranks) == len(vocab), "two tokens with the same bytes"
    special = {s: len(vocab) + j for j, s in enumerate(special_tokens)}
    return tiktoken.Encoding("course", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens=special)


@pytest.fixture(scope="module")
def shakespeare_merges():
    return train_bpe(TEXT, 1024, [END])


def test_encoding_equals_tiktokens_on_the_whole_text(shakespeare_merges):
    text = TEXT + END + TEXT[:5000]
    assert encode(text, shakespeare_merges, [END]) == tiktoken_encoding(shakespeare_merges, [END]).encode(
        text, allowed_special="all")


def test_encoding_equals_tiktokens_on_text_the_merges_never_saw(shakespeare_merges):
    expected = tiktoken_encoding(shakespeare_merges, [END]).encode(NON_ASCII + END, allowed_special="all")
    assert encode(NON_ASCII + END, shakespeare_merges, [END]) == expected


def test_a_vocabulary_counts_the_bytes_the_merges_and_the_special_tokens():
    merges = train_bpe(TEXT[:20000], 300, ["<a>", "<b>"])
    assert len(merges) == 300 - 256 - 2
    assert all(left < 256 + r and right < 256 + r for r, (left, right) in enumerate(merges))


def test_training_stops_when_every_piece_is_one_token():
    assert train_bpe("ab ab", 1000) == [(97, 98), (32, 256)]


def test_a_vocabulary_smaller_than_the_bytes_and_the_special_tokens_is_refused():
    with pytest.raises(ValueError, match="smaller than the 256 bytes"):
        train_bpe("abc", 256, ["<|end|>"])


def test_merges_never_cross_a_pre_token_boundary():
    # "a b" is the pieces "a" and " b": the pair (a, space) never occurs inside a piece.
    merges = train_bpe("a b" * 50, 260)
    assert (ord("a"), ord(" ")) not in merges
    assert merges[0] == (ord(" "), ord("b"))


def test_special_tokens_are_never_split_nor_merged():
    merges = train_bpe(f"x{END}x{END}" * 20, 300, [END])
    pieces = token_bytes(merges)
    assert not any(b"<|" in piece or b"|>" in piece for piece in pieces[256:])
    ids = encode(f"x{END}y", merges, [END])
    assert ids == [ord("x"), 256 + len(merges), ord("y")]


def test_the_longer_special_token_wins_where_two_could_match():
    special = ["<|a|>", "<|a|><|b|>"]
    assert encode("<|a|><|b|>", [], special) == [257]
    assert decode([257, 256], [], special) == "<|a|><|b|><|a|>"


def test_overlapping_pairs_all_count_and_merge_left_to_right():
    # "aaa" holds (a, a) twice, so it outnumbers " bc"'s pairs; merged, "aaa" is "aa" then "a".
    merges = train_bpe("aaa bc", 257)
    assert merges == [(97, 97)]
    assert encode("aaa", merges) == [256, 97]


# ---------------------------------------------------------------------- against other trainers


def slow_train(text: str, vocab_size: int, special_tokens=()) -> tuple[list[tuple[int, int]], bool]:
    """BPE as the chapter states it, counting every pair of every piece again before each merge; and
    whether any merge had to break a tie."""
    chunks = regex.split("|".join(map(regex.escape, special_tokens)), text) if special_tokens else [text]
    words = [list(piece.encode()) for chunk in chunks for piece in regex.findall(PATTERN, chunk)]
    merges, tied = [], False
    for new_id in range(256, vocab_size - len(special_tokens)):
        counts = Counter(pair for ids in words for pair in zip(ids, ids[1:]))
        if not counts:
            break
        best = min(counts, key=lambda pair: (-counts[pair], pair))
        tied |= sum(count == counts[best] for count in counts.values()) > 1
        merges.append(best)
        for ids in words:
            i = 0
            while i < len(ids) - 1:
                if (ids[i], ids[i + 1]) == best:
                    ids[i:i + 2] = [new_id]
                i += 1
    return merges, tied


texts = st.text(st.sampled_from("ab c\n'é🙂<|>"), max_size=60)


@settings(max_examples=150)
@given(text=texts, merges=st.integers(0, 20), special=st.sampled_from([[], ["<|>"], ["<|>", "é"]]))
def test_merges_equal_a_slow_trainers_ties_included(text, merges, special):
    vocab_size = 256 + merges + len(special)
    assert train_bpe(text, vocab_size, special) == slow_train(text, vocab_size, special)[0]


def gpt2_byte_chars() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte, which ``tokenizers``' ByteLevel writes merges in: printable
    Latin-1 bytes stand for themselves, the others for chr(256), chr(257), ... in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


@pytest.mark.parametrize("start, length, n_merges", [(0, 200_000, 40), (500_000, 100_000, 30)])
def test_merges_equal_hugging_faces_trainer_where_no_tie_arises(start, length, n_merges):
    text = TEXT[start:start + length]
    merges, tied = slow_train(text, 256 + n_merges)
    assert not tied, "a corpus for this test must need no tie-break"
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=256 + n_merges, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    chars = gpt2_byte_chars()
    theirs = [tuple(bytes(chars[c] for c in side) for side in pair)
              for pair in json.loads(tokenizer.to_str())["model"]["merges"]]
    vocab = token_bytes(train_bpe(text, 256 + n_merges))
    assert [(vocab[left], vocab[right]) for left, right in train_bpe(text, 256 + n_merges)] == theirs
    assert train_bpe(text, 256 + n_merges) == merges


# ---------------------------------------------------------------------- decoding


@settings(max_examples=200)
@given(text=st.text(max_size=80))
def test_decoding_undoes_encoding_on_every_string(text):
    merges = train_bpe(text * 3 + "🙂🙂 héllo", 300, ["<|end|>"])
    assert decode(encode(text, merges, ["<|end|>"]), merges, ["<|end|>"]) == text


@settings(max_examples=100)
@given(text=st.text(max_size=30), cut=st.integers(0, 40))
def test_decoding_ids_cut_inside_a_character_replaces_it_as_tiktoken_does(text, cut):
    merges = train_bpe("🙂 é " * 5 + text, 270)
    ids = encode(text, merges)[:cut]
    assert decode(ids, merges) == tiktoken_encoding(merges).decode(ids)


def test_decoding_an_unknown_id_is_refused():
    with pytest.raises(ValueError, match="not in the vocabulary of 257 tokens"):
        decode([257], [(97, 97)])
