"""Log lines in both formats carry the request id; a LOG_FORMAT the portal does not know stops it."""

import io
import json
import logging
import logging.config

import pytest
from django.core.exceptions import ImproperlyConfigured
from django_guid import set_guid

from portal import logs


def one_line(log_format: str) -> str:
    """One record through the handler the LOGGING setting describes, built alone (the process's own
    logging is left as it is)."""
    config = logs.config(log_format=log_format, level="INFO")
    builder = logging.config.DictConfigurator({})
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(builder.configure_formatter(dict(config["formatters"]["portal"])))
    for name in config["handlers"]["console"]["filters"]:
        handler.addFilter(builder.configure_filter(dict(config["filters"][name])))
    logger = logging.getLogger("portal.test")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        set_guid("0123456789abcdef0123456789abcdef")
        logger.info("pool %s active", 7)
    finally:
        set_guid(None)
        logger.removeHandler(handler)
    return stream.getvalue().strip()


def test_a_json_line_is_one_object_with_the_request_id():
    line = json.loads(one_line("json"))
    assert line["message"] == "pool 7 active"
    assert line["request_id"] == "0123456789abcdef0123456789abcdef"
    assert (line["level"], line["logger"], line["task_id"]) == ("INFO", "portal.test", "")
    assert "correlation_id" not in line and "context" not in line


def test_a_plain_line_shows_the_request_id_in_brackets():
    assert one_line("text").endswith(
        " INFO portal.test [request=0123456789abcdef0123456789abcdef] pool 7 active"
    )


def test_an_unknown_log_format_is_refused_with_its_name():
    with pytest.raises(ImproperlyConfigured, match="'xml'"):
        logs.config(log_format="xml", level="INFO")
