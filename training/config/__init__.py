"""The run configuration: one typed tree for every step (schema.py: the root and the run and training
sections; data.py, eval.py and ingest.py: those sections), loaded from YAML and `--set` overrides in
layers (load.py), with scDINO's pipeline YAMLs converted on the way in (scdino.py). Dotted keys and the
conversion of plain values to the fields' types (dotted.py) are shared with the CDK app's settings."""

from training.config.load import dump_config, load_config, parse_override, read_yaml
from training.config.schema import (
    Config,
    ConfigError,
    DataConfig,
    DinoConfig,
    EvalConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
    flatten_dotted,
    from_dict,
)

__all__ = [
    "Config", "ConfigError", "DataConfig", "DinoConfig", "EvalConfig", "ModelConfig", "OptimConfig",
    "RunConfig", "TrainConfig", "dump_config", "flatten_dotted", "from_dict", "load_config",
    "parse_override", "read_yaml",
]
