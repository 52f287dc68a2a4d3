"""The command group every ``sordino`` group uses: its ``--help`` never cuts a summary."""

from __future__ import annotations

import click

__all__ = ["Group"]

# Longer than any command's first sentence: click's default (the width left on the line)
# cut them mid-phrase with "..." (issue 27).
_SUMMARY_LIMIT = 200


class Group(click.Group):
    """A group whose ``--help`` shows each command's whole summary, wrapped, never cut."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=_SUMMARY_LIMIT)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
