#!/usr/bin/env bash
# Bring compose.yaml up with podman-compose, in the stages podman 4.3 needs, waiting for each service to be ready
# (issue 40).  From nothing, and again over a failed or partial attempt: the containers of an attempt that is not up
# are removed first (not the volumes: the data are kept); a topology that is up is left as it is.
#
#   bash containers/compose-up.sh [EXTRA_COMPOSE_FILE ...]     e.g. containers/compose.standins.yaml
#
# Why stages: podman before 4.6 ignores `depends_on: condition: service_healthy` (podman-compose warns and starts
# everything at once, so `migrate` runs before PostgreSQL answers and fails), and its `--requires` graph fails on a
# dependency's dependency; each stage is `up -d --no-deps` of some services, then a wait for their readiness:
#   1. postgres and nats            ready: pg_isready in the container; NATS's /healthz with JetStream
#   2. migrate                      exited 0 (olu migrate: the schema at its head)
#   3. api replicas and the proxy   ready: /readyz 200 from each replica, then through the proxy on 127.0.0.1
#   4. consumers                    running, once OLU_STREAM_API_KEY is a tenant's key (not "none")
#
# Secrets: from the environment; what is unset is read from the env file (OLU_COMPOSE_ENV_FILE, default
# ./compose.env), and what is still missing is generated into it (mode 0600) and said, so that a rerun uses the same
# ones (PostgreSQL keeps the password its volume was initialised with).  Keep that file out of version control.
#
# Settings: OLU_COMPOSE_PROJECT (default olu), OLU_COMPOSE (default podman-compose), OLU_COMPOSE_IMAGE (the service's
# image; default: compose's), OLU_COMPOSE_BUILD=0 (never build it), OLU_READY_TIMEOUT (seconds per stage, default
# 300), and compose.yaml's own (OLU_REPLICAS, OLU_CONSUMERS, OLU_HTTP_PORT, OLU_STREAM_API_KEY, OLU_PROXY_SUBNET, ...).
set -euo pipefail
cd "$(dirname "$0")/.."

project=${OLU_COMPOSE_PROJECT:-olu}
compose_cmd=${OLU_COMPOSE:-podman-compose}
timeout_s=${OLU_READY_TIMEOUT:-300}
env_file=${OLU_COMPOSE_ENV_FILE:-compose.env}
files=(-f compose.yaml)
for extra in "$@"; do files+=(-f "$extra"); done

say() { echo "compose-up: $*" >&2; }
die() { say "$*"; exit 1; }

command -v podman >/dev/null || die "podman is not installed (Debian: apt-get install podman runc; docs/deployment.md)"
command -v "$compose_cmd" >/dev/null || die "$compose_cmd is not installed (pip install podman-compose)"

# ---- secrets -----------------------------------------------------------------------------------------------------
if [ -f "$env_file" ]; then
  while IFS='=' read -r name value; do
    case "$name" in ''|\#*) continue;; esac
    [ -n "${!name:-}" ] || export "$name=$value"
  done < "$env_file"
fi
gen() {
  python3 -c "import base64, secrets, sys; print(base64.b64encode(secrets.token_bytes(32)).decode() if sys.argv[1] == 'b64' else secrets.token_hex(24))" "$1"
}
for spec in OLU_ENCRYPTION_KEY:b64 OLU_SIGNING_KEY:b64 OLU_ADMIN_TOKEN:hex POSTGRES_PASSWORD:hex; do
  name=${spec%%:*}
  if [ -z "${!name:-}" ]; then
    value=$(gen "${spec##*:}")
    export "$name=$value"
    (umask 077; echo "$name=$value" >> "$env_file")
    say "generated $name into $env_file (mode 0600): keep it; a rerun and every replica need the same one"
  fi
done
export OLU_STREAM_API_KEY=${OLU_STREAM_API_KEY:-none}
port=${OLU_HTTP_PORT:-8080}

