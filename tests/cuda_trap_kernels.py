"""A kernel that traps on a GPU (its own module: it is never built for the CPU)."""
import compiler as sp


@sp.func_native("__trap(); return x;")
def trap(x: float) -> float:
    ...


@sp.kernel
def traps(x: sp.array(dtype=float), y: sp.array(dtype=float)):
    i = sp.tid()
    y[i] = trap(x[i])
