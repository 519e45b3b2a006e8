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
# Built from a copy of the project: setuptools writes airflow_provider_liftbridge.egg-info beside the sources
# it builds. In the project folder, which is on sys.path in tests and compat mode, an Airflow process starting
# while it is half written failed at import ("No package metadata was found", CI 2026-12-07), and one that
# saw it whole would load the provider's plugin entry points twice.
source="$build-src"
rm -rf "$source" && mkdir -p "$source"
(cd "$root" && ls -d pyproject.toml setup.py MANIFEST.in README.md LICENSE* NOTICE* proto tools/gen_proto.py \
    liftbridge_provider pyspark_liftbridge 2>/dev/null || true) \
    | tar -C "$root" --exclude=__pycache__ --exclude='*_cache' --exclude='*.so' -cf - -T - | tar -C "$source" -xf -
"$build/bin/python" -m pip install --quiet "$source" "pyarrow>=18" "venv-pack==0.2.0"
rm -rf "$source"
mkdir -p "$root/dist"
"$build/bin/venv-pack" --quiet -p "$build" -o "$out"
echo "$interpreter" > "$stamp"
echo "packed $(du -h "$out" | cut -f1) into $out (Python $interpreter)"
