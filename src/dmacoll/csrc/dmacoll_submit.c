/* dmacoll native submission: issue a collective's pre-built list of driver commands in one call
 * from Python, so an eager call pays one foreign call instead of one Python-level driver call
 * per copy, flag and event.
 *
 * The driver entry points come from the caller (cuGetProcAddress in backends/native.py, or test
 * doubles on a CPU machine), so this file needs no CUDA headers and builds with any C compiler:
 *     cc -O2 -std=c11 -shared -fPIC dmacoll_submit.c -o libdmacoll_submit.so
 */
#include <stddef.h>
#include <stdint.h>

#define DMACOLL_SUBMIT_ABI 1

/* The CUDA driver signatures (CUresult is an int, handles are pointers, CUdeviceptr is 64-bit). */
typedef int (*copy_fn)(uint64_t dst, uint64_t src, size_t nbytes, void *stream);
typedef int (*value_fn)(void *stream, uint64_t addr, uint32_t value, unsigned int flags);
typedef int (*record_fn)(void *event, void *stream);
typedef int (*wait_event_fn)(void *stream, void *event, unsigned int flags);

struct dmacoll_api {
    copy_fn copy;             /* cuMemcpyAsync */
    value_fn write_value;     /* cuStreamWriteValue32 */
    value_fn wait_value;      /* cuStreamWaitValue32 */
    record_fn record;         /* cuEventRecord */
    wait_event_fn wait_event; /* cuStreamWaitEvent */
};

enum { CMD_COPY = 0, CMD_WRITE = 1, CMD_WAIT = 2, CMD_RECORD = 3, CMD_WAIT_EVENT = 4 };

struct dmacoll_cmd {
    int32_t kind;
    int32_t use_epoch; /* memops of sync='epoch': the value is the call's sequence number */
    void *stream;
    void *event;
    uint64_t dst;      /* copy destination, or the flag word of a memop */
    uint64_t src;
    uint64_t nbytes;
    uint32_t value;
    uint32_t flags;
};

int dmacoll_submit_abi(void) { return DMACOLL_SUBMIT_ABI; }

size_t dmacoll_cmd_size(void) { return sizeof(struct dmacoll_cmd); }

/* Issues cmds[0..n) in order. Returns 0, or the first failing driver result with *failed set to
 * that command's index (the commands before it were issued). */
int dmacoll_submit(const struct dmacoll_api *api, const struct dmacoll_cmd *cmds, int n, uint32_t epoch,
                   int *failed) {
    for (int i = 0; i < n; i++) {
        const struct dmacoll_cmd *c = &cmds[i];
        uint32_t value = c->use_epoch ? epoch : c->value;
        int rc;
        switch (c->kind) {
        case CMD_COPY: rc = api->copy(c->dst, c->src, (size_t)c->nbytes, c->stream); break;
        case CMD_WRITE: rc = api->write_value(c->stream, c->dst, value, c->flags); break;
        case CMD_WAIT: rc = api->wait_value(c->stream, c->dst, value, c->flags); break;
        case CMD_RECORD: rc = api->record(c->event, c->stream); break;
        case CMD_WAIT_EVENT: rc = api->wait_event(c->stream, c->event, c->flags); break;
        default: rc = -1; break; /* a malformed list: never issue past it */
        }
        if (rc != 0) {
            *failed = i;
            return rc;
        }
    }
    return 0;
}
