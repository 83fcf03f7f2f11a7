//! The LD_PRELOAD library: unmodified programs (coreutils, tar, Python, a C program using
//! stdio) run under `libringfs_preload.so` against a live cluster. Each runs the same script
//! on ringfs (under the prefix) and on a local directory; the outputs must match, and what
//! the programs wrote is checked through the native client.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{TestCluster, preload_library, read_file, scratch_dir, workspace_root, write_file};

/// A cluster with the environment that puts it under a prefix for preloaded programs.
struct Preloaded {
    cluster: TestCluster,
    /// The prefix (`/ringfs-e2e-…`): absent from the kernel's file system.
    prefix: String,
    library: PathBuf,
    /// A local directory for the comparison runs.
    local: PathBuf,
}

impl Preloaded {
    fn start(servers: usize) -> Preloaded {
        let cluster = TestCluster::start(servers);
        let prefix = format!("/ringfs-e2e-{:x}", ringfs_rpc::memory::random_u64());
        Preloaded { cluster, prefix, library: preload_library(), local: scratch_dir("preload-local").keep() }
    }

    /// A command with the preload environment.
    fn command(&self, program: &str) -> Command {
        self.with_environment(Command::new(program))
    }

    /// `command` with the preload environment.
    fn with_environment(&self, mut command: Command) -> Command {
        command
            .env("LD_PRELOAD", &self.library)
            .env("RINGFS_MOUNT", &self.prefix)
            .env("RINGFS_SERVER", self.cluster.addresses().join(","))
            .env("RINGFS_SECRET", &self.cluster.secret)
            .env("RINGFS_TIMEOUT_MS", "5000")
            .env("LC_ALL", "C");
        command
    }

    /// Runs a shell script under the library with `$ROOT` set to `root`; panics on failure.
    fn script(&self, root: &str, script: &str) -> String {
        let output = self.command("sh").arg("-euc").arg(script).env("ROOT", root).output().unwrap();
        succeeded(&output, script);
        String::from_utf8_lossy(&output.stdout).replace(root, "$ROOT")
    }

    /// Runs `script` on ringfs (`$ROOT` a fresh directory under the prefix) and on a fresh
    /// local directory; asserts both print the same; returns the ringfs path of `$ROOT`.
    fn same_as_local(&self, name: &str, script: &str) -> String {
        let ringfs_root = format!("{}/{name}", self.prefix);
        let local_root = self.local.join(name);
        std::fs::create_dir_all(&local_root).unwrap();
        self.script(&self.prefix, &format!("mkdir {name}", name = ringfs_root));
        let on_ringfs = self.script(&ringfs_root, script);
        let on_local = self.script(local_root.to_str().unwrap(), script);
        assert_eq!(on_ringfs, on_local, "the script printed differently on ringfs and on a local directory:\n{script}");
        format!("/{name}")
    }
}

impl Drop for Preloaded {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.local);
    }
}

fn succeeded(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what}\nfailed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A local source tree: text, a 3 MiB file spanning chunks, an empty file, a symbolic link,
/// nested directories.
fn source_tree(dir: &Path) {
    std::fs::create_dir_all(dir.join("a/b/c")).unwrap();
    std::fs::write(dir.join("a/hello.txt"), "hello, ringfs\n").unwrap();
    std::fs::write(dir.join("a/empty"), "").unwrap();
    let mut random = common::Random::new(15);
    let mut big = vec![0u8; 3 << 20];
    random.fill(&mut big);
    std::fs::write(dir.join("a/b/big.bin"), &big).unwrap();
    std::fs::write(dir.join("a/b/c/deep.txt"), "deep\n".repeat(100)).unwrap();
    std::os::unix::fs::symlink("hello.txt", dir.join("a/link")).unwrap();
}

