// Included ahead of every C++ source of libfk (-include, set in CMakeLists.txt).
//
// The wheel is tagged manylinux_2_28: libfk may only require symbol versions that glibc 2.28
// and the libstdc++ of GCC 8 (GLIBCXX_3.4.24, CXXABI_1.3.11) provide, whatever glibc and GCC
// build it. Functions that a newer glibc gave a new version (dl* and pthread_once moved into
// libc in 2.34, the libm functions below got new error handling in 2.29) are bound here to
// their original version, which every glibc still exports. Symbols that exist only in newer
// libraries are defined inside libfk instead (runtime/manylinux.cpp). `auditwheel show` and
// tests/integration/test_wheel_abi.py check the result.
#pragma once

#if defined(__linux__) && defined(__x86_64__)
// libdl / libpthread functions (GLIBC_2.34 in libc.so.6 from glibc 2.34 on).
__asm__(".symver dlopen,dlopen@GLIBC_2.2.5");
__asm__(".symver dlsym,dlsym@GLIBC_2.2.5");
__asm__(".symver dlerror,dlerror@GLIBC_2.2.5");
__asm__(".symver dlclose,dlclose@GLIBC_2.2.5");
__asm__(".symver dladdr,dladdr@GLIBC_2.2.5");
__asm__(".symver pthread_once,pthread_once@GLIBC_2.2.5");
__asm__(".symver pthread_key_create,pthread_key_create@GLIBC_2.2.5");
__asm__(".symver pthread_key_delete,pthread_key_delete@GLIBC_2.2.5");
__asm__(".symver pthread_getspecific,pthread_getspecific@GLIBC_2.2.5");
__asm__(".symver pthread_setspecific,pthread_setspecific@GLIBC_2.2.5");
// libm functions (GLIBC_2.29 from glibc 2.29 on; same results, older errno handling).
__asm__(".symver exp,exp@GLIBC_2.2.5");
__asm__(".symver exp2,exp2@GLIBC_2.2.5");
__asm__(".symver log,log@GLIBC_2.2.5");
__asm__(".symver log2,log2@GLIBC_2.2.5");
__asm__(".symver pow,pow@GLIBC_2.2.5");
#endif
