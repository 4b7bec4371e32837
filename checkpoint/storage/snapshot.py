"""The snapshot value type and the checks every storage applies on write.

All storages share these checks so that a snapshot that MemoryStorage accepts
is one that HDF5Storage accepts too: a schedule can move snapshots between
tiers without surprises.
"""

from __future__ import annotations

import json
import numbers
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

__all__ = ["Snapshot", "check_step", "copy_arrays", "make_metadata", "RESERVED_KEYS"]

# Keys the storage fills in itself; user metadata may not override them because
# read() checks the arrays against "shapes" and "dtypes".
RESERVED_KEYS = ("step", "shapes", "dtypes")

# Kinds HDF5 stores natively and bit-exactly: bool, signed, unsigned, float,
# complex. Objects and strings would need pickling, which we refuse.
_STORABLE_KINDS = "biufc"


@dataclass(frozen=True)
class Snapshot:
    """One stored state: ``step``, ``arrays`` (name -> ndarray), ``metadata``.

    ``metadata`` always holds ``step``, ``time`` (the caller's
    ``metadata["time"]`` if given, else the wall-clock time of the write, in
    seconds since the epoch), ``shapes`` (name -> tuple) and ``dtypes``
    (name -> dtype string such as ``"<f4"``), plus any user metadata.
    Both mappings are read-only views.
    """

    step: int
    arrays: Mapping[str, np.ndarray]
    metadata: Mapping[str, Any]

    @property
    def nbytes(self) -> int:
        """Bytes of array data in this snapshot (uncompressed)."""
        return sum(int(a.nbytes) for a in self.arrays.values())


def check_step(step: Any) -> int:
    """Return ``step`` as a Python int, or raise a TypeError/ValueError naming it."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"snapshot step must be an integer, got {step!r} ({type(step).__name__})")
    step = int(step)
    if step < 0:
        raise ValueError(f"snapshot step must be >= 0, got {step}")
    return step


def copy_arrays(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Copy the caller's arrays into fresh C-contiguous arrays we own.

    Copying is what lets ``write`` return before the data reach disk: the caller
    may overwrite its buffers at once (the stepper reuses them every step).
    """
    if not isinstance(arrays, Mapping):
        raise TypeError(
            f"snapshot arrays must be a dict of name -> numpy array, got {type(arrays).__name__}"
        )
    if not arrays:
        raise ValueError("a snapshot needs at least one array; got an empty dict")
    copies = {}
    for name, value in arrays.items():
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise ValueError(
                f"array name {name!r} cannot be stored: use a non-empty string without '/'"
            )
        array = np.asarray(value)
        if array.dtype.kind not in _STORABLE_KINDS or array.dtype.fields is not None:
            raise TypeError(
                f"array {name!r} has dtype {array.dtype}, which snapshots cannot store; "
                "use a numeric or bool dtype (store vectors as an (n, 3) array)"
            )
        copies[name] = np.array(array, copy=True, order="C")
    return copies


def make_metadata(step: int, arrays: Mapping[str, np.ndarray], user: Mapping | None) -> dict:
    """Build the full metadata dict of a snapshot from the caller's metadata.

    User metadata must survive a trip through JSON (that is how HDF5Storage
    stores it), so both storages check that here, with the same result.
    """
    user = {} if user is None else user
    if not isinstance(user, Mapping):
        raise TypeError(f"snapshot metadata must be a dict, got {type(user).__name__}")
    for key in RESERVED_KEYS:
        if key in user:
            raise ValueError(
                f"metadata key {key!r} is filled in by the storage; rename your key "
                f"(reserved keys: {', '.join(RESERVED_KEYS)})"
            )
    try:
        user = json.loads(json.dumps(dict(user), allow_nan=True))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"snapshot metadata for step {step} must be JSON-serialisable "
            f"(str, int, float, bool, None, lists and dicts of them): {exc}"
        ) from None
    when = user.pop("time", None)
    if when is None:
        when = time.time()
    elif not isinstance(when, (int, float)) or isinstance(when, bool):
        raise TypeError(f"metadata['time'] must be a number, got {when!r}")
    return {
        "step": step,
        "time": float(when),
        "shapes": {name: tuple(a.shape) for name, a in arrays.items()},
        "dtypes": {name: a.dtype.str for name, a in arrays.items()},
        **user,
    }


def freeze(step: int, arrays: dict[str, np.ndarray], metadata: dict) -> Snapshot:
    """Wrap arrays and metadata into a Snapshot whose mappings cannot be edited."""
    return Snapshot(step, MappingProxyType(arrays), MappingProxyType(metadata))
