package main

import (
	"context"
	stdsql "database/sql"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	watermillkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	watermillsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

const (
	refPrefix    = "ref-"
	pollInterval = 100 * time.Millisecond
)

// --- the reference pipeline's parts ----------------------------------------------------------

func (e *env) kafkaPublisher(m watermillkafka.Marshaler) (*watermillkafka.Publisher, error) {
	return watermillkafka.NewPublisher(watermillkafka.PublisherConfig{
		Brokers:               e.brokers,
		Marshaler:             m,
		OverwriteSaramaConfig: saramaConfig(watermillkafka.DefaultSaramaSyncPublisherConfig()),
	}, e.logger)
}

func (e *env) sqlSubscriber(schema watermillsql.SchemaAdapter, group string) (*watermillsql.Subscriber, error) {
	return watermillsql.NewSubscriber(watermillsql.BeginnerFromStdSQL(e.db), watermillsql.SubscriberConfig{
		ConsumerGroup:    group,
		SchemaAdapter:    schema,
		OffsetsAdapter:   watermillsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     pollInterval,
	}, e.logger)
}

// prefixed publishes to "<prefix><topic>": the reference's records go next
// to the relay's, not into the same topics.
type prefixed struct {
	message.Publisher
	prefix string
}

func (p prefixed) Publish(topic string, msgs ...*message.Message) error {
	return p.Publisher.Publish(p.prefix+topic, msgs...)
}

// runRouter runs `router` until the returned stop is called.
func runRouter(router *message.Router) (func() error, error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-done:
		cancel()
		return nil, fmt.Errorf("router: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		return nil, errors.New("router did not start")
	}
	return func() error {
		cancel()
		err := <-done
		_ = router.Close()
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}, nil
}

// forwardTopics: the reference for watermill-sql's tables, as a team builds
// it: a watermill-sql subscriber per topic, a router handler publishing each
// message with a watermill-kafka publisher.
func (e *env) forwardTopics(schemas map[string]watermillsql.SchemaAdapter, group string,
	pub message.Publisher) (func() error, error) {
	router, err := message.NewRouter(message.RouterConfig{}, e.logger)
	if err != nil {
		return nil, err
	}
	for topic, schema := range schemas {
		sub, err := e.sqlSubscriber(schema, group)
		if err != nil {
			return nil, err
		}
		t := topic
		router.AddConsumerHandler("forward_"+t, t, sub, func(msg *message.Message) error {
			return pub.Publish(t, msg)
		})
	}
	return runRouter(router)
}

// --- waiting for both streams ----------------------------------------------------------------

// collect waits until every committed message is in both streams (read raw)
// and in the subscribers' hands, then returns what they hold.
func (e *env) collect(l *ledger, relayTopics []string, refTopic func(string) string,
	sub *subscribed, timeout time.Duration) (relay, ref []record, relaySub, refSub []*message.Message, err error) {
	refTopics := make([]string, len(relayTopics))
	for i, t := range relayTopics {
		refTopics[i] = refTopic(t)
	}
	want := l.size()
	deadline := time.Now().Add(timeout)
	for {
		relay, err = e.readRaw(relayTopics...)
		if err == nil {
			ref, err = e.readRaw(refTopics...)
		}
		if err != nil {
			return
		}
		a, _ := indexRecords(relay)
		b, _ := indexRecords(ref)
		have := 0
		for id := range l.committed {
			_, x := a[id]
			_, y := b[id]
			if x && y {
				have++
			}
		}
		if have == want && sub.count(relayTopics...) >= len(relay) && sub.count(refTopics...) >= len(ref) {
			break
		}
		if time.Now().After(deadline) {
			logf("waited %v: %d of %d messages in both streams; subscribers have %d and %d of %d and %d records",
				timeout, have, want, sub.count(relayTopics...), sub.count(refTopics...), len(relay), len(ref))
			break
		}
		time.Sleep(time.Second)
	}
	for _, t := range relayTopics {
		relaySub = append(relaySub, sub.take(t)...)
	}
	for _, t := range refTopics {
		refSub = append(refSub, sub.take(t)...)
	}
	return
}

// rawRow inserts one row by hand (what a JavaScript writer or a psql session
// may leave), and returns the message it stands for in the ledger.
func (e *env) rawRow(ctx context.Context, table, uuid string, payload, metadata *string, id string, l *ledger) error {
	err := e.exec(ctx, fmt.Sprintf(`INSERT INTO %s (uuid, payload, metadata, transaction_id)
		VALUES ($1, $2, $3::json, pg_current_xact_id())`, table), uuid, payload, metadata)
	if err != nil {
		return err
	}
	msg := message.NewMessage(uuid, nil)
	if id != "" {
		msg.Metadata = message.Metadata{idKey: id}
	}
	l.add([]*message.Message{msg}, true)
	return nil
}

func strp(s string) *string { return &s }

// --- direct: watermill-sql's own tables -------------------------------------------------------

func (e *env) directScenario() ([]*comparison, error) {
	ctx := context.Background()
	c := &comparison{name: "direct (watermill-sql tables, DefaultMarshaler)"}
	prefix := e.run + "_d_"
	orders := prefix + "orders"
	blobs := prefix + "blobs"
	// A topic whose table name PostgreSQL cuts at 63 bytes.
	long := prefix + strings.Repeat("long_topic_name_", 4)
	jsonSchema := watermillsql.DefaultPostgreSQLSchema{}
	byteaSchema := watermillsql.DefaultPostgreSQLSchema{GeneratePayloadType: func(string) string { return "BYTEA" }}
	longTable := jsonSchema.MessagesTable(long) // quoted, as watermill-sql uses it
	truncated := strings.Trim(longTable, `"`)[:63]
	slot, publication := e.run+"_d", e.run+"_d"
	e.onCleanup(fmt.Sprintf("SELECT pg_drop_replication_slot('%s') FROM pg_replication_slots WHERE slot_name = '%s'", slot, slot))
	e.onCleanup("DROP PUBLICATION IF EXISTS " + publication)
	for _, t := range []string{orders, blobs, long} {
		e.onCleanup(fmt.Sprintf(`DROP TABLE IF EXISTS "%s", "%s"`, trunc63("watermill_"+t), trunc63("watermill_offsets_"+t)))
	}
	topics := []string{orders, blobs, long}
	if err := e.createTopics(append(topics, refPrefix+orders, refPrefix+blobs, refPrefix+long, e.run+"-dlq-d")...); err != nil {
		return nil, err
	}
	all := append(append([]string{}, topics...), refPrefix+orders, refPrefix+blobs, refPrefix+long)
	sub, err := e.subscribe(all...)
	if err != nil {
		return nil, err
	}
	defer sub.close()

	// Tables for two topics, as watermill-sql creates them.
	for _, t := range []string{orders, long} {
		qs, _ := jsonSchema.SchemaInitializingQueries(watermillsql.SchemaInitializingQueriesParams{Topic: t})
		for _, q := range qs {
			if err := e.exec(ctx, q.Query); err != nil {
				return nil, err
			}
		}
	}
	l := newLedger()
	i := 0
	write := func(topic string, schema watermillsql.SchemaAdapter, kind payloadKind, n int, commit bool) error {
		msgs := make([]*message.Message, n)
		for k := range msgs {
			msgs[k] = awkwardMessage("d", i, kind, true)
			i++
		}
		return publishTx(ctx, e.db, sqlPublisherOn(schema), topic, msgs, commit, l)
	}
	// Rows committed before the relay's first start: its backfill.
	for k := 0; k < 8; k++ {
		if err := write(orders, jsonSchema, jsonPayload, 1+k%4, true); err != nil {
			return nil, err
		}
		if err := write(long, jsonSchema, jsonPayload, 1+k%3, k != 5); err != nil {
			return nil, err
		}
	}

	refPub, err := e.kafkaPublisher(watermillkafka.DefaultMarshaler{})
	if err != nil {
		return nil, err
	}
	defer refPub.Close()
	stopRef, err := e.forwardTopics(map[string]watermillsql.SchemaAdapter{orders: jsonSchema, long: jsonSchema},
		"reference", prefixed{refPub, refPrefix})
	if err != nil {
		return nil, err
	}
	relay, err := e.startRelay("direct",
		"--table-mode", "watermill",
		"--watermill-table-pattern", "public.watermill_"+prefix+"*",
		"--watermill-topic-map", "public."+truncated+"="+long,
		"--watermill-consumer-group", "relay",
		"--watermill-discover-interval-s", "1",
		"--publication", publication, "--slot", slot, "--dlq-topic", e.run+"-dlq-d")
	if err != nil {
		return nil, err
	}
	defer relay.kill()
	if err := relay.waitLog("streaming from slot", 90*time.Second); err != nil {
		return nil, err
	}
	// While it streams.
	for k := 0; k < 10; k++ {
		if err := write(orders, jsonSchema, jsonPayload, 1+k%5, k%4 != 3); err != nil {
			return nil, err
		}
		if err := write(long, jsonSchema, jsonPayload, 2, true); err != nil {
			return nil, err
		}
	}
	// A topic appears: its first message creates its table (AutoInitializeSchema,
	// outside a transaction, as an application does), then transactions follow.
	first := []*message.Message{awkwardMessage("d", i, byteaPayload, true)}
	i++
	autoPub, err := watermillsql.NewPublisher(watermillsql.BeginnerFromStdSQL(e.db),
		watermillsql.PublisherConfig{SchemaAdapter: byteaSchema, AutoInitializeSchema: true}, nil)
	if err != nil {
		return nil, err
	}
	if err := autoPub.Publish(blobs, first...); err != nil {
		return nil, err
	}
	l.add(first, true)
	for k := 0; k < 10; k++ {
		if err := write(blobs, byteaSchema, byteaPayload, 1+k%3, k != 7); err != nil {
			return nil, err
		}
	}
	stopBlobs, err := e.forwardTopics(map[string]watermillsql.SchemaAdapter{blobs: byteaSchema},
		"reference", prefixed{refPub, refPrefix})
	if err != nil {
		return nil, err
	}
	// Rows no Go writer makes: unpaired surrogates (JSON.stringify writes
	// them; Go decodes them as U+FFFD), SQL NULL and JSON null metadata.
	ordersTable := jsonSchema.MessagesTable(orders)
	for _, r := range []struct {
		uuid, id string
		payload  *string
		metadata *string
	}{
		{watermill.NewUUID(), "d-raw-1", strp(`{"k":1}`), strp(`{"cmp_id":"d-raw-1","note":"a\ud83db"}`)},
		{watermill.NewUUID(), "d-raw-2", nil, strp(`{"cmp_id":"d-raw-2","x":"\ude00\ud83d","y":"\ud83d\u0041"}`)},
		{watermill.NewUUID(), "", strp(`{"k":3}`), nil},
		{watermill.NewUUID(), "", strp(`{"k":4}`), strp(`null`)},
		{watermill.NewUUID(), "d-raw-5", strp(`{"k":5}`), strp(`{"cmp_id":"d-raw-5","dup":"1","dup":"2","n":null}`)},
	} {
		if err := e.rawRow(ctx, ordersTable, r.uuid, r.payload, r.metadata, r.id, l); err != nil {
			return nil, err
		}
	}
	relayRecs, refRecs, relaySub, refSub, err := e.collect(l, topics,
		func(t string) string { return refPrefix + t }, sub, 120*time.Second)
	if err != nil {
		return nil, err
	}
	compareStreams(c, l, relayRecs, refRecs, relaySub, refSub, func(t string) string { return refPrefix + t })

	// The relay's consumer-group position reaches the last row of each table
	// (once nothing is in flight, Watermill's rule lets it cover everything).
	for _, t := range []string{orders, blobs, long} {
		table := jsonSchema.MessagesTable(t)
		offsets := `"` + trunc63("watermill_offsets_"+t) + `"`
		ok := waitFor(30*time.Second, func() bool {
			var match bool
			err := e.db.QueryRowContext(ctx, fmt.Sprintf(`SELECT COALESCE((SELECT (o.last_processed_transaction_id, o.offset_acked)
				= (m.transaction_id, m."offset") FROM %s o, (SELECT transaction_id, "offset" FROM %s
				ORDER BY transaction_id DESC, "offset" DESC LIMIT 1) m WHERE o.consumer_group = 'relay'), false)`,
				offsets, table)).Scan(&match)
			return err == nil && match
		})
		if !ok {
			c.fail("consumer group 'relay' in %s did not reach the last row of %s", offsets, table)
		}
	}
	_ = stopBlobs()
	_ = stopRef()
	if err := relay.stop(); err != nil {
		return []*comparison{c}, err
	}
	return []*comparison{c}, nil
}

func trunc63(s string) string {
	if len(s) > 63 {
		return s[:63]
	}
	return s
}

// --- forwarder: Watermill's forwarder component ------------------------------------------------

func (e *env) forwarderScenario() ([]*comparison, error) {
	ctx := context.Background()
	c := &comparison{name: "forwarder (envelopes, partitioning marshaler on aggregate_id)"}
	fwdTopic := e.run + "_f_fwd"
	dest := []string{e.run + ".f.orders", e.run + ".f.users"}
	dlq := e.run + "-dlq-f"
	schema := watermillsql.DefaultPostgreSQLSchema{}
	table := schema.MessagesTable(fwdTopic)
	slot, publication := e.run+"_f", e.run+"_f"
	e.onCleanup(fmt.Sprintf("SELECT pg_drop_replication_slot('%s') FROM pg_replication_slots WHERE slot_name = '%s'", slot, slot))
	e.onCleanup("DROP PUBLICATION IF EXISTS " + publication)
	e.onCleanup(fmt.Sprintf(`DROP TABLE IF EXISTS %s, "watermill_offsets_%s"`, table, fwdTopic))
	if err := e.createTopics(dest[0], dest[1], refPrefix+dest[0], refPrefix+dest[1], dlq); err != nil {
		return nil, err
	}
	sub, err := e.subscribe(dest[0], dest[1], refPrefix+dest[0], refPrefix+dest[1])
	if err != nil {
		return nil, err
	}
	defer sub.close()
	qs, _ := schema.SchemaInitializingQueries(watermillsql.SchemaInitializingQueriesParams{Topic: fwdTopic})
	for _, q := range qs {
		if err := e.exec(ctx, q.Query); err != nil {
			return nil, err
		}
	}
	l := newLedger()
	i := 0
	envelopes := func(tx *stdsql.Tx) (message.Publisher, error) {
		p, err := sqlPublisherOn(schema)(tx)
		if err != nil {
			return nil, err
		}
		return forwarder.NewPublisher(p, forwarder.PublisherConfig{ForwarderTopic: fwdTopic}), nil
	}
	write := func(n int, commit bool) error {
		// One destination per Publish call (the forwarder publisher's API).
		for _, d := range dest {
			msgs := make([]*message.Message, n)
			for k := range msgs {
				msgs[k] = awkwardMessage("f", i, jsonPayload, true)
				if i%3 == 0 {
					msgs[k].Payload = []byte{0x00, 0xff, byte(i)} // any bytes: base64 in the envelope
				}
				i++
			}
			if err := publishTx(ctx, e.db, envelopes, d, msgs, commit, l); err != nil {
				return err
			}
		}
		return nil
	}
	for k := 0; k < 6; k++ {
		if err := write(1+k%3, k != 4); err != nil {
			return nil, err
		}
	}

	keyed := watermillkafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return msg.Metadata.Get("aggregate_id"), nil
	})
	refPub, err := e.kafkaPublisher(keyed)
	if err != nil {
		return nil, err
	}
	defer refPub.Close()
	sqlSub, err := e.sqlSubscriber(schema, "reference")
	if err != nil {
		return nil, err
	}
	fwd, err := forwarder.NewForwarder(sqlSub, prefixed{refPub, refPrefix}, e.logger, forwarder.Config{
		ForwarderTopic: fwdTopic,
		// The malformed envelope below would otherwise hold it back for ever.
		AckWhenCannotUnwrap: true,
	})
	if err != nil {
		return nil, err
	}
	fwdCtx, cancelFwd := context.WithCancel(context.Background())
	fwdDone := make(chan struct{})
	go func() { _ = fwd.Run(fwdCtx); close(fwdDone) }()
	defer func() { cancelFwd(); _ = fwd.Close(); <-fwdDone }()

	relay, err := e.startRelay("forwarder",
		"--table-mode", "watermill",
		"--watermill-forwarder-tables", "public."+strings.Trim(table, `"`),
		"--watermill-key-field", "aggregate_id",
		"--watermill-consumer-group", "relay",
		"--publication", publication, "--slot", slot, "--dlq-topic", dlq)
	if err != nil {
		return nil, err
	}
	defer relay.kill()
	if err := relay.waitLog("streaming from slot", 90*time.Second); err != nil {
		return nil, err
	}
	for k := 0; k < 10; k++ {
		if err := write(1+k%4, k%5 != 2); err != nil {
			return nil, err
		}
	}
	// A malformed envelope, and one with unpaired surrogates.
	if err := e.exec(ctx, fmt.Sprintf(`INSERT INTO %s (uuid, payload, metadata, transaction_id)
		VALUES ('bad-envelope', '{"order_id":42}', '{}', pg_current_xact_id())`, table)); err != nil {
		return nil, err
	}
	env := fmt.Sprintf(`{"destination_topic":%q,"uuid":"raw-a\ud83db","payload":"eyJrIjoxfQ==",`+
		`"metadata":{"cmp_id":"f-raw-1","s":"\udc00","aggregate_id":"agg-raw"}}`, dest[0])
	if err := e.rawRow(ctx, table, watermill.NewUUID(), &env, strp(`{}`), "f-raw-1", l); err != nil {
		return nil, err
	}

	relayRecs, refRecs, relaySub, refSub, err := e.collect(l, dest,
		func(t string) string { return refPrefix + t }, sub, 120*time.Second)
	if err != nil {
		return nil, err
	}
	compareStreams(c, l, relayRecs, refRecs, relaySub, refSub, func(t string) string { return refPrefix + t })
	dead, err := e.readRaw(dlq)
	if err != nil {
		return nil, err
	}
	found := false
	for _, r := range dead {
		for _, h := range r.headers {
			if h[0] == "outbox_dlq_reason" && strings.Contains(h[1], "destination_topic") {
				found = true
			}
		}
	}
	if !found || len(dead) != 1 {
		c.fail("dead-letter topic %s: %d records, the malformed envelope among them: %v", dlq, len(dead), found)
	}
	if err := relay.stop(); err != nil {
		return []*comparison{c}, err
	}
	return []*comparison{c}, nil
}

