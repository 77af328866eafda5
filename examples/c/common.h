/*
 * Shared by the C examples (pingpong.c, write_bw.c, submit_service.c):
 * reporting a failed call, polling a CQ, opening the device `--device`
 * names, connecting two QPs that live on one device, and describing what
 * a figure was measured on.
 *
 * Without `--device` an example runs on the in-process software HCA
 * (rdd_device_open_soft). With `--device NAME` it opens that kernel RDMA
 * device (rdd_device_open_verbs), which needs a library built with the
 * `verbs` feature (`FEATURES=verbs scripts/install.sh`); any other build
 * answers RDD_STATUS_UNSUPPORTED, and the example says so and exits 2.
 *
 * Everything here is `static inline`, so an example that does not use a
 * function gets no unused-function warning. Include it after defining
 * _POSIX_C_SOURCE (the examples use clock_gettime, sysconf, sched_yield
 * and opendir).
 */
#ifndef RDD_EXAMPLE_COMMON_H
#define RDD_EXAMPLE_COMMON_H

#include <rdma_direct.h>

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The program name every message starts with; set by main. */
static const char *ex_prog = "example";

/* Prints "PROG: what: <the library's message> (status N)" and exits 1. */
static inline void ex_fail(const char *what, rdd_status s)
{
    char msg[160];
    size_t n = 0;
    if (rdd_status_str((uint32_t)s, msg, sizeof(msg), &n) != RDD_STATUS_OK) {
        strcpy(msg, "?");
    }
    fprintf(stderr, "%s: %s: %s (status %u)\n", ex_prog, what, msg, (unsigned)s);
    exit(1);
}

#define TRY(call)                                                                        \
    do {                                                                                 \
        rdd_status try_s_ = (call);                                                      \
        if (try_s_ != RDD_STATUS_OK) {                                                   \
            ex_fail(#call, try_s_);                                                      \
        }                                                                                \
    } while (0)

/* Polls up to `n` completions of `cq` with the one-handle poll
 * (rdd_cq_poll_n: the CQ knows its QPs, no list to pass) and returns how
 * many; a failure (a negative -status) exits with the library's message. */
static inline size_t ex_poll(rdd_cq *cq, rdd_wc *wc, uint32_t n)
{
    int32_t got = rdd_cq_poll_n(cq, wc, n);
    if (got < 0) {
        ex_fail("rdd_cq_poll_n", (rdd_status)(uint32_t)-got);
    }
    return (size_t)got;
}

/* Prints the kernel's RDMA devices (the names /sys/class/infiniband has)
 * to stderr, for an error message. */
static inline void ex_list_devices(void)
{
    DIR *d = opendir("/sys/class/infiniband");
    struct dirent *e;
    int any = 0;
    if (d != NULL) {
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') {
                continue;
            }
            fprintf(stderr, "%s%s", any ? ", " : "devices here: ", e->d_name);
            any = 1;
        }
        closedir(d);
    }
    fprintf(stderr, "%s\n", any ? "" : "this host has no RDMA device (/sys/class/infiniband)");
}

/* Opens the software device (`name` NULL) or the kernel device `name`;
 * exits with a message that says why when it cannot. */
static inline rdd_device *ex_open_device(const char *name)
{
    rdd_device *dev = NULL;
    rdd_status s;
    if (name == NULL) {
        TRY(rdd_device_open_soft(NULL, &dev));
        return dev;
    }
    s = rdd_device_open_verbs(name, &dev);
    if (s == RDD_STATUS_UNSUPPORTED) {
        fprintf(stderr,
                "%s: --device %s: this librdma_direct was built without the verbs backend\n"
                "%s:   (rdd_device_open_verbs says UNSUPPORTED). Kernel RDMA devices need a\n"
                "%s:   verbs-enabled library: FEATURES=verbs scripts/install.sh, then build with\n"
                "%s:   cc ... $(pkg-config --cflags --libs --static rdma-direct)\n",
                ex_prog, name, ex_prog, ex_prog, ex_prog);
        exit(2);
    }
    if (s == RDD_STATUS_NO_DEVICE) {
        fprintf(stderr, "%s: --device %s: no RDMA device of that name; ", ex_prog, name);
        ex_list_devices();
        exit(2);
    }
    if (s != RDD_STATUS_OK) {
        ex_fail("rdd_device_open_verbs", s);
    }
    return dev;
}

/* Whether `name` is an iWARP device (node type 4, RNIC, in sysfs). */
static inline int ex_is_iwarp(const char *name)
{
    char path[256];
    char type[8] = {0};
    FILE *f;
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/node_type", name);
    f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    if (fgets(type, sizeof(type), f) == NULL) {
        type[0] = '\0';
    }
    fclose(f);
    return type[0] == '4';
}

/* Connects `a` and `b` (both in RESET, on one device) to each other:
 * each gets the other's rdd_qp_info, as it would out of band between two
 * hosts. On RoCE the GID in that info is the one the device was opened
 * with (the IPv4 RoCEv2 entry: rdd_device_open_verbs picks it; the C API
 * has no GID index to choose), and the peer addresses its packets to it.
 * `attr_a` and `attr_b` grant remote access to the peer (NULL: none).
 * `*out_info_a` gets `a`'s connection data (its GID, for the report).
 * iWARP (siw) connects only through rdma_cm, which the C API does not
 * offer: rdd_qp_connect answers UNSUPPORTED, and this says so and exits 2. */
