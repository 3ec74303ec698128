"""Style: a priority queue of pairs with stale entries skipped (as the Rust trainers do), pieces as lists kept
in place, an encoder memoised with functools.lru_cache and a decoder that writes into one bytearray."""

import functools
import heapq
from collections import Counter, defaultdict

import regex

GPT2 = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def _chunks(text, special_tokens):
    """Pieces of text between special tokens, and the special tokens, in order (the longest one first)."""
    if not special_tokens:
        return [text]
    alternatives = "|".join(regex.escape(s) for s in sorted(special_tokens, key=len, reverse=True))
    return regex.split(f"({alternatives})", text)


def _replace(ids, pair, new):
    i = 0
    while i < len(ids) - 1:
        if ids[i] == pair[0] and ids[i + 1] == pair[1]:
            ids[i:i + 2] = [new]
        i += 1


def train_bpe(text, vocab_size, special_tokens=()):
    wanted = vocab_size - 256 - len(special_tokens)
    if wanted < 0:
        raise ValueError("vocab_size leaves no room for the bytes and the special tokens")
    words = Counter(m.group() for c in _chunks(text, special_tokens) if c not in special_tokens
                    for m in GPT2.finditer(c))
    pieces = [list(w.encode("utf-8")) for w in words]
    times = list(words.values())
    count, holders = Counter(), defaultdict(set)
    for k, ids in enumerate(pieces):
        for pair in zip(ids, ids[1:]):
            count[pair] += times[k]
            holders[pair].add(k)
    heap = [(-n, pair) for pair, n in count.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < wanted and heap:
        n, pair = heapq.heappop(heap)
        if count.get(pair, 0) != -n or n == 0:
            continue  # stale: the pair's count changed since this entry was pushed
        new = 256 + len(merges)
        merges.append(pair)
        touched = Counter()
        for k in holders.pop(pair, ()):
            ids = pieces[k]
            for p in zip(ids, ids[1:]):
                count[p] -= times[k]
                touched[p] += 1
            _replace(ids, pair, new)
            for p in zip(ids, ids[1:]):
                count[p] += times[k]
                holders[p].add(k)
                touched[p] += 1
        for p in touched:
            if count[p] > 0:
                heapq.heappush(heap, (-count[p], p))
            else:
                count.pop(p, None)
    return merges


def encode(text, merges, special_tokens=()):
    rank = {(a, b): r for r, (a, b) in enumerate(merges)}
    first_special = 256 + len(merges)

    @functools.lru_cache(maxsize=None)
    def piece_ids(piece):
        ids = list(piece.encode("utf-8"))
        while True:
            ranked = [(rank[p], p) for p in zip(ids, ids[1:]) if p in rank]
            if not ranked:
                return tuple(ids)
            r, pair = min(ranked)
            _replace(ids, pair, 256 + r)

    out = []
    for chunk in _chunks(text, special_tokens):
        if chunk in special_tokens:
            out.append(first_special + list(special_tokens).index(chunk))
        else:
            for m in GPT2.finditer(chunk):
                out.extend(piece_ids(m.group()))
    return out


def decode(ids, merges, special_tokens=()):
    parts = {}

    def spelled(i):
        if i < 256:
            return bytes([i])
        if i - 256 < len(merges):
            if i not in parts:
                left, right = merges[i - 256]
                parts[i] = spelled(left) + spelled(right)
            return parts[i]
        return special_tokens[i - 256 - len(merges)].encode("utf-8")

    if any(not 0 <= i < 256 + len(merges) + len(special_tokens) for i in ids):
        raise ValueError("an id outside the vocabulary")
    buffer = bytearray()
    for i in ids:
        buffer += spelled(i)
    return buffer.decode("utf-8", "replace")
