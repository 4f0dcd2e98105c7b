"""The zoo's plots, made with plotly (docs/zoo.md, "The page"). Each function returns a figure; `div`
turns it into an HTML fragment that draws with the plotly.js file written once beside the pages."""

from __future__ import annotations

from collections.abc import Callable

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from llmbuild.zoo import timeline
from llmbuild.zoo.benchmarks import step_of

_LAYOUT = {"template": "plotly_white", "height": 380, "margin": {"l": 60, "r": 20, "t": 50, "b": 60},
           "legend": {"orientation": "h", "y": -0.2}}


def div(figure: go.Figure, div_id: str) -> str:
    """The figure as a <div> and its script; plotly.js itself is loaded once by the page (no CDN)."""
    return figure.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                          config={"displaylogo": False, "responsive": True})


def similarity_across_layers(results: dict[str, dict]) -> go.Figure:
    """Per recipe, the device's worst output cosine against TopOp at each layer (all stages)."""
    figure = go.Figure()
    for name, result in results.items():
        layers = _worst_by_layer(result.get("nets") or [])
        if layers:
            figure.add_trace(go.Scatter(x=list(layers), y=list(layers.values()), mode="lines+markers", name=name))
    figure.update_xaxes(dtick=1)
    return _titled(figure, "Device vs TopOp: worst output cosine per layer", "layer", "cosine")


def similarity_by_stage(result: dict) -> go.Figure:
    """One recipe: the worst output cosine per layer, a line per stage, with the tolerance."""
    figure = go.Figure()
    nets = [n for n in result.get("nets") or [] if isinstance(n.get("layer"), int)]
    for stage in sorted({n["stage"] for n in nets}):
        rows = [n for n in nets if n["stage"] == stage]
        figure.add_trace(go.Scatter(x=[n["layer"] for n in rows], y=[n["tpu_vs_top"] for n in rows],
                                    mode="lines+markers", name=f"{stage}: device vs TopOp"))
        figure.add_trace(go.Scatter(x=[n["layer"] for n in rows], y=[n["top_vs_source"] for n in rows],
                                    mode="lines", line={"dash": "dot"}, name=f"{stage}: TopOp vs transformers"))
    tolerance = (result.get("verify") or {}).get("tolerances", {}).get("tpu_cosine")
    if tolerance is not None:
        figure.add_hline(y=tolerance, line={"dash": "dash", "color": "firebrick"},
                         annotation_text=f"tpu_cosine tolerance {tolerance}")
    figure.update_xaxes(dtick=1)
    return _titled(figure, "Similarity per layer and stage", "layer", "cosine")


def jobs_in_flight(schedule: dict | None) -> go.Figure:
    """The run's jobs in flight over time, stacked per recipe (zoo/timeline.py): several recipes' jobs at
    once is the one schedule at work; a gap is the executor waiting (a cluster's queue or status checks)."""
    figure = go.Figure()
    series = timeline.in_flight([timeline.Job.of(job) for job in (schedule or {}).get("jobs", [])])
    for recipe in sorted({name for _, counts in series for name in counts}):
        figure.add_trace(go.Scatter(x=[t for t, _ in series], y=[counts.get(recipe, 0) for _, counts in series],
                                    mode="lines", line={"shape": "hv", "width": 0.5}, stackgroup="jobs",
                                    name=recipe or "(no recipe)"))
    return _titled(figure, "Jobs in flight during this run", "seconds since the first job", "jobs")


def time_per_step(results: dict[str, dict]) -> go.Figure:
    """Seconds per step (shards of a step added up), stacked per recipe: where the build's time goes."""
    return _per_step_bars(results, "seconds", sum, "Build time per step", "seconds", stacked=True)


def memory_per_step(results: dict[str, dict]) -> go.Figure:
    """Peak resident memory per step (the largest shard), per recipe."""
    return _per_step_bars(results, "max_rss_mb", max, "Peak memory per step", "max RSS (MB)", stacked=False)


def rules_of(result: dict) -> go.Figure:
    """One recipe: wall time and peak memory of every rule."""
    rules = result.get("rules") or {}
    names = list(rules)
    figure = make_subplots(rows=1, cols=2, subplot_titles=("wall time (s)", "max RSS (MB)"))
    figure.add_trace(go.Bar(x=names, y=[rules[r]["seconds"] for r in names], name="seconds"), row=1, col=1)
    figure.add_trace(go.Bar(x=names, y=[rules[r]["max_rss_mb"] for r in names], name="max RSS"), row=1, col=2)
    figure.update_layout(showlegend=False)
    return _titled(figure, "Time and memory per rule", None, None)


def trend(history: list[dict], value: Callable[[dict], float | None], title: str, unit: str,
          recipes: list[str] | None = None) -> go.Figure:
    """A line per recipe over the runs of `history` (oldest first); a run where the recipe did not build
    leaves a gap."""
    names = recipes or sorted({name for record in history for name in record["recipes"]})
    runs = [record["run"] for record in history]
    figure = go.Figure()
    for name in names:
        values = [_value(record["recipes"].get(name), value) for record in history]
        figure.add_trace(go.Scatter(x=runs, y=values, mode="lines+markers", name=name, connectgaps=False))
    figure.update_xaxes(type="category")
    return _titled(figure, title, "run", unit)


def _value(result: dict | None, value: Callable[[dict], float | None]) -> float | None:
    return value(result) if result and result.get("status") == "verified" else None


def _per_step_bars(results: dict[str, dict], column: str, combine: Callable, title: str, unit: str,
                   stacked: bool) -> go.Figure:
    per_recipe: dict[str, dict[str, float]] = {}
    for name, result in results.items():
        steps: dict[str, list[float]] = {}
        for rule, values in (result.get("rules") or {}).items():
            if values.get(column) is not None:
                steps.setdefault(step_of(rule), []).append(values[column])
        per_recipe[name] = {step: combine(v) for step, v in steps.items()}
    names = [n for n, steps in per_recipe.items() if steps]
    figure = go.Figure()
    for step in sorted({s for steps in per_recipe.values() for s in steps}):
        figure.add_trace(go.Bar(x=names, y=[per_recipe[n].get(step) for n in names], name=step))
    figure.update_layout(barmode="stack" if stacked else "group")
    return _titled(figure, title, "recipe", unit)


def _worst_by_layer(nets: list[dict]) -> dict[int, float]:
    worst: dict[int, float] = {}
    for net in nets:
        layer, cosine = net.get("layer"), net.get("tpu_vs_top")
        if isinstance(layer, int) and cosine is not None:
            worst[layer] = min(cosine, worst.get(layer, cosine))
    return dict(sorted(worst.items()))


def _titled(figure: go.Figure, title: str, x: str | None, y: str | None) -> go.Figure:
    figure.update_layout(title=title, xaxis_title=x, yaxis_title=y, **_LAYOUT)
    return figure
