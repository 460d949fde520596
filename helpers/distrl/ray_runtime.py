"""Ray's own start and stop on this machine, made dependable: what the driver (distrl.apex) and
the local cluster (distrl.cluster) share. Each function works around one behaviour of Ray
2.60, named in its docstring with the Ray source it comes from.

- init_local_ray / shutdown_ray: a new local Ray that starts again when its GCS or raylet does
  not come up, stops what a failed start left, and stops without Ray's one-second wait;
- ensure_auth_token / use_token_auth: Ray's token authentication, the token file kept at 600;
- node_groups, process_age_s, DASHBOARD_FAILURES: what the driver reads about its Ray;
- running / kill_survivors / until_ended: processes ended within a deadline.

Loopback: every node this package starts on your machine listens on 127.0.0.1 only.

Ray 2.60's servers (GCS, raylet, agents) listen on 127.0.0.1 only when the node's address is
exactly 127.0.0.1, and on every interface otherwise (src/ray/rpc/grpc_server.cc,
listen_to_localhost_only). But Ray turns a 127.0.0.1 it is given into this machine's routable
address (ray/_private/services.py, resolve_ip_for_localhost), unless
ray_constants.ENABLE_RAY_CLUSTER is off, which its processes read from
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0; and with it off, `ray start` refuses to start a worker
node. So:

- on_loopback(): around ray.init, which starts a node (init_local_ray) or joins one (join_ray);
- LOOPBACK_ENV: in the environment of every node of a local cluster (and so of its workers,
  agents and job drivers);
- `python -m distrl.ray_runtime start --address=127.0.0.1:PORT ...`: `ray start` for a worker
  node, keeping 127.0.0.1 as given.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# Ray's token file: RAY_AUTH_TOKEN_PATH where set, which Ray reads too (ray/exceptions.py, its
# AuthenticationError's help: "~/.ray/auth_token or via RAY_AUTH_TOKEN_PATH"), else its default.
DEFAULT_TOKEN_FILE = Path(os.environ.get("RAY_AUTH_TOKEN_PATH")
                          or Path.home() / ".ray" / "auth_token").expanduser()


def ensure_auth_token(path: str | Path = DEFAULT_TOKEN_FILE) -> Path:
    """The Ray auth token file the cluster's Secret is made from; created (mode 600) if missing.

    Ray reads the same file on this machine, so the Jobs client works through port-forward."""
    path = Path(path).expanduser()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_hex(32))
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:  # Ray itself writes the file 0644 when it makes it
        if path.stat().st_uid != os.getuid():
            raise PermissionError(f"auth token file {path} is readable by others (mode "
                                  f"{mode:o}) and not yours to tighten; make it 600")
        path.chmod(0o600)
    return path


class ClusterError(RuntimeError):
    """The cluster did not start (nothing it started is left running) or cannot be reached."""


def ray_temp_dir() -> Path:
    """Where Ray keeps its sessions on this machine, found as Ray finds it (ray/_common/utils.py,
    get_default_system_temp_dir): under RAY_TMPDIR, else TMPDIR (on Linux), else /tmp. Not
    tempfile.gettempdir(), which knows no RAY_TMPDIR."""
    base = os.environ.get("RAY_TMPDIR")
    if base is None and sys.platform.startswith("linux"):
        base = os.environ.get("TMPDIR")
    if base is None:
        base = "/tmp" if sys.platform.startswith(("linux", "darwin")) else tempfile.gettempdir()
    return Path(base) / "ray"


def running(pids: list[int]) -> list[int]:
    """The pids that still run (a zombie has ended). A process may end between any two looks
    at it, so one that vanishes while looked at counts as ended."""
    import psutil

    alive = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
    return alive


# Ray gives up on a new node after fixed waits of 20-30 s: for the GCS to write its port file
# ("Timed out waiting for file .../gcs_server_port_...", RAY_gcs_server_port_wait_time_s) or, with
# a fixed GCS port as `ray start --head --port` has, to answer ("Failed to start GCS", or a
# FileNotFoundError for the gcs_server.err it then reads: both raised in _init_gcs_client), and for
# the raylet to register (raylet_start_wait_time_s in ray/_private/node.py, not a setting in Ray
# 2.60: "The current node timed out during startup"). The GCS or raylet that never came had aborted
# before exec, killed by gRPC's fork handlers in the parent (grpc/grpc#43055); distrl/__init__.py
# turns those off (benchmarks/popen_beside_grpc.py counts the aborts either way). A second start,
# in a new session, is what a reader would do by hand for whatever else kills a node at launch;
# LocalCluster.join does the same for `ray start`, and does not wait out the 30 s once a process
# that `ray start` launched has ended (NodeStartFailed).
NODE_START_TIMEOUT = "timed out during startup"


GCS_PORT_FILE_TIMEOUT = "Timed out waiting for file"


GCS_CLIENT_FAILED = "in _init_gcs_client"  # the frame of both in a `ray start` traceback


def ray_gave_up(message: str) -> bool:
    """Whether Ray's message (or a `ray start` log) says it gave up waiting for a new node."""
    return (NODE_START_TIMEOUT in message or GCS_CLIENT_FAILED in message
            or (GCS_PORT_FILE_TIMEOUT in message and "gcs_server_port" in message))


