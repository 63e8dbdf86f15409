/* bench/step_load.cc's functions, for C and C++. */
#pragma once
#ifdef __cplusplus
extern "C" {
#endif
void chorus_step_load_init(int threads, int n);
void chorus_step_load_run(void);
#ifdef __cplusplus
}
#endif
