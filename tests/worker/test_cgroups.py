"""rc.worker.cgroups on captured text: the mount table, /proc/self/cgroup,
cgroup.procs, and the fallback to scan for a root that is no hierarchy."""

from __future__ import annotations

from rc.worker import cgroups

MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
cgroup2 /mnt/with\\040space cgroup2 rw 0 0
proc /proc proc rw 0 0
"""


def test_mounts_keep_only_cgroup_hierarchies_with_their_options():
    got = cgroups.parse_mounts(MOUNTS)
    assert [(m.path, m.fstype) for m in got] == [
        ("/sys/fs/cgroup/freezer", "cgroup"),
        ("/sys/fs/cgroup/cpu,cpuacct", "cgroup"),
        ("/sys/fs/cgroup/unified", "cgroup2"),
        ("/mnt/with space", "cgroup2"),
    ]
    assert "freezer" in got[0].options and "cpuacct" in got[1].options


def test_self_cgroup_names_each_controller_and_the_v2_path():
    text = "9:name=systemd:/\n6:freezer:/a\n2:cpu,cpuacct:/b\n0::/system.slice/rc.service\n"
    got = cgroups.parse_self_cgroup(text)
    assert got["freezer"] == "/a" and got["cpu"] == got["cpuacct"] == "/b"
    assert got[""] == "/system.slice/rc.service"


def test_procs_text_gives_pids_and_skips_junk():
    assert cgroups.parse_pids("12\n13\n\nx\n") == [12, 13]
    assert cgroups.parse_pids("") == []


def test_a_root_that_is_no_hierarchy_means_scan(tmp_path):
    t = cgroups.Tracker.detect("h", str(tmp_path))
    assert t.mode == cgroups.SCAN and str(tmp_path) in t.why
    assert t.create("job-1") is None and t.children() == []


def test_no_cgroup_mount_at_all_means_scan(tmp_path):
    table = tmp_path / "mounts"
    table.write_text("proc /proc proc rw 0 0\n")
    t = cgroups.Tracker.detect("h", "", mounts=str(table))
    assert t.mode == cgroups.SCAN and "no cgroup hierarchy is mounted" in t.why
