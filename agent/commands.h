/* The subcommands of crowdtrain-agent. Each takes the arguments after its
 * name (argv[0] is the subcommand) and returns the process exit status:
 * 0 success, 1 failure (already explained on stderr), 2 usage error. */
#ifndef AGENT_COMMANDS_H
#define AGENT_COMMANDS_H

int agent_cmd_login(int argc, char **argv);
int agent_cmd_pass(int argc, char **argv);
int agent_cmd_join(int argc, char **argv);
int agent_cmd_serve_experts(int argc, char **argv);
int agent_cmd_pipeline(int argc, char **argv);
int agent_cmd_train(int argc, char **argv);
int agent_cmd_finetune(int argc, char **argv);
int agent_cmd_dht(int argc, char **argv);
int agent_cmd_status(int argc, char **argv);
int agent_cmd_pause(int argc, char **argv);
int agent_cmd_resume(int argc, char **argv);

#endif
