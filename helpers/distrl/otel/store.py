"""The collector's SQLite store (its file: store_file.py): one writer thread that group-commits exports,
a checkpointer that copies the write-ahead log back beside it, and read-only connections for
the readers (distrl.otel.monitoring)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import sqlite3
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import NamedTuple

from distrl.otel.limits import Limits, MiB
from distrl.otel.points import (
    ATTRIBUTE_CACHE,
    INT64_MAX,
    MAX_ERROR_CHARS,
    MAX_LABEL_KEYS,
    MAX_NAME_CHARS,
    METRIC_TYPE_PREFIX,
    BoundedCache,
    InvalidPoint,
    StorageUnavailable,
    attributes_json,
    check_labels,
    check_point,
    exponential_fields,
    histogram_fields,
    kinds_of,
    metric_type_of,
    refusal,
)
from distrl.otel.store_file import SCHEMA, check_db_file, lock_writer

# How long an Export waits for the commit holding its rows before it is answered UNAVAILABLE.
COMMIT_WAIT_S = 20.0
# How often the checkpointer looks at the WAL; how long a restart waits for the reads on the
# log (exports wait meanwhile), and how long once they are being stopped; how long reads are
# refused, at most, while the writer starts a log past four times max_wal_bytes again.
WAL_CHECK_S, RESTART_WAIT_MS, STOP_WAIT_MS, STOP_READS_S = 0.1, 10, 200, 2.0
RESTART_TAIL_BYTES = 4 * MiB  # at most this much is left to copy when the log restarts
# A thread of its own copies the log's pages back to the database as they are written,
# beside the writer, which starts the log again with a few pages left to copy. SQLite's
# automatic checkpoint copied ~80 MB inside a COMMIT every ~0.8 s beside 4 exporters, and
# every export waited for it (~105 ms; benchmarks/collector_under_load.py).


class SeriesKey(NamedTuple):
    """What tells a stored series apart: the points table's unique key without the times."""

    metric_type: str
    resource_id: int
    scope: str
    attributes: str            # JSON object, sorted keys


class PointRow(NamedTuple):
    """A row of the points table, in its columns' order (SCHEMA)."""

    metric_type: str
    resource_id: int
    attributes: str
    temporality: int
    start_ns: int
    time_ns: int
    value: float | None
    int_value: int | None
    count: int | None
    sum: float | None
    min: float | None
    max: float | None
    bounds: str | None
    bucket_counts: str | None
    exponential: str | None
    scope: str


