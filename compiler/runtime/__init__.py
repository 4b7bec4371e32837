"""Arrays, devices and the Tape: the runtime objects kernels operate on."""
