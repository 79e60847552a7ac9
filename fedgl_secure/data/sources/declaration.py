"""Where one bank's customers and transactions live: ``[bank.data]`` of the bank's own node file.

Never in the shared consortium file — which tables a bank has, and where, is the bank's business.
Two kinds::

    [bank.data]                       # files: Parquet or CSV (by extension, or format = ...)
    kind = "files"
    customers = "data/bank-a/customers.parquet"
    transactions = "data/bank-a/transactions.parquet"

    [bank.data]                       # a database through SQLAlchemy (SQLite embedded, PostgreSQL ...)
    kind = "sql"
    url_env = "BANK_C_DATABASE_URL"   # or url = "sqlite:///data/bank-c.sqlite" (no passwords in files)
    customers = "customers"           # a table, or customers_query = "SELECT ..."
    transactions = "transactions"     # a table, or transactions_query = "SELECT ..."

Relative file paths and relative SQLite paths are resolved against the node file by
:func:`fedgl_secure.consortium.config.load_node_config`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedgl_secure.errors import ConfigError
from fedgl_secure.tomlio import field_error

TABLE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]{0,126}$"  # optionally schema-qualified; never interpolated unchecked


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class FileSource(_Model):
    """Customers and transactions as Parquet or CSV files."""

    kind: Literal["files"]
    customers: Path
    transactions: Path
    format: Literal["auto", "parquet", "csv"] = Field("auto", description="auto: from each file's extension")

    def file_format(self, path: Path) -> Literal["parquet", "csv"]:
        if self.format != "auto":
            return self.format
        suffix = path.suffix.lower()
        if suffix in (".parquet", ".pq"):
            return "parquet"
        if suffix in (".csv", ".txt"):
            return "csv"
        raise ConfigError(
            f"{path}: cannot tell the format from the extension {suffix!r}; set format = 'parquet' or 'csv'"
        )


class SqlSource(_Model):
    """Customers and transactions read from a database through SQLAlchemy."""

    kind: Literal["sql"]
    url: str | None = Field(None, description="SQLAlchemy URL; prefer url_env for anything with a password")
    url_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    customers: str | None = Field(None, pattern=TABLE_PATTERN)
    customers_query: str | None = None
    transactions: str | None = Field(None, pattern=TABLE_PATTERN)
    transactions_query: str | None = None

    @model_validator(mode="after")
    def _one_of_each(self) -> SqlSource:
        if (self.url is None) == (self.url_env is None):
            raise field_error("url", "give exactly one of url and url_env")
        for name in ("customers", "transactions"):
            if (getattr(self, name) is None) == (getattr(self, f"{name}_query") is None):
                raise field_error(name, f"give exactly one of {name} (a table) and {name}_query")
        return self

    def resolved_url(self) -> str:
        """The database URL (from ``url_env`` when set; the error names the variable)."""
        if self.url is not None:
            return self.url
        value = os.environ.get(self.url_env or "")
        if not value:
            raise ConfigError(f"[bank.data] url_env: the environment variable {self.url_env} is not set")
        return value


DataSource = Annotated[FileSource | SqlSource, Field(discriminator="kind")]
