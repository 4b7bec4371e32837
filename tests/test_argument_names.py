"""Any Python name is a kernel argument's name: ours in the generated C++ (`A`, `G`, `L`, `tp`, `t0`,
`tid_0`, `adj_x`) and C++ keywords (`new`, `default`) used to fail to compile, with the compiler's
error about our code. Each kernel here names its arguments so, runs forward and backward (a stencil,
so the gather form and its interior bounds over `A`'s extent are generated too), and compiles to PTX
with the rest (tests/test_cuda_codegen.py)."""
import numpy as np

import stepper as sp

F32 = sp.array(dtype=sp.float32)


@sp.kernel
def smooth(A: F32, L: F32, G: F32, tp: float, t0: F32):
    i = sp.tid()
    n = A.shape[0]
    v = sp.float32(0.0)
    if i > 0 and i < n - 1:
        v = tp * (A[i - 1] + A[i + 1]) + L[i] * G[i]
    t0[i] = v


@sp.kernel
def keywords(new: F32, default: F32, tid_0: F32, x: F32, adj_x: F32, this: F32):
    i = sp.tid()
    this[i] = new[i] * default[i] + tid_0[i] * x[i] - adj_x[i]


def test_arguments_named_like_generated_identifiers_run_forward_and_backward(device):
    n = 12
    rng = np.random.default_rng(0)
    a, l_, g = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    arrays = [sp.array(v, requires_grad=True, device=device) for v in (a, l_, g)]
    out = sp.zeros(n, requires_grad=True, device=device)
    seed = rng.standard_normal(n).astype(np.float32)
    tape = sp.Tape()
    with tape:
        sp.launch(smooth, n, inputs=[*arrays, 0.5], outputs=[out])
    tape.backward(grads={out: seed})
    inner = np.arange(1, n - 1)
    want = np.zeros(n, np.float32)
    want[inner] = np.float32(0.5) * (a[inner - 1] + a[inner + 1]) + l_[inner] * g[inner]
    np.testing.assert_array_equal(out.numpy(), want)
    grad_a = np.zeros(n)
    for i in inner:
        grad_a[i - 1] += 0.5 * seed[i]
        grad_a[i + 1] += 0.5 * seed[i]
    np.testing.assert_allclose(arrays[0].grad.numpy(), grad_a, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(arrays[1].grad.numpy()[inner], (seed * g)[inner], rtol=1e-6)
    np.testing.assert_allclose(arrays[2].grad.numpy()[inner], (seed * l_)[inner], rtol=1e-6)


def test_arguments_named_like_cpp_keywords_and_our_gradients(device):
    n = 5
    values = [np.arange(1, n + 1, dtype=np.float32) * (k + 1) for k in range(5)]
    arrays = [sp.array(v, requires_grad=True, device=device) for v in values]
    out = sp.zeros(n, requires_grad=True, device=device)
    tape = sp.Tape()
    with tape:
        sp.launch(keywords, n, inputs=arrays, outputs=[out])
    tape.backward(grads={out: np.ones(n, np.float32)})
    new, default, tid_0, x, adj_x = values
    np.testing.assert_array_equal(out.numpy(), new * default + tid_0 * x - adj_x)
    np.testing.assert_array_equal(arrays[0].grad.numpy(), default)
    np.testing.assert_array_equal(arrays[3].grad.numpy(), tid_0)
    np.testing.assert_array_equal(arrays[4].grad.numpy(), -np.ones(n, np.float32))
