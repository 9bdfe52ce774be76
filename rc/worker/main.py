"""`rc worker`: load the configuration and run the agent."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from rc.proto.client import Client, parse_controller_url
from rc.proto.errors import RcError
from rc.worker import config as worker_config
from rc.worker.agent import Agent

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Run a worker for the parsed `rc worker` arguments; returns the exit code.

    A configuration problem or an unparseable controller URL exits 2 with one
    line on stderr; an unreachable controller is retried forever.
    """
    try:
        cfg = worker_config.load(
            args.config,
            {
                "controller_url": args.controller,
                "token_file": args.token_file,
                "devices": args.devices,
                "host": args.host,
                "cacert": args.cacert,
            },
        )
        if args.print_config:
            sys.stdout.write(cfg.as_toml())
            return 0
        if not cfg.controller_url:
            raise worker_config.ConfigError("no controller: give --controller URL or "
                                            "controller_url in the config")
        url = parse_controller_url(cfg.controller_url)
        if not cfg.token:
            raise worker_config.ConfigError("no token: give --token-file, token_file in the "
                                            "config, or RC_TOKEN")
    except RcError as e:
        print(f"rc worker: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    client = Client(url, cfg.token, cacert=cfg.cacert or None)
    agent = Agent(cfg, client)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: agent.stop())
    return agent.run()