// --- seed: the house outbox table --------------------------------------------------------------

// seedSchema reads the seed's table (offset column offset_consumed) with
// DefaultPostgreSQLSchema's own query otherwise, as the house pipeline must.
type seedSchema struct {
	watermillsql.DefaultPostgreSQLSchema
}

func (s seedSchema) SelectQuery(params watermillsql.SelectQueryParams) (watermillsql.Query, error) {
	q, err := s.DefaultPostgreSQLSchema.SelectQuery(params)
	if err != nil {
		return q, err
	}
	q.Query = strings.ReplaceAll(q.Query, `"offset"`, "offset_consumed")
	return q, nil
}

func (s seedSchema) SchemaInitializingQueries(watermillsql.SchemaInitializingQueriesParams) ([]watermillsql.Query, error) {
	return nil, nil
}

func (e *env) seedScenario() ([]*comparison, error) {
	ctx := context.Background()
	c := &comparison{name: "seed (house outbox table, partition_key, Sarama hash partitioner)"}
	table := e.run + "_s_outbox"
	subTopic := e.run + "_s"
	slot, publication := e.run+"_s", e.run+"_s"
	topicPrefix := e.run + ".s"
	topics := []string{topicPrefix + ".review", topicPrefix + ".user"}
	dlq := e.run + "-dlq-s"
	e.onCleanup(fmt.Sprintf("SELECT pg_drop_replication_slot('%s') FROM pg_replication_slots WHERE slot_name = '%s'", slot, slot))
	e.onCleanup("DROP PUBLICATION IF EXISTS " + publication)
	e.onCleanup(fmt.Sprintf(`DROP TABLE IF EXISTS %s, "watermill_offsets_%s"`, table, subTopic))
	if err := e.exec(ctx, fmt.Sprintf(`CREATE TABLE %s (
		offset_acked BIGINT, offset_consumed BIGSERIAL NOT NULL, uuid VARCHAR(36) NOT NULL,
		created_at TIMESTAMPTZ NOT NULL DEFAULT NOW(), payload JSON, metadata JSON,
		transaction_id xid8 NOT NULL DEFAULT pg_current_xact_id(),
		PRIMARY KEY (transaction_id, offset_consumed))`, table)); err != nil {
		return nil, err
	}
	if err := e.createTopics(topics[0], topics[1], refPrefix+topics[0], refPrefix+topics[1], dlq); err != nil {
		return nil, err
	}
	sub, err := e.subscribe(topics[0], topics[1], refPrefix+topics[0], refPrefix+topics[1])
	if err != nil {
		return nil, err
	}
	defer sub.close()
	schema := watermillsql.DefaultPostgreSQLSchema{GenerateMessagesTableName: func(string) string { return table }}
	l := newLedger()
	i := 0
	events := []string{"review.created", "review.updated", "user.registered"}
	write := func(n int, commit bool) error {
		msgs := make([]*message.Message, n)
		for k := range msgs {
			m := awkwardMessage("s", i, jsonPayload, false)
			if m.Metadata == nil || m.Metadata.Get(idKey) == "" {
				m.Metadata = message.Metadata{idKey: fmt.Sprintf("s-%d", i)}
			}
			m.Metadata.Set("Event-Type", events[i%len(events)])
			m.Metadata.Set("Source-Service", "review")
			m.Metadata.Set("Schema-Version", "1")
			switch i % 6 {
			case 0, 1, 2:
				m.Metadata.Set("Aggregate-Id", fmt.Sprintf("r-%d", i%11))
			case 3:
				m.Metadata.Set("Aggregate-Id", "") // empty: the empty key
			case 4:
				m.Metadata.Set("partition_key", fmt.Sprintf("pk-%d", i%4)) // no Aggregate-Id
			}
			msgs[k] = m
			i++
		}
		return publishTx(ctx, e.db, sqlPublisherOn(schema), subTopic, msgs, commit, l)
	}
	for k := 0; k < 6; k++ {
		if err := write(1+k%3, k != 2); err != nil {
			return nil, err
		}
	}
	keyed := watermillkafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return msg.Metadata.Get("partition_key"), nil
	})
	refPub, err := e.kafkaPublisher(keyed)
	if err != nil {
		return nil, err
	}
	defer refPub.Close()
	router, err := message.NewRouter(message.RouterConfig{}, e.logger)
	if err != nil {
		return nil, err
	}
	sqlSub, err := e.sqlSubscriber(seedSchema{schema}, "reference")
	if err != nil {
		return nil, err
	}
	handler := router.AddConsumerHandler("seed_forwarder", subTopic, sqlSub, func(msg *message.Message) error {
		aggregate := msg.Metadata.Get("Event-Type")
		if k := strings.IndexByte(aggregate, '.'); k >= 0 {
			aggregate = aggregate[:k]
		}
		return refPub.Publish(refPrefix+topicPrefix+"."+aggregate, msg)
	})
	handler.AddMiddleware(middleware.Recoverer, func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if id := msg.Metadata.Get("Aggregate-Id"); id != "" {
				msg.Metadata.Set("partition_key", id)
			}
			return h(msg)
		}
	})
	stopRef, err := runRouter(router)
	if err != nil {
		return nil, err
	}
	defer func() { _ = stopRef() }()

	relay, err := e.startRelay("seed",
		"--table", "public."+table,
		"--topic-template", topicPrefix+".{Event-Type:aggregate}",
		"--publication", publication, "--slot", slot, "--dlq-topic", dlq)
	if err != nil {
		return nil, err
	}
	defer relay.kill()
	if err := relay.waitLog("streaming from slot", 90*time.Second); err != nil {
		return nil, err
	}
	for k := 0; k < 12; k++ {
		if err := write(1+k%4, k%5 != 1); err != nil {
			return nil, err
		}
	}
	for _, r := range []struct{ id, metadata string }{
		{"s-raw-1", `{"cmp_id":"s-raw-1","Event-Type":"review.created","Source-Service":"review","Aggregate-Id":"r-\ud83d","note":"a\ud83db"}`},
		{"s-raw-2", `{"cmp_id":"s-raw-2","Event-Type":"user.registered","Source-Service":"review","x":"\ude00"}`},
	} {
		if err := e.rawRow(ctx, table, watermill.NewUUID(), strp(`{"raw":true}`), &r.metadata, r.id, l); err != nil {
			return nil, err
		}
	}
	relayRecs, refRecs, relaySub, refSub, err := e.collect(l, topics,
		func(t string) string { return refPrefix + t }, sub, 120*time.Second)
	if err != nil {
		return nil, err
	}
	compareStreams(c, l, relayRecs, refRecs, relaySub, refSub, func(t string) string { return refPrefix + t })
	if err := relay.stop(); err != nil {
		return []*comparison{c}, err
	}
	return []*comparison{c}, nil
}

