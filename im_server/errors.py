"""The error codes of the contract: one exception type, mapped to HTTP statuses."""

from __future__ import annotations

STATUS = {
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "not_member": 403,
    "not_friends": 403,
    "blocked": 403,
    "muted": 403,
    "too_large": 413,
    "rate_limited": 429,
    "conflict": 409,
    "receipts_disabled": 403,
    "unavailable": 503,
    "rejected": 403,  # the app's before-send hook said no
}


class ImError(Exception):
    """A refusal the client can act on; ``code`` is one of the contract's codes."""

    def __init__(self, code: str, message: str = "", status: int | None = None) -> None:
        super().__init__(message or code)
        self.code = code
        self.message = message or code.replace("_", " ")
        self.status = status or STATUS.get(code, 400)

    def body(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message}}


def bad_request(message: str) -> ImError:
    return ImError("bad_request", message)


def not_found(message: str = "not found") -> ImError:
    return ImError("not_found", message)


def unavailable(message: str = "a store is unavailable, try again") -> ImError:
    return ImError("unavailable", message)


def is_store_error(exc: BaseException) -> bool:
    """A failure to reach PostgreSQL or Redis (answered 503 ``unavailable``)."""
    import asyncio

    from redis.exceptions import ClusterError, MasterDownError, ReadOnlyError, TryAgainError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(exc, (OSError, asyncio.TimeoutError, RedisConnectionError, RedisTimeoutError)):
        return True
    # a Redis Cluster between two maps (a fail-over, a slot moving): retried by the client
    if isinstance(exc, (ClusterError, TryAgainError, MasterDownError, ReadOnlyError)):
        return True
    if isinstance(exc, (OperationalError, InterfaceError, PoolTimeout)):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    # SQLAlchemy wraps the driver's error (twice when connecting): what the server said
    # is down the chain. PostgreSQL shutting down, starting up or cancelling on a timeout
    # is an operator's or a store's state, not a bug.
    cause = exc.__cause__ or exc.__context__
    for _ in range(4):
        if cause is None or cause is exc:
            return False
        if isinstance(cause, (OSError, ConnectionError, *_pg_connection_errors())):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _pg_connection_errors() -> tuple[type[BaseException], ...]:
    import asyncpg

    return (asyncpg.PostgresConnectionError, asyncpg.OperatorInterventionError)


def check_text(value: str, field: str) -> str:
    """Text that PostgreSQL can store: no NUL character, no lone surrogate."""
    if "\x00" in value:
        raise bad_request(f"{field} must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{field} is not valid Unicode") from None
    return value
