"""A node's process: an mTLS HTTP service plus the background loop that does the node's work.

The aggregator drives rounds and a bank takes part in them on a worker thread, while uvicorn
serves the node's API on the main thread; both must start and stop together, and a signal must
end the loop before the process exits.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from fastapi import FastAPI

from fedgl_secure.consortium.config import NodeEntry, PkiLayout
from fedgl_secure.services.tls import make_server, serve_until_signalled

JOIN_SECONDS = 30.0


def serve_with_worker(
    make_app: Callable[[Callable], FastAPI],
    work: Callable[[threading.Event], None],
    entry: NodeEntry,
    layout: PkiLayout,
    log,
    stop_serving_when_done: bool = False,
) -> None:
    """Serve ``make_app(lifespan)`` for node ``entry`` while ``work(stop)`` runs on a thread.

    SIGINT/SIGTERM set ``stop`` and wait for the loop; with ``stop_serving_when_done`` the
    service also ends when the loop returns (a bank, once the federation has finished).
    """
    stop = threading.Event()
    server = None

    def run() -> None:
        try:
            work(stop)
        except Exception:  # say why the node stopped working; the API stays up to report it
            log.exception("worker.crashed")
        finally:
            if stop_serving_when_done and server is not None:
                server.should_exit = True

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        thread = threading.Thread(target=run, name=f"{entry.name}-worker", daemon=True)
        thread.start()
        log.info("node.started", url=entry.url)
        yield
        stop.set()
        thread.join(timeout=JOIN_SECONDS)
        log.info("node.stopped")

    server = make_server(make_app(lifespan), entry.host, entry.port, layout, entry.name)
    try:
        serve_until_signalled(server)
    finally:
        stop.set()
