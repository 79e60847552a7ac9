"""The Jinja2 environment of the HTML pages: the audit's report (``audit --format html``) and the board.

Templates live in ``templates/`` of this package — the page layout (``page.html``), its style (``style.css``) and the
macros both pages draw with (``macros.html``: status badges, tables, checks, figures, an audit section) — and a
package above (the board) adds its own templates first in the search path, extending these. Values are escaped
(autoescape); figures become inline SVG through the ``svg`` filter (:mod:`fedgl_secure.audit.plots`).
"""

from __future__ import annotations

import math
from typing import Any

from jinja2 import ChoiceLoader, Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from fedgl_secure.audit.plots import svg


def cell(value: Any) -> str:
    """A table cell: ``-`` for nothing, 4 significant digits for a float (``∞``, ``-`` for NaN), else ``str``."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return "∞" if math.isinf(value) else "-" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def html_environment(*packages: str) -> Environment:
    """Templates of ``packages`` (each one's ``templates/``, searched first) and of the audit; undefined names fail."""
    loaders = [PackageLoader(package, "templates") for package in (*packages, "fedgl_secure.audit")]
    environment = Environment(
        loader=ChoiceLoader(loaders),
        autoescape=True,
        undefined=StrictUndefined,  # a misspelt field fails the render instead of leaving a blank
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["cell"] = cell
    # matplotlib writes the SVG and escapes the text in it; the page takes it as markup
    environment.filters["svg"] = lambda item: Markup(svg(item))
    return environment
