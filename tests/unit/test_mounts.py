"""rc.proto.mounts: the filesystem a path lives on, read from a mounts
table (here a file written by the test), and the warning for one a reboot
empties."""

from __future__ import annotations

from rc.proto.mounts import filesystem_of, volatile_warning

TABLE = """\
/dev/sda1 / ext4 rw,relatime 0 0
tmpfs /run tmpfs rw,nosuid 0 0
tmpfs /srv/with\\040space tmpfs rw 0 0
/dev/sdb1 /run/disk xfs rw 0 0
"""


def test_the_deepest_mount_holding_a_path_names_its_filesystem(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(TABLE)
    assert filesystem_of("/", str(mounts)) == ("/", "ext4")
    assert filesystem_of("/run/rc/rc.db", str(mounts)) == ("/run", "tmpfs")
    assert filesystem_of("/run/disk/rc", str(mounts)) == ("/run/disk", "xfs")
    assert filesystem_of("/runaway", str(mounts)) == ("/", "ext4")  # a prefix is not a parent
    assert filesystem_of("/srv/with space/x", str(mounts)) == ("/srv/with space", "tmpfs")
    assert filesystem_of("/", str(tmp_path / "none")) == ("", "")


def test_a_state_directory_on_tmpfs_is_warned_about(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(TABLE)
    said = volatile_warning("/run/rc", "the state directory", str(mounts))
    assert said.startswith("the state directory /run/rc is on tmpfs (/run): a reboot empties it")
    assert volatile_warning("/run/disk/rc", "the state directory", str(mounts)) == ""
