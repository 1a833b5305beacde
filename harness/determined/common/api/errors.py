"""The errors the SDK raises, under Determined's names: `NotFoundException` for a record
that does not exist, `APIException` for an operation that cannot be done. The message is
one sentence saying what to fix."""

from typing import Any


class BadRequestException(Exception):
    """A request that could not be served; `message` says why."""

    def __init__(self, message: str, *args: Any) -> None:
        super().__init__(message, *args)
        self.message = message

    def __str__(self) -> str:
        return self.message


class BadResponseException(Exception):
    """An answer that could not be read; `message` says why."""

    def __init__(self, message: str, *args: Any) -> None:
        super().__init__(message, *args)
        self.message = message

    def __str__(self) -> str:
        return self.message


class MasterNotFoundException(BadRequestException):
    """Determined raised it when no master answered; localdet has none to look for."""


class APIException(BadRequestException):
    """An operation failed: `message` says why, `status_code` is the HTTP status Determined's
    master would have answered (400 for a request that cannot be done)."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.response_error = None


class NotFoundException(APIException):
    """What was asked for does not exist (Determined's 404)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status_code=404)


class ForbiddenException(BadRequestException):
    """Determined's 403; localdet has no users, so it raises none."""


class UnauthenticatedException(BadRequestException):
    """Determined's 401; localdet has no users, so it raises none."""


class DeleteFailedException(APIException):
    """A deletion that could not be done."""