def init_local_ray(attempts: int = 2, stop: Callable[[], bool] | None = None,
                   loopback_only: bool = True, **ray_init_kwargs):
    """ray.init(address="local", **ray_init_kwargs): a new Ray on this machine, never a cluster
    that an old `ray start` recorded. A node whose GCS or raylet does not come up within Ray's
    fixed 30 s is started again (up to `attempts` starts in all); each failed start names its
    logs, and what it had started is stopped first. `stop`: once it returns True (a SIGTERM
    was caught), the start is abandoned at its next wait, what it started is stopped, and
    StartInterrupted is raised. loopback_only: every Ray process listens on 127.0.0.1 only
    (False: on every interface, as Ray does by default)."""
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"attempts={attempts!r}: expected an integer >= 1")
    if "address" in ray_init_kwargs:
        raise ValueError(f"address={ray_init_kwargs['address']!r}: init_local_ray always starts "
                         "a new local Ray; call ray.init(address=...) to join a cluster")
    if not isinstance(loopback_only, bool):
        raise ValueError(f"loopback_only={loopback_only!r}: expected True or False")
    import ray

    ensure_auth_token(DEFAULT_TOKEN_FILE)  # before Ray, which would write it readable by all
    logging.getLogger("ray._private.services").addFilter(DASHBOARD_FAILURES)
    logging.getLogger(TOKEN_NOTICE_LOGGER).addFilter(TOKEN_AUTH_NOTICE)
    stop = stop or (lambda: False)
    temp_dir = Path(ray_init_kwargs.get("_temp_dir") or ray_temp_dir())
    for attempt in range(1, attempts + 1):
        if stop():
            raise StartInterrupted("asked to stop before Ray's node started")
        began = time.time()
        try:
            with _dashboard_process_skipped(ray_init_kwargs.get("include_dashboard")), \
                    _raylet_registration_polled(stop), on_loopback(loopback_only):
                return ray.init(address="local", **ray_init_kwargs)
        except Exception as e:
            seen_ending = isinstance(e, RayletNotRegistered)
            if not (seen_ending or ray_gave_up(str(e))):
                raise
            why = str(e) if seen_ending else "its GCS or raylet did not come up within Ray's 30 s"
            ray.shutdown()  # Ray never got a node object: its processes are still running
            session = _new_session(temp_dir, began)
            logs = _failed_start_logs(session, temp_dir)
            if session is not None:
                _stop_children_of_session(session)
            if isinstance(e, StartInterrupted):
                raise
            if attempt == attempts:
                raise ClusterError(f"Ray's node did not start in {attempts} attempt(s) ({why}); "
                                   f"{logs}") from e
            print(f"Ray's node did not start ({why}); {logs}; starting Ray again "
                  f"({attempt + 1} of {attempts})", file=sys.stderr, flush=True)


class RayletNotRegistered(RuntimeError):
    """A new node's raylet ended, or did not register with the GCS in time."""


