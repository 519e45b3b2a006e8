"""spark-submit entry point of the ingest job; the job is ``liftbridge_provider.spark.ingest`` (see its docstring).

    spark-submit spark_jobs/ingest.py --ranges '<json>' --output DIR [...]

An installed package has no ``spark_jobs/`` folder: submit the path that
``python -m liftbridge_provider.spark.ingest --path`` prints (``job_path()``).
"""

from __future__ import annotations

from liftbridge_provider.spark.ingest import run_job

if __name__ == "__main__":
    run_job()
