"""stepper.torch: a rollout as a differentiable PyTorch function, and PyTorch code inside a step.

Specification: ``backward()`` through `stepper.torch.function` gives `Model.gradient`'s bits
(float64) in the ``.grad`` of plain tensors and ``nn.Module`` parameters, and torch.optim drives it;
a network applied inside the step by `stepper.torch.call` gets weight gradients that match float64
finite differences, and checkpointed reversals give store-all's bits; bad input is refused naming
the culprit. Runs where PyTorch is installed (its wheels are large; it is not in the test extra).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'stepper[torch]')")

import stepper as sp  # noqa: E402
import stepper.torch  # noqa: E402,F401

from interop_models import WEIGHTS, forced_diffusion, learned_model, squared_norm, u0  # noqa: E402
from stepper_models import chain_initial, chain_model, sum_squares64, weighted_sum64  # noqa: E402

STEPS = 40


def final_x_squared(state):
    out = sp.zeros(1, dtype=sp.float64)
    sp.launch(sum_squares64, state.x.shape[0], inputs=[state.x], outputs=[out])
    return out


def kinetic(s):
    out = s.scratch("kinetic", 1, sp.float64)
    sp.launch(sum_squares64, s.next.v.shape[0], inputs=[s.next.v], outputs=[out])
    return out


def tensor(a, grad=False):
    return torch.tensor(a.numpy(), dtype=torch.float64, requires_grad=grad)


def net(u, w1, b1, w2, b2):
    return torch.tanh(u[:, None] * w1 + b1) @ w2 + b2[0]


class Chain(torch.nn.Module):
    """The chain model's parameters as a module's: what an optimiser steps."""

    def __init__(self, model):
        super().__init__()
        self.k = torch.nn.Parameter(tensor(model.params.k))
        self.c = torch.nn.Parameter(tensor(model.params.c))


def test_backward_is_model_gradient_bit_for_bit_into_tensors_and_module_parameters():
    model, init = chain_model(), chain_initial()
    ref = model.gradient(init, STEPS, loss=final_x_squared, running_loss=kinetic, schedule=sp.Revolve(STEPS, 4))
    f = sp.torch.function(model, STEPS, inputs=["x", "v", "k", "c"], loss=final_x_squared, running_loss=kinetic,
                          schedule=lambda n: sp.Revolve(n, 4))
    x, v, module = tensor(init["x"], True), tensor(init["v"]), Chain(model)
    value = f(x=x, v=v, k=module.k, c=module.c)
    assert value.dtype == torch.float64 and value.item() == ref.loss
    value.backward()
    np.testing.assert_array_equal(x.grad.numpy(), ref.grads["x"].numpy())
    assert v.grad is None                                  # it did not ask for one
    np.testing.assert_array_equal(module.k.grad.numpy(), ref.grads["k"].numpy())
    np.testing.assert_array_equal(module.c.grad.numpy(), ref.grads["c"].numpy())
    with torch.no_grad():                                  # no gradient wanted: Model.evaluate
        assert f(x=x, v=v, k=module.k, c=module.c).item() == ref.loss


def test_backward_of_the_final_state_is_the_gradient_of_the_weighted_sum():
    model, init = chain_model(), chain_initial()
    w = np.random.default_rng(1).standard_normal(16)
    weights = sp.array(w, dtype=sp.float64)

    def weighted(state):
        out = sp.zeros(1, dtype=sp.float64)
        sp.launch(weighted_sum64, 16, inputs=[state.x, weights], outputs=[out])
        return out

    ref = model.gradient(init, STEPS, loss=weighted)
    f = sp.torch.function(model, STEPS, inputs=["x", "k"], initial={"v": init["v"]})
    x, k = tensor(init["x"], True), tensor(model.params.k, True)
    final = f(x=x, k=k)
    np.testing.assert_array_equal(final["x"].detach().numpy(), ref.final["x"].numpy())
    (final["x"] * torch.from_numpy(w)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), ref.grads["x"].numpy())
    np.testing.assert_array_equal(k.grad.numpy(), ref.grads["k"].numpy())


def test_torch_optim_drives_the_parameters_down_the_gradient():
    model, init = chain_model(), chain_initial()
    f = sp.torch.function(model, STEPS, inputs=["k", "c"], loss=final_x_squared, initial=init)
    module = Chain(model)
    optimiser = torch.optim.SGD(module.parameters(), lr=1e-4)
    losses = []
    for _ in range(4):
        optimiser.zero_grad()
        value = f(k=module.k, c=module.c)
        value.backward()
        optimiser.step()
        losses.append(value.item())
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0]
    np.testing.assert_array_equal(model.params.k.numpy(), [4.0, 0.5])     # the model kept its own values


def _set(p, values):
    p.assign(np.asarray(values, dtype=np.float64))


def test_network_weight_gradients_match_finite_differences():
    model, init = learned_model(sp.torch.call, net), {"u": u0()}
    result = model.gradient(init, STEPS, loss=squared_norm, schedule=sp.Revolve(STEPS, 3))
    rng = np.random.default_rng(7)
    for name in WEIGHTS:
        base = model.params[name].numpy().copy()
        d = rng.standard_normal(base.shape)
        h = 1e-6
        values = []
        for sign in (1, -1):
            _set(model.params[name], base + sign * h * d)
            values.append(model.evaluate(init, STEPS, squared_norm))
        _set(model.params[name], base)
        fd = (values[0] - values[1]) / (2 * h)
        assert result.grads[name].numpy() @ d == pytest.approx(fd, rel=1e-6), name


def test_checkpointed_reversal_of_network_steps_gives_store_all_bits_and_the_torch_function_agrees():
    model, init = learned_model(sp.torch.call, net), {"u": u0()}
    revolve = model.gradient(init, STEPS, loss=squared_norm, schedule=sp.Revolve(STEPS, 3))
    store_all = model.gradient(init, STEPS, loss=squared_norm, schedule=sp.StoreAll(STEPS))
    assert revolve.stats.forward_steps > 2 * STEPS
    for name in ("u", *WEIGHTS):
        np.testing.assert_array_equal(revolve.grads[name].numpy(), store_all.grads[name].numpy(), err_msg=name)
    f = sp.torch.function(model, STEPS, inputs=["u", *WEIGHTS], loss=squared_norm)
    args = {n: tensor(init["u"] if n == "u" else model.params[n], True) for n in ("u", *WEIGHTS)}
    f(**args).backward()
    for name in ("u", *WEIGHTS):
        np.testing.assert_array_equal(args[name].grad.numpy(), store_all.grads[name].numpy(), err_msg=name)


def test_a_module_inside_the_step_through_functional_call():
    layer = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    names = [n for n, _ in layer.named_parameters()]

    def module_net(u, *weights):
        return torch.func.functional_call(layer, dict(zip(names, weights)), (u[:, None],))[:, 0]

    model = sp.Model(dt=0.01)
    model.state("u", 12, sp.float64)
    for i, (n, p) in enumerate(layer.named_parameters()):
        model.param(f"p{i}", sp.array(p.detach().numpy(), dtype=sp.float64))

    @model.step
    def step(s):
        f = s.scratch("forcing", 12, sp.float64)
        sp.torch.call(module_net, inputs=[s.prev.u, *(s.params[f"p{i}"] for i in range(len(names)))], outputs=[f])
        sp.launch(forced_diffusion, 12, inputs=[s.prev.u, f, 0.2, s.dt],
                  outputs=[s.next.u])

    f = sp.torch.function(model, 30, inputs=[f"p{i}" for i in range(len(names))], loss=squared_norm,
                          initial={"u": u0()})
    f(**{f"p{i}": p for i, p in enumerate(layer.parameters())}).backward()
    ref = model.gradient({"u": u0()}, 30, loss=squared_norm)
    for i, p in enumerate(layer.parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), ref.grads[f"p{i}"].numpy())


def test_bad_inputs_are_refused_naming_the_culprit():
    model, init = chain_model(), chain_initial()
    f = sp.torch.function(model, STEPS, inputs=["x", "k"], loss=final_x_squared, initial={"v": init["v"]})
    x, k = tensor(init["x"]), tensor(model.params.k)
    with pytest.raises(sp.ModelError, match=r"x= must be float64 of shape \(16,\).*got float64 of shape \(15,\)"):
        f(x=x[:15], k=k)
    with pytest.raises(sp.ModelError, match=r"k= must be float64 of shape \(2,\).*got float32"):
        f(x=x, k=k.float())
    with pytest.raises(sp.ModelError, match=r"k= must be float64 .*got torch.bfloat16"):
        f(x=x, k=k.bfloat16())
    with pytest.raises(sp.ModelError, match=r"k= is on meta but the model runs on 'cpu'; move it with .to\('cpu'\)"):
        f(x=x, k=torch.empty(2, dtype=torch.float64, device="meta"))
    with pytest.raises(sp.ModelError, match=r"missing 'k'"):
        f(x=x)
    with pytest.raises(sp.ModelError, match=r"'c' not in inputs"):
        f(x=x, k=k, c=torch.ones(1, dtype=torch.float64))
    with pytest.raises(sp.ModelError, match=r"k= must be a torch.Tensor, got ndarray"):
        f(x=x, k=np.ones(2))


def test_a_torch_function_that_cannot_be_differentiated_is_named():
    def detached(u, w1, b1, w2, b2):
        return (torch.tanh(u[:, None] * w1 + b1) @ w2).detach()

    model = learned_model(sp.torch.call, detached)
    model.rollout({"u": u0()}, 5)                              # forward runs are fine
    with pytest.raises(sp.ModelError, match=r"stepper.torch.call\(detached\) \(interop_models.py:\d+\): PyTorch "
                                            r"cannot differentiate it"):
        model.gradient({"u": u0()}, 5, loss=squared_norm)


def test_a_torch_function_returning_the_wrong_dtype_is_named():
    model = learned_model(sp.torch.call, lambda u, w1, b1, w2, b2: (u * w1[0]).float())
    with pytest.raises(sp.ModelError, match=r"returned float32 of shape \(12,\) for outputs\[0\], which is float64"):
        model.rollout({"u": u0()}, 3)
