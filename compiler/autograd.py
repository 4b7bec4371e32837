"""Gradient debugging tools: Jacobians by autodiff and by finite differences, and gradient checks::

    jacs = autograd.jacobian(my_kernel, n, inputs=[a, b], outputs=[out])   # {("a", "out"): J, ...}
    fds = autograd.jacobian_fd(my_kernel, n, inputs=[a, b], outputs=[out])
    autograd.gradcheck(my_kernel, n, inputs=[a, b], outputs=[out])          # prints a table, True/False
    autograd.gradcheck_tape(tape)                                          # every launch on a tape

A Jacobian is a float64 NumPy matrix of shape (output scalars, input scalars): vector and matrix
elements count component by component, in the order of ``array.numpy().ravel()``. Keys are
``(input_name, output_name)``: a kernel's parameter names, or for a Python function its parameter
names and ``"output_0"``, ``"output_1"``, ... Only float arrays with ``requires_grad=True`` take part.

`function` is either a kernel (then `dim`, `inputs` and `outputs` are its launch) or a Python
function that launches kernels: it is called as ``function(*inputs)`` and either returns its output
arrays or writes into the arrays given as `outputs`.

What the tools do to your data:

- a kernel runs on private copies of its arguments, so your arrays, their gradients and any Tape that
  recorded them are left exactly as they were;
- a Python function runs on your arrays. Finite differences perturb inputs in place (through
  ``numpy()`` views on the CPU, host copies written back on a GPU), which does not bump array
  versions, and put back the exact original values; outputs that you pass
  are reset to their values on entry before every run, so accumulating functions differentiate
  correctly. Gradients of the arrays the function touches are restored afterwards. The function's
  outputs end up holding the result of the last run.

Which arrays are inputs and outputs of a kernel follows from what the kernel does with them, not
from the inputs/outputs split of the launch (which only documents intent): arrays it reads are
inputs, arrays it stores or accumulates into are outputs (an array it reads and accumulates into is
both, and its Jacobian then includes the identity of the accumulation).
"""
from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .kernel import Kernel
from .runtime.array import array, clone
from .runtime.launch import launch
from .runtime.packing import _array_values, _check_argument, _dims, _header, _signature, _zero_values
from .runtime.tape import Tape, outside_tapes
from .types import float32

__all__ = ["jacobian", "jacobian_fd", "gradcheck", "gradcheck_tape", "jacobian_plot", "loop_tape_words"]

# Central differences: a step near cbrt(machine eps) balances rounding and truncation error; for
# float32 that is 2**-10, for float64 about 6e-6 (1e-6 here: the error is flat around the optimum).
_EPS_FLOAT32 = 2.0 ** -10
_EPS_FLOAT64 = 1e-6


@dataclass
class _Var:
    """One differentiable input or output: its name, its position (for masks given by index)."""
    name: str
    index: int
    array: array

    @property
    def scalars(self) -> int:
        return int(self.array.numpy().size)


class _Problem:
    """Something to differentiate: runs it, and names its differentiable inputs and outputs."""

    label: str
    inputs: list[_Var]
    outputs: list[_Var]

    def run(self) -> None:
        """Run once (forward). Under a recording Tape the run is recorded on it."""
        raise NotImplementedError

    def reset(self) -> None:
        """Put every written array back to its value on entry (no version bumps)."""
        for arr, values in self._baseline:
            arr._write_host(values)

    def outputs_now(self) -> list[np.ndarray]:
        return [np.array(v.array.numpy(), dtype=np.float64).ravel() for v in self.outputs]


