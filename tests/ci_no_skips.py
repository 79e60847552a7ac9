"""In CI (``CI=true``, as ``.ci/run`` runs on a fresh machine) a test never skips for a missing part — a dataset, a
database server, a platform feature: the skip becomes a failure naming why, so a missing install step shows instead
of passing quietly. Every way a test can skip is covered: ``pytest.skip`` in a fixture or in the test, a ``skipif``
mark (both reported at set-up or call), and a module skipped at collection (``pytest.importorskip``,
``pytest.skip(allow_module_level=True)``). An expected failure (``xfail``) is not a skip and stays as it is.

A plugin of its own (``pytest_plugins`` in ``conftest.py``) so that ``tests/test_ci_no_skips.py`` can load it into
an inner pytest run."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _failure(reason: str) -> str:
    return f"skipped in CI (CI={os.environ['CI']}), where every part must be present: {reason}"


def _reason(longrepr) -> str:
    return longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci() and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = _failure(_reason(report.longrepr))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci():
        report.outcome = "failed"
        report.longrepr = _failure(_reason(report.longrepr))
