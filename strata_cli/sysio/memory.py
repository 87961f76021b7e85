"""The host's memory probe: what the engines check a context's KV cache and state against."""

from __future__ import annotations


def available_memory() -> int | None:
    """Bytes of memory the host can still give (MemAvailable), or None where /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
