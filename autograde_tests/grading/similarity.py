"""Similar answers, shown to the instructor: each submission's answers against its classmates' and against
every known published answer, exercise by exercise. It informs; it never changes a score.

What is compared is what a learner wrote: in each answer cell, the lines that are not the release's own
(signature, docstring, stub). Each answer is first written one way (``canonical``), so that reordered
statements and a helper extracted or inlined change nothing; then fingerprinted with ``copydetect``
(Schleimer, Wilkerson and Aiken's winnowing, the method of Stanford's MOSS): its code is tokenised and every
name becomes the same token, so renamed variables, comments and whitespace change nothing either, and a
k-gram of tokens that survives the winnowing is a fingerprint (hashed the same way in every process:
``Fingerprint``). Two answers' similarity is the larger share of either one's fingerprints
that the other holds too: 1.0 when one answer holds all of the other. The known answers are the course's
own (the instructor notebook, whose solutions are the reference's bodies) and every notebook or Python file
in a folder the instructor names (``--known-solutions``: earlier years', or answers found online). A pair is
listed from a threshold (``--similarity``; ``limits.SIMILARITY_THRESHOLD`` by default) between what copies
score (0.88 and up) and what answers written independently score (0.42 and below), as the guide measures them.
"""

import ast
import difflib
import hashlib
import html
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import nbformat
import numpy as np
from copydetect import CodeFingerprint, compare_files
from copydetect.utils import filter_code, get_token_coverage, highlight_overlap, winnow

from .. import nbgrader_course, submission_files
from . import limits, submissions

# copydetect's defaults: matches shorter than NOISE tokens are ignored, longer than GUARANTEE found
NOISE, GUARANTEE = 25, 30
# Exercises whose honest answers are alike by nature, as measured on independent answers: there a similar pair
# tells little, and the page says so.
FEW_WAYS = {
    "CrossAttention": "most honest answers are one call of the imported MultiHeadAttention",
    "padding_mask": "most honest answers compare torch.arange with the lengths, in a line or two",
}


@dataclass(frozen=True)
class Answer:
    author: str  # a student id, or where a known answer comes from
    known: bool  # a published answer, not a classmate's
    code: str


@dataclass(frozen=True)
class Pair:
    exercise: str
    learner: Answer
    other: Answer
    score: float
    prints: tuple[CodeFingerprint, CodeFingerprint]  # the learner's and the other's


def written(cell: str, released: str) -> str:
    """The lines of an answer cell that are not the released cell's own: what the learner wrote."""
    ours, theirs = released.splitlines(), cell.splitlines()
    blocks = difflib.SequenceMatcher(None, ours, theirs, autojunk=False).get_opcodes()
    # Each run of written lines (a method's body, say) is dedented on its own, so that together they parse.
    runs = [textwrap.dedent("\n".join(theirs[j1:j2])).strip("\n") for tag, _, _, j1, j2 in blocks
            if tag in ("insert", "replace")]
    return "\n".join(r for r in runs if r)[:limits.ANSWER_CHARS].replace("\0", "")


def answer_cells(notebook: nbformat.NotebookNode, release: nbformat.NotebookNode) -> dict[str, str]:
    """grade id -> what was written in that answer cell of ``notebook`` (rebuilt around the release)."""
    released = {c.metadata.nbgrader.grade_id: c.source for c in release.cells
                if c.metadata.get("nbgrader", {}).get("solution")}
    rebuilt = submissions.rebuild(notebook, release).notebook
    return {c.metadata.nbgrader.grade_id: written(c.source, released[c.metadata.nbgrader.grade_id])
            for c in rebuilt.cells if c.metadata.get("nbgrader", {}).get("grade_id") in released}


def classmates(course: Path, chapter: str, release: nbformat.NotebookNode) -> dict[str, dict[str, str]]:
    """student -> their answers, read as the grader reads them (regular files only, never a link); a
    submission the grader could not read is left out, as it is left ungraded."""
    found = {}
    submitted = course / "submitted"
    for student in sorted(p.name for p in submitted.iterdir()) if submitted.is_dir() else []:
        try:
            data = submission_files.read_beneath(submitted, f"{student}/{chapter}/{chapter}.ipynb",
                                                 limits.SIMILARITY_NOTEBOOK_BYTES)
            found[student] = answer_cells(submissions.read(data), release)
        except (submission_files.NotData, OSError, submissions.Unreadable):
            continue
    return found


