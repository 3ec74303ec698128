"""nbgrader configuration for the course: instructor notebooks in solutions/, the release in notebooks/."""

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import ClearHiddenTests, GetGrades

from autograde_tests.grading import limits
from autograde_tests.grading.feedback import ShortTracebacks

c = get_config()  # noqa: F821 (injected by nbgrader)

c.CourseDirectory.course_id = "attention-step-by-step"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"

# Learners' stubs: what replaces the code between BEGIN/END SOLUTION.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}

# A hanging submission must not stall a class: give each cell a bounded time (make grade's default too).
c.ExecutePreprocessor.timeout = limits.CELL_SECONDS

# Feedback shows each check's message but never the hidden tests' code, in the source or a traceback.
c.GenerateFeedback.preprocessors = [GetGrades, ClearHiddenTests, ShortTracebacks, CSSHTMLHeaderPreprocessor]

# Submissions whose graded cells were deleted get them back from the release.
c.OverwriteCells.add_missing_cells = True

# Learners' LMS downloads (`nbgrader zip_collect`): files named <student id>_<chapter>.ipynb.
# nbgrader matches the pattern against each extracted file's whole path.
c.FileNameCollectorPlugin.named_regexp = r".*/(?P<student_id>[^/]+?)_(?P<file_id>\d\d_[a-z_]+\.ipynb)$"
# Each upload judged on its own: an unsafe entry (../, a link), an unknown name or a student id such as
# `..` is left out and recorded for `make grade --zip-collect`; a gzipped notebook is unpacked.
c.ZipCollectApp.extractor_plugin = "autograde_tests.exchange.SafeExtractor"
c.ZipCollectApp.collector_plugin = "autograde_tests.exchange.SafeNameCollector"

# `nbgrader collect` copies learners' folders from the exchange with the instructor's rights: only
# regular files and folders, never following a link (a submission holding one is skipped with a warning).
c.ExchangeFactory.collect = "autograde_tests.exchange.SafeCollect"
