"""Collection that never follows a link and never writes outside submitted/: nbgrader's own, configured.

nbgrader collects in two ways, and the course's ``nbgrader_config.py`` (and the hub's) swaps a class of each:

* ``nbgrader collect`` copies each learner's folder from the exchange's ``inbound/`` with the instructor's
  rights. nbgrader's copy follows links, so a planted folder holding a link to the instructor's notebook
  became a regular file in submitted/. ``SafeCollect`` copies only regular files and folders, without
  following a link; a submission holding anything else, or whose student id could climb out of
  submitted/, is skipped with a warning (and an earlier collected copy stays as it was).
* ``nbgrader zip_collect`` unpacks an LMS download. nbgrader's extractor refuses (and fails the whole
  class on) an entry with ``../`` or a gzipped notebook, and its file-name collector takes any student id,
  ``..`` included. ``SafeExtractor`` and ``SafeNameCollector`` judge each upload on its own: a bad,
  unsafe or unknown one is left out and recorded, with its learner (or, where its name names none safely,
  a label standing for the upload) and the reason, in ``downloaded/<chapter>/refused.json``, which
  ``make grade --zip-collect`` reports as needs attention.
"""

import gzip
import io
import json
import os
import stat
import zipfile
from pathlib import Path, PurePosixPath

from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.plugins import ExtractorPlugin, FileNameCollectorPlugin
from nbgrader.utils import parse_utc

from .submission_files import NotData, Rules, copy_tree, kind, read_beneath, student_id_problem, write_new

REFUSED = "refused.json"
MAX_UPLOAD = 100 * 2**20  # bytes one unpacked notebook may hold (nbgrader's default max_file_size)


class SafeCollect(ExchangeCollect):
    """``nbgrader collect``, copying only regular files and folders and never following a link."""

    def init_src(self):
        super().init_src()
        self.src_records = [record for record in self.src_records if self._acceptable(record)]

    def _acceptable(self, record: dict) -> bool:
        """Whether a learner's latest submission is only plain files with a usable student id; else warn.

        Checked before nbgrader removes the copy collected earlier, which a refused one leaves in place.
        """
        source = Path(self.inbound_path, record["filename"])
        why = student_id_problem(record["username"])
        if why is None:
            try:
                copy_tree(source, None, self._rules())
            except NotData as exc:
                why = str(exc)
        if why:
            self.log.warning("Skipped the submission %s: %s; nothing of it was collected", source, why)
        return why is None

    def _rules(self) -> Rules:
        coursedir = self.coursedir
        return Rules(tuple(coursedir.ignore), tuple(coursedir.include), coursedir.max_file_size, coursedir.max_dir_size)

    def do_copy(self, src, dest, log=None):
        """Copy ``src`` to ``dest`` as ``copy_tree`` does; a submission that changed since it was checked is skipped."""
        try:
            copy_tree(Path(src), Path(dest), self._rules(), self.log)
        except NotData as exc:
            self.log.warning("Skipped the submission %s: %s; nothing of it was collected", src, exc)


class Refusals:
    """The uploads zip collection of one chapter left out: ``downloaded/<chapter>/refused.json``."""

    def __init__(self, app):
        self.path = Path(app.coursedir.root, app.downloaded_directory, app.coursedir.assignment_id, REFUSED)
        self.log = app.log

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def add(self, learner: str | None, upload: str, reason: str) -> None:
        """Record ``upload`` as refused for ``learner``, or (None) for no learner: a label then stands for one."""
        student = learner if learner is not None else upload_label(upload)
        self.log.warning("Refused %s (%s): %s", upload, student, reason)
        records = read_refusals(self.path)
        records.append({"student": student, "labelled": learner is None, "upload": upload, "reason": reason})
        self.path.write_text(json.dumps(records, indent=1))


def upload_label(upload: str) -> str:
    """What stands for the learner of an upload whose name names none safely (a label; never a folder)."""
    return f"(upload {upload})"


def read_refusals(path: Path) -> list[dict]:
    """The records of a ``refused.json``: ``[{"student", "labelled", "upload", "reason"}, ...]`` ([] when there
    is none); ``labelled``: ``student`` is a label for the upload, which names no learner safely."""
    return json.loads(path.read_text()) if path.is_file() else []


class SafeNameCollector(FileNameCollectorPlugin):
    """nbgrader's file-name collector, refusing (and recording) every file it cannot safely place.

    A file must be named as the course's ``named_regexp`` says, for this chapter's notebook, with a
    student id that names a folder inside submitted/, and be its learner's only one.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.uploads: dict[str, str] = {}  # student id -> the upload collected for them

    def collect(self, submitted_file: str):
        refusals = Refusals(self.parent)
        upload = self._upload_name(submitted_file)
        info = super().collect(submitted_file)
        if not info:
            refusals.add(self.learner(upload), upload, f"{upload}: not an upload named {self._expected()}")
            return None
        student, why = info["student_id"], student_id_problem(info["student_id"])
        if why is None and info["file_id"] != f"{self.parent.coursedir.assignment_id}.ipynb":
            why = f"{upload} is not a notebook of {self.parent.coursedir.assignment_id} (named {self._expected()})"
        if why is None and isinstance(info.get("timestamp"), str):
            why = _timestamp_problem(info["timestamp"])
        if why is None and student in self.uploads:
            why = f"more than one upload for {student} ({self.uploads[student]}, {upload}): which one counts?"
        if why:
            refusals.add(student if student_id_problem(student) is None else None, upload, why)
            return None
        self.uploads[student] = upload
        return info

    def learner(self, upload: str) -> str | None:
        """The learner an upload's name names, when it names one safely; else None."""
        info = self._match("/" + PurePosixPath(upload.removesuffix(".gz")).name) if self.named_regexp else None
        student = (info or {}).get("student_id")
        return student if student is not None and student_id_problem(student) is None else None

    def _expected(self) -> str:
        return f"<student id>_{self.parent.coursedir.assignment_id}.ipynb"

    def _upload_name(self, submitted_file: str) -> str:
        """The file as the instructor's download named it: its path inside the extracted folder."""
        extracted = Path(self.parent._format_collect_path(self.parent.extracted_directory))
        return str(Path(submitted_file).relative_to(extracted))


