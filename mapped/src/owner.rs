//! Whether a cluster's directory or file is this user's alone, as ssh asks
//! of a private key. A cluster's memory is its data: whoever else can read
//! a node file reads every value stored in it, and whoever can write it (or
//! owns it, and so can change its mode) can make clients return what they
//! like. So the backends refuse, before they map anything, a directory or
//! file that another user owns or that group or others may reach
//! (`swarm-backend-shm`'s directories and files, `swarm-backend-cxl`'s
//! plain files; device-dax devices are root's and group-accessible by
//! design, and are not checked).

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;

/// Checks an entry (directory or file) with metadata `meta` (taken on the
/// open file where there is one, so that the entry checked is the one
/// used): it must be owned by this process's effective user and grant
/// nothing to group and others. On refusal, why, in words that the caller
/// puts after the entry's path.
pub fn check_private(meta: &Metadata) -> Result<(), String> {
    private(meta.uid(), meta.mode(), meta.is_dir(), rustix::process::geteuid().as_raw())
}

/// [`check_private`] of an entry owned by `uid` with mode bits `mode` (a
/// directory if `dir`), for the user `me`.
pub fn private(uid: u32, mode: u32, dir: bool, me: u32) -> Result<(), String> {
    if uid != me {
        let name = user_name(uid).map(|n| format!(" ({n})")).unwrap_or_default();
        return Err(format!(
            "owned by uid {uid}{name}, not by you (uid {me}); refusing to use a cluster someone else can control"
        ));
    }
    let mode = mode & 0o777;
    if mode & 0o077 != 0 {
        let (what, want) = if dir { ("directory", "700") } else { ("file", "600") };
        return Err(format!(
            "{what} mode is {mode:o}; a cluster's must be {want}, reachable by no one else \
             (chmod {want} it if no one else used it, or remove it)"
        ));
    }
    Ok(())
}

/// The name of user `uid` in `/etc/passwd`, if it is there.
fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id = fields.nth(1)?.parse::<u32>().ok()?;
        (id == uid && !name.is_empty()).then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_is_mine_alone_passes() {
        assert_eq!(private(1000, 0o40700, true, 1000), Ok(()));
        assert_eq!(private(1000, 0o100600, false, 1000), Ok(()));
        assert_eq!(private(0, 0o100400, false, 0), Ok(()));

        // Another user's, whatever its mode: root does not use it either.
        let e = private(4_000_000_001, 0o40700, true, 0).unwrap_err();
        assert_eq!(
            e,
            "owned by uid 4000000001, not by you (uid 0); refusing to use a cluster someone else can control"
        );
        assert!(private(0, 0o100600, false, 1000).unwrap_err().starts_with("owned by uid 0 (root), not by you"));

        // Mine, but reachable by others.
        let e = private(1000, 0o40755, true, 1000).unwrap_err();
        assert!(e.starts_with("directory mode is 755; a cluster's must be 700"), "{e}");
        let e = private(1000, 0o100644, false, 1000).unwrap_err();
        assert!(e.starts_with("file mode is 644; a cluster's must be 600"), "{e}");
        for mode in [0o710, 0o701, 0o720, 0o702] {
            assert!(private(1000, mode, true, 1000).is_err(), "{mode:o}");
        }
    }

    #[test]
    fn real_entries_are_checked_by_their_metadata() {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

        let me = rustix::process::geteuid().as_raw();
        let root = std::fs::metadata("/").unwrap();
        assert_eq!(check_private(&root), private(root.uid(), root.mode(), true, me));
        let path = std::env::temp_dir().join(format!("swarm-mapped-owner-{}", std::process::id()));
        let file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).unwrap();
        let mine = check_private(&file.metadata().unwrap());
        file.set_permissions(std::fs::Permissions::from_mode(0o640)).unwrap();
        let shared = check_private(&file.metadata().unwrap());
        std::fs::remove_file(&path).unwrap();
        assert_eq!(mine, Ok(()));
        assert!(shared.unwrap_err().starts_with("file mode is 640"));
    }
}
