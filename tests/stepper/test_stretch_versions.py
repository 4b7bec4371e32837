"""A native stretch's version bookkeeping (stepper/execute/fast/stretch_versions.py): holds counted on the side
and handed to the pool at the end, memory reused only where nothing outside the stretch holds it."""
import stepper as sp
from stepper.execute.fast.stretch_versions import StretchVersions
from stepper.step.versions import BufferPool


def setup(float_states=2):
    """A pool with one kind (16 float64) for every state; gradients of the first `float_states`."""
    pool = BufferPool("cpu", zero=False)
    kind = pool.kind(16, sp.float64)
    kinds = [kind, kind]
    grad_kinds = kinds if float_states == 2 else kinds[:float_states]
    return pool, kind, kinds, grad_kinds


def held_state(pool, kind, holds=1):
    arrays = tuple(pool.take(kind, False) for _ in range(2))
    for _ in range(holds - 1):
        pool.retain_all(arrays)
    return arrays


def test_a_released_version_is_taken_again_whole_and_the_pool_hears_only_the_difference():
    pool, kind, kinds, _ = setup()
    state = held_state(pool, kind)
    versions = StretchVersions(pool, kinds, kinds)
    start = versions.found(state, kinds)          # the live state's hold, counted here now
    ring = versions.new(kinds)                    # from the pool
    assert versions.taken == list(ring.arrays)
    versions.release(start)                       # nothing else holds it: ours to reuse
    again = versions.new(kinds)
    assert again.arrays == state and again.ptrs == start.ptrs and again.refs == 1
    assert len(versions.taken) == 2               # nothing more from the pool
    changes = {id(a): delta for a, delta in versions.hold_changes()}
    assert changes == {}                          # every array still held once, as at the start


def test_an_array_held_outside_the_stretch_is_never_reused():
    pool, kind, kinds, _ = setup()
    state = held_state(pool, kind, holds=2)       # a snapshot and, say, a recorded step
    versions = StretchVersions(pool, kinds, kinds)
    found = versions.found(state, kinds)
    versions.release(found)
    fresh = versions.new(kinds)
    assert not set(map(id, fresh.arrays)) & set(map(id, state))
    changes = {id(a): delta for a, delta in versions.hold_changes()}
    assert changes == {id(state[0]): -1, id(state[1]): -1}    # the counted hold is gone, the other stays
    versions.release(fresh)
    assert {id(a): d for a, d in versions.hold_changes()} == {**changes, **{id(a): -1 for a in fresh.arrays}}


def test_a_partial_version_frees_only_the_arrays_it_has():
    pool, kind, kinds, _ = setup()
    kept = (None, pool.take(kind, False))          # a Kept record of `u` only
    versions = StretchVersions(pool, kinds, kinds)
    version = versions.found(kept, kinds)
    assert version.ptrs[0] == 0
    versions.release(version)
    assert versions.spares[id(kinds)] == [] and versions.free[kind] == [kept[1]]
    reused = versions.new(kinds)
    assert kept[1] in reused.arrays and len(versions.taken) == 1


def test_gradients_of_fewer_kinds_take_what_the_states_release():
    pool, kind, kinds, grad_kinds = setup(float_states=1)
    versions = StretchVersions(pool, kinds, grad_kinds)
    state = versions.new(kinds)
    versions.release(state)                       # a whole spare of the states' kinds
    gradient = versions.new(grad_kinds)           # breaks it up rather than asking the pool
    assert gradient.arrays[0] in state.arrays and len(versions.taken) == 2
    assert versions.new(kinds).arrays[0] not in gradient.arrays



def test_a_renamed_version_shares_its_starts_array_until_both_are_released():
    """A step whose copy ``s.next.up = s.prev.u`` was renamed: the new version's `up` is the start's
    `u` array itself. Released in either order, that array goes back only with the second."""
    for first in ("start", "result"):
        pool, kind, kinds, _ = setup()
        versions = StretchVersions(pool, kinds, kinds)
        start = versions.new(kinds)
        result = versions.renamed(start, [(0, 1)])           # state 0 (up) is start's state 1 (u)
        assert result.arrays[0] is start.arrays[1] and result.arrays[1] not in start.arrays
        assert result.ptrs[0] == start.ptrs[1] and len(versions.taken) == 3
        assert not versions.alone(start) and not versions.alone(result)   # neither may be written over
        earlier, later = (start, result) if first == "start" else (result, start)
        versions.release(earlier)
        assert versions.free[kind] == [a for a in earlier.arrays if a is not start.arrays[1]]
        assert versions.spares[id(kinds)] == []
        versions.release(later)                              # the rest of it goes back whole
        assert versions.spares[id(kinds)] == [later]
        assert versions.new(kinds) is later and len(versions.taken) == 3


def test_snapshots_found_sharing_an_array_keep_it_while_either_is_held():
    """Two snapshots a renamed step left sharing an array, found by a later stretch: the array is
    counted in both, stays while one of them is held, and the pool hears both holds go."""
    pool, kind, kinds, _ = setup()
    u0, u1, u2 = (pool.take(kind, False) for _ in range(3))
    pool.retain_all([u1])                          # held by both snapshots
    versions = StretchVersions(pool, kinds, kinds)
    older = versions.found((u0, u1), kinds)
    newer = versions.found((u1, u2), kinds)
    assert not versions.alone(older) and not versions.alone(newer)
    versions.release(newer)
    assert versions.free[kind] == [u2]             # u1 is still the older snapshot's
    fresh = versions.new(kinds)
    assert fresh.arrays[0] is u2 and u1 not in fresh.arrays
    versions.release(older)
    assert versions.spares[id(kinds)] == [older]
    assert {id(a): delta for a, delta in versions.hold_changes()} == {id(u0): -1, id(u1): -2}
