"""Entry point shared by the `rc` script, `python -m rc` and dist/rc.pyz."""

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the rc command line; returns the process exit code.

    `rc worker ...` goes to the worker (rc.worker.main); everything else to the
    client (rc.cli). The two never import each other (docs/design.md#layering).
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["worker"]:
        from rc.worker.main import main as worker_main

        return worker_main(args[1:])
    from rc.cli import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    sys.exit(main())
