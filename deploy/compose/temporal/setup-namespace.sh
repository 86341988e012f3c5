#!/bin/sh
# The namespace turnkeep's workers use, and turnkeep's search attributes on it (the names and
# types of turnkeep/workflows/visibility.py; tests/test_deploy.py checks they match). Safe to
# run on every `up`: what exists is left alone. `turnkeep setup` does the same from a turnkeep
# install; this job needs only Temporal's own admin tools.
set -eu

: "${TEMPORAL_ADDRESS:?}" "${TEMPORAL_NAMESPACE:?}"
RETENTION="${NAMESPACE_RETENTION:-168h}"
SEARCH_ATTRIBUTES="TurnkeepAgent=Keyword TurnkeepModel=Keyword TurnkeepStatus=Keyword TurnkeepStopReason=Keyword TurnkeepIterations=Int TurnkeepTokens=Int TurnkeepCostUsd=Double TurnkeepReplayOf=Keyword TurnkeepForkOf=Keyword"

attempt=0
until temporal operator cluster health >/dev/null 2>&1; do
  attempt=$((attempt + 1))
  if [ "$attempt" -ge 60 ]; then
    echo "Temporal at $TEMPORAL_ADDRESS is not healthy; giving up" >&2
    exit 1
  fi
  echo "waiting for Temporal at $TEMPORAL_ADDRESS"
  sleep 2
done

if temporal operator namespace describe --namespace "$TEMPORAL_NAMESPACE" >/dev/null 2>&1; then
  echo "namespace $TEMPORAL_NAMESPACE exists"
else
  temporal operator namespace create --namespace "$TEMPORAL_NAMESPACE" --retention "$RETENTION"
  echo "namespace $TEMPORAL_NAMESPACE created"
fi

# A new namespace takes a moment to reach every frontend; list until it answers.
attempt=0
until existing="$(temporal operator search-attribute list --namespace "$TEMPORAL_NAMESPACE")"; do
  attempt=$((attempt + 1))
  [ "$attempt" -lt 30 ] || exit 1
  sleep 2
done

for pair in $SEARCH_ATTRIBUTES; do
  name="${pair%%=*}"
  kind="${pair#*=}"
  if printf '%s\n' "$existing" | grep -qw "$name"; then
    echo "search attribute $name exists"
  else
    temporal operator search-attribute create --namespace "$TEMPORAL_NAMESPACE" \
      --name "$name" --type "$kind"
    echo "search attribute $name ($kind) registered"
  fi
done