class CollectorStore:
    """The SQLite file: written by the collector, read by anyone (WAL allows both at once)."""

    def __init__(self, path: str | Path, *, create: bool = False, limits: Limits | None = None):
        self.path = Path(path)
        self.limits = limits or Limits()
        if not create and not self.path.exists():
            raise FileNotFoundError(f"no collector database at {self.path}; start one with "
                                    f"`distrl collector --db {self.path}`")
        if create:
            check_db_file(self.path)
        self._lock = lock_writer(self.path) if create else None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if create and not self.path.exists():
                # Readable by its owner only; SQLite gives the -wal and -shm files the same mode.
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            # isolation_level=None: the writer begins and commits its transactions itself.
            self.conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30,
                                        isolation_level=None)
            self.conn.row_factory = sqlite3.Row
            if create:
                self._create()
        except (OSError, sqlite3.Error) as err:
            if self._lock is not None:
                self._lock.close()
            raise ValueError(f"db={str(self.path)!r} cannot be used: "
                             f"{getattr(err, 'strerror', None) or err}") from None
        self._readers = threading.local()  # one read-only connection per reading thread
        self._reader_conns: list[sqlite3.Connection] = []
        ATTRIBUTE_CACHE.max_bytes = self.limits.cache_bytes // 2
        self._resource_ids = BoundedCache(self.limits.cache_bytes // 8)
        self._labelled = BoundedCache(self.limits.cache_bytes // 8)  # (type, attributes) seen
        self._descriptors = BoundedCache(self.limits.cache_bytes // 8)  # type -> value type
        self._life_bounds = BoundedCache(self.limits.cache_bytes // 8)  # cumulative bounds
        self._jobs: queue.Queue = queue.Queue()
        self._wal_path = self.path.with_name(self.path.name + "-wal")
        self.interrupt_reads = None  # a multiprocessing Event: Calls gives its readers
        self._checkpointing = threading.Lock()  # one checkpoint at a time
        self._restartable = 0  # the log's bytes, when the last copy left few to copy
        self._retry_at = 0  # after a restart a read held up: the length to try again at
        self._stopping_since = None  # reads are stopped (_stop_reads)
        self._restarted_frames = -1  # the frames of a log that restarts at the next commit
        self._writer = self._checkpointer = None
        self._closing = threading.Event()
        if create:
            self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                            name="collector-writer")
            self._writer.start()
            self._checkpointer = threading.Thread(target=self._checkpoint_loop, daemon=True,
                                                  name="collector-checkpointer")
            self._checkpointer.start()

    def _create(self) -> None:
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")  # WAL: commits need no fsync
        # No checkpoint inside a commit (_checkpoint_loop, _restart_log). A file that grew
        # past 4 x max_wal_bytes while reads held the log is cut back to that size when the
        # log starts again (sqlite.org/pragma.html#pragma_journal_size_limit).
        self.conn.execute("PRAGMA wal_autocheckpoint=0")
        self.conn.execute(f"PRAGMA journal_size_limit={4 * self.limits.max_wal_bytes}")
        had_labels = self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = "
                                       "'metric_labels'").fetchone()
        self.conn.executescript(SCHEMA)
        if not had_labels:  # a file written before the table existed
            self.conn.execute("INSERT OR IGNORE INTO metric_labels SELECT DISTINCT "
                              "p.metric_type, j.key FROM points p, json_each(p.attributes) j")
        self.conn.commit()

    def close(self) -> None:
        if self._checkpointer is not None:
            self._closing.set()
            self._checkpointer.join(COMMIT_WAIT_S)
            self._checkpointer = None
        if self._writer is not None:
            self._jobs.put(None)  # the writer commits what is queued, then stops
            self._writer.join(COMMIT_WAIT_S)
            if self._writer.is_alive():  # stuck in SQLite: its connection stays open
                return
            self._writer = None
        for conn in self._reader_conns:
            conn.close()
        self._reader_conns.clear()
        self.conn.close()
        if self._lock is not None:
            self._lock.close()  # the lock goes with the file descriptor
            self._lock = None

    # ---- writing (the collector) ----

    def resource_id(self, attributes: str) -> int:
        rid = self._resource_ids.get(attributes)
        if rid is None:
            parsed = json.loads(attributes)
            self.conn.execute(
                "INSERT OR IGNORE INTO resources (attributes, service_name, service_instance_id)"
                " VALUES (?, ?, ?)", (attributes, parsed.get("service.name"),
                                      parsed.get("service.instance.id")))
            rid = self.conn.execute("SELECT id FROM resources WHERE attributes = ?",
                                    (attributes,)).fetchone()[0]
            self._resource_ids.put(attributes, rid)
        return rid

    def _descriptor(self, metric_type, name, kind, metric_kind, value_type, unit,
                    description) -> str:
        """The metric type's value type: the stored descriptor's, or this one's, stored now.
        Raises InvalidPoint for a new metric type past max_metric_types."""
        known = self._descriptors.get(metric_type)
        if known is None:
            row = self.conn.execute("SELECT value_type FROM metric_descriptors WHERE "
                                    "metric_type = ?", (metric_type,)).fetchone()
            if row is None:
                count = self.conn.execute("SELECT COUNT(*) FROM metric_descriptors").fetchone()[0]
                if count >= self.limits.max_metric_types:
                    raise InvalidPoint(f"the store holds {count:,} metric types, its limit "
                                       "(max_metric_types); a new one is refused")
                self.conn.execute("INSERT INTO metric_descriptors VALUES (?,?,?,?,?,?,?)",
                                  (metric_type, name, kind, metric_kind, value_type, unit,
                                   description))
            known = row[0] if row else value_type
            self._descriptors.put(metric_type, known)
        return known

    def write_metrics(self, request) -> tuple[int, int, str]:
        """Store a request's points; returns (stored, rejected, error) once committed."""
        return self._submit(self._insert_metrics, request)

    def write_spans(self, request) -> tuple[int, int, str]:
        """Store a request's spans; returns (stored, rejected, error) once committed."""
        return self._submit(self._insert_spans, request)

    def delete_metric_type(self, metric_type: str) -> int | None:
        """A metric type's descriptor, label keys and points, deleted by the writer once
        committed (DeleteMetricDescriptor); the points it held, or None where there is none."""
        return self._submit(self._delete_type, metric_type)

    def write_with(self, insert, request):
        """insert(self, request) run by the writer inside its next commit (the write calls of
        MetricService: writes.py); what it returns, once committed."""
        return self._submit(lambda r: insert(self, r), request)

    def _delete_type(self, metric_type: str) -> int | None:
        sql = "DELETE FROM {} WHERE metric_type = ?"
        if not self.conn.execute(sql.format("metric_descriptors"), (metric_type,)).rowcount:
            return None
        self.conn.execute(sql.format("metric_labels"), (metric_type,))
        self._forget()  # its descriptor and label keys, cached
        return self.conn.execute(sql.format("points"), (metric_type,)).rowcount

    # Group commit: one writer thread drains every request waiting at that moment and commits
    # them in one transaction, so concurrent exporters share a commit instead of queueing for
    # one each. Each request's reply waits for the commit that holds its rows, and every
    # request of a commit gets an answer, also when the commit fails.

    def _submit(self, insert, request):
        if self._writer is None:
            raise StorageUnavailable("the store is closed")
        future: futures.Future = futures.Future()
        self._jobs.put((insert, request, future))
        try:
            return future.result(timeout=COMMIT_WAIT_S)
        except futures.TimeoutError:
            # The rows may still be committed later; a retry of them is then stored once.
            raise StorageUnavailable(f"the store did not commit within {COMMIT_WAIT_S:g} s"
                                     ) from None

    def _write_loop(self) -> None:
        while True:
            jobs = [self._jobs.get()]
            while len(jobs) < 256:
                try:
                    jobs.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            stop = any(job is None for job in jobs)
            jobs = [job for job in jobs if job is not None]
            if jobs:
                self._commit(jobs)
                self._restart_log()
            if stop:
                return

    def _checkpoint_loop(self) -> None:
        """Copies the log's new pages back to the database every WAL_CHECK_S that anything was
        written, on a connection of its own, beside the writer (a PASSIVE checkpoint:
        sqlite.org/c3ref/wal_checkpoint_v2.html), and tells _restart_log how long the log is
        once at most RESTART_TAIL_BYTES of it are left to copy. A page a read still needs
        stays in the log until that read ends. Past 4 x max_wal_bytes (or half of what the
        disk leaves the log), reads are stopped
        through interrupt_reads (an event the reader processes watch; they answer UNAVAILABLE,
        which clients retry) until the log starts again, STOP_READS_S at most."""
        conn = sqlite3.connect(self.path, timeout=0, isolation_level=None,
                               check_same_thread=False)
        frame_bytes = conn.execute("PRAGMA page_size").fetchone()[0] + 24  # a frame's header
        seen = None
        try:
            while not self._closing.wait(WAL_CHECK_S):
                try:
                    stat = self._wal_path.stat()
                    if (stat.st_size, stat.st_mtime_ns) == seen:  # nothing written since
                        continue
                    seen = (stat.st_size, stat.st_mtime_ns)
                    with self._checkpointing:
                        busy, frames, copied = conn.execute(
                            "PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                        if busy or frames == self._restarted_frames:  # not yet restarted
                            continue
                        tail, log = (frames - copied) * frame_bytes, frames * frame_bytes
                        self._restartable = log * (tail <= RESTART_TAIL_BYTES)
                        self._stop_reads(log > min(4 * self.limits.max_wal_bytes,
                                                   self._disk_room(log) // 2))
                except (OSError, sqlite3.Error):  # a full disk: the writer's commits say so
                    continue
        finally:
            with self._checkpointing:
                self._stop_reads(False)
            conn.close()

    def _disk_room(self, log: int) -> int:
        """What the log may take of the disk: its own length and the free space beside it."""
        try:
            return log + shutil.disk_usage(self.path.parent).free
        except OSError:
            return 2**62

    def _disk_tight(self, wal: int) -> bool:
        """Whether the log's file takes over a quarter of what the disk leaves it. A log that
        took the disk could never be copied back (the database grows by what it copies): on
        a 64-MiB disk the log grew to 59 MiB, and once full no export got through again, also
        after space was freed. So the writer then copies it back itself, between commits,
        without waiting for the checkpointer, and gives the file's space back."""
        return wal > 0 and wal > self._disk_room(wal) // 4

    def _stop_reads(self, stop: bool) -> None:
        """Stops the reads, or lets them go on (under _checkpointing)."""
        if self.interrupt_reads is None:
            return
        now = time.monotonic()
        if stop and self._stopping_since is None:
            self.interrupt_reads.set()
            self._stopping_since = now
        elif self._stopping_since is not None and (
                not stop or now > self._stopping_since + STOP_READS_S):
            self.interrupt_reads.clear()
            self._stopping_since = None

    def _restart_log(self) -> None:
        """Between two commits: starts the log again once it is half max_wal_bytes long and
        the checkpointer has copied all but its last pages, or at once on a tight disk
        (_disk_tight) (a RESTART checkpoint,
        sqlite.org/pragma.html#pragma_wal_checkpoint; commits wait while it copies them). It
        waits RESTART_WAIT_MS at most for the reads on the log (short ones end meanwhile; new
        ones read the database); if one is still there, it tries again once the log has grown
        by half. While reads are stopped it tries after every commit, waiting STOP_WAIT_MS
        for them. Past 4 x max_wal_bytes the writer stops the reads itself and commits nothing
        more until the log starts again, STOP_READS_S at most: when it went on committing
        while the checkpointer stopped the reads, the log reached 107 MiB of a 32-MiB bound
        on CI's loaded machine (the reader processes, niced, took their time to stop)."""
        wal = self._wal_bytes()  # one look a commit: the export path waits for this
        tight, over = self._disk_tight(wal), wal > 4 * self.limits.max_wal_bytes
        until = time.monotonic() + STOP_READS_S
        while not self._try_restart(tight, over) and over and time.monotonic() < until:
            pass

    def _wal_bytes(self) -> int:
        try:
            return self._wal_path.stat().st_size
        except OSError:
            return 0

    def _try_restart(self, tight: bool, over: bool) -> bool:
        """One try of _restart_log's; whether the log starts again at the next commit."""
        log, limit = self._restartable, self.limits.max_wal_bytes
        stopping = self._stopping_since is not None or tight or over
        wait_ms = STOP_WAIT_MS if stopping else RESTART_WAIT_MS
        if ((not stopping and log <= max(limit // 2, min(self._retry_at, 4 * limit)))
                or not self._checkpointing.acquire(timeout=wait_ms / 1e3 if stopping else 0)):
            return False
        try:
            if over:
                self._stop_reads(True)
            self._restartable = 0  # until the next copy
            self.conn.execute(f"PRAGMA busy_timeout = {wait_ms}")
            try:
                # the file keeps its length for the next log, unless the disk needs it back
                mode = "TRUNCATE" if tight else "RESTART"
                busy, frames, _ = self.conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
                restarted = not busy
            except sqlite3.Error:
                restarted, frames = False, -1
            finally:
                self.conn.execute("PRAGMA busy_timeout = 30000")  # sqlite3.connect's timeout=30
            # The log starts again at the next commit: until then the checkpointer still
            # counts these frames.
            self._restarted_frames = frames if restarted else -1
            self._retry_at = 0 if restarted else log * 3 // 2
            if restarted:
                self._stop_reads(False)
            return restarted
        finally:
            self._checkpointing.release()

    def _commit(self, jobs: list) -> None:
        """One transaction for the jobs, a savepoint each: a request that fails half-way
        leaves nothing stored and fails alone; a failure of the storage itself (a full disk,
        an I/O error) fails every request of the commit with StorageUnavailable."""
        outcomes = []
        try:
            # IMMEDIATE: the write lock up front. A deferred BEGIN that reads first cannot
            # upgrade to a writer when another holds it, and the busy timeout does not retry
            # that (sqlite.org/lang_transaction.html).
            self.conn.execute("BEGIN IMMEDIATE")
            for insert, request, future in jobs:
                self.conn.execute("SAVEPOINT request")
                try:
                    outcomes.append((future, insert(request)))
                except sqlite3.OperationalError:
                    raise  # the storage failed, not this request
                except Exception as err:  # a request we cannot store: only it fails
                    self.conn.execute("ROLLBACK TO request")
                    self._forget()  # rows inserted in the rolled-back part
                    outcomes.append((future, err))
                self.conn.execute("RELEASE request")
            self.conn.execute("COMMIT")
        except Exception as err:
            if self.conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # else SQLite rolled back itself
                    self.conn.execute("ROLLBACK")
            self._forget()  # rows inserted in the rolled-back transaction
            failed = StorageUnavailable(f"storage failed: {err}")
            outcomes = [(future, failed) for *_, future in jobs]
        for future, outcome in outcomes:
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _forget(self) -> None:
        self._resource_ids.clear()
        self._labelled.clear()
        self._descriptors.clear()
        self._life_bounds.clear()

    def _labels(self, metric_type: str, attributes: str) -> None:
        """Record the label keys of a point's attributes (once per attribute set), or
        InvalidPoint where they break a cap (check_labels, MAX_LABEL_KEYS a metric type)."""
        key = f"{metric_type}\n{attributes}"
        if self._labelled.get(key) is not None:
            return
        parsed = json.loads(attributes)
        check_labels(parsed, "the point")
        known = {row[0] for row in self.conn.execute(
            "SELECT key FROM metric_labels WHERE metric_type = ?", (metric_type,))}
        new = parsed.keys() - known
        if len(known) + len(new) > MAX_LABEL_KEYS:
            raise InvalidPoint(f"its attributes would give the metric {len(known) + len(new):,} "
                               f"label keys; at most {MAX_LABEL_KEYS}")
        self.conn.executemany("INSERT OR IGNORE INTO metric_labels VALUES (?, ?)",
                              [(metric_type, k) for k in new])
        self._labelled.put(key, 1)

    def _insert_metrics(self, request) -> tuple[int, int, str]:
        rows, rejected, error = [], 0, ""
        for rm in request.resource_metrics:
            try:  # a resource the store cannot hold: its points are refused, the others kept
                resource = attributes_json(rm.resource.attributes)
                check_labels(json.loads(resource), "the resource")
            except InvalidPoint as err:
                refused = sum(len(getattr(m, m.WhichOneof("data")).data_points) if
                              m.WhichOneof("data") else 1 for sm in rm.scope_metrics
                              for m in sm.metrics)
                rejected += refused
                error = error or f"{refused} points: {err}"[:MAX_ERROR_CHARS]
                continue
            rid = self.resource_id(resource)
            for sm in rm.scope_metrics:
                scope = sm.scope.name
                for metric in sm.metrics:
                    bad, msg = self._metric_rows(metric, rid, scope, rows)
                    rejected += bad
                    error = error or msg
        before = self.conn.total_changes
        self.conn.executemany(
            "INSERT OR IGNORE INTO points (metric_type, resource_id, attributes, "
            "temporality, start_ns, time_ns, value, int_value, count, sum, min, max, "
            "bounds, bucket_counts, exponential, scope) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
        clashes = 0
        if self.conn.total_changes - before < len(rows):  # some were stored already
            clashes, msg = self._clashes(rows)
            rejected += clashes
            error = error or msg
        return len(rows) - clashes, rejected, error

    def _clashes(self, rows: list) -> tuple[int, str]:
        """Rows of a series and time stored before with other values: refused (a series has
        one value at a time). A row stored before with the same values is a retry: stored."""
        clashes, error = 0, ""
        for row in rows:
            stored = self.conn.execute(
                "SELECT value, int_value, count, sum, min, max, bounds, bucket_counts, "
                "exponential FROM points WHERE metric_type = ? AND resource_id = ? AND "
                "scope = ? AND attributes = ? AND start_ns = ? AND time_ns = ?",
                (row[0], row[1], row[15], row[2], row[4], row[5])).fetchone()
            if stored is not None and tuple(stored) != row[6:15]:
                clashes += 1
                name = row[0].removeprefix(METRIC_TYPE_PREFIX)
                error = error or (f"{name[:80]!r} point at time_unix_nano={row[5]}: its series "
                                  "has another value stored at that time")[:MAX_ERROR_CHARS]
        return clashes, error

    def _metric_rows(self, metric, rid, scope, rows) -> tuple[int, str]:
        """Append the metric's storable points to rows; returns (refused, first refusal)."""
        data = metric.WhichOneof("data")
        name, unit, description = metric.name, metric.unit, metric.description
        if data is None:
            return 1, f"{name[:80]!r}: metric without data"
        container = getattr(metric, data)
        points = container.data_points
        if not 0 < len(name) <= MAX_NAME_CHARS:
            return len(points), (f"metric name {name[:80]!r}{'...' if len(name) > 80 else ''} "
                                 f"has {len(name):,} characters; expected 1 to "
                                 f"{MAX_NAME_CHARS} (OpenTelemetry's instrument name limit)")
        if data == "summary":
            return len(points), (f"{name[:80]!r}: summary points are not stored; the local "
                                 "collector stores gauges, sums and histograms")
        temporality = getattr(container, "aggregation_temporality", 0)
        kind, metric_kind, value_type = kinds_of(metric, data, temporality, points)
        metric_type = metric_type_of(name, kind)
        try:
            value_type = self._descriptor(metric_type, name, kind, metric_kind, value_type, unit,
                                          description)
        except InvalidPoint as err:
            return len(points), f"{name[:80]!r}: {err}"[:MAX_ERROR_CHARS]
        rejected, error = 0, ""
        for i, p in enumerate(points):
            try:
                series = SeriesKey(metric_type, rid, scope, attributes_json(p.attributes))
                row = self._point_row(series, data, value_type, temporality, p)
                self._labels(metric_type, series.attributes)  # last: only a stored point's keys
            except (InvalidPoint, ValueError, OverflowError, TypeError) as err:
                rejected += 1
                error = error or refusal(name, i, p, err)
                continue
            rows.append(row)  # only a point every check passed
        return rejected, error

    def _point_row(self, series: SeriesKey, data: str, value_type: str, temporality: int,
                   p) -> PointRow:
        """The points row of one data point, or InvalidPoint saying why it cannot be one."""
        times = (temporality, p.start_time_unix_nano, p.time_unix_nano)
        if data in ("histogram", "exponential_histogram"):
            columns = histogram_fields(p) if data == "histogram" else exponential_fields(p)
            if data == "histogram" and temporality == 2:
                self._check_life_bounds(series, p.start_time_unix_nano, columns.bounds)
            return PointRow(series.metric_type, series.resource_id, series.attributes, *times,
                            None, None, *columns, series.scope)
        which = p.WhichOneof("value")
        if which != "as_int" and value_type == "INT64":
            raise InvalidPoint(f"a double value ({p.as_double!r}) on a metric whose points are "
                               "integers (INT64, from its first point)")
        check_point(p, ("value", None if which == "as_int" else p.as_double))
        value = float(p.as_int) if which == "as_int" else p.as_double
        return PointRow(series.metric_type, series.resource_id, series.attributes, *times, value,
                        p.as_int if which == "as_int" else None, *(None,) * 7, series.scope)

    def _check_life_bounds(self, series: SeriesKey, start_ns: int, bounds: str) -> None:
        """A cumulative series keeps its bucket bounds while its start time stays: its
        points are differenced, and counts of other buckets cannot be."""
        key = "\n".join(map(str, (*series, start_ns)))
        known = self._life_bounds.get(key)
        if known is None:
            row = self.conn.execute(
                "SELECT bounds FROM points WHERE metric_type = ? AND resource_id = ? AND "
                "scope = ? AND attributes = ? AND start_ns = ? LIMIT 1",
                (*series, start_ns)).fetchone()
            known = row[0] if row else bounds
            self._life_bounds.put(key, known)
        if known != bounds:
            raise InvalidPoint(f"bucket bounds {bounds[:60]} differ from {known[:60]}, which "
                               "this cumulative series has had since its start time; new "
                               "bounds need a new start_time_unix_nano")

    def _insert_spans(self, request) -> tuple[int, int, str]:
        rows, rejected, error = [], 0, ""
        for rs in request.resource_spans:
            try:  # a resource the store cannot hold: its spans are refused, the others kept
                rid = self.resource_id(attributes_json(rs.resource.attributes))
            except InvalidPoint as err:
                refused = sum(len(ss.spans) for ss in rs.scope_spans)
                rejected += refused
                error = error or f"{refused} spans: the resource: {err}"[:MAX_ERROR_CHARS]
                continue
            for ss in rs.scope_spans:
                for s in ss.spans:
                    # OTLP: trace ids are 16 bytes, span ids 8, never all zero.
                    problem = ("trace_id is not 16 bytes of which one is not zero"
                               if len(s.trace_id) != 16 or not any(s.trace_id) else
                               "span_id is not 8 bytes of which one is not zero"
                               if len(s.span_id) != 8 or not any(s.span_id) else
                               "a time is above 2^63-1"
                               if max(s.start_time_unix_nano, s.end_time_unix_nano) > INT64_MAX
                               else None)
                    if problem:
                        rejected += 1
                        error = error or f"span {s.name[:60]!r}: {problem}"[:MAX_ERROR_CHARS]
                        continue
                    try:
                        attributes = attributes_json(s.attributes)
                        events = [{"name": e.name, "time_ns": e.time_unix_nano,
                                   "attributes": json.loads(attributes_json(e.attributes))}
                                  for e in s.events]
                    except InvalidPoint as err:
                        rejected += 1
                        error = error or f"span {s.name[:60]!r}: {err}"[:MAX_ERROR_CHARS]
                        continue
                    rows.append((s.trace_id.hex(), s.span_id.hex(),
                                 s.parent_span_id.hex() or None, s.name, s.kind,
                                 s.start_time_unix_nano, s.end_time_unix_nano, s.status.code,
                                 s.status.message, attributes, json.dumps(events), rid,
                                 ss.scope.name))
        self.conn.executemany("INSERT OR REPLACE INTO spans VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                              rows)
        return len(rows), rejected, error

    # ---- reading ----

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._readers, "conn", None)
        if conn is None:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                   check_same_thread=False, timeout=30)
            conn.row_factory = sqlite3.Row
            self._readers.conn = conn
            self._reader_conns.append(conn)
        return conn

    def rows(self, sql: str, params: tuple = (), interrupt=None):
        """Rows as dicts, read on this thread's own read-only connection: with WAL a read
        never holds up the writer. interrupt(), when given, is asked every few thousand SQLite
        steps; a true answer ends the query with sqlite3.OperationalError("interrupted")."""
        conn = self._reader()
        conn.set_progress_handler(interrupt, 5_000)
        cursor = conn.execute(sql, params)
        try:
            for row in cursor:
                yield dict(row)
        finally:
            cursor.close()  # ends the read transaction, also when the caller stops early
            conn.set_progress_handler(None, 0)

    def query(self, sql: str, params: tuple = (), interrupt=None) -> list[dict]:
        return list(self.rows(sql, params, interrupt))

    def metric_types(self) -> list[dict]:
        """Every metric type with its kind, unit, label keys and point count."""
        out = self.query("SELECT d.*, (SELECT COUNT(*) FROM points p WHERE p.metric_type = "
                         "d.metric_type) AS points FROM metric_descriptors d ORDER BY metric_type")
        for row in out:
            row["label_keys"] = self.label_keys(row["metric_type"])
        return out

    def label_keys(self, metric_type: str) -> list[str]:
        """Every attribute key the points of a metric type carry, sorted."""
        try:
            return [r["key"] for r in self.query(
                "SELECT key FROM metric_labels WHERE metric_type = ? ORDER BY key",
                (metric_type,))]
        except sqlite3.OperationalError:  # a file from before the table: read the points
            keys: set = set()
            for r in self.rows("SELECT DISTINCT attributes FROM points WHERE metric_type = ?",
                               (metric_type,)):
                keys |= set(json.loads(r["attributes"]))
            return sorted(keys)

    def points(self, metric_type: str, where: dict | None = None) -> list[dict]:
        """Points of one metric type (attributes and resource decoded), oldest first, filtered
        in SQL by exact attribute values (None: the attribute is absent)."""
        sql = ("SELECT p.*, r.attributes AS resource FROM points p JOIN resources r ON "
               "r.id = p.resource_id WHERE metric_type = ?")
        params: list = [metric_type]
        for key, value in (where or {}).items():
            if not isinstance(key, str) or '"' in key or "\\" in key or \
                    not isinstance(value, (str, int, float, bool, type(None))):
                raise ValueError(f"where={{{key!r}: {value!r}}} is invalid: expected attribute "
                                 "keys without double quotes and str, number, bool or None values")
            sql += " AND json_extract(p.attributes, ?) IS ?"  # the key is a bound value
            params += [f'$."{key}"', value]
        rows = self.query(sql + " ORDER BY time_ns, p.id", tuple(params))
        for row in rows:
            row["attributes"] = json.loads(row["attributes"])
            row["resource"] = json.loads(row["resource"])
            for key in ("bounds", "bucket_counts", "exponential"):
                if row[key] is not None:
                    row[key] = json.loads(row[key])
        return rows

    def spans(self, trace_id: str | None = None) -> list[dict]:
        """The spans of one trace (or of the store), oldest first, as a list; iter_spans
        streams them instead (a store of a long run holds millions)."""
        return list(self.iter_spans(trace_id))

    def iter_spans(self, trace_id: str | None = None):
        """The spans, oldest first, one at a time: what spans() lists, in constant memory."""
        sql = ("SELECT s.*, r.attributes AS resource FROM spans s JOIN resources r ON "
               "r.id = s.resource_id")
        for row in self.rows(sql + (" WHERE trace_id = ?" if trace_id else "")
                             + " ORDER BY start_ns", (trace_id,) if trace_id else ()):
            row["attributes"] = json.loads(row["attributes"])
            row["resource"] = json.loads(row["resource"])
            row["events"] = json.loads(row["events"])
            yield row
