"""The authors' tools: what the course's authors run to make the book and the release.

- ``training``, ``lm_training``: the training runs whose results the book shows (``make train`` caches
  them under ``book/_static/``, and chapters 5, 6 and 8 plot them);
- ``bench``: the benchmarks (``make bench`` writes ``book/benchmarks_measured.md``);
- ``solution_regions``, ``notebook_form``: the solution notebooks' answers, written from the reference,
  and their form as JupyterLab saves it (``make release``, before nbgrader writes the learners'
  notebooks); the similarity report reads answers with ``solution_regions``' parser too;
- ``notebook_download``: the Sphinx extension behind each chapter's download button (``_config.yml``);
- ``demo``: ``make demo``, the whole grading loop on a scratch course.

A learner's kernel never imports any of them (``grading.kernel_view`` hides them).
"""
