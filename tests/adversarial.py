"""A class of submissions that try every way to cheat or break the grader, and honest ones written as
learners write them, each with the outcome it must get.

Chapter 01_attention is worth 6 points: test_softmax 2, test_scaled_dot_product_attention 4.
An expected outcome is a score (int) or the cause a submission needs attention for (``Cause``). Every
chapter-1 attack is made with wrong answers (worth 0 on their own), so any point it earns is a point stolen.
Sources may name ``{COURSE}`` (the course folder) and ``{GRADER_PORT}`` (a port on the grader's loopback that
serves correct answers): what a learner who knew the grader's machine would aim at.

``LATER`` holds the attacks whose gain differs by chapter, on chapters 5, 6 and 7: each is that chapter's
solved notebook with one exercise taken another way, so its score is the chapter's total less exactly
that exercise's points, or the total where the attack must gain and lose nothing; and honest answers that
must keep full marks.
"""

import inspect
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import nbformat

from autograde_tests.grading.outcome import Cause

from .test_07_attention_at_scale_checks import (
    online_softmax_by_next_until_exhausted,
    online_softmax_first_chunk_then_the_rest,
)

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
# Wrong answers: softmax over the first axis whatever `dim` says, attention without the 1/sqrt(d_k) scale.
WRONG_SOFTMAX = SOFTMAX.replace("dim=dim", "dim=0")
WRONG_ATTENTION = ATTENTION.replace(" / math.sqrt(q.size(-1))", "")
# Correct answers as a file on the grader's side: what a leak would hand over.
ANSWERS = "import math\nimport torch\n" + SOFTMAX + ATTENTION


def answer(notebook, grade_id: str, source: str):
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            cell.source = source.strip()
            return notebook
    raise KeyError(grade_id)


def solved(notebook, softmax=SOFTMAX, attention=ATTENTION):
    return answer(answer(notebook, "softmax", softmax), "scaled_dot_product_attention", attention)


def wrong(notebook):
    return solved(notebook, WRONG_SOFTMAX, WRONG_ATTENTION)


