"""Every bound the grader enforces, in one table (as codejail's ``LIMITS``): each with its unit in its name
and why it is what it is. The modules that enforce a bound read it from here, and so do ``make grade``'s
options (``__main__``) and ``nbgrader_config.py``; none writes a value of its own.

The first group are the defaults of ``make grade``'s options, which an instructor may change per batch;
the rest are fixed. A few bounds live beside code that another side imports without ``grading/``: the
wire's and what the grader lends (``remote/``, which the kernel imports too), and an upload's size (the
course's nbgrader plugins, ``exchange``). They are listed here in ``ELSEWHERE``, and the bounds made from
them are read when first asked for: ``remote/`` loads torch and ``exchange`` loads nbgrader, which the
coordinator's start, nbgrader's configuration and the relays never load. ``table()`` gives them all.

Nothing here imports more than the standard library: a relay process, capped at ``RELAY_BASE_BYTES`` of
address space and more, imports this module.
"""

import importlib

# -- make grade's options (their defaults) --------------------------------------------------------------------

# seconds for one submission, its kernel's start included (--timeout): past it the kernel is killed, so a
# notebook that never ends holds a grading worker this long at most
SUBMISSION_SECONDS = 600
# seconds for one cell (--cell-timeout; nbgrader's own commands read it through nbgrader_config.py): a cell
# that hangs must not stall a class; the requests of one graded test cell share it
CELL_SECONDS = 120
# bytes of memory for one submission: its kernel and everything it starts, together where a cgroup bounds
# them, else each process (--memory, given in GiB)
MEMORY_BYTES = 4 * 2**30
# bytes of messages a submission's cells may send in all, whatever their type (--output): a flood of prints
# must not fill the grader's memory, the autograded notebook or the feedback page
OUTPUT_BYTES = 1_000_000
# bytes added to the count for each output kept: what a notebook and its feedback page add around an output
# (its type, HTML), so that a million empty prints cannot pass under the cap
OUTPUT_OVERHEAD_BYTES = 256
# seconds with no grading worker connected before a batch stops (--wait-for-workers): a Dask cluster that
# scales up from no worker gets that long to start one
WORKER_PATIENCE_SECONDS = 300
# the similarity (0 to 1) from which the similarity report lists a pair (--similarity): between copies of an
# answer (0.88 and up) and answers written independently (0.42 and below), as the instructor guide measures
SIMILARITY_THRESHOLD = 0.7

# -- waits on a kernel -------------------------------------------------------------------------------------------

# seconds for a kernel to start and answer the grader's probe (it imports torch): past it the kernel is the
# grader's fault, never the submission's
KERNEL_START_SECONDS = 120
# seconds a cell's last messages may take to come after its reply: long enough for a kernel on a busy machine;
# past it the cell ends without them, instead of failing the notebook
IOPUB_SECONDS = 10

# -- the sandbox (sandbox_kernel; per process, or tmpfs sizes) ---------------------------------------------------

# bytes of the largest file the kernel may write (RLIMIT_FSIZE; caches included)
FILE_BYTES = 64 * 2**20
# bytes of the kernel's private writable space (/tmp: its home and working folder), a tmpfs: nothing the
# kernel writes reaches the host's disk
TMP_BYTES = 256 * 2**20
# bytes of its /dev/shm, a private tmpfs (the host's is never written)
SHM_BYTES = 64 * 2**20
# bytes of the folder of its sockets (which take no space; anything else written there does)
SOCKETS_BYTES = 2**20

# -- a submission's cgroup (cgroups) -----------------------------------------------------------------------------

# processes and threads of one submission, the kernel's own included (pids.max): a fork bomb stops here
PROCESSES = 256
# bytes of swap a submission may use beside its memory: none, or it could hold more than MEMORY_BYTES
SWAP_BYTES = 0

# -- what the grader reads from a kernel (channels, execute, relay) ----------------------------------------------

# bytes of a message's header, parent header or metadata, each: what is larger is not read at all
HEADER_BYTES = 64 * 2**10
# bytes of an execute reply's content: a larger one becomes an error that says so
SHELL_BYTES = 2**20
# characters of an exception's name, as the grader keeps it
NAME_CHARS = 200
# whole messages zmq keeps waiting on each socket the grader reads (RCVHWM; zmq never counts frames)
WAITING_MESSAGES = 8
# bytes of a relay's address space before any message (RLIMIT_AS): Python, zmq and their threads
RELAY_BASE_BYTES = 64 * 2**20
# messages a relay may hold at once, each up to FRAME_BYTES (RLIMIT_AS): one passing on, one waiting, one arriving
RELAY_HELD_MESSAGES = 3
# REPLY_BYTES and FRAME_BYTES are made from the wire's cap: see __getattr__ below.

