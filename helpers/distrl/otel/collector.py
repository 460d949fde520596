"""The local observability backend: OTLP/gRPC (and, when asked, OTLP/HTTP) in, SQLite out.

    with LocalCollector("runs/otel.db", port=4317) as collector:   # a child process; or in a
                                                                   # shell: distrl collector --db
        ...  # any OpenTelemetry SDK exporting over OTLP/gRPC to localhost:4317 lands here
    store = CollectorStore("runs/otel.db")
    store.metric_types()                   # prometheus.googleapis.com/rl.loop.duration/histogram, ...

Every point and span of a request is committed to SQLite (one file, WAL) before the Export
call is acknowledged. Metrics are stored under the metric types Cloud Monitoring gives them
through GKE Managed OpenTelemetry: the OTel name keeps its dots and gets its kind appended
(`/histogram`, `/counter` for monotonic sums, `/gauge` for gauges and non-monotonic sums).
A point that is exported twice (an exporter retry) is stored once; a second, different value
of a series at a stored time is refused, as is a point that no read could use (a summary, a
non-finite value, buckets beyond a double): each in the reply's partial_success, naming it.

No client takes the exports' capacity: the gRPC receiver runs on one asyncio loop, where a
call waiting for its message or a reader holds no thread; a call has MESSAGE_WAIT_S to send its
message before it takes a turn (exports and reads each have their own), a caller without the
token (when one is set) is refused at its headers, and a failed commit (a full disk) is
answered UNAVAILABLE, which exporters retry. One collector writes a database (store_file.lock_writer).

With http_port, the same store also takes OTLP/HTTP with protobuf bodies (POST /v1/metrics,
/v1/traces: what GKE's managed collector documents on its port 4318).

The gRPC port answers the part of Cloud Monitoring's MetricService API that distrl.otel.monitoring
documents, so google-cloud-monitoring's own client reads what was stored.
"""


from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import re
import signal
import subprocess
import sys
import threading
from concurrent import futures
from http.server import ThreadingHTTPServer
from pathlib import Path

import grpc

from distrl.otel.limits import (
    CONNECTION_IDLE_S,
    STREAMS_PER_CONNECTION,
    Limits,
    add_limit_options,
    limit_argv,
    limits_from,
)
from distrl.otel.receivers import BearerToken, Calls, OtlpHttpServer, http_handler
from distrl.otel.store import CollectorStore
from distrl.otel.store_file import check_db_file
from distrl.otel.token import new_token_file, read_token, token_path
from distrl.stop_flag import StopFlag


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_port(port) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"port={port!r} is invalid: expected an integer in [0, 65535] "
                         "(0 picks a free port)")


