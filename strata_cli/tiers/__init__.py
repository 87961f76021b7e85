"""Expert tiers, host side: the config (config.py), the expert profile, VRAM residency and its setup, the per-layer
miss plan, the server that answers a window's doorbells (host.py), the CPU expert pool, the doorbell words, the PCIe
share rule, the watchdog that releases stalled GPU waits, and the verify-bench statistics.

Nothing here imports the engine (tests/test_layering.py): the GPU engine hands in numpy views of its mapped words
and buffers, and its device side (engine/gpu/tiers.py) records the graph's publish / wait nodes.
"""
