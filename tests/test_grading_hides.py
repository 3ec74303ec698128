"""Nothing answer-shaped in a graded kernel: inside the real sandbox, a kernel graded on a chapter can import
neither that chapter's reference nor any check (whose mistake generators, with their default flags, are
the reference), nor read their source or compiled copies; and the suite's stand-in for the kernel hides
exactly what the sandbox hides. (A submission that calls a check's generator scores nothing for it: graded in
the later chapters' batch, ``test_grading_later_chapters``.)"""

import importlib
import importlib.util
import json
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograde_tests import nbgrader_course
from autograde_tests.chapters import hidden_in_grading
from autograde_tests.grading import bubblewrap, kernel_view
from autograde_tests.grading.sandbox_kernel import bwrap_arguments, connection_file

from .conftest import kernel_stand_in

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.sandbox
WHY = "is not available while it is graded"

# Tries to import each module named in argv[1] (JSON): prints the ImportError of each that fails, or "".
TRY_IMPORTS = '''
import importlib, json, sys
failed = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except ImportError as exc:
        failed[name] = str(exc)
print(json.dumps(failed))
'''


def in_sandbox(chapter: str, code: str, *args: str, tmp_path: Path) -> str:
    """What ``python -c code args`` prints in the sandbox of a kernel graded on ``chapter``."""
    exchange = tmp_path / f"exchange-{chapter}"
    exchange.mkdir()
    connection_file(exchange).write_text("{}")
    run = subprocess.run([bubblewrap.path(), *bwrap_arguments(chapter, exchange), sys.executable, "-c", code, *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def failed_imports(chapter: str, names, tmp_path: Path) -> dict[str, str]:
    return json.loads(in_sandbox(chapter, TRY_IMPORTS, json.dumps(sorted(names)), tmp_path=tmp_path))


@pytest.fixture
def compiled(request):
    """Compiled copies of the given course modules, as a run without PYTHONDONTWRITEBYTECODE leaves them;
    removed afterwards (with their folder, when this made it)."""
    made = []
    for name in request.param:
        source = kernel_view.modules()[name]
        cache = Path(importlib.util.cache_from_source(str(source)))
        if not cache.parent.exists():
            made.append(cache.parent)
        py_compile.compile(str(source), cfile=str(cache), doraise=True)
    yield request.param
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


# Mistake generators that, edited with no change, compute the answer of the chapter's exercises.
GENERATORS = {
    "06_decoder_only": ("autograde_tests.checks.decoder_only", ["_sample", "_gpt", "_block", "_reordered"]),
    "07_attention_at_scale": ("autograde_tests.checks.attention_at_scale", ["_tiled", "_online"]),
    "08_tokens": ("autograde_tests.checks.tokens", ["_trainer", "_encoder", "_decoder"]),
}
EARLIER = "autograde_tests.checks.transformer._greedy"  # an earlier chapter's checks are hidden too
REACH_FOR_THEM = '''
import importlib.util, json, os, sys
module, paths, reference = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
seen = {}
for path in paths:
    where, _, what = path.rpartition(".")
    try:
        exec(f"from {where} import {what}")
        seen[path] = "imported"
    except ImportError as exc:
        seen[path] = str(exc)
try:
    __import__(reference)
    seen["reference"] = "imported"
except ImportError as exc:
    seen["reference"] = str(exc)
spec = importlib.util.find_spec(module)
seen["source"] = open(spec.origin).read()
seen["cache"] = os.listdir(os.path.join(os.path.dirname(spec.origin), "__pycache__"))
print(json.dumps(seen))
'''


@pytest.mark.parametrize("compiled", [["autograde_tests.checks.decoder_only",
                                       "autograde_tests.checks.attention_at_scale",
                                       "autograde_tests.checks.tokens", "autograde_tests.reference.decoder_only"]],
                         indirect=True)
@pytest.mark.parametrize("chapter", GENERATORS)
def test_a_graded_kernel_can_reach_neither_the_checks_generators_nor_the_reference(chapter, compiled, tmp_path):
    module, names = GENERATORS[chapter]
    assert all(callable(getattr(importlib.import_module(module), name)) for name in names)  # here, they are there
    reference = module.replace(".checks.", ".reference.")
    paths = [f"{module}.{name}" for name in names] + [EARLIER]
    seen = json.loads(in_sandbox(chapter, REACH_FOR_THEM, module, json.dumps(paths), reference, tmp_path=tmp_path))
    for path in [*paths, "reference"]:
        assert WHY in seen[path], (path, seen[path])
    assert "def _" not in seen["source"] and WHY in seen["source"]  # the stub, not the checks' source
    assert seen["cache"] == []  # no compiled copy to load instead


def test_a_graded_kernel_imports_what_it_needs_and_the_earlier_chapters_reference(tmp_path):
    needed = kernel_view.visible("06_decoder_only")
    assert "autograde_tests.reference.transformer" in needed and "autograde_tests.checks.stand_in_models" in needed
    assert failed_imports("06_decoder_only", needed, tmp_path) == {}


def test_a_kernel_graded_on_the_tokens_chapter_can_import_no_tokenizer_library(tmp_path):
    libraries = sorted(kernel_view.hidden_libraries("08_tokens"))
    assert {"tiktoken", "tokenizers", "transformers"} <= set(libraries)  # installed here: the suite proves them
    failed = failed_imports("08_tokens", libraries + [f"{name}.{sub}" for name, sub in (
        ("tiktoken", "core"), ("tokenizers", "models"))], tmp_path)
    assert set(failed) == set(libraries) | {"tiktoken.core", "tokenizers.models"}
    assert all(WHY in why for why in failed.values())
    assert failed_imports("07_attention_at_scale", libraries, tmp_path) == {}  # hidden for chapter 8 only


@pytest.mark.parametrize("chapter", nbgrader_course.chapters(REPO))
def test_the_suites_stand_in_for_the_kernel_hides_what_the_sandbox_hides(chapter, tmp_path):
    every = [name for name in kernel_view.modules() if not name.endswith("__main__")]  # importing one would run it
    in_the_sandbox = failed_imports(chapter, every, tmp_path)
    stand_in = kernel_stand_in(chapter)
    refused = set()
    for name in every:
        try:
            stand_in.import_module(name)
        except ImportError:
            refused.add(name)
    assert set(in_the_sandbox) == refused
    assert all(WHY in why for why in in_the_sandbox.values())
    assert f"autograde_tests.checks.{hidden_in_grading(chapter)[0]}" in refused
