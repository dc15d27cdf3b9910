"""`dssm gate`: a registered version takes the `champion` alias only when it beats the champion.

The gate moves the `champion` alias to a new version only when it beats the current champion's
NDCG@10 on the same evaluation set (same judged file, same split), and leaves it on the best of the
versions gated at the same time (runs against one tracking server: `_settle`); `--metric
retrieval_ndcg@10` compares full-catalogue retrieval NDCG@10 instead (PROTOCOL.md §8), as the flow's gate
does by default. A gate that names no metric compares the one the registered model's last gate compared
(the `gate_metric` tag), so a gate by hand on a flow's register output gates as the flow. It reads what
register registered and, for a champion never measured on this eval set, the eval set that evaluate
wrote beside its report (scoring/handoff.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException

from core.artifacts import code_fingerprint, publish, require_manifest
from core.errors import DssmError, NotADssmModel
from core.tracking import client as mlflow_client
from core.tracking import existing_store, use_store
from scoring.handoff import ScoredOn, read_eval_set
from scoring.protocol import REPORTED_DECIMALS, metric_key
from scoring.serving import CHAMPION, GATE_FILE, read_gate
from stages.gate.config import DEFAULT_METRIC, GateConfig

log = logging.getLogger(__name__)

METRIC_LABELS = {"ndcg_at_10": "NDCG@10", "retrieval_ndcg_at_10": "retrieval NDCG@10"}
METRIC_TAG = "gate_metric"  # on the registered model: the metric its last gate compared


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
    # both sides at the report's precision: a champion scored here and the same model's reported score tie
    ndcg10 = round(ndcg10, REPORTED_DECIMALS)
    try:  # read before this version's score is tagged: until then no other gate's _settle can hand it the alias
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        champion = None
    client.set_model_version_tag(name, version, tag, f"{ndcg10:.6f}")
    if system:
        client.set_model_version_tag(name, version, "system", system)
    if champion is None:
        client.set_registered_model_alias(name, CHAMPION, version)
        return GateDecision(True, version, ndcg10, None, None, "no champion yet" + _settle(client, name, tag, None))
    held = str(champion.version)  # MLflow's stores give an int or a str; gate.json keeps versions as str
    if held == str(version):
        return GateDecision(False, version, ndcg10, version, ndcg10, "already the champion")  # kept: no move
    known = champion.tags.get(tag)
    if known is None:
        try:
            champion_ndcg = round(score_champion(f"models:/{name}@{CHAMPION}"), REPORTED_DECIMALS)
        except NotADssmModel as e:  # e.g. a version registered by hand: it cannot compete (a lost server can)
            log.warning("%s champion v%s cannot be scored, v%s replaces it: %s", name, champion.version, version, e)
            client.set_registered_model_alias(name, CHAMPION, version)
            reason = f"champion v{champion.version} cannot be scored ({e}): replaced"
            reason += _settle(client, name, tag, champion.version)
            return GateDecision(True, version, ndcg10, held, None, reason)
        client.set_model_version_tag(name, champion.version, tag, f"{champion_ndcg:.6f}")
    else:
        champion_ndcg = round(float(known), REPORTED_DECIMALS)
    if ndcg10 > champion_ndcg:
        client.set_registered_model_alias(name, CHAMPION, version)
        reason = f"{label} {ndcg10:.2f} beats champion v{champion.version} ({champion_ndcg:.2f})"
        reason += _settle(client, name, tag, champion.version)
        return GateDecision(True, version, ndcg10, held, champion_ndcg, reason)
    reason = f"{label} {ndcg10:.2f} does not beat champion v{champion.version} ({champion_ndcg:.2f})"
    return GateDecision(False, version, ndcg10, held, champion_ndcg, reason)


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


HISTORY_PLOT = "gate-history.png"


def gate(registered: Path, out: Path, cfg: GateConfig = GateConfig(), force: bool = False) -> dict[str, Any]:  # noqa: B008
    """The champion gate for every version of `registered` (a `dssm register` output): OUT/gate.json
    (a decision per version) and OUT/gate-history.png; each decision also tags its evaluation run."""
    from scoring.handoff import read_registered

    # every file hashed, not just sized: the versions and their scores are read from registered.json (a same-size
    # edit must not move the alias)
    done = require_manifest(Path(registered), "register", content=True)
    uri = done["params"]["mlflow_uri"]
    existing_store(uri, "the gate")
    inputs = {"registered": {"path": str(registered), "sha256": done["content_sha256"]}}
    doc = read_registered(Path(registered))
    name, key = doc["model"], doc["eval_key"]
    client = mlflow_client(uri)
    cfg = replace(cfg, metric=_gate_metric(client, name, cfg.metric))

    def build(tmp: Path) -> dict[str, Any]:
        scored = functools.cache(lambda: _eval_set_of(doc))
        metric = metric_key(cfg.metric)
        use_store(uri)  # a champion's models:/ URI is found in the evaluation's store, wherever the gate runs
        score = functools.partial(_score_uri, scored=scored, retrieval=cfg.metric.startswith("retrieval_"))
        decisions = []
        for v in doc["versions"]:
            if cfg.metric not in v["metrics"]:
                raise DssmError(
                    f"gate: {v['system']} was evaluated without {cfg.metric} (the flow: evaluate.retrieval=true, "
                    f"dssm evaluate --retrieval), or gate on ndcg@10"
                )
            value = v["metrics"][cfg.metric]
            decision = champion_gate(client, name, v["version"], value, key, score, v["system"], metric)
            client.set_tag(v["run_id"], "champion_gate", decision.reason)
            log.info("%s v%s: %s", name, v["version"], decision.reason)
            decisions.append({"system": v["system"], "model": name, **decision.as_dict()})
        if decisions:  # what a later gate that names no metric compares
            client.set_registered_model_tag(name, METRIC_TAG, cfg.metric)
        # after every decision of this gate: the plot shows where the alias ended
        history = plot_gate_history(client, name, key, tmp / HISTORY_PLOT, metric) if decisions else None
        for v in doc["versions"] if history else []:
            client.log_artifact(v["run_id"], str(history))
        (tmp / GATE_FILE).write_text(json.dumps(decisions, indent=2) + "\n")
        counts = {"gated": len(decisions), "promoted": sum(d["promoted"] for d in decisions)}
        return {"counts": counts, "trend": night_trend(client, name, key, doc["versions"], cfg)}

    params = {"metric": cfg.metric, "trend": [cfg.trend_nights, cfg.decline_tolerance], "mlflow_uri": uri}
    return publish(Path(out), "gate", code_fingerprint(__name__), inputs, params, build, force, upstream=[done])


def _gate_metric(client: mlflow.MlflowClient, name: str, asked: str) -> str:
    """The metric this gate compares: `asked`, else the one registered model `name`'s last gate compared (its
    champion was chosen by it; a gate by hand on a flow's register output gates as the flow does), else
    DEFAULT_METRIC. Another metric than the last gate's is allowed, and said: the champion is then compared
    (and re-measured where it never was) on the new one."""
    try:
        last = client.get_registered_model(name).tags.get(METRIC_TAG, "")
    except MlflowException:  # not registered yet
        last = ""
    if asked and last and asked != last:
        log.warning("gate: %s was gated on %s until now; this gate compares %s (--metric)", name, last, asked)
    return asked or last or DEFAULT_METRIC


def night_trend(
    client: mlflow.MlflowClient, name: str, key: str, tonight: list[dict], cfg: GateConfig
) -> dict[str, Any] | None:
    """The night's best model against the last `trend_nights` nights' best on this evaluation set (versions
    tagged with a run date and measured on eval key `key`); a warning when it is below their median by more
    than `decline_tolerance`: a slow decline the champion gate, which only keeps the best, would not show.
    None outside nightly runs or before there are earlier nights."""
    import statistics

    if not cfg.trend_nights:
        return None
    cfg = replace(cfg, metric=cfg.metric or DEFAULT_METRIC)  # the gate resolved it; a caller by hand may not have
    tag = f"{metric_key(cfg.metric)}.{key}"
    versions = client.search_model_versions(f"name='{name}'")  # one query: tonight's dates and the earlier nights
    ours = {str(v["version"]) for v in tonight}
    night = next((v.tags.get("run_date") for v in versions if str(v.version) in ours), None)
    if not night:
        return None
    best: dict[str, float] = {}
    for v in versions:
        day = v.tags.get("run_date")
        if day and day < night and tag in v.tags:
            best[day] = max(best.get(day, float("-inf")), float(v.tags[tag]))
    earlier = [best[d] for d in sorted(best)[-cfg.trend_nights :]]
    if not earlier:
        return None
    value, median = max(float(v["metrics"][cfg.metric]) for v in tonight), statistics.median(earlier)
    trend = {"night": night, "best": value, "median": median, "nights": len(earlier), "declined": False}
    if value < median - cfg.decline_tolerance:
        trend["declined"] = True
        log.warning(
            "gate: the night's best model (%.2f) is %.2f below the median of the last %d nights' best (%.2f) on "
            "this evaluation set; more than gate.decline_tolerance=%g: look at what changed (data, code, config)",
            value, median - value, len(earlier), median, cfg.decline_tolerance,
        )  # fmt: skip
    return trend


def _eval_set_of(doc: dict[str, Any]) -> ScoredOn:
    """The eval set the registered versions were measured on, refused unless it is that set (its key): a
    champion scored on another set would be tagged with this set's score."""
    from scoring.handoff import eval_key

    require_manifest(Path(doc["evaluation"]), "evaluate", content=True)  # eval_set.json as evaluate wrote it
    on = read_eval_set(Path(doc["evaluation"]))
    if eval_key(on.eval_set) != doc["eval_key"]:
        raise DssmError(
            f"gate: {doc['evaluation']} holds eval set {eval_key(on.eval_set)}, not {doc['eval_key']} that the "
            "versions were measured on (the evaluation was redone or the path names another): register again"
        )
    return on


