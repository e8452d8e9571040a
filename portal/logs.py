"""How every portal process logs: plain lines for a person at a terminal, or one JSON object a line
(`LOG_FORMAT=json`) for a log pipeline, each record carrying the request and the task it belongs to.

Words used here:
- request id: the `X-Request-ID` a web request came with (a proxy's, when it is a well-formed id) or
  one made for it, answered in the same header; a task sent while serving the request carries it in its
  message headers, so the worker's lines of that task bear the web request's id (django-guid does both);
- task id, task name: Celery's, on every line a worker writes while running the task.
"""

from __future__ import annotations

import logging

from celery import current_task
from django.core.exceptions import ImproperlyConfigured
from pythonjsonlogger.core import RESERVED_ATTRS

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(context)s %(message)s"
JSON_FIELDS = ("asctime", "levelname", "name", "message", "request_id", "task_id", "task_name")


class TaskContext(logging.Filter):
    """Adds `task_id` and `task_name` (empty outside a task), `request_id` (django-guid's correlation
    id, empty outside a request or a task it started) and `context`, the three in brackets for a plain
    line (empty when all are), to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        task = current_task
        request = getattr(task, "request", None) if task else None
        record.task_id = getattr(request, "id", None) or ""
        record.task_name = (getattr(task, "name", None) or "") if record.task_id else ""
        record.request_id = getattr(record, "correlation_id", None) or ""
        parts = [f"request={record.request_id}" if record.request_id else ""]
        parts.append(f"task={record.task_name}[{record.task_id}]" if record.task_id else "")
        shown = " ".join(part for part in parts if part)
        record.context = f" [{shown}]" if shown else ""
        return True


def config(*, log_format: str, level: str) -> dict:
    """The LOGGING setting: one console handler, in the chosen format, with both filters."""
    if log_format not in ("text", "json"):
        raise ImproperlyConfigured(f"LOG_FORMAT must be text or json, not {log_format!r}.")
    formatter = (
        {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": " ".join(f"%({name})s" for name in JSON_FIELDS),
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
            "timestamp": False,
            # Said once each: the correlation id is `request_id` here, and `context` is for plain lines.
            "reserved_attrs": [*RESERVED_ATTRS, "correlation_id", "context"],
        }
        if log_format == "json"
        else {"format": TEXT_FORMAT}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "correlation_id": {"()": "django_guid.log_filters.CorrelationId"},
            "task_context": {"()": "portal.logs.TaskContext"},
        },
        "formatters": {"portal": formatter},
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "portal",
                "filters": ["correlation_id", "task_context"],
            }
        },
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            "django.db.backends": {"level": "WARNING"},
            # It says at INFO, on every request, that it made an id.
            "django_guid": {"level": "WARNING"},
        },
    }