/// Two programs under the library (two clients, as on two nodes) appending lines to one
/// log at once (`echo >>`): every line lands, none over another.
#[test]
fn appends_of_two_programs_at_once_all_land() {
    let preloaded = Preloaded::start(2);
    let root = format!("{}/appends", preloaded.prefix);
    preloaded.script(&preloaded.prefix, &format!("mkdir {root} && : > {root}/log"));
    let writers: Vec<_> = ["a", "b"]
        .iter()
        .map(|writer| {
            let script = format!("for i in $(seq 100); do echo \"{writer} $i\" >> \"$ROOT/log\"; done");
            preloaded.command("sh").arg("-euc").arg(script).env("ROOT", &root).spawn().unwrap()
        })
        .collect();
    for mut writer in writers {
        assert!(writer.wait().unwrap().success());
    }
    let listed = preloaded.script(&root, "sort \"$ROOT/log\" | uniq | wc -l; wc -l < \"$ROOT/log\"");
    assert_eq!(listed.split_whitespace().collect::<Vec<_>>(), ["200", "200"], "distinct lines, then all lines");
}

#[test]
fn coreutils_cp_cat_ls_mkdir_mv_find_du_and_rm_work_as_on_a_local_directory() {
    let preloaded = Preloaded::start(3);
    let source = preloaded.local.join("source");
    source_tree(&source);
    let script = format!(
        r#"
        SRC={source}
        mkdir -p "$ROOT/x/y/z"
        cp -r "$SRC" "$ROOT/copy"
        cat "$ROOT/copy/a/hello.txt" "$ROOT/copy/a/link"
        cmp "$SRC/a/b/big.bin" "$ROOT/copy/a/b/big.bin"
        # mode, size (files) and name of every entry
        ls -l "$ROOT/copy/a" | awk 'NR > 1 {{ print $1, ($1 ~ /^-/ ? $5 : "-"), $NF }}'
        ls -a "$ROOT/copy/a/b"
        find "$ROOT" | sort
        find "$ROOT" -type f -name '*.txt' | sort
        find "$ROOT/copy" -type f -exec du -b {{}} + | sort -k2
        du -sb "$ROOT/copy/a/b/big.bin"
        mv "$ROOT/copy/a/b" "$ROOT/x/moved"
        mv "$ROOT/copy/a/hello.txt" "$ROOT/copy/a/renamed.txt"
        ls "$ROOT/x" "$ROOT/copy/a"
        # Standard output redirected to ringfs: ls writes it through stdio, at exit.
        ls -l "$ROOT/copy/a" > "$ROOT/listing" && printf '%s\n' appended >> "$ROOT/listing"
        awk 'NR > 1 {{ print $NF }}' < "$ROOT/listing"
        # Two programs writing one open file in turn share its position.
        {{ ls "$ROOT/copy/a"; ls "$ROOT/copy"; echo end; }} > "$ROOT/twice" && cat "$ROOT/twice"
        # Tools that make temporary files beside their output, or redirect their stdout.
        printf 'b\na\n' > "$ROOT/unsorted" && sort -o "$ROOT/sorted" "$ROOT/unsorted" && cat "$ROOT/sorted"
        sed -i 's/a/A/' "$ROOT/sorted" && cat "$ROOT/sorted"
        made=$(mktemp -d "$ROOT/tmp.XXXXXX") && test -d "$made" && rmdir "$made" && echo mktemp-ok
        echo "$(cat "$ROOT/copy/a/renamed.txt" | tr a-z A-Z)" > "$ROOT/upper" && cat "$ROOT/upper"
        cd "$ROOT/x" && pwd && ls && cat moved/c/deep.txt | wc -l && cd /
        rm -r "$ROOT/x"
        rm "$ROOT/copy/a/link"
        ls "$ROOT" "$ROOT/copy/a"
        test ! -e "$ROOT/x" && echo gone
        "#,
        source = source.display()
    );
    let root = preloaded.same_as_local("coreutils", &script);
    // What the tools left, read with the native client.
    let client = preloaded.cluster.client();
    assert_eq!(read_file(&client, &format!("{root}/copy/a/renamed.txt")).unwrap(), b"hello, ringfs\n");
    assert!(client.stat(&format!("{root}/x")).is_err());
}

