"""Which tests wait and which compute: each test's wall time beside the CPU time the whole
machine left idle while it ran (from /proc/stat, so Ray's daemons and workers count too, which
`time -v` on pytest does not see).

    python benchmarks/wait_by_test.py [-m slow] [pytest arguments]
    python benchmarks/wait_by_test.py --smoke     # seconds: a few unit tests

On 2 cores a test that leaves much idle waits on something (a process to start, a deadline, a
poll) and could run beside another; one that leaves none can only get faster by using less CPU
(issue 15: `make test` within 12 minutes). Linux only.
"""

import os
import sys
import time

import pytest

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def idle_cpu_s() -> float:
    """Idle CPU seconds of every core since boot, waiting for I/O included."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (ticks[3] + ticks[4]) * TICK_S


class WaitReport:
    def __init__(self):
        self.rows = []  # (test id, wall s, idle CPU s)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        idle, start = idle_cpu_s(), time.monotonic()
        yield
        self.rows.append((item.nodeid, time.monotonic() - start, idle_cpu_s() - idle))

    def pytest_terminal_summary(self, terminalreporter):
        cores = os.cpu_count() or 1
        wall = sum(r[1] for r in self.rows)
        idle = sum(r[2] for r in self.rows)
        write = terminalreporter.write_line
        write(f"== idle CPU while each test ran ({cores} cores; setup and teardown included) ==")
        write(f"{len(self.rows)} tests, {wall:.0f} s: {idle:.0f} of {cores * wall:.0f} CPU-s "
              f"idle ({100 * idle / max(cores * wall, 1e-9):.0f} %)")
        write(f"{'wall s':>7} {'idle CPU-s':>10} {'idle %':>6}  test")
        for nodeid, w, i in sorted(self.rows, key=lambda r: -r[2])[:30]:
            write(f"{w:7.1f} {i:10.1f} {100 * i / max(cores * w, 1e-9):6.0f}  {nodeid}")


if __name__ == "__main__":
    if not os.path.exists("/proc/stat"):
        sys.exit("wait_by_test.py reads /proc/stat: Linux only")
    args = sys.argv[1:]
    if args == ["--smoke"]:  # that the script runs (tests/test_benchmarks.py)
        here = os.path.dirname(os.path.abspath(__file__))
        args = [os.path.join(here, "..", "tests", "test_config.py"), "-m", "not slow"]
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *args], plugins=[WaitReport()]))
