"""The dashboard's Starlette application: one page (its script renders every view) and a
JSON API over the same facts `localdet status` shows.

    app = create_app(Layout.from_environment(), token=T, host="127.0.0.1")

    GET  /, /experiments/{id}, /trials/{id}, /jobs,
         /models, /models/{id}                          the page
    GET  /api/experiments[?archived=1][&label=L...]     experiments (jobs excluded; archived
                                                        ones only when asked; with every label)
    GET  /api/experiments/{id}                          facts, labels, notes, origin, config,
                                                        importances, charts, rungs (the curves
                                                        of the best 25 trials and the running
                                                        ones, thinned for drawing)
    GET  /api/experiments/{id}/curves?full=1[&trials=all]   every point of those (of all)
    GET  /api/trials/{id}                               facts, charts, checkpoints (and the
                                                        model versions naming them), log tail
    GET  /api/trials/{id}/curves?full=1                 every point of its curves
    GET  /api/jobs[?archived=1]                         jobs (archived ones when asked)
    GET  /api/daemon                                    running?, what it holds back (disk),
                                                        localdet's version
    GET  /api/checkpoints/{uuid}.tar.gz                 a checkpoint's folder, as a download
    POST /api/experiments/{id}/{pause|resume|kill}      as `localdet pause|resume|kill ID`
    POST /api/trials/{id}/{pause|resume|kill}           as `... --trial ID`
    (archive, delete, labels, notes and the model registry: localdet/ui/web/manage.py;
    experiments side by side, /compare?ids=3,7: localdet/ui/web/comparing.py)

Only the dashboard's own user gets in; each refusal is one sentence:
- the Host header must name the address served (`host`; on loopback, localhost or a loopback
  address; on 0.0.0.0 or ::, an IP address or this machine's name), else 403: this stops
  DNS rebinding, where a foreign site's name is pointed at this port;
- with a token, every request carries it (`Authorization: Bearer T`, `?token=T`, or the
  HttpOnly, SameSite=Strict cookie a page opened with `?token=T` gets), else 401;
- a request other than GET and HEAD must come from the dashboard's own page: an Origin header
  of this address (or `Sec-Fetch-Site: same-origin`) and an `X-Localdet-Request` header, which
  a plain HTML form cannot send and a foreign page's script cannot send without this server's
  consent (CORS, never given), else 403.
URL ids and checkpoint uuids are looked up in the database, never joined to a path as given.
Every action is the operation `localdet` and `det` call (localdet/operations/).
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import json
import re
import shutil
import socket
import sqlite3
import tarfile
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import plotly
import yaml
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from localdet import __version__
from localdet.operations import experiments as catalog
from localdet.operations.errors import OperationError
from localdet.operations.importance import importances
from localdet.paths import Layout
from localdet.pids import DaemonLock
from localdet.processes.launcher import log_tail
from localdet.records.checkpoint_rows import registrations
from localdet.records.continuation import CONTINUED_EVENT
from localdet.records.db import NotFound, StateDB
from localdet.records.opening import RecordsUnavailable, unavailable
from localdet.records.states import ExperimentKind
from localdet.serving import Refused, answer, presented_token, refusal, token_matches
from localdet.ui import views
from localdet.ui.web import comparing, figures, manage, system_figure, timeline_figure

STATIC = Path(__file__).parent / "static"
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
COOKIE = "localdet_token"
LOG_TAIL_LINES = 60
HOST_HEADER = re.compile(r"(?:\[([0-9a-f:.]+)\]|([^:\[\]/@\s]+))(?::\d+)?")  # name[:port]


def _ip(text: str):
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def is_loopback(host: str) -> bool:
    address = _ip(host)
    return host == "localhost" or bool(address and address.is_loopback)


def host_names(bind: str) -> Callable[[str], bool]:
    """Whether a Host header's name (port and brackets removed) is one the dashboard bound
    to `bind` answers to. IP addresses cannot be rebound to a foreign site, names can."""
    bound = _ip(bind)
    if is_loopback(bind):
        return is_loopback
    if bound is not None and bound.is_unspecified:  # every address of this machine
        names = {"localhost", socket.gethostname().lower(), socket.getfqdn().lower()}
        return lambda name: name in names or _ip(name) is not None
    return lambda name: (_ip(name) == bound) if bound is not None else name == bind.lower()


def _name_in(host_header: str) -> str | None:
    """`127.0.0.1:8090` -> `127.0.0.1`, `[::1]:8090` -> `::1`; None if malformed."""
    match = HOST_HEADER.fullmatch(host_header.lower())
    return match and (match.group(1) or match.group(2))


_refuse = refusal  # the report server's too (localdet/serving.py)


class Guard(BaseHTTPMiddleware):
    """Lets in only the dashboard's own user (see the module's docstring)."""

    def __init__(self, app, token: str | None, host: str):
        super().__init__(app)
        self.token = token
        self.answers_to = host_names(host)

    async def dispatch(self, request: Request, call_next):
        host = request.headers.get("host", "")
        name = _name_in(host)
        if not name or not self.answers_to(name):
            return _refuse(403, f"this dashboard does not answer to the host '{host}'; open "
                                "it at the address it printed at start")
        cookie = f"{COOKIE}_{request.url.port or 80}"  # one per port: dashboards side by side
        if self.token:  # checked as the report server checks a trial's (localdet/serving.py)
            given = presented_token(request, query=True, cookie=cookie)
            if not token_matches(given, self.token):
                return _refuse(401, "this dashboard needs its token: open the address it "
                                    "printed at start (with ?token=...), or send "
                                    "Authorization: Bearer <token>")
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("origin")
            if origin is not None:
                same = origin.lower() in (f"http://{host.lower()}", f"https://{host.lower()}")
            else:
                same = request.headers.get("sec-fetch-site") == "same-origin"
            if not same:
                return _refuse(403, f"a {request.method} must come from the dashboard's own "
                                    "page: its Origin header (or Sec-Fetch-Site: same-origin) "
                                    f"must name this address, http://{host}")
            if "x-localdet-request" not in request.headers:
                return _refuse(403, f"a {request.method} must carry the X-Localdet-Request "
                                    "header that the dashboard's own page sends")
        response = await call_next(request)
        if self.token and request.query_params.get("token"):  # opened from the printed address
            response.set_cookie(cookie, self.token, httponly=True, samesite="strict")
        # Not inside another site's frame, where a click could be steered onto Kill.
        response.headers["Content-Security-Policy"] = "frame-ancestors 'none'"
        response.headers["X-Frame-Options"] = "DENY"
        return response


def create_app(layout: Layout, token: str | None = None, host: str = "127.0.0.1") -> Starlette:
    figures.prepare()  # before any request: concurrent first requests imported them at once
    @contextlib.contextmanager
    def database(write: bool = False) -> Iterator[StateDB]:
        """The database, open for one request: read-only unless it `write`s (a request
        that only reads never creates, migrates or backs up the records)."""
        if not layout.db.exists():
            raise NotFound(f"no localdet state at {layout.home} yet; start the daemon with "
                           "`localdet daemon start` and submit an experiment")
        db = StateDB.open(layout.db) if write else StateDB.open_readonly(layout.db)
        try:
            yield db
        finally:
            db.close()

    def api(handler):
        """A JSON endpoint: the handler's result, NotFound as 404, a refused action as 409
        (errors answered as the report server's are, localdet/serving.py). A POST's handler
        gets its JSON body (an object; {} when empty) too."""
        async def work(request: Request) -> Any:
            args: tuple = (request,)
            if request.method == "POST":
                raw = await request.body()
                try:
                    body = json.loads(raw) if raw.strip() else {}
                except ValueError:
                    body = None
                if not isinstance(body, dict):
                    raise Refused(400, "the request's body must be a JSON object")
                args = (request, body)
            return await run_in_threadpool(handler, *args)  # SQLite and the store block

        async def endpoint(request: Request) -> Response:
            return await answer(lambda: work(request), errors, server="the dashboard")
        return endpoint

    errors = (
        (NotFound, 404), (OperationError, 409),
        (RecordsUnavailable, 503),  # damaged, a newer schema, a directory, ...
        # met past the open: locked, a damaged page, ...
        (sqlite3.Error, lambda error: (503, str(unavailable(layout.db, error)))),
    )

    def experiments(request: Request) -> list[dict]:
        _warm_up()
        if not layout.db.exists():
            return []  # nothing submitted yet
        archived = request.query_params.get("archived") in ("1", "true")
        labels = [label for label in request.query_params.getlist("label") if label]
        with database() as db:
            rows = catalog.list_experiments(db, archived=None if archived else False,
                                            labels=labels, kind=ExperimentKind.EXPERIMENT,
                                            with_best_metric=True)
            # How often each was continued (`det e continue`), beside where it was forked from.
            continued = Counter(e["experiment_id"] for e in db.events(kinds=(CONTINUED_EVENT,)))
        return [{**row, "continued": continued[row["id"]]} for row in rows]

    def daemon(request: Request) -> dict:
        """Whether a daemon runs, and what it holds back and why; this localdet's version."""
        running = DaemonLock.holder(layout.daemon_lock) is not None
        if not running or not layout.db.exists():
            return {"running": running, "notice": None, "version": __version__}
        with database() as db:
            return {"running": True, "notice": views.daemon_notice(db), "version": __version__}

    def experiment(request: Request) -> dict:
        with database() as db:
            record = db.experiment(int(request.path_params["id"]))
            facts = catalog.describe(layout, db, record.id)
            _import_optuna()  # whole, before importances imports it
            facts["importances"] = importances(layout, db, record.id)  # cached till it changes
            facts["config"] = yaml.safe_dump(record.config, sort_keys=False)
            drawn = figures.curve_trials(facts["trials"], record.metric,
                                         record.smaller_is_better)
            facts["charts"] = {
                "curves": figures.curves(db, drawn, facts["best_trial"]),
                "curves_drawn": _drawn(drawn, len(facts["trials"]),
                                       f"/api/experiments/{record.id}/curves"),
                "hyperparameters": figures.hyperparameters(record, facts["trials"]),
                "importance": figures.importance(facts["importances"]),
                "scatter": figures.scatter(record, facts["trials"]),
                "timeline": timeline_figure.strips(db, record.id),
            }
            return facts

    def trial(request: Request) -> dict:
        with database() as db:
            record = db.trial(int(request.path_params["id"]))
            experiment = db.experiment(record.experiment_id)
            launches = views.launches_by_trial(db.events(experiment.id)).get(record.id)
            facts = views.trial_facts(db, record, experiment, launches)
            facts["experiment"] = {"id": experiment.id, "name": experiment.name,
                                   "metric": experiment.metric}
            facts["checkpoints"] = [  # with the model versions that register each
                {**views.checkpoint_facts(c), "registered": registrations(db, c.uuid)}
                for c in db.checkpoints(trial_id=record.id)]
            facts["charts"] = {"curves": figures.curves(db, [record.id]),
                               "timeline": timeline_figure.strips(db, experiment.id, record.id),
                               "system": system_figure.figure(db, record.id),
                               "curves_drawn": _drawn([record.id], 1,
                                                      f"/api/trials/{record.id}/curves")}
            facts["log_tail"] = log_tail(layout.trial_log(experiment.id, record.id),
                                         LOG_TAIL_LINES)
            return facts

    def experiment_curves(request: Request) -> dict:
        """Every point (`?full=1`) of the trials the page draws, or of every trial
        (`?trials=all`); without `full`, thinned as the page's."""
        with database() as db:
            record = db.experiment(int(request.path_params["id"]))
            facts = views.experiment_facts(db, record)
            chosen = [t["id"] for t in facts["trials"]] \
                if request.query_params.get("trials") == "all" else \
                figures.curve_trials(facts["trials"], record.metric, record.smaller_is_better)
            return {"curves": figures.curves(db, chosen, facts["best_trial"],
                                             full=_full(request)),
                    "curves_drawn": _drawn(chosen, len(facts["trials"]), request.url.path,
                                           _full(request))}

    def trial_curves(request: Request) -> dict:
        """Every point of one trial's series (`?full=1`), or thinned as its page's."""
        with database() as db:
            record = db.trial(int(request.path_params["id"]))
            return {"curves": figures.curves(db, [record.id], full=_full(request)),
                    "curves_drawn": _drawn([record.id], 1, request.url.path, _full(request))}

    def jobs(request: Request) -> list[dict]:
        if not layout.db.exists():
            return []
        archived = request.query_params.get("archived") in ("1", "true")
        with database() as db:
            return [{**_summary(views.job_facts(db, layout, e)), "archived": e.archived}
                    for e in db.experiments(kind=ExperimentKind.JOB) if archived or not e.archived]

    def act(request: Request, body: dict) -> dict:
        target = {"experiments": "experiment_id",
                  "trials": "trial_id"}[request.url.path.split("/")[2]]
        with database(write=True) as db:
            return {"message": catalog.act(layout, db, request.path_params["action"],
                                           **{target: int(request.path_params["id"])})}

    def download(request: Request) -> Response:
        from localdet.reporting.sqlite_reporter import CheckpointReader

        with database() as db:  # the whole uuid, as the page links it; not a prefix
            uuid = db.checkpoint(request.path_params["uuid"]).uuid
        if uuid != request.path_params["uuid"]:
            raise NotFound(f"no checkpoint {request.path_params['uuid']}; "
                           "`localdet checkpoints EXPERIMENT` lists them")
        scratch = Path(tempfile.mkdtemp(prefix="localdet-download-"))
        try:  # the folder is named by the database's uuid, never by the URL's text
            folder = CheckpointReader(layout).materialize(uuid, scratch / uuid)
            archive = scratch / f"{folder.name}.tar.gz"
            with tarfile.open(archive, "w:gz") as tar:
                tar.add(folder, arcname=folder.name)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        return FileResponse(archive, media_type="application/gzip", filename=archive.name,
                            background=BackgroundTask(shutil.rmtree, scratch, True))

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def plotly_js(request: Request) -> Response:
        return FileResponse(PLOTLY_JS, media_type="text/javascript")

    routes = [
        Route("/", page), Route("/experiments/{id:int}", page), Route("/trials/{id:int}", page),
        Route("/jobs", page),
        Route("/api/daemon", api(daemon)),
        Route("/api/experiments", api(experiments)),
        Route("/api/experiments/{id:int}", api(experiment)),
        *manage.routes(layout, database, api, page),
        *comparing.routes(database, api, page),
        Route("/api/experiments/{id:int}/{action:str}", api(act), methods=["POST"]),
        Route("/api/experiments/{id:int}/curves", api(experiment_curves)),
        Route("/api/trials/{id:int}", api(trial)),
        Route("/api/trials/{id:int}/curves", api(trial_curves)),
        Route("/api/trials/{id:int}/{action:str}", api(act), methods=["POST"]),
        Route("/api/jobs", api(jobs)),
        Route("/api/checkpoints/{uuid:str}.tar.gz", api(download)),
        Route("/static/plotly.min.js", plotly_js),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(Guard, token=token, host=host)])


