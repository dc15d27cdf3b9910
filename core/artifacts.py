"""Stage outputs: one skeleton (`publish`), their manifests, content hashes and code fingerprints.

Every stage goes through `publish`: it returns the finished manifest when the output is up to date
(same input key, every listed file present with its size); otherwise it builds the output in a
hidden temporary sibling directory, writes the manifest there, and only then renames the whole
directory into place. A reader never sees a partial output or an output without its manifest, and
a killed run leaves only a temp dir that the next run removes.

An input key covers what determines an output: the input content hashes, the parameters, and the
code that produced it — the source of the stage's module and of every project module it imports
(`code_fingerprint`), chained with the code of the stages upstream, so an edit to a stage's code
recomputes that stage and everything downstream of it, and nothing upstream.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from core.errors import DssmError, naming_full_disk
from core.locks import output_lock

MANIFEST = "manifest.json"
# The packages whose source makes up the product; tests, docs, benchmarks, reproductions and studies are not.
PROJECT_PACKAGES = (
    "core", "modeling", "scoring", "stages", "service", "flows", "infra", "dssm"
)  # fmt: skip
FAULT_ENV = "DSSM_FAULT_BEFORE_PUBLISH"  # fault injection: SIGKILL a stage between write and rename
_HASH_CHUNK = 1 << 20
log = logging.getLogger(__name__)


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


def file_sha256s(root: Path) -> dict[str, str]:
    """The sha256 of each data file of a file or directory, by path relative to the directory."""
    base = root if root.is_dir() else root.parent
    return {str(path.relative_to(base)): sha256_file(path) for path in data_files(root)}


def content_sha256(root: Path, hashes: dict[str, str] | None = None) -> str:
    """One hash over relative paths and bytes of a file or a directory's data files (from `hashes`,
    their `file_sha256s`, when the caller has them)."""
    digest = hashlib.sha256()
    for name, sha in (file_sha256s(root) if hashes is None else hashes).items():
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(sha.encode())
    return digest.hexdigest()


# --- code fingerprints -------------------------------------------------------------------------


def _source(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


def _imported(tree: ast.AST) -> set[str]:
    """Project modules named by the imports of a module, at any depth (lazy imports in functions too)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}  # `from pkg import module`
    return {n for n in names if n.split(".")[0] in PROJECT_PACKAGES}


@cache
def code_modules(root: str) -> tuple[str, ...]:
    """`root` and every project module it imports, transitively (with their packages' __init__)."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ first
            module = ".".join(parts[:i])
            if module in seen or (path := _source(module)) is None:
                continue
            seen.add(module)
            todo += _imported(ast.parse(path.read_text()))
    return tuple(sorted(seen))


def module_sha256(module: str) -> str:
    """The hash of one module's source file (a seam for tests that pretend an edit)."""
    path = _source(module)
    if path is None:
        return ""
    st = path.stat()
    return _source_sha256(path, st.st_mtime_ns, st.st_size)


@cache
def _source_sha256(path: Path, mtime_ns: int, size: int) -> str:
    """Hashed once per version of a file: every stage and MLflow tag of a run asks again."""
    return sha256_file(path)


def code_fingerprint(root: str) -> str:
    """sha256 over the source of `root` and every project module it imports."""
    digest = hashlib.sha256()
    for module in code_modules(root):
        digest.update(f"{module}\0{module_sha256(module)}\n".encode())
    return digest.hexdigest()


def lineage(code: str, upstream: list[dict[str, Any]]) -> str:
    """The code behind an output: its own fingerprint chained with its inputs' (their manifests)."""
    chain = [code, *sorted(m.get("code_sha256", "") for m in upstream)]
    return hashlib.sha256("\n".join(chain).encode()).hexdigest()


