"""The hypothesis strategies the property tests share: one definition of a size, a seed or a dtype."""

from hypothesis import strategies as st

from autograde_tests.checks import harness

dtypes = st.sampled_from(harness.DTYPES)  # float32 and float64
seeds = st.integers(0, 2**16)  # for a torch.Generator: hypothesis shrinks the seed, not the tensor
sizes = st.integers(1, 9)  # one axis: a length or a feature size
batches = st.lists(st.integers(1, 3), max_size=2).map(tuple)  # leading axes, none to two
leading = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)  # one to three leading axes
heads = st.sampled_from([1, 2, 4])
