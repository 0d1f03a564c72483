"""Free JSON: the aliases for values whose shape the API leaves open.

Everything with a known shape has a ``TypedDict`` of its own (``schema.items``,
``schema.response_object``, the events' modules); these are for the rest: JSON schemas,
annotations, metadata of tools the service does not know, and JSON not checked yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

#: Any JSON value. ``Any`` because its shape is the sender's to choose.
JSONValue: TypeAlias = Any
#: A JSON object of free shape.
JSONObject: TypeAlias = dict[str, JSONValue]
#: A JSON object as read, typed or not (a ``TypedDict`` of this package is one).
JSONMapping: TypeAlias = Mapping[str, JSONValue]
