"""Check a command's ``-o json`` document against its published schema (etcd_recipes/cli/schemas)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from etcd_recipes.cli import schemas


def assert_valid(stdout: str) -> dict[str, Any]:
    """Parse one ``-o json`` document, validate it against its command's schema, return it."""
    doc: dict[str, Any] = json.loads(stdout)
    schema = schemas.load(doc["command"])
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    return doc
