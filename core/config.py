"""Typed configs from nested dataclasses: defaults < a YAML file < `KEY=VALUE` overrides.

One loader for every config object (the training run's, the retrain flow's): unknown keys are an
error that lists the known ones, values are converted to the field's type, frozen sections are
rebuilt rather than mutated.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import yaml

from core.errors import DssmError

T = TypeVar("T")


def _yaml_flow(value: Any) -> Any:
    """`[a, b]` or `{a: b}` typed on a command line, read as a YAML flow sequence or mapping of strings
    (each item is then converted to the field's type, so `[yes, no]` stays two strings for a
    list[str]); anything else as it is."""
    if isinstance(value, str) and value.strip().startswith(("[", "{")):
        try:
            items = yaml.load(value, Loader=yaml.BaseLoader)  # noqa: S506 (BaseLoader builds only str, list, dict)
        except yaml.YAMLError as e:
            raise ValueError(value) from e
        if not isinstance(items, list | dict):
            raise ValueError(value)
        return items
    return value


def convert(value: Any, hint: Any, key: str) -> Any:
    """`value` (text from a command line, or what YAML gave) as the type `hint`; lists are YAML flow
    syntax (`[a, b]`) or comma-separated (`a,b`); a Literal allows its values only; a float is finite."""
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    origin = typing.get_origin(hint)
    try:
        if origin is typing.Literal:
            allowed = typing.get_args(hint)
            kind = type(allowed[0])
            chosen = value if isinstance(value, kind) else convert(value, kind, key)
            if chosen not in allowed:
                raise DssmError(f"config {key}: {short(value)} is not one of {', '.join(map(str, allowed))}")
            return chosen
        if hint is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in {"1", "true", "yes", "on"}:
                return True
            if str(value).lower() in {"0", "false", "no", "off"}:
                return False
            raise ValueError(value)
        if hint is int:
            return int(str(value).replace("_", ""))
        if hint is float:
            number = float(value)
            if not math.isfinite(number):
                raise ValueError(value)
            return number
        if hint is str:
            return str(value)
        if origin in (tuple, list, dict):
            value = _yaml_flow(value)
        if origin is dict:  # a YAML mapping, `{a: b}` or `a=b,c=d`
            kinds = typing.get_args(hint)
            if isinstance(value, dict):
                pairs = list(value.items())
            else:
                pairs = [tuple(p.split("=", 1)) for p in str(value).split(",") if p.strip()]
                if any(len(p) != 2 for p in pairs):
                    raise ValueError(value)
            return {
                convert(k.strip() if isinstance(k, str) else k, kinds[0], key): convert(
                    v.strip() if isinstance(v, str) else v, kinds[1], key
                )
                for k, v in pairs
            }
        if origin is tuple:
            kinds = typing.get_args(hint)
            items = value if isinstance(value, list | tuple) else str(value).strip("()[]").split(",")
            if len(items) != len(kinds):
                raise ValueError(value)
            pairs = zip(items, kinds, strict=True)
            return tuple(convert(v.strip() if isinstance(v, str) else v, k, key) for v, k in pairs)
        if origin is list:
            (item,) = typing.get_args(hint)
            items = value if isinstance(value, list) else [v for v in str(value).strip("[]").split(",") if v.strip()]
            return [convert(v.strip() if isinstance(v, str) else v, item, key) for v in items]
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            if value is None or str(value).lower() in {"none", "null", ""}:
                return None
            return convert(value, args[0], key)
    except (TypeError, ValueError):
        raise DssmError(f"config {key}: cannot read {short(value)} as {getattr(hint, '__name__', hint)}") from None
    raise DssmError(f"config {key}: unsupported type {hint}")


# keys of older configs -> where they live now
MOVED = {
    "evaluate.gate_metric": "gate.metric",
    "index_champion": "skip=[index] (--no-index)",
    "catalogue": "index.catalogue",
}
# switches of older configs that became a section of the same name -> what switches the stage off now
SWITCH_TO_SECTION = {"analyze": "skip=[analyze] (--no-analyze); analyze is the analyze stage's settings section"}


def apply(obj: T, values: dict[str, Any], prefix: str = "") -> T:
    """A copy of the dataclass `obj` with `values` (a nested dict) applied."""
    hints = typing.get_type_hints(type(obj), include_extras=True)
    names = {f.name for f in fields(obj)}
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if f"{prefix}{key}" in MOVED:
            raise DssmError(f"config: {prefix}{key} is now {MOVED[f'{prefix}{key}']}")
        if key not in names:
            raise DssmError(f"config: unknown key {prefix}{str(key)[:60]} (known: {', '.join(sorted(names))})")
        current = changes.get(key, getattr(obj, key))
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                if f"{prefix}{key}" in SWITCH_TO_SECTION and isinstance(value, bool | str):
                    raise DssmError(f"config: {prefix}{key}={value} is now {SWITCH_TO_SECTION[f'{prefix}{key}']}")
                raise DssmError(f"config {prefix}{key}: expected a section, got {short(value)}")
            changes[key] = apply(current, value, f"{prefix}{key}.")
        else:
            changes[key] = within(convert(value, hints[key], prefix + key), hints[key], prefix + key)
    return dataclasses.replace(obj, **changes) if changes else obj


@dataclasses.dataclass(frozen=True)
class Between:
    """A number field's range, as `Annotated[int, Between(1, 10_000)]`: a value outside it is refused when
    the config is read (a YAML file, KEY=VALUE, a flag), before any stage runs on it."""

    low: float
    high: float


def within(value: Any, hint: Any, key: str) -> Any:
    """`value` when the field's `Between` (if any) admits it, else a DssmError naming the key and the range."""
    for rule in typing.get_args(hint)[1:] if typing.get_origin(hint) is typing.Annotated else ():
        if isinstance(rule, Between) and isinstance(value, int | float) and not rule.low <= value <= rule.high:
            low, high = (f"{int(b):,}" if float(b).is_integer() else f"{b:g}" for b in (rule.low, rule.high))
            raise DssmError(f"config {key}: {short(value)} is outside {low}..{high}")
    return value


