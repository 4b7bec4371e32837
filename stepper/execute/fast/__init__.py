"""Fast paths of `stepper.execute.executor`: the same actions, kernels and order, hence the same bits.

- native_loop.py: a run of recomputed steps as one call into a C++ driver (driver.h, loop.cpp);
- native_reverse.py: a recorded step reversed from its start state without a tape;
- native_sweep.py (+ stretch_versions.py): a stretch of a reverse sweep worked out first, then run
  by one call (sweep.cpp);
- graph_loop.py: on a GPU, runs of recomputed steps as CUDA graph launches.
"""