class StartInterrupted(RayletNotRegistered):
    """init_local_ray was asked to stop (its `stop` returned True) while Ray's node started."""


RAYLET_REGISTRATION_S = 30.0  # Ray's own wait (raylet_start_wait_time_s)


REGISTRATION_POLL_S = 0.02


@contextlib.contextmanager
def _node_method_replaced(name: str, replacement: Callable[[Callable], Callable]):
    """While inside: Ray's Node.<name> is replacement(the original), put back on the way out
    (ray.init builds its node with them). A private API (ray._private.node.Node): if it is
    gone, nothing is replaced, and ray.init runs as it is."""
    try:
        from ray._private.node import Node

        original = getattr(Node, name)
    except (ImportError, AttributeError):
        yield
        return
    setattr(Node, name, replacement(original))
    try:
        yield
    finally:
        setattr(Node, name, original)


def _raylet_registration_polled(stop: Callable[[], bool]):
    """While ray.init starts a node: its raylet's registration with the GCS is awaited by asking
    the GCS every 20 ms, and given up on as soon as the raylet has ended or stop() is True.

    Ray 2.60 waits in GlobalStateAccessor::GetNode, which asks the GCS, then sleeps a fixed 1 s
    before it asks again, for up to raylet_start_wait_time_s, 30 s
    (src/ray/gcs_rpc_client/global_state_accessor.cc): a raylet that died at launch is waited
    on for the full 30 s, and one that registered just after an ask, up to a second longer
    than it took. After this wait Ray's own finds the node at its first ask
    (`python benchmarks/process_startup.py` measures the start). Through
    Node.start_ray_processes, which starts the raylet."""
    try:
        from ray._private import ray_constants
        from ray._raylet import NodeID
        from ray.core.generated.gcs_pb2 import GcsNodeInfo
        from ray.core.generated.gcs_service_pb2 import GetAllNodeInfoRequest
    except ImportError:
        return contextlib.nullcontext()

    def registered(node) -> bool:
        selector = GetAllNodeInfoRequest.NodeSelector(node_id=NodeID.from_hex(node.node_id).binary())
        return bool(node.get_gcs_client().get_all_node_info(
            timeout=RAYLET_REGISTRATION_S, node_selectors=[selector],
            state_filter=GcsNodeInfo.GcsNodeState.ALIVE))

    def awaiting_the_raylet(start_ray_processes):
        def start_and_await_raylet(node, *args, **kwargs):
            start_ray_processes(node, *args, **kwargs)
            raylets = node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET) or [None]
            raylet = getattr(raylets[0], "process", None)
            deadline = time.monotonic() + RAYLET_REGISTRATION_S
            while not registered(node):
                if stop():
                    raise StartInterrupted("asked to stop while Ray's raylet started")
                code = raylet.poll() if raylet is not None else None
                if code is not None:
                    raise RayletNotRegistered(f"its raylet (pid {raylet.pid}) ended with exit "
                                              f"code {code} before it registered with the GCS")
                if time.monotonic() > deadline:
                    raise RayletNotRegistered(f"its raylet did not register with the GCS within "
                                              f"{RAYLET_REGISTRATION_S:.0f} s")
                time.sleep(REGISTRATION_POLL_S)
        return start_and_await_raylet

    return _node_method_replaced("start_ray_processes", awaiting_the_raylet)


def _dashboard_process_skipped(include_dashboard):
    """While ray.init starts a node: no dashboard process, when include_dashboard is False.

    Ray 2.60 starts it anyway, with only its usage-stats module (which reports nothing unless
    usage stats are on), and starts the raylet only once the dashboard has written its address
    (ray/_private/services.py, start_api_server): every ray.init waits for that process to
    start, with one core busy importing it (`python benchmarks/process_startup.py` measures
    it). Through Node.start_api_server."""
    if include_dashboard is not False:
        return contextlib.nullcontext()
    return _node_method_replaced("start_api_server",
                                 lambda original: lambda node, *args, **kwargs: None)


