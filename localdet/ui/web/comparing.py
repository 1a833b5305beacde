"""The dashboard's compare page: experiments side by side by their best trials, as
`localdet compare` shows them (localdet/operations/compare.py), never a second
implementation.

    GET /compare?ids=3,7            the page (the list's checkboxes and Compare button lead here)
    GET /api/compare?ids=3,7        compare's facts, and the chart of the best trials' curves
"""

from __future__ import annotations

from typing import Any, Callable

from starlette.requests import Request
from starlette.routing import Route

from localdet.operations.compare import compare
from localdet.operations.errors import OperationError
from localdet.ui.web import figures


def _ids(request: Request) -> list[int]:
    given = [part.strip() for value in request.query_params.getlist("ids")
             for part in value.split(",") if part.strip()]
    try:
        return [int(part) for part in given]
    except ValueError:
        raise OperationError("ids must be experiment numbers separated by commas, e.g. "
                             "/compare?ids=3,7") from None


def routes(database: Callable, api: Callable, page: Callable) -> list[Route]:
    """`api` makes JSON endpoints of handlers; `page` serves the dashboard's one page."""

    def compared(request: Request) -> dict[str, Any]:
        with database() as db:
            found = compare(db, _ids(request))
        found["charts"] = {"curves": figures.compared_curves(found)}
        return found

    return [Route("/compare", page), Route("/api/compare", api(compared))]
