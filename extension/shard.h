/*-------------------------------------------------------------------------
 *
 * shard.h
 *	  Which shard of a sharded group an event belongs to (shard.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_SHARD_H
#define OUTBOX_SHARD_H

/* Shards a group may have, at most. */
#define OUTBOX_MAX_SHARDS	256

/*
 * The shard, in [0, shards), of an event of "topic" with "key" (NULL: no
 * key); lengths in bytes.
 */
extern int	OutboxShardOf(const char *topic, int topic_len, const char *key, int key_len, int shards);

#endif							/* OUTBOX_SHARD_H */
