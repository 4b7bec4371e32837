"""Identity stores (compiler/passes/identity_stores.py): `out[tid] = in[tid]`, which a run of
steps does by renaming buffers; and the forward without them."""
import numpy as np

import compiler as sp
from compiler import ir

F2 = sp.array(dtype=float, ndim=2)


@sp.kernel
def leapfrog(up: F2, u: F2, up_next: F2, u_next: F2):
    i, j = sp.tid()
    x = u[i, j]
    up_next[i, j] = x
    u_next[i, j] = 2.0 * x - up[i, j]


@sp.kernel
def guarded(up: F2, u: F2, up_next: F2, u_next: F2):
    i, j = sp.tid()
    if i > 0:                               # not every thread stores
        up_next[i, j] = u[i, j]
    u_next[i, j] = u[i, j] - up[i, j]


@sp.kernel
def shifted(up: F2, u: F2, up_next: F2, u_next: F2):
    i, j = sp.tid()
    n = u.shape[0]
    up_next[i, j] = u[(i + 1) % n, j]       # another thread's element
    u_next[i, j] = u[i, j] - up[i, j]


@sp.kernel
def transposed(up: F2, u: F2, up_next: F2, u_next: F2):
    i, j = sp.tid()
    up_next[j, i] = u[j, i]                 # axes swapped
    u_next[i, j] = u[i, j] - up[i, j]


@sp.kernel
def read_back(up: F2, u: F2, up_next: F2, u_next: F2):
    i, j = sp.tid()
    up_next[i, j] = u[i, j]
    u_next[i, j] = up_next[i, j] - up[i, j]  # reads the copy: the store must happen


@sp.kernel
def reassigned(up: F2, u: F2, up_next: F2, u_next: F2):
    i, j = sp.tid()
    x = u[i, j]
    if i > 0:
        x = up[i, j]
    up_next[i, j] = x                       # u[i, j] or up[i, j]: not a copy of one array
    u_next[i, j] = x


def test_a_store_of_the_threads_own_element_is_an_identity_store():
    identity = leapfrog.compiled().identity
    assert identity.copies == {"up_next": "u"}
    stores = {s.array.param.name for s in ir.walk(identity.function.body) if isinstance(s, ir.Store)}
    assert stores == {"u_next"}
    assert identity.interior is None or identity.interior.function.name.endswith("_renamed_interior")


def test_stores_that_are_not_whole_copies_are_not():
    for kernel in (guarded, shifted, transposed, read_back, reassigned):
        assert kernel.compiled().identity is None, kernel.__name__


def test_the_variant_computes_the_rest_of_the_kernel():
    """The module's entry for the variant writes u_next as the kernel does and leaves up_next."""
    import ctypes
    from compiler.runtime.copy_kernels import renamed_forward
    from compiler.runtime.launch import packed_forward
    rng = np.random.default_rng(0)
    up, u = (sp.array(rng.standard_normal((8, 6)).astype(np.float32)) for _ in range(2))
    full = [sp.zeros((8, 6)), sp.zeros((8, 6))]
    sp.launch(leapfrog, (8, 6), inputs=[up, u], outputs=full)
    outs = [sp.array(np.full((8, 6), 7.0, np.float32)), sp.zeros((8, 6))]
    _, packed, serial, _ = packed_forward(leapfrog, (8, 6), [up, u, *outs], True)
    buf = ctypes.create_string_buffer(packed, len(packed))
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int)(renamed_forward(leapfrog))(ctypes.addressof(buf), serial)
    np.testing.assert_array_equal(outs[1].numpy(), full[1].numpy())
    np.testing.assert_array_equal(outs[0].numpy(), np.full((8, 6), 7.0, np.float32))
