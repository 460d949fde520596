"""`make test`'s two lanes, split by measured duration rather than by marker.

    pytest --lane 1/2    # this lane's share of the selected tests; another process runs 2/2
    pytest --record-durations tests/durations.json   # merge this run's seconds into the file

Every lane collects the same tests and splits them the same way: longest first, each to the lane
with the least time so far (tests/durations.json: set-up, call and teardown of each test, from a
recorded run). Tests that share an expensive session fixture go to one lane together, so the
fixture is made once, and so do tests that use one folder outside their own. A test the file
does not know counts UNKNOWN_S. Refresh the file after tests change much:
`make test PYTEST_ARGS=--record-durations=tests/durations.json`.
"""

from __future__ import annotations

import fcntl
import json
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_S = 0.5  # most tests the file lacks are new unit tests (it lists all it measured)
# Session fixtures worth making once: the tests using one run in the same lane.
SHARED_FIXTURES = ("instrumented_run",)
# Tests that build or use one folder outside their own: never in two lanes at once.
SHARED_FOLDERS = {"benchmarks/.venv-baseline (time_to_solve.baseline_python builds it)": (
    "smoke_mode[baseline_", "smoke_mode[image_peer.py]", "smoke_mode[time_to_solve.py]")}


def pytest_addoption(parser):
    parser.addoption("--lane", default=None, metavar="K/N",
                     help="run lane K of N: the selected tests split by tests/durations.json")
    parser.addoption("--record-durations", default=None, metavar="FILE",
                     help="merge each test's seconds (set-up, call, teardown) into FILE")


def parse_lane(text: str) -> tuple[int, int]:
    """(K, N) from 'K/N' with 1 <= K <= N; ValueError naming the value otherwise."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        k = n = 0
    if not 1 <= k <= n:
        raise ValueError(f"--lane={text!r}: expected K/N with 1 <= K <= N, e.g. 1/2")
    return k, n


def split(items_s: dict[str, tuple[str, float]], lanes: int) -> list[list[str]]:
    """Test ids per lane: groups (tests of one shared fixture, else one test) longest first,
    each to the lane with the least time so far; ties broken by id, so every lane agrees."""
    groups: dict[str, list[str]] = defaultdict(list)
    seconds: dict[str, float] = defaultdict(float)
    for test_id, (group, s) in items_s.items():
        groups[group].append(test_id)
        seconds[group] += s
    load, out = [0.0] * lanes, [[] for _ in range(lanes)]
    for group in sorted(groups, key=lambda g: (-seconds[g], g)):
        lane = min(range(lanes), key=lambda i: (load[i], i))
        load[lane] += seconds[group]
        out[lane] += groups[group]
    return out


def group_of(item) -> str:
    """What a test shares with others (a session fixture, a folder), else its own id."""
    shared = [f for f in SHARED_FIXTURES if f in getattr(item, "fixturenames", ())]
    if shared:
        return f"fixture {shared[0]}"
    folder = [name for name, ids in SHARED_FOLDERS.items() if any(i in item.nodeid for i in ids)]
    return f"folder {folder[0]}" if folder else item.nodeid


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(config, items):
    lane = config.getoption("--lane")
    if not lane:
        return
    try:
        k, n = parse_lane(lane)
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    by_id = {item.nodeid: (group_of(item), known.get(item.nodeid, UNKNOWN_S)) for item in items}
    mine = set(split(by_id, n)[k - 1])
    config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in mine])
    items[:] = [i for i in items if i.nodeid in mine]


_seconds: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    _seconds[report.nodeid] += report.duration


def pytest_sessionfinish(session):
    path = session.config.getoption("--record-durations")
    if not path or not _seconds:
        return
    with open(path, "a+") as f:  # both lanes merge into one file: one at a time
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        merged = json.loads(text) if text.strip() else {}
        merged.update({test: round(s, 2) for test, s in _seconds.items()})
        f.seek(0)
        f.truncate()
        f.write(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")
