"""The ``liftbridge`` scheme for the common messaging provider's ``MessageQueueTrigger``.

``MessageQueueTrigger(scheme="liftbridge", stream="orders", mode="batch")`` builds a
:class:`~liftbridge_provider.triggers.message.LiftbridgeMessageTrigger` with the
same keyword arguments. Needs ``apache-airflow-providers-common-messaging``.
"""

from __future__ import annotations

from airflow.exceptions import AirflowOptionalProviderFeatureException

try:
    from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider
except ImportError as exc:  # the common messaging provider is an optional extra
    raise AirflowOptionalProviderFeatureException(exc) from exc

from liftbridge_provider.triggers.message import LiftbridgeMessageTrigger


class LiftbridgeMessageQueueProvider(BaseMessageQueueProvider):
    """Matches ``scheme="liftbridge"``; the trigger takes LiftbridgeMessageTrigger's keyword arguments."""

    scheme = "liftbridge"

    def trigger_class(self) -> type[LiftbridgeMessageTrigger]:
        return LiftbridgeMessageTrigger
