"""Records at scale (issue 25, item 3): curves thinned for drawing keep their shape within a
bounded number of points; the dashboard draws a large search from thinned data in a real
Chromium, and every point stays available on request.

The search is filled as scripts/bench/records.py fills its 1,000 trials (`fill_experiment`,
the real search driver, rows in bulk), at 40 trials of 1,200 training and 40 validation rows:
enough to pass both bounds (the best 25 trials and the running ones drawn; 1,200 points a
series, over the 1,000 a lone trial's series keeps and the 137 to 160 each when 25 to 29
trials share a panel), in about a second where the bench's 1.1 million rows take half a
minute."""

from __future__ import annotations

import json
import math
import urllib.request

import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, served
from conftest import records_bench

from localdet.paths import Layout
from localdet.records.db import StateDB
from localdet.ui.web import downsample, figures
from localdet.ui.web.app import create_app

TRIALS, ROWS, VALIDATIONS = 40, 1200, 40


# -- thinning -------------------------------------------------------------------------------

def test_a_short_series_is_kept_whole():
    xs, ys = list(range(10)), [float(i % 3) for i in range(10)]
    assert downsample.min_max(xs, ys, 10) == (xs, ys)
    assert downsample.min_max([], [], 5) == ([], [])


def test_thinning_keeps_the_ends_the_extremes_and_every_spike_within_the_bound():
    count = 10_000
    xs = list(range(0, 100 * count, 100))
    ys = [math.sin(i / 300) + 0.001 * (i % 7) for i in range(count)]
    ys[4321], ys[8765] = 50.0, -50.0  # one-point spikes, far above and below the curve
    for points in (4, 5, 20, 137, 1000):
        kept_x, kept_y = downsample.min_max(xs, ys, points)
        assert len(kept_x) == len(kept_y) <= points
        assert len(kept_x) >= points - 3  # it uses what it is given
        assert (kept_x[0], kept_y[0]) == (xs[0], ys[0])
        assert (kept_x[-1], kept_y[-1]) == (xs[-1], ys[-1])
        assert kept_x == sorted(kept_x) and len(set(kept_x)) == len(kept_x)
        assert all(ys[x // 100] == y for x, y in zip(kept_x, kept_y, strict=True))
        assert 50.0 in kept_y and -50.0 in kept_y  # the spikes are the extremes: kept
    kept_x, kept_y = downsample.min_max(xs, ys, 200)
    # The shape: every stretch of the series has its lowest and highest point drawn, so the
    # thinned curve spans what the whole one spans between its spikes.
    ordinary = [y for i, y in enumerate(ys) if i not in (4321, 8765)]
    shown = [y for y in kept_y if abs(y) < 50]
    assert min(shown) == min(ordinary) and max(shown) == max(ordinary)


def test_a_bound_below_the_ends_and_one_stretch_is_raised_to_them():
    kept_x, _ = downsample.min_max(list(range(100)), [float(i) for i in range(100)], 1)
    assert len(kept_x) <= downsample.MIN_POINTS and kept_x[0] == 0 and kept_x[-1] == 99


def test_the_experiment_page_draws_the_best_trials_and_the_running_ones():
    trials = [{"id": i, "state": "COMPLETED", "best_validation": {"val_loss": float(i)}}
              for i in range(1, 41)]
    trials += [{"id": 41, "state": "RUNNING", "best_validation": None},
               {"id": 42, "state": "RUNNING", "best_validation": {"val_loss": 99.0}},
               {"id": 43, "state": "ERROR", "best_validation": {"val_loss": math.nan}}]
    chosen = figures.curve_trials(trials, "val_loss", smaller_is_better=True, limit=5)
    assert chosen == [1, 2, 3, 4, 5, 41, 42]
    assert figures.curve_trials(trials, "val_loss", False, limit=3)[:3] == [42, 40, 39]
    few = figures.curve_trials(trials[:2] + trials[-3:], "val_loss", True, limit=5)
    assert few == [1, 2, 42, 41, 43]  # fewer than the limit scored: those without one too
    assert figures.series_points(1) == figures.SERIES_POINTS
    assert figures.series_points(10_000) == figures.MIN_SERIES_POINTS


# -- the dashboard ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def search(tmp_path_factory):
    layout = Layout(tmp_path_factory.mktemp("scale") / "home").ensure()
    with StateDB.open(layout.db) as db:
        experiment_id = records_bench().fill_experiment(db, TRIALS, ROWS, VALIDATIONS)
        trial_ids = [t.id for t in db.trials(experiment_id)]
    return layout, experiment_id, trial_ids


@pytest.fixture(scope="module")
def site(search):
    with served(create_app(search[0], token=None)) as url:
        yield url


def _get(url: str) -> tuple[dict, int]:
    with urllib.request.urlopen(url, timeout=120) as response:
        body = response.read()
    return json.loads(body), len(body)


def _points(figure: dict) -> dict[str, int]:
    """Points per panel (its x axis), summed over its traces."""
    found: dict[str, int] = {}
    for trace in figure["data"]:
        found[trace["xaxis"]] = found.get(trace["xaxis"], 0) + len(trace["x"])
    return found


def test_the_page_data_is_thinned_and_every_point_comes_on_request(search, site):
    _, experiment_id, trial_ids = search
    page, _ = _get(f"{site}/api/experiments/{experiment_id}")
    drawn = page["charts"]["curves_drawn"]
    # The best 25 by their best val_loss, then the running ones not among them.
    scored = sorted((t for t in page["trials"] if t["best_validation"]),
                    key=lambda t: t["best_validation"]["val_loss"])
    running = [t["id"] for t in page["trials"] if t["state"] == "RUNNING"]
    best = [t["id"] for t in scored[:figures.CURVE_TRIALS]]
    assert len(running) == 4
    assert drawn["trials"] == best + [t for t in running if t not in best]
    assert drawn["of"] == TRIALS and page["charts"]["curves"]["thinned"]
    bound = figures.series_points(len(drawn["trials"]))
    assert bound < ROWS
    curves = page["charts"]["curves"]
    assert {len(t["x"]) for t in curves["data"]} <= set(range(1, bound + 1))
    assert all(n <= figures.PANEL_POINTS for n in _points(curves).values())
    assert len({t["name"] for t in curves["data"]}) == len(drawn["trials"])

    # Every point of every trial, by request: each row of the database, in every panel.
    full, _ = _get(f"{site}{drawn['all_trials']}")
    assert not full["curves"]["thinned"] and full["curves_drawn"]["points_per_series"] is None
    with StateDB.open(search[0].db) as db:
        rows = dict(db.db.execute(
            "SELECT kind, count(*) FROM metrics WHERE trial_id IN (SELECT id FROM trials WHERE "
            "experiment_id = ?) GROUP BY kind", [experiment_id]).fetchall())
    titles = [a["text"] for a in full["curves"]["layout"]["annotations"]]
    by_panel = _points(full["curves"])
    for index, title in enumerate(titles):
        axis = "x" if index == 0 else f"x{index + 1}"
        assert by_panel[axis] == rows["training" if title.startswith("training") else
                                      "validation"], title

    # A lone trial keeps 1,000 points a series on its page; its every point on request.
    trial = trial_ids[0]
    thinned, _ = _get(f"{site}/api/trials/{trial}")
    assert figures.SERIES_POINTS - 3 <= max(
        len(t["x"]) for t in thinned["charts"]["curves"]["data"]) <= figures.SERIES_POINTS
    every, _ = _get(f"{site}{thinned['charts']['curves_drawn']['full']}")
    assert max(len(t["x"]) for t in every["curves"]["data"]) == ROWS


def test_chromium_draws_the_large_search_from_thinned_data(search, site):
    from playwright.sync_api import expect, sync_playwright

    _, experiment_id, _ = search
    drawn = len(_get(f"{site}/api/experiments/{experiment_id}")[0]["charts"]["curves_drawn"][
        "trials"])
    assert drawn < TRIALS
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.goto(f"{site}/experiments/{experiment_id}")
            # Four panels (two metrics of each kind), a line per drawn trial in each: a
            # generous wait, failed by a timeout only (a frozen page never gets there).
            expect(page.locator("#curves .scatterlayer .trace")).to_have_count(
                4 * drawn, timeout=60_000)
            expect(page.locator("#trials tbody tr")).to_have_count(TRIALS)
            expect(page.locator("#curves-note")).to_contain_text(
                f"{drawn} of {TRIALS} trials drawn")
            points = "document.getElementById('curves').data.map((t) => t.x.length)"
            bound = figures.series_points(drawn)
            assert max(page.evaluate(points)) <= bound

            # Refreshes of a search that did not change draw no chart again (plotly redrew
            # every trace at each one, holding the page a second or more).
            page.evaluate("""() => { window.drawings = 0; const react = Plotly.react;
                Plotly.react = (...args) => { window.drawings += 1; return react(...args); }; }""")
            for _ in range(2):
                shown = page.locator("#updated").inner_text()
                expect(page.locator("#updated")).not_to_have_text(shown, timeout=60_000)
            assert page.evaluate("window.drawings") == 0

            page.locator("#curves-full").click()  # every point of the drawn trials
            expect(page.locator("#curves-note")).to_contain_text("Every point drawn",
                                                                 timeout=60_000)
            assert max(page.evaluate(points)) == ROWS
            shown = page.locator("#updated").inner_text()  # a refresh leaves them drawn
            expect(page.locator("#updated")).not_to_have_text(shown, timeout=60_000)
            assert max(page.evaluate(points)) == ROWS
            page.locator("#curves-thinned").click()
            expect(page.locator("#curves-full")).to_be_visible(timeout=30_000)
            assert max(page.evaluate(points)) <= bound
        finally:
            browser.close()
