#!/usr/bin/env bash
# Fetch the jars Spark needs for s3a:// (hadoop-aws 3.5.0 and the AWS SDK v2 modules it loads, 35 jars,
# 12.3 MB) into .tools/jars/s3a, from Maven Central through Maven itself.
#
# What to fetch is tools/s3a-jars/pom.xml (why each jar, and what is left out because pyspark ships it);
# Maven checks each download against the repository's SHA-1 (-C), then this script checks every jar against
# the SHA-256 pinned in tools/s3a-jars/jars.sha256 and requires exactly that set. A verified folder gets
# a copy of the pins as .complete, which the tests read (liftbridge_provider/devserver/s3.py, s3a_jars()).
# Fast and silent when the folder is complete and its jars match the pins.
#
# The cache between runs is Maven's local repository (~/.m2/repository, or -Dmaven.repo.local through
# MAVEN_OPTS): a second fetch on the same machine, CI's included, copies without downloading. Cold (empty
# local repository): about 20 s, most of it Maven's dependency plugin itself.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${LIFTBRIDGE_S3A_JARS:-$root/.tools/jars/s3a}"
pom="$root/tools/s3a-jars/pom.xml"
pins="$root/tools/s3a-jars/jars.sha256"

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
  echo "error: Maven (mvn) is needed to fetch the S3A jars for Spark; install it (apt-get install maven)" >&2
  exit 1
fi
echo "fetching the S3A jars (hadoop-aws 3.5.0, AWS SDK v2 modules) into $dest"
started=$(date +%s)
mkdir -p "$(dirname "$dest")"
staged="$(mktemp -d "$dest.XXXXXX")"
trap 'rm -rf "$staged"' EXIT
if ! mvn -q -B -C -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DoutputDirectory="$staged" \
  >"$staged.log" 2>&1; then
  cat "$staged.log" >&2
  rm -f "$staged.log"
  echo "error: Maven could not fetch the S3A jars (above)" >&2
  exit 1
fi
rm -f "$staged.log"
if ! matches_pins "$staged"; then
  echo "error: the jars Maven fetched into $staged differ from tools/s3a-jars/jars.sha256:" >&2
  (cd "$staged" && sha256sum --strict -c "$pins" 2>&1 | grep -v ': OK$' >&2) || true
  diff <(cd "$staged" && ls -1 -- *.jar | sort) <(awk '{print $2}' "$pins" | sort) >&2 || true
  exit 1
fi
cp "$pins" "$staged/.complete"
rm -rf "$dest"
mv "$staged" "$dest"
trap - EXIT
echo "S3A jars: $(ls "$dest"/*.jar | wc -l) files, $(du -sb "$dest" | cut -f1) bytes, in $(($(date +%s) - started)) s"
