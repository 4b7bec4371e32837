"""What the gather-form tests share: the stencil corpus (benchmarks/stencil_spellings.py), a
kernel's copy in the one-pass form or with variants of its form replaced, and its gradients."""
import dataclasses
import os
import sys

import numpy as np

import compiler as sp
from compiler.kernel import Kernel, KernelModule
from compiler.passes.adjoint import adjoint_function
from compiler.passes.gather import gather_adjoint

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import stencil_spellings  # noqa: E402


def corpus(order, ndim, dtype=sp.float64):
    return stencil_spellings.kernels(order, ndim, dtype)


def one_pass_copy(kernel) -> Kernel:
    """`kernel` in a module of its own, with the one-pass gather form (one adjoint copy per offset)."""
    copy = _copy(kernel, "one_pass", two_pass=False)
    assert copy.compiled().gather.pointwise is None
    return copy


def exact_copy(kernel) -> Kernel:
    """`kernel`, or where it takes the halo form its copy whose transposed pass multiplies each
    root by its weights (compiler/passes/reassociate.py not run): the form that gives the one-pass
    form's bits (the default sums the roots of one weight first, which rounds otherwise)."""
    return _copy(kernel, "exact", reassociate=False) if kernel.compiled().gather.halo else kernel


def assert_one_pass_bits(kernel, shape, values, w, device, dtype=sp.float64):
    """`kernel`'s gradients: its exact copy's are the one-pass form's bit for bit, its own are
    within rounding of them (a few units in the last place) and the same bits on one thread, in
    order. Returns the one-pass form's."""
    _, one = gradients(one_pass_copy(kernel), shape, values, w, device)
    _, exact = gradients(exact_copy(kernel), shape, values, w, device)
    _, own = gradients(kernel, shape, values, w, device)
    _, serial = gradients(kernel, shape, values, w, device, deterministic=True)
    eps = np.finfo(dtype.np_dtype).eps
    for a, b, c, d in zip(exact, one, own, serial):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(c, d)
        np.testing.assert_allclose(c, b, rtol=64 * eps, atol=64 * eps * np.abs(b).max())
    return one


def no_halo_copy(kernel) -> Kernel:
    """`kernel` in a module of its own, its two-pass form's scratch the launch's size (not the halo
    form): the form whose threads near a face run variants settled there."""
    copy = _copy(kernel, "no_halo", halo=False)
    assert copy.compiled().gather.pointwise is not None and not copy.compiled().gather.halo
    return copy


def with_faces(kernel) -> Kernel:
    """`kernel`, or where it takes the halo form (which runs one variant everywhere) its
    `no_halo_copy`: the form whose variants near the faces a test looks at."""
    return no_halo_copy(kernel) if kernel.compiled().gather.halo else kernel


def _copy(kernel, name: str, **options) -> Kernel:
    module = KernelModule(f"{name}_{kernel.__name__}_{id(kernel)}")
    copy = Kernel(kernel.fn, module)
    module.add(copy)
    compiled = copy.compiled()
    compiled.gather = gather_adjoint(adjoint_function(compiled.forward), **options)
    assert compiled.gather is not None
    return copy


def inputs(kernel, shape, seed):
    rng = np.random.default_rng(seed)
    count = len(kernel.compiled().forward.params) - 1
    scales = [1.0, 1.0, 0.1, 0.05][:count]
    return [rng.standard_normal(shape) * s for s in scales], rng.standard_normal(shape)


def gradients(kernel, shape, values, w, device="cpu", deterministic=False, extra=()):
    """(the output, the gradients of the inputs `values`) of `kernel`'s launch, the incoming gradient
    `w`, each array in its parameter's dtype; `extra`: inputs after those, without gradients (a
    coefficient table)."""
    params = kernel.compiled().forward.params
    arrays = [sp.array(v.astype(p.type.dtype.np_dtype), requires_grad=True, device=device)
              for v, p in zip(values, params)]
    out_dtype = params[-1].type.dtype
    out = sp.zeros(shape, dtype=out_dtype, requires_grad=True, device=device)
    tape = sp.Tape(deterministic=deterministic)
    with tape:
        sp.launch(kernel, shape, inputs=[*arrays, *extra], outputs=[out])
    tape.backward(grads={out: w.astype(out_dtype.np_dtype)})
    return out.numpy(), [a.grad.numpy() for a in arrays]


def without(kernel, **fields) -> Kernel:
    """`kernel` in a module of its own whose gather form has `fields` replaced (a variant set to
    None runs what ran before it)."""
    module = KernelModule(f"without_{'_'.join(fields)}_{kernel.__name__}_{id(kernel)}")
    copy = Kernel(kernel.fn, module)
    module.add(copy)
    copy.compiled().gather = dataclasses.replace(kernel.compiled().gather, **fields)
    return copy
