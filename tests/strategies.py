"""The hypothesis strategies that more than one test module draws from: one definition of a size, a seed or
a dtype. A strategy only one module uses stays in that module."""

import torch
from hypothesis import strategies as st

from autograde_tests.checks import harness

dtypes = st.sampled_from(harness.DTYPES)  # float32 and float64
seeds = st.integers(0, 2**16)  # hypothesis shrinks the seed, not the tensor
# A composite's tensors; a test's own argument stays a seed, which its failure report can show.
generators = seeds.map(lambda seed: torch.Generator().manual_seed(seed))
sizes = st.integers(1, 9)  # one axis: a length or a feature size
batch_sizes = st.integers(1, 3)  # one batch axis
batches = st.lists(batch_sizes, max_size=2).map(tuple)  # leading axes, none to two
lengths = st.integers(1, 7)  # a sequence's length
heads = st.sampled_from([1, 2, 4])
head_widths = st.integers(1, 5)  # d_k: a module's d_model is heads times this
