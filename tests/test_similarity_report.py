"""The similarity report: it lists exactly the copies (disguised or not, of a classmate or of a published
answer), never an independent answer, and a learner's text never breaks its page."""

import html.parser
import re
import textwrap
from pathlib import Path

import nbformat
import pytest

from autograde_tests import nbgrader_course, scratch_course
from autograde_tests.authoring import solution_regions
from autograde_tests.grading import limits, similarity
from autograde_tests.grading.__main__ import parse

from . import similarity_measure
from .disguises import DISGUISES, everything, renamed
from .independent_answers import ch06_compact, ch06_einsum, ch06_loops, ch06_verbose

REPO = Path(__file__).resolve().parents[1]
CHAPTER = "06_decoder_only"


@pytest.mark.parametrize("chapter", nbgrader_course.chapters(REPO))
def test_disguised_copies_reach_the_threshold_and_independent_answers_stay_below(chapter):
    """And the instructor guide says so: its table holds each exercise's measured row, and its bounds hold."""
    guide = (REPO / "book" / "instructor_guide.md").read_text()
    copies = float(re.search(r"Every copy scores (\d\.\d\d) or more", guide).group(1))
    independent = float(re.search(r"every independent pair (\d\.\d\d) or less", guide).group(1))
    for s in similarity_measure.measure(chapter):
        assert s.lowest_copy >= limits.SIMILARITY_THRESHOLD, s
        assert similarity_measure.row(chapter, s) in guide.splitlines(), s
        assert round(s.lowest_copy, 2) >= copies, s
        if s.exercise not in similarity.FEW_WAYS:
            assert s.highest_independent < limits.SIMILARITY_THRESHOLD, s
            assert round(s.highest_independent, 2) <= independent, s


