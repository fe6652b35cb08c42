/* sentinel.h - finding and watching the master through Redis Sentinel
 * (not yet built: ferry follows a fixed redis.address for now). */
#ifndef FERRY_SENTINEL_H
#define FERRY_SENTINEL_H
#endif
