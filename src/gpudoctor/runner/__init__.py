"""Running the user's script in this process: launching it (`launch`), finding its steps (`steps`), the
phases of a capture (`capture` runs them: `phases` sets them and decides the warm-up, `light` times the
light phase, `agreement` ends it alike on every rank, `samplers` reads memory and NVML beside it,
`profiler_session` records the traced phase), the run's record (`record`), and a step function's trace
(`profile`). Nothing here imports torch or changes anything at import."""
