# pg_outbox: PGXS build of the extension, plus entry points for the whole
# project (tests, demo, benchmarks). The relay is built by CMakeLists.txt.

EXTENSION = pg_outbox pg_outbox_sql
EXTVERSION = $(shell sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" pg_outbox.control)

MODULE_big = pg_outbox
OBJS = \
	extension/pg_outbox.o \
	extension/tables.o \
	extension/emit.o \
	extension/trace.o \
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
	extension/keyed.o \
	extension/inbox.o \
	extension/wakeup.o \
	extension/xact.o \
	extension/worker.o

# Two engines behind one API, two extensions: pg_outbox (the C engine, with
# pg_outbox.so) and pg_outbox_sql (the SQL engine: SQL and PL/pgSQL only,
# for servers where no C extension may be installed). Their install
# scripts are built from the same parts of sql/install/, each with its
# engine's functions from sql/engine/c/ or sql/engine/sql/ (below), and
# sql/pg_outbox_sql.sql is the SQL engine as a plain script, for psql -f.
#
# The install script and the upgrade scripts to this version are built
# from sql/install/ and sql/upgrade/ (below). The SQL engine has no
# version before 0.2.0, so no upgrade script yet.
UPGRADE_PARTS = $(sort $(wildcard sql/upgrade/*--*.sql))
UPGRADE_SCRIPTS = $(patsubst sql/upgrade/%,sql/pg_outbox--%,$(UPGRADE_PARTS))
DATA_built = sql/pg_outbox--$(EXTVERSION).sql sql/pg_outbox_sql--$(EXTVERSION).sql $(UPGRADE_SCRIPTS)
# The scripts of released versions, frozen: their install scripts (kept so
# that an older version can be installed and updated, as the upgrade test
# does) and the upgrade scripts between them.
DATA = $(wildcard sql/released/pg_outbox--*.sql)

# The tests are files, not list entries: a pg_regress test is
# test/sql/NAME.sql with its expected output test/expected/NAME.out, an
# isolation spec test/specs/NAME.spec with test/expected/NAME.out. Adding
# one is adding its two files: make installcheck runs every test of
# test/sql/ (in one database, in name order, install first: what CREATE
# EXTENSION made, and drop last: it drops and re-creates the extension)
# and every spec of test/specs/ (in name order), except those named in the
# lists below, each of which says what its tests need. A new test that
# needs one of these goes into the list by its name; every test also
# passes alone (make installcheck REGRESS=NAME ISOLATION=, or
# test/private_pg.sh run NAME).
#
# Tests that need pg_outbox in shared_preload_libraries (the commit order):
# make installcheck-preload, against a server that preloads it.
PRELOAD_REGRESS = commit_order shards_commit skip_commit
PRELOAD_ISOLATION = commit_inversion commit_open_tx commit_abort_gap commit_window

# The conformance suite: the same tests on the SQL engine (make
# installcheck-sql-engine), from copies in test/engine_sql/ that name the
# extension pg_outbox_sql and show no error's CONTEXT (PL/pgSQL adds its
# line numbers where C has none); the expected output is the same. The tests
# of what only the C engine has are left out here (they stay in REGRESS
# and ISOLATION, for the C engine); each shows an item of docs/engines.md's
# list of the engines' differences ("Where the engines differ"), which
# gives the reason. The SQL engine's own refusals are tested in
# SQL_ENGINE_REGRESS and SQL_ENGINE_ISOLATION (run only there). The commit
# order's tests (PRELOAD_REGRESS, PRELOAD_ISOLATION) are the C engine's
# too: the SQL engine refuses commit-ordered groups (test/sql/engine_sql.sql).
#   engine_c: the settings as configuration parameters of pg_outbox.so
#     (checked when set, superuser-only), the fetch's memory context, and
#     the functions the SQL engine runs as the extension's owner, run here
#     as their caller.
#   inbox_context: the handler's error context line, which PL/pgSQL cannot
#     add.
C_ONLY_REGRESS = engine_c inbox_context
C_ONLY_ISOLATION =
SQL_ENGINE_REGRESS = engine_sql inbox_sql_engine
SQL_ENGINE_ISOLATION = engine_sql_notify

REGRESS_FIRST = install
REGRESS_LAST = drop
ALL_REGRESS = $(sort $(patsubst test/sql/%.sql,%,$(wildcard test/sql/*.sql)))
ALL_ISOLATION = $(sort $(patsubst test/specs/%.spec,%,$(wildcard test/specs/*.spec)))
REGRESS = $(REGRESS_FIRST) \
	$(filter-out $(REGRESS_FIRST) $(REGRESS_LAST) $(PRELOAD_REGRESS) $(SQL_ENGINE_REGRESS),$(ALL_REGRESS)) \
	$(REGRESS_LAST)
REGRESS_OPTS = --inputdir=test --outputdir=test --load-extension=pg_outbox
# Specs whose setup or teardown truncates the event table wait for the
# maintenance lock first: on a preloaded cluster a background maintenance run
# could otherwise deadlock with the TRUNCATE.
ISOLATION = $(filter-out $(PRELOAD_ISOLATION) $(SQL_ENGINE_ISOLATION),$(ALL_ISOLATION))
ISOLATION_OPTS = --inputdir=test --outputdir=test/isolation --load-extension=pg_outbox

SHARED_REGRESS = $(filter-out $(C_ONLY_REGRESS),$(REGRESS))
SHARED_ISOLATION = $(filter-out $(C_ONLY_ISOLATION),$(ISOLATION))

EXTRA_CLEAN = test/engine_sql sql/c_engine.parts sql/pg_outbox_sql.sql sql/pg_outbox_sql.pgtle.sql test/results test/isolation test/regression.diffs test/regression.out

PG_CPPFLAGS = -Wall -Wmissing-prototypes -Wpointer-arith -Wendif-labels

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
ifneq ($(PGXS),)
include $(PGXS)
# The SQL engine's other two shapes (below): built, not installed.
all: sql/pg_outbox_sql.sql sql/pg_outbox_sql.pgtle.sql
else
# PGXS is not installed yet: scripts/test.sh and scripts/demo.sh install it.
all:
	@echo "pg_config not found: run scripts/test.sh (installs postgresql-server-dev-15)" >&2
	@exit 1
endif

# The install script is built from its parts in sql/install/, concatenated
# in name order (00_schema_roles.sql first), with the engine's functions put
# in by sql/engine.awk. The directories are prerequisites too, so that
# adding, removing or renaming a part rebuilds the script.
SQL_PARTS = $(sort $(wildcard sql/install/*.sql))
C_ENGINE_PARTS = $(wildcard sql/engine/c/*.sql)
SQL_ENGINE_PARTS = $(wildcard sql/engine/sql/*.sql)

# Every script, install or upgrade, starts with sql/preamble.sql (what the
# script resolves, who may own the extension's schema) right after its
# \echo guard: written once, put there by make.
AFTER_GUARD = sed -e '/^\\echo .*\\quit$$/r sql/preamble.sql'

# The parts with the C engine's functions: the install script's body, and
# what sql/upgrade.awk takes the functions from.
sql/c_engine.parts: $(SQL_PARTS) sql/install sql/engine.awk $(C_ENGINE_PARTS) sql/engine/c
	$(AWK) -v engine=c -v version=$(EXTVERSION) -f sql/engine.awk $(SQL_PARTS) > $@.tmp
	mv $@.tmp $@

sql/pg_outbox--$(EXTVERSION).sql: sql/c_engine.parts sql/preamble.sql
	$(AFTER_GUARD) sql/c_engine.parts > $@.tmp
	mv $@.tmp $@

# The SQL engine's script names its extension in the \echo guard.
sql/pg_outbox_sql--$(EXTVERSION).sql: $(SQL_PARTS) sql/install sql/engine.awk $(SQL_ENGINE_PARTS) sql/engine/sql sql/preamble.sql
	$(AWK) -v engine=sql -v version=$(EXTVERSION) -f sql/engine.awk $(SQL_PARTS) \
		| sed -e 's/^\(\\echo Use "CREATE EXTENSION pg_outbox\)"/\1_sql"/' \
		| $(AFTER_GUARD) > $@.tmp
	mv $@.tmp $@

# The SQL engine as a plain script, for a server where no extension can be
# installed (a managed service): psql -f sql/pg_outbox_sql.sql, by a role
# with CREATE on the database and CREATEROLE. It is the extension's script
# with what only CREATE EXTENSION allows taken out: no \echo guard, the API
# in schema outbox (there is no extension's schema: a role that does not
# own public can still install it), no pg_extension_config_dump() (there is
# no extension whose dump could leave a table's rows out; pg_dump dumps them
# all). It sets what CREATE EXTENSION sets for a script: function bodies
# are checked when called, not when created (a function may name a table
# that a later part makes), and notices are not shown. It runs in one
# transaction of its own, BEGIN to COMMIT, so that an error, with or
# without ON_ERROR_STOP, leaves nothing half-installed.
SQL_ENGINE_TITLE = pg_outbox $(EXTVERSION), SQL engine (SQL and PL/pgSQL only)

sql/pg_outbox_sql.sql: sql/pg_outbox_sql--$(EXTVERSION).sql
	{ echo '-- $(SQL_ENGINE_TITLE), as a plain script: built by make from'; \
	  echo '-- sql/pg_outbox_sql--$(EXTVERSION).sql. For a server where no extension can be installed:'; \
	  echo '--   psql -v ON_ERROR_STOP=1 -d DATABASE -f pg_outbox_sql.sql'; \
	  echo '-- as a role with CREATE on the database and CREATEROLE (or once the roles'; \
	  echo '-- outbox_writer, outbox_relay, outbox_consumer and outbox_admin exist). The API'; \
	  echo '-- is in schema outbox: call outbox.outbox_emit(...), or put outbox on the'; \
	  echo '-- search_path. One transaction: an error leaves nothing installed.'; \
	  echo 'BEGIN;'; \
	  echo 'SET LOCAL check_function_bodies = off;'; \
	  echo 'SET LOCAL client_min_messages = warning;'; \
	  sed -e '/^\\echo .*\\quit$$/d' -e 's/@extschema@/outbox/g' \
	      -e '/^SELECT pg_catalog\.pg_extension_config_dump(.*);$$/d' $<; \
	  echo 'COMMIT;'; } > $@.tmp
	@if grep -n '@extschema@\|pg_extension_config_dump\|^\\' $@.tmp | grep -v '^[0-9]*:--'; then \
		echo "$@: the lines above need CREATE EXTENSION" >&2; rm -f $@.tmp; exit 1; fi
	mv $@.tmp $@

# The SQL engine shaped for pg_tle (where a managed service offers it):
# the extension's script, without its \echo guard, given to
# pgtle.install_extension() in one dollar-quoted string, whose tag the
# script must not contain. test/sql_engine_scripts.sh checks what pg_tle
# takes (no backslash command, no C, no superuser-only statement, the
# extension's schema as @extschema@).
PGTLE_TAG = $$_pg_outbox_sql_$$
PGTLE_COMMENT = $(subst ','',$(shell sed -n "s/^comment[[:space:]]*=[[:space:]]*'\(.*\)'[[:space:]]*$$/\1/p" pg_outbox_sql.control))

sql/pg_outbox_sql.pgtle.sql: sql/pg_outbox_sql--$(EXTVERSION).sql pg_outbox_sql.control
	@if grep -qF '$(PGTLE_TAG)' $<; then \
		echo "$@: $< contains the dollar tag $(PGTLE_TAG)" >&2; exit 1; fi
	{ echo '-- $(SQL_ENGINE_TITLE), for pg_tle: built by make from'; \
	  echo '-- sql/pg_outbox_sql--$(EXTVERSION).sql. Run as a member of pgtle_admin, then'; \
	  echo '-- CREATE EXTENSION pg_outbox_sql in each database, as a role with CREATEROLE.'; \
	  echo "SELECT pgtle.install_extension('pg_outbox_sql', '$(EXTVERSION)', '$(PGTLE_COMMENT)', "'$(PGTLE_TAG)'; \
	  sed -e '/^\\echo .*\\quit$$/d' $<; \
	  echo '$(PGTLE_TAG));'; } > $@.tmp
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
# in sql/released/ and its hand part removed (CONTRIBUTING.md: "Releasing version B").
AWK ?= awk

ifneq ($(filter-out %--$(EXTVERSION).sql,$(UPGRADE_PARTS)),)
$(error $(filter-out %--$(EXTVERSION).sql,$(UPGRADE_PARTS)): a hand part of an update to another version than $(EXTVERSION); freeze its built script in sql/released/ and remove it)
endif

sql/pg_outbox--%--$(EXTVERSION).sql: sql/upgrade/%--$(EXTVERSION).sql sql/released/pg_outbox--%.sql sql/upgrade.awk sql/c_engine.parts sql/preamble.sql
	$(AWK) -f sql/upgrade.awk sql/released/pg_outbox--$*.sql $< sql/c_engine.parts > $@.body
	$(AFTER_GUARD) $@.body > $@.tmp
	rm $@.body
	mv $@.tmp $@

.PHONY: test check-fast demo bench soak checkver installcheck-preload installcheck-sql-engine deb docs

# Everything on a fresh Debian 12 machine: packages, build, throwaway servers, tests.
test:
	./scripts/test.sh

# What a contributor runs before each commit, in minutes, with no system
# install: the tests of ctest's label fast (scripts/check_fast.sh).
check-fast:
	./scripts/check_fast.sh

# make print-NAME prints a variable (the lists of tests, for scripts).
print-%:
	@echo '$($*)'

demo:
	./scripts/demo.sh

# Debian packages of the extension and the relay, into build/deb/.
deb:
	./scripts/deb.sh

installcheck-preload:
	$(MAKE) installcheck REGRESS="$(PRELOAD_REGRESS)" ISOLATION="$(PRELOAD_ISOLATION)"

ENGINE_SQL_DIR = test/engine_sql
ENGINE_SQL_SED = -e 's/EXTENSION pg_outbox\b/EXTENSION pg_outbox_sql/g' -e "s/extname = 'pg_outbox'/extname = 'pg_outbox_sql'/g" \
	-e 's/extension "pg_outbox"/extension "pg_outbox_sql"/g'

# Its pg_regress tests alone: make installcheck-sql-engine ISOLATION=
# SQL_ENGINE_ISOLATION=; its specs alone: REGRESS= SQL_ENGINE_REGRESS=.
installcheck-sql-engine:
	rm -rf $(ENGINE_SQL_DIR)
	mkdir -p $(ENGINE_SQL_DIR)/sql $(ENGINE_SQL_DIR)/expected $(ENGINE_SQL_DIR)/specs
	for t in $(SHARED_REGRESS); do \
		{ echo '\set SHOW_CONTEXT never'; sed $(ENGINE_SQL_SED) test/sql/$$t.sql; } > $(ENGINE_SQL_DIR)/sql/$$t.sql && \
		{ echo '\set SHOW_CONTEXT never'; sed $(ENGINE_SQL_SED) test/expected/$$t.out; } > $(ENGINE_SQL_DIR)/expected/$$t.out || exit 1; \
	done
	for t in $(SQL_ENGINE_REGRESS); do \
		cp test/sql/$$t.sql $(ENGINE_SQL_DIR)/sql/ && cp test/expected/$$t.out $(ENGINE_SQL_DIR)/expected/ || exit 1; \
	done
	for t in $(SQL_ENGINE_ISOLATION); do \
		cp test/specs/$$t.spec $(ENGINE_SQL_DIR)/specs/ && cp test/expected/$$t.out $(ENGINE_SQL_DIR)/expected/ || exit 1; \
	done
	for t in $(SHARED_ISOLATION); do \
		sed $(ENGINE_SQL_SED) test/specs/$$t.spec > $(ENGINE_SQL_DIR)/specs/$$t.spec && \
		sed $(ENGINE_SQL_SED) test/expected/$$t.out > $(ENGINE_SQL_DIR)/expected/$$t.out || exit 1; \
	done
ifneq ($(strip $(SHARED_REGRESS) $(SQL_ENGINE_REGRESS)),)
	$(pg_regress_installcheck) --inputdir=$(ENGINE_SQL_DIR) --outputdir=$(ENGINE_SQL_DIR) --load-extension=pg_outbox_sql \
		$(SHARED_REGRESS) $(SQL_ENGINE_REGRESS)
endif
ifneq ($(strip $(SHARED_ISOLATION) $(SQL_ENGINE_ISOLATION)),)
	$(pg_isolation_regress_installcheck) --inputdir=$(ENGINE_SQL_DIR) --outputdir=$(ENGINE_SQL_DIR)/isolation \
		--load-extension=pg_outbox_sql $(SHARED_ISOLATION) $(SQL_ENGINE_ISOLATION)
endif

# The documentation site, offline, into build/docs/ (open
# build/docs/index.html): README.md and docs/ staged into build/docs-src
# (scripts/docs/stage.py), then Debian's mkdocs (mkdocs.yml), warnings as
# errors. test/docs_site.sh also opens it in Chromium.
docs:
	python3 scripts/docs/stage.py >/dev/null
	PYTHONPATH=scripts/docs mkdocs build --strict

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
		{ echo "META.json version does not match pg_outbox.control ($(EXTVERSION))" >&2; exit 1; }
	@head -n 1 debian/changelog | grep -q '^pg-outbox ($(EXTVERSION)) ' || \
		{ echo "debian/changelog's latest version does not match pg_outbox.control ($(EXTVERSION))" >&2; exit 1; }
	@echo "version $(EXTVERSION) consistent"
