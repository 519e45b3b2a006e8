"""Every way a message goes out of the client.

- a unary ``Publish`` / ``PublishToSubject`` call, sent once (``plans.send_once``);
- single publishes on the PublishAsync streams every publish of a client shares
  (``publish_stream.py``; each stream the client's own HTTP/2 call, written and read by its callers in
  ``broker_stream.py`` on ``client/h2/blocking.py``);
- a pipelined ``publish_batch`` over the client's own HTTP/2 call (``publisher.py`` on the data
  plane, ``client/h2/``: ``aio_transport.py`` and ``call_state.py``; the bookkeeping in ``publish_window.py``);
- ``publish_batch`` over NATS (``nats_publisher.py``, ``nats_direct.py``, ``envelope.py``).

This module imports nothing: the connection pool opens the batch's HTTP/2 calls
(``client/h2/aio_transport.py``) and is imported by the publish modules, so the package
itself must not pull them in.
"""
