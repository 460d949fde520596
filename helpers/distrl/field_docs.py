"""The docstring written under each field of a dataclass, for a command line's --help: the
settings (rl.config.ApexConfig, otel.limits.Limits) say once what each field means."""

from __future__ import annotations

import ast
import inspect
from functools import cache


@cache
def field_help(cls: type) -> dict[str, str]:
    """Map each field of the dataclass `cls` to the docstring written under it."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs: dict[str, str] = {}
    for stmt, nxt in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)):
            docs[stmt.target.id] = str(nxt.value.value).strip()
    return docs
