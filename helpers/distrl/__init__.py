"""distrl: distributed Ape-X DQN on Ray, instrumented with OpenTelemetry, from laptop to GKE."""

import os
import sys
import warnings

__version__ = "0.1.0"

# gRPC Python from 1.81 on restarts its poller thread in a forked child. subprocess.Popen with a
# preexec_fn (Ray starts its GCS and raylet that way, LocalCluster its `ray start`) then closes
# that poller's fd before exec, and the child aborts on "epoll_wait error: Bad file descriptor"
# (grpc/grpc#43055, open): Ray waits 30 s for a GCS or raylet that never ran, and gives up.
# `python benchmarks/popen_beside_grpc.py` counts such aborts with fork support on and off.
# Fork support is for children that use the parent's gRPC without exec; nothing in this series
# does. gRPC reads the variable when it is imported, so this has to come before the first
# `import grpc`.
if "GRPC_ENABLE_FORK_SUPPORT" not in os.environ:
    os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"
    if "grpc" in sys.modules:
        warnings.warn("grpc was imported before distrl, so gRPC's fork support stays on and a "
                      "child process Ray starts can abort (grpc/grpc#43055); import distrl "
                      "first, or set GRPC_ENABLE_FORK_SUPPORT=false before starting Python",
                      RuntimeWarning, stacklevel=2)
