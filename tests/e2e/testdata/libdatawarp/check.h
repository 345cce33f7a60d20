/* check.h: the test programs' one check, a line each on standard output ("ok NAME" or
 * "FAIL NAME: why"), counted in failures (the program's exit status says whether any failed).
 * Included by dwcheck.c, dwkeep.c and tests/slurm/testdata/ckpt.c. */
#ifndef SPILLWAY_TEST_CHECK_H
#define SPILLWAY_TEST_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(name, cond, ...)                         \
	do {                                           \
		if (cond) {                            \
			printf("ok %s\n", name);       \
		} else {                               \
			printf("FAIL %s: ", name);     \
			printf(__VA_ARGS__);           \
			printf("\n");                  \
			failures++;                    \
		}                                      \
		fflush(stdout);                        \
	} while (0)

#endif