#[test]
fn tar_archives_and_extracts_a_tree_on_ringfs() {
    let preloaded = Preloaded::start(2);
    let source = preloaded.local.join("source");
    source_tree(&source);
    let script = format!(
        r#"
        tar -C {parent} -cf "$ROOT/tree.tar" source
        tar -tvf "$ROOT/tree.tar" | awk '{{ print $1, $3, $NF }}' | sort -k3
        mkdir "$ROOT/out"
        tar -C "$ROOT/out" -xf "$ROOT/tree.tar"
        diff -r {source} "$ROOT/out/source" && echo identical
        tar -C "$ROOT" -czf "$ROOT/again.tgz" out
        tar -tzf "$ROOT/again.tgz" | sort
        "#,
        parent = preloaded.local.display(),
        source = source.display()
    );
    let root = preloaded.same_as_local("tar", &script);
    let client = preloaded.cluster.client();
    let big = read_file(&client, &format!("{root}/out/source/a/b/big.bin")).unwrap();
    assert_eq!(big, std::fs::read(source.join("a/b/big.bin")).unwrap());
    assert_eq!(client.readlink(&format!("{root}/out/source/a/link")).unwrap(), "hello.txt");
}

#[test]
fn python_open_os_and_shutil_work_on_ringfs() {
    let preloaded = Preloaded::start(2);
    let program = r#"
import os, shutil, subprocess, sys
root = sys.argv[1]
os.makedirs(os.path.join(root, "d/e"), exist_ok=True)
with open(os.path.join(root, "f.txt"), "w") as f:
    f.write("hello\n" * 1000)
with open(os.path.join(root, "f.txt")) as f:
    assert f.read() == "hello\n" * 1000
with open(os.path.join(root, "blob"), "wb") as f:
    f.write(bytes(range(256)) * 8192)
shutil.copy(os.path.join(root, "f.txt"), os.path.join(root, "d/g.txt"))
shutil.copyfile(os.path.join(root, "blob"), os.path.join(root, "d/blob"))
shutil.copytree(os.path.join(root, "d"), os.path.join(root, "d2"))
print(sorted(os.listdir(root)))
print(sorted((entry.name, entry.is_dir(), entry.is_file()) for entry in os.scandir(root)))
os.rename(os.path.join(root, "d2"), os.path.join(root, "d3"))
print(os.stat(os.path.join(root, "d3/blob")).st_size, os.path.getsize(os.path.join(root, "d/g.txt")))
for path, dirs, files in sorted(os.walk(root)):
    print(path.replace(root, "ROOT"), sorted(dirs), sorted(files))
os.chdir(root)
print(os.path.basename(os.getcwd()), sorted(os.listdir(".")), open("f.txt").read(6).strip())
with open("f.txt", "r+b") as f:
    f.seek(2)
    f.write(b"XY")
    f.seek(0)
    print(f.read(8))
os.truncate("f.txt", 3)
print(os.stat("f.txt").st_size, os.path.exists("missing"), os.path.isdir("d"))
with open("from-child.txt", "w") as out:
    subprocess.run(["ls", "d3"], stdout=out, check=True)
    subprocess.run(["sh", "-c", "echo second; echo to-stderr >&2"], stdout=out, stderr=subprocess.DEVNULL, check=True)
print("parent's stdout is intact", open("from-child.txt").read().split())
print(subprocess.run(["cat", "from-child.txt"], capture_output=True, text=True).stdout.split())
shutil.rmtree("d3")
os.remove("blob")
os.chdir("/")
print(sorted(os.listdir(root)))
"#;
    let script_path = preloaded.local.join("program.py");
    std::fs::write(&script_path, program).unwrap();
    let root = preloaded.same_as_local("python", &format!("python3 {} \"$ROOT\"", script_path.display()));
    let client = preloaded.cluster.client();
    assert_eq!(read_file(&client, &format!("{root}/f.txt")).unwrap(), b"heX");
    assert_eq!(read_file(&client, &format!("{root}/d/blob")).unwrap().len(), 256 * 8192);
}

#[test]
fn numpy_save_load_and_memory_maps_work_on_ringfs() {
    let probe = Command::new("python3").args(["-c", "import numpy"]).output().unwrap();
    if !probe.status.success() {
        eprintln!("SKIPPED: numpy is not installed for python3");
        return;
    }
    let preloaded = Preloaded::start(2);
    let program = r#"
import numpy as np, sys
root = sys.argv[1]
a = np.arange(300000, dtype=np.float64).reshape(1000, 300)
np.save(root + "/a.npy", a)
assert (np.load(root + "/a.npy") == a).all()
mapped = np.load(root + "/a.npy", mmap_mode="r")
np.savez_compressed(root + "/z.npz", a=a, b=a[:5])
print("numpy", mapped.shape, float(mapped[10].sum()), (np.load(root + "/z.npz")["b"] == a[:5]).all())
"#;
    let script_path = preloaded.local.join("numpy_program.py");
    std::fs::write(&script_path, program).unwrap();
    let root = preloaded.same_as_local("numpy", &format!("python3 {} \"$ROOT\"", script_path.display()));
    let stat = preloaded.cluster.client().stat(&format!("{root}/a.npy")).unwrap();
    assert_eq!(stat.size, 300000 * 8 + 128, "the .npy header is 128 bytes");
}

