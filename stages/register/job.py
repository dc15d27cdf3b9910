"""`dssm register`: each model an evaluation scored, logged as an MLflow model into its evaluation run
and registered as a version of `dssm-DATASET` (the gate decides afterwards which version serves).

Idempotent: a run whose model was already registered (a rerun after a crash between the registry
write and the published output) keeps its version instead of registering a second one, and a model
already registered from another evaluation (the same weights, config and vocabulary, fusion and
partners: a night that trained nothing new, or the same model evaluated again by hand or by its
models:/ URI) keeps the version it has, with the run date of the night that trained it.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.artifacts import code_fingerprint, publish, require_manifest
from core.stopping import is_stop
from core.tracking import client as mlflow_client
from core.tracking import existing_store, registry_lock, use_store
from scoring.handoff import REGISTERED_FILE, Registrable, read_models, read_registered

log = logging.getLogger(__name__)


def register(evaluation: Path, out: Path, run_date: str = "", force: bool = False) -> dict[str, Any]:
    """Register every model of `evaluation` (a `dssm evaluate` output) in its tracking store; writes
    OUT/registered.json ({model, eval_key, evaluation, versions: [{system, version, model_uri, run_id,
    metrics}]}). `run_date`: a windowed run's date, tagged on each version (the gate history's labels)."""
    # every file hashed, not just sized: what is registered is read from them (a same-size edit must not pass)
    evaluated = require_manifest(Path(evaluation), "evaluate", content=True)
    uri = evaluated["params"]["mlflow_uri"]
    existing_store(uri, "register")
    inputs = {"evaluation": {"path": str(evaluation), "sha256": evaluated["content_sha256"]}}
    params = {"run_date": run_date, "mlflow_uri": uri}

    def build(tmp: Path) -> dict[str, Any]:
        from scoring.serving import registered_name

        dataset, key, models = read_models(Path(evaluation))
        name = registered_name(dataset)
        # "already registered?" then "register": two registers of one evaluation at once would both see no version
        with registry_lock(uri):
            versions = [_register_one(uri, name, m, run_date) for m in models]
        # absolute: the gate reads the evaluation's eval set from it, wherever it runs
        doc = {"model": name, "eval_key": key, "evaluation": str(Path(evaluation).resolve()), "versions": versions}
        (tmp / REGISTERED_FILE).write_text(json.dumps(doc, indent=2) + "\n")
        return {"counts": {"versions": len(versions)}}

    code = code_fingerprint(__name__)
    return publish(Path(out), "register", code, inputs, params, build, force, upstream=[evaluated])


def _register_one(uri: str, name: str, model: Registrable, run_date: str) -> dict[str, Any]:
    import mlflow

    from scoring.serving import log_model

    client = mlflow_client(uri)
    run = client.get_run(model.run_id)
    tags = run.data.tags
    identity = functools.cache(functools.partial(model_sha256, model))  # reads the checkpoints: only where asked
    version = tags.get("registered_version")
    if version is not None and tags.get("registered_model") == name:  # registered before the output was published
        log.info("%s v%s: already registered from run %s", name, version, model.run_id)
        model_uri = tags["model_uri"]
    elif (kept := _kept_version(client, name, model.run_id, identity)) is not None:
        version, model_uri = str(kept.version), kept.source
        for key, value in _registered_tags(name, version, model_uri).items():
            client.set_tag(model.run_id, key, value)
        how = (  # MLflow made the version inside log_model and a stop came before the run's tags said so
            f"registered from run {model.run_id} by a register that was stopped"
            if kept.run_id == model.run_id
            else f"the same model ({model.system}) as registered before"
        )
        log.info("%s v%s: %s; kept", name, version, how)
    else:
        use_store(uri)
        mlflow.start_run(run_id=model.run_id)  # the model is logged into the run that measured it
        try:
            partners = {k: Path(v) for k, v in model.partners.items()}
            model_uri, version = log_model(Path(model.checkpoint), name, model.fusion, partners)
            mlflow.set_tags(_registered_tags(name, version, model_uri))
        except BaseException as e:
            mlflow.end_run("KILLED" if is_stop(e) else "FAILED")
            raise
        mlflow.end_run("FINISHED")
        log.info("%s v%s: registered (%s)", name, version, model.system)
    if run.info.status != "FINISHED":  # a stopped register left the run KILLED or RUNNING
        client.set_terminated(model.run_id, "FINISHED")  # its evaluation finished, and its version is kept
    registered = client.get_model_version(name, version)
    if MODEL_TAG not in registered.tags:
        client.set_model_version_tag(name, version, MODEL_TAG, identity())
    if run_date and registered.run_id == model.run_id:  # a version kept from another run keeps its night's date
        client.set_model_version_tag(name, version, "run_date", run_date)
    return {
        "system": model.system,
        "version": version,
        "model_uri": model_uri,
        "run_id": model.run_id,
        "metrics": model.metrics,
    }


def _registered_tags(name: str, version: str, model_uri: str) -> dict[str, str]:
    """The tags that mark an evaluation run's model as registered: what a rerun looks for."""
    return {"model_uri": model_uri, "registered_model": name, "registered_version": version}


