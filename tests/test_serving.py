"""What the dashboard and the report server share (localdet/serving.py): one token check
and one error handling. Against a real report server on 127.0.0.1 in this process (a
recorded, running trial), and the shared parts alone: a wrong token, a malformed body and
an unexpected error each answered with its status and one sentence."""

from __future__ import annotations

import asyncio
import http.client
import json

import pytest
from conftest import start_trial
from starlette.requests import Request

from localdet.paths import Layout
from localdet.records.db import now
from localdet.reporting import report_handler
from localdet.reporting.report_server import ReportServer, daemon_secret, launch_token
from localdet.serving import Refused, answer, presented_token, token_matches


@pytest.fixture
def served(tmp_path):
    db, trial_id, _, _ = start_trial(tmp_path, target=100)
    db.update_trial(trial_id, state="RUNNING", started_at=now())
    layout = Layout(tmp_path / "home")
    logged: list[str] = []
    server = ReportServer(layout, "127.0.0.1", log=logged.append).start()
    yield server, trial_id, launch_token(daemon_secret(layout), trial_id, 1), logged
    server.close()
    db.close()


def ask(server: ReportServer, method: str, path: str, body: bytes | str | None = None,
        token: str = "", launch: str = "1") -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request(method, path, body, {"Authorization": f"Bearer {token}",
                                                "X-Localdet-Launch": launch})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def one_sentence(answer: dict) -> str:
    (sentence,) = [answer["error"]]
    assert "\n" not in sentence and "Traceback" not in sentence
    return sentence


def test_a_wrong_token_is_refused_with_one_sentence(served):
    server, trial_id, token, _ = served
    for wrong in ("", "0" * 64, token[:-1], launch_token(server.secret, trial_id + 1, 1)):
        status, body = ask(server, "POST", f"/v1/trials/{trial_id}/hello", "{}", wrong)
        assert status == 403
        assert one_sentence(body).startswith(f"the report token is not trial {trial_id}'s "
                                             "for launch 1")
    # The right token for another launch is wrong too.
    status, body = ask(server, "POST", f"/v1/trials/{trial_id}/hello", "{}", token, "2")
    assert status == 403 and "for launch 2" in one_sentence(body)
    assert ask(server, "POST", f"/v1/trials/{trial_id}/hello", "{}", token) == \
        (200, {"ok": True})


@pytest.mark.parametrize("path, body, says", [
    ("report", "{not json", "the request's body is not JSON"),
    ("report", "[1, 2]", "a report request's JSON body must be an object"),
    ("report", '{"metrics": [["training", 10]]}', "a report's \"metrics\" must be a list"),
    ("report", '{"metrics": [["testing", 10, {}]]}', "metric kind 'testing' is neither"),
    ("target", '{"batches": "ten"}', "needs a whole number \"batches\""),
    ("checkpoints/abc/commit", '{"files": {}}', "needs a whole number \"batches_trained\""),
    ("checkpoints/abc/missing", '{"hashes": 7}', "\"hashes\" must be a list"),
])
def test_a_malformed_body_is_refused_400_with_one_sentence(served, path, body, says):
    server, trial_id, token, logged = served
    status, answered = ask(server, "POST", f"/v1/trials/{trial_id}/{path}", body, token)
    assert status == 400 and says in one_sentence(answered)
    assert not logged  # the trial's mistake, not the daemon's


def test_an_unknown_endpoint_and_a_missing_launch_are_one_sentence_each(served):
    server, trial_id, token, _ = served
    status, body = ask(server, "GET", "/v2/anything", token=token)
    assert status == 404 and one_sentence(body) == "no such report endpoint: GET /v2/anything"
    status, body = ask(server, "GET", f"/v1/trials/{trial_id}/info", token=token, launch="x")
    assert status == 400 and "names no trial id or launch number" in one_sentence(body)


def test_an_unexpected_error_is_logged_whole_and_answered_500_in_one_sentence(served,
                                                                              monkeypatch):
    server, trial_id, token, logged = served

    def broken(reporter):
        raise RuntimeError("the trial's facts are unreadable")

    monkeypatch.setattr(report_handler, "_info", broken)
    status, body = ask(server, "GET", f"/v1/trials/{trial_id}/info", token=token)
    assert status == 500
    assert one_sentence(body) == ("the daemon's report server failed on this request "
                                  "(RuntimeError: the trial's facts are unreadable); see its "
                                  "log")
    (entry,) = logged
    assert "Traceback" in entry and "the trial's facts are unreadable" in entry


def request(headers: dict[str, str], query: str = "") -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "query_string":
                    query.encode(), "headers": [(k.lower().encode(), v.encode())
                                                for k, v in headers.items()]})


def test_the_token_check_both_servers_use():
    assert presented_token(request({"Authorization": "Bearer abc"})) == "abc"
    assert presented_token(request({"Authorization": "bearer abc"})) == "abc"
    # The query and a cookie count only where the server allows them (the dashboard's page).
    assert presented_token(request({}, "token=abc")) == ""
    assert presented_token(request({}, "token=abc"), query=True) == "abc"
    assert presented_token(request({"Cookie": "c=abc"}), cookie="c") == "abc"
    assert presented_token(request({"Authorization": "Basic abc"}), query=True) == ""
    assert token_matches("abc", "abc")
    assert not token_matches("abd", "abc") and not token_matches("", "abc")


def test_the_error_handling_both_servers_use():
    def run(work, **kwargs):
        async def call():
            return work()
        response = asyncio.run(answer(call, **kwargs))
        return response.status_code, json.loads(response.body)

    assert run(lambda: {"ok": 1}) == (200, {"ok": 1})

    def refused():
        raise Refused(409, "trial 3 is not running launch 2", missing=["x"])

    assert run(refused) == (409, {"error": "trial 3 is not running launch 2",
                                  "missing": ["x"]})

    def lookup():
        raise KeyError("no experiment 9")

    assert run(lookup, errors=((LookupError, 404),)) == (404, {"error": "'no experiment 9'"})
    assert run(lookup, errors=((LookupError, lambda e: (503, f"busy: {e}")),)) == \
        (503, {"error": "busy: 'no experiment 9'"})
    logged: list[str] = []
    status, body = run(lookup, log=logged.append, server="the dashboard")
    assert status == 500 and body == {"error": "the dashboard failed on this request "
                                               "(KeyError: 'no experiment 9'); see its log"}
    assert "Traceback" in logged[0]