#[test]
fn a_c_program_using_stdio_descriptors_mmap_and_fork_runs_on_ringfs() {
    let preloaded = Preloaded::start(2);
    let program = preloaded.local.join("preload_stdio");
    let compiled = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg(workspace_root().join("tests/c/preload_stdio.c"))
        .arg("-o")
        .arg(&program)
        .output()
        .unwrap();
    succeeded(&compiled, "cc tests/c/preload_stdio.c");
    // The program prints the last component of its working directory: both are named "c".
    let script = format!("mkdir \"$ROOT/c\" && {} \"$ROOT/c\"", program.display());
    let root = preloaded.same_as_local("cprogram", &script);
    let client = preloaded.cluster.client();
    assert_eq!(read_file(&client, &format!("{root}/c/forked.txt")).unwrap(), b"parent\nchild\n");
    assert_eq!(read_file(&client, &format!("{root}/c/child.txt")).unwrap(), b"from the child\n");
}

/// A program that bounds a lock wait with a timer (`alarm`, a handler, `F_SETLKW`) gets its
/// EINTR when the timer fires, as on a local file system — the library's wait once went on
/// after the handler ran, for as long as the holder held the lock.
#[test]
fn a_lock_wait_ends_when_a_signal_handler_runs() {
    let preloaded = Preloaded::start(1);
    let program = r#"
import errno, fcntl, os, signal, sys, time
fd = os.open(os.path.join(sys.argv[1], "locked"), os.O_RDWR | os.O_CREAT, 0o644)
ready_r, ready_w = os.pipe()
done_r, done_w = os.pipe()
holder = os.fork()
if holder == 0:
    fcntl.lockf(fd, fcntl.LOCK_EX)
    os.write(ready_w, b"x")
    os.read(done_r, 1)
    fcntl.lockf(fd, fcntl.LOCK_UN)
    os._exit(0)
os.read(ready_r, 1)
def timed_out(*_):
    raise InterruptedError(errno.EINTR, "timed out")
signal.signal(signal.SIGALRM, timed_out)
signal.setitimer(signal.ITIMER_REAL, 0.3)
started = time.monotonic()
try:
    fcntl.lockf(fd, fcntl.LOCK_EX)
    print("locked while another process held the lock")
except InterruptedError:
    print("the wait ended with EINTR; within 5 s:", time.monotonic() - started < 5)
os.write(done_w, b"x")
os.waitpid(holder, 0)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked once the holder let go")
"#;
    let script_path = preloaded.local.join("alarm.py");
    std::fs::write(&script_path, program).unwrap();
    // (`timeout`: the wait that did not end would hang the test.)
    preloaded.same_as_local("alarm", &format!("timeout 30 python3 {} \"$ROOT\"", script_path.display()));
}

