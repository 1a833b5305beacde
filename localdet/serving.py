"""What localdet's two HTTP servers share, both Starlette on uvicorn: the dashboard
(localdet/ui/web/) and the report server remote trials write to (localdet/reporting/): how a
token is presented and checked, and how a request's error becomes its answer.

    given = presented_token(request)                 # Authorization: Bearer T (or ?token=T)
    if not token_matches(given, expected): raise Refused(401, "one sentence")
    return await answer(lambda: work(request), errors=((NotFound, 404),), log=print,
                        server="the dashboard")

Every refusal is `{"error": "<one sentence>", ...}` with its status; an error nobody
expected is logged whole and answered 500 with one sentence.
"""

from __future__ import annotations

import hmac
import sys
import traceback
from typing import Any, Awaitable, Callable, Sequence

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

# (exception type, status, or a function giving (status, sentence) for the error)
ErrorRule = tuple[type[BaseException], "int | Callable[[Any], tuple[int, str]]"]


class Refused(Exception):
    """A request refused: answered `status` with `{"error": sentence, **extra}`."""

    def __init__(self, status: int, sentence: str, **extra: Any):
        super().__init__(sentence)
        self.status, self.extra = status, extra


def refusal(status: int, sentence: str, **extra: Any) -> Response:
    return JSONResponse({"error": sentence, **extra}, status_code=status)


def presented_token(request: Request, query: bool = False, cookie: str | None = None) -> str:
    """The token a request presents: `Authorization: Bearer T`, else (where allowed) the
    `?token=T` query parameter or the named cookie; "" when none."""
    header = request.headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:]
    given = request.query_params.get("token") if query else None
    if not given and cookie:
        given = request.cookies.get(cookie)
    return given or ""


def token_matches(given: str, expected: str) -> bool:
    """Whether the presented token is the expected one, compared in constant time."""
    return hmac.compare_digest(given.encode(), expected.encode())


async def answer(work: Callable[[], Awaitable[Any]], errors: Sequence[ErrorRule] = (),
                 log: Callable[[str], None] | None = None,
                 server: str = "the server") -> Response:
    """`work()`'s result as the answer (a Response as it is, anything else as JSON), or its
    error as one: `Refused` with its own status, the `errors` rules' types with theirs (the
    error's text the sentence), and anything else logged whole and answered 500."""
    try:
        result = await work()
    except Refused as refused:
        return refusal(refused.status, str(refused), **refused.extra)
    except ClientDisconnect:
        return Response(status_code=400)  # nobody reads it
    except Exception as error:
        for kind, rule in errors:
            if isinstance(error, kind):
                status, sentence = rule(error) if callable(rule) else (rule, str(error))
                return refusal(status, sentence)
        (log or _stderr)(f"{server}: unexpected error:\n{traceback.format_exc()}")
        return refusal(500, f"{server} failed on this request ({type(error).__name__}: "
                            f"{error}); see its log")
    return result if isinstance(result, Response) else JSONResponse(result)


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
