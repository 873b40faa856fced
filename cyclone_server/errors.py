"""The one error tree of Cyclone, and how each error maps to a gRPC status code."""

from __future__ import annotations

import grpc


class CycloneError(Exception):
    """Something went wrong in Cyclone."""

    status: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0])


class InvalidArgument(CycloneError):
    """The request is malformed."""

    status = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(CycloneError):
    """No such object."""

    status = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(CycloneError):
    """The object's state forbids this action."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class AlreadyExists(CycloneError):
    """The idempotency key belongs to a different request."""

    status = grpc.StatusCode.ALREADY_EXISTS


class Unauthenticated(CycloneError):
    """No valid credentials."""

    status = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(CycloneError):
    """The caller's role may not do this."""

    status = grpc.StatusCode.PERMISSION_DENIED


class Unavailable(CycloneError):
    """database unavailable, try again"""

    status = grpc.StatusCode.UNAVAILABLE


class DatabaseError(CycloneError):
    """The database refused a statement for a reason that is not the caller's input."""


class MigrationError(CycloneError):
    """The database schema cannot be brought up to date."""


# SQLSTATEs that Cyclone's SQL functions raise on purpose (see sql/functions), and the
# error each becomes. The functions put the human message in the exception text.
SQLSTATE_ERRORS: dict[str, type[CycloneError]] = {
    "CY400": InvalidArgument,
    "CY404": NotFound,
    "CY409": FailedPrecondition,
    "CY410": AlreadyExists,
}
