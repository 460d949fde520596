"""The collector's receivers: OTLP over gRPC and HTTP, and the MetricService reads, each
answered within its own turns (exports, readers in processes of their own), so that no kind
of call, slow client or hostile one takes another's capacity."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import itertools
import socket
import threading
import time
import zlib
from concurrent import futures
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from distrl.otel import monitoring, writes
from distrl.otel.filters import Refused
from distrl.otel.limits import (
    MAX_HTTP_CONNECTIONS,
    READ_QUEUE,
    READ_TURN_S,
    READER_CANCEL_S,
    READER_START_S,
    RECEIVING_CALLS,
    UNREAD_ANSWER_BYTES,
    UNREAD_PER_CONNECTION,
    Limits,
    MiB,
)
from distrl.otel.points import MAX_ERROR_CHARS, StorageUnavailable
from distrl.otel.store import CollectorStore


def _stored(write, request_type, raw: bytes) -> tuple[grpc.StatusCode | None, object]:
    """Parse and store one Export (in an export thread): (None, what write returned), or a
    status and its message: INVALID_ARGUMENT for a message that does not parse, UNAVAILABLE
    (the exporter retries) when the storage failed, INTERNAL naming any other error."""
    try:
        request = request_type.FromString(raw)
    except DecodeError as err:
        return grpc.StatusCode.INVALID_ARGUMENT, f"not a {request_type.__name__}: {err}"
    try:
        return None, write(request)
    except StorageUnavailable as err:
        return grpc.StatusCode.UNAVAILABLE, str(err)[:MAX_ERROR_CHARS]
    except Exception as err:  # noqa: BLE001 (the client gets the reason, not UNKNOWN)
        return (grpc.StatusCode.INTERNAL,
                f"the request could not be stored: {err!r}"[:MAX_ERROR_CHARS])


# A call's one message must arrive within this time of its start, or the call is cancelled:
# a client that sends headers and then nothing (or a trickle) holds no slot for longer.
MESSAGE_WAIT_S = 5.0
# A reader process's CPU priority (nice): ingestion goes first. 19, not 10: beside 2 loops of
# whole reads, exports' p99 was 3.2-4.5x alone at 10, 2.3-2.4x at 19 (beside 40 loops reading
# 20,000 series 3.4-3.5x, and 2.1-3.7x; `python benchmarks/collector_under_load.py`, 2-3 runs
# each). Reads then yield to Ray's workers (nice 15).
READ_NICE = 19


class _Reader:
    def __init__(self, process, conn, reader_id: int):
        self.process, self.conn, self.id = process, conn, reader_id
        self.ready = False  # it has answered once: its imports are done


async def _answer_ready(reader: _Reader, seconds: float) -> bool:
    """Waits, without a thread, until the reader's answer can be read; False after seconds."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = reader.conn.fileno()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(True))
    try:
        return await asyncio.wait_for(ready, seconds)
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)


