"""Run provenance: the commit a record was measured on, also from a tree copied without .git."""

from __future__ import annotations

import strata_cli.report.envinfo as envinfo


def test_checkout_commit_is_a_short_hash(monkeypatch):
    monkeypatch.delenv("STRATA_GIT_COMMIT", raising=False)
    commit = envinfo.git_commit()
    assert commit is not None and len(commit.split("-")[0]) >= 7


def test_tree_without_git_reports_the_declared_commit(monkeypatch):
    monkeypatch.setattr(envinfo, "_git", lambda *args: None)
    monkeypatch.delenv("STRATA_GIT_COMMIT", raising=False)
    assert envinfo.git_commit() is None
    monkeypatch.setenv("STRATA_GIT_COMMIT", "04b7d56")
    assert envinfo.git_commit() == "04b7d56 (declared)"
    assert "04b7d56 (declared)" in envinfo.header_line(envinfo.environment_record("cpu"))


def test_declared_commit_wins_over_a_stale_checkout(monkeypatch):
    """A tree copied with an old .git (the GPU machine's copy) must not report that old HEAD."""
    monkeypatch.setattr(envinfo, "_git", lambda *args: "6d5e1c0" if args[0] == "rev-parse" else "")
    monkeypatch.setenv("STRATA_GIT_COMMIT", "c212912")
    assert envinfo.git_commit() == "c212912 (declared)"
