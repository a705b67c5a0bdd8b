//! Finding the checkpoint to load after a crash, a full disk or damage: the newest
//! `step-*` directory that verifies against its manifest; cleaning up what an interrupted
//! checkpoint left; pruning old checkpoints.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use super::manifest::{verify, Problem};
use crate::error::TrainError;

/// `checkpoints/latest`: the name of the newest checkpoint written (a pointer for people and
/// tools; loading does not rely on it alone).
pub const LATEST: &str = "latest";

/// Prefix of the temporary entries in `checkpoints/` (an unfinished checkpoint, one being
/// replaced or pruned, `latest`'s temp file). None of them is ever loaded.
pub const TMP_PREFIX: &str = ".tmp-";

/// A checkpoint directory passed over when looking for one to load.
#[derive(Clone, Debug, PartialEq)]
pub struct Skipped {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// Why it cannot be loaded.
    pub problem: Problem,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "checkpoints/{}: {}", name_of(&self.dir), self.problem)
    }
}

fn name_of(dir: &Path) -> String {
    dir.file_name().unwrap_or_default().to_string_lossy().into_owned()
}

/// The `step-N` directories of `root` as (N, name), oldest first. A missing `root` has none.
fn step_dirs(root: &Path) -> Result<Vec<(u64, String)>, TrainError> {
    let entries = match fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TrainError::io(root)(e)),
    };
    let mut dirs: Vec<(u64, String)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.parse().ok()?;
            Some((step, name))
        })
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// Whether `run_dir` has any `step-*` checkpoint directory, complete or not (none: the run
/// stopped before its first checkpoint).
///
/// Errors: `checkpoints/` exists but cannot be listed.
pub fn any_checkpoint(run_dir: &Path) -> Result<bool, TrainError> {
    Ok(!step_dirs(&run_dir.join("checkpoints"))?.is_empty())
}

/// The newest checkpoint of `run_dir` that verifies against its manifest (sizes, then
/// SHA-256 of every file), and the newer ones skipped with the reason.
///
/// `checkpoints/latest` is not trusted alone: a run killed after renaming a complete
/// checkpoint but before moving `latest` has a newer complete one; a damaged or incomplete
/// directory is passed over.
///
/// Errors: no checkpoint directory (the run stopped before its first checkpoint); none that
/// verifies (the message lists each one found and what is wrong with it).
pub fn newest_verified(run_dir: &Path) -> Result<(PathBuf, Vec<Skipped>), TrainError> {
    find(run_dir, u64::MAX)
}

/// [`newest_verified`] among the checkpoints of steps before `step` (the state a replay of
/// `step` starts from).
///
/// Errors: as [`newest_verified`], or no checkpoint before `step`.
pub fn newest_verified_before(run_dir: &Path, step: u64) -> Result<(PathBuf, Vec<Skipped>), TrainError> {
    find(run_dir, step)
}

fn find(run_dir: &Path, before: u64) -> Result<(PathBuf, Vec<Skipped>), TrainError> {
    let root = run_dir.join("checkpoints");
    let dirs = step_dirs(&root)?;
    let mut skipped = Vec::new();
    for (_, name) in dirs.iter().rev().filter(|(step, _)| *step < before) {
        let dir = root.join(name);
        match verify(&dir) {
            Ok(_) => return Ok((dir, skipped)),
            Err(problem) => skipped.push(Skipped { dir, problem }),
        }
    }
    let restart = format!("ember train --config FILE --run-dir {}", run_dir.display());
    let message = if dirs.is_empty() {
        format!(
            "no checkpoint to load (no step-* directory in {}): the run stopped before its first checkpoint (start it again with `{restart}`), or this is not its --run-dir",
            root.display()
        )
    } else if skipped.is_empty() {
        let steps: Vec<String> = dirs.iter().map(|(step, _)| step.to_string()).collect();
        format!(
            "no checkpoint before step {before} in {} (checkpoints at steps {}): a run keeps its newest `keep_checkpoints`, one every `checkpoint_every` steps",
            root.display(),
            steps.join(", ")
        )
    } else {
        let found: Vec<String> = skipped.iter().map(Skipped::to_string).collect();
        format!(
            "no checkpoint can be loaded: {}. Restore the files from a copy, or start the run again in a new --run-dir (`ember train --config FILE --run-dir NEW_DIR`), keeping this one",
            found.join("; ")
        )
    };
    Err(TrainError::Checkpoint { path: run_dir.into(), message })
}

