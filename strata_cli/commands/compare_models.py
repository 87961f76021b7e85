"""`strata compare-models BASE OTHER`: KLD, PPL ratio, Δp and top-1 agreement of OTHER against BASE on one text."""

from __future__ import annotations

import click

from ._common import (MODEL_IN, SEED, StrataCommand, context_hint, ctx_option, device_option, format_option,
                      load_engine, load_model, run_provenance)
from ._split import split_config, split_options
from ._tiers import tier_config, tier_options
from .logprobs import token_options

POSITION_COLUMNS = [("pos", None), ("target", None), ("kld", ".6f"), ("lp_base", ".6f"), ("lp_other", ".6f"),
                    ("dp", ".6f"), ("top_base", None), ("top_other", None)]


@click.command(cls=StrataCommand,
               short_help="KL divergence, PPL ratio, Δp and top-1 agreement of one model against another.")
@click.argument("base", metavar="BASE.gguf", type=MODEL_IN)
@click.argument("other", metavar="OTHER.gguf", type=MODEL_IN)
@token_options
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of --random.")
@click.option("--window", type=click.IntRange(1, 64), default=8, show_default=True,
              help="Tokens per verify window (the result does not depend on it).")
@click.option("--per-position", is_flag=True,
              help="Also list every position (csv/jsonl: the positions instead of the summary row).")
@format_option()
@device_option
@ctx_option
@tier_options
@split_options
def command(base, other, token_file, n_random, text, text_file, seed, window, per_position, fmt, device, n_ctx,
            gpus, layer_split, **tier_args):
    """Run BASE and OTHER over the same tokens in one process and compare their full next-token distributions,
    as `llama-perplexity --kl-divergence` does: mean KLD ± its standard error, KLD percentiles (median, 90, 99,
    99.9, max), PPL of each and their ratio, top-1 agreement, Δp = p_other(target) - p_base(target) (mean, RMS,
    percentiles). Text is tokenized by BASE's tokenizer. The expert-tier options apply to both GPU engines."""
    from ..analysis.divergence import DivergenceStats, compare_engines
    from ..errors import InputError
    from ..model.tokens import check_range, tokens_from_options
    from ..report.envinfo import environment_record, header_line
    from ..report.present import Column, emit
    from ..report.progress import step_progress

    split = split_config(gpus, layer_split)
    m_base, m_other = load_model(base), load_model(other)
    if m_base.geometry.n_vocab != m_other.geometry.n_vocab:
        raise InputError(f"{other}: vocabulary of {m_other.geometry.n_vocab} tokens, {base} has "
                         f"{m_base.geometry.n_vocab}: distributions over different vocabularies cannot be compared")
    tokens, source = tokens_from_options(m_base, token_file=token_file, n_random=n_random, text=text,
                                         text_file=text_file, seed=seed)
    if len(tokens) < 2:
        raise InputError(f"{source}: need at least 2 tokens (one position needs a target)")
    check_range(tokens, m_base.geometry.n_vocab, source)
    tiers = tier_config(**tier_args)
    e_base = load_engine(m_base, device, n_ctx, tiers=tiers, split=split)
    e_other = load_engine(m_other, device, n_ctx, tiers=tiers, split=split)
    if len(tokens) - 1 > min(e_base.n_ctx, e_other.n_ctx):
        raise InputError(f"{source}: {len(tokens)} tokens need {len(tokens) - 1} positions, past the context "
                         f"{min(e_base.n_ctx, e_other.n_ctx)} "
                         f"({context_hint(min(e_base.n_ctx, e_other.n_ctx), m_base.geometry.n_ctx, 'the tokens')})")
    with step_progress("comparing", total=len(tokens) - 1) as progress:
        arrays = compare_engines(e_base, e_other, tokens, window, lambda done, total: progress(done))
    e_base.close()
    e_other.close()
    stats = DivergenceStats.of(arrays)
    env = environment_record(e_base.device)
    head = [header_line(env), f"base {m_base.path} | other {m_other.path} | tokens {source} ({len(tokens)}) | "
            f"{stats.n} positions"]
    positions = arrays.rows()
    columns = [Column(k, fmt=f) for k, f in POSITION_COLUMNS]
    summary = dict(stats.flat(), base=m_base.path, other=m_other.path, tokens=source)
    if fmt == "json":
        emit(positions if per_position else [], columns, "json",
             meta={"env": env, "base": m_base.path, "other": m_other.path, "tokens": source,
                   "summary": stats.flat(),
                   "provenance": run_provenance(env, seed, e_base.n_ctx, base=m_base, other=m_other)})
    elif fmt in ("csv", "jsonl"):
        emit(positions if per_position else [summary], columns if per_position else None, fmt)
    else:
        if per_position:
            emit(positions, columns, fmt, title="per position")
        emit(stats.table_rows(), [Column("metric", justify="left"), Column("value")], fmt,
             title="compare-models", header_lines=head)