class _KernelProblem(_Problem):
    def __init__(self, kernel: Kernel, dim, args, device):
        if dim is None:
            raise ValueError(f"kernel '{kernel.__name__}': give dim, the launch dimension")
        self.kernel, self.dim, self.device = kernel, dim, device
        self.label = f"kernel '{kernel.__name__}'"
        params = kernel.params
        if len(args) != len(params):
            names = ", ".join(p.name for p in params)
            raise ValueError(f"{self.label} takes {len(params)} argument(s) ({names}), got {len(args)} in "
                             "inputs + outputs")
        copies: dict[int, array] = {}
        with outside_tapes():
            self.args = [copies.setdefault(id(a), clone(a)) if isinstance(a, array) else a for a in args]
        uses = kernel.compiled().uses
        self.inputs, self.outputs, self._baseline = [], [], []
        for i, (p, a) in enumerate(zip(params, self.args)):
            use = uses.get(p.name)
            if use is None:
                continue
            if use.stores or use.accumulates:
                self._baseline.append((a, a.numpy().copy()))
            if not (a.requires_grad and a.dtype.is_float):
                continue
            # A kernel that reads back only what it stored (a write-once history) has no input there.
            if use.reads and not (use.stores and use.overwrites_read is None):
                self.inputs.append(_Var(p.name, i, a))
            if use.stores or use.accumulates:
                self.outputs.append(_Var(p.name, i, a))

    def run(self) -> None:
        launch(self.kernel, self.dim, inputs=self.args, device=self.device)


class _FunctionProblem(_Problem):
    def __init__(self, function: Callable, inputs, outputs):
        self.function = function
        self.inputs_list = list(inputs or [])
        self.label = f"function '{getattr(function, '__name__', 'function')}'"
        self.inputs = [_Var(_parameter_name(function, i), i, a) for i, a in enumerate(self.inputs_list)
                       if isinstance(a, array) and a.requires_grad and a.dtype.is_float]
        self.given = None if outputs is None else list(outputs)
        self._baseline = [(a, a.numpy().copy()) for a in self.given or () if isinstance(a, array)]
        self.outputs = []
        if self.given is not None:
            self._set_outputs(self.given)

    def _set_outputs(self, arrays) -> None:
        self.outputs = [_Var(f"output_{j}", j, a) for j, a in enumerate(arrays)
                        if isinstance(a, array) and a.requires_grad and a.dtype.is_float]

    def run(self) -> None:
        result = self.function(*self.inputs_list)
        if self.given is None:
            if isinstance(result, array):
                result = [result]
            if not isinstance(result, (list, tuple)) or not all(isinstance(r, array) for r in result):
                raise TypeError(f"{self.label} returned {type(result).__name__}; without outputs=[...] it must "
                                "return its output array(s)")
            self._set_outputs(result)


def _parameter_name(function, i: int) -> str:
    """The name of `function`'s i-th positional parameter (``args[k]`` for ``*args``), else ``input_i``."""
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return f"input_{i}"
    for k, p in enumerate(params):
        if p.kind == p.VAR_POSITIONAL:
            return f"{p.name}[{i - k}]"
        if k == i and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return p.name
    return f"input_{i}"


def _problem(function, dim, inputs, outputs, device) -> _Problem:
    if isinstance(function, Kernel):
        return _KernelProblem(function, dim, list(inputs or []) + list(outputs or []), device)
    if callable(function):
        return _FunctionProblem(function, inputs, outputs)
    raise TypeError(f"expected a @kernel or a Python function, got {type(function).__name__}")


def _selected_pairs(problem: _Problem, mask) -> list[tuple[_Var, _Var]]:
    """The (input, output) pairs to evaluate; `mask` entries are names or indices."""
    pairs = [(i, o) for o in problem.outputs for i in problem.inputs]
    if mask is None:
        return pairs

    def matches(var: _Var, key, kind: str, pool: list[_Var]) -> bool:
        if not any(key == v.name or key == v.index for v in pool):
            names = ", ".join(repr(v.name) for v in pool) or "none"
            raise ValueError(f"input_output_mask: {problem.label} has no differentiable {kind} {key!r} "
                             f"(differentiable {kind}s: {names})")
        return key == var.name or key == var.index

    wanted = [(i, o) for i, o in pairs if any(matches(i, ki, "input", problem.inputs)
                                              and matches(o, ko, "output", problem.outputs) for ki, ko in mask)]
    return wanted


def _require_pairs(problem: _Problem, pairs) -> None:
    if not pairs:
        raise ValueError(f"{problem.label} has no differentiable input/output pair to evaluate: inputs and "
                         "outputs must be float arrays created with requires_grad=True (and match "
                         "input_output_mask, if given)")


