"""What the learner's source reaches: the grader's own reading of it, for the exercises that forbid built-ins.

Read from the cells that run before a test cell, as they bind names in order.

At run time a check records the torch functions the learner's code calls, but in a graded run that
record comes from the learner's kernel, which could hide it. So the grader also reads the source: from
the learner's definition of, say, ``softmax``, it follows every name the learner defined (helpers,
aliases, methods) and collects the outside names it meets: attributes (``F.softmax``), imports
(``from torch.nn.functional import softmax``) and names given to ``getattr`` as strings. A name built
at run time (``getattr(torch, "soft" + "max")``) is not found this way; the instructor guide says so.
"""

import ast
from collections.abc import Iterable

from IPython.core.inputtransformer2 import TransformerManager

# Calls whose string arguments name an attribute or a module.
BY_NAME = {"getattr", "__import__", "import_module", "attrgetter", "methodcaller", "__getattribute__"}


class Reach:
    """The top-level definitions of a notebook's learner cells, and what each one reaches."""

    def __init__(self, sources: Iterable[str]):
        self.definitions: dict[str, list[ast.AST]] = {}
        self.imports: dict[str, str] = {}  # local name -> the dotted name it was imported as
        self.own_attributes: set[str] = set()  # methods and attributes the learner's classes define
        for source in sources:
            for node in _parse(source):
                self._define(node)

    def _define(self, node: ast.AST, conditional: bool = False) -> None:
        """Record what ``node`` binds at the top level: a later binding replaces an earlier one, as it does
        when the cells run, unless it sits in a branch that may not run (then both are kept)."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self._bind(node.name, node, None, conditional)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        self._bind(name.id, node, None, conditional or isinstance(node, ast.AugAssign))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                self._bind(alias.asname or alias.name.split(".")[0], None, alias.name, conditional)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                self._bind(alias.asname or alias.name, None, f"{node.module or ''}.{alias.name}", conditional)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for child in ast.iter_child_nodes(node):
                self._define(child, conditional=not isinstance(node, ast.With))
        for inner in ast.walk(node):
            if isinstance(inner, ast.ClassDef):
                self.own_attributes |= {n.name for n in inner.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            elif isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store):
                self.own_attributes.add(inner.attr)

    def _bind(self, name: str, definition: ast.AST | None, imported: str | None, conditional: bool) -> None:
        if not conditional:
            self.definitions.pop(name, None)
            self.imports.pop(name, None)
        if definition is not None:
            self.definitions.setdefault(name, []).append(definition)
        if imported is not None:
            self.imports[name] = imported

    def __call__(self, name: str) -> set[str]:
        """The outside names that the learner's definition of ``name`` reaches, directly or through its own."""
        found: set[str] = set()
        seen, todo = {name}, [name]
        while todo:
            current = todo.pop()
            if current in self.imports:
                found.add(self.imports[current])
            for definition in self.definitions.get(current, []):
                for node in ast.walk(definition):
                    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                        if node.id not in self.definitions and node.id not in self.imports:
                            found.add(node.id)
                        elif node.id not in seen:
                            seen.add(node.id)
                            todo.append(node.id)
                    else:
                        found.update(self._outside_names(node))
        return found

    def _outside_names(self, node: ast.AST) -> Iterable[str]:
        """Names of attributes that are not the learner's own, and attribute or module names given as strings."""
        if isinstance(node, ast.Attribute) and node.attr not in self.own_attributes:
            yield node.attr
        elif isinstance(node, ast.Call) and _called_name(node.func) in BY_NAME:
            yield from (a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):  # vars(torch)["softmax"], torch.__dict__[...]
            yield node.slice.value


def _parse(source: str) -> list[ast.stmt]:
    """The statements of a cell, with IPython's magics turned into Python; nothing for a cell that is
    not valid Python (it cannot define anything either)."""
    try:
        return ast.parse(TransformerManager().transform_cell(source)).body
    except (SyntaxError, ValueError):
        return []


def _called_name(func: ast.AST) -> str:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else ""
