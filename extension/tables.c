/*-------------------------------------------------------------------------
 *
 * tables.c
 *	  Finding the tables of pg_outbox's schema.
 *
 * The bottom of the extension's layering, with tables.h: it calls no other
 * part of pg_outbox. The module entry point (pg_outbox.c) calls every
 * part's init function, so a lookup every part needs cannot live there
 * without each part depending on the entry point and the entry point on
 * each part.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "utils/lsyscache.h"

#include "tables.h"

/*
 * A relation of pg_outbox's schema, by name; an error says the extension is
 * not installed in this database when it is missing.
 */
Oid
OutboxRelid(const char *name)
{
	Oid			nspid = get_namespace_oid(OUTBOX_SCHEMA, true);
	Oid			relid = OidIsValid(nspid) ? get_relname_relid(name, nspid) : InvalidOid;

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pg_outbox is not installed in this database"),
				 errhint("Run CREATE EXTENSION pg_outbox.")));
	return relid;
}