def _score_uri(uri: str, scored: Callable[[], ScoredOn], retrieval: bool) -> float:
    """NDCG@10 of an MLflow model (the champion, when it was never measured there) on the eval set
    evaluate scored on: re-ranking its judged titles, or retrieving from its catalogue."""
    from scoring.catalogue import Catalogue, evaluate_retrieval
    from scoring.protocol import evaluate_scores
    from scoring.systems import load_trained

    on = scored()
    try:
        system = load_trained(uri)
    except NotADssmModel:
        raise  # not ours: champion_gate replaces it
    except DssmError as e:  # ours, but it cannot be loaded (its files gone, the server down): no decision
        raise DssmError(
            f"gate: the champion ({uri}) was never measured on this eval set and cannot be loaded to score it: "
            f"{str(e).removeprefix('--model ')}. The alias is left as it was: restore the model's files, or move "
            "the alias to a version that loads (MlflowClient().set_registered_model_alias), and gate again"
        ) from None
    if retrieval:
        catalogue = Catalogue(on.catalogue or [])
        return evaluate_retrieval(on.eval_set, catalogue, [system], on.threshold)["systems"][system.name]["ndcg@10"]
    queries, titles = on.eval_set.pairs()
    return evaluate_scores(on.eval_set, system.name, system.scorer.score(queries, titles)).mean("ndcg@10")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm gate`'s options: the input and output, GateConfig's fields."""
    from core.options import add_config_options

    p.add_argument("--registered", type=Path, required=True, help="a `dssm register` output (its registered.json)")
    p.add_argument("--out", type=Path, required=True, help="output directory (gate.json, gate-history.png)")
    p.add_argument("--force", action="store_true", help="gate again even if --out holds this gate's decisions")
    add_config_options(p, GateConfig)


def command(args: argparse.Namespace) -> None:
    """`dssm gate`."""
    from core.options import config_from_options

    gate(args.registered, args.out, config_from_options(GateConfig, args), args.force)
    for d in read_gate(args.out):
        decision = "promoted" if d["promoted"] else "kept"
        print(f"{d['model']} v{d['version']} ({d['system']}): {decision} ({d['reason']})")
