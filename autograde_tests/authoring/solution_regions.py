"""The instructor notebooks' solutions, written from the reference: one source for each solution.

The reference (``autograde_tests/reference/``) is the code proven against PyTorch; an instructor
notebook's ``### BEGIN SOLUTION`` regions show learners' answers. Each region sits in a function or
method (``softmax``, ``MultiHeadAttention.forward``); it holds the body of the reference's definition of
the same name, docstring and ``super().__init__()`` left out, since the notebook states those itself.

``python -m autograde_tests.authoring.solution_regions`` rewrites the regions of ``solutions/*/*.ipynb`` (``make
release`` runs it before nbgrader); ``--check`` only reports the regions that differ, which the test
suite requires to be none. Signatures stay the notebook's own text; one that differs from the
reference's is reported, and fails both.
"""

import argparse
import ast
import importlib
import re
import sys
import textwrap
from pathlib import Path

import nbformat

from ..nbgrader_course import REGION, definition, region_owners


def reference_module(chapter: str):
    """The reference module of ``chapter`` (``01_attention`` -> ``autograde_tests.reference.attention``)."""
    return importlib.import_module(f"autograde_tests.reference.{chapter.split('_', 1)[1]}")


def parameters(definition: ast.FunctionDef) -> str:
    """A definition's parameters and defaults, annotations left out: ``(self, d_model, eps=1e-05)``."""
    args = definition.args
    plain = [ast.arg(arg=a.arg) for a in (*args.posonlyargs, *args.args)]
    keywords = [ast.arg(arg=a.arg) for a in args.kwonlyargs]
    return "(" + ast.unparse(ast.arguments(posonlyargs=[], args=plain, vararg=args.vararg, kwonlyargs=keywords,
                                           kw_defaults=args.kw_defaults, kwarg=args.kwarg,
                                           defaults=args.defaults)) + ")"


def signature_mismatches(source: str, module) -> list[str]:
    """The definitions of a solution cell whose parameters differ from the reference's."""
    cell = ast.parse(REGION.sub(lambda m: f"{m['indent']}pass", source))
    reference = ast.parse(Path(module.__file__).read_text())
    mismatches = []
    for qualname in dict.fromkeys(region_owners(source)):
        ours, theirs = parameters(definition(cell, qualname)), parameters(definition(reference, qualname))
        if ours != theirs:
            mismatches.append(f"{qualname}{ours} in the notebook, {qualname}{theirs} in the reference")
    return mismatches


def reference_body(module, qualname: str) -> str:
    """The source of a reference definition's body, dedented, without its docstring and a leading
    ``super().__init__()`` (comments kept)."""
    source = Path(module.__file__).read_text()
    node = definition(ast.parse(source), qualname)
    body = list(node.body)
    start = node.body[0].lineno
    for skipped in (_is_docstring, _is_super_init):
        if body and skipped(body[0]):
            start = body[0].end_lineno + 1
            body = body[1:]
    lines = source.splitlines()[start - 1: body[-1].end_lineno]
    return textwrap.dedent("\n".join(lines)).strip("\n")


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
        and isinstance(statement.value.value, str)


def _is_super_init(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and ast.unparse(statement) == "super().__init__()"


def written_from_reference(source: str, module) -> str:
    """``source`` (a solution cell) with every region holding the reference's body of its definition."""
    bodies = iter(reference_body(module, owner) for owner in region_owners(source))

    def fill(match: re.Match) -> str:
        indent = match["indent"]
        body = textwrap.indent(next(bodies), indent)
        return f"{indent}### BEGIN SOLUTION\n{body}\n{indent}### END SOLUTION"

    return REGION.sub(fill, source)


def solution_notebooks(root: Path) -> list[Path]:
    return sorted((root / "solutions").glob("[0-9]*_*/*.ipynb"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m autograde_tests.authoring.solution_regions",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--course", type=Path, default=Path.cwd())
    parser.add_argument("--check", action="store_true", help="report the regions that differ; change nothing")
    args = parser.parse_args(argv)
    stale, mismatched = [], []
    for path in solution_notebooks(args.course):
        notebook = nbformat.read(path, as_version=4)
        module = reference_module(path.parent.name)
        changed = False
        for cell in notebook.cells:
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
                where = f"{path.relative_to(args.course)}: cell {cell.metadata['nbgrader']['grade_id']}"
                mismatched += [f"{where}: {m}" for m in signature_mismatches(cell.source, module)]
                written = written_from_reference(cell.source, module)
                if written != cell.source:
                    stale.append(where)
                    cell.source, changed = written, True
        if changed and not args.check:
            nbformat.write(notebook, path)
    for line in stale:
        print(("differs from the reference: " if args.check else "rewritten from the reference: ") + line)
    for line in mismatched:  # a signature is the notebook's own text: the instructor aligns it by hand
        print(f"signature differs: {line}", file=sys.stderr)
    if mismatched or (args.check and stale):
        sys.exit(1)


if __name__ == "__main__":
    main()
