#!/usr/bin/env bash
# kafka-run-class.sh CLASS ARGS...: a Kafka class on the image's jars (tools log warnings only).
set -euo pipefail
exec java ${KAFKA_TOOL_HEAP_OPTS:--Xmx128m} -XX:TieredStopAtLevel=1 -Xshare:auto \
  -Dlog4j2.level=WARN -cp '/opt/kafka/libs/*' "$@"
