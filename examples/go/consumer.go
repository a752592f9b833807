package main

// The reporting service: applies order events from Redis exactly once.
//
// Reads the stream through a Redis consumer group (XREADGROUP) and applies
// each entry in its own transaction: inbox_apply() and, when the event is
// new, the projection. The entry is acknowledged (XACK) only after the
// commit. A worker that dies between its commit and its XACK leaves the entry
// pending; another worker (or this one, restarted) reclaims it with
// XAUTOCLAIM, inbox_apply() reports it as a duplicate, and it is acknowledged
// without being applied again. The same event id with another payload is an
// identity conflict (SQLSTATE OB001): logged, dead-lettered, acknowledged,
// never applied.
//
// Environment:
//   DATABASE_URL        the reports database, as reports_app
//   REDIS_URL           redis://host:port/db (default redis://127.0.0.1:6379/0)
//   STREAM              the stream to read (default outbox:orders)
//   CONSUMER            the inbox consumer and Redis consumer group (default reports)
//   WORKER              this worker's name in the group (default host:pid)
//   MIN_IDLE_MS         reclaim pending entries idle this long (default 30000)
//   CLAIM_INTERVAL_MS   how often to look for them (default 5000)
//   CRASH_AFTER_COMMIT  test hook: die (SIGKILL) right after the n-th commit, before its XACK
//   SPANS_FILE          where to write the finished spans, one JSON object a line (default: nowhere)
//
// Tracing: an entry of an event emitted with trace context has the fields
// "traceparent" (and "tracestate"), which are also in its headers. The
// consumer extracts that context with the W3C propagator and applies the
// entry in a span that is its child: the order service's checkout and this
// apply are one trace. An entry without (valid) trace context is applied in
// a new trace.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/gomodule/redigo/redis"
	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

var uuidText = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

type consumer struct {
	pool                 *pgxpool.Pool
	redis                redis.Conn
	stream, name, worker string
	minIdle              int
	crashAfter, commits  int
	stopping             context.Context
}

// entry is a stream entry's fields. "key" and "headers" are absent when the
// producer emitted NULL; the others are always there.
type entry map[string]string

// event is what the consumer takes from an entry.
type event struct {
	eventID, payload string
	key              *string
	OrderID          string `json:"order_id"`
	AmountCents      *int64 `json:"amount_cents"`
	source           *string
	trace            traceHeaders // traceparent, tracestate: what the producer's span handed on
}

type malformed struct{ reason string }

func (m malformed) Error() string { return "malformed entry: " + m.reason }

// parse reads an entry's fields.
func parse(f entry) (*event, error) {
	for name, value := range f {
		if !utf8.ValidString(value) || strings.ContainsRune(value, 0) { // PostgreSQL would refuse it (22021)
			return nil, malformed{"not UTF-8 text: " + strconv.QuoteToGraphic(name)}
		}
	}
	e := &event{eventID: f["event_id"], payload: f["payload"], trace: traceHeaders{}}
	if !uuidText.MatchString(e.eventID) {
		return nil, malformed{fmt.Sprintf("event_id %q is not a uuid", e.eventID)}
	}
	if err := json.Unmarshal([]byte(e.payload), e); err != nil {
		return nil, malformed{err.Error()}
	}
	if !uuidText.MatchString(e.OrderID) || e.AmountCents == nil {
		return nil, malformed{"not an order"}
	}
	if key, ok := f["key"]; ok {
		e.key = &key
	}
	if h, ok := f["headers"]; ok {
		var headers struct {
			Source *string
			// Any JSON value: one that is not a string is no trace
			// context, and no reason to refuse the event.
			Traceparent interface{} `json:"traceparent"`
			Tracestate  interface{} `json:"tracestate"`
		}
		if err := json.Unmarshal([]byte(h), &headers); err != nil {
			return nil, malformed{"headers: " + err.Error()}
		}
		e.source = headers.Source
		e.trace["traceparent"], _ = headers.Traceparent.(string)
		e.trace["tracestate"], _ = headers.Tracestate.(string)
	}
	// The entry's own fields, else the headers' keys (the same values).
	for _, name := range []string{"traceparent", "tracestate"} {
		if v, ok := f[name]; ok {
			e.trace[name] = v
		}
	}
	return e, nil
}

