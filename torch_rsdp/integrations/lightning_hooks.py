"""Lightning placeholder (filled below)."""
def patch(module) -> None:
    pass
