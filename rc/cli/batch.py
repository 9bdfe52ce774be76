"""`rc batch SCRIPT [ARGS]` and `rc run --script SCRIPT`: a batch script
with its options inside it, as sbatch takes one (README "Batch scripts").

A script starts with `#!` and its interpreter. Its directives are the
comment lines after that, before its first command:

    #RC --max-runtime 2h -s model=h100     rc run's own flags, as on the command line
    #SBATCH -J train -n 2 -t 1:00:00       sbatch's, for the subset that maps (SBATCH_FLAGS)

Directives are read in order (a later one wins, -e and --after add up),
and the command line's flags win over all of them. An #SBATCH option rc
has no counterpart for is refused, naming it and its line (`--lenient`:
skipped with a warning). The script's text is read once, at submit, and
stored with the job as part of its command (editing the file afterwards
changes nothing): a shell script runs as `INTERPRETER -c TEXT SCRIPT
ARGS...` ($0 is the script's path, $1... its arguments); any other
interpreter gets the text in a private temporary file that is removed when
it ends. It runs as the job's user, as every job does.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
from dataclasses import dataclass

from rc.cli.context import UsageError, stderr
from rc.proto.duration import DurationError, whole_seconds
from rc.proto.model import valid_job_name

__all__ = [
    "SBATCH_FLAGS",
    "SBATCH_NOT_YET",
    "SCRIPT_MAX_BYTES",
    "Directive",
    "Script",
    "add_parsers",
    "parse_script",
    "sbatch_flags",
    "script_command",
    "slurm_seconds",
    "with_script",
]

SCRIPT_MAX_BYTES = 120 << 10
"""Largest script: its text travels as one argument of the job's command,
and Linux takes at most 128 KiB in one argument (MAX_ARG_STRLEN)."""
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash"})
"""Interpreters that take a script as `-c TEXT NAME ARGS...`."""
DIRECTIVE_RE = re.compile(r"#(SBATCH|RC)(?:\s+(.*))?$")

SBATCH_FLAGS = {
    "job-name": "--name",
    "ntasks": "--count",
    "gpus": "--count",
    "gres": "--count",
    "time": "--max-runtime",
    "array": "--array",
    "export": "--export",
    "chdir": "--cwd",
    "dependency": "--after",
    "priority": "--priority",
    "immediate": "--no-wait",
    "begin": "--begin",
}
"""#SBATCH options and the rc run flags they become (long names; SHORT
maps the letters). -n/--ntasks and -G/--gpus are the number of devices
(rc gives a task one device); --gres takes gpu:N or gpu:TYPE:N."""
SHORT = {
    "J": "job-name",
    "n": "ntasks",
    "G": "gpus",
    "t": "time",
    "a": "array",
    "D": "chdir",
    "d": "dependency",
    "I": "immediate",
    "o": "output",
    "e": "error",
    "c": "cpus-per-task",
    "H": "hold",
    "N": "nodes",
    "p": "partition",
    "A": "account",
    "q": "qos",
}
SBATCH_NOT_YET = frozenset(
    {"output", "error", "signal", "mem", "cpus-per-task", "hold", "open-mode"}
)
"""#SBATCH options rc will have and does not yet: refused, naming them."""
_NO_VALUE = frozenset({"immediate", "hold"})
_DEPENDENCY = {"afterok": "ok", "afternotok": "notok", "afterany": "any"}


@dataclass(frozen=True, slots=True)
class Directive:
    """One directive line: its number (1-based), "SBATCH" or "RC", and its
    words (shell-split, a trailing # comment dropped)."""

    line: int
    kind: str
    words: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Script:
    """A batch script as submitted: its path (as given), text, interpreter
    (the #! line's words) and directives."""

    path: str
    text: str
    interpreter: tuple[str, ...]
    directives: tuple[Directive, ...]


