"""The `distrl` command: `distrl train ...`, `distrl collector --db PATH --port PORT`,
`distrl gke plan|create|teardown|cost|render --project-id ID ...`, `distrl cluster up|down|status`."""

from __future__ import annotations

import sys

COMMANDS = {"train": "distrl.apex.train", "collector": "distrl.otel.collector", "gke": "distrl.gke.create",
            "cluster": "distrl.cluster.local"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in {"-h", "--help"} or argv[0] not in COMMANDS:
        known = ", ".join(COMMANDS)
        if argv and argv[0] not in {"-h", "--help"}:
            print(f"error: unknown command {argv[0]!r}; expected one of: {known}", file=sys.stderr)
        print("usage: distrl {train,collector,gke,cluster} [options]   (distrl COMMAND --help for options)",
              file=sys.stderr if argv and argv[0] not in {"-h", "--help"} else sys.stdout)
        return 0 if argv and argv[0] in {"-h", "--help"} else 2
    import importlib

    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
