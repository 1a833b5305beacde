"""The dashboard's side of living with many experiments, in a real Chromium (Playwright) on
records made through the same operations `det` and the SDK call (no training): archived
experiments leave the list until asked for, and the page archives and unarchives; labels,
description and notes are edited on the page and the list filters by label; a delete asks
for the experiment's id first, refuses with the reason while trials are live, and removes;
a fork says where it came from; the model registry's pages list a model and its versions.

One server and one browser serve every test of the module; each test uses its own
experiments. The guards on the new POST routes are in tests/test_dashboard_security.py."""

from __future__ import annotations

import uuid as uuids

import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, served

from localdet.checkpoints.manifest import build_manifest
from localdet.checkpoints.store import Store
from localdet.operations import experiments as catalog
from localdet.operations import registry
from localdet.paths import Layout
from localdet.records import continuation
from localdet.records.db import NotFound, StateDB
from localdet.ui.web.app import create_app

TOKEN = "manage-token"


class Records:
    """The state folder the dashboard serves, and ways to make experiments in it."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.db = StateDB.open(layout.db)

    def experiment(self, name: str, state: str = "COMPLETED", trial_state: str | None = None,
                   checkpoint: bool = False, kind: str = "experiment") -> int:
        db = self.db
        experiment_id = db.create_experiment(
            name=name, description="", config={"name": name, "resources": {"slots_per_trial": 1}},
            original_config="", searcher="single", metric="val_loss", smaller_is_better=True,
            experiment_seed=1, model_dir="", kind=kind)
        if state != "ACTIVE":  # as created
            db.set_experiment_state(experiment_id, state)
        if trial_state or checkpoint:
            trial = db.create_trial(experiment_id=experiment_id, request_id=1, hparams={},
                                    seed=1, target_batches=10)
            db.update_trial(trial, state=trial_state or "COMPLETED")
            if checkpoint:
                self.checkpoint(experiment_id, trial)
        return experiment_id

    def checkpoint(self, experiment_id: int, trial_id: int) -> str:
        folder = self.layout.home / f"folder-{trial_id}"
        folder.mkdir()
        (folder / "model.txt").write_text(f"weights of trial {trial_id}")
        uuid = str(uuids.uuid4())
        self.db.add_checkpoint(build_manifest(
            uuid=uuid, experiment_id=experiment_id, trial_id=trial_id, batches_trained=10,
            files=Store(self.layout.store).put_directory(folder), metadata={}))
        return uuid


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    records = Records(Layout(tmp_path_factory.mktemp("manage") / "home").ensure())
    yield records
    records.db.close()


@pytest.fixture(scope="module")
def site(records):
    """The dashboard's address, served from a thread while the module's tests run."""
    with served(create_app(records.layout, token=TOKEN, host="127.0.0.1")) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def context(browser, site):
    """The browser's session with the dashboard, opened once from its address with the token
    (a cookie from then on)."""
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    context.new_page().goto(f"{site}/?token={TOKEN}")
    yield context
    context.close()


@pytest.fixture
def page(context, site):
    """A new tab of that session, on the experiment list."""
    page = context.new_page()
    page.goto(f"{site}/")
    yield page
    page.close()


def row(page, experiment_id: int):
    return page.locator(f'#experiments tbody tr[data-href="/experiments/{experiment_id}"]')


def test_archived_experiments_leave_the_list_until_asked_for_and_the_page_archives(
        records, site, page):
    from playwright.sync_api import expect

    kept = records.experiment("kept")
    old = records.experiment("old")
    catalog.archive(records.db, old)
    expect(row(page, kept)).to_be_visible()
    expect(row(page, old)).to_have_count(0)
    page.click("#archived-toggle")
    page.wait_for_url(f"{site}/?archived=1")
    expect(row(page, old)).to_contain_text("archived")
    expect(row(page, kept)).to_be_visible()
    page.click("#archived-toggle")  # hidden again
    expect(row(page, old)).to_have_count(0)

    row(page, kept).click()
    page.wait_for_url(f"{site}/experiments/{kept}")
    page.click("#archive-button")
    expect(page.locator("#message")).to_have_text(f"experiment {kept} archived")
    expect(page.locator("#archived")).to_be_visible()
    assert records.db.experiment(kept).archived
    page.goto(f"{site}/")
    page.wait_for_selector("#list > *")  # the list is shown
    expect(row(page, kept)).to_have_count(0)
    page.goto(f"{site}/experiments/{kept}")
    expect(page.locator("#archive-button")).to_have_text("Unarchive")
    page.click("#archive-button")
    expect(page.locator("#message")).to_have_text(f"experiment {kept} unarchived")
    assert not records.db.experiment(kept).archived
    # A live experiment cannot be archived: the one sentence saying why is shown.
    live = records.experiment("live", state="ACTIVE", trial_state="RUNNING")
    page.goto(f"{site}/experiments/{live}")
    page.click("#archive-button")
    expect(page.locator("#message.error")).to_contain_text(str(live))
    assert not records.db.experiment(live).archived
    # Jobs too: an archived one is on the Jobs page only when asked for.
    job = records.experiment("nightly-batch", kind="job")
    catalog.archive(records.db, job)
    page.goto(f"{site}/jobs")
    expect(page.locator("#archived-toggle")).to_have_text("Show archived")  # shown
    listed = page.locator("#jobs tbody tr", has_text="nightly-batch")
    expect(listed).to_have_count(0)
    page.click("#archived-toggle")
    expect(listed).to_contain_text("archived")


def test_labels_description_and_notes_are_edited_on_the_page_and_filter_the_list(
        records, site, page):
    from playwright.sync_api import expect

    tagged = records.experiment("tagged")
    other = records.experiment("other")
    catalog.add_label(records.db, other, "other-label")
    page.goto(f"{site}/experiments/{tagged}")
    page.fill("#label-input", "baseline")
    page.click("#label-form button")
    expect(page.locator("#labels")).to_contain_text("baseline")
    page.fill("#label-input", "keep")
    page.press("#label-input", "Enter")
    expect(page.locator("#labels .label")).to_have_count(2)
    page.fill("#description-input", "first try")
    page.click("#description-form button")
    expect(page.locator("#message")).to_have_text(f"description of experiment {tagged} saved")
    page.fill("#notes-input", "lr too high?\nnext: 0.001")
    page.click("#notes-form button")
    expect(page.locator("#message")).to_have_text(f"notes of experiment {tagged} saved")
    described = catalog.describe(records.layout, records.db, tagged)
    assert described["labels"] == ["baseline", "keep"]
    assert described["description"] == "first try"
    assert described["notes"] == "lr too high?\nnext: 0.001"
    page.reload()  # shown from the records
    expect(page.locator("#notes-input")).to_have_value("lr too high?\nnext: 0.001")
    expect(page.locator("#description-input")).to_have_value("first try")

    page.goto(f"{site}/")
    page.fill("#label-filter", "baseline")
    page.press("#label-filter", "Enter")
    page.wait_for_url(f"{site}/?label=baseline")
    expect(page.locator("#experiments tbody tr")).to_have_count(1)
    expect(row(page, tagged)).to_contain_text("keep")
    row(page, other).wait_for(state="detached")
    page.click("#clear-label")
    expect(row(page, other)).to_be_visible()
    row(page, other).locator("a.label", has_text="other-label").click()  # a label filters
    page.wait_for_url(f"{site}/?label=other-label")
    expect(page.locator("#experiments tbody tr")).to_have_count(1)
    expect(row(page, other)).to_be_visible()

    page.goto(f"{site}/experiments/{tagged}")
    page.click('button.remove-label[data-label="keep"]')
    expect(page.locator("#message")).to_contain_text("removed")
    expect(page.locator("#labels .label")).to_have_count(1)
    assert catalog.describe(records.layout, records.db, tagged)["labels"] == ["baseline"]


def test_a_delete_asks_for_the_id_refuses_live_experiments_and_removes(records, site, page):
    from playwright.sync_api import expect

    doomed = records.experiment("doomed", checkpoint=True)
    live = records.experiment("busy", state="ACTIVE", trial_state="RUNNING")
    page.goto(f"{site}/experiments/{doomed}")
    expect(page.locator("#delete-form")).to_be_hidden()
    page.click("#delete-button")
    confirm = page.locator("#delete-confirmed")
    expect(page.locator("#delete-form")).to_contain_text(f"Type {doomed} to confirm")
    expect(confirm).to_be_disabled()
    page.fill("#delete-confirm", str(doomed + 100))
    expect(confirm).to_be_disabled()
    page.click("#delete-cancel")
    expect(page.locator("#delete-form")).to_be_hidden()
    records.db.experiment(doomed)  # still there
    page.click("#delete-button")
    page.fill("#delete-confirm", str(doomed))
    confirm.click()
    page.wait_for_url(f"{site}/")
    expect(page.locator("#message")).to_have_text(f"experiment {doomed} deleted")
    expect(row(page, doomed)).to_have_count(0)
    with pytest.raises(NotFound):
        records.db.experiment(doomed)
    assert records.db.checkpoints(doomed) == []

    page.goto(f"{site}/experiments/{live}")
    page.click("#delete-button")
    page.fill("#delete-confirm", str(live))
    page.click("#delete-confirmed")
    refusal = page.locator("#message.error")
    expect(refusal).to_contain_text(str(live))
    assert refusal.text_content().count(". ") == 0  # one sentence
    assert page.url == f"{site}/experiments/{live}"
    records.db.experiment(live)  # kept


def test_a_fork_and_a_continuation_say_where_they_came_from(records, site, page):
    from playwright.sync_api import expect

    parent = records.experiment("parent", checkpoint=True)
    child = records.experiment("child")
    records.db.db.execute("UPDATE experiments SET parent_id = ? WHERE id = ?", [parent, child])
    records.db.db.conn.commit()
    # `det e continue parent` with a longer max_length, as lineage.continue_experiment
    # records it (its rows; no daemon here to train on).
    checkpoint = records.db.checkpoints(parent)[0]
    continuation.reopen(records.db, experiment_id=parent, trial_id=checkpoint.trial_id,
                        config={"name": "parent"}, target_batches=40,
                        resume_from=checkpoint.uuid, runner="daemon",
                        checkpoint=checkpoint.uuid, batches=10, target=40,
                        overrides={"searcher.max_length.batches": 40},
                        previous_state="COMPLETED")
    page.goto(f"{site}/")
    expect(row(page, child)).to_contain_text(f"forked from {parent}")
    expect(row(page, parent)).to_contain_text("continued ×1")
    page.goto(f"{site}/experiments/{child}")
    expect(page.locator("#forked-from")).to_have_text(f"forked from experiment {parent}")
    page.click("#forked-from a")
    page.wait_for_url(f"{site}/experiments/{parent}")
    expect(page.locator("#forks")).to_contain_text(str(child))
    expect(page.locator("#continued li")).to_contain_text(
        f"from checkpoint {checkpoint.uuid[:8]} at 10 batches, to 40 batches; changed "
        "searcher.max_length.batches=40")


def test_the_model_registry_pages_list_models_and_their_versions(records, site, page):
    from playwright.sync_api import expect

    source = records.experiment("source", checkpoint=True)
    checkpoint = records.db.checkpoints(source)[0]
    created = registry.create_model(records.db, "digits-classifier", description="for the app",
                                    labels=["prod"])
    registry.register_version(records.db, "digits-classifier", checkpoint.uuid,
                              name="first", comment="the baseline")
    registry.create_model(records.db, "retired")
    registry.archive_model(records.db, "retired")
    page.goto(f"{site}/models")
    model = page.locator("#models tbody tr", has_text="digits-classifier")
    expect(model).to_contain_text("for the app")
    expect(model).to_contain_text("prod")
    expect(model.locator("td").nth(3)).to_have_text("1")  # versions
    retired = page.locator("#models tbody tr", has_text="retired")
    expect(retired).to_have_count(0)  # archived: shown when asked
    page.click("#archived-toggle")
    expect(retired).to_contain_text("archived")
    model.click()
    expect(page.locator("h1")).to_have_text("Model digits-classifier")
    version = page.locator("#versions tbody tr")
    expect(version).to_have_count(1)
    expect(version).to_contain_text("first")
    expect(version).to_contain_text("the baseline")
    link = version.locator(f'a[title="{checkpoint.uuid}"]')
    expect(link).to_have_text(checkpoint.uuid[:8])
    link.click()
    page.wait_for_url(f"{site}/trials/{checkpoint.trial_id}")
    listed = page.locator("#checkpoints tbody tr", has_text=checkpoint.uuid)
    expect(listed).to_contain_text("digits-classifier v1")  # and back to its model
    listed.locator("a", has_text="digits-classifier v1").click()
    page.wait_for_url(f"{site}/models/{created['id']}")
