"""Service logs are JSON lines that a reader can parse line by line, even when a service's threads log at once."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

THREADED_LOGGING = textwrap.dedent(
    """
    import threading
    from fedgl_secure.log import configure_logging, get_logger

    configure_logging("info", json=True)

    def work(worker):
        log = get_logger(worker=worker)
        for tick in range(1500):
            log.info("tick", tick=tick, padding="x" * 50)

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    """
)


def test_records_from_concurrent_threads_stay_one_per_line(tmp_path):
    # stderr into a file, as orchestrate.start_node_process runs every node
    log_path = tmp_path / "node.log"
    with log_path.open("wb") as log_file:
        subprocess.run([sys.executable, "-c", THREADED_LOGGING], stderr=log_file, check=True, timeout=120)
    lines = log_path.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # an interleaved "{a}{b}" line or an empty one fails here
    assert len(records) == 6 * 1500
    assert {(record["worker"], record["tick"]) for record in records} == {(w, t) for w in range(6) for t in range(1500)}
    assert all(record["event"] == "tick" and record["level"] == "info" for record in records)
