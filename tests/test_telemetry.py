"""setup_telemetry and the RL instruments, exported for real over OTLP/gRPC to the local collector."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from distrl.otel import conventions as otel
from distrl.otel.collector import LocalCollector

PREFIX = "prometheus.googleapis.com/"
COMMON = otel.common_attributes(run_id="run-1", algorithm="apex-dqn", environment="CartPole-v1",
                                model="dueling-mlp-64x64")


def test_the_23_conventions():
    assert len(otel.ATTRIBUTES) == len(set(otel.ATTRIBUTES)) == 23
    assert otel.RL_SYSTEM == "rl.system" and otel.RL_SYNC_DESTINATION == "rl.sync.destination"
    assert otel.RL_LOOP_ITERATION not in otel.COMMON_ATTRIBUTES
    assert set(otel.COMMON_ATTRIBUTES) == {"rl.system", "rl.system.version", "rl.run.id",
                                           "rl.algorithm", "rl.environment.name", "rl.model.name"}
    assert sorted(otel.LATENCY_HISTOGRAMS) == sorted(
        f"rl.{p}.duration" for p in ["loop", "sample", "reward", "train", "sync", "step"])
    assert len(otel.GAUGES) == 8 and len(otel.COUNTERS) == 4


@pytest.fixture
def collector(tmp_path):
    # The SDK's wiring, not the token (test_a_local_collector_asks_for_its_token_by_default)
    with LocalCollector(tmp_path / "otel.db", token_file=None, port=0) as c:
        yield c


def test_a_local_collector_asks_for_its_token_by_default(tmp_path):
    """Without a token any client on the machine could write and read the local collector, and
    fill its caps for good (issue 65). LocalCollector now writes a token beside its database
    by default, readable by its owner alone and kept for the next start on it. Its own clients
    send it (setup_telemetry, explore.Monitoring, and any exporter through its headers); a
    client without it is refused at its headers and stores nothing."""
    import grpc
    from google.api_core import exceptions as gexc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
    from test_collector import _gauges

    from distrl.otel import explore

    db = tmp_path / "otel.db"
    with LocalCollector(db, port=0) as c:
        assert c.token_file == tmp_path / "otel.db.token"
        assert c.token_file.stat().st_mode & 0o777 == 0o600
        token = c.token_file.read_text().strip()
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(c.endpoint.removeprefix("http://")))
        for metadata in ([], [("authorization", "Bearer " + "x" * 43)]):
            with pytest.raises(grpc.RpcError) as err:
                stub.Export(_gauges("nobody", 3), metadata=metadata, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        stub.Export(_gauges("owner", 3), metadata=[("authorization", f"Bearer {token}")],
                    timeout=10)
        tel = otel.setup_telemetry(endpoint=c.endpoint, token_file=c.token_file,
                                   instance_id="t", export_interval_ms=60_000)
        tel.meter.create_counter("token.sdk").add(2)
        tel.shutdown()
        assert c.store().points(PREFIX + "token.sdk/counter")[0]["int_value"] == 2
        mon = explore.Monitoring(endpoint=c.endpoint, token_file=c.token_file)
        types = {d.type for d in mon.client.list_metric_descriptors(name="projects/local")}
        assert {PREFIX + "owner/gauge", PREFIX + "token.sdk/counter"} <= types
        assert PREFIX + "nobody/gauge" not in types
        with pytest.raises(gexc.Unauthenticated):
            list(explore.Monitoring(endpoint=c.endpoint).client.list_metric_descriptors(
                name="projects/local", retry=None, timeout=10))
    with LocalCollector(db, port=0) as again:  # the same database, the same token
        assert again.token_file.read_text().strip() == token
    c.token_file.chmod(0o644)
    with pytest.raises(ValueError, match=r"otel.db.token.* is readable by others"):
        LocalCollector(db, port=0).start()
    with pytest.raises(ValueError, match="token_file=.* with project_id"):
        explore.Monitoring(project_id="my-project-id", token_file=c.token_file)


def test_a_refused_exporter_is_counted_and_the_runs_check_names_its_process(tmp_path):
    """Two processes of run r1 export to a collector that asks for its token: the driver sends
    it, actor-0 does not. actor-0's exporters count every export as failed, with the
    collector's own reason, and the run's check of the store names actor-0 (and only it) as
    having stored nothing, with that reason; the driver's points and spans are found."""
    from distrl.otel import explore

    with LocalCollector(tmp_path / "otel.db", port=0) as c:
        outcomes = {}
        for name, token_file in (("driver", c.token_file), ("actor-0", None)):
            tel = otel.setup_telemetry(endpoint=c.endpoint, token_file=token_file,
                                       instance_id=f"{name}-4242@host", export_interval_ms=60_000)
            rl = otel.RLInstruments(tel.meter, otel.common_attributes(
                run_id="r1", algorithm="apex-dqn", environment="CartPole-v1", model="m"))
            rl.add("rl.sample.samples", 5, rl.attrs({otel.RL_LOOP: name}))
            with tel.tracer.start_as_current_span(otel.SPAN_LOOP, attributes=rl.attrs()):
                pass
            tel.shutdown()
            outcomes[name] = tel.export_outcomes()
        assert [(o["signal"], o["exported"], o["failed"]) for o in outcomes["driver"]] == [
            ("metrics", 1, 0), ("spans", 1, 0)]
        assert [(o["signal"], o["exported"], o["failed"] > 0) for o in outcomes["actor-0"]] == [
            ("metrics", 0, True), ("spans", 0, True)]
        assert all("UNAUTHENTICATED" in o["error"] for o in outcomes["actor-0"])
        store = c.store()
        assert explore.check_every_process_reported(store, "r1", ["driver"], timeout_s=1) == {
            "driver": {"points": 1, "spans": 1}}
        with pytest.raises(explore.TelemetryLost, match=(
                r"run r1: no points or spans in the store from actor-0 \(1 of 2 processes "
                r"reported\): actor-0: 1 of 1 metrics exports, 1 of 1 spans exports failed "
                r"\(Failed to export metrics .*UNAUTHENTICATED")):
            explore.check_every_process_reported(store, "r1", ["driver", "actor-0"],
                                                 outcomes, timeout_s=0.5)
        with pytest.raises(explore.TelemetryLost, match="from evaluator .*reported no refusal"):
            explore.check_every_process_reported(store, "r1", ["evaluator"], timeout_s=0)
        with pytest.raises(ValueError, match=r"processes=\[\] names no process"):
            explore.check_every_process_reported(store, "r1", [])


