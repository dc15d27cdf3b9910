"""Reading a judged set: (query, title, label) rows from a CSV/TSV file or a .zip holding one.

Every command that reads a judged set takes the same four options (see `add_judgment_options`);
the defaults read Home Depot's `train.csv.zip` as it is (PROTOCOL.md §1).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from core.artifacts import sha256_file
from core.errors import DssmError

# the embedded judged set: a run without judgments.path evaluates on it and simulates its logs from it
DEFAULT_CATALOGUE = Path(__file__).resolve().parents[1] / "dssm" / "data" / "default_catalogue.csv"


@dataclass(frozen=True)
class JudgedSetSpec:
    """Where a judged set keeps its columns and how its bytes are encoded."""

    query_col: str = "search_term"  # the query column (Home Depot's train.csv names as defaults)
    title_col: str = "product_title"  # the title column
    label_col: str = "relevance"  # the graded label column (higher: more relevant)
    encoding: str = "latin-1"  # the file's text encoding


@dataclass(frozen=True)
class JudgedPair:
    row: int  # position in the input file: PROTOCOL.md's stable tie order
    query: str
    title: str
    label: float


def add_judgment_options(parser: argparse.ArgumentParser) -> None:
    """The four options shared by every command that reads a judged set: JudgedSetSpec's fields."""
    from core.options import add_config_options

    add_config_options(parser.add_argument_group("judged set columns"), JudgedSetSpec)


def spec_from_args(args: argparse.Namespace) -> JudgedSetSpec:
    from core.options import config_from_options

    return config_from_options(JudgedSetSpec, args)


def _open_text(path: Path, encoding: str) -> tuple[io.TextIOBase, str]:
    """The judged table as text plus the name of the member read (for a .zip)."""
    if zipfile.is_zipfile(path):
        archive = zipfile.ZipFile(path)
        members = [m for m in archive.namelist() if m.lower().endswith((".csv", ".tsv", ".txt"))]
        if len(members) != 1:
            raise DssmError(f"{path}: expected one .csv/.tsv inside the zip, found {members or 'none'}")
        try:  # a damaged member decompresses to garbage long before its CRC is checked at the end
            damaged = archive.testzip()
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
            damaged = f"{members[0]} ({e})"
        if damaged:
            raise DssmError(f"{path}: the zip is damaged ({damaged} fails its integrity check)")
        raw = archive.open(members[0])
        return io.TextIOWrapper(raw, encoding=encoding, newline=""), members[0]
    return open(path, encoding=encoding, newline=""), path.name


def iter_judgments(path: str | Path, spec: JudgedSetSpec = JudgedSetSpec()) -> Iterator[JudgedPair]:
    """Yield the judged pairs of `path` in file order; a clear DssmError on any problem."""
    path = Path(path)
    if not path.exists():
        raise DssmError(f"judged set not found: {path}")
    if path.is_dir() or path.stat().st_size == 0:
        raise DssmError(f"judged set is empty or not a file: {path}")
    try:
        handle, member = _open_text(path, spec.encoding)
    except LookupError as e:
        raise DssmError(f"unknown encoding {spec.encoding!r}: {e}") from None
    with handle:
        try:
            delimiter = "\t" if member.lower().endswith(".tsv") else ","
            reader = csv.DictReader(handle, delimiter=delimiter)
            header = reader.fieldnames or []
            missing = [c for c in (spec.query_col, spec.title_col, spec.label_col) if c not in header]
            if missing:
                shown = ", ".join(header[:12]) if header else "no header"
                raise DssmError(
                    f"{path}: missing column(s) {', '.join(missing)}; the file has: {shown} "
                    "(set --query-col/--title-col/--label-col)"
                )
            for row_no, row in enumerate(reader):
                raw_label = row[spec.label_col]
                try:
                    label = float(raw_label)
                except (TypeError, ValueError):
                    label = math.nan
                if not math.isfinite(label):
                    raise DssmError(
                        f"{path}: row {row_no + 2}: label {raw_label!r} in column {spec.label_col!r} is not a number"
                    )
                yield JudgedPair(row_no, row[spec.query_col] or "", row[spec.title_col] or "", label)
        except UnicodeDecodeError as e:
            raise DssmError(f"{path}: not readable as {spec.encoding} ({e.reason}); set --encoding") from None
        except csv.Error as e:
            raise DssmError(f"{path}: not a readable CSV/TSV ({e})") from None


def read_judgments(path: str | Path, spec: JudgedSetSpec = JudgedSetSpec()) -> list[JudgedPair]:
    pairs = list(iter_judgments(path, spec))
    if not pairs:
        raise DssmError(f"judged set has a header but no rows: {path}")
    return pairs