# -- Jacobians ---------------------------------------------------------------------------------------
def _jacobian_ad(problem: _Problem, mask, max_outputs_per_var: int):
    """Record one run on a private Tape, then one backward per output scalar. Returns the Jacobians
    and the selected pairs (known only after the run for a function that returns its outputs)."""
    tape = Tape()
    with tape:
        problem.run()
    pairs = _selected_pairs(problem, mask)
    _require_pairs(problem, pairs)
    saved = [(a, a.grad.numpy().copy()) for a in tape.gradients]
    tape.zero()
    result = {}
    try:
        for out in problem.outputs:
            ins = [i for i, o in pairs if o is out]
            if not ins:
                continue
            rows = out.scalars if max_outputs_per_var <= 0 else min(out.scalars, max_outputs_per_var)
            for i in ins:
                result[(i.name, out.name)] = np.full((out.scalars, i.scalars), np.nan)
            seed = np.zeros(out.array.numpy().shape, np.float64)
            for r in range(rows):
                seed.flat[r] = 1.0
                tape.backward(grads={out.array: seed})
                seed.flat[r] = 0.0
                for i in ins:
                    result[(i.name, out.name)][r] = np.asarray(i.array.grad.numpy(), np.float64).ravel()
                tape.zero()
    finally:
        for a, values in saved:
            a.grad._write_host(values)
    return result, pairs


def _step(x: float, dtype, eps: float | None) -> float:
    if eps is None:             # by dtype (see _EPS_FLOAT64)
        eps = _EPS_FLOAT32 if dtype.scalar == float32 else _EPS_FLOAT64
    if dtype.scalar == float32:
        eps = max(eps, _EPS_FLOAT32)
    return eps * max(1.0, abs(x))


def _jacobian_fd(problem: _Problem, pairs, eps: float, max_inputs_per_var: int) -> dict:
    wanted = {(i.name, o.name) for i, o in pairs}
    result = {}
    with outside_tapes():
        for inp in problem.inputs:
            outs = [o for o in problem.outputs if (inp.name, o.name) in wanted]
            if not outs:
                continue
            for o in outs:
                result[(inp.name, o.name)] = np.full((o.scalars, inp.scalars), np.nan)
            host = inp.array.numpy()              # a view on the CPU, a copy of a GPU array
            x = host.reshape(-1)
            if not np.shares_memory(x, host):
                raise ValueError(f"{problem.label}: input '{inp.name}' is not contiguous; finite differences "
                                 "need to perturb it in place")
            put = (lambda: None) if inp.array.device == "cpu" else (lambda a=inp.array, h=host: a._write_host(h))
            cols = inp.scalars if max_inputs_per_var <= 0 else min(inp.scalars, max_inputs_per_var)
            for c in range(cols):
                original = x[c].copy()
                h = _step(float(original), inp.array.dtype, eps)
                values = []
                for sign in (1.0, -1.0):
                    problem.reset()                       # first: an input may also be an output
                    x[c] = original + sign * h
                    put()
                    values.append(float(x[c]))            # the value actually stored (float32 rounds)
                    problem.run()
                    values.append(problem.outputs_now())
                    x[c] = original
                    put()
                (x_plus, f_plus, x_minus, f_minus) = values
                order = [o.name for o in problem.outputs]
                for o in outs:
                    k = order.index(o.name)
                    result[(inp.name, o.name)][:, c] = (f_plus[k] - f_minus[k]) / (x_plus - x_minus)
        problem.reset()
        problem.run()                                     # leave the outputs holding f(x)
    return result


