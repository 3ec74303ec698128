"""Zip collection per learner: `python -m autograde_tests.grading --zip-collect` over an LMS download whose
uploads include a zip-slip entry, a linked entry, the student ids `..` and one with a separator, a file that
is not a zip, an unknown archive, and an honest gzipped notebook. The honest learners are graded in full,
each bad upload makes its learner (or the upload) need attention with the reason, the run ends with rc 0,
and nothing is written outside submitted/ (and nbgrader's own extracted/ folder)."""

import gzip
import json
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograde_tests import exchange, nbgrader_course, scratch_course
from autograde_tests.grading.outcome import Cause

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.sandbox
# Nothing here hangs: generous limits keep honest work in full marks on a busy machine.
LIMITS = ["--jobs", "1", "--timeout", "300", "--cell-timeout", "60", "--memory", "3", "--output", "200000"]
CHAPTER = "01_attention"

# learner (or a label for the upload, when its name names no learner safely) -> the start of the reason zip
# collection records for refusing the upload
REFUSED = {
    "mallory": f"lms_download.zip:../mallory_{CHAPTER}.ipynb has a path that leaves the archive's folder",
    "linker": f"lms_download.zip:linker_{CHAPTER}.ipynb is a symbolic link or a special file, not a plain file",
    f"(upload .._{CHAPTER}.ipynb)": "the student id '..' starts with a dot",
    f"(upload back\\slash_{CHAPTER}.ipynb)": "the student id 'back\\\\slash' holds a path separator",
    "(upload broken.zip)": "broken.zip is not a zip archive",
    "(upload old.tar.gz)": "old.tar.gz is an archive of a kind not unpacked here",
}
LEARNERS = ("mallory", "linker")  # the bad uploads whose names name their learner; a label stands for the others
HONEST = ("zoe", "gus")


def _downloads(root: Path) -> None:
    """What an instructor puts in downloaded/<chapter>/archive/: the LMS's zip and single uploads."""
    solved = nbformat.writes(scratch_course.solved(root, CHAPTER))
    archive = root / "downloaded" / CHAPTER / "archive"
    archive.mkdir(parents=True)
    with zipfile.ZipFile(archive / "lms_download.zip", "w") as bundle:
        bundle.writestr(f"zoe_{CHAPTER}.ipynb", solved)
        bundle.writestr(f"../mallory_{CHAPTER}.ipynb", solved)
        link = zipfile.ZipInfo(f"linker_{CHAPTER}.ipynb")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        bundle.writestr(link, str(root / "solutions" / CHAPTER / f"{CHAPTER}.ipynb"))
    (archive / f"gus_{CHAPTER}.ipynb.gz").write_bytes(gzip.compress(solved.encode()))
    (archive / f".._{CHAPTER}.ipynb").write_text(solved)
    (archive / f"back\\slash_{CHAPTER}.ipynb").write_text(solved)
    (archive / "broken.zip").write_text("not a zip")
    (archive / "old.tar.gz").write_bytes(gzip.compress(b"a tar, say"))


def _everything(top: Path) -> set[Path]:
    return {p for p in top.rglob("*")}


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    base = tmp_path_factory.mktemp("zip")
    root = scratch_course.scratch_course(REPO, base / "class")
    scratch_course.release(root, CHAPTER)
    _downloads(root)
    before = _everything(base)
    run = subprocess.run([sys.executable, "-m", "autograde_tests.grading", "--course", str(root), *LIMITS,
                          "--zip-collect"], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    state = json.loads((root / ".grading" / "state.json").read_text())
    return root, state, run.stdout, _everything(base) - before


@pytest.mark.parametrize("student", HONEST)
def test_honest_uploads_are_graded_in_full(collected, student):
    _, state, _, _ = collected
    outcome = state[f"{student}/{CHAPTER}"]
    assert (outcome["status"], outcome["score"], outcome["max_score"]) == ("graded", 6, 6), outcome


def test_the_gzipped_notebook_is_unpacked_as_the_chapters_notebook(collected):
    root, _, _, _ = collected
    assert (root / "submitted" / "gus" / CHAPTER / f"{CHAPTER}.ipynb").is_file()


@pytest.mark.parametrize("student", REFUSED)
def test_zip_collection_refuses_each_bad_upload_for_its_learner_and_says_why(collected, student):
    root, _, _, _ = collected
    refusals = exchange.read_refusals(root / "downloaded" / CHAPTER / exchange.REFUSED)
    (refusal,) = [r for r in refusals if r["student"] == student]
    assert refusal["reason"].startswith(REFUSED[student]), refusal
    assert refusal["labelled"] == (student not in LEARNERS), refusal


@pytest.mark.parametrize("student", REFUSED)
def test_a_bad_upload_makes_its_learner_need_attention(collected, student):
    root, state, stdout, _ = collected
    (refusal,) = [r for r in exchange.read_refusals(root / "downloaded" / CHAPTER / exchange.REFUSED)
                  if r["student"] == student]
    outcome = state[f"{student}/{CHAPTER}"]
    assert (outcome["status"], outcome["cause"]) == ("needs-attention", Cause.REFUSED_UPLOAD), outcome
    assert (outcome["reason"], outcome["labelled"]) == (refusal["reason"], refusal["labelled"]), outcome
    assert f"needs attention  {student} / {CHAPTER}: {outcome['reason']}" in stdout


def test_nothing_is_written_outside_submitted(collected):
    root, _, _, made = collected
    allowed = [root / "submitted", root / "downloaded" / CHAPTER / "extracted", root / "autograded",
               root / "feedback", root / "reports", root / ".grading"]
    allowed_files = {root / "grades.csv", root / "downloaded" / CHAPTER / "refused.json"}
    stray = [p for p in made if p not in allowed_files and not any(p == a or a in p.parents for a in allowed)]
    assert stray == []
    assert sorted(p.name for p in (root / "submitted").iterdir()) == sorted(HONEST)
    assert not (root / CHAPTER).exists()
    assert not [p for p in root.parent.rglob("*mallory*")]  # the zip-slip entry was never unpacked


def test_only_the_honest_learners_reach_the_gradebook(collected):
    root, _, _, _ = collected
    with nbgrader_course.gradebook(root) as book:
        assert sorted(s.id for s in book.students) == sorted(HONEST)


def test_collecting_again_judges_the_uploads_anew(collected, tmp_path):
    """The instructor removes the broken upload and collects again: its entry goes, the rest stay as judged."""
    root = Path(shutil.copytree(collected[0], tmp_path / "class", symlinks=True))
    (root / "downloaded" / CHAPTER / "archive" / "broken.zip").unlink()
    run = subprocess.run([sys.executable, "-m", "autograde_tests.grading", "--course", str(root), *LIMITS,
                          "--zip-collect"], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    state = json.loads((root / ".grading" / "state.json").read_text())
    assert f"(upload broken.zip)/{CHAPTER}" not in state
    assert {key.rsplit("/", 1)[0] for key, o in state.items() if o["status"] == "needs-attention"} == set(REFUSED) - {
        "(upload broken.zip)"}
    assert [state[f"{s}/{CHAPTER}"]["score"] for s in HONEST] == [6, 6]
    assert "0 graded, 2 unchanged" in run.stdout
