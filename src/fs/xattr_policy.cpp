// The xattr namespace policy: which names the filesystem serves
// (CheckXattrName) and which ListXattr shows to whom (Listed).
#include <string_view>

#include "fs/xattr.hpp"
#include "nvfs/format.hpp"

namespace nvfs::xattr {

using format::kXattrNameMax;
using format::XattrNamespace;

// Which names the filesystem serves: ext4's rules. user.*, trusted.* and
// security.* names are stored as given (the kernel has already checked the
// caller may: CAP_SYS_ADMIN for trusted.*, user.* only on regular files and
// directories). system.* names are the filesystem's own, each served only if
// the filesystem implements it: the two POSIX ACL names (acl.cpp, which
// SetXattr and GetXattr hand them to); every other system.* name is
// EOPNOTSUPP to set, get and remove. Such names already on the media from
// before this rule stay there, hidden (doc/format.md).
bool IsAclName(std::string_view name) {
  return name == format::kAclAccessName || name == format::kAclDefaultName;
}

Status CheckXattrName(std::string_view name) {
  if (name.empty() || name.size() > kXattrNameMax) return Error(ERANGE);
  switch (format::XattrNamespaceOf(name)) {
    case XattrNamespace::kUser:
    case XattrNamespace::kTrusted:
    case XattrNamespace::kSecurity:
      return Status::Ok();
    case XattrNamespace::kSystem:
      if (IsAclName(name)) return Status::Ok();
      break;
    case XattrNamespace::kNone:
      break;
  }
  return Error(EOPNOTSUPP);
}

// Whether ListXattr shows `name` to `cred`. The kernel filters nothing a
// FUSE daemon lists, so the rules are ours: of system.* names only the ACL
// names (to everyone, as ext4 lists them), and trusted.* names only to
// root, as ext4 lists them only to CAP_SYS_ADMIN. A FUSE request carries the caller's uid, gid and pid but
// not its capabilities (reading /proc/<pid>/status would race with pid reuse
// and misread callers in other pid namespaces), so uid 0 stands for
// CAP_SYS_ADMIN here, while the kernel's own check of trusted.* get and set
// is the capability: a root without it sees names it cannot read, a non-root
// with it can read names it is not shown.
bool Listed(std::string_view name, const Cred& cred) {
  switch (format::XattrNamespaceOf(name)) {
    case XattrNamespace::kUser:
    case XattrNamespace::kSecurity:
      return true;
    case XattrNamespace::kTrusted:
      return cred.uid == 0;
    case XattrNamespace::kSystem:
      return IsAclName(name);
    case XattrNamespace::kNone:
      break;
  }
  return false;
}

}  // namespace nvfs::xattr
