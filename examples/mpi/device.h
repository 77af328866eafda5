/*
 * Which device a rank of an MPI example opens (included by mesh.h, after
 * its error and argument helpers): the options --device NAME,
 * --device-by-rank A,B,..., --gid-idx N and --gid-idx-by-rank N,M,...
 * (mesh.h's opening comment says what they mean), the opening itself
 * (the cross-process fabric when no device is named, the kernel device
 * otherwise), the --gid-idx check against sysfs, and what rank 0 prints
 * about the devices.
 */
#ifndef RDD_MPI_DEVICE_H
#define RDD_MPI_DEVICE_H

/* The device options, as parsed (mx_common_arg): the kernel device
 * names (none: the fabric) and the GID indexes to check (none: no
 * check). */
#define MX_MAX_DEVICES 16
static char mx_dev_text[256];
static const char *mx_devs[MX_MAX_DEVICES];
static size_t mx_ndevs = 0;
static char mx_gid_text[256];
static unsigned long mx_gids[MX_MAX_DEVICES];
static size_t mx_ngids = 0;

/* A device option that cannot be used: the reason (rank 0), exit 2. */
static inline void mx_bad_option(const char *flag, const char *why, const char *text)
{
    if (mx_rank == 0) {
        fprintf(stderr, "%s: %s: %s%s%s\n", mx_prog, flag, why, text[0] ? ": " : "", text);
    }
    MPI_Finalize();
    exit(2);
}

/* Splits `text` (copied into `buf`, `cap` bytes) at its commas into
 * `out` (MX_MAX_DEVICES entries, none empty); returns the count. */
static inline size_t mx_split(const char *flag, const char *text, char *buf, size_t cap,
                              const char **out)
{
    size_t n = 0;
    char *p = buf;
    if (text == NULL) {
        mx_bad_option(flag, "needs a value", "");
    }
    if (strlen(text) >= cap) {
        mx_bad_option(flag, "too long", text);
    }
    strcpy(buf, text);
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma != NULL) {
            *comma = '\0';
        }
        if (*p == '\0') {
            mx_bad_option(flag, "an empty entry", text);
        }
        if (n == MX_MAX_DEVICES) {
            mx_bad_option(flag, "more than 16 entries", text);
        }
        out[n++] = p;
        if (comma == NULL) {
            return n;
        }
        p = comma + 1;
    }
}

/* The entry of the --device-by-rank list this rank takes: the ranks
 * split in blocks, rank r taking entry r * n / size. */
static inline size_t mx_device_index(void)
{
    return (size_t)mx_rank * mx_ndevs / (size_t)mx_size;
}

/* The device options, when the job's size is known: a name per block,
 * GID indexes for one device or for each. */
static inline void mx_check_device_options(void)
{
    char n[64];
    if (mx_ndevs > (size_t)mx_size) {
        snprintf(n, sizeof(n), "%zu names for %d ranks", mx_ndevs, mx_size);
        mx_bad_option("--device-by-rank", "more names than ranks (a name would get no rank)", n);
    }
    if (mx_ngids > 0 && mx_ndevs == 0) {
        mx_bad_option("--gid-idx", "needs --device or --device-by-rank (the fabric has no GID "
                      "table)", "");
    }
    if (mx_ngids > 1 && mx_ngids != mx_ndevs) {
        snprintf(n, sizeof(n), "%zu indexes for %zu names", mx_ngids, mx_ndevs);
        mx_bad_option("--gid-idx-by-rank", "one index, or one per --device-by-rank name", n);
    }
}

/* A GID as sysfs shows it (8 groups of 4 hex digits), into `out`. */
static inline void mx_gid_str(const uint8_t gid[16], char out[40])
{
    int i;
    for (i = 0; i < 8; i++) {
        snprintf(out + 5 * i, 6, "%02x%02x%s", gid[2 * i], gid[2 * i + 1], i < 7 ? ":" : "");
    }
}

/* --gid-idx: fails the job unless `gid`, the GID this rank's QPs
 * connect with, is entry `idx` of port 1 of `dev` in sysfs. */
static inline void mx_check_gid(const char *dev, unsigned long idx, const uint8_t gid[16])
{
    char path[320], want[64], have[40], msg[512];
    FILE *f;
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/gids/%lu", dev, idx);
    f = fopen(path, "r");
    if (f == NULL || fgets(want, sizeof(want), f) == NULL) {
        snprintf(msg, sizeof(msg), "--gid-idx %lu: cannot read %s", idx, path);
        mx_die(msg);
    }
    fclose(f);
    want[strcspn(want, "\n")] = '\0';
    mx_gid_str(gid, have);
    if (strcmp(want, have) != 0) {
        snprintf(msg, sizeof(msg),
                 "--gid-idx %lu: %s's QPs connect with GID %s, but entry %lu of its GID table "
                 "is %s",
                 idx, dev, have, idx, want);
        mx_die(msg);
    }
}

/* The usage of the options every example takes (mx_common_arg). */
#define MX_COMMON_USAGE                                                                  \
    "[--wait event|adaptive|busy|yield] [--device NAME | --device-by-rank A,B,...]"     \
    " [--gid-idx N | --gid-idx-by-rank N,M,...]"