/// rsync into and out of ringfs (`-a`, `-aH`, `--delete`, a destination given with and
/// without a trailing `/`): every file's type, mode, size, link count, time and target as on
/// a local directory. rsync's receiver opens its destination one component at a time from
/// a descriptor of `/` (`ringfs` relative to `/`), which the library once sent to the kernel:
/// `change_dir#2 failed: No such file or directory`; a path relative to the kernel's working
/// directory (`ringfs/x` from `/`) went there too.
#[test]
fn rsync_copies_trees_into_and_out_of_ringfs_as_on_a_local_directory() {
    let preloaded = Preloaded::start(2);
    let source = preloaded.local.join("source");
    source_tree(&source);
    std::fs::hard_link(source.join("a/hello.txt"), source.join("a/hard")).unwrap();
    let script = format!(
        r#"
        # Type, mode, size, link count, mtime and target of every entry (directories: no size
        # or link count, which ringfs reports as 0 and 2).
        listing() {{ cd "$1" && {{ find . ! -type d -printf '%p %y %m %s %n %T@ %l\n'; find . -type d -printf '%p %m %T@\n'; }} | sort; cd /; }}
        # Times in the past: rsync does not set a time equal to the second it finds.
        aged() {{ find "$1" -depth -exec touch -h -d '2021-02-03 04:05:06.123456789' {{}} +; }}
        WORK=$(mktemp -d)
        cp -a {source} "$WORK/src" && aged "$WORK/src"
        rsync -a "$WORK/src/" "$ROOT/copy/"
        rsync -a "$WORK/src" "$ROOT/"
        rsync -aH "$WORK/src/" "$ROOT/linked"
        listing "$ROOT/copy"
        listing "$ROOT/linked"
        listing "$WORK/src" > "$WORK/expected"
        # Without -H the two names of a file arrive as two files.
        listing "$ROOT/src" | diff "$WORK/expected" - || echo src-differs-by-its-links
        listing "$ROOT/linked" | diff "$WORK/expected" -
        # Relative paths from the kernel's working directory lead there too.
        (cd / && ls "${{ROOT#/}}/linked/a" && cd /tmp && cat "../${{ROOT#/}}/linked/a/hard")
        rm "$WORK/src/a/b/c/deep.txt" "$WORK/src/a/empty"
        echo new > "$WORK/src/a/new.txt" && aged "$WORK/src"
        rsync -aH --delete "$WORK/src/" "$ROOT/linked/"
        listing "$ROOT/linked"
        rsync -aH "$ROOT/linked/" "$WORK/back"
        diff -r "$WORK/src" "$WORK/back"
        listing "$WORK/src" > "$WORK/expected"
        listing "$WORK/back" | diff "$WORK/expected" -
        rsync -a --delete "$ROOT/copy/" "$WORK/back/"
        listing "$WORK/back"
        rm -r "$WORK"
        "#,
        source = source.display()
    );
    let root = preloaded.same_as_local("rsync", &script);
    let client = preloaded.cluster.client();
    let linked = client.stat(&format!("{root}/linked/a/hard")).unwrap();
    assert_eq!((linked.nlink, linked.ino), (2, client.stat(&format!("{root}/linked/a/hello.txt")).unwrap().ino), "-H kept the link");
    assert!(client.stat(&format!("{root}/linked/a/b/c/deep.txt")).is_err(), "--delete removed it");
    assert_eq!(read_file(&client, &format!("{root}/src/a/b/big.bin")).unwrap(), std::fs::read(source.join("a/b/big.bin")).unwrap());
}

/// Symbolic links resolve as through a mount at the prefix: an absolute target under the
/// prefix is ringfs's, any other absolute target — and a relative one leaving through `..` —
/// is the kernel's. Each link is read, listed, entered and run on ringfs and on a local
/// directory alike; before, every absolute target was taken for a ringfs path (ENOENT).
#[test]
fn symbolic_links_lead_where_a_mount_at_the_prefix_would_lead() {
    let preloaded = Preloaded::start(2);
    let kernel_dir = preloaded.local.join("kernel-side");
    std::fs::create_dir_all(&kernel_dir).unwrap();
    std::fs::write(kernel_dir.join("note.txt"), "a kernel file\n").unwrap();
    let script = format!(
        r#"
        K={kernel}
        mkdir "$ROOT/d" && echo inside > "$ROOT/d/f"
        printf '#!/bin/sh\necho script "$@"\n' > "$ROOT/d/s.sh" && chmod +x "$ROOT/d/s.sh"
        cd "$ROOT"
        ln -s "$ROOT/d" abs-inside
        ln -s d relative
        ln -s "$K/note.txt" abs-kernel
        ln -s "$K" abs-kernel-dir
        ln -s "../../../../../../../../../..$K/note.txt" up-and-out
        ln -s "$(python3 -c 'import sys; print(sys.executable)')" py
        ln -s "$ROOT/d/s.sh" script
        ln -s missing dangling
        for link in abs-inside relative abs-kernel abs-kernel-dir up-and-out dangling; do
            printf '%s -> %s %s\n' "$link" "$(readlink "$link" | sed "s|$ROOT|ROOT|; s|$K|K|")" "$(test -e "$link" && echo exists || echo missing)"
        done
        cat abs-inside/../abs-kernel up-and-out "$ROOT/relative/../d/f"
        ls abs-kernel-dir
        stat -L -c '%s %F' abs-kernel abs-kernel-dir
        (cd abs-kernel-dir && cat note.txt)
        python3 -c 'import sys; print(open(sys.argv[1]).read().strip(), len(__import__("os").listdir(sys.argv[2])))' abs-kernel abs-kernel-dir
        ./py -c 'print("python through a link")'
        "$ROOT/script" one two
        ./d/s.sh three
        cd /
        "#,
        kernel = kernel_dir.display()
    );
    preloaded.same_as_local("symlinks", &script);
    // A program whose bytes are in ringfs cannot run (as on a noexec mount).
    let output = preloaded
        .command("sh")
        .arg("-c")
        .arg(format!("cp /bin/true {p}/true && chmod +x {p}/true && {p}/true", p = preloaded.prefix))
        .output()
        .unwrap();
    assert!(!output.status.success() && String::from_utf8_lossy(&output.stderr).contains("Permission denied"), "{output:?}");
}

