"""How a run carries out its schedule. `executor.Sweep` runs the schedule's actions one by one in
Python, each step through the step function on its Tape: that is the semantics. The modules in
`fast/` run stretches of the same actions without Python in between (native C++ loops, reversals
and whole reverse sweeps on the CPU; CUDA graphs on a GPU), from the step's trace, with the same
kernels, arguments and order, so they give the same bits; the executor hands them what they can
take. Snapshots go to the RAM/DISK tiers of snapshots.py (priced by disk_plan.py); parameter
gradients are summed over steps in float64 by param_sums.py, on every path alike."""
