"""Off-the-shelf vectors kept on disk by text, so a text embedded once is never embedded again.

MiniLM's vector of a text never changes for one release of its weights and libraries, and a run embeds
the same titles several times in several processes: evaluate scores its pairs and the whole catalogue,
the index stage embeds the catalogue again in Spark's Python workers, in other batches and another
order, and the next night does it all again. So the store is keyed by each text (`core.array_cache.text_key`),
not by a call's list: `$DSSM_CACHE/minilm/<release>/` is an `ArrayCache` (core/array_cache.py) whose entries
are shards, each the `keys` of its texts (int64) and their `vectors` (float32, n x dim), memory-mapped when
read. A writer adds a shard of the texts it had to embed; past MAX_SHARDS shards it merges them into one, so
the store holds few files however many small writers came. Each process keeps an index of the keys (which
shard, which row), read once per shard, so a warm read costs the texts asked for, not the shards on disk.
A shard that cannot be read is passed over with a warning (its texts are embedded again); one that cannot
be written costs only the next call's time (a read-only or full disk, a Spark executor's home). The store
holds at most MAX_BYTES, least recently used shards dropped first. DSSM_CACHE=off turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import uuid
from pathlib import Path

import numpy as np

from core.array_cache import ArrayCache, text_key, text_keys

log = logging.getLogger(__name__)

MAX_SHARDS = 16  # more are merged into one by the writer that finds them
MAX_BYTES = 8 << 30  # a million MiniLM vectors are 1.5 GB
SECRET = "dssm vector store"  # the shards' digest key: each shard is checked for shape and finite values on read


@functools.cache
def _release(packages: tuple[str, ...], variant: str = "") -> str:
    """A short hash of the packages' installed versions and `variant` (how the vectors are computed), read
    once per process."""
    from importlib.metadata import version

    blob = "".join(f"{p}=={version(p)}\n" for p in packages) + variant
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class VectorStore:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.cache = ArrayCache(self.folder, MAX_BYTES)
        self._index: dict[int, tuple[str, int]] = {}  # text key -> (shard, row), this process's
        self._indexed: dict[str, int] = {}  # shard -> its keys (0: unreadable)

    @classmethod
    def for_release(cls, name: str, packages: tuple[str, ...], variant: str = "") -> VectorStore | None:
        """The store of `name`'s vectors under these installed packages' versions and `variant` (e.g. the
        precision and code that compute them), or None where DSSM_CACHE turns caching off. One object per
        folder and process, which keeps its index of keys between calls."""
        root = os.environ.get("DSSM_CACHE")
        if root is None:
            root = str(Path.home() / ".cache" / "dssm")
        if root.lower() in ("off", "0", ""):
            return None
        return _store(Path(root) / name / _release(packages, variant))

    def _refresh(self) -> None:
        """The index brought up to the shards on disk: new shards' keys read, gone shards' dropped."""
        shards = [p.name for p in self.cache.entries()]
        if not set(self._indexed) <= set(shards):  # merged or trimmed away: index afresh
            self._index, self._indexed = {}, {}
        for shard in shards:
            if shard in self._indexed:
                continue
            self._indexed[shard] = 0  # once: a shard that cannot be read is not read again
            try:
                keys = np.load(self.cache.path(shard) / "keys.npy", mmap_mode="r", allow_pickle=False)
                if keys.dtype != np.int64 or keys.ndim != 1:
                    raise ValueError(f"keys of shape {keys.shape} and type {keys.dtype}")
                keys = np.asarray(keys)
                self._indexed[shard] = len(keys)
            except (OSError, ValueError, EOFError) as e:  # a crash can leave a file empty or cut short
                log.warning("vector cache shard %s unreadable (%s); its texts are embedded again", shard, e)
                continue
            for row, key in enumerate(keys.tolist()):
                self._index.setdefault(key, (shard, row))

    def read(self, texts: list[str], width: int | None = None) -> dict[str, np.ndarray]:
        """The stored vectors of those of `texts` that a whole shard (of vectors `width` wide) holds."""
        if not self.folder.is_dir():
            return {}
        self._refresh()
        wanted: dict[str, list[tuple[str, int]]] = {}
        for text in texts:
            where = self._index.get(text_key(text))
            if where is not None:
                wanted.setdefault(where[0], []).append((text, where[1]))
        found: dict[str, np.ndarray] = {}
        for shard, rows in wanted.items():
            try:
                arrays = self.cache.get(shard, SECRET, verify=False, names=("vectors",))
                if arrays is None:  # merged away since: its texts come from the merged shard next time
                    continue
                vectors = arrays["vectors"]
                if vectors.ndim != 2 or len(vectors) != self._indexed[shard]:
                    raise ValueError(f"vectors of shape {vectors.shape} do not match the keys")
                if width is not None and vectors.shape[1] != width:
                    continue  # another embedder's width: not these texts' vectors
                taken = np.asarray(vectors[[row for _, row in rows]], dtype=np.float32)
                if not np.isfinite(taken).all():  # a damaged shard of the right shape: NaN or inf vectors
                    raise ValueError("vectors that are not finite")
            except (OSError, ValueError, EOFError) as e:
                log.warning("vector cache shard %s unreadable (%s); its texts are embedded again", shard, e)
                self._index = {k: v for k, v in self._index.items() if v[0] != shard}
                continue
            found.update(zip((text for text, _ in rows), taken, strict=True))
        return found

    def write(self, texts: list[str], vectors: np.ndarray) -> None:
        """A new shard of `texts` (distinct) and their vectors; past MAX_SHARDS shards, all merged into one."""
        if not texts:
            return
        shard = {"keys": text_keys(texts), "vectors": np.asarray(vectors, dtype=np.float32)}
        try:
            with self.cache.locked():
                for legacy in self.folder.glob("*.npy"):  # shards of the format before issue 75, never read now
                    legacy.unlink(missing_ok=True)
                self.cache.put(f"{os.getpid()}-{uuid.uuid4().hex}", shard, SECRET)
                if len(self.cache.entries()) > MAX_SHARDS:
                    self._merge()
        except OSError as e:
            log.warning("vector cache %s not written (%s)", self.folder, e)

    def _merge(self) -> None:
        """Every readable shard as one (under the lock): the first vector of each key kept."""
        shards = self.cache.entries()
        keys, vectors = [], []
        for shard in shards:
            try:
                arrays = self.cache.get(shard.name, SECRET, verify=False) or {}
                if arrays.get("vectors") is not None and len(arrays["vectors"]) == len(arrays.get("keys", ())):
                    keys.append(np.asarray(arrays["keys"]))
                    vectors.append(np.asarray(arrays["vectors"]))
            except (OSError, ValueError, EOFError):
                pass  # a damaged shard goes with the rest
        widths = {v.shape[1] for v in vectors if v.ndim == 2}
        if len(widths) == 1:
            merged_keys = np.concatenate(keys)
            _, first = np.unique(merged_keys, return_index=True)
            merged = {"keys": merged_keys[first], "vectors": np.concatenate(vectors)[first]}
            self.cache.put(f"merged-{uuid.uuid4().hex}", merged, SECRET)
        for shard in shards:
            self.cache.drop(shard.name)


@functools.cache
def _store(folder: Path) -> VectorStore:
    return VectorStore(folder)
