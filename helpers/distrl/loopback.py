"""Ray on 127.0.0.1 only, for the nodes this package starts on your machine.

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
- `python -m distrl.loopback start --address=127.0.0.1:PORT ...`: `ray start` for a worker
  node, keeping 127.0.0.1 as given.
"""

from __future__ import annotations

import contextlib
import os
import sys

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
