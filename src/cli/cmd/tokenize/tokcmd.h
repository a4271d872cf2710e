/*
 * tokcmd.h - `kvprefix tokenize`: the token ids of a text or an OpenAI request body under a
 * model's BPE tokenizer and chat template (tokcmd.c), to check them against an engine's.
 */
#ifndef CLI_TOKCMD_H
#define CLI_TOKCMD_H

/* Run the subcommand on argv[0 .. argc) (argv[0] is "tokenize"); returns the exit status:
 * 0 done, 1 bad input (an unreadable or malformed rank file or input), 2 usage. */
int tokcmd_main(int argc, char **argv);

#endif /* CLI_TOKCMD_H */
