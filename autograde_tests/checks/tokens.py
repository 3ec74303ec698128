"""Checks for chapter 08_tokens: ``train_bpe``, ``encode`` and ``decode`` (byte-level BPE).

The grader makes every input itself from the case's seed (``seed_for``): a handful of words drawn from the
case's alphabet, repeated with very unequal frequencies (so that some pairs tie and others do not), joined by
spaces, newlines and punctuation, with the case's special tokens in between. The merges that ``encode`` and
``decode`` are given are the reference's, learned from another text of the same words; the text to encode
also holds characters those merges never saw. Results are compared exactly: a tokenizer is right or it is
not. Every mistake below is the reference with one edit (``harness.edited``), so its message names what a
learner's code computes. Nothing here is a tensor: the checks run once per case, on the CPU, with no dtype.

The learner's own text comes back from a graded kernel cut at ``wire.MAX_TEXT`` characters, so every text
``decode`` must return is far shorter (``tests/test_08_tokens_checks.py`` holds it so).
"""

import random
from collections import Counter
from dataclasses import dataclass

import regex
import torch

from ..reference import tokens as ref
from ..remote.proxy import type_name
from .harness import (
    CheckFailed,
    Mistake,
    call,
    candidates,
    describe,
    edited,
    exception_name,
    fail,
    name_the_mistake,
    run_cases,
    seed_for,
)
from .how import forbid_written

# The libraries that would compute the answers; a graded kernel cannot import them either (``kernel_view``).
LIBRARIES = {
    "tiktoken": "tiktoken",
    "tokenizers": "Hugging Face's tokenizers",
    "transformers": "Hugging Face's transformers (its tokenizers)",
    "sentencepiece": "SentencePiece",
    "minbpe": "minbpe",
}
LIBRARY_HINT = "write it with Python's own str, bytes, lists and dicts, and the regex module for the pre-tokenisation."

# ------------------------------------------------------------------------------------------- inputs

WORDS = 8  # distinct words in a case's lexicon
SEPARATORS = (" ", " ", " ", " ", ", ", ".\n", "  ", "'s ", " ")  # "  " and "'s" meet GPT-2's pattern's rules
CUT = "€".encode("utf-8")[:2]  # the first two of the three bytes of a character: ids cut inside it


def _lexicon(rng: random.Random, alphabet: str) -> list[str]:
    """``WORDS`` distinct words of ``alphabet``: the two most frequent ones made to tell pair counts apart, a run
    of three ("aaa": a pair that overlaps itself) and two letters twice ("abab": a pair twice, apart), then
    random words of 1 to 6 characters."""
    words = [alphabet[0] * 3, alphabet[:2] * 2]
    while len(words) < WORDS:
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
        if word not in words:
            words.append(word)
    return words


def _text(rng: random.Random, lexicon: list[str], words: int, special_tokens: tuple[str, ...]) -> str:
    """``words`` words of ``lexicon``, the first ones far more often than the last (word k about 1/(k+1) as
    often as the first), joined by ``SEPARATORS``; now and then a special token right after a word, and half of
    those with no separator after it either ("ab<|end|>ba")."""
    weights = [1 / (k + 1) for k in range(len(lexicon))]
    parts = []
    for _ in range(words):
        parts.append(rng.choices(lexicon, weights)[0])
        if special_tokens and rng.random() < 0.2:
            parts.append(rng.choice(special_tokens))
            if rng.random() < 0.5:
                continue
        parts.append(rng.choice(SEPARATORS))
    return "".join(parts)


@dataclass(frozen=True)
class TrainCase:
    alphabet: str  # the characters of its words
    words: int  # how many words the training text holds
    vocab_size: int
    special_tokens: tuple[str, ...] = ()


# Runs of one letter ("aaa": overlapping pairs), many ties, special tokens, non-ASCII and emoji (2 to 4 bytes a
# character), digits, and vocabularies larger than the text allows (training stops early).
VISIBLE_TRAIN = [
    TrainCase("ab", 40, 270),
    TrainCase("abc", 60, 269, ("<|end|>",)),
    TrainCase("nié", 6, 400),
]
HIDDEN_TRAIN = [
    TrainCase("xyz", 80, 273, ("<|endoftext|>",)),
    TrainCase("ab1", 50, 267),
    TrainCase("éa🍣", 40, 273, ("<s>", "</s>")),
    TrainCase("qu", 5, 500, ("<|end|>", "<|end|><|end|>")),
    TrainCase("東京", 30, 271, ("<pad>",)),
]


