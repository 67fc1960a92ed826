// Who else can reach the namespace's bytes (doc/integrity.md, "The namespace
// is the boundary").
#include <sys/stat.h>

#include <string>

#include "nvfs/media.hpp"

namespace nvfs {

namespace {

// `path` as one shell word, so the advice can be pasted as it is.
std::string ShellWord(const std::string& path) {
  bool plain = !path.empty();
  for (const char c : path) {
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '/' || c == '.' || c == '_' || c == '-' || c == '+' || c == ',' ||
                      c == ':' || c == '=' || c == '@' || c == '%';
    if (!safe) plain = false;
  }
  if (plain) return path;
  std::string word = "'";
  for (const char c : path) {
    if (c == '\'') {
      word += "'\\''";
    } else {
      word += c;
    }
  }
  return word + "'";
}

}  // namespace

std::string NamespaceExposure(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return {};
  const bool read = (st.st_mode & S_IROTH) != 0;
  const bool write = (st.st_mode & S_IWOTH) != 0;
  if (!read && !write) return {};
  const char* can = read && write ? "read and written" : read ? "read" : "written";
  const char* then = read && write ? "read and change" : read ? "read" : "change";
  return path + " can be " + can + " by every user, who can then " + then +
         " every file in it whatever its permissions; chmod o-rw " + ShellWord(path);
}

}  // namespace nvfs
