"""What feedback shows of a failed graded cell: the check's message, never the hidden tests' code.

nbgrader's ClearHiddenTests removes the hidden tests from a cell's source, but a failure's traceback
still quotes the lines around it. This preprocessor, run by ``nbgrader generate_feedback`` (see
nbgrader_config.py), keeps only the last line of each error in a graded cell: ``AssertionError: ...``.
"""

from nbgrader.preprocessors import NbGraderPreprocessor


class ShortTracebacks(NbGraderPreprocessor):
    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
            for output in cell.outputs:
                if output.output_type == "error":
                    output.traceback = [f"{output.ename}: {output.evalue}"]
        return cell, resources