def _timestamp_problem(timestamp: str) -> str | None:
    try:
        parse_utc(timestamp)
    except ValueError:
        return f"its timestamp {timestamp!r} cannot be read"
    return None


class SafeExtractor(ExtractorPlugin):
    """nbgrader's extractor, one upload at a time: a zip's safe entries and gzipped notebooks are unpacked,
    anything else that is not a plain file (or an entry that would land outside) is refused and recorded."""

    def extract(self, archive_path: str, extracted_path: str) -> None:
        refusals = Refusals(self.parent)
        refusals.clear()
        archive, extracted = Path(archive_path), Path(extracted_path)
        for upload in _uploads(archive, refusals, self._learner):
            relative = upload.relative_to(archive)
            if upload.name.endswith(".zip"):
                self._unzip(upload, str(relative), extracted / relative.with_suffix(""), refusals)
                continue
            try:
                data = read_beneath(archive, str(relative), MAX_UPLOAD)
            except NotData as exc:
                refusals.add(self._learner(str(relative)), str(relative), str(exc))
                continue
            if upload.name.endswith(".gz"):
                self._gunzip(str(relative), upload.name, data, extracted / relative.parent, refusals)
            else:
                self._place(str(relative), data, extracted / relative, refusals)

    def _learner(self, upload: str) -> str | None:
        return self.parent.collector_plugin_inst.learner(upload)

    def _unzip(self, upload: Path, name: str, into: Path, refusals: Refusals) -> None:
        """Every entry of the zip ``upload`` (``name`` in the archive folder) that is a plain file with a path
        inside ``into``, unpacked there."""
        try:
            bundle = zipfile.ZipFile(upload)
        except (zipfile.BadZipFile, OSError) as exc:
            refusals.add(self._learner(name), name, f"{name} is not a zip archive ({exc})")
            return
        with bundle:
            for entry in bundle.infolist():
                shown = f"{name}:{entry.filename}"
                why = _entry_problem(entry)
                if why:
                    refusals.add(self._learner(entry.filename), shown, f"{shown} {why}")
                    continue
                if entry.is_dir():
                    continue
                try:
                    data = bundle.read(entry)
                except Exception as exc:  # zipfile raises several kinds for a damaged entry
                    refusals.add(self._learner(entry.filename), shown, f"{shown} cannot be read ({exc})")
                    continue
                if entry.filename.endswith(".gz"):
                    path = PurePosixPath(entry.filename)
                    self._gunzip(shown, path.name, data, into / path.parent, refusals)
                else:
                    self._place(shown, data, into / entry.filename, refusals)

    def _gunzip(self, shown: str, name: str, data: bytes, into: Path, refusals: Refusals) -> None:
        """A gzipped notebook (``<name>.ipynb.gz``), unpacked into ``into`` as ``<name>.ipynb``."""
        name = name.removesuffix(".gz")
        if not name.endswith(".ipynb"):
            refusals.add(self._learner(shown), shown, f"{shown} is an archive of a kind not unpacked here "
                                                      "(only .zip and a gzipped notebook, .ipynb.gz)")
            return
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as unpacked:
                notebook = unpacked.read(MAX_UPLOAD + 1)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            refusals.add(self._learner(shown), shown, f"{shown} is not a gzip file ({exc})")
            return
        if len(notebook) > MAX_UPLOAD:
            refusals.add(self._learner(shown), shown, f"{shown} unpacks to more than {MAX_UPLOAD} bytes")
            return
        self._place(shown, notebook, into / name, refusals)

    def _place(self, shown: str, data: bytes, path: Path, refusals: Refusals) -> None:
        """Write one unpacked file; two uploads that unpack to the same name are refused."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_new(path, data)
        except FileExistsError:
            refusals.add(self._learner(shown), shown, f"{shown} unpacks to a file another upload already gave")
        except OSError as exc:  # e.g. an earlier entry made a file where this one needs a folder
            refusals.add(self._learner(shown), shown, f"{shown} cannot be unpacked ({exc.strerror})")


def _uploads(archive: Path, refusals: Refusals, learner):
    """The regular files under ``archive`` (links not followed); anything else there is refused."""
    for here, folders, names in os.walk(archive):
        for name in sorted(folders + names):
            path = Path(here, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                yield path
            elif not stat.S_ISDIR(mode):
                shown = str(path.relative_to(archive))
                refusals.add(learner(shown), shown, f"{shown} is {kind(path)}")


def _entry_problem(entry: zipfile.ZipInfo) -> str | None:
    """Why a zip entry cannot be unpacked safely (None when it can): a path that leaves, a link, a device."""
    path = PurePosixPath(entry.filename)
    if not path.parts or path.is_absolute() or ".." in path.parts or any(c in entry.filename for c in "\\\0"):
        return "has a path that leaves the archive's folder"
    kind_bits = stat.S_IFMT(entry.external_attr >> 16)  # 0 when the zip says nothing (Windows, Python's writestr)
    if kind_bits not in (0, stat.S_IFREG, stat.S_IFDIR):
        return "is a symbolic link or a special file, not a plain file"
    if entry.flag_bits & 0x1:
        return "is encrypted"
    if entry.file_size > MAX_UPLOAD:
        return f"holds more than {MAX_UPLOAD} bytes"
    return None
