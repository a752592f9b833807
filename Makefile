# pg_outbox: PGXS build of the extension, plus entry points for the whole
# project (tests, demo, benchmarks). The relay is built by CMakeLists.txt.

EXTENSION = pg_outbox
EXTVERSION = $(shell sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" $(EXTENSION).control)

MODULE_big = pg_outbox
OBJS = \
	extension/pg_outbox.o \
	extension/tables.o \
	extension/emit.o \
	extension/writer.o \
	extension/fetch.o \
	extension/fetch_010.o \
	extension/advance.o \
	extension/group.o \
	extension/feed.o \
	extension/position.o \
	extension/shard.o \
	extension/pack.o \
	extension/commit.o \
	extension/lead.o \
	extension/locks.o \
	extension/consume.o \
	extension/inbox.o \
	extension/wakeup.o \
	extension/xact.o \
	extension/worker.o

# The install script and the upgrade scripts to this version are built
# from sql/install/ and sql/upgrade/ (below).
UPGRADE_PARTS = $(sort $(wildcard sql/upgrade/*--*.sql))
UPGRADE_SCRIPTS = $(patsubst sql/upgrade/%,sql/$(EXTENSION)--%,$(UPGRADE_PARTS))
DATA_built = sql/$(EXTENSION)--$(EXTVERSION).sql $(UPGRADE_SCRIPTS)
# The scripts of released versions, frozen: their install scripts (kept so
# that an older version can be installed and updated, as the upgrade test
# does) and the upgrade scripts between them.
DATA = $(wildcard sql/released/$(EXTENSION)--*.sql)

REGRESS = install emit emit_errors emit_drivers groups group_names feed group_ops packed skip privileges explain inbox inbox_entries inbox_consumers maintain drop
REGRESS_OPTS = --inputdir=test --outputdir=test --load-extension=$(EXTENSION)
# Specs whose setup or teardown truncates the event table wait for the
# maintenance lock first: on a preloaded cluster a background maintenance run
# could otherwise deadlock with the TRUNCATE.
ISOLATION = xid_order emit_ids abort_savepoint open_tx prepared two_relays inbox_race inbox_isolation maintain_concurrent rewind_leader holders_privacy lease
ISOLATION_OPTS = --inputdir=test --outputdir=test/isolation --load-extension=$(EXTENSION)

# Tests that need pg_outbox in shared_preload_libraries (the commit order):
# make installcheck-preload, against a server that preloads it.
PRELOAD_REGRESS = commit_order shards skip_commit
PRELOAD_ISOLATION = commit_inversion commit_open_tx commit_abort_gap commit_window

EXTRA_CLEAN = test/results test/isolation test/regression.diffs test/regression.out

PG_CPPFLAGS = -Wall -Wmissing-prototypes -Wpointer-arith -Wendif-labels

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
ifneq ($(PGXS),)
include $(PGXS)
else
# PGXS is not installed yet: scripts/test.sh and scripts/demo.sh install it.
all:
	@echo "pg_config not found: run scripts/test.sh (installs postgresql-server-dev-15)" >&2
	@exit 1
endif

# The install script is built from its parts in sql/install/, concatenated
# in name order (00_schema_roles.sql first). The directory is a prerequisite
# too, so that adding, removing or renaming a part rebuilds the script.
SQL_PARTS = $(sort $(wildcard sql/install/*.sql))

# Every script, install or upgrade, starts with sql/preamble.sql (what the
# script resolves, who may own the extension's schema) right after its
# \echo guard: written once, put there by make.
AFTER_GUARD = sed -e '/^\\echo .*\\quit$$/r sql/preamble.sql'

sql/$(EXTENSION)--$(EXTVERSION).sql: $(SQL_PARTS) sql/install sql/preamble.sql
	$(AFTER_GUARD) $(SQL_PARTS) > $@.tmp
	mv $@.tmp $@

# An upgrade script, as PgQ builds its own: the schema changes are written
# by hand in sql/upgrade/A--B.sql, the functions come from the install
# parts. sql/upgrade.awk puts every function of sql/install/*.sql (with its
# comment and privileges) where the hand part has its line
# "-- @functions@", as CREATE OR REPLACE when version A (its install
# script in sql/released/) has it, and fails when the hand part defines a
# function itself. So a function changed in sql/install/ needs nothing in
# sql/upgrade/; a table, column or signature changed does (test/ops/upgrade.sh
# compares an updated database with a fresh install). The hand parts are
# those of updates to this version: on release, the built script is frozen
# in sql/released/ and its hand part removed (README: "Releasing version B").
AWK ?= awk

ifneq ($(filter-out %--$(EXTVERSION).sql,$(UPGRADE_PARTS)),)
$(error $(filter-out %--$(EXTVERSION).sql,$(UPGRADE_PARTS)): a hand part of an update to another version than $(EXTVERSION); freeze its built script in sql/released/ and remove it)
endif

sql/$(EXTENSION)--%--$(EXTVERSION).sql: sql/upgrade/%--$(EXTVERSION).sql sql/released/$(EXTENSION)--%.sql sql/upgrade.awk $(SQL_PARTS) sql/install sql/preamble.sql
	$(AWK) -f sql/upgrade.awk sql/released/$(EXTENSION)--$*.sql $< $(SQL_PARTS) > $@.body
	$(AFTER_GUARD) $@.body > $@.tmp
	rm $@.body
	mv $@.tmp $@

.PHONY: test demo bench soak checkver installcheck-preload deb

# Everything on a fresh Debian 12 machine: packages, build, throwaway servers, tests.
test:
	./scripts/test.sh

demo:
	./scripts/demo.sh

# Debian packages of the extension and the relay, into build/deb/.
deb:
	./scripts/deb.sh

installcheck-preload:
	$(MAKE) installcheck REGRESS="$(PRELOAD_REGRESS)" ISOLATION="$(PRELOAD_ISOLATION)"

# Benchmarks on throwaway servers; they print tables (see bench/README.md).
bench:
	./bench/run.sh

# The fault-injecting soak test with its history checker (SOAK_SECONDS,
# SOAK_ORDERING, SOAK_MODE).
soak:
	./test/soak/soak.sh

# The version lives in the control file; META.json and the Debian
# changelog's latest entry must agree.
checkver:
	@grep -q '"version": "$(EXTVERSION)"' META.json || \
		{ echo "META.json version does not match $(EXTENSION).control ($(EXTVERSION))" >&2; exit 1; }
	@head -n 1 debian/changelog | grep -q '^pg-outbox ($(EXTVERSION)) ' || \
		{ echo "debian/changelog's latest version does not match $(EXTENSION).control ($(EXTVERSION))" >&2; exit 1; }
	@echo "version $(EXTVERSION) consistent"