def _training_text(name: str, hidden: bool, i: int, case) -> str:
    """Case ``i``'s training text (for ``encode`` and ``decode``, the text their merges are learned from)."""
    rng = random.Random(seed_for(name, hidden, i))
    return _text(rng, _lexicon(rng, case.alphabet), case.words, case.special_tokens)


@dataclass(frozen=True)
class EncodeCase:
    alphabet: str
    words: int  # how many words the text holds; its merges are learned from four times as many
    vocab_size: int  # of the merges it is given
    special_tokens: tuple[str, ...] = ()
    unseen: str = ""  # characters the merges never saw, in words of the text
    cut: bool = False  # decode only: ids cut inside a character, in the middle and at the end


VISIBLE_ENCODE = [
    EncodeCase("ab", 30, 276),
    EncodeCase("abc", 40, 273, ("<|end|>",), unseen="é€"),
]
HIDDEN_ENCODE = [
    EncodeCase("xyz", 50, 275, ("<|endoftext|>", "<pad>"), unseen="東🍣"),
    EncodeCase("ab1", 40, 268),
    EncodeCase("aé", 30, 271, ("<s>",), unseen="ß"),
    EncodeCase("qu", 25, 270, unseen="👩🏽‍🚀"),
]
VISIBLE_DECODE = [
    EncodeCase("ab", 30, 274, unseen="é"),
    EncodeCase("abc", 30, 273, ("<|end|>",), unseen="東", cut=True),
]
HIDDEN_DECODE = [
    EncodeCase("xyz", 40, 275, ("<|endoftext|>", "<pad>"), unseen="東🍣", cut=True),
    EncodeCase("ab1", 40, 285, unseen="ñ"),
    EncodeCase("aé", 30, 272, ("<s>",), unseen="🍣", cut=True),
    EncodeCase("qu", 25, 270, unseen="👩🏽‍🚀"),
]


def _encoding_inputs(name: str, hidden: bool, i: int, case: EncodeCase) -> tuple[str, list[tuple[int, int]]]:
    """Case ``i``'s text and the merges it is encoded with: the reference's, learned from four times as many
    words of the same lexicon. The text begins with two words of the case's unseen characters, the first with
    "'s" after it (a symbol there, such as "€", takes the apostrophe into its piece: "€'", "s"), and these two
    are words of its lexicon too."""
    rng = random.Random(seed_for(name, hidden, i))
    lexicon = _lexicon(rng, case.alphabet)
    merges = ref.train_bpe(_text(rng, lexicon, 4 * case.words, case.special_tokens), case.vocab_size,
                           case.special_tokens)
    unseen = [lexicon[0] + case.unseen + "'s", case.unseen + lexicon[1]] if case.unseen else []
    text = "".join(word + " " for word in unseen) + _text(rng, lexicon + unseen, case.words, case.special_tokens)
    return text, merges


def _decoding_inputs(name: str, hidden: bool, i: int, case: EncodeCase) -> tuple[list[int], list[tuple[int, int]]]:
    """Case ``i``'s ids and merges: the reference's encoding of the case's text (a ``cut`` case cuts them:
    ``_cut``)."""
    text, merges = _encoding_inputs(name, hidden, i, case)
    return ref.encode(text, merges, case.special_tokens), merges


def _cut(ids: list[int]) -> list[int]:
    """``ids`` with the first bytes of a character (``CUT``) in the middle and at the end."""
    middle = len(ids) // 2
    return ids[:middle] + list(CUT[:1]) + ids[middle:] + list(CUT)


# ------------------------------------------------------------------------------ results, compared


def _is_int(x) -> bool:
    return type(x) is int  # not a bool, not a tensor


def _expect_refused(name: str, fn, args: tuple, given: str, hint: str, accepted: tuple = (ValueError,)) -> None:
    """``fn(*args)`` must raise ValueError (or one of ``accepted``), as the notebook asks for an input it cannot
    honour (``given``), rather than return something made up."""
    try:
        fn(*args)
    except accepted:
        return
    except Exception as exc:  # the learner's code may raise anything
        fail(name, f"raised {exception_name(exc)} when given {given}; the notebook asks for a ValueError", hint)
    fail(name, f"returned a result when given {given}; the notebook asks for a ValueError", hint)


