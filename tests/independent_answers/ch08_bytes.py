"""Style: tokens handled as bytes objects throughout, as tiktoken does; ids only at the edges (a merge's id is
its rank among the tokens' bytes), ties broken by the ids the bytes stand for."""

import regex


def train_bpe(text, vocab_size, special_tokens=()):
    if vocab_size < 256 + len(special_tokens):
        raise ValueError("vocab_size is smaller than the bytes and the special tokens")
    pattern = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    for token in sorted(special_tokens, key=len, reverse=True):
        text = text.replace(token, "\0")  # a boundary: the pieces are found between the NUL characters
    words = {}
    for part in text.split("\0"):
        for piece in pattern.findall(part):
            key = tuple(bytes([b]) for b in piece.encode("utf-8"))
            words[key] = words.get(key, 0) + 1
    id_of = {bytes([b]): b for b in range(256)}
    merges = []
    for _ in range(vocab_size - 256 - len(special_tokens)):
        stats = {}
        for word, count in words.items():
            for a, b in zip(word, word[1:]):
                stats[a, b] = stats.get((a, b), 0) + count
        if not stats:
            break
        a, b = min(stats, key=lambda ab: (-stats[ab], id_of[ab[0]], id_of[ab[1]]))
        merges.append((id_of[a], id_of[b]))
        id_of[a + b] = 255 + len(merges)
        renewed = {}
        for word, count in words.items():
            parts = list(word)
            i = 0
            while i < len(parts) - 1:
                if parts[i] == a and parts[i + 1] == b:
                    parts[i:i + 2] = [a + b]
                i += 1
            renewed[tuple(parts)] = renewed.get(tuple(parts), 0) + count
        words = renewed
    return merges


def encode(text, merges, special_tokens=()):
    pattern = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    spelled = [bytes([b]) for b in range(256)]
    for a, b in merges:
        spelled.append(spelled[a] + spelled[b])
    rank = {piece: i for i, piece in enumerate(spelled)}
    ids = []
    rest = text
    while rest:
        # The earliest special token in what is left (the longest where two start at the same place).
        found = [(rest.find(s), -len(s), j) for j, s in enumerate(special_tokens) if s in rest]
        start, minus_length, j = min(found) if found else (len(rest), 0, None)
        for piece in pattern.findall(rest[:start]):
            parts = [bytes([b]) for b in piece.encode("utf-8")]
            while len(parts) > 1:
                ranks = [rank.get(x + y) for x, y in zip(parts, parts[1:])]
                known = [r for r in ranks if r is not None]
                if not known:
                    break
                i = ranks.index(min(known))  # the leftmost occurrence of the best merge
                parts[i:i + 2] = [parts[i] + parts[i + 1]]
            ids.extend(rank[p] for p in parts)
        if j is not None:
            ids.append(256 + len(merges) + j)
        rest = rest[start - minus_length:]
    return ids


def decode(ids, merges, special_tokens=()):
    spelled = [bytes([b]) for b in range(256)]
    for a, b in merges:
        spelled.append(spelled[a] + spelled[b])
    spelled.extend(s.encode("utf-8") for s in special_tokens)
    if any(i < 0 or i >= len(spelled) for i in ids):
        raise ValueError("an id outside the vocabulary")
    return bytes().join(spelled[i] for i in ids).decode("utf-8", "replace")
