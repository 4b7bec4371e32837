"""One nonlinear wave step with a 2nd-, 4th- or 8th-order Laplacian, in 2-D and 3-D, spelled four ways.

    u_next = 2 u - up + C lap(u) - B u^3      (zero where the stencil would leave the grid)

- `unrolled`: every neighbour written out;
- `helper`: the Laplacian in a `@sp.func` helper;
- `table`: a loop over a coefficient table (a Python tuple), per radius the 2 * ndim neighbours;
- `neighbours`: loops over the radius and over an offset table of the 2 * ndim directions.

Plus `fwi`: Devito's acoustic update (a damping layer, a squared-slowness field) with the same
Laplacian, written with the coefficient table, and `fwi_array`: the same with the weights passed as
an array (as Devito's generated code and benchmarks/peer_impls/fwi_ours.py hold them), whose gradient
scatters. benchmarks/spellings.py (``--kernels``) times their
forward and adjoint kernels; tests/test_transposed_adjoint.py checks that every spelling reaches the
two-pass form and computes the same thing.
"""

import functools

import stepper as sp

C, B = 0.1, 1e-3
# Central second-derivative weights by order: W[0] at the point, W[r] at distance r.
WEIGHTS = {2: (-2.0, 1.0),
           4: (-5.0 / 2.0, 4.0 / 3.0, -1.0 / 12.0),
           8: (-205.0 / 72.0, 8.0 / 5.0, -1.0 / 5.0, 8.0 / 315.0, -1.0 / 560.0)}
DI2, DJ2 = (1, -1, 0, 0), (0, 0, 1, -1)
DI3, DJ3, DK3 = (1, -1, 0, 0, 0, 0), (0, 0, 1, -1, 0, 0), (0, 0, 0, 0, 1, -1)


@functools.lru_cache(maxsize=None)
def kernels(order: int, ndim: int, dtype) -> dict:
    """spelling -> kernel for one order, dimension and dtype (a factory, as a user who runs both
    precisions writes it). The wave kernels take (up, u) and write u_next; `fwi` takes (up, u, m,
    damp) and writes u_next. Each group builds into a module of its own (kernels of one Python
    module compile together, and a module of every group is one very large compile)."""
    return (_kernels_2d if ndim == 2 else _kernels_3d)(order, dtype, _kernel_in(f"stencil_spellings_{ndim}d_order"
                                                                             f"{order}_{dtype.name}"))


def _kernel_in(module: str):
    """`sp.kernel`, building into the module named `module`."""
    def make(fn):
        fn.__module__ = module
        return sp.kernel(fn)
    return make


