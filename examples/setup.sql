-- The examples' two databases (the same for every language), run once by a superuser:
--   psql -v ON_ERROR_STOP=1 -d postgres -f examples/setup.sql
-- "shop" is the order service's database (the producer), "reports" the
-- reporting service's (the consumer). Each service logs in as its own role.

CREATE ROLE shop_app LOGIN;     -- the order service
CREATE ROLE relay LOGIN;        -- pg_outbox_relay publish
CREATE ROLE reports_app LOGIN;  -- the consumer
CREATE DATABASE shop;
CREATE DATABASE reports;

\connect shop
CREATE EXTENSION pg_outbox;
GRANT outbox_writer TO shop_app;
GRANT outbox_relay TO relay;

CREATE TABLE customers (
    id text PRIMARY KEY,
    orders_placed integer NOT NULL DEFAULT 0
);
CREATE TABLE orders (
    id uuid PRIMARY KEY,
    customer text REFERENCES customers,  -- NULL: a guest checkout
    amount_cents bigint NOT NULL CHECK (amount_cents > 0),
    placed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO customers (id) VALUES ('ann'), ('bob'), ('eve');
GRANT SELECT, INSERT ON orders TO shop_app;
GRANT SELECT, UPDATE ON customers TO shop_app;

-- The relay publishes topic "orders" to the stream outbox:orders.
SELECT outbox_group_create('shop-relay', ARRAY['orders']);

\connect reports
CREATE EXTENSION pg_outbox;
GRANT outbox_consumer TO reports_app;
-- The consumer name "reports" belongs to reports_app: no other role's
-- session may apply or dead-letter as "reports".
SELECT inbox_consumer_create('reports', 'reports_app');

-- The inbox consumer "reports" applies orders into these two tables.
-- applied_orders has no unique constraint on purpose: an order applied twice
-- would show up as two rows.
CREATE TABLE applied_orders (
    order_id uuid NOT NULL,
    event_id uuid NOT NULL,
    customer text,
    amount_cents bigint NOT NULL,
    entry_id text NOT NULL,
    source text,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE order_totals (
    customer text PRIMARY KEY,  -- '(guest)' for orders without a customer
    orders bigint NOT NULL,
    amount_cents bigint NOT NULL
);
GRANT SELECT, INSERT ON applied_orders TO reports_app;
GRANT SELECT, INSERT, UPDATE ON order_totals TO reports_app;