// apply applies one event in one transaction: true if new, false if a duplicate.
func (c *consumer) apply(ctx context.Context, entryID string, e *event) (isNew bool, err error) {
	err = c.pool.BeginFunc(ctx, func(tx pgx.Tx) error {
		// The payload goes as text: the server compares it as jsonb.
		if err := tx.QueryRow(ctx, "SELECT inbox_apply($1, $2, $3)", c.name, e.eventID, e.payload).Scan(&isNew); err != nil {
			return err
		}
		if !isNew {
			return nil
		}
		if _, err := tx.Exec(ctx, `INSERT INTO applied_orders (order_id, event_id, customer, amount_cents, entry_id, source)
			VALUES ($1, $2, $3, $4, $5, $6)`, e.OrderID, e.eventID, e.key, *e.AmountCents, entryID, e.source); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO order_totals AS t (customer, orders, amount_cents)
			VALUES (coalesce($1, '(guest)'), 1, $2)
			ON CONFLICT (customer) DO UPDATE SET orders = t.orders + 1, amount_cents = t.amount_cents + excluded.amount_cents`,
			e.key, *e.AmountCents)
		return err
	})
	return isNew, err
}

// deadLetter records an entry given up on, with what can be kept of it.
func (c *consumer) deadLetter(ctx context.Context, entryID string, f entry, reason string, sqlstate *string) error {
	opt := func(name string, isJSON bool) *string {
		v, ok := f[name]
		if !ok || (isJSON && !json.Valid([]byte(v))) || (name == "event_id" && !uuidText.MatchString(v)) {
			return nil
		}
		v = strings.ReplaceAll(strings.ToValidUTF8(v, "\uFFFD"), "\x00", `\x00`)
		return &v
	}
	payload := opt("payload", true)
	if raw, ok := f["payload"]; ok && (payload == nil || *payload != raw) {
		// Keep it in the reason, quoted: a dead letter loses nothing.
		reason += " (payload: " + strconv.QuoteToGraphic(raw) + ")"
	}
	_, err := c.pool.Exec(ctx, "SELECT inbox_dead_letter($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
		c.name, c.stream, entryID, opt("event_id", false), opt("topic", false), opt("key", false),
		payload, opt("headers", true), reason, sqlstate)
	return err
}

// transient tells whether a retry may succeed: a lost connection, a
// serialization failure, a deadlock, a shutdown.
func transient(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "40001" || pgErr.Code == "40P01" ||
			pgErr.Code == "57P01" || pgErr.Code == "57P03"
	}
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || strings.Contains(err.Error(), "conn closed")
}

// handle applies, dead-letters or skips one entry, then acknowledges it.
func (c *consumer) handle(entryID string, f entry) error {
	ctx := context.Background() // not the stop signal's: an entry begun is finished
	if f == nil {
		log.Printf("dead-lettered %s: the entry was trimmed from the stream before it was applied", entryID)
		if err := c.deadLetter(ctx, entryID, entry{}, "trimmed from the stream while pending", nil); err != nil {
			return err
		}
		return c.ack(entryID)
	}
	var e *event
	var isNew bool
	for attempt := 1; ; attempt++ {
		var err error
		if e, err = parse(f); err == nil {
			_, span := tracer("consumer").Start(extract(e.trace), "apply order", trace.WithSpanKind(trace.SpanKindConsumer),
				trace.WithAttributes(attribute.String("messaging.message.id", entryID), attribute.String("event_id", e.eventID)))
			if isNew, err = c.apply(ctx, entryID, e); err == nil {
				span.SetAttributes(attribute.Bool("new", isNew))
			}
			span.End()
			flushSpans("consumer")
		}
		if err == nil {
			break
		}
		var pgErr *pgconn.PgError
		var bad malformed
		switch {
		case errors.As(err, &bad):
			log.Printf("dead-lettered %s: %v", entryID, err)
			err = c.deadLetter(ctx, entryID, f, err.Error(), nil)
		case errors.As(err, &pgErr) && pgErr.Code == "OB001":
			// Same event id, another payload: never applied, never silent.
			log.Printf("CONFLICT %s event %s: %s %s", entryID, f["event_id"], pgErr.Message, pgErr.Detail)
			err = c.deadLetter(ctx, entryID, f, pgErr.Message, &pgErr.Code)
		case errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22"): // invalid uuid or JSON text, a NULL
			log.Printf("dead-lettered %s: %s (SQLSTATE %s)", entryID, pgErr.Message, pgErr.Code)
			err = c.deadLetter(ctx, entryID, f, pgErr.Message, &pgErr.Code)
		case transient(err) && c.stopping.Err() == nil:
			log.Printf("retrying %s after %v", entryID, err)
			time.Sleep(time.Duration(100<<min(attempt, 6)) * time.Millisecond)
			continue
		default:
			return err // a fault of ours (privileges, schema): stop, the entry stays pending
		}
		if err != nil {
			return err
		}
		return c.ack(entryID)
	}
	c.commits++
	if c.commits == c.crashAfter {
		log.Printf("committed %s, dying before XACK", entryID)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	if err := c.ack(entryID); err != nil { // only now: after the commit
		return err
	}
	if isNew {
		log.Printf("applied %s event %s", entryID, e.eventID)
	} else {
		log.Printf("duplicate %s event %s (applied before; acknowledged)", entryID, e.eventID)
	}
	return nil
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

func (c *consumer) ack(entryID string) error {
	_, err := c.redis.Do("XACK", c.stream, c.name, entryID)
	return err
}

// entries converts Redis's [[id, [name, value, ...]], ...] into ids and
// fields; an entry trimmed from the stream comes back with nil fields.
func entries(reply interface{}) ([]string, []entry, error) {
	list, err := redis.Values(reply, nil)
	if err != nil {
		return nil, nil, err
	}
	ids := make([]string, len(list))
	fields := make([]entry, len(list))
	for i, item := range list {
		parts, err := redis.Values(item, nil)
		if err != nil || len(parts) != 2 {
			return nil, nil, fmt.Errorf("unexpected stream entry %v", item)
		}
		if ids[i], err = redis.String(parts[0], nil); err != nil {
			return nil, nil, err
		}
		if parts[1] != nil {
			if fields[i], err = redis.StringMap(parts[1], nil); err != nil {
				return nil, nil, err
			}
		}
	}
	return ids, fields, nil
}

// reclaim takes over entries that another worker (perhaps a dead one) left pending.
func (c *consumer) reclaim() error {
	cursor := "0-0"
	for {
		reply, err := redis.Values(c.redis.Do("XAUTOCLAIM", c.stream, c.name, c.worker, c.minIdle, cursor, "COUNT", 100))
		if err != nil {
			return err
		}
		if cursor, err = redis.String(reply[0], nil); err != nil {
			return err
		}
		ids, fields, err := entries(reply[1])
		if err != nil {
			return err
		}
		var deleted []string // Redis 7: ids trimmed from the stream while pending
		if len(reply) > 2 {
			if deleted, err = redis.Strings(reply[2], nil); err != nil {
				return err
			}
		}
		if len(ids)+len(deleted) > 0 {
			log.Printf("reclaimed %d pending entries", len(ids)+len(deleted))
		}
		for i, id := range ids {
			if err := c.handle(id, fields[i]); err != nil {
				return err
			}
		}
		for _, id := range deleted {
			if err := c.handle(id, nil); err != nil {
				return err
			}
		}
		if cursor == "0-0" {
			return nil
		}
	}
}

// read takes new entries for this worker, waiting up to a second.
func (c *consumer) read() error {
	reply, err := c.redis.Do("XREADGROUP", "GROUP", c.name, c.worker, "COUNT", 10, "BLOCK", 1000, "STREAMS", c.stream, ">")
	if err != nil || reply == nil { // nil: nothing came within the block time
		return err
	}
	streams, err := redis.Values(reply, nil)
	if err != nil {
		return err
	}
	for _, s := range streams {
		parts, err := redis.Values(s, nil)
		if err != nil || len(parts) != 2 {
			return fmt.Errorf("unexpected XREADGROUP reply %v", s)
		}
		ids, fields, err := entries(parts[1])
		if err != nil {
			return err
		}
		for i, id := range ids {
			if err := c.handle(id, fields[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

func runConsumer() error {
	stopping, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hostname, _ := os.Hostname()
	c := &consumer{
		stream:     env("STREAM", "outbox:orders"),
		name:       env("CONSUMER", "reports"),
		worker:     env("WORKER", fmt.Sprintf("%s:%d", hostname, os.Getpid())),
		minIdle:    envInt("MIN_IDLE_MS", 30000),
		crashAfter: envInt("CRASH_AFTER_COMMIT", 0),
		stopping:   stopping,
	}
	claimInterval := time.Duration(envInt("CLAIM_INTERVAL_MS", 5000)) * time.Millisecond
	var err error
	if c.pool, err = pgxpool.Connect(context.Background(), os.Getenv("DATABASE_URL")); err != nil {
		return err
	}
	defer c.pool.Close()
	redisURL := env("REDIS_URL", "redis://127.0.0.1:6379/0")
	dial := func() (redis.Conn, error) {
		// The read timeout must outlast XREADGROUP's BLOCK.
		return redis.DialURL(redisURL, redis.DialConnectTimeout(5*time.Second), redis.DialReadTimeout(5*time.Second))
	}
	if c.redis, err = dial(); err != nil {
		return err
	}
	defer func() { c.redis.Close() }()
	if _, err := c.redis.Do("XGROUP", "CREATE", c.stream, c.name, "0", "MKSTREAM"); err != nil &&
		!strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return err
	}

	log.Printf("worker %s reading %s as consumer %s", c.worker, c.stream, c.name)
	var nextClaim time.Time
	for stopping.Err() == nil {
		if time.Now().After(nextClaim) {
			err = c.reclaim()
			nextClaim = time.Now().Add(claimInterval)
		}
		if err == nil {
			err = c.read()
		}
		if err == nil {
			continue
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return err // see handle: nothing to retry
		}
		// A Redis connection that failed stays failed in redigo: dial again.
		log.Printf("%v; retrying", err)
		time.Sleep(time.Second)
		if c.redis.Err() != nil {
			c.redis.Close()
			if conn, dialErr := dial(); dialErr == nil {
				c.redis = conn
			}
		}
		err = nil
	}
	log.Print("stopped")
	return nil
}
