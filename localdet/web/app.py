"""The dashboard's Starlette application: one page (its script renders every view) and a
JSON API over the same facts `localdet status` shows.

    app = create_app(Layout.from_environment(), token=None)   # token: for non-local binds

    GET  /, /experiments/{id}, /trials/{id}, /jobs      the page
    GET  /api/experiments                               experiments (jobs excluded)
    GET  /api/experiments/{id}                          facts, config, charts, rungs
    GET  /api/trials/{id}                               facts, charts, checkpoints, log tail
    GET  /api/jobs                                      jobs
    GET  /api/checkpoints/{uuid}.tar.gz                 a checkpoint's folder, as a download
    POST /api/experiments/{id}/{pause|resume|kill}      as `localdet pause|resume|kill ID`
    POST /api/trials/{id}/{pause|resume|kill}           as `... --trial ID`

With a token, every request must carry it (`Authorization: Bearer T`, `?token=T`, or the
cookie a page opened with `?token=T` sets); others get 401 and one sentence.
"""

from __future__ import annotations

import contextlib
import hmac
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Iterator

import plotly
import yaml
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from localdet import actions, views
from localdet.db import NotFound, StateDB
from localdet.launcher import log_tail
from localdet.paths import Layout
from localdet.web import figures

STATIC = Path(__file__).parent / "static"
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
COOKIE = "localdet_token"
LOG_TAIL_LINES = 60


class TokenCheck(BaseHTTPMiddleware):
    """Refuses requests that do not carry the dashboard's token."""

    def __init__(self, app, token: str):
        super().__init__(app)
        self.token = token

    async def dispatch(self, request: Request, call_next):
        header = request.headers.get("authorization", "")
        given = (header[7:] if header.lower().startswith("bearer ") else
                 request.query_params.get("token") or request.cookies.get(COOKIE) or "")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return JSONResponse({"error": "this dashboard needs its token: open the address "
                                          "it printed at start (with ?token=...), or send "
                                          "Authorization: Bearer <token>"}, status_code=401)
        response = await call_next(request)
        if request.query_params.get("token"):  # a page opened from the printed address
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
        return response


def create_app(layout: Layout, token: str | None = None) -> Starlette:
    @contextlib.contextmanager
    def database() -> Iterator[StateDB]:
        """The database, open for one request."""
        if not layout.db.exists():
            raise NotFound(f"no localdet state at {layout.home} yet; submit an experiment")
        db = StateDB.open(layout.db)
        try:
            yield db
        finally:
            db.close()

    def api(handler):
        """A JSON endpoint: the handler's result, NotFound as 404, a refused action as 409."""
        async def endpoint(request: Request) -> Response:
            try:  # in a thread: SQLite and the store block
                result = await run_in_threadpool(handler, request)
            except NotFound as error:
                return JSONResponse({"error": str(error)}, status_code=404)
            except actions.ActionError as error:
                return JSONResponse({"error": str(error)}, status_code=409)
            return result if isinstance(result, Response) else JSONResponse(result)
        return endpoint

    def experiments(request: Request) -> list[dict]:
        if not layout.db.exists():
            return []  # nothing submitted yet
        with database() as db:
            return [_summary(views.experiment_facts(db, e)) for e in db.experiments()
                    if e.kind != "job"]

    def experiment(request: Request) -> dict:
        with database() as db:
            record = db.experiment(int(request.path_params["id"]))
            facts = views.experiment_facts(db, record)
            facts["config"] = yaml.safe_dump(record.config, sort_keys=False)
            facts["charts"] = {
                "curves": figures.curves(db, [t["id"] for t in facts["trials"]],
                                         facts["best_trial"]),
                "hyperparameters": figures.hyperparameters(record, facts["trials"]),
            }
            return facts

    def trial(request: Request) -> dict:
        with database() as db:
            record = db.trial(int(request.path_params["id"]))
            experiment = db.experiment(record.experiment_id)
            launch = views.latest_launches(db.events(experiment.id)).get(record.id)
            facts = views.trial_facts(db, record, experiment, launch)
            facts["experiment"] = {"id": experiment.id, "name": experiment.name,
                                   "metric": experiment.metric}
            facts["checkpoints"] = [views.checkpoint_facts(c)
                                    for c in db.checkpoints(trial_id=record.id)]
            facts["charts"] = {"curves": figures.curves(db, [record.id])}
            facts["log_tail"] = log_tail(layout.trial_log(experiment.id, record.id),
                                         LOG_TAIL_LINES)
            return facts

    def jobs(request: Request) -> list[dict]:
        if not layout.db.exists():
            return []
        with database() as db:
            return [_summary(views.job_facts(db, layout, e)) for e in db.experiments()
                    if e.kind == "job"]

    def act(request: Request) -> dict:
        target = {"experiments": "experiment_id",
                  "trials": "trial_id"}[request.url.path.split("/")[2]]
        with database() as db:
            return {"message": actions.request(layout, db, request.path_params["action"],
                                               **{target: int(request.path_params["id"])})}

    def download(request: Request) -> Response:
        from localdet.reporting import CheckpointReader

        uuid = request.path_params["uuid"]
        scratch = Path(tempfile.mkdtemp(prefix="localdet-download-"))
        try:
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
        Route("/api/experiments", api(experiments)),
        Route("/api/experiments/{id:int}", api(experiment)),
        Route("/api/experiments/{id:int}/{action:str}", api(act), methods=["POST"]),
        Route("/api/trials/{id:int}", api(trial)),
        Route("/api/trials/{id:int}/{action:str}", api(act), methods=["POST"]),
        Route("/api/jobs", api(jobs)),
        Route("/api/checkpoints/{uuid:str}.tar.gz", api(download)),
        Route("/static/plotly.min.js", plotly_js),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [Middleware(TokenCheck, token=token)] if token else []
    return Starlette(routes=routes, middleware=middleware)


def _summary(facts: dict[str, Any]) -> dict[str, Any]:
    """An experiment's row on the list pages: its facts without the per-trial detail."""
    summary = {k: v for k, v in facts.items() if k not in ("trials", "rungs")}
    summary["trial_count"] = len(facts["trials"])
    return summary
