//! Canonical ringfs paths: the strings that name keys.
//!
//! A path is the first half of every chunk key, so two spellings of one file must become one
//! string before they are hashed. Clients canonicalise what users type; servers accept only
//! canonical paths and reject anything else with `EINVAL`, so a malformed request cannot name a
//! key outside the namespace.
//!
//! Canonical form: starts with `/`, components separated by single `/`, no `.` or `..`
//! components, no trailing `/` (except the root `/` itself), no NUL byte, at most
//! [`MAX_PATH_BYTES`] bytes and [`MAX_NAME_BYTES`] per component.

use crate::Errno;

/// Longest canonical path, in bytes (Linux `PATH_MAX` minus the terminating NUL).
pub const MAX_PATH_BYTES: usize = 4095;
/// Longest single component, in bytes (Linux `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;

/// Turns a user-supplied path into canonical form, resolving `.` and `..` lexically.
/// Relative paths are taken relative to the ringfs root. `..` at the root stays at the root.
pub fn canonicalize(input: &str) -> Result<String, Errno> {
    if input.contains('\0') {
        return Err(Errno::EINVAL);
    }
    let mut components: Vec<&str> = Vec::new();
    for component in input.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                components.pop();
            }
            name => {
                if name.len() > MAX_NAME_BYTES {
                    return Err(Errno::ENAMETOOLONG);
                }
                components.push(name);
            }
        }
    }
    let mut path = String::with_capacity(input.len() + 1);
    for component in &components {
        path.push('/');
        path.push_str(component);
    }
    if path.is_empty() {
        path.push('/');
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(path)
}

/// Checks that `path` is already canonical; servers call this on every path they receive.
pub fn validate(path: &str) -> Result<(), Errno> {
    if path == "/" {
        return Ok(());
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(Errno::ENAMETOOLONG);
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(Errno::EINVAL);
    };
    for component in rest.split('/') {
        match component {
            "" | "." | ".." => return Err(Errno::EINVAL),
            name if name.len() > MAX_NAME_BYTES => return Err(Errno::ENAMETOOLONG),
            name if name.contains('\0') => return Err(Errno::EINVAL),
            _ => {}
        }
    }
    Ok(())
}

/// The directory that contains `path`; `None` for the root.
pub fn parent(path: &str) -> Option<&str> {
    if path == "/" {
        return None;
    }
    match path.rfind('/') {
        Some(0) => Some("/"),
        Some(index) => Some(&path[..index]),
        None => None,
    }
}

/// The last component of `path` (empty for the root).
pub fn file_name(path: &str) -> &str {
    match path.rfind('/') {
        Some(index) => &path[index + 1..],
        None => path,
    }
}

/// `dir` + `/` + `name`, for a canonical `dir` and a single component `name`.
pub fn join(dir: &str, name: &str) -> String {
    if dir == "/" { format!("/{name}") } else { format!("{dir}/{name}") }
}

/// True when `path` lies strictly inside directory `dir` (at any depth).
pub fn is_inside(path: &str, dir: &str) -> bool {
    if dir == "/" {
        return path != "/";
    }
    path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/'
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn canonicalize_resolves_dots_and_slashes() {
        assert_eq!(canonicalize("").unwrap(), "/");
        assert_eq!(canonicalize("/").unwrap(), "/");
        assert_eq!(canonicalize("a//b/./c/").unwrap(), "/a/b/c");
        assert_eq!(canonicalize("/a/b/../../..").unwrap(), "/");
        assert_eq!(canonicalize("/a/../b").unwrap(), "/b");
        assert_eq!(canonicalize(&"x".repeat(256)), Err(Errno::ENAMETOOLONG));
        assert_eq!(canonicalize("a\0b"), Err(Errno::EINVAL));
    }

    #[test]
    fn validate_rejects_non_canonical_paths() {
        for bad in ["", "a", "/a/", "//a", "/a/./b", "/a/../b", "/a\0"] {
            assert!(validate(bad).is_err(), "{bad:?} should be rejected");
        }
        for good in ["/", "/a", "/a/b c/d.txt"] {
            assert_eq!(validate(good), Ok(()));
        }
    }

    #[test]
    fn parent_and_name_split_a_path() {
        assert_eq!(parent("/"), None);
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("/a/b"), Some("/a"));
        assert_eq!(file_name("/a/b"), "b");
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
        assert!(is_inside("/a/b", "/a"));
        assert!(!is_inside("/ab", "/a"));
        assert!(!is_inside("/a", "/a"));
        assert!(is_inside("/a", "/"));
    }

    proptest! {
        #[test]
        fn canonical_output_always_validates(input in "[a-c./]{0,40}") {
            let path = canonicalize(&input).unwrap();
            prop_assert_eq!(validate(&path), Ok(()));
            prop_assert_eq!(canonicalize(&path).unwrap(), path.clone());
        }
    }
}
