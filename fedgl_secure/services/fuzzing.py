"""Property-based fuzzing of the services' OpenAPI documents with schemathesis (the ``dev`` extra).

``run_schemathesis`` runs ``st run --checks all`` against one running service over mutual TLS, as a
consortium node (its certificate decides which routes get past the role check), and reads back what
happened: requests sent, responses by status, and every failed check (a 5xx, an undocumented status, a body
that breaks its documented schema, valid data refused, invalid data accepted...).

JSON Schema cannot describe a chunk-framed ciphertext body (:func:`encodings.encode_chunks`) or a header that
carries a pydantic model as base64url JSON (:func:`encodings.encode_header`): the documents say ``format:
binary`` and ``format: fedgl-receipt`` / ``fedgl-decrypt``. A generator that reads only the document sends
bytes that every route must refuse as malformed (400), which schemathesis' ``positive_data_acceptance``
check rightly counts as "valid data refused". So, as schemathesis provides for custom formats, the
strategies here generate *well-formed* values of those formats with random content (framing right, header
JSON valid for its model, numbers and names anything the model allows): positive cases then reach the
protocol's own checks (role, federation, round, nonce, sender, receipts), negative cases are what
schemathesis derives from the document. ``python -m fedgl_secure.services.fuzzing --sender NODE -- run ...``
is ``st`` with these strategies registered.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedgl_secure.consortium.config import PkiLayout
from fedgl_secure.services import http_conventions
from fedgl_secure.services.aggregator_messages import RECEIPT_HEADER
from fedgl_secure.services.key_authority_service import DECRYPT_HEADER
from fedgl_secure.wire import encodings

if TYPE_CHECKING:  # hypothesis and schemathesis come with the dev extra only
    from hypothesis.strategies import SearchStrategy

_HEX = "0123456789abcdef"
MAX_FUZZ_CHUNKS = 1
"""Chunks in a generated body: one, so any ``length`` a decryption header announces admits it."""


def _names(max_size: int) -> SearchStrategy[str]:
    from hypothesis import strategies as st  # the dev extra only (module doc)

    return st.text(min_size=1, max_size=max_size)


def _hex(min_size: int, max_size: int | None = None) -> SearchStrategy[str]:
    from hypothesis import strategies as st  # the dev extra only (module doc)

    return st.text(alphabet=_HEX, min_size=min_size, max_size=min_size if max_size is None else max_size)


def chunk_bodies() -> SearchStrategy[bytes]:
    """Chunk-framed bodies of random bytes (none of them a real ciphertext)."""
    from hypothesis import strategies as st  # the dev extra only (module doc)

    return st.lists(st.binary(max_size=512), max_size=MAX_FUZZ_CHUNKS).map(encodings.encode_chunks)


def receipts(sender: str) -> SearchStrategy[dict[str, Any]]:
    """Receipt JSON any :class:`Receipt` accepts; the sender is often ``sender`` (the fuzzing node) so the
    aggregator's later checks (round, nonce, signature) are reached, not only the sender check."""
    from hypothesis import strategies as st  # the dev extra only (module doc)

    return st.fixed_dictionaries(
        {
            "federation": _names(128),
            "round": st.integers(min_value=1, max_value=http_conventions.MAX_JSON_INT),
            "nonce": _hex(16, 128),
            "kind": _names(64),
            "sender": st.one_of(st.just(sender), _names(128)),
            "ciphertext_sha256": _hex(64),
            "context_fingerprint": _hex(64),
            "values": st.integers(min_value=0, max_value=2**40),
            "c1_sha256": _hex(64),
            "policy_sha256": _hex(64),
            "participants": st.lists(_names(128), min_size=1, max_size=8, unique=True).map(sorted),
            "signature": _hex(128),
        }
    )


