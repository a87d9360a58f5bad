"""The `gpudoctor` console script."""


def main() -> None:
    raise SystemExit("gpudoctor: not wired yet")
