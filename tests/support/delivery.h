// Delivery checked as sets (DESIGN §8): what was committed against what Kafka holds.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "support/kafka.h"
#include "support/workload.h"

namespace outbox_test {

struct DeliveryReport {
  size_t committed = 0;              // rows committed by the writers
  size_t consumed = 0;               // records read from Kafka
  size_t lost = 0;                   // committed, never consumed
  size_t phantom = 0;                // consumed, never committed (incl. rolled back, unknown uuids)
  size_t phantom_rolled_back = 0;    // ... of which rows of rolled-back transactions/savepoints
  size_t duplicates = 0;             // extra copies of committed rows
  size_t order_violations = 0;       // per aggregate, first occurrences not increasing in seq
  size_t split_aggregates = 0;       // aggregates found in more than one topic/partition
  std::vector<std::string> samples;  // the first problems, for the failure message

  // "delivery: committed=10000 consumed=10012 lost=0 phantom=0 duplicates=12 order_violations=0
  //  split_aggregates=0"
  std::string Summary() const;
  std::string Samples() const;
};

// `records` must be in (topic, partition, offset) order, as KafkaReader::Read returns them.
DeliveryReport CheckDelivery(const std::vector<WrittenRow>& committed,
                             const std::vector<WrittenRow>& rolled_back,
                             const std::vector<KafkaRecord>& records);

struct ContractReport {
  size_t checked = 0;          // consumed records of committed rows that were compared
  size_t mismatches = 0;       // records whose topic/key/value/headers differ from the contract
  size_t wrong_partition = 0;  // keyed records not in Sarama's FNV-1a partition
  std::vector<std::string> samples;

  std::string Summary() const;
  std::string Samples() const;
};

// Compares every record of a committed row with the record the contract
// says it must be, byte for byte, and its partition with Sarama's rule.
// `partitions` = partition count per topic.
ContractReport CheckContract(const std::vector<WrittenRow>& committed,
                             const std::vector<KafkaRecord>& records,
                             const std::map<std::string, int>& partitions);

// Printable form of bytes: escapes non-printable ASCII, keeps UTF-8.
std::string Printable(const std::optional<std::string>& bytes);

}  // namespace outbox_test
