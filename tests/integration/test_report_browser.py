"""`oncurve report`'s page in a real browser: headless Chromium (the `browser` marker: skipped
where none is installed) opens the report of a short run; every figure decodes and shows at its
PNG's size, the runs' table and the samples show, and the console reports no error."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from helpers.browser import Browser, find_browser
from helpers.configs import make_config

from oncurve.cli import main
from oncurve.loop.trainer import train
from oncurve.report import FIGURES
from oncurve.run.metrics import read_jsonl

pytestmark = pytest.mark.browser

# Each figure's section id, how its PNG decoded ("" or the error), its size and shown width.
FIGURES_SHOWN = """Promise.all([...document.querySelectorAll("section[id] > img")].map(img =>
  img.decode().then(() => "", error => String(error)).then(error => ({
    section: img.parentElement.id, error, width: img.naturalWidth, height: img.naturalHeight,
    shown: img.getBoundingClientRect().width}))))"""
# The rows of the runs' table and the text of the samples' tables as shown (innerText).
TABLES_SHOWN = """({
  runs: [...document.querySelector("table.summary").rows].map(r => [...r.cells].map(c => c.innerText)),
  samples: [...document.querySelectorAll("table.samples")].map(t => t.innerText)})"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    with Browser(find_browser(), tmp_path_factory.mktemp("chromium-profile")) as browser:
        yield browser


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    return struct.unpack(">II", path.read_bytes()[16:24])


def test_the_report_of_a_run_renders_in_chromium(tiny_model_dir, data_file, tmp_path, browser):
    run = tmp_path / "run"
    evals = (f"eval.path={data_file}", "eval.num_prompts=4")
    train(make_config(tiny_model_dir, data_file, run, "run.steps=2", *evals), quiet=True)
    assert main(["report", str(run)]) == 0
    report = run / "report" / "report.html"

    assert browser.open(report.as_uri()) == []
    figures = browser.evaluate(FIGURES_SHOWN)
    assert [f["section"] for f in figures] == [spec.name for spec in FIGURES]
    for figure in figures:
        png = report.parent / f"{figure['section']}.png"
        assert figure["error"] == "", figure
        assert (figure["width"], figure["height"]) == png_size(png), figure
        assert figure["shown"] > 0, figure
    tables = browser.evaluate(TABLES_SHOWN)
    (header, (name, directory, steps, *_)) = tables["runs"]
    assert header[:3] == ["run", "directory", "steps"]
    assert (name, directory, steps) == ("run", str(run), "2")
    (samples,) = tables["samples"]
    prompts = {row["prompt"] for row in read_jsonl(run / "samples.jsonl")}
    assert prompts and all(prompt in samples for prompt in prompts), (prompts, samples)


def test_a_broken_figure_and_console_errors_are_seen(tmp_path, browser):
    """The checks above can fail: an undecodable PNG, a missing image, console.error and an
    uncaught exception each show."""
    page = tmp_path / "broken.html"
    page.write_text(
        '<!DOCTYPE html><html><body><section id="a"><img src="data:image/png;base64,iVBORw0KGgo=">'
        '</section><img src="missing.png"><script>console.error("logged");'
        'throw new Error("thrown")</script></body></html>'
    )
    errors = browser.open(page.as_uri())
    assert any("logged" in e for e in errors), errors
    assert any("thrown" in e for e in errors), errors
    assert any("missing.png" in e for e in errors), errors
    (figure,) = browser.evaluate(FIGURES_SHOWN)
    assert figure["error"] and figure["width"] == 0, figure
