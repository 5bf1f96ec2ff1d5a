"""Reading Prometheus text exposition (format 0.0.4): the one parser of ``/metrics`` in the package.

``cuvil-edge top`` and the load generator both read the daemon's ``/metrics``; they share this parser
(they sit in one layer and may not import each other). It keeps labels (quoted values may hold
braces, commas and escapes) and skips comments and malformed lines: a view must not die on one odd
line.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Samples", "flatten", "parse_prometheus", "series_key"]

Samples = dict[str, list[tuple[dict[str, str], float]]]


def _unescape(value: str) -> str:
    out, i = [], 0
    while i < len(value):
        c = value[i]
        if c == "\\" and i + 1 < len(value):
            nxt = value[i + 1]
            out.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_prometheus(text: str) -> Samples:
    """Parse Prometheus text exposition (0.0.4) into ``{name: [(labels, value), ...]}``.

    Comments and malformed lines are skipped: a view must not die on one odd line.
    """
    out: Samples = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        labels: dict[str, str] = {}
        if "{" in line:
            name, _, rest = line.partition("{")
            body, value_text = _split_labels(rest)
            if body is None:
                continue
            labels = body
        else:
            name, _, value_text = line.partition(" ")
        try:
            value = float(value_text.split()[0])
        except (ValueError, IndexError):
            continue
        out.setdefault(name.strip(), []).append((labels, value))
    return out


def _split_labels(rest: str) -> tuple[dict[str, str] | None, str]:
    """Labels up to the closing brace (quotes may hold braces and commas), and the value text."""
    labels: dict[str, str] = {}
    i, n = 0, len(rest)
    while i < n:
        while i < n and rest[i] in " ,":
            i += 1
        if i < n and rest[i] == "}":
            return labels, rest[i + 1:].strip()
        eq = rest.find("=", i)
        if eq < 0 or eq + 1 >= n or rest[eq + 1] != '"':
            return None, ""
        key = rest[i:eq].strip()
        j = eq + 2
        buf = []
        while j < n and rest[j] != '"':
            if rest[j] == "\\" and j + 1 < n:
                buf.append(rest[j:j + 2])
                j += 2
                continue
            buf.append(rest[j])
            j += 1
        if j >= n:
            return None, ""
        labels[key] = _unescape("".join(buf))
        i = j + 1
    return None, ""


def series_key(name: str, labels: dict[str, str]) -> str:
    """``name{k="v",...}`` as the exposition writes a series (labels in their order)."""
    if not labels:
        return name
    escaped = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{name}{{{escaped}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def flatten(samples: Samples, names: Iterable[str]) -> dict[str, float]:
    """``{series_key: value}`` for the series of ``names`` (what a JSON report keeps)."""
    return {series_key(name, labels): value for name in names for labels, value in samples.get(name, [])}
