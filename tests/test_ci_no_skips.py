"""Under ``CI=true`` every way a test can skip fails instead, naming the reason (``tests/ci_no_skips.py``); outside
CI a skip stays a skip. Each case runs in an inner pytest session with only that plugin loaded."""

from __future__ import annotations

import pytest

SKIPPING = {
    "test_fixture_skips.py": """
import pytest

@pytest.fixture
def database():
    pytest.skip("no PostgreSQL binaries")

def test_reads(database):
    pass
""",
    "test_call_skips.py": """
import pytest

def test_memfd():
    pytest.skip("no memfd_create on this platform")
""",
    "test_mark_skips.py": """
import pytest

@pytest.mark.skipif(True, reason="raw datasets not found")
def test_loads():
    pass
""",
    "test_session_fixture_skips.py": """
import pytest

@pytest.fixture(scope="session")
def data_root():
    pytest.skip("raw datasets not found at /nowhere (set FEDGL_DATA)")

def test_one(data_root):
    pass

def test_two(data_root):
    pass
""",
}
REASONS = ("no PostgreSQL binaries", "no memfd_create", "raw datasets not found", "set FEDGL_DATA")


def _run(pytester, ci: str | None, *files: str):
    pytester.makepyfile(**{name.removesuffix(".py"): SKIPPING[name] for name in files})
    if ci is None:
        pytester._monkeypatch.delenv("CI", raising=False)
    else:
        pytester._monkeypatch.setenv("CI", ci)
    return pytester.runpytest("-p", "ci_no_skips", "-p", "no:cacheprovider", "-rA")


def _named(result, reason: str) -> bool:
    """Whether a line of the run's output reports a skip turned into a failure and names ``reason``."""
    return any("skipped in CI (CI=true)" in line and reason in line for line in result.stdout.lines)


def test_every_skip_in_a_test_fails_in_ci_naming_its_reason(pytester):
    result = _run(pytester, "true", *SKIPPING)
    # a failure at set-up (a fixture's skip, a skipif mark) counts as an error, one in the test's body as a failure
    result.assert_outcomes(failed=1, errors=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    for reason in REASONS:
        assert _named(result, reason)


@pytest.mark.parametrize("ci", [None, "", "0", "false", "no"])
def test_outside_ci_a_skip_stays_a_skip(pytester, ci):
    _run(pytester, ci, *SKIPPING).assert_outcomes(skipped=5)


def test_a_module_skipped_at_collection_fails_in_ci(pytester):
    pytester.makepyfile(
        test_needs_a_part="""
import pytest

pytest.importorskip("a_module_that_is_not_installed_anywhere")

def test_uses_it():
    pass
""",
        test_needs_a_platform="""
import pytest

pytest.skip("no GPU on this machine", allow_module_level=True)
""",
    )
    pytester._monkeypatch.setenv("CI", "true")
    result = pytester.runpytest("-p", "ci_no_skips", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    assert result.ret == pytest.ExitCode.INTERRUPTED  # errors during collection: nothing runs
    assert _named(result, "a_module_that_is_not_installed_anywhere") and _named(result, "no GPU on this machine")
    pytester._monkeypatch.delenv("CI")
    pytester.runpytest("-p", "ci_no_skips", "-p", "no:cacheprovider").assert_outcomes(skipped=2)


def test_an_expected_failure_is_not_a_skip(pytester):
    pytester.makepyfile(
        test_known_bug="""
import pytest

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_bug():
    assert False
""",
    )
    pytester._monkeypatch.setenv("CI", "true")
    pytester.runpytest("-p", "ci_no_skips", "-p", "no:cacheprovider").assert_outcomes(xfailed=1)
