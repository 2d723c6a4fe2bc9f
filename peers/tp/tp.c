/* The probes of tp.h, statically linked into the bench, and one plain C
 * function per tracepoint so that Rust can call it. Each function is what
 * an instrumented C program writes at the call site: the tracepoint macro,
 * whose disabled case is one load and a predicted branch. */
#define LTTNG_UST_TRACEPOINT_CREATE_PROBES
#define LTTNG_UST_TRACEPOINT_DEFINE
#include "tp.h"

void edgemark_peers_tp_id(uint64_t id)
{
    lttng_ust_tracepoint(edgemark_peers, id, id);
}

void edgemark_peers_tp_id_ts(uint64_t id, uint64_t ts)
{
    lttng_ust_tracepoint(edgemark_peers, id_ts, id, ts);
}

void edgemark_peers_tp_disabled(uint64_t id)
{
    lttng_ust_tracepoint(edgemark_peers, disabled, id);
}

/* Whether a session has enabled `id` (or `id_ts`) in this process yet: the
 * session daemon enables a tracepoint asynchronously after `lttng start`. */
int edgemark_peers_tp_id_enabled(void)
{
    return lttng_ust_tracepoint_enabled(edgemark_peers, id) != 0;
}

int edgemark_peers_tp_id_ts_enabled(void)
{
    return lttng_ust_tracepoint_enabled(edgemark_peers, id_ts) != 0;
}

int edgemark_peers_tp_disabled_enabled(void)
{
    return lttng_ust_tracepoint_enabled(edgemark_peers, disabled) != 0;
}
