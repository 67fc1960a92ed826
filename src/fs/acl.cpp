// POSIX ACLs (include/nvfs/fs.hpp, "POSIX ACLs"): the rules ext4 follows
// (the kernel's fs/posix_acl.c: an access ACL and the mode say the same of
// the owner, the group class and others; a default ACL is what a directory
// hands down), over the core's internal attribute calls (FindXattr,
// ChangeXattrs in xattr.cpp), so that an ACL and the mode it goes with
// change in one transaction whatever stores the attributes.
//
// The kernel enforces the ACLs (FUSE_POSIX_ACL: it reads them through
// getxattr and checks every access with them) and checks who may set them;
// what it leaves to a FUSE filesystem, and so is done here: the mode on
// setting an access ACL, the ACL on chmod, inheritance and the umask on
// create (FUSE_DONT_MASK: the kernel sends the umask instead of applying it).
#include <sys/stat.h>

#include <cinttypes>
#include <cstring>
#include <string>
#include <vector>

#include "fs/fs_impl.hpp"
#include "nvfs/validate.hpp"

namespace nvfs {

using format::AclXattrEntry;
using format::Inode;

namespace {

using Acl = std::vector<AclXattrEntry>;

constexpr uint32_t kPermBits = S_IRWXU | S_IRWXG | S_IRWXO;

std::string_view NameOf(bool is_default) {
  return is_default ? format::kAclDefaultName : format::kAclAccessName;
}

// The value the kernel would write for `acl` (posix_acl_to_xattr): ids of
// the base entries undefined.
std::string Encode(const Acl& acl) {
  const format::AclXattrHeader header{format::kAclXattrVersion};
  std::string out(sizeof header + acl.size() * sizeof(AclXattrEntry), '\0');
  std::memcpy(out.data(), &header, sizeof header);
  for (size_t i = 0; i < acl.size(); ++i) {
    AclXattrEntry e = acl[i];
    if (e.tag != format::kAclUser && e.tag != format::kAclGroup) e.id = format::kAclUndefinedId;
    std::memcpy(out.data() + sizeof header + i * sizeof e, &e, sizeof e);
  }
  return out;
}

// The entry that stands for the mode's group bits: the mask if there is
// one, else the owning group (a valid ACL has one).
template <class Entries>
auto* GroupClassEntry(Entries& acl) {
  decltype(&acl[0]) group = nullptr;
  for (auto& e : acl) {
    if (e.tag == format::kAclMask) return &e;
    if (e.tag == format::kAclGroupObj) group = &e;
  }
  return group;
}

// The permission bits `acl` says (posix_acl_equiv_mode); *extended if it
// says more than a mode can (a named entry or a mask).
uint32_t PermsOf(const Acl& acl, bool* extended) {
  uint32_t perms = 0;
  *extended = false;
  for (const AclXattrEntry& e : acl) {
    switch (e.tag) {
      case format::kAclUserObj: perms |= uint32_t{e.perm} << 6; break;
      case format::kAclOther: perms |= e.perm; break;
      case format::kAclUser: case format::kAclGroup: case format::kAclMask:
        *extended = true;
        break;
      default: break;
    }
  }
  return perms | uint32_t{GroupClassEntry(acl)->perm} << 3;
}

// Makes the entries the mode stands for say what `mode` says
// (posix_acl_chmod).
void SetPerms(Acl& acl, uint32_t mode) {
  for (AclXattrEntry& e : acl) {
    if (e.tag == format::kAclUserObj) e.perm = static_cast<uint16_t>((mode >> 6) & 7);
    if (e.tag == format::kAclOther) e.perm = static_cast<uint16_t>(mode & 7);
  }
  GroupClassEntry(acl)->perm = static_cast<uint16_t>((mode >> 3) & 7);
}

// A new inode's access ACL from its parent's default ACL and the create's
// mode (posix_acl_create_masq): each entry the mode stands for keeps only
// what the mode grants, and the mode only what that entry grants. True if
// the result says more than the mode.
bool Masq(Acl& acl, uint32_t* mode) {
  uint32_t perms = *mode & kPermBits;
  bool extended = false;
  for (AclXattrEntry& e : acl) {
    switch (e.tag) {
      case format::kAclUserObj:
        e.perm = static_cast<uint16_t>(e.perm & (perms >> 6));
        perms = (perms & ~S_IRWXU) | uint32_t{e.perm} << 6;
        break;
      case format::kAclOther:
        e.perm = static_cast<uint16_t>(e.perm & perms & 7);
        perms = (perms & ~S_IRWXO) | e.perm;
        break;
      case format::kAclUser: case format::kAclGroup: case format::kAclMask:
        extended = true;
        break;
      default: break;
    }
  }
  AclXattrEntry* group = GroupClassEntry(acl);
  group->perm = static_cast<uint16_t>(group->perm & ((perms >> 3) & 7));
  perms = (perms & ~S_IRWXG) | uint32_t{group->perm} << 3;
  *mode = (*mode & ~kPermBits) | perms;
  return extended;
}

// The ACL stored under `name`, checked as the kernel would check it
// (DecodeAcl): none if there is none. A value that fails the check — one
// stored by a version before ACLs, or damaged — is damage (EIO, reported),
// which fsck.nvfs repairs by dropping it.
Result<std::optional<Acl>> LoadAcl(FsImpl& fs, uint64_t ino, const Inode& inode,
                                   std::string_view name) {
  Result<std::optional<std::string>> value = fs.FindXattr(inode, name);
  if (!value.ok()) return value.take_error();
  if (!value->has_value()) return std::optional<Acl>();
  Acl acl;
  const AclFault fault = DecodeAcl(**value, &acl);
  if (fault != AclFault::kNone) {
    return fs.context().Damaged(MakeError(EIO, "inode %" PRIu64 ": %.*s is %s; run fsck.nvfs", ino,
                                          static_cast<int>(name.size()), name.data(),
                                          AclFaultName(fault)));
  }
  return std::optional<Acl>(std::move(acl));
}

}  // namespace

// Order: the mode (an access ACL's permission bits, set-group-ID cleared
// if the kernel says so), the attribute, ctime — all in one transaction,
// so no crash shows the ACL with the old mode or the reverse. An access
// ACL the mode says whole is not stored (a stored one is removed): the
// mode alone then says it, as on ext4.
Status FsImpl::SetAcl(uint64_t ino, bool is_default, std::string_view value, unsigned xattr_flags) {
  // The kernel's answers: another version is EOPNOTSUPP, anything else
  // malformed EINVAL (posix_acl_from_xattr, posix_acl_valid).
  Acl acl;
  const AclFault fault = DecodeAcl(value, &acl);
  if (fault == AclFault::kVersion) return Error(EOPNOTSUPP);
  if (fault != AclFault::kNone) return Error(EINVAL);
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  std::unique_lock lock(ref.value()->lock);
  const Inode& inode = ref->media();
  if (S_ISLNK(inode.mode)) return Error(EOPNOTSUPP);
  if (is_default && !S_ISDIR(inode.mode)) return Error(EACCES);
  uint32_t mode = inode.mode;
  std::optional<std::string> stored;
  if (is_default) {
    stored = Encode(acl);
  } else {
    bool extended = false;
    mode = (mode & ~kPermBits) | PermsOf(acl, &extended);
    if (xattr_flags & kXattrKillSgid) mode &= ~S_ISGID;
    if (extended) stored = Encode(acl);
  }
  const timespec now = Now();
  Tx tx(*journal_, is_default ? "set-default-acl" : "set-acl");
  if (mode != inode.mode) tx.Set(inode.mode, static_cast<uint16_t>(mode));
  const XattrChange change{NameOf(is_default), stored ? &*stored : nullptr};
  NVFS_TRY(ChangeXattrs(tx, ino, inode, {&change, 1}, now));
  Touch(tx, inode, false, true, now);
  return tx.Commit();
}

// An access ACL is read with its owner, group-class and other entries
// taken from the mode: the mode is the one truth for what both say (they
// are kept equal by every change here; a value stored by a version that
// did not keep them so is shown as chmod would have left it).
Result<size_t> FsImpl::GetAcl(uint64_t ino, bool is_default, void* value, size_t size) {
  Result<InodeRef> ref = Get(ino);
  if (!ref.ok()) return ref.take_error();
  std::shared_lock lock(ref.value()->lock);
  const Inode& inode = ref->media();
  Result<std::optional<Acl>> acl = LoadAcl(*this, ino, inode, NameOf(is_default));
  if (!acl.ok()) return acl.take_error();
  if (!acl->has_value()) return Error(ENODATA);
  if (!is_default) SetPerms(**acl, inode.mode);
  const std::string out = Encode(**acl);
  if (size == 0) return out.size();
  if (size < out.size()) return Error(ERANGE);
  std::memcpy(value, out.data(), out.size());
  return out.size();
}

Result<uint32_t> FsImpl::InheritAcl(uint64_t parent_ino, const Inode& parent, uint32_t mode,
                                    uint32_t umask, InheritedAcl* out) {
  if (S_ISLNK(mode)) return mode;
  Result<std::optional<Acl>> inherited =
      LoadAcl(*this, parent_ino, parent, format::kAclDefaultName);
  if (!inherited.ok()) return inherited.take_error();
  if (!inherited->has_value()) return mode & ~(umask & kPermBits);
  Acl access = **inherited;
  if (Masq(access, &mode)) out->access = Encode(access);
  if (S_ISDIR(mode)) out->default_acl = Encode(**inherited);
  return mode;
}

Status FsImpl::StoreInheritedAcl(Tx& tx, uint64_t ino, const Inode& inode, const InheritedAcl& acl,
                                 timespec now) {
  XattrChange changes[2];
  size_t n = 0;
  if (acl.access) changes[n++] = {format::kAclAccessName, &*acl.access};
  if (acl.default_acl) changes[n++] = {format::kAclDefaultName, &*acl.default_acl};
  if (n == 0) return Status::Ok();
  return ChangeXattrs(tx, ino, inode, {changes, n}, now);
}

Status FsImpl::ChmodAcl(Tx& tx, uint64_t ino, const Inode& inode, uint32_t mode, timespec now) {
  if (S_ISLNK(inode.mode)) return Status::Ok();
  Result<std::optional<Acl>> acl = LoadAcl(*this, ino, inode, format::kAclAccessName);
  if (!acl.ok()) return acl.take_error();
  if (!acl->has_value()) return Status::Ok();
  SetPerms(**acl, mode);
  const std::string value = Encode(**acl);
  const XattrChange change{format::kAclAccessName, &value};
  return ChangeXattrs(tx, ino, inode, {&change, 1}, now);
}

}  // namespace nvfs
