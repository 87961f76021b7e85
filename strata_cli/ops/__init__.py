"""Numpy reference ops of the qwen4exp forward, float32. Each GPU kernel in kernels/ mirrors one of these
functions signature-for-signature; tests compare the two on odd shapes.

Shape letters: T rows of the window, D hidden, C streams (hyper-connections), L low rank, E experts,
K top-k, H heads, Hk kv heads, d head dim, N cells (positions), B blocks.
"""
