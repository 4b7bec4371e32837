"""The runs a `Model` offers, each one sweep of a schedule: `rollout` (forward, with callbacks and
crash-safe checkpoints), `gradient` (a checkpointed reverse sweep), `evaluate` (its loss alone),
`jvp`/`hvp` (second_order), a rollout recorded on a Tape (tape_op), and a rollout as a function of
named arrays (interop: what `stepper.jax` and `stepper.torch` wrap). They choose the schedule and
storage and hand the actions to `stepper.execute`."""
