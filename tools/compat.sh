#!/usr/bin/env bash
# The compatibility tier for one target (README, "Versions"): the built wheel in a fresh virtual environment.
#
#   tools/compat.sh TARGET      TARGET: airflow-3.1, airflow-3.2, pyspark-4.0, pyspark-4.1, pyspark-4.2,
#                                       python-3.12, python-3.13
#
# Makes .compat/TARGET anew, installs the wheel of dist/ built for its Python (make wheels: one
# airflow_provider_liftbridge-*-cp3XY-cp3XY-<platform>.whl per Python, as each carries the compiled decoder) with
# its extras through pip's normal resolution, constrained by constraints/TARGET.txt, then runs tests/compat against
# real servers (.tools/bin) from a scratch folder, so Python and Spark's workers import the wheel, not the checkout.
#   airflow-*: extras airflow,spark,iceberg; the Airflow tests.           Python: $PYTHON (python3, 3.11 here)
#   pyspark-*: extras spark,iceberg (no Airflow); the Spark tests.        Python: $PYTHON
#   python-X.Y: extras airflow,spark,iceberg at the newest Airflow 3.3 and PySpark 4.3, pyspark's own files
#               installed last (docs/troubleshooting.md: pyspark-client 4.2 overwrites them); the Airflow tests
#               and the Spark tests.                                     Python: X.Y (tools/python-for.sh)
# pip's own cache (built wheels, pyspark's included) is what is reused between runs; the environment itself is
# always new.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET="${1:?usage: tools/compat.sh TARGET}"
PYTHON="${PYTHON:-python3}"
case "$TARGET" in
  airflow-*) EXTRAS=airflow,spark,iceberg,compat ;;
  pyspark-*) EXTRAS=spark,iceberg,compat ;;
  python-3.*) EXTRAS=airflow,spark,iceberg,compat; PYTHON="$("$ROOT/tools/python-for.sh" "${TARGET#python-}")" ;;
  *) echo "unknown target $TARGET" >&2; exit 2 ;;
esac
CONSTRAINTS="$ROOT/constraints/$TARGET.txt"
[ -f "$CONSTRAINTS" ] || { echo "no $CONSTRAINTS" >&2; exit 2; }
# The wheel's tag for this interpreter, e.g. cp312-cp312-linux_x86_64.
TAG="$("$PYTHON" -c 'import sys, sysconfig; cp = "cp%d%d" % sys.version_info[:2]
print(f"{cp}-{cp}-" + sysconfig.get_platform().replace("-", "_").replace(".", "_"))')"
shopt -s nullglob
WHEELS=("$ROOT"/dist/airflow_provider_liftbridge-*-"$TAG".whl)
shopt -u nullglob
[ "${#WHEELS[@]}" -eq 1 ] || { echo "want one wheel for $TAG in dist/, found ${#WHEELS[@]}: run make wheels" >&2; exit 2; }
ENV="$ROOT/.compat/$TARGET"
started=$(date +%s)
rm -rf "$ENV"
"$PYTHON" -m venv "$ENV"
"$ENV/bin/pip" install --quiet --disable-pip-version-check "${WHEELS[0]}[$EXTRAS]" -c "$CONSTRAINTS"
if [[ "$TARGET" == python-* ]]; then
  PYSPARK_VERSION="$("$ENV/bin/python" -c 'import importlib.metadata as m; print(m.version("pyspark"))')"
  "$ENV/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "pyspark==$PYSPARK_VERSION"
fi
installed=$(date +%s)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
status=0
(cd "$WORK" && LIFTBRIDGE_TOOLS_BIN="$ROOT/.tools/bin" "$ENV/bin/pytest" -c "$ROOT/tests/compat/pytest.ini" \
  "$ROOT/tests/compat" --compat-target "$TARGET" ${COMPAT_PYTEST_ARGS:-}) || status=$?
echo "== compat $TARGET: install $((installed - started)) s, tests $(($(date +%s) - installed)) s, exit $status"
exit "$status"