class _Readers:
    """The processes that answer MetricService reads (monitoring.reader_main): up to
    max_queries, each started at its first read and kept, one read at a time each. Up to
    READ_QUEUE reads wait READ_TURN_S for a free one (a coroutine each, no thread), more are
    answered RESOURCE_EXHAUSTED at once. A page token names the reader that keeps its result,
    and the next page goes to that one. A read whose client goes away tells its reader, which
    stops at its next check; one that outlives its deadline, or whose process died, ends with
    its process, and a new one takes its place at the next read. Runs on the server's loop."""

    def __init__(self, db_path: Path, limits: Limits):
        self.db_path, self.limits = str(db_path.resolve()), limits
        self.idle: list[_Reader] = []
        self.freed: asyncio.Condition | None = None  # made on the loop
        self.started, self.waiting, self.all = 0, 0, []
        self.ids = itertools.count()
        import multiprocessing

        # Set while the store starts a log that reads keep growing again (_checkpoint_loop).
        self.interrupt = multiprocessing.get_context("spawn").Event()
        self.cancelled = 0  # reads whose client went away (tests and benchmarks read it)
        self.unread = 0  # bytes of answers their clients have not taken yet
        self.unread_of: dict[str, int] = {}  # the same, per connection (its peer)

    def _take(self, prefer: int | None) -> _Reader | None:
        """An idle reader: the one that holds the pages of a page token (prefer) while it
        lives, else any; None when there is none to take now."""
        if any(r.id == prefer for r in self.all):
            ours = [r for r in self.idle if r.id == prefer]
            if ours:
                self.idle.remove(ours[0])
            return ours[0] if ours else None
        return self.idle.pop() if self.idle else None

    async def _turn(self, prefer: int | None = None) -> _Reader | None:
        if self.freed is None:
            self.freed = asyncio.Condition()
        reader = self._take(prefer)
        if reader is not None:
            return reader
        if self.started < self.limits.max_queries and not any(r.id == prefer
                                                               for r in self.all):
            self.started += 1
            # Spawning takes tens of ms: not on the loop. A cancelled call does not stop it.
            start = asyncio.get_running_loop().run_in_executor(None, self._start)
            try:
                return await asyncio.shield(start)
            except asyncio.CancelledError:
                start.add_done_callback(self._started_late)
                raise
            except BaseException:
                self.started -= 1
                raise
        if self.waiting >= READ_QUEUE:
            return None
        self.waiting += 1
        taken: list[_Reader] = []

        def took() -> bool:  # taken where it is seen free: a read arriving meanwhile cannot
            reader = self._take(prefer)  # take it between the notice and this call's turn
            if reader is not None:
                taken.append(reader)
            return bool(taken)

        try:
            async with self.freed:
                await asyncio.wait_for(self.freed.wait_for(took), READ_TURN_S)
        except TimeoutError:  # the one with the pages stays busy: any other recomputes them
            return taken[0] if taken else self._take(None)
        except asyncio.CancelledError:
            if taken:
                self._free(taken[0])
            raise
        finally:
            self.waiting -= 1
        return taken[0]

    def _free(self, reader: _Reader | None = None) -> None:
        """The reader is idle again (None: one ended); waiting reads look again. The notice
        is a task of its own: a call cancelled meanwhile cannot lose it."""
        if reader is not None:
            self.idle.append(reader)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self.freed:
            self.freed.notify_all()

    def _started_late(self, start) -> None:
        """A reader started for a read whose client went away meanwhile: idle once up."""
        if start.cancelled() or start.exception() is not None:
            self.started -= 1
        else:
            self._free(start.result())

    def _start(self) -> _Reader:
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # a fork would copy gRPC's threads
        conn, child = context.Pipe()
        reader_id = next(self.ids)
        process = context.Process(target=monitoring.reader_main, daemon=True,
                                  args=(child, functools.partial(CollectorStore, self.db_path,
                                                                 limits=self.limits), READ_NICE,
                                        self.interrupt, reader_id),
                                  name="collector-reader")
        process.start()
        child.close()
        reader = _Reader(process, conn, reader_id)
        self.all.append(reader)
        return reader

    def _end(self, reader: _Reader) -> None:
        reader.process.kill()
        reader.process.join(5)
        reader.conn.close()
        self.started -= 1
        self.all.remove(reader)
        self._free()  # reads that waited for it

    async def answer(self, method: str, request: bytes, context):
        reader = await self._turn(monitoring.token_reader(method, request))
        if reader is None:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{self.limits.max_queries} queries are running and "
                                f"{READ_QUEUE} waiting; retry shortly")
        peer = context.peer()
        if self.unread_of.get(peer, 0) >= UNREAD_PER_CONNECTION:
            self._free(reader)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{self.unread_of[peer] / MiB:.0f} MiB of answers wait for this "
                                "connection to read them; read them, then retry")
        if self.unread >= UNREAD_ANSWER_BYTES:
            self._free(reader)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{self.unread / MiB:.0f} MiB of answers wait for their "
                                "clients to read them; retry shortly")
        remaining = context.time_remaining()
        seconds = min(self.limits.max_query_s, self.limits.max_query_s if remaining is None
                      else max(remaining, 0.0))
        try:
            reader.conn.send((method, request, seconds))
            # A new reader first imports what it needs; then the read has its deadline.
            ready = await _answer_ready(reader, seconds + 5 + (0 if reader.ready
                                                                else READER_START_S))
            code, payload = reader.conn.recv() if ready else (None, None)
        except asyncio.CancelledError:  # the client went away (or the server stops)
            self.cancelled += 1
            asyncio.get_running_loop().create_task(self._after_cancel(reader))
            raise
        except (EOFError, OSError):  # the reader died (killed, out of memory)
            self._end(reader)
            code, payload = (grpc.StatusCode.UNAVAILABLE.value[0],
                             "the collector's reader process ended; retry")
        else:
            if ready:
                reader.ready = True
                self._free(reader)
            else:
                self._end(reader)
                code, payload = (grpc.StatusCode.DEADLINE_EXCEEDED.value[0],
                                 f"the query ran past its deadline of {seconds:.1f} s")
        if code:
            await context.abort(_STATUS_OF[code], payload if len(payload) <= 400
                                else payload[:400] + "...")
        self.unread += len(payload)
        self.unread_of[peer] = self.unread_of.get(peer, 0) + len(payload)
        context.add_done_callback(functools.partial(self._taken, peer, len(payload)))
        return payload

    def _taken(self, peer: str, size: int, _context) -> None:
        """An answer's call ended: its client read it, or went away."""
        self.unread -= size
        self.unread_of[peer] -= size
        if not self.unread_of[peer]:
            del self.unread_of[peer]

    async def _after_cancel(self, reader: _Reader) -> None:
        """Tell the reader its client went away; it answers CANCELLED at its next check and
        is free again. One that does not answer in READER_CANCEL_S is killed."""
        try:
            reader.conn.send("cancel")
            if await _answer_ready(reader, READER_CANCEL_S + (0 if reader.ready else
                                                              READER_START_S)):
                reader.conn.recv()
                reader.ready = True
                self._free(reader)
                return
        except (EOFError, OSError):
            pass
        self._end(reader)

    def stop(self) -> None:
        for reader in list(self.all):
            with contextlib.suppress(OSError):
                reader.conn.send(None)
        for reader in list(self.all):
            reader.process.join(2)
            if reader.process.is_alive():
                reader.process.kill()
                reader.process.join(5)
            reader.conn.close()
        self.all.clear()


