#!/usr/bin/env bash
# The compatibility tier for one target (README, "Versions"): the built wheel in a fresh virtual environment.
#
#   tools/compat.sh TARGET      TARGET: airflow-3.1, airflow-3.2, pyspark-4.0, pyspark-4.1, pyspark-4.2
#
# Makes .compat/TARGET anew, installs dist/airflow_provider_liftbridge-*.whl with its extras (Airflow targets:
# airflow,spark,iceberg; PySpark targets: spark,iceberg) through pip's normal resolution, constrained by
# constraints/TARGET.txt, then runs tests/compat against real servers (.tools/bin) from a scratch folder, so
# Python and Spark's workers import the wheel, not the checkout. pip's own cache (built wheels, pyspark's included) is what is reused
# between runs; the environment itself is always new.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET="${1:?usage: tools/compat.sh TARGET}"
PYTHON="${PYTHON:-python3}"
case "$TARGET" in
  airflow-*) EXTRAS=airflow,spark,iceberg,compat ;;
  pyspark-*) EXTRAS=spark,iceberg,compat ;;
  *) echo "unknown target $TARGET" >&2; exit 2 ;;
esac
CONSTRAINTS="$ROOT/constraints/$TARGET.txt"
[ -f "$CONSTRAINTS" ] || { echo "no $CONSTRAINTS" >&2; exit 2; }
WHEELS=("$ROOT"/dist/airflow_provider_liftbridge-*.whl)
[ -f "${WHEELS[0]}" ] || { echo "no wheel in dist/: run make wheel" >&2; exit 2; }
ENV="$ROOT/.compat/$TARGET"
started=$(date +%s)
rm -rf "$ENV"
"$PYTHON" -m venv "$ENV"
"$ENV/bin/pip" install --quiet --disable-pip-version-check "${WHEELS[0]}[$EXTRAS]" -c "$CONSTRAINTS"
installed=$(date +%s)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
status=0
(cd "$WORK" && LIFTBRIDGE_TOOLS_BIN="$ROOT/.tools/bin" "$ENV/bin/pytest" -c "$ROOT/tests/compat/pytest.ini" \
  "$ROOT/tests/compat" --compat-target "$TARGET" ${COMPAT_PYTEST_ARGS:-}) || status=$?
echo "== compat $TARGET: install $((installed - started)) s, tests $(($(date +%s) - installed)) s, exit $status"
exit "$status"
