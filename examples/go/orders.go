package main

// The order service: places orders and emits their events in the same transaction.
//
// A checkout (one to three orders of one customer) is one transaction: it
// inserts the orders, counts them on the customer's row, and emits one event
// per order on topic "orders", with outbox_emit() for one order and
// outbox_emit_many() for several. A checkout declined after emitting rolls
// back, and its events with it. Serialization failures (40001) and deadlocks
// (40P01) are retried with the same ids.
//
// Environment:
//   DATABASE_URL   the shop database, as shop_app
//   ORDERS         checkouts to place (default 20)
//   WORKERS        goroutines placing them, each on a pooled connection (default 2)
//   REJECT_EVERY   every n-th checkout is declined after emitting (default 0: none)
//   SPANS_FILE     where to write the finished spans, one JSON object a line (default: nowhere)
//
// Tracing: each checkout request comes in with W3C trace context (a
// storefront's span, simulated here), except every third one, as from a
// batch import. The checkout runs in a span of its own, a child of the
// storefront's, and hands its trace context to the events it emits: in the
// transaction, SET LOCAL pg_outbox.traceparent and pg_outbox.tracestate
// (set_config(..., true)) before outbox_emit(). pg_outbox stores them in
// the events' headers, the relay passes them on in the stream entries, and
// the consumer starts its span as a child of this one.

import (
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"math/rand"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

const maxAttempts = 10

var errDeclined = errors.New("payment declined")

type order struct {
	OrderID     string  `json:"order_id"`
	Customer    *string `json:"customer"` // nil: a guest checkout, emitted without a key
	AmountCents int64   `json:"amount_cents"`
	eventID     string
}

// plan returns the orders of checkout n. Ids are made here, once, outside the
// retry loop: a retried transaction emits the same event ids as the attempt
// that rolled back.
func plan(n int) []order {
	customers := []*string{ptr("ann"), ptr("bob"), ptr("eve"), nil}
	customer := customers[(n/2)%len(customers)] // two checkouts in a row share a customer
	orders := make([]order, 1+n%3)
	for i := range orders {
		orders[i] = order{OrderID: newUUID(), eventID: newUUID(), Customer: customer, AmountCents: int64(100 + (n*37+i*11)%900)}
	}
	return orders
}

func ptr(s string) *string { return &s }

// retryable tells whether a retry can fix the error: the transaction lost a
// race, not an argument.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// storefront returns the context a checkout request came in with: a
// storefront's span, remote, with a tracestate entry of its own. (A web
// framework's instrumentation extracts it from the request's traceparent
// and tracestate headers.)
func storefront(ctx context.Context) context.Context {
	var traceID trace.TraceID
	var spanID trace.SpanID
	if _, err := crand.Read(traceID[:]); err != nil {
		panic(err)
	}
	if _, err := crand.Read(spanID[:]); err != nil {
		panic(err)
	}
	state, _ := trace.ParseTraceState("storefront=go")
	return trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled, TraceState: state, Remote: true,
	}))
}

