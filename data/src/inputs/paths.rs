//! Which files a list of `--input` arguments names, in a deterministic order.

use std::path::{Path, PathBuf};

use crate::DataError;

/// How a file's contents are read, from its extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputFormat {
    /// Plain text: the file is a document (or several, with a separator line).
    Text,
    /// One JSON object per line.
    Jsonl,
}

impl InputFormat {
    /// `.jsonl` files are JSON lines; every other file is text.
    pub fn of(path: &Path) -> InputFormat {
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl") => InputFormat::Jsonl,
            _ => InputFormat::Text,
        }
    }
}

/// True for the files a directory walk or glob picks up: `.txt` and `.jsonl`.
fn is_corpus_file(path: &Path) -> bool {
    path.is_file() && matches!(path.extension().and_then(|e| e.to_str()), Some("txt" | "jsonl"))
}

/// Expands `--input` arguments into files, in order:
///
/// * an existing file is taken as is (whatever its extension: `.jsonl` is read as JSON lines,
///   anything else as text);
/// * a directory contributes every `.txt` and `.jsonl` file below it (recursively), sorted by
///   path;
/// * anything else containing `*`, `?` or `[` is a glob pattern (`data/**/*.jsonl`); its
///   matching `.txt`/`.jsonl` files, sorted by path.
///
/// Arguments keep their order; a file named twice is read twice.
///
/// Errors: [`DataError::NoInputs`] if `given` is empty; [`DataError::BadInput`] for a path that
/// does not exist or is not a regular file or directory (a device), an invalid glob, a broken
/// symbolic link found in a directory or glob, or a directory or glob without any
/// `.txt`/`.jsonl` file (naming the argument).
pub fn resolve_inputs(given: &[PathBuf]) -> Result<Vec<PathBuf>, DataError> {
    if given.is_empty() {
        return Err(DataError::NoInputs {
            reason: "pass at least one file, directory or glob (e.g. --input corpus.txt data/ 'web/*.jsonl')"
                .into(),
        });
    }
    let mut files = Vec::new();
    for arg in given {
        let shown = arg.display().to_string();
        let bad = |reason: String| DataError::BadInput { given: shown.clone(), reason };
        if arg.is_file() {
            files.push(arg.clone());
            continue;
        }
        let pattern = if arg.is_dir() {
            format!("{}/**/*", glob::Pattern::escape(&shown))
        } else if arg.exists() {
            return Err(bad("not a regular file or a directory".into()));
        } else if shown.contains(['*', '?', '[']) {
            shown.clone()
        } else {
            return Err(bad("no such file or directory".into()));
        };
        let paths = glob::glob(&pattern).map_err(|e| bad(format!("invalid glob pattern: {e}")))?;
        let mut matched = Vec::new();
        for entry in paths {
            let path =
                entry.map_err(|e| bad(format!("cannot read {}: {}", e.path().display(), e.error())))?;
            if is_corpus_file(&path) {
                matched.push(path);
            } else if path.is_symlink() && !path.exists() {
                return Err(bad(format!("{} is a broken symbolic link", path.display())));
            }
        }
        if matched.is_empty() {
            return Err(bad("matches no .txt or .jsonl file".into()));
        }
        matched.sort();
        files.extend(matched);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "x").unwrap();
    }

    #[test]
    #[cfg(unix)]
    fn broken_links_and_devices_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        touch(&tmp.path().join("d/a.txt"));
        std::os::unix::fs::symlink(tmp.path().join("gone.txt"), tmp.path().join("d/b.txt")).unwrap();
        let err = resolve_inputs(&[tmp.path().join("d")]).unwrap_err().to_string();
        assert!(err.contains("b.txt is a broken symbolic link"), "{err}");
        let err = resolve_inputs(&[PathBuf::from("/dev/null")]).unwrap_err().to_string();
        assert!(err.contains("not a regular file or a directory"), "{err}");
    }

    #[test]
    fn directories_recurse_sorted_and_globs_sort() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        for f in ["c/b.txt", "c/a/z.jsonl", "c/a.txt", "c/skip.md", "top.bin"] {
            touch(&d.join(f));
        }
        let got = resolve_inputs(&[d.join("top.bin"), d.join("c")]).unwrap();
        // Sorted by path components: "c/a/z.jsonl" (component "a") before "c/a.txt".
        let want: Vec<PathBuf> =
            ["top.bin", "c/a/z.jsonl", "c/a.txt", "c/b.txt"].iter().map(|f| d.join(f)).collect();
        assert_eq!(got, want);
        let pattern = PathBuf::from(format!("{}/c/**/*.txt", d.display()));
        assert_eq!(resolve_inputs(&[pattern]).unwrap(), vec![d.join("c/a.txt"), d.join("c/b.txt")]);
        assert_eq!(InputFormat::of(&d.join("c/a/z.jsonl")), InputFormat::Jsonl);
        assert_eq!(InputFormat::of(&d.join("top.bin")), InputFormat::Text);
    }

    #[test]
    fn errors_name_the_argument() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("nope.txt");
        let msg = resolve_inputs(std::slice::from_ref(&missing)).unwrap_err().to_string();
        assert!(msg.contains(&missing.display().to_string()) && msg.contains("no such file"), "{msg}");
        let empty_glob = PathBuf::from(format!("{}/*.txt", tmp.path().display()));
        let msg = resolve_inputs(&[empty_glob]).unwrap_err().to_string();
        assert!(msg.contains("*.txt") && msg.contains("matches no .txt or .jsonl file"), "{msg}");
        assert!(matches!(resolve_inputs(&[]), Err(DataError::NoInputs { .. })));
    }
}