def _expect_merges(name: str, merges) -> list[tuple[int, int]]:
    """The learner's merges as a list of (int, int), or a failure that says what came back instead."""
    hint = ("return the merges in the order they were learned, [(left id, right id), ...], merge i making id "
            "256 + i (a dict {pair: new id} keeps that order: list(merges) gives its pairs).")
    if type(merges) is not list:
        fail(name, f"should return a list of (left id, right id) pairs, got {describe(merges)}", hint)
    for pair in merges:
        if not (type(pair) in (tuple, list) and len(pair) == 2 and all(map(_is_int, pair))):
            fail(name, f"should return a list of (left id, right id) pairs of ints, but it holds {_shown_item(pair)}",
                 hint)
    return [tuple(pair) for pair in merges]


def _expect_ids(name: str, ids) -> list[int]:
    hint = "return the token ids as a list of ints: [104, 258, ...]."
    if type(ids) is not list:
        fail(name, f"should return a list of ints (token ids), got {describe(ids)}", hint)
    for i in ids:
        if not _is_int(i):
            fail(name, f"should return a list of ints (token ids), but it holds {_shown_item(i)}", hint)
    return ids


def _shown_item(x) -> str:
    """An item of a learner's list, for a message, by its kinds ("str", "a tuple of bytes, bytes"): the same
    wherever the learner's code ran (what is not data stays in a graded kernel, known by its class's name)."""
    if type(x) in (tuple, list):
        kinds = ", ".join(type_name(item) for item in x[:4]) + (", ..." if len(x) > 4 else "")
        return f"a {type(x).__name__} of {kinds}" if x else f"an empty {type(x).__name__}"
    return type_name(x)


def _long(values: list) -> torch.LongTensor:
    """Ints (pairs too) as a LongTensor for the one matcher (``harness.matching_mistake``), exact. An int no
    tokenizer makes (negative, or beyond int64) becomes -1: it matches no mistake either."""
    flat = [x if 0 <= x < 2**62 else -1 for item in values for x in (item if isinstance(item, tuple) else (item,))]
    return torch.tensor(flat, dtype=torch.long).reshape(len(values), -1) if values else torch.zeros(0, dtype=torch.long)


def _code_points(text: str) -> torch.LongTensor:
    return torch.tensor([ord(c) for c in text], dtype=torch.long)


def _as(convert, mistaken):
    """Each mistake with its result turned into a tensor (None stays None: the mistake does not apply)."""
    for mistake, result in mistaken:
        yield mistake, None if result is None else convert(result)


def _token(pair_or_id, vocab: list[bytes]) -> str:
    """A token (or a pair) for a message, with its bytes: ``(97, 98) (b'a' + b'b')``."""
    shown = lambda i: repr(vocab[i]) if 0 <= i < len(vocab) else "not a token yet"
    if isinstance(pair_or_id, tuple):
        return f"{pair_or_id} ({shown(pair_or_id[0])} + {shown(pair_or_id[1])})"
    return f"{pair_or_id} ({shown(pair_or_id)})"


# ------------------------------------------------------------------------------------------ train_bpe