def answered(root: Path, bodies) -> nbformat.NotebookNode:
    """The release of CHAPTER with each answer region holding ``bodies(owner)``, as a learner submits it."""
    instructor = similarity_measure._solved_with(CHAPTER, lambda owner, text: bodies(owner))
    for cell in instructor.cells:
        cell.source = nbgrader_course.SOLUTION_MARKERS.sub("", cell.source)
    notebook = nbformat.read(root / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    answers = {c.metadata.nbgrader.grade_id: c.source for c in instructor.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in notebook.cells:
        cell.source = answers.get(cell.metadata.get("nbgrader", {}).get("grade_id"), cell.source)
    return notebook


def written_as(module, disguise=lambda text: text):
    return lambda owner: disguise(solution_regions.reference_body(module, owner))


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    root = scratch_course.scratch_course(REPO, tmp_path_factory.mktemp("class"))
    scratch_course.release(root, CHAPTER)
    return root


def pairs_of(root: Path, known: Path | None = None) -> set[tuple[str, str, str]]:
    return {(p.exercise, p.learner.author, p.other.author)
            for p in similarity.compare_chapter(root, CHAPTER, limits.SIMILARITY_THRESHOLD, known)}


def test_the_report_lists_exactly_the_copies(released, tmp_path):
    root = scratch_course.scratch_course(REPO, tmp_path / "class")
    (root / "notebooks").symlink_to(released / "notebooks")
    scratch_course.submit(root, "alice", CHAPTER, answered(root, written_as(ch06_loops)))
    scratch_course.submit(root, "bob", CHAPTER, answered(root, written_as(ch06_loops, renamed)))  # alice's, renamed
    scratch_course.submit(root, "carol", CHAPTER, answered(root, written_as(solution_regions.reference_module(CHAPTER),
                                                                            everything)))  # the reference, disguised
    scratch_course.submit(root, "dave", CHAPTER, answered(root, written_as(ch06_einsum)))
    scratch_course.submit(root, "erin", CHAPTER, answered(root, written_as(ch06_compact)))
    release = nbformat.read(root / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    scratch_course.submit(root, "frank", CHAPTER, release)  # the release as it is
    exercises = list(similarity.answer_cells(release, release))
    solution = f"the course's solution (solutions/{CHAPTER})"
    assert pairs_of(root) == {(e, who, other) for e in exercises
                              for who, other in (("alice", "bob"), ("carol", solution))}
    section = "\n".join(similarity.write_reports(root, [CHAPTER], limits.SIMILARITY_THRESHOLD, None))
    page = (root / "reports" / f"similarity_{CHAPTER}.html").read_text()
    for text in (section, page):  # it informs: "similar", never a verdict
        assert "similar" in text.lower() and not any(w in text.lower() for w in ("copied", "plagiar", "cheat"))


def test_a_folder_of_known_solutions_is_compared_too(released, tmp_path):
    root = scratch_course.scratch_course(REPO, tmp_path / "class")
    (root / "notebooks").symlink_to(released / "notebooks")
    known = tmp_path / "known" / "2025"
    known.mkdir(parents=True)
    (known / "found_online.py").write_text(Path(ch06_verbose.__file__).read_text())
    scratch_course.submit(root, "alice", CHAPTER, answered(root, written_as(ch06_verbose, renamed)))
    scratch_course.submit(root, "bob", CHAPTER, answered(root, written_as(ch06_einsum)))
    found = {(who, other) for _, who, other in pairs_of(root, tmp_path / "known")}
    assert found == {("alice", "2025/found_online.py")}


class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))


def test_a_learners_text_never_breaks_the_page(released, tmp_path):
    root = scratch_course.scratch_course(REPO, tmp_path / "class")
    (root / "notebooks").symlink_to(released / "notebooks")
    hostile = "<b onmouseover=alert(1)>"
    script = '</pre><script>alert("copied")</script><pre>'

    def bodies(owner):
        return solution_regions.reference_body(ch06_loops, owner) + f"\n# {script}\nnote = '{script}'"

    scratch_course.submit(root, hostile, CHAPTER, answered(root, bodies))
    scratch_course.submit(root, "bob|x", CHAPTER, answered(root, bodies))
    lines = similarity.write_reports(root, [CHAPTER], limits.SIMILARITY_THRESHOLD, None)
    page = (root / "reports" / f"similarity_{CHAPTER}.html").read_text()
    tags = _Tags()
    tags.feed(page)
    assert {tag for tag, _ in tags.tags} <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p",
                                             "table", "tr", "th", "td", "a", "section", "div", "pre", "mark",
                                             "details", "summary"}
    assert all(name != "onmouseover" for _, attrs in tags.tags for name, _ in attrs)
    assert "&lt;script&gt;" in page and "&lt;b onmouseover=alert(1)&gt;" in page
    assert any("bob\\|x" in line for line in lines), lines  # the class report's table keeps its columns


@pytest.mark.parametrize("argument, message", [
    (["--similarity", "1.5"], "--similarity must be above 0 and at most 1"),
    (["--known-solutions", "nowhere"], "--known-solutions nowhere: not a folder"),
])
def test_a_wrong_similarity_option_is_refused_in_one_line(released, argument, message, capsys):
    with pytest.raises(SystemExit):
        parse(["--course", str(released), *argument])
    assert message in capsys.readouterr().err


def test_each_disguise_leaves_an_answer_as_similar_as_itself():
    body = textwrap.dedent("""
        scale = math.sqrt(q.size(-1))
        scores = q @ k.transpose(-2, -1) / scale  # (m, n)
        weights = scores.softmax(-1)
        return weights @ v
    """)
    for name, disguise in DISGUISES.items():
        prints = [similarity.Fingerprint(body), similarity.Fingerprint(disguise(body))]
        assert similarity.similarities(prints)[0, 1] == 1.0, name


@pytest.mark.parametrize("code", ["x = 1\n" * 5000, "y = " + "(" * 5000 + "1" + ")" * 5000, "def f(:\n  pass"])
def test_an_answer_too_long_too_deep_or_broken_is_compared_as_written(code):
    assert similarity.canonical(code) == code
