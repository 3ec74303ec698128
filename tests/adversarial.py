"""Submissions that try every way to break or cheat the class grader, each with the outcome it must get.

Chapter 01_attention is worth 6 points: test_softmax 2, test_scaled_dot_product_attention 4.
An expected outcome is a score (int) or the start of a needs-attention reason (str).
"""

import json
from collections.abc import Callable
from dataclasses import dataclass

import nbformat

CHAPTER = "01_attention"

SOFTMAX = '''
def softmax(x, dim=-1):
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)
'''
ATTENTION = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v, weights
'''
ATTENTION_FLOAT64_INSIDE = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return (weights @ v.double()).to(q.dtype), weights.to(q.dtype)
'''
ATTENTION_MINUS_1E9 = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = torch.einsum("...md,...nd->...mn", q, k) / q.size(-1) ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    weights = softmax(scores)
    if mask is not None:
        weights = weights * mask
    return torch.einsum("...mn,...nv->...mv", weights, v), weights
'''
ATTENTION_OWN_SOFTMAX = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    weights = (e / e.sum(dim=-1, keepdim=True)).nan_to_num(0.0)
    return weights @ v, weights
'''


def answer(notebook, grade_id: str, source: str):
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            cell.source = source.strip()
            return notebook
    raise KeyError(grade_id)


def solved(notebook, softmax=SOFTMAX, attention=ATTENTION):
    return answer(answer(notebook, "softmax", softmax), "scaled_dot_product_attention", attention)


