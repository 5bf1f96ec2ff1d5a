"""The on-device daemon ``cuvil-edged``: serving, scheduling, systemd integration (issue #4)."""

__all__: list[str] = []
