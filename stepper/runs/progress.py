"""Progress bars for long rollouts and gradients: tqdm when it is installed, otherwise nothing.

``progress=None`` (the default everywhere) means: show a bar when stderr is a terminal and the run
is not under CI (the ``CI`` variable that CI services set); True or False decide explicitly.
"""
from __future__ import annotations

import os
import sys

__all__ = ["progress_bar"]


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def _wanted(progress) -> bool:
    if progress is not None:
        return bool(progress)
    if os.environ.get("CI"):
        return False
    stream = sys.stderr
    return hasattr(stream, "isatty") and stream.isatty()


def progress_bar(progress, total: int | None, desc: str):
    """A bar with `update(n)`, `set_description(text)` and `close()`; a no-op one when not wanted or
    when tqdm is missing."""
    if not _wanted(progress):
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="step", leave=False, dynamic_ncols=True)
