//! The C library: a C test program and the C example, compiled with `cc` through
//! pkg-config, run against a live cluster.

mod common;

use std::path::Path;
use std::process::Command;

use common::{TestCluster, library_dir, scratch_dir, workspace_root};

/// Compiles a C program against libringfs with the flags pkg-config gives for ringfs.pc.
fn compile(source: &str, output: &Path) {
    let (_, profile) = library_dir();
    let pkg_dir = output.parent().unwrap().join("pkgconfig");
    let script = workspace_root().join("scripts/install-c-library.sh");
    assert!(Command::new(&script).arg("--in-place").arg(&pkg_dir).arg(&profile).status().unwrap().success());
    let flags = Command::new("pkg-config").args(["--cflags", "--libs", "ringfs"]).env("PKG_CONFIG_PATH", &pkg_dir).output().unwrap();
    assert!(flags.status.success(), "pkg-config: {}", String::from_utf8_lossy(&flags.stderr));
    let flags = String::from_utf8(flags.stdout).unwrap();
    let compiled = Command::new("cc")
        .args(["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-pthread"])
        .arg(workspace_root().join(source))
        .args(flags.split_whitespace())
        .arg("-o")
        .arg(output)
        .output()
        .unwrap();
    assert!(compiled.status.success(), "cc failed:\n{}", String::from_utf8_lossy(&compiled.stderr));
}

fn run_against(cluster: &TestCluster, program: &Path) -> std::process::Output {
    Command::new(program)
        .env("RINGFS_SERVER", cluster.addresses().join(","))
        .env("RINGFS_SECRET", &cluster.secret)
        .env("RINGFS_TIMEOUT_MS", "5000")
        .output()
        .unwrap()
}

#[test]
fn the_c_test_program_passes_against_a_live_cluster() {
    let scratch = scratch_dir("c-api");
    let program = scratch.join("test_ringfs");
    compile("tests/c/test_ringfs.c", &program);
    let cluster = TestCluster::start(3);
    let output = run_against(&cluster, &program);
    assert!(
        output.status.success(),
        "C checks failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("all C API checks passed"));
    let _ = std::fs::remove_dir_all(scratch);
}

#[test]
fn the_c_example_runs() {
    let scratch = scratch_dir("c-example");
    let program = scratch.join("hello");
    compile("examples/c/hello.c", &program);
    let cluster = TestCluster::start(2);
    let output = run_against(&cluster, &program);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("read back 28 bytes: Hello from C through ringfs"), "{stdout}");
    assert!(stdout.contains("greeting.txt"), "{stdout}");
    // Without a cluster the example explains what is missing.
    let output = Command::new(&program).env_remove("RINGFS_SERVER").output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("ringfs_init"));
    let _ = std::fs::remove_dir_all(scratch);
}

/// An unprivileged user holding the job's secret (a process of its own, through the C
/// library) is refused what the modes refuse: the servers check every call for the user the
/// client states, not only the FUSE mount's kernel.
#[test]
fn another_user_is_refused_what_modes_refuse_through_the_c_library() {
    if !common::running_as_root() {
        eprintln!("SKIPPED: this test runs a program as another user and needs root");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    const OTHER: u32 = 60002;
    let scratch = scratch_dir("c-other-user");
    std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o755)).unwrap();
    let program = scratch.join("another_user");
    compile("tests/c/another_user.c", &program);
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    common::write_file(&client, "/private", b"secret");
    client.chmod("/private", 0o600).unwrap();
    common::write_file(&client, "/public", b"p");
    client.chmod("/public", 0o644).unwrap();
    client.mkdir("/closed", 0o700).unwrap();
    client.mkdir("/open", 0o777).unwrap();
    client.chmod("/open", 0o777).unwrap();
    client.chmod("/", 0o755).unwrap();
    let output = Command::new(&program)
        .env("RINGFS_SERVER", cluster.addresses().join(","))
        .env("RINGFS_SECRET", &cluster.secret)
        .env("RINGFS_TIMEOUT_MS", "5000")
        .uid(OTHER)
        .gid(OTHER)
        .output()
        .unwrap();
    assert!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).contains("another user's checks passed"),
        "another user through the C library:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(common::read_file(&client, "/private").unwrap(), b"secret");
    let _ = std::fs::remove_dir_all(scratch);
}

/// The global memory's C interface (`include/ringfs_gmem.h`), run as 3 ranks by
/// `ringfs run --ranks`, and the C example with 4.
#[test]
fn global_memory_through_the_c_header_with_ringfs_run_ranks() {
    let scratch = scratch_dir("c-gmem");
    let check = scratch.join("gmem_check");
    compile("tests/c/gmem_check.c", &check);
    let example = scratch.join("gmem_hello");
    compile("examples/c/gmem_hello.c", &example);
    for (program, ranks, expected) in [(&check, "3", "gmem checks passed"), (&example, "4", "sees 4 arrivals; last rank wrote 3")] {
        let output = Command::new(common::ringfs_binary())
            .args(["run", "--servers", "2", "--gmem-dram", "16M", "--ranks", ranks, "--"])
            .arg(program)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{}:\n{stdout}{}", program.display(), String::from_utf8_lossy(&output.stderr));
        assert_eq!(stdout.matches(expected).count(), ranks.parse::<usize>().unwrap(), "every rank reports: {stdout}");
    }
    let _ = std::fs::remove_dir_all(scratch);
}
