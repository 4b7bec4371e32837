"""stepper.jax: a rollout as a differentiable JAX function, and JAX code inside a step.

Specification: jax.grad / jax.vjp through `stepper.jax.function` give `Model.gradient`'s bits
(float64), eagerly and under jax.jit and jax.vmap; a network applied inside the step by
`stepper.jax.call` gets weight gradients that match float64 finite differences, and checkpointed
reversals of such steps give store-all's bits; bad input is refused naming the culprit.
"""
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="stepper.jax needs JAX (pip install 'stepper[jax]')")
import jax.numpy as jnp  # noqa: E402

import stepper as sp  # noqa: E402
import stepper.jax  # noqa: E402,F401

from interop_models import WEIGHTS, learned_model, squared_norm, u0  # noqa: E402
from stepper_models import chain_initial, chain_model, sum_squares64, weighted_sum64  # noqa: E402

jax.config.update("jax_enable_x64", True)
STEPS = 40


def final_x_squared(state):
    out = sp.zeros(1, dtype=sp.float64, device=state.x.device)
    sp.launch(sum_squares64, state.x.shape[0], inputs=[state.x], outputs=[out])
    return out


def kinetic(s):
    out = s.scratch("kinetic", 1, sp.float64)
    sp.launch(sum_squares64, s.next.v.shape[0], inputs=[s.next.v], outputs=[out])
    return out


def jnp_of(a):
    return jnp.asarray(a.numpy())


def net(u, w1, b1, w2, b2):
    return jnp.tanh(u[:, None] * w1 + b1) @ w2 + b2[0]


@pytest.fixture
def chain(device):
    model = chain_model(device=device)
    return model, chain_initial(device=device)


def test_grad_is_model_gradient_bit_for_bit_eagerly_and_under_jit(chain):
    model, init = chain
    ref = model.gradient(init, STEPS, loss=final_x_squared, running_loss=kinetic, schedule=sp.Revolve(STEPS, 4))
    f = sp.jax.function(model, STEPS, inputs=["x", "v", "k", "c"], loss=final_x_squared, running_loss=kinetic,
                        schedule=lambda n: sp.Revolve(n, 4))
    args = (jnp_of(init["x"]), jnp_of(init["v"]), jnp_of(model.params.k), jnp_of(model.params.c))
    g = jax.value_and_grad(lambda x, v, k, c: f(x=x, v=v, k=k, c=c), argnums=(0, 1, 2, 3))
    for value, grads in (g(*args), jax.jit(g)(*args)):
        assert value.dtype == jnp.float64 and float(value) == ref.loss
        for name, grad in zip("xvkc", grads):
            np.testing.assert_array_equal(np.asarray(grad), ref.grads[name].numpy(), err_msg=name)
    assert float(f(x=args[0], v=args[1], k=args[2], c=args[3])) == ref.loss     # no gradient: Model.evaluate


def test_vjp_of_the_final_state_is_the_gradient_of_the_weighted_sum(chain):
    model, init = chain
    w = np.random.default_rng(1).standard_normal(16)
    weights = sp.array(w, dtype=sp.float64, device=model.device)

    def weighted(state):
        out = sp.zeros(1, dtype=sp.float64, device=model.device)
        sp.launch(weighted_sum64, 16, inputs=[state.x, weights], outputs=[out])
        return out

    ref = model.gradient(init, STEPS, loss=weighted)
    f = sp.jax.function(model, STEPS, inputs=["x", "k"], initial={"v": init["v"]})
    final, pull = jax.vjp(lambda x, k: f(x=x, k=k), jnp_of(init["x"]), jnp_of(model.params.k))
    np.testing.assert_array_equal(np.asarray(final["x"]), ref.final["x"].numpy())
    np.testing.assert_array_equal(np.asarray(final["v"]), ref.final["v"].numpy())
    gx, gk = pull({"x": jnp.asarray(w), "v": jnp.zeros(16)})
    np.testing.assert_array_equal(np.asarray(gx), ref.grads["x"].numpy())
    np.testing.assert_array_equal(np.asarray(gk), ref.grads["k"].numpy())
    jitted = jax.jit(lambda x, k: jax.grad(lambda x, k: f(x=x, k=k)["x"] @ jnp.asarray(w), argnums=(0, 1))(x, k))
    for ours, name in zip(jitted(jnp_of(init["x"]), jnp_of(model.params.k)), "xk"):
        np.testing.assert_array_equal(np.asarray(ours), ref.grads[name].numpy())


