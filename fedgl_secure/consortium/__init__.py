"""The consortium's libraries, below the services that carry them over HTTP (DESIGN §2: services are transport).

The aggregator's round state machine, the banks' enrolment and union index, the stores (the aggregator's SQLite
state; a bank's state directory: union index, prepared graph, label release, exchange sums, final model), the
decryption board, a bank's round client, and the consortium's typed configuration. Everything here runs and is
tested in one process; ``services/`` wraps it in HTTP apps, TLS, processes and the command line.
"""
