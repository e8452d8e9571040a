"""The API's JSON parser: bounded in depth, and no NUL characters anywhere.

A document nested thousands deep would exhaust the interpreter's stack, and a
NUL inside a string cannot be stored or even compared by PostgreSQL; both are
refused here with a 400 before any view sees them.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.utils.translation import gettext as _
from rest_framework import exceptions, parsers

MAX_DEPTH = 32


def check_document(value) -> None:
    """Walks the parsed document without recursion; raises ParseError on the first problem."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise exceptions.ParseError(_("JSON strings may not contain NUL characters."))
        elif isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise exceptions.ParseError(
                    _("The JSON document is nested deeper than %(max)s levels.") % {"max": MAX_DEPTH}
                )
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        # DRF hands this parser the body Django has read, within DATA_UPLOAD_MAX_MEMORY_SIZE.
        raw = stream.read()
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            document = json.loads(raw.decode(encoding), parse_constant=_refuse_constant)
        except RecursionError as error:
            raise exceptions.ParseError(
                _("The JSON document is nested deeper than %(max)s levels.") % {"max": MAX_DEPTH}
            ) from error
        except (ValueError, UnicodeDecodeError) as error:
            raise exceptions.ParseError(_("JSON parse error - %(error)s") % {"error": error}) from error
        check_document(document)
        return document


def _refuse_constant(name: str):
    raise ValueError(_("%(name)s is not a JSON value") % {"name": name})