static inline void ex_connect_pair(const char *device, rdd_qp *a, rdd_qp *b,
                                   const rdd_connect_attr *attr_a,
                                   const rdd_connect_attr *attr_b, rdd_qp_info *out_info_a)
{
    rdd_qp_info ia, ib;
    rdd_status s;
    TRY(rdd_qp_query_info(a, &ia));
    TRY(rdd_qp_query_info(b, &ib));
    *out_info_a = ia;
    s = rdd_qp_connect(a, &ib, attr_a);
    if (s == RDD_STATUS_UNSUPPORTED && device != NULL) {
        fprintf(stderr,
                "%s: --device %s: rdd_qp_connect says UNSUPPORTED%s:\n"
                "%s:   iWARP QPs connect only through rdma_cm, which the C API does not offer\n"
                "%s:   yet. Use a RoCE or InfiniBand device (rxe0, mlx5_0), or the Rust\n"
                "%s:   example, which connects through rdma_cm on iWARP\n",
                ex_prog, device, ex_is_iwarp(device) ? " (an iWARP device)" : "", ex_prog,
                ex_prog, ex_prog);
        exit(2);
    }
    if (s != RDD_STATUS_OK) {
        ex_fail("rdd_qp_connect", s);
    }
    TRY(rdd_qp_connect(b, &ia, attr_b));
}

/* A GID as sysfs shows it (8 groups of 4 hex digits), into `out`. */
static inline void ex_gid_str(const uint8_t gid[16], char out[40])
{
    int i;
    for (i = 0; i < 8; i++) {
        snprintf(out + 5 * i, 6, "%02x%02x%s", gid[2 * i], gid[2 * i + 1], i < 7 ? ":" : "");
    }
}

/* What the device physically is, so a reader knows what the figures can
 * and cannot say. */
static inline const char *ex_medium(const char *device)
{
    if (device == NULL) {
        return "the in-process software HCA: memory copies and thread hand-offs inside this "
               "process, no network and no NIC";
    }
    if (strncmp(device, "rxe", 3) == 0) {
        return "the kernel's rxe driver (Soft-RoCE): RoCE v2 in software over an Ethernet "
               "interface, no RDMA NIC; both QPs in this process, on one device";
    }
    if (strncmp(device, "siw", 3) == 0) {
        return "the kernel's siw driver (soft-iWARP): iWARP in software over the kernel's TCP, "
               "no RDMA NIC; both QPs in this process, on one device";
    }
    if (strncmp(device, "mlx5", 4) == 0) {
        return "an mlx5 (ConnectX) NIC; both QPs in this process, on one device";
    }
    return "a kernel RDMA device; both QPs in this process, on one device";
}

/* Which data path the QPs of `dev` (opened from `device`, NULL for the
 * software HCA) run on, as rdd_device_data_path reports it. */
static inline const char *ex_data_path(rdd_device *dev, const char *device)
{
    uint32_t path = 0;
    rdd_status s = rdd_device_data_path(dev, &path);
    if (s != RDD_STATUS_OK) {
        ex_fail("rdd_device_data_path", s);
    }
    switch (path) {
    case RDD_DATA_PATH_SOFTWARE:
        return "software (the mlx5 data path on the software HCA's queues)";
    case RDD_DATA_PATH_DIRECT:
        return device != NULL && strncmp(device, "mlx5", 4) == 0
                   ? "direct (rdma-direct's mlx5 data path)"
                   : "direct (rdma-direct's own rings: its WQEs, doorbells and completion polling)";
    case RDD_DATA_PATH_FALLBACK:
        return "fallback (libibverbs' provider: ibv_post_send, ibv_poll_cq)";
    default:
        return "unknown";
    }
}

/* Cores this process may run on (at least 1). */
static inline long ex_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

/* Whether the CPU says it runs under a hypervisor (the `hypervisor` flag
 * in /proc/cpuinfo), so wall-clock figures come from a virtual machine. */
static inline int ex_in_vm(void)
{
    char line[4096];
    int found = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL) {
        return 0;
    }
    while (!found && fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "flags", 5) == 0 && strstr(line, " hypervisor") != NULL) {
            found = 1;
        }
    }
    fclose(f);
    return found;
}

/* Monotonic time in microseconds. */
static inline double ex_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Parses a whole decimal number in [min, max] for `flag`, or exits 2. */
static inline unsigned long ex_number(const char *flag, const char *text, unsigned long min,
                                      unsigned long max)
{
    char *end = NULL;
    unsigned long v;
    if (text == NULL) {
        fprintf(stderr, "%s: %s needs a value\n", ex_prog, flag);
        exit(2);
    }
    v = strtoul(text, &end, 10);
    if (end == text || *end != '\0' || text[0] == '-' || v < min || v > max) {
        fprintf(stderr, "%s: %s: not a number in %lu..%lu: %s\n", ex_prog, flag, min, max, text);
        exit(2);
    }
    return v;
}

#endif /* RDD_EXAMPLE_COMMON_H */
