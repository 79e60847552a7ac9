"""``fedgl-secure board``: a local, read-only web page over a finished or live run (issue 30).

Modules: ``sources`` (what the board reads: the run directory, the nodes' logs, a live aggregator's status, the
audit's JSON report), ``view`` (what it shows, reduced to figures: no pseudonym, customer id, key or nonce), ``app``
(the FastAPI application: ``GET /`` and ``GET /audit``), ``command`` (the CLI), ``templates/`` (the page, extending
the audit's layout and macros: the audit's HTML report and the board draw with the same templates and plots).

The board sits between the CLI and the audit in the package's layers: it draws the audit's sections (ε spent per
bank and channel) and reads a live aggregator's status through the services' TLS client.
"""