def known(course: Path, chapter: str, release: nbformat.NotebookNode, folder: Path | None) -> dict[str, dict[str, str]]:
    """source -> its answers: the course's solutions, then each notebook and Python file under ``folder``."""
    solutions = course / "solutions" / chapter / f"{chapter}.ipynb"
    found = {f"the course's solution (solutions/{chapter})": _notebook_answers(solutions, release)}
    owners = {c.metadata.nbgrader.grade_id: nbgrader_course.region_owners(c.source)
              for c in nbformat.read(solutions, as_version=4).cells if c.metadata.get("nbgrader", {}).get("solution")}
    for path in sorted(folder.rglob("*")) if folder else []:
        if path.suffix == ".ipynb":
            answers = _notebook_answers(path, release)
        elif path.suffix == ".py":
            answers = _module_answers(path.read_text(errors="replace"), owners)
        else:
            continue
        if any(answers.values()):
            found[str(path.relative_to(folder))] = answers
    return found


def _notebook_answers(path: Path, release: nbformat.NotebookNode) -> dict[str, str]:
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception:  # a known solution that is not a notebook after all: nothing to compare
        return {}
    for cell in notebook.cells:  # the instructor's markers are not part of any answer
        cell.source = nbgrader_course.SOLUTION_MARKERS.sub("", cell.source)
    return answer_cells(notebook, release)


def _module_answers(source: str, owners: dict[str, list[str]]) -> dict[str, str]:
    """grade id -> the bodies of the definitions a Python file has of that answer cell's names."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    answers = {}
    for grade_id, names in owners.items():
        bodies = []
        for name in names:
            try:
                node = nbgrader_course.definition(tree, name)
            except StopIteration:
                continue
            bodies.append(textwrap.dedent("\n".join(source.splitlines()[node.body[0].lineno - 1: node.end_lineno])))
        answers[grade_id] = "\n".join(bodies)[:limits.ANSWER_CHARS].replace("\0", "")
    return answers


def similarities(prints: list[CodeFingerprint]) -> np.ndarray:
    """(answers, answers): each pair's similarity, all at once from a matrix of who holds which fingerprint."""
    hashes = sorted(set().union(*(p.hashes for p in prints)))
    column = {h: i for i, h in enumerate(hashes)}
    holds = np.zeros((len(prints), len(hashes)), dtype=np.float32)
    for row, p in enumerate(prints):
        holds[row, [column[h] for h in p.hashes]] = 1.0
    shared = holds @ holds.T  # fingerprints two answers share
    own = np.maximum(holds.sum(axis=1), 1.0)
    return np.maximum(shared / own[:, None], shared / own[None, :])


class Fingerprint(CodeFingerprint):
    """copydetect's fingerprint of an answer's canonical form (``canonical``), its k-grams hashed the same way
    in every process: copydetect's own hash is Python's ``hash``, which each process salts, so that the
    winnowing would keep other k-grams, and list other pairs, from one run to the next."""

    def __init__(self, code: str):  # the attributes copydetect's CodeFingerprint sets, as it sets them
        self.filename, self.raw_code, self.k = "answer.py", canonical(code), NOISE
        self.filtered_code, self.offsets = filter_code(self.raw_code, self.filename)
        grams = [self.filtered_code[i:i + NOISE].encode() for i in range(len(self.filtered_code) - NOISE + 1)]
        hashes = np.array([int.from_bytes(hashlib.blake2b(g, digest_size=8).digest(), "little", signed=True)
                           for g in grams], dtype=np.int64)
        kept, where = winnow(hashes, GUARANTEE - NOISE + 1, remove_duplicates=False) if grams else (hashes, hashes)
        self.hash_idx = {}
        for value, index in zip(kept.tolist(), where.tolist()):
            self.hash_idx.setdefault(value, []).append(index)
        self.hashes = set(self.hash_idx)
        self.token_coverage = get_token_coverage(self.hash_idx, NOISE, len(self.filtered_code))


def canonical(code: str) -> str:
    """The answer as it is compared, written one way whatever the usual disguises did: comments and layout
    redone (``ast.unparse``), a helper called once put back where it is called, a variable read once
    replaced by its value, and neighbouring statements that do not depend on each other in a fixed order.
    Code that does not parse, or has blocks of more than ``limits.CANONICAL_STATEMENTS`` statements (the steps
    take time that grows with the square of a block's length), is compared as it is."""
    try:
        tree = ast.parse(code)
        blocks = [n for n in ast.walk(tree) if isinstance(getattr(n, "body", None), list)]
        if any(len(n.body) > limits.CANONICAL_STATEMENTS for n in blocks):
            return code
        for node in blocks:
            node.body = _in_order(_variables_inlined(_helpers_inlined(node.body)))
        return ast.unparse(ast.fix_missing_locations(tree))
    except (SyntaxError, ValueError, RecursionError):  # RecursionError: nesting too deep for ast
        return code


def _names(node: ast.AST, ctx: type) -> set[str]:
    """The names and attribute paths (``self.w``) ``node`` reads (ctx ast.Load) or writes (ast.Store)."""
    return ({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}
            | {ast.unparse(n) for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ctx)})


