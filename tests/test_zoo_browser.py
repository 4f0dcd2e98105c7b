"""The zoo's page in a real browser: Debian's chromium driven by Playwright (no browser can be downloaded
here, so Playwright's own are not used). It renders without console errors and without any network
request (plotly.js is a file beside the page), every recipe has its row, and every plot is drawn."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import llmbuild, snakemake

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("chromium is not installed (apt-get install chromium; .ci/run does as root)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the `test` extra has it)")

RECIPES = ("qwen2_tiny_f32",)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A zoo of one tiny recipe with two runs in its history (the second made from the first's results,
    a little slower, so the trends have two points without a second build)."""
    build = tmp_path_factory.mktemp("zoo") / "build"
    snakemake(build, "zoo", "--config", f"recipes=[{','.join(RECIPES)}]")
    zoo = build / "zoo"
    (first,) = [p.name for p in (zoo / "runs").iterdir() if p.is_dir()]
    second = f"{first}-1"  # sorts after the first, as a second run of the same second would be named
    (zoo / "runs" / second).mkdir()
    for path in (zoo / "runs" / first).glob("*.json"):
        result = json.loads(path.read_text())
        result["build_seconds"] = result["build_seconds"] * 1.05
        (zoo / "runs" / second / path.name).write_text(json.dumps(result))
    shutil.copy(zoo / "runs" / f"{first}.log", zoo / "runs" / f"{second}.log")  # the schedule it plots
    done = llmbuild(build, "zoo-page", str(zoo), "--run", second)
    assert done.returncode == 0, done.stderr
    return zoo


def _open(browser, page_file: Path) -> tuple[object, list[str], list[str]]:
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("request", lambda request: requests.append(request.url))
    page.goto(page_file.as_uri())
    page.wait_for_load_state("load")
    return page, errors, requests


def _drawn(page) -> list[int]:
    """For each plotly plot on the page, how many traces it drew into its SVG."""
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
    return page.eval_on_selector_all(".js-plotly-plot", "plots => plots.map(p => p.querySelectorAll("
                                     "'.main-svg .trace, .main-svg .point, .main-svg path.js-line').length)")


def test_the_page_renders_every_row_and_plot(zoo: Path, tmp_path: Path) -> None:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page, errors, requests = _open(browser, zoo / "index.html")
            rows = page.eval_on_selector_all("tr.recipe-row", "rows => rows.map(r => r.dataset.recipe)")
            assert sorted(rows) == sorted(RECIPES)
            assert page.eval_on_selector_all("tr.recipe-row", "rows => rows.map(r => r.dataset.status)") == [
                "verified"] * len(RECIPES)
            drawn = _drawn(page)
            assert len(drawn) == 6 and all(drawn), drawn  # jobs in flight first
            page.screenshot(path=str(tmp_path / "zoo.png"), full_page=True)

            recipe_page, recipe_errors, recipe_requests = _open(browser, zoo / "recipes" / f"{RECIPES[0]}.html")
            drawn = _drawn(recipe_page)
            assert len(drawn) == 4 and all(drawn), drawn
            assert recipe_page.locator("#nets tr").count() > 4 * 3  # a row per layer and stage, and the head's
            recipe_page.screenshot(path=str(tmp_path / "recipe.png"), full_page=True)
        finally:
            browser.close()
    assert errors == [] and recipe_errors == [], errors + recipe_errors
    offline = [url for url in requests + recipe_requests if not url.startswith("file://")]
    assert offline == [], offline
    assert (tmp_path / "zoo.png").stat().st_size > 10_000
    print(f"screenshots: {tmp_path / 'zoo.png'} {tmp_path / 'recipe.png'}")
