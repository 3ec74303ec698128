"""nbgrader as a course folder configures it: its configuration, API and gradebook, its chapters and their
release, and how to read its cells (which are tests, and where an instructor notebook's solution regions sit).

Shared by ``scratch_course`` (scratch courses for ``make demo`` and the tests), ``demo``, ``grading`` and
the hub, so that every part of the course reaches nbgrader the same way, through the course's own
``nbgrader_config.py``.
"""

import ast
import functools
import os
import re
import sys
import tempfile
from pathlib import Path

import nbformat
from nbgrader import utils
from nbgrader.api import Gradebook
from nbgrader.apps import NbGraderAPI
from nbgrader.coursedir import CourseDirectory
from nbgrader.dbutil import ALEMBIC_DIR
from sqlalchemy import create_engine, text
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

SOLUTION_MARKERS = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*(\n|\Z)", re.MULTILINE)
REGION = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION\n(?P<body>.*?)^[ \t]*### END SOLUTION$", re.M | re.S)
_PLACEHOLDER = "__solution_region_{}__"


def config(course: Path) -> Config:
    """The course's ``nbgrader_config.py``, rooted at ``course``."""
    loaded = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    loaded.CourseDirectory.root = str(course)
    return loaded


def chapters(course: Path) -> list[str]:
    """The chapter ids, read from the instructor notebooks in ``solutions/``."""
    return sorted(p.name for p in (course / "solutions").glob("[0-9]*_*") if p.is_dir())


def released(course: Path, chapter: str) -> Path:
    """The learners' notebook of ``chapter``, in the course's release folder."""
    release = config(course).CourseDirectory.get("release_directory", "release")
    return course / release / chapter / f"{chapter}.ipynb"


def api(course: Path, configured: Config | None = None) -> NbGraderAPI:
    """nbgrader's API for the course in ``course`` (``configured``: its configuration, adjusted)."""
    _commands_of_this_python()
    return NbGraderAPI(config=configured or config(course))


def _commands_of_this_python() -> None:
    """nbgrader runs `alembic` (gradebook migrations) and kernels as commands: take this Python's."""
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ["PATH"].split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ["PATH"]


def run(result: dict) -> str:
    """Raise with nbgrader's own traceback when an API call failed; return its log."""
    if not result["success"]:
        raise RuntimeError(result.get("error") or result.get("log") or "nbgrader failed")
    return result.get("log", "")


def gradebook(course: Path) -> Gradebook:
    """The course's gradebook, where its configuration puts it (``CourseDirectory.db_url``)."""
    return Gradebook(CourseDirectory(config=config(course)).db_url)


def gradebook_url(folder: Path) -> str:
    """The address of a SQLite gradebook in ``folder``, as nbgrader's ``CourseDirectory.db_url`` takes it."""
    return f"sqlite:///{folder / 'gradebook.db'}"


def start_gradebook(course: Path) -> None:
    """Give ``course`` an empty gradebook, where its configuration puts it, unless it has one (or keeps it in
    a database server): a copy of one made once in this process."""
    url = CourseDirectory(config=config(course)).db_url
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        Path(url.removeprefix("sqlite:///")).write_bytes(_empty_gradebook())


@functools.cache
def _empty_gradebook() -> bytes:
    """nbgrader stamps a new gradebook with its schema's version, which it asks of the `alembic` command, a
    process of its own that loads nbgrader again (about 2 s of a core). Here the stamp is read from
    nbgrader's own migrations by alembic's API, in this process, and written first: nbgrader then adds its
    tables to a gradebook already stamped. Made once in a process, then copied."""
    from alembic.script import ScriptDirectory  # only a process that makes a gradebook loads it (~0.4 s of a core)

    with tempfile.TemporaryDirectory() as folder:
        url = gradebook_url(Path(folder))
        engine = create_engine(url)
        with engine.begin() as db:
            db.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
            db.execute(text("INSERT INTO alembic_version (version_num) VALUES (:head)"),
                       {"head": ScriptDirectory(ALEMBIC_DIR).get_current_head()})
        engine.dispose()
        Gradebook(url).close()
        return (Path(folder) / "gradebook.db").read_bytes()


def is_test_cell(cell) -> bool:
    """A graded cell of code that is not an answer: a cell of checks."""
    return cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell)


def failure_messages(notebook: nbformat.NotebookNode, graded_only: bool = True) -> list[str]:
    """The first line of each error of an executed notebook (in graded cells: each check's diagnosis)."""
    messages = []
    for cell in notebook.cells:
        if cell.cell_type == "code" and (utils.is_grade(cell) or not graded_only):
            for output in cell.get("outputs", []):
                if output.output_type == "error":
                    first = output.evalue.splitlines()[0] if output.evalue else ""
                    messages.append(f"{output.ename}: {first}".strip())
    return messages


def region_owners(source: str) -> list[str]:
    """The qualified name (``f`` or ``Class.method``) of the definition each solution region of a cell sits in."""
    numbered = iter(range(len(REGION.findall(source))))
    stub = REGION.sub(lambda m: f"{m['indent']}{_PLACEHOLDER.format(next(numbered))}", source)
    owners: dict[int, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                for statement in child.body:
                    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Name) \
                            and statement.value.id.startswith("__solution_region_"):
                        owners[int(statement.value.id.strip("_").rsplit("_", 1)[1])] = name
                visit(child, name + ".")

    visit(ast.parse(stub), "")
    return [owners[i] for i in sorted(owners)]


def definition(tree: ast.AST, qualname: str) -> ast.FunctionDef:
    """The definition named ``qualname`` (``f`` or ``Class.method``) in a parsed module; StopIteration if none."""
    node = tree
    for part in qualname.split("."):
        node = next(n for n in node.body if getattr(n, "name", None) == part)
    return node
