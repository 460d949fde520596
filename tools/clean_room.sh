#!/usr/bin/env bash
# CI as a fresh machine runs it: a new clone of REF (default HEAD) in a new folder, with HOME,
# TMPDIR and the XDG folders inside that folder and none of this shell's venv, PYTHONPATH, Ray or
# Jupyter variables, runs .ci/run and prints its wall time. Nothing of an earlier run (a venv, a
# pip or XLA cache, a Ray session, a link into /tmp) is reachable from it: only the clone, the
# lock and the package registries this machine's pip is configured with (PIP_* and /etc/xdg/pip,
# as on the CI machine). The folder is removed afterwards unless KEEP=1.
#
#   tools/clean_room.sh            # HEAD
#   tools/clean_room.sh main       # any ref this repository has
#   COMMAND="make tutorial" tools/clean_room.sh   # another command than .ci/run
set -euo pipefail
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
ref=${1:-HEAD}
# Short paths: Ray's Unix sockets live under TMPDIR, and a socket path has at most 107 bytes.
room=$(mktemp -d /tmp/cr-XXXXXX)
cleanup() { [ "${KEEP:-0}" = 1 ] && echo "kept $room" || rm -rf "$room"; }
trap cleanup EXIT
mkdir -p "$room"/{h,t,cache,config,data,state,run}
chmod 700 "$room/run"
git clone --quiet --no-local --no-hardlinks "$repo" "$room/c"
git -C "$room/c" checkout --quiet --detach "$(git -C "$repo" rev-parse "$ref")"
echo "clean room $room: $(git -C "$room/c" log -1 --format='%h %s' | cut -c1-100)"

# The variables a fresh machine's shell has, and the registries' settings; nothing else.
keep=(PATH LANG LC_ALL TERM)
for name in $(compgen -e); do
  case $name in PIP_*|UV_INDEX*|UV_EXTRA_INDEX*|SSL_CERT_*|REQUESTS_CA_BUNDLE) keep+=("$name");; esac
done
vars=()
for name in "${keep[@]}"; do
  [ -n "${!name+x}" ] && vars+=("$name=${!name}")
done
# A venv's bin on PATH would lend its python3 to the clone: drop every entry under a venv.
path=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e '/\.venv' -e "^${VIRTUAL_ENV:-/nonexistent}" | paste -sd:)

start=$(date +%s)
set +e
env -i "${vars[@]}" PATH="$path" HOME="$room/h" TMPDIR="$room/t" \
  XDG_CACHE_HOME="$room/cache" XDG_CONFIG_HOME="$room/config" XDG_DATA_HOME="$room/data" \
  XDG_STATE_HOME="$room/state" XDG_RUNTIME_DIR="$room/run" \
  bash -c 'cd "$1" && eval "$2"' _ "$room/c" "${COMMAND:-.ci/run}"
rc=$?
set -e
wall=$(( $(date +%s) - start ))
printf 'clean room: %s exited %d after %dm%02ds\n' "${COMMAND:-.ci/run}" "$rc" $((wall / 60)) $((wall % 60))
exit "$rc"
