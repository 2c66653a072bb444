"""Dotted keys over a tree of dataclasses, and plain values converted to the types the fields declare.

One conversion for both trees a user writes: the run configuration (training/config, from YAML and
`--set`) and the CDK app's settings (stacks/shared/settings.py, from cdk.json, a settings file and
`-c key=value`). Standard library only, so that the CDK app reads it without torch or numpy.

    flatten_dotted({"optim": {"lr": 1e-4}})       -> {"optim.lr": 1e-4}
    dotted_keys(Settings)                         -> ["prefix", ..., "cluster.max_nodes", ...]
    hint_of(Config, "optim.epochs")               -> int
    set_dotted(tree, "optim.epochs", 2, Config)   tree["optim"]["epochs"] = 2
    Conversion().build(Config, tree)              -> Config(...), each value converted to its field's type
    context_pairs(["cluster.max_nodes=4"], ...)   -> {"cluster.max_nodes": "4"}  (`-c` as the CDK CLI takes it)

Errors are a `DottedKeyError` naming the dotted key; each tree's loader turns it into its own error.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin


class DottedKeyError(ValueError):
    """A key the tree does not have, or a section that is not a mapping; the message names the key."""


class ConversionError(DottedKeyError):
    """A value that is not of its key's type: `expected` says what would be (e.g. "an integer")."""

    def __init__(self, message: str, *, key: str, value: Any, expected: str) -> None:
        super().__init__(message)
        self.key, self.value, self.expected = key, value, expected


def _wrong(key: str, value: Any, expected: str) -> ConversionError:
    return ConversionError(f"{key} must be {expected}, got {value!r}", key=key, value=value, expected=expected)


def flatten_dotted(tree: Mapping[str, Any], prefix: str = "", keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """{"section.key": value} from a nested mapping; a mapping whose dotted path is in `keep` stays a
    value, and keys already dotted pass through."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and dotted not in keep:
            flat.update(flatten_dotted(value, dotted + ".", keep))
        else:
            flat[dotted] = value
    return flat


def dotted_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key of a dataclass tree, in declaration order, e.g. `cluster.max_nodes`."""
    keys: list[str] = []
    hints = typing.get_type_hints(cls)
    for item in dataclasses.fields(cls):
        hint = hints[item.name]
        if dataclasses.is_dataclass(hint):
            keys.extend(dotted_keys(hint, f"{prefix}{item.name}."))
        else:
            keys.append(prefix + item.name)
    return keys


def hint_of(root: type, dotted: str) -> Any:
    """The declared type of a dotted key of the dataclass tree `root`, or None for an unknown key."""
    hint: Any = root
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(hint):
            return None
        hint = typing.get_type_hints(hint).get(part)
    return hint


def suggest(key: str, allowed: Iterable[str]) -> str:
    """"did you mean 'x'? allowed: ..." for an unknown key."""
    allowed = sorted(allowed)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}allowed: {', '.join(allowed)}"


def set_dotted(tree: dict[str, Any], dotted: str, value: Any, root: type) -> None:
    """Set tree["a"]["b"] = value for "a.b", adding a missing section of `root`'s tree (a tree from a
    file need not have every section); an unknown section is an error naming the allowed ones."""
    *parents, leaf = dotted.split(".")
    node, hint = tree, root
    for part in parents:
        fields = typing.get_type_hints(hint) if dataclasses.is_dataclass(hint) else {}
        hint = fields.get(part)
        if node.get(part) is None and dataclasses.is_dataclass(hint):
            node[part] = {}
        if not isinstance(node.get(part), dict):
            raise DottedKeyError(f"unknown config section {dotted!r}: {suggest(part, fields or node)}")
        node = node[part]
    node[leaf] = value


def context_pairs(pairs: Iterable[str], example: str) -> dict[str, str]:
    """`-c KEY=VALUE` options as the CDK CLI takes them, a later key winning (`python -m stacks.deployment`
    and `python -m training plan`); one without `=` or a key is an error showing `-c <example>`."""
    context = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise DottedKeyError(f"-c {pair!r}: give KEY=VALUE, e.g. -c {example}")
        context[key] = value
    return context


