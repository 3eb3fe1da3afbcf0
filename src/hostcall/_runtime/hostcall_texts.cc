// Rows of numbers as text, for the metrics writers: the same characters as
// NumPy's str() of each value (the shortest digits that read back to the same
// value in its own precision; positional from 1e-4 up to 1e6 for float32 and
// 1e16 for float64, scientific otherwise, as NumPy chooses), at a few tens of
// nanoseconds a value where NumPy's astype(str) takes about a microsecond.
//
// A row is pieces[0] value[0] pieces[1] value[1] ... value[k-1] pieces[k]:
// the writer's template (a JSON Lines row's names and braces, a CSV line's
// commas) around the columns' values.
//
// Built into the tap queue's library: where the C++ library lacks
// floating-point std::to_chars (before GCC 11, LLVM 14), hostcall_format_rows
// says so (-1) and the writers format with NumPy; the queue still builds.

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
#define HOSTCALL_HAVE_FLOAT_TO_CHARS 1
#endif

namespace {

// The most characters one value takes: "-1.2345678901234567e-308".
constexpr int64_t kMaxValueChars = 32;

#ifdef HOSTCALL_HAVE_FLOAT_TO_CHARS

enum Kind : int64_t { kInt64 = 0, kFloat32 = 1, kFloat64 = 2 };

char* Copy(char* out, const char* text) {
  size_t n = std::strlen(text);
  std::memcpy(out, text, n);
  return out + n;
}

template <typename T>
char* FormatFloat(char* out, T value, long double max_positional,
                  bool json) {
  if (std::isnan(value)) return Copy(out, json ? "NaN" : "nan");
  if (std::isinf(value)) {
    if (value > 0) return Copy(out, json ? "Infinity" : "inf");
    return Copy(out, json ? "-Infinity" : "-inf");
  }
  // The shortest round-trip digits, as d[.ddd]e[+-]XX.
  char sci[kMaxValueChars + 1];
  char* end = std::to_chars(sci, sci + kMaxValueChars, value,
                            std::chars_format::scientific)
                  .ptr;
  *end = '\0';  // for atoi below
  long double magnitude = std::fabs(static_cast<long double>(value));
  if (!(magnitude == 0 ||
        (magnitude < max_positional && magnitude >= 1e-4L))) {
    std::memcpy(out, sci, end - sci);  // NumPy's scientific form
    return out + (end - sci);
  }
  const char* p = sci;
  if (*p == '-') *out++ = *p++;
  char digits[kMaxValueChars];
  int count = 0;
  for (; *p != 'e'; ++p) {
    if (*p != '.') digits[count++] = *p;
  }
  int exponent = std::atoi(p + 1);  // (the '+'/'-' sign included)
  if (exponent < 0) {  // 0.000ddd
    *out++ = '0';
    *out++ = '.';
    for (int i = 0; i < -exponent - 1; ++i) *out++ = '0';
    std::memcpy(out, digits, count);
    return out + count;
  }
  int whole = exponent + 1;  // digits before the point
  for (int i = 0; i < whole; ++i) *out++ = i < count ? digits[i] : '0';
  *out++ = '.';
  if (count > whole) {
    std::memcpy(out, digits + whole, count - whole);
    return out + (count - whole);
  }
  *out++ = '0';
  return out;
}

char* FormatValue(char* out, int64_t kind, const void* column, int64_t row,
                  bool json) {
  switch (kind) {
    case kInt64:
      return std::to_chars(out, out + kMaxValueChars,
                           static_cast<const int64_t*>(column)[row])
          .ptr;
    case kFloat32:
      return FormatFloat(out, static_cast<const float*>(column)[row], 1e6L,
                         json);
    default:
      return FormatFloat(out, static_cast<const double*>(column)[row], 1e16L,
                         json);
  }
}

// Rows [first, end) into `out`; returns the end of what it wrote.
char* FormatRows(int64_t first, int64_t end, int64_t columns,
                 const int64_t* kinds, const void* const* data,
                 const char* const* pieces, const int64_t* piece_sizes,
                 bool json, char* out) {
  for (int64_t r = first; r < end; ++r) {
    for (int64_t c = 0; c < columns; ++c) {
      std::memcpy(out, pieces[c], piece_sizes[c]);
      out += piece_sizes[c];
      out = FormatValue(out, kinds[c], data[c], r, json);
    }
    std::memcpy(out, pieces[columns], piece_sizes[columns]);
    out += piece_sizes[columns];
  }
  return out;
}

// Writes all `size` bytes to `fd` (a write interrupted by a signal is
// retried); returns 0, or the errno of the write that failed.
int WriteAll(int fd, const char* bytes, int64_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, bytes, static_cast<size_t>(size));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    bytes += n;
    size -= n;
  }
  return 0;
}

#endif  // HOSTCALL_HAVE_FLOAT_TO_CHARS

}  // namespace

extern "C" {

// The most bytes hostcall_format_rows may write for these rows.
int64_t hostcall_rows_capacity(int64_t rows, int64_t columns,
                               const int64_t* piece_sizes) {
  int64_t row = columns * kMaxValueChars;
  for (int64_t i = 0; i <= columns; ++i) row += piece_sizes[i];
  return rows * row;
}

// Writes `rows` rows of `columns` contiguous columns (kinds: 0 int64,
// 1 float32, 2 float64) into `out` (hostcall_rows_capacity bytes at least);
// non-finite floats as JSON's NaN, Infinity, -Infinity where `json`, else as
// NumPy's nan, inf, -inf. Returns the bytes written, or -1 where this build
// cannot format floats (see above).
int64_t hostcall_format_rows(int64_t rows, int64_t columns,
                             const int64_t* kinds, const void* const* data,
                             const char* const* pieces,
                             const int64_t* piece_sizes, int64_t json,
                             char* out) {
#ifndef HOSTCALL_HAVE_FLOAT_TO_CHARS
  return -1;
#else
  return FormatRows(0, rows, columns, kinds, data, pieces, piece_sizes,
                    json != 0, out) - out;
#endif
}

// Formats the rows as hostcall_format_rows does, `chunk_rows` at a time into
// `out` (hostcall_rows_capacity bytes for `chunk_rows` rows at least), and
// writes each chunk to `fd` whole: a metrics writer's whole block in one call
// made without the GIL (each time a thread takes the GIL back costs a Python
// loop dispatching on another core a hand-off). Returns the bytes written;
// -1 where this build cannot format floats (nothing written). A failed write
// stops it with its errno in *error (else 0): what it returns was written,
// and at most the failed write's part of the rows after it.
int64_t hostcall_write_rows(int64_t fd, int64_t rows, int64_t columns,
                            const int64_t* kinds, const void* const* data,
                            const char* const* pieces,
                            const int64_t* piece_sizes, int64_t json,
                            int64_t chunk_rows, char* out, int64_t* error) {
  *error = 0;
#ifndef HOSTCALL_HAVE_FLOAT_TO_CHARS
  return -1;
#else
  int64_t written = 0;
  for (int64_t first = 0; first < rows; first += chunk_rows) {
    int64_t end = first + chunk_rows < rows ? first + chunk_rows : rows;
    int64_t size = FormatRows(first, end, columns, kinds, data, pieces,
                              piece_sizes, json != 0, out) - out;
    *error = WriteAll(static_cast<int>(fd), out, size);
    if (*error != 0) return written;
    written += size;
  }
  return written;
#endif
}

}  // extern "C"
