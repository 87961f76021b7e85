"""`strata quantize`: an F32/F16/BF16 qwen4exp GGUF re-encoded to another type or a per-tensor recipe."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import InputError
from ..sysio.files import check_input_file, check_output_path, stdout_text
from ..synth.recipes import FILE_TYPES, RECIPE_NAMES
from ._common import MODEL_IN, MODEL_OUT, STDIN, FileParam, StrataCommand, format_option


@click.command("quantize", cls=StrataCommand,
               short_help="Quantize an F32/F16/BF16 qwen4exp GGUF to another type or a recipe.")
@click.argument("in_path", metavar="IN", type=MODEL_IN)
@click.argument("out", type=MODEL_OUT)
@click.option("--type", "ggml_type", type=click.Choice(list(FILE_TYPES), case_sensitive=False),
              help="Output type of every matrix, by the converter's --outtype rules (F32, F16, BF16, Q8_0) and "
                   "llama-quantize's fallbacks for the others.")
@click.option("--recipe", metavar="NAME|PATH", type=FileParam(STDIN),
              help=f"Per-tensor type mix instead of --type: {', '.join(RECIPE_NAMES)} or a YAML file.")
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
@format_option()
def command(in_path: str, out: str, ggml_type: str | None, recipe: str | None, force: bool, fmt: str) -> None:
    """Write IN re-encoded to OUT: every tensor the type asked for (or the recipe's), blocks by gguf.quants or by
    strata's own encoders (synth/encode.py), the metadata copied; then print what was written (path, bytes, type)."""
    from ..report.present import emit, err_console
    from ..report.progress import byte_progress
    from ..synth.quantize import quantize_file
    from ..synth import recipes

    if (recipe is None) == (ggml_type is None):
        raise click.UsageError("give one of --type and --recipe")
    check_input_file(in_path, what="model")
    stdout_text()
    target = check_output_path(out, what="model", force=force)
    choice = recipes.load_recipe(recipe) if recipe is not None else recipes.uniform(FILE_TYPES[ggml_type.upper()])
    if str(target.resolve()) == str(Path(in_path).resolve()):
        raise InputError(f"{out}: is IN itself; write the quantized model to another file")
    with byte_progress(f"quantizing {target.name}", err_console()) as progress:
        path = quantize_file(in_path, target, choice, progress=progress)
    row = {"path": str(path), "bytes": path.stat().st_size, "from": in_path, "type": choice.name,
           "file_type": choice.ftype}
    emit([row], None, fmt, title="quantize", meta=row)
