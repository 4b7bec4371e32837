"""Benchmarks that help choose a checkpointing configuration.

``python -m stepper.bench tradeoff --example wave --steps 2000 --budgets 4..64 --memory-limit 2``
sweeps the snapshot budget for an example model, runs the real gradient for each configuration, and
writes a table (Markdown, CSV, JSON) and a plot of wall time against peak memory; with
``--memory-limit`` it says which configuration to use and what slowdown to expect. The same steps
are functions here: `problems.make`, `tradeoff.calibrate`, `tradeoff.sweep`, `tradeoff.advise`;
`paths.plan` counts the paths a schedule's run takes.
"""
from . import paths, problems, report, tradeoff
from .problems import Problem
from .tradeoff import Advice, Config, Costs, Row, advise, calibrate, configurations, sweep

__all__ = ["paths", "problems", "report", "tradeoff",
           "Problem", "Advice", "Config", "Costs", "Row", "advise", "calibrate",
           "configurations", "sweep"]