def jacobian(function, dim=None, inputs=None, outputs=None, input_output_mask=None, max_outputs_per_var: int = -1,
             device=None, plot_jacobians: bool = False) -> dict[tuple[str, str], np.ndarray]:
    """Jacobians by reverse mode: one ``tape.backward`` per output scalar, gradients zeroed between.

    Returns ``{(input_name, output_name): J}`` with J of shape (output scalars, input scalars) in
    float64; rows beyond `max_outputs_per_var` (if > 0) are NaN. `input_output_mask` is a list of
    ``(input, output)`` names (or indices: of the kernel's parameters, or of the function's
    inputs/outputs lists) to restrict the pairs. Example::

        J = jacobian(square, 3, inputs=[x], outputs=[y])[("x", "y")]     # diag(2 x)
    """
    problem = _problem(function, dim, inputs, outputs, device)
    result, _ = _jacobian_ad(problem, input_output_mask, max_outputs_per_var)
    if plot_jacobians:
        jacobian_plot(result, title=f"{problem.label}: Jacobians (autodiff)", show=True)
    return result


def jacobian_fd(function, dim=None, inputs=None, outputs=None, input_output_mask=None, max_inputs_per_var: int = -1,
                eps: float | None = None, device=None, plot_jacobians: bool = False) -> dict[tuple[str, str], np.ndarray]:
    """Jacobians by central finite differences, ``(f(x + h) - f(x - h)) / (2 h)``, in float64.

    The step is ``eps * max(1, |x|)`` per input scalar; `eps` defaults by dtype (float64: 1e-6,
    float32: 2**-10). float64 inputs are perturbed and evaluated
    in float64; float32 inputs in float32 with a step of at least 2**-10 (a smaller one drowns in
    rounding), and the difference quotient divides by the perturbation actually stored. Columns
    beyond `max_inputs_per_var` (if > 0) are NaN. Same keys and mask as `jacobian`.
    """
    problem = _problem(function, dim, inputs, outputs, device)
    if not problem.outputs:
        with outside_tapes():
            problem.run()
    pairs = _selected_pairs(problem, input_output_mask)
    _require_pairs(problem, pairs)
    result = _jacobian_fd(problem, pairs, eps, max_inputs_per_var)
    if plot_jacobians:
        jacobian_plot(result, title=f"{problem.label}: Jacobians (finite differences)", show=True)
    return result


# -- checks ------------------------------------------------------------------------------------------
@dataclass
class _PairResult:
    input: str
    output: str
    max_abs: float
    max_rel: float
    passed: bool
    has_nan: bool
    worst: str


def _compare(key, ad: np.ndarray, fd: np.ndarray, rows: int, cols: int, atol: float, rtol: float) -> _PairResult:
    a, f = ad[:rows, :cols], fd[:rows, :cols]
    has_nan = bool(np.isnan(a).any())
    err = np.abs(a - f)
    rel = err / (np.abs(f) + 1e-8)
    passed = bool(np.allclose(a, f, atol=atol, rtol=rtol)) and not has_nan
    worst = ""
    if a.size:
        excess = np.where(np.isnan(err), np.inf, err - rtol * np.abs(f))
        r, c = np.unravel_index(int(np.argmax(excess)), excess.shape)
        worst = f"output scalar {r}, input scalar {c}: autodiff {a[r, c]:.7g}, finite differences {f[r, c]:.7g}"
    return _PairResult(key[0], key[1], float(np.nanmax(err)) if err.size else 0.0,
                       float(np.nanmax(rel)) if rel.size else 0.0, passed, has_nan, worst)