/// [`newest_verified`], logging one line per checkpoint skipped, e.g. `skipped
/// checkpoints/step-00000200: model.mpk is damaged (sha256 differs from manifest.json);
/// using step-00000100`.
pub fn newest(run_dir: &Path, log: &mut dyn FnMut(&str)) -> Result<PathBuf, TrainError> {
    let (dir, skipped) = newest_verified(run_dir)?;
    if let Some(note) = latest_note(&dir, &skipped) {
        log(&note);
    }
    logged((dir, skipped), log)
}

/// [`newest_verified_before`] `step`, logging each checkpoint skipped as [`newest`] does.
pub fn newest_before(run_dir: &Path, step: u64, log: &mut dyn FnMut(&str)) -> Result<PathBuf, TrainError> {
    logged(newest_verified_before(run_dir, step)?, log)
}

fn logged((dir, skipped): (PathBuf, Vec<Skipped>), log: &mut dyn FnMut(&str)) -> Result<PathBuf, TrainError> {
    for s in &skipped {
        log(&format!("skipped {s}; using {}", name_of(&dir)));
    }
    Ok(dir)
}

/// A note when `checkpoints/latest` names another checkpoint than `chosen` that was not
/// skipped above: one that is missing (`latest names step-00000999, which is missing; using
/// step-00000008`), or an older one (a run stopped after renaming its newest checkpoint into
/// place and before moving `latest`). `None` when `latest` is absent or names `chosen`.
fn latest_note(chosen: &Path, skipped: &[Skipped]) -> Option<String> {
    let root = chosen.parent()?;
    let bytes = fs::read(root.join(LATEST)).ok()?;
    let named = String::from_utf8_lossy(&bytes);
    let named = named.trim();
    let using = name_of(chosen);
    if named == using || skipped.iter().any(|s| name_of(&s.dir) == named) {
        return None;
    }
    // A damaged `latest` is shown quoted and cut short.
    let plain = !named.is_empty() && named.len() <= 64 && named.bytes().all(|b| b.is_ascii_graphic());
    let shown = match (plain, named.chars().count() > 64) {
        (true, _) => named.to_string(),
        (false, false) => format!("{named:?}"),
        (false, true) => format!("{:?}… ({} bytes)", named.chars().take(64).collect::<String>(), bytes.len()),
    };
    let is_dir = plain && !named.contains('/') && root.join(named).is_dir();
    Some(match is_dir {
        true => format!("checkpoints/latest names {shown}; using {using}, a newer complete checkpoint"),
        false => format!("checkpoints/latest names {shown}, which is missing; using {using}"),
    })
}

/// Removes what interrupted checkpoints left in `RUN_DIR/checkpoints/` (the `.tmp-*`
/// entries), logging each. Called by the process that writes the run directory when a
/// training run starts or resumes.
///
/// Errors: an entry that cannot be removed.
pub fn remove_leftovers(run_dir: &Path, log: &mut dyn FnMut(&str)) -> Result<(), TrainError> {
    let root = run_dir.join("checkpoints");
    let Ok(entries) = fs::read_dir(&root) else { return Ok(()) };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(".tmp") {
            continue;
        }
        let path = entry.path();
        let removed = match entry.file_type() {
            Ok(t) if t.is_dir() => fs::remove_dir_all(&path),
            _ => fs::remove_file(&path),
        };
        removed.map_err(TrainError::io(&path))?;
        log(&format!("removed checkpoints/{name}: left by a run that stopped while writing a checkpoint"));
    }
    Ok(())
}

