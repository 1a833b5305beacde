"""The dashboard's routes for living with many experiments: archive, delete, labels,
description and notes, and the model registry. Each is a spelling over the one operation
`localdet`, `det` and the SDK call (localdet/operations/), never a second implementation.

    POST /api/experiments/{id}/archive | unarchive        as `det e archive|unarchive ID`
    POST /api/experiments/{id}/delete  {"confirm": ID}     as `det e delete ID --yes`
    POST /api/experiments/{id}/labels  {"add"|"remove": L} as `det e label add|remove ID L`
    POST /api/experiments/{id}/description {"text": T}     as `det e set description ID T`
    POST /api/experiments/{id}/notes   {"text": T}
    GET  /api/models[?archived=1]                          as `det model list`
    GET  /api/models/{id}                                  a model and its versions

A delete names the experiment's id again in its body: the page asks its user to type it, so
neither a stray click nor a request without that step removes anything.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager

from starlette.requests import Request
from starlette.routing import Route

from localdet.operations import deletion, registry
from localdet.operations import experiments as catalog
from localdet.operations.errors import OperationError
from localdet.paths import Layout
from localdet.records.db import StateDB

Database = Callable[..., ContextManager[StateDB]]  # (write=False): read-only
CHANGES = ("archive", "unarchive", "labels", "description", "notes")


def _text(body: dict, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise OperationError(f"the request's JSON body needs a text \"{key}\"")
    return value


def routes(layout: Layout, database: Database, api: Callable, page: Callable) -> list[Route]:
    """The routes, handled by `api` (JSON endpoints: a handler gets the request and its JSON
    body); `page` serves the dashboard's one page."""

    def change(request: Request, body: dict) -> dict[str, Any]:
        experiment_id = int(request.path_params["id"])
        what = request.url.path.rsplit("/", 1)[1]
        with database(write=True) as db:
            if what == "archive":
                catalog.archive(db, experiment_id)
                message = f"experiment {experiment_id} archived"
            elif what == "unarchive":
                catalog.unarchive(db, experiment_id)
                message = f"experiment {experiment_id} unarchived"
            elif what == "labels" and "add" in body:
                catalog.add_label(db, experiment_id, _text(body, "add"))
                message = f"label {body['add']!r} added to experiment {experiment_id}"
            elif what == "labels":
                catalog.remove_label(db, experiment_id, _text(body, "remove"))
                message = f"label {body['remove']!r} removed from experiment {experiment_id}"
            elif what == "description":
                catalog.set_description(db, experiment_id, _text(body, "text"))
                message = f"description of experiment {experiment_id} saved"
            else:  # notes
                catalog.set_notes(db, experiment_id, _text(body, "text"))
                message = f"notes of experiment {experiment_id} saved"
        return {"message": message}

    def delete(request: Request, body: dict) -> dict[str, Any]:
        experiment_id = int(request.path_params["id"])
        if str(body.get("confirm", "")).strip() != str(experiment_id):
            raise OperationError(f"type the experiment's id, {experiment_id}, to confirm "
                                 "that it is to be deleted")
        with database(write=True) as db:
            result = deletion.delete_experiment(layout, db, experiment_id)
        return {"message": f"experiment {experiment_id} deleted", "deleted": result}

    def models(request: Request) -> list[dict]:
        if not layout.db.exists():
            return []
        archived = request.query_params.get("archived") in ("1", "true")
        with database() as db:
            return registry.list_models(db, archived=None if archived else False)

    def model(request: Request) -> dict[str, Any]:
        with database() as db:
            found = registry.get_model(db, int(request.path_params["id"]))
            found["versions"] = registry.list_versions(db, found["id"])
            return found

    return [
        Route("/models", page), Route("/models/{id:int}", page),
        *(Route(f"/api/experiments/{{id:int}}/{what}", api(change), methods=["POST"])
          for what in CHANGES),
        Route("/api/experiments/{id:int}/delete", api(delete), methods=["POST"]),
        Route("/api/models", api(models)),
        Route("/api/models/{id:int}", api(model)),
    ]
