"""Expert tiers, host side: the expert profile, VRAM residency, the per-layer miss plan, the CPU expert pool, the
doorbell words, the PCIe share rule, and the watchdog that releases stalled GPU waits.

Nothing here imports CuPy: the GPU engine hands in numpy views of its mapped pinned words and buffers.
"""
