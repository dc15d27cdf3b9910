"""What the service answers with: the champion's retriever, held in memory, and its replacement when the
champion moves.

A source says which retriever should be served now (a key and a label) and loads it. `ChampionSource`
follows a work dir's MLflow registry: the version the `champion` alias names and the retriever the
index stage tagged it with (`retriever_uri`); a champion whose index is not built yet leaves the one
being served in place. `IndexSource` serves one `dssm index` directory and follows its manifest (the
flow's index stage replaces the directory whole). `Champion` polls the source in a thread of its own,
loads a new retriever beside the one in use, answers one query with it (so nothing loads lazily on a
request), then swaps the reference: a request is answered by the old retriever or by the new one, never
by neither. A retriever that fails to load is logged and not tried again until the source names another.
"""

from __future__ import annotations

import gc
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from core.errors import DssmError
from scoring.retriever import Retriever

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wanted:
    key: str  # what identifies the retriever: its URI, or the index's content hash
    label: str  # how the logs, /ready and each answer name it


@dataclass(frozen=True)
class Loaded:
    retriever: Retriever
    wanted: Wanted
    loaded_at: float
    seconds: float  # how long loading and warming took
    folder: Path | None = None  # a downloaded copy, removed once replaced


class Source(Protocol):
    def wanted(self) -> Wanted | None: ...

    def load(self, wanted: Wanted) -> tuple[Retriever, Path | None]: ...


class IndexSource:
    """One `dssm index` output directory, served again whenever its manifest's content hash changes."""

    def __init__(self, index_dir: Path):
        self.index_dir = Path(index_dir)

    def wanted(self) -> Wanted | None:
        from core.artifacts import read_manifest

        manifest = read_manifest(self.index_dir) or {}
        if not manifest.get("content_sha256"):
            return None
        model = manifest.get("model") or {}
        label = f"{model['name']} v{model['version']}" if model.get("name") else str(self.index_dir)
        return Wanted(manifest["content_sha256"], label)

    def load(self, wanted: Wanted) -> tuple[Retriever, Path | None]:
        return Retriever.load(self.index_dir), None


class ChampionSource:
    """The retriever of the version that `models:/NAME@champion` names in a tracking store."""

    def __init__(self, tracking_uri: str, name: str):
        self.tracking_uri, self.name = tracking_uri, name
        self._unindexed: str = ""  # the champion version last reported as having no index yet

    def wanted(self) -> Wanted | None:
        from mlflow.exceptions import MlflowException

        from core.tracking import client

        registry = client(self.tracking_uri)
        try:
            version = registry.get_model_version_by_alias(self.name, "champion")
        except MlflowException as e:
            raise DssmError(f"{self.name}: no champion in {self.tracking_uri} ({e.message.splitlines()[0]})") from None
        label = f"{self.name} v{version.version}"
        uri = version.tags.get("retriever_uri")
        if not uri:
            if self._unindexed != label:
                log.warning(
                    "serve: champion %s has no index yet; `dssm index` (or the flow's index stage) builds it", label
                )
                self._unindexed = label
            return None
        return Wanted(uri, label)

    def load(self, wanted: Wanted) -> tuple[Retriever, Path | None]:
        from core.tracking import use_store
        from scoring.serving import logged_files

        use_store(self.tracking_uri)
        folder = Path(tempfile.mkdtemp(prefix="dssm-serve-"))
        try:
            files, _ = logged_files(wanted.key, folder)
            if "index" not in files:
                raise DssmError(f"{wanted.key}: not a dssm retriever (no index among its artifacts)")
            return Retriever.load(files["index"]), folder
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise


def registered_name(tracking_uri: str, index_dir: Path) -> str:
    """The registered model whose champion a work dir serves: the one its index was built from, else the
    only registered model in the store with a champion."""
    import json

    from core.tracking import client

    model_json = Path(index_dir) / "model.json"
    if model_json.is_file():
        name = json.loads(model_json.read_text()).get("name")
        if name:
            return str(name)
    names = [m.name for m in client(tracking_uri).search_registered_models() if "champion" in (m.aliases or {})]
    names = [n for n in names if not n.endswith("-retriever")]
    if len(names) != 1:
        found = ", ".join(sorted(names)) or "none"
        raise DssmError(f"{tracking_uri}: name the model to serve with --model NAME (registered champions: {found})")
    return names[0]


class Champion:
    """The retriever in use (`current`), replaced in the background when the source names another."""

    def __init__(self, source: Source, poll_seconds: float):
        self.source, self.poll_seconds = source, poll_seconds
        self.current: Loaded | None = None
        self.swaps = 0
        self.error = ""  # why the last load failed, for /ready
        self._failed: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="dssm-serve-champion", daemon=True)
        self._previous_folder: Path | None = None
        self.on_swap: Callable[[], None] | None = None  # called after each new retriever is in place

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for folder in (self._previous_folder, self.current and self.current.folder):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
            except Exception as e:  # a registry that does not answer: keep serving, ask again
                self.error = f"{type(e).__name__}: {e}"
                log.warning("serve: cannot ask which champion to serve (%s); keeping %s", self.error, self.label)
            if self.poll_seconds <= 0 and self.current is not None:
                # alive, not polling: OpenVINO ran ~30% slower once the thread that compiled the model had exited
                self._stop.wait()
                return
            self._stop.wait(self.poll_seconds or 1.0)

    @property
    def label(self) -> str:
        return self.current.wanted.label if self.current else "nothing"

    def check(self) -> bool:
        """Load what the source names when it is not what is served; whether it swapped."""
        wanted = self.source.wanted()
        if wanted is None or wanted.key in self._failed:
            return False
        if self.current is not None and self.current.wanted.key == wanted.key:
            return False
        started = time.perf_counter()
        try:
            retriever, folder = self.source.load(wanted)
            retriever.warm()  # every part loaded before a request meets it
        except Exception as e:
            self._failed.add(wanted.key)
            self.error = f"{wanted.label}: {type(e).__name__}: {e}"
            log.error("serve: %s failed to load; still serving %s", self.error, self.label)
            return False
        loaded = Loaded(retriever, wanted, time.time(), time.perf_counter() - started, folder)
        # the retriever's objects (titles, BM25's vocabulary, modules) are kept for good: out of the garbage
        # collector's full passes, which otherwise walk them all on a request's path (tens of ms at p99)
        gc.collect()
        gc.freeze()
        old, self.current = self.current, loaded
        self.error = ""
        if self._previous_folder is not None:  # two back: no batch can still be using it
            shutil.rmtree(self._previous_folder, ignore_errors=True)
        self._previous_folder = old.folder if old else None
        if old is not None:
            self.swaps += 1
        if self.on_swap is not None:
            self.on_swap()
        log.info(
            "serve: now serving %s (%s titles, loaded in %.1fs)%s",
            wanted.label,
            f"{len(retriever.titles):,}",
            loaded.seconds,
            f", replacing {old.wanted.label}" if old else "",
        )
        return True
