"""Reading the journal back: a time window of series, resources and events.

Readers open the file read-only and never block the writer (WAL lets both run at
once). Diagnose, the forecaster and ``GET /v2/sordino/journal`` all read through
:class:`JournalReader`; a :class:`JournalWindow` also travels as JSON, so a report can
be made from a server's journal over HTTP.
"""

from __future__ import annotations

import sqlite3
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson

from sordino.telemetry.series import ResourceRow, SecondRow

__all__ = [
    "JournalEvent",
    "JournalReader",
    "JournalWindow",
    "MissingJournal",
    "lacking_text",
    "missing_columns",
]

_SERIES_FIELDS = [f.name for f in fields(SecondRow)]
_RESOURCE_FIELDS = [f.name for f in fields(ResourceRow)]
_EVENT_FIELDS = ["t", "kind", "subject", "cause", "payload"]
_DEFAULTED = {"rejected_by_reason"}
"""Series columns a journal written before they existed may lack (read as defaults)."""
_TABLES = {
    "series": [name for name in _SERIES_FIELDS if name not in _DEFAULTED],
    "resources": _RESOURCE_FIELDS,
    "events": _EVENT_FIELDS,
}


class MissingJournal(FileNotFoundError):
    """There is no journal where one was expected; the message says where and why."""


def missing_columns(conn: sqlite3.Connection) -> list[str]:
    """The journal's columns (``table.column``) that ``conn``'s database lacks.

    An empty list for a sordino journal, of this version or an older one; a database
    something else made (tables of the same names, other columns) lists what it lacks.
    Raises :class:`sqlite3.DatabaseError` for a file that is not a database at all.
    """
    lacking = []
    for table, wanted in _TABLES.items():
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        lacking += [f"{table}.{name}" for name in wanted if name not in have]
    return lacking


def lacking_text(lacking: list[str]) -> str:
    """:func:`missing_columns`'s list as a message says it: the first four, then "…"."""
    return ", ".join(lacking[:4]) + (" …" if len(lacking) > 4 else "")


def _not_a_journal(path: Path, lacking: list[str]) -> str:
    return f"{path} is not a sordino journal (it has no {lacking_text(lacking)})"


@dataclass(frozen=True, slots=True)
class JournalEvent:
    """One journaled event."""

    t: float
    kind: str
    subject: str
    cause: str
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JournalWindow:
    """Everything the journal holds between ``start`` and ``end`` (epoch seconds)."""

    start: float
    end: float
    series: list[SecondRow]
    resources: list[ResourceRow]
    events: list[JournalEvent]

    @property
    def models(self) -> list[str]:
        return sorted({row.model for row in self.series})

    def rows_of(self, model: str) -> list[SecondRow]:
        return [row for row in self.series if row.model == model]

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "series": [asdict(r) for r in self.series],
            "resources": [asdict(r) for r in self.resources],
            "events": [asdict(e) for e in self.events],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JournalWindow:
        return cls(
            start=float(data["start"]),
            end=float(data["end"]),
            series=[SecondRow(**r) for r in data["series"]],
            resources=[ResourceRow(**r) for r in data["resources"]],
            events=[JournalEvent(**e) for e in data["events"]],
        )