@dataclass(frozen=True)
class Conversion:
    """How plain values (YAML, JSON, command-line strings) become the types the fields declare: booleans,
    integers, numbers, strings, choices (Literal) and tuples, a tuple also from a comma-separated string.

    The defaults are the run configuration's; the CDK app's settings read their context strictly
    (`CONTEXT`): a boolean only as true/false, a string only from a string or number, and list items
    trimmed, empty ones dropped."""

    yes_no: bool = True
    """Booleans also from "yes"/"no" and "1"/"0" (besides "true"/"false", in any case)."""
    empty_string_from_none: bool = True
    """A string field given no value (None, an empty YAML value) is ""; otherwise only strings and numbers
    are read as strings."""
    trim_items: bool = False
    """A list given for a tuple of strings: items trimmed, empty ones dropped (as for a comma-separated string)."""

    def build(self, cls: type, tree: Any, prefix: str = "") -> Any:
        """The dataclass `cls` from a nested mapping: unknown keys refused, sections built recursively,
        values converted; absent fields keep their defaults."""
        if tree is None:
            tree = {}
        if not isinstance(tree, dict):
            raise DottedKeyError(f"{prefix or 'the config'} must be a mapping, got {tree!r}")
        hints = typing.get_type_hints(cls)
        names = [item.name for item in dataclasses.fields(cls)]
        unknown = set(tree) - set(names)
        if unknown:
            key = sorted(unknown)[0]
            raise DottedKeyError(f"unknown config key {prefix + key!r}: {suggest(key, names)}")
        kwargs = {}
        for name in (name for name in names if name in tree):
            hint, key = hints[name], prefix + name
            if dataclasses.is_dataclass(hint):
                kwargs[name] = self.build(hint, tree[name], key + ".")
            else:
                kwargs[name] = self.convert(key, tree[name], hint)
        return cls(**kwargs)

    def convert(self, key: str, value: Any, hint: Any) -> Any:
        """`value` as the type `hint` declares; `key` names it in errors (items as key[i])."""
        origin = get_origin(hint)
        if origin is Literal:
            choices = get_args(hint)
            if value not in choices:
                listed = ", ".join(map(repr, choices))
                raise ConversionError(f"{key} must be one of {listed}; got {value!r}", key=key, value=value,
                                      expected=f"one of {listed}")
            return value
        if origin is tuple:
            return self._tuple(key, value, hint)
        if hint is bool:
            return self._bool(key, value)
        if hint is int:
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise _wrong(key, value, "an integer")
            try:
                return int(value)
            except ValueError:
                raise _wrong(key, value, "an integer") from None
        if hint is float:
            if isinstance(value, bool):
                raise _wrong(key, value, "a number")
            try:
                return float(value)
            except (TypeError, ValueError):
                raise _wrong(key, value, "a number") from None
        if hint is str:
            return self._str(key, value)
        return value

    def _bool(self, key: str, value: Any) -> bool:
        words = ("true", "false", "1", "0", "yes", "no") if self.yes_no else ("true", "false")
        if isinstance(value, str) and value.lower() in words:
            return value.lower() in ("true", "1", "yes")
        if not isinstance(value, bool):
            raise _wrong(key, value, "true or false")
        return value

    def _str(self, key: str, value: Any) -> str:
        if self.empty_string_from_none:
            if isinstance(value, (dict, list)):
                raise _wrong(key, value, "a string")
            return "" if value is None else str(value)
        if not isinstance(value, (str, int, float)):
            raise _wrong(key, value, "a string")
        return str(value)

    def _tuple(self, key: str, value: Any, hint: Any) -> tuple[Any, ...]:
        if isinstance(value, str):
            value = [item.strip() for item in value.split(",") if item.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConversionError(f"{key} must be a list, got {value!r}", key=key, value=value,
                                  expected="a list or comma-separated string")
        args = get_args(hint)
        if self.trim_items and args == (str, Ellipsis):
            return tuple(str(item).strip() for item in value if str(item).strip())
        item_hints = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(item_hints) != len(value):
            raise ConversionError(f"{key} must have {len(item_hints)} items, got {len(value)}", key=key,
                                  value=value, expected=f"{len(item_hints)} items")
        return tuple(self.convert(f"{key}[{i}]", item, item_hint)
                     for i, (item, item_hint) in enumerate(zip(value, item_hints)))


CONTEXT = Conversion(yes_no=False, empty_string_from_none=False, trim_items=True)
"""The CDK app's settings: values from cdk.json, a settings file and `-c key=value` strings."""
