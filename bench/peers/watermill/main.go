// watermill-forwarder — the polling forwarder outbox-relay replaces, as a benchmark peer.
//
// It is the house guide's forwarder (seeds/000, section Forwarder) built from the real
// modules: a watermill-sql v4 subscriber polls the seed's `outbox` table, a watermill router
// handler publishes each message with a watermill-kafka v3 publisher (synchronous Sarama
// producer), the middleware sets `partition_key` from `Aggregate-Id`, and the partitioning
// marshaler turns it into the Kafka key. Progress is watermill-sql's own: one row per consumer
// group in `watermill_offsets_outbox`, written once per polled batch after every message of
// the batch was acknowledged by Kafka.
//
// The only adaptation is the schema adapter. The seed's table is DefaultPostgreSQLSchema's
// table with the offset column named `offset_consumed` instead of `"offset"` (and an extra
// `offset_acked` column that nothing here writes): the guide's setup
// (DefaultPostgreSQLSchema{GenerateMessagesTableName: "outbox"}) cannot read it as it is, since
// the default SELECT names `"offset"`. seedSchema keeps the default adapter for everything and
// only renames the column in the SELECT; the query is otherwise the default one (same
// snapshot-xmin gate, same ordering, same batch size), so the polling semantics are unchanged.
//
// For the benchmark it serves /metrics with events_published_total (messages acknowledged by
// Kafka) so the harness can time it like the relay; the topic is
// <topic-prefix>.<Event-Type up to the first '.'>, the relay's {Event-Type:aggregate}.
package main

