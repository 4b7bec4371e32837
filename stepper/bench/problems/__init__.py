"""The example models the benchmarks run: ``make(name, size)`` gives a `Problem`.

Each model lives in its own module, so that running one compiles only its kernels.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

__all__ = ["Problem", "PROBLEMS", "make"]

# name -> (module, default size, what the size means)
PROBLEMS = {
    "wave": ("wave", 64, "grid side"),
    "cloth": ("cloth", 12, "particles per side"),
    "particles": ("particles", 256, "particles"),
}


@dataclass(frozen=True)
class Problem:
    """A model, its initial state and a terminal loss, ready for ``model.gradient``."""
    name: str
    description: str
    model: object
    initial: dict
    loss: Callable


def make(name: str, size: int | None = None) -> Problem:
    """The example `name` ('wave', 'cloth' or 'particles') at `size` (None: its default)."""
    if name not in PROBLEMS:
        raise ValueError(f"unknown example {name!r}; choose one of {', '.join(PROBLEMS)}")
    module, default, _ = PROBLEMS[name]
    return importlib.import_module(f"{__name__}.{module}").make(default if size is None else size)
