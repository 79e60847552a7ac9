"""Reading TOML files and reporting pydantic validation errors, one way for the whole package.

No FastAPI here: configuration, policy, receipts and the wire format all share these two helpers.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from pydantic_core import PydanticCustomError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

FIELD_ERROR = "field_error"


class _HasErrors(Protocol):
    def errors(self) -> Iterable[Mapping[str, Any]]: ...


def field_error(field: str, detail: str) -> PydanticCustomError:
    """A cross-field error reported at ``field`` (dotted, relative to the model that raises it)."""
    return PydanticCustomError(FIELD_ERROR, "{field}: {detail}", {"field": field, "detail": detail})


def format_validation_error(
    error: _HasErrors, source: str | Path | None = None, whole: str = "(top level)", sep: str = "; "
) -> str:
    """Every field pydantic rejected, as ``[source: ]dotted.field: message`` joined by ``sep``.

    ``whole`` names an error located at the value itself; pydantic's ``Value error, `` prefix is
    dropped, and a :func:`field_error` is reported at the field it names.
    """
    lines = []
    for e in error.errors():
        location = tuple(e.get("loc", ()))
        message = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        if e.get("type") == FIELD_ERROR:
            location = (*location, e["ctx"]["field"])
            message = e["ctx"]["detail"]
        line = f"{'.'.join(map(str, location)) or whole}: {message}"
        lines.append(f"{source}: {line}" if source is not None else line)
    return sep.join(lines)


def read_toml(path: str | Path, what: str, error_cls: type[Exception]) -> dict[str, Any]:
    """The parsed TOML file at ``path``; an unreadable or malformed file raises ``error_cls`` naming it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise error_cls(f"{path}: cannot read {what} ({error.strerror or error})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise error_cls(f"{path}: not valid TOML: {error}") from None
