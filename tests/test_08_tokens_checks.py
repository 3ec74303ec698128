"""The chapter-8 checks pass every correct way of writing a byte-level BPE and name every known mistake,
including two published tokenizers adapted to the course's contract (karpathy's minbpe and tiktoken's
educational BPE), whose trainers break ties by first occurrence.

The correct code here is the test's own, written as a learner would; each buggy variant is one edit of it
(``tests.variants``) or a short function of its own, and each test asserts the message that names it.
"""

import functools
import re

import pytest
import regex

from autograde_tests.checks.harness import seed_for
from autograde_tests.checks.tokens import (
    HIDDEN_DECODE,
    HIDDEN_ENCODE,
    VISIBLE_DECODE,
    VISIBLE_ENCODE,
    _cut,
    _decoding_inputs,
    _encoding_inputs,
    check_decode,
    check_encode,
    check_train_bpe,
)
from autograde_tests.grading.static_names import StaticNames
from autograde_tests.reference.tokens import decode as reference_decode
from autograde_tests.reference.tokens import encode as reference_encode
from autograde_tests.reference.tokens import token_bytes
from autograde_tests.reference.tokens import train_bpe as reference_train_bpe
from autograde_tests.remote import wire
from autograde_tests.remote.agent import Agent

from .conftest import connected, fails
from .variants import variant

pytestmark = pytest.mark.usefixtures("learner_side")  # each test in-process and through the wire


def fields(message: str | dict) -> dict:
    """A case's expected verdict as ``fails`` takes it: a regular expression for the problem, or one per field."""
    return message if isinstance(message, dict) else {"problem": message}

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def around_specials(text, special_tokens):
    """The text cut around its special tokens (kept, as chunks of their own), the longest first where two match."""
    if not special_tokens:
        return [text]
    alternatives = "|".join(regex.escape(s) for s in sorted(special_tokens, key=len, reverse=True))
    return regex.split(f"({alternatives})", text)


def words_of(text, special_tokens):
    """Every occurrence of every piece, as a list of its bytes."""
    return [list(piece.encode("utf-8")) for chunk in around_specials(text, special_tokens)
            if chunk not in special_tokens for piece in regex.findall(GPT2, chunk)]


def merge_pair(tokens, pair, new):
    out, i = [], 0
    while i < len(tokens):
        if i + 1 < len(tokens) and tokens[i] == pair[0] and tokens[i + 1] == pair[1]:
            out.append(new)
            i += 2
        else:
            out.append(tokens[i])
            i += 1
    return out


# ------------------------------------------------------------------------------- train_bpe: correct


def train_by_recounting(text, vocab_size, special_tokens=()):
    """Counts every pair of every occurrence of every piece again after each merge."""
    if vocab_size < 256 + len(special_tokens):
        raise ValueError("no room for the bytes and the special tokens")
    words = words_of(text, special_tokens)
    merges = []
    for new in range(256, vocab_size - len(special_tokens)):
        counts = {}
        for w in words:
            for pair in zip(w, w[1:]):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        words = [merge_pair(w, best, new) for w in words]
    return merges


def train_on_bytes(text, vocab_size, special_tokens=()):
    """Works on tuples of bytes objects, the distinct pieces weighted by their count; ids only at the end."""
    if vocab_size - 256 - len(special_tokens) < 0:
        raise ValueError(f"vocab_size {vocab_size} is too small")
    pieces = {}
    for w in words_of(text, special_tokens):
        key = tuple(bytes([b]) for b in w)
        pieces[key] = pieces.get(key, 0) + 1
    ids = {bytes([b]): b for b in range(256)}
    merges = []
    while len(merges) < vocab_size - 256 - len(special_tokens):
        counts = {}
        for piece, n in pieces.items():
            for pair in zip(piece, piece[1:]):
                counts[pair] = counts.get(pair, 0) + n
        if not counts:
            break
        left, right = min(counts, key=lambda p: (-counts[p], ids[p[0]], ids[p[1]]))
        merges.append((ids[left], ids[right]))
        ids[left + right] = 255 + len(merges)
        joined = {}
        for piece, n in pieces.items():
            out, i = [], 0
            while i < len(piece):
                if piece[i:i + 2] == (left, right):
                    out.append(left + right)
                    i += 2
                else:
                    out.append(piece[i])
                    i += 1
            joined[tuple(out)] = joined.get(tuple(out), 0) + n
        pieces = joined
    return merges


