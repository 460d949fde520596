"""What a MetricService request may say, and how what it may not is refused: the errors that
become a call's gRPC status, and Cloud Monitoring's filter language (selectors, comparisons,
functions, RE2 regular expressions) as the local collector reads it (distrl.otel.monitoring
lists what it answers)."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

import grpc
import re2

RESOURCE_TYPE = "prometheus_target"  # of every series that arrives over OTLP, named so:
METRIC_TYPE_PREFIX = "prometheus.googleapis.com/"
MAX_FILTER_CHARS = 65_536       # this collector's own ceiling on a filter's length


class Refused(Exception):
    """A request the local collector does not answer; becomes a gRPC status."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


def excerpt(text: str, limit: int = 60) -> str:
    """A client's text quoted in an error, never more than about `limit` characters: a 1 MB
    filter echoed back would make the error itself too large for the client."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text):,} characters)"


def invalid(message: str) -> Refused:
    return Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


def unimplemented(message: str) -> Refused:
    return Refused(grpc.StatusCode.UNIMPLEMENTED, f"{message} (the local collector answers "
                   "the subset of Cloud Monitoring that distrl.otel.monitoring documents)")


# ---- filters ----

@functools.lru_cache(maxsize=256)
def _re2(pattern: str):
    """Cloud Monitoring's regex dialect is RE2 (cloud.google.com/monitoring/api/v3/filters):
    linear time, no backtracking, so no pattern can stall the collector ("(a+)+" with Python's
    re doubles its time with every character)."""
    options = re2.Options()
    options.log_errors = False  # a client's bad pattern is its error, not our log line
    return re2.compile(pattern, options)


_TOKEN = re.compile(r"""
    \s*(?:
      (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<selector>[A-Za-z_]\w*(?:\.(?:[A-Za-z_][\w-]*|"(?:[^"\\]|\\.)*"))*)
    | (?P<op>!=|=~|>=|<=|=|<|>|:)
    | (?P<punct>[(),])
    | (?P<bad>\S)
    )""", re.VERBOSE)
_FUNCTIONS = {
    "starts_with": lambda value, args: value.startswith(args[0]),
    "ends_with": lambda value, args: value.endswith(args[0]),
    "has_substring": lambda value, args: args[0] in value,
    "one_of": lambda value, args: value in args,
    "monitoring.regex.full_match": lambda value, args: _re2(args[0]).fullmatch(value) is not None,
}


def _unquote(text: str) -> str:
    return json.loads(text) if text.startswith('"') else text


@dataclass(frozen=True)
class Term:
    """One comparison of a filter: selector (e.g. ("metric.label", "rl.run.id")) op value."""

    scope: str                 # metric.type | resource.type | metric.label | resource.label
    key: str | None
    negate: bool
    function: str | None       # None: equality with args[0]
    args: tuple[str, ...]

    def matches(self, value: str | None) -> bool:
        if value is None:
            hit = False
        elif self.function is None:
            hit = value == self.args[0]
        else:
            hit = _FUNCTIONS[self.function](value, self.args)
        return hit != self.negate


def selector(text: str) -> tuple[str, str | None]:
    parts = re.findall(r'"(?:[^"\\]|\\.)*"|[^.]+', text)
    head = ".".join(parts[:2])
    if head in ("metric.type", "resource.type") and len(parts) == 2:
        return head, None
    if head in ("metric.label", "metric.labels", "resource.label", "resource.labels") \
            and len(parts) >= 3:
        key = ".".join(_unquote(p) for p in parts[2:])
        return head.rstrip("s"), key
    if parts[0] in ("metadata", "project", "group"):  # real selectors, not answered here
        raise unimplemented(f"filter selector {excerpt(text)} is not supported; use metric.type, "
                             "resource.type, metric.labels.KEY or resource.labels.KEY")
    raise invalid(f"filter selector {excerpt(text)} is not a Cloud Monitoring selector (expected "
                   "metric.type, resource.type, metric.labels.KEY or resource.labels.KEY)")


def parse_filter(text: str) -> list[Term]:
    """The terms of a Cloud Monitoring filter (all must hold), or Refused."""
    if len(text) > MAX_FILTER_CHARS:
        raise invalid(f"filter {excerpt(text)} is longer than this collector's "
                       f"{MAX_FILTER_CHARS:,} characters")
    return _FilterParser(text).terms()


def _tokens(text: str) -> list[tuple[str, str]]:
    """(kind, text) of each token of a filter: selector, string, op or punct."""
    tokens = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind == "bad":
            raise invalid(f"filter {excerpt(text)}: unexpected character "
                           f"{excerpt(m.group(kind))}")
        tokens.append((kind, m.group(kind)))
    return tokens


class _FilterParser:
    """Comparisons joined by AND: selector = "string", selector != "string", or selector =
    function("string", ...)."""

    def __init__(self, text: str):
        self.shown, self.tokens, self.i = excerpt(text), _tokens(text), 0

    def take(self, expected_kind: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.tokens):
            raise invalid(f"filter {self.shown} ends early")
        token = self.tokens[self.i]
        self.i += 1
        if expected_kind and token[0] != expected_kind:
            raise invalid(f"filter {self.shown}: expected a {expected_kind}, got "
                           f"{excerpt(token[1])}")
        return token

    def terms(self) -> list[Term]:
        terms = []
        while self.i < len(self.tokens):
            if terms:
                self._joiner()
            terms.append(self._comparison())
        return terms

    def _joiner(self) -> None:
        """Comparisons side by side are joined by AND, as in Cloud Monitoring's own filters
        (`metric.type="..." resource.type="prometheus_target"`, in Google's dashboards)."""
        kind, value = self.tokens[self.i]
        if value == "AND":
            self.i += 1
        elif value in ("OR", "NOT"):
            raise unimplemented(f"filter operator {value} is not supported; join comparisons "
                                 "with AND")
        elif kind != "selector":
            raise invalid(f"filter {self.shown}: expected AND between comparisons, got "
                           f"{excerpt(value)}")

    def _comparison(self) -> Term:
        kind, value = self.take()
        if value in ("NOT", "OR", "AND") or value == "(":
            raise unimplemented(f"filter {'parentheses' if value == '(' else value} "
                                 "is not supported; join comparisons with AND")
        if kind != "selector":
            raise invalid(f"filter {self.shown}: expected a selector such as metric.type, got "
                           f"{excerpt(value)}")
        scope, key = selector(value)
        _, op = self.take("op")
        if op not in ("=", "!="):
            raise unimplemented(f"filter operator {excerpt(op)} is not supported; use = or != "
                                 "(with a function such as starts_with or "
                                 "monitoring.regex.full_match for patterns)")
        if op == "=" and self.i < len(self.tokens) and self.tokens[self.i] == ("op", "="):
            raise invalid(f"filter {self.shown}: == is not a Monitoring filter comparison; "
                           "write = (cloud.google.com/monitoring/api/v3/filters)")
        kind, value = self.take()
        if kind == "string":
            return Term(scope, key, op == "!=", None, (_unquote(value),))
        if kind != "selector":
            raise invalid(f"filter {self.shown}: expected a quoted string or a function after "
                           f"{op}, got {excerpt(value)}")
        return Term(scope, key, op == "!=", value, self._arguments(value))

    def _arguments(self, function: str) -> tuple[str, ...]:
        """The quoted arguments of function(...), checked."""
        if function not in _FUNCTIONS:
            raise unimplemented(f"filter function {excerpt(function)} is not supported; "
                                 f"supported: {', '.join(_FUNCTIONS)}")
        self.take("punct")  # (
        args = []
        while True:
            args.append(_unquote(self.take("string")[1]))
            _, punct = self.take("punct")
            if punct == ")":
                break
            if punct != ",":
                raise invalid(f"filter {self.shown}: expected , or ) in {function}(...)")
        if function != "one_of" and len(args) != 1:
            raise invalid(f"filter {self.shown}: {function} takes one string, got {len(args)}")
        if function == "monitoring.regex.full_match":
            try:
                _re2(args[0])
            except re2.error as err:
                raise invalid(f"filter: bad RE2 regular expression {excerpt(args[0])}: "
                               f"{err.args[0] if err.args else err}") from None
        return tuple(args)


def project_of(name: str, what: str) -> str:
    match = re.fullmatch(r"projects/([^/]+)", name)
    if not match:
        raise invalid(f"{what} {excerpt(name)} is invalid: expected projects/PROJECT_ID")
    return match.group(1)
