"""Batch scripts (README "Batch scripts"): directives, the #SBATCH subset
that maps, sbatch's time formats, and the command a script runs as. Pure;
running one as a real user is tests/e2e/test_daily_e2e.py."""

from __future__ import annotations

import subprocess

import pytest

from rc.cli import build_parser
from rc.cli.batch import (
    Directive,
    parse_script,
    sbatch_flags,
    script_command,
    slurm_seconds,
    with_script,
)
from rc.cli.context import UsageError

SCRIPT = """#!/bin/bash
# a comment
#SBATCH -J train --time=1:00   # a comment after
#SBATCH -n 2
#RC -s model=h100 -e MODE=fast

echo "$0 $1 $MODE"
#SBATCH -J too-late
"""


def test_directives_end_at_the_first_command():
    s = parse_script("train.sh", SCRIPT)
    assert s.interpreter == ("/bin/bash",)
    assert [(d.line, d.kind, d.words) for d in s.directives] == [
        (3, "SBATCH", ("-J", "train", "--time=1:00")),
        (4, "SBATCH", ("-n", "2")),
        (5, "RC", ("-s", "model=h100", "-e", "MODE=fast")),
    ]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1:00", 60),
        ("30", 1800),
        ("1:02:03", 3723),
        ("2-0", 172800),
        ("1-2:03", 93780),
        ("1-00:00:05", 86405),
        ("UNLIMITED", 0),
        ("2h", 7200),
    ],
)
def test_sbatch_times(text, seconds):
    assert slurm_seconds(text) == seconds


def test_a_bad_time_is_named():
    with pytest.raises(ValueError, match="'1:xx' is not a time"):
        slurm_seconds("1:xx")


def _flags(*words: str, lenient: bool = False) -> list[str]:
    return sbatch_flags(Directive(7, "SBATCH", words), lenient, "job.sh")


def test_the_subset_that_maps():
    assert _flags("-J", "x", "-t", "1:00", "-n2") == [
        "--name",
        "x",
        "--max-runtime",
        "60",
        "--count",
        "2",
    ]
    assert _flags("--gres=gpu:a100:4", "--array=0-9%2") == ["--count", "4", "--array", "0-9%2"]
    assert _flags("--export=ALL,A=1", "-D", "/work", "-I") == [
        "--export", "ALL,A=1", "--cwd", "/work", "--no-wait",
    ]  # fmt: skip
    assert _flags("--dependency=afterok:4:5,afterany:6") == [
        "--after", "4:ok", "--after", "5:ok", "--after", "6:any",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (("--mem=4G",), "job.sh:7: #SBATCH --mem: rc does not support it yet"),
        (("-o", "out-%j.txt"), "job.sh:7: #SBATCH -o: rc does not support it yet"),
        (("--cpus-per-task=4",), "#SBATCH --cpus-per-task: rc does not support it yet"),
        (("-p", "gpu"), "job.sh:7: #SBATCH -p is not an option rc has"),
        (("--mail-type=END",), "#SBATCH --mail-type is not an option rc has"),
        (("--dependency=afterok:4?afterany:5",), "not any"),
        (("--gpus=a100:2",), "a count only"),
        (("train",), "'train' is not an option"),
        (("-t",), "-t needs a value"),
    ],
)
def test_what_does_not_map_is_named_and_refused(words, said):
    with pytest.raises(UsageError) as got:
        _flags(*words)
    assert said in str(got.value)
    if "rc " in said:  # an option rc has no counterpart for: --lenient is the way past
        assert "--lenient skips it" in str(got.value)


def test_lenient_skips_with_a_warning(capsys):
    assert _flags("--mem=4G", "-p", "gpu", "-J", "x", lenient=True) == ["--name", "x"]
    err = capsys.readouterr().err
    assert "job.sh:7: skipped #SBATCH --mem" in err and "skipped #SBATCH -p" in err


