"""Style: spelled out step by step, with named intermediate values and comments; the pair counts updated
incrementally after each merge, only for the pieces that held the merged pair."""

import regex


def train_bpe(text, vocab_size, special_tokens=()):
    if vocab_size - 256 - len(special_tokens) < 0:
        raise ValueError(f"vocab_size {vocab_size} cannot hold 256 bytes and {len(special_tokens)} special tokens")
    gpt2_pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

    # 1. Cut out the special tokens: the text between them is trained on, they are not.
    if special_tokens:
        longest_first = sorted(special_tokens, key=len, reverse=True)
        special_regex = "(" + "|".join(regex.escape(token) for token in longest_first) + ")"
        text_chunks = regex.split(special_regex, text)
    else:
        text_chunks = [text]
    ordinary_chunks = [chunk for chunk in text_chunks if chunk not in special_tokens]

    # 2. Pre-tokenise, and count how often each distinct piece occurs.
    piece_frequency = {}
    for chunk in ordinary_chunks:
        for piece in regex.findall(gpt2_pattern, chunk):
            piece_frequency[piece] = piece_frequency.get(piece, 0) + 1
    piece_tokens = [list(piece.encode("utf-8")) for piece in piece_frequency]
    piece_weight = list(piece_frequency.values())

    # 3. Count every adjacent pair, weighted by its piece's frequency.
    pair_count = {}
    for tokens, weight in zip(piece_tokens, piece_weight):
        for position in range(len(tokens) - 1):
            pair = (tokens[position], tokens[position + 1])
            pair_count[pair] = pair_count.get(pair, 0) + weight

    number_of_merges = vocab_size - 256 - len(special_tokens)
    merges = []
    while len(merges) < number_of_merges and pair_count:
        highest = max(pair_count.values())
        chosen_pair = min(pair for pair, count in pair_count.items() if count == highest)
        new_token = 256 + len(merges)
        merges.append(chosen_pair)

        # 4. In every piece holding the chosen pair: take its pairs out of the counts, merge, put them back.
        for index, tokens in enumerate(piece_tokens):
            holds_pair = any((tokens[p], tokens[p + 1]) == chosen_pair for p in range(len(tokens) - 1))
            if not holds_pair:
                continue
            weight = piece_weight[index]
            for position in range(len(tokens) - 1):
                old_pair = (tokens[position], tokens[position + 1])
                pair_count[old_pair] -= weight
                if pair_count[old_pair] == 0:
                    del pair_count[old_pair]
            merged_tokens = []
            position = 0
            while position < len(tokens):
                at_pair = position + 1 < len(tokens) and (tokens[position], tokens[position + 1]) == chosen_pair
                if at_pair:
                    merged_tokens.append(new_token)
                    position += 2
                else:
                    merged_tokens.append(tokens[position])
                    position += 1
            piece_tokens[index] = merged_tokens
            for position in range(len(merged_tokens) - 1):
                new_pair = (merged_tokens[position], merged_tokens[position + 1])
                pair_count[new_pair] = pair_count.get(new_pair, 0) + weight
    return merges


def encode(text, merges, special_tokens=()):
    gpt2_pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    rank_of_pair = {}
    for rank, (left, right) in enumerate(merges):
        rank_of_pair[(left, right)] = rank
    first_special_id = 256 + len(merges)

    if special_tokens:
        longest_first = sorted(special_tokens, key=len, reverse=True)
        special_regex = "(" + "|".join(regex.escape(token) for token in longest_first) + ")"
        text_chunks = regex.split(special_regex, text)
    else:
        text_chunks = [text]

    all_ids = []
    for chunk in text_chunks:
        if chunk in special_tokens:
            all_ids.append(first_special_id + list(special_tokens).index(chunk))
            continue
        for piece in regex.findall(gpt2_pattern, chunk):
            tokens = list(piece.encode("utf-8"))
            while len(tokens) >= 2:
                # The pair of the piece that was learned first, if any pair is a merge at all.
                candidate_ranks = [rank_of_pair[pair] for pair in zip(tokens, tokens[1:]) if pair in rank_of_pair]
                if not candidate_ranks:
                    break
                lowest_rank = min(candidate_ranks)
                pair_to_merge = tuple(merges[lowest_rank])
                merged_tokens = []
                position = 0
                while position < len(tokens):
                    if position + 1 < len(tokens) and (tokens[position], tokens[position + 1]) == pair_to_merge:
                        merged_tokens.append(256 + lowest_rank)
                        position += 2
                    else:
                        merged_tokens.append(tokens[position])
                        position += 1
                tokens = merged_tokens
            all_ids.extend(tokens)
    return all_ids


def decode(ids, merges, special_tokens=()):
    bytes_of_token = {byte_value: bytes([byte_value]) for byte_value in range(256)}
    for rank, (left, right) in enumerate(merges):
        bytes_of_token[256 + rank] = bytes_of_token[left] + bytes_of_token[right]
    first_special_id = 256 + len(merges)
    for offset, token in enumerate(special_tokens):
        bytes_of_token[first_special_id + offset] = token.encode("utf-8")
    unknown = [token_id for token_id in ids if token_id not in bytes_of_token]
    if unknown:
        raise ValueError(f"ids not in the vocabulary: {unknown}")
    # Join first, decode once: a character may be split between two tokens.
    all_bytes = b"".join(bytes_of_token[token_id] for token_id in ids)
    return all_bytes.decode("utf-8", errors="replace")
