"""Per-step buffer versioning: the seed's overwrite bug cannot happen inside a step function, and
the writes that would corrupt a gradient are refused with the kernel, argument and line."""
import inspect

import numpy as np
import pytest

import stepper as sp
from step_kernels import add_into, double, scale_in_place_target
from stepper_models import (chain_force, chain_initial, chain_integrate, chain_model, particle_initial,
                            particle_model, sum_squares64)

N = 16


def final_x_squared(state):
    out = sp.zeros(1, dtype=sp.float64, device=state.x.device)
    sp.launch(sum_squares64, N, inputs=[state.x], outputs=[out])
    return out


def unrolled_gradient(model, initial, steps, fresh_force: bool):
    """The seed's example outside the stepper: one Tape over all steps, with a force buffer per step
    (right) or one reused force buffer (the classic bug)."""
    k, c, device = model.params.k, model.params.c, model.device
    xs = [sp.array(initial["x"].numpy(), dtype=sp.float64, requires_grad=True, device=device)]
    vs = [sp.array(initial["v"].numpy(), dtype=sp.float64, requires_grad=True, device=device)]
    shared = sp.zeros(N, dtype=sp.float64, requires_grad=True, device=device)
    tape = sp.Tape(deterministic=True)
    with tape:
        for n in range(steps):
            force = sp.zeros(N, dtype=sp.float64, requires_grad=True, device=device) if fresh_force else shared
            sp.launch(chain_force, N, inputs=[xs[-1], k, 1.0, N], outputs=[force])
            xs.append(sp.zeros(N, dtype=sp.float64, requires_grad=True, device=device))
            vs.append(sp.zeros(N, dtype=sp.float64, requires_grad=True, device=device))
            sp.launch(chain_integrate, N, inputs=[xs[-2], vs[-2], force, c, model.dt], outputs=[xs[-1], vs[-1]])
        loss = final_x_squared(type("S", (), {"x": xs[-1]}))
    loss.requires_grad = True
    k.grad.zero_()
    c.grad.zero_()
    tape.backward(grads={loss: 1.0})
    return xs[0].grad.numpy(), vs[0].grad.numpy(), k.grad.numpy().copy(), c.grad.numpy().copy()


def test_force_scratch_buffer_gives_the_unrolled_gradient_bit_for_bit(device):
    model, initial = chain_model(N, device=device), chain_initial(N, device=device)
    result = model.gradient(initial, 25, loss=final_x_squared, schedule=sp.Revolve(25, 3))
    gx, gv, gk, gc = unrolled_gradient(model, initial, 25, fresh_force=True)
    np.testing.assert_array_equal(result.grads["x"].numpy(), gx)
    np.testing.assert_array_equal(result.grads["v"].numpy(), gv)
    np.testing.assert_array_equal(result.grads["k"].numpy(), gk)
    np.testing.assert_array_equal(result.grads["c"].numpy(), gc)


def test_reused_force_buffer_outside_the_stepper_is_refused(device):
    model, initial = chain_model(N, device=device), chain_initial(N, device=device)
    with pytest.raises(sp.OverwriteError) as info:
        unrolled_gradient(model, initial, 3, fresh_force=False)
    message = str(info.value)
    assert "kernel 'chain_force'" in message and "'f'" in message and "chain_integrate" in message
    assert "test_versions.py:" in message


def test_forward_rollout_keeps_two_versions_of_the_state(device):
    model, initial = particle_model(device=device), particle_initial(device=device)
    result = model.rollout(initial, 100)
    force = 64 * 12
    assert result.stats.peak_buffer_bytes == 2 * model.state_bytes + force


def _one_state_model(step, device="cpu"):
    model = sp.Model(device=device)
    model.state("x", 4)
    model.state("y", 4)
    model.step(step)
    return model, {"x": sp.array([1.0, 2.0, 3.0, 4.0], device=device), "y": sp.zeros(4, device=device)}


def test_writing_into_s_prev_names_kernel_argument_and_line(device):
    def step(s):
        sp.launch(double, 4, inputs=[s.next.x], outputs=[s.prev.y])   # wrong: writes the input
    line = inspect.getsourcelines(step)[1] + 1
    model, initial = _one_state_model(step, device=device)
    with pytest.raises(sp.OverwriteError) as info:
        model.rollout(initial, 3)
    message = str(info.value)
    assert "kernel 'double'" in message and "argument 'y'" in message and "s.prev.y" in message
    assert f"test_versions.py:{line}" in message and "s.next.y instead" in message


