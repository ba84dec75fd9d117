"""Prometheus text exposition of a component's ``metrics()`` dict."""

from __future__ import annotations


def prometheus_text(metrics: dict, prefix: str = "headrace_reservoir",
                    labels: dict[str, str] | None = None) -> str:
    """One ``name{labels} value`` line per numeric metric (bools as 0/1)."""
    lab = ""
    if labels:
        inner = ",".join(f'{k}="{str(v).replace(chr(34), "")}"' for k, v in sorted(labels.items()))
        lab = "{" + inner + "}"
    lines = []
    for name, value in sorted(metrics.items()):
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, int | float):
            lines.append(f"{prefix}_{name}{lab} {value}")
    return "\n".join(lines) + "\n"
