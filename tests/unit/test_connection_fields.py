"""The connection's fields are defined once (core/connection_fields.py): the form, the parsing and the docs agree."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from liftbridge_provider.client import ClientConfig
from liftbridge_provider.connection import KNOWN_EXTRAS, NATS_FIELDS, NUMBER_FIELDS, TLS_FIELDS, config_from_connection
from liftbridge_provider.core.connection_fields import FIELDS, docs_table, form_fields
from liftbridge_provider.get_provider_info import get_provider_info

DOCS = Path(__file__).resolve().parents[2] / "docs" / "airflow.md"


def test_the_docs_table_is_the_one_built_from_the_fields() -> None:
    """docs/airflow.md shows exactly the generated table (regenerate it with
    `python -m liftbridge_provider.core.connection_fields` after changing a field)."""
    text = DOCS.read_text()
    start = text.index("<!-- connection fields:")
    table = text[text.index("\n", start) + 1 : text.index("<!-- end of connection fields -->")]
    assert table == docs_table()


def test_the_form_offers_every_extra_the_parsing_accepts_and_no_other() -> None:
    form = get_provider_info()["connection-types"][0]["conn-fields"]
    assert form == form_fields()
    assert set(form) == KNOWN_EXTRAS
    assert set(NUMBER_FIELDS) | set(TLS_FIELDS) | set(NATS_FIELDS) | {"read_isr_replica"} == KNOWN_EXTRAS


def test_a_fields_shown_default_is_the_clients_own() -> None:
    """The form and docs say "(default X)": X must be what ClientConfig uses when the extra is empty."""
    defaults = {f.name: f.default for f in dataclasses.fields(ClientConfig)}
    shown = {field.name: field.default for field in FIELDS if field.default is not None}
    assert shown, "the number and flag fields show their defaults"
    for name, value in shown.items():
        assert defaults[name] == value, name
        assert f"(default {value:g}" in form_fields()[name]["description"] or isinstance(value, bool), name


def test_each_number_extra_is_read_as_its_type_into_the_config() -> None:
    extra = {name: "3" for name in NUMBER_FIELDS}
    config = config_from_connection("127.0.0.1", 9292, extra)
    for name, kind in NUMBER_FIELDS.items():
        value = getattr(config, name)
        assert value == 3, (name, value)
        assert type(value) is kind, (name, value)
