/*-------------------------------------------------------------------------
 *
 * shard.c
 *	  Which shard of a sharded group an event belongs to.
 *
 * A group with N shards splits the feed by (topic, key): every event of
 * one topic and key lies in the same shard, so that each shard, published
 * by its own relay, keeps the order of every key. The shard is
 *
 *	   CRC-32C(topic || 0x00 || key) mod N		for an event with a key,
 *	   CRC-32C(topic) mod N						for one without,
 *
 * over the bytes of the text as stored (the database encoding), CRC-32C
 * being the Castagnoli CRC of RFC 3720 (the check value of "123456789" is
 * 0xE3069283). The definition is part of pg_outbox's interface: it decides
 * order, so it is the same on every platform and in every version, and a
 * client may compute it with any CRC-32C library. Events without a key
 * share their topic's shard, in order with each other.
 *
 * outbox.shard_of(topic, key, shards) is the SQL face; the indexes that
 * read a shard's events in order are on that expression (outbox.event's
 * event_shards_<N>_idx).
 *
 * Layering: calls no other part of pg_outbox.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "port/pg_crc32c.h"
#include "utils/builtins.h"

#include "shard.h"

PG_FUNCTION_INFO_V1(outbox_shard_of);

int
OutboxShardOf(const char *topic, int topic_len, const char *key, int key_len, int shards)
{
	pg_crc32c	crc;

	Assert(shards >= 1);
	INIT_CRC32C(crc);
	COMP_CRC32C(crc, topic, topic_len);
	if (key != NULL)
	{
		static const char separator = '\0';

		COMP_CRC32C(crc, &separator, 1);
		COMP_CRC32C(crc, key, key_len);
	}
	FIN_CRC32C(crc);
	return (int) ((uint32) crc % (uint32) shards);
}

/*
 * outbox.shard_of(topic text, key text, shards integer) RETURNS integer
 *
 * NULL when the topic or the shard count is NULL; a NULL key is an event
 * without a key.
 */
Datum
outbox_shard_of(PG_FUNCTION_ARGS)
{
	text	   *topic;
	text	   *key = NULL;
	int32		shards;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(2))
		PG_RETURN_NULL();
	topic = PG_GETARG_TEXT_PP(0);
	if (!PG_ARGISNULL(1))
		key = PG_GETARG_TEXT_PP(1);
	shards = PG_GETARG_INT32(2);
	if (shards < 1 || shards > OUTBOX_MAX_SHARDS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a group has 1 to %d shards, not %d", OUTBOX_MAX_SHARDS, shards)));
	PG_RETURN_INT32(OutboxShardOf(VARDATA_ANY(topic), VARSIZE_ANY_EXHDR(topic),
								  key ? VARDATA_ANY(key) : NULL, key ? VARSIZE_ANY_EXHDR(key) : 0,
								  shards));
}
