#!/usr/bin/env bash
# The shardlease end-to-end scenario on a local kind cluster.
#
#   e2e/kind.sh            run it, then delete the cluster
#   e2e/kind.sh --keep     run it and leave the cluster (kind-shardlease-e2e) up
#
# Needs: docker (a running engine), kind, kubectl, helm; a few GB of memory.
# Steps:
#   1. create the kind cluster `shardlease-e2e` (or reuse it if it exists);
#   2. docker build --target example -t shardlease:dev . (the repo root: the
#      runtime plus the example app) and kind load it;
#   3. MinIO in namespace `shardapp` (e2e/manifests/minio.yaml) and a Job that
#      creates the bucket `shardapp`;
#   4. helm install shardlease charts/shardlease (namespace shardlease);
#   5. the example StatefulSet e2e/manifests/shardapp.yaml: 3 pods of the
#      example app (python -m shardlease_examples.shardapp), annotated
#      shardlease.io/shards: "16"; the operator injects the agent sidecar;
#   6. wait until `kubectl get shardset shardapp` shows 16 owned and Balanced,
#      print the owners, and write keys through the owners;
#   7. delete a pod and watch the failover until balanced again (timed);
#   8. scale to 5, then to 2, and show the rebalance each time;
#   9. read every key back (each shard's data lives in MinIO, fenced by the
#      lease generation, so it survives every move), print a summary.
#
# Environment:
#   CLUSTER      kind cluster name (shardlease-e2e)
#   IMAGE        image to build and load (shardlease:dev)
#   MINIO_IMAGE  MinIO server image (minio/minio:RELEASE.2025-09-07T16-13-09Z)
#   MC_IMAGE     MinIO client image for the bucket Job (minio/mc:RELEASE.2025-08-13T08-35-41Z)
#   BUILD_ARGS   more arguments for `docker build` (none), e.g. a local base:
#                "--build-arg PYTHON_IMAGE=my/python:3.11-slim"
#   TIMEOUT      seconds for each wait (300)
#   KEYS         keys written and read back (200)
#
# MinIO images: MinIO stopped publishing community images and removed
# minio/minio and minio/mc from the default public image registry (September 2026). If the pull
# fails, set MINIO_IMAGE and MC_IMAGE to the same tags from a registry that
# still serves them (MinIO publishes them on its own registry). The images are
# pulled on this machine and loaded into kind, so a `docker login` here is
# enough for a private mirror.
#
# The example app and its fencing rule are described in examples/README.md.
set -euo pipefail

CLUSTER=${CLUSTER:-shardlease-e2e}
IMAGE=${IMAGE:-shardlease:dev}
MINIO_IMAGE=${MINIO_IMAGE:-minio/minio:RELEASE.2025-09-07T16-13-09Z}
MC_IMAGE=${MC_IMAGE:-minio/mc:RELEASE.2025-08-13T08-35-41Z}
TIMEOUT=${TIMEOUT:-300}
KEYS=${KEYS:-200}
BUILD_ARGS=${BUILD_ARGS:-}
NS=shardapp
RELEASE_NS=shardlease
SHARDS=16
KEEP=false

# The header comment above, as help.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

for arg in "$@"; do
  case "$arg" in
    --keep) KEEP=true ;;
    -h|--help) usage; exit 0 ;;
    *) echo "kind.sh: unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MANIFESTS="$ROOT/e2e/manifests"
CONTEXT="kind-$CLUSTER"
START=$(date +%s)
STEP=0
SUMMARY=()

# -- output ------------------------------------------------------------------------

if [ -t 1 ]; then BOLD=$'\033[1m'; DIM=$'\033[2m'; RED=$'\033[31m'; GREEN=$'\033[32m'; OFF=$'\033[0m'
else BOLD=; DIM=; RED=; GREEN=; OFF=; fi

elapsed() { echo $(( $(date +%s) - START )); }
step() { STEP=$((STEP + 1)); printf '\n%s==> [%d] %s%s %s(t=%ss)%s\n' "$BOLD" "$STEP" "$*" "$OFF" "$DIM" "$(elapsed)" "$OFF"; }
info() { printf '    %s\n' "$*"; }
ok() { printf '    %s✓%s %s\n' "$GREEN" "$OFF" "$*"; }
die() { printf '\n%s✗ %s%s\n' "$RED" "$*" "$OFF" >&2; exit 1; }
note() { SUMMARY+=("$*"); ok "$*"; }

