/*
 * datawarp.h — Spillway's libdatawarp: Cray DataWarp's C API for staging files between a
 * burst buffer and the parallel file system while a job runs.
 *
 * Source-compatible with programs written for Cray's library: the same names, types,
 * constants and return convention. Every int function returns 0 on success or a negative
 * errno (-ENOENT, -EINVAL, ...); errno itself is not used. Pointer-returning functions return
 * NULL on error. See docs/libdatawarp.md for each function.
 *
 * Copyright the Spillway authors. Licensed as the rest of Spillway (see LICENSE).
 */
#ifndef DATAWARP_H
#define DATAWARP_H

#include <sys/types.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* When a stage-out runs (the last argument of dw_stage_*_out). */
enum dw_stage_type {
	DW_STAGE_IMMEDIATE,         /* 0: copy now */
	DW_STAGE_AT_JOB_END,        /* 1: copy when the job ends, before the burst buffer is released */
	DW_REVOKE_STAGE_AT_JOB_END, /* 2: forget an earlier DW_STAGE_AT_JOB_END request (pfs path ignored) */
	DW_ACTIVATE_DEFERRED_STAGE  /* 3: run an earlier DW_STAGE_AT_JOB_END request now (pfs path ignored) */
};

/* A cache instance's policy for a file or directory (dw_get_cache_policy, dw_set_cache_policy):
 * the instance's defaults (its #DW jobdw tunables) unless set on the file, or on the directory
 * it was created in. Spillway's names: Cray described these calls but never published them. */
typedef struct dw_cache_policy {
	uint64_t modified_threshold; /* bytes: a file's dirty data on a server past this is flushed to the PFS (0: none) */
	uint64_t read_ahead;         /* bytes each server reads ahead of a sequential reader (0: none) */
	int sync_on_close;           /* nonzero: close() returns once the file's data is on the PFS */
	int sync_to_pfs;             /* nonzero: fsync() returns once the file's data is on the PFS */
} dw_cache_policy_t;

/* A walk over failed stages (dw_open_failed_stage). */
typedef struct dw_failed_stage_state dw_failed_stage_t;

int dw_set_stage_concurrency(const char *dw_instance_path, unsigned int concurrent_stages);

int dw_stage_file_in(const char *dw_file_path, const char *pfs_file_path);
int dw_stage_directory_in(const char *dw_directory, const char *pfs_directory);
int dw_stage_list_in(const char *dw_directory, const char **pfs_list);

int dw_stage_file_out(const char *dw_file_path, const char *pfs_file_path, enum dw_stage_type stage_type);
int dw_stage_directory_out(const char *dw_directory, const char *pfs_directory, enum dw_stage_type stage_type);
int dw_stage_list_out(const char **dw_list, const char *pfs_directory, enum dw_stage_type stage_type);

int dw_query_file_stage(const char *dw_file_path, int *complete, int *pending, int *deferred, int *failed);
int dw_query_directory_stage(const char *dw_directory_path, int *complete, int *pending, int *deferred, int *failed);
int dw_query_list_stage(const char **dw_list_path, int *complete, int *pending, int *deferred, int *failed);

int dw_wait_file_stage(const char *dw_file_path);
int dw_wait_directory_stage(const char *dw_directory_path);
int dw_wait_list_stage(const char **dw_list);

int dw_terminate_file_stage(const char *dw_file_path);
int dw_terminate_directory_stage(const char *dw_directory_path);
int dw_terminate_list_stage(const char **dw_list);

int dw_open_failed_stage(const char *dw_instance_path, dw_failed_stage_t **handle);
int dw_read_failed_stage(dw_failed_stage_t *handle, char *path, int path_size, int *ret_errno);
int dw_close_failed_stage(dw_failed_stage_t *handle);

int dw_set_stripe_configuration(int fd, int stripe_size, int stripe_width);
int dw_get_stripe_configuration(int fd, int *stripe_size, int *stripe_width, int *starting_index);

char *dw_get_mds_path(const char *dw_root, uint64_t key);
char *dw_get_accounting_data_json(const char *path, int *ecode);

/* Returns once fd's data is on the PFS (a cache instance's file: every server of the file
 * writes it back and syncs the PFS file), or on the burst buffer (scratch: fsync). */
int dw_wait_sync_complete(int fd);

/* A cache instance's policy of a file (at once, all its opens) or a directory (the files
 * created in it afterwards); -EOPNOTSUPP off a cache. fd is an open file or directory. */
int dw_get_cache_policy(int fd, dw_cache_policy_t *policy);
int dw_set_cache_policy(int fd, const dw_cache_policy_t *policy);

#ifdef __cplusplus
}
#endif

#endif /* DATAWARP_H */