def test_the_collector_command_asks_for_a_token_by_default(tmp_path):
    """`distrl collector` asked for a token only when given --token-file (issue 65): on the
    command line, as in LocalCollector, it now makes DB.token (readable by you alone) and asks
    every call for it, and says so; --no-token asks none, and the two are not taken together."""
    import grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
    from test_collector import _gauges

    def run(*options: str):
        command = subprocess.Popen([sys.executable, "-m", "distrl.otel.collector", "--db",
                                    str(tmp_path / "otel.db"), "--port", "0", *options],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = command.stdout.readline()  # its first line, once it listens (or its error)
        port = line.split("http://127.0.0.1:")[1].split(",")[0] if "listening" in line else ""
        stub = metrics_service_pb2_grpc.MetricsServiceStub(
            grpc.insecure_channel(f"127.0.0.1:{port}")) if port else None
        return command, line, stub

    token_file = tmp_path / "otel.db.token"
    command, line, stub = run()
    try:
        assert f"every call must send the token in {token_file}" in line, line
        assert token_file.stat().st_mode & 0o777 == 0o600
        with pytest.raises(grpc.RpcError) as err:
            stub.Export(_gauges("nobody", 2), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        stub.Export(_gauges("owner", 2), timeout=10, metadata=[
            ("authorization", f"Bearer {token_file.read_text().strip()}")])
    finally:
        command.terminate()
        command.communicate(timeout=30)  # (closes its pipes)
        assert command.returncode == 0
    command, line, stub = run("--no-token")
    try:
        assert "no token asked (--no-token)" in line, line
        stub.Export(_gauges("anyone", 2), timeout=10)
    finally:
        command.terminate()
        command.communicate(timeout=30)  # (closes its pipes)
        assert command.returncode == 0
    command, line, _ = run("--no-token", "--token-file", str(token_file))
    _, said = command.communicate(timeout=30)
    assert command.returncode == 2 and "not allowed with argument --no-token" in said


def test_exact_values_land_with_their_attributes_and_resource(collector):
    tel = otel.setup_telemetry(service_name="rl-training-service", endpoint=collector.endpoint,
                               instance_id="actor-0", export_interval_ms=60_000)
    rl = otel.RLInstruments(tel.meter, COMMON)
    actor = rl.attrs({otel.RL_LOOP: "actor"})
    for ms in [0.3, 2.0, 7.0, 70.0, 70.0]:
        rl.duration("rl.sample.duration", ms, actor)
    rl.add("rl.sample.samples", 512, actor)
    rl.add("rl.sample.samples", 256, actor)
    rl.set("rl.train.loss", 0.5, actor)
    rl.set("rl.train.loss", 0.125, actor)
    rl.set("rl.train.loss", 9.0, rl.attrs({otel.RL_LOOP: "learner"}))
    tel.shutdown()

    store = collector.store()
    [hist] = store.points(PREFIX + "rl.sample.duration/histogram")
    assert hist["count"] == 5 and hist["sum"] == pytest.approx(149.3)
    assert (hist["min"], hist["max"]) == (0.3, 70.0)
    assert hist["bounds"] == list(otel.LATENCY_BUCKETS_MS)
    expected = [0] * (len(otel.LATENCY_BUCKETS_MS) + 1)
    for ms in [0.3, 2.0, 7.0, 70.0, 70.0]:
        expected[sum(b < ms for b in otel.LATENCY_BUCKETS_MS)] += 1
    assert hist["bucket_counts"] == expected
    assert hist["attributes"] == {**COMMON, "rl.loop": "actor"}
    assert hist["resource"]["service.name"] == "rl-training-service"
    assert hist["resource"]["service.namespace"] == "distrl"
    assert hist["resource"]["service.instance.id"] == "actor-0"
    [samples] = store.points(PREFIX + "rl.sample.samples/counter")
    assert samples["int_value"] == 768 and samples["temporality"] == 2
    losses = {p["attributes"]["rl.loop"]: p["value"]
              for p in store.points(PREFIX + "rl.train.loss/gauge")}
    assert losses == {"actor": 0.125, "learner": 9.0}
    kinds = {m["metric_type"]: m["kind"] for m in store.metric_types()}
    assert kinds[PREFIX + "rl.train.loss/gauge"] == "gauge"
    for m in store.metric_types():
        assert "rl.loop.iteration" not in m["label_keys"]


def test_spans_join_one_trace_across_a_carrier(collector):
    tel = otel.setup_telemetry(endpoint=collector.endpoint)
    with tel.tracer.start_as_current_span(otel.SPAN_LOOP, attributes={otel.RL_LOOP_ITERATION: 3}):
        carrier = otel.inject_context()
    assert "traceparent" in carrier
    other = otel.setup_telemetry(endpoint=collector.endpoint, instance_id="learner")
    with otel.in_context(carrier), other.tracer.start_as_current_span(
            otel.SPAN_TRAIN, attributes={otel.RL_TRAIN_STEPS: 4}):
        pass
    tel.shutdown()
    other.shutdown()
    spans = collector.store().spans()
    root = next(s for s in spans if s["name"] == "rl.loop")
    train = next(s for s in spans if s["name"] == "rl.train")
    assert train["trace_id"] == root["trace_id"] and train["parent_span_id"] == root["span_id"]
    assert root["attributes"]["rl.loop.iteration"] == 3
    assert train["resource"]["service.instance.id"] == "learner"


def test_instruments_refuse_missing_attributes_and_iterations():
    tel = otel.setup_telemetry(metric_readers=[], span_processors=[])
    with pytest.raises(ValueError, match="lack"):
        otel.RLInstruments(tel.meter, {"rl.run.id": "x"})
    with pytest.raises(ValueError, match="belongs on spans"):
        otel.RLInstruments(tel.meter, {**COMMON, otel.RL_LOOP_ITERATION: 1})
    rl = otel.RLInstruments(tel.meter, COMMON)
    with pytest.raises(ValueError, match="belongs on spans"):
        rl.attrs({otel.RL_LOOP_ITERATION: 2})
    with pytest.raises(ValueError, match="endpoint='localhost:4317' is invalid"):
        otel.setup_telemetry(endpoint="localhost:4317")
    with pytest.raises(ValueError, match="export_interval_ms=0"):
        otel.setup_telemetry(export_interval_ms=0)
    assert otel.mfu(1e9, 100, 1e12) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="peak_flops=0"):
        otel.mfu(1, 1, 0)
    assert otel.peak_flops_for(["NVIDIA L4"], 1) == 30.3e12
    assert otel.peak_flops_for([], 2) == 2 * otel.PEAK_FLOPS["cpu-core"]


ENV_PROGRAM = textwrap.dedent("""
    import time
    from distrl.otel.conventions import setup_telemetry
    tel = setup_telemetry()
    print("enabled", tel.enabled, flush=True)
    tel.meter.create_counter("env.counter").add(3)
    with tel.tracer.start_as_current_span("env.span"):
        pass
    time.sleep(1.0)  # OTEL_METRIC_EXPORT_INTERVAL=200 exports before shutdown does
    tel.shutdown()
""")


def run_program(program, env, timeout=60):
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", program], env=full, capture_output=True,
                          text=True, timeout=timeout)


