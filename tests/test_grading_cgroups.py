"""Where the grader makes a submission's cgroup and what it reads back, on made-up cgroup trees: below its
own cgroup in v1 (two hierarchies) or v2 (one, which must give its children both controllers), the caps
written and the counters read under each version's names, and one line saying why where neither works.
The real thing, on this machine's cgroups, is tested through make grade in test_grading_bounds."""

from pathlib import Path

import pytest

from autograde_tests.grading import cgroups

V1_MOUNTS = """\
30 25 0:26 / /FAKE/memory rw,nosuid shared:9 - cgroup cgroup rw,memory
31 25 0:27 / /FAKE/pids rw,nosuid shared:10 - cgroup cgroup rw,pids
32 25 0:28 / /FAKE/cpu rw,nosuid shared:11 - cgroup cgroup rw,cpu
"""
V2_MOUNTS = "29 25 0:25 / /FAKE/unified rw,nosuid shared:8 - cgroup2 cgroup2 rw\n"


def tree(tmp_path: Path, mounts: str, own: str, folders: dict[str, dict[str, str]]) -> dict:
    """Made-up ``/proc/self/cgroup``, ``/proc/self/mountinfo`` and cgroup folders (with their files) under
    ``tmp_path``."""
    for folder, files in folders.items():
        (tmp_path / folder).mkdir(parents=True)
        for name, text in files.items():
            (tmp_path / folder / name).write_text(text)
    (tmp_path / "cgroup").write_text(own)
    (tmp_path / "mountinfo").write_text(mounts.replace("/FAKE", str(tmp_path)))
    return {"cgroup_file": tmp_path / "cgroup", "mountinfo": tmp_path / "mountinfo"}


def test_v1_cgroups_are_made_below_the_graders_own_in_both_hierarchies(tmp_path):
    files = tree(tmp_path, V1_MOUNTS, "4:memory:/grader\n8:pids:/\n1:cpu:/\n0::/\n",
                 {"memory/grader": {}, "pids": {}})
    hierarchy = cgroups.bounds(**files)
    assert (hierarchy.version, hierarchy.parents) == (1, [tmp_path / "memory" / "grader", tmp_path / "pids"])
    cgroup = hierarchy.create("grading-1-k", 2**30, processes=64)
    memory, pids = tmp_path / "memory" / "grader" / "grading-1-k", tmp_path / "pids" / "grading-1-k"
    assert cgroup.folders == [memory, pids]
    assert (memory / "memory.limit_in_bytes").read_text() == str(2**30)
    assert (pids / "pids.max").read_text() == "64"
    (memory / "memory.max_usage_in_bytes").write_text("123456\n")
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (pids / "pids.peak").write_text("64\n")
    (pids / "pids.events").write_text("max 7\n")
    assert cgroup.usage() == cgroups.Usage(peak_memory_bytes=123456, peak_processes=64, oom_kills=2, refused_forks=7)


def test_v2_cgroups_are_made_below_the_graders_own_which_delegates_both_controllers(tmp_path):
    files = tree(tmp_path, V2_MOUNTS, "0::/grading.slice\n",
                 {"unified/grading.slice": {"cgroup.controllers": "cpu memory pids",
                                            "cgroup.subtree_control": "memory pids"}})
    hierarchy = cgroups.bounds(**files)
    assert (hierarchy.version, hierarchy.parents) == (2, [tmp_path / "unified" / "grading.slice"])
    cgroup = hierarchy.create("grading-1-k", 2**30, processes=64)
    (folder,) = cgroup.folders
    assert (folder / "memory.max").read_text() == str(2**30) and (folder / "pids.max").read_text() == "64"
    (folder / "memory.peak").write_text("654321\n")
    (folder / "pids.peak").write_text("12\n")
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\noom_group_kill 0\n")
    (folder / "pids.events").write_text("max 0\n")
    assert cgroup.usage() == cgroups.Usage(peak_memory_bytes=654321, peak_processes=12, oom_kills=1, refused_forks=0)


@pytest.mark.parametrize("mounts, own, folders, why", [
    (V2_MOUNTS, "0::/user.slice\n", {"unified/user.slice": {"cgroup.controllers": "cpu io"}},
     "cgroup v2: {root}/unified/user.slice has no memory or pids controller"),
    ("", "0::/\n", {}, "no cgroup hierarchy with the memory and pids controllers is mounted"),
    (V1_MOUNTS, "4:memory:/elsewhere\n8:pids:/\n0::/\n", {"pids": {}},
     "no cgroup hierarchy with the memory and pids controllers is mounted"),
], ids=["v2-without-the-controllers", "nothing-mounted", "own-cgroup-not-mounted"])
def test_where_no_cgroup_can_bound_a_submission_one_line_says_why(tmp_path, mounts, own, folders, why):
    files = tree(tmp_path, mounts, own, folders)
    with pytest.raises(cgroups.Unavailable) as refused:
        cgroups.bounds(**files)
    assert str(refused.value) == why.format(root=tmp_path) and "\n" not in str(refused.value)
