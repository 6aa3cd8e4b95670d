"""`forge-pack ui RUN_DIR`: the search dashboard over a run directory (live or finished)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("ui")
    def ui(
        run_dir: Path = typer.Argument(..., help="Run directory written by `forge-pack search` or `build`."),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; keep the loopback default and use "
                                 "ssh -L to reach a remote box."),
        port: Optional[int] = typer.Option(None, "--port", help="Port; default 8765 or the next free one. "
                                           "An explicit busy port is an error; 0 picks any free port."),
        open_browser: bool = typer.Option(False, "--open", help="Open the page in the default browser."),
        allow_control: bool = typer.Option(False, "--allow-control",
                                           help="Enable pause/resume/stop buttons (writes RUN_DIR/control.json)."),
    ) -> None:
        """Watch a search live and inspect every candidate in a local web page (read-only)."""
        from forge_pack.ui.server import serve

        serve(run_dir, host=host, port=port, allow_control=allow_control, open_browser=open_browser,
              echo=lambda line: typer.echo(line))
