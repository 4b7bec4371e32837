"""Differentiable time stepping: a model's step function, rollouts, and gradients reversed with
checkpointing schedules (binomial, multi-level with HDF5, online).

``import stepper`` gives the whole public API: the compiler's (kernels, launch, arrays, Tape, ...),
the checkpoint package's (schedules, actions, storages) and the stepper's own (Model, results).

The package in the order a `Model.gradient` call goes through it, each folder importing only the
ones after it (and errors.py): model.py (`Model`: declarations, and the runs it offers) -> runs/ (rollout,
gradient, evaluate, jvp/hvp: each picks a schedule and storage) -> execute/ (the schedule's actions
carried out: executor.py in Python is the semantics; fast/ runs stretches of the same actions in
C++ or as CUDA graphs, with the same bits) -> step/ (what a step is made of: its state, buffer
versions, context, trace). Beside them: distributed/ (MPI), jax.py and torch.py (interop),
optimize.py (scipy and Taylor tests) and bench/ (``python -m stepper.bench``).
"""
from compiler import *            # noqa: F401,F403
from compiler import __all__ as _compiler_all
from checkpoint import *          # noqa: F401,F403
from checkpoint import __all__ as _checkpoint_all

from .errors import ModelError, NonFiniteError
from .distributed import Distributed, Ensemble, EnsembleResult, Member
from .execute.snapshots import TierStats
from .model import Model
from .optimize import TaylorResult, taylor_test, value_and_grad
from .runs.gradient import GradientResult, GradientStats
from .runs.kept_trajectory import KeptTrajectory
from .runs.rollout import Rollout, RolloutStats
from .runs.second_order import HvpResult, JvpResult
from .step.state import State, StateSpec
from .step.step_context import StepContext
from .step.versions import release_memory

__version__ = "0.1.0"


def __getattr__(name):
    # stepper.jax and stepper.torch import their framework: loaded on first use, never by `import stepper`
    if name in ("jax", "torch"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'stepper' has no attribute '{name}'")


__all__ = [
    *_compiler_all, *_checkpoint_all,
    "Model", "State", "StateSpec", "StepContext", "Rollout", "RolloutStats", "GradientResult",
    "GradientStats", "JvpResult", "HvpResult", "KeptTrajectory", "TierStats", "ModelError", "NonFiniteError", "value_and_grad", "taylor_test", "TaylorResult",
    "Distributed", "Ensemble", "EnsembleResult", "Member", "release_memory",
]
