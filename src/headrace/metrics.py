"""Metrics exposition: every component's ``metrics()`` dict as Prometheus text.

Components keep plain counters and gauges in a dict (cheap, testable, no client library in the
hot path); ``prometheus()`` renders them in the text exposition format (version 0.0.4) for a
scrape endpoint or a node-exporter textfile. Nested dicts flatten with ``_``; non-numeric values
(names, lists) are left out; booleans are 0/1.
"""

from __future__ import annotations

import math
import re

_BAD_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_:]")


def metric_name(*parts: str) -> str:
    """A valid Prometheus metric name from ``parts`` joined by ``_``."""
    name = _BAD_NAME_CHARS.sub("_", "_".join(p for p in parts if p))
    return f"_{name}" if name[:1].isdigit() else name


def _label_name(name: str) -> str:
    name = re.sub(r"[^a-zA-Z0-9_]", "_", name)
    return f"_{name}" if name[:1].isdigit() or not name else name


def _label_value(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _flatten(metrics: dict, prefix: str):
    for key, value in metrics.items():
        name = metric_name(prefix, str(key))
        if isinstance(value, dict):
            yield from _flatten(value, name)
        elif isinstance(value, bool):
            yield name, int(value)
        elif isinstance(value, int | float):
            yield name, value


def _value(v: int | float) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf")
    return repr(v)


def prometheus_text(metrics: dict, prefix: str, labels: dict[str, object] | None = None) -> str:
    """One ``name{labels} value`` line per numeric metric, sorted by name."""
    lab = ""
    if labels:
        lab = "{" + ",".join(f'{_label_name(k)}="{_label_value(v)}"'
                             for k, v in sorted(labels.items())) + "}"
    return "".join(f"{name}{lab} {_value(value)}\n"
                   for name, value in sorted(_flatten(metrics, prefix)))


class PrometheusExport:
    """Mixin for a component that defines ``metrics() -> dict``: adds ``prometheus(labels)``."""

    metrics_prefix: str = "headrace"

    def prometheus(self, labels: dict[str, object] | None = None) -> str:
        return prometheus_text(self.metrics(), self.metrics_prefix, labels)
