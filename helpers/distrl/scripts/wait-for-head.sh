#!/bin/sh
# Wait until the Ray head answers, then join it as a worker node.
#
# The plain Kubernetes manifests run this from a ConfigMap in every actor pod, and
# distrl.cluster.local runs the same file for local worker nodes, so both start the same way.
#
# Environment:
#   RAY_HEAD_ADDRESS           host:port of the head's GCS (required), e.g. distrl-head:6379
#   WAIT_FOR_HEAD_TIMEOUT_S    give up after this many seconds (default 300)
#   WAIT_FOR_HEAD_INTERVAL_S   seconds between tries (default 2)
#   RAY_NUM_CPUS               CPUs this node offers to Ray (default: Ray detects them)
#   RAY_START                  the command that starts the node (default: ray start; a local
#                              cluster's keeps 127.0.0.1 as the node's address)
#   RAY_AUTH_MODE              token (default) or disabled; the token comes from RAY_AUTH_TOKEN,
#                              the file RAY_AUTH_TOKEN_PATH names (the plain manifests mount the
#                              Secret there), or ~/.ray/auth_token
# Arguments are passed on to `ray start` (e.g. --block to keep the pod's main process alive).
set -eu
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"

: "${RAY_HEAD_ADDRESS:?set RAY_HEAD_ADDRESS to the head's host:port, e.g. distrl-head:6379}"
timeout_s="${WAIT_FOR_HEAD_TIMEOUT_S:-300}"
interval_s="${WAIT_FOR_HEAD_INTERVAL_S:-2}"
deadline=$(( $(date +%s) + timeout_s ))
host="${RAY_HEAD_ADDRESS%:*}"
port="${RAY_HEAD_ADDRESS##*:}"

# Up means the head's GCS port accepts connections: a DNS name that resolves before the head
# listens does not count. (Python is in every Ray image; nc and curl are not.)
head_listens() {
  python -c 'import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()' \
    "$host" "$port" 2>/dev/null
}

until head_listens; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "wait-for-head: no Ray head answered at $RAY_HEAD_ADDRESS within ${timeout_s}s" >&2
    exit 1
  fi
  echo "wait-for-head: waiting for the Ray head at $RAY_HEAD_ADDRESS"
  sleep "$interval_s"
done

echo "wait-for-head: the Ray head at $RAY_HEAD_ADDRESS is up; joining"
if [ -n "${RAY_NUM_CPUS:-}" ]; then
  set -- "--num-cpus=$RAY_NUM_CPUS" "$@"
fi
# shellcheck disable=SC2086 # RAY_START is a command and its arguments
exec ${RAY_START:-ray start} --address="$RAY_HEAD_ADDRESS" "$@"
