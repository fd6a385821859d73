//! `petrel validate`: loads the configuration exactly as `petrel run`
//! would, and reports every problem as one `FILE:LINE:COL: problem` line.

use std::path::Path;
use std::process::ExitCode;

use crate::config;

/// Checks the pipelines under `config`: exit 0 when they load, 2 (with
/// the problems on stdout) when they do not. `offline` skips the checks
/// that need the host the configuration is meant for (files it names).
pub fn main(config: &Path, offline: bool) -> ExitCode {
    petrel_core::config::set_host_checks(!offline);
    match config::load(config) {
        Ok(p) => {
            for w in p.iter().flat_map(|p| &p.warnings) {
                println!("{}:{}:{}: warning: {}", w.file, w.line, w.col, w.message);
            }
            println!("{}: {} pipeline(s) valid", config.display(), p.len());
            ExitCode::SUCCESS
        }
        Err(errs) => {
            for e in errs {
                println!("{e}");
            }
            ExitCode::from(2)
        }
    }
}
