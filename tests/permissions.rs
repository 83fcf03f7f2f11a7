//! Owners and permissions (issue 12) through the FUSE mount, as root and as two unprivileged
//! users (uids that need no account: the test runs its shell commands under them).
//!
//! The mount runs as root with `--allow-other`, as a job's mount shared with other users
//! would; the kernel checks modes against the attributes ringfs reports
//! (`default_permissions`), so what ringfs must get right is whom entries belong to.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

use common::{TestCluster, fuse_available, running_as_root};

/// Two users with no account: uid = gid.
const ALICE: u32 = 65534;
const BOB: u32 = 60001;

/// Runs `script` with `sh` as `uid` (and group `uid`, no supplementary groups).
fn as_user(uid: u32, script: &str) -> Output {
    let mut command = Command::new("sh");
    command.arg("-c").arg(script).current_dir("/").env_clear().env("PATH", "/usr/bin:/bin");
    // (std drops the supplementary groups when root sets the uid.)
    command.uid(uid).gid(uid).output().unwrap()
}

/// A mount other users can reach (the cluster directory is private otherwise); `None` where
/// the test cannot run (no FUSE, not root).
fn shared_mount(cluster: &TestCluster) -> Option<common::Mount> {
    if !running_as_root() {
        eprintln!("SKIPPED: these tests switch users and need root");
        return None;
    }
    if !fuse_available() {
        return None;
    }
    std::fs::set_permissions(&cluster.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mount = cluster.mount(&["--allow-other"]);
    Some(mount)
}

/// What a step did: its exit status and its error output (paths made relative).
fn outcome(uid: u32, script: &str, root: &str) -> (bool, String, String) {
    let output = as_user(uid, &script.replace("{root}", root));
    // Lines sorted: directory order differs between file systems.
    let clean = |bytes: &[u8]| {
        let text = String::from_utf8_lossy(bytes).replace(root, "ROOT");
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort();
        lines.join("\n")
    };
    (output.status.success(), clean(&output.stdout), clean(&output.stderr))
}

/// The owner, group and mode bits of everything below `root`, by relative path.
fn ownership(root: &std::path::Path) -> Vec<(String, u32, u32, u32)> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let metadata = std::fs::symlink_metadata(entry.path()).unwrap();
            let name = entry.path().strip_prefix(root).unwrap().display().to_string();
            // (A symbolic link's mode is always 0777.)
            found.push((name, metadata.uid(), metadata.gid(), metadata.mode() & 0o7777));
            if metadata.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    found.sort();
    found
}

/// Steps of two users and root in a shared sticky directory, run on the mount and on tmpfs:
/// every step must succeed or fail alike (same message), and the trees must end with the
/// same owners and modes.
#[test]
fn users_own_what_they_create_and_modes_keep_others_out_as_on_tmpfs() {
    let cluster = TestCluster::start(2);
    let Some(mount) = shared_mount(&cluster) else { return };
    let tmpfs = std::path::PathBuf::from(format!("/dev/shm/ringfs-permissions-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmpfs);
    std::fs::create_dir(&tmpfs).unwrap();
    std::fs::set_permissions(&tmpfs, std::fs::Permissions::from_mode(0o755)).unwrap();
    let steps: &[(u32, &str)] = &[
        (0, "mkdir {root}/shared && chmod 1777 {root}/shared"),
        (
            ALICE,
            "umask 027 && mkdir {root}/shared/a && echo secret > {root}/shared/a/private && chmod 600 {root}/shared/a/private \
             && echo hi > {root}/shared/a/public && chmod 644 {root}/shared/a/public && ln -s public {root}/shared/a/link \
             && mkfifo {root}/shared/a/fifo",
        ),
        // Bob is neither owner nor in Alice's group: "other" bits (none on a/ yet).
        (BOB, "ls {root}/shared/a"),
        (BOB, "cat {root}/shared/a/private"),
        (ALICE, "chmod 755 {root}/shared/a"),
        (BOB, "ls {root}/shared/a"),
        (BOB, "cat {root}/shared/a/private"),
        (BOB, "cat {root}/shared/a/public"),
        (BOB, "touch {root}/shared/a/new"),
        (BOB, "echo x >> {root}/shared/a/public"),
        (BOB, "chmod 777 {root}/shared/a/public"),
        (BOB, "chown 60001 {root}/shared/a/public"),
        (ALICE, "chown 0 {root}/shared/a/public"),
        (ALICE, "chgrp 0 {root}/shared/a/public"),
        // The sticky bit: Bob may create in shared/, not remove or move what Alice owns.
        (BOB, "mkdir {root}/shared/b && echo mine > {root}/shared/b/f"),
        (BOB, "rm -rf {root}/shared/a"),
        (BOB, "mv {root}/shared/a {root}/shared/b/taken"),
        (ALICE, "rmdir {root}/shared/b"),
        (ALICE, "rm -f {root}/shared/b/f"),
        // Root reads anything and gives files away.
        (0, "cat {root}/shared/a/private"),
        (0, "chown 60001:60001 {root}/shared/a/public"),
        (BOB, "echo more >> {root}/shared/a/public && cat {root}/shared/a/public"),
        (ALICE, "cat {root}/shared/a/public"),
        // Setting the group of one's own file to a group one is not in is refused.
        (ALICE, "chgrp 60001 {root}/shared/a/private"),
        // Directories' search permission.
        (ALICE, "chmod 700 {root}/shared/a"),
        (BOB, "cat {root}/shared/a/public"),
        (BOB, "stat -c %s {root}/shared/a/public"),
    ];
    for (number, (uid, script)) in steps.iter().enumerate() {
        let on_mount = outcome(*uid, script, &mount.dir.display().to_string());
        let on_tmpfs = outcome(*uid, script, &tmpfs.display().to_string());
        assert_eq!(on_mount, on_tmpfs, "step {number} as {uid}: {script}\n(left: the mount, right: tmpfs)");
    }
    assert_eq!(ownership(&mount.dir), ownership(&tmpfs), "owners and modes (left: the mount, right: tmpfs)");
    let _ = std::fs::remove_dir_all(&tmpfs);
}