k() { kubectl --context "$CONTEXT" "$@"; }
kn() { k -n "$NS" "$@"; }

cluster_exists() {
  local clusters
  clusters=$(kind get clusters 2>/dev/null || true)
  grep -qx "$CLUSTER" <<<"$clusters"
}

# -- cleanup and diagnostics ----------------------------------------------------------

diagnose() {
  printf '\n%s--- diagnostics ---%s\n' "$BOLD" "$OFF" >&2
  k get pods -A -o wide >&2 || true
  kn get shardset shardapp -o yaml >&2 || true
  kn get events --sort-by=.lastTimestamp 2>/dev/null | tail -n 25 >&2 || true
  k -n "$RELEASE_NS" logs deploy/shardlease --tail=40 >&2 || true
  for pod in $(kn get pods -l app.kubernetes.io/name=shardapp -o name 2>/dev/null); do
    printf -- '--- %s (agent) ---\n' "$pod" >&2
    kn logs "$pod" -c shardlease-agent --tail=15 >&2 || true
    printf -- '--- %s (app) ---\n' "$pod" >&2
    kn logs "$pod" -c app --tail=15 >&2 || true
  done
}

on_exit() {
  local code=$?
  if [ "$code" -ne 0 ] && cluster_exists; then
    diagnose
  fi
  if [ "$KEEP" = true ]; then
    printf '\nThe cluster is kept: kubectl --context %s -n %s get shardset shardapp\n' \
      "$CONTEXT" "$NS"
    printf 'Delete it with: kind delete cluster --name %s\n' "$CLUSTER"
  elif cluster_exists; then
    printf '\n%s==> deleting the kind cluster %s (use --keep to leave it)%s\n' "$BOLD" "$CLUSTER" "$OFF"
    kind delete cluster --name "$CLUSTER" || true
  fi
  exit "$code"
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# -- reading the ShardSet ---------------------------------------------------------------

# "OWNED LIVE BALANCED" of the ShardSet, or empty while it has no status.
shardset_state() {
  kn get shardset shardapp -o \
    jsonpath='{.status.ownedShards} {.status.liveNodes} {.status.conditions[?(@.type=="Balanced")].status}' \
    2>/dev/null || true
}

# "shard pod" lines, by shard (none while the ShardSet cannot be read).
# shellcheck disable=SC2016  # $s and $o are go-template variables, not shell ones
owner_lines() {
  { kn get shardset shardapp -o \
      go-template='{{range $s, $o := .status.owners}}{{$s}} {{$o}}{{"\n"}}{{end}}' \
      2>/dev/null || true; } | sort -n
}

# "shard generation" lines, by shard.
# shellcheck disable=SC2016  # go-template variables
generation_lines() {
  { kn get shardset shardapp -o \
      go-template='{{range $s, $g := .status.generations}}{{$s}} {{$g}}{{"\n"}}{{end}}' \
      2>/dev/null || true; } | sort -n
}

# How many of the shards in $1 ("shard:generation ...") now have a higher
# generation: each was claimed again since (every claim raises it by one).
reclaimed() {
  generation_lines | awk -v before="$1" '
    BEGIN { n = split(before, b, " "); for (i = 1; i <= n; i++) { split(b[i], p, ":"); was[p[1]] = p[2] } }
    ($1 in was) && ($2 + 0 > was[$1] + 0) { up++ }
    END { print up + 0 }'
}

# "pod: N shard(s): a b c" lines.
owners_by_pod() {
  owner_lines | awk '{ n[$2]++; s[$2] = s[$2] " " $1 }
                     END { for (p in n) printf "%s: %d shard(s):%s\n", p, n[p], s[p] }' | sort
}

show_owners() {
  kn get shardset shardapp
  owners_by_pod | while IFS= read -r line; do info "$line"; done
}

# Wait until the ShardSet shows every shard owned by exactly LIVE pods and
# Balanced=True; prints each change of state. Sets WAITED to the seconds taken.
wait_balanced() {
  local live=$1 what=$2 began now state last="" deadline
  began=$(date +%s)
  deadline=$((began + TIMEOUT))
  while :; do
    state=$(shardset_state)
    now=$(date +%s)
    if [ "$state" != "$last" ]; then
      info "$(printf '+%3ss  owned/live/balanced: %s' "$((now - began))" "${state:-(no status yet)}")"
      last=$state
    fi
    if [ "$state" = "$SHARDS $live True" ]; then
      WAITED=$((now - began))
      ok "$what: $SHARDS shards owned by $live pods, Balanced (${WAITED}s)"
      return 0
    fi
    [ "$now" -lt "$deadline" ] || die "not balanced over $live pods after ${TIMEOUT}s ($what): ${state:-no status}"
    sleep 1
  done
}

# The example client, run inside the first app container.
client() {
  local command=$1 replicas=$2 apps="" i
  for ((i = 0; i < replicas; i++)); do
    apps+="${apps:+,}http://shardapp-$i.shardapp.$NS.svc.cluster.local:8080"
  done
  kn exec shardapp-0 -c app -- python -m shardlease_examples.shardclient "$command" \
    --apps "$apps" --shards "$SHARDS" --count "$KEYS" --prefix e2e --run "$RUN_ID"
}

# -- the scenario -----------------------------------------------------------------------

step "checking the tools"
for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed (needs: docker kind kubectl helm)"
done
docker info >/dev/null 2>&1 || die "cannot talk to the Docker engine (is it running?)"
ok "docker, kind, kubectl and helm found"
RUN_ID=$(date +%s)

step "kind cluster $CLUSTER"
if cluster_exists; then
  ok "reusing the existing cluster $CLUSTER"
else
  kind create cluster --name "$CLUSTER" --wait 120s
  ok "created $CLUSTER"
fi
k cluster-info | sed -n 1p

step "building $IMAGE from $ROOT"
# shellcheck disable=SC2086  # BUILD_ARGS is a list of words
docker build $BUILD_ARGS --target example -t "$IMAGE" "$ROOT"
kind load docker-image "$IMAGE" --name "$CLUSTER"
ok "$IMAGE built and loaded into $CLUSTER"

step "MinIO in namespace $NS"
for image in "$MINIO_IMAGE" "$MC_IMAGE"; do
  docker image inspect "$image" >/dev/null 2>&1 || docker pull "$image" \
    || die "cannot pull $image: set MINIO_IMAGE / MC_IMAGE to a registry that serves MinIO's images (see the top of $0)"
  kind load docker-image "$image" --name "$CLUSTER" \
    || info "kind could not load $image; the cluster will pull it itself"
done
sed -e "s|image: minio/minio:.*|image: $MINIO_IMAGE|" \
    -e "s|image: minio/mc:.*|image: $MC_IMAGE|" "$MANIFESTS/minio.yaml" | k apply -f -
kn rollout status deploy/minio --timeout="${TIMEOUT}s"
kn wait --for=condition=complete job/minio-bucket --timeout="${TIMEOUT}s"
ok "MinIO is up and the bucket shardapp exists"

step "helm install shardlease (namespace $RELEASE_NS)"
helm --kube-context "$CONTEXT" upgrade --install shardlease "$ROOT/charts/shardlease" \
  --namespace "$RELEASE_NS" --create-namespace \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" \
  --wait --timeout "${TIMEOUT}s"
k -n "$RELEASE_NS" get deploy,svc
k get crd shardsets.shardlease.io >/dev/null
ok "the operator is running and the ShardSet CRD is installed"

step "the example StatefulSet (3 replicas, $SHARDS shards)"
sed "s|image: shardlease:dev|image: $IMAGE|" "$MANIFESTS/shardapp.yaml" | k apply -f -
kn rollout status statefulset/shardapp --timeout="${TIMEOUT}s"
# On Kubernetes >= 1.29 the agent is a native sidecar: an init container
# with restartPolicy Always; before, one more container.
containers=$(kn get pod shardapp-0 -o jsonpath='{.spec.initContainers[*].name} {.spec.containers[*].name}')
case " $containers " in
  *" shardlease-agent "*) ok "the webhook injected the shardlease-agent sidecar ($containers)" ;;
  *) die "shardapp-0 has no shardlease-agent container ($containers): was the operator ready?" ;;
