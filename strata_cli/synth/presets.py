"""Model presets: HF-config-like geometry in YAML (profiles/presets/*.yaml). The Geometry of a preset is what
the loader reads from the metadata synth/plan.py writes for it (plan.preset_geometry)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, OptionError
from . import ple_hash

PRESET_NAMES = ("tiny", "small", "flash-next")
# YAML value types accepted per dataclass annotation (annotations are strings here)
_YAML_TYPES = {"int": (int,), "int | None": (int, type(None)), "float": (int, float), "str": (str,)}


@dataclass(frozen=True)
class Preset:
    name: str
    hidden_size: int
    num_hidden_layers: int
    full_attention_interval: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rotary_dims: int
    rope_theta: float
    indexer_n_heads: int
    indexer_head_dim: int
    indexer_budget: int
    indexer_compress_ratio: int
    linear_num_key_heads: int
    linear_key_head_dim: int
    linear_num_value_heads: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    hc_count: int
    hc_lowrank: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    ple_layer: int | None  # 0-based; None = no PLE block
    ngram_size: int
    heads_per_ngram: int
    ple_head_dim: int
    ple_conv_kernel_size: int
    ngram_vocab_size_base: int
    ngram_hash_seed: int
    eos_token_id: int

    # ---- derived layout
    @property
    def layer_is_attn(self) -> tuple[bool, ...]:
        k = self.full_attention_interval
        return tuple((i + 1) % k == 0 for i in range(self.num_hidden_layers))

    @property
    def compress_ratios(self) -> tuple[int, ...]:
        return tuple(self.indexer_compress_ratio if a else 0 for a in self.layer_is_attn)

    @property
    def rope_sections(self) -> list[int]:
        """M-RoPE sections over half the rotary dims, as HF configs give them: 8 -> [3, 3, 2, 0]."""
        half = self.rotary_dims // 2
        s = (half + 1) // 3
        return [s, s, half - 2 * s, 0]

    @property
    def ple_heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    @property
    def ple_vocab_sizes(self) -> list[int]:
        # Only one PLE layer, so its PLE index (which offsets the prime sequence) is 0.
        return ple_hash.head_vocab_sizes(self.ngram_vocab_size_base, self.ple_heads, 0)

    @property
    def ple_multipliers(self) -> list[int]:
        return ple_hash.layer_multipliers(self.vocab_size, self.ngram_size, 0, self.ngram_hash_seed)

    def summary_line(self) -> str:
        layout = "".join("A" if a else "G" for a in self.layer_is_attn)
        ple = "no PLE" if self.ple_layer is None else (
            f"PLE layer {self.ple_layer} {self.ngram_size}-grams x {self.heads_per_ngram} x {self.ple_head_dim} "
            f"base {self.ngram_vocab_size_base}")
        return (f"{self.name}: {self.num_hidden_layers} layers {layout}, hidden {self.hidden_size}, "
                f"{self.num_experts} experts top-{self.num_experts_per_tok} ff {self.moe_intermediate_size}, "
                f"vocab {self.vocab_size}, {ple}")

    # ---- overrides
    def with_overrides(self, *, layers: int | None = None, experts: int | None = None,
                       vocab: int | None = None, ngram_vocab: int | None = None) -> Preset:
        """Shrunk variants for tests and small disks; the attention interval and widths are kept."""
        p = self
        if layers is not None:
            if layers < 1:
                raise OptionError(f"--layers {layers}: must be >= 1")
            p = dataclasses.replace(p, num_hidden_layers=layers, name=f"{p.name}-L{layers}")
            p = dataclasses.replace(p, ple_layer=_gdn_layer_at_or_below(p, p.ple_layer))
        if experts is not None:
            if experts < 1:
                raise OptionError(f"--experts {experts}: must be >= 1")
            p = dataclasses.replace(p, num_experts=experts, name=f"{p.name}-E{experts}",
                                    num_experts_per_tok=min(p.num_experts_per_tok, experts))
        if vocab is not None:
            if vocab < 8:
                raise OptionError(f"--vocab {vocab}: must be >= 8")
            eos = p.eos_token_id if p.eos_token_id < vocab else vocab - 3  # keep <|endoftext|> inside
            p = dataclasses.replace(p, vocab_size=vocab, eos_token_id=eos, name=f"{p.name}-V{vocab}")
        if ngram_vocab is not None:
            if ngram_vocab < 2:
                raise OptionError(f"--ngram-vocab {ngram_vocab}: must be >= 2")
            p = dataclasses.replace(p, ngram_vocab_size_base=ngram_vocab, name=f"{p.name}-N{ngram_vocab}")
        return p


def _gdn_layer_at_or_below(p: Preset, layer: int | None) -> int | None:
    """PLE must sit on a recurrent layer that exists: move it down when --layers cuts it off."""
    if layer is None:
        return None
    kinds = p.layer_is_attn
    for candidate in range(min(layer, len(kinds) - 1), -1, -1):
        if not kinds[candidate]:
            return candidate
    return None


def presets_dir() -> Path:
    """profiles/presets of a source checkout, else the copy installed next to the package."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package.parent / "profiles" / "presets", package / "_profiles" / "presets"):
        if candidate.is_dir():
            return candidate
    raise InputError(f"no preset directory found (looked in {package.parent / 'profiles' / 'presets'} "
                     f"and {package / '_profiles' / 'presets'})")


def load_preset(name_or_path: str) -> Preset:
    """A preset by name (tiny, small, flash-next), by the path of a YAML file, or `-`: its YAML on stdin."""
    import yaml

    from ..sysio.files import is_stdio, read_text

    stdin, path = is_stdio(name_or_path), Path(name_or_path)
    if stdin:
        path = Path("stdin")  # what the messages below call it
    else:
        if not path.suffix:
            path = presets_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            raise OptionError(f"preset '{name_or_path}': no such file {path} (presets: {', '.join(PRESET_NAMES)})")
    try:
        data = yaml.safe_load(read_text("-" if stdin else path, what="preset")) or {}
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a preset is a mapping of the Preset fields, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(Preset)}
    missing = sorted(set(fields) - set(data))
    unknown = sorted(set(data) - set(fields))
    if missing or unknown:
        raise InputError(f"{path}: missing keys {missing}, unknown keys {unknown}")
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, _YAML_TYPES[fields[key].type]):
            raise InputError(f"{path}: '{key}' = {value!r} is not {fields[key].type}")
    return Preset(**data)
