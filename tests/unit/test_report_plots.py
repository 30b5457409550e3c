"""Unit: the run report's PNG plots (tasks/report_plots.py) are drawn without pyplot, at the report's size."""

from __future__ import annotations

import io

import numpy as np
import pytest
from matplotlib.backend_bases import RendererBase
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import StepPatch
from PIL import Image

from tasks import report_plots as draw
from tests.helpers import fresh_interpreter_output


def size(png: bytes) -> tuple[int, int]:
    """Return (width, height) of PNG bytes."""
    with Image.open(io.BytesIO(png)) as image:
        assert image.format == "PNG"
        return image.size


def test_every_plot_is_a_png_of_the_report_size() -> None:
    rng = np.random.default_rng(0)
    pngs = [
        draw.topic_distribution(["sports", "science fiction"], [7, 3]),
        draw.token_lengths(rng.integers(1, 300, 500), [32, 64, 128, 256]),
        draw.score_distributions(rng.random(200), rng.random(100), "nightly-2026-11-29"),
        draw.score_distributions(rng.random(200), None, None),
        draw.retrieval_quality(["popularity", "ranked_lightgbm"], [0.4, 0.5], [0.1, 0.2], 20),
    ]
    assert [size(png) for png in pngs] == [(700, 320)] * len(pngs)


def test_a_plot_is_drawn_once_and_keeps_its_labels_inside(monkeypatch: pytest.MonkeyPatch) -> None:
    draws: list[Figure] = []
    real_draw = Figure.draw

    def counted(figure: Figure, renderer: RendererBase) -> None:
        draws.append(figure)
        real_draw(figure, renderer)

    monkeypatch.setattr(Figure, "draw", counted)
    long_names = ["a topic with a name as long as a user may give it", "sports"]
    png = draw.topic_distribution(long_names, [7, 3])
    assert len(draws) == 1  # savefig's own draw; before, a figure left with tight_layout's engine was drawn twice
    figure = draws[0]
    renderer = FigureCanvasAgg(figure).get_renderer()
    inside = figure.bbox.expanded(1.0, 1.0)
    for label in figure.axes[0].get_xticklabels():  # laid out to fit: the rotated long name is not cut off
        box = label.get_window_extent(renderer)
        assert inside.x0 - 1 <= box.x0 and box.x1 <= inside.x1 + 1 and inside.y0 - 1 <= box.y0, box
    assert size(png) == (700, 320)


def test_plots_never_import_pyplot() -> None:
    # pyplot keeps global figure state that concurrent flows in one process would share; Figure + Agg needs none
    script = (
        "import sys, numpy as np; from tasks import report_plots as d;"
        "d.topic_distribution(['a'], [1]); d.token_lengths(np.arange(9), [4]);"
        "print('matplotlib.pyplot' in sys.modules)"
    )
    assert fresh_interpreter_output(script) == "False"


def test_a_histogram_is_one_patch_holding_numpys_counts() -> None:
    values, bins = np.array([0.1, 0.2, 0.2, 0.9, 1.0]), np.linspace(0.0, 1.0, 5)
    ax = Figure().subplots()
    draw._histogram(ax, values, bins, density=True)
    assert len(ax.patches) == 1
    stairs = ax.patches[0]
    assert isinstance(stairs, StepPatch)
    drawn, drawn_edges, _ = stairs.get_data()
    expected, edges = np.histogram(values, bins=bins, density=True)
    np.testing.assert_allclose(drawn, expected)
    np.testing.assert_allclose(drawn_edges, edges)
