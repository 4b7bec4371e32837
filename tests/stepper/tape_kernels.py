"""Kernels around a rollout recorded on a Tape (kernels must live in files)."""
import stepper as sp

F64 = sp.array(dtype=sp.float64)


@sp.kernel
def affine(a: F64, scale: sp.float64, shift: sp.float64, out: F64):
    i = sp.tid()
    out[i] = scale * a[i] + shift