esac

step "waiting for $SHARDS owned shards and Balanced=True"
wait_balanced 3 "initial placement"
note "initial placement over 3 pods: balanced after ${WAITED}s"
show_owners
info "leases:"
{ kn get leases -l shardlease.io/cluster=shardapp,shardlease.io/kind=shard --no-headers \
    2>/dev/null || true; } | awk 'NR <= 4 { printf "      %s held by %s\n", $1, $2 }
                                 END { if (NR > 4) printf "      ... (%d leases)\n", NR }'

step "writing $KEYS keys through their owners"
client write 3
note "$KEYS keys written through the owners"

step "deleting pod shardapp-1: failover"
before_uid=$(kn get pod shardapp-1 -o jsonpath='{.metadata.uid}')
moved_from=$(owner_lines | awk '$2 == "shardapp-1" { printf "%s ", $1 }')
moving=$(echo "$moved_from" | wc -w | tr -d ' ')
[ "$moving" -gt 0 ] || die "shardapp-1 owns no shard: nothing to fail over"
before_gens=$(generation_lines | awk -v want=" $moved_from" 'index(want, " " $1 " ") { printf "%s:%s ", $1, $2 }')
info "shardapp-1 owns shards: $moved_from(generations, shard:generation: $before_gens)"
began=$(date +%s)
kn delete pod shardapp-1 --wait=false
# The agent drains on SIGTERM (closes each shard, frees its lease) and the two
# other pods claim the shards within an interval; then the StatefulSet
# recreates shardapp-1 and the shards rebalance over three pods.
deadline=$((began + TIMEOUT))
failover="" last=""
while :; do
  now=$(date +%s)
  state=$(shardset_state)
  holders=$(owner_lines | awk '$2 == "shardapp-1"' | wc -l | tr -d ' ')
  uid=$(kn get pod shardapp-1 -o jsonpath='{.metadata.uid}' 2>/dev/null || true)
  ready=$(kn get pod shardapp-1 -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' \
    2>/dev/null || true)
  pod="old pod"
  if [ -z "$uid" ]; then pod="no pod"; elif [ "$uid" != "$before_uid" ]; then pod="new pod (Ready=${ready:-?})"; fi
  up=$(reclaimed "$before_gens")
  view="owned/live/balanced: ${state:-?}; shardapp-1: $pod, $holders shard(s); reclaimed: $up/$moving"
  if [ "$view" != "$last" ]; then
    info "$(printf '+%3ss  %s' "$((now - began))" "$view")"
    last=$view
  fi
  if [ -z "$failover" ] && [ "${state%% *}" = "$SHARDS" ] && [ "$holders" = 0 ]; then
    failover=$((now - began))
    ok "all $SHARDS shards owned without shardapp-1 after ${failover}s"
    show_owners
  fi
  # Done when every shard of the deleted pod was claimed again (its generation
  # rose) and the new pod is Ready, holds shards, and all is balanced.
  if [ "$up" = "$moving" ] && [ "$uid" != "$before_uid" ] && [ -n "$uid" ] \
      && [ "$ready" = True ] && [ "$state" = "$SHARDS 3 True" ] && [ "$holders" != 0 ]; then
    break
  fi
  [ "$now" -lt "$deadline" ] || die "no failover and rebalance within ${TIMEOUT}s"
  sleep 1
done
recovered=$(( $(date +%s) - began ))
ok "the new shardapp-1 joined: balanced over 3 pods again after ${recovered}s"
show_owners
if [ -n "$failover" ]; then
  note "failover: the deleted pod's shards owned elsewhere after ${failover}s; balanced over 3 again after ${recovered}s"
else
  note "failover: the shards moved and came back between two polls; balanced over 3 again after ${recovered}s"
fi

step "scaling to 5 replicas"
began=$(date +%s)
kn scale statefulset shardapp --replicas=5
kn rollout status statefulset/shardapp --timeout="${TIMEOUT}s"
wait_balanced 5 "scaled to 5"
show_owners
note "scale 3 -> 5: balanced over 5 pods after $(( $(date +%s) - began ))s"

step "scaling to 2 replicas"
began=$(date +%s)
kn scale statefulset shardapp --replicas=2
kn rollout status statefulset/shardapp --timeout="${TIMEOUT}s"
wait_balanced 2 "scaled to 2"
show_owners
note "scale 5 -> 2: balanced over 2 pods after $(( $(date +%s) - began ))s"

step "reading the $KEYS keys back"
client verify 2
note "all $KEYS keys read back with their values after the failover and both rescales"

step "summary"
k get shardsets -A
for line in "${SUMMARY[@]}"; do ok "$line"; done
printf '\n%sshardlease e2e passed in %ss%s\n' "$GREEN" "$(elapsed)" "$OFF"
