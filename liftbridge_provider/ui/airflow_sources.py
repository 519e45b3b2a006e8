"""What the Liftbridge page reads of Airflow: its ``liftbridge`` connections and the asset watchers on them.

Both are read in the API server, from Airflow's own records:

* :func:`liftbridge_connections`: the connections of type ``liftbridge`` in the
  metadata DB, in ``AIRFLOW_CONN_*`` variables, and those the Liftbridge asset
  watchers name, wherever Airflow finds them (a secrets backend cannot be
  listed, so one of its connections that no watcher names is found by id only,
  :func:`connection`);
* :func:`watchers_of`: the asset watchers whose trigger is
  ``LiftbridgeMessageTrigger`` (directly or through
  ``MessageQueueTrigger(scheme="liftbridge")``, which stores the same trigger)
  on one connection, with the asset each one fires and its last event.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from liftbridge_provider.ui.views import WatcherInfo

CONN_TYPE = "liftbridge"
DEFAULT_CONN_ID = "liftbridge_default"  # the triggers' and hooks' default liftbridge_conn_id
TRIGGER_CLASSPATH = "liftbridge_provider.triggers.message.LiftbridgeMessageTrigger"
_ENV_PREFIX = "AIRFLOW_CONN_"


@dataclass(frozen=True)
class LiftbridgeConnection:
    """A ``liftbridge`` connection as the page reads it: never handed to the browser as it is
    (``views.connection_summary`` and ``views.secrets_of`` decide what leaves the server)."""

    conn_id: str
    host: str | None
    port: int | None
    password: str | None
    extra: dict[str, Any]


def _of(conn: Any) -> LiftbridgeConnection:
    return LiftbridgeConnection(conn.conn_id, conn.host, conn.port, conn.password, dict(conn.extra_dejson or {}))


def connection(conn_id: str) -> LiftbridgeConnection | None:
    """The ``liftbridge`` connection ``conn_id`` from wherever Airflow finds it, or None (missing, other type)."""
    from airflow.models.connection import Connection  # noqa: PLC0415 - the API server's models, on first use

    try:
        conn = Connection.get_connection_from_secrets(conn_id)
    except Exception:  # Airflow's not-found error moved between versions; any failure reads as "no such"
        return None
    return _of(conn) if conn.conn_type == CONN_TYPE else None


def liftbridge_connections() -> list[LiftbridgeConnection]:
    """Every ``liftbridge`` connection of the metadata DB, of the environment, and named by a Liftbridge
    asset watcher (from any secrets backend), by id."""
    from airflow.models.connection import Connection  # noqa: PLC0415
    from airflow.utils.session import create_session  # noqa: PLC0415

    found: dict[str, LiftbridgeConnection] = {}
    with create_session() as session:
        for conn in session.scalars(select(Connection).where(Connection.conn_type == CONN_TYPE)):
            found[conn.conn_id] = _of(conn)
        named = {_conn_id_of(trigger) for *_, trigger in _watcher_rows(session)}
    for name in sorted(os.environ):
        if name.startswith(_ENV_PREFIX) and name[len(_ENV_PREFIX) :]:
            named.add(name[len(_ENV_PREFIX) :].lower())
    for conn_id in sorted(named - found.keys()):
        if (entry := connection(conn_id)) is not None:
            found[conn_id] = entry
    return [found[key] for key in sorted(found)]


def _conn_id_of(trigger: Any) -> str:
    """The connection a watcher's trigger uses."""
    return str(trigger.kwargs.get("liftbridge_conn_id") or DEFAULT_CONN_ID)


def _watcher_rows(session: Any) -> list[tuple[str, int, str, Any]]:
    """(watcher name, asset id, asset name, trigger) of every watcher running ``LiftbridgeMessageTrigger``.

    Airflow 3.2 records watchers in ``asset_watcher`` with a name; 3.1 links assets and triggers in
    ``asset_trigger`` without one, and the asset's name stands for the watcher's there
    (``version_compat.AIRFLOW_V_3_2_PLUS``: named asset watchers).
    """
    from airflow.models.asset import AssetModel  # noqa: PLC0415
    from airflow.models.trigger import Trigger  # noqa: PLC0415

    from liftbridge_provider.version_compat import AIRFLOW_V_3_2_PLUS  # noqa: PLC0415

    if AIRFLOW_V_3_2_PLUS:
        from airflow.models.asset import AssetWatcherModel  # noqa: PLC0415

        query = (
            select(AssetWatcherModel.name, AssetModel.id, AssetModel.name, Trigger)
            .join(Trigger, Trigger.id == AssetWatcherModel.trigger_id)
            .join(AssetModel, AssetModel.id == AssetWatcherModel.asset_id)
        )
    else:
        from airflow.models.asset import (  # type: ignore[attr-defined]  # noqa: PLC0415 - Airflow 3.1 only
            asset_trigger_association_table as links,
        )

        query = (
            select(AssetModel.name, AssetModel.id, AssetModel.name, Trigger)
            .join(links, links.c.asset_id == AssetModel.id)
            .join(Trigger, Trigger.id == links.c.trigger_id)
        )
    return [tuple(row) for row in session.execute(query.where(Trigger.classpath == TRIGGER_CLASSPATH)).all()]


def watchers_of(conn_id: str) -> list[WatcherInfo]:
    """The Liftbridge asset watchers on connection ``conn_id``, with their assets' last event times."""
    from airflow.models.asset import AssetEvent  # noqa: PLC0415
    from airflow.utils.session import create_session  # noqa: PLC0415

    found = []
    with create_session() as session:
        rows = _watcher_rows(session)
        asset_ids = {row[1] for row in rows}
        last_events = dict(
            session.execute(
                select(AssetEvent.asset_id, func.max(AssetEvent.timestamp))
                .where(AssetEvent.asset_id.in_(asset_ids))
                .group_by(AssetEvent.asset_id)
            ).all()
        )
        for name, asset_id, asset, trigger in rows:
            kwargs = trigger.kwargs
            if _conn_id_of(trigger) != conn_id:
                continue
            mode = str(kwargs.get("mode") or "message")
            partitions = kwargs.get("partitions")
            last = last_events.get(asset_id)
            found.append(
                WatcherInfo(
                    name=str(name),
                    asset=str(asset),
                    stream=str(kwargs.get("stream")),
                    cursor_id=str(kwargs.get("cursor_id") or f"airflow-{mode}-watcher"),
                    mode=mode,
                    dlq_stream=kwargs.get("dlq_stream") or None,
                    partitions=tuple(int(p) for p in partitions) if partitions is not None else None,
                    last_event=last.isoformat() if last is not None else None,
                )
            )
    return found