def _as_header(value: dict[str, Any]) -> str:
    """``value`` as :func:`encodings.encode_header` writes a model: base64url of compact JSON, unpadded."""
    raw = json.dumps(value, separators=(",", ":")).encode("utf-8")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def receipt_headers(sender: str) -> SearchStrategy[str]:
    return receipts(sender).map(_as_header)


def decrypt_headers(sender: str) -> SearchStrategy[str]:
    """:class:`DecryptRequest` headers: any values the model accepts, receipts shaped like real ones."""
    from hypothesis import strategies as st  # the dev extra only (module doc)

    return st.fixed_dictionaries(
        {
            "federation": _names(128),
            "round": st.integers(min_value=1, max_value=http_conventions.MAX_JSON_INT),
            "kind": _names(64),
            "context_fingerprint": _hex(64),
            "length": st.integers(min_value=0, max_value=2**31 - 1),
            "receipts": st.lists(receipts(sender), max_size=3),
        }
    ).map(_as_header)


HEADER_POOL_SIZE = 64
"""Headers of each format drawn once per run, the pool the fuzzer samples (see :func:`header_pool`)."""


def header_pool(headers: SearchStrategy[str], size: int = HEADER_POOL_SIZE) -> SearchStrategy[str]:
    """``size`` values of ``headers``, drawn once (seeded, so a run is repeatable), sampled from then on.

    Why not ``headers`` itself: a header's document says ``minLength: 1``, and schemathesis' coverage phase asks the
    format for values of exactly that length and one more. No header of a model is 1 or 2 characters long, so each
    such draw filters ``headers`` until Hypothesis gives up: 5-8 s of CPU per draw (a receipt header, a decryption
    header), most of a fuzzing run. A filter over a fixed pool is settled by one pass over it.
    """
    from hypothesis import strategies as st  # the dev extra only (module doc)
    from schemathesis.generation.hypothesis.examples import generate_many

    return st.sampled_from(generate_many(headers, size))


def register_strategies(sender: str, pool_size: int = HEADER_POOL_SIZE) -> None:
    """Teach schemathesis the custom formats of the services' documents (see the module docstring); each header
    format draws from a pool of ``pool_size`` well-formed values (:func:`header_pool`)."""
    import schemathesis  # the dev extra only (module doc)

    schemathesis.openapi.format(
        http_conventions.header_format(RECEIPT_HEADER), header_pool(receipt_headers(sender), pool_size)
    )
    schemathesis.openapi.format(
        http_conventions.header_format(DECRYPT_HEADER), header_pool(decrypt_headers(sender), pool_size)
    )
    schemathesis.openapi.media_type(http_conventions.OCTET_STREAM, chunk_bodies())


# --- running schemathesis and reading its report -------------------------------------------------


@dataclass
class FuzzRun:
    """What one ``st run`` against one service did."""

    service: str
    as_node: str
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    operations: Counter[str] = field(default_factory=Counter)  # requests per operation, e.g. "GET /v1/round"
    failures: list[dict[str, Any]] = field(default_factory=list)  # one per failed check, deduplicated
    errors: list[str] = field(default_factory=list)  # schemathesis could not run a case (network error...)
    exit_code: int | None = None
    output_tail: str = ""

    @property
    def server_errors(self) -> int:
        return sum(count for status, count in self.statuses.items() if status >= 500)

    def to_dict(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "as_node": self.as_node,
            "requests": self.requests,
            "statuses": {str(status): count for status, count in sorted(self.statuses.items())},
            "server_errors": self.server_errors,
            "conformance_failures": self.failures,
            "errors": self.errors,
            "exit_code": self.exit_code,
        }


