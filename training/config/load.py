"""Loading a run configuration: layers merged once, then built and validated once.

    python -m training <step> --config configs/demo.yaml --set optim.epochs=2

The layers, later ones winning key by key:
  1. the schema's defaults (training/config/schema.py and its sections' modules);
  2. the YAML file, converted first when it is one of scDINO's pipeline YAMLs (training/config/scdino.py);
  3. `--set section.key=value` overrides, each value read as YAML except for string keys.
The merged tree is built into a `Config` in one pass, so an error names the key as the user wrote it.
The resolved configuration is written into every run directory (`dump_config`).
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import yaml

from training.config.scdino import convert_if_scdino
from training.config.schema import Config, from_dict, hint_of, set_dotted
from training.config.validation import ConfigError
from training.writes.atomic import write_text_atomic


def read_yaml(text: str) -> Any:
    """yaml.safe_load that also accepts `!!python/tuple` (as lists): scDINO's YAMLs use the tag."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor(
        "tag:yaml.org,2002:python/tuple", lambda loader, node: loader.construct_sequence(node)
    )
    return yaml.load(text, Loader=Loader)


def file_layer(path: str | Path) -> dict[str, Any]:
    """The tree of a YAML config file, in our sections (an scDINO YAML is converted)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        tree = read_yaml(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path} must hold a mapping of sections, got {type(tree).__name__}")
    return convert_if_scdino(tree)


def parse_override(text: str) -> tuple[str, Any]:
    """Parse one `--set key=value` argument; the value is read as YAML (numbers, lists, booleans)."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value (e.g. optim.epochs=2), got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if hint_of(key) is str:  # kept as written: channels "01234" must not become the octal 668
        return key, raw.strip().strip("'\"")
    if hint_of(key) == tuple[str, ...] and not raw.strip().startswith("["):  # "0,012": comma-separated strings
        return key, raw.strip().strip("'\"")
    return key, yaml.safe_load(raw) if raw.strip() else ""


def load_config(path: str | Path | None, overrides: typing.Sequence[str] = ()) -> Config:
    """Defaults <- YAML file (scDINO YAMLs converted) <- `key=value` overrides, built once."""
    tree = file_layer(path) if path is not None else {}
    for dotted, value in map(parse_override, overrides):
        set_dotted(tree, dotted, value)
    return from_dict(tree)


def dump_config(config: Config, path: str | Path) -> None:
    """Write the resolved configuration as YAML (the run directory's config.yaml)."""
    write_text_atomic(path, yaml.safe_dump(config.to_dict(), sort_keys=False))