def test_otel_environment_variables_are_honoured(collector):
    out = run_program(ENV_PROGRAM, {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_SERVICE_NAME": "from-env",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test,team=rl",
        "OTEL_METRIC_EXPORT_INTERVAL": "200"})
    assert out.returncode == 0, out.stderr
    store = collector.store()
    points = store.points(PREFIX + "env.counter/counter")
    assert len(points) >= 2  # periodic exports at 200 ms, not only the one at shutdown
    resource = points[-1]["resource"]
    assert resource["service.name"] == "from-env"
    assert resource["deployment.environment"] == "test" and resource["team"] == "rl"
    assert [s["name"] for s in store.spans()] == ["env.span"]

    disabled = run_program(ENV_PROGRAM, {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
                                         "OTEL_SDK_DISABLED": "true",
                                         "OTEL_SERVICE_NAME": "disabled"})
    assert disabled.returncode == 0 and "enabled False" in disabled.stdout
    assert all(p["resource"]["service.name"] != "disabled"
               for p in store.points(PREFIX + "env.counter/counter"))


GLOBAL_PROGRAM = textwrap.dedent("""
    from opentelemetry import metrics, trace
    from distrl.otel.conventions import setup_telemetry
    tel = setup_telemetry()
    print("namespace", tel.resource.attributes["service.namespace"], flush=True)
    # What instrumentation libraries and copied snippets do: the API's global providers.
    metrics.get_meter("lib").create_counter("global.counter").add(5)
    with trace.get_tracer("lib").start_as_current_span("global.span"):
        pass
    tel.shutdown()
""")


