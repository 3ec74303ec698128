"""nbgrader configuration for the course: instructor notebooks in solutions/, the release in notebooks/."""

c = get_config()  # noqa: F821 (injected by nbgrader)

c.CourseDirectory.course_id = "attention-step-by-step"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"
c.CourseDirectory.db_assignments = [
    dict(name="01_attention"),
    dict(name="04_ffn_layernorm_residual"),
]

# Learners' stubs: what replaces the code between BEGIN/END SOLUTION.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}

# A hanging submission must not stall a class: give each cell a bounded time.
c.ExecutePreprocessor.timeout = 120
