"""Style: verbose, block boundaries listed first, one named intermediate per step with comments."""

import math

import torch


def online_softmax(chunks):
    row_maximum = None  # the largest score seen so far in each row, shape (..., 1)
    row_normaliser = None  # sum of exp(score - row_maximum) over the scores seen so far, shape (..., 1)
    for chunk_index, chunk in enumerate(chunks):
        if chunk_index == 0:
            # Nothing seen yet: start from "no maximum" and an empty sum.
            row_maximum = torch.full(chunk.shape[:-1] + (1,), float("-inf"), dtype=chunk.dtype, device=chunk.device)
            row_normaliser = torch.zeros(chunk.shape[:-1] + (1,), dtype=chunk.dtype, device=chunk.device)
        # The maximum of this chunk alone, then the maximum of everything seen so far.
        chunk_maximum = chunk.amax(dim=-1, keepdim=True)
        updated_maximum = torch.maximum(row_maximum, chunk_maximum)
        # The old sum was taken against the old maximum: rescale it to the new one (a factor <= 1;
        # on the first chunk exp(-inf) = 0 clears the empty sum).
        rescale_factor = torch.exp(row_maximum - updated_maximum)
        rescaled_old_sum = row_normaliser * rescale_factor
        # This chunk's contribution, against the same new maximum so that no exp overflows.
        shifted_scores = chunk - updated_maximum
        chunk_contribution = torch.exp(shifted_scores).sum(dim=-1, keepdim=True)
        # Commit the new state.
        row_normaliser = rescaled_old_sum + chunk_contribution
        row_maximum = updated_maximum
    return row_maximum, row_normaliser


def tiled_attention(q, k, v, block_q, block_k, causal=False):
    number_of_queries = q.size(-2)
    number_of_keys = k.size(-2)
    key_dimension = q.size(-1)
    value_dimension = v.size(-1)
    batch_shape = q.shape[:-2]
    score_scale = 1.0 / math.sqrt(key_dimension)

    # The (start, stop) boundaries of every block; the last block of each may be shorter.
    query_blocks = [(start, min(start + block_q, number_of_queries)) for start in range(0, number_of_queries, block_q)]
    key_blocks = [(start, min(start + block_k, number_of_keys)) for start in range(0, number_of_keys, block_k)]

    output_blocks = []
    for query_start, query_stop in query_blocks:
        query_count = query_stop - query_start
        query_block = q[..., query_start:query_stop, :]  # (..., query_count, d_k)

        # The running state of the online softmax for these queries.
        running_maximum = torch.full((*batch_shape, query_count, 1), float("-inf"), dtype=q.dtype, device=q.device)
        running_sum = torch.zeros((*batch_shape, query_count, 1), dtype=q.dtype, device=q.device)
        running_output = torch.zeros((*batch_shape, query_count, value_dimension), dtype=q.dtype, device=q.device)

        # The global positions of these queries, used to mask tiles that cross the diagonal.
        query_positions = torch.arange(query_start, query_stop, device=q.device).unsqueeze(1)  # (query_count, 1)

        for key_start, key_stop in key_blocks:
            # Causal: the last query of this block is query_stop - 1, so a key block starting at
            # query_stop or later is hidden from all of them; skip it (and every block after it).
            if causal and key_start > query_stop - 1:
                break

            key_block = k[..., key_start:key_stop, :]  # (..., key_count, d_k)
            value_block = v[..., key_start:key_stop, :]  # (..., key_count, d_v)

            # One tile of scaled scores.
            raw_scores = torch.matmul(query_block, key_block.transpose(-2, -1))
            tile_scores = raw_scores * score_scale  # (..., query_count, key_count)

            # A tile whose last key lies beyond its first query crosses the diagonal: hide key j > query i.
            tile_crosses_diagonal = causal and key_stop - 1 > query_start
            if tile_crosses_diagonal:
                key_positions = torch.arange(key_start, key_stop, device=q.device).unsqueeze(0)  # (1, key_count)
                hidden = key_positions > query_positions  # (query_count, key_count)
                tile_scores = tile_scores.masked_fill(hidden, float("-inf"))

            # Online softmax update. Key 0 is in every row's first tile, so the new maximum is finite.
            tile_maximum = tile_scores.amax(dim=-1, keepdim=True)
            new_maximum = torch.maximum(running_maximum, tile_maximum)
            correction = torch.exp(running_maximum - new_maximum)  # rescales what was summed before
            unnormalised_weights = torch.exp(tile_scores - new_maximum)
            running_sum = running_sum * correction + unnormalised_weights.sum(dim=-1, keepdim=True)
            weighted_values = torch.matmul(unnormalised_weights, value_block)
            running_output = running_output * correction + weighted_values
            running_maximum = new_maximum

        # Normalise once at the end. With no key at all the sum is 0 and the output stays 0.
        has_keys = running_sum > 0
        safe_sum = torch.where(has_keys, running_sum, torch.ones_like(running_sum))
        normalised = torch.where(has_keys, running_output / safe_sum, torch.zeros_like(running_output))
        output_blocks.append(normalised)

    return torch.cat(output_blocks, dim=-2)
