"""The code filter admits plain PyTorch (every course solution) and refuses every way to reach the grader."""

from pathlib import Path

import nbformat
import pytest

from autograde_tests import course
from autograde_tests.grading.code_filter import check_source

REPO = Path(__file__).resolve().parents[1]


def learner_cells(folder: str):
    for chapter in course.chapters(REPO):
        notebook = nbformat.read(REPO / folder / chapter / f"{chapter}.ipynb", as_version=4)
        for cell in notebook.cells:
            if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("locked"):
                yield pytest.param(cell.source, id=f"{chapter}:{cell.id}")


@pytest.mark.parametrize("source", list(learner_cells("solutions")))
def test_every_course_solution_passes(source):
    assert check_source(source) == []


@pytest.mark.parametrize("source", list(learner_cells("notebooks")))
def test_every_released_learner_cell_passes(source):
    assert check_source(source) == []


PLAIN = [
    "import math\nimport torch\nfrom torch import nn\nimport torch.nn.functional as F",
    "class M(nn.Module):\n    def __init__(self, d):\n        super().__init__()\n        self.w = nn.Linear(d, d)\n"
    "    def forward(self, x):\n        B, T, _ = x.shape\n        return self.w(x).view(B, T, -1)",
    "scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)\nweights = torch.where(mask, scores, float('-inf'))",
    "cache = {}\ncache['x'] = 1\nitems = [1, 2]\nitems[0] = 3",
    "torch.manual_seed(0)\nimport matplotlib.pyplot as plt\nplt.imshow(torch.zeros(2, 2))",
    "from autograde_tests.checks import check_softmax\ncheck_softmax(softmax)",
    "try:\n    x = 1 / 0\nexcept ZeroDivisionError:\n    x = 0",
]


@pytest.mark.parametrize("source", PLAIN)
def test_plain_pytorch_passes(source):
    assert check_source(source) == []


REFUSED = {
    "torch.allclose = lambda *a, **k: True": "changes torch.allclose",
    "import torch.testing\ntorch.testing.assert_close = print": "changes torch.testing.assert_close",
    "import math\nmath.isclose = lambda *a, **k: True": "changes math.isclose",
    "import autograde_tests.checks as c\nc.check_softmax = print": "imports autograde_tests.checks",
    "from autograde_tests.checks import harness": "imports from autograde_tests.checks",
    "from autograde_tests.reference import softmax": "imports from autograde_tests.reference",
    "from autograde_tests import reference": "imports from autograde_tests",
    "class Liar(torch.Tensor):\n    pass": "subclasses torch.Tensor",
    "def __eq__(self, other):\n    return True": "defines the special method __eq__",
    "get_ipython().set_custom_exc((Exception,), None)": "uses get_ipython",
    "!rm -rf /": "uses get_ipython",
    "%env X=1": "uses get_ipython",
    "softmax = getattr(torch, 'soft' + 'max')": "uses getattr",
    "eval('1')": "uses eval",
    "exec('x = 1')": "uses exec",
    "__import__('os')": "uses __import__",
    "import os\nos._exit(0)": "imports os",
    "import sys": "imports sys",
    "import ctypes\nctypes.string_at(0)": "imports ctypes",
    "import signal": "imports signal",
    "x = torch._C": "private attribute ._C",
    "f = softmax.__globals__": "private attribute .__globals__",
    "torch.ops.aten._softmax(x, -1, False)": "uses .ops",
    "open('/etc/passwd').read()": "uses open",
    "torch.load('model.pt')": "uses .load",
    "import numpy as np\nnp.loadtxt('solutions/x')": "uses .loadtxt",
    "def g():\n    yield\ngen = g()\nframe = gen.gi_frame": "uses .gi_frame",
    "globals()['check_softmax'] = print": "uses globals",
    "vars(torch)['allclose'] = print": "uses vars",
    "global check_softmax": "declares global",
    "exit()": "uses exit",
    "torch.nn.functional.__dict__['softmax']": "private attribute .__dict__",
    "class M(metaclass=type):\n    pass": "metaclass",
    "torch.set_default_dtype(torch.float16)": "uses .set_default_dtype",
    "del torch.allclose": "changes torch.allclose",
    "torch.Tensor.allclose = lambda *a: True": "changes torch.Tensor.allclose",
}


@pytest.mark.parametrize("source, construct", REFUSED.items(), ids=list(REFUSED))
def test_tampering_is_refused_with_the_construct_named(source, construct):
    violations = check_source(source)
    assert violations and any(construct in str(v) for v in violations), violations


def test_violation_names_its_line():
    assert str(check_source("x = 1\ntorch.allclose = print")[0]).startswith("line 2:")
