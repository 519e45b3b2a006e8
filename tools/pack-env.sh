#!/usr/bin/env bash
# Pack what Spark executors need to run the liftbridge data source into dist/liftbridge-spark-env.tar.gz:
# a virtual environment with this package (not editable) and its dependencies (grpcio, protobuf, pyarrow,
# nats-py), packed with venv-pack. Ship it with
#   spark-submit --archives dist/liftbridge-spark-env.tar.gz#env --conf spark.pyspark.python=./env/bin/python ...
# (pyspark itself comes from Spark on the executors). The packed venv keeps a link to this machine's
# Python (PYTHON, default python3): workers need the same Python version at the same path.
# Fast and silent when the archive is newer than every source file of the package and was packed from the
# same interpreter (its path and version are kept beside the archive: another PYTHON packs again).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
out="$root/dist/liftbridge-spark-env.tar.gz"
stamp="$out.python"
build="$root/build/spark-env"
interpreter="$("$python" -c 'import sys; print(sys.executable, sys.version.split()[0])')"

if [ -f "$out" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$interpreter" ] && \
    [ -z "$(find "$root/liftbridge_provider" "$root/proto" "$root/pyproject.toml" "$root/setup.py" \
    -newer "$out" \( -name '*.py' -o -name '*.proto' -o -name '*.toml' \) -print -quit)" ]; then
  exit 0
fi
echo "packing the executors' environment into $out"
rm -rf "$build" "$root"/build/lib* "$out"
"$python" -m venv "$build"
"$build/bin/python" -m pip install --quiet --upgrade pip
# pyarrow for the Arrow batches; pyspark is not installed: Spark puts its own on the executors' path.
"$build/bin/python" -m pip install --quiet "$root" "pyarrow>=18" "venv-pack==0.2.0"
# The build leaves airflow_provider_liftbridge.egg-info in the project folder; on sys.path (the project folder
# is there in tests and compat mode) Airflow would see the distribution twice and load its plugin entry points
# twice, skipping the entry-point plugins after the second copy in task processes (OpenLineage's listener).
rm -rf "$root/airflow_provider_liftbridge.egg-info"
mkdir -p "$root/dist"
"$build/bin/venv-pack" --quiet -p "$build" -o "$out"
echo "$interpreter" > "$stamp"
echo "packed $(du -h "$out" | cut -f1) into $out (Python $interpreter)"
