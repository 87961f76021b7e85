"""`strata logprobs`: per-position log-probs of a token sequence, fed through verify windows."""

from __future__ import annotations

import json
import os
import sys

import click

from ._common import ctx_option, device_option, format_option, load_engine, load_model, model_argument
from ..present import RECORD_FORMATS

TABLE_COLUMNS = [("pos", None), ("target", None), ("lp_target", ".6f"), ("top_id", None), ("lp_top", ".6f"),
                 ("match", None), ("lp_extra", ".6f"), ("lp_target_renorm", ".6f")]
FLAT_KEYS = ["pos", "target", "lp_target", "top_id", "lp_top", "match", "lp_extra", "lp_target_renorm", "topk"]


def token_options(command):
    """--tokens FILE | --random N | --text STR | --text-file FILE (and --seed of --random)."""
    for option in reversed([
        click.option("--tokens", "token_file", type=click.Path(dir_okay=False),
                     help="File of token ids (whitespace/commas)."),
        click.option("--random", "n_random", type=click.IntRange(min=2), help="Use N random token ids instead."),
        click.option("--text", help="Text, tokenized by the model's own tokenizer (tokenizer.ggml.*)."),
        click.option("--text-file", type=click.Path(dir_okay=False),
                     help="A UTF-8 text file, tokenized by the model's own tokenizer."),
    ]):
        command = option(command)
    return command


@click.command(short_help="Dump per-position logprobs of a token sequence.")
@model_argument
@token_options
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --random and of --draft-noise.")
@click.option("--topk", type=click.IntRange(0, 256), default=0, show_default=True, help="Top-K id:logprob fields.")
@click.option("--window", "window", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Verify window size T (1 last accepted token + T-1 drafts).")
@click.option("--extra-id", type=int, default=None, help="Extra token reported per row (default: the model's EOS).")
@click.option("--draft-noise", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Probability of replacing each draft by a wrong token (the dump must not change).")
@click.option("--full-dist", is_flag=True, help="json/jsonl: also write each row's whole log-prob distribution "
              "(`strata compare` then reports KLD).")
@format_option(("tsv",) + RECORD_FORMATS, default="tsv")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the dump here instead of stdout.")
@device_option
@ctx_option
def command(model, token_file, n_random, text, text_file, seed, topk, window, extra_id, draft_noise, full_dist, fmt,
            output, device, n_ctx):
    """One row per position p = 0..N-2: the distribution after tokens[0..p], target tokens[p+1].

    TSV columns: pos, target, logprob(target), top_id, logprob(top_id), match, logprob(extra_id),
    logprob(target) renormalised without extra_id, then K fields id:logprob (most likely first). The loop's
    acceptance (histogram of accepted drafts, mean accepted drafts, per-position acceptance) goes to stderr and
    into the dump (TSV: a `# speculation {json}` line; JSON: meta.speculation), for verify-bench --acceptance-from.
    """
    from ..dumps import rows_to_json, write_tsv
    from ..envinfo import environment_record, header_line
    from ..errors import InputError
    from ..logprobs import speculative_dump
    from ..present import Column, emit, err_console
    from ..progress import step_progress
    from ..speculation import DUMP_TAG
    from ..tokens import check_range, tokens_from_options

    if full_dist and fmt not in ("json", "jsonl"):
        raise InputError("--full-dist writes whole distributions: it needs --format json or jsonl")
    if output and not os.path.isdir(os.path.dirname(os.path.abspath(output))):
        raise InputError(f"{output}: cannot write the dump (no such directory)")
    m = load_model(model)
    g = m.geometry
    tokens, source = tokens_from_options(m, token_file=token_file, n_random=n_random, text=text,
                                         text_file=text_file, seed=seed)
    if len(tokens) < 2:
        raise InputError(f"{source}: need at least 2 tokens (one row needs a target)")
    check_range(tokens, g.n_vocab, source)
    if extra_id is None:
        extra_id = g.eos_token_id
    elif not 0 <= extra_id < g.n_vocab:
        raise InputError(f"--extra-id {extra_id} out of range 0..{g.n_vocab - 1}")
    engine = load_engine(m, device, n_ctx)
    if len(tokens) - 1 > engine.n_ctx:
        raise InputError(f"{source}: {len(tokens)} tokens need {len(tokens) - 1} positions, past the context "
                         f"{engine.n_ctx} (raise --ctx, up to {g.n_ctx})")
    with step_progress("logprobs", total=len(tokens) - 1) as progress:
        rows, stats = speculative_dump(engine, tokens, window, draft_noise=draft_noise, seed=seed, topk=topk,
                                       extra_id=extra_id, full_dist=full_dist,
                                       progress=lambda done, total: progress(done))
    env = environment_record(engine.device)
    spec = stats.as_dict()
    comments = [header_line(env), f"model {m.path} | tokens {source} ({len(tokens)}) | window {window} | "
                f"draft-noise {draft_noise} | windows {stats.windows} | extra_id {extra_id}",
                f"{DUMP_TAG} {json.dumps(spec)}"]
    try:
        out = open(output, "w") if output else sys.stdout
    except OSError as exc:
        raise InputError(f"{output}: cannot write the dump ({exc.strerror or exc})") from None
    try:
        if fmt == "tsv":
            write_tsv(rows, out, comments)
        elif fmt in ("json", "jsonl"):
            meta = {"env": env, "model": m.path, "tokens": source, "window": window, "draft_noise": draft_noise,
                    "extra_id": extra_id, DUMP_TAG: spec}
            emit(rows_to_json(rows), None, fmt, out=out, meta=meta)
        elif fmt == "csv":  # raw numbers; top-k as space-separated id:logprob pairs
            flat = [dict(r.__dict__, topk=" ".join(f"{i}:{lp!r}" for i, lp in r.topk)) for r in rows]
            emit(flat, FLAT_KEYS, fmt, out=out)
        else:
            table = [dict(r.__dict__, topk=" ".join(f"{i}:{lp:.3f}" for i, lp in r.topk)) for r in rows]
            cols = [Column(k, fmt=f) for k, f in TABLE_COLUMNS] + ([Column("topk", justify="left")] if topk else [])
            emit(table, cols, fmt, header_lines=comments[:2], out=out if output else None)
    finally:
        if output:
            out.close()
    err_console().print(f"{len(rows)} rows through {stats.windows} windows of <= {window} tokens "
                        f"({stats.rows_fed} rows fed, {stats.rows_kept} kept); {stats.summary_line()}",
                        style="dim", highlight=False, soft_wrap=True)