// --- switch: relay -> polling forwarder -> relay under load ------------------------------------

type switchResult struct {
	committed  int
	rolledBack int
	delivered  int // distinct messages in the topic
	lost       int
	phantoms   int
	duplicates int
	// Within each partition, one writer's messages in the order it committed
	// them (a writer commits one transaction at a time), among the messages
	// delivered once.
	orderViolations int
	byPhase         [3]int // committed during each phase
	skipped         string // the relay's count of rows the poller had published
	problems        []string
	relayPhases     [2]string
}

func (s *switchResult) ok() bool {
	return s.lost == 0 && s.phantoms == 0 && s.orderViolations == 0 && len(s.problems) == 0
}

func (s *switchResult) String() string {
	out := fmt.Sprintf("relay -> polling forwarder -> relay under load: %d messages committed "+
		"(%d / %d / %d in the three phases), %d rolled back; %d delivered, %d lost, %d phantoms, "+
		"%d order violations, %d duplicates", s.committed, s.byPhase[0], s.byPhase[1], s.byPhase[2],
		s.rolledBack, s.delivered, s.lost, s.phantoms, s.orderViolations, s.duplicates)
	for _, p := range s.problems {
		out += "\n    " + p
	}
	return out
}

func (e *env) switchScenario(phase time.Duration) (*switchResult, error) {
	ctx := context.Background()
	res := &switchResult{}
	topic := e.run + "_sw"
	schema := watermillsql.DefaultPostgreSQLSchema{}
	table := schema.MessagesTable(topic)
	slot, publication, group := e.run+"_sw", e.run+"_sw", "switch"
	e.onCleanup(fmt.Sprintf("SELECT pg_drop_replication_slot('%s') FROM pg_replication_slots WHERE slot_name = '%s'", slot, slot))
	e.onCleanup("DROP PUBLICATION IF EXISTS " + publication)
	e.onCleanup(fmt.Sprintf(`DROP TABLE IF EXISTS %s, "watermill_offsets_%s"`, table, topic))
	if err := e.createTopics(topic, e.run+"-dlq-sw"); err != nil {
		return nil, err
	}
	qs, _ := schema.SchemaInitializingQueries(watermillsql.SchemaInitializingQueriesParams{Topic: topic})
	for _, q := range qs {
		if err := e.exec(ctx, q.Query); err != nil {
			return nil, err
		}
	}

	// Writers: concurrent transactions of 1-5 messages that stay open a few
	// milliseconds, so xid order and commit order differ; one in ten rolls back.
	l := newLedger()
	var phaseNow atomic.Int32
	var perPhase [3]atomic.Int64
	stopWriters := make(chan struct{})
	var writers sync.WaitGroup
	var writeErr atomic.Value
	var seq atomic.Int64
	for w := 0; w < 4; w++ {
		writers.Add(1)
		go func(w int) {
			defer writers.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			for {
				select {
				case <-stopWriters:
					return
				default:
				}
				n := 1 + rng.Intn(5)
				msgs := make([]*message.Message, n)
				for k := range msgs {
					id := seq.Add(1)
					m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"w":%d,"n":%d}`, w, id)))
					m.Metadata.Set(idKey, fmt.Sprintf("sw-%d", id))
					m.Metadata.Set("writer", fmt.Sprint(w))
					msgs[k] = m
				}
				commit := rng.Intn(10) != 0
				publisher := func(tx *stdsql.Tx) (message.Publisher, error) {
					p, err := sqlPublisherOn(schema)(tx)
					if err != nil {
						return nil, err
					}
					time.Sleep(time.Duration(rng.Intn(4)) * time.Millisecond)
					return p, nil
				}
				if err := publishTx(ctx, e.db, publisher, topic, msgs, commit, l); err != nil {
					writeErr.Store(err)
					return
				}
				if commit {
					perPhase[phaseNow.Load()].Add(int64(n))
				}
				time.Sleep(time.Duration(rng.Intn(3)) * time.Millisecond)
			}
		}(w)
	}
	defer func() {
		select {
		case <-stopWriters:
		default:
			close(stopWriters)
		}
		writers.Wait()
	}()

	relayArgs := []string{"--table-mode", "watermill", "--watermill-tables", "public." + strings.Trim(table, `"`),
		"--watermill-consumer-group", group, "--publication", publication, "--slot", slot,
		"--dlq-topic", e.run + "-dlq-sw"}
	// Phase 1: the relay.
	relay, err := e.startRelay("switch-1", relayArgs...)
	if err != nil {
		return nil, err
	}
	if err := relay.waitLog("streaming from slot", 90*time.Second); err != nil {
		relay.kill()
		return nil, err
	}
	time.Sleep(phase)
	if err := relay.stop(); err != nil {
		return nil, err
	}
	// Phase 2: the polling forwarder, same consumer group, same topic.
	phaseNow.Store(1)
	pub, err := e.kafkaPublisher(watermillkafka.DefaultMarshaler{})
	if err != nil {
		return nil, err
	}
	stopPoller, err := e.forwardTopics(map[string]watermillsql.SchemaAdapter{topic: schema}, group, pub)
	if err != nil {
		return nil, err
	}
	time.Sleep(phase)
	if err := stopPoller(); err != nil {
		return nil, fmt.Errorf("polling forwarder: %w", err)
	}
	_ = pub.Close()
	// Phase 3: the relay again, on the slot it left.
	phaseNow.Store(2)
	relay, err = e.startRelay("switch-3", relayArgs...)
	if err != nil {
		return nil, err
	}
	defer relay.kill()
	if err := relay.waitLog("streaming from slot", 90*time.Second); err != nil {
		return nil, err
	}
	time.Sleep(phase)
	close(stopWriters)
	writers.Wait()
	if err, ok := writeErr.Load().(error); ok && err != nil {
		return nil, fmt.Errorf("writer: %w", err)
	}
	for k := range perPhase {
		res.byPhase[k] = int(perPhase[k].Load())
	}
	res.committed = l.size()
	res.rolledBack = len(l.rolledBack)
	// Everything arrives.
	var recs []record
	waitFor(120*time.Second, func() bool {
		recs, err = e.readRaw(topic)
		if err != nil {
			return false
		}
		seen, _ := indexRecords(recs)
		for id := range l.committed {
			if _, ok := seen[id]; !ok {
				return false
			}
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	count := map[string]int{}
	for _, r := range recs {
		count[recordIdentity(r)]++
	}
	// Order, among the messages delivered once (a duplicate's copies may lie
	// in other partitions, since null keys spread at random, so which copy
	// came first cannot be told; duplicates are counted on their own).
	type lane struct {
		partition int32
		writer    string
	}
	last := map[lane]int64{}
	for _, r := range recs {
		id := recordIdentity(r)
		var seqNo int64
		if count[id] != 1 {
			continue
		}
		if _, err := fmt.Sscanf(id, "sw-%d", &seqNo); err != nil {
			continue
		}
		writer := ""
		for _, h := range r.headers {
			if h[0] == "writer" {
				writer = h[1]
			}
		}
		k := lane{r.partition, writer}
		if prev, ok := last[k]; ok && seqNo < prev {
			res.orderViolations++
			if res.orderViolations <= 5 {
				res.problems = append(res.problems, fmt.Sprintf("order: %s after sw-%d in partition %d", id, prev, r.partition))
			}
			continue
		}
		last[k] = seqNo
	}
	for id := range l.committed {
		if count[id] == 0 {
			res.lost++
			if res.lost <= 5 {
				res.problems = append(res.problems, "lost: "+id)
			}
		}
	}
	for id, n := range count {
		if l.rolledBack[id] {
			res.phantoms++
		}
		if n > 1 {
			res.duplicates += n - 1
		}
		if _, ok := l.committed[id]; ok {
			res.delivered++
		}
	}
	if err := relay.stop(); err != nil {
		return res, err
	}
	return res, nil
}