class _Substitute(ast.NodeTransformer):
    def __init__(self, values: dict[str, ast.expr]):
        self.values = values

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return self.values[node.id] if isinstance(node.ctx, ast.Load) and node.id in self.values else node


def _helpers_inlined(body: list[ast.stmt]) -> list[ast.stmt]:
    """A function defined in the block whose body is one return, called once before it is defined again,
    replaced by its expression."""
    for helper in [s for s in body if isinstance(s, ast.FunctionDef) and len(s.body) == 1
                   and isinstance(s.body[0], ast.Return) and s.body[0].value is not None]:
        start = body.index(helper) + 1
        end = next((i for i in range(start, len(body)) if _names(body[i], ast.Store) & {helper.name}
                    or getattr(body[i], "name", None) == helper.name), len(body))
        scope = body[start:end]
        uses = [n for s in scope for n in ast.walk(s) if isinstance(n, ast.Name) and n.id == helper.name]
        params = [a.arg for a in helper.args.args]
        call = next((n for s in scope for n in ast.walk(s) if isinstance(n, ast.Call) and n.func is uses[0]), None) \
            if len(uses) == 1 else None
        if call is None or call.keywords or len(call.args) != len(params):
            continue
        value = _Substitute(dict(zip(params, call.args))).visit(helper.body[0].value)
        body = [_Replace(call, value).visit(s) for s in body if s is not helper]
    return body


class _Replace(ast.NodeTransformer):
    def __init__(self, old: ast.AST, new: ast.AST):
        self.old, self.new = old, new

    def visit(self, node: ast.AST) -> ast.AST:
        return self.new if node is self.old else super().visit(node)


def _variables_inlined(body: list[ast.stmt]) -> list[ast.stmt]:
    """A variable named once after its assignment in the block, and read there, replaced by its value: from
    the last assignment back, so that a chain (x = f(x); x = g(x); return x) folds whole."""
    for i in reversed(range(len(body))):
        statement, rest = body[i], body[i + 1:]
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            name = statement.targets[0].id
            seen = [n for s in rest for n in ast.walk(s) if isinstance(n, ast.Name) and n.id == name]
            if len(seen) == 1 and isinstance(seen[0].ctx, ast.Load):
                body = body[:i] + [_Substitute({name: statement.value}).visit(s) for s in rest]
    return body


