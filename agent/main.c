/* crowdtrain-agent: the volunteer's program. Dispatches to subcommands; each
 * lives in its own file and is listed in the table below with a one-line
 * summary for --help. */
#include <curl/curl.h>
#include <stdio.h>
#include <string.h>

#include "agent/commands.h"

struct agent_cmd {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
};

/* One entry per subcommand, in the order --help shows them. */
static const struct agent_cmd CMDS[] = {
    {"login", agent_cmd_login, "log in to a coordinator (and get a pass with --run)"},
    {"pass", agent_cmd_pass, "get, renew or show this peer's access pass for a run"},
    {"join", agent_cmd_join, "train with the collaboration of a run (Ctrl-C leaves)"},
    {"serve-experts", agent_cmd_serve_experts, "host experts of a run's mixture-of-experts layer for its trainers"},
    {"pipeline", agent_cmd_pipeline, "run one stage of a pipeline run (the model cut into stages across volunteers)"},
    {"status", agent_cmd_status, "what a training agent (or the service) is doing"},
    {"pause", agent_cmd_pause, "pause a training agent without leaving its run (SIGUSR1)"},
    {"resume", agent_cmd_resume, "resume a paused agent: it catches up and trains (SIGUSR2)"},
    {"train", agent_cmd_train, "train a model in this process (--local --config FILE)"},
    {"finetune", agent_cmd_finetune, "fine-tune a pretrained ALBERT on a labeled task and report its accuracy"},
    {"dht", agent_cmd_dht, "get or put one key of a run's DHT (debugging)"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: crowdtrain-agent <command> [options]\n\n"
               "Crowdtrain's volunteer agent: joins a collaborative training run.\n\n"
               "commands:\n");
    for (const struct agent_cmd *c = CMDS; c->name; c++)
        fprintf(f, "  %-10s %s\n", c->name, c->summary);
    fprintf(f, "\nRun 'crowdtrain-agent <command> --help' for a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (const struct agent_cmd *c = CMDS; c->name; c++) {
        if (!strcmp(argv[1], c->name)) {
            curl_global_init(CURL_GLOBAL_DEFAULT);
            int rc = c->run(argc - 1, argv + 1);
            curl_global_cleanup();
            return rc;
        }
    }
    fprintf(stderr, "crowdtrain-agent: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
