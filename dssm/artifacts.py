"""Atomic stage outputs, their manifests and content hashes.

A stage writes into a hidden temporary sibling of its output directory and renames it into
place only when everything, manifest included, is written: a reader never sees a partial
output, and a killed run leaves only a temp dir that the next run removes. A manifest records
what went in (paths, content hashes, parameters) and what came out (row counts, schemas,
content hash); a rerun whose inputs and parameters match the manifest is a no-op.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dssm
from dssm.errors import DssmError

MANIFEST = "manifest.json"
_HASH_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def data_files(root: Path) -> list[Path]:
    """Files that make up a dataset: everything but manifests and hidden bookkeeping files."""
    if root.is_file():
        return [root]
    return sorted(
        p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST and not p.name.startswith((".", "_"))
    )


def content_sha256(root: Path) -> str:
    """One hash over relative paths and bytes of a file or a directory's data files."""
    digest = hashlib.sha256()
    base = root if root.is_dir() else root.parent
    for path in data_files(root):
        digest.update(str(path.relative_to(base)).encode())
        digest.update(b"\0")
        digest.update(sha256_file(path).encode())
    return digest.hexdigest()


def input_key(stage: str, inputs: dict[str, str], params: dict[str, Any]) -> str:
    """What determines a stage's output: its code version, input hashes and parameters."""
    blob = json.dumps(
        {"stage": stage, "code": dssm.__version__, "inputs": inputs, "params": params},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def read_manifest(output: Path) -> dict[str, Any] | None:
    path = output / MANIFEST
    if not path.exists():
        return None
    return json.loads(path.read_text())


def require_manifest(output: Path, stage: str) -> dict[str, Any]:
    """The manifest of a finished upstream stage, or a clear error naming what to run."""
    manifest = read_manifest(output)
    if manifest is None:
        raise DssmError(f"{output}: no finished `dssm {stage}` output here (no {MANIFEST}); run `dssm {stage}` first")
    if manifest.get("stage") != stage:
        raise DssmError(f"{output}: expected a `dssm {stage}` output, found {manifest.get('stage')!r}")
    return manifest


def is_up_to_date(output: Path, key: str) -> bool:
    manifest = read_manifest(output)
    return manifest is not None and manifest.get("input_key") == key


def write_manifest(directory: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    manifest = {
        **manifest,
        "code_version": dssm.__version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "content_sha256": content_sha256(directory),
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _remove_stale_temps(final: Path) -> None:
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temp dir; on success it replaces `final` by rename, on failure it is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(final)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        # Two renames: readers see the old output or the new one, never a mix.
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:12]}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
