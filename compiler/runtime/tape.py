"""The Tape: records differentiable operations and runs their adjoints in reverse.

    tape = Tape()
    with tape:
        launch(forces, n, inputs=[x], outputs=[f])
        launch(loss_kernel, n, inputs=[f], outputs=[loss])
    tape.backward(loss)          # or tape.backward(grads={f: seed})
    x.grad                       # d loss / d x
    tape.zero()                  # before the next backward on the same buffers

What we keep from Warp and what we do not:
- Seeds are copied into ``array.grad`` (added), never adopted: the seed array stays untouched and
  repeated ``backward``/``zero`` cycles give identical results.
- One gradient per pass, as in Warp and PyTorch: a second ``backward`` without ``zero()`` adds one
  more gradient to the inputs' ``.grad`` (the leaves), while the seeds and the gradients of arrays
  a recorded op wrote (intermediates) start again from zero, so no pass propagates an earlier one's.
- Overwrites are refused, not warned about. While a tape records, an operation that overwrites an
  array an earlier recorded operation read raises `OverwriteError` before anything is written;
  accumulation (``+=``, atomics) is not an overwrite. Every array carries a version counter, and
  ``backward`` refuses to run if an array a recorded operation read was modified since.
- Outside a ``with tape:`` block nothing is checked or recorded.

Contract for whoever records operations (the kernel launcher, copies): while a tape records, every
operation that writes or accumulates into arrays is passed to `Tape.record` (or, when it needs no
adjoint, to `Tape.check_writes`), and marks what it wrote with ``array._mark_written()``. The order
of the two does not matter; recording first means a refused overwrite leaves the data untouched.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..errors import OverwriteError

if TYPE_CHECKING:       # annotations only: arrays use the Tape at run time, never the other way round
    from .array import array

__all__ = ["RecordedOp", "Tape", "active_tape", "caller_location", "outside_tapes"]


@dataclass(eq=False, slots=True)
class RecordedOp:
    name: str                               # e.g. "launch of kernel 'integrate'" or "copy(dest, src)"
    reads: dict[str, "array"]               # argument name -> array the op reads
    writes: dict[str, "array"]              # argument name -> array the op overwrites (plain stores)
    accumulates: dict[str, "array"]         # argument name -> array the op only accumulates into
    backward: Callable[[], None]            # runs the adjoint; accumulates into .grad of the arrays
    where: str = ""                         # "file.py:42" of the user's call, for messages
    launch: tuple | None = None             # (kernel, dims, args, device, debug, deterministic) of a launch
    takes_fresh: bool = False               # backward(fresh) handles new gradients itself (Tape.backward)


_local = threading.local()   # per thread: the stack of tapes in `with` blocks, innermost last


def _stack() -> list["Tape"]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def active_tape() -> "Tape | None":
    """The innermost tape whose ``with`` block this thread is in, or None (then nothing records)."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def zero_fresh(pending: dict, grad: "array") -> bool:
    """Zero-fill `grad`'s memory if it is still pending in `pending` (Tape.backward's `fresh`, by
    storage), and forget it there; whether it was."""
    new = pending.pop(id(grad._storage), None)
    if new is None:
        return False
    new._zero_memory()
    return True


def _zero_all_fresh(pending: dict) -> None:
    for grad in pending.values():
        grad._zero_memory()
    pending.clear()


class outside_tapes:
    """``with outside_tapes():`` nothing records, whatever tapes the caller is inside (for runs of
    our own that must never land on a user's Tape). A None on the stack hides the tapes below it
    from `active_tape`; `settle` still runs their held launches. Launches inside that name no
    `deterministic` take this block's, as a recording Tape's launches take the Tape's."""

    __slots__ = ("deterministic", "_outer")

    def __init__(self, deterministic: bool = False):
        self.deterministic = deterministic

    def __enter__(self) -> None:
        _stack().append(None)
        self._outer = getattr(_local, "deterministic", False)
        _local.deterministic = self.deterministic

    def __exit__(self, *exc_info) -> bool:
        stack = _stack()
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is None:
                del stack[i]
                break
        _local.deterministic = self._outer
        return False


def untaped_deterministic() -> bool:
    """The `deterministic` of a launch that names none and runs on no tape (see outside_tapes)."""
    return getattr(_local, "deterministic", False)


def settle() -> None:
    """Run every held launch of this thread's tapes: called before anything reads or writes array
    data (a launch, host access), so held launches are never observed as not having run. While no
    tape of this thread defers launches (Tape.defer_launches), it costs one test."""
    if getattr(_local, "held", 0):
        for tape in _stack():
            if tape is not None and tape._deferred:
                tape.run_deferred()


_host_accesses = 0


def settle_for_host() -> None:
    """`settle` before array data leaves for the host or another library, counted: a step function
    that looks at data may launch differently from one step to the next (stepper/step/trace.py trusts a
    step's trace for steps it has not run only while its function has looked at none)."""
    global _host_accesses
    _host_accesses += 1
    settle()


def host_accesses() -> int:
    """How many times array data has left for the host or another library (`settle_for_host`)."""
    return _host_accesses


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_OUR_DIRS = tuple(os.path.join(_ROOT, pkg) + os.sep for pkg in ("compiler", "checkpoint", "stepper"))


@functools.lru_cache(maxsize=None)
def _user_file(co_filename: str) -> str | None:
    """The basename of a code object's file if it is the user's (not this project's packages)."""
    filename = os.path.abspath(co_filename)
    return None if filename.startswith(_OUR_DIRS) else os.path.basename(filename)


def caller_location() -> str:
    """``"file.py:42"`` of the innermost caller outside this project's packages, for messages.
    Every recorded launch asks, so the per-file verdict is cached."""
    frame = sys._getframe(1)
    while frame is not None:
        name = _user_file(frame.f_code.co_filename)
        if name is not None:
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def _describe(op: RecordedOp) -> str:
    return f"{op.name} ({op.where})" if op.where else op.name


def _describe_array(arr: "array") -> str:
    return f"array of {arr.dtype}, shape {arr.shape}"


@dataclass(eq=False, slots=True)
class _ReadRecord:
    """An array some recorded op read: the version the tape expects it to have, and the first op
    that read it (messages name that one)."""
    array: "array"
    version: int
    reader: RecordedOp
    reader_arg: str


_FIX_OVERWRITE = ("Fix: write the result into a new array instead (use a fresh buffer per step, e.g. "
                  "force0 and force1), or clone() the array before overwriting it.")


class Tape:
    """Records launches and differentiable copies while in ``with tape:``; `backward` differentiates.

    Reentrant (enter it again to record more) and repeatable (``backward`` again after `zero`).
    Nested tapes: only the innermost records.

    `deterministic=True` runs the adjoint of every launch recorded on this tape serially, in thread
    order, so gradients accumulated with atomics are the same bits on every run (and the same as any
    other run doing the same launches). It costs the adjoints' multithreading.
    """

    def __init__(self, deterministic: bool = False):
        self.deterministic = deterministic
        self._ops: list[RecordedOp] = []
        self._reads: dict[int, _ReadRecord] = {}     # id of the array's storage -> record
        # id of the storage of an array a recorded op stored or accumulated into -> (op, argument):
        # a later overwrite of it would leave that op's adjoint sending gradient for replaced values.
        self._written: dict[int, tuple] = {}
        self._seeded: dict[int, "array"] = {}        # id(array) -> array seeded by backward, for zero()
        self._passes = 0                             # backward passes since the last zero()
        self._depth = 0
        self._deferred: list | None = None           # held CPU launches, see defer_launches

    # -- launches whose results may never be needed ------------------------------------------------
    def defer_launches(self) -> None:
        """Hold the CPU launches recorded on this tape until something needs their results: a later
        launch, or host access to any array (`run_deferred` runs them, in order). Whoever knows that
        nothing will read what the last of them wrote can then drop it (`drop_deferred`): the
        stepper does, for a recorded step whose adjoint runs next (the adjoint replays the forward
        from the step's inputs; the step's outputs die unread)."""
        if self._deferred is None:
            self._deferred = []
            _local.held = getattr(_local, "held", 0) + 1

    @property
    def defers(self) -> bool:
        """Whether this tape holds its CPU launches for later (see defer_launches)."""
        return self._deferred is not None

    def hold(self, run: Callable[[], None]) -> bool:
        """Keep `run` (a launch) for later if this tape defers launches; False if it does not."""
        if self._deferred is None:
            return False
        self._deferred.append(run)
        return True

    def run_deferred(self) -> None:
        while self._deferred:
            self._deferred.pop(0)()

    def drop_deferred(self) -> int:
        """Forget the held launches without running them and stop deferring; how many there were."""
        if self._deferred is None:
            return 0
        dropped = len(self._deferred)
        self._deferred = None
        _local.held -= 1
        return dropped

    # -- recording -----------------------------------------------------------------------------
    def __enter__(self) -> "Tape":
        _stack().append(self)
        self._depth += 1
        return self

    def __exit__(self, *exc_info) -> bool:
        stack = _stack()
        if stack[-1] is self:          # the usual case: blocks nest
            stack.pop()
            self._depth -= 1
            return False
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is self:
                del stack[i]
                break
        self._depth -= 1
        return False

    @property
    def recording(self) -> bool:
        """Whether this tape is inside a ``with`` block (it records only if it is the innermost)."""
        return self._depth > 0

    @property
    def ops(self) -> tuple[RecordedOp, ...]:
        """The recorded operations, in the order they ran."""
        return tuple(self._ops)

    def check_writes(self, op: RecordedOp) -> None:
        """Raise `OverwriteError` if `op` overwrites an array that an earlier recorded op read, or
        one it reads itself. This is what `record` checks; host writes that have no adjoint
        (``fill_``, ``zero_``, a non-differentiable copy) call it without recording."""
        # Every recorded launch passes here, so the scan only looks for a conflict; the message
        # (which conflict comes first, and how to describe it) is worked out once one is found.
        reads = self._reads
        for targets in (op.writes, op.accumulates):
            for arr in targets.values():
                if id(arr._storage) in reads:
                    self._refuse_overwrite(op)
        written = self._written
        for arg, arr in op.writes.items():
            earlier = written.get(id(arr._storage))
            if earlier is not None:
                raise OverwriteError(
                    f"{_describe(op)} overwrites argument '{arg}' ({_describe_array(arr)}), which the earlier "
                    f"recorded {_describe(earlier[0])} wrote as argument '{earlier[1]}'. Its backward pass would "
                    f"still send gradient for the values this replaces, and give a wrong gradient.\n"
                    + _FIX_OVERWRITE)
        if op.writes and op.reads:
            for arr in op.writes.values():
                storage = arr._storage
                for read in op.reads.values():
                    if read._storage is storage:
                        self._refuse_overwrite(op)

    def _refuse_overwrite(self, op: RecordedOp) -> None:
        for arg, arr in op.writes.items():
            for read_arg, read_arr in op.reads.items():
                if read_arr._storage is arr._storage:
                    raise OverwriteError(
                        f"{_describe(op)} reads argument '{read_arg}' and overwrites it as argument "
                        f"'{arg}' ({_describe_array(arr)}) in the same operation; its backward pass "
                        f"would replay with the overwritten values and give a wrong gradient.\n"
                        + _FIX_OVERWRITE)
        # Accumulating (+=, atomics) into an array an earlier op read changes the values that op's
        # backward replays with, just as an overwrite does; only a write before any read is free.
        for kind, targets in (("overwrites", op.writes), ("accumulates into", op.accumulates)):
            for arg, arr in targets.items():
                record = self._reads.get(id(arr._storage))
                if record is not None:
                    raise OverwriteError(
                        f"{_describe(op)} {kind} argument '{arg}' ({_describe_array(arr)}), which the "
                        f"earlier recorded {_describe(record.reader)} read as argument '{record.reader_arg}'. "
                        f"Its backward pass needs the values it read, so changing them would give a wrong "
                        f"gradient.\n" + _FIX_OVERWRITE)

    def record(self, op: RecordedOp) -> None:
        """Append `op` to the tape after `check_writes`; remembers the version of every array it reads."""
        self.check_writes(op)
        self._ops.append(op)
        for targets in (op.writes, op.accumulates):
            for arg, arr in targets.items():
                self._written.setdefault(id(arr._storage), (op, arg))
        reads = self._reads
        for arg, arr in op.reads.items():
            key = id(arr._storage)
            # An older expected version stays: a change since is still caught at backward.
            if key not in reads:
                reads[key] = _ReadRecord(arr, arr._storage.version, op, arg)

    def has_read(self, arr: "array") -> bool:
        """Whether a recorded op read `arr` (or another view of its memory)."""
        return id(arr._storage) in self._reads

    def record_func(self, backward: Callable[[], None], arrays, *, name: str | None = None) -> None:
        """Record a custom Python adjoint `backward` of an operation that reads `arrays` (Warp's
        semantics: their gradients are zeroed by `zero`). Works inside or outside ``with tape:``."""
        label = name or f"record_func({getattr(backward, '__name__', 'backward')})"
        self.record(RecordedOp(label, {f"arrays[{i}]": a for i, a in enumerate(arrays)}, {}, {},
                               backward, caller_location()))

    def _note_write(self, arr: "array") -> None:
        # Called by array._mark_written() while this tape records: a write the tape has seen (and
        # checked, if it was an overwrite) is expected. A change the tape missed before it stays a miss.
        record = self._reads.get(id(arr._storage))
        if record is not None and arr.version == record.version + 1:
            record.version = arr.version

    # -- differentiating ---------------------------------------------------------------------------
    def backward(self, loss: "array | None" = None, grads: dict | None = None, *, fresh=()) -> None:
        """Run the recorded adjoints in reverse order, accumulating into ``.grad`` of the arrays.

        `loss`: a one-element float array with ``requires_grad=True``; 1.0 is added to its grad.
        `grads`: ``{array: seed}``; each seed (an array or array-like of the same shape) is added to
        ``array.grad``, copied, never adopted. Each call adds one gradient to the ``.grad`` of the
        arrays no recorded op wrote (as Warp and PyTorch do); seeds and intermediate gradients do
        not carry over from an earlier call. Call `zero` to start the inputs' gradients afresh.
        `fresh`: gradient arrays whose memory is new (not zeroed) and stands for zeros. An adjoint
        that writes every element of one (a gather form) stores into it instead of adding; any
        other use zero-fills it first, and backward zero-fills what nothing used. It spares
        filling memory that is about to be overwritten (the stepper's new gradient versions).
        """
        if self._depth > 0:
            raise RuntimeError("Tape.backward() was called while the tape is still recording (inside "
                               "'with tape:'); call it after the with-block has ended")
        self._check_versions()
        seeds = []
        if loss is not None:
            if loss.size != 1 or loss.dtype.inner_shape:
                raise ValueError(f"backward(loss): loss must be a one-element scalar array, got "
                                 f"{_describe_array(loss)}; to seed several outputs use grads={{...}}")
            seeds.append(self._seed_values(loss, 1.0, "backward(loss)"))
        for arr, seed in (grads or {}).items():
            seeds.append(self._seed_values(arr, seed, "backward(grads={array: seed})"))
        if self._passes:
            self._clear_pass_gradients()
        self._passes += 1
        pending = {id(g._storage): g for g in fresh}      # see `fresh`: fill or overwrite before use
        try:
            for arr, values in seeds:
                zero_fresh(pending, arr.grad)
                arr.grad._add_host(values)
                self._seeded.setdefault(id(arr), arr)
            for op in reversed(self._ops):
                if not pending:
                    op.backward()
                elif op.takes_fresh:
                    op.backward(pending)
                else:
                    _zero_all_fresh(pending)
                    op.backward()
        finally:
            _zero_all_fresh(pending)

    def _clear_pass_gradients(self) -> None:
        # An earlier pass left its adjoint in the seeds and in every array a recorded op wrote; the
        # ops of this pass would add to it and propagate both passes (the first counted twice).
        clear = dict(self._seeded)
        for op in self._ops:
            for arr in (*op.writes.values(), *op.accumulates.values()):
                clear.setdefault(id(arr), arr)
        for arr in clear.values():
            if arr.grad is not None:
                arr.grad._zero_memory()
                arr.grad._storage.version += 1

    def _seed_values(self, arr, seed, where: str):
        # The array checks and converts its own seed, so this module needs no import of array's.
        seed_values = getattr(arr, "_seed_values", None)
        if seed_values is None:
            raise TypeError(f"{where}: expected an array to seed, got {type(arr).__name__}")
        return arr, seed_values(seed, where)

    def _check_versions(self) -> None:
        for record in self._reads.values():
            arr = record.array
            if arr.version != record.version:
                raise OverwriteError(
                    f"{_describe(record.reader)} read argument '{record.reader_arg}' ({_describe_array(arr)}), but that "
                    f"array was modified after it was recorded (version {record.version} then, "
                    f"{arr.version} now: by assign, fill_, zero_, copy or a launch outside the tape). "
                    f"backward() would use the new values and give a wrong gradient.\nFix: leave arrays "
                    f"the tape still needs alone until backward() has run (modify a clone() or a new "
                    f"array instead), or tape.reset() and record again.")

    def _touched(self) -> list["array"]:
        """Every array a recorded op used or backward seeded, once each (worked out when asked, so
        that recording stays cheap)."""
        touched = {}
        for op in self._ops:
            for arr in (*op.reads.values(), *op.writes.values(), *op.accumulates.values()):
                touched.setdefault(id(arr), arr)
        for key, arr in self._seeded.items():
            touched.setdefault(key, arr)
        return list(touched.values())

    @property
    def gradients(self) -> dict:
        """``{array: array.grad}`` for every array with a gradient that this tape touched."""
        return {arr: arr.grad for arr in self._touched() if arr.grad is not None}

    def zero(self) -> None:
        """Zero every gradient this tape touched, seeded ones included; the recording stays."""
        self._passes = 0
        for arr in self._touched():
            if arr.grad is not None:
                arr.grad._zero_memory()
                arr.grad._storage.version += 1

    def reset(self) -> None:
        """Zero the gradients, then forget the recorded operations."""
        self.zero()
        self._ops.clear()
        self._reads.clear()
        self._written.clear()
        self._seeded.clear()

    # -- looking at it -----------------------------------------------------------------------------
    def visualize(self, filename: str | None = None, array_labels: dict | None = None) -> str:
        """The recorded graph in GraphViz dot: boxes for operations, ellipses for arrays (green if they
        have gradients), edges labelled with argument names (dashed: accumulation). Written to
        `filename` if given; render with ``dot -Tsvg tape.dot -o tape.svg``."""
        labels = array_labels or {}
        lines = ["digraph Tape {", "  rankdir=TB;", '  node [fontname="Helvetica"];']
        names: dict[int, str] = {}

        def node(arr) -> str:
            if id(arr) not in names:
                names[id(arr)] = f"a{len(names)}"
                text = labels.get(arr) or f"{arr.dtype} {arr.shape}"
                color = "palegreen" if arr.requires_grad else "lightgray"
                lines.append(f'  {names[id(arr)]} [label="{_dot(text)}", shape=ellipse, style=filled, '
                             f"fillcolor={color}];")
            return names[id(arr)]

        for i, op in enumerate(self._ops):
            text = op.name + (f"\n{op.where}" if op.where else "")
            lines.append(f'  op{i} [label="{_dot(text)}", shape=box, style=filled, fillcolor=gray90];')
            lines += [f'  {node(a)} -> op{i} [label="{_dot(arg)}"];' for arg, a in op.reads.items()]
            lines += [f'  op{i} -> {node(a)} [label="{_dot(arg)}"];' for arg, a in op.writes.items()]
            lines += [f'  op{i} -> {node(a)} [label="{_dot(arg)} (+=)", style=dashed];'
                      for arg, a in op.accumulates.items()]
        lines.append("}")
        text = "\n".join(lines) + "\n"
        if filename is not None:
            with open(filename, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    def __repr__(self) -> str:
        return f"<Tape: {len(self._ops)} recorded op(s){', recording' if self._depth else ''}>"


def _dot(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
