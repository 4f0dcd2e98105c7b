"""The zoo's pages: <build>/zoo/index.html (a row per recipe, the regressions, the plots) and a page per
recipe (recipes/<name>.html), from the run's history record. Jinja2 templates (templates/), autoescaped:
recipe names and step messages come from files a user wrote."""

from __future__ import annotations

from pathlib import Path

import jinja2
from plotly.offline import get_plotlyjs

from llmbuild.zoo import plots
from llmbuild.zoo.layout import ZooPaths

TEMPLATES = Path(__file__).resolve().parent / "templates"


def write_pages(paths: ZooPaths, record: dict, history: list[dict]) -> Path:
    """Write index.html and the recipe pages for `record` (the last of `history`); returns the index."""
    write_plotly_js(paths.plotly_js)
    env = _environment()
    results = record["recipes"]
    regressions = record.get("regressions") or []
    built = {name: r for name, r in results.items() if r.get("status") == "verified"}
    figures = [
        plots.div(plots.jobs_in_flight(record.get("schedule")), "plot-in-flight"),
        plots.div(plots.similarity_across_layers(built), "plot-similarity"),
        plots.div(plots.time_per_step(built), "plot-time"),
        plots.div(plots.memory_per_step(built), "plot-memory"),
        plots.div(plots.trend(history, lambda r: r.get("build_seconds"), "Build time over runs", "seconds"),
                  "plot-trend-time"),
        plots.div(plots.trend(history, lambda r: (r.get("margins") or {}).get("tpu_vs_top"),
                              "Device vs TopOp margin over runs (worst cosine - tolerance)", "margin"),
                  "plot-trend-margin"),
    ]
    paths.page.write_text(env.get_template("index.html.j2").render(
        record=record, results=results, regressions=regressions, figures=figures,
        flagged={r["recipe"] for r in regressions}, runs=[h["run"] for h in history]), encoding="utf-8")
    for name, result in results.items():
        _write_recipe_page(env, paths, record, name, result, history,
                           [r for r in regressions if r["recipe"] == name])
    return paths.page


def write_plotly_js(path: Path) -> None:
    """plotly.js beside the pages, written when missing or of another version (pages work offline)."""
    script = get_plotlyjs()
    if path.is_file() and path.stat().st_size == len(script.encode()) and path.read_text(encoding="utf-8") == script:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script, encoding="utf-8")


def _write_recipe_page(env: jinja2.Environment, paths: ZooPaths, record: dict, name: str, result: dict,
                       history: list[dict], regressions: list[dict]) -> None:
    figures = []
    if result.get("status") == "verified":
        figures = [plots.div(plots.similarity_by_stage(result), "plot-stages"),
                   plots.div(plots.rules_of(result), "plot-rules")]
    figures += [
        plots.div(plots.trend(history, lambda r: r.get("build_seconds"), "Build time over runs", "seconds",
                              [name]), "plot-trend-time"),
        plots.div(plots.trend(history, lambda r: _mib(r.get("binary_bytes")), "Binary size over runs", "MiB",
                              [name]), "plot-trend-size"),
    ]
    page = paths.recipe_page(name)
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(env.get_template("recipe.html.j2").render(
        record=record, name=name, result=result, regressions=regressions, figures=figures), encoding="utf-8")


def _mib(value: float | None) -> float | None:
    return None if value is None else value / 2**20


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(mib=lambda v: "" if v is None else f"{v / 2**20:.2f}",
                       num=lambda v, digits=2: "" if v is None else f"{v:.{digits}f}",
                       cos=lambda v: "" if v is None else f"{v:.7f}",
                       margin=lambda v: "" if v is None else f"{v:+.2e}",
                       ms=lambda v: "" if v is None else f"{v * 1000:.2f}",
                       pct=lambda v: "" if v is None else f"{v * 100:.1f}%")
    return env
