package main

// The messages the writers publish: metadata and payloads chosen to be awkward
// for a re-implementation of Go's encoders and decoders, and a ledger of
// what was committed (and what was rolled back).

import (
	"bytes"
	"context"
	stdsql "database/sql"
	"fmt"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	watermillsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// idKey: a metadata entry every message with metadata carries, so the two
// streams can be matched message by message (messages without metadata are
// matched by their UUID, which is then unique and non-empty).
const idKey = "cmp_id"

type payloadKind int

const (
	jsonPayload payloadKind = iota
	byteaPayload
)

// awkwardValues: metadata values Go's json.Marshal escapes or rewrites
// (\u003c \u003e \u0026, \u2028, control characters, invalid UTF-8 -> U+FFFD).
var awkwardValues = []string{
	"Zoë 😀 Привет 日本",
	`<a href="x">&</a>`,
	`quote " and \ backslash / slash`,
	"",
	"line\nbreak\ttab\rreturn",
	"sep\u2028\u2029end",
	"ctl\x00\x01\x1f\x7f",
	"bad utf-8 f\xffo",
	"\U0001F600\U0001F4A9",
	strings.Repeat("long-", 400),
}

var jsonPayloads = []string{
	`{"n":1}`,
	`{ "spaced" : [1, 2,  3] ,	"dup":1, "dup":2 }`,
	`"just a string"`,
	`123.456e7`,
	`null`,
	`{"esc":"\u0000\u001f\ud83d\ude00 \u003c\u003e","raw":"Привет 😀"}`,
	`[{"deep":[{"deeper":{"deepest":[true,false,null]}}]}]`,
	`{"big":"` + strings.Repeat("x", 8000) + `"}`,
	"{\n  \"pretty\": \"printed\"\n}\n",
}

// message i of scenario `tag`: every variant comes round in turn.
func awkwardMessage(tag string, i int, kind payloadKind, allowEmptyUUID bool) *message.Message {
	id := fmt.Sprintf("%s-%d", tag, i)
	uuid := watermill.NewUUID()
	if i%7 == 3 {
		uuid = watermill.NewULID()
	}
	if allowEmptyUUID && i%17 == 5 {
		uuid = "" // watermill allows it; matched by cmp_id
	}
	var payload []byte
	switch kind {
	case jsonPayload:
		payload = []byte(jsonPayloads[i%len(jsonPayloads)])
		if i%13 == 6 {
			payload = nil // SQL NULL: a null Kafka value
		}
	case byteaPayload:
		payload = []byte{0x00, 0xff, 0xfe, byte(i), '{', '}', 0x80, 0xc3}
		payload = append(payload, bytes.Repeat([]byte{byte(i * 7)}, i%50)...)
		switch i % 11 {
		case 4:
			payload = []byte{} // an empty value, not a null one
		case 8:
			payload = nil
		}
	}
	msg := message.NewMessage(uuid, payload)
	switch i % 19 {
	case 7:
		msg.Metadata = nil // json "null"
		msg.UUID = watermill.NewUUID()
		return msg
	case 11:
		msg.Metadata = message.Metadata{} // "{}"
		msg.UUID = watermill.NewUUID()
		return msg
	}
	msg.Metadata.Set(idKey, id)
	msg.Metadata.Set("name", fmt.Sprintf("Event%d", i%5))
	msg.Metadata.Set("correlation_id", watermill.NewShortUUID())
	msg.Metadata.Set("note", awkwardValues[i%len(awkwardValues)])
	msg.Metadata.Set("aggregate_id", fmt.Sprintf("agg-%d", i%9))
	if i%5 == 2 {
		msg.Metadata.Set("empty", "")
		msg.Metadata.Set("Key With Space", "v")
		msg.Metadata.Set("ключ", "значение")
		msg.Metadata.Set("A", "upper")
		msg.Metadata.Set("a", "lower")
	}
	if i%23 == 9 {
		// watermill-kafka sends an empty one as a second UUID header: its
		// subscriber then sees the message's UUID as "".
		msg.Metadata.Set("_watermill_message_uuid", "")
	}
	return msg
}

// ledger: identities committed and rolled back.
type ledger struct {
	mu         sync.Mutex
	committed  map[string]*message.Message
	rolledBack map[string]bool
	order      []string
}

func newLedger() *ledger {
	return &ledger{committed: map[string]*message.Message{}, rolledBack: map[string]bool{}}
}

func identityOf(msg *message.Message) string {
	if msg.Metadata != nil {
		if id := msg.Metadata.Get(idKey); id != "" {
			return id
		}
	}
	return "uuid:" + msg.UUID
}

func (l *ledger) add(msgs []*message.Message, committed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range msgs {
		id := identityOf(m)
		if committed {
			l.committed[id] = m
			l.order = append(l.order, id)
		} else {
			l.rolledBack[id] = true
		}
	}
}

func (l *ledger) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.committed)
}

// publishTx publishes `msgs` to `topic` with a watermill-sql publisher built
// on a database transaction (how services publish, since watermill-sql has
// no PublishTx), then commits or rolls back.
func publishTx(ctx context.Context, db *stdsql.DB, publisher func(tx *stdsql.Tx) (message.Publisher, error),
	topic string, msgs []*message.Message, commit bool, l *ledger) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	pub, err := publisher(tx)
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := pub.Publish(topic, msgs...); err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("publish to %s: %w", topic, err)
	}
	if !commit {
		if err := tx.Rollback(); err != nil {
			return err
		}
		l.add(msgs, false)
		return nil
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	l.add(msgs, true)
	return nil
}

func sqlPublisherOn(schema watermillsql.SchemaAdapter) func(tx *stdsql.Tx) (message.Publisher, error) {
	return func(tx *stdsql.Tx) (message.Publisher, error) {
		return watermillsql.NewPublisher(watermillsql.TxFromStdSQL(tx),
			watermillsql.PublisherConfig{SchemaAdapter: schema}, nil)
	}
}