# ------------------------------------------------------------- published code, adapted to the contract


def minbpe_train(text, vocab_size, special_tokens=()):
    """karpathy/minbpe's RegexTokenizer.train (GPT-2's pattern), adapted: special tokens are cut out of the text
    and counted in vocab_size, training stops when no pair is left, the merges come back as a list. Like minbpe,
    it recounts into a fresh dict each round and takes max(stats, key=stats.get): ties go to the first pair seen."""
    ids = words_of(text, special_tokens)
    merges = {}
    for i in range(vocab_size - 256 - len(special_tokens)):
        stats = {}
        for chunk_ids in ids:
            for pair in zip(chunk_ids, chunk_ids[1:]):
                stats[pair] = stats.get(pair, 0) + 1
        if not stats:
            break
        pair = max(stats, key=stats.get)
        ids = [merge_pair(chunk_ids, pair, 256 + i) for chunk_ids in ids]
        merges[pair] = 256 + i
    return list(merges)


def minbpe_encode(text, merges, special_tokens=()):
    """minbpe's RegexTokenizer.encode(text, allowed_special="all"): per chunk, the pair of lowest merge index."""
    ranks = {tuple(pair): 256 + i for i, pair in enumerate(merges)}
    special = {s: 256 + len(merges) + j for j, s in enumerate(special_tokens)}
    out = []
    for part in around_specials(text, special_tokens):
        if part in special:
            out.append(special[part])
            continue
        for chunk in regex.findall(GPT2, part):
            chunk_ids = list(chunk.encode("utf-8"))
            while len(chunk_ids) >= 2:
                pair = min(zip(chunk_ids, chunk_ids[1:]), key=lambda p: ranks.get(p, float("inf")))
                if pair not in ranks:
                    break
                chunk_ids = merge_pair(chunk_ids, pair, ranks[pair])
            out.extend(chunk_ids)
    return out


def minbpe_decode(ids, merges, special_tokens=()):
    """minbpe's RegexTokenizer.decode: a vocab dict and the special tokens' inverse, errors="replace"."""
    vocab = {b: bytes([b]) for b in range(256)}
    for i, (left, right) in enumerate(merges):
        vocab[256 + i] = vocab[left] + vocab[right]
    inverse_special = {256 + len(merges) + j: s for j, s in enumerate(special_tokens)}
    parts = [vocab[i] if i in vocab else inverse_special[i].encode("utf-8") for i in ids]
    return b"".join(parts).decode("utf-8", errors="replace")


def educational_train(text, vocab_size, special_tokens=()):
    """tiktoken's _educational.bpe_train, adapted: it works on lists of bytes objects and ranks tokens by their
    bytes; here special tokens are cut out and counted, training stops when no pair is left, and each new
    token's two parts are recorded as ids. Its max() over a fresh Counter sends ties to the first pair seen."""
    ranks = {bytes([i]): i for i in range(256)}
    words = [[bytes([b]) for b in w] for w in words_of(text, special_tokens)]
    merges = []
    while len(ranks) < vocab_size - len(special_tokens):
        stats = {}
        for piece in words:
            for pair in zip(piece[:-1], piece[1:]):
                stats[pair] = stats.get(pair, 0) + 1
        if not stats:
            break
        most_common_pair = max(stats, key=lambda x: stats[x])
        merges.append((ranks[most_common_pair[0]], ranks[most_common_pair[1]]))
        ranks[most_common_pair[0] + most_common_pair[1]] = len(ranks)
        words = [merge_pair(piece, most_common_pair, most_common_pair[0] + most_common_pair[1]) for piece in words]
    return merges


