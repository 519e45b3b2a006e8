#!/usr/bin/env bash
# Write constraints/TARGET.txt: the versions pip resolves today for the wheel with the target's extras and pins
# (README, "Versions"). Run after changing pyproject.toml's ranges, then run the compat tier.
# pyspark-4.0 is also the floors target: grpcio and protobuf at pyproject.toml's lower bounds (the versions the
# generated code checks for); every other target gets the newest that resolve.
# python-3.12 and python-3.13 resolve on their own Python (tools/python-for.sh finds it): the newest Airflow 3.3 and
# PySpark 4.3 with the airflow, spark and iceberg extras, as there; the others on $PYTHON (python3, 3.11).
#
#   tools/constraints.sh TARGET   TARGET: newest, airflow-3.1, airflow-3.2, pyspark-4.0, pyspark-4.1, pyspark-4.2,
#                                         python-3.12, python-3.13
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET="${1:?usage: tools/constraints.sh TARGET}"
PYTHON="${PYTHON:-python3}"
# "grpcio==X protobuf==Y" from pyproject.toml's "grpcio>=X,<2" and "protobuf>=Y,<8".
FLOORS=$(cd "$ROOT" && "$PYTHON" -c 'import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print(" ".join(f"{m[1]}=={m[2]}" for d in deps if (m := re.match(r"(grpcio|protobuf)>=([0-9.]+)", d))))')
read -r -a FLOOR_PINS <<< "$FLOORS"
case "$TARGET" in
  newest) SPEC=(".[dev,airflow,spark,iceberg,compat]") ;;
  airflow-3.1) SPEC=(".[airflow,spark,iceberg,compat]" "apache-airflow==3.1.8") ;;
  # Airflow 3.2.2 needs cadwyn<8 and fastapi<0.137, and svcs<26.2 against its startup race (docs/troubleshooting.md).
  airflow-3.2) SPEC=(".[airflow,spark,iceberg,compat]" "apache-airflow==3.2.2" "cadwyn<8" "fastapi<0.137" "svcs<26.2") ;;
  pyspark-4.0) SPEC=(".[spark,iceberg,compat]" "pyspark==4.0.5" "${FLOOR_PINS[@]}") ;;
  pyspark-4.1) SPEC=(".[spark,iceberg,compat]" "pyspark==4.1.4") ;;
  pyspark-4.2) SPEC=(".[spark,iceberg,compat]" "pyspark==4.2.1") ;;
  python-3.12 | python-3.13)
    SPEC=(".[airflow,spark,iceberg,compat]" "apache-airflow>=3.3,<3.4" "pyspark>=4.3,<4.4")
    PYTHON="$("$ROOT/tools/python-for.sh" "${TARGET#python-}")" ;;
  *) echo "unknown target $TARGET" >&2; exit 2 ;;
esac
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m venv "$WORK/env"
(cd "$ROOT" && "$WORK/env/bin/pip" install --quiet --disable-pip-version-check "${SPEC[@]}")
{
  echo "# constraints/$TARGET.txt: written by tools/constraints.sh $TARGET ($("$WORK/env/bin/python" --version))"
  "$WORK/env/bin/pip" freeze --exclude airflow-provider-liftbridge | grep -v '^-e '
} > "$ROOT/constraints/$TARGET.txt"
echo "wrote constraints/$TARGET.txt"
