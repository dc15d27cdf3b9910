"""Arrays kept on disk by key and memory-mapped when read: the one cache of the project's derived arrays.

An entry is a folder `FOLDER/KEY/` of numpy files (`NAME.npy`, never pickled) and `digest.npy`, a blake2b of
every array keyed by KEY's secret (what the entry was made from): a file damaged, edited, or copied from
another entry does not match it and is refused. A writer builds the entry in a temporary folder and renames
it into place under the cache's lock, so a reader sees a whole entry or none. Reads map the files
(`mmap_mode="r"`): processes that read one entry (DDP ranks, their loader workers, Spark's Python
workers) share its pages in the OS's page cache instead of holding a copy each. The cache keeps at most
`max_bytes` on disk, dropping the least recently used entries; its users:

- modeling/tokens.py: a `dssm negatives` output tokenised once, in `tokens/` beside it (WORKDIR/tokens);
- scoring/vector_store.py: MiniLM's vectors by text, under the user's cache (`$DSSM_CACHE`, default
  ~/.cache/dssm), which every process of the machine shares, Spark's executors included.

`text_key` is the one key of a text across the project (the token cache's collision masks, the vector
store's index).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

DIGEST = "digest"


def text_key(text: str) -> int:
    """A signed 64-bit hash of `text`, the same in every process (Python's hash() is salted per process)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def text_keys(texts: list[str]) -> np.ndarray:
    """`text_key` of each text, as int64."""
    return np.fromiter((text_key(t) for t in texts), np.int64, len(texts))


def digest(arrays: dict[str, np.ndarray], secret: str) -> np.ndarray:
    """blake2b of every array (name, dtype, shape, bytes), keyed by `secret`."""
    h = hashlib.blake2b(key=secret.encode()[:64], digest_size=32)
    for name in sorted(k for k in arrays if k != DIGEST):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(memoryview(a).cast("B") if a.size else b"")
    return np.frombuffer(h.digest(), np.uint8)


class ArrayCache:
    """Entries of named arrays under `folder`, at most `max_bytes` of them (0: no bound)."""

    def __init__(self, folder: Path, max_bytes: int = 0):
        self.folder = Path(folder)
        self.max_bytes = max_bytes

    @contextmanager
    def locked(self) -> Iterator[None]:
        """The cache's lock (a file beside its entries): one writer or trimmer at a time, across processes."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def path(self, key: str) -> Path:
        return self.folder / key

    def entries(self) -> list[Path]:
        """The whole entries, oldest first by last use."""
        try:
            found = [p for p in self.folder.iterdir() if p.is_dir() and not p.name.startswith(".")]
        except OSError:
            return []
        return sorted(found, key=lambda p: (_mtime(p), p.name))

    def get(
        self, key: str, secret: str, verify: bool = True, names: tuple[str, ...] = ()
    ) -> dict[str, np.ndarray] | None:
        """The entry `key`'s arrays (those in `names`, or all), memory-mapped; None when there is none. One
        that is damaged or does not match its digest under `secret` raises ValueError (the caller rebuilds
        it). `verify=False` skips the digest, for a process that re-opens an entry another one checked
        moments ago, or a reader that checks what it takes (the vector store: finite values)."""
        folder = self.path(key)
        if not folder.is_dir():
            return None
        files = [folder / f"{name}.npy" for name in names] if names and not verify else folder.glob("*.npy")
        arrays = {}
        for file in files:
            try:  # allow_pickle=False: an object array (pickled code) is refused, never run
                arrays[file.name.removesuffix(".npy")] = np.load(file, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError, EOFError) as e:
                raise ValueError(f"{file}: {e}") from None
        if verify and (DIGEST not in arrays or not np.array_equal(arrays[DIGEST], digest(arrays, secret))):
            raise ValueError("its arrays do not match their digest (damaged, edited, or made from other inputs)")
        arrays.pop(DIGEST, None)
        try:
            os.utime(folder)  # the newest used stays when older ones are trimmed
        except OSError:
            pass
        return arrays

    def put(self, key: str, arrays: dict[str, np.ndarray], secret: str) -> Path:
        """Write entry `key` (replacing one there), then trim the cache; call under `locked()`."""
        final = self.path(key)
        tmp = self.folder / f".{key}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            for name, array in {**arrays, DIGEST: digest(arrays, secret)}.items():
                with open(tmp / f"{name}.npy", "wb") as handle:
                    np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
                    handle.flush()
                    os.fsync(handle.fileno())  # a crash after the rename never leaves a truncated entry
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.trim(keep=final)
        return final

    def drop(self, key: str) -> None:
        shutil.rmtree(self.path(key), ignore_errors=True)

    def trim(self, keep: Path | None = None) -> None:
        """Least recently used entries go until the cache holds at most `max_bytes` (`keep` stays); temporary
        folders of killed writers go too. Call under `locked()`."""
        for tmp in self.folder.glob(".*.tmp"):
            shutil.rmtree(tmp, ignore_errors=True)
        if not self.max_bytes:
            return
        entries = self.entries()
        sizes = {p: sum(f.stat().st_size for f in p.iterdir()) for p in entries}
        total = sum(sizes.values())
        for entry in entries:
            if total <= self.max_bytes:
                break
            if entry != keep:
                shutil.rmtree(entry, ignore_errors=True)
                total -= sizes[entry]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
