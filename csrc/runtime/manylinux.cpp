// Definitions inside libfk of library symbols that are newer than manylinux_2_28 allows
// (glibc 2.28, GLIBCXX_3.4.24): the headers of a newer GCC and glibc make code call them, so
// libfk carries its own copies, hidden (the references bind here at link time; nothing is
// exported). Each copy does what the library's own does. runtime/manylinux.h pins the
// functions that older versions exist for.
#include <new>
#include <sstream>

#if defined(__linux__) && defined(__x86_64__)

#define FK_HIDDEN __attribute__((visibility("hidden")))

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
// GLIBC_2.32: libstdc++'s reference counts (shared_ptr, locale) skip atomic instructions
// while it is nonzero. 0 ("threads may exist") keeps them atomic, as glibc < 2.32 does.
extern "C" {
FK_HIDDEN char __libc_single_threaded = 0;
}
#endif

#if defined(_GLIBCXX_RELEASE) && _GLIBCXX_RELEASE >= 9
// GLIBCXX_3.4.26: the default constructors of the string streams (complete-object
// constructors; before, the default was an argument of the openmode constructor).
#define FK_DEFAULT_CTOR(fn, symbol, type, mode)                              \
  extern "C" FK_HIDDEN void fn(void* self) __asm__(symbol);                  \
  void fn(void* self) { ::new (self) type(mode); }
FK_DEFAULT_CTOR(fk_ostringstream_ctor,
                "_ZNSt7__cxx1119basic_ostringstreamIcSt11char_traitsIcESaIcEEC1Ev",
                std::ostringstream, std::ios_base::out)
FK_DEFAULT_CTOR(fk_istringstream_ctor,
                "_ZNSt7__cxx1119basic_istringstreamIcSt11char_traitsIcESaIcEEC1Ev",
                std::istringstream, std::ios_base::in)
FK_DEFAULT_CTOR(fk_stringstream_ctor,
                "_ZNSt7__cxx1118basic_stringstreamIcSt11char_traitsIcESaIcEEC1Ev",
                std::stringstream, std::ios_base::in | std::ios_base::out)
FK_DEFAULT_CTOR(fk_stringbuf_ctor,
                "_ZNSt7__cxx1115basic_stringbufIcSt11char_traitsIcESaIcEEC1Ev",
                std::stringbuf, std::ios_base::in | std::ios_base::out)
#undef FK_DEFAULT_CTOR
#endif

#if defined(_GLIBCXX_RELEASE) && _GLIBCXX_RELEASE >= 11
// GLIBCXX_3.4.29: what `new T[n]` and std::allocator call when n * sizeof(T) overflows.
extern "C" [[noreturn]] FK_HIDDEN void fk_throw_bad_array_new_length()
    __asm__("_ZSt28__throw_bad_array_new_lengthv");
void fk_throw_bad_array_new_length() { throw std::bad_array_new_length(); }
#endif

#endif  // __linux__ && __x86_64__