def test_no_shebang_is_refused():
    with pytest.raises(UsageError, match="first line must be #!"):
        parse_script("x.sh", "echo hi\n")


def _run(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout


def test_a_shell_script_runs_from_its_text_with_its_arguments(tmp_path):
    s = parse_script(str(tmp_path / "t.sh"), '#!/bin/sh\necho "$(basename "$0") $1 $2"\n')
    command = script_command(s, ["a b", "c"])
    assert command[:2] == ["/bin/sh", "-c"]
    assert _run(command) == "t.sh a b c\n"
    via_env = parse_script("t.sh", "#!/usr/bin/env bash\necho $BASH_VERSION | cut -c1\n")
    assert script_command(via_env, [])[:3] == ["/usr/bin/env", "bash", "-c"]


def test_another_interpreter_runs_a_private_copy_that_is_removed(tmp_path):
    s = parse_script(
        "p.py", "#!/usr/bin/env python3\nimport sys\nprint(sys.argv[1:], sys.argv[0])\n"
    )
    out = _run(script_command(s, ["x", "y z"]))
    args, copy = out.rsplit(" ", 1)
    assert args == "['x', 'y z']" and "rc-batch." in copy
    assert not __import__("os").path.exists(copy.strip())


def test_command_line_flags_win_over_directives_and_e_adds_up(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT)
    argv = ["batch", "--name", "mine", "-e", "B=2", "-s", "model=a100", str(script), "x"]
    args = build_parser("batch").parse_args(argv)
    args.argv_ = argv
    command = with_script(args, args.script, args.script_args)
    assert (args.name, args.max_runtime, args.count) == ("mine", 60, 2)
    assert args.selector == "model=a100" and args.env == ["MODE=fast", "B=2"]
    assert command[:3] == ["/bin/bash", "-c", SCRIPT] and command[-1] == "x"
    script.write_text("#!/bin/sh\n#SBATCH -t 5\ntrue\n")
    argv = ["batch", str(script)]
    args = build_parser("batch").parse_args(argv)
    args.argv_ = argv
    with_script(args, args.script, [])
    assert (args.name, args.max_runtime) == ("train.sh", 300)


def test_a_bad_rc_directive_names_its_line(tmp_path):
    script = tmp_path / "j.sh"
    script.write_text("#!/bin/sh\n#RC --priority 99\ntrue\n")
    args = build_parser("batch").parse_args(["batch", str(script)])
    with pytest.raises(UsageError, match=r"j.sh:2: #RC .*99"):
        with_script(args, args.script, [])
    script.write_text("#!/bin/sh\n#RC echo hi\ntrue\n")
    with pytest.raises(UsageError, match=r"j.sh:2: #RC holds rc run flags only"):
        with_script(args, args.script, [])


# -- --begin (rc.cli.queueedit.begin_time) -----------------------------------------------


def test_begin_times():
    import time

    from rc.cli.queueedit import begin_time

    now = time.mktime((2026, 12, 2, 18, 0, 0, 0, 0, -1))
    assert begin_time("+90m", now) == now + 5400
    assert begin_time("now+2h", now) == now + 7200
    assert begin_time("now", now) == now
    assert begin_time("22:00", now) == now + 4 * 3600
    assert begin_time("17:00", now) == now + 23 * 3600  # passed today: tomorrow
    assert begin_time("2026-12-03", now) == now + 6 * 3600
    assert begin_time("2026-12-03T08:30", now) == now + 14.5 * 3600
    for bad in ("25:00", "tomorrow", "+5x", "2026-13-01"):
        with pytest.raises(ValueError, match="--begin"):
            begin_time(bad, now)


def test_sbatch_begin_maps_to_rcs():
    assert _flags("--begin=now+1hour") == ["--begin", "+1h"]
    assert _flags("--begin", "now+60") == ["--begin", "+60s"]
    assert _flags("--begin=16:00") == ["--begin", "16:00"]
