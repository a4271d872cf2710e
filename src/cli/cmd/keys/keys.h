/*
 * keys.h - `kvprefix keys`: the block keys of a token list under a hash profile (keys.c).
 */
#ifndef KVP_CLI_KEYS_H
#define KVP_CLI_KEYS_H

/* Run the subcommand on argv[0 .. argc) (argv[0] is "keys"); returns the exit status:
 * 0 done, 1 bad input (FILE:LINE or argument named on stderr), 2 usage. */
int keys_main(int argc, char **argv);

#endif /* KVP_CLI_KEYS_H */