_STATUS_OF = {code.value[0]: code for code in grpc.StatusCode}


class Calls:
    """Every gRPC method of the collector, on one asyncio loop: a call that waits (for its
    message, for a reader) is a coroutine, not a thread, so no kind of call can take another's
    capacity. A call first receives its one message within MESSAGE_WAIT_S; then an export
    takes one of max_exports turns, stored in a thread of its own, and a read one of the
    readers (_Readers). Without a turn a call is answered RESOURCE_EXHAUSTED (exporters retry
    it)."""

    def __init__(self, store: CollectorStore):
        limits = store.limits
        self.limits, self.exporting = limits, 0
        self.writers = futures.ThreadPoolExecutor(limits.max_exports,
                                                  thread_name_prefix="collector-export")
        self.readers = _Readers(store.path, limits)
        store.interrupt_reads = self.readers.interrupt
        otlp = {
            "opentelemetry.proto.collector.metrics.v1.MetricsService": (
                metrics_service_pb2.ExportMetricsServiceRequest, "metrics", store.write_metrics),
            "opentelemetry.proto.collector.trace.v1.TraceService": (
                trace_service_pb2.ExportTraceServiceRequest, "traces", store.write_spans)}
        self.handlers = [grpc.method_handlers_generic_handler(service, {"Export": self._handler(
            functools.partial(self._export, kind, write, request_type))})
            for service, (request_type, kind, write) in otlp.items()]
        self.store = store
        written = {"DeleteMetricDescriptor": self._delete,  # by the writer; the rest: readers
                   "CreateMetricDescriptor": self._create_descriptor,
                   "CreateTimeSeries": self._create_series}
        self.handlers.append(grpc.method_handlers_generic_handler(monitoring.SERVICE, {
            method: self._handler(written.get(method) or functools.partial(self.readers.answer,
                                                                           method))
            for method in monitoring.METHODS}))

    @staticmethod
    def _handler(function):
        async def handle(requests, context):
            try:
                request = await asyncio.wait_for(context.read(), MESSAGE_WAIT_S)
            except TimeoutError:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                    f"no request message within {MESSAGE_WAIT_S:g} s")
            if request is grpc.aio.EOF:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call sent no message")
            return await function(request, context)

        return grpc.stream_unary_rpc_method_handler(
            handle, response_serializer=lambda m: m if isinstance(m, bytes) else m.SerializeToString())

    async def _export(self, kind, write, request_type, request: bytes, context):
        # An export does not wait for a turn: its message is held meanwhile.
        if self.exporting >= self.limits.max_exports:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{self.limits.max_exports} exports are running; retry shortly")
        self.exporting += 1
        try:
            code, stored = await asyncio.get_running_loop().run_in_executor(
                self.writers, _stored, write, request_type, request)
        finally:
            self.exporting -= 1
        if code is not None:
            await context.abort(code, stored)
        return _response(kind, stored)

    async def _write(self, check, write, request: bytes, context):
        """A MetricService write call: its request checked here (check: Refused names the
        fault), then write(checked) by the store's writer, committed as an export is."""
        try:
            checked = check(request)
        except Refused as err:
            await context.abort(err.code, str(err))
        try:
            return await asyncio.get_running_loop().run_in_executor(self.writers, write,
                                                                    checked)
        except StorageUnavailable as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        except Refused as err:
            await context.abort(err.code, str(err)[:MAX_ERROR_CHARS])

    async def _delete(self, request: bytes, context):
        """DeleteMetricDescriptor: the type's descriptor, label keys and points go (a client
        that filled a cap with junk types or label keys frees it so). google.protobuf.Empty
        in reply."""
        deleted = await self._write(monitoring.deletable_type, self.store.delete_metric_type,
                                    request, context)
        if deleted is None:
            metric_type = monitoring.deletable_type(request)
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"no metric descriptor {metric_type[:200]}")
        return b""

    async def _create_descriptor(self, request: bytes, context):
        """CreateMetricDescriptor (writes.py): the descriptor as stored in reply."""
        return await self._write(writes.descriptor_to_create, functools.partial(
            self.store.write_with, writes.insert_descriptor), request, context)

    async def _create_series(self, request: bytes, context):
        """CreateTimeSeries (writes.py): google.protobuf.Empty when every series was written;
        else the others are kept and the call is INVALID_ARGUMENT naming each that was not."""
        refusals = await self._write(writes.series_to_create, functools.partial(
            self.store.write_with, writes.insert_series), request, context)
        if refusals:  # each cut short, and at most 10 named (a request has up to 200)
            named = "; ".join(r[:MAX_ERROR_CHARS] for r in refusals[:10])
            more = f"; and {len(refusals) - 10} more" if len(refusals) > 10 else ""
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"One or more TimeSeries could not be written: {named}{more}")
        return b""

    def stop(self) -> None:
        self.writers.shutdown(wait=True)
        self.readers.stop()


