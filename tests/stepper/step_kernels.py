"""Small kernels for the versioning and error tests (kernels must live in files)."""
import stepper as sp

F32 = sp.array(dtype=float)


@sp.kernel
def double(x: F32, y: F32):
    i = sp.tid()
    y[i] = 2.0 * x[i]


@sp.kernel
def add_into(x: F32, y: F32):
    i = sp.tid()
    y[i] += x[i]


@sp.kernel
def scale_in_place_target(x: F32, factor: float, y: F32):
    i = sp.tid()
    y[i] = factor * x[i]


@sp.kernel
def total(x: F32, out: F32):
    i = sp.tid()
    sp.atomic_add(out, 0, x[i])
