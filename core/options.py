"""Command-line options and docs tables generated from config dataclasses: one field is one option.

A field's help is the comment on its line (or the comment block right above it), as the config
modules already document their fields; its flag is its name with dashes (`skip_above` ->
`--skip-above`, one letter -> `-n`), its type and default come from the annotation and the
default, a `Literal[...]` annotation gives the choices and a bool gives `--x/--no-x`. The same
fields resolve YAML keys and KEY=VALUE overrides (core/config.py), so adding an option to a stage
is one commented field in its config dataclass: the flag, the key, `--help` and the docs table
(`config_table`, checked against docs/ by tests/test_options.py) follow from it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import io
import re
import textwrap
import tokenize
import typing
from collections.abc import Iterable
from typing import Any

from core.config import apply, convert, nest
from core.errors import DssmError


@functools.cache
def field_help(cls: type) -> dict[str, str]:
    """{field: its comment} from the class's source: the comment on the field's line(s), else the
    comment lines directly above it. Fields of base classes come from their own source."""
    helps: dict[str, str] = {}
    for base in reversed(cls.__mro__[1:]):
        if dataclasses.is_dataclass(base):
            helps.update(field_help(base))
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (a frozen app): flags keep their defaults as help
        return helps
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    for node in getattr(body, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        inline = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        above: list[str] = []
        n = node.lineno - 1
        while n in comments and lines[n - 1].lstrip().startswith("#"):
            above.insert(0, comments[n])
            n -= 1
        text = " ".join(inline or above)
        helps[node.target.id] = text
    return helps


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value) or "none"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, str):
        return value or '""'
    return str(value)


def _choices(hint: Any) -> tuple[Any, ...] | None:
    return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None


def converter(hint: Any, key: str):
    """An argparse `type=` that reads a flag's text as `hint` (core.config.convert), errors as argparse's."""

    def to_value(text: str) -> Any:
        try:
            return convert(text, hint, key)
        except DssmError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    to_value.__name__ = getattr(hint, "__name__", "value")  # argparse names it in "invalid X value"
    return to_value


def leaves(
    cls: type, prefix: str = "", skip: frozenset[str] = frozenset(), default: Any = None
) -> Iterable[tuple[str, Any, Any, str]]:
    """(dotted key, default, type hint, help) of every field of `cls` that holds a value, nested
    sections walked (with the defaults the enclosing config gives them), `skip`ped keys left out."""
    default, hints, helps = cls() if default is None else default, typing.get_type_hints(cls), field_help(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if key in skip:
            continue
        value = getattr(default, f.name)
        if dataclasses.is_dataclass(value):
            yield from leaves(type(value), key + ".", skip, value)
        else:
            yield key, value, hints[f.name], helps.get(f.name, "")


def add_config_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    skip: Iterable[str] = (),
    flatten: Iterable[str] = (),
) -> None:
    """A flag for every field of the dataclass `cls` (nested sections: `--SECTION.FIELD`, or the
    field's own flag for a section in `flatten`), stored under its dotted key and only when given
    (`config_from_options` builds the config from them). `skip`: fields (dotted) a command sets itself."""
    flatten = set(flatten)
    for key, value, hint, text in leaves(cls, skip=frozenset(skip)):
        parts = key.split(".")
        shown = [p for i, p in enumerate(parts[:-1]) if ".".join(parts[: i + 1]) not in flatten] + parts[-1:]
        flag = ".".join(shown).replace("_", "-")
        kwargs: dict[str, Any] = {"dest": key, "default": argparse.SUPPRESS}
        if hint is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
            text = f"{text} (default: {'on' if value else 'off'})".lstrip()
        else:
            choices = _choices(hint)
            kwargs |= {"type": converter(hint, key), "choices": choices}
            kwargs["metavar"] = "{" + ",".join(map(str, choices)) + "}" if choices else parts[-1].upper()
            text = f"{text} (default: {_shown(value)})".lstrip()
        parser.add_argument(f"-{flag}" if len(flag) == 1 else f"--{flag}", help=text.replace("%", "%%"), **kwargs)


def config_from_options(cls: type, args: argparse.Namespace, **values: Any) -> Any:
    """`cls()` with the flags of `add_config_options` that were given, then `values`."""
    keys = {f.name for f in dataclasses.fields(cls)}
    given = nest({k: v for k, v in vars(args).items() if k.split(".")[0] in keys})
    return dataclasses.replace(apply(cls(), given), **values) if values else apply(cls(), given)


def config_rows(cls: type, prefix: str = "", skip: Iterable[str] = ()) -> list[tuple[str, str, str]]:
    """(dotted key, help, default) of every field of `cls`, nested sections included."""
    return [(key, text, _shown(value)) for key, value, _, text in leaves(cls, prefix, frozenset(skip))]


def keys_text(cls: type, title: str) -> str:
    """Every key of `cls` with its default and help, one per line: a command's --help epilog."""
    rows = config_rows(cls)
    width = max(len(f"{key}={default}") for key, _, default in rows) + 2
    return "\n".join([title, *(f"  {f'{key}={default}':<{width}}{text}".rstrip() for key, text, default in rows)])


class HelpFormatter(argparse.HelpFormatter):
    """argparse's wrapping, except for paragraphs indented by two spaces (lists such as `keys_text`),
    which keep their lines."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for block in text.split("\n\n"):
            lines = block.splitlines()
            if len(lines) > 1 and all(line.startswith("  ") for line in lines[1:]):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(super()._fill_text(block, width, indent))
        return "\n\n".join(paragraphs)


def config_table(cls: type, prefix: str = "", skip: Iterable[str] = ()) -> str:
    """The Markdown table of `config_rows`: key, what it does, default."""
    lines = ["| key | what | default |", "|---|---|---|"]
    for key, text, default in config_rows(cls, prefix, skip):
        cell = text.replace("|", "\\|")
        lines.append(f"| `{key}` | {cell} | `{default}` |")
    return "\n".join(lines)


# A docs page holds a generated table between `<!-- keys: MODULE.CLASS [prefix=P] [skip=A,B] [own] -->`
# and `<!-- /keys -->`: every key of the class (`own`: only the fields it declares itself, not its
# bases'), regenerated by `python -m core.options FILE...` and checked by tests/test_options.py.
_BLOCK = re.compile(r"(<!-- keys: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- /keys -->)", re.S)


def _render(spec: str) -> str:
    import importlib

    target, *options = spec.split()
    module, _, name = target.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    settings = dict(o.split("=", 1) if "=" in o else (o, "") for o in options)
    prefix = settings.get("prefix", "")
    skip = {k for k in settings.get("skip", "").split(",") if k}
    if "own" in settings:
        bases = [b for b in cls.__mro__[1:] if dataclasses.is_dataclass(b)]
        skip |= {prefix + f.name for base in bases for f in dataclasses.fields(base)}
    return config_table(cls, prefix, skip) + "\n"


def render_docs(text: str) -> str:
    """`text` with every keys block regenerated from its class."""
    return _BLOCK.sub(lambda m: m.group(1) + _render(m.group("spec")) + m.group(4), text)


def main(paths: list[str]) -> int:
    """Regenerate the keys tables of the given docs pages in place; exit 1 when one changed."""
    from pathlib import Path

    changed = 0
    for path in map(Path, paths):
        before = path.read_text()
        after = render_docs(before)
        if after != before:
            path.write_text(after)
            print(f"{path}: keys tables regenerated")
            changed += 1
    return 1 if changed else 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
