"""The local collector's bearer token: in a file its owner alone can read, never in an argument
(arguments show in `ps`). LocalCollector makes one beside its database by default, so that a
client on the machine without it costs the collector only a refused header; its own clients
(the trainings' exporters, explore.Monitoring) take the file's path."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def token_path(db_path: str | Path) -> Path:
    """Where LocalCollector keeps the token of a database by default: <db>.token beside it."""
    db_path = Path(db_path)
    return db_path.with_name(db_path.name + ".token")


def new_token_file(path: str | Path) -> Path:
    """A new random token in a file readable by its owner alone, or the file already there
    (a collector started again on the same database keeps its clients' token)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        read_token(path)  # one that cannot be used is said now, by name
        return path
    except OSError as err:
        raise ValueError(f"token_file={str(path)!r} cannot be made: {err.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    return path


def read_token(token_file: str | Path) -> str:
    """A bearer token from a file (a file, not an argument: arguments show in `ps`)."""
    path = Path(token_file)
    try:
        mode = path.stat().st_mode & 0o777
        token = path.read_text().strip()
    except OSError as err:
        raise ValueError(f"token_file={str(path)!r} cannot be read: {err.strerror}") from None
    if mode & 0o077:
        raise ValueError(f"token_file={str(path)!r} is readable by others (mode {mode:o}); a "
                         f"secret must be private: chmod 600 {path}")
    if len(token) < 16 or any(c.isspace() or not c.isprintable() for c in token):
        raise ValueError(f"token_file={str(path)!r} must hold one token of at least 16 "
                         "printable characters without spaces")
    return token


def bearer_header(token_file: str | Path | None) -> dict[str, str]:
    """The authorization header (gRPC metadata) that carries the token; none without a file."""
    return {} if token_file is None else {"authorization": f"Bearer {read_token(token_file)}"}
