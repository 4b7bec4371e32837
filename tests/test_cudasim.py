"""The CUDA path's own rules, checked on the CUDA simulator (STEPPER_CUDA_SIM=1; CI's `--device cuda`
run): contexts, launch configurations, the loop tape, graphs, interop, and the errors a user gets.

The bugs the first GPU run would have shown each have a test here that fails without their fix:
launches from a thread without a current context, and deterministic launches that ran every kernel
on one GPU thread.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import compiler as sp
from compiler.backends import cuda_launch
from compiler.backends import cuda_driver, cudasim
from compiler.runtime.launch import LaunchError

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not cudasim.enabled(), reason="runs on the CUDA simulator (STEPPER_CUDA_SIM=1)")]

F = sp.array(dtype=float)


@sp.kernel
def scale(x: F, a: float, y: F):
    i = sp.tid()
    y[i] = a * x[i]


@sp.kernel
def total(x: F, out: F):
    i = sp.tid()
    sp.atomic_add(out, 0, x[i])


@sp.kernel
def stencil(u: F, out: F):
    i = sp.tid()
    acc = 2.0 * u[i]
    if i > 0:
        acc = acc - u[i - 1]
    if i < u.shape[0] - 1:
        acc = acc - u[i + 1]
    out[i] = acc * acc


F2 = sp.array(dtype=sp.float64, ndim=2)


@sp.kernel
def laplacian_squared(u: F2, out: F2):
    i, j = sp.tid()
    acc = -4.0 * u[i, j]
    if i > 0:
        acc = acc + u[i - 1, j]
    if i < u.shape[0] - 1:
        acc = acc + u[i + 1, j]
    if j > 0:
        acc = acc + u[i, j - 1]
    if j < u.shape[1] - 1:
        acc = acc + u[i, j + 1]
    out[i, j] = acc * acc


@sp.kernel
def horner(x: F, n: int, y: F):
    i = sp.tid()
    s = float(0.0)
    j = int(0)
    while j < n + i % 3:               # trip counts differ per thread: the adjoint keeps a loop tape
        s = s * x[i] + 1.0
        j += 1
    y[i] = s


def _launches():
    from compiler.backends.cudasim import driver
    return driver.recent_launches


def test_a_launch_from_a_thread_without_a_current_context_runs():
    x = sp.array(np.arange(8, dtype=np.float32), device="cuda")
    y = sp.zeros(8, device="cuda")
    sp.launch(scale, 8, inputs=[x, 1.0], outputs=[y])      # the module is loaded: the thread only launches
    errors = []

    def work():
        try:     # this thread never allocated, so no context is current on it
            sp.launch(scale, 8, inputs=[x, 3.0], outputs=[y])
        except Exception as e:
            errors.append(e)
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert errors == []
    np.testing.assert_array_equal(y.numpy(), 3 * np.arange(8, dtype=np.float32))


def test_a_launch_after_work_on_another_device_runs():
    x = sp.array(np.arange(8, dtype=np.float32), device="cuda:0")
    y = sp.zeros(8, device="cuda:0")
    z = sp.ones(8, device="cuda:1")          # makes cuda:1's context current on this thread
    sp.launch(scale, 8, inputs=[x, 2.0], outputs=[y])
    np.testing.assert_array_equal(y.numpy(), 2 * np.arange(8, dtype=np.float32))
    np.testing.assert_array_equal(z.numpy(), 1)


def test_the_simulator_refuses_a_launch_without_a_context():
    """What the fix above guards against, shown on the raw driver."""
    from compiler.backends.cudasim import driver
    result = []
    thread = threading.Thread(target=lambda: result.append(driver.cuMemAlloc(16)))
    thread.start()
    thread.join()
    assert result[0][0] == driver.CUresult.CUDA_ERROR_INVALID_CONTEXT


def test_deterministic_launches_stay_parallel_without_atomics():
    n = 1000
    x = sp.array(np.arange(n, dtype=np.float32), device="cuda")
    y = sp.zeros(n, device="cuda")
    sp.launch(scale, n, inputs=[x, 2.0], outputs=[y], deterministic=True)
    name, grid, block, _ = _launches()[-1]
    assert name.endswith("_forward") and grid[0] > 1 and block[0] == 256
    out = sp.zeros(1, device="cuda")
    sp.launch(total, n, inputs=[x], outputs=[out], deterministic=True)
    assert _launches()[-1][1:3] == ((1, 1, 1), (1, 1, 1))       # atomics: one thread, in index order
    assert out.numpy()[0] == np.sum(np.arange(n, dtype=np.float32), dtype=np.float32)


def test_a_gathered_adjoint_runs_parallel_and_deterministic():
    n = 3000
    values = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    results = []
    for device in ("cpu", "cuda"):
        u = sp.array(values, device=device, requires_grad=True)
        out = sp.zeros(n, device=device, requires_grad=True)
        tape = sp.Tape(deterministic=True)
        with tape:
            sp.launch(stencil, n, inputs=[u], outputs=[out])
        tape.backward(grads={out: np.ones(n, np.float32)})
        results.append(u.grad.numpy())
    name, grid, _, _ = _launches()[-1]
    assert "gather" in name and grid[0] > 1
    np.testing.assert_array_equal(results[0], results[1])


def test_the_loop_tape_is_kept_and_grown_not_freed_per_launch(monkeypatch):
    monkeypatch.setattr(cuda_launch, "_TAPES", {})         # as in a fresh process
    x = sp.array(np.linspace(0.1, 0.9, 64, dtype=np.float32), device="cuda", requires_grad=True)
    y = sp.zeros(64, device="cuda", requires_grad=True)
    tape = sp.Tape()
    with tape:
        sp.launch(horner, 64, inputs=[x, 3], outputs=[y])
    tape.backward(grads={y: np.ones(64, np.float32)})
    first = cuda_launch._TAPES[0]
    tape.zero()
    tape.backward(grads={y: np.ones(64, np.float32)})
    assert cuda_launch._TAPES[0] is first                     # same size: the same buffer
    grad = x.grad.numpy()
    longer, z = sp.Tape(), sp.zeros(64, device="cuda", requires_grad=True)
    with longer:
        sp.launch(horner, 64, inputs=[x, 40], outputs=[z])      # longer loops: a bigger tape
    longer.backward(grads={z: np.ones(64, np.float32)})
    assert cuda_launch._TAPES[0].nbytes > first.nbytes
    # d/dx of the Horner sum 1 + x + ... + x^(m-1), m = 3 + i % 3, on the first pass
    xs, m = np.linspace(0.1, 0.9, 64), 3 + np.arange(64) % 3
    expected = [sum(k * v ** (k - 1) for k in range(1, mm)) for v, mm in zip(xs, m)]
    np.testing.assert_allclose(grad, expected, rtol=1e-5)


def test_capture_replays_as_one_cuda_graph_launch():
    x = sp.array(np.arange(4, dtype=np.float32), device="cuda")
    y = sp.zeros(4, device="cuda")
    z = sp.zeros(4, device="cuda")
    with sp.capture() as graph:
        sp.launch(scale, 4, inputs=[x, 2.0], outputs=[y])
        sp.launch(scale, 4, inputs=[y, 3.0], outputs=[z])
    np.testing.assert_array_equal(z.numpy(), [0, 6, 12, 18])   # captured launches ran once
    x.assign(np.ones(4, np.float32))
    version = z.version
    _launches().clear()          # the log keeps the last 256 launches: after a long run it is full
    graph.replay()
    assert list(_launches()) == [("<graph>", 2, None, 0)] and len(graph) == 2
    np.testing.assert_array_equal(z.numpy(), 6)
    assert z.version == version + 1


def test_device_memory_asked_for_while_capturing_is_refused_unless_relaxed(monkeypatch):
    """cuMemAlloc is not observed by a capture: a real driver refuses it in the capturing thread.
    The memory for a deterministic launch's partials, first asked for inside capture(), is
    allocated in relaxed mode, once, and every replay adds the same sums again."""
    from compiler.backends.cudasim import driver
    cuda_driver.primary_context(0)
    stream = cuda_driver._check(driver.cuStreamCreate(1), "cuStreamCreate")
    driver.cuStreamBeginCapture(stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    try:
        assert driver.cuMemAlloc(64)[0] == driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        with cuda_driver.relaxed_capture():
            ptr = cuda_driver._check(driver.cuMemAlloc(64), "cuMemAlloc")
    finally:
        driver.cuStreamEndCapture(stream)
        driver.cuStreamDestroy(stream)
    driver.cuMemFree(ptr)

    monkeypatch.setattr(cuda_launch, "_ADD_TABLES", {})        # nothing allocated yet on this device
    n = 40_000
    x = sp.array(np.linspace(-1, 1, n, dtype=np.float32), device="cuda")
    captured, launched = sp.zeros(1, device="cuda"), sp.zeros(1, device="cuda")
    with sp.capture() as graph:
        sp.launch(total, n, inputs=[x], outputs=[captured], deterministic=True)
    graph.replay()
    for _ in range(2):
        sp.launch(total, n, inputs=[x], outputs=[launched], deterministic=True)
    np.testing.assert_array_equal(captured.numpy(), launched.numpy())


def test_a_graph_holds_one_device():
    x = sp.zeros(4)
    y = sp.zeros(4, device="cuda")
    with pytest.raises(RuntimeError, match="one device"):
        with sp.capture():
            sp.launch(scale, 4, inputs=[x, 2.0], outputs=[sp.zeros(4)])
            sp.launch(scale, 4, inputs=[y, 2.0], outputs=[sp.zeros(4, device="cuda")])


def test_shuffled_thread_order_changes_a_racy_sum(monkeypatch):
    """Float atomics add in thread order: the simulator's shuffle shows a result that depends on it,
    and deterministic mode gives the CPU's bits whatever the order."""
    values = (10.0 ** np.random.default_rng(1).uniform(-4, 4, 4096)).astype(np.float32)
    x = sp.array(values, device="cuda")
    sums = []
    for seed in ("0", "1", "2"):
        monkeypatch.setenv("STEPPER_CUDA_SIM_SHUFFLE", seed)
        out = sp.zeros(1, device="cuda")
        sp.launch(total, 4096, inputs=[x], outputs=[out])
        sums.append(out.numpy()[0])
        exact = sp.zeros(1, device="cuda")
        sp.launch(total, 4096, inputs=[x], outputs=[exact], deterministic=True)
        cpu = sp.zeros(1)
        sp.launch(total, 4096, inputs=[sp.array(values)], outputs=[cpu], deterministic=True)
        assert exact.numpy()[0] == cpu.numpy()[0]
    assert len(set(sums)) > 1


