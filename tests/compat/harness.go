package main

// The services and processes a scenario needs: the database, Kafka topics,
// the relay as a child process, and what Kafka holds afterwards read two
// ways (a real watermill-kafka subscriber, and a raw Sarama consumer for
// what the subscriber cannot show: null versus empty, keys, partitions, the
// headers as sent).

import (
	"bytes"
	"context"
	stdsql "database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	watermillkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib"
)

type env struct {
	databaseURL string
	brokers     []string
	relayBin    string
	workDir     string
	run         string // unique prefix of every name this run creates
	partitions  int32
	verbose     bool
	logger      watermill.LoggerAdapter
	db          *stdsql.DB
	admin       sarama.ClusterAdmin
	topics      []string
	cleanupSQL  []string
}

// saramaConfig is what the pipelines use, with one change: Kafka 4 brokers
// no longer speak the protocol versions of watermill-kafka v3.0.6's default
// (sarama.V1_0_0_0), so every client here states 2.1, the oldest they do.
func saramaConfig(base *sarama.Config) *sarama.Config {
	if base == nil {
		base = sarama.NewConfig()
	}
	base.Version = sarama.V2_1_0_0
	return base
}

func openEnv(databaseURL, brokers, relayBin, workDir string, verbose bool) (*env, error) {
	e := &env{
		databaseURL: databaseURL,
		brokers:     strings.Split(brokers, ","),
		relayBin:    relayBin,
		workDir:     workDir,
		run:         fmt.Sprintf("c%d", os.Getpid()),
		partitions:  6,
		verbose:     verbose,
		logger:      watermill.NewStdLogger(false, false),
	}
	if !verbose {
		e.logger = watermill.NopLogger{}
	}
	db, err := stdsql.Open("pgx", databaseURL)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(32)
	e.db = db
	cfg := saramaConfig(nil)
	admin, err := sarama.NewClusterAdmin(e.brokers, cfg)
	if err != nil {
		return nil, fmt.Errorf("kafka admin: %w", err)
	}
	e.admin = admin
	return e, nil
}

func (e *env) close() {
	ctx := context.Background()
	for i := len(e.cleanupSQL) - 1; i >= 0; i-- {
		if _, err := e.db.ExecContext(ctx, e.cleanupSQL[i]); err != nil && e.verbose {
			logf("cleanup: %s: %v", e.cleanupSQL[i], err)
		}
	}
	for _, t := range e.topics {
		_ = e.admin.DeleteTopic(t)
	}
	_ = e.admin.Close()
	_ = e.db.Close()
}

func (e *env) exec(ctx context.Context, sql string, args ...any) error {
	_, err := e.db.ExecContext(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", firstLine(sql), err)
	}
	return nil
}

// onCleanup runs `sql` when the run ends (in reverse order), errors ignored.
func (e *env) onCleanup(sql string) { e.cleanupSQL = append(e.cleanupSQL, sql) }

// createTopics creates each topic with e.partitions partitions (so keys have
// somewhere to go) and deletes it when the run ends.
func (e *env) createTopics(names ...string) error {
	for _, n := range names {
		err := e.admin.CreateTopic(n, &sarama.TopicDetail{NumPartitions: e.partitions, ReplicationFactor: 1}, false)
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			return fmt.Errorf("create topic %s: %w", n, err)
		}
		e.topics = append(e.topics, n)
	}
	return e.waitForLeaders(names...)
}

// waitForLeaders waits until every partition of `names` has a leader: a
// consumer started on a topic the broker has just created can otherwise be
// told "not the leader for some partition" and give up.
func (e *env) waitForLeaders(names ...string) error {
	var last error
	ok := waitFor(30*time.Second, func() bool {
		metas, err := e.admin.DescribeTopics(names)
		if err != nil {
			last = err
			return false
		}
		for _, m := range metas {
			if m.Err != sarama.ErrNoError || len(m.Partitions) != int(e.partitions) {
				last = fmt.Errorf("topic %s: %v, %d partitions", m.Name, m.Err, len(m.Partitions))
				return false
			}
			for _, p := range m.Partitions {
				if p.Err != sarama.ErrNoError || p.Leader < 0 {
					last = fmt.Errorf("topic %s partition %d: %v, leader %d", m.Name, p.ID, p.Err, p.Leader)
					return false
				}
			}
		}
		return true
	})
	if !ok {
		return fmt.Errorf("topics without leaders after 30 s: %v", last)
	}
	return nil
}

// --- the relay -------------------------------------------------------------------------------

type relayProc struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

