// compat — outbox-relay against real Watermill code, in one run.
//
// Real watermill-sql publishers write inside database transactions; the
// relay publishes the rows; the real Watermill pipeline publishes the same
// rows in the same run as the reference; a real watermill-kafka subscriber
// (and a raw Sarama consumer, for what the subscriber does not show) reads
// both streams, and every message is compared: UUID, metadata, payload,
// key, partition. Scenarios:
//
//	direct     watermill-sql's own tables (--table-mode=watermill): JSON and
//	           BYTEA payloads, a topic whose table name PostgreSQL cut at 63
//	           bytes, a topic that appears while the relay runs; reference:
//	           watermill-sql subscriber -> watermill-kafka publisher
//	           (DefaultMarshaler). Then the relay's consumer-group position
//	           must reach the last row of every table.
//	forwarder  Watermill's forwarder component: envelopes in one table,
//	           keyed by a metadata field; reference: forwarder.NewForwarder;
//	           a malformed envelope goes to the relay's dead-letter topic.
//	seed       the house outbox table (--table-mode=seed); reference: the
//	           house guide's pipeline (partition_key middleware, the
//	           partitioning marshaler, the topic per aggregate).
//	switch     relay -> polling forwarder -> relay on the same table and
//	           consumer group under concurrent load: nothing lost, no
//	           phantom, duplicates counted.
//
// Prints one line per scenario and a summary; exits 1 on any mismatch,
// loss or phantom.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

func main() {
	var (
		databaseURL = flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL")
		brokers     = flag.String("kafka-brokers", os.Getenv("KAFKA_BROKERS"), "Kafka brokers")
		relayBin    = flag.String("relay-bin", os.Getenv("OUTBOX_RELAY_BIN"), "the outbox-relay binary")
		workDir     = flag.String("work-dir", os.TempDir(), "where the relays' logs go")
		scenarios   = flag.String("scenarios", "direct,forwarder,seed,switch", "which scenarios to run")
		switchSecs  = flag.Int("switch-seconds", 5, "seconds of load in each phase of the switch scenario")
		verbose     = flag.Bool("v", false, "Watermill's logs and more detail")
	)
	flag.Parse()
	if *databaseURL == "" || *brokers == "" || *relayBin == "" {
		fmt.Fprintln(os.Stderr, "compat: -database-url, -kafka-brokers and -relay-bin are required")
		os.Exit(2)
	}
	e, err := openEnv(*databaseURL, *brokers, *relayBin, *workDir, *verbose)
	if err != nil {
		fmt.Fprintf(os.Stderr, "compat: %v\n", err)
		os.Exit(2)
	}
	defer e.close()

	started := time.Now()
	failed := false
	total, keyed := 0, 0
	for _, name := range strings.Split(*scenarios, ",") {
		t0 := time.Now()
		var results []*comparison
		var err error
		switch name {
		case "direct":
			results, err = e.directScenario()
		case "forwarder":
			results, err = e.forwarderScenario()
		case "seed":
			results, err = e.seedScenario()
		case "switch":
			var sw *switchResult
			sw, err = e.switchScenario(time.Duration(*switchSecs) * time.Second)
			if sw != nil {
				fmt.Printf("compat switch: %s (%.1f s)\n", sw, time.Since(t0).Seconds())
				if !sw.ok() {
					failed = true
				}
			}
		default:
			err = fmt.Errorf("unknown scenario %q", name)
		}
		for _, c := range results {
			fmt.Printf("compat %s (%.1f s)\n", c, time.Since(t0).Seconds())
			total += c.compared
			keyed += c.keyed
			if !c.ok() {
				failed = true
			}
		}
		if err != nil {
			fmt.Printf("compat %s: FAILED: %v\n", name, err)
			failed = true
		}
	}
	fmt.Printf("compat: %d messages compared with the Watermill reference (%d keyed), %s, %.1f s\n",
		total, keyed, map[bool]string{true: "FAILED", false: "0 mismatches"}[failed],
		time.Since(started).Seconds())
	if failed {
		os.Exit(1)
	}
}