/// A Python virtual environment made in ringfs (`bin/python3` a link to the system's Python,
/// `bin/pip` a script whose `#!` names it) runs through the library as from a mount:
/// `python3 -m venv` (which installs pip by running the environment's Python) and its
/// `pip --version`, by path and after `activate`.
#[test]
fn a_python_virtual_environment_in_ringfs_runs_its_pip() {
    let preloaded = Preloaded::start(2);
    let script = r#"
        python3 -m venv "$ROOT/venv"
        "$ROOT/venv/bin/pip" --version | sed 's/^pip [0-9.]* from //'
        . "$ROOT/venv/bin/activate"
        pip --version | sed 's/^pip [0-9.]* from //'
        python -c 'import sys; print(sys.prefix, sys.prefix != sys.base_prefix)'
        "#;
    let root = preloaded.same_as_local("venv", script);
    let client = preloaded.cluster.client();
    let config = String::from_utf8(read_file(&client, &format!("{root}/venv/pyvenv.cfg")).unwrap()).unwrap();
    assert!(config.contains("home = "), "{config}");
    assert!(client.lstat(&format!("{root}/venv/bin/python3")).unwrap().mode & 0o170000 == 0o120000, "a symbolic link");
}

#[test]
fn files_written_natively_are_seen_by_preloaded_programs_and_kernel_paths_are_untouched() {
    let preloaded = Preloaded::start(2);
    let client = preloaded.cluster.client();
    client.mkdir("/native", 0o755).unwrap();
    write_file(&client, "/native/note.txt", b"written by the native client\n");
    let local_file = preloaded.local.join("local.txt");
    std::fs::write(&local_file, "kernel file\n").unwrap();
    let script = format!(
        r#"
        cat "$ROOT/native/note.txt" {local}
        wc -c < "$ROOT/native/note.txt"
        ls "$ROOT"
        cp {local} "$ROOT/native/from-kernel.txt"
        cat "$ROOT/native/from-kernel.txt"
        # A rename between ringfs and the kernel's file system is EXDEV; mv then copies.
        mv "$ROOT/native/from-kernel.txt" {local}.moved
        cat {local}.moved
        "#,
        local = local_file.display()
    );
    let output = preloaded.script(&preloaded.prefix, &script);
    assert_eq!(
        output, "written by the native client\nkernel file\n29\nnative\nkernel file\nkernel file\n",
        "preloaded programs see what the native client wrote"
    );
    assert!(client.stat("/native/from-kernel.txt").is_err(), "mv removed the source on ringfs");
}

