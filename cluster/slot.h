/* slot.h - the key slot of Redis Cluster: CRC16 (XMODEM: polynomial 0x1021,
 * initial value 0) of the key, or of its hash tag, modulo 16384. A hash tag
 * is what lies between the first '{' and the first '}' after it, when that
 * is not empty; keys sharing a tag share a slot. */
#ifndef FERRY_SLOT_H
#define FERRY_SLOT_H

#include <stddef.h>
#include <stdint.h>

#define CLUSTER_SLOTS 16384

/* CRC16-XMODEM of n bytes. */
uint16_t slot_crc16(const char *p, size_t n);
/* The slot of a key of n bytes (binary safe), 0..16383. */
int slot_of_key(const char *key, size_t n);
/* The smallest number whose decimal digits hash to slot, as "{N}" in out
 * (a key of that slot: a receipt that must lie in a transaction's slot);
 * its length, or -1 (slot out of range, or out too small). Any thread. */
int slot_tag_key(int slot, char *out, size_t len);

#endif
