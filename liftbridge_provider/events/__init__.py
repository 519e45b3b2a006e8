"""Airflow's own events on Liftbridge: a listener plugin that publishes DAG-run and task-instance state changes.

``settings.py`` (the ``[liftbridge_events]`` options), ``payloads.py`` (an event as
JSON and its key), ``publisher.py`` (the bounded queue and the thread that
publishes), ``listener.py`` (Airflow's listener hooks) and ``plugin.py`` (the
plugin Airflow loads). See docs/airflow.md, "Airflow's events on a stream".
"""
