"""The ``specserve`` command group.

Subcommands live one per module in :mod:`specserve.cli` and are discovered by name: a module
``specserve/cli/NAME.py`` that defines ``command`` is registered. Modules starting with ``_`` are
helpers. A :class:`SpecserveError` anywhere becomes one line on stderr and its exit code.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

import click

import specserve.cli as cli_pkg
from specserve import __version__
from specserve.errors import SpecserveError


def _command_modules() -> list[str]:
    return sorted(
        m.name for m in pkgutil.iter_modules(cli_pkg.__path__) if not m.name.startswith("_")
        and m.name != "main"
    )


class SpecserveGroup(click.Group):
    """Discovers subcommands lazily and turns SpecserveError into a clean exit."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = []
        for mod in _command_modules():
            cmd = self._load(mod)
            if cmd is not None and cmd.name:
                names.append(cmd.name)
        return sorted(names)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        for mod in (cmd_name.replace("-", "_"), *_command_modules()):
            cmd = self._load(mod)
            if cmd is not None and cmd.name == cmd_name:
                return cmd
        return None

    @staticmethod
    def _load(mod: str) -> click.Command | None:
        try:
            module = importlib.import_module(f"specserve.cli.{mod}")
        except ModuleNotFoundError as e:
            if e.name == f"specserve.cli.{mod}":
                return None
            raise
        cmd = getattr(module, "command", None)
        return cmd if isinstance(cmd, click.Command) else None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SpecserveError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)
        except click.UsageError as e:  # bad option value: one line too, exit 2
            where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            click.echo(f"error: {e.format_message()}{where}", err=True)
            sys.exit(2)


@click.group(cls=SpecserveGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specserve")
def cli() -> None:
    """specserve: speculative decoding from HF checkpoints to Triton, measured.

    \b
    Pipeline:
      specserve demo-model --out checkpoints/demo          # or bring your own HF checkpoint
      specserve build --model M --medusa H --out engines/demo
      specserve repo --engine engines/demo --out triton_repo
      specserve serve --repo triton_repo
      specserve bench --url 127.0.0.1:8001 --baseline-model ensemble_baseline --out reports/x
    """


if __name__ == "__main__":  # pragma: no cover
    cli()
