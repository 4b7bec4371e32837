"""The versions a native stretch (stepper/execute/fast/native_sweep.py) reads and writes while it is worked out.

A stretch plans the executor's work before running any of it, so it cannot take and release
versions in the pool as it goes: it counts holds here instead, on plain counters, and hands the
pool the difference at the end (`hold_changes`). A version is the whole state (or the gradient of
its float states) as a tuple of arrays in state order; one the stretch finds held (a snapshot, the
live state, the carried adjoint, a kept record) is `found`, one it makes is `new`: arrays the
stretch released before, else the pool's. A version may share arrays with another (`renamed`: a
step whose copy of a state is renamed keeps the array it started from); such versions are marked
`shared`, and only their arrays are counted one by one (`members`), so that an array goes back when
the last version that has it does. Holds on an array that the stretch did not count (a recorded
step's, say) keep it from being reused.
"""
from __future__ import annotations

from .native_loop import _ptr

__all__ = ["StretchVersions", "Version"]


class Version:
    """Its arrays in the order of `kinds`, how many hold it here (snapshots, the live state, the
    carry), their data pointers, `ours`: whether all its arrays are the stretch's to reuse once
    it is released (None: not known yet, a version found held), and `shared`: whether another
    version may have some of its arrays."""
    __slots__ = ("arrays", "refs", "ptrs", "kinds", "ours", "shared")

    def __init__(self, arrays: tuple, refs: int, ptrs: list, kinds: list, ours: bool | None):
        self.arrays, self.refs, self.ptrs, self.kinds, self.ours = arrays, refs, ptrs, kinds, ours
        self.shared = False


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
        self.members: dict[int, int] = {}       # id(array) -> live versions that have it (shared ones')
        self.owner: dict[int, Version] = {}     # id(array) -> a version found with it

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
            for a in arrays:                     # snapshots a renamed step left sharing an array
                if a is None:
                    continue
                other = self.owner.get(id(a))
                if other is not None and other.refs:
                    self._share(other)
                    self._share(version)
                    self.members[id(a)] += 1
                else:
                    self.owner[id(a)] = version
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
        return self._made(tuple(map(self._array, kinds)), kinds, True)

    def renamed(self, start: Version, pairs: list) -> Version:
        """A new version of `start`'s kinds, held once, here, whose state `to` is `start`'s array of
        state `src` for each (to, src) in `pairs`, shared by the two; its other arrays new."""
        given = {to: start.arrays[src] for to, src in pairs}
        arrays = tuple(given[k] if k in given else self._array(kind) for k, kind in enumerate(start.kinds))
        self._share(start)
        version = self._made(arrays, start.kinds, None)
        version.shared = True
        members = self.members
        for a in arrays:
            members[id(a)] = members.get(id(a), 0) + 1
        return version

    def regroup(self, arrays: tuple, kinds: list, olds: list) -> Version:
        """A version of `arrays`, held once here, made of arrays of `olds`: versions held once, here
        alone (a native advance's ring, whose renamed copies moved arrays between its states),
        which are gone now; their other arrays are free here."""
        loose = {}
        for old in olds:
            old.refs = 0
            for a, kind in zip(old.arrays, old.kinds):
                loose[id(a)] = (a, kind)
                if old.shared:
                    self.members.pop(id(a), None)
            old.shared = False
        version = self._made(arrays, kinds, True)
        for a in arrays:
            del loose[id(a)]
        for a, kind in loose.values():
            self.free.setdefault(kind, []).append(a)
        return version

    def _made(self, arrays: tuple, kinds: list, ours: bool | None) -> Version:
        ptr = self.ptr
        version = Version(arrays, 1, [ptr[id(a)] for a in arrays], kinds, ours)
        self.versions.append(version)
        return version

    def _array(self, kind):
        """An array of `kind` that nothing holds: one free here, else the pool's."""
        free = self.free.get(kind)
        if not free and self._break_spare(kind):
            free = self.free[kind]
        if free:
            return free.pop()
        a = self.pool.take(kind, False)
        self.taken.append(a)
        self.arrays[id(a)] = a
        self.start_refs[id(a)] = 1                 # the stretch's own hold, dropped at the end
        self.external[id(a)] = 0
        self.ptr[id(a)] = _ptr(a)
        return a

    def _share(self, version: Version) -> None:
        """Count `version`'s arrays one by one from now on (each in it alone, until counted again)."""
        if not version.shared:
            version.shared = True
            for a in version.arrays:
                if a is not None:
                    self.members.setdefault(id(a), 1)

    def alone(self, version: Version) -> bool:
        """Whether `version` is held once and its arrays by nothing else: the stretch may write them."""
        if version.refs != 1 or any(self.external[id(a)] for a in version.arrays):
            return False
        return not version.shared or all(self.members[id(a)] == 1 for a in version.arrays)

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
        if version.shared and not self._unshared(version):
            return
        if version.ours:
            self.spares[id(version.kinds)].append(version)
            return
        external = self.external
        for a, kind in zip(version.arrays, version.kinds):
            if a is not None and not external[id(a)]:
                self.free.setdefault(kind, []).append(a)

    def _unshared(self, version: Version) -> bool:
        """A shared version just released: whether no other live version has any of its arrays
        (then it goes back as any other); else its arrays that none has go back one by one."""
        members, gone = self.members, []
        for a, kind in zip(version.arrays, version.kinds):
            if a is not None:
                key = id(a)
                left = members[key] - 1
                if left:
                    members[key] = left
                else:
                    del members[key]
                    gone.append((a, kind))
        if len(gone) == len(version.arrays):
            version.shared = False
            return True
        external = self.external
        for a, kind in gone:
            if not external[id(a)]:
                self.free.setdefault(kind, []).append(a)
        return False

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
