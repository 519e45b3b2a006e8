#!/usr/bin/env bash
# Print the path of a Python X.Y interpreter, for the per-Python wheels (make wheels) and the python-X.Y targets of
# the compatibility tier (tools/compat.sh, tools/constraints.sh).
#
#   tools/python-for.sh X.Y
#
# pythonX.Y from PATH when it runs and is X.Y (a pyenv shim of a version that is installed but not selected
# does not run), else the newest X.Y.* that pyenv installed. Exit 1, saying so, when there is none.
set -euo pipefail
WANT="${1:?usage: tools/python-for.sh X.Y}"
[[ "$WANT" =~ ^3\.[0-9]+$ ]] || { echo "not a Python version: $WANT (X.Y, e.g. 3.12)" >&2; exit 2; }
CHECK="import sys; assert '%d.%d' % sys.version_info[:2] == '$WANT'; print(sys.executable)"
if found=$("python$WANT" -c "$CHECK" 2>/dev/null); then
  echo "$found"
  exit 0
fi
ROOT="$( (command -v pyenv >/dev/null && pyenv root) || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
while read -r dir; do
  if [ -n "$dir" ] && found=$("$dir/bin/python$WANT" -c "$CHECK" 2>/dev/null); then
    echo "$found"
    exit 0
  fi
done < <(ls -d "$ROOT/versions/$WANT".* 2>/dev/null | sort -V -r)
echo "no Python $WANT: put python$WANT on PATH or install it (pyenv install $WANT)" >&2
exit 1