def parse_script(path: str, text: str) -> Script:
    """The interpreter and directives of script `text` (named `path` in
    messages). Raises UsageError: no #! line, a NUL character, too big, a
    directive that is not shell words."""
    if len(text.encode()) > SCRIPT_MAX_BYTES:
        raise UsageError(f"{path} is over {SCRIPT_MAX_BYTES} bytes, the most a script may have")
    if "\0" in text:
        raise UsageError(f"{path} contains a NUL character: not a script")
    lines = text.split("\n")
    first = lines[0].rstrip("\r")
    interpreter = tuple(first[2:].split()) if first.startswith("#!") else ()
    if not interpreter:
        raise UsageError(
            f"{path}: the first line must be #! and an interpreter (#!/bin/bash), as sbatch asks"
        )
    found: list[Directive] = []
    for n, raw in enumerate(lines[1:], 2):
        line = raw.strip()
        if not line:
            continue
        if not line.startswith("#"):
            break  # the first command ends the directives, as in sbatch
        m = DIRECTIVE_RE.match(line)
        if m is None:
            continue
        try:
            words = tuple(shlex.split(m.group(2) or "", comments=True))
        except ValueError as e:
            raise UsageError(f"{path}:{n}: #{m.group(1)} {e}") from None
        found.append(Directive(n, m.group(1), words))
    return Script(path, text, interpreter, tuple(found))


