"""The chapter-4 reference is proven against PyTorch's own LayerNorm, Conv1d and Transformer layers."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from autograde_tests.reference import LayerNorm, PositionwiseFeedForward, SublayerConnection, ffn_as_conv1d

from .conftest import assert_close, randomise
from .strategies import batch_sizes, dtypes, seeds, sizes

leading = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)


# -------------------------------------------------------------------------------------- LayerNorm


@settings(max_examples=80, deadline=None)
@given(
    shape=leading,
    d_model=st.integers(2, 17),
    eps=st.sampled_from([1e-5, 1e-3, 0.5]),
    dtype=dtypes,
    seed=seeds,
)
def test_layer_norm_matches_torch_layer_norm(shape, d_model, eps, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, d_model, generator=gen, dtype=dtype) * 3 + 2
    ours = randomise(LayerNorm(d_model, eps=eps).to(dtype), seed)
    theirs = nn.LayerNorm(d_model, eps=eps, dtype=dtype)
    theirs.load_state_dict(ours.state_dict())
    assert_close(ours(x), theirs(x))
    assert_close(ours(x), F.layer_norm(x, (d_model,), ours.weight, ours.bias, eps))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_norm_gradients_match_torch(dtype):
    x = torch.randn(3, 5, 8, dtype=dtype)
    upstream = torch.randn(3, 5, 8, dtype=dtype)
    ours = randomise(LayerNorm(8).to(dtype), 1)
    theirs = nn.LayerNorm(8, dtype=dtype)
    theirs.load_state_dict(ours.state_dict())
    grads = []
    for module in (ours, theirs):
        x_leaf = x.clone().requires_grad_()
        (module(x_leaf) * upstream).sum().backward()
        grads.append((x_leaf.grad, module.weight.grad, module.bias.grad))
    for actual, expected in zip(*grads):
        assert_close(actual, expected)


def test_layer_norm_parameters_are_named_weight_and_bias_like_torch():
    ours, theirs = LayerNorm(6), nn.LayerNorm(6)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    assert all(isinstance(p, nn.Parameter) for p in (ours.weight, ours.bias))


def test_layer_norm_starts_as_plain_standardisation():
    x = torch.randn(4, 7, 10, dtype=torch.float64) * 5 - 3
    y = LayerNorm(10).double()(x)
    var = x.var(-1, unbiased=False)
    assert_close(y.mean(-1), torch.zeros(4, 7, dtype=torch.float64))
    assert_close(y.var(-1, unbiased=False), var / (var + 1e-5))  # 1, up to the ε in the denominator


def test_layer_norm_of_a_constant_vector_is_its_bias_not_nan():
    norm = randomise(LayerNorm(5), 3)
    y = norm(torch.full((2, 5), 7.0))
    assert not y.isnan().any()
    assert_close(y, norm.bias.detach().expand(2, 5))


def test_layer_norm_does_not_depend_on_other_rows_or_the_batch():
    norm = randomise(LayerNorm(6).double(), 4)
    x = torch.randn(5, 3, 6, dtype=torch.float64)
    assert_close(norm(x[2:3]), norm(x)[2:3])


# -------------------------------------------------------------------------------------------- FFN


@settings(max_examples=60, deadline=None)
@given(shape=leading, d_model=sizes, d_ff=sizes, dtype=dtypes, seed=seeds)
def test_ffn_matches_a_torch_sequential_with_the_same_weights(shape, d_model, d_ff, dtype, seed):
    torch.manual_seed(seed)
    ours = PositionwiseFeedForward(d_model, d_ff).to(dtype)
    theirs = nn.Sequential(ours.linear1, nn.ReLU(), ours.linear2)
    x = torch.randn(*shape, d_model, dtype=dtype)
    assert_close(ours(x), theirs(x))


def test_ffn_layers_have_the_papers_sizes():
    ffn = PositionwiseFeedForward(512, 2048)
    assert ffn.linear1.weight.shape == (2048, 512) and ffn.linear2.weight.shape == (512, 2048)
    assert ffn.linear1.bias is not None and ffn.linear2.bias is not None


def test_ffn_is_position_wise():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(6, 11).double()
    x = torch.randn(2, 7, 6, dtype=torch.float64)
    order = torch.randperm(7)
    assert_close(ffn(x[:, order]), ffn(x)[:, order])
    for t in range(7):
        assert_close(ffn(x[:, t : t + 1]), ffn(x)[:, t : t + 1])


def test_ffn_dropout_is_off_in_eval_and_between_the_layers():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(4, 9, dropout=0.5).eval()
    x = torch.randn(3, 5, 4)
    assert_close(ffn(x), ffn.linear2(torch.relu(ffn.linear1(x))))
    ffn.train()
    hidden = torch.relu(ffn.linear1(x))
    torch.manual_seed(1)
    expected = ffn.linear2(F.dropout(hidden, 0.5, training=True))
    torch.manual_seed(1)
    assert_close(ffn(x), expected)


# ---------------------------------------------------------------------------------- FFN as Conv1d


@settings(max_examples=40, deadline=None)
@given(batch=batch_sizes, length=sizes, d_model=sizes, d_ff=sizes, dtype=dtypes, seed=seeds)
def test_ffn_as_conv1d_computes_the_same_function(batch, length, d_model, d_ff, dtype, seed):
    torch.manual_seed(seed)
    ffn = PositionwiseFeedForward(d_model, d_ff).to(dtype)
    conv = ffn_as_conv1d(ffn)
    x = torch.randn(batch, length, d_model, dtype=dtype)
    assert_close(conv(x), ffn(x))


def test_ffn_as_conv1d_is_made_of_1x1_convolutions_only():
    conv = ffn_as_conv1d(PositionwiseFeedForward(8, 32))
    layers = [m for m in conv.modules() if isinstance(m, nn.Conv1d)]
    assert len(layers) == 2 and all(layer.kernel_size == (1,) for layer in layers)
    assert not any(isinstance(m, nn.Linear) for m in conv.modules())


def test_ffn_as_conv1d_agrees_with_torch_conv1d_on_channels_first_input():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(5, 12).double()
    conv = ffn_as_conv1d(ffn)
    x = torch.randn(2, 9, 5, dtype=torch.float64)
    channels = x.transpose(1, 2)  # (B, d_model, T)
    hidden = F.relu(F.conv1d(channels, ffn.linear1.weight.unsqueeze(-1), ffn.linear1.bias))
    expected = F.conv1d(hidden, ffn.linear2.weight.unsqueeze(-1), ffn.linear2.bias).transpose(1, 2)
    assert_close(conv(x), expected)


def test_ffn_as_conv1d_copies_the_weights_and_leaves_the_ffn_alone():
    ffn = PositionwiseFeedForward(4, 6)
    before = {k: v.clone() for k, v in ffn.state_dict().items()}
    conv = ffn_as_conv1d(ffn)
    with torch.no_grad():
        conv.conv1.weight.zero_()
    assert all(torch.equal(before[k], v) for k, v in ffn.state_dict().items())


def test_ffn_as_conv1d_keeps_dtype_and_device():
    conv = ffn_as_conv1d(PositionwiseFeedForward(4, 6).double())
    assert conv.conv1.weight.dtype == torch.float64


# ---------------------------------------------------------- residual connections against torch's layers


def encoder_layer_from_sublayer_connections(layer: nn.TransformerEncoderLayer, d_model: int):
    """Rebuild torch's encoder layer from two SublayerConnections sharing its weights."""
    attn = SublayerConnection(d_model, norm_first=layer.norm_first)
    ffn = SublayerConnection(d_model, norm_first=layer.norm_first)
    attn.norm.load_state_dict(layer.norm1.state_dict())
    ffn.norm.load_state_dict(layer.norm2.state_dict())

    def forward(x):
        x = attn(x, lambda h: layer.self_attn(h, h, h, need_weights=False)[0])
        return ffn(x, lambda h: layer.linear2(torch.relu(layer.linear1(h))))

    return forward


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_two_sublayer_connections_are_torchs_encoder_layer(norm_first, dtype):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(12, 3, 20, dropout=0.0, batch_first=True, norm_first=norm_first)
    layer = randomise(layer, 1).to(dtype).eval()
    ours = encoder_layer_from_sublayer_connections(layer, 12)
    x = torch.randn(2, 7, 12, dtype=dtype)
    with torch.no_grad():
        assert_close(ours(x), layer(x))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_three_sublayer_connections_are_torchs_decoder_layer(norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first)
    layer = randomise(layer, 2).double().eval()
    self_attn, cross_attn, ffn = (SublayerConnection(8, norm_first=norm_first).double() for _ in range(3))
    for connection, norm in zip((self_attn, cross_attn, ffn), (layer.norm1, layer.norm2, layer.norm3)):
        connection.norm.load_state_dict(norm.state_dict())
    x, memory = torch.randn(3, 5, 8, dtype=torch.float64), torch.randn(3, 6, 8, dtype=torch.float64)
    causal = nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)  # torch's float mask

    y = self_attn(x, lambda h: layer.self_attn(h, h, h, attn_mask=causal, need_weights=False)[0])
    y = cross_attn(y, lambda h: layer.multihead_attn(h, memory, memory, need_weights=False)[0])
    y = ffn(y, lambda h: layer.linear2(torch.relu(layer.linear1(h))))
    with torch.no_grad():
        assert_close(y, layer(x, memory, tgt_mask=causal))


