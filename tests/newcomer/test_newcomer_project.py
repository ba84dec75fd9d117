"""The project's paperwork a newcomer reads first: the license, and an architecture doc that
names the commands the CLI really has."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import click

from headrace.cli.main import cli

REPO = Path(__file__).resolve().parents[2]


def test_license_is_apache_2_with_an_spdx_string():
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    assert "END OF TERMS AND CONDITIONS" in text
    assert "limitations under the License." in text
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"  # a string, not the deprecated table


def test_architecture_doc_lists_exactly_the_cli_commands():
    row = next(line for line in (REPO / "docs" / "ARCHITECTURE.md").read_text().splitlines()
               if line.startswith("| `headrace.cli`"))
    named = set(re.findall(r"`([a-z]+)`", row))
    ctx = click.Context(cli)
    commands = set(cli.list_commands(ctx))
    assert commands <= named, commands - named
    for name in commands:
        cmd = cli.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            subs = set(cmd.list_commands(ctx))
            listed = re.search(rf"`{name}` \(([^)]*)\)", row)
            assert listed, name
            assert set(listed.group(1).replace(",", " ").split()) == subs, name
    assert "bench" not in named  # there is no bench command (benchmarks: make bench)