def test_env_namespace_global_providers_and_scheme_less_endpoints(collector):
    """The seed's env block: OTEL_RESOURCE_ATTRIBUTES names the namespace (Cloud Monitoring's
    `namespace` label), libraries use the global providers, and its scheme-less endpoint is
    refused by name unless OTEL_EXPORTER_OTLP_INSECURE says how to talk to it."""
    address = collector.endpoint.removeprefix("http://")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
           "OTEL_RESOURCE_ATTRIBUTES": "service.namespace=opentelemetry-demo"}
    out = run_program(GLOBAL_PROGRAM, env)
    assert out.returncode == 0, out.stderr
    assert "namespace opentelemetry-demo" in out.stdout
    [point] = collector.store().points(PREFIX + "global.counter/counter")[-1:]
    assert point["int_value"] == 5
    assert point["resource"]["service.namespace"] == "opentelemetry-demo"
    assert "global.span" in [s["name"] for s in collector.store().spans()]
    seed = {**env, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": address}
    out = run_program(GLOBAL_PROGRAM, seed)
    assert out.returncode != 0
    assert f"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT='{address}' has no scheme" in out.stderr
    assert "OTEL_EXPORTER_OTLP_INSECURE=true" in out.stderr
    out = run_program(GLOBAL_PROGRAM, {**seed, "OTEL_EXPORTER_OTLP_INSECURE": "true"})
    assert out.returncode == 0, out.stderr
    assert len(collector.store().points(PREFIX + "global.counter/counter")) >= 2
    from distrl.otel.conventions import setup_telemetry

    with pytest.raises(ValueError, match="endpoint='localhost:4317' is invalid"):
        setup_telemetry(endpoint="localhost:4317")


def test_a_stock_sdk_program_lands_unchanged(tmp_path):
    """Default OTLP gRPC exporters (insecure, localhost:4317) and nothing from distrl."""
    program = textwrap.dedent("""
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(insecure=True))
        meters = MeterProvider(metric_readers=[reader])
        meters.get_meter("stock").create_counter("stock.requests").add(41, {"route": "/a"})
        tracers = TracerProvider()
        tracers.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(insecure=True)))
        with tracers.get_tracer("stock").start_as_current_span("stock.span"):
            pass
        meters.shutdown()
        tracers.shutdown()
    """)
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", 4317))
    except OSError:
        pytest.skip("port 4317 is taken on this machine by something else")
    finally:
        probe.close()
    with LocalCollector(tmp_path / "stock.db", token_file=None, port=4317) as collector:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        [point] = collector.store().points(PREFIX + "stock.requests/counter")
        assert point["int_value"] == 41 and point["attributes"] == {"route": "/a"}
        assert [s["name"] for s in collector.store().spans()] == ["stock.span"]


def test_no_collector_no_flood_and_a_bounded_shutdown():
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens here
    program = textwrap.dedent(f"""
        import time
        from distrl.otel.conventions import setup_telemetry
        tel = setup_telemetry(endpoint="http://127.0.0.1:{port}", export_interval_ms=100,
                              export_timeout_s=1)
        counter = tel.meter.create_counter("c")
        with tel.tracer.start_as_current_span("s"):
            pass
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < 8:
            counter.add(1)
            n += 1
        t0 = time.monotonic()
        tel.shutdown()
        print("adds", n, "shutdown_s", round(time.monotonic() - t0, 2))
    """)
    out = run_program(program, {}, timeout=60)
    assert out.returncode == 0, out.stderr
    shutdown_s = float(out.stdout.split("shutdown_s")[1])
    # Nothing listens on this machine's port: one attempt, not the exporter's retries, which
    # alone take >= 2.4 s (backoffs of 1 s and 2 s, -20 % jitter) of the 5 s given.
    assert shutdown_s < 2.0
    warnings = [line for line in out.stderr.splitlines()
                if "Transient error" in line or "Failed to export" in line]
    # ~80 export attempts in 8 s; the log shows a few lines, not one per retry.
    assert 1 <= len(warnings) <= 3, out.stderr


def test_a_shutdown_whose_time_is_up_stops_the_exports_still_in_flight():
    """A collector that accepts TCP and never answers: the flush outlives the 1 s given, and
    shutdown then stops the exporters, so no thread exports on in a process that lives on.
    What each flush was doing is recorded when shutdown stops the exporters (a flush thread
    may end as soon as that has happened: counting the living ones afterwards raced them)."""
    program = textwrap.dedent("""
        import socket, threading, time
        from distrl.otel.conventions import setup_telemetry
        started, alive_at_stop = [], []
        start = threading.Thread.start
        def recorded_start(thread):
            if thread.name == "otel-shutdown":
                started.append(thread)
            start(thread)
        threading.Thread.start = recorded_start
        mute = socket.socket()
        mute.bind(("127.0.0.1", 0))
        mute.listen()  # the kernel completes the handshake; nothing reads
        tel = setup_telemetry(endpoint=f"http://127.0.0.1:{mute.getsockname()[1]}",
                              export_timeout_s=30)
        for exporter in tel.exporters:
            def stop(*args, original=exporter.shutdown, **kwargs):
                alive_at_stop.append(sum(t.is_alive() for t in started))
                return original(*args, **kwargs)
            exporter.shutdown = stop
        tel.meter.create_counter("c").add(1)
        with tel.tracer.start_as_current_span("s"):
            pass
        began = time.monotonic()
        tel.shutdown(timeout_s=1)
        waited = time.monotonic() - began
        for flush in started:
            flush.join(10)
        print("flushes", len(started), "alive_at_stop", alive_at_stop[0], "alive_after",
              sum(t.is_alive() for t in started), "waited_1s", waited >= 1.0)
    """)
    out = run_program(program, {}, timeout=60)
    assert out.returncode == 0, out.stderr
    # Both flushes were still waiting at 1 s (the export's own deadline is 30 s) when shutdown
    # stopped the exporters, and both ended once they were stopped, within 10 s, not 30.
    assert out.stdout.split() == ["flushes", "2", "alive_at_stop", "2", "alive_after", "0",
                                  "waited_1s", "True"], out.stdout + out.stderr


def test_nothing_listens_at_probes_only_this_machine():
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    assert otel.nothing_listens_at(f"http://127.0.0.1:{port}")
    assert otel.nothing_listens_at(f"http://localhost:{port}/v1/metrics")
    assert otel.nothing_listens_at(f"127.0.0.1:{port}")  # a gRPC endpoint without a scheme
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert not otel.nothing_listens_at(f"http://127.0.0.1:{listening.getsockname()[1]}")
    # Not probed: a name (no DNS lookup at shutdown), another machine, no port, a bad port.
    for endpoint in ("http://collector.invalid:4317", "http://10.0.0.1:4317",
                     "http://127.0.0.1", "http://127.0.0.1:99999"):
        assert not otel.nothing_listens_at(endpoint), endpoint


def test_a_forked_child_does_not_revive_a_shut_down_exporter(collector):
    """Ray forks helper processes; the SDK restarts export threads in forked children."""
    program = textwrap.dedent(f"""
        import os, time
        from distrl.otel.conventions import setup_telemetry
        tel = setup_telemetry(endpoint="{collector.endpoint}")
        tel.meter.create_counter("c").add(1)
        tel.shutdown()
        pid = os.fork()
        if pid == 0:
            time.sleep(0.5)
            os._exit(0)
        os.waitpid(pid, 0)
    """)
    out = run_program(program, {})
    assert out.returncode == 0, out.stderr
    assert "already shutdown" not in out.stderr


# --- the Ape-X processes' telemetry (distrl.apex.process_telemetry) ----------------------------

def test_a_traced_method_runs_under_its_callers_context_which_ray_sees_as_a_keyword():
    import inspect

    from opentelemetry.sdk.trace import TracerProvider

    from distrl.apex.process_telemetry import TRACE_KWARG, current_carrier, traced

    class Worker:
        @traced
        def work(self, x, y=2):
            """Adds."""
            return x + y, current_carrier()

    # Ray checks a call against inspect.signature(inspect.unwrap(method)).
    params = inspect.signature(inspect.unwrap(Worker.work)).parameters
    assert list(params) == ["self", "x", "y", TRACE_KWARG]
    assert params[TRACE_KWARG].kind is inspect.Parameter.KEYWORD_ONLY
    assert Worker.work.__doc__ == "Adds."
    with TracerProvider().get_tracer("test").start_as_current_span("caller") as span:
        carrier = otel.inject_context()
    trace_id = format(span.get_span_context().trace_id, "032x")
    total, seen = Worker().work(1, trace_context=carrier)
    assert total == 3 and seen["traceparent"].split("-")[1] == trace_id
    assert Worker().work(1, 5) == (6, None)  # no caller's context, no trace
    assert current_carrier() is None  # the caller's context ended with the call
    with pytest.raises(TypeError, match="trace"):
        Worker().work(1, trace=carrier)


def test_telemetry_off_is_opentelemetrys_no_op_instruments_and_tracer():
    from opentelemetry import trace

    from distrl.apex.process_telemetry import IterationTraces, LearnerMetrics, ProcessTelemetry
    from distrl.rl.config import ApexConfig
    from distrl.rl.network import SMALL_TORSO, NetworkSpec

    config = ApexConfig(telemetry=False)
    spec = NetworkSpec((4,), 2)
    assert spec.name == "dueling-mlp-64x64"  # rl.model.name
    assert NetworkSpec((10, 10, 4), 3, (128,), True, SMALL_TORSO).name == \
        "dueling-conv16k3s1-mlp-128"
    tel = ProcessTelemetry(config, "learner", spec)
    assert tel.telemetry is None and tel.step_durations() is None
    tel.rl.duration("rl.train.duration", 1.0, tel.attrs)  # records nothing, raises nothing
    with tel.unit(), tel.span("rl.train", {"rl.train.steps": 1}) as span:
        assert span is trace.INVALID_SPAN
        span.set_attribute("rl.train.steps", 2)
    traces = IterationTraces(ProcessTelemetry(config, "driver", spec), config)
    assert traces.next_iteration() is None  # nothing to send the workers
    traces.record_rates(100.0)
    traces.end()
    metrics = LearnerMetrics(tel, tensorboard=None, flops_per_update=1e6, peak_flops=1e12)
    metrics.ready()
    metrics.waited(0.5)
    metrics.write({"updates": 7, "steps": 7, "loss": 0.1, "mean_q": 1.0, "grad_norm": 0.2,
                   "beta": 0.4, "wait_s": 0.01, "update_s": 0.02, "train_s": 0.03})
    stats = metrics.snapshot()
    assert stats["updates"] == 7 and stats["wait_s"] == pytest.approx(0.51)
    assert stats["train_s"] == pytest.approx(0.03) and stats["first_update_time"] is not None
    tel.shutdown()