def _kernels_2d(order: int, dtype, kernel) -> dict:
    A = sp.array(dtype=dtype, ndim=2)
    W = WEIGHTS[order]
    R = order // 2
    w0, w1 = W[0], W[1]
    w2, w3, w4 = (W + (0.0, 0.0, 0.0))[2:5]

    if order == 2:
        @kernel
        def unrolled(up: A, u: A, u_next: A):
            i, j = sp.tid()
            n, m = u.shape[0], u.shape[1]
            v = dtype(0.0)
            if i >= 1 and j >= 1 and i < n - 1 and j < m - 1:
                x = u[i, j]
                lap = 2.0 * w0 * x + w1 * (u[i + 1, j] + u[i - 1, j] + u[i, j + 1] + u[i, j - 1])
                v = 2.0 * x - up[i, j] + C * lap - B * x * x * x
            u_next[i, j] = v
    elif order == 4:
        @kernel
        def unrolled(up: A, u: A, u_next: A):
            i, j = sp.tid()
            n, m = u.shape[0], u.shape[1]
            v = dtype(0.0)
            if i >= 2 and j >= 2 and i < n - 2 and j < m - 2:
                x = u[i, j]
                lap = (2.0 * w0 * x + w1 * (u[i + 1, j] + u[i - 1, j] + u[i, j + 1] + u[i, j - 1])
                       + w2 * (u[i + 2, j] + u[i - 2, j] + u[i, j + 2] + u[i, j - 2]))
                v = 2.0 * x - up[i, j] + C * lap - B * x * x * x
            u_next[i, j] = v
    else:
        @kernel
        def unrolled(up: A, u: A, u_next: A):
            i, j = sp.tid()
            n, m = u.shape[0], u.shape[1]
            v = dtype(0.0)
            if i >= 4 and j >= 4 and i < n - 4 and j < m - 4:
                x = u[i, j]
                lap = (2.0 * w0 * x + w1 * (u[i + 1, j] + u[i - 1, j] + u[i, j + 1] + u[i, j - 1])
                       + w2 * (u[i + 2, j] + u[i - 2, j] + u[i, j + 2] + u[i, j - 2])
                       + w3 * (u[i + 3, j] + u[i - 3, j] + u[i, j + 3] + u[i, j - 3])
                       + w4 * (u[i + 4, j] + u[i - 4, j] + u[i, j + 4] + u[i, j - 4]))
                v = 2.0 * x - up[i, j] + C * lap - B * x * x * x
            u_next[i, j] = v

    @sp.func
    def laplacian(u, i: int, j: int):
        lap = 2.0 * W[0] * u[i, j]
        for r in range(1, R + 1):
            lap += W[r] * (u[i + r, j] + u[i - r, j] + u[i, j + r] + u[i, j - r])
        return lap

    @kernel
    def helper(up: A, u: A, u_next: A):
        i, j = sp.tid()
        n, m = u.shape[0], u.shape[1]
        v = dtype(0.0)
        if i >= R and j >= R and i < n - R and j < m - R:
            x = u[i, j]
            v = 2.0 * x - up[i, j] + C * laplacian(u, i, j) - B * x * x * x
        u_next[i, j] = v

    @kernel
    def table(up: A, u: A, u_next: A):
        i, j = sp.tid()
        n, m = u.shape[0], u.shape[1]
        v = dtype(0.0)
        if i >= R and j >= R and i < n - R and j < m - R:
            x = u[i, j]
            lap = 2.0 * W[0] * x
            for r in range(1, R + 1):
                lap += W[r] * (u[i + r, j] + u[i - r, j] + u[i, j + r] + u[i, j - r])
            v = 2.0 * x - up[i, j] + C * lap - B * x * x * x
        u_next[i, j] = v

    @kernel
    def neighbours(up: A, u: A, u_next: A):
        i, j = sp.tid()
        n, m = u.shape[0], u.shape[1]
        v = dtype(0.0)
        if i >= R and j >= R and i < n - R and j < m - R:
            x = u[i, j]
            lap = 2.0 * W[0] * x
            for r in range(1, R + 1):
                for d in range(4):
                    lap += W[r] * u[i + r * DI2[d], j + r * DJ2[d]]
            v = 2.0 * x - up[i, j] + C * lap - B * x * x * x
        u_next[i, j] = v

    @kernel
    def fwi(up: A, u: A, m: A, damp: A, u_next: A):
        i, j = sp.tid()
        n, k = u.shape[0], u.shape[1]
        v = dtype(0.0)
        if i >= R and j >= R and i < n - R and j < k - R:
            x = u[i, j]
            lap = 2.0 * W[0] * x
            for r in range(1, R + 1):
                lap += W[r] * (u[i + r, j] + u[i - r, j] + u[i, j + r] + u[i, j - r])
            d = damp[i, j]
            v = (2.0 * x - (1.0 - d) * up[i, j] + m[i, j] * lap) / (1.0 + d)
        u_next[i, j] = v

    @kernel
    def fwi_array(up: A, u: A, m: A, damp: A, w: sp.array(dtype=dtype), u_next: A):
        i, j = sp.tid()
        n, k = u.shape[0], u.shape[1]
        v = dtype(0.0)
        if i >= R and j >= R and i < n - R and j < k - R:
            x = u[i, j]
            lap = 2.0 * w[0] * x
            for r in range(1, R + 1):
                lap += w[r] * (u[i + r, j] + u[i - r, j] + u[i, j + r] + u[i, j - r])
            d = damp[i, j]
            v = (2.0 * x - (1.0 - d) * up[i, j] + m[i, j] * lap) / (1.0 + d)
        u_next[i, j] = v

    return {"unrolled": unrolled, "helper": helper, "table": table, "neighbours": neighbours, "fwi": fwi,
            "fwi_array": fwi_array}