def run_schemathesis(
    service: str,
    url: str,
    layout: PkiLayout,
    as_node: str,
    *,
    seed: int,
    max_examples: int,
    report: Path,
    include_path_regex: str | None = None,
) -> FuzzRun:
    """Fuzz one running service from this process: ``st run --checks all`` against ``url``'s document with
    ``as_node``'s certificate (only the operations whose path matches ``include_path_regex``, if given), its output
    kept in ``output_tail``; the NDJSON report is read back into a :class:`FuzzRun`.

    In-process rather than ``st`` in a subprocess: a fresh interpreter spends seconds importing the
    package (torch) before the first request, and the custom formats must be registered where it runs.
    """
    from schemathesis.cli import schemathesis  # the dev extra only (module doc)

    register_strategies(as_node)
    only = [] if include_path_regex is None else ["--include-path-regex", include_path_regex]
    arguments = [
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--seed",
        str(seed),
        "--max-examples",
        str(max_examples),
        "--workers",
        "1",
        "--request-cert",
        str(layout.tls_cert(as_node)),
        "--request-cert-key",
        str(layout.tls_key(as_node)),
        "--tls-verify",
        str(layout.ca_cert),
        "--request-timeout",
        "30",
        # a seeded run must not depend on examples an earlier run stored
        "--generation-database",
        "none",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(report),
        *only,
    ]
    output = io.StringIO()
    exit_code: int | None = 0
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        try:
            schemathesis.main(args=arguments, prog_name="st", standalone_mode=False)
        except SystemExit as exit_:
            exit_code = exit_.code if isinstance(exit_.code, int) else 1
    run = read_report(report, service, as_node)
    run.exit_code = exit_code
    run.output_tail = output.getvalue()[-4000:]
    if not report.exists():
        run.errors.append(f"schemathesis wrote no report (exit {exit_code}): {run.output_tail[-800:]}")
    return run


def read_report(path: Path, service: str = "", as_node: str = "") -> FuzzRun:
    """Count requests and statuses and collect failed checks from a schemathesis NDJSON report."""
    run = FuzzRun(service, as_node)
    if not path.exists():
        return run
    seen: set[tuple[str, str, str]] = set()
    with path.open("rb") as lines:
        for line in lines:
            event = json.loads(line)
            if "ScenarioFinished" in event:
                _read_scenario(event["ScenarioFinished"].get("recorder") or {}, run, seen)
            elif "NonFatalError" in event or "FatalError" in event:
                problem = event.get("NonFatalError") or event.get("FatalError") or {}
                run.errors.append(str(problem.get("info", problem))[:800])
    return run


def _read_scenario(recorder: dict[str, Any], run: FuzzRun, seen: set[tuple[str, str, str]]) -> None:
    for interaction in (recorder.get("interactions") or {}).values():
        response = interaction.get("response")
        run.requests += 1
        run.operations[recorder.get("label", "")] += 1
        if response is not None:
            run.statuses[int(response["status_code"])] += 1
    for case_id, checks in (recorder.get("checks") or {}).items():
        for check in checks:
            if check.get("status") != "failure":
                continue
            failure = (check.get("failure_info") or {}).get("failure") or {}
            key = (check.get("name", ""), failure.get("operation", recorder.get("label", "")), failure.get("title", ""))
            if key in seen:
                continue
            seen.add(key)
            run.failures.append(
                {
                    "check": key[0],
                    "operation": key[1],
                    "code": failure.get("code"),
                    "title": key[2],
                    "message": str(failure.get("message", ""))[:600],
                    "case": case_id,
                }
            )


def main(argv: list[str] | None = None) -> int:
    """``st`` with the services' custom formats registered: ``--sender NODE -- <st arguments>``."""
    parser = argparse.ArgumentParser(description="schemathesis with fedgl-secure's custom formats")
    parser.add_argument("--sender", required=True, help="the node whose certificate the run uses")
    parser.add_argument("st_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    register_strategies(args.sender)
    from schemathesis.cli import schemathesis  # the dev extra only (module doc)

    st_args = args.st_args[1:] if args.st_args[:1] == ["--"] else args.st_args
    schemathesis.main(args=st_args, prog_name="st")  # exits with schemathesis' own code
    return 0


if __name__ == "__main__":
    sys.exit(main())