// place places one checkout in one transaction and returns how often it was
// retried. traceContext (traceparent, tracestate; nil: untraced) goes to
// every event the transaction emits.
func place(ctx context.Context, pool *pgxpool.Pool, orders []order, decline bool, traceContext traceHeaders) (int, error) {
	customer := orders[0].Customer
	for attempt := 1; ; attempt++ {
		// BeginTxFunc commits when the function returns nil and rolls back
		// when it returns an error: the orders and their events go together.
		err := pool.BeginTxFunc(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
			for _, o := range orders {
				if _, err := tx.Exec(ctx, "INSERT INTO orders (id, customer, amount_cents) VALUES ($1, $2, $3)",
					o.OrderID, customer, o.AmountCents); err != nil {
					return err
				}
			}
			if customer != nil {
				// Every checkout of a customer updates this row: concurrent
				// ones collide, which REPEATABLE READ reports as 40001.
				if _, err := tx.Exec(ctx, "UPDATE customers SET orders_placed = orders_placed + $1 WHERE id = $2",
					len(orders), *customer); err != nil {
					return err
				}
			}
			if traceContext != nil {
				// Transaction-local (is_local true): it ends with the
				// transaction, and a pooled connection never hands it to the
				// next checkout.
				if _, err := tx.Exec(ctx, "SELECT set_config('pg_outbox.traceparent', $1, true), set_config('pg_outbox.tracestate', $2, true)",
					traceContext["traceparent"], traceContext["tracestate"]); err != nil {
					return err
				}
			}
			if len(orders) == 1 {
				// A map or struct for a jsonb parameter is marshalled by pgx.
				o := orders[0]
				if _, err := tx.Exec(ctx, "SELECT outbox_emit('orders', $1, $2, $3, $4)",
					customer, o, map[string]string{"source": "go"}, o.eventID); err != nil {
					return err
				}
			} else {
				// For jsonb[], pgx takes []string or [][]byte of JSON text, not
				// a slice of structs: marshal each element.
				var keys []string // nil: SQL NULL, no keys
				payloads := make([][]byte, len(orders))
				ids := make([]string, len(orders))
				for i, o := range orders {
					if customer != nil {
						keys = append(keys, *customer)
					}
					payload, err := json.Marshal(o)
					if err != nil {
						return err
					}
					payloads[i], ids[i] = payload, o.eventID
				}
				if _, err := tx.Exec(ctx, "SELECT count(*) FROM outbox_emit_many('orders', $1, $2, NULL, $3)",
					keys, payloads, ids); err != nil {
					return err
				}
			}
			if decline {
				return fmt.Errorf("%w for %d order(s)", errDeclined, len(orders))
			}
			return nil
		})
		if err == nil || !retryable(err) || attempt == maxAttempts {
			return attempt - 1, err
		}
		log.Printf("retrying checkout after %v, attempt %d", err, attempt)
		backoff := time.Duration(10<<attempt) * time.Millisecond
		if backoff > 500*time.Millisecond {
			backoff = 500 * time.Millisecond
		}
		time.Sleep(backoff/2 + time.Duration(rand.Int63n(int64(backoff/2))))
	}
}

func runOrders() error {
	ctx := context.Background()
	checkouts := envInt("ORDERS", 20)
	workers := envInt("WORKERS", 2)
	rejectEvery := envInt("REJECT_EVERY", 0)

	config, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	config.MaxConns = int32(workers)
	pool, err := pgxpool.ConnectConfig(ctx, config)
	if err != nil {
		return err
	}
	defer pool.Close()

	var (
		mu                                                   sync.Mutex
		committed, placed, declined, declinedOrders, retried int
		failure                                              error
		wg                                                   sync.WaitGroup
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(first int) {
			defer wg.Done()
			for n := first; n < checkouts; n += workers {
				orders := plan(n)
				decline := rejectEvery > 0 && n%rejectEvery == rejectEvery-1
				var span trace.Span
				var traceContext traceHeaders
				if n%3 != 1 {
					ids := make([]string, len(orders))
					for i, o := range orders {
						ids[i] = o.eventID
					}
					var spanCtx context.Context
					spanCtx, span = tracer("orders").Start(storefront(ctx), "checkout", trace.WithSpanKind(trace.SpanKindProducer),
						trace.WithAttributes(attribute.Int("checkout.number", n), attribute.String("messaging.destination.name", "orders"),
							attribute.StringSlice("event_ids", ids)))
					traceContext = inject(spanCtx)
				}
				retries, err := place(ctx, pool, orders, decline, traceContext)
				if span != nil {
					span.SetAttributes(attribute.Bool("committed", err == nil))
					if err != nil {
						span.SetStatus(codes.Error, err.Error())
					}
					span.End()
					flushSpans("orders")
				}
				mu.Lock()
				retried += retries
				switch {
				case err == nil:
					committed += len(orders)
					placed++
				case errors.Is(err, errDeclined):
					log.Printf("checkout %d rolled back: %v", n, err)
					declined++
					declinedOrders += len(orders)
				default:
					failure = err
				}
				mu.Unlock()
				if err != nil && !errors.Is(err, errDeclined) {
					return
				}
			}
		}(w)
	}
	wg.Wait()
	fmt.Printf("orders: committed %d orders in %d checkouts; declined %d checkouts (%d orders); retried %d\n",
		committed, placed, declined, declinedOrders, retried)
	return failure
}