def shutdown_ray() -> None:
    """ray.shutdown(), less the second it waits on a local Ray's autoscaler monitor.

    Ray 2.60's shutdown stops the GCS first and then sends the monitor SIGTERM, whose handler
    tries to tell the gone GCS that the autoscaler failed, until Ray kills it after a fixed 1 s
    (ray/_private/node.py, _kill_process_impl): a second of every ray.shutdown() spent waiting
    on nothing (`python benchmarks/process_startup.py` measures it). Killed first, the monitor
    ends at once and reports nothing. Only the monitor of a Ray this process started: a driver
    that joined a cluster has none of the cluster's processes. Through a private API: if it
    changes, this is a plain ray.shutdown()."""
    import ray

    with contextlib.suppress(Exception):
        from ray._private import ray_constants, worker

        node = worker._global_node
        for info in (node.all_processes if node is not None else {}).get(
                ray_constants.PROCESS_TYPE_MONITOR, []):
            if info.process.poll() is None:
                info.process.kill()
                info.process.wait(timeout=5)
    ray.shutdown()


def _new_session(temp_dir: Path, since: float) -> Path | None:
    """The session directory this process's ray.init made since `since`, if any. Ray names a
    new head's session after the pid that started it ("session_<date>_<pid>",
    ray/_private/node.py). Its "session_latest" link is shared by every Ray on the machine: it
    may name a `ray start` head that began meanwhile, and the failed start's own processes
    would be left running."""
    sessions = []
    for path in temp_dir.glob(f"session_*_{os.getpid()}"):
        with contextlib.suppress(OSError):
            if (mtime := path.stat().st_mtime) >= since - 1:
                sessions.append((mtime, path))
    return max(sessions)[1] if sessions else None


def _failed_start_logs(session: Path | None, temp_dir: Path) -> str:
    """Where a failed start's session keeps its logs, and which of the GCS and the raylet never
    got as far as opening its own."""
    if session is None:
        return f"no new session directory under {temp_dir}"
    logs = session / "logs"
    if not (logs / "gcs_server.out").exists():  # Ray starts the raylet only after its GCS
        return f"logs in {logs}: no gcs_server.out, the GCS ended or hung before opening its log"
    if not (logs / "raylet.out").exists():
        return f"logs in {logs}: no raylet.out, the raylet ended or hung before opening its log"
    return f"logs in {logs} (see gcs_server.out and raylet.out)"


def _stop_children_of_session(session: Path, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, this process's children that belong to a session (their command
    lines name its directory): what a failed ray.init started and no ray.shutdown() can reach."""
    import psutil

    children = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if str(session) in " ".join(child.cmdline()):
                child.terminate()
                children.append(child)
    kill_survivors(children, wait_s=grace_s)


def kill_survivors(procs: list, wait_s: float) -> None:
    """Wait up to wait_s for psutil processes to end; SIGKILL the rest and wait for them too."""
    import psutil

    alive = until_ended(procs, wait_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    until_ended(alive, 5.0)


def until_ended(procs: list, timeout_s: float) -> list:
    """Wait up to timeout_s for psutil processes to end; returns those still running. A zombie
    has ended: one that is not this process's child waits for init to reap it, which some
    inits do only every second or two."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        still = set(running([p.pid for p in procs]))
        alive = [p for p in procs if p.pid in still]
        # After the look: a child of ours that ended before it is reaped here, not left a zombie.
        psutil.wait_procs(procs, timeout=0)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def use_token_auth() -> None:
    """Talk to the cluster with token authentication, also when `ray` was imported before
    (Ray caches the mode; re-reading its config is what Ray itself does when it turns token
    auth on). A cluster this process later starts with ray.init() has it on by default anyway."""
    if os.environ.get("RAY_AUTH_MODE") != "token":
        os.environ["RAY_AUTH_MODE"] = "token"
        with contextlib.suppress(ImportError, AttributeError):
            from ray._raylet import Config

            Config.initialize("")


