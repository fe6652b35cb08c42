/* main.c - ferry's command line: load and check the configuration, set up
 * logging, run the proxy until a signal stops it. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "core.h"
#include "fallback.h"
#include "log.h"
#include "queues_report.h"
#include "stats.h"
#include "takeover.h"
#include "tls.h"

#define EXIT_USAGE 2   /* bad command line */
#define EXIT_CONFIG 1  /* configuration invalid */
#define EXIT_RUNTIME 3 /* could not start (listen, log file) */

static void usage(FILE *out)
{
    fprintf(out, "Usage: ferry -c FILE [-t] [--takeover PATH]\n"
                 "       ferry -V | -h | -D\n"
                 "\n"
                 "ferry is a high-availability RESP proxy for Redis queue workloads.\n"
                 "\n"
                 "  -c, --config FILE  the YAML configuration (see config/ferry.yml)\n"
                 "  -t, --test         check the configuration and exit (0 valid, 1 invalid)\n"
                 "  -V, --version      print the version and exit\n"
                 "      --takeover PATH\n"
                 "                     take over from the ferry running with takeover.socket\n"
                 "                     PATH: its listening sockets, then each client\n"
                 "                     connection with its state; it exits 0 when done\n"
                 "      --queues       print what Redis holds for the queues: entries of the\n"
                 "                     configuration (lengths, processing lists, open\n"
                 "                     leases, dead letters, paused consumers) and exit\n"
                 "      --fallback-dump\n"
                 "                     print the rows pending in the fallback store named by\n"
                 "                     the configuration (fallback.path) and exit\n"
                 "  -D, --describe-stats\n"
                 "                     list every statistic (JSON path, type, Prometheus\n"
                 "                     name, meaning) and exit\n"
                 "      --describe-config\n"
                 "                     list every configuration key (key, type, default,\n"
                 "                     accepted values, meaning) and exit\n"
                 "  -h, --help         this text\n"
                 "\n"
                 "Signals: SIGTERM/SIGINT stop gracefully (a second one stops at once),\n"
                 "SIGHUP reopens the log file.\n"
                 "\n"
                 "Exit codes:\n"
                 "  0  clean shutdown, valid configuration (-t), or -V/-h/-D/--describe-config\n"
                 "  1  invalid configuration (message: file:line:column: ...)\n"
                 "  2  bad command line\n"
                 "  3  could not start (listen, open the log file, take over)\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},   {"test", no_argument, NULL, 't'},
        {"version", no_argument, NULL, 'V'},        {"help", no_argument, NULL, 'h'},
        {"describe-stats", no_argument, NULL, 'D'}, {"fallback-dump", no_argument, NULL, 'F'},
        {"takeover", required_argument, NULL, 'T'}, {"describe-config", no_argument, NULL, 'G'},
        {"queues", no_argument, NULL, 'Q'},         {NULL, 0, NULL, 0}};
    const char *path = NULL;
    const char *takeover_path = NULL;
    int test = 0, dump = 0, report = 0, c;

    while ((c = getopt_long(argc, argv, "c:tVhD", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            path = optarg;
            break;
        case 't':
            test = 1;
            break;
        case 'V':
            printf("ferry %s\n", FERRY_VERSION);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        case 'D':
            stats_describe(stdout);
            return 0;
        case 'G':
            config_describe(stdout);
            return 0;
        case 'F':
            dump = 1;
            break;
        case 'Q':
            report = 1;
            break;
        case 'T':
            takeover_path = optarg;
            break;
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (path == NULL || optind != argc) {
        usage(stderr);
        return EXIT_USAGE;
    }

    config cfg;
    char err[512];
    if (config_load(&cfg, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return EXIT_CONFIG;
    }
    tls_roles roles;
    if (tls_roles_load(&roles, &cfg, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s: %s\n", path, err);
        config_free(&cfg);
        return EXIT_CONFIG;
    }
    if (test) {
        tls_roles_free(&roles);
        printf("ferry: configuration %s is valid\n", path);
        if (cfg.has_cluster) {
            printf("ferry: cluster mode: commands whose keys share one slot are routed to "
                   "that slot's master; others are refused (see the cluster documentation)\n");
        }
        config_free(&cfg);
        return 0;
    }
    if (report) {
        int qrc = queues_report(&cfg, stdout, err, sizeof(err));
        if (qrc != 0) {
            fprintf(stderr, "ferry: %s\n", err);
        }
        config_free(&cfg);
        return qrc == 0 ? 0 : EXIT_RUNTIME;
    }
    if (dump) {
        int drc = cfg.fallback_path == NULL
                      ? -1
                      : fallback_dump(cfg.fallback_path, stdout, err, sizeof(err));
        if (drc != 0) {
            fprintf(stderr, "ferry: %s\n",
                    cfg.fallback_path == NULL ? "no fallback.path in the configuration" : err);
        }
        tls_roles_free(&roles);
        config_free(&cfg);
        return drc == 0 ? 0 : EXIT_RUNTIME;
    }
    int rc = log_init(cfg.log_level, cfg.log_file);
    if (rc < 0) {
        fprintf(stderr, "ferry: cannot open log file %s: %s\n", cfg.log_file, strerror(-rc));
        tls_roles_free(&roles);
        config_free(&cfg);
        return EXIT_RUNTIME;
    }
    log_info("ferry %s starting with %s", FERRY_VERSION, path);

    struct takeover *tk = NULL;
    if (takeover_path != NULL) {
        tk = takeover_connect(takeover_path, TAKEOVER_HANDSHAKE_MS, err, sizeof(err));
        if (tk == NULL) {
            log_error("takeover failed: %s", err);
            if (cfg.log_file != NULL) {
                fprintf(stderr, "ferry: takeover failed: %s\n", err);
            }
            log_close();
            tls_roles_free(&roles);
            config_free(&cfg);
            return EXIT_RUNTIME;
        }
    }

    uv_loop_t loop;
    uv_loop_init(&loop);
    ferry f;
    core_threads_without_signals();
    rc = core_init(&f, &loop, &cfg, &roles, tk);
    core_signals_here();
    int code;
    if (rc < 0) {
        log_error("ferry could not start: %s", ferry_strerror(rc));
        code = EXIT_RUNTIME;
    } else {
        code = core_run(&f);
        /* The last line (scripts/rolling-restart --ferry reads it). */
        log_info("ferry stopped (exit code %d)", code);
    }
    if (uv_loop_close(&loop) != 0) {
        log_warn("event loop closed with handles still open");
    }
    tls_roles_free(&roles);
    config_free(&cfg);
    log_close();
    return code;
}
