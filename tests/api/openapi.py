"""The OpenAPI document the portal serves at /api/schema/, for tests that read or fuzz it."""

import json

from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer


def served_schema() -> dict:
    """The document /api/schema/ serves (the same generator and renderer), built without a request, so
    that it can be read before any database exists (schemathesis collects its operations then)."""
    document = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(OpenApiJsonRenderer().render(document, renderer_context={}))