_warming = threading.Lock()
_warmed = False
_importing = threading.Lock()  # one thread imports Optuna; the others wait for it whole


def _import_optuna() -> None:
    """Import Optuna's importance evaluators whole, in one thread at a time: two request
    threads importing it at once met a half-initialized module ("module 'optuna' has no
    attribute 'create_study'")."""
    with _importing, contextlib.suppress(ImportError):  # (then the page says how to install)
        importlib.import_module("optuna.importance")


def _warm_up() -> None:
    """Import Optuna, which an experiment page's importances need (about a second of CPU,
    once a process), in a thread while the user is on the list, not when they open one."""
    global _warmed
    with _warming:
        if _warmed:
            return
        _warmed = True
    threading.Thread(target=_import_optuna, name="warm-up", daemon=True).start()


def _full(request: Request) -> bool:
    return request.query_params.get("full") in ("1", "true")


def _drawn(trial_ids: list[int], of: int, path: str, full: bool = False) -> dict[str, Any]:
    """What the curves chart holds: which trials of how many, how many points a series at
    most (None: every point), and where every point of them is."""
    return {"trials": trial_ids, "of": of,
            "points_per_series": None if full else figures.series_points(len(trial_ids)),
            "full": f"{path}?full=1", "all_trials": f"{path}?full=1&trials=all"}


def _summary(facts: dict[str, Any]) -> dict[str, Any]:
    """An experiment's row on the list pages: its facts without the per-trial detail."""
    summary = {k: v for k, v in facts.items() if k not in ("trials", "rungs")}
    summary["trial_count"] = len(facts["trials"])
    return summary
