"""The grader's reading of the source sees every spelling of a built-in that the source itself shows: the
classes (``nn.Softmax``, whose name the checks compare whatever its case), strings put together from
constants, and a module's attribute even where the learner has a method of the same name."""

import pytest

from autograde_tests.checks.how import named_like
from autograde_tests.grading.static_names import StaticNames

IMPORTS = "import math\nimport torch\nimport torch.nn.functional as F\nfrom torch import nn"


def softmax_reached(*cells: str) -> list[str]:
    return named_like("softmax", StaticNames([IMPORTS, *cells])("softmax"))


@pytest.mark.parametrize(
    "cells",
    [
        ["def softmax(x, dim=-1):\n    return torch.nn.Softmax(dim=dim)(x)"],
        ["def softmax(x, dim=-1):\n    return nn.Softmax(dim)(x)"],
        ["from torch.nn import Softmax", "def softmax(x, dim=-1):\n    return Softmax(dim)(x)"],
        ["def softmax(x, dim=-1):\n    return torch.special.softmax(x, dim)"],
        ["def softmax(x, dim=-1):\n    return F.log_softmax(x, dim).exp()"],
        ["def softmax(x, dim=-1):\n    return getattr(torch, 'soft' + 'max')(x, dim)"],
        ["def softmax(x, dim=-1):\n    return getattr(F, f\"{'soft'}max\")(x, dim)"],
        ["def softmax(x, dim=-1):\n    return getattr(torch, ''.join(['soft', 'max']))(x, dim)"],
        ["def softmax(x, dim=-1):\n    return vars(torch)['soft' + 'max'](x, dim)"],
        ["class Mine:\n    def softmax(self, x):\n        return x",
         "def softmax(x, dim=-1):\n    return F.softmax(x, dim)"],
        ["class Mine:\n    def softmax(self, x):\n        return x",
         "def softmax(x, dim=-1):\n    return torch.nn.functional.softmax(x, dim)"],
    ],
    ids=["nn.Softmax", "imported-nn", "imported-class", "torch.special", "log_softmax", "getattr-sum",
         "getattr-fstring", "getattr-join", "vars-sum", "own-method-beside-F", "own-method-beside-dotted"],
)
def test_every_spelling_the_source_shows_is_seen(cells):
    assert softmax_reached(*cells)


@pytest.mark.parametrize(
    "cells",
    [
        ["class Normaliser:\n    def softmax(self, x):\n        return x.exp() / x.exp().sum()",
         "def softmax(x, dim=-1):\n    return Normaliser().softmax(x)"],
        ["def softmax(x, dim=-1):\n    name = 'soft' + 'max'\n    print(name)\n"
         "    return x.exp() / x.exp().sum(dim, True)"],
        ["def softmax(x, dim=-1):\n    e = torch.exp(x - x.amax(dim, keepdim=True))\n    return e / e.sum(dim, True)"],
    ],
    ids=["own-method", "a-string-that-names-nothing", "by-hand"],
)
def test_honest_code_still_reaches_no_built_in(cells):
    assert not softmax_reached(*cells)


def test_a_name_computed_at_run_time_is_left_to_the_kernels_record():
    assert not softmax_reached("def softmax(x, dim=-1):\n    return getattr(torch, bytes([115, 111, 102, 116, 109, 97, "
                               "120]).decode())(x, dim)")
