"""The `gateway` command: serve, db, policy, explain, model, bench, promote, precision, report.

One module per command group; each adds its commands to the parser here.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from gateway.cli import bench, db, explain, model, policy, precision, promote, report, serve
from gateway.errors import GatewayError, InvalidRequest, PolicyError
from gateway.settings import Settings

GROUPS = (serve, db, policy, explain, model, bench, promote, precision, report)


def parser() -> argparse.ArgumentParser:
    """Build the command-line parser."""
    root = argparse.ArgumentParser(
        prog="gateway",
        description="The shadow-traffic routing gateway for LLM inference on mixed hardware.",
    )
    commands = root.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add(commands)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    """Run the gateway command; return its exit status."""
    args = parser().parse_args(argv)
    settings = Settings()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.run(args, settings))
    # Every command's errors end here: 2 when what was asked is invalid, 1 when it failed.
    except PolicyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except GatewayError as exc:  # the policy store, a version that does not exist, a refusal
        print(f"error: {exc.message}", file=sys.stderr)
        return 2 if isinstance(exc, InvalidRequest) else 1


if __name__ == "__main__":
    sys.exit(main())
