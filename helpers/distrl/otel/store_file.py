"""The collector's database file: its schema, the check that a path is a new file or a
collector's own database, and the lock that lets one collector write it."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS resources (
    id INTEGER PRIMARY KEY,
    attributes TEXT NOT NULL UNIQUE,          -- JSON object, sorted keys
    service_name TEXT,
    service_instance_id TEXT
);
CREATE TABLE IF NOT EXISTS metric_descriptors (
    metric_type TEXT PRIMARY KEY,             -- prometheus.googleapis.com/<name>/<kind>
    name TEXT NOT NULL,                       -- the OTel instrument name
    kind TEXT NOT NULL,                       -- gauge | counter | histogram | summary
    metric_kind TEXT NOT NULL,                -- Cloud Monitoring: GAUGE | CUMULATIVE | DELTA
    value_type TEXT NOT NULL,                 -- DOUBLE | INT64 | DISTRIBUTION
    unit TEXT,
    description TEXT
);
CREATE TABLE IF NOT EXISTS points (
    id INTEGER PRIMARY KEY,
    metric_type TEXT NOT NULL,
    resource_id INTEGER NOT NULL REFERENCES resources(id),
    attributes TEXT NOT NULL,                 -- JSON object, sorted keys
    temporality INTEGER NOT NULL,             -- 0 none (gauge), 1 delta, 2 cumulative
    start_ns INTEGER NOT NULL,
    time_ns INTEGER NOT NULL,
    value REAL,                               -- gauges and sums
    int_value INTEGER,                        -- the exact value of integer points
    count INTEGER, sum REAL, min REAL, max REAL,   -- histograms
    bounds TEXT, bucket_counts TEXT,          -- explicit buckets, JSON arrays
    exponential TEXT,                         -- exponential buckets, JSON
    scope TEXT NOT NULL DEFAULT '',           -- the instrumentation scope's name
    -- a retry is stored once; two scopes may send the same attributes (two series)
    UNIQUE (metric_type, resource_id, scope, attributes, start_ns, time_ns)
);
CREATE TABLE IF NOT EXISTS metric_labels (  -- the label keys of each metric type, kept as
    metric_type TEXT NOT NULL,               -- points arrive (reading them from the points
    key TEXT NOT NULL,                       -- took seconds over 200k points)
    PRIMARY KEY (metric_type, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS points_by_type_time ON points (metric_type, time_ns);
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL, span_id TEXT NOT NULL, parent_span_id TEXT,
    name TEXT NOT NULL, kind INTEGER, start_ns INTEGER, end_ns INTEGER,
    status_code INTEGER, status_message TEXT,
    attributes TEXT, events TEXT, resource_id INTEGER REFERENCES resources(id), scope TEXT,
    PRIMARY KEY (trace_id, span_id)
);
CREATE INDEX IF NOT EXISTS spans_by_start ON spans (start_ns);
"""

SQLITE_HEADER = b"SQLite format 3\x00"  # sqlite.org/fileformat.html, "The Database Header"
OUR_TABLES = {"resources", "metric_descriptors", "points", "metric_labels", "spans"}


def check_db_file(path: Path) -> None:
    """A collector writes only a new file or its own database: never a directory, another
    kind of file, or another program's SQLite database (it would add tables and switch it to
    WAL)."""
    if path.is_dir():
        raise ValueError(f"db={str(path)!r} is a directory; expected a database file (made "
                         "if missing)")
    if not path.exists() or path.stat().st_size == 0:
        return
    try:
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except OSError as err:
        raise ValueError(f"db={str(path)!r} cannot be read: {err.strerror}") from None
    if header != SQLITE_HEADER:
        raise ValueError(f"db={str(path)!r} is not a SQLite database; expected a collector's "
                         "database or a new file")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except sqlite3.Error as err:
        raise ValueError(f"db={str(path)!r} cannot be read as SQLite: {err}") from None
    others = tables - OUR_TABLES
    if others or (tables and not {"points", "metric_descriptors"} <= tables):
        raise ValueError(f"db={str(path)!r} is another program's SQLite database (tables "
                         f"{', '.join(sorted(tables))[:120]}); expected a collector's database "
                         "or a new file")


def lock_writer(path: Path):
    """An exclusive lock on `<db>.lock`, naming this process: one collector writes a database.
    The kernel drops it when the process ends, however it ends."""
    import fcntl

    lock_path = path.with_name(path.name + ".lock")
    try:
        # held open for the store's life; private, as the database is
        lock = os.fdopen(os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600), "r+")
    except OSError as err:
        raise ValueError(f"db={str(path)!r} cannot be used: {err.strerror}: {lock_path}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise ValueError(f"db={str(path)!r} is being written by another collector (pid "
                         f"{holder}); stop it, or give this one another --db") from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock
