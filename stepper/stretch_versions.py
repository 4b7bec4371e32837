"""The versions a native stretch (stepper/native_sweep.py) reads and writes while it is worked out.

A stretch plans the executor's work before running any of it, so it cannot take and release
versions in the pool as it goes: it counts holds here instead, on plain counters, and hands the
pool the difference at the end (`hold_changes`). A version is the whole state (or the gradient of
its float states) as a tuple of arrays in state order; one the stretch finds held (a snapshot, the
live state, the carried adjoint, a kept record) is `found`, one it makes is `new`: arrays the
stretch released before, else the pool's. Holds on an array that the stretch did not count (a
recorded step's, say) keep it from being reused.
"""
from __future__ import annotations

from .native_loop import _ptr

__all__ = ["StretchVersions", "Version"]


class Version:
    """Its arrays in the order of `kinds`, how many hold it here (snapshots, the live state, the
    carry), their data pointers, and `ours`: whether all its arrays are the stretch's to reuse once
    it is released (None: not known yet, a version found held)."""
    __slots__ = ("arrays", "refs", "ptrs", "kinds", "ours")

    def __init__(self, arrays: tuple, refs: int, ptrs: list, kinds: list, ours: bool | None):
        self.arrays, self.refs, self.ptrs, self.kinds, self.ours = arrays, refs, ptrs, kinds, ours


class StretchVersions:
    """The versions of one stretch, over `kinds` (the states') and `grad_kinds` (their gradients';
    the same list where every state is a float one)."""

    def __init__(self, pool, kinds: list, grad_kinds: list):
        self.pool = pool
        self.free: dict = {}                     # Kind -> arrays of ours that nothing holds
        # whole versions of ours that nothing holds, by id of their kinds list: most of what a step
        # releases is taken again whole a moment later (a reversal's s.next serves its gradient)
        self.spares: dict[int, list[Version]] = {id(kinds): [], id(grad_kinds): []}
        self.taken: list = []                    # arrays taken from the pool
        self.arrays: dict[int, object] = {}      # id(array) -> every array found or taken
        self.start_refs: dict[int, int] = {}     # id(array) -> the holds counted here at the start
        self.found_by_ids: dict[tuple, Version] = {}   # the versions found, by their arrays' ids
        self.versions: list[Version] = []        # every version, found or made
        self.ptr: dict[int, int] = {}            # id(array) -> its data pointer
        self.external: dict[int, int] = {}      # id(array) -> holds on it not counted here

    def found(self, arrays: tuple, kinds: list) -> Version:
        """The version of `arrays`, one of whose holds (a snapshot's, the live state's, a record's)
        is counted here from now on. None stands for a state a kept record does not keep (Kept):
        its pointer is 0, which nothing of its reversal reads."""
        key = tuple(map(id, arrays))
        version = self.found_by_ids.get(key)
        if version is None:
            ptrs = [0 if a is None else _ptr(a) for a in arrays]
            self.ptr.update((k, p) for k, p in zip(key, ptrs) if p)
            version = self.found_by_ids[key] = Version(arrays, 0, ptrs, kinds, None)
            self.versions.append(version)
        version.refs += 1
        holds = self.pool.holds
        for a in arrays:
            if a is None:
                continue
            k = id(a)
            self.arrays[k] = a
            self.start_refs[k] = self.start_refs.get(k, 0) + 1
            self.external[k] = self.external.get(k, holds(a)) - 1
        return version

    def new(self, kinds: list) -> Version:
        """A version of `kinds` held once, here: a spare one, else arrays free here, else the pool's."""
        spare = self.spares[id(kinds)]
        if spare:                                # (no holder found later can hold its arrays: it is ours)
            version = spare.pop()
            version.refs = 1
            return version
        arrays = []
        for kind in kinds:
            free = self.free.get(kind)
            if not free and self._break_spare(kind):
                free = self.free[kind]
            if free:
                arrays.append(free.pop())
            else:
                a = self.pool.take(kind, False)
                self.taken.append(a)
                self.arrays[id(a)] = a
                self.start_refs[id(a)] = 1             # the stretch's own hold, dropped at the end
                self.external[id(a)] = 0
                self.ptr[id(a)] = _ptr(a)
                arrays.append(a)
        ptr = self.ptr
        version = Version(tuple(arrays), 1, [ptr[id(a)] for a in arrays], kinds, True)
        self.versions.append(version)
        return version

    def _break_spare(self, kind) -> bool:
        """Hand the arrays of a spare version of the other kinds list (states or gradients) to the
        free lists by kind, if one holds a `kind`: a new version takes what is free before the pool's."""
        for spare in self.spares.values():
            if spare and kind in spare[-1].kinds:
                version = spare.pop()
                for a, k in zip(version.arrays, version.kinds):
                    self.free.setdefault(k, []).append(a)
                return True
        return False

    def release(self, version: Version) -> None:
        version.refs -= 1
        if version.refs:
            return
        if version.ours is None:
            version.ours = all(a is not None and not self.external[id(a)] for a in version.arrays)
        if version.ours:
            self.spares[id(version.kinds)].append(version)
            return
        for a, kind in zip(version.arrays, version.kinds):
            if a is not None and not self.external[id(a)]:
                self.free.setdefault(kind, []).append(a)

    def hold_changes(self):
        """(array, holds gained (> 0) or lost (< 0)) for every array whose holds changed here."""
        refs: dict[int, int] = {}
        for version in self.versions:
            if version.refs:
                for a in version.arrays:
                    if a is not None:
                        refs[id(a)] = refs.get(id(a), 0) + version.refs
        for key, a in self.arrays.items():
            delta = refs.get(key, 0) - self.start_refs[key]
            if delta:
                yield a, delta
