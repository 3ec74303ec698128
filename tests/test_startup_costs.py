"""What a process pays before it does any work, for the ones a graded class starts by the hundred: each
guard below holds a saving measured once (seconds of a core per process) against a change of version or of
an import that would bring the cost back. Each runs in a fresh interpreter, which has loaded nothing yet."""

import subprocess
import sys


def loaded(code: str, modules: list[str]) -> list[str]:
    """Which of ``modules`` a fresh Python has loaded after running ``code``."""
    run = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(*(m in sys.modules for m in {modules!r}))"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return [m for m, there in zip(modules, run.stdout.split()) if there == "True"]


def test_reading_a_notebook_builds_no_grammar():
    """jsonschema from 4.24 checks IRIs with rfc3987-syntax, which builds a parser as it is imported: about 5 s
    of a core in every process that imports nbformat (the coordinator, each worker, nbgrader, the book)."""
    assert loaded("import nbformat\nnbformat.validate(nbformat.v4.new_notebook())", ["rfc3987_syntax"]) == []


def test_the_grading_coordinator_loads_no_pytorch():
    """The coordinator runs no kernel and judges nothing: PyTorch (about 3 s of a core) is the workers'."""
    assert loaded("import autograde_tests.grading.__main__", ["torch", "alembic"]) == []


def test_the_kernels_records_leave_torch_compile_unloaded():
    """Recording a call's operators and the tensors they create in a fresh kernel loads no ``torch._dynamo``
    (about 2 s of a core per graded kernel, from PyTorch's guard around a dispatch mode)."""
    code = ("import torch\nfrom autograde_tests.checks import in_kernel\nx = torch.ones(2, 3)\n"
            "assert 'aten::_softmax' in in_kernel.operators_used(torch.softmax, (x, -1))\n"
            "assert in_kernel.watched(torch.softmax, (x, -1), {})['elements'] == 6")
    assert loaded(code, ["torch._dynamo"]) == []
