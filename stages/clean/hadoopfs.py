"""Paths on any Hadoop FileSystem (`file://`, `hdfs://`, `s3a://`, a relative path), through Spark's
JVM: what a Spark job that reads them sees, listed and fingerprinted without reading their bytes.

A relative path is qualified by its FileSystem (`makeQualified`: against the default file system's
working directory), as Spark qualifies it when it reads the path, so both name the same files.

A fingerprint stands for a directory's content without reading it: one hash over each data file's
relative name, length, modification time and, where the file system keeps one (HDFS: an MD5 of its
block CRCs), its checksum, as Spark's and Hive's file indexes tell a changed file. A rewritten file
therefore changes the fingerprint (a new length, a new modification time); a file whose bytes
change in place with the same length and modification time, on a file system without checksums
(local disks, S3 by default), does not.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from core.artifacts import MANIFEST


@dataclass(frozen=True)
class FileInfo:
    """One data file under a listed directory."""

    name: str  # relative to the listed directory, `/`-separated
    length: int
    mtime_ms: int
    checksum: str | None  # ALGORITHM:HEX where the file system keeps one, else None


def hidden(name: str) -> bool:
    """Names Spark's file index skips (`_SUCCESS`, `.crc`, a `_temporary/` directory) and a stage's
    manifest: not data. Any component of a relative path counts, as Spark skips whole directories."""
    parts = name.split("/")
    return parts[-1] == MANIFEST or any(p.startswith((".", "_")) for p in parts)


class HadoopPath:
    """A path on the Hadoop FileSystem its scheme names (none: Hadoop's default file system)."""

    def __init__(self, spark: Any, uri: str, _parent: HadoopPath | None = None, _child: str = ""):
        self.uri = uri  # as given: what messages and manifests show
        if _parent is not None:
            self._jvm, self._fs = _parent._jvm, _parent._fs
            self._path = self._jvm.org.apache.hadoop.fs.Path(_parent._path, _child)
            return
        self._jvm = spark._jvm
        path = self._jvm.org.apache.hadoop.fs.Path(uri)
        self._fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
        self._path = self._fs.makeQualified(path)

    def __truediv__(self, name: str) -> HadoopPath:
        """The file or directory `name` (relative, `/`-separated: any depth) under this one."""
        return HadoopPath(None, f"{self.uri.rstrip('/')}/{name}", self, name)

    def __str__(self) -> str:
        return self.uri

    @property
    def name(self) -> str:
        return self._path.getName()

    @property
    def qualified(self) -> str:
        return self._path.toString()

    @property
    def local_path(self) -> str | None:
        """Where the path is on this machine's file system, for a `file:` path; else None."""
        uri = self._path.toUri()
        return uri.getPath() if uri.getScheme() == "file" else None

    def _status(self) -> Any:
        try:
            return self._fs.getFileStatus(self._path)
        except Exception as e:  # py4j wraps the JVM's FileNotFoundException
            if "FileNotFoundException" in _java_class(e):
                return None
            raise

    def exists(self) -> bool:
        return self._status() is not None

    def is_dir(self) -> bool:
        status = self._status()
        return status is not None and status.isDirectory()

    def is_file(self) -> bool:
        status = self._status()
        return status is not None and status.isFile()

    def length(self) -> int:
        return self._fs.getFileStatus(self._path).getLen()

    def children(self) -> list[tuple[str, bool]]:
        """(name, is a directory) of each entry of this directory, by name."""
        return sorted((s.getPath().getName(), s.isDirectory()) for s in self._fs.listStatus(self._path))

    def head(self, n: int) -> bytes:
        """The file's first `n` bytes (fewer if it is shorter): a magic number."""
        stream = self._fs.open(self._path)
        try:
            read = (stream.read() for _ in range(n))
            return bytes(b for b in read if b >= 0)
        finally:
            stream.close()

    def read_text(self) -> str:
        """A small file's text (a manifest), read in the JVM."""
        stream = self._fs.open(self._path)
        try:
            return self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()

    def _walk(self) -> Any:
        """(FileStatus, name relative to this path) of each data file under it, at any depth."""
        base = self._path.toUri().getPath().rstrip("/")
        listed = self._fs.listFiles(self._path, True)
        while listed.hasNext():
            status = listed.next()
            path = status.getPath()
            name = path.toUri().getPath()[len(base) :].lstrip("/") or path.getName()
            if not hidden(name):
                yield status, name

    def files(self) -> list[FileInfo]:
        """The data files under this directory at any depth (this file, for a file), by relative
        name; `hidden` ones left out."""
        found = []
        for status, name in self._walk():
            checksum = self._fs.getFileChecksum(status.getPath())  # null where the file system keeps none
            algorithm = f"{checksum.getAlgorithmName()}:{bytes(checksum.getBytes()).hex()}" if checksum else None
            found.append(FileInfo(name, status.getLen(), status.getModificationTime(), algorithm))
        return sorted(found, key=lambda f: f.name)

    def damaged_gzip(self) -> str | None:
        """What is wrong with the first `.gz` data file under this path that does not decompress to
        its end (truncated, corrupt), or None. Decompressed in the JVM with Hadoop's codec, the one
        Spark's text reader uses (no bytes cross py4j); reads every `.gz` in full, so only after a
        failed read."""
        codecs = self._jvm.org.apache.hadoop.io.compress.CompressionCodecFactory(self._fs.getConf())
        single = self.is_file()
        for status, name in sorted(self._walk(), key=lambda s: s[1]):
            path = status.getPath()
            if not path.getName().endswith(".gz"):
                continue
            try:
                stream = codecs.getCodec(path).createInputStream(self._fs.open(path))
                try:
                    self._jvm.org.apache.commons.io.IOUtils.consume(stream)
                finally:
                    stream.close()
            except Exception as e:
                shown = self.uri if single else f"{self.uri.rstrip('/')}/{name}"
                return f"{shown}: a damaged gzip file ({_java_message(e)})"
        return None


def fingerprint(files: list[FileInfo]) -> str:
    """One sha256 over the relative name, length, modification time and checksum of each file."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.name}\0{f.length}\0{f.mtime_ms}\0{f.checksum or ''}\n".encode())
    return digest.hexdigest()


def _java_class(error: BaseException) -> str:
    java = getattr(error, "java_exception", None)
    try:
        return java.getClass().getName() if java is not None else type(error).__name__
    except Exception:
        return type(error).__name__


def _java_message(error: BaseException) -> str:
    java = getattr(error, "java_exception", None)
    try:
        return f"{java.getClass().getSimpleName()}: {java.getMessage()}" if java is not None else str(error)
    except Exception:
        return str(error)