#[test]
fn fio_writes_and_verifies_files_with_processes_and_threads() {
    if Command::new("fio").arg("--version").output().is_err() {
        // scripts/setup.sh installs it; without it there is nothing to run.
        eprintln!("SKIPPED: fio is not installed");
        return;
    }
    let preloaded = Preloaded::start(3);
    let client = preloaded.cluster.client();
    client.mkdir("/fio", 0o755).unwrap();
    let directory = format!("{}/fio", preloaded.prefix);
    // Processes (fork) with a random mix, then threads: every block is checked (crc32c).
    for job in [&["--name=processes", "--rw=randrw", "--numjobs=2"][..], &["--name=threads", "--rw=write", "--thread", "--numjobs=2"][..]] {
        let output = preloaded
            .command("fio")
            .args(["--ioengine=psync", "--bs=64k", "--size=8m", "--verify=crc32c", "--do_verify=1", "--group_reporting"])
            // (No verify state files in the working directory.)
            .arg("--verify_state_save=0")
            .arg(format!("--directory={directory}"))
            .args(job)
            .output()
            .unwrap();
        succeeded(&output, &format!("fio {job:?}"));
        let report = String::from_utf8_lossy(&output.stdout);
        assert!(report.contains("err= 0"), "{report}");
    }
    let names: Vec<String> = client.readdir("/fio").unwrap().into_iter().map(|entry| entry.name).collect();
    assert_eq!(names, ["processes.0.0", "processes.1.0", "threads.0.0", "threads.1.0"]);
    for entry in client.readdir("/fio").unwrap() {
        assert_eq!(entry.stat.size, 8 << 20, "{}", entry.name);
    }
}

#[test]
fn ringfs_run_preload_runs_a_command_with_the_library() {
    preload_library();
    let output = Command::new(common::ringfs_binary())
        .args(["run", "--servers", "2", "--preload", "/rfs-run", "--"])
        .args(["sh", "-c", "mkdir /rfs-run/d && echo job > /rfs-run/d/out && cat /rfs-run/d/out && ls /rfs-run"])
        .output()
        .unwrap();
    succeeded(&output, "ringfs run --preload");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "job\nd\n");
}

/// An MPI program using MPI-IO (MPICH's ROMIO, its POSIX "ufs" driver): collective block
/// writes, a strided file view (two-phase I/O and data sieving), reads of other ranks' data,
/// all checked by the program; 3 ranks under `mpiexec` with the library preloaded. The
/// files it wrote are checked through the native client too.
#[test]
fn an_mpi_program_using_mpi_io_runs_on_ringfs() {
    let Some(mpi) = common::mpi::Mpi::find() else {
        assert!(std::env::var_os("RINGFS_REQUIRE_MPI").is_none(), "mpicc and mpiexec are required (RINGFS_REQUIRE_MPI)");
        eprintln!("skipped: mpicc or mpiexec missing (scripts/setup.sh installs MPICH)");
        return;
    };
    let preloaded = Preloaded::start(2);
    let program = preloaded.local.join("mpiio");
    let compiled = mpi.compile(&workspace_root().join("tests/c/mpiio.c"), &program);
    succeeded(&compiled, &format!("{} tests/c/mpiio.c", mpi.compiler));
    let root = format!("{}/mpi", preloaded.prefix);
    preloaded.script(&preloaded.prefix, &format!("mkdir {root}"));
    let output = preloaded.with_environment(mpi.mpiexec(3)).arg(&program).arg(&root).output().unwrap();
    succeeded(&output, "mpiexec -n 3 mpiio");
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), format!("mpiio ok 3 {}", 3 * (1 << 20) + 3 * 64 * 1000));
    let client = preloaded.cluster.client();
    let blocks = read_file(&client, "/mpi/blocks").unwrap();
    assert_eq!(blocks.len(), 3 << 20);
    for rank in 0..3usize {
        let offset = 12_345;
        let expected = ((offset * 7 + rank * 31) % 251) as u8;
        assert_eq!(blocks[(rank << 20) + offset], expected, "rank {rank}'s block, read through the native client");
    }
    assert_eq!(client.stat("/mpi/strided").unwrap().size, 3 * 64 * 1000);
}

