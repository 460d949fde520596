"""Children that abort before exec in a process with a live gRPC channel (grpc/grpc#43055).

    python benchmarks/popen_beside_grpc.py [--children 300] [--rounds 3]

Ray starts its GCS and raylet with subprocess.Popen and a preexec_fn, so fork() runs gRPC's
fork handlers; from grpcio 1.81 on those restart gRPC's poller in the child, Popen closes the
poller's fd before exec, and the child aborts (SIGABRT). Each round is a fresh interpreter with a
gRPC server and one channel that has made a call, starting `children` of /bin/true that way:
once as gRPC defaults to (fork support on), once after `import distrl`, which turns it off.
"""

import argparse
import json
import os
import subprocess
import sys

PROBE = """
import json, subprocess, sys
if sys.argv[1] == "distrl":
    import distrl  # before grpc, as every distrl module and notebook does
from concurrent import futures
import grpc

server = grpc.server(futures.ThreadPoolExecutor(2))
echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("echo.Echo", {"Say": echo})])
port = server.add_insecure_port("127.0.0.1:0")
server.start()
channel = grpc.insecure_channel(f"127.0.0.1:{port}")
assert channel.unary_unary("/echo.Echo/Say")(b"ping", timeout=30) == b"ping"
codes = [subprocess.Popen(["/bin/true"], preexec_fn=lambda: None, stderr=subprocess.DEVNULL)
         .wait(timeout=30) for _ in range(int(sys.argv[2]))]
channel.close()
server.stop(None)
print(json.dumps(codes))
"""


def clean_env() -> dict:
    """This environment without GRPC_ENABLE_FORK_SUPPORT (this process may have set it)."""
    return {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}


def exit_codes(import_distrl: bool, children: int) -> list[int]:
    """The exit codes of `children` /bin/true started beside a live channel (-6: aborted)."""
    out = subprocess.run([sys.executable, "-c", PROBE, "distrl" if import_distrl else "grpc",
                          str(children)], env=clean_env(), capture_output=True, text=True,
                         check=True, timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds, tiny settings: that the script runs (tests/test_benchmarks.py)")
    args = parser.parse_args()
    if args.smoke:
        args.children, args.rounds = 20, 1
    if args.children < 1 or args.rounds < 1:
        parser.error(f"--children {args.children} and --rounds {args.rounds}: both must be >= 1")
    import grpc

    print(f"grpcio {grpc.__version__}, {args.rounds} round(s) of {args.children} children")
    totals = {}
    for label, import_distrl in (("gRPC's default (fork support on)", False),
                                 ("after import distrl (off)", True)):
        rounds = [sum(code != 0 for code in exit_codes(import_distrl, args.children))
                  for _ in range(args.rounds)]
        totals[label] = sum(rounds)
        share = sum(rounds) / (args.rounds * args.children)
        print(f"{label:<34} aborted: {', '.join(map(str, rounds))} ({share:.1%})")
    on, off = totals.values()
    print(f"aborted children, default against distrl: {on} against {off}")


if __name__ == "__main__":
    main()
