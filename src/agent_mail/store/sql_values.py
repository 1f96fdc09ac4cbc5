"""Values as the SQL backends store them: JSON columns read and written, lists of ids as named parameters, and
pages of rows merged from a query's direct and broadcast halves. Shared by store/sql.py and the statement modules
it loads when a command needs them."""

from __future__ import annotations


def decode_refs(raw: object) -> list:
    """Refs are stored as JSON text; older mailboxes may hold anything, so never fail on them."""
    if raw is None or raw == "":
        return []
    import json  # only for rows that carry refs: `import json` costs more than a whole query

    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return [raw]
    if isinstance(value, list):
        return value
    return [value]


def encode_json(value: object) -> str:
    import json
    return json.dumps(value, ensure_ascii=False)


def decode_json(text: str) -> dict:
    import json
    return json.loads(text)


def ids_clause(ids: list[str], prefix: str = "id") -> tuple[str, dict]:
    params = {f"{prefix}{i}": value for i, value in enumerate(ids)}
    return ",".join(f":{name}" for name in params), params


def page(rows: list[dict], limit: int | None, newest: bool) -> list[dict]:
    """Merge the direct and broadcast halves into arrival order and keep the oldest (or newest) `limit`,
    returned oldest first."""
    rows.sort(key=lambda r: (r["arrival"], r["seq"]))
    if limit is not None:
        rows = rows[-limit:] if newest else rows[:limit]
    return rows
