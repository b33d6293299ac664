package outboxrelay.bench;

import com.sun.net.httpserver.HttpServer;
import io.debezium.embedded.ClientProvided;
import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.Header;
import io.debezium.engine.format.KeyValueHeaderChangeEventFormat;
import io.debezium.engine.format.SimpleString;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Debezium embedded (PostgreSQL connector, pgoutput) with its outbox event router, producing to
 * Kafka: the CDC peer of the outbox-relay benchmark.
 *
 * <p>The engine converts each routed record with Kafka Connect's StringConverter (key, value) and
 * SimpleHeaderConverter (headers), as a Connect worker configured for the outbox router does; the
 * change consumer produces every record of a batch, waits until Kafka acknowledged all of them
 * (acks=all, idempotent producer), and only then marks them processed, so offsets (and with them
 * the slot's confirmed LSN, which the connector flushes on each offset commit) never run ahead
 * of Kafka. This is the shape of Debezium Server's Kafka sink.
 *
 * <p>The seed's table is not the router's default table: its event id is {@code uuid}, its
 * payload {@code payload}, and it has no aggregate columns (aggregate type and id live inside the
 * {@code metadata} JSON, which the router cannot read). So the event key is the {@code uuid}
 * column, every event goes to one topic ({@code --topic}: the route field is {@code uuid} and the
 * replacement has no {@code ${routedByValue}}), and {@code metadata} travels as one header with
 * the JSON text. The router adds the event id as header {@code id}.
 *
 * <p>For the harness it serves {@code /metrics} with {@code events_published_total} (records
 * acknowledged by Kafka).
 */
public final class DebeziumPeer {
  private static final AtomicLong published = new AtomicLong();

  private DebeziumPeer() {}

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = parseArgs(argv);
    String databaseUrl = args.getOrDefault("database-url", System.getenv("DATABASE_URL"));
    String brokers = args.getOrDefault("kafka-brokers", System.getenv("KAFKA_BROKERS"));
    if (databaseUrl == null || brokers == null) {
      throw new IllegalArgumentException("--database-url and --kafka-brokers are required");
    }
    String slot = args.getOrDefault("slot", "debezium");
    String publication = args.getOrDefault("publication", "debezium_outbox");
    String topic = args.getOrDefault("topic", "outbox.event.review");
    String table = args.getOrDefault("table", "public.outbox");
    String metricsAddr = args.getOrDefault("metrics-addr", "127.0.0.1:0");

    Path offsets = Files.createTempFile("debezium-peer-offsets-", ".dat");
    offsets.toFile().deleteOnExit();

    URI db = URI.create(databaseUrl.replaceFirst("^postgres(ql)?://", "postgresql://"));
    String userInfo = db.getUserInfo() == null ? "postgres" : db.getUserInfo();
    String user = userInfo.contains(":") ? userInfo.substring(0, userInfo.indexOf(':')) : userInfo;
    String password = userInfo.contains(":") ? userInfo.substring(userInfo.indexOf(':') + 1) : "";

    Properties props = new Properties();
    props.setProperty("name", "outbox-bench-debezium");
    props.setProperty("connector.class", "io.debezium.connector.postgresql.PostgresConnector");
    props.setProperty("offset.storage", "org.apache.kafka.connect.storage.FileOffsetBackingStore");
    props.setProperty("offset.storage.file.filename", offsets.toString());
    props.setProperty("database.hostname", db.getHost());
    props.setProperty("database.port", Integer.toString(db.getPort() > 0 ? db.getPort() : 5432));
    props.setProperty("database.user", user);
    props.setProperty("database.password", password);
    props.setProperty("database.dbname", db.getPath().replaceFirst("^/", ""));
    props.setProperty("topic.prefix", "outbox-bench");
    props.setProperty("plugin.name", "pgoutput");
    props.setProperty("slot.name", slot);
    props.setProperty("publication.name", publication);
    // The harness creates the slot (before the backlog is written) and the publication
    // (FOR TABLE ... WITH (publish = 'insert')), as for every contender.
    props.setProperty("publication.autocreate.mode", "disabled");
    props.setProperty("snapshot.mode", "no_data");
    props.setProperty("table.include.list", table);
    props.setProperty("tombstones.on.delete", "false");
    props.setProperty("transforms", "outbox");
    props.setProperty("transforms.outbox.type", "io.debezium.transforms.outbox.EventRouter");
    props.setProperty("transforms.outbox.table.field.event.id", "uuid");
    props.setProperty("transforms.outbox.table.field.event.key", "uuid");
    props.setProperty("transforms.outbox.table.field.event.payload", "payload");
    props.setProperty("transforms.outbox.route.by.field", "uuid");
    props.setProperty("transforms.outbox.route.topic.replacement", topic);
    props.setProperty("transforms.outbox.table.fields.additional.placement", "metadata:header");
    props.setProperty("header.converter.class", "org.apache.kafka.connect.storage.SimpleHeaderConverter");
    // Everything else the connector and the engine take: --set key=value (repeatable), e.g.
    // poll.interval.ms, offset.flush.interval.ms, max.batch.size.
    for (Map.Entry<String, String> e : args.entrySet()) {
      if (e.getKey().startsWith("set.")) {
        props.setProperty(e.getKey().substring(4), e.getValue());
      }
    }

    Properties producerProps = new Properties();
    producerProps.setProperty(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
    producerProps.setProperty(ProducerConfig.ACKS_CONFIG, "all");
    producerProps.setProperty(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
    producerProps.setProperty(ProducerConfig.LINGER_MS_CONFIG, args.getOrDefault("linger-ms", "3"));
    producerProps.setProperty(ProducerConfig.CLIENT_ID_CONFIG, "debezium-peer");
    for (Map.Entry<String, String> e : args.entrySet()) {
      if (e.getKey().startsWith("producer.")) {
        producerProps.setProperty(e.getKey().substring(9), e.getValue());
      }
    }
    KafkaProducer<String, String> producer =
        new KafkaProducer<>(producerProps, new StringSerializer(), new StringSerializer());

    HttpServer metrics = startMetrics(metricsAddr);
    System.err.printf(
        "debezium-peer: metrics on %s, slot %s, publication %s, topic %s%n",
        metrics.getAddress(), slot, publication, topic);

    CountDownLatch stopped = new CountDownLatch(1);
    DebeziumEngine<ChangeEvent<String, String>> engine =
        DebeziumEngine.create(
                KeyValueHeaderChangeEventFormat.of(
                    SimpleString.class, SimpleString.class, ClientProvided.class))
            .using(props)
            .notifying(new KafkaChangeConsumer(producer))
            .using(
                (success, message, error) -> {
                  if (!success) {
                    System.err.println("debezium-peer: engine stopped: " + message);
                    if (error != null) {
                      error.printStackTrace();
                    }
                  }
                  stopped.countDown();
                })
            .build();

    Thread runner = new Thread(engine, "debezium-engine");
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  try {
                    engine.close();
                    stopped.await(30, TimeUnit.SECONDS);
                  } catch (IOException | InterruptedException e) {
                    System.err.println("debezium-peer: close: " + e);
                  }
                  producer.close();
                  metrics.stop(0);
                  System.err.printf(
                      "debezium-peer: stopped after %d records%n", published.get());
                }));
    runner.start();
    runner.join();
  }

  /** Produces a batch, waits for every acknowledgement, then marks the batch processed. */
  private static final class KafkaChangeConsumer
      implements DebeziumEngine.ChangeConsumer<ChangeEvent<String, String>> {
    private final KafkaProducer<String, String> producer;

    KafkaChangeConsumer(KafkaProducer<String, String> producer) {
      this.producer = producer;
    }

    @Override
    public void handleBatch(
        List<ChangeEvent<String, String>> records,
        DebeziumEngine.RecordCommitter<ChangeEvent<String, String>> committer)
        throws InterruptedException {
      List<Future<RecordMetadata>> acks = new ArrayList<>(records.size());
      for (ChangeEvent<String, String> r : records) {
        RecordHeaders headers = new RecordHeaders();
        for (Header<byte[]> h : r.<byte[]>headers()) {
          headers.add(h.getKey(), h.getValue());
        }
        acks.add(
            producer.send(
                new ProducerRecord<>(r.destination(), null, r.key(), r.value(), headers),
                (metadata, error) -> {
                  if (error == null) {
                    published.incrementAndGet();
                  }
                }));
      }
      for (Future<RecordMetadata> ack : acks) {
        try {
          ack.get();
        } catch (ExecutionException e) {
          throw new IllegalStateException("Kafka did not acknowledge a record", e.getCause());
        }
      }
      for (ChangeEvent<String, String> r : records) {
        committer.markProcessed(r);
      }
      committer.markBatchFinished();
    }

    @Override
    public boolean supportsTombstoneEvents() {
      return false;
    }
  }

  private static HttpServer startMetrics(String addr) throws IOException {
    int colon = addr.lastIndexOf(':');
    HttpServer server =
        HttpServer.create(
            new InetSocketAddress(
                addr.substring(0, colon), Integer.parseInt(addr.substring(colon + 1))),
            0);
    server.createContext(
        "/metrics",
        exchange -> {
          byte[] body =
              ("# TYPE events_published_total counter\nevents_published_total "
                      + published.get()
                      + "\n")
                  .getBytes(StandardCharsets.UTF_8);
          exchange.sendResponseHeaders(200, body.length);
          try (OutputStream out = exchange.getResponseBody()) {
            out.write(body);
          }
        });
    server.start();
    return server;
  }

  /** --name value or --name=value; "--set k=v" and "--producer k=v" may repeat. */
  private static Map<String, String> parseArgs(String[] argv) {
    Map<String, String> out = new HashMap<>();
    for (int i = 0; i < argv.length; i++) {
      String a = argv[i];
      if (!a.startsWith("--")) {
        throw new IllegalArgumentException("unexpected argument " + a);
      }
      String name = a.substring(2);
      String value;
      int eq = name.indexOf('=');
      if ((name.equals("set") || name.equals("producer")) || eq < 0) {
        if (i + 1 >= argv.length) {
          throw new IllegalArgumentException(a + " needs a value");
        }
        value = argv[++i];
      } else {
        value = name.substring(eq + 1);
        name = name.substring(0, eq);
      }
      if (name.equals("set") || name.equals("producer")) {
        int kv = value.indexOf('=');
        if (kv < 0) {
          throw new IllegalArgumentException("--" + name + " takes key=value");
        }
        out.put(name + "." + value.substring(0, kv), value.substring(kv + 1));
      } else {
        out.put(name, value);
      }
    }
    return out;
  }
}
