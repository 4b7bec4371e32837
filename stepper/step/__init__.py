"""What a model's step is made of, below every run: the state it reads and writes (`State`,
`StateSpec`), the versions of its buffers (`BufferPool`), the context a step function sees and the
runner that calls it on a Tape of its own (`StepContext`, `StepRunner`), and the trace a checked
step leaves for the fast paths to replay (`StepTrace`), with the fingerprint a checkpoint records.
Nothing here knows about schedules or runs."""
