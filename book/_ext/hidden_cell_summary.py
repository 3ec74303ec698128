"""MyST-NB's "Show code cell source" summary without its aria-label "Toggle hidden content": the words a reader
sees are then the control's name, as WCAG 2.5.3 asks (a voice-control user says what they see)."""

from html import escape

from myst_nb.sphinx_ import HideCodeCellNode, depart_HideCellInput


def visit_hide_cell_input(self, node):
    self.body.append(f'<details class="admonition hide {" ".join(node["classes"])}">\n<summary>\n')
    self.body.append(f'<p class="collapsed admonition-title">{escape(node["prompt_show"])}</p>\n')
    self.body.append(f'<p class="expanded admonition-title">{escape(node["prompt_hide"])}</p>\n</summary>\n')


def setup(app):
    app.setup_extension("myst_nb")
    app.add_node(HideCodeCellNode, override=True, html=(visit_hide_cell_input, depart_HideCellInput))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
