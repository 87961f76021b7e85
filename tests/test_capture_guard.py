"""Frees that arrive during a stream capture wait for its end (gpu/runtime.py capture_guard): a finalizer that
called cudaFreeHost inside a capture would invalidate it silently. CPU only: the guard is plain Python."""

from __future__ import annotations

import gc

from strata_cli.gpu import runtime


def test_frees_inside_a_capture_wait_for_its_end_and_gc_pauses():
    freed = []
    assert gc.isenabled()
    with runtime.capture_guard():
        assert not gc.isenabled()
        runtime.free_later_if_capturing(freed.append, "a")
        with runtime.capture_guard():  # nested captures (two engines) release only after the outer one
            runtime.free_later_if_capturing(freed.append, "b")
        assert freed == []
    assert sorted(freed) == ["a", "b"]
    assert gc.isenabled()
    runtime.free_later_if_capturing(freed.append, "c")  # no capture open: freed at once
    assert freed[-1] == "c"


def test_a_failed_capture_still_releases_what_it_deferred():
    freed = []
    try:
        with runtime.capture_guard():
            runtime.free_later_if_capturing(freed.append, 1)
            raise RuntimeError("capture failed")
    except RuntimeError:
        pass
    assert freed == [1] and gc.isenabled()