def test_host_writes_into_s_prev_are_refused_too(device):
    def step(s):
        s.prev.x.zero_()
    model, initial = _one_state_model(step, device=device)
    with pytest.raises(sp.OverwriteError, match=r"s\.prev\.x"):
        model.rollout(initial, 1)


def test_overwriting_within_a_step_what_an_earlier_launch_read_is_refused(device):
    def step(s):
        tmp = s.scratch("tmp", 4)
        sp.launch(double, 4, inputs=[s.prev.x], outputs=[tmp])
        sp.launch(double, 4, inputs=[tmp], outputs=[s.next.x])
        sp.launch(scale_in_place_target, 4, inputs=[s.prev.y, 3.0], outputs=[tmp])   # tmp was read
        sp.launch(double, 4, inputs=[tmp], outputs=[s.next.y])
    line = inspect.getsourcelines(step)[1] + 4
    model, initial = _one_state_model(step, device=device)
    with pytest.raises(sp.OverwriteError) as info:
        model.rollout(initial, 2)
    message = str(info.value)
    assert "kernel 'scale_in_place_target'" in message and "argument 'y'" in message
    assert f"test_versions.py:{line}" in message and "kernel 'double'" in message


def test_a_state_the_step_never_writes_is_named(device):
    def step(s):
        sp.launch(double, 4, inputs=[s.prev.x], outputs=[s.next.x])
    model, initial = _one_state_model(step, device=device)
    with pytest.raises(sp.ModelError, match=r"never wrote s\.next\.y .*copy\(s\.next\.y, s\.prev\.y\)"):
        model.rollout(initial, 1)


@pytest.mark.filterwarnings("error::stepper.step.trace_notes.UntraceableStepWarning")   # a copy is a traced launch
def test_copy_keeps_a_state_unchanged_and_is_differentiable(device):
    def step(s):
        sp.launch(double, 4, inputs=[s.prev.x], outputs=[s.next.x])
        sp.copy(s.next.y, s.prev.y)
        sp.launch(add_into, 4, inputs=[s.prev.x], outputs=[s.next.y])
    model, initial = _one_state_model(step, device=device)
    final = model.rollout(initial, 3)
    np.testing.assert_array_equal(final.x.numpy(), [8.0, 16.0, 24.0, 32.0])
    np.testing.assert_array_equal(final.y.numpy(), [7.0, 14.0, 21.0, 28.0])     # x + 2x + 4x

    def loss(state):
        from step_kernels import total
        out = sp.zeros(1, device=device)
        sp.launch(total, 4, inputs=[state.y], outputs=[out])
        return out
    grads = model.gradient(initial, 3, loss=loss, schedule=sp.Revolve(3, 2)).grads
    np.testing.assert_array_equal(grads["x"].numpy(), [7.0] * 4)
    np.testing.assert_array_equal(grads["y"].numpy(), [1.0] * 4)


@pytest.mark.filterwarnings("ignore:the step function of the model cannot be replayed")   # step 2 differs
def test_every_step_is_checked_not_only_the_first(device):
    """A step whose launches change from step to step is checked at the step that goes wrong: the
    checks run on every step, recorded or not, so a mistake at step 2 is not hidden by clean steps 0-1."""
    def step(s):
        sp.launch(double, 4, inputs=[s.prev.x], outputs=[s.next.x])
        if s.n == 2:
            sp.launch(double, 4, inputs=[s.prev.x], outputs=[s.prev.y])     # wrong, only at step 2
        else:
            sp.copy(s.next.y, s.prev.y)
    line = inspect.getsourcelines(step)[1] + 3
    model, initial = _one_state_model(step, device=device)
    with pytest.raises(sp.OverwriteError) as info:
        model.rollout(initial, 4)
    assert "s.prev.y" in str(info.value) and f"test_versions.py:{line}" in str(info.value)

    def late_overwrite(s):
        tmp = s.scratch("tmp", 4)
        sp.launch(double, 4, inputs=[s.prev.x], outputs=[tmp])
        sp.launch(double, 4, inputs=[tmp], outputs=[s.next.x])
        if s.n == 3:
            sp.launch(double, 4, inputs=[s.prev.y], outputs=[tmp])            # tmp was read
        sp.copy(s.next.y, s.prev.y)
    model, initial = _one_state_model(late_overwrite, device=device)
    with pytest.raises(sp.OverwriteError, match=r"s\.scratch\('tmp'\)"):
        model.rollout(initial, 5)


