//! The data a run trains on: a prepared directory, or a text file prepared once into
//! `RUN_DIR/data` — never over a dataset prepared from another text without `--force`, and
//! never on a resume.

use std::fs;
use std::path::Path;

use ember_data::{PrepareOptions, PreparedData, TokenizerKind};

use crate::config::{ConfigError, RunConfig};
use crate::error::TrainError;

/// Opens the run's prepared data: `config.data` is a prepared directory, or a text file that
/// is prepared into `RUN_DIR/data` once. A new run given another text than the one
/// `RUN_DIR/data` was prepared from prepares it again only with `force` (it may be a dataset
/// the user prepared there); a resume given another text is refused. On return `config.data`
/// names the prepared directory as an absolute path.
///
/// Errors: no `data`; data that cannot be prepared or opened; `RUN_DIR/data` prepared from
/// another text (without `force`, or on a resume); prepared data of another tokenizer than the
/// config's `tokenizer`.
pub(super) fn open_data(
    config: &mut RunConfig,
    run_dir: &Path,
    resume: bool,
    force: bool,
    log: &mut dyn FnMut(&str),
) -> Result<PreparedData, TrainError> {
    let given = config.data.clone().ok_or_else(|| {
        ConfigError::at(
            &config.origin.path,
            "data",
            "missing: set `data` in the config or pass --data DIR|FILE",
        )
    })?;
    if !given.exists() {
        let message = format!(
            "{}: no such file or directory; expected a prepared data directory (`ember prepare --out DIR`) or a UTF-8 text file",
            given.display()
        );
        return Err(config.origin.at("data", message).into());
    }
    if given.is_dir() && !given.join(ember_data::META_FILE).exists() {
        let message = format!(
            "{} holds no prepared data (no {}): expected a directory written by `ember prepare --out DIR`, or a UTF-8 text file",
            given.display(),
            ember_data::META_FILE
        );
        return Err(config.origin.at("data", message).into());
    }
    let dir = if given.is_file() {
        let out = run_dir.join("data");
        let prepared = out.join(ember_data::META_FILE).exists();
        let stale = prepared && !prepared_from(&out, &given)?;
        if resume && !prepared {
            // Preparing it now would change the run directory before the data check refuses.
            let message = format!(
                "this run was not trained on a text prepared into {} (it holds no dataset): a run continues on its own data; resume without --data {}",
                out.display(),
                given.display()
            );
            return Err(config.origin.at("data", message).into());
        }
        if stale && resume {
            let message = format!(
                "{} is not the text {} was prepared from (see its meta.json `sources`): a run continues on its own data; resume without --data, or start a new run",
                given.display(),
                out.display()
            );
            return Err(config.origin.at("data", message).into());
        }
        if stale && !force {
            let message = format!(
                "{} holds a dataset prepared from another text than {} (see its meta.json `sources`), which preparing {} would replace: pass --force to replace it, or choose another --run-dir",
                out.display(),
                given.display(),
                given.display()
            );
            return Err(config.origin.at("data", message).into());
        }
        if !prepared || stale {
            if stale {
                log(&format!(
                    "{} was prepared from another text: preparing {} again (--force)",
                    out.display(),
                    given.display()
                ));
            }
            let tokenizer: TokenizerKind = config.tokenizer.as_deref().unwrap_or("char").parse()?;
            let mut options = PrepareOptions::new(tokenizer, vec![given], out.clone());
            options.progress = false;
            // Only an Ember dataset is replaced, and only with --force (`stale` implies it).
            options.force = stale;
            ember_data::prepare(&options)?;
        }
        out
    } else {
        given
    };
    let data = PreparedData::open(&dir)?;
    if let Some(wanted) = &config.tokenizer {
        let kind = data.meta.tokenizer.kind();
        if kind != wanted.parse::<TokenizerKind>()? {
            return Err(ConfigError::at(
                dir.join(ember_data::META_FILE),
                "tokenizer",
                format!("the config asks for {wanted:?} but the data was prepared with \"{kind}\""),
            )
            .into());
        }
    }
    config.data = Some(fs::canonicalize(&dir).map_err(TrainError::io(&dir))?);
    Ok(data)
}

/// Whether the prepared data in `dir` was made from exactly the text file `file` (one source
/// of its size and SHA-256).
fn prepared_from(dir: &Path, file: &Path) -> Result<bool, TrainError> {
    let meta = ember_data::Meta::read(dir)?;
    let size = fs::metadata(file).map_err(TrainError::io(file))?.len();
    Ok(match meta.sources.as_slice() {
        [source] if source.bytes == size => {
            source.sha256 == ember_data::sha256_file(file).map_err(TrainError::io(file))?
        }
        _ => false,
    })
}