def input_key(stage: str, inputs: dict[str, Any], params: dict[str, Any], code: str) -> str:
    """What determines a stage's output: the code behind it, its input hashes and its parameters."""
    blob = json.dumps({"stage": stage, "code": code, "inputs": inputs, "params": params}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


# --- manifests ---------------------------------------------------------------------------------


def read_manifest(output: Path) -> dict[str, Any] | None:
    """The manifest of `output`, or None when there is none or it cannot be read (then nothing is up to date)."""
    path = Path(output) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("%s is unreadable (%s): treated as no manifest", path, e)
        return None
    return manifest if isinstance(manifest, dict) else None


def damage(output: Path, manifest: dict[str, Any]) -> str | None:
    """What is wrong with the files a manifest lists (missing, other size), or None when all are there.
    A check of names and sizes only: cheap enough for every up-to-date decision."""
    for name, size in (manifest.get("files") or {}).items():
        path = Path(output) / name
        try:
            actual = path.stat().st_size
        except FileNotFoundError:
            return f"{path} is missing"
        if actual != size:
            return f"{path} has {actual} bytes, the manifest says {size}"
    return None


def altered(output: Path, manifest: dict[str, Any]) -> str | None:
    """What differs from the files a manifest lists, byte for byte (a file missing, of another size or
    other content, or a data file it does not list), or None when the output is as it was written.
    Reads every file: for an output served as a whole (an index), where one file swapped in from
    another output, or a same-size corruption, must not pass as the output `damage` sees."""
    problem = damage(output, manifest)
    if problem:
        return problem
    recorded = manifest.get("file_sha256")
    if recorded is None:  # refusing it would stop the run that rebuilds it (its code changed) at `dssm mine`
        log.warning("%s: written before manifests held file hashes; its files are checked by size only", output)
        return None
    if not isinstance(recorded, dict):
        return f"{Path(output) / MANIFEST} has no readable file hashes"
    actual = file_sha256s(Path(output))
    for name, sha in recorded.items():
        if actual.get(name) != sha:
            return f"{Path(output) / name} is not the file this output was built with (its sha256 differs)"
    for name in actual.keys() - recorded.keys():
        return f"{Path(output) / name} is not part of this output (its manifest does not list it)"
    return None


def require_manifest(output: Path, stage: str, content: bool = False) -> dict[str, Any]:
    """The manifest of a finished, intact upstream output, or a clear error naming what to run;
    with `content`, every file is hashed and compared with the manifest's hashes (`altered`)."""
    manifest = read_manifest(output)
    if manifest is None:
        raise DssmError(f"{output}: no `dssm {stage}` output here (no readable {MANIFEST}); run `dssm {stage}` first")
    if manifest.get("stage") != stage:
        raise DssmError(f"{output}: expected a `dssm {stage}` output, found {manifest.get('stage')!r}")
    problem = altered(output, manifest) if content else damage(output, manifest)
    if problem:
        raise DssmError(f"{output} is damaged: {problem}; run `dssm {stage} --force` to rebuild it")
    return manifest


def up_to_date(output: Path, key: str, content: bool = False) -> dict[str, Any] | None:
    """The manifest when `output` holds the result of `key` intact, else None (and why, in the log);
    with `content`, every file's hash is checked too (a same-size corruption passes the size check)."""
    manifest = read_manifest(output)
    if manifest is None or manifest.get("input_key") != key:
        return None
    problem = altered(output, manifest) if content else damage(output, manifest)
    if problem:
        log.warning("%s is damaged (%s): recomputing it", output, problem)
        return None
    return manifest


def write_manifest(directory: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    files = data_files(directory)
    hashes = file_sha256s(directory)  # hashed anyway for content_sha256; kept so `altered` can name a file
    manifest = {
        **manifest,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "content_sha256": content_sha256(directory, hashes),
        "files": {str(p.relative_to(directory)): p.stat().st_size for p in files},
        "file_sha256": hashes,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def amend_manifest(output: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """A published output's manifest with `fields` added (what a stage learns after the rename, such as
    where it registered the output), replaced atomically; its file sizes and hashes stay as written."""
    output = Path(output)
    manifest = (read_manifest(output) or {}) | fields
    tmp = output / f".{MANIFEST}.tmp-{uuid.uuid4().hex[:12]}"  # hidden: never one of the output's data files
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, output / MANIFEST)
    return manifest


# --- the one stage skeleton --------------------------------------------------------------------


def publish(
    out: Path,
    stage: str,
    code: str,
    inputs: dict[str, dict[str, Any]],
    params: dict[str, Any],
    build: Callable[[Path], dict[str, Any]],
    force: bool = False,
    upstream: list[dict[str, Any]] | None = None,
    verify_content: bool = False,
) -> dict[str, Any]:
    """Up-to-date check -> temp dir -> `build(tmp)` -> manifest -> atomic rename; returns the manifest.
    A full disk (ENOSPC, EDQUOT) while building fails with a DssmError naming `out`.

    code: `code_fingerprint` of the stage's module; inputs: name -> {"path", "sha256", ...} (the
    hashes enter the key); upstream: the manifests of the stage outputs read (their code is chained
    in). `build` writes the output's files into the temp dir and returns the manifest's other fields
    (counts, outputs, ...). The manifest records `skipped` only in what this returns. verify_content:
    the up-to-date check hashes every file (an output served as it is, such as the index).
    """
    out = Path(out)
    chained = lineage(code, upstream or [])
    key = input_key(stage, {k: v.get("sha256") for k, v in inputs.items()}, params, chained)
    with output_lock(out):  # a second writer of `out` fails here, naming this one (core/locks.py)
        if not force:
            done = up_to_date(out, key, verify_content)
            if done is not None:
                log.info("%s: %s is up to date, nothing to do", stage, out)
                return done | {"skipped": True}
        with naming_full_disk(out), atomic_dir(out) as tmp:
            fields = build(tmp)
            base = {"stage": stage, "input_key": key, "code_sha256": chained, "inputs": inputs, "params": params}
            manifest = write_manifest(tmp, {**base, **fields})
            before_publish(stage, tmp)
        return manifest | {"skipped": False}


def before_publish(stage: str, tmp: Path) -> None:
    """The fault-injection point between write and rename: `DSSM_FAULT_BEFORE_PUBLISH=STAGE` kills the
    process here with SIGKILL (no cleanup runs), as a crash or an OOM kill would."""
    if os.environ.get(FAULT_ENV) in (stage, "*"):
        os.kill(os.getpid(), signal.SIGKILL)


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
