"""Running the user's script in this process: launching it (`launch`), finding its steps (`steps`), the
light and traced phases (`capture`), the run's record (`record`), and a step function's trace
(`profile`). Nothing here imports torch or changes anything at import."""