def _in_order(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements in a fixed order: each time, of those whose earlier dependencies are placed, the one
    whose text comes first with every name alike. Only assignments move, and only past each other."""
    simple = (ast.Assign, ast.AnnAssign, ast.AugAssign)
    reads, writes = [_names(s, ast.Load) for s in body], [_names(s, ast.Store) for s in body]
    after = [{i for i in range(j) if not (isinstance(body[i], simple) and isinstance(body[j], simple))
              or writes[i] & (reads[j] | writes[j]) or writes[j] & reads[i]} for j in range(len(body))]
    key = [re.sub(r"[A-Za-z_]\w*", "V", ast.unparse(s)) for s in body]
    placed: list[int] = []
    while len(placed) < len(body):
        ready = [j for j in range(len(body)) if j not in placed and after[j] <= set(placed)]
        placed.append(min(ready, key=lambda j: (key[j], j)))
    return [body[j] for j in placed]


def similar_pairs(exercise: str, answers: list[Answer], threshold: float) -> list[Pair]:
    """Every pair of a learner's answer with a classmate's or a known one whose similarity is ``threshold``
    or more, most similar first."""
    prints = [Fingerprint(a.code) for a in answers]
    score = similarities(prints)
    pairs = []
    for i, j in zip(*np.nonzero(np.triu(score >= threshold, k=1))):
        a, b = (answers[i], answers[j]) if not answers[i].known else (answers[j], answers[i])
        if a.known:  # two published answers alike is nobody's business here
            continue
        pa, pb = (prints[i], prints[j]) if a is answers[i] else (prints[j], prints[i])
        pairs.append(Pair(exercise, a, b, float(score[i, j]), (pa, pb)))
    return sorted(pairs, key=lambda p: (-p.score, p.learner.author, p.other.author))


def _shown(a: CodeFingerprint, b: CodeFingerprint) -> tuple[str, str]:
    _, _, slices = compare_files(a, b)
    return tuple(highlight_overlap(p.raw_code, s, "<mark>", "</mark>", escape_html=True)[0] if s.size else
                 html.escape(p.raw_code) for p, s in zip((a, b), slices))


def compare_chapter(course: Path, chapter: str, threshold: float, folder: Path | None) -> list[Pair]:
    release = nbformat.read(nbgrader_course.released(course, chapter), as_version=4)
    learners, published = classmates(course, chapter, release), known(course, chapter, release, folder)
    pairs = []
    for exercise in [c.metadata.nbgrader.grade_id for c in release.cells
                     if c.metadata.get("nbgrader", {}).get("solution")]:
        answers = [Answer(s, False, a[exercise]) for s, a in learners.items() if a.get(exercise, "").strip()]
        answers += [Answer(s, True, a[exercise]) for s, a in published.items() if a.get(exercise, "").strip()]
        pairs += similar_pairs(exercise, answers, threshold) if len(answers) > 1 else []
    return pairs


def write_reports(course: Path, chapters: list[str], threshold: float, folder: Path | None) -> list[str]:
    """reports/similarity_<chapter>.html for each chapter; the class report's section, as Markdown lines."""
    lines = ["## Similar answers", "", f"Answers whose similarity is {threshold:g} or more, exercise by exercise, "
             "against classmates and known published answers. Similar is not proof that one was taken from the "
             "other: the instructor guide says how to read it. No score was changed.", "",
             "| chapter | similar pairs | most similar | report |", "| --- | --- | --- | --- |"]
    for chapter in chapters:
        pairs = compare_chapter(course, chapter, threshold, folder)
        path = course / "reports" / f"similarity_{chapter}.html"
        path.parent.mkdir(exist_ok=True)
        path.write_text(_page(chapter, pairs, threshold))
        top = (f"{pairs[0].learner.author} and {pairs[0].other.author}, {pairs[0].exercise}: {pairs[0].score:.2f}"
               if pairs else "none")
        lines.append(f"| {chapter} | {len(pairs)} | {_cell(top)} | [{path.name}]({path.name}) |")
    return lines


def _cell(text: str) -> str:
    """Text for a Markdown table's cell: a learner's id may hold a | or a newline."""
    return text.replace("|", "\\|").replace("\n", " ")


PAGE_STYLE = ("body{font-family:sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse}"
              "td,th{border:1px solid #999;padding:.3em .6em}pre{background:#f6f6f6;padding:.6em;overflow:auto;"
              "white-space:pre-wrap}mark{background:#ffe08a}.pair{display:grid;grid-template-columns:1fr 1fr;gap:1em}")


def _link(n: int, exercise: str) -> str:
    return f'<a href="#pair-{n}">{html.escape(exercise)}</a>' if n < limits.SHOWN_PAIRS else html.escape(exercise)


def _side(compared: str, answer: Answer) -> str:
    """One side of a pair: the form compared, what it shares marked, and the answer as written under it."""
    return (f"<div><pre>{compared}</pre><details><summary>as written</summary><pre>{html.escape(answer.code)}</pre>"
            "</details></div>")


def _few_ways(exercise: str) -> str:
    return f"<p>Tells little here: {html.escape(FEW_WAYS[exercise])}.</p>" if exercise in FEW_WAYS else ""


def _page(chapter: str, pairs: list[Pair], threshold: float) -> str:
    """One self-contained page (no script, nothing fetched): the table of pairs, then each pair side by side."""
    e = html.escape
    rows = "".join(f'<tr><td>{_link(n, p.exercise)}</td><td>{e(p.learner.author)}</td>'
                   f'<td>{e(p.other.author)}{" (published)" if p.other.known else ""}</td><td>{p.score:.2f}</td></tr>'
                   for n, p in enumerate(pairs))
    shown = "".join(f'<section id="pair-{n}"><h2>{e(p.exercise)}: {e(p.learner.author)} and {e(p.other.author)}, '
                    f'{p.score:.2f}</h2>{_few_ways(p.exercise)}<div class="pair">{_side(ours, p.learner)}'
                    f'{_side(theirs, p.other)}</div></section>'
                    for n, p in enumerate(pairs[:limits.SHOWN_PAIRS]) for ours, theirs in [_shown(*p.prints)])
    if len(pairs) > limits.SHOWN_PAIRS:
        shown += f"<p>The {len(pairs) - limits.SHOWN_PAIRS} less similar pairs are in the table only.</p>"
    table = (f"<table><tr><th>exercise</th><th>learner</th><th>similar to</th><th>similarity</th></tr>{rows}</table>"
             if pairs else "<p>No pair reaches the threshold.</p>")
    return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>Similar answers: {e(chapter)}</title><style>{PAGE_STYLE}</style></head><body>"
            f"<h1>Similar answers: {e(chapter)}</h1><p>Pairs of answers whose similarity is {threshold:g} or more "
            "(1.0: one holds all of the other's fingerprints), most similar first, "
            "each in the form it is compared in (comments and layout redone, helpers and variables used once folded "
            "in, independent statements in a fixed order), the parts they share marked, and as written. Similar is "
            "not proof that one was taken from the other: short exercises leave few ways to write them, and the "
            f"instructor guide says how much each exercise's similarity tells.</p>{table}{shown}</body></html>\n")
