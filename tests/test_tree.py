"""What a fresh clone holds: the repository's own files and nothing that reaches out of it.

A link once committed here (benchmarks/.venv-baseline -> /tmp/blvenv) made every clone's
benchmark tests fail except on the machine whose /tmp had that folder. It got in because
.gitignore said `benchmarks/.venv-baseline/`: a pattern ending in a slash matches a directory,
not a link, so `git add -A` took the link. Both ways in are checked here, on the checkout and on
a repository made to hold each fault (so that the checks are seen to fail).
"""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                          check=True, timeout=60).stdout


def links_out_of_tree(root: Path) -> list[str]:
    """Tracked links that point outside the repository or at nothing: 'path -> target (why)'."""
    found = []
    for line in _git(root, "ls-files", "-s", "-z").split("\0"):
        if not line.startswith("120000 "):  # git's mode for a symbolic link
            continue
        path = line.split("\t", 1)[1]
        target = os.readlink(root / path)
        resolved = (root / path).parent.joinpath(target).resolve()
        if not resolved.is_relative_to(root.resolve()):
            found.append(f"{path} -> {target} (outside the repository)")
        elif not resolved.exists():
            found.append(f"{path} -> {target} (points at nothing)")
    return found


def tracked_but_ignored(root: Path) -> list[str]:
    """Tracked files that .gitignore says should not be: how a local folder or link gets in."""
    return _git(root, "ls-files", "--cached", "--ignored", "--exclude-standard").split()


def test_no_tracked_link_points_out_of_the_repository():
    assert links_out_of_tree(ROOT) == []


def test_no_tracked_file_is_one_gitignore_excludes():
    assert tracked_but_ignored(ROOT) == []


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "--quiet")
    return root


def test_the_checks_find_a_link_out_of_the_tree_and_a_dangling_one(repo, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (repo / "inside.txt").write_text("x")
    (repo / "ok").symlink_to("inside.txt")
    (repo / "out").symlink_to(tmp_path / "elsewhere")
    (repo / "gone").symlink_to("missing.txt")
    _git(repo, "add", "-A")
    assert links_out_of_tree(repo) == [
        "gone -> missing.txt (points at nothing)", f"out -> {tmp_path / 'elsewhere'} (outside "
        "the repository)"]


def test_a_directory_pattern_lets_a_link_in_and_the_check_sees_it(repo, tmp_path):
    # The exact way the venv link got in: `name/` ignores a folder of that name, not a link.
    (tmp_path / "venv").mkdir()
    (repo / ".gitignore").write_text(".venv-baseline/\n")
    (repo / ".venv-baseline").symlink_to(tmp_path / "venv")
    _git(repo, "add", "-A")
    assert ".venv-baseline" in _git(repo, "ls-files").split()
    (repo / ".gitignore").write_text(".venv-baseline\n")  # the fix: a pattern for any kind
    assert tracked_but_ignored(repo) == [".venv-baseline"]
