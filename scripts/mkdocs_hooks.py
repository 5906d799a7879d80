"""MkDocs hook (mkdocs.yml ``hooks:``): fills each ``<!-- reference: NAME -->`` line of a page
with the table ``otel_ttft.tools.reference`` generates from the code, so that the reference
pages are rebuilt from semconv, the settings module, the analysis contract and the CLI parser on
every ``make docs`` and cannot drift from them."""

from __future__ import annotations

from otel_ttft.tools import reference


def on_page_markdown(markdown: str, **_: object) -> str:
    """MkDocs passes ``page``, ``config`` and ``files`` too; the tables need none of them."""
    return reference.expand(markdown)
