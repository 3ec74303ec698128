"""An outcome carries its cause as a code (``grading.outcome.Cause``) beside its reason: its status follows from
the cause, ``state.json`` and the class report record it, and zip collection's refusals say by a field, not by
their label's words, which stand for an upload instead of a learner."""

import json
from pathlib import Path

import pytest

from autograde_tests import exchange
from autograde_tests.grading import batch
from autograde_tests.grading.outcome import Cause, Outcome, attention


def test_only_graded_and_unchanged_need_no_attention():
    assert {cause: cause.status for cause in Cause if cause.status != "needs-attention"} == {
        Cause.GRADED: "graded", Cause.UNCHANGED: "unchanged"}
    assert attention(Cause.TIMED_OUT, "timed out after 5 s (killed)") == {
        "status": "needs-attention", "cause": Cause.TIMED_OUT, "reason": "timed out after 5 s (killed)"}


def test_the_record_keeps_the_cause_and_the_status_and_reads_back_as_the_same_cause():
    record = Outcome("ann", "01_attention", Cause.OUT_OF_MEMORY, "memory limit exceeded").record()
    read = json.loads(json.dumps(record))
    assert (read["status"], read["cause"], read["labelled"]) == ("needs-attention", "out-of-memory", False)
    assert Cause(read["cause"]) is Cause.OUT_OF_MEMORY


def test_refused_uploads_are_outcomes_with_their_reasons_joined_and_their_labels_marked():
    refused = [batch.Refused("ann", "01_attention", "a.zip is not a zip archive"),
               batch.Refused("ann", "01_attention", "b.zip is encrypted"),
               batch.Refused(exchange.upload_label("x.ipynb"), "01_attention", "the student id '..' starts with a dot",
                             labelled=True)]
    outcomes = batch._refusals(refused)
    ann = outcomes[("ann", "01_attention")]
    assert (ann.cause, ann.reason, ann.labelled) == (Cause.REFUSED_UPLOAD, "a.zip is not a zip archive; b.zip is "
                                                                            "encrypted", False)
    assert outcomes[("(upload x.ipynb)", "01_attention")].labelled


@pytest.mark.parametrize("labelled", [True, False])
def test_collecting_again_forgets_only_what_was_refused_under_a_label(labelled):
    entry = Outcome("(upload a.ipynb)" if labelled else "(upload) ann", "01_attention", Cause.REFUSED_UPLOAD,
                    "refused", labelled=labelled).record()
    state = {f"{entry['student']}/01_attention": entry}
    batch._forget_earlier_refusals(state, ["02_multi_head_attention"])
    assert len(state) == 1  # another chapter's collection
    batch._forget_earlier_refusals(state, ["01_attention"])
    assert len(state) == (0 if labelled else 1)


def test_the_class_report_names_each_cause_beside_its_reason(tmp_path):
    from autograde_tests import scratch_course
    from autograde_tests.grading import report

    root = scratch_course.scratch_course(Path(__file__).resolve().parents[1], tmp_path / "course")
    state = {f"{o.student}/{o.chapter}": o.record() for o in [
        Outcome("ann", "01_attention", Cause.TIMED_OUT, "timed out after 600 s (killed)"),
        Outcome("bo", "01_attention", Cause.GRADED, score=6, max_score=6)]}
    state["cy/01_attention"] = {"student": "cy", "chapter": "01_attention", "status": "needs-attention",
                                "reason": "recorded before causes"}  # an earlier version's record
    lines = report.write_report(root, state, sandboxed=True).read_text().splitlines()
    attention = lines[lines.index("## Needs attention") + 2:]
    assert attention[:2] == ["- ann / 01_attention (timed-out): timed out after 600 s (killed)",
                             "- cy / 01_attention: recorded before causes"]
