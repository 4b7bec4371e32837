"""IR -> C++/CUDA source: one emitter (emit.py) and the per-target wrappers (targets.py)."""
