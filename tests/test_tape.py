"""The Tape: differentiable copies, seeding, repeatability and overwrite safety.

Kernels are stood in for by Python functions recorded with `record_func` or a hand-made
`RecordedOp`, so these tests need no compiler.
"""
import numpy as np
import pytest

from compiler.errors import OverwriteError
from compiler.runtime.array import array, clone, ones, ones_like, zeros, zeros_like
from compiler.runtime.copy_kernels import copy
from compiler.runtime.tape import RecordedOp, Tape, active_tape


def record_square_sum(tape, y, loss):
    """A Python "kernel": loss = sum(y * y), with its adjoint y.grad += 2 y loss.grad."""
    loss.assign([float(np.sum(y.numpy() ** 2))])

    def backward():
        y.grad._add_host(2.0 * y.numpy() * loss.grad.numpy()[0])
    tape.record_func(backward, [y, loss], name="square_sum")


def launch(tape, name, fn, adjoint, reads=None, writes=None, accumulates=None):
    """A Python stand-in for a kernel launch: run `fn`, record it the way the launcher does. Like a
    kernel, `fn` and `adjoint` write memory without bumping versions (`_write_host`, `_add_host`, on
    any device); the launcher marks what the launch wrote."""
    op = RecordedOp(f"launch of kernel '{name}'", reads or {}, writes or {}, accumulates or {},
                    adjoint, where=f"model.py:{len(tape.ops) + 10}")
    if active_tape() is tape:
        tape.record(op)
    fn()
    for arr in (*op.writes.values(), *op.accumulates.values()):
        arr._mark_written()


def double(tape, x, y):
    """y = 2 x."""
    def fn():
        y._write_host(2.0 * x.numpy())

    def adjoint():
        x.grad._add_host(2.0 * y.grad.numpy())
    launch(tape, "double", fn, adjoint, reads={"x": x}, writes={"y": y})


# -- differentiable copies (Warp's seed examples) ------------------------------------------------------
@pytest.mark.parametrize("how", ["clone", "copy", "assign"])
def test_copies_are_differentiable(how, device):
    x = array([1.0, 1.0, 1.0], requires_grad=True, device=device)
    loss = zeros(1, requires_grad=True, device=device)
    tape = Tape()
    with tape:
        if how == "clone":
            y = clone(x)
        else:
            y = zeros_like(x)
            copy(y, x) if how == "copy" else y.assign(x)
        record_square_sum(tape, y, loss)
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(loss.numpy(), [3.0])


def test_warp_copy_example_through_a_kernel(device):
    x = array(np.arange(3), dtype=float, requires_grad=True, device=device)
    y, z = zeros_like(x), zeros_like(x)
    tape = Tape()
    with tape:
        double(tape, x, y)
        copy(z, y)
    tape.backward(grads={z: ones_like(x)})
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])


def test_copy_with_offsets_routes_gradients_to_the_copied_range(device):
    src = array([1.0, 2.0, 3.0, 4.0], requires_grad=True, device=device)
    dest = zeros(3, requires_grad=True, device=device)
    tape = Tape()
    with tape:
        copy(dest, src, dest_offset=1, src_offset=2, count=2)
    tape.backward(grads={dest: [10.0, 20.0, 30.0]})
    np.testing.assert_array_equal(src.grad.numpy(), [0.0, 0.0, 20.0, 30.0])


def test_clone_without_grad_detaches(device):
    x = array([1.0, 2.0], requires_grad=True, device=device)
    tape = Tape()
    with tape:
        y = clone(x, requires_grad=False)
    assert tape.ops == () and not y.requires_grad