def educational_encode(text, merges, special_tokens=()):
    """tiktoken's _educational.bpe_encode, adapted: ranks by token bytes (from the merges); in each piece, merge
    the one adjacent pair whose joined bytes rank lowest (the leftmost of equals), until none is a token."""
    ranks = {piece: i for i, piece in enumerate(token_bytes(merges))}
    out = []
    for part in around_specials(text, special_tokens):
        if part in special_tokens:
            out.append(256 + len(merges) + list(special_tokens).index(part))
            continue
        for word in regex.findall(GPT2, part):
            parts = [bytes([b]) for b in word.encode("utf-8")]
            while True:
                min_idx = min_rank = None
                for i, pair in enumerate(zip(parts[:-1], parts[1:])):
                    rank = ranks.get(pair[0] + pair[1])
                    if rank is not None and (min_rank is None or rank < min_rank):
                        min_idx, min_rank = i, rank
                if min_rank is None:
                    break
                parts = parts[:min_idx] + [parts[min_idx] + parts[min_idx + 1]] + parts[min_idx + 2:]
            out.extend(ranks[p] for p in parts)
    return out


def educational_decode(ids, merges, special_tokens=()):
    """tiktoken's _educational decode: the tokens' bytes joined, then decoded with errors="replace"."""
    decoder = dict(enumerate(token_bytes(merges, special_tokens)))
    return b"".join(decoder[token] for token in ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize("train_bpe", [reference_train_bpe, train_by_recounting, train_on_bytes])
@pytest.mark.parametrize("hidden", [False, True])
def test_train_bpe_check_passes_correct_variants(train_bpe, hidden, capsys):
    check_train_bpe(train_bpe, hidden=hidden)
    assert "✔ train_bpe" in capsys.readouterr().out


# ------------------------------------------------------------------------------ train_bpe: mistakes


def train_counting_like_str_count(text, vocab_size, special_tokens=()):
    """Skips a pair that overlaps the same pair just counted, as str.count does: "aaa" holds (a, a) once."""
    words = words_of(text, special_tokens)
    merges = []
    for new in range(256, vocab_size - len(special_tokens)):
        counts = {}
        for w in words:
            i = 0
            while i < len(w) - 1:
                counts[(w[i], w[i + 1])] = counts.get((w[i], w[i + 1]), 0) + 1
                i += 2 if i + 2 < len(w) and w[i] == w[i + 1] == w[i + 2] else 1
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        words = [merge_pair(w, best, new) for w in words]
    return merges


def merge_from_the_right(tokens, pair, new):
    out, i = [], len(tokens) - 1
    while i >= 0:
        if i > 0 and tokens[i - 1] == pair[0] and tokens[i] == pair[1]:
            out.append(new)
            i -= 2
        else:
            out.append(tokens[i])
            i -= 1
    return out[::-1]


def train_with_greatest_bytes_on_ties(text, vocab_size, special_tokens=()):
    """CS336's rule: of equally frequent pairs, the lexicographically greatest (left bytes, right bytes)."""
    words = words_of(text, special_tokens)
    vocab = [bytes([b]) for b in range(256)]
    merges = []
    for new in range(256, vocab_size - len(special_tokens)):
        counts = {}
        for w in words:
            for pair in zip(w, w[1:]):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        best = max(counts, key=lambda p: (counts[p], vocab[p[0]], vocab[p[1]]))
        merges.append(best)
        vocab.append(vocab[best[0]] + vocab[best[1]])
        words = [merge_pair(w, best, new) for w in words]
    return merges


def deleting_specials(text, special_tokens):
    return ["".join(chunk for chunk in around_specials(text, special_tokens) if chunk not in special_tokens)]


def train_returning_a_dict(text, vocab_size, special_tokens=()):
    return {pair: 256 + i for i, pair in enumerate(reference_train_bpe(text, vocab_size, special_tokens))}


def train_returning_bytes_pairs(text, vocab_size, special_tokens=()):
    vocab = token_bytes(reference_train_bpe(text, vocab_size, special_tokens))
    return [(vocab[left], vocab[right]) for left, right in reference_train_bpe(text, vocab_size, special_tokens)]


RECOUNT = train_by_recounting
COUNT = "for pair in zip(w, w[1:]):"
TIE = "min(counts, key=lambda p: (-counts[p], p))"


@pytest.mark.parametrize(
    "train_bpe, message",
    [
        (variant(RECOUNT, ("words = words_of(text, special_tokens)", "words = [list(c.encode()) for c in "
                           "around_specials(text, special_tokens) if c not in special_tokens]")),
         r"merges cross the pre-tokenisation"),
        (variant(RECOUNT, ("words = words_of(text, special_tokens)", "words = words_of(text, ())")),
         r"special tokens were not cut out of the training text"),
        (variant(RECOUNT, ("words = words_of(text, special_tokens)",
                           "words = words_of(deleting_specials(text, special_tokens)[0], ())"),
                 deleting_specials=deleting_specials),
         r"special tokens were deleted from the text, which joins the text on either side"),
        (variant(RECOUNT, ("range(256, vocab_size - len(special_tokens))", "range(256, vocab_size)")),
         r"too many merges: .* counts the special tokens too"),
        (variant(RECOUNT, ("range(256, vocab_size - len(special_tokens))",
                           "range(256, 256 + vocab_size - len(special_tokens))")),
         r"too many merges: .* counts the 256 byte tokens too"),
        (variant(RECOUNT, ("words = words_of(text, special_tokens)",
                           "words = [list(w) for w in dict.fromkeys(map(tuple, words_of(text, special_tokens)))]")),
         r"each distinct piece was counted once"),
        (variant(RECOUNT, (COUNT, "for pair in set(zip(w, w[1:])):")), r"pairs were counted once per piece \(a set"),
        (train_counting_like_str_count, r"overlapping pairs were counted once, as str.count counts"),
        (variant(RECOUNT, merge_pair=merge_from_the_right), r"a pair was merged from the right"),
        (variant(RECOUNT, merge_pair=variant(merge_pair, ("i += 2", "i += 1"))),
         r"the scan went on at the pair's right token"),
        (variant(RECOUNT, (TIE, "max(counts, key=lambda p: (counts[p], p))")),
         r"ties were broken towards the largest \(left id, right id\)"),
        (train_with_greatest_bytes_on_ties, r"ties were broken towards the lexicographically greatest bytes"),
        (minbpe_train, dict(problem=r"merge \d+ is .*, expected .*: (before any merge|after the .*) both pairs occur "
                                    r"\d+ times, so the tie was broken another way$",
                            hint=r"^of the pairs counted most often, merge the one with the smallest "
                                 r"\(left id, right id\)")),
        (educational_train, r"so the tie was broken another way"),
        (variant(RECOUNT, (COUNT, "for pair in zip(w, w[1:-1]):")),  # each piece's last pair left out
         dict(problem=r"merge \d+ is .*, which occurs \d+ times (before any merge|after the .*); the most frequent "
                      r"pair then is .*, \d+ times$", hint=r"^count every adjacent pair")),
        (variant(RECOUNT, ("if not counts:", "if len(merges) == 3:")),
         r"returned 3 merges, expected \d+: vocab_size \d+ is 256 bytes \+ \d+ merges \+ \d+ special tokens"),
        (train_returning_a_dict,
         dict(problem=r"should return a list of \(left id, right id\) pairs, got dict$", hint=r"^.*list\(")),
        (train_returning_bytes_pairs, r"pairs of ints, but it holds a tuple of bytes, bytes"),
    ],
)
def test_train_bpe_check_names_the_mistake(train_bpe, message, capsys):
    with fails(**fields(message)):
        check_train_bpe(train_bpe)
    assert "✔" not in capsys.readouterr().out


def test_training_past_the_end_of_the_text_is_named_with_the_early_stop():
    """A trainer that never stops early (it merges a pair counted zero times) is told training should have."""
    def never_stops(text, vocab_size, special_tokens=()):
        merges = reference_train_bpe(text, vocab_size, special_tokens)
        return merges + [(0, 0)] * (vocab_size - 256 - len(special_tokens) - len(merges))

    with fails(r"after \d+ merges every piece of this text is one token"):
        check_train_bpe(never_stops)


def test_a_vocabulary_too_small_for_the_bytes_and_special_tokens_must_be_refused():
    def makes_no_merges(text, vocab_size, special_tokens=()):
        return reference_train_bpe(text, max(vocab_size, 256 + len(special_tokens)), special_tokens)

    with fails(r"^returned a result when given vocab_size 257 with two special tokens .*; the notebook asks for a "
               r"ValueError$", hint="^check first", exercise="train_bpe"):
        check_train_bpe(makes_no_merges)


# ------------------------------------------------------------------------------ encode: correct


def encode_rank_by_rank(text, merges, special_tokens=()):
    """Every merge in rank order over the whole piece, one after the other: the same as lowest rank first."""
    out = []
    for chunk in around_specials(text, special_tokens):
        if chunk in special_tokens:
            out.append(256 + len(merges) + list(special_tokens).index(chunk))
            continue
        for piece in regex.findall(GPT2, chunk):
            tokens = list(piece.encode("utf-8"))
            for rank, pair in enumerate(merges):
                tokens = merge_pair(tokens, pair, 256 + rank)
            out += tokens
    return out


def encode_lowest_rank_first(text, merges, special_tokens=()):
    rank = {tuple(pair): r for r, pair in enumerate(merges)}
    out = []
    for chunk in around_specials(text, special_tokens):
        if chunk in special_tokens:
            out.append(256 + len(merges) + list(special_tokens).index(chunk))
            continue
        for piece in regex.findall(GPT2, chunk):
            tokens = list(piece.encode("utf-8"))
            while True:
                found = [p for p in zip(tokens, tokens[1:]) if p in rank]
                if not found:
                    break
                best = min(found, key=rank.get)
                tokens = merge_pair(tokens, best, 256 + rank[best])
            out += tokens
    return out


@pytest.mark.parametrize("encode", [reference_encode, encode_rank_by_rank, encode_lowest_rank_first, minbpe_encode,
                                    educational_encode])
@pytest.mark.parametrize("hidden", [False, True])
def test_encode_check_passes_correct_variants(encode, hidden, capsys):
    check_encode(encode, hidden=hidden)
    assert "✔ encode" in capsys.readouterr().out


# ------------------------------------------------------------------------------ encode: mistakes


def most_frequent_first(found, tokens, rank):
    """minbpe's training rule in encoding: of the piece's pairs that are merges, the most frequent in it."""
    counts = {}
    for pair in zip(tokens, tokens[1:]):
        if pair in rank:
            counts[pair] = counts.get(pair, 0) + 1
    return max(counts, key=counts.get)


LOWEST = encode_lowest_rank_first
BEST = "best = min(found, key=rank.get)"


@pytest.mark.parametrize(
    "encode, message",
    [
        (variant(LOWEST, ("regex.findall(GPT2, chunk)", "[chunk]")), r"no pre-tokenisation"),
        (variant(LOWEST, ("around_specials(text, special_tokens)", "[text]")),
         r"special tokens were not split out of the text"),
        (variant(LOWEST, ("256 + len(merges) + list(special_tokens).index(chunk)",
                          "256 + list(special_tokens).index(chunk)")), r"special tokens' ids start at 256"),
        (variant(LOWEST, (BEST, "best = found[0]")), r"merges were applied leftmost first"),
        (variant(LOWEST, (BEST, "best = max(found, key=rank.get)")), r"merges were applied last-learned first"),
        (variant(LOWEST, (BEST, "best = most_frequent_first(found, tokens, rank)"),
                 most_frequent_first=most_frequent_first), r"merges were chosen by how often their pair occurs"),
        (variant(LOWEST, merge_pair=merge_from_the_right), r"a pair was merged from the right"),
        (variant(LOWEST, merge_pair=variant(merge_pair, ("i += 2", "i += 1"))),
         r"the scan went on at the pair's right token"),
        (lambda text, merges, special_tokens=(): encode_rank_by_rank(text, merges[:-3], special_tokens),
         dict(problem=r"id \d+ is \d+ \(.*\), expected \d+ \(.*\) \(in the piece .*, whose ids are \[.*\]; \d+ ids, "
                      r"expected \d+\)$", hint=r"^split out the special tokens")),
        (lambda text, merges, special_tokens=(): reference_encode(text, merges, special_tokens)[:-1],
         r"id \d+ is nothing \(your ids end there\), expected"),
        (lambda text, merges, special_tokens=(): tuple(reference_encode(text, merges, special_tokens)),
         r"should return a list of ints \(token ids\), got tuple"),
        (lambda text, merges, special_tokens=(): [str(i) for i in reference_encode(text, merges, special_tokens)],
         r"should return a list of ints \(token ids\), but it holds str"),
    ],
)
def test_encode_check_names_the_mistake(encode, message, capsys):
    with fails(**fields(message)):
        check_encode(encode)
    assert "✔" not in capsys.readouterr().out


# ------------------------------------------------------------------------------ decode: correct


@functools.lru_cache
def vocabulary(merges, special_tokens):
    table = {b: bytes([b]) for b in range(256)}
    for i, (left, right) in enumerate(merges):
        table[256 + i] = table[left] + table[right]
    for j, s in enumerate(special_tokens):
        table[256 + len(merges) + j] = s.encode("utf-8")
    return table


def decode_with_a_cached_vocabulary(ids, merges, special_tokens=()):
    table = vocabulary(tuple(map(tuple, merges)), tuple(special_tokens))
    if any(i < 0 for i in ids):  # a negative index would read the list from its end
        raise ValueError("negative token id")
    return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")


def decode_into_a_bytearray(ids, merges, special_tokens=()):
    def spelled(i):  # a merge spelled out recursively
        if i < 256:
            return bytes([i])
        if i < 256 + len(merges):
            return spelled(merges[i - 256][0]) + spelled(merges[i - 256][1])
        return special_tokens[i - 256 - len(merges)].encode("utf-8")

    buffer = bytearray()
    for i in ids:
        buffer += spelled(i)
    return buffer.decode(errors="replace")


@pytest.mark.parametrize("decode", [reference_decode, decode_with_a_cached_vocabulary, decode_into_a_bytearray,
                                    minbpe_decode, educational_decode])
@pytest.mark.parametrize("hidden", [False, True])
def test_decode_check_passes_correct_variants(decode, hidden, capsys):
    check_decode(decode, hidden=hidden)
    assert "✔ decode" in capsys.readouterr().out


# ------------------------------------------------------------------------------ decode: mistakes


CACHED = decode_with_a_cached_vocabulary
JOINED = 'b"".join(table[i] for i in ids).decode("utf-8", errors="replace")'


def decode_right_then_left(ids, merges, special_tokens=()):
    return decode_with_a_cached_vocabulary(ids, [(right, left) for left, right in merges], special_tokens)


@pytest.mark.parametrize(
    "decode, message",
    [
        (variant(CACHED, (JOINED, '"".join(table[i].decode("utf-8", errors="replace") for i in ids)')),
         r"each token was decoded on its own"),
        (variant(CACHED, ('errors="replace"', 'errors="ignore"')), r"were dropped \(errors='ignore'\)"),
        (decode_right_then_left, r"a merge's bytes were joined right token first"),
        (variant(CACHED, ("table[i] for i in ids", "table.get(i, b'') for i in ids"), ("tuple(special_tokens)", "()")),
         r"the special tokens were dropped"),
        (lambda ids, merges, special_tokens=(): minbpe_decode(
            [i + len(merges) if 256 <= i < 256 + len(special_tokens) else i - len(special_tokens)
             if i >= 256 + len(special_tokens) else i for i in ids], merges, special_tokens),
         r"the special tokens were read at ids 256 \+ j, before the merges"),
        (variant(CACHED, ('errors="replace"', 'errors="strict"')),
         dict(problem=r"cut inside a character\); it decodes the same ids uncut$",
              hint=r"^decode the joined bytes with errors='replace'")),
        (variant(CACHED, ('.decode("utf-8", errors="replace")', "")), r"should return the text, a str, got bytes"),
        (variant(CACHED, (JOINED, f"({JOINED}).upper()")),
         r"the text differs from character \d+ on: got .*, expected .* \(\d+ characters, expected \d+\)"),
    ],
)
def test_decode_check_names_the_mistake(decode, message, capsys):
    with fails(**fields(message)):
        check_decode(decode)
    assert "✔" not in capsys.readouterr().out


def test_an_id_outside_the_vocabulary_must_be_refused_not_read_from_the_end():
    def reads_negative_ids(ids, merges, special_tokens=()):
        table = token_bytes(merges, special_tokens)
        return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")

    with fails(r"^returned a result when given the id -1, which a vocabulary of 258 tokens does not have; the "
               r"notebook asks for a ValueError", exercise="decode"):
        check_decode(reads_negative_ids)


def test_a_decode_that_raises_on_uncut_ids_too_is_not_told_about_the_cut():
    def raises(ids, merges, special_tokens=()):
        raise ValueError("no vocabulary")

    with fails(r"^raised ValueError: no vocabulary\n  when called with", exercise="decode") as raised:
        check_decode(raises)
    assert raised.value.raised == "ValueError"
    assert "errors='replace'" not in raised.value.problem + (raised.value.hint or "")


# --------------------------------------------------------------------------- the cases, and the libraries


def test_every_text_decode_returns_is_far_shorter_than_what_comes_back_from_a_kernel():
    for hidden, cases in ((False, VISIBLE_DECODE), (True, HIDDEN_DECODE)):
        for i, case in enumerate(cases):
            ids, merges = _decoding_inputs("decode", hidden, i, case)
            text = reference_decode(_cut(ids) if case.cut else ids, merges, case.special_tokens)
            assert len(text) < wire.MAX_TEXT // 4, (case, len(text))


def test_no_two_tokens_of_the_encode_and_decode_cases_spell_the_same_bytes():
    """tiktoken's encoding (and the educational one above) ranks a token by its bytes: fair only when they differ."""
    for name, both in (("encode", (VISIBLE_ENCODE, HIDDEN_ENCODE)), ("decode", (VISIBLE_DECODE, HIDDEN_DECODE))):
        for hidden, cases in zip((False, True), both):
            for i, case in enumerate(cases):
                vocab = token_bytes(_encoding_inputs(name, hidden, i, case)[1], case.special_tokens)
                assert len(set(vocab)) == len(vocab), case


def test_the_cases_exercise_what_the_contract_states():
    """Special tokens and none, cut ids and whole ones, non-ASCII text, in the hidden cases as in the visible."""
    for cases in (VISIBLE_ENCODE, HIDDEN_ENCODE, VISIBLE_DECODE, HIDDEN_DECODE):
        assert {bool(c.special_tokens) for c in cases} == {True, False}
        assert any(c.unseen and not c.unseen.isascii() for c in cases)
    assert {c.cut for c in VISIBLE_DECODE} == {c.cut for c in HIDDEN_DECODE} == {True, False}
    assert seed_for("encode", False, 0) != seed_for("encode", True, 0)


@pytest.mark.parametrize("check, source", [
    (check_train_bpe, "import tiktoken\ndef answer(text, vocab_size, special_tokens=()):\n"
                      "    return tiktoken.get_encoding('gpt2')"),
    (check_encode, "from tokenizers import Tokenizer\ndef answer(text, merges, special_tokens=()):\n"
                   "    return Tokenizer.from_str(text)"),
    (check_decode, "def answer(ids, merges, special_tokens=()):\n"
                   "    import minbpe\n    return minbpe.RegexTokenizer().decode(ids)"),
])
def test_a_tokenizer_library_fails_a_graded_run_by_the_source(check, source):
    """The grader's own reading of the source names the library (the sandbox hides it from the kernel too)."""
    namespace = {}
    exec(source, namespace)  # noqa: S102 (the test's own source)
    kernel = Agent({"answer": namespace["answer"]})
    graded = connected(kernel, static_names=StaticNames([source])).lookup("answer")
    library = re.escape(re.search(r"tiktoken|tokenizers|minbpe", source).group())
    with fails(rf"calls .*\(.*{library}.*\), which this exercise asks you to write yourself$",
               hint=r"^write it with Python's own"):
        check(graded)


def test_a_name_of_the_learners_own_that_holds_a_librarys_name_is_not_refused(capsys):
    source = ("def answer(ids, merges, special_tokens=()):\n    tokenizers_list = token_bytes(merges, special_tokens)\n"
              "    if any(not 0 <= i < len(tokenizers_list) for i in ids):\n        raise ValueError(ids)\n"
              "    return b''.join(tokenizers_list[i] for i in ids).decode('utf-8', errors='replace')")
    namespace = {"token_bytes": token_bytes}
    exec(source, namespace)  # noqa: S102 (the test's own source)
    kernel = Agent({"answer": namespace["answer"]})
    check_decode(connected(kernel, static_names=StaticNames([source])).lookup("answer"))
    assert "✔ decode" in capsys.readouterr().out