# ------------------------------------------------------------------------- where the dropout goes


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_dropout_never_touches_the_residual_path(norm_first):
    connection = SublayerConnection(6, dropout=0.9, norm_first=norm_first).double().train()
    randomise(connection, 5)
    x = torch.randn(4, 5, 6, dtype=torch.float64)
    out = connection(x, torch.zeros_like)
    assert_close(out, x if norm_first else connection.norm(x))


def test_pre_ln_dropout_drops_or_rescales_each_element_of_the_sublayer_output():
    connection = SublayerConnection(6, dropout=0.5, norm_first=True).double().train()
    x = torch.randn(4, 5, 6, dtype=torch.float64)
    sublayer = nn.Linear(6, 6).double()
    torch.manual_seed(0)
    delta = connection(x, sublayer) - x
    full = sublayer(connection.norm(x)) / 0.5
    kept = (delta - full).abs() < 1e-12
    dropped = delta.abs() < 1e-12
    assert (kept | dropped).all() and kept.any() and dropped.any()


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_sublayer_connection_in_eval_mode_ignores_dropout(norm_first):
    connection = randomise(SublayerConnection(6, dropout=0.5, norm_first=norm_first), 6).eval()
    sublayer = nn.Linear(6, 6)
    x = torch.randn(2, 3, 6)
    expected = x + sublayer(connection.norm(x)) if norm_first else connection.norm(x + sublayer(x))
    assert_close(connection(x, sublayer), expected)


def test_pre_ln_with_a_zero_sublayer_is_the_identity_and_post_ln_is_a_layer_norm():
    x = torch.randn(2, 3, 6)
    pre, post = SublayerConnection(6, norm_first=True), SublayerConnection(6)
    assert torch.equal(pre(x, torch.zeros_like), x)
    assert_close(post(x, torch.zeros_like), F.layer_norm(x, (6,)))