/* The device options of mx_common_arg: returns 1 (and moves `*a` past
 * the value) when argv[*a] is one. */
static inline int mx_device_arg(int argc, char **argv, int *a)
{
    const char *flag = argv[*a];
    const char *v = *a + 1 < argc ? argv[*a + 1] : NULL;
    const char *items[MX_MAX_DEVICES];
    size_t n, i;
    if (strcmp(flag, "--device") == 0 || strcmp(flag, "--device-by-rank") == 0) {
        if (mx_ndevs != 0) {
            mx_bad_option(flag, "give --device or --device-by-rank once", "");
        }
        mx_ndevs = mx_split(flag, v, mx_dev_text, sizeof(mx_dev_text), mx_devs);
        if (strcmp(flag, "--device") == 0 && mx_ndevs != 1) {
            mx_bad_option(flag, "one name (--device-by-rank takes a list)", v);
        }
    } else if (strcmp(flag, "--gid-idx") == 0 || strcmp(flag, "--gid-idx-by-rank") == 0) {
        if (mx_ngids != 0) {
            mx_bad_option(flag, "give --gid-idx or --gid-idx-by-rank once", "");
        }
        n = mx_split(flag, v, mx_gid_text, sizeof(mx_gid_text), items);
        if (strcmp(flag, "--gid-idx") == 0 && n != 1) {
            mx_bad_option(flag, "one index (--gid-idx-by-rank takes a list)", v);
        }
        for (i = 0; i < n; i++) {
            mx_gids[i] = mx_number(flag, items[i], 0, 1023);
        }
        mx_ngids = n;
    } else {
        return 0;
    }
    ++*a;
    return 1;
}

/* Opens this rank's device: a fabric device, its thread started (a
 * peer's requests are served by this device's passes), or the kernel
 * device the options give this rank, which runs by itself. */
static inline void mx_open_device(rdd_device **dev, const char **name)
{
    char msg[400];
    rdd_status s;
    mx_check_device_options();
    if (mx_ndevs == 0) {
        MX_TRY(rdd_device_open_fabric(NULL, dev));
        MX_TRY(rdd_device_start(*dev));
        return;
    }
    *name = mx_devs[mx_device_index()];
    s = rdd_device_open_verbs(*name, dev);
    if (s == RDD_STATUS_UNSUPPORTED) {
        snprintf(msg, sizeof(msg),
                 "--device %s: this librdma_direct was built without the verbs backend "
                 "(FEATURES=verbs scripts/install.sh)",
                 *name);
        mx_die(msg);
    }
    if (s == RDD_STATUS_NO_DEVICE) {
        snprintf(msg, sizeof(msg),
                 "--device %s: no RDMA device of that name (/sys/class/infiniband lists them)",
                 *name);
        mx_die(msg);
    }
    if (s != RDD_STATUS_OK) {
        mx_fail("rdd_device_open_verbs", s);
    }
}

/* Rank 0 prints, for each kernel device, its block of ranks and the GID
 * its first rank's QPs connect with. Collective. */
static inline void mx_report_devices(const uint8_t gid[16], uint32_t mtu)
{
    uint8_t *gids = NULL;
    size_t d;
    int r = 0;
    if (mx_rank == 0) {
        gids = malloc((size_t)mx_size * 16u);
        if (gids == NULL) {
            mx_die("out of memory");
        }
    }
    MX_MPI(MPI_Gather((void *)gid, 16, MPI_BYTE, gids, 16, MPI_BYTE, 0, MPI_COMM_WORLD));
    if (mx_rank != 0) {
        return;
    }
    for (d = 0; d < mx_ndevs; d++) {
        int lo = r;
        char gid[40];
        while (r < mx_size && (size_t)r * mx_ndevs / (size_t)mx_size == d) {
            r++;
        }
        mx_gid_str(gids + (size_t)lo * 16u, gid);
        printf(" device %-17s : ranks %d-%d, GID %s\n", mx_devs[d], lo, r - 1, gid);
    }
    printf(" path MTU                 : %u bytes (rank 0's QPs, rdd_qp_query_info)\n", mtu);
    free(gids);
}

/* Rank 0's "medium" and "data path" lines for kernel devices. */
static inline void mx_report_device_medium(void)
{
    const char *path = getenv("RDMA_DIRECT_DATA_PATH");
    size_t d;
    printf(" medium                   : kernel RDMA device%s", mx_ndevs > 1 ? "s" : "");
    for (d = 0; d < mx_ndevs; d++) {
        printf("%s%s", d ? ", " : " ", mx_devs[d]);
    }
    printf(": %d processes on one host (%ld cores online); rxe is RoCE v2 in software over "
           "an Ethernet interface, no RDMA NIC\n",
           mx_size, sysconf(_SC_NPROCESSORS_ONLN));
    printf(" data path                : %s%s\n",
           path != NULL ? "RDMA_DIRECT_DATA_PATH=" : "the device's default (rdma-direct's "
                                                    "own rings on rxe and siw)",
           path != NULL ? path : "");
}

#endif /* RDD_MPI_DEVICE_H */
