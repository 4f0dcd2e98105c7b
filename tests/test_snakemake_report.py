"""`snakemake --report report.html RECIPE` after a build: Snakemake's own self-contained page, with the
outputs the rules mark report() (memory.json and perf.json of the binary, e2e.json and verify.json),
grouped by recipe and captioned from report/*.rst."""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import snakemake

RECIPE = "qwen2_tiny_f32"
ANNOTATED = {"binary": ("memory.json", "perf.json"), "verification": ("e2e.json", "verify.json")}


def test_the_report_shows_each_recipe_s_annotated_outputs(build_root: Path, tmp_path: Path) -> None:
    snakemake(build_root, RECIPE)
    page = tmp_path / "report.html"  # .html: one page; .zip would be a folder of files
    snakemake(build_root, "--report", str(page), RECIPE)
    html = page.read_text(encoding="utf-8")
    assert html.lstrip().lower().startswith("<!doctype html") and len(html) > 10_000
    # The page's index of results: category (the recipe) -> subcategory -> files.
    match = re.search(r"var categories = (\{.*?\});\n", html)
    assert match is not None, "Snakemake's report lists no results"
    categories = json.loads(match[1])
    # report() kept the paths: each file is where the build writes it.
    folder = build_root / RECIPE
    assert {sub: sorted(files) for sub, files in categories[RECIPE].items()} == {
        sub: sorted(str(folder / name) for name in names) for sub, names in ANNOTATED.items()
    }
    # Captions from report/*.rst with the recipe filled in, and the workflow's description.
    assert f"The verdict for <tt class=\\\"docutils literal\\\">{RECIPE}</tt>" in html
    assert "imported as TopOp, lowered layer by layer to TpuOp" in html
