/*
 * demo.h - `kvprefix demo`: a scripted serving session through the engine API (demo.c).
 */
#ifndef CLI_DEMO_H
#define CLI_DEMO_H

/* Run the subcommand on argv[0 .. argc) (argv[0] is "demo"); returns the exit status
 * (cli.h). */
int demo_main(int argc, char **argv);

#endif /* CLI_DEMO_H */
