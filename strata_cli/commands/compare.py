"""`strata compare A B`: how far two logprob dumps of the same tokens are apart, with optional gates."""

from __future__ import annotations

from dataclasses import asdict

import click

from ._common import STDIN, FileParam, FiniteFloatRange, StrataCommand, format_option

EXIT_THRESHOLD = 3

POSITION_COLUMNS = [
    ("pos", "pos", None), ("target", "target", None), ("lp_a", "lp A", ".6f"),
    ("lp_b", "lp B", ".6f"), ("abs_delta", "|Δ|", ".2e"), ("top1_a", "top1 A", None),
    ("top1_b", "top1 B", None), ("top1_agree", "top1 =", lambda v: "yes" if v else "no"),
    ("topk_overlap", "top-k overlap", ".3f"),
]


def _summary_rows(s) -> list[dict]:
    def opt(v, spec):
        return "-" if v is None else format(v, spec)

    return [
        {"metric": "rows", "value": str(s.rows)},
        {"metric": "max |Δ logprob(target)|", "value": f"{s.max_abs_delta:.3e} (pos {s.max_delta_pos})"},
        {"metric": "mean |Δ|", "value": f"{s.mean_abs_delta:.3e}"},
        {"metric": "p99 |Δ|", "value": f"{s.p99_abs_delta:.3e}"},
        {"metric": "top-1 agreement", "value": f"{s.top1_agreement:.4f}"},
        {"metric": "mean top-k overlap", "value": opt(s.mean_topk_overlap, ".4f")},
        {"metric": "target-match rate A", "value": f"{s.match_rate_a:.4f}"},
        {"metric": "target-match rate B", "value": f"{s.match_rate_b:.4f}"},
    ] + s.divergence.table_rows()


def summary_row(s) -> dict:
    """The summary as one flat row of raw numbers (csv/jsonl without --per-position)."""
    row = {k: v for k, v in asdict(s).items() if k != "divergence"}
    row.update(s.divergence.flat())
    return row


@click.command(cls=StrataCommand, short_help="Compare two logprob dumps of the same tokens.")
@click.argument("dump_a", type=FileParam(STDIN))
@click.argument("dump_b", type=FileParam(STDIN))
@click.option("--max-delta", type=FiniteFloatRange(min=0), default=None,
              help="Fail (exit 3) if max |Δ logprob(target)| exceeds this.")
@click.option("--min-top1", type=FiniteFloatRange(0, 1), default=None,
              help="Fail (exit 3) if the top-1 agreement fraction is below this.")
@format_option()
@click.option("--per-position", is_flag=True,
              help="Also list every position (csv/jsonl: the positions instead of the summary row).")
@click.pass_context
def command(ctx, dump_a, dump_b, max_delta, min_top1, fmt, per_position):
    """Compare two logprob dumps (TSV or JSON from `strata logprobs`, or the seed engine's STRATA_LOGPOS) of the
    same tokens; A is the base.

    Rows are aligned by position; the positions and targets must match. Reports |Δ logprob(target)| (max, mean,
    p99), top-1 agreement, top-k overlap, each dump's target-match rate, PPL of each and their ratio, Δp (mean,
    RMS, percentiles), and KLD (mean ± error, percentiles) when both are JSON dumps written with --full-dist.
    Thresholds apply only when given.
    """
    from ..analysis.compare import compare_files, threshold_failures
    from ..report.present import Column, emit

    summary, diffs = compare_files(dump_a, dump_b)
    failures = threshold_failures(summary, max_delta=max_delta, min_top1=min_top1)
    columns = [Column(key, header, spec) for key, header, spec in POSITION_COLUMNS]
    positions = [asdict(d) for d in diffs]
    head = [f"A: {dump_a}", f"B: {dump_b}"]
    if fmt == "json":
        meta = {"a": str(dump_a), "b": str(dump_b), "summary": summary.as_dict(),
                "thresholds": {"max_delta": max_delta, "min_top1": min_top1}, "passed": not failures}
        emit(positions if per_position else [], columns, "json", meta=meta)
    elif fmt in ("csv", "jsonl"):
        if per_position:
            emit(positions, columns, fmt)
        else:
            emit([dict(summary_row(summary), a=str(dump_a), b=str(dump_b), passed=not failures)], None, fmt)
    else:
        if per_position:
            emit(positions, columns, fmt, title="per position")
        emit(_summary_rows(summary), [Column("metric", justify="left"), Column("value")], fmt,
             title="compare", header_lines=head)
    if failures:
        click.echo(f"strata: compare failed: {'; '.join(failures)}", err=True)
        ctx.exit(EXIT_THRESHOLD)
