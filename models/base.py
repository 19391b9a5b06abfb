"""Declarative base, portable column types and the database clock."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.sql.expression import FunctionElement

from models.ids import new_id

__all__ = ["NAMING", "Base", "JSONType", "UTCDateTime", "db_now", "new_id"]

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """Timezone-aware UTC on every backend (SQLite hands back naive values)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        # SQLite compares text: store naive UTC in the same format db_now() renders.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


JSONType = sa.JSON().with_variant(JSONB(), "postgresql")


class db_now(FunctionElement[datetime]):
    """The database clock, optionally offset by a number of seconds (may be a bind)."""

    type = UTCDateTime()
    inherit_cache = True

    def __init__(self, offset_s: float | sa.ColumnElement[Any] = 0.0) -> None:
        offset = offset_s if isinstance(offset_s, sa.ColumnElement) else sa.literal(float(offset_s))
        super().__init__(offset)


@compiles(db_now, "postgresql")
def _pg_now(element: db_now, compiler: Any, **kw: Any) -> str:
    (offset,) = list(element.clauses)
    return f"(clock_timestamp() + make_interval(secs => {compiler.process(offset, **kw)}))"


@compiles(db_now, "sqlite")
def _sqlite_now(element: db_now, compiler: Any, **kw: Any) -> str:
    (offset,) = list(element.clauses)
    # Same text layout SQLAlchemy uses for SQLite DATETIME, so comparisons stay ordered.
    return (
        "strftime('%Y-%m-%d %H:%M:%f000', 'now', "
        f"printf('%+.6f seconds', {compiler.process(offset, **kw)}))"
    )
