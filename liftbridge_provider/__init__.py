"""Apache Airflow provider and PySpark ingestion for Liftbridge."""

__version__ = "0.1.0"