@cache
def _read_cached(path: str, spec: JudgedSetSpec, sha256: str) -> tuple[JudgedPair, ...]:
    return tuple(read_judgments(path, spec))


def dataset_name(path: Path | str) -> str:
    """A readable default name: `homedepot-search-relevance/train.csv.zip` → homedepot-search-relevance-train."""
    path = Path(path)
    stem = path.name.split(".")[0]
    return f"{path.parent.name}-{stem}" if path.parent.name not in ("", ".") else stem


@dataclass(frozen=True)
class JudgedSet:
    """A judged set resolved once per run: where it is, how to read it, its content hash and name."""

    path: str
    spec: JudgedSetSpec
    sha256: str
    name: str  # the MLflow experiment and `dataset` tag of the runs made from it
    embedded: bool = False  # the project's default catalogue
    graded_from: str = "labels"  # "clicks": graded from the logs by the judge stage (stages/judge/)
    test_day: str = ""  # graded from clicks of this day alone, which training did not read (judge.split=time)

    def pairs(self) -> list[JudgedPair]:
        """Its rows, parsed once per process (keyed by content hash: a changed file is read anew)."""
        if not self.sha256:
            raise DssmError(f"judged set {self.name} is not written yet ({self.path})")
        return list(_read_cached(self.path, self.spec, self.sha256))

    def describe(self) -> dict[str, Any]:
        """What a manifest records of it."""
        described = {"path": self.path, "sha256": self.sha256, "spec": asdict(self.spec)}
        clicks = {"graded_from": self.graded_from} if self.graded_from != "labels" else {}
        day = {"test_day": self.test_day} if self.test_day else {}
        return described | {"embedded_default": self.embedded} | clicks | day


def resolve_judged_set(
    path: str | Path | None,
    spec: JudgedSetSpec = JudgedSetSpec(),
    default: Path | None = None,
    default_name: str = "default-catalogue",
) -> JudgedSet:
    """The judged set at `path` (None or "": `default`, named `default_name`), hashed once."""
    if not path and default is None:
        raise DssmError("no judged set given")
    chosen = Path(path) if path else Path(default)
    if not chosen.is_file():
        raise DssmError(f"judged set not found: {chosen}")
    sha256 = sha256_file(chosen)
    # the embedded set given by its file name (or a copy of it) is the embedded set: one name, one registered model
    embedded = not path or sha256 == _embedded_sha256()
    return JudgedSet(str(chosen), spec, sha256, default_name if embedded else dataset_name(chosen), embedded)


@cache
def _embedded_sha256() -> str:
    return sha256_file(DEFAULT_CATALOGUE) if DEFAULT_CATALOGUE.is_file() else ""


# The judged set the judge stage grades from a run's clicks: every stage that evaluates reads it.
JUDGED_FILE = "judged.csv"  # in the judge stage's output directory
CLICK_SCALE = (1.0, 3.0)  # the grades' scale: never clicked .. clicked whenever examined (Home Depot's 1..3)
CLICK_RELEVANT = 2.5  # the midpoint of the scale, as Home Depot's: what counts as relevant for MRR, MAP and recall
CLICK_SPEC = JudgedSetSpec(encoding="utf-8")  # how judged.csv is written and read: Home Depot's column names, UTF-8


def click_judged_set(output: str | Path, sha256: str, name: str, test_day: str = "") -> JudgedSet:
    """The judged set a judge stage wrote to `output` (judged.csv's sha256; "" before it is written),
    read as it was written: Home Depot's column names, UTF-8."""
    return JudgedSet(str(Path(output) / JUDGED_FILE), CLICK_SPEC, sha256, name, graded_from="clicks", test_day=test_day)


def judged_set(run_judged: JudgedSet, judge_output: str | Path | None) -> JudgedSet:
    """What a stage evaluates on: the run's judged set, or the one the judge stage graded into
    `judge_output` (named as the run's)."""
    if judge_output is None:
        return run_judged
    from core.artifacts import read_manifest

    manifest = read_manifest(Path(judge_output))
    hashes = manifest["file_sha256"]  # judged.csv's own, as `dssm evaluate` of it hashes it
    return click_judged_set(judge_output, hashes[JUDGED_FILE], run_judged.name, manifest.get("test_day", ""))


def clicks_dataset_name(logs: str) -> str:
    """The name of the judged set graded from `logs` (a file, dir or glob): its MLflow experiment and
    `dataset` tag, e.g. /data/search-logs/*.jsonl.gz -> search-logs-clicks."""
    path = Path(logs)
    while path.name and any(c in path.name for c in "*?["):
        path = path.parent
    stem = path.name.split(".")[0] if path.is_file() or "." in path.name else path.name
    return f"{stem or 'logs'}-clicks"
