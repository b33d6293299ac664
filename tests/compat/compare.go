package main

// Comparing the relay's stream with the reference pipeline's, message by
// message: as records (topic, key, value, headers, partition) and as
// watermill-kafka's subscriber hands them over (UUID, metadata, payload).

import (
	"bytes"
	"fmt"
	"sort"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
)

type comparison struct {
	name       string
	compared   int
	keyed      int // of them, with a key: partition compared too
	mismatches []string
	missing    int // committed, absent from a stream
	phantoms   int // rolled back, present
	duplicates int // the relay's extra copies
	// Order: within each partition of the relay's stream, messages in commit
	// order (the writers of these scenarios commit one transaction at a time,
	// so the ledger's order is the commit order).
	orderViolations int
}

func (c *comparison) fail(format string, args ...any) {
	c.mismatches = append(c.mismatches, fmt.Sprintf(format, args...))
}

func (c *comparison) ok() bool {
	return len(c.mismatches) == 0 && c.missing == 0 && c.phantoms == 0 && c.orderViolations == 0
}

func (c *comparison) String() string {
	s := fmt.Sprintf("%s: %d messages compared (%d keyed, partition compared), %d mismatches, "+
		"%d missing, %d phantoms, %d order violations, %d duplicates", c.name, c.compared, c.keyed,
		len(c.mismatches), c.missing, c.phantoms, c.orderViolations, c.duplicates)
	for i, m := range c.mismatches {
		if i == 10 {
			s += fmt.Sprintf("\n    ... and %d more", len(c.mismatches)-10)
			break
		}
		s += "\n    " + m
	}
	return s
}

// recordIdentity: the cmp_id header, else the (first) UUID header.
func recordIdentity(r record) string {
	uuid := ""
	seenUUID := false
	for _, h := range r.headers {
		if h[0] == idKey {
			return h[1]
		}
		if h[0] == "_watermill_message_uuid" && !seenUUID {
			uuid, seenUUID = h[1], true
		}
	}
	return "uuid:" + uuid
}

func indexRecords(recs []record) (map[string]record, int) {
	out := map[string]record{}
	dups := 0
	for _, r := range recs {
		id := recordIdentity(r)
		if _, ok := out[id]; ok {
			dups++
			continue
		}
		out[id] = r
	}
	return out, dups
}

func indexMessages(msgs []*message.Message) map[string]*message.Message {
	out := map[string]*message.Message{}
	for _, m := range msgs {
		id := identityOf(m)
		if _, ok := out[id]; !ok {
			out[id] = m
		}
	}
	return out
}

func show(b []byte) string {
	if b == nil {
		return "null"
	}
	s := fmt.Sprintf("%q", b)
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return s
}

// compareStreams: `relay` and `ref` are the raw records of the two streams,
// `relaySub`/`refSub` the same as watermill-kafka's subscriber delivered
// them; `refTopic` maps a relay topic to the reference's.
func compareStreams(c *comparison, l *ledger, relay, ref []record, relaySub, refSub []*message.Message,
	refTopic func(string) string) {
	relayByID, relayDups := indexRecords(relay)
	refByID, _ := indexRecords(ref)
	c.duplicates += relayDups
	relayMsgs := indexMessages(relaySub)
	refMsgs := indexMessages(refSub)
	ids := make([]string, 0, len(l.committed))
	for id := range l.committed {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		a, inRelay := relayByID[id]
		b, inRef := refByID[id]
		if !inRelay || !inRef {
			c.missing++
			c.fail("%s: in the relay's stream %v, in the reference's %v", id, inRelay, inRef)
			continue
		}
		c.compared++
		if refTopic(a.topic) != b.topic {
			c.fail("%s: topic %s vs %s", id, a.topic, b.topic)
		}
		if !equalNullable(a.key, b.key) {
			c.fail("%s: key %s vs %s", id, show(a.key), show(b.key))
		}
		if !equalNullable(a.value, b.value) {
			c.fail("%s: value %s vs %s", id, show(a.value), show(b.value))
		}
		if !equalHeaders(a.headers, b.headers) {
			c.fail("%s: headers %v vs %v", id, sortedHeaders(a.headers), sortedHeaders(b.headers))
		}
		if a.key != nil {
			c.keyed++
			if a.partition != b.partition {
				c.fail("%s: key %s in partition %d vs %d", id, show(a.key), a.partition, b.partition)
			}
		}
		// What a consumer sees.
		ma, okA := relayMsgs[id]
		mb, okB := refMsgs[id]
		if !okA || !okB {
			c.fail("%s: watermill-kafka subscriber got it from the relay %v, from the reference %v", id, okA, okB)
			continue
		}
		if ma.UUID != mb.UUID {
			c.fail("%s: subscriber UUID %q vs %q", id, ma.UUID, mb.UUID)
		}
		if !bytes.Equal(ma.Payload, mb.Payload) {
			c.fail("%s: subscriber payload %s vs %s", id, show(ma.Payload), show(mb.Payload))
		}
		if !equalMetadata(ma.Metadata, mb.Metadata) {
			c.fail("%s: subscriber metadata %v vs %v", id, ma.Metadata, mb.Metadata)
		}
	}
	c.orderViolations += orderViolations(l, relay)
	for id := range l.rolledBack {
		if _, ok := relayByID[id]; ok {
			c.phantoms++
			c.fail("%s: rolled back, yet in the relay's stream", id)
		}
	}
}

func equalMetadata(a, b message.Metadata) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func describe(msgs map[string]*message.Message) string {
	var parts []string
	for id := range msgs {
		parts = append(parts, id)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// orderViolations counts the records of `recs` (as readRaw returns them:
// partition by partition, in offset order) that come after a record whose
// transaction committed later, per partition, among the messages delivered
// once (a duplicate's copies may lie in other partitions; duplicates are
// counted on their own).
func orderViolations(l *ledger, recs []record) int {
	l.mu.Lock()
	position := make(map[string]int, len(l.order))
	for i, id := range l.order {
		position[id] = i
	}
	l.mu.Unlock()
	type partition struct {
		topic string
		n     int32
	}
	copies := map[string]int{}
	for _, r := range recs {
		copies[recordIdentity(r)]++
	}
	last := map[partition]int{}
	violations := 0
	for _, r := range recs {
		id := recordIdentity(r)
		pos, ok := position[id]
		if !ok || copies[id] != 1 {
			continue
		}
		p := partition{r.topic, r.partition}
		if prev, ok := last[p]; ok && pos < prev {
			violations++
			continue
		}
		last[p] = pos
	}
	return violations
}