def field_values(obj: Any, cls: type) -> dict[str, Any]:
    """The values of dataclass `cls`'s fields in `obj` (a cls or a subclass of it), as they are."""
    return {f.name: getattr(obj, f.name) for f in fields(cls)}


def check_choices(cfg: Any, prefix: str = "") -> None:
    """Every Literal-typed field of the dataclass `cfg` (nested sections included) holds one of its
    values: what `convert` enforces on YAML and KEY=VALUE, for a config built in code."""
    hints = typing.get_type_hints(type(cfg))
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            check_choices(value, f"{prefix}{f.name}.")
        elif typing.get_origin(hints[f.name]) is typing.Literal and value not in typing.get_args(hints[f.name]):
            allowed = ", ".join(map(str, typing.get_args(hints[f.name])))
            raise DssmError(f"{prefix}{f.name} must be one of {allowed}, not {short(value)}")


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`["optim.lr=0.1", "epochs=3"]` -> nested dict."""
    for pair in pairs:
        if "=" not in pair:
            raise DssmError(f"override {short(pair)}: expected key=value, e.g. optim.lr=0.05")
    return nest({key.strip(): value for key, value in (pair.split("=", 1) for pair in pairs)})


def nest(flat_values: dict[str, Any]) -> dict[str, Any]:
    """`{"optim.lr": 0.1, "epochs": 3}` -> `{"optim": {"lr": 0.1}, "epochs": 3}` (what `apply` takes)."""
    nested: dict[str, Any] = {}
    for key, value in flat_values.items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise DssmError(f"config {key}: {part} is a value, not a section")
        node[leaf] = value
    return nested


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key that a mapping repeats (plain YAML keeps the last, silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DssmError(f"key {short(key)} appears twice in one section (lines {seen[key]} and {line})")
            seen[key] = line
        return super().construct_mapping(node, deep)


def short(value: Any, limit: int = 60) -> str:
    """repr(value), cut to `limit` characters: an error names a value without printing all of it."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def read_yaml(path: Path) -> dict[str, Any]:
    if not Path(path).exists():
        raise DssmError(f"config file {path} does not exist")
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise DssmError(f"config file {path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    try:
        loaded = yaml.load(text, Loader=_UniqueKeys) or {}  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        raise DssmError(f"config file {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    except DssmError as e:
        raise DssmError(f"config file {path}: {e}") from None
    if not isinstance(loaded, dict):
        raise DssmError(f"config file {path}: expected a mapping at the top level")
    return loaded


def load(
    default: T, path: Path | None = None, overrides: list[str] | None = None, base: dict[str, Any] | None = None
) -> T:
    """`default`, then `base` (e.g. a saved config), then the YAML file, then the overrides."""
    cfg = default
    if base:
        cfg = apply(cfg, base)
    if path is not None:
        cfg = apply(cfg, read_yaml(path))
    return apply(cfg, parse_overrides(overrides or []))


def flat(cfg: Any) -> dict[str, Any]:
    """Dotted keys (as MLflow parameters)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}{k}.", v)
        else:
            out[prefix[:-1]] = value

    walk("", dataclasses.asdict(cfg))
    return out
