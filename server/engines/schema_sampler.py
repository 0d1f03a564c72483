"""JSON-schema instances for simulated tool arguments and structured answers.

``schema_instance`` draws a deterministic (for its ``random.Random``) value valid for the subset
of JSON Schema that tool definitions use; ``SchemaSampler`` also remembers the free-form strings
it wrote (``pad_slots``), which the simulated engine lengthens toward a target token count.
"""

from __future__ import annotations

import copy
import json
import math
import random
import uuid
from collections.abc import Mapping, Sequence

from bidi_responses.schema import JSONObject, JSONValue

__all__ = ["FILLER_WORDS", "SchemaSampler", "Slot", "schema_instance"]


def _number_or_none(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def schema_instance(schema: Mapping[str, JSONValue], rng: random.Random) -> JSONValue:
    """A deterministic (for ``rng``'s state) instance of a JSON schema.

    Supports the subset tool schemas use: ``type`` (single or list), ``properties`` /
    ``required`` / ``additionalProperties``, ``items`` / ``prefixItems``, ``enum``, ``const``,
    ``minLength`` / ``maxLength``, ``minimum`` / ``maximum`` (and exclusive forms),
    ``multipleOf``, ``minItems`` / ``maxItems`` / ``uniqueItems``, ``minProperties``, common
    string ``format`` values, ``anyOf`` / ``oneOf`` (first option), ``allOf`` (merged) and local
    ``$ref``. ``pattern`` is not honoured.
    """
    return SchemaSampler(schema, rng).sample(schema)


class Slot:
    """A free-form string inside a generated instance, which padding may lengthen."""

    __slots__ = ("container", "key", "max_length")

    def __init__(
        self, container: JSONObject | list[JSONValue], key: str | int, max_length: int | None
    ) -> None:
        self.container = container
        self.key = key
        self.max_length = max_length

    def get(self) -> str:
        if isinstance(self.container, list):
            value = self.container[int(self.key)]
        else:
            value = self.container[str(self.key)]
        return value if isinstance(value, str) else ""

    def set(self, value: str) -> None:
        if isinstance(self.container, list):
            self.container[int(self.key)] = value
        else:
            self.container[str(self.key)] = value


# Deep nesting gets only required properties and minimal arrays, which also stops recursive
# $ref schemas from recursing forever.
_MAX_OPTIONAL_DEPTH = 4
_MAX_DEPTH = 32


class SchemaSampler:
    """Draws instances of one root schema (``$ref`` resolves against it) from ``rng``."""

    def __init__(self, root: JSONValue, rng: random.Random) -> None:
        self.root = root
        self.rng = rng
        self.pad_slots: list[Slot] = []

    def sample(self, schema: JSONValue, depth: int = 0) -> JSONValue:
        schema = self._resolve(schema)
        if schema is True or schema is None:
            schema = {}
        if schema is False:
            return None  # no instance exists; the schema author asked for the impossible
        if not isinstance(schema, Mapping):
            raise ValueError(f"not a JSON schema: {schema!r}")
        if depth > _MAX_DEPTH:
            raise ValueError("JSON schema nests too deeply (recursive $ref without an exit?)")
        if "const" in schema:
            return copy.deepcopy(schema["const"])
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return copy.deepcopy(self.rng.choice(enum))
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                # The first option is usually the intended shape (later ones are often null).
                rest = {k: v for k, v in schema.items() if k != key}
                return self.sample(self._merge(rest, options[0]), depth + 1)
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and all_of:
            merged: Mapping[str, JSONValue] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in all_of:
                merged = self._merge(merged, part)
            return self.sample(merged, depth + 1)

        kind = self._type_of(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "string":
            return self._string(schema)
        if kind == "integer":
            return self._integer(schema)
        if kind == "number":
            return self._number(schema)
        if kind == "boolean":
            return self.rng.random() < 0.5
        return None

    def _resolve(self, schema: JSONValue) -> JSONValue:
        seen = 0
        while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
            ref: str = schema["$ref"]
            if not ref.startswith("#"):
                raise ValueError(f"only local $ref is supported, got {ref!r}")
            target: JSONValue = self.root
            for part in ref[1:].split("/"):
                if part:
                    target = target[part.replace("~1", "/").replace("~0", "~")]
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = self._merge(rest, target) if rest else target
            seen += 1
            if seen > _MAX_DEPTH:
                raise ValueError(f"$ref cycle at {ref!r}")
        return schema

    def _merge(self, base: Mapping[str, JSONValue], extra: JSONValue) -> Mapping[str, JSONValue]:
        extra = self._resolve(extra)
        if not isinstance(extra, Mapping):
            return base
        merged = dict(base)
        for key, value in extra.items():
            if key == "properties" and isinstance(merged.get(key), Mapping):
                merged[key] = {**merged[key], **value}
            elif key == "required" and isinstance(merged.get(key), list):
                merged[key] = list(dict.fromkeys([*merged[key], *value]))
            else:
                merged[key] = value
        return merged

    @staticmethod
    def _type_of(schema: Mapping[str, JSONValue]) -> str:
        declared = schema.get("type")
        if isinstance(declared, list):
            non_null = [t for t in declared if t != "null"]
            return str(non_null[0]) if non_null else "null"
        if isinstance(declared, str):
            return declared
        if any(k in schema for k in ("properties", "required", "additionalProperties")):
            return "object"
        if any(k in schema for k in ("items", "prefixItems", "minItems", "maxItems")):
            return "array"
        if any(k in schema for k in ("minimum", "maximum", "multipleOf")):
            return "number"
        return "string"

    def _is_free_string(self, schema: JSONValue) -> bool:
        schema = self._resolve(schema)
        if not isinstance(schema, Mapping) or self._type_of(schema) != "string":
            return False
        constrained = ("enum", "const", "pattern", "format", "anyOf", "oneOf", "allOf")
        return not any(k in schema for k in constrained)

    def _object(self, schema: Mapping[str, JSONValue], depth: int) -> JSONObject:
        properties: Mapping[str, JSONValue] = schema.get("properties") or {}
        required = [str(name) for name in schema.get("required") or []]
        out: JSONObject = {}
        optional_ok = depth < _MAX_OPTIONAL_DEPTH
        for name, sub in properties.items():
            if name in required or (optional_ok and self.rng.random() < 0.5):
                self._put(out, name, sub, depth)
        extra_schema = schema.get("additionalProperties", True)
        for name in required:
            if name not in out:
                # Required but undeclared: typed by additionalProperties (if that is False the
                # schema is unsatisfiable; a string is as good a guess as any).
                sub = extra_schema if isinstance(extra_schema, Mapping) else {}
                self._put(out, name, sub, depth)
        min_properties = int(schema.get("minProperties", 0))
        for name, sub in properties.items():
            if len(out) >= min_properties:
                break
            if name not in out:
                self._put(out, name, sub, depth)
        return out

    def _put(self, out: JSONObject, name: str, sub: JSONValue, depth: int) -> None:
        out[name] = self.sample(sub, depth + 1)
        if isinstance(out[name], str) and self._is_free_string(sub):
            self.pad_slots.append(Slot(out, name, self._max_length(sub)))

    def _max_length(self, schema: JSONValue) -> int | None:
        schema = self._resolve(schema)
        value = schema.get("maxLength") if isinstance(schema, Mapping) else None
        return int(value) if value is not None else None

    def _array(self, schema: Mapping[str, JSONValue], depth: int) -> list[JSONValue]:
        low = int(schema.get("minItems", 0))
        high = int(schema.get("maxItems", max(low, 1) + 2))
        if depth >= _MAX_OPTIONAL_DEPTH:
            count = min(low, high)
        else:
            first = min(max(low, 1), high)
            count = self.rng.randint(first, max(first, min(high, max(low, 1) + 2)))
        prefix = schema.get("prefixItems")
        items = schema.get("items", {})
        if isinstance(items, list):  # draft-4 tuple form
            prefix, items = items, schema.get("additionalItems", {})
        prefix_schemas = list(prefix) if isinstance(prefix, list) else []
        unique = bool(schema.get("uniqueItems"))
        out: list[JSONValue] = []
        seen: set[str] = set()
        attempts = 0
        while len(out) < count and attempts < 10 * count + 10:
            attempts += 1
            index = len(out)
            sub = prefix_schemas[index] if index < len(prefix_schemas) else items
            if sub is False:
                break
            value = self.sample(sub, depth + 1)
            if unique:
                key = json.dumps(value, sort_keys=True)
                if key in seen:
                    continue
                seen.add(key)
            out.append(value)
            if isinstance(value, str) and self._is_free_string(sub):
                self.pad_slots.append(Slot(out, index, self._max_length(sub)))
        return out

    def _string(self, schema: Mapping[str, JSONValue]) -> str:
        min_length = int(schema.get("minLength", 0))
        max_length = schema.get("maxLength")
        fmt = schema.get("format")
        rng = self.rng
        if fmt in ("date-time", "date", "time"):
            stamp = (
                f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}",
            )
            text = {"date-time": f"{stamp[0]}T{stamp[1]}Z", "date": stamp[0], "time": stamp[1]}[fmt]
        elif fmt == "email":
            text = f"{rng.choice(FILLER_WORDS)}@example.com"
        elif fmt in ("uri", "url", "uri-reference", "iri"):
            text = f"https://example.com/{rng.choice(FILLER_WORDS)}/{rng.choice(FILLER_WORDS)}"
        elif fmt == "uuid":
            text = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        elif fmt == "ipv4":
            text = f"192.0.2.{rng.randint(1, 254)}"
        elif fmt == "hostname":
            text = f"{rng.choice(FILLER_WORDS)}.example.com"
        else:
            text = " ".join(rng.choice(FILLER_WORDS) for _ in range(rng.randint(1, 4)))
        while len(text) < min_length:
            text = f"{text} {rng.choice(FILLER_WORDS)}"
        if max_length is not None:
            text = text[: int(max_length)]
        return text

    @staticmethod
    def _bounds(schema: Mapping[str, JSONValue]) -> tuple[float | None, bool, float | None, bool]:
        """(low, low_exclusive, high, high_exclusive), for draft 4 and draft 6+ spellings."""
        low = _number_or_none(schema.get("minimum"))
        high = _number_or_none(schema.get("maximum"))
        low_excl = high_excl = False
        exclusive_min = schema.get("exclusiveMinimum")
        exclusive_max = schema.get("exclusiveMaximum")
        if exclusive_min is True:  # draft 4: a flag on "minimum"
            low_excl = True
        elif (value := _number_or_none(exclusive_min)) is not None and (
            low is None or value >= low
        ):
            low, low_excl = value, True
        if exclusive_max is True:
            high_excl = True
        elif (value := _number_or_none(exclusive_max)) is not None and (
            high is None or value <= high
        ):
            high, high_excl = value, True
        return low, low_excl, high, high_excl

    def _integer(self, schema: Mapping[str, JSONValue]) -> int:
        low_f, low_excl, high_f, high_excl = self._bounds(schema)
        low = None if low_f is None else math.floor(low_f) + 1 if low_excl else math.ceil(low_f)
        high = (
            None if high_f is None else math.ceil(high_f) - 1 if high_excl else math.floor(high_f)
        )
        if low is None:
            low = 0 if high is None or high >= 0 else high - 100
        if high is None:
            high = low + 100
        step = schema.get("multipleOf")
        if isinstance(step, int) and step > 0:
            first = -(-low // step) * step
            if first <= high:
                return first + step * self.rng.randint(0, (high - first) // step)
        return self.rng.randint(low, max(low, high))

    def _number(self, schema: Mapping[str, JSONValue]) -> float | int:
        step = schema.get("multipleOf")
        if isinstance(step, int) and not isinstance(step, bool):
            return self._integer(schema)
        low_f, low_excl, high_f, high_excl = self._bounds(schema)
        if low_f is None:
            low_f = 0.0 if high_f is None or high_f >= 0 else high_f - 100.0
        if high_f is None:
            high_f = low_f + 100.0
        if isinstance(step, float) and step > 0:
            first = math.ceil(low_f / step)
            last = math.floor(high_f / step)
            if low_excl and first * step <= low_f:
                first += 1
            if high_excl and last * step >= high_f:
                last -= 1
            if first <= last:
                return self.rng.randint(first, last) * step
        # Two decimals read naturally and survive the JSON round trip unchanged.
        first = math.ceil(low_f * 100)
        last = math.floor(high_f * 100)
        if low_excl and first / 100 <= low_f:
            first += 1
        if high_excl and last / 100 >= high_f:
            last -= 1
        if first > last:
            return (low_f + high_f) / 2
        return self.rng.randint(first, last) / 100


_WORD_TEXT = """
the build test server client stream token request response cache render history output
input model engine tool call function value error retry timeout config path file line
module import return update check parse encode decode queue worker batch event state
session handler router message channel buffer latency metric trace span result status
index offset length limit count total debug info warn fetch commit branch merge deploy
"""
#: Filler words for generated strings; each is one token with its leading space.
FILLER_WORDS: Sequence[str] = tuple(_WORD_TEXT.split())