def cell_index(notebook, grade_id: str) -> int:
    return next(i for i, c in enumerate(notebook.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def with_extra_cell(source: str, after: str = "softmax"):
    def make(release):
        notebook = solved(release)
        notebook.cells.insert(cell_index(notebook, after) + 1, nbformat.v4.new_code_cell(source))
        return notebook
    return make


def test_cell_changed(change: Callable):
    def make(release):
        notebook = solved(release)
        change(notebook, notebook.cells[cell_index(notebook, "test_softmax")])
        return notebook
    return make


def _duplicate(notebook, cell):
    copy = nbformat.from_dict(cell)
    copy.id = "pasted-copy"  # as JupyterLab pastes it: a new cell id, the same nbgrader grade id
    notebook.cells.insert(cell_index(notebook, "test_softmax"), copy)


def _flip_flags(notebook, cell):
    cell.metadata.nbgrader.update(grade=False, points=100)
    notebook.cells[cell_index(notebook, "softmax")].metadata.nbgrader.update(locked=True, solution=False)


def _stale_pass(release):
    for cell in release.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.outputs = [nbformat.v4.new_output("stream", text="✔ all cases passed\n")]
            cell.execution_count = 1
    return release


def _old_format(release) -> bytes:
    return nbformat.writes(nbformat.convert(solved(release), 3), version=3).encode()


def _kernelspec(release):
    notebook = solved(release)
    notebook.metadata.kernelspec = {"name": "julia-1.9", "display_name": "Julia", "language": "julia"}
    return notebook


@dataclass(frozen=True)
class Case:
    student: str
    make: Callable  # release notebook -> notebook, or bytes to write as the file
    expected: int | str
    extra_files: tuple[str, ...] = ()
    file_name: str = f"{CHAPTER}.ipynb"


CASES = [
    # correct code, written differently: full marks
    Case("correct", solved, 6),
    Case("correct_float64_inside", lambda r: solved(r, attention=ATTENTION_FLOAT64_INSIDE), 6),
    Case("correct_mask_minus_1e9", lambda r: solved(r, attention=ATTENTION_MINUS_1E9), 6),
    Case("correct_helper_in_own_cell",
         lambda r: solved(with_extra_cell("def scale(d_k):\n    return 1 / math.sqrt(d_k)", "imports")(r),
                          attention=ATTENTION.replace("/ math.sqrt(q.size(-1))", "* scale(q.size(-1))")), 6),
    Case("correct_with_plots", with_extra_cell("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nprint('hi')"), 6),
    Case("reseeds_global_rng", with_extra_cell("torch.manual_seed(1234)\nimport random\nrandom.seed(0)"), 6),
    # damaged or tampered notebook structure: repaired, graded on the learner's code
    Case("edited_test_cell", test_cell_changed(lambda nb, c: setattr(c, "source", "pass")), 6),
    Case("deleted_test_cell", test_cell_changed(lambda nb, c: nb.cells.remove(c)), 6),
    Case("stripped_test_metadata", test_cell_changed(lambda nb, c: c.metadata.pop("nbgrader")), 6),
    Case("renamed_grade_id", test_cell_changed(lambda nb, c: c.metadata.nbgrader.update(grade_id="test_mine")), 6),
    Case("flipped_nbgrader_flags", test_cell_changed(_flip_flags), 6),
    Case("duplicated_test_cell", test_cell_changed(_duplicate), 6),
    Case("test_cell_made_markdown", test_cell_changed(lambda nb, c: setattr(c, "cell_type", "markdown")), 6),
    Case("changed_kernelspec", _kernelspec, 6),
    Case("old_nbformat_v3", _old_format, 6),
    Case("stale_outputs_claim_a_pass", _stale_pass, 0),
    Case("extra_torch_py_beside_it", solved, 6, extra_files=("torch.py",)),
    # cheating: refused before anything runs
    Case("patches_allclose", with_extra_cell("torch.allclose = lambda *a, **k: True"), "tampering detected"),
    Case("patches_assert_close",
         with_extra_cell("import torch.testing\ntorch.testing.assert_close = lambda *a, **k: None"), "tampering detected"),
    Case("patches_math_isclose", with_extra_cell("math.isclose = lambda *a, **k: True"), "tampering detected"),
    Case("patches_check_function",
         with_extra_cell("import autograde_tests.checks\nautograde_tests.checks.check_softmax = print"), "tampering detected"),
    Case("tensor_subclass_lies",
         with_extra_cell("class Liar(torch.Tensor):\n    def __eq__(self, other):\n        return True"), "tampering detected"),
    Case("swallows_exceptions",
         with_extra_cell("get_ipython().set_custom_exc((Exception,), lambda *a, **k: None)"), "tampering detected"),
    Case("delegates_to_reference",
         lambda r: solved(r, attention="from autograde_tests.reference import scaled_dot_product_attention"),
         "tampering detected"),
    Case("forbidden_api_by_getattr",
         lambda r: solved(r, softmax="softmax = getattr(torch, 'soft' + 'max')"), "tampering detected"),
    Case("segfault_through_ctypes", with_extra_cell("import ctypes\nctypes.string_at(0)"), "tampering detected"),
    Case("exits_the_kernel", with_extra_cell("import os\nos._exit(0)"), "tampering detected"),
    # mistakes the checks catch: the exercise's points are lost, nothing more
    Case("forbidden_api_renamed",
         lambda r: solved(r, softmax="from torch.nn.functional import softmax as sm\n\n"
                                     "def softmax(x, dim=-1):\n    return sm(x, dim)",
                          attention=ATTENTION_OWN_SOFTMAX), 4),
    Case("hard_coded_to_visible_example",
         lambda r: solved(r, attention=ATTENTION.replace(
             "    return weights @ v, weights",
             "    if q.shape[-2:] != (3, 4) and q.shape[-2:] != (4, 8):\n"
             "        return torch.zeros_like(weights @ v), weights\n    return weights @ v, weights")), 2),
    Case("modifies_inputs_in_place",
         lambda r: solved(r, attention=ATTENTION.replace("    scores = q @", "    q -= 0.5\n    scores = q @")), 2),
    Case("float32_buffer_breaks_float64",
         lambda r: solved(r, attention=ATTENTION.replace("return weights @ v, weights",
                                                         "return (weights @ v).float(), weights")), 2),
    # crashes
    Case("raises_system_exit", with_extra_cell("raise SystemExit(1)"), 6),
    Case("raises_keyboard_interrupt", lambda r: solved(r, attention="raise KeyboardInterrupt\n" + ATTENTION), 2),
    Case("name_error_in_one_cell", with_extra_cell("print(undefined_name)"), 6),
    # resource abuse
    Case("infinite_loop_in_a_cell", with_extra_cell("while True:\n    pass"), 6),
    Case("huge_allocation", with_extra_cell("big = torch.empty(2**40)"), "memory limit"),
    Case("output_flood", with_extra_cell("for _ in range(200):\n    print('x' * 100_000)"), 6),
    # malformed files
    Case("invalid_json", lambda r: b'{"cells": [', "unreadable notebook"),
    Case("not_a_notebook_at_all", lambda r: json.dumps({"hello": "world"}).encode(), "unreadable notebook"),
    Case("notebook_under_another_name", solved, "no 01_attention.ipynb", file_name="my_attention.ipynb"),
]