def test_vmap_runs_one_rollout_per_batch_member(chain):
    model, init = chain
    f = sp.jax.function(model, STEPS, inputs=["x", "v"], loss=final_x_squared)
    x0, v0 = jnp_of(init["x"]), jnp_of(init["v"])
    xs = jnp.stack([x0, x0 + 0.25, x0 - 0.5])
    values = jax.vmap(lambda x: f(x=x, v=v0))(xs)
    grads = jax.jit(jax.vmap(jax.grad(lambda x: f(x=x, v=v0))))(xs)
    for b in range(3):
        one = {"x": sp.array(np.asarray(xs[b]), dtype=sp.float64, device=model.device), "v": init["v"]}
        ref = model.gradient(one, STEPS, loss=final_x_squared)
        assert float(values[b]) == ref.loss
        np.testing.assert_array_equal(np.asarray(grads[b]), ref.grads["x"].numpy())


def test_parameters_given_as_inputs_leave_the_model_as_it_was(chain):
    model, init = chain
    k_before = model.params.k.numpy().copy()
    f = sp.jax.function(model, STEPS, inputs=["k"], loss=final_x_squared, initial=init)
    value = f(k=jnp.asarray([5.0, 0.25]))
    np.testing.assert_array_equal(model.params.k.numpy(), k_before)
    model.params.k.assign(np.array([5.0, 0.25]))
    assert float(value) == model.evaluate(init, STEPS, final_x_squared)


# -- a network inside the step ---------------------------------------------------------------------
@pytest.fixture
def learned(device):
    return learned_model(sp.jax.call, net, device=device)


def _set(p, values):
    p.assign(np.asarray(values, dtype=np.float64))


def test_network_weight_gradients_match_finite_differences(learned):
    model, init = learned, {"u": u0(device=learned.device)}
    result = model.gradient(init, STEPS, loss=squared_norm, schedule=sp.Revolve(STEPS, 3))
    rng = np.random.default_rng(7)
    for name in (*WEIGHTS, "u"):
        base = (init["u"] if name == "u" else model.params[name]).numpy().copy()
        d = rng.standard_normal(base.shape)
        h = 1e-6
        values = []
        for sign in (1, -1):
            if name == "u":
                values.append(model.evaluate({"u": sp.array(base + sign * h * d, dtype=sp.float64,
                                                             device=model.device)}, STEPS, squared_norm))
            else:
                _set(model.params[name], base + sign * h * d)
                values.append(model.evaluate(init, STEPS, squared_norm))
        if name != "u":
            _set(model.params[name], base)
        fd = (values[0] - values[1]) / (2 * h)
        assert result.grads[name].numpy() @ d == pytest.approx(fd, rel=1e-6), name


def test_checkpointed_reversal_of_network_steps_gives_store_all_bits(learned):
    model, init = learned, {"u": u0(device=learned.device)}
    revolve = model.gradient(init, STEPS, loss=squared_norm, schedule=sp.Revolve(STEPS, 3))
    store_all = model.gradient(init, STEPS, loss=squared_norm, schedule=sp.StoreAll(STEPS))
    assert revolve.stats.forward_steps > 2 * STEPS            # the network ran again in recomputations
    assert revolve.loss == store_all.loss
    for name in ("u", *WEIGHTS):
        np.testing.assert_array_equal(revolve.grads[name].numpy(), store_all.grads[name].numpy(), err_msg=name)
    np.testing.assert_array_equal(model.rollout(init, STEPS).u.numpy(), revolve.final["u"].numpy())


def test_jax_function_of_a_model_that_calls_jax_is_its_gradient(learned):
    model, init = learned, {"u": u0(device=learned.device)}
    ref = model.gradient(init, STEPS, loss=squared_norm)
    f = sp.jax.function(model, STEPS, inputs=["u", *WEIGHTS], loss=squared_norm)
    args = {n: jnp_of(init["u"] if n == "u" else model.params[n]) for n in ("u", *WEIGHTS)}
    value, grads = jax.value_and_grad(lambda a: f(**a))(args)
    assert float(value) == ref.loss
    for name in ("u", *WEIGHTS):
        np.testing.assert_array_equal(np.asarray(grads[name]), ref.grads[name].numpy(), err_msg=name)


