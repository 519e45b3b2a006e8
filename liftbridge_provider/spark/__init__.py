"""PySpark data source ``liftbridge`` (no Airflow import). See docs/spark.md."""
