"""Logging inside handlers: every record carries the run id, step id and attempt it was logged for.

Two ways, both plain `logging`: `StepLogFilter` reads the step of the handler that is
running from a contextvar (so `logging.getLogger(__name__).info(...)` anywhere in a
handler's call tree is tagged, thread handlers included), and `Context.log` is a
`logging.LoggerAdapter` that also writes the ids into the message text.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._context import Context

__all__ = ["StepLogFilter", "StepLogger", "current_step"]

#: The Context of the handler running in this task (or thread); None outside handlers.
current_step: contextvars.ContextVar[Context | None] = contextvars.ContextVar("cyclone_current_step", default=None)

_FIELDS = ("run_id", "step_id", "node", "kind", "attempt")


def step_fields(ctx: Context | None) -> dict[str, Any]:
    """The record attributes for a step: run_id, step_id, node, kind, attempt ("-" outside a step)."""
    if ctx is None:
        return {name: "-" for name in _FIELDS}
    return {"run_id": ctx.run_id, "step_id": ctx.step_id, "node": ctx.node, "kind": ctx.kind,
            "attempt": ctx.attempt}


class StepLogFilter(logging.Filter):
    """Adds `run_id`, `step_id`, `node`, `kind` and `attempt` to every record (``-`` when the
    record was not logged inside a handler), for use in a format string.

    Example::

        handler = logging.StreamHandler()
        handler.addFilter(StepLogFilter())
        handler.setFormatter(logging.Formatter(
            "%(levelname)s run=%(run_id)s step=%(step_id)s attempt=%(attempt)s %(message)s"))
        logging.basicConfig(level=logging.INFO, handlers=[handler])
    """

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in step_fields(current_step.get()).items():
            if not hasattr(record, name):  # an explicit extra= wins
                setattr(record, name, value)
        return True


class StepLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """`Context.log`: a logger whose records carry the step's ids as attributes (like
    StepLogFilter's) and start with them, so that a plain format shows them too.

    Example::

        @worker.handler("charge")
        async def charge(ctx: Context) -> dict:
            ctx.log.info("charging %s", ctx.input["amount"])
            # INFO:cyclone_worker.handler:[run 0193... step 0193... attempt 1] charging 12
    """

    def __init__(self, logger: logging.Logger, ctx: Context) -> None:
        super().__init__(logger, step_fields(ctx))

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        assert self.extra is not None
        kwargs["extra"] = {**self.extra, **(kwargs.get("extra") or {})}
        e = self.extra
        return f"[run {e['run_id']} step {e['step_id']} attempt {e['attempt']}] {msg}", kwargs
