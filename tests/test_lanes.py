"""make test's lanes (tests/lanes.py): the split by measured durations, the common pool, and the
option."""

import os
import re

import pytest
from lanes import parse_lane, split


def test_the_split_gives_each_lane_about_half_and_keeps_a_shared_fixture_in_one_lane():
    tests = {"a": ("a", 100.0), "b": ("b", 60.0), "c": ("c", 50.0), "d": ("d", 10.0),
             "e": ("fixture f", 30.0), "g": ("fixture f", 30.0), "h": ("h", 5.0)}
    one, two = split(tests, 2)
    assert sorted(one + two) == sorted(tests)  # every test once
    seconds = [sum(tests[t][1] for t in lane) for lane in (one, two)]
    assert sorted(seconds) == [135.0, 150.0], seconds  # longest first: 285 s as 150 and 135
    assert {"e", "g"} <= set(one) or {"e", "g"} <= set(two)  # one fixture, one lane
    again = split(dict(reversed(tests.items())), 2)  # every lane computes the same split
    assert [set(lane) for lane in again] == [set(one), set(two)]


def test_a_lane_that_is_not_k_of_n_is_refused_naming_it():
    assert parse_lane("2/2") == (2, 2)
    for bad in ("0/2", "3/2", "1", "a/b", "1/2/3", ""):
        with pytest.raises(ValueError, match=rf"--lane={bad!r}: expected K/N"):
            parse_lane(bad)


def test_tests_of_one_shared_fixture_or_folder_are_one_group():
    from types import SimpleNamespace

    from lanes import group_of

    def item(nodeid, *fixtures):
        return SimpleNamespace(nodeid=nodeid, fixturenames=fixtures)

    bench = "tests/test_benchmarks.py::test_a_benchmark_runs_its_smoke_mode"
    groups = {group_of(item(f"{bench}[{s}]")) for s in ("baseline_dqn.py", "image_peer.py",
                                                       "baseline_minatar_dqn.py", "time_to_solve.py")}
    assert len(groups) == 1 and groups != {f"{bench}[image_peer.py]"}
    assert group_of(item(f"{bench}[sweep.py]")) == f"{bench}[sweep.py]"
    assert group_of(item("t.py::a", "tmp_path", "instrumented_run")) == \
        group_of(item("u.py::b", "instrumented_run"))


@pytest.mark.parametrize("together", [True, False], ids=["together", "one-after-the-other"])
def test_two_lanes_run_the_pool_once_each_test_and_keep_a_module_fixture_in_one_lane(tmp_path,
                                                                                    together):
    """Two real pytest processes with one claims folder: every pooled test runs in exactly one
    of them, each lane's report counts the rest as deselected, and the tests of a module-scoped
    fixture run in one lane, which makes the fixture once. One after the other, the second lane
    finds every pooled test taken (as a lane slow to start may: CI saw it) and runs none, and
    still passes."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from lanes import pytest_addoption, pytest_collection_modifyitems, pytest_runtestloop\n")
    (tmp_path / "test_x.py").write_text(
        "import os\nimport pytest\n\n"
        "def log(what):\n"
        "    with open(os.environ['LANE_LOG'], 'a') as f:\n"
        "        f.write(f'{os.environ[\"LANE\"]} {what}\\n')\n\n"
        "@pytest.fixture(scope='module')\n"
        "def shared():\n    log('fixture')\n    yield\n\n"
        "@pytest.mark.parametrize('n', range(30))\n"
        "def test_pooled(n, tmp_path):\n    log(f'pooled {n}')\n\n"
        "@pytest.mark.parametrize('n', range(4))\n"
        "def test_shared(n, shared):\n    log(f'shared {n}')\n")
    claims, log = tmp_path / "claims", tmp_path / "ran.log"
    claims.mkdir()
    def start_lane(k: int) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_x.py",
             f"--lane={k}/2", f"--lane-claims={claims}"], cwd=tmp_path,
            env={**os.environ, "LANE_LOG": str(log), "LANE": str(k)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    if together:
        lanes = [start_lane(1), start_lane(2)]
        outs = [started.communicate(timeout=120)[0] for started in lanes]
    else:
        lanes, outs = [], []
        for k in (1, 2):
            lanes.append(start_lane(k))
            outs.append(lanes[-1].communicate(timeout=120)[0])
    assert [lane.returncode for lane in lanes] == [0, 0], outs
    ran = [line.split(" ", 1) for line in log.read_text().splitlines()]
    pooled = sorted(int(what.split()[1]) for _, what in ran if what.startswith("pooled"))
    assert pooled == list(range(30)), ran  # each once, none lost
    assert len(list(claims.iterdir())) == 30  # taken through the claims, not split beforehand
    shared = {lane for lane, what in ran if what.startswith(("shared", "fixture"))}
    assert len(shared) == 1 and sum(what == "fixture" for _, what in ran) == 1, ran
    # A lane may run no test at all (CI: one lane claimed all 30 before the other had collected),
    # and pytest's summary leaves out a count of 0.
    counts = [tuple(int(m[1]) if (m := re.search(rf"(\d+) {word}", out)) else 0
                    for word in ("passed", "deselected")) for out in outs]
    assert all(passed + deselected == 34 for passed, deselected in counts), outs
    assert sum(passed for passed, _ in counts) == 34, outs
    if not together:  # the first lane took the whole pool
        assert counts == [(34, 0), (0, 34)], outs
