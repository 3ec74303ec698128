"""The usual ways to disguise a copied answer, applied to an answer region's body (Python source):
renamed variables, reordered independent statements, changed comments and whitespace, a helper
extracted or inlined, and all of them at once. Each keeps what the code computes."""

import ast
import builtins
import keyword


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]):
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(self.names.get(node.id, node.id), node.ctx), node)


def renamed(body: str) -> str:
    """Every name the body assigns gets another name (the notebook's parameters and globals stay)."""
    tree = ast.parse(body)
    assigned = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | set(dir(builtins)) | set(keyword.kwlist)
    names = {}
    for name in assigned:
        new = f"my_{name.lstrip('_')}_value"
        while new in taken:
            new += "_"
        names[name] = new
    return ast.unparse(_Rename(names).visit(tree))


def recommented(body: str) -> str:
    """Comments dropped, the layout redone, and a comment of another kind before every statement."""
    return "\n\n".join(f"# next: {type(s).__name__.lower()}\n{ast.unparse(s)}" for s in ast.parse(body).body)


def _reads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} | {
        ast.unparse(n) for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)}


def _writes(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} | {
        ast.unparse(n) for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}


def _independent(a: ast.stmt, b: ast.stmt) -> bool:
    simple = (ast.Assign, ast.AnnAssign, ast.AugAssign)
    return (isinstance(a, simple) and isinstance(b, simple) and not _writes(a) & (_reads(b) | _writes(b))
            and not _writes(b) & _reads(a))


def reordered(body: str) -> str:
    """Each pair of neighbouring assignments that do not depend on each other swapped (at every level)."""
    tree = ast.parse(body)
    for node in ast.walk(tree):
        for field in ("body", "orelse"):
            statements = getattr(node, field, None)
            if not isinstance(statements, list):
                continue
            i = 0
            while i + 1 < len(statements):
                if _independent(statements[i], statements[i + 1]):
                    statements[i], statements[i + 1] = statements[i + 1], statements[i]
                    i += 2
                else:
                    i += 1
    return ast.unparse(tree)


def extracted(body: str) -> str:
    """The first assignment's value computed by a helper defined in the body (a closure: same names)."""
    tree = ast.parse(body)
    for i, statement in enumerate(tree.body):
        if isinstance(statement, ast.Assign):
            helper = ast.parse(f"def compute_part():\n    return {ast.unparse(statement.value)}").body[0]
            statement.value = ast.parse("compute_part()", mode="eval").body
            tree.body.insert(i, helper)
            break
    return ast.unparse(ast.fix_missing_locations(tree))


class _Inline(ast.NodeTransformer):
    def __init__(self, name: str, value: ast.expr):
        self.name, self.value = name, value

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return self.value if node.id == self.name and isinstance(node.ctx, ast.Load) else node


def inlined(body: str) -> str:
    """Each variable assigned once at the top level and read once afterwards replaced by its value."""
    tree = ast.parse(body)
    changed = True
    while changed:
        changed = False
        for i, statement in enumerate(tree.body):
            if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name)):
                continue
            name, rest = statement.targets[0].id, tree.body[i + 1:]
            loads = [n for s in rest for n in ast.walk(s) if isinstance(n, ast.Name) and n.id == name]
            if len(loads) == 1 and isinstance(loads[0].ctx, ast.Load) and not _writes(statement.value) & {name}:
                tree.body = tree.body[:i] + [_Inline(name, statement.value).visit(s) for s in rest]
                changed = True
                break
    return ast.unparse(tree)


def everything(body: str) -> str:
    return recommented(extracted(reordered(renamed(inlined(body)))))


DISGUISES = {"renamed": renamed, "reordered": reordered, "recommented": recommented, "extracted": extracted,
             "inlined": inlined, "all at once": everything}
