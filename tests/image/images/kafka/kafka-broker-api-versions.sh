#!/usr/bin/env bash
# As in the Kafka distribution: the API versions each broker supports (a health check).
exec "$(dirname "$0")/kafka-run-class.sh" org.apache.kafka.tools.BrokerApiVersionsCommand "$@"
