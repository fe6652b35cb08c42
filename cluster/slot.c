/* slot.c - the cluster key slot: CRC16-XMODEM with hash tags (slot.h). */
#include "slot.h"

#include <string.h>

uint16_t slot_crc16(const char *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)((uint16_t)(unsigned char)p[i] << 8);
        for (int b = 0; b < 8; b++) {
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
        }
    }
    return crc;
}

int slot_of_key(const char *key, size_t n)
{
    const char *open = n > 0 ? memchr(key, '{', n) : NULL;
    if (open != NULL) {
        size_t start = (size_t)(open - key) + 1;
        const char *close = memchr(key + start, '}', n - start);
        /* "{}" is no tag: the whole key is hashed. */
        if (close != NULL && close > key + start) {
            return slot_crc16(key + start, (size_t)(close - (key + start))) & (CLUSTER_SLOTS - 1);
        }
    }
    return slot_crc16(key, n) & (CLUSTER_SLOTS - 1);
}