def _print_summary(label: str, results: list[_PairResult]) -> None:
    header = ["Input", "Output", "Max Abs Error", "Max Rel Error", "Pass"]
    rows = [[r.input, r.output, f"{r.max_abs:.7e}", f"{r.max_rel:.7e}",
             "NaN" if r.has_nan else ("PASS" if r.passed else "FAIL")] for r in results]
    widths = [max(len(h), *(len(row[k]) for row in rows)) for k, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    verdict = "passed" if all(r.passed for r in results) else "FAILED"
    print(f"Gradient check for {label} {verdict}")


def gradcheck(function, dim=None, inputs=None, outputs=None, *, eps: float | None = None, atol: float = 1e-3,
              rtol: float = 1e-2, raise_exception: bool = True, input_output_mask=None, device=None,
              max_inputs_per_var: int = -1, max_outputs_per_var: int = -1, plot_relative_error: bool = False,
              plot_absolute_error: bool = False, show_summary: bool = True) -> bool:
    """Compare the autodiff Jacobian (`jacobian`) with central finite differences (`jacobian_fd`).

    A pair passes when ``|ad - fd| <= atol + rtol * |fd|`` everywhere and the autodiff Jacobian has no
    NaN; only the first `max_outputs_per_var` rows and `max_inputs_per_var` columns are compared when
    those are > 0. Prints a table per input/output pair (`show_summary`) and returns True if all
    pass; otherwise raises ValueError naming the pair and its worst element (`raise_exception`) or
    returns False. The step `eps` defaults by dtype (see `jacobian_fd`): float64 checks can use
    tolerances near 1e-9. Example::

        assert gradcheck(my_kernel, n, inputs=[a, b], outputs=[out], raise_exception=False)
    """
    problem = _problem(function, dim, inputs, outputs, device)
    ad, pairs = _jacobian_ad(problem, input_output_mask, max_outputs_per_var)
    fd = _jacobian_fd(problem, pairs, eps, max_inputs_per_var)
    results, errors_abs, errors_rel = [], {}, {}
    for i, o in pairs:
        key = (i.name, o.name)
        rows = o.scalars if max_outputs_per_var <= 0 else min(o.scalars, max_outputs_per_var)
        cols = i.scalars if max_inputs_per_var <= 0 else min(i.scalars, max_inputs_per_var)
        results.append(_compare(key, ad[key], fd[key], rows, cols, atol, rtol))
        errors_abs[key] = np.abs(ad[key] - fd[key])
        errors_rel[key] = errors_abs[key] / (np.abs(fd[key]) + 1e-8)
    if show_summary:
        _print_summary(problem.label, results)
    if plot_relative_error:
        jacobian_plot(errors_rel, title=f"{problem.label}: relative error of the Jacobians", show=True)
    if plot_absolute_error:
        jacobian_plot(errors_abs, title=f"{problem.label}: absolute error of the Jacobians", show=True)
    failed = [r for r in results if not r.passed]
    if failed and raise_exception:
        r = failed[0]
        why = "its autodiff gradient contains NaN" if r.has_nan else "autodiff and finite differences disagree"
        raise ValueError(f"Gradient check failed for {problem.label}, input '{r.input}', output '{r.output}': {why} "
                         f"(max abs error {r.max_abs:.3e}, max rel error {r.max_rel:.3e}; worst at {r.worst}; "
                         f"atol={atol}, rtol={rtol})")
    return not failed


def gradcheck_tape(tape: Tape, eps: float | None = None, atol: float = 1e-3, rtol: float = 1e-2, *,
                   raise_exception: bool = True, input_output_masks: dict | None = None, blacklist_kernels=None,
                   whitelist_kernels=None, max_inputs_per_var: int = -1, max_outputs_per_var: int = -1,
                   plot_relative_error: bool = False, plot_absolute_error: bool = False,
                   show_summary: bool = True) -> bool:
    """`gradcheck` every kernel launch recorded on `tape`, each re-launched on its own, on copies of
    its arguments as they are now: the tape, its arrays and their gradients are left untouched.

    Recorded copies and ``record_func`` operations have no kernel to re-launch and are skipped.
    `input_output_masks` maps kernel names to masks; `whitelist_kernels` / `blacklist_kernels`
    (kernel names) choose what to check. Launches with no differentiable input/output pair are
    skipped. Returns True if every checked launch passes.
    """
    masks = input_output_masks or {}
    allow = set(whitelist_kernels or ())
    deny = set(blacklist_kernels or ())
    passed = True
    for op in tape.ops:
        recorded = getattr(op, "launch", None)
        if recorded is None:
            continue
        kernel, dim, args, device = recorded[:4]
        name = kernel.__name__
        if (allow and name not in allow) or name in deny:
            continue
        problem = _KernelProblem(kernel, dim, list(args), device)
        if not _selected_pairs(problem, masks.get(name)):
            continue
        if show_summary and op.where:
            print(f"{op.name} at {op.where}:")
        ok = gradcheck(kernel, dim, list(args), eps=eps, atol=atol, rtol=rtol, raise_exception=raise_exception,
                       input_output_mask=masks.get(name), device=device, max_inputs_per_var=max_inputs_per_var,
                       max_outputs_per_var=max_outputs_per_var, plot_relative_error=plot_relative_error,
                       plot_absolute_error=plot_absolute_error, show_summary=show_summary)
        passed = passed and ok
    return passed


# -- plots -------------------------------------------------------------------------------------------
def jacobian_plot(jacobians: dict, *, title: str | None = None, filename=None, show: bool = False,
                  colormap: str = "coolwarm", log_scale: bool = False):
    """Draw Jacobians (as returned by `jacobian` / `jacobian_fd`) in a grid: one column per input, one
    row per output. Returns the matplotlib Figure, saved to `filename` if given and shown with pyplot
    if `show`; without matplotlib installed it warns and returns None."""
    try:
        from matplotlib.colors import SymLogNorm
        from matplotlib.figure import Figure
    except ImportError:
        warnings.warn("jacobian_plot needs matplotlib (pip install matplotlib); nothing was plotted", stacklevel=2)
        return None
    ins = list(dict.fromkeys(k[0] for k in jacobians))
    outs = list(dict.fromkeys(k[1] for k in jacobians))
    if show:
        import matplotlib.pyplot as plt
        fig = plt.figure(figsize=(3 * max(1, len(ins)) + 1, 3 * max(1, len(outs))))
    else:
        fig = Figure(figsize=(3 * max(1, len(ins)) + 1, 3 * max(1, len(outs))))
    if title:
        fig.suptitle(title)
    for (name_in, name_out), jac in jacobians.items():
        ax = fig.add_subplot(len(outs), len(ins), outs.index(name_out) * len(ins) + ins.index(name_in) + 1)
        norm = SymLogNorm(linthresh=1e-6) if log_scale else None
        image = ax.imshow(np.asarray(jac, np.float64), cmap=colormap, norm=norm, interpolation="nearest",
                          aspect="auto")
        ax.set_xlabel(name_in)
        ax.set_ylabel(name_out)
        fig.colorbar(image, ax=ax)
    fig.tight_layout()
    if filename is not None:
        fig.savefig(filename)
    if show:
        import matplotlib.pyplot as plt
        plt.show()
    return fig


# -- loop tape ---------------------------------------------------------------------------------------
def loop_tape_words(kernel: Kernel, dim, inputs=(), outputs=()) -> np.ndarray:
    """Per thread, the 8-byte words the adjoint of this launch keeps on its loop tape: what the counting
    pass measures before ``tape.backward`` allocates ``max(words) * threads`` of them. Each iteration of
    a dynamic loop saves the carried values its reverse sweep needs (one word per scalar, more for
    vectors); all zero when no loop carries such a value (``kernel.compiled().needs_tape`` False).
    The arguments are packed as `launch` packs them (runtime/packing.py)."""
    compiled = kernel.compiled()
    sig = _signature(kernel)
    args = list(inputs) + list(outputs)
    if len(args) != len(sig.params):
        raise ValueError(f"kernel '{kernel.__name__}' takes {len(sig.params)} argument(s), got {len(args)}")
    dims = _dims(kernel, dim, sig.tid_ndim)
    n = int(np.prod(dims))
    counts = np.zeros(n, np.int64)
    if not compiled.needs_tape or n == 0:
        return counts
    # The counting pass is the CPU build's: it runs on host copies of GPU arrays (their pointers are
    # not host memory; reading them from the CPU crashed the process on the first GPU run).
    args = [clone(a, device="cpu", requires_grad=False) if isinstance(a, array) and a.device != "cpu" else a
            for a in args]
    values = _header(dims)
    adjoint_values = [0] * len(values)
    for p, a in zip(sig.params, args):
        values += _check_argument(kernel, p, a, "cpu")
        adjoint_values += (_array_values(None, like=a) if isinstance(a, array)
                           else _zero_values(p.type))
    fn = kernel.entry(False).function(compiled.adjoint.name, adjoint=True)
    fn(sig.packer.pack(*values), sig.packer.pack(*adjoint_values), None, 0, 1, counts.ctypes.data, 0)
    return counts
