"""make test's lanes (tests/lanes.py): the split by measured durations, and the option."""

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