def _run_trapping_kernel(sync: str) -> subprocess.CompletedProcess:
    """A kernel that traps poisons its context for good, so it runs in a child process."""
    code = ("import compiler as sp, sys; sys.path.insert(0, 'tests'); from cuda_trap_kernels import traps\n"
            "x, y = sp.ones(4, device='cuda'), sp.zeros(4, device='cuda')\n"
            "sp.launch(traps, 4, inputs=[x], outputs=[y])\n"
            "print('launched', flush=True)\n"
            "y.numpy()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, STEPPER_CUDA_SYNC=sync), cwd=os.path.dirname(os.path.dirname(__file__)))


def test_a_trapping_kernel_is_named_in_sync_mode():
    proc = _run_trapping_kernel("1")
    assert proc.returncode == 1 and "launched" not in proc.stdout
    assert "kernel 'traps' failed on cuda:0" in proc.stderr


def test_without_sync_mode_a_failed_kernel_surfaces_later_with_advice():
    proc = _run_trapping_kernel("0")
    assert proc.returncode == 1 and "launched" in proc.stdout      # launches are asynchronous
    assert "cuMemcpyDtoH failed: CUDA_ERROR_LAUNCH_FAILED" in proc.stderr and "STEPPER_CUDA_SYNC=1" in proc.stderr


def test_the_fake_driver_is_strict():
    from compiler.backends.cudasim import driver
    with pytest.raises(AttributeError, match="does not implement the driver call 'cuMemAllocManaged'"):
        driver.cuMemAllocManaged
    a = sp.zeros(4, device="cuda")
    host = np.zeros(8, np.float32)
    cuda_driver.primary_context(0)
    assert driver.cuMemcpyDtoH(host.ctypes.data, a.ptr, 32)[0] == driver.CUresult.CUDA_ERROR_INVALID_VALUE
    assert driver.cuMemcpyHtoD(a.ptr, a.ptr, 16)[0] == driver.CUresult.CUDA_ERROR_INVALID_VALUE
    assert driver.cuModuleLoadData(b"//\n.version 8.0\n")[0] == driver.CUresult.CUDA_ERROR_INVALID_IMAGE


def test_fresh_device_memory_is_garbage_until_written():
    assert np.isnan(sp.empty(4, device="cuda").numpy()).all()
    assert (sp.zeros(4, device="cuda").numpy() == 0).all()


def test_mixing_devices_in_a_launch_names_the_argument():
    with pytest.raises(LaunchError, match="argument 'y' is on cpu, but the launch runs on cuda:0"):
        sp.launch(scale, 4, inputs=[sp.zeros(4, device="cuda"), 2.0], outputs=[sp.zeros(4)])


def test_out_of_memory_names_the_size_and_the_array():
    with pytest.raises(MemoryError, match=r"zeros\(shape=\(3221225472,\), dtype=float32, device='cuda:0'\): "
                                          r"out of memory on cuda:0: could not allocate 12288.0 MiB"):
        sp.zeros(3 * 2**30, device="cuda")


def test_a_driver_older_than_nvrtc_is_named_with_both_versions():
    with pytest.raises(cuda_driver.CudaError, match=r"NVRTC 13.0 .* driver supports CUDA 12.4 .*"
                                                    r"nvidia-cuda-nvrtc-cu12"):
        cuda_driver.check_toolkit((12, 4), (13, 0))
    cuda_driver.check_toolkit((13, 0), (12, 9))           # an older NVRTC is fine


def test_cuda_array_interface_shares_memory_both_ways():
    a = sp.array(np.arange(6, dtype=np.float32), device="cuda")

    class Foreign:                           # what CuPy or PyTorch hand over
        __cuda_array_interface__ = a.__cuda_array_interface__
    b = sp.array(Foreign(), copy=False)
    assert b.device == "cuda:0" and b.ptr == a.ptr and b.dtype == sp.float32
    b.fill_(7.0)
    np.testing.assert_array_equal(a.numpy(), 7)
    c = sp.array(Foreign())                  # copies by default
    assert c.ptr != a.ptr
    with pytest.raises(AttributeError, match="no __array_interface__"):
        a.__array_interface__
    with pytest.raises(TypeError, match="use .numpy"):
        np.asarray(a)


def test_foreign_device_memory_stays_on_its_own_gpu_by_default():
    a = sp.array(np.arange(4, dtype=np.float32), device="cuda:1")

    class Foreign:                           # a CuPy array allocated under cupy.cuda.Device(1)
        __cuda_array_interface__ = a.__cuda_array_interface__
    b = sp.array(Foreign(), copy=False)      # used to default to cuda:0 and refuse the adoption
    assert b.device == "cuda:1" and b.ptr == a.ptr
    c = sp.array(Foreign())
    assert c.device == "cuda:1" and c.ptr != a.ptr
    np.testing.assert_array_equal(c.numpy(), [0, 1, 2, 3])


def test_dlpack_shares_device_memory_and_releases_it():
    import gc

    from compiler.runtime import dlpack
    a = sp.array(np.arange(6, dtype=np.float64).reshape(2, 3), device="cuda")
    assert a.__dlpack_device__() == (2, 0)
    b = sp.from_dlpack(a)
    assert b.device == "cuda:0" and b.ptr == a.ptr and b.shape == (2, 3) and b.dtype == sp.float64
    assert len(dlpack._exported) == 1                 # a's memory is held for b's sake
    b.fill_(1.5)
    np.testing.assert_array_equal(a.numpy(), 1.5)
    v = sp.from_dlpack(a, dtype=sp.vector(3, sp.float64))
    assert v.shape == (2,) and v.dtype == sp.vector(3, sp.float64)
    del b, v
    gc.collect()
    assert len(dlpack._exported) == 0                 # the consumer called the deleters
    a.__dlpack__()                                    # a capsule nobody consumes frees its tensor too
    gc.collect()
    assert len(dlpack._exported) == 0
    cpu = sp.from_dlpack(np.arange(3, dtype=np.float32))
    assert cpu.device == "cpu"


def test_the_gpu_command_runs(tmp_path):
    """benchmarks/gpu.py, the command a GPU machine runs, in its quick mode (the numbers mean nothing here)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "gpu.md"
    proc = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "gpu.py"), "--skip-install", "--skip-tests",
                           "--quick", "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = out.read_text()
    assert "On the CUDA simulator" in table
    for row in ("| saxpy, 4,096 floats |", "| launch of a 32-thread kernel |",
                "| host cost of a trace replay's launch (relaunch), 16^2 wave step |", "| wave 16^2, 20 steps, forward |",
                "| wave 16^2, 20 steps, gradient (Revolve-4) |",
                "| wave 16^2, 60 steps, Revolve-10 gradient, native loops |",
                "| wave 16^2, 60 steps, Revolve-10 gradient, reversals without a tape |",
                "| wave 16^2, 60 steps, MultiLevel(2 RAM, 8 HDF5) gradient, async snapshot copies |",
                "| FWI 2-D 24^2 8th-order adjoint kernel as launched, gather passes at 8 blocks an SM |",
                "| FWI 3-D 10^3 8th-order adjoint kernel as launched, gather passes at 8 blocks an SM |",
                "| 2-D 24^2 | 2 | float32 | unrolled |", "| 3-D 8^3 | 2 | float32 | fwi, damping constant |"):
        assert row in table


def test_checkpointed_gradients_on_the_gpu_keep_the_cpus_bits():
    """The same model on the CPU and the (simulated) GPU, store-all and Revolve: the same bits."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "stepper"))
    import stepper as st
    import stepper_models as models
    initial = {k: v.numpy() for k, v in models.chain_initial(16).items()}
    results = {}
    for device, schedule in (("cpu", st.StoreAll(300)), ("cuda", st.StoreAll(300)), ("cuda", st.Revolve(300, 6))):
        model = models.chain_model(16)
        cuda_model = st.Model(dt=model.dt, device=device)
        for name, spec in model.states.items():
            cuda_model.state(name, spec.shape, spec.dtype)
        for name, p in model.params.items():
            cuda_model.param(name, p.to(device))
        cuda_model.step(model.step_fn)

        def loss(state, device=device):
            out = st.zeros(1, dtype=st.float64, device=device)
            st.launch(models.sum_squares64, 16, inputs=[state.x], outputs=[out])
            return out
        r = cuda_model.gradient(initial, steps=300, loss=loss, schedule=schedule)
        results[device, type(schedule).__name__] = (r.loss, r.grads["x"].numpy(), r.grads["k"].numpy())
    reference = results["cpu", "StoreAll"]
    for key, (loss, gx, gk) in results.items():
        assert loss == reference[0] and np.array_equal(gx, reference[1]) and np.array_equal(gk, reference[2]), key


def test_a_copy_on_a_late_stream_sees_memory_as_it_is_when_the_copy_runs():
    """Work on a non-blocking stream waits until someone waits for it, so a buffer changed before
    that shows in the copy: the simulator makes the race a missing hold would be visible."""
    from compiler.runtime.host_copy import HostCopy
    a = sp.array(np.arange(6, dtype=np.float32), device="cuda")
    v = sp.array(np.ones((2, 3), dtype=np.float64), device="cuda")
    copy = HostCopy({"a": a, "v": v})
    assert not copy.done()                  # queued behind nothing, but nobody has waited yet
    a.fill_(5.0)                            # the caller broke its promise to leave `a` alone
    values = copy.wait()
    assert copy.done()
    np.testing.assert_array_equal(values["a"], 5.0)
    np.testing.assert_array_equal(values["v"], np.ones((2, 3)))
    copy.release()
    again = HostCopy({"a": a, "v": v})       # the pinned memory is reused, and the copy is right
    a.fill_(1.0)
    np.testing.assert_array_equal(again.wait()["a"], 1.0)
    again.release()


def test_disk_snapshots_of_a_gpu_state_leave_by_asynchronous_copies(monkeypatch, tmp_path):
    """A MultiLevel gradient on the GPU with HDF5: every disk snapshot is copied to pinned memory on
    a side stream (never a synchronous cuMemcpyDtoH of a state), and the gradient keeps store-all's
    bits although the simulator runs those copies late (the states stay held until they land)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "stepper"))
    import stepper as st
    import stepper_models as models
    from compiler.backends.cudasim import driver
    model = models.chain_model(16, device="cuda")
    initial = models.chain_initial(16, device="cuda")      # copied on the device, never read back

    def loss(state):
        out = st.zeros(1, dtype=st.float64, device="cuda")
        st.launch(models.sum_squares64, 16, inputs=[state.x], outputs=[out])
        return out
    reference = model.gradient(initial, steps=120, loss=loss, schedule=st.StoreAll(120))
    calls = {"sync": 0, "async": 0}
    sync, asynchronous = driver.cuMemcpyDtoH, driver.cuMemcpyDtoHAsync

    def counted(kind, fn):
        def call(dst, src, nbytes, *rest):
            calls[kind] += nbytes == 16 * 8              # a chain state: 16 float64 values
            return fn(dst, src, nbytes, *rest)
        return call
    monkeypatch.setattr(driver, "cuMemcpyDtoH", counted("sync", sync))
    monkeypatch.setattr(driver, "cuMemcpyDtoHAsync", counted("async", asynchronous))
    r = model.gradient(initial, steps=120, loss=loss, schedule=st.MultiLevel(120, 2, 4),
                       storage=tmp_path / "snapshots.h5")
    writes = r.stats.snapshots_written(st.StorageType.DISK)
    assert writes > 0 and calls == {"sync": 0, "async": writes * len(model.states)}
    assert r.loss == reference.loss
    for name in reference.grads:
        np.testing.assert_array_equal(r.grads[name].numpy(), reference.grads[name].numpy(), err_msg=name)


def _laplacian(u):
    padded = np.pad(u, 1)
    return padded[:-2, 1:-1] + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:] - 4 * u


@pytest.mark.parametrize("shape", [(37, 41), (2, 5), (1, 1)])    # (2, 5) and (1, 1): empty interior boxes
def test_stencils_run_their_interior_variant_on_the_gpu(shape):
    """The CUDA forward and gather entries run the interior variant (boundary tests settled) inside
    its box and the guarded body outside it: the source says so, and the values and gradient
    match NumPy's, in boxes of any size."""
    source = laplacian_squared.module.render(False, target="cuda").source
    compiled = laplacian_squared.compiled()
    assert compiled.interior is not None and compiled.gather.interior is not None
    for entry, variant in ((f"{compiled.forward.name}_forward", compiled.interior),
                           (compiled.gather.function.name, compiled.gather.interior)):
        body = source[source.index(f" {entry}("):]
        body = body[:body.index("\n}\n")]
        assert f"{variant.function.name}_thread" in body, entry
    u = np.random.default_rng(3).random(shape)
    x = sp.array(u, device="cuda", requires_grad=True)
    y = sp.zeros(shape, dtype=sp.float64, device="cuda", requires_grad=True)
    tape = sp.Tape()
    with tape:
        sp.launch(laplacian_squared, shape, inputs=[x], outputs=[y])
    tape.backward(grads={y: np.ones(shape)})
    lap = _laplacian(u)
    np.testing.assert_allclose(y.numpy(), lap ** 2, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(x.grad.numpy(), _laplacian(2 * lap), rtol=1e-12, atol=1e-12)

