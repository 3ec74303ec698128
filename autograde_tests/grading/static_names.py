"""What the learner's source reaches: the grader's own reading of it, for the exercises that forbid built-ins.

Read from the cells that run before a test cell, as they bind names in order.

At run time a check records the torch functions the learner's code calls, but in a graded run that
record comes from the learner's kernel, which could hide it. So the grader also reads the source: from
the learner's definition of, say, ``softmax``, it follows every name the learner defined (helpers,
aliases, methods) and collects the outside names it meets: attributes (``F.softmax``), imports
(``from torch.nn.functional import softmax``), the classes too (``nn.Softmax``: the checks compare names
whatever their case), and names given to ``getattr`` as strings, also when the string is put together from
constants (``getattr(torch, "soft" + "max")``). A name computed from data at run time, a built-in called
inside a library function (``F.cross_entropy``), or code from a file or ``exec`` is not found this way:
only the record of what ran sees those.
"""

import ast
from collections.abc import Iterable

from IPython.core.inputtransformer2 import TransformerManager

# Calls whose string arguments name an attribute or a module.
BY_NAME = {"getattr", "__import__", "import_module", "attrgetter", "methodcaller", "__getattribute__"}


class StaticNames:
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
                self.own_attributes |= {n.name for n in inner.body
                                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
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
        if isinstance(node, ast.Attribute) and (node.attr not in self.own_attributes or self._of_an_import(node)):
            yield node.attr
        elif isinstance(node, ast.Call) and _called_name(node.func) in BY_NAME:
            yield from (text for text in map(_constant_text, node.args) if text is not None)
        elif isinstance(node, ast.Subscript) and _constant_text(node.slice) is not None:
            yield _constant_text(node.slice)  # vars(torch)["softmax"], torch.__dict__[...]

    def _of_an_import(self, node: ast.Attribute) -> bool:
        """Whether the attribute is read from an imported module (``F.softmax``, ``torch.nn.Softmax``): never
        the learner's own, even when one of their classes has a method of that name."""
        root = node.value
        while isinstance(root, ast.Attribute):
            root = root.value
        return isinstance(root, ast.Name) and root.id in self.imports


def _parse(source: str) -> list[ast.stmt]:
    """The statements of a cell, with IPython's magics turned into Python; nothing for a cell that is
    not valid Python (it cannot define anything either)."""
    try:
        return ast.parse(TransformerManager().transform_cell(source)).body
    except (SyntaxError, ValueError):
        return []


def _constant_text(node: ast.AST) -> str | None:
    """The string ``node`` always evaluates to, when it is put together from constants alone: "softmax",
    "soft" + "max", f"{'soft'}max", "".join(["soft", "max"]); else None."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _constant_text(node.left), _constant_text(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.FormattedValue) and node.conversion == -1 and node.format_spec is None:
        return _constant_text(node.value)
    if isinstance(node, ast.JoinedStr):
        parts = [_constant_text(part) for part in node.values]
        return None if None in parts else "".join(parts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" \
            and len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple)):
        glue, parts = _constant_text(node.func.value), [_constant_text(part) for part in node.args[0].elts]
        return None if glue is None or None in parts else glue.join(parts)
    return None


def _called_name(func: ast.AST) -> str:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else ""
