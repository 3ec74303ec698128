"""What a submission's code does that an instructor may want to know: notes for the class report.

Never a reason not to grade: the sandbox and the grader's own verdicts make a grade safe whatever the
code does, and honest learners print, time, plot and read files too. The notes point a person at the
submissions worth a look (a learner poking at the grader leaves traces like these).
"""

import ast

from IPython.core.inputtransformer2 import TransformerManager

# (what the note says, imported modules, names called, attribute names) that make it
NOTES = [
    ("reads or writes files", {"sqlite3", "shutil", "glob"}, {"open"},
     {"read_text", "write_text", "read_bytes", "write_bytes", "unlink", "rmtree", "savetxt", "loadtxt", "tofile",
      "fromfile", "readlink", "listdir", "walk"}),
    ("starts processes or shell commands", {"subprocess", "multiprocessing", "pty"}, set(),
     {"system", "popen", "Popen", "spawnv", "spawnve", "spawnl", "fork", "execv", "execve", "posix_spawn"}),
    ("reaches the interpreter's internals (sys.modules, builtins, frames, ctypes, the IPython shell)",
     {"ctypes", "gc", "inspect", "builtins", "importlib"}, {"exec", "eval", "compile", "__import__", "globals"},
     {"modules", "__builtins__", "_getframe", "f_back", "f_globals", "f_locals", "set_custom_exc",
      "input_transformers_post", "__subclasses__", "__globals__"}),
    ("opens network connections", {"socket", "urllib", "http", "requests"}, set(), {"create_connection", "urlopen"}),
    # The stand-ins a check hands the learner's code run in the kernel: code that rewrites them can make a
    # wrong answer come out right, and no value the grader judges shows it.
    ("reaches the course's grading package or rewrites classes at run time (a check's stand-ins live there)",
     {"autograde_tests"}, {"setattr", "delattr"},
     {"__class__", "__dict__", "__setattr__", "stand_in_models", "in_kernel"}),
]


def advisories(sources: list[str]) -> list[str]:
    """One note per kind of thing the learner's cells do, with where it first happens."""
    found: dict[str, str] = {}
    for number, source in enumerate(sources, 1):
        try:
            tree = ast.parse(TransformerManager().transform_cell(source))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            for note, modules, names, attributes in NOTES:
                what = _what(node, modules, names, attributes)
                if what and note not in found:
                    found[note] = f"{note}: `{what}` in learner cell {number}, line {node.lineno}"
    return [found[note] for note, *_ in NOTES if note in found]


def _what(node: ast.AST, modules: set[str], names: set[str], attributes: set[str]) -> str | None:
    if isinstance(node, ast.Import):
        return next((a.name for a in node.names if a.name.split(".")[0] in modules), None)
    if isinstance(node, ast.ImportFrom):
        return node.module if (node.module or "").split(".")[0] in modules else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
        return node.func.id
    if isinstance(node, ast.Attribute) and node.attr in attributes:
        return ast.unparse(node)[:60]
    return None
