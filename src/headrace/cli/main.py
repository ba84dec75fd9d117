"""Entry point of the `headrace` command.

``COMMANDS`` maps each top-level command to the module and attribute that defines it; a module
is imported only when its command runs (or ``--help`` lists them all), so a command does not pay
for importing every part. Adding a part = one module + one line here.

Every command runs inside one error handler (:class:`HeadraceGroup`): a known error is one line
on stderr with a hint and exit code 2 (something named does not exist) or 1 (anything else); the
traceback is printed only with ``--debug``.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import traceback

import click

from headrace import __version__
from headrace.errors import (
    FormatError,
    HeadraceError,
    InvalidInput,
    InvalidKey,
    MissingDependency,
    RetryExhausted,
    StoreError,
)

COMMANDS: dict[str, tuple[str, str]] = {
    "status": ("headrace.cli.status_cmd", "status"),
    "store": ("headrace.cli.store_cmd", "store_group"),
    "queue": ("headrace.cli.queue_cmd", "queue_group"),
    "reservoir": ("headrace.cli.reservoir_cmd", "reservoir_group"),
    "shard": ("headrace.cli.shard_cmd", "shard_group"),
    "spine": ("headrace.cli.spine_cmd", "spine_group"),
    "backup": ("headrace.cli.backup_cmd", "backup_group"),
    "restore": ("headrace.cli.backup_cmd", "restore"),
    "demo": ("headrace.cli.demo_cmd", "demo"),
    "nexmark": ("headrace.cli.nexmark_cmd", "nexmark"),
}

EXIT_ERROR = 1
EXIT_NOT_FOUND = 2  # also click's exit code for usage errors


def _one_line(text: str) -> str:
    return " ".join(text.split())


def classify(e: BaseException) -> tuple[int, str, str]:
    """(exit code, message, hint) for an error that escaped a command."""
    msg = _one_line(str(e)) or type(e).__name__
    if isinstance(e, (FileNotFoundError, NotADirectoryError)):
        hint = getattr(e, "hint", None) or (
            "`headrace status URL` lists what a store holds" if isinstance(e, HeadraceError)
            else "check the path")
        return EXIT_NOT_FOUND, msg, hint
    if isinstance(e, FormatError):  # ChecksumMismatch too
        return EXIT_ERROR, msg, ("the stored bytes are damaged or are not what this command "
                                 "reads; the part's `verify` command checks all of it")
    if isinstance(e, (InvalidKey, InvalidInput)):
        return EXIT_ERROR, msg, "check the arguments (`--help` lists them)"
    if isinstance(e, MissingDependency):
        return EXIT_ERROR, msg, "install the missing package"
    if isinstance(e, RetryExhausted) or (isinstance(e, StoreError) and e.retryable):
        return EXIT_ERROR, msg, ("the store kept failing or did not answer; check the endpoint "
                                 "and network, then retry (`headrace store check URL`)")
    if isinstance(e, StoreError):
        return EXIT_ERROR, msg, ("check the store URL, credentials and permissions "
                                 "(`headrace store check URL`)")
    if isinstance(e, HeadraceError):
        return EXIT_ERROR, f"{type(e).__name__}: {msg}", "rerun with --debug for the traceback"
    if isinstance(e, PermissionError):
        return EXIT_ERROR, msg, "check the owner and mode of the files named"
    if isinstance(e, (TimeoutError, ConnectionError)):
        return EXIT_ERROR, msg, "check the endpoint and network, then retry"
    if isinstance(e, OSError):
        return EXIT_ERROR, msg, "an operating-system error: check the path and free space"
    if isinstance(e, ValueError):
        return EXIT_ERROR, msg, "check the arguments (`--help` lists them)"
    return (EXIT_ERROR, f"internal error: {type(e).__name__}: {msg}",
            "this is a bug; rerun with --debug and report the traceback")


class HeadraceGroup(click.Group):
    """Loads command modules on demand and turns errors into one line (see the module doc)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:  # the reader of our stdout went away (`| head`): not an error
            _silence_stdout()
            raise click.exceptions.Exit(EXIT_ERROR) from None
        except KeyboardInterrupt:
            click.echo("Error: interrupted", err=True)
            raise click.exceptions.Exit(130) from None
        except Exception as e:  # noqa: BLE001 - every error leaves as one line (or --debug)
            code, msg, hint = classify(e)
            if ctx.params.get("debug"):
                traceback.print_exc()
            click.echo(f"Error: {msg} (hint: {hint})", err=True)
            raise click.exceptions.Exit(code) from None


@click.group(cls=HeadraceGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="headrace")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("--debug", is_flag=True, help="Print the traceback of an error.")
def cli(verbose: int, debug: bool) -> None:
    """headrace: object-storage-native ingestion, state and exactly-once output for PySpark.

    Start with `headrace status URL`: what a store holds."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the final flush cannot raise BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def main() -> None:
    """Run the command, then end the process without interpreter finalization.

    pyarrow's C++ thread pool can still be tearing down when Python finalizes, which aborts
    the process (``terminate called without an active exception``, exit 134) after the command
    already succeeded. Every command is done when click returns, so output is flushed and
    logging shut down here and the process exits with os._exit."""
    try:
        cli.main(prog_name="headrace")
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            click.echo(str(e.code), err=True)
            code = EXIT_ERROR
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):
            _silence_stdout()
    os._exit(code)


if __name__ == "__main__":
    main()
