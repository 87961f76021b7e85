"""--gpus / --layer-split of the commands that run verify windows, parsed once into one engine/layer_plan.SplitConfig."""

from __future__ import annotations

import click


def split_options(f):
    """--gpus and --layer-split; the command takes them as gpus, layer_split and hands them to split_config."""
    f = click.option("--layer-split", "layer_split", default=None, metavar="L1,L2,...",
                     help="Layers per stage, in order (they must sum to the model's layers; needs --gpus). "
                     "[default: by weight bytes]")(f)
    f = click.option("--gpus", "gpus", default=None, metavar="N|ID,ID,...",
                     help="Split the layers over N GPUs (devices 0..N-1), or over the listed device ids (0,0: two "
                     "stages on one GPU). --device cpu runs the same stages on the numpy engine. With expert tiers "
                     "each stage has its own: --expert-cache is per GPU.")(f)
    return f


def split_config(gpus, layer_split):
    from ..engine.layer_plan import split_config as parse

    return parse(gpus, layer_split)