def _response(kind: str, stored: tuple[int, int, str]):
    """The Export reply of either receiver: partial_success names what was refused."""
    _, rejected, error = stored
    if kind == "metrics":
        response = metrics_service_pb2.ExportMetricsServiceResponse()
        if rejected:
            response.partial_success.rejected_data_points = rejected
    else:
        response = trace_service_pb2.ExportTraceServiceResponse()
        if rejected:
            response.partial_success.rejected_spans = rejected
    if rejected:
        response.partial_success.error_message = error
    return response


_HTTP_ROUTES = {"/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest, "metrics"),
                "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest, "traces")}


def http_handler(store: CollectorStore, token: str | None) -> type:
    """The OTLP/HTTP request handler of one server: _OtlpHttp with this store, token and
    turns."""
    return type("Handler", (_OtlpHttp,), {
        "store": store, "expected": f"Bearer {token}".encode() if token else None,
        "receiving": threading.BoundedSemaphore(RECEIVING_CALLS),
        "turns": threading.BoundedSemaphore(store.limits.max_exports)})


class _OtlpHttp(BaseHTTPRequestHandler):
    """OTLP/HTTP, binary protobuf, plain or gzip (opentelemetry.io/docs/specs/otlp/#otlphttp):
    the same writes as the gRPC services; 400 for a body that does not parse, 401 without the
    bearer token (when one is set), 408 for a body not received within MESSAGE_WAIT_S, 503
    with Retry-After (the exporter retries) when storage failed, RECEIVING_CALLS bodies are
    arriving or max_exports are being stored. A body is received before it asks for a turn,
    so a slow client holds none. HTTP/1.1: an exporter keeps its connection."""

    timeout = 30  # a client that sends no request line does not hold a thread forever
    protocol_version = "HTTP/1.1"
    store: CollectorStore  # these four: http_handler's
    expected: bytes | None
    receiving: threading.BoundedSemaphore
    turns: threading.BoundedSemaphore
    server: OtlpHttpServer

    def handle_one_request(self):
        self.server.awaiting_head(self.connection)  # until parse_request has its headers
        super().handle_one_request()

    def parse_request(self):  # reads the request line's headers
        parsed = super().parse_request()
        self.server.head_received(self.connection)
        return parsed

    def do_POST(self):  # noqa: N802 (http.server's method name)
        refused = self._refusal()
        if refused:
            return self._reply(*refused)
        body = self._receive(int(self.headers["Content-Length"]))
        if isinstance(body, tuple):
            return self._reply(*body)
        if not self.turns.acquire(blocking=False):
            return self._reply(HTTPStatus.SERVICE_UNAVAILABLE,
                               f"{self.store.limits.max_exports} exports are being stored; "
                               "retry".encode())
        try:
            self._export(_HTTP_ROUTES[self.path.split("?")[0]], body)
        finally:
            self.turns.release()

    def _refusal(self) -> tuple[HTTPStatus, bytes] | None:
        """Why the headers alone refuse the request, or None."""
        if self.expected and not hmac.compare_digest(
                self.headers.get("Authorization", "").encode(), self.expected):
            return HTTPStatus.UNAUTHORIZED, b"missing or wrong bearer token"
        if self.path.split("?")[0] not in _HTTP_ROUTES:
            return HTTPStatus.NOT_FOUND, b"POST /v1/metrics or /v1/traces"
        if self.headers.get("Content-Type", "").split(";")[0] != "application/x-protobuf":
            return (HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                    b"Content-Type must be application/x-protobuf")
        if self._encoding() not in ("identity", "gzip"):
            return (HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Encoding "
                    f"{self._encoding()[:40]!r} is not accepted; send gzip or none".encode())
        length, most = self.headers.get("Content-Length", ""), self.store.limits.max_message_bytes
        if not length.isdigit() or int(length) > most:
            return (HTTPStatus.REQUEST_ENTITY_TOO_LARGE if length.isdigit()
                    else HTTPStatus.LENGTH_REQUIRED, f"Content-Length up to {most} bytes".encode())
        return None

    def _encoding(self) -> str:
        return self.headers.get("Content-Encoding", "identity").strip().lower()

    def _receive(self, length: int) -> bytes | tuple[HTTPStatus, bytes]:
        """The body (one of RECEIVING_CALLS at once), or the reply refusing it."""
        if not self.receiving.acquire(blocking=False):
            return (HTTPStatus.SERVICE_UNAVAILABLE,
                    f"{RECEIVING_CALLS} bodies are arriving; retry".encode())
        try:
            body = self._body(length)
        finally:
            self.receiving.release()
        if body is None:
            return (HTTPStatus.REQUEST_TIMEOUT,
                    f"the body did not arrive within {MESSAGE_WAIT_S:g} s".encode())
        return body

    def _export(self, route, body: bytes):
        if self._encoding() == "gzip":
            body = self._inflate(body)
            if isinstance(body, tuple):
                return self._reply(*body)
        message_type, kind = route
        request = message_type()
        try:
            request.ParseFromString(body)
        except DecodeError as err:
            return self._reply(HTTPStatus.BAD_REQUEST, f"not an OTLP message: {err}".encode())
        try:
            write = self.store.write_metrics if kind == "metrics" else self.store.write_spans
            response = _response(kind, write(request))
        except StorageUnavailable as err:
            return self._reply(HTTPStatus.SERVICE_UNAVAILABLE, str(err).encode())
        except Exception as err:  # noqa: BLE001 (the client gets the reason)
            return self._reply(HTTPStatus.INTERNAL_SERVER_ERROR,
                               f"the request could not be stored: {err!r}"[:300].encode())
        self._reply(HTTPStatus.OK, response.SerializeToString(), "application/x-protobuf")

    def _inflate(self, body: bytes) -> bytes | tuple[HTTPStatus, bytes]:
        """A gzip body inflated, up to max_message_bytes; or the reply refusing it."""
        most = self.store.limits.max_message_bytes
        inflate = zlib.decompressobj(wbits=31)  # gzip framing
        try:
            body = inflate.decompress(body, most + 1)
        except zlib.error as err:
            return HTTPStatus.BAD_REQUEST, f"not gzip: {err}".encode()
        if len(body) > most:
            return (HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"the body inflates past {most} bytes".encode())
        if not inflate.eof:
            return HTTPStatus.BAD_REQUEST, b"the gzip body is truncated"
        return body

    def _body(self, length: int) -> bytes | None:
        """The body, or None when it takes longer than MESSAGE_WAIT_S in all (a client
        sending a byte now and then holds a turn no longer)."""
        deadline, chunks = time.monotonic() + MESSAGE_WAIT_S, []
        try:
            while length:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.connection.settimeout(remaining)
                chunk = self.rfile.read1(min(length, MiB))
                if not chunk:
                    return None
                chunks.append(chunk)
                length -= len(chunk)
        except OSError:  # the socket's timeout, or the client went away
            return None
        finally:
            self.connection.settimeout(self.timeout)
        return b"".join(chunks)

    def _reply(self, status: HTTPStatus, body: bytes, content_type: str = "text/plain"):
        if status != HTTPStatus.OK:  # a body may be left unread: not the next request
            self.close_connection = True
        try:
            self.send_response(status)
            if status == HTTPStatus.SERVICE_UNAVAILABLE:
                self.send_header("Retry-After", "1")
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client went away: nothing to tell it
            self.close_connection = True

    def log_message(self, *args):  # no line per request on stderr
        pass


class OtlpHttpServer(ThreadingHTTPServer):
    """At most MAX_HTTP_CONNECTIONS connections, each a thread and a file: a client that opens
    many and sends their request heads a byte at a time (a slowloris) took the collector to
    its limit of 1,024 open files, and reads failed. Past the cap a new connection is taken in
    place of the one that has waited longest for a request head (an exporter sends its head at
    once); when none waits, the new one is closed."""

    request_queue_size = 128  # the listen backlog: 5 by default, too few for a burst of exporters
    daemon_threads = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.live: set = set()
        self.waiting: dict = {}  # connection -> since when it waits for a request head
        self.lock = threading.Lock()

    def awaiting_head(self, connection) -> None:
        with self.lock:
            self.waiting[connection] = time.monotonic()

    def head_received(self, connection) -> None:
        with self.lock:
            self.waiting.pop(connection, None)

    def process_request(self, request, client_address):
        with self.lock:
            full = len(self.live) >= MAX_HTTP_CONNECTIONS
            oldest = min(self.waiting, key=self.waiting.get, default=None) if full else None
            if oldest is not None:
                del self.waiting[oldest]
            if not full or oldest is not None:
                self.live.add(request)
                self.waiting[request] = time.monotonic()
        if full and oldest is None:  # every connection is sending a body or being answered
            self.shutdown_request(request)
            return
        if oldest is not None:
            with contextlib.suppress(OSError):  # its handler reads the end, and closes it
                oldest.shutdown(socket.SHUT_RDWR)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self.lock:
            self.live.discard(request)
            self.waiting.pop(request, None)
        super().shutdown_request(request)


async def _deny(requests, context):
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")


class BearerToken(grpc.aio.ServerInterceptor):
    """Every gRPC call needs `authorization: Bearer <token>` metadata (what OTel exporters send
    with OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20<token>)."""

    def __init__(self, token: str):
        self.expected = f"Bearer {token}".encode()
        # Refused at the headers: a handler that takes a request stream need not wait for
        # the message.
        self.deny = grpc.stream_unary_rpc_method_handler(_deny)

    async def intercept_service(self, continuation, details):
        got = dict(details.invocation_metadata).get("authorization", "")
        if hmac.compare_digest(str(got).encode(), self.expected):
            return await continuation(details)
        return self.deny
