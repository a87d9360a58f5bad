"""`gpudoctor run` options for the CPU tests' small scripts: one warm-up step, three timed and two traced,
no floor of seconds on either phase (the scripts run a set number of tiny steps)."""

FAST = [
    "--warmup",
    "1",
    "--warmup-seconds",
    "0",
    "--light-steps",
    "3",
    "--light-seconds",
    "0",
    "--steps",
    "2",
]