def test_a_state_written_only_by_accumulation_counts_as_written_and_a_late_miss_is_named(device):
    def step(s):
        sp.launch(double, 4, inputs=[s.prev.x], outputs=[s.next.x])
        if s.n < 2:
            sp.launch(add_into, 4, inputs=[s.prev.y], outputs=[s.next.y])    # += into a zeroed s.next.y
    model, initial = _one_state_model(step, device=device)
    assert model.rollout(initial, 2).steps == 2
    with pytest.raises(sp.ModelError, match=r"never wrote s\.next\.y \(step 2\)"):
        model.rollout(initial, 3)


def test_states_named_like_state_methods_stay_reachable_by_index(device):
    model = sp.Model(device=device)
    for name in ("items", "_arrays", "x"):
        model.state(name, 4)

    @model.step
    def step(s):
        assert s.prev.x is s.prev["x"] and callable(s.prev.items)
        for name in ("items", "_arrays", "x"):
            sp.launch(double, 4, inputs=[s.prev[name]], outputs=[s.next[name]])
    initial = {name: sp.array([1.0, 2.0, 3.0, 4.0], device=device) for name in ("items", "_arrays", "x")}
    final = model.rollout(initial, 2)
    for name in ("items", "_arrays", "x"):
        np.testing.assert_array_equal(final[name].numpy(), [4.0, 8.0, 12.0, 16.0])
    assert sorted(final) == ["_arrays", "items", "x"]


def test_a_pools_new_versions_have_the_kinds_layout_and_name_it_when_memory_runs_out(device, monkeypatch):
    """The pool checks a kind's shape and dtype on its first version only and makes the later ones
    (StoreAll takes a version or two a step) from that layout: the same shape, element type and
    device; and a failed allocation still says what it was for."""
    import stepper.step.versions as versions
    pool = versions.BufferPool(device)
    kind = pool.kind((4, 3), sp.vec3)
    first, second = pool.take(kind), pool.take(kind)
    for arr in (first, second):
        assert (arr.shape, arr.dtype, arr.device) == ((4, 3), sp.vec3, first.device)
        assert arr.device.startswith(device)
        np.testing.assert_array_equal(arr.numpy(), np.zeros((4, 3, 3)))         # the pool zero-fills
    assert first._data is not second._data and pool.allocated_bytes == 2 * 4 * 3 * 3 * 4

    def out_of_memory(*args):
        raise MemoryError("out of memory")
    monkeypatch.setattr(versions, "allocate", out_of_memory)
    with pytest.raises(MemoryError, match=r"a new version of shape \(4, 3\) and dtype vec3 on " + first.device):
        pool.take(kind)


def test_a_finished_runs_memory_serves_the_next_run_and_never_what_a_user_holds(device, monkeypatch):
    """An optimisation loop asks for the same versions every call: the memory a gradient leaves free
    serves the next one (fresh pages cost a 256^2 FWI store-all gradient 1.4x, 0.34 -> 0.48 s), while
    what the caller holds (the result's arrays, a view of one) is never handed out again."""
    import stepper.step.versions as versions
    model, initial = chain_model(device=device), chain_initial(device=device)
    schedule = lambda: sp.StoreAll(40)      # noqa: E731  (a version of each state every step)
    first = model.gradient(initial, 40, loss=final_x_squared, schedule=schedule())
    kept = {name: g.numpy().copy() for name, g in first.grads.items()}
    final = first.final["x"].numpy().copy()
    view = first.grads["x"].numpy()                      # a view the user holds on to
    fresh = []
    real = versions.allocate
    monkeypatch.setattr(versions, "allocate", lambda *a: (fresh.append(a), real(*a))[1])
    second = model.gradient(initial, 40, loss=final_x_squared, schedule=schedule())
    # ~88 versions at its peak; new memory only for what the first run's caller kept (its final state
    # and gradients, handed over for good)
    assert second.stats.peak_buffer_bytes == first.stats.peak_buffer_bytes == 88 * 16 * 8 and len(fresh) <= 4
    for name, g in kept.items():
        np.testing.assert_array_equal(first.grads[name].numpy(), g)
        np.testing.assert_array_equal(second.grads[name].numpy(), g)
    np.testing.assert_array_equal(first.final["x"].numpy(), final)
    np.testing.assert_array_equal(view, kept["x"])
    sp.release_memory()
    fresh.clear()
    model.gradient(initial, 40, loss=final_x_squared, schedule=schedule())
    assert len(fresh) > 40