def _kernels_3d(order: int, dtype, kernel) -> dict:
    A = sp.array(dtype=dtype, ndim=3)
    W = WEIGHTS[order]
    R = order // 2
    w0, w1 = W[0], W[1]
    w2, w3, w4 = (W + (0.0, 0.0, 0.0))[2:5]

    if order == 2:
        @kernel
        def unrolled(up: A, u: A, u_next: A):
            i, j, k = sp.tid()
            n0, n1, n2 = u.shape[0], u.shape[1], u.shape[2]
            v = dtype(0.0)
            if i >= 1 and j >= 1 and k >= 1 and i < n0 - 1 and j < n1 - 1 and k < n2 - 1:
                x = u[i, j, k]
                lap = 3.0 * w0 * x + w1 * (u[i + 1, j, k] + u[i - 1, j, k] + u[i, j + 1, k] + u[i, j - 1, k]
                                           + u[i, j, k + 1] + u[i, j, k - 1])
                v = 2.0 * x - up[i, j, k] + C * lap - B * x * x * x
            u_next[i, j, k] = v
    elif order == 4:
        @kernel
        def unrolled(up: A, u: A, u_next: A):
            i, j, k = sp.tid()
            n0, n1, n2 = u.shape[0], u.shape[1], u.shape[2]
            v = dtype(0.0)
            if i >= 2 and j >= 2 and k >= 2 and i < n0 - 2 and j < n1 - 2 and k < n2 - 2:
                x = u[i, j, k]
                lap = (3.0 * w0 * x + w1 * (u[i + 1, j, k] + u[i - 1, j, k] + u[i, j + 1, k] + u[i, j - 1, k]
                                            + u[i, j, k + 1] + u[i, j, k - 1])
                       + w2 * (u[i + 2, j, k] + u[i - 2, j, k] + u[i, j + 2, k] + u[i, j - 2, k]
                               + u[i, j, k + 2] + u[i, j, k - 2]))
                v = 2.0 * x - up[i, j, k] + C * lap - B * x * x * x
            u_next[i, j, k] = v
    else:
        @kernel
        def unrolled(up: A, u: A, u_next: A):
            i, j, k = sp.tid()
            n0, n1, n2 = u.shape[0], u.shape[1], u.shape[2]
            v = dtype(0.0)
            if i >= 4 and j >= 4 and k >= 4 and i < n0 - 4 and j < n1 - 4 and k < n2 - 4:
                x = u[i, j, k]
                lap = (3.0 * w0 * x + w1 * (u[i + 1, j, k] + u[i - 1, j, k] + u[i, j + 1, k] + u[i, j - 1, k]
                                            + u[i, j, k + 1] + u[i, j, k - 1])
                       + w2 * (u[i + 2, j, k] + u[i - 2, j, k] + u[i, j + 2, k] + u[i, j - 2, k]
                               + u[i, j, k + 2] + u[i, j, k - 2])
                       + w3 * (u[i + 3, j, k] + u[i - 3, j, k] + u[i, j + 3, k] + u[i, j - 3, k]
                               + u[i, j, k + 3] + u[i, j, k - 3])
                       + w4 * (u[i + 4, j, k] + u[i - 4, j, k] + u[i, j + 4, k] + u[i, j - 4, k]
                               + u[i, j, k + 4] + u[i, j, k - 4]))
                v = 2.0 * x - up[i, j, k] + C * lap - B * x * x * x
            u_next[i, j, k] = v

    @sp.func
    def laplacian(u, i: int, j: int, k: int):
        lap = 3.0 * W[0] * u[i, j, k]
        for r in range(1, R + 1):
            lap += W[r] * (u[i + r, j, k] + u[i - r, j, k] + u[i, j + r, k] + u[i, j - r, k]
                           + u[i, j, k + r] + u[i, j, k - r])
        return lap

    @kernel
    def helper(up: A, u: A, u_next: A):
        i, j, k = sp.tid()
        n0, n1, n2 = u.shape[0], u.shape[1], u.shape[2]
        v = dtype(0.0)
        if i >= R and j >= R and k >= R and i < n0 - R and j < n1 - R and k < n2 - R:
            x = u[i, j, k]
            v = 2.0 * x - up[i, j, k] + C * laplacian(u, i, j, k) - B * x * x * x
        u_next[i, j, k] = v

    @kernel
    def table(up: A, u: A, u_next: A):
        i, j, k = sp.tid()
        n0, n1, n2 = u.shape[0], u.shape[1], u.shape[2]
        v = dtype(0.0)
        if i >= R and j >= R and k >= R and i < n0 - R and j < n1 - R and k < n2 - R:
            x = u[i, j, k]
            lap = 3.0 * W[0] * x
            for r in range(1, R + 1):
                lap += W[r] * (u[i + r, j, k] + u[i - r, j, k] + u[i, j + r, k] + u[i, j - r, k]
                               + u[i, j, k + r] + u[i, j, k - r])
            v = 2.0 * x - up[i, j, k] + C * lap - B * x * x * x
        u_next[i, j, k] = v

    @kernel
    def neighbours(up: A, u: A, u_next: A):
        i, j, k = sp.tid()
        n0, n1, n2 = u.shape[0], u.shape[1], u.shape[2]
        v = dtype(0.0)
        if i >= R and j >= R and k >= R and i < n0 - R and j < n1 - R and k < n2 - R:
            x = u[i, j, k]
            lap = 3.0 * W[0] * x
            for r in range(1, R + 1):
                for d in range(6):
                    lap += W[r] * u[i + r * DI3[d], j + r * DJ3[d], k + r * DK3[d]]
            v = 2.0 * x - up[i, j, k] + C * lap - B * x * x * x
        u_next[i, j, k] = v

    @kernel
    def fwi(up: A, u: A, m: A, damp: A, u_next: A):
        i, j, k = sp.tid()
        n0, n1, n2 = u.shape[0], u.shape[1], u.shape[2]
        v = dtype(0.0)
        if i >= R and j >= R and k >= R and i < n0 - R and j < n1 - R and k < n2 - R:
            x = u[i, j, k]
            lap = 3.0 * W[0] * x
            for r in range(1, R + 1):
                lap += W[r] * (u[i + r, j, k] + u[i - r, j, k] + u[i, j + r, k] + u[i, j - r, k]
                               + u[i, j, k + r] + u[i, j, k - r])
            d = damp[i, j, k]
            v = (2.0 * x - (1.0 - d) * up[i, j, k] + m[i, j, k] * lap) / (1.0 + d)
        u_next[i, j, k] = v

    @kernel
    def fwi_array(up: A, u: A, m: A, damp: A, w: sp.array(dtype=dtype), u_next: A):
        i, j, k = sp.tid()
        n0, n1, n2 = u.shape[0], u.shape[1], u.shape[2]
        v = dtype(0.0)
        if i >= R and j >= R and k >= R and i < n0 - R and j < n1 - R and k < n2 - R:
            x = u[i, j, k]
            lap = 3.0 * w[0] * x
            for r in range(1, R + 1):
                lap += w[r] * (u[i + r, j, k] + u[i - r, j, k] + u[i, j + r, k] + u[i, j - r, k]
                               + u[i, j, k + r] + u[i, j, k - r])
            d = damp[i, j, k]
            v = (2.0 * x - (1.0 - d) * up[i, j, k] + m[i, j, k] * lap) / (1.0 + d)
        u_next[i, j, k] = v

    return {"unrolled": unrolled, "helper": helper, "table": table, "neighbours": neighbours, "fwi": fwi,
            "fwi_array": fwi_array}
