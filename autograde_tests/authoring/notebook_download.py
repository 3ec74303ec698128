"""A Sphinx role for the book: ``{notebook}`05_transformer``` links the chapter's released notebook so that
it downloads wherever the book is read, from a web server or opened as files.

Sphinx's ``{download}`` role links a copy under ``_downloads/``; a browser honours the link's ``download``
attribute only for a page's own origin, and every ``file://`` page is an origin of its own, so a book opened
from ``_build/html`` showed the notebook's JSON instead. The notebook travels inside the link as a
``data:`` URL (about 40 KB per link), which every browser downloads under the given name.
"""

import base64
import html
from pathlib import Path

from docutils import nodes

MEDIA_TYPE = "application/x-ipynb+json"


def released_notebook(srcdir: Path, chapter: str) -> Path:
    """``notebooks/<chapter>/<chapter>.ipynb`` next to the book's source folder."""
    return srcdir.parent / "notebooks" / chapter / f"{chapter}.ipynb"


def notebook_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    env = inliner.document.settings.env
    chapter = text.strip()
    path = released_notebook(Path(env.srcdir), chapter)
    if not path.is_file():
        message = inliner.reporter.error(f"{{notebook}}: no released notebook {path.name} in notebooks/{chapter}/",
                                         line=lineno)
        return [inliner.problematic(rawtext, rawtext, message)], [message]
    env.note_dependency(str(path))  # a new release rebuilds the page
    data = base64.b64encode(path.read_bytes()).decode()
    link = (f'<a class="reference download internal" download="{html.escape(path.name)}" '
            f'href="data:{MEDIA_TYPE};base64,{data}"><code class="xref download docutils literal notranslate">'
            f'<span class="pre">{html.escape(path.name)}</span></code></a>')
    return [nodes.raw(rawtext, link, format="html")], []


def setup(app):
    app.add_role("notebook", notebook_role)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
