"""Admit only plain PyTorch code from a learner, before any of it runs.

The checks run in the same kernel as the learner's code, after it. That is sound only if the learner's
code cannot reach the checks, the comparison functions or the tensor type, so every cell a learner
wrote is parsed here, in the trusted grader, and must stay inside a small language:

- imports only from ALLOWED_IMPORTS (``autograde_tests`` only for its ``check_*`` functions);
- no dynamic code or reflection (eval, exec, getattr, globals, open, ...: DENIED_NAMES);
- no dunder or underscore-private attribute, no attribute from DENIED_ATTRIBUTES (file I/O, torch's
  operator registry and overrides);
- attributes are assigned or deleted only on ``self`` (a module's own layers);
- no special methods but ``__init__``, no subclass of a tensor, no ``global`` or ``nonlocal``.

Every course solution fits easily. A submission that does not is not executed: it goes to the
instructor as needs-attention, with the line and the construct.
"""

import ast
from dataclasses import dataclass

from IPython.core.inputtransformer2 import TransformerManager

ALLOWED_IMPORTS = {"math", "torch", "numpy", "typing", "collections", "itertools", "functools",
                   "dataclasses", "copy", "matplotlib", "random"}
DENIED_NAMES = {"eval", "exec", "compile", "__import__", "getattr", "setattr", "delattr", "globals",
                "locals", "vars", "open", "input", "breakpoint", "exit", "quit", "get_ipython",
                "memoryview", "type", "__builtins__"}
DENIED_ATTRIBUTES = {
    # reading or writing files
    "load", "loadtxt", "genfromtxt", "fromfile", "fromregex", "memmap", "save", "savez",
    "savez_compressed", "savetxt", "tofile", "imread", "imsave", "savefig", "DataSource", "ctypeslib",
    "from_file", "lib", "package",
    # reaching below the public tensor API, or out of the process
    "ops", "overrides", "library", "utils", "cpp_extension", "hub", "jit", "compile", "fx",
    "distributed", "multiprocessing",
    "set_default_device", "set_default_dtype", "set_flush_denormal", "use_deterministic_algorithms",
    # frames and closures: the way from a function to its caller's globals
    "gi_frame", "cr_frame", "ag_frame", "f_back", "f_globals", "f_locals", "f_builtins", "f_code",
    "tb_frame", "tb_next", "gi_code", "cell_contents",
}
TENSOR_TYPES = {"Tensor", "Parameter"}


@dataclass(frozen=True)
class Violation:
    line: int
    construct: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.construct}"


def check_source(source: str) -> list[Violation]:
    """The constructs in ``source`` that a graded submission may not use (empty when it is plain code)."""
    try:
        # As the kernel will run it: `!cmd` and `%magic` become get_ipython() calls, which are denied.
        tree = ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError:
        return []  # it fails to run like any other mistake; nothing in it can run either
    finder = _Finder()
    finder.visit(tree)
    return finder.violations


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class _Finder(ast.NodeVisitor):
    def __init__(self):
        self.violations: list[Violation] = []

    def flag(self, node: ast.AST, construct: str) -> None:
        self.violations.append(Violation(getattr(node, "lineno", 0), construct))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] not in ALLOWED_IMPORTS:
                self.flag(node, f"imports {alias.name}")
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        checks_only = module == "autograde_tests.checks" and all(a.name.startswith("check_") for a in node.names)
        if node.level or not (checks_only or module.split(".")[0] in ALLOWED_IMPORTS):
            self.flag(node, f"imports from {'.' * node.level}{module}")
        for alias in node.names:
            if alias.name == "*" or alias.name.startswith("_") or alias.name in DENIED_ATTRIBUTES:
                self.flag(node, f"imports {alias.name} from {module}")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in DENIED_NAMES or (node.id.startswith("__") and node.id != "__name__"):
            self.flag(node, f"uses {node.id}")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        private = node.attr.startswith("_") and not (node.attr == "__init__" and _is_super_call(node.value))
        if private and not (isinstance(node.value, ast.Name) and node.value.id == "self" and not node.attr.startswith("__")):
            self.flag(node, f"uses the private attribute .{node.attr}")
        if node.attr in DENIED_ATTRIBUTES:
            self.flag(node, f"uses .{node.attr}")
        if isinstance(node.ctx, (ast.Store, ast.Del)) and _root_name(node) != "self":
            self.flag(node, f"changes {ast.unparse(node)}, which it did not create")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)) and isinstance(node.value, ast.Attribute):
            if _root_name(node) != "self":
                self.flag(node, f"changes {ast.unparse(node)}, which it did not create")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name.startswith("__") and node.name != "__init__":
            self.flag(node, f"defines the special method {node.name}")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
            if name in TENSOR_TYPES:
                self.flag(node, f"subclasses {ast.unparse(base)}")
        if node.keywords:
            self.flag(node, "passes keywords (a metaclass) to a class")
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.flag(node, "declares global " + ", ".join(node.names))

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.flag(node, "declares nonlocal " + ", ".join(node.names))


def _is_super_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
