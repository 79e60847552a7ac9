"""The in-process drivers: a federation of simulated institutions run round by round in one process
(``experiment.py``), and the papers' experiments built on it (``reproduce.py``, ``graphfl_experiments.py``,
``graphfl_overlap.py``, ``fed2gnn_reproduce.py``).

They sit above ``methods/`` — they build a method from its name and drive its stages — and below ``wire/``,
``consortium/`` and ``services/``, the consortium's drivers of the same methods.
"""
