"""The "Liftbridge" page in Airflow's UI: streams, cursors with their lag, watchers with their dead letters.

``plugin.py`` (the Airflow plugin) mounts ``app.py`` (the page and its JSON API, behind Airflow's
connection-read permission) in the API server; ``service.py`` answers per connection from one bounded,
cached look at the cluster (``cluster.py``, ``bounds.py``); ``airflow_sources.py`` reads the connections
and asset watchers from Airflow; ``cursor_log.py`` and ``views.py`` are the pure decisions. The Runs view:
``runs_service.py`` (bounded, cached) from ``run_sources.py`` (Airflow's records of ingest tasks) and
``lake_records.py`` (each lake's own record), shaped by ``runs.py`` (pure); the lag over time:
``history.py`` (a bounded ring in memory, pure). See docs/airflow.md, "The Liftbridge page".
"""