def slurm_seconds(text: str) -> int:
    """Whole seconds of an sbatch --time: MINUTES, MINUTES:SECONDS,
    HOURS:MINUTES:SECONDS, DAYS-HOURS[:MINUTES[:SECONDS]]; UNLIMITED or
    INFINITE is 0 (no limit of its own); an rc duration (2h, 1h30m) too.
    Raises ValueError naming the text."""
    t = text.strip()
    if t.upper() in ("UNLIMITED", "INFINITE"):
        return 0
    if re.search(r"[A-Za-z]", t) and not re.search(r"[:-]", t):
        try:
            return whole_seconds(t, "time")
        except DurationError as e:
            raise ValueError(str(e)) from None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", t)
    if m is None:
        raise ValueError(f"{text!r} is not a time (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or 2h)")
    days, a, b, c = (int(x) if x else None for x in m.groups())
    if days is not None:  # D-H[:M[:S]]
        return ((days * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
    if c is not None:
        return (a * 60 + b) * 60 + c
    if b is not None:
        return a * 60 + b
    return a * 60


def _count(name: str, value: str) -> str:
    """-n/--gpus N, or --gres gpu[:TYPE]:N: the device count."""
    if name == "gres":
        parts = value.split(":")
        if parts[0] != "gpu" or len(parts) > 3 or not parts[-1].isdigit():
            raise ValueError(f"--gres={value}: rc maps gpu:N only (a model: #RC -s model=TYPE)")
        return parts[-1]
    if name == "gpus" and not value.isdigit():
        raise ValueError(f"--gpus={value}: rc maps a count only (a model: #RC -s model=TYPE)")
    return value


_SLURM_UNITS = {"": "s", "second": "s", "minute": "m", "hour": "h", "day": "d", "week": "w"}


def _slurm_begin(value: str) -> str:
    """sbatch --begin as rc's: now+N[second|minute|hour|day|week][s] is
    +N with rc's unit; the other forms (HH:MM, YYYY-MM-DD[THH:MM]) are the same."""
    m = re.fullmatch(r"now\+(\d+)(second|minute|hour|day|week)?s?", value.strip().lower())
    return f"+{m[1]}{_SLURM_UNITS[m[2] or '']}" if m else value


def _after(value: str) -> list[str]:
    """--dependency=afterok:1:2,afterany:3 as --after flags."""
    if "?" in value:
        raise ValueError(f"--dependency={value}: rc waits for all (','), not any ('?')")
    out: list[str] = []
    for part in value.split(","):
        kind, _, ids = part.partition(":")
        if kind not in _DEPENDENCY or not ids:
            raise ValueError(
                f"--dependency={value}: rc maps afterok, afternotok and afterany:ID[:ID...]"
            )
        for job_id in ids.split(":"):
            out += ["--after", f"{job_id}:{_DEPENDENCY[kind]}"]
    return out


def _mapped(name: str, value: str) -> list[str]:
    """The rc run flags of one #SBATCH option. Raises ValueError."""
    flag = SBATCH_FLAGS[name]
    if name in ("ntasks", "gpus", "gres"):
        return [flag, _count(name, value)]
    if name == "time":
        return [flag, str(slurm_seconds(value))]
    if name == "dependency":
        return _after(value)
    if name == "immediate":
        return [flag]
    if name == "begin":
        return [flag, _slurm_begin(value)]
    return [flag, value]


def _options(words: tuple[str, ...]) -> list[tuple[str, str, str | None]]:
    """(name, as written, value) of each option in #SBATCH words (long
    --name=V or --name V, short -xV or -x V). Raises ValueError for a word
    that is no option."""
    out: list[tuple[str, str, str | None]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            written = f"--{name}"
        elif word.startswith("-") and len(word) > 1:
            name, written = SHORT.get(word[1], word[1]), word[:2]
            eq, value = ("=", word[2:].removeprefix("=")) if len(word) > 2 else ("", "")
        else:
            raise ValueError(f"{word!r} is not an option (#SBATCH lines hold options only)")
        known = name in SBATCH_FLAGS.keys() | SBATCH_NOT_YET
        if not eq and name not in _NO_VALUE:
            if known and i >= len(words):
                raise ValueError(f"{written} needs a value")
            if known or (i < len(words) and not words[i].startswith("-")):
                value, i = words[i], i + 1  # an unknown option's value, as it seems
        out.append((name, written, value if (eq or name not in _NO_VALUE) else None))
    return out


def sbatch_flags(d: Directive, lenient: bool = False, where: str = "") -> list[str]:
    """The rc run flags of an #SBATCH directive. An option rc does not have
    yet (SBATCH_NOT_YET) or at all raises UsageError naming it and its line
    (`where`:LINE); under `lenient` it is skipped with a warning on stderr."""
    at = f"{where}:{d.line}"
    try:
        options = _options(d.words)
    except ValueError as e:
        raise UsageError(f"{at}: #SBATCH {e}") from None
    flags: list[str] = []
    for name, written, value in options:
        if name in SBATCH_FLAGS:
            try:
                flags += _mapped(name, value or "")
            except ValueError as e:
                raise UsageError(f"{at}: #SBATCH {e}") from None
            continue
        if name in SBATCH_NOT_YET:
            why = f"#SBATCH {written}: rc does not support it yet"
        else:
            why = f'#SBATCH {written} is not an option rc has (README "Batch scripts" lists those that map)'
        if not lenient:
            raise UsageError(f"{at}: {why} (--lenient skips it with a warning)")
        stderr(f"{at}: skipped {why}")
    return flags


def script_command(script: Script, args: list[str]) -> list[str]:
    """The job's command for `script` run with `args`: a shell's `-c TEXT
    PATH ARGS...`; another interpreter's run on a private temporary copy
    (mktemp under $TMPDIR or /tmp, removed when the script ends)."""
    interp = list(script.interpreter)
    via_env = os.path.basename(interp[0]) == "env"
    program = [w for w in interp[1:] if w != "-S"] if via_env else interp
    if program and os.path.basename(program[0]) in SHELLS:
        head = [interp[0], *program] if via_env else interp
        return [*head, "-c", script.text, os.path.abspath(script.path), *args]
    run = " ".join(shlex.quote(w) for w in interp)
    wrapper = (
        'f=$(mktemp "${TMPDIR:-/tmp}/rc-batch.XXXXXX") || exit 126; '
        "trap 'rm -f \"$f\"' EXIT; "
        'printf "%s" "$1" > "$f" || exit 126; shift; '
        f'{run} "$f" "$@"'
    )
    return ["/bin/sh", "-c", wrapper, os.path.abspath(script.path), script.text, *args]


def read_script(path: str) -> Script:
    """Read and parse the script at `path`. Raises UsageError when it
    cannot be read or is not UTF-8 text."""
    try:
        with open(path, "rb") as f:
            data = f.read(SCRIPT_MAX_BYTES + 1)
    except OSError as e:
        raise UsageError(f"{path}: cannot read it: {e.strerror or e}") from None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None
    return parse_script(path, text)


APPENDED = ("env", "env_files", "after")
"""rc run flags that add up: directives' first, then the command line's."""
_NOT_FLAGS = {
    "verb",
    "handler",
    "usage_prog",
    "script_args",
    "command",
    "script",
    "argv_",
    "lenient",
}


def _given(argv: list[str]) -> dict:
    """The rc run/batch flags `argv` (the command line) gives itself, by
    dest: its parser again, every default suppressed."""
    from rc.cli import build_parser

    parser = build_parser(argv[0])
    verb = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in verb.choices[argv[0]]._actions:
        action.default = argparse.SUPPRESS
    return {k: v for k, v in vars(parser.parse_args(argv)).items() if k not in _NOT_FLAGS}


def _directive_args(script: Script, lenient: bool) -> argparse.Namespace:
    """The rc run flags of every directive, parsed by rc run's parser (a
    bad one is a UsageError naming its line)."""
    from rc.cli import build_parser

    parser = build_parser("run")
    run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = run.choices["run"]
    flags: list[str] = []
    for d in script.directives:
        mine = sbatch_flags(d, lenient, script.path) if d.kind == "SBATCH" else list(d.words)

        def refuse(message: str, d=d) -> None:
            raise UsageError(f"{script.path}:{d.line}: #{d.kind} {message}")

        sub.error = refuse
        if d.kind == "RC" and any(w == "--" or w == "--script" for w in mine):
            refuse("holds rc run flags only")
        probe = sub.parse_args([*mine, "--", "true"])
        if probe.command not in (["--", "true"], ["true"]):
            refuse("holds rc run flags only")
        flags += mine
    sub.error = lambda message: (_ for _ in ()).throw(UsageError(f"{script.path}: {message}"))
    return sub.parse_args([*flags, "--", "true"])


def with_script(args: argparse.Namespace, path: str, script_args: list[str]) -> list[str]:
    """Fold script `path`'s directives into `args` (the command line's own
    flags win; APPENDED ones add up), name the job after the script when
    nothing names it (and the file name is a job name), and return the
    job's command. Raises UsageError naming what is wrong."""
    script = read_script(path)
    merged = vars(_directive_args(script, getattr(args, "lenient", False)))
    given = _given(args.argv_) if getattr(args, "argv_", None) else {}
    if {"device", "selector"} & given.keys():
        merged["device"] = merged["selector"] = None
    for dest, value in given.items():
        if dest in APPENDED:
            merged[dest] = [*merged.get(dest, []), *value]
        else:
            merged[dest] = value
    for dest, value in merged.items():
        if dest not in _NOT_FLAGS:
            setattr(args, dest, value)
    base = os.path.basename(path)
    if not args.name and valid_job_name(base) and len(base) <= 64:
        args.name = base
    return script_command(script, list(script_args))


def add_parsers(sub) -> None:
    from rc.cli.context import add_client_flags
    from rc.cli.runflags import add_run_flags

    p = sub.add_parser(
        "batch",
        help="submit a batch script (#SBATCH and #RC directives inside it)",
        description="Submit SCRIPT with ARGS as a job and print its id: its #RC lines "
        "(rc run's flags) and #SBATCH lines (the subset that maps: -J, -n, -G, --gres=gpu:N, "
        "-t, -a/--array, --export, -D, -d/--dependency, -I) say how; flags here win. The "
        'script is stored with the job as it is now (README "Batch scripts").',
    )
    add_run_flags(p)
    add_lenient_flag(p)
    p.add_argument("script", metavar="SCRIPT", help="the script (its first line #!INTERPRETER)")
    p.add_argument(
        "script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments"
    )
    add_client_flags(p)
    p.set_defaults(handler="run:cmd_batch")


def add_lenient_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lenient",
        action="store_true",
        help="skip an #SBATCH option rc has no counterpart for, with a warning "
        "(default: refuse the script, naming it)",
    )
