"""The example models the benchmarks run: ``make(name, size)`` gives a `Problem`.

Each model lives in its own module, so that running one compiles only its kernels.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

__all__ = ["Problem", "PROBLEMS", "make", "load"]

# name -> (module, default size, what the size means)
PROBLEMS = {
    "wave": ("wave", 64, "grid side"),
    "cloth": ("cloth", 12, "particles per side"),
    "particles": ("particles", 256, "particles"),
}


@dataclass(frozen=True)
class Problem:
    """A model, its initial state and a terminal loss (and optionally a running loss), ready for
    ``model.gradient``. A user's ``--model module:function`` returns one."""
    name: str
    description: str
    model: object
    initial: dict
    loss: Callable | None
    running_loss: Callable | None = None


def make(name: str, size: int | None = None) -> Problem:
    """The example `name` ('wave', 'cloth' or 'particles') at `size` (None: its default)."""
    if name not in PROBLEMS:
        raise ValueError(f"unknown example {name!r}; choose one of {', '.join(PROBLEMS)}")
    module, default, _ = PROBLEMS[name]
    return importlib.import_module(f"{__name__}.{module}").make(default if size is None else size)


def load(spec: str, size: int | None = None) -> Problem:
    """The `Problem` a user's ``module:function`` returns (``function(size)`` if a size is given,
    else ``function()``); the module is imported from the current directory or ``sys.path``."""
    import os
    import sys
    module_name, sep, function = spec.partition(":")
    if not sep or not module_name or not function:
        raise ValueError(f"--model {spec!r}: expected module:function, e.g. mymodel:make_problem")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"--model {spec!r}: cannot import module '{module_name}': {e}") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ValueError(f"--model {spec!r}: module '{module_name}' has no function '{function}'")
    problem = fn() if size is None else fn(size)
    if not isinstance(problem, Problem):
        raise ValueError(f"--model {spec!r}: {function}() returned a {type(problem).__name__}; return "
                         f"stepper.bench.Problem(name, description, model, initial, loss, running_loss=None)")
    if problem.loss is None and problem.running_loss is None:
        raise ValueError(f"--model {spec!r}: the Problem has neither loss nor running_loss")
    return problem
