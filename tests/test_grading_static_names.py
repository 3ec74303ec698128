"""The grader's own reading of the learner's source finds a forbidden built-in however it is named in
the source, and not where an honest learner only compares with it or names their own things alike."""

import pytest

from autograde_tests.grading.static_names import StaticNames

IMPORTS = "import math\nimport torch\nimport torch.nn.functional as F"


def reaches(*cells: str, name: str = "softmax") -> set[str]:
    return StaticNames([IMPORTS, *cells])(name)


def softmax_reaches(found: set[str]) -> bool:
    return any("softmax" in n for n in found)


@pytest.mark.parametrize(
    "cells",
    [
        ["def softmax(x, dim=-1):\n    return torch.softmax(x, dim)"],
        ["def softmax(x, dim=-1):\n    return x.softmax(dim)"],
        ["normalise = F.softmax", "def softmax(x, dim=-1):\n    return normalise(x, dim)"],
        ["from torch.nn.functional import softmax as sm", "def softmax(x, dim=-1):\n    return sm(x, dim)"],
        ["def helper(x):\n    return F.log_softmax(x, -1).exp()", "def softmax(x, dim=-1):\n    return helper(x)"],
        ["def softmax(x, dim=-1):\n    return getattr(torch, 'softmax')(x, dim)"],
        ["def softmax(x, dim=-1):\n    return vars(torch)['softmax'](x, dim)"],
        ["softmax = getattr(F, 'softmax')"],
        ["%time x = 1\ndef softmax(x, dim=-1):\n    return torch.softmax(x, dim)"],
    ],
    ids=["torch.softmax", "method", "alias", "import-as", "through-a-helper", "getattr", "vars", "assigned",
         "after-a-magic"],
)
def test_a_built_in_softmax_is_found_however_it_is_named(cells):
    assert softmax_reaches(reaches(*cells))


@pytest.mark.parametrize(
    "cells",
    [
        ["def softmax(x, dim=-1):\n    e = torch.exp(x - x.amax(dim, keepdim=True))\n    return e / e.sum(dim, True)"],
        ["def stable_softmax(x, dim):\n    e = (x - x.amax(dim, keepdim=True)).exp()\n    return e / e.sum(dim, True)",
         "def softmax(x, dim=-1):\n    return stable_softmax(x, dim)"],
        ["def softmax(x, dim=-1):\n    '''Like F.softmax, by hand.'''\n    print('softmax')\n"
         "    return x.exp() / x.exp().sum(dim, True)"],
        ["def softmax(x, dim=-1):\n    return x.exp() / x.exp().sum(dim, True)",
         "print(torch.allclose(softmax(torch.ones(2)), torch.softmax(torch.ones(2), -1)))"],
        ["class Normaliser:\n    def softmax(self, x):\n        return x.exp() / x.exp().sum()",
         "def softmax(x, dim=-1):\n    return Normaliser().softmax(x)"],
        ["from torch.nn.functional import softmax",
         "def softmax(x, dim=-1):\n    return x.exp() / x.exp().sum(dim, True)"],
    ],
    ids=["by-hand", "own-helper-named-softmax", "docstring-and-print", "compared-in-a-scratch-cell",
         "own-method-named-softmax", "built-in-rebound-by-own"],
)
def test_honest_code_does_not_reach_a_built_in_softmax(cells):
    assert not softmax_reaches(reaches(*cells))


def test_a_definition_in_a_branch_that_may_not_run_counts_too():
    cells = ["def softmax(x, dim=-1):\n    return x.exp() / x.exp().sum(dim, True)",
             "if torch.cuda.is_available():\n    softmax = F.softmax"]
    assert softmax_reaches(reaches(*cells))


def test_a_cell_that_is_not_python_defines_nothing():
    assert reaches("def softmax(x, dim=-1)\n    return torch.softmax(x, dim)") == set()
