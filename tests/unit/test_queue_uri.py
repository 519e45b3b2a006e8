"""The queue URI form of the liftbridge message-queue scheme: MessageQueueTrigger(queue="liftbridge://...")."""

from __future__ import annotations

import pytest

from liftbridge_provider.client import InvalidArgumentError
from liftbridge_provider.queues.liftbridge import LiftbridgeMessageQueueProvider, queue_kwargs


def test_the_uri_names_the_stream_and_its_query_gives_the_trigger_arguments() -> None:
    uri = "liftbridge://127.0.0.1:9292/orders?mode=batch&max_messages=500&max_wait=2.5&partitions=0,2&cursor_id=c"
    assert queue_kwargs(uri) == {"stream": "orders", "mode": "batch", "max_messages": 500, "max_wait": 2.5,
                                 "partitions": [0, 2], "cursor_id": "c"}  # fmt: skip
    assert queue_kwargs("liftbridge:///orders") == {"stream": "orders"}


@pytest.mark.parametrize(
    ("uri", "given", "message"),
    [
        ("liftbridge://h:1/", {}, "must name one stream"),
        ("liftbridge://h:1/a/b", {}, "must name one stream"),
        ("kafka://h:1/a", {}, "is not a liftbridge"),
        ("liftbridge://h:1/a?colour=red", {}, "unknown parameter 'colour'"),
        ("liftbridge://h:1/a?max_messages=many", {}, "max_messages='many' is not a int"),
        ("liftbridge://h:1/a?mode=batch&mode=message", {}, "gives mode twice"),
        ("liftbridge://h:1/a?mode=batch", {"mode": "message"}, "both give mode"),
    ],
)
def test_bad_uris_are_refused_naming_what_is_wrong(uri: str, given: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        queue_kwargs(uri, given)


def test_the_provider_matches_the_scheme_and_the_uri_form_and_builds_the_trigger() -> None:
    provider = LiftbridgeMessageQueueProvider()
    assert provider.scheme_matches("liftbridge")
    assert provider.queue_matches("liftbridge://h:1/orders")
    assert not provider.queue_matches("kafka://h:1/orders")
    kwargs = provider.trigger_kwargs("liftbridge://h:1/orders?mode=batch", max_wait=3)
    trigger = provider.trigger_class()(**kwargs, max_wait=3)
    assert (trigger.settings.stream, trigger.settings.mode, trigger.settings.max_wait) == ("orders", "batch", 3.0)
