/*
 * commands.h - the `sdpa` subcommands, one file each; main.c's command
 * table is their only caller. argv starts after the command's name.
 * Each returns the exit code: 0, 1 when the library refused or failed, 2
 * for bad usage.
 */
#ifndef SDPA_COMMANDS_H
#define SDPA_COMMANDS_H

int cmd_run(int argc, char **argv);     /* run.c     */
int cmd_explain(int argc, char **argv); /* explain.c */
int cmd_bench(int argc, char **argv);   /* bench.c   */
int cmd_check(int argc, char **argv);   /* check.c   */
int cmd_ab(int argc, char **argv);      /* ab.c      */
int cmd_tune(int argc, char **argv);    /* tune.c    */
int cmd_dit(int argc, char **argv);     /* dit.c     */
int cmd_info(int argc, char **argv);    /* info.c    */

#endif
