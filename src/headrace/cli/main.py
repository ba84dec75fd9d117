"""Entry point of the `headrace` command.

Each module of this package named in ``COMMAND_MODULES`` exposes ``commands``: a list of click
commands or groups, added to the top-level group. Adding a part = one module + one line here.
"""

from __future__ import annotations

import importlib
import logging

import click

from headrace import __version__

COMMAND_MODULES = [
    "headrace.cli.store_cmd",
    "headrace.cli.reservoir_cmd",
    "headrace.cli.backup_cmd",
    "headrace.cli.demo_cmd",
    "headrace.cli.spine_cmd",
    "headrace.cli.queue_cmd",
    "headrace.cli.shard_cmd",
]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="headrace")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """headrace: object-storage-native ingestion, state and exactly-once output for PySpark."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _register() -> None:
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        for command in module.commands:
            cli.add_command(command)


_register()


def main() -> None:
    cli(prog_name="headrace")


if __name__ == "__main__":
    main()
