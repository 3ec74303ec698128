"""`python -m autograde_tests.grading --jobs 1` on a scratch class, kernels in bubblewrap: a rule about how
an answer was computed earns points only from what the grader sees itself, so what a learner's cell does to
the kernel's own records changes no score.

- chapter 1 (softmax 2 points, attention 4): ``torch.nn.Softmax`` with the kernel's record of operators
  silenced loses the softmax's points, by the grader's reading of the source;
- chapter 7 (online_softmax 3, tiled_attention 6): plain attention builds the whole score matrix, which
  only the kernel's record shows, so in a graded run it is a note; with the watcher patched to hide it or
  not, the score is the same 9, its values being right;
- chapter 5 (Transformer 5 of 20): a model that memorises the labels its training was sent reverses none
  of the fresh strings the grader then decodes itself.
"""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograde_tests import scratch_course

from .adversarial import ATTENTION_OWN_SOFTMAX, solved, with_extra_cell

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.sandbox
CHAPTERS = ("01_attention", "05_transformer", "07_attention_at_scale")

NN_SOFTMAX = "def softmax(x, dim=-1):\n    return torch.nn.Softmax(dim=dim)(x)"
SILENCE_THE_OPERATOR_RECORD = "import autograde_tests.checks.in_kernel as b\nb.operators_used = lambda fn, args: []"
PLAIN_ATTENTION = '''
def tiled_attention(q, k, v, block_q, block_k, causal=False):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v
'''
HIDE_THE_SCORE_MATRIX = '''
import autograde_tests.checks.in_kernel as b
_watched = b.watched
b.watched = lambda *args, **kwargs: {**_watched(*args, **kwargs), "largest": None, "elements": 1, "reads": 1}
'''
MEMORISE_THE_LABELS = '''
import torch.nn.functional as F
import autograde_tests.checks.stand_in_models as s

class Transformer(Transformer):
    memory = {}

    def forward(self, src, tgt, src_padding_mask=None, tgt_padding_mask=None):
        logits = super().forward(src, tgt, src_padding_mask, tgt_padding_mask)
        for b, row in enumerate(src.tolist()):
            if tuple(row) in self.memory:
                logits[b] = 100 * F.one_hot(self.memory[tuple(row)][: tgt.size(1)], logits.size(-1)).to(logits)
        return logits

class Memorising:
    def __init__(self, model, src, decoder_input, labels, pad, lr):
        model.memory.update({tuple(row): labels[b] for b, row in enumerate(src.tolist())})

    def run(self, steps, stop):
        return {"losses": [0.0], "unused": [], "done": True}

s.Training = Memorising
'''


def _replaced(cell_id: str, source: str):
    def make(notebook):
        return scratch_course.with_mistake(notebook, cell_id, _source(notebook, cell_id), source.strip())
    return make


def _source(notebook, grade_id: str) -> str:
    return next(c.source for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


SUBMISSIONS = {  # (student, chapter): (the solved notebook -> the submission, its score)
    ("nn_softmax_silenced", "01_attention"): (
        with_extra_cell(SILENCE_THE_OPERATOR_RECORD,
                        answers=lambda r: solved(r, softmax=NN_SOFTMAX, attention=ATTENTION_OWN_SOFTMAX)), 4),
    ("plain_attention", "07_attention_at_scale"): (_replaced("tiled_attention", PLAIN_ATTENTION), 9),
    ("plain_attention_hidden", "07_attention_at_scale"): (
        with_extra_cell(HIDE_THE_SCORE_MATRIX, after="tiled_attention",
                        answers=_replaced("tiled_attention", PLAIN_ATTENTION)), 9),
    ("memoriser", "05_transformer"): (
        with_extra_cell(MEMORISE_THE_LABELS, after="transformer", answers=lambda n: n), 15),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = scratch_course.scratch_course(REPO, tmp_path_factory.mktemp("class"))
    for chapter in CHAPTERS:
        scratch_course.release(root, chapter)
    for (student, chapter), (make, _) in SUBMISSIONS.items():
        scratch_course.submit(root, student, chapter, make(scratch_course.solved(root, chapter)))
    run = subprocess.run([sys.executable, "-m", "autograde_tests.grading", "--course", str(root), "--jobs", "1",
                          "--timeout", "600", "--cell-timeout", "120", "--memory", "3"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return root, json.loads((root / ".grading" / "state.json").read_text())


@pytest.mark.parametrize("submission", list(SUBMISSIONS), ids=[student for student, _ in SUBMISSIONS])
def test_what_a_cell_does_to_the_kernels_records_changes_no_score(graded, submission):
    root, outcomes = graded
    student, chapter = submission
    outcome = outcomes[f"{student}/{chapter}"]
    assert outcome["score"] == SUBMISSIONS[submission][1], (outcome, scratch_course.diagnoses(root, student, chapter))


def test_a_graded_run_shows_the_kernels_record_as_a_note(graded):
    root, _ = graded
    notebook = nbformat.read(root / "autograded" / "plain_attention" / "07_attention_at_scale"
                             / "07_attention_at_scale.ipynb", as_version=4)
    shown = "".join(o.get("text", "") for c in notebook.cells for o in c.get("outputs", []))
    assert "note from your kernel's own record, not graded: you built the full score matrix" in shown