MODEL_TAG = "model_sha256"  # on each version: what it serves, so the same model is not registered twice


def model_sha256(model: Registrable) -> str:
    """What a version serves: the weights, config and vocabulary of its checkpoint (not the training run it
    names, nor its optimiser state: the slim copy a version logs, evaluated again by its models:/ URI, and a
    retrained model whose weights came out bit-identical are the same model), a hybrid's fusion (components
    and weights) and its partners' models."""
    fusion = json.loads(json.dumps(model.fusion)) if model.fusion else None
    for component in (fusion or {}).get("components", []):
        component.pop("file", None)  # the name log_model gives a partner's file inside the logged model
    served = {
        "model": _weights_sha256(Path(model.checkpoint)),
        "fusion": fusion,
        "partners": {name: _weights_sha256(Path(path)) for name, path in sorted(model.partners.items())},
    }
    return hashlib.sha256(json.dumps(served, sort_keys=True).encode()).hexdigest()


def _weights_sha256(checkpoint: Path) -> str:
    from modeling.checkpoint import read_checkpoint

    state = read_checkpoint(checkpoint)
    digest = hashlib.sha256(json.dumps([state.get("config"), state.get("vocab")], sort_keys=True, default=str).encode())
    for name, tensor in sorted(state["model"].items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _kept_version(client, name: str, run_id: str, identity: Callable[[], str]):
    """The ready version of `name` to keep instead of registering the model again (one registry query): the
    newest logged from run `run_id` (a register stopped after MLflow made it), else the oldest that serves
    the model `identity` names; None when there is neither."""
    ready = [v for v in client.search_model_versions(f"name='{name}'") if v.status == "READY"]
    if made := [v for v in ready if v.run_id == run_id]:
        return max(made, key=lambda v: int(v.version))
    same = [v for v in ready if v.tags.get(MODEL_TAG) == identity()]
    return min(same, key=lambda v: int(v.version)) if same else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm register`'s options."""
    p.add_argument("--evaluation", type=Path, required=True, help="a `dssm evaluate` output (its models.json)")
    p.add_argument("--out", type=Path, required=True, help="output directory (registered.json)")
    p.add_argument("--run-date", default="", help="YYYY-MM-DD tagged on each version (a scheduled run's date)")
    p.add_argument("--force", action="store_true", help="register again even if --out holds this registration")


def command(args: argparse.Namespace) -> None:
    """`dssm register`."""
    manifest = register(args.evaluation, args.out, args.run_date, args.force)
    doc = read_registered(args.out)
    for v in doc["versions"]:
        print(f"{doc['model']} v{v['version']} ({v['system']}): {v['model_uri']}")
    if manifest["skipped"]:
        print(f"{args.out} was up to date")
    if doc["versions"]:
        print(f"gate them: dssm gate --registered {args.out} --out GATE_DIR")
