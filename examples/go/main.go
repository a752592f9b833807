// Command shop is pg_outbox's Go example: an order service that emits events
// in its own transactions ("shop orders") and a reporting service that
// applies them from Redis exactly once through the inbox ("shop consumer").
// Both are configured by environment variables; see orders.go and consumer.go.
package main

import (
	"crypto/rand"
	"fmt"
	"log"
	"os"
	"strconv"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: shop orders|consumer")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "orders":
		log.SetPrefix("orders: ")
		err = runOrders()
	case "consumer":
		log.SetPrefix("consumer: ")
		err = runConsumer()
	default:
		fmt.Fprintln(os.Stderr, "usage: shop orders|consumer")
		os.Exit(2)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// env returns an environment variable, or def when it is unset.
func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// envInt returns an integer environment variable, or def when it is unset.
func envInt(name string, def int) int {
	v, ok := os.LookupEnv(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		log.Fatalf("%s: %v", name, err)
	}
	return n
}

// newUUID returns a random (version 4) UUID as text, which pgx sends to a
// uuid parameter as is.
func newUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
