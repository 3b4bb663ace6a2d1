from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from rlinf.workers.errors import ConfigError
from rlinf.workers.runtime.logs import configure_worker_logging
from rlinf.workers.telemetry import configure_logging


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    config = structlog.get_config()
    yield
    structlog.contextvars.clear_contextvars()
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.configure(**config)


def test_console_defaults_to_info_and_renders_stdlib_records_too() -> None:
    out = io.StringIO()
    configure_logging(stream=out)
    log = structlog.get_logger("rlinf.test")
    log.debug("hidden_event")
    log.info("step_done", step=3, loss=0.5)
    logging.getLogger("thirdparty").warning("plain %s record", "stdlib")
    text = out.getvalue()
    assert "hidden_event" not in text
    lines = text.splitlines()
    assert len(lines) == 2
    assert "step_done" in lines[0] and "step=3" in lines[0] and "loss=0.5" in lines[0]
    assert "[info" in lines[0] and "rlinf.test" in lines[0]
    assert "plain stdlib record" in lines[1] and "warning" in lines[1]
    assert "\x1b[" not in text  # no colours when the stream is not a terminal


def test_json_lines_and_exceptions() -> None:
    out = io.StringIO()
    configure_logging(level="debug", json=True, stream=out)
    log = structlog.get_logger("rlinf.test")
    log.debug("dbg", n=1)
    try:
        raise ValueError("bad value")
    except ValueError:
        log.exception("failed", what="x")
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["event"] for r in records] == ["dbg", "failed"]
    assert records[0]["level"] == "debug" and records[0]["n"] == 1
    assert records[0]["logger"] == "rlinf.test" and "timestamp" in records[0]
    assert "ValueError: bad value" in records[1]["exception"]


def test_idempotent_never_stacks_handlers() -> None:
    before = len(logging.getLogger().handlers)
    first, second = io.StringIO(), io.StringIO()
    configure_logging(stream=first)
    configure_logging(stream=second, level="warning")
    assert len(logging.getLogger().handlers) == before + 1
    structlog.get_logger("t").info("dropped")
    structlog.get_logger("t").warning("kept")
    assert first.getvalue() == ""
    assert second.getvalue().count("kept") == 1 and "dropped" not in second.getvalue()


def test_unknown_level_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"'verbose'.*debug"):
        configure_logging(level="verbose")


def test_worker_logging_tags_events_with_role_and_rank(capsys: pytest.CaptureFixture[str]) -> None:
    configure_worker_logging("INFO", role="actor", rank=3, json=True)
    structlog.get_logger("rlinf.comm.x").info("sent", nbytes=10)
    record = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert (record["event"], record["role"], record["rank"], record["nbytes"]) == (
        "sent", "actor", 3, 10)
