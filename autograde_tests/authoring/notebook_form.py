"""Write the instructor notebooks in the form JupyterLab saves them, so a released notebook opens unmodified.

JupyterLab stores the kernel's ``language_info`` in a notebook's metadata as soon as the kernel starts; a
notebook that carries less (or another Python's) is marked modified before the learner types anything.
``make release`` runs ``python -m autograde_tests.authoring.notebook_form`` before nbgrader copies the metadata into
``notebooks/``. The form is this environment's: another Python version writes another ``version``.
"""

import argparse
from pathlib import Path

import nbformat
from ipykernel.ipkernel import IPythonKernel


def kernel_language_info() -> dict:
    """What the course's kernel (ipykernel in this environment) reports, as JupyterLab would store it."""
    return dict(IPythonKernel.language_info)


def in_saved_form(notebook: nbformat.NotebookNode) -> bool:
    return notebook.metadata.get("language_info") == kernel_language_info()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m autograde_tests.authoring.notebook_form",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--course", type=Path, default=Path.cwd())
    args = parser.parse_args(argv)
    for path in sorted(args.course.glob("solutions/[0-9]*/*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        if not in_saved_form(notebook):
            notebook.metadata["language_info"] = kernel_language_info()
            nbformat.write(notebook, path)
            print(f"language_info written as the kernel reports it: {path.relative_to(args.course)}")


if __name__ == "__main__":
    main()
