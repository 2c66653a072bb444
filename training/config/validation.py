"""Validation the configuration's sections share: ConfigError, the error naming a bad key, and the
range check of fractions."""

from __future__ import annotations

from training.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration value is missing, unknown or invalid; the message names the key."""


def check_fraction(key: str, value: float, *, allow_zero: bool) -> None:
    low_ok = value >= 0 if allow_zero else value > 0
    if not (low_ok and value < 1 or (not allow_zero and value == 1)):
        bound = "[0, 1)" if allow_zero else "(0, 1]"
        raise ConfigError(f"{key} must be in {bound}, got {value}")