# -- seeding and repeatability ----------------------------------------------------------------------------
def test_seeds_are_copied_not_adopted(device):
    x = array([1.0, 2.0, 3.0], requires_grad=True, device=device)
    y = zeros_like(x)
    tape = Tape()
    with tape:
        double(tape, x, y)
    seed = ones(3, device=device)
    tape.backward(grads={y: seed})
    assert y.grad is not seed
    seed.fill_(100.0)
    np.testing.assert_array_equal(y.grad.numpy(), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(seed.numpy(), [100.0, 100.0, 100.0])


def test_repeated_backward_with_zero_is_identical(device):
    x = array([1.0, 2.0, 3.0], requires_grad=True, device=device)
    y = zeros_like(x)
    tape = Tape()
    with tape:
        double(tape, x, y)
    seed = array([1.0, 0.0, 0.5], device=device)
    results = []
    for _ in range(3):
        tape.backward(grads={y: seed})
        results.append(x.grad.numpy().copy())
        tape.zero()
    for r in results:
        np.testing.assert_array_equal(r, [2.0, 0.0, 1.0])
    np.testing.assert_array_equal(seed.numpy(), [1.0, 0.0, 0.5])


def test_each_backward_without_zero_adds_one_gradient_per_pass(device):
    # loss = sum(x * x) through a clone: as in Warp and PyTorch, a second backward adds one more
    # gradient (2x) to the input, and the seed does not pile up in loss.grad.
    x = array([1.0, 2.0], requires_grad=True, device=device)
    loss = zeros(1, requires_grad=True, device=device)
    tape = Tape()
    with tape:
        y = clone(x)
        record_square_sum(tape, y, loss)
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 8.0])
    np.testing.assert_array_equal(loss.grad.numpy(), [1.0])
    np.testing.assert_array_equal(y.grad.numpy(), [2.0, 4.0])     # this pass's, not the sum of two
    tape.zero()
    tape.backward(loss)
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])


def test_grads_seeds_stay_copies_across_repeated_backward(device):
    x = array([1.0, 2.0, 3.0], requires_grad=True, device=device)
    y = zeros_like(x)
    tape = Tape()
    with tape:
        double(tape, x, y)
    seed = array([1.0, 0.0, 0.5], device=device)
    for passes in (1, 2, 3):
        tape.backward(grads={y: seed})
        np.testing.assert_array_equal(y.grad.numpy(), [1.0, 0.0, 0.5])
        np.testing.assert_array_equal(x.grad.numpy(), passes * np.array([2.0, 0.0, 1.0]))
    np.testing.assert_array_equal(seed.numpy(), [1.0, 0.0, 0.5])


def test_zero_clears_seeded_and_intermediate_grads(device):
    x = array([1.0, 2.0], requires_grad=True, device=device)
    y = zeros_like(x)
    tape = Tape()
    with tape:
        double(tape, x, y)
    tape.backward(grads={y: [1.0, 1.0]})
    assert set(map(id, tape.gradients)) == {id(x), id(y)}
    tape.zero()
    np.testing.assert_array_equal(y.grad.numpy(), [0.0, 0.0])
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0])
    assert len(tape.ops) == 1
    tape.reset()
    assert tape.ops == () and tape.gradients == {}


def test_loss_must_be_a_one_element_array_with_grad(device):
    x = array([1.0, 2.0], requires_grad=True, device=device)
    tape = Tape()
    with pytest.raises(ValueError, match="one-element"):
        tape.backward(x)
    with pytest.raises(ValueError, match="requires_grad=True"):
        tape.backward(zeros(1, device=device))
    with pytest.raises(ValueError, match=r"seed of shape \(3,\).*expected \(2,\)"):
        tape.backward(grads={x: [1.0, 2.0, 3.0]})


def test_backward_inside_the_with_block_is_an_error():
    tape = Tape()
    with tape:
        with pytest.raises(RuntimeError, match="still recording"):
            tape.backward(grads={})