/// Keeps the newest `keep` checkpoints up to step `saved` (the one just written); newer
/// directories (left from before a resume, e.g. damaged ones) are replaced when the run
/// reaches their step. Each is renamed to a `.tmp-` name before it is removed, so an
/// interrupted removal never leaves a half-deleted `step-*` directory.
pub(crate) fn prune(root: &Path, saved: u64, keep: usize) -> Result<(), TrainError> {
    let older: Vec<String> =
        step_dirs(root)?.into_iter().filter(|(step, _)| *step <= saved).map(|(_, name)| name).collect();
    let excess = older.len().saturating_sub(keep.max(1));
    for name in older.into_iter().take(excess) {
        let (dir, aside) = (root.join(&name), root.join(format!("{TMP_PREFIX}pruned-{name}")));
        fs::rename(&dir, &aside).map_err(TrainError::io(&dir))?;
        fs::remove_dir_all(&aside).map_err(TrainError::io(&aside))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pruning_keeps_the_newest_up_to_the_saved_step_and_leaves_newer_ones() {
        let dir = tempfile::tempdir().unwrap();
        for step in [1, 2, 3, 4, 5, 9] {
            fs::create_dir_all(dir.path().join(format!("step-{step:08}"))).unwrap();
        }
        prune(dir.path(), 5, 2).unwrap();
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["step-00000004", "step-00000005", "step-00000009"]);
    }

    #[test]
    fn a_latest_that_names_another_checkpoint_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("checkpoints");
        let chosen = root.join("step-00000008");
        fs::create_dir_all(&chosen).unwrap();
        fs::create_dir_all(root.join("step-00000004")).unwrap();
        let note = |latest: &str| {
            fs::write(root.join(LATEST), latest).unwrap();
            latest_note(&chosen, &[])
        };
        assert_eq!(note("step-00000008"), None, "latest names the one used");
        assert_eq!(
            note("step-00000999").as_deref(),
            Some("checkpoints/latest names step-00000999, which is missing; using step-00000008")
        );
        assert_eq!(
            note("step-00000004\n").as_deref(),
            Some("checkpoints/latest names step-00000004; using step-00000008, a newer complete checkpoint")
        );
        assert_eq!(
            note("\u{1b}[31mjunk").as_deref(),
            Some("checkpoints/latest names \"\\u{1b}[31mjunk\", which is missing; using step-00000008")
        );
        fs::write(root.join(LATEST), [0xff, 0xfe, b's']).unwrap();
        assert_eq!(
            latest_note(&chosen, &[]).as_deref(),
            Some("checkpoints/latest names \"\u{fffd}\u{fffd}s\", which is missing; using step-00000008"),
            "not UTF-8"
        );
        fs::write(root.join(LATEST), "x".repeat(500)).unwrap();
        let long = latest_note(&chosen, &[]).unwrap();
        assert!(long.contains(&format!("\"{}\"… (500 bytes)", "x".repeat(64))), "{long}");
        let skipped = [Skipped { dir: root.join("step-00000999"), problem: Problem::Missing("x".into()) }];
        fs::write(root.join(LATEST), "step-00000999").unwrap();
        assert_eq!(latest_note(&chosen, &skipped), None, "already said as skipped");
        fs::remove_file(root.join(LATEST)).unwrap();
        assert_eq!(latest_note(&chosen, &[]), None, "no latest");
    }

    #[test]
    fn leftovers_are_removed_and_logged() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("checkpoints");
        fs::create_dir_all(root.join(".tmp-step-00000007-42")).unwrap();
        fs::write(root.join(".tmpXyZ"), "step-00000007").unwrap();
        fs::create_dir_all(root.join("step-00000006")).unwrap();
        let mut lines = Vec::new();
        remove_leftovers(dir.path(), &mut |l| lines.push(l.to_string())).unwrap();
        lines.sort();
        assert_eq!(
            lines,
            [
                "removed checkpoints/.tmp-step-00000007-42: left by a run that stopped while writing a checkpoint",
                "removed checkpoints/.tmpXyZ: left by a run that stopped while writing a checkpoint"
            ]
        );
        assert_eq!(fs::read_dir(&root).unwrap().count(), 1);
    }
}
