"""The offsets a task read, from the asset's extra to the OpenLineage dataset facet ``liftbridge_offsets``."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jsonschema
import pytest
from airflow.sdk import Asset
from openlineage.client.serde import Serde
from referencing import Registry, Resource

from liftbridge_provider.assets.liftbridge import convert_asset_to_openlineage
from liftbridge_provider.assets.offsets import FACET_NAME, PRODUCER, SCHEMA_FILE, SCHEMA_URL, offsets_extra
from liftbridge_provider.core.ranges import OffsetRange

# OpenLineage's DatasetFacet as its spec 2-0-2 defines it (the two fields every facet has; `_deleted` optional),
# so the shipped schema's reference to it resolves without the network.
OPENLINEAGE_SPEC = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": {
        "DatasetFacet": {
            "type": "object",
            "properties": {
                "_producer": {"type": "string", "format": "uri"},
                "_schemaURL": {"type": "string", "format": "uri"},
                "_deleted": {"type": "boolean"},
            },
            "required": ["_producer", "_schemaURL"],
        }
    },
}


def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(resources.files("liftbridge_provider.assets").joinpath(SCHEMA_FILE).read_text())
    registry: Registry[Any] = Registry().with_resource(
        "https://openlineage.io/spec/2-0-2/OpenLineage.json", Resource.from_contents(OPENLINEAGE_SPEC)
    )
    facet_schema = {"$ref": f"{schema['$id']}#/$defs/LiftbridgeOffsetsDatasetFacet"}
    registry = registry.with_resource(schema["$id"], Resource.from_contents(schema))
    return jsonschema.Draft202012Validator(facet_schema, registry=registry)


def test_read_offsets_become_a_dataset_facet_that_matches_the_shipped_schema() -> None:
    """The converter turns the offsets in the asset's extra into the facet, with our schema URL and producer,
    and what OpenLineage serializes of it is valid against the JSON schema the package ships."""
    extra = offsets_extra("orders", [OffsetRange(1, 5, 5), OffsetRange(0, 10, 25)], "ingest")
    dataset = convert_asset_to_openlineage(Asset(uri="liftbridge://broker1:9292/orders", extra=extra), None)
    assert (dataset.namespace, dataset.name) == ("liftbridge://broker1:9292", "orders")
    assert dataset.facets is not None
    serialized = Serde.to_dict(dataset.facets[FACET_NAME])
    assert serialized == {
        "_producer": PRODUCER,
        "_schemaURL": SCHEMA_URL,
        "stream": "orders",
        "cursorId": "ingest",
        "ranges": [{"partition": 0, "start": 10, "end": 25}, {"partition": 1, "start": 5, "end": 5}],
    }
    _validator().validate(serialized)


def test_the_schema_refuses_a_range_that_is_not_whole_offsets() -> None:
    """The shipped schema is strict enough to catch a facet that lost its numbers."""
    bad = {"_producer": PRODUCER, "_schemaURL": SCHEMA_URL, "stream": "s", "ranges": [{"partition": 0, "start": "a"}]}
    with pytest.raises(jsonschema.ValidationError):
        _validator().validate(bad)


def test_offsets_facet_without_a_cursor() -> None:
    extra = offsets_extra("orders", [OffsetRange(0, 0, 3)], None)
    dataset = convert_asset_to_openlineage(Asset(uri="liftbridge://b:9292/orders", extra=extra), None)
    assert dataset.facets is not None
    serialized = Serde.to_dict(dataset.facets[FACET_NAME])
    assert "cursorId" not in serialized  # OpenLineage leaves out fields that are None
    _validator().validate(serialized)


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(None, id="no extra"),
        pytest.param({"other": 1}, id="no offsets"),
        pytest.param({FACET_NAME: {"stream": "o", "ranges": [{"partition": 0, "start": 9, "end": 3}]}}, id="end<start"),
        pytest.param({FACET_NAME: {"stream": "o", "ranges": [{"partition": -1, "start": 0, "end": 3}]}}, id="negative"),
        pytest.param({FACET_NAME: {"stream": 5, "ranges": []}}, id="stream not text"),
        pytest.param({FACET_NAME: {"stream": "orders", "ranges": "0-3"}}, id="ranges not a list"),
    ],
)
def test_an_asset_without_well_formed_offsets_converts_without_the_facet(extra: dict[str, Any] | None) -> None:
    """An asset made elsewhere may carry anything in its extra: it still converts, only without the facet."""
    dataset = convert_asset_to_openlineage(Asset(uri="liftbridge://b:9292/orders", extra=extra), None)
    assert (dataset.namespace, dataset.name) == ("liftbridge://b:9292", "orders")
    assert not dataset.facets