def _merged_right_to_left(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """``ref.merge`` scanning from the right: "aaa" with (a, a) becomes "a", "aa"."""
    return ref.merge(ids[::-1], pair[::-1], new_id)[::-1]


_merged_keeping_the_right_token = edited(ref.merge, ("i += 2", "i += 1"))  # "ab" -> [ab, b]; "aaa" -> [aa, aa, a]


def _distinct_pairs(ids: list[int], following: list[int]) -> set[tuple[int, int]]:
    """A piece's pairs as a set: each pair once, however often it occurs in the piece."""
    return set(zip(ids, following))


def _pairs_without_overlaps(ids: list[int], following: list[int]) -> list[tuple[int, int]]:
    """A piece's pairs counted as ``str.count`` counts: an occurrence that overlaps the previous occurrence of the
    same pair is skipped ("aaa" holds (a, a) once, "aaaa" twice)."""
    kept, last = [], {}
    for k, pair in enumerate(zip(ids, following)):
        if last.get(pair) != k - 1:
            kept.append(pair)
            last[pair] = k
    return kept


def _greatest_bytes(pair_counts: Counter, merges: list[tuple[int, int]]) -> tuple[int, int]:
    """Of the most frequent pairs, the one whose bytes (left, then right) are lexicographically greatest."""
    vocab = ref.token_bytes(merges)
    return max(pair_counts, key=lambda pair: (pair_counts[pair], vocab[pair[0]], vocab[pair[1]]))


def _without_special_tokens(text: str, special_tokens) -> str:
    """``text`` with its special tokens deleted: the text on either side of one becomes one."""
    return "".join(chunk for chunk in ref.split_special(text, special_tokens) if chunk not in special_tokens)


def _trainer(*changes: tuple[str, str], **names):
    """The reference's trainer with ``changes`` made to its source and ``names`` in place of its helpers."""
    return edited(ref.train_bpe, *changes, **names)


PIECES = "split_special(text, special_tokens) if chunk not in special"
BEST = "min(pair_counts, key=lambda pair: (-pair_counts[pair], pair))"
TIE_RULE = ("of the pairs counted most often, merge the one with the smallest (left id, right id): "
            "min(counts, key=lambda pair: (-counts[pair], pair)).")

TRAIN_MISTAKES = [
    Mistake(
        "merges cross the pre-tokenisation: pairs were counted over the whole text, not inside each piece of "
        "GPT-2's pattern, so a merge can join a word to the space or punctuation around it",
        "cut the text with regex.findall(PATTERN, text) first, count pairs inside each piece only, and merge "
        "inside each piece.",
        _trainer(("regex.findall(PATTERN, chunk)", "[chunk]")),
    ),
    Mistake(
        "the special tokens were not cut out of the training text: their characters were counted, and merges "
        "enter them (such as '<' + '|')",
        "split the text around the special tokens first (regex.split with the escaped tokens in a group) and "
        "train on the chunks between them only.",
        _trainer((PIECES, "[text]")),
    ),
    Mistake(
        "the special tokens were deleted from the text, which joins the text on either side of each into one "
        "piece: merges then cross where a special token stood",
        "split the text around the special tokens and count each chunk between them on its own: a special "
        "token is a boundary no merge crosses.",
        _trainer((PIECES, "[_without_special_tokens(text, special_tokens)]"),
                 _without_special_tokens=_without_special_tokens),
    ),
    Mistake(
        "too many merges: vocab_size was taken as 256 + the merges, but it counts the special tokens too",
        "make vocab_size - 256 - len(special_tokens) merges: the vocabulary is the 256 bytes, the merges and "
        "the special tokens.",
        _trainer(("n_merges = vocab_size - 256 - len(special_tokens)", "n_merges = vocab_size - 256")),
    ),
    Mistake(
        "too many merges: vocab_size was taken as the merges (and special tokens) alone, but it counts the 256 "
        "byte tokens too",
        "make vocab_size - 256 - len(special_tokens) merges: ids 0 .. 255 are the bytes, which are part of the "
        "vocabulary.",
        _trainer(("n_merges = vocab_size - 256 - len(special_tokens)", "n_merges = vocab_size - len(special_tokens)")),
    ),
    Mistake(
        "each distinct piece was counted once: a word that occurs 10 times adds 1 to its pairs, not 10",
        "count the pieces (collections.Counter over the pieces) and add a piece's count to each of its pairs, "
        "or count the pairs of every occurrence of a piece.",
        _trainer(("frequency = list(counts.values())", "frequency = [1] * len(counts)")),
    ),
    Mistake(
        "pairs were counted once per piece (a set of its pairs): a pair that occurs twice in a word, as in "
        "'abab', counts once",
        "count every adjacent pair of a piece, with repeats: for pair in zip(ids, ids[1:]): counts[pair] += "
        "frequency.",
        _trainer(zip=_distinct_pairs),
    ),
    Mistake(
        "overlapping pairs were counted once, as str.count counts: 'aaa' holds (a, a) twice (positions 0 and 1), "
        "not once",
        "count every adjacent pair: zip(ids, ids[1:]) yields (a, a) twice for 'aaa'; only merging skips "
        "overlaps.",
        _trainer(zip=_pairs_without_overlaps),
    ),
    Mistake(
        "a pair was merged from the right: 'aaa' with (a, a) became 'a', 'aa' instead of 'aa', 'a'",
        "scan each piece from the left; after merging at position i, go on at i + 2.",
        _trainer(merge=_merged_right_to_left),
    ),
    Mistake(
        "after merging a pair, the scan went on at the pair's right token instead of after it: that token is "
        "kept too ('ab' becomes 'ab', 'b'), and 'aaa' merges twice",
        "after merging the pair at position i, go on at i + 2; when it does not match, append ids[i] and go on "
        "at i + 1.",
        _trainer(merge=_merged_keeping_the_right_token),
    ),
    Mistake(
        "ties were broken towards the largest (left id, right id): of pairs counted equally often, yours merges "
        "the largest",
        TIE_RULE,
        _trainer((BEST, "max(pair_counts, key=lambda pair: (pair_counts[pair], pair))")),
    ),
    Mistake(
        "ties were broken towards the lexicographically greatest bytes (as Stanford CS336's assignment asks): "
        "this course breaks them towards the smallest ids",
        TIE_RULE,
        _trainer((BEST, "_greatest_bytes(pair_counts, merges)"), _greatest_bytes=_greatest_bytes),
    ),
]


def _pair_counts(text: str, special_tokens, merges: list[tuple[int, int]]) -> Counter:
    """How often each pair occurs in ``text`` once ``merges`` are made: what training counts before the next."""
    counts = Counter()
    for chunk in ref.split_special(text, special_tokens):
        if chunk in special_tokens:
            continue
        for piece in regex.findall(ref.PATTERN, chunk):
            ids = list(piece.encode("utf-8"))
            for rank, pair in enumerate(merges):
                ids = ref.merge(ids, pair, 256 + rank)
            counts.update(zip(ids, ids[1:]))
    return counts


def _first_different_merge(name: str, text: str, case: TrainCase, got: list, expected: list) -> None:
    """Fail at the first merge that differs from the reference's: a tie broken another way when the two pairs are
    counted equally often after the merges before it, else a count gone wrong, with both counts."""
    k = next((k for k, (a, b) in enumerate(zip(got, expected)) if a != b), None)
    vocab = ref.token_bytes(expected)
    if k is None:
        n = len(expected)
        fail(name, f"returned {len(got)} merges, expected {n}: vocab_size {case.vocab_size} is 256 bytes + "
             f"{case.vocab_size - 256 - len(case.special_tokens)} merges + {len(case.special_tokens)} special tokens"
             + (f", and after {n} merges every piece of this text is one token" if n < case.vocab_size - 256
                - len(case.special_tokens) else ""),
             "make vocab_size - 256 - len(special_tokens) merges, and stop early when no pair is left to merge.")
    counts = _pair_counts(text, case.special_tokens, expected[:k])
    mine, best = _token(got[k], vocab), _token(expected[k], vocab)
    when = ("before any merge" if k == 0 else "after the merge before it" if k == 1 else
            f"after the {k} merges before it")
    if counts[got[k]] == counts[expected[k]]:
        fail(name, f"merge {k} is {mine}, expected {best}: {when} both pairs occur {counts[expected[k]]} times, so "
             "the tie was broken another way", TIE_RULE)
    fail(name, f"merge {k} is {mine}, which occurs {counts[got[k]]} times {when}; the most frequent pair then is "
         f"{best}, {counts[expected[k]]} times",
         "count every adjacent pair inside each piece (overlapping ones too), times how often the piece occurs, "
         "merge the most frequent, and count again.")


def check_train_bpe(train_bpe, hidden: bool = False) -> None:
    """Check a learner's ``train_bpe(text, vocab_size, special_tokens=()) -> merges``: exactly the reference's."""
    name = "train_bpe"
    cases = HIDDEN_TRAIN if hidden else VISIBLE_TRAIN

    def check_case(i: int, case: TrainCase, device, dtype) -> None:
        text = _training_text(name, hidden, i, case)
        expected = ref.train_bpe(text, case.vocab_size, case.special_tokens)
        specials = [list(case.special_tokens)] if case.special_tokens else []  # none: the default
        merges = _expect_merges(name, call(name, train_bpe, text, case.vocab_size, *specials))
        if merges != expected:
            mistaken = candidates(TRAIN_MISTAKES, text, case.vocab_size, case.special_tokens)
            name_the_mistake(name, "the merges", _long(merges), _long(expected), _as(_long, mistaken), exact=True,
                             otherwise=lambda: _first_different_merge(name, text, case, merges, expected))

    def too_small() -> None:
        _expect_refused(name, train_bpe, ("ab ab", 257, ["<s>", "</s>"]), "vocab_size 257 with two special tokens "
                        "(256 bytes + 2 special tokens need 258)",
                        "check first: if vocab_size < 256 + len(special_tokens), raise ValueError(...).")

    forbid_written(name, train_bpe, LIBRARIES, LIBRARY_HINT, modules=True)
    run_cases(name, cases, check_case, after=too_small, dtypes=())


# --------------------------------------------------------------------------------------------- encode


def _encoder(*changes: tuple[str, str], **names):
    return edited(ref.encode, *changes, **names)


def _most_frequent_merge(tokens: list[int], rank: dict) -> tuple[int, int] | None:
    """Of the piece's pairs that are merges, the one that occurs most often in it (the first of equals)."""
    counts = Counter(pair for pair in zip(tokens, tokens[1:]) if pair in rank)
    return max(counts, key=counts.get, default=None)


LOWEST_RANK = "min(zip(tokens, tokens[1:]), key=lambda p: rank.get(p, len(rank)))"
ORDER_HINT = ("in each piece, find the pair whose merge was learned first (the lowest rank), merge it everywhere "
              "in the piece, and repeat until no pair of the piece is a merge.")

ENCODE_MISTAKES = [
    Mistake(
        "no pre-tokenisation: merges were applied across the whole text, not inside each piece of GPT-2's "
        "pattern, so tokens join words to the spaces and punctuation around them",
        "cut the text with regex.findall(PATTERN, text) and encode each piece on its own, as training did.",
        _encoder(("regex.findall(PATTERN, chunk)", "[chunk]")),
    ),
    Mistake(
        "the special tokens were not split out of the text: each was encoded as its bytes (and merges), not as "
        "its own id",
        "split the text around the special tokens first (regex.split with the escaped tokens in a group); a "
        "special token is one id, the rest is encoded piece by piece.",
        _encoder(("split_special(text, special_tokens)", "[text]")),
    ),
    Mistake(
        "the special tokens' ids start at 256, where the merges' ids are: the j-th is 256 + len(merges) + j",
        "the ids are the 256 bytes, then one per merge, then the special tokens: special token j is "
        "256 + len(merges) + j.",
        _encoder(("{s: 256 + len(merges) + j", "{s: 256 + j")),
    ),
    Mistake(
        "merges were applied leftmost first: the first pair of a piece that is a merge was merged, not the "
        "one learned first (lowest rank)",
        ORDER_HINT,
        _encoder((LOWEST_RANK, "next((p for p in zip(tokens, tokens[1:]) if p in rank), None)")),
    ),
    Mistake(
        "merges were applied last-learned first (highest rank): the merges learned later build on the earlier "
        "ones, so the earliest must come first",
        ORDER_HINT,
        _encoder((LOWEST_RANK, "min(zip(tokens, tokens[1:]), key=lambda p: -rank.get(p, -1))")),
    ),
    Mistake(
        "merges were chosen by how often their pair occurs in the piece being encoded, as in training; encoding "
        "follows the order the merges were learned in (their rank)",
        ORDER_HINT,
        _encoder((LOWEST_RANK, "_most_frequent_merge(tokens, rank)"), _most_frequent_merge=_most_frequent_merge),
    ),
    Mistake(
        "a pair was merged from the right: 'aaa' with (a, a) became 'a', 'aa' instead of 'aa', 'a'",
        "scan each piece from the left; after merging at position i, go on at i + 2.",
        _encoder(merge=_merged_right_to_left),
    ),
    Mistake(
        "after merging a pair, the scan went on at the pair's right token instead of after it: that token is "
        "kept too ('ab' becomes 'ab', 'b')",
        "after merging the pair at position i, go on at i + 2; when it does not match, append ids[i] and go on "
        "at i + 1.",
        _encoder(merge=_merged_keeping_the_right_token),
    ),
]


def _pieces(text: str, merges: list, special_tokens) -> list[tuple[str, int]]:
    """The reference's encoding, piece by piece: each piece (a special token too) and how many ids it has."""
    pieces = []
    for chunk in ref.split_special(text, special_tokens):
        for piece in [chunk] if chunk in special_tokens else regex.findall(ref.PATTERN, chunk):
            pieces.append((piece, len(ref.encode(piece, merges, special_tokens))))
    return pieces


def _first_different_id(name: str, text: str, merges: list, case: EncodeCase, got: list, expected: list) -> None:
    """Fail at the first id that differs from the reference's, naming the piece of the text it belongs to."""
    k = next((k for k, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    start = 0
    for piece, n in _pieces(text, merges, case.special_tokens):
        if start + n > k:
            break
        start += n
    vocab = ref.token_bytes(merges, case.special_tokens)
    where = f"in the piece {piece!r}, whose ids are {expected[start:start + n]}" if k < len(expected) else "at the end"
    mine = _token(got[k], vocab) if k < len(got) else "nothing (your ids end there)"
    fail(name, f"id {k} is {mine}, expected {_token(expected[k], vocab) if k < len(expected) else 'nothing'} "
         f"({where}; {len(got)} ids, expected {len(expected)})",
         "split out the special tokens, cut the rest with regex.findall(PATTERN, chunk), and in each piece merge "
         "the pair of lowest rank, again and again, until no pair of the piece is a merge.")


def check_encode(encode, hidden: bool = False) -> None:
    """Check a learner's ``encode(text, merges, special_tokens=()) -> ids``: exactly the reference's ids."""
    name = "encode"
    cases = HIDDEN_ENCODE if hidden else VISIBLE_ENCODE

    def check_case(i: int, case: EncodeCase, device, dtype) -> None:
        text, merges = _encoding_inputs(name, hidden, i, case)
        expected = ref.encode(text, merges, case.special_tokens)
        specials = [list(case.special_tokens)] if case.special_tokens else []
        ids = _expect_ids(name, call(name, encode, text, list(merges), *specials))
        if ids != expected:
            mistaken = candidates(ENCODE_MISTAKES, text, merges, case.special_tokens)
            name_the_mistake(name, "the ids", _long(ids), _long(expected), _as(_long, mistaken), exact=True,
                             otherwise=lambda: _first_different_id(name, text, merges, case, ids, expected))

    forbid_written(name, encode, LIBRARIES, LIBRARY_HINT, modules=True)
    run_cases(name, cases, check_case, dtypes=())


# --------------------------------------------------------------------------------------------- decode


def _decoder(*changes: tuple[str, str], **names):
    return edited(ref.decode, *changes, **names)


def _vocabulary(*changes: tuple[str, str]):
    """A decoder whose table of token bytes (``ref.token_bytes``) is made with ``changes``."""
    return _decoder(token_bytes=edited(ref.token_bytes, *changes))


JOIN_ONCE = 'b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")'
SPECIALS = 'vocab + [s.encode("utf-8") for s in special_tokens]'

DECODE_MISTAKES = [
    Mistake(
        "each token was decoded on its own: a character whose bytes are split between tokens became one U+FFFD "
        "(�) per token",
        "join the bytes of all the tokens first, then decode once: b''.join(...).decode('utf-8', "
        "errors='replace').",
        _decoder((JOIN_ONCE, '"".join(vocab[i].decode("utf-8", errors="replace") for i in ids)')),
    ),
    Mistake(
        "bytes that are not UTF-8 (ids cut inside a character) were dropped (errors='ignore'): they should each "
        "show as U+FFFD (�)",
        "decode with errors='replace', as tiktoken does: the text then shows where the ids were cut.",
        _decoder(('errors="replace"', 'errors="ignore"')),
    ),
    Mistake(
        "a merge's bytes were joined right token first: merge (left, right) is the bytes of left, then of right",
        "build the table in rank order: vocab[256 + i] = vocab[left] + vocab[right].",
        _vocabulary(("vocab[left] + vocab[right]", "vocab[right] + vocab[left]")),
    ),
    Mistake(
        "the special tokens were dropped: their ids should decode to their text",
        "special token j is id 256 + len(merges) + j and decodes to its own string: its UTF-8 bytes.",
        _vocabulary((SPECIALS, 'vocab + [b"" for s in special_tokens]')),
    ),
    Mistake(
        "the special tokens were read at ids 256 + j, before the merges: they come after them, at "
        "256 + len(merges) + j",
        "the ids are the 256 bytes, then one per merge, then the special tokens: special token j is "
        "256 + len(merges) + j.",
        _vocabulary((SPECIALS, 'vocab[:256] + [s.encode("utf-8") for s in special_tokens] + vocab[256:]')),
    ),
]


def _first_different_character(name: str, got: str, expected: str) -> None:
    """Fail at the first character that differs from the reference's text, with a few of the text's own."""
    k = next((k for k, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    fail(name, f"the text differs from character {k} on: got {got[k:k + 12]!r}, expected {expected[k:k + 12]!r} "
         f"({len(got)} characters, expected {len(expected)})",
         "join the bytes of all the tokens (a merge's bytes are its left token's then its right token's; special "
         "token j is id 256 + len(merges) + j), then decode once with errors='replace'.")


def _fail_if_only_cut_ids_raise(name: str, failure: CheckFailed, decode, whole: list, merges: list,
                                specials: list) -> None:
    """The learner's decode raised on cut ids: when it decodes the same ids uncut, the cut is why (strict
    decoding), and the failure says so. Raised there by any exception (through a graded kernel one may come
    back under another name), so the cause is told by the uncut run, not by the exception's name."""
    if failure.raised is None:
        return  # not an exception of the learner's code: nothing to tell apart
    try:
        call(name, decode, list(whole), list(merges), *specials)
    except CheckFailed:
        return  # it fails on uncut ids too: the cut is not the cause
    fail(name, f"raised {failure.raised}: {failure.exception}, on ids whose bytes are not all UTF-8 "
         "(they are cut inside a character); it decodes the same ids uncut",
         "decode the joined bytes with errors='replace' (strict decoding raises "
         "UnicodeDecodeError): each broken character becomes U+FFFD (�), as in tiktoken.")


def check_decode(decode, hidden: bool = False) -> None:
    """Check a learner's ``decode(ids, merges, special_tokens=()) -> str``: exactly the reference's text."""
    name = "decode"
    cases = HIDDEN_DECODE if hidden else VISIBLE_DECODE

    def check_case(i: int, case: EncodeCase, device, dtype) -> None:
        whole, merges = _decoding_inputs(name, hidden, i, case)
        ids = _cut(whole) if case.cut else whole
        expected = ref.decode(ids, merges, case.special_tokens)
        specials = [list(case.special_tokens)] if case.special_tokens else []
        try:
            text = call(name, decode, list(ids), list(merges), *specials)
        except CheckFailed as failure:
            if case.cut:
                _fail_if_only_cut_ids_raise(name, failure, decode, whole, merges, specials)
            raise
        if type(text) is not str:
            fail(name, f"should return the text, a str, got {describe(text)}",
                 "join the tokens' bytes and return bytes.decode('utf-8', errors='replace'), not the bytes.")
        if text != expected:
            mistaken = candidates(DECODE_MISTAKES, ids, merges, case.special_tokens)
            name_the_mistake(name, "the text", _code_points(text), _code_points(expected), _as(_code_points, mistaken),
                             exact=True, otherwise=lambda: _first_different_character(name, text, expected))

    def unknown_ids() -> None:
        # An IndexError or KeyError from looking the id up refuses it too: what must not happen is a made-up text.
        for ids in ([97, 258], [-1]):
            _expect_refused(name, decode, (ids, [(97, 98), (256, 99)]), f"the id {ids[-1]}, which a vocabulary of 258 "
                            "tokens does not have", "check every id first: if not 0 <= i < len(vocab), raise "
                            "ValueError(...) (a negative index would read a token from the end of a list).",
                            accepted=(ValueError, LookupError))

    forbid_written(name, decode, LIBRARIES, LIBRARY_HINT, modules=True)
    run_cases(name, cases, check_case, after=unknown_ids, dtypes=())
