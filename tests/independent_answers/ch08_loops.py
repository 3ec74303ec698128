"""Style: plain loops and dicts; every pair counted again after each merge; merges replayed by lowest rank."""

import regex


def train_bpe(text, vocab_size, special_tokens=()):
    if vocab_size - 256 - len(special_tokens) < 0:
        raise ValueError("vocab_size too small")
    pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    chunks = [text]
    if special_tokens:
        ordered = sorted(special_tokens, key=len, reverse=True)
        chunks = regex.split("(" + "|".join(regex.escape(s) for s in ordered) + ")", text)
    sequences = []
    for chunk in chunks:
        if chunk in special_tokens:
            continue
        for piece in regex.findall(pattern, chunk):
            sequences.append(list(piece.encode("utf-8")))
    merges = []
    for new_id in range(256, vocab_size - len(special_tokens)):
        counts = {}
        for seq in sequences:
            for i in range(len(seq) - 1):
                pair = (seq[i], seq[i + 1])
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        best = None
        for pair, n in counts.items():
            if best is None or n > counts[best] or (n == counts[best] and pair < best):
                best = pair
        merges.append(best)
        for k in range(len(sequences)):
            seq, out, i = sequences[k], [], 0
            while i < len(seq):
                if i + 1 < len(seq) and seq[i] == best[0] and seq[i + 1] == best[1]:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            sequences[k] = out
    return merges


def encode(text, merges, special_tokens=()):
    pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    rank = {}
    for r in range(len(merges)):
        rank[(merges[r][0], merges[r][1])] = r
    chunks = [text]
    if special_tokens:
        ordered = sorted(special_tokens, key=len, reverse=True)
        chunks = regex.split("(" + "|".join(regex.escape(s) for s in ordered) + ")", text)
    ids = []
    for chunk in chunks:
        if chunk in special_tokens:
            ids.append(256 + len(merges) + list(special_tokens).index(chunk))
            continue
        for piece in regex.findall(pattern, chunk):
            seq = list(piece.encode("utf-8"))
            while True:
                best = None
                for i in range(len(seq) - 1):
                    pair = (seq[i], seq[i + 1])
                    if pair in rank and (best is None or rank[pair] < rank[best]):
                        best = pair
                if best is None:
                    break
                out, i = [], 0
                while i < len(seq):
                    if i + 1 < len(seq) and (seq[i], seq[i + 1]) == best:
                        out.append(256 + rank[best])
                        i += 2
                    else:
                        out.append(seq[i])
                        i += 1
                seq = out
            ids.extend(seq)
    return ids


def decode(ids, merges, special_tokens=()):
    table = {}
    for b in range(256):
        table[b] = bytes([b])
    for r in range(len(merges)):
        left, right = merges[r]
        table[256 + r] = table[left] + table[right]
    for j in range(len(special_tokens)):
        table[256 + len(merges) + j] = special_tokens[j].encode("utf-8")
    data = b""
    for i in ids:
        if i not in table:
            raise ValueError(f"unknown id {i}")
        data += table[i]
    return data.decode("utf-8", errors="replace")
