"""Functions of the package longer than a limit (default 60 lines), longest first:
`python tools/long_functions.py [--limit N]`. Issue 53's goal: none over 60."""

import argparse
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "helpers" / "distrl"


def long_functions(limit: int = 60) -> list[tuple[int, str]]:
    """(lines, "file:line name") of every function or method over limit lines."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append((lines, f"{path.relative_to(PACKAGE.parent)}:{node.lineno} "
                                         f"{node.name}"))
    return sorted(found, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=60)
    args = parser.parse_args()
    for lines, where in long_functions(args.limit):
        print(f"{lines:4d}  {where}")


if __name__ == "__main__":
    main()
