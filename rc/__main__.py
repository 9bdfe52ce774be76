"""Entry point shared by the `rc` script, `python -m rc` and dist/rc.pyz."""

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the rc command line; returns the process exit code."""
    from rc.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
