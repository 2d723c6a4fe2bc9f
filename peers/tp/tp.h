/* The LTTng-UST tracepoint provider of the peers bench: three events of the
 * provider `edgemark_peers`. `id` carries one integer (LTTng stamps the
 * time); `id_ts` an integer and a timestamp read by the caller; `disabled`
 * is never enabled by the bench's session. */
#undef LTTNG_UST_TRACEPOINT_PROVIDER
#define LTTNG_UST_TRACEPOINT_PROVIDER edgemark_peers

#undef LTTNG_UST_TRACEPOINT_INCLUDE
#define LTTNG_UST_TRACEPOINT_INCLUDE "./tp.h"

#if !defined(EDGEMARK_PEERS_TP_H) || defined(LTTNG_UST_TRACEPOINT_HEADER_MULTI_READ)
#define EDGEMARK_PEERS_TP_H

#include <stdint.h>
#include <lttng/tracepoint.h>

LTTNG_UST_TRACEPOINT_EVENT(
    edgemark_peers, id,
    LTTNG_UST_TP_ARGS(uint64_t, id),
    LTTNG_UST_TP_FIELDS(lttng_ust_field_integer(uint64_t, id, id)))

LTTNG_UST_TRACEPOINT_EVENT(
    edgemark_peers, id_ts,
    LTTNG_UST_TP_ARGS(uint64_t, id, uint64_t, ts),
    LTTNG_UST_TP_FIELDS(
        lttng_ust_field_integer(uint64_t, id, id)
        lttng_ust_field_integer(uint64_t, ts, ts)))

LTTNG_UST_TRACEPOINT_EVENT(
    edgemark_peers, disabled,
    LTTNG_UST_TP_ARGS(uint64_t, id),
    LTTNG_UST_TP_FIELDS(lttng_ust_field_integer(uint64_t, id, id)))

#endif

#include <lttng/tracepoint-event.h>