# -- the grading worker's own memory (worker; glibc's malloc) ----------------------------------------------------

# bytes from which a buffer is mapped on its own and unmapped when freed (glibc's default starts at 128 KiB
# and grows with the largest buffer freed, which left the heap fragmented by floods of large messages)
MMAP_BYTES = 256 * 2**10
# bytes of free memory at the heap's top beyond which it is given back to the OS
TRIM_BYTES = 2**20

# -- what the coordinator reads from a submission (batch, similarity) --------------------------------------------

# bytes of each file that goes from submitted/ with a graded submission (its timestamp, its secret): more is
# neither; NOTEBOOK_BYTES, a notebook's own, is an upload's: see __getattr__ below
CARRIED_BYTES = 64 * 2**10
# bytes of a notebook the similarity report reads (a larger one is left out of the report)
SIMILARITY_NOTEBOOK_BYTES = 20 * 2**20
# characters of an answer the similarity report compares: a longer one is compared by its beginning
ANSWER_CHARS = 20_000
# statements of the longest block an answer is put in canonical form with (a long answer has some 30): its
# steps take time that grows with the square of a block's length; a longer one is compared as it is
CANONICAL_STATEMENTS = 200
# pairs a chapter's similarity page shows side by side, most similar first (its table lists every pair)
SHOWN_PAIRS = 100

# -- kept elsewhere, listed here -------------------------------------------------------------------------------

ELSEWHERE = {
    # bytes of the largest message either side of the wire reads (remote.wire)
    "MAX_BYTES": "autograde_tests.remote.wire",
    # levels of nesting the wire reads
    "MAX_DEPTH": "autograde_tests.remote.wire",
    # characters of a string taken from the kernel (type names, exception messages)
    "MAX_TEXT": "autograde_tests.remote.wire",
    # classes of an object the grader learns (for isinstance on a proxy)
    "MRO_SHOWN": "autograde_tests.remote.agent",
    # bytes of the tensors the grader keeps for the kernel's backward passes on what it lent (oldest dropped)
    "GRAPH_BYTES": "autograde_tests.remote.lent",
    # calls whose graphs the grader keeps
    "GRAPHS": "autograde_tests.remote.lent",
    # numbers, in all the tensors of one call on what the grader lent (it runs them outside the sandbox)
    "CALL_ELEMENTS": "autograde_tests.remote.lent",
    # size along any one dimension of a tensor of such a call
    "CALL_SIZE": "autograde_tests.remote.lent",
    # bytes of one notebook an upload may hold, unpacked (nbgrader's default max_file_size)
    "MAX_UPLOAD": "autograde_tests.exchange",
}


def _elsewhere(name: str) -> int:
    return getattr(importlib.import_module(ELSEWHERE[name]), name)


def __getattr__(name: str) -> int:
    """The bounds made from those kept elsewhere, read on first use (see the module's docstring)."""
    if name == "REPLY_BYTES":
        # bytes of a reply to one of the grader's requests, and of one call on what it lent: the longest text
        # the wire reads (base64 of MAX_BYTES) and its envelope
        return _elsewhere("MAX_BYTES") * 4 // 3 + 2**20
    if name == "FRAME_BYTES":
        # bytes of the largest message (and frame) the grader receives from a kernel's relays, and a relay
        # from the kernel: a reply and its headers; a larger one cuts the connection, unread
        return __getattr__("REPLY_BYTES") + 2**20
    if name == "NOTEBOOK_BYTES":
        # bytes of a submitted notebook the grader reads: an upload's limit, whichever way it came
        return _elsewhere("MAX_UPLOAD")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def table() -> dict[str, int | float]:
    """Every bound by name, with its value: those above, those made from the ones kept elsewhere, and those
    (named by module) kept elsewhere. It imports them, torch and nbgrader with them."""
    own = {name: value for name, value in globals().items()
           if name.isupper() and name != "ELSEWHERE" and isinstance(value, (int, float))}
    made = {name: __getattr__(name) for name in ("REPLY_BYTES", "FRAME_BYTES", "NOTEBOOK_BYTES")}
    kept = {f"{module.rsplit('.', 1)[1]}.{name}": _elsewhere(name) for name, module in ELSEWHERE.items()}
    return own | made | kept
