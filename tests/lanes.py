"""`make test`'s two lanes, split by measured duration rather than by marker.

    pytest --lane=1/2 --lane-claims=DIR  # this lane's share; another process runs 2/2, same DIR
    pytest --record-durations tests/durations.json   # merge this run's seconds into the file

Every lane collects the same tests. Most are a common pool: each lane takes the next test no lane
has taken yet (a claim file in DIR), longest first (tests/durations.json: set-up, call and
teardown of each test, from a recorded run), so the lanes end together however a run's times
differ from the recorded ones. The rest are split before the run, longest first to the lane with
the least time so far, and run before the pool: tests that share an expensive fixture wider than
a test (a module's Ray session, a session's training) or a folder outside their own, since a lane
makes such a fixture once, and the tests that must run last. Without --lane-claims every test is
split before the run. A test the file does not know counts UNKNOWN_S. Refresh the file after
tests change much: `make test PYTEST_ARGS=--record-durations=tests/durations.json`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_S = 0.5  # most tests the file lacks are new unit tests (it lists all it measured)
# Session fixtures worth making once: the tests using one run in the same lane (as do the tests
# of any other fixture wider than a test, one per module, but the cheap ones).
SHARED_FIXTURES = ("instrumented_run",)
# Fixtures wider than a test that are cheap to make again: a pooled test may use them.
CHEAP_SHARED = ("kernel", "tmp_path_factory")
# Tests that conftest.py moves to the end of their lane (a wait that passes beside the others).
RUN_LAST = ("test_the_lock_pins_everything_each_supported_python_installs",)
# Tests that build or use one folder outside their own: never in two lanes at once.
SHARED_FOLDERS = {"benchmarks/.venv-baseline (time_to_solve.baseline_python builds it)": (
    "smoke_mode[baseline_", "smoke_mode[image_peer.py]", "smoke_mode[time_to_solve.py]")}


def pytest_addoption(parser):
    parser.addoption("--lane", default=None, metavar="K/N",
                     help="run lane K of N: the selected tests split by tests/durations.json")
    # written --lane-claims=DIR: before conftest.py adds the option, pytest takes a separate DIR
    # that exists for a path to test, and finds its rootdir from it
    parser.addoption("--lane-claims", default=None, metavar="DIR",
                     help="with --lane: the pool's claims, one folder for all the lanes")
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
    """What a test shares with others (a fixture wider than a test but not cheap to make
    again, a folder), else its own id."""
    shared = [f for f in SHARED_FIXTURES if f in getattr(item, "fixturenames", ())]
    if shared:
        return f"fixture {shared[0]}"
    folder = [name for name, ids in SHARED_FOLDERS.items() if any(i in item.nodeid for i in ids)]
    if folder:
        return f"folder {folder[0]}"
    info = getattr(item, "_fixtureinfo", None)
    wide = sorted(f"fixture {name} of {defs[-1].baseid or 'a plugin'}"
                  for name, defs in (info.name2fixturedefs.items() if info else ())
                  if defs and defs[-1].scope != "function" and name not in CHEAP_SHARED)
    return wide[0] if wide else item.nodeid


def pooled(item) -> bool:
    """Whether any lane may run this test: it shares no group and need not run last."""
    return group_of(item) == item.nodeid and item.name not in RUN_LAST


def claim(claims: str, nodeid: str, lane: str) -> bool:
    """Whether this lane takes the test: the first lane to create its file in `claims` does."""
    path = os.path.join(claims, hashlib.sha1(nodeid.encode()).hexdigest())
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(f"{lane} {nodeid}\n")
    return True


_POOL = pytest.StashKey[set]()


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
    pool = {i.nodeid for i in items if pooled(i)} if config.getoption("--lane-claims") else set()
    by_id = {item.nodeid: (group_of(item), known.get(item.nodeid, UNKNOWN_S))
             for item in items if item.nodeid not in pool}
    mine = set(split(by_id, n)[k - 1])
    config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in mine | pool])
    # this lane's own tests in their order, then the pool's longest first
    items[:] = [i for i in items if i.nodeid in mine] + sorted(
        (i for i in items if i.nodeid in pool), key=lambda i: (-known.get(i.nodeid, UNKNOWN_S),
                                                               i.nodeid))
    config.stash[_POOL] = pool


def pytest_runtestloop(session):
    """With --lane-claims: a pooled test runs here only if this lane claims it first. A pooled
    test keeps nothing for the next (it uses no fixture worth keeping), so each is set up and
    torn down whole; a lane's own tests keep their shared fixtures from one to the next."""
    pool = session.config.stash.get(_POOL, set())
    claims = session.config.getoption("--lane-claims")
    if not pool or session.config.option.collectonly:
        return None  # pytest's own loop
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} errors during collection")
    items, elsewhere = session.items, []
    lane = session.config.getoption("--lane")
    for i, item in enumerate(items):
        if item.nodeid in pool and not claim(claims, item.nodeid, lane):
            elsewhere.append(item)
            continue
        after = items[i + 1] if i + 1 < len(items) else None
        shared = after is not None and item.nodeid not in pool and after.nodeid not in pool
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=after if shared else None)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
    session.config.hook.pytest_deselected(items=elsewhere)  # the other lanes ran them
    return True


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
