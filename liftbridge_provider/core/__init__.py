"""Pure logic, shared by the client, the Airflow faces and the Spark source: no I/O, no Airflow, PySpark, gRPC
or NATS.

Every module here imports only the standard library and other ``core`` modules (a ruff rule, TID251, and
``tests/unit/core/test_purity.py`` hold that), so any layer may import it and importing it loads nothing heavy.
See docs/architecture.md, "The pure core".
"""
