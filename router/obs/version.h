/* router/obs/version.h: what this pcrouter is: its version, the git commit it was built from, and
 * the versions of the libraries it runs with. `pcrouter --version` prints them all; the two
 * strings are there for anything else that reports them (a build-info metric, a log line). */
#ifndef PCR_ROUTER_VERSION_H
#define PCR_ROUTER_VERSION_H

#include <stdio.h>

/* The project's version ("0.1.0"), from meson.build. A static string: never freed. */
const char *pcr_version_string(void);

/* The git commit the build was made from: 12 hex digits, with "-dirty" when the work tree had
 * uncommitted changes, or "unknown" when it was not built from a git checkout (or git was
 * missing). A static string: never freed. */
const char *pcr_version_commit(void);

/* Writes the version, the commit and one line per library: the version the library reports at
 * run time, followed by the headers' version when the two differ (a library upgraded under a
 * built binary). */
void pcr_version_print(FILE *f);

#endif
