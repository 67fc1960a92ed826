#include "nvfs/result.hpp"

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace nvfs {

std::string Error::Describe() const {
  return message.empty() ? std::string(std::strerror(code)) : message;
}

Error MakeError(int code, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return Error(code, buf);
}

}  // namespace nvfs
