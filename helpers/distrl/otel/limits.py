"""What bounds a long-running collector: Limits (memory, reads, exports, the log), the
collector command's options for each, and the fixed caps beside them (calls still receiving,
reads waiting, answers not yet read)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from distrl.field_docs import field_help

MiB = 2**20

# Calls still receiving their message, at most, beside the admitted exports and reads (each a
# coroutine, holding at most one message); calls one HTTP/2 connection may have open; seconds
# after which an idle connection is closed.
# 8 calls a connection (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS: a client's further calls
# wait in the client, none is refused): at 32, three connections of calls that sent headers
# and no message held every slot of the server (maximum_concurrent_rpcs).
RECEIVING_CALLS, STREAMS_PER_CONNECTION, CONNECTION_IDLE_S = 32, 8, 300
# OTLP/HTTP connections at once, each a thread and an open file: a quarter of the common limit
# of 1,024 open files, so reads, the database and gRPC keep theirs (receivers.OtlpHttpServer).
MAX_HTTP_CONNECTIONS = 256
# gRPC takes message sizes as 32-bit integers; more than 256 threads is no local collector.
LIMIT_MAXIMA = {"max_message_bytes": 2**31 - 1, "max_exports": 256, "max_queries": 256}


@dataclass(frozen=True)
class Limits:
    """What bounds a long-running collector's memory and the cost of each read; printed at
    start. Memory stays under memory_bound_bytes() above the baseline of the collector and its
    reader processes: for each Export in flight on either receiver about 8 times its size
    (wire bytes, the parsed message, the rows; `python benchmarks/collector_under_load.py`
    measures it), max_read_bytes for each read, and the caches (tests/test_collector.py
    measures both)."""

    # Each docstring is also the help of the field's `distrl collector` option.
    # 4 MiB: gRPC's and the OpenTelemetry Collector's default; an SDK export is kilobytes.
    max_message_bytes: int = 4 * MiB
    """largest Export request taken, either receiver"""
    max_exports: int = 8
    """concurrent Export calls per receiver; more are refused (RESOURCE_EXHAUSTED, HTTP 503),
    which exporters retry"""
    max_queries: int = 2
    """concurrent reads; more get RESOURCE_EXHAUSTED"""
    cache_bytes: int = 16 * MiB
    """attribute and resource caches of the writer"""
    page_cache_bytes: int = 64 * MiB
    """results kept for their next pages"""
    max_rows_scanned: int = 2_000_000
    """points (or metric descriptors) one read may scan"""
    max_read_bytes: int = 128 * MiB
    """memory one read may hold (the series and points it has read, estimated as it reads)"""
    max_metric_types: int = 10_000
    """metric types the store takes; points of a new one past it are refused"""
    max_series_periods: int = 5_000_000
    """series x alignment periods of one ListTimeSeries"""
    max_query_s: float = 30.0
    """a read's own deadline in seconds (the client's, when shorter)"""
    max_wal_bytes: int = 128 * MiB
    """write-ahead log length the writer keeps to: it starts the log again from half this
    length when no read holds it, and past 4x stops the reads on it to do so (readers'
    overlapping snapshots kept it growing); a file that grew past 4x is cut back to it"""

    def __post_init__(self):
        for name in ("max_message_bytes", "max_exports", "max_queries", "cache_bytes",
                     "page_cache_bytes", "max_rows_scanned", "max_read_bytes", "max_metric_types",
                     "max_series_periods", "max_wal_bytes"):
            value, most = getattr(self, name), LIMIT_MAXIMA.get(name, 2**62)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
                if name.endswith("_bytes") and isinstance(value, (int, float)):
                    raise ValueError(f"{name}={value!r} ({value / MiB:g} MiB) is invalid: "
                                     f"expected 1 byte to {most / MiB:g} MiB")
                raise ValueError(f"{name}={value!r} is invalid: expected an integer from 1 to "
                                 f"{most:,}")
        if not isinstance(self.max_query_s, (int, float)) or not 0 < self.max_query_s < 3600:
            raise ValueError(f"max_query_s={self.max_query_s!r} is invalid: expected seconds "
                             "in (0, 3600)")

    def memory_bound_bytes(self) -> int:
        # Exports: about 8 times the message for each one stored at once, on either receiver
        # (`python benchmarks/collector_under_load.py` measures it); a call still receiving,
        # a read waiting for a reader, an HTTP body arriving: one message each. Reads: what
        # each may hold, and answers their clients have not read yet. Then the caches.
        receiving = self.max_queries + READ_QUEUE + 2 * RECEIVING_CALLS
        unread = UNREAD_ANSWER_BYTES + self.max_queries * ANSWER_MAX_BYTES
        return ((2 * self.max_exports * 8 + receiving) * self.max_message_bytes
                + self.max_queries * self.max_read_bytes + unread + self.cache_bytes
                + self.page_cache_bytes)

    def max_calls(self) -> int:
        """gRPC calls open at once: the admitted exports and reads, the reads waiting for a
        reader and the calls still receiving their message."""
        return self.max_exports + self.max_queries + READ_QUEUE + RECEIVING_CALLS

    def describe(self) -> str:
        return (f"limits: memory about {self.memory_bound_bytes() / MiB:,.0f} MiB at most above "
                f"the baseline; messages up to {self.max_message_bytes / MiB:g} MiB, "
                f"{self.max_exports} concurrent exports per receiver, {self.max_queries} "
                f"concurrent queries of at most {self.max_rows_scanned:,} points, "
                f"{self.max_read_bytes / MiB:g} MiB, {self.max_series_periods:,} series x "
                f"periods and {self.max_query_s:g} s, {self.max_metric_types:,} metric types, "
                f"caches {self.cache_bytes / MiB:g} MiB + pages {self.page_cache_bytes / MiB:g} "
                "MiB")


# Each Limits field as a command-line option of `distrl collector` (sizes in MiB), so that
# LocalCollector hands its child every limit it was given, not only some.
def _limit_flag(name: str) -> str:
    return "--" + (name.removesuffix("_bytes") + "_mib" if name.endswith("_bytes")
                   else name).replace("_", "-")


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    defaults, docs = Limits(), field_help(Limits)
    for f in dataclasses.fields(Limits):
        value = getattr(defaults, f.name)
        in_mib = f.name.endswith("_bytes")
        as_float = in_mib or isinstance(value, float)
        default = value / MiB if in_mib else value
        parser.add_argument(_limit_flag(f.name), dest=f.name, default=default,
                            type=float if as_float else int,
                            metavar="MIB" if in_mib else "S" if as_float else "N",
                            help=f"{' '.join(docs[f.name].split())} (default "
                                 f"{f'{default:g}' if as_float else f'{default:,}'}"
                                 f"{' MiB' if in_mib else ''})")


def limits_from(args: argparse.Namespace) -> Limits:
    """The Limits of parsed options; a bad value raises ValueError naming the limit."""
    return Limits(**{f.name: round(getattr(args, f.name) * MiB) if f.name.endswith("_bytes")
                     else getattr(args, f.name) for f in dataclasses.fields(Limits)})


def limit_argv(limits: Limits) -> list[str]:
    """The options that give a `distrl collector` process these limits (exact: MiB is a
    power of two, and repr() keeps every bit of a float)."""
    argv = []
    for f in dataclasses.fields(Limits):
        value = getattr(limits, f.name)
        argv += [_limit_flag(f.name), repr(value / MiB) if f.name.endswith("_bytes")
                 else repr(value)]
    return argv


# Reads waiting for a free reader, at most (more are refused at once), and how long each
# waits; how long a new reader process may take to import what it needs; how long a reader
# told that its client went away may take to stop before it is killed.
READ_QUEUE, READ_TURN_S, READER_START_S, READER_CANCEL_S = 32, 10.0, 60.0, 5.0
# Read answers not yet taken by their clients, in bytes: an answer waits in gRPC's buffers
# until its client reads it, and 200 clients that never read once held 700 MB. A read that
# gets its reader while this much waits is refused (RESOURCE_EXHAUSTED); the max_queries
# reads running may add one answer each, under the clients' 4 MiB (ANSWER_MAX_BYTES).
UNREAD_ANSWER_BYTES, ANSWER_MAX_BYTES = 32 * MiB, 4 * MiB
# Of them, what one connection may leave unread: a client that never reads (a zero
# flow-control window) filled the whole cap alone, and every other client's reads were refused.
UNREAD_PER_CONNECTION = UNREAD_ANSWER_BYTES // 4
