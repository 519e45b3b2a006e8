#!/usr/bin/env bash
# Fetch the jars of Apache Iceberg's reference REST catalog (iceberg-core 1.10.0's RESTCatalogAdapter and
# RESTCatalogServlet, which RESTCatalogServer serves, over a JdbcCatalog on SQLite; 21 jars, 29 MB) into
# .tools/jars/iceberg-rest, from Maven Central through Maven itself. The object-storage tests of the Iceberg
# ingest run it (tests/iceberg_rest.py), beside pyspark's jars and the S3A set (.tools/jars/s3a).
#
# What to fetch is tools/iceberg-rest-jars/pom.xml (why each jar); Maven checks each download against the
# repository's SHA-1 (-C), then this script checks every jar against the SHA-256 pinned in
# tools/iceberg-rest-jars/jars.sha256 and requires exactly that set. A verified folder gets a copy of the pins
# as .complete, which the tests read. Fast and silent when the folder is complete and its jars match the pins.
# The cache between runs is Maven's local repository (~/.m2/repository), as for the S3A jars.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${LIFTBRIDGE_ICEBERG_REST_JARS:-$root/.tools/jars/iceberg-rest}"
pom="$root/tools/iceberg-rest-jars/pom.xml"
pins="$root/tools/iceberg-rest-jars/jars.sha256"

# Whether folder $1 holds exactly the pinned jars, each matching its SHA-256.
matches_pins() {
  [ -d "$1" ] &&
    [ "$(cd "$1" && ls -1 -- *.jar 2>/dev/null | sort)" = "$(awk '{print $2}' "$pins" | sort)" ] &&
    (cd "$1" && sha256sum --quiet --strict -c "$pins" >/dev/null 2>&1)
}

if [ -f "$dest/.complete" ] && cmp -s "$dest/.complete" "$pins" && matches_pins "$dest"; then
  exit 0
fi
if ! command -v mvn >/dev/null 2>&1; then
  echo "error: Maven (mvn) is needed to fetch the Iceberg REST catalog jars; install it (apt-get install maven)" >&2
  exit 1
fi
echo "fetching the Iceberg REST catalog server's jars (Iceberg 1.10.0) into $dest"
started=$(date +%s)
mkdir -p "$(dirname "$dest")"
staged="$(mktemp -d "$dest.XXXXXX")"
trap 'rm -rf "$staged"' EXIT
mvn -q -B -C -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DoutputDirectory="$staged" -Dmdep.useRepositoryLayout=false
if ! matches_pins "$staged"; then
  echo "error: the jars Maven fetched into $staged differ from tools/iceberg-rest-jars/jars.sha256:" >&2
  (cd "$staged" && sha256sum --strict -c "$pins" 2>&1 | grep -v ': OK$' >&2) || true
  diff <(cd "$staged" && ls -1 -- *.jar | sort) <(awk '{print $2}' "$pins" | sort) >&2 || true
  exit 1
fi
cp "$pins" "$staged/.complete"
rm -rf "$dest"
mv "$staged" "$dest"
trap - EXIT
echo "Iceberg REST catalog jars: $(ls "$dest"/*.jar | wc -l) files, $(du -sb "$dest" | cut -f1) bytes, in $(($(date +%s) - started)) s"
