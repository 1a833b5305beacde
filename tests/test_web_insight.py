"""The dashboard's views of issue 24 (items 3 and 4), in a real Chromium (Playwright) on
searches recorded straight through the records API: an experiment's page draws each
hyperparameter's importance as bars and the metric against each hyperparameter (a log axis
for a log hyperparameter, a band of categories for a categorical one); ticking two
experiments on the list and pressing Compare opens their best trials side by side, in one
table and one chart. One server and one browser serve the module's tests."""

from __future__ import annotations

import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, served
from recorded_searches import lr_driven, record_experiment

from localdet.paths import Layout
from localdet.records.db import StateDB
from localdet.ui.web.app import create_app


@pytest.fixture(scope="module")
def searches(tmp_path_factory):
    """Two recorded searches in the served state folder: their ids."""
    layout = Layout(tmp_path_factory.mktemp("insight") / "home").ensure()
    with StateDB.open(layout.db) as db:
        ids = (record_experiment(db, "twelve", lr_driven(12)),
               record_experiment(db, "eight", lr_driven(8, seed=4)))
    return layout, ids


@pytest.fixture(scope="module")
def site(searches):
    with served(create_app(searches[0], token=None)) as url:
        yield url


@pytest.fixture(scope="module")
def context(site):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1300, "height": 900})
        yield context
        context.close()
        browser.close()


def test_the_experiment_page_shows_importance_bars_and_a_scatter_per_hyperparameter(
        searches, site, context):
    from playwright.sync_api import expect

    _, (twelve, _) = searches
    page = context.new_page()
    page.goto(f"{site}/experiments/{twelve}")

    bars = page.locator("#importance .barlayer .point")
    # lr, dropout, optimizer; the constant batch size left out. (The first page imports
    # Optuna in the server: a while on a busy machine.)
    expect(bars).to_have_count(3, timeout=30_000)
    # The most important bar is drawn on top: the last of the y axis's categories.
    names = page.evaluate("document.getElementById('importance')._fullLayout.yaxis._categories")
    assert names[-1] == "lr" and sorted(names) == ["dropout", "lr", "optimizer"]
    expect(page.locator("#importance")).to_contain_text("never varied: global_batch_size")

    expect(page.locator("#scatter .scatterlayer .trace")).to_have_count(3)
    layout = page.evaluate("""(() => {
      const l = document.getElementById('scatter')._fullLayout;
      return [l.xaxis.type, l.xaxis2.type, l.xaxis3.type, l.annotations.map((a) => a.text)];
    })()""")
    assert layout == ["linear", "log", "category", ["dropout", "lr", "optimizer"]]
    points = page.evaluate("document.getElementById('scatter').data.map((t) => t.x.length)")
    assert points == [12, 12, 12]
    page.close()


def test_two_ticked_experiments_open_side_by_side(searches, site, context):
    from playwright.sync_api import expect

    _, (twelve, eight) = searches
    page = context.new_page()
    page.goto(f"{site}/")
    button = page.locator("button#compare")
    expect(button).to_be_disabled()
    page.locator(f'input.choose[data-id="{twelve}"]').check()
    expect(button).to_be_disabled()  # one is not a comparison
    page.locator(f'input.choose[data-id="{eight}"]').check()
    expect(button).to_be_enabled()
    expect(page).to_have_url(f"{site}/")  # ticking did not open the row's experiment
    button.click()

    expect(page).to_have_url(f"{site}/compare?ids={twelve},{eight}")
    table = page.locator("#compare-table")
    expect(table.locator("thead th")).to_have_text(["", f"{twelve}: twelve", f"{eight}: eight"])
    for name in ("best trial", "best", "lr", "dropout", "optimizer", "val_accuracy"):
        expect(table.locator("tbody th", has_text=name).first).to_be_visible()
    curves = page.locator("#compare-curves .scatterlayer .trace")
    expect(curves).to_have_count(2)  # one line per experiment
    legend = page.locator("#compare-curves .legendtext")
    expect(legend.first).to_contain_text(f"experiment {twelve}: twelve")
    page.close()
