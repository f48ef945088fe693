#!/bin/sh
# The `swerl` command of a swerl Python environment: deploy/dev/setup.sh installs this file as
# .venv/bin/swerl (after `source .venv/bin/activate` it is on the PATH). The environment is shared
# by every checkout set up on this machine, so the command runs the CLI of the checkout that you
# are in (the current directory or one above it), else of $SWERL_HOME, else of the checkout that
# was set up last (@ROOT@).
find_checkout() {
  dir=$PWD
  while :; do
    if [ -f "$dir/services/swerl_cli/main.py" ]; then echo "$dir"; return 0; fi
    [ "$dir" = / ] && return 1
    dir=$(dirname "$dir")
  done
}
if root=$(find_checkout); then :
elif [ -n "${SWERL_HOME:-}" ]; then root=$SWERL_HOME
else root='@ROOT@'
fi
if [ ! -f "$root/services/swerl_cli/main.py" ]; then
  echo "swerl: $root is not a swerl checkout: run swerl inside one, or set SWERL_HOME to one" >&2
  exit 2
fi
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec '@PYTHON@' -m services.swerl_cli "$@"
