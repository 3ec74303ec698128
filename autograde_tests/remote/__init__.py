"""The learner's objects, used from another process: how a graded run judges code it cannot reach.

``wire`` is what crosses (JSON and safetensors), ``agent`` the kernel's side, ``proxy`` the grader's,
``lent`` what the grader hands the learner's code and keeps.
"""

# The display-data type of the agent's replies: the one thing the grader reads from a request's outputs.
MIME = "application/vnd.attention-step-by-step.reply+json"