def test_tape_is_reentrant_and_nested_tapes_record_innermost(device):
    x = array([1.0], requires_grad=True, device=device)
    y, z = zeros_like(x), zeros_like(x)
    outer, inner = Tape(), Tape()
    with outer:
        with inner:
            assert active_tape() is inner
            double(inner, x, y)
        assert active_tape() is outer
    with outer:
        double(outer, y, z)
    assert active_tape() is None
    assert len(inner.ops) == 1 and len(outer.ops) == 1
    outer.backward(grads={z: [1.0]})
    np.testing.assert_array_equal(y.grad.numpy(), [2.0])
    np.testing.assert_array_equal(x.grad.numpy(), [0.0])


# -- overwrite safety at record time ----------------------------------------------------------------------
def test_overwriting_an_array_an_earlier_launch_read_is_refused(device):
    a = array([1.0, 2.0, 3.0], requires_grad=True, device=device)
    b = zeros_like(a)
    c = array([-1.0, -2.0, -3.0], requires_grad=True, device=device)
    tape = Tape()
    with tape:
        double(tape, a, b)                     # reads a
        with pytest.raises(OverwriteError) as info:
            launch(tape, "overwrite_kernel", lambda: a.assign(c), lambda: None,
                   reads={"z": c}, writes={"x": a})
    message = str(info.value)
    assert "launch of kernel 'overwrite_kernel' (model.py:11) overwrites argument 'x'" in message
    assert "earlier recorded launch of kernel 'double' (model.py:10) read as argument 'x'" in message
    assert "new array" in message and "clone()" in message
    np.testing.assert_array_equal(a.numpy(), [1.0, 2.0, 3.0])   # refused before anything was written


@pytest.mark.parametrize("mutate", [
    lambda a: a.fill_(0.0),
    lambda a: a.zero_(),
    lambda a: a.assign([0.0, 0.0]),
    lambda a: a.assign(zeros_like(a, requires_grad=True)),
    lambda a: copy(a, zeros_like(a, requires_grad=False)),
])
def test_host_writes_while_recording_are_checked(mutate, device):
    a = array([1.0, 2.0], requires_grad=True, device=device)
    tape = Tape()
    with tape:
        double(tape, a, zeros_like(a))
        with pytest.raises(OverwriteError, match=r"overwrites argument '(array|dest)'.*"
                                                 r"launch of kernel 'double' \(model.py:10\).*'x'"):
            mutate(a)
    np.testing.assert_array_equal(a.numpy(), [1.0, 2.0])


def test_reading_and_overwriting_in_one_launch_is_refused(device):
    a = array([1.0, 2.0], requires_grad=True, device=device)
    tape = Tape()
    with tape:
        with pytest.raises(OverwriteError, match=r"reads argument 'a' and overwrites it as argument 'out'"):
            launch(tape, "inplace", lambda: None, lambda: None, reads={"a": a}, writes={"out": a})


def test_repeated_accumulation_is_allowed_but_not_into_an_array_an_earlier_op_read(device):
    x = array([1.0, 2.0], requires_grad=True, device=device)
    total = zeros(1, requires_grad=True, device=device)
    tape = Tape()
    with tape:
        def add(): total._add_host(x.numpy().sum())
        launch(tape, "sum", add, lambda: None, reads={"x": x}, accumulates={"total": total})
        launch(tape, "sum_again", add, lambda: None, reads={"x": x}, accumulates={"total": total})
        launch(tape, "read_total", lambda: None, lambda: None, reads={"t": total}, accumulates={})
        # read_total's backward needs total as it was: adding to it now would change that silently.
        with pytest.raises(OverwriteError, match="sum_once_more.*accumulates into.*read_total"):
            launch(tape, "sum_once_more", add, lambda: None, reads={"x": x}, accumulates={"total": total})
    tape.backward(grads={total: [1.0]})          # and no version complaint either


def test_write_before_read_is_fine(device):
    x = array([1.0, 2.0], requires_grad=True, device=device)
    y = zeros_like(x)
    z = zeros_like(x)
    tape = Tape()
    with tape:
        y.zero_()                  # a write before anything read y
        double(tape, x, y)         # writes y
        double(tape, y, z)         # then reads it
    tape.backward(grads={z: [1.0, 1.0]})
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 4.0])