import (
	"context"
	stdsql "database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	watermillkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	watermillsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// seedSchema is DefaultPostgreSQLSchema with a configurable name for the offset column.
type seedSchema struct {
	watermillsql.DefaultPostgreSQLSchema
	OffsetColumn string
}

// SelectQuery is DefaultPostgreSQLSchema.SelectQuery (watermill-sql v4.1.2) with
// `"offset"` replaced by the configured column. The column is selected first because
// UnmarshalMessage scans it positionally into Row.Offset.
func (s seedSchema) SelectQuery(params watermillsql.SelectQueryParams) (watermillsql.Query, error) {
	next, err := params.OffsetsAdapter.NextOffsetQuery(watermillsql.NextOffsetQueryParams{
		Topic:         params.Topic,
		ConsumerGroup: params.ConsumerGroup,
	})
	if err != nil {
		return watermillsql.Query{}, err
	}
	batch := s.SubscribeBatchSize
	if batch == 0 {
		batch = 100
	}
	col := s.OffsetColumn
	query := `
	SELECT * FROM (
		WITH last_processed AS (
			` + next.Query + `
		)
		SELECT ` + col + `, transaction_id, uuid, payload, metadata FROM ` + s.MessagesTable(params.Topic) + `
		WHERE
		(
			(
				transaction_id = (SELECT last_processed_transaction_id FROM last_processed)
				AND
				` + col + ` > (SELECT offset_acked FROM last_processed)
			)
			OR
			(transaction_id > (SELECT last_processed_transaction_id FROM last_processed))
		)
		AND
			transaction_id < pg_snapshot_xmin(pg_current_snapshot())
	) AS messages
	ORDER BY
		transaction_id ASC,
		` + col + ` ASC
	LIMIT ` + fmt.Sprintf("%d", batch)
	return watermillsql.Query{Query: query, Args: next.Args}, nil
}

// SchemaInitializingQueries: the outbox table comes from the service's migration (the guide
// sets InitializeSchema: false); nothing to create.
func (s seedSchema) SchemaInitializingQueries(watermillsql.SchemaInitializingQueriesParams) ([]watermillsql.Query, error) {
	return nil, nil
}

// topicFor is the relay's {Event-Type:aggregate} template: the part of Event-Type before the
// first '.' ("review.created" and "review.updated" share one topic per aggregate).
func topicFor(prefix string, msg *message.Message) string {
	eventType := msg.Metadata.Get("Event-Type")
	if i := strings.IndexByte(eventType, '.'); i >= 0 {
		eventType = eventType[:i]
	}
	return prefix + "." + eventType
}

func main() {
	var (
		databaseURL   = flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL")
		brokers       = flag.String("kafka-brokers", os.Getenv("KAFKA_BROKERS"), "comma-separated Kafka brokers")
		table         = flag.String("table", "outbox", "outbox table (the seed's shape)")
		offsetColumn  = flag.String("offset-column", "offset_consumed", "the table's offset column")
		subTopic      = flag.String("subscribe-topic", "outbox", "watermill topic (names the offsets table watermill_offsets_<topic>)")
		consumerGroup = flag.String("consumer-group", "outbox-forwarder", "watermill-sql consumer group")
		pollInterval  = flag.Duration("poll-interval", 0, "watermill-sql PollInterval (0: the library's default, 1s)")
		batchSize     = flag.Int("batch-size", 0, "SubscribeBatchSize (0: the library's default, 100)")
		topicPrefix   = flag.String("topic-prefix", "outbox", "Kafka topic = <prefix>.<Event-Type aggregate>")
		saramaVersion = flag.String("sarama-version", "", "override the Kafka protocol version of the publisher's Sarama config (empty: watermill-kafka's default)")
		metricsAddr   = flag.String("metrics-addr", "127.0.0.1:0", "where /metrics listens")
		appName       = flag.String("application-name", "watermill-forwarder", "PostgreSQL application_name of the subscriber's connections")
		verbose       = flag.Bool("debug", false, "watermill debug logs")
	)
	flag.Parse()
	if *databaseURL == "" || *brokers == "" {
		log.Fatal("-database-url and -kafka-brokers (or DATABASE_URL, KAFKA_BROKERS) are required")
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := watermill.NewStdLogger(*verbose, false)

	dsn := *databaseURL
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	dsn += sep + "application_name=" + *appName
	db, err := stdsql.Open("pgx", dsn)
	if err != nil {
		log.Fatalf("open database: %v", err)
	}
	defer db.Close()

	offsets := watermillsql.DefaultPostgreSQLOffsetsAdapter{}
	// The offsets table, as the library creates it (the guide creates it in a migration).
	queries, err := offsets.SchemaInitializingQueries(watermillsql.OffsetsSchemaInitializingQueriesParams{Topic: *subTopic})
	if err != nil {
		log.Fatalf("offsets schema: %v", err)
	}
	for _, q := range queries {
		if _, err := db.ExecContext(ctx, q.Query, q.Args...); err != nil {
			log.Fatalf("create offsets table: %v", err)
		}
	}

	schema := seedSchema{
		DefaultPostgreSQLSchema: watermillsql.DefaultPostgreSQLSchema{
			GenerateMessagesTableName: func(string) string { return *table },
			SubscribeBatchSize:        *batchSize,
		},
		OffsetColumn: *offsetColumn,
	}
	subscriber, err := watermillsql.NewSubscriber(watermillsql.BeginnerFromStdSQL(db), watermillsql.SubscriberConfig{
		SchemaAdapter:    schema,
		OffsetsAdapter:   offsets,
		InitializeSchema: false,
		PollInterval:     *pollInterval,
		ConsumerGroup:    *consumerGroup,
	}, logger)
	if err != nil {
		log.Fatalf("subscriber: %v", err)
	}

	saramaConfig := watermillkafka.DefaultSaramaSyncPublisherConfig()
	if *saramaVersion != "" {
		v, err := sarama.ParseKafkaVersion(*saramaVersion)
		if err != nil {
			log.Fatalf("-sarama-version: %v", err)
		}
		saramaConfig.Version = v
	}
	publisher, err := watermillkafka.NewPublisher(watermillkafka.PublisherConfig{
		Brokers:               strings.Split(*brokers, ","),
		OverwriteSaramaConfig: saramaConfig,
		// The guide's middleware puts Aggregate-Id into partition_key; the partitioning
		// marshaler makes it the record key (Sarama's hash partitioner).
		Marshaler: watermillkafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
			return msg.Metadata.Get("partition_key"), nil
		}),
	}, logger)
	if err != nil {
		log.Fatalf("publisher: %v", err)
	}

	var published atomic.Int64
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatalf("router: %v", err)
	}
	router.AddMiddleware(middleware.Recoverer)
	handler := router.AddConsumerHandler("outbox_forwarder", *subTopic, subscriber, func(msg *message.Message) error {
		if err := publisher.Publish(topicFor(*topicPrefix, msg), msg); err != nil {
			return err
		}
		published.Add(1)
		return nil
	})
	handler.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if id := msg.Metadata.Get("Aggregate-Id"); id != "" {
				msg.Metadata.Set("partition_key", id)
			}
			return h(msg)
		}
	})

	listener, err := net.Listen("tcp", *metricsAddr)
	if err != nil {
		log.Fatalf("metrics listener: %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "# TYPE events_published_total counter\nevents_published_total %d\n", published.Load())
	})
	go func() { _ = http.Serve(listener, mux) }()
	log.Printf("watermill-forwarder: metrics on %s, poll interval %v, consumer group %q",
		listener.Addr(), *pollInterval, *consumerGroup)

	err = router.Run(ctx)
	_ = publisher.Close()
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Fatalf("router: %v", err)
	}
	log.Printf("watermill-forwarder: stopped after %d messages", published.Load())
}
