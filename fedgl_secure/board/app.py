"""The board's web application: two read-only pages over a :class:`~fedgl_secure.board.view.BoardSources`.

``GET /`` is the board (``templates/board.html``; it refreshes itself while the run is live), ``GET /audit`` the
audit's full report drawn from its JSON with the audit's own template. Nothing else is served: no write, no API
documentation, no script — every other method or path is a 405 or 404.

The handlers are coroutines, so one request is drawn at a time: matplotlib's SVG settings are process-wide
(:func:`fedgl_secure.audit.plots.figure_svg`), and a local board has one reader.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from fedgl_secure.audit.templating import html_environment
from fedgl_secure.board.view import BoardSources, BoardView, build_view, live_status, read_snapshot
from fedgl_secure.wire.run_record import RUN_FILE


def _stamp(path: Path | None) -> tuple[str, int, int] | None:
    try:
        stat = path.stat() if path is not None else None
    except OSError:
        return None
    return None if stat is None else (str(path), stat.st_mtime_ns, stat.st_size)


class Board:
    """Draws the pages of its sources on demand, and keeps them until a file it reads or the live status changes."""

    def __init__(self, sources: BoardSources, refresh_seconds: int) -> None:
        self.sources = sources
        self.refresh_seconds = refresh_seconds
        self.environment = html_environment("fedgl_secure.board")
        self._key: tuple | None = None
        self._pages: dict[str, tuple[str, int]] = {}

    def _files_stamp(self) -> tuple:
        logs = sorted(self.sources.logs.glob("*.log")) if self.sources.logs and self.sources.logs.is_dir() else []
        return tuple(_stamp(p) for p in (self.sources.run_dir / RUN_FILE, self.sources.audit_path, *logs))

    def page(self, name: str) -> tuple[str, int]:
        """Page ``name`` (``board`` or ``audit``) as HTML with its status code."""
        status, problem = live_status(self.sources)
        key = (self._files_stamp(), json.dumps(status, sort_keys=True, default=str), problem)
        if key != self._key:
            self._key, self._pages = key, {}
        if name not in self._pages:
            view = build_view(self.sources, read_snapshot(self.sources, status, problem))
            self._pages[name] = self._draw(name, view)
        return self._pages[name]

    def _draw(self, name: str, view: BoardView) -> tuple[str, int]:
        if name == "board":
            template = self.environment.get_template("board.html")
            return template.render(view=view, refresh_seconds=self.refresh_seconds), 200
        if view.audit is None:
            reason = view.audit_problem or f"no audit report at {self.sources.audit_path}"
            return self.environment.get_template("no_audit.html").render(reason=reason, run_dir=view.run_dir), 404
        return self.environment.get_template("audit.html").render(report=view.audit), 200


def create_app(sources: BoardSources, refresh_seconds: int = 5) -> FastAPI:
    """The board's application over ``sources``; a live page asks the browser to reload every ``refresh_seconds``."""
    board = Board(sources, refresh_seconds)
    app = FastAPI(title="fedgl-secure board", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        text, code = board.page("board")
        return HTMLResponse(text, status_code=code)

    @app.get("/audit", response_class=HTMLResponse)
    async def audit() -> HTMLResponse:
        text, code = board.page("audit")
        return HTMLResponse(text, status_code=code)

    return app