# ---- helpers -----------------------------------------------------------------------------------------------------
compose() { "$compose_cmd" -p "$project" "${files[@]}" "$@"; }
cname() { echo "${project}_$1_${2:-1}"; }
state() { podman inspect -f '{{.State.Status}}' "$1" 2>/dev/null || echo absent; }
is_state() { [ "$(state "$1")" = "$2" ]; }  # is_state CONTAINER STATE: evaluated at each try of wait_for
members() { podman ps -a --filter "name=^${project}_$1_[0-9]+\$" --format '{{.Names}}'; }
logs() {
  podman ps -a --filter "name=^${project}_" --format '{{.Names}} {{.Status}}' >&2 || true
  for c in $(podman ps -a --filter "name=^${project}_" --format '{{.Names}}'); do
    [ "$(state "$c")" = running ] || { say "--- $c"; podman logs --tail 20 "$c" >&2 || true; }
  done
}
wait_for() {  # wait_for WHAT COMMAND...: until the command succeeds, at most timeout_s seconds
  local what=$1; shift
  local deadline=$((SECONDS + timeout_s))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { say "timed out after ${timeout_s} s waiting for $what"; logs; exit 1; }
    sleep 1
  done
  say "$what: ready"
}
up() {
  local err
  err=$(mktemp)
  if ! compose up -d --no-build --no-deps "$@" >/dev/null 2>"$err" || grep -q '^Error' "$err"; then
    cat "$err" >&2; rm -f "$err"; die "podman-compose up $* failed"
  fi
  rm -f "$err"
}
proxy_ready() {
  python3 -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:$port/readyz', timeout=3).status != 200)"
}
replica_ready() {
  podman exec "$1" python -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=3).status != 200)"
}
start_consumers() {
  if [ "$OLU_STREAM_API_KEY" = none ] || [ "${OLU_CONSUMERS:-2}" = 0 ]; then
    say "no consumers started (OLU_STREAM_API_KEY=none): make a tenant and a write key, then run this again with it:"
    say "  curl -s -X POST localhost:$port/v1/tenants -H \"authorization: Bearer \$OLU_ADMIN_TOKEN\" -H 'content-type: application/json' -d '{\"name\":\"acme\"}'"
    say "  OLU_STREAM_API_KEY=olu_... bash containers/compose-up.sh $*"
    return
  fi
  if [ "$(state "$(cname consumer)")" != running ]; then
    members consumer | xargs -r podman rm -f >/dev/null
    up consumer
  fi
  sleep 3
  for c in $(members consumer); do wait_for "consumer $c" is_state "$c" running; done
}
done_message() { say "up: http://127.0.0.1:$port (the console at /console/, the API documentation at /docs)"; }

# ---- a topology that is up stays up; what is left of another attempt is removed (volumes kept) -------------------
existing=$(podman ps -a --filter "name=^${project}_" --format '{{.Names}}' || true)
if [ -n "$existing" ]; then
  if [ "$(state "$(cname postgres)")" = running ] && [ "$(state "$(cname proxy)")" = running ] && proxy_ready; then
    say "project $project is up (the proxy answers /readyz on 127.0.0.1:$port): leaving it as it is"
    start_consumers "$@"
    done_message
    exit 0
  fi
  say "project $project has containers of an attempt that is not up: removing them (podman-compose down; the volumes, so the data, are kept)"
  compose down -t 5 >/dev/null 2>&1 || true
  for c in $existing; do podman rm -f "$c" >/dev/null 2>&1 || true; done
fi

image=${OLU_COMPOSE_IMAGE:-$(compose config 2>/dev/null | awk '/^  api:/{api=1} api && $1 == "image:" {print $2; exit}')}
image=${image:-olu:latest}
if ! podman image exists "$image"; then
  [ "${OLU_COMPOSE_BUILD:-1}" != 0 ] || die "the image $image is missing (build it: podman build --format docker -t $image .)"
  say "building $image from the Dockerfile (minutes: the kernels are compiled into it)"
  podman build --format docker -t "$image" . >&2
fi

# ---- 1. postgres and nats -----------------------------------------------------------------------------------------
up postgres nats
wait_for "postgres" podman exec "$(cname postgres)" pg_isready -q -h 127.0.0.1 -U olu -d olu
wait_for "nats" podman exec "$(cname nats)" wget -qO- "http://127.0.0.1:8222/healthz?js-enabled-only=true"

# ---- 2. migrate ---------------------------------------------------------------------------------------------------
up migrate
wait_for "migrate to finish" is_state "$(cname migrate)" exited
code=$(podman inspect -f '{{.State.ExitCode}}' "$(cname migrate)")
if [ "$code" != 0 ]; then
  podman logs --tail 5 "$(cname migrate)" >&2 || true
  if podman logs "$(cname migrate)" 2>&1 | grep -q "password authentication failed"; then
    die "migrate could not log in: the PostgreSQL volume was initialised with another POSTGRES_PASSWORD; use that one (see $env_file), or delete the data with: $compose_cmd -p $project ${files[*]} down -v"
  fi
  die "migrate exited $code (its last lines are above)"
fi
say "migrate: the schema is at its head"

# ---- 3. the api replicas and the proxy ----------------------------------------------------------------------------
up api
for r in $(members api); do wait_for "api replica $r" replica_ready "$r"; done
up proxy
wait_for "the proxy on 127.0.0.1:$port" proxy_ready

# ---- 4. the consumers -----------------------------------------------------------------------------------------
start_consumers "$@"
done_message