def cell_index(notebook, grade_id: str) -> int:
    return next(i for i, c in enumerate(notebook.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def with_extra_cell(source: str, after: str = "softmax", answers: Callable = solved):
    """``answers`` (correct by default) with a cell of the learner's own after the cell ``after``."""
    def make(release):
        notebook = answers(release)
        notebook.cells.insert(cell_index(notebook, after) + 1, nbformat.v4.new_code_cell(source.strip()))
        return notebook
    return make


def attack(source: str, after: str = "softmax"):
    """Wrong answers, and a cell that tries to turn them into points."""
    return with_extra_cell(source, after, answers=wrong)


def change_test_cell(change: Callable):
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
    make: Callable  # chapter 1's release (a later chapter's solved notebook) -> notebook, or bytes for the file
    expected: int | Cause
    extra_files: tuple[str, ...] = ()
    file_name: str = ""  # the chapter's own notebook name when empty
    chapter: str = CHAPTER
    link: str = ""  # the notebook handed in is a symbolic link to this path of the course folder
    bounded: bool = False  # what it tries is bounded by the submission's cgroup, where the grader can make one

    @property
    def notebook(self) -> str:
        return self.file_name or f"{self.chapter}.ipynb"


# The canary: graded in the same batch as every attack, it must keep exactly its own score.
CANARY = Case("canary", lambda r: solved(r, attention=WRONG_ATTENTION), 2)

HOSTILE = [
    # patching what judges, through any alias: the judging is not in the kernel
    Case("self_alias_patches_allclose", attack("self = torch\nself.allclose = lambda *args, **kwargs: True"), 0),
    Case("patches_allclose", attack("torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True"), 0),
    Case("patches_assert_close",
         attack("import torch.testing\ntorch.testing.assert_close = lambda *a, **k: None"), 0),
    Case("patches_math_isclose", attack("math.isclose = lambda *a, **k: True"), 0),
    Case("patches_the_harness", attack(
        "import autograde_tests.checks.harness as h\n"
        "h.close = lambda *a, **k: True\nh.fail = lambda *a, **k: None\nh.name_the_mistake = lambda *a, **k: None"), 0),
    Case("patches_check_function",
         attack("import autograde_tests.checks\nautograde_tests.checks.check_softmax = print"), 0),
    Case("poisons_sys_modules", attack(
        "import sys, types\nfake = types.ModuleType('autograde_tests.checks')\n"
        "fake.check_softmax = fake.check_scaled_dot_product_attention = lambda *a, **k: print('✔ passed')\n"
        "sys.modules['autograde_tests.checks'] = fake\nsys.modules['autograde_tests'].checks = fake"), 0),
    Case("builtins_through_a_module_attribute", attack(
        "torch.sys.modules['builtins'].exec(\"import autograde_tests.checks.harness as h; "
        "h.close = lambda *a: True\")\n"
        "torch.os.system('echo pwned > /tmp/pwned')"), 0),
    Case("tensor_subclass_lies", attack(
        "class Liar(torch.Tensor):\n    def __eq__(self, other):\n        return True\n"
        "_wrong = scaled_dot_product_attention\n"
        "def scaled_dot_product_attention(q, k, v, mask=None):\n"
        "    out, w = _wrong(q, k, v, mask)\n    return out.as_subclass(Liar), w.as_subclass(Liar)",
        after="scaled_dot_product_attention"), 0),
    # the kernel's shell, reached through sys.modules
    Case("swallows_exceptions",
         attack("torch.sys.modules['IPython'].get_ipython()"
                ".set_custom_exc((BaseException,), lambda *a, **k: None)"), 0),
    Case("rewrites_every_later_cell", attack(
        "ip = torch.sys.modules['IPython'].get_ipython()\n"
        "ip.input_transformers_post.append(lambda lines: ['print(\"✔ softmax: all cases passed\")\\n'])"), 0),
    Case("answers_the_grader_itself", attack(
        "import autograde_tests.remote.agent as agent\n"
        "def serve(namespace, request):\n"
        "    agent.publish_display_data({agent.MIME: {'reply': '{\"tree\": {\"t\": \"dict\", \"v\": "
        "[[\"ok\", {\"t\": \"tuple\", \"v\": []}]]}, \"tensors\": \"\"}'}})\n"
        "agent.serve = serve"), 0),
    Case("answers_the_grader_with_garbage", attack(
        "import autograde_tests.remote.agent as agent\n"
        "agent.serve = lambda namespace, request: "
        "agent.publish_display_data({agent.MIME: {'reply': '[' * 100000}})"), 0),
    # reaching for answers the kernel must not see
    Case("calls_the_reference_through_sys_modules", lambda r: solved(
        r, "def softmax(x, dim=-1):\n    return torch.sys.modules['autograde_tests.reference'].softmax(x, dim)",
        ATTENTION_OWN_SOFTMAX), 4),
    Case("imports_the_reference", lambda r: solved(
        r, WRONG_SOFTMAX, "from autograde_tests.reference import scaled_dot_product_attention"), 0),
    Case("loads_the_compiled_reference", attack(
        "import glob, marshal, os, autograde_tests\n"
        "cache = os.path.join(os.path.dirname(autograde_tests.__file__), 'reference', '__pycache__')\n"
        "for pyc in glob.glob(cache + '/attention*.pyc'):\n"
        "    exec(marshal.loads(open(pyc, 'rb').read()[16:]))"), 0),
    Case("reads_solutions", attack(
        "import json\nnb = json.load(open('{COURSE}/solutions/01_attention/01_attention.ipynb'))\n"
        "exec('\\n'.join(''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'code' "
        "and 'check_' not in ''.join(c['source'])))"), 0),
    Case("reads_another_students_work", attack(
        "import json\nnb = json.load(open('{COURSE}/submitted/correct/01_attention/01_attention.ipynb'))\n"
        "exec('\\n'.join(''.join(c['source']) for c in nb['cells'] if c['cell_type'] == 'code' "
        "and 'check_' not in ''.join(c['source'])))"), 0),
    Case("fetches_answers_from_the_network", attack(
        "import urllib.request\n"
        "exec(urllib.request.urlopen('http://127.0.0.1:{GRADER_PORT}/answers.py', timeout=5).read())"),
         0),
    Case("rewrites_every_gradebook_it_finds", attack(
        "import glob, os, sqlite3\n"
        "places = ['{COURSE}'] + [os.readlink(p) for p in glob.glob('/proc/*/cwd') if os.path.exists(p)]\n"
        "for place in places:\n"
        "    for db in glob.glob(place + '/**/gradebook.db', recursive=True):\n"
        "        sqlite3.connect(db).execute('update grade set auto_score = 0').connection.commit()\n"
        "torch.os.spawnv(torch.os.P_NOWAIT, '/bin/sh', ['sh', '-c', "
        "'find / -name gradebook.db -exec sh -c \"echo > {}\" \\\\; 2>/dev/null'])"), 0),
    Case("leaves_a_daemon", attack(
        "import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 31337; echo > {COURSE}/gradebook.db'], "
        "start_new_session=True)"), 0),
    # crashes and exits
    Case("segfault_through_ctypes", with_extra_cell("import ctypes\nctypes.string_at(0)"), Cause.KERNEL_DIED),
    Case("exits_the_kernel", with_extra_cell("import os\nos._exit(0)"), Cause.KERNEL_DIED),
    Case("exits_while_being_judged", lambda r: solved(
        r, "def softmax(x, dim=-1):\n    import os\n    os._exit(3)"), Cause.KERNEL_DIED),
]

HONEST = [
    Case("correct", solved, 6),
    Case("correct_float64_inside", lambda r: solved(r, attention=ATTENTION_FLOAT64_INSIDE), 6),
    Case("correct_mask_minus_1e9", lambda r: solved(r, attention=ATTENTION_MINUS_1E9), 6),
    Case("correct_helper_in_own_cell",
         lambda r: solved(with_extra_cell("def scale(d_k):\n    return 1 / math.sqrt(d_k)", "imports")(r),
                          attention=ATTENTION.replace("/ math.sqrt(q.size(-1))", "* scale(q.size(-1))")), 6),
    Case("honest_prints_types", with_extra_cell(
        "x = torch.randn(2, 3)\nprint(type(x), x.dtype, x.shape)\nprint(type(softmax), softmax(x).sum(-1))"), 6),
    Case("honest_times_things", with_extra_cell(
        "import time\nstart = time.perf_counter()\nsoftmax(torch.randn(200, 200))\n"
        "print(f'{time.perf_counter() - start:.4f} s')\n%timeit -n 5 -r 2 softmax(torch.randn(50, 50))"), 6),
    Case("honest_getattr_loop_and_frozen_weights", with_extra_cell(
        "layer = torch.nn.Linear(4, 3)\nfor name in ['weight', 'bias']:\n    print(name, getattr(layer, name).shape)\n"
        "layer.weight.requires_grad = False\nprint(sum(p.numel() for p in layer.parameters() if p.requires_grad))"), 6),
    Case("honest_display_and_markdown", with_extra_cell(
        "from IPython.display import display, Markdown\ndisplay(Markdown('**softmax** of a row sums to 1'))\n"
        "display(softmax(torch.ones(3)))"), 6),
    Case("honest_helper_class_with_repr", with_extra_cell(
        "class Shape:\n    def __init__(self, t):\n        self.t = t\n\n    def __repr__(self):\n"
        "        return f'Shape{tuple(self.t.shape)}'\n\nprint(Shape(torch.ones(2, 5)))"), 6),
    Case("honest_standard_library", with_extra_cell(
        "import collections, dataclasses, functools, itertools, json, random, statistics, typing\n"
        "random.seed(0)\nprint(statistics.mean(random.random() for _ in range(10)))\n"
        "print(json.dumps(collections.Counter('attention')))"), 6),
    Case("honest_plots_the_weights", with_extra_cell(
        "import matplotlib.pyplot as plt\nq, k, v = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6, 8)\n"
        "_, w = scaled_dot_product_attention(q, k, v)\nplt.imshow(w, cmap='viridis')\nplt.colorbar()\nplt.show()",
        after="scaled_dot_product_attention"), 6),
    Case("honest_writes_and_reads_a_file", with_extra_cell(
        "with open('notes.txt', 'w') as f:\n    f.write('softmax is shift-invariant')\n"
        "print(open('notes.txt').read())"), 6),
    Case("honest_runs_a_check_in_a_scratch_cell", with_extra_cell(
        "from autograde_tests.checks import check_softmax\ncheck_softmax(softmax)"), 6),
    Case("honest_compares_with_the_built_in", with_extra_cell(
        "x = torch.randn(3, 5)\nprint(torch.allclose(softmax(x, -1), torch.softmax(x, -1)))\n"
        "import torch.nn.functional as F\nprint((F.softmax(x, 0) - softmax(x, 0)).abs().max())"), 6),
    Case("honest_getattr_by_name_in_the_answer", lambda r: solved(
        r, "def softmax(x, dim=-1):\n    exp = getattr(torch, 'exp')\n    e = exp(x - x.amax(dim=dim, keepdim=True))\n"
           "    return e / e.sum(dim=dim, keepdim=True)"), 6),
    Case("honest_seeds_and_print_options", with_extra_cell(
        "torch.manual_seed(1234)\nimport random\nrandom.seed(0)\ntorch.set_printoptions(precision=3)\n"
        "import numpy as np\nprint(np.array(softmax(torch.ones(3)).tolist()))"), 6),
]

DAMAGED = [
    Case("edited_test_cell", change_test_cell(lambda nb, c: setattr(c, "source", "pass")), 6),
    Case("deleted_test_cell", change_test_cell(lambda nb, c: nb.cells.remove(c)), 6),
    Case("stripped_test_metadata", change_test_cell(lambda nb, c: c.metadata.pop("nbgrader")), 6),
    Case("renamed_grade_id", change_test_cell(lambda nb, c: c.metadata.nbgrader.update(grade_id="test_mine")), 6),
    Case("flipped_nbgrader_flags", change_test_cell(_flip_flags), 6),
    Case("duplicated_test_cell", change_test_cell(_duplicate), 6),
    Case("test_cell_made_markdown", change_test_cell(lambda nb, c: setattr(c, "cell_type", "markdown")), 6),
    Case("changed_kernelspec", _kernelspec, 6),
    Case("old_nbformat_v3", _old_format, 6),
    Case("stale_outputs_claim_a_pass", _stale_pass, 0),
    Case("extra_torch_py_beside_it", solved, 6, extra_files=("torch.py",)),
    # mistakes the checks catch: the exercise's points are lost, nothing more
    Case("forbidden_api_renamed",
         lambda r: solved(r, softmax="from torch.nn.functional import softmax as sm\n\n"
                                     "def softmax(x, dim=-1):\n    return sm(x, dim)",
                          attention=ATTENTION_OWN_SOFTMAX), 4),
    Case("forbidden_api_by_getattr",
         lambda r: solved(r, softmax="softmax = getattr(torch, 'soft' + 'max')", attention=ATTENTION_OWN_SOFTMAX), 4),
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
    # crashes in a cell of the learner's own
    Case("raises_system_exit", with_extra_cell("raise SystemExit(1)"), 6),
    Case("raises_keyboard_interrupt", lambda r: solved(r, attention="raise KeyboardInterrupt\n" + ATTENTION), 2),
    Case("name_error_in_one_cell", with_extra_cell("print(undefined_name)"), 6),
    # resource abuse
    Case("infinite_loop_in_a_cell", with_extra_cell("while True:\n    pass"), 6),
    # 4 GiB written under a 3 GiB cap: the cgroup's OOM killer ends the kernel
    Case("huge_allocation", with_extra_cell("big = torch.ones(2**30)"), Cause.OUT_OF_MEMORY),
    # 4 TiB asked for at once: refused as the cell runs (the kernel lives on), graded as its answers earn
    Case("impossible_allocation", with_extra_cell("big = torch.empty(2**40)"), 6),
    Case("output_flood", with_extra_cell("for _ in range(200):\n    print('x' * 100_000)"), 6),
    # malformed files
    Case("invalid_json", lambda r: b'{"cells": [', Cause.UNREADABLE_NOTEBOOK),
    Case("not_a_notebook_at_all", lambda r: json.dumps({"hello": "world"}).encode(), Cause.UNREADABLE_NOTEBOOK),
    Case("notebook_under_another_name", solved, Cause.NO_NOTEBOOK, file_name="my_attention.ipynb"),
]

CASES = [CANARY, *HOSTILE, *HONEST, *DAMAGED]


# ------------------------------------------------------------------ chapters 5 to 8: what each can gain

TRANSFORMER, DECODER_ONLY, AT_SCALE, TOKENS = "05_transformer", "06_decoder_only", "07_attention_at_scale", "08_tokens"
POINTS = {TRANSFORMER: 20, DECODER_ONLY: 24, AT_SCALE: 9, TOKENS: 11}
# test_positional_encoding 2, test_encoder_layer 3, test_decoder_layer 4, test_transformer 5,
# test_teacher_forcing_loss 3, test_greedy_decode 3; test_rms_norm 2, test_apply_rotary 3, test_decoder_block 5,
# test_gpt 3, test_lm_loss 2, test_generate 4, test_load_hf_llama 2, test_load_meta_llama 3; test_online_softmax 3,
# test_tiled_attention 6; test_train_bpe 6, test_encode 3, test_decode 2.


def replaced(grade_id: str, source: str) -> Callable:
    """The solved notebook with the cell ``grade_id`` written as ``source``."""
    return lambda notebook: answer(notebook, grade_id, source)


def edited(grade_id: str, *changes: tuple[str, str]) -> Callable:
    """The solved notebook with each (correct, other) text of the cell ``grade_id`` changed."""
    def make(notebook):
        cell = notebook.cells[cell_index(notebook, grade_id)]
        for correct, other in changes:
            assert correct in cell.source, (grade_id, correct)
            cell.source = cell.source.replace(correct, other)
        return notebook
    return make


def and_cell(source: str, make: Callable = lambda notebook: notebook, after: str | None = None) -> Callable:
    """``make``'s notebook with a cell of the learner's own after the cell ``after``, or after every graded cell."""
    def made(notebook):
        notebook = make(notebook)
        at = cell_index(notebook, after) + 1 if after else len(notebook.cells)
        notebook.cells.insert(at, nbformat.v4.new_code_cell(source.strip()))
        return notebook
    return made


def links_to_the_instructors(chapter: str) -> Case:
    return Case(f"links_to_the_instructors_{chapter[:2]}", lambda notebook: notebook, Cause.NOT_DATA,
                chapter=chapter, link=f"solutions/{chapter}/{chapter}.ipynb")


# Eight children of 512 MiB each, 4 GiB together under the batch's 3 GiB. The kernel then exits: the rest of
# the notebook would only add time, and the outcome is the OS's count of the processes it killed.
MEMORY_IN_CHILDREN = '''
import os, subprocess, sys
hold = "x = b'1' * (512 << 20); print('held', flush=True); input()"
children = [subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            for _ in range(8)]
print("HELD", [child.stdout.readline().strip().decode() for child in children])
os._exit(0)
'''
# After every graded cell: processes until a fork is refused, /dev/shm and the sockets folder filled until
# they are full, then a MemoryError of the learner's own. None of it may change what the answers earned.
SHM_NAME = f"class-test-{uuid.uuid4().hex}"
FORKS_SHM_SOCKETS_AND_MEMORY_ERROR = f'''
import errno, json, os, subprocess
import ipykernel.connect
children = []
try:
    while True:
        children.append(subprocess.Popen(["sleep", "100000"]))
except OSError as refused:
    print(f"FORKS {{len(children)}} then {{type(refused).__name__}}")
sockets = os.path.dirname(json.load(open(ipykernel.connect.get_connection_file()))["ip"])
for folder in ("/dev/shm", sockets):
    written = 0
    try:
        for n in range(64):  # 16 MiB files (each under the file-size limit), 1 GiB if nothing stops it
            with open(f"{{folder}}/{SHM_NAME}-{{n}}", "wb") as f:
                f.write(b"x" * (16 << 20))
            written += 16 << 20
    except OSError as e:
        print(f"FULL {{folder}} {{errno.errorcode[e.errno]}} after {{written >> 20}} MiB")
raise MemoryError("can't allocate memory: not enough memory (MemoryError)")
'''


def resource_cases(chapter: str) -> list[Case]:
    short = chapter[:2]
    return [Case(f"memory_in_eight_children_{short}", and_cell(MEMORY_IN_CHILDREN, after="imports"),
                 Cause.OUT_OF_MEMORY, chapter=chapter, bounded=True),
            Case(f"forks_fills_shm_raises_memory_error_{short}", and_cell(FORKS_SHM_SOCKETS_AND_MEMORY_ERROR),
                 POINTS[chapter], chapter=chapter, bounded=True)]


# chapter 5: the reference and the checks' decoding are hidden; the kernel's training run is its own report
GREEDY_BY_THE_CHECKS = '''
@torch.no_grad()
def greedy_decode(model, src, max_len, bos_id, eos_id, src_padding_mask=None):
    from autograde_tests.checks.transformer import _greedy  # the reference's decoding, unchanged
    return _greedy()(model, src, max_len, bos_id, eos_id, src_padding_mask)
'''
TRAINING_REPORTED_NOT_RUN = '''
import autograde_tests.checks.stand_in_models as s

class Reported:
    """A run that reports it reached a loss of 0 without taking a step."""
    def __init__(self, *args, **kwargs):
        pass

    def run(self, steps, stop):
        return {"losses": [0.0], "unused": [], "done": True}

s.Training = Reported
'''
# chapter 5: greedy decoding that reads the first position, beside a cell that makes the stand-in model's
# decode reverse time (so the first position would hold the last): the model is lent, the grader's decodes
GREEDY_FIRST_POSITION = ("        next_token = logits[:, -1].argmax(dim=-1)",
                         "        next_token = logits[:, 0].argmax(dim=-1)")
STAND_IN_REVERSES_TIME = '''
import autograde_tests.checks.stand_in_models as s
_decode = s.StandInModel.decode
s.StandInModel.decode = lambda self, *args, **kwargs: _decode(self, *args, **kwargs).flip(1)
'''
# chapter 6: GPT's forward and generate handed to the checks' generators; generate that ignores the cache,
# with the stand-in model patched to answer a call without the cache as if it had been given one
GPT_BY_THE_CHECKS = '''
class GPT(nn.Module):
    def __init__(self, vocab: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, eps: float = 1e-6):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(DecoderBlock(d_model, n_heads, d_ff, eps) for _ in range(n_layers))
        self.norm = RMSNorm(d_model, eps)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx, cache=None):
        from autograde_tests.checks.decoder_only import edited, ref  # the reference's forward, edited with no change
        return edited(ref.GPT.forward)(self, idx, cache)
'''
GENERATE_BY_THE_CHECKS = '''
@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True, generator=None):
    from autograde_tests.checks.decoder_only import _sample  # the reference's sampling, edited with no change
    return _sample()(model, idx, max_new_tokens, temperature, top_k, top_p, use_cache, generator)
'''
NO_CACHE = (("        if use_cache:\n            logits, cache = model(out if cache is None else out[:, -1:], cache)"
             "  # only what it has not seen\n        else:\n            logits, _ = model(out)\n"),
            "        logits, _ = model(out)\n")
CACHE_CLAIMED = ("    out, cache = idx, None\n", "    out, cache = idx, None\n    model.claims_a_cache = use_cache\n")
STAND_IN_ANSWERS_AS_IF_CACHED = '''
import autograde_tests.checks.stand_in_models as s
_forward = s.StandInLM.forward

def forward(self, idx, cache=None):
    """After the first call, what a call given the cache would return, whether it was given one or not."""
    logits, new_cache = _forward(self, idx, cache)
    if cache is None and len(self.fed) > 1 and getattr(self, "claims_a_cache", False):
        logits = logits + self.recall
    return logits, new_cache

s.StandInLM.forward = forward
'''
# chapter 7: the checks' tiling and online softmax; positions made on a fixed device, with the probe that
# runs the code on shape-only tensors replaced; two passes over the chunks, with the watcher replaced
TILED_BY_THE_CHECKS = '''
def tiled_attention(q, k, v, block_q, block_k, causal=False):
    from autograde_tests.checks.attention_at_scale import _tiled  # the reference, edited with no change
    return _tiled()(q, k, v, block_q, block_k, causal)
'''
ONLINE_BY_THE_CHECKS = '''
def online_softmax(chunks):
    from autograde_tests.checks.attention_at_scale import _online  # the reference, edited with no change
    return _online()(chunks)
'''
ON_A_FIXED_DEVICE = (("torch.arange(i, i + rows, device=q.device)", "torch.arange(i, i + rows)"),
                     ("torch.arange(j, j + s.size(-1), device=q.device)", "torch.arange(j, j + s.size(-1))"))
META_PROBE_REPLACED = '''
import autograde_tests.checks.in_kernel as b
b.run_on_meta = lambda fn, args, kwargs: {"devices": ["meta"]}
'''
TWO_PASSES = '''
def online_softmax(chunks):
    m = torch.stack([x.amax(dim=-1) for x in chunks], dim=-1).amax(dim=-1, keepdim=True)
    return m, sum(torch.exp(x - m).sum(dim=-1, keepdim=True) for x in chunks)
'''
# Two right readings of a stream of chunks, each taking every chunk once, in order: full marks.
ONLINE_BY_NEXT, ONLINE_FIRST_THEN_THE_REST = (
    inspect.getsource(fn).replace(f"def {fn.__name__}(", "def online_softmax(")
    for fn in (online_softmax_by_next_until_exhausted, online_softmax_first_chunk_then_the_rest))
WATCHER_REPLACED = '''
import autograde_tests.checks.in_kernel as b
_watched = b.watched
b.watched = lambda *args, **kwargs: {**_watched(*args, **kwargs), "largest": None, "elements": 1, "reads": 1}
'''
# chapter 8: the checks' trainer; a tokenizer library reached by a name no reading of the source can see (the
# sandbox has none to import); decoding into one bytearray, a right reading: full marks
TRAIN_BY_THE_CHECKS = '''
def train_bpe(text, vocab_size, special_tokens=()):
    from autograde_tests.checks.tokens import _trainer  # the reference, edited with no change
    return _trainer()(text, vocab_size, special_tokens)
'''
ENCODE_BY_A_LIBRARY = '''
def encode(text, merges, special_tokens=()):
    import importlib
    library = importlib.import_module("tik" + "token")
    vocab = [bytes([b]) for b in range(256)]
    for left, right in merges:
        vocab.append(vocab[left] + vocab[right])
    special = {s: len(vocab) + j for j, s in enumerate(special_tokens)}
    ranks = {piece: i for i, piece in enumerate(vocab)}
    return library.Encoding("borrowed", pat_str=PATTERN, mergeable_ranks=ranks,
                            special_tokens=special).encode(text, allowed_special="all")
'''
DECODE_INTO_A_BYTEARRAY = '''
def decode(ids, merges, special_tokens=()):
    vocab = token_bytes(merges, special_tokens)
    out = bytearray()
    for i in ids:
        if not 0 <= i < len(vocab):
            raise ValueError(f"no token {i}")
        out += vocab[i]
    return out.decode("utf-8", errors="replace")
'''

LATER = [
    Case("imports_the_reference_05", replaced("transformer", "from autograde_tests.reference import Transformer"),
         20 - 5, chapter=TRANSFORMER),
    Case("greedy_decode_by_the_checks_05", replaced("greedy_decode", GREEDY_BY_THE_CHECKS), 20 - 3,
         chapter=TRANSFORMER),
    Case("greedy_first_position_stand_in_reversed_05", and_cell(STAND_IN_REVERSES_TIME, edited(
        "greedy_decode", GREEDY_FIRST_POSITION), after="imports"), 20 - 3, chapter=TRANSFORMER),
    Case("training_reported_not_run_05", and_cell(TRAINING_REPORTED_NOT_RUN, after="imports"), 20 - 5,
         chapter=TRANSFORMER),
    links_to_the_instructors(TRANSFORMER),
    *resource_cases(TRANSFORMER),
    Case("imports_the_reference_06", replaced("gpt", "from autograde_tests.reference import GPT"), 24 - 3,
         chapter=DECODER_ONLY),
    Case("gpt_by_the_checks_06", replaced("gpt", GPT_BY_THE_CHECKS), 24 - 3, chapter=DECODER_ONLY),
    # a named mistake in each of the exercises issue 27 added costs that exercise alone
    Case("kv_heads_tiled_06", edited("decoder_block", ("k.repeat_interleave(group, dim=1), v.repeat_interleave(group, "
                                                       "dim=1)", "k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)")),
         24 - 5, chapter=DECODER_ONLY),
    Case("gate_and_up_swapped_06",
         edited("load_meta_llama", ('"w_gate": "feed_forward.w1"', '"w_gate": "feed_forward.w3"'),
                ('"w_up": "feed_forward.w3"', '"w_up": "feed_forward.w1"')),
         24 - 3, chapter=DECODER_ONLY),
    Case("generate_by_the_checks_06", replaced("generate", GENERATE_BY_THE_CHECKS), 24 - 4, chapter=DECODER_ONLY),
    # whether generate uses the cache is the grader's record (the stand-in model is lent): patching it gains nothing
    Case("ignores_the_cache_06", edited("generate", NO_CACHE), 24 - 4, chapter=DECODER_ONLY),
    Case("ignores_the_cache_stand_in_patched_06", and_cell(STAND_IN_ANSWERS_AS_IF_CACHED, edited(
        "generate", NO_CACHE, CACHE_CLAIMED), after="imports"), 24 - 4, chapter=DECODER_ONLY),
    links_to_the_instructors(DECODER_ONLY),
    *resource_cases(DECODER_ONLY),
    Case("imports_the_reference_07",
         replaced("tiled_attention", "from autograde_tests.reference import tiled_attention"), 9 - 6, chapter=AT_SCALE),
    Case("tiled_attention_by_the_checks_07", replaced("tiled_attention", TILED_BY_THE_CHECKS), 9 - 6, chapter=AT_SCALE),
    Case("online_softmax_by_the_checks_07", replaced("online_softmax", ONLINE_BY_THE_CHECKS), 9 - 3, chapter=AT_SCALE),
    # a device written into the code is seen only on the kernel's shape-only run: a note, so hiding it gains nothing
    Case("on_a_fixed_device_07", edited("tiled_attention", *ON_A_FIXED_DEVICE), 9, chapter=AT_SCALE),
    Case("on_a_fixed_device_probe_replaced_07", and_cell(META_PROBE_REPLACED, edited(
        "tiled_attention", *ON_A_FIXED_DEVICE), after="imports"), 9, chapter=AT_SCALE),
    Case("two_passes_watcher_replaced_07", and_cell(WATCHER_REPLACED, replaced("online_softmax", TWO_PASSES),
                                                     after="imports"), 9, chapter=AT_SCALE),
    Case("online_softmax_by_next_07", replaced("online_softmax", ONLINE_BY_NEXT), 9, chapter=AT_SCALE),
    Case("online_softmax_first_then_the_rest_07", replaced("online_softmax", ONLINE_FIRST_THEN_THE_REST), 9,
         chapter=AT_SCALE),
    links_to_the_instructors(AT_SCALE),
    *resource_cases(AT_SCALE),
    Case("imports_the_reference_08", replaced("train_bpe", "from autograde_tests.reference import train_bpe"),
         11 - 6, chapter=TOKENS),
    Case("train_bpe_by_the_checks_08", replaced("train_bpe", TRAIN_BY_THE_CHECKS), 11 - 6, chapter=TOKENS),
    Case("encode_by_a_library_08", replaced("encode", ENCODE_BY_A_LIBRARY), 11 - 3, chapter=TOKENS),
    Case("decode_into_a_bytearray_08", replaced("decode", DECODE_INTO_A_BYTEARRAY), 11, chapter=TOKENS),
]
