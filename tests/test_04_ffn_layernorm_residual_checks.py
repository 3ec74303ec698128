"""The chapter-4 checks pass every correct way of writing the code and name every known mistake.

Each buggy variant is one entry of the design's mistake list for this chapter (or a near relative),
written the way a learner would write it; each test asserts the message that names it.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograde_tests.checks import (
    check_ffn_as_conv1d,
    check_layer_norm,
    check_positionwise_feed_forward,
    check_sublayer_connection,
)
from autograde_tests.checks.ffn_layernorm_residual import VISIBLE_LAYER_NORM
from autograde_tests.reference import LayerNorm as ReferenceLayerNorm
from autograde_tests.reference import PositionwiseFeedForward as ReferenceFFN
from autograde_tests.reference import SublayerConnection as ReferenceSublayerConnection
from autograde_tests.reference import ffn_as_conv1d as reference_ffn_as_conv1d
from tests.conftest import fails
from tests.variants import variant

pytestmark = pytest.mark.usefixtures("learner_side")  # each test in-process and through the wire


def both(check, answer, problem, exercise=None):
    """The visible and the hidden check both fail ``answer`` with a verdict whose problem matches ``problem`` (a
    regular expression), on ``exercise`` when given."""
    for hidden in (False, True):
        with fails(problem, exercise=exercise):
            check(answer, hidden=hidden)


# ================================================================ PositionwiseFeedForward: correct


class FFNWithModules(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.activation = nn.ReLU()
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class FFNWithEinsum(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear2 = nn.Linear(d_ff, d_model)  # defined first: the check never relies on the order
        self.linear1 = nn.Linear(d_model, d_ff)
        self.p = dropout

    def forward(self, x):
        h = torch.einsum("btd,fd->btf", x, self.linear1.weight) + self.linear1.bias
        h = F.dropout(h.clamp(min=0), self.p, training=self.training)
        return torch.einsum("btf,df->btd", h, self.linear2.weight) + self.linear2.bias


class FFNFlattened(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x):
        rows = x.reshape(-1, x.size(-1))  # (B*T, d_model): every position is a row of one batch
        hidden = F.relu(F.linear(rows, self.linear1.weight, self.linear1.bias))
        out = F.linear(hidden, self.linear2.weight, self.linear2.bias)
        return out.reshape(x.shape)


@pytest.mark.parametrize("ffn", [FFNWithModules, FFNWithEinsum, FFNFlattened, ReferenceFFN])
@pytest.mark.parametrize("hidden", [False, True])
def test_ffn_check_passes_correct_variants(ffn, hidden, capsys):
    check_positionwise_feed_forward(ffn, hidden=hidden)
    assert "✔ PositionwiseFeedForward" in capsys.readouterr().out


# =============================================================== PositionwiseFeedForward: mistakes


class FFNAsWideConvolution(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.conv1 = nn.Conv1d(d_model, d_ff, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(d_ff, d_model, kernel_size=3, padding=1)

    def forward(self, x):
        return self.conv2(torch.relu(self.conv1(x.transpose(1, 2)))).transpose(1, 2)


class FFNAsSequential(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))

    def forward(self, x):
        return self.net(x)


class FFNWithoutBias(FFNWithModules):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__(d_model, d_ff, dropout)
        self.linear1 = nn.Linear(d_model, d_ff, bias=False)
        self.linear2 = nn.Linear(d_ff, d_model, bias=False)


class FFNWithLayersSwapped(FFNWithModules):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__(d_model, d_ff, dropout)
        self.linear1, self.linear2 = nn.Linear(d_ff, d_model), nn.Linear(d_model, d_ff)

    def forward(self, x):
        return self.linear1(torch.relu(self.linear2(x)))


@pytest.mark.parametrize(
    "ffn, message",
    [
        (  # a Linear over the sequence axis: runs only when T == d_model
            variant(FFNWithModules, ("self.linear1(x))))", "self.linear1(x.transpose(1, 2))))).transpose(1, 2)")),
            r"your FFN mixes positions",
        ),
        (
            variant(FFNWithModules, ("self.linear1(x)", "self.linear1(x + x.mean(dim=1, keepdim=True))")),
            r"your FFN mixes positions: changing the input at position 0",
        ),
        (FFNAsWideConvolution, r"your FFN mixes positions"),
        (
            variant(FFNWithModules, ("return ", "return 0.1 * torch.arange(x.size(1)).to(x)[:, None] + ")),
            r"permuting the positions .* not the same function at every position",
        ),
        (
            variant(FFNWithModules, ("self.activation(self.linear1(x))", "self.linear1(x)")),
            r"there is no ReLU between linear1 and linear2",
        ),
        (
            variant(FFNWithModules, ("self.linear1(x))))", "self.linear1(x)))).relu()")),
            r"a ReLU is also applied after linear2",
        ),
        (variant(FFNWithModules, ("self.activation", "F.gelu")), r"the activation is GELU"),
        (FFNAsSequential, r"has no parameter linear1.bias, linear1.weight"),
        (FFNWithoutBias, r"has no parameter linear1.bias, linear2.bias"),
        (FFNWithLayersSwapped, r"parameter linear1.weight has shape"),
        (  # F.dropout's training is True unless told
            variant(FFNWithModules, ("self.dropout(self.activation(self.linear1(x)))",
                                     "F.dropout(self.activation(self.linear1(x)), self.dropout.p)")),
            r"eval mode: its dropout is still active",
        ),
    ],
)
def test_ffn_check_names_the_mistake(ffn, message):
    both(check_positionwise_feed_forward, ffn, message)


# ========================================================================= ffn_as_conv1d: correct


class Transpose(nn.Module):
    def forward(self, x):
        return x.transpose(1, 2)


def conv1d_sequential(ffn):
    d_ff, d_model = ffn.linear1.weight.shape
    conv1, conv2 = nn.Conv1d(d_model, d_ff, 1), nn.Conv1d(d_ff, d_model, 1)
    conv1.weight = nn.Parameter(ffn.linear1.weight.detach().clone().unsqueeze(-1))
    conv1.bias = nn.Parameter(ffn.linear1.bias.detach().clone())
    conv2.weight = nn.Parameter(ffn.linear2.weight.detach().clone().unsqueeze(-1))
    conv2.bias = nn.Parameter(ffn.linear2.bias.detach().clone())
    return nn.Sequential(Transpose(), conv1, nn.ReLU(), conv2, Transpose())


class PermutedConvFFN(nn.Module):
    def __init__(self, ffn):
        super().__init__()
        self.first = nn.Conv1d(ffn.linear1.in_features, ffn.linear1.out_features, kernel_size=1)
        self.second = nn.Conv1d(ffn.linear2.in_features, ffn.linear2.out_features, kernel_size=1)
        self.first.weight.data = ffn.linear1.weight.data.view(*ffn.linear1.weight.shape, 1)  # shares storage
        self.first.bias.data = ffn.linear1.bias.data
        self.second.weight.data = ffn.linear2.weight.data.view(*ffn.linear2.weight.shape, 1)
        self.second.bias.data = ffn.linear2.bias.data

    def forward(self, x):
        return self.second(F.relu(self.first(x.permute(0, 2, 1)))).permute(0, 2, 1)


def conv1d_via_state_dict(ffn):
    d_ff, d_model = ffn.linear1.weight.shape
    conv = nn.ModuleDict({"conv1": nn.Conv1d(d_model, d_ff, 1), "conv2": nn.Conv1d(d_ff, d_model, 1)})
    conv.load_state_dict(
        {
            "conv1.weight": ffn.linear1.weight[..., None],
            "conv1.bias": ffn.linear1.bias,
            "conv2.weight": ffn.linear2.weight[..., None],
            "conv2.bias": ffn.linear2.bias,
        }
    )

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = conv

        def forward(self, x):
            h = self.layers["conv1"](x.mT).relu()
            return self.layers["conv2"](h).mT

    return Wrapped()


@pytest.mark.parametrize(
    "ffn_as_conv1d", [conv1d_sequential, PermutedConvFFN, conv1d_via_state_dict, reference_ffn_as_conv1d]
)
@pytest.mark.parametrize("hidden", [False, True])
def test_conv_check_passes_correct_variants(ffn_as_conv1d, hidden, capsys):
    check_ffn_as_conv1d(ffn_as_conv1d, hidden=hidden)
    assert "✔ ffn_as_conv1d" in capsys.readouterr().out


# ======================================================================== ffn_as_conv1d: mistakes


class ConvWithoutBiases(PermutedConvFFN):
    def __init__(self, ffn):
        super().__init__(ffn)
        self.first.bias.data = torch.zeros_like(self.first.bias)
        self.second.bias.data = torch.zeros_like(self.second.bias)


def conv_with_wide_kernels(ffn):
    d_ff, d_model = ffn.linear1.weight.shape
    conv1, conv2 = nn.Conv1d(d_model, d_ff, 3, padding=1), nn.Conv1d(d_ff, d_model, 3, padding=1)
    return nn.Sequential(Transpose(), conv1, nn.ReLU(), conv2, Transpose())


def conv_returning_the_ffn(ffn):
    return ffn


class ConvByFunctional(PermutedConvFFN):
    def forward(self, x):
        h = F.relu(F.conv1d(x.transpose(1, 2), self.first.weight, self.first.bias))
        return F.conv1d(h, self.second.weight, self.second.bias).transpose(1, 2)


class ConvKeepingTheFFN(PermutedConvFFN):
    def __init__(self, ffn):
        super().__init__(ffn)
        self.ffn = ffn

    def forward(self, x):
        super().forward(x)
        return self.ffn(x)


def conv_reshaping_the_ffn_in_place(ffn):
    conv = conv1d_sequential(ffn)
    ffn.linear1.weight.data = ffn.linear1.weight.data.unsqueeze(-1)  # reshapes ffn's own weight
    return conv


def conv_returning_a_function(ffn):
    return lambda x: ffn(x)


@pytest.mark.parametrize(
    "ffn_as_conv1d, message",
    [
        (
            variant(PermutedConvFFN, ("x.permute(0, 2, 1)", "x"), (").permute(0, 2, 1)", ")")),
            r"slides over the features instead of the positions",
        ),
        (variant(PermutedConvFFN, (").permute(0, 2, 1)", ")")), r"output was not transposed back"),
        (variant(PermutedConvFFN, ("F.relu", "")), r"no ReLU between the two convolutions"),
        (ConvWithoutBiases, r"bias of the convolution that replaces linear1 .*biases not copied"),
        (  # linear1's weight copied but never put in conv1, which keeps its initial weights
            variant(conv1d_sequential, ("conv1.weight = ", "weight = ")),
            r"weights of the convolution that replaces linear1 are not linear1's weights",
        ),
        (conv_with_wide_kernels, r"kernel_size=3, which mixes neighbouring positions"),
        (conv_returning_the_ffn, r"has no nn.Conv1d layer"),
        (ConvByFunctional, r"is never called"),
        (ConvKeepingTheFFN, r"still contains nn.Linear"),
        (conv_reshaping_the_ffn_in_place, r"modified the weights of the ffn"),
        (conv_returning_a_function, r"should return an nn.Module, got function"),
    ],
)
def test_conv_check_names_the_mistake(ffn_as_conv1d, message):
    both(check_ffn_as_conv1d, ffn_as_conv1d, message)


# ============================================================================= LayerNorm: correct


class LayerNormWithVar(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, correction=0)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class LayerNormBySums(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.d_model, self.eps = d_model, eps
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        mean = x.sum(-1, keepdim=True) / self.d_model
        centred = x - mean
        var = (centred**2).sum(-1, keepdim=True) / self.d_model
        return torch.addcmul(self.bias, centred * torch.rsqrt(var + self.eps), self.weight)


class LayerNormWithStdCorrection(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight, self.bias = nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        var, mean = torch.var_mean(x, dim=-1, keepdim=True, unbiased=False)
        return self.weight * (x - mean) / (var + self.eps).sqrt() + self.bias


@pytest.mark.parametrize(
    "layer_norm", [LayerNormWithVar, LayerNormBySums, LayerNormWithStdCorrection, nn.LayerNorm, ReferenceLayerNorm]
)
@pytest.mark.parametrize("hidden", [False, True])
def test_layer_norm_check_passes_correct_variants(layer_norm, hidden, capsys):
    check_layer_norm(layer_norm, hidden=hidden)
    assert "✔ LayerNorm" in capsys.readouterr().out


# ============================================================================ LayerNorm: mistakes


LayerNormUnbiased = variant(LayerNormWithVar, (", correction=0", ""))


class LayerNormIgnoringEps(LayerNormWithVar):
    def __init__(self, d_model, eps=1e-5):
        super().__init__(d_model)


class LayerNormWithoutParameters(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], eps=self.eps)


class LayerNormWithPlainTensors(LayerNormWithoutParameters):
    def __init__(self, d_model, eps=1e-5):
        super().__init__(d_model, eps)
        self.weight, self.bias = torch.ones(d_model), torch.zeros(d_model)

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight.to(x), self.bias.to(x), self.eps)


class LayerNormUsingWeightData(LayerNormWithVar):
    def forward(self, x):
        return super().forward(x) / self.weight * self.weight.data


class LayerNormUnderNoGrad(LayerNormWithVar):
    def forward(self, x):
        with torch.no_grad():
            return super().forward(x)


class LayerNormFixedDtype(LayerNormWithVar):
    def forward(self, x):
        return super().forward(x).float()


@pytest.mark.parametrize(
    "layer_norm, message",
    [
        (LayerNormUnbiased, r"unbiased variance"),
        (  # x.std(-1) + eps
            variant(
                LayerNormWithVar, (", correction=0", ""), ("torch.sqrt(var + self.eps)", "(torch.sqrt(var) + self.eps)")
            ),
            r"^two mistakes at once: your LayerNorm uses the unbiased variance \(dividing by d_model - 1\) and "
            r"adds eps outside the square root",
        ),
        (
            variant(LayerNormWithVar, ("torch.sqrt(var + self.eps)", "(torch.sqrt(var) + self.eps)")),
            r"eps is added outside the square root",
        ),
        (variant(LayerNormWithVar, ("var + self.eps", "var")), r"eps is missing"),
        (LayerNormIgnoringEps, r"ignores its eps argument"),
        (LayerNormWithoutParameters, r"no learnable weight and bias: `self.weight` is missing"),
        (LayerNormWithPlainTensors, r"no learnable weight and bias: `self.weight` is a Tensor, not an nn.Parameter"),
        (
            variant(LayerNormWithVar, (" * self.weight + self.bias", "")),
            r"no learnable weight and bias: the output is not scaled",
        ),
        (
            variant(LayerNormWithVar, ("x.mean(-1,", "x.mean(0,"), ("x.var(-1,", "x.var(0,")),
            r"normalises over the batch axis \(BatchNorm\) instead of the feature axis",
        ),
        (  # BatchNorm's statistics: per feature, over every position of every sequence
            variant(
                LayerNormWithVar,
                ("x.mean(-1,", "x.mean(tuple(range(x.dim() - 1)),"),
                ("x.var(-1,", "x.var(tuple(range(x.dim() - 1)),"),
            ),
            r"normalises over the batch axis \(BatchNorm\) instead of the feature axis",
        ),
        (
            variant(LayerNormWithVar, ("x.mean(-1,", "x.mean((-2, -1),"), ("x.var(-1,", "x.var((-2, -1),")),
            r"normalises over the last two axes",
        ),
        (
            variant(LayerNormWithVar, ("x.mean(-1, keepdim=True)", "x.mean(-1, keepdim=True).detach()")),
            r"gradient with respect to `x` differs .* cut from the graph",
        ),
        (LayerNormUsingWeightData, r"gradient with respect to `weight` differs"),
        (LayerNormUnderNoGrad, r"not connected to the autograd graph"),
        (variant(LayerNormWithVar, ("(x - mean)", "x.sub_(mean)")), r"modified its input `x` in place"),
        (LayerNormFixedDtype, r"torch.float32 but the inputs are torch.float64"),
    ],
)
def test_layer_norm_check_names_the_mistake(layer_norm, message):
    both(check_layer_norm, layer_norm, message, exercise="LayerNorm")


def test_hidden_layer_norm_check_fails_an_answer_fitted_to_the_visible_example():
    visible_shapes = {case.shape for case in VISIBLE_LAYER_NORM}

    class Fitted(LayerNormWithVar):
        def forward(self, x):
            return super().forward(x) if tuple(x.shape) in visible_shapes else torch.zeros_like(x)

    check_layer_norm(Fitted)
    with fails():
        check_layer_norm(Fitted, hidden=True)


def test_unrecognised_wrong_layer_norm_shows_the_largest_error_and_where(capsys):
    off_by_a_bit = variant(LayerNormWithVar, ("+ self.bias", "+ self.bias + 0.01"))
    with fails(r"the output and the reference differ:\n  largest error 0.01 at index \("):
        check_layer_norm(off_by_a_bit)
    assert "✔" not in capsys.readouterr().out


# ==================================================================== SublayerConnection: correct


class SublayerConnectionWithTorchModules(nn.Module):
    def __init__(self, d_model, dropout=0.0, norm_first=False):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.p, self.norm_first = dropout, norm_first

    def forward(self, x, sublayer):
        if not self.norm_first:
            return self.norm(x + F.dropout(sublayer(x), self.p, self.training))
        return x + F.dropout(sublayer(self.norm(x)), self.p, self.training)


class SublayerConnectionWithOwnMask(nn.Module):
    """Dropout by hand: a different random stream from nn.Dropout, which the check must accept."""

    def __init__(self, d_model, dropout=0.0, norm_first=False):
        super().__init__()
        self.norm, self.p, self.pre = ReferenceLayerNorm(d_model), dropout, norm_first

    def drop(self, y):
        if not self.training or self.p == 0:
            return y
        keep = torch.rand(y.shape, device=y.device) >= self.p
        return y * keep / (1 - self.p)

    def forward(self, x, sublayer):
        residual = x
        update = self.drop(sublayer(self.norm(x) if self.pre else x))
        out = residual + update
        return out if self.pre else self.norm(out)


class SublayerConnectionWithTwoMethods(nn.Module):
    def __init__(self, d_model, dropout=0.0, norm_first=False):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.norm = ReferenceLayerNorm(d_model)
        self.forward = self.pre_ln if norm_first else self.post_ln

    def post_ln(self, x, sublayer):
        return self.norm(torch.add(x, self.dropout(sublayer(x))))

    def pre_ln(self, x, sublayer):
        return torch.add(x, self.dropout(sublayer(self.norm(x))))


@pytest.mark.parametrize(
    "connection",
    [
        SublayerConnectionWithTorchModules,
        SublayerConnectionWithOwnMask,
        SublayerConnectionWithTwoMethods,
        ReferenceSublayerConnection,
    ],
)
@pytest.mark.parametrize("hidden", [False, True])
def test_sublayer_connection_check_passes_correct_variants(connection, hidden, capsys):
    check_sublayer_connection(connection, hidden=hidden)
    assert "✔ SublayerConnection" in capsys.readouterr().out


# =================================================================== SublayerConnection: mistakes


DropoutOnTheSum = variant(
    SublayerConnectionWithTorchModules,
    ("self.norm(x + F.dropout(sublayer(x),", "self.norm(F.dropout(x + sublayer(x),"),
    ("return x + F.dropout(sublayer(self.norm(x)),", "return F.dropout(x + sublayer(self.norm(x)),"),
)


class PlacementsSwapped(ReferenceSublayerConnection):
    def __init__(self, d_model, dropout=0.0, norm_first=False):
        super().__init__(d_model, dropout, norm_first=not norm_first)


class WithASecondNorm(ReferenceSublayerConnection):
    def __init__(self, d_model, dropout=0.0, norm_first=False):
        super().__init__(d_model, dropout, norm_first)
        self.ln = nn.LayerNorm(d_model)

    def forward(self, x, sublayer):
        if self.norm_first:
            return x + self.dropout(sublayer(self.ln(x)))
        return self.ln(x + self.dropout(sublayer(x)))


class WithoutNormAttribute(nn.Module):
    def __init__(self, d_model, dropout=0.0, norm_first=False):
        super().__init__()
        self.layer_norm, self.dropout, self.norm_first = nn.LayerNorm(d_model), nn.Dropout(dropout), norm_first

    def forward(self, x, sublayer):
        return x + self.dropout(sublayer(self.layer_norm(x)))


class CallingTheSublayerTwice(ReferenceSublayerConnection):
    def forward(self, x, sublayer):
        sublayer(x)  # "just to check the shape"
        return super().forward(x, sublayer)


class IgnoringDropout(ReferenceSublayerConnection):
    def __init__(self, d_model, dropout=0.0, norm_first=False):
        super().__init__(d_model, 0.0, norm_first)


@pytest.mark.parametrize(
    "connection, message",
    [
        (  # x = norm(x); return x + dropout(sublayer(x))
            variant(SublayerConnectionWithTwoMethods, ("torch.add(x,", "torch.add(self.norm(x),"), method="pre_ln"),
            r"Pre-LN written as `x = norm\(x\); x = x \+ f\(x\)`",
        ),
        (PlacementsSwapped, r"Pre-LN and Post-LN swapped"),
        (DropoutOnTheSum, r"dropout applied to the residual sum instead of the sublayer output"),
        (
            variant(
                SublayerConnectionWithTwoMethods,
                ("torch.add(x, self.dropout(sublayer(x)))", "self.dropout(torch.add(x, sublayer(x)))"),
                method="post_ln",
            ),
            r"dropout applied to the residual sum .* should be exactly norm\(x\)",
        ),
        (
            variant(
                SublayerConnectionWithTorchModules,
                ("self.norm(x + F.dropout", "self.norm(F.dropout"),
                ("return x + F.dropout", "return F.dropout"),
            ),
            r"the residual connection is missing",
        ),
        (
            variant(
                SublayerConnectionWithTorchModules,
                ("self.norm(x + F.dropout(sublayer(x), self.p, self.training))",
                 "x + F.dropout(sublayer(x), self.p, self.training)"),
                ("sublayer(self.norm(x))", "sublayer(x)"),
            ),
            r"self.norm is never applied",
        ),
        (
            variant(
                SublayerConnectionWithTorchModules,
                ("self.norm(x + F.dropout(sublayer(x), self.p, self.training))",
                 "x + F.dropout(self.norm(sublayer(x)), self.p, self.training)"),
                ("sublayer(self.norm(x))", "self.norm(sublayer(x))"),
            ),
            r"LayerNorm is applied to the sublayer's output",
        ),
        (WithASecondNorm, r"does not use self.norm"),
        (WithoutNormAttribute, r"has no LayerNorm module `self.norm`"),
        (CallingTheSublayerTwice, r"calls the sublayer 2 times"),
        (
            variant(SublayerConnectionWithTwoMethods, ("torch.add(x,", "x.add_("), method="pre_ln"),
            r"modified its input `x` in place",
        ),
        (IgnoringDropout, r"dropout is never applied in training mode"),
        (  # F.dropout's training is True unless told
            variant(
                SublayerConnectionWithTorchModules,
                ("sublayer(x), self.p, self.training)", "sublayer(x), self.p)"),
                ("sublayer(self.norm(x)), self.p, self.training)", "sublayer(self.norm(x)), self.p)"),
            ),
            r"eval mode: its dropout is still active",
        ),
        (
            variant(
                SublayerConnectionWithTwoMethods,
                ("self.dropout(sublayer(self.norm(x)))", "self.dropout(self.dropout(sublayer(self.norm(x))))"),
                method="pre_ln",
            ),
            r"either dropped or scaled by 1/\(1 - p\)",
        ),
    ],
)
def test_sublayer_connection_check_names_the_mistake(connection, message):
    both(check_sublayer_connection, connection, message)


def test_sublayer_connection_check_does_not_depend_on_the_learners_layer_norm():
    class WithABrokenLayerNorm(ReferenceSublayerConnection):
        def __init__(self, d_model, dropout=0.0, norm_first=False):
            super().__init__(d_model, dropout, norm_first)
            self.norm = LayerNormUnbiased(d_model)  # graded in its own exercise, swapped out here

    check_sublayer_connection(WithABrokenLayerNorm, hidden=True)


def test_sublayer_connection_check_never_prints_a_pass_for_wrong_code(capsys):
    with fails():
        check_sublayer_connection(DropoutOnTheSum)
    assert "✔" not in capsys.readouterr().out


def test_every_check_says_when_the_exercise_is_not_written_yet():
    class NotWritten(nn.Module):
        def __init__(self, *args, **kwargs):
            raise NotImplementedError()

    def not_written(ffn):
        raise NotImplementedError()

    for check, answer in [
        (check_positionwise_feed_forward, NotWritten),
        (check_ffn_as_conv1d, not_written),
        (check_layer_norm, NotWritten),
        (check_sublayer_connection, NotWritten),
    ]:
        with fails(r"is not written yet"):
            check(answer)

