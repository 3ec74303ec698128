"""Chapter 08_tokens: byte-level byte-pair encoding (Sennrich et al., 2016; bytes as GPT-2's, Radford et al., 2019).

Text becomes UTF-8 bytes, and every byte is a token of its own: ids 0 .. 255, so no text is ever unknown.
Training then repeats one step: count every pair of adjacent tokens, and make the most frequent pair a new
token. Merge i (counted from 0) makes token ``256 + i``. Encoding replays the merges on new text, the
earliest merge (the lowest rank) first; decoding joins the tokens' bytes and reads them as UTF-8.

Conventions, the chapter's and the notebook's:
    merges: list of pairs (left id, right id), in the order they were learned (rank order); merge i makes
        id 256 + i, whose bytes are its two tokens' bytes joined.
    special_tokens: strings such as "<|endoftext|>" that are never split and never merged; the j-th gets
        id 256 + len(merges) + j. ``vocab_size`` counts them: 256 bytes + the merges + the special tokens.
    Pre-tokenisation: training and encoding first cut the text with GPT-2's regex (``PATTERN``) into words,
        numbers, punctuation and spaces; pairs are counted, and merges made, inside one piece only.
    Counting: every adjacent pair of a piece counts, overlapping ones too ("aaa" holds (a, a) twice), and a
        piece that occurs c times adds c to each of its pairs.
    Ties: among the pairs counted most often, the one with the smallest (left id, right id) is merged.
    Merging a pair in a piece: left to right, each occurrence that does not overlap one already merged
        ("aaa" with (a, a) becomes "aa", "a").
"""

from collections import Counter, defaultdict
from collections.abc import Sequence

import regex

# GPT-2's pre-tokenisation (Radford et al., 2019): English contractions, letters with one optional leading
# space, digits likewise, other symbols likewise, then whitespace (a run of spaces gives all but its last to
# the run itself, so that the last one can lead the next word).
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def split_special(text: str, special_tokens: Sequence[str]) -> list[str]:
    """``text`` cut around its special tokens: the pieces between them and the special tokens themselves, in
    order (``"a<|end|>b"`` -> ``["a", "<|end|>", "b"]``). Where two special tokens could match at the same place,
    the longer one wins."""
    if not special_tokens:
        return [text]
    longest_first = sorted(special_tokens, key=len, reverse=True)
    return regex.split("(" + "|".join(regex.escape(s) for s in longest_first) + ")", text)


def merge(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """``ids`` with each occurrence of ``pair``, left to right and not overlapping, replaced by ``new_id``."""
    merged, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged


def train_bpe(text: str, vocab_size: int, special_tokens: Sequence[str] = ()) -> list[tuple[int, int]]:
    """The merges of a byte-level BPE vocabulary of ``vocab_size`` tokens learned from ``text``.

    Args:
        text: the training text. Its special tokens are cut out first: no merge ever crosses or enters one.
        vocab_size: 256 + the number of merges + len(special_tokens); training stops early when no pair
            is left to merge (every piece is one token).
        special_tokens: strings that are never split and never merged.

    Returns:
        merges: list of (left id, right id), rank order; merge i makes token 256 + i.
    """
    n_merges = vocab_size - 256 - len(special_tokens)
    if n_merges < 0:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the 256 bytes and "
                         f"{len(special_tokens)} special tokens")
    special = set(special_tokens)
    # Each distinct piece once, with how often it occurs: the pieces are what merges happen inside.
    counts = Counter(piece for chunk in split_special(text, special_tokens) if chunk not in special
                     for piece in regex.findall(PATTERN, chunk))
    words = [list(piece.encode("utf-8")) for piece in counts]  # each piece's tokens, bytes to begin with
    frequency = list(counts.values())
    pair_counts = Counter()  # (left, right) -> how often it occurs in all the text
    where = defaultdict(set)  # (left, right) -> the pieces it occurs in
    for w, ids in enumerate(words):
        for pair in zip(ids, ids[1:]):
            pair_counts[pair] += frequency[w]
            where[pair].add(w)
    merges = []
    for new_id in range(256, 256 + n_merges):
        if not pair_counts:
            break
        # The most frequent pair; of equals, the smallest (left, right).
        best = min(pair_counts, key=lambda pair: (-pair_counts[pair], pair))
        merges.append(best)
        # Only the pieces that hold the pair change: take their pairs out, merge, and count them again.
        for w in where.pop(best):
            for pair in zip(words[w], words[w][1:]):
                pair_counts[pair] -= frequency[w]
                if pair_counts[pair] == 0:
                    del pair_counts[pair]
            words[w] = merge(words[w], best, new_id)
            for pair in zip(words[w], words[w][1:]):
                pair_counts[pair] += frequency[w]
                where[pair].add(w)
    return merges


def encode(text: str, merges: Sequence[tuple[int, int]], special_tokens: Sequence[str] = ()) -> list[int]:
    """The token ids of ``text``: each special token is its id; each other piece (``PATTERN``) is its UTF-8
    bytes with the merges replayed, the lowest rank first, until no pair of the piece is a merge.

    Args:
        text: any string.
        merges: list of (left id, right id), rank order, as ``train_bpe`` returns them.
        special_tokens: as given to ``train_bpe``; the j-th is id 256 + len(merges) + j.

    Returns:
        ids: list of ints in 0 .. 256 + len(merges) + len(special_tokens) - 1.
    """
    rank = {tuple(pair): r for r, pair in enumerate(merges)}
    special_id = {s: 256 + len(merges) + j for j, s in enumerate(special_tokens)}
    cache: dict[str, list[int]] = {}  # a piece that comes again is encoded once
    ids = []
    for chunk in split_special(text, special_tokens):
        if chunk in special_id:
            ids.append(special_id[chunk])
            continue
        for piece in regex.findall(PATTERN, chunk):
            if piece not in cache:
                tokens = list(piece.encode("utf-8"))
                while len(tokens) > 1:
                    pair = min(zip(tokens, tokens[1:]), key=lambda p: rank.get(p, len(rank)))
                    if pair not in rank:
                        break  # no pair of the piece is a merge
                    tokens = merge(tokens, pair, 256 + rank[pair])
                cache[piece] = tokens
            ids.extend(cache[piece])
    return ids


def token_bytes(merges: Sequence[tuple[int, int]], special_tokens: Sequence[str] = ()) -> list[bytes]:
    """The bytes of every token, indexed by id: the 256 single bytes, each merge's two tokens joined, then the
    special tokens' UTF-8."""
    vocab = [bytes([b]) for b in range(256)]
    for left, right in merges:
        vocab.append(vocab[left] + vocab[right])
    return vocab + [s.encode("utf-8") for s in special_tokens]


def decode(ids: Sequence[int], merges: Sequence[tuple[int, int]], special_tokens: Sequence[str] = ()) -> str:
    """The text of token ``ids``: all their bytes joined first, then read as UTF-8 once (a character may span
    tokens); bytes that are not UTF-8 (ids cut in the middle of a character) become U+FFFD, as in tiktoken.

    Args:
        ids: ints in 0 .. 256 + len(merges) + len(special_tokens) - 1.
        merges, special_tokens: as ``encode`` takes them.

    Returns:
        the text; ``decode(encode(s, ...), ...) == s`` for every string s.
    """
    vocab = token_bytes(merges, special_tokens)
    for i in ids:
        if not 0 <= i < len(vocab):
            raise ValueError(f"token id {i} is not in the vocabulary of {len(vocab)} tokens")
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")