# -- bad input ---------------------------------------------------------------------------------------
def test_bad_inputs_are_refused_naming_the_culprit(chain):
    model, init = chain
    f = sp.jax.function(model, STEPS, inputs=["x", "k"], loss=final_x_squared, initial={"v": init["v"]})
    x0, k0 = jnp_of(init["x"]), jnp_of(model.params.k)
    with pytest.raises(sp.ModelError, match=r"x= must be float64 of shape \(16,\).*got float64 of shape \(15,\)"):
        f(x=x0[:15], k=k0)
    with pytest.raises(sp.ModelError, match=r"k= must be float64 of shape \(2,\).*got float32"):
        f(x=x0, k=k0.astype(jnp.float32))
    with pytest.raises(sp.ModelError, match=r"missing 'k'"):
        f(x=x0)
    with pytest.raises(sp.ModelError, match=r"'c' not in inputs"):
        f(x=x0, k=k0, c=jnp.ones(1))
    with pytest.raises(sp.ModelError, match=r"k= must be a JAX \(or NumPy\) array, got list"):
        f(x=x0, k=[4.0, 0.5])
    with pytest.raises(sp.ModelError, match=r"'speed' in inputs is neither a state nor a parameter"):
        sp.jax.function(model, STEPS, inputs=["x", "speed"], loss=final_x_squared)
    with pytest.raises(sp.ModelError, match=r"initial value of state\(s\) 'v' is missing"):
        sp.jax.function(model, STEPS, inputs=["x"], loss=final_x_squared)
    with pytest.raises(sp.ModelError, match=r"function\(initial=...\) 'v': expected a float64 NumPy array of shape "
                                            r"\(16,\).*got float64 of shape \(15,\)"):
        sp.jax.function(model, STEPS, inputs=["x"], loss=final_x_squared, initial={"v": np.zeros(15)})
    g = sp.jax.function(model, STEPS, inputs=["x"], loss=final_x_squared, initial={"v": jnp_of(init["v"])})
    assert float(g(x=x0)) == float(f(x=x0, k=k0))           # a JAX array is a fine fixed value
    with pytest.raises(sp.ModelError, match=r"pass a function steps -> schedule"):
        sp.jax.function(model, STEPS, inputs=["x", "v"], loss=final_x_squared, schedule=sp.Revolve(STEPS, 4))


def test_a_jax_function_that_cannot_be_differentiated_is_named(device):
    def looping(u, w1, b1, w2, b2):          # a while loop with a traced bound: no reverse mode in JAX
        count = jnp.sum(u > 0.5).astype(jnp.int32)
        return jax.lax.fori_loop(0, count, lambda i, f: f * w2[0], jnp.tanh(u * w1[0] + b1[0])) + b2[0]

    model = learned_model(sp.jax.call, looping, device=device)
    init = {"u": u0(device=device)}
    model.rollout(init, 5)                            # forward runs are fine
    with pytest.raises(sp.ModelError, match=r"stepper.jax.call\(looping\) \(interop_models.py:\d+\): JAX cannot "
                                            r"differentiate .*looping"):
        model.gradient(init, 5, loss=squared_norm)


def test_a_jax_function_returning_the_wrong_shape_is_named(device):
    model = learned_model(sp.jax.call, lambda u, w1, b1, w2, b2: (u * w1[0])[:-1], device=device)
    with pytest.raises(sp.ModelError, match=r"returned float64 of shape \(11,\) for outputs\[0\], which is float64 "
                                            r"of shape \(12,\)"):
        model.rollout({"u": u0(device=device)}, 3)
    with pytest.raises(sp.ModelError, match=r"returned float64 of shape \(11,\) for outputs\[0\]"):
        model.gradient({"u": u0(device=device)}, 3, loss=squared_norm)


def test_call_takes_stepper_arrays_only():
    with pytest.raises(sp.ModelError, match=r"inputs\[0\] is a ndarray; pass stepper arrays"):
        sp.jax.call(net, inputs=[np.zeros(3)], outputs=[sp.zeros(3, dtype=sp.float64)])
    a = sp.zeros(3, dtype=sp.float64)
    with pytest.raises(sp.ModelError, match=r"outputs\[0\] is also an input"):
        sp.jax.call(lambda x: x, inputs=[a], outputs=[a])


def test_float64_models_need_jax_64_bit_mode():
    script = ("import jax, stepper as sp, stepper.jax, sys; sys.path.insert(0, %r)\n"
              "from stepper_models import chain_model\n"
              "try:\n    sp.jax.function(chain_model(), 5, inputs=['x', 'v'])\n"
              "except sp.ModelError as e:\n    print(e)\n") % str(__import__("pathlib").Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "jax.config.update('jax_enable_x64', True)" in out.stdout, out.stderr[-2000:]


def test_import_stepper_does_not_import_jax():
    out = subprocess.run([sys.executable, "-c", "import sys, stepper; print('jax' in sys.modules)"],
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
