"""Style: collections.Counter over the distinct pieces, comprehensions, nested helpers, the merges kept in a dict."""

from collections import Counter

import regex


def train_bpe(text, vocab_size, special_tokens=()):
    if vocab_size < 256 + len(special_tokens):
        raise ValueError("vocab_size too small")
    split = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    specials = sorted(special_tokens, key=len, reverse=True)
    chunks = regex.split(f"({'|'.join(map(regex.escape, specials))})", text) if specials else [text]
    pieces = Counter(tuple(p.encode()) for c in chunks if c not in specials for p in regex.findall(split, c))

    def merged(piece, pair, new):
        out = []
        for token in piece:
            if out and out[-1] == pair[0] and token == pair[1]:
                out[-1] = new  # new is no pair[0], so an overlapping occurrence cannot merge again
            else:
                out.append(token)
        return tuple(out)

    merges = {}
    while len(merges) < vocab_size - 256 - len(special_tokens):
        pairs = Counter()
        for piece, n in pieces.items():
            for pair in zip(piece, piece[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges[best] = 256 + len(merges)
        pieces = Counter({merged(piece, best, merges[best]): n for piece, n in pieces.items()})
    return list(merges)


def encode(text, merges, special_tokens=()):
    split = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    rank = {tuple(pair): r for r, pair in enumerate(merges)}
    special = {s: 256 + len(merges) + j for j, s in enumerate(special_tokens)}
    specials = sorted(special_tokens, key=len, reverse=True)
    chunks = regex.split(f"({'|'.join(map(regex.escape, specials))})", text) if specials else [text]

    def bpe(piece):
        tokens = list(piece.encode())
        while (ranked := [rank[p] for p in zip(tokens, tokens[1:]) if p in rank]):
            r, out = min(ranked), []
            for token in tokens:
                if out and out[-1] == merges[r][0] and token == merges[r][1]:
                    out[-1] = 256 + r
                else:
                    out.append(token)
            tokens = out
        return tokens

    return [i for c in chunks for i in ([special[c]] if c in special else
                                          [t for p in regex.findall(split, c) for t in bpe(p)])]


def decode(ids, merges, special_tokens=()):
    table = [bytes([b]) for b in range(256)]
    for left, right in merges:
        table.append(table[left] + table[right])
    table += [s.encode() for s in special_tokens]
    if not all(0 <= i < len(table) for i in ids):
        raise ValueError("an id outside the vocabulary")
    return b"".join(table[i] for i in ids).decode(errors="replace")