class JournalReader:
    """Queries one journal file."""

    def __init__(self, path: Path) -> None:
        if not path.exists():
            raise MissingJournal(
                f"no journal at {path}: start the server with `sordino start --data-dir "
                f"{path.parent}` (telemetry.journal is on by default) and let it run a while"
            )
        self.path = path
        self._conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            lacking = missing_columns(self._conn)
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise MissingJournal(f"{path} is not a sordino journal: {exc}") from exc
        if lacking:
            self._conn.close()
            raise MissingJournal(
                f"{_not_a_journal(path, lacking)}: give --data-dir the data folder of a "
                "sordino server"
            )

    def _rows(self, sql: str, parameters: tuple[Any, ...] = ()) -> list[Any]:
        """``sql``'s rows; a journal damaged where the query reads is a
        :class:`MissingJournal` that says so, not a database error."""
        try:
            return self._conn.execute(sql, parameters).fetchall()
        except sqlite3.DatabaseError as exc:
            raise MissingJournal(
                f"the journal {self.path} cannot be read ({exc}): it is damaged; "
                "`sqlite3 FILE .recover` saves what it holds (a server writing it sets it "
                "aside and starts a new one)"
            ) from exc

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> JournalReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def span(self) -> tuple[float, float] | None:
        """The first and last second the journal has a series row for, or None if empty."""
        first, last = self._rows("SELECT MIN(t), MAX(t) FROM series")[0]
        return None if first is None else (float(first), float(last))

    def window(self, start: float, end: float) -> JournalWindow:
        """Every row and event with ``start <= t < end``, oldest first."""
        columns = {row[1] for row in self._rows("PRAGMA table_info(series)")}
        # A journal written before a column existed reads as that column's default.
        selected = [name if name in columns else f"'{{}}' AS {name}" for name in _SERIES_FIELDS]
        series = [
            _series_row(r)
            for r in self._rows(
                f"SELECT {', '.join(selected)} FROM series WHERE t >= ? AND t < ? "
                "ORDER BY t, model, version",
                (int(start), end),
            )
        ]
        resources = [
            ResourceRow(*r)
            for r in self._rows(
                f"SELECT {', '.join(_RESOURCE_FIELDS)} FROM resources WHERE t >= ? AND t < ? "
                "ORDER BY t",
                (int(start), end),
            )
        ]
        events = [
            JournalEvent(t, kind, subject, cause, orjson.loads(payload))
            for t, kind, subject, cause, payload in self._rows(
                "SELECT t, kind, subject, cause, payload FROM events WHERE t >= ? AND t < ? "
                "ORDER BY t, id",
                (start, end),
            )
        ]
        return JournalWindow(start, end, series, resources, events)

    def latest_events(self, kind: str, before: float, limit: int = 5) -> list[JournalEvent]:
        """The last ``limit`` events of ``kind`` before ``before``, oldest first."""
        rows = self._rows(
            "SELECT t, kind, subject, cause, payload FROM events WHERE kind = ? AND t < ? "
            "ORDER BY t DESC LIMIT ?",
            (kind, before, limit),
        )
        return [JournalEvent(t, k, s, c, orjson.loads(p)) for t, k, s, c, p in reversed(rows)]

    def per_minute(self, since: float) -> dict[str, list[tuple[int, float]]]:
        """Mean QPS per minute of every model since ``since`` (minute start, qps)."""
        out: dict[str, list[tuple[int, float]]] = {}
        for model, minute, total, seconds in self._rows(
            "SELECT model, t / 60 AS m, SUM(requests), COUNT(DISTINCT t) FROM series "
            "WHERE t >= ? GROUP BY model, m ORDER BY model, m",
            (int(since),),
        ):
            out.setdefault(model, []).append((int(minute) * 60, total / max(seconds, 1)))
        return out

    def memory_per_minute(self, since: float) -> list[tuple[int, float]]:
        """Mean process RSS (plus pool in use when larger) per minute since ``since``."""
        return [
            (int(minute) * 60, float(rss))
            for minute, rss in self._rows(
                "SELECT t / 60 AS m, AVG(MAX(rss_bytes, COALESCE(pool_in_use_bytes, 0))) "
                "FROM resources WHERE t >= ? GROUP BY m ORDER BY m",
                (int(since),),
            )
        ]


def _series_row(values: tuple[Any, ...]) -> SecondRow:
    data = dict(zip(_SERIES_FIELDS, values, strict=True))
    data["errors_by_reason"] = orjson.loads(data["errors_by_reason"])
    data["rejected_by_reason"] = orjson.loads(data["rejected_by_reason"])
    return SecondRow(**data)