class CollectorServer:
    """The OTLP/gRPC receiver (metrics and traces) storing into SQLite, in this process.

    Ray's own gRPC clients stall when a gRPC server runs in the same process, so notebooks
    and the training driver use LocalCollector, which runs this server in a child process.
    """

    def __init__(self, db_path: str | Path = "otel.db", *, host: str = "127.0.0.1",
                 port: int = 4317, http_port: int | None = None, allow_remote: bool = False,
                 token_file: str | Path | None = None, limits: Limits | None = None):
        _check_port(port)
        if http_port is not None:
            _check_port(http_port)
        if not is_loopback(host) and allow_remote is not True:
            raise ValueError(f"host={host!r} is not a loopback address: the collector has no "
                             "TLS, and anyone who reaches the port could write and read it; "
                             "pass allow_remote=True (--allow-remote), ideally with a "
                             "token_file, to listen there anyway")
        self.db_path = Path(db_path)
        self.host, self.port, self.http_port = host, port, http_port
        self.token = read_token(token_file) if token_file is not None else None
        self.limits = limits or Limits()
        self.store: CollectorStore | None = None
        self.calls: Calls | None = None
        self.server = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.http_server: ThreadingHTTPServer | None = None

    @property
    def http_endpoint(self) -> str | None:
        """OTLP/HTTP base URL (exporters add /v1/metrics, /v1/traces); None when not asked."""
        return None if self.http_port is None else f"http://{self.host}:{self.http_port}"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> CollectorServer:
        if not is_loopback(self.host):
            print(f"WARNING: the collector listens on {self.host}, beyond this machine, without "
                  "TLS; " + ("every call needs the bearer token" if self.token else
                             "WITHOUT a token: anyone who reaches it can write and read"),
                  file=sys.stderr, flush=True)
        self.store = CollectorStore(self.db_path, create=True, limits=self.limits)
        self.calls = Calls(self.store)
        self._loop = asyncio.new_event_loop()
        started: futures.Future = futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True,
                                        name="collector-grpc")
        self._thread.start()
        try:
            self.port = started.result(timeout=60)
        except BaseException:
            self.stop()
            raise
        if self.http_port is not None:
            try:
                self.http_server = OtlpHttpServer((self.host, self.http_port),
                                                       http_handler(self.store, self.token))
            except OSError as err:
                self.stop()
                raise OSError(f"cannot listen for OTLP/HTTP on {self.host}:{self.http_port}: "
                              f"{err}") from None
            self.http_port = self.http_server.server_address[1]
            threading.Thread(target=self.http_server.serve_forever, daemon=True).start()
        return self

    def _serve(self, started: futures.Future) -> None:
        """The gRPC server's thread: its asyncio loop, until stop()."""
        asyncio.set_event_loop(self._loop)
        try:
            self.server = self._loop.run_until_complete(self._start_grpc())
        except BaseException as err:  # noqa: BLE001 (start() raises it)
            started.set_exception(err)
            return
        started.set_result(self.port)
        self._loop.run_forever()

    async def _start_grpc(self):
        server = grpc.aio.server(
            interceptors=[BearerToken(self.token)] if self.token else [],
            # past it a call is refused at its headers (RESOURCE_EXHAUSTED)
            maximum_concurrent_rpcs=self.limits.max_calls(),
            options=[("grpc.max_receive_message_length", self.limits.max_message_bytes),
                     ("grpc.so_reuseport", 0),
                     # one connection cannot hold every call; an idle one is closed
                     ("grpc.max_concurrent_streams", STREAMS_PER_CONNECTION),
                     ("grpc.max_connection_idle_ms", CONNECTION_IDLE_S * 1000)])
        server.add_generic_rpc_handlers(self.calls.handlers)
        try:
            bound = server.add_insecure_port(f"{self.host}:{self.port}")
        except RuntimeError:
            bound = 0
        if not bound:
            raise OSError(f"cannot listen on {self.host}:{self.port}: is something else "
                          "listening there? (use another port, or port 0 for a free one)")
        self.port = bound
        await server.start()
        return server

    def stop(self, grace_s: float = 2.0) -> None:
        if self.http_server is not None:
            self.http_server.shutdown()
            self.http_server.server_close()
            self.http_server = None
        if self._thread is not None:
            if self.server is not None:
                with contextlib.suppress(futures.TimeoutError):
                    asyncio.run_coroutine_threadsafe(self.server.stop(grace_s),
                                                     self._loop).result(grace_s + 10)
                self.server = None
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None
            self._loop.close()
        if self.calls is not None:
            self.calls.stop()
            self.calls = None
        if self.store is not None:
            self.store.close()
            self.store = None


class LocalCollector:
    """The local collector as a child process: `with LocalCollector("otel.db") as c: ...`.

    start() returns once the child listens (c.endpoint has the real port when port=0);
    stop() ends it with SIGTERM after it has committed what it acknowledged.

    Every call must carry a bearer token: token_file "auto" (the default) writes a new one
    beside the database (c.token_file, <db>.token, readable by you alone) or takes the one
    there; a path takes that file; None asks for none (anyone on this machine could then write
    and read). Its clients take the file: ApexConfig(otlp_token_file=...),
    setup_telemetry(token_file=...), explore.Monitoring(token_file=...), or
    OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20<the file's token> for another exporter.
    """

    def __init__(self, db_path: str | Path = "otel.db", *, host: str = "127.0.0.1",
                 port: int = 4317, start_timeout_s: float = 30.0, http_port: int | None = None,
                 allow_remote: bool = False, token_file: str | Path | None = "auto",
                 limits: Limits | None = None):
        auto = token_file == "auto"  # (a Path is never equal to a str)
        # The server checks the same again; checked here too, so the error is raised here.
        CollectorServer(db_path, host=host, port=port, http_port=http_port,
                        allow_remote=allow_remote, token_file=None if auto else token_file)
        self.db_path = Path(db_path)
        self.host, self.port, self.http_port = host, port, http_port
        self.allow_remote, self._new_token = allow_remote, auto
        self.token_file = (token_path(self.db_path) if auto
                           else None if token_file is None else Path(token_file))
        self.limits = limits or Limits()
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen | None = None
        self.banner = ""  # the child's "listening" line, once started

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def http_endpoint(self) -> str | None:
        """OTLP/HTTP base URL when started with http_port, else None."""
        return None if self.http_port is None else f"http://{self.host}:{self.http_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> LocalCollector:
        if self.running:
            return self
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        if self._new_token:
            new_token_file(self.token_file)
        cmd = [sys.executable, "-m", "distrl.otel.collector", "--db", str(self.db_path),
               "--host", self.host, "--port", str(self.port)]
        if self.http_port is not None:
            cmd += ["--http-port", str(self.http_port)]
        if self.allow_remote:
            cmd.append("--allow-remote")
        cmd += ["--no-token"] if self.token_file is None else ["--token-file", str(self.token_file)]
        cmd += [*limit_argv(self.limits), "--stop-with-parent", str(os.getpid())]
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
        line = _read_line(self.process.stdout, self.start_timeout_s)
        match = re.search(r"listening on http://[^:]+:(\d+)", line or "")
        if not match:
            self.process.kill()
            _, err = self.process.communicate(timeout=10)
            self.process = None
            raise OSError(f"the collector did not start: {(err or line or 'no output').strip()}")
        self.banner = line.strip()  # where it listens, and its limits
        self.port = int(match.group(1))
        if self.http_port is not None:
            self.http_port = int(re.search(r"OTLP/HTTP on http://[^:]+:(\d+)", line).group(1))
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            stream.close()
        self.process = None

    def store(self) -> CollectorStore:
        return CollectorStore(self.db_path)

    def __enter__(self) -> LocalCollector:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _read_line(stream, timeout_s: float) -> str | None:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return result[0] if result else None


