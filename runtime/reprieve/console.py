"""The runtime's lines on stderr for a program that configured no logging.

A preemption on a laptop (a notice, the agreed step, the commit, the exit code and why, and at the restart
where the state came back from) must reach the user without a ``logging`` set-up, the way JAX's own warnings do;
and a program (or a library) that configured logging decides alone what it sees. :func:`install`, called by
``reprieve.init()``, gives the ``reprieve`` logger a handler of its own at INFO that writes to stderr *while the
root logger is in its default state* (:func:`logging_is_default`): no handler, or only the bare stderr handler
that ``logging.basicConfig()`` adds, which absl does by itself the first time it logs (Orbax makes it do so at
import). Otherwise the handler passes every record on to the root logger's handlers, filtered by the root
logger's level, exactly as if reprieve had set nothing: ``logging.basicConfig(level=logging.WARNING,
format=...)`` or a handler of one's own, even one added after ``reprieve.init()``, is obeyed as it stands.

Nothing is installed when the ``reprieve`` logger already has a handler or a level of the program's own.
``logging.getLogger("reprieve").setLevel(logging.WARNING)`` quiets the INFO lines, before or after ``init()``.
"""

from __future__ import annotations

import logging
import sys
import time

LOGGER = "reprieve"
LEVEL = logging.INFO


def logging_is_default(root: logging.Logger) -> bool:
    """Whether ``root`` is as the program found it (pure over its attributes): at WARNING, with no handler or only
    the bare stderr handlers ``logging.basicConfig()`` adds with no arguments."""
    if root.level != logging.WARNING:
        return False
    for handler in root.handlers:
        if type(handler) is not logging.StreamHandler or handler.level != logging.NOTSET or handler.filters:
            return False
        if handler.stream is not sys.stderr and handler.stream is not sys.__stderr__:
            return False
        fmt = getattr(handler.formatter, "_fmt", None)
        if handler.formatter is not None and fmt != logging.BASIC_FORMAT:
            return False
    return True


class ConsoleFormatter(logging.Formatter):
    """``12:03:01 reprieve: message`` (``reprieve[1/2]`` with several processes; the level when above INFO)."""

    def __init__(self, process_id: int = 0, num_processes: int = 1) -> None:
        super().__init__()
        self.who = "reprieve" if num_processes <= 1 else f"reprieve[{process_id}/{num_processes}]"

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno <= logging.INFO else f" {record.levelname}"
        message = record.getMessage().removeprefix("reprieve: ")  # a few lines name themselves for other formats
        text = f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {self.who}{level}: {message}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The ``reprieve`` logger's handler (see the module docstring)."""

    def __init__(self, process_id: int = 0, num_processes: int = 1) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(ConsoleFormatter(process_id, num_processes))

    def emit(self, record: logging.LogRecord) -> None:
        root = logging.getLogger()
        if logging_is_default(root):
            self.stream = sys.stderr  # as the program's stderr is now (a test may have replaced it)
            super().emit(record)
            return
        # Configured: as if reprieve had set no level (the program's own level on the reprieve logger stands), and
        # to the root's handlers that are not on the reprieve logger too (pytest attaches its capture handlers to
        # every logger that does not propagate: they have the record already).
        logger = logging.getLogger(LOGGER)
        if logger.level == LEVEL and not _level_set_under(record.name) and record.levelno < root.getEffectiveLevel():
            return
        if root.disabled or not root.filter(record):
            return
        mine = set(logger.handlers)
        for handler in root.handlers:
            if handler not in mine and record.levelno >= handler.level:
                handler.handle(record)


def _level_set_under(name: str) -> bool:
    """Whether the program set a level on a logger below ``reprieve`` that a record of ``name`` passed (e.g.
    ``reprieve.job`` at INFO under a root at WARNING): as without this handler, that level decides, not the root's."""
    while name and name != LOGGER:
        found = logging.Logger.manager.loggerDict.get(name)
        if isinstance(found, logging.Logger) and found.level != logging.NOTSET:
            return True
        name = name.rpartition(".")[0]
    return False


def install(process_id: int = 0, num_processes: int = 1) -> bool:
    """Give the ``reprieve`` logger its console handler (once; not when the program set a handler or a level on
    it). Returns whether it is installed now."""
    logger = logging.getLogger(LOGGER)
    if any(isinstance(h, ConsoleHandler) for h in logger.handlers):
        for h in logger.handlers:
            if isinstance(h, ConsoleHandler):
                h.setFormatter(ConsoleFormatter(process_id, num_processes))
        return True
    if logger.handlers or logger.level != logging.NOTSET:
        return False
    logger.addHandler(ConsoleHandler(process_id, num_processes))
    logger.setLevel(LEVEL)
    logger.propagate = False  # the handler passes records on to the root logger itself, when it is configured
    return True
