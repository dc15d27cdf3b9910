"""docs/architecture.md's layering, held to the code: imports between the project's packages point
down only, a stage imports no other stage, no two modules import each other (at run time or only for
a type), and the run config loads without the heavy libraries."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lowest first; a package may import packages of lower layers only (docs/architecture.md draws this).
LAYERS: list[set[str]] = [{"core"}, {"modeling"}, {"scoring"}, {"stages", "service"}, {"flows", "infra"}, {"dssm"}]
LAYER_OF = {package: i for i, layer in enumerate(LAYERS) for package in layer}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in LAYER_OF for p in sorted((ROOT / package).rglob("*.py"))}


def imports(path: Path, type_only: bool = False) -> set[str]:
    """The project modules a module imports, at import time or inside functions; with `type_only`
    also those under `if TYPE_CHECKING:`, which name a type for the checker and never run."""
    tree = ast.parse(path.read_text())
    if not type_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
                node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from core import judgments` imports the module core.judgments; `from core.x import y`, core.x
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {name for name in found if name.split(".")[0] in LAYER_OF}


def test_every_package_has_a_layer():
    """...and is a project package: its code is in the stages' code fingerprints (core/artifacts.py)."""
    from core.artifacts import PROJECT_PACKAGES

    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    scripts = {"benchmarks", "reproductions", "studies"}  # entry points above every layer, never imported by them
    assert packages - scripts == set(LAYER_OF) == set(PROJECT_PACKAGES)


def test_imports_point_down_only():
    """At run time and for a type alike: a lower layer never names a higher one's types."""
    upward = []
    for name, path in project_modules().items():
        package = name.split(".")[0]
        for imported in {i.split(".")[0] for i in imports(path, type_only=True)} - {package}:
            if LAYER_OF[imported] >= LAYER_OF[package]:
                upward.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert not upward, "imports that do not point down (docs/architecture.md):\n" + "\n".join(upward)


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "stages" and len(parts) > 2 else None


def test_no_stage_imports_another_stage():
    """What two stages share lives below them (core, modeling, scoring); a stage reads another's output
    by path, from the pipeline, never its code. Only the flow, the CLI and infra see every stage."""
    crossing = []
    for name, path in project_modules().items():
        own = stage_of(name)
        if own is None:
            continue
        for imported in imports(path, type_only=True):
            other = stage_of(imported)
            if other not in (None, own):
                crossing.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert not crossing, "stages that import another stage:\n" + "\n".join(sorted(crossing))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles_at_run_time_or_for_types():
    """Two modules that import each other (directly or round a longer loop, in a function or under
    TYPE_CHECKING) are one module in two files: the shared part belongs in a module of its own."""
    modules = project_modules()
    graph = {
        name: {i for i in imports(path, type_only=True) if i in modules and i != name and not name.startswith(i + ".")}
        for name, path in modules.items()
    }
    assert circles(graph) == []


def test_circles_finds_a_loop():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_run_config_and_every_settings_module_load_without_spark_mlflow_or_torch():
    """`dssm run --help`, the Prefect UI's parameter form and a config check must not pay for them; nor
    must a stage's or command's settings (each package's config.py, each stage's under stages/)."""
    settings = sorted(module_name(p) for p in ROOT.glob("*/config.py"))
    settings += sorted(module_name(p) for p in (ROOT / "stages").glob("*/config.py"))
    assert {"stages.analyze.config", "stages.evaluate.config", "modeling.config"} <= set(settings)
    code = (
        f"import sys, flows.config, flows.pipeline, flows.run_command, {', '.join(settings)}; "
        "print(sorted(m for m in ('pyspark', 'mlflow', 'torch', 'pandas', 'prefect') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _layout_block() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("## Layout")
    return text[text.index("```\n", start) : text.index("\n```", text.index("```\n", start) + 4)]


def test_the_layout_lists_every_package_stage_and_script():
    """docs/architecture.md's layout block is written by hand: it names every package, every stage of stages/,
    every script of the script folders and every encoder, so a new one cannot drift out of it."""
    from modeling.encoders import ENCODERS

    layout = _layout_block()
    named = {line.split()[0] for line in layout.splitlines() if line and not line.startswith(" " * 4)}
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    stages = {p.parent.name for p in (ROOT / "stages").glob("*/__init__.py")}
    assert {f"{p}/" for p in packages} <= named
    assert {f"{s}/" for s in stages} <= named
    scripts = [p.name for d in ("benchmarks", "reproductions", "studies") for p in (ROOT / d).glob("[!_]*.py")]
    assert [s for s in scripts if s != "__init__.py" and s not in layout] == []
    assert all(e in layout for e in ENCODERS)


def test_the_studies_index_links_every_study_and_names_every_study_script():
    index = (ROOT / "docs" / "studies" / "README.md").read_text()
    pages = [p.name for p in (ROOT / "docs" / "studies").glob("*.md") if p.name != "README.md"]
    assert [p for p in pages if f"]({p})" not in index] == []
    scripts = [p.name for p in (ROOT / "studies").glob("[!_]*.py")]
    assert [s for s in scripts if s not in index] == []


def _stage_names() -> set[str]:
    return {p.parent.name for p in (ROOT / "stages").glob("*/__init__.py")}


def test_the_flow_imports_only_the_stages_settings_and_names_no_stage():
    """The flow walks PIPELINE: what a stage does for the run besides its output is a hook in its own
    `stage` module (flows/pipeline.py's HOOKS), so flows/ imports no stage code, only the stages' settings
    (the run config is built from them), and no string of flows/ names a stage, but PIPELINE's entries."""
    reaching = []
    named = []
    stages = _stage_names()
    for path in sorted((ROOT / "flows").rglob("*.py")):
        # stages.NAME.config, or a name from it (imports() lists `from M import x` as M and M.x)
        code = [m for m in imports(path, type_only=True) if stage_of(m) and m.split(".")[2] != "config"]
        reaching += [f"{path.name} imports {m}" for m in sorted(code)]
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "PIPELINE":
                node.value = ast.Constant(None)  # the declaration names its stages: that is what it is for
        named += [
            f"{path.name}:{node.lineno} {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in stages
        ]
    assert reaching == [], "flows/ imports stage code (a hook in its stage module goes there):\n" + "\n".join(reaching)
    assert named == [], "flows/ names stages outside PIPELINE:\n" + "\n".join(named)