class _DashboardStartFailure(logging.Filter):
    """ray.init starts Ray's dashboard head even with include_dashboard=False (it then serves
    only usage stats); init_local_ray leaves it out, but only through a private API, and a
    plain ray.init still starts it. If that process dies during start-up, Ray logs four ERROR
    lines and carries on (ray/_private/services.py, start_api_server, in 2.60). Nothing here
    uses it, so the first line becomes one warning that says so and the rest, about the same
    failure, are dropped. init_local_ray and join_ray install it (once) before their ray.init."""

    def __init__(self) -> None:
        super().__init__()
        self.notes: list[str] = []
        self.following = False  # the last record was about a dashboard failure

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if text.startswith("Failed to start the dashboard"):
            m = re.search(r"return code (-?\d+)", text)
            note = (f"Ray's dashboard process exited while ray.init started it (return code "
                    f"{m.group(1) if m else 'unknown'}; its log, if it wrote one: "
                    f"dashboard.log under {ray_temp_dir()}/session_latest/logs); with "
                    "include_dashboard=False nothing uses it, so Ray goes on without it")
            self.notes.append(note)
            record.msg, record.args = note, ()
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            self.following = True
            return True
        self.following = self.following and "dashboard" in text
        return not self.following


DASHBOARD_FAILURES = _DashboardStartFailure()


class _TokenAuthNotice(logging.Filter):
    """Ray 2.60 logs one WARNING at each start that token authentication is on, with how to
    turn it off (ray/_private/authentication/authentication_token_setup.py). init_local_ray
    makes the token itself and keeps authentication on by design (docs/clusters.md); notebook
    01, whose plain ray.init shows the line, explains it once. The package's own starts leave
    it out, so that notebooks 02 and 05 do not print it again."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled")


TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
TOKEN_AUTH_NOTICE = _TokenAuthNotice()


def process_age_s() -> float:
    """Seconds since this process started. On Linux from the kernel's own clock: psutil's
    create_time adds the boot time, which /proc/stat rounds down to a whole second (an age up
    to a second too old)."""
    try:
        with open("/proc/self/stat") as f:  # field 22, after the parenthesised command name
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            return float(f.read().split()[0]) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        import psutil

        return time.time() - psutil.Process().create_time()


def node_groups() -> list[dict]:
    """The node groups an autoscaler publishes to Ray (Ray's autoscaler v2 on KubeRay, or
    distrl.cluster.autoscale locally): resources per node, min and max count. [] when none does: the
    cluster is taken as fixed-size unless ApexConfig.autoscaling says otherwise. Ray Data reads
    the same record (ray._private.state.get_cluster_config) to tell whether a cluster scales."""
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception:  # noqa: BLE001 - a private API: no record is the safe answer
        return []
    if config is None:
        return []
    return [{"name": g.name, "resources": dict(g.resources), "min_count": g.min_count,
             "max_count": g.max_count} for g in config.node_group_configs]


LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@contextlib.contextmanager
def on_loopback(loopback_only: bool = True):
    """While inside: Ray keeps 127.0.0.1 as this process's (and its new node's) address."""
    if not loopback_only:
        yield
        return
    from ray._private import ray_constants

    before = (ray_constants.ENABLE_RAY_CLUSTER,
              {key: os.environ.get(key) for key in LOOPBACK_ENV})
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ.update(LOOPBACK_ENV)
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before[0]
        for key, value in before[1].items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def join_ray(address: str, **ray_init_kwargs):
    """ray.init(address=address) that keeps a loopback address as it is: a plain ray.init
    would look for the node on the routable address, where it does not listen, and wait
    there for ever."""
    import ray

    logging.getLogger("ray._private.services").addFilter(DASHBOARD_FAILURES)
    host = address.rsplit(":", 1)[0]
    with on_loopback(host in ("127.0.0.1", "localhost")):
        return ray.init(address=address, **ray_init_kwargs)


def main(argv: list[str]) -> None:
    """`ray start` with 127.0.0.1 kept as given, worker nodes allowed (see the module doc)."""
    from ray._private import ray_constants, services
    from ray.scripts.scripts import main as ray_main

    ray_constants.ENABLE_RAY_CLUSTER = True  # only for this check: worker nodes may join
    services.resolve_ip_for_localhost = lambda host: host
    sys.argv = ["ray", *argv]
    ray_main()

if __name__ == "__main__":
    main(sys.argv[1:])
