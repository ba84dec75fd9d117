"""Helpers shared by the backup tests: build directory trees and compare them."""

from __future__ import annotations

import os
from pathlib import Path


def write_tree(root: Path, spec: dict) -> None:
    """spec: name -> bytes (a file) or dict (a subdirectory, possibly empty)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, value in spec.items():
        if isinstance(value, dict):
            write_tree(root / name, value)
        else:
            (root / name).write_bytes(value)


def read_tree(root: Path) -> dict:
    """The inverse of write_tree: a directory as nested dicts of bytes."""
    out: dict = {}
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False):
            out[entry.name] = read_tree(Path(entry.path))
        else:
            out[entry.name] = Path(entry.path).read_bytes()
    return out


def sample_tree(seed: int = 0) -> dict:
    rnd = __import__("random").Random(seed)
    return {
        "000001.sst": rnd.randbytes(70_000),
        "000002.sst": rnd.randbytes(3_000),
        "MANIFEST-000001": rnd.randbytes(500),
        "CURRENT": b"MANIFEST-000001\n",
        "empty.txt": b"",
        "emptydir": {},
        "sub": {
            "a.sst": rnd.randbytes(20_000),
            "deep": {"deeper": {"b.batch": rnd.randbytes(9_000), "nothing": {}}},
        },
    }