def _stop_with_parent(pid: int, stopped: StopFlag, every_s: float = 0.5) -> None:
    """Set `stopped` once process pid is no longer the parent (it died, even by SIGKILL, and
    this process was handed to init or a subreaper)."""
    while not stopped.wait(every_s):
        if os.getppid() != pid:
            stopped.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="distrl collector",
                                     description="Receive OTLP/gRPC metrics and traces into SQLite; "
                                     "answer Cloud Monitoring MetricService queries on the same port.")
    parser.add_argument("--db", default="otel.db", help="SQLite file (created if missing)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=4317, help="port to listen on (0: any free)")
    parser.add_argument("--http-port", type=int, default=None,
                        help="also take OTLP/HTTP (protobuf) on this port (0: any free)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a --host other than loopback (no TLS: use --token-file)")
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token-file", default=None,
                       help="file holding the bearer token every call must send (default: "
                            "DB.token beside the database, made readable by you alone when "
                            "missing; OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%%20<token>)")
    token.add_argument("--no-token", action="store_true",
                       help="ask no call for a token: anyone on this machine can write and read")
    parser.add_argument("--stop-with-parent", type=int, default=None, metavar="PID",
                        help="stop when process PID is no longer this one's parent (LocalCollector "
                             "passes its own: a killed notebook kernel leaves no collector holding "
                             "the port and the database)")
    add_limit_options(parser)
    args = parser.parse_args(argv)
    # Reads are Python work holding the interpreter lock; a shorter switch interval than the
    # default 5 ms hands it to the writer and the export threads sooner.
    # `python benchmarks/collector_under_load.py` measures export p99 under query load.
    sys.setswitchinterval(0.001)
    # Handlers first: whoever reads the "listening" line may send SIGTERM at once. A flag with
    # no lock: threading.Event.set from a handler deadlocked when the signal came while this
    # thread held that Event's lock inside wait() (a SIGTERM right after the line, beside busy
    # loops: the collector never stopped, and LocalCollector.stop would have SIGKILLed it).
    stopped = StopFlag()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    try:
        limits = limits_from(args)
        options = dict(host=args.host, port=args.port, http_port=args.http_port,
                       allow_remote=args.allow_remote, limits=limits)
        CollectorServer(args.db, **options)  # the options and the database checked before a
        check_db_file(Path(args.db))         # token file is made beside it
        token_file = (None if args.no_token
                      else args.token_file or new_token_file(token_path(args.db)))
        collector = CollectorServer(args.db, token_file=token_file, **options).start()
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    http = f" and OTLP/HTTP on {collector.http_endpoint}" if collector.http_endpoint else ""
    asks = (f"every call must send the token in {Path(token_file).resolve()}" if token_file else
            "no token asked (--no-token)")
    print(f"collector listening on {collector.endpoint}{http}, storing into "
          f"{Path(args.db).resolve()}; {asks}; {limits.describe()}", flush=True)
    if args.stop_with_parent is not None:
        threading.Thread(target=_stop_with_parent, args=(args.stop_with_parent, stopped),
                         daemon=True, name="parent-watch").start()
    while not stopped.wait(3600.0):
        pass
    collector.stop()
    print("collector stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