func (e *env) startRelay(name string, args ...string) (*relayProc, error) {
	logPath := filepath.Join(e.workDir, fmt.Sprintf("%s-%s.log", e.run, name))
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	full := append([]string{"run"}, args...)
	cmd := exec.Command(e.relayBin, full...)
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.Env = append(os.Environ(),
		"DATABASE_URL="+e.databaseURL,
		"KAFKA_BROKERS="+strings.Join(e.brokers, ","),
		"OUTBOX_METRICS_ADDR=",
		"OUTBOX_STATUS_INTERVAL_MS=200",
	)
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &relayProc{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *relayProc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

func (p *relayProc) tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitLog waits until the relay's log contains `needle`.
func (p *relayProc) waitLog(needle string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if strings.Contains(p.log(), needle) {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("relay exited (%v) before logging %q:\n%s", p.err, needle, p.tail(30))
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("relay did not log %q within %v:\n%s", needle, timeout, p.tail(30))
}

// stop sends SIGTERM and waits for a clean exit.
func (p *relayProc) stop() error {
	select {
	case <-p.done:
		return fmt.Errorf("relay had exited already (%v):\n%s", p.err, p.tail(30))
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("relay exited with %v after SIGTERM:\n%s", p.err, p.tail(30))
		}
		return nil
	case <-time.After(40 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("relay did not stop within 40 s of SIGTERM:\n%s", p.tail(30))
	}
}

func (p *relayProc) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// --- what Kafka holds ----------------------------------------------------------------------

// record: one Kafka record as a raw consumer sees it.
type record struct {
	topic     string
	partition int32
	offset    int64
	key       []byte // nil: a null key
	value     []byte // nil: a null value
	headers   [][2]string
}

// readRaw reads every record of `topics` from the beginning, until each
// partition is at its high-water mark.
func (e *env) readRaw(topics ...string) ([]record, error) {
	cfg := saramaConfig(nil)
	consumer, err := sarama.NewConsumer(e.brokers, cfg)
	if err != nil {
		return nil, err
	}
	defer consumer.Close()
	client, err := sarama.NewClient(e.brokers, cfg)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	var out []record
	for _, topic := range topics {
		parts, err := consumer.Partitions(topic)
		if err != nil {
			return nil, fmt.Errorf("partitions of %s: %w", topic, err)
		}
		for _, p := range parts {
			high, err := client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				return nil, err
			}
			if high == 0 {
				continue
			}
			pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
			if err != nil {
				return nil, err
			}
			for {
				var m *sarama.ConsumerMessage
				select {
				case m = <-pc.Messages():
				case <-time.After(30 * time.Second):
					pc.Close()
					return nil, fmt.Errorf("reading %s/%d: nothing for 30 s", topic, p)
				}
				r := record{topic: m.Topic, partition: m.Partition, offset: m.Offset, key: m.Key, value: m.Value}
				for _, h := range m.Headers {
					r.headers = append(r.headers, [2]string{string(h.Key), string(h.Value)})
				}
				out = append(out, r)
				if m.Offset+1 >= high {
					break
				}
			}
			pc.Close()
		}
	}
	return out, nil
}

// subscribed: messages as watermill-kafka's subscriber (DefaultMarshaler's
// Unmarshal) hands them to a consumer.
type subscribed struct {
	mu       sync.Mutex
	messages map[string][]*message.Message // topic -> messages
	cancel   context.CancelFunc
	sub      *watermillkafka.Subscriber
}

func (e *env) subscribe(topics ...string) (*subscribed, error) {
	cfg := saramaConfig(watermillkafka.DefaultSaramaSubscriberConfig())
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := watermillkafka.NewSubscriber(watermillkafka.SubscriberConfig{
		Brokers:               e.brokers,
		Unmarshaler:           watermillkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: cfg,
	}, e.logger)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &subscribed{messages: map[string][]*message.Message{}, cancel: cancel, sub: sub}
	for _, t := range topics {
		ch, err := sub.Subscribe(ctx, t)
		if err != nil {
			cancel()
			return nil, err
		}
		go func(topic string) {
			for m := range ch {
				s.mu.Lock()
				s.messages[topic] = append(s.messages[topic], m)
				s.mu.Unlock()
				m.Ack()
			}
		}(t)
	}
	return s, nil
}

func (s *subscribed) count(topics ...string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, t := range topics {
		n += len(s.messages[t])
	}
	return n
}

func (s *subscribed) take(topic string) []*message.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*message.Message(nil), s.messages[topic]...)
}

func (s *subscribed) close() {
	s.cancel()
	_ = s.sub.Close()
}

// --- small helpers -------------------------------------------------------------------------

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return s
}

func sortedHeaders(h [][2]string) [][2]string {
	out := append([][2]string(nil), h...)
	sort.Slice(out, func(i, j int) bool {
		if out[i][0] != out[j][0] {
			return out[i][0] < out[j][0]
		}
		return out[i][1] < out[j][1]
	})
	return out
}

func equalHeaders(a, b [][2]string) bool {
	a, b = sortedHeaders(a), sortedHeaders(b)
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func equalNullable(a, b []byte) bool {
	return (a == nil) == (b == nil) && bytes.Equal(a, b)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[compat] "+format+"\n", args...)
}

// waitFor polls `cond` until it holds or `timeout` passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return cond()
}
