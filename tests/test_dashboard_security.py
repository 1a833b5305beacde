"""The dashboard lets in only its user: a foreign Host header (DNS rebinding) is refused on
every binding, a state-changing request needs the dashboard's own page behind it (Origin and
X-Localdet-Request), a token is on by default on loopback too (`--no-token` turns it off
there only), and URL parts never reach files the database does not name. A real uvicorn on
a free port, asked with http.client, which sends the Host and Origin headers as given."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import socket
import subprocess
import sys
import tarfile
import threading
import uuid as uuids

import pytest
import uvicorn
from conftest import wait_for

from localdet.checkpoints.manifest import build_manifest
from localdet.checkpoints.store import Store
from localdet.ui.web.app import create_app
from localdet.ui.web.server import WebError, start_in_thread

TOKEN = "s3cret-token"
FOREIGN = {"Origin": "http://attacker.example", "Content-Type": "text/plain"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def running(server: uvicorn.Server, thread: threading.Thread | None = None):
    """Until the block ends: the server, run in `thread` (started here if not given)."""
    if thread is None:
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), 30, "the dashboard")
        assert server.started
        yield
    finally:
        server.should_exit = True
        thread.join(30)


def dashboard_thread() -> threading.Thread:
    """The thread `start_in_thread` just started."""
    return next(t for t in threading.enumerate() if t.name == "dashboard" and t.is_alive())


@contextlib.contextmanager
def dashboard(layout, token: str | None = None, host: str = "127.0.0.1"):
    """The app as served on `host`, listening on 127.0.0.1 (the Host header is what is
    checked, not the socket); yields its port."""
    port = free_port()
    app = create_app(layout, token=token, host=host)
    with running(uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                               log_level="warning", log_config=None))):
        yield port


def ask(port: int, method: str, path: str, body: str | None = None, **headers):
    """(status, headers, body) of one request; Host defaults to 127.0.0.1:port."""
    headers = {k.replace("_", "-"): v for k, v in headers.items()}
    headers.setdefault("Host", f"127.0.0.1:{port}")
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def error_of(body: bytes) -> str:
    return json.loads(body)["error"]


@pytest.fixture
def experiment(db) -> int:
    """An ACTIVE experiment with one QUEUED trial, as the daemon records one."""
    experiment_id = db.create_experiment(
        name="e", description="", config={"secret_setting": "do-not-leak"},
        original_config="", searcher="single", metric="val_loss", smaller_is_better=True,
        experiment_seed=1, model_dir="")
    db.create_trial(experiment_id=experiment_id, request_id=1, hparams={}, seed=1,
                    target_batches=10)
    return experiment_id


def own_page(port: int, **headers) -> dict:
    """The headers the dashboard's own page sends with its buttons' POSTs."""
    return {"Origin": f"http://127.0.0.1:{port}", "X-Localdet-Request": "1", **headers}


# -- DNS rebinding ----------------------------------------------------------------------------

def test_a_rebound_host_name_is_refused_even_with_the_token(layout, experiment):
    with dashboard(layout, token=TOKEN) as port:
        for host in ("attacker.example:8766", "attacker.example", "localhost.attacker.example",
                     "127.0.0.1.nip.io", "127.0.0.1:80@attacker.example", ""):
            status, _, body = ask(port, "GET", f"/api/experiments/{experiment}", Host=host,
                                  Authorization=f"Bearer {TOKEN}")
            assert status == 403, host
            assert f"does not answer to the host '{host}'" in error_of(body)
            assert b"do-not-leak" not in body
        for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LOCALHOST",
                     f"[::1]:{port}", "[::1]", "127.0.0.2"):
            status, _, body = ask(port, "GET", f"/api/experiments/{experiment}", Host=host,
                                  Authorization=f"Bearer {TOKEN}")
            assert status == 200 and b"do-not-leak" in body, host


@pytest.mark.parametrize("bind, allowed, refused", [
    ("0.0.0.0", ["10.1.2.3:8090", "127.0.0.1", "localhost:8090", "[fe80::1]:8090",
                 socket.gethostname()], ["attacker.example:8090", "10.1.2.3.nip.io"]),
    ("::", ["10.1.2.3", "[::1]:8090"], ["attacker.example"]),
    ("192.0.2.7", ["192.0.2.7:8090", "192.0.2.7"], ["127.0.0.1:8090", "localhost", "10.1.2.3",
                                                    "attacker.example"]),
    ("dash.example", ["dash.example:8090", "DASH.example"], ["attacker.example", "127.0.0.1"]),
])
def test_other_bindings_answer_only_to_their_own_addresses(layout, bind, allowed, refused):
    with dashboard(layout, token=TOKEN, host=bind) as port:
        for host in allowed:
            assert ask(port, "GET", f"/api/jobs?token={TOKEN}", Host=host)[0] == 200, host
        for host in refused:
            assert ask(port, "GET", f"/api/jobs?token={TOKEN}", Host=host)[0] == 403, host


# -- cross-site requests ----------------------------------------------------------------------

def test_a_cross_origin_form_post_is_refused_and_not_carried_out(layout, db, experiment):
    trial = db.trials(experiment)[0].id
    with dashboard(layout) as port:  # no token: only the same-origin proof stands guard
        kill = f"/api/experiments/{experiment}/kill"
        status, _, body = ask(port, "POST", kill, body="x", **FOREIGN)
        assert status == 403
        assert "Origin header" in error_of(body) and f"http://127.0.0.1:{port}" in error_of(body)
        # Every half of the proof is needed, and a browser's word for the origin counts.
        for headers in ({**FOREIGN, "X-Localdet-Request": "1"},
                        {"Origin": "null", "X-Localdet-Request": "1"},
                        {"X-Localdet-Request": "1"},
                        {"Sec-Fetch-Site": "cross-site", "X-Localdet-Request": "1"},
                        {"Origin": f"http://localhost:{port}", "X-Localdet-Request": "1"},
                        {"Sec-Fetch-Site": "same-origin", "Origin": "http://attacker.example",
                         "X-Localdet-Request": "1"}):
            status, _, body = ask(port, "POST", kill, body="x", **headers)
            assert status == 403 and "Origin header" in error_of(body), headers
        for headers in ({"Origin": f"http://127.0.0.1:{port}", "Content-Type": "text/plain"},
                        {"Sec-Fetch-Site": "same-origin"}):
            status, _, body = ask(port, "POST", f"/api/trials/{trial}/kill", body="x",
                                  **headers)
            assert status == 403 and "X-Localdet-Request" in error_of(body), headers
        assert ask(port, "PUT", kill, **FOREIGN)[0] == 403  # any method but GET and HEAD
    assert db.pending_requests() == []
    assert db.experiment(experiment).state == "ACTIVE"


def test_the_own_pages_request_with_the_token_is_carried_out(layout, db, experiment):
    trial = db.trials(experiment)[0].id
    with dashboard(layout, token=TOKEN) as port:
        pause = f"/api/experiments/{experiment}/pause"
        assert ask(port, "POST", pause, **own_page(port))[0] == 401  # the token first
        status, _, body = ask(port, "POST", pause, **own_page(port, Authorization="Bearer no"))
        assert status == 401 and "needs its token" in error_of(body)
        assert db.pending_requests() == []
        status, _, body = ask(port, "POST", pause,
                              **own_page(port, Authorization=f"Bearer {TOKEN}"))
        assert status == 200, body
        assert json.loads(body)["message"].startswith(f"pause requested for experiment "
                                                      f"{experiment}")
        # The page opened from the printed address gets the token as a cookie, and its
        # buttons' requests (Sec-Fetch-Site where a browser sends no Origin) carry it.
        status, headers, _ = ask(port, "GET", f"/?token={TOKEN}")
        assert status == 200
        cookie = headers["set-cookie"]
        assert cookie.startswith(f"localdet_token_{port}={TOKEN};")
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert headers["content-security-policy"] == "frame-ancestors 'none'"
        status, _, body = ask(port, "POST", f"/api/trials/{trial}/kill",
                              Cookie=cookie.split(";")[0], Sec_Fetch_Site="same-origin",
                              X_Localdet_Request="1")
        assert status == 200, body
        assert ask(port, "GET", "/api/jobs", Cookie=f"localdet_token_{port}=no")[0] == 401
    assert [(r["action"], r["experiment_id"], r["trial_id"]) for r in db.pending_requests()] \
        == [("pause", experiment, None), ("kill", None, trial)]


# -- the token, by default --------------------------------------------------------------------

def test_the_token_is_on_by_default_on_loopback_and_no_token_turns_it_off_there(layout):
    port = free_port()
    server, url = start_in_thread(layout, "127.0.0.1", port)
    with running(server, dashboard_thread()):
        assert url.startswith(f"http://127.0.0.1:{port}/?token=")
        token = url.rsplit("=", 1)[1]
        assert len(token) >= 24
        status, _, body = ask(port, "GET", "/api/experiments")
        assert status == 401 and "needs its token" in error_of(body)
        assert ask(port, "GET", "/")[0] == 401
        assert ask(port, "GET", f"/api/experiments?token={token}")[:3:2] == (200, b"[]")
    port = free_port()
    server, url = start_in_thread(layout, "127.0.0.1", port, token=False)
    with running(server, dashboard_thread()):
        assert url == f"http://127.0.0.1:{port}/"
        assert ask(port, "GET", "/api/experiments")[:3:2] == (200, b"[]")
        assert ask(port, "POST", "/api/experiments/1/kill", **FOREIGN)[0] == 403
    with pytest.raises(WebError, match=r"^--no-token is allowed only on a loopback address "
                                       r"such as 127.0.0.1, not on 0.0.0.0"):
        start_in_thread(layout, "0.0.0.0", free_port(), token=False)


def test_the_commands_print_the_address_with_its_token_and_refuse_no_token_elsewhere(
        home, processes):
    for args in (["web"], ["web", "--no-token"]):
        port = free_port()
        server = processes([sys.executable, "-m", "localdet", *args, "--port", port],
                           env=home.env, stderr=subprocess.PIPE, text=True)
        announced = server.stderr.readline().strip()
        server.terminate()
        server.wait(timeout=30)
        if "--no-token" in args:
            assert announced == f"dashboard at http://127.0.0.1:{port}/"
        else:
            assert announced.startswith(f"dashboard at http://127.0.0.1:{port}/?token=")
    for args in (["web"], ["daemon", "--web"]):
        result = home.cli(*args, "--host", "0.0.0.0", "--no-token", "--port", free_port(),
                          check=False)
        assert result.returncode == 1
        assert result.stderr.startswith("error: --no-token is allowed only on a loopback")
        assert result.stderr.count("\n") == 1, result.stderr  # one sentence, no traceback


# -- URL parts --------------------------------------------------------------------------------

def test_url_parts_are_looked_up_never_joined_to_a_path(layout, db, experiment, tmp_path):
    trial = db.trials(experiment)[0].id
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "model.txt").write_text("weights")
    checkpoint = str(uuids.uuid4())
    db.add_checkpoint(build_manifest(
        uuid=checkpoint, experiment_id=experiment, trial_id=trial, batches_trained=5,
        files=Store(layout.store).put_directory(tmp_path / "folder"), metadata={}))
    secret = b"SECRET-CONTENT-4f1a"
    (layout.home / "secret.tar.gz").write_bytes(secret)
    (layout.home / "secret.txt").write_bytes(secret)
    (tmp_path / "secret.tar.gz").write_bytes(secret)
    with dashboard(layout) as port:
        status, _, body = ask(port, "GET", f"/api/checkpoints/{checkpoint}.tar.gz")
        assert status == 200
        with tarfile.open(fileobj=io.BytesIO(body)) as archive:
            assert archive.extractfile(f"{checkpoint}/model.txt").read() == b"weights"
        for path in (f"/api/checkpoints/{checkpoint[:8]}.tar.gz",  # a prefix: not a download
                     "/api/checkpoints/...tar.gz", "/api/checkpoints/..%2Fsecret.tar.gz",
                     "/api/checkpoints/%2E%2E%2F%2E%2E%2Fsecret.tar.gz",
                     f"/api/checkpoints/{checkpoint}%2F..%2F..%2Fsecret.tar.gz",
                     "/api/checkpoints/../secret.tar.gz", "/api/checkpoints/%00.tar.gz",
                     f"/api/trials/{trial}%2F..%2F..%2Fsecret.txt", "/api/trials/..%2F1",
                     "/api/trials/-1", "/api/trials/999", "/api/experiments/1.0",
                     "/api/experiments/999", "/static/../../secret.txt",
                     "/static/..%2F..%2F..%2Fsecret.txt", "/static/%2E%2E/app.py",
                     "/../secret.txt", "/experiments/..%2F..%2Fsecret.txt"):
            status, _, body = ask(port, "GET", path)
            assert status in (400, 404), (path, status)
            assert secret not in body and b"import" not in body, path


def test_the_managing_posts_are_guarded_as_the_actions_are(layout, db, experiment):
    """Archive, labels, description, notes and delete (localdet/ui/web/manage.py): each is
    refused without the own page's proof or the token, and a delete without the typed id."""
    from localdet.operations import experiments as catalog

    db.set_experiment_state(experiment, "COMPLETED")
    db.update_trial(db.trials(experiment)[0].id, state="COMPLETED")
    token = {"Authorization": f"Bearer {TOKEN}"}
    with dashboard(layout, token=TOKEN) as port:
        for what, body in (("archive", ""), ("unarchive", ""), ("labels", '{"add": "x"}'),
                           ("labels", '{"remove": "x"}'), ("description", '{"text": "x"}'),
                           ("notes", '{"text": "x"}'),
                           ("delete", f'{{"confirm": "{experiment}"}}')):
            path = f"/api/experiments/{experiment}/{what}"
            status, _, answer = ask(port, "POST", path, body, **FOREIGN, **token)
            assert status == 403 and "Origin header" in error_of(answer), what
            status, _, answer = ask(port, "POST", path, body, Origin=f"http://127.0.0.1:{port}",
                                    **token)
            assert status == 403 and "X-Localdet-Request" in error_of(answer), what
            assert ask(port, "POST", path, body, **own_page(port))[0] == 401, what
            assert ask(port, "GET", path, **token)[0] == 405, what  # POSTs only
        facts = catalog.describe(layout, db, experiment)  # nothing was changed
        assert (facts["archived"], facts["labels"], facts["description"], facts["notes"]) \
            == (False, [], "", "")
        labels = f"/api/experiments/{experiment}/labels"
        status, _, answer = ask(port, "POST", labels, '{"add": "kept"}',
                                **own_page(port, **token))
        assert status == 200, answer
        status, _, answer = ask(port, "POST", labels, "not json", **own_page(port, **token))
        assert status == 400 and error_of(answer) == "the request's body must be a JSON object"
        # A delete names the id again (the page asks its user to type it), else refused.
        delete = f"/api/experiments/{experiment}/delete"
        for body in ("", '{"confirm": "999"}'):
            status, _, answer = ask(port, "POST", delete, body, **own_page(port, **token))
            assert status == 409, body
            assert error_of(answer) == (f"type the experiment's id, {experiment}, to confirm "
                                        "that it is to be deleted")
        assert catalog.describe(layout, db, experiment)["labels"] == ["kept"]
        assert ask(port, "GET", "/api/models")[0] == 401
        assert ask(port, "GET", "/api/models", **token)[:3:2] == (200, b"[]")
        status, _, answer = ask(port, "POST", delete, f'{{"confirm": "{experiment}"}}',
                                **own_page(port, **token))
        assert status == 200, answer
        assert ask(port, "GET", f"/api/experiments/{experiment}", **token)[0] == 404
