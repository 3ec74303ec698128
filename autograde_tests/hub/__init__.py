"""The course on a local JupyterHub (``make hub``): an instructor and learners as system users, nbgrader's
exchange in a folder of its own, the course's environment as every user's server and kernel.

``local_hub.Hub`` makes the accounts (``accounts``) and folders, starts JupyterHub, and removes it all on
exit; ``python -m autograde_tests.hub`` runs it until Ctrl-C.
"""
