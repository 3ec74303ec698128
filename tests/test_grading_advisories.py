"""Advisory notes name what a submission's code does, where it does it, and say nothing of plain code."""

from autograde_tests.grading.advisories import advisories


def test_plain_code_gets_no_note():
    assert advisories(["import torch\nx = torch.randn(3)\nprint(x.softmax(-1))", "%timeit x.sum()"]) == []


def test_each_kind_of_access_is_noted_once_with_where_it_first_happens():
    notes = advisories([
        "print(1)",
        "data = open('notes.txt').read()\nimport subprocess\nsubprocess.run(['ls'])\nimport socket",
        "import sys\nsys.modules['torch']\n!ls",
    ])
    assert notes == [
        "reads or writes files: `open` in learner cell 2, line 1",
        "starts processes or shell commands: `subprocess` in learner cell 2, line 2",
        "reaches the interpreter's internals (sys.modules, builtins, frames, ctypes, the IPython shell): "
        "`sys.modules` in learner cell 3, line 2",
        "opens network connections: `socket` in learner cell 2, line 4",
    ]


def test_a_cell_that_is_not_python_is_skipped():
    assert advisories(["def broken(:\n    open('x')"]) == []
