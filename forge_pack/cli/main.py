"""The forge-pack command line. Each command lives in its own module and registers itself here.

Errors a user must fix arrive as ForgeError and leave as two lines on stderr (``error:`` and
``hint:``) with exit status 1; tracebacks only under ``--debug``.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer

from forge_pack.core.errors import ForgeError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Profile a PyTorch model, search faster kernels for its hot ops, ship them as a package.")

# One module per command (or group of commands); each defines register(app).
COMMAND_MODULES = (
    "forge_pack.cli.profile",
    "forge_pack.cli.ui",
    "forge_pack.cli.search",
    "forge_pack.cli.doctor",
    "forge_pack.cli.build",
    "forge_pack.cli.check",
)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors.")) -> None:
    if debug:
        os.environ["FORGE_DEBUG"] = "1"


def debug_enabled() -> bool:
    return os.environ.get("FORGE_DEBUG") == "1" or "--debug" in sys.argv


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    try:
        app()
    except ForgeError as err:
        if debug_enabled():
            raise
        typer.echo(f"error: {err.message}", err=True)
        if err.hint:
            typer.echo(f"hint: {err.hint}", err=True)
        sys.exit(1)
    except KeyboardInterrupt as e:
        _interrupted(e)
    except SystemExit as e:
        # typer turns Ctrl-C inside a command into a silent exit 130 (Exit raised from the
        # KeyboardInterrupt); a command that already said why raised its Exit from None
        cause = getattr(e.__context__, "__cause__", None)
        if e.code == 130 and isinstance(cause, KeyboardInterrupt):
            _interrupted(cause)
        raise
    except OSError as err:  # a path that cannot be written or read: the user's to fix, not a crash
        if debug_enabled():
            raise
        where = f": {err.filename}" if getattr(err, "filename", None) else ""
        typer.echo(f"error: {err.strerror or err}{where}", err=True)
        typer.echo("hint: check that the path exists, is a directory where one is expected, and is writable "
                   "(disk space too)", err=True)
        sys.exit(1)


def _interrupted(e: BaseException) -> None:
    typer.echo("error: interrupted", err=True)
    # a search names its run directory to --resume (cmd_search.SearchInterrupted); other commands
    # have nothing to continue: run them again
    typer.echo(f"hint: {getattr(e, 'hint', None) or 'run the command again'}", err=True)
    sys.exit(130)
