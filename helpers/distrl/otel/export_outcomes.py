"""What each OTLP exporter's exports came to: a process counts the exports its collector took
and refused, so a refusal (a missing token, say) is reported by the run it belongs to, not only
as a log line that lands wherever the process's output is printed.

    exporter = CountedExporter(OTLPSpanExporter(...), "spans")
    ...
    exporter.outcome()   # {'signal': 'spans', 'exported': 12, 'failed': 0, 'error': None}

The OTLP exporters say why an export failed only in their log, during the export call; the
counter takes the reason from that call's own "Failed to export ..." record, on its thread.
"""

from __future__ import annotations

import logging
import threading

# The loggers whose records say why an export failed (the SDK's gRPC and HTTP exporters).
FAILURE_LOGGERS = ("opentelemetry.exporter.otlp.proto.grpc.exporter",
                   "opentelemetry.exporter.otlp.proto.http.metric_exporter",
                   "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                   "opentelemetry.exporter.otlp.common.http")


class _FailureOfThisCall(logging.Filter):
    """Notes the "Failed to export" record of the export running on this thread. A filter
    first in the logger's list, so that it sees every record, also those that the exporters'
    own DuplicateFilter and the rate limit of conventions.quiet_exporter_logs then drop."""

    def __init__(self):
        super().__init__()
        self.calls = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(self.calls, "listening", False) and record.levelno >= logging.ERROR:
            try:
                text = record.getMessage()
            except Exception:  # a record that cannot be formatted says nothing here
                return True
            if text.startswith("Failed to export"):
                self.calls.failure = text
        return True

    def around(self, export):
        """Run export(); returns (its result, the failure it logged or None)."""
        self.calls.listening, self.calls.failure = True, None
        try:
            return export(), self.calls.failure
        finally:
            self.calls.listening = False


_FAILURES = _FailureOfThisCall()


def _listen_for_failures() -> None:
    for name in FAILURE_LOGGERS:
        logger = logging.getLogger(name)
        if _FAILURES not in logger.filters:
            logger.filters.insert(0, _FAILURES)


class CountedExporter:
    """An OTLP metric or span exporter that counts its exports' results and keeps the first
    failure's reason; everything else (temporality, aggregation, shutdown, force_flush) is the
    wrapped exporter's."""

    def __init__(self, exporter, signal: str):
        if signal not in ("metrics", "spans"):
            raise ValueError(f"signal={signal!r} is invalid: expected 'metrics' or 'spans'")
        _listen_for_failures()
        self._exporter, self.signal = exporter, signal
        self._lock = threading.Lock()
        self.exported = self.failed = 0
        self.error: str | None = None

    def export(self, *args, **kwargs):
        result, failure = _FAILURES.around(lambda: self._exporter.export(*args, **kwargs))
        with self._lock:
            if result.name == "SUCCESS":
                self.exported += 1
            else:
                self.failed += 1
                self.error = self.error or failure
        return result

    def outcome(self) -> dict:
        with self._lock:
            return {"signal": self.signal, "exported": self.exported, "failed": self.failed,
                    "error": self.error}

    def __getattr__(self, name):  # the SDK reads _preferred_temporality and the like
        return getattr(self._exporter, name)


def refusals(outcomes: dict[str, list[dict]]) -> list[str]:
    """One sentence for each process whose exports were refused, from {process: outcomes}."""
    said = []
    for process, counted in sorted(outcomes.items()):
        failed = [o for o in counted if o["failed"]]
        if failed:
            what = ", ".join(f"{o['failed']} of {o['failed'] + o['exported']} {o['signal']} "
                             "exports" for o in failed)
            error = next((o["error"] for o in failed if o["error"]), None)
            said.append(f"{process}: {what} failed" + (f" ({error})" if error else ""))
    return said