/// A process whose threads keep using ringfs while it forks again and again: every child
/// reads and writes ringfs files and exits. The library runs inside programs that fork
/// (shells, rsync, Python's multiprocessing), so its locks must survive a fork taken while
/// other threads hold or wait for them. (`parking_lot` did not: rsync under the library died
/// in `parking_lot_core` after a fork; this test did not catch that, `ringfs-sync`'s fork
/// test does. It guards the library's own fork handling.)
#[test]
fn a_process_forking_while_its_threads_use_ringfs_has_working_children() {
    let preloaded = Preloaded::start(2);
    let program = r#"
import os, sys, threading, time, warnings
warnings.simplefilter("ignore", DeprecationWarning)
root = sys.argv[1]
with open(os.path.join(root, "shared"), "wb") as f:
    f.write(b"x" * 100000)
stop = time.time() + 20
done = threading.Event()
def busy(number):
    path = os.path.join(root, f"busy{number}")
    while not done.is_set():
        with open(path, "wb") as f:
            f.write(b"y" * 5000)
        with open(os.path.join(root, "shared"), "rb") as f:
            assert len(f.read()) == 100000
        os.stat(path)
workers = [threading.Thread(target=busy, args=(n,)) for n in range(4)]
for worker in workers:
    worker.start()
forks, failures = 0, []
while forks < 150 and time.time() < stop:
    pid = os.fork()
    if pid == 0:
        try:
            with open(os.path.join(root, "shared"), "rb") as f:
                ok = len(f.read()) == 100000
            with open(os.path.join(root, f"child{os.getpid()}"), "wb") as f:
                f.write(b"z")
            os._exit(0 if ok else 3)
        except BaseException:
            os._exit(4)
    deadline = time.time() + 10
    while True:
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            break
        if time.time() > deadline:
            # The hung child's stacks, where gdb is installed (the test prints them).
            import subprocess
            try:
                dump = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"], capture_output=True, text=True, timeout=60)
                sys.stderr.write(f"the stacks of hung child {pid}:\n" + dump.stdout + dump.stderr)
            except (OSError, subprocess.SubprocessError) as error:
                sys.stderr.write(f"no stacks of hung child {pid}: {error}\n")
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            status = -1
            break
        time.sleep(0.001)
    if status != 0:
        failures.append((forks, status))
    forks += 1
done.set()
for worker in workers:
    worker.join()
print(forks, failures)
"#;
    let output = preloaded.command("python3").arg("-c").arg(program).arg(&preloaded.prefix).output().unwrap();
    succeeded(&output, "python forking beside busy threads");
    let printed = String::from_utf8_lossy(&output.stdout);
    let (forks, failures) = printed.trim().split_once(' ').expect("forks and failures");
    assert_eq!(
        failures,
        "[]",
        "children that failed (fork number, wait status; -1: hung): {failures}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(forks.parse::<u32>().unwrap() >= 20, "only {forks} forks in 20 s");
}

/// The library's own small locks (the owners of advisory locks, directory streams, the working
/// directory) are held across a `fork` too: threads close duplicates of a ringfs descriptor
/// as fast as they can (every close looks up the process's lock owners, under a lock) while
/// the main thread forks; each child closes a descriptor and exits. A child that inherited
/// one of those locks taken by another thread hangs at its close (CI of 4a6fffd and of
/// a918cbb, found by the test above: the child waited in `forget_owners`).
#[test]
fn children_forked_while_threads_close_descriptors_can_close_theirs() {
    let preloaded = Preloaded::start(1);
    let program = r#"
import os, sys, threading, time
path = os.path.join(sys.argv[1], "closed-often")
with open(path, "wb") as f:
    f.write(b"x")
fd = os.open(path, os.O_RDONLY)
done = threading.Event()
def closer():
    while not done.is_set():
        os.close(os.dup(fd))
workers = [threading.Thread(target=closer) for _ in range(3)]
for worker in workers:
    worker.start()
forks, hung = 0, 0
stop = time.time() + 15
while forks < 400 and time.time() < stop and hung == 0:
    pid = os.fork()
    if pid == 0:
        os.close(fd)
        os._exit(0)
    deadline = time.time() + 5
    while os.waitpid(pid, os.WNOHANG)[0] == 0:
        if time.time() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            hung += 1
            break
        time.sleep(0.0005)
    forks += 1
done.set()
for worker in workers:
    worker.join()
print(forks, hung)
"#;
    let output = preloaded.command("python3").arg("-c").arg(program).arg(&preloaded.prefix).output().unwrap();
    succeeded(&output, "python forking beside closing threads");
    let printed = String::from_utf8_lossy(&output.stdout);
    let (forks, hung) = printed.trim().split_once(' ').expect("forks and hung children");
    assert_eq!(hung, "0", "a child hung at its close (after {forks} forks)");
    assert!(forks.parse::<u32>().unwrap() >= 50, "only {forks} forks in 15 s");
}
