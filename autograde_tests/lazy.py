"""Packages whose names are imported from their chapter's module on first use.

A graded kernel is given the earlier chapters' reference but not the chapter it is graded on, and none
of the checks; with lazy names, ``from autograde_tests.reference import MultiHeadAttention`` still works
there, and only asking for a hidden module's name fails (with the reason its stand-in gives).
"""

import importlib
from collections.abc import Callable


def exports(package: str, modules: dict[str, list[str]]) -> tuple[list[str], Callable[[str], object]]:
    """``__all__`` and a module ``__getattr__`` for ``package``, whose ``modules`` each export ``names``."""
    module_of = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str):
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module_of[name]}"), name)

    return list(module_of), __getattr__