def test_nothing_is_checked_outside_a_tape(device):
    a = array([1.0, 2.0], requires_grad=True, device=device)
    tape = Tape()
    double(tape, a, zeros_like(a))
    a.fill_(3.0)
    assert tape.ops == ()


# -- overwrite safety at backward (versions) ----------------------------------------------------------------
@pytest.mark.parametrize("mutate", [
    lambda a: a.fill_(0.0),
    lambda a: a.assign([5.0, 6.0]),
    lambda a: a.zero_(),
    lambda a: copy(a, ones_like(a, requires_grad=False)),
    lambda a: a._mark_written(),
])
def test_modifying_a_read_array_after_recording_fails_at_backward(mutate, device):
    x = array([1.0, 2.0], requires_grad=True, device=device)
    y = zeros_like(x)
    tape = Tape()
    with tape:
        double(tape, x, y)
    mutate(x)
    with pytest.raises(OverwriteError) as info:
        tape.backward(grads={y: [1.0, 1.0]})
    message = str(info.value)
    assert "launch of kernel 'double' (model.py:10) read argument 'x'" in message
    assert "modified after it was recorded" in message
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0])   # nothing was accumulated


def test_a_modification_between_recordings_is_not_forgotten(device):
    x = array([1.0, 2.0], requires_grad=True, device=device)
    total = zeros(1, requires_grad=True, device=device)
    tape = Tape()
    with tape:
        double(tape, x, zeros_like(x))
    x.fill_(7.0)                  # outside the tape
    with pytest.raises(OverwriteError, match="modified after it was recorded"):
        tape.backward(grads={total: [1.0]})


def test_unread_arrays_may_change_after_recording(device):
    x = array([1.0, 2.0], requires_grad=True, device=device)
    y = zeros_like(x)
    tape = Tape()
    with tape:
        double(tape, x, y)
    y.fill_(0.0)                  # y was only written; its values are not needed by any adjoint
    tape.backward(grads={y: [1.0, 1.0]})
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])


# -- visualisation ---------------------------------------------------------------------------------------------
def test_visualize_writes_dot_with_ops_and_arrays(tmp_path, device):
    x = array([1.0], requires_grad=True, device=device)
    y, z = zeros_like(x), zeros(1, device=device)
    tape = Tape()
    with tape:
        double(tape, x, y)
        copy(z, y)                # z has no grad: not recorded, only checked
        w = clone(y)
    path = tmp_path / "tape.dot"
    dot = tape.visualize(str(path), array_labels={x: "x", y: "y", w: "w"})
    assert path.read_text() == dot
    assert dot.startswith("digraph Tape {")
    assert "launch of kernel 'double'" in dot and "clone(src)" in dot
    assert 'label="x"' in dot and 'label="w"' in dot
    assert '[label="x"];' in dot          # the edge from x into the launch, labelled with the argument


def test_has_read_tells_which_arrays_a_recorded_op_read(device):
    x, y, z = array([1.0, 2.0], device=device), zeros(2, device=device), zeros(2, device=device)
    tape = Tape()
    with tape:
        double(tape, x, y)
    assert tape.has_read(x) and not tape.has_read(y) and not tape.has_read(z)


def test_a_whole_array_copy_on_a_tape_is_a_launch_of_the_copy_kernel(device):
    """Recorded like any launch (so a step that copies a state is traced and replayed natively);
    its adjoint adds dest's gradient to src's."""
    x = array(np.arange(6.0).reshape(2, 3), requires_grad=True, device=device)
    y = zeros_like(x, requires_grad=True)
    tape = Tape()
    with tape:
        copy(y, x)
    assert [op.name for op in tape.ops] == ["launch of kernel 'copy'"] and tape.ops[0].launch is not None
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    tape.backward(grads={y: np.full((2, 3), 3.0)})
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 3.0))
