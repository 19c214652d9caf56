//! Tactic-database helpers shared by `bench` and `tune`: this machine's identity, and loading
//! a database into a `Gpu`, once the file is known to be readable.

use gemmbridge::cuda::tactics::{Identity, TacticDb};
use gemmbridge::cuda::Gpu;

/// This machine's identity for the tactic database.
pub fn identity(gpu: &Gpu) -> anyhow::Result<Identity> {
    Ok(gpu.info()?.tactic_identity())
}

/// Checks that the file `path` given to `flag` can be read, before a command opens a GPU or
/// times anything: an error naming the flag, the path and the OS error otherwise (a missing
/// file, a directory, a file without read permission).
pub fn check_readable(flag: &str, path: &str) -> anyhow::Result<()> {
    use std::io::Read;
    let read = std::fs::File::open(path).and_then(|mut f| f.read(&mut [0u8; 1]));
    match read {
        Ok(_) => Ok(()),
        Err(e) => anyhow::bail!("{flag} {path}: cannot read the tactic database: {e}"),
    }
}

/// Loads a tactic database into `gpu`, printing its warnings; `path` must be readable
/// ([`check_readable`]).
pub fn load_db(gpu: &Gpu, path: &str) -> anyhow::Result<usize> {
    check_readable("--db", path)?;
    let id = identity(gpu)?;
    let (db, warnings) = TacticDb::load(std::path::Path::new(path), &id);
    for w in warnings {
        eprintln!("warning: {w}");
    }
    gpu.plans().load_tactics(&db);
    Ok(db.entries.len())
}

#[cfg(test)]
mod tests {
    use super::check_readable;

    #[test]
    fn an_unreadable_database_is_an_error_naming_the_path_and_why() {
        let dir = std::env::temp_dir().join(format!("gemmbridge-db-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.json");
        let m = missing.to_str().unwrap();
        let e = check_readable("--db", m).unwrap_err().to_string();
        assert!(e.starts_with(&format!("--db {m}: cannot read the tactic database: ")), "{e}");
        assert!(e.contains("os error 2"), "{e}");
        let d = dir.to_str().unwrap();
        let e = check_readable("--db", d).unwrap_err().to_string();
        assert!(e.contains(d) && e.contains("os error 21"), "{e}");
        let file = dir.join("db.json");
        std::fs::write(&file, "{}").unwrap();
        check_readable("--db", file.to_str().unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
