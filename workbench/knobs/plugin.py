"""vLLM general plugin entry point (placeholder until the knob plugin lands)."""


def register() -> None:
    return None
