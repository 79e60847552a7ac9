"""The privacy audit of a finished run (DESIGN §6): checks a run directory against its policy.

Modules: ``report_model`` (the report), ``run_files`` (reading the run), ``conformance`` (sections 1-2), ``ledger``
(3-6), ``attack_section`` (7), ``run`` (:func:`~fedgl_secure.audit.run.audit_run`), ``report`` (rendering),
``reference`` (the non-DP reference model), ``command`` (the CLI).

:func:`audit_run` reads a run directory and returns an :class:`AuditReport`: sections of checks,
each ``green`` (conforms), ``amber`` (conforms, but a risk officer should know: no DP, a budget
almost spent, an attack not run), ``red`` (a violation or evidence that does not verify) or ``info``
(context that is no verdict, such as the attack's power on a model trained without DP). Rendering
(Markdown, HTML, JSON, plots) is :mod:`fedgl_secure.audit.report`; the command is
:mod:`fedgl_secure.audit.command`.

Sections, in report order:

1. ``policy`` — protection, HE security level, quorum, the policy's effective guarantees, and
   whether the key authority's keys were made for the policy's HE parameters.
2. ``privacy`` — ε spent per bank and channel (:class:`~fedgl_secure.privacy.accounting.PrivacyLedger`),
   against the budget: red above it, amber within :data:`BUDGET_WARNING_FRACTION` of it. And the
   run's stop (``stopped_reason``, ``stopped_banks``): banks that stopped for their budget are the
   policy failing closed (green), each cross-checked against its ledger.
3. ``decryptions`` — the key authority's decryption ledger: each (round, kind) at most once, at
   least the quorum of distinct registered senders, only allowed kinds, every decryption backed by
   an ``allowed`` audit record and by a signed receipt of each sender; the key authority's central DP
   noise (``central_noise_std`` in its allowed records) exactly where, and as large as, the policy asks.
4. ``audit-log`` — the hash chain of ``audit.jsonl`` up to the recorded head; a broken link is
   named by its line number and what is wrong with it.
5. ``receipts`` — every upload receipt verifies under its bank's key, and ``banks.json`` holds the
   keys the key authority registered.
6. ``leakage`` — the leakage ledger (what crosses which boundary), from docs/threat-model.md §3.
7. ``attacks`` — membership inference on the final global model and link inference from the
   pseudo graph (:mod:`fedgl_secure.audit.attacks`); amber "not run" when the data is missing.
   For a DP run, the membership AUC of a non-DP reference of the same experiment is reported
   beside it (:mod:`fedgl_secure.audit.reference`), as ``info``.

Run directory layout (written by the simulation and the consortium)::

    run.json  policy.toml  model.npz  privacy/<bank>.ledger.json
    key-authority/{ledger.sqlite3, audit.jsonl, audit_head}  receipts.jsonl  banks.json   # HE runs

The directory is only read: the SQLite ledger is copied to a temporary directory before it is opened.
"""
