"""Off-the-shelf vectors kept on disk by text, so a text embedded once is never embedded again.

MiniLM's vector of a text never changes for one release of its weights and libraries, and a run embeds
the same titles several times in several processes: evaluate scores its pairs and the whole catalogue,
the index stage embeds the catalogue again in Spark's Python workers, in other batches and another
order, and the next night does it all again. So the store is keyed by each text, not by a call's list:
`$DSSM_CACHE/minilm/<release>/` holds shards, each a pair of numpy files (no pickle): `NAME.keys.npy`,
the sha256 of each text (uint8, n x 32), and `NAME.vectors.npy`, their vectors (float32, n x dim).
A writer adds a shard of the texts it had to embed, vectors first and keys last, each renamed into
place, so a reader only sees whole shards; two writers never share a name. A shard that cannot be read
is passed over with a warning (its texts are embedded again); one that cannot be written costs only
the next call's time (a read-only or full disk, a Spark executor's home). DSSM_CACHE=off turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import uuid
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def text_key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


@functools.cache
def _release(packages: tuple[str, ...], variant: str = "") -> str:
    """A short hash of the packages' installed versions and `variant` (how the vectors are computed), read
    once per process."""
    from importlib.metadata import version

    blob = "".join(f"{p}=={version(p)}\n" for p in packages) + variant
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class VectorStore:
    def __init__(self, folder: Path):
        self.folder = folder

    @classmethod
    def for_release(cls, name: str, packages: tuple[str, ...], variant: str = "") -> VectorStore | None:
        """The store of `name`'s vectors under these installed packages' versions and `variant` (e.g. the
        precision and code that compute them), or None where DSSM_CACHE turns caching off."""
        root = os.environ.get("DSSM_CACHE")
        if root is None:
            root = str(Path.home() / ".cache" / "dssm")
        if root.lower() in ("off", "0", ""):
            return None
        return cls(Path(root) / name / _release(packages, variant))

    def read(self, texts: list[str], width: int | None = None) -> dict[str, np.ndarray]:
        """The stored vectors of those of `texts` that any whole shard (of vectors `width` wide) holds."""
        wanted = {text_key(t): t for t in texts}
        found: dict[str, np.ndarray] = {}
        try:
            shards = sorted(self.folder.glob("*.keys.npy")) if self.folder.is_dir() else []
        except OSError as e:  # a folder this process may not read (a Spark executor's user)
            log.warning("vector cache %s unreadable (%s)", self.folder, e)
            shards = []
        for keys_file in shards:
            vectors_file = keys_file.with_name(keys_file.name.removesuffix(".keys.npy") + ".vectors.npy")
            try:  # a crash can leave any file empty or cut short: numpy raises more than OSError for it
                keys = np.load(keys_file, allow_pickle=False)
                if keys.dtype != np.uint8 or keys.ndim != 2 or keys.shape[1] != 32:
                    raise ValueError(f"keys of shape {keys.shape} and type {keys.dtype}")
                rows = [(i, k) for i, k in enumerate(map(bytes, keys)) if k in wanted]
                if not rows:
                    continue
                vectors = np.load(vectors_file, mmap_mode="r", allow_pickle=False)
                if vectors.ndim != 2 or len(vectors) != len(keys) or (width is not None and vectors.shape[1] != width):
                    raise ValueError(f"{len(keys)} keys do not match vectors of shape {vectors.shape}")
                taken = np.asarray(vectors[[i for i, _ in rows]], dtype=np.float32)
                if not np.isfinite(taken).all():  # a damaged shard of the right shape: NaN or inf vectors
                    raise ValueError("vectors that are not finite")
            except (OSError, ValueError, EOFError, TypeError) as e:
                log.warning("vector cache shard %s unreadable (%s); its texts are embedded again", keys_file, e)
                continue
            for (_, key), vector in zip(rows, taken, strict=True):
                text = wanted.pop(key, None)  # None: a key this shard repeats
                if text is not None:
                    found[text] = vector
            if not wanted:
                break
        return found

    def write(self, texts: list[str], vectors: np.ndarray) -> None:
        """A new shard of `texts` (distinct) and their vectors."""
        if not texts:
            return
        name = f"{os.getpid()}-{uuid.uuid4().hex}"
        keys = np.frombuffer(b"".join(map(text_key, texts)), dtype=np.uint8).reshape(len(texts), 32)
        written = []
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for suffix, array in ((".vectors.npy", np.asarray(vectors, dtype=np.float32)), (".keys.npy", keys)):
                final = self.folder / f"{name}{suffix}"
                tmp = final.with_name(f".{final.name}.tmp")
                with open(tmp, "wb") as f:
                    np.save(f, array, allow_pickle=False)
                os.replace(tmp, final)
                written.append(final)
        except OSError as e:
            log.warning("vector cache %s not written (%s)", self.folder, e)
            for path in [*written, *self.folder.glob(f".{name}.*.tmp")]:
                path.unlink(missing_ok=True)
